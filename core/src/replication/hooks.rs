//! The node's entry points into replication: the commit hook every write set goes through
//! ([`commit`], [`commit_changes`]), loading what replication derives from storage
//! ([`ensure_loaded`]), the batch end and deferred Merkle flushes, the periodic poll and the
//! replies of the cluster channel, and the request gate of secondaries.

use super::*;

/// The commit hook: applies a write set of `origin` with WAL and Merkle bookkeeping.
pub fn commit(env: &mut Env, ws: WriteSet, origin: Origin) -> ApiResult<()> {
    let fresh = ws.fresh;
    let changes = ws
        .writes
        .into_iter()
        .map(|(k, v)| {
            let mut c = Change::write(k, v);
            c.fresh = fresh.contains(&c.key);
            c
        })
        .collect();
    commit_changes(env, changes, origin)
}

/// The end of a driver's batch (batched mode): answers held pulls if anything was written.
pub fn end_batch(env: &mut Env) {
    if std::mem::take(&mut env.st.repl.serve_due) {
        primary::serve_waiters(env);
    }
}

/// After a restore replaced the data and restarted the WAL: held pulls are answered (their
/// entries are gone) with the batch, or at once outside batched mode.
pub fn serve_after_restore(env: &mut Env) {
    if env.st.repl.batched {
        env.st.repl.serve_due = true;
    } else {
        primary::serve_waiters(env);
    }
}

pub fn commit_changes(env: &mut Env, changes: Vec<Change>, origin: Origin) -> ApiResult<()> {
    if changes.is_empty() {
        return Ok(());
    }
    // A cluster CA written by replication (a DR secondary's copy of its primary's, streamed
    // or synced after the activation wipe; a performance secondary's own, made as it is
    // activated) is served at once: an HA cluster's standbys read it and pin it when they
    // forward. A client's write path announces it itself.
    let new_ca = origin != Origin::Client
        && changes
            .iter()
            .any(|c| c.key == tls::CA_KEY && c.value.is_some());
    let limits = env.st.config.replication.wal;
    let staged = env
        .st
        .repl
        .stage(&*env.storage, env.barrier, limits, changes, origin)?;
    env.storage.apply(&staged.writes)?;
    if env.st.repl.install(staged) {
        if env.st.repl.batched {
            env.st.repl.serve_due = true;
        } else {
            primary::serve_waiters(env);
        }
    }
    if new_ca {
        if let Err(e) = announce_tls_now(env) {
            log::warn!("the cluster listener certificate was not made: {e}");
        }
    }
    Ok(())
}

/// Loads the Merkle trees and WAL position (rebuilding the trees from storage when they were
/// never persisted), and once unsealed the roles; starts secondaries. Called before every
/// input.
pub fn ensure_loaded(env: &mut Env) -> ApiResult<()> {
    let r = &mut env.st.repl;
    if !r.loaded {
        let marker = env.storage.get(merkle::MARKER)?;
        if marker.as_deref() != Some(merkle::VERSION) {
            let fresh = env.storage.get(crate::seal::KEYRING_KEY)?.is_none();
            if env.barrier.sealed() && !fresh {
                return Ok(());
            }
            if !env.barrier.sealed() {
                r.local_uuids = load_uuids(&*env.storage, env.barrier)?;
            }
            let trees = reindex::rebuild(&*env.storage, &r.local_uuids)?;
            // Records of an older format or of subtrees that no longer exist go first.
            let mut w: Vec<Write> = env
                .storage
                .scan(merkle::PREFIX)?
                .into_iter()
                .map(|(k, _)| (k, None))
                .collect();
            w.extend(trees.all_page_writes());
            w.push((merkle::MARKER.to_string(), Some(merkle::VERSION.to_vec())));
            env.storage.apply(&w)?;
            r.trees = trees;
            r.rebuilt = !fresh;
        } else {
            r.trees = Trees::load(&env.storage.scan(merkle::PREFIX)?);
            // Loaded from complete records: nothing was rebuilt this time (an earlier
            // rebuild's diff must not be asked for again at every reload).
            r.rebuilt = false;
        }
        r.set_wal(wal::load_meta(&*env.storage)?);
        r.loaded = true;
    }
    if !env.barrier.sealed() && !env.st.repl.roles_loaded {
        let uuids = load_uuids(&*env.storage, env.barrier)?;
        let r = &mut env.st.repl;
        r.local_uuids = uuids;
        let mut resync = Vec::new();
        for m in [Mode::Performance, Mode::Dr] {
            let key = m.role_key();
            let role: RoleState = match env.storage.get(&key)? {
                None => RoleState::default(),
                Some(b) => env
                    .barrier
                    .decrypt(&key, &b)
                    .and_then(|p| serde_json::from_slice(&p).ok())
                    .unwrap_or_default(),
            };
            let rebuilt = r.rebuilt;
            let rt = r.mode_mut(m);
            rt.role = role;
            rt.sec = SecRt::default();
            if rt.role.role == Role::Secondary && rt.role.creds.is_some() {
                rt.sec.phase = Phase::Connecting;
                rt.sec.next_at = Some(env.now);
                // Trees rebuilt from the stored data at start (after a stop with Merkle
                // records not yet written) hold whatever changed on disk behind the node's
                // back, which only the primary's roots can show: compare with them (diff and
                // sync), and until that is done the copy is not known to be complete —
                // recorded durably, so a promote meanwhile needs `force` and a restart
                // resumes the comparison. The same holds for a sync or catch-up that a stop
                // interrupted. The comparison comes after catching up with the primary
                // (streaming, or by changed keys), where the roots differ only by what the
                // primary wrote meanwhile: a diff right away would exchange the leaves of
                // every bucket written while this node was down.
                if rebuilt && !rt.role.needs_sync {
                    rt.role.needs_sync = true;
                    resync.push(m);
                }
                rt.sec.verify = rt.role.needs_sync;
            }
        }
        r.roles_loaded = true;
        let writes = resync
            .into_iter()
            .map(|m| env.role_write(m).map(|c| (c.key, c.value)))
            .collect::<ApiResult<Vec<Write>>>()?;
        if !writes.is_empty() {
            env.storage.apply(&writes)?;
        }
        sync_wal_activity(env)?;
        reindex::resume(env)?;
        announce_tls_now(env)?;
    }
    Ok(())
}

/// [`announce_tls`] over current storage: when roles are loaded, and after the cluster CA
/// was created by a node that had already loaded them (its HA cluster's first active node).
pub(crate) fn announce_tls_now(env: &mut Env) -> ApiResult<()> {
    let mut ctx = Ctx {
        txn: Txn::new(&*env.storage),
        barrier: &*env.barrier,
        rng: &mut *env.rng,
        now: env.now,
    };
    announce_tls(&mut ctx, &mut env.st)
}

/// Hands the shell the cluster listener certificate when this node is a primary (and has a
/// cluster CA).
pub(crate) fn announce_tls(ctx: &mut Ctx, st: &mut ReplIo<'_>) -> ApiResult<()> {
    let mut hosts: Vec<String> = Vec::new();
    for m in [Mode::Performance, Mode::Dr] {
        let r = &st.repl.mode(m).role;
        if r.role == Role::Primary && !r.primary_cluster_addr.is_empty() {
            hosts.push(tls::host_of(&r.primary_cluster_addr));
        }
    }
    // The active node of an HA cluster (only an active node loads replication state)
    // serves its standbys' forwarded requests on the same listener.
    if let Some(ha) = &st.config.ha {
        hosts.push(tls::host_of(&ha.cluster_addr));
    }
    if hosts.is_empty() {
        return Ok(());
    }
    hosts.push(tls::host_of(&st.config.replication.cluster_addr));
    hosts.push("localhost".into());
    // An address stored before addresses were checked cannot break the listener.
    hosts.retain(|h| tls::valid_host(h));
    hosts.sort();
    hosts.dedup();
    if let Some(t) = tls::server_tls(ctx, &hosts)? {
        st.outputs.push_back(Output::ClusterTls(t));
    }
    Ok(())
}

pub(super) fn load_uuids(s: &dyn Storage, barrier: &Barrier) -> ApiResult<BTreeSet<String>> {
    let mut set = BTreeSet::new();
    for t in ["core/local-mounts", "core/local-auth"] {
        set.extend(uuids_of_table(barrier, t, s.get(t)?.as_deref()));
    }
    Ok(set)
}

/// Turns WAL writing on or off to match the roles. Turning it on starts a new stretch of
/// indices after a gap, so no secondary can skip writes made while it was off.
pub(crate) fn sync_wal_activity(env: &mut Env) -> ApiResult<()> {
    let want = env.st.repl.wal_wanted();
    let meta = env.st.repl.wal;
    if meta.active == want {
        return Ok(());
    }
    if want {
        return restart_wal(env, meta.last + 1, true);
    }
    let m = wal::Meta {
        active: false,
        ..meta
    };
    env.storage
        .apply(&[(wal::META.to_string(), serde_json::to_vec(&m).ok())])?;
    env.st.repl.set_wal(m);
    Ok(())
}

/// Empties the WAL (key-only entries too) and restarts it after `last`, written or not
/// (`active`).
pub(crate) fn restart_wal(env: &mut Env, last: u64, active: bool) -> ApiResult<()> {
    let mut w = Vec::new();
    let mut m = wal::reset(&*env.storage, env.st.repl.wal, last, &mut w);
    m.active = active;
    w.retain(|(k, _)| k != wal::META);
    w.push((wal::META.to_string(), serde_json::to_vec(&m).ok()));
    env.storage.apply(&w)?;
    env.st.repl.set_wal(m);
    Ok(())
}

/// Periodic and follow-up work: expires long polls, sends due secondary requests.
pub fn poll(env: &mut Env) {
    if env.barrier.sealed() || !env.st.repl.roles_loaded {
        return;
    }
    primary::expire_waiters(env);
    for m in [Mode::Performance, Mode::Dr] {
        let rt = env.st.repl.mode(m);
        let due = rt.role.role == Role::Secondary
            && rt.sec.inflight.is_none()
            && rt.sec.next_at.is_some_and(|t| t <= env.now);
        if due {
            secondary::kick(env, m);
        }
    }
}

/// Runs due background scan work (reindex, Merkle check, skipped flush); returns a request
/// it finished.
pub fn poll_jobs(env: &mut Env) -> Option<(RequestId, ApiResult)> {
    if let Err(e) = flush_deferred_if_due(env) {
        log::error!("writing the Merkle records failed (retried later): {e}");
    }
    if env.st.repl.jobs.interrupted.is_none() && (env.barrier.sealed() || !env.st.repl.roles_loaded)
    {
        return None;
    }
    reindex::step(env)
}

/// Writes the deferred Merkle records once they are `defer_merkle_ms` old, or at once when
/// a reindex or Merkle check is running (it reads the stored records).
pub(super) fn flush_deferred_if_due(env: &mut Env) -> ApiResult<()> {
    let r = &mut env.st.repl;
    let idle = r.jobs.idle();
    if r.deferred.is_empty() {
        // Records written during a scan left the marker out: put it back once it is over.
        if r.marker_absent && idle {
            return flush_deferred(env);
        }
        return Ok(());
    }
    let since = *r.deferred_since.get_or_insert(env.now);
    if r.jobs.job.is_some() || env.now >= since + env.st.config.replication.defer_merkle_ms {
        flush_deferred(env)?;
    }
    Ok(())
}

/// Writes the deferred Merkle records, and the completeness marker when no reindex is
/// writing records of its own.
pub(crate) fn flush_deferred(env: &mut Env) -> ApiResult<()> {
    let r = &mut env.st.repl;
    let idle = r.jobs.idle();
    if r.deferred.is_empty() && !(r.marker_absent && idle) {
        return Ok(());
    }
    let mut writes: Vec<Write> = r
        .deferred
        .iter()
        .map(|rec| (merkle::record_key(rec), r.trees.record(rec)))
        .collect();
    if idle {
        writes.push((merkle::MARKER.to_string(), Some(merkle::VERSION.to_vec())));
    }
    env.storage.apply(&writes)?;
    let r = &mut env.st.repl;
    r.deferred.clear();
    r.deferred_since = None;
    if idle {
        r.marker_absent = false;
    }
    Ok(())
}

/// Finishes a skipped reindex flush (and writes deferred Merkle records) before the process
/// exits.
pub fn flush_before_shutdown(env: &mut Env) -> ApiResult<()> {
    flush_deferred(env)?;
    reindex::flush_all(env)
}

/// Input: a message on the cluster listener.
pub fn on_peer_request(env: &mut Env, req: PeerRequest) {
    primary::on_request(env, req);
}

/// The answer to the request waiting for `call`, when the node let go of the replication
/// state that made it: not applied (a node that stepped down has answered its requests
/// already; this reaches one whose state could not be loaded).
fn let_go(call: Call) -> Option<(RequestId, ApiResult)> {
    let request = match call {
        Call::Ping { request, .. } | Call::Unwrap { request, .. } => request,
        _ => return None,
    };
    let e = ApiError::Unavailable(
        "this node let go of its replication state (it stepped down, was sealed or could not \
         load it) before the answer came; nothing was applied, retry"
            .into(),
    );
    Some((request, Err(e)))
}

/// Input: the answer to a [`PeerSend`]. An answer to a call of a replication state the node
/// has since let go of (it stepped down to standby, which loads no replication state, or was
/// sealed) is dropped: acting on it would run a secondary's stream from stale memory, a
/// Merkle diff included, on a node that no longer replicates. Nobody waits for it: stepping
/// down answered the node's pending requests.
pub fn on_peer_reply(env: &mut Env, rep: PeerReply) -> Option<(RequestId, ApiResult)> {
    let call = env.st.repl.calls.remove(&rep.call_id);
    if !env.st.repl.roles_loaded {
        return call.and_then(let_go);
    }
    match call {
        Some(Call::Peer { mode }) => {
            secondary::on_reply(env, mode, rep.call_id, rep.result);
            None
        }
        Some(Call::Ping {
            request,
            mode,
            addrs,
            idx,
        }) => secondary::on_ping(env, request, mode, addrs, idx, rep.result),
        _ => None,
    }
}

/// Input: the result of an [`HttpCall`]; may finish a pending request. Dropped, as a peer's
/// answer is, when the node let go of the replication state that made the call.
pub fn on_http_reply(env: &mut Env, rep: HttpReply) -> Option<(RequestId, ApiResult)> {
    let call = env.st.repl.calls.remove(&rep.call_id);
    if !env.st.repl.roles_loaded {
        return call.and_then(let_go);
    }
    match call {
        Some(Call::Unwrap {
            request,
            mode,
            update,
        }) => Some((
            request,
            secondary::on_unwrapped(env, mode, update, rep.result),
        )),
        _ => None,
    }
}

/// Refuses requests this node's role does not serve (a DR secondary serves only the
/// replication, seal and health endpoints).
pub fn gate_request(repl: &Replication, req: &Request) -> ApiResult<()> {
    if !repl.is_dr_secondary() {
        return Ok(());
    }
    let p = req.path.as_str();
    let allowed = dr_secondary_serves(p)
        || matches!(
            p,
            "sys/seal" | "sys/leader" | "sys/license/status" | "sys/health" | "sys/seal-status"
        );
    if allowed {
        Ok(())
    } else {
        Err(dr_secondary_error())
    }
}

/// The replication endpoints a DR secondary serves: the status ones, its DR operations
/// (each with the DR operation token, or refused by role) and `reindex`/`merkle-check`
/// (which point to their DR variants). Never the performance ones: a client token (its
/// primary's, replicated) would make it a performance primary or wipe it into a performance
/// secondary of another cluster, past the DR operation token.
fn dr_secondary_serves(path: &str) -> bool {
    let Some(tail) = path.strip_prefix("sys/replication/") else {
        return false;
    };
    tail.starts_with("dr/")
        || matches!(
            tail,
            "status" | "performance/status" | "reindex" | "merkle-check"
        )
}

/// The cluster addresses a secondary may reach this primary cluster at: the one this node
/// advertises first, then every other node of its HA cluster (a secondary that loses the
/// active node tries them in turn; a standby answers that it is one).
pub(crate) fn primary_cluster_addrs(st: &ReplIo<'_>, role: &RoleState) -> Vec<String> {
    let mut addrs = vec![if role.primary_cluster_addr.is_empty() {
        st.config.replication.cluster_addr.clone()
    } else {
        role.primary_cluster_addr.clone()
    }];
    for p in st.ha.nodes() {
        if !p.cluster_addr.is_empty() && !addrs.contains(&p.cluster_addr) {
            addrs.push(p.cluster_addr.clone());
        }
    }
    addrs
}

/// Ok(()) once replication state is loaded (after unseal).
pub(crate) fn require_loaded(st: &ReplIo<'_>) -> ApiResult<()> {
    if st.repl.roles_loaded {
        Ok(())
    } else {
        Err(ApiError::Unavailable(
            "replication state is not loaded yet".into(),
        ))
    }
}

/// What a pending request waits for is gone (e.g. the node sealed); finish it with an error.
pub fn pending_error() -> ApiResult<Reply> {
    Err(ApiError::Unavailable(
        "the operation was interrupted; retry".into(),
    ))
}
