//! The core thread: owns the `Node` and its storage (SQLite or PostgreSQL:
//! [`ShellStorage`]), drains a channel of inputs in batches, runs each batch inside one
//! storage transaction (group commit), and releases the batch's responses only after the
//! commit and the sync thread made it durable (SQLite: `fdatasync`; PostgreSQL: a flush
//! barrier), so an acknowledged write is durable while the next batch runs. Answers
//! find their callers by id (requests by theirs, peer messages and admin commands by one
//! the loop gives them); a batch that does not commit answers everyone with its error.
//! Timers come from `poll_timeout`; LDAP operations go to the LDAP pool.

use crate::storage::ShellStorage;
use cairn_core::admin::{Admin, AdminAnswer, AdminId};
use cairn_core::api::{ApiError, RequestId, Response};
use cairn_core::replication::PeerAnswer;
use cairn_core::storage::StorageError;
use cairn_core::{Input, Node, NodeConfig, Output};
use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Largest number of inputs grouped into one commit.
const MAX_BATCH: usize = 512;

pub enum Msg {
    /// An API request and where to send its response.
    Request(cairn_core::Request, SyncSender<Response>),
    /// Any other input (LDAP results).
    Input(Input),
    /// An admin command and where to send its answer.
    Admin(Admin, SyncSender<AdminAnswer>),
    /// A message from a peer's cluster connection and where to send the answer.
    Peer(
        cairn_core::replication::PeerMsg,
        SyncSender<cairn_core::replication::PeerAnswer>,
    ),
}

/// A handle to the core thread.
#[derive(Clone)]
pub struct Core {
    tx: Sender<Msg>,
    /// Readers that answer KV reads on the API thread (an SQLite database on disk).
    reads: Option<std::sync::Arc<crate::reads::Readers>>,
    /// A standby's route to the active node, as the node last published it: API requests
    /// are forwarded along it from the worker thread ([`crate::ha::Route`]).
    route: crate::ha::RouteSlot,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Core {
    /// A handle over a channel nobody serves (tests of the listeners' refusals).
    #[cfg(test)]
    pub fn from_sender(tx: Sender<Msg>) -> Core {
        Core {
            tx,
            reads: None,
            route: Default::default(),
        }
    }

    /// Starts the core thread, with the leadership lease on PostgreSQL when the node is one
    /// of an HA cluster.
    #[allow(clippy::expect_used)] // at start-up: without its core thread there is no server
    pub fn start_with(
        storage: ShellStorage,
        config: NodeConfig,
        ldap_threads: usize,
        lease: Option<LeaseSpec>,
    ) -> Result<Core, String> {
        let (tx, rx) = mpsc::channel::<Msg>();
        let lease = match lease {
            Some(l) => Some(crate::ha::LeaseWorker::start(
                &l.settings,
                l.identity,
                l.ttl,
                tx.clone(),
            )?),
            None => None,
        };
        let ldap_tx = tx.clone();
        let pool = crate::ldap::LdapPool::new(
            ldap_threads,
            Box::new(move |reply| {
                let _ = ldap_tx.send(Msg::Input(Input::Ldap(reply)));
            }),
        );
        let reads = storage
            .sqlite_file()
            .map(|db| std::sync::Arc::new(crate::reads::Readers::new(&db)));
        let mut seed = [0u8; 32];
        rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut seed);
        let mut node = Node::new(storage, seed, config);
        node.set_batched(true);
        node.set_snapshot_offload(true);
        let route = crate::ha::RouteSlot::default();
        std::thread::Builder::new()
            .name("cairn-core".into())
            .spawn({
                let tx = tx.clone();
                let route = route.clone();
                let reads = reads.clone();
                move || run(node, rx, tx, pool, lease, route, reads)
            })
            .expect("spawn core thread");
        Ok(Core { tx, reads, route })
    }

    /// Answers an API request: a standby with a route to the active node forwards it from
    /// this thread ([`crate::ha::forward_direct`]); anything else goes to the core thread.
    pub fn api_request(&self, req: cairn_core::Request) -> Response {
        match self.route.get() {
            Some(route) => crate::ha::forward_direct(&route, req, self),
            None => match self.reads.as_ref().and_then(|r| r.answer(&req)) {
                Some(resp) => resp,
                None => self.request(req),
            },
        }
    }

    /// Whether this node forwards API requests to the active node from the thread that
    /// read them (a standby with a route).
    pub fn forwards(&self) -> bool {
        self.route.get().is_some()
    }

    /// Hands the core an input that needs no answer.
    pub fn input(&self, input: Input) {
        let _ = self.tx.send(Msg::Input(input));
    }

    /// Sends a request and waits for its response.
    pub fn request(&self, req: cairn_core::Request) -> Response {
        let id = req.id;
        let (tx, rx) = mpsc::sync_channel(1);
        if self.tx.send(Msg::Request(req, tx)).is_err() {
            return Response::error(id, &ApiError::Unavailable("server is shutting down".into()));
        }
        rx.recv()
            .unwrap_or_else(|_| Response::error(id, &ApiError::Internal("core stopped".into())))
    }

    /// Hands a peer message to the core and waits for the answer (a long poll may wait).
    pub fn peer(
        &self,
        msg: cairn_core::replication::PeerMsg,
    ) -> cairn_core::replication::PeerAnswer {
        use cairn_core::replication::PeerAnswer;
        let (tx, rx) = mpsc::sync_channel(1);
        let down = || PeerAnswer::Error {
            code: "unavailable".into(),
            message: "the server is shutting down".into(),
        };
        if self.tx.send(Msg::Peer(msg, tx)).is_err() {
            return down();
        }
        rx.recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| down())
    }

    /// Runs an admin command and waits for its answer.
    pub fn admin(&self, cmd: Admin) -> AdminAnswer {
        let (tx, rx) = mpsc::sync_channel(1);
        if self.tx.send(Msg::Admin(cmd, tx)).is_err() {
            return Err(ApiError::Unavailable("server is shutting down".into()));
        }
        rx.recv()
            .unwrap_or_else(|_| Err(ApiError::Internal("core stopped".into())))
    }
}

/// The leadership lease of an HA node: where, as whom, for how long.
pub struct LeaseSpec {
    pub settings: crate::postgres::PgSettings,
    pub identity: crate::ha::Identity,
    pub ttl: Duration,
}

fn run(
    mut node: Node<ShellStorage>,
    rx: Receiver<Msg>,
    tx: Sender<Msg>,
    pool: crate::ldap::LdapPool,
    lease: Option<crate::ha::LeaseWorker>,
    route: crate::ha::RouteSlot,
    reads: Option<std::sync::Arc<crate::reads::Readers>>,
) {
    // Dropped when this thread ends, by a panic too: readers stop answering with it.
    let _withdraw = crate::reads::Withdraw(reads.clone());
    // Held until this function returns: the checkpoint thread stops when it is dropped.
    let _checkpoints = match node.storage_mut().checkpointer() {
        Ok(Some(c)) => Some(start_checkpoints(c)),
        Ok(None) => None,
        Err(e) => {
            log::warn!("checkpoints stay on the core thread: {e}");
            None
        }
    };
    let syncer = Syncer::start(
        node.storage_mut().wal_sync(),
        node.storage_mut().pg_flush(),
        tx.clone(),
        reads.clone(),
    );
    let mut waiting = Waiting::default();
    let mut last_tick = 0;
    // Inputs received but left for the next batch (a snapshot save ended the last one).
    let mut carried: Vec<Msg> = Vec::new();
    loop {
        let now = now_ms();
        let deadline = node.poll_timeout();
        let first = if deadline <= now || !carried.is_empty() {
            None
        } else {
            match rx.recv_timeout(Duration::from_millis(deadline - now)) {
                Ok(m) => Some(m),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        };
        let mut batch: Vec<Msg> = std::mem::take(&mut carried);
        batch.extend(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(m) => batch.push(m),
                Err(_) => break,
            }
        }
        if let Err(e) = node.storage_mut().begin() {
            log::error!("cannot open a storage transaction: {e}");
        }
        // Reads answered beside the core since the last batch count before this one's
        // requests (a `sys/metrics` in it sees them).
        if let Some(r) = &reads {
            node.count_answered(r.take_answered());
        }
        prefetch(&mut node, &batch);
        let mut ids_in_batch = Vec::new();
        let mut held: Vec<Output> = Vec::new();
        let mut audit_lines: Vec<(String, u32, String)> = Vec::new();
        let mut best_effort: Vec<(String, u32, String)> = Vec::new();
        let now = now_ms();
        // The node's clock never goes back from a time it was given: nor do the readers'.
        if let Some(r) = &reads {
            r.advance_clock(now);
        }
        // Requests come first: while they keep arriving, the node's timers and background
        // work (a reindex steps on every tick when it runs unpaced) get one tick per
        // millisecond; when none is waiting, a tick per round.
        let requests = batch.iter().any(|m| matches!(m, Msg::Request(..)));
        if node.poll_timeout() <= now && (!requests || last_tick < now) {
            node.handle(now, Input::Tick);
            last_tick = now;
        }
        // A snapshot save ends the batch at its input: the file holds the storage as this
        // batch's commit leaves it, so no later input may write in it.
        let mut saves: Vec<cairn_core::SnapshotSave> = Vec::new();
        // The readers' count of commits that wrote, once this batch's commit is in.
        let mut commits = 0;
        let mut msgs = batch.into_iter();
        while let Some(m) = msgs.next() {
            match m {
                Msg::Request(req, tx) => {
                    ids_in_batch.push(req.id);
                    waiting.requests.insert(req.id, tx);
                    node.handle(now, Input::Request(req));
                }
                Msg::Input(i) => node.handle(now, i),
                Msg::Admin(cmd, tx) => {
                    let id = waiting.admin(tx);
                    node.handle(now, Input::Admin { id, cmd });
                }
                Msg::Peer(msg, ptx) => {
                    let id = waiting.peer(ptx);
                    node.handle(
                        now,
                        Input::PeerRequest(cairn_core::replication::PeerRequest { id, msg }),
                    );
                }
            }
            // LDAP calls depend on nothing this batch writes (a login's state is in
            // memory): start them now instead of after the commit's fsync, which every
            // step of a login would otherwise wait for. Everything else waits as before.
            while let Some(out) = node.poll_output() {
                match out {
                    Output::Ldap(call) => pool.submit(call),
                    Output::Audit {
                        file_path,
                        mode,
                        line,
                        required: true,
                    } => audit_lines.push((file_path, mode, line)),
                    Output::Audit {
                        file_path,
                        mode,
                        line,
                        required: false,
                    } => best_effort.push((file_path, mode, line)),
                    Output::SnapshotSave(save) => saves.push(save),
                    other => held.push(other),
                }
            }
            if !saves.is_empty() {
                carried.extend(msgs.by_ref());
            }
        }
        // Held pulls get the whole batch's WAL entries in one answer.
        node.end_batch(now);
        // Audit lines reach their files before the commit; if they cannot, nothing of the
        // batch is committed (fail closed), and the node reloads what it derived from the
        // batch's writes (Merkle trees, WAL position) from storage.
        // Lines of the routes that remove or repair a device are written where they can be.
        if let Err(e) = crate::audit_file::append(&best_effort) {
            log::warn!("best-effort audit line not written: {e}");
        }
        let committed: Result<bool, BatchFailed> = match crate::audit_file::append(&audit_lines) {
            Err(e) => {
                node.storage_mut().rollback();
                node.storage_rolled_back();
                node.audit_device_failed(now, &e.file_path, &e.error);
                Err(BatchFailed::Audit(e.to_string()))
            }
            Ok(()) => {
                // The batch commits under the node's fence (HA: the lease epoch it ran under,
                // checked by the database in the commit's own transaction).
                let fence = node.fence();
                // Readers beside the core: a view this batch changes is withdrawn before
                // its commit, and the commit is bracketed on their clock.
                let writes = node.storage_mut().has_uncommitted_writes();
                if let Some(r) = &reads {
                    if r.view() != node.read_view() {
                        r.set_view(None);
                    }
                    if writes {
                        r.clock.begin_commit();
                    }
                }
                let storage = node.storage_mut();
                let res = storage
                    .set_fence_mode(fence)
                    .and_then(|()| storage.commit_unsynced())
                    .map_err(BatchFailed::Storage);
                if let (Some(r), true) = (&reads, writes) {
                    commits = r.clock.end_commit(matches!(res, Ok(true)));
                }
                res
            }
        };
        if let Err(BatchFailed::Storage(e)) = &committed {
            // Nothing of the batch is stored (a lost SQLite batch is handled below): the node
            // reloads what it derived from the batch's writes, as after a rollback.
            node.storage_rolled_back();
            // Fenced off: another node holds the lease; this one steps down now.
            if let StorageError::Fenced {
                held: Some(_),
                current,
            } = e
            {
                node.fenced_off(now, *current);
            }
        }
        if let Err(e) = &committed {
            log::error!(
                "batch commit failed, {} requests answered with errors: {e}",
                ids_in_batch.len()
            );
        }
        start_saves(&mut node, saves, committed.as_ref().err(), &tx);
        let failed = committed.as_ref().err();
        let mut out = Vec::new();
        let mut role: Option<Option<u64>> = None;
        let released = held
            .into_iter()
            .chain(std::iter::from_fn(|| node.poll_output()));
        for o in released {
            match o {
                Output::Response(r) => out.extend(waiting.response(r, failed)),
                Output::Ldap(call) => pool.submit(call),
                // A call to the primary leaves at once, without waiting for the sync: what
                // it tells (a secondary's WAL position, a Merkle question) only repeats
                // after a crash, from the position on disk, which is at or before it. So a
                // secondary asks for the next entries while the last ones reach its disk.
                Output::PeerSend(s) => crate::cluster::send_peer(s, tx.clone()),
                Output::AdminDone { id, result } => {
                    out.extend(waiting.admin_done(id, result, failed))
                }
                Output::PeerResponse(r) => out.extend(waiting.peer_response(r, failed)),
                Output::Lease(op) => {
                    if let Some(w) = &lease {
                        w.submit(op);
                    }
                }
                Output::Forward(f) => crate::ha::forward(f, tx.clone()),
                Output::ForwardRoute(r) => route.set(r),
                Output::HaRole(r) => role = Some(r),
                other => out.push(Delivery::Effect(other)),
            }
        }
        if let Some(r) = role {
            // The active node is the only writer: it may cache reads (starting empty); a
            // standby reads what the active wrote.
            if let Some(pg) = node.storage_mut().postgres() {
                pg.set_read_cache(r.is_some());
            }
        }
        let tickets = node.storage_mut().take_tickets();
        syncer.release(committed.unwrap_or(false), tickets, out, commits);
        if node.storage_mut().take_lost_batch() {
            // The node's memory (Merkle trees, WAL position) holds a batch that is not on
            // disk: carrying on would persist Merkle pages that disagree with the data.
            // Start over from what is on disk; the node comes back sealed.
            log::error!(
                "a committed-in-memory batch could not be written (disk full?); dropping the \
                 node's in-memory state: the server is sealed until it is unsealed again"
            );
            let config = node.config().clone();
            let storage = node.into_storage();
            let mut seed = [0u8; 32];
            rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut seed);
            node = Node::new(storage, seed, config);
            node.set_batched(true);
            node.set_snapshot_offload(true);
            waiting.fail_all(&ApiError::Unavailable(
                "the server was reset after a storage failure".into(),
            ));
        }
        if let Some(r) = &reads {
            let view = node.read_view();
            if r.view() != view {
                r.set_view(view);
            }
        }
    }
}

/// Starts the snapshot saves a batch asked for, right after its commit and before the next
/// batch writes: each one reads the storage as that commit left it, on a connection of its
/// own and a thread of its own ([`crate::snapshot_read`]), and comes back to the core as
/// [`Input::SnapshotSaved`]. A batch that did not commit answers its saves with its error.
fn start_saves(
    node: &mut Node<ShellStorage>,
    saves: Vec<cairn_core::SnapshotSave>,
    failed: Option<&BatchFailed>,
    tx: &Sender<Msg>,
) {
    for save in saves {
        let id = save.id;
        let result = match failed {
            Some(f) => Err(StorageError::Io(format!(
                "the batch holding the snapshot point was not committed: {f}"
            ))),
            None => match node.storage_mut().pinned_read() {
                Ok(Some(read)) => {
                    crate::snapshot_read::spawn(read, save, tx.clone());
                    continue;
                }
                // No second connection sees an in-memory database: written here.
                Ok(None) => crate::snapshot_read::write(node.storage_mut(), save),
                Err(e) => Err(e),
            },
        };
        let _ = tx.send(Msg::Input(Input::SnapshotSaved { id, result }));
    }
}

/// Why a batch was not committed; every answer of the batch reports it.
#[derive(Debug)]
enum BatchFailed {
    /// A required audit line could not be written (fail closed).
    Audit(String),
    /// The storage refused the commit.
    Storage(StorageError),
}

impl BatchFailed {
    /// The error the batch's requests and admin commands are answered with: the storage
    /// error's kind chooses the status (a full disk is 507).
    fn api_error(&self) -> ApiError {
        match self {
            BatchFailed::Audit(_) => ApiError::Internal(self.to_string()),
            BatchFailed::Storage(e) => ApiError::from(e.clone()),
        }
    }
}

impl std::fmt::Display for BatchFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BatchFailed::Audit(e) => write!(f, "audit device failed: {e}"),
            BatchFailed::Storage(e) => write!(f, "{e}"),
        }
    }
}

/// Who waits for which answer: requests by their id; peer messages and admin commands by
/// an id given here, which the node's answer carries back.
#[derive(Default)]
struct Waiting {
    requests: BTreeMap<RequestId, SyncSender<Response>>,
    peers: BTreeMap<u64, SyncSender<PeerAnswer>>,
    admin: BTreeMap<AdminId, SyncSender<AdminAnswer>>,
    /// The last id given to a peer message or an admin command.
    last_id: u64,
}

impl Waiting {
    fn next_id(&mut self) -> u64 {
        self.last_id += 1;
        self.last_id
    }

    /// Registers the caller of a peer message; its id for the node.
    fn peer(&mut self, tx: SyncSender<PeerAnswer>) -> u64 {
        let id = self.next_id();
        self.peers.insert(id, tx);
        id
    }

    /// Registers the caller of an admin command; its id for the node.
    fn admin(&mut self, tx: SyncSender<AdminAnswer>) -> AdminId {
        let id = self.next_id();
        self.admin.insert(id, tx);
        id
    }

    /// The delivery of a response to its caller (`failed`: the batch did not commit).
    fn response(&mut self, r: Response, failed: Option<&BatchFailed>) -> Option<Delivery> {
        let r = match failed {
            Some(e) => Response::error(r.id, &e.api_error()),
            None => r,
        };
        let tx = self.requests.remove(&r.id)?;
        Some(Delivery::Response(tx, r))
    }

    /// The delivery of admin command `id`'s answer to its caller (`failed`: the batch did
    /// not commit).
    fn admin_done(
        &mut self,
        id: AdminId,
        result: AdminAnswer,
        failed: Option<&BatchFailed>,
    ) -> Option<Delivery> {
        let tx = self.admin.remove(&id)?;
        let result = match failed {
            Some(e) => Err(e.api_error()),
            None => result,
        };
        Some(Delivery::Admin(tx, result))
    }

    /// The delivery of a peer answer to its caller (`failed`: the batch did not commit).
    fn peer_response(
        &mut self,
        r: cairn_core::replication::PeerResponse,
        failed: Option<&BatchFailed>,
    ) -> Option<Delivery> {
        let tx = self.peers.remove(&r.id)?;
        let msg = match failed {
            None => r.msg,
            Some(e) => PeerAnswer::Error {
                code: "internal".into(),
                message: e.to_string(),
            },
        };
        Some(Delivery::Peer(tx, msg))
    }

    /// Answers everyone still waiting with `e` (the node was reset).
    fn fail_all(&mut self, e: &ApiError) {
        for (id, tx) in std::mem::take(&mut self.requests) {
            let _ = tx.send(Response::error(id, e));
        }
        for (_, tx) in std::mem::take(&mut self.peers) {
            let _ = tx.send(PeerAnswer::Error {
                code: "unavailable".into(),
                message: e.to_string(),
            });
        }
        for (_, tx) in std::mem::take(&mut self.admin) {
            let _ = tx.send(Err(e.clone()));
        }
    }
}

/// What a batch lets out once it is durable: answers and side effects, in output order.
enum Delivery {
    Response(SyncSender<Response>, Response),
    Admin(SyncSender<AdminAnswer>, AdminAnswer),
    Peer(SyncSender<PeerAnswer>, PeerAnswer),
    /// Cluster calls, TLS material, audit lines of late outputs.
    Effect(Output),
}

impl Delivery {
    fn deliver(self, tx: &Sender<Msg>) {
        match self {
            Delivery::Response(s, r) => {
                let _ = s.send(r);
            }
            Delivery::Admin(s, a) => {
                let _ = s.send(a);
            }
            Delivery::Peer(s, a) => {
                let _ = s.send(a);
            }
            Delivery::Effect(o) => match o {
                Output::PeerSend(s) => crate::cluster::send_peer(s, tx.clone()),
                Output::HttpCall(c) => crate::cluster::http_call(c, tx.clone()),
                Output::ClusterTls(t) => crate::cluster::use_tls(t),
                Output::Audit {
                    file_path,
                    mode,
                    line,
                    ..
                } => {
                    if let Err(e) = crate::audit_file::append(&[(file_path, mode, line)]) {
                        log::error!("{e}");
                    }
                }
                Output::AuditProbe {
                    id,
                    file_path,
                    mode,
                } => {
                    let result = crate::audit_file::probe(&file_path, mode);
                    let _ = tx.send(Msg::Input(Input::AuditProbed { id, result }));
                }
                // Answers, LDAP calls and HA outputs are not effects (see `run`).
                Output::Lease(_)
                | Output::HaRole(_)
                | Output::Forward(_)
                | Output::ForwardRoute(_)
                | Output::SnapshotSave(_) => {}
                Output::Response(_)
                | Output::Ldap(_)
                | Output::AdminDone { .. }
                | Output::PeerResponse(_) => {}
            },
        }
    }
}

/// Starts the checkpoint thread: every [`CHECKPOINT_EVERY`] it checkpoints the WAL if one is
/// due (see `sqlite::Checkpointer::run_if_due`); it stops when the returned sender is dropped.
fn start_checkpoints(mut c: crate::sqlite::Checkpointer) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name("cairn-checkpoint".into())
        .spawn(move || loop {
            match rx.recv_timeout(CHECKPOINT_EVERY) {
                Err(RecvTimeoutError::Timeout) => c.run_if_due(),
                _ => return,
            }
        });
    if let Err(e) = spawned {
        log::error!("cannot start the checkpoint thread ({e}); the WAL grows to its backstop");
    }
    tx
}

/// How often the checkpoint thread looks at the WAL's size.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// A committed batch on its way to the sync thread.
struct Committed {
    /// The batch wrote something: its answers wait for a sync.
    wrote: bool,
    /// Readers beside the core: how many commits that wrote there were up to this one.
    commits: u64,
    /// PostgreSQL: its pipelined commits, which the flush barrier must confirm.
    tickets: Vec<crate::postgres::Ticket>,
    /// Its answers and side effects, in output order.
    out: Vec<Delivery>,
}

/// A batch's deliveries when it is not known durable: answers become `e`; side effects stay.
fn failed_deliveries(out: Vec<Delivery>, e: &ApiError) -> Vec<Delivery> {
    out.into_iter()
        .map(|d| match d {
            Delivery::Response(s, r) => Delivery::Response(s, Response::error(r.id, e)),
            Delivery::Admin(s, _) => Delivery::Admin(s, Err(e.clone())),
            Delivery::Peer(s, _) => Delivery::Peer(
                s,
                PeerAnswer::Error {
                    code: "internal".into(),
                    message: e.to_string(),
                },
            ),
            other => other,
        })
        .collect()
}

/// On PostgreSQL, reads the keys the batch's requests will read and write
/// ([`Node::prefetch_keys`]) in one round trip before the node handles them: each would
/// otherwise be a round trip of its own on the core thread (a KV write reads the value it
/// replaces).
fn prefetch(node: &mut Node<ShellStorage>, batch: &[Msg]) {
    if node.storage_mut().postgres().is_none() {
        return;
    }
    let keys: Vec<String> = batch
        .iter()
        .filter_map(|m| match m {
            Msg::Request(req, _) => Some(req),
            _ => None,
        })
        .flat_map(|req| node.prefetch_keys(req))
        .collect();
    if let Some(pg) = node.storage_mut().postgres() {
        pg.prefetch(&keys);
    }
}

/// The sync thread of the pipelined group commit: takes each committed batch's deliveries,
/// syncs the database once for all batches waiting (when any of them wrote), then delivers
/// them in commit order. The core thread meanwhile runs the next batch; a later batch may
/// read what an earlier one wrote before it is durable, but its answers leave after the
/// sync that covers both. PostgreSQL's sync is one flush barrier for the group; a batch it
/// does not confirm is answered with an error, and the core thread is woken (a tick) so that
/// its next commit, refused, makes the node reload its state from the database.
struct Syncer {
    tx: SyncSender<Committed>,
    /// Batches handed over and not yet delivered.
    pending: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    core_tx: Sender<Msg>,
}

impl Syncer {
    #[allow(clippy::expect_used)] // at start-up: without its sync thread nothing is acknowledged
    fn start(
        wal: Option<crate::sqlite::WalSync>,
        pg: Option<crate::postgres::PgFlush>,
        core_tx: Sender<Msg>,
        reads: Option<std::sync::Arc<crate::reads::Readers>>,
    ) -> Syncer {
        use std::sync::atomic::Ordering;
        let pending = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (tx, rx) = mpsc::sync_channel::<Committed>(MAX_BATCH);
        std::thread::Builder::new()
            .name("cairn-sync".into())
            .spawn({
                let (pending, core_tx) = (pending.clone(), core_tx.clone());
                let (mut wal, mut pg) = (wal, pg);
                move || {
                    while let Ok(first) = rx.recv() {
                        let mut group = vec![first];
                        while let Ok(more) = rx.try_recv() {
                            group.push(more);
                        }
                        if group.iter().any(|c| c.wrote) {
                            if let Some(w) = wal.as_mut() {
                                if let Err(e) = w.sync() {
                                    // Whether the batches reached the disk is unknown: answering
                                    // would risk acknowledging lost writes, and retrying the sync
                                    // cannot be trusted. Stop; a restart recovers from the disk.
                                    log::error!(
                                        "cannot sync the database ({e}); stopping the server so \
                                     that no write is acknowledged that may not be on disk"
                                    );
                                    std::process::abort();
                                }
                            }
                        }
                        // Readers may now answer from what these batches committed.
                        if let Some(r) = &reads {
                            r.clock
                                .synced(group.iter().map(|c| c.commits).max().unwrap_or(0));
                        }
                        let n = group.len();
                        let tickets: Vec<_> = group
                            .iter()
                            .flat_map(|c| c.tickets.iter().cloned())
                            .collect();
                        let mut verdicts = match pg.as_mut() {
                            Some(f) => f.confirm(&tickets).into_iter(),
                            None => Vec::new().into_iter(),
                        };
                        let mut lost = false;
                        for c in group {
                            let mut out = c.out;
                            let failed = c
                                .tickets
                                .iter()
                                .filter_map(|_| verdicts.next().and_then(Result::err))
                                .last();
                            if let Some(e) = failed {
                                log::error!(
                                    "a committed batch is not known durable, its answers are \
                                     errors: {e}"
                                );
                                lost = true;
                                out = failed_deliveries(out, &ApiError::Internal(e));
                            }
                            for d in out {
                                d.deliver(&core_tx);
                            }
                        }
                        if lost {
                            let _ = core_tx.send(Msg::Input(Input::Tick));
                        }
                        pending.fetch_sub(n, Ordering::AcqRel);
                    }
                }
            })
            .expect("spawn sync thread");
        Syncer {
            tx,
            pending,
            core_tx,
        }
    }

    /// Hands a committed batch over; a batch that wrote nothing, with nothing before it
    /// still waiting, is delivered at once.
    fn release(
        &self,
        wrote: bool,
        tickets: Vec<crate::postgres::Ticket>,
        out: Vec<Delivery>,
        commits: u64,
    ) {
        use std::sync::atomic::Ordering;
        let wrote = wrote || !tickets.is_empty();
        if out.is_empty() && !wrote {
            return;
        }
        let out = if wrote || self.pending.load(Ordering::Acquire) > 0 {
            self.pending.fetch_add(1, Ordering::AcqRel);
            match self.tx.send(Committed {
                wrote,
                commits,
                tickets,
                out,
            }) {
                Ok(()) => return,
                // The sync thread is gone (it stops the process when a sync fails): the
                // answers can only report failure.
                Err(mpsc::SendError(Committed { out, .. })) => {
                    self.pending.fetch_sub(1, Ordering::AcqRel);
                    log::error!(
                        "the sync thread is gone; the batch's writes are not known durable"
                    );
                    let e = ApiError::Internal("the storage sync thread stopped".into());
                    failed_deliveries(out, &e)
                }
            }
        } else {
            out
        };
        for d in out {
            d.deliver(&self.core_tx);
        }
    }
}

#[cfg(test)]
mod tests;
