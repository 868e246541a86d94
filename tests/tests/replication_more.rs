//! More end-to-end replication: expired activation tokens, encrypted activation
//! (`secondary_public_key`), and disabling then re-enabling performance replication on the
//! primary and on a secondary. Real `cairn` processes on loopback.

use cairn_tests::{Resp, Server};
use serde_json::{json, Value};
use std::time::Duration;

use cairn_tests::cluster::*;

fn perf_primary_with_data(tag: &str) -> Server {
    let p = licensed(tag);
    ok(
        204,
        p.post("sys/mounts/secret", json!({"type": "kv"})),
        "mount",
    );
    for i in 0..5 {
        ok(
            204,
            p.put(&format!("secret/k{i}"), json!({"v": i})),
            "write",
        );
    }
    ok(
        200,
        p.post("sys/replication/performance/primary/enable", json!({})),
        "perf enable",
    );
    p
}

#[test]
fn expired_secondary_tokens_are_refused_and_change_nothing() {
    let p = perf_primary_with_data("xprim");
    let s = licensed("xsec");
    let b = ok(
        200,
        p.post(
            "sys/replication/performance/primary/secondary-token",
            json!({"id": "late", "ttl": "1s"}),
        ),
        "secondary-token",
    );
    assert_eq!(b["wrap_info"]["ttl"], 1, "{b}");
    let wrapped = b["wrap_info"]["token"].as_str().expect("token").to_string();
    // The same for an encrypted token (checked by the secondary itself).
    let pk = ok(
        200,
        s.post(
            "sys/replication/performance/secondary/generate-public-key",
            json!({}),
        ),
        "generate-public-key",
    )["data"]["secondary_public_key"]
        .as_str()
        .expect("public key")
        .to_string();
    let enc = ok(
        200,
        p.post(
            "sys/replication/performance/primary/secondary-token",
            json!({"id": "late-enc", "ttl": "1s", "secondary_public_key": pk}),
        ),
        "encrypted secondary-token",
    )["data"]["token"]
        .as_str()
        .expect("token")
        .to_string();
    std::thread::sleep(Duration::from_millis(2_500));
    let before_keys = ok(200, s.get("sys/mounts"), "mounts")["data"].clone();
    for tok in [&wrapped, &enc] {
        let r = s.post(
            "sys/replication/performance/secondary/enable",
            json!({ "token": tok }),
        );
        assert_eq!(r.status, 400, "{}", r.body);
        assert!(r.errors().contains("expired"), "{}", r.errors());
        // Nothing changed: still disabled, its own root token and data still work.
        assert_eq!(status(&s, "performance")["mode"], "disabled");
        assert_eq!(ok(200, s.get("sys/mounts"), "mounts")["data"], before_keys);
    }
    // The primary never heard from it.
    let ps = status(&p, "performance");
    let secs = ps["secondaries"].as_array().expect("secondaries").clone();
    assert!(
        secs.iter()
            .all(|x| x["connection_status"] == "disconnected" && x["cluster_id"] == ""),
        "{ps}"
    );
}

#[test]
fn encrypted_activation_needs_no_call_to_the_primary_api() {
    let p = perf_primary_with_data("eprim");
    let s = licensed("esec");
    let pk = ok(
        200,
        s.post(
            "sys/replication/performance/secondary/generate-public-key",
            json!({}),
        ),
        "generate-public-key",
    )["data"]["secondary_public_key"]
        .as_str()
        .expect("public key")
        .to_string();
    let b = ok(
        200,
        p.post(
            "sys/replication/performance/primary/secondary-token",
            json!({"id": "enc", "secondary_public_key": pk}),
        ),
        "encrypted secondary-token",
    );
    assert_eq!(b["wrap_info"], Value::Null, "not response-wrapped: {b}");
    let tok = b["data"]["token"].as_str().expect("token").to_string();
    // An unreachable API address: the secondary decrypts locally and never calls it.
    ok(
        200,
        s.post(
            "sys/replication/performance/secondary/enable",
            json!({ "token": tok, "primary_api_addr": "https://127.0.0.1:1" }),
        ),
        "secondary enable",
    );
    wait_caught_up("encrypted activation", 30, &p, &s, "performance", "enc");
    assert_eq!(
        status(&s, "performance")["merkle_root"],
        status(&p, "performance")["merkle_root"]
    );
}

#[test]
fn disable_and_reenable_on_the_primary_and_on_a_secondary() {
    let p = perf_primary_with_data("dprim");
    let mut s = licensed("dsec");
    enable_secondary(&s, "performance", &token(&p, "performance", "s1"));
    wait_caught_up("first activation", 30, &p, &s, "performance", "s1");

    // Secondary disable (with a root token generated from the primary's key shares).
    s.root_token = generate(&s, "sys/generate-root", &p.unseal_keys);
    ok(
        204,
        s.post("sys/replication/performance/secondary/disable", json!({})),
        "secondary disable",
    );
    assert_eq!(status(&s, "performance")["mode"], "disabled");
    ok(
        204,
        p.put("secret/while-disabled", json!({"v": "x"})),
        "write",
    );
    // Re-activation with a new token: back to streaming, data converges.
    enable_secondary(&s, "performance", &token(&p, "performance", "s1b"));
    wait_caught_up("re-activation", 30, &p, &s, "performance", "s1b");
    assert_eq!(
        status(&s, "performance")["merkle_root"],
        status(&p, "performance")["merkle_root"]
    );

    // Primary disable: secondaries can no longer connect.
    let old_id = status(&p, "performance")["cluster_id"].clone();
    ok(
        204,
        p.post("sys/replication/performance/primary/disable", json!({})),
        "primary disable",
    );
    assert_eq!(status(&p, "performance")["mode"], "disabled");
    wait_for("the secondary to lose its primary", 30, || {
        status(&s, "performance")["state"] != "stream-wals"
    });
    ok(
        204,
        p.put("secret/after-disable", json!({"v": "y"})),
        "write",
    );
    // Re-enable: a new cluster id; the secondary needs a new token (and a wipe).
    ok(
        200,
        p.post("sys/replication/performance/primary/enable", json!({})),
        "perf re-enable",
    );
    let ps = status(&p, "performance");
    assert_eq!(ps["mode"], "primary");
    assert_ne!(ps["cluster_id"], old_id);
    assert_eq!(ps["known_secondaries"], json!([]));
    s.root_token = generate(&s, "sys/generate-root", &p.unseal_keys);
    ok(
        204,
        s.post("sys/replication/performance/secondary/disable", json!({})),
        "secondary disable",
    );
    enable_secondary(&s, "performance", &token(&p, "performance", "s1c"));
    for i in 0..5 {
        ok(
            204,
            p.put(&format!("secret/new{i}"), json!({"v": i})),
            "write",
        );
    }
    wait_caught_up("after primary re-enable", 30, &p, &s, "performance", "s1c");
    assert_eq!(
        status(&s, "performance")["merkle_root"],
        status(&p, "performance")["merkle_root"]
    );
    s.root_token = generate(&s, "sys/generate-root", &p.unseal_keys);
    assert_eq!(s.get("secret/after-disable").body["data"]["v"], "y");
    assert_eq!(s.get("secret/new4").body["data"]["v"], 4);
}

/// A request in a namespace given by the `X-Vault-Namespace` header.
fn in_ns(s: &Server, ns: &str, method: &str, path: &str, body: Option<Value>) -> Resp {
    let b = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    s.raw(
        method,
        &format!("/v1/{path}"),
        &[
            ("X-Vault-Token", s.root_token.as_str()),
            ("X-Vault-Namespace", ns),
        ],
        b,
    )
}

#[test]
fn namespaces_route_replicate_and_are_path_filtered() {
    let p = licensed("nprim");
    let mut s = licensed("nsec");
    for ns in ["ns1", "ns2"] {
        let c = ok(
            200,
            p.post(&format!("sys/namespaces/{ns}"), json!({})),
            "create ns",
        );
        assert_eq!(c["data"]["path"], format!("{ns}/"));
        // Header form for the mount, path-prefix form for the data.
        ok(
            204,
            in_ns(
                &p,
                ns,
                "POST",
                "sys/mounts/app",
                Some(json!({"type": "kv"})),
            ),
            "mount in ns",
        );
        ok(
            204,
            p.put(&format!("{ns}/app/x"), json!({ "v": ns })),
            "write in ns",
        );
    }
    ok(
        200,
        in_ns(&p, "ns1", "POST", "sys/namespaces/kid", None),
        "nested ns",
    );
    assert_eq!(
        in_ns(&p, "ns1", "GET", "app/x", None).body["data"]["v"],
        "ns1"
    );
    // Invisible from the root and from a sibling.
    assert_eq!(p.get("app/x").status, 404);
    assert!(ok(200, p.get("sys/mounts"), "mounts")["data"]["ns1/app/"].is_null());
    assert_eq!(
        in_ns(&p, "ns2", "GET", "sys/mounts", None).body["data"]["app/"]["type"],
        "kv"
    );
    let l = ok(200, p.list("sys/namespaces"), "list");
    assert_eq!(l["data"]["keys"], json!(["ns1/", "ns2/"]));

    ok(
        200,
        p.post("sys/replication/performance/primary/enable", json!({})),
        "perf enable",
    );
    let t = token(&p, "performance", "ns-s");
    ok(
        204,
        p.post(
            "sys/replication/performance/primary/paths-filter/ns-s",
            json!({"mode": "deny", "paths": ["ns1/"]}),
        ),
        "paths filter",
    );
    enable_secondary(&s, "performance", &t);
    wait_caught_up("namespaced data", 30, &p, &s, "performance", "ns-s");
    let d = ok(
        200,
        p.get("sys/replication/performance/primary/dynamic-filter/ns-s"),
        "dynamic filter",
    );
    assert_eq!(
        d["data"]["dynamic_filtered_namespaces"],
        json!(["ns1/", "ns1/kid/"])
    );
    assert_eq!(d["data"]["dynamic_filtered_mounts"], json!(["ns1/app/"]));
    // The secondary has the namespaces (system data) and ns2's data, not ns1's.
    s.root_token = generate(&s, "sys/generate-root", &p.unseal_keys);
    assert_eq!(
        ok(200, s.list("sys/namespaces"), "list on secondary")["data"]["keys"],
        json!(["ns1/", "ns2/"])
    );
    assert_eq!(s.get("ns2/app/x").body["data"]["v"], "ns2");
    assert_eq!(
        in_ns(&s, "ns2", "GET", "app/x", None).body["data"]["v"],
        "ns2"
    );
    assert_eq!(s.get("ns1/app/x").status, 404);
}
