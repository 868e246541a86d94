//! LDAP login tokens revoked by prefix are gone everywhere: real `cairn` processes (a
//! primary with a DR secondary and a performance secondary) against a real slapd
//! (`scripts/dev-ldap.sh`).
//!
//! `sys/leases/revoke-prefix/auth/ldap/login` and `revoke-force/...` on the primary revoke
//! its LDAP tokens there; the revocation reaches the DR secondary, so after a promotion
//! they are not valid there either (while a token the prefix does not cover still is,
//! which shows tokens do reach it). Tokens of LDAP logins on the performance secondary live
//! only there; revoked by prefix on the secondary, they are gone there.

use cairn_tests::cluster::*;
use cairn_tests::{note_secret, Server};
use serde_json::{json, Value};

const BASE: &str = "dc=cairn,dc=test";
const BINDPASS: &str = "reader-secret";

fn login(s: &Server, user: &str, password: &str) -> String {
    let r = s.call_as(
        None,
        "POST",
        &format!("auth/ldap/login/{user}"),
        Some(json!({ "password": password })),
    );
    assert_eq!(r.status, 200, "login {user} on {}: {}", s.addr, r.body);
    let t = r.body["auth"]["client_token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!t.is_empty(), "{}", r.body);
    note_secret(&t);
    t
}

fn lookup_status(s: &Server, tok: &str) -> u16 {
    s.call_as(Some(tok), "GET", "auth/token/lookup-self", None)
        .status
}

fn revoke(s: &Server, root: &str, how: &str, prefix: &str) {
    let r = s.call_as(
        Some(root),
        "POST",
        &format!("sys/leases/{how}/{prefix}"),
        Some(json!({})),
    );
    assert_eq!(r.status, 204, "{how}/{prefix} on {}: {}", s.addr, r.body);
}

#[test]
fn ldap_tokens_revoked_by_prefix_are_gone_on_the_primary_its_dr_secondary_and_a_perf_secondary() {
    let dir = cairn_tests::start_dev_ldap("ldap-revoke");
    let get = |k: &str| -> String {
        dir.get(k)
            .cloned()
            .unwrap_or_else(|| panic!("dev-ldap.sh did not export {k}"))
    };
    let mut p = licensed("lrprim");
    let mut s = licensed("lrperf");
    let mut d = licensed("lrdr");

    ok(
        204,
        p.post("sys/auth/ldap", json!({"type": "ldap"})),
        "enable ldap",
    );
    ok(
        204,
        p.post(
            "auth/ldap/config",
            json!({
                "url": get("CAIRN_LDAP_URL"),
                "binddn": get("CAIRN_LDAP_BINDDN"),
                "bindpass": BINDPASS,
                "userdn": format!("ou=people,{BASE}"),
                "userattr": "uid",
                "groupdn": format!("ou=groups,{BASE}"),
            }),
        ),
        "configure ldap",
    );
    ok(
        200,
        p.post("sys/replication/performance/primary/enable", json!({})),
        "perf enable",
    );
    ok(
        200,
        p.post("sys/replication/dr/primary/enable", json!({})),
        "dr enable",
    );
    enable_secondary(&s, "performance", &token(&p, "performance", "perf"));
    enable_secondary(&d, "dr", &token(&p, "dr", "dr"));
    wait_caught_up("perf to catch up", 60, &p, &s, "performance", "perf");
    wait_caught_up("dr to catch up", 60, &p, &d, "dr", "dr");

    // Logins on the primary, and a token no LDAP prefix covers.
    let root = p.root_token.clone();
    let alice1 = login(&p, "alice", "alice-pw");
    let alice2 = login(&p, "alice", "alice-pw");
    let bob = login(&p, "bob", "bob-pw");
    let other: Value = ok(
        200,
        p.post("auth/token/create", json!({"policies": ["default"]})),
        "plain token",
    );
    let other = other["auth"]["client_token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    note_secret(&other);
    for t in [&alice1, &alice2, &bob, &other] {
        assert_eq!(lookup_status(&p, t), 200);
    }
    revoke(&p, &root, "revoke-prefix", "auth/ldap/login");
    for t in [&alice1, &alice2, &bob] {
        assert_eq!(
            lookup_status(&p, t),
            403,
            "revoked by prefix on the primary"
        );
    }
    assert_eq!(lookup_status(&p, &other), 200, "outside the prefix");
    let alice3 = login(&p, "alice", "alice-pw");
    let bob2 = login(&p, "bob", "bob-pw");
    revoke(&p, &root, "revoke-force", "auth/ldap/login/alice");
    assert_eq!(
        lookup_status(&p, &alice3),
        403,
        "revoke-force on the primary"
    );
    assert_eq!(
        lookup_status(&p, &bob2),
        200,
        "bob is not under login/alice"
    );

    // Performance-secondary-local logins, revoked by prefix on the secondary.
    let keys = p.unseal_keys.clone();
    let sroot = generate(&s, "sys/generate-root", &keys);
    note_secret(&sroot);
    s.root_token = sroot.clone();
    let local1 = login(&s, "alice", "alice-pw");
    let local2 = login(&s, "bob", "bob-pw");
    for t in [&local1, &local2] {
        assert_eq!(lookup_status(&s, t), 200, "a login on the perf secondary");
    }
    revoke(&s, &sroot, "revoke-prefix", "auth/ldap/login");
    for t in [&local1, &local2] {
        assert_eq!(
            lookup_status(&s, t),
            403,
            "revoked by prefix on the perf secondary"
        );
    }
    let local3 = login(&s, "alice", "alice-pw");
    revoke(&s, &sroot, "revoke-force", "auth/ldap/login");
    assert_eq!(lookup_status(&s, &local3), 403, "revoke-force there");

    // The DR secondary, promoted after the primary dies, knows none of the revoked tokens.
    wait_caught_up("dr to catch up again", 60, &p, &d, "dr", "dr");
    p.kill9();
    cairn_tests::cluster::promote_dr(&d, &keys);
    d.root_token = root.clone();
    wait_for("the promoted DR secondary to serve", 30, || {
        lookup_status(&d, &root) == 200
    });
    for t in [&alice1, &alice2, &bob, &alice3] {
        assert_eq!(
            lookup_status(&d, t),
            403,
            "a token revoked on the primary is not valid on the promoted DR secondary"
        );
    }
    assert_eq!(
        lookup_status(&d, &other),
        200,
        "tokens outside the prefix came along"
    );
    assert_eq!(lookup_status(&d, &bob2), 200, "and bob's later one too");
    // The promoted cluster revokes by prefix itself.
    revoke(&d, &root, "revoke-prefix", "auth/ldap/login");
    assert_eq!(lookup_status(&d, &bob2), 403);
    assert_eq!(lookup_status(&d, &other), 200);
}
