//! The identity store: entities (one per person or machine), their aliases (the name an
//! auth mount knows them by), groups (internal, with members named by entity id; external,
//! whose members an auth method reports at login through a group alias) and the policies
//! they give a token at request time (its `identity_policies`).
//!
//! Endpoints under `identity/` (declared in [`crate::routes::IDENTITY`]): `entity`,
//! `entity/id[/<id>]`, `entity/name[/<name>]`, `entity-alias`, `entity-alias/id[/<id>]`,
//! `group`, `group/id[/<id>]`, `group/name[/<name>]`, `group-alias`,
//! `group-alias/id[/<id>]`, `lookup/entity`, `lookup/group`. Answers have the reference's
//! shapes (OpenBao 2.6): a create answers 200 with the new id, an update of an existing
//! object 204, a read of a missing one 404, a delete of a missing one 204, an empty list 404.
//!
//! Storage (values encrypted by the barrier). Two bases with the same layout:
//! - `sys/identity/` — replicated: streams to performance and DR secondaries like policies
//!   (the system subtree of the Merkle trees);
//! - `core/local-identity/` — cluster-local ([`crate::replication::class`]: `core/local-*`):
//!   the entities, aliases and external group memberships a login creates on a performance
//!   secondary, which may not write replicated data. A DR secondary of that secondary holds
//!   them too; the primary never sees them. This is the reference's rule that a perf
//!   secondary's login-created entities are local to it until forwarded, with no forwarding:
//!   every read merges both bases (an id, a name or an alias key is looked up in the
//!   replicated base first, then the local one), so a token issued on the secondary resolves
//!   its entity there. The identity API itself writes only the replicated base, so on a
//!   performance secondary it is refused like any replicated write; a DR secondary refuses
//!   client requests altogether.
//!
//! Layout under a base: `entity/<id>`, `entity-name/<namespace id>/<name lower-cased>` → id,
//! `alias/<id>`, `alias-key/<mount accessor>/<name lower-cased>` → id,
//! `entity-alias/<entity id>/<alias id>` (an entity's aliases), `group/<id>`,
//! `group-name/<namespace id>/<name lower-cased>` → id, `group-alias/<id>`,
//! `group-alias-key/<mount accessor>/<name lower-cased>` → id, and
//! `member/<entity id>/<group id>` (every membership, internal and external, so the groups of
//! a token's entity are one prefix scan at request time), and `parent/<group id>/<parent
//! id>` (nested groups: the groups naming a group among their `member_group_ids`, so a
//! group's ancestors are one scan per level, [`nesting`]). Names are matched without regard
//! to case, as the reference does by default. Ids are UUIDs from the node's seeded RNG.
//!
//! Split: [`entity`] (entities and their aliases), [`group`] (groups and group aliases),
//! [`nesting`] (subgroups, ancestors, cycle checks), [`lookup`] (the lookup endpoints and
//! the policies of an entity), [`login`] (what an auth
//! method's login does: find or create the entity and alias, refresh external groups).

pub mod entity;
pub mod group;
pub mod login;
pub mod lookup;
pub mod nesting;

use crate::api::{ApiError, ApiResult, Reply, Request};
use crate::ctx::Ctx;
use crate::mounts::{self, MountEntry, Table};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Map, Value};

/// The replicated base.
pub const REPLICATED: &str = "sys/identity/";
/// The cluster-local base (performance-secondary logins).
pub const LOCAL: &str = "core/local-identity/";
/// Both bases, in lookup order.
const BASES: [&str; 2] = [REPLICATED, LOCAL];

/// Longest entity, group or alias name accepted.
pub const MAX_NAME_LEN: usize = 512;

/// Dispatches `identity/<rest>`; the router already matched `rest` against the table.
pub fn handle(ctx: &mut Ctx, req: &Request, rest: &str) -> ApiResult {
    let segs: Vec<&str> = rest.split('/').collect();
    match segs.as_slice() {
        ["entity"] => entity::create(ctx, req),
        ["entity", by] => entity::list(ctx, req, by),
        ["entity", by, key] => entity::one(ctx, req, by, key),
        ["entity-alias"] => entity::alias_create(ctx, req),
        ["entity-alias", "id"] => entity::alias_list(ctx, req),
        ["entity-alias", "id", id] => entity::alias_one(ctx, req, id),
        ["group"] => group::create(ctx, req),
        ["group", by] => group::list(ctx, req, by),
        ["group", by, key] => group::one(ctx, req, by, key),
        ["group-alias"] => group::alias_create(ctx, req),
        ["group-alias", "id"] => group::alias_list(ctx, req),
        ["group-alias", "id", id] => group::alias_one(ctx, req, id),
        ["lookup", "entity"] => lookup::entity(ctx, req),
        ["lookup", "group"] => lookup::group(ctx, req),
        _ => Err(ApiError::NotFound(String::new())),
    }
}

/// The id of the request's namespace as identity objects record it (`root` for the root
/// namespace, as the reference names it).
pub fn namespace_id(ctx: &Ctx, ns: &str) -> ApiResult<String> {
    if ns.is_empty() {
        return Ok("root".into());
    }
    crate::namespace::get(ctx, ns)?
        .map(|n| n.id)
        .ok_or_else(|| ApiError::bad(format!("namespace {ns:?} does not exist")))
}

/// The namespace id of a request.
pub fn request_ns(ctx: &Ctx, req: &Request) -> ApiResult<String> {
    namespace_id(ctx, req.namespace.as_deref().unwrap_or(""))
}

/// A name as index keys hold it.
pub fn fold(name: &str) -> String {
    name.to_lowercase()
}

/// Reads `rel` from the replicated base, else the local one: the base it was found in and
/// the value.
pub fn get<T: DeserializeOwned>(ctx: &Ctx, rel: &str) -> ApiResult<Option<(&'static str, T)>> {
    for b in BASES {
        if let Some(v) = ctx.get_json(&format!("{b}{rel}"))? {
            return Ok(Some((b, v)));
        }
    }
    Ok(None)
}

/// Reads an index key (a stored id) from either base.
pub fn get_id(ctx: &Ctx, rel: &str) -> ApiResult<Option<String>> {
    for b in BASES {
        if let Some(v) = ctx.get(&format!("{b}{rel}"))? {
            return Ok(Some(String::from_utf8_lossy(&v).into_owned()));
        }
    }
    Ok(None)
}

/// The key suffixes under `rel` in both bases, sorted and unique.
pub fn suffixes(ctx: &Ctx, rel: &str) -> ApiResult<Vec<String>> {
    let mut out = std::collections::BTreeSet::new();
    for b in BASES {
        let p = format!("{b}{rel}");
        for k in ctx.keys(&p)? {
            out.insert(k[p.len()..].to_string());
        }
    }
    Ok(out.into_iter().collect())
}

/// Writes `value` at `rel` under `base`.
pub fn put<T: Serialize>(ctx: &mut Ctx, base: &str, rel: &str, value: &T) -> ApiResult<()> {
    ctx.put_json(&format!("{base}{rel}"), value)
}

/// Writes an index key (an id) under `base`.
pub fn put_id(ctx: &mut Ctx, base: &str, rel: &str, id: &str) -> ApiResult<()> {
    ctx.put(&format!("{base}{rel}"), id.as_bytes())
}

/// Deletes `rel` from both bases (the API's deletes; a performance secondary refuses the
/// replicated half as it refuses any replicated write).
pub fn delete(ctx: &mut Ctx, rel: &str) -> ApiResult<()> {
    for b in BASES {
        let k = format!("{b}{rel}");
        if ctx.get(&k)?.is_some() {
            ctx.delete(&k);
        }
    }
    Ok(())
}

/// The auth mount with `accessor` in namespace `ns` (its full path), if any.
pub fn auth_mount(ctx: &Ctx, ns: &str, accessor: &str) -> ApiResult<Option<MountEntry>> {
    Ok(mounts::all(ctx, Table::Auth)?
        .into_iter()
        .find(|m| m.accessor == accessor && m.namespace == ns))
}

/// A mount as aliases show it: `mount_path`, `mount_type` (empty when the mount is gone).
pub fn mount_fields(ctx: &Ctx, accessor: &str) -> ApiResult<(String, String)> {
    Ok(mounts::all(ctx, Table::Auth)?
        .into_iter()
        .find(|m| m.accessor == accessor)
        .map(|m| (format!("auth/{}", m.path), m.kind))
        .unwrap_or_default())
}

/// The `policies` of an entity or group: never `root` (in any spelling), as in the
/// reference. The router adds an entity's policies to its tokens' at every request, so a
/// `root` there would make every token of the entity a root token.
pub fn check_policies(policies: &[String]) -> ApiResult<()> {
    if policies
        .iter()
        .any(|p| p.trim().eq_ignore_ascii_case("root"))
    {
        return Err(ApiError::bad("policies cannot contain root"));
    }
    Ok(())
}

/// A name from the body or path: non-empty, bounded, one path segment.
pub fn check_name(name: &str) -> ApiResult<()> {
    if name.len() > MAX_NAME_LEN {
        return Err(ApiError::bad(format!(
            "name: longer than {MAX_NAME_LEN} bytes"
        )));
    }
    if name.contains('/') {
        return Err(ApiError::bad(format!("name: {name:?} cannot contain '/'")));
    }
    Ok(())
}

/// `metadata` from the body: a map of strings (`None`: not given).
pub fn metadata(body: &Map<String, Value>) -> ApiResult<Option<Option<Map<String, Value>>>> {
    match body.get("metadata") {
        None => Ok(None),
        Some(Value::Null) => Ok(Some(None)),
        Some(Value::Object(m)) => {
            if m.values().any(|v| !v.is_string()) {
                return Err(ApiError::bad("metadata: values must be strings"));
            }
            Ok(Some((!m.is_empty()).then(|| m.clone())))
        }
        Some(Value::String(s)) if s.is_empty() => Ok(Some(None)),
        Some(Value::Array(a)) => {
            // The reference also takes `["k=v", ...]`.
            let mut m = Map::new();
            for v in a {
                let s = v
                    .as_str()
                    .ok_or_else(|| ApiError::bad("metadata: expected a map of strings"))?;
                let (k, v) = s
                    .split_once('=')
                    .ok_or_else(|| ApiError::bad("metadata: expected key=value entries"))?;
                m.insert(k.to_string(), json!(v));
            }
            Ok(Some((!m.is_empty()).then_some(m)))
        }
        Some(_) => Err(ApiError::bad("metadata: expected a map of strings")),
    }
}

/// The key listing of a LIST: 404 when empty, as the reference answers.
pub fn keys_reply(keys: Vec<String>, key_info: Option<Map<String, Value>>) -> ApiResult {
    if keys.is_empty() {
        return Err(ApiError::NotFound(String::new()));
    }
    Ok(Reply::Data(match key_info {
        Some(info) => json!({ "keys": keys, "key_info": info }),
        None => json!({ "keys": keys }),
    }))
}

#[cfg(test)]
mod tests;
