//! End-to-end: a snapshot save of a large store does not stop the server. The save's point is
//! fixed on the core thread and the file is written from a pinned read on a thread of its
//! own, so KV writes and reads sent while it streams are answered at once, and the file
//! restores to exactly its point: the writes acknowledged at or below its `X-Vault-Index`
//! are there, the ones after it are not.

use cairn_core::replication::index_state::IndexState;
use cairn_tests::{bulk, fresh_port_pair, tmpdir, Server, TEST_ISSUER_KEY, TEST_LICENSE};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SNAP: &str = "sys/storage/raft/snapshot";

/// Keys loaded before the save (`CAIRN_SNAPSHOT_LIVE_KEYS`): enough that the save takes
/// over a second on the test machines. The server is built with this test's profile, and
/// an optimized one saves about four times as fast.
fn key_count() -> u64 {
    std::env::var("CAIRN_SNAPSHOT_LIVE_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            250_000
        } else {
            1_000_000
        })
}

/// The bound on each request answered while the save streams, as a share of the save's
/// time: a liveness check, not a benchmark (a save on the core thread made them wait for the
/// whole save; on a loaded 2-core machine the save's own thread still takes CPU from them).
const LIVE_SHARE: u32 = 4;

fn raw(
    addr: &str,
    token: &str,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> (u16, Vec<u8>, Option<String>) {
    let r = cairn_tests::raw::call(addr, token, method, path, body, Duration::from_secs(300))
        .expect("answer");
    (r.status, r.body, r.index)
}

fn index_of(h: &Option<String>) -> u64 {
    let h = h.as_ref().expect("an X-Vault-Index");
    IndexState::decode(h).expect("X-Vault-Index").index
}

/// A probe's request: the key it wrote (with its WAL index) or read, when it was sent and
/// how long its answer took.
struct Probe {
    wrote: Option<(String, u64)>,
    sent: Instant,
    took: Duration,
}

#[test]
fn a_save_of_a_large_store_leaves_the_server_serving_and_restores_to_its_point() {
    let n = key_count();
    let dir = tmpdir("snap-live");
    let lic = dir.join("license.json");
    std::fs::write(&lic, TEST_LICENSE).expect("write license");
    let port = fresh_port_pair();
    let cfg = format!(
        "storage \"sqlite\" {{ path = \"{db}\" }}\nlistener \"tcp\" {{\n  address = \
         \"127.0.0.1:{port}\"\n  cluster_address = \"127.0.0.1:{cport}\"\n  tls_disable = true\n}}\n\
         max_request_size = {max}\napi_addr = \"http://127.0.0.1:{port}\"\n\
         license_path = \"{lic}\"\nlicense_trusted_key = \"{TEST_ISSUER_KEY}\"\n",
        db = dir.join("cairn.db").display(),
        cport = port + 1,
        max = 2u64 << 30,
        lic = lic.display(),
    );
    let cfg_path = dir.join("cairn.hcl");
    std::fs::write(&cfg_path, cfg).expect("write config");
    let api = format!("http://127.0.0.1:{port}");
    let mut s = Server::spawn_config(&cfg_path, &api).expect("server");
    s.wait_ready();
    s.init_unseal(1, 1);
    assert_eq!(
        s.post("sys/mounts/secret", json!({"type": "kv"})).status,
        204
    );
    let r = s.post("sys/replication/performance/primary/enable", json!({}));
    assert_eq!(r.status, 200, "{}", r.body);
    let uuid = bulk::mount_uuid(&s, "secret/");
    let (root, keys) = (s.root_token.clone(), s.unseal_keys.clone());
    s.terminate();
    let load = bulk::load(&dir.join("cairn.db"), &keys, &uuid, 0, n);
    eprintln!("{n} keys loaded in {load:.1} s");
    let mut s = Server::spawn_config(&cfg_path, &api).expect("server again");
    s.root_token = root;
    s.unseal_keys = keys;
    s.wait_ready();
    s.unseal();
    assert_eq!(s.put("secret/before", json!({"n": 0})).status, 204);

    // Probes: a write then a read, one after the other, from before the save until after it.
    let stop = Arc::new(AtomicBool::new(false));
    let probes = std::thread::spawn({
        let (addr, tok, stop) = (s.addr.clone(), s.root_token.clone(), stop.clone());
        move || {
            let mut done = Vec::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("secret/live/{i}");
                let body = serde_json::to_vec(&json!({ "n": i })).unwrap_or_default();
                let sent = Instant::now();
                let (status, _, ix) = raw(&addr, &tok, "PUT", &key, body);
                assert_eq!(status, 204, "{key}");
                done.push(Probe {
                    wrote: Some((key, index_of(&ix))),
                    sent,
                    took: sent.elapsed(),
                });
                let sent = Instant::now();
                let (status, _, _) = raw(&addr, &tok, "GET", "secret/before", Vec::new());
                assert_eq!(status, 200);
                done.push(Probe {
                    wrote: None,
                    sent,
                    took: sent.elapsed(),
                });
                i += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            done
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let (status, file, ix) = raw(&s.addr, &s.root_token, "GET", SNAP, Vec::new());
    let save = started.elapsed();
    let finished = started + save;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&file));
    let point = index_of(&ix);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let probes = probes.join().expect("probes");

    // Answered while the save streamed: sent after it started, answered before it ended.
    let during: Vec<&Probe> = probes
        .iter()
        .filter(|p| p.sent >= started && p.sent + p.took <= finished)
        .collect();
    let slowest = during.iter().map(|p| p.took).max().unwrap_or_default();
    eprintln!(
        "save of {n} keys: {} MiB in {:.2} s; {} requests answered meanwhile, slowest {} ms",
        file.len() >> 20,
        save.as_secs_f64(),
        during.len(),
        slowest.as_millis()
    );
    assert!(
        save >= Duration::from_secs(1),
        "the save took {save:?}: load more keys (CAIRN_SNAPSHOT_LIVE_KEYS) for the check to mean anything"
    );
    assert!(
        during.len() >= 10,
        "only {} requests were answered during a save of {save:?}: the save holds the server",
        during.len()
    );
    let bound = save / LIVE_SHARE;
    for p in during.iter().filter(|p| p.took >= bound) {
        eprintln!(
            "slow: {} ms, sent {} ms into the save",
            p.took.as_millis(),
            (p.sent - started).as_millis()
        );
    }
    assert!(
        slowest < bound,
        "a request answered during the save took {slowest:?} (bound: a quarter of the save, {bound:?})"
    );

    // The file restores to exactly its point.
    let (status, body, _) = raw(&s.addr, &s.root_token, "POST", SNAP, file);
    assert_eq!(status, 204, "restore: {}", String::from_utf8_lossy(&body));
    let written: Vec<&(String, u64)> = probes.iter().filter_map(|p| p.wrote.as_ref()).collect();
    let before = written.iter().filter(|(_, i)| *i <= point).count();
    assert!(
        before > 0 && before < written.len(),
        "{before} of {} before the point",
        written.len()
    );
    for (key, i) in &written {
        let r = s.get(key);
        match *i <= point {
            true => assert_eq!(r.status, 200, "{key} (index {i} <= {point}) missing"),
            false => assert_eq!(r.status, 404, "{key} (index {i} > {point}) present"),
        }
    }
    assert_eq!(s.get("secret/before").body["data"]["n"], json!(0));
    for i in [0, n / 2, n - 1] {
        let (_, path) = bulk::key("", i);
        let r = s.get(&path);
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.body["data"]["value"], json!(bulk::value(i)), "{path}");
    }
}
