//! Nested groups: an internal group's `member_group_ids` (its subgroups), the parent index
//! that answers "which groups contain this one" in one prefix scan, the transitive closure
//! of a group's ancestors (an entity of a subgroup gets the policies of every group above
//! it, as the reference computes `identity_policies`), and the checks a new member list
//! passes before it is stored (no self-membership, no unknown group, no cycle).
//!
//! The member list lives on the parent (`Group::member_group_ids`), as the reference stores
//! it; the index `parent/<child id>/<parent id>` → parent id (replicated base) is derived
//! from it and written in the same write set, so both always agree.

use super::group::{load, Group, EXTERNAL};
use super::{delete, put_id, suffixes, REPLICATED};
use crate::api::{ApiError, ApiResult};
use crate::ctx::Ctx;
use std::collections::{BTreeSet, VecDeque};

/// The index key recording that `parent` contains `child`.
pub fn parent_key(child: &str, parent: &str) -> String {
    format!("parent/{child}/{parent}")
}

/// The ids of the groups that name `child` among their member groups (sorted).
pub fn parents(ctx: &Ctx, child: &str) -> ApiResult<Vec<String>> {
    suffixes(ctx, &format!("parent/{child}/"))
}

/// Every group above the groups `start` (their parents, the parents' parents, ...), in
/// breadth-first order, without the groups of `start` themselves. Terminates on any
/// stored graph: each group is visited once.
pub fn ancestors(ctx: &Ctx, start: &[String]) -> ApiResult<Vec<String>> {
    let mut seen: BTreeSet<String> = start.iter().cloned().collect();
    let mut queue: VecDeque<String> = start.iter().cloned().collect();
    let mut out = Vec::new();
    while let Some(g) = queue.pop_front() {
        for p in parents(ctx, &g)? {
            if seen.insert(p.clone()) {
                out.push(p.clone());
                queue.push_back(p);
            }
        }
    }
    Ok(out)
}

/// Whether `target` is `from` or lies below it (reachable through member groups).
fn reaches(ctx: &Ctx, from: &str, target: &str) -> ApiResult<bool> {
    let mut seen = BTreeSet::from([from.to_string()]);
    let mut queue = VecDeque::from([from.to_string()]);
    while let Some(g) = queue.pop_front() {
        if g == target {
            return Ok(true);
        }
        if let Some(group) = load(ctx, &g)? {
            for m in group.member_group_ids {
                if seen.insert(m.clone()) {
                    queue.push_back(m);
                }
            }
        }
    }
    Ok(false)
}

/// Checks the member group list `ids` (sorted, unique) asked for group `g` of namespace
/// `ns_id`: an internal group only; each member an existing group of the namespace, not
/// `g` itself, and not one `g` already lies below (that would close a cycle).
pub fn check_members(ctx: &Ctx, g: &Group, ns_id: &str, ids: &[String]) -> ApiResult<()> {
    if g.kind == EXTERNAL && !ids.is_empty() {
        return Err(ApiError::bad(
            "member groups can't be set for external groups",
        ));
    }
    for id in ids {
        if *id == g.id {
            return Err(ApiError::bad(format!(
                "member group ID {id:?} is same as the ID of the group"
            )));
        }
        if load(ctx, id)?.filter(|m| m.namespace_id == ns_id).is_none() {
            return Err(ApiError::bad(format!("invalid member group ID {id:?}")));
        }
        if reaches(ctx, id, &g.id)? {
            return Err(ApiError::bad(format!(
                "cyclic relationship detected for member group ID {id:?}"
            )));
        }
    }
    Ok(())
}

/// Replaces the member groups of `g` by `ids` (checked by [`check_members`]): the parent
/// index follows. The caller stores `g`.
pub fn set_members(ctx: &mut Ctx, g: &mut Group, ids: Vec<String>) -> ApiResult<()> {
    for old in &g.member_group_ids {
        if !ids.contains(old) {
            delete(ctx, &parent_key(old, &g.id))?;
        }
    }
    for id in &ids {
        put_id(ctx, REPLICATED, &parent_key(id, &g.id), &g.id)?;
    }
    g.member_group_ids = ids;
    Ok(())
}

/// Unlinks group `g` (being deleted) from the graph: it leaves the member lists of its
/// parents (each parent's update is counted in its `modify_index`), and its subgroups lose
/// it as a parent.
pub fn unlink(ctx: &mut Ctx, g: &Group, now: crate::time::Millis) -> ApiResult<()> {
    for p in parents(ctx, &g.id)? {
        delete(ctx, &parent_key(&g.id, &p))?;
        if let Some(mut parent) = load(ctx, &p)? {
            parent.member_group_ids.retain(|m| *m != g.id);
            parent.modify_index += 1;
            parent.last_update_time = now;
            super::group::store(ctx, &parent)?;
        }
    }
    for m in &g.member_group_ids {
        delete(ctx, &parent_key(m, &g.id))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::api::Method;
    use crate::auth::ldap::tests::{authenticated_search, World};
    use crate::Response;
    use serde_json::{json, Value};

    fn data(r: &Response) -> Value {
        assert!(r.status < 300, "{} {:?}", r.status, r.body);
        r.body
            .as_ref()
            .map(|b| b["data"].clone())
            .unwrap_or(Value::Null)
    }

    fn strings(v: &Value) -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn group(w: &mut World, body: Value) -> String {
        data(&w.admin(Method::Post, "identity/group", body))["id"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    fn error(r: &Response) -> String {
        r.body
            .as_ref()
            .map(|b| b["errors"][0].to_string())
            .unwrap_or_default()
    }

    /// alice (an LDAP login) in `child`, `child` in `parent`, `parent` in `grand`: her token
    /// carries all three groups' policies, and changes to the graph reach it at once.
    #[test]
    fn policies_of_every_group_above_apply_transitively() {
        let mut w = World::new();
        w.configure(authenticated_search());
        let login = w.login("alice", "alicepw");
        let auth = login
            .body
            .as_ref()
            .map(|b| b["auth"].clone())
            .unwrap_or_default();
        let tok = auth["client_token"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let eid = auth["entity_id"].as_str().unwrap_or_default().to_string();
        assert_eq!(eid.len(), 36, "{auth}");
        let child = group(
            &mut w,
            json!({"name": "child", "policies": ["cp"], "member_entity_ids": [eid]}),
        );
        let parent = group(
            &mut w,
            json!({"name": "parent", "policies": ["pp"], "member_group_ids": [child]}),
        );
        let grand = group(
            &mut w,
            json!({"name": "grand", "policies": ["gp"], "member_group_ids": [parent]}),
        );
        let look = |w: &mut World| {
            let l = data(&w.call(Method::Get, "auth/token/lookup-self", json!({}), Some(&tok)));
            strings(&l["identity_policies"])
        };
        assert_eq!(look(&mut w), ["cp", "gp", "pp"]);
        // Reads show both directions of the relation.
        let c = data(&w.admin(
            Method::Get,
            &format!("identity/group/id/{child}"),
            json!({}),
        ));
        assert_eq!(strings(&c["parent_group_ids"]), [parent.as_str()]);
        assert!(c["member_group_ids"].is_null(), "{c}");
        let p = data(&w.admin(
            Method::Get,
            &format!("identity/group/id/{parent}"),
            json!({}),
        ));
        assert_eq!(strings(&p["member_group_ids"]), [child.as_str()]);
        assert_eq!(strings(&p["parent_group_ids"]), [grand.as_str()]);
        let e = data(&w.admin(Method::Get, &format!("identity/entity/id/{eid}"), json!({})));
        assert_eq!(strings(&e["direct_group_ids"]), [child.as_str()]);
        assert_eq!(
            strings(&e["inherited_group_ids"]),
            [parent.as_str(), grand.as_str()]
        );
        assert_eq!(strings(&e["group_ids"]).len(), 3);
        let list = data(&w.admin(Method::List, "identity/group/id", json!({})));
        assert_eq!(list["key_info"][&child]["num_parent_groups"], 1);
        assert_eq!(list["key_info"][&grand]["num_parent_groups"], 0);

        // Cycles are refused and change nothing.
        for (g, members, want) in [
            (&child, vec![grand.clone()], "cyclic relationship"),
            (&child, vec![child.clone()], "same as the ID of the group"),
            (&parent, vec!["nope".to_string()], "invalid member group ID"),
        ] {
            let r = w.admin(
                Method::Post,
                &format!("identity/group/id/{g}"),
                json!({ "member_group_ids": members }),
            );
            assert_eq!(r.status, 400, "{:?}", r.body);
            assert!(error(&r).contains(want), "{:?}", r.body);
        }
        let r = w.admin(
            Method::Post,
            "identity/group",
            json!({"name": "ext", "type": "external", "member_group_ids": [child]}),
        );
        assert_eq!(r.status, 400, "{:?}", r.body);
        assert_eq!(look(&mut w), ["cp", "gp", "pp"]);

        // Deleting the middle group cuts the chain: grand no longer reaches alice, and
        // grand's member list forgets it.
        let r = w.admin(
            Method::Delete,
            &format!("identity/group/id/{parent}"),
            json!({}),
        );
        assert_eq!(r.status, 204);
        assert_eq!(look(&mut w), ["cp"]);
        let g = data(&w.admin(
            Method::Get,
            &format!("identity/group/id/{grand}"),
            json!({}),
        ));
        assert!(g["member_group_ids"].is_null(), "{g}");
        let c = data(&w.admin(
            Method::Get,
            &format!("identity/group/id/{child}"),
            json!({}),
        ));
        assert!(c["parent_group_ids"].is_null(), "{c}");

        // Replacing a member list moves the parent edge: grand takes child directly.
        let r = w.admin(
            Method::Post,
            &format!("identity/group/id/{grand}"),
            json!({"member_group_ids": [child]}),
        );
        assert_eq!(r.status, 204, "{:?}", r.body);
        assert_eq!(look(&mut w), ["cp", "gp"]);
        let r = w.admin(
            Method::Post,
            &format!("identity/group/id/{grand}"),
            json!({"member_group_ids": []}),
        );
        assert_eq!(r.status, 204, "{:?}", r.body);
        assert_eq!(look(&mut w), ["cp"]);
    }
}
