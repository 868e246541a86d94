//! `bench-reindex [KEYS] [READERS]`: how long a reindex of KEYS stored keys takes on a real
//! `cairn` process (SQLite), its keys/s next to a raw SQLite scan of the same rows, and the
//! API read latency (p50/p99) while the reindex runs next to the same reads when idle, all
//! in one run. Run through `scripts/bench.sh reindex`.
//!
//! The keys are inserted straight into the stopped server's SQLite file under a KV mount's
//! data prefix (as data restored behind the server's back would be), so the reindex has to
//! rebuild the trees over all of them.

use cairn_tests::{free_port_pair, tmpdir, Server};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Readers of one hot key until `stop`; returns latencies (ms) and errors.
fn readers(
    addr: &str,
    token: &str,
    n: usize,
    stop: Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<(Vec<f64>, u64)>> {
    (0..n)
        .map(|_| {
            let (addr, token, stop) = (addr.to_string(), token.to_string(), stop.clone());
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(30)))
                    .build()
                    .into();
                let (mut lat, mut errs) = (Vec::new(), 0u64);
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    let ok = agent
                        .get(&format!("{addr}/v1/secret/hot"))
                        .header("X-Vault-Token", &token)
                        .call()
                        .map(|mut r| {
                            r.status().as_u16() == 200 && r.body_mut().read_to_vec().is_ok()
                        })
                        .unwrap_or(false);
                    if ok {
                        lat.push(t0.elapsed().as_secs_f64() * 1000.0);
                    } else {
                        errs += 1;
                    }
                }
                (lat, errs)
            })
        })
        .collect()
}

fn collect(hs: Vec<std::thread::JoinHandle<(Vec<f64>, u64)>>) -> (Vec<f64>, u64) {
    let mut all = Vec::new();
    let mut errs = 0;
    for h in hs {
        let (l, e) = h.join().expect("reader thread");
        all.extend(l);
        errs += e;
    }
    (all, errs)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let keys: u64 = args
        .first()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let nreaders: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(2);

    let dir = tmpdir("bench-reindex");
    let port = free_port_pair();
    let mut s = Server::with_config(&dir, port, "hosted = true");
    s.init_unseal(1, 1);
    assert!(s.post("sys/mounts/secret", json!({"type": "kv"})).status < 300);
    assert!(s.put("secret/hot", json!({"v": "x".repeat(64)})).status < 300);
    let mounts = s.get("sys/mounts");
    let uuid = mounts.body["data"]["secret/"]["uuid"]
        .as_str()
        .or_else(|| mounts.body["secret/"]["uuid"].as_str())
        .expect("mount uuid")
        .to_string();
    let (keys_before, token) = (s.unseal_keys.clone(), s.root_token.clone());
    s.kill9();

    // Insert the keys behind the server's back, then time a raw scan of them (baseline).
    let db = dir.join("cairn.db");
    let t = Instant::now();
    {
        let mut c = rusqlite::Connection::open(&db).expect("open db");
        let tx = c.transaction().expect("tx");
        {
            let mut st = tx
                .prepare("INSERT OR REPLACE INTO kv (key, value) VALUES (?1, ?2)")
                .expect("prepare");
            let mut v = vec![0u8; 128];
            for i in 0..keys {
                v[..8].copy_from_slice(&i.to_be_bytes());
                st.execute(rusqlite::params![
                    format!("logical/{uuid}/bench/{i:09}").as_bytes(),
                    v
                ])
                .expect("insert");
            }
        }
        tx.commit().expect("commit");
    }
    eprintln!("inserted {keys} keys in {:.1} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let scanned = {
        let c = rusqlite::Connection::open(&db).expect("open db");
        let mut st = c
            .prepare("SELECT key, value FROM kv ORDER BY key")
            .expect("prepare");
        let mut rows = st.query([]).expect("query");
        let mut n = 0u64;
        let mut bytes = 0usize;
        while let Ok(Some(r)) = rows.next() {
            let k: Vec<u8> = r.get(0).unwrap_or_default();
            let v: Vec<u8> = r.get(1).unwrap_or_default();
            bytes += k.len() + v.len();
            n += 1;
        }
        std::hint::black_box(bytes);
        n
    };
    let raw_secs = t.elapsed().as_secs_f64();

    let mut s = Server::with_config(&dir, port, "hosted = true");
    s.unseal_keys = keys_before;
    s.root_token = token.clone();
    s.unseal();

    // Idle reads.
    let stop = Arc::new(AtomicBool::new(false));
    let hs = readers(&s.addr, &token, nreaders, stop.clone());
    std::thread::sleep(Duration::from_secs(5));
    stop.store(true, Ordering::Relaxed);
    let (mut idle, idle_errs) = collect(hs);

    // The same reads while the reindex runs.
    let stop = Arc::new(AtomicBool::new(false));
    let hs = readers(&s.addr, &token, nreaders, stop.clone());
    std::thread::sleep(Duration::from_millis(200));
    let warnings = Arc::new(Mutex::new(String::new()));
    let t = Instant::now();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(1800)))
        .build()
        .into();
    let mut r = agent
        .post(&format!("{}/v1/sys/replication/reindex", s.addr))
        .header("X-Vault-Token", &token)
        .send_json(json!({}))
        .expect("reindex call");
    let reindex_secs = t.elapsed().as_secs_f64();
    let status = r.status().as_u16();
    let body = r.body_mut().read_to_string().unwrap_or_default();
    if let Ok(mut w) = warnings.lock() {
        *w = body.chars().take(300).collect();
    }
    stop.store(true, Ordering::Relaxed);
    let (mut during, during_errs) = collect(hs);
    assert_eq!(status, 200, "reindex: {body}");

    // A Merkle check over the rebuilt trees must be clean.
    let t = Instant::now();
    let c = s.post("sys/replication/merkle-check", json!({}));
    let check_secs = t.elapsed().as_secs_f64();
    let clean = c.body["data"]["merkle_corruption_report"]["corrupted_root"] == json!(false);

    let (ip50, ip99) = (percentile(&mut idle, 0.5), percentile(&mut idle, 0.99));
    let (dp50, dp99) = (percentile(&mut during, 0.5), percentile(&mut during, 0.99));
    println!("| measure | value |");
    println!("|---|---|");
    println!("| keys in storage | {scanned} |");
    println!(
        "| reindex (POST sys/replication/reindex, until its response) | {reindex_secs:.1} s = {:.0} keys/s |",
        scanned as f64 / reindex_secs
    );
    println!(
        "| baseline: raw SQLite scan of the same rows | {raw_secs:.2} s = {:.0} keys/s |",
        scanned as f64 / raw_secs
    );
    println!(
        "| reindex / raw scan time | {:.1}x |",
        reindex_secs / raw_secs
    );
    println!("| Merkle check afterwards | {check_secs:.1} s, clean: {clean} |");
    println!(
        "| API reads idle ({nreaders} clients) | {} reads, p50 {ip50:.2} ms, p99 {ip99:.2} ms, {idle_errs} errors |",
        idle.len()
    );
    println!(
        "| API reads during the reindex | {} reads, p50 {dp50:.2} ms, p99 {dp99:.2} ms, {during_errs} errors |",
        during.len()
    );
    println!("| p99 during / p99 idle | {:.2}x |", dp99 / ip99.max(1e-9));
    if let Ok(w) = warnings.lock() {
        eprintln!("reindex response (start): {w}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
