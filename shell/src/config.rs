//! The server configuration file, HCL in the reference's layout:
//!
//! ```hcl
//! storage "sqlite" { path = "/var/lib/cairn/cairn.db" }
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
    pub storage_path: PathBuf,
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
    /// Extra top-level settings later capabilities read (e.g. replication tuning).
    pub extra: Map<String, Value>,
}

pub const DEFAULT_MAX_REQUEST_SIZE: usize = 32 * 1024 * 1024;

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

pub fn parse(text: &str) -> Result<ServerConfig, String> {
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
                let s = obj(val, "storage")?;
                for (kind, body) in s {
                    if kind != "sqlite" {
                        return Err(format!(
                            "storage {kind:?}: unsupported backend (only \"sqlite\")"
                        ));
                    }
                    for (sk, sv) in obj(body, "storage \"sqlite\"")? {
                        match sk.as_str() {
                            "path" => {
                                c.storage_path = PathBuf::from(string(sv, "storage.sqlite.path")?)
                            }
                            other => {
                                return Err(format!("storage \"sqlite\": unknown key {other:?}"))
                            }
                        }
                    }
                    saw_storage = true;
                }
            }
            "listener" => {
                let l = obj(val, "listener")?;
                for (kind, body) in l {
                    if kind != "tcp" {
                        return Err(format!(
                            "listener {kind:?}: unsupported listener (only \"tcp\")"
                        ));
                    }
                    let mut tls_disable = false;
                    for (lk, lv) in obj(body, "listener \"tcp\"")? {
                        let what = format!("listener.tcp.{lk}");
                        match lk.as_str() {
                            "address" => c.address = string(lv, &what)?,
                            "cluster_address" => c.cluster_address = string(lv, &what)?,
                            "tls_disable" => tls_disable = boolean(lv, &what)?,
                            "tls_cert_file" => {
                                c.tls_cert_file = Some(PathBuf::from(string(lv, &what)?))
                            }
                            "tls_key_file" => {
                                c.tls_key_file = Some(PathBuf::from(string(lv, &what)?))
                            }
                            other => {
                                return Err(format!("listener \"tcp\": unknown key {other:?}"))
                            }
                        }
                    }
                    if tls_disable {
                        c.tls_cert_file = None;
                        c.tls_key_file = None;
                    } else if c.tls_cert_file.is_none() || c.tls_key_file.is_none() {
                        return Err("listener \"tcp\": set tls_cert_file and tls_key_file, or tls_disable = true".into());
                    }
                    saw_listener = true;
                }
            }
            "api_addr" => c.api_addr = Some(string(val, k)?),
            "cluster_addr" => c.cluster_addr = Some(string(val, k)?),
            "license_path" => c.license_path = Some(PathBuf::from(string(val, k)?)),
            "log_level" => c.log_level = Some(string(val, k)?),
            "cluster_name" => c.cluster_name = string(val, k)?,
            "ui" => c.ui = boolean(val, k)?,
            "disable_mlock" => c.disable_mlock = boolean(val, k)?,
            "max_request_size" => {
                c.max_request_size = val
                    .as_u64()
                    .filter(|n| *n > 0)
                    .ok_or("max_request_size: expected a positive number of bytes")?
                    as usize
            }
            other if EXTRA_KEYS.contains(&other) => {
                c.extra.insert(other.into(), val.clone());
            }
            other => return Err(format!("unknown configuration key {other:?}")),
        }
    }
    if !saw_storage || c.storage_path.as_os_str().is_empty() {
        return Err("storage \"sqlite\" { path = \"...\" } is required".into());
    }
    if !saw_listener || c.address.is_empty() {
        return Err("listener \"tcp\" { address = \"...\" } is required".into());
    }
    if c.address.parse::<std::net::SocketAddr>().is_err() {
        return Err(format!(
            "listener.tcp.address: {:?} is not HOST:PORT",
            c.address
        ));
    }
    if c.cluster_address.is_empty() {
        c.cluster_address = next_port(&c.address).unwrap_or_default();
    }
    Ok(c)
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
        assert!(e.contains("bogus"), "{e}");
        let e = parse(r#"storage "raft" { path = "/x" }"#).unwrap_err();
        assert!(e.contains("raft"), "{e}");
        let e = parse(
            r#"storage "sqlite" { path = "/x" }
                         listener "tcp" {
                           address = "nope"
                           tls_disable = true
                         }"#,
        )
        .unwrap_err();
        assert!(e.contains("address"), "{e}");
        let e = parse(
            r#"storage "sqlite" { path = "/x" }
                         listener "tcp" {
                           address = "127.0.0.1:1"
                         }"#,
        )
        .unwrap_err();
        assert!(e.contains("tls_cert_file"), "{e}");
    }
}
