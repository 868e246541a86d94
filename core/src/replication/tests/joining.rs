//! Joining and its refusals: bad activation tokens, revocation and path filters, an
//! activation encrypted to the secondary's public key, and a secondary older than its
//! primary refused.

use super::*;

#[test]
fn bad_tokens_revoke_and_filters() {
    let (mut net, roots) = Net::new(2);
    let r0 = roots[0].clone();
    let r1 = roots[1].clone();
    net.enable_primary(0, &r0, "performance");
    // Garbage.
    let r = net.call(
        1,
        &r1,
        Method::Post,
        "sys/replication/performance/secondary/enable",
        json!({"token": "garbage"}),
    );
    assert_eq!(r.status, 400);
    assert!(r
        .body
        .unwrap()
        .to_string()
        .contains("invalid activation token"));
    // Wrong mode.
    net.enable_primary(0, &r0, "dr");
    let t = net.ok(
        0,
        &r0,
        Method::Post,
        "sys/replication/dr/primary/secondary-token",
        json!({"id": "x"}),
    );
    let dr_tok = t["wrap_info"]["token"].as_str().unwrap().to_string();
    let r = net.call(
        1,
        &r1,
        Method::Post,
        "sys/replication/performance/secondary/enable",
        json!({"token": dr_tok}),
    );
    assert_eq!(r.status, 400);
    assert!(r.body.unwrap().to_string().contains("for dr replication"));
    // Used twice.
    let t = net.ok(
        0,
        &r0,
        Method::Post,
        "sys/replication/performance/primary/secondary-token",
        json!({"id": "s1"}),
    );
    let tok = t["wrap_info"]["token"].as_str().unwrap().to_string();
    let dup = net.call(
        0,
        &r0,
        Method::Post,
        "sys/replication/performance/primary/secondary-token",
        json!({"id": "s1"}),
    );
    assert_eq!(dup.status, 400);
    // Unwrap it once elsewhere first: the secondary's enable then fails and changes nothing.
    let u = net.call(
        0,
        "",
        Method::Post,
        "sys/wrapping/unwrap",
        json!({"token": tok}),
    );
    assert_eq!(u.status, 200);
    let before = net.nodes[1].storage().map.clone();
    let r = net.call(
        1,
        &r1,
        Method::Post,
        "sys/replication/performance/secondary/enable",
        json!({"token": tok}),
    );
    assert_eq!(r.status, 400);
    assert!(r
        .body
        .unwrap()
        .to_string()
        .contains("error unwrapping secondary token"));
    assert_eq!(
        net.nodes[1].storage().map.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>()
    );
    assert_eq!(net.status(1, "performance")["mode"], "disabled");
    // A good token; then a filter excluding a mount; then revoke.
    net.ok(
        0,
        &r0,
        Method::Post,
        "sys/mounts/team",
        json!({"type": "kv"}),
    );
    net.ok(0, &r0, Method::Put, "team/x", json!({"v": 1}));
    net.ok(0, &r0, Method::Put, "secret/y", json!({"v": 1}));
    net.activate(0, &r0, 1, &r1, "performance", "s2");
    net.ok(
        0,
        &r0,
        Method::Post,
        "sys/replication/performance/primary/paths-filter/s2",
        json!({"mode": "deny", "paths": ["team/"]}),
    );
    net.run_for(3_000);
    let f = net.ok(
        0,
        &r0,
        Method::Get,
        "sys/replication/performance/primary/paths-filter/s2",
        json!({}),
    );
    assert_eq!(f["data"]["paths"], json!(["team/"]));
    let d = net.ok(
        0,
        &r0,
        Method::Get,
        "sys/replication/performance/primary/dynamic-filter/s2",
        json!({}),
    );
    assert_eq!(d["data"]["dynamic_filtered_mounts"], json!(["team/"]));
    let has = |net: &Net, i: usize, path: &str| {
        net.nodes[i]
            .storage()
            .map
            .keys()
            .any(|k| k.starts_with("logical/") && k.ends_with(path))
    };
    assert!(has(&net, 1, "/y"));
    assert!(
        !has(&net, 1, "/x"),
        "filtered mount data must not replicate"
    );
    let s = net.status(1, "performance");
    assert_eq!(s["state"], "stream-wals", "{s}");
    // Revoke: nothing more arrives.
    net.ok(
        0,
        &r0,
        Method::Post,
        "sys/replication/performance/primary/revoke-secondary",
        json!({"id": "s2"}),
    );
    net.ok(0, &r0, Method::Put, "secret/after-revoke", json!({"v": 1}));
    net.run_for(2_000);
    assert!(!has(&net, 1, "/after-revoke"));
    let s = net.status(1, "performance");
    assert!(
        s["last_error"].as_str().unwrap_or("").contains("revoked"),
        "{s}"
    );
    // Gates: namespace and license.
    let mut req = Request::new(
        9_999_999,
        Method::Post,
        "sys/replication/performance/primary/demote",
    )
    .with_token(&r0);
    req.namespace = Some("ns1/".into());
    net.nodes[0].handle(net.now, Input::Request(req));
    net.settle();
    let r = net.responses.remove(&(0, 9_999_999)).unwrap();
    assert_eq!(r.status, 400);
    assert!(r.body.unwrap().to_string().contains("root namespace"));
}

#[test]
fn encrypted_activation_with_secondary_public_key() {
    let (mut net, roots) = Net::new(3);
    let r0 = roots[0].clone();
    net.ok(0, &r0, Method::Put, "secret/a", json!({"v": 1}));
    let pe = "sys/replication/performance/primary/enable";
    net.ok(0, &r0, Method::Post, pe, json!({}));
    let gen = "sys/replication/performance/secondary/generate-public-key";
    let pk = net.ok(1, &roots[1], Method::Post, gen, json!({}))["data"]["secondary_public_key"]
        .as_str()
        .unwrap()
        .to_string();
    let st = "sys/replication/performance/primary/secondary-token";
    let t = net.ok(
        0,
        &r0,
        Method::Post,
        st,
        json!({"id": "enc1", "secondary_public_key": pk}),
    );
    // Not response-wrapped: the encrypted credential is in the data.
    assert!(t["wrap_info"].is_null(), "{t}");
    let tok = t["data"]["token"].as_str().unwrap().to_string();
    assert!(activation::is_encrypted_token(&tok));
    // Another node (with its own key) cannot use it.
    let other = net.ok(2, &roots[2], Method::Post, gen, json!({}));
    assert!(other["data"]["secondary_public_key"].is_string());
    let en = "sys/replication/performance/secondary/enable";
    let r = net.call(2, &roots[2], Method::Post, en, json!({ "token": tok }));
    assert_eq!(r.status, 400);
    assert!(r.body.unwrap().to_string().contains("cannot be decrypted"));
    assert_eq!(net.status(2, "performance")["mode"], "disabled");
    // The secondary decrypts locally: an unreachable API address does not matter.
    net.ok(
        1,
        &roots[1],
        Method::Post,
        en,
        json!({ "token": tok, "primary_api_addr": "http://nowhere" }),
    );
    net.run_for(2_000);
    let p = net.status(0, "performance");
    let s1 = net.status(1, "performance");
    assert_eq!(s1["state"], "stream-wals", "{s1}");
    assert_eq!(s1["merkle_root"], p["merkle_root"]);
    assert_eq!(p["known_secondaries"], json!(["enc1"]));
    // The private key went with the activation wipe.
    assert!(net.data_keys(1, "node/activation-key/").is_empty());
    // An expired encrypted token is refused and changes nothing.
    let pk2 = net.ok(2, &roots[2], Method::Post, gen, json!({}))["data"]["secondary_public_key"]
        .as_str()
        .unwrap()
        .to_string();
    let t2 = net.ok(
        0,
        &r0,
        Method::Post,
        st,
        json!({"id": "enc2", "secondary_public_key": pk2, "ttl": "1s"}),
    )["data"]["token"]
        .as_str()
        .unwrap()
        .to_string();
    net.run_for(2_000);
    let r = net.call(2, &roots[2], Method::Post, en, json!({ "token": t2 }));
    assert_eq!(r.status, 400);
    assert!(r.body.unwrap().to_string().contains("expired"));
    assert_eq!(net.status(2, "performance")["mode"], "disabled");
    // A malformed key is refused at the primary.
    let r = net.call(
        0,
        &r0,
        Method::Post,
        st,
        json!({"id": "enc3", "secondary_public_key": "bm9wZQ=="}),
    );
    assert_eq!(r.status, 400);
}

/// The versioning rule: a secondary older than its primary refuses the primary's credential
/// (nothing changes), and a primary upgraded past its secondaries stops sending to them, the
/// status naming both versions, until the secondaries are upgraded too.
#[test]
fn replication_never_flows_from_a_newer_version_to_an_older_one() {
    // An older secondary refuses a newer primary's activation token.
    let (mut net, roots) = Net::with_versions(&["1.5.0", "1.4.0"]);
    let r0 = roots[0].clone();
    net.enable_primary(0, &r0, "performance");
    let t = net.ok(
        0,
        &r0,
        Method::Post,
        "sys/replication/performance/primary/secondary-token",
        json!({ "id": "old" }),
    );
    let tok = t["wrap_info"]["token"].as_str().unwrap().to_string();
    let r1 = roots[1].clone();
    let r = net.call(
        1,
        &r1,
        Method::Post,
        "sys/replication/performance/secondary/enable",
        json!({ "token": tok }),
    );
    assert_eq!(r.status, 400, "{:?}", r.body);
    let msg = r.body.unwrap().to_string();
    assert!(
        msg.contains("1.4.0") && msg.contains("1.5.0") && msg.contains("unsafe"),
        "{msg}"
    );
    assert_eq!(net.status(1, "performance")["mode"], json!("disabled"));

    // Same versions: streaming; a newer secondary is fine too.
    let (mut net, roots) = Net::with_versions(&["1.4.0", "1.4.0", "1.6.0"]);
    let r0 = roots[0].clone();
    net.enable_primary(0, &r0, "performance");
    net.activate(0, &r0, 1, &roots[1], "performance", "s1");
    net.activate(0, &r0, 2, &roots[2], "performance", "s2");
    net.run_for(3_000);
    net.ok(0, &r0, Method::Put, "secret/a", json!({"v": 1}));
    net.run_for(2_000);
    assert_eq!(net.data_keys(1, "").len(), net.data_keys(2, "").len());
    let st = net.status(2, "performance");
    assert_eq!(st["version"], json!("1.6.0"));
    assert_eq!(st["primary_version"], json!("1.4.0"));
    let p = net.status(0, "performance");
    let versions: Vec<Value> = p["secondaries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["version"].clone())
        .collect();
    assert_eq!(versions, vec![json!("1.4.0"), json!("1.6.0")]);

    // The primary is upgraded first (the wrong order): the 1.4.0 secondary is refused and
    // says why; the 1.6.0 one goes on. Nothing written after reaches the old one.
    net.restart_as(0, "1.5.0", 0);
    net.run_for(3_000);
    let st = net.status(1, "performance");
    assert_eq!(st["state"], json!("version-mismatch"), "{st}");
    assert_eq!(st["version"], json!("1.4.0"));
    let err = st["last_error"].as_str().unwrap_or_default().to_string();
    assert!(
        err.contains("version-too-old") && err.contains("1.4.0") && err.contains("1.5.0"),
        "{err}"
    );
    let before = net.data_keys(1, "").len();
    net.ok(0, &r0, Method::Put, "secret/b", json!({"v": 2}));
    net.ok(0, &r0, Method::Put, "secret/c", json!({"v": 3}));
    net.run_for(3_000);
    assert_eq!(
        net.data_keys(1, "").len(),
        before,
        "data reached an older secondary"
    );
    assert_eq!(
        net.status(2, "performance")["primary_version"],
        json!("1.5.0")
    );
    let newer = net.data_keys(2, "").len();
    assert!(newer > before, "the newer secondary stopped too");

    // Upgrading the secondary resumes the stream where it stopped.
    net.restart_as(1, "1.5.0", 0);
    net.run_for(8_000);
    let st = net.status(1, "performance");
    assert_eq!(st["state"], json!("stream-wals"), "{st}");
    assert_eq!(net.data_keys(1, "").len(), net.data_keys(2, "").len());
}
