//! `bench-replication [SECONDS] [CLIENTS] [LAG_SAMPLES]`: performance replication on loopback
//! between two real `cairn` processes (SQLite, release build). Run through
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

use cairn_tests::{free_port_pair, tmpdir, Server};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The test license of `tests/tests/replication.rs` (signed by the test issuer key).
const LICENSE: &str = r#"{
  "license": {
    "license_id": "e2e-test-license",
    "customer": "cairn tests",
    "features": [
      "replication"
    ],
    "issue_time": 1700000000000,
    "expiration_time": 4102444800000,
    "dev": false
  },
  "signature": "jUA3uMpan95C0G4l0W/NFxRHWiEUOq2rN3/lin/wBxebzDq/bLWsYedgO5u1tcyt1/4CTaiRWBBsON1l7Jp/Cg=="
}"#;
const ISSUER_KEY: &str = "GX9rI+FshTLGq8g4+s1ep4m+DHaykgM0A5v6iz02jWE=";

fn licensed(tag: &str, avoid: u16) -> Server {
    let dir = tmpdir(tag);
    let lic = dir.join("license.json");
    std::fs::write(&lic, LICENSE).expect("write license");
    let extra = format!(
        "license_path = \"{}\"\nlicense_trusted_key = \"{ISSUER_KEY}\"\n",
        lic.display()
    );
    let mut port = free_port_pair();
    while port.abs_diff(avoid) <= 1 {
        port = free_port_pair();
    }
    let mut s = Server::with_config(&dir, port, &extra);
    s.init_unseal(1, 1);
    s
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn status(s: &Server) -> Value {
    s.call_as(None, "GET", "sys/replication/performance/status", None)
        .body["data"]
        .clone()
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

/// Standard base64 (padded or not) to bytes.
fn b64decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a') as u32 + 26,
            b'0'..=b'9' => (c - b'0') as u32 + 52,
            b'+' | b'-' => 62,
            _ => 63,
        }
    };
    let s: Vec<u8> = s.bytes().filter(|c| *c != b'=').collect();
    let mut out = Vec::new();
    for chunk in s.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= val(*c) << (18 - 6 * i);
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..chunk.len().saturating_sub(1)]);
    }
    out
}

/// A root token on the (performance secondary) `s` from the primary's key shares.
fn generate_root(s: &Server, keys: &[String]) -> String {
    let a = s.call_as(None, "POST", "sys/generate-root/attempt", Some(json!({})));
    let a = if a.body["data"].is_object() {
        a.body["data"].clone()
    } else {
        a.body
    };
    let otp = a["otp"].as_str().expect("otp").to_string();
    let nonce = a["nonce"].as_str().expect("nonce").to_string();
    let mut last = Value::Null;
    for k in keys {
        let u = s.call_as(
            None,
            "POST",
            "sys/generate-root/update",
            Some(json!({"key": k, "nonce": nonce})),
        );
        last = if u.body["data"].is_object() {
            u.body["data"].clone()
        } else {
            u.body
        };
        if last["complete"] == true {
            break;
        }
    }
    let enc = last["encoded_token"].as_str().expect("encoded token");
    b64decode(enc)
        .iter()
        .zip(otp.bytes())
        .map(|(a, b)| (a ^ b) as char)
        .collect()
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
    let args: Vec<String> = std::env::args().skip(1).collect();
    let secs: f64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let clients: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(16);
    let samples: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(300);

    let p = licensed("bench-repl-p", 0);
    let mut s = licensed("bench-repl-s", p.port);
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
    println!();
    println!(
        "write rate with a secondary / without = {:.2}x; streaming keeps up with writes: {:.2}x",
        repl_conc.0 / base_conc.0,
        (entries as f64 / elapsed) / repl_conc.0.max(1.0)
    );
    let (pdir, sdir) = (p.dir.clone(), s.dir.clone());
    drop(p);
    drop(s);
    let _ = std::fs::remove_dir_all(pdir);
    let _ = std::fs::remove_dir_all(sdir);
}
