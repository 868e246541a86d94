//! End-to-end tests of the LDAP auth method: a real `cairn` dev server against a real
//! OpenLDAP slapd started by `scripts/dev-ldap.sh` (sample directory in `scripts/ldap/`).
//!
//! One slapd serves the whole test binary (it stops by itself when this process exits);
//! each test runs its own `cairn` process and mounts the LDAP method where it needs it.

use cairn_tests::{Resp, Server};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// The running directory: the `export` lines of `dev-ldap.sh start`.
struct Directory {
    env: BTreeMap<String, String>,
}

impl Directory {
    fn get(&self, k: &str) -> String {
        self.env
            .get(k)
            .cloned()
            .unwrap_or_else(|| panic!("dev-ldap.sh did not export {k}"))
    }
    fn url(&self) -> String {
        self.get("CAIRN_LDAP_URL")
    }
    fn ldaps(&self) -> String {
        self.get("CAIRN_LDAPS_URL")
    }
    fn file(&self, k: &str) -> String {
        std::fs::read_to_string(self.get(k)).unwrap_or_else(|e| panic!("{k}: {e}"))
    }
    fn ca(&self) -> String {
        self.file("CAIRN_LDAP_CA")
    }
}

const BASE: &str = "dc=cairn,dc=test";
const BINDPASS: &str = "reader-secret";

fn directory() -> &'static Directory {
    static DIR: OnceLock<Directory> = OnceLock::new();
    DIR.get_or_init(|| Directory {
        env: cairn_tests::start_dev_ldap("ldap-auth"),
    })
}

use cairn_tests::enc_segment as enc;

/// A dev server with an LDAP mount at `auth/<mount>` configured with `config`.
fn server_with(mount: &str, config: Value) -> Server {
    let s = Server::dev();
    if mount != "ldap" {
        let r = s.post(&format!("sys/auth/{mount}"), json!({"type": "ldap"}));
        assert_eq!(r.status, 204, "mount {mount}: {r:?}");
    }
    configure(&s, mount, config);
    s
}

fn configure(s: &Server, mount: &str, config: Value) {
    let r = s.post(&format!("auth/{mount}/config"), config.clone());
    assert!(
        r.status == 204,
        "config {config}: {} {}",
        r.status,
        r.errors()
    );
}

fn map_group(s: &Server, mount: &str, group: &str, policies: &str) {
    let r = s.post(
        &format!("auth/{mount}/groups/{}", enc(group)),
        json!({ "policies": policies }),
    );
    assert_eq!(r.status, 204, "{r:?}");
}

fn login(s: &Server, mount: &str, user: &str, password: &str) -> Resp {
    s.call_as(
        None,
        "POST",
        &format!("auth/{mount}/login/{}", enc(user)),
        Some(json!({ "password": password })),
    )
}

fn policies(r: &Resp) -> Vec<String> {
    r.body["auth"]["policies"]
        .as_array()
        .unwrap_or_else(|| panic!("no policies in {r:?}"))
        .iter()
        .map(|p| p.as_str().unwrap_or_default().to_string())
        .collect()
}

fn error(r: &Resp) -> String {
    r.body["errors"][0].as_str().unwrap_or_default().to_string()
}

/// Authenticated search: binddn + bindpass + userfilter.
fn search_config(d: &Directory) -> Value {
    json!({
        "url": d.url(),
        "binddn": d.get("CAIRN_LDAP_BINDDN"),
        "bindpass": BINDPASS,
        "userdn": format!("ou=people,{BASE}"),
        "userattr": "uid",
        "groupdn": format!("ou=groups,{BASE}"),
    })
}

fn ok(r: &Resp) {
    assert_eq!(
        r.status,
        200,
        "expected a login: {} {}",
        r.status,
        r.errors()
    );
}

#[test]
fn authenticated_search_maps_groups_of_three_kinds_and_users() {
    let d = directory();
    let s = server_with("ldap", search_config(d));
    map_group(&s, "ldap", "engineers", "eng");
    map_group(&s, "ldap", "ops", "ops-pol");
    map_group(&s, "ldap", "posix-users", "posix-pol");
    map_group(&s, "ldap", "local-team", "local-pol");
    let r = s.post(
        "auth/ldap/users/alice",
        json!({"groups": "local-team", "policies": "own"}),
    );
    assert_eq!(r.status, 204);

    // alice: groupOfNames member + groupOfUniqueNames uniqueMember + user mapping.
    let r = login(&s, "ldap", "alice", "alice-pw");
    ok(&r);
    assert_eq!(
        policies(&r),
        ["default", "eng", "local-pol", "ops-pol", "own"]
    );
    let auth = &r.body["auth"];
    assert_eq!(auth["token_policies"], auth["policies"]);
    assert_eq!(auth["metadata"]["username"], "alice");
    assert!(auth["client_token"].as_str().unwrap_or_default().len() > 10);
    assert!(!auth["accessor"].as_str().unwrap_or_default().is_empty());
    assert!(auth["lease_duration"].as_u64().unwrap_or(0) > 0);
    assert_eq!(auth["renewable"], true);
    assert_eq!(r.body["lease_id"], "");
    assert_eq!(r.body["renewable"], false);
    assert_eq!(r.body["lease_duration"], 0);
    assert_eq!(r.body["data"], Value::Null);
    // The token works and carries the policies.
    let token = auth["client_token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let me = s.call_as(Some(&token), "GET", "auth/token/lookup-self", None);
    assert_eq!(me.status, 200, "{me:?}");
    assert_eq!(me.body["data"]["policies"], auth["policies"]);

    // bob: posixGroup memberUid + uniqueMember.
    let r = login(&s, "ldap", "bob", "bob-pw");
    ok(&r);
    assert_eq!(policies(&r), ["default", "ops-pol", "posix-pol"]);

    // Group names and usernames are case-insensitive by default.
    let r = login(&s, "ldap", "ALICE", "alice-pw");
    ok(&r);
    assert!(policies(&r).contains(&"own".to_string()));

    // Wrong password and unknown user: the reference's message, no hint of which.
    let r = login(&s, "ldap", "alice", "wrong");
    assert_eq!(r.status, 400);
    assert_eq!(error(&r), "ldap operation failed: failed to bind as user");
    let r = login(&s, "ldap", "nobody", "x");
    assert_eq!(r.status, 400);
    assert_eq!(error(&r), "ldap operation failed: failed to bind as user");

    // The bind password is never returned.
    let c = s.get("auth/ldap/config");
    assert_eq!(c.status, 200);
    assert!(c.body["data"].get("bindpass").is_none());
    assert!(!c.body.to_string().contains(BINDPASS));
}

#[test]
fn token_ttls_and_token_policies_from_config() {
    let d = directory();
    let mut c = search_config(d);
    c["token_ttl"] = json!("1h");
    c["token_max_ttl"] = json!("2h");
    c["token_policies"] = json!("base");
    let s = server_with("ldap", c);
    let r = login(&s, "ldap", "twin1", "twin1-pw");
    ok(&r);
    assert_eq!(r.body["auth"]["lease_duration"], 3600);
    assert_eq!(policies(&r), ["base", "default"]);
}

#[test]
fn memberof_strategy_reads_groups_from_the_user_object() {
    let d = directory();
    let mut c = search_config(d);
    c["groupdn"] = json!(format!("ou=people,{BASE}"));
    c["groupfilter"] = json!("(&(objectClass=inetOrgPerson)(uid={{.Username}}))");
    c["groupattr"] = json!("memberOf");
    let s = server_with("ldap", c);
    map_group(&s, "ldap", "engineers", "eng");
    let r = login(&s, "ldap", "alice", "alice-pw");
    ok(&r);
    assert_eq!(policies(&r), ["default", "eng"]);
}

#[test]
fn anonymous_discoverdn_search_finds_the_user() {
    let d = directory();
    let s = server_with(
        "ldap",
        json!({
            "url": d.url(),
            "discoverdn": true,
            "deny_null_bind": false,
            "userdn": format!("ou=people,{BASE}"),
            "userattr": "uid",
            "userfilter": "(&(objectClass=inetOrgPerson)({{.UserAttr}}={{.Username}}))",
            "groupdn": format!("ou=groups,{BASE}"),
        }),
    );
    map_group(&s, "ldap", "ops", "ops-pol");
    let r = login(&s, "ldap", "bob", "bob-pw");
    ok(&r);
    assert!(policies(&r).contains(&"ops-pol".to_string()));
    assert_eq!(login(&s, "ldap", "bob", "nope").status, 400);
}

#[test]
fn plain_userattr_bind_dn_and_anonymous_group_search() {
    let d = directory();
    let s = server_with(
        "ldap",
        json!({
            "url": d.url(),
            "userdn": format!("ou=people,{BASE}"),
            "userattr": "uid",
            "groupdn": format!("ou=groups,{BASE}"),
        }),
    );
    map_group(&s, "ldap", "engineers", "eng");
    let r = login(&s, "ldap", "alice", "alice-pw");
    ok(&r);
    assert_eq!(policies(&r), ["default", "eng"]);
    // A username that tries to extend the DN binds as nobody.
    let r = login(&s, "ldap", "alice,ou=people", "alice-pw");
    assert_eq!(r.status, 400);

    configure(&s, "ldap", json!({"anonymous_group_search": true}));
    let r = login(&s, "ldap", "alice", "alice-pw");
    ok(&r);
    assert_eq!(policies(&r), ["default", "eng"]);
}

#[test]
fn upn_bind_sends_user_at_domain() {
    // slapd has no userPrincipalName binds (that needs Active Directory): the directory
    // refuses the UPN as a bind name, which shows the login reached the user bind with it.
    // The full UPN flow is covered by the core's tests against the fake directory.
    let d = directory();
    let s = server_with(
        "ldap",
        json!({
            "url": d.url(),
            "upndomain": "cairn.test",
            "userdn": format!("ou=people,{BASE}"),
            "groupdn": format!("ou=groups,{BASE}"),
        }),
    );
    let r = login(&s, "ldap", "alice", "alice-pw");
    assert_eq!(r.status, 400);
    assert!(
        error(&r).starts_with("ldap operation failed: failed to bind as user"),
        "{}",
        error(&r)
    );
}

#[test]
fn starttls_ldaps_insecure_tls_and_client_certificates() {
    let d = directory();
    let mut c = search_config(d);
    c["starttls"] = json!(true);
    c["certificate"] = json!(d.ca());
    let s = server_with("ldap", c);
    map_group(&s, "ldap", "engineers", "eng");
    ok(&login(&s, "ldap", "alice", "alice-pw"));

    // StartTLS without the CA: the server certificate is not trusted.
    configure(&s, "ldap", json!({"certificate": ""}));
    let r = login(&s, "ldap", "alice", "alice-pw");
    assert_eq!(r.status, 400);
    assert!(error(&r).contains("TLS"), "{}", error(&r));

    // ldaps with the CA.
    configure(
        &s,
        "ldap",
        json!({"url": d.ldaps(), "starttls": false, "certificate": d.ca()}),
    );
    let r = login(&s, "ldap", "alice", "alice-pw");
    ok(&r);
    assert_eq!(policies(&r), ["default", "eng"]);

    // TLS 1.3 only.
    configure(
        &s,
        "ldap",
        json!({"tls_min_version": "tls13", "tls_max_version": "tls13"}),
    );
    ok(&login(&s, "ldap", "alice", "alice-pw"));
    configure(
        &s,
        "ldap",
        json!({"tls_min_version": "tls12", "tls_max_version": "tls12"}),
    );

    // ldaps without the CA fails; insecure_tls skips verification.
    configure(&s, "ldap", json!({"certificate": ""}));
    let r = login(&s, "ldap", "alice", "alice-pw");
    assert_eq!(r.status, 400);
    let e = error(&r);
    assert!(e.contains("TLS") && e.contains(&d.ldaps()), "{e}");
    assert!(!e.contains(BINDPASS));
    configure(&s, "ldap", json!({"insecure_tls": true}));
    ok(&login(&s, "ldap", "alice", "alice-pw"));

    // The mutual-TLS server refuses clients without a certificate...
    configure(
        &s,
        "ldap",
        json!({
            "url": d.get("CAIRN_LDAPS_MTLS_URL"),
            "insecure_tls": false,
            "certificate": d.ca(),
        }),
    );
    let r = login(&s, "ldap", "alice", "alice-pw");
    assert_eq!(r.status, 400, "{r:?}");
    assert!(error(&r).contains("ldap operation failed"), "{}", error(&r));
    // ...and accepts ours.
    configure(
        &s,
        "ldap",
        json!({
            "client_tls_cert": d.file("CAIRN_LDAP_CLIENT_CERT"),
            "client_tls_key": d.file("CAIRN_LDAP_CLIENT_KEY"),
        }),
    );
    let r = login(&s, "ldap", "alice", "alice-pw");
    ok(&r);
    assert_eq!(policies(&r), ["default", "eng"]);
    // The key is never returned.
    let c = s.get("auth/ldap/config");
    assert!(c.body["data"].get("client_tls_key").is_none());
    assert!(!c.body.to_string().contains("PRIVATE KEY"));
    assert!(c.body["data"]["client_tls_cert"]
        .as_str()
        .unwrap_or_default()
        .contains("CERTIFICATE"));
}

#[test]
fn url_failover_skips_a_dead_server() {
    let d = directory();
    let dead = d.get("CAIRN_LDAP_DEAD_URL");
    let mut c = search_config(d);
    c["url"] = json!(format!("{dead},{}", d.url()));
    let s = server_with("ldap", c);
    ok(&login(&s, "ldap", "alice", "alice-pw"));
    configure(&s, "ldap", json!({ "url": dead.clone() }));
    let r = login(&s, "ldap", "alice", "alice-pw");
    assert_eq!(r.status, 400);
    let e = error(&r);
    assert!(
        e.contains("failed to connect to LDAP server") && e.contains(&dead),
        "{e}"
    );
}

#[test]
fn paging_returns_groups_past_the_size_limit() {
    let d = directory();
    let s = server_with("ldap", search_config(d));
    map_group(&s, "ldap", "bulk-00", "first");
    map_group(&s, "ldap", "bulk-59", "last");
    // carol is in 60 groups; plain searches stop at 50.
    let r = login(&s, "ldap", "carol", "carol-pw");
    assert_eq!(r.status, 400);
    assert!(error(&r).contains("size limit"), "{}", error(&r));
    configure(&s, "ldap", json!({"max_page_size": 20}));
    let r = login(&s, "ldap", "carol", "carol-pw");
    ok(&r);
    assert_eq!(policies(&r), ["default", "first", "last"]);
}

#[test]
fn alias_dereferencing_follows_the_configured_mode() {
    let d = directory();
    let mut c = search_config(d);
    // uid=robert,ou=aliases is an alias of uid=bob,ou=people.
    c["userdn"] = json!(format!("ou=aliases,{BASE}"));
    let s = server_with("ldap", c);
    for (mode, works) in [
        ("never", false),
        ("finding", false),
        ("searching", true),
        ("always", true),
    ] {
        configure(&s, "ldap", json!({ "dereference_aliases": mode }));
        let r = login(&s, "ldap", "bob", "bob-pw");
        assert_eq!(
            r.status == 200,
            works,
            "{mode}: {} {}",
            r.status,
            r.errors()
        );
    }
}

#[test]
fn metacharacter_and_non_ascii_usernames_are_escaped() {
    let d = directory();
    let tricky = "o'brien, jr+x#=\\*";
    // Search path (filter escaping) and plain bind DN path (DN escaping).
    let plain = json!({
        "url": d.url(),
        "userdn": format!("ou=people,{BASE}"),
        "userattr": "uid",
        "groupdn": format!("ou=groups,{BASE}"),
    });
    for config in [search_config(d), plain] {
        let s = server_with("ldap", config);
        map_group(&s, "ldap", "engineers", "eng");
        map_group(&s, "ldap", "posix-users", "posix-pol");
        map_group(&s, "ldap", "équipe", "intl");
        let r = login(&s, "ldap", tricky, "obrien-pw");
        ok(&r);
        assert_eq!(policies(&r), ["default", "eng", "intl", "posix-pol"]);
        assert_eq!(r.body["auth"]["metadata"]["username"], tricky);
        let r = login(&s, "ldap", "zoë", "zoe-pw");
        ok(&r);
        assert_eq!(policies(&r), ["default", "intl"]);
        // Filter metacharacters never match another entry.
        for evil in ["*", "alice*", "a*e", "alice)(uid=*", "*)(|(uid=*", "\\2a"] {
            let r = login(&s, "ldap", evil, "alice-pw");
            assert_eq!(r.status, 400, "{evil:?} must not log in: {r:?}");
        }
    }
}

#[test]
fn several_matches_are_refused() {
    let d = directory();
    let mut c = search_config(d);
    c["userattr"] = json!("sn");
    let s = server_with("ldap", c);
    let r = login(&s, "ldap", "Twin", "twin1-pw");
    assert_eq!(r.status, 400);
    // Answered like a wrong password (the operator finds the count in the server's log),
    // so the answer does not tell an ambiguous name from an unknown one.
    assert_eq!(error(&r), "ldap operation failed: failed to bind as user");
}

#[test]
fn deny_null_bind_refuses_empty_passwords() {
    let d = directory();
    let s = server_with(
        "ldap",
        json!({
            "url": d.url(),
            "userdn": format!("ou=people,{BASE}"),
            "userattr": "uid",
            "groupdn": format!("ou=groups,{BASE}"),
        }),
    );
    let r = login(&s, "ldap", "alice", "");
    assert_eq!(r.status, 400);
    assert!(error(&r).contains("password cannot be of zero length"));
    // The directory accepts a DN with an empty password as an anonymous bind
    // (`allow bind_anon_dn`): without deny_null_bind that is a login without a password.
    configure(&s, "ldap", json!({"deny_null_bind": false}));
    ok(&login(&s, "ldap", "alice", ""));
}

#[test]
fn config_validation_names_the_field_and_stores_nothing() {
    let d = directory();
    let s = server_with("ldap", search_config(d));
    let before = s.get("auth/ldap/config").body["data"].clone();
    let cases = [
        (json!({"url": "http://127.0.0.1"}), "url"),
        (json!({"url": "ldap://host:notaport"}), "url"),
        (json!({"certificate": "not a certificate"}), "certificate"),
        (json!({"client_tls_key": "junk"}), "client_tls_key"),
        (
            json!({"dereference_aliases": "sometimes"}),
            "dereference_aliases",
        ),
        (
            json!({"userfilter": "({{.UserAttr}={{.Username}})"}),
            "userfilter",
        ),
        (json!({"groupfilter": "(member={{.UserDN}"}), "groupfilter"),
        (json!({"max_page_size": -1}), "max_page_size"),
        (
            json!({"tls_min_version": "tls13", "tls_max_version": "tls12"}),
            "tls_max_version",
        ),
    ];
    for (body, field) in cases {
        let r = s.post("auth/ldap/config", body.clone());
        assert_eq!(r.status, 400, "{body}: {r:?}");
        assert!(error(&r).contains(field), "{body}: {}", error(&r));
    }
    assert_eq!(s.get("auth/ldap/config").body["data"], before);

    // Mappings: LIST and GET ?list=true, read, delete.
    map_group(&s, "ldap", "b-team", "p2,p1");
    map_group(&s, "ldap", "a-team", "x");
    let l = s.list("auth/ldap/groups");
    assert_eq!(l.body["data"]["keys"], json!(["a-team", "b-team"]));
    let l = s.get("auth/ldap/groups?list=true");
    assert_eq!(l.body["data"]["keys"], json!(["a-team", "b-team"]));
    assert_eq!(
        s.get("auth/ldap/groups/b-team").body["data"]["policies"],
        json!(["p1", "p2"])
    );
    assert_eq!(s.delete("auth/ldap/groups/a-team").status, 204);
    assert_eq!(s.get("auth/ldap/groups/a-team").status, 404);
    let r = s.post(
        "auth/ldap/users/alice",
        json!({"groups": ["g1", "g2"], "policies": "p"}),
    );
    assert_eq!(r.status, 204);
    assert_eq!(
        s.get("auth/ldap/users/alice").body["data"],
        json!({"groups": "g1,g2", "policies": ["p"]})
    );
    assert_eq!(
        s.list("auth/ldap/users").body["data"]["keys"],
        json!(["alice"])
    );
}

#[test]
fn a_second_mount_has_its_own_config() {
    let d = directory();
    let s = server_with("ldap", search_config(d));
    let r = s.post("sys/auth/corp", json!({"type": "ldap"}));
    assert!(r.status == 204, "{r:?}");
    let r = login(&s, "corp", "alice", "alice-pw");
    assert_eq!(r.status, 400);
    assert!(error(&r).contains("not configured"), "{}", error(&r));
    configure(&s, "corp", search_config(d));
    map_group(&s, "corp", "engineers", "corp-eng");
    let r = login(&s, "corp", "alice", "alice-pw");
    ok(&r);
    assert_eq!(policies(&r), ["corp-eng", "default"]);
}

fn accessor_of(s: &Server, mount: &str) -> String {
    let r = s.get(&format!("sys/auth/{mount}"));
    let a = r.body["data"]["accessor"]
        .as_str()
        .or_else(|| r.body["accessor"].as_str())
        .map(str::to_string);
    a.unwrap_or_else(|| {
        let all = s.get("sys/auth");
        all.body["data"][format!("{mount}/")]["accessor"]
            .as_str()
            .unwrap_or_else(|| panic!("no accessor for {mount} in {all:?}"))
            .to_string()
    })
}

#[test]
fn user_lockout_locks_after_failures_without_asking_the_directory() {
    let d = directory();
    let mut c = search_config(d);
    c["user_lockout_threshold"] = json!(3);
    c["user_lockout_duration"] = json!("1h");
    let s = server_with("ldap", c);
    let acc = accessor_of(&s, "ldap");
    for _ in 0..3 {
        let r = login(&s, "ldap", "bob", "wrong");
        assert_eq!(r.status, 400, "{r:?}");
        assert_eq!(error(&r), "ldap operation failed: failed to bind as user");
    }
    // Locked: the right password is refused too, whatever the case of the name.
    for name in ["bob", "BOB"] {
        let r = login(&s, "ldap", name, "bob-pw");
        assert_eq!(r.status, 403, "{r:?}");
        assert_eq!(error(&r), "permission denied");
    }
    // The directory is not asked: with a dead URL the answer is still the lockout.
    configure(&s, "ldap", json!({"url": d.get("CAIRN_LDAP_DEAD_URL")}));
    assert_eq!(login(&s, "ldap", "bob", "bob-pw").status, 403);
    configure(&s, "ldap", json!({"url": d.url()}));
    // Others log in.
    ok(&login(&s, "ldap", "alice", "alice-pw"));
    let l = s.get("sys/locked-users");
    assert_eq!(l.status, 200, "{l:?}");
    assert_eq!(l.body["data"]["total"], 1);
    assert_eq!(
        l.body["data"]["by_namespace"][0]["mount_accessors"][0],
        json!({"mount_accessor": acc, "counts": 1, "alias_identifiers": ["bob"]})
    );
    let l = s.get(&format!("sys/locked-users?mount_accessor={acc}"));
    assert_eq!(l.body["data"]["total"], 1);
    let l = s.get("sys/locked-users?mount_accessor=auth_ldap_other");
    assert_eq!(l.body["data"]["total"], 0);
    // Unlock, then the right password works.
    let r = s.post(&format!("sys/locked-users/{acc}/unlock/bob"), json!({}));
    assert_eq!(r.status, 204, "{r:?}");
    ok(&login(&s, "ldap", "bob", "bob-pw"));
    assert_eq!(s.get("sys/locked-users").body["data"]["total"], 0);
    // Disabled per mount: failures never lock.
    configure(&s, "ldap", json!({"user_lockout_disable": true}));
    for _ in 0..4 {
        assert_eq!(login(&s, "ldap", "bob", "wrong").status, 400);
    }
    ok(&login(&s, "ldap", "bob", "bob-pw"));
}

fn renew_self(s: &Server, token: &str) -> Resp {
    s.call_as(
        Some(token),
        "POST",
        "auth/token/renew-self",
        Some(json!({})),
    )
}

#[test]
fn renewal_rechecks_groups_with_the_service_identity() {
    let d = directory();
    let s = server_with("ldap", search_config(d));
    map_group(&s, "ldap", "engineers", "eng");
    map_group(&s, "ldap", "ops", "ops-pol");
    let r = login(&s, "ldap", "alice", "alice-pw");
    ok(&r);
    let token = r.body["auth"]["client_token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let r = renew_self(&s, &token);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["auth"]["client_token"], token.as_str());
    assert_eq!(policies(&r), ["default", "eng", "ops-pol"]);
    // The groups now map to another policy set: the renewal is refused.
    map_group(&s, "ldap", "ops", "ops-pol,extra");
    let r = renew_self(&s, &token);
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(error(&r), "policies have changed, not renewing");
    map_group(&s, "ldap", "ops", "ops-pol");
    let r = s.post("auth/token/renew", json!({ "token": token }));
    assert_eq!(r.status, 200, "{r:?}");
    // The directory cannot be reached: no renewal either.
    configure(&s, "ldap", json!({"url": d.get("CAIRN_LDAP_DEAD_URL")}));
    let r = renew_self(&s, &token);
    assert_eq!(r.status, 400, "{r:?}");
    assert!(
        error(&r).contains("failed to connect to LDAP server"),
        "{}",
        error(&r)
    );

    // Without binddn there is no service identity: a plain renewal.
    let s = server_with(
        "ldap",
        json!({
            "url": d.url(),
            "userdn": format!("ou=people,{BASE}"),
            "userattr": "uid",
            "groupdn": format!("ou=groups,{BASE}"),
        }),
    );
    let r = login(&s, "ldap", "bob", "bob-pw");
    ok(&r);
    let token = r.body["auth"]["client_token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    map_group(&s, "ldap", "ops", "changed");
    let r = renew_self(&s, &token);
    assert_eq!(r.status, 200, "{r:?}");
}

/// Two requests pipelined on one connection, a login (answered after the directory's round
/// trips) and then a health check (answered at once): the server answers both, in order,
/// and keeps serving. The second answer waits on its connection for the first to be
/// written; that wait must not hold any thread the first answer needs.
#[test]
fn pipelined_requests_behind_a_login_are_answered_in_order() {
    use std::io::{Read, Write};
    let d = directory();
    let s = server_with("ldap", search_config(d));
    let mut c = std::net::TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
    c.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    let body = json!({ "password": "alice-pw" }).to_string();
    let both = format!(
        "POST /v1/auth/ldap/login/alice HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}\
         GET /v1/sys/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        body.len()
    );
    c.write_all(both.as_bytes()).expect("write");
    let mut got = Vec::new();
    c.read_to_end(&mut got)
        .expect("both answers before the timeout (a stuck server never closes)");
    let got = String::from_utf8_lossy(&got);
    let login_at = got.find("client_token").expect("the login's answer");
    let health_at = got.find("\"initialized\"").expect("the health answer");
    assert!(login_at < health_at, "answers in request order: {got}");
    assert_eq!(got.matches("HTTP/1.1 200").count(), 2, "{got}");
    // And the server still serves.
    ok(&login(&s, "ldap", "alice", "alice-pw"));
}
