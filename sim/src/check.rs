//! Invariant checkers.
//!
//! The driver hands the [`Checker`] every response a node releases (after its batch
//! committed), in the order the node handled the requests, together with the simulated
//! time the request was handled. The checker compares it with the [`Expected`] state,
//! updates that state, and names the invariant that broke:
//!
//! - `durability`: a value (or delete) acknowledged before a crash is read back differently
//!   after restart and unseal.
//! - `kv-consistency`: a read disagrees with acknowledged writes of the same boot, or a
//!   write reports success on an unmounted path.
//! - `denied-stays-denied`: a token whose policies do not cover a path, or a revoked,
//!   expired, unknown or missing token, got anything but 403.
//! - `authorized-succeeds`: root, or a valid token whose policy clearly grants the
//!   operation, got 403.
//! - `single-use-wrapping` / `wrapping` / `wrapping-ttl`: a wrapping token unwrapped twice
//!   (or unwrapped after its one use went to a request that presented it as a client
//!   token), a valid one failed or returned other data, an expired one worked.
//! - `sealed-503`: a sealed node answered a non-seal endpoint with anything but 503.
//! - `seal-state` / `unseal-threshold` / `init`: seal status, unseal progress and
//!   initialisation follow the key-share rules.
//! - `token-ttl` / `token-policies`: a created token reports what was asked for.
//! - `token-use-limit`: a token created with `num_uses = N` got past the token check more
//!   than N times (every request presenting it while valid spends a use, whatever its
//!   outcome: a refusal by its policies too).
//! - `no-internal-errors`: a 500 is always a bug.
//! - `tenant-isolation`: the tenant's admin token (namespace `t/`, `path "*"` with every
//!   capability and sudo there) reached outside its namespace: a [`Op::TenantProbe`] was
//!   not refused (status below 400; a sealed node's 503 is a refusal; the revoke of the
//!   root token from `t/` is a no-op that may answer 204), or its answer carries the root
//!   token's secret or a value the model holds for `secret/`. That the revoke really was a
//!   no-op is `authorized-succeeds` and `durability`: the root token must keep working.
//!   The set-up itself ([`Op::TenantSetup`], root token) is a root write like any other
//!   (`authorized-succeeds`, `token-policies` for the tenant token).
//!
//! Besides checking answers, [`Checker::inspect`] runs at every crash: it boots a
//! throwaway node on a copy of the durable storage, unseals it with the model's key shares
//! and reads every key, directory and token back (the tenant's namespace, policy and live
//! tokens included), so durability is checked at each crash whatever the traffic does
//! afterwards.
//! - `unexpected-status`: a status the model has no room for.

use crate::model::{
    decide_kv, Auth, Decision, Expected, KvEntry, KvKind, Share, TokenFact, TokenKind, WrapFact,
    Wrapped, USES_SPENT,
};
use crate::net::HostId;
use crate::operator::{
    dir_universe, key_universe, KvOp, Op, TenantReach, TenantStep, TENANT, TENANT_POLICY,
    TENANT_POLICY_TEXT,
};
use crate::storage::SimStorage;
use cairn_core::{
    AdminAnswer, AdminResult, Input, Method, Node, NodeConfig, Output, Request, Response,
};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

mod describe;
mod inspect;
mod kv;
pub use describe::str_list;
use describe::{auth_reason, body_text, caps_text, deny_category, deny_invariant, op_token};

/// Maximum token TTL in the core (768h), in seconds.
const MAX_TTL_S: u64 = 768 * 3600;

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
}

fn fail<T>(invariant: &'static str, detail: impl Into<String>) -> Result<T, Violation> {
    Err(Violation {
        invariant,
        detail: detail.into(),
    })
}

/// What a node released.
#[derive(Debug, Clone, Copy)]
pub enum Observed<'a> {
    Response(&'a Response),
    Admin(&'a AdminAnswer),
}

/// Short, stable name of a token secret for messages.
pub fn short(secret: &str) -> String {
    let n = secret.len();
    if n <= 5 {
        secret.to_string()
    } else {
        format!("…{}", &secret[n - 5..])
    }
}

pub struct Checker {
    hosts: Vec<Expected>,
    counts: BTreeMap<&'static str, u64>,
}

impl Checker {
    pub fn new(hosts: usize) -> Checker {
        Checker {
            hosts: (0..hosts).map(|_| Expected::new()).collect(),
            counts: BTreeMap::new(),
        }
    }

    pub fn expected(&self, h: HostId) -> &Expected {
        &self.hosts[h]
    }

    /// How many times each invariant was actually exercised.
    pub fn counts(&self) -> &BTreeMap<&'static str, u64> {
        &self.counts
    }

    /// Counts something the run exercised that no single check names (reads answered
    /// beside the node, whose answers the checks above judge like any other).
    pub fn note(&mut self, what: &'static str) {
        bump(&mut self.counts, what);
    }

    /// The node lost its memory (crash); it comes back sealed.
    pub fn on_crash(&mut self, h: HostId) {
        let e = &mut self.hosts[h];
        e.sealed = true;
        e.progress.clear();
    }

    pub fn on_restart(&mut self, h: HostId) {
        let e = &mut self.hosts[h];
        e.boot += 1;
        e.sealed = true;
        e.progress.clear();
    }

    /// After a commit with nothing else pending: the node's seal matches the model.
    pub fn check_seal(&mut self, h: HostId, node_sealed: bool) -> Result<(), Violation> {
        bump(&mut self.counts, "seal-state");
        let e = &self.hosts[h];
        if e.sealed != node_sealed {
            return fail(
                "seal-state",
                format!(
                    "n{h}: node reports sealed={node_sealed}, the model expects sealed={}",
                    e.sealed
                ),
            );
        }
        Ok(())
    }

    /// Checks one released output and folds it into the model.
    pub fn observe(
        &mut self,
        h: HostId,
        op: &Op,
        handled_at: u64,
        obs: Observed,
    ) -> Result<(), Violation> {
        match obs {
            Observed::Admin(v) => self.dev_setup(h, v),
            Observed::Response(r) => self.response(h, op, handled_at, r),
        }
    }

    fn dev_setup(&mut self, h: HostId, answer: &AdminAnswer) -> Result<(), Violation> {
        bump(&mut self.counts, "init");
        let e = &mut self.hosts[h];
        let keys = match answer {
            Ok(AdminResult::DevSetup(keys)) => Some(keys),
            Ok(AdminResult::Flushed) => {
                return fail(
                    "init",
                    format!("n{h}: dev set-up answered as a shutdown: {answer:?}"),
                )
            }
            Err(_) => None,
        };
        if e.initialized {
            if keys.is_some() {
                return fail(
                    "init",
                    format!("n{h}: dev set-up succeeded on an initialised node: {answer:?}"),
                );
            }
            return Ok(());
        }
        let Some(keys) = keys else {
            return fail(
                "init",
                format!("n{h}: dev set-up failed on a fresh node: {answer:?}"),
            );
        };
        if keys.root_token.is_empty() || keys.keys.len() != 1 {
            return fail(
                "init",
                format!("n{h}: dev set-up answer lacks keys or root token: {answer:?}"),
            );
        }
        e.initialized = true;
        e.sealed = false;
        e.mounted = true;
        e.threshold = 1;
        e.shares_hex = keys.keys.clone();
        e.shares_b64 = keys.keys_base64.clone();
        e.progress.clear();
        register_root(e, keys.root_token.clone());
        Ok(())
    }

    fn response(&mut self, h: HostId, op: &Op, at: u64, r: &Response) -> Result<(), Violation> {
        let status = r.status;
        let null = Value::Null;
        let body = r.body.as_ref().unwrap_or(&null);
        let what = format!("n{h}: {} -> {status} {}", op.describe(), body_text(r));
        if status == 500 {
            return fail("no-internal-errors", what);
        }
        if let Op::TenantProbe { reach, .. } = op {
            self.tenant_isolation(h, reach, r, &what)?;
        }
        // A path with a `..` segment is refused before the seal is looked at.
        let malformed = matches!(op, Op::TenantProbe { reach, .. } if reach.malformed);
        let seal_endpoint =
            malformed || matches!(op, Op::SealStatus | Op::Init { .. } | Op::Unseal { .. });
        let sealed = self.hosts[h].sealed;
        if sealed && !seal_endpoint {
            bump(&mut self.counts, "sealed-503");
            if status != 503 {
                return fail("sealed-503", format!("sealed node answered: {what}"));
            }
            return Ok(());
        }
        if !sealed && status == 503 {
            return fail(
                "seal-state",
                format!("the model expects an unsealed node: {what}"),
            );
        }
        // Whether the request presents a token the node holds as valid (as it was before
        // this answer: a revoke-self or an unwrap changes the model below).
        let spends = op_token(op)
            .filter(|s| !matches!(self.hosts[h].auth(s, at), Auth::Invalid(_)))
            .map(str::to_string);
        self.check_response(h, op, at, status, body, &what)?;
        if let Some(secret) = spends {
            self.spend_use(h, &secret);
        }
        Ok(())
    }

    /// A request presenting a valid use-limited token spends one use, whatever its outcome:
    /// a refusal by the token's policies (403) too, as in the reference (a limited token is
    /// no unlimited oracle of what its policies allow). A response-wrapping token has one
    /// use: tried as a client token anywhere (its policy allows nothing the operator asks),
    /// it is spent and unwraps no more. A request with a dead token spends nothing.
    fn spend_use(&mut self, h: HostId, secret: &str) {
        let e = &mut self.hosts[h];
        let Some(f) = e.tokens.get_mut(secret) else {
            return;
        };
        let Some(n) = f.uses_left.as_mut() else {
            return;
        };
        *n = n.saturating_sub(1);
        if *n == 0 && f.kind == TokenKind::Wrapping {
            if let Some(w) = e.wraps.get_mut(secret) {
                w.spent = true;
            }
        }
    }

    fn check_response(
        &mut self,
        h: HostId,
        op: &Op,
        at: u64,
        status: u16,
        body: &Value,
        what: &str,
    ) -> Result<(), Violation> {
        let what = what.to_string();
        match op {
            Op::SealStatus => self.seal_status(h, body, &what),
            Op::Init { shares, threshold } => {
                self.init(h, *shares, *threshold, status, body, &what)
            }
            Op::DevSetup => Ok(()),
            Op::Unseal { key } => self.unseal(h, key, status, body, &what),
            Op::Seal { tok } => self.admin_write(h, &tok.secret, at, status, &what, |e| {
                e.sealed = true;
                e.progress.clear();
            }),
            Op::Mount { tok } => {
                let mounted = self.hosts[h].mounted;
                if mounted && self.hosts[h].auth(&tok.secret, at) == Auth::Root {
                    bump(&mut self.counts, "kv-consistency");
                    if status != 400 {
                        return fail(
                            "kv-consistency",
                            format!("mount over an existing mount: {what}"),
                        );
                    }
                    return Ok(());
                }
                self.admin_write(h, &tok.secret, at, status, &what, |e| e.mounted = true)
            }
            Op::Unmount { tok } => self.admin_write(h, &tok.secret, at, status, &what, |e| {
                e.mounted = false;
                let boot = e.boot;
                for k in std::mem::take(&mut e.kv).into_keys() {
                    e.deleted.insert(k, boot);
                }
            }),
            Op::PolicyWrite {
                tok,
                name,
                spec,
                json,
            } => {
                let text = if *json { spec.json() } else { spec.hcl() };
                let (name, spec) = (name.clone(), spec.clone());
                self.admin_write(h, &tok.secret, at, status, &what, move |e| {
                    e.policies.insert(name.clone(), spec);
                    e.policy_texts.insert(name, text);
                })
            }
            Op::PolicyDelete { tok, name } => {
                let name = name.clone();
                self.admin_write(h, &tok.secret, at, status, &what, move |e| {
                    e.policies.remove(&name);
                    e.policy_texts.remove(&name);
                })
            }
            Op::TokenCreate {
                tok,
                policies,
                ttl_s,
                num_uses,
                wrap,
                ..
            } => self.token_create(
                h,
                &tok.secret,
                (policies, *ttl_s, *num_uses, wrap.as_ref().map(|w| w.1)),
                at,
                status,
                body,
                &what,
            ),
            Op::TokenRevoke {
                tok,
                target,
                accessor,
            } => {
                let target = target.secret.clone();
                let accessor = accessor.clone();
                self.admin_write(h, &tok.secret, at, status, &what, move |e| {
                    for (secret, f) in e.tokens.iter_mut() {
                        let hit = match &accessor {
                            Some(a) => &f.accessor == a,
                            None => *secret == target,
                        };
                        if hit {
                            f.revoked = true;
                        }
                    }
                })
            }
            Op::RevokeSelf { tok } => {
                let auth = self.hosts[h].auth(&tok.secret, at);
                let (allowed, use_limited) = match &auth {
                    Auth::Limited {
                        kind: TokenKind::Service,
                        use_limited,
                        ..
                    } => (true, *use_limited),
                    Auth::Root => (true, false),
                    _ => (false, false),
                };
                if !allowed {
                    let inv = deny_invariant(&auth);
                    bump(&mut self.counts, inv);
                    bump(&mut self.counts, deny_category(&auth));
                    if status != 403 {
                        return fail(inv, format!("{}: {what}", auth_reason(&auth)));
                    }
                    return Ok(());
                }
                if use_limited && status == 403 {
                    return Ok(());
                }
                bump(&mut self.counts, "authorized-succeeds");
                if status != 204 {
                    return fail(
                        "authorized-succeeds",
                        format!("a valid token cannot revoke itself: {what}"),
                    );
                }
                if let Some(f) = self.hosts[h].tokens.get_mut(&tok.secret) {
                    f.revoked = true;
                }
                Ok(())
            }
            Op::Kv { tok, op, .. } => self.kv(h, &tok.secret, op, at, status, body, &what),
            Op::Unwrap { wrap, .. } => self.unwrap(h, &wrap.secret, at, status, body, &what),
            Op::LookupSelf { tok } => {
                let auth = self.hosts[h].auth(&tok.secret, at);
                let allowed = match &auth {
                    Auth::Root => true,
                    Auth::Limited { kind, .. } => *kind == TokenKind::Service,
                    Auth::Invalid(_) => false,
                };
                if !allowed {
                    let inv = deny_invariant(&auth);
                    bump(&mut self.counts, deny_category(&auth));
                    bump(&mut self.counts, inv);
                    if status != 403 {
                        return fail(inv, format!("{}: {what}", auth_reason(&auth)));
                    }
                    return Ok(());
                }
                let use_limited = matches!(
                    auth,
                    Auth::Limited {
                        use_limited: true,
                        ..
                    }
                );
                if use_limited && status == 403 {
                    return Ok(());
                }
                bump(&mut self.counts, "authorized-succeeds");
                if status != 200 {
                    return fail(
                        "authorized-succeeds",
                        format!("a valid token cannot look itself up: {what}"),
                    );
                }
                if let Auth::Limited { policies, .. } = &auth {
                    bump(&mut self.counts, "token-policies");
                    let got = str_list(&body["data"]["policies"]);
                    if &got != policies {
                        return fail(
                            "token-policies",
                            format!("expected policies {policies:?}: {what}"),
                        );
                    }
                }
                Ok(())
            }
            Op::TenantSetup { tok, step } => match step {
                TenantStep::Namespace => self.admin_write(h, &tok.secret, at, status, &what, |e| {
                    e.tenant_namespace = true
                }),
                TenantStep::Policy => self.admin_write(h, &tok.secret, at, status, &what, |e| {
                    e.tenant_policy = true
                }),
                TenantStep::Token => self.tenant_token(h, &tok.secret, at, status, body, &what),
            },
            Op::TenantProbe { reach, .. } => {
                // Checked in [`Checker::response`]; a `..` path is refused even when sealed.
                if reach.malformed && status != 400 {
                    return fail(
                        "tenant-isolation",
                        format!("a path with a '..' segment must be refused with 400: {what}"),
                    );
                }
                Ok(())
            }
            Op::Probe { tok, .. } => {
                let auth = self.hosts[h].auth(&tok.secret, at);
                let inv = deny_invariant(&auth);
                bump(&mut self.counts, deny_category(&auth));
                bump(&mut self.counts, inv);
                if status != 403 {
                    return fail(
                        inv,
                        format!(
                            "admin endpoint reached without the policy ({}): {what}",
                            auth_reason(&auth)
                        ),
                    );
                }
                Ok(())
            }
        }
    }

    fn seal_status(&mut self, h: HostId, body: &Value, what: &str) -> Result<(), Violation> {
        bump(&mut self.counts, "seal-state");
        let e = &self.hosts[h];
        let init = body["initialized"].as_bool();
        let sealed = body["sealed"].as_bool();
        let progress = body["progress"].as_u64();
        if init != Some(e.initialized)
            || sealed != Some(e.sealed)
            || progress != Some(e.progress.len() as u64)
        {
            return fail(
                "seal-state",
                format!(
                    "expected initialized={} sealed={} progress={}: {what}",
                    e.initialized,
                    e.sealed,
                    e.progress.len()
                ),
            );
        }
        Ok(())
    }

    fn init(
        &mut self,
        h: HostId,
        shares: u8,
        threshold: u8,
        status: u16,
        body: &Value,
        what: &str,
    ) -> Result<(), Violation> {
        bump(&mut self.counts, "init");
        let e = &mut self.hosts[h];
        let valid =
            shares >= 1 && threshold >= 1 && threshold <= shares && !(shares > 1 && threshold == 1);
        if e.initialized || !valid {
            if status != 400 {
                let why = if e.initialized {
                    "already initialised"
                } else {
                    "invalid share configuration"
                };
                return fail("init", format!("{why}, expected 400: {what}"));
            }
            return Ok(());
        }
        if status != 200 {
            return fail("init", format!("valid init refused: {what}"));
        }
        let keys = str_list(&body["keys"]);
        let root = body["root_token"].as_str().unwrap_or_default().to_string();
        if keys.len() != shares as usize || root.is_empty() {
            return fail(
                "init",
                format!("expected {shares} keys and a root token: {what}"),
            );
        }
        e.initialized = true;
        e.sealed = true;
        e.threshold = threshold as usize;
        e.shares_hex = keys;
        e.shares_b64 = str_list(&body["keys_base64"]);
        e.progress.clear();
        register_root(e, root);
        Ok(())
    }

    fn unseal(
        &mut self,
        h: HostId,
        key: &str,
        status: u16,
        body: &Value,
        what: &str,
    ) -> Result<(), Violation> {
        bump(&mut self.counts, "unseal-threshold");
        let e = &mut self.hosts[h];
        let expect = |st: u16, sealed: bool, progress: usize| -> Result<(), Violation> {
            if status != st {
                return fail("unseal-threshold", format!("expected {st}: {what}"));
            }
            if st == 200
                && (body["sealed"].as_bool() != Some(sealed)
                    || body["progress"].as_u64() != Some(progress as u64))
            {
                return fail(
                    "unseal-threshold",
                    format!("expected sealed={sealed} progress={progress}: {what}"),
                );
            }
            Ok(())
        };
        if !e.initialized {
            return expect(400, true, 0);
        }
        if !e.sealed {
            return expect(200, false, 0);
        }
        let share = e.classify_share(key);
        if share == Share::Undecodable {
            return expect(400, true, e.progress.len());
        }
        if e.progress.contains(&share) {
            return expect(200, true, e.progress.len());
        }
        e.progress.push(share);
        if e.progress.len() < e.threshold {
            return expect(200, true, e.progress.len());
        }
        let all_valid = e.progress.iter().all(|s| matches!(s, Share::Valid(_)));
        e.progress.clear();
        if all_valid {
            e.sealed = false;
            expect(200, false, 0)
        } else {
            expect(400, true, 0)
        }
    }

    /// A root-only write: root must succeed (204), anyone else must get 403.
    fn admin_write(
        &mut self,
        h: HostId,
        secret: &str,
        at: u64,
        status: u16,
        what: &str,
        apply: impl FnOnce(&mut Expected),
    ) -> Result<(), Violation> {
        let auth = self.hosts[h].auth(secret, at);
        if auth != Auth::Root {
            let inv = deny_invariant(&auth);
            bump(&mut self.counts, deny_category(&auth));
            bump(&mut self.counts, inv);
            if status != 403 {
                return fail(inv, format!("{}: {what}", auth_reason(&auth)));
            }
            return Ok(());
        }
        bump(&mut self.counts, "authorized-succeeds");
        match status {
            204 | 200 => {
                apply(&mut self.hosts[h]);
                Ok(())
            }
            403 => fail("authorized-succeeds", format!("root refused: {what}")),
            _ => fail("unexpected-status", what.to_string()),
        }
    }

    /// The tenant's admin token: a root write in namespace `t`; the answer names a token
    /// with the tenant's policy.
    fn tenant_token(
        &mut self,
        h: HostId,
        secret: &str,
        at: u64,
        status: u16,
        body: &Value,
        what: &str,
    ) -> Result<(), Violation> {
        self.admin_write(h, secret, at, status, what, |_| ())?;
        if status != 200 {
            return Ok(());
        }
        let id = body["auth"]["client_token"].as_str().unwrap_or_default();
        if id.is_empty() {
            return fail("unexpected-status", format!("no client_token: {what}"));
        }
        bump(&mut self.counts, "token-policies");
        let expected = vec![TENANT_POLICY.to_string(), "default".to_string()];
        if str_list(&body["auth"]["policies"]) != expected {
            return fail(
                "token-policies",
                format!("expected policies {expected:?}: {what}"),
            );
        }
        let lease = body["auth"]["lease_duration"].as_u64().unwrap_or(0);
        let expire_at = (lease > 0).then(|| at + lease * 1000);
        self.hosts[h]
            .tenant_tokens
            .insert(id.to_string(), expire_at);
        Ok(())
    }

    /// `tenant-isolation`: the tenant's admin token reaching outside `t/` is refused, and
    /// the answer reveals neither the root token nor a stored value.
    fn tenant_isolation(
        &mut self,
        h: HostId,
        reach: &TenantReach,
        r: &Response,
        what: &str,
    ) -> Result<(), Violation> {
        bump(&mut self.counts, "tenant-isolation");
        if reach.noop {
            bump(&mut self.counts, "tenant-isolation:no-op");
        } else if r.status < 400 {
            return fail(
                "tenant-isolation",
                format!("the tenant's admin token reached outside its namespace: {what}"),
            );
        }
        let mut text = r.body.as_ref().map(Value::to_string).unwrap_or_default();
        if let Some((_, raw)) = &r.raw {
            text.push_str(&String::from_utf8_lossy(raw));
        }
        let e = &self.hosts[h];
        let root = e.root_secret();
        if !root.is_empty() && text.contains(root) {
            return fail(
                "tenant-isolation",
                format!("the answer to the tenant reveals the root token: {what}"),
            );
        }
        for (key, entry) in &e.kv {
            let mut leaves = Vec::new();
            string_leaves(&entry.value, &mut leaves);
            if let Some(leaf) = leaves.iter().find(|l| l.len() >= 4 && text.contains(*l)) {
                return fail(
                    "tenant-isolation",
                    format!("the answer to the tenant reveals {key} ({leaf:?}): {what}"),
                );
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn token_create(
        &mut self,
        h: HostId,
        secret: &str,
        (policies, ttl_s, num_uses, wrap_s): (&[String], u64, u64, Option<u64>),
        at: u64,
        status: u16,
        body: &Value,
        what: &str,
    ) -> Result<(), Violation> {
        let mut created = None;
        self.admin_write(h, secret, at, status, what, |_| ())?;
        let mut expected: Vec<String> = policies.to_vec();
        expected.push("default".into());
        expected.sort();
        expected.dedup();
        if let (200, Some(secs)) = (status, wrap_s) {
            let token = body["wrap_info"]["token"].as_str().unwrap_or_default();
            if token.is_empty() || !body["auth"].is_null() {
                return fail(
                    "wrapping",
                    format!(
                        "a wrapped token creation must carry a wrapping token and no auth: {what}"
                    ),
                );
            }
            let content = Wrapped::Token {
                policies: expected,
                ttl_s: ttl_s.min(MAX_TTL_S),
                num_uses,
                created_at: at,
            };
            register_wrap(&mut self.hosts[h], token, content, at + secs * 1000);
            return Ok(());
        }
        if status == 200 {
            let id = body["auth"]["client_token"].as_str().unwrap_or_default();
            if id.is_empty() {
                return fail("unexpected-status", format!("no client_token: {what}"));
            }
            let ttl = ttl_s.min(MAX_TTL_S);
            bump(&mut self.counts, "token-ttl");
            if body["auth"]["lease_duration"].as_u64() != Some(ttl) {
                return fail(
                    "token-ttl",
                    format!("expected lease_duration {ttl}: {what}"),
                );
            }
            bump(&mut self.counts, "token-policies");
            if str_list(&body["auth"]["policies"]) != expected {
                return fail(
                    "token-policies",
                    format!("expected policies {expected:?}: {what}"),
                );
            }
            if body["auth"]["num_uses"].as_u64() != Some(num_uses) {
                return fail(
                    "token-use-limit",
                    format!("expected num_uses {num_uses}: {what}"),
                );
            }
            created = Some((
                id.to_string(),
                TokenFact {
                    label: short(id),
                    accessor: body["auth"]["accessor"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    kind: TokenKind::Service,
                    policies: expected,
                    expire_at: Some(at + ttl * 1000),
                    revoked: false,
                    uses_left: (num_uses > 0).then_some(num_uses),
                },
            ));
        }
        if let Some((id, fact)) = created {
            self.hosts[h].tokens.insert(id, fact);
        }
        Ok(())
    }
}

/// Every string inside a JSON value.
fn string_leaves<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Array(a) => a.iter().for_each(|x| string_leaves(x, out)),
        Value::Object(o) => o.values().for_each(|x| string_leaves(x, out)),
        _ => {}
    }
}

fn bump(counts: &mut BTreeMap<&'static str, u64>, invariant: &'static str) {
    *counts.entry(invariant).or_default() += 1;
}

/// Records a wrapping token and the token entry it is.
fn register_wrap(e: &mut Expected, token: &str, content: Wrapped, expire_at: u64) {
    e.wraps.insert(
        token.to_string(),
        WrapFact {
            label: short(token),
            content,
            expire_at,
            unwrapped: false,
            spent: false,
        },
    );
    e.tokens.insert(
        token.to_string(),
        TokenFact {
            label: short(token),
            accessor: String::new(),
            kind: TokenKind::Wrapping,
            policies: vec!["response-wrapping".into()],
            expire_at: Some(expire_at),
            revoked: false,
            // The server gives a wrapping token one use: the unwrap, or a request that
            // presents it as a client token.
            uses_left: Some(1),
        },
    );
}

fn register_root(e: &mut Expected, root: String) {
    e.tokens.insert(
        root,
        TokenFact {
            label: "root".into(),
            accessor: String::new(),
            kind: TokenKind::Root,
            policies: vec!["root".into()],
            expire_at: None,
            revoked: false,
            uses_left: None,
        },
    );
}

#[cfg(test)]
mod tests;
