//! The KV and unwrap checks of [`Checker`]: what a KV request or an unwrap may answer,
//! given the model's ACL decision, the key's state and the token's.

use super::*;

impl Checker {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn kv(
        &mut self,
        h: HostId,
        secret: &str,
        op: &KvOp,
        at: u64,
        status: u16,
        body: &Value,
        what: &str,
    ) -> Result<(), Violation> {
        let (kind, path) = match op {
            KvOp::Put { key, .. } => (KvKind::Put, key),
            KvOp::Get { key, .. } => (KvKind::Get, key),
            KvOp::Delete { key } => (KvKind::Delete, key),
            KvOp::List { dir, .. } => (KvKind::List, dir),
        };
        let e = &self.hosts[h];
        let exists = !e.mounted || e.kv.contains_key(path);
        let auth = e.auth(secret, at);
        let decision = match &auth {
            Auth::Root => Decision::Allowed,
            Auth::Invalid(_) => Decision::Denied,
            Auth::Limited {
                kind: TokenKind::Wrapping,
                ..
            } => Decision::Denied,
            Auth::Limited {
                policies,
                use_limited,
                ..
            } => match decide_kv(kind, e.caps(policies, path), exists) {
                Decision::Allowed if *use_limited => Decision::Unsure,
                d => d,
            },
        };
        match decision {
            Decision::Denied => {
                let inv = deny_invariant(&auth);
                bump(&mut self.counts, deny_category(&auth));
                bump(&mut self.counts, inv);
                if status != 403 {
                    let why = match &auth {
                        Auth::Limited { policies, .. } => format!(
                            "policies {policies:?} grant {} on {path}",
                            caps_text(self.hosts[h].caps(policies, path))
                        ),
                        a => auth_reason(a),
                    };
                    return fail(inv, format!("{why}: {what}"));
                }
                return Ok(());
            }
            Decision::Allowed => {
                bump(&mut self.counts, "authorized-succeeds");
                if status == 403 {
                    return fail(
                        "authorized-succeeds",
                        format!("permission clearly granted: {what}"),
                    );
                }
            }
            Decision::Unsure => {}
        }
        if status == 403 {
            return Ok(());
        }
        let e = &mut self.hosts[h];
        if !e.mounted {
            bump(&mut self.counts, "kv-consistency");
            if status != 404 {
                return fail(
                    "kv-consistency",
                    format!("secret/ is not mounted, expected 404: {what}"),
                );
            }
            return Ok(());
        }
        // Which invariant a wrong read breaks: durability when the write (or delete) it
        // contradicts was acknowledged before the node's latest restart.
        let boot = e.boot;
        let name_for = |e: &Expected, key: &str| -> &'static str {
            let old_write = e.kv.get(key).is_some_and(|k| k.boot < boot);
            let old_delete = e.deleted.get(key).is_some_and(|b| *b < boot);
            if old_write || old_delete {
                "durability"
            } else {
                "kv-consistency"
            }
        };
        match op {
            KvOp::Put { key, value } => {
                if status != 204 {
                    return fail("unexpected-status", what.to_string());
                }
                e.kv.insert(
                    key.clone(),
                    KvEntry {
                        value: value.clone(),
                        boot,
                    },
                );
                e.deleted.remove(key);
                Ok(())
            }
            KvOp::Delete { key } => {
                if status != 204 {
                    return fail("unexpected-status", what.to_string());
                }
                if e.kv.remove(key).is_some() {
                    e.deleted.insert(key.clone(), boot);
                }
                Ok(())
            }
            KvOp::Get { key, wrap } => {
                let inv = name_for(e, key);
                bump(&mut self.counts, inv);
                let e = &mut self.hosts[h];
                let want = e.kv.get(key).map(|k| k.value.clone());
                match (status, &want) {
                    (404, None) => Ok(()),
                    (404, Some(v)) => fail(inv, format!("expected {v}: {what}")),
                    (200, None) => fail(inv, format!("expected 404 (absent): {what}")),
                    (200, Some(v)) => {
                        match wrap {
                            None => {
                                if &body["data"] != v {
                                    return fail(inv, format!("expected {v}: {what}"));
                                }
                                Ok(())
                            }
                            Some((_, secs)) => {
                                let token = body["wrap_info"]["token"].as_str().unwrap_or_default();
                                if token.is_empty() || !body["data"].is_null() {
                                    return fail(
                                    "wrapping",
                                    format!("a wrapped answer must carry a token and no data: {what}"),
                                );
                                }
                                let expire_at = at + secs * 1000;
                                register_wrap(e, token, Wrapped::Data(v.clone()), expire_at);
                                Ok(())
                            }
                        }
                    }
                    _ => fail("unexpected-status", what.to_string()),
                }
            }
            KvOp::List { dir, .. } => {
                bump(&mut self.counts, "kv-consistency");
                let want = e.children(dir);
                match status {
                    404 if want.is_empty() => Ok(()),
                    200 => {
                        let got: BTreeSet<String> =
                            str_list(&body["data"]["keys"]).into_iter().collect();
                        if got != want {
                            return fail(
                                "kv-consistency",
                                format!("expected keys {want:?}: {what}"),
                            );
                        }
                        Ok(())
                    }
                    404 => fail("kv-consistency", format!("expected keys {want:?}: {what}")),
                    _ => fail("unexpected-status", what.to_string()),
                }
            }
        }
    }

    pub(super) fn unwrap(
        &mut self,
        h: HostId,
        secret: &str,
        at: u64,
        status: u16,
        body: &Value,
        what: &str,
    ) -> Result<(), Violation> {
        let e = &mut self.hosts[h];
        let fact = e.wraps.get(secret).cloned();
        match fact {
            Some(f) if f.valid(at) => {
                bump(&mut self.counts, "wrapping");
                if status != 200 {
                    return fail(
                        "wrapping",
                        format!("a valid wrapping token ({}) failed: {what}", f.label),
                    );
                }
                match &f.content {
                    Wrapped::Data(d) => {
                        if &body["data"] != d {
                            return fail("wrapping", format!("expected data {d}: {what}"));
                        }
                    }
                    Wrapped::Token {
                        policies,
                        ttl_s,
                        num_uses,
                        created_at,
                    } => {
                        let auth = &body["auth"];
                        let id = auth["client_token"].as_str().unwrap_or_default();
                        if id.is_empty()
                            || &str_list(&auth["policies"]) != policies
                            || auth["lease_duration"].as_u64() != Some(*ttl_s)
                        {
                            return fail(
                                "wrapping",
                                format!(
                                    "expected a token with policies {policies:?} and ttl {ttl_s}: {what}"
                                ),
                            );
                        }
                        e.tokens.insert(
                            id.to_string(),
                            TokenFact {
                                label: short(id),
                                accessor: auth["accessor"].as_str().unwrap_or_default().to_string(),
                                kind: TokenKind::Service,
                                policies: policies.clone(),
                                expire_at: Some(created_at + ttl_s * 1000),
                                revoked: false,
                                uses_left: (*num_uses > 0).then_some(*num_uses),
                            },
                        );
                    }
                }
                if let Some(w) = e.wraps.get_mut(secret) {
                    w.unwrapped = true;
                }
                if let Some(t) = e.tokens.get_mut(secret) {
                    t.revoked = true;
                }
                Ok(())
            }
            Some(f) => {
                let inv = f.dead_invariant();
                bump(&mut self.counts, inv);
                if status != 400 {
                    let why = if f.unwrapped {
                        "was unwrapped"
                    } else if f.spent {
                        "spent its one use as a client token"
                    } else {
                        "expired"
                    };
                    return fail(
                        inv,
                        format!("token {} {why}, must not unwrap: {what}", f.label),
                    );
                }
                Ok(())
            }
            None => {
                bump(&mut self.counts, "wrapping");
                if status != 400 {
                    return fail(
                        "wrapping",
                        format!("unknown wrapping token accepted: {what}"),
                    );
                }
                Ok(())
            }
        }
    }
}
