//! Login and mapping tests: a whole node driven through the API, its LDAP calls answered
//! by the fake directory (no I/O). Binds, lockout and renewal have files of their own
//! (`bind_tests`, `lockout_tests`, `renew_tests`); this one holds the shared `World`.

use super::bind_tests::token_keys;
use super::fake::FakeDirectory;
use super::*;
use crate::node::{Admin, AdminResult, Input, Node, NodeConfig};
use crate::storage::MemStorage;
use crate::Response;

pub(crate) struct World {
    pub(crate) node: Node<MemStorage>,
    pub(super) dir: FakeDirectory,
    pub(super) root: String,
    next_id: u64,
    pub(super) now: u64,
    /// Every audit line the node wrote.
    audit: Vec<String>,
    /// The client address of the requests sent.
    pub(super) remote_addr: String,
}

const BASE: &str = "dc=example,dc=org";

pub(super) fn directory() -> FakeDirectory {
    let mut d = FakeDirectory::new();
    d.add(BASE, &[("objectClass", &["dcObject", "organization"])]);
    d.add(
        "cn=admin,dc=example,dc=org",
        &[
            ("objectClass", &["person"]),
            ("cn", &["admin"]),
            ("userPassword", &["adminpw"]),
        ],
    );
    d.add(
        "ou=people,dc=example,dc=org",
        &[("objectClass", &["organizationalUnit"])],
    );
    d.add(
        "ou=groups,dc=example,dc=org",
        &[("objectClass", &["organizationalUnit"])],
    );
    d.add(
        "uid=alice,ou=people,dc=example,dc=org",
        &[
            ("objectClass", &["inetOrgPerson"]),
            ("uid", &["alice"]),
            ("cn", &["Alice Liddell"]),
            ("userPassword", &["alicepw"]),
            ("userPrincipalName", &["alice@example.org"]),
            (
                "memberOf",
                &[
                    "cn=Engineers,ou=groups,dc=example,dc=org",
                    "cn=ops,ou=groups,dc=example,dc=org",
                ],
            ),
        ],
    );
    d.add(
        "uid=bob,ou=people,dc=example,dc=org",
        &[
            ("objectClass", &["inetOrgPerson"]),
            ("uid", &["bob"]),
            ("cn", &["Bob"]),
            ("userPassword", &["bobpw"]),
        ],
    );
    d.add(
        "uid=o'brien\\, jr\\+x\\#\\=\\\\*,ou=people,dc=example,dc=org",
        &[
            ("objectClass", &["inetOrgPerson"]),
            ("uid", &["o'brien, jr+x#=\\*"]),
            ("userPassword", &["obpw"]),
        ],
    );
    d.add(
        "cn=Engineers,ou=groups,dc=example,dc=org",
        &[
            ("objectClass", &["groupOfNames"]),
            ("cn", &["Engineers"]),
            ("member", &["uid=alice,ou=people,dc=example,dc=org"]),
        ],
    );
    d.add(
        "cn=ops,ou=groups,dc=example,dc=org",
        &[
            ("objectClass", &["groupOfUniqueNames"]),
            ("cn", &["ops"]),
            (
                "uniqueMember",
                &[
                    "uid=alice,ou=people,dc=example,dc=org",
                    "uid=bob,ou=people,dc=example,dc=org",
                ],
            ),
        ],
    );
    d.add(
        "cn=posix,ou=groups,dc=example,dc=org",
        &[
            ("objectClass", &["posixGroup"]),
            ("cn", &["posix"]),
            ("memberUid", &["bob", "o'brien, jr+x#=\\*"]),
        ],
    );
    d
}

impl World {
    pub(crate) fn new() -> World {
        let mut node = Node::new(MemStorage::new(), [7; 32], NodeConfig::default());
        node.handle(
            1_000,
            Input::Admin {
                id: 1,
                cmd: Admin::DevSetup {
                    root_token_id: None,
                },
            },
        );
        let mut root = String::new();
        while let Some(o) = node.poll_output() {
            if let Output::AdminDone {
                result: Ok(AdminResult::DevSetup(k)),
                ..
            } = o
            {
                root = k.root_token;
            }
        }
        World {
            node,
            dir: directory(),
            root,
            next_id: 100,
            now: 2_000,
            audit: Vec::new(),
            remote_addr: "127.0.0.1:4000".into(),
        }
    }

    /// Sends a request and pumps LDAP calls through the fake until its response.
    pub(crate) fn call(
        &mut self,
        method: Method,
        path: &str,
        body: Value,
        token: Option<&str>,
    ) -> Response {
        self.next_id += 1;
        let id = self.next_id;
        let mut req = Request::new(id, method, path).with_json(body);
        req.remote_addr = self.remote_addr.clone();
        if let Some(t) = token {
            req = req.with_token(t);
        }
        self.node.handle(self.now, Input::Request(req));
        loop {
            let mut replies = Vec::new();
            let mut response = None;
            while let Some(o) = self.node.poll_output() {
                match o {
                    Output::Response(r) if r.id == id => response = Some(r),
                    Output::Ldap(c) => replies.push(Input::Ldap(self.dir.answer(&c))),
                    // Audit files "open" and take every line.
                    Output::AuditProbe { id, .. } => {
                        replies.push(Input::AuditProbed { id, result: Ok(()) })
                    }
                    Output::Audit { line, .. } => self.audit.push(line),
                    _ => {}
                }
            }
            if replies.is_empty() {
                return response.unwrap_or_else(|| panic!("no response for {path}"));
            }
            for r in replies {
                self.node.handle(self.now, r);
            }
            if let Some(r) = response {
                // Drain the close calls too.
                while let Some(o) = self.node.poll_output() {
                    match o {
                        Output::Ldap(c) => {
                            let rep = self.dir.answer(&c);
                            self.node.handle(self.now, Input::Ldap(rep));
                        }
                        Output::Audit { line, .. } => self.audit.push(line),
                        _ => {}
                    }
                }
                return r;
            }
        }
    }

    pub(crate) fn admin(&mut self, method: Method, path: &str, body: Value) -> Response {
        let root = self.root.clone();
        self.call(method, path, body, Some(&root))
    }

    pub(crate) fn configure(&mut self, body: Value) {
        let r = self.admin(Method::Post, "auth/ldap/config", body);
        assert!(r.status == 204 || r.status == 200, "{:?}", r.body);
    }

    pub(crate) fn login(&mut self, user: &str, pw: &str) -> Response {
        self.call(
            Method::Post,
            &format!("auth/ldap/login/{user}"),
            json!({ "password": pw }),
            None,
        )
    }
}

pub(crate) fn authenticated_search() -> Value {
    json!({
        "url": "ldap://dir.example:389",
        "binddn": "cn=admin,dc=example,dc=org",
        "bindpass": "adminpw",
        "userdn": "ou=people,dc=example,dc=org",
        "userattr": "uid",
        "groupdn": "ou=groups,dc=example,dc=org",
    })
}

pub(super) fn policies(r: &Response) -> Vec<String> {
    let b = r.body.as_ref().unwrap();
    b["auth"]["policies"]
        .as_array()
        .unwrap_or_else(|| panic!("{b}"))
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

pub(super) fn error(r: &Response) -> String {
    r.body.as_ref().unwrap()["errors"][0]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn authenticated_search_login_with_group_objects() {
    let mut w = World::new();
    w.configure(authenticated_search());
    w.admin(
        Method::Post,
        "auth/ldap/groups/engineers",
        json!({"policies": "eng,shared"}),
    );
    w.admin(
        Method::Post,
        "auth/ldap/groups/ops",
        json!({"policies": ["ops"]}),
    );
    let r = w.login("alice", "alicepw");
    assert_eq!(r.status, 200, "{:?}", r.body);
    let b = r.body.clone().unwrap();
    assert_eq!(policies(&r), vec!["default", "eng", "ops", "shared"]);
    assert_eq!(b["auth"]["token_policies"], b["auth"]["policies"]);
    assert_eq!(b["auth"]["metadata"]["username"], "alice");
    // The alias is the identity store's: the entity of (mount, "alice").
    let acc = accessor(&mut w);
    let e = w.admin(
        Method::Post,
        "identity/lookup/entity",
        json!({"alias_name": "alice", "alias_mount_accessor": acc}),
    );
    assert_eq!(
        e.body.as_ref().unwrap()["data"]["id"],
        b["auth"]["entity_id"],
        "{:?}",
        e.body
    );
    assert!(b["auth"]["client_token"].as_str().unwrap().len() > 10);
    assert!(!b["auth"]["accessor"].as_str().unwrap().is_empty());
    assert_eq!(b["auth"]["renewable"], true);
    assert_eq!(b["auth"]["lease_duration"], token::DEFAULT_TTL);
    assert_eq!(b["lease_id"], "");
    assert_eq!(b["renewable"], false);
    assert_eq!(b["lease_duration"], 0);
    assert_eq!(b["data"], Value::Null);
    // The token works and carries the policies.
    let t = b["auth"]["client_token"].as_str().unwrap().to_string();
    let me = w.call(Method::Get, "auth/token/lookup-self", json!({}), Some(&t));
    assert_eq!(me.status, 200);
    assert_eq!(me.body.unwrap()["data"]["meta"]["username"], "alice");
    // Order of operations: connect, service bind, search, the user's password checked on
    // a connection of its own (no re-bind of the service connection), group search.
    let kinds: Vec<&str> = w
        .dir
        .log
        .iter()
        .map(|c| match &c.op {
            LdapOp::Connect(_) => "connect",
            LdapOp::Bind { .. } => "bind",
            LdapOp::CheckBind { .. } => "check bind",
            LdapOp::Search(_) => "search",
            LdapOp::Close => "close",
            LdapOp::Run(_) | LdapOp::ConnectBound { .. } => "not logged",
        })
        .collect();
    assert_eq!(kinds, ["connect", "bind", "search", "check bind", "search"]);
    assert!(w.dir.log.last().unwrap().close_after);
    assert_eq!(w.dir.open_connections(), 0);
}

#[test]
fn wrong_password_unknown_user_and_duplicates() {
    let mut w = World::new();
    w.configure(authenticated_search());
    let r = w.login("alice", "wrong");
    assert_eq!(r.status, 400);
    assert_eq!(error(&r), "ldap operation failed: failed to bind as user");
    let r = w.login("nobody", "x");
    assert_eq!(r.status, 400);
    assert_eq!(error(&r), "ldap operation failed: failed to bind as user");
    // A name that matches two entries is not told apart either (the operator finds the
    // count in the log).
    w.dir.add(
        "uid=alice,ou=elsewhere,ou=people,dc=example,dc=org",
        &[("uid", &["alice"]), ("userPassword", &["x"])],
    );
    let r = w.login("alice", "alicepw");
    assert_eq!(r.status, 400);
    assert_eq!(error(&r), "ldap operation failed: failed to bind as user");
    assert_eq!(w.dir.open_connections(), 0);
    assert!(!format!("{:?}", r.body).contains("adminpw"));
}

#[test]
fn plain_userattr_bind_and_memberof_strategy() {
    let mut w = World::new();
    w.configure(json!({
        "url": "ldap://dir.example",
        "userdn": "ou=people,dc=example,dc=org",
        "userattr": "uid",
        "groupdn": "ou=people,dc=example,dc=org",
        "groupfilter": "(&(objectClass=inetOrgPerson)(uid={{.Username}}))",
        "groupattr": "memberOf",
    }));
    w.dir.anonymous_search = false;
    w.admin(
        Method::Post,
        "auth/ldap/groups/engineers",
        json!({"policies": "eng"}),
    );
    let r = w.login("alice", "alicepw");
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(policies(&r), vec!["default", "eng"]);
    // Bound as the user itself: the bind DN is built from userattr and userdn.
    let binds: Vec<String> = w
        .dir
        .log
        .iter()
        .filter_map(|c| match &c.op {
            LdapOp::Bind { dn, .. } => Some(dn.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(binds, ["uid=alice,ou=people,dc=example,dc=org"]);
}

#[test]
fn anonymous_discoverdn_search() {
    let mut w = World::new();
    w.dir.anonymous_search = true;
    w.configure(json!({
        "url": "ldap://dir.example",
        "discoverdn": true,
        "deny_null_bind": false,
        "userdn": "ou=people,dc=example,dc=org",
        "userattr": "uid",
        "userfilter": "(&(objectClass=inetOrgPerson)({{.UserAttr}}={{.Username}}))",
        "groupdn": "ou=groups,dc=example,dc=org",
    }));
    w.admin(
        Method::Post,
        "auth/ldap/groups/ops",
        json!({"policies": "ops"}),
    );
    let r = w.login("bob", "bobpw");
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(policies(&r), vec!["default", "ops"]);
    let first_search = w
        .dir
        .log
        .iter()
        .find_map(|c| match &c.op {
            LdapOp::Search(s) => Some(s.filter.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(first_search, "(&(objectClass=inetOrgPerson)(uid=bob))");
    // No service bind happened: the first bind is the user's.
    assert!(matches!(&w.dir.log[1].op, LdapOp::Search(_)));
}

#[test]
fn upn_bind_resolves_user_dn_for_groups() {
    let mut w = World::new();
    w.configure(json!({
        "url": "ldap://dir.example",
        "upndomain": "example.org",
        "userdn": "ou=people,dc=example,dc=org",
        "userattr": "uid",
        "groupdn": "ou=groups,dc=example,dc=org",
    }));
    w.admin(
        Method::Post,
        "auth/ldap/groups/engineers",
        json!({"policies": "eng"}),
    );
    let r = w.login("alice", "alicepw");
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        policies(&r),
        vec!["default", "eng",],
        "member found via the UPN-resolved DN"
    );
    let ops: Vec<String> = w
        .dir
        .log
        .iter()
        .map(|c| match &c.op {
            LdapOp::Bind { dn, .. } => format!("bind {dn}"),
            LdapOp::Search(s) => format!("search {}", s.filter),
            _ => "other".into(),
        })
        .collect();
    assert_eq!(ops[1], "bind alice@example.org");
    assert_eq!(ops[2], "search (userPrincipalName=alice@example.org)");
}

#[test]
fn escaped_username_matches_only_itself() {
    let mut w = World::new();
    w.configure(authenticated_search());
    w.admin(
        Method::Post,
        "auth/ldap/groups/posix",
        json!({"policies": "px"}),
    );
    let name = "o'brien, jr+x#=\\*";
    let r = w.login(name, "obpw");
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(policies(&r), vec!["default", "px"]);
    // Metacharacters never widen a search.
    for evil in ["*", "a*", "*)(uid=*", "alice)(|(uid=*", "\\2a", "\0"] {
        let r = w.login(evil, "alicepw");
        assert_eq!(r.status, 400, "{evil:?}: {:?}", r.body);
    }
    // Plain bind DN path escapes per RFC 4514.
    let mut w = World::new();
    w.configure(json!({
        "url": "ldap://dir.example",
        "userdn": "ou=people,dc=example,dc=org",
        "userattr": "uid",
        "groupdn": "ou=groups,dc=example,dc=org",
    }));
    let r = w.login(name, "obpw");
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = w.login("alice,ou=people", "alicepw");
    assert_eq!(r.status, 400);
}

#[test]
fn deny_null_bind_refuses_without_contacting_the_directory() {
    let mut w = World::new();
    w.configure(authenticated_search());
    let r = w.login("alice", "");
    assert_eq!(r.status, 400);
    assert!(error(&r).contains("password cannot be of zero length"));
    assert!(w.dir.log.is_empty());
    // With deny_null_bind off the empty password reaches the server, which refuses an
    // unauthenticated bind.
    w.configure(json!({"deny_null_bind": false}));
    let r = w.login("alice", "");
    assert_eq!(r.status, 400);
    assert!(error(&r).starts_with("ldap operation failed: failed to bind as user"));
}

#[test]
fn url_failover_and_unreachable_directory() {
    let mut w = World::new();
    let mut c = authenticated_search();
    c["url"] = json!("ldap://dead.example,ldap://dir.example");
    w.configure(c);
    w.dir.dead_urls.insert("ldap://dead.example".into());
    let r = w.login("alice", "alicepw");
    assert_eq!(r.status, 200, "{:?}", r.body);
    w.dir.dead_urls.insert("ldap://dir.example".into());
    let r = w.login("alice", "alicepw");
    assert_eq!(r.status, 400);
    let e = error(&r);
    assert!(e.contains("failed to connect to LDAP server"), "{e}");
    assert!(
        e.contains("dead.example") && e.contains("dir.example"),
        "{e}"
    );
    assert!(!e.contains("adminpw"));
    // TLS failure is named as such.
    w.dir.dead_urls.clear();
    w.dir.tls_failing_urls.insert("ldaps://tls.example".into());
    w.configure(json!({"url": "ldaps://tls.example"}));
    let r = w.login("alice", "alicepw");
    assert!(error(&r).contains("TLS handshake"), "{}", error(&r));
    w.configure(json!({"insecure_tls": true}));
    assert_eq!(w.login("alice", "alicepw").status, 200);
}

#[test]
fn paging_lifts_the_size_limit_and_deref_follows_aliases() {
    let mut w = World::new();
    for i in 0..60 {
        let dn = format!("cn=g{i:02},ou=groups,dc=example,dc=org");
        let cn = format!("g{i:02}");
        w.dir.add(
            &dn,
            &[
                ("objectClass", &["groupOfNames"]),
                ("cn", &[cn.as_str()]),
                ("member", &["uid=bob,ou=people,dc=example,dc=org"]),
            ],
        );
    }
    w.dir.size_limit = 50;
    w.configure(authenticated_search());
    w.admin(
        Method::Post,
        "auth/ldap/groups/g59",
        json!({"policies": "last"}),
    );
    let r = w.login("bob", "bobpw");
    assert_eq!(r.status, 400);
    assert!(error(&r).contains("max_page_size"), "{}", error(&r));
    w.configure(json!({"max_page_size": 20}));
    let r = w.login("bob", "bobpw");
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert!(policies(&r).contains(&"last".to_string()));

    // An alias under the user base pointing at bob: found only when dereferencing.
    w.dir.add(
        "ou=aliases,dc=example,dc=org",
        &[("objectClass", &["organizationalUnit"])],
    );
    w.dir.add(
        "uid=robert,ou=aliases,dc=example,dc=org",
        &[
            ("objectClass", &["alias", "extensibleObject"]),
            ("uid", &["robert"]),
            (
                "aliasedObjectName",
                &["uid=bob,ou=people,dc=example,dc=org"],
            ),
        ],
    );
    w.configure(json!({
        "userdn": "ou=aliases,dc=example,dc=org",
        "userfilter": "",
        "dereference_aliases": "never",
    }));
    let r = w.login("bob", "bobpw");
    assert_eq!(
        r.status, 400,
        "without dereferencing only robert's alias is there"
    );
    w.configure(json!({"dereference_aliases": "always"}));
    let r = w.login("bob", "bobpw");
    assert_eq!(r.status, 200, "{:?}", r.body);
}

#[test]
fn user_mapping_groups_policies_and_case() {
    let mut w = World::new();
    let mut c = authenticated_search();
    c["token_policies"] = json!("base");
    c["token_ttl"] = json!("1h");
    c["token_max_ttl"] = json!("2h");
    w.configure(c);
    w.admin(
        Method::Post,
        "auth/ldap/groups/local-team",
        json!({"policies": "team"}),
    );
    w.admin(
        Method::Post,
        "auth/ldap/users/BOB",
        json!({"groups": "Local-Team, local-team", "policies": "own"}),
    );
    let r = w.admin(Method::Get, "auth/ldap/users/bob", json!({}));
    assert_eq!(
        r.body.as_ref().unwrap()["data"],
        json!({"groups": "local-team", "policies": ["own"]})
    );
    let r = w.login("Bob", "bobpw");
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(policies(&r), vec!["base", "default", "own", "team"]);
    assert_eq!(r.body.as_ref().unwrap()["auth"]["lease_duration"], 3600);
    // Case-sensitive names: the mapping for BOB no longer applies to Bob.
    w.configure(json!({"case_sensitive_names": true, "token_no_default_policy": true}));
    let r = w.login("Bob", "bobpw");
    assert_eq!(policies(&r), vec!["base"]);
}

#[test]
fn mapping_endpoints_list_read_delete() {
    let mut w = World::new();
    assert_eq!(
        w.admin(Method::List, "auth/ldap/groups", json!({})).status,
        404
    );
    w.admin(
        Method::Post,
        "auth/ldap/groups/b",
        json!({"policies": "P2, p1"}),
    );
    w.admin(
        Method::Post,
        "auth/ldap/groups/a",
        json!({"policies": ["x"]}),
    );
    let r = w.admin(Method::List, "auth/ldap/groups/", json!({}));
    assert_eq!(r.body.unwrap()["data"]["keys"], json!(["a", "b"]));
    let r = w.admin(Method::Get, "auth/ldap/groups/B", json!({}));
    assert_eq!(r.body.unwrap()["data"]["policies"], json!(["p1", "p2"]));
    let mut req = Request::new(900, Method::Get, "auth/ldap/groups");
    req.query = vec![("list".into(), "true".into())];
    req.token = Some(w.root.clone());
    w.node.handle(w.now, Input::Request(req));
    let mut got = None;
    while let Some(o) = w.node.poll_output() {
        if let Output::Response(r) = o {
            got = Some(r);
        }
    }
    assert_eq!(
        got.unwrap().body.unwrap()["data"]["keys"],
        json!(["a", "b"])
    );
    assert_eq!(
        w.admin(Method::Delete, "auth/ldap/groups/a", json!({}))
            .status,
        204
    );
    assert_eq!(
        w.admin(Method::Get, "auth/ldap/groups/a", json!({})).status,
        404
    );
    w.admin(
        Method::Post,
        "auth/ldap/users/u1",
        json!({"groups": ["g"], "policies": "p"}),
    );
    let r = w.admin(Method::List, "auth/ldap/users", json!({}));
    assert_eq!(r.body.unwrap()["data"]["keys"], json!(["u1"]));
    // Without a token the mappings are refused.
    let r = w.call(Method::Get, "auth/ldap/users/u1", json!({}), None);
    assert_eq!(r.status, 403);
}

#[test]
fn config_write_read_and_refusals_store_nothing() {
    let mut w = World::new();
    w.configure(authenticated_search());
    let r = w.admin(Method::Get, "auth/ldap/config", json!({}));
    let d = r.body.unwrap()["data"].clone();
    assert_eq!(d["binddn"], "cn=admin,dc=example,dc=org");
    assert!(d.get("bindpass").is_none());
    assert!(!d.to_string().contains("adminpw"));
    let before = w.node.storage().map.clone();
    for bad in [
        json!({"url": "http://nope"}),
        json!({"groupfilter": "(member={{.UserDN}"}),
        json!({"max_page_size": -3}),
        json!({"dereference_aliases": "sometimes"}),
        json!({"certificate": "-----BEGIN CERTIFICATE-----\nZm9v\n-----END CERTIFICATE-----"}),
    ] {
        let r = w.admin(Method::Post, "auth/ldap/config", bad.clone());
        assert_eq!(r.status, 400, "{bad}");
        let field = bad.as_object().unwrap().keys().next().unwrap().clone();
        assert!(error(&r).contains(&field), "{bad}: {}", error(&r));
    }
    assert_eq!(w.node.storage().map, before);
    // Partial update keeps the other fields, including the bind password.
    w.configure(json!({"starttls": true}));
    let r = w.admin(Method::Get, "auth/ldap/config", json!({}));
    assert_eq!(r.body.unwrap()["data"]["starttls"], true);
    assert_eq!(w.login("alice", "alicepw").status, 200);
    // Stored encrypted: the bind password never appears in storage in clear.
    for v in w.node.storage().map.values() {
        assert!(!String::from_utf8_lossy(v).contains("adminpw"));
    }
    // Unknown fields are ignored with a warning.
    let r = w.admin(Method::Post, "auth/ldap/config", json!({"bindpw": "x"}));
    assert_eq!(r.status, 200);
    assert!(r.body.unwrap()["warnings"][0]
        .as_str()
        .unwrap()
        .contains("bindpw"));
}

#[test]
fn login_without_config_and_bound_cidrs() {
    let mut w = World::new();
    let r = w.login("alice", "alicepw");
    assert_eq!(r.status, 400);
    assert!(error(&r).contains("not configured"));
    let mut c = authenticated_search();
    c["token_bound_cidrs"] = json!(["10.0.0.0/8"]);
    w.configure(c);
    assert_eq!(w.login("alice", "alicepw").status, 403);
    w.configure(json!({"token_bound_cidrs": "127.0.0.0/8"}));
    let r = w.login("alice", "alicepw");
    assert_eq!(r.status, 200);
    let t = r.body.unwrap()["auth"]["client_token"]
        .as_str()
        .unwrap()
        .to_string();
    // The token is bound to those blocks too, as in the reference: usable from inside
    // them only, and so are the tokens it creates.
    let me = |w: &mut World| {
        w.call(Method::Get, "auth/token/lookup-self", json!({}), Some(&t))
            .status
    };
    assert_eq!(me(&mut w), 200);
    w.remote_addr = "10.1.2.3:4000".into();
    assert_eq!(me(&mut w), 403);
    w.remote_addr = "127.0.0.1:4000".into();
    w.admin(
        Method::Put,
        "sys/policies/acl/maker",
        json!({"policy": "path \"auth/token/create\" { capabilities = [\"update\"] }"}),
    );
    w.admin(
        Method::Post,
        "auth/ldap/users/alice",
        json!({"policies": "maker"}),
    );
    let r = w.login("alice", "alicepw");
    let t = r.body.unwrap()["auth"]["client_token"]
        .as_str()
        .unwrap()
        .to_string();
    let r = w.call(Method::Post, "auth/token/create", json!({}), Some(&t));
    assert_eq!(r.status, 200, "{:?}", r.body);
    let child = r.body.unwrap()["auth"]["client_token"]
        .as_str()
        .unwrap()
        .to_string();
    let r = w.call(
        Method::Get,
        "auth/token/lookup-self",
        json!({}),
        Some(&child),
    );
    assert_eq!(
        r.body.unwrap()["data"]["bound_cidrs"],
        json!(["127.0.0.0/8"])
    );
    w.remote_addr = "10.1.2.3:4000".into();
    let r = w.call(
        Method::Get,
        "auth/token/lookup-self",
        json!({}),
        Some(&child),
    );
    assert_eq!(r.status, 403);
}

#[test]
fn anonymous_group_search_binds_anonymously_before_groups() {
    let mut w = World::new();
    w.dir.anonymous_search = true;
    let mut c = authenticated_search();
    c["anonymous_group_search"] = json!(true);
    c["binddn"] = json!("");
    c["bindpass"] = json!("");
    c["discoverdn"] = json!(true);
    w.configure(c);
    w.admin(
        Method::Post,
        "auth/ldap/groups/ops",
        json!({"policies": "ops"}),
    );
    let r = w.login("bob", "bobpw");
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(policies(&r), vec!["default", "ops"]);
    let n = w.dir.log.len();
    assert!(matches!(&w.dir.log[n - 2].op, LdapOp::Bind { dn, .. } if dn.is_empty()));
}

pub(crate) fn accessor(w: &mut World) -> String {
    let r = w.admin(Method::Get, "sys/auth", json!({}));
    let b = r.body.unwrap();
    let d = if b["data"].is_object() {
        b["data"].clone()
    } else {
        b
    };
    d["ldap/"]["accessor"].as_str().unwrap().to_string()
}

#[test]
fn a_login_never_carries_the_root_policy() {
    let mut w = World::new();
    w.configure(authenticated_search());
    let before = token_keys(&w);
    // By a group mapping (group names and policies are case-folded).
    w.admin(
        Method::Post,
        "auth/ldap/groups/engineers",
        json!({"policies": "eng,ROOT"}),
    );
    let r = w.login("alice", "alicepw");
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(error(&r), "auth methods cannot create root tokens");
    assert_eq!(token_keys(&w), before, "no token is stored");
    // By a user mapping.
    w.admin(Method::Delete, "auth/ldap/groups/engineers", json!({}));
    assert_eq!(w.login("alice", "alicepw").status, 200);
    let before = token_keys(&w);
    w.admin(
        Method::Post,
        "auth/ldap/users/bob",
        json!({"policies": "root"}),
    );
    let r = w.login("bob", "bobpw");
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(error(&r), "auth methods cannot create root tokens");
    // By the config's token_policies.
    w.admin(Method::Delete, "auth/ldap/users/bob", json!({}));
    w.configure(json!({"token_policies": "root"}));
    let r = w.login("bob", "bobpw");
    assert_eq!(error(&r), "auth methods cannot create root tokens");
    assert_eq!(token_keys(&w), before);
}

#[test]
fn mapping_names_are_one_path_segment() {
    let mut w = World::new();
    w.configure(authenticated_search());
    let before = w.node.storage().map.clone();
    // A name with a `/` is no declared route of the method: nothing is stored.
    for path in ["auth/ldap/groups/a/b", "auth/ldap/users/alice/x"] {
        let r = w.admin(Method::Post, path, json!({"policies": "p"}));
        assert_eq!(r.status, 404, "{path}: {:?}", r.body);
    }
    assert_eq!(w.node.storage().map, before);
    // Reading or deleting such a name finds nothing and harms nothing.
    assert_eq!(
        w.admin(Method::Get, "auth/ldap/groups/a/b", json!({}))
            .status,
        404
    );
    assert_eq!(
        w.admin(Method::Delete, "auth/ldap/groups/a/b", json!({}))
            .status,
        404
    );
    assert_eq!(w.node.storage().map, before);
    // A trailing slash is the same name (the path is canonical before routing).
    let r = w.admin(
        Method::Post,
        "auth/ldap/users/alice/",
        json!({"policies": "p"}),
    );
    assert!(r.status < 300, "{:?}", r.body);
    let r = w.admin(Method::Get, "auth/ldap/users/alice", json!({}));
    assert_eq!(r.status, 200, "{:?}", r.body);
}

/// The audit response entry of a failed Active Directory login names the directory's
/// reason after the client's error; the client's answer is the same for every reason,
/// and no password is in the audit lines.
#[test]
fn ad_refusal_reasons_go_to_the_audit_entry_not_to_the_client() {
    let mut w = World::new();
    w.dir = super::ad_tests::ad_directory();
    w.configure(json!({
        "url": "ldaps://dc1.cairn.test",
        "upndomain": "cairn.test",
        "userdn": "CN=Users,DC=cairn,DC=test",
        "userattr": "userPrincipalName",
        "groupdn": "DC=cairn,DC=test",
        "groupfilter": "(&(objectClass=group)(member:1.2.840.113556.1.4.1941:={{.UserDN}}))",
    }));
    let r = w.admin(
        Method::Put,
        "sys/audit/file",
        json!({"type": "file", "options": {"file_path": "/audit.log"}}),
    );
    assert_eq!(r.status, 204, "{:?}", r.body);
    let cases = [
        (
            "carol",
            "Carol-Pass1!",
            Some("account disabled (AD data 533)"),
        ),
        (
            "dave",
            "Dave-Pass1!",
            Some("user must change password (AD data 773)"),
        ),
        (
            "alice",
            "Not-Alice-1",
            Some("invalid credentials (wrong password or unknown user) (AD data 52e)"),
        ),
        ("alice", "Alice-Pass1!", None),
    ];
    let mut answers = Vec::new();
    for (user, pw, reason) in cases {
        let from = w.audit.len();
        let r = w.login(user, pw);
        let entries: Vec<Value> = w.audit[from..]
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let resp = entries
            .iter()
            .find(|e| e["type"] == "response")
            .unwrap_or_else(|| panic!("no response entry for {user}: {entries:?}"));
        match reason {
            Some(reason) => {
                assert_eq!(r.status, 400, "{user}");
                assert_eq!(error(&r), login::USER_BIND_FAILED, "{user}");
                assert!(!r.body.as_ref().unwrap().to_string().contains("AD data"));
                assert_eq!(
                    resp["error"],
                    json!(format!(
                        "{} (the directory says: {reason})",
                        login::USER_BIND_FAILED
                    )),
                    "{user}"
                );
                answers.push(r.body.unwrap());
            }
            None => {
                assert_eq!(r.status, 200, "{:?}", r.body);
                assert_eq!(resp["error"], json!(""));
            }
        }
        for line in &w.audit[from..] {
            assert!(!line.contains(pw), "{user}'s password in {line}");
        }
    }
    // One answer whatever the reason.
    assert!(answers.windows(2).all(|a| a[0] == a[1]), "{answers:?}");
}
