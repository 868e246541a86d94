//! The LDAP auth method: configuration, user and group mappings, and the login state
//! machine that asks the shell for LDAP operations and is advanced by their results.
//!
//! Endpoints under `auth/<mount>/`: `config` (read, write), `groups/<name>` and
//! `users/<name>` (read, write, delete, LIST on `groups`/`users`), `login/<username>`.
//! Storage under the mount's prefix `auth/<uuid>/`: `config`, `group/<name>`,
//! `user/<name>` (replicated class; values are encrypted by the barrier).
//!
//! A login answers [`Reply::Pending`]: it pushes one [`LdapCall`] with an
//! [`LdapOp::Run`] into the node's outputs (the whole [`login::Login`] machine, which the
//! executor runs to the end on a connection of its own) and keeps a [`Waiting`] in
//! [`Logins`] under the call's op id. The [`LdapReply`] goes to [`on_reply`], which
//! finishes: policies from the mappings, a token from [`crate::token::create`], the login
//! response. Failed logins count towards the user lockout ([`lockout`]); renewals of
//! tokens from an LDAP mount re-check the directory ([`renew`]).
//!
//! As in the reference, a login never yields a root token: mappings (or `token_policies`)
//! that give `root` make the login fail ("auth methods cannot create root tokens"). A
//! mapping's name is one path segment: a write of a name with `/` is refused.

pub mod ad;
#[cfg(test)]
mod ad_tests;
pub mod config;
pub mod dn;
pub mod escape;
pub mod fake;
pub mod filter;
pub mod lockout;
pub mod login;
pub mod ops;
pub mod renew;
pub mod template;

pub use ops::{
    ConnId, ConnectSpec, Deref, FailKind, LdapCall, LdapDone, LdapEntry, LdapFailure, LdapOp,
    LdapReply, OpId, Scope, SearchSpec, Secret, TlsVersion,
};

use crate::api::{body_object, ApiError, ApiResult, Fields, Method, Reply, Request, RequestId};
use crate::ctx::Ctx;
use crate::mounts::MountEntry;
use crate::node::Output;
use crate::routes::Endpoint;
use crate::token::{self, NewToken};
use config::LdapConfig;
pub use login::Found;
use login::{Job, Login};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// Most logins one node runs at once; more are refused with 429.
pub const MAX_ACTIVE_LOGINS: usize = 4096;
/// Longest group or user name accepted in a mapping path.
pub const MAX_NAME_LEN: usize = 512;

/// A request waiting for the directory.
#[derive(Clone, Debug)]
pub struct Waiting {
    pub request_id: RequestId,
    /// Set for a token renewal's re-check; `None` for a login.
    pub renew: Option<renew::Renewal>,
    /// A (stale) lock of the user was stored when the login started.
    pub lock_stored: bool,
}

/// Logins (and renewal look-ups) in progress, keyed by the op id of the call each waits
/// for, and the failure counts of the user lockout.
#[derive(Clone, Debug, Default)]
pub struct Logins {
    pub active: BTreeMap<OpId, Waiting>,
    next_op: OpId,
    next_conn: ConnId,
    pub failures: lockout::Failures,
}

impl Logins {
    fn op_id(&mut self) -> OpId {
        self.next_op += 1;
        self.next_op
    }
    fn conn_id(&mut self) -> ConnId {
        self.next_conn += 1;
        self.next_conn
    }
    /// Number of logins waiting for the directory.
    pub fn len(&self) -> usize {
        self.active.len()
    }
    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }
}

/// A group mapping.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GroupEntry {
    pub policies: Vec<String>,
}

/// A user mapping.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct UserEntry {
    pub groups: Vec<String>,
    pub policies: Vec<String>,
}

fn config_key(prefix: &str) -> String {
    format!("{prefix}config")
}

/// The stored config of a mount, if written.
pub fn load_config(ctx: &Ctx, m: &MountEntry) -> ApiResult<Option<LdapConfig>> {
    ctx.get_json(&config_key(&m.data_prefix(true)))
}

/// What the LDAP method changes besides storage: its logins in flight and lockout counters,
/// and the node's output queue (the directory calls it emits).
pub struct LdapIo<'a> {
    /// The node is a performance secondary: identity objects a login creates are
    /// cluster-local ([`crate::identity`]).
    pub identity_local: bool,
    pub logins: &'a mut Logins,
    pub outputs: &'a mut std::collections::VecDeque<Output>,
}

/// Dispatches a request under an LDAP mount; `rest` is the path inside the mount.
pub fn handle(
    ctx: &mut Ctx,
    st: &mut LdapIo<'_>,
    req: &Request,
    m: &MountEntry,
    endpoint: Endpoint,
    rest: &str,
) -> ApiResult {
    // The router matched `rest` against [`crate::routes::LDAP`]: the name, where the route
    // has one, is its single segment after the first.
    let name = rest.split_once('/').map(|(_, n)| n).unwrap_or("");
    match endpoint {
        Endpoint::LdapConfig => config_endpoint(ctx, req, m),
        Endpoint::LdapGroups => mapping(ctx, req, m, Kind::Group, name),
        Endpoint::LdapUsers => mapping(ctx, req, m, Kind::User, name),
        Endpoint::LdapLogin => login_start(ctx, st, req, m, name),
        _ => Err(ApiError::NotFound(String::new())),
    }
}

fn ignored_warning(unknown: &[String]) -> Option<Value> {
    (!unknown.is_empty()).then(|| {
        json!({
            "warnings": [format!(
                "Endpoint ignored these unrecognized parameters: [{}]",
                unknown.join(" ")
            )]
        })
    })
}

fn config_endpoint(ctx: &mut Ctx, req: &Request, m: &MountEntry) -> ApiResult {
    match req.method {
        Method::Get => {
            let c = load_config(ctx, m)?.unwrap_or_default();
            Ok(Reply::Data(c.read_view()))
        }
        Method::Put | Method::Post => {
            let body = body_object(&req.body)?;
            let mut c = load_config(ctx, m)?.unwrap_or_default();
            c.apply(&Fields(&body))?;
            c.validate()?;
            ctx.put_json(&config_key(&m.data_prefix(true)), &c)?;
            let unknown = config::unknown_fields(&body);
            Ok(match ignored_warning(&unknown) {
                Some(w) => Reply::Envelope(w),
                None => Reply::Empty,
            })
        }
        _ => Err(ApiError::MethodNotAllowed),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Group,
    User,
}

impl Kind {
    fn dir(self) -> &'static str {
        match self {
            Kind::Group => "group/",
            Kind::User => "user/",
        }
    }
}

fn mapping(ctx: &mut Ctx, req: &Request, m: &MountEntry, kind: Kind, name: &str) -> ApiResult {
    let dir = format!("{}{}", m.data_prefix(true), kind.dir());
    if name.is_empty() {
        return match req.method {
            Method::List => {
                let keys: Vec<String> = ctx
                    .keys(&dir)?
                    .into_iter()
                    .map(|k| k[dir.len()..].to_string())
                    .collect();
                if keys.is_empty() {
                    return Err(ApiError::NotFound(String::new()));
                }
                Ok(Reply::Data(json!({ "keys": keys })))
            }
            _ => Err(ApiError::MethodNotAllowed),
        };
    }
    if name.len() > MAX_NAME_LEN {
        return Err(ApiError::bad(format!(
            "name: longer than {MAX_NAME_LEN} bytes"
        )));
    }
    // Reads and deletes of such a name find nothing, or clean up one stored before this
    // rule; only writes are refused.
    if req.method.is_write() && name.contains('/') {
        return Err(ApiError::bad(format!(
            "name: {name:?} is not a single path segment; a mapping name cannot contain '/'"
        )));
    }
    let cfg = load_config(ctx, m)?.unwrap_or_default();
    let name = if cfg.case_sensitive_names {
        name.to_string()
    } else {
        name.to_lowercase()
    };
    let key = format!("{dir}{name}");
    match (req.method, kind) {
        (Method::Get, Kind::Group) => {
            let g: GroupEntry = ctx
                .get_json(&key)?
                .ok_or_else(|| ApiError::NotFound(String::new()))?;
            Ok(Reply::Data(json!({ "policies": g.policies })))
        }
        (Method::Get, Kind::User) => {
            let u: UserEntry = ctx
                .get_json(&key)?
                .ok_or_else(|| ApiError::NotFound(String::new()))?;
            Ok(Reply::Data(json!({
                "groups": u.groups.join(","),
                "policies": u.policies,
            })))
        }
        (Method::Put | Method::Post, _) => {
            let body = body_object(&req.body)?;
            let f = Fields(&body);
            let policies = config::parse_policies(f.list("policies")?.unwrap_or_default());
            let known: &[&str] = match kind {
                Kind::Group => &["policies", "name"],
                Kind::User => &["policies", "groups", "name"],
            };
            let unknown: Vec<String> = body
                .keys()
                .filter(|k| !known.contains(&k.as_str()))
                .cloned()
                .collect();
            match kind {
                Kind::Group => ctx.put_json(&key, &GroupEntry { policies })?,
                Kind::User => {
                    let mut seen = BTreeSet::new();
                    let groups: Vec<String> = f
                        .list("groups")?
                        .unwrap_or_default()
                        .into_iter()
                        .map(|g| {
                            let g = g.trim().to_string();
                            if cfg.case_sensitive_names {
                                g
                            } else {
                                g.to_lowercase()
                            }
                        })
                        .filter(|g| !g.is_empty() && seen.insert(g.clone()))
                        .collect();
                    ctx.put_json(&key, &UserEntry { groups, policies })?
                }
            }
            Ok(match ignored_warning(&unknown) {
                Some(w) => Reply::Envelope(w),
                None => Reply::Empty,
            })
        }
        (Method::Delete, _) => {
            ctx.delete(&key);
            Ok(Reply::Empty)
        }
        (Method::List | Method::Patch, _) => Err(ApiError::MethodNotAllowed),
    }
}

fn login_start(
    ctx: &mut Ctx,
    st: &mut LdapIo<'_>,
    req: &Request,
    m: &MountEntry,
    username: &str,
) -> ApiResult {
    if !req.method.is_write() {
        return Err(ApiError::MethodNotAllowed);
    }
    if username.is_empty() {
        return Err(ApiError::bad("missing username"));
    }
    if username.len() > MAX_NAME_LEN {
        return Err(ApiError::bad(format!(
            "username: longer than {MAX_NAME_LEN} bytes"
        )));
    }
    let body = body_object(&req.body)?;
    let password = Fields(&body).str("password")?.unwrap_or_default();
    let cfg = load_config(ctx, m)?.ok_or_else(|| ApiError::bad("ldap backend not configured"))?;
    if !cfg.token_bound_cidrs.is_empty()
        && !cfg
            .token_bound_cidrs
            .iter()
            .any(|c| config::cidr_contains(c, &req.remote_addr))
    {
        return Err(ApiError::PermissionDenied);
    }
    let alias = lockout::alias(&cfg, username);
    let lock = lockout::check(ctx, &st.logins.failures, &cfg, &m.accessor, &alias)?;
    if lock.locked {
        log::info!(
            "ldap login of {username:?} on auth/{} refused: the user is locked out",
            m.path
        );
        return Err(lockout::locked_error());
    }
    if cfg.deny_null_bind && password.is_empty() {
        return Err(ApiError::bad(
            "password cannot be of zero length when passwordless binds are being denied",
        ));
    }
    if st.logins.len() >= MAX_ACTIVE_LOGINS {
        return Err(ApiError::TooMany(
            "too many LDAP logins in progress; try again".into(),
        ));
    }
    let conn = st.logins.conn_id();
    let op_id = st.logins.op_id();
    let (login, first) = Login::start(
        req.id,
        m.clone(),
        cfg,
        username,
        &password,
        conn,
        &req.remote_addr,
    );
    st.outputs.push_back(Output::Ldap(LdapCall {
        op_id,
        conn,
        op: LdapOp::Run(Box::new(Job {
            login,
            first,
            outcome: None,
        })),
        close_after: true,
    }));
    st.logins.active.insert(
        op_id,
        Waiting {
            request_id: req.id,
            renew: None,
            lock_stored: lock.stored,
        },
    );
    Ok(Reply::Pending)
}

/// A login or renewal the directory's answer finished.
#[derive(Debug)]
pub struct Finished {
    pub request_id: RequestId,
    /// The request's result (its storage writes commit when it is `Ok`).
    pub result: ApiResult<Reply>,
    /// For the request's audit entry only, never the client: why the directory refused
    /// the user's bind when it said (Active Directory's `data` code), e.g. "the directory
    /// says: account disabled (AD data 533)". Never holds a password.
    pub audit_note: Option<String>,
}

/// Finishes the login or renewal waiting for `r`: `None` when nothing waits for it.
pub fn on_reply(ctx: &mut Ctx, st: &mut LdapIo<'_>, r: LdapReply) -> Option<Finished> {
    let waiting = st.logins.active.remove(&r.op_id)?;
    let failed = |result| {
        Some(Finished {
            request_id: waiting.request_id,
            result,
            audit_note: None,
        })
    };
    let job = match r.result {
        Ok(LdapDone::Ran(job)) => job,
        Ok(other) => {
            return failed(Err(ApiError::Internal(format!(
                "unexpected LDAP result {other:?} for a login"
            ))))
        }
        Err(f) => {
            return failed(Err(ApiError::bad(format!(
                "ldap operation failed: {}",
                f.message
            ))))
        }
    };
    let Job { login, outcome, .. } = *job;
    let outcome = outcome.unwrap_or_else(|| {
        Err(ApiError::Internal(
            "the LDAP executor returned a login it did not run".into(),
        ))
    });
    let result = match waiting.renew {
        Some(renewal) => renew::finish(ctx, st.identity_local, &login, outcome, renewal),
        None => login_done(ctx, st, &login, outcome, waiting.lock_stored),
    };
    let refused = match &result {
        Err(_) => true,
        Ok(Reply::Raw(status, _)) => *status >= 400,
        Ok(_) => false,
    };
    let audit_note = login
        .directory_reason
        .as_ref()
        .filter(|_| refused)
        .map(|r| format!("the directory says: {r}"));
    Some(Finished {
        request_id: waiting.request_id,
        result,
        audit_note,
    })
}

/// The answer to a login: a token, or the error; failures of the user's credentials count
/// towards the lockout, against the login name and against the name of the directory
/// entry it resolved to (when that differs). A lock of the entry's name refuses the login
/// whatever the outcome, so another name of a locked user tells nothing of the password.
fn login_done(
    ctx: &mut Ctx,
    st: &mut LdapIo<'_>,
    login: &Login,
    outcome: Result<Found, ApiError>,
    lock_stored: bool,
) -> ApiResult<Reply> {
    let cfg = &login.cfg;
    let alias = lockout::alias(cfg, &login.username);
    let accessor = &login.mount.accessor;
    // The login name was checked when the login started; the entry's name only now.
    let entry = login
        .entry_alias()
        .map(|a| lockout::alias(cfg, a))
        .filter(|a| *a != alias);
    let entry_lock = match &entry {
        Some(a) => lockout::check(ctx, &st.logins.failures, cfg, accessor, a)?,
        None => lockout::Check::default(),
    };
    if entry_lock.locked {
        log::info!(
            "ldap login of {:?} on auth/{} refused: its directory entry {:?} is locked out",
            login.username,
            login.mount.path,
            entry
        );
        return Err(lockout::locked_error());
    }
    match outcome {
        Ok(found) => {
            let failures = &mut st.logins.failures;
            lockout::succeeded(ctx, failures, accessor, &alias, lock_stored);
            if let Some(a) = &entry {
                lockout::succeeded(ctx, failures, accessor, a, entry_lock.stored);
            }
            finish_login(ctx, st.identity_local, login, found)
        }
        Err(e) => {
            match &login.directory_reason {
                Some(r) => log::warn!(
                    "ldap login of {:?} on auth/{} refused: {e}: the directory says: {r}",
                    login.username,
                    login.mount.path
                ),
                None => log::info!(
                    "ldap login of {:?} on auth/{} refused: {e}",
                    login.username,
                    login.mount.path
                ),
            }
            if login.bad_credentials {
                let failures = &mut st.logins.failures;
                let mut locked = lockout::failed(ctx, failures, cfg, accessor, &alias)?;
                if let Some(a) = &entry {
                    locked |= lockout::failed(ctx, failures, cfg, accessor, a)?;
                }
                if locked {
                    // The lock is staged in `ctx`: answer with the error as a reply so the
                    // write set commits although the login failed.
                    return Ok(Reply::Raw(e.status(), json!({ "errors": [e.to_string()] })));
                }
            }
            Err(e)
        }
    }
}

/// Policies for a login: the mapped groups' policies (LDAP groups and the user mapping's
/// groups), the user mapping's policies, and the config's `token_policies`.
pub fn login_policies(
    ctx: &Ctx,
    m: &MountEntry,
    cfg: &LdapConfig,
    username: &str,
    ldap_groups: &[String],
) -> ApiResult<(Vec<String>, Vec<String>)> {
    let prefix = m.data_prefix(true);
    let canon = |s: &str| {
        if cfg.case_sensitive_names {
            s.to_string()
        } else {
            s.to_lowercase()
        }
    };
    let user: Option<UserEntry> = ctx.get_json(&format!("{prefix}user/{}", canon(username)))?;
    let mut all_groups: Vec<String> = Vec::new();
    if let Some(u) = &user {
        all_groups.extend(u.groups.iter().cloned());
    }
    all_groups.extend(ldap_groups.iter().cloned());
    let mut policies: BTreeSet<String> = cfg.token_policies.iter().cloned().collect();
    let mut seen = BTreeSet::new();
    for g in &all_groups {
        let g = canon(g);
        if !seen.insert(g.clone()) {
            continue;
        }
        if let Some(ge) = ctx.get_json::<GroupEntry>(&format!("{prefix}group/{g}"))? {
            policies.extend(ge.policies);
        }
    }
    if let Some(u) = &user {
        policies.extend(u.policies.iter().cloned());
    }
    Ok((policies.into_iter().collect(), all_groups))
}

fn finish_login(
    ctx: &mut Ctx,
    identity_local: bool,
    login: &Login,
    found: Found,
) -> ApiResult<Reply> {
    let cfg = &login.cfg;
    let m = &login.mount;
    let (policies, all_groups) = login_policies(ctx, m, cfg, &login.username, &found.groups)?;
    if policies.iter().any(|p| p == "root") {
        log::warn!(
            "ldap login of {:?} on auth/{} refused: its mappings give the root policy",
            login.username,
            m.path
        );
        return Err(ApiError::bad("auth methods cannot create root tokens"));
    }
    let policies = token::normalize_policies(policies, !cfg.token_no_default_policy);
    // The entity of (mount, alias name), created on first login, and its external groups
    // refreshed from the user's groups.
    let ident = crate::identity::login::resolve(ctx, identity_local, m, &found.alias, &all_groups)?;
    if ident.disabled {
        log::info!(
            "ldap login of {:?} on auth/{} refused: its entity {} is disabled",
            login.username,
            m.path,
            ident.entity_id
        );
        return Err(ApiError::PermissionDenied);
    }
    let max = if cfg.token_max_ttl > 0 {
        cfg.token_max_ttl
    } else {
        m.max_lease_ttl
    };
    let mut ttl = if cfg.token_ttl > 0 {
        cfg.token_ttl
    } else if m.default_lease_ttl > 0 {
        m.default_lease_ttl
    } else {
        token::DEFAULT_TTL
    };
    if max > 0 {
        ttl = ttl.min(max);
    }
    let cap = match (cfg.token_explicit_max_ttl, max) {
        (0, x) | (x, 0) => x,
        (a, b) => a.min(b),
    };
    let mut meta = BTreeMap::new();
    meta.insert("username".to_string(), login.username.clone());
    let (id, entry) = token::create(
        ctx,
        NewToken {
            policies: policies.clone(),
            meta,
            display_name: format!("{}-{}", m.kind, login.username),
            num_uses: cfg.token_num_uses,
            ttl: Some(ttl),
            explicit_max_ttl: cap,
            period: cfg.token_period,
            no_parent: true,
            renewable: true,
            path: format!("auth/{}login/{}", m.path, login.username),
            auth_mount: Some(format!("auth/{}", m.path)),
            login_name: Some(login.username.clone()),
            no_default_policy: cfg.token_no_default_policy,
            entity_id: ident.entity_id.clone(),
            bound_cidrs: cfg.token_bound_cidrs.clone(),
            ..Default::default()
        },
    )?;
    log::debug!(
        "ldap login of {:?} on auth/{}: groups {:?}, policies {:?}",
        login.username,
        m.path,
        all_groups,
        policies
    );
    let mut auth = token::auth_block(&id, &entry, &policies);
    token::with_identity_policies(&mut auth, &ident.policies);
    let warnings = if found.warnings.is_empty() {
        Value::Null
    } else {
        json!(found.warnings)
    };
    Ok(Reply::Envelope(
        json!({ "auth": auth, "warnings": warnings }),
    ))
}

#[cfg(test)]
mod bind_tests;
#[cfg(test)]
mod lockout_tests;
#[cfg(test)]
mod renew_tests;
#[cfg(test)]
pub(crate) mod tests;
