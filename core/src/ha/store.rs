//! The model of an HA cluster's shared store: the data every node of the cluster reads and
//! the active node writes, the leadership lease, the nodes' announcements, and the fenced
//! commit. It states the semantics the shell's PostgreSQL tables implement, and serves the
//! simulator and the core's tests as that store.
//!
//! * The lease is one row: an epoch, a holder and an expiry on the store's own clock. It can
//!   be taken when it is free or expired (the epoch goes up), renewed only by its holder
//!   under its epoch, released by its holder.
//! * A commit names a [`Fence`]: under `Epoch(e)` the store applies the batch only if the
//!   lease is still at epoch `e`, checked in the same step as the writes (PostgreSQL: the
//!   lease row locked in the commit's transaction), so a node deposed while it was paused
//!   or cut off cannot write once another node holds a newer epoch.

use super::{Fence, Leader, LeaseOp, LeaseOutcome, LeaseResult, Peer};
use crate::storage::Write;
use crate::time::Millis;
use std::collections::BTreeMap;

/// Who asks the store: a node's identity and addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    pub node_id: String,
    pub api_addr: String,
    pub cluster_addr: String,
    pub version: String,
}

/// A commit the store refused because the lease moved on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fenced {
    /// The epoch the committing node believed it held (`None`: a standby).
    pub held: Option<u64>,
    /// The lease's epoch at the commit.
    pub current: u64,
}

impl std::fmt::Display for Fenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.held {
            Some(h) => write!(
                f,
                "this node lost the leadership of its cluster (it held epoch {h}, the lease is \
                 at epoch {}): the write was not applied",
                self.current
            ),
            None => write!(
                f,
                "this node is a standby: it does not write to the cluster's storage"
            ),
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Lease {
    epoch: u64,
    holder: Option<NodeIdentity>,
    since: Millis,
    expires: Millis,
}

/// The shared store of one HA cluster.
#[derive(Debug, Clone, Default)]
pub struct LeaseStore {
    /// The committed data.
    pub data: BTreeMap<String, Vec<u8>>,
    lease: Lease,
    nodes: BTreeMap<String, Peer>,
    /// A planted bug for the simulator's self-check: commits skip the epoch check.
    pub skip_fence_check: bool,
    /// Reads of committed data fail, as with a database that cannot be reached (tests).
    pub unreadable: bool,
}

impl LeaseStore {
    pub fn new() -> LeaseStore {
        LeaseStore::default()
    }

    /// The lease's current epoch.
    pub fn epoch(&self) -> u64 {
        self.lease.epoch
    }

    /// The lease's holder, if it has one and it has not expired at `now`.
    pub fn holder(&self, now: Millis) -> Option<&NodeIdentity> {
        self.lease
            .holder
            .as_ref()
            .filter(|_| now < self.lease.expires)
    }

    fn leader(&self) -> Option<Leader> {
        self.lease.holder.as_ref().map(|h| Leader {
            node_id: h.node_id.clone(),
            api_addr: h.api_addr.clone(),
            cluster_addr: h.cluster_addr.clone(),
            epoch: self.lease.epoch,
            since_ms: self.lease.since,
        })
    }

    /// Runs a lease operation for `who` at the store's time `now`. Every operation also
    /// records `who`'s announcement (its last echo).
    pub fn lease_op(
        &mut self,
        now: Millis,
        who: &NodeIdentity,
        op: LeaseOp,
        ttl: Millis,
    ) -> LeaseResult {
        self.nodes.insert(
            who.node_id.clone(),
            Peer {
                node_id: who.node_id.clone(),
                api_addr: who.api_addr.clone(),
                cluster_addr: who.cluster_addr.clone(),
                version: who.version.clone(),
                last_echo_ms: now,
            },
        );
        let mine = self
            .lease
            .holder
            .as_ref()
            .is_some_and(|h| h.node_id == who.node_id);
        let outcome = match op {
            LeaseOp::Acquire => {
                let free = self.lease.holder.is_none() || now >= self.lease.expires;
                if free {
                    self.lease.epoch += 1;
                    self.lease.holder = Some(who.clone());
                    self.lease.since = now;
                    self.lease.expires = now + ttl;
                    LeaseOutcome::Acquired {
                        epoch: self.lease.epoch,
                    }
                } else {
                    LeaseOutcome::Busy
                }
            }
            LeaseOp::Renew { epoch } => {
                if mine && self.lease.epoch == epoch {
                    self.lease.expires = now + ttl;
                    LeaseOutcome::Renewed
                } else {
                    LeaseOutcome::Lost
                }
            }
            LeaseOp::Release { epoch } => {
                // A release moves the epoch on, so the holder's own late commits are
                // refused from now on.
                if mine && self.lease.epoch == epoch {
                    self.lease.epoch += 1;
                    self.lease.holder = None;
                    self.lease.expires = now;
                }
                LeaseOutcome::Released
            }
            LeaseOp::Observe => LeaseOutcome::Observed,
        };
        LeaseResult {
            op,
            outcome,
            leader: self.leader().filter(|_| now < self.lease.expires),
            nodes: self.nodes.values().cloned().collect(),
        }
    }

    /// Applies a batch of writes under `fence`, all or nothing.
    pub fn commit(&mut self, fence: Fence, writes: &[Write]) -> Result<(), Fenced> {
        if writes.is_empty() {
            return Ok(());
        }
        match fence {
            Fence::None => {}
            Fence::Standby => {
                return Err(Fenced {
                    held: None,
                    current: self.lease.epoch,
                })
            }
            Fence::Epoch(e) if e != self.lease.epoch && !self.skip_fence_check => {
                return Err(Fenced {
                    held: Some(e),
                    current: self.lease.epoch,
                })
            }
            Fence::Epoch(_) => {}
            Fence::Initialize if self.data.contains_key(crate::seal::SEAL_CONFIG_KEY) => {
                return Err(Fenced {
                    held: None,
                    current: self.lease.epoch,
                })
            }
            Fence::Initialize => {}
        }
        for (k, v) in writes {
            match v {
                Some(v) => {
                    self.data.insert(k.clone(), v.clone());
                }
                None => {
                    self.data.remove(k);
                }
            }
        }
        Ok(())
    }
}

/// One node's handle on its cluster's [`LeaseStore`]: reads see the store's committed data
/// under the node's own uncommitted writes; [`SharedStorage::commit`] applies them under a
/// fence, all or nothing, as the shell's batch transaction does.
#[derive(Debug, Clone)]
pub struct SharedStorage {
    pub store: std::rc::Rc<std::cell::RefCell<LeaseStore>>,
    pending: BTreeMap<String, Option<Vec<u8>>>,
}

impl SharedStorage {
    pub fn new(store: std::rc::Rc<std::cell::RefCell<LeaseStore>>) -> SharedStorage {
        SharedStorage {
            store,
            pending: BTreeMap::new(),
        }
    }

    /// Whether writes wait for a commit.
    pub fn is_dirty(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Commits the uncommitted writes under `fence`; refused, they are dropped.
    pub fn commit(&mut self, fence: Fence) -> Result<usize, Fenced> {
        let writes: Vec<Write> = std::mem::take(&mut self.pending).into_iter().collect();
        self.store.borrow_mut().commit(fence, &writes)?;
        Ok(writes.len())
    }

    /// Drops the uncommitted writes (a crash, a rolled-back batch).
    pub fn rollback(&mut self) -> usize {
        std::mem::take(&mut self.pending).len()
    }
}

impl crate::storage::Storage for SharedStorage {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, crate::storage::StorageError> {
        if let Some(v) = self.pending.get(key) {
            return Ok(v.clone());
        }
        let store = self.store.borrow();
        if store.unreadable {
            return Err(crate::storage::StorageError::Io(
                "the database cannot be reached".into(),
            ));
        }
        Ok(store.data.get(key).cloned())
    }
    fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, crate::storage::StorageError> {
        let store = self.store.borrow();
        let mut m: BTreeMap<String, Vec<u8>> = store
            .data
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (k, v) in self
            .pending
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
        {
            match v {
                Some(v) => {
                    m.insert(k.clone(), v.clone());
                }
                None => {
                    m.remove(k);
                }
            }
        }
        Ok(m.into_iter().collect())
    }
    fn apply(&mut self, writes: &[Write]) -> Result<(), crate::storage::StorageError> {
        for (k, v) in writes {
            self.pending.insert(k.clone(), v.clone());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(n: &str) -> NodeIdentity {
        NodeIdentity {
            node_id: n.into(),
            api_addr: format!("http://{n}:8200"),
            cluster_addr: format!("{n}:8201"),
            version: "0".into(),
        }
    }

    fn w(k: &str) -> Vec<Write> {
        vec![(k.to_string(), Some(b"v".to_vec()))]
    }

    #[test]
    fn one_holder_at_a_time_and_a_deposed_holder_cannot_commit() {
        let mut s = LeaseStore::new();
        let a = s.lease_op(0, &who("a"), LeaseOp::Acquire, 1_000);
        assert_eq!(a.outcome, LeaseOutcome::Acquired { epoch: 1 });
        let b = s.lease_op(500, &who("b"), LeaseOp::Acquire, 1_000);
        assert_eq!(b.outcome, LeaseOutcome::Busy);
        assert_eq!(b.leader.as_ref().map(|l| l.node_id.as_str()), Some("a"));
        assert!(s.commit(Fence::Epoch(1), &w("k1")).is_ok());
        // a is paused past its lease; b takes it.
        let b = s.lease_op(1_500, &who("b"), LeaseOp::Acquire, 1_000);
        assert_eq!(b.outcome, LeaseOutcome::Acquired { epoch: 2 });
        // a wakes up: its commit and its renewal are refused.
        assert_eq!(
            s.commit(Fence::Epoch(1), &w("k2")),
            Err(Fenced {
                held: Some(1),
                current: 2
            })
        );
        assert!(!s.data.contains_key("k2"));
        let r = s.lease_op(1_600, &who("a"), LeaseOp::Renew { epoch: 1 }, 1_000);
        assert_eq!(r.outcome, LeaseOutcome::Lost);
        assert!(s.commit(Fence::Epoch(2), &w("k3")).is_ok());
        // A standby writes nothing; an empty batch is fine.
        assert!(s.commit(Fence::Standby, &w("k4")).is_err());
        assert!(s.commit(Fence::Standby, &[]).is_ok());
        assert_eq!(r.nodes.len(), 2);
    }

    #[test]
    fn a_release_frees_the_lease_at_once_and_only_for_its_holder() {
        let mut s = LeaseStore::new();
        s.lease_op(0, &who("a"), LeaseOp::Acquire, 10_000);
        s.lease_op(10, &who("b"), LeaseOp::Release { epoch: 1 }, 10_000);
        assert_eq!(s.holder(20).map(|h| h.node_id.as_str()), Some("a"));
        s.lease_op(30, &who("a"), LeaseOp::Release { epoch: 1 }, 10_000);
        assert!(s.holder(40).is_none());
        assert!(s.commit(Fence::Epoch(1), &w("late")).is_err());
        let b = s.lease_op(50, &who("b"), LeaseOp::Acquire, 10_000);
        assert_eq!(b.outcome, LeaseOutcome::Acquired { epoch: 3 });
    }

    #[test]
    fn the_planted_bug_lets_a_deposed_node_write() {
        let mut s = LeaseStore::new();
        s.skip_fence_check = true;
        s.lease_op(0, &who("a"), LeaseOp::Acquire, 1_000);
        s.lease_op(2_000, &who("b"), LeaseOp::Acquire, 1_000);
        assert!(s.commit(Fence::Epoch(1), &w("k")).is_ok());
    }
}
