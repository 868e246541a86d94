//! How a secondary joins its primary: activation (the activation token unwrapped at the
//! primary, the credential bundle checked and stored, the local data replaced) and
//! update-primary (new credentials, or `update_primary_addrs` pinged one address at a time
//! until one answers as the primary).

use super::*;
use crate::replication::{sync_wal_activity, version, ReplIo};

/// How many times update-primary goes over `update_primary_addrs`.
const PING_ROUNDS: usize = 3;

fn unwrap_error(msg: impl std::fmt::Display) -> ApiError {
    ApiError::bad(format!("error unwrapping secondary token: {msg}"))
}

/// The activation token was unwrapped at the primary (or that failed).
pub(crate) fn on_unwrapped(
    env: &mut Env,
    mode: Mode,
    update: bool,
    result: Result<(u16, Vec<u8>), String>,
) -> ApiResult {
    let (status, body) =
        result.map_err(|e| unwrap_error(format!("cannot reach the primary's API: {e}")))?;
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if status != 200 {
        let errs = v["errors"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        return Err(unwrap_error(format!(
            "the primary answered {status}: {errs}"
        )));
    }
    let bundle: Bundle = serde_json::from_value(v["data"].clone()).map_err(|e| {
        unwrap_error(format!(
            "the unwrapped data is not an activation credential: {e}"
        ))
    })?;
    on_bundle(env, mode, update, bundle)
}

/// Enables (or re-points, with `update`) this secondary with an activation credential,
/// unwrapped at the primary or decrypted locally.
pub(crate) fn on_bundle(env: &mut Env, mode: Mode, update: bool, bundle: Bundle) -> ApiResult {
    if bundle.mode != mode {
        return Err(ApiError::bad(format!(
            "the activation token is for {} replication, not {}",
            bundle.mode.name(),
            mode.name()
        )));
    }
    let mine = &env.st.config.version;
    if version::older(mine, &bundle.primary_version) {
        return Err(ApiError::bad(version::refusal(
            mine,
            &bundle.primary_version,
        )));
    }
    if update {
        update_primary(env, mode, bundle)?;
        Ok(Reply::Empty)
    } else {
        activate(env, mode, bundle)?;
        Ok(Reply::Envelope(json!({
            "warnings": ["Vault has successfully found secondary information; it may take a while to perform setup tasks. Vault will be unavailable until these tasks and initial sync complete."]
        })))
    }
}

fn creds_of(b: &Bundle) -> Creds {
    Creds {
        secondary_id: b.secondary_id.clone(),
        secret: b.secret.clone(),
        primary_cluster_id: b.primary_cluster_id.clone(),
        primary_api_addr: b.primary_api_addr.clone(),
        primary_cluster_addrs: b.primary_cluster_addrs.clone(),
        ca_pem: b.ca_pem.clone(),
        client: b.client.clone(),
    }
}

fn barrier_key(b: &Bundle) -> ApiResult<[u8; 32]> {
    hex::decode(&b.barrier_key)
        .ok()
        .and_then(|k| <[u8; 32]>::try_from(k.as_slice()).ok())
        .ok_or_else(|| unwrap_error("the credential carries no valid keyring key"))
}

/// Becomes a secondary: wipes everything but this node's replication roles, adopts the
/// primary's barrier key, and starts connecting.
fn activate(env: &mut Env, mode: Mode, b: Bundle) -> ApiResult<()> {
    if env.st.repl.role(mode) != Role::Disabled {
        return Err(ApiError::bad(format!(
            "{} replication is no longer disabled on this cluster",
            mode.name()
        )));
    }
    let key = barrier_key(&b)?;
    let mut nb = Barrier::default();
    nb.unseal_with(key);
    let mut writes: Vec<Write> = Vec::new();
    for (k, _) in env.storage.scan("")? {
        if !k.starts_with("node/replication/") {
            writes.push((k, None));
        }
    }
    // Keep the node initialised across the wipe: from now on it unseals with the primary's
    // key shares, whose seal configuration and keyring come with the credential.
    if !b.seal_config.is_empty() {
        let keyring = hex::decode(&b.keyring)
            .map_err(|_| ApiError::bad("token: malformed keyring in credential"))?;
        writes.push((
            crate::seal::SEAL_CONFIG_KEY.to_string(),
            Some(b.seal_config.as_bytes().to_vec()),
        ));
        writes.push((crate::seal::KEYRING_KEY.to_string(), Some(keyring)));
    }
    let cluster_id = match mode {
        Mode::Dr => b.primary_cluster_id.clone(),
        Mode::Performance => crate::crypto::uuid(&mut *env.rng),
    };
    let new = RoleState {
        role: Role::Secondary,
        cluster_id,
        creds: Some(creds_of(&b)),
        needs_sync: true,
        ..Default::default()
    };
    let other = match mode {
        Mode::Performance => Mode::Dr,
        Mode::Dr => Mode::Performance,
    };
    // A DR secondary takes the whole cluster over, its performance role included.
    let other_role = if mode == Mode::Dr {
        RoleState::default()
    } else {
        env.st.repl.mode(other).role.clone()
    };
    for (m, r) in [(mode, &new), (other, &other_role)] {
        let json = serde_json::to_vec(r).map_err(|e| ApiError::Internal(e.to_string()))?;
        let enc = nb
            .encrypt(&m.role_key(), &json, &mut *env.rng)
            .ok_or(ApiError::Sealed)?;
        writes.push((m.role_key(), Some(enc)));
    }
    writes.push((merkle::MARKER.to_string(), Some(merkle::VERSION.to_vec())));
    let old = env.st.repl.wal;
    let meta = wal::Meta {
        first: old.last + 2,
        last: old.last + 1,
        bytes: 0,
        active: false,
        kept: 0,
    };
    writes.push((wal::META.to_string(), serde_json::to_vec(&meta).ok()));
    env.storage.apply(&writes)?;
    env.barrier.unseal_with(key);
    let now = env.now;
    let mut tree_pages: Vec<Write> = Vec::new();
    let r = env.repl();
    r.barrier_key = Some(zeroize::Zeroizing::new(key));
    r.trees = merkle::Trees::default();
    // The wipe removed every stored record: nothing deferred is left to write.
    r.deferred.clear();
    r.local_uuids.clear();
    r.set_wal(meta);
    // The seal configuration and keyring written above are replicated data: record them in
    // the fresh replicated tree (and persist its pages) so the Merkle diff sees them as held.
    if !b.seal_config.is_empty() {
        let keyring = hex::decode(&b.keyring).unwrap_or_default();
        let mut staged = merkle::Staged::default();
        for (k, v) in [
            (crate::seal::SEAL_CONFIG_KEY, b.seal_config.as_bytes()),
            (crate::seal::KEYRING_KEY, keyring.as_slice()),
        ] {
            if super::class::classify(k, &Default::default()) == super::class::Class::Replicated {
                r.trees.stage(
                    &mut staged,
                    merkle::TreeKind::Replicated,
                    &super::class::subtree(k),
                    k,
                    None,
                    Some(v),
                );
            }
        }
        tree_pages = r.trees.persist(&mut staged);
        r.trees.install(staged);
    }
    r.waiters.clear();
    r.live.clear();
    let rt = r.mode_mut(mode);
    rt.role = new;
    rt.sec = SecRt {
        phase: Phase::Connecting,
        next_at: Some(now),
        ..Default::default()
    };
    if mode == Mode::Dr {
        let o = r.mode_mut(other);
        o.role = other_role;
        o.sec = SecRt::default();
    }
    if !tree_pages.is_empty() {
        env.storage.apply(&tree_pages)?;
    }
    sync_wal_activity(env)?;
    // The wipe took this cluster's CA away. A performance secondary never receives its
    // primary's (cluster-local): it makes its own now, through the commit hook like any
    // write (so its trees hold it), or its HA cluster could not forward at all (a cluster
    // without a CA forwards nothing). A DR secondary receives its primary's CA. The
    // listener then serves a certificate of it (an HA cluster's standbys pin it when they
    // forward to this node).
    if mode == Mode::Performance {
        let ws = {
            let mut ctx = env.ctx();
            super::super::tls::ca_pem(&mut ctx, true)?;
            ctx.txn.into_write_set()
        };
        // The commit hook announces the listener's certificate of it.
        super::super::hooks::commit(env, ws, Origin::Replication)?;
    }
    log::info!(
        "activated as a {} secondary of cluster {}",
        mode.name(),
        b.primary_cluster_id
    );
    Ok(())
}

/// Points a secondary at a (new) primary without wiping; a Merkle diff runs first.
fn update_primary(env: &mut Env, mode: Mode, b: Bundle) -> ApiResult<()> {
    if env.st.repl.role(mode) != Role::Secondary {
        return Err(ApiError::bad(format!(
            "this cluster is not a {} secondary",
            mode.name()
        )));
    }
    let key = barrier_key(&b)?;
    if env
        .st
        .repl
        .barrier_key
        .as_ref()
        .is_some_and(|k| !crate::crypto::ct_eq(&k[..], &key))
    {
        return Err(ApiError::bad(
            "the new primary does not share this cluster's keyring (another replication set): use secondary/enable, which wipes this cluster",
        ));
    }
    let now = env.now;
    let rt = env.st.repl.mode_mut(mode);
    rt.role.creds = Some(creds_of(&b));
    if mode == Mode::Dr {
        rt.role.cluster_id = b.primary_cluster_id.clone();
    }
    rt.role.needs_sync = true;
    rt.role.filter = None;
    rt.sec = SecRt {
        phase: Phase::Connecting,
        next_at: Some(now),
        ..Default::default()
    };
    let w = env.role_write(mode)?;
    commit_changes(env, vec![w], Origin::Replication)
}

/// A ping of `update_primary_addrs[idx]` returned.
pub(crate) fn on_ping(
    env: &mut Env,
    request: RequestId,
    mode: Mode,
    addrs: Vec<String>,
    idx: usize,
    result: Result<PeerAnswer, String>,
) -> Option<(RequestId, ApiResult)> {
    let why = match result {
        Ok(PeerAnswer::Pong { info }) => {
            let now = env.now;
            let rt = env.st.repl.mode_mut(mode);
            let Some(c) = rt.role.creds.as_mut() else {
                return Some((request, Err(ApiError::bad("no known primary credential"))));
            };
            let hit = addrs[idx % addrs.len()].clone();
            let mut order = vec![hit.clone()];
            order.extend(addrs.iter().filter(|a| **a != hit).cloned());
            c.primary_cluster_addrs = order;
            c.primary_api_addr = info.api_addr.clone();
            rt.role.needs_sync = true;
            rt.sec = SecRt {
                phase: Phase::Connecting,
                next_at: Some(now),
                info,
                ..Default::default()
            };
            let res = env
                .role_write(mode)
                .and_then(|w| commit_changes(env, vec![w], Origin::Replication))
                .map(|_| Reply::Empty);
            return Some((request, res));
        }
        Ok(PeerAnswer::Error { message, .. }) => message,
        Ok(_) => "unexpected answer".to_string(),
        Err(e) => e,
    };
    log::info!(
        "update-primary: {} did not answer: {why}",
        addrs[idx % addrs.len()]
    );
    // Each address is tried in order, the whole list up to PING_ROUNDS times.
    if idx + 1 < addrs.len() * PING_ROUNDS {
        ping(&mut env.st, request, mode, addrs, idx + 1);
        None
    } else {
        Some((
            request,
            Err(ApiError::bad(format!(
                "none of update_primary_addrs answered as a primary of this cluster (last: {why})"
            ))),
        ))
    }
}

/// Pings `addrs[idx]` with this secondary's credential.
pub(crate) fn ping(
    st: &mut ReplIo<'_>,
    request: RequestId,
    mode: Mode,
    addrs: Vec<String>,
    idx: usize,
) {
    let node_id = st.config.node_id.clone();
    let version = st.config.version.clone();
    let api_addr = st.config.replication.api_addr.clone();
    let cluster_addr = st.config.replication.cluster_addr.clone();
    let id = st.repl.call_id();
    let rt = st.repl.mode(mode);
    let creds = rt.role.creds.clone().unwrap_or_default();
    let msg = PeerMsg {
        mode,
        auth: PeerAuth {
            secondary_id: creds.secondary_id,
            secret: creds.secret,
            primary_cluster_id: creds.primary_cluster_id,
            cluster_id: rt.role.cluster_id.clone(),
            node_id,
            api_addr,
            cluster_addr,
            version,
        },
        body: PeerBody::Ping,
    };
    let to = addrs[idx % addrs.len().max(1)].clone();
    st.repl.calls.insert(
        id,
        Call::Ping {
            request,
            mode,
            addrs,
            idx,
        },
    );
    st.outputs.push_back(Output::PeerSend(PeerSend {
        call_id: id,
        to,
        msg,
        ca_pem: creds.ca_pem,
        client: creds.client,
    }));
}
