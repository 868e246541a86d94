//! End-to-end replication: real `cairn` processes on loopback, replicating over their
//! cluster listeners.

use cairn_tests::{tmpdir, Server};
use serde_json::json;
use std::time::Duration;

use cairn_tests::cluster::*;

#[test]
fn perf_and_dr_secondaries_replicate_with_filter_and_revoke() {
    let p = licensed("prim");
    let s1 = licensed("perf1");
    let s2 = licensed("perf2");
    let d = licensed("dr1");

    // Data before replication is enabled reaches the secondaries by Merkle sync.
    ok(
        204,
        p.post("sys/mounts/secret", json!({"type": "kv"})),
        "mount secret",
    );
    ok(
        204,
        p.post("sys/mounts/team", json!({"type": "kv"})),
        "mount team",
    );
    ok(204, p.put("secret/before", json!({"v": "1"})), "write");
    // KV version 2 mounts (one of them filtered from perf-2): their keys' metadata and
    // versions live under the mount's prefix and replicate as version 1 keys do.
    ok(
        204,
        p.post("sys/mounts/ver", json!({"type": "kv-v2"})),
        "mount ver",
    );
    ok(
        204,
        p.post(
            "sys/mounts/teamv2",
            json!({"type": "kv", "options": {"version": "2"}}),
        ),
        "mount teamv2",
    );
    ok(
        200,
        p.put("ver/data/before", json!({"data": {"v": "1"}})),
        "v2 write",
    );
    ok(204, p.put("team/before", json!({"v": "1"})), "write");

    // Disabled shape, and the combined status.
    assert_eq!(status(&p, "performance")["mode"], "disabled");
    let all = p.call_as(None, "GET", "sys/replication/status", None);
    assert_eq!(all.body["data"]["dr"]["mode"], "disabled", "{}", all.body);

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
    let ps = status(&p, "performance");
    assert_eq!(ps["mode"], "primary");
    assert!(!ps["cluster_id"].as_str().unwrap_or("").is_empty());

    let t1 = token(&p, "performance", "perf-1");
    let t2 = token(&p, "performance", "perf-2");
    let td = token(&p, "dr", "dr-1");
    ok(
        204,
        p.post(
            "sys/replication/performance/primary/paths-filter/perf-2",
            json!({"mode": "deny", "paths": ["team/", "teamv2/"]}),
        ),
        "paths filter",
    );
    enable_secondary(&s1, "performance", &t1);
    enable_secondary(&s2, "performance", &t2);
    enable_secondary(&d, "dr", &td);

    // Streaming after the initial sync.
    for i in 0..20 {
        ok(
            204,
            p.put(&format!("secret/k{i}"), json!({"v": i})),
            "write",
        );
        ok(204, p.put(&format!("team/k{i}"), json!({"v": i})), "write");
        if i % 4 == 0 {
            for m in ["ver", "teamv2"] {
                ok(
                    200,
                    p.put(&format!("{m}/data/k{i}"), json!({"data": {"v": i}})),
                    "v2 write",
                );
            }
        }
    }
    // A second version, a patch, metadata and a soft delete of the first version.
    ok(
        200,
        p.put(
            "ver/data/k4",
            json!({"data": {"v": 40}, "options": {"cas": 1}}),
        ),
        "v2 cas write",
    );
    let r = p.call_as(
        Some(&p.root_token),
        "PATCH",
        "ver/data/k4",
        Some(json!({"data": {"w": 41}})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    ok(
        204,
        p.post(
            "ver/metadata/k4",
            json!({"custom_metadata": {"owner": "ops"}}),
        ),
        "v2 metadata",
    );
    ok(
        204,
        p.post("ver/delete/k4", json!({"versions": [1]})),
        "v2 delete",
    );
    wait_caught_up("perf-1 to catch up", 30, &p, &s1, "performance", "perf-1");
    wait_caught_up("perf-2 to catch up", 30, &p, &s2, "performance", "perf-2");
    wait_caught_up("dr-1 to catch up", 30, &p, &d, "dr", "dr-1");

    // Unfiltered perf secondary and DR secondary hold exactly the primary's data.
    assert_eq!(
        status(&s1, "performance")["merkle_root"],
        status(&p, "performance")["merkle_root"]
    );
    assert_eq!(
        status(&d, "dr")["merkle_root"],
        status(&p, "dr")["merkle_root"]
    );
    assert_eq!(
        status(&d, "dr")["cluster_id"],
        status(&p, "dr")["cluster_id"]
    );
    // The filtered one does not hold team/.
    assert_ne!(
        status(&s2, "performance")["merkle_root"],
        status(&p, "performance")["merkle_root"]
    );
    let dyn_f = ok(
        200,
        p.get("sys/replication/performance/primary/dynamic-filter/perf-2"),
        "dynamic filter",
    );
    assert_eq!(
        dyn_f["data"]["dynamic_filtered_mounts"],
        json!(["team/", "teamv2/"])
    );
    let pf = ok(
        200,
        p.get("sys/replication/performance/primary/paths-filter/perf-2"),
        "read filter",
    );
    assert_eq!(
        pf["data"],
        json!({"mode": "deny", "paths": ["team/", "teamv2/"]})
    );

    // Heartbeats on both sides.
    let ps = status(&p, "performance");
    let secs = ps["secondaries"].as_array().expect("secondaries").clone();
    assert_eq!(secs.len(), 2, "{ps}");
    assert!(
        secs.iter().all(|s| s["connection_status"] == "connected"),
        "{ps}"
    );
    assert_eq!(ps["known_secondaries"], json!(["perf-1", "perf-2"]));
    let ss = status(&s1, "performance");
    assert_eq!(ss["primaries"][0]["connection_status"], "connected", "{ss}");
    assert_eq!(ss["secondary_id"], "perf-1");
    assert_eq!(
        ss["known_primary_cluster_addrs"][0],
        ps["primary_cluster_addr"]
    );

    // Read-after-write: a write's X-Vault-Index, sent with a read to a performance
    // secondary, is served once the secondary has applied it.
    let s1_token = generate_root(&s1, &p.unseal_keys);
    let state = put_for_index(&p, "secret/raw", json!({"v": "w"}));
    wait_for("perf-1 to serve the write's index", 30, || {
        let (code, body) = get_with_index(&s1, &s1_token, "secret/raw", &state);
        assert!(code == 200 || code == 412, "{code} {body}");
        code == 200 && body.contains("\"v\":\"w\"")
    });
    let (code, body) = get_with_index(&s1, &s1_token, "secret/raw", "not-a-state");
    assert_eq!(code, 400, "{body}");

    // KV version 2 on the secondaries: every version, the metadata and the soft delete
    // arrived; the filtered mount's keys did not reach perf-2; a secondary refuses writes.
    let r = s1.call_as(Some(&s1_token), "GET", "ver/data/k4", None);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["data"]["data"], json!({"v": 40, "w": 41}));
    assert_eq!(r.body["data"]["metadata"]["version"], 3);
    assert_eq!(
        r.body["data"]["metadata"]["custom_metadata"],
        json!({"owner": "ops"})
    );
    let r = s1.call_as(Some(&s1_token), "GET", "ver/data/k4?version=1", None);
    assert_eq!(r.status, 404, "{}", r.body);
    assert_ne!(
        r.body["data"]["metadata"]["deletion_time"], "",
        "{}",
        r.body
    );
    let r = s1.call_as(Some(&s1_token), "GET", "teamv2/data/k8", None);
    assert_eq!(r.body["data"]["data"], json!({"v": 8}), "{}", r.body);
    let r = s1.call_as(Some(&s1_token), "GET", "ver/data/before", None);
    assert_eq!(r.body["data"]["data"], json!({"v": "1"}), "{}", r.body);
    let s2_token = generate_root(&s2, &p.unseal_keys);
    let r = s2.call_as(Some(&s2_token), "GET", "ver/data/k8", None);
    assert_eq!(r.body["data"]["data"], json!({"v": 8}), "{}", r.body);
    let r = s2.call_as(Some(&s2_token), "GET", "teamv2/data/k8", None);
    assert_eq!(
        r.status, 404,
        "a filtered v2 key reached perf-2: {}",
        r.body
    );
    // A v2 write on the performance secondary is forwarded to the primary, applied there
    // and answered with the primary's version.
    let r = s1.call_as(
        Some(&s1_token),
        "PUT",
        "ver/data/k4",
        Some(json!({"data": {"v": 0}})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = p.get("ver/data/k4");
    assert_eq!(r.body["data"]["data"], json!({"v": 0}), "{}", r.body);
    assert_eq!(
        r.body["data"]["metadata"]["version"],
        json!(4),
        "{}",
        r.body
    );

    // The DR secondary refuses client requests with a clear error.
    let r = d.call_as(Some(&p.root_token), "GET", "secret/k1", None);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.errors().contains("DR secondary"), "{}", r.errors());

    // Revoke perf-1: it receives nothing afterwards.
    ok(
        204,
        p.post(
            "sys/replication/performance/primary/revoke-secondary",
            json!({"id": "perf-1"}),
        ),
        "revoke",
    );
    let before = status(&s1, "performance")["last_remote_wal"].clone();
    for i in 0..5 {
        ok(
            204,
            p.put(&format!("secret/after{i}"), json!({"v": i})),
            "write",
        );
    }
    wait_caught_up(
        "perf-2 to catch up after revoke",
        30,
        &p,
        &s2,
        "performance",
        "perf-2",
    );
    wait_for("perf-1 to notice the revocation", 30, || {
        status(&s1, "performance")["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("revoked")
    });
    assert_eq!(status(&s1, "performance")["last_remote_wal"], before);
    // A revoked secondary never reaches a later write's state: 412, with a reason.
    let state = put_for_index(&p, "secret/after-revoke", json!({"v": 1}));
    let (status412, body) = get_with_index(&s1, &s1_token, "secret/after-revoke", &state);
    assert_eq!(status412, 412, "{body}");
    assert!(body.contains("not yet"), "{body}");
    assert_ne!(
        status(&s1, "performance")["merkle_root"],
        status(&p, "performance")["merkle_root"]
    );
    wait_caught_up("dr-1 to catch up again", 30, &p, &d, "dr", "dr-1");
}

#[test]
fn bad_activation_tokens_get_clear_errors_and_change_nothing() {
    let p = licensed("bprim");
    let s = licensed("bsec");
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
    let check = |tok: &str, mode: &str, want: &str| {
        let r = s.post(
            &format!("sys/replication/{mode}/secondary/enable"),
            json!({ "token": tok }),
        );
        assert_eq!(r.status, 400, "{}", r.body);
        assert!(r.errors().contains(want), "want {want:?} in {}", r.errors());
        assert_eq!(status(&s, mode)["mode"], "disabled");
        // Still serving its own data with its own root token.
        ok(200, s.get("sys/policies/acl"), "secondary still usable");
    };
    check("garbage", "performance", "invalid activation token");
    let dr = token(&p, "dr", "x1");
    check(&dr, "performance", "for dr replication");
    let used = token(&p, "performance", "x2");
    let r = p.call_as(
        None,
        "POST",
        "sys/wrapping/unwrap",
        Some(json!({ "token": used })),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    check(&used, "performance", "error unwrapping secondary token");
    let revoked = token(&p, "performance", "x3");
    ok(
        204,
        p.post(
            "sys/replication/performance/primary/revoke-secondary",
            json!({"id": "x3"}),
        ),
        "revoke",
    );
    check(&revoked, "performance", "error unwrapping secondary token");
    // Tampered: the address claim altered without the primary's key.
    let good = token(&p, "performance", "x4");
    let parts: Vec<&str> = good.split('.').collect();
    let tampered = format!("{}.{}x.{}", parts[0], parts[1], parts[2]);
    check(&tampered, "performance", "invalid activation token");
    // Duplicate id.
    let r = p.post(
        "sys/replication/performance/primary/secondary-token",
        json!({"id": "x4"}),
    );
    assert_eq!(r.status, 400);
    assert!(r.errors().contains("already exists"), "{}", r.errors());
    // Enabling a primary as a secondary, or a secondary-token on a non-primary.
    let r = s.post(
        "sys/replication/performance/primary/secondary-token",
        json!({"id": "y"}),
    );
    assert_eq!(r.status, 400);
    assert!(
        r.errors().contains("not a performance primary"),
        "{}",
        r.errors()
    );
}

#[test]
fn gates_license_and_root_namespace() {
    let dir = tmpdir("unlic");
    let mut s = start(&dir, "");
    s.init_unseal(1, 1);
    // Status endpoints need neither a token nor a license.
    assert_eq!(status(&s, "dr")["mode"], "disabled");
    let r = s.post("sys/replication/performance/primary/enable", json!({}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.errors().contains("license"), "{}", r.errors());
    let p = licensed("nsprim");
    let r = p.raw(
        "POST",
        "/v1/sys/replication/performance/primary/enable",
        &[
            ("X-Vault-Token", &p.root_token),
            ("X-Vault-Namespace", "team1/"),
        ],
        b"{}".to_vec(),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.errors().contains("root namespace"), "{}", r.errors());
    let lic = ok(200, p.get("sys/license/status"), "license status");
    assert_eq!(lic["data"]["autoloaded"]["license_id"], "e2e-test-license");
    // Once primary, the cluster listener speaks TLS only.
    ok(
        200,
        p.post("sys/replication/dr/primary/enable", json!({})),
        "dr enable",
    );
    wait_cluster_tls(&p);
}

/// Waits until `s`'s cluster listener speaks TLS only (a plaintext request gets no HTTP
/// answer).
fn wait_cluster_tls(s: &Server) {
    wait_for("the cluster listener to switch to TLS", 20, || {
        use std::io::{Read, Write};
        let Ok(mut c) = std::net::TcpStream::connect(cluster_addr(s)) else {
            return false;
        };
        let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = c.write_all(
            b"POST /v1/cluster/replication HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
        );
        let mut buf = [0u8; 16];
        let n = c.read(&mut buf).unwrap_or(0);
        !buf[..n].starts_with(b"HTTP/1.1")
    });
}

fn cluster_addr(s: &Server) -> String {
    format!("127.0.0.1:{}", s.port + 1)
}

#[test]
fn dr_failover_repoints_perf_secondary_and_old_primary_rejoins() {
    let mut p = licensed("fprim");
    let mut s = licensed("fperf");
    let mut d = licensed("fdr");
    ok(
        204,
        p.post("sys/mounts/secret", json!({"type": "kv"})),
        "mount",
    );
    ok(204, p.put("secret/one", json!({"v": "1"})), "write");
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
    let perf_cluster = status(&p, "performance")["cluster_id"].clone();
    enable_secondary(&s, "performance", &token(&p, "performance", "perf"));
    enable_secondary(&d, "dr", &token(&p, "dr", "dr"));
    wait_caught_up("perf to catch up", 30, &p, &s, "performance", "perf");
    wait_caught_up("dr to catch up", 30, &p, &d, "dr", "dr");

    // The primary dies.
    p.kill9();
    // Promotion needs a DR operation token, made from the primary's key shares.
    let r = d.call_as(
        None,
        "POST",
        "sys/replication/dr/secondary/promote",
        Some(json!({})),
    );
    assert_eq!(r.status, 403, "{}", r.body);
    let keys = p.unseal_keys.clone();
    cairn_tests::cluster::promote_dr(&d, &keys);
    assert_eq!(status(&d, "dr")["mode"], "primary");
    wait_cluster_tls(&d);
    let dp = status(&d, "performance");
    assert_eq!(
        dp["mode"], "primary",
        "the promoted cluster joins the performance set: {dp}"
    );
    assert_eq!(dp["cluster_id"], perf_cluster);
    // The primary's root token came along (tokens replicate to DR secondaries).
    let root = p.root_token.clone();
    d.root_token = root.clone();
    ok(
        204,
        d.call_as(Some(&root), "PUT", "secret/two", Some(json!({"v": "2"}))),
        "write on new primary",
    );
    let r = d.call_as(Some(&root), "GET", "secret/one", None);
    assert_eq!(r.body["data"]["v"], "1", "{}", r.body);

    // The perf secondary gets a token from the primary's shares and is re-pointed by address.
    s.root_token = generate(&s, "sys/generate-root", &keys);
    ok(
        204,
        s.post(
            "sys/replication/performance/secondary/update-primary",
            json!({"update_primary_addrs": ["127.0.0.1:1", cluster_addr(&d)]}),
        ),
        "update-primary by address",
    );
    wait_caught_up(
        "perf to follow the new primary",
        30,
        &d,
        &s,
        "performance",
        "perf",
    );
    assert_eq!(
        status(&s, "performance")["known_primary_cluster_addrs"][0],
        cluster_addr(&d)
    );
    assert_eq!(
        s.get("secret/two").body["data"]["v"],
        "2",
        "data readable on the perf secondary"
    );

    // The old primary restarts, is demoted, and rejoins as a DR secondary by token.
    let dir = p.dir.clone();
    let extra = std::fs::read_to_string(dir.join("cairn.hcl")).expect("config");
    let extra = extra
        .split("api_addr")
        .nth(1)
        .and_then(|t| t.split_once('\n'))
        .map(|(_, r)| r.to_string())
        .unwrap_or_default();
    let mut old = start(&dir, &extra);
    old.root_token = p.root_token.clone();
    old.unseal_keys = p.unseal_keys.clone();
    old.unseal();
    ok(
        204,
        old.post("sys/replication/performance/primary/demote", json!({})),
        "demote perf",
    );
    ok(
        204,
        old.post("sys/replication/dr/primary/demote", json!({})),
        "demote dr",
    );
    let back = token(&d, "dr", "old-primary");
    let op = generate(
        &old,
        "sys/replication/dr/secondary/generate-operation-token",
        &keys,
    );
    ok(
        204,
        old.call_as(
            None,
            "POST",
            "sys/replication/dr/secondary/update-primary",
            Some(json!({"dr_operation_token": op, "token": back})),
        ),
        "update-primary by token",
    );
    ok(204, d.put("secret/three", json!({"v": "3"})), "write");
    wait_caught_up(
        "old primary to follow as DR secondary",
        30,
        &d,
        &old,
        "dr",
        "old-primary",
    );
    wait_caught_up("perf to catch up", 30, &d, &s, "performance", "perf");
    assert_eq!(
        status(&old, "dr")["merkle_root"],
        status(&d, "dr")["merkle_root"]
    );
}

#[test]
fn secondary_kept_away_past_retention_resyncs_by_merkle() {
    let p = licensed("rprim");
    let mut s = licensed("rsec");
    ok(
        204,
        p.post("sys/mounts/secret", json!({"type": "kv"})),
        "mount",
    );
    ok(
        200,
        p.post("sys/replication/performance/primary/enable", json!({})),
        "perf enable",
    );
    enable_secondary(&s, "performance", &token(&p, "performance", "r"));
    for i in 0..10 {
        ok(
            204,
            p.put(&format!("secret/k{i}"), json!({"v": i})),
            "write",
        );
    }
    wait_caught_up("catch up", 30, &p, &s, "performance", "r");
    // Stop the secondary, write well past the WAL retention (50 entries), restart it.
    let dir = s.dir.clone();
    s.kill9();
    for i in 0..120 {
        ok(
            204,
            p.put(&format!("secret/k{}", i % 40), json!({"v": i})),
            "write",
        );
    }
    ok(204, p.delete("secret/k3"), "delete");
    let extra = std::fs::read_to_string(dir.join("cairn.hcl")).expect("config");
    let extra = extra
        .split("api_addr")
        .nth(1)
        .and_then(|t| t.split_once('\n'))
        .map(|(_, r)| r.to_string())
        .unwrap_or_default();
    let mut s2 = start(&dir, &extra);
    // It unseals with the primary's key shares now.
    s2.unseal_keys = p.unseal_keys.clone();
    s2.unseal();
    wait_caught_up(
        "resync through Merkle diff/sync",
        60,
        &p,
        &s2,
        "performance",
        "r",
    );
    assert_eq!(
        status(&s2, "performance")["merkle_root"],
        status(&p, "performance")["merkle_root"]
    );
    s2.root_token = generate(&s2, "sys/generate-root", &p.unseal_keys);
    assert_eq!(s2.get("secret/k3").status, 404);
    assert_eq!(s2.get("secret/k39").body["data"]["v"], 119);
}

/// Writes `path` on the primary; returns the answer's `X-Vault-Index`.
fn put_for_index(p: &Server, path: &str, body: serde_json::Value) -> String {
    let r = cairn_tests::agent(Duration::from_secs(10))
        .put(&format!("{}/v1/{path}", p.addr))
        .header("X-Vault-Token", &p.root_token)
        .send_json(body)
        .expect("write");
    assert_eq!(r.status().as_u16(), 204);
    r.headers()
        .get("X-Vault-Index")
        .and_then(|v| v.to_str().ok())
        .expect("a write on a primary answers with X-Vault-Index")
        .to_string()
}

/// Reads `path` with `X-Vault-Index: state`: (status, body).
fn get_with_index(s: &Server, token: &str, path: &str, state: &str) -> (u16, String) {
    let mut r = cairn_tests::agent(Duration::from_secs(10))
        .get(&format!("{}/v1/{path}", s.addr))
        .header("X-Vault-Token", token)
        .header("X-Vault-Index", state)
        .call()
        .expect("read");
    let status = r.status().as_u16();
    (status, r.body_mut().read_to_string().unwrap_or_default())
}
