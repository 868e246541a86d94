//! End-to-end tests of the LDAP auth method against Active Directory: a real `cairn` dev
//! server against a Samba 4 AD domain controller started by `scripts/dev-ad.sh` (realm
//! CAIRN.TEST, seeded users and groups: see the script's header), configured the way an
//! AD administrator would.
//!
//! One DC serves the whole test binary (it stops, and its loopback address goes, when this
//! process exits: `CAIRN_AD_WATCH_PID`); each test runs its own `cairn` process. Needs root
//! (the DC's own loopback address; the packages are installed on demand).

use cairn_tests::{log_dir, Resp, Server};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

struct Dc {
    env: BTreeMap<String, String>,
}

impl Dc {
    fn get(&self, k: &str) -> String {
        self.env
            .get(k)
            .cloned()
            .unwrap_or_else(|| panic!("dev-ad.sh did not export {k}"))
    }
    fn file(&self, k: &str) -> String {
        std::fs::read_to_string(self.get(k)).unwrap_or_else(|e| panic!("{k}: {e}"))
    }
    fn ca(&self) -> String {
        self.file("AD_CA")
    }
}

const BASE: &str = "DC=cairn,DC=test";
const USERS: &str = "CN=Users,DC=cairn,DC=test";
const BIND_FAILED: &str = "ldap operation failed: failed to bind as user";

fn dc() -> &'static Dc {
    static DC: OnceLock<Dc> = OnceLock::new();
    DC.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("cairn-e2e-ad-{}", std::process::id()));
        let started = Instant::now();
        let env = cairn_tests::start_dev_directory("dev-ad.sh", &dir, "CAIRN_AD_WATCH_PID");
        eprintln!(
            "ad: the domain controller answered after {:.1} s",
            started.elapsed().as_secs_f64()
        );
        Dc { env }
    })
}

use cairn_tests::enc_segment as enc;

fn server_with(config: Value) -> Server {
    let s = Server::dev();
    configure(&s, config);
    s
}

fn configure(s: &Server, config: Value) {
    let r = s.post("auth/ldap/config", config.clone());
    assert!(
        r.status < 300,
        "config {config}: {} {}",
        r.status,
        r.errors()
    );
}

fn map_group(s: &Server, group: &str, policies: &str) {
    let r = s.post(
        &format!("auth/ldap/groups/{}", enc(group)),
        json!({ "policies": policies }),
    );
    assert_eq!(r.status, 204, "{r:?}");
}

fn login(s: &Server, user: &str, password: &str) -> Resp {
    s.call_as(
        None,
        "POST",
        &format!("auth/ldap/login/{}", enc(user)),
        Some(json!({ "password": password })),
    )
}

fn ok(r: &Resp) -> &Resp {
    assert_eq!(r.status, 200, "{r:?}");
    r
}

fn policies(r: &Resp) -> Vec<String> {
    r.body["auth"]["policies"]
        .as_array()
        .unwrap_or_else(|| panic!("no policies in {r:?}"))
        .iter()
        .map(|p| p.as_str().unwrap_or_default().to_string())
        .collect()
}

fn groups_meta(r: &Resp) -> String {
    r.body["auth"]["metadata"].to_string()
}

fn error(r: &Resp) -> String {
    r.body["errors"][0].as_str().unwrap_or_default().to_string()
}

/// The server's log (stderr) so far.
fn server_log(s: &Server) -> String {
    let p = log_dir().join(format!("dev-{}-{}.log", s.port, std::process::id()));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Waits (bounded) until the server's log has a line containing `what`.
fn log_has(s: &Server, what: &str) -> bool {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        if server_log(s).contains(what) {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// LDAPS with the DC's CA, users bound as `<name>@cairn.test`.
fn upn_config(d: &Dc) -> Value {
    json!({
        "url": d.get("AD_URL"),
        "certificate": d.ca(),
        "upndomain": d.get("AD_DOMAIN"),
        "userdn": USERS,
        "userattr": "userPrincipalName",
        "groupdn": BASE,
        "groupfilter": "(&(objectClass=group)(member:1.2.840.113556.1.4.1941:={{.UserDN}}))",
        "groupattr": "cn",
    })
}

/// A service account finds the user by sAMAccountName (discoverdn), as in most AD setups.
fn discover_config(d: &Dc) -> Value {
    json!({
        "url": d.get("AD_URL"),
        "certificate": d.ca(),
        "binddn": d.get("AD_BINDDN"),
        "bindpass": d.get("AD_BINDPASS"),
        "discoverdn": true,
        "userdn": USERS,
        "userattr": "sAMAccountName",
        "userfilter": "(&(objectClass=user)({{.UserAttr}}={{.Username}}))",
        "groupdn": BASE,
        "groupfilter": "(&(objectClass=group)(member={{.UserDN}}))",
        "groupattr": "cn",
    })
}

#[test]
fn upndomain_logins_with_user_principal_name_and_sam_account_name() {
    let d = dc();
    let s = server_with(upn_config(d));
    map_group(&s, "eng", "eng-pol");
    map_group(&s, "all-staff", "staff-pol");
    map_group(&s, "ops", "ops-pol");
    let r = login(&s, "alice", "Alice-Pass1!");
    let p = policies(ok(&r));
    // eng directly, all-staff through eng (in-chain rule).
    assert!(p.contains(&"eng-pol".into()), "{p:?}");
    assert!(p.contains(&"staff-pol".into()), "{p:?}");
    assert!(!p.contains(&"ops-pol".into()), "{p:?}");
    assert_eq!(r.body["auth"]["metadata"]["username"], "alice", "{r:?}");
    // userattr=sAMAccountName: the same bind, the alias is the account name.
    configure(&s, json!({"userattr": "sAMAccountName"}));
    let r = login(&s, "bob", "Bob-Pass1!");
    assert_eq!(policies(ok(&r)), ["default", "ops-pol"]);
    // A name with a space and a quote.
    let r = login(&s, "o'brien jr", "Obrien-Pass1!");
    assert!(policies(ok(&r)).contains(&"staff-pol".into()), "{r:?}");
    // Wrong password and unknown user: one answer.
    for (u, p) in [("alice", "wrong"), ("nobody", "Alice-Pass1!")] {
        let r = login(&s, u, p);
        assert_eq!((r.status, error(&r)), (400, BIND_FAILED.to_string()), "{u}");
    }
}

#[test]
fn discoverdn_with_a_service_account_and_member_of_groups() {
    let d = dc();
    let s = server_with(discover_config(d));
    map_group(&s, "eng", "eng-pol");
    map_group(&s, "all-staff", "staff-pol");
    let r = login(&s, "alice", "Alice-Pass1!");
    let p = policies(ok(&r));
    // The plain member filter: direct groups only.
    assert!(
        p.contains(&"eng-pol".into()) && !p.contains(&"staff-pol".into()),
        "{p:?}"
    );
    // memberOf on the user entry, as the reference's docs show it for AD.
    configure(
        &s,
        json!({
            "groupdn": USERS,
            "groupfilter": "(&(objectClass=user)(sAMAccountName={{.Username}}))",
            "groupattr": "memberOf",
        }),
    );
    let r = login(&s, "alice", "Alice-Pass1!");
    let p = policies(ok(&r));
    assert!(
        p.contains(&"eng-pol".into()) && !p.contains(&"staff-pol".into()),
        "{p:?}"
    );
    // The in-chain rule, from the domain root: AD answers the subtree search with search
    // references too (Configuration partition), which are skipped.
    configure(
        &s,
        json!({
            "groupdn": BASE,
            "groupfilter": "(&(objectClass=group)(member:1.2.840.113556.1.4.1941:={{.UserDN}}))",
            "groupattr": "cn",
            "userdn": BASE,
        }),
    );
    let r = login(&s, "alice", "Alice-Pass1!");
    let p = policies(ok(&r));
    assert!(
        p.contains(&"eng-pol".into()) && p.contains(&"staff-pol".into()),
        "{p:?}"
    );
    let r = login(&s, "bob", "wrong");
    assert_eq!((r.status, error(&r)), (400, BIND_FAILED.to_string()));
}

#[test]
fn token_groups_give_nested_groups() {
    let d = dc();
    let mut c = upn_config(d);
    c["use_token_groups"] = json!(true);
    c["groupfilter"] = json!("");
    let s = server_with(c);
    map_group(&s, "eng", "eng-pol");
    map_group(&s, "all-staff", "staff-pol");
    map_group(&s, "Domain Users", "du-pol");
    let r = login(&s, "alice", "Alice-Pass1!");
    let p = policies(ok(&r));
    for want in ["eng-pol", "staff-pol", "du-pol"] {
        assert!(
            p.contains(&want.into()),
            "{want}: {p:?} {}",
            groups_meta(&r)
        );
    }
    // With a service account (the token groups are read by it).
    let mut c = discover_config(d);
    c["use_token_groups"] = json!(true);
    configure(&s, c);
    let r = login(&s, "alice", "Alice-Pass1!");
    let p = policies(ok(&r));
    assert!(p.contains(&"staff-pol".into()), "{p:?}");
    let r = s.get("auth/ldap/config");
    assert_eq!(r.body["data"]["use_token_groups"], true, "{r:?}");
}

#[test]
fn case_sensitive_names_decide_how_groups_and_users_map() {
    let d = dc();
    // AD's names are case-insensitive: by default so are the mappings.
    let s = server_with(upn_config(d));
    map_group(&s, "ENG", "eng-pol");
    let r = login(&s, "ALICE", "Alice-Pass1!");
    assert!(policies(ok(&r)).contains(&"eng-pol".into()), "{r:?}");
    // case_sensitive_names: the mapping must be spelled as AD spells the group.
    let mut c = upn_config(d);
    c["case_sensitive_names"] = json!(true);
    let s = server_with(c);
    map_group(&s, "ENG", "eng-pol");
    let r = login(&s, "alice", "Alice-Pass1!");
    assert!(!policies(ok(&r)).contains(&"eng-pol".into()), "{r:?}");
    map_group(&s, "eng", "eng2-pol");
    let r = login(&s, "alice", "Alice-Pass1!");
    assert!(policies(ok(&r)).contains(&"eng2-pol".into()), "{r:?}");
}

#[test]
fn group_searches_page_through_many_groups() {
    let d = dc();
    let mut c = upn_config(d);
    c["max_page_size"] = json!(3);
    let s = server_with(c);
    for i in 0..20 {
        map_group(&s, &format!("grp-0{i:02}"), &format!("p{i}"));
    }
    let r = login(&s, "alice", "Alice-Pass1!");
    let p = policies(ok(&r));
    for i in 0..20 {
        assert!(p.contains(&format!("p{i}")), "p{i}: {p:?}");
    }
}

#[test]
fn null_binds_are_refused_by_cairn_and_by_ad() {
    let d = dc();
    let s = server_with(upn_config(d));
    let r = login(&s, "alice", "");
    assert_eq!(r.status, 400);
    assert!(
        error(&r).contains("password cannot be of zero length"),
        "{r:?}"
    );
    // Without deny_null_bind the empty password reaches AD, which refuses an
    // unauthenticated bind (it is not an anonymous login).
    configure(&s, json!({"deny_null_bind": false}));
    let r = login(&s, "alice", "");
    assert_eq!(
        (r.status, error(&r)),
        (400, BIND_FAILED.to_string()),
        "{r:?}"
    );
}

#[test]
fn starttls_and_ldaps_verify_the_certificate() {
    let d = dc();
    let mut c = upn_config(d);
    c["url"] = json!(d.get("AD_LDAP_URL"));
    c["starttls"] = json!(true);
    let s = server_with(c);
    map_group(&s, "eng", "eng-pol");
    assert!(policies(ok(&login(&s, "alice", "Alice-Pass1!"))).contains(&"eng-pol".into()));
    // A CA that did not sign the DC's certificate: refused, both ways.
    let other = d.file("AD_OTHER_CA");
    configure(&s, json!({"certificate": other}));
    let r = login(&s, "alice", "Alice-Pass1!");
    assert_eq!(r.status, 400, "{r:?}");
    assert!(error(&r).contains("TLS"), "{r:?}");
    configure(&s, json!({"url": d.get("AD_URL"), "starttls": false}));
    let r = login(&s, "alice", "Alice-Pass1!");
    assert_eq!(r.status, 400, "{r:?}");
    assert!(error(&r).contains("TLS"), "{r:?}");
    // The right CA over LDAPS again.
    configure(&s, json!({"certificate": d.ca()}));
    ok(&login(&s, "alice", "Alice-Pass1!"));
}

#[test]
fn ad_bind_refusals_answer_alike_and_log_their_reason() {
    let d = dc();
    let s = server_with(upn_config(d));
    // A file audit device: each refused login's response entry names the reason too.
    let audit_dir = cairn_tests::tmpdir("ad-audit");
    let audit_file = audit_dir.join("audit.log");
    let r = s.put(
        "sys/audit/file",
        json!({"type": "file", "options": {"file_path": audit_file.to_string_lossy()}}),
    );
    assert_eq!(r.status, 204, "{r:?}");
    let mut cases = vec![
        (
            "alice",
            "wrong",
            "invalid credentials (wrong password or unknown user) (AD data 52e)",
        ),
        ("carol", "Carol-Pass1!", "account disabled (AD data 533)"),
        (
            "dave",
            "Dave-Pass1!",
            "user must change password (AD data 773)",
        ),
        ("gina", "Gina-Pass1!", "account expired (AD data 701)"),
    ];
    // The password-expired user exists when the script had faketime.
    if d.get("AD_EXPIRED_USER") == "erin" {
        cases.push(("erin", "Erin-Pass1!", "password expired (AD data 532)"));
    }
    for (user, pw, reason) in cases {
        let r = login(&s, user, pw);
        // The client's answer is the reference's for a failed login, whatever the reason.
        assert_eq!(
            (r.status, &r.body),
            (400, &json!({ "errors": [BIND_FAILED] })),
            "{user}: {r:?}"
        );
        assert!(
            log_has(&s, &format!("ldap login of {user:?} on auth/"))
                && log_has(&s, &format!("the directory says: {reason}")),
            "{user}: no log line with {reason:?}:\n{}",
            server_log(&s)
        );
        // The audit response entry of that login has the reason after the client's error.
        let want = format!("{BIND_FAILED} (the directory says: {reason})");
        let path = format!("auth/ldap/login/{user}");
        let entries = audit_entries(&audit_file);
        let entry = entries
            .iter()
            .rev()
            .find(|e| e["type"] == "response" && e["request"]["path"] == json!(path))
            .unwrap_or_else(|| panic!("{user}: no audit response entry in {entries:?}"));
        assert_eq!(entry["error"], json!(want), "{user}: {entry}");
        assert_eq!(entry["response"]["status"], json!(400), "{user}: {entry}");
    }
    // Lockout: three wrong passwords (the domain's threshold), then the right one is
    // refused with 775; Cairn's own lockout (5 failures) has not kicked in.
    for _ in 0..3 {
        let r = login(&s, "frank", "wrong");
        assert_eq!((r.status, error(&r)), (400, BIND_FAILED.to_string()));
    }
    let r = login(&s, "frank", "Frank-Pass1!");
    assert_eq!(
        (r.status, error(&r)),
        (400, BIND_FAILED.to_string()),
        "{r:?}"
    );
    assert!(
        log_has(&s, "the directory says: account locked out (AD data 775)"),
        "{}",
        server_log(&s)
    );
    let entries = audit_entries(&audit_file);
    assert!(
        entries.iter().any(|e| e["type"] == "response"
            && e["error"]
                == json!(format!(
                    "{BIND_FAILED} (the directory says: account locked out (AD data 775))"
                ))),
        "no audit entry for the locked-out login"
    );
    // Never the password, in the log or the audit file.
    let log = server_log(&s);
    let audit = std::fs::read_to_string(&audit_file).unwrap_or_default();
    for pw in ["Carol-Pass1!", "Dave-Pass1!", "Gina-Pass1!", "Frank-Pass1!"] {
        assert!(!log.contains(pw), "{pw} in the server log");
        assert!(!audit.contains(pw), "{pw} in the audit file");
    }
}

/// Every entry of a file audit device so far.
fn audit_entries(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("audit line {l:?}: {e}")))
        .collect()
}
