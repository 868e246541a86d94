//! End-to-end test of the identity store with a real directory: a real `cairn` dev server,
//! a real OpenLDAP slapd (`scripts/dev-ldap.sh`, sample directory in `scripts/ldap/`). An
//! LDAP login creates the user's entity once; an external identity group whose alias is
//! named after the user's directory group gives the token `identity_policies`, which the
//! ACL applies at request time (a policy added to the group later reaches an existing
//! token); a disabled entity's token is refused.

use cairn_tests::{Resp, Server};
use serde_json::{json, Value};

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn ok(r: Resp, what: &str) -> Value {
    assert!(r.status < 300, "{what}: {} {}", r.status, r.body);
    r.body["data"].clone()
}

#[test]
fn an_ldap_login_gets_its_entity_and_the_policies_of_its_directory_groups() {
    let d = cairn_tests::start_dev_ldap("identity");
    let get = |k: &str| {
        d.get(k)
            .cloned()
            .unwrap_or_else(|| panic!("dev-ldap.sh did not export {k}"))
    };
    let base = get("CAIRN_LDAP_BASE");
    let s = Server::dev();
    let r = s.post(
        "auth/ldap/config",
        json!({
            "url": get("CAIRN_LDAP_URL"),
            "binddn": get("CAIRN_LDAP_BINDDN"),
            "bindpass": get("CAIRN_LDAP_BINDPASS"),
            "userdn": format!("ou=people,{base}"),
            "userattr": "uid",
            "groupdn": format!("ou=groups,{base}"),
        }),
    );
    assert_eq!(r.status, 204, "{}", r.body);
    let auths = ok(s.get("sys/auth"), "sys/auth");
    let accessor = auths["ldap/"]["accessor"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(accessor.starts_with("auth_ldap_"), "{accessor}");

    // alice is in the directory group `engineers`.
    let g = ok(
        s.post(
            "identity/group",
            json!({"name": "eng", "type": "external", "policies": ["eng-id"]}),
        ),
        "external group",
    );
    let gid = g["id"].as_str().unwrap_or_default().to_string();
    ok(
        s.post(
            "identity/group-alias",
            json!({"name": "engineers", "mount_accessor": accessor, "canonical_id": gid}),
        ),
        "group alias",
    );
    let r = s.put(
        "sys/policies/acl/eng-id",
        json!({"policy": "path \"secret/eng/*\" { capabilities = [\"read\"] }"}),
    );
    assert_eq!(r.status, 204, "{}", r.body);
    let r = s.put(
        "sys/policies/acl/eng-write",
        json!({"policy": "path \"secret/eng/*\" { capabilities = [\"create\", \"update\"] }"}),
    );
    assert_eq!(r.status, 204, "{}", r.body);
    assert_eq!(s.put("secret/eng/doc", json!({"v": "1"})).status, 204);

    let login = |user: &str, pw: &str| {
        s.call_as(
            None,
            "POST",
            &format!("auth/ldap/login/{user}"),
            Some(json!({ "password": pw })),
        )
    };
    let r = login("alice", "alice-pw");
    assert_eq!(r.status, 200, "{}", r.body);
    let auth = r.body["auth"].clone();
    let token = auth["client_token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let eid = auth["entity_id"].as_str().unwrap_or_default().to_string();
    assert_eq!(eid.len(), 36, "{auth}");
    assert_eq!(strings(&auth["identity_policies"]), ["eng-id"]);
    assert!(strings(&auth["policies"]).contains(&"eng-id".to_string()));
    // The same entity at the next login.
    let r = login("alice", "alice-pw");
    assert_eq!(r.body["auth"]["entity_id"], eid.as_str(), "{}", r.body);
    let e = ok(
        s.post(
            "identity/lookup/entity",
            json!({"alias_name": "alice", "alias_mount_accessor": accessor}),
        ),
        "lookup",
    );
    assert_eq!(e["id"], eid.as_str());
    assert_eq!(strings(&e["group_ids"]), [gid.as_str()]);

    // The identity policy is applied: reading works, writing does not yet.
    let read = s.call_as(Some(&token), "GET", "secret/eng/doc", None);
    assert_eq!(read.status, 200, "{}", read.body);
    assert_eq!(read.body["data"]["v"], "1");
    let write = |v: &str| {
        s.call_as(
            Some(&token),
            "PUT",
            "secret/eng/doc",
            Some(json!({ "v": v })),
        )
    };
    assert_eq!(write("2").status, 403);
    // A policy added to the group later applies to the token issued before.
    let r = s.post(
        &format!("identity/group/id/{gid}"),
        json!({"policies": ["eng-id", "eng-write"]}),
    );
    assert_eq!(r.status, 204, "{}", r.body);
    assert_eq!(write("2").status, 204);
    let me = ok(
        s.call_as(Some(&token), "GET", "auth/token/lookup-self", None),
        "lookup-self",
    );
    assert_eq!(me["entity_id"], eid.as_str());
    assert_eq!(strings(&me["identity_policies"]), ["eng-id", "eng-write"]);

    // bob is not in `engineers`: his own entity, no identity policies.
    let r = login("bob", "bob-pw");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_ne!(r.body["auth"]["entity_id"], eid.as_str());
    assert!(
        r.body["auth"].get("identity_policies").is_none(),
        "{}",
        r.body
    );

    // A disabled entity's token is refused.
    let r = s.post(
        &format!("identity/entity/id/{eid}"),
        json!({"disabled": true}),
    );
    assert_eq!(r.status, 204, "{}", r.body);
    assert_eq!(
        s.call_as(Some(&token), "GET", "secret/eng/doc", None)
            .status,
        403
    );
}
