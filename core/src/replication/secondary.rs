//! The secondary's pull state machine, advanced by peer replies and polls:
//!
//! * `connecting` / `stream-wals`: ask for WAL entries after `last_remote_wal`; apply each
//!   batch atomically with the new `last_remote_wal`; ask again at once (the primary holds
//!   the request until it has entries: long poll).
//! * `merkle-diff`: when the primary no longer retains the entries needed (or after
//!   update-primary or a filter change): compare subtree roots, then page hashes; a
//!   differing page that holds many of our keys is narrowed down to its differing subpages
//!   (subpage sums), a smaller one is taken whole.
//! * `catch-up`: when the primary kept only the keys of the entries we need, it answers a
//!   pull with the current values of those keys (deletions included), a batch at a time;
//!   we apply them and pull on from the last index covered. Our copy then holds values
//!   newer than our position, so `needs_sync` stays set (the status says `catch-up`) until
//!   we have streamed past the index the last batch was read at and then compared our
//!   roots with the primary's (a Merkle diff that, caught up, finds nothing or only the
//!   latest writes): the catch-up trusts that the primary's history after our position is
//!   the one we came from.
//! * After a restart with `needs_sync` set (trees rebuilt from the data, or a sync or
//!   catch-up interrupted): catch up first (stream, or by changed keys), then, with nothing
//!   more to fetch, run a Merkle diff, whose roots then differ only by what the primary wrote
//!   meanwhile.
//! * `merkle-sync`: per subtree, send the short leaf hashes of our keys in the differing
//!   buckets; the primary answers with the values we lack or hold differently and which of
//!   our keys it does not hold (deleted here), in batches (continuing after the last key
//!   received); then stream again from the WAL index the diff started at (replaying what
//!   changed meanwhile).
//! * `idle`: no working connection; retried with backoff.
//!
//! How a secondary takes its credentials (activation, update-primary) is in
//! [`join`].

use super::class::{self, Class};
use super::merkle::{self, TreeKind};
use super::msg::{
    self, ChangeBatch, Hashes, Holdings, PeerAnswer, PeerAuth, PeerBody, PeerMsg, PeerSend,
    PrimaryInfo, SubtreeRef, SyncBatch,
};
use super::primary::{kinds, relative, subtree_keys};
use super::state::{Bundle, Creds, Role, RoleState};
use super::subtree_scan::SubtreeScan;
use super::wal::{self, WalEntry};
use super::{commit_changes, Call, Change, Env, Mode, Origin, Phase, SecRt};
use crate::api::{ApiError, ApiResult, Reply, RequestId};
use crate::node::Output;
use crate::seal::Barrier;
use crate::storage::Write;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

mod join;
pub(crate) use join::{on_bundle, on_ping, on_unwrapped, ping};

fn tree_class(k: TreeKind) -> Class {
    match k {
        TreeKind::Replicated => Class::Replicated,
        TreeKind::Local => Class::ClusterLocal,
    }
}

/// Where a secondary's call goes: the address, the credential, the CA and the client certificate.
pub(super) type Addressed = (String, PeerAuth, String, Option<super::tls::ClientCert>);

/// Who to ask and as whom: the primary address this secondary currently uses (the one its
/// pulls go to: they move on through the known addresses until one answers as the active
/// node), its credential, the CA to pin and the client certificate to present. `Err` says
/// why there is none.
pub(super) fn addressed(env: &Env, mode: Mode) -> Result<Addressed, String> {
    let rt = env.st.repl.mode(mode);
    let Some(creds) = rt.role.creds.as_ref() else {
        return Err("this cluster holds no credential of a primary".into());
    };
    if creds.primary_cluster_addrs.is_empty() {
        return Err("no known primary cluster address".into());
    }
    let to =
        creds.primary_cluster_addrs[rt.sec.addr_idx % creds.primary_cluster_addrs.len()].clone();
    let auth = PeerAuth {
        secondary_id: creds.secondary_id.clone(),
        secret: creds.secret.clone(),
        primary_cluster_id: creds.primary_cluster_id.clone(),
        cluster_id: rt.role.cluster_id.clone(),
        node_id: env.st.config.node_id.clone(),
        api_addr: env.cfg().api_addr.clone(),
        cluster_addr: env.cfg().cluster_addr.clone(),
        version: env.st.config.version.clone(),
    };
    Ok((to, auth, creds.ca_pem.clone(), creds.client.clone()))
}

/// Sends `body` to the current primary address.
fn send(env: &mut Env, mode: Mode, body: PeerBody) {
    let (to, auth, ca_pem, client) = match addressed(env, mode) {
        Ok(a) => a,
        Err(why) => {
            let rt = env.st.repl.mode_mut(mode);
            rt.sec.phase = Phase::Idle;
            if rt.role.creds.is_some() {
                rt.sec.last_error = why;
            }
            return;
        }
    };
    let id = env.repl().call_id();
    let rt = env.st.repl.mode_mut(mode);
    rt.sec.inflight = Some(id);
    rt.sec.next_at = None;
    let msg = PeerMsg { mode, auth, body };
    env.st.repl.calls.insert(id, Call::Peer { mode });
    env.push(Output::PeerSend(PeerSend {
        call_id: id,
        to,
        msg,
        ca_pem,
        client,
    }));
}

fn pull(env: &mut Env, mode: Mode) {
    let after = env.st.repl.mode(mode).role.last_remote_wal;
    let max = env.cfg().batch_entries;
    let wait = env.cfg().pull_wait_ms;
    env.st.repl.mode_mut(mode).sec.pulled_at = Some(env.now);
    send(
        env,
        mode,
        PeerBody::Pull {
            after,
            max_entries: max,
            wait_ms: wait,
        },
    );
}

fn start_diff(env: &mut Env, mode: Mode) {
    if env.st.repl.mode(mode).sec.phase != Phase::MerkleDiff {
        env.st.repl.count_diff(mode);
    }
    let rt = env.st.repl.mode_mut(mode);
    rt.sec.phase = Phase::MerkleDiff;
    rt.sec.rediff = false;
    rt.sec.catch_up = None;
    rt.sec.verify = false;
    rt.sec.asked.clear();
    rt.sec.sent.clear();
    rt.sec.resume_sync = false;
    rt.sec.after = None;
    rt.sec.sync_total = 0;
    rt.sec.sync_done = 0;
    send(env, mode, PeerBody::MerkleRoots);
}

/// Sends the next request of the current phase (after a start, a retry delay or an error).
pub(crate) fn kick(env: &mut Env, mode: Mode) {
    let rt = env.st.repl.mode_mut(mode);
    rt.sec.next_at = None;
    if rt.role.creds.is_none() {
        rt.sec.phase = Phase::Idle;
        return;
    }
    // Set by `fail` for this kick only (a diff started meanwhile clears it too).
    let resume = std::mem::take(&mut rt.sec.resume_sync) && !rt.sec.asked.is_empty();
    match rt.sec.phase {
        Phase::MerkleDiff | Phase::MerkleSync => start_diff(env, mode),
        _ if resume => {
            rt.sec.phase = Phase::MerkleSync;
            if let Err(e) = sync_next(env, mode) {
                log::warn!("{} replication: resuming the Merkle sync: {e}", mode.name());
                start_diff(env, mode);
            }
        }
        _ if rt.role.needs_sync && !rt.sec.verify => start_diff(env, mode),
        Phase::Idle | Phase::Connecting => {
            rt.sec.phase = Phase::Connecting;
            pull(env, mode)
        }
        Phase::StreamWals | Phase::CatchUp => pull(env, mode),
    }
}

fn fail(env: &mut Env, mode: Mode, reached: bool, why: String) {
    let now = env.now;
    let rt = env.st.repl.mode_mut(mode);
    // A round of a Merkle sync that did not reach the primary is asked again, not the whole
    // diff: with many rounds and a lossy link, starting over could go on for ever.
    rt.sec.resume_sync = !reached && rt.sec.phase == Phase::MerkleSync && !rt.sec.asked.is_empty();
    rt.sec.phase = Phase::Idle;
    rt.sec.failures = rt.sec.failures.saturating_add(1);
    if !reached {
        rt.sec.addr_idx = rt.sec.addr_idx.wrapping_add(1);
    }
    let backoff = (250u64 << rt.sec.failures.min(5)).min(5_000);
    rt.sec.next_at = Some(now + backoff);
    if rt.sec.last_error != why {
        log::warn!("{} replication: {why}", mode.name());
    }
    rt.sec.last_error = why;
}

/// A reply from the primary arrived.
pub(crate) fn on_reply(
    env: &mut Env,
    mode: Mode,
    call_id: u64,
    result: Result<PeerAnswer, String>,
) {
    let now = env.now;
    let rt = env.st.repl.mode_mut(mode);
    if rt.sec.inflight != Some(call_id) {
        return;
    }
    rt.sec.inflight = None;
    if rt.role.role != Role::Secondary || rt.role.creds.is_none() {
        rt.sec.phase = Phase::Idle;
        return;
    }
    match result {
        Err(e) => fail(env, mode, false, format!("cannot reach the primary: {e}")),
        Ok(PeerAnswer::Error { code, message }) if code == super::STANDBY_CODE => {
            // A standby of the primary's HA cluster: on to the next known address.
            fail(env, mode, false, format!("primary cluster node: {message}"));
        }
        Ok(PeerAnswer::Error { code, message }) => {
            rt.sec.last_heartbeat = Some(now);
            rt.sec.version_refused = code == super::version::TOO_OLD;
            fail(
                env,
                mode,
                true,
                format!("primary refused ({code}): {message}"),
            );
        }
        Ok(a) => {
            rt.sec.last_heartbeat = Some(now);
            rt.sec.failures = 0;
            rt.sec.last_error.clear();
            rt.sec.version_refused = false;
            let learned = learn_addrs(env, mode, &a);
            if let Err(e) = learned.and_then(|_| advance(env, mode, a)) {
                fail(
                    env,
                    mode,
                    true,
                    format!("applying replicated data failed: {e}"),
                );
            }
        }
    }
}

/// Most addresses of the primary's cluster a secondary remembers.
const MAX_KNOWN_ADDRS: usize = 16;

/// Adds the addresses of the primary's cluster its answers list to the known ones (durably:
/// a restart must find the active node too), the address that answered first. Addresses are
/// only added, never dropped: a node that just became active may list only itself for a
/// while, and a standby the secondary knew must stay known (an operator prunes with
/// `update_primary_addrs`). Empty ones are skipped; at most [`MAX_KNOWN_ADDRS`] are kept.
fn learn_addrs(env: &mut Env, mode: Mode, a: &PeerAnswer) -> ApiResult<()> {
    let info = match a {
        PeerAnswer::Pong { info }
        | PeerAnswer::Entries { info, .. }
        | PeerAnswer::Gone { info }
        | PeerAnswer::Changes { info, .. }
        | PeerAnswer::Roots { info, .. } => info,
        _ => return Ok(()),
    };
    let rt = env.st.repl.mode_mut(mode);
    let idx = rt.sec.addr_idx;
    let Some(c) = rt.role.creds.as_mut() else {
        return Ok(());
    };
    let known = &c.primary_cluster_addrs;
    let Some(hit) = known.get(idx % known.len().max(1)).cloned() else {
        return Ok(());
    };
    if info
        .cluster_addrs
        .iter()
        .all(|a| a.is_empty() || known.contains(a))
    {
        return Ok(());
    }
    let mut order = vec![hit];
    for a in info.cluster_addrs.iter().chain(known.iter()) {
        if order.len() >= MAX_KNOWN_ADDRS {
            break;
        }
        if !a.is_empty() && !order.contains(a) {
            order.push(a.clone());
        }
    }
    if order.len() == known.len() {
        // Full: nothing new fits.
        return Ok(());
    }
    log::info!(
        "{} replication: the primary cluster's addresses are now {}",
        mode.name(),
        order.join(", ")
    );
    c.primary_cluster_addrs = order;
    rt.sec.addr_idx = 0;
    let w = env.role_write(mode)?;
    commit_changes(env, vec![w], Origin::Replication)
}

fn advance(env: &mut Env, mode: Mode, a: PeerAnswer) -> ApiResult<()> {
    match a {
        PeerAnswer::Pong { info } => {
            env.st.repl.mode_mut(mode).sec.info = info;
            kick(env, mode);
        }
        PeerAnswer::Entries {
            info,
            entries,
            last,
        } => {
            if adopt_filter(env, mode, info)? {
                start_diff(env, mode);
                return Ok(());
            }
            let rt = env.st.repl.mode_mut(mode);
            let mut compare = false;
            if rt.role.needs_sync {
                if !rt.sec.verify {
                    start_diff(env, mode);
                    return Ok(());
                }
                // Streaming after a catch-up, or after a restart that owes a comparison:
                // past the catch-up's target and with nothing more to fetch, compare with
                // the primary's roots.
                if rt.sec.catch_up.is_none_or(|t| last >= t) {
                    rt.sec.catch_up = None;
                    compare = last >= rt.sec.info.last_wal;
                }
            }
            if compare {
                apply_entries(env, mode, entries, last)?;
                start_diff(env, mode);
                return Ok(());
            }
            // Full: the primary stopped at its batch size, counted in the indices it covered
            // (before its path filter, so a filtered secondary that is catching up does not
            // wait between batches).
            let before = env.st.repl.mode(mode).role.last_remote_wal;
            let full = last.saturating_sub(before) >= u64::from(env.cfg().batch_entries);
            apply_entries(env, mode, entries, last)?;
            let gap = env.cfg().pull_gap_ms;
            let now = env.now;
            let rt = env.st.repl.mode_mut(mode);
            rt.sec.phase = Phase::StreamWals;
            let due = rt.sec.pulled_at.map_or(now, |t| t + gap);
            if !full && due > now {
                // Writes come faster than one a gap: the next pull when the gap since this
                // one's start is over, through `kick`.
                rt.sec.next_at = Some(due);
            } else {
                pull(env, mode);
            }
        }
        PeerAnswer::Gone { info } => {
            // Behind the primary's WAL: remember it durably until a Merkle sync completes, so
            // a restart resumes the sync and promote knows the copy is incomplete.
            let rt = env.st.repl.mode_mut(mode);
            rt.sec.info = info;
            if !rt.role.needs_sync {
                rt.role.needs_sync = true;
                let w = env.role_write(mode)?;
                commit_changes(env, vec![w], Origin::Replication)?;
            }
            start_diff(env, mode);
        }
        PeerAnswer::Changes {
            info,
            upto,
            at,
            batch,
        } => on_changes(env, mode, info, (upto, at), batch)?,
        PeerAnswer::Roots { info, index, roots } => on_roots(env, mode, info, index, roots)?,
        PeerAnswer::Pages { pages } => on_pages(env, mode, pages)?,
        PeerAnswer::Subpages { subpages } => on_subpages(env, mode, subpages)?,
        PeerAnswer::Synced { batch, more, upto } => on_synced(env, mode, batch, more, upto)?,
        PeerAnswer::Error { .. } | PeerAnswer::Forwarded { .. } => {}
    }
    Ok(())
}

fn apply_entries(env: &mut Env, mode: Mode, entries: Vec<WalEntry>, last: u64) -> ApiResult<()> {
    log::trace!("{mode:?} secondary: {} entries up to {last}", entries.len());
    let mut changes: Vec<Change> = Vec::with_capacity(entries.len() + 1);
    for e in entries {
        if mode == Mode::Performance && e.class != Class::Replicated {
            continue;
        }
        if e.class == Class::NodeLocal {
            continue;
        }
        changes.push(Change {
            key: e.key,
            value: e.value,
            class: Some(e.class),
            index: Some(e.index),
            end: e.end,
            fresh: false,
        });
    }
    let rt = env.st.repl.mode_mut(mode);
    rt.role.last_remote_wal = rt.role.last_remote_wal.max(last);
    changes.push(env.role_write(mode)?);
    let origin = if mode == Mode::Dr {
        Origin::DrStream
    } else {
        Origin::Replication
    };
    commit_changes(env, changes, origin)
}

/// Takes the primary's `info`; a performance secondary whose path filter it changes adopts
/// the new one and records durably that it needs a Merkle sync (true).
fn adopt_filter(env: &mut Env, mode: Mode, info: PrimaryInfo) -> ApiResult<bool> {
    let rt = env.st.repl.mode_mut(mode);
    let changed = mode == Mode::Performance && rt.role.filter != info.filter;
    if changed {
        rt.role.filter = info.filter.clone();
        rt.role.needs_sync = true;
    }
    rt.sec.info = info;
    if changed {
        let w = env.role_write(mode)?;
        commit_changes(env, vec![w], Origin::Replication)?;
    }
    Ok(changed)
}

/// The current values of the keys written after our position up to `upto`, read when the
/// primary's WAL ended at `at` ([`PeerAnswer::Changes`]): applied with the new position in
/// one write set; `needs_sync` is set until the stream reaches `at`.
fn on_changes(
    env: &mut Env,
    mode: Mode,
    info: PrimaryInfo,
    (upto, at): (u64, u64),
    batch: ChangeBatch,
) -> ApiResult<()> {
    // Keys a new filter lets in changed nowhere near our position; or something else (a
    // Merkle check that found a difference) asked for a diff.
    let filter_changed = adopt_filter(env, mode, info)?;
    let rt = env.st.repl.mode_mut(mode);
    if filter_changed || (rt.role.needs_sync && !rt.sec.verify) {
        start_diff(env, mode);
        return Ok(());
    }
    let from = rt.role.last_remote_wal;
    if upto <= from || at < upto {
        return Err(ApiError::bad(format!(
            "catch-up: the primary's answer covers entries up to {upto} (read at {at}), not past our position {from}"
        )));
    }
    let uuids = env.st.repl.local_uuids.clone();
    let n = batch.changes.len() as u64;
    let mut changes: Vec<Change> = Vec::with_capacity(batch.changes.len() + 1);
    for (key, class, value) in batch.changes {
        let here = class::classify(&key, &uuids);
        let allowed = match mode {
            Mode::Dr => class != Class::NodeLocal && here != Class::NodeLocal,
            Mode::Performance => class == Class::Replicated && here == Class::Replicated,
        };
        if !allowed {
            return Err(ApiError::bad(format!(
                "catch-up: {key:?} ({class:?}) is not replicated to this {} secondary",
                mode.name()
            )));
        }
        changes.push(Change {
            key,
            value,
            class: Some(class),
            index: None,
            end: false,
            fresh: false,
        });
    }
    let rt = env.st.repl.mode_mut(mode);
    if rt.sec.phase != Phase::CatchUp {
        log::info!(
            "{} replication: catching up from WAL index {from} by changed keys (the primary no longer holds those entries, only their keys)",
            mode.name()
        );
        rt.sec.sync_done = 0;
    }
    rt.sec.phase = Phase::CatchUp;
    rt.sec.catch_up = Some(rt.sec.catch_up.unwrap_or(0).max(at));
    // Once caught up, the copy is compared with the primary's roots before it counts as
    // complete: the catch-up trusts that the primary's history after our position is the
    // one our position came from, which a primary replaced meanwhile (a DR promotion
    // behind the same address) would break.
    rt.sec.verify = true;
    rt.sec.sync_done += n;
    rt.sec.sync_total = rt.sec.sync_done;
    rt.role.last_remote_wal = upto;
    rt.role.needs_sync = true;
    changes.push(env.role_write(mode)?);
    if mode == Mode::Dr {
        // No WAL entries of our own for these values (the primary's indices are not ours to
        // fill), and our WAL copy restarts after `upto`, where the stream goes on.
        commit_changes(env, changes, Origin::DrStream)?;
        super::hooks::restart_wal(env, upto, true)?;
    } else {
        commit_changes(env, changes, Origin::Replication)?;
    }
    pull(env, mode);
    Ok(())
}

fn my_roots(env: &Env, mode: Mode) -> BTreeMap<SubtreeRef, String> {
    let mut out = BTreeMap::new();
    for k in kinds(mode) {
        for (sid, h) in env.st.repl.trees.roots(*k, &|_| true) {
            out.insert((*k, sid), hex::encode(h));
        }
    }
    out
}

fn delete_subtree(env: &mut Env, kind: TreeKind, sid: &str) -> ApiResult<()> {
    let uuids = env.st.repl.local_uuids.clone();
    let keys = subtree_keys(&*env.storage, &uuids, kind, sid, None)?;
    let changes = keys
        .into_iter()
        .map(|(k, _)| Change {
            key: k,
            value: None,
            class: Some(tree_class(kind)),
            index: None,
            end: false,
            fresh: false,
        })
        .collect();
    commit_changes(env, changes, Origin::Replication)
}

fn on_roots(
    env: &mut Env,
    mode: Mode,
    info: super::msg::PrimaryInfo,
    index: u64,
    roots: Vec<(SubtreeRef, String)>,
) -> ApiResult<()> {
    let theirs: BTreeMap<SubtreeRef, String> = roots.into_iter().collect();
    let mine = my_roots(env, mode);
    for (k, sid) in mine.keys().filter(|r| !theirs.contains_key(*r)) {
        delete_subtree(env, *k, sid)?;
    }
    let differ: Vec<SubtreeRef> = theirs
        .iter()
        .filter(|(r, h)| mine.get(*r) != Some(*h))
        .map(|(r, _)| r.clone())
        .collect();
    let rt = env.st.repl.mode_mut(mode);
    rt.sec.info = info;
    rt.sec.base = index;
    if differ.is_empty() {
        return finish_sync(env, mode);
    }
    send(env, mode, PeerBody::MerklePages { subtrees: differ });
    Ok(())
}

fn my_subtree(env: &Env, r: &SubtreeRef) -> merkle::Subtree {
    env.st
        .repl
        .trees
        .get(r.0, &r.1)
        .cloned()
        .unwrap_or_default()
}

/// A differing page holding more of our keys than this is narrowed down to its differing
/// subpages first (its subpage sums cost about as much as 256 short leaves); a page with
/// fewer is synchronised whole, without that round trip.
const DIRECT_PAGE_KEYS: usize = 256;

/// All buckets of page `p`.
fn page_buckets(p: usize) -> impl Iterator<Item = u32> {
    (p * merkle::SUBPAGES..(p + 1) * merkle::SUBPAGES).map(|b| b as u32)
}

fn on_pages(env: &mut Env, mode: Mode, pages: Vec<(SubtreeRef, Hashes)>) -> ApiResult<()> {
    let uuids = env.st.repl.local_uuids.clone();
    let mut sync: BTreeMap<SubtreeRef, BTreeSet<u32>> = BTreeMap::new();
    let mut narrow = Vec::new();
    for (r, hs) in pages {
        let mine = my_subtree(env, &r);
        let differ: Vec<usize> =
            hs.0.iter()
                .take(merkle::PAGES)
                .enumerate()
                .filter(|(i, h)| mine.page_hashes().get(*i) != Some(*h))
                .map(|(i, _)| i)
                .collect();
        if differ.is_empty() {
            continue;
        }
        let mut per_page = [0usize; merkle::PAGES];
        let mut scan = SubtreeScan::new(&*env.storage, &uuids, r.0, &r.1, None, None);
        while let Some((k, _)) = scan.next_entry()? {
            per_page[merkle::bucket(&k).0] += 1;
        }
        let (crowded, small): (Vec<usize>, Vec<usize>) = differ
            .into_iter()
            .partition(|p| per_page[*p] > DIRECT_PAGE_KEYS);
        if !small.is_empty() {
            sync.entry(r.clone())
                .or_default()
                .extend(small.into_iter().flat_map(page_buckets));
        }
        if !crowded.is_empty() {
            narrow.push((r, crowded.into_iter().map(|p| p as u16).collect()));
        }
    }
    let rt = env.st.repl.mode_mut(mode);
    rt.sec.asked = sync;
    rt.sec.after = None;
    if !narrow.is_empty() {
        send(env, mode, PeerBody::MerkleSubpages { want: narrow });
        return Ok(());
    }
    start_sync(env, mode)
}

fn on_subpages(
    env: &mut Env,
    mode: Mode,
    subpages: Vec<(SubtreeRef, u16, Hashes)>,
) -> ApiResult<()> {
    let rt = env.st.repl.mode_mut(mode);
    let mut asked = std::mem::take(&mut rt.sec.asked);
    for (r, p, sums) in subpages {
        let mine = my_subtree(env, &r);
        let p = p as usize;
        if p >= merkle::PAGES {
            continue;
        }
        let my = mine.subpages(p);
        for (s, h) in sums.0.iter().take(merkle::SUBPAGES).enumerate() {
            if my.get(s) != Some(h) {
                asked
                    .entry(r.clone())
                    .or_default()
                    .insert((p * merkle::SUBPAGES + s) as u32);
            }
        }
    }
    env.st.repl.mode_mut(mode).sec.asked = asked;
    start_sync(env, mode)
}

/// The differing buckets are known (`sec.asked`): synchronise them subtree by subtree.
fn start_sync(env: &mut Env, mode: Mode) -> ApiResult<()> {
    let rt = env.st.repl.mode_mut(mode);
    if rt.sec.asked.is_empty() {
        // Changed while we looked: start over.
        start_diff(env, mode);
        return Ok(());
    }
    rt.sec.phase = Phase::MerkleSync;
    rt.sec.after = None;
    sync_next(env, mode)
}

/// Sends what we hold in the buckets of the first subtree still to synchronise (a window of
/// our keys after the cursor), or finishes when none is left.
fn sync_next(env: &mut Env, mode: Mode) -> ApiResult<()> {
    let rt = env.st.repl.mode(mode);
    let Some((r, buckets)) = rt
        .sec
        .asked
        .first_key_value()
        .map(|(r, b)| (r.clone(), b.clone()))
    else {
        return finish_sync(env, mode);
    };
    let after = rt.sec.after.clone();
    let uuids = env.st.repl.local_uuids.clone();
    let prefix = class::subtree_prefix(&r.1).unwrap_or_default();
    let mut sent = Vec::new();
    let mut leaves = Vec::new();
    // A window of our keys (`sync_window`, 16,384 leaves by default: 128 KiB): the primary
    // answers for that range only, so a round costs what it covers however many keys the
    // subtree holds; where its answer stops short (its limit of values), the next window
    // starts.
    let window = env.cfg().sync_window.max(1);
    let mut scan = SubtreeScan::new(
        &*env.storage,
        &uuids,
        r.0,
        &r.1,
        Some(&buckets),
        after.as_deref(),
    );
    while sent.len() < window {
        let Some((k, v)) = scan.next_entry()? else {
            break;
        };
        leaves.push(msg::short_leaf(&merkle::leaf(&k, &v)));
        sent.push(k);
    }
    // A full window: the primary answers up to its last key only.
    let until = (sent.len() >= window)
        .then(|| sent.last().map(|k| relative(&prefix, k.clone())))
        .flatten();
    let max_values = env.cfg().fetch_batch.clamp(1, u32::MAX as usize) as u32;
    env.st.repl.mode_mut(mode).sec.sent = sent;
    send(
        env,
        mode,
        PeerBody::MerkleSync {
            subtree: r,
            after,
            until,
            max_values,
            holdings: Holdings { buckets, leaves },
        },
    );
    Ok(())
}

/// The primary's answer for the first subtree still to synchronise: delete what it does not
/// hold, write what it sent, then continue after the last value (`more`) or with the next
/// subtree.
fn on_synced(
    env: &mut Env,
    mode: Mode,
    batch: SyncBatch,
    more: bool,
    upto: Option<String>,
) -> ApiResult<()> {
    let uuids = env.st.repl.local_uuids.clone();
    let rt = env.st.repl.mode_mut(mode);
    let sent = std::mem::take(&mut rt.sec.sent);
    let Some(r) = rt.sec.asked.keys().next().cloned() else {
        start_diff(env, mode);
        return Ok(());
    };
    let (kind, sid) = &r;
    let prefix = class::subtree_prefix(sid).unwrap_or_default();
    let mut writes: BTreeMap<String, Option<Vec<u8>>> = BTreeMap::new();
    for i in batch.stale {
        let key = sent
            .get(i as usize)
            .ok_or_else(|| ApiError::bad(format!("merkle sync: no key at position {i}")))?;
        // Past the range the primary read, its answer says nothing about a key yet.
        if upto
            .as_deref()
            .is_some_and(|u| key.strip_prefix(prefix.as_str()).unwrap_or(key) > u)
        {
            continue;
        }
        writes.insert(key.clone(), None);
    }
    let last = upto.or_else(|| batch.values.last().map(|(k, _)| k.clone()));
    for (rel, v) in batch.values {
        let key = format!("{prefix}{rel}");
        if class::subtree(&key) != *sid || class::classify(&key, &uuids) == Class::NodeLocal {
            return Err(ApiError::bad(format!(
                "merkle sync: {key:?} is not a key of subtree {sid:?}"
            )));
        }
        writes.insert(key, Some(v));
    }
    let n = writes.len() as u64;
    let changes = writes
        .into_iter()
        .map(|(key, value)| Change {
            key,
            value,
            class: Some(tree_class(*kind)),
            index: None,
            end: false,
            fresh: false,
        })
        .collect();
    commit_changes(env, changes, Origin::Replication)?;
    let batch_size = env.cfg().fetch_batch as u64;
    let rt = env.st.repl.mode_mut(mode);
    rt.sec.sync_done += n;
    rt.sec.sync_total = rt.sec.sync_done;
    match (more, last) {
        (true, Some(k)) if rt.sec.after.as_deref().is_some_and(|a| k.as_str() <= a) => {
            return Err(ApiError::bad(format!(
                "merkle sync: the primary's answer ends at {k:?}, not past the cursor"
            )))
        }
        (true, Some(k)) => {
            rt.sec.after = Some(k);
            rt.sec.sync_total += batch_size;
        }
        (true, None) => {
            return Err(ApiError::bad(
                "merkle sync: the primary announced more values but sent none and no range end",
            ))
        }
        (false, _) => {
            rt.sec.asked.remove(&r);
            rt.sec.after = None;
        }
    }
    sync_next(env, mode)
}

/// The diff/sync is done: stream from the index the diff started at.
fn finish_sync(env: &mut Env, mode: Mode) -> ApiResult<()> {
    let rt = env.st.repl.mode_mut(mode);
    if rt.sec.rediff {
        // A reindex replaced the trees while this diff ran: compare again (the request for
        // it, `needs_sync`, stays set on disk until a diff that saw the new trees is done).
        start_diff(env, mode);
        return Ok(());
    }
    let base = rt.sec.base;
    rt.role.last_remote_wal = base;
    rt.role.needs_sync = false;
    rt.sec.phase = Phase::StreamWals;
    let w = env.role_write(mode)?;
    commit_changes(env, vec![w], Origin::Replication)?;
    if mode == Mode::Dr {
        // Our WAL copy restarts at the primary's index of this sync.
        super::hooks::restart_wal(env, base, true)?;
    }
    pull(env, mode);
    Ok(())
}

/// The runtime state name of a secondary (status `state`).
pub(crate) fn state_name(rt: &super::ModeRt) -> &'static str {
    if rt.role.creds.is_none() {
        return "idle";
    }
    if rt.sec.version_refused {
        return "version-mismatch";
    }
    // Streaming the entries a catch-up still needs, or before the comparison it owes (a
    // catch-up in progress always owes one).
    if rt.sec.phase == Phase::StreamWals && rt.sec.verify {
        return Phase::CatchUp.name();
    }
    rt.sec.phase.name()
}
