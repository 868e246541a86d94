//! The turmoil tier ([`crate::Tier::Turmoil`]): the replication world
//! ([`crate::repl::ReplWorld`], with the same operator, failover drills, LDAP logins,
//! corruption scans and checkers as the fast tier) whose replication peer messages travel
//! over turmoil TCP streams instead of the seeded in-memory network. Each server is a
//! turmoil host (named `cluster<h>`, the node's cluster address) that only moves bytes: it
//! listens on the cluster port and makes the peer calls its node asks for (4-byte
//! big-endian length + JSON: the sim's own framing, not the shell's TLS transport). The
//! nodes themselves, their storage ([`crate::host::Host`]), group commit, the operator's
//! API calls and the activation-token unwraps stay with the replication world, which runs
//! between turmoil steps on turmoil's clock.
//!
//! So socket behaviour is exercised: connections broken mid-stream (the serving side
//! writes half an answer and drops the connection), connections dropped by host crashes
//! (a crash of a node crashes its turmoil host; its restart bounces it), held
//! (backpressured) links released later, partitions — some of them triggered exactly
//! when a secondary asks for Merkle pages or keys, i.e. during a Merkle diff/sync.
//!
//! Deterministic: turmoil's RNG is a ChaCha stream derived from the master seed, the epoch
//! is fixed, the tick is [`TICK_MS`], hosts are registered in a fixed order, nothing selects
//! at random, every task's RNG is derived from the seed, and the world's time is turmoil's
//! simulated time.

use crate::net::HostId;
use crate::rng::SimRng;
use cairn_core::replication::{PeerAnswer, PeerMsg, PeerSend};
use rand_core::SeedableRng;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use turmoil::net::{TcpListener, TcpStream};

const PORT: u16 = 8201;
/// Turmoil's tick: the world's clock advances in these steps.
pub const TICK_MS: u64 = 10;
const IO_TIMEOUT_MS: u64 = 3_000;

/// The turmoil host of node `h` (its cluster address without the port).
fn tname(h: HostId) -> String {
    format!("cluster{h}")
}

/// Per-seed settings of the socket faults.
#[derive(Debug, Clone)]
pub struct TcpParams {
    /// Chance (‰) that a served answer is cut off mid-frame.
    pub break_permille: u64,
    /// Chance (‰) that a Merkle request partitions the link during the diff/sync.
    pub cut_permille: u64,
    /// Mean time between held (backpressured) links.
    pub hold_mean_ms: u64,
    pub latency_max_ms: u64,
}

impl TcpParams {
    pub fn derive(seed: u64) -> TcpParams {
        let mut r = SimRng::derive(seed, "turmoil-params");
        TcpParams {
            break_permille: *r.pick(&[0, 5, 30]).unwrap_or(&5),
            cut_permille: *r.pick(&[0, 20, 100]).unwrap_or(&20),
            hold_mean_ms: *r.pick(&[3_000, 10_000]).unwrap_or(&10_000),
            latency_max_ms: *r.pick(&[2, 10, 50]).unwrap_or(&10),
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "break={}‰ merkle-cut={}‰ hold-every~{}ms latency<={}ms",
            self.break_permille, self.cut_permille, self.hold_mean_ms, self.latency_max_ms
        )
    }
}

/// What the turmoil tasks hand to the world, in the order it happened.
#[derive(Debug)]
pub enum Inbound {
    /// A peer request arrived at host `to`; its answer goes back under `key`
    /// ([`TcpNet::answer`]).
    Request { to: HostId, key: u64, msg: PeerMsg },
    /// The answer (or transport error) to call `call` of incarnation `boot` of host `to`.
    Reply {
        to: HostId,
        boot: u64,
        call: u64,
        result: Result<PeerAnswer, String>,
    },
}

/// State shared between the world and the turmoil tasks.
#[derive(Default)]
struct Wire {
    /// Peer calls each host is to make: (caller's boot, call).
    sends: BTreeMap<HostId, VecDeque<(u64, PeerSend)>>,
    inbox: VecDeque<Inbound>,
    /// Answers for the connections waiting on them, by key.
    answers: BTreeMap<u64, PeerAnswer>,
    next_key: u64,
    /// Starts of each turmoil host (names its tasks' RNG streams).
    starts: BTreeMap<HostId, u64>,
    trace: Vec<String>,
    /// Host whose Merkle diff/sync should be cut off from its peer now.
    sync_cut: Option<(HostId, HostId)>,
    breaks: u64,
    peer_msgs: u64,
}

type Shared = Rc<RefCell<Wire>>;

/// The turmoil network of a replication world.
pub struct TcpNet {
    sim: turmoil::Sim<'static>,
    wire: Shared,
    params: TcpParams,
    faults: SimRng,
    /// Socket faults in force: (until, a, b, hold).
    cuts: Vec<(u64, HostId, HostId, bool)>,
    next_hold: u64,
    /// Links the world cut (its partitions, a failover drill's isolation).
    cut_by_world: BTreeSet<(HostId, HostId)>,
    /// Hosts crashed by the world and not restarted yet.
    down: BTreeSet<HostId>,
    n: usize,
}

fn pair(a: HostId, b: HostId) -> (HostId, HostId) {
    (a.min(b), a.max(b))
}

impl TcpNet {
    /// The turmoil network of `n` hosts for master seed `seed`.
    pub fn new(seed: u64, n: usize) -> TcpNet {
        let params = TcpParams::derive(seed);
        let rng =
            rand_chacha::ChaCha20Rng::seed_from_u64(SimRng::derive(seed, "turmoil-rng").next_u64());
        let mut sim = turmoil::Builder::new()
            .simulation_duration(Duration::from_secs(3_600))
            .tick_duration(Duration::from_millis(TICK_MS))
            .epoch(std::time::UNIX_EPOCH)
            .min_message_latency(Duration::from_millis(1))
            .max_message_latency(Duration::from_millis(params.latency_max_ms.max(1)))
            .build_with_rng(Box::new(rng));
        let wire: Shared = Rc::new(RefCell::new(Wire::default()));
        for h in 0..n {
            let (w, br, cut) = (wire.clone(), params.break_permille, params.cut_permille);
            sim.host(tname(h).as_str(), move || {
                host_main(w.clone(), h, seed, br, cut)
            });
        }
        let mut faults = SimRng::derive(seed, "turmoil-faults");
        let next_hold = faults.delay(params.hold_mean_ms) + 1_000;
        TcpNet {
            sim,
            wire,
            params,
            faults,
            cuts: Vec::new(),
            next_hold,
            cut_by_world: BTreeSet::new(),
            down: BTreeSet::new(),
            n,
        }
    }

    pub fn params(&self) -> &TcpParams {
        &self.params
    }

    /// One turmoil tick; returns turmoil's elapsed simulated time, ms.
    pub fn step(&mut self) -> Result<u64, String> {
        self.sim.step().map_err(|e| format!("turmoil: {e}"))?;
        Ok(self.sim.elapsed().as_millis() as u64)
    }

    /// What the tasks reported since the last call: trace lines and inbound messages.
    pub fn take(&mut self) -> (Vec<String>, Vec<Inbound>) {
        let mut w = self.wire.borrow_mut();
        let lines = std::mem::take(&mut w.trace);
        let inbound = w.inbox.drain(..).collect();
        (lines, inbound)
    }

    /// Host `h` (incarnation `boot`) calls a peer.
    pub fn send(&mut self, h: HostId, boot: u64, s: PeerSend) {
        self.wire
            .borrow_mut()
            .sends
            .entry(h)
            .or_default()
            .push_back((boot, s));
    }

    /// The answer to the inbound request `key`.
    pub fn answer(&mut self, key: u64, msg: PeerAnswer) {
        self.wire.borrow_mut().answers.insert(key, msg);
    }

    /// Host `h`'s node crashed: its turmoil host crashes too (its connections break).
    pub fn crash(&mut self, h: HostId) {
        if self.down.insert(h) {
            self.sim.crash(tname(h).as_str());
        }
        if let Some(q) = self.wire.borrow_mut().sends.get_mut(&h) {
            q.clear();
        }
    }

    /// Host `h`'s node started again: its turmoil host restarts.
    pub fn restart(&mut self, h: HostId) {
        if self.down.remove(&h) {
            self.sim.bounce(tname(h).as_str());
        }
    }

    /// The world cuts the link between `a` and `b`.
    pub fn partition(&mut self, a: HostId, b: HostId) {
        self.cut_by_world.insert(pair(a, b));
        self.sim.partition(tname(a).as_str(), tname(b).as_str());
    }

    /// The world heals the link between `a` and `b` (socket faults on it end too).
    pub fn repair(&mut self, a: HostId, b: HostId) {
        self.cut_by_world.remove(&pair(a, b));
        self.cuts.retain(|c| pair(c.1, c.2) != pair(a, b));
        self.sim.repair(tname(a).as_str(), tname(b).as_str());
        self.sim.release(tname(a).as_str(), tname(b).as_str());
    }

    /// Socket faults of the chaos phase at time `now`: holds and Merkle-sync cuts start
    /// and end. Returns trace lines.
    pub fn faults(&mut self, now: u64) -> Vec<String> {
        let mut log = Vec::new();
        let mut keep = Vec::new();
        for (t, a, b, hold) in std::mem::take(&mut self.cuts) {
            if t > now {
                keep.push((t, a, b, hold));
            } else if hold {
                self.sim.release(tname(a).as_str(), tname(b).as_str());
                log.push(format!("net RELEASE n{a} | n{b}"));
            } else if !self.cut_by_world.contains(&pair(a, b)) {
                self.sim.repair(tname(a).as_str(), tname(b).as_str());
                log.push(format!("net REPAIR n{a} | n{b} (socket fault over)"));
            }
        }
        self.cuts = keep;
        if self.n > 1 && now >= self.next_hold {
            self.next_hold = now + self.faults.delay(self.params.hold_mean_ms).max(100);
            let a = self.faults.below(self.n as u64) as usize;
            let b = (a + 1 + self.faults.below(self.n as u64 - 1) as usize) % self.n;
            self.sim.hold(tname(a).as_str(), tname(b).as_str());
            let t = now + self.faults.delay(2_000).max(TICK_MS);
            self.cuts.push((t, a, b, true));
            log.push(format!("net HOLD n{a} | n{b} (backpressure)"));
        }
        let cut = self.wire.borrow_mut().sync_cut.take();
        if let Some((a, b)) = cut {
            let busy = self
                .cuts
                .iter()
                .any(|c| pair(c.1, c.2) == pair(a, b) && !c.3);
            if a != b && !busy && !self.cut_by_world.contains(&pair(a, b)) {
                self.sim.partition(tname(a).as_str(), tname(b).as_str());
                let t = now + self.faults.delay(1_500).max(TICK_MS);
                self.cuts.push((t, a, b, false));
                log.push(format!(
                    "net PARTITION n{a} | n{b} during a Merkle diff/sync"
                ));
            }
        }
        log
    }

    /// Final phase: socket faults end and every link the world has not cut is repaired
    /// and released.
    pub fn heal_faults(&mut self) {
        for (_, a, b, _) in std::mem::take(&mut self.cuts) {
            if !self.cut_by_world.contains(&pair(a, b)) {
                self.sim.repair(tname(a).as_str(), tname(b).as_str());
            }
            self.sim.release(tname(a).as_str(), tname(b).as_str());
        }
        let _ = self.wire.borrow_mut().sync_cut.take();
    }

    /// Counters for the outcome: (answers broken mid-stream, peer messages sent).
    pub fn counts(&self) -> (u64, u64) {
        let w = self.wire.borrow();
        (w.breaks, w.peer_msgs)
    }
}

async fn write_frame(s: &mut TcpStream, v: &[u8]) -> std::io::Result<()> {
    s.write_all(&(v.len() as u32).to_be_bytes()).await?;
    s.write_all(v).await?;
    s.flush().await
}

async fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await?;
    let n = u32::from_be_bytes(len) as usize;
    if n > 64 << 20 {
        return Err(std::io::Error::other("frame too large"));
    }
    let mut buf = vec![0u8; n];
    s.read_exact(&mut buf).await?;
    Ok(buf)
}

/// The host a cluster address names.
fn host_of(addr: &str) -> Option<HostId> {
    addr.trim_start_matches("https://")
        .trim_start_matches("http://")
        .strip_prefix("cluster")?
        .split(':')
        .next()?
        .parse()
        .ok()
}

/// One peer call: connect, send the message, read the answer, hand it to the world.
async fn call_peer(wire: Shared, h: HostId, boot: u64, s: PeerSend, cut: u64, mut rng: SimRng) {
    let to =
        s.to.trim_start_matches("https://")
            .trim_start_matches("http://")
            .to_string();
    let body = s.msg.clone().into_wire().unwrap_or_default();
    let op = serde_json::to_value(&s.msg.body)
        .ok()
        .and_then(|v| v["op"].as_str().map(str::to_string))
        .unwrap_or_default();
    if op.starts_with("merkle") && rng.chance(cut) {
        if let Some(j) = host_of(&to) {
            wire.borrow_mut().sync_cut = Some((h, j));
        }
    }
    wire.borrow_mut().peer_msgs += 1;
    let io = async {
        let mut st = TcpStream::connect(to.as_str()).await?;
        write_frame(&mut st, &body).await?;
        let a = read_frame(&mut st).await?;
        PeerAnswer::from_wire(&a).map_err(std::io::Error::other)
    };
    let result = match tokio::time::timeout(Duration::from_millis(IO_TIMEOUT_MS), io).await {
        Ok(Ok(a)) => Ok(a),
        Ok(Err(e)) => Err(format!("{e}")),
        Err(_) => Err("timed out".to_string()),
    };
    wire.borrow_mut().inbox.push_back(Inbound::Reply {
        to: h,
        boot,
        call: s.call_id,
        result,
    });
}

/// Serves one connection: each frame is a peer request for the world's node, answered
/// when the node answers (perhaps after a long poll); now and then the answer is cut off
/// mid-frame.
async fn serve(wire: Shared, h: HostId, mut st: TcpStream, break_permille: u64, mut rng: SimRng) {
    loop {
        let Ok(buf) = read_frame(&mut st).await else {
            return;
        };
        let Ok(msg) = PeerMsg::from_wire(&buf) else {
            return;
        };
        let key = {
            let mut w = wire.borrow_mut();
            w.next_key += 1;
            let key = w.next_key;
            w.inbox.push_back(Inbound::Request { to: h, key, msg });
            key
        };
        let answer = loop {
            if let Some(a) = wire.borrow_mut().answers.remove(&key) {
                break a;
            }
            tokio::time::sleep(Duration::from_millis(TICK_MS)).await;
        };
        let bytes = answer.into_wire().unwrap_or_default();
        if rng.chance(break_permille) {
            // A connection broken mid-stream: half an answer, then nothing.
            let half = bytes.len() / 2;
            let _ = st.write_all(&(bytes.len() as u32).to_be_bytes()).await;
            let _ = st.write_all(&bytes[..half]).await;
            let _ = st.flush().await;
            let mut w = wire.borrow_mut();
            w.breaks += 1;
            w.trace
                .push(format!("n{h} breaks a connection mid-answer (key {key})"));
            return;
        }
        if write_frame(&mut st, &bytes).await.is_err() {
            return;
        }
    }
}

/// The body of turmoil host `h`: listen on the cluster port, make the peer calls the
/// node asks for.
async fn host_main(
    wire: Shared,
    h: HostId,
    seed: u64,
    break_permille: u64,
    cut_permille: u64,
) -> turmoil::Result {
    let b = {
        let mut w = wire.borrow_mut();
        let s = w.starts.entry(h).or_insert(0);
        *s += 1;
        *s
    };
    let mut rng = SimRng::derive(seed, &format!("turmoil/host/{h}/start/{b}"));
    let listener = TcpListener::bind(("0.0.0.0", PORT)).await?;
    {
        let w = wire.clone();
        let mut arng = SimRng::derive(seed, &format!("turmoil/accept/{h}/{b}"));
        tokio::task::spawn_local(async move {
            while let Ok((st, _)) = listener.accept().await {
                let r = SimRng::derive(arng.next_u64(), "conn");
                tokio::task::spawn_local(serve(w.clone(), h, st, break_permille, r));
            }
        });
    }
    loop {
        let sends: Vec<(u64, PeerSend)> = wire
            .borrow_mut()
            .sends
            .get_mut(&h)
            .map(|q| q.drain(..).collect())
            .unwrap_or_default();
        for (boot, s) in sends {
            let r = SimRng::derive(rng.next_u64(), "call");
            tokio::task::spawn_local(call_peer(wire.clone(), h, boot, s, cut_permille, r));
        }
        tokio::time::sleep(Duration::from_millis(TICK_MS)).await;
    }
}

/// Runs one seed on the turmoil tier.
pub fn run(cfg: &crate::RunConfig) -> crate::Outcome {
    crate::run_repl(cfg, crate::repl::ReplWorld::new_turmoil(cfg))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_turmoil_seed_replays_byte_for_byte() {
        let mut cfg = crate::RunConfig::new(1);
        cfg.tier = crate::Tier::Turmoil;
        cfg.steps = 1_000;
        let a = crate::run(&cfg);
        let b = crate::run(&cfg);
        assert!(a.ok(), "{}", a.report());
        assert_eq!(a.trace_hash, b.trace_hash);
        // The replication operator of the fast tier drives it: seed 1 (1,000 chaos events)
        // runs a failover drill, LDAP logins and a clock jump, and converges.
        for inv in [
            "convergence",
            "failover",
            "login",
            "turmoil:peer-msgs",
            "wal-tail",
        ] {
            assert!(a.checks.get(inv).copied().unwrap_or(0) > 0, "{inv}");
        }
        assert!(a.stats.clock_jumps > 0);
    }

    #[test]
    fn cluster_addresses_name_their_host() {
        assert_eq!(super::host_of("https://cluster2:8201"), Some(2));
        assert_eq!(super::host_of("cluster0:8201"), Some(0));
        assert_eq!(super::host_of("elsewhere:8201"), None);
    }
}
