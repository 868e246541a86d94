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

use cairn_tests::cluster::generate_root;
use cairn_tests::growth::{percentile, wait};
use cairn_tests::replbench::{
    agent, attach_perf, checkers, concurrent_writes, fill, join_lags, licensed, licensed_with,
    paced, put, resync_after, status, status_of, wal_index, Resync, Sample,
};
use cairn_tests::Server;
use serde_json::json;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Result of the steady-rate phase.
struct Steady {
    rate: f64,
    elapsed: f64,
    errors: u64,
    ack: Vec<f64>,
    perf_lag: Vec<f64>,
    dr_lag: Vec<f64>,
}

/// Paced writers (`rate` writes/s in total) on `p` for `secs`; every `every`-th write is
/// sampled for lag on the perf secondary `s` (readable) and the DR secondary `d`
/// (`last_remote_wal` ≥ the write's own WAL index, its `X-Vault-Index`).
fn steady(p: &Server, s: &Server, d: &Server, rate: f64, secs: f64, every: u64) -> Steady {
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
    let w = paced(p, "steady", rate, secs, every, vec![ptx, dtx]);
    Steady {
        rate: w.rate,
        elapsed: w.elapsed,
        errors: w.errors,
        ack: w.ack,
        perf_lag: join_lags(perf),
        dr_lag: join_lags(dr),
    }
}

/// Merkle resync of a perf secondary kept away while `keys` keys changed (see the module
/// doc).
fn resync(keys: usize, clients: usize) -> Resync {
    const TUNING: &str = "replication {\n wal_max_entries = 100\n pull_wait_ms = 500\n}\n";
    let value = "v".repeat(100);
    let (p, _) = licensed_with("bench-resync-p", &[], TUNING);
    let (mut s, _) = licensed_with("bench-resync-s", &[p.port], TUNING);
    assert_eq!(
        p.post("sys/mounts/secret", json!({"type": "kv"})).status,
        204
    );
    attach_perf(&p, &s, "resync");
    fill(&p, "base", keys, clients, &value);
    resync_after(&p, &mut s, "changed", keys, &value, clients, 100)
}

/// `n` sequential acknowledged writes; latencies in ms.
fn sequential_writes(s: &Server, prefix: &str, n: usize) -> Vec<f64> {
    let (a, value) = (agent(), "x".repeat(64));
    (0..n)
        .map(|i| {
            let t0 = Instant::now();
            assert!(put(&a, s, &format!("secret/{prefix}/{i}"), &value), "write");
            t0.elapsed().as_secs_f64() * 1000.0
        })
        .collect()
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
    attach_perf(&p, &s, "bench");
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
        assert!(put(&pa, &p, &path, &"x".repeat(64)), "write");
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
    // Dropping the servers stops them and removes their directories.
}
