//! Faults of the HA tier, on the nodes of every cluster (the primary's most of the time,
//! its secondary clusters' otherwise; the active node of the cluster more often than a
//! standby): a crash (restart after a while, sealed), a pause past the lease (often between
//! a batch's handling and its commit), a cut from the cluster's store, a cut from the peers.
//! Also the operator's round: every sealed node that is up is unsealed, with the key of the
//! keyring its cluster holds (a secondary cluster holds its primary's once activated: its
//! standbys seal themselves when the keyring changes under them).

use super::{Caller, Ev, HaWorld, TTL};
use cairn_core::api::{Method, Request};
use serde_json::json;

impl HaWorld {
    pub(super) fn fault(&mut self) {
        // Faults of an active node are the ones failover is about: most faults hit one.
        let c = if self.clusters.len() > 1 && self.rng.chance(350) {
            1 + self.rng.below(self.clusters.len() as u64 - 1) as usize
        } else {
            0
        };
        let members = self.clusters[c].nodes.clone();
        let i = match self.active_of(c) {
            Some(a) if self.rng.chance(600) => a,
            _ => members[self.rng.below(members.len() as u64) as usize],
        };
        let kind = self.rng.weighted(&[3, 4, 2, 2, 3]);
        let what = match kind {
            0 => {
                if !self.nodes[i].host.is_up() {
                    return;
                }
                self.crash(i)
            }
            1 => {
                // Paused past the lease, often in the middle of a batch's commit.
                self.pauses += 1;
                let d = self.rng.range(TTL / 2, TTL * 3);
                if self.rng.chance(700) {
                    let d = d.max(TTL + 500);
                    self.nodes[i].pause_before_commit = Some(d);
                    format!("pause node {i} for {d} ms between its next write and its commit")
                } else {
                    let until = self.now + d;
                    self.nodes[i].paused_until = until;
                    self.reschedule_paused(i, until);
                    format!("pause node {i} for {d} ms")
                }
            }
            2 => {
                let d = self.rng.range(500, TTL * 2);
                self.nodes[i].store_cut_until = self.now + d;
                format!("cut node {i} from the store for {d} ms")
            }
            3 => {
                let d = self.rng.range(500, TTL * 2);
                self.nodes[i].peers_cut_until = self.now + d;
                format!("cut node {i} from its peers for {d} ms")
            }
            _ => "no fault".to_string(),
        };
        self.trace.log(self.now, &format!("{what} (cluster {c})"));
    }

    /// Crashes node `i` (up) and schedules its restart; what happened, for the trace.
    pub(super) fn crash(&mut self, i: usize) -> String {
        self.crashes += 1;
        let h = &mut self.nodes[i];
        // The node and its uncommitted writes vanish; what it held is never sent.
        let _ = h.host.crash();
        h.inbox.clear();
        let waiting = std::mem::take(&mut h.waiting);
        self.calls_broken_by_crash(i, waiting);
        let d = self.rng.range(500, 5_000);
        self.at(d, Ev::Restart(i));
        format!("crash node {i} (restart in {d} ms)")
    }

    /// Moves node `i`'s pending commit and wake-up to after its pause.
    fn reschedule_paused(&mut self, i: usize, until: u64) {
        let moved: Vec<(u64, u64)> = self
            .events
            .iter()
            .filter(|(_, e)| matches!(e, Ev::Commit(j, _) | Ev::Wake(j) if *j == i))
            .map(|(k, _)| *k)
            .collect();
        for k in moved {
            if let Some(e) = self.events.remove(&k) {
                self.seq += 1;
                self.events.insert((k.0.max(until), self.seq), e);
            }
        }
        self.nodes[i].wake_at = None;
        self.schedule_wake(i, until - self.now);
    }

    /// Node `i`'s pause, which was to last until `until`, ended now: its wake-ups and
    /// commit that the pause had put off to `until` or later happen now.
    pub(super) fn resume_now(&mut self, i: usize, until: u64) {
        let moved: Vec<(u64, u64)> = self
            .events
            .iter()
            .filter(|((t, _), e)| {
                *t >= until && matches!(e, Ev::Commit(j, _) | Ev::Wake(j) if *j == i)
            })
            .map(|(k, _)| *k)
            .collect();
        for k in moved {
            if let Some(e) = self.events.remove(&k) {
                self.seq += 1;
                self.events.insert((self.now, self.seq), e);
            }
        }
        self.nodes[i].wake_at = None;
        self.schedule_wake(i, 1);
    }

    /// Sends node `i` the unseal key of the keyring its cluster holds (a secondary's own
    /// until its activation is known; a node of a secondary whose activation the operator
    /// has not heard of yet is tried with the other key every other time).
    pub(super) fn unseal(&mut self, i: usize) {
        let c = self.nodes[i].cluster;
        let cl = &self.clusters[c];
        self.nodes[i].unseal_tries += 1;
        let other = self.nodes[i].unseal_tries.is_multiple_of(2);
        let primary = c == 0 || (cl.enabled != other);
        let key = if primary {
            self.key.clone()
        } else {
            cl.own_key.clone()
        };
        let unseal = Request::new(0, Method::Put, "sys/unseal").with_json(json!({ "key": key }));
        self.send(i, unseal, Caller::Unseal);
    }

    /// The operator's round: unseal what is sealed, then the next step of the root-token
    /// flow on the performance secondary.
    pub(super) fn operator_round(&mut self) {
        for i in 0..self.nodes.len() {
            let h = &self.nodes[i];
            let sealed = h.host.node().is_some_and(|n| n.is_sealed());
            let asked = h.waiting.values().any(|c| matches!(c, Caller::Unseal));
            if sealed && !asked {
                self.unseal(i);
            }
        }
        self.gen_root_step();
    }
}
