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
use crate::{kv, wrapping};
use serde_json::{json, Value};

/// What a canonical, namespace-relative path resolves to.
enum Target {
    Sys(&'static Route<Sys>),
    /// `auth/token/<rest>`.
    Token(Option<&'static Route<Endpoint>>, String),
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
            Target::Token(r, _) | Target::Mount { route: r, .. } => {
                r.map(|r| r.class).unwrap_or(routes::UNDECLARED)
            }
            Target::Undeclared => routes::UNDECLARED,
        }
    }
    fn scope(&self) -> Scope {
        match self {
            Target::Sys(r) => r.scope,
            Target::Token(Some(r), _) | Target::Mount { route: Some(r), .. } => r.scope,
            _ => Scope::Namespace,
        }
    }
}

fn resolve(ctx: &Ctx, ns: &str, path: &str) -> ApiResult<Target> {
    if path == "sys" || path.starts_with("sys/") {
        return Ok(routes::lookup(routes::SYS, path)
            .map(Target::Sys)
            .unwrap_or(Target::Undeclared));
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
                route: routes::mount_table(true, &mount.kind)
                    .and_then(|t| routes::lookup(t, &rest)),
                mount,
                rest,
            },
            None => Target::Undeclared,
        });
    }
    Ok(match mounts::resolve_in(ctx, Table::Secrets, ns, path)? {
        Some((mount, rest)) => Target::Mount {
            route: routes::mount_table(false, &mount.kind).and_then(|t| routes::lookup(t, &rest)),
            mount,
            rest,
        },
        None => Target::Undeclared,
    })
}

/// The capability a request needs on its path: by method, `create` rather than `update`
/// for a write to a route with an existence check whose target does not exist, plus `sudo`
/// for sudo routes.
fn needed(ctx: &Ctx, req: &Request, target: &Target, sudo: bool) -> ApiResult<u8> {
    let mut need = match req.method {
        Method::Get => policy::READ,
        Method::List => policy::LIST,
        Method::Delete => policy::DELETE,
        Method::Put | Method::Post => match target {
            Target::Mount {
                route: Some(r),
                mount,
                rest,
                ..
            } if r.existence && mount.kind == "kv" => {
                if kv::exists(ctx, mount, rest)? {
                    policy::UPDATE
                } else {
                    policy::CREATE
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
    st: &mut NodeState,
    req: &Request,
    ns: &str,
    target: &Target,
    sudo: bool,
) -> ApiResult<Caller> {
    let t = req
        .token
        .as_deref()
        .filter(|t| !t.is_empty())
        .ok_or(ApiError::MissingToken)?;
    let (h, e) = token::lookup(ctx, t)?.ok_or(ApiError::PermissionDenied)?;
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
    let acl = sys::acl_for_in(ctx, tns, &e.policies)?;
    let need = needed(ctx, req, target, sudo)?;
    let acl_path = format!(
        "{}{}",
        &ns[tns.len()..],
        routes::acl_path(req.method, &req.path)
    );
    if !acl.allows(&acl_path, need) {
        return Err(ApiError::PermissionDenied);
    }
    if e.num_uses > 0 {
        st.spend_use = Some(h.clone());
    }
    let sudo = acl.allows(&acl_path, policy::SUDO);
    Ok(Caller {
        hash: h,
        id: t.to_string(),
        entry: e,
        sudo,
    })
}

/// Authenticates and authorizes by the declared route, then dispatches to its handler.
pub fn route(ctx: &mut Ctx, st: &mut NodeState, req: &Request) -> ApiResult {
    // The namespace (header and/or leading path segments) and the path inside it; handlers
    // see the request rewritten to that path, with `namespace` = the namespace's full path.
    let (ns, rel) = crate::namespace::resolve(ctx, req.namespace.as_deref(), &req.path)?;
    let routed;
    let req = if ns.is_empty() && rel == req.path && req.namespace.is_none() {
        req
    } else {
        let mut r = req.clone();
        r.path = rel;
        r.namespace = (!ns.is_empty()).then(|| ns.clone());
        routed = r;
        &routed
    };
    let path = req.path.as_str();
    let target = resolve(ctx, &ns, path)?;
    if target.scope() == Scope::Root && !ns.is_empty() {
        return Err(ApiError::bad(format!(
            "{path} acts on the whole cluster and is served only in the root namespace \
             (send the request without a namespace, with a root-namespace token)"
        )));
    }
    let class = match target.class() {
        Class::DrSecondary if st.repl.is_dr_secondary() => Class::Proof(Proof::DrOperationToken),
        Class::DrSecondary => Class::Sudo,
        c => c,
    };
    let caller = match class {
        Class::Public | Class::Login | Class::Proof(_) => None,
        Class::Token => Some(authorize(ctx, st, req, &ns, &target, false)?),
        Class::Sudo | Class::DrSecondary => Some(authorize(ctx, st, req, &ns, &target, true)?),
    };
    let caller = caller.as_ref();
    match target {
        Target::Sys(r) => {
            let rest = &path["sys".len()..].trim_start_matches('/');
            let tail = rest.split_once('/').map(|(_, t)| t).unwrap_or("");
            route_sys(ctx, st, req, r.handler, rest, tail, caller)
        }
        Target::Token(Some(_), op) => {
            // Renewals of tokens from an LDAP mount re-check the directory first.
            if let Some(reply) = ldap::renew::start(ctx, st, req, &op, caller)? {
                return Ok(reply);
            }
            token::handle(ctx, req, &op, caller)
        }
        Target::Mount {
            route: Some(r),
            mount,
            rest,
            ..
        } => {
            if r.class == Class::Login {
                crate::metrics::mark_login(st, req.id, &mount);
            }
            match r.handler {
                Endpoint::Kv => kv::handle(ctx, req, &mount, &rest),
                Endpoint::LdapConfig
                | Endpoint::LdapGroups
                | Endpoint::LdapUsers
                | Endpoint::LdapLogin => ldap::handle(ctx, st, req, &mount, r.handler, &rest),
                Endpoint::Token => Err(ApiError::NotFound(String::new())),
            }
        }
        Target::Token(None, _) | Target::Mount { route: None, .. } | Target::Undeclared => {
            Err(ApiError::NotFound(String::new()))
        }
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
            Method::Get => Ok(Reply::Raw(
                200,
                json!({
                    "ha_enabled": false,
                    "is_self": true,
                    "active_time": "0001-01-01T00:00:00Z",
                    "leader_address": "",
                    "leader_cluster_address": "",
                    "performance_standby": false,
                    "performance_standby_last_remote_wal": 0,
                }),
            )),
            _ => Err(ApiError::MethodNotAllowed),
        },
        Sys::Mounts => mounts::handle(ctx, req, Table::Secrets, tail),
        Sys::Namespaces => crate::namespace::handle(ctx, req, tail),
        Sys::Auth => mounts::handle(ctx, req, Table::Auth, tail),
        Sys::Policies => {
            let name = tail.strip_prefix("acl").unwrap_or(tail);
            sys::policies(ctx, req, name.trim_start_matches('/'), false)
        }
        Sys::Policy => sys::policies(ctx, req, tail, true),
        Sys::Capabilities => sys::capabilities(ctx, req, rest, caller),
        Sys::DrToken => replication::dr_token::handle(ctx, st, req, tail),
        Sys::ReplicationStatus | Sys::Replication => {
            replication::handle(ctx, st, req, tail, caller)
        }
        Sys::GenerateRoot => replication::generate_root::handle(ctx, st, req, tail),
        Sys::Audit => crate::audit::handle(ctx, st, req, tail),
        Sys::AuditHash => crate::audit::hash_handler(ctx, req, tail),
        Sys::Metrics => crate::metrics::handle(ctx, st, req, tail),
        Sys::LockedUsers => ldap::lockout::handle(ctx, &mut st.logins.failures, req, tail),
        Sys::License if req.method == Method::Get => Ok(Reply::Data(crate::license::status(
            &st.config.license,
            ctx.now,
        ))),
        Sys::License => Err(ApiError::MethodNotAllowed),
        Sys::Wrapping => match (req.method, tail) {
            (Method::Post | Method::Put, "unwrap") => {
                match replication::activation::unwrap_request(ctx, req)? {
                    Some(r) => wrapping::unwrap(ctx, &r),
                    None => wrapping::unwrap(ctx, req),
                }
            }
            (Method::Post | Method::Put, "lookup") => wrapping::lookup(ctx, req),
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
