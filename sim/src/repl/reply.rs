//! The replication operator's handling of answers: the model and the secondaries' state
//! follow what was acknowledged; answer-level invariants (filters, gates, read-your-writes,
//! login, durability, failover) are checked here.

use super::*;

/// The operator's view of one answer to its outstanding request.
pub(super) struct Answer {
    pub(super) id: RequestId,
    /// The host the request went to.
    pub(super) h: HostId,
    /// The answer, or the transport error that replaced it.
    pub(super) resp: Result<Response, String>,
    /// A 2xx answer.
    pub(super) ok: bool,
    /// 0 when there was no answer.
    pub(super) status: u16,
    pub(super) body: Value,
    /// Status and body (or the error) as text.
    pub(super) text: String,
    /// Upper bound of the WAL index the request's writes got (`u64::MAX`: unknown).
    pub(super) wal_at: u64,
}

impl ReplWorld {
    /// Handles the answer to the operator's outstanding request: each kind of request has
    /// its own handler (`on_*`); then the operator thinks and wakes again.
    pub(super) fn on_reply(
        &mut self,
        id: RequestId,
        resp: Result<Response, String>,
    ) -> Result<(), Violation> {
        let Some((oid, h, op)) = self.outstanding.clone() else {
            return Ok(());
        };
        if oid != id {
            return Ok(());
        }
        self.outstanding = None;
        let wal_at = self.out_wal.take().unwrap_or(u64::MAX);
        let text = body_text(&resp);
        self.log(&format!("op <- n{h} #{id} {}", shorten(&text, 160)));
        if resp.is_err() {
            self.stats.lost_requests += 1;
        }
        let a = Answer {
            id,
            h,
            ok: status_ok(&resp),
            status: resp.as_ref().map(|r| r.status).unwrap_or(0),
            body: resp
                .as_ref()
                .ok()
                .and_then(|r| r.body.clone())
                .unwrap_or(Value::Null),
            text,
            wal_at,
            resp,
        };
        match op {
            Op::Unseal(h) => self.on_unsealed(&a, h)?,
            Op::Mount => self.on_mounted(&a)?,
            Op::MountV2 => {
                let text = &a.text;
                if a.ok || text.contains("already") || text.contains("in use") {
                    self.v2_mounted = true;
                }
            }
            // Its answer may be anything a client can see (a patch of a key with no live
            // version is a 404, a write on a deposed primary is refused, storage faults are
            // 5xx); what it wrote is checked by the convergence of the secondaries.
            Op::KvV2 => {}
            Op::EnablePrimary(m) => self.on_primary_enabled(&a, m)?,
            Op::SecToken(i) => self.on_sec_token(&a, i)?,
            Op::Filter(i) => self.on_filter_set(&a, i)?,
            Op::SecEnable(i) => self.on_sec_enabled(&a, i)?,
            Op::Put { n, other } => self.on_put(&a, n, other)?,
            Op::FwdPut { h, n, other } => {
                // Applied on the primary (if at all): the secondary's WAL says nothing of
                // its index there, so it is unknown; otherwise a write like any other.
                let a = Answer {
                    wal_at: u64::MAX,
                    ..a
                };
                if a.ok {
                    self.bump("forwarded-write");
                } else {
                    self.log(&format!("op: write forwarded by n{h} not acknowledged"));
                    self.lost_forwards.insert((other, n % 1_000_000));
                }
                self.on_put(&a, n, other)?
            }
            Op::Delete { n, other } => self.on_deleted(&a, n, other)?,
            Op::Policy => {}
            Op::TokenCreate => self.on_token_created(&a)?,
            Op::Probe(h) => self.on_probed(&a, h)?,
            Op::ReadAt { h, other, key, pos } => self.on_read_at(&a, h, other, key, pos)?,
            Op::Read(h, other, n) => self.on_read(&a, h, other, n)?,
            Op::Revoke(i) => self.on_revoked(&a, i)?,
            Op::GenAttempt(i) => self.on_gen_attempt(&a, i)?,
            Op::GenCancel(i) => self.on_gen_cancelled(&a, i)?,
            Op::GenUpdate(i) => self.on_gen_update(&a, i)?,
            Op::TokAttempt(h) => self.on_tok_attempt(&a, h)?,
            Op::TokCancel(h) => self.on_tok_cancelled(&a, h)?,
            Op::TokUpdate(h, wrong) => self.on_tok_update(&a, h, wrong)?,
            Op::Promote { h, with_token } => self.on_promote(&a, h, with_token)?,
            Op::UpdatePrimary { i, by_token } => self.on_update_primary(&a, i, by_token)?,
            Op::OldPrimary { h, mode } => self.on_old_primary(&a, h, mode)?,
            Op::SecDisable(i) => self.on_sec_disabled(&a, i)?,
            Op::LdapMount => self.on_ldap_mounted(&a)?,
            Op::LdapConfig => self.on_ldap_configured(&a)?,
            Op::LdapMap => self.on_ldap_mapped(&a)?,
            Op::Login(att) => self.on_login(&a, att)?,
            Op::Scan { h, reindex, repair } => self.on_scan_reply(&a, h, reindex, repair)?,
            Op::SnapSave => self.on_snap_saved(&a)?,
            Op::SnapDamaged { truncated, at } => self.on_snap_damaged(&a, truncated, at)?,
            Op::SnapRestore => self.on_snap_restored(&a)?,
            Op::SecTokenCreate(h) => self.on_sec_token_created(&a, h)?,
            Op::ReadBack(n) => self.on_read_back(&a, n)?,
        }
        if self.phase == Phase::Done {
            return Ok(());
        }
        let d = self.oprng.delay(self.params.think_ms);
        self.schedule(d, Ev::Wake);
        Ok(())
    }

    /// The answer to `Op::Unseal`.
    pub(super) fn on_unsealed(&mut self, a: &Answer, h: HostId) -> Result<(), Violation> {
        let ok = a.ok;
        let body = &a.body;
        let text = &a.text;
        let resp = &a.resp;
        let sealed = body
            .get("sealed")
            .or_else(|| body.get("data").and_then(|d| d.get("sealed")))
            .and_then(Value::as_bool);
        if ok && sealed == Some(false) {
            self.hosts[h].needs_unseal = false;
            self.unseal_tries[h] = 0;
        } else if resp.is_ok() && text.contains("not sealed") {
            self.hosts[h].needs_unseal = false;
        } else if text.contains("not initialized") {
            // A secondary mid-sync may lack the seal configuration: try again later
            // (the final phase's convergence bound catches one that stays so).
            self.unseal_after[h] = self.now + 1_000;
            self.uninit.insert(h);
            self.log(&format!("n{h} is not initialized: unseal again in 1s"));
        } else if resp.is_ok() {
            self.unseal_tries[h] += 1;
            if self.unseal_tries[h] > 50 {
                return fail("liveness", format!("n{h} cannot be unsealed: {text}"));
            }
        }
        Ok(())
    }

    /// The answer to `Op::Mount`.
    pub(super) fn on_mounted(&mut self, a: &Answer) -> Result<(), Violation> {
        let ok = a.ok;
        let text = &a.text;
        if ok || text.contains("already") || text.contains("in use") || text.contains("exist") {
            self.mounted = true;
        }
        Ok(())
    }

    /// The answer to `Op::EnablePrimary`.
    pub(super) fn on_primary_enabled(&mut self, a: &Answer, m: Mode) -> Result<(), Violation> {
        let ok = a.ok;
        let text = &a.text;
        if ok || text.contains("already") {
            match m {
                Mode::Performance => self.perf_enabled = true,
                Mode::Dr => self.dr_enabled = true,
            }
        }
        Ok(())
    }

    /// The answer to `Op::SecToken`.
    pub(super) fn on_sec_token(&mut self, a: &Answer, i: usize) -> Result<(), Violation> {
        let ok = a.ok;
        let body = &a.body;
        let sid = self.secs[i].id.clone();
        if !self.secs[i].ids.contains(&sid) {
            self.secs[i].ids.push(sid);
        }
        match body["wrap_info"]["token"].as_str() {
            Some(t) if ok => self.secs[i].token = Some(t.to_string()),
            _ => self.new_attempt(i),
        }
        Ok(())
    }

    /// The answer to `Op::Filter`.
    pub(super) fn on_filter_set(&mut self, a: &Answer, i: usize) -> Result<(), Violation> {
        let ok = a.ok;
        let status = a.status;
        let wal_at = a.wal_at;
        if ok {
            self.secs[i].filter_set = true;
            self.secs[i].filter_wal = wal_at;
            self.secs[i].filter_unsure = false;
        } else if status == 400 || status == 404 {
            self.new_attempt(i);
        }
        Ok(())
    }

    /// The answer to `Op::SecEnable`.
    pub(super) fn on_sec_enabled(&mut self, a: &Answer, i: usize) -> Result<(), Violation> {
        let ok = a.ok;
        let text = &a.text;
        let resp = &a.resp;
        if ok || text.contains("already a") {
            self.secs[i].enabled = true;
            self.secs[i].ldap_ready = false;
            let h = self.secs[i].host;
            self.ldap.forget(h);
            self.log(&format!(
                "n{} is a {} secondary",
                self.secs[i].host,
                self.secs[i].mode.name()
            ));
        } else if resp.is_ok() {
            self.new_attempt(i);
        } else {
            // Lost: the enable may or may not have happened; a retry with the same
            // token tells ("already a secondary") or fails (token used) → new token.
        }
        Ok(())
    }

    /// The answer to `Op::Put`.
    pub(super) fn on_put(&mut self, a: &Answer, n: u64, other: bool) -> Result<(), Violation> {
        let h = a.h;
        let ok = a.ok;
        let wal_at = a.wal_at;
        let resp = &a.resp;
        let k = (other, n % 1_000_000);
        let u = if ok { wal_at } else { u64::MAX };
        let hist = self.hist.entry(k).or_default();
        hist.push((u, Some(n)));
        let pos = hist.len() - 1;
        if ok && !self.failed_over {
            let Some(state) = resp.as_ref().ok().and_then(|r| r.index.clone()) else {
                return fail(
                    "read-your-writes",
                    format!("a write on primary n{h} answered without X-Vault-Index"),
                );
            };
            self.last_put = Some((other, k.1, pos, state));
        }
        self.failover_allowed.remove(&k);
        if ok {
            self.model.insert(k, Some(n));
            self.settle(k);
        } else {
            self.model.remove(&k);
            self.uncertain.insert(k);
        }
        Ok(())
    }

    /// An acknowledged write of `k` makes its state known again, unless a forwarded write
    /// of it may still land (`lost_forwards`).
    pub(super) fn settle(&mut self, k: (bool, u64)) {
        if !self.lost_forwards.contains(&k) {
            self.uncertain.remove(&k);
        }
    }

    /// The answer to `Op::Delete`.
    pub(super) fn on_deleted(&mut self, a: &Answer, n: u64, other: bool) -> Result<(), Violation> {
        let ok = a.ok;
        let wal_at = a.wal_at;
        let k = (other, n);
        let u = if ok { wal_at } else { u64::MAX };
        self.hist.entry(k).or_default().push((u, None));
        self.failover_allowed.remove(&k);
        if ok {
            self.model.insert(k, None);
            self.settle(k);
        } else {
            self.model.remove(&k);
            self.uncertain.insert(k);
        }
        Ok(())
    }

    /// The answer to `Op::TokenCreate`.
    pub(super) fn on_token_created(&mut self, a: &Answer) -> Result<(), Violation> {
        let body = &a.body;
        if let Some(t) = body["auth"]["client_token"].as_str() {
            self.primary_tokens.push(t.to_string());
        }
        Ok(())
    }

    /// The answer to `Op::Probe`.
    pub(super) fn on_probed(&mut self, a: &Answer, h: HostId) -> Result<(), Violation> {
        let text = &a.text;
        let ok = a.ok;
        let status = a.status;
        let resp = &a.resp;
        self.bump("filters");
        if ok {
            return fail(
                "filters",
                format!("a primary token was accepted by performance secondary n{h}: {text}"),
            );
        }
        if resp.is_ok() && status != 403 && status != 503 {
            self.log(&format!(
                "note: primary token on n{h} got {status}, not 403"
            ));
        }
        Ok(())
    }

    /// The answer to `Op::ReadAt`.
    pub(super) fn on_read_at(
        &mut self,
        a: &Answer,
        h: HostId,
        other: bool,
        key: u64,
        pos: usize,
    ) -> Result<(), Violation> {
        let status = a.status;
        let body = &a.body;
        // Served at all: the secondary applied the write, so it holds that value or
        // a later one of the key's history (a later delete: not found).
        let later: Vec<Option<u64>> = self
            .hist
            .get(&(other, key))
            .map(|v| v.iter().skip(pos).map(|(_, val)| *val).collect())
            .unwrap_or_default();
        let served = match status {
            200 => Some(body["data"]["v"].as_u64()),
            404 => Some(None),
            _ => None,
        };
        if let Some(got) = served {
            self.bump("read-your-writes");
            if !later.contains(&got) {
                return fail(
                    "read-your-writes",
                    format!(
                        "n{h} served {} = {got:?} for a request carrying the \
                         X-Vault-Index of a later write (values since: {later:?})",
                        key_name(other, key)
                    ),
                );
            }
        }
        Ok(())
    }

    /// The answer to `Op::Read`.
    pub(super) fn on_read(
        &mut self,
        a: &Answer,
        h: HostId,
        other: bool,
        n: u64,
    ) -> Result<(), Violation> {
        let text = &a.text;
        let ok = a.ok;
        let body = &a.body;
        if ok {
            self.bump("prefix");
            let filtered = self
                .sec_of(h)
                .is_some_and(|s| s.filtered && !s.filter_unsure);
            if other && filtered {
                return fail(
                    "filters",
                    format!("filtered n{h} served {}: {text}", key_name(other, n)),
                );
            }
            // Values of key n are n + 1e6·k: a value of another key is corrupt data.
            if let Some(v) = body["data"]["v"].as_u64() {
                if v % 1_000_000 != n {
                    return fail(
                        "prefix",
                        format!(
                            "n{h} served {} = {v}, never written to that key",
                            key_name(other, n)
                        ),
                    );
                }
            }
        }
        Ok(())
    }

    /// The answer to `Op::Revoke`.
    pub(super) fn on_revoked(&mut self, a: &Answer, i: usize) -> Result<(), Violation> {
        let ok = a.ok;
        let text = &a.text;
        if ok || text.contains("no secondary") || text.contains("no performance secondary") {
            self.secs[i].revoke_left.remove(0);
            if self.secs[i].revoke_left.is_empty() {
                self.secs[i].revoked_from = Some(self.next_key);
                self.log(&format!(
                    "revoke of n{} acknowledged; keys >= {} must not reach it",
                    self.secs[i].host, self.next_key
                ));
            }
        }
        Ok(())
    }

    /// The answer to `Op::GenAttempt`.
    pub(super) fn on_gen_attempt(&mut self, a: &Answer, i: usize) -> Result<(), Violation> {
        self.secs[i].root_gen.on_started(a);
        Ok(())
    }

    /// The answer to `Op::GenCancel`.
    pub(super) fn on_gen_cancelled(&mut self, a: &Answer, i: usize) -> Result<(), Violation> {
        self.secs[i].root_gen.on_cancelled(a);
        Ok(())
    }

    /// The answer to `Op::GenUpdate`.
    pub(super) fn on_gen_update(&mut self, a: &Answer, i: usize) -> Result<(), Violation> {
        if let Some(t) = self.secs[i].root_gen.on_update(a) {
            self.log(&format!("n{} root token generated", self.secs[i].host));
            self.secs[i].local_root = Some(t);
        }
        Ok(())
    }

    /// The answer to `Op::SecDisable`.
    pub(super) fn on_sec_disabled(&mut self, a: &Answer, i: usize) -> Result<(), Violation> {
        let ok = a.ok;
        let text = &a.text;
        if ok || text.contains("not a ") {
            let s = &mut self.secs[i];
            s.enabled = false;
            s.disable = false;
            s.local_root = None;
            s.root_gen.gen = None;
            s.root_gen.tries = 0;
            s.synced_once = false;
            s.ldap_ready = false;
            let h = s.host;
            self.ldap.forget(h);
            self.new_attempt(i);
            self.log(&format!(
                "n{h} secondary disabled; it will be enabled again"
            ));
        }
        Ok(())
    }

    /// The answer to `Op::LdapMount`.
    pub(super) fn on_ldap_mounted(&mut self, a: &Answer) -> Result<(), Violation> {
        let ok = a.ok;
        let text = &a.text;
        if ok || text.contains("already") || text.contains("in use") {
            self.ldap_mounted = true;
        }
        Ok(())
    }

    /// The answer to `Op::LdapConfig`.
    pub(super) fn on_ldap_configured(&mut self, a: &Answer) -> Result<(), Violation> {
        let ok = a.ok;
        if ok {
            self.ldap_configured = true;
        }
        Ok(())
    }

    /// The answer to `Op::LdapMap`.
    pub(super) fn on_ldap_mapped(&mut self, a: &Answer) -> Result<(), Violation> {
        let ok = a.ok;
        let resp = &a.resp;
        self.ldap
            .mapping_answer(if resp.is_err() { None } else { Some(ok) });
        Ok(())
    }

    /// The answer to `Op::Login`.
    pub(super) fn on_login(
        &mut self,
        ans: &Answer,
        a: crate::ldap::Attempt,
    ) -> Result<(), Violation> {
        let t1 = self.ldap_at.get(&a.host).copied().filter(|t| *t >= a.t0);
        let primary = a.host == self.primary && !self.failed_over;
        let ready = if a.host == self.primary {
            self.ldap_configured
        } else {
            self.sec_of(a.host).is_some_and(|s| s.ldap_ready)
        };
        let st = ans.resp.as_ref().ok().map(|r| r.status);
        self.bump("login");
        let what = self.ldap.observe(&a, t1, st, &ans.body, primary, ready)?;
        self.bump(match what {
            "ok" => "login:ok",
            "ok-nested" => "login:ok-nested",
            "refused" => "login:refused",
            "refused-account" => "login:refused-account",
            "refused-locked" => "login:locked",
            _ => "login:undecided",
        });
        Ok(())
    }

    /// The answer to `Op::SecTokenCreate`.
    pub(super) fn on_sec_token_created(&mut self, a: &Answer, h: HostId) -> Result<(), Violation> {
        let text = &a.text;
        let ok = a.ok;
        let status = a.status;
        let resp = &a.resp;
        if ok {
            self.bump("perf-secondary-token");
        } else if resp.is_ok() && status != 503 && status != 403 {
            self.log(&format!("note: token creation on n{h}: {text}"));
        }
        Ok(())
    }
}
