//! The unmodified Python client hvac (installed from PyPI into a virtualenv by
//! `scripts/hvac-venv.sh`) drives a real dev server through `tests/hvac/test_hvac.py`:
//! health and init status, tokens, KV v1, KV v2 (versions, check-and-set, patch, delete,
//! undelete, destroy, metadata), wrapping, enabling and configuring the LDAP auth
//! method, its group and user mappings, a real login against the dev slapd
//! (`scripts/dev-ldap.sh`), and the identity store (entities, aliases, groups, group aliases,
//! lookups, a login carrying an external group's policies).

use cairn_tests::Server;
use std::collections::BTreeMap;
use std::process::Command;

/// The virtualenv's python, created on first use.
fn hvac_python() -> String {
    let out = Command::new("bash")
        .arg(cairn_tests::repo_root().join("scripts/hvac-venv.sh"))
        .output()
        .expect("run scripts/hvac-venv.sh");
    assert!(
        out.status.success(),
        "scripts/hvac-venv.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Starts the sample directory (stopped when this process exits); its `export` lines.
fn dev_ldap() -> BTreeMap<String, String> {
    cairn_tests::start_dev_ldap("hvac")
}

#[test]
fn unmodified_hvac_drives_cairn() {
    let py = hvac_python();
    let d = dev_ldap();
    let get = |k: &str| {
        d.get(k)
            .cloned()
            .unwrap_or_else(|| panic!("dev-ldap.sh did not export {k}"))
    };
    let base = get("CAIRN_LDAP_BASE");
    let s = Server::dev();
    let out = Command::new(&py)
        .arg(cairn_tests::repo_root().join("tests/hvac/test_hvac.py"))
        .env("CAIRN_ADDR", &s.addr)
        .env("CAIRN_TOKEN", &s.root_token)
        .env("CAIRN_HVAC_LDAP_URL", get("CAIRN_LDAP_URL"))
        .env("CAIRN_HVAC_LDAP_USERDN", format!("ou=people,{base}"))
        .env("CAIRN_HVAC_LDAP_GROUPDN", format!("ou=groups,{base}"))
        .env("CAIRN_HVAC_LDAP_BINDDN", get("CAIRN_LDAP_BINDDN"))
        .env("CAIRN_HVAC_LDAP_BINDPASS", get("CAIRN_LDAP_BINDPASS"))
        .env("CAIRN_HVAC_LDAP_USERATTR", "uid")
        .env("CAIRN_HVAC_LDAP_USER", "alice")
        .env("CAIRN_HVAC_LDAP_PASSWORD", "alice-pw")
        .env("CAIRN_HVAC_LDAP_GROUP", "engineers")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run the hvac script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Shown with --nocapture, and on failure.
    println!("{stdout}{stderr}");
    assert!(
        out.status.success(),
        "hvac checks failed:\n{stdout}\n{stderr}"
    );
    for name in [
        "health_and_init_status",
        "token_lookup_create_renew_revoke",
        "kv_v1_write_read_list_delete",
        "kv_v2_versions_patch_delete_undelete_destroy_metadata",
        "wrap_and_unwrap",
        "ldap_enable_configure_read_configuration",
        "ldap_group_and_user_mappings",
        "ldap_login",
        "identity_entities_groups_and_ldap_login",
    ] {
        assert!(
            stdout.contains(&format!("ok   {name}")),
            "{name} did not pass:\n{stdout}"
        );
    }
}
