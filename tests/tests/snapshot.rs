//! End-to-end: snapshots (`sys/storage/raft/snapshot`, `cairn operator snapshot`) on real
//! processes. A snapshot taken while writers run holds exactly the writes acknowledged with
//! an `X-Vault-Index` at or below the index its answer names, on SQLite and on PostgreSQL;
//! a restored replication primary's performance and DR secondaries converge on their own;
//! bad files are refused and change nothing.

use cairn_core::replication::index_state::IndexState;
use cairn_tests::cluster::{self, caught_up, enable_secondary, licensed, status, token, wait_for};
use cairn_tests::raw::{self, Raw};
use cairn_tests::{
    cairn_bin, fresh_port_pair, note_secret, start_dev_directory, tmpdir, Server, TEST_ISSUER_KEY,
    TEST_LICENSE,
};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SNAP: &str = "sys/storage/raft/snapshot";

fn call_raw(addr: &str, token: &str, method: &str, path: &str, body: Vec<u8>) -> Option<Raw> {
    raw::call(addr, token, method, path, body, Duration::from_secs(120))
}

fn save(s: &Server) -> (Vec<u8>, Option<u64>) {
    let r = call_raw(&s.addr, &s.root_token, "GET", SNAP, Vec::new()).expect("snapshot answer");
    assert_eq!(r.status, 200, "save: {}", r.errors());
    let index = r
        .index
        .map(|i| IndexState::decode(&i).expect("X-Vault-Index").index);
    (r.body, index)
}

fn restore(s: &Server, file: &[u8]) -> Raw {
    call_raw(&s.addr, &s.root_token, "POST", SNAP, file.to_vec()).expect("restore answer")
}

/// Writers putting `secret/w<t>/<n>` one after the other, each write's WAL index noted from
/// its `X-Vault-Index`, until `stop`.
fn writers(
    s: &Server,
    n: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<Vec<(String, u64)>>> {
    (0..n)
        .map(|t| {
            let (addr, tok, stop) = (s.addr.clone(), s.root_token.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("secret/w{t}/{i}");
                    let body = serde_json::to_vec(&json!({ "n": i })).unwrap_or_default();
                    if let Some(r) = call_raw(&addr, &tok, "PUT", &key, body) {
                        assert_eq!(r.status, 204, "{key}: {}", r.errors());
                        let ix = r.index.expect("a primary's write names its WAL index");
                        acked.push((key, IndexState::decode(&ix).expect("index").index));
                    }
                    i += 1;
                }
                acked
            })
        })
        .collect()
}

/// Takes a snapshot while writers run, lets them go on, restores it, and checks that every
/// acknowledged write at or below the snapshot's index is there and none above it.
fn exact_under_load(s: &Server) {
    assert_eq!(
        s.post("sys/mounts/secret", json!({"type": "kv"})).status,
        204
    );
    ok_status(
        s.post("sys/replication/performance/primary/enable", json!({})),
        200,
    );
    assert_eq!(s.put("secret/before", json!({"n": 0})).status, 204);
    let stop = Arc::new(AtomicBool::new(false));
    let ws = writers(s, 4, &stop);
    std::thread::sleep(Duration::from_millis(1_500));
    let (file, index) = save(s);
    let index = index.expect("a primary's snapshot names its WAL index");
    std::thread::sleep(Duration::from_millis(1_500));
    stop.store(true, Ordering::Relaxed);
    let acked: Vec<(String, u64)> = ws
        .into_iter()
        .flat_map(|w| w.join().expect("writer"))
        .collect();
    let before = acked.iter().filter(|(_, i)| *i <= index).count();
    let after = acked.len() - before;
    assert!(
        before > 0 && after > 0,
        "{before} writes before, {after} after"
    );
    let r = restore(s, &file);
    assert_eq!(r.status, 204, "restore: {}", r.errors());
    for (key, i) in &acked {
        let n: u64 = key
            .rsplit('/')
            .next()
            .and_then(|n| n.parse().ok())
            .expect("n");
        let r = s.get(key);
        if *i <= index {
            assert_eq!(r.status, 200, "{key} (index {i} <= {index}) missing");
            assert_eq!(r.body["data"]["n"], json!(n));
        } else {
            assert_eq!(r.status, 404, "{key} (index {i} > {index}) present");
        }
    }
    // Nothing else: each writer's keys are exactly those acknowledged before the point.
    for t in 0..4 {
        let want = acked
            .iter()
            .filter(|(k, i)| *i <= index && k.starts_with(&format!("secret/w{t}/")))
            .count();
        let r = s.list(&format!("secret/w{t}/"));
        let got = r.body["data"]["keys"].as_array().map_or(0, Vec::len);
        assert_eq!(got, want, "writer {t}: {}", r.body);
    }
    assert_eq!(s.get("secret/before").body["data"]["n"], json!(0));
    // The restored node goes on: writes and their indices continue.
    assert_eq!(s.put("secret/later", json!({"n": 1})).status, 204);
    eprintln!(
        "snapshot of {} bytes at index {index}: {before} acknowledged writes before, {after} after",
        file.len()
    );
}

#[track_caller]
fn ok_status(r: cairn_tests::Resp, want: u16) -> Value {
    assert_eq!(r.status, want, "{}", r.body);
    r.body
}

#[test]
fn a_snapshot_under_write_load_holds_exactly_the_writes_before_its_index() {
    let s = licensed("snap-load");
    exact_under_load(&s);
}

#[test]
fn a_snapshot_on_postgres_holds_exactly_the_writes_before_its_index() {
    let dir = tmpdir("snap-pg");
    let pg_dir = std::env::temp_dir().join(format!("cairn-e2e-snap-pg-{}", std::process::id()));
    let env = start_dev_directory("dev-postgres.sh", &pg_dir, "CAIRN_PG_WATCH_PID");
    note_secret(&env["CAIRN_PG_PASSWORD"]);
    let lic = dir.join("license.json");
    std::fs::write(&lic, TEST_LICENSE).expect("write license");
    let port = fresh_port_pair();
    let cfg = format!(
        "storage \"postgresql\" {{\n  connection_url = \"{url}\"\n  ha_enabled = false\n  \
         table = \"cairn_snap_kv\"\n}}\nlistener \"tcp\" {{\n  address = \"127.0.0.1:{port}\"\n  \
         cluster_address = \"127.0.0.1:{cport}\"\n  tls_disable = true\n}}\n\
         api_addr = \"http://127.0.0.1:{port}\"\n\
         license_path = \"{lic}\"\nlicense_trusted_key = \"{TEST_ISSUER_KEY}\"\n{tuning}",
        url = env["CAIRN_PG_URL"],
        cport = port + 1,
        lic = lic.display(),
        tuning = cluster::TUNING,
    );
    let path = dir.join("cairn.hcl");
    std::fs::write(&path, cfg).expect("write config");
    let mut s = Server::spawn_config(&path, &format!("http://127.0.0.1:{port}"))
        .unwrap_or_else(|e| panic!("start: {e}"));
    s.wait_ready();
    s.init_unseal(1, 1);
    exact_under_load(&s);
}

#[test]
fn a_restored_primary_brings_its_secondaries_back_by_merkle_sync() {
    let p = licensed("snap-p");
    let perf = licensed("snap-perf");
    let dr = licensed("snap-dr");
    assert_eq!(
        p.post("sys/mounts/secret", json!({"type": "kv"})).status,
        204
    );
    for i in 0..10 {
        assert_eq!(p.put(&format!("secret/k{i}"), json!({"v": i})).status, 204);
    }
    ok_status(
        p.post("sys/replication/performance/primary/enable", json!({})),
        200,
    );
    ok_status(p.post("sys/replication/dr/primary/enable", json!({})), 200);
    enable_secondary(&perf, "performance", &token(&p, "performance", "perf"));
    enable_secondary(&dr, "dr", &token(&p, "dr", "dr"));
    wait_for("secondaries caught up", 60, || {
        caught_up(&p, &perf, "performance", "perf") && caught_up(&p, &dr, "dr", "dr")
    });
    let (file, _) = save(&p);
    let roots_at_snapshot = (
        status(&p, "performance")["merkle_root"].clone(),
        status(&p, "dr")["merkle_root"].clone(),
    );
    // Writes after the snapshot reach both secondaries ...
    for i in 0..10 {
        assert_eq!(
            p.put(&format!("secret/k{i}"), json!({"v": i + 100})).status,
            204
        );
        assert_eq!(
            p.put(&format!("secret/late{i}"), json!({"v": i})).status,
            204
        );
    }
    wait_for("secondaries caught up with the later writes", 60, || {
        caught_up(&p, &perf, "performance", "perf") && caught_up(&p, &dr, "dr", "dr")
    });
    let diffs_before = status(&perf, "performance")["merkle_diffs"]
        .as_u64()
        .unwrap_or(0);
    // ... and go away again with the restore, on the primary and on its secondaries.
    let r = restore(&p, &file);
    assert_eq!(r.status, 204, "restore: {}", r.errors());
    assert_eq!(
        status(&p, "performance")["merkle_root"],
        roots_at_snapshot.0
    );
    assert_eq!(status(&p, "dr")["merkle_root"], roots_at_snapshot.1);
    wait_for("secondaries converged on the restored primary", 60, || {
        caught_up(&p, &perf, "performance", "perf") && caught_up(&p, &dr, "dr", "dr")
    });
    assert_eq!(status(&dr, "dr")["merkle_root"], roots_at_snapshot.1);
    assert!(
        status(&perf, "performance")["merkle_diffs"]
            .as_u64()
            .unwrap_or(0)
            > diffs_before,
        "the secondary compared trees"
    );
    // The data itself, on the performance secondary.
    let st = cluster::generate_root(&perf, &p.unseal_keys);
    note_secret(&st);
    let r = perf.call_as(Some(&st), "GET", "secret/k3", None);
    assert_eq!(r.body["data"]["v"], json!(3), "{}", r.body);
    assert_eq!(
        perf.call_as(Some(&st), "GET", "secret/late3", None).status,
        404
    );
    // Streaming goes on.
    assert_eq!(p.put("secret/after", json!({"v": 1})).status, 204);
    wait_for("the next write replicated", 30, || {
        perf.call_as(Some(&st), "GET", "secret/after", None).status == 200
    });
}

/// Runs the CLI with the server's address and token; (exit code, stdout, stderr).
fn cli(s: &Server, args: &[&str]) -> (i32, String, String) {
    let home = tmpdir("snap-cli-home");
    let out = std::process::Command::new(cairn_bin())
        .args(args)
        .env("CAIRN_ADDR", &s.addr)
        .env("CAIRN_TOKEN", &s.root_token)
        .env("HOME", home.path())
        .output()
        .expect("run cairn");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Everything a client sees of the data: the keys and values of `secret/`, the policies.
fn visible(s: &Server) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let keys = s.list("secret/").body["data"]["keys"].clone();
    for k in keys.as_array().into_iter().flatten() {
        let k = k.as_str().unwrap_or_default();
        out.insert(
            format!("secret/{k}"),
            s.get(&format!("secret/{k}")).body["data"].clone(),
        );
    }
    out.insert(
        "policies".into(),
        s.list("sys/policies/acl").body["data"].clone(),
    );
    out
}

#[test]
fn the_cli_saves_and_restores_and_bad_files_change_nothing() {
    let s = Server::dev();
    let other = Server::dev();
    let dir = tmpdir("snap-cli");
    let file = dir.join("backup.snap");
    let f = file.to_str().expect("path");
    assert_eq!(s.put("secret/a", json!({"v": 1})).status, 204);
    let (code, out, err) = cli(&s, &["operator", "snapshot", "save", f]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Snapshot saved"), "{out}");
    let good = std::fs::read(&file).expect("snapshot file");
    assert!(
        !String::from_utf8_lossy(&good).contains("\"v\":1"),
        "values are encrypted"
    );
    assert_eq!(s.put("secret/a", json!({"v": 2})).status, 204);
    assert_eq!(s.put("secret/b", json!({"v": 3})).status, 204);
    let changed = visible(&s);

    let (foreign, _) = save(&other);
    let mut flipped = good.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 1;
    let mut version = good.clone();
    version[9] = 7;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated", good[..good.len() - 100].to_vec(), "truncated"),
        ("corrupted", flipped, "checksum"),
        ("version", version, "format version 7"),
        ("foreign", foreign, "another cluster"),
        ("not a snapshot", b"hello".to_vec(), "not a Cairn snapshot"),
    ];
    for (name, bytes, want) in cases {
        let r = restore(&s, &bytes);
        assert_eq!(r.status, 400, "{name}: {}", r.errors());
        let body: Value = serde_json::from_slice(&r.body).expect("error envelope");
        let msg = body["errors"][0].as_str().unwrap_or_default().to_string();
        assert!(msg.contains(want), "{name}: {msg}");
        assert_eq!(visible(&s), changed, "{name} changed data");
    }
    // The CLI reports a refusal with the server's message and exit 2.
    let bad = dir.join("bad.snap");
    std::fs::write(&bad, &good[..40]).expect("write");
    let (code, _, err) = cli(
        &s,
        &[
            "operator",
            "snapshot",
            "restore",
            bad.to_str().expect("path"),
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("truncated"), "{err}");
    // Without sudo: refused.
    let t = s
        .post("auth/token/create", json!({"policies": ["default"]}))
        .body["auth"]["client_token"]
        .as_str()
        .expect("token")
        .to_string();
    let r = call_raw(&s.addr, &t, "GET", SNAP, Vec::new()).expect("answer");
    assert_eq!(r.status, 403);

    let (code, out, err) = cli(&s, &["operator", "snapshot", "restore", f]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(s.get("secret/a").body["data"]["v"], json!(1));
    assert_eq!(s.get("secret/b").status, 404);
}

/// The restore body is read before the request is authorized, so it is bounded by the
/// listener's `max_request_size` like any other: a caller without a token announcing a huge
/// file is answered 413 at once, the server reading none of it.
#[test]
fn a_restore_larger_than_max_request_size_is_refused_before_it_is_read() {
    use std::io::{Read, Write};
    let s = Server::dev();
    let host = s.addr.trim_start_matches("http://").to_string();
    let mut c = std::net::TcpStream::connect(&host).expect("connect");
    c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    let head = format!(
        "POST /v1/sys/storage/raft/snapshot HTTP/1.1\r\nHost: {host}\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        4u64 << 30
    );
    c.write_all(head.as_bytes()).expect("head");
    c.write_all(&[0u8; 4096]).expect("a little of the body");
    let mut answer = vec![0u8; 4096];
    let n = c.read(&mut answer).expect("an answer without the body");
    let text = String::from_utf8_lossy(&answer[..n]).to_string();
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("max_request_size"), "{text}");
    // The server is fine.
    assert_eq!(s.get("sys/health").status, 200);
}
