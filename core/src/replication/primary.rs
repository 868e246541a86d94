//! The primary's side of the cluster channel: authenticates secondaries, answers pulls with
//! (filtered) WAL batches or holds them until there is one (long poll), with the current
//! values of the keys written after the secondary's position when only the keys of those
//! entries are still kept (`changes`), and answers the Merkle diff/sync questions from its
//! trees and storage.

use super::class::{self, Class};
use super::filter::{self, MountMap};
use super::merkle::{self, TreeKind};
use super::msg::{
    self, ChangeBatch, Hashes, Holdings, PeerAnswer, PeerBody, PeerMsg, PeerRequest, PeerResponse,
    PrimaryInfo, SyncBatch,
};
use super::state::{Role, SecondaryRecord};
use super::subtree_scan::SubtreeScan;
use super::wal::{self, WalEntry};
use super::{Env, Live, Mode, Waiter};
use crate::api::ApiResult;
use crate::ctx::Ctx;
use crate::node::Output;
use crate::storage::Storage;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

/// Storage prefix of a mode's secondary records (cluster-local).
pub(crate) fn records_prefix(mode: Mode) -> String {
    format!("{}{}/secondary/", class::LOCAL_REPLICATION, mode.name())
}

pub(crate) fn record_key(mode: Mode, id: &str) -> String {
    format!("{}{id}", records_prefix(mode))
}

pub(crate) fn load_record(ctx: &Ctx, mode: Mode, id: &str) -> ApiResult<Option<SecondaryRecord>> {
    ctx.get_json(&record_key(mode, id))
}

pub(crate) fn load_records(ctx: &Ctx, mode: Mode) -> ApiResult<Vec<SecondaryRecord>> {
    let mut out = Vec::new();
    for k in ctx.keys(&records_prefix(mode))? {
        if let Some(r) = ctx.get_json::<SecondaryRecord>(&k)? {
            out.push(r);
        }
    }
    Ok(out)
}

fn error(code: &str, message: impl Into<String>) -> PeerAnswer {
    PeerAnswer::Error {
        code: code.into(),
        message: message.into(),
    }
}

pub(crate) fn on_request(env: &mut Env, req: PeerRequest) {
    let id = req.id;
    let answer = match answer(env, id, req.msg) {
        Ok(a) => a,
        Err(e) => Some(error("internal", e.to_string())),
    };
    if let Some(msg) = answer {
        env.push(Output::PeerResponse(PeerResponse { id, msg }));
    }
}

/// Which trees a secondary of `mode` may see.
pub(crate) fn kinds(mode: Mode) -> &'static [TreeKind] {
    match mode {
        Mode::Performance => &[TreeKind::Replicated],
        Mode::Dr => &[TreeKind::Replicated, TreeKind::Local],
    }
}

/// What one secondary may see: its filter and the mount map it applies to.
struct View {
    mode: Mode,
    filter: Option<super::state::PathsFilter>,
    mounts: MountMap,
}

impl View {
    fn new(ctx: &Ctx, mode: Mode, rec: &SecondaryRecord) -> ApiResult<View> {
        let mounts = if mode == Mode::Performance && rec.filter.is_some() {
            filter::mount_map(ctx)?
        } else {
            MountMap::default()
        };
        Ok(View {
            mode,
            filter: rec.filter.clone(),
            mounts,
        })
    }
    fn subtree_ok(&self, kind: TreeKind, id: &str) -> bool {
        kinds(self.mode).contains(&kind)
            && (self.mode == Mode::Dr || filter::included(self.filter.as_ref(), &self.mounts, id))
    }
    fn key_ok(&self, key: &str, class: Class) -> bool {
        match (self.mode, class) {
            (_, Class::NodeLocal) => false,
            (Mode::Dr, _) => true,
            (Mode::Performance, Class::ClusterLocal) => false,
            (Mode::Performance, Class::Replicated) => {
                filter::included(self.filter.as_ref(), &self.mounts, &class::subtree(key))
            }
        }
    }
}

fn info(env: &mut Env, mode: Mode, view: &View) -> PrimaryInfo {
    let role = &env.st.repl.mode(mode).role;
    let cluster_addr = if role.primary_cluster_addr.is_empty() {
        env.cfg().cluster_addr.clone()
    } else {
        role.primary_cluster_addr.clone()
    };
    PrimaryInfo {
        cluster_id: role.cluster_id.clone(),
        last_wal: env.st.repl.wal.last,
        api_addr: env.cfg().api_addr.clone(),
        cluster_addr,
        filter: (mode == Mode::Performance)
            .then(|| filter::view(view.filter.as_ref(), &view.mounts))
            .filter(|f| !f.mode.is_empty()),
        version: env.st.config.version.clone(),
        cluster_addrs: super::primary_cluster_addrs(&env.st, role),
    }
}

pub(super) fn authenticate(
    env: &mut Env,
    msg: &PeerMsg,
) -> ApiResult<Result<SecondaryRecord, PeerAnswer>> {
    let mode = msg.mode;
    if env.barrier.sealed() || !env.st.repl.roles_loaded {
        return Ok(Err(error("sealed", "the primary is sealed")));
    }
    let role = &env.st.repl.mode(mode).role;
    if role.role != Role::Primary {
        return Ok(Err(error(
            "not-primary",
            format!("this cluster is not a {} primary", mode.name()),
        )));
    }
    if !msg.auth.primary_cluster_id.is_empty() && msg.auth.primary_cluster_id != role.cluster_id {
        return Ok(Err(error(
            "wrong-cluster",
            format!(
                "this primary's cluster id is {}, not {}: the secondary must be activated again",
                role.cluster_id, msg.auth.primary_cluster_id
            ),
        )));
    }
    let mine = &env.st.config.version;
    if super::version::older(&msg.auth.version, mine) {
        return Ok(Err(error(
            super::version::TOO_OLD,
            super::version::refusal(&msg.auth.version, mine),
        )));
    }
    let ctx = env.ctx();
    let rec = load_record(&ctx, mode, &msg.auth.secondary_id)?;
    let ok = rec.as_ref().is_some_and(|r| {
        let h = crate::crypto::sha256_hex(msg.auth.secret.as_bytes());
        crate::crypto::ct_eq(h.as_bytes(), r.secret_hash.as_bytes())
    });
    match rec {
        Some(r) if ok => Ok(Ok(r)),
        _ => Ok(Err(error(
            "unknown-secondary",
            format!(
                "secondary {:?} is unknown to this primary or was revoked; activate it with a new secondary token",
                msg.auth.secondary_id
            ),
        ))),
    }
}

fn answer(env: &mut Env, id: u64, msg: PeerMsg) -> ApiResult<Option<PeerAnswer>> {
    let rec = match authenticate(env, &msg)? {
        Ok(r) => r,
        Err(a) => return Ok(Some(a)),
    };
    let mode = msg.mode;
    let now = env.now;
    env.st.repl.live.insert(
        (mode, rec.id.clone()),
        Live {
            api_addr: msg.auth.api_addr.clone(),
            cluster_addr: msg.auth.cluster_addr.clone(),
            cluster_id: msg.auth.cluster_id.clone(),
            last_seen: now,
            version: msg.auth.version.clone(),
        },
    );
    let view = View::new(&env.ctx(), mode, &rec)?;
    let a = match msg.body {
        // The node runs these as requests ([`super::forward::admit`]); never reached.
        PeerBody::Forward { .. } => error(
            "bad-request",
            "a forwarded request is not a replication call",
        ),
        PeerBody::Ping => PeerAnswer::Pong {
            info: info(env, mode, &view),
        },
        PeerBody::Pull {
            after,
            max_entries,
            wait_ms,
        } => {
            let w = env.st.repl.wal;
            if w.keys_after(after) && !w.has_after(after) {
                changes(env, &view, after)?
            } else if after > w.last || !w.has_after(after) {
                PeerAnswer::Gone {
                    info: info(env, mode, &view),
                }
            } else if after == w.last && wait_ms > 0 {
                let wait = wait_ms.min(env.cfg().pull_wait_ms);
                env.st.repl.waiters.push(Waiter {
                    id,
                    mode,
                    secondary_id: rec.id.clone(),
                    after,
                    max: max_entries,
                    deadline: now + wait,
                });
                return Ok(None);
            } else {
                batch(env, &view, after, max_entries)?
            }
        }
        PeerBody::MerkleRoots => {
            let mut roots = Vec::new();
            for k in kinds(mode) {
                for (sid, h) in env.st.repl.trees.roots(*k, &|s| view.subtree_ok(*k, s)) {
                    roots.push(((*k, sid), hex::encode(h)));
                }
            }
            PeerAnswer::Roots {
                info: info(env, mode, &view),
                index: env.st.repl.wal.last,
                roots,
            }
        }
        PeerBody::MerklePages { subtrees } => {
            let mut pages = Vec::new();
            for (k, sid) in subtrees {
                if !view.subtree_ok(k, &sid) {
                    continue;
                }
                let st = env.st.repl.trees.get(k, &sid).cloned().unwrap_or_default();
                pages.push(((k, sid), Hashes(st.page_hashes().to_vec())));
            }
            PeerAnswer::Pages { pages }
        }
        PeerBody::MerkleSubpages { want } => {
            let mut subpages = Vec::new();
            for ((k, sid), ps) in want {
                if !view.subtree_ok(k, &sid) {
                    continue;
                }
                let st = env.st.repl.trees.get(k, &sid).cloned().unwrap_or_default();
                for p in ps {
                    let p = p as usize;
                    if p >= merkle::PAGES {
                        continue;
                    }
                    let sums = Hashes(st.subpages(p).to_vec());
                    subpages.push(((k, sid.clone()), p as u16, sums));
                }
            }
            PeerAnswer::Subpages { subpages }
        }
        PeerBody::MerkleSync {
            subtree: (k, sid),
            after,
            until,
            max_values,
            holdings,
        } => {
            if view.subtree_ok(k, &sid) {
                let range = (after.as_deref(), until.as_deref());
                sync_batch(env, k, &sid, range, max_values, &holdings)?
            } else {
                error(
                    "bad-request",
                    format!("subtree {sid:?} is not replicated to this secondary"),
                )
            }
        }
    };
    Ok(Some(a))
}

/// Most values in one [`PeerAnswer::Synced`], whatever the secondary asks for.
const SYNC_MAX_VALUES: u32 = 1 << 16;
/// A [`PeerAnswer::Synced`] stops adding values past this many key and value bytes.
const SYNC_MAX_BYTES: usize = 4 << 20;

/// Answers a [`PeerBody::MerkleSync`]: compares the secondary's short leaves in the request's
/// range (after `after`, up to `until` when the secondary sent a window) with this primary's
/// keys in the same buckets and range, read in key order from the cursor on, and returns the
/// values the secondary lacks (up to the limits: `more` then says to ask again after
/// `upto`), which of its leaves this primary does not hold, and the end of the range read
/// (`upto`): a stale position counts only for a key up to there. A round reads what it
/// covers, never the whole subtree.
fn sync_batch(
    env: &mut Env,
    kind: TreeKind,
    sid: &str,
    (after, until): (Option<&str>, Option<&str>),
    max_values: u32,
    holdings: &Holdings,
) -> ApiResult<PeerAnswer> {
    let uuids = env.st.repl.local_uuids.clone();
    let prefix = class::subtree_prefix(sid).unwrap_or_default();
    let theirs: BTreeSet<&msg::ShortLeaf> = holdings.leaves.iter().collect();
    let max = max_values.clamp(1, SYNC_MAX_VALUES) as usize;
    let mut held: BTreeSet<msg::ShortLeaf> = BTreeSet::new();
    let mut values = Vec::new();
    let mut bytes = 0usize;
    let mut more = false;
    let mut upto: Option<String> = None;
    let mut scan = SubtreeScan::new(
        &*env.storage,
        &uuids,
        kind,
        sid,
        Some(&holdings.buckets),
        after,
    );
    while let Some((key, v)) = scan.next_entry()? {
        let l = msg::short_leaf(&merkle::leaf(&key, &v));
        let rel = relative(&prefix, key);
        if until.is_some_and(|u| rel.as_str() > u) {
            break;
        }
        if !theirs.contains(&l) {
            if values.len() >= max || bytes >= SYNC_MAX_BYTES {
                more = true;
                break;
            }
            bytes += rel.len() + v.len();
            values.push((rel.clone(), v));
        }
        held.insert(l);
        upto = Some(rel);
    }
    if !more {
        // The whole range was read: to the end of the secondary's window (it holds more
        // after it: `more`), or to the end of the subtree.
        upto = until.map(str::to_string);
        more = upto.is_some();
    }
    let stale = holdings
        .leaves
        .iter()
        .enumerate()
        .filter(|(_, l)| !held.contains(*l))
        .map(|(i, _)| i as u32)
        .collect();
    Ok(PeerAnswer::Synced {
        batch: SyncBatch { stale, values },
        more,
        upto,
    })
}

/// A key of a subtree relative to the subtree's storage prefix.
pub(crate) fn relative(prefix: &str, key: String) -> String {
    match key.strip_prefix(prefix) {
        Some(r) => r.to_string(),
        None => key,
    }
}

/// The keys of one subtree of one tree (optionally only in some buckets) with leaf hashes.
pub(crate) fn subtree_keys(
    s: &dyn Storage,
    uuids: &BTreeSet<String>,
    kind: TreeKind,
    sid: &str,
    buckets: Option<&BTreeSet<u32>>,
) -> ApiResult<Vec<(String, merkle::Hash)>> {
    Ok(subtree_entries(s, uuids, kind, sid, buckets)?
        .into_iter()
        .map(|(k, v)| {
            let h = merkle::leaf(&k, &v);
            (k, h)
        })
        .collect())
}

/// The keys of one subtree of one tree (optionally only in some buckets) with their stored
/// bytes.
pub(crate) fn subtree_entries(
    s: &dyn Storage,
    uuids: &BTreeSet<String>,
    kind: TreeKind,
    sid: &str,
    buckets: Option<&BTreeSet<u32>>,
) -> ApiResult<Vec<(String, Vec<u8>)>> {
    let mut scan = SubtreeScan::new(s, uuids, kind, sid, buckets, None);
    let mut out = Vec::new();
    while let Some(e) = scan.next_entry()? {
        out.push(e);
    }
    Ok(out)
}

/// Entries after `after` (whole write sets, filtered for the secondary).
fn batch(env: &mut Env, view: &View, after: u64, max: u32) -> ApiResult<PeerAnswer> {
    let w = env.st.repl.wal;
    let max = max.clamp(1, env.cfg().batch_entries.max(1)) as u64;
    let mut entries: Vec<WalEntry> = Vec::new();
    let mut last = after;
    let mut i = after + 1;
    let mut taken = 0u64;
    while i <= w.last {
        // From the entries kept in memory (never one before the retained range), else from
        // storage.
        let e = match env.st.repl.tail.get(i).filter(|_| i >= w.first) {
            Some(e) => Cow::Borrowed(e),
            None => match wal::read(&*env.storage, i)? {
                Some(e) => Cow::Owned(e),
                None => break,
            },
        };
        let end = e.end;
        if view.key_ok(&e.key, e.class) {
            entries.push(e.into_owned());
        }
        taken += 1;
        last = i;
        i += 1;
        if taken >= max && end {
            break;
        }
    }
    if last == after && after < w.last {
        // The entry after `after` vanished (trimmed meanwhile).
        return Ok(PeerAnswer::Gone {
            info: info(env, view.mode, view),
        });
    }
    Ok(PeerAnswer::Entries {
        info: info(env, view.mode, view),
        entries,
        last,
    })
}

/// Most key-only entries one [`PeerAnswer::Changes`] covers (a few milliseconds of reads
/// on the core thread).
const CHANGES_MAX_KEYS: usize = 4_096;
/// A [`PeerAnswer::Changes`] stops adding keys past this many key and value bytes.
const CHANGES_MAX_BYTES: usize = 4 << 20;

/// Answers a pull from a secondary whose next entries are kept as key-only entries: the
/// current stored value (or absence) of each key they name, once per key, filtered for the
/// secondary, and the last index covered. The secondary's copy then holds values newer than
/// its position until it has applied the entries up to this answer's `at`. A round that
/// reaches the full entries goes on through them the same way (the secondary's copy is not
/// a state of ours until it is past `at` anyway; this sends each key once, in the compact
/// form, where streaming would send every entry of it).
fn changes(env: &mut Env, view: &View, after: u64) -> ApiResult<PeerAnswer> {
    let w = env.st.repl.wal;
    let mut keys = wal::read_keys(&*env.storage, &w, after, CHANGES_MAX_KEYS)?;
    if keys.first().map(|k| k.index) != Some(after + 1) {
        return Ok(PeerAnswer::Gone {
            info: info(env, view.mode, view),
        });
    }
    let mut next = keys.last().map_or(after, |k| k.index) + 1;
    if next == w.first {
        while next <= w.last && keys.len() < CHANGES_MAX_KEYS {
            let Some(e) = wal::read(&*env.storage, next)? else {
                break;
            };
            keys.push(wal::KeyEntry {
                index: next,
                class: e.class,
                key: e.key,
            });
            next += 1;
        }
    }
    let mut picked: BTreeMap<String, (Class, Option<Vec<u8>>)> = BTreeMap::new();
    let mut upto = after;
    let mut bytes = 0usize;
    for k in keys {
        if bytes >= CHANGES_MAX_BYTES {
            break;
        }
        upto = k.index;
        if !view.key_ok(&k.key, k.class) || picked.contains_key(&k.key) {
            continue;
        }
        let v = env.storage.get(&k.key)?;
        bytes += k.key.len() + v.as_ref().map_or(0, Vec::len);
        picked.insert(k.key, (k.class, v));
    }
    let changes = picked.into_iter().map(|(k, (c, v))| (k, c, v)).collect();
    Ok(PeerAnswer::Changes {
        info: info(env, view.mode, view),
        upto,
        at: w.last,
        batch: ChangeBatch { changes },
    })
}

fn answer_waiter(env: &mut Env, w: &Waiter) -> ApiResult<PeerAnswer> {
    let rec = {
        let ctx = env.ctx();
        load_record(&ctx, w.mode, &w.secondary_id)?
    };
    let Some(rec) = rec else {
        return Ok(error("unknown-secondary", "this secondary was revoked"));
    };
    let view = View::new(&env.ctx(), w.mode, &rec)?;
    let wal = env.st.repl.wal;
    if !wal.has_after(w.after) && wal.keys_after(w.after) {
        return changes(env, &view, w.after);
    }
    if !wal.has_after(w.after) {
        return Ok(PeerAnswer::Gone {
            info: info(env, w.mode, &view),
        });
    }
    if w.after >= wal.last {
        return Ok(PeerAnswer::Entries {
            info: info(env, w.mode, &view),
            entries: Vec::new(),
            last: w.after,
        });
    }
    batch(env, &view, w.after, w.max)
}

fn respond(env: &mut Env, w: &Waiter) {
    let msg = answer_waiter(env, w).unwrap_or_else(|e| error("internal", e.to_string()));
    env.push(Output::PeerResponse(PeerResponse { id: w.id, msg }));
}

/// Answers held pulls that now have entries (called after the WAL grew).
pub(crate) fn serve_waiters(env: &mut Env) {
    let last = env.st.repl.wal.last;
    let (ready, keep): (Vec<Waiter>, Vec<Waiter>) = std::mem::take(&mut env.st.repl.waiters)
        .into_iter()
        .partition(|w| w.after < last);
    env.st.repl.waiters = keep;
    for w in ready {
        respond(env, &w);
    }
}

/// Answers held pulls whose time is up with an empty batch (a heartbeat).
pub(crate) fn expire_waiters(env: &mut Env) {
    let now = env.now;
    let (due, keep): (Vec<Waiter>, Vec<Waiter>) = std::mem::take(&mut env.st.repl.waiters)
        .into_iter()
        .partition(|w| w.deadline <= now);
    env.st.repl.waiters = keep;
    for w in due {
        respond(env, &w);
    }
}

/// Answers every held pull with error `code`: the node stops serving replication (it was
/// sealed, or stepped down from active), so its secondaries go on at once instead of
/// waiting out their read timeout.
pub(crate) fn refuse_all_waiters(
    outputs: &mut std::collections::VecDeque<Output>,
    waiters: &mut Vec<Waiter>,
    code: &str,
    message: &str,
) {
    for w in std::mem::take(waiters) {
        outputs.push_back(Output::PeerResponse(PeerResponse {
            id: w.id,
            msg: error(code, message),
        }));
    }
}

/// Refuses held pulls of one secondary (revoked) or of a whole mode (demoted, disabled).
pub(crate) fn drop_waiters(
    outputs: &mut std::collections::VecDeque<Output>,
    waiters: &mut Vec<Waiter>,
    mode: Mode,
    id: Option<&str>,
    message: &str,
) {
    let (mut gone, keep): (Vec<Waiter>, Vec<Waiter>) = std::mem::take(waiters)
        .into_iter()
        .partition(|w| w.mode == mode && id.is_none_or(|i| i == w.secondary_id));
    *waiters = keep;
    refuse_all_waiters(outputs, &mut gone, "unknown-secondary", message);
}

/// Connection status of a secondary as the primary sees it.
pub(crate) fn live_view(
    live: &BTreeMap<(Mode, String), Live>,
    mode: Mode,
    id: &str,
) -> Option<Live> {
    live.get(&(mode, id.to_string())).cloned()
}
