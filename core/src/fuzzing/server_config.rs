//! The `server_config` target: the server's HCL configuration file
//! ([`crate::server_config`]) from arbitrary text or from a file assembled of its own keys
//! and arbitrary values.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)] // a broken promise panics: that is the finding

use super::Bytes;
use crate::server_config::{self, LISTENER_KEYS, TOP_KEYS};

/// Values the assembled files give a key (besides arbitrary text).
const VALUES: &[&str] = &[
    "\"127.0.0.1:8200\"",
    "\"[::1]:0\"",
    "true",
    "false",
    "\"10s\"",
    "\"5m\"",
    "0",
    "1",
    "1000001",
    "-1",
    "\"\"",
    "[]",
    "{}",
    "{ x = 1 }",
    "\"/tmp/c.db\"",
    "1e300",
];

/// One `key = value` line from the bytes.
fn line(b: &mut Bytes, keys: &[&str]) -> String {
    let k = b.byte();
    let key = match keys.get(usize::from(k) % (keys.len() + 1)) {
        Some(k) => (*k).to_string(),
        None => b.string(),
    };
    let v = b.byte();
    let value = match VALUES.get(usize::from(v)) {
        Some(v) => (*v).to_string(),
        None if v & 1 == 0 => format!("{:?}", b.string()),
        None => b.string(),
    };
    format!("{key} = {value}\n")
}

/// A configuration file: storage and listener blocks and top-level settings, each line a
/// known key (mostly) with a listed or arbitrary value.
fn assembled(b: &mut Bytes) -> String {
    let mut text = String::new();
    let shape = b.byte();
    if shape & 1 != 0 {
        text.push_str("storage \"sqlite\" {\n  path = \"/tmp/c.db\"\n");
        if shape & 2 != 0 {
            text.push_str(&line(b, &["path"]));
        }
        text.push_str("}\n");
    } else if shape & 2 != 0 {
        text.push_str("storage \"postgresql\" {\n");
        text.push_str(&line(
            b,
            &["connection_url", "ha_enabled", "table", "ha_table"],
        ));
        text.push_str("}\n");
    }
    if shape & 4 != 0 {
        text.push_str("listener \"tcp\" {\n  address = \"127.0.0.1:8200\"\n  tls_disable = true\n");
        for _ in 0..(shape >> 4) {
            text.push_str("  ");
            text.push_str(&line(b, LISTENER_KEYS));
        }
        text.push_str("}\n");
    }
    while !b.is_empty() {
        text.push_str(&line(b, TOP_KEYS));
    }
    text
}

/// HCL server configurations. Promises: the parser never panics; a refusal's line is a line
/// of the file; an accepted file has an address that is HOST:PORT, a cluster address, and
/// connection limits in their documented ranges, the cluster listener's equal to the API
/// listener's unless the file sets them.
pub fn server_config(data: &[u8]) {
    let text = match data.split_first() {
        Some((m, rest)) if m % 2 == 1 => assembled(&mut Bytes::new(rest)),
        Some((_, rest)) => String::from_utf8_lossy(rest).into_owned(),
        None => String::new(),
    };
    let c = match server_config::parse(&text) {
        Ok(c) => c,
        Err(e) => {
            assert!(!e.msg.is_empty(), "a refusal without a message");
            if let Some(n) = e.line {
                assert!(
                    n >= 1 && n <= text.lines().count(),
                    "refusal at line {n} of a {}-line file",
                    text.lines().count()
                );
            }
            return;
        }
    };
    assert!(
        c.address.parse::<std::net::SocketAddr>().is_ok(),
        "accepted address {:?}",
        c.address
    );
    assert!(!c.cluster_address.is_empty(), "no cluster address");
    for (what, l) in [
        ("api", c.connection_limits),
        ("cluster", c.cluster_connection_limits),
    ] {
        assert!(
            (1..=1_000_000).contains(&l.max_connections),
            "{what}: max_connections {}",
            l.max_connections
        );
        assert!(!l.header_timeout.is_zero() && !l.idle_timeout.is_zero());
    }
    let api = c.connection_limits;
    let cl = c.cluster_connection_limits;
    if !text.contains("cluster_max_connections") {
        assert_eq!(cl.max_connections, api.max_connections);
    }
    if !text.contains("cluster_read_header_timeout") {
        assert_eq!(cl.header_timeout, api.header_timeout);
    }
    if !text.contains("cluster_idle_timeout") {
        assert_eq!(cl.idle_timeout, api.idle_timeout);
    }
    if c.postgres.is_none() {
        assert!(
            !c.storage_path.as_os_str().is_empty(),
            "accepted without a storage"
        );
    }
}
