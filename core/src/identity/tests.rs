//! The identity store through a whole node: the endpoints' answers, and LDAP logins (the
//! fake directory) resolving entities and identity policies.

use crate::api::Method;
use crate::auth::ldap::tests::{accessor, authenticated_search, World};
use crate::Response;
use serde_json::{json, Value};

fn data(r: &Response) -> Value {
    r.body
        .as_ref()
        .map(|b| b["data"].clone())
        .unwrap_or(Value::Null)
}

fn ok(r: Response) -> Value {
    assert!(r.status < 300, "{} {:?}", r.status, r.body);
    data(&r)
}

fn keys(r: &Response) -> Vec<String> {
    data(r)["keys"]
        .as_array()
        .unwrap_or_else(|| panic!("{:?}", r.body))
        .iter()
        .map(|k| k.as_str().unwrap_or_default().to_string())
        .collect()
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

fn world() -> (World, String) {
    let mut w = World::new();
    w.configure(authenticated_search());
    let acc = accessor(&mut w);
    (w, acc)
}

#[test]
fn entities_are_created_read_listed_updated_and_deleted() {
    let (mut w, _) = world();
    let d = ok(w.admin(
        Method::Post,
        "identity/entity",
        json!({"name": "e1", "policies": ["p1"], "metadata": {"team": "a"}}),
    ));
    assert_eq!(d["name"], "e1");
    assert!(d["aliases"].is_null());
    let id = d["id"].as_str().unwrap().to_string();
    assert_eq!(id.len(), 36);
    // A second create of the name updates it: 204, metadata kept.
    let r = w.admin(
        Method::Post,
        "identity/entity",
        json!({"name": "E1", "policies": "p2,p3"}),
    );
    assert_eq!(r.status, 204, "{:?}", r.body);
    let e = ok(w.admin(Method::Get, &format!("identity/entity/id/{id}"), json!({})));
    assert_eq!(strings(&e["policies"]), ["p2", "p3"]);
    assert_eq!(e["metadata"]["team"], "a");
    // Names match without regard to case; the update took the new spelling.
    assert_eq!(e["name"], "E1");
    ok(w.admin(
        Method::Post,
        "identity/entity/name/e1",
        json!({"name": "e1"}),
    ));
    assert_eq!(e["namespace_id"], "root");
    assert_eq!(e["disabled"], false);
    assert_eq!(e["aliases"], json!([]));
    let by_name = ok(w.admin(Method::Get, "identity/entity/name/e1", json!({})));
    assert_eq!(by_name["id"], e["id"]);
    assert_eq!(by_name["name"], "e1");
    // A write by a new name creates.
    let d2 = ok(w.admin(
        Method::Post,
        "identity/entity/name/e2",
        json!({"policies": ["x"]}),
    ));
    assert_eq!(d2["name"], "e2");
    let r = w.admin(Method::List, "identity/entity/id", json!({}));
    assert_eq!(keys(&r).len(), 2);
    assert_eq!(data(&r)["key_info"][&id]["name"], "e1");
    assert_eq!(
        keys(&w.admin(Method::List, "identity/entity/name", json!({}))),
        ["e1", "e2"]
    );
    // Unknown ids: 404 to read, 400 to update, 204 to delete.
    assert_eq!(
        w.admin(Method::Get, "identity/entity/id/nope", json!({}))
            .status,
        404
    );
    assert_eq!(
        w.admin(Method::Post, "identity/entity/id/nope", json!({}))
            .status,
        400
    );
    assert_eq!(
        w.admin(Method::Delete, "identity/entity/id/nope", json!({}))
            .status,
        204
    );
    // Renaming onto a taken name is refused.
    let r = w.admin(
        Method::Post,
        &format!("identity/entity/id/{id}"),
        json!({"name": "e2"}),
    );
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(
        w.admin(Method::Delete, "identity/entity/name/e2", json!({}))
            .status,
        204
    );
    assert_eq!(
        w.admin(Method::Get, "identity/entity/name/e2", json!({}))
            .status,
        404
    );
    assert_eq!(
        w.admin(
            Method::Delete,
            &format!("identity/entity/id/{id}"),
            json!({})
        )
        .status,
        204
    );
    assert_eq!(
        w.admin(Method::List, "identity/entity/id", json!({}))
            .status,
        404
    );
    // A nameless entity is named after a random tag.
    let d = ok(w.admin(Method::Post, "identity/entity", json!({})));
    assert!(d["name"].as_str().unwrap().starts_with("entity_"), "{d}");
}

#[test]
fn aliases_groups_and_lookups() {
    let (mut w, acc) = world();
    let e = ok(w.admin(Method::Post, "identity/entity", json!({"name": "e1"})));
    let eid = e["id"].as_str().unwrap().to_string();
    let r = w.admin(
        Method::Post,
        "identity/entity-alias",
        json!({"name": "alice", "canonical_id": eid, "mount_accessor": "bogus"}),
    );
    assert_eq!(r.status, 400);
    let r = w.admin(
        Method::Post,
        "identity/entity-alias",
        json!({"name": "alice", "canonical_id": "nope", "mount_accessor": acc}),
    );
    assert_eq!(r.status, 400);
    let a = ok(w.admin(
        Method::Post,
        "identity/entity-alias",
        json!({"name": "alice", "canonical_id": eid, "mount_accessor": acc}),
    ));
    assert_eq!(a["canonical_id"], eid.as_str());
    let aid = a["id"].as_str().unwrap().to_string();
    // The same (mount, name) twice is refused.
    let r = w.admin(
        Method::Post,
        "identity/entity-alias",
        json!({"name": "ALICE", "canonical_id": eid, "mount_accessor": acc}),
    );
    assert_eq!(r.status, 400, "{:?}", r.body);
    let ar = ok(w.admin(
        Method::Get,
        &format!("identity/entity-alias/id/{aid}"),
        json!({}),
    ));
    assert_eq!(ar["mount_path"], "auth/ldap/");
    assert_eq!(ar["mount_type"], "ldap");
    let er = ok(w.admin(Method::Get, &format!("identity/entity/id/{eid}"), json!({})));
    assert_eq!(er["aliases"][0]["name"], "alice");
    assert_eq!(
        keys(&w.admin(Method::List, "identity/entity-alias/id", json!({}))),
        [aid.as_str()]
    );

    let r = w.admin(
        Method::Post,
        "identity/group",
        json!({"name": "bad", "type": "external", "member_entity_ids": [eid]}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        w.admin(
            Method::Post,
            "identity/group",
            json!({"name": "b", "type": "weird"})
        )
        .status,
        400
    );
    let gi = ok(w.admin(
        Method::Post,
        "identity/group",
        json!({"name": "g-int", "policies": ["gp"], "member_entity_ids": [eid]}),
    ));
    let gid = gi["id"].as_str().unwrap().to_string();
    let ge = ok(w.admin(
        Method::Post,
        "identity/group",
        json!({"name": "g-ext", "type": "external", "policies": ["xp"]}),
    ));
    let xid = ge["id"].as_str().unwrap().to_string();
    let ga = ok(w.admin(
        Method::Post,
        "identity/group-alias",
        json!({"name": "devs", "mount_accessor": acc, "canonical_id": xid}),
    ));
    assert_eq!(ga["canonical_id"], xid.as_str());
    // An internal group takes no alias.
    let r = w.admin(
        Method::Post,
        "identity/group-alias",
        json!({"name": "x", "mount_accessor": acc, "canonical_id": gid}),
    );
    assert_eq!(r.status, 400);
    let g = ok(w.admin(Method::Get, "identity/group/name/g-ext", json!({})));
    assert_eq!(g["type"], "external");
    assert_eq!(g["alias"]["name"], "devs");
    assert!(g["member_entity_ids"].is_null());
    let g = ok(w.admin(Method::Get, &format!("identity/group/id/{gid}"), json!({})));
    assert_eq!(strings(&g["member_entity_ids"]), [eid.as_str()]);
    assert_eq!(g["alias"], json!({}));
    let er = ok(w.admin(Method::Get, &format!("identity/entity/id/{eid}"), json!({})));
    assert_eq!(strings(&er["group_ids"]), [gid.as_str()]);
    let l = w.admin(Method::List, "identity/group/id", json!({}));
    assert_eq!(data(&l)["key_info"][&xid]["alias"]["name"], "devs");
    assert_eq!(data(&l)["key_info"][&gid]["num_member_entities"], 1);
    assert_eq!(
        keys(&w.admin(Method::List, "identity/group/name", json!({}))),
        ["g-ext", "g-int"]
    );
    assert_eq!(
        keys(&w.admin(Method::List, "identity/group-alias/id", json!({}))).len(),
        1
    );

    // Lookups.
    let r = w.admin(
        Method::Post,
        "identity/lookup/entity",
        json!({"name": "e1"}),
    );
    assert_eq!(data(&r)["id"], eid.as_str());
    let r = w.admin(
        Method::Post,
        "identity/lookup/entity",
        json!({"alias_name": "Alice", "alias_mount_accessor": acc}),
    );
    assert_eq!(data(&r)["id"], eid.as_str());
    let r = w.admin(
        Method::Post,
        "identity/lookup/entity",
        json!({"alias_id": aid}),
    );
    assert_eq!(data(&r)["id"], eid.as_str());
    assert_eq!(
        w.admin(
            Method::Post,
            "identity/lookup/entity",
            json!({"name": "zz"})
        )
        .status,
        204
    );
    assert_eq!(
        w.admin(Method::Post, "identity/lookup/entity", json!({}))
            .status,
        400
    );
    let r = w.admin(
        Method::Post,
        "identity/lookup/group",
        json!({"alias_name": "devs", "alias_mount_accessor": acc}),
    );
    assert_eq!(data(&r)["id"], xid.as_str());
    assert_eq!(
        w.admin(Method::Post, "identity/lookup/group", json!({"id": gid}))
            .status,
        200
    );

    // Deleting the entity removes its alias and its place in the internal group.
    assert_eq!(
        w.admin(
            Method::Delete,
            &format!("identity/entity/id/{eid}"),
            json!({})
        )
        .status,
        204
    );
    assert_eq!(
        w.admin(
            Method::Get,
            &format!("identity/entity-alias/id/{aid}"),
            json!({})
        )
        .status,
        404
    );
    let g = ok(w.admin(Method::Get, &format!("identity/group/id/{gid}"), json!({})));
    assert!(g["member_entity_ids"].is_null(), "{g}");
    // Deleting the external group removes its alias.
    assert_eq!(
        w.admin(Method::Delete, "identity/group/name/g-ext", json!({}))
            .status,
        204
    );
    assert_eq!(
        w.admin(Method::List, "identity/group-alias/id", json!({}))
            .status,
        404
    );
}

#[test]
fn a_token_without_the_capability_is_refused() {
    let (mut w, _) = world();
    let r = w.admin(
        Method::Post,
        "auth/token/create",
        json!({"policies": ["default"]}),
    );
    let t = r.body.unwrap()["auth"]["client_token"]
        .as_str()
        .unwrap()
        .to_string();
    let r = w.call(
        Method::Post,
        "identity/entity",
        json!({"name": "x"}),
        Some(&t),
    );
    assert_eq!(r.status, 403);
    assert_eq!(
        w.admin(Method::List, "identity/entity/id", json!({}))
            .status,
        404
    );
}

fn login_token(r: &Response) -> (String, Value) {
    assert_eq!(r.status, 200, "{:?}", r.body);
    let auth = r.body.as_ref().unwrap()["auth"].clone();
    (auth["client_token"].as_str().unwrap().to_string(), auth)
}

#[test]
fn ldap_logins_resolve_one_entity_and_identity_policies() {
    let (mut w, acc) = world();
    // alice's directory groups are Engineers and ops.
    let g = ok(w.admin(
        Method::Post,
        "identity/group",
        json!({"name": "eng-ext", "type": "external", "policies": ["eng-id"]}),
    ));
    let gid = g["id"].as_str().unwrap().to_string();
    ok(w.admin(
        Method::Post,
        "identity/group-alias",
        json!({"name": "engineers", "mount_accessor": acc, "canonical_id": gid}),
    ));
    let (t1, a1) = login_token(&w.login("alice", "alicepw"));
    let eid = a1["entity_id"].as_str().unwrap().to_string();
    assert_eq!(eid.len(), 36, "{a1}");
    assert_eq!(strings(&a1["identity_policies"]), ["eng-id"]);
    assert!(
        strings(&a1["policies"]).contains(&"eng-id".to_string()),
        "{a1}"
    );
    assert!(
        !strings(&a1["token_policies"]).contains(&"eng-id".to_string()),
        "{a1}"
    );
    // The same entity on the next login; one entity and one alias exist.
    let (_, a2) = login_token(&w.login("alice", "alicepw"));
    assert_eq!(a2["entity_id"], eid.as_str());
    assert_eq!(
        keys(&w.admin(Method::List, "identity/entity/id", json!({}))),
        [eid.as_str()]
    );
    let e = ok(w.admin(Method::Get, &format!("identity/entity/id/{eid}"), json!({})));
    assert!(e["name"].as_str().unwrap().starts_with("entity_"), "{e}");
    assert_eq!(e["aliases"][0]["name"], "alice");
    assert_eq!(e["aliases"][0]["mount_accessor"], acc.as_str());
    assert_eq!(strings(&e["group_ids"]), [gid.as_str()]);
    // The external group shows its member.
    let g = ok(w.admin(Method::Get, &format!("identity/group/id/{gid}"), json!({})));
    assert_eq!(strings(&g["member_entity_ids"]), [eid.as_str()]);
    // bob is another entity and not in Engineers.
    let (_, b) = login_token(&w.login("bob", "bobpw"));
    assert_ne!(b["entity_id"], eid.as_str());
    assert!(b.get("identity_policies").is_none(), "{b}");
    // Token lookups show the entity and its identity policies.
    let l = ok(w.call(Method::Get, "auth/token/lookup-self", json!({}), Some(&t1)));
    assert_eq!(l["entity_id"], eid.as_str());
    assert_eq!(strings(&l["identity_policies"]), ["eng-id"]);

    // A policy given to the group later applies to the existing token.
    ok(w.admin(Method::Post, "secret/x", json!({"v": "1"})));
    ok(w.admin(
        Method::Put,
        "sys/policies/acl/reader",
        json!({"policy": "path \"secret/*\" { capabilities = [\"read\"] }"}),
    ));
    assert_eq!(
        w.call(Method::Get, "secret/x", json!({}), Some(&t1)).status,
        403
    );
    let r = w.admin(
        Method::Post,
        &format!("identity/group/id/{gid}"),
        json!({"policies": ["eng-id", "reader"]}),
    );
    assert_eq!(r.status, 204, "{:?}", r.body);
    let r = w.call(Method::Get, "secret/x", json!({}), Some(&t1));
    assert_eq!(r.status, 200, "{:?}", r.body);
    let l = ok(w.call(Method::Get, "auth/token/lookup-self", json!({}), Some(&t1)));
    assert_eq!(strings(&l["identity_policies"]), ["eng-id", "reader"]);

    // An internal group naming the entity gives its policies too.
    ok(w.admin(
        Method::Post,
        "identity/group",
        json!({"name": "int", "policies": ["int-p"], "member_entity_ids": [eid]}),
    ));
    let l = ok(w.call(Method::Get, "auth/token/lookup-self", json!({}), Some(&t1)));
    assert_eq!(
        strings(&l["identity_policies"]),
        ["eng-id", "int-p", "reader"]
    );

    // Renaming the group alias away: the next login leaves the external group.
    let r = w.admin(Method::Post, "identity/lookup/group", json!({"id": gid}));
    let alias_id = data(&r)["alias"]["id"].as_str().unwrap().to_string();
    ok(w.admin(
        Method::Post,
        &format!("identity/group-alias/id/{alias_id}"),
        json!({"name": "nobody-has-this"}),
    ));
    let (_, a3) = login_token(&w.login("alice", "alicepw"));
    assert_eq!(strings(&a3["identity_policies"]), ["int-p"]);
    assert_eq!(
        w.call(Method::Get, "secret/x", json!({}), Some(&t1)).status,
        403
    );

    // A disabled entity's tokens are refused, and so are its logins.
    let r = w.admin(
        Method::Post,
        &format!("identity/entity/id/{eid}"),
        json!({"disabled": true}),
    );
    assert_eq!(r.status, 204, "{:?}", r.body);
    assert_eq!(
        w.call(Method::Get, "auth/token/lookup-self", json!({}), Some(&t1))
            .status,
        403
    );
    assert_eq!(w.login("alice", "alicepw").status, 403);
    ok(w.admin(
        Method::Post,
        &format!("identity/entity/id/{eid}"),
        json!({"disabled": false}),
    ));
    assert_eq!(
        w.call(Method::Get, "auth/token/lookup-self", json!({}), Some(&t1))
            .status,
        200
    );

    // Once the entity is deleted a login creates a new one.
    assert_eq!(
        w.admin(
            Method::Delete,
            &format!("identity/entity/id/{eid}"),
            json!({})
        )
        .status,
        204
    );
    let (_, a4) = login_token(&w.login("alice", "alicepw"));
    assert_ne!(a4["entity_id"], eid.as_str());
    assert_eq!(a4["entity_id"].as_str().unwrap().len(), 36);
}

#[test]
fn auth_mount_accessors_have_the_reference_shape() {
    let (_, acc) = world();
    assert!(acc.starts_with("auth_ldap_"), "{acc}");
    assert_eq!(acc.len(), "auth_ldap_".len() + 8);
}

/// A login on a performance secondary (`local`): the entity, its alias and its external
/// group memberships go to the cluster-local base, read back merged with the replicated one.
#[test]
fn a_perf_secondary_login_writes_the_local_base_and_reads_both() {
    use super::group::{Group, GroupAlias};
    use super::{login, put, put_id, LOCAL, REPLICATED};
    use crate::ctx::Ctx;
    use crate::seal::Barrier;
    use crate::storage::{MemStorage, Txn};
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    let storage = MemStorage::new();
    let mut barrier = Barrier::default();
    barrier.unseal_with([7; 32]);
    let mut rng = ChaCha20Rng::seed_from_u64(9);
    let mut ctx = Ctx {
        txn: Txn::new(&storage),
        barrier: &barrier,
        rng: &mut rng,
        now: 5_000,
    };
    let mount = crate::mounts::MountEntry {
        path: "ldap/".into(),
        kind: "ldap".into(),
        uuid: "u1".into(),
        accessor: "auth_ldap_0000abcd".into(),
        description: String::new(),
        local: false,
        options: serde_json::Map::new(),
        default_lease_ttl: 0,
        max_lease_ttl: 0,
        namespace: String::new(),
    };
    // Replicated from the primary: an external group aliased to the directory group `devs`.
    let g = Group {
        id: "g1".into(),
        name: "devs-ext".into(),
        namespace_id: "root".into(),
        kind: "external".into(),
        policies: vec!["dev-p".into()],
        alias_id: Some("ga1".into()),
        ..Default::default()
    };
    let ga = GroupAlias {
        id: "ga1".into(),
        name: "devs".into(),
        canonical_id: "g1".into(),
        mount_accessor: mount.accessor.clone(),
        namespace_id: "root".into(),
        ..Default::default()
    };
    put(&mut ctx, REPLICATED, "group/g1", &g).unwrap();
    put(&mut ctx, REPLICATED, "group-alias/ga1", &ga).unwrap();
    put_id(
        &mut ctx,
        REPLICATED,
        "group-alias-key/auth_ldap_0000abcd/devs",
        "ga1",
    )
    .unwrap();
    let before = ctx.keys(REPLICATED).unwrap();

    let first = login::resolve(&mut ctx, true, &mount, "alice", &["DEVS".to_string()]).unwrap();
    assert_eq!(first.policies, ["dev-p"]);
    assert!(!first.disabled);
    // Nothing new in the replicated base; entity, name, alias, its indexes, membership local.
    assert_eq!(ctx.keys(REPLICATED).unwrap(), before);
    let local = ctx.keys(LOCAL).unwrap();
    assert_eq!(local.len(), 6, "{local:?}");
    assert!(local.contains(&format!("{LOCAL}member/{}/g1", first.entity_id)));
    let alias = super::entity::alias_by_key(&ctx, &mount.accessor, "alice")
        .unwrap()
        .unwrap();
    assert!(alias.local);
    // The next login finds the same entity; leaving the directory group leaves the group.
    let again = login::resolve(&mut ctx, true, &mount, "alice", &[]).unwrap();
    assert_eq!(again.entity_id, first.entity_id);
    assert!(again.policies.is_empty());
    assert!(!ctx
        .keys(LOCAL)
        .unwrap()
        .contains(&format!("{LOCAL}member/{}/g1", first.entity_id)));
}

/// An alias of another namespace is not named by id through `identity/entity-alias` or
/// `identity/group-alias` (as through `.../id/<id>`): before, a namespace's administrator
/// who knew the id of an alias of the root namespace rewrote it (its name and mount), so
/// the root namespace's entity or group answered to a login of the namespace's own mount.
#[test]
fn an_alias_of_another_namespace_is_not_updated_by_id() {
    let (mut w, root_acc) = world();
    ok(w.admin(Method::Post, "sys/namespaces/ns1", json!({})));
    ok(w.admin(Method::Post, "ns1/sys/auth/ldap", json!({"type": "ldap"})));
    let ns_acc = data(&w.admin(Method::Get, "ns1/sys/auth", json!({})))["ldap/"]["accessor"]
        .as_str()
        .unwrap()
        .to_string();
    let e = ok(w.admin(Method::Post, "identity/entity", json!({"name": "victim"})))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let ea = ok(w.admin(
        Method::Post,
        "identity/entity-alias",
        json!({"name": "victim", "mount_accessor": root_acc, "canonical_id": e}),
    ))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let g = ok(w.admin(
        Method::Post,
        "identity/group",
        json!({"name": "rg", "type": "external"}),
    ))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let ga = ok(w.admin(
        Method::Post,
        "identity/group-alias",
        json!({"name": "admins", "mount_accessor": root_acc, "canonical_id": g}),
    ))["id"]
        .as_str()
        .unwrap()
        .to_string();
    // The namespace's administrator: every capability, in ns1 only.
    ok(w.admin(
        Method::Put,
        "ns1/sys/policies/acl/nsadmin",
        json!({"policy": r#"path "*" { capabilities = ["create", "read", "update", "delete", "list", "sudo"] }"#}),
    ));
    let r = w.admin(
        Method::Post,
        "ns1/auth/token/create",
        json!({"policies": ["nsadmin"]}),
    );
    let t = r.body.as_ref().unwrap()["auth"]["client_token"]
        .as_str()
        .unwrap()
        .to_string();
    for (path, id, want) in [
        ("identity/entity-alias", &ea, "invalid alias ID"),
        ("identity/group-alias", &ga, "invalid group alias ID"),
    ] {
        // The token acts in ns1: the path names the namespace.
        let r = w.call(
            Method::Post,
            &format!("ns1/{path}"),
            json!({"id": id, "name": "mallory", "mount_accessor": ns_acc}),
            Some(&t),
        );
        assert_eq!(r.status, 400, "{path}: {:?}", r.body);
        assert_eq!(
            r.body.as_ref().unwrap()["errors"][0],
            want,
            "{path}: {:?}",
            r.body
        );
    }
    let a = ok(w.admin(
        Method::Get,
        &format!("identity/entity-alias/id/{ea}"),
        json!({}),
    ));
    assert_eq!(
        (a["name"].as_str(), a["mount_accessor"].as_str()),
        (Some("victim"), Some(root_acc.as_str()))
    );
    let a = ok(w.admin(
        Method::Get,
        &format!("identity/group-alias/id/{ga}"),
        json!({}),
    ));
    assert_eq!(
        (a["name"].as_str(), a["mount_accessor"].as_str()),
        (Some("admins"), Some(root_acc.as_str()))
    );
}

/// An entity or group never holds the `root` policy (in any spelling): the router adds
/// their policies to their tokens' at every request, and before, an entity given `root`
/// by anyone allowed to write `identity/` made every token of it a root token (as the
/// reference, `policies cannot contain root`).
#[test]
fn entities_and_groups_never_hold_the_root_policy() {
    let (mut w, _) = world();
    for (path, body) in [
        (
            "identity/entity",
            json!({"name": "e1", "policies": ["p1", "root"]}),
        ),
        (
            "identity/entity",
            json!({"name": "e1", "policies": "p1,ROOT"}),
        ),
        ("identity/entity/name/e2", json!({"policies": [" root"]})),
        (
            "identity/group",
            json!({"name": "g1", "policies": ["root"]}),
        ),
        ("identity/group/name/g2", json!({"policies": ["Root"]})),
    ] {
        let r = w.admin(Method::Post, path, body.clone());
        assert_eq!(r.status, 400, "{path} {body}: {:?}", r.body);
        assert_eq!(
            r.body.as_ref().unwrap()["errors"][0],
            "policies cannot contain root",
            "{path} {body}"
        );
    }
    // Nothing was created, and other policies are taken.
    let r = w.admin(Method::Get, "identity/entity/name/e1", json!({}));
    assert_eq!(r.status, 404, "{:?}", r.body);
    let e = ok(w.admin(
        Method::Post,
        "identity/entity",
        json!({"name": "e1", "policies": ["p1", "rooted"]}),
    ));
    let e = ok(w.admin(
        Method::Get,
        &format!("identity/entity/id/{}", e["id"].as_str().unwrap()),
        json!({}),
    ));
    assert_eq!(strings(&e["policies"]), ["p1", "rooted"]);
}
