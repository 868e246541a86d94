//! Groups and group aliases: the records, their views, membership, and the
//! `identity/group*` and `identity/group-alias*` endpoints.
//!
//! An internal group names its members (`member_entity_ids`); an external group's members
//! are the entities whose logins reported a directory group named as the group's alias on
//! the alias's mount ([`super::login`]). Both kinds record each membership under
//! `member/<entity>/<group>` so a token's groups are one prefix scan.

use super::entity::{self, member_prefix};
use super::nesting;
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

pub const INTERNAL: &str = "internal";
pub const EXTERNAL: &str = "external";

/// One group.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Group {
    pub id: String,
    pub name: String,
    pub namespace_id: String,
    /// `internal` or `external`.
    pub kind: String,
    pub policies: Vec<String>,
    /// Members of an internal group (an external group's are in the membership index).
    pub member_entity_ids: Vec<String>,
    /// The subgroups of an internal group (sorted; [`super::nesting`] keeps their parent
    /// index).
    pub member_group_ids: Vec<String>,
    pub metadata: Option<Map<String, Value>>,
    /// The id of its alias (external groups).
    pub alias_id: Option<String>,
    pub creation_time: Millis,
    pub last_update_time: Millis,
    pub modify_index: u64,
}

/// One group alias: the name of a directory group on an auth mount.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GroupAlias {
    pub id: String,
    pub name: String,
    pub canonical_id: String,
    pub mount_accessor: String,
    pub namespace_id: String,
    pub creation_time: Millis,
    pub last_update_time: Millis,
}

pub fn group_key(id: &str) -> String {
    format!("group/{id}")
}
pub fn name_key(ns_id: &str, name: &str) -> String {
    format!("group-name/{ns_id}/{}", fold(name))
}
pub fn alias_key(id: &str) -> String {
    format!("group-alias/{id}")
}
pub fn alias_index(accessor: &str, name: &str) -> String {
    format!("group-alias-key/{accessor}/{}", fold(name))
}
pub fn member_key(entity: &str, group: &str) -> String {
    format!("member/{entity}/{group}")
}

pub fn load(ctx: &Ctx, id: &str) -> ApiResult<Option<Group>> {
    if id.is_empty() || id.contains('/') {
        return Ok(None);
    }
    Ok(get::<Group>(ctx, &group_key(id))?.map(|(_, g)| g))
}

pub fn by_name(ctx: &Ctx, ns_id: &str, name: &str) -> ApiResult<Option<Group>> {
    match get_id(ctx, &name_key(ns_id, name))? {
        Some(id) => load(ctx, &id),
        None => Ok(None),
    }
}

pub fn load_alias(ctx: &Ctx, id: &str) -> ApiResult<Option<GroupAlias>> {
    if id.is_empty() || id.contains('/') {
        return Ok(None);
    }
    Ok(get::<GroupAlias>(ctx, &alias_key(id))?.map(|(_, a)| a))
}

/// The group alias named `name` on the mount with `accessor`.
pub fn alias_by_key(ctx: &Ctx, accessor: &str, name: &str) -> ApiResult<Option<GroupAlias>> {
    match get_id(ctx, &alias_index(accessor, name))? {
        Some(id) => load_alias(ctx, &id),
        None => Ok(None),
    }
}

pub(super) fn store(ctx: &mut Ctx, g: &Group) -> ApiResult<()> {
    put(ctx, REPLICATED, &group_key(&g.id), g)?;
    put_id(ctx, REPLICATED, &name_key(&g.namespace_id, &g.name), &g.id)
}

/// The entities that are members of `g`.
pub fn members(ctx: &Ctx, g: &Group) -> ApiResult<Vec<String>> {
    if g.kind != EXTERNAL {
        return Ok(g.member_entity_ids.clone());
    }
    let suffix = format!("/{}", g.id);
    Ok(suffixes(ctx, "member/")?
        .into_iter()
        .filter_map(|k| k.strip_suffix(&suffix).map(str::to_string))
        .collect())
}

/// Removes entity `entity` from group `group` (the index, and an internal group's list).
pub fn drop_member(ctx: &mut Ctx, group: &str, entity: &str) -> ApiResult<()> {
    delete(ctx, &member_key(entity, group))?;
    if let Some(mut g) = load(ctx, group)? {
        if g.kind == INTERNAL && g.member_entity_ids.iter().any(|m| m == entity) {
            g.member_entity_ids.retain(|m| m != entity);
            g.modify_index += 1;
            store(ctx, &g)?;
        }
    }
    Ok(())
}

fn alias_view(ctx: &Ctx, a: &GroupAlias) -> ApiResult<Value> {
    let (path, kind) = mount_fields(ctx, &a.mount_accessor)?;
    Ok(json!({
        "canonical_id": a.canonical_id,
        "creation_time": rfc3339(a.creation_time),
        "id": a.id,
        "last_update_time": rfc3339(a.last_update_time),
        "merged_from_canonical_ids": null,
        "metadata": null,
        "mount_accessor": a.mount_accessor,
        "mount_path": path,
        "mount_type": kind,
        "name": a.name,
    }))
}

/// A group as a read shows it.
pub fn view(ctx: &Ctx, g: &Group) -> ApiResult<Value> {
    let alias = match g.alias_id.as_deref() {
        Some(id) => match load_alias(ctx, id)? {
            Some(a) => alias_view(ctx, &a)?,
            None => json!({}),
        },
        None => json!({}),
    };
    let members = members(ctx, g)?;
    let parents = nesting::parents(ctx, &g.id)?;
    let listed = |v: &[String]| {
        if v.is_empty() {
            Value::Null
        } else {
            json!(v)
        }
    };
    Ok(json!({
        "alias": alias,
        "creation_time": rfc3339(g.creation_time),
        "id": g.id,
        "last_update_time": rfc3339(g.last_update_time),
        "member_entity_ids": listed(&members),
        "member_group_ids": listed(&g.member_group_ids),
        "metadata": g.metadata,
        "modify_index": g.modify_index,
        "name": g.name,
        "namespace_id": g.namespace_id,
        "parent_group_ids": listed(&parents),
        "policies": listed(&g.policies),
        "type": g.kind,
    }))
}

/// Creates or updates group `existing` (or a new one named `name`) from the body: 200 with
/// `{id, name}` for a new group, 204 for an update.
fn upsert(
    ctx: &mut Ctx,
    ns_id: &str,
    existing: Option<Group>,
    name: Option<String>,
    body: &Map<String, Value>,
) -> ApiResult {
    let f = Fields(body);
    if let Some(n) = &name {
        check_name(n)?;
    }
    let created = existing.is_none();
    let mut g = match existing {
        Some(g) => g,
        None => {
            let id = crypto::uuid(ctx.rng());
            Group {
                name: name
                    .clone()
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| format!("group_{id}")),
                id,
                namespace_id: ns_id.to_string(),
                kind: INTERNAL.into(),
                creation_time: ctx.now,
                ..Default::default()
            }
        }
    };
    if let Some(t) = f.str("type")?.filter(|t| !t.is_empty()) {
        if t != INTERNAL && t != EXTERNAL {
            return Err(ApiError::bad(format!("invalid group type {t:?}")));
        }
        if !created && t != g.kind {
            return Err(ApiError::bad("group type cannot be changed"));
        }
        g.kind = t;
    }
    if let Some(n) = name.filter(|n| !n.is_empty() && *n != g.name) {
        if let Some(other) = by_name(ctx, ns_id, &n)? {
            if other.id != g.id {
                return Err(ApiError::bad("group name is already in use"));
            }
        }
        delete(ctx, &name_key(ns_id, &g.name))?;
        g.name = n;
    }
    if let Some(p) = f.list("policies")? {
        super::check_policies(&p)?;
        let mut p = p;
        p.sort();
        p.dedup();
        g.policies = p;
    }
    if let Some(m) = metadata(body)? {
        g.metadata = m;
    }
    if let Some(ids) = f.list("member_entity_ids")? {
        if g.kind == EXTERNAL {
            return Err(ApiError::bad(
                "member entities can't be set manually for external groups",
            ));
        }
        let mut ids = ids;
        ids.sort();
        ids.dedup();
        for id in &ids {
            if entity::load(ctx, id)?
                .filter(|e| e.namespace_id == ns_id)
                .is_none()
            {
                return Err(ApiError::bad(format!("invalid entity ID {id:?}")));
            }
        }
        for old in g.member_entity_ids.clone() {
            if !ids.contains(&old) {
                delete(ctx, &member_key(&old, &g.id))?;
            }
        }
        for id in &ids {
            put_id(ctx, REPLICATED, &member_key(id, &g.id), &g.id)?;
        }
        g.member_entity_ids = ids;
    }
    if let Some(mut ids) = f.list("member_group_ids")? {
        ids.sort();
        ids.dedup();
        nesting::check_members(ctx, &g, ns_id, &ids)?;
        nesting::set_members(ctx, &mut g, ids)?;
    }
    g.last_update_time = ctx.now;
    g.modify_index += 1;
    store(ctx, &g)?;
    if created {
        Ok(Reply::Data(json!({ "id": g.id, "name": g.name })))
    } else {
        Ok(Reply::Empty)
    }
}

/// `identity/group`: create, or update by `id` or by an existing `name`.
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
                .filter(|g| g.namespace_id == ns_id)
                .ok_or_else(|| ApiError::bad("invalid group ID"))?,
        ),
        None => match name.as_deref().filter(|n| !n.is_empty()) {
            Some(n) => by_name(ctx, &ns_id, n)?,
            None => None,
        },
    };
    upsert(ctx, &ns_id, existing, name, &body)
}

/// The groups of namespace `ns_id`.
pub fn all(ctx: &Ctx, ns_id: &str) -> ApiResult<Vec<Group>> {
    let mut out = Vec::new();
    for id in suffixes(ctx, "group/")? {
        if let Some(g) = load(ctx, &id)?.filter(|g| g.namespace_id == ns_id) {
            out.push(g);
        }
    }
    Ok(out)
}

/// `LIST identity/group/id` (keys with info) and `LIST identity/group/name`.
pub fn list(ctx: &mut Ctx, req: &Request, by: &str) -> ApiResult {
    if req.method != Method::List {
        return Err(ApiError::MethodNotAllowed);
    }
    let ns_id = request_ns(ctx, req)?;
    let all = all(ctx, &ns_id)?;
    match by {
        "id" => {
            let mut info = Map::new();
            for g in &all {
                let mut v = json!({
                    "name": g.name,
                    "num_member_entities": members(ctx, g)?.len(),
                    "num_parent_groups": nesting::parents(ctx, &g.id)?.len(),
                });
                if let Some(a) = g.alias_id.as_deref().map(|id| load_alias(ctx, id)) {
                    if let Some(a) = a? {
                        let (path, kind) = mount_fields(ctx, &a.mount_accessor)?;
                        v["alias"] = json!({
                            "id": a.id,
                            "mount_accessor": a.mount_accessor,
                            "mount_path": path,
                            "mount_type": kind,
                            "name": a.name,
                        });
                    }
                }
                info.insert(g.id.clone(), v);
            }
            keys_reply(all.into_iter().map(|g| g.id).collect(), Some(info))
        }
        "name" => {
            let mut names: Vec<String> = all.into_iter().map(|g| g.name).collect();
            names.sort();
            keys_reply(names, None)
        }
        _ => Err(ApiError::NotFound(String::new())),
    }
}

/// Deletes group `g`: its alias, its memberships, its record.
pub fn remove(ctx: &mut Ctx, g: &Group) -> ApiResult<()> {
    if let Some(a) = g.alias_id.as_deref() {
        if let Some(a) = load_alias(ctx, a)? {
            remove_alias_keys(ctx, &a)?;
        }
    }
    for m in members(ctx, g)? {
        delete(ctx, &member_key(&m, &g.id))?;
    }
    nesting::unlink(ctx, g, ctx.now)?;
    delete(ctx, &name_key(&g.namespace_id, &g.name))?;
    delete(ctx, &group_key(&g.id))
}

/// `identity/group/id/<id>` and `identity/group/name/<name>`: read, update, delete (a write
/// by name creates the group when there is none).
pub fn one(ctx: &mut Ctx, req: &Request, by: &str, key: &str) -> ApiResult {
    let ns_id = request_ns(ctx, req)?;
    let found = match by {
        "id" => load(ctx, key)?,
        "name" => by_name(ctx, &ns_id, key)?,
        _ => return Err(ApiError::NotFound(String::new())),
    }
    .filter(|g| g.namespace_id == ns_id);
    match req.method {
        Method::Get => match found {
            Some(g) => Ok(Reply::Data(view(ctx, &g)?)),
            None => Err(ApiError::NotFound(String::new())),
        },
        Method::Put | Method::Post => {
            let body = body_object(&req.body)?;
            match (by, found) {
                ("id", None) => Err(ApiError::bad("invalid group ID")),
                ("id", Some(g)) => {
                    let name = Fields(&body).str("name")?;
                    upsert(ctx, &ns_id, Some(g), name, &body)
                }
                (_, found) => upsert(ctx, &ns_id, found, Some(key.to_string()), &body),
            }
        }
        Method::Delete => {
            if let Some(g) = found {
                remove(ctx, &g)?;
            }
            Ok(Reply::Empty)
        }
        Method::List | Method::Patch => Err(ApiError::MethodNotAllowed),
    }
}

fn remove_alias_keys(ctx: &mut Ctx, a: &GroupAlias) -> ApiResult<()> {
    delete(ctx, &alias_index(&a.mount_accessor, &a.name))?;
    delete(ctx, &alias_key(&a.id))
}

/// Creates or updates group alias `existing`; without `canonical_id` a new alias gets a new
/// external group, as in the reference.
fn alias_upsert(ctx: &mut Ctx, req: &Request, existing: Option<GroupAlias>) -> ApiResult {
    let ns_id = request_ns(ctx, req)?;
    let ns = req.namespace.as_deref().unwrap_or("");
    let body = body_object(&req.body)?;
    let f = Fields(&body);
    let mut a = match existing {
        Some(a) => a,
        None => GroupAlias {
            id: crypto::uuid(ctx.rng()),
            namespace_id: ns_id.clone(),
            creation_time: ctx.now,
            ..Default::default()
        },
    };
    let old = a.clone();
    if let Some(n) = f.str("name")? {
        check_name(&n)?;
        a.name = n;
    }
    if a.name.is_empty() {
        return Err(ApiError::bad("missing alias name"));
    }
    if let Some(acc) = f.str("mount_accessor")? {
        a.mount_accessor = acc;
    }
    if a.mount_accessor.is_empty() {
        return Err(ApiError::bad("missing mount_accessor"));
    }
    if super::auth_mount(ctx, ns, &a.mount_accessor)?.is_none() {
        return Err(ApiError::bad(format!(
            "invalid mount accessor {:?}",
            a.mount_accessor
        )));
    }
    let mut group = match f.str("canonical_id")?.filter(|c| !c.is_empty()) {
        Some(c) => load(ctx, &c)?
            .filter(|g| g.namespace_id == ns_id)
            .ok_or_else(|| ApiError::bad("invalid group ID given in 'canonical_id'"))?,
        None if !a.canonical_id.is_empty() => load(ctx, &a.canonical_id)?
            .ok_or_else(|| ApiError::bad("invalid group ID given in 'canonical_id'"))?,
        None => {
            let id = crypto::uuid(ctx.rng());
            Group {
                name: format!("group_{id}"),
                id,
                namespace_id: ns_id.clone(),
                kind: EXTERNAL.into(),
                creation_time: ctx.now,
                last_update_time: ctx.now,
                modify_index: 1,
                ..Default::default()
            }
        }
    };
    if group.kind != EXTERNAL {
        return Err(ApiError::bad("alias can't be set on an internal group"));
    }
    if group.alias_id.as_deref().is_some_and(|x| x != a.id) {
        return Err(ApiError::bad(format!(
            "group {:?} already has an alias",
            group.id
        )));
    }
    if let Some(other) = alias_by_key(ctx, &a.mount_accessor, &a.name)? {
        if other.id != a.id {
            return Err(ApiError::bad(
                "combination of mount and group alias name is already in use",
            ));
        }
    }
    if !old.name.is_empty() {
        remove_alias_keys(ctx, &old)?;
        if old.canonical_id != group.id {
            if let Some(mut prev) = load(ctx, &old.canonical_id)? {
                prev.alias_id = None;
                store(ctx, &prev)?;
            }
        }
    }
    a.canonical_id = group.id.clone();
    a.last_update_time = ctx.now;
    put(ctx, REPLICATED, &alias_key(&a.id), &a)?;
    put_id(
        ctx,
        REPLICATED,
        &alias_index(&a.mount_accessor, &a.name),
        &a.id,
    )?;
    group.alias_id = Some(a.id.clone());
    group.last_update_time = ctx.now;
    group.modify_index += 1;
    store(ctx, &group)?;
    Ok(Reply::Data(
        json!({ "canonical_id": a.canonical_id, "id": a.id }),
    ))
}

/// `identity/group-alias`: create (or update with `id`).
pub fn alias_create(ctx: &mut Ctx, req: &Request) -> ApiResult {
    if !req.method.is_write() {
        return Err(ApiError::MethodNotAllowed);
    }
    let body = body_object(&req.body)?;
    // Only an alias of the request's namespace is named by id: another namespace's is as
    // if it did not exist (as on `group-alias/id/<id>`).
    let ns_id = request_ns(ctx, req)?;
    let existing = match Fields(&body).str("id")?.filter(|i| !i.is_empty()) {
        Some(id) => Some(
            load_alias(ctx, &id)?
                .filter(|a| a.namespace_id == ns_id)
                .ok_or_else(|| ApiError::bad("invalid group alias ID"))?,
        ),
        None => None,
    };
    alias_upsert(ctx, req, existing)
}

/// `LIST identity/group-alias/id`.
pub fn alias_list(ctx: &mut Ctx, req: &Request) -> ApiResult {
    if req.method != Method::List {
        return Err(ApiError::MethodNotAllowed);
    }
    let ns_id = request_ns(ctx, req)?;
    let mut info = Map::new();
    let mut keys = Vec::new();
    for id in suffixes(ctx, "group-alias/")? {
        let Some(a) = load_alias(ctx, &id)?.filter(|a| a.namespace_id == ns_id) else {
            continue;
        };
        let (path, kind) = mount_fields(ctx, &a.mount_accessor)?;
        info.insert(
            a.id.clone(),
            json!({
                "canonical_id": a.canonical_id,
                "custom_metadata": null,
                "local": false,
                "metadata": null,
                "mount_accessor": a.mount_accessor,
                "mount_path": path,
                "mount_type": kind,
                "name": a.name,
            }),
        );
        keys.push(a.id);
    }
    keys_reply(keys, Some(info))
}

/// `identity/group-alias/id/<id>`: read, update, delete.
pub fn alias_one(ctx: &mut Ctx, req: &Request, id: &str) -> ApiResult {
    let ns_id = request_ns(ctx, req)?;
    let found = load_alias(ctx, id)?.filter(|a| a.namespace_id == ns_id);
    match req.method {
        Method::Get => {
            let a = found.ok_or_else(|| ApiError::NotFound(String::new()))?;
            let mut v = alias_view(ctx, &a)?;
            v["custom_metadata"] = Value::Null;
            v["local"] = json!(false);
            v["namespace_id"] = json!(a.namespace_id);
            Ok(Reply::Data(v))
        }
        Method::Put | Method::Post => match found {
            Some(a) => alias_upsert(ctx, req, Some(a)),
            None => Err(ApiError::bad("invalid group alias ID")),
        },
        Method::Delete => {
            if let Some(a) = found {
                remove_alias_keys(ctx, &a)?;
                if let Some(mut g) = load(ctx, &a.canonical_id)? {
                    g.alias_id = None;
                    g.modify_index += 1;
                    store(ctx, &g)?;
                }
            }
            Ok(Reply::Empty)
        }
        Method::List | Method::Patch => Err(ApiError::MethodNotAllowed),
    }
}

/// The groups entity `id` belongs to directly (either base).
pub fn of_entity(ctx: &Ctx, id: &str) -> ApiResult<Vec<Group>> {
    let mut out = Vec::new();
    for g in suffixes(ctx, &member_prefix(id))? {
        if let Some(g) = load(ctx, &g)? {
            out.push(g);
        }
    }
    Ok(out)
}
