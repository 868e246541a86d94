//! Login and mapping tests: a whole node driven through the API, its LDAP calls answered
//! by the fake directory (no I/O).

use super::fake::FakeDirectory;
use super::*;
use crate::node::{Admin, AdminResult, Input, Node, NodeConfig};
use crate::storage::MemStorage;
use crate::Response;

pub(crate) struct World {
    pub(crate) node: Node<MemStorage>,
    dir: FakeDirectory,
    root: String,
    next_id: u64,
    now: u64,
    /// Every audit line the node wrote.
    audit: Vec<String>,
}

const BASE: &str = "dc=example,dc=org";

fn directory() -> FakeDirectory {
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
        req.remote_addr = "127.0.0.1:4000".into();
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

fn policies(r: &Response) -> Vec<String> {
    let b = r.body.as_ref().unwrap();
    b["auth"]["policies"]
        .as_array()
        .unwrap_or_else(|| panic!("{b}"))
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

fn error(r: &Response) -> String {
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
    assert_eq!(w.login("alice", "alicepw").status, 200);
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

fn locked_users(w: &mut World) -> Value {
    let r = w.admin(Method::Get, "sys/locked-users", json!({}));
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.body.unwrap()["data"].clone()
}

#[test]
fn lockout_after_threshold_refuses_without_the_directory_and_unlocks() {
    let mut w = World::new();
    let mut c = authenticated_search();
    c["user_lockout_threshold"] = json!(3);
    c["user_lockout_duration"] = json!("60s");
    c["user_lockout_counter_reset"] = json!("30s");
    w.configure(c);
    let acc = accessor(&mut w);
    for _ in 0..3 {
        let r = w.login("alice", "wrong");
        assert_eq!(r.status, 400);
        assert_eq!(error(&r), "ldap operation failed: failed to bind as user");
    }
    // Locked: even the right password is refused, and the directory is not asked.
    let n = w.dir.log.len();
    let r = w.login("alice", "alicepw");
    assert_eq!(r.status, 403, "{:?}", r.body);
    assert_eq!(error(&r), "permission denied");
    assert_eq!(
        w.login("ALICE", "alicepw").status,
        403,
        "names are canonical"
    );
    assert_eq!(w.dir.log.len(), n);
    // Another user is not affected.
    assert_eq!(w.login("bob", "bobpw").status, 200);
    // Listed by mount accessor; the lock is stored cluster-local.
    let d = locked_users(&mut w);
    assert_eq!(d["total"], 1);
    assert_eq!(
        d["by_namespace"][0]["mount_accessors"][0],
        json!({"mount_accessor": acc, "counts": 1, "alias_identifiers": ["alice"]})
    );
    assert!(w
        .node
        .storage()
        .map
        .keys()
        .any(|k| k == &lockout::key(&acc, "alice")));
    let r = w.call(Method::Get, "sys/locked-users", json!({}), None);
    assert_eq!(r.status, 403, "needs a token");
    // Unlock (idempotent), then the right password works.
    for _ in 0..2 {
        let r = w.admin(
            Method::Post,
            &format!("sys/locked-users/{acc}/unlock/ALICE"),
            json!({}),
        );
        assert_eq!(r.status, 204, "{:?}", r.body);
    }
    assert_eq!(locked_users(&mut w)["total"], 0);
    assert_eq!(w.login("alice", "alicepw").status, 200);
    assert!(!w
        .node
        .storage()
        .map
        .keys()
        .any(|k| k.starts_with(lockout::PREFIX)));
    // Locked again, the lock ends after the duration.
    for _ in 0..3 {
        w.login("alice", "wrong");
    }
    assert_eq!(w.login("alice", "alicepw").status, 403);
    w.now += 61_000;
    assert_eq!(
        locked_users(&mut w)["total"],
        0,
        "expired locks are not listed"
    );
    assert_eq!(w.login("alice", "alicepw").status, 200);
    // The count restarts after counter_reset without failures, and after a success.
    for _ in 0..2 {
        w.login("alice", "wrong");
    }
    w.now += 31_000;
    for _ in 0..2 {
        w.login("alice", "wrong");
    }
    assert_eq!(w.login("alice", "alicepw").status, 200);
    for _ in 0..2 {
        w.login("alice", "wrong");
    }
    assert_eq!(w.login("alice", "alicepw").status, 200);
    // Unknown users count too (the answer does not tell them apart).
    for _ in 0..3 {
        assert_eq!(w.login("nobody", "x").status, 400);
    }
    assert_eq!(w.login("nobody", "x").status, 403);
    // A directory that cannot be reached is not the user's fault.
    w.dir.dead_urls.insert("ldap://dir.example:389".into());
    for _ in 0..4 {
        assert_eq!(w.login("bob", "bobpw").status, 400);
    }
    w.dir.dead_urls.clear();
    assert_eq!(w.login("bob", "bobpw").status, 200);
}

#[test]
fn lockout_can_be_disabled_per_mount() {
    let mut w = World::new();
    let mut c = authenticated_search();
    c["user_lockout_disable"] = json!(true);
    w.configure(c);
    for _ in 0..8 {
        assert_eq!(w.login("alice", "wrong").status, 400);
    }
    assert_eq!(w.login("alice", "alicepw").status, 200);
    let r = w.admin(Method::Get, "auth/ldap/config", json!({}));
    let d = r.body.unwrap()["data"].clone();
    assert_eq!(d["user_lockout_disable"], true);
    assert_eq!(d["user_lockout_threshold"], 5);
    // Default threshold: five failures lock.
    w.configure(json!({"user_lockout_disable": false}));
    for _ in 0..5 {
        assert_eq!(w.login("alice", "wrong").status, 400);
    }
    assert_eq!(w.login("alice", "alicepw").status, 403);
}

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

fn token_keys(w: &World) -> usize {
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

#[test]
fn padded_and_cased_names_count_against_one_lockout_counter() {
    let mut w = World::new();
    let mut c = authenticated_search();
    c["user_lockout_threshold"] = json!(4);
    w.configure(c);
    let acc = accessor(&mut w);
    for name in [" alice", "alice  ", "ALICE", "alice"] {
        let r = w.login(name, "wrong");
        assert_eq!(r.status, 400, "{name:?}: {:?}", r.body);
    }
    for name in ["alice", "  Alice ", "alice\t"] {
        assert_eq!(w.login(name, "alicepw").status, 403, "{name:?}");
    }
    let d = locked_users(&mut w);
    assert_eq!(
        d["by_namespace"][0]["mount_accessors"][0]["alias_identifiers"],
        json!(["alice"])
    );
    // Unlocking any spelling unlocks the canonical alias.
    let r = w.admin(
        Method::Post,
        &format!("sys/locked-users/{acc}/unlock/ Alice "),
        json!({}),
    );
    assert_eq!(r.status, 204, "{:?}", r.body);
    assert_eq!(locked_users(&mut w)["total"], 0);
    assert_eq!(w.login("alice", "alicepw").status, 200);
}

#[test]
fn names_resolving_to_one_entry_share_a_lockout_counter() {
    let mut w = World::new();
    let mut c = authenticated_search();
    // Alice logs in by uid or by her userPrincipalName.
    c["userfilter"] = json!("(|({{.UserAttr}}={{.Username}})(userPrincipalName={{.Username}}))");
    c["user_lockout_threshold"] = json!(3);
    w.configure(c);
    let acc = accessor(&mut w);
    assert_eq!(w.login("alice@example.org", "alicepw").status, 200);
    for name in ["alice@example.org", "alice@example.org", "alice"] {
        assert_eq!(w.login(name, "wrong").status, 400, "{name}");
    }
    // The entry (uid alice) has three failures: locked by either name, whatever the
    // password; the UPN spelling has only two of its own.
    assert_eq!(w.login("alice", "alicepw").status, 403);
    let r = w.login("alice@example.org", "alicepw");
    assert_eq!(r.status, 403, "{:?}", r.body);
    let r = w.login("alice@example.org", "wrong");
    assert_eq!(
        r.status, 403,
        "a locked entry tells nothing of the password"
    );
    let d = locked_users(&mut w);
    assert_eq!(
        d["by_namespace"][0]["mount_accessors"][0]["alias_identifiers"],
        json!(["alice"])
    );
    // Unlocking the user's name unlocks the entry.
    let r = w.admin(
        Method::Post,
        &format!("sys/locked-users/{acc}/unlock/alice"),
        json!({}),
    );
    assert_eq!(r.status, 204);
    assert_eq!(w.login("alice@example.org", "alicepw").status, 200);
    assert_eq!(w.login("alice", "alicepw").status, 200);
    // Bob's entry is another counter.
    for _ in 0..2 {
        w.login("alice@example.org", "wrong");
    }
    assert_eq!(w.login("bob", "bobpw").status, 200);
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
