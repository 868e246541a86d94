//! `bench-growth-secondaries [COUNTS=0,1,2,4,8] [SECONDS=5] [CLIENTS=16] [RATE=500]`: the
//! primary's write throughput and the replication lag as performance secondaries are
//! attached, all real `cairn` processes (SQLite, release build) on loopback. Run through
//! `scripts/bench.sh growth-secondaries`; writes `growth-secondaries.csv` and `.svg`
//! (see `cairn_tests::growth`).
//!
//! One primary; for each count in COUNTS (ascending) secondaries are added until that many
//! are attached and in sync, then:
//!
//! * throughput: CLIENTS concurrent writers for SECONDS, every write checked for its 204;
//!   the count 0 (replication not enabled) is the baseline of the same run;
//! * catch-up: time from the end of that phase until every secondary has applied the
//!   primary's last WAL entry with the same Merkle root;
//! * lag: paced writers at RATE writes/s for 2 × SECONDS; every 25th acknowledged write is
//!   sampled, and on every secondary one checker polls (every millisecond) until the value
//!   reads back there; lag = acknowledgement on the primary → readable, per (write,
//!   secondary). A value not readable after 30 s fails the run.
//!
//! After the lag phase every secondary must again be in sync with equal roots.
//!
//! In the throughput phase the CPU time (utime + stime) of the primary and of all the
//! secondaries together is divided by the writes acknowledged: the primary's CPU per write
//! says what each attached secondary costs the primary itself, whatever the secondaries'
//! own work takes from the shared cores.
//!
//! `BENCH_PRIMARY_REPLICATION="..."` is the primary's `replication { ... }` block (e.g.
//! `wal_max_entries = 1000` to have its WAL trimmed from the start, with or without
//! `wal_max_key_entries = 0`).
//! `BENCH_PULL_GAP_MS=N` sets the secondaries' `replication { pull_gap_ms = N }` (the least
//! time a caught-up secondary waits before it pulls again); unset, the server's default.
//! `BENCH_SECONDARY_NICE=N` starts every secondary at niceness N (`renice`), so that on a
//! machine where they share the primary's cores they stand for secondaries on other hosts:
//! they get the CPU the primary and the load generator leave (the catch-up column then says
//! how far they fell behind); unset, all processes are equal.
//! `BENCH_PIN=P:S` (CPU lists as `taskset -c` takes them, e.g. `0:1`) pins the load
//! generator and the primary to the CPUs P and every secondary to the CPUs S, so that the
//! secondaries stand for secondaries on other hosts: they take no CPU from the primary, and
//! the ratio says what serving them costs the primary itself (the baseline is measured
//! under the same pinning). The table's title says so when it is set.

use cairn_tests::cluster::generate_root;
use cairn_tests::growth::{num, percentile, sizes, wait, Table};
use cairn_tests::loadgen::cpu_secs;
use cairn_tests::replbench::{
    attach_perf, checkers, concurrent_writes, fill, join_lags, licensed, licensed_with, paced,
    reads_back, synced, Sample,
};
use cairn_tests::Server;
use serde_json::json;
use std::sync::mpsc;
use std::time::Instant;

fn main() {
    if std::env::var_os("CAIRN_E2E_LOG_LEVEL").is_none() {
        std::env::set_var("CAIRN_E2E_LOG_LEVEL", "info");
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut counts = sizes(args.first(), &[0, 1, 2, 4, 8]);
    counts.sort_unstable();
    let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let clients: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(16);
    let rate: f64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(500.0);
    const EVERY: u64 = 25;

    let p = match std::env::var("BENCH_PRIMARY_REPLICATION") {
        Ok(block) => {
            licensed_with(
                "growth-sec-p",
                &[],
                &format!("replication {{\n{block}\n}}\n"),
            )
            .0
        }
        Err(_) => licensed("growth-sec-p", &[]),
    };
    let tuning = match std::env::var("BENCH_PULL_GAP_MS") {
        Ok(n) => format!("replication {{\n pull_gap_ms = {n}\n}}\n"),
        Err(_) => String::new(),
    };
    let pin: Option<(String, String)> = std::env::var("BENCH_PIN").ok().map(|v| {
        let (a, b) = v
            .split_once(':')
            .unwrap_or_else(|| panic!("BENCH_PIN={v}: want PRIMARY_CPUS:SECONDARY_CPUS"));
        (a.to_string(), b.to_string())
    });
    if let Some((cpus, _)) = &pin {
        // Before any load-generator thread exists: they inherit it.
        pin_to(std::process::id(), cpus);
    }
    let nice: Option<i32> = std::env::var("BENCH_SECONDARY_NICE")
        .ok()
        .and_then(|v| v.parse().ok());
    if let Some((cpus, _)) = &pin {
        pin_to(p.pid(), cpus);
    }
    assert_eq!(
        p.post("sys/mounts/secret", json!({"type": "kv"})).status,
        204
    );
    // Warm-up, not measured.
    fill(&p, "warm", 500, clients, &"x".repeat(64));
    let mut ports = vec![p.port];
    let mut secs_: Vec<Server> = Vec::new();
    let mut table = Table::new(
        "growth-secondaries",
        &[
            ("secondaries", "perf secondaries"),
            ("writes_per_s", "writes/s (CLIENTS writers)"),
            ("vs_none", "× with none"),
            ("write_p50_ms", "write p50 (ms)"),
            ("write_p99_ms", "write p99 (ms)"),
            ("write_errors", "failed writes"),
            ("primary_cpu_us", "primary CPU µs/write"),
            (
                "secondaries_cpu_us",
                "all secondaries' CPU µs/write (in the phase)",
            ),
            ("catchup_s", "catch-up after (s)"),
            ("paced_per_s", "paced writes/s reached"),
            ("lag_p50_ms", "lag p50 (ms)"),
            ("lag_p99_ms", "lag p99 (ms)"),
            ("lag_max_ms", "lag max (ms)"),
            ("lag_samples", "lag samples"),
            ("paced_errors", "failed paced writes"),
        ],
    );
    // The throughput with none attached, when the counts start at 0 (else no ratio is
    // given: a ratio to nothing says nothing).
    let mut base: Option<f64> = None;
    let mut last = (None, 0.0);
    for &n in &counts {
        while secs_.len() < n as usize {
            let id = format!("sec{}", secs_.len());
            let mut s = licensed_with(&format!("growth-sec-{id}"), &ports, &tuning).0;
            if let Some(n) = nice {
                let ok = std::process::Command::new("renice")
                    .args(["-n", &n.to_string(), "-p", &s.pid().to_string()])
                    .output()
                    .map(|o| o.status.success())
                    .unwrap_or(false);
                assert!(ok, "renice -n {n} of secondary {id} failed");
            }
            if let Some((_, cpus)) = &pin {
                pin_to(s.pid(), cpus);
            }
            ports.push(s.port);
            attach_perf(&p, &s, &id);
            wait(&format!("{id} in sync"), 600, || synced(&p, &s));
            // Activation wiped the secondary's own tokens: one for reading back.
            s.root_token = generate_root(&s, &p.unseal_keys);
            secs_.push(s);
        }
        eprintln!("{n} secondaries: {clients} writers for {secs} s");
        let cpu_p0 = cpu_secs(p.pid());
        let cpu_s0: f64 = secs_.iter().map(|s| cpu_secs(s.pid())).sum();
        let phase = Instant::now();
        let (tput, p50, p99, errs) = concurrent_writes(&p, &format!("tput{n}"), clients, secs);
        // The writes acknowledged in the phase (the rate is over the same span).
        let writes = (tput * phase.elapsed().as_secs_f64()).max(1.0);
        let cpu_p = (cpu_secs(p.pid()) - cpu_p0) * 1e6 / writes;
        let cpu_s = (secs_.iter().map(|s| cpu_secs(s.pid())).sum::<f64>() - cpu_s0) * 1e6 / writes;
        let t = Instant::now();
        for s in &secs_ {
            wait("catch-up", 600, || synced(&p, s));
        }
        let catchup = t.elapsed().as_secs_f64();
        if n == 0 {
            base = Some(tput);
        }
        eprintln!("{n} secondaries: paced {rate}/s for {} s", secs * 2.0);
        let mut sinks = Vec::new();
        let mut hs = Vec::new();
        for s in &secs_ {
            let (tx, rx) = mpsc::channel::<Sample>();
            sinks.push(tx);
            let (addr, token) = (s.addr.clone(), s.root_token.clone());
            let value = "x".repeat(64);
            hs.push(checkers(1, rx, move |a, (path, _, _)| {
                reads_back(a, &addr, &token, path, &value)
            }));
        }
        let w = paced(&p, &format!("lag{n}"), rate, secs * 2.0, EVERY, sinks);
        let mut lags: Vec<f64> = hs.into_iter().flat_map(join_lags).collect();
        for s in &secs_ {
            wait("in sync after the lag phase", 600, || synced(&p, s));
        }
        let (l50, l99) = (percentile(&mut lags, 0.5), percentile(&mut lags, 0.99));
        let lmax = lags.last().copied().unwrap_or(0.0);
        let samples = lags.len();
        let cell = |v: f64| if n == 0 { String::new() } else { num(v, 2) };
        table.row(vec![
            n.to_string(),
            num(tput, 0),
            base.map_or(String::new(), |b| num(tput / b, 2)),
            num(p50, 2),
            num(p99, 2),
            errs.to_string(),
            num(cpu_p, 0),
            if n == 0 { String::new() } else { num(cpu_s, 0) },
            num(catchup, 2),
            num(w.rate, 0),
            cell(l50),
            cell(l99),
            cell(lmax),
            samples.to_string(),
            w.errors.to_string(),
        ]);
        last = (base.map(|b| tput / b), l99);
    }
    println!(
        "Primary throughput with CLIENTS = {clients} concurrent writers for {secs} s; lag at \
         {rate} paced writes/s for {} s, every {EVERY}th write sampled on every secondary{}.\n",
        secs * 2.0,
        nice.map_or(String::new(), |n| format!("; secondaries at niceness {n}"))
            + &pin.as_ref().map_or(String::new(), |(a, b)| format!(
                "; load generator and primary pinned to CPUs {a}, secondaries to CPUs {b}"
            ))
    );
    table.finish(&[
        "--x",
        "secondaries",
        "--y",
        "writes_per_s",
        "--y2",
        "lag_p50_ms,lag_p99_ms",
        "--title",
        "Primary write throughput and replication lag vs performance secondaries",
        "--xlabel",
        "performance secondaries attached",
        "--ylabel",
        "acknowledged writes/s",
        "--y2label",
        "lag (ms)",
    ]);
    if let Some(&n) = counts.last() {
        let tput = match last.0 {
            Some(r) => format!(
                "{r:.2}× the throughput with none (target ≥ 0.7×: {})",
                if r >= 0.7 { "met" } else { "MISSED" }
            ),
            None => "no throughput ratio (the counts did not start at 0)".to_string(),
        };
        println!(
            "with {n} secondaries: {tput}; lag p99 {:.2} ms (target ≤ 50 ms: {})",
            last.1,
            if last.1 <= 50.0 { "met" } else { "MISSED" }
        );
    }
}

/// Pins every thread of process `pid` (and the threads it starts later) to `cpus`.
fn pin_to(pid: u32, cpus: &str) {
    let ok = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(ok, "taskset -a -p -c {cpus} {pid} failed");
}
