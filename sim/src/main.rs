//! `cairn-sim`: command-line front end of the simulator. Argument handling only; the
//! simulation lives in the library. This is the one place that may read the clock or the
//! OS (for the starting seed of `--seeds` and for throughput figures): nothing read here
//! reaches a simulation except as a printed seed.

use cairn_sim::{
    parse_regressions, parse_seed, run, seed_sequence, Outcome, Profile, RunConfig, StorageFault,
    Tier, DEFAULT_STEPS,
};
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Prints a line; a closed stdout (`| head`) is not an error worth a panic.
macro_rules! say {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

macro_rules! say_raw {
    ($($t:tt)*) => {{
        let _ = write!(std::io::stdout().lock(), $($t)*);
    }};
}

const USAGE: &str = "\
usage: cairn-sim [options] (--seed N | --seeds K [--start S] | --regressions [FILE])

  --seed N          run one seed (decimal or 0x hex) and print its trace hash
  --seeds K         run K seeds derived from a random starting seed (printed)
  --start S         starting seed for --seeds (to repeat a batch)
  --regressions [F] run every seed listed in F (default: sim/regressions)
  --steps M         events in the chaos phase of each seed (default 3000); a bounded
                    final phase (crash every node, unseal, read everything back) follows
  --tier T          simulator tier: fast (default), turmoil (sockets) or ha (one HA
                    cluster over a shared store with a leadership lease)
  --profile P       replication topology: default (1 primary + 1-3 secondaries on a
                    third of the seeds) or scale (every seed: 1 primary, 12 performance
                    and 3 DR secondaries; on the ha tier each of them an HA cluster of
                    1-3 nodes on a store of its own)
  --trace           print the event log
  --plant-fault drop-committed-write
                    plant a storage bug the durability checker must catch
  --plant-fault skip-fence-check
                    (ha tier) the store forgets the lease epoch check on commit
";

enum Mode {
    One(u64),
    Many { k: u64, start: Option<u64> },
    Regressions(String),
}

struct Args {
    mode: Mode,
    steps: u64,
    tier: Tier,
    trace: bool,
    fault: Option<StorageFault>,
    profile: Profile,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1).peekable();
    let mut seed = None;
    let mut seeds = None;
    let mut start = None;
    let mut regressions = None;
    let mut steps = DEFAULT_STEPS;
    let mut tier = Tier::Fast;
    let mut trace = false;
    let mut fault = None;
    let mut profile = Profile::Default;
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--seed" => seed = Some(parse_seed(&value("--seed")?)?),
            "--seeds" => {
                seeds = Some(
                    value("--seeds")?
                        .parse::<u64>()
                        .map_err(|_| "--seeds takes a count".to_string())?,
                )
            }
            "--start" => start = Some(parse_seed(&value("--start")?)?),
            "--steps" => {
                steps = value("--steps")?
                    .parse()
                    .map_err(|_| "--steps takes a count".to_string())?
            }
            "--tier" => tier = value("--tier")?.parse()?,
            "--profile" => profile = value("--profile")?.parse()?,
            "--trace" => trace = true,
            "--plant-fault" => match value("--plant-fault")?.as_str() {
                "drop-committed-write" => fault = Some(StorageFault::DropCommittedWrite),
                "skip-fence-check" => fault = Some(StorageFault::SkipFenceCheck),
                "read-beside-uncommitted" => fault = Some(StorageFault::ReadBesideUncommitted),
                other => return Err(format!("unknown fault {other:?}")),
            },
            "--regressions" => {
                let file = match it.peek() {
                    Some(next) if !next.starts_with("--") => it.next().unwrap_or_default(),
                    _ => concat!(env!("CARGO_MANIFEST_DIR"), "/regressions").to_string(),
                };
                regressions = Some(file);
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let mode = match (seed, seeds, regressions) {
        (Some(s), None, None) => Mode::One(s),
        (None, Some(k), None) => Mode::Many { k, start },
        (None, None, Some(f)) => Mode::Regressions(f),
        _ => return Err("choose exactly one of --seed, --seeds, --regressions".into()),
    };
    Ok(Args {
        mode,
        steps,
        tier,
        trace,
        fault,
        profile,
    })
}

/// A starting seed from the OS clock and process id (only for `--seeds` without `--start`).
#[allow(clippy::disallowed_methods)] // the one allowed source of non-determinism: a printed seed
fn random_start() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_nanos() as u64;
    cairn_sim::rng::splitmix64(nanos ^ ((std::process::id() as u64) << 32))
}

fn config(args: &Args, seed: u64) -> RunConfig {
    RunConfig {
        seed,
        tier: args.tier,
        steps: args.steps,
        print_trace: args.trace,
        fault: args.fault,
        profile: args.profile,
    }
}

fn secs(ms: u64) -> String {
    format!("{}.{:03}s", ms / 1000, ms % 1000)
}

fn one_line(o: &Outcome) -> String {
    format!(
        "seed {} {} events={} sim={} requests={} crashes={} jumps={} hash={}",
        o.config.seed,
        if o.ok() { "ok" } else { "FAIL" },
        o.events,
        secs(o.sim_ms),
        o.stats.requests,
        o.stats.crashes,
        o.stats.clock_jumps,
        &o.trace_hash[..16]
    )
}

fn run_one(args: &Args, seed: u64) -> ExitCode {
    let cfg = config(args, seed);
    say!(
        "cairn-sim seed={seed} tier={} steps={}",
        cfg.tier,
        cfg.steps
    );
    let o = run(&cfg);
    say!("params: {}", o.params);
    if let Some(_f) = &o.failure {
        say_raw!("{}", o.report());
    }
    let s = &o.stats;
    say!(
        "result: {} events={} sim-time={} requests={} commits={} ticks={} crashes={} restarts={} clock-jumps={} lost={}",
        if o.ok() { "ok" } else { "FAIL" },
        o.events,
        secs(o.sim_ms),
        s.requests,
        s.commits,
        s.ticks,
        s.crashes,
        s.restarts,
        s.clock_jumps,
        s.lost_requests
    );
    let checks: Vec<String> = o.checks.iter().map(|(k, v)| format!("{k}={v}")).collect();
    say!("checks: {}", checks.join(" "));
    say!("trace hash: {}", o.trace_hash);
    if o.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[allow(clippy::disallowed_methods)] // wall time for throughput figures only
fn run_many(args: &Args, k: u64, start: Option<u64>) -> ExitCode {
    let start = start.unwrap_or_else(random_start);
    say!(
        "cairn-sim: {k} seeds from start {start} (repeat with --seeds {k} --start {start}), tier={} steps={}",
        args.tier, args.steps
    );
    let t0 = Instant::now();
    let (mut n, mut sim_ms, mut events, mut jumped_ms) = (0u64, 0u64, 0u64, 0u64);
    for seed in seed_sequence(start, k) {
        let o = run(&config(args, seed));
        n += 1;
        sim_ms += o.sim_ms;
        events += o.events;
        jumped_ms += o.stats.jumped_ms;
        say!("{}", one_line(&o));
        if !o.ok() {
            say_raw!("{}", o.report());
            return ExitCode::FAILURE;
        }
    }
    let wall = t0.elapsed().as_secs_f64().max(1e-9);
    say!(
        "all {n} seeds ok in {wall:.1}s wall: {:.0} seeds/min, {:.0} simulated s per wall s \
         ({:.0} without clock jumps), {:.0} events/s",
        n as f64 * 60.0 / wall,
        sim_ms as f64 / 1000.0 / wall,
        sim_ms.saturating_sub(jumped_ms) as f64 / 1000.0 / wall,
        events as f64 / wall
    );
    ExitCode::SUCCESS
}

fn run_regressions(args: &Args, file: &str) -> ExitCode {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cairn-sim: cannot read {file}: {e}");
            return ExitCode::from(2);
        }
    };
    let seeds = match parse_regressions(&text) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cairn-sim: {file}: {e}");
            return ExitCode::from(2);
        }
    };
    say!("cairn-sim: {} regression seeds from {file}", seeds.len());
    let mut failed = 0;
    for seed in seeds {
        let o = run(&config(args, seed));
        say!("{}", one_line(&o));
        if !o.ok() {
            failed += 1;
            say_raw!("{}", o.report());
        }
    }
    if failed > 0 {
        say!("{failed} regression seed(s) failed");
        ExitCode::FAILURE
    } else {
        say!("all regression seeds ok");
        ExitCode::SUCCESS
    }
}

fn main() -> ExitCode {
    cairn_sim::logger::init();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("cairn-sim: {e}");
            }
            eprint!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match &args.mode {
        Mode::One(seed) => run_one(&args, *seed),
        Mode::Many { k, start } => run_many(&args, *k, *start),
        Mode::Regressions(file) => run_regressions(&args, file),
    }
}
