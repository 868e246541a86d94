//! `bench-growth-resync [CHANGED=1k,10k,100k] [TOTALS=10k,30k,100k] [BASE=100k] [FIXED=10k]
//! [CLIENTS=16]`: resync (catch-up, or Merkle diff and sync) of a performance secondary that was away while keys changed,
//! real `cairn` processes (SQLite, release build) on loopback. Run through
//! `scripts/bench.sh growth-resync`; writes `growth-resync-changed.csv`/`.svg` (vs changed
//! keys, BASE keys stored) and `growth-resync-total.csv`/`.svg` (vs keys stored, FIXED
//! changed keys). An empty list (`""`) skips a curve.
//!
//! Each point: a primary and a secondary with `wal_max_entries = 100`, so the changes are
//! far past the WAL's full entries: the secondary comes back by catch-up (the current values
//! of the keys the dropped entries wrote, which the primary keeps as key-only entries), or,
//! with `RESYNC=merkle` in the environment (`wal_max_key_entries = 0`), by Merkle diff and
//! sync. The
//! primary's stored keys are loaded in bulk into its SQLite file, encrypted with its barrier
//! key (`cairn_tests::bulk`), and taken into its trees by a reindex; the secondary is then
//! activated and its initial sync timed. The secondary is killed (-9), the changed keys are
//! written through the API (new 100-character values, CLIENTS writers; how long the primary
//! took to accept them is the baseline next to the resync time), the secondary restarted
//! and unsealed; the resync is timed until it streams again with the primary's Merkle root,
//! and the cluster channel's body bytes (`cairn_cluster_bytes_total`, both directions) are
//! compared with the changed data (key path + JSON body). 100 changed keys spread over the
//! range, and 100 bulk keys, are then read back on the secondary and checked.
//!
//! The default TOTALS stop at 100k: the secondary's initial sync (a Merkle sync from
//! nothing) took 213 s for 100k keys on the loaded 2-core machine and grows faster than
//! linearly (BENCHMARKS.md, "Growth curves"), so 1M or 5M stored keys take hours.

use cairn_tests::bulk;
use cairn_tests::cluster::generate_root;
use cairn_tests::growth::{num, short, sizes, wait, Table};
use cairn_tests::replbench::{
    attach_perf, cluster_bytes, licensed_with, resync_after, synced, Resync,
};
use serde_json::json;
use std::time::Instant;

/// Whether the secondary comes back by Merkle diff and sync (`RESYNC=merkle`) rather than
/// by catch-up.
fn by_merkle() -> bool {
    std::env::var("RESYNC").as_deref() == Ok("merkle")
}

/// The nodes' replication settings (see the module doc for `RESYNC`).
fn tuning() -> String {
    let keys = if by_merkle() {
        "\n wal_max_key_entries = 0"
    } else {
        ""
    };
    format!("replication {{\n wal_max_entries = 100{keys}\n pull_wait_ms = 500\n}}\n")
}

/// How the resync runs, for titles and file names.
fn how() -> (&'static str, &'static str) {
    if by_merkle() {
        ("Merkle resync", "-merkle")
    } else {
        ("Catch-up", "")
    }
}

/// One point: what the initial sync and the resync measured.
struct Point {
    total: u64,
    initial_secs: f64,
    initial_bytes: u64,
    rs: Resync,
    /// Bulk keys not read back on the secondary with their value.
    wrong_bulk: u64,
}

fn point(total: u64, changed: u64, clients: usize) -> Point {
    eprintln!(
        "{} stored, {} changed: loading",
        short(total),
        short(changed)
    );
    let (mut p, _) = licensed_with("growth-resync-p", &[], &tuning());
    assert_eq!(
        p.post("sys/mounts/secret", json!({"type": "kv"})).status,
        204
    );
    let uuid = bulk::mount_uuid(&p, "secret/");
    p.terminate();
    bulk::load(&p.dir.join("cairn.db"), &p.unseal_keys, &uuid, 0, total);
    p.restart();
    p.unseal();
    bulk::reindex(&p);
    let (mut s, _) = licensed_with("growth-resync-s", &[p.port], &tuning());
    eprintln!("{} stored: initial sync", short(total));
    let (s0, r0) = cluster_bytes(&p);
    let t = Instant::now();
    attach_perf(&p, &s, "resync");
    wait("the initial sync", 3600, || synced(&p, &s));
    let initial_secs = t.elapsed().as_secs_f64();
    let (s1, r1) = cluster_bytes(&p);
    s.root_token = generate_root(&s, &p.unseal_keys);
    eprintln!(
        "{} stored: initial sync {initial_secs:.1} s; resync of {} changed",
        short(total),
        short(changed)
    );
    let value = "c".repeat(100);
    let rs = resync_after(
        &p,
        &mut s,
        "changed",
        changed as usize,
        &value,
        clients,
        100,
    );
    let wrong_bulk = bulk::check_reads(&s, total, 100);
    Point {
        total,
        initial_secs,
        initial_bytes: s1 + r1 - s0 - r0,
        rs,
        wrong_bulk,
    }
}

fn table(name: &str) -> Table {
    Table::new(
        name,
        &[
            ("total_keys", "keys stored"),
            ("changed_keys", "changed keys"),
            ("changed_mb", "changed data (MB)"),
            ("resync_mb", "resync bytes (MB)"),
            ("bytes_vs_changed", "bytes / changed data"),
            ("resync_s", "resync (s)"),
            ("write_s", "baseline: primary accepting the changes (s)"),
            ("initial_sync_s", "initial sync (s)"),
            ("initial_sync_mb", "initial sync (MB)"),
            ("wrong_reads", "wrong reads"),
        ],
    )
}

fn row(t: &mut Table, p: &Point) {
    let mb = |b: u64| num(b as f64 / 1e6, 3);
    t.row(vec![
        p.total.to_string(),
        p.rs.keys.to_string(),
        mb(p.rs.changed_bytes),
        mb(p.rs.bytes()),
        num(p.rs.bytes() as f64 / p.rs.changed_bytes.max(1) as f64, 3),
        num(p.rs.secs, 2),
        num(p.rs.write_secs, 2),
        num(p.initial_secs, 1),
        mb(p.initial_bytes),
        (p.rs.wrong + p.wrong_bulk).to_string(),
    ]);
    eprintln!(
        "secondary states during the resync (cluster bytes when first seen): {}",
        p.rs.states
            .iter()
            .map(|(s, b)| format!("{s} ({b})"))
            .collect::<Vec<_>>()
            .join(" → ")
    );
}

fn verdict(t: &[Point]) {
    for p in t {
        let r = p.rs.bytes() as f64 / p.rs.changed_bytes.max(1) as f64;
        println!(
            "{} stored, {} changed: resync bytes {r:.2}× the changed data (target ≤ 1.3×: {})",
            short(p.total),
            short(p.rs.keys as u64),
            if r <= 1.3 { "met" } else { "MISSED" }
        );
    }
    println!();
}

fn main() {
    if std::env::var_os("CAIRN_E2E_LOG_LEVEL").is_none() {
        std::env::set_var("CAIRN_E2E_LOG_LEVEL", "info");
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let changed = sizes(args.first(), &[1_000, 10_000, 100_000]);
    let totals = sizes(args.get(1), &[10_000, 30_000, 100_000]);
    let base = sizes(args.get(2), &[]).first().copied().unwrap_or(100_000);
    let fixed = sizes(args.get(3), &[]).first().copied().unwrap_or(10_000);
    let clients: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(16);
    let plot = |t: &Table, x: &str, title: &str, xlabel: &str| {
        t.finish(&[
            "--x",
            x,
            "--logx",
            "--y",
            "changed_mb,resync_mb",
            "--y2",
            "resync_s,write_s",
            "--title",
            title,
            "--xlabel",
            xlabel,
            "--ylabel",
            "MB",
            "--y2label",
            "seconds",
        ])
    };
    if !changed.is_empty() {
        let mut t = table(&format!("growth-resync-changed{}", how().1));
        let points: Vec<Point> = changed
            .iter()
            .map(|&c| {
                let p = point(base, c, clients);
                row(&mut t, &p);
                p
            })
            .collect();
        println!(
            "{} vs changed keys, {} keys stored:\n",
            how().0,
            short(base)
        );
        plot(
            &t,
            "changed_keys",
            &format!("{} vs changed keys ({} stored)", how().0, short(base)),
            "changed keys",
        );
        verdict(&points);
    }
    if !totals.is_empty() {
        let mut t = table(&format!("growth-resync-total{}", how().1));
        let points: Vec<Point> = totals
            .iter()
            .map(|&n| {
                let p = point(n, fixed, clients);
                row(&mut t, &p);
                p
            })
            .collect();
        println!("{} vs keys stored, {} changed:\n", how().0, short(fixed));
        plot(
            &t,
            "total_keys",
            &format!("{} vs keys stored ({} changed)", how().0, short(fixed)),
            "keys stored",
        );
        verdict(&points);
    }
}
