//! Tests generated from the route table: every declared route is called with no token,
//! with a token whose policies grant nothing there, with a token of another namespace and
//! with a token holding every capability but sudo; each answer is checked against the
//! route's declared class and scope.

use super::*;
use crate::api::Response;
use crate::node::{Input, Node, Output};
use crate::storage::MemStorage;

const ROOT: &str = "root-table";

struct World {
    node: Node<MemStorage>,
    id: u64,
    nothing: String,
    no_sudo: String,
    other: String,
}

impl World {
    fn new() -> World {
        let node = Node::dev_in_memory([5; 32], ROOT);
        let mut w = World {
            node,
            id: 0,
            nothing: String::new(),
            no_sudo: String::new(),
            other: String::new(),
        };
        let all = r#"path "*" { capabilities = ["create", "read", "update", "delete", "list", "patch", "sudo"] }"#;
        let no_sudo = r#"path "*" { capabilities = ["create", "read", "update", "delete", "list", "patch"] }"#;
        let nothing = r#"path "elsewhere/*" { capabilities = ["read"] }"#;
        // Every mount type's routes are called under the mount the examples name.
        for e in routes::examples() {
            if let Some((false, kind, at)) = e.mount {
                let p = format!("sys/mounts/{}", at.trim_end_matches('/'));
                w.call(
                    Some(ROOT),
                    None,
                    Method::Put,
                    &p,
                    Some(json!({ "type": kind })),
                );
            }
        }
        for (ns, name, p) in [
            (None, "nothing", nothing),
            (None, "no-sudo", no_sudo),
            (Some("other"), "all", all),
        ] {
            if ns.is_some() {
                w.call(Some(ROOT), None, Method::Put, "sys/namespaces/other", None);
            }
            let r = w.call(
                Some(ROOT),
                ns,
                Method::Put,
                &format!("sys/policies/acl/{name}"),
                Some(json!({ "policy": p })),
            );
            assert!(r.status < 300, "{r:?}");
        }
        let token = |w: &mut World, ns: Option<&str>, policy: &str| {
            let r = w.call(
                Some(ROOT),
                ns,
                Method::Post,
                "auth/token/create",
                Some(json!({"policies": [policy], "no_default_policy": true})),
            );
            r.body.as_ref().unwrap()["auth"]["client_token"]
                .as_str()
                .unwrap()
                .to_string()
        };
        w.nothing = token(&mut w, None, "nothing");
        w.no_sudo = token(&mut w, None, "no-sudo");
        w.other = token(&mut w, Some("other"), "all");
        w
    }

    fn call(
        &mut self,
        token: Option<&str>,
        ns: Option<&str>,
        m: Method,
        path: &str,
        body: Option<Value>,
    ) -> Response {
        self.id += 1;
        let id = self.id;
        let mut req = Request::new(id, m, path).with_json(body.unwrap_or(json!({})));
        req.token = token.map(str::to_string);
        req.namespace = ns.map(str::to_string);
        self.node.handle(2_000, Input::Request(req));
        let mut answer = None;
        while let Some(o) = self.node.poll_output() {
            if let Output::Response(r) = o {
                if r.id == id {
                    answer = Some(r);
                }
            }
        }
        answer.unwrap_or(Response::json(id, 202, json!({"pending": true})))
    }
}

/// Every declared route as (concrete path, class, scope).
fn declared() -> Vec<(String, Class, Scope)> {
    routes::examples()
        .into_iter()
        .map(|e| (e.path, e.class, e.scope))
        .collect()
}

const METHODS: [Method; 6] = [
    Method::Get,
    Method::List,
    Method::Put,
    Method::Post,
    Method::Delete,
    Method::Patch,
];

fn needs_token(class: Class) -> bool {
    matches!(class, Class::Token | Class::Sudo | Class::DrSecondary)
}

#[test]
fn no_token_is_refused_exactly_where_a_token_is_declared() {
    for (path, class, _) in declared() {
        for m in METHODS {
            let mut w = World::new();
            let before = w.node.storage().map.clone();
            let r = w.call(None, None, m, &path, None);
            let missing = r.status == 403
                && r.body
                    .as_ref()
                    .is_some_and(|b| b.to_string().contains("needs a token"));
            assert_eq!(
                missing,
                needs_token(class),
                "{m:?} {path} ({class:?}) without a token: {r:?}"
            );
            if needs_token(class) {
                assert_eq!(w.node.storage().map, before, "{m:?} {path} wrote");
            }
        }
    }
}

#[test]
fn a_token_without_the_capability_is_refused_on_every_token_route() {
    for (path, class, _) in declared() {
        if !needs_token(class) {
            continue;
        }
        for m in METHODS {
            let mut w = World::new();
            let t = w.nothing.clone();
            let before = w.node.storage().map.clone();
            let r = w.call(Some(&t), None, m, &path, None);
            assert_eq!(r.status, 403, "{m:?} {path} ({class:?}): {r:?}");
            assert_eq!(w.node.storage().map, before, "{m:?} {path} wrote");
        }
    }
}

#[test]
fn a_token_of_another_namespace_gets_nothing_here_and_no_cluster_route_there() {
    for (path, class, scope) in declared() {
        for m in METHODS {
            let mut w = World::new();
            let t = w.other.clone();
            // Here (the root namespace): refused wherever a token is needed.
            if needs_token(class) {
                let r = w.call(Some(&t), None, m, &path, None);
                assert_eq!(r.status, 403, "{m:?} {path} from another namespace: {r:?}");
            }
            // In its own namespace: root-scoped routes are refused whatever the token
            // may do there (the node-level seal endpoints ignore the namespace).
            let node_level = matches!(
                routes::lookup_sys(&path).map(|r| r.handler),
                Some(Sys::Init | Sys::Unseal | Sys::SealStatus | Sys::Health)
            );
            if scope == Scope::Root && !node_level {
                let r = w.call(Some(&t), Some("other"), m, &path, None);
                assert_eq!(r.status, 400, "{m:?} {path} in a namespace: {r:?}");
                assert!(
                    r.body.unwrap().to_string().contains("root namespace"),
                    "{m:?} {path}"
                );
                assert!(!w.node.is_sealed());
            }
        }
    }
}

/// The sudo matrix: a token with every capability but sudo on every path is refused on
/// every sudo route and passes authorization on every other token route.
#[test]
fn every_sudo_route_needs_sudo_and_no_other_does() {
    for (path, class, _) in declared() {
        if !needs_token(class) {
            continue;
        }
        for m in METHODS {
            let mut w = World::new();
            let t = w.no_sudo.clone();
            let r = w.call(Some(&t), None, m, &path, None);
            let denied = r.status == 403
                && r.body
                    .as_ref()
                    .is_some_and(|b| b == &json!({"errors": ["permission denied"]}));
            let sudo = matches!(class, Class::Sudo | Class::DrSecondary);
            assert_eq!(denied, sudo, "{m:?} {path} ({class:?}) without sudo: {r:?}");
            if sudo {
                assert!(!w.node.is_sealed(), "{m:?} {path}");
            }
        }
    }
}

/// Every handler of the sys table is declared (adding a `Sys` variant without a route
/// fails here; adding a route without a class does not compile).
#[test]
fn every_sys_handler_has_a_declared_route() {
    let all = [
        Sys::Init,
        Sys::Unseal,
        Sys::SealStatus,
        Sys::Health,
        Sys::Leader,
        Sys::StepDown,
        Sys::HaStatus,
        Sys::Seal,
        Sys::Mounts,
        Sys::Auth,
        Sys::Namespaces,
        Sys::Policies,
        Sys::Policy,
        Sys::Capabilities,
        Sys::ReplicationStatus,
        Sys::Replication,
        Sys::DrToken,
        Sys::GenerateRoot,
        Sys::Audit,
        Sys::AuditHash,
        Sys::Metrics,
        Sys::LockedUsers,
        Sys::License,
        Sys::Wrapping,
        Sys::Leases,
        Sys::UiMounts,
        Sys::KeyStatus,
        Sys::Remount,
        Sys::Snapshot,
    ];
    // Exhaustive: a new variant must be listed above.
    for h in all {
        match h {
            Sys::Init
            | Sys::Unseal
            | Sys::SealStatus
            | Sys::Health
            | Sys::Leader
            | Sys::StepDown
            | Sys::HaStatus
            | Sys::Seal
            | Sys::Mounts
            | Sys::Auth
            | Sys::Namespaces
            | Sys::Policies
            | Sys::Policy
            | Sys::Capabilities
            | Sys::ReplicationStatus
            | Sys::Replication
            | Sys::DrToken
            | Sys::GenerateRoot
            | Sys::Audit
            | Sys::AuditHash
            | Sys::Metrics
            | Sys::LockedUsers
            | Sys::License
            | Sys::Wrapping
            | Sys::Leases
            | Sys::UiMounts
            | Sys::KeyStatus
            | Sys::Remount
            | Sys::Snapshot => {}
        }
        assert!(
            routes::SYS.iter().any(|r| r.handler == h),
            "{h:?} has no route"
        );
    }
}

#[test]
fn list_is_checked_on_the_directory_and_update_is_not_create() {
    let mut w = World::new();
    let pol = r#"
            path "secret/*" { capabilities = ["list", "read", "update"] }
            path "secret/priv/*" { capabilities = ["deny"] }
        "#;
    w.call(
        Some(ROOT),
        None,
        Method::Put,
        "sys/policies/acl/p",
        Some(json!({ "policy": pol })),
    );
    let r = w.call(
        Some(ROOT),
        None,
        Method::Post,
        "auth/token/create",
        Some(json!({"policies": ["p"]})),
    );
    let t = r.body.unwrap()["auth"]["client_token"]
        .as_str()
        .unwrap()
        .to_string();
    w.call(
        Some(ROOT),
        None,
        Method::Put,
        "secret/priv/a",
        Some(json!({"v": 1})),
    );
    w.call(
        Some(ROOT),
        None,
        Method::Put,
        "secret/old",
        Some(json!({"v": 1})),
    );
    for p in ["secret/priv", "secret/priv/"] {
        assert_eq!(
            w.call(Some(&t), None, Method::List, p, None).status,
            403,
            "{p}"
        );
    }
    assert_eq!(
        w.call(Some(&t), None, Method::List, "secret/", None).status,
        200
    );
    // `update` does not stand in for `create`.
    let r = w.call(
        Some(&t),
        None,
        Method::Put,
        "secret/new",
        Some(json!({"v": 1})),
    );
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(
        w.call(Some(ROOT), None, Method::Get, "secret/new", None)
            .status,
        404
    );
    let r = w.call(
        Some(&t),
        None,
        Method::Put,
        "secret/old",
        Some(json!({"v": 2})),
    );
    assert_eq!(r.status, 204, "{r:?}");
}

#[test]
fn a_trailing_slash_or_a_namespace_header_does_not_skip_sudo_or_scope() {
    let mut w = World::new();
    let t = w.no_sudo.clone();
    for p in ["sys/seal/", "sys/seal//", "/sys/seal", "sys/seal"] {
        let r = w.call(Some(&t), None, Method::Put, p, None);
        assert_eq!(r.status, 403, "{p}: {r:?}");
        assert!(!w.node.is_sealed(), "{p}");
    }
    let o = w.other.clone();
    for p in ["sys/seal", "sys/seal/", "other/sys/seal"] {
        let r = w.call(Some(&o), Some("other"), Method::Put, p, None);
        assert!(matches!(r.status, 400 | 403 | 404), "{p}: {r:?}");
        assert!(!w.node.is_sealed(), "{p}");
    }
    // Dot segments are refused before any decision.
    let r = w.call(Some(ROOT), None, Method::Get, "secret/../sys/seal", None);
    assert_eq!(r.status, 400);
}
