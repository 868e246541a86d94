//! Real-process faults: `kill -9` of a primary, a performance secondary and a DR secondary at
//! random moments (while streaming, during a Merkle sync after the WAL retention was
//! exceeded, during a reindex of the primary and of the performance secondary), restarts, and checks that the cluster converges (equal Merkle roots) without
//! losing an acknowledged write; and a full disk (a small tmpfs as the data directory).
//!
//! `CAIRN_KILL_CYCLES` (default 6: two per role) sets the number of random kill cycles and
//! `CAIRN_FAULT_SEED` the seed (printed; a failing run is repeated with it).

use cairn_tests::{agent, free_port_pair, note_secret, request, tmpdir, Resp, Server};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_tests::cluster::generate_root;
use cairn_tests::{TEST_ISSUER_KEY as ISSUER_KEY, TEST_LICENSE as LICENSE};

/// WAL retention in entries: a secondary kept away for more writes than this resyncs by
/// Merkle diff/sync.
const WAL_ENTRIES: usize = 200;

/// A free API/cluster port pair not handed out before in this process.
fn port() -> u16 {
    static USED: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut used = USED.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let p = free_port_pair();
        if !used.iter().any(|u| u.abs_diff(p) <= 1) {
            used.push(p);
            return p;
        }
    }
}

fn ok(r: Resp, what: &str) -> Value {
    assert!(r.status < 300, "{what}: {} {}", r.status, r.body);
    r.body
}

/// One server of the cluster: its data directory, port and configuration survive restarts.
struct Member {
    name: &'static str,
    dir: PathBuf,
    port: u16,
    extra: String,
    s: Server,
}

impl Member {
    fn new(name: &'static str, licensed: bool) -> Member {
        let dir = tmpdir(&format!("fault-{name}"));
        let extra = if licensed {
            let lic = dir.join("license.json");
            std::fs::write(&lic, LICENSE).expect("write license");
            format!(
                "license_path = \"{}\"\nlicense_trusted_key = \"{ISSUER_KEY}\"\nreplication {{\n wal_max_entries = {WAL_ENTRIES}\n pull_wait_ms = 500\n}}\n",
                lic.display()
            )
        } else {
            String::new()
        };
        Self::launch(name, &dir, &extra)
    }

    fn launch(name: &'static str, dir: &Path, extra: &str) -> Member {
        for attempt in 0..4 {
            let p = port();
            match std::panic::catch_unwind(|| Server::with_config(dir, p, extra)) {
                Ok(s) => {
                    return Member {
                        name,
                        dir: dir.to_path_buf(),
                        port: p,
                        extra: extra.to_string(),
                        s,
                    }
                }
                Err(e) if attempt == 3 => std::panic::resume_unwind(e),
                Err(_) => eprintln!("{name}: no start on port {p}; retrying on another port"),
            }
        }
        unreachable!()
    }

    /// `kill -9`.
    fn kill(&mut self) {
        self.s.kill9();
    }

    /// Starts the server again on the same data directory and port, and unseals it.
    fn restart(&mut self) {
        let token = self.s.root_token.clone();
        let keys = self.s.unseal_keys.clone();
        let mut last = None;
        for _ in 0..5 {
            let (dir, port, extra) = (self.dir.clone(), self.port, self.extra.clone());
            match std::panic::catch_unwind(move || Server::with_config(&dir, port, &extra)) {
                Ok(s) => {
                    self.s = s;
                    self.s.root_token = token;
                    self.s.unseal_keys = keys;
                    self.s.unseal();
                    return;
                }
                Err(e) => {
                    eprintln!(
                        "{}: restart on port {} failed; retrying",
                        self.name, self.port
                    );
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(500));
                }
            }
        }
        std::panic::resume_unwind(last.expect("a failure"));
    }

    fn status(&self, mode: &str) -> Value {
        let r = self
            .s
            .call_as(None, "GET", &format!("sys/replication/{mode}/status"), None);
        assert_eq!(r.status, 200, "{} status: {}", self.name, r.body);
        r.body["data"].clone()
    }
}

fn secondary_token(p: &Server, mode: &str, id: &str) -> String {
    let b = ok(
        p.post(
            &format!("sys/replication/{mode}/primary/secondary-token"),
            json!({ "id": id }),
        ),
        "secondary-token",
    );
    let t = b["wrap_info"]["token"].as_str().expect("token").to_string();
    note_secret(&t);
    t
}

/// Threads writing unique keys to the primary, remembering every acknowledged write.
struct Writers {
    stop: AtomicBool,
    paused: AtomicBool,
    in_flight: AtomicUsize,
    acked: Mutex<BTreeMap<String, u64>>,
    attempts: AtomicU64,
    statuses: Mutex<BTreeMap<u16, u64>>,
}

impl Writers {
    fn start(
        addr: &str,
        token: &str,
        n: usize,
    ) -> (Arc<Writers>, Vec<std::thread::JoinHandle<()>>) {
        let w = Arc::new(Writers {
            stop: AtomicBool::new(false),
            paused: AtomicBool::new(true),
            in_flight: AtomicUsize::new(0),
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
                std::thread::sleep(Duration::from_millis(5));
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
            if code == 200 || code == 204 {
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
            if code != 200 && code != 204 {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Stops writing and waits until no write is in flight.
    fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
        while self.in_flight.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn acked(&self) -> BTreeMap<String, u64> {
        self.acked.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The seeded RNG of this run (printed so a failure can be replayed).
fn rng(test: &str) -> (u64, rand_chacha::ChaCha8Rng) {
    let seed = std::env::var("CAIRN_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("{test}: seed {seed} (replay with CAIRN_FAULT_SEED={seed})");
    (seed, rand_chacha::ChaCha8Rng::seed_from_u64(seed))
}

fn between(rng: &mut rand_chacha::ChaCha8Rng, lo: u64, hi: u64) -> u64 {
    lo + rng.next_u64() % (hi - lo + 1)
}

struct Cluster {
    p: Member,
    perf: Member,
    dr: Member,
    /// A root token on the performance secondary (tokens do not replicate to it).
    perf_token: String,
    seed: u64,
}

impl Cluster {
    fn start(seed: u64) -> Cluster {
        let mut p = Member::new("primary", true);
        let mut perf = Member::new("perf", true);
        let mut dr = Member::new("dr", true);
        p.s.init_unseal(3, 2);
        perf.s.init_unseal(1, 1);
        dr.s.init_unseal(1, 1);
        ok(
            p.s.post("sys/mounts/secret", json!({"type": "kv"})),
            "mount",
        );
        ok(
            p.s.post("sys/replication/performance/primary/enable", json!({})),
            "perf enable",
        );
        ok(
            p.s.post("sys/replication/dr/primary/enable", json!({})),
            "dr enable",
        );
        let tp = secondary_token(&p.s, "performance", "perf");
        let td = secondary_token(&p.s, "dr", "dr");
        ok(
            perf.s.post(
                "sys/replication/performance/secondary/enable",
                json!({ "token": tp }),
            ),
            "perf secondary enable",
        );
        ok(
            dr.s.post(
                "sys/replication/dr/secondary/enable",
                json!({ "token": td }),
            ),
            "dr secondary enable",
        );
        // Both secondaries now unseal with the primary's key shares.
        let keys = p.s.unseal_keys.clone();
        perf.s.unseal_keys = keys.clone();
        dr.s.unseal_keys = keys.clone();
        let mut c = Cluster {
            p,
            perf,
            dr,
            perf_token: String::new(),
            seed,
        };
        c.wait_converged("initial sync", 60);
        c.perf_token = generate_root(&c.perf.s, &keys);
        c.perf.s.root_token = c.perf_token.clone();
        c
    }

    fn member(&mut self, role: usize) -> &mut Member {
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

    fn wait_converged(&self, what: &str, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if self.caught_up(&self.perf, "performance") && self.caught_up(&self.dr, "dr") {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
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

    /// Every write in `keys` reads back with its acknowledged value on the primary and on the
    /// performance secondary.
    fn check_acked(&mut self, keys: &[(String, u64)], what: &str) {
        let a = agent(Duration::from_secs(30));
        for (k, v) in keys {
            let path = format!("secret/{k}");
            let r = request(
                &a,
                &self.p.s.addr,
                Some(&self.p.s.root_token),
                "GET",
                &path,
                None,
            )
            .expect("primary answers");
            assert!(
                r.status == 200 && r.body["data"]["v"] == *v,
                "seed {}: acknowledged write {k}={v} lost on the primary after {what}: {} {}",
                self.seed,
                r.status,
                r.body
            );
            let mut r = request(
                &a,
                &self.perf.s.addr,
                Some(&self.perf_token),
                "GET",
                &path,
                None,
            )
            .expect("perf answers");
            if r.status == 403 {
                // The secondary's own root token did not survive a resync: make a new one.
                let keys = self.p.s.unseal_keys.clone();
                self.perf_token = generate_root(&self.perf.s, &keys);
                self.perf.s.root_token = self.perf_token.clone();
                r = request(
                    &a,
                    &self.perf.s.addr,
                    Some(&self.perf_token),
                    "GET",
                    &path,
                    None,
                )
                .expect("perf answers");
            }
            assert!(
                r.status == 200 && r.body["data"]["v"] == *v,
                "seed {}: acknowledged write {k}={v} missing on the perf secondary after {what}: {} {}",
                self.seed,
                r.status,
                r.body
            );
        }
    }
}

/// Picks the keys to read back after a cycle: every write acknowledged since the last check
/// and a random sample of older ones.
fn to_check(
    acked: &BTreeMap<String, u64>,
    checked: &mut BTreeMap<String, u64>,
    rng: &mut rand_chacha::ChaCha8Rng,
) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = acked
        .iter()
        .filter(|(k, _)| !checked.contains_key(*k))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    let old: Vec<(&String, &u64)> = checked.iter().collect();
    for _ in 0..old.len().min(50) {
        let (k, v) = old[(rng.next_u64() % old.len() as u64) as usize];
        out.push((k.clone(), *v));
    }
    for (k, v) in &out {
        checked.insert(k.clone(), *v);
    }
    out
}

const ROLES: [&str; 3] = ["primary", "perf secondary", "DR secondary"];

#[test]
fn kill9_during_streaming_and_merkle_sync_loses_no_acknowledged_write() {
    let started = Instant::now();
    let cycles: usize = std::env::var("CAIRN_KILL_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    let (seed, mut rng) = rng("kill9");
    let mut c = Cluster::start(seed);
    eprintln!("cluster up in {} ms", started.elapsed().as_millis());
    let (w, handles) = Writers::start(&c.p.s.addr, &c.p.s.root_token, 2);
    let mut checked = BTreeMap::new();
    let mut kills = [0usize; 3];

    // Random-moment kills: each block of three cycles kills every role once, in random order.
    let mut order: Vec<usize> = Vec::new();
    while order.len() < cycles {
        let mut block = [0usize, 1, 2];
        for i in (1..3).rev() {
            block.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        order.extend(block);
    }
    order.truncate(cycles);
    for (cycle, role) in order.into_iter().enumerate() {
        w.resume();
        let before_kill = between(&mut rng, 0, 1000);
        let down = between(&mut rng, 0, 700);
        let after = between(&mut rng, 100, 500);
        std::thread::sleep(Duration::from_millis(before_kill));
        let acked_before = w.acked().len();
        c.member(role).kill();
        std::thread::sleep(Duration::from_millis(down));
        c.member(role).restart();
        std::thread::sleep(Duration::from_millis(after));
        w.pause();
        kills[role] += 1;
        let what = format!(
            "cycle {cycle}: kill -9 of the {} after {before_kill} ms, down {down} ms",
            ROLES[role]
        );
        let t = Instant::now();
        c.wait_converged(&what, 90);
        let converge_ms = t.elapsed().as_millis();
        let acked = w.acked();
        let keys = to_check(&acked, &mut checked, &mut rng);
        let t = Instant::now();
        c.check_acked(&keys, &what);
        eprintln!(
            "{what}: converged in {converge_ms} ms; {} acknowledged writes ({} at the kill), {} read back in {} ms",
            acked.len(),
            acked_before,
            keys.len(),
            t.elapsed().as_millis()
        );
    }

    // A secondary kept away past the WAL retention resyncs by Merkle diff/sync; it is
    // killed during that sync, restarted, and must still converge.
    let mut merkle_kills = 0;
    for (role, mode) in [(1usize, "performance"), (2usize, "dr")] {
        let mut caught = false;
        for attempt in 0..3 {
            c.member(role).kill();
            let target = w.acked().len() + 3 * WAL_ENTRIES * (attempt + 1);
            w.resume();
            let deadline = Instant::now() + Duration::from_secs(60);
            while w.acked().len() < target && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            c.member(role).restart();
            // Writes continue during the resync; kill as soon as the Merkle sync shows.
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut seen = String::new();
            while Instant::now() < deadline {
                let st = c.member(role).status(mode);
                let state = st["state"].as_str().unwrap_or("").to_string();
                if state == "merkle-sync" {
                    c.member(role).kill();
                    caught = true;
                    break;
                }
                if state == "stream-wals" && seen.contains("merkle") {
                    break;
                }
                if !seen.ends_with(&state) {
                    seen.push_str(&format!(" {state}"));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            if caught {
                kills[role] += 1;
                merkle_kills += 1;
                c.member(role).restart();
            }
            std::thread::sleep(Duration::from_millis(between(&mut rng, 100, 800)));
            w.pause();
            let what = format!(
                "{} kept away past the WAL retention (attempt {attempt}, states seen:{seen}), {}",
                ROLES[role],
                if caught {
                    "killed during the Merkle sync"
                } else {
                    "Merkle sync not caught"
                }
            );
            c.wait_converged(&what, 120);
            let acked = w.acked();
            let keys = to_check(&acked, &mut checked, &mut rng);
            c.check_acked(&keys, &what);
            eprintln!("{what}: converged; {} acknowledged writes", acked.len());
            if caught {
                break;
            }
        }
        assert!(
            caught,
            "seed {seed}: the {} was never seen in merkle-sync",
            ROLES[role]
        );
    }

    // A kill during a reindex (`sys/replication/reindex`, which resumes after a restart) of
    // the primary and of the performance secondary. (The DR secondary's reindex needs a DR
    // operation token; it is not covered here.)
    let mut reindex_kills = 0;
    for (role, mode) in [(0usize, "dr"), (1usize, "performance")] {
        let mut caught = false;
        for attempt in 0..3 {
            w.resume();
            std::thread::sleep(Duration::from_millis(between(&mut rng, 200, 800)));
            let (addr, token) = {
                let m = c.member(role);
                (m.s.addr.clone(), m.s.root_token.clone())
            };
            let poster = std::thread::spawn(move || {
                request(
                    &agent(Duration::from_secs(120)),
                    &addr,
                    Some(&token),
                    "POST",
                    "sys/replication/reindex",
                    Some(&json!({})),
                )
            });
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline && !poster.is_finished() {
                if c.member(role).status(mode)["reindex_in_progress"] == true {
                    std::thread::sleep(Duration::from_millis(between(&mut rng, 0, 20)));
                    c.member(role).kill();
                    caught = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            let answer = poster.join().expect("reindex caller");
            if caught {
                kills[role] += 1;
                reindex_kills += 1;
                c.member(role).restart();
            } else if let Some(r) = &answer {
                assert!(r.status < 300, "reindex: {} {}", r.status, r.body);
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
                std::thread::sleep(Duration::from_millis(50));
            }
            std::thread::sleep(Duration::from_millis(between(&mut rng, 100, 500)));
            w.pause();
            let what = format!(
                "reindex of the {} (attempt {attempt}), {}",
                ROLES[role],
                if caught {
                    "killed during the reindex"
                } else {
                    "reindex finished before the kill"
                }
            );
            c.wait_converged(&what, 120);
            let acked = w.acked();
            let keys = to_check(&acked, &mut checked, &mut rng);
            c.check_acked(&keys, &what);
            eprintln!("{what}: converged; {} acknowledged writes", acked.len());
            if caught {
                break;
            }
        }
        assert!(
            caught,
            "seed {seed}: the {} was never seen reindexing",
            ROLES[role]
        );
    }

    // Every acknowledged write, on the primary and the performance secondary.
    w.stop.store(true, Ordering::SeqCst);
    for h in handles {
        let _ = h.join();
    }
    c.wait_converged("the end", 60);
    let all: Vec<(String, u64)> = w.acked().into_iter().collect();
    c.check_acked(&all, "the end");
    let statuses = w.statuses.lock().unwrap_or_else(|e| e.into_inner()).clone();
    eprintln!(
        "kill9 summary: seed {seed}, {} random kill cycles + {merkle_kills} kills during Merkle sync \
         + {reindex_kills} during reindex (primary {}, perf {}, dr {}), {} writes attempted, {} acknowledged, 0 lost, all read back; \
         write statuses {statuses:?} (0 = no answer); {:.1}s",
        cycles,
        kills[0],
        kills[1],
        kills[2],
        w.attempts.load(Ordering::Relaxed),
        all.len(),
        started.elapsed().as_secs_f64()
    );
}

/// Unmounts the tmpfs (after the servers using it were stopped) when the test ends.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

fn sh(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[test]
fn full_disk_gives_a_clear_error_and_keeps_every_acknowledged_write() {
    let started = Instant::now();
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if !root {
        eprintln!("full_disk: skipped: mounting a tmpfs needs root");
        return;
    }
    let base = tmpdir("fault-full");
    let data = base.join("data");
    std::fs::create_dir_all(&data).expect("mkdir");
    if let Err(e) = sh(
        "mount",
        &[
            "-t",
            "tmpfs",
            "-o",
            "size=32m",
            "tmpfs",
            &data.to_string_lossy(),
        ],
    ) {
        eprintln!("full_disk: skipped: cannot mount a tmpfs: {e}");
        return;
    }
    // Declared before the servers, so dropped (unmounted) after they are killed.
    let _mount = Mount(data.clone());
    let lic = base.join("license.json");
    std::fs::write(&lic, LICENSE).expect("write license");
    let extra = format!(
        "license_path = \"{}\"\nlicense_trusted_key = \"{ISSUER_KEY}\"\nreplication {{\n pull_wait_ms = 500\n}}\n",
        lic.display()
    );
    let mut p = Member::launch("full-primary", &data, &extra);
    p.s.init_unseal(1, 1);
    // A DR secondary on ordinary disk: it converges only if the primary's Merkle pages agree
    // with its data after the disk filled up.
    let mut d = Member::new("full-dr", true);
    d.s.init_unseal(1, 1);
    ok(
        p.s.post("sys/mounts/secret", json!({"type": "kv"})),
        "mount",
    );
    ok(
        p.s.post("sys/replication/dr/primary/enable", json!({})),
        "dr enable",
    );
    let td = secondary_token(&p.s, "dr", "full-dr");
    ok(
        d.s.post(
            "sys/replication/dr/secondary/enable",
            json!({ "token": td }),
        ),
        "dr secondary enable",
    );
    d.s.unseal_keys = p.s.unseal_keys.clone();

    // Four writers of 16 KiB values until each meets a failure.
    let pad = "x".repeat(16 << 10);
    let acked: Arc<Mutex<BTreeMap<String, u64>>> = Default::default();
    let failures: Arc<Mutex<Vec<Resp>>> = Default::default();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (addr, token, pad) = (p.s.addr.clone(), p.s.root_token.clone(), pad.clone());
            let (acked, failures) = (acked.clone(), failures.clone());
            std::thread::spawn(move || {
                let a = agent(Duration::from_secs(30));
                for i in 0..100_000u64 {
                    let key = format!("f{t}-{i}");
                    let r = request(
                        &a,
                        &addr,
                        Some(&token),
                        "PUT",
                        &format!("secret/{key}"),
                        Some(&json!({"v": i, "pad": pad})),
                    )
                    .expect("the server answers");
                    if r.status == 200 || r.status == 204 {
                        acked.lock().unwrap().insert(key, i);
                    } else {
                        failures.lock().unwrap().push(r);
                        return;
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("writer");
    }
    let acked = acked.lock().unwrap().clone();
    let failures = failures.lock().unwrap().clone();
    eprintln!(
        "full_disk: {} writes acknowledged before the disk filled; failures: {:?}",
        acked.len(),
        failures
            .iter()
            .map(|r| (r.status, r.errors()))
            .collect::<Vec<_>>()
    );
    assert!(acked.len() > 100, "the disk filled too early");
    for r in &failures {
        assert_eq!(r.status, 507, "a full disk answers 507: {}", r.body);
        let msgs = r.body["errors"].as_array().expect("errors envelope");
        assert!(
            msgs.len() == 1 && msgs[0].as_str().unwrap_or("").starts_with("disk full"),
            "{}",
            r.body
        );
    }

    // The server keeps running, unsealed, serves reads, and refuses writes clearly.
    let health = p.s.call_as(None, "GET", "sys/seal-status", None);
    assert_eq!(health.body["sealed"], false, "{}", health.body);
    let check = |s: &Server, what: &str| {
        let all: Vec<(&String, &u64)> = acked.iter().collect();
        std::thread::scope(|sc| {
            for part in all.chunks(all.len().div_ceil(8).max(1)) {
                sc.spawn(move || {
                    let a = agent(Duration::from_secs(30));
                    for (k, v) in part {
                        let r = request(
                            &a,
                            &s.addr,
                            Some(&s.root_token),
                            "GET",
                            &format!("secret/{k}"),
                            None,
                        )
                        .expect("answer");
                        assert!(
                            r.status == 200 && r.body["data"]["v"] == **v,
                            "acknowledged write {k} lost {what}: {} {}",
                            r.status,
                            r.body
                        );
                    }
                });
            }
        });
    };
    check(&p.s, "while the disk is full");
    let r = p.s.put("secret/while-full", json!({"v": 1, "pad": pad}));
    assert_eq!(r.status, 507, "{}", r.body);

    // Space comes back: writes are accepted again (the server checks once a second).
    sh(
        "mount",
        &["-o", "remount,size=96m", &data.to_string_lossy()],
    )
    .expect("remount bigger");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = p.s.put("secret/after-full", json!({"v": 2}));
        if r.status == 200 || r.status == 204 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "writes still refused after space came back: {} {}",
            r.status,
            r.body
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    check(&p.s, "after space came back");
    for i in 0..20 {
        ok(
            p.s.put(&format!("secret/more{i}"), json!({"v": i, "pad": pad})),
            "write after space came back",
        );
    }
    // The DR secondary converges on the primary's data (Merkle pages agree with the data).
    let converged = |p: &Member, d: &Member| {
        let ps = p.status("dr");
        let ds = d.status("dr");
        ds["state"] == "stream-wals"
            && ds["last_remote_wal"] == ps["last_wal"]
            && ds["merkle_root"] == ps["merkle_root"]
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !converged(&p, &d) {
        assert!(
            Instant::now() < deadline,
            "DR secondary did not converge after the full disk:\nprimary {}\ndr {}",
            p.status("dr"),
            d.status("dr")
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // And after a kill -9 and restart of both.
    p.kill();
    d.kill();
    p.restart();
    d.restart();
    check(&p.s, "after a restart");
    ok(
        p.s.put("secret/after-restart", json!({"v": 3})),
        "write after restart",
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !converged(&p, &d) {
        assert!(
            Instant::now() < deadline,
            "DR secondary did not converge after the restart:\nprimary {}\ndr {}",
            p.status("dr"),
            d.status("dr")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(p);
    drop(d);
    eprintln!(
        "full_disk: 507 while full, writes accepted again after the remount, {} acknowledged \
         writes kept (also after kill -9 and restart), DR secondary converged; {:.1}s",
        acked.len(),
        started.elapsed().as_secs_f64()
    );
}
