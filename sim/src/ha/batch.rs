//! A node's loop as the shell runs it: a due tick first, then the queued inputs, as one
//! batch; the batch's writes reach its cluster's store under the node's fence after a seeded
//! latency (or are refused: fenced off, store unreachable), and only then are its outputs
//! released (answers, lease operations, forwarded requests, peer calls). The per-commit
//! checks live here: `fenced-commits` per store, `trees-follow-storage` for every cluster's
//! active node, a secondary cluster's first sync and the Merkle diffs its nodes start after
//! it (`resume-without-resync`).

use super::{fail, Caller, Checked, Ev, HaWorld, TTL};
use cairn_core::api::Response;
use cairn_core::ha::{Fence, LeaseOutcome, LeaseResult};
use cairn_core::replication::merkle::MARKER;
use cairn_core::replication::state::Role;
use cairn_core::replication::{PeerAnswer, PeerReply};
use cairn_core::storage::Storage;
use cairn_core::{Input, Output};

/// Whether `input` tells a secondary that its primary no longer holds the WAL it asked for.
fn is_gone(input: &Input) -> bool {
    matches!(
        input,
        Input::PeerReply(PeerReply {
            result: Ok(PeerAnswer::Gone { .. }),
            ..
        })
    )
}

impl HaWorld {
    /// The node's loop: a due tick first, then the queued inputs, as one batch.
    pub(super) fn run_node(&mut self, i: usize) -> Checked<()> {
        if self.nodes[i].paused_until > self.now {
            let d = self.nodes[i].paused_until - self.now;
            self.schedule_wake(i, d);
            return Ok(());
        }
        if self.nodes[i].host.commit_scheduled() {
            // Busy committing; it wakes again after the commit.
            return Ok(());
        }
        let now = self.local_now(i);
        let h = &mut self.nodes[i];
        let Some(n) = h.host.node_mut() else {
            return Ok(());
        };
        let due = n.poll_timeout() <= now;
        if !due && h.inbox.is_empty() {
            let wait = n.poll_timeout().saturating_sub(now).max(1);
            self.schedule_wake(i, wait);
            return Ok(());
        }
        // Without the Merkle records' marker (written lazily, after the writes), a node
        // that loads the replication state (taking over, or after a batch rolled back)
        // rebuilds its trees from the data and, as a secondary, compares them with the
        // primary's before it streams on.
        let unmarked = n.storage().get(MARKER).ok().flatten().is_none();
        if due {
            n.handle(now, Input::Tick);
        }
        let inputs: Vec<Input> = h.inbox.drain(..).collect();
        let gone = inputs.iter().filter(|i| is_gone(i)).count() as u64;
        for input in inputs {
            n.handle(now, input);
        }
        let dirty = n.storage().is_dirty();
        let next = n.poll_timeout();
        let diffs = self.clusters[h.cluster]
            .mode
            .map(|m| n.replication().merkle_diffs(m));
        // A catch-up, and a node that loaded its state with a sync owed (its trees rebuilt,
        // or a sync or catch-up interrupted; also on a reload after a batch that did not
        // commit), end in a Merkle diff in a later batch, once caught up.
        let owe = self.clusters[h.cluster]
            .mode
            .is_some_and(|m| n.replication().verifying(m));
        while let Some(o) = h.host.poll_output() {
            h.host.hold(o);
        }
        if let Some(d) = diffs {
            self.on_diffs(i, d, (gone, owe), unmarked)?;
        }
        let h = &mut self.nodes[i];
        let Some(batch) = h.host.schedule_commit() else {
            return Ok(());
        };
        let mut latency = if dirty { 1 + self.rng.delay(3) } else { 0 };
        if dirty {
            if let Some(d) = h.pause_before_commit.take() {
                h.paused_until = self.now + d;
                latency += d;
                self.trace.log(
                    self.now,
                    &format!("node {i} stopped for {d} ms before committing batch {batch}"),
                );
            }
        }
        self.at(latency, Ev::Commit(i, batch));
        let local = self.local_now(i);
        let wait = next.saturating_sub(local).max(1);
        self.schedule_wake(i, wait);
        Ok(())
    }

    /// Node `i` of a secondary cluster has started `diffs` Merkle diffs since it started;
    /// its batch held `gone` answers saying the primary no longer has the WAL asked for, and
    /// began `unmarked` (no Merkle marker stored: loading the state rebuilds the trees). Once
    /// the cluster finished its first sync, a new diff is allowed only for one of these two
    /// reasons, or while a diff started for one of them is still owed (the need is stored:
    /// a node taking over resumes it). `owe`: the batch made a diff owed without starting
    /// it (a catch-up batch, or rebuilt trees that are compared after catching up).
    fn on_diffs(
        &mut self,
        i: usize,
        diffs: u64,
        (gone, owe): (u64, bool),
        unmarked: bool,
    ) -> Checked<()> {
        let c = self.nodes[i].cluster;
        let started = diffs.saturating_sub(self.nodes[i].diffs_seen);
        self.nodes[i].diffs_seen = diffs;
        let cl = &mut self.clusters[c];
        if !cl.synced {
            return Ok(());
        }
        cl.gone += gone;
        cl.owed |= owe;
        if started == 0 {
            return Ok(());
        }
        cl.resyncs += started;
        if gone > 0 {
            cl.owed = true;
        } else if unmarked {
            cl.owed = true;
            cl.rebuilt_resyncs += started;
        } else if cl.owed {
        } else {
            return fail(
                "resume-without-resync",
                format!(
                    "node {i} of secondary cluster {c} started a Merkle diff after the \
                     cluster's first sync, although the primary never answered that the WAL \
                     it asked for is gone and its trees were not rebuilt"
                ),
            );
        }
        *self.checks.entry("resume-without-resync").or_default() += 1;
        Ok(())
    }

    /// The open batch of node `i` reaches its cluster's store: committed under the node's
    /// fence (or refused), then its outputs are released.
    pub(super) fn commit(&mut self, i: usize, batch: u64) -> Checked<()> {
        let now = self.now;
        let cut = self.nodes[i].store_cut_until > now;
        let local = self.local_now(i);
        let c = self.nodes[i].cluster;
        let h = &mut self.nodes[i];
        if !h.host.is_open_batch(batch) {
            return Ok(());
        }
        let Some(n) = h.host.node_mut() else {
            return Ok(());
        };
        let fence = n.fence();
        let dirty = n.storage().is_dirty();
        if cut {
            // The commit cannot reach the store: nothing of the batch is applied.
            n.storage_mut().rollback();
        }
        let epoch_before = self.clusters[c].store.borrow().epoch();
        let Some((committed, held)) = h.host.commit() else {
            return Ok(());
        };
        let Some(n) = h.host.node_mut() else {
            return Ok(());
        };
        let result = if cut && dirty {
            Err("the store is unreachable".to_string())
        } else {
            match committed {
                Ok(_) if dirty => {
                    if let Fence::Epoch(e) = fence {
                        *self.checks.entry("fenced-commits").or_default() += 1;
                        let cl = &mut self.clusters[c];
                        if e < cl.highest_epoch_committed {
                            return fail(
                                "fenced-commits",
                                format!(
                                    "node {i} committed a batch under epoch {e} after a batch \
                                     under epoch {} was committed to cluster {c}'s store \
                                     (store epoch {epoch_before})",
                                    cl.highest_epoch_committed
                                ),
                            );
                        }
                        cl.highest_epoch_committed = e;
                        // What the active node serves from memory (Merkle trees, WAL
                        // position) is what the cluster's storage now holds.
                        if let Some(d) = n.replication().drift(n.storage()) {
                            return fail(
                                "trees-follow-storage",
                                format!(
                                    "node {i} (active in cluster {c}, epoch {e}) after batch \
                                     {batch}: {d}"
                                ),
                            );
                        }
                        *self.checks.entry("trees-follow-storage").or_default() += 1;
                        // A secondary's first sync is done once its active node committed
                        // a state that streams with no sync owed.
                        if let Some(m) = cl.mode {
                            let r = n.replication();
                            // Activated (the operator may not have heard the answer).
                            cl.enabled |= r.role(m) == Role::Secondary;
                            if r.role(m) == Role::Secondary && !r.syncing(m) {
                                // No sync owed any more.
                                cl.owed = false;
                            }
                            if !cl.synced && r.role(m) == Role::Secondary && !r.syncing(m) {
                                cl.synced = true;
                                self.trace.log(
                                    now,
                                    &format!("secondary cluster {c}: first sync done (node {i})"),
                                );
                            }
                        }
                    }
                    self.commits += 1;
                    Ok(())
                }
                Ok(_) => Ok(()),
                Err(f) => {
                    self.fenced += 1;
                    if f.held.is_some() {
                        n.storage_rolled_back();
                        n.fenced_off(local, f.current);
                    }
                    Err(f.to_string())
                }
            }
        };
        if let Err(e) = &result {
            n.storage_rolled_back();
            self.trace
                .log(now, &format!("node {i} batch {batch} not committed: {e}"));
        }
        for o in held {
            self.release(i, o, result.as_ref().err())?;
        }
        // The loop looks again: queued inputs, or else its next tick.
        self.schedule_wake(i, 0);
        Ok(())
    }

    fn release(&mut self, i: usize, o: Output, failed: Option<&String>) -> Checked<()> {
        match o {
            Output::Response(mut r) => {
                if let Some(e) = failed {
                    r = Response::error(r.id, &cairn_core::api::ApiError::Unavailable(e.clone()));
                }
                self.answer(i, r)?;
            }
            Output::Lease(op) => {
                // Lease operations run on their own connection, not in the batch.
                let cut = self.nodes[i].store_cut_until > self.now;
                let boot = self.nodes[i].host.boot();
                let c = self.nodes[i].cluster;
                let r = if cut {
                    LeaseResult {
                        op,
                        outcome: LeaseOutcome::Failed("the store is unreachable".into()),
                        leader: None,
                        nodes: vec![],
                    }
                } else {
                    let who = self.nodes[i].identity.clone();
                    let store = self.clusters[c].store.clone();
                    let r = store.borrow_mut().lease_op(self.now, &who, op, TTL);
                    if let LeaseOutcome::Acquired { epoch } = r.outcome {
                        self.clusters[c].failovers += 1;
                        self.trace.log(
                            self.now,
                            &format!("node {i} took cluster {c}'s lease, epoch {epoch}"),
                        );
                    }
                    r
                };
                let d = 1 + self.rng.delay(2);
                self.at(d, Ev::LeaseAnswer(i, boot, r));
            }
            Output::Forward(f) => {
                let id = f.req.id;
                let boot = self.nodes[i].host.boot();
                if !self.forwarded_seen.insert((i, boot, id)) {
                    return fail(
                        "forward-at-most-once",
                        format!("node {i} forwarded its request {id} twice"),
                    );
                }
                self.count("forward-at-most-once");
                let c = self.nodes[i].cluster;
                let target = self.clusters[c]
                    .nodes
                    .iter()
                    .copied()
                    .find(|&j| self.nodes[j].identity.cluster_addr == f.to);
                let cut = |w: &HaWorld, j: usize| w.nodes[j].peers_cut_until > w.now;
                match target {
                    Some(j) if !cut(self, i) && !cut(self, j) && self.nodes[j].host.is_up() => {
                        let mut req = f.req;
                        req.id = self.next_id;
                        self.next_id += 1;
                        self.nodes[j]
                            .waiting
                            .insert(req.id, Caller::Forwarded(i, id, boot));
                        let jboot = self.nodes[j].host.boot();
                        let d = 1 + self.rng.delay(2);
                        self.at(d, Ev::Deliver(j, jboot, Input::Request(req)));
                    }
                    _ => {
                        let d = 1 + self.rng.delay(2);
                        let input = Input::Forwarded {
                            id,
                            result: Err("the active node cannot be reached".into()),
                        };
                        self.at(d, Ev::Deliver(i, boot, input));
                    }
                }
            }
            Output::ForwardRoute(r) => self.route_published(i, r),
            Output::PeerSend(s) => self.route_peer_send(i, s),
            Output::PeerResponse(r) => self.route_peer_response(i, r, failed.is_some()),
            Output::HttpCall(c) => self.route_http_call(i, c),
            _ => {}
        }
        Ok(())
    }
}
