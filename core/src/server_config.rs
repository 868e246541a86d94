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
//!
//! This module owns the file's syntax and meaning: text in, settings out, no I/O (so the
//! fuzz target `server_config` drives it as it drives the other decoders). The shell reads
//! the file, checks what needs its own libraries (the PostgreSQL connection URL) and binds
//! the listeners (`shell/src/config.rs`).

use serde_json::{Map, Value};
use std::path::PathBuf;
use std::time::Duration;

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
    /// The API listener's connection limits (`max_connections`, `http_read_header_timeout`,
    /// `http_idle_timeout`).
    pub connection_limits: ConnectionLimits,
    /// The cluster listener's (`cluster_max_connections`, `cluster_read_header_timeout`,
    /// `cluster_idle_timeout`; each defaults to the API listener's).
    pub cluster_connection_limits: ConnectionLimits,
    /// Extra top-level settings later capabilities read (e.g. replication tuning).
    pub extra: Map<String, Value>,
}

/// How many connections a listener holds and how long it waits for them (each connection is
/// served on a thread of its own, so these bound what idle and slow clients can take).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections held at once; when full, the one that has waited longest for a request
    /// head makes room.
    pub max_connections: usize,
    /// How long a new connection may take to send its first complete request head (on a
    /// TLS listener this includes the handshake).
    pub header_timeout: Duration,
    /// How long a connection may stay open between requests.
    pub idle_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 1000,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
        }
    }
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
pub const TOP_KEYS: &[&str] = &[
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
pub const LISTENER_KEYS: &[&str] = &[
    "address",
    "cluster_address",
    "tls_disable",
    "tls_cert_file",
    "tls_key_file",
    "max_connections",
    "http_read_header_timeout",
    "http_idle_timeout",
    "cluster_max_connections",
    "cluster_read_header_timeout",
    "cluster_idle_timeout",
];
const STORAGE_KEYS: &[&str] = &["path"];
const POSTGRES_KEYS: &[&str] = &["connection_url", "ha_enabled", "table", "ha_table"];
const REPLICATION_KEYS: &[&str] = &[
    "wal_max_entries",
    "wal_max_bytes",
    "wal_max_key_entries",
    "pull_wait_ms",
    "pull_gap_ms",
    "batch_entries",
    "scan_pace_ms",
    "scan_chunk",
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

/// Parses the configuration file's text; a refusal names the key and its line. The
/// PostgreSQL connection URL is only checked to be there: the shell checks its form.
pub fn parse(text: &str) -> Result<ServerConfig, ConfigError> {
    parse_value(text).map_err(|r| ConfigError {
        line: r.key.as_deref().and_then(|k| line_of(text, k)),
        msg: r.msg,
    })
}

fn parse_value(text: &str) -> Result<ServerConfig, Refusal> {
    // The HCL parser recurses per nesting level and operator: refuse what would exhaust
    // the stack (found by the `server_config` fuzz target) before it parses.
    if let Some(why) = crate::policy::hcl_too_deep(text, "configuration") {
        return Err(why.into());
    }
    let v: Value = hcl::from_str(text).map_err(|e| format!("config is not valid HCL: {e}"))?;
    let top = obj(&v, "config")?;
    let mut c = ServerConfig {
        max_request_size: DEFAULT_MAX_REQUEST_SIZE,
        cluster_name: "cairn-cluster".into(),
        ..Default::default()
    };
    let mut saw_storage = false;
    let mut saw_listener = false;
    // What the listener block sets; the cluster listener's default to the API listener's.
    let mut api_limits = LimitsSet::default();
    let mut cluster_limits = LimitsSet::default();
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
                            "max_connections" | "cluster_max_connections" => {
                                let slot = if lk == "max_connections" {
                                    &mut api_limits.max_connections
                                } else {
                                    &mut cluster_limits.max_connections
                                };
                                *slot = Some(
                                    lv.as_u64()
                                        .filter(|n| *n > 0 && *n <= 1_000_000)
                                        .ok_or_else(|| {
                                            bad(format!(
                                        "{what}: expected a number of connections (1 to 1000000)"
                                    ))
                                        })? as usize,
                                )
                            }
                            "http_read_header_timeout"
                            | "http_idle_timeout"
                            | "cluster_read_header_timeout"
                            | "cluster_idle_timeout" => {
                                let secs = crate::time::duration_value(lv)
                                    .ok()
                                    .filter(|s| *s > 0)
                                    .ok_or_else(|| {
                                        bad(format!(
                                            "{what}: expected a positive duration (\"10s\", \"5m\", or seconds)"
                                        ))
                                    })?;
                                let d = Some(Duration::from_secs(secs));
                                match lk.as_str() {
                                    "http_idle_timeout" => api_limits.idle_timeout = d,
                                    "http_read_header_timeout" => api_limits.header_timeout = d,
                                    "cluster_idle_timeout" => cluster_limits.idle_timeout = d,
                                    _ => cluster_limits.header_timeout = d,
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
    c.connection_limits = api_limits.over(ConnectionLimits::default());
    c.cluster_connection_limits = cluster_limits.over(c.connection_limits);
    Ok(c)
}

/// The connection limits a listener block sets (unset ones are `None`).
#[derive(Default)]
struct LimitsSet {
    max_connections: Option<usize>,
    header_timeout: Option<Duration>,
    idle_timeout: Option<Duration>,
}

impl LimitsSet {
    /// These settings over `base`.
    fn over(&self, base: ConnectionLimits) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: self.max_connections.unwrap_or(base.max_connections),
            header_timeout: self.header_timeout.unwrap_or(base.header_timeout),
            idle_timeout: self.idle_timeout.unwrap_or(base.idle_timeout),
        }
    }
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

    const STORAGE: &str = "storage \"sqlite\" { path = \"/x.db\" }\n";

    #[test]
    fn the_cluster_listener_limits_default_to_the_api_listener_s_and_can_be_set() {
        let c = parse(&format!(
            "{STORAGE}listener \"tcp\" {{\n address = \"127.0.0.1:8200\"\n tls_disable = true\n \
             max_connections = 300\n http_read_header_timeout = \"4s\"\n}}\n"
        ))
        .expect("parse");
        assert_eq!(c.connection_limits.max_connections, 300);
        assert_eq!(c.connection_limits.header_timeout, Duration::from_secs(4));
        assert_eq!(c.cluster_connection_limits, c.connection_limits);

        let c = parse(&format!(
            "{STORAGE}listener \"tcp\" {{\n address = \"127.0.0.1:8200\"\n tls_disable = true\n \
             cluster_max_connections = 64\n cluster_read_header_timeout = \"2s\"\n \
             cluster_idle_timeout = 30\n}}\n"
        ))
        .expect("parse");
        assert_eq!(c.connection_limits, ConnectionLimits::default());
        let cl = c.cluster_connection_limits;
        assert_eq!(cl.max_connections, 64);
        assert_eq!(cl.header_timeout, Duration::from_secs(2));
        assert_eq!(cl.idle_timeout, Duration::from_secs(30));

        let e = parse(&format!(
            "{STORAGE}listener \"tcp\" {{\n address = \"127.0.0.1:8200\"\n tls_disable = true\n \
             cluster_max_connections = 0\n}}\n"
        ))
        .expect_err("zero connections");
        assert_eq!(e.line, Some(5), "{e}");
        assert!(e.msg.contains("cluster_max_connections"), "{e}");
    }

    /// Regression (`server_config` fuzz target): a deeply nested file overflowed the HCL
    /// parser's stack (a process abort at start); it is refused with a message.
    #[test]
    fn a_deeply_nested_file_is_refused_not_a_crash() {
        let text = format!(
            "{STORAGE}x = {}{}\n",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let e = parse(&text).expect_err("too deep");
        assert!(e.msg.contains("nests deeper"), "{e}");
    }
}
