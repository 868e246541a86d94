//! `bench`: throughput and latency measurements against real `cairn` processes, each next
//! to a baseline measured in the same run. Run through `scripts/bench.sh`.
//!
//! `bench kv [SECONDS] [CLIENTS]`: acknowledged (durable) KV writes/s and reads/s over HTTP
//! with concurrent clients, next to single-row SQLite commits/s with the same durability
//! (WAL journal, synchronous=FULL).

use cairn_tests::keepalive::KeepAlive;
use cairn_tests::{free_port_pair, tmpdir, Server};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn sqlite_baseline(secs: f64) -> f64 {
    let dir = tmpdir("bench-sqlite");
    let conn = rusqlite::Connection::open(dir.join("b.db")).expect("open");
    conn.pragma_update(None, "journal_mode", "WAL")
        .expect("wal");
    conn.pragma_update(None, "synchronous", "FULL")
        .expect("sync");
    conn.execute_batch("CREATE TABLE kv (key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID")
        .expect("table");
    let start = Instant::now();
    let mut n = 0u64;
    let value = vec![7u8; 120];
    while start.elapsed().as_secs_f64() < secs {
        conn.execute(
            "INSERT OR REPLACE INTO kv (key, value) VALUES (?1, ?2)",
            rusqlite::params![format!("k{n}").as_bytes(), value],
        )
        .expect("insert");
        n += 1;
    }
    let _ = std::fs::remove_dir_all(dir);
    n as f64 / start.elapsed().as_secs_f64()
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// One client operation: (connection, client index, operation number) -> success. Each
/// client keeps one keep-alive connection with the lean client of `cairn_tests::keepalive`,
/// so the load generator's CPU on the shared cores stays small.
type Op = Arc<dyn Fn(&mut KeepAlive, usize, u64) -> bool + Send + Sync>;

/// Runs `clients` threads calling `op(thread, i)` for `secs`; returns (ops/s, p50 ms, p99 ms, errors).
fn drive(addr: &str, clients: usize, secs: f64, op: Op) -> (f64, f64, f64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    // Clients connect one after the other (each makes a first, unmeasured call before the
    // next starts): tiny_http's connection task pool can leave a connection unserved while
    // others live when many open at the same instant, which would measure that start-up
    // race instead of the server.
    let setup = Arc::new(std::sync::Mutex::new(()));
    let handles: Vec<_> = (0..clients)
        .map(|t| {
            let (stop, op, setup) = (stop.clone(), op.clone(), setup.clone());
            let addr = addr.to_string();
            std::thread::spawn(move || {
                let mut conn = KeepAlive::new(&addr, Duration::from_secs(10));
                {
                    let _one_at_a_time = setup.lock().unwrap_or_else(|p| p.into_inner());
                    let _ = op(&mut conn, t, u64::MAX);
                }
                let started = Instant::now();
                let (mut lat, mut errs, mut i) = (Vec::new(), 0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    if op(&mut conn, t, i) {
                        lat.push(t0.elapsed().as_secs_f64() * 1000.0);
                    } else {
                        errs += 1;
                    }
                    i += 1;
                }
                (lat, errs, started.elapsed().as_secs_f64())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    let mut errs = 0;
    let mut rate = 0.0;
    for h in handles {
        let (l, e, took) = h.join().expect("client thread");
        // Each client's own rate over the time it ran (the later ones start later).
        rate += l.len() as f64 / took.max(1e-9);
        all.extend(l);
        errs += e;
    }
    let p50 = percentile(&mut all, 0.5);
    let p99 = percentile(&mut all, 0.99);
    (rate, p50, p99, errs)
}

fn kv(secs: f64, clients: usize) {
    let baseline = sqlite_baseline(secs);
    let dir = tmpdir("bench-kv");
    let mut s = Server::with_config(&dir, free_port_pair(), "");
    s.init_unseal(1, 1);
    assert_eq!(s.post("sys/mounts/kv", json!({"type": "kv"})).status, 204);
    let (addr, token) = (s.addr.clone(), s.root_token.clone());
    let (a, t) = (addr.clone(), token.clone());
    let body = json!({"value": "x".repeat(64)}).to_string();
    let writes = drive(
        &a,
        clients,
        secs,
        Arc::new(move |conn, th, i| {
            match conn.call(
                "PUT",
                &format!("/v1/kv/b/{th}/{i}"),
                &[("X-Vault-Token", &t), ("Content-Type", "application/json")],
                body.as_bytes(),
            ) {
                Ok(r) => r.status == 204,
                Err(e) => {
                    eprintln!("write error (client {th}, op {i}): {e}");
                    false
                }
            }
        }),
    );
    for th in 0..clients {
        for k in 0..20 {
            assert_eq!(
                s.put(&format!("kv/r/{th}/{k}"), json!({"value": "x".repeat(64)}))
                    .status,
                204
            );
        }
    }
    let (a, t) = (addr.clone(), token.clone());
    let reads = drive(
        &a,
        clients,
        secs,
        Arc::new(move |conn, th, i| {
            match conn.call(
                "GET",
                &format!("/v1/kv/r/{th}/{}", i % 20),
                &[("X-Vault-Token", &t)],
                b"",
            ) {
                Ok(r) => {
                    let st = r.status;
                    // The value written above comes back.
                    let ok = st == 200
                        && serde_json::from_slice::<serde_json::Value>(&r.body).is_ok_and(|v| {
                            v["data"]["value"].as_str().is_some_and(|x| x.len() == 64)
                        });
                    if !ok {
                        eprintln!("read error (client {th}): status {st}");
                    }
                    ok
                }
                Err(e) => {
                    eprintln!("read error (client {th}): {e}");
                    false
                }
            }
        }),
    );
    println!("| measurement | rate (/s) | p50 (ms) | p99 (ms) | errors |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| SQLite single-row commits (WAL, synchronous=FULL), 1 thread | {baseline:.0} | | | |"
    );
    println!(
        "| Cairn durable KV writes over HTTP, {clients} clients | {:.0} | {:.2} | {:.2} | {} |",
        writes.0, writes.1, writes.2, writes.3
    );
    println!(
        "| Cairn KV reads over HTTP, {clients} clients | {:.0} | {:.2} | {:.2} | {} |",
        reads.0, reads.1, reads.2, reads.3
    );
    println!();
    println!("writes / SQLite per-commit baseline = {:.2}x (target >= 2x); reads = {:.0}/s (target >= 20000/s)", writes.0 / baseline, reads.0);
    s.kill9();
    let _ = std::fs::remove_dir_all(dir);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let what = args.first().map(String::as_str).unwrap_or("kv");
    let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let clients: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(32);
    match what {
        "kv" => kv(secs, clients),
        other => {
            eprintln!("unknown benchmark {other:?}; available: kv");
            std::process::exit(1);
        }
    }
}
