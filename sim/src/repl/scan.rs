//! Planted corruption (bit rot in Merkle records and replicated values) and the reindex /
//! Merkle-check requests that find and repair it, with their checkers.

use super::*;

/// Corruption planted in one host's storage and what repairs it.
#[derive(Debug, Clone, Default)]
pub(super) struct Rot {
    /// Bumped by every planting; `values` by value plantings only.
    pub(super) gen: u64,
    pub(super) values_gen: u64,
    /// Something was planted since the start of the last reindex whose answer arrived:
    /// a Merkle check must then be clean, and the final phase reindexes the host.
    pub(super) dirty: bool,
    /// Every planted Merkle record: key → the corrupted bytes (while storage still holds
    /// exactly them, a Merkle check must report that record). A key is planted once.
    pub(super) records: BTreeMap<String, Vec<u8>>,
    /// Replicated values planted (storage keys): after the final repair they must equal
    /// the primary's.
    pub(super) values: BTreeSet<String>,
    /// Failed final-phase repair attempts.
    pub(super) repair_tries: u32,
}

/// A reindex or Merkle check the operator has in flight, as the node took it.
#[derive(Debug, Clone, Copy)]
pub(super) struct ScanStart {
    pub(super) id: RequestId,
    pub(super) h: HostId,
    pub(super) gen: u64,
    pub(super) values_gen: u64,
    /// A scan was already running on the node (the request must be refused).
    pub(super) busy: bool,
}

/// Failed (not "busy") final-phase repair reindexes after which a host is left out of the
/// convergence check.
pub(super) const REPAIR_TRIES: u32 = 40;

/// The trees recomputed from a node's storage, and its stored Merkle records. Local mounts
/// are those the node's served local tree has subtrees for (their UUIDs are in the
/// encrypted local mount tables).
pub(super) fn recompute(node: &Node<SimStorage>) -> (Trees, Vec<(String, Vec<u8>)>) {
    let served = &node.replication().trees;
    let uuids: BTreeSet<String> = served
        .subtrees
        .keys()
        .filter(|(k, _)| *k == TreeKind::Local)
        .filter_map(|(_, id)| id.split_once('/').map(|(_, u)| u.to_string()))
        .collect();
    let mut t = Trees::default();
    for (k, v) in node.storage().scan("").unwrap_or_default() {
        let kind = match rclass::classify(&k, &uuids) {
            Class::NodeLocal => continue,
            Class::Replicated => TreeKind::Replicated,
            Class::ClusterLocal => TreeKind::Local,
        };
        t.add_bulk(kind, &rclass::subtree(&k), &k, &v);
    }
    t.finish();
    let stored = node.storage().scan(merkle::PREFIX).unwrap_or_default();
    (t, stored)
}

pub(super) fn sample<T: std::fmt::Debug>(v: &[T]) -> String {
    let first: Vec<String> = v.iter().take(3).map(|x| format!("{x:?}")).collect();
    format!("{} (e.g. {})", v.len(), first.join(", "))
}

impl ReplWorld {
    pub(super) fn storage_of(&mut self, h: HostId) -> Option<&mut SimStorage> {
        self.hosts[h].host.storage_mut()
    }

    /// Plants bit rot: a byte of a stored Merkle record (any host), or of a replicated KV
    /// value on a secondary that can never become a primary (a performance secondary, or
    /// a DR one once no failover drill is pending) — on a primary it would destroy
    /// acknowledged data. The final phase repairs it with a reindex.
    pub(super) fn plant_corruption(&mut self) {
        let h = self.corrupt_rng.below(self.hosts.len() as u64) as usize;
        let value = self.corrupt_rng.chance(400);
        let at = self.corrupt_rng.below(1 << 16) as usize;
        let xor = 1 + self.corrupt_rng.below(255) as u8;
        if value {
            let drill_pending = self.drill_at.is_some()
                || self.drill.as_ref().is_some_and(|d| d.step != DStep::Done);
            let ok = h != self.primary
                && self.secs.iter().any(|s| {
                    s.host == h
                        && s.enabled
                        && !s.gone
                        && (s.mode == Mode::Performance || !drill_pending)
                });
            if !ok {
                return;
            }
        }
        let planted: BTreeSet<String> = self.hosts[h].rot.records.keys().cloned().collect();
        let Some(st) = self.storage_of(h) else {
            return;
        };
        let cands: Vec<String> = if value {
            st.committed_keys(crate::storage::KV_DATA_PREFIX)
                .into_iter()
                .filter(|k| key_number(k).is_some())
                .collect()
        } else {
            st.committed_keys(merkle::PREFIX)
                .into_iter()
                .filter(|k| merkle::parse_key(k).is_some() && !planted.contains(k))
                .collect()
        };
        let Some(k) = self.corrupt_rng.pick(&cands).cloned() else {
            return;
        };
        let Some(bytes) = self.storage_of(h).and_then(|st| st.corrupt(&k, at, xor)) else {
            return;
        };
        let rot = &mut self.hosts[h].rot;
        rot.gen += 1;
        rot.dirty = true;
        if value {
            rot.values_gen += 1;
            rot.values.insert(k.clone());
        } else {
            rot.records.insert(k.clone(), bytes);
        }
        self.bump(if value { "rot:value" } else { "rot:record" });
        self.log(&format!("n{h} ROT: flipped a stored byte of {k}"));
    }

    /// Whether the final phase repairs host `h`'s planted corruption (it is the primary
    /// or an active secondary, and repairs have not kept failing).
    pub(super) fn repair_wanted(&self, h: HostId) -> bool {
        self.hosts[h].rot.repair_tries < REPAIR_TRIES
            && (h == self.primary
                || self.secs.iter().any(|s| {
                    s.host == h
                        && s.enabled
                        && !s.gone
                        && s.revoked_from.is_none()
                        && !s.revoke_sent
                }))
    }

    pub(super) fn active_sec(&self, h: HostId) -> Option<usize> {
        self.secs
            .iter()
            .position(|s| s.host == h && s.enabled && !s.gone)
    }

    /// A reindex (random flags) or Merkle check on host `h`, if its credentials are known.
    pub(super) fn scan_req(
        &mut self,
        h: HostId,
        id: RequestId,
        reindex: bool,
        repair: bool,
    ) -> Option<(HostId, Op, Request)> {
        let (tok, mut body, dr) = if h == self.primary {
            (self.root(0), serde_json::Map::new(), false)
        } else {
            let i = self.active_sec(h)?;
            if self.sec_auth_req(i, id).is_some() {
                return None;
            }
            let (t, b) = self.sec_auth(i);
            (t, b, self.secs[i].mode == Mode::Dr)
        };
        let flags = reindex.then(|| {
            [
                self.scan_rng.chance(300),
                self.scan_rng.chance(300),
                self.scan_rng.chance(300),
            ]
        });
        if let Some(f) = flags {
            for (name, on) in ["diff", "force", "skip_flush"].iter().zip(f) {
                if on {
                    body.insert((*name).into(), json!(true));
                }
            }
        }
        let path = format!(
            "sys/replication/{}{}",
            if dr { "dr/secondary/" } else { "" },
            if reindex { "reindex" } else { "merkle-check" }
        );
        let req = Request::new(id, Method::Post, &path)
            .with_token(&tok)
            .with_json(Value::Object(body));
        Some((
            h,
            Op::Scan {
                h,
                reindex: flags,
                repair,
            },
            req,
        ))
    }

    /// Chaos: a reindex or Merkle check on a random host whose credentials are known.
    pub(super) fn choose_scan(&mut self, id: RequestId) -> Option<(HostId, Op, Request)> {
        let mut hosts = vec![self.primary];
        for s in &self.secs {
            if s.enabled && !s.gone && !hosts.contains(&s.host) {
                hosts.push(s.host);
            }
        }
        let h = *self.scan_rng.pick(&hosts)?;
        if !self.up(h) {
            return None;
        }
        let reindex = self.scan_rng.chance(500);
        self.scan_req(h, id, reindex, false)
    }

    /// Final phase: a reindex on every host with planted corruption (getting its
    /// credentials first when needed).
    pub(super) fn choose_repair(&mut self, id: RequestId) -> Option<(HostId, Op, Request)> {
        for h in 0..self.hosts.len() {
            if !self.hosts[h].rot.dirty || !self.repair_wanted(h) || !self.up(h) {
                continue;
            }
            if h != self.primary {
                let i = self.active_sec(h)?;
                if let Some(r) = self.sec_auth_req(i, id) {
                    return Some(r);
                }
            }
            return self.scan_req(h, id, true, true);
        }
        None
    }

    /// Checks a reindex or Merkle check answer the moment the node produced it (its
    /// storage and trees are as the scan left them).
    ///
    /// * `scan-busy`: a scan requested while another ran is refused.
    /// * `reindex`: afterwards the served trees equal a recomputation from storage, and
    ///   (without `skip_flush`) so do the stored records.
    /// * `merkle-check`: a record still holding planted bytes is reported; a host with
    ///   nothing planted since its last reindex is clean; and, when no value was planted
    ///   while it ran, the report equals the one computed from the node's storage.
    pub(super) fn on_scan_answer(&mut self, h: HostId, r: &Response) -> Result<(), Violation> {
        let Some(ss) = self.scan else {
            return Ok(());
        };
        let Some((_, _, Op::Scan { reindex, .. })) = self.outstanding.clone() else {
            return Ok(());
        };
        let ok = r.status < 300;
        let text = r.body.as_ref().map(|b| b.to_string()).unwrap_or_default();
        if ss.busy {
            self.bump("scan-busy");
            if ok {
                return fail(
                    "scan-busy",
                    format!(
                        "n{h} accepted a scan while another ran: {}",
                        shorten(&text, 200)
                    ),
                );
            }
        }
        if !ok {
            return Ok(());
        }
        let x = &self.hosts[h];
        let Some(node) = x.host.node() else {
            return Ok(());
        };
        let rot = &x.rot;
        let quiet = rot.values_gen == ss.values_gen;
        let (fresh, stored) = recompute(node);
        let served = &node.replication().trees;
        let mut bumps: Vec<&'static str> = Vec::new();
        let res = match reindex {
            Some(f) if quiet => {
                bumps.push("reindex");
                if *served != fresh {
                    let b = served.differing_buckets(&fresh);
                    fail(
                        "reindex",
                        format!(
                            "after a reindex (diff/force/skip_flush={f:?}) n{h} serves trees that differ from a recomputation over its storage in buckets {}",
                            sample(&b)
                        ),
                    )
                } else if !f[2] && !merkle::check(&fresh, served, &stored).is_clean() {
                    let rep = merkle::check(&fresh, served, &stored);
                    let bad: Vec<(String, Vec<usize>, bool)> = rep
                        .subtrees
                        .iter()
                        .map(|s| {
                            (
                                s.id.1.clone(),
                                s.pages.keys().copied().collect(),
                                s.corrupted_root,
                            )
                        })
                        .collect();
                    fail(
                        "reindex",
                        format!(
                            "after a reindex without skip_flush n{h}'s stored Merkle records differ from its trees: {}",
                            sample(&bad)
                        ),
                    )
                } else {
                    Ok(())
                }
            }
            Some(_) => Ok(()),
            None => {
                let body = r.body.clone().unwrap_or(Value::Null);
                let rep = &body["data"]["merkle_corruption_report"];
                let corrupted = rep["corrupted_root"].as_bool();
                let map = rep["corrupted_tree_map"].as_object();
                bumps.push("merkle-check");
                let (Some(corrupted), Some(map)) = (corrupted, map) else {
                    return fail(
                        "merkle-check",
                        format!(
                            "n{h}: malformed Merkle check answer {}",
                            shorten(&text, 200)
                        ),
                    );
                };
                let mut res = Ok(());
                for (k, bytes) in &rot.records {
                    if node.storage().get(k).ok().flatten().as_ref() != Some(bytes) {
                        continue;
                    }
                    let Some(rec) = merkle::parse_key(k) else {
                        continue;
                    };
                    bumps.push("merkle-check:planted");
                    let is = |e: &Value, id: &merkle::SubtreeId| {
                        e["subtree"].as_str() == Some(id.1.as_str())
                            && e["tree_type"].as_str() == Some(id.0.name())
                    };
                    let found = match &rec {
                        Record::Page(id, p) => map.values().any(|e| {
                            is(e, id)
                                && e["corrupted_index_tuples_map"][p.to_string()]["corrupted"]
                                    == json!(true)
                        }),
                        Record::Root(id) => map
                            .values()
                            .any(|e| is(e, id) && e["corrupted_subtree_root"] == json!(true)),
                    };
                    if !found || !corrupted {
                        res = fail(
                            "merkle-check",
                            format!(
                                "n{h} still stores the planted corruption of {k}, but its Merkle check does not report it: {}",
                                shorten(&rep.to_string(), 300)
                            ),
                        );
                        break;
                    }
                }
                if res.is_ok() && !rot.dirty && (corrupted || !map.is_empty()) {
                    res = fail(
                        "merkle-check",
                        format!(
                            "nothing was planted on n{h} since its last reindex, yet its Merkle check reports corruption: {}",
                            shorten(&rep.to_string(), 300)
                        ),
                    );
                }
                if res.is_ok() && quiet {
                    bumps.push("merkle-check:exact");
                    let mine = reindex_report(&merkle::check(&fresh, served, &stored), self.now);
                    if mine["corrupted_root"] != rep["corrupted_root"]
                        || mine["corrupted_tree_map"] != rep["corrupted_tree_map"]
                    {
                        res = fail(
                            "merkle-check",
                            format!(
                                "n{h}'s Merkle check answered {} but its storage and trees give {}",
                                shorten(&rep.to_string(), 300),
                                shorten(&mine.to_string(), 300)
                            ),
                        );
                    }
                }
                res
            }
        };
        for b in bumps {
            self.bump(b);
        }
        res
    }

    /// The answer to `Op::Scan`.
    pub(super) fn on_scan_reply(
        &mut self,
        a: &Answer,
        h: HostId,
        reindex: Option<[bool; 3]>,
        repair: bool,
    ) -> Result<(), Violation> {
        let ok = a.ok;
        let status = a.status;
        let id = a.id;
        let text = &a.text;
        let start = self.scan.take().filter(|s| s.id == id);
        let busy = text.contains("already running") || text.contains("still flushing");
        if ok && reindex.is_some() {
            let rot = &mut self.hosts[h].rot;
            if start.is_some_and(|s| s.gen == rot.gen) && rot.dirty {
                rot.dirty = false;
                rot.repair_tries = 0;
                self.log(&format!(
                    "n{h}: planted corruption repaired by this reindex"
                ));
            }
        } else if !ok {
            if repair && !busy {
                self.hosts[h].rot.repair_tries += 1;
            }
            if status == 403 {
                if let Some(i) = self.active_sec(h) {
                    match self.secs[i].mode {
                        Mode::Dr => self.optok[h].token = None,
                        Mode::Performance => self.secs[i].local_root = None,
                    }
                }
            }
        }
        Ok(())
    }
}
