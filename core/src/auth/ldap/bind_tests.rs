//! Bind tests: which directory operations a login makes, when a pooled connection may be
//! used again (only left bound as the service identity), and an unknown user binding like
//! a wrong password.

use super::fake::FakeDirectory;
use super::tests::{authenticated_search, directory, error, World};
use super::*;

fn run_directly(dir: &mut FakeDirectory, cfg: Value, user: &str, pw: &str) -> Login {
    let body = crate::api::body_object(&serde_json::to_vec(&cfg).unwrap()).unwrap();
    let mut c = config::LdapConfig::default();
    c.apply(&Fields(&body)).unwrap();
    let m = MountEntry {
        path: "ldap/".into(),
        kind: "ldap".into(),
        description: String::new(),
        uuid: "u".into(),
        accessor: "a".into(),
        local: false,
        options: Default::default(),
        default_lease_ttl: 0,
        max_lease_ttl: 0,
        namespace: String::new(),
    };
    let (login, first) = Login::start(1, m, c, user, pw, 7, "");
    let mut job = Job {
        login,
        first,
        outcome: None,
    };
    job.run(|op, close_after| {
        dir.answer(&LdapCall {
            op_id: 1,
            conn: 7,
            op: op.clone(),
            close_after,
        })
        .result
    });
    job.login
}

#[test]
fn a_connection_is_reusable_only_when_left_bound_as_the_service_identity() {
    let mut d = directory();
    // Authenticated search: starts bound as binddn and stays so (the user's password is
    // checked on a connection of its own).
    let l = run_directly(&mut d, authenticated_search(), "alice", "alicepw");
    assert!(l.reusable());
    assert!(d
        .log
        .iter()
        .any(|c| matches!(&c.op, LdapOp::CheckBind { dn, .. } if dn.starts_with("uid=alice"))));
    assert!(!d
        .log
        .iter()
        .any(|c| matches!(&c.op, LdapOp::Bind { dn, .. } if dn.starts_with("uid=alice"))));
    // Unknown user: still bound as binddn.
    let l = run_directly(&mut d, authenticated_search(), "nobody", "x");
    assert!(l.reusable());
    // A refused password does not touch the service connection either.
    let l = run_directly(&mut d, authenticated_search(), "alice", "wrong");
    assert!(l.reusable());
    // Anonymous group search ends bound anonymously.
    let mut c = authenticated_search();
    c["anonymous_group_search"] = json!(true);
    d.anonymous_search = true;
    let l = run_directly(&mut d, c, "alice", "alicepw");
    assert!(!l.reusable());
    // No service identity: bound as the user.
    let c = json!({
        "url": "ldap://dir.example",
        "userdn": "ou=people,dc=example,dc=org",
        "userattr": "uid",
        "groupdn": "ou=groups,dc=example,dc=org",
    });
    let l = run_directly(&mut d, c, "alice", "alicepw");
    assert!(!l.reusable());
    // A connection that broke is never reused.
    d.dead_urls.insert("ldap://dir.example:389".into());
    let l = run_directly(&mut d, authenticated_search(), "alice", "alicepw");
    assert!(!l.reusable());
}

/// The kind of each logged operation, with the DN of binds.
fn ops(dir: &FakeDirectory) -> Vec<String> {
    dir.log
        .iter()
        .map(|c| match &c.op {
            LdapOp::Connect(_) => "connect".to_string(),
            LdapOp::Bind { dn, .. } => format!("bind {dn}"),
            LdapOp::CheckBind { dn, .. } => format!("check bind {dn}"),
            LdapOp::Search(_) => "search".to_string(),
            LdapOp::Close => "close".to_string(),
            LdapOp::Run(_) | LdapOp::ConnectBound { .. } => "not logged".to_string(),
        })
        .collect()
}

pub(super) fn token_keys(w: &World) -> usize {
    w.node
        .storage()
        .map
        .keys()
        .filter(|k| k.contains("sys/token/id/"))
        .count()
}

#[test]
fn an_unknown_user_binds_like_a_wrong_password_and_gets_its_answer() {
    let dummy = format!("{},ou=people,dc=example,dc=org", login::DUMMY_RDN);
    // Authenticated search: the password is checked aside, the unknown user's too.
    let mut w = World::new();
    w.configure(authenticated_search());
    w.dir.log.clear();
    let wrong = w.login("alice", "wrong");
    let wrong_ops = ops(&w.dir);
    w.dir.log.clear();
    let unknown = w.login("nobody", "wrong");
    let unknown_ops = ops(&w.dir);
    assert_eq!(unknown.status, wrong.status);
    assert_eq!(unknown.body, wrong.body);
    assert_eq!(error(&unknown), login::USER_BIND_FAILED);
    assert_eq!(
        wrong_ops,
        [
            "connect",
            "bind cn=admin,dc=example,dc=org",
            "search",
            "check bind uid=alice,ou=people,dc=example,dc=org",
        ]
    );
    assert_eq!(
        unknown_ops,
        [
            "connect",
            "bind cn=admin,dc=example,dc=org",
            "search",
            &format!("check bind {dummy}"),
        ]
    );
    // The dummy bind carries the password the client gave.
    assert!(w.dir.log.iter().any(|c| matches!(
        &c.op,
        LdapOp::CheckBind { dn, password, .. } if *dn == dummy && password.expose() == "wrong"
    )));
    // The machine's own outcome is the same error, and both count as bad credentials.
    let mut d = directory();
    let a = run_directly(&mut d, authenticated_search(), "alice", "wrong");
    let b = run_directly(&mut d, authenticated_search(), "nobody", "wrong");
    assert!(a.bad_credentials && b.bad_credentials);
    assert!(b.entry_alias().is_none());
    assert_eq!(a.entry_alias(), Some("alice"));

    // Search without a service identity: the user bind happens on the connection itself.
    let mut w = World::new();
    w.dir.anonymous_search = true;
    w.configure(json!({
        "url": "ldap://dir.example",
        "discoverdn": true,
        "userdn": "ou=people,dc=example,dc=org",
        "userattr": "uid",
    }));
    let wrong = w.login("bob", "wrong");
    w.dir.log.clear();
    let unknown = w.login("nobody", "wrong");
    assert_eq!(unknown.body, wrong.body);
    assert_eq!(ops(&w.dir), ["connect", "search", &format!("bind {dummy}")]);
    // A DN that names no entry is refused by the directory however it is asked.
    let mut d = directory();
    let r = d.answer(&LdapCall {
        op_id: 1,
        conn: 1,
        op: LdapOp::Connect(config::LdapConfig::default().connect_spec()),
        close_after: false,
    });
    assert!(r.result.is_ok());
    let r = d.answer(&LdapCall {
        op_id: 2,
        conn: 1,
        op: LdapOp::Bind {
            dn: dummy.clone(),
            password: Secret::new("anything"),
        },
        close_after: false,
    });
    assert_eq!(r.result.unwrap_err().kind, FailKind::InvalidCredentials);
}
