//! `identity/lookup/entity` and `identity/lookup/group` (by name, id, alias id, or alias
//! name with its mount accessor; nothing found is 204), and the policies an entity gives
//! its tokens at request time.

use super::{entity, group, request_ns};
use crate::api::{body_object, ApiError, ApiResult, Fields, Reply, Request};
use crate::ctx::Ctx;
use std::collections::BTreeSet;

/// What an entity means for a token at the time of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Standing {
    /// The entity is disabled: its tokens are refused.
    pub disabled: bool,
    /// The entity's own policies and those of the groups it belongs to, directly or
    /// through subgroups (sorted, unique).
    pub policies: Vec<String>,
}

/// The standing of entity `id`; `None` when it no longer exists (the token then has no
/// identity policies, as in the reference).
pub fn standing(ctx: &Ctx, id: &str) -> ApiResult<Option<Standing>> {
    let Some(e) = entity::load(ctx, id)? else {
        return Ok(None);
    };
    let mut set: BTreeSet<String> = e.policies.iter().cloned().collect();
    let direct = group::of_entity(ctx, id)?;
    let ids: Vec<String> = direct.iter().map(|g| g.id.clone()).collect();
    for g in direct {
        set.extend(g.policies);
    }
    // Nested groups: the policies of every group above a direct one apply too.
    for a in super::nesting::ancestors(ctx, &ids)? {
        if let Some(g) = group::load(ctx, &a)? {
            set.extend(g.policies);
        }
    }
    Ok(Some(Standing {
        disabled: e.disabled,
        policies: set.into_iter().collect(),
    }))
}

/// The identity policies of entity `id` (empty when there is none).
pub fn policies(ctx: &Ctx, id: &str) -> ApiResult<Vec<String>> {
    if id.is_empty() {
        return Ok(Vec::new());
    }
    Ok(standing(ctx, id)?.map(|s| s.policies).unwrap_or_default())
}

/// The criteria of a lookup body.
struct Query {
    name: Option<String>,
    id: Option<String>,
    alias_id: Option<String>,
    alias: Option<(String, String)>,
}

fn query(req: &Request) -> ApiResult<Query> {
    let body = body_object(&req.body)?;
    let f = Fields(&body);
    let s = |k: &str| -> ApiResult<Option<String>> { Ok(f.str(k)?.filter(|v| !v.is_empty())) };
    let alias = match (s("alias_name")?, s("alias_mount_accessor")?) {
        (Some(n), Some(a)) => Some((n, a)),
        (None, None) => None,
        _ => {
            return Err(ApiError::bad(
                "both 'alias_name' and 'alias_mount_accessor' should be set",
            ))
        }
    };
    let q = Query {
        name: s("name")?,
        id: s("id")?,
        alias_id: s("alias_id")?,
        alias,
    };
    let given = [
        q.name.is_some(),
        q.id.is_some(),
        q.alias_id.is_some(),
        q.alias.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    match given {
        0 => Err(ApiError::bad("query parameter not supplied")),
        1 => Ok(q),
        _ => Err(ApiError::bad(
            "query parameter conflict; please supply distinct set of query parameters",
        )),
    }
}

/// `identity/lookup/entity`.
pub fn entity(ctx: &mut Ctx, req: &Request) -> ApiResult {
    if !req.method.is_write() {
        return Err(ApiError::MethodNotAllowed);
    }
    let ns_id = request_ns(ctx, req)?;
    let q = query(req)?;
    let found = if let Some(n) = &q.name {
        entity::by_name(ctx, &ns_id, n)?
    } else if let Some(id) = &q.id {
        entity::load(ctx, id)?
    } else if let Some(a) = &q.alias_id {
        match entity::load_alias(ctx, a)? {
            Some(a) => entity::load(ctx, &a.canonical_id)?,
            None => None,
        }
    } else if let Some((n, acc)) = &q.alias {
        match entity::alias_by_key(ctx, acc, n)? {
            Some(a) => entity::load(ctx, &a.canonical_id)?,
            None => None,
        }
    } else {
        None
    };
    match found.filter(|e| e.namespace_id == ns_id) {
        Some(e) => Ok(Reply::Data(entity::view(ctx, &e)?)),
        None => Ok(Reply::Empty),
    }
}

/// `identity/lookup/group`.
pub fn group(ctx: &mut Ctx, req: &Request) -> ApiResult {
    if !req.method.is_write() {
        return Err(ApiError::MethodNotAllowed);
    }
    let ns_id = request_ns(ctx, req)?;
    let q = query(req)?;
    let found = if let Some(n) = &q.name {
        group::by_name(ctx, &ns_id, n)?
    } else if let Some(id) = &q.id {
        group::load(ctx, id)?
    } else if let Some(a) = &q.alias_id {
        match group::load_alias(ctx, a)? {
            Some(a) => group::load(ctx, &a.canonical_id)?,
            None => None,
        }
    } else if let Some((n, acc)) = &q.alias {
        match group::alias_by_key(ctx, acc, n)? {
            Some(a) => group::load(ctx, &a.canonical_id)?,
            None => None,
        }
    } else {
        None
    };
    match found.filter(|g| g.namespace_id == ns_id) {
        Some(g) => Ok(Reply::Data(group::view(ctx, &g)?)),
        None => Ok(Reply::Empty),
    }
}
