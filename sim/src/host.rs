//! One simulated machine, shared by every tier ([`crate::world`], and [`crate::repl`] on
//! the fast and turmoil tiers): a [`Node`] while it is up, its [`SimStorage`] always (the
//! storage outlives crashes), the node's outputs held until the batch that produced them
//! commits, the boot incarnation, and the open batch's bookkeeping.
//!
//! Group commit works as in the shell: a node's writes land in the storage's uncommitted
//! buffer and its outputs are [held](Host::hold) until [`Host::commit`] makes the batch
//! durable and hands them back for release. [`Host::crash`] is a power loss: the node and
//! its uncommitted writes vanish, and the held outputs are handed back to be answered with
//! a reset connection. [`Host::start`] boots a new incarnation on the parked storage (sealed,
//! as after any restart). When to commit is the driver's policy: the single-node world
//! commits after a seeded window or when a batch is full, the replication world (both
//! tiers) after a seeded window, ending the batch first (held long polls are answered).
//!
//! The driver's side of group commit (drain a node's outputs into its batch, schedule the
//! commit, commit, release what the batch held) is written once, in [`GroupCommit`]; each
//! world says where outputs go and how released ones travel.

use crate::check::Violation;
use crate::net::HostId;
use crate::rng::SimRng;
use crate::storage::{CommitInfo, CrashInfo, SimStorage};
use cairn_core::ha::store::{Fenced, SharedStorage};
use cairn_core::ha::Fence;
use cairn_core::storage::Storage;
use cairn_core::{Admin, AdminResult, Input, Node, NodeConfig, Output};

/// What a host's storage does besides being a [`Storage`]: group commit and power loss.
/// [`SimStorage`] is one machine's own disk; [`SharedStorage`] is a node's handle on its HA
/// cluster's shared store, whose commits are fenced by the lease.
pub trait HostStorage: Storage {
    /// What a commit reports.
    type Committed;
    /// What a crash reports.
    type Crashed;
    /// Whether writes wait for a commit.
    fn dirty(&self) -> bool;
    /// Makes the open batch durable under `fence` (ignored by storage that is not shared).
    fn commit_batch(&mut self, fence: Fence) -> Self::Committed;
    /// Power loss: the uncommitted writes vanish.
    fn lose_power(&mut self) -> Self::Crashed;
}

impl HostStorage for SimStorage {
    type Committed = CommitInfo;
    type Crashed = CrashInfo;
    fn dirty(&self) -> bool {
        self.is_dirty()
    }
    fn commit_batch(&mut self, _fence: Fence) -> CommitInfo {
        self.commit()
    }
    fn lose_power(&mut self) -> CrashInfo {
        self.crash()
    }
}

impl HostStorage for SharedStorage {
    /// The number of writes applied, or the store's refusal.
    type Committed = Result<usize, Fenced>;
    /// The number of writes dropped.
    type Crashed = usize;
    fn dirty(&self) -> bool {
        self.is_dirty()
    }
    fn commit_batch(&mut self, fence: Fence) -> Result<usize, Fenced> {
        self.commit(fence)
    }
    fn lose_power(&mut self) -> usize {
        self.rollback()
    }
}

/// One machine: a node while it is up, its storage always.
pub struct Host<S: HostStorage = SimStorage> {
    pub id: HostId,
    node: Option<Node<S>>,
    /// The storage while the node is down.
    parked: Option<S>,
    /// Incremented at every start.
    boot: u64,
    /// Outputs waiting for their batch to commit, in production order.
    held: Vec<Output>,
    /// Identifies the open batch; bumped by every start, commit and crash.
    batch: u64,
    commit_scheduled: bool,
    /// Whether the running incarnation batches (see [`Host::start`]).
    batched: bool,
    /// RNG seeds of the node's incarnations.
    seeds: SimRng,
    /// The view the node had at its last commit (none while down): while a batch is open,
    /// readers beside the node answer under it, as the shell's do until the batch commits.
    published: Option<cairn_core::reads::ReadView>,
    /// Draws the `request_id`s of answers given beside the node.
    reads_rng: rand_chacha::ChaCha20Rng,
}

impl<S: HostStorage> Host<S> {
    /// Host `id` of the run of master seed `seed`, down, on `storage`.
    pub fn new(id: HostId, seed: u64, storage: S) -> Host<S> {
        Host {
            id,
            node: None,
            parked: Some(storage),
            boot: 0,
            held: Vec::new(),
            batch: 0,
            commit_scheduled: false,
            batched: false,
            seeds: SimRng::derive(seed, &format!("host/{id}/boot-seeds")),
            published: None,
            reads_rng: rand_core::SeedableRng::from_seed(
                SimRng::derive(seed, &format!("host/{id}/reads")).seed32(),
            ),
        }
    }

    pub fn is_up(&self) -> bool {
        self.node.is_some()
    }

    /// The boot incarnation: 0 before the first start.
    pub fn boot(&self) -> u64 {
        self.boot
    }

    pub fn node(&self) -> Option<&Node<S>> {
        self.node.as_ref()
    }

    pub fn node_mut(&mut self) -> Option<&mut Node<S>> {
        self.node.as_mut()
    }

    /// The storage, whether the node is up or down.
    pub fn storage(&self) -> Option<&S> {
        match &self.node {
            Some(n) => Some(n.storage()),
            None => self.parked.as_ref(),
        }
    }

    /// The storage, whether the node is up or down (for planting faults behind its back).
    pub fn storage_mut(&mut self) -> Option<&mut S> {
        match self.node.as_mut() {
            Some(n) => Some(n.storage_mut()),
            None => self.parked.as_mut(),
        }
    }

    /// Whether the running node has writes waiting for a commit.
    pub fn dirty(&self) -> bool {
        self.node.as_ref().is_some_and(|n| n.storage().dirty())
    }

    /// Whether the open batch holds anything (writes or outputs).
    pub fn pending(&self) -> bool {
        !self.held.is_empty() || self.dirty()
    }

    /// Whether the running incarnation batches: held long polls are answered when the batch
    /// ends, just before it commits.
    pub fn batched(&self) -> bool {
        self.batched
    }

    /// Outputs held in the open batch.
    pub fn held(&self) -> &[Output] {
        &self.held
    }

    /// Holds an output until the open batch commits.
    pub fn hold(&mut self, o: Output) {
        self.held.push(o);
    }

    /// Whether the open batch's commit is scheduled (the node is busy committing).
    pub fn commit_scheduled(&self) -> bool {
        self.commit_scheduled
    }

    /// Whether `batch` is still the open batch (a commit scheduled for it is not stale).
    pub fn is_open_batch(&self, batch: u64) -> bool {
        self.batch == batch
    }

    /// Marks a commit of the open batch as scheduled and returns the batch; `None` when one
    /// is scheduled already.
    pub fn schedule_commit(&mut self) -> Option<u64> {
        if self.commit_scheduled {
            return None;
        }
        self.commit_scheduled = true;
        Some(self.batch)
    }

    /// Starts a new incarnation on the parked storage with `config` (`batched`: held
    /// long polls are answered at the end of the batch, as in the shell). `None` when the
    /// node is up already.
    pub fn start(&mut self, config: NodeConfig, batched: bool) -> Option<&mut Node<S>> {
        let storage = self.parked.take()?;
        let seed = self.seeds.seed32();
        self.boot += 1;
        self.batch += 1;
        self.commit_scheduled = false;
        let mut node = Node::new(storage, seed, config);
        self.batched = batched;
        if batched {
            node.set_batched(true);
        }
        self.node = Some(node);
        self.node.as_mut()
    }

    /// Hands `input` to the node, if it is up.
    pub fn handle(&mut self, now: u64, input: Input) {
        if let Some(n) = self.node.as_mut() {
            n.handle(now, input);
        }
    }

    /// The node's next output, if it is up and has one.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.node.as_mut().and_then(|n| n.poll_output())
    }

    /// The dev set-up of a fresh node (initialized and unsealed with one key share, root
    /// token `root`), committed at once: it is not part of the fault model. Returns the
    /// unseal key (base64; empty if the node gave none).
    pub fn dev_setup(&mut self, now: u64, root: &str) -> String {
        let mut key = String::new();
        let Some(node) = self.node.as_mut() else {
            return key;
        };
        node.handle(
            now,
            Input::Admin {
                id: 1,
                cmd: Admin::DevSetup {
                    root_token_id: Some(root.to_string()),
                },
            },
        );
        while let Some(o) = node.poll_output() {
            if let Output::AdminDone {
                result: Ok(AdminResult::DevSetup(keys)),
                ..
            } = o
            {
                key = keys.keys_base64.first().cloned().unwrap_or_default();
            }
        }
        let _ = node.storage_mut().commit_batch(Fence::None);
        key
    }

    /// Makes the open batch durable and opens the next one; returns what was committed and
    /// the held outputs, now to be released in production order. `None` when down.
    pub fn commit(&mut self) -> Option<(S::Committed, Vec<Output>)> {
        let node = self.node.as_mut()?;
        let fence = node.fence();
        let info = node.storage_mut().commit_batch(fence);
        self.published = node.read_view();
        self.batch += 1;
        self.commit_scheduled = false;
        Some((info, std::mem::take(&mut self.held)))
    }

    /// Power loss: the node and its uncommitted writes vanish; returns what the storage
    /// dropped and the held outputs (never released). `None` when already down.
    pub fn crash(&mut self) -> Option<(S::Crashed, Vec<Output>)> {
        let node = self.node.take()?;
        self.published = None;
        let mut storage = node.into_storage();
        let info = storage.lose_power();
        self.parked = Some(storage);
        self.batch += 1;
        self.commit_scheduled = false;
        Some((info, std::mem::take(&mut self.held)))
    }
}

impl Host<SimStorage> {
    /// Answers `req` beside the node, as the shell's readers do: from the committed
    /// storage under the view of the node's last batch, when [`cairn_core::reads::answer`]
    /// takes it; the node counts it. `None`: the node must run it.
    pub fn read_beside(
        &mut self,
        now: u64,
        req: &cairn_core::Request,
    ) -> Option<cairn_core::api::Response> {
        let node = self.node.as_mut()?;
        // No batch open: the node's memory is what its last batch left, which the shell
        // publishes when that batch ends.
        let view = match node.storage().dirty() {
            false => node.read_view()?,
            true => self.published.clone()?,
        };
        let storage = node.storage();
        let served = match storage.fault() {
            Some(crate::storage::StorageFault::ReadBesideUncommitted) => {
                cairn_core::reads::answer(&view, storage, now, &mut self.reads_rng, req)
            }
            _ => cairn_core::reads::answer(
                &view,
                &storage.committed_view(),
                now,
                &mut self.reads_rng,
                req,
            ),
        }?;
        node.count_answered([(served.answered, 1)]);
        Some(served.response)
    }
}

/// A world's group-commit policy (see [`GroupCommit::schedule_commit`]).
#[derive(Debug, Clone, Copy)]
pub struct Batching {
    /// A batch commits a seeded time in `0..=window_ms` after its first output or write.
    pub window_ms: u64,
    /// A batch commits at once when it holds this many outputs (`None`: only the window).
    pub max_batch: Option<usize>,
    /// Chance per batch of a crash before it commits; `None` when crashes are off (then no
    /// draw is made).
    pub crash_permille: Option<u64>,
}

/// Where [`GroupCommit::drain`] puts one of a node's outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sort {
    /// Held until the batch commits, then [released](GroupCommit::release_held).
    Hold,
    /// Handed to [`GroupCommit::drained`] after the poll, with the others set aside.
    Aside,
    /// Ignored.
    Drop,
}

/// The driver's side of group commit, shared by every world: drain a node's outputs into
/// its open batch, schedule the batch's commit (and perhaps a crash before it), commit it
/// and release what it held, in production order. The provided methods are the shared
/// code; a world implements the hooks (where an output goes, how a released one travels,
/// its events and checks). The order of the seeded draws is part of every trace hash.
pub trait GroupCommit {
    fn host_mut(&mut self, h: HostId) -> &mut Host;
    /// The simulated time.
    fn sim_now(&self) -> u64;
    /// The RNG of the commit windows and crashes in a batch.
    fn faults(&mut self) -> &mut SimRng;
    fn batching(&self) -> Batching;
    /// Queues the commit of `batch` of host `h`, `delay` ms from now.
    fn schedule_commit_at(&mut self, h: HostId, batch: u64, delay: u64);
    /// Queues a crash of host `h`, `delay` ms from now.
    fn schedule_crash_at(&mut self, h: HostId, delay: u64);
    /// Where an output goes.
    fn sort(&self, o: &Output) -> Sort;
    /// After a poll of host `h`'s node: the outputs set aside ([`Sort::Aside`]), in
    /// production order, and the index in [`Host::held`] of the first output this poll
    /// held. Returns whether it handed the node inputs (the node is then polled again).
    fn drained(&mut self, h: HostId, aside: Vec<Output>, held_from: usize) -> bool;
    /// Host `h` committed a batch holding `held` (called before they are released).
    fn committed(&mut self, h: HostId, info: &CommitInfo, held: &[Output]);
    /// Releases one output of a committed batch.
    fn release_held(&mut self, h: HostId, o: Output) -> Result<(), Violation>;
    /// Checks after a commit's outputs are released.
    fn after_commit(&mut self, _h: HostId) -> Result<(), Violation> {
        Ok(())
    }

    /// Moves host `h`'s new outputs into its open batch (or aside, or nowhere; see
    /// [`GroupCommit::sort`]) until the node has nothing more to say.
    fn drain(&mut self, h: HostId) {
        loop {
            let host = self.host_mut(h);
            if !host.is_up() {
                return;
            }
            let held_from = host.held().len();
            let mut aside = Vec::new();
            while let Some(o) = self.host_mut(h).poll_output() {
                match self.sort(&o) {
                    Sort::Hold => self.host_mut(h).hold(o),
                    Sort::Aside => aside.push(o),
                    Sort::Drop => {}
                }
            }
            if !self.drained(h, aside, held_from) {
                return;
            }
        }
    }

    /// Arranges for host `h`'s open batch to commit after a seeded window (and, by chance,
    /// for a crash before it), or commits it now when it is full. Nothing when the batch
    /// is empty or its commit is already queued.
    fn schedule_commit(&mut self, h: HostId) -> Result<(), Violation> {
        let b = self.batching();
        let host = self.host_mut(h);
        if !host.pending() {
            return Ok(());
        }
        if b.max_batch.is_some_and(|m| host.held().len() >= m) {
            return self.commit(h);
        }
        let Some(batch) = host.schedule_commit() else {
            return Ok(());
        };
        let d = self.faults().range(0, b.window_ms);
        if let Some(p) = b.crash_permille {
            if self.faults().chance(p) {
                let c = self.faults().range(0, d);
                self.schedule_crash_at(h, c);
            }
        }
        self.schedule_commit_at(h, batch, d);
        Ok(())
    }

    /// Commits host `h`'s open batch (a batching node ends it first, and what that answers
    /// joins the batch) and releases its outputs in production order.
    fn commit(&mut self, h: HostId) -> Result<(), Violation> {
        if self.host_mut(h).batched() {
            let now = self.sim_now();
            if let Some(n) = self.host_mut(h).node_mut() {
                n.end_batch(now);
            }
            self.drain(h);
        }
        let Some((info, held)) = self.host_mut(h).commit() else {
            return Ok(());
        };
        self.committed(h, &info, &held);
        for o in held {
            self.release_held(h, o)?;
        }
        self.after_commit(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::Storage;

    #[test]
    fn held_outputs_wait_for_the_commit_and_a_crash_drops_them() {
        let mut h = Host::new(0, 1, SimStorage::new());
        assert!(h.start(NodeConfig::default(), false).is_some());
        assert!(h.start(NodeConfig::default(), false).is_none());
        h.handle(
            0,
            Input::Admin {
                id: 1,
                cmd: Admin::DevSetup {
                    root_token_id: None,
                },
            },
        );
        while let Some(o) = h.poll_output() {
            h.hold(o);
        }
        assert!(h.pending());
        let b = h.schedule_commit();
        assert!(b.is_some() && h.schedule_commit().is_none());
        let (info, out) = h.commit().expect("up");
        assert!(info.write_sets > 0 && !out.is_empty());
        assert!(!h.pending() && !h.is_open_batch(b.unwrap_or(0)));
        let keys = h.storage().map(|s| s.committed_len()).unwrap_or(0);
        h.storage_mut()
            .map(|s| s.apply(&[("x".into(), Some(vec![1]))]))
            .transpose()
            .expect("apply");
        let (info, _) = h.crash().expect("up");
        assert_eq!(info.dropped_write_sets, 1);
        assert!(!h.is_up() && h.crash().is_none());
        assert_eq!(h.storage().map(|s| s.committed_len()), Some(keys));
        assert!(h.start(NodeConfig::default(), false).is_some());
        assert_eq!(h.boot(), 2);
    }

    /// A driver of one host that holds admin answers and records what it queues.
    struct Toy {
        host: Host,
        faults: SimRng,
        max_batch: Option<usize>,
        queued: Vec<u64>,
        released: Vec<Output>,
    }

    impl GroupCommit for Toy {
        fn host_mut(&mut self, _h: HostId) -> &mut Host {
            &mut self.host
        }
        fn sim_now(&self) -> u64 {
            0
        }
        fn faults(&mut self) -> &mut SimRng {
            &mut self.faults
        }
        fn batching(&self) -> Batching {
            Batching {
                window_ms: 5,
                max_batch: self.max_batch,
                crash_permille: None,
            }
        }
        fn schedule_commit_at(&mut self, _h: HostId, batch: u64, _delay: u64) {
            self.queued.push(batch);
        }
        fn schedule_crash_at(&mut self, _h: HostId, _delay: u64) {
            unreachable!("crashes are off");
        }
        fn sort(&self, o: &Output) -> Sort {
            match o {
                Output::AdminDone { .. } => Sort::Hold,
                _ => Sort::Drop,
            }
        }
        fn drained(&mut self, _h: HostId, _aside: Vec<Output>, _held_from: usize) -> bool {
            false
        }
        fn committed(&mut self, _h: HostId, _info: &CommitInfo, _held: &[Output]) {}
        fn release_held(&mut self, _h: HostId, o: Output) -> Result<(), Violation> {
            self.released.push(o);
            Ok(())
        }
    }

    fn admin(t: &mut Toy, id: u64) {
        let cmd = Admin::DevSetup {
            root_token_id: None,
        };
        t.host.handle(0, Input::Admin { id, cmd });
        t.drain(0);
    }

    #[test]
    fn group_commit_queues_one_commit_per_batch_and_commits_a_full_batch_at_once() {
        let mut t = Toy {
            host: Host::new(0, 1, SimStorage::new()),
            faults: SimRng::derive(1, "faults"),
            max_batch: None,
            queued: Vec::new(),
            released: Vec::new(),
        };
        assert!(t.host.start(NodeConfig::default(), false).is_some());
        admin(&mut t, 1);
        assert_eq!(t.host.held().len(), 1);
        assert!(t.schedule_commit(0).is_ok() && t.schedule_commit(0).is_ok());
        assert_eq!(t.queued.len(), 1, "one commit queued per batch");
        assert!(t.host.is_open_batch(t.queued[0]));
        assert!(t.commit(0).is_ok());
        assert_eq!(t.released.len(), 1);
        assert!(!t.host.pending() && !t.host.is_open_batch(t.queued[0]));
        t.max_batch = Some(1);
        admin(&mut t, 2);
        assert!(t.schedule_commit(0).is_ok());
        assert_eq!(
            (t.queued.len(), t.released.len()),
            (1, 2),
            "a full batch commits at once"
        );
    }
}
