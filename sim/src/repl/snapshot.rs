//! The snapshot drill of the replication operator: on the primary, under the operator's
//! write traffic, take a snapshot (`GET sys/storage/raft/snapshot`) and remember the model
//! of acknowledged writes and the primary's KV storage at that point; let more writes
//! happen; send a damaged copy of the file (a byte flipped or the file cut short), which
//! must be refused and change nothing; then restore the file.
//!
//! Invariants, checked when the answers arrive and in the final phase:
//!
//! * `snapshot-index`: the file's header names the WAL index of its answer's
//!   `X-Vault-Index`.
//! * `snapshot-refused`: a damaged file is answered 400 and the primary's KV storage
//!   (`logical/`) is what it was when the request was sent.
//! * `snapshot-restore`: after the restore the primary's KV storage is exactly what it was
//!   when the snapshot was taken; the model of acknowledged writes goes back to that point
//!   (the read-back phase then reads every key on the primary against it).
//! * `snapshot-merkle`: every secondary active at the restore converges to the restored
//!   primary (the convergence check) by a Merkle diff of its own: its diff count grew
//!   (unless it restarted meanwhile, which resets the count, or was in the middle of a
//!   Merkle diff at the restore, which then fetches the restored data).
//!
//! The drill draws from its own random stream, so the other streams of a seed are what they
//! were without it. It runs once per seed: in a seed without a failover drill on the first
//! primary, in a seed with one on the promoted DR secondary once the failover drill is done
//! (every secondary re-pointed, the old primary re-joined as a DR secondary of the new one,
//! which then diffs its way back to the restored state like the others). Never before a
//! failover: what a promoted DR secondary holds after a restore on its old primary is not
//! modelled (its replicated WAL index says nothing of a Merkle sync it did not finish). Keys
//! the failover left uncertain (`failover_allowed`) go back to what they were at the save.

use super::*;

const SNAP: &str = "sys/storage/raft/snapshot";

/// The drill's progress.
#[derive(Debug, Clone, Default)]
pub(super) enum Stage {
    /// Not started (or not in this seed yet).
    #[default]
    Idle,
    /// The save is sent (again, until answered 200).
    Save,
    /// Saved: this many more operator steps of traffic before the damaged copy.
    Traffic(u64),
    /// The damaged copy, sent until answered (`truncated`: cut short, else a byte flipped).
    Damaged { truncated: bool },
    /// The restore, sent until answered 204.
    Restore,
    /// Restored; the final phase checks the secondaries.
    Done,
}

/// What the drill remembers.
#[derive(Debug, Clone, Default)]
pub(super) struct Snap {
    pub(super) stage: Stage,
    file: Vec<u8>,
    /// The model of acknowledged writes and the uncertain keys when the file was taken.
    model: BTreeMap<(bool, u64), Option<u64>>,
    uncertain: BTreeSet<(bool, u64)>,
    /// The values a failover left possible for keys not written since, then.
    failover_allowed: BTreeMap<(bool, u64), BTreeSet<Option<u64>>>,
    /// Each key's history length then.
    hist_len: BTreeMap<(bool, u64), usize>,
    /// The primary's KV storage then.
    kv: Vec<(String, Vec<u8>)>,
    /// The primary's KV storage when the damaged copy was sent.
    kv_before_bad: Vec<(String, Vec<u8>)>,
    /// Secondaries active at the restore: (host, boot, Merkle diffs then).
    diffs: Vec<(HostId, u64, u64)>,
    /// Saved on a promoted DR secondary (after the failover drill).
    pub(super) after_failover: bool,
    /// The same when the last restore request was sent.
    diffs_at_send: Vec<(HostId, u64, u64)>,
}

impl Snap {
    /// A save, damaged copy or restore is under way: no failover drill starts.
    pub(super) fn busy(&self) -> bool {
        !matches!(self.stage, Stage::Idle | Stage::Done)
    }
}

impl ReplWorld {
    fn primary_kv(&self) -> Vec<(String, Vec<u8>)> {
        // Its storage, also when it is down: a restore's answer can still be on the way when
        // the primary crashes right after committing it (then its parked storage holds it).
        self.hosts[self.primary]
            .host
            .storage()
            .and_then(|s| s.scan("logical/").ok())
            .unwrap_or_default()
    }

    /// The drill's next request, if it has one now.
    pub(super) fn choose_snapshot(&mut self, id: RequestId) -> Option<(HostId, Op, Request)> {
        // Before a failover drill, not at all; during one, not yet (see the module doc).
        let drill_done = match &self.drill {
            None => self.drill_at.is_none(),
            Some(d) => d.step == DStep::Done,
        };
        if self.params.snapshot_permille == 0 || !drill_done || !self.up(self.primary) {
            return None;
        }
        let p = self.primary;
        let r0 = self.root(0);
        match self.snap.stage.clone() {
            Stage::Idle => {
                // After the set-up (a mount or configuration written after the point would be
                // undone by the restore behind the operator's back).
                let need_dr = self.secs.iter().any(|s| s.mode == Mode::Dr);
                let ready = self.phase == Phase::Chaos
                    && self.mounted
                    && self.v2_mounted
                    && self.ldap_configured
                    && self.perf_enabled
                    && (self.dr_enabled || !need_dr);
                if !ready || !self.snap_rng.chance(self.params.snapshot_permille) {
                    return None;
                }
                self.log(&format!(
                    "SNAPSHOT: save on the primary n{p}{}",
                    if self.failed_over {
                        " (the promoted DR secondary)"
                    } else {
                        ""
                    }
                ));
                self.snap.stage = Stage::Save;
                let req = Request::new(id, Method::Get, SNAP).with_token(&r0);
                Some((p, Op::SnapSave, req))
            }
            Stage::Save => {
                let req = Request::new(id, Method::Get, SNAP).with_token(&r0);
                Some((p, Op::SnapSave, req))
            }
            Stage::Traffic(0) => {
                let truncated = self.snap_rng.chance(500);
                self.snap.stage = Stage::Damaged { truncated };
                self.choose_snapshot(id)
            }
            Stage::Traffic(n) => {
                self.snap.stage = Stage::Traffic(n - 1);
                None
            }
            Stage::Damaged { truncated } => {
                let mut file = self.snap.file.clone();
                let at = self.snap_rng.below(file.len().max(1) as u64) as usize;
                let flip = 1 + self.snap_rng.below(255) as u8;
                if truncated {
                    file.truncate(at);
                } else if let Some(b) = file.get_mut(at) {
                    *b ^= flip;
                }
                self.snap.kv_before_bad = self.primary_kv();
                let mut req = Request::new(id, Method::Post, SNAP).with_token(&r0);
                req.body = file;
                Some((p, Op::SnapDamaged { truncated, at }, req))
            }
            Stage::Restore => {
                self.snap.diffs_at_send = self.secondary_diffs();
                let mut req = Request::new(id, Method::Post, SNAP).with_token(&r0);
                req.body = self.snap.file.clone();
                Some((p, Op::SnapRestore, req))
            }
            Stage::Done => None,
        }
    }

    /// The answer to `Op::SnapSave`.
    pub(super) fn on_snap_saved(&mut self, a: &Answer) -> Result<(), Violation> {
        let Ok(resp) = &a.resp else {
            self.log(&format!("SNAPSHOT: save not answered ({}); again", a.text));
            return Ok(());
        };
        let Some((_, file)) = resp.raw.clone().filter(|_| resp.status == 200) else {
            self.log(&format!("SNAPSHOT: save answered {}; again", a.text));
            return Ok(());
        };
        let header = match cairn_core::snapshot::inspect(&file) {
            Ok(h) => h,
            Err(e) => {
                return fail(
                    "snapshot-index",
                    format!("the saved file does not read: {e}"),
                )
            }
        };
        let index = resp
            .index
            .as_deref()
            .and_then(|s| cairn_core::replication::index_state::IndexState::decode(s).ok())
            .map(|s| s.index);
        if index != Some(header.index) {
            return fail(
                "snapshot-index",
                format!(
                    "the file names WAL index {}, its answer's X-Vault-Index {index:?}",
                    header.index
                ),
            );
        }
        self.bump("snapshot-index");
        let steps = 2 + self.snap_rng.below(12);
        self.log(&format!(
            "SNAPSHOT: {} bytes, {} rows at WAL index {}; {steps} operator steps until the restore",
            file.len(),
            header.rows,
            header.index
        ));
        self.snap.file = file;
        self.snap.model = self.model.clone();
        self.snap.uncertain = self.uncertain.clone();
        self.snap.failover_allowed = self.failover_allowed.clone();
        self.snap.after_failover = self.failed_over;
        self.snap.hist_len = self.hist.iter().map(|(k, h)| (*k, h.len())).collect();
        self.snap.kv = self.primary_kv();
        self.snap.stage = Stage::Traffic(steps);
        Ok(())
    }

    /// The answer to `Op::SnapDamaged`.
    pub(super) fn on_snap_damaged(
        &mut self,
        a: &Answer,
        truncated: bool,
        at: usize,
    ) -> Result<(), Violation> {
        let what = if truncated {
            format!("cut at byte {at}")
        } else {
            format!("byte {at} flipped")
        };
        if a.resp.is_err() {
            self.log(&format!(
                "SNAPSHOT: damaged file ({what}) not answered; again"
            ));
            return Ok(());
        }
        if a.status != 400 {
            return fail(
                "snapshot-refused",
                format!("a snapshot file with {what} was answered {}", a.text),
            );
        }
        if self.primary_kv() != self.snap.kv_before_bad {
            return fail(
                "snapshot-refused",
                format!("a refused snapshot file ({what}) changed the primary's KV storage"),
            );
        }
        self.bump("snapshot-refused");
        self.log(&format!(
            "SNAPSHOT: damaged file ({what}) refused: {}",
            a.text
        ));
        self.snap.stage = Stage::Restore;
        Ok(())
    }

    /// The answer to `Op::SnapRestore`.
    pub(super) fn on_snap_restored(&mut self, a: &Answer) -> Result<(), Violation> {
        if a.resp.is_err() || a.status >= 500 {
            self.log(&format!("SNAPSHOT: restore answered {}; again", a.text));
            return Ok(());
        }
        if a.status != 204 {
            return fail(
                "snapshot-restore",
                format!("the restore was answered {}", a.text),
            );
        }
        let now = self.primary_kv();
        if now != self.snap.kv {
            let (want, got) = (self.snap.kv.len(), now.len());
            let first = self
                .snap
                .kv
                .iter()
                .zip(now.iter())
                .find(|(x, y)| x != y)
                .map(|(x, _)| x.0.clone())
                .unwrap_or_default();
            return fail(
                "snapshot-restore",
                format!(
                    "after the restore the primary holds {got} KV rows, the snapshot point \
                     {want} (first difference at {first:?})"
                ),
            );
        }
        self.bump("snapshot-restore");
        if self.snap.after_failover {
            self.bump("snapshot-restore:after-failover");
        }
        // The model goes back to the snapshot point; each key's history gets the value the
        // restore gave it (every value it may have had then when its write was uncertain).
        let restored_at = a.wal_at;
        let keys: BTreeSet<(bool, u64)> = self
            .model
            .keys()
            .chain(self.uncertain.iter())
            .chain(self.hist.keys())
            .chain(self.failover_allowed.keys())
            .copied()
            .collect();
        self.failover_allowed.clear();
        for k in keys {
            let then = self.snap.hist_len.get(&k).copied().unwrap_or(0);
            let hist = self.hist.entry(k).or_default();
            if let Some(allowed) = self.snap.failover_allowed.get(&k) {
                // Not written between the failover and the save: what the failover left.
                hist.extend(allowed.iter().map(|v| (restored_at, *v)));
                self.failover_allowed.insert(k, allowed.clone());
                self.model.remove(&k);
                self.uncertain.remove(&k);
            } else if self.snap.uncertain.contains(&k) {
                let mut vals: Vec<Option<u64>> = hist.iter().take(then).map(|(_, v)| *v).collect();
                vals.push(None);
                hist.extend(vals.into_iter().map(|v| (restored_at, v)));
                self.model.remove(&k);
                self.uncertain.insert(k);
            } else {
                let v = self.snap.model.get(&k).copied().flatten();
                hist.push((restored_at, v));
                self.model.insert(k, v);
                self.settle(k);
            }
        }
        self.last_put = None;
        self.snap.diffs = std::mem::take(&mut self.snap.diffs_at_send);
        self.log(&format!(
            "SNAPSHOT: restored ({} KV rows); {} secondaries must diff their way back",
            now.len(),
            self.snap.diffs.len()
        ));
        self.snap.stage = Stage::Done;
        Ok(())
    }

    /// Each active secondary's Merkle diff count as the restore is sent (its answer may
    /// arrive after a secondary already started the diff it causes).
    fn secondary_diffs(&self) -> Vec<(HostId, u64, u64)> {
        self.secs
            .iter()
            .filter(|s| s.enabled && !s.gone && s.revoked_from.is_none() && !s.revoke_sent)
            .filter_map(|s| {
                let x = &self.hosts[s.host];
                let n = x.host.node()?;
                // One in the middle of a Merkle diff finishes it against the restored data.
                if n.replication().syncing(s.mode) {
                    return None;
                }
                Some((s.host, x.host.boot(), n.replication().merkle_diffs(s.mode)))
            })
            .collect()
    }

    /// Final phase, once everything converged: each secondary active at the restore started
    /// a Merkle diff since (unless it restarted, which resets its count).
    pub(super) fn check_snapshot_diffs(&self) -> Result<(), String> {
        for &(h, boot, then) in &self.snap.diffs {
            let Some(s) = self.sec_of(h) else { continue };
            if !s.enabled || s.gone || s.revoked_from.is_some() || s.revoke_sent {
                continue;
            }
            let x = &self.hosts[h];
            let Some(n) = x.host.node() else { continue };
            if x.host.boot() == boot && n.replication().merkle_diffs(s.mode) <= then {
                return Err(format!(
                    "n{h} converged to the restored primary without a Merkle diff \
                     ({then} diffs before the restore, as many now)"
                ));
            }
        }
        Ok(())
    }
}
