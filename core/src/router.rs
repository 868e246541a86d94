//! Authorization and dispatch of an unsealed node's API requests, decided in one place.
//!
//! [`route`] takes a request whose path is already canonical ([`routes::canonical`]),
//! splits off its namespace, finds the declared [`routes::Route`] of the path (the sys
//! table, the token table, or the table of the mount's auth method or secrets engine),
//! and from that entry alone decides: the namespace scope (root-only routes refuse every
//! namespace), the authentication class (no token, login, a credential in the body, a
//! token, a token with sudo) and the capability the token's policies must grant on the
//! path. Only then is the handler called. A path no table declares needs a token that the
//! policies allow on it before the caller learns that nothing is there (404).

use crate::api::{self, ApiError, ApiResult, Method, Reply, Request};
use crate::auth::ldap;
use crate::ctx::Ctx;
use crate::mounts::{self, MountEntry, Table};
use crate::node::NodeState;
use crate::policy;
use crate::replication;
use crate::routes::{self, Class, Endpoint, Proof, Route, Scope, Sys};
use crate::sys;
use crate::token::{self, Caller};
use crate::{kv, kv2, wrapping};
use serde_json::{json, Value};

/// What a canonical, namespace-relative path resolves to.
enum Target {
    Sys(&'static Route<Sys>),
    /// `auth/token/<rest>`.
    Token(Option<&'static Route<Endpoint>>, String),
    /// `identity/<rest>`.
    Identity(Option<&'static Route<Endpoint>>, String),
    /// A path inside a mount; `route` is `None` when the mount's type declares no route
    /// for `rest`.
    Mount {
        route: Option<&'static Route<Endpoint>>,
        mount: MountEntry,
        rest: String,
    },
    /// Nothing declares the path.
    Undeclared,
}

impl Target {
    fn class(&self) -> Class {
        match self {
            Target::Sys(r) => r.class,
            Target::Token(r, _) | Target::Identity(r, _) | Target::Mount { route: r, .. } => {
                r.map(|r| r.class).unwrap_or(routes::UNDECLARED)
            }
            Target::Undeclared => routes::UNDECLARED,
        }
    }
    fn scope(&self) -> Scope {
        match self {
            Target::Sys(r) => r.scope,
            Target::Token(Some(r), _)
            | Target::Identity(Some(r), _)
            | Target::Mount { route: Some(r), .. } => r.scope,
            _ => Scope::Namespace,
        }
    }
}

fn resolve(ctx: &Ctx, ns: &str, path: &str) -> ApiResult<Target> {
    if path == "sys" || path.starts_with("sys/") {
        return Ok(routes::lookup_sys(path)
            .map(Target::Sys)
            .unwrap_or(Target::Undeclared));
    }
    if path == "identity" || path.starts_with("identity/") {
        let op = path.strip_prefix("identity/").unwrap_or("");
        return Ok(Target::Identity(
            routes::lookup(routes::IDENTITY, op),
            op.to_string(),
        ));
    }
    if let Some(rest) = path.strip_prefix("auth/") {
        if let Some(op) = rest.strip_prefix("token/") {
            return Ok(Target::Token(
                routes::lookup(routes::TOKEN, op),
                op.to_string(),
            ));
        }
        return Ok(match mounts::resolve_in(ctx, Table::Auth, ns, rest)? {
            Some((mount, rest)) => Target::Mount {
                route: routes::mount_table(true, mount.engine())
                    .and_then(|t| routes::lookup(t, &rest)),
                mount,
                rest,
            },
            None => Target::Undeclared,
        });
    }
    Ok(match mounts::resolve_in(ctx, Table::Secrets, ns, path)? {
        Some((mount, rest)) => Target::Mount {
            route: routes::mount_table(false, mount.engine())
                .and_then(|t| routes::lookup(t, &rest)),
            mount,
            rest,
        },
        None => Target::Undeclared,
    })
}

/// The capability a request needs on its path: by method, `create` rather than `update`
/// for a write to a route with an existence check whose target does not exist, plus `sudo`
/// for sudo routes. The existence check reads storage, so it is made only when its answer
/// can change the decision: when `granted` holds exactly one of `create` and `update` (a
/// caller granted both, or neither, is decided without it).
fn needed(ctx: &Ctx, req: &Request, target: &Target, sudo: bool, granted: u8) -> ApiResult<u8> {
    let mut need = match req.method {
        Method::Get => policy::READ,
        Method::List => policy::LIST,
        Method::Delete => policy::DELETE,
        Method::Patch => policy::PATCH,
        Method::Put | Method::Post => match target {
            Target::Mount {
                route: Some(r),
                mount,
                rest,
                ..
            } if r.existence && mount.kind == "kv" => {
                let both = policy::CREATE | policy::UPDATE;
                if granted & both == both || granted & both == 0 {
                    policy::UPDATE
                } else {
                    let exists = match mount.kv_version() {
                        2 => kv2::exists(ctx, mount, rest)?,
                        _ => kv::exists(ctx, mount, rest)?,
                    };
                    if exists {
                        policy::UPDATE
                    } else {
                        policy::CREATE
                    }
                }
            }
            _ => policy::UPDATE,
        },
    };
    if sudo {
        need |= policy::SUDO;
    }
    Ok(need)
}

/// Authenticates the request's token and checks its policies for `need` on `path` in
/// namespace `ns`.
fn authorize(
    ctx: &mut Ctx,
    spend_use: &mut Option<String>,
    req: &Request,
    ns: &str,
    target: &Target,
    sudo: bool,
) -> ApiResult<Caller> {
    // A request a performance secondary forwarded carries the caller it authorized (the
    // token lives on the secondary); its policies are checked here again all the same.
    let (t, h, e) = match &req.on_behalf {
        Some(on) => (String::new(), String::new(), on.entry()),
        None => {
            let t = req
                .token
                .as_deref()
                .filter(|t| !t.is_empty())
                .ok_or(ApiError::MissingToken)?;
            let (h, e) = token::lookup(ctx, t)?.ok_or(ApiError::PermissionDenied)?;
            // A token bound to CIDR blocks is refused from any other address, as if it did
            // not exist. (A forwarded request's caller was checked where it came from.)
            if !e.usable_from(&req.remote_addr) {
                return Err(ApiError::PermissionDenied);
            }
            (t.to_string(), h, e)
        }
    };
    // A token acts in its namespace and below, with that namespace's policies, on paths
    // relative to it.
    let tns = e.namespace.as_str();
    if !ns.starts_with(tns) {
        return Err(ApiError::PermissionDenied);
    }
    if !tns.is_empty()
        && crate::namespace::get(ctx, tns)?.map(|n| n.id) != Some(e.namespace_id.clone())
    {
        return Err(ApiError::PermissionDenied);
    }
    // The entity's policies (its own and its groups') join the token's at request time, so
    // a policy given to a group later applies to tokens issued before; a disabled entity's
    // tokens are refused.
    let mut policies = e.policies.clone();
    if !e.entity_id.is_empty() {
        if let Some(s) = crate::identity::lookup::standing(ctx, &e.entity_id)? {
            if s.disabled {
                log::info!(
                    "request refused: the token's entity {} is disabled",
                    e.entity_id
                );
                return Err(ApiError::PermissionDenied);
            }
            // Never `root` from identity (refused on write; one stored before is ignored).
            policies.extend(s.policies.into_iter().filter(|p| p != "root"));
        }
    }
    let acl = sys::acl_for_in(ctx, tns, &policies)?;
    let acl_path = format!(
        "{}{}",
        &ns[tns.len()..],
        routes::acl_path(req.method, &req.path)
    );
    // A limited-use token spends a use on every request it is checked for, refused by its
    // policies or not (as the reference counts): a refusal is an answer too, and a
    // response-wrapping token tried anywhere but `sys/wrapping/*` is used up.
    if e.num_uses > 0 {
        *spend_use = Some(h.clone());
    }
    let need = needed(ctx, req, target, sudo, acl.capabilities(&acl_path))?;
    // A read of the UI mount list needs only a valid token: the handler shows the mounts
    // the token's policies reach anything under (the reference's CLI asks it before every
    // `kv` command, for tokens whose policies name only `secret/data/...`).
    let filtered =
        req.method == Method::Get && matches!(target, Target::Sys(r) if r.handler == Sys::UiMounts);
    if !filtered && !acl.allows(&acl_path, need) {
        return Err(ApiError::PermissionDenied);
    }
    let sudo = acl.allows(&acl_path, policy::SUDO);
    Ok(Caller {
        hash: h,
        id: t,
        entry: e,
        sudo,
    })
}

/// The part of the node's state the LDAP method may change.
fn ldap_io(st: &mut NodeState) -> ldap::LdapIo<'_> {
    ldap::LdapIo {
        identity_local: st.repl.is_perf_secondary(),
        logins: &mut st.logins,
        outputs: &mut st.outputs,
    }
}

/// `GET <path>?help=1`: the help of the route `path` reaches, for any valid token (it
/// describes the route, never data) used from where it may be used; 404 for a path no
/// table declares.
fn help(ctx: &mut Ctx, req: &Request, target: &Target, path: &str) -> ApiResult {
    let t = req
        .token
        .as_deref()
        .filter(|t| !t.is_empty())
        .ok_or(ApiError::MissingToken)?;
    token::lookup(ctx, t)?
        .filter(|(_, e)| e.usable_from(&req.remote_addr))
        .ok_or(ApiError::PermissionDenied)?;
    let not_found = || ApiError::NotFound(String::new());
    match target {
        Target::Sys(r) => Ok(crate::help::sys(
            path.strip_prefix("sys/").unwrap_or(path),
            r,
        )),
        Target::Token(Some(r), op) => Ok(crate::help::endpoint(op, "auth/token/", r)),
        Target::Identity(Some(r), op) => Ok(crate::help::endpoint(op, "identity/", r)),
        Target::Mount { route, mount, rest } => {
            let auth = path.starts_with("auth/");
            let prefix = format!(
                "{}{}",
                if auth { "auth/" } else { "" },
                &mount.path[mount.namespace.len()..]
            );
            match route {
                _ if rest.is_empty() => {
                    let table = routes::mount_table(auth, &mount.kind).ok_or_else(not_found)?;
                    Ok(crate::help::mount(&prefix, &mount.kind, table))
                }
                Some(r) => Ok(crate::help::endpoint(rest, &prefix, r)),
                None => Err(not_found()),
            }
        }
        Target::Token(None, _) | Target::Identity(None, _) | Target::Undeclared => Err(not_found()),
    }
}

/// Whether a primary serves `target` for a performance secondary: only the routes of
/// replicated data (KV, the LDAP method's configuration, users and groups, policies, mount
/// tables, namespaces). Tokens, logins, leases, wrapping and the cluster's own endpoints are
/// the secondary's, or the primary's alone.
fn forwardable(target: &Target) -> bool {
    match target {
        Target::Sys(r) => matches!(
            r.handler,
            Sys::Mounts | Sys::Auth | Sys::Policies | Sys::Policy | Sys::Namespaces
        ),
        Target::Mount { route: Some(r), .. } => matches!(
            r.handler,
            Endpoint::Kv
                | Endpoint::Kv2
                | Endpoint::LdapConfig
                | Endpoint::LdapGroups
                | Endpoint::LdapUsers
        ),
        // The identity store's API (a login's own entities stay on the secondary).
        Target::Identity(Some(_), _) => true,
        _ => false,
    }
}

/// Authenticates and authorizes by the declared route, then dispatches to its handler.
pub fn route(ctx: &mut Ctx, st: &mut NodeState, req: &Request) -> ApiResult {
    if req.method == Method::Get && matches!(req.query("help"), Some("1") | Some("true")) {
        let (routed, _, target) = locate(ctx, req)?;
        let req = routed.as_ref().unwrap_or(req);
        return help(ctx, req, &target, &req.path);
    }
    let (routed, target, caller) = admit(ctx, &mut st.spend_use, st.repl.is_dr_secondary(), req)?;
    let req = routed.as_ref().unwrap_or(req);
    dispatch(ctx, st, req, target, caller.as_ref())
}

/// The stored keys a request will read and then write, where the path alone tells them (a
/// KV write: the key's value, or a version 2 key's metadata; the commit reads the value it
/// replaces for the Merkle sums). A hint for a driver whose reads are round trips, so that
/// it can fetch a batch's keys at once: nothing depends on it; a path that does not
/// resolve, and a request without a stored token, give none.
pub fn prefetch_keys(ctx: &mut Ctx, req: &Request) -> Vec<String> {
    if !matches!(
        req.method,
        Method::Put | Method::Post | Method::Patch | Method::Delete
    ) {
        return Vec::new();
    }
    // Only for a caller with a stored token: no one else makes the node read (and cache)
    // keys of their choosing.
    let live = match (&req.on_behalf, req.token.as_deref()) {
        (Some(_), _) => true,
        (None, Some(t)) => matches!(token::stored(ctx, t), Ok(true)),
        _ => false,
    };
    if !live {
        return Vec::new();
    }
    let Ok(path) = routes::canonical(&req.path) else {
        return Vec::new();
    };
    match target_in(ctx, req.namespace.as_deref(), &path) {
        Ok((_, _, Target::Mount { mount, rest, .. })) if mount.kind == "kv" => {
            match mount.kv_version() {
                2 => kv2::prefetch_key(&mount, &rest),
                _ => kv::prefetch_key(&mount, &rest),
            }
            .into_iter()
            .collect()
        }
        _ => Vec::new(),
    }
}

/// Authenticates and authorizes by the declared route without running its handler: the
/// caller, if the route has one (a performance secondary forwarding the request to its
/// primary instead of serving it).
pub fn authorize_only(
    ctx: &mut Ctx,
    st: &mut NodeState,
    req: &Request,
) -> ApiResult<Option<Caller>> {
    admit(ctx, &mut st.spend_use, st.repl.is_dr_secondary(), req).map(|(_, _, caller)| caller)
}

/// A read of KV data answered from storage alone, without the node's state: `None` when
/// the request is anything else or needs the node (another method or route, `?help`, a
/// performance secondary's forward, a token whose uses are counted, a root-only route), so
/// that the node runs it. The caller checks that the handler wrote nothing
/// ([`crate::reads`]).
pub(crate) fn read_only(ctx: &mut Ctx, req: &Request) -> Option<ApiResult> {
    if !matches!(req.method, Method::Get | Method::List)
        || req.on_behalf.is_some()
        || req.query("help").is_some()
    {
        return None;
    }
    // The node's own admission, on a spent-use slot of its own: a token whose uses are
    // counted, or any refusal, goes to the node, which answers it (and spends the use).
    let mut spend_use = None;
    let (routed, target, _) = admit(ctx, &mut spend_use, false, req).ok()?;
    if spend_use.is_some() || target.scope() == Scope::Root {
        return None;
    }
    let req = routed.as_ref().unwrap_or(req);
    match &target {
        Target::Mount {
            route: Some(r),
            mount,
            rest,
        } if r.class == Class::Token => match r.handler {
            Endpoint::Kv => Some(kv::handle(ctx, req, mount, rest)),
            Endpoint::Kv2 => Some(kv2::handle(ctx, req, mount, rest)),
            _ => None,
        },
        _ => None,
    }
}

/// The request relative to its namespace (when it differs), the namespace and the target.
fn locate(ctx: &mut Ctx, req: &Request) -> ApiResult<(Option<Request>, String, Target)> {
    // The namespace (header and/or leading path segments) and the path inside it; handlers
    // see the request rewritten to that path, with `namespace` = the namespace's full path.
    let (ns, rel, target) = target_in(ctx, req.namespace.as_deref(), &req.path)?;
    let routed = if ns.is_empty() && rel == req.path && req.namespace.is_none() {
        None
    } else {
        let mut r = req.clone();
        r.path = rel;
        r.namespace = (!ns.is_empty()).then(|| ns.clone());
        Some(r)
    };
    Ok((routed, ns, target))
}

/// The namespace of a canonical `path` (with the namespace header), the path inside it, and
/// what that path resolves to.
fn target_in(ctx: &Ctx, header: Option<&str>, path: &str) -> ApiResult<(String, String, Target)> {
    let (ns, rel) = crate::namespace::resolve(ctx, header, path)?;
    let target = resolve(ctx, &ns, &rel)?;
    Ok((ns, rel, target))
}

/// The request relative to its namespace (when it differs), its target and its authorized
/// caller. A token whose uses are counted leaves its accessor in `spend_use`, for the
/// batch to spend; `dr_secondary` says whether this node is a DR secondary (whose
/// DR-operation routes want the DR operation token, not a sudo token).
fn admit(
    ctx: &mut Ctx,
    spend_use: &mut Option<String>,
    dr_secondary: bool,
    req: &Request,
) -> ApiResult<(Option<Request>, Target, Option<Caller>)> {
    let (routed, ns, target) = locate(ctx, req)?;
    let req = routed.as_ref().unwrap_or(req);
    let path = req.path.as_str();
    if req.on_behalf.is_some() && !forwardable(&target) {
        return Err(ApiError::Forbidden(format!(
            "{path} is not served for a performance secondary: a primary applies only \
             requests on replicated data (KV, LDAP configuration, users and groups, policies, \
             mounts, namespaces)"
        )));
    }
    // ... and only on mounts whose data that secondary holds: never a `local` mount of the
    // primary or one its paths filter leaves out (read through a forward, they would reach
    // a cluster that must not hold them).
    if let (Some(on), Target::Mount { mount, .. }) = (&req.on_behalf, &target) {
        crate::replication::forward::check_replicated_to(
            ctx,
            on,
            mount,
            path.starts_with("auth/"),
        )?;
    }
    if target.scope() == Scope::Root && !ns.is_empty() {
        return Err(ApiError::bad(format!(
            "{path} acts on the whole cluster and is served only in the root namespace \
             (send the request without a namespace, with a root-namespace token)"
        )));
    }
    let class = match target.class() {
        Class::DrSecondary if dr_secondary => Class::Proof(Proof::DrOperationToken),
        Class::DrSecondary => Class::Sudo,
        c => c,
    };
    let caller = match class {
        Class::Public | Class::Login | Class::Proof(_) => None,
        Class::Token => Some(authorize(ctx, spend_use, req, &ns, &target, false)?),
        Class::Sudo | Class::DrSecondary => {
            Some(authorize(ctx, spend_use, req, &ns, &target, true)?)
        }
    };
    Ok((routed, target, caller))
}

/// Runs the handler of an authorized request.
fn dispatch(
    ctx: &mut Ctx,
    st: &mut NodeState,
    req: &Request,
    target: Target,
    caller: Option<&Caller>,
) -> ApiResult {
    let path = req.path.as_str();
    match target {
        Target::Sys(r) => {
            let rest = &path["sys".len()..].trim_start_matches('/');
            let tail = rest.split_once('/').map(|(_, t)| t).unwrap_or("");
            route_sys(ctx, st, req, r.handler, rest, tail, caller)
        }
        Target::Token(Some(_), op) => {
            // Renewals of tokens from an LDAP mount re-check the directory first.
            if let Some(reply) = ldap::renew::start(ctx, &mut ldap_io(st), req, &op, caller)? {
                return Ok(reply);
            }
            token::handle(ctx, req, &op, caller)
        }
        Target::Identity(Some(_), op) => crate::identity::handle(ctx, req, &op),
        Target::Mount {
            route: Some(r),
            mount,
            rest,
            ..
        } => {
            if r.class == Class::Login {
                crate::metrics::mark_login(&mut st.obs, req.id, &mount);
            }
            match r.handler {
                Endpoint::Kv => kv::handle(ctx, req, &mount, &rest),
                Endpoint::Kv2 => kv2::handle(ctx, req, &mount, &rest),
                Endpoint::LdapConfig
                | Endpoint::LdapGroups
                | Endpoint::LdapUsers
                | Endpoint::LdapLogin => {
                    ldap::handle(ctx, &mut ldap_io(st), req, &mount, r.handler, &rest)
                }
                Endpoint::Token | Endpoint::Identity => Err(ApiError::NotFound(String::new())),
            }
        }
        Target::Token(None, _)
        | Target::Identity(None, _)
        | Target::Mount { route: None, .. }
        | Target::Undeclared => Err(ApiError::NotFound(String::new())),
    }
}

fn route_sys(
    ctx: &mut Ctx,
    st: &mut NodeState,
    req: &Request,
    handler: Sys,
    rest: &str,
    tail: &str,
    caller: Option<&Caller>,
) -> ApiResult {
    match handler {
        Sys::Seal => {
            if !req.method.is_write() {
                return Err(ApiError::MethodNotAllowed);
            }
            st.seal_requested = true;
            Ok(Reply::Empty)
        }
        Sys::Leader => match req.method {
            Method::Get => Ok(Reply::Raw(200, crate::node::standby::leader_status(st))),
            _ => Err(ApiError::MethodNotAllowed),
        },
        Sys::StepDown => crate::node::standby::step_down(st, req),
        Sys::HaStatus => crate::node::standby::ha_status(st, req),
        Sys::Mounts => mounts::handle(ctx, req, Table::Secrets, tail),
        Sys::Namespaces => crate::namespace::handle(ctx, req, tail),
        Sys::Auth => mounts::handle(ctx, req, Table::Auth, tail),
        Sys::Policies => {
            let name = tail.strip_prefix("acl").unwrap_or(tail);
            sys::policies(ctx, req, name.trim_start_matches('/'), false)
        }
        Sys::Policy => sys::policies(ctx, req, tail, true),
        Sys::Capabilities => sys::capabilities(ctx, req, rest, caller),
        Sys::DrToken => replication::dr_token::handle(
            ctx,
            &st.config.license,
            st.repl.is_dr_secondary(),
            req,
            tail,
        ),
        Sys::ReplicationStatus | Sys::Replication => {
            replication::handle(ctx, &mut replication::ReplIo::of(st), req, tail, caller)
        }
        // OpenBao's `sys/generate-root-token/` answers in the standard envelope.
        Sys::GenerateRoot if rest.starts_with("generate-root-token") => {
            match crate::generate_root::handle(ctx, &mut st.root_gen, req, tail)? {
                Reply::Raw(200, v) => Ok(Reply::Data(openbao_attempt(v))),
                other => Ok(other),
            }
        }
        Sys::GenerateRoot => crate::generate_root::handle(ctx, &mut st.root_gen, req, tail),
        Sys::Audit => crate::audit::handle(ctx, &mut st.audit, &mut st.outputs, req, tail),
        Sys::AuditHash => crate::audit::hash_handler(ctx, req, tail),
        Sys::Metrics => {
            crate::metrics::handle(ctx, &crate::metrics::MetricsView::of(st), req, tail)
        }
        Sys::LockedUsers => ldap::lockout::handle(ctx, &mut st.logins.failures, req, tail),
        Sys::License if req.method == Method::Get => Ok(Reply::Data(crate::license::status(
            &st.config.license,
            ctx.now,
        ))),
        Sys::License => Err(ApiError::MethodNotAllowed),
        Sys::Leases => crate::leases::handle(ctx, req, tail),
        Sys::KeyStatus => sys::key_status(ctx, req),
        Sys::Remount => crate::remount::handle(ctx, req, tail),
        Sys::Snapshot => crate::node::snapshot::handle(ctx, st, req, rest),
        Sys::UiMounts => {
            let sub = rest.strip_prefix("internal/ui/mounts").unwrap_or("");
            mounts::ui_mounts(ctx, req, sub, caller)
        }
        Sys::Wrapping => match (req.method, tail) {
            (Method::Post | Method::Put, "unwrap") => {
                match replication::activation::unwrap_request(ctx, req)? {
                    Some(r) => wrapping::unwrap(ctx, &r),
                    None => wrapping::unwrap(ctx, req),
                }
            }
            (Method::Post | Method::Put, "lookup") => wrapping::lookup(ctx, req),
            (Method::Post | Method::Put, "rewrap") => wrapping::rewrap(ctx, req),
            (Method::Post | Method::Put, "wrap") => {
                let body = api::body_object(&req.body)?;
                if req.wrap_ttl.is_none() {
                    return Err(ApiError::bad(
                        "wrap: the X-Vault-Wrap-TTL header is required",
                    ));
                }
                Ok(Reply::Data(Value::Object(body)))
            }
            _ => Err(ApiError::MethodNotAllowed),
        },
        // Answered by the node before the barrier is checked.
        Sys::Init | Sys::Unseal | Sys::SealStatus | Sys::Health => {
            Err(ApiError::NotFound(String::new()))
        }
    }
}

/// A root generation attempt as OpenBao's `sys/generate-root-token/attempt` shows it: `otp`
/// always (empty after the start), nonce and PGP fingerprint only once started, no encoded
/// token until there is one.
fn openbao_attempt(mut v: Value) -> Value {
    if let Value::Object(m) = &mut v {
        let started = m.get("started") == Some(&Value::Bool(true));
        m.remove("encoded_root_token");
        if m.get("encoded_token").and_then(Value::as_str) == Some("") {
            m.remove("encoded_token");
        }
        if !started {
            m.remove("nonce");
            m.remove("pgp_fingerprint");
        }
        m.entry("otp").or_insert_with(|| json!(""));
    }
    v
}

#[cfg(test)]
mod table_tests;
