//! High availability inside one cluster: which of the cluster's nodes is the active one.
//!
//! The nodes of an HA cluster share one storage (PostgreSQL in the shell, a simulated shared
//! store in the simulator). Leadership is a lease kept in that storage. This module is a
//! node's side of it, a state machine without I/O:
//!
//! * it asks the driver to acquire, renew or release the lease ([`LeaseOp`], carried by
//!   `Output::Lease`) and learns the outcome ([`LeaseResult`], carried by `Input::Lease`);
//! * it names the [`Fence`] every batch must be committed under: the store checks the
//!   lease's epoch inside the commit's own transaction and refuses the whole batch when it
//!   moved on, so a deposed node cannot commit, whatever its timing;
//! * it steps down by itself when it has not renewed the lease for most of its time to live,
//!   so a paused or cut-off node stops serving before another node can take over;
//! * on a standby it decides which requests are answered locally ([`served_locally`]) and
//!   signs the ones it forwards to the active ([`forward_mac`]) with a key derived from the
//!   barrier key and the cluster CA's seed ([`route::signing_key`]), which only the
//!   cluster's unsealed nodes hold, over a stamp the active node takes only once ([`replay`]).

pub mod replay;
pub mod route;
pub mod store;
pub mod wire;

use crate::crypto;
use crate::time::Millis;

/// HA settings of a node (from the storage stanza's `ha_enabled` and the `api_addr` /
/// `cluster_addr` settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaConfig {
    /// The address clients reach this node's API at (`leader_address` when it is active).
    pub api_addr: String,
    /// The address of this node's cluster listener (`leader_cluster_address`).
    pub cluster_addr: String,
    /// How long the lease lasts without a renewal.
    pub lease_ttl_ms: Millis,
    /// How often a standby tries to take a free lease.
    pub retry_ms: Millis,
    /// How long a node that stepped down leaves the lease to the others.
    pub step_down_hold_ms: Millis,
}

impl HaConfig {
    pub fn new(api_addr: &str, cluster_addr: &str) -> HaConfig {
        HaConfig {
            api_addr: api_addr.into(),
            cluster_addr: cluster_addr.into(),
            lease_ttl_ms: 10_000,
            retry_ms: 500,
            step_down_hold_ms: 10_000,
        }
    }

    /// A renewal is due this long after the last one.
    fn renew_every(&self) -> Millis {
        (self.lease_ttl_ms / 4).max(1)
    }

    /// An active node that has not renewed for this long steps down by itself: well before
    /// the store lets another node take the lease.
    fn give_up_after(&self) -> Millis {
        (self.lease_ttl_ms * 3 / 4).max(1)
    }
}

/// The holder of the lease as the store reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    pub node_id: String,
    pub api_addr: String,
    pub cluster_addr: String,
    pub epoch: u64,
    /// When the holder took the lease (the store's clock, milliseconds since the epoch).
    pub since_ms: Millis,
}

/// A node of the cluster as it last announced itself to the store (`sys/ha-status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub node_id: String,
    pub api_addr: String,
    pub cluster_addr: String,
    pub version: String,
    /// The store's time of the node's last announcement.
    pub last_echo_ms: Millis,
}

/// What the node asks of the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseOp {
    /// Take the lease if it is free or has expired (a new epoch).
    Acquire,
    /// Extend the lease held under `epoch`.
    Renew { epoch: u64 },
    /// Give up the lease held under `epoch` (step-down, seal, shutdown).
    Release { epoch: u64 },
    /// Only read who holds the lease (a standby that may not take it yet still learns where
    /// to forward), and announce this node.
    Observe,
}

/// The outcome of a [`LeaseOp`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// The lease is this node's under the new `epoch`.
    Acquired { epoch: u64 },
    /// Another node holds the lease (`LeaseResult::leader` names it, if known).
    Busy,
    /// The renewal extended the lease.
    Renewed,
    /// The renewal found the lease gone to another epoch: this node is deposed.
    Lost,
    /// The lease was given up.
    Released,
    /// The lease was read (`LeaseResult::leader`).
    Observed,
    /// The store could not be asked (unreachable, timed out): nothing is known.
    Failed(String),
}

/// The answer to a [`LeaseOp`], with what the store said about the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseResult {
    pub op: LeaseOp,
    pub outcome: LeaseOutcome,
    /// The lease's holder after the operation, when the store could tell.
    pub leader: Option<Leader>,
    /// The cluster's nodes as the store knows them.
    pub nodes: Vec<Peer>,
}

/// Under which condition the driver may commit a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// No HA: commit as always.
    None,
    /// Commit only if the lease is still at this epoch (checked in the commit's transaction).
    Epoch(u64),
    /// A standby: it must not write at all; a non-empty batch is refused.
    Standby,
    /// A sealed node of an HA cluster: the only thing it writes is the cluster's
    /// initialisation, applied only if no node initialised the store meanwhile (checked
    /// under a lock in the commit's transaction, so two racing `sys/init` calls cannot both
    /// succeed).
    Initialize,
}

/// A role change the node must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    BecameActive { epoch: u64 },
    BecameStandby { reason: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Standby,
    Active { epoch: u64, since: Millis },
}

/// The node's HA state. Without a [`HaConfig`] the node is alone: always active, unfenced.
#[derive(Debug, Clone)]
pub struct Ha {
    cfg: Option<HaConfig>,
    role: Role,
    leader: Option<Leader>,
    nodes: Vec<Peer>,
    /// The operation the driver is running and when it was asked for.
    in_flight: Option<(LeaseOp, Millis)>,
    /// When the last successful renewal (or the acquisition) was asked for.
    renewed_at: Millis,
    /// No acquisition before this time (after a step-down, or between attempts).
    next_acquire: Millis,
    /// When a standby held off from the lease next reads who holds it.
    next_look: Millis,
}

impl Ha {
    pub fn new(cfg: Option<HaConfig>) -> Ha {
        Ha {
            cfg,
            role: Role::Standby,
            leader: None,
            nodes: Vec::new(),
            in_flight: None,
            renewed_at: 0,
            next_acquire: 0,
            next_look: 0,
        }
    }

    /// Whether this node is part of an HA cluster.
    pub fn enabled(&self) -> bool {
        self.cfg.is_some()
    }

    pub fn config(&self) -> Option<&HaConfig> {
        self.cfg.as_ref()
    }

    /// An HA node that does not hold the lease: it serves only the node-local endpoints
    /// and forwards everything else.
    pub fn is_standby(&self) -> bool {
        self.cfg.is_some() && self.role == Role::Standby
    }

    /// The epoch this node holds the lease under, if it is an active HA node.
    pub fn epoch(&self) -> Option<u64> {
        match self.role {
            Role::Active { epoch, .. } if self.cfg.is_some() => Some(epoch),
            _ => None,
        }
    }

    /// When this node became active.
    pub fn active_since(&self) -> Option<Millis> {
        match self.role {
            Role::Active { since, .. } => Some(since),
            Role::Standby => None,
        }
    }

    /// The holder of the lease as last reported.
    pub fn leader(&self) -> Option<&Leader> {
        self.leader.as_ref()
    }

    /// The cluster's nodes as last reported.
    pub fn nodes(&self) -> &[Peer] {
        &self.nodes
    }

    pub fn fence(&self) -> Fence {
        match (&self.cfg, self.role) {
            (None, _) => Fence::None,
            (Some(_), Role::Active { epoch, .. }) => Fence::Epoch(epoch),
            (Some(_), Role::Standby) => Fence::Standby,
        }
    }

    /// When the node next wants a tick for its lease.
    pub fn next_wake(&self, unsealed: bool) -> Option<Millis> {
        let cfg = self.cfg.as_ref()?;
        if self.in_flight.is_some() {
            // A stuck operation is given up after a lease's time; the give-up deadline of an
            // active node still applies.
            return match self.role {
                Role::Active { .. } => Some(self.renewed_at + cfg.give_up_after()),
                Role::Standby => self.in_flight.map(|(_, at)| at + cfg.lease_ttl_ms),
            };
        }
        match self.role {
            Role::Active { .. } => Some(self.renewed_at + cfg.renew_every()),
            Role::Standby if unsealed => Some(self.next_acquire.min(self.next_look)),
            Role::Standby => None,
        }
    }

    /// Time passed: the lease operation now due, and a role change if the node gave up.
    pub fn tick(&mut self, now: Millis, unsealed: bool) -> (Option<LeaseOp>, Option<Change>) {
        let Some(cfg) = self.cfg.clone() else {
            return (None, None);
        };
        let mut change = None;
        if let Role::Active { epoch, .. } = self.role {
            if now >= self.renewed_at + cfg.give_up_after() {
                let reason = format!(
                    "the leadership lease (epoch {epoch}) was not renewed for {} ms; this node \
                     stepped down before another node may take the lease",
                    now - self.renewed_at
                );
                self.depose(now, &cfg);
                change = Some(Change::BecameStandby { reason });
            }
        }
        if let Some((_, at)) = self.in_flight {
            if now < at + cfg.lease_ttl_ms {
                return (None, change);
            }
            // The driver never answered: ask again.
            self.in_flight = None;
        }
        let op = match self.role {
            Role::Active { epoch, .. } if now >= self.renewed_at + cfg.renew_every() => {
                Some(LeaseOp::Renew { epoch })
            }
            Role::Standby if unsealed && now >= self.next_acquire => Some(LeaseOp::Acquire),
            // Held off from the lease (after a step-down): still look where it is.
            Role::Standby if unsealed && now >= self.next_look => {
                self.next_look = now + cfg.retry_ms;
                Some(LeaseOp::Observe)
            }
            _ => None,
        };
        if let Some(op) = op {
            self.in_flight = Some((op, now));
        }
        (op, change)
    }

    /// The driver's answer to the operation in flight.
    pub fn on_result(&mut self, now: Millis, r: LeaseResult) -> Option<Change> {
        let cfg = self.cfg.clone()?;
        let asked_at = match self.in_flight {
            Some((op, at)) if op == r.op => {
                self.in_flight = None;
                at
            }
            // Not the operation in flight (answered after it was given up): only a release
            // or a loss still tells something true.
            _ => now,
        };
        if !matches!(r.outcome, LeaseOutcome::Failed(_)) {
            self.nodes = r.nodes;
            self.leader = r.leader;
        }
        match (r.op, r.outcome, self.role) {
            (LeaseOp::Acquire, LeaseOutcome::Acquired { epoch }, Role::Standby) => {
                self.role = Role::Active { epoch, since: now };
                self.renewed_at = asked_at;
                Some(Change::BecameActive { epoch })
            }
            (LeaseOp::Acquire, LeaseOutcome::Acquired { epoch }, Role::Active { .. }) => {
                // Cannot happen with one operation in flight; keep the newer epoch.
                self.role = Role::Active { epoch, since: now };
                self.renewed_at = asked_at;
                None
            }
            (LeaseOp::Acquire, LeaseOutcome::Busy | LeaseOutcome::Failed(_), _) => {
                self.next_acquire = now + cfg.retry_ms;
                None
            }
            (LeaseOp::Renew { epoch }, LeaseOutcome::Renewed, Role::Active { epoch: e, .. })
                if epoch == e =>
            {
                self.renewed_at = self.renewed_at.max(asked_at);
                None
            }
            (LeaseOp::Renew { epoch }, LeaseOutcome::Lost, Role::Active { epoch: e, .. })
                if epoch == e =>
            {
                self.depose(now, &cfg);
                Some(Change::BecameStandby {
                    reason: format!(
                        "the leadership lease moved on from epoch {epoch}: another node is active"
                    ),
                })
            }
            (LeaseOp::Renew { .. }, LeaseOutcome::Failed(e), Role::Active { .. }) => {
                // Retry at once; the give-up deadline decides when to stop trying.
                log::warn!("leadership lease renewal failed (will retry): {e}");
                None
            }
            _ => None,
        }
    }

    /// A forward to the leader failed: read the lease again at once (it may have moved).
    pub fn look_now(&mut self, now: Millis) {
        if self.cfg.is_some() && self.role == Role::Standby {
            self.next_look = self.next_look.min(now);
        }
    }

    /// The store refused a commit under this node's epoch: another node holds the lease.
    /// The node is deposed at once (without waiting for its next renewal to tell it).
    pub fn fenced_off(&mut self, now: Millis, current: u64) -> Option<Change> {
        let cfg = self.cfg.clone()?;
        let Role::Active { epoch, .. } = self.role else {
            return None;
        };
        if current == epoch {
            return None;
        }
        self.depose(now, &cfg);
        Some(Change::BecameStandby {
            reason: format!(
                "the store refused a commit under epoch {epoch}: the lease is at epoch {current}"
            ),
        })
    }

    /// The node leaves the lease (step-down or seal): the release to ask for, if it held it.
    pub fn release(&mut self, now: Millis) -> Option<LeaseOp> {
        let cfg = self.cfg.clone()?;
        let Role::Active { epoch, .. } = self.role else {
            return None;
        };
        self.depose(now, &cfg);
        self.next_acquire = now + cfg.step_down_hold_ms;
        let op = LeaseOp::Release { epoch };
        self.in_flight = Some((op, now));
        Some(op)
    }

    fn depose(&mut self, now: Millis, cfg: &HaConfig) {
        self.role = Role::Standby;
        self.in_flight = None;
        self.next_acquire = now + cfg.retry_ms;
        // Look at once where the lease went: requests are forwarded there.
        self.next_look = now;
        if self
            .leader
            .as_ref()
            .is_some_and(|l| l.node_id.is_empty() || l.cluster_addr == cfg.cluster_addr)
        {
            self.leader = None;
        }
    }
}

/// The endpoints a standby answers itself; it forwards every other request to the active.
pub fn served_locally(path: &str) -> bool {
    matches!(
        path.trim_end_matches('/'),
        "sys/health"
            | "sys/seal-status"
            | "sys/init"
            | "sys/unseal"
            | "sys/leader"
            | "sys/storage/raft/snapshot"
            | "sys/storage/raft/snapshot-force"
    )
}

/// What a forwarded request is signed over: every part the active acts on.
pub(crate) fn forward_message(req: &crate::api::Request) -> Vec<u8> {
    let mut m = Vec::with_capacity(req.body.len() + 256);
    let mut field = |b: &[u8]| {
        m.extend_from_slice(&(b.len() as u64).to_be_bytes());
        m.extend_from_slice(b);
    };
    field(format!("{:?}", req.method).as_bytes());
    field(req.path.as_bytes());
    for (k, v) in &req.query {
        field(k.as_bytes());
        field(v.as_bytes());
    }
    field(b"|");
    for h in [&req.token, &req.namespace, &req.wrap_ttl, &req.index] {
        match h {
            Some(v) => {
                field(b"1");
                field(v.as_bytes());
            }
            None => field(b"0"),
        }
    }
    field(req.remote_addr.as_bytes());
    field(&req.body);
    // What the active node acts on besides the above (whether to forward on to the
    // primary; the check of a PATCH's body): signed too, so a forward cannot be altered
    // in them (the `forwarded_request` fuzz target found both unsigned).
    match &req.content_type {
        Some(v) => {
            field(b"1");
            field(v.as_bytes());
        }
        None => field(b"0"),
    }
    field(if req.forward_inconsistent { b"1" } else { b"0" });
    m
}

/// The `forwarded` value a standby puts on a request it forwards with `stamp`: the stamp
/// and an HMAC-SHA256 of both under the cluster's `signing_key` ([`route::signing_key`]),
/// so only a node unsealed with the cluster's keys, reading its storage, can make one.
pub fn forward_mac(
    signing_key: &[u8; 32],
    stamp: &replay::Stamp,
    req: &crate::api::Request,
) -> String {
    stamp.render(&route::mac(signing_key, stamp, req))
}

/// The stamp of `forwarded` when it is a signature of `req` with it (constant-time), `None`
/// when it is not.
pub fn forward_mac_ok(
    signing_key: &[u8; 32],
    req: &crate::api::Request,
    forwarded: &str,
) -> Option<replay::Stamp> {
    let (stamp, mac) = replay::Stamp::parse(forwarded)?;
    let want = route::mac(signing_key, &stamp, req);
    crypto::ct_eq(want.as_bytes(), mac.as_bytes()).then_some(stamp)
}

#[cfg(test)]
mod node_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> HaConfig {
        HaConfig::new("http://127.0.0.1:8200", "127.0.0.1:8201")
    }

    fn res(op: LeaseOp, outcome: LeaseOutcome) -> LeaseResult {
        LeaseResult {
            op,
            outcome,
            leader: None,
            nodes: vec![],
        }
    }

    #[test]
    fn without_ha_a_node_is_unfenced_and_asks_nothing() {
        let mut h = Ha::new(None);
        assert_eq!(h.fence(), Fence::None);
        assert!(!h.is_standby());
        assert_eq!(h.tick(5_000, true), (None, None));
        assert_eq!(h.next_wake(true), None);
    }

    #[test]
    fn a_sealed_standby_does_not_ask_for_the_lease() {
        let mut h = Ha::new(Some(cfg()));
        assert_eq!(h.fence(), Fence::Standby);
        assert_eq!(h.tick(0, false), (None, None));
        assert_eq!(h.tick(0, true).0, Some(LeaseOp::Acquire));
    }

    #[test]
    fn acquire_renew_and_lose() {
        let mut h = Ha::new(Some(cfg()));
        let (op, _) = h.tick(1_000, true);
        assert_eq!(op, Some(LeaseOp::Acquire));
        // One operation at a time.
        assert_eq!(h.tick(1_100, true).0, None);
        let c = h.on_result(
            1_200,
            res(LeaseOp::Acquire, LeaseOutcome::Acquired { epoch: 7 }),
        );
        assert_eq!(c, Some(Change::BecameActive { epoch: 7 }));
        assert_eq!(h.fence(), Fence::Epoch(7));
        assert_eq!(h.next_wake(true), Some(1_000 + 2_500));
        assert_eq!(h.tick(3_499, true).0, None);
        assert_eq!(h.tick(3_500, true).0, Some(LeaseOp::Renew { epoch: 7 }));
        assert_eq!(
            h.on_result(
                3_600,
                res(LeaseOp::Renew { epoch: 7 }, LeaseOutcome::Renewed)
            ),
            None
        );
        let (op, _) = h.tick(6_000, true);
        assert_eq!(op, Some(LeaseOp::Renew { epoch: 7 }));
        let c = h.on_result(6_100, res(LeaseOp::Renew { epoch: 7 }, LeaseOutcome::Lost));
        assert!(matches!(c, Some(Change::BecameStandby { .. })));
        assert_eq!(h.fence(), Fence::Standby);
    }

    #[test]
    fn an_active_node_that_cannot_renew_steps_down_before_the_lease_ends() {
        let mut h = Ha::new(Some(cfg()));
        h.tick(0, true);
        h.on_result(
            10,
            res(LeaseOp::Acquire, LeaseOutcome::Acquired { epoch: 1 }),
        );
        // Renewals fail (the store is cut off) until the give-up deadline.
        let mut now = 2_500;
        let mut stepped = None;
        while now <= 10_000 {
            let (op, change) = h.tick(now, true);
            if let Some(c) = change {
                stepped = Some((now, c));
                break;
            }
            if let Some(op) = op {
                h.on_result(now, res(op, LeaseOutcome::Failed("unreachable".into())));
            }
            now += 100;
        }
        let (at, c) = stepped.expect("stepped down");
        assert!(matches!(c, Change::BecameStandby { .. }));
        // 3/4 of the 10 s lease after the acquisition was asked for, before the store's
        // expiry at 10 s.
        assert_eq!(at, 7_500);
        assert_eq!(h.fence(), Fence::Standby);
    }

    #[test]
    fn a_paused_node_steps_down_at_its_first_tick_after_the_pause() {
        let mut h = Ha::new(Some(cfg()));
        h.tick(0, true);
        h.on_result(
            10,
            res(LeaseOp::Acquire, LeaseOutcome::Acquired { epoch: 3 }),
        );
        // Paused for a minute: the first tick after the pause steps down, and asks for
        // nothing under the old epoch.
        let (op, change) = h.tick(60_000, true);
        assert!(matches!(change, Some(Change::BecameStandby { .. })));
        assert_ne!(op, Some(LeaseOp::Renew { epoch: 3 }));
        assert_eq!(h.fence(), Fence::Standby);
    }

    #[test]
    fn a_step_down_releases_and_holds_off() {
        let mut h = Ha::new(Some(cfg()));
        h.tick(0, true);
        h.on_result(
            10,
            res(LeaseOp::Acquire, LeaseOutcome::Acquired { epoch: 2 }),
        );
        assert_eq!(h.release(100), Some(LeaseOp::Release { epoch: 2 }));
        assert!(h.is_standby());
        h.on_result(
            120,
            res(LeaseOp::Release { epoch: 2 }, LeaseOutcome::Released),
        );
        // Held off: it only looks where the lease is.
        let (op, _) = h.tick(5_000, true);
        assert_eq!(op, Some(LeaseOp::Observe));
        h.on_result(5_010, res(LeaseOp::Observe, LeaseOutcome::Observed));
        assert_eq!(h.tick(5_020, true).0, None);
        assert_eq!(h.tick(10_100, true).0, Some(LeaseOp::Acquire));
    }

    #[test]
    fn a_late_answer_to_a_given_up_renewal_does_not_revive_the_node() {
        let mut h = Ha::new(Some(cfg()));
        h.tick(0, true);
        h.on_result(
            10,
            res(LeaseOp::Acquire, LeaseOutcome::Acquired { epoch: 4 }),
        );
        let (op, _) = h.tick(2_500, true);
        assert_eq!(op, Some(LeaseOp::Renew { epoch: 4 }));
        let (_, change) = h.tick(8_000, true);
        assert!(change.is_some());
        h.on_result(
            8_100,
            res(LeaseOp::Renew { epoch: 4 }, LeaseOutcome::Renewed),
        );
        assert_eq!(h.fence(), Fence::Standby);
    }

    #[test]
    fn forwarded_requests_are_signed_over_every_part() {
        let key = [7u8; 32];
        let mut r = crate::api::Request::new(1, crate::api::Method::Put, "secret/a");
        r.token = Some("s.abc".into());
        r.body = br#"{"v":1}"#.to_vec();
        let stamp = replay::Stamp {
            epoch: 2,
            sender: "ab".into(),
            seq: 1,
        };
        let mac = forward_mac(&key, &stamp, &r);
        assert_eq!(forward_mac_ok(&key, &r, &mac), Some(stamp));
        assert!(forward_mac_ok(&[8u8; 32], &r, &mac).is_none());
        let mut changed = r.clone();
        changed.body = br#"{"v":2}"#.to_vec();
        assert!(forward_mac_ok(&key, &changed, &mac).is_none());
        let mut changed = r.clone();
        changed.token = None;
        assert!(forward_mac_ok(&key, &changed, &mac).is_none());
        let mut changed = r.clone();
        changed.path = "secret/b".into();
        assert!(forward_mac_ok(&key, &changed, &mac).is_none());
        assert!(forward_mac_ok(&key, &r, "").is_none());
    }

    #[test]
    fn a_standby_answers_only_the_node_local_endpoints() {
        for p in [
            "sys/health",
            "sys/seal-status",
            "sys/unseal",
            "sys/leader",
            "sys/init",
        ] {
            assert!(served_locally(p), "{p}");
        }
        for p in [
            "secret/a",
            "sys/mounts",
            "auth/ldap/login/x",
            "sys/step-down",
        ] {
            assert!(!served_locally(p), "{p}");
        }
    }
}
