//! What the replication benchmarks (`bench-replication`, `bench-growth-secondaries`,
//! `bench-growth-resync`) share: licensed servers on port pairs of their own, attaching a
//! performance secondary, status and metrics reads, concurrent and paced writers whose every
//! answer is checked, lag checkers, and the Merkle resync of a secondary kept away while
//! keys changed.

use crate::growth::wait;
use crate::{free_port_pair, tmpdir, Server, TEST_ISSUER_KEY, TEST_LICENSE};
use cairn_core::replication::index_state::IndexState;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// A licensed server (1 key share) on a port pair away from `avoid`; `tuning` is appended
/// to its configuration. Returns the server and its extra configuration (for restarts).
pub fn licensed_with(tag: &str, avoid: &[u16], tuning: &str) -> (Server, String) {
    let dir = tmpdir(tag);
    let lic = dir.join("license.json");
    std::fs::write(&lic, TEST_LICENSE).expect("write license");
    let extra = format!(
        "license_path = \"{}\"\nlicense_trusted_key = \"{TEST_ISSUER_KEY}\"\n{tuning}",
        lic.display()
    );
    let mut port = free_port_pair();
    while avoid.iter().any(|a| port.abs_diff(*a) <= 1) {
        port = free_port_pair();
    }
    let mut s = Server::with_config(&dir, port, &extra);
    // Removed when the server is dropped (it keeps it across restarts).
    s.own(dir);
    s.init_unseal(1, 1);
    (s, extra)
}

/// [`licensed_with`] without tuning.
pub fn licensed(tag: &str, avoid: &[u16]) -> Server {
    licensed_with(tag, avoid, "").0
}

/// An agent whose calls time out after 10 s.
pub fn agent() -> ureq::Agent {
    crate::agent(Duration::from_secs(10))
}

/// `sys/replication/performance/status`'s data.
pub fn status(s: &Server) -> Value {
    status_of(s, "performance")
}

/// `sys/replication/<mode>/status`'s data.
pub fn status_of(s: &Server, mode: &str) -> Value {
    s.call_as(None, "GET", &format!("sys/replication/{mode}/status"), None)
        .body["data"]
        .clone()
}

/// `last_wal` (primary) / `last_remote_wal` (secondary) from a status call with `a`.
pub fn wal_index(a: &ureq::Agent, addr: &str, mode: &str, field: &str) -> Option<u64> {
    let mut r = a
        .get(&format!("{addr}/v1/sys/replication/{mode}/status"))
        .call()
        .ok()?;
    let v: Value = r.body_mut().read_json().ok()?;
    v["data"][field].as_u64()
}

/// The WAL index of a write on the primary, from its `X-Vault-Index` answer header.
pub fn write_index(r: &ureq::http::Response<ureq::Body>) -> u64 {
    let h = r
        .headers()
        .get("X-Vault-Index")
        .and_then(|v| v.to_str().ok())
        .expect("a write on a primary answers with X-Vault-Index");
    IndexState::decode(h)
        .unwrap_or_else(|e| panic!("X-Vault-Index {h:?}: {e}"))
        .index
}

/// The primary's cluster channel body bytes (sent, received) from its Prometheus metrics.
pub fn cluster_bytes(s: &Server) -> (u64, u64) {
    let text = agent()
        .get(&format!("{}/v1/sys/metrics?format=prometheus", s.addr))
        .header("X-Vault-Token", &s.root_token)
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_to_string().ok())
        .unwrap_or_default();
    let read = |dir: &str| {
        let key = format!("cairn_cluster_bytes_total{{direction=\"{dir}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&key))
            .and_then(|v| v.trim().parse().ok())
            .expect("cairn_cluster_bytes_total in sys/metrics")
    };
    (read("sent"), read("received"))
}

/// Enables performance replication on `p` (once) and activates `s` as its secondary `id`.
pub fn attach_perf(p: &Server, s: &Server, id: &str) {
    if status(p)["mode"] != "primary" {
        let r = p.post("sys/replication/performance/primary/enable", json!({}));
        assert!(r.status < 300, "enable: {:?}", r.body);
    }
    let t = p.post(
        "sys/replication/performance/primary/secondary-token",
        json!({ "id": id }),
    );
    let tok = t.body["wrap_info"]["token"]
        .as_str()
        .unwrap_or_else(|| panic!("secondary token: {}", t.body));
    let r = s.post(
        "sys/replication/performance/secondary/enable",
        json!({ "token": tok }),
    );
    assert!(r.status < 300, "secondary enable: {:?}", r.body);
}

/// Whether the perf secondary `s` streams, has applied the primary's last WAL entry and
/// holds the same Merkle root.
pub fn synced(p: &Server, s: &Server) -> bool {
    let (ps, ss) = (status(p), status(s));
    ss["state"] == "stream-wals"
        && ss["last_remote_wal"] == ps["last_wal"]
        && ss["merkle_root"] == ps["merkle_root"]
}

/// The KV v1 body every benchmark write sends.
pub fn body(value: &str) -> Value {
    json!({ "value": value })
}

/// One write of `value` at `path` (under `/v1/`); whether it answered 204.
pub fn put(a: &ureq::Agent, s: &Server, path: &str, value: &str) -> bool {
    a.put(&format!("{}/v1/{path}", s.addr))
        .header("X-Vault-Token", &s.root_token)
        .send_json(body(value))
        .map(|r| r.status().as_u16() == 204)
        .unwrap_or(false)
}

/// Whether `path` reads back on `s` (with `token`) holding `value`.
pub fn reads_back(a: &ureq::Agent, addr: &str, token: &str, path: &str, value: &str) -> bool {
    a.get(&format!("{addr}/v1/{path}"))
        .header("X-Vault-Token", token)
        .call()
        .ok()
        .filter(|r| r.status().as_u16() == 200)
        .and_then(|mut r| r.body_mut().read_json::<Value>().ok())
        .is_some_and(|v| v["data"]["value"] == value)
}

/// `n` writes of `value` under `secret/{prefix}/` by `threads` concurrent writers; every one
/// must be acknowledged.
pub fn fill(s: &Server, prefix: &str, n: usize, threads: usize, value: &str) {
    let next = Arc::new(AtomicUsize::new(0));
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let next = next.clone();
            let (addr, token) = (s.addr.clone(), s.root_token.clone());
            let (prefix, value) = (prefix.to_string(), value.to_string());
            std::thread::spawn(move || {
                let a = agent();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let answer = a
                        .put(&format!("{addr}/v1/secret/{prefix}/{i}"))
                        .header("X-Vault-Token", &token)
                        .send_json(body(&value));
                    match answer {
                        Ok(r) if r.status().as_u16() == 204 => {}
                        Ok(mut r) => panic!(
                            "write {prefix}/{i}: {} {}",
                            r.status(),
                            r.body_mut().read_to_string().unwrap_or_default()
                        ),
                        Err(e) => panic!("write {prefix}/{i}: {e}"),
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().expect("fill writer");
    }
}

/// What `clients` writers measured: writes/s, p50 ms, p99 ms, failed writes.
pub type WriteRate = (f64, f64, f64, u64);

/// `clients` writers of 64-byte values for `secs`; a write counts only when acknowledged
/// with 204, anything else is an error.
pub fn concurrent_writes(s: &Server, prefix: &str, clients: usize, secs: f64) -> WriteRate {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|t| {
            let stop = stop.clone();
            let (addr, token, prefix) = (s.addr.clone(), s.root_token.clone(), prefix.to_string());
            std::thread::spawn(move || {
                let a = agent();
                let (mut lat, mut errs, mut i) = (Vec::new(), 0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    let ok = a
                        .put(&format!("{addr}/v1/secret/{prefix}/{t}/{i}"))
                        .header("X-Vault-Token", &token)
                        .send_json(body(&"x".repeat(64)))
                        .map(|r| r.status().as_u16() == 204)
                        .unwrap_or(false);
                    if ok {
                        lat.push(t0.elapsed().as_secs_f64() * 1000.0);
                    } else {
                        errs += 1;
                    }
                    i += 1;
                }
                (lat, errs)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let (mut all, mut errs) = (Vec::new(), 0);
    for h in handles {
        let (l, e) = h.join().expect("writer");
        all.extend(l);
        errs += e;
    }
    let rate = all.len() as f64 / start.elapsed().as_secs_f64();
    let p50 = crate::growth::percentile(&mut all, 0.5);
    let p99 = crate::growth::percentile(&mut all, 0.99);
    (rate, p50, p99, errs)
}

/// A sampled write: its path, when it was acknowledged, and its WAL index on the primary.
pub type Sample = (String, Instant, u64);

/// Checker threads: each takes samples from `rx` and waits until `visible` says the sample
/// arrived; lags in ms. A sample not visible after 30 s fails the benchmark.
pub fn checkers(
    n: usize,
    rx: mpsc::Receiver<Sample>,
    visible: impl Fn(&ureq::Agent, &Sample) -> bool + Send + Sync + 'static,
) -> Vec<std::thread::JoinHandle<Vec<f64>>> {
    let rx = Arc::new(Mutex::new(rx));
    let visible = Arc::new(visible);
    (0..n)
        .map(|_| {
            let (rx, visible) = (rx.clone(), visible.clone());
            std::thread::spawn(move || {
                let a = agent();
                let mut lags = Vec::new();
                loop {
                    let next = rx.lock().expect("sample queue").recv();
                    let Ok(sample) = next else { break };
                    while !visible(&a, &sample) {
                        assert!(
                            sample.1.elapsed() < Duration::from_secs(30),
                            "lag over 30 s"
                        );
                        // Do not hammer the secondary (that would be the lag measured):
                        // a poll a millisecond per checker.
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    lags.push(sample.1.elapsed().as_secs_f64() * 1000.0);
                }
                lags
            })
        })
        .collect()
}

/// Joins checker threads; all their lags.
pub fn join_lags(hs: Vec<std::thread::JoinHandle<Vec<f64>>>) -> Vec<f64> {
    hs.into_iter()
        .flat_map(|h| h.join().expect("checker"))
        .collect()
}

/// What paced writers measured.
pub struct Paced {
    /// Acknowledged writes per second reached.
    pub rate: f64,
    pub elapsed: f64,
    /// Writes not acknowledged with 204.
    pub errors: u64,
    /// Acknowledgement latencies (ms).
    pub ack: Vec<f64>,
}

/// Paced writers (`rate` writes/s in total, 16 threads on a fixed schedule) of 64-byte
/// values under `secret/{prefix}/` on `p` for `secs`; every `every`-th acknowledged write is
/// sent to each of `sinks` (for lag checkers).
pub fn paced(
    p: &Server,
    prefix: &str,
    rate: f64,
    secs: f64,
    every: u64,
    sinks: Vec<mpsc::Sender<Sample>>,
) -> Paced {
    const WRITERS: u64 = 16;
    let start = Instant::now();
    let per_writer = Duration::from_secs_f64(WRITERS as f64 / rate);
    let writers: Vec<_> = (0..WRITERS)
        .map(|t| {
            let sinks = sinks.clone();
            let (addr, token, prefix) = (p.addr.clone(), p.root_token.clone(), prefix.to_string());
            std::thread::spawn(move || {
                let a = agent();
                let offset = per_writer.mul_f64(t as f64 / WRITERS as f64);
                let (mut ack, mut errs, mut i) = (Vec::new(), 0u64, 0u64);
                loop {
                    let due = start + offset + per_writer.mul_f64(i as f64);
                    if due.duration_since(start).as_secs_f64() >= secs {
                        break;
                    }
                    if let Some(w) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(w);
                    }
                    let path = format!("secret/{prefix}/{t}/{i}");
                    let t0 = Instant::now();
                    let answer = a
                        .put(&format!("{addr}/v1/{path}"))
                        .header("X-Vault-Token", &token)
                        .send_json(body(&"x".repeat(64)));
                    let acked = Instant::now();
                    let index = match &answer {
                        // No index when replication is not enabled (no sinks then).
                        Ok(r) if r.status().as_u16() == 204 && sinks.is_empty() => Some(0),
                        Ok(r) if r.status().as_u16() == 204 => Some(write_index(r)),
                        _ => None,
                    };
                    if let Some(idx) = index {
                        ack.push((acked - t0).as_secs_f64() * 1000.0);
                        if i % every == 0 {
                            // Every checker starts on the sample at once.
                            for s in &sinks {
                                let _ = s.send((path.clone(), acked, idx));
                            }
                        }
                    } else {
                        errs += 1;
                    }
                    i += 1;
                }
                (ack, errs)
            })
        })
        .collect();
    drop(sinks);
    let (mut ack, mut errors) = (Vec::new(), 0);
    for h in writers {
        let (a, e) = h.join().expect("writer");
        ack.extend(a);
        errors += e;
    }
    let elapsed = start.elapsed().as_secs_f64();
    Paced {
        rate: ack.len() as f64 / elapsed,
        elapsed,
        errors,
        ack,
    }
}

/// Result of a Merkle resync.
pub struct Resync {
    pub keys: usize,
    pub changed_bytes: u64,
    /// Unseal → streaming with equal roots.
    pub secs: f64,
    pub sent: u64,
    pub received: u64,
    /// Secondary states in order, with the primary's cluster bytes (sent + received since
    /// the restart) when each was first seen.
    pub states: Vec<(String, u64)>,
    /// How long the primary took to accept the changed keys (`clients` writers).
    pub write_secs: f64,
    /// Changed keys read back on the secondary afterwards with the wrong value or none.
    pub wrong: u64,
}

impl Resync {
    /// Cluster channel bytes in both directions.
    pub fn bytes(&self) -> u64 {
        self.sent + self.received
    }
}

/// The key path and JSON body of `keys` writes of `value` under `secret/{prefix}/`: the
/// changed data a resync has to carry.
pub fn data_bytes(prefix: &str, keys: usize, value: &str) -> u64 {
    let body = body(value).to_string().len();
    (0..keys)
        .map(|i| (format!("secret/{prefix}/{i}").len() + body) as u64)
        .sum()
}

/// The perf secondary `s` of `p` (synced) is killed (-9); `keys` keys of `value` are written
/// under `secret/{prefix}/` (past the WAL retention the caller configured); the secondary
/// is restarted and unsealed, and the resync is timed until it streams with equal roots.
/// Then `check` of the changed keys (spread over them) are read back on the secondary.
#[allow(clippy::too_many_arguments)]
pub fn resync_after(
    p: &Server,
    s: &mut Server,
    prefix: &str,
    keys: usize,
    value: &str,
    clients: usize,
    check: usize,
) -> Resync {
    wait("the secondary in sync", 1800, || synced(p, s));
    let token = s.root_token.clone();
    s.kill9();
    let t = Instant::now();
    fill(p, prefix, keys, clients, value);
    let write_secs = t.elapsed().as_secs_f64();
    let (sent0, recv0) = cluster_bytes(p);
    s.restart();
    s.unseal_keys = p.unseal_keys.clone();
    let t0 = Instant::now();
    s.unseal();
    let mut states: Vec<(String, u64)> = Vec::new();
    wait("resync", 1800, || {
        let st = status(s)["state"].as_str().unwrap_or("").to_string();
        if states.last().map(|l| &l.0) != Some(&st) {
            let (sent, recv) = cluster_bytes(p);
            states.push((st, sent + recv - sent0 - recv0));
        }
        synced(p, s)
    });
    let secs = t0.elapsed().as_secs_f64();
    let (sent1, recv1) = cluster_bytes(p);
    let a = agent();
    let step = (keys / check.max(1)).max(1);
    let wrong = (0..keys)
        .step_by(step)
        .filter(|i| !reads_back(&a, &s.addr, &token, &format!("secret/{prefix}/{i}"), value))
        .count() as u64;
    Resync {
        keys,
        changed_bytes: data_bytes(prefix, keys, value),
        secs,
        sent: sent1 - sent0,
        received: recv1 - recv0,
        states,
        write_secs,
        wrong,
    }
}
