//! cairn-sim: deterministic simulation of Cairn nodes with fault injection and invariant
//! checkers.
//!
//! A run is a pure function of one master seed (`u64`): every random choice (node RNG
//! seeds, network delays, operator actions, crashes, clock jumps) comes from streams
//! derived from it ([`rng`]), simulated time only moves when the driver says so, and
//! nothing reaches the trace in hash-map order. Replaying a seed reproduces the run byte
//! for byte, which the trace hash ([`trace`]) proves.
//!
//! Tiers: [`Tier::Fast`] drives bare `cairn_core::Node`s from one thread ([`world`],
//! [`repl`]); [`Tier::Turmoil`] ([`tcp`]) runs the same replication world (operator,
//! drills, checkers) with the peer messages over turmoil TCP between turmoil hosts
//! (connection breaks mid-stream, held links, partitions during a Merkle sync).
//!
//! Module map: [`host`] (one machine of any tier: node, storage that outlives crashes,
//! outputs held until their batch commits, boot incarnation), [`storage`] (group commit,
//! crashes, planted faults), [`net`] (seeded
//! network), [`operator`] (clients and their ops), [`model`] (expected state, ACL
//! evaluator), [`check`] (invariants), [`world`] (the driver), [`repl`] (replication
//! topologies on the fast tier: primary + perf/filtered/DR secondaries, peer and HTTP
//! calls over the seeded network, their own operator and checkers; about a third of the
//! seeds, see [`repl::wants_replication`]), [`trace`] (event log, with the core's log
//! records, see [`logger`]).

pub mod check;
pub mod ha;
pub mod host;
pub mod ldap;
pub mod logger;
pub mod model;
pub mod net;
pub mod operator;
pub mod repl;
pub mod rng;
pub mod storage;
pub mod tcp;
pub mod trace;
pub mod world;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

pub use storage::StorageFault;

/// Events of the chaos phase per seed unless `--steps` says otherwise.
pub const DEFAULT_STEPS: u64 = 3_000;

/// Which simulator runs a seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Bare nodes, one thread, an in-memory network: most seeds run here.
    Fast,
    /// Nodes as turmoil hosts, peer messages over turmoil TCP ([`tcp`]).
    Turmoil,
    /// One HA cluster of one to three nodes over a shared store with a leadership lease
    /// ([`ha`]).
    Ha,
}

impl std::str::FromStr for Tier {
    type Err = String;
    fn from_str(s: &str) -> Result<Tier, String> {
        match s {
            "fast" => Ok(Tier::Fast),
            "turmoil" => Ok(Tier::Turmoil),
            "ha" => Ok(Tier::Ha),
            other => Err(format!(
                "unknown tier {other:?} (available: fast, turmoil, ha)"
            )),
        }
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tier::Fast => write!(f, "fast"),
            Tier::Turmoil => write!(f, "turmoil"),
            Tier::Ha => write!(f, "ha"),
        }
    }
}

/// The topology a seed's replication world gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Profile {
    /// One primary and one to three secondaries on about a third of the seeds (the
    /// others run the single-node world).
    #[default]
    Default,
    /// Every seed: one primary, twelve performance secondaries (every third
    /// path-filtered) and three DR secondaries.
    Scale,
}

impl std::str::FromStr for Profile {
    type Err = String;
    fn from_str(s: &str) -> Result<Profile, String> {
        match s {
            "default" => Ok(Profile::Default),
            "scale" => Ok(Profile::Scale),
            other => Err(format!(
                "unknown profile {other:?} (available: default, scale)"
            )),
        }
    }
}

/// How to run one seed.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub seed: u64,
    pub tier: Tier,
    /// Events of the chaos phase; a bounded final phase (crash, unseal, read-back) follows.
    pub steps: u64,
    /// Print every trace line as it happens.
    pub print_trace: bool,
    /// A planted storage bug (for testing the checkers).
    pub fault: Option<StorageFault>,
    /// The replication topology (every tier; on the HA tier each secondary is an HA cluster).
    pub profile: Profile,
}

impl RunConfig {
    pub fn new(seed: u64) -> RunConfig {
        RunConfig {
            seed,
            tier: Tier::Fast,
            steps: DEFAULT_STEPS,
            print_trace: false,
            fault: None,
            profile: Profile::Default,
        }
    }

    /// The command that replays this run exactly.
    pub fn replay_command(&self) -> String {
        let mut cmd = format!("cargo run -p cairn-sim --release -- --seed {}", self.seed);
        if self.tier != Tier::Fast {
            cmd.push_str(&format!(" --tier {}", self.tier));
        }
        if self.steps != DEFAULT_STEPS {
            cmd.push_str(&format!(" --steps {}", self.steps));
        }
        if self.profile == Profile::Scale {
            cmd.push_str(" --profile scale");
        }
        match self.fault {
            Some(StorageFault::DropCommittedWrite) => {
                cmd.push_str(" --plant-fault drop-committed-write")
            }
            Some(StorageFault::SkipFenceCheck) => cmd.push_str(" --plant-fault skip-fence-check"),
            Some(StorageFault::ReadBesideUncommitted) => {
                cmd.push_str(" --plant-fault read-beside-uncommitted")
            }
            None => {}
        }
        cmd
    }
}

/// A broken invariant with what is needed to understand and replay it.
#[derive(Debug, Clone)]
pub struct Failure {
    pub invariant: String,
    pub detail: String,
    /// Simulated time of the failure, ms.
    pub at_ms: u64,
    /// The last trace lines before the failure.
    pub last_events: Vec<String>,
}

/// The result of one seed.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub config: RunConfig,
    pub params: String,
    pub events: u64,
    /// Simulated time at the end, ms.
    pub sim_ms: u64,
    pub trace_hash: String,
    pub stats: world::WorldStats,
    /// How often each invariant was checked.
    pub checks: BTreeMap<&'static str, u64>,
    pub failure: Option<Failure>,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.failure.is_none()
    }

    /// The failure report: invariant, seed, time, last events, replay command.
    pub fn report(&self) -> String {
        let Some(f) = &self.failure else {
            return format!("seed {} ok", self.config.seed);
        };
        let mut s = String::new();
        s.push_str(&format!("INVARIANT VIOLATED: {}\n", f.invariant));
        s.push_str(&format!("  seed: {}\n", self.config.seed));
        s.push_str(&format!(
            "  simulated time: {}.{:03}s (event {})\n",
            f.at_ms / 1000,
            f.at_ms % 1000,
            self.events
        ));
        s.push_str(&format!("  params: {}\n", self.params));
        s.push_str(&format!("  detail: {}\n", f.detail));
        s.push_str(&format!("  last {} events:\n", f.last_events.len()));
        for l in &f.last_events {
            s.push_str(&format!("    {l}\n"));
        }
        s.push_str(&format!("  replay: {}\n", self.config.replay_command()));
        s
    }
}

pub(crate) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".into()
    }
}

/// Runs one seed to the end or to the first broken invariant. An ERROR the core logged
/// during the run fails the seed too (see [`logger`]).
pub fn run(cfg: &RunConfig) -> Outcome {
    logger::init();
    let _ = logger::take_errors();
    let _ = logger::take_records();
    let o = match cfg.tier {
        Tier::Fast => run_fast(cfg),
        Tier::Turmoil => tcp::run(cfg),
        Tier::Ha => ha::run(cfg),
    };
    with_logged_errors(o, logger::take_errors())
}

/// Fails an otherwise passing seed whose core logged errors.
fn with_logged_errors(mut o: Outcome, errors: Vec<String>) -> Outcome {
    if o.failure.is_none() && !errors.is_empty() {
        o.failure = Some(Failure {
            invariant: "core-logged-no-error".into(),
            detail: format!(
                "the core logged {} error(s) during the run: {}",
                errors.len(),
                errors.join(" | ")
            ),
            at_ms: o.sim_ms,
            last_events: Vec::new(),
        });
    }
    o
}

fn run_fast(cfg: &RunConfig) -> Outcome {
    // Replication topologies on a fraction of the seeds; a planted storage fault keeps the
    // single-node world, whose durability checker is the one it is meant for.
    if cfg.fault.is_none() && (cfg.profile == Profile::Scale || repl::wants_replication(cfg.seed)) {
        return run_repl(cfg, repl::ReplWorld::new(cfg));
    }
    let mut w = world::World::new(cfg);
    let failure = loop {
        match catch_unwind(AssertUnwindSafe(|| w.step())) {
            Ok(Ok(world::Step::Continue)) => {}
            Ok(Ok(world::Step::Finished)) => break None,
            Ok(Err(v)) => break Some((v.invariant.to_string(), v.detail)),
            Err(p) => break Some(("no-panic".to_string(), panic_text(&*p))),
        }
    };
    let failure = failure.map(|(invariant, detail)| Failure {
        invariant,
        detail,
        at_ms: w.now,
        last_events: w.trace().tail(),
    });
    Outcome {
        config: cfg.clone(),
        params: w.params().describe(),
        events: w.stats().events,
        sim_ms: w.now,
        trace_hash: w.trace().hash(),
        stats: w.stats(),
        checks: w.checker().counts().clone(),
        failure,
    }
}

/// Runs a replication world (fast or turmoil tier) to the end or to the first broken
/// invariant.
pub(crate) fn run_repl(cfg: &RunConfig, mut w: repl::ReplWorld) -> Outcome {
    let failure = loop {
        match catch_unwind(AssertUnwindSafe(|| w.step())) {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => break None,
            Ok(Err(v)) => break Some((v.invariant.to_string(), v.detail)),
            Err(p) => break Some(("no-panic".to_string(), panic_text(&*p))),
        }
    };
    let failure = failure.map(|(invariant, detail)| Failure {
        invariant,
        detail,
        at_ms: w.now,
        last_events: w.trace().tail(),
    });
    let s = w.stats;
    let mut checks = w.checks.clone();
    if let Some((breaks, msgs)) = w.tcp_counts() {
        checks.insert("turmoil:breaks-mid-stream", breaks);
        checks.insert("turmoil:peer-msgs", msgs);
    }
    Outcome {
        config: cfg.clone(),
        params: w.describe(),
        events: s.events,
        sim_ms: w.now,
        trace_hash: w.trace().hash(),
        stats: world::WorldStats {
            events: s.events,
            requests: s.requests,
            ticks: s.ticks,
            commits: s.commits,
            crashes: s.crashes,
            restarts: s.restarts,
            clock_jumps: s.clock_jumps,
            jumped_ms: s.jumped_ms,
            lost_requests: s.lost_requests,
        },
        checks,
        failure,
    }
}

/// The seeds `--seeds K` runs from a starting seed.
pub fn seed_sequence(start: u64, k: u64) -> impl Iterator<Item = u64> {
    (0..k).map(move |i| rng::splitmix64(start.wrapping_add(i)))
}

/// Parses a regressions file: one seed per line, `#` starts a comment.
pub fn parse_regressions(text: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let seed = parse_seed(line).map_err(|e| format!("line {}: {e}", n + 1))?;
        out.push(seed);
    }
    Ok(out)
}

/// A seed in decimal or `0x` hex.
pub fn parse_seed(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("not a seed (u64, decimal or 0x hex): {s:?}"))
}

#[cfg(test)]
mod logged_error_tests {
    use super::*;

    /// The checker fires on a planted error: a seed that passes otherwise fails when the
    /// core logs an ERROR while it runs, and names it.
    #[test]
    fn a_planted_core_error_fails_the_seed() {
        let cfg = RunConfig::new(3);
        logger::init();
        let _ = logger::take_errors();
        let o = run(&cfg);
        assert!(o.ok(), "{}", o.report());
        log::error!(target: "cairn_core::planted", "planted failure");
        let o = with_logged_errors(o, logger::take_errors());
        let f = o.failure.expect("the planted error fails the seed");
        assert_eq!(f.invariant, "core-logged-no-error");
        assert!(f.detail.contains("planted failure"), "{}", f.detail);
    }
}
