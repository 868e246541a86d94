//! `auth/token/create`, `create-orphan` and `create/<role>`: what a caller may issue.
//!
//! The caller's privilege (root, or `sudo` on the path) decides `no_parent`, `period` and
//! an `id` of its choosing; without a role, asked-for policies must be the caller's (root
//! may ask for any); through a role ([`super::role`]) the role bounds policies, lifetimes,
//! type, orphan-ness and renewability. A child token acts for its parent's identity entity;
//! an orphan for none. Warnings follow the reference's: a TTL or period cut by an explicit
//! max TTL, a period or explicit max TTL given both by request and role, a policy that
//! does not exist (yet) in the token's namespace.

use super::role::{self, Role};
use super::{auth_view, create, normalize_policies, Caller, NewToken, MAX_TTL};
use crate::api::{ApiError, ApiResult, Fields, Reply, Request};
use crate::ctx::Ctx;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// The lifetimes a `create` request asks for, as the caller may have them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Lifetimes {
    pub(super) ttl: Option<u64>,
    pub(super) explicit_max_ttl: u64,
    pub(super) period: u64,
}

impl Lifetimes {
    /// Reads `ttl`, `explicit_max_ttl` and `period`. Without root or sudo (`privileged`) a
    /// periodic token is refused (400, as the reference does) and `explicit_max_ttl` over
    /// [`MAX_TTL`] is capped there; `ttl` is capped there for every caller. Each cap adds a
    /// warning. Root and sudo callers may ask for a period or explicit max up to
    /// [`crate::time::MAX_DURATION_SECS`].
    fn read(f: &Fields, privileged: bool) -> ApiResult<(Lifetimes, Vec<String>)> {
        let period = f.duration("period")?.unwrap_or(0);
        if period > 0 && !privileged {
            return Err(ApiError::bad(
                "period: root or sudo privileges required to create periodic token",
            ));
        }
        let mut warnings = Vec::new();
        let mut capped = |name: &str, v: u64, cap: bool| {
            if v > MAX_TTL && cap {
                warnings.push(format!(
                    "{name} of {v}s exceeded the effective max_ttl of {MAX_TTL}s; {name} value is capped accordingly"
                ));
                MAX_TTL
            } else {
                v
            }
        };
        // A TTL is capped for everyone ([`create`] would cap it anyway); an explicit max
        // only for callers without root or sudo.
        let ttl = f.duration("ttl")?.map(|t| capped("ttl", t, true));
        let explicit_max_ttl = capped(
            "explicit_max_ttl",
            f.duration("explicit_max_ttl")?.unwrap_or(0),
            !privileged,
        );
        Ok((
            Lifetimes {
                ttl,
                explicit_max_ttl,
                period,
            },
            warnings,
        ))
    }
}

use crate::time::short_duration as short;

/// The warning for a TTL (or period) an explicit max TTL cuts, if it does.
fn cut_warning(l: &Lifetimes) -> Option<String> {
    if l.explicit_max_ttl == 0 {
        return None;
    }
    let (name, asked) = if l.period > 0 {
        ("period", l.period)
    } else {
        (
            "TTL",
            l.ttl.filter(|t| *t > 0).unwrap_or(super::DEFAULT_TTL),
        )
    };
    (asked > l.explicit_max_ttl).then(|| {
        format!(
            "{name} of {:?} exceeded the effective max_ttl of {:?}; {name} value is capped accordingly",
            short(asked),
            short(l.explicit_max_ttl)
        )
    })
}

/// The request's `type`: `Some(true)` for batch, `None` when not named.
fn requested_type(f: &Fields) -> ApiResult<Option<bool>> {
    match f.str("type")?.as_deref() {
        None | Some("") => Ok(None),
        Some("service" | "default" | "default-service") => Ok(Some(false)),
        Some("batch" | "default-batch") => Ok(Some(true)),
        Some(t) => Err(ApiError::bad(format!("invalid 'token_type' value {t:?}"))),
    }
}

/// `POST auth/token/create[-orphan|/<role>]` (`op` is the path after `auth/token/`).
pub(super) fn create_endpoint(
    ctx: &mut Ctx,
    req: &Request,
    op: &str,
    body: &Map<String, Value>,
    caller: &Caller,
    ns: &str,
) -> ApiResult {
    let f = Fields(body);
    // As the reference: a batch token creates no tokens, and a limited-use token none
    // either (a child, or an orphan through a role, would escape its use count).
    if caller.entry.is_batch() {
        return Err(ApiError::bad("batch tokens cannot create more tokens"));
    }
    if caller.entry.num_uses > 0 {
        return Err(ApiError::bad(
            "restricted use token cannot generate child tokens",
        ));
    }
    let role: Option<Role> = match op.strip_prefix("create/") {
        Some(n) => Some(role::load(ctx, ns, n)?),
        None => None,
    };
    let root = caller.entry.is_root();
    // Root, or `sudo` on this path (the router sets it; root always has it).
    let privileged = root || caller.sudo;
    let asked = f.list("policies")?.unwrap_or_default();
    let no_default = f.bool("no_default_policy")?.unwrap_or(false)
        || role.as_ref().is_some_and(|r| r.no_default_policy);
    let bounded = match &role {
        Some(r) => r.policies(asked.clone())?,
        None => (!asked.is_empty()).then_some(asked),
    };
    // A role with allowed policies is the bound; otherwise the caller's own policies are.
    let role_bounds = role.as_ref().is_some_and(Role::bounds_policies);
    let policies: Vec<String> = match bounded {
        Some(p) => p,
        None => caller
            .entry
            .policies
            .iter()
            .filter(|p| *p != "default" || !no_default)
            .cloned()
            .collect(),
    };
    if !root && !role_bounds {
        for p in &policies {
            if p != "default" && !caller.entry.policies.contains(p) {
                // A 400, as the reference answers.
                return Err(ApiError::bad(format!(
                    "child policies must be subset of parent: {p:?} is not held by the caller"
                )));
            }
        }
    }
    let requested = requested_type(&f)?;
    let batch = match &role {
        Some(r) => r.batch(requested),
        None => requested.unwrap_or(false),
    };
    let add_default = !no_default
        && !policies.iter().any(|p| p == "root")
        && !role.as_ref().is_some_and(Role::disallows_default);
    let policies = normalize_policies(policies, add_default);
    // A role's disallowed policies bound the token's policies however they came: asked
    // for, the role's allowed ones, or (none asked, none allowed) the caller's own.
    if let Some(r) = &role {
        r.refuse_disallowed(&policies)?;
    }
    // Only a root token makes another: a role that allows `root` does not lift that (the
    // reference's rule and message).
    if !root && policies.iter().any(|p| p == "root") {
        return Err(ApiError::bad(
            "root tokens may not be created without parent token being root",
        ));
    }
    if batch {
        if f.duration("period")?.unwrap_or(0) > 0 {
            return Err(ApiError::bad("batch tokens cannot have \"period\" set"));
        }
        if f.bool("renewable")? == Some(true) {
            return Err(ApiError::bad("batch tokens cannot be renewable"));
        }
        if policies.iter().any(|p| p == "root") {
            return Err(ApiError::bad("batch tokens cannot be root tokens"));
        }
    }
    let id = f.str("id")?;
    if id.is_some() && !root {
        return Err(ApiError::Forbidden(
            "id: only root tokens may set a token id".into(),
        ));
    }
    // Through a role the role alone decides; `create-orphan` is sudo-only by its route;
    // `no_parent` on `create` needs the same privilege (the reference's answer is a 400).
    let no_parent = match &role {
        Some(r) => r.orphan,
        None => op == "create-orphan" || f.bool("no_parent")?.unwrap_or(false),
    };
    if no_parent && !privileged && role.is_none() && op != "create-orphan" {
        return Err(ApiError::bad(
            "no_parent: root or sudo privileges required to create orphan token",
        ));
    }
    let (mut lifetimes, mut warnings) = Lifetimes::read(&f, privileged)?;
    if let Some(r) = &role {
        r.bound(&mut lifetimes, &mut warnings);
    }
    if let Some(w) = cut_warning(&lifetimes) {
        warnings.push(w);
    }
    let meta: BTreeMap<String, String> = match body.get("meta") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|_| ApiError::bad("meta: expected an object of strings"))?,
    };
    let num_uses = f.int("num_uses")?.unwrap_or(0);
    if num_uses < 0 {
        return Err(ApiError::bad("num_uses: must be zero or positive"));
    }
    // A role's use limit: the lesser of it and the request's, as in the reference.
    let num_uses = match role.as_ref().map_or(0, |r| r.num_uses) {
        0 => num_uses,
        r if num_uses == 0 => r,
        r => r.min(num_uses),
    };
    let display = f.str("display_name")?.unwrap_or_default();
    let namespace = crate::namespace::of(req);
    for p in &policies {
        if p != "default"
            && p != "root"
            && crate::sys::load_policy_in(ctx, &namespace, p)?.is_none()
        {
            warnings.push(format!("Policy {p:?} does not exist"));
        }
    }
    let nt = NewToken {
        id,
        policies: policies.clone(),
        meta,
        display_name: if display.is_empty() {
            "token".into()
        } else {
            format!("token-{display}")
        },
        num_uses,
        ttl: lifetimes.ttl,
        explicit_max_ttl: lifetimes.explicit_max_ttl,
        period: lifetimes.period,
        no_parent,
        parent: Some(caller.hash.clone()),
        renewable: !batch
            && f.bool("renewable")?.unwrap_or(true)
            && role.as_ref().is_none_or(|r| r.renewable),
        kind: if batch { "batch".into() } else { String::new() },
        path: match &role {
            Some(r) => r.token_path(),
            None => "auth/token/create".into(),
        },
        role: role.as_ref().map(|r| r.name.clone()),
        // Through a role, the role's CIDR blocks (none when it has none); otherwise the
        // caller's, so a plain child of a bound token is bound alike. The reference's
        // rule, checked against OpenBao 2.6.2.
        bound_cidrs: match &role {
            Some(r) => r.bound_cidrs.clone(),
            None => caller.entry.bound_cidrs.clone(),
        },
        namespace,
        // A child token acts for its parent's entity (its identity policies follow); an
        // orphan has no parent and no entity, as in the reference.
        entity_id: if no_parent {
            String::new()
        } else {
            caller.entry.entity_id.clone()
        },
        ..Default::default()
    };
    let (id, e) = create(ctx, nt)?;
    let mut env = json!({ "auth": auth_view(ctx, &id, &e, &policies)? });
    if !warnings.is_empty() {
        env["warnings"] = json!(warnings);
    }
    Ok(Reply::Envelope(env))
}
