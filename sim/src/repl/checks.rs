//! Replication checkers on committed state: `wal-continues`, `wal-tail`, `filters` and
//! `revocation` on each commit, and `convergence` in the final phase.

use super::*;

impl ReplWorld {
    /// `wal-continues`: the primary's WAL index never goes back, and after a failover it
    /// continues from the promoted DR secondary's. Also notes DR secondaries that synced.
    pub(super) fn check_wal(&mut self, h: HostId) -> Result<(), Violation> {
        if self.hosts[h].needs_unseal {
            return Ok(());
        }
        let Some(node) = self.hosts[h].host.node() else {
            return Ok(());
        };
        let last = node.replication().wal.last;
        // The entries kept in memory for pulls are the stored ones (the oldest and newest
        // few at each commit: the whole run would make the check quadratic).
        if let Some(d) = node.replication().tail_drift(node.storage(), 16) {
            return fail("wal-tail", format!("n{h}: {d}"));
        }
        self.bump("wal-tail");
        if h == self.primary && last > 0 {
            self.bump("wal-continues");
            if last < self.wal_floor {
                return fail(
                    "wal-continues",
                    format!(
                        "primary n{h}'s WAL went back from {} to {last}",
                        self.wal_floor
                    ),
                );
            }
            self.wal_floor = last;
        }
        if self.ldap_configured {
            if let Some(i) = self.secs.iter().position(|s| {
                s.host == h && s.mode == Mode::Performance && s.enabled && !s.ldap_ready
            }) {
                let s = self.secs[i].clone();
                if self.converged(&s).is_ok() {
                    self.secs[i].ldap_ready = true;
                }
            }
        }
        if self.drill_at.is_some() && self.drill.is_none() {
            if let Some(i) = self
                .secs
                .iter()
                .position(|s| s.host == h && s.mode == Mode::Dr && s.enabled && !s.synced_once)
            {
                let s = self.secs[i].clone();
                if self.converged(&s).is_ok() {
                    self.secs[i].synced_once = true;
                }
            }
        }
        Ok(())
    }

    pub(super) fn keys(&self, h: HostId, prefix: &str) -> Vec<(String, Vec<u8>)> {
        self.hosts[h]
            .host
            .node()
            .and_then(|n| n.storage().scan(prefix).ok())
            .unwrap_or_default()
    }

    /// Filters and revocation, on the state host `h` just committed.
    pub(super) fn check_host(&mut self, h: HostId) -> Result<(), Violation> {
        let Some(s) = self.sec_of(h).cloned() else {
            return Ok(());
        };
        if s.gone || (!s.enabled && s.revoked_from.is_none()) {
            return Ok(());
        }
        let logical = self.keys(h, "logical/");
        if s.mode == Mode::Performance {
            self.bump("filters");
            let mine: BTreeSet<String> = self
                .keys(h, "sys/token/")
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            let theirs: BTreeSet<String> = self
                .keys(self.primary, "sys/token/")
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            if let Some(k) = mine
                .intersection(&theirs)
                .find(|k| k.starts_with("sys/token/id/"))
            {
                return fail(
                    "filters",
                    format!("performance secondary n{h} holds the primary's token entry {k}"),
                );
            }
            if s.filtered && !s.filter_unsure {
                if let Some((k, _)) = logical
                    .iter()
                    .find(|(k, _)| key_number(k).is_some_and(|(o, _)| o))
                {
                    return fail(
                        "filters",
                        format!("filtered performance secondary n{h} (deny other/) holds {k}"),
                    );
                }
            }
        }
        if let Some(from) = s.revoked_from {
            self.bump("revocation");
            if let Some((k, _)) = logical
                .iter()
                .find(|(k, _)| key_number(k).is_some_and(|(_, n)| n >= from))
            {
                return fail(
                    "revocation",
                    format!("n{h} received {k}, written after its revoke was acknowledged (keys >= {from})"),
                );
            }
        }
        Ok(())
    }

    pub(super) fn converged(&self, s: &Sec) -> Result<(), String> {
        let (Some(p), Some(n)) = (
            self.hosts[self.primary].host.node(),
            self.hosts[s.host].host.node(),
        ) else {
            return Err("down".into());
        };
        let unsure = s.filter_unsure;
        match (s.mode, s.filtered) {
            (Mode::Dr, _) | (Mode::Performance, false) => {
                let (a, b) = (
                    p.replication().merkle_root(s.mode),
                    n.replication().merkle_root(s.mode),
                );
                if a == b {
                    Ok(())
                } else {
                    Err(format!(
                        "{} root {} vs primary {} (primary last_wal {})",
                        s.mode.name(),
                        &b[..12.min(b.len())],
                        &a[..12.min(a.len())],
                        p.replication().wal.last
                    ))
                }
            }
            (Mode::Performance, true) => {
                let want: Vec<(String, Vec<u8>)> = self
                    .keys(self.primary, "logical/")
                    .into_iter()
                    .filter(|(k, _)| key_number(k).is_some_and(|(o, _)| !o))
                    .collect();
                let got: Vec<(String, Vec<u8>)> = self
                    .keys(s.host, "logical/")
                    .into_iter()
                    .filter(|(k, _)| key_number(k).is_some())
                    .collect();
                let whole = || {
                    p.replication().merkle_root(Mode::Performance)
                        == n.replication().merkle_root(Mode::Performance)
                };
                if want == got || (unsure && whole()) {
                    Ok(())
                } else {
                    Err(format!(
                        "replicated KV differs: {} keys vs primary's {}",
                        got.len(),
                        want.len()
                    ))
                }
            }
        }
    }

    /// Final phase: every active secondary reaches the primary within [`CONVERGE_MS`].
    pub(super) fn check_convergence(&mut self) -> Result<(), Violation> {
        if self.now < self.last_conv_check + 250 {
            return Ok(());
        }
        self.last_conv_check = self.now;
        let mut bad = Vec::new();
        for s in &self.secs {
            if !s.enabled || s.gone || s.revoked_from.is_some() || s.revoke_sent {
                continue;
            }
            if let Err(e) = self.converged(s) {
                bad.push(format!("n{}: {e}", s.host));
            } else if !self.hosts[s.host].rot.dirty {
                // Repaired values (reindex, then the Merkle diff with the primary).
                let (p, x) = (&self.hosts[self.primary], &self.hosts[s.host]);
                if let (Some(p), Some(n)) = (p.host.node(), x.host.node()) {
                    for k in &x.rot.values {
                        if s.filtered && key_number(k).is_some_and(|(o, _)| o) {
                            continue;
                        }
                        let (a, b) = (p.storage().get(k).ok(), n.storage().get(k).ok());
                        if a != b {
                            bad.push(format!(
                                "n{}: {k}, corrupted and then reindexed, still differs from the primary's",
                                s.host
                            ));
                            break;
                        }
                    }
                }
            }
        }
        for h in 0..self.hosts.len() {
            if self.hosts[h].rot.dirty && self.repair_wanted(h) {
                bad.push(format!(
                    "n{h}: planted corruption not yet repaired by a reindex"
                ));
            }
        }
        if bad.is_empty() {
            if let Err(e) = self.check_snapshot_diffs() {
                bad.push(e);
            } else if matches!(self.snap.stage, snapshot::Stage::Done) {
                self.bump("snapshot-merkle");
                if self.snap.after_failover {
                    self.bump("snapshot-merkle:after-failover");
                }
            }
        }
        for h in 0..self.hosts.len() {
            let x = &self.hosts[h];
            if x.needs_unseal || !x.host.is_up() {
                let why = if self.uninit.contains(&h) {
                    " (it answers \"Vault is not initialized\": a performance/DR secondary restarted without core/seal-config and core/keyring, which activation wipes and its credential must bring back; see the seed of secondary-uninitialized-after-restart in sim/regressions)"
                } else {
                    ""
                };
                bad.push(format!("n{h} is still sealed{why}"));
            }
        }
        if bad.is_empty() {
            self.bump("convergence");
            self.stats.converge_ms = self.now - self.final_start;
            self.log(&format!(
                "final: converged after {}ms",
                self.stats.converge_ms
            ));
            self.phase = Phase::ReadBack;
            let keys: BTreeSet<(bool, u64)> = self
                .model
                .keys()
                .chain(self.failover_allowed.keys())
                .copied()
                .collect();
            self.readback = keys.into_iter().rev().collect();
            if self.readback.is_empty() {
                self.phase = Phase::Done;
            } else if self.outstanding.is_none() {
                self.schedule(0, Ev::Wake);
            }
            return Ok(());
        }
        if self.now > self.final_start + self.converge_bound {
            return fail(
                "convergence",
                format!(
                    "secondaries not converged {}s after faults and writes stopped: {}",
                    self.converge_bound / 1000,
                    bad.join("; ")
                ),
            );
        }
        Ok(())
    }

    /// The answer to `Op::ReadBack`.
    pub(super) fn on_read_back(&mut self, a: &Answer, n: u64) -> Result<(), Violation> {
        let text = &a.text;
        let ok = a.ok;
        let status = a.status;
        let body = &a.body;
        let resp = &a.resp;
        if resp.is_ok() {
            let (other, k) = self.readback.pop().unwrap_or((false, n));
            let want = self.model.get(&(other, k)).cloned().flatten();
            let got = if status == 404 {
                None
            } else {
                body["data"]["v"].as_u64()
            };
            self.bump("durability");
            if status != 404 && !ok {
                return fail(
                    "durability",
                    format!("read-back of {} on the primary: {text}", key_name(other, k)),
                );
            }
            if let Some(allowed) = self.failover_allowed.get(&(other, k)).cloned() {
                self.bump("failover");
                if !allowed.contains(&got) {
                    return fail(
                        "failover",
                        format!(
                            "{} on the promoted primary n{} is {got:?}; the old primary's history up to the WAL index the DR secondary had replicated allows only {allowed:?}",
                            key_name(other, k),
                            self.primary
                        ),
                    );
                }
            } else if self.uncertain.contains(&(other, k)) {
                // A write left unanswered after the list was made (the final phase can start
                // while one is out): either state is allowed.
                self.bump("durability:uncertain");
            } else if got != want {
                return fail(
                    "durability",
                    format!(
                        "acknowledged state of {} on the primary was {want:?}, read back {got:?}",
                        key_name(other, k)
                    ),
                );
            }
            if self.readback.is_empty() {
                self.log("final: every acknowledged write read back from the primary");
                self.phase = Phase::Done;
                return Ok(());
            }
        }
        Ok(())
    }
}
