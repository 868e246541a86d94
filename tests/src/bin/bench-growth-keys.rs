//! `bench-growth-keys [KEYS=100k,1M] [READS=1000]`: how a real `cairn` process (SQLite,
//! release build) grows with the number of keys it stores: reindex time next to a raw scan
//! that hashes the same rows (the baseline, same run), unseal-to-serving time, and resident
//! memory. Run through `scripts/bench.sh growth-keys`; writes `growth-keys.csv`, and
//! `growth-keys.svg` (times) and `growth-keys-rss.svg` (memory).
//!
//! For each size: a fresh server is initialised (1 key share), a KV v1 mount made, and the
//! server stopped; the keys are written straight into its SQLite file, encrypted with its
//! barrier key (`cairn_tests::bulk`, 100-character values), so the server reads them the
//! normal way. Then:
//!
//! * baseline: every row of the database read in key order and hashed as a Merkle leaf
//!   (rusqlite, one thread);
//! * the server started and unsealed, `POST sys/replication/reindex` timed to its answer
//!   (the trees must take in the new keys); peak RSS of that process;
//! * READS keys spread over the range read back and compared with what was written;
//! * the server stopped cleanly (SIGTERM) and started again: start → API answering, then
//!   unseal call → the first KV read that returns its value (unseal-to-serving);
//! * READS keys read back again; RSS (`VmRSS`) and its peak (`VmHWM`) of that process.

use cairn_tests::bulk;
use cairn_tests::growth::{num, short, sizes, Table};
use cairn_tests::loadgen::rss_mib;
use cairn_tests::{free_port_pair, replbench, tmpdir, Server};
use serde_json::json;
use std::time::{Duration, Instant};

fn main() {
    if std::env::var_os("CAIRN_E2E_LOG_LEVEL").is_none() {
        std::env::set_var("CAIRN_E2E_LOG_LEVEL", "info");
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let counts = sizes(args.first(), &[100_000, 1_000_000]);
    let reads: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let mut table = Table::new(
        "growth-keys",
        &[
            ("keys", "keys stored"),
            ("load_s", "bulk load (s)"),
            ("db_mib", "database (MiB)"),
            ("raw_scan_hash_s", "baseline: raw scan + hash (s)"),
            ("reindex_s", "reindex (s)"),
            ("reindex_vs_raw", "reindex / baseline"),
            ("reindex_peak_rss_mib", "peak RSS with reindex (MiB)"),
            ("start_s", "start → API up (s)"),
            ("unseal_to_serving_s", "unseal → serving (s)"),
            ("rss_mib", "RSS serving (MiB)"),
            ("rss_peak_mib", "peak RSS serving (MiB)"),
            ("wrong_reads", "wrong reads"),
        ],
    );
    let mut worst = (0.0f64, 0.0f64, 0.0f64, 0u64);
    for &n in &counts {
        eprintln!("{}: setting up", short(n));
        let dir = tmpdir("growth-keys");
        let port = free_port_pair();
        let mut s = Server::with_config(&dir, port, "hosted = true");
        s.init_unseal(1, 1);
        assert_eq!(
            s.post("sys/mounts/secret", json!({"type": "kv"})).status,
            204
        );
        let uuid = bulk::mount_uuid(&s, "secret/");
        s.terminate();
        let db = dir.join("cairn.db");
        let load = bulk::load(&db, &s.unseal_keys, &uuid, 0, n);
        let db_mib = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0) as f64 / 1048576.0;
        eprintln!("{}: loaded in {load:.1} s, {db_mib:.0} MiB", short(n));
        let (rows, raw) = bulk::scan_and_hash(&db);
        eprintln!("{}: raw scan + hash of {rows} rows: {raw:.2} s", short(n));

        s.restart();
        s.unseal();
        let reindex = bulk::reindex(&s);
        let (_, reindex_peak) = rss_mib(s.pid());
        eprintln!("{}: reindex {reindex:.2} s", short(n));
        let mut wrong = bulk::check_reads(&s, n, reads);

        s.terminate();
        let t = Instant::now();
        s.restart();
        let start = t.elapsed().as_secs_f64();
        let (probe, value) = (bulk::key("", n / 2).1, bulk::value(n / 2));
        let a = replbench::agent();
        let t = Instant::now();
        s.unseal();
        while !replbench::reads_back(&a, &s.addr, &s.root_token, &probe, &value) {
            assert!(t.elapsed() < Duration::from_secs(600), "not serving");
            std::thread::sleep(Duration::from_millis(1));
        }
        let serving = t.elapsed().as_secs_f64();
        wrong += bulk::check_reads(&s, n, reads);
        let (rss, rss_peak) = rss_mib(s.pid());
        table.row(vec![
            n.to_string(),
            num(load, 1),
            num(db_mib, 0),
            num(raw, 2),
            num(reindex, 2),
            num(reindex / raw.max(1e-9), 2),
            num(reindex_peak, 0),
            num(start, 2),
            num(serving, 3),
            num(rss, 0),
            num(rss_peak, 0),
            wrong.to_string(),
        ]);
        worst = (
            rss.max(rss_peak).max(reindex_peak),
            serving,
            reindex / raw.max(1e-9),
            n,
        );
        drop(s);
        drop(dir);
    }
    println!(
        "{READS} reads back after the reindex and again after the restart; the baseline scan \
         hashes every row (SHA-256 of key and stored bytes) in one thread.\n",
        READS = reads
    );
    table.finish(&[
        "--x",
        "keys",
        "--logx",
        "--y",
        "raw_scan_hash_s,reindex_s,unseal_to_serving_s",
        "--title",
        "Reindex and unseal-to-serving time vs keys stored",
        "--xlabel",
        "keys stored",
        "--ylabel",
        "seconds",
    ]);
    table.plot(
        "-rss",
        &[
            "--x",
            "keys",
            "--logx",
            "--y",
            "rss_mib,rss_peak_mib,reindex_peak_rss_mib",
            "--title",
            "Resident memory vs keys stored",
            "--xlabel",
            "keys stored",
            "--ylabel",
            "MiB",
        ],
    );
    let (rss, serving, ratio, n) = worst;
    println!(
        "at {} keys: peak RSS {rss:.0} MiB (target ≤ 1024: {}), unseal → serving {serving:.2} s \
         (target ≤ 10 s: {}), reindex {ratio:.2}× the raw scan + hash (target ≤ 2×: {})",
        short(n),
        if rss <= 1024.0 { "met" } else { "MISSED" },
        if serving <= 10.0 { "met" } else { "MISSED" },
        if ratio <= 2.0 { "met" } else { "MISSED" },
    );
}
