//! The node: one server as a deterministic state machine.
//!
//! Everything that happens to a node is an [`Input`] given to [`Node::handle`] with the
//! current time; everything it wants done comes out of [`Node::poll_output`];
//! [`Node::poll_timeout`] says when it next wants a [`Input::Tick`]. Each input is one
//! atomic storage write set: a handler that fails leaves storage untouched.

/// The handler context of one input over a node's storage, barrier, RNG and clock. A macro
/// rather than a method so that the node's other fields (`self.st`) stay free to borrow
/// beside it.
macro_rules! node_ctx {
    ($n:expr) => {
        Ctx {
            txn: Txn::new(&$n.storage),
            barrier: &$n.barrier,
            rng: &mut $n.rng,
            now: $n.now,
        }
    };
}

pub(crate) mod head;
mod io;
pub use io::{Forward, Input, NodeConfig, Output};
mod seal_endpoints;
pub(crate) mod snapshot;
pub use snapshot::SnapshotSave;
pub mod standby;
mod to_primary;
pub use crate::admin::{Admin, AdminAnswer, AdminId, AdminResult, DevKeys};
use crate::api::{self, ApiError, ApiResult, Reply, Request, RequestId, Response};
use crate::auth::ldap::{self, Logins};
use crate::ctx::Ctx;
use crate::replication::{self, Env, PeerResponse};
use crate::router;
use crate::routes;
use crate::seal::Barrier;
use crate::storage::{Storage, Txn, WriteSet};
use crate::time::Millis;
use crate::token;
use crate::{crypto, wrapping};
use head::Head;
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};

/// A request whose answer waits for outside work (an LDAP login).
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub path: String,
    pub wrap_ttl: Option<u64>,
}

/// Node state that handlers may change besides storage.
#[derive(Clone)]
pub struct NodeState {
    pub config: NodeConfig,
    pub outputs: VecDeque<Output>,
    pub logins: Logins,
    pub(crate) pending: BTreeMap<RequestId, Pending>,
    pub seal_requested: bool,
    /// `sys/step-down` asked this active node to give up its lease after this input.
    pub step_down_requested: bool,
    /// Token (hash) whose use the current request spends, if it is use-limited.
    pub spend_use: Option<String>,
    /// Key shares of the unseal in progress.
    pub unseal_progress: crate::seal::ShareAttempt,
    /// The `sys/generate-root` attempt in progress.
    pub(crate) root_gen: Option<crate::generate_root::Attempt>,
    /// Replication roles, Merkle trees, WAL position and peer calls.
    pub repl: replication::Replication,
    /// Request counters and audit entries waiting for their response.
    pub obs: crate::metrics::Observability,
    /// Audit devices that failed lately and enables waiting for their file.
    pub audit: crate::audit::DeviceHealth,
    /// `secondary/enable` / `update-primary` requests whose encrypted activation token was
    /// decrypted locally; finished with the replication environment after the request.
    pub(crate) local_activations: Vec<replication::activation::LocalActivation>,
    /// Which node of the HA cluster is active (without HA: this one, always).
    pub ha: crate::ha::Ha,
    /// Requests forwarded to the active node, waiting for its answer.
    pub(crate) forwarded: BTreeMap<RequestId, ()>,
    /// A standby: the cluster CA it pins when it forwards and the client certificate it
    /// presents, as last read from storage (read once, not per request: a standby's storage
    /// reads go to the database). Dropped when a forward fails, the node's role changes or it
    /// is sealed, and read again.
    pub(crate) forward_ca: Option<(String, Option<crate::replication::tls::ClientCert>)>,
    /// The forward signing key, with what it was derived from (`standby::ForwardKey`).
    pub(crate) forward_key: Option<standby::ForwardKey>,
    /// What the forward route last published was derived from, and the route itself
    /// (`Output::ForwardRoute`; see `publish_route`).
    pub(crate) route_basis: Option<standby::RouteBasis>,
    pub(crate) route_sent: Option<crate::ha::route::ForwardRoute>,
    /// A standby: the sender id and the next sequence number of the forwards the node sends
    /// itself (the driver's have the route's own sender id: `crate::ha::replay`).
    pub(crate) forward_sender: String,
    pub(crate) forward_seq: u64,
    /// The active node: the forward stamps it has taken (`crate::ha::replay`).
    pub(crate) forwards_seen: crate::ha::replay::Seen,
    /// The stored keyring this node last found its barrier key reads data under (see
    /// `check_keyring`); forgotten when it seals.
    pub(crate) keyring_seen: Option<Vec<u8>>,
    /// A primary: requests its performance secondaries forwarded, running here under their
    /// own id, and the peer request each answers.
    pub(crate) peer_forwards: BTreeMap<RequestId, u64>,
    /// A snapshot save or restore the current request's handler decided on.
    pub(crate) snapshot_op: Option<snapshot::SnapshotOp>,
    /// The replication state a snapshot just taken captured (its answer's `X-Vault-Index`).
    pub(crate) snapshot_index: Option<String>,
    /// Saves the driver is writing ([`Output::SnapshotSave`]): request id to the
    /// `X-Vault-Index` of the point each file captures.
    pub(crate) snapshot_saves: BTreeMap<RequestId, Option<String>>,
    /// Snapshot files are written by the driver ([`Node::set_snapshot_offload`]).
    pub(crate) snapshot_offload: bool,
}

#[derive(Clone)]
pub struct Node<S: Storage> {
    storage: S,
    rng: ChaCha20Rng,
    barrier: Barrier,
    st: NodeState,
    now: Millis,
    last_tick: Millis,
}

impl<S: Storage> Node<S> {
    pub fn new(storage: S, seed: [u8; 32], config: NodeConfig) -> Self {
        let config_ha = config.ha.clone();
        Node {
            storage,
            rng: ChaCha20Rng::from_seed(seed),
            barrier: Barrier::default(),
            st: NodeState {
                config,
                outputs: VecDeque::new(),
                logins: Logins::default(),
                pending: BTreeMap::new(),
                seal_requested: false,
                step_down_requested: false,
                spend_use: None,
                unseal_progress: Default::default(),
                root_gen: None,
                repl: Default::default(),
                obs: Default::default(),
                audit: Default::default(),
                local_activations: Vec::new(),
                ha: crate::ha::Ha::new(config_ha),
                forwarded: BTreeMap::new(),
                forward_ca: None,
                forward_key: None,
                route_basis: None,
                route_sent: None,
                forward_sender: String::new(),
                forward_seq: 0,
                forwards_seen: Default::default(),
                keyring_seen: None,
                peer_forwards: BTreeMap::new(),
                snapshot_op: None,
                snapshot_index: None,
                snapshot_saves: BTreeMap::new(),
                snapshot_offload: false,
            },
            now: 0,
            last_tick: 0,
        }
    }

    pub fn storage(&self) -> &S {
        &self.storage
    }
    pub fn storage_mut(&mut self) -> &mut S {
        &mut self.storage
    }
    pub fn into_storage(self) -> S {
        self.storage
    }
    pub fn is_sealed(&self) -> bool {
        self.barrier.sealed()
    }
    pub fn config(&self) -> &NodeConfig {
        &self.st.config
    }
    #[cfg(test)]
    pub(crate) fn barrier_for_tests(&self) -> &Barrier {
        &self.barrier
    }
    /// The sizes of what the node keeps in memory per request, login, peer call or write
    /// (named), for tests that check they drain instead of growing with the traffic.
    #[cfg(test)]
    pub(crate) fn bookkeeping_for_tests(&self) -> Vec<(&'static str, usize)> {
        let st = &self.st;
        vec![
            ("outputs", st.outputs.len()),
            ("pending", st.pending.len()),
            ("logins", st.logins.len()),
            ("requests in flight", st.obs.inflight_len()),
            ("request counters", st.obs.requests.len()),
            ("login counters", st.obs.logins.len()),
            ("forwarded", st.forwarded.len()),
            ("peer forwards", st.peer_forwards.len()),
            ("snapshot saves", st.snapshot_saves.len()),
            ("local activations", st.local_activations.len()),
            ("peer calls", st.repl.calls.len()),
            ("held pulls", st.repl.waiters.len()),
            ("secondaries", st.repl.live.len()),
            ("deferred Merkle records", st.repl.deferred.len()),
        ]
    }

    /// The next thing the node wants done.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.st.outputs.pop_front()
    }

    /// When the node next wants a tick.
    pub fn poll_timeout(&self) -> Millis {
        let tick = self
            .last_tick
            .max(self.now.saturating_sub(self.st.config.tick_ms))
            + self.st.config.tick_ms;
        let repl = if self.st.ha.is_standby() {
            None
        } else {
            self.st
                .repl
                .next_wake(self.st.config.replication.scan_pace_ms)
        };
        [repl, self.st.ha.next_wake(!self.barrier.sealed())]
            .into_iter()
            .flatten()
            .fold(tick, Millis::min)
    }

    /// The stored keys `req` will read and then write, when its path tells them
    /// ([`router::prefetch_keys`]): a driver whose storage reads are round trips fetches a
    /// batch's keys at once before handing its inputs in. A hint; none while sealed or a
    /// standby (which forwards).
    pub fn prefetch_keys(&mut self, req: &Request) -> Vec<String> {
        if self.barrier.sealed() || self.st.ha.is_standby() {
            return Vec::new();
        }
        let mut ctx = node_ctx!(self);
        router::prefetch_keys(&mut ctx, req)
    }

    /// The condition under which the driver may commit the batch it is running: an
    /// active HA node commits only while the lease is still at its epoch (checked by the
    /// store in the commit's own transaction); a standby must not write at all.
    pub fn fence(&self) -> crate::ha::Fence {
        // A sealed node writes only its initialisation (any node of the cluster may be the
        // one initialised); it serves nothing else.
        if self.barrier.sealed() {
            return match self.st.ha.enabled() {
                true => crate::ha::Fence::Initialize,
                false => crate::ha::Fence::None,
            };
        }
        self.st.ha.fence()
    }

    /// What a reader beside the node needs to answer KV reads from committed storage
    /// ([`crate::reads`]), while nothing the node holds in memory changes such a read's
    /// answer: unsealed, not in an HA cluster, not a replication secondary, its replication
    /// roles loaded. `None` otherwise: every request then goes to the node. A driver asks
    /// after every batch and replaces its readers' view before it releases the batch's
    /// answers.
    pub fn read_view(&self) -> Option<crate::reads::ReadView> {
        let repl = &self.st.repl;
        if self.st.ha.enabled()
            || !repl.roles_loaded()
            || repl.is_perf_secondary()
            || repl.is_dr_secondary()
        {
            return None;
        }
        self.barrier.key().map(crate::reads::ReadView::new)
    }

    /// Counts requests that readers beside the node answered ([`crate::reads::answer`]),
    /// as if the node had answered them.
    pub fn count_answered(
        &mut self,
        answered: impl IntoIterator<Item = (crate::metrics::Answered, u64)>,
    ) {
        crate::metrics::count_answered(&mut self.st.obs, answered);
    }

    /// HA state (role, leader, nodes): for status, tests and the simulator's checkers.
    pub fn ha(&self) -> &crate::ha::Ha {
        &self.st.ha
    }

    /// The in-memory state, read-only (the isolation harness compares what its probes read).
    pub(crate) fn state(&self) -> &NodeState {
        &self.st
    }
    #[cfg(test)]
    pub(crate) fn state_mut_for_tests(&mut self) -> &mut NodeState {
        &mut self.st
    }

    /// The replication environment over this node's parts.
    fn env(&mut self) -> Env<'_> {
        Env {
            storage: &mut self.storage,
            barrier: &mut self.barrier,
            rng: &mut self.rng,
            st: replication::ReplIo::of(&mut self.st),
            now: self.now,
        }
    }

    /// The single place where a write set is applied: the replication commit hook (WAL,
    /// Merkle trees, role checks) around the storage write.
    fn commit(&mut self, ws: WriteSet) -> ApiResult<()> {
        replication::commit(&mut self.env(), ws, replication::Origin::Client)
    }

    /// The shell rolled back the storage transaction of a batch this node handled (an
    /// audit device failed, or a commit failed): in-memory state derived from those writes
    /// (Merkle trees, WAL position, roles) is reloaded from storage before the next input.
    pub fn storage_rolled_back(&mut self) {
        self.st.repl.forget_uncommitted();
    }

    /// Read-only view of replication state (status, tests, the simulator's checkers).
    pub fn replication(&self) -> &replication::Replication {
        &self.st.repl
    }

    /// Batched mode: the driver hands inputs over in batches (one storage transaction each)
    /// and calls [`Node::end_batch`] after each; held pulls are then answered once per batch
    /// with all of its WAL entries rather than after each write.
    pub fn set_batched(&mut self, on: bool) {
        self.st.repl.batched = on;
    }

    /// The end of a batch of inputs (batched mode): answers the held pulls that the batch's
    /// writes can serve. Outputs as from `handle`.
    pub fn end_batch(&mut self, now: Millis) {
        self.now = self.now.max(now);
        replication::end_batch(&mut self.env());
    }

    /// Handles one input at time `now`.
    pub fn handle(&mut self, now: Millis, input: Input) {
        self.now = self.now.max(now);
        let obs_from = self.st.outputs.len();
        // A standby's storage is written by the active node: it derives nothing from it.
        if !self.st.ha.is_standby() {
            if let Err(e) = replication::ensure_loaded(&mut self.env()) {
                log::error!("replication state not loaded: {e}");
            }
        }
        match input {
            Input::Request(req) if self.ha_forwards(&req) => self.forward(req),
            Input::Request(req) => match self.take_forward(&req) {
                Ok(()) => self.run_request(req),
                Err(e) => self.finish(req.id, Err(e)),
            },
            Input::Ldap(reply) => {
                let identity_local = self.st.repl.is_perf_secondary();
                let mut ctx = node_ctx!(self);
                let mut io = ldap::LdapIo {
                    identity_local,
                    logins: &mut self.st.logins,
                    outputs: &mut self.st.outputs,
                };
                let done = ldap::on_reply(&mut ctx, &mut io, reply);
                if let Some(ldap::Finished {
                    request_id: id,
                    result,
                    audit_note,
                }) = done
                {
                    // The login's writes and its response wrapping: one write set.
                    let pending = self.st.pending.remove(&id);
                    let result = match &pending {
                        Some(p) => result.and_then(|r| wrap_in(&mut ctx, r, &p.path, p.wrap_ttl)),
                        None => result,
                    };
                    let writes = ctx.txn.into_write_set();
                    let wal_before = self.st.repl.wal.last;
                    let result = result.and_then(|r| self.commit(writes).map(|_| r));
                    if pending.is_some() {
                        if let Some(note) = audit_note {
                            crate::metrics::note_for_audit(&mut self.st, id, note);
                        }
                        self.finish(id, result);
                        self.stamp_index(id, wal_before);
                    }
                }
            }
            Input::AuditProbed { id, result } => {
                let mut ctx = node_ctx!(self);
                let done = crate::audit::on_probed(&mut ctx, &mut self.st.audit, id, result);
                let writes = ctx.txn.into_write_set();
                if let Some(result) = done {
                    let wal_before = self.st.repl.wal.last;
                    let result = result.and_then(|r| self.commit(writes).map(|_| r));
                    if self.st.pending.remove(&id).is_some() {
                        self.finish(id, result);
                        self.stamp_index(id, wal_before);
                    }
                }
            }
            Input::Tick => {
                let (op, change) = self.st.ha.tick(self.now, !self.barrier.sealed());
                if let Some(c) = change {
                    self.ha_changed(c);
                }
                if let Some(op) = op {
                    self.st.outputs.push_back(Output::Lease(op));
                }
                // Replication and background scans may ask for earlier wake-ups; the
                // periodic work (token expiry) keeps its own pace.
                if self.now >= self.last_tick + self.st.config.tick_ms {
                    self.last_tick = self.now;
                    // A standby does no background work: the active does it.
                    if !self.st.ha.is_standby() {
                        self.tick();
                    }
                    // An active node whose cluster CA could not be made when it took over
                    // tries again.
                    if self.st.ha.epoch().is_some()
                        && !self.barrier.sealed()
                        && matches!(self.storage.get(crate::replication::tls::CA_KEY), Ok(None))
                    {
                        self.ensure_cluster_ca();
                    }
                }
            }
            Input::Admin {
                id,
                cmd: Admin::Shutdown,
            } => {
                let result = replication::flush_before_shutdown(&mut self.env())
                    .map(|()| AdminResult::Flushed);
                self.st.outputs.push_back(Output::AdminDone { id, result });
            }
            Input::Admin {
                id,
                cmd: Admin::DevSetup { root_token_id },
            } => {
                let result = self
                    .dev_setup(root_token_id)
                    .and_then(|v| DevKeys::from_init_body(&v))
                    .map(AdminResult::DevSetup);
                self.st.outputs.push_back(Output::AdminDone { id, result });
            }
            Input::PeerRequest(r) if self.st.ha.is_standby() => {
                // A standby of an HA primary cluster serves no replication: the secondary
                // moves on to the next address it knows of the cluster.
                let active = self
                    .st
                    .ha
                    .leader()
                    .map(|l| format!("; the active node is {}", l.cluster_addr))
                    .unwrap_or_default();
                self.st
                    .outputs
                    .push_back(Output::PeerResponse(PeerResponse {
                        id: r.id,
                        msg: replication::PeerAnswer::Error {
                            code: replication::STANDBY_CODE.into(),
                            message: format!("this node is a standby of its HA cluster{active}"),
                        },
                    }));
            }
            Input::PeerRequest(r)
                if matches!(r.msg.body, replication::PeerBody::Forward { .. }) =>
            {
                let peer = r.id;
                match replication::forward::admit(&mut self.env(), r) {
                    Ok(req) => {
                        self.st.peer_forwards.insert(req.id, peer);
                        self.run_request(req);
                    }
                    Err(msg) => self
                        .st
                        .outputs
                        .push_back(Output::PeerResponse(PeerResponse {
                            id: peer,
                            msg: *msg,
                        })),
                }
            }
            Input::PeerRequest(r) => replication::on_peer_request(&mut self.env(), r),
            Input::PeerReply(r) => {
                if let Some((id, to)) = replication::forward::take(&mut self.env(), r.call_id) {
                    self.answer_forwarded(replication::forward::client_answer(id, &to, r.result));
                } else {
                    let done = replication::on_peer_reply(&mut self.env(), r);
                    self.finish_pending(done);
                }
            }
            Input::HttpReply(r) => {
                let done = replication::on_http_reply(&mut self.env(), r);
                self.finish_pending(done);
            }
            Input::Lease(r) => {
                if let Some(c) = self.st.ha.on_result(self.now, r) {
                    self.ha_changed(c);
                }
                if self.st.ha.is_standby() {
                    self.check_keyring();
                }
            }
            Input::SnapshotSaved { id, result } => self.snapshot_saved(id, result),
            Input::Forwarded { id, result } => {
                if self.st.forwarded.remove(&id).is_some() {
                    let resp = match result {
                        Ok(mut r) => {
                            r.id = id;
                            r
                        }
                        Err(e) => {
                            self.st.ha.look_now(self.now);
                            self.st.forward_ca = None;
                            crate::ha::route::failed(id, &e)
                        }
                    };
                    self.answer_forwarded(resp);
                }
            }
            Input::ForwardFailed { reason } => {
                log::debug!("a forward along the route failed: {reason}; looking again");
                self.st.ha.look_now(self.now);
                self.st.forward_ca = None;
            }
        }
        if self.st.seal_requested {
            self.st.seal_requested = false;
            self.barrier.seal();
            self.st.forward_ca = None;
            // It holds a copy of the barrier key: zeroed with the barrier's.
            self.st.forward_key = None;
            self.st.keyring_seen = None;
            self.st.unseal_progress.clear();
            self.st.repl.refuse_waiters(
                &mut self.st.outputs,
                "sealed",
                "the primary was sealed while it held the pull",
            );
            self.st.repl.on_seal();
            if let Some(op) = self.st.ha.release(self.now) {
                self.st.outputs.push_back(Output::Lease(op));
                self.ha_changed(crate::ha::Change::BecameStandby {
                    reason: "the node was sealed".into(),
                });
            }
        }
        if std::mem::take(&mut self.st.step_down_requested) {
            if let Some(op) = self.st.ha.release(self.now) {
                self.st.outputs.push_back(Output::Lease(op));
                self.ha_changed(crate::ha::Change::BecameStandby {
                    reason: "an operator asked it to step down".into(),
                });
            }
        }
        if !self.st.ha.is_standby() {
            replication::poll(&mut self.env());
            let done = replication::poll_jobs(&mut self.env());
            self.finish_pending(done);
        }
        crate::metrics::after_input(
            &mut crate::metrics::ObsIo::of(&mut self.st),
            obs_from,
            self.now,
        );
        self.answer_secondaries(obs_from);
        self.publish_route();
    }

    /// A primary: the answers to requests its performance secondaries forwarded (counted and
    /// audited as any) go back to them as peer answers, released with the batch like the
    /// others, so a secondary hears of a write only once it is durable.
    fn answer_secondaries(&mut self, from: usize) {
        if self.st.peer_forwards.is_empty() {
            return;
        }
        for o in self.st.outputs.iter_mut().skip(from) {
            let Output::Response(r) = o else { continue };
            let Some(peer) = self.st.peer_forwards.remove(&r.id) else {
                continue;
            };
            let resp = std::mem::replace(r, Response::no_content(r.id));
            *o = Output::PeerResponse(PeerResponse {
                id: peer,
                msg: replication::forward::peer_answer(resp),
            });
        }
    }

    /// Runs one API request: its head, its accounting and audit, the request itself, its
    /// answer with the replication state it left (`X-Vault-Index`).
    fn run_request(&mut self, mut req: Request) {
        let id = req.id;
        let wal_before = self.st.repl.wal.last;
        // The head is read once; a bad one is refused after it is counted and
        // audited (as a request whose route is unknown: audit required).
        let head = Head::parse(&mut req);
        let mode = match &head {
            Ok(h) => routes::audit_of(&h.path),
            Err(_) => routes::Audit::Required,
        };
        let result = match (self.observe(&req, mode), head) {
            (Ok(()), Ok(head)) => self.request(req, head),
            (Err(e), _) | (Ok(()), Err(e)) => Err(e),
        };
        self.finish(id, result);
        self.stamp_index(id, wal_before);
        if !self.st.local_activations.is_empty() {
            for done in replication::activation::finish_local(&mut self.env()) {
                self.finish_pending(Some(done));
            }
        }
    }

    /// Counts a request and logs its audit request entry (as its route declares); refuses
    /// it when it must be audited and no device can record it.
    fn observe(&mut self, req: &Request, mode: routes::Audit) -> ApiResult<()> {
        let mut ctx = node_ctx!(self);
        crate::metrics::before_request(
            &mut ctx,
            &mut crate::metrics::ObsIo::of(&mut self.st),
            req,
            mode,
        )
    }

    /// The shell could not write a required audit line to `file_path` (it rolled the
    /// batch back): skip that device for [`crate::audit::RETRY_MS`]; while no device
    /// works, requests that must be audited are refused before they run.
    pub fn audit_device_failed(&mut self, now: Millis, file_path: &str, error: &str) {
        self.now = self.now.max(now);
        log::error!("audit device writing to {file_path} failed: {error}");
        self.st.audit.failed(file_path, error, self.now);
    }

    /// Answers a request that waited for replication work (its writes were committed by
    /// that work; a response wrapping asked for is its own write set).
    fn finish_pending(&mut self, done: Option<(RequestId, ApiResult)>) {
        if let Some((id, result)) = done {
            if let Some(p) = self.st.pending.remove(&id) {
                let result = match (result, p.wrap_ttl) {
                    (Ok(r), Some(ttl)) => {
                        let mut ctx = node_ctx!(self);
                        let r = wrap_in(&mut ctx, r, &p.path, Some(ttl));
                        let writes = ctx.txn.into_write_set();
                        r.and_then(|r| self.commit(writes).map(|_| r))
                    }
                    (r, _) => r,
                };
                self.finish(id, result);
            }
        }
    }

    fn tick(&mut self) {
        // A DR secondary's tokens are its primary's: they expire there and replicate.
        if self.barrier.sealed() || self.st.repl.is_dr_secondary() {
            return;
        }
        let mut ctx = node_ctx!(self);
        if token::expire(&mut ctx, 1000).is_ok() {
            let writes = ctx.txn.into_write_set();
            if !writes.is_empty() {
                if let Err(e) = self.commit(writes) {
                    log::error!("token expiry not applied: {e}");
                }
            }
        }
    }

    /// Puts the replication state (`X-Vault-Index`) into the successful answer to request
    /// `id` when the request appended to the WAL.
    fn stamp_index(&mut self, id: RequestId, wal_before: u64) {
        let state = match self.st.snapshot_index.take() {
            Some(s) => Some(s),
            None => replication::index_state::after_request(&self.st.repl, wal_before),
        };
        let Some(state) = state else {
            return;
        };
        let answer = self.st.outputs.iter_mut().rev().find_map(|o| match o {
            Output::Response(r) if r.id == id => Some(r),
            _ => None,
        });
        if let Some(r) = answer.filter(|r| r.status < 400) {
            r.index = Some(state);
        }
    }

    /// Puts the envelope around a handler's reply and queues the answer.
    fn finish(&mut self, id: RequestId, result: ApiResult) {
        let resp = match result {
            Err(e) => Response::error(id, &e),
            Ok(Reply::Pending) => return,
            Ok(Reply::Empty) => Response::no_content(id),
            Ok(Reply::Raw(status, v)) => Response::json(id, status, v),
            Ok(Reply::Text(status, ct, bytes)) => Response {
                id,
                status,
                body: None,
                raw: Some((ct, bytes)),
                index: None,
            },
            Ok(reply) => {
                let request_id = crypto::uuid(&mut self.rng);
                Response::json(id, 200, envelope_of(&request_id, reply))
            }
        };
        self.st.outputs.push_back(Output::Response(resp));
    }

    /// Runs a request whose head parsed ([`Head`]: `req` already carries the canonical
    /// path and method).
    fn request(&mut self, req: Request, head: Head) -> ApiResult {
        let Head {
            path,
            wrap_ttl: wrap,
            index,
        } = head;
        match routes::lookup_sys(&path).map(|r| r.handler) {
            Some(routes::Sys::Init) => return self.init(&req),
            Some(routes::Sys::Unseal) => return self.unseal(&req),
            // Reads only (`HEAD` is a `GET`), as in the reference: 405 for other methods.
            Some(routes::Sys::SealStatus | routes::Sys::Health)
                if req.method != api::Method::Get =>
            {
                return Err(ApiError::MethodNotAllowed)
            }
            Some(routes::Sys::SealStatus) => return self.seal_status(),
            Some(routes::Sys::Health) => return self.health(&req),
            _ => {}
        }
        if self.barrier.sealed() {
            return Err(ApiError::Sealed);
        }
        replication::gate_request(&self.st.repl, &req)?;
        if let Err(e) = replication::index_state::check(&self.st.repl, index.as_ref()) {
            // Not caught up: 412, unless the client asked to be sent on to the primary.
            return match req.forward_inconsistent && req.on_behalf.is_none() {
                // The primary's answer could not be wrapped here: never hand out in the
                // clear what the client asked to have wrapped.
                true if wrap.is_some() => Err(ApiError::bad(
                    "this performance secondary would send the request to its primary, and a \
                     forwarded answer cannot be response-wrapped here: send it without \
                     X-Vault-Wrap-TTL, or without X-Vault-Inconsistent to wait for this \
                     secondary to catch up",
                )),
                true => self.forward_inconsistent(req, e),
                false => Err(e),
            };
        }
        let mut ctx = node_ctx!(self);
        let routed = router::route(&mut ctx, &mut self.st, &req);
        // Taken at once: an error below must not leave it for a later request to run.
        let snapshot_op = self.st.snapshot_op.take();
        // A limited-use token spends one use on every request its policies were checked
        // for, whether they allowed it or not and whether or not the handler then
        // succeeds; on failure the spend is its own write set.
        let spend = self.st.spend_use.take();
        let reply = match routed {
            Ok(reply) => {
                if let Some(h) = &spend {
                    spend_use(&mut ctx, h)?;
                }
                reply
            }
            Err(e) => {
                drop(ctx);
                if let Some(h) = &spend {
                    let mut ctx = node_ctx!(self);
                    spend_use(&mut ctx, h)?;
                    let writes = ctx.txn.into_write_set();
                    self.commit(writes)?;
                }
                return Err(e);
            }
        };
        // The handler's writes, the spent use and the response wrapping: one write set.
        let reply = wrap_in(&mut ctx, reply, &path, wrap)?;
        let writes = ctx.txn.into_write_set();
        if !writes.is_empty() {
            if self.st.repl.is_perf_secondary() && self.writes_replicated(&writes)? {
                // Replicated data is the primary's to write: the request goes there.
                if wrap.is_some() {
                    // The use its policies were checked for is spent all the same (it was
                    // dropped with the write set).
                    self.spend(spend.as_deref())?;
                    return Err(ApiError::bad(
                        "this performance secondary forwards writes of replicated data to its \
                         primary, and a forwarded answer cannot be response-wrapped here: \
                         send the request without X-Vault-Wrap-TTL",
                    ));
                }
                return self.forward_to_primary(req, spend.as_deref());
            }
            if let Some(on) = &req.on_behalf {
                self.only_replicated(on, &writes)?;
            }
            self.commit(writes)?;
        }
        if let Some(op) = snapshot_op {
            return self.run_snapshot(req.id, op);
        }
        if let Reply::Pending = reply {
            self.st.pending.insert(
                req.id,
                Pending {
                    path,
                    wrap_ttl: wrap,
                },
            );
        }
        Ok(reply)
    }
}

impl Node<crate::storage::MemStorage> {
    /// A dev-mode node over in-memory storage (initialised with one key share, unsealed,
    /// `secret/` and `auth/ldap/` mounted) whose root token is `root`, set up at 1 s: the
    /// starting point of unit tests, fuzz harnesses and models.
    #[doc(hidden)]
    pub fn dev_in_memory(seed: [u8; 32], root: &str) -> Self {
        Node::dev_over(crate::storage::MemStorage::new(), seed, root)
    }
}

impl<S: Storage> Node<S> {
    /// [`Node::dev_in_memory`] over the (empty) `storage` given.
    #[doc(hidden)]
    pub fn dev_over(storage: S, seed: [u8; 32], root: &str) -> Self {
        let mut n = Node::new(storage, seed, NodeConfig::default());
        n.handle(
            1_000,
            Input::Admin {
                id: 0,
                cmd: Admin::DevSetup {
                    root_token_id: Some(root.to_string()),
                },
            },
        );
        while n.poll_output().is_some() {}
        n
    }
}

/// The standard envelope around a reply.
pub(crate) fn envelope_of(request_id: &str, reply: Reply) -> Value {
    let mut env = api::envelope(request_id, Value::Null);
    match reply {
        Reply::Data(d) => env["data"] = d,
        Reply::Envelope(Value::Object(m)) => {
            for (k, v) in m {
                env[k.as_str()] = v;
            }
            env["request_id"] = json!(request_id);
        }
        Reply::Wrapped(info) => env["wrap_info"] = info,
        _ => {}
    }
    env
}

/// With a wrap TTL, stores a reply that has a body under a new wrapping token in `ctx`'s
/// write set (the same as the handler's) and answers with its `wrap_info` instead.
fn wrap_in(ctx: &mut Ctx, reply: Reply, path: &str, ttl: Option<u64>) -> ApiResult<Reply> {
    match (ttl, reply) {
        (Some(ttl), r @ (Reply::Data(_) | Reply::Envelope(_))) => {
            let request_id = crypto::uuid(ctx.rng);
            let env = envelope_of(&request_id, r);
            Ok(Reply::Wrapped(wrapping::wrap(
                ctx,
                200,
                Some(env),
                path,
                ttl,
            )?))
        }
        (_, r) => Ok(r),
    }
}

/// Spends one use of a limited-use token (reloaded: the handler may have changed it).
fn spend_use(ctx: &mut Ctx, h: &str) -> ApiResult<()> {
    if let Some(mut e) = token::lookup_hash(ctx, h)? {
        token::use_once(ctx, h, &mut e)?;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
