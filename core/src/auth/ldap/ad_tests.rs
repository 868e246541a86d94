//! Active Directory logins against the fake directory in its AD mode: UPN binds, groups
//! from `memberOf`, from the in-chain matching rule and from `tokenGroups`, and the
//! reasons behind refused binds.

use super::config::LdapConfig;
use super::fake::FakeDirectory;
use super::login::{Job, Login, USER_BIND_FAILED};
use super::ops::{LdapCall, LdapOp, Scope};
use crate::api::{body_object, ApiError, Fields};
use crate::mounts::MountEntry;
use serde_json::{json, Value};

const BASE: &str = "DC=cairn,DC=test";
const DOMAIN_SID: &str = "S-1-5-21-1004336348-1177238915-682003330";

/// A small domain: alice in eng, eng nested in all-staff, bob in ops, carol disabled,
/// dave must change password, a service account.
pub fn ad_directory() -> FakeDirectory {
    let mut d = FakeDirectory::new();
    d.active_directory = true;
    d.add(BASE, &[("objectClass", &["domain"])]);
    d.add(
        "CN=Users,DC=cairn,DC=test",
        &[("objectClass", &["container"])],
    );
    let user = |d: &mut FakeDirectory, name: &str, pw: &str, state: Option<&str>| {
        let dn = format!("CN={name},CN=Users,{BASE}");
        let upn = format!("{name}@cairn.test");
        let upn = upn.as_str();
        let mut attrs: Vec<(&str, &[&str])> = vec![
            ("objectClass", &["user"]),
            ("sAMAccountName", std::slice::from_ref(&name)),
            ("userPrincipalName", std::slice::from_ref(&upn)),
            ("userPassword", std::slice::from_ref(&pw)),
        ];
        let st;
        if let Some(s) = state {
            st = [s];
            attrs.push(("cairnAdState", &st));
        }
        d.add(&dn, &attrs);
    };
    user(&mut d, "alice", "Alice-Pass1!", None);
    user(&mut d, "bob", "Bob-Pass1!", None);
    user(&mut d, "carol", "Carol-Pass1!", Some("533"));
    user(&mut d, "dave", "Dave-Pass1!", Some("773"));
    user(&mut d, "svc", "Svc-Pass1!", None);
    let group = |d: &mut FakeDirectory, name: &str, rid: u32, members: &[&str]| {
        let sid = format!("{DOMAIN_SID}-{rid}");
        let members: Vec<String> = members
            .iter()
            .map(|m| format!("CN={m},CN=Users,{BASE}"))
            .collect();
        let members: Vec<&str> = members.iter().map(String::as_str).collect();
        d.add(
            &format!("CN={name},CN=Users,{BASE}"),
            &[
                ("objectClass", &["group"]),
                ("cn", &[name]),
                ("objectSid", &[sid.as_str()]),
                ("member", &members),
            ],
        );
    };
    group(&mut d, "eng", 1101, &["alice"]);
    group(&mut d, "ops", 1102, &["bob"]);
    group(&mut d, "all-staff", 1103, &["eng"]);
    group(
        &mut d,
        "Domain Users",
        513,
        &["alice", "bob", "carol", "dave", "svc"],
    );
    d
}

fn mount() -> MountEntry {
    serde_json::from_value(json!({
        "path": "ldap/", "type": "ldap", "description": "", "uuid": "u",
        "accessor": "a", "local": false,
    }))
    .unwrap()
}

fn run(
    dir: &mut FakeDirectory,
    cfg: Value,
    user: &str,
    pw: &str,
) -> (Login, Result<Vec<String>, ApiError>) {
    let body = body_object(&serde_json::to_vec(&cfg).unwrap()).unwrap();
    let mut c = LdapConfig::default();
    c.apply(&Fields(&body)).unwrap();
    c.validate().unwrap();
    let (login, first) = Login::start(1, mount(), c, user, pw, 7, "");
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
    let r = job.outcome.take().unwrap().map(|f| f.groups);
    (job.login, r)
}

fn upn_config() -> Value {
    json!({
        "url": "ldaps://dc1.cairn.test",
        "upndomain": "cairn.test",
        "userdn": "CN=Users,DC=cairn,DC=test",
        "userattr": "userPrincipalName",
        "groupdn": BASE,
    })
}

#[test]
fn token_groups_give_nested_groups_through_a_base_search_and_one_sid_search() {
    let mut d = ad_directory();
    let mut c = upn_config();
    c["use_token_groups"] = json!(true);
    let (_, r) = run(&mut d, c.clone(), "alice", "Alice-Pass1!");
    assert_eq!(r.unwrap(), ["Domain Users", "all-staff", "eng"]);
    let searches: Vec<_> = d
        .log
        .iter()
        .filter_map(|c| match &c.op {
            LdapOp::Search(s) => Some(s.clone()),
            _ => None,
        })
        .collect();
    let tg = searches
        .iter()
        .find(|s| s.attrs.iter().any(|a| a == "tokenGroups"))
        .unwrap();
    assert_eq!(tg.scope, Scope::Base);
    assert_eq!(tg.base, "CN=alice,CN=Users,DC=cairn,DC=test");
    let last = searches.last().unwrap();
    assert!(
        last.filter
            .contains(&format!("(objectSid={DOMAIN_SID}-1103)")),
        "{}",
        last.filter
    );
    // With a service identity (discoverdn-style search) the same groups.
    let mut d = ad_directory();
    c["binddn"] = json!("svc@cairn.test");
    c["bindpass"] = json!("Svc-Pass1!");
    c["userattr"] = json!("sAMAccountName");
    c["upndomain"] = json!("");
    c["userfilter"] = json!("(&(objectClass=user)({{.UserAttr}}={{.Username}}))");
    let (_, r) = run(&mut d, c, "bob", "Bob-Pass1!");
    assert_eq!(r.unwrap(), ["Domain Users", "ops"]);
}

#[test]
fn the_in_chain_rule_follows_nested_groups_and_member_of_does_not() {
    let mut d = ad_directory();
    let mut c = upn_config();
    c["groupfilter"] = json!("(&(objectClass=group)(member:1.2.840.113556.1.4.1941:={{.UserDN}}))");
    let (_, r) = run(&mut d, c.clone(), "alice", "Alice-Pass1!");
    assert_eq!(r.unwrap(), ["Domain Users", "all-staff", "eng"]);
    // The plain `member` filter: direct groups only.
    c["groupfilter"] = json!("(&(objectClass=group)(member={{.UserDN}}))");
    let (_, r) = run(&mut d, c.clone(), "alice", "Alice-Pass1!");
    assert_eq!(r.unwrap(), ["Domain Users", "eng"]);
    // memberOf on the user entry, as AD admins write it.
    c["groupfilter"] = json!("(&(objectClass=user)(userPrincipalName={{.Username}}@cairn.test))");
    c["groupattr"] = json!("memberOf");
    c["groupdn"] = json!("CN=Users,DC=cairn,DC=test");
    let (_, r) = run(&mut d, c, "alice", "Alice-Pass1!");
    assert_eq!(r.unwrap(), ["Domain Users", "eng"]);
}

#[test]
fn ad_refusals_keep_one_answer_and_name_the_reason() {
    let cases = [
        (
            "alice",
            "wrong",
            "invalid credentials (wrong password or unknown user) (AD data 52e)",
        ),
        ("carol", "Carol-Pass1!", "account disabled (AD data 533)"),
        (
            "dave",
            "Dave-Pass1!",
            "user must change password (AD data 773)",
        ),
        // A wrong password on a must-change account is 52e, as in AD.
        (
            "dave",
            "nope",
            "invalid credentials (wrong password or unknown user) (AD data 52e)",
        ),
    ];
    for (user, pw, reason) in cases {
        let mut d = ad_directory();
        let (l, r) = run(&mut d, upn_config(), user, pw);
        let e = r.unwrap_err();
        assert_eq!(e.to_string(), USER_BIND_FAILED, "{user}");
        assert_eq!(e.status(), 400);
        assert!(l.bad_credentials);
        assert_eq!(l.directory_reason.as_deref(), Some(reason), "{user}");
    }
    // An OpenLDAP-style refusal has no reason.
    let mut d = ad_directory();
    d.active_directory = false;
    let (l, r) = run(&mut d, upn_config(), "alice", "wrong");
    assert_eq!(r.unwrap_err().to_string(), USER_BIND_FAILED);
    assert_eq!(l.directory_reason, None);
}

#[test]
fn token_groups_refuse_a_subtree_search_like_ad() {
    let mut d = ad_directory();
    d.add(
        "CN=x,DC=cairn,DC=test",
        &[("objectClass", &["user"]), ("userPassword", &["p"])],
    );
    d.answer(&LdapCall {
        op_id: 0,
        conn: 1,
        op: LdapOp::Connect(LdapConfig::default().connect_spec()),
        close_after: false,
    });
    d.answer(&LdapCall {
        op_id: 1,
        conn: 1,
        op: LdapOp::Bind {
            dn: "CN=x,DC=cairn,DC=test".into(),
            password: super::ops::Secret::new("p"),
        },
        close_after: false,
    });
    let r = d.answer(&LdapCall {
        op_id: 2,
        conn: 1,
        op: LdapOp::Search(super::ops::SearchSpec {
            base: BASE.into(),
            scope: Scope::Sub,
            filter: "(objectClass=*)".into(),
            attrs: vec!["tokenGroups".into()],
            deref: super::ops::Deref::Never,
            page_size: 0,
        }),
        close_after: false,
    });
    assert_eq!(r.result.unwrap_err().code, Some(1));
}

#[test]
fn a_lookup_for_a_renewal_reads_token_groups_as_the_service_identity() {
    let mut d = ad_directory();
    let body = body_object(
        &serde_json::to_vec(&json!({
            "url": "ldaps://dc1.cairn.test",
            "binddn": "svc@cairn.test",
            "bindpass": "Svc-Pass1!",
            "userdn": "CN=Users,DC=cairn,DC=test",
            "userattr": "sAMAccountName",
            "groupdn": BASE,
            "use_token_groups": true,
        }))
        .unwrap(),
    )
    .unwrap();
    let mut c = LdapConfig::default();
    c.apply(&Fields(&body)).unwrap();
    let (login, first) = Login::lookup(1, mount(), c, "alice", 7);
    let mut job = Job {
        login,
        first,
        outcome: None,
    };
    job.run(|op, close_after| {
        d.answer(&LdapCall {
            op_id: 1,
            conn: 7,
            op: op.clone(),
            close_after,
        })
        .result
    });
    let found = job.outcome.unwrap().unwrap();
    assert_eq!(found.groups, ["Domain Users", "all-staff", "eng"]);
    // No bind as alice: the service identity did everything.
    assert!(!d.log.iter().any(
        |c| matches!(&c.op, LdapOp::Bind { dn, .. } | LdapOp::CheckBind { dn, .. } if dn.contains("alice"))
    ));
}
