//! Renewal tests: an LDAP token's renewal looks the user's groups up again and refuses
//! when the policies they grant changed; without a bind DN it is a plain renewal.

use super::tests::{authenticated_search, error, policies, World};
use super::*;
use crate::Response;

fn token_of(r: &Response) -> String {
    r.body.as_ref().unwrap()["auth"]["client_token"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn renewal_rechecks_groups_and_refuses_changed_policies() {
    let mut w = World::new();
    w.configure(authenticated_search());
    w.admin(
        Method::Post,
        "auth/ldap/groups/engineers",
        json!({"policies": "eng"}),
    );
    let r = w.login("alice", "alicepw");
    assert_eq!(r.status, 200);
    let t = token_of(&r);
    let n = w.dir.log.len();
    w.now += 10_000;
    let r = w.call(Method::Post, "auth/token/renew-self", json!({}), Some(&t));
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body.as_ref().unwrap()["auth"]["client_token"], t);
    assert_eq!(policies(&r), vec!["default", "eng"]);
    // The look-up ran as the service identity: no bind with the user's password.
    let ops: Vec<String> = w.dir.log[n..]
        .iter()
        .map(|c| match &c.op {
            LdapOp::Connect(_) => "connect".to_string(),
            LdapOp::Bind { dn, .. } => format!("bind {dn}"),
            LdapOp::Search(s) => format!("search {}", s.base),
            _ => "other".into(),
        })
        .collect();
    assert_eq!(
        ops,
        [
            "connect",
            "bind cn=admin,dc=example,dc=org",
            "search ou=people,dc=example,dc=org",
            "search ou=groups,dc=example,dc=org"
        ]
    );
    assert_eq!(w.dir.open_connections(), 0);
    // Removed from the group in the directory: the policy set changed, no renewal.
    w.dir.add(
        "cn=Engineers,ou=groups,dc=example,dc=org",
        &[("objectClass", &["groupOfNames"]), ("cn", &["Engineers"])],
    );
    let r = w.call(Method::Post, "auth/token/renew-self", json!({}), Some(&t));
    assert_eq!(r.status, 400);
    assert_eq!(error(&r), "policies have changed, not renewing");
    // A mapping change does the same; mapping the new set back allows it again.
    w.admin(
        Method::Post,
        "auth/ldap/users/alice",
        json!({"policies": "eng"}),
    );
    let root = w.root.clone();
    let r = w.call(
        Method::Post,
        "auth/token/renew",
        json!({ "token": t }),
        Some(&root),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    w.admin(
        Method::Post,
        "auth/ldap/users/alice",
        json!({"policies": "eng,more"}),
    );
    let r = w.call(
        Method::Post,
        "auth/token/renew",
        json!({ "token": t }),
        Some(&root),
    );
    assert_eq!(r.status, 400);
    assert_eq!(error(&r), "policies have changed, not renewing");
    // A user gone from the directory is not renewed.
    w.admin(
        Method::Post,
        "auth/ldap/users/alice",
        json!({"policies": "eng"}),
    );
    w.configure(json!({"userdn": "ou=groups,dc=example,dc=org"}));
    let r = w.call(Method::Post, "auth/token/renew-self", json!({}), Some(&t));
    assert_eq!(r.status, 400);
    assert!(error(&r).contains("no longer found"), "{}", error(&r));
    // Token store errors are unchanged.
    let r = w.call(
        Method::Post,
        "auth/token/renew",
        json!({ "token": "nope" }),
        Some(&root),
    );
    assert_eq!(r.status, 400);
    assert_eq!(error(&r), "bad token");
}

#[test]
fn renewal_without_binddn_is_a_plain_renewal() {
    let mut w = World::new();
    w.configure(json!({
        "url": "ldap://dir.example",
        "userdn": "ou=people,dc=example,dc=org",
        "userattr": "uid",
        "groupdn": "ou=groups,dc=example,dc=org",
    }));
    let r = w.login("alice", "alicepw");
    assert_eq!(r.status, 200);
    let t = token_of(&r);
    let n = w.dir.log.len();
    let r = w.call(Method::Post, "auth/token/renew-self", json!({}), Some(&t));
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(w.dir.log.len(), n, "no directory look-up");
}
