//! The turmoil tier ([`crate::Tier::Turmoil`]): each server is a turmoil host running the
//! real [`cairn_core::Node`] behind a small async adapter, and the replication peer
//! messages travel over turmoil TCP streams (4-byte big-endian length + JSON: the sim's own
//! framing, not the shell's TLS transport), so socket behaviour is exercised: connections
//! broken mid-stream (the serving side writes half an answer and drops the connection),
//! connections dropped by host crashes, held (backpressured) links released later,
//! partitions — some of them triggered exactly when a secondary asks for Merkle pages or
//! keys, i.e. during a Merkle diff/sync.
//!
//! Topology: a primary (host `n0`, performance and, when needed, DR) and one or two
//! secondaries (performance or DR). The operator runs outside the hosts between turmoil
//! steps: it calls a node's API directly (the API is not what this tier tests) and carries
//! the secondaries' activation-token unwraps to the primary the same way. Each server is a
//! shared [`crate::host::Host`] whose storage outlives the turmoil host's crashes; this
//! tier's commit policy makes every input its own batch, committed as it is handled, so a
//! crash loses only what is in flight.
//!
//! Deterministic: turmoil's RNG is a ChaCha stream derived from the master seed, the epoch
//! is fixed, the tick is 10 ms, hosts are registered in a fixed order, nothing selects at
//! random, and node time is turmoil's simulated time.
//!
//! Invariants: `convergence` + `liveness` (after faults stop, every secondary's Merkle
//! root equals the primary's within [`crate::repl::CONVERGE_MS`]), `filters` (a
//! performance secondary never holds the primary's token entries), `durability` (every
//! acknowledged write reads back from the primary at the end), `no-panic`.

use crate::check::Violation;
use crate::host::Host;
use crate::rng::SimRng;
use crate::storage::SimStorage;
use crate::trace::{shorten, Trace};
use crate::{Failure, Outcome, RunConfig};
use cairn_core::api::RequestId;
use cairn_core::replication::{
    HttpReply, Mode, PeerAnswer, PeerMsg, PeerReply, PeerRequest, PeerSend, ReplicationConfig,
};
use cairn_core::{Input, Method, NodeConfig, Output, Request, Storage};
use rand_core::SeedableRng;
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use turmoil::net::{TcpListener, TcpStream};

const PORT: u16 = 8201;
const TICK_MS: u64 = 10;
const IO_TIMEOUT_MS: u64 = 3_000;
/// Simulated time of the chaos phase.
const CHAOS_MS: u64 = 40_000;
/// Offset of node time from turmoil's elapsed time.
const T0: u64 = 1_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Primary,
    Perf,
    Dr,
}

/// One turmoil host: the shared [`Host`] (node, storage that outlives crashes, boot) and
/// the queues between the node and the host's tasks.
struct Machine {
    host: Host,
    kind: Kind,
    key: String,
    needs_unseal: bool,
    /// Peer messages the host task is to send.
    sends: VecDeque<PeerSend>,
    /// Answers to peer requests, for the connections waiting on them.
    answers: BTreeMap<u64, PeerAnswer>,
    next_pid: u64,
    /// Responses and HTTP calls for the driver.
    driver: VecDeque<Output>,
}

/// What the host tasks tell the driver.
#[derive(Default)]
struct Ctl {
    trace: Vec<String>,
    /// Host whose Merkle diff/sync should be cut off from the primary now.
    sync_cut: Option<usize>,
    breaks: u64,
    peer_msgs: u64,
}

type Hosts = Rc<RefCell<Vec<Machine>>>;

fn name(h: usize) -> String {
    format!("n{h}")
}

fn now_ms() -> u64 {
    turmoil::sim_elapsed()
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
        + T0
}

/// Hands `input` to host `h`'s node and sorts its outputs. This tier's commit policy:
/// every input is its own batch, committed as soon as it is handled, and its outputs are
/// released then.
fn handle(hosts: &Hosts, h: usize, now: u64, input: Input) {
    let mut hs = hosts.borrow_mut();
    let host = &mut hs[h];
    if !host.host.is_up() {
        return;
    }
    host.host.handle(now, input);
    while let Some(o) = host.host.poll_output() {
        host.host.hold(o);
    }
    let released = host.host.commit().map(|(_, out)| out).unwrap_or_default();
    for o in released {
        match o {
            Output::PeerSend(s) => host.sends.push_back(s),
            Output::PeerResponse(r) => {
                host.answers.insert(r.id, r.msg);
            }
            o @ (Output::Response(_) | Output::HttpCall(_) | Output::AdminDone { .. }) => {
                host.driver.push_back(o)
            }
            _ => {}
        }
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

/// One peer call: connect, send the message, read the answer.
async fn call_peer(
    hosts: Hosts,
    ctl: Rc<RefCell<Ctl>>,
    h: usize,
    boot: u64,
    s: PeerSend,
    cut_permille: u64,
    mut rng: SimRng,
) {
    let to =
        s.to.trim_start_matches("https://")
            .trim_start_matches("http://")
            .to_string();
    let body = s.msg.clone().into_wire().unwrap_or_default();
    let op = serde_json::to_value(&s.msg.body)
        .ok()
        .and_then(|v| v["op"].as_str().map(str::to_string))
        .unwrap_or_default();
    if op.starts_with("merkle") && rng.chance(cut_permille) {
        ctl.borrow_mut().sync_cut = Some(h);
    }
    ctl.borrow_mut().peer_msgs += 1;
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
    if let Err(e) = &result {
        ctl.borrow_mut()
            .trace
            .push(format!("n{h} peer call={} to {to}: {e}", s.call_id));
    }
    let current = hosts.borrow()[h].host.boot() == boot;
    if current {
        handle(
            &hosts,
            h,
            now_ms(),
            Input::PeerReply(PeerReply {
                call_id: s.call_id,
                result,
            }),
        );
    }
}

/// Serves one connection: each frame is a peer request, answered when the node answers
/// (perhaps after a long poll); now and then the answer is cut off mid-frame.
async fn serve(
    hosts: Hosts,
    ctl: Rc<RefCell<Ctl>>,
    h: usize,
    mut st: TcpStream,
    break_permille: u64,
    mut rng: SimRng,
) {
    loop {
        let Ok(buf) = read_frame(&mut st).await else {
            return;
        };
        let Ok(msg) = PeerMsg::from_wire(&buf) else {
            return;
        };
        let pid = {
            let mut hs = hosts.borrow_mut();
            hs[h].next_pid += 1;
            hs[h].next_pid
        };
        handle(
            &hosts,
            h,
            now_ms(),
            Input::PeerRequest(PeerRequest { id: pid, msg }),
        );
        let answer = loop {
            if let Some(a) = hosts.borrow_mut()[h].answers.remove(&pid) {
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
            let mut c = ctl.borrow_mut();
            c.breaks += 1;
            c.trace
                .push(format!("n{h} breaks a connection mid-answer (pid {pid})"));
            return;
        }
        if write_frame(&mut st, &bytes).await.is_err() {
            return;
        }
    }
}

#[derive(Debug, Clone)]
struct Params {
    kinds: Vec<Kind>,
    break_permille: u64,
    cut_permille: u64,
    crash_mean_ms: u64,
    partition_mean_ms: u64,
    hold_mean_ms: u64,
    latency_max_ms: u64,
    wal_max_entries: u64,
    fetch_batch: usize,
    think_ms: u64,
}

impl Params {
    fn derive(seed: u64) -> Params {
        let mut r = SimRng::derive(seed, "turmoil-params");
        let n = r.range(1, 2) as usize;
        let mut kinds = vec![Kind::Primary];
        for _ in 0..n {
            kinds.push(if r.chance(600) { Kind::Perf } else { Kind::Dr });
        }
        Params {
            kinds,
            break_permille: *r.pick(&[0, 5, 30]).unwrap_or(&5),
            cut_permille: *r.pick(&[0, 20, 100]).unwrap_or(&20),
            crash_mean_ms: *r.pick(&[5_000, 15_000]).unwrap_or(&15_000),
            partition_mean_ms: *r.pick(&[4_000, 12_000]).unwrap_or(&12_000),
            hold_mean_ms: *r.pick(&[3_000, 10_000]).unwrap_or(&10_000),
            latency_max_ms: *r.pick(&[2, 10, 50]).unwrap_or(&10),
            wal_max_entries: *r.pick(&[8, 40, 1000]).unwrap_or(&40),
            fetch_batch: *r.pick(&[2, 16, 256]).unwrap_or(&16),
            think_ms: *r.pick(&[20, 100]).unwrap_or(&20),
        }
    }
    fn describe(&self) -> String {
        let kinds: Vec<&str> = self
            .kinds
            .iter()
            .map(|k| match k {
                Kind::Primary => "perf+primary",
                Kind::Perf => "perf",
                Kind::Dr => "dr",
            })
            .collect();
        format!(
            "tier=turmoil topology=[{}] break={}‰ merkle-cut={}‰ crash-every~{}ms partition-every~{}ms hold-every~{}ms latency<={}ms wal-max={} fetch-batch={} think={}ms",
            kinds.join(","),
            self.break_permille,
            self.cut_permille,
            self.crash_mean_ms,
            self.partition_mean_ms,
            self.hold_mean_ms,
            self.latency_max_ms,
            self.wal_max_entries,
            self.fetch_batch,
            self.think_ms
        )
    }
}

fn node_config(h: usize, p: &Params) -> NodeConfig {
    NodeConfig {
        node_id: name(h),
        tick_ms: 250,
        replication: ReplicationConfig {
            api_addr: format!("http://{}:8200", name(h)),
            cluster_addr: format!("{}:{PORT}", name(h)),
            wal: cairn_core::replication::wal::Limits {
                max_entries: p.wal_max_entries,
                max_bytes: 64 << 20,
            },
            pull_wait_ms: 500,
            fetch_batch: p.fetch_batch,
            ..Default::default()
        },
        license: cairn_core::license::LicenseState::hosted(),
        ..NodeConfig::default()
    }
}

/// Boots host `h` (first boot: dev set-up).
fn boot(hosts: &Hosts, h: usize, p: &Params, now: u64) {
    let mut hs = hosts.borrow_mut();
    let host = &mut hs[h];
    host.sends.clear();
    host.answers.clear();
    host.driver.clear();
    if host.host.start(node_config(h, p), false).is_none() {
        return;
    }
    let boot = host.host.boot();
    if boot == 1 {
        host.key = host.host.dev_setup(now, &format!("root-n{h}"));
    }
    host.needs_unseal = boot > 1;
}

/// The body of host `h`: boot, listen on the cluster port, send what the node asks,
/// tick it.
async fn host_main(
    hosts: Hosts,
    ctl: Rc<RefCell<Ctl>>,
    h: usize,
    p: Params,
    seed: u64,
) -> turmoil::Result {
    {
        boot(&hosts, h, &p, now_ms());
        let b = hosts.borrow()[h].host.boot();
        let mut rng = SimRng::derive(seed, &format!("turmoil/host/{h}/boot/{b}"));
        let listener = TcpListener::bind(("0.0.0.0", PORT)).await?;
        {
            let (hosts, ctl) = (hosts.clone(), ctl.clone());
            let br = p.break_permille;
            let mut arng = SimRng::derive(seed, &format!("turmoil/accept/{h}/{b}"));
            tokio::task::spawn_local(async move {
                while let Ok((st, _)) = listener.accept().await {
                    let r = SimRng::derive(arng.next_u64(), "conn");
                    tokio::task::spawn_local(serve(hosts.clone(), ctl.clone(), h, st, br, r));
                }
            });
        }
        loop {
            let sends: Vec<PeerSend> = hosts.borrow_mut()[h].sends.drain(..).collect();
            for s in sends {
                let r = SimRng::derive(rng.next_u64(), "call");
                tokio::task::spawn_local(call_peer(
                    hosts.clone(),
                    ctl.clone(),
                    h,
                    b,
                    s,
                    p.cut_permille,
                    r,
                ));
            }
            let now = now_ms();
            let due = hosts.borrow()[h]
                .host
                .node()
                .map(|n| n.poll_timeout())
                .unwrap_or(u64::MAX);
            if due <= now {
                handle(&hosts, h, now, Input::Tick);
            }
            tokio::time::sleep(Duration::from_millis(TICK_MS)).await;
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Unseal(usize),
    EnablePrimary(Mode),
    SecToken(usize),
    SecEnable(usize),
    Put(u64, u64),
    Delete(u64),
    TokenCreate,
    ReadBack(u64),
}

struct Sec {
    host: usize,
    mode: Mode,
    attempt: u32,
    token: Option<String>,
    enabled: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Chaos,
    Final,
    ReadBack,
    Done,
}

struct Driver {
    p: Params,
    hosts: Hosts,
    ctl: Rc<RefCell<Ctl>>,
    trace: Trace,
    now: u64,
    oprng: SimRng,
    faults: SimRng,
    next_id: RequestId,
    outstanding: Option<(RequestId, usize, Op)>,
    next_op_at: u64,
    /// HTTP calls in flight: request id at the target → (caller, boot, call id).
    http: BTreeMap<RequestId, (usize, u64, u64)>,
    secs: Vec<Sec>,
    perf_on: bool,
    dr_on: bool,
    next_key: u64,
    model: BTreeMap<u64, Option<u64>>,
    readback: Vec<u64>,
    down: BTreeMap<usize, u64>,
    cuts: Vec<(u64, usize, usize, bool)>,
    next_crash: u64,
    next_partition: u64,
    next_hold: u64,
    phase: Phase,
    final_start: u64,
    last_conv: u64,
    unseal_tries: Vec<u32>,
    checks: BTreeMap<&'static str, u64>,
    requests: u64,
    crashes: u64,
    restarts: u64,
    lost: u64,
}

fn fail<T>(invariant: &'static str, detail: impl Into<String>) -> Result<T, Violation> {
    Err(Violation {
        invariant,
        detail: detail.into(),
    })
}

impl Driver {
    fn log(&mut self, s: &str) {
        self.trace.log(self.now, s);
    }
    fn bump(&mut self, k: &'static str) {
        *self.checks.entry(k).or_default() += 1;
    }

    fn send(&mut self, h: usize, op: Op, req: Request) {
        self.requests += 1;
        self.log(&format!(
            "op -> n{h} #{} {:?} {} {}",
            req.id,
            req.method,
            req.path,
            shorten(&String::from_utf8_lossy(&req.body), 60)
        ));
        self.outstanding = Some((req.id, h, op));
        if !self.hosts.borrow()[h].host.is_up() {
            self.on_reply(None);
            return;
        }
        handle(&self.hosts, h, self.now, Input::Request(req));
    }

    fn choose(&mut self) -> Option<(usize, Op, Request)> {
        self.next_id += 1;
        let id = self.next_id;
        for h in 0..self.p.kinds.len() {
            let (needs, up, key) = {
                let hs = self.hosts.borrow();
                let t = self.unseal_tries[h];
                let key = if t.is_multiple_of(2) || h == 0 {
                    hs[h].key.clone()
                } else {
                    hs[0].key.clone()
                };
                (hs[h].needs_unseal, hs[h].host.is_up(), key)
            };
            if needs && up {
                let req =
                    Request::new(id, Method::Put, "sys/unseal").with_json(json!({ "key": key }));
                return Some((h, Op::Unseal(h), req));
            }
        }
        let r0 = "root-n0";
        match self.phase {
            Phase::Chaos => {}
            Phase::ReadBack => {
                let k = *self.readback.last()?;
                let req = Request::new(id, Method::Get, &format!("secret/s-{k}")).with_token(r0);
                return Some((0, Op::ReadBack(k), req));
            }
            _ => return None,
        }
        let need_dr = self.secs.iter().any(|s| s.mode == Mode::Dr);
        for (mode, done) in [
            (Mode::Performance, self.perf_on),
            (Mode::Dr, self.dr_on || !need_dr),
        ] {
            if !done {
                let req = Request::new(
                    id,
                    Method::Post,
                    &format!("sys/replication/{}/primary/enable", mode.name()),
                )
                .with_token(r0)
                .with_json(json!({}));
                return Some((0, Op::EnablePrimary(mode), req));
            }
        }
        for i in 0..self.secs.len() {
            let s = &self.secs[i];
            if s.enabled {
                continue;
            }
            let m = s.mode.name();
            if s.token.is_none() {
                let req = Request::new(
                    id,
                    Method::Post,
                    &format!("sys/replication/{m}/primary/secondary-token"),
                )
                .with_token(r0)
                .with_json(json!({ "id": format!("n{}-{}", s.host, s.attempt) }));
                return Some((0, Op::SecToken(i), req));
            }
            let req = Request::new(
                id,
                Method::Post,
                &format!("sys/replication/{m}/secondary/enable"),
            )
            .with_token(&format!("root-n{}", s.host))
            .with_json(json!({ "token": s.token.clone().unwrap_or_default() }));
            return Some((s.host, Op::SecEnable(i), req));
        }
        match self.oprng.weighted(&[60, 10, 5]) {
            0 => {
                let n = if self.next_key == 0 || self.oprng.chance(600) {
                    self.next_key += 1;
                    self.next_key - 1
                } else {
                    self.oprng.below(self.next_key)
                };
                let v = n + 1_000_000 * self.oprng.below(100);
                let req = Request::new(id, Method::Put, &format!("secret/s-{n}"))
                    .with_token(r0)
                    .with_json(json!({ "v": v }));
                Some((0, Op::Put(n, v), req))
            }
            1 if self.next_key > 0 => {
                let n = self.oprng.below(self.next_key);
                let req = Request::new(id, Method::Delete, &format!("secret/s-{n}")).with_token(r0);
                Some((0, Op::Delete(n), req))
            }
            _ => {
                let req = Request::new(id, Method::Post, "auth/token/create")
                    .with_token(r0)
                    .with_json(json!({"ttl": "1h"}));
                Some((0, Op::TokenCreate, req))
            }
        }
    }

    fn on_reply(&mut self, resp: Option<cairn_core::Response>) {
        let Some((id, h, op)) = self.outstanding.take() else {
            return;
        };
        let ok = resp.as_ref().is_some_and(|r| r.status < 300);
        let status = resp.as_ref().map(|r| r.status).unwrap_or(0);
        let body = resp
            .as_ref()
            .and_then(|r| r.body.clone())
            .unwrap_or(Value::Null);
        let text = format!("{status} {body}");
        if resp.is_none() {
            self.lost += 1;
        }
        self.log(&format!("op <- n{h} #{id} {}", shorten(&text, 140)));
        self.next_op_at = self.now + self.oprng.delay(self.p.think_ms).max(1);
        match op {
            Op::Unseal(h) => {
                let sealed = body["sealed"]
                    .as_bool()
                    .or_else(|| body["data"]["sealed"].as_bool());
                if (ok && sealed == Some(false)) || text.contains("not sealed") {
                    self.hosts.borrow_mut()[h].needs_unseal = false;
                    self.unseal_tries[h] = 0;
                } else {
                    self.unseal_tries[h] += 1;
                    self.next_op_at = self.now + 500;
                }
            }
            Op::EnablePrimary(m) => {
                if ok || text.contains("already") {
                    match m {
                        Mode::Performance => self.perf_on = true,
                        Mode::Dr => self.dr_on = true,
                    }
                }
            }
            Op::SecToken(i) => match body["wrap_info"]["token"].as_str() {
                Some(t) if ok => self.secs[i].token = Some(t.to_string()),
                _ => self.secs[i].attempt += 1,
            },
            Op::SecEnable(i) => {
                if ok || text.contains("already a") {
                    self.secs[i].enabled = true;
                } else if resp.is_some() {
                    self.secs[i].attempt += 1;
                    self.secs[i].token = None;
                }
            }
            Op::Put(n, v) => {
                if ok {
                    self.model.insert(n, Some(v));
                } else {
                    self.model.remove(&n);
                }
            }
            Op::Delete(n) => {
                if ok {
                    self.model.insert(n, None);
                } else {
                    self.model.remove(&n);
                }
            }
            Op::TokenCreate => {}
            Op::ReadBack(_) => {}
        }
    }

    fn readback_answer(&mut self, resp: Option<cairn_core::Response>) -> Result<(), Violation> {
        let Some((_, _, Op::ReadBack(k))) = self.outstanding.clone() else {
            return Ok(());
        };
        self.on_reply(resp.clone());
        let Some(r) = resp else {
            return Ok(());
        };
        if r.status == 503 {
            return Ok(());
        }
        self.readback.pop();
        self.bump("durability");
        let got = if r.status == 404 {
            None
        } else {
            r.body.as_ref().and_then(|b| b["data"]["v"].as_u64())
        };
        let want = self.model.get(&k).copied().flatten();
        if got != want {
            return fail(
                "durability",
                format!(
                    "acknowledged state of secret/s-{k} was {want:?}, read back {got:?} ({})",
                    r.status
                ),
            );
        }
        if self.readback.is_empty() {
            self.log("final: every acknowledged write read back");
            self.phase = Phase::Done;
        }
        Ok(())
    }

    /// Routes what the nodes released to the driver: operator responses and unwraps.
    fn pump(&mut self) -> Result<(), Violation> {
        for h in 0..self.p.kinds.len() {
            loop {
                let o = self.hosts.borrow_mut()[h].driver.pop_front();
                let Some(o) = o else { break };
                match o {
                    Output::Response(r) => {
                        if let Some((caller, boot, call)) = self.http.remove(&r.id) {
                            let body = r
                                .body
                                .as_ref()
                                .map(|b| serde_json::to_vec(b).unwrap_or_default())
                                .unwrap_or_default();
                            if self.hosts.borrow()[caller].host.boot() == boot {
                                handle(
                                    &self.hosts,
                                    caller,
                                    self.now,
                                    Input::HttpReply(HttpReply {
                                        call_id: call,
                                        result: Ok((r.status, body)),
                                    }),
                                );
                            }
                        } else if self.outstanding.as_ref().is_some_and(|o| o.0 == r.id) {
                            if self.phase == Phase::ReadBack {
                                self.readback_answer(Some(r))?;
                            } else {
                                self.on_reply(Some(r));
                            }
                        }
                    }
                    Output::HttpCall(c) => {
                        let boot = self.hosts.borrow()[h].host.boot();
                        let target = (0..self.p.kinds.len())
                            .find(|j| c.url.starts_with(&format!("http://{}:8200/", name(*j))));
                        let path = c.url.split("/v1/").nth(1).map(str::to_string);
                        match (target, path) {
                            (Some(j), Some(path)) if self.hosts.borrow()[j].host.is_up() => {
                                self.next_id += 1;
                                let id = self.next_id;
                                let mut req = Request::new(id, Method::Post, &path);
                                req.body = c.body;
                                self.http.insert(id, (h, boot, c.call_id));
                                handle(&self.hosts, j, self.now, Input::Request(req));
                            }
                            _ => handle(
                                &self.hosts,
                                h,
                                self.now,
                                Input::HttpReply(HttpReply {
                                    call_id: c.call_id,
                                    result: Err(format!("cannot reach {}", c.url)),
                                }),
                            ),
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    fn check_filters(&mut self) -> Result<(), Violation> {
        let hs = self.hosts.borrow();
        let theirs: BTreeSet<String> = hs[0]
            .host
            .storage()
            .and_then(|s| s.scan("sys/token/id/").ok())
            .unwrap_or_default()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        for s in &self.secs {
            if s.mode != Mode::Performance || !s.enabled {
                continue;
            }
            let mine = hs[s.host]
                .host
                .storage()
                .and_then(|st| st.scan("sys/token/id/").ok())
                .unwrap_or_default();
            for (k, _) in mine {
                if theirs.contains(&k) {
                    return fail(
                        "filters",
                        format!(
                            "performance secondary n{} holds the primary's token entry {k}",
                            s.host
                        ),
                    );
                }
            }
        }
        drop(hs);
        self.bump("filters");
        Ok(())
    }

    fn check_convergence(&mut self) -> Result<(), Violation> {
        if self.now < self.last_conv + 250 {
            return Ok(());
        }
        self.last_conv = self.now;
        let mut bad = Vec::new();
        {
            let hs = self.hosts.borrow();
            for s in &self.secs {
                let (Some(p), Some(n)) = (hs[0].host.node(), hs[s.host].host.node()) else {
                    bad.push(format!("n{} or n0 down", s.host));
                    continue;
                };
                if !s.enabled {
                    bad.push(format!("n{} not enabled", s.host));
                    continue;
                }
                let (a, b) = (
                    p.replication().merkle_root(s.mode),
                    n.replication().merkle_root(s.mode),
                );
                if a != b {
                    bad.push(format!(
                        "n{}: {} root {} vs primary {}",
                        s.host,
                        s.mode.name(),
                        &b[..12.min(b.len())],
                        &a[..12.min(a.len())]
                    ));
                }
            }
            for (h, x) in hs.iter().enumerate() {
                if x.needs_unseal || !x.host.is_up() {
                    bad.push(format!("n{h} sealed or down"));
                }
            }
        }
        if bad.is_empty() {
            self.bump("convergence");
            self.log(&format!(
                "final: converged after {}ms",
                self.now - self.final_start
            ));
            self.phase = Phase::ReadBack;
            self.readback = self.model.keys().rev().copied().collect();
            if self.readback.is_empty() {
                self.phase = Phase::Done;
            }
            return Ok(());
        }
        if self.now > self.final_start + crate::repl::CONVERGE_MS {
            return fail(
                "convergence",
                format!(
                    "not converged {}s after faults stopped: {}",
                    crate::repl::CONVERGE_MS / 1000,
                    bad.join("; ")
                ),
            );
        }
        Ok(())
    }
}

/// Runs one seed on the turmoil tier.
pub fn run(cfg: &RunConfig) -> Outcome {
    let seed = cfg.seed;
    let p = Params::derive(seed);
    let n = p.kinds.len();
    let hosts: Hosts = Rc::new(RefCell::new(
        (0..n)
            .map(|h| Machine {
                host: Host::new(h, seed, SimStorage::new()),
                kind: p.kinds[h],
                key: String::new(),
                needs_unseal: false,
                sends: VecDeque::new(),
                answers: BTreeMap::new(),
                next_pid: 0,
                driver: VecDeque::new(),
            })
            .collect(),
    ));
    let ctl = Rc::new(RefCell::new(Ctl::default()));
    let mut trace = Trace::new(cfg.print_trace);
    trace.log(0, &format!("seed={seed} {}", p.describe()));
    let rng =
        rand_chacha::ChaCha20Rng::seed_from_u64(SimRng::derive(seed, "turmoil-rng").next_u64());
    let mut sim = turmoil::Builder::new()
        .simulation_duration(Duration::from_secs(3_600))
        .tick_duration(Duration::from_millis(TICK_MS))
        .epoch(std::time::UNIX_EPOCH)
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(p.latency_max_ms.max(1)))
        .build_with_rng(Box::new(rng));
    for h in 0..n {
        let (hosts, ctl, p) = (hosts.clone(), ctl.clone(), p.clone());
        sim.host(name(h).as_str(), move || {
            host_main(hosts.clone(), ctl.clone(), h, p.clone(), seed)
        });
    }
    let secs = (1..n)
        .map(|h| Sec {
            host: h,
            mode: if p.kinds[h] == Kind::Dr {
                Mode::Dr
            } else {
                Mode::Performance
            },
            attempt: 0,
            token: None,
            enabled: false,
        })
        .collect();
    let mut d = Driver {
        p: p.clone(),
        hosts: hosts.clone(),
        ctl: ctl.clone(),
        trace,
        now: 0,
        oprng: SimRng::derive(seed, "turmoil-operator"),
        faults: SimRng::derive(seed, "turmoil-faults"),
        next_id: 1,
        outstanding: None,
        next_op_at: 100,
        http: BTreeMap::new(),
        secs,
        perf_on: false,
        dr_on: false,
        next_key: 0,
        model: BTreeMap::new(),
        readback: Vec::new(),
        down: BTreeMap::new(),
        cuts: Vec::new(),
        next_crash: 0,
        next_partition: 0,
        next_hold: 0,
        phase: Phase::Chaos,
        final_start: 0,
        last_conv: 0,
        unseal_tries: vec![0; n],
        checks: BTreeMap::new(),
        requests: 0,
        crashes: 0,
        restarts: 0,
        lost: 0,
    };
    d.next_crash = d.faults.delay(p.crash_mean_ms) + 2_000;
    d.next_partition = d.faults.delay(p.partition_mean_ms) + 1_000;
    d.next_hold = d.faults.delay(p.hold_mean_ms) + 1_000;
    let mut events = 0u64;
    let failure = loop {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| step(&mut sim, &mut d)));
        events += 1;
        match r {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => break None,
            Ok(Err(v)) => break Some((v.invariant.to_string(), v.detail)),
            Err(p) => break Some(("no-panic".to_string(), crate::panic_text(&*p))),
        }
    };
    let failure = failure.map(|(invariant, detail)| Failure {
        invariant,
        detail,
        at_ms: d.now,
        last_events: d.trace.tail(),
    });
    let c = ctl.borrow();
    d.checks.insert("turmoil:breaks-mid-stream", c.breaks);
    d.checks.insert("turmoil:peer-msgs", c.peer_msgs);
    let kinds: Vec<Kind> = hosts.borrow().iter().map(|h| h.kind).collect();
    let _ = kinds;
    Outcome {
        config: cfg.clone(),
        params: p.describe(),
        events,
        sim_ms: d.now,
        trace_hash: d.trace.hash(),
        stats: crate::world::WorldStats {
            events,
            requests: d.requests,
            ticks: events,
            commits: 0,
            crashes: d.crashes,
            restarts: d.restarts,
            clock_jumps: 0,
            jumped_ms: 0,
            lost_requests: d.lost,
        },
        checks: d.checks.clone(),
        failure,
    }
}

/// One turmoil step, then the driver's turn: faults, operator, checks.
fn step(sim: &mut turmoil::Sim<'_>, d: &mut Driver) -> Result<bool, Violation> {
    if let Err(e) = sim.step() {
        return fail("no-panic", format!("turmoil: {e}"));
    }
    d.now = sim.elapsed().as_millis() as u64 + T0;
    let lines: Vec<String> = d.ctl.borrow_mut().trace.drain(..).collect();
    for l in lines {
        d.log(&l);
    }
    d.trace.log_core_records(d.now);
    let n = d.p.kinds.len();
    if d.phase == Phase::Chaos && d.now > T0 + CHAOS_MS {
        d.phase = Phase::Final;
        d.final_start = d.now;
        d.log("final phase: faults stop, links repaired and released, hosts restarted");
        for a in 0..n {
            for b in 0..n {
                if a < b {
                    sim.repair(name(a).as_str(), name(b).as_str());
                    sim.release(name(a).as_str(), name(b).as_str());
                }
            }
        }
        d.cuts.clear();
        let down: Vec<usize> = d.down.keys().copied().collect();
        for h in down {
            sim.bounce(name(h).as_str());
            d.restarts += 1;
        }
        d.down.clear();
    }
    if d.phase == Phase::Chaos {
        faults(sim, d);
    }
    d.pump()?;
    if d.outstanding.is_none() && d.now >= d.next_op_at && d.phase != Phase::Done {
        match d.choose() {
            Some((h, op, req)) => d.send(h, op, req),
            None => d.next_op_at = d.now + 50,
        }
        d.pump()?;
    }
    d.trace.log_core_records(d.now);
    if d.now % 500 < TICK_MS {
        d.check_filters()?;
    }
    if d.phase == Phase::Final {
        d.check_convergence()?;
    }
    if d.phase == Phase::Done {
        return Ok(false);
    }
    if d.now > T0 + CHAOS_MS + crate::repl::CONVERGE_MS + 60_000 {
        return fail("liveness", "the operator's read-back did not finish");
    }
    Ok(true)
}

fn faults(sim: &mut turmoil::Sim<'_>, d: &mut Driver) {
    let n = d.p.kinds.len();
    let now = d.now;
    // Restarts and the end of partitions and holds.
    let back: Vec<usize> = d
        .down
        .iter()
        .filter(|(_, t)| **t <= now)
        .map(|(h, _)| *h)
        .collect();
    for h in back {
        d.down.remove(&h);
        sim.bounce(name(h).as_str());
        d.restarts += 1;
        d.log(&format!("n{h} restarts"));
    }
    let mut keep = Vec::new();
    for (t, a, b, hold) in std::mem::take(&mut d.cuts) {
        if t <= now {
            if hold {
                sim.release(name(a).as_str(), name(b).as_str());
                d.log(&format!("net RELEASE n{a} | n{b}"));
            } else {
                sim.repair(name(a).as_str(), name(b).as_str());
                d.log(&format!("net REPAIR n{a} | n{b}"));
            }
        } else {
            keep.push((t, a, b, hold));
        }
    }
    d.cuts = keep;
    if now >= d.next_crash {
        d.next_crash = now + d.faults.delay(d.p.crash_mean_ms).max(100);
        let h = d.faults.below(n as u64) as usize;
        if !d.down.contains_key(&h) {
            sim.crash(name(h).as_str());
            {
                let mut hs = d.hosts.borrow_mut();
                hs[h].host.crash();
            }
            d.crashes += 1;
            if d.outstanding.as_ref().is_some_and(|o| o.1 == h) {
                d.on_reply(None);
            }
            let back = now + d.faults.delay(1_000).max(TICK_MS);
            d.down.insert(h, back);
            d.log(&format!("n{h} CRASH (its connections break)"));
        }
    }
    if now >= d.next_partition {
        d.next_partition = now + d.faults.delay(d.p.partition_mean_ms).max(100);
        let s = 1 + d.faults.below(n as u64 - 1) as usize;
        sim.partition("n0", name(s).as_str());
        let t = now + d.faults.delay(3_000).max(TICK_MS);
        d.cuts.push((t, 0, s, false));
        d.log(&format!("net PARTITION n0 | n{s}"));
    }
    if now >= d.next_hold {
        d.next_hold = now + d.faults.delay(d.p.hold_mean_ms).max(100);
        let s = 1 + d.faults.below(n as u64 - 1) as usize;
        sim.hold("n0", name(s).as_str());
        let t = now + d.faults.delay(2_000).max(TICK_MS);
        d.cuts.push((t, 0, s, true));
        d.log(&format!("net HOLD n0 | n{s} (backpressure)"));
    }
    let cut = d.ctl.borrow_mut().sync_cut.take();
    if let Some(s) = cut {
        if s != 0 && !d.cuts.iter().any(|c| c.2 == s && !c.3) {
            sim.partition("n0", name(s).as_str());
            let t = now + d.faults.delay(1_500).max(TICK_MS);
            d.cuts.push((t, 0, s, false));
            d.log(&format!(
                "net PARTITION n0 | n{s} during its Merkle diff/sync"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_turmoil_seed_replays_byte_for_byte() {
        let mut cfg = crate::RunConfig::new(1);
        cfg.tier = crate::Tier::Turmoil;
        let a = crate::run(&cfg);
        let b = crate::run(&cfg);
        assert!(a.ok(), "{}", a.report());
        assert_eq!(a.trace_hash, b.trace_hash);
        assert!(a.checks.get("convergence").copied().unwrap_or(0) > 0);
    }
}
