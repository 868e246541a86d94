//! The fast-tier driver: bare [`cairn_core::Node`]s in one thread, one event queue,
//! simulated time that jumps straight to the next event or deadline.
//!
//! A world holds hosts ([`crate::host::Host`]: a node plus its storage, which outlives
//! crashes, and its held outputs), the seeded network, the operator's clients, the fault
//! injector and the checker. Each call to
//! [`World::step`] processes exactly one event: the earliest of the queued events
//! (message deliveries, batch commits, crashes, restarts, client wake-ups, faults) and
//! the nodes' own tick deadlines (`poll_timeout`). Ties go to the queue in insertion
//! order, so the run is a pure function of the master seed.
//!
//! Group commit works as in the shell: a node's outputs are held until the batch that
//! produced them commits; a crash drops both the uncommitted writes and the held outputs
//! (their clients see a reset connection). Released outputs go to the checker first, in
//! the order the node produced them, then onto the network.
//!
//! Extending: a new kind of node gets its set-up in [`World::boot`]; peer messages get a
//! [`Payload`] variant, are routed with [`World::send`] over links configured on the
//! [`Network`] (loss, delay, partitions), and are handed to the node in [`World::deliver`].

use crate::check::{Checker, Observed, Violation};
use crate::host::{Batching, GroupCommit, Host, Sort};
use crate::net::{Addr, ClientId, HostId, Link, Network, Payload, Route};
use crate::operator::{Next, Op, Operator, OperatorParams, Reply, Role};
use crate::rng::SimRng;
use crate::storage::{CommitInfo, SimStorage};
use crate::trace::Trace;
use cairn_core::api::RequestId;
use cairn_core::{Input, NodeConfig, Output, Response};
use std::collections::BTreeMap;

/// Events the final phase may take before it counts as stuck.
pub const FINAL_MAX_EVENTS: u64 = 20_000;

/// Per-seed settings, all derived from the master seed.
#[derive(Debug, Clone)]
pub struct Params {
    pub hosts: usize,
    pub operator: OperatorParams,
    pub client_link: Link,
    /// Longest wait between a batch's first write and its commit.
    pub commit_window_ms: u64,
    /// A batch commits at once when it holds this many outputs.
    pub max_batch: usize,
    pub tick_ms: u64,
    /// Mean time between crashes (of a random node).
    pub crash_mean_ms: u64,
    /// Chance, per batch, of a crash before the batch commits.
    pub crash_in_batch_permille: u64,
    pub downtime_mean_ms: u64,
    /// Mean time between forward clock jumps, and the largest jump.
    pub jump_mean_ms: u64,
    pub jump_max_ms: u64,
}

impl Params {
    pub fn derive(seed: u64) -> Params {
        let mut r = SimRng::derive(seed, "params");
        let hosts = r.range(1, 3) as usize;
        let mut p = Params {
            hosts,
            operator: OperatorParams {
                hosts,
                traffic_per_host: r.range(1, 3) as usize,
                think_mean_ms: *r.pick(&[2, 20, 100, 400]).unwrap_or(&20),
                admin_think_mean_ms: *r.pick(&[5, 50, 300]).unwrap_or(&50),
                dev_setup_permille: *r.pick(&[0, 300, 1000]).unwrap_or(&300),
            },
            client_link: Link {
                delay_mean: r.range(0, 3),
                loss_permille: 0,
                fifo: r.chance(500),
                up: true,
            },
            commit_window_ms: r.range(0, 5),
            max_batch: r.range(1, 16) as usize,
            tick_ms: *r.pick(&[250, 1000, 1000, 5000]).unwrap_or(&1000),
            crash_mean_ms: *r.pick(&[2_000, 10_000, 60_000]).unwrap_or(&10_000),
            crash_in_batch_permille: *r.pick(&[0, 20, 100]).unwrap_or(&20),
            downtime_mean_ms: 0,
            jump_mean_ms: *r.pick(&[2_000, 10_000, 60_000]).unwrap_or(&10_000),
            jump_max_ms: *r
                .pick(&[120_000, 3_600_000, 6 * 3_600_000])
                .unwrap_or(&3_600_000),
        };
        // Nodes are down a small part of the time at most.
        let downtime: u64 = *r.pick(&[50, 1_000, 10_000]).unwrap_or(&1_000);
        p.downtime_mean_ms = downtime.min(p.crash_mean_ms / 4);
        p
    }

    pub fn describe(&self) -> String {
        format!(
            "hosts={} traffic/host={} think={}ms admin-think={}ms dev-setup={}‰ net-delay={}ms fifo={} \
             commit-window={}ms max-batch={} tick={}ms crash-every~{}ms crash-in-batch={}‰ \
             downtime~{}ms jump-every~{}ms jump-max={}ms",
            self.hosts,
            self.operator.traffic_per_host,
            self.operator.think_mean_ms,
            self.operator.admin_think_mean_ms,
            self.operator.dev_setup_permille,
            self.client_link.delay_mean,
            self.client_link.fifo,
            self.commit_window_ms,
            self.max_batch,
            self.tick_ms,
            self.crash_mean_ms,
            self.crash_in_batch_permille,
            self.downtime_mean_ms,
            self.jump_mean_ms,
            self.jump_max_ms,
        )
    }
}

#[derive(Debug, Clone)]
enum Event {
    Deliver {
        from: Addr,
        to: Addr,
        payload: Box<Payload>,
    },
    Commit {
        host: HostId,
        batch: u64,
    },
    Crash(HostId),
    Restart(HostId),
    Wake(ClientId),
    NextCrash,
    NextJump,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientState {
    /// A wake-up is queued.
    Waiting,
    /// A request is outstanding.
    Busy,
    /// Nothing queued (final phase).
    Idle,
}

#[derive(Debug, Clone)]
struct InFlight {
    client: ClientId,
    op: Op,
    handled_at: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Traffic and faults.
    Chaos,
    /// No more faults or traffic: every node is crashed once more, unsealed and read back.
    Final,
}

/// Counters of one run.
#[derive(Debug, Clone, Copy, Default)]
pub struct WorldStats {
    pub events: u64,
    pub requests: u64,
    pub ticks: u64,
    pub commits: u64,
    pub crashes: u64,
    pub restarts: u64,
    pub clock_jumps: u64,
    /// Simulated ms skipped by clock jumps (no events in them).
    pub jumped_ms: u64,
    pub lost_requests: u64,
}

/// What [`World::step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Continue,
    /// The final phase is complete: every node was read back.
    Finished,
}

pub struct World {
    pub now: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Event>,
    hosts: Vec<Host>,
    net: Network,
    operator: Operator,
    clients: Vec<ClientState>,
    checker: Checker,
    trace: Trace,
    faults: SimRng,
    /// Which reads go to readers beside the node (as the shell's API threads answer them).
    beside: SimRng,
    params: Params,
    requests: BTreeMap<RequestId, InFlight>,
    next_id: RequestId,
    phase: Phase,
    chaos_steps: u64,
    final_events: u64,
    stats: WorldStats,
}

impl World {
    /// A world for master seed `seed` whose chaos phase lasts `chaos_steps` events.
    pub fn new(cfg: &crate::RunConfig) -> World {
        let (seed, chaos_steps, fault, print) = (cfg.seed, cfg.steps, cfg.fault, cfg.print_trace);
        let params = Params::derive(seed);
        let mut trace = Trace::new(print);
        trace.log(0, &format!("seed={seed} tier=fast {}", params.describe()));
        if let Some(f) = fault {
            trace.log(0, &format!("planted storage fault: {f:?}"));
        }
        let operator = Operator::new(SimRng::derive(seed, "operator"), params.operator.clone());
        let hosts = (0..params.hosts)
            .map(|h| Host::new(h, seed, SimStorage::with_fault(fault)))
            .collect();
        let mut w = World {
            now: 0,
            seq: 0,
            queue: BTreeMap::new(),
            hosts,
            net: Network::new(SimRng::derive(seed, "network"), params.client_link),
            clients: vec![ClientState::Waiting; operator.clients().len()],
            operator,
            checker: Checker::new(params.hosts),
            trace,
            faults: SimRng::derive(seed, "faults"),
            beside: SimRng::derive(seed, "reads-beside"),
            params,
            requests: BTreeMap::new(),
            next_id: 1,
            phase: Phase::Chaos,
            chaos_steps,
            final_events: 0,
            stats: WorldStats::default(),
        };
        for h in 0..w.hosts.len() {
            w.boot(h);
        }
        for c in 0..w.clients.len() {
            let d = w.operator.initial_delay(c);
            w.schedule(d, Event::Wake(c));
        }
        let d = w.faults.delay(w.params.crash_mean_ms);
        w.schedule(d, Event::NextCrash);
        let d = w.faults.delay(w.params.jump_mean_ms);
        w.schedule(d, Event::NextJump);
        w
    }

    pub fn params(&self) -> &Params {
        &self.params
    }
    pub fn stats(&self) -> WorldStats {
        self.stats
    }
    pub fn trace(&self) -> &Trace {
        &self.trace
    }
    pub fn checker(&self) -> &Checker {
        &self.checker
    }
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }
    pub fn phase(&self) -> Phase {
        self.phase
    }

    fn schedule(&mut self, delay: u64, ev: Event) {
        self.seq += 1;
        self.queue.insert((self.now + delay, self.seq), ev);
    }

    fn log(&mut self, what: &str) {
        self.trace.log(self.now, what);
    }

    /// Sends a message over the network.
    fn send(&mut self, from: Addr, to: Addr, payload: Payload) {
        match self.net.route(self.now, from, to) {
            Route::Deliver(d) => self.schedule(
                d,
                Event::Deliver {
                    from,
                    to,
                    payload: Box::new(payload),
                },
            ),
            Route::Lost(why) => {
                self.log(&format!("net {from}->{to} dropped a message ({why})"));
            }
        }
    }

    /// Starts the node of host `h` on its storage (sealed, as after any restart).
    fn boot(&mut self, h: HostId) {
        let config = NodeConfig {
            node_id: format!("n{h}"),
            tick_ms: self.params.tick_ms,
            ..NodeConfig::default()
        };
        let host = &mut self.hosts[h];
        let Some(node) = host.start(config, false) else {
            return;
        };
        let keys = node.storage().committed_len();
        let boot = host.boot();
        self.log(&format!("n{h} start boot={boot} durable-keys={keys}"));
    }

    /// The earliest tick deadline among running nodes.
    fn next_tick(&self) -> Option<(u64, HostId)> {
        self.hosts
            .iter()
            .filter_map(|h| h.node().map(|n| (n.poll_timeout(), h.id)))
            .min()
    }

    /// Processes one event; `Err` names a broken invariant.
    pub fn step(&mut self) -> Result<Step, Violation> {
        if self.phase == Phase::Chaos && self.stats.events >= self.chaos_steps {
            self.begin_final()?;
        }
        if self.phase == Phase::Final {
            if self.operator.final_done() && self.requests.is_empty() {
                self.log("final: every node read back");
                return Ok(Step::Finished);
            }
            self.final_events += 1;
            if self.final_events > FINAL_MAX_EVENTS {
                return Err(Violation {
                    invariant: "liveness",
                    detail: format!(
                        "the final unseal and read-back did not finish within {FINAL_MAX_EVENTS} events"
                    ),
                });
            }
        }
        let tick = self.next_tick();
        let queued = self.queue.first_key_value().map(|((at, _), _)| *at);
        let take_tick = match (tick, queued) {
            (Some((t, _)), Some(q)) => t < q,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => {
                return Err(Violation {
                    invariant: "liveness",
                    detail: "nothing left to happen: no events and no running node".into(),
                })
            }
        };
        self.stats.events += 1;
        if take_tick {
            let (at, h) = tick.unwrap_or_default();
            self.now = self.now.max(at);
            self.tick(h)?;
        } else if let Some(((at, _), ev)) = self.queue.pop_first() {
            self.now = self.now.max(at);
            self.event(ev)?;
        }
        self.trace.log_core_records(self.now);
        self.after_event()?;
        Ok(Step::Continue)
    }

    /// Checks that hold between events.
    fn after_event(&mut self) -> Result<(), Violation> {
        for h in 0..self.hosts.len() {
            let host = &self.hosts[h];
            if let Some(node) = host.node() {
                if !host.pending() {
                    let sealed = node.is_sealed();
                    self.checker.check_seal(h, sealed)?;
                }
            }
        }
        Ok(())
    }

    fn begin_final(&mut self) -> Result<(), Violation> {
        self.phase = Phase::Final;
        self.log("final phase: faults and traffic stop; every node crashes, restarts, is unsealed and read back");
        for h in 0..self.hosts.len() {
            if self.hosts[h].is_up() {
                self.crash(h)?;
            }
        }
        self.operator.begin_final();
        for c in 0..self.clients.len() {
            if self.clients[c] == ClientState::Idle {
                self.clients[c] = ClientState::Waiting;
                self.schedule(0, Event::Wake(c));
            }
        }
        Ok(())
    }

    fn tick(&mut self, h: HostId) -> Result<(), Violation> {
        self.stats.ticks += 1;
        self.log(&format!("n{h} tick"));
        self.hosts[h].handle(self.now, Input::Tick);
        self.drain(h);
        self.schedule_commit(h)
    }

    fn event(&mut self, ev: Event) -> Result<(), Violation> {
        match ev {
            Event::Deliver { from, to, payload } => self.deliver(from, to, *payload),
            Event::Commit { host, batch } => {
                if self.hosts[host].is_up() && self.hosts[host].is_open_batch(batch) {
                    self.commit(host)
                } else {
                    self.log(&format!("n{host} stale commit ignored"));
                    Ok(())
                }
            }
            Event::Crash(h) => {
                if self.hosts[h].is_up() {
                    self.crash(h)?;
                } else {
                    self.log(&format!("n{h} crash skipped (already down)"));
                }
                Ok(())
            }
            Event::Restart(h) => {
                self.stats.restarts += 1;
                self.boot(h);
                self.checker.on_restart(h);
                Ok(())
            }
            Event::Wake(c) => {
                self.wake(c);
                Ok(())
            }
            Event::NextCrash => {
                if self.phase == Phase::Chaos {
                    let h = self.faults.below(self.hosts.len() as u64) as usize;
                    if self.hosts[h].is_up() {
                        self.crash(h)?;
                    } else {
                        self.log(&format!("fault: n{h} crash skipped (down)"));
                    }
                    let d = self.faults.delay(self.params.crash_mean_ms).max(1);
                    self.schedule(d, Event::NextCrash);
                }
                Ok(())
            }
            Event::NextJump => {
                if self.phase == Phase::Chaos {
                    let jump = self.faults.range(1_000, self.params.jump_max_ms);
                    self.stats.clock_jumps += 1;
                    self.stats.jumped_ms += jump;
                    self.now += jump;
                    self.log(&format!(
                        "clock jumps forward {}.{:03}s",
                        jump / 1000,
                        jump % 1000
                    ));
                    let d = self.faults.delay(self.params.jump_mean_ms).max(1);
                    self.schedule(d, Event::NextJump);
                }
                Ok(())
            }
        }
    }

    fn wake(&mut self, c: ClientId) {
        let client = self.operator.clients()[c].clone();
        match self.operator.next(c) {
            Next::Send(op) => {
                let id = self.next_id;
                self.next_id += 1;
                self.stats.requests += 1;
                let role = match client.role {
                    Role::Admin => "admin",
                    Role::Traffic => "client",
                };
                self.log(&format!(
                    "c{c}({role}) -> n{} #{id} {}",
                    client.host,
                    op.describe()
                ));
                let payload = match op.request(id) {
                    Some(req) => Payload::Request(req),
                    None => Payload::Admin {
                        id,
                        admin: cairn_core::Admin::DevSetup {
                            root_token_id: None,
                        },
                    },
                };
                self.requests.insert(
                    id,
                    InFlight {
                        client: c,
                        op,
                        handled_at: None,
                    },
                );
                self.clients[c] = ClientState::Busy;
                self.send(Addr::Client(c), Addr::Host(client.host), payload);
            }
            Next::Sleep(d) => {
                self.clients[c] = ClientState::Waiting;
                self.schedule(d, Event::Wake(c));
            }
            Next::Idle => {
                self.clients[c] = ClientState::Idle;
                self.log(&format!("c{c} idle"));
            }
        }
    }

    fn deliver(&mut self, from: Addr, to: Addr, payload: Payload) -> Result<(), Violation> {
        match to {
            Addr::Host(h) => {
                let id = match &payload {
                    Payload::Request(r) => r.id,
                    Payload::Admin { id, .. } => *id,
                    _ => {
                        self.log(&format!("n{h} ignores an unexpected message from {from}"));
                        return Ok(());
                    }
                };
                if !self.hosts[h].is_up() {
                    self.log(&format!("n{h} is down: #{id} refused"));
                    self.send(
                        to,
                        from,
                        Payload::Refused {
                            id,
                            why: "connection refused".into(),
                        },
                    );
                    return Ok(());
                }
                if let Some(f) = self.requests.get_mut(&id) {
                    f.handled_at = Some(self.now);
                }
                let sealed = self.hosts[h].node().is_some_and(|n| n.is_sealed());
                self.log(&format!(
                    "n{h} handles #{id}{}",
                    if sealed { " (sealed)" } else { "" }
                ));
                let now = self.now;
                if let Payload::Request(req) = &payload {
                    if self.read_beside(h, req)? {
                        return Ok(());
                    }
                }
                let host = &mut self.hosts[h];
                match payload {
                    Payload::Request(req) => host.handle(now, Input::Request(req)),
                    Payload::Admin { id, admin } => {
                        host.handle(now, Input::Admin { id, cmd: admin });
                    }
                    _ => {}
                }
                self.drain(h);
                self.schedule_commit(h)
            }
            Addr::Client(c) => {
                let (id, reply) = match payload {
                    Payload::Response(r) => (r.id, Reply::Response(r)),
                    Payload::AdminDone { id, result } => (id, Reply::Admin(result)),
                    Payload::Refused { id, .. } => (id, Reply::Lost),
                    _ => {
                        self.log(&format!("c{c} ignores an unexpected message from {from}"));
                        return Ok(());
                    }
                };
                let Some(f) = self.requests.remove(&id) else {
                    self.log(&format!("c{c} got an answer to unknown #{id}"));
                    return Ok(());
                };
                let summary = match &reply {
                    Reply::Response(r) => format!("{}", r.status),
                    Reply::Admin(_) => "admin done".into(),
                    Reply::Lost => {
                        self.stats.lost_requests += 1;
                        "no answer (connection reset or refused)".into()
                    }
                };
                self.log(&format!("c{c} <- #{id} {summary}"));
                let think = self.operator.on_reply(f.client, &f.op, &reply);
                self.clients[c] = ClientState::Waiting;
                self.schedule(think, Event::Wake(c));
                Ok(())
            }
        }
    }

    /// Half of the reads a node gets are first offered to a reader beside it, as the
    /// shell's API threads do: one it answers (from the committed storage, under the view
    /// of the node's last batch) goes straight back to the client, judged by the checker
    /// like any answer. True when it was answered there.
    fn read_beside(&mut self, h: HostId, req: &cairn_core::Request) -> Result<bool, Violation> {
        if !matches!(
            req.method,
            cairn_core::api::Method::Get | cairn_core::api::Method::List
        ) || !self.beside.chance(500)
        {
            return Ok(false);
        }
        let Some(resp) = self.hosts[h].read_beside(self.now, req) else {
            return Ok(false);
        };
        let id = resp.id;
        let Some(f) = self.requests.get(&id).cloned() else {
            return Ok(false);
        };
        self.log(&format!(
            "n{h} answers #{id} beside the node: {}",
            resp.status
        ));
        self.checker.note("read-beside");
        self.checker
            .observe(h, &f.op, self.now, Observed::Response(&resp))
            .map_err(|v| with_request(v, id, self.now))?;
        self.send(
            Addr::Host(h),
            Addr::Client(f.client),
            Payload::Response(resp),
        );
        Ok(true)
    }

    /// Power loss on host `h`: the node and its uncommitted batch vanish.
    fn crash(&mut self, h: HostId) -> Result<(), Violation> {
        self.stats.crashes += 1;
        let Some((info, held)) = self.hosts[h].crash() else {
            return Ok(());
        };
        let dropped: Vec<RequestId> = held.iter().filter_map(answer_id).collect();
        let fault = info
            .fault_reverted
            .as_ref()
            .map(|k| format!(" [planted fault reverted {k}]"))
            .unwrap_or_default();
        self.log(&format!(
            "n{h} CRASH dropped sets={} keys={} answers={:?}{fault}",
            info.dropped_write_sets, info.dropped_keys, dropped
        ));
        self.checker.on_crash(h);
        if let Some(durable) = self.hosts[h].storage() {
            let now = self.now;
            let summary = self.checker.inspect(h, durable, now)?;
            self.log(&format!("n{h} inspection: {summary}"));
        }
        for id in dropped {
            if let Some(f) = self.requests.get(&id) {
                let c = f.client;
                self.send(
                    Addr::Host(h),
                    Addr::Client(c),
                    Payload::Refused {
                        id,
                        why: "connection reset".into(),
                    },
                );
            }
        }
        let d = self.faults.delay(self.params.downtime_mean_ms).max(1);
        self.schedule(d, Event::Restart(h));
        Ok(())
    }
}

/// Group commit in the fast tier: answers are held; an audit device's file probe is
/// answered at once as opened (the tier has no files: the request that enables the device
/// gets its answer, and nobody is left waiting); anything else is noted in the trace. A
/// batch commits after a seeded window or when full, and its answers go to the checker
/// first, then onto the network.
impl GroupCommit for World {
    fn host_mut(&mut self, h: HostId) -> &mut Host {
        &mut self.hosts[h]
    }

    fn sim_now(&self) -> u64 {
        self.now
    }

    fn faults(&mut self) -> &mut SimRng {
        &mut self.faults
    }

    fn batching(&self) -> Batching {
        Batching {
            window_ms: self.params.commit_window_ms,
            max_batch: Some(self.params.max_batch),
            crash_permille: (self.phase == Phase::Chaos)
                .then_some(self.params.crash_in_batch_permille),
        }
    }

    fn schedule_commit_at(&mut self, h: HostId, batch: u64, delay: u64) {
        self.schedule(delay, Event::Commit { host: h, batch });
    }

    fn schedule_crash_at(&mut self, h: HostId, delay: u64) {
        self.schedule(delay, Event::Crash(h));
    }

    fn sort(&self, o: &Output) -> Sort {
        match o {
            Output::Response(_) | Output::AdminDone { .. } => Sort::Hold,
            _ => Sort::Aside,
        }
    }

    fn drained(&mut self, h: HostId, aside: Vec<Output>, _held_from: usize) -> bool {
        let mut probes = Vec::new();
        for o in aside {
            let note = match o {
                Output::AuditProbe { id, file_path, .. } => {
                    probes.push(id);
                    format!("audit file {file_path} opened for #{id}")
                }
                // LDAP operations and anything newer: no directory or peers in this tier yet.
                o => format!("output not handled by the fast tier: {o:?}"),
            };
            self.log(&format!("n{h} {note}"));
        }
        let now = self.now;
        for &id in &probes {
            self.hosts[h].handle(now, Input::AuditProbed { id, result: Ok(()) });
        }
        !probes.is_empty()
    }

    fn committed(&mut self, h: HostId, info: &CommitInfo, held: &[Output]) {
        self.stats.commits += 1;
        let released: Vec<String> = held
            .iter()
            .filter_map(|o| match o {
                Output::Response(r) => Some(format!("#{}={} {}", r.id, r.status, brief(r))),
                Output::AdminDone { id, result } => Some(format!(
                    "#{id}=admin {}",
                    crate::trace::shorten(&format!("{result:?}"), 120)
                )),
                _ => None,
            })
            .collect();
        self.log(&format!(
            "n{h} commit sets={} keys={} release [{}]",
            info.write_sets,
            info.keys,
            released.join(", ")
        ));
    }

    fn release_held(&mut self, h: HostId, o: Output) -> Result<(), Violation> {
        let Some(id) = answer_id(&o) else {
            return Ok(());
        };
        let Some(f) = self.requests.get(&id).cloned() else {
            return Ok(());
        };
        let at = f.handled_at.unwrap_or(self.now);
        let observed = match &o {
            Output::Response(r) => Observed::Response(r),
            Output::AdminDone { result, .. } => Observed::Admin(result),
            _ => return Ok(()),
        };
        self.checker
            .observe(h, &f.op, at, observed)
            .map_err(|v| with_request(v, id, at))?;
        let payload = match o {
            Output::AdminDone { id, result } => Payload::AdminDone { id, result },
            Output::Response(r) => Payload::Response(r),
            _ => return Ok(()),
        };
        self.send(Addr::Host(h), Addr::Client(f.client), payload);
        Ok(())
    }
}

/// The request a held answer belongs to.
fn answer_id(o: &Output) -> Option<RequestId> {
    match o {
        Output::Response(r) => Some(r.id),
        Output::AdminDone { id, .. } => Some(*id),
        _ => None,
    }
}

fn with_request(mut v: Violation, id: RequestId, at: u64) -> Violation {
    v.detail = format!(
        "request #{id} handled at {}.{:03}s: {}",
        at / 1000,
        at % 1000,
        v.detail
    );
    v
}

/// A response body in a few characters for the trace.
fn brief(r: &Response) -> String {
    match &r.body {
        None => String::new(),
        Some(b) => crate::trace::shorten(&b.to_string(), 160),
    }
}
