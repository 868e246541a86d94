//! The server configuration file, HCL in the reference's layout:
//!
//! ```hcl
//! storage "sqlite" { path = "/var/lib/cairn/cairn.db" }
//! # or, one database shared by the nodes of an HA cluster (Vault's stanza):
//! # storage "postgresql" {
//! #   connection_url = "postgres://cairn:PASSWORD@db.internal:5432/cairn?sslmode=disable"
//! #   ha_enabled     = true
//! #   table          = "cairn_kv"        # default
//! #   ha_table       = "cairn_ha_lock"   # default; the node registry is <ha_table>_nodes
//! # }
//! listener "tcp" {
//!   address         = "127.0.0.1:8200"
//!   cluster_address = "127.0.0.1:8201"
//!   tls_disable     = true        # or tls_cert_file / tls_key_file
//! }
//! api_addr     = "http://127.0.0.1:8200"
//! cluster_addr = "https://127.0.0.1:8201"
//! license_path = "/etc/cairn/license.json"
//! ```
//!
//! Unknown keys and bad values are refused with a message naming them.

use serde_json::{Map, Value};
use std::path::PathBuf;

#[derive(Debug, Clone, Default)]
pub struct ServerConfig {
    /// The SQLite file (empty with `storage "postgresql"`).
    pub storage_path: PathBuf,
    /// `storage "postgresql"`: the database instead of a SQLite file.
    pub postgres: Option<PostgresConfig>,
    pub address: String,
    pub cluster_address: String,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    pub api_addr: Option<String>,
    pub cluster_addr: Option<String>,
    pub license_path: Option<PathBuf>,
    pub log_level: Option<String>,
    pub max_request_size: usize,
    pub cluster_name: String,
    pub ui: bool,
    pub disable_mlock: bool,
    /// The listener's connection limits (`max_connections`, `http_read_header_timeout`,
    /// `http_idle_timeout`), on the API and cluster listeners alike.
    pub connection_limits: tiny_http::ConnectionLimits,
    /// Extra top-level settings later capabilities read (e.g. replication tuning).
    pub extra: Map<String, Value>,
}

/// The `storage "postgresql"` block.
#[derive(Clone, Default)]
pub struct PostgresConfig {
    /// `postgres://USER:PASSWORD@HOST:PORT/DATABASE?...` (holds the password: never printed).
    pub connection_url: String,
    pub ha_enabled: bool,
    pub table: Option<String>,
    pub ha_table: Option<String>,
}

impl std::fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("connection_url", &"<redacted>")
            .field("ha_enabled", &self.ha_enabled)
            .field("table", &self.table)
            .field("ha_table", &self.ha_table)
            .finish()
    }
}

pub const DEFAULT_MAX_REQUEST_SIZE: usize = 32 * 1024 * 1024;

/// Why a configuration was refused: a message and, when it is about one key, the line of
/// the file that key is on (found in the text: the HCL parser keeps no positions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub line: Option<usize>,
    pub msg: String,
}

impl ConfigError {
    /// `FILE:LINE: message`, or `FILE: message` when no line is known.
    pub fn render(&self, file: &std::path::Path) -> String {
        match self.line {
            Some(n) => format!("{}:{n}: {}", file.display(), self.msg),
            None => format!("{}: {}", file.display(), self.msg),
        }
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(n) => write!(f, "line {n}: {}", self.msg),
            None => write!(f, "{}", self.msg),
        }
    }
}

/// A refusal before its line is looked up: the key it is about (if any) and the message.
struct Refusal {
    key: Option<String>,
    msg: String,
}

impl From<String> for Refusal {
    fn from(msg: String) -> Self {
        Refusal { key: None, msg }
    }
}

impl From<&str> for Refusal {
    fn from(msg: &str) -> Self {
        Refusal {
            key: None,
            msg: msg.to_string(),
        }
    }
}

/// A refusal about `key`.
fn at(key: &str, msg: impl Into<String>) -> Refusal {
    Refusal {
        key: Some(key.to_string()),
        msg: msg.into(),
    }
}

fn obj<'a>(v: &'a Value, what: &str) -> Result<&'a Map<String, Value>, String> {
    match v {
        Value::Object(m) => Ok(m),
        Value::Array(a) if a.len() == 1 => obj(&a[0], what),
        _ => Err(format!("{what}: expected a block")),
    }
}

fn string(v: &Value, what: &str) -> Result<String, String> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("{what}: expected a string"))
}

fn boolean(v: &Value, what: &str) -> Result<bool, String> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::String(s) if s == "true" || s == "1" => Ok(true),
        Value::String(s) if s == "false" || s == "0" => Ok(false),
        _ => Err(format!("{what}: expected true or false")),
    }
}

/// Top-level keys that later capabilities own (validated by them).
const EXTRA_KEYS: &[&str] = &["replication", "license_trusted_key", "hosted"];

/// The keys each place of the file accepts (for "did you mean").
const TOP_KEYS: &[&str] = &[
    "storage",
    "listener",
    "api_addr",
    "cluster_addr",
    "license_path",
    "license_trusted_key",
    "log_level",
    "cluster_name",
    "ui",
    "disable_mlock",
    "max_request_size",
    "replication",
    "hosted",
];
const LISTENER_KEYS: &[&str] = &[
    "address",
    "cluster_address",
    "tls_disable",
    "tls_cert_file",
    "tls_key_file",
    "max_connections",
    "http_read_header_timeout",
    "http_idle_timeout",
];
const STORAGE_KEYS: &[&str] = &["path"];
const POSTGRES_KEYS: &[&str] = &["connection_url", "ha_enabled", "table", "ha_table"];
const REPLICATION_KEYS: &[&str] = &[
    "wal_max_entries",
    "wal_max_bytes",
    "pull_wait_ms",
    "batch_entries",
];

/// The message for an unknown `key` in `place`, whose keys are `known`: the closest known
/// key when one is close, the block the key belongs in when it is another block's, else
/// the list of known keys.
fn unknown_key(key: &str, place: &str, known: &[&str]) -> Refusal {
    let mut msg = format!("unknown key `{key}` {place}");
    let elsewhere = [
        ("at the top level", TOP_KEYS),
        ("in the listener \"tcp\" block", LISTENER_KEYS),
        ("in the storage \"sqlite\" block", STORAGE_KEYS),
        ("in the storage \"postgresql\" block", POSTGRES_KEYS),
        ("in the replication block", REPLICATION_KEYS),
    ]
    .into_iter()
    .find(|(p, keys)| *p != place && keys.contains(&key));
    match (elsewhere, closest(key, known)) {
        (Some((p, _)), Some(k)) => {
            msg.push_str(&format!(" (`{key}` belongs {p}; or did you mean `{k}`?)"))
        }
        (Some((p, _)), None) => msg.push_str(&format!(" (`{key}` belongs {p})")),
        (None, Some(k)) => msg.push_str(&format!(" (did you mean `{k}`?)")),
        (None, None) => msg.push_str(&format!(" (known keys: {})", known.join(", "))),
    }
    at(key, msg)
}

/// Levenshtein distance between two strings (by characters).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The known key closest to `word`, when it is close enough to be a typo of it: at most
/// one edit in three characters (and at least one allowed), or one a prefix of the other
/// (`tls_cert` for `tls_cert_file`). Case is ignored.
pub fn closest<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    let w = word.to_ascii_lowercase();
    known
        .iter()
        .filter_map(|k| {
            let d = edit_distance(&w, k);
            let longest = w.chars().count().max(k.len());
            let prefix = w.len().min(k.len()) >= 4 && (k.starts_with(&w) || w.starts_with(k));
            (d <= (longest / 3).max(1) || prefix).then_some((d, *k))
        })
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// The line (from 1) where `key` is written as a key: the word, outside strings and
/// comments, followed by `=`, `{`, `:` or a block label.
pub fn line_of(text: &str, key: &str) -> Option<usize> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    for (n, line) in text.lines().enumerate() {
        let mut in_string = false;
        let mut escaped = false;
        let chars: Vec<(usize, char)> = line.char_indices().collect();
        let mut i = 0;
        while i < chars.len() {
            let (pos, c) = chars[i];
            if in_string {
                match c {
                    _ if escaped => escaped = false,
                    '\\' => escaped = true,
                    '"' => in_string = false,
                    _ => {}
                }
                i += 1;
                continue;
            }
            match c {
                '"' => in_string = true,
                '#' => break,
                '/' if line[pos..].starts_with("//") || line[pos..].starts_with("/*") => break,
                _ if line[pos..].starts_with(key)
                    && !line[..pos].ends_with(ident)
                    && !line[pos + key.len()..].starts_with(ident) =>
                {
                    let after = line[pos + key.len()..].trim_start();
                    if after.starts_with(['=', '{', ':', '"']) {
                        return Some(n + 1);
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
    None
}

/// Parses the configuration file's text; a refusal names the key and its line.
pub fn parse(text: &str) -> Result<ServerConfig, ConfigError> {
    parse_value(text).map_err(|r| ConfigError {
        line: r.key.as_deref().and_then(|k| line_of(text, k)),
        msg: r.msg,
    })
}

fn parse_value(text: &str) -> Result<ServerConfig, Refusal> {
    let v: Value = hcl::from_str(text).map_err(|e| format!("config is not valid HCL: {e}"))?;
    let top = obj(&v, "config")?;
    let mut c = ServerConfig {
        max_request_size: DEFAULT_MAX_REQUEST_SIZE,
        cluster_name: "cairn-cluster".into(),
        ..Default::default()
    };
    let mut saw_storage = false;
    let mut saw_listener = false;
    for (k, val) in top {
        match k.as_str() {
            "storage" => {
                let s = obj(val, "storage").map_err(|e| at(k, e))?;
                for (kind, body) in s {
                    if saw_storage {
                        return Err(at(k, "only one storage block may be given"));
                    }
                    match kind.as_str() {
                        "sqlite" => {
                            for (sk, sv) in obj(body, "storage \"sqlite\"").map_err(|e| at(k, e))? {
                                match sk.as_str() {
                                    "path" => {
                                        c.storage_path = PathBuf::from(
                                            string(sv, "storage.sqlite.path")
                                                .map_err(|e| at(sk, e))?,
                                        )
                                    }
                                    other => {
                                        return Err(unknown_key(
                                            other,
                                            "in the storage \"sqlite\" block",
                                            STORAGE_KEYS,
                                        ))
                                    }
                                }
                            }
                            if c.storage_path.as_os_str().is_empty() {
                                return Err(at(
                                    k,
                                    "storage \"sqlite\" { path = \"...\" } is required",
                                ));
                            }
                        }
                        "postgresql" => {
                            c.postgres = Some(postgres_block(body).map_err(|mut r| {
                                if r.key.is_none() {
                                    r.key = Some(k.clone());
                                }
                                r
                            })?);
                        }
                        _ => {
                            return Err(at(
                                k,
                                format!(
                                    "storage \"{kind}\": unsupported backend (\"sqlite\": storage \
                                     \"sqlite\" {{ path = \"/var/lib/cairn/cairn.db\" }}, or \
                                     \"postgresql\": storage \"postgresql\" {{ connection_url = \
                                     \"postgres://...\" }})"
                                ),
                            ))
                        }
                    }
                    saw_storage = true;
                }
            }
            "listener" => {
                let l = obj(val, "listener").map_err(|e| at(k, e))?;
                for (kind, body) in l {
                    if kind != "tcp" {
                        return Err(at(
                            k,
                            format!("listener \"{kind}\": unsupported listener (only \"tcp\")"),
                        ));
                    }
                    let mut tls_disable = false;
                    for (lk, lv) in obj(body, "listener \"tcp\"").map_err(|e| at(k, e))? {
                        let what = format!("listener.tcp.{lk}");
                        let bad = |e: String| at(lk, e);
                        match lk.as_str() {
                            "address" => c.address = string(lv, &what).map_err(bad)?,
                            "cluster_address" => {
                                c.cluster_address = string(lv, &what).map_err(bad)?
                            }
                            "tls_disable" => tls_disable = boolean(lv, &what).map_err(bad)?,
                            "tls_cert_file" => {
                                c.tls_cert_file =
                                    Some(PathBuf::from(string(lv, &what).map_err(bad)?))
                            }
                            "tls_key_file" => {
                                c.tls_key_file =
                                    Some(PathBuf::from(string(lv, &what).map_err(bad)?))
                            }
                            "max_connections" => {
                                c.connection_limits.max_connections =
                                    lv.as_u64()
                                        .filter(|n| *n > 0 && *n <= 1_000_000)
                                        .ok_or_else(|| {
                                            bad(format!(
                                        "{what}: expected a number of connections (1 to 1000000)"
                                    ))
                                        })? as usize
                            }
                            "http_read_header_timeout" | "http_idle_timeout" => {
                                let secs = cairn_core::time::duration_value(lv)
                                    .ok()
                                    .filter(|s| *s > 0)
                                    .ok_or_else(|| {
                                        bad(format!(
                                            "{what}: expected a positive duration (\"10s\", \"5m\", or seconds)"
                                        ))
                                    })?;
                                let d = std::time::Duration::from_secs(secs);
                                if lk == "http_idle_timeout" {
                                    c.connection_limits.idle_timeout = d;
                                } else {
                                    c.connection_limits.header_timeout = d;
                                }
                            }
                            other => {
                                return Err(unknown_key(
                                    other,
                                    "in the listener \"tcp\" block",
                                    LISTENER_KEYS,
                                ))
                            }
                        }
                    }
                    if tls_disable {
                        c.tls_cert_file = None;
                        c.tls_key_file = None;
                    } else if c.tls_cert_file.is_none() || c.tls_key_file.is_none() {
                        return Err(at(
                            k,
                            "listener \"tcp\": set tls_cert_file and tls_key_file, or \
                             tls_disable = true",
                        ));
                    }
                    saw_listener = true;
                }
            }
            "api_addr" => c.api_addr = Some(string(val, k).map_err(|e| at(k, e))?),
            "cluster_addr" => c.cluster_addr = Some(string(val, k).map_err(|e| at(k, e))?),
            "license_path" => {
                c.license_path = Some(PathBuf::from(string(val, k).map_err(|e| at(k, e))?))
            }
            "log_level" => c.log_level = Some(string(val, k).map_err(|e| at(k, e))?),
            "cluster_name" => c.cluster_name = string(val, k).map_err(|e| at(k, e))?,
            "ui" => c.ui = boolean(val, k).map_err(|e| at(k, e))?,
            "disable_mlock" => c.disable_mlock = boolean(val, k).map_err(|e| at(k, e))?,
            "max_request_size" => {
                c.max_request_size =
                    val.as_u64().filter(|n| *n > 0).ok_or_else(|| {
                        at(k, "max_request_size: expected a positive number of bytes")
                    })? as usize
            }
            "replication" => {
                if let Ok(block) = obj(val, "replication") {
                    if let Some(other) = block
                        .keys()
                        .find(|rk| !REPLICATION_KEYS.contains(&rk.as_str()))
                    {
                        return Err(unknown_key(
                            other,
                            "in the replication block",
                            REPLICATION_KEYS,
                        ));
                    }
                }
                c.extra.insert(k.clone(), val.clone());
            }
            other if EXTRA_KEYS.contains(&other) => {
                c.extra.insert(other.into(), val.clone());
            }
            other => return Err(unknown_key(other, "at the top level", TOP_KEYS)),
        }
    }
    if !saw_storage {
        return Err(
            "a storage block is required: storage \"sqlite\" { path = \"...\" } or \
                    storage \"postgresql\" { connection_url = \"postgres://...\" }"
                .into(),
        );
    }
    if !saw_listener || c.address.is_empty() {
        return Err("listener \"tcp\" { address = \"...\" } is required".into());
    }
    if c.address.parse::<std::net::SocketAddr>().is_err() {
        return Err(at(
            "address",
            format!(
                "listener.tcp.address: {:?} is not HOST:PORT (e.g. 127.0.0.1:8200)",
                c.address
            ),
        ));
    }
    if c.cluster_address.is_empty() {
        c.cluster_address = next_port(&c.address).unwrap_or_default();
    }
    Ok(c)
}

/// The `storage "postgresql"` block's settings.
fn postgres_block(body: &Value) -> Result<PostgresConfig, Refusal> {
    let mut p = PostgresConfig::default();
    for (pk, pv) in obj(body, "storage \"postgresql\"")? {
        let what = format!("storage.postgresql.{pk}");
        let bad = |e: String| at(pk, e);
        match pk.as_str() {
            "connection_url" => p.connection_url = string(pv, &what).map_err(bad)?,
            "ha_enabled" => p.ha_enabled = boolean(pv, &what).map_err(bad)?,
            "table" => p.table = Some(string(pv, &what).map_err(bad)?),
            "ha_table" => p.ha_table = Some(string(pv, &what).map_err(bad)?),
            other => {
                return Err(unknown_key(
                    other,
                    "in the storage \"postgresql\" block",
                    POSTGRES_KEYS,
                ))
            }
        }
    }
    if p.connection_url.is_empty() {
        return Err("storage \"postgresql\" { connection_url = \"postgres://USER:PASSWORD@HOST:PORT/DATABASE\" } is required".into());
    }
    // Checked here so a bad URL or table name is a configuration error with its line; the
    // message never repeats the URL (it holds the password).
    crate::postgres::PgSettings::new(&p.connection_url, p.table.as_deref(), p.ha_table.as_deref())
        .map_err(|e| {
            let key = if e.starts_with("table") {
                "table"
            } else if e.starts_with("ha_table") {
                "ha_table"
            } else {
                "connection_url"
            };
            at(key, format!("storage \"postgresql\": {e}"))
        })?;
    Ok(p)
}

/// `127.0.0.1:8200` → `127.0.0.1:8201`.
pub fn next_port(addr: &str) -> Option<String> {
    let sa: std::net::SocketAddr = addr.parse().ok()?;
    Some(std::net::SocketAddr::new(sa.ip(), sa.port().checked_add(1)?).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_reference_layout() {
        let c = parse(
            r#"storage "sqlite" { path = "/tmp/x.db" }
               listener "tcp" {
                 address = "127.0.0.1:8300"
                 tls_disable = true
               }
               api_addr = "http://127.0.0.1:8300""#,
        )
        .unwrap();
        assert_eq!(c.address, "127.0.0.1:8300");
        assert_eq!(c.cluster_address, "127.0.0.1:8301");
        assert_eq!(c.api_addr.as_deref(), Some("http://127.0.0.1:8300"));
    }

    #[test]
    fn refuses_unknown_keys_and_bad_values() {
        let e = parse(
            r#"storage "sqlite" { path = "/x" }
                         listener "tcp" {
                           address = "127.0.0.1:1"
                           tls_disable = true
                         }
                         bogus = 1"#,
        )
        .unwrap_err();
        assert!(e.msg.contains("`bogus`"), "{e}");
        assert_eq!(e.line, Some(6), "{e}");
        let e = parse(r#"storage "raft" { path = "/x" }"#).unwrap_err();
        assert!(e.msg.contains("raft"), "{e}");
        assert_eq!(e.line, Some(1), "{e}");
        let e = parse(
            r#"storage "sqlite" { path = "/x" }
                         listener "tcp" {
                           address = "nope"
                           tls_disable = true
                         }"#,
        )
        .unwrap_err();
        assert!(e.msg.contains("address"), "{e}");
        assert_eq!(e.line, Some(3), "{e}");
        let e = parse(
            r#"storage "sqlite" { path = "/x" }
                         listener "tcp" {
                           address = "127.0.0.1:1"
                         }"#,
        )
        .unwrap_err();
        assert!(e.msg.contains("tls_cert_file"), "{e}");
    }

    /// A typo names the file, the line, the key and the key it was probably meant to be.
    #[test]
    fn a_typo_names_its_line_and_the_closest_key() {
        let text = r#"# Cairn
storage "sqlite" { path = "/var/lib/cairn/cairn.db" }
listener "tcp" {
  address        = "127.0.0.1:8200"   # the cluster_adress is below
  cluster_adress = "127.0.0.1:8201"
  tls_disable    = true
}
"#;
        let e = parse(text).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert_eq!(
            e.msg,
            "unknown key `cluster_adress` in the listener \"tcp\" block \
             (did you mean `cluster_address`?)"
        );
        assert_eq!(
            e.render(std::path::Path::new("/etc/cairn/cairn.hcl")),
            "/etc/cairn/cairn.hcl:5: unknown key `cluster_adress` in the listener \"tcp\" \
             block (did you mean `cluster_address`?)"
        );

        // At the top level, in the storage block, in the replication block.
        let base = "storage \"sqlite\" { path = \"/x\" }\n\
                    listener \"tcp\" {\n  address = \"127.0.0.1:1\"\n  tls_disable = true\n}\n";
        let e = parse(&format!("{base}api_adr = \"http://x\"\n")).unwrap_err();
        assert_eq!(e.line, Some(6), "{e}");
        assert!(e.msg.contains("did you mean `api_addr`?"), "{e}");
        let e = parse(&format!("{base}cluster_address = \"127.0.0.1:2\"\n")).unwrap_err();
        assert!(
            e.msg.contains(
                "(`cluster_address` belongs in the listener \"tcp\" block; \
                 or did you mean `cluster_addr`?)"
            ),
            "{e}"
        );
        let e = parse(&format!("{base}tls_disable = true\n")).unwrap_err();
        assert!(
            e.msg
                .contains("(`tls_disable` belongs in the listener \"tcp\" block)"),
            "{e}"
        );
        let e = parse(&format!("{base}whatever = 1\n")).unwrap_err();
        assert!(e.msg.contains("(known keys: storage, listener,"), "{e}");
        let e = parse(
            "storage \"sqlite\" { pth = \"/x\" }\nlistener \"tcp\" {\n address = \"127.0.0.1:1\"\n tls_disable = true\n}\n",
        )
        .unwrap_err();
        assert_eq!(e.line, Some(1), "{e}");
        assert!(
            e.msg.contains("`pth`") && e.msg.contains("did you mean `path`?"),
            "{e}"
        );
        let e = parse(&format!("{base}replication {{\n  wal_max_entrys = 5\n}}\n")).unwrap_err();
        assert_eq!(e.line, Some(7), "{e}");
        assert!(e.msg.contains("did you mean `wal_max_entries`?"), "{e}");
        let e = parse(
            "storage \"sqlite\" { path = \"/x\" }\nlistener \"tcp\" {\n address = \"127.0.0.1:1\"\n tls_cert = \"/c\"\n}\n",
        )
        .unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.msg.contains("did you mean `tls_cert_file`?"), "{e}");
    }

    #[test]
    fn parses_the_postgresql_stanza() {
        let listener = "listener \"tcp\" {\n address = \"127.0.0.1:1\"\n tls_disable = true\n}\n";
        let c = parse(&format!(
            "storage \"postgresql\" {{\n  connection_url = \"postgres://u:secret@db:5432/cairn\"\n  \
             ha_enabled = true\n  table = \"kv\"\n  ha_table = \"lock\"\n}}\n{listener}"
        ))
        .unwrap();
        let pg = c.postgres.as_ref().expect("postgresql");
        assert_eq!(pg.connection_url, "postgres://u:secret@db:5432/cairn");
        assert!(pg.ha_enabled);
        assert_eq!(
            (pg.table.as_deref(), pg.ha_table.as_deref()),
            (Some("kv"), Some("lock"))
        );
        assert!(c.storage_path.as_os_str().is_empty());
        assert!(
            !format!("{c:?}").contains("secret"),
            "the password in Debug"
        );
        // Unknown keys are refused with their line and the closest key.
        let e = parse(&format!(
            "storage \"postgresql\" {{\n  connection_url = \"postgres://u@db/c\"\n  \
             ha_enabeld = true\n}}\n{listener}"
        ))
        .unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.msg.contains("did you mean `ha_enabled`?"), "{e}");
        // A bad URL or table name is a configuration error, without the URL's password.
        let e = parse(&format!(
            "storage \"postgresql\" {{\n  connection_url = \"postgres://u:secret@db:x/c\"\n}}\n{listener}"
        ))
        .unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(!e.msg.contains("secret"), "{e}");
        let e = parse(&format!(
            "storage \"postgresql\" {{\n  connection_url = \"postgres://u@db/c\"\n  table = \"x; drop\"\n}}\n{listener}"
        ))
        .unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        let e = parse(&format!(
            "storage \"postgresql\" {{\n  ha_enabled = true\n}}\n{listener}"
        ))
        .unwrap_err();
        assert!(e.msg.contains("connection_url"), "{e}");
        // SQLite is unchanged; no storage block at all is refused.
        let c = parse(&format!(
            "storage \"sqlite\" {{ path = \"/x.db\" }}\n{listener}"
        ))
        .unwrap();
        assert!(c.postgres.is_none());
        assert_eq!(c.storage_path, PathBuf::from("/x.db"));
        let e = parse(listener).unwrap_err();
        assert!(e.msg.contains("a storage block is required"), "{e}");
    }

    #[test]
    fn closest_key_by_edit_distance() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("cluster_adress", "cluster_address"), 1);
        assert_eq!(closest("adress", LISTENER_KEYS), Some("address"));
        assert_eq!(closest("ADDRESS", LISTENER_KEYS), Some("address"));
        assert_eq!(closest("tls_key", LISTENER_KEYS), Some("tls_key_file"));
        assert_eq!(closest("log_levl", TOP_KEYS), Some("log_level"));
        assert_eq!(closest("ui", TOP_KEYS), Some("ui"));
        assert_eq!(closest("x", TOP_KEYS), None);
        assert_eq!(closest("bogus", TOP_KEYS), None);
        assert_eq!(closest("storage_path", TOP_KEYS), Some("storage"));
        assert_eq!(closest("address", TOP_KEYS), None);
    }

    #[test]
    fn the_line_of_a_key_skips_strings_comments_and_longer_words() {
        let text = "# address = here is a comment\n\
                    api_addr = \"address = in a string\"\n\
                    listener \"tcp\" { cluster_address = \"x\"\n\
                    \taddress= \"y\" }\n";
        assert_eq!(line_of(text, "address"), Some(4));
        assert_eq!(line_of(text, "cluster_address"), Some(3));
        assert_eq!(line_of(text, "listener"), Some(3));
        assert_eq!(line_of(text, "api_addr"), Some(2));
        assert_eq!(line_of(text, "missing"), None);
    }
}
