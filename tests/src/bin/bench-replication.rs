//! `bench-replication [SECONDS] [CLIENTS] [LAG_SAMPLES] [RATE] [RESYNC_KEYS]`: replication on
//! loopback between real `cairn` processes (SQLite, release build). Run through
//! `scripts/bench.sh replication`.
//!
//! * Baseline: the same KV writes on the primary with no secondary attached (replication
//!   disabled): sequential acknowledged-write latency, and `CLIENTS` concurrent writers.
//! * Replication lag: sequential writes on the primary; for each, the time from the
//!   acknowledgement to the moment the value is readable on the performance secondary
//!   (polled as fast as the secondary answers); p50/p99.
//! * WAL streaming throughput: `CLIENTS` concurrent writers for `SECONDS` with the secondary
//!   attached; entries/s = WAL entries written / time until the secondary's
//!   `last_remote_wal` reaches the primary's `last_wal` (and the write rate next to the
//!   baseline's).
//! * Lag at a steady write rate: paced writers targeting `RATE` writes/s in total for
//!   2 × `SECONDS`, with a performance and a DR secondary attached; every 10th write is
//!   sampled: ack → readable on the perf secondary, and ack → the DR secondary's
//!   `last_remote_wal` ≥ the write's own WAL index (the `X-Vault-Index` of its answer).
//! * Merkle resync: a separate primary/perf-secondary pair with `wal_max_entries = 100`;
//!   `RESYNC_KEYS` keys written and replicated, the secondary killed (-9), `RESYNC_KEYS` more
//!   keys written (well past the retention), the secondary restarted and unsealed; time until
//!   it is streaming again with equal Merkle roots, and cluster channel body bytes counted by
//!   the primary (`cairn_cluster_bytes_total`) during that time vs the changed data.

use cairn_core::replication::index_state::IndexState;
use cairn_tests::cluster::generate_root;
use cairn_tests::{free_port_pair, tmpdir, Server};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_tests::{TEST_ISSUER_KEY as ISSUER_KEY, TEST_LICENSE as LICENSE};

/// A licensed server (1 key share) on a port pair away from `avoid`; `tuning` is appended
/// to its configuration. Returns the server and its extra configuration (for restarts).
fn licensed_with(tag: &str, avoid: &[u16], tuning: &str) -> (Server, String) {
    let dir = tmpdir(tag);
    let lic = dir.join("license.json");
    std::fs::write(&lic, LICENSE).expect("write license");
    let extra = format!(
        "license_path = \"{}\"\nlicense_trusted_key = \"{ISSUER_KEY}\"\n{tuning}",
        lic.display()
    );
    let mut port = free_port_pair();
    while avoid.iter().any(|a| port.abs_diff(*a) <= 1) {
        port = free_port_pair();
    }
    let mut s = Server::with_config(&dir, port, &extra);
    s.init_unseal(1, 1);
    (s, extra)
}

fn licensed(tag: &str, avoid: &[u16]) -> Server {
    licensed_with(tag, avoid, "").0
}

fn agent() -> ureq::Agent {
    cairn_tests::agent(Duration::from_secs(10))
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn status(s: &Server) -> Value {
    status_of(s, "performance")
}

fn status_of(s: &Server, mode: &str) -> Value {
    s.call_as(None, "GET", &format!("sys/replication/{mode}/status"), None)
        .body["data"]
        .clone()
}

/// `last_wal` (primary) / `last_remote_wal` (secondary) from a status call with `a`.
fn wal_index(a: &ureq::Agent, addr: &str, mode: &str, field: &str) -> Option<u64> {
    let mut r = a
        .get(&format!("{addr}/v1/sys/replication/{mode}/status"))
        .call()
        .ok()?;
    let v: Value = r.body_mut().read_json().ok()?;
    v["data"][field].as_u64()
}

/// The WAL index of a write on the primary, from its `X-Vault-Index` answer header.
fn write_index(r: &ureq::http::Response<ureq::Body>) -> u64 {
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
fn cluster_bytes(s: &Server) -> (u64, u64) {
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

/// `n` writes of `value` under `secret/{prefix}/` by `threads` concurrent writers.
fn fill(s: &Server, prefix: &str, n: usize, threads: usize, value: &str) {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
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
                    let ok = a
                        .put(&format!("{addr}/v1/secret/{prefix}/{i}"))
                        .header("X-Vault-Token", &token)
                        .send_json(json!({ "value": value }))
                        .map(|r| r.status().as_u16() == 204)
                        .unwrap_or(false);
                    assert!(ok, "write {prefix}/{i}");
                }
            })
        })
        .collect();
    for h in hs {
        h.join().expect("fill writer");
    }
}

/// A sampled write: its path, when it was acknowledged, and its WAL index on the primary.
type Sample = (String, Instant, u64);

/// Result of the steady-rate phase.
struct Steady {
    rate: f64,
    elapsed: f64,
    errors: u64,
    ack: Vec<f64>,
    perf_lag: Vec<f64>,
    dr_lag: Vec<f64>,
}

/// Checker threads: each takes samples from `rx` and waits until `visible` says the sample
/// arrived; lags in ms.
fn checkers(
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

/// Paced writers (`rate` writes/s in total, 16 threads, fixed schedule) on `p` for `secs`;
/// every `every`-th write is sampled for lag on the perf secondary `s` (readable) and the
/// DR secondary `d` (`last_remote_wal`).
fn steady(p: &Server, s: &Server, d: &Server, rate: f64, secs: f64, every: u64) -> Steady {
    const WRITERS: u64 = 16;
    let (ptx, prx) = mpsc::channel::<Sample>();
    let (dtx, drx) = mpsc::channel::<Sample>();
    let (saddr, stoken) = (s.addr.clone(), s.root_token.clone());
    // Two checkers per secondary, each polling one sample at a time (samples are 10 ms
    // apart at 1,000 writes/s): a sample waits in the queue only while both checkers poll
    // older ones, which can only overstate its lag. (Eight checkers polling every 0.5 ms
    // loaded the 2-core machine with up to 16k requests/s and measured themselves.)
    let perf = checkers(2, prx, move |a, (path, _, _)| {
        a.get(&format!("{saddr}/v1/{path}"))
            .header("X-Vault-Token", &stoken)
            .call()
            .map(|r| r.status().as_u16() == 200)
            .unwrap_or(false)
    });
    let daddr = d.addr.clone();
    let dr = checkers(2, drx, move |a, (_, _, idx)| {
        wal_index(a, &daddr, "dr", "last_remote_wal").unwrap_or(0) >= *idx
    });
    let start = Instant::now();
    let per_writer = Duration::from_secs_f64(WRITERS as f64 / rate);
    let writers: Vec<_> = (0..WRITERS)
        .map(|t| {
            let (ptx, dtx) = (ptx.clone(), dtx.clone());
            let (addr, token) = (p.addr.clone(), p.root_token.clone());
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
                    let path = format!("secret/steady/{t}/{i}");
                    let t0 = Instant::now();
                    let answer = a
                        .put(&format!("{addr}/v1/{path}"))
                        .header("X-Vault-Token", &token)
                        .send_json(json!({"value": "x".repeat(64)}));
                    let acked = Instant::now();
                    let index = match &answer {
                        Ok(r) if r.status().as_u16() == 204 => Some(write_index(r)),
                        _ => None,
                    };
                    if let Some(idx) = index {
                        ack.push((acked - t0).as_secs_f64() * 1000.0);
                        if i % every == 0 {
                            // The perf checker looks for the path; the DR checker for the
                            // write's own WAL index (its X-Vault-Index): both start at once.
                            let _ = ptx.send((path.clone(), acked, 0));
                            let _ = dtx.send((path, acked, idx));
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
    drop((ptx, dtx));
    let (mut ack, mut errors) = (Vec::new(), 0);
    for h in writers {
        let (a, e) = h.join().expect("writer");
        ack.extend(a);
        errors += e;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let rate = ack.len() as f64 / elapsed;
    let join = |hs: Vec<std::thread::JoinHandle<Vec<f64>>>| {
        hs.into_iter()
            .flat_map(|h| h.join().expect("checker"))
            .collect::<Vec<_>>()
    };
    Steady {
        rate,
        elapsed,
        errors,
        ack,
        perf_lag: join(perf),
        dr_lag: join(dr),
    }
}

/// Result of the Merkle resync phase.
struct Resync {
    keys: usize,
    changed_bytes: u64,
    secs: f64,
    sent: u64,
    received: u64,
    /// Secondary states in order, with the primary's cluster bytes (sent + received since
    /// the restart) when each was first seen.
    states: Vec<(String, u64)>,
}

/// Merkle resync of a perf secondary kept away while `keys` keys changed (see the module
/// doc).
fn resync(keys: usize, clients: usize) -> Resync {
    const TUNING: &str = "replication {\n wal_max_entries = 100\n pull_wait_ms = 500\n}\n";
    let value = "v".repeat(100);
    let (p, _) = licensed_with("bench-resync-p", &[], TUNING);
    let (mut s, extra) = licensed_with("bench-resync-s", &[p.port], TUNING);
    assert_eq!(
        p.post("sys/mounts/secret", json!({"type": "kv"})).status,
        204
    );
    let r = p.post("sys/replication/performance/primary/enable", json!({}));
    assert!(r.status < 300, "enable: {:?}", r.body);
    let t = p.post(
        "sys/replication/performance/primary/secondary-token",
        json!({"id": "resync"}),
    );
    let tok = t.body["wrap_info"]["token"].as_str().expect("token");
    let r = s.post(
        "sys/replication/performance/secondary/enable",
        json!({ "token": tok }),
    );
    assert!(r.status < 300, "secondary enable: {:?}", r.body);
    let synced = |s: &Server| {
        let (ps, ss) = (status(&p), status(s));
        ss["state"] == "stream-wals"
            && ss["last_remote_wal"] == ps["last_wal"]
            && ss["merkle_root"] == ps["merkle_root"]
    };
    fill(&p, "base", keys, clients, &value);
    wait("initial sync", 300, || synced(&s));
    s.kill9();
    let (dir, port) = (s.dir.clone(), s.port);
    fill(&p, "changed", keys, clients, &value);
    let changed_bytes = (0..keys)
        .map(|i| {
            (format!("secret/changed/{i}").len() + json!({ "value": value }).to_string().len())
                as u64
        })
        .sum();
    let (sent0, recv0) = cluster_bytes(&p);
    let mut s2 = Server::with_config(&dir, port, &extra);
    s2.unseal_keys = p.unseal_keys.clone();
    let t0 = Instant::now();
    s2.unseal();
    let mut states: Vec<(String, u64)> = Vec::new();
    wait("resync", 600, || {
        let st = status(&s2)["state"].as_str().unwrap_or("").to_string();
        if states.last().map(|l| &l.0) != Some(&st) {
            let (sent, recv) = cluster_bytes(&p);
            states.push((st, sent + recv - sent0 - recv0));
        }
        synced(&s2)
    });
    let secs = t0.elapsed().as_secs_f64();
    let (sent1, recv1) = cluster_bytes(&p);
    let (pdir, sdir) = (p.dir.clone(), s2.dir.clone());
    drop(p);
    drop(s2);
    drop(s);
    let _ = std::fs::remove_dir_all(pdir);
    let _ = std::fs::remove_dir_all(sdir);
    Resync {
        keys,
        changed_bytes,
        secs,
        sent: sent1 - sent0,
        received: recv1 - recv0,
        states,
    }
}

fn put(a: &ureq::Agent, s: &Server, path: &str) -> bool {
    a.put(&format!("{}/v1/{path}", s.addr))
        .header("X-Vault-Token", &s.root_token)
        .send_json(json!({"value": "x".repeat(64)}))
        .map(|r| r.status().as_u16() == 204)
        .unwrap_or(false)
}

/// `n` sequential acknowledged writes; latencies in ms.
fn sequential_writes(s: &Server, prefix: &str, n: usize) -> Vec<f64> {
    let a = agent();
    (0..n)
        .map(|i| {
            let t0 = Instant::now();
            assert!(put(&a, s, &format!("secret/{prefix}/{i}")), "write");
            t0.elapsed().as_secs_f64() * 1000.0
        })
        .collect()
}

/// `clients` writers for `secs`: (writes/s, p50 ms, p99 ms, errors).
fn concurrent_writes(s: &Server, prefix: &str, clients: usize, secs: f64) -> (f64, f64, f64, u64) {
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
                        .send_json(json!({"value": "x".repeat(64)}))
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
    let p50 = percentile(&mut all, 0.5);
    let p99 = percentile(&mut all, 0.99);
    (rate, p50, p99, errs)
}

fn wait(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    panic!("timed out waiting for {what}");
}

fn main() {
    // The servers log at info unless told otherwise (a debug log measures the logger).
    if std::env::var_os("CAIRN_E2E_LOG_LEVEL").is_none() {
        std::env::set_var("CAIRN_E2E_LOG_LEVEL", "info");
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let secs: f64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let clients: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(16);
    let samples: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(300);
    let rate: f64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1000.0);
    let resync_keys: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(2000);

    let p = licensed("bench-repl-p", &[]);
    let mut s = licensed("bench-repl-s", &[p.port]);
    assert_eq!(
        p.post("sys/mounts/secret", json!({"type": "kv"})).status,
        204
    );

    // Warm-up (not measured), then the baseline: no secondary attached (replication
    // disabled on the primary).
    sequential_writes(&p, "warm", 100);
    eprintln!("baseline: {samples} sequential writes, then {clients} writers for {secs} s");
    let mut base_seq = sequential_writes(&p, "base-seq", samples);
    let base_conc = concurrent_writes(&p, "base", clients, secs);

    // Attach a performance secondary.
    eprintln!("attaching a performance secondary");
    let r = p.post("sys/replication/performance/primary/enable", json!({}));
    assert!(r.status < 300, "enable: {:?}", r.body);
    let t = p.post(
        "sys/replication/performance/primary/secondary-token",
        json!({"id": "bench"}),
    );
    let tok = t.body["wrap_info"]["token"]
        .as_str()
        .expect("token")
        .to_string();
    let r = s.post(
        "sys/replication/performance/secondary/enable",
        json!({ "token": tok }),
    );
    assert!(r.status < 300, "secondary enable: {:?}", r.body);
    wait("initial sync", 120, || {
        let (ps, ss) = (status(&p), status(&s));
        ss["state"] == "stream-wals" && ss["last_remote_wal"] == ps["last_wal"]
    });
    s.root_token = generate_root(&s, &p.unseal_keys);

    // Replication lag: acknowledged on the primary → readable on the secondary.
    eprintln!("replication lag: {samples} writes");
    let (pa, sa) = (agent(), agent());
    let mut ack = Vec::with_capacity(samples);
    let mut lag = Vec::with_capacity(samples);
    for i in 0..samples {
        let path = format!("secret/lag/{i}");
        let t0 = Instant::now();
        assert!(put(&pa, &p, &path), "write");
        let acked = Instant::now();
        ack.push((acked - t0).as_secs_f64() * 1000.0);
        loop {
            let st = sa
                .get(&format!("{}/v1/{path}", s.addr))
                .header("X-Vault-Token", &s.root_token)
                .call()
                .map(|r| r.status().as_u16())
                .unwrap_or(0);
            if st == 200 {
                break;
            }
            assert!(acked.elapsed() < Duration::from_secs(30), "lag over 30 s");
        }
        lag.push(acked.elapsed().as_secs_f64() * 1000.0);
    }

    // WAL streaming throughput under concurrent writes.
    eprintln!("streaming: {clients} writers for {secs} s, then until caught up");
    let wal0 = status(&p)["last_wal"].as_u64().unwrap_or(0);
    let t0 = Instant::now();
    let repl_conc = concurrent_writes(&p, "repl", clients, secs);
    let wal1 = status(&p)["last_wal"].as_u64().unwrap_or(0);
    wait("the secondary to catch up", 300, || {
        status(&s)["last_remote_wal"].as_u64().unwrap_or(0) >= wal1
    });
    let elapsed = t0.elapsed().as_secs_f64();
    let entries = wal1 - wal0;
    let ps = status(&p);
    let ss = status(&s);
    assert_eq!(ps["merkle_root"], ss["merkle_root"], "roots differ");

    // Attach a DR secondary too, then lag at a steady write rate on both.
    eprintln!("attaching a DR secondary");
    let mut d = licensed("bench-repl-d", &[p.port, s.port]);
    let r = p.post("sys/replication/dr/primary/enable", json!({}));
    assert!(r.status < 300, "dr enable: {:?}", r.body);
    let t = p.post(
        "sys/replication/dr/primary/secondary-token",
        json!({"id": "bench-dr"}),
    );
    let tok = t.body["wrap_info"]["token"]
        .as_str()
        .expect("dr token")
        .to_string();
    let r = d.post(
        "sys/replication/dr/secondary/enable",
        json!({ "token": tok }),
    );
    assert!(r.status < 300, "dr secondary enable: {:?}", r.body);
    d.unseal_keys = p.unseal_keys.clone();
    wait("DR initial sync", 300, || {
        let (ps, ds) = (status_of(&p, "dr"), status_of(&d, "dr"));
        ds["state"] == "stream-wals" && ds["last_remote_wal"] == ps["last_wal"]
    });
    let steady_secs = secs * 2.0;
    eprintln!("steady: {rate} writes/s for {steady_secs} s, perf + DR secondaries");
    let mut st = steady(&p, &s, &d, rate, steady_secs, 10);

    eprintln!("Merkle resync: {resync_keys} keys changed while the secondary was away");
    drop(d);
    let rs = resync(resync_keys, clients);

    println!("| measurement | rate (/s) | p50 (ms) | p99 (ms) | errors |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| baseline: sequential acknowledged writes, no secondary ({samples}) | {:.0} | {:.2} | {:.2} | 0 |",
        samples as f64 / (base_seq.iter().sum::<f64>() / 1000.0),
        percentile(&mut base_seq, 0.5),
        percentile(&mut base_seq, 0.99)
    );
    println!(
        "| sequential acknowledged writes, perf secondary attached ({samples}) | {:.0} | {:.2} | {:.2} | 0 |",
        samples as f64 / (ack.iter().sum::<f64>() / 1000.0),
        percentile(&mut ack, 0.5),
        percentile(&mut ack, 0.99)
    );
    println!(
        "| replication lag: ack on primary → readable on secondary ({samples}) | | {:.2} | {:.2} | 0 |",
        percentile(&mut lag, 0.5),
        percentile(&mut lag, 0.99)
    );
    println!(
        "| baseline: concurrent writes, no secondary, {clients} clients | {:.0} | {:.2} | {:.2} | {} |",
        base_conc.0, base_conc.1, base_conc.2, base_conc.3
    );
    println!(
        "| concurrent writes, perf secondary attached, {clients} clients | {:.0} | {:.2} | {:.2} | {} |",
        repl_conc.0, repl_conc.1, repl_conc.2, repl_conc.3
    );
    println!(
        "| WAL streaming to the secondary ({entries} entries in {elapsed:.2} s, until caught up) | {:.0} | | | |",
        entries as f64 / elapsed
    );
    println!(
        "| steady paced writes, perf + DR secondaries attached (target {rate:.0}/s; {} writes in {:.1} s) | {:.0} | {:.2} | {:.2} | {} |",
        st.ack.len(),
        st.elapsed,
        st.rate,
        percentile(&mut st.ack, 0.5),
        percentile(&mut st.ack, 0.99),
        st.errors
    );
    println!(
        "| lag at {:.0} writes/s: ack on primary → readable on perf secondary ({} sampled) | | {:.2} | {:.2} | |",
        st.rate,
        st.perf_lag.len(),
        percentile(&mut st.perf_lag, 0.5),
        percentile(&mut st.perf_lag, 0.99)
    );
    println!(
        "| lag at {:.0} writes/s: ack on primary → DR secondary's last_remote_wal ≥ the write's X-Vault-Index ({} sampled) | | {:.2} | {:.2} | |",
        st.rate,
        st.dr_lag.len(),
        percentile(&mut st.dr_lag, 0.5),
        percentile(&mut st.dr_lag, 0.99)
    );
    println!();
    let apply = entries as f64 / elapsed;
    println!(
        "write rate with a secondary / without = {:.2}x; streaming keeps up with writes: {:.2}x",
        repl_conc.0 / base_conc.0,
        apply / repl_conc.0.max(1.0)
    );
    println!(
        "max durable write rate: {:.0}/s without a secondary, {:.0}/s with one; secondary applies {apply:.0} entries/s = {:.2}x the primary's rate with it attached, {:.2}x its rate without",
        base_conc.0,
        repl_conc.0,
        apply / repl_conc.0.max(1.0),
        apply / base_conc.0.max(1.0)
    );
    println!();
    let total = rs.sent + rs.received;
    println!(
        "| Merkle resync ({} changed keys, {} unchanged) | value |",
        rs.keys, rs.keys
    );
    println!("|---|---:|");
    println!(
        "| time: unseal → streaming, roots equal | {:.2} s |",
        rs.secs
    );
    println!(
        "| cluster channel bytes (primary: sent {} + received {}) | {total} |",
        rs.sent, rs.received
    );
    println!(
        "| changed data (key path + JSON value, {} × {}) | {} |",
        rs.keys,
        rs.changed_bytes / rs.keys.max(1) as u64,
        rs.changed_bytes
    );
    println!(
        "| bytes / changed data | {:.2}x |",
        total as f64 / rs.changed_bytes.max(1) as f64
    );
    println!();
    println!(
        "secondary states seen during the resync (cluster bytes so far when first seen): {}",
        rs.states
            .iter()
            .map(|(s, b)| format!("{s} ({b})"))
            .collect::<Vec<_>>()
            .join(" → ")
    );
    let (pdir, sdir) = (p.dir.clone(), s.dir.clone());
    drop(p);
    drop(s);
    let _ = std::fs::remove_dir_all(pdir);
    let _ = std::fs::remove_dir_all(sdir);
}
