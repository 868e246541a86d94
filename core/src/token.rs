//! The token store: service tokens stored by salted hash with accessors, TTLs, use counts,
//! parent/child revocation trees, and expiry driven by ticks; plus the `auth/token/*`
//! endpoints.
//!
//! Storage (cluster-local class): `sys/token/salt`, `sys/token/id/<hash>` (entry),
//! `sys/token/accessor/<accessor>` (hash), `sys/token/parent/<parent>/<child>`,
//! `sys/token/expiry/<ms, 20 digits>/<hash>`.
//!
//! Lifetimes follow the reference: a token's TTL is at most [`MAX_TTL`] (a periodic
//! token's is its period); `explicit_max_ttl` is a hard limit on the expiry, on creation and
//! on every renewal, periodic or not. Through `auth/token/create`, `no_parent` and `period`
//! need root or `sudo` on the path (400 otherwise, as in the reference); `ttl` is capped at
//! [`MAX_TTL`] for every caller and `explicit_max_ttl` for a caller without root or sudo,
//! each cap with a warning. Expiry arithmetic is checked: a duration that does not fit is a
//! 400 naming the field (and request durations are bounded by
//! [`crate::time::MAX_DURATION_SECS`] when parsed).
//!
//! Split: [`issue`] (the create endpoints: what a caller or a role may issue), [`role`]
//! (token roles).

use crate::api::{body_object, ApiError, ApiResult, Fields, Method, Reply, Request};
use crate::crypto;
use crate::ctx::Ctx;
use crate::time::{rfc3339, Millis};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;

pub const SALT_KEY: &str = "sys/token/salt";
const ID: &str = "sys/token/id/";
const ACCESSOR: &str = "sys/token/accessor/";
const PARENT: &str = "sys/token/parent/";
const EXPIRY: &str = "sys/token/expiry/";

/// Default and ceiling TTL of tokens (the reference's 768h).
pub const DEFAULT_TTL: u64 = 768 * 3600;
pub const MAX_TTL: u64 = 768 * 3600;
/// Most policies one token may carry.
pub const MAX_POLICIES: usize = 256;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct TokenEntry {
    pub accessor: String,
    pub policies: Vec<String>,
    pub path: String,
    pub meta: BTreeMap<String, String>,
    pub display_name: String,
    /// 0 = unlimited; counts down, the token is revoked after its last use.
    pub num_uses: i64,
    pub creation_time: Millis,
    /// Seconds; 0 = no expiry.
    pub ttl: u64,
    pub explicit_max_ttl: u64,
    pub period: u64,
    pub expire_time: Option<Millis>,
    pub orphan: bool,
    pub parent: Option<String>,
    pub renewable: bool,
    /// `service` or `wrapping`.
    #[serde(default)]
    pub kind: String,
    /// Auth mount path that issued it (`auth/ldap/`), for renewals that re-check the source.
    #[serde(default)]
    pub auth_mount: Option<String>,
    /// The login name it was issued for (auth methods), used by renewals.
    #[serde(default)]
    pub login_name: Option<String>,
    /// The namespace it was created in (`""`: root): its policies are that namespace's and
    /// it acts only there and below.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Id of that namespace (a token outlives neither its namespace nor a re-creation).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace_id: String,
    /// When it was last renewed (lookups show it, as the reference does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_renewal: Option<Millis>,
    /// The token role it was created through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// The identity entity it was issued for (logins; [`crate::identity`]): its policies
    /// and its groups' join the token's at request time.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub entity_id: String,
    /// The client addresses (CIDR blocks) it may be used from; empty: any. An auth
    /// method's `token_bound_cidrs` or a token role's; a child inherits its parent's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bound_cidrs: Vec<String>,
}

impl TokenEntry {
    pub fn is_root(&self) -> bool {
        self.policies.iter().any(|p| p == "root")
    }
    /// A batch token: not renewable, not revocable on its own, no accessor shown.
    pub fn is_batch(&self) -> bool {
        self.kind == "batch"
    }
    /// `service` or `batch`, as responses name the type.
    pub fn type_name(&self) -> &'static str {
        if self.is_batch() {
            "batch"
        } else {
            "service"
        }
    }
    /// The accessor as responses show it (a batch token has none).
    pub fn shown_accessor(&self) -> &str {
        if self.is_batch() {
            ""
        } else {
            &self.accessor
        }
    }
    /// Whether a request from `remote_addr` may use it: always without bound CIDRs, else
    /// only from an address inside one of them (an unknown address is inside none).
    pub fn usable_from(&self, remote_addr: &str) -> bool {
        self.bound_cidrs.is_empty()
            || self
                .bound_cidrs
                .iter()
                .any(|c| crate::auth::ldap::config::cidr_contains(c, remote_addr))
    }
    pub fn remaining_ttl(&self, now: Millis) -> u64 {
        match self.expire_time {
            None => 0,
            Some(e) => e.saturating_sub(now) / 1000,
        }
    }
}

/// What a caller asks for when creating a token.
#[derive(Debug, Clone, Default)]
pub struct NewToken {
    pub id: Option<String>,
    pub policies: Vec<String>,
    pub meta: BTreeMap<String, String>,
    pub display_name: String,
    pub num_uses: i64,
    pub ttl: Option<u64>,
    pub explicit_max_ttl: u64,
    pub period: u64,
    pub no_parent: bool,
    pub parent: Option<String>,
    pub renewable: bool,
    pub path: String,
    pub kind: String,
    pub auth_mount: Option<String>,
    pub login_name: Option<String>,
    pub no_default_policy: bool,
    /// Namespace to create it in (`""`: root, or the namespace of `auth_mount`).
    pub namespace: String,
    /// The token role it is created through.
    pub role: Option<String>,
    /// The identity entity of a login.
    pub entity_id: String,
    /// CIDR blocks the token may be used from (empty: anywhere).
    pub bound_cidrs: Vec<String>,
}

pub fn salt(ctx: &mut Ctx) -> ApiResult<Vec<u8>> {
    if let Some(s) = ctx.get(SALT_KEY)? {
        return Ok(s);
    }
    let s = crypto::random_key(ctx.rng()).to_vec();
    ctx.put(SALT_KEY, &s)?;
    Ok(s)
}

pub fn hash(ctx: &mut Ctx, token: &str) -> ApiResult<String> {
    let s = salt(ctx)?;
    Ok(hex::encode(crypto::hmac_sha256(&s, token.as_bytes())))
}

/// Normalises a policy list: sorted, unique, `default` added unless refused, `root` alone.
pub fn normalize_policies(mut p: Vec<String>, add_default: bool) -> Vec<String> {
    if add_default && !p.iter().any(|x| x == "root") {
        p.push("default".into());
    }
    p.sort();
    p.dedup();
    p
}

/// Milliseconds in `secs` seconds after `at`; a 400 naming `field` when it does not fit.
fn after(at: Millis, secs: u64, field: &str) -> ApiResult<Millis> {
    secs.checked_mul(1000)
        .and_then(|ms| at.checked_add(ms))
        .ok_or_else(|| ApiError::bad(format!("{field}: duration too long")))
}

/// The instant `secs` seconds after `at` as a ceiling: a sum past `u64::MAX` is no ceiling
/// at all, so it saturates (never wraps).
fn ceiling(at: Millis, secs: u64) -> Millis {
    at.saturating_add(secs.saturating_mul(1000))
}

/// Creates and stores a token; returns the secret id and the entry.
///
/// The TTL is the period for a periodic token, else `ttl` (default [`DEFAULT_TTL`]) capped
/// at [`MAX_TTL`]; either is capped by `explicit_max_ttl`. A root token asked for no TTL,
/// period or explicit max never expires. Whether the caller may ask for these is the
/// endpoint's business ([`handle`]).
pub fn create(ctx: &mut Ctx, req: NewToken) -> ApiResult<(String, TokenEntry)> {
    if req.policies.len() > MAX_POLICIES {
        return Err(ApiError::bad(format!(
            "policies: at most {MAX_POLICIES} policies per token"
        )));
    }
    // A generated id (and so its hash, accessor and expiry key) is new: 24 random base62
    // characters. A caller's id may not be.
    let generated = req.id.is_none();
    let id = match req.id {
        Some(id) => id,
        None => format!("cs.{}", crypto::base62(ctx.rng(), 24)),
    };
    let h = hash(ctx, &id)?;
    if !generated && ctx.get(&format!("{ID}{h}"))?.is_some() {
        return Err(ApiError::bad("id: a token with this id already exists"));
    }
    let accessor = crypto::base62(ctx.rng(), 24);
    let root = req.policies.iter().any(|p| p == "root");
    let ttl = if root && req.ttl.is_none() && req.period == 0 && req.explicit_max_ttl == 0 {
        0
    } else if req.period > 0 {
        req.period
    } else {
        req.ttl
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_TTL)
            .min(MAX_TTL)
    };
    let ttl = if req.explicit_max_ttl > 0 {
        ttl.min(req.explicit_max_ttl)
    } else {
        ttl
    };
    let expire_time = if ttl > 0 {
        let field = if req.period > 0 { "period" } else { "ttl" };
        Some(after(ctx.now, ttl, field)?)
    } else {
        None
    };
    // The ceiling itself must be representable too.
    if req.explicit_max_ttl > 0 {
        after(ctx.now, req.explicit_max_ttl, "explicit_max_ttl")?;
    }
    // A login on an auth mount of a namespace issues a token of that namespace.
    let mut namespace = req.namespace;
    if namespace.is_empty() {
        if let Some(a) = &req.auth_mount {
            if let Some(m) = crate::mounts::all(ctx, crate::mounts::Table::Auth)?
                .into_iter()
                .find(|m| !m.namespace.is_empty() && format!("auth/{}", m.path) == *a)
            {
                namespace = m.namespace;
            }
        }
    }
    let namespace_id = match crate::namespace::get(ctx, &namespace)? {
        Some(n) => n.id,
        None if namespace.is_empty() => String::new(),
        None => {
            return Err(ApiError::bad(format!(
                "namespace {namespace:?} does not exist"
            )))
        }
    };
    let entry = TokenEntry {
        accessor: accessor.clone(),
        policies: req.policies,
        path: req.path,
        meta: req.meta,
        display_name: req.display_name,
        num_uses: req.num_uses,
        creation_time: ctx.now,
        ttl,
        explicit_max_ttl: req.explicit_max_ttl,
        period: req.period,
        expire_time,
        orphan: req.no_parent || req.parent.is_none(),
        parent: if req.no_parent { None } else { req.parent },
        renewable: req.renewable && ttl > 0,
        kind: if req.kind.is_empty() {
            "service".into()
        } else {
            req.kind
        },
        auth_mount: req.auth_mount,
        login_name: req.login_name,
        namespace,
        namespace_id,
        last_renewal: None,
        role: req.role,
        entity_id: req.entity_id,
        bound_cidrs: req.bound_cidrs,
    };
    store(ctx, &h, &entry, None, generated)?;
    ctx.put_new(&format!("{ACCESSOR}{accessor}"), h.as_bytes())?;
    if let Some(p) = &entry.parent {
        ctx.put(&format!("{PARENT}{p}/{h}"), b"")?;
    }
    Ok((id, entry))
}

fn expiry_key(at: Millis, h: &str) -> String {
    format!("{EXPIRY}{at:020}/{h}")
}

/// Writes a token's entry and expiry index key; `new`: a token just created under a
/// generated id, whose keys cannot exist yet (written with [`Ctx::put_new`]).
fn store(
    ctx: &mut Ctx,
    h: &str,
    e: &TokenEntry,
    old_expiry: Option<Millis>,
    new: bool,
) -> ApiResult<()> {
    if let Some(o) = old_expiry {
        ctx.delete(&expiry_key(o, h));
    }
    if let Some(at) = e.expire_time {
        if new {
            ctx.put_new(&expiry_key(at, h), b"")?;
        } else {
            ctx.put(&expiry_key(at, h), b"")?;
        }
    }
    if new {
        ctx.put_json_new(&format!("{ID}{h}"), e)
    } else {
        ctx.put_json(&format!("{ID}{h}"), e)
    }
}

/// The hashes of every stored token (expired ones not yet swept included).
pub fn hashes(ctx: &Ctx) -> ApiResult<Vec<String>> {
    Ok(ctx
        .keys(ID)?
        .into_iter()
        .map(|k| k[ID.len()..].to_string())
        .collect())
}

/// Looks a token up by its secret id; expired tokens are treated as absent.
pub fn lookup(ctx: &mut Ctx, token: &str) -> ApiResult<Option<(String, TokenEntry)>> {
    if token.is_empty() || token.len() > 512 {
        return Ok(None);
    }
    let h = hash(ctx, token)?;
    Ok(lookup_hash(ctx, &h)?.map(|e| (h, e)))
}

/// Whether a token with this secret id is stored (expired or not): a cheap check that
/// neither decrypts nor parses its entry.
pub fn stored(ctx: &mut Ctx, token: &str) -> ApiResult<bool> {
    if token.is_empty() || token.len() > 512 {
        return Ok(false);
    }
    let h = hash(ctx, token)?;
    Ok(ctx.txn.get(&format!("{ID}{h}"))?.is_some())
}

pub fn lookup_hash(ctx: &Ctx, h: &str) -> ApiResult<Option<TokenEntry>> {
    let e: Option<TokenEntry> = ctx.get_json(&format!("{ID}{h}"))?;
    Ok(e.filter(|e| e.expire_time.is_none_or(|x| x > ctx.now)))
}

pub fn hash_by_accessor(ctx: &Ctx, accessor: &str) -> ApiResult<Option<String>> {
    Ok(ctx
        .get(&format!("{ACCESSOR}{accessor}"))?
        .map(|b| String::from_utf8_lossy(&b).into_owned()))
}

/// Records one use of a limited-use token; revokes it after its last use.
pub fn use_once(ctx: &mut Ctx, h: &str, e: &mut TokenEntry) -> ApiResult<()> {
    if e.num_uses <= 0 {
        return Ok(());
    }
    e.num_uses -= 1;
    if e.num_uses == 0 {
        revoke_tree(ctx, h)
    } else {
        store(ctx, h, e, e.expire_time, false)
    }
}

/// Revokes a token and, recursively, its children.
pub fn revoke_tree(ctx: &mut Ctx, h: &str) -> ApiResult<()> {
    let mut stack = vec![h.to_string()];
    let mut seen = 0usize;
    while let Some(cur) = stack.pop() {
        seen += 1;
        if seen > 1_000_000 {
            return Err(ApiError::Internal(
                "token tree too large to revoke in one step".into(),
            ));
        }
        let prefix = format!("{PARENT}{cur}/");
        for k in ctx.keys(&prefix)? {
            stack.push(k[prefix.len()..].to_string());
            ctx.delete(&k);
        }
        revoke_one(ctx, &cur)?;
    }
    Ok(())
}

/// Revokes every token of namespace `ns` and below (expired ones too) with their
/// children; returns how many tokens were named. For deleting a namespace.
pub fn revoke_namespace(ctx: &mut Ctx, ns: &str) -> ApiResult<usize> {
    let mut n = 0;
    for h in hashes(ctx)? {
        let e = ctx.get_json::<TokenEntry>(&format!("{ID}{h}"))?;
        if e.is_some_and(|e| !e.namespace.is_empty() && within(&e, ns)) {
            revoke_tree(ctx, &h)?;
            n += 1;
        }
    }
    Ok(n)
}

/// Revokes one token; its service children become orphans. Its batch children go with
/// it: a batch token lives no longer than its parent (the reference checks the parent at
/// every use), so revoking the parent is never a way to orphan one.
pub fn revoke_orphan(ctx: &mut Ctx, h: &str) -> ApiResult<()> {
    let prefix = format!("{PARENT}{h}/");
    for k in ctx.keys(&prefix)? {
        let child = k[prefix.len()..].to_string();
        if let Some(mut e) = ctx.get_json::<TokenEntry>(&format!("{ID}{child}"))? {
            if e.is_batch() {
                revoke_tree(ctx, &child)?;
                continue;
            }
            e.parent = None;
            e.orphan = true;
            ctx.put_json(&format!("{ID}{child}"), &e)?;
        }
        ctx.delete(&k);
    }
    revoke_one(ctx, h)
}

fn revoke_one(ctx: &mut Ctx, h: &str) -> ApiResult<()> {
    let key = format!("{ID}{h}");
    if let Some(e) = ctx.get_json::<TokenEntry>(&key)? {
        ctx.delete(&format!("{ACCESSOR}{}", e.accessor));
        if let Some(at) = e.expire_time {
            ctx.delete(&expiry_key(at, h));
        }
        if let Some(p) = &e.parent {
            ctx.delete(&format!("{PARENT}{p}/{h}"));
        }
        if e.kind == "wrapping" {
            ctx.delete(&format!("{}{h}", crate::wrapping::RESPONSE));
        }
    }
    ctx.delete(&key);
    Ok(())
}

/// Revokes every token whose expiry has passed (called on ticks); bounded per call.
pub fn expire(ctx: &mut Ctx, limit: usize) -> ApiResult<usize> {
    let mut n = 0;
    // Only the first keys are read: the index is in expiry order, and a sweep that reads
    // every token's entry would cost O(tokens) on every tick.
    for k in ctx.first_keys(EXPIRY, limit)? {
        if n >= limit {
            break;
        }
        let rest = &k[EXPIRY.len()..];
        let (at, h) = rest.split_once('/').unwrap_or((rest, ""));
        let at: Millis = at.parse().unwrap_or(0);
        if at > ctx.now {
            break;
        }
        ctx.delete(&k);
        revoke_tree(ctx, h)?;
        n += 1;
    }
    Ok(n)
}

/// Renews a token by `increment` seconds (or its TTL; a periodic token by its period),
/// never past `creation_time + explicit_max_ttl`, nor past `creation_time + MAX_TTL` unless
/// periodic.
pub fn renew(ctx: &mut Ctx, h: &str, e: &mut TokenEntry, increment: Option<u64>) -> ApiResult<()> {
    renew_capped(ctx, h, e, increment).map(|_| ())
}

/// [`renew`], returning the reference's warning when the increment asked for was capped.
pub fn renew_capped(
    ctx: &mut Ctx,
    h: &str,
    e: &mut TokenEntry,
    increment: Option<u64>,
) -> ApiResult<Option<String>> {
    if e.is_batch() {
        return Err(ApiError::bad("batch tokens cannot be renewed"));
    }
    if !e.renewable || e.expire_time.is_none() {
        return Err(ApiError::bad("lease is not renewable"));
    }
    let (inc, field) = if e.period > 0 {
        (e.period, "period")
    } else {
        (
            increment.filter(|i| *i > 0).unwrap_or(e.ttl).min(MAX_TTL),
            "increment",
        )
    };
    let mut new_exp = after(ctx.now, inc, field)?;
    if e.explicit_max_ttl > 0 {
        new_exp = new_exp.min(ceiling(e.creation_time, e.explicit_max_ttl));
    }
    if e.period == 0 {
        new_exp = new_exp.min(ceiling(e.creation_time, MAX_TTL));
    }
    let asked = increment.filter(|i| *i > 0 && e.period == 0);
    let old = e.expire_time;
    e.expire_time = Some(new_exp);
    e.ttl = (new_exp.saturating_sub(ctx.now)) / 1000;
    e.last_renewal = Some(ctx.now);
    store(ctx, h, e, old, false)?;
    Ok(asked.filter(|a| *a > e.ttl).map(|a| {
        format!(
            "TTL of \"{a}s\" exceeded the effective max_ttl of \"{}s\"; TTL value is capped accordingly",
            e.ttl
        )
    }))
}

/// The `auth` block of a response for a freshly created token.
pub fn auth_block(id: &str, e: &TokenEntry, token_policies: &[String]) -> Value {
    json!({
        "client_token": id,
        "accessor": e.shown_accessor(),
        "policies": e.policies,
        "token_policies": token_policies,
        "metadata": if e.meta.is_empty() { Value::Null } else { json!(e.meta) },
        "lease_duration": e.ttl,
        "renewable": e.renewable,
        "entity_id": e.entity_id,
        "token_type": e.type_name(),
        "orphan": e.orphan,
        "mfa_requirement": null,
        "num_uses": e.num_uses,
    })
}

/// The data of a token lookup.
pub fn lookup_data(e: &TokenEntry, id: Option<&str>, now: Millis) -> Value {
    let mut d = json!({
        "accessor": e.shown_accessor(),
        "creation_time": e.creation_time / 1000,
        "creation_ttl": e.ttl,
        "display_name": e.display_name,
        "entity_id": e.entity_id,
        "expire_time": e.expire_time.map(rfc3339),
        "explicit_max_ttl": e.explicit_max_ttl,
        "id": id.unwrap_or(""),
        "issue_time": rfc3339(e.creation_time),
        "meta": if e.meta.is_empty() { Value::Null } else { json!(e.meta) },
        "num_uses": e.num_uses,
        "orphan": e.orphan,
        "path": e.path,
        "policies": e.policies,
        "renewable": e.renewable,
        "ttl": e.remaining_ttl(now),
        "type": e.type_name(),
    });
    // The reference shows a period and a last renewal only when there is one (a role's
    // period is the role's: not shown on its tokens).
    if e.period > 0 && e.role.is_none() {
        d["period"] = json!(e.period);
    }
    if let Some(r) = &e.role {
        d["role"] = json!(r);
    }
    if !e.bound_cidrs.is_empty() {
        d["bound_cidrs"] = json!(e.bound_cidrs);
    }
    if let Some(at) = e.last_renewal {
        d["last_renewal"] = json!(rfc3339(at));
        d["last_renewal_time"] = json!(at / 1000);
    }
    d
}

/// [`lookup_data`] with the token's identity policies (its entity's and its groups', as
/// they are now) when it has any.
pub fn lookup_view(ctx: &Ctx, e: &TokenEntry, id: Option<&str>) -> ApiResult<Value> {
    let mut d = lookup_data(e, id, ctx.now);
    let ip = crate::identity::lookup::policies(ctx, &e.entity_id)?;
    if !ip.is_empty() {
        d["identity_policies"] = json!(ip);
        // Policies of the entity's groups in other namespaces, by namespace (Cairn's
        // groups give policies in their own namespace only).
        d["external_namespace_policies"] = json!({});
    }
    Ok(d)
}

/// [`auth_block`] with the token's identity policies as they are now (renewals).
pub fn auth_view(
    ctx: &Ctx,
    id: &str,
    e: &TokenEntry,
    token_policies: &[String],
) -> ApiResult<Value> {
    let mut auth = auth_block(id, e, token_policies);
    let ip = crate::identity::lookup::policies(ctx, &e.entity_id)?;
    with_identity_policies(&mut auth, &ip);
    Ok(auth)
}

/// Adds a login's identity policies to its `auth` block: `identity_policies`, and
/// `policies` as the union of the token's and the identity's (the reference's shape).
pub fn with_identity_policies(auth: &mut Value, identity: &[String]) {
    if identity.is_empty() {
        return;
    }
    let mut all: Vec<String> = auth["token_policies"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    all.extend(identity.iter().cloned());
    all.sort();
    all.dedup();
    auth["policies"] = json!(all);
    auth["identity_policies"] = json!(identity);
}

/// A renewal's envelope: the `auth` block and the capping warning, if any.
fn renewed(auth: Value, warning: Option<String>) -> Reply {
    let mut env = json!({ "auth": auth });
    if let Some(w) = warning {
        env["warnings"] = json!([w]);
    }
    Reply::Envelope(env)
}

/// Whether token `e` lives in namespace `ns` or below it: a caller in `ns` may look it up,
/// renew or revoke it; a token of any other namespace is treated as if it did not exist.
pub fn within(e: &TokenEntry, ns: &str) -> bool {
    e.namespace.starts_with(ns)
}

/// `lookup` restricted to the tokens of namespace `ns` and below.
pub fn lookup_in(ctx: &mut Ctx, token: &str, ns: &str) -> ApiResult<Option<(String, TokenEntry)>> {
    Ok(lookup(ctx, token)?.filter(|(_, e)| within(e, ns)))
}

/// `hash_by_accessor` restricted to the tokens of namespace `ns` and below.
pub fn hash_by_accessor_in(ctx: &Ctx, accessor: &str, ns: &str) -> ApiResult<Option<String>> {
    let Some(h) = hash_by_accessor(ctx, accessor)? else {
        return Ok(None);
    };
    Ok(match lookup_hash(ctx, &h)? {
        Some(e) if within(&e, ns) => Some(h),
        _ => None,
    })
}

/// The caller as the router resolved it.
pub struct Caller {
    pub hash: String,
    pub id: String,
    pub entry: TokenEntry,
    /// The caller's policies grant `sudo` on the request's path (always true for root).
    pub sudo: bool,
}

/// `auth/token/*`.
pub fn handle(ctx: &mut Ctx, req: &Request, rest: &str, caller: Option<&Caller>) -> ApiResult {
    let body = body_object(&req.body)?;
    let f = Fields(&body);
    let caller = caller.ok_or(ApiError::PermissionDenied)?;
    // Tokens named in the body are looked for in the request's namespace and below only.
    let ns = crate::namespace::of(req);
    match (req.method, rest) {
        (Method::List | Method::Get | Method::Post | Method::Put | Method::Delete, r)
            if r == "roles" || r.starts_with("roles/") =>
        {
            let name = r
                .strip_prefix("roles")
                .unwrap_or("")
                .trim_start_matches('/');
            role::roles(ctx, req, &f, &ns, name)
        }
        (Method::Post | Method::Put, op)
            if op == "create" || op == "create-orphan" || op.starts_with("create/") =>
        {
            issue::create_endpoint(ctx, req, op, &body, caller, &ns)
        }
        (Method::Get, "lookup-self") | (Method::Post | Method::Put, "lookup-self") => Ok(
            Reply::Data(lookup_view(ctx, &caller.entry, Some(&caller.id))?),
        ),
        (Method::Post | Method::Put | Method::Get, "lookup") => {
            let t = f
                .str("token")?
                .or_else(|| req.query("token").map(str::to_string))
                .unwrap_or_default();
            // No token named: the caller's own, as the reference answers.
            if t.is_empty() {
                return Ok(Reply::Data(lookup_view(
                    ctx,
                    &caller.entry,
                    Some(&caller.id),
                )?));
            }
            match lookup_in(ctx, &t, &ns)? {
                Some((_, e)) => Ok(Reply::Data(lookup_view(ctx, &e, Some(&t))?)),
                None => Err(ApiError::Forbidden("bad token".into())),
            }
        }
        (Method::Post | Method::Put, "lookup-accessor") => {
            let a = f.req_str("accessor")?;
            let h = hash_by_accessor_in(ctx, &a, &ns)?
                .ok_or_else(|| ApiError::bad("invalid accessor"))?;
            let e = lookup_hash(ctx, &h)?.ok_or_else(|| ApiError::bad("invalid accessor"))?;
            Ok(Reply::Data(lookup_view(ctx, &e, None)?))
        }
        (Method::Post | Method::Put, "renew-self") => {
            let mut e = caller.entry.clone();
            let w = renew_capped(ctx, &caller.hash, &mut e, f.duration("increment")?)?;
            let tp = e.policies.clone();
            Ok(renewed(auth_view(ctx, &caller.id, &e, &tp)?, w))
        }
        (Method::Post | Method::Put, "renew") => {
            let t = f.req_str("token")?;
            let (h, mut e) = lookup_in(ctx, &t, &ns)?.ok_or_else(|| ApiError::bad("bad token"))?;
            let w = renew_capped(ctx, &h, &mut e, f.duration("increment")?)?;
            let tp = e.policies.clone();
            Ok(renewed(auth_view(ctx, &t, &e, &tp)?, w))
        }
        (Method::Post | Method::Put, "renew-accessor") => {
            let a = f.req_str("accessor")?;
            let h = hash_by_accessor_in(ctx, &a, &ns)?
                .ok_or_else(|| ApiError::bad("invalid accessor"))?;
            let mut e = lookup_hash(ctx, &h)?.ok_or_else(|| ApiError::bad("invalid accessor"))?;
            // A login token's renewal re-checks its auth method (`auth/token/renew` does
            // that, see `auth::ldap::renew`); by accessor it is not offered.
            if e.auth_mount.is_some() {
                return Err(ApiError::bad(
                    "tokens from an auth method are renewed with auth/token/renew or renew-self",
                ));
            }
            let w = renew_capped(ctx, &h, &mut e, f.duration("increment")?)?;
            let tp = e.policies.clone();
            // The secret id is not shown to a caller who named the token by accessor.
            Ok(renewed(auth_view(ctx, "", &e, &tp)?, w))
        }
        (Method::Post | Method::Put, "revoke-self") => {
            revoke_tree(ctx, &caller.hash)?;
            Ok(Reply::Empty)
        }
        (Method::Post | Method::Put, "revoke") => {
            let t = f.req_str("token")?;
            if let Some((h, e)) = lookup_in(ctx, &t, &ns)? {
                if e.is_batch() {
                    return Err(ApiError::bad("batch tokens cannot be revoked"));
                }
                revoke_tree(ctx, &h)?;
            }
            Ok(Reply::Empty)
        }
        (Method::Post | Method::Put, "revoke-orphan") => {
            let t = f.req_str("token")?;
            if let Some((h, _)) = lookup_in(ctx, &t, &ns)? {
                revoke_orphan(ctx, &h)?;
            }
            Ok(Reply::Empty)
        }
        (Method::Post | Method::Put, "revoke-accessor") => {
            let a = f.req_str("accessor")?;
            match hash_by_accessor_in(ctx, &a, &ns)? {
                Some(h) => {
                    revoke_tree(ctx, &h)?;
                    Ok(Reply::Empty)
                }
                // The reference's answer: 200 with a warning.
                None => Ok(Reply::Envelope(
                    json!({ "warnings": ["No token found with this accessor"] }),
                )),
            }
        }
        (Method::List, "accessors") => {
            let mut keys = Vec::new();
            for k in ctx.keys(ACCESSOR)? {
                let a = &k[ACCESSOR.len()..];
                if hash_by_accessor_in(ctx, a, &ns)?.is_some() {
                    keys.push(a.to_string());
                }
            }
            Ok(Reply::Data(json!({ "keys": keys })))
        }
        (
            _,
            "create" | "create-orphan" | "lookup-self" | "lookup" | "lookup-accessor" | "roles"
            | "renew-self" | "renew" | "renew-accessor" | "revoke-self" | "revoke"
            | "revoke-orphan" | "revoke-accessor" | "accessors",
        ) => Err(ApiError::MethodNotAllowed),
        _ => Err(ApiError::NotFound(String::new())),
    }
}

pub mod issue;
pub mod role;

#[cfg(test)]
mod tests;
