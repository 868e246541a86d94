//! End-to-end regression tests for the findings of a red-team review, on real `cairn`
//! processes: authorization decided by the route table (no-token writes to LDAP mappings
//! named `login`, sudo routes reached with a trailing slash, namespace administrators
//! reaching cluster-wide routes and root-namespace tokens, list and create checks), audit
//! devices that cannot brick the server, and LDAP logins that neither carry root nor tell
//! an unknown user from a wrong password by their timing.
//!
//! Every test asserts the specific status of the refused request and that nothing was
//! changed. The LDAP tests share one slapd (`scripts/dev-ldap.sh`, stopped when this process
//! exits); every test runs its own `cairn` dev server.

use cairn_tests::{note_secret, start_dev_ldap, tmpdir, Resp, Server};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const BASE: &str = "dc=cairn,dc=test";
const BINDPASS: &str = "reader-secret";

/// The sample directory's `export` lines (one slapd for the whole test binary).
fn directory() -> &'static BTreeMap<String, String> {
    static DIR: OnceLock<BTreeMap<String, String>> = OnceLock::new();
    DIR.get_or_init(|| start_dev_ldap("security"))
}

fn dir_get(k: &str) -> String {
    directory()
        .get(k)
        .cloned()
        .unwrap_or_else(|| panic!("dev-ldap.sh did not export {k}"))
}

/// Authenticated search against the sample directory, as in `ldap.rs`.
fn search_config() -> Value {
    json!({
        "url": dir_get("CAIRN_LDAP_URL"),
        "binddn": dir_get("CAIRN_LDAP_BINDDN"),
        "bindpass": BINDPASS,
        "userdn": format!("ou=people,{BASE}"),
        "userattr": "uid",
        "groupdn": format!("ou=groups,{BASE}"),
    })
}

fn configure_ldap(s: &Server, config: Value) {
    let r = s.post("auth/ldap/config", config.clone());
    assert!(
        r.status == 204,
        "config {config}: {} {}",
        r.status,
        r.errors()
    );
}

fn login(s: &Server, user: &str, password: &str) -> Resp {
    s.call_as(
        None,
        "POST",
        &format!("auth/ldap/login/{user}"),
        Some(json!({ "password": password })),
    )
}

fn error(r: &Resp) -> String {
    r.body["errors"][0].as_str().unwrap_or_default().to_string()
}

fn keys(r: &Resp) -> Vec<String> {
    r.body["data"]["keys"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|k| k.as_str().unwrap_or_default().to_string())
        .collect()
}

/// Stores policy `name` with `hcl` (root token) and returns a new token carrying it.
fn token_with(s: &Server, name: &str, hcl: &str) -> String {
    let r = s.put(
        &format!("sys/policies/acl/{name}"),
        json!({ "policy": hcl }),
    );
    assert_eq!(r.status, 204, "policy {name}: {r:?}");
    let r = s.post("auth/token/create", json!({ "policies": [name] }));
    assert_eq!(r.status, 200, "token with {name}: {r:?}");
    let t = r.body["auth"]["client_token"]
        .as_str()
        .expect("client_token")
        .to_string();
    note_secret(&t);
    t
}

fn assert_unsealed(s: &Server) {
    let r = s.get("sys/seal-status");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.body["sealed"],
        json!(false),
        "the server was sealed: {r:?}"
    );
}

/// A request in a namespace (`X-Vault-Namespace`), with `token`.
fn call_ns(s: &Server, ns: &str, token: &str, method: &str, path: &str, body: Value) -> Resp {
    let data = if body.is_null() {
        Vec::new()
    } else {
        serde_json::to_vec(&body).expect("json")
    };
    s.raw(
        method,
        &format!("/v1/{path}"),
        &[("X-Vault-Token", token), ("X-Vault-Namespace", ns)],
        data,
    )
}

/// Critical: `users/login` and `groups/login` are mappings, not login routes. Without a
/// token they can be neither written nor read (a mapping `login` → root would otherwise be
/// written by anyone); and even a root-mapped directory user gets no root token.
#[test]
fn no_token_cannot_touch_ldap_mappings_named_login() {
    let s = Server::dev();
    let root_body = json!({"policies": "root"});
    for (method, path, body) in [
        ("PUT", "auth/ldap/users/login", Some(root_body.clone())),
        ("PUT", "auth/ldap/groups/login", Some(root_body.clone())),
        ("PUT", "auth/ldap/users/x/login", Some(root_body)),
        ("GET", "auth/ldap/users/login", None),
        ("DELETE", "auth/ldap/users/login", None),
        ("LIST", "auth/ldap/users", None),
    ] {
        let r = s.call_as(None, method, path, body);
        assert_eq!(r.status, 403, "{method} {path} without a token: {r:?}");
    }
    // Nothing was written.
    let r = s.get("auth/ldap/users/login");
    assert_eq!(r.status, 404, "{r:?}");
    let r = s.get("auth/ldap/groups/login");
    assert_eq!(r.status, 404, "{r:?}");
    let r = s.list("auth/ldap/users");
    assert!(
        !keys(&r).iter().any(|k| k.contains("login")),
        "a mapping named login exists: {r:?}"
    );

    // A directory user mapped to root logs in to nothing.
    configure_ldap(&s, search_config());
    let r = s.post("auth/ldap/users/alice", json!({"policies": "root"}));
    assert_eq!(r.status, 204, "{r:?}");
    let r = login(&s, "alice", "alice-pw");
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(error(&r), "auth methods cannot create root tokens");
    assert!(r.body.get("auth").is_none_or(Value::is_null), "{r:?}");
}

/// Critical: a device whose file cannot be opened is refused and never stored; a device
/// that breaks later refuses audited requests (fail closed) but leaves health, seal status
/// and its own removal working.
#[test]
fn a_bad_audit_device_does_not_brick_the_server() {
    let s = Server::dev();
    let r = s.put(
        "sys/audit/bad",
        json!({"type": "file", "options": {"file_path": "/nonexistent-dir-xyz/a.log"}}),
    );
    assert_eq!(r.status, 400, "{r:?}");
    let r = s.get("sys/audit");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["data"], json!({}), "a device was stored: {r:?}");
    assert_eq!(s.get("sys/health").status, 200);
    assert_eq!(s.put("secret/a", json!({"v": 1})).status, 204);

    // A working device records requests.
    let dir = tmpdir("audit");
    let log = dir.join("audit.log");
    let r = s.put(
        "sys/audit/file1",
        json!({"type": "file", "options": {"file_path": log.to_str().expect("utf-8 path")}}),
    );
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(s.put("secret/b", json!({"v": 2})).status, 204);
    let text = std::fs::read_to_string(&log).expect("audit.log");
    assert!(text.lines().count() >= 2, "no audit lines: {text:?}");
    assert!(
        !text.contains("root-e2e"),
        "the root token in clear: {text}"
    );

    // Break it: a directory where the file was (appending fails even as root).
    std::fs::remove_file(&log).expect("rm audit.log");
    std::fs::create_dir(&log).expect("mkdir audit.log");
    let r = s.put("secret/c", json!({"v": 3}));
    assert_eq!(r.status, 500, "a write no device recorded: {r:?}");
    // Health and seal status answer (never audited) while the device is broken.
    let r = s.get("sys/health");
    assert_eq!(r.status, 200, "{r:?}");
    let r = s.get("sys/seal-status");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["sealed"], json!(false));
    // The root token removes the device (best-effort audit).
    let r = s.delete("sys/audit/file1");
    assert_eq!(r.status, 204, "removing the broken device: {r:?}");
    assert_eq!(s.get("sys/audit").body["data"], json!({}));
    // Serving again; the refused write was not stored.
    assert_eq!(s.put("secret/d", json!({"v": 4})).status, 204);
    let r = s.get("secret/c");
    assert_eq!(r.status, 404, "the refused write was stored: {r:?}");
    assert_eq!(s.get("secret/d").body["data"]["v"], json!(4));
}

/// `sys/seal/`, `//sys/seal` and other spellings of a sudo route are that route: they need
/// sudo too.
#[test]
fn sudo_routes_with_trailing_slash_need_sudo() {
    let s = Server::dev();
    let t = token_with(
        &s,
        "sys-nosudo",
        r#"path "sys/*" { capabilities = ["create","read","update","delete","list"] }"#,
    );
    // Spellings of `sys/seal` are that route (403); malformed paths are refused (400).
    for (path, want) in [
        ("/v1/sys/seal", 403),
        ("/v1/sys/seal/", 403),
        ("/v1/sys/seal//", 403),
        ("/v1//sys/seal", 403),
        ("/v1//sys/seal/", 403),
        ("/v1/sys/seal%2F", 403),
        ("/v1/sys%2Fseal", 403),
        ("/v1/sys/%73eal", 403),
        ("/v1/sys//seal", 400),
        ("/v1/sys/./seal", 400),
        ("/v1/sys/seal/.", 400),
    ] {
        for method in ["PUT", "POST"] {
            let r = s.raw(method, path, &[("X-Vault-Token", t.as_str())], vec![]);
            assert_eq!(r.status, want, "{method} {path} without sudo: {r:?}");
            assert_unsealed(&s);
        }
    }
    // Another sudo route, by the same spellings.
    for path in ["sys/auth/x", "sys/auth/x/"] {
        let r = s.call_as(Some(&t), "POST", path, Some(json!({"type": "ldap"})));
        assert_eq!(r.status, 403, "POST {path} without sudo: {r:?}");
    }
    assert!(s.get("sys/auth").body["data"].get("x/").is_none());
    assert_unsealed(&s);
}

/// A namespace administrator (every capability with sudo on `*` in its namespace) reaches
/// neither cluster-wide routes nor tokens and mounts of the root namespace.
#[test]
fn namespace_admin_is_held_to_its_namespace() {
    let s = Server::dev();
    let root = s.root_token.clone();
    let r = s.put("sys/namespaces/ns1", json!({}));
    assert!(r.status == 200, "create ns1: {r:?}");
    let admin = r#"path "*" { capabilities = ["create","read","update","delete","list","sudo"] }"#;
    let r = call_ns(
        &s,
        "ns1",
        &root,
        "PUT",
        "sys/policies/acl/admin",
        json!({ "policy": admin }),
    );
    assert_eq!(r.status, 204, "{r:?}");
    let r = call_ns(
        &s,
        "ns1",
        &root,
        "POST",
        "auth/token/create",
        json!({"policies": ["admin"]}),
    );
    assert_eq!(r.status, 200, "{r:?}");
    let t = r.body["auth"]["client_token"]
        .as_str()
        .expect("client_token")
        .to_string();
    note_secret(&t);
    // The token works in its namespace.
    let r = call_ns(&s, "ns1", &t, "GET", "auth/token/lookup-self", Value::Null);
    assert_eq!(r.status, 200, "{r:?}");

    let root_me = s.get("auth/token/lookup-self");
    assert_eq!(root_me.status, 200);
    let root_accessor = root_me.body["data"]["accessor"]
        .as_str()
        .expect("root accessor")
        .to_string();
    let ldap_accessor = s.get("sys/auth").body["data"]["ldap/"]["accessor"]
        .as_str()
        .expect("ldap accessor")
        .to_string();

    // Cluster-wide routes: root namespace only.
    let r = call_ns(&s, "ns1", &t, "PUT", "sys/seal", Value::Null);
    assert_eq!(r.status, 400, "{r:?}");
    assert_unsealed(&s);
    let r = s.raw(
        "PUT",
        "/v1/ns1/sys/seal",
        &[("X-Vault-Token", t.as_str())],
        vec![],
    );
    assert_eq!(r.status, 400, "{r:?}");
    assert_unsealed(&s);
    let r = call_ns(
        &s,
        "ns1",
        &t,
        "PUT",
        "sys/audit/x",
        json!({"type": "file", "options": {"file_path": "/tmp/x.log"}}),
    );
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(s.get("sys/audit").body["data"], json!({}));
    let r = call_ns(
        &s,
        "ns1",
        &t,
        "POST",
        "sys/audit-hash/x",
        json!({"input": "a"}),
    );
    assert_eq!(r.status, 400, "{r:?}");

    // Root-namespace tokens are invisible from ns1.
    let r = call_ns(
        &s,
        "ns1",
        &t,
        "POST",
        "auth/token/lookup",
        json!({ "token": root }),
    );
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(error(&r), "bad token");
    let r = call_ns(&s, "ns1", &t, "LIST", "auth/token/accessors", Value::Null);
    assert!(
        !keys(&r).contains(&root_accessor),
        "the root token's accessor listed in ns1: {r:?}"
    );
    let r = call_ns(
        &s,
        "ns1",
        &t,
        "POST",
        "auth/token/revoke",
        json!({ "token": root }),
    );
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(
        s.get("auth/token/lookup-self").status,
        200,
        "the root token was revoked from ns1"
    );
    let r = call_ns(
        &s,
        "ns1",
        &t,
        "POST",
        &format!("sys/locked-users/{ldap_accessor}/unlock/alice"),
        json!({}),
    );
    assert_eq!(r.status, 400, "{r:?}");
    let r = call_ns(
        &s,
        "ns1",
        &t,
        "POST",
        "sys/capabilities",
        json!({"token": root, "path": "x"}),
    );
    assert_eq!(r.status, 400, "{r:?}");

    // Without the namespace the token is in the root namespace's paths: nothing.
    assert_eq!(s.put("secret/a", json!({"v": "root"})).status, 204);
    let r = s.call_as(Some(&t), "GET", "secret/a", None);
    assert_eq!(r.status, 403, "{r:?}");
    let r = s.call_as(Some(&t), "PUT", "secret/a", Some(json!({"v": "ns1"})));
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(s.get("secret/a").body["data"]["v"], json!("root"));
    let r = s.call_as(Some(&t), "GET", "sys/auth", None);
    assert_eq!(r.status, 403, "{r:?}");
    assert_unsealed(&s);
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// A TCP proxy to `upstream` (`host:port`) that holds every chunk the client sends for
/// `delay` before passing it on: each LDAP round trip through it costs at least `delay`.
/// Returns its `ldap://` URL; it serves until this process exits.
fn slow_proxy(upstream: &str, delay: Duration) -> String {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
    let port = listener.local_addr().expect("proxy addr").port();
    let upstream = upstream.to_string();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { continue };
            let Ok(server) = TcpStream::connect(&upstream) else {
                continue;
            };
            let (mut c_in, mut s_out) = (client, server);
            let (Ok(mut c_out), Ok(mut s_in)) = (c_in.try_clone(), s_out.try_clone()) else {
                continue;
            };
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                while let Ok(n) = c_in.read(&mut buf) {
                    std::thread::sleep(delay);
                    if n == 0 || s_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = s_out.shutdown(Shutdown::Both);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s_in, &mut c_out);
                let _ = c_out.shutdown(Shutdown::Both);
            });
        }
    });
    format!("ldap://127.0.0.1:{port}")
}

/// An unknown user costs a bind like a wrong password does (a dummy bind), so timing does
/// not tell which names exist; the answers are identical.
///
/// On loopback a directory round trip is a small part of a login's time (HTTP, the
/// server's own work), so skipping the bind would hardly show. The directory is reached
/// through a proxy that delays every request by `DELAY`: a wrong password costs two round
/// trips (search, bind; the service connection is pooled), an unknown user without the
/// dummy bind one, so the medians would differ by a whole `DELAY` (a ratio of about 0.5,
/// against about 1 with the dummy bind; measured while writing this test). Both bounds
/// below sit halfway.
#[test]
fn unknown_user_costs_the_same_as_a_wrong_password() {
    const DELAY: Duration = Duration::from_millis(40);
    let s = Server::dev();
    let url = dir_get("CAIRN_LDAP_URL");
    let upstream = url
        .strip_prefix("ldap://")
        .unwrap_or_else(|| panic!("not an ldap:// URL: {url}"))
        .trim_end_matches('/');
    let mut c = search_config();
    c["url"] = json!(slow_proxy(upstream, DELAY));
    c["user_lockout_disable"] = json!(true);
    configure_ldap(&s, c);
    // Warm up: connections are opened, bound and pooled.
    let unknown = login(&s, "nobody-here", "wrong");
    let wrong = login(&s, "alice", "wrong");
    assert_eq!(unknown.status, 400, "{unknown:?}");
    assert_eq!(wrong.status, 400, "{wrong:?}");
    assert_eq!(unknown.body["errors"], wrong.body["errors"]);

    let (mut t_unknown, mut t_wrong) = (Vec::new(), Vec::new());
    for i in 0..30 {
        let at = Instant::now();
        let u = login(&s, &format!("nobody-{i}"), "wrong");
        t_unknown.push(at.elapsed());
        let at = Instant::now();
        let w = login(&s, "alice", &format!("wrong-{i}"));
        t_wrong.push(at.elapsed());
        assert_eq!((u.status, w.status), (400, 400), "{u:?} {w:?}");
        assert_eq!(u.body["errors"], w.body["errors"], "{u:?} {w:?}");
        assert!(u.body.get("auth").is_none_or(Value::is_null), "{u:?}");
    }
    let (mu, mw) = (median(t_unknown), median(t_wrong));
    eprintln!("median login: unknown user {mu:?}, wrong password {mw:?}");
    assert!(
        mu.as_secs_f64() >= 0.75 * mw.as_secs_f64(),
        "an unknown user answers much faster ({mu:?}) than a wrong password ({mw:?})"
    );
    // Without the dummy bind the unknown user would be a whole DELAY faster.
    assert!(
        mu + DELAY / 2 >= mw,
        "an unknown user answers a directory round trip faster ({mu:?}) than a wrong \
         password ({mw:?}): no bind is made for unknown users"
    );
}

/// A list is checked on the directory: `LIST secret/priv` is governed by `secret/priv/*`.
#[test]
fn list_without_trailing_slash_is_checked_on_the_directory() {
    let s = Server::dev();
    let t = token_with(
        &s,
        "list-priv",
        r#"path "secret/*" { capabilities = ["list","read","create","update"] }
path "secret/priv/*" { capabilities = ["deny"] }"#,
    );
    assert_eq!(s.put("secret/priv/a", json!({"v": 1})).status, 204);
    for path in ["secret/priv", "secret/priv/"] {
        let r = s.call_as(Some(&t), "LIST", path, None);
        assert_eq!(r.status, 403, "LIST {path}: {r:?}");
        let r = s.call_as(Some(&t), "GET", &format!("{path}?list=true"), None);
        assert_eq!(r.status, 403, "GET {path}?list=true: {r:?}");
    }
    let r = s.call_as(Some(&t), "LIST", "secret/", None);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(keys(&r), ["priv/"]);
}

/// `update` does not create: a write to a path that does not exist needs `create`.
#[test]
fn update_does_not_stand_in_for_create() {
    let s = Server::dev();
    let t = token_with(
        &s,
        "update-only",
        r#"path "secret/u/*" { capabilities = ["update","read"] }"#,
    );
    let r = s.call_as(Some(&t), "PUT", "secret/u/new", Some(json!({"v": 1})));
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(s.get("secret/u/new").status, 404, "created without create");
    assert_eq!(s.put("secret/u/old", json!({"v": 1})).status, 204);
    let r = s.call_as(Some(&t), "PUT", "secret/u/old", Some(json!({"v": 2})));
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(s.get("secret/u/old").body["data"]["v"], json!(2));
}

/// Orphan and periodic tokens need sudo (or root).
#[test]
fn create_orphan_and_periodic_tokens_need_sudo() {
    let s = Server::dev();
    let t = token_with(
        &s,
        "token-nosudo",
        r#"path "auth/token/*" { capabilities = ["create","update","read"] }"#,
    );
    let before = keys(&s.list("auth/token/accessors")).len();
    let r = s.call_as(
        Some(&t),
        "POST",
        "auth/token/create-orphan",
        Some(json!({})),
    );
    assert_eq!(r.status, 403, "{r:?}");
    let r = s.call_as(
        Some(&t),
        "POST",
        "auth/token/create",
        Some(json!({"period": "87600h"})),
    );
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.body.get("auth").is_none_or(Value::is_null), "{r:?}");
    assert_eq!(
        keys(&s.list("auth/token/accessors")).len(),
        before,
        "a token was created"
    );

    // Root can do both.
    let r = s.post("auth/token/create-orphan", json!({}));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["auth"]["orphan"], json!(true), "{r:?}");
    let r = s.post("auth/token/create", json!({"period": "87600h"}));
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.body["auth"]["lease_duration"].as_u64().unwrap_or(0) > 0,
        "{r:?}"
    );
}
