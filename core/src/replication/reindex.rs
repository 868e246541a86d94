//! Background scans of stored data that rebuild (reindex) or verify (Merkle check) the
//! Merkle trees, run a chunk at a time between requests so the node keeps serving.
//!
//! A scan walks storage in key order with a cursor and adds every replicated or
//! cluster-local key to a fresh set of trees. Writes committed while it runs are applied to
//! the fresh trees too when their key is at or before the cursor (keys after it are read by
//! the scan later), so when the scan ends the fresh trees equal a recomputation over the data
//! as it is then. What happens next depends on the job:
//!
//! * **Merkle check**: [`merkle::check`] compares the persisted records and the trees the node
//!   serves with the fresh trees; the request gets the corruption report, and status keeps
//!   `corrupted_merkle_tree` / `last_corruption_check_epoch`.
//! * **Reindex**: with `diff`, a second pass names the keys of every subpage that disagreed
//!   and checks each against its last WAL entry; then the fresh trees replace the served
//!   ones and the records that differ (all of them with `force`) are written in the same
//!   write set, or, with `skip_flush`, a few at a time afterwards. A reindex is recorded in
//!   storage when it starts and forgotten when it is flushed, so a node that dies in the
//!   middle starts it again after unseal; a node that dies during a skipped flush finds the
//!   trees' completeness marker gone and rebuilds them when it loads. A secondary whose trees
//!   changed asks its primary for a Merkle diff, which fetches the data that differs.

use super::class::{self, Class};
use super::merkle::{self, Record, TreeKind, Trees};
use super::state::Role;
use super::wal::{self, WalEntry};
use super::{Env, Mode};
use crate::api::{body_object, ApiError, ApiResult, Fields, Reply, Request, RequestId};
use crate::ctx::Ctx;
use crate::storage::Write;
use crate::time::{rfc3339, Millis};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// Marker of a reindex that has not finished (its flags); absent when none runs.
pub const REINDEX_KEY: &str = "node/merkle-reindex";
/// The result of the last Merkle check.
pub const CHECK_KEY: &str = "node/merkle-check";
/// Most records written per step of a skipped (asynchronous) flush.
const FLUSH_CHUNK: usize = 256;
/// Most keys named in the `diff` diagnosis.
const MAX_DIFF_LINES: usize = 100;
/// Every node-local key sorts before this one and after `node/`: scans jump over them.
const NODE_LOCAL_END: &str = "node/\u{10FFFF}\u{10FFFF}\u{10FFFF}";

/// The flags of a reindex.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Flags {
    #[serde(default)]
    pub diff: bool,
    #[serde(default)]
    pub force: bool,
    #[serde(default)]
    pub skip_flush: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Reindex(Flags),
    Check,
}

#[derive(Clone, Debug)]
enum Stage {
    /// Reading every key into the fresh trees.
    Scanning,
    /// `diff`: naming the keys of the subpages that disagree.
    Diffing(Box<Diffing>),
}

#[derive(Clone, Debug, Default)]
struct Diffing {
    buckets: BTreeSet<(merkle::SubtreeId, u32)>,
    /// Latest WAL entry of each key in those buckets.
    wal: BTreeMap<String, LastWrite>,
    cursor: Option<String>,
    seen: BTreeSet<String>,
    lines: Vec<String>,
    more: usize,
}

/// The latest WAL entry of a key, as `diff` compares it with the stored value.
#[derive(Clone, Debug)]
struct LastWrite {
    /// The entry's WAL index.
    index: u64,
    /// The hash of the value it wrote.
    hash: String,
    /// It deleted the key.
    deleted: bool,
}

/// A scan in progress.
#[derive(Clone, Debug)]
pub(crate) struct Job {
    kind: Kind,
    /// The request waiting for the result (none for a reindex resumed after a restart).
    request: Option<RequestId>,
    stage: Stage,
    /// Last key read (`None`: nothing yet).
    cursor: Option<String>,
    /// The scan has read every key: all writes now go to `fresh`.
    scanned: bool,
    fresh: Trees,
    done: u64,
    total: u64,
    started: Millis,
    /// When the last chunk ran.
    last_step: Option<Millis>,
    /// The tree epoch the scan started in; a wholesale replacement restarts it.
    epoch: u64,
}

impl Job {
    /// Whether a committed write of `key` must also be applied to the fresh trees.
    pub(crate) fn covers(&self, key: &str) -> bool {
        self.scanned || self.cursor.as_deref().is_some_and(|c| key <= c)
    }
    pub(crate) fn fresh(&self) -> &Trees {
        &self.fresh
    }
    pub(crate) fn fresh_mut(&mut self) -> &mut Trees {
        &mut self.fresh
    }
    /// When the job next wants to run, given the least time between two steps
    /// ([`super::ReplicationConfig::scan_pace_ms`]).
    pub(crate) fn wake(&self, pace: Millis) -> Millis {
        self.last_step.map_or(0, |t| t + pace)
    }
    fn stage_name(&self) -> &'static str {
        match (&self.stage, self.kind) {
            (Stage::Diffing(_), _) => "diffing",
            (Stage::Scanning, Kind::Check) => "checking",
            (Stage::Scanning, Kind::Reindex(_)) => "building",
        }
    }
}

/// The result of the last Merkle check (node-local).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CheckRecord {
    pub corrupted: bool,
    pub at_ms: u64,
}

/// Background work state kept by [`super::Replication`].
#[derive(Clone, Debug, Default)]
pub(crate) struct Jobs {
    pub job: Option<Job>,
    /// Records still to write after a reindex with `skip_flush`.
    pub flush: Vec<Record>,
    /// Stray keys under the page prefix to delete during that flush.
    pub flush_stray: Vec<String>,
    /// Bumped when the trees are replaced wholesale (activation).
    pub epoch: u64,
    /// Summary of the last finished reindex (status).
    pub last_reindex: Option<Value>,
    /// A request whose job was dropped when the node sealed.
    pub interrupted: Option<RequestId>,
}

impl Jobs {
    /// No reindex, Merkle check or skipped flush is running: nothing but the writes
    /// themselves writes Merkle records.
    pub(crate) fn idle(&self) -> bool {
        self.job.is_none() && self.flush.is_empty() && self.flush_stray.is_empty()
    }

    /// When background work next wants to run (`pace`: as [`Job::wake`]).
    pub(crate) fn wake(&self, pace: Millis) -> Option<Millis> {
        match &self.job {
            Some(j) => Some(j.wake(pace)),
            None if !self.flush.is_empty() || !self.flush_stray.is_empty() => Some(0),
            None => None,
        }
    }
}

/// `POST sys/replication/reindex` (and the DR secondary variant, once its token is checked).
pub(crate) fn start_reindex(ctx: &mut Ctx, jobs: &mut Jobs, req: &Request) -> ApiResult {
    let body = body_object(&req.body)?;
    let f = Fields(&body);
    let flags = Flags {
        diff: f.bool("diff")?.unwrap_or(false),
        force: f.bool("force")?.unwrap_or(false),
        skip_flush: f.bool("skip_flush")?.unwrap_or(false),
    };
    refuse_if_busy(jobs)?;
    let marker = serde_json::to_vec(&flags).map_err(|e| ApiError::Internal(e.to_string()))?;
    ctx.txn.put(REINDEX_KEY, marker);
    begin(jobs, Kind::Reindex(flags), Some(req.id), ctx.now);
    log::info!(
        "reindex started (diff={}, force={}, skip_flush={})",
        flags.diff,
        flags.force,
        flags.skip_flush
    );
    Ok(Reply::Pending)
}

/// `POST sys/replication/merkle-check` (and the DR secondary variant).
pub(crate) fn start_check(ctx: &mut Ctx, jobs: &mut Jobs, req: &Request) -> ApiResult {
    body_object(&req.body)?;
    refuse_if_busy(jobs)?;
    begin(jobs, Kind::Check, Some(req.id), ctx.now);
    Ok(Reply::Pending)
}

fn refuse_if_busy(jobs: &Jobs) -> ApiResult<()> {
    if let Some(j) = &jobs.job {
        let what = match j.kind {
            Kind::Reindex(_) => "a reindex",
            Kind::Check => "a Merkle check",
        };
        return Err(ApiError::bad(format!(
            "{what} is already running ({}: {} of {} keys); wait for it to finish (see sys/replication/status)",
            j.stage_name(),
            j.done,
            j.total
        )));
    }
    if !jobs.flush.is_empty() {
        return Err(ApiError::bad(
            "the previous reindex is still flushing its trees to storage; retry in a moment",
        ));
    }
    Ok(())
}

fn begin(jobs: &mut Jobs, kind: Kind, request: Option<RequestId>, now: Millis) {
    jobs.job = Some(Job {
        kind,
        request,
        stage: Stage::Scanning,
        cursor: None,
        scanned: false,
        fresh: Trees::default(),
        done: 0,
        total: 0,
        started: now,
        last_step: None,
        epoch: jobs.epoch,
    });
}

/// Starts again a reindex that a restart interrupted (called once roles are loaded).
pub(crate) fn resume(env: &mut Env) -> ApiResult<()> {
    if env.st.repl.jobs.job.is_some() {
        return Ok(());
    }
    let Some(b) = env.storage.get(REINDEX_KEY)? else {
        return Ok(());
    };
    let flags: Flags = serde_json::from_slice(&b).unwrap_or_default();
    log::warn!("a reindex was interrupted (the node stopped or sealed); starting it again");
    let now = env.now;
    begin(&mut env.st.repl.jobs, Kind::Reindex(flags), None, now);
    Ok(())
}

/// The node sealed: the job stops (a reindex starts again after unseal).
pub(crate) fn on_seal(jobs: &mut Jobs) {
    if let Some(j) = jobs.job.take() {
        jobs.interrupted = j.request;
    }
}

/// Runs one chunk of background work if it is due; returns a finished request.
pub(crate) fn step(env: &mut Env) -> Option<(RequestId, ApiResult)> {
    if let Some(id) = env.st.repl.jobs.interrupted.take() {
        return Some((
            id,
            Err(ApiError::Unavailable(
                "the node was sealed while the scan ran; a reindex starts again after unseal, a Merkle check must be asked again".into(),
            )),
        ));
    }
    if env.st.repl.jobs.job.is_none() {
        if let Err(e) = flush_step(env) {
            log::error!("flushing the reindexed Merkle trees failed: {e}");
        }
        return None;
    }
    let now = env.now;
    let pace = env.cfg().scan_pace_ms;
    let job = env.st.repl.jobs.job.as_mut()?;
    if job.wake(pace) > now {
        return None;
    }
    job.last_step = Some(now);
    let result = run_chunk(env);
    match result {
        Ok(None) => None,
        Ok(Some(reply)) => {
            let job = env.st.repl.jobs.job.take()?;
            job.request.map(|id| (id, Ok(reply)))
        }
        Err(e) => {
            log::error!("background Merkle scan failed: {e}");
            let job = env.st.repl.jobs.job.take()?;
            job.request.map(|id| (id, Err(e)))
        }
    }
}

/// One chunk of the current stage; `Some(reply)` when the job is finished.
fn run_chunk(env: &mut Env) -> ApiResult<Option<Reply>> {
    let chunk = env.st.config.replication.scan_chunk.max(1);
    let epoch = env.st.repl.jobs.epoch;
    let Some(job) = env.st.repl.jobs.job.as_mut() else {
        return Ok(None);
    };
    if job.epoch != epoch {
        // The trees were replaced under the scan (activation): start over.
        job.epoch = epoch;
        job.cursor = None;
        job.scanned = false;
        job.fresh = Trees::default();
        job.done = 0;
        job.stage = Stage::Scanning;
    }
    if let Stage::Diffing(_) = job.stage {
        return diff_chunk(env, chunk);
    }
    if job.cursor.is_none() && job.done == 0 {
        job.total = env.storage.count()?;
    }
    let uuids = &env.st.repl.local_uuids;
    let (n, last) = add_chunk(
        &*env.storage,
        job.cursor.as_deref(),
        chunk,
        &mut job.fresh,
        uuids,
    )?;
    job.done += n as u64;
    if last.is_some() {
        job.cursor = last;
    }
    if n < chunk {
        job.fresh.finish();
        job.scanned = true;
        job.done = job.done.max(job.total);
        return finish_scan(env);
    }
    // Writes committed meanwhile update the fresh trees' sums (see `Job::covers`); every
    // hash is recomputed when the scan ends.
    Ok(None)
}

/// Reads up to `limit` keys after `after` into trees being rebuilt (node-local keys are in
/// none), each row hashed as storage lends it; returns how many keys it read and the cursor
/// after them (`None` when it read none).
fn add_chunk(
    storage: &dyn crate::storage::Storage,
    after: Option<&str>,
    limit: usize,
    trees: &mut Trees,
    local_uuids: &BTreeSet<String>,
) -> Result<(usize, Option<String>), crate::storage::StorageError> {
    let mut bulk = trees.bulk();
    let mut last = String::new();
    let n = storage.visit_after(after, limit, &mut |k, v| {
        let c = class::classify(k, local_uuids);
        if c != Class::NodeLocal {
            bulk.add(tree_of(c), k, v);
        }
        last.clear();
        last.push_str(k);
    })?;
    drop(bulk);
    if n == 0 {
        return Ok((0, None));
    }
    Ok((
        n,
        Some(if last.starts_with(class::NODE_LOCAL) {
            NODE_LOCAL_END.to_string()
        } else {
            last
        }),
    ))
}

fn tree_of(c: Class) -> TreeKind {
    if c == Class::Replicated {
        TreeKind::Replicated
    } else {
        TreeKind::Local
    }
}

/// The scan read everything: report (check), diagnose (`diff`) or install (reindex).
fn finish_scan(env: &mut Env) -> ApiResult<Option<Reply>> {
    let kind = env
        .st
        .repl
        .jobs
        .job
        .as_ref()
        .map(|j| j.kind)
        .ok_or(ApiError::Internal("no background scan".into()))?;
    match kind {
        Kind::Check => finish_check(env).map(Some),
        Kind::Reindex(flags) => {
            if flags.diff {
                let stored = env.storage.scan(merkle::PREFIX)?;
                let job = env
                    .st
                    .repl
                    .jobs
                    .job
                    .as_ref()
                    .ok_or(ApiError::Internal("no background scan".into()))?;
                let mut buckets: BTreeSet<(merkle::SubtreeId, u32)> = env
                    .st
                    .repl
                    .trees
                    .differing_buckets(&job.fresh)
                    .into_iter()
                    .collect();
                let report = merkle::check(&job.fresh, &env.st.repl.trees, &stored);
                for s in &report.subtrees {
                    for (p, f) in &s.pages {
                        for sp in &f.subpages {
                            buckets
                                .insert((s.id.clone(), (p * merkle::SUBPAGES) as u32 + *sp as u32));
                        }
                    }
                }
                if !buckets.is_empty() {
                    let wal = wal_index(env, &buckets)?;
                    if let Some(j) = env.st.repl.jobs.job.as_mut() {
                        j.stage = Stage::Diffing(Box::new(Diffing {
                            buckets,
                            wal,
                            ..Default::default()
                        }));
                    }
                    return Ok(None);
                }
            }
            finish_reindex(env, flags, Vec::new()).map(Some)
        }
    }
}

/// The latest WAL entry of every key that falls in `buckets`.
fn wal_index(
    env: &Env,
    buckets: &BTreeSet<(merkle::SubtreeId, u32)>,
) -> ApiResult<BTreeMap<String, LastWrite>> {
    let mut out = BTreeMap::new();
    for (_, v) in env.storage.scan(wal::ENTRY)? {
        let Ok(e) = serde_json::from_slice::<WalEntry>(&v) else {
            continue;
        };
        if e.class == Class::NodeLocal {
            continue;
        }
        let id = (tree_of(e.class), class::subtree(&e.key));
        if buckets.contains(&(id, merkle::bucket_index(&e.key))) {
            let last = LastWrite {
                index: e.index,
                hash: e.hash.clone(),
                deleted: e.value.is_none(),
            };
            out.insert(e.key.clone(), last);
        }
    }
    Ok(out)
}

/// `diff`: one chunk of the second pass, naming keys of the disagreeing subpages.
fn diff_chunk(env: &mut Env, chunk: usize) -> ApiResult<Option<Reply>> {
    let cursor = match env.st.repl.jobs.job.as_ref().map(|j| &j.stage) {
        Some(Stage::Diffing(d)) => d.cursor.clone(),
        _ => return Ok(None),
    };
    let batch = env.storage.scan_after(cursor.as_deref(), chunk)?;
    let uuids = env.st.repl.local_uuids.clone();
    let Some(Job {
        stage: Stage::Diffing(d),
        kind,
        ..
    }) = env.st.repl.jobs.job.as_mut()
    else {
        return Ok(None);
    };
    let kind = *kind;
    for (k, v) in &batch {
        let c = class::classify(k, &uuids);
        if c == Class::NodeLocal {
            continue;
        }
        let id = (tree_of(c), class::subtree(k));
        if !d.buckets.contains(&(id, merkle::bucket_index(k))) {
            continue;
        }
        d.seen.insert(k.clone());
        let line = match d.wal.get(k) {
            Some(LastWrite {
                index: i,
                hash,
                deleted: false,
            }) if *hash == crate::crypto::sha256_hex(v) => format!(
                "key {k:?}: the stored value matches its last write (WAL index {i}); the tree was wrong"
            ),
            Some(LastWrite {
                index: i,
                deleted: false,
                ..
            }) => format!(
                "key {k:?}: the stored value differs from its last write (WAL index {i}): the value is corrupt"
            ),
            Some(LastWrite {
                index: i,
                deleted: true,
                ..
            }) => format!(
                "key {k:?}: present in storage but deleted by WAL index {i}"
            ),
            None => format!(
                "key {k:?}: in a subpage that disagreed; no WAL entry to compare it with (older than the WAL's retention)"
            ),
        };
        push_line(d, line);
    }
    if let Some((last, _)) = batch.last() {
        d.cursor = Some(if last.starts_with(class::NODE_LOCAL) {
            NODE_LOCAL_END.to_string()
        } else {
            last.clone()
        });
    }
    if batch.len() < chunk {
        let missing: Vec<(String, u64)> = d
            .wal
            .iter()
            .filter(|(k, w)| !w.deleted && !d.seen.contains(*k))
            .map(|(k, w)| (k.clone(), w.index))
            .collect();
        for (k, i) in missing {
            push_line(
                d,
                format!("key {k:?}: missing from storage (last written at WAL index {i})"),
            );
        }
        let mut lines = std::mem::take(&mut d.lines);
        let more = d.more;
        if more > 0 {
            lines.push(format!("... and {more} more keys"));
        }
        let flags = match kind {
            Kind::Reindex(f) => f,
            Kind::Check => Flags::default(),
        };
        return finish_reindex(env, flags, lines).map(Some);
    }
    Ok(None)
}

fn push_line(d: &mut Diffing, line: String) {
    if d.lines.len() < MAX_DIFF_LINES {
        d.lines.push(line);
    } else {
        d.more += 1;
    }
}

fn finish_check(env: &mut Env) -> ApiResult<Reply> {
    let stored = env.storage.scan(merkle::PREFIX)?;
    let job = env
        .st
        .repl
        .jobs
        .job
        .as_ref()
        .ok_or(ApiError::Internal("no background scan".into()))?;
    let report = merkle::check(&job.fresh, &env.st.repl.trees, &stored);
    let rec = CheckRecord {
        corrupted: !report.is_clean(),
        at_ms: env.now,
    };
    let bytes = serde_json::to_vec(&rec).map_err(|e| ApiError::Internal(e.to_string()))?;
    env.storage.apply(&[(CHECK_KEY.to_string(), Some(bytes))])?;
    if rec.corrupted {
        log::warn!(
            "Merkle check: corruption found in {} subtree(s); run a reindex to repair the trees",
            report.subtrees.len()
        );
    } else {
        log::info!("Merkle check: the trees match the stored data");
    }
    Ok(Reply::Data(json!({
        "merkle_corruption_report": report_json(&report, env.now),
    })))
}

/// The spec's `merkle_corruption_report`.
pub fn report_json(r: &merkle::CheckReport, now: Millis) -> Value {
    let mut map = Map::new();
    for s in &r.subtrees {
        let pages: Map<String, Value> = s
            .pages
            .iter()
            .map(|(p, f)| {
                (
                    p.to_string(),
                    json!({ "corrupted": f.corrupted, "subpages": f.subpages }),
                )
            })
            .collect();
        map.insert(
            s.index.to_string(),
            json!({
                "corrupted_index_tuples_map": if pages.is_empty() { Value::Null } else { Value::Object(pages) },
                "corrupted_subtree_root": s.corrupted_root,
                "root_hash": hex::encode(s.stored_root),
                "expected_root_hash": hex::encode(s.expected_root),
                "subtree": s.id.1,
                "tree_type": s.id.0.name(),
            }),
        );
    }
    json!({
        "corrupted_root": r.corrupted_root,
        "corrupted_tree_map": map,
        "last_corruption_check_epoch": rfc3339(now),
    })
}

/// Installs the fresh trees and writes (or queues) the records that differ.
fn finish_reindex(env: &mut Env, flags: Flags, diff_lines: Vec<String>) -> ApiResult<Reply> {
    let stored = env.storage.scan(merkle::PREFIX)?;
    let job = env
        .st
        .repl
        .jobs
        .job
        .as_mut()
        .ok_or(ApiError::Internal("no background scan".into()))?;
    let fresh = std::mem::take(&mut job.fresh);
    let (started, keys) = (job.started, job.done);
    let report = merkle::check(&fresh, &env.st.repl.trees, &stored);
    let mut records: BTreeSet<Record> = fresh.records().into_iter().collect();
    let mut stray: Vec<String> = Vec::new();
    let mut have: BTreeMap<Record, &[u8]> = BTreeMap::new();
    for (k, v) in &stored {
        match merkle::parse_key(k) {
            Some(r) => {
                have.insert(r.clone(), v.as_slice());
                records.insert(r);
            }
            None => stray.push(k.clone()),
        }
    }
    let to_write: Vec<Record> = records
        .into_iter()
        .filter(|r| flags.force || fresh.record(r).as_deref() != have.get(r).copied())
        .collect();
    let repaired = to_write.len();
    env.st.repl.trees = fresh;
    let mut warnings: Vec<String> = Vec::new();
    let secs = env.now.saturating_sub(started) as f64 / 1000.0;
    if report.is_clean() {
        warnings.push(format!(
            "reindex scanned {keys} keys in {secs:.1} s: the Merkle trees already matched the stored data"
        ));
    } else {
        let subtrees: Vec<String> = report
            .subtrees
            .iter()
            .map(|s| {
                let pages: Vec<String> = s.pages.keys().map(|p| p.to_string()).collect();
                format!(
                    "{} {} (pages [{}]{})",
                    s.id.0.name(),
                    s.id.1,
                    pages.join(", "),
                    if s.corrupted_root { ", root" } else { "" }
                )
            })
            .collect();
        warnings.push(format!(
            "reindex scanned {keys} keys in {secs:.1} s and rebuilt the Merkle trees; records that differed: {}",
            subtrees.join("; ")
        ));
    }
    warnings.extend(diff_lines);
    if flags.skip_flush {
        // The completeness marker goes first: a node that dies before the flush is done
        // rebuilds its trees from storage when it next loads them.
        env.storage.apply(&[
            (merkle::MARKER.to_string(), None),
            (REINDEX_KEY.to_string(), None),
        ])?;
        env.st.repl.jobs.flush = to_write;
        env.st.repl.jobs.flush_stray = stray;
        warnings.push(format!(
            "skip_flush: {repaired} tree records are written in the background; if this node stops before that finishes it rebuilds its trees from storage when it starts (a clean shutdown finishes the flush first)"
        ));
    } else {
        let trees = &env.st.repl.trees;
        let mut writes: Vec<Write> = to_write
            .iter()
            .map(|r| (merkle::record_key(r), trees.record(r)))
            .collect();
        writes.extend(stray.into_iter().map(|k| (k, None)));
        writes.push((merkle::MARKER.to_string(), Some(merkle::VERSION.to_vec())));
        writes.push((REINDEX_KEY.to_string(), None));
        env.storage.apply(&writes)?;
    }
    if !report.is_clean() {
        let mut resync = Vec::new();
        for m in [Mode::Performance, Mode::Dr] {
            if env.st.repl.role(m) == Role::Secondary {
                let rt = env.st.repl.mode_mut(m);
                rt.role.needs_sync = true;
                // A diff or sync in progress compared the old trees: it ends in another diff.
                // Also one waiting to resume after a failed round (its phase is `idle` then),
                // whose end would otherwise clear `needs_sync`; with none in progress, the
                // next step starts the diff and clears this.
                rt.sec.rediff = true;
                // A catch-up by changed keys cannot show what the check found: diff instead.
                rt.sec.catch_up = None;
                resync.push(env.role_write(m)?);
            }
        }
        if !resync.is_empty() {
            let w: Vec<Write> = resync.into_iter().map(|c| (c.key, c.value)).collect();
            env.storage.apply(&w)?;
            warnings.push(
                "this secondary's trees changed: it compares them with its primary's (Merkle diff) and fetches the data that differs".into(),
            );
        }
    }
    for w in &warnings {
        log::info!("reindex: {w}");
    }
    env.st.repl.jobs.last_reindex = Some(json!({
        "finished_at": rfc3339(env.now),
        "keys": keys,
        "records_written": repaired,
        "found_corruption": !report.is_clean(),
        "diff": flags.diff,
        "force": flags.force,
        "skip_flush": flags.skip_flush,
    }));
    Ok(Reply::Envelope(json!({ "warnings": warnings })))
}

/// One step of a skipped flush: writes the next records from the trees as they are now.
fn flush_step(env: &mut Env) -> ApiResult<()> {
    let jobs = &mut env.st.repl.jobs;
    if jobs.flush.is_empty() && jobs.flush_stray.is_empty() {
        return Ok(());
    }
    let n = jobs.flush.len().min(FLUSH_CHUNK);
    let batch: Vec<Record> = jobs.flush.drain(..n).collect();
    let stray: Vec<String> = std::mem::take(&mut jobs.flush_stray);
    let done = jobs.flush.is_empty();
    let trees = &env.st.repl.trees;
    let mut writes: Vec<Write> = batch
        .iter()
        .map(|r| (merkle::record_key(r), trees.record(r)))
        .collect();
    writes.extend(stray.into_iter().map(|k| (k, None)));
    if done {
        writes.push((merkle::MARKER.to_string(), Some(merkle::VERSION.to_vec())));
    }
    env.storage.apply(&writes)?;
    if done {
        log::info!("reindex: the Merkle trees are flushed to storage");
    }
    Ok(())
}

/// Finishes a skipped flush at once (clean shutdown).
pub(crate) fn flush_all(env: &mut Env) -> ApiResult<()> {
    while !env.st.repl.jobs.flush.is_empty() || !env.st.repl.jobs.flush_stray.is_empty() {
        flush_step(env)?;
    }
    Ok(())
}

/// Status fields of background scans (both modes' status objects carry them).
pub(crate) fn status_fields(ctx: &Ctx, jobs: &Jobs, o: &mut Map<String, Value>) -> ApiResult<()> {
    let last = ctx
        .txn
        .get(CHECK_KEY)?
        .and_then(|b| serde_json::from_slice::<CheckRecord>(&b).ok());
    let (corrupted, epoch) = match &last {
        Some(c) => (c.corrupted, (c.at_ms / 1000).to_string()),
        None => (false, "-62135596800".to_string()),
    };
    o.insert("corrupted_merkle_tree".into(), json!(corrupted));
    o.insert("last_corruption_check_epoch".into(), json!(epoch));
    let reindexing = matches!(&jobs.job, Some(j) if matches!(j.kind, Kind::Reindex(_)));
    o.insert("reindex_in_progress".into(), json!(reindexing));
    match &jobs.job {
        Some(j) => {
            o.insert("reindex_stage".into(), json!(j.stage_name()));
            o.insert("reindex_building_progress".into(), json!(j.done));
            o.insert("reindex_building_total".into(), json!(j.total));
        }
        None if !jobs.flush.is_empty() => {
            o.insert("reindex_stage".into(), json!("flushing"));
            o.insert("reindex_building_progress".into(), json!(0));
            o.insert("reindex_building_total".into(), json!(jobs.flush.len()));
        }
        None => {}
    }
    if let Some(r) = &jobs.last_reindex {
        o.insert("last_reindex".into(), r.clone());
    }
    Ok(())
}

/// Progress of the running scan for metrics: (keys done, keys total).
pub(crate) fn progress(jobs: &Jobs) -> Option<(u64, u64)> {
    jobs.job.as_ref().map(|j| (j.done, j.total))
}

/// [`rebuild`] with the node's local mount set (model tests).
#[cfg(test)]
pub(crate) fn rebuild_for_tests(
    storage: &dyn crate::storage::Storage,
    repl: &super::Replication,
) -> Trees {
    rebuild(storage, &repl.local_uuids).unwrap_or_default()
}

/// Recomputes both trees from storage in one go (loading trees that were never persisted or
/// were left incomplete), reading a bounded number of keys at a time.
pub(crate) fn rebuild(
    storage: &dyn crate::storage::Storage,
    local_uuids: &BTreeSet<String>,
) -> Result<Trees, crate::storage::StorageError> {
    const CHUNK: usize = 4096;
    let mut trees = Trees::default();
    let mut cursor: Option<String> = None;
    loop {
        let (n, last) = add_chunk(storage, cursor.as_deref(), CHUNK, &mut trees, local_uuids)?;
        if n < CHUNK {
            break;
        }
        cursor = last;
    }
    trees.finish();
    Ok(trees)
}

#[cfg(test)]
#[path = "reindex_tests.rs"]
mod tests;
