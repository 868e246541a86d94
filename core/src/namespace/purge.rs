//! Deleting a namespace with everything in it, in one write set, as the reference's
//! `DELETE sys/namespaces/<path>` does (it refuses only a namespace that still has child
//! namespaces): its secrets mounts and auth mounts with their data and lockout counters,
//! its policies, its token roles, every token created in it (with their children and
//! wrapped responses), its identity entities and groups with their aliases, and the
//! namespace record. The record, mount tables, policies and identity are replicated, so
//! performance and DR secondaries apply the same deletion from the WAL; tokens are
//! cluster-local: a performance secondary's own tokens of the namespace are refused from
//! then on (their namespace is gone) and leave its storage when they expire.

use super::{children, Namespace, POLICY_PREFIX, PREFIX};
use crate::api::{ApiError, ApiResult};
use crate::ctx::Ctx;
use crate::identity::{entity, group};
use crate::mounts::{self, Table};

/// Deletes namespace `n` and what it holds; refuses (changing nothing) while it has
/// child namespaces.
pub fn delete(ctx: &mut Ctx, n: &Namespace) -> ApiResult<()> {
    let full = n.path.as_str();
    if !children(ctx, full)?.is_empty() {
        return Err(ApiError::bad(format!(
            "unable to delete namespace containing child namespaces: delete those of {full:?} first"
        )));
    }
    for table in [Table::Secrets, Table::Auth] {
        for m in mounts::all(ctx, table)?
            .into_iter()
            .filter(|m| m.namespace == full)
        {
            if table == Table::Auth {
                ctx.delete_prefix(&format!(
                    "{}{}/",
                    crate::auth::ldap::lockout::PREFIX,
                    m.accessor
                ))?;
            }
            mounts::disable(ctx, table, &m.path)?;
        }
    }
    ctx.delete_prefix(&format!("{POLICY_PREFIX}{full}"))?;
    ctx.delete_prefix(&format!("{}{full}", crate::token::role::PREFIX))?;
    crate::token::revoke_namespace(ctx, full)?;
    for g in group::all(ctx, &n.id)? {
        group::remove(ctx, &g)?;
    }
    for e in entity::all(ctx, &n.id)? {
        entity::remove(ctx, &e)?;
    }
    ctx.delete(&format!("{PREFIX}{full}"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::api::Method;
    use crate::auth::ldap::tests::{authenticated_search, World};
    use crate::Response;
    use serde_json::{json, Value};
    use std::collections::BTreeSet;

    fn ok(r: Response) -> Value {
        assert!(r.status < 300, "{} {:?}", r.status, r.body);
        r.body.unwrap_or(Value::Null)
    }

    /// Every stored key but the replication log and Merkle trees (which record the
    /// deletion itself).
    fn keys(w: &World) -> BTreeSet<String> {
        w.node
            .storage()
            .map
            .keys()
            .filter(|k| !k.starts_with("node/"))
            .cloned()
            .collect()
    }

    #[test]
    fn deleting_a_namespace_deletes_everything_in_it() {
        let mut w = World::new();
        let before = keys(&w);
        ok(w.admin(Method::Post, "sys/namespaces/ns1", json!({})));
        // A KV mount with data, an LDAP auth mount with logins (entity, alias, group,
        // lockout counter), policies, a token role, tokens and their children.
        ok(w.admin(Method::Post, "ns1/sys/mounts/kv", json!({"type": "kv"})));
        ok(w.admin(Method::Post, "ns1/kv/a", json!({"v": "1"})));
        ok(w.admin(Method::Post, "ns1/sys/mounts/kv2", json!({"type": "kv-v2"})));
        ok(w.admin(Method::Post, "ns1/kv2/data/b", json!({"data": {"v": 1}})));
        ok(w.admin(Method::Post, "ns1/sys/auth/ldap", json!({"type": "ldap"})));
        ok(w.admin(Method::Post, "ns1/auth/ldap/config", authenticated_search()));
        let pol = r#"path "kv/*" { capabilities = ["read", "create", "update"] }
path "auth/token/create" { capabilities = ["update"] }"#;
        ok(w.admin(
            Method::Put,
            "ns1/sys/policies/acl/p1",
            json!({ "policy": pol }),
        ));
        ok(w.admin(
            Method::Post,
            "ns1/auth/token/roles/r1",
            json!({"orphan": true}),
        ));
        let t = ok(w.admin(
            Method::Post,
            "ns1/auth/token/create",
            json!({"policies": ["p1"]}),
        ));
        let tok = t["auth"]["client_token"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        ok(w.call(Method::Post, "ns1/auth/token/create", json!({}), Some(&tok)));
        ok(w.admin(Method::Post, "ns1/auth/token/create/r1", json!({})));
        let login = w.call(
            Method::Post,
            "ns1/auth/ldap/login/alice",
            json!({"password": "alicepw"}),
            None,
        );
        let la = ok(login);
        let alice = la["auth"]["client_token"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let eid = la["auth"]["entity_id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert_eq!(eid.len(), 36, "{la}");
        let bad = w.call(
            Method::Post,
            "ns1/auth/ldap/login/bob",
            json!({"password": "wrong"}),
            None,
        );
        assert_eq!(bad.status, 400, "{:?}", bad.body);
        ok(w.admin(
            Method::Post,
            "ns1/identity/group",
            json!({"name": "g", "policies": ["p1"], "member_entity_ids": [eid]}),
        ));
        ok(w.admin(Method::Post, "ns1/identity/entity", json!({"name": "svc"})));
        for t in [&tok, &alice] {
            let r = w.call(
                Method::Get,
                "ns1/auth/token/lookup-self",
                json!({}),
                Some(t),
            );
            assert_eq!(r.status, 200, "{:?}", r.body);
        }

        // A child namespace blocks the deletion, which then changes nothing.
        ok(w.admin(Method::Post, "ns1/sys/namespaces/kid", json!({})));
        let with_kid = keys(&w);
        let r = w.admin(Method::Delete, "sys/namespaces/ns1", json!({}));
        assert_eq!(r.status, 400, "{:?}", r.body);
        assert!(
            format!("{:?}", r.body).contains("child namespaces"),
            "{:?}",
            r.body
        );
        assert_eq!(keys(&w), with_kid);
        ok(w.admin(Method::Delete, "ns1/sys/namespaces/kid", json!({})));

        let r = ok(w.admin(Method::Delete, "sys/namespaces/ns1", json!({})));
        assert_eq!(r["data"]["status"], "deleted");
        let after = keys(&w);
        let left: Vec<&String> = after.difference(&before).collect();
        assert!(left.is_empty(), "left behind: {left:?}");
        assert_eq!(
            after, before,
            "nothing of the namespace is left and nothing else changed"
        );
        // Its tokens are gone, even once the path is created again; deleting it twice is
        // a 200 with a warning.
        ok(w.admin(Method::Post, "sys/namespaces/ns1", json!({})));
        for t in [&tok, &alice] {
            let r = w.call(
                Method::Get,
                "ns1/auth/token/lookup-self",
                json!({}),
                Some(t),
            );
            assert_eq!(r.status, 403, "{:?}", r.body);
        }
        ok(w.admin(Method::Delete, "sys/namespaces/ns1", json!({})));
        let r = ok(w.admin(Method::Delete, "sys/namespaces/ns1", json!({})));
        assert_eq!(r["warnings"], json!(["requested namespace does not exist"]));
        assert!(r["data"].is_null(), "{r}");
    }
}
