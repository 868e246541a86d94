//! The `kill -9` scenario, shared by the CI test (`tests/tests/faults.rs`) and the long
//! campaign (`tests/src/bin/kill-cycles.rs`, through `scripts/kill-cycles.sh`): a primary, a
//! performance secondary and a DR secondary (real processes), writer threads remembering
//! every acknowledged write, and cycles that each `kill -9` one server at a chosen moment:
//!
//! - **streaming**: any role, at a random moment of ordinary replication;
//! - **Merkle sync**: a secondary kept away for 3× the WAL retention, killed as soon as its
//!   status shows `merkle-sync` (the keep-away kill itself counts as a streaming kill);
//! - **reindex**: `sys/replication/reindex` on the primary or the performance secondary, and
//!   the DR secondary's own reindex (`sys/replication/dr/secondary/reindex`, with a DR
//!   operation token made from the primary's key shares), killed while the status says
//!   `reindex_in_progress` (the reindex resumes after the restart and must finish);
//! - **snapshot**: the primary, while a `GET sys/storage/raft/snapshot` runs in a thread.
//!
//! Cycles come in blocks of nine (each of the nine role × moment kinds once, shuffled by
//! the seed; the first block runs the streaming kills, the Merkle syncs, the snapshot and
//! then the reindexes, and a reindex waits for 2,000 acknowledged writes: a reindex of
//! less data ends before a status poll can see it). After each cycle the killed server is restarted on the same data directory
//! and port and unsealed, both secondaries must converge (equal Merkle roots, same last
//! WAL), and every write acknowledged since the previous cycle plus 50 older ones read back
//! on the primary and the performance secondary; at the end, all of them. A moment that was
//! not caught (e.g. the reindex finished before the poll saw it) after three attempts (five
//! for a reindex) is counted as missed. The figures accumulate in a [`Tally`], which the caller can print even
//! after a failure.

mod cluster;

pub use cluster::{ok, secondary_token, to_check, Cluster, Member, Writers, WAL_ENTRIES};

use crate::{agent, request};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static QUIET: AtomicBool = AtomicBool::new(false);

/// Whether per-restart lines are left out (the campaign prints one line per cycle instead).
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// Leaves out the per-restart lines.
pub fn set_quiet(q: bool) {
    QUIET.store(q, Ordering::Relaxed);
}

pub const ROLES: [&str; 3] = ["primary", "perf secondary", "DR secondary"];

/// When a kill landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moment {
    Streaming = 0,
    MerkleSync = 1,
    ReindexPrimary = 2,
    ReindexPerf = 3,
    ReindexDr = 4,
    Snapshot = 5,
}

impl Moment {
    pub const ALL: [Moment; 6] = [
        Moment::Streaming,
        Moment::MerkleSync,
        Moment::ReindexPrimary,
        Moment::ReindexPerf,
        Moment::ReindexDr,
        Moment::Snapshot,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Moment::Streaming => "streaming (random moment)",
            Moment::MerkleSync => "Merkle sync (secondary kept away past the WAL retention)",
            Moment::ReindexPrimary => "reindex of the primary",
            Moment::ReindexPerf => "reindex of the perf secondary",
            Moment::ReindexDr => "DR secondary's own reindex (DR operation token)",
            Moment::Snapshot => "snapshot on the primary (`GET sys/storage/raft/snapshot`)",
        }
    }
}

/// A planned cycle: the kind of fault it aims at.
#[derive(Clone, Copy, Debug)]
enum Plan {
    Streaming(usize),
    Merkle(usize),
    Reindex(usize),
    Snapshot,
}

/// One block of cycles: every kind once.
const BLOCK: [Plan; 9] = [
    Plan::Streaming(0),
    Plan::Streaming(1),
    Plan::Streaming(2),
    Plan::Merkle(1),
    Plan::Merkle(2),
    Plan::Reindex(0),
    Plan::Reindex(1),
    Plan::Reindex(2),
    Plan::Snapshot,
];

/// The running figures of a run.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Kills per moment (index: [`Moment`]) and role.
    pub kills: [[u64; 3]; 6],
    /// Planned moments not caught after three attempts (five for a reindex).
    pub missed: [u64; 6],
    pub cycles: u64,
    /// Cycles after which the cluster converged (all of them, or the run failed).
    pub converged: u64,
    pub acked: u64,
    pub attempted: u64,
    pub lost: u64,
    /// Read-backs done (a write checked on both servers counts once).
    pub read_back: u64,
    /// Write answers by status (0: no answer).
    pub statuses: BTreeMap<u16, u64>,
    pub slowest_converge_ms: u128,
    pub elapsed_s: f64,
    /// The final check of every acknowledged write was done.
    pub final_check: bool,
}

impl Tally {
    pub fn total_kills(&self) -> u64 {
        self.kills.iter().flatten().sum()
    }

    /// One line of running totals.
    pub fn line(&self) -> String {
        let per: Vec<String> = Moment::ALL
            .iter()
            .map(|m| {
                let k = self.kills[*m as usize];
                format!("{:?} {}/{}/{}", m, k[0], k[1], k[2])
            })
            .collect();
        format!(
            "{} cycles, {} kills (primary/perf/DR: {}), {} acknowledged of {} attempted, {} lost, {:.1}s ({:.2} s/cycle)",
            self.cycles,
            self.total_kills(),
            per.join(", "),
            self.acked,
            self.attempted,
            self.lost,
            self.elapsed_s,
            self.elapsed_s / (self.cycles.max(1) as f64)
        )
    }

    /// The Markdown tables of the run.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        s.push_str("| moment of the kill | primary | perf secondary | DR secondary | total | planned but not caught |\n");
        s.push_str("|---|---:|---:|---:|---:|---:|\n");
        for m in Moment::ALL {
            let k = self.kills[m as usize];
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                m.label(),
                k[0],
                k[1],
                k[2],
                k.iter().sum::<u64>(),
                self.missed[m as usize]
            ));
        }
        let role = |r: usize| self.kills.iter().map(|k| k[r]).sum::<u64>();
        s.push_str(&format!(
            "| **total** | **{}** | **{}** | **{}** | **{}** | {} |\n\n",
            role(0),
            role(1),
            role(2),
            self.total_kills(),
            self.missed.iter().sum::<u64>()
        ));
        s.push_str("| cycles | writes attempted | acknowledged | lost | converged after every cycle | read-backs | slowest convergence | time |\n");
        s.push_str("|---:|---:|---:|---:|---|---:|---:|---:|\n");
        s.push_str(&format!(
            "| {} | {} | {} | **{}** | {} ({} of {}) | {}{} | {:.1} s | {:.0} s ({:.2} s/cycle) |\n",
            self.cycles,
            self.attempted,
            self.acked,
            self.lost,
            if self.converged == self.cycles { "yes" } else { "NO" },
            self.converged,
            self.cycles,
            self.read_back,
            if self.final_check { " (all at the end)" } else { " (no final check)" },
            self.slowest_converge_ms as f64 / 1000.0,
            self.elapsed_s,
            self.elapsed_s / (self.cycles.max(1) as f64)
        ));
        s.push_str(&format!(
            "\nWrite answers by status (0 = no answer): {:?}\n",
            self.statuses
        ));
        s
    }
}

/// How a run goes.
#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    pub cycles: usize,
    /// Milliseconds each writer waits between writes (bounds the data a long run builds up).
    pub pace_ms: u64,
    /// Stop starting cycles after this long (the final check still runs).
    pub budget: Option<Duration>,
    /// Stop starting cycles once this file exists.
    pub stop_file: Option<PathBuf>,
    /// A progress line every this many cycles (0: none).
    pub progress_every: usize,
}

/// The seeded RNG of a run.
fn rng(seed: u64) -> rand_chacha::ChaCha8Rng {
    rand_chacha::ChaCha8Rng::seed_from_u64(seed)
}

fn between(rng: &mut rand_chacha::ChaCha8Rng, lo: u64, hi: u64) -> u64 {
    lo + rng.next_u64() % (hi - lo + 1)
}

fn sleep_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

/// The cycle plan of a run: blocks of [`BLOCK`], shuffled; in the first block only the
/// streaming kills are (in the order of [`BLOCK`], the reindexes come last, when there is
/// data enough for a poll to see them run).
fn schedule(rng: &mut rand_chacha::ChaCha8Rng, cycles: usize) -> Vec<Plan> {
    let mut order = Vec::with_capacity(cycles + BLOCK.len());
    while order.len() < cycles {
        let mut block = BLOCK;
        let n = if order.is_empty() { 3 } else { block.len() };
        for i in (1..n).rev() {
            block.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        if order.is_empty() {
            // Streaming ×3, Merkle ×2, snapshot, then the reindexes.
            block[5..].rotate_right(1);
        }
        order.extend(block);
    }
    order.truncate(cycles);
    order
}

/// What a cycle did: the kills that landed and a description.
struct Done {
    kills: Vec<(Moment, usize)>,
    missed: Option<Moment>,
    what: String,
}

/// Runs the scenario; the figures accumulate in `tally` (readable after a panic). Panics on
/// a lost acknowledged write, a cluster that does not converge, or an unexpected answer.
/// Returns whether the run stopped early (budget or stop file).
pub fn run(opts: &Options, tally: &Mutex<Tally>) -> bool {
    let started = Instant::now();
    let seed = opts.seed;
    let mut rng = rng(seed);
    let plan = schedule(&mut rng, opts.cycles);
    let mut c = Cluster::start(seed);
    eprintln!(
        "kill9: seed {seed}: cluster up in {} ms; {} cycles",
        started.elapsed().as_millis(),
        opts.cycles
    );
    let (w, handles) = Writers::start(&c.p.s.addr, &c.p.s.root_token, 2, opts.pace_ms);
    let mut checked = BTreeMap::new();
    let update = |f: &mut dyn FnMut(&mut Tally)| {
        let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut t);
    };
    let mut stopped = false;
    for (cycle, p) in plan.iter().enumerate() {
        if opts.budget.is_some_and(|b| started.elapsed() >= b)
            || opts.stop_file.as_ref().is_some_and(|f| f.exists())
        {
            eprintln!("kill9: stopping after {cycle} cycles (time budget or stop file)");
            stopped = true;
            break;
        }
        let done = match *p {
            Plan::Streaming(role) => streaming(&mut c, &w, &mut rng, role),
            Plan::Merkle(role) => merkle(&mut c, &w, &mut rng, role),
            Plan::Reindex(role) => reindex(&mut c, &w, &mut rng, role),
            Plan::Snapshot => snapshot(&mut c, &w, &mut rng),
        };
        let what = format!("cycle {cycle}: {}", done.what);
        let t = Instant::now();
        c.wait_converged(&what, 120);
        let converge_ms = t.elapsed().as_millis();
        let acked = w.acked();
        let keys = to_check(&acked, &mut checked, &mut rng);
        let lost = c.check_acked(&keys, 2);
        update(&mut |t: &mut Tally| {
            for (m, role) in &done.kills {
                t.kills[*m as usize][*role] += 1;
            }
            if let Some(m) = done.missed {
                t.missed[m as usize] += 1;
            }
            t.cycles += 1;
            t.converged += 1;
            t.slowest_converge_ms = t.slowest_converge_ms.max(converge_ms);
            t.acked = acked.len() as u64;
            t.attempted = w.attempts.load(Ordering::Relaxed);
            t.lost += lost.len() as u64;
            t.read_back += keys.len() as u64;
            t.elapsed_s = started.elapsed().as_secs_f64();
        });
        assert!(
            lost.is_empty(),
            "seed {seed}: {} acknowledged writes lost after {what}:\n{}",
            lost.len(),
            lost.join("\n")
        );
        if opts.progress_every > 0 && (cycle + 1) % opts.progress_every == 0 {
            eprintln!(
                "{what}: converged in {converge_ms} ms; {} read back; totals: {}",
                keys.len(),
                tally.lock().unwrap_or_else(|e| e.into_inner()).line()
            );
        }
    }

    // Every acknowledged write, on the primary and the performance secondary.
    w.stop.store(true, Ordering::SeqCst);
    for h in handles {
        let _ = h.join();
    }
    c.wait_converged("the end", 120);
    let all: Vec<(String, u64)> = w.acked().into_iter().collect();
    let t = Instant::now();
    let lost = c.check_acked(&all, 4);
    let statuses = w.statuses.lock().unwrap_or_else(|e| e.into_inner()).clone();
    update(&mut |t: &mut Tally| {
        t.acked = all.len() as u64;
        t.attempted = w.attempts.load(Ordering::Relaxed);
        t.lost += lost.len() as u64;
        t.read_back += all.len() as u64;
        t.statuses = statuses.clone();
        t.final_check = true;
        t.elapsed_s = started.elapsed().as_secs_f64();
    });
    eprintln!(
        "kill9: final check of {} acknowledged writes on two servers in {:.1}s",
        all.len(),
        t.elapsed().as_secs_f64()
    );
    assert!(
        lost.is_empty(),
        "seed {seed}: {} acknowledged writes lost at the end:\n{}",
        lost.len(),
        lost.join("\n")
    );
    assert!(
        !statuses.contains_key(&200),
        "seed {seed}: a KV v1 write answered 200 (Vault answers 204): {statuses:?}"
    );
    stopped
}

/// A kill of `role` at a random moment of ordinary streaming.
fn streaming(c: &mut Cluster, w: &Writers, rng: &mut rand_chacha::ChaCha8Rng, role: usize) -> Done {
    w.resume();
    let before_kill = between(rng, 0, 500);
    let down = between(rng, 0, 300);
    sleep_ms(before_kill);
    c.member(role).kill();
    sleep_ms(down);
    c.member(role).restart();
    sleep_ms(between(rng, 50, 300));
    w.pause();
    Done {
        kills: vec![(Moment::Streaming, role)],
        missed: None,
        what: format!(
            "kill -9 of the {} while streaming, {before_kill} ms in, down {down} ms",
            ROLES[role]
        ),
    }
}

/// A secondary kept away past the WAL retention resyncs by Merkle diff/sync; it is killed
/// during that sync and restarted.
fn merkle(c: &mut Cluster, w: &Writers, rng: &mut rand_chacha::ChaCha8Rng, role: usize) -> Done {
    let mode = if role == 1 { "performance" } else { "dr" };
    let mut kills = Vec::new();
    let mut seen = String::new();
    // Writes go as fast as they are answered while the secondary is away.
    let pace = w.set_pace(0);
    for attempt in 0..3 {
        c.member(role).kill();
        kills.push((Moment::Streaming, role));
        let target = w.acked_len() + 3 * WAL_ENTRIES * (attempt + 1);
        w.resume();
        let deadline = Instant::now() + Duration::from_secs(60);
        while w.acked_len() < target && Instant::now() < deadline {
            sleep_ms(5);
        }
        c.member(role).restart();
        // Writes continue during the resync; kill as soon as the Merkle sync shows.
        let deadline = Instant::now() + Duration::from_secs(30);
        seen.clear();
        while Instant::now() < deadline {
            let st = c.member(role).status(mode);
            let state = st["state"].as_str().unwrap_or("").to_string();
            if state == "merkle-sync" {
                c.member(role).kill();
                kills.push((Moment::MerkleSync, role));
                sleep_ms(between(rng, 0, 200));
                c.member(role).restart();
                sleep_ms(between(rng, 50, 300));
                w.pause();
                w.set_pace(pace);
                return Done {
                    kills,
                    missed: None,
                    what: format!(
                        "{} kept away past the WAL retention, killed during the Merkle sync (attempt {attempt}, states seen:{seen})",
                        ROLES[role]
                    ),
                };
            }
            if state == "stream-wals" && seen.contains("merkle") {
                break;
            }
            if !seen.ends_with(&state) {
                seen.push_str(&format!(" {state}"));
            }
            sleep_ms(1);
        }
    }
    w.pause();
    w.set_pace(pace);
    Done {
        kills,
        missed: Some(Moment::MerkleSync),
        what: format!(
            "{} kept away past the WAL retention, Merkle sync not caught (states seen:{seen})",
            ROLES[role]
        ),
    }
}

/// Starts a reindex of `role` (the DR secondary's own with a DR operation token) in a thread.
fn start_reindex(c: &mut Cluster, role: usize) -> std::thread::JoinHandle<Option<crate::Resp>> {
    let (path, token, body) = if role == 2 {
        let op = c.dr_op_token(false);
        (
            "sys/replication/dr/secondary/reindex",
            None,
            json!({ "dr_operation_token": op }),
        )
    } else {
        let m = c.member(role);
        (
            "sys/replication/reindex",
            Some(m.s.root_token.clone()),
            json!({}),
        )
    };
    let addr = c.member(role).s.addr.clone();
    std::thread::spawn(move || {
        request(
            &agent(Duration::from_secs(120)),
            &addr,
            token.as_deref(),
            "POST",
            path,
            Some(&body),
        )
    })
}

/// Attempts at catching a reindex in progress.
const REINDEX_ATTEMPTS: u64 = 5;

/// The acknowledged writes there are before a reindex is started.
const REINDEX_MIN_KEYS: usize = 2000;

/// A kill during a reindex (which resumes after the restart and must finish).
fn reindex(c: &mut Cluster, w: &Writers, rng: &mut rand_chacha::ChaCha8Rng, role: usize) -> Done {
    let mode = if role == 1 { "performance" } else { "dr" };
    let moment = [
        Moment::ReindexPrimary,
        Moment::ReindexPerf,
        Moment::ReindexDr,
    ][role];
    let seed = c.seed;
    let mut caught = None;
    // A reindex of a few hundred keys can end between two polls: write up to
    // [`REINDEX_MIN_KEYS`] first (once per run, in effect).
    if w.acked_len() < REINDEX_MIN_KEYS {
        let pace = w.set_pace(0);
        w.resume();
        let deadline = Instant::now() + Duration::from_secs(60);
        while w.acked_len() < REINDEX_MIN_KEYS && Instant::now() < deadline {
            sleep_ms(5);
        }
        w.set_pace(pace);
    }
    for attempt in 0..REINDEX_ATTEMPTS {
        // More data at each attempt: a reindex of little data can end before a poll sees it.
        w.resume();
        sleep_ms(between(rng, 20, 300) * (attempt + 1));
        let poster = start_reindex(c, role);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && !poster.is_finished() {
            if c.member(role).status(mode)["reindex_in_progress"] == true {
                sleep_ms(between(rng, 0, 20));
                c.member(role).kill();
                caught = Some(attempt);
                break;
            }
            sleep_ms(1);
        }
        let answer = poster.join().expect("reindex caller");
        if caught.is_some() {
            sleep_ms(between(rng, 0, 200));
            c.member(role).restart();
        } else if let Some(r) = &answer {
            if role == 2 && r.status == 403 {
                // The DR operation token did not survive (e.g. a resync): a new one.
                c.dr_op_token(true);
            } else {
                assert_eq!(r.status, 200, "seed {seed}: reindex (warnings): {}", r.body);
            }
        }
        // The reindex resumes after the restart and finishes.
        let deadline = Instant::now() + Duration::from_secs(120);
        while c.member(role).status(mode)["reindex_in_progress"] == true {
            assert!(
                Instant::now() < deadline,
                "seed {seed}: the reindex of the {} did not finish: {}",
                ROLES[role],
                c.member(role).status(mode)
            );
            sleep_ms(10);
        }
        if caught.is_some() {
            break;
        }
    }
    sleep_ms(between(rng, 50, 300));
    w.pause();
    match caught {
        Some(attempt) => Done {
            kills: vec![(moment, role)],
            missed: None,
            what: format!(
                "kill -9 of the {} during its reindex (attempt {attempt}; the reindex resumed and finished)",
                ROLES[role]
            ),
        },
        None => Done {
            kills: Vec::new(),
            missed: Some(moment),
            what: format!("reindex of the {}: finished before the kill", ROLES[role]),
        },
    }
}

/// `GET sys/storage/raft/snapshot`: the status and the size of the file (`None`: no answer).
fn take_snapshot(addr: &str, token: &str) -> Option<(u16, usize)> {
    let req = ureq::http::Request::builder()
        .method("GET")
        .uri(format!("{addr}/v1/sys/storage/raft/snapshot"))
        .header("X-Vault-Token", token)
        .body(Vec::new())
        .ok()?;
    let mut resp = agent(Duration::from_secs(120)).run(req).ok()?;
    let status = resp.status().as_u16();
    let body = resp
        .body_mut()
        .with_config()
        .limit(1 << 32)
        .read_to_vec()
        .ok()?;
    Some((status, body.len()))
}

/// A kill of the primary while a snapshot of it is being taken: a snapshot is timed first,
/// then another one is started and the kill lands a random part of that time into it.
fn snapshot(c: &mut Cluster, w: &Writers, rng: &mut rand_chacha::ChaCha8Rng) -> Done {
    let seed = c.seed;
    let (addr, token) = (c.p.s.addr.clone(), c.p.s.root_token.clone());
    w.resume();
    for attempt in 0..3 {
        let t = Instant::now();
        let full = take_snapshot(&addr, &token);
        let took = t.elapsed().as_micros() as u64;
        assert!(
            full.is_some_and(|(s, n)| s == 200 && n > 0),
            "seed {seed}: a snapshot of the primary failed: {full:?}"
        );
        let (a2, t2) = (addr.clone(), token.clone());
        let taker = std::thread::spawn(move || take_snapshot(&a2, &t2));
        let wait = between(rng, took / 5, took * 4 / 5);
        std::thread::sleep(Duration::from_micros(wait));
        if !taker.is_finished() {
            c.p.kill();
            let _ = taker.join();
            sleep_ms(between(rng, 0, 200));
            c.p.restart();
            sleep_ms(between(rng, 50, 300));
            w.pause();
            return Done {
                kills: vec![(Moment::Snapshot, 0)],
                missed: None,
                what: format!(
                    "kill -9 of the primary {} µs into a snapshot (one takes {took} µs; attempt {attempt})",
                    wait
                ),
            };
        }
        let _ = taker.join();
    }
    w.pause();
    Done {
        kills: Vec::new(),
        missed: Some(Moment::Snapshot),
        what: "snapshot: finished before the kill (three attempts)".into(),
    }
}
