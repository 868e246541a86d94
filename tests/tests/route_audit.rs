//! Route-by-route auth audit over real HTTP against the real binary, generated from the
//! router's own table (`cairn_core::routes::examples`: every route of the sys table, the
//! token table, the identity table and each mount type's table, with a concrete path), so a new route is covered
//! without touching this file.
//!
//! For every route, every method and the path written three ways (as is, with a trailing
//! slash, with a doubled leading slash): without a token, with malformed token headers
//! (carrying the root token where a lax parser would take it) and with a token whose policy
//! grants nothing there, the answer is 403 unless the route is on the documented
//! unauthenticated list below (also in SECURITY.md, checked here); sudo routes refuse a
//! token with every capability but sudo; every answer carries `Cache-Control: no-store`. On a
//! real DR secondary, the DR-protected operations refuse every token but a valid DR
//! operation token, and the cluster listener (TLS once the primary is enabled) refuses TLS
//! below 1.2.
//!
//! What `core/src/router.rs` `table_tests` check in process (storage unchanged by refused
//! requests, namespaces, the sudo matrix both ways) is not repeated here.

use cairn_core::routes::{self, Class, Example};
use cairn_tests::{cluster, note_secret, Server};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;

/// The routes answered without a client token, with what authorizes them instead: exactly
/// the table's `Public`, `Login` and `Proof` routes (checked below), and the list in
/// SECURITY.md ("Routes answered without a token"). As the reference: health, seal status,
/// leader, init/unseal and the key-share routes, logins, replication status, unwrap and
/// lookup of a wrapping token.
const UNAUTHENTICATED: &[(&str, &str)] = &[
    (
        "sys/init",
        "nothing secret: initialises an uninitialised server once",
    ),
    ("sys/unseal", "unseal key shares"),
    ("sys/seal-status", "public: nothing secret"),
    ("sys/health", "public: nothing secret"),
    ("sys/leader", "public: nothing secret"),
    ("sys/replication/status", "public: nothing secret"),
    ("sys/replication/+/status", "public: nothing secret"),
    (
        "sys/replication/dr/secondary/generate-operation-token/attempt",
        "unseal key shares",
    ),
    (
        "sys/replication/dr/secondary/generate-operation-token/update",
        "unseal key shares",
    ),
    (
        "sys/replication/dr/secondary/operation-token/delete",
        "the DR operation token",
    ),
    ("sys/generate-root/*", "unseal key shares"),
    ("sys/generate-root-token/*", "unseal key shares"),
    ("sys/wrapping/unwrap", "the wrapping token"),
    ("sys/wrapping/lookup", "the wrapping token"),
    (
        "auth/ldap/login/+",
        "a login: the directory checks the password",
    ),
];

/// The operations a DR secondary authorizes with the DR operation token in the body (a sudo
/// token elsewhere): the table's `DrSecondary` routes.
const DR_PROTECTED: &[&str] = &[
    "sys/replication/dr/secondary/promote",
    "sys/replication/dr/secondary/disable",
    "sys/replication/dr/secondary/update-primary",
    "sys/replication/dr/secondary/reindex",
    "sys/replication/dr/secondary/merkle-check",
];

const METHODS: [&str; 6] = ["GET", "LIST", "PUT", "POST", "DELETE", "PATCH"];

const ROOT: &str = "root-e2e";

fn needs_token(class: Class) -> bool {
    matches!(class, Class::Token | Class::Sudo | Class::DrSecondary)
}

/// An answer: status, headers (names lower-cased) and JSON body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Value,
}

fn call(
    agent: &ureq::Agent,
    addr: &str,
    method: &str,
    url_path: &str,
    headers: &[(&str, &[u8])],
    body: Option<&Value>,
) -> Answer {
    try_call(agent, addr, method, url_path, headers, body)
        .unwrap_or_else(|e| panic!("{method} {url_path}: no answer: {e}"))
}

/// [`call`]; an error when the server closed the connection without an answer.
fn try_call(
    agent: &ureq::Agent,
    addr: &str,
    method: &str,
    url_path: &str,
    headers: &[(&str, &[u8])],
    body: Option<&Value>,
) -> Result<Answer, ureq::Error> {
    let mut b = ureq::http::Request::builder()
        .method(method)
        .uri(format!("{addr}{url_path}"));
    for (k, v) in headers {
        b = b.header(
            *k,
            ureq::http::HeaderValue::from_bytes(v).expect("header value"),
        );
    }
    if method == "PATCH" {
        b = b.header("Content-Type", "application/merge-patch+json");
    }
    let data = body.map(|v| v.to_string().into_bytes()).unwrap_or_default();
    let mut r = agent.run(b.body(data).expect("request"))?;
    let status = r.status().as_u16();
    let headers = r
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_ascii_lowercase(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let text = r.body_mut().read_to_string().unwrap_or_default();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok(Answer {
        status,
        headers,
        body,
    })
}

#[track_caller]
fn assert_no_store(a: &Answer, what: &str) {
    assert!(
        a.headers
            .iter()
            .any(|(k, v)| k == "cache-control" && v == "no-store"),
        "{what}: no `Cache-Control: no-store` ({}): {:?}",
        a.status,
        a.headers
    );
}

/// The three ways the tests write a route's path in the URL.
fn spellings(path: &str) -> [String; 3] {
    [
        format!("/v1/{path}"),
        format!("/v1/{path}/"),
        format!("/v1//{path}"),
    ]
}

fn sets_of<'a>(it: impl Iterator<Item = &'a str>) -> BTreeSet<String> {
    it.map(str::to_string).collect()
}

/// The documented lists are exactly what the table declares, and SECURITY.md names them.
#[test]
fn the_documented_lists_are_the_tables() {
    let ex = routes::examples();
    assert_eq!(
        sets_of(
            ex.iter()
                .filter(|e| !needs_token(e.class))
                .map(|e| e.pattern.as_str())
        ),
        sets_of(UNAUTHENTICATED.iter().map(|(p, _)| *p)),
        "the routes declared without a token differ from the documented unauthenticated list \
         (update UNAUTHENTICATED here and SECURITY.md, or the route's class)"
    );
    assert_eq!(
        sets_of(
            ex.iter()
                .filter(|e| e.class == Class::DrSecondary)
                .map(|e| e.pattern.as_str())
        ),
        sets_of(DR_PROTECTED.iter().copied()),
    );
    let doc =
        std::fs::read_to_string(cairn_tests::repo_root().join("SECURITY.md")).expect("SECURITY.md");
    let section = doc
        .split("### Routes answered without a token")
        .nth(1)
        .expect("SECURITY.md: a \"### Routes answered without a token\" section");
    let section = section.split("\n#").next().unwrap_or_default();
    for (p, _) in UNAUTHENTICATED {
        assert!(
            section.contains(&format!("`{p}`")),
            "SECURITY.md does not list `{p}`"
        );
    }
    for p in DR_PROTECTED {
        assert!(
            doc.contains(&format!("`{p}`")),
            "SECURITY.md does not name `{p}`"
        );
    }
}

/// Enables, under the root token, every mount the examples call routes under.
fn ensure_mounts(s: &Server, ex: &[Example]) {
    let mut done = BTreeSet::new();
    for (auth, kind, at) in ex.iter().filter_map(|e| e.mount.clone()) {
        if !done.insert(at.clone()) {
            continue;
        }
        let (list, name) = if auth {
            ("sys/auth", at.trim_start_matches("auth/").to_string())
        } else {
            ("sys/mounts", at.clone())
        };
        let r = s.get(list);
        assert_eq!(r.status, 200, "{list}: {}", r.body);
        if r.body["data"].get(&name).is_some() {
            continue;
        }
        let r = s.post(
            &format!("{list}/{}", name.trim_end_matches('/')),
            json!({ "type": kind }),
        );
        assert!(
            r.status < 300,
            "enable {kind} at {at}: {} {}",
            r.status,
            r.body
        );
    }
}

/// A token carrying only a policy named `name` with `hcl` (no default policy).
fn token_with(s: &Server, name: &str, hcl: &str) -> String {
    let r = s.put(
        &format!("sys/policies/acl/{name}"),
        json!({ "policy": hcl }),
    );
    assert!(r.status < 300, "policy {name}: {}", r.body);
    let r = s.post(
        "auth/token/create",
        json!({"policies": [name], "no_default_policy": true}),
    );
    assert_eq!(r.status, 200, "token: {}", r.body);
    let t = r.body["auth"]["client_token"]
        .as_str()
        .expect("client_token")
        .to_string();
    note_secret(&t);
    t
}

#[test]
fn every_route_refuses_a_missing_malformed_or_powerless_token_over_http() {
    let s = Server::dev();
    let ex = routes::examples();
    ensure_mounts(&s, &ex);
    let nothing = token_with(
        &s,
        "nothing",
        r#"path "elsewhere/*" { capabilities = ["read"] }"#,
    );
    let no_sudo = token_with(
        &s,
        "no-sudo",
        r#"path "*" { capabilities = ["create", "read", "update", "delete", "list"] }"#,
    );
    let agent = cairn_tests::agent(Duration::from_secs(30));
    let root = ROOT.as_bytes();
    let bearer_lower = format!("bearer {ROOT}");
    let bearer_glued = format!("Bearer{ROOT}");
    let suffixed = format!("{ROOT}x");
    let mut non_ascii = root.to_vec();
    non_ascii.push(0xff);
    // Headers that carry no valid token. Each but the first holds the root token where a
    // lax parser would take it, or something close to it.
    let malformed: Vec<Vec<(&str, &[u8])>> = vec![
        vec![],
        vec![("X-Vault-Token", b"")],
        vec![("X-Vault-Token", b"   ")],
        vec![("Authorization", bearer_lower.as_bytes())],
        vec![("Authorization", bearer_glued.as_bytes())],
        vec![("Authorization", b"Basic cm9vdC1lMmU6")],
        vec![("X-Vault-Token", suffixed.as_bytes())],
        vec![("X-Vault-Token", &non_ascii)],
        vec![("X-Vault-Token", b"hvs.AAAAAAAAAAAAAAAAAAAAAAAA")],
        // An empty first header does not hide a bad second one.
        vec![("X-Vault-Token", b""), ("X-Vault-Token", b"nope")],
    ];
    let mut checked = 0usize;
    for e in &ex {
        for m in METHODS {
            for url in spellings(&e.path) {
                let what = |how: &str| format!("{m} {url} ({:?}, {}) {how}", e.class, e.pattern);
                if !needs_token(e.class) {
                    // Documented as answered without a token: whatever it answers, it is
                    // not the refusal for a missing token, and it is not a server error.
                    let a = call(&agent, &s.addr, m, &url, &[], None);
                    assert_no_store(&a, &what("without a token"));
                    assert!(
                        !a.body.to_string().contains("needs a token"),
                        "{}: {} {}",
                        what("without a token"),
                        a.status,
                        a.body
                    );
                    assert!(
                        a.status < 500,
                        "{}: {} {}",
                        what("without a token"),
                        a.status,
                        a.body
                    );
                    checked += 1;
                    continue;
                }
                for h in &malformed {
                    let how = format!("with headers {h:?}");
                    let a = match try_call(&agent, &s.addr, m, &url, h, None) {
                        Ok(a) => a,
                        Err(e) => panic!("{}: no answer: {e}", what(&how)),
                    };
                    // A token with a byte outside ASCII too: the HTTP layer accepts the value
                    // (as the reference's Go server does; it closed the connection without an
                    // answer), and no token has that name.
                    assert_eq!(a.status, 403, "{}: {}", what(&how), a.body);
                    assert_no_store(&a, &what(&how));
                    checked += 1;
                }
                let mut tokens = vec![("a token whose policy grants nothing here", &nothing)];
                if matches!(e.class, Class::Sudo | Class::DrSecondary) {
                    tokens.push(("a token with every capability but sudo", &no_sudo));
                }
                for (how, t) in tokens {
                    let a = call(
                        &agent,
                        &s.addr,
                        m,
                        &url,
                        &[("X-Vault-Token", t.as_bytes())],
                        None,
                    );
                    assert_eq!(a.status, 403, "{}: {}", what(how), a.body);
                    assert_eq!(
                        a.body,
                        json!({"errors": ["permission denied"]}),
                        "{}",
                        what(how)
                    );
                    assert_no_store(&a, &what(how));
                    checked += 1;
                }
            }
        }
    }
    eprintln!(
        "{} routes, {checked} refused or public calls checked",
        ex.len()
    );
    // The server is still unsealed and the root token still works: nothing above sealed it
    // or revoked anything.
    let r = s.get("auth/token/lookup-self");
    assert_eq!(r.status, 200, "{}", r.body);
    let r = s.call_as(None, "GET", "sys/seal-status", None);
    assert_eq!(r.body["sealed"], json!(false), "{}", r.body);
    // Answers with a body of another type (metrics text) or a secret carry it too.
    for (path, token) in [
        ("sys/metrics?format=prometheus", ROOT),
        ("auth/token/lookup-self", ROOT),
        ("secret/does-not-exist", ROOT),
        ("sys/health", ""),
    ] {
        let h: Vec<(&str, &[u8])> = if token.is_empty() {
            vec![]
        } else {
            vec![("X-Vault-Token", token.as_bytes())]
        };
        let a = call(&agent, &s.addr, "GET", &format!("/v1/{path}"), &h, None);
        assert_no_store(&a, path);
    }
    let a = call(
        &agent,
        &s.addr,
        "PUT",
        "/v1/secret/audit-kv",
        &[("X-Vault-Token", root)],
        Some(&json!({"v": "secret"})),
    );
    assert_eq!(a.status, 204);
    assert_no_store(&a, "a KV write");
}

/// On a real DR secondary: every DR-protected operation refuses no token, the primary's
/// root token (as client token and in the body), a malformed and a wrong DR operation token,
/// and is authorized by a valid one. The primary's cluster listener serves TLS 1.2+ only.
#[test]
fn dr_protected_operations_take_only_a_valid_dr_operation_token() {
    let ex: Vec<Example> = routes::examples()
        .into_iter()
        .filter(|e| e.class == Class::DrSecondary)
        .collect();
    assert!(!ex.is_empty());
    let p = cluster::licensed("audit-drp");
    let d = cluster::licensed("audit-drs");
    cluster::ok(
        200,
        p.post("sys/replication/dr/primary/enable", json!({})),
        "dr primary enable",
    );
    let tok = cluster::token(&p, "dr", "audit-dr");
    cluster::enable_secondary(&d, "dr", &tok);
    cluster::wait_for("the DR secondary to stream", 60, || {
        cluster::status(&d, "dr")["state"] == "stream-wals"
    });
    let dr_token = cluster::generate(
        &d,
        "sys/replication/dr/secondary/generate-operation-token",
        &p.unseal_keys,
    );
    let mode = || cluster::status(&d, "dr")["mode"].clone();
    let agent = cairn_tests::agent(Duration::from_secs(30));
    let root = p.root_token.clone();
    let bodies = [
        json!({}),
        json!({"dr_operation_token": ""}),
        json!({"dr_operation_token": root}),
        json!({"dr_operation_token": "cdr.0000000000000000000000000"}),
        json!({"dr_operation_token": 7}),
        json!({"dr_operation_token": format!("{dr_token}x")}),
    ];
    for e in &ex {
        for m in METHODS {
            for url in spellings(&e.path) {
                for body in &bodies {
                    for h in [vec![], vec![("X-Vault-Token", root.as_bytes())]] {
                        let write = matches!(m, "PUT" | "POST");
                        let a = call(&agent, &d.addr, m, &url, &h, write.then_some(body));
                        let what = format!("{m} {url} body {body} headers {h:?}");
                        // Writes are refused for the token; other methods are not operations
                        // (405) and never reach the token check.
                        if write {
                            assert_eq!(a.status, 403, "{what}: {}", a.body);
                        } else {
                            assert!(
                                matches!(a.status, 403 | 405),
                                "{what}: {} {}",
                                a.status,
                                a.body
                            );
                        }
                        assert_no_store(&a, &what);
                        assert_eq!(mode(), json!("secondary"), "{what}");
                    }
                }
            }
        }
    }
    // A valid DR operation token is authorized. The body makes the operations that would
    // change the cluster's role stop after the token check (promote: `force` not a boolean;
    // update-primary: both a token and addresses); `disable` has nothing to stop it, so it
    // goes last.
    let mut ordered: Vec<&Example> = ex.iter().collect();
    ordered.sort_by_key(|e| e.path.ends_with("/disable"));
    for e in ordered {
        let body = json!({
            "dr_operation_token": dr_token,
            "force": "not-a-boolean",
            "token": "x",
            "update_primary_addrs": ["127.0.0.1:1"],
        });
        let a = call(
            &agent,
            &d.addr,
            "POST",
            &format!("/v1/{}", e.path),
            &[],
            Some(&body),
        );
        assert_ne!(
            a.status, 403,
            "{} with a valid DR operation token: {}",
            e.path, a.body
        );
        assert!(a.status < 500, "{}: {} {}", e.path, a.status, a.body);
        if !e.path.ends_with("/disable") {
            assert_eq!(mode(), json!("secondary"), "{}", e.path);
        }
    }
    // The primary's cluster listener switched to TLS when DR replication was enabled on it.
    cairn_tests::tls_hello::assert_refuses_below_tls12(&format!("127.0.0.1:{}", p.port + 1));
}
