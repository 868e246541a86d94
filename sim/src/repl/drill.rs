//! The failover drill: primary lost → DR operation token → promote → secondaries
//! re-pointed → the old primary demoted and re-joined as a DR secondary of the new one.

use super::*;

/// The DR operation token state of one host.
#[derive(Debug, Clone, Default)]
pub(super) struct OpTok {
    /// The generation flow (attempt, key shares, decode).
    pub(super) flow: ShareFlow,
    pub(super) token: Option<String>,
    pub(super) wrong_tried: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DStep {
    Promote,
    Repoint,
    Rejoin,
    Done,
}

/// A DR failover drill: primary lost → DR promote → secondaries re-pointed → the old
/// primary demoted and re-joined as a DR secondary of the new one.
#[derive(Debug, Clone)]
pub(super) struct Drill {
    /// Index (in `secs`) of the DR secondary that is promoted.
    pub(super) dr: usize,
    pub(super) old: HostId,
    pub(super) force: bool,
    /// The unforced promote was refused because the secondary had not finished its Merkle
    /// sync; the forced one accepts losing what it had not fetched.
    pub(super) lossy: bool,
    pub(super) step: DStep,
    pub(super) gate_probed: bool,
    pub(super) perf_off: bool,
    pub(super) dr_demoted: bool,
    pub(super) rejoin: Option<usize>,
}

/// What the failover drill wants from the operator next.
#[derive(Debug)]
pub(super) enum DrillNext {
    /// No drill is running (or it is done): normal operation.
    Off,
    /// A drill is running and waits (for a host to come up, a step to finish).
    Wait,
    /// The drill's next request.
    Send(Box<(HostId, Op, Request)>),
}

impl DrillNext {
    fn send(r: (HostId, Op, Request)) -> DrillNext {
        DrillNext::Send(Box::new(r))
    }
}

impl ReplWorld {
    /// The failover drill's next step (see [`DrillNext`]).
    pub(super) fn choose_drill(&mut self, id: RequestId) -> DrillNext {
        let Some(d) = self.drill.clone() else {
            let Some(at) = self.drill_at else {
                return DrillNext::Off;
            };
            if self.phase != Phase::Chaos
                || self.stats.events < at
                || !self.up(self.primary)
                || self.snap.busy()
            {
                return DrillNext::Off;
            }
            let Some(i) = self.secs.iter().position(|s| {
                s.mode == Mode::Dr
                    && s.enabled
                    && s.synced_once
                    && !s.gone
                    && !s.revoke_sent
                    && s.revoked_from.is_none()
                    && s.host != self.primary
            }) else {
                return DrillNext::Off;
            };
            let old = self.primary;
            let partition = self.oprng.chance(400);
            let force = self.oprng.chance(500);
            self.drill = Some(Drill {
                dr: i,
                old,
                force,
                lossy: false,
                step: DStep::Promote,
                gate_probed: false,
                perf_off: false,
                dr_demoted: false,
                rejoin: None,
            });
            self.drill_at = None;
            let dh = self.secs[i].host;
            self.log(&format!(
                "DRILL: primary n{old} lost ({}); DR secondary n{dh} will be promoted{}",
                if partition {
                    "partitioned from every host"
                } else {
                    "crashed, stays down"
                },
                if force { " with force" } else { "" }
            ));
            if partition {
                self.isolated = Some(old);
                for b in 0..self.hosts.len() {
                    if b != old {
                        self.cut_link(old, b);
                    }
                }
            } else {
                self.held_down = Some(old);
                if self.crash(old).is_err() {
                    return DrillNext::Wait;
                }
            }
            return DrillNext::Wait;
        };
        let dh = self.secs[d.dr].host;
        match d.step {
            DStep::Done => DrillNext::Off,
            DStep::Promote => {
                if !self.up(dh) {
                    return DrillNext::Wait;
                }
                if self.optok[dh].token.is_none() {
                    return DrillNext::send(self.optok_req(dh, id));
                }
                let path = "sys/replication/dr/secondary/promote";
                if !d.gate_probed {
                    let bogus = if self.oprng.chance(500) {
                        json!({})
                    } else {
                        json!({"dr_operation_token": "cdr.AAAAAAAAAAAAAAAAAAAAAAAA"})
                    };
                    let req = Request::new(id, Method::Post, path)
                        .with_token(&self.root(0))
                        .with_json(bogus);
                    return DrillNext::send((
                        dh,
                        Op::Promote {
                            h: dh,
                            with_token: false,
                        },
                        req,
                    ));
                }
                let mut body = json!({
                    "dr_operation_token": self.optok[dh].token.clone().unwrap_or_default(),
                    "primary_cluster_addr": cluster_addr(dh),
                });
                if d.force {
                    body["force"] = json!(true);
                }
                let req = Request::new(id, Method::Post, path)
                    .with_token(&self.root(0))
                    .with_json(body);
                DrillNext::send((
                    dh,
                    Op::Promote {
                        h: dh,
                        with_token: true,
                    },
                    req,
                ))
            }
            DStep::Repoint => {
                let mut waiting = false;
                for i in 0..self.secs.len() {
                    let s = &self.secs[i];
                    let Some(by_token) = s.repoint else {
                        continue;
                    };
                    waiting = true;
                    if !self.up(s.host) || !self.up(self.primary) {
                        continue;
                    }
                    if let Some(r) = self.sec_auth_req(i, id) {
                        return DrillNext::send(r);
                    }
                    let r0 = self.root(0);
                    if by_token && s.token.is_none() {
                        let req = Request::new(
                            id,
                            Method::Post,
                            &format!("sys/replication/{}/primary/secondary-token", s.mode.name()),
                        )
                        .with_token(&r0)
                        .with_json(json!({ "id": s.id }));
                        return DrillNext::send((self.primary, Op::SecToken(i), req));
                    }
                    if by_token && s.filtered && !s.filter_set {
                        let req = Request::new(
                            id,
                            Method::Post,
                            &format!("sys/replication/performance/primary/paths-filter/{}", s.id),
                        )
                        .with_token(&r0)
                        .with_json(json!({"mode": "deny", "paths": ["other/"]}));
                        return DrillNext::send((self.primary, Op::Filter(i), req));
                    }
                    return DrillNext::send(self.update_primary_req(i, id, by_token));
                }
                if !waiting {
                    self.set_step(DStep::Rejoin);
                    self.log("DRILL: every secondary re-pointed; the old primary comes back");
                }
                DrillNext::Wait
            }
            DStep::Rejoin => {
                let o = d.old;
                if self.held_down == Some(o) {
                    self.held_down = None;
                    if !self.hosts[o].host.is_up() {
                        self.stats.restarts += 1;
                        self.boot(o);
                    }
                }
                if self.isolated == Some(o) {
                    self.isolated = None;
                    for b in 0..self.hosts.len() {
                        if b != o {
                            self.heal(o, b);
                        }
                    }
                }
                if !self.up(o) || !self.up(self.primary) {
                    return DrillNext::Wait;
                }
                let r0 = self.root(0);
                for (done, mode, what) in [
                    (d.perf_off, Mode::Performance, "disable"),
                    (d.dr_demoted, Mode::Dr, "demote"),
                ] {
                    if !done {
                        let req = Request::new(
                            id,
                            Method::Post,
                            &format!("sys/replication/{}/primary/{what}", mode.name()),
                        )
                        .with_token(&r0)
                        .with_json(json!({}));
                        return DrillNext::send((o, Op::OldPrimary { h: o, mode }, req));
                    }
                }
                let i = match d.rejoin {
                    Some(i) => i,
                    None => {
                        let i = self.secs.len();
                        self.secs.push(Sec {
                            rejoin: true,
                            ..Sec::new(o, Mode::Dr, false, format!("n{o}-r0"))
                        });
                        if let Some(dr) = self.drill.as_mut() {
                            dr.rejoin = Some(i);
                        }
                        i
                    }
                };
                let s = &self.secs[i];
                if s.enabled {
                    self.set_step(DStep::Done);
                    self.log(&format!(
                        "DRILL: done; n{o} is a DR secondary of n{}",
                        self.primary
                    ));
                    return DrillNext::Off;
                }
                if s.token.is_none() {
                    let req = Request::new(
                        id,
                        Method::Post,
                        "sys/replication/dr/primary/secondary-token",
                    )
                    .with_token(&r0)
                    .with_json(json!({ "id": s.id }));
                    return DrillNext::send((self.primary, Op::SecToken(i), req));
                }
                if let Some(r) = self.sec_auth_req(i, id) {
                    return DrillNext::send(r);
                }
                DrillNext::send(self.update_primary_req(i, id, true))
            }
        }
    }

    pub(super) fn set_step(&mut self, step: DStep) {
        if let Some(d) = self.drill.as_mut() {
            d.step = step;
        }
    }

    /// A DR promote was acknowledged (or seen to have happened): host `h` is the primary.
    pub(super) fn on_promoted(&mut self, h: HostId) -> Result<(), Violation> {
        let Some(d) = self.drill.clone() else {
            return Ok(());
        };
        let l = self.pre_promote_wal.get(&h).copied().unwrap_or(0);
        self.primary = h;
        self.failed_over = true;
        self.ldap.forget(h);
        self.secs[d.dr].gone = true;
        self.secs[d.dr].enabled = false;
        self.wal_floor = l;
        self.set_step(DStep::Repoint);
        let mut repointed = Vec::new();
        for j in 0..self.secs.len() {
            let s = &self.secs[j];
            if s.gone || s.revoked_from.is_some() || s.revoke_sent {
                continue;
            }
            if !s.enabled {
                // Its token came from the lost primary: start over with the new one.
                self.new_attempt(j);
                continue;
            }
            let by_token = self.oprng.chance(500);
            if by_token {
                self.new_attempt(j);
            }
            let s = &mut self.secs[j];
            if s.filtered && s.mode == Mode::Performance && s.filter_wal > l {
                // The filter's write may be past what the DR secondary had replicated: the
                // new primary may not know it (as the reference would not).
                s.filter_unsure = true;
            }
            self.secs[j].repoint = Some(by_token);
            repointed.push(format!(
                "n{} by {}",
                self.secs[j].host,
                if by_token { "token" } else { "addresses" }
            ));
        }
        // Failover: what the new primary holds is the old primary's history up to the WAL
        // index it had replicated (L) — each key holds its last value written at or before
        // L, or a later one (a write's index is only known from above).
        let mut exact = 0;
        for (k, h) in &self.hist {
            let j = h.iter().rposition(|(u, _)| *u <= l);
            let mut allowed: BTreeSet<Option<u64>> =
                h[j.unwrap_or(0)..].iter().map(|(_, v)| *v).collect();
            if j.is_none() || d.lossy {
                allowed.insert(None);
            }
            if d.lossy {
                // A forced promote of an unsynced copy: any value the key ever had, or none.
                allowed.extend(h.iter().map(|(_, v)| *v));
            }
            if allowed.len() == 1 {
                exact += 1;
            }
            self.model.remove(k);
            self.uncertain.remove(k);
            self.failover_allowed.insert(*k, allowed);
        }
        self.log(&format!(
            "DRILL: n{h} promoted at replicated WAL index {l}; {} keys to check ({exact} exactly); re-pointing [{}]",
            self.hist.len(),
            repointed.join(", ")
        ));
        self.bump("failover");
        Ok(())
    }

    /// The answer to `Op::TokAttempt`.
    pub(super) fn on_tok_attempt(&mut self, a: &Answer, h: HostId) -> Result<(), Violation> {
        self.optok[h].flow.on_started(a);
        Ok(())
    }

    /// The answer to `Op::TokCancel`.
    pub(super) fn on_tok_cancelled(&mut self, a: &Answer, h: HostId) -> Result<(), Violation> {
        self.optok[h].flow.on_cancelled(a);
        Ok(())
    }

    /// The answer to `Op::TokUpdate`.
    pub(super) fn on_tok_update(
        &mut self,
        a: &Answer,
        h: HostId,
        wrong: bool,
    ) -> Result<(), Violation> {
        let text = &a.text;
        let ok = a.ok;
        let body = &a.body;
        let resp = &a.resp;
        let enc = body["encoded_token"]
            .as_str()
            .or_else(|| body["data"]["encoded_token"].as_str());
        if wrong {
            self.optok[h].wrong_tried = true;
            self.bump("gates");
            if ok && enc.is_some_and(|e| !e.is_empty()) {
                return fail(
                    "gates",
                    format!("n{h} generated a DR operation token from a key share of another keyring: {text}"),
                );
            }
            if resp.is_ok() && !ok {
                // Refused, progress reset: the attempt goes on with the right share.
            }
        } else if let Some(t) = self.optok[h].flow.on_update(a) {
            self.log(&format!("n{h} DR operation token generated"));
            self.optok[h].token = Some(t);
        }
        Ok(())
    }

    /// The answer to `Op::Promote`.
    pub(super) fn on_promote(
        &mut self,
        a: &Answer,
        h: HostId,
        with_token: bool,
    ) -> Result<(), Violation> {
        let ok = a.ok;
        let status = a.status;
        let text = &a.text;
        if !with_token {
            self.bump("gates");
            if ok {
                return fail(
                    "gates",
                    format!(
                        "DR promote of n{h} succeeded without a valid DR operation token: {text}"
                    ),
                );
            }
            if let Some(d) = self.drill.as_mut() {
                d.gate_probed = true;
            }
        } else {
            let promoted = ok
                || self.hosts[h].host.node().is_some_and(|n| {
                    n.replication().role(Mode::Dr) == cairn_core::replication::state::Role::Primary
                });
            if promoted {
                self.on_promoted(h)?;
            } else if status == 403 {
                self.optok[h].token = None;
            } else if status == 400 && text.contains("force=true") {
                // The secondary had not finished its Merkle sync when its primary was
                // lost: like an operator, accept the possible loss and force it (the
                // failover checker bounds what may be lost).
                self.bump("promote-needs-force");
                if let Some(d) = self.drill.as_mut() {
                    d.force = true;
                    d.lossy = true;
                }
            }
        }
        Ok(())
    }

    /// The answer to `Op::UpdatePrimary`.
    pub(super) fn on_update_primary(
        &mut self,
        a: &Answer,
        i: usize,
        by_token: bool,
    ) -> Result<(), Violation> {
        let ok = a.ok;
        let status = a.status;
        let text = &a.text;
        let resp = &a.resp;
        let not_sec = text.contains(&format!("not a {} secondary", self.secs[i].mode.name()));
        if ok {
            let s = &mut self.secs[i];
            s.repoint = None;
            s.repoint_fails = 0;
            if s.rejoin {
                s.enabled = true;
                if !s.ids.contains(&s.id) {
                    let id = s.id.clone();
                    s.ids.push(id);
                }
            }
            let h = s.host;
            self.log(&format!(
                "n{h} re-pointed to n{} by {}",
                self.primary,
                if by_token { "token" } else { "addresses" }
            ));
        } else if not_sec {
            // It never became a secondary (its enable was lost): set it up afresh.
            let s = &mut self.secs[i];
            s.repoint = None;
            s.enabled = false;
            self.new_attempt(i);
        } else if status == 403 && text.contains("dr_operation_token") {
            let h = self.secs[i].host;
            self.optok[h].token = None;
        } else if resp.is_err() {
            // Lost: it may have happened; by addresses is idempotent.
            if by_token && !self.secs[i].rejoin {
                self.secs[i].repoint = Some(false);
            }
        } else {
            let s = &mut self.secs[i];
            s.repoint_fails += 1;
            if by_token || s.repoint_fails > 3 {
                if s.repoint.is_some() {
                    s.repoint = Some(true);
                }
                self.new_attempt(i);
            }
        }
        Ok(())
    }

    /// The answer to `Op::OldPrimary`.
    pub(super) fn on_old_primary(
        &mut self,
        a: &Answer,
        h: HostId,
        mode: Mode,
    ) -> Result<(), Violation> {
        let ok = a.ok;
        let text = &a.text;
        let done = ok || text.contains("not a ") || text.contains("is not");
        if done {
            if let Some(d) = self.drill.as_mut() {
                match mode {
                    Mode::Performance => d.perf_off = true,
                    Mode::Dr => d.dr_demoted = true,
                }
            }
            self.log(&format!("n{h} {} primary stepped down", mode.name()));
        }
        Ok(())
    }
}
