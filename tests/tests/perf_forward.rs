//! End-to-end: writes on a performance secondary are forwarded to its primary, and
//! `X-Vault-Inconsistent: forward-active-node` sends a request the secondary is not caught
//! up for to the primary instead of the 412 (real processes replicating over their cluster
//! listeners).

use cairn_tests::cluster::*;
use cairn_tests::Server;
use serde_json::{json, Value};
use std::time::Duration;

/// A request with extra headers: (status, body, `X-Vault-Index`).
fn send(
    s: &Server,
    method: &str,
    path: &str,
    token: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, Value, Option<String>) {
    let agent = cairn_tests::agent(Duration::from_secs(60));
    let url = format!("{}/v1/{path}", s.addr);
    let mut b = ureq::http::Request::builder()
        .method(method)
        .uri(&url)
        .header("X-Vault-Token", token);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let bytes = body.map(|v| v.to_string().into_bytes()).unwrap_or_default();
    let mut r = agent
        .run(b.body(bytes).expect("request"))
        .expect("response");
    let status = r.status().as_u16();
    let index = r
        .headers()
        .get("X-Vault-Index")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let text = r.body_mut().read_to_string().unwrap_or_default();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body, index)
}

fn last_wal(s: &Server) -> u64 {
    status(s, "performance")["last_wal"].as_u64().unwrap_or(0)
}

#[test]
fn writes_on_a_perf_secondary_go_to_the_primary_and_inconsistent_reads_follow() {
    let mut p = licensed("fwd-prim");
    let mut s = licensed("fwd-perf");
    ok(
        204,
        p.post("sys/mounts/secret", json!({"type": "kv"})),
        "mount",
    );
    let pol = r#"
        path "secret/team/*" { capabilities = ["create", "read", "update", "list"] }
    "#;
    ok(
        204,
        p.put("sys/policies/acl/team", json!({ "policy": pol })),
        "policy",
    );
    ok(
        200,
        p.post("sys/replication/performance/primary/enable", json!({})),
        "perf enable",
    );
    let t = token(&p, "performance", "perf-1");
    enable_secondary(&s, "performance", &t);
    wait_caught_up(
        "the secondary to catch up",
        120,
        &p,
        &s,
        "performance",
        "perf-1",
    );
    s.root_token = generate_root(&s, &p.unseal_keys);
    // A token of the secondary (tokens are the secondary's own: the primary knows none).
    let team = ok(
        200,
        s.post("auth/token/create", json!({"policies": ["team"]})),
        "token on the secondary",
    )["auth"]["client_token"]
        .as_str()
        .expect("token")
        .to_string();
    assert_eq!(
        p.call_as(Some(&team), "GET", "auth/token/lookup-self", None)
            .status,
        403,
        "the primary does not know the secondary's token"
    );

    // A write on the secondary is applied by the primary; its answer carries the primary's
    // X-Vault-Index, with which the secondary never serves an older value.
    let (status_code, body, index) = send(
        &s,
        "PUT",
        "secret/team/a",
        &team,
        &[],
        Some(json!({"v": "one"})),
    );
    assert_eq!(status_code, 204, "{body}");
    let index = index.expect("the primary's X-Vault-Index");
    assert_eq!(p.get("secret/team/a").body["data"]["v"], "one");
    wait_for("the forwarded write to reach the secondary", 120, || {
        let (st, b, _) = send(
            &s,
            "GET",
            "secret/team/a",
            &team,
            &[("X-Vault-Index", &index)],
            None,
        );
        assert!(st == 200 || st == 412, "{st} {b}");
        st == 200 && b["data"]["v"] == "one"
    });

    // A write the secondary's policy forbids: 403 there, nothing reaches the primary.
    let wal = last_wal(&p);
    let (st, b, _) = send(&s, "PUT", "secret/other", &team, &[], Some(json!({"v": 1})));
    assert_eq!(st, 403, "{b}");
    assert_eq!(p.get("secret/other").status, 404);
    assert_eq!(last_wal(&p), wal, "the primary wrote nothing");

    // X-Vault-Inconsistent: a state the secondary has not reached (the primary's cluster,
    // an index far ahead) is a 412 without the header and goes to the primary with it.
    let cluster_id = status(&p, "performance")["cluster_id"]
        .as_str()
        .expect("cluster id")
        .to_string();
    use base64::Engine;
    let ahead = base64::engine::general_purpose::STANDARD
        .encode(format!("v1:{cluster_id}::{}", wal + 1_000_000));
    let (st, b, _) = send(
        &s,
        "GET",
        "secret/team/a",
        &team,
        &[("X-Vault-Index", &ahead)],
        None,
    );
    assert_eq!(st, 412, "{b}");
    let forward = [
        ("X-Vault-Index", ahead.as_str()),
        ("X-Vault-Inconsistent", "forward-active-node"),
    ];
    let (st, b, _) = send(&s, "GET", "secret/team/a", &team, &forward, None);
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["data"]["v"], "one");
    // The same for a write; and the ACL still decides on the secondary first.
    let (st, b, _) = send(
        &s,
        "PUT",
        "secret/team/b",
        &team,
        &forward,
        Some(json!({"v": "two"})),
    );
    assert_eq!(st, 204, "{b}");
    assert_eq!(p.get("secret/team/b").body["data"]["v"], "two");
    let (st, b, _) = send(&s, "GET", "secret/other", &team, &forward, None);
    assert_eq!(st, 403, "{b}");

    // The primary down: a clear 5xx naming it, and nothing applied on the secondary.
    let primary_cluster = format!(":{}", p.port + 1);
    p.kill9();
    let (st, b, _) = send(
        &s,
        "PUT",
        "secret/team/lost",
        &team,
        &[],
        Some(json!({"v": 1})),
    );
    assert!(st == 502 || st == 503, "{st} {b}");
    assert!(b.to_string().contains(&primary_cluster), "{b}");
    let (st, b, _) = send(&s, "GET", "secret/team/lost", &team, &[], None);
    assert_eq!(st, 404, "applied on the secondary: {b}");
    s.terminate();
}
