//! A node's part in its HA cluster: forwarding a standby's requests to the active node,
//! checking the requests forwarded to it, acting on role changes, and the HA endpoints
//! (`sys/leader`, `sys/health`'s standby answer, `sys/step-down`, `sys/ha-status`).
//! The lease itself is [`crate::ha`]'s.

use super::{Forward, Node, NodeState, Output};
use crate::api::{ApiError, ApiResult, Method, Reply, Request};
use crate::ctx::Ctx;
use crate::ha::{self, Change};
use crate::storage::Storage;
use crate::storage::Txn;
use crate::time;
use serde_json::{json, Value};

impl<S: Storage> Node<S> {
    /// Whether this request goes to the active node instead of being served here: an
    /// unsealed standby serves only the node-local endpoints.
    pub(super) fn ha_forwards(&self, req: &Request) -> bool {
        self.st.ha.is_standby() && !self.barrier.sealed() && !ha::served_locally(&req.path)
    }

    /// Sends a standby's request to the active node, signed; the answer comes back as
    /// `Input::Forwarded`.
    pub(super) fn forward(&mut self, mut req: Request) {
        let id = req.id;
        if req.forwarded.is_some() {
            // Forwarded to a node that is no longer active: never passed on again.
            return self.finish(id, Err(ha::route::not_active()));
        }
        if self.st.repl.barrier_key.is_none() || self.st.ha.leader().is_none() {
            let e = ApiError::Unavailable(
                "this node is a standby and no active node is known yet; retry shortly".into(),
            );
            return self.finish(id, Err(e));
        }
        let route = match self.forward_route() {
            Ok(route) => route,
            Err(NoRoute::NoCa) => return self.finish(id, Err(ha::route::no_cluster_ca())),
            Err(NoRoute::Storage(e)) => {
                let e = ApiError::Unavailable(format!(
                    "this node is a standby and could not read its cluster's CA from storage \
                     to forward the request ({e}); retry shortly"
                ));
                return self.finish(id, Err(e));
            }
        };
        if self.st.forward_sender.is_empty() {
            self.st.forward_sender = hex::encode(crate::crypto::random_key(&mut self.rng));
        }
        let seq = self.st.forward_seq;
        if !ha::route::sign(route.as_ref(), &self.st.forward_sender, seq, &mut req) {
            // Known leader, no route: the store still names this node as the holder.
            let e = ApiError::Unavailable(
                "this node is a standby and the active node is not known yet (the store still \
                 names this node, which gave the lease up); retry shortly"
                    .into(),
            );
            return self.finish(id, Err(e));
        }
        let Some(route) = route else { return };
        self.st.forward_seq += 1;
        self.st.forwarded.insert(id, ());
        self.st.outputs.push_back(Output::Forward(Forward {
            req,
            to: route.to,
            ca_pem: route.ca_pem,
            client: route.client,
        }));
    }

    /// The route a standby forwards requests along now: `Ok(None)` when this node forwards
    /// nothing (active, sealed, no active node known, or the store still naming this node),
    /// [`NoRoute::NoCa`] while its cluster has no CA (nothing is forwarded without the
    /// channel's TLS and the signing key bound to the CA), [`NoRoute::Storage`] when the CA
    /// could not be read. Reads the cluster CA once (kept in `forward_ca`).
    fn forward_route(&mut self) -> Result<Option<ha::route::ForwardRoute>, NoRoute> {
        if !self.st.ha.is_standby() || self.barrier.sealed() {
            return Ok(None);
        }
        let Some(leader) = self.st.ha.leader().cloned() else {
            return Ok(None);
        };
        let own = self.st.ha.config().map(|c| c.cluster_addr.as_str());
        if own == Some(leader.cluster_addr.as_str()) {
            return Ok(None);
        }
        let signing_key = self
            .read_forward_key()
            .map_err(NoRoute::Storage)?
            .ok_or(NoRoute::NoCa)?;
        if self.st.forward_ca.is_none() {
            let mut ctx = node_ctx!(self);
            let pem = crate::replication::tls::ca_pem(&mut ctx, false)
                .ok()
                .flatten();
            let client = crate::replication::tls::node_client(&mut ctx)
                .ok()
                .flatten();
            self.st.forward_ca = pem.map(|p| (p, client));
        }
        let (ca_pem, client) = self.st.forward_ca.clone().ok_or(NoRoute::NoCa)?;
        Ok(Some(ha::route::ForwardRoute {
            to: leader.cluster_addr,
            ca_pem,
            client,
            signing_key: zeroize::Zeroizing::new(signing_key),
            epoch: leader.epoch,
            // Given by `publish_route`, fresh for each route it publishes.
            sender: String::new(),
        }))
    }

    /// After an input: publishes the forward route with `Output::ForwardRoute` when it
    /// changed. Cheap when nothing it depends on changed (no storage read, no copy).
    pub(super) fn publish_route(&mut self) {
        if !self.st.ha.enabled() {
            return;
        }
        let basis = RouteBasis {
            standby: self.st.ha.is_standby(),
            sealed: self.barrier.sealed(),
            key: self.st.repl.barrier_key.clone(),
            leader: self
                .st
                .ha
                .leader()
                .map(|l| (l.cluster_addr.clone(), l.epoch)),
            ca: self.st.forward_ca.is_some(),
        };
        if self.st.route_basis.as_ref() == Some(&basis) {
            return;
        }
        let mut route = self.forward_route().ok().flatten();
        // Reading the CA changes the basis: record it as it is after the read.
        self.st.route_basis = Some(RouteBasis {
            ca: self.st.forward_ca.is_some(),
            ..basis
        });
        if let (Some(r), Some(sent)) = (route.as_mut(), self.st.route_sent.as_ref()) {
            r.sender.clone_from(&sent.sender);
        }
        if route != self.st.route_sent {
            // A new route: the driver numbers its forwards from 0 again, under a new sender.
            if let Some(r) = route.as_mut() {
                r.sender = hex::encode(crate::crypto::random_key(&mut self.rng));
            }
            self.st.route_sent.clone_from(&route);
            self.st.outputs.push_back(Output::ForwardRoute(route));
        }
    }

    /// Whether this node's barrier key still reads its cluster's data. The stored keyring
    /// changes under a standby when its cluster is made a replication secondary (the active
    /// node wipes the storage and installs the primary's keyring): the standby's key then
    /// reads nothing and anything it wrote as an active node would be unreadable to the
    /// others. Such a node seals itself (answered as sealed from now on, and the lease given
    /// back); it is unsealed again, without a restart, with the key shares of the keyring
    /// now stored: the primary cluster's. A changed keyring whose data the key still reads
    /// (a rekey re-wraps the same barrier key) is simply noted. Cheap when nothing changed:
    /// one read of the keyring.
    pub(super) fn check_keyring(&mut self) -> bool {
        if self.barrier.sealed() {
            return true;
        }
        let stored = match self.storage.get(crate::seal::KEYRING_KEY) {
            Ok(Some(k)) => k,
            // Not initialised, or storage unreachable: nothing to decide now.
            Ok(None) | Err(_) => return true,
        };
        if self.st.keyring_seen.as_deref() == Some(stored.as_slice()) {
            return true;
        }
        // Values only this cluster's barrier key decrypts: the replication roles (written
        // under the new key when a secondary is activated) and the keyring's install time.
        let probes = [
            "node/replication/performance",
            "node/replication/dr",
            crate::seal::KEY_INSTALL_TIME_KEY,
        ];
        let mut verdict = None;
        for k in probes {
            if let Ok(Some(v)) = self.storage.get(k) {
                let reads = self.barrier.decrypt(k, &v).is_some();
                verdict = Some(reads);
                if reads {
                    break;
                }
            }
        }
        match verdict {
            Some(false) => {
                log::warn!(
                    "this node's barrier key no longer reads its cluster's data: the stored \
                     keyring changed (the cluster was made a replication secondary and holds \
                     its primary's keyring now); sealing. Unseal this node with the key shares \
                     of the keyring now stored (the primary cluster's)"
                );
                self.st.seal_requested = true;
                false
            }
            Some(true) => {
                self.st.keyring_seen = Some(stored);
                true
            }
            None => true,
        }
    }

    /// The driver's commit was refused because the lease moved on to epoch `current`:
    /// this node stops acting as the active one now.
    pub fn fenced_off(&mut self, now: crate::time::Millis, current: u64) {
        self.now = self.now.max(now);
        if let Some(c) = self.st.ha.fenced_off(self.now, current) {
            self.ha_changed(c);
        }
        self.publish_route();
    }

    /// The signature a standby of this cluster puts on `req` when it forwards it to this
    /// node, with a fresh stamp of this node's epoch (`None` while sealed): what the fuzz
    /// target `forwarded_request` signs its hostile requests with, so that they get past
    /// the check to the handlers.
    pub(crate) fn forward_signature(&mut self, req: &Request) -> Option<String> {
        let key = self.forward_key()?;
        self.st.forward_seq += 1;
        let stamp = ha::replay::Stamp {
            epoch: self.st.ha.epoch().unwrap_or(0),
            sender: "f".into(),
            seq: self.st.forward_seq,
        };
        Some(ha::forward_mac(&key, &stamp, req))
    }

    /// Whether `req` carries a signature of this cluster (whatever its stamp).
    pub(crate) fn forward_signed(&mut self, req: &Request) -> bool {
        match (&req.forwarded, self.forward_key()) {
            (Some(f), Some(k)) => ha::forward_mac_ok(&k, req, f).is_some(),
            _ => false,
        }
    }

    /// What the forward signing key is derived from: the barrier key and the CA seed.
    #[cfg(test)]
    pub(crate) fn forward_key_parts(&mut self) -> ([u8; 32], Option<[u8; 32]>) {
        let barrier_key = *self.st.repl.barrier_key.clone().expect("unsealed");
        let mut ctx = node_ctx!(self);
        let seed = crate::replication::tls::ca_seed(&mut ctx).expect("read");
        (barrier_key, seed)
    }

    /// Writes a cluster CA record of `seed` as replication does (a DR secondary receiving
    /// its primary's CA), with the node's outputs left to poll.
    #[cfg(test)]
    pub(crate) fn replicate_ca(&mut self, seed: [u8; 32]) -> ApiResult<()> {
        let key = crate::replication::tls::CA_KEY;
        let rec = serde_json::to_vec(&json!({ "seed": hex::encode(seed) }))
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        let enc = self
            .barrier
            .encrypt(key, &rec, &mut self.rng)
            .ok_or(ApiError::Sealed)?;
        crate::replication::commit_changes(
            &mut self.env(),
            vec![crate::replication::Change::write(
                key.to_string(),
                Some(enc),
            )],
            crate::replication::Origin::Replication,
        )
    }

    /// This cluster's forward signing key ([`ha::route::signing_key`]): `None` while sealed,
    /// while the cluster has no CA, and when its storage cannot be read
    /// ([`Self::read_forward_key`] tells these apart).
    pub(super) fn forward_key(&mut self) -> Option<[u8; 32]> {
        self.read_forward_key().ok().flatten()
    }

    /// The forward signing key, `Ok(None)` while sealed or while the cluster has no CA, or
    /// the error reading the CA record. Kept with the stored CA record it was derived from,
    /// which is read (from the storage's cache) each time: a CA made, or replaced by a
    /// replication role change, is seen at once.
    fn read_forward_key(&mut self) -> ApiResult<Option<[u8; 32]>> {
        let Some(barrier_key) = self.st.repl.barrier_key.clone() else {
            return Ok(None);
        };
        let Some(stored) = self.storage.get(crate::replication::tls::CA_KEY)? else {
            return Ok(None);
        };
        if let Some(k) = &self.st.forward_key {
            if k.barrier_key == barrier_key && k.stored == stored {
                return Ok(Some(*k.key));
            }
        }
        let mut ctx = node_ctx!(self);
        let Some(seed) = crate::replication::tls::ca_seed(&mut ctx)? else {
            return Ok(None);
        };
        let key = ha::route::signing_key(&barrier_key, &seed);
        self.st.forward_key = Some(ForwardKey {
            barrier_key,
            stored,
            key: zeroize::Zeroizing::new(key),
        });
        Ok(Some(key))
    }

    /// A request that says it was forwarded must carry a valid signature of this cluster
    /// (and this node must be in an HA cluster) over a stamp of this node's epoch that it
    /// has not taken before; one that does not say so passes.
    pub(super) fn take_forward(&mut self, req: &Request) -> Result<(), ApiError> {
        let Some(forwarded) = &req.forwarded else {
            return Ok(());
        };
        if !self.st.ha.enabled() {
            return Err(ApiError::bad(
                "this node is not part of an HA cluster: it takes no forwarded requests",
            ));
        }
        let key = self.read_forward_key().map_err(|e| {
            ApiError::Unavailable(format!(
                "this node could not read its cluster's CA from storage to check the forwarded \
                 request ({e}); nothing was applied, retry it"
            ))
        })?;
        let stamp = key
            .and_then(|key| ha::forward_mac_ok(&key, req, forwarded))
            .ok_or_else(ha::route::bad_signature)?;
        match self.st.forwards_seen.take(self.st.ha.epoch(), &stamp) {
            ha::replay::Verdict::Fresh => Ok(()),
            ha::replay::Verdict::OtherEpoch => Err(ha::route::not_active()),
            ha::replay::Verdict::Replayed => Err(ha::route::replayed()),
            ha::replay::Verdict::Stale => Err(ha::route::stale()),
        }
    }

    /// The cluster channel's CA: the first active node creates it (a write under its epoch);
    /// its listener then serves a certificate of it, which the standbys pin when they
    /// forward, and the forward signing key is bound to its seed. Run as a node becomes
    /// active, and on its periodic tick while the CA is missing (a commit that failed), so
    /// that a cluster does not stay without one until the next change of active node.
    pub(super) fn ensure_cluster_ca(&mut self) {
        let mut ctx = node_ctx!(self);
        let created = crate::replication::tls::ca_pem(&mut ctx, true);
        let writes = ctx.txn.into_write_set();
        let fresh = !writes.writes.is_empty();
        match created.and_then(|_| self.commit(writes)) {
            // Its listener serves a certificate of the new CA from now on (the state loaded
            // when it became active announced none: there was no CA yet).
            Ok(()) if fresh => {
                if let Err(e) = crate::replication::announce_tls_now(&mut self.env()) {
                    log::warn!("the cluster listener certificate was not made: {e}");
                }
            }
            Ok(()) => {}
            Err(e) => log::warn!("the cluster CA could not be created: {e}"),
        }
    }

    /// Acts on a role change: an active node loads what it derives from storage afresh (the
    /// previous active wrote it); a deposed one answers what it was still working on with
    /// an error and forgets its derived state.
    pub(super) fn ha_changed(&mut self, c: Change) {
        self.st.forward_ca = None;
        self.st.forwards_seen.clear();
        match c {
            Change::BecameActive { epoch } => {
                if !self.check_keyring() {
                    // Sealed (and the lease given back) at the end of this input: a node
                    // whose key cannot read the cluster's data must not write any.
                    return;
                }
                log::info!("this node is now the active node of its cluster (lease epoch {epoch})");
                // What a standby derived from storage (trees, WAL position, roles) is the
                // previous active's past: reload it before this node writes anything, so
                // that its first write extends the stored trees and WAL, not a stale copy.
                self.st.repl.forget_uncommitted();
                if let Err(e) = crate::replication::ensure_loaded(&mut self.env()) {
                    log::error!("replication state not loaded: {e}");
                }
                self.ensure_cluster_ca();
                self.st.outputs.push_back(Output::HaRole(Some(epoch)));
            }
            Change::BecameStandby { reason } => {
                log::warn!("this node is now a standby: {reason}");
                let pending: Vec<_> = std::mem::take(&mut self.st.pending).into_keys().collect();
                for id in pending {
                    let e = ApiError::Unavailable(format!(
                        "this node stopped being the active node before the request finished \
                         ({reason}); it was not applied here, retry it"
                    ));
                    self.finish(id, Err(e));
                }
                // Pulls held for new entries are answered now, as a standby answers any
                // replication call.
                self.st.repl.refuse_waiters(
                    &mut self.st.outputs,
                    crate::replication::STANDBY_CODE,
                    &format!("this node stepped down while it held the pull ({reason})"),
                );
                self.st.logins = Default::default();
                self.st.repl.forget_uncommitted();
                self.st.outputs.push_back(Output::HaRole(None));
            }
        }
    }
}

/// Why a standby that knows its active node has no route to it.
enum NoRoute {
    /// Its cluster has no CA yet: nothing is forwarded until it has.
    NoCa,
    /// Its storage could not be read (the CA record).
    Storage(ApiError),
}

/// What a standby's forward route is derived from (compared after every input, so that the
/// route is computed only when one of them changed).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct RouteBasis {
    standby: bool,
    sealed: bool,
    /// Zeroed when dropped, as the route itself is.
    key: Option<zeroize::Zeroizing<[u8; 32]>>,
    leader: Option<(String, u64)>,
    ca: bool,
}

/// A cluster address as the reference shows it: a URL.
fn cluster_url(addr: &str) -> String {
    if addr.is_empty() || addr.contains("://") {
        addr.to_string()
    } else {
        format!("https://{addr}")
    }
}

/// `sys/leader`.
pub fn leader_status(st: &NodeState) -> Value {
    let ha = &st.ha;
    let Some(cfg) = ha.config() else {
        return json!({
            "ha_enabled": false,
            "is_self": true,
            "active_time": "0001-01-01T00:00:00Z",
            "leader_address": "",
            "leader_cluster_address": "",
            "performance_standby": false,
            "performance_standby_last_remote_wal": 0,
        });
    };
    let (is_self, active_time, addr, cluster) = match (ha.active_since(), ha.leader()) {
        (Some(since), _) => (
            true,
            time::rfc3339(since),
            cfg.api_addr.clone(),
            cfg.cluster_addr.clone(),
        ),
        (None, Some(l)) => (
            false,
            "0001-01-01T00:00:00Z".to_string(),
            l.api_addr.clone(),
            l.cluster_addr.clone(),
        ),
        (None, None) => (
            false,
            "0001-01-01T00:00:00Z".to_string(),
            String::new(),
            String::new(),
        ),
    };
    json!({
        "ha_enabled": true,
        "is_self": is_self,
        "active_time": active_time,
        "leader_address": addr,
        "leader_cluster_address": cluster_url(&cluster),
        "performance_standby": false,
        "performance_standby_last_remote_wal": 0,
    })
}

/// `sys/step-down` (sudo): the active node gives up the lease after this input and leaves
/// it to the others for a while. A node outside an HA cluster has nothing to give up.
pub fn step_down(st: &mut NodeState, req: &Request) -> ApiResult {
    if !req.method.is_write() {
        return Err(ApiError::MethodNotAllowed);
    }
    st.step_down_requested = true;
    Ok(Reply::Empty)
}

/// `sys/ha-status`: the cluster's nodes as they last announced themselves, each with the
/// version it runs and the one it would upgrade to (the same: Cairn has no autopilot).
pub fn ha_status(st: &NodeState, req: &Request) -> ApiResult {
    if req.method != Method::Get {
        return Err(ApiError::MethodNotAllowed);
    }
    let leader = st.ha.leader();
    let mut nodes: Vec<Value> = if !st.ha.enabled() {
        vec![json!({
            "hostname": st.config.node_id,
            "api_address": "",
            "cluster_address": "",
            "active_node": true,
            "last_echo": null,
            "version": st.config.version,
            "upgrade_version": st.config.version,
        })]
    } else {
        st.ha
            .nodes()
            .iter()
            .map(|p| {
                let active = leader.is_some_and(|l| l.node_id == p.node_id);
                json!({
                    "hostname": p.node_id,
                    "api_address": p.api_addr,
                    "cluster_address": cluster_url(&p.cluster_addr),
                    "active_node": active,
                    "last_echo": if active { Value::Null } else { json!(time::rfc3339(p.last_echo_ms)) },
                    "version": p.version,
                    "upgrade_version": p.version,
                })
            })
            .collect()
    };
    // The active node first, as the reference lists them.
    nodes.sort_by_key(|n| n["active_node"] != json!(true));
    // The reference answers the standard envelope and repeats `nodes` at its top level (as
    // `sys/mounts` repeats its table) for old clients that read it there.
    Ok(Reply::Envelope(
        json!({ "nodes": nodes.clone(), "data": { "nodes": nodes } }),
    ))
}

/// A derived forward signing key and what it was derived from ([`Node::forward_key`]);
/// both keys are zeroed when it is dropped (as the node seals).
#[derive(Clone)]
pub(crate) struct ForwardKey {
    barrier_key: zeroize::Zeroizing<[u8; 32]>,
    /// The CA record as stored (encrypted).
    stored: Vec<u8>,
    key: zeroize::Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for ForwardKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ForwardKey { <redacted> }")
    }
}
