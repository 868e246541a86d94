//! The server configuration file on the shell's side: `cairn_core::server_config` parses
//! the HCL (its layout and keys are documented there); this module adds what needs the
//! shell's libraries: the PostgreSQL connection URL's check, and the listeners' limits in
//! tiny_http's terms.

pub use cairn_core::server_config::{
    line_of, next_port, ConfigError, ConnectionLimits, ServerConfig, DEFAULT_MAX_REQUEST_SIZE,
};

/// Parses the configuration file's text; a refusal names the key and its line.
pub fn parse(text: &str) -> Result<ServerConfig, ConfigError> {
    let c = cairn_core::server_config::parse(text)?;
    if let Some(p) = &c.postgres {
        // A bad URL or table name is a configuration error with its line; the message
        // never repeats the URL (it holds the password).
        crate::postgres::PgSettings::new(
            &p.connection_url,
            p.table.as_deref(),
            p.ha_table.as_deref(),
        )
        .map_err(|e| {
            let key = if e.starts_with("table") {
                "table"
            } else if e.starts_with("ha_table") {
                "ha_table"
            } else {
                "connection_url"
            };
            ConfigError {
                line: line_of(text, key),
                msg: format!("storage \"postgresql\": {e}"),
            }
        })?;
    }
    Ok(c)
}

/// A listener's limits as tiny_http takes them.
pub fn tiny_limits(l: ConnectionLimits) -> tiny_http::ConnectionLimits {
    tiny_http::ConnectionLimits {
        max_connections: l.max_connections,
        header_timeout: l.header_timeout,
        idle_timeout: l.idle_timeout,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::server_config::{closest, edit_distance, LISTENER_KEYS, TOP_KEYS};
    use std::path::PathBuf;

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
