//! Entities and entity aliases: the records, their views, and the `identity/entity*` and
//! `identity/entity-alias*` endpoints.

use super::{
    check_name, delete, fold, get, get_id, keys_reply, metadata, mount_fields, put, put_id,
    request_ns, suffixes, REPLICATED,
};
use crate::api::{body_object, ApiError, ApiResult, Fields, Method, Reply, Request};
use crate::crypto;
use crate::ctx::Ctx;
use crate::time::{rfc3339, Millis};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// One entity.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Entity {
    pub id: String,
    pub name: String,
    pub namespace_id: String,
    pub policies: Vec<String>,
    pub metadata: Option<Map<String, Value>>,
    pub disabled: bool,
    pub creation_time: Millis,
    pub last_update_time: Millis,
}

/// One entity alias: the name an auth mount (by accessor) knows an entity by.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Alias {
    pub id: String,
    pub name: String,
    pub canonical_id: String,
    pub mount_accessor: String,
    pub namespace_id: String,
    pub creation_time: Millis,
    pub last_update_time: Millis,
    /// Created on a performance secondary (stored in the cluster-local base).
    pub local: bool,
}

pub fn entity_key(id: &str) -> String {
    format!("entity/{id}")
}
pub fn name_key(ns_id: &str, name: &str) -> String {
    format!("entity-name/{ns_id}/{}", fold(name))
}
pub fn alias_key(id: &str) -> String {
    format!("alias/{id}")
}
pub fn alias_index(accessor: &str, name: &str) -> String {
    format!("alias-key/{accessor}/{}", fold(name))
}
pub fn entity_alias_index(entity: &str, alias: &str) -> String {
    format!("entity-alias/{entity}/{alias}")
}
pub fn member_prefix(entity: &str) -> String {
    format!("member/{entity}/")
}

/// The entity with `id` (either base).
pub fn load(ctx: &Ctx, id: &str) -> ApiResult<Option<Entity>> {
    if id.is_empty() || id.contains('/') {
        return Ok(None);
    }
    Ok(get::<Entity>(ctx, &entity_key(id))?.map(|(_, e)| e))
}

/// The entity named `name` in namespace `ns_id`.
pub fn by_name(ctx: &Ctx, ns_id: &str, name: &str) -> ApiResult<Option<Entity>> {
    match get_id(ctx, &name_key(ns_id, name))? {
        Some(id) => load(ctx, &id),
        None => Ok(None),
    }
}

/// The alias with `id`.
pub fn load_alias(ctx: &Ctx, id: &str) -> ApiResult<Option<Alias>> {
    if id.is_empty() || id.contains('/') {
        return Ok(None);
    }
    Ok(get::<Alias>(ctx, &alias_key(id))?.map(|(_, a)| a))
}

/// The alias named `name` on the mount with `accessor`.
pub fn alias_by_key(ctx: &Ctx, accessor: &str, name: &str) -> ApiResult<Option<Alias>> {
    match get_id(ctx, &alias_index(accessor, name))? {
        Some(id) => load_alias(ctx, &id),
        None => Ok(None),
    }
}

/// The aliases of entity `id`.
pub fn aliases_of(ctx: &Ctx, id: &str) -> ApiResult<Vec<Alias>> {
    let mut out = Vec::new();
    for a in suffixes(ctx, &format!("entity-alias/{id}/"))? {
        if let Some(a) = load_alias(ctx, &a)? {
            out.push(a);
        }
    }
    Ok(out)
}

/// The ids of the groups entity `id` is a direct member of.
pub fn group_ids(ctx: &Ctx, id: &str) -> ApiResult<Vec<String>> {
    suffixes(ctx, &member_prefix(id))
}

/// Writes an entity and its name index under `base`.
pub fn store(ctx: &mut Ctx, base: &str, e: &Entity) -> ApiResult<()> {
    put(ctx, base, &entity_key(&e.id), e)?;
    put_id(ctx, base, &name_key(&e.namespace_id, &e.name), &e.id)
}

/// Writes an alias and its indexes under `base`.
pub fn store_alias(ctx: &mut Ctx, base: &str, a: &Alias) -> ApiResult<()> {
    put(ctx, base, &alias_key(&a.id), a)?;
    put_id(ctx, base, &alias_index(&a.mount_accessor, &a.name), &a.id)?;
    put_id(
        ctx,
        base,
        &entity_alias_index(&a.canonical_id, &a.id),
        &a.id,
    )
}

/// A new entity named `name` (`entity_<8 hex>` when empty, as the reference names them).
pub fn new_entity(ctx: &mut Ctx, ns_id: &str, name: &str) -> Entity {
    let id = crypto::uuid(ctx.rng());
    let name = if name.is_empty() {
        let tag = crypto::uuid(ctx.rng());
        format!("entity_{}", &tag[..8])
    } else {
        name.to_string()
    };
    Entity {
        id,
        name,
        namespace_id: ns_id.to_string(),
        creation_time: ctx.now,
        last_update_time: ctx.now,
        ..Default::default()
    }
}

/// An alias as the reference shows it (inside an entity, in a read, in a listing's info).
pub fn alias_view(ctx: &Ctx, a: &Alias) -> ApiResult<Value> {
    let (path, kind) = mount_fields(ctx, &a.mount_accessor)?;
    Ok(json!({
        "canonical_id": a.canonical_id,
        "creation_time": rfc3339(a.creation_time),
        "custom_metadata": {},
        "id": a.id,
        "last_update_time": rfc3339(a.last_update_time),
        "local": a.local,
        "merged_from_canonical_ids": null,
        "metadata": null,
        "mount_accessor": a.mount_accessor,
        "mount_path": path,
        "mount_type": kind,
        "name": a.name,
    }))
}

/// An entity as a read shows it: its aliases and groups included.
pub fn view(ctx: &Ctx, e: &Entity) -> ApiResult<Value> {
    let mut aliases = Vec::new();
    for a in aliases_of(ctx, &e.id)? {
        aliases.push(alias_view(ctx, &a)?);
    }
    let direct = group_ids(ctx, &e.id)?;
    let inherited = super::nesting::ancestors(ctx, &direct)?;
    let all: Vec<&String> = direct.iter().chain(&inherited).collect();
    Ok(json!({
        "aliases": aliases,
        "creation_time": rfc3339(e.creation_time),
        "direct_group_ids": direct,
        "disabled": e.disabled,
        "group_ids": all,
        "id": e.id,
        "inherited_group_ids": inherited,
        "last_update_time": rfc3339(e.last_update_time),
        "merged_entity_ids": null,
        "metadata": e.metadata,
        "name": e.name,
        "namespace_id": e.namespace_id,
        "policies": e.policies,
    }))
}

/// Applies the body's fields to `e`; `name` is checked by the caller.
fn apply(e: &mut Entity, body: &Map<String, Value>) -> ApiResult<()> {
    let f = Fields(body);
    if let Some(p) = f.list("policies")? {
        super::check_policies(&p)?;
        let mut p = p;
        p.sort();
        p.dedup();
        e.policies = p;
    }
    if let Some(m) = metadata(body)? {
        e.metadata = m;
    }
    if let Some(d) = f.bool("disabled")? {
        e.disabled = d;
    }
    Ok(())
}

/// Creates or updates the entity `existing` (or a new one) from the body; renames check that
/// the new name is free in the namespace. 200 with `{aliases, id, name}` for a new entity,
/// 204 for an update.
fn upsert(
    ctx: &mut Ctx,
    ns_id: &str,
    existing: Option<Entity>,
    name: Option<String>,
    body: &Map<String, Value>,
) -> ApiResult {
    if let Some(n) = &name {
        check_name(n)?;
    }
    let created = existing.is_none();
    let mut e = match existing {
        Some(e) => e,
        None => new_entity(ctx, ns_id, name.as_deref().unwrap_or("")),
    };
    if let Some(n) = name.filter(|n| !n.is_empty() && *n != e.name) {
        if let Some(other) = by_name(ctx, ns_id, &n)? {
            if other.id != e.id {
                return Err(ApiError::bad("entity name is already in use"));
            }
        }
        delete(ctx, &name_key(ns_id, &e.name))?;
        e.name = n;
    }
    apply(&mut e, body)?;
    e.last_update_time = ctx.now;
    store(ctx, REPLICATED, &e)?;
    if created {
        Ok(Reply::Data(json!({
            "aliases": null,
            "id": e.id,
            "name": e.name,
        })))
    } else {
        Ok(Reply::Empty)
    }
}

/// `identity/entity`: create, or update by `id` or by an existing `name`.
pub fn create(ctx: &mut Ctx, req: &Request) -> ApiResult {
    if !req.method.is_write() {
        return Err(ApiError::MethodNotAllowed);
    }
    let ns_id = request_ns(ctx, req)?;
    let body = body_object(&req.body)?;
    let f = Fields(&body);
    let name = f.str("name")?;
    let existing = match f.str("id")?.filter(|i| !i.is_empty()) {
        Some(id) => Some(
            load(ctx, &id)?
                .filter(|e| e.namespace_id == ns_id)
                .ok_or_else(|| ApiError::bad("entity not found from id"))?,
        ),
        None => match name.as_deref().filter(|n| !n.is_empty()) {
            Some(n) => by_name(ctx, &ns_id, n)?,
            None => None,
        },
    };
    upsert(ctx, &ns_id, existing, name, &body)
}

/// The entities of namespace `ns_id`.
pub fn all(ctx: &Ctx, ns_id: &str) -> ApiResult<Vec<Entity>> {
    let mut out = Vec::new();
    for id in suffixes(ctx, "entity/")? {
        if let Some(e) = load(ctx, &id)?.filter(|e| e.namespace_id == ns_id) {
            out.push(e);
        }
    }
    Ok(out)
}

/// `LIST identity/entity/id` (keys with names) and `LIST identity/entity/name`.
pub fn list(ctx: &mut Ctx, req: &Request, by: &str) -> ApiResult {
    if req.method != Method::List {
        return Err(ApiError::MethodNotAllowed);
    }
    let ns_id = request_ns(ctx, req)?;
    let all = all(ctx, &ns_id)?;
    match by {
        "id" => {
            let mut info = Map::new();
            for e in &all {
                info.insert(e.id.clone(), json!({ "name": e.name }));
            }
            keys_reply(all.into_iter().map(|e| e.id).collect(), Some(info))
        }
        "name" => {
            let mut names: Vec<String> = all.into_iter().map(|e| e.name).collect();
            names.sort();
            keys_reply(names, None)
        }
        _ => Err(ApiError::NotFound(String::new())),
    }
}

/// Deletes entity `e`: its aliases, its memberships (and its place in internal groups).
pub fn remove(ctx: &mut Ctx, e: &Entity) -> ApiResult<()> {
    for a in aliases_of(ctx, &e.id)? {
        remove_alias(ctx, &a)?;
    }
    for g in group_ids(ctx, &e.id)? {
        super::group::drop_member(ctx, &g, &e.id)?;
    }
    delete(ctx, &name_key(&e.namespace_id, &e.name))?;
    delete(ctx, &entity_key(&e.id))
}

/// `identity/entity/id/<id>` and `identity/entity/name/<name>`: read, update, delete (a
/// write by name creates the entity when there is none).
pub fn one(ctx: &mut Ctx, req: &Request, by: &str, key: &str) -> ApiResult {
    let ns_id = request_ns(ctx, req)?;
    let found = match by {
        "id" => load(ctx, key)?,
        "name" => by_name(ctx, &ns_id, key)?,
        _ => return Err(ApiError::NotFound(String::new())),
    }
    .filter(|e| e.namespace_id == ns_id);
    match req.method {
        Method::Get => match found {
            Some(e) => Ok(Reply::Data(view(ctx, &e)?)),
            None => Err(ApiError::NotFound(String::new())),
        },
        Method::Put | Method::Post => {
            let body = body_object(&req.body)?;
            let f = Fields(&body);
            match (by, found) {
                ("id", None) => Err(ApiError::bad("entity not found from id")),
                ("id", Some(e)) => {
                    let name = f.str("name")?;
                    upsert(ctx, &ns_id, Some(e), name, &body)
                }
                (_, found) => upsert(ctx, &ns_id, found, Some(key.to_string()), &body),
            }
        }
        Method::Delete => {
            if let Some(e) = found {
                remove(ctx, &e)?;
            }
            Ok(Reply::Empty)
        }
        Method::List | Method::Patch => Err(ApiError::MethodNotAllowed),
    }
}

/// Deletes an alias and its indexes.
pub fn remove_alias(ctx: &mut Ctx, a: &Alias) -> ApiResult<()> {
    delete(ctx, &alias_index(&a.mount_accessor, &a.name))?;
    delete(ctx, &entity_alias_index(&a.canonical_id, &a.id))?;
    delete(ctx, &alias_key(&a.id))
}

/// Checks an alias's mount accessor (an auth mount of the request's namespace).
fn check_accessor(ctx: &Ctx, req: &Request, accessor: &str) -> ApiResult<()> {
    let ns = req.namespace.as_deref().unwrap_or("");
    if accessor.is_empty() {
        return Err(ApiError::bad("missing mount_accessor"));
    }
    if super::auth_mount(ctx, ns, accessor)?.is_none() {
        return Err(ApiError::bad(format!(
            "invalid mount accessor {accessor:?}"
        )));
    }
    Ok(())
}

/// Creates or updates alias `existing` from the body. Without `canonical_id` a new alias
/// gets a new entity, as in the reference.
fn alias_upsert(ctx: &mut Ctx, req: &Request, existing: Option<Alias>) -> ApiResult {
    let ns_id = request_ns(ctx, req)?;
    let body = body_object(&req.body)?;
    let f = Fields(&body);
    let name = f.str("name")?;
    let accessor = f.str("mount_accessor")?;
    let canonical = f.str("canonical_id")?.filter(|c| !c.is_empty());
    let mut a = match existing {
        Some(a) => a,
        None => Alias {
            id: crypto::uuid(ctx.rng()),
            namespace_id: ns_id.clone(),
            creation_time: ctx.now,
            ..Default::default()
        },
    };
    let old = a.clone();
    if let Some(n) = name {
        check_name(&n)?;
        a.name = n;
    }
    if a.name.is_empty() {
        return Err(ApiError::bad("missing alias name"));
    }
    if let Some(acc) = accessor {
        a.mount_accessor = acc;
    }
    check_accessor(ctx, req, &a.mount_accessor)?;
    match canonical {
        Some(c) => {
            if load(ctx, &c)?.filter(|e| e.namespace_id == ns_id).is_none() {
                return Err(ApiError::bad("invalid canonical ID"));
            }
            a.canonical_id = c;
        }
        None if a.canonical_id.is_empty() => {
            let e = new_entity(ctx, &ns_id, "");
            store(ctx, REPLICATED, &e)?;
            a.canonical_id = e.id;
        }
        None => {}
    }
    if let Some(other) = alias_by_key(ctx, &a.mount_accessor, &a.name)? {
        if other.id != a.id {
            return Err(ApiError::bad(format!(
                "alias with combination of mount accessor and name already exists for entity {:?}",
                other.canonical_id
            )));
        }
    }
    if !old.id.is_empty() && !old.name.is_empty() {
        remove_alias(ctx, &old)?;
    }
    a.last_update_time = ctx.now;
    a.local = false;
    store_alias(ctx, REPLICATED, &a)?;
    Ok(Reply::Data(
        json!({ "canonical_id": a.canonical_id, "id": a.id }),
    ))
}

/// `identity/entity-alias`: create (or update with `id`).
pub fn alias_create(ctx: &mut Ctx, req: &Request) -> ApiResult {
    if !req.method.is_write() {
        return Err(ApiError::MethodNotAllowed);
    }
    let body = body_object(&req.body)?;
    // Only an alias of the request's namespace is named by id: another namespace's is as
    // if it did not exist (as on `entity-alias/id/<id>`).
    let ns_id = request_ns(ctx, req)?;
    let existing = match Fields(&body).str("id")?.filter(|i| !i.is_empty()) {
        Some(id) => Some(
            load_alias(ctx, &id)?
                .filter(|a| a.namespace_id == ns_id)
                .ok_or_else(|| ApiError::bad("invalid alias ID"))?,
        ),
        None => None,
    };
    alias_upsert(ctx, req, existing)
}

/// The aliases of namespace `ns_id`.
fn all_aliases(ctx: &Ctx, ns_id: &str) -> ApiResult<Vec<Alias>> {
    let mut out = Vec::new();
    for id in suffixes(ctx, "alias/")? {
        if let Some(a) = load_alias(ctx, &id)?.filter(|a| a.namespace_id == ns_id) {
            out.push(a);
        }
    }
    Ok(out)
}

/// `LIST identity/entity-alias/id`.
pub fn alias_list(ctx: &mut Ctx, req: &Request) -> ApiResult {
    if req.method != Method::List {
        return Err(ApiError::MethodNotAllowed);
    }
    let ns_id = request_ns(ctx, req)?;
    let mut info = Map::new();
    let mut keys = Vec::new();
    for a in all_aliases(ctx, &ns_id)? {
        let mut v = alias_view(ctx, &a)?;
        if let Value::Object(m) = &mut v {
            for k in [
                "id",
                "creation_time",
                "last_update_time",
                "merged_from_canonical_ids",
            ] {
                m.remove(k);
            }
        }
        info.insert(a.id.clone(), v);
        keys.push(a.id);
    }
    keys_reply(keys, Some(info))
}

/// `identity/entity-alias/id/<id>`: read, update, delete.
pub fn alias_one(ctx: &mut Ctx, req: &Request, id: &str) -> ApiResult {
    let ns_id = request_ns(ctx, req)?;
    let found = load_alias(ctx, id)?.filter(|a| a.namespace_id == ns_id);
    match req.method {
        Method::Get => {
            let a = found.ok_or_else(|| ApiError::NotFound(String::new()))?;
            let mut v = alias_view(ctx, &a)?;
            v["namespace_id"] = json!(a.namespace_id);
            Ok(Reply::Data(v))
        }
        Method::Put | Method::Post => match found {
            Some(a) => alias_upsert(ctx, req, Some(a)),
            None => Err(ApiError::bad("invalid alias ID")),
        },
        Method::Delete => {
            if let Some(a) = found {
                remove_alias(ctx, &a)?;
            }
            Ok(Reply::Empty)
        }
        Method::List | Method::Patch => Err(ApiError::MethodNotAllowed),
    }
}
