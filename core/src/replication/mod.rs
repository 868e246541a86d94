//! Replication: performance and DR primaries and secondaries.
//!
//! * [`class`] — which keys replicate where (replicated / cluster-local / node-local).
//! * [`merkle`] — the replicated and local Merkle trees, updated on every write.
//! * [`wal`] — the primary's bounded write-ahead log.
//! * [`msg`] — the cluster protocol and the I/O envelopes the node exchanges with its driver.
//! * [`state`] — persisted roles, secondary records and the activation bundle.
//! * `api` — the `sys/replication/*` endpoints; `primary` serves secondaries; `secondary`
//!   is the pull state machine (connecting → merkle-diff → merkle-sync → stream-wals, idle).
//! * [`forward`] — requests a performance secondary sends to its primary (writes of
//!   replicated data; `X-Vault-Inconsistent: forward-active-node`) and the primary applies.
//! * [`reindex`] — background scans that rebuild (reindex) or verify (Merkle check) the trees.
//!
//! * `hooks` — the node's entry points: the commit hook, loading, polls, channel replies.
//!
//! Every write set a node applies goes through [`commit`] (the commit hook): it classifies
//! the keys, refuses writes a secondary must not make itself, updates the Merkle trees,
//! appends WAL entries on a primary, and applies everything as one storage write set.

pub mod activation;
mod api;
pub mod class;
pub mod dr_token;
pub mod filter;
pub mod forward;
mod hooks;
pub mod index_state;
pub mod merkle;
pub mod msg;
mod primary;
pub mod reindex;
mod secondary;
pub mod state;
mod subtree_scan;
pub mod tls;
pub mod version;
pub mod wal;

pub use hooks::*;
pub use msg::{
    HttpCall, HttpReply, PeerAnswer, PeerBody, PeerMsg, PeerReply, PeerRequest, PeerResponse,
    PeerSend,
};

use crate::api::{ApiError, ApiResult, Reply, Request, RequestId};
use crate::ctx::Ctx;
use crate::node::{NodeState, Output};
use crate::seal::Barrier;
use crate::storage::{Storage, Txn, Write, WriteSet};
use crate::time::Millis;
use class::Class;
use merkle::{TreeKind, Trees};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};
use state::{Role, RoleState};
use std::collections::{BTreeMap, BTreeSet};
use wal::WalEntry;

pub use api::handle;

/// A replication mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Performance,
    Dr,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Performance => "performance",
            Mode::Dr => "dr",
        }
    }
    fn parse(s: &str) -> Option<Mode> {
        match s {
            "performance" => Some(Mode::Performance),
            "dr" => Some(Mode::Dr),
            _ => None,
        }
    }
    fn role_key(self) -> String {
        format!("node/replication/{}", self.name())
    }
}

/// Replication settings fixed at start.
#[derive(Debug, Clone)]
pub struct ReplicationConfig {
    pub wal: wal::Limits,
    /// This node's API address (`http://host:port`), put into activation tokens.
    pub api_addr: String,
    /// This node's cluster address (`host:port`), the default advertised to secondaries.
    pub cluster_addr: String,
    /// Longest a primary holds a pull that has nothing to send (long poll).
    pub pull_wait_ms: u64,
    /// Most WAL entries per batch.
    pub batch_entries: u32,
    /// Least time between the starts of two WAL pulls of a streaming secondary, unless the
    /// last answer was a full batch (0: no least time). Each pull costs both sides a round
    /// trip, a commit and a Merkle update whatever it carries; a primary that commits many
    /// small batches a second to several secondaries spends its CPU, and theirs, on pulls.
    /// A gap of a few milliseconds bounds a secondary's pulls to a few hundred a second,
    /// each carrying what the primary committed meanwhile, for at most that much more lag,
    /// and only when writes come faster than one a gap: a pull the primary held until a
    /// write came (a quiet primary) is older than the gap when it is answered, and the next
    /// one leaves at once.
    pub pull_gap_ms: Millis,
    /// Most keys per Merkle sync fetch.
    pub fetch_batch: usize,
    /// Most of a secondary's own leaves one Merkle sync request carries (a window of its
    /// keys after the cursor; the primary answers for that range only).
    pub sync_window: usize,
    /// A peer not heard from for this long counts as disconnected.
    pub heartbeat_timeout_ms: u64,
    /// Keys read per step of a reindex or Merkle check (a step runs between requests).
    pub scan_chunk: usize,
    /// Least time between two steps of a reindex or Merkle check: 1 ms by default; 0 runs
    /// them back to back, one per round of the server's loop, between its request batches
    /// (the server's setting: a reindex then reads as fast as the storage gives keys while
    /// each request waits for one step at most).
    pub scan_pace_ms: Millis,
    /// Longest a changed Merkle record waits to be written ([`DEFER_MERKLE_MS`]; 0: at the
    /// end of the input that changed it).
    pub defer_merkle_ms: Millis,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        ReplicationConfig {
            wal: wal::Limits::default(),
            api_addr: String::new(),
            cluster_addr: String::new(),
            pull_wait_ms: 2_000,
            batch_entries: 512,
            pull_gap_ms: 0,
            fetch_batch: 512,
            sync_window: 16 * 1024,
            heartbeat_timeout_ms: 10_000,
            scan_chunk: 512,
            scan_pace_ms: 1,
            defer_merkle_ms: DEFER_MERKLE_MS,
        }
    }
}

/// Where a write set comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A client request, a login or a tick: refused where this node's role forbids it.
    Client,
    /// Replication bookkeeping and data received from a primary.
    Replication,
    /// Entries received from a DR primary, stored under the primary's WAL indices.
    DrStream,
}

/// One change to apply: a write, with its class and WAL index when they come from a primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub key: String,
    pub value: Option<Vec<u8>>,
    pub class: Option<Class>,
    pub index: Option<u64>,
    pub end: bool,
    /// A key created under a name drawn at random ([`crate::storage::Txn::put_new`]): an
    /// earlier value makes the commit fail.
    pub fresh: bool,
}

impl Change {
    pub fn write(key: String, value: Option<Vec<u8>>) -> Change {
        Change {
            key,
            value,
            class: None,
            index: None,
            end: false,
            fresh: false,
        }
    }
}

/// Secondary pull state (the status `state` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phase {
    #[default]
    Idle,
    Connecting,
    MerkleDiff,
    MerkleSync,
    /// Fetching the current values of the keys written after our position
    /// ([`msg::PeerAnswer::Changes`]).
    CatchUp,
    StreamWals,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Connecting => "connecting",
            Phase::MerkleDiff => "merkle-diff",
            Phase::MerkleSync => "merkle-sync",
            Phase::CatchUp => "catch-up",
            Phase::StreamWals => "stream-wals",
        }
    }
}

/// In-memory runtime of a secondary.
#[derive(Clone, Debug, Default)]
pub(crate) struct SecRt {
    pub phase: Phase,
    pub inflight: Option<u64>,
    pub next_at: Option<Millis>,
    /// When the last WAL pull was sent (the pull gap counts from it).
    pub pulled_at: Option<Millis>,
    pub last_heartbeat: Option<Millis>,
    pub last_error: String,
    /// The primary refused this secondary's version (its own is in `info.version`).
    pub version_refused: bool,
    pub failures: u32,
    pub info: msg::PrimaryInfo,
    /// Merkle diff/sync in progress: the primary's WAL index of the diff.
    pub base: u64,
    /// Buckets still to synchronise in the current Merkle sync, per subtree.
    pub asked: BTreeMap<msg::SubtreeRef, BTreeSet<u32>>,
    /// Merkle sync of the first subtree of `asked`: only keys after this one (relative to
    /// the subtree's prefix) are left.
    pub after: Option<String>,
    /// Our keys whose short leaves the Merkle sync request in flight carries, in its order.
    pub sent: Vec<String>,
    /// A Merkle sync lost its connection: the retry goes on from `asked` and `after` (what
    /// earlier rounds applied is committed) instead of starting the diff again.
    pub resume_sync: bool,
    pub sync_total: u64,
    pub sync_done: u64,
    /// Index in `creds.primary_cluster_addrs` currently used.
    pub addr_idx: usize,
    /// The trees changed under a diff or sync in progress (a reindex finished meanwhile):
    /// what it compared is stale, so when it completes another one starts.
    pub rediff: bool,
    /// A catch-up by changed keys in progress: our copy holds values as new as the
    /// primary's WAL index here; once `last_remote_wal` is past it, the comparison that
    /// `verify` asks for follows. Not kept across a restart (which sets `verify` again).
    pub catch_up: Option<u64>,
    /// Catch up with the primary first (stream, or by changed keys), then run a Merkle
    /// diff (which clears this and, when it is done, `needs_sync`) before the copy counts
    /// as complete. Set by a catch-up, and at load with `needs_sync` set (trees rebuilt at
    /// start, or a sync or catch-up that a stop interrupted).
    pub verify: bool,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct ModeRt {
    pub role: RoleState,
    pub sec: SecRt,
}

/// What the primary knows about a connected secondary (heartbeats).
#[derive(Debug, Clone, Default)]
pub(crate) struct Live {
    pub api_addr: String,
    pub cluster_addr: String,
    pub cluster_id: String,
    pub last_seen: Millis,
    /// The version the secondary reports.
    pub version: String,
}

/// A long poll held by a primary.
#[derive(Debug, Clone)]
pub(crate) struct Waiter {
    pub id: u64,
    pub mode: Mode,
    pub secondary_id: String,
    pub after: u64,
    pub max: u32,
    pub deadline: Millis,
}

/// An outbound call in flight.
#[derive(Debug, Clone)]
pub(crate) enum Call {
    Peer {
        mode: Mode,
    },
    /// Unwrapping an activation token for `enable` or `update-primary`.
    Unwrap {
        request: RequestId,
        mode: Mode,
        update: bool,
    },
    /// Pinging `update_primary_addrs[idx]`.
    Ping {
        request: RequestId,
        mode: Mode,
        addrs: Vec<String>,
        idx: usize,
    },
    /// A client request forwarded to the primary at `to` ([`forward`]).
    Forward {
        request: RequestId,
        to: String,
    },
}

/// Replication state of a node (in memory; the durable parts live in storage).
#[derive(Clone, Debug, Default)]
pub struct Replication {
    loaded: bool,
    roles_loaded: bool,
    pub trees: Trees,
    pub wal: wal::Meta,
    /// The newest WAL entries, for pulls (cleared with every change of `wal` other than an
    /// append).
    pub(crate) tail: wal::Tail,
    local_uuids: BTreeSet<String>,
    pub(crate) perf: ModeRt,
    pub(crate) dr: ModeRt,
    next_call: u64,
    pub(crate) calls: BTreeMap<u64, Call>,
    pub(crate) waiters: Vec<Waiter>,
    pub(crate) live: BTreeMap<(Mode, String), Live>,
    /// The barrier key (set by the node when it unseals), for activation bundles.
    pub barrier_key: Option<zeroize::Zeroizing<[u8; 32]>>,
    /// Reindex and Merkle check.
    pub(crate) jobs: reindex::Jobs,
    /// Held pulls are answered at the end of the driver's batch ([`crate::Node::end_batch`])
    /// instead of after each write, so one answer carries the whole batch's entries.
    pub(crate) batched: bool,
    /// A write happened since the held pulls were last looked at (batched mode).
    pub(crate) serve_due: bool,
    /// Merkle records changed in memory and not yet written (see [`DEFER_MERKLE_MS`]), and
    /// since when.
    pub(crate) deferred: BTreeSet<merkle::Record>,
    deferred_since: Option<Millis>,
    /// The completeness marker may be missing from storage (deleted by a deferring batch and
    /// not written back yet). Wrong either way is safe: an extra marker write when it is
    /// there, or a rebuild at the next start when it is not.
    marker_absent: bool,
    /// The trees were rebuilt from the data when they were loaded (not a fresh node).
    rebuilt: bool,
    /// Merkle diffs started as a performance and as a DR secondary since the node started
    /// (status and `sys/metrics`): kept apart from the per-run state a seal or a reload
    /// starts over. A secondary that resumes from its WAL index after its primary cluster's
    /// failover starts none.
    diffs: [u64; 2],
}

/// Merkle page records are written at most this long after the writes that change them,
/// instead of with each write: a page record is 2 KiB and every written key changes one, so
/// writing them with each batch made up nine tenths of the bytes a login wrote. The
/// completeness marker is deleted in the batch that defers records and written back with
/// them, so a node that stops in between rebuilds its trees from the data when it starts
/// (and, as a secondary, then compares its roots with its primary's before streaming).
/// Reindex and Merkle check runs see records written as before (nothing is deferred while
/// one runs, and what was deferred is written before it starts).
pub const DEFER_MERKLE_MS: Millis = 1_000;

impl Replication {
    pub(crate) fn mode(&self, m: Mode) -> &ModeRt {
        match m {
            Mode::Performance => &self.perf,
            Mode::Dr => &self.dr,
        }
    }
    pub(crate) fn mode_mut(&mut self, m: Mode) -> &mut ModeRt {
        match m {
            Mode::Performance => &mut self.perf,
            Mode::Dr => &mut self.dr,
        }
    }
    pub fn role(&self, m: Mode) -> Role {
        self.mode(m).role.role
    }
    pub fn is_dr_secondary(&self) -> bool {
        self.dr.role.role == Role::Secondary
    }
    /// The replication roles in memory are the stored ones (false after a rolled-back
    /// batch, until they are read again).
    pub fn roles_loaded(&self) -> bool {
        self.roles_loaded
    }
    pub fn is_perf_secondary(&self) -> bool {
        self.perf.role.role == Role::Secondary
    }
    pub(crate) fn call_id(&mut self) -> u64 {
        self.next_call += 1;
        self.next_call
    }

    /// The WAL is written on primaries (either mode) and DR secondaries.
    fn wal_wanted(&self) -> bool {
        self.perf.role.role == Role::Primary || self.dr.role.role != Role::Disabled
    }

    /// Merkle root of one mode as status reports it: the replicated tree (performance), or
    /// both trees (DR).
    pub fn merkle_root(&self, m: Mode) -> String {
        let all = |_: &str| true;
        let r = self.trees.root(TreeKind::Replicated, &all);
        match m {
            Mode::Performance => hex::encode(r),
            Mode::Dr => {
                let l = self.trees.root(TreeKind::Local, &all);
                let mut b = r.to_vec();
                b.extend_from_slice(&l);
                crate::crypto::sha256_hex(&b)
            }
        }
    }

    /// When the node next wants to be polled for replication work (`scan_pace_ms`: least
    /// time between two steps of a background scan).
    pub fn next_wake(&self, scan_pace_ms: Millis) -> Option<Millis> {
        let w = self
            .waiters
            .iter()
            .map(|w| w.deadline)
            .chain(self.jobs.wake(scan_pace_ms))
            .min();
        let s = [&self.perf, &self.dr]
            .iter()
            .filter(|m| m.sec.inflight.is_none())
            .filter_map(|m| m.sec.next_at)
            .min();
        match (w, s) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Answers every held pull with error `code` ([`primary::refuse_all_waiters`]): the node
    /// stops serving replication (sealed, or stepped down).
    pub(crate) fn refuse_waiters(
        &mut self,
        outputs: &mut std::collections::VecDeque<crate::node::Output>,
        code: &str,
        message: &str,
    ) {
        primary::refuse_all_waiters(outputs, &mut self.waiters, code, message);
    }

    /// Forgets unsealed state when the node seals (roles are reloaded on unseal).
    pub fn on_seal(&mut self) {
        self.roles_loaded = false;
        self.perf = ModeRt::default();
        self.dr = ModeRt::default();
        self.waiters.clear();
        self.calls.clear();
        self.barrier_key = None;
        reindex::on_seal(&mut self.jobs);
    }

    /// The storage dropped write sets this state already counted (a batch was rolled
    /// back): reload trees, WAL position and roles from storage on the next input, and start
    /// a running scan over.
    pub fn forget_uncommitted(&mut self) {
        // The trees are reloaded (or rebuilt and written whole) from storage. The deferred
        // records may include ones of committed batches, which deleted the stored marker:
        // forgetting them is safe only because the marker is then left as storage has it
        // (absent: the reload rebuilds from the data). Writing the marker back without them
        // would declare stale pages complete.
        self.deferred.clear();
        self.deferred_since = None;
        self.marker_absent = false;
        self.tail.clear();
        self.loaded = false;
        self.roles_loaded = false;
        self.jobs.epoch += 1;
    }

    /// What this node derived from storage that no longer matches it (`None`: all agree):
    /// the served trees against trees rebuilt from the data, the WAL position against the
    /// stored one, and, while the completeness marker is stored, the stored page records.
    /// For checkers (the simulator, tests): it reads the whole storage.
    pub fn drift(&self, s: &dyn Storage) -> Option<String> {
        if !self.loaded {
            return None;
        }
        let fresh = match reindex::rebuild(s, &self.local_uuids) {
            Ok(t) => t,
            Err(e) => return Some(format!("the storage could not be read: {e}")),
        };
        if self.trees != fresh {
            return Some(format!(
                "the served Merkle trees differ from the data in (subtree, bucket) {:?}",
                self.trees.differing_buckets(&fresh)
            ));
        }
        match wal::load_meta(s) {
            Ok(m) if m != self.wal => {
                return Some(format!(
                    "the WAL position {:?} differs from the stored one {m:?}",
                    self.wal
                ))
            }
            Ok(_) => {}
            Err(e) => return Some(format!("the WAL position could not be read: {e}")),
        }
        if let Some(d) = self.tail.drift(s, usize::MAX) {
            return Some(d);
        }
        if matches!(s.get(merkle::MARKER), Ok(Some(v)) if v == merkle::VERSION) {
            let stored = match s.scan(merkle::PREFIX) {
                Ok(r) => r,
                Err(e) => return Some(format!("the Merkle records could not be read: {e}")),
            };
            let report = merkle::check(&fresh, &fresh, &stored);
            if !report.is_clean() {
                return Some(format!(
                    "the stored Merkle records are marked complete but differ from the data: \
                     {report:?}"
                ));
            }
        }
        None
    }

    /// Takes a WAL position that did not come from appending (a load, a reset, a wipe, the
    /// log switched on or off): the entries kept in memory for pulls are dropped with it.
    pub(crate) fn set_wal(&mut self, m: wal::Meta) {
        self.wal = m;
        self.tail.clear();
    }

    /// Where the WAL entries this node keeps in memory for pulls differ from the stored ones
    /// (`None`: they agree), among the oldest and newest `ends` of them. For checkers.
    pub fn tail_drift(&self, s: &dyn Storage, ends: usize) -> Option<String> {
        self.tail.drift(s, ends)
    }

    /// Whether this node's copy in mode `m` is incomplete: it is a secondary that has not
    /// finished a Merkle sync it needs (promote refuses it without `force`).
    pub fn syncing(&self, m: Mode) -> bool {
        let rt = self.mode(m);
        rt.role.role == Role::Secondary
            && (rt.role.needs_sync
                || matches!(
                    rt.sec.phase,
                    Phase::MerkleDiff | Phase::MerkleSync | Phase::CatchUp
                ))
    }

    /// Whether this secondary started with its copy not known to be complete and owes a
    /// Merkle diff once it has caught up with its primary (`SecRt::verify`).
    pub fn verifying(&self, m: Mode) -> bool {
        self.mode(m).sec.verify
    }

    /// Merkle diffs this node started as a secondary in mode `m` since it started
    /// (`merkle_diffs` in the replication status).
    pub fn merkle_diffs(&self, m: Mode) -> u64 {
        self.diffs[m as usize]
    }

    /// A secondary in mode `m` started a Merkle diff.
    pub(crate) fn count_diff(&mut self, m: Mode) {
        self.diffs[m as usize] += 1;
    }

    /// Progress of a running reindex or Merkle check: (keys done, keys total).
    pub fn scan_progress(&self) -> Option<(u64, u64)> {
        reindex::progress(&self.jobs)
    }

    /// The new local-mount UUID set if `changes` rewrite a local mount table.
    fn local_uuids_after(
        &self,
        s: &dyn Storage,
        barrier: &Barrier,
        changes: &[Change],
    ) -> ApiResult<Option<BTreeSet<String>>> {
        const TABLES: [&str; 2] = ["core/local-mounts", "core/local-auth"];
        if !changes.iter().any(|c| TABLES.contains(&c.key.as_str())) {
            return Ok(None);
        }
        let mut set = BTreeSet::new();
        for t in TABLES {
            let bytes = match changes.iter().rev().find(|c| c.key == t) {
                Some(c) => c.value.clone(),
                None => s.get(t)?,
            };
            set.extend(uuids_of_table(barrier, t, bytes.as_deref()));
        }
        Ok(Some(set))
    }

    /// The classes of a write set's keys, in its order (as the commit hook classifies them).
    pub fn classes(
        &self,
        s: &dyn Storage,
        barrier: &Barrier,
        ws: &WriteSet,
    ) -> ApiResult<Vec<(String, Class)>> {
        let changes: Vec<Change> = ws
            .writes
            .iter()
            .map(|(k, v)| Change::write(k.clone(), v.clone()))
            .collect();
        let mut uuids = self.local_uuids.clone();
        if let Some(n) = self.local_uuids_after(s, barrier, &changes)? {
            uuids.extend(n);
        }
        Ok(changes
            .into_iter()
            .map(|c| {
                let class = class::classify(&c.key, &uuids);
                (c.key, class)
            })
            .collect())
    }

    /// Classifies, checks and extends a write set; nothing is changed in memory yet.
    fn stage(
        &self,
        s: &dyn Storage,
        barrier: &Barrier,
        limits: wal::Limits,
        changes: Vec<Change>,
        origin: Origin,
    ) -> ApiResult<Staged> {
        let new_uuids = self.local_uuids_after(s, barrier, &changes)?;
        let mut uuids = self.local_uuids.clone();
        if let Some(n) = &new_uuids {
            uuids.extend(n.iter().cloned());
        }
        let mut classes = Vec::with_capacity(changes.len());
        for c in &changes {
            let class = c.class.unwrap_or_else(|| class::classify(&c.key, &uuids));
            if origin == Origin::Client && class != Class::NodeLocal {
                if self.is_dr_secondary() {
                    return Err(dr_secondary_error());
                }
                if self.is_perf_secondary() && class == Class::Replicated {
                    return Err(ApiError::bad(format!(
                        "this cluster is a performance secondary: replicated data (here {:?}) is read-only; write to the primary",
                        c.key
                    )));
                }
            }
            classes.push(class);
        }
        let mut writes: Vec<Write> = Vec::with_capacity(changes.len() + 4);
        let mut ms = merkle::Staged::default();
        // A reindex or check in progress keeps its fresh trees exact for the keys it has read.
        let mut js = self.jobs.job.as_ref().map(|_| merkle::Staged::default());
        let mut overlay: BTreeMap<&str, Option<Vec<u8>>> = BTreeMap::new();
        // The previous values, read at once (one round trip on a remote database).
        let mut wanted: Vec<&str> = changes
            .iter()
            .zip(&classes)
            .filter(|(_, class)| **class != Class::NodeLocal)
            .map(|(c, _)| c.key.as_str())
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut previous: BTreeMap<&str, Option<Vec<u8>>> =
            wanted.iter().copied().zip(s.get_many(&wanted)?).collect();
        let mut entries: Vec<WalEntry> = Vec::new();
        let wal_on = self.wal.active;
        let mut next = self.wal.last + 1;
        for (c, class) in changes.iter().zip(classes) {
            writes.push((c.key.clone(), c.value.clone()));
            if class == Class::NodeLocal {
                continue;
            }
            let old = match overlay.get(c.key.as_str()) {
                Some(v) => v.clone(),
                // The previous value is read for every key, also one claimed new: the Merkle
                // trees need it, and a wrong claim (a key drawn at random that exists) is
                // refused in every build rather than corrupting the trees silently.
                None => {
                    let v = previous.remove(c.key.as_str()).flatten();
                    if c.fresh && v.is_some() {
                        return Err(ApiError::Internal(format!(
                            "a key written as new already exists: {:?}",
                            c.key
                        )));
                    }
                    v
                }
            };
            overlay.insert(c.key.as_str(), c.value.clone());
            if old.is_none() && c.value.is_none() && origin != Origin::DrStream {
                continue;
            }
            let tree = if class == Class::Replicated {
                TreeKind::Replicated
            } else {
                TreeKind::Local
            };
            let sub = class::subtree(&c.key);
            self.trees.stage(
                &mut ms,
                tree,
                &sub,
                &c.key,
                old.as_deref(),
                c.value.as_deref(),
            );
            if let (Some(job), Some(js)) = (self.jobs.job.as_ref(), js.as_mut()) {
                if job.covers(&c.key) {
                    job.fresh()
                        .stage(js, tree, &sub, &c.key, old.as_deref(), c.value.as_deref());
                }
            }
            if !wal_on {
                continue;
            }
            let index = if origin == Origin::DrStream {
                match c.index {
                    Some(i) if i > self.wal.last => i,
                    _ => continue,
                }
            } else {
                let i = next;
                next += 1;
                i
            };
            entries.push(WalEntry {
                index,
                key: c.key.clone(),
                class,
                hash: c
                    .value
                    .as_deref()
                    .map(crate::crypto::sha256_hex)
                    .unwrap_or_default(),
                value: c.value.clone(),
                end: if origin == Origin::DrStream {
                    c.end
                } else {
                    false
                },
            });
        }
        if origin != Origin::DrStream {
            if let Some(last) = entries.last_mut() {
                last.end = true;
            }
        }
        let records = self.trees.persist(&mut ms);
        let defer = self.jobs.idle();
        let mut deferred = Vec::new();
        if defer && !records.is_empty() {
            deferred = records
                .iter()
                .filter_map(|(k, _)| merkle::parse_key(k))
                .collect();
            writes.push((merkle::MARKER.to_string(), None));
        } else {
            writes.extend(records);
        }
        let wal_meta = if entries.is_empty() {
            None
        } else {
            Some(wal::append(s, self.wal, &entries, limits, &mut writes)?)
        };
        Ok(Staged {
            writes,
            deferred,
            job: js,
            merkle: ms,
            wal: wal_meta,
            entries,
            uuids: new_uuids,
        })
    }

    /// Installs a staged write set after it was applied; true when the WAL grew.
    fn install(&mut self, st: Staged) -> bool {
        self.trees.install(st.merkle);
        if !st.deferred.is_empty() {
            self.marker_absent = true;
        }
        self.deferred.extend(st.deferred);
        if let (Some(job), Some(mut js)) = (self.jobs.job.as_mut(), st.job) {
            job.fresh().persist(&mut js);
            job.fresh_mut().install(js);
        }
        if let Some(u) = st.uuids {
            self.local_uuids = u;
        }
        match st.wal {
            Some(m) => {
                let grew = m.last > self.wal.last;
                self.wal = m;
                self.tail.extend(st.entries, &m);
                grew
            }
            None => false,
        }
    }
}

struct Staged {
    writes: Vec<Write>,
    /// Merkle records left to [`flush_deferred`].
    deferred: Vec<merkle::Record>,
    job: Option<merkle::Staged>,
    merkle: merkle::Staged,
    wal: Option<wal::Meta>,
    /// The entries appended to the WAL (for its in-memory tail).
    entries: Vec<WalEntry>,
    uuids: Option<BTreeSet<String>>,
}

fn uuids_of_table(barrier: &Barrier, key: &str, bytes: Option<&[u8]>) -> Vec<String> {
    let Some(b) = bytes else { return Vec::new() };
    let Some(plain) = barrier.decrypt(key, b) else {
        return Vec::new();
    };
    serde_json::from_slice::<Vec<crate::mounts::MountEntry>>(&plain)
        .map(|v| v.into_iter().map(|m| m.uuid).collect())
        .unwrap_or_default()
}

pub(crate) fn dr_secondary_error() -> ApiError {
    ApiError::bad(
        "this cluster is a DR secondary: it does not serve client requests; send them to the DR primary, or promote this cluster",
    )
}

/// The part of the node's state replication reads and changes: its roles, trees, WAL
/// position, jobs and peer calls; the node's configuration (read only); the output queue
/// (peer calls, outbound HTTP, cluster TLS); and the activation tokens decrypted locally,
/// finished after the request. The replication endpoints and steps get this, not
/// [`NodeState`].
/// The code of the answer a standby of an HA primary cluster gives a secondary: try the
/// cluster's next address.
pub const STANDBY_CODE: &str = "standby";

pub struct ReplIo<'a> {
    pub repl: &'a mut Replication,
    pub config: &'a crate::node::NodeConfig,
    /// The node's HA cluster (its nodes' cluster addresses go into activation tokens).
    pub ha: &'a crate::ha::Ha,
    pub outputs: &'a mut std::collections::VecDeque<Output>,
    pub(crate) local_activations: &'a mut Vec<activation::LocalActivation>,
}

impl<'a> ReplIo<'a> {
    /// The replication part of `st`.
    pub(crate) fn of(st: &'a mut NodeState) -> ReplIo<'a> {
        ReplIo {
            repl: &mut st.repl,
            config: &st.config,
            ha: &st.ha,
            outputs: &mut st.outputs,
            local_activations: &mut st.local_activations,
        }
    }
}

/// Everything a replication step may touch.
pub struct Env<'a> {
    pub storage: &'a mut dyn Storage,
    pub barrier: &'a mut Barrier,
    pub rng: &'a mut ChaCha20Rng,
    pub st: ReplIo<'a>,
    pub now: Millis,
}

impl Env<'_> {
    /// A handler context over current storage (reads only; writes go through [`commit`]).
    pub fn ctx(&mut self) -> Ctx<'_> {
        Ctx {
            txn: Txn::new(&*self.storage),
            barrier: &*self.barrier,
            rng: &mut *self.rng,
            now: self.now,
        }
    }
    pub(crate) fn repl(&mut self) -> &mut Replication {
        self.st.repl
    }
    pub(crate) fn cfg(&self) -> &ReplicationConfig {
        &self.st.config.replication
    }
    pub(crate) fn push(&mut self, o: Output) {
        self.st.outputs.push_back(o);
    }
    /// The encrypted write of a mode's role state.
    pub(crate) fn role_write(&mut self, m: Mode) -> ApiResult<Change> {
        let json = serde_json::to_vec(&self.st.repl.mode(m).role)
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        let key = m.role_key();
        let enc = self
            .barrier
            .encrypt(&key, &json, &mut *self.rng)
            .ok_or(ApiError::Sealed)?;
        Ok(Change::write(key, Some(enc)))
    }
}

#[cfg(test)]
mod tests;
