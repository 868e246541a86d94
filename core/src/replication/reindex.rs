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
use super::{Env, Mode, Phase};
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

#[derive(Debug)]
enum Stage {
    /// Reading every key into the fresh trees.
    Scanning,
    /// `diff`: naming the keys of the subpages that disagree.
    Diffing(Box<Diffing>),
}

#[derive(Debug, Default)]
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
#[derive(Debug)]
struct LastWrite {
    /// The entry's WAL index.
    index: u64,
    /// The hash of the value it wrote.
    hash: String,
    /// It deleted the key.
    deleted: bool,
}

/// A scan in progress.
#[derive(Debug)]
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
    /// When the last chunk ran (one chunk per millisecond at most).
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
    /// When the job next wants to run.
    pub(crate) fn wake(&self) -> Millis {
        self.last_step.map_or(0, |t| t + 1)
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
#[derive(Debug, Default)]
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

    /// When background work next wants to run.
    pub(crate) fn wake(&self) -> Option<Millis> {
        match &self.job {
            Some(j) => Some(j.wake()),
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
    let job = env.st.repl.jobs.job.as_mut()?;
    if job.wake() > now {
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
    let batch = env.storage.scan_after(job.cursor.as_deref(), chunk)?;
    let uuids = &env.st.repl.local_uuids;
    let job = env
        .st
        .repl
        .jobs
        .job
        .as_mut()
        .ok_or(ApiError::Internal("the background scan disappeared".into()))?;
    let n = batch.len();
    for (k, v) in &batch {
        match class::classify(k, uuids) {
            Class::NodeLocal => {}
            c => job.fresh.add_bulk(tree_of(c), &class::subtree(k), k, v),
        }
    }
    job.done += n as u64;
    if let Some((last, _)) = batch.last() {
        job.cursor = Some(if last.starts_with(class::NODE_LOCAL) {
            NODE_LOCAL_END.to_string()
        } else {
            last.clone()
        });
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
                rt.sec.rediff = matches!(rt.sec.phase, Phase::MerkleDiff | Phase::MerkleSync);
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
        let batch = storage.scan_after(cursor.as_deref(), CHUNK)?;
        for (k, v) in &batch {
            match class::classify(k, local_uuids) {
                Class::NodeLocal => {}
                c => trees.add_bulk(tree_of(c), &class::subtree(k), k, v),
            }
        }
        match batch.last() {
            Some((last, _)) if batch.len() == CHUNK => {
                cursor = Some(if last.starts_with(class::NODE_LOCAL) {
                    NODE_LOCAL_END.to_string()
                } else {
                    last.clone()
                });
            }
            _ => break,
        }
    }
    trees.finish();
    Ok(trees)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Method, Response};
    use crate::node::{Admin, AdminResult, Input, Node, NodeConfig, Output};
    use crate::replication::ReplicationConfig;
    use crate::storage::{MemStorage, Storage};

    /// A dev node on memory storage, its unseal key, and a clock.
    struct One {
        node: Node<MemStorage>,
        key: String,
        now: u64,
        next: u64,
    }

    fn config(chunk: usize) -> NodeConfig {
        NodeConfig {
            replication: ReplicationConfig {
                scan_chunk: chunk,
                // These tests look at the stored records after each request.
                defer_merkle_ms: 0,
                ..Default::default()
            },
            license: crate::license::LicenseState::hosted(),
            ..Default::default()
        }
    }

    impl One {
        fn new(chunk: usize) -> One {
            One::with_config(config(chunk))
        }

        fn with_config(cfg: NodeConfig) -> One {
            let mut node = Node::new(MemStorage::new(), [9; 32], cfg);
            node.handle(
                1_000,
                Input::Admin {
                    id: 1,
                    cmd: Admin::DevSetup {
                        root_token_id: Some("root".into()),
                    },
                },
            );
            let mut key = String::new();
            while let Some(o) = node.poll_output() {
                if let Output::AdminDone {
                    result: Ok(AdminResult::DevSetup(k)),
                    ..
                } = o
                {
                    key = k.keys_base64[0].clone();
                }
            }
            One {
                node,
                key,
                now: 1_000,
                next: 0,
            }
        }

        /// The same storage in a new process (a crash: in-memory state is lost), unsealed.
        fn restart(&mut self, chunk: usize) {
            let storage = self.node.storage().clone();
            self.node = Node::new(storage, [10; 32], config(chunk));
            let key = self.key.clone();
            let r = self.call(Method::Post, "sys/unseal", json!({ "key": key }));
            assert_eq!(r.status, 200, "{:?}", r.body);
            // The next input loads replication state (trees, roles, an interrupted reindex).
            self.tick();
        }

        fn send(&mut self, method: Method, path: &str, body: Value) -> u64 {
            self.next += 1;
            let req = crate::api::Request::new(self.next, method, path)
                .with_token("root")
                .with_json(body);
            self.node.handle(self.now, Input::Request(req));
            self.next
        }

        /// Waits (ticking) for the response to request `id`.
        fn wait(&mut self, id: u64) -> Response {
            for _ in 0..100_000 {
                while let Some(o) = self.node.poll_output() {
                    if let Output::Response(r) = o {
                        if r.id == id {
                            return r;
                        }
                    }
                }
                self.tick();
            }
            panic!("no response to request {id}");
        }

        fn tick(&mut self) {
            self.now += 1;
            self.node.handle(self.now, Input::Tick);
        }

        fn call(&mut self, method: Method, path: &str, body: Value) -> Response {
            let id = self.send(method, path, body);
            self.wait(id)
        }

        fn ok(&mut self, method: Method, path: &str, body: Value) -> Value {
            let r = self.call(method, path, body);
            assert!(r.status < 300, "{path}: {} {:?}", r.status, r.body);
            r.body.unwrap_or(Value::Null)
        }

        fn report(&mut self) -> Value {
            self.ok(Method::Post, "sys/replication/merkle-check", json!({}))["data"]
                ["merkle_corruption_report"]
                .clone()
        }

        fn storage(&mut self) -> &mut MemStorage {
            self.node.storage_mut()
        }

        /// The trees the node serves equal a recomputation from storage, and so do the
        /// persisted records.
        fn assert_exact(&self) {
            let s = self.node.storage();
            let uuids = &self.node.replication().local_uuids;
            let fresh = rebuild(s, uuids).unwrap();
            assert!(
                self.node.replication().trees == fresh,
                "served trees drifted"
            );
            let report = merkle::check(&fresh, &fresh, &s.scan(merkle::PREFIX).unwrap());
            assert!(report.is_clean(), "persisted records drifted: {report:?}");
        }
    }

    fn fill(one: &mut One, n: usize) {
        for i in 0..n {
            one.ok(Method::Put, &format!("secret/k{i:03}"), json!({ "v": i }));
        }
    }

    fn clean(r: &Value) -> bool {
        r["corrupted_root"] == json!(false)
            && r["corrupted_tree_map"]
                .as_object()
                .is_some_and(|m| m.is_empty())
    }

    /// The stored page records of the KV mount's subtree.
    fn kv_pages(s: &MemStorage) -> Vec<String> {
        s.map
            .keys()
            .filter(|k| k.starts_with("node/merkle/r/logical/") && !k.ends_with("/root"))
            .cloned()
            .collect()
    }

    #[test]
    fn check_is_clean_on_a_healthy_node_and_status_records_it() {
        let mut one = One::new(5);
        fill(&mut one, 30);
        let r = one.report();
        assert!(clean(&r), "{r}");
        assert!(r["last_corruption_check_epoch"]
            .as_str()
            .unwrap()
            .ends_with('Z'));
        let st = one.ok(Method::Get, "sys/replication/performance/status", json!({}));
        let _ = st;
        one.assert_exact();
    }

    #[test]
    fn corrupt_page_is_reported_precisely_and_repaired_by_reindex() {
        let mut one = One::new(4);
        fill(&mut one, 40);
        let pages = kv_pages(one.node.storage());
        let victim = pages[pages.len() / 2].clone();
        let page: usize = victim.rsplit('/').next().unwrap().parse().unwrap();
        let mut bytes = one.storage().map[&victim].clone();
        // Find a non-zero subpage and flip one byte of its sum.
        let sp = (0..merkle::SUBPAGES)
            .find(|i| bytes[i * 32..i * 32 + 32].iter().any(|b| *b != 0))
            .unwrap();
        bytes[sp * 32 + 5] ^= 0x40;
        one.storage().map.insert(victim.clone(), bytes);
        let r = one.report();
        assert_eq!(r["corrupted_root"], true, "{r}");
        let map = r["corrupted_tree_map"].as_object().unwrap();
        assert_eq!(map.len(), 1, "{r}");
        let entry = map.values().next().unwrap();
        assert_eq!(entry["tree_type"], "replicated");
        assert_eq!(entry["corrupted_subtree_root"], false, "{r}");
        let pm = entry["corrupted_index_tuples_map"].as_object().unwrap();
        assert_eq!(pm.len(), 1, "{r}");
        assert_eq!(pm[&page.to_string()]["corrupted"], true);
        assert_eq!(pm[&page.to_string()]["subpages"], json!([sp]));
        let st = one.ok(Method::Get, "sys/replication/dr/status", json!({}));
        let _ = st;
        // Reindex repairs it; the next check is clean.
        let w = one.ok(Method::Post, "sys/replication/reindex", json!({}));
        let warnings = w["warnings"].to_string();
        assert!(warnings.contains("records that differed"), "{warnings}");
        assert!(clean(&one.report()));
        one.assert_exact();
    }

    #[test]
    fn corrupt_value_is_found_in_its_bucket_and_diff_names_the_key() {
        let mut one = One::new(6);
        one.ok(
            Method::Post,
            "sys/replication/performance/primary/enable",
            json!({}),
        );
        fill(&mut one, 25);
        let key = one
            .node
            .storage()
            .map
            .keys()
            .find(|k| k.starts_with("logical/"))
            .cloned()
            .unwrap();
        let mut v = one.storage().map[&key].clone();
        let last = v.len() - 1;
        v[last] ^= 1;
        one.storage().map.insert(key.clone(), v);
        let (p, s) = merkle::bucket(&key);
        let r = one.report();
        assert_eq!(r["corrupted_root"], true);
        let entry = r["corrupted_tree_map"]
            .as_object()
            .unwrap()
            .values()
            .next()
            .unwrap()
            .clone();
        assert_eq!(entry["corrupted_subtree_root"], true, "{r}");
        assert_eq!(
            entry["corrupted_index_tuples_map"][p.to_string()]["subpages"],
            json!([s]),
            "{r}"
        );
        let w = one.ok(
            Method::Post,
            "sys/replication/reindex",
            json!({ "diff": true, "force": true }),
        );
        let warnings = w["warnings"].to_string();
        assert!(warnings.contains(&key), "{warnings}");
        assert!(warnings.contains("the value is corrupt"), "{warnings}");
        assert!(clean(&one.report()));
        one.assert_exact();
    }

    #[test]
    fn writes_during_a_scan_keep_the_fresh_trees_exact() {
        for seed in 0..6u64 {
            let mut one = One::new(3 + seed as usize);
            fill(&mut one, 20);
            let id = one.send(Method::Post, "sys/replication/reindex", json!({}));
            let mut resp = None;
            for i in 0..400u64 {
                let k = (i * 7 + seed * 13) % 30;
                if i % 3 == 0 {
                    let _ = one.send(Method::Delete, &format!("secret/k{k:03}"), json!({}));
                } else {
                    let _ = one.send(Method::Put, &format!("secret/k{k:03}"), json!({ "i": i }));
                }
                one.tick();
                while let Some(o) = one.node.poll_output() {
                    if let Output::Response(r) = o {
                        if r.id == id {
                            resp = Some(r);
                        }
                    }
                }
            }
            let r = resp.unwrap_or_else(|| one.wait(id));
            assert_eq!(r.status, 200, "{:?}", r.body);
            one.assert_exact();
            assert!(clean(&one.report()), "seed {seed}");
        }
    }

    #[test]
    fn a_second_scan_is_refused_while_one_runs() {
        let mut one = One::new(1);
        fill(&mut one, 10);
        let id = one.send(Method::Post, "sys/replication/reindex", json!({}));
        let r = one.call(Method::Post, "sys/replication/merkle-check", json!({}));
        assert_eq!(r.status, 400);
        assert!(r.body.unwrap().to_string().contains("already running"));
        let st = one.ok(Method::Get, "sys/replication/status", json!({}));
        assert_eq!(st["data"]["dr"]["mode"], "disabled");
        assert_eq!(one.wait(id).status, 200);
    }

    #[test]
    fn a_crash_mid_reindex_resumes_after_unseal() {
        let mut one = One::new(2);
        fill(&mut one, 20);
        let page = kv_pages(one.node.storage())[0].clone();
        let mut b = one.storage().map[&page].clone();
        b[0] ^= 0xff;
        one.storage().map.insert(page, b);
        let _ = one.send(Method::Post, "sys/replication/reindex", json!({}));
        for _ in 0..5 {
            one.tick();
        }
        assert!(one.node.replication().scan_progress().is_some());
        assert!(one.node.storage().map.contains_key(REINDEX_KEY));
        one.restart(2);
        assert!(
            one.node.replication().scan_progress().is_some(),
            "not resumed"
        );
        for _ in 0..2_000 {
            one.tick();
        }
        assert!(one.node.replication().scan_progress().is_none());
        assert!(!one.node.storage().map.contains_key(REINDEX_KEY));
        assert!(clean(&one.report()));
        one.assert_exact();
    }

    #[test]
    fn deferred_merkle_records_are_written_within_a_second_and_a_crash_before_rebuilds() {
        let mut cfg = config(50);
        cfg.replication.defer_merkle_ms = 1_000;
        let mut one = One::with_config(cfg.clone());
        one.tick();
        fill(&mut one, 30);
        // Served at once, written later: the marker is gone and the records are behind.
        assert!(!one.node.storage().map.contains_key(merkle::MARKER));
        assert!(!one.node.replication().deferred.is_empty());
        let served = one.node.replication().trees.clone();
        let stored = one.node.storage().scan(merkle::PREFIX).unwrap();
        assert!(!merkle::check(&served, &served, &stored).is_clean());
        // A crash now: the next start rebuilds the same trees from the data, writes them.
        let mut crashed = One {
            node: Node::new(one.node.storage().clone(), [3; 32], cfg.clone()),
            key: one.key.clone(),
            now: one.now,
            next: 100,
        };
        crashed.restart(50);
        assert!(crashed.node.replication().trees == served);
        assert!(crashed.node.storage().map.contains_key(merkle::MARKER));
        crashed.assert_exact();
        // Without a crash they are written a second after the writes.
        one.now += 1_000;
        one.tick();
        assert!(one.node.storage().map.contains_key(merkle::MARKER));
        assert!(one.node.replication().deferred.is_empty());
        one.assert_exact();
        // A Merkle check writes what is deferred before it reads the records.
        fill(&mut one, 35);
        assert!(!one.node.storage().map.contains_key(merkle::MARKER));
        assert!(clean(&one.report()));
        one.assert_exact();
        one.tick();
        assert!(one.node.storage().map.contains_key(merkle::MARKER));
    }

    #[test]
    fn skip_flush_writes_later_and_a_crash_before_it_rebuilds_on_load() {
        let mut one = One::new(50);
        fill(&mut one, 40);
        for p in kv_pages(one.node.storage()) {
            one.storage().map.remove(&p);
        }
        let w = one.ok(
            Method::Post,
            "sys/replication/reindex",
            json!({ "skip_flush": true }),
        );
        assert!(w["warnings"].to_string().contains("skip_flush"), "{w}");
        // The trees are served already; the records are not all written yet.
        assert!(!one.node.storage().map.contains_key(merkle::MARKER));
        let served = one.node.replication().trees.clone();
        // Crash now: the next start rebuilds from storage.
        let mut crashed = One {
            node: Node::new(one.node.storage().clone(), [3; 32], config(50)),
            key: one.key.clone(),
            now: one.now,
            next: 100,
        };
        crashed.restart(50);
        assert!(crashed.node.replication().trees == served);
        crashed.assert_exact();
        // Without a crash the flush finishes on its own.
        for _ in 0..20 {
            one.tick();
        }
        assert!(one.node.storage().map.contains_key(merkle::MARKER));
        one.assert_exact();
        assert!(clean(&one.report()));
    }

    #[test]
    fn a_clean_shutdown_finishes_a_skipped_flush() {
        let mut one = One::new(50);
        fill(&mut one, 30);
        for p in kv_pages(one.node.storage()) {
            one.storage().map.remove(&p);
        }
        one.ok(
            Method::Post,
            "sys/replication/reindex",
            json!({ "skip_flush": true }),
        );
        assert!(!one.node.storage().map.contains_key(merkle::MARKER));
        one.node.handle(
            one.now,
            Input::Admin {
                id: 1,
                cmd: Admin::Shutdown,
            },
        );
        let mut done = None;
        while let Some(o) = one.node.poll_output() {
            if let Output::AdminDone { id: 1, result } = o {
                done = Some(result);
            }
        }
        assert_eq!(done, Some(Ok(AdminResult::Flushed)));
        assert!(one.node.storage().map.contains_key(merkle::MARKER));
        one.assert_exact();
    }

    #[test]
    fn a_rolled_back_batch_is_forgotten_by_the_trees_and_the_wal() {
        let mut one = One::new(8);
        one.ok(
            Method::Post,
            "sys/replication/performance/primary/enable",
            json!({}),
        );
        fill(&mut one, 5);
        let before = one.node.storage().clone();
        let wal_before = one.node.replication().wal;
        one.ok(Method::Put, "secret/lost", json!({ "v": 1 }));
        assert!(one.node.replication().wal.last > wal_before.last);
        // The shell's transaction is rolled back: storage is as before the write.
        *one.node.storage_mut() = before;
        one.node.storage_rolled_back();
        one.tick();
        assert_eq!(one.node.replication().wal, wal_before);
        one.assert_exact();
        assert!(clean(&one.report()));
    }

    #[test]
    fn reindex_needs_post_and_a_sudo_token() {
        let mut one = One::new(8);
        let r = one.call(Method::Get, "sys/replication/reindex", json!({}));
        assert_eq!(r.status, 405);
        one.next += 1;
        let req = crate::api::Request::new(one.next, Method::Post, "sys/replication/reindex");
        one.node.handle(one.now, Input::Request(req));
        let r = one.wait(one.next);
        assert_eq!(r.status, 403);
        let r = one.call(
            Method::Post,
            "sys/replication/reindex",
            json!({ "diff": "maybe" }),
        );
        assert_eq!(r.status, 400);
        assert!(r.body.unwrap().to_string().contains("diff"));
    }
}
