//! The cluster of the `kill -9` scenario and what it checks: three members (a primary, a
//! performance secondary, a DR secondary) whose data directories and ports survive restarts,
//! the writer threads that remember every acknowledged write, convergence (equal Merkle
//! roots, same last WAL) and the read-back of acknowledged writes.

use crate::cluster::{generate, generate_root};
use crate::{agent, note_secret, request, tmpdir, Resp, Server};
use crate::{TEST_ISSUER_KEY as ISSUER_KEY, TEST_LICENSE as LICENSE};
use rand_chacha::rand_core::RngCore;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// WAL retention in entries: a secondary kept away for more writes than this resyncs by
/// Merkle diff/sync.
pub const WAL_ENTRIES: usize = 200;

/// The body of an answer with the status the reference gives (`status`: 204 for a write
/// that returns nothing, 200 for one that returns data or warnings).
#[track_caller]
pub fn ok(status: u16, r: Resp, what: &str) -> Value {
    assert_eq!(r.status, status, "{what}: {} {}", r.status, r.body);
    r.body
}

/// One server of the cluster: its data directory, port and configuration survive restarts
/// (the server owns its directory: it is removed when the member is dropped, also when a
/// test fails).
pub struct Member {
    pub name: &'static str,
    pub s: Server,
}

impl Member {
    /// A server in a directory of its own; `licensed` ones get the replication tuning.
    pub fn new(name: &'static str, licensed: bool) -> Member {
        let dir = tmpdir(&format!("fault-{name}"));
        // Reindexes and Merkle checks in small, spaced steps: a few thousand keys would
        // otherwise be rebuilt in a few milliseconds, too short for a kill to land in them.
        // No key-only WAL entries: a secondary kept away past the WAL comes back by Merkle
        // diff and sync (the moment this campaign kills in), not by catch-up.
        let extra = if licensed {
            let lic = dir.join("license.json");
            std::fs::write(&lic, LICENSE).expect("write license");
            format!(
                "license_path = \"{}\"\nlicense_trusted_key = \"{ISSUER_KEY}\"\nreplication {{\n wal_max_entries = {WAL_ENTRIES}\n wal_max_key_entries = 0\n pull_wait_ms = 500\n scan_chunk = 64\n scan_pace_ms = 1\n}}\n",
                lic.display()
            )
        } else {
            String::new()
        };
        let mut m = Self::launch(name, &dir, &extra);
        m.s.own(dir);
        m
    }

    /// A server on a fresh port pair (retried on another pair when a port is taken).
    pub fn launch(name: &'static str, dir: &Path, extra: &str) -> Member {
        Member {
            name,
            s: Server::start(dir, extra),
        }
    }

    /// `kill -9`.
    pub fn kill(&mut self) {
        self.s.kill9();
    }

    /// Starts the server again on the same data directory and port, and unseals it.
    pub fn restart(&mut self) {
        if !crate::kill9::quiet() {
            eprintln!("{}: restart on port {}", self.name, self.s.port);
        }
        self.s.restart();
        self.s.unseal();
    }

    /// The replication status of mode `mode` (`performance` or `dr`).
    pub fn status(&self, mode: &str) -> Value {
        let r = self
            .s
            .call_as(None, "GET", &format!("sys/replication/{mode}/status"), None);
        assert_eq!(r.status, 200, "{} status: {}", self.name, r.body);
        r.body["data"].clone()
    }
}

/// A secondary activation token of mode `mode` from the primary `p` (noted as a secret).
pub fn secondary_token(p: &Server, mode: &str, id: &str) -> String {
    let t = crate::cluster::token(p, mode, id);
    note_secret(&t);
    t
}

/// Threads writing unique keys to the primary, remembering every acknowledged write.
pub struct Writers {
    pub stop: AtomicBool,
    paused: AtomicBool,
    in_flight: AtomicUsize,
    /// Milliseconds each writer waits between two writes (0: as fast as answers come).
    pace_ms: AtomicU64,
    acked: Mutex<BTreeMap<String, u64>>,
    pub attempts: AtomicU64,
    pub statuses: Mutex<BTreeMap<u16, u64>>,
}

impl Writers {
    /// `n` writer threads on the server at `addr`, paused until [`Writers::resume`].
    pub fn start(
        addr: &str,
        token: &str,
        n: usize,
        pace_ms: u64,
    ) -> (Arc<Writers>, Vec<std::thread::JoinHandle<()>>) {
        let w = Arc::new(Writers {
            stop: AtomicBool::new(false),
            paused: AtomicBool::new(true),
            in_flight: AtomicUsize::new(0),
            pace_ms: AtomicU64::new(pace_ms),
            acked: Mutex::new(BTreeMap::new()),
            attempts: AtomicU64::new(0),
            statuses: Mutex::new(BTreeMap::new()),
        });
        let handles = (0..n)
            .map(|t| {
                let w = w.clone();
                let (addr, token) = (addr.to_string(), token.to_string());
                std::thread::spawn(move || w.run(t, &addr, &token))
            })
            .collect();
        (w, handles)
    }

    fn run(&self, t: usize, addr: &str, token: &str) {
        let a = agent(Duration::from_secs(10));
        let mut i: u64 = 0;
        while !self.stop.load(Ordering::SeqCst) {
            if self.paused.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            self.in_flight.fetch_add(1, Ordering::SeqCst);
            if self.paused.load(Ordering::SeqCst) {
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                continue;
            }
            let key = format!("w{t}-{i}");
            self.attempts.fetch_add(1, Ordering::Relaxed);
            let r = request(
                &a,
                addr,
                Some(token),
                "PUT",
                &format!("secret/{key}"),
                Some(&json!({ "v": i })),
            );
            let code = r.as_ref().map(|r| r.status).unwrap_or(0);
            // A KV v1 write answers 204 (no body), as in Vault.
            if code == 204 {
                self.acked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, i);
            }
            *self
                .statuses
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(code)
                .or_default() += 1;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            i += 1;
            let pace = self.pace_ms.load(Ordering::Relaxed);
            if code != 204 {
                std::thread::sleep(Duration::from_millis(20));
            } else if pace > 0 {
                std::thread::sleep(Duration::from_millis(pace));
            }
        }
    }

    pub fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Sets the pause between two writes of a thread (returns the previous one).
    pub fn set_pace(&self, ms: u64) -> u64 {
        self.pace_ms.swap(ms, Ordering::Relaxed)
    }

    /// Stops writing and waits until no write is in flight.
    pub fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
        while self.in_flight.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub fn acked(&self) -> BTreeMap<String, u64> {
        self.acked.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn acked_len(&self) -> usize {
        self.acked.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// The three members, the tokens the scenario needs on the secondaries, and the seed (for
/// messages).
pub struct Cluster {
    pub p: Member,
    pub perf: Member,
    pub dr: Member,
    /// A root token on the performance secondary (tokens do not replicate to it).
    pub perf_token: String,
    /// A DR operation token on the DR secondary (made on first use, again when refused).
    pub dr_op_token: Option<String>,
    pub seed: u64,
}

impl Cluster {
    /// A primary with a performance and a DR secondary, converged, with a KV v1 mount.
    pub fn start(seed: u64) -> Cluster {
        let mut p = Member::new("primary", true);
        let mut perf = Member::new("perf", true);
        let mut dr = Member::new("dr", true);
        p.s.init_unseal(3, 2);
        perf.s.init_unseal(1, 1);
        dr.s.init_unseal(1, 1);
        ok(
            204,
            p.s.post("sys/mounts/secret", json!({"type": "kv"})),
            "mount",
        );
        for mode in ["performance", "dr"] {
            ok(
                200,
                p.s.post(&format!("sys/replication/{mode}/primary/enable"), json!({})),
                "primary enable",
            );
        }
        let tp = secondary_token(&p.s, "performance", "perf");
        let td = secondary_token(&p.s, "dr", "dr");
        for (m, mode, t) in [(&perf, "performance", tp), (&dr, "dr", td)] {
            ok(
                200,
                m.s.post(
                    &format!("sys/replication/{mode}/secondary/enable"),
                    json!({ "token": t }),
                ),
                "secondary enable",
            );
        }
        // Both secondaries now unseal with the primary's key shares.
        let keys = p.s.unseal_keys.clone();
        perf.s.unseal_keys = keys.clone();
        dr.s.unseal_keys = keys.clone();
        let mut c = Cluster {
            p,
            perf,
            dr,
            perf_token: String::new(),
            dr_op_token: None,
            seed,
        };
        c.wait_converged("initial sync", 60);
        c.perf_token = generate_root(&c.perf.s, &keys);
        c.perf.s.root_token = c.perf_token.clone();
        c
    }

    /// Role 0 is the primary, 1 the performance secondary, 2 the DR secondary.
    pub fn member(&mut self, role: usize) -> &mut Member {
        match role {
            0 => &mut self.p,
            1 => &mut self.perf,
            _ => &mut self.dr,
        }
    }

    /// Secondary `s` (mode `mode`) streams at the primary's last WAL with the primary's root.
    fn caught_up(&self, s: &Member, mode: &str) -> bool {
        let ps = self.p.status(mode);
        let ss = s.status(mode);
        ss["state"] == "stream-wals"
            && ss["last_remote_wal"] == ps["last_wal"]
            && ss["merkle_root"] == ps["merkle_root"]
    }

    /// Waits (polling every 20 ms) until both secondaries caught up; panics after `secs`.
    pub fn wait_converged(&self, what: &str, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if self.caught_up(&self.perf, "performance") && self.caught_up(&self.dr, "dr") {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "seed {}: no convergence after {what} in {secs}s:\nprimary perf {}\nprimary dr {}\nperf {}\ndr {}",
            self.seed,
            self.p.status("performance"),
            self.p.status("dr"),
            self.perf.status("performance"),
            self.dr.status("dr"),
        );
    }

    /// A DR operation token on the DR secondary, made from the primary's key shares.
    pub fn dr_op_token(&mut self, fresh: bool) -> String {
        if fresh || self.dr_op_token.is_none() {
            let t = generate(
                &self.dr.s,
                "sys/replication/dr/secondary/generate-operation-token",
                &self.p.s.unseal_keys,
            );
            self.dr_op_token = Some(t);
        }
        self.dr_op_token.clone().unwrap_or_default()
    }

    /// Makes sure the performance secondary's root token is valid (the secondary's own
    /// tokens do not survive a resync from scratch: a new one is made then).
    fn refresh_perf_token(&mut self) {
        let r = self.perf.s.call_as(
            Some(&self.perf_token),
            "GET",
            "secret/kill9-token-probe",
            None,
        );
        if r.status == 403 {
            let keys = self.p.s.unseal_keys.clone();
            self.perf_token = generate_root(&self.perf.s, &keys);
            self.perf.s.root_token = self.perf_token.clone();
        }
    }

    /// Reads every write in `keys` back on the primary and on the performance secondary
    /// (`threads` in parallel); returns the writes that did not read back with their
    /// acknowledged value (one line each).
    pub fn check_acked(&mut self, keys: &[(String, u64)], threads: usize) -> Vec<String> {
        self.refresh_perf_token();
        let lost = Mutex::new(Vec::new());
        let targets = [
            (
                "primary",
                self.p.s.addr.clone(),
                self.p.s.root_token.clone(),
            ),
            (
                "perf secondary",
                self.perf.s.addr.clone(),
                self.perf_token.clone(),
            ),
        ];
        let chunk = keys.len().div_ceil(threads.max(1)).max(1);
        std::thread::scope(|sc| {
            for part in keys.chunks(chunk) {
                let (targets, lost) = (&targets, &lost);
                sc.spawn(move || {
                    let a = agent(Duration::from_secs(30));
                    for (k, v) in part {
                        for (name, addr, token) in targets {
                            let r =
                                request(&a, addr, Some(token), "GET", &format!("secret/{k}"), None);
                            let good = r
                                .as_ref()
                                .is_some_and(|r| r.status == 200 && r.body["data"]["v"] == *v);
                            if !good {
                                let got = r
                                    .map(|r| format!("{} {}", r.status, r.body))
                                    .unwrap_or_else(|| "no answer".into());
                                lost.lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .push(format!("{k}={v} on the {name}: {got}"));
                            }
                        }
                    }
                });
            }
        });
        lost.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}

/// Picks the keys to read back after a cycle: every write acknowledged since the last check
/// and a random sample of 50 older ones.
pub fn to_check(
    acked: &BTreeMap<String, u64>,
    checked: &mut BTreeMap<String, u64>,
    rng: &mut rand_chacha::ChaCha8Rng,
) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = acked
        .iter()
        .filter(|(k, _)| !checked.contains_key(*k))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    if !checked.is_empty() {
        // A sample of older keys: the map is ordered, so pick by rank through an iterator
        // over sorted random ranks.
        let mut ranks: Vec<usize> = (0..checked.len().min(50))
            .map(|_| (rng.next_u64() % checked.len() as u64) as usize)
            .collect();
        ranks.sort_unstable();
        let mut it = checked.iter().enumerate();
        for r in ranks {
            for (i, (k, v)) in it.by_ref() {
                if i == r {
                    out.push((k.clone(), *v));
                    break;
                }
            }
        }
    }
    for (k, v) in &out {
        checked.insert(k.clone(), *v);
    }
    out
}
