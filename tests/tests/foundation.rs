//! End-to-end tests of the foundation against real `cairn` processes: seal, tokens, ACL,
//! wrapping, errors, KV, restart, and durability under `kill -9`.

use cairn_tests::{tmpdir, Server};
use serde_json::json;

#[test]
fn init_unseal_restart_keeps_data_and_comes_back_sealed() {
    let dir = tmpdir("restart");
    let mut s = Server::start(&dir, "");
    let r = s.get("sys/seal-status");
    assert_eq!(r.body["initialized"], json!(false));
    s.init_unseal(5, 3);
    let r = s.get("sys/seal-status");
    assert_eq!(
        (
            r.body["sealed"].clone(),
            r.body["t"].clone(),
            r.body["n"].clone()
        ),
        (json!(false), json!(3), json!(5))
    );
    assert_eq!(s.post("sys/mounts/kv", json!({"type": "kv"})).status, 204);
    assert_eq!(s.put("kv/a", json!({"v": "one"})).status, 204);
    s.kill9();
    // The same directory and port; the root token and the key shares are kept.
    s.restart();
    // Sealed after restart: 503 for ordinary requests, seal endpoints still answer.
    let r = s.get("kv/a");
    assert_eq!(r.status, 503, "{:?}", r.body);
    assert!(r.errors().contains("sealed"));
    assert_eq!(s.get("sys/health").status, 503);
    // A wrong share resets nothing silently: three good shares unseal.
    s.unseal();
    let r = s.get("kv/a");
    assert_eq!(r.status, 200);
    assert_eq!(r.body["data"]["v"], json!("one"));
    // Values are encrypted at rest.
    let db = std::fs::read(dir.join("cairn.db")).unwrap_or_default();
    let wal = std::fs::read(dir.join("cairn.db-wal")).unwrap_or_default();
    let hay = [db, wal].concat();
    assert!(
        !hay.windows(3).any(|w| w == b"one"),
        "plaintext value found in SQLite files"
    );
}

#[test]
fn limited_policy_token_403_outside_200_inside() {
    let s = Server::dev();
    let pol = r#"path "secret/app/*" { capabilities = ["create", "read", "update", "list"] }"#;
    assert_eq!(
        s.put("sys/policies/acl/app", json!({ "policy": pol }))
            .status,
        204
    );
    let r = s.post(
        "auth/token/create",
        json!({"policies": ["app"], "ttl": "10m"}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    let t = r.body["auth"]["client_token"].as_str().unwrap().to_string();
    assert_eq!(r.body["auth"]["policies"], json!(["app", "default"]));
    let t = Some(t.as_str());
    assert_eq!(
        s.call_as(t, "PUT", "secret/app/x", Some(json!({"k": 1})))
            .status,
        204
    );
    assert_eq!(s.call_as(t, "GET", "secret/app/x", None).status, 200);
    let denied = s.call_as(t, "GET", "secret/other", None);
    assert_eq!(denied.status, 403);
    assert!(denied.errors().contains("permission denied"));
    assert_eq!(
        s.call_as(
            t,
            "PUT",
            "sys/policies/acl/app",
            Some(json!({"policy": ""}))
        )
        .status,
        403
    );
    assert_eq!(
        s.call_as(Some("not-a-token"), "GET", "secret/app/x", None)
            .status,
        403
    );
    assert_eq!(s.call_as(None, "GET", "secret/app/x", None).status, 403);
    // lookup-self works with the default policy; revoke-self ends the token.
    assert_eq!(
        s.call_as(t, "GET", "auth/token/lookup-self", None).body["data"]["policies"],
        json!(["app", "default"])
    );
    assert_eq!(
        s.call_as(t, "POST", "auth/token/revoke-self", None).status,
        204
    );
    assert_eq!(s.call_as(t, "GET", "secret/app/x", None).status, 403);
}

#[test]
fn wrapped_response_unwraps_once_then_fails() {
    let s = Server::dev();
    assert_eq!(s.put("secret/w", json!({"hello": "world"})).status, 204);
    let r = s.raw(
        "GET",
        "/v1/secret/w",
        &[("X-Vault-Token", "root-e2e"), ("X-Vault-Wrap-TTL", "60s")],
        vec![],
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.body["data"], json!(null));
    let wt = r.body["wrap_info"]["token"].as_str().unwrap().to_string();
    assert_eq!(r.body["wrap_info"]["ttl"], json!(60));
    let look = s.call_as(
        None,
        "POST",
        "sys/wrapping/lookup",
        Some(json!({ "token": wt })),
    );
    assert_eq!(look.body["data"]["creation_path"], json!("secret/w"));
    let u = s.call_as(Some(&wt), "POST", "sys/wrapping/unwrap", None);
    assert_eq!(u.status, 200, "{:?}", u.body);
    assert_eq!(u.body["data"]["hello"], json!("world"));
    let again = s.call_as(Some(&wt), "POST", "sys/wrapping/unwrap", None);
    assert_eq!(again.status, 400);
    // The wrapping token grants nothing else.
    assert_eq!(s.call_as(Some(&wt), "GET", "secret/w", None).status, 403);
}

#[test]
fn errors_have_the_envelope_and_the_right_codes() {
    let s = Server::dev();
    let bad = s.raw(
        "PUT",
        "/v1/secret/x",
        &[("X-Vault-Token", "root-e2e")],
        b"{not json".to_vec(),
    );
    assert_eq!(bad.status, 400);
    assert!(bad.errors().contains("JSON"), "{:?}", bad.body);
    let nf = s.get("nosuchmount/x");
    assert_eq!(nf.status, 404);
    assert!(nf.body["errors"].is_array());
    assert_eq!(s.raw("GET", "/nope", &[], vec![]).status, 404);
    assert_eq!(
        s.raw(
            "PATCH",
            "/v1/secret/x",
            &[
                ("X-Vault-Token", "root-e2e"),
                ("Content-Type", "application/merge-patch+json")
            ],
            b"{}".to_vec()
        )
        .status,
        405
    );
    // A PATCH that is not a JSON merge patch is refused before anything else, as the
    // reference refuses it.
    let r = s.raw(
        "PATCH",
        "/v1/secret/x",
        &[("Content-Type", "application/json")],
        b"{}".to_vec(),
    );
    assert_eq!(r.status, 415, "{:?}", r.body);
    assert!(r.errors().contains("merge-patch"), "{:?}", r.body);
    assert_eq!(s.get("secret/missing").status, 404);
    let bad_mount = s.post("sys/mounts/x", json!({"type": "nosuch"}));
    assert_eq!(bad_mount.status, 400);
    assert!(bad_mount.errors().contains("type"));
    let bad_policy = s.put(
        "sys/policies/acl/p",
        json!({"policy": "path \"a\" { capabilities = [\"fly\"] }"}),
    );
    assert_eq!(bad_policy.status, 400);
    assert!(bad_policy.errors().contains("fly"));
    // A body over the 32 MiB default is refused from its Content-Length, before it is read.
    use std::io::{Read, Write};
    let mut sock = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    write!(sock, "PUT /v1/secret/big HTTP/1.1\r\nHost: x\r\nX-Vault-Token: root-e2e\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", 33 * 1024 * 1024).unwrap();
    sock.write_all(&[b'a'; 4096]).unwrap();
    let mut head = [0u8; 12];
    sock.read_exact(&mut head).unwrap();
    assert_eq!(&head[9..12], b"413");
    // Bearer auth works like X-Vault-Token.
    assert_eq!(
        s.raw(
            "GET",
            "/v1/auth/token/lookup-self",
            &[("Authorization", "Bearer root-e2e")],
            vec![]
        )
        .status,
        200
    );
}

/// Sends `bytes` on a new connection to `port` and reads until the server closes it (or 5 s
/// pass). Returns what was read and whether the server closed the connection.
fn raw_exchange(port: u16, bytes: &[u8]) -> (String, bool) {
    use std::io::{Read, Write};
    let mut sock = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    sock.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("read timeout");
    sock.write_all(bytes).expect("send");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match sock.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

/// The JSON body of the one answer in `got`.
fn answer_body(got: &str) -> serde_json::Value {
    let body = got.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {got}"))
}

#[test]
fn ambiguous_framing_is_refused_and_a_smuggled_request_never_runs() {
    let s = Server::dev();
    // Two differing Content-Lengths: a reader of the first takes `{}` as the body and the
    // rest as a second request, writing secret/smuggled with the root token.
    let smuggled = "PUT /v1/secret/smuggled HTTP/1.1\r\nHost: x\r\nX-Vault-Token: root-e2e\r\n\
                    Content-Length: 9\r\n\r\n{\"a\":\"b\"}";
    let body = format!("{{}}{smuggled}");
    let (got, closed) = raw_exchange(
        s.port,
        format!(
            "PUT /v1/secret/outer HTTP/1.1\r\nHost: x\r\nX-Vault-Token: root-e2e\r\n\
             Content-Length: 2\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    // Neither request ran.
    assert_eq!(s.get("secret/smuggled").status, 404, "smuggled request ran");
    assert_eq!(s.get("secret/outer").status, 404, "refused request ran");
    assert!(got.starts_with("HTTP/1.1 400 "), "{got}");
    assert_eq!(
        got.matches("HTTP/1.1 ").count(),
        1,
        "one answer only: {got}"
    );
    assert!(got.contains("Connection: close\r\n"), "{got}");
    assert!(closed, "the server kept the connection open: {got}");
    assert_eq!(
        answer_body(&got),
        json!({"errors": ["request has 2 Content-Length headers; send exactly one"]})
    );

    // A Content-Length with a sign.
    let (got, closed) = raw_exchange(
        s.port,
        b"PUT /v1/secret/plus HTTP/1.1\r\nHost: x\r\nX-Vault-Token: root-e2e\r\n\
          Content-Length: +5\r\n\r\n{\"a\":1}",
    );
    assert!(got.starts_with("HTTP/1.1 400 "), "{got}");
    assert!(closed && got.contains("Connection: close\r\n"), "{got}");
    assert!(
        answer_body(&got)["errors"][0]
            .as_str()
            .is_some_and(|m| m.contains("Content-Length \"+5\"")),
        "{got}"
    );
    assert_eq!(s.get("secret/plus").status, 404);

    // Content-Length with Transfer-Encoding.
    let (got, closed) = raw_exchange(
        s.port,
        b"PUT /v1/secret/clte HTTP/1.1\r\nHost: x\r\nX-Vault-Token: root-e2e\r\n\
          Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n7\r\n{\"a\":1}\r\n0\r\n\r\n",
    );
    assert!(got.starts_with("HTTP/1.1 400 "), "{got}");
    assert!(closed && got.contains("Connection: close\r\n"), "{got}");
    assert!(
        got.contains("both Content-Length and Transfer-Encoding"),
        "{got}"
    );
    assert_eq!(s.get("secret/clte").status, 404);

    // A bare LF in a header line: a front end that ends lines there reads a Content-Length
    // and forwards the smuggled write as this request's body; here the head is malformed
    // (a control character), refused and the connection closed (tiny_http read one header,
    // no body, and then the smuggled write as a request of its own).
    let smuggled = "PUT /v1/secret/lf HTTP/1.1\r\nHost: x\r\nX-Vault-Token: root-e2e\r\n\
                    Content-Length: 9\r\n\r\n{\"a\":\"b\"}";
    let (got, closed) = raw_exchange(
        s.port,
        format!(
            "GET /v1/sys/health HTTP/1.1\r\nHost: x\r\nX-A: a\nContent-Length: {}\r\n\r\n\
             {smuggled}",
            smuggled.len()
        )
        .as_bytes(),
    );
    assert!(got.starts_with("HTTP/1.1 400 "), "{got}");
    assert!(closed && got.contains("Connection: close\r\n"), "{got}");
    assert_eq!(
        got.matches("HTTP/1.1 ").count(),
        1,
        "one answer only: {got}"
    );
    assert!(
        answer_body(&got)["errors"][0]
            .as_str()
            .is_some_and(|m| m.contains("control character")),
        "{got}"
    );
    assert_eq!(s.get("secret/lf").status, 404, "smuggled request ran");

    // The cluster listener (the next port) checks the same way.
    let (got, closed) = raw_exchange(
        s.port + 1,
        b"POST /v1/cluster/replication HTTP/1.1\r\nHost: x\r\n\
          Content-Length: 1\r\nContent-Length: 1\r\n\r\nx",
    );
    assert!(got.starts_with("HTTP/1.1 400 "), "{got}");
    assert!(closed && got.contains("send exactly one"), "{got}");

    // Well-framed requests, chunked included, are served as before.
    let (got, _) = raw_exchange(
        s.port,
        b"PUT /v1/secret/chunked HTTP/1.1\r\nHost: x\r\nX-Vault-Token: root-e2e\r\n\
          Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n7\r\n{\"a\":1}\r\n0\r\n\r\n",
    );
    assert!(got.starts_with("HTTP/1.1 204 "), "{got}");
    assert_eq!(s.get("secret/chunked").body["data"]["a"], json!(1));
}

#[test]
fn kv_round_trip_and_list() {
    let s = Server::dev();
    for k in ["a", "b", "dir/c", "dir/d/e"] {
        assert_eq!(s.put(&format!("secret/{k}"), json!({"k": k})).status, 204);
    }
    assert_eq!(s.get("secret/dir/c").body["data"]["k"], json!("dir/c"));
    assert_eq!(
        s.list("secret/").body["data"]["keys"],
        json!(["a", "b", "dir/"])
    );
    assert_eq!(
        s.get("secret/dir?list=true").body["data"]["keys"],
        json!(["c", "d/"])
    );
    assert_eq!(s.delete("secret/a").status, 204);
    assert_eq!(s.get("secret/a").status, 404);
    assert_eq!(s.list("secret/empty/").status, 404);
    let mounts = s.get("sys/mounts");
    assert_eq!(mounts.body["data"]["secret/"]["type"], json!("kv"));
    let auths = s.get("sys/auth");
    assert_eq!(auths.body["data"]["ldap/"]["type"], json!("ldap"));
}

#[test]
fn kill9_during_acknowledged_writes_loses_none() {
    let dir = tmpdir("kill9");
    let mut s = Server::start(&dir, "");
    s.init_unseal(1, 1);
    assert_eq!(s.post("sys/mounts/kv", json!({"type": "kv"})).status, 204);
    let root = s.root_token.clone();
    let addr = s.addr.clone();
    // Four writers stream writes; each records only writes acknowledged with 204.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut handles = Vec::new();
    for w in 0..4 {
        let (addr, root, stop) = (addr.clone(), root.clone(), stop.clone());
        handles.push(std::thread::spawn(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(std::time::Duration::from_secs(5)))
                .build()
                .into();
            let mut acked = Vec::new();
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = agent
                    .put(&format!("{addr}/v1/kv/w{w}/{i}"))
                    .header("X-Vault-Token", &root)
                    .send_json(json!({"i": i}));
                match r {
                    Ok(resp) if resp.status().as_u16() == 204 => acked.push(i),
                    _ => break,
                }
                i += 1;
            }
            acked
        }));
    }
    std::thread::sleep(std::time::Duration::from_millis(1500));
    s.kill9();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let acked: Vec<Vec<u64>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let total: usize = acked.iter().map(Vec::len).sum();
    assert!(
        total > 50,
        "too few writes acknowledged ({total}) to be meaningful"
    );
    s.restart();
    s.unseal();
    for (w, list) in acked.iter().enumerate() {
        for i in list {
            let r = s.get(&format!("kv/w{w}/{i}"));
            assert_eq!(
                r.status, 200,
                "acknowledged write kv/w{w}/{i} lost after kill -9"
            );
            assert_eq!(r.body["data"]["i"], json!(i));
        }
    }
    eprintln!("kill -9 test: {total} acknowledged writes, all present after restart");
}

#[test]
fn config_errors_are_refused_at_start() {
    let dir = tmpdir("badcfg");
    let cfg = dir.join("bad.hcl");
    std::fs::write(&cfg, "storage \"sqlite\" { path = \"/tmp/x.db\" }\nlistener \"tcp\" {\n address = \"127.0.0.1:1\"\n tls_disable = true\n}\nmystery = 1\n").unwrap();
    let out = std::process::Command::new(cairn_tests::cairn_bin())
        .args(["server", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("mystery"));
}

/// KV reads are answered on the API threads in parallel, beside the core thread: under a
/// stream of writes, a read never shows a value older than one acknowledged before the read
/// was sent; a revoked token reads nothing once its revocation is acknowledged, nor does
/// anyone once the server is sealed; and every read is counted in `sys/metrics`.
#[test]
fn parallel_reads_see_every_acknowledged_write_and_no_revoked_token() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    let s = Server::dev();
    let r = s.post("auth/token/create", json!({"policies": ["root"]}));
    let t = r.body["auth"]["client_token"]
        .as_str()
        .unwrap_or_else(|| panic!("no token: {:?}", r.body))
        .to_string();
    assert_eq!(s.put("secret/k", json!({"v": 0})).status, 204);
    let acked = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    std::thread::scope(|sc| {
        for _ in 0..4 {
            sc.spawn(|| {
                while !done.load(SeqCst) {
                    let floor = acked.load(SeqCst);
                    let r = s.call_as(Some(&t), "GET", "secret/k", None);
                    assert_eq!(r.status, 200, "{:?}", r.body);
                    let v = r.body["data"]["v"].as_u64().unwrap_or(0);
                    assert!(
                        v >= floor,
                        "a read sent after write {floor} was acknowledged returned {v}"
                    );
                    reads.fetch_add(1, SeqCst);
                }
            });
        }
        for v in 1..=200u64 {
            let r = s.put("secret/k", json!({ "v": v }));
            assert_eq!(r.status, 204, "{:?}", r.body);
            acked.store(v, SeqCst);
        }
        done.store(true, SeqCst);
    });
    let reads = reads.load(SeqCst);
    assert!(reads > 0);
    // Revoked: refused from the next read on, by every thread.
    assert_eq!(
        s.call_as(Some(&t), "POST", "auth/token/revoke-self", None)
            .status,
        204
    );
    std::thread::scope(|sc| {
        for _ in 0..4 {
            sc.spawn(|| {
                for _ in 0..20 {
                    let r = s.call_as(Some(&t), "GET", "secret/k", None);
                    assert_eq!(r.status, 403, "a revoked token read: {:?}", r.body);
                }
            });
        }
    });
    // Every read counted (the writer's and set-up requests are counted apart).
    let m = s.raw(
        "GET",
        "/v1/sys/metrics?format=prometheus",
        &[("X-Vault-Token", &s.root_token)],
        Vec::new(),
    );
    let text = m
        .body
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| m.body.to_string());
    let counted: u64 = text
        .lines()
        .find(|l| l.starts_with(r#"cairn_requests_total{method="GET",path="secret",status="200"}"#))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert_eq!(
        counted, reads,
        "reads answered: {reads}, counted: {counted}\n{text}"
    );
    assert_eq!(s.put("sys/seal", json!({})).status, 204);
    let r = s.get("secret/k");
    assert_eq!(
        r.status, 503,
        "a sealed server answered a read: {:?}",
        r.body
    );
}
