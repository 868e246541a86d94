//! `kill-cycles N [SEED]`: the long `kill -9` campaign (not part of CI), through
//! `scripts/kill-cycles.sh`. Runs the scenario of [`cairn_tests::kill9`] for N cycles on one
//! cluster (a fresh random seed unless SEED is given), prints one progress line per cycle
//! with running totals (so a stopped run still gives figures), then the Markdown tables:
//! kills per role and moment, writes attempted, acknowledged, lost, convergence.
//!
//! Environment: `CAIRN_BIN` (the server binary), `KILL_PACE_MS` (pause between two writes
//! of a writer thread, default 10: bounds the data a long run builds up),
//! `KILL_BUDGET_SECS` (stop starting cycles after that long; the final check still runs),
//! `KILL_STOP_FILE` (stop starting cycles once that file exists). Exits 1 on a failure,
//! printing the seed and the command that replays it.

use cairn_tests::kill9::{self, Options, Tally};
use std::sync::Mutex;
use std::time::Duration;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.trim().parse().ok())
}

/// A seed drawn from the OS.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(cycles) = args.next().and_then(|s| s.parse::<usize>().ok()) else {
        eprintln!("usage: kill-cycles N [SEED]");
        std::process::exit(2);
    };
    let seed = args
        .next()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(random_seed);
    let opts = Options {
        seed,
        cycles,
        pace_ms: env_u64("KILL_PACE_MS").unwrap_or(10),
        budget: env_u64("KILL_BUDGET_SECS").map(Duration::from_secs),
        stop_file: std::env::var("KILL_STOP_FILE").ok().map(Into::into),
        progress_every: 1,
    };
    kill9::set_quiet(true);
    let replay = format!("scripts/kill-cycles.sh {cycles} {seed}");
    println!("kill-cycles: {cycles} cycles, seed {seed} (replay: {replay}); options {opts:?}");
    let tally = Mutex::new(Tally::default());
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| kill9::run(&opts, &tally)));
    let t = tally.into_inner().unwrap_or_else(|e| e.into_inner());
    println!();
    match &res {
        Ok(false) => println!("kill-cycles: seed {seed}: all {} cycles done", t.cycles),
        Ok(true) => println!(
            "kill-cycles: seed {seed}: STOPPED early (time budget or stop file) after {} of {cycles} cycles",
            t.cycles
        ),
        Err(_) => println!(
            "kill-cycles: seed {seed}: FAILED after {} cycles (the panic message is above); replay with: {replay}",
            t.cycles
        ),
    }
    println!("totals: {}", t.line());
    println!();
    print!("{}", t.markdown());
    if res.is_err() || t.lost > 0 {
        std::process::exit(1);
    }
}
