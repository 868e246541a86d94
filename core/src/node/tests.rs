//! Tests of the node: initialisation and unsealing, encryption at rest, write sets that
//! apply whole or not at all, token use limits and response wrapping.

use super::*;
use crate::api::Method;
use crate::storage::MemStorage;

pub(crate) fn call(n: &mut Node<MemStorage>, now: Millis, req: Request) -> Response {
    let id = req.id;
    n.handle(now, Input::Request(req));
    while let Some(o) = n.poll_output() {
        if let Output::Response(r) = o {
            if r.id == id {
                return r;
            }
        }
    }
    panic!("no response for request {id}");
}

fn dev() -> (Node<MemStorage>, String) {
    let mut n = Node::new(MemStorage::new(), [1; 32], NodeConfig::default());
    n.handle(
        1_000,
        Input::Admin {
            id: 1,
            cmd: Admin::DevSetup {
                root_token_id: None,
            },
        },
    );
    let Some(Output::AdminDone {
        id: 1,
        result: Ok(AdminResult::DevSetup(keys)),
    }) = n.poll_output()
    else {
        panic!("no admin output")
    };
    (n, keys.root_token)
}

#[test]
fn a_write_set_claiming_an_existing_key_is_new_is_refused_whole() {
    let (mut n, _) = dev();
    let put = |n: &mut Node<MemStorage>, fresh: &[&str]| {
        let mut ctx = Ctx {
            txn: Txn::new(&n.storage),
            barrier: &n.barrier,
            rng: &mut n.rng,
            now: 2_000,
        };
        for k in ["sys/test/a", "sys/test/b"] {
            if fresh.contains(&k) {
                ctx.put_new(k, b"v").unwrap();
            } else {
                ctx.put(k, b"v").unwrap();
            }
        }
        let ws = ctx.txn.into_write_set();
        n.commit(ws)
    };
    put(&mut n, &["sys/test/a"]).unwrap();
    let root = n.replication().trees.clone();
    // `sys/test/a` exists now: claiming it is new is refused (in every build), and
    // nothing of the set is applied.
    let e = put(&mut n, &["sys/test/a"]).unwrap_err();
    assert!(e.to_string().contains("already exists"), "{e}");
    assert!(n.replication().trees == root);
    // An honest set goes through.
    put(&mut n, &[]).unwrap();
}

#[test]
fn init_unseal_threshold_and_restart_sealed() {
    let mut n = Node::new(MemStorage::new(), [2; 32], NodeConfig::default());
    let r = call(
        &mut n,
        0,
        Request::new(1, Method::Put, "sys/init")
            .with_json(json!({"secret_shares": 5, "secret_threshold": 3})),
    );
    assert_eq!(r.status, 200);
    let b = r.body.unwrap();
    let keys: Vec<String> = b["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    let root = b["root_token"].as_str().unwrap().to_string();
    assert_eq!(
        call(
            &mut n,
            0,
            Request::new(2, Method::Get, "secret/x").with_token(&root)
        )
        .status,
        503
    );
    for (i, k) in keys.iter().take(3).enumerate() {
        let r = call(
            &mut n,
            0,
            Request::new(10 + i as u64, Method::Put, "sys/unseal").with_json(json!({"key": k})),
        );
        assert_eq!(r.body.unwrap()["sealed"], json!(i < 2));
    }
    let r = call(
        &mut n,
        0,
        Request::new(20, Method::Get, "auth/token/lookup-self").with_token(&root),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    // A restart (new node on the same storage) comes back sealed.
    let mut n2 = Node::new(n.into_storage(), [3; 32], NodeConfig::default());
    assert!(n2.is_sealed());
    let r = call(
        &mut n2,
        0,
        Request::new(21, Method::Put, "sys/unseal").with_json(json!({"key": keys[4]})),
    );
    assert_eq!(r.body.unwrap()["progress"], json!(1));
}

#[test]
fn stored_values_are_encrypted() {
    let (mut n, root) = dev();
    let r = call(
        &mut n,
        2_000,
        Request::new(1, Method::Put, "secret/plain")
            .with_token(&root)
            .with_json(json!({"password": "hunter2-very-secret"})),
    );
    assert_eq!(r.status, 204);
    for (_, v) in n.storage().map.iter() {
        assert!(!String::from_utf8_lossy(v).contains("hunter2-very-secret"));
    }
    let r = call(
        &mut n,
        2_000,
        Request::new(2, Method::Get, "secret/plain").with_token(&root),
    );
    assert_eq!(
        r.body.unwrap()["data"]["password"],
        json!("hunter2-very-secret")
    );
}

#[test]
fn policy_limits_token_and_failed_write_changes_nothing() {
    let (mut n, root) = dev();
    let pol = r#"path "secret/team/*" { capabilities = ["create", "read", "update", "list"] }"#;
    let r = call(
        &mut n,
        2_000,
        Request::new(1, Method::Put, "sys/policies/acl/team")
            .with_token(&root)
            .with_json(json!({"policy": pol})),
    );
    assert_eq!(r.status, 204);
    let r = call(
        &mut n,
        2_000,
        Request::new(2, Method::Post, "auth/token/create")
            .with_token(&root)
            .with_json(json!({"policies": ["team"], "ttl": "1h"})),
    );
    let t = r.body.unwrap()["auth"]["client_token"]
        .as_str()
        .unwrap()
        .to_string();
    let ok = call(
        &mut n,
        2_000,
        Request::new(3, Method::Put, "secret/team/a")
            .with_token(&t)
            .with_json(json!({"v": 1})),
    );
    assert_eq!(ok.status, 204);
    let denied = call(
        &mut n,
        2_000,
        Request::new(4, Method::Put, "secret/other")
            .with_token(&t)
            .with_json(json!({"v": 1})),
    );
    assert_eq!(denied.status, 403);
    let before = n.storage().map.clone();
    let bad = call(
        &mut n,
        2_000,
        Request::new(5, Method::Put, "sys/policies/acl/broken")
            .with_token(&root)
            .with_json(json!({"policy": "path {"})),
    );
    assert_eq!(bad.status, 400);
    assert_eq!(
        n.storage().map.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>()
    );
    // The token expires after its TTL, driven by ticks.
    n.handle(2_000 + 3_601_000, Input::Tick);
    let gone = call(
        &mut n,
        2_000 + 3_601_000,
        Request::new(6, Method::Get, "secret/team/a").with_token(&t),
    );
    assert_eq!(gone.status, 403);
}

/// A dev node with a policy `p` that reads `secret/*` (its text returned too) and a token of
/// `p` with `uses` uses: the node, the root token, the policy and the token.
fn reader_with_uses(uses: u64) -> (Node<MemStorage>, String, &'static str, String) {
    let (mut n, root) = dev();
    let pol = r#"path "secret/*" { capabilities = ["read"] }"#;
    call(
        &mut n,
        2_000,
        Request::new(1, Method::Put, "sys/policies/acl/p")
            .with_token(&root)
            .with_json(json!({ "policy": pol })),
    );
    let r = call(
        &mut n,
        2_000,
        Request::new(2, Method::Post, "auth/token/create")
            .with_token(&root)
            .with_json(json!({"policies": ["p"], "num_uses": uses})),
    );
    let t = r.body.unwrap()["auth"]["client_token"]
        .as_str()
        .unwrap()
        .to_string();
    (n, root, pol, t)
}

#[test]
fn failed_request_spends_a_use_of_a_limited_token() {
    let (mut n, _, _, t) = reader_with_uses(1);
    assert_eq!(
        call(
            &mut n,
            2_000,
            Request::new(3, Method::Get, "secret/missing").with_token(&t)
        )
        .status,
        404
    );
    assert_eq!(
        call(
            &mut n,
            2_000,
            Request::new(4, Method::Get, "secret/missing").with_token(&t)
        )
        .status,
        403
    );
}

/// A request the token's policies refuse spends a use too, as the reference counts: a
/// limited-use token is not an unlimited oracle of what its policies allow, and a
/// response-wrapping token tried as a client token is used up.
#[test]
fn a_refused_request_spends_a_use_of_a_limited_token() {
    let (mut n, root, pol, t) = reader_with_uses(2);
    for id in [3, 4] {
        let r = call(
            &mut n,
            2_000,
            Request::new(id, Method::Put, "sys/policies/acl/q")
                .with_token(&t)
                .with_json(json!({ "policy": pol })),
        );
        assert_eq!(r.status, 403);
    }
    // Both uses are spent: a request its policies allow finds no token.
    let r = call(
        &mut n,
        2_000,
        Request::new(5, Method::Get, "secret/missing").with_token(&t),
    );
    assert_eq!(r.status, 403, "{:?}", r.body);

    let mut req = Request::new(6, Method::Post, "auth/token/create")
        .with_token(&root)
        .with_json(json!({"policies": ["p"]}));
    req.wrap_ttl = Some("5m".into());
    let r = call(&mut n, 2_000, req);
    let wt = r.body.unwrap()["wrap_info"]["token"]
        .as_str()
        .unwrap()
        .to_string();
    let r = call(
        &mut n,
        2_000,
        Request::new(7, Method::Get, "auth/token/lookup-self").with_token(&wt),
    );
    assert_eq!(r.status, 403);
    let r = call(
        &mut n,
        2_000,
        Request::new(8, Method::Post, "sys/wrapping/unwrap").with_token(&wt),
    );
    assert_eq!(r.status, 400, "{:?}", r.body);
}

#[test]
fn wrapped_response_unwraps_once() {
    let (mut n, root) = dev();
    call(
        &mut n,
        2_000,
        Request::new(1, Method::Put, "secret/w")
            .with_token(&root)
            .with_json(json!({"k": "v"})),
    );
    let mut req = Request::new(2, Method::Get, "secret/w").with_token(&root);
    req.wrap_ttl = Some("5m".into());
    let r = call(&mut n, 2_000, req);
    let wt = r.body.unwrap()["wrap_info"]["token"]
        .as_str()
        .unwrap()
        .to_string();
    let u = call(
        &mut n,
        2_500,
        Request::new(3, Method::Post, "sys/wrapping/unwrap").with_token(&wt),
    );
    assert_eq!(u.status, 200);
    assert_eq!(u.body.unwrap()["data"]["k"], json!("v"));
    let again = call(
        &mut n,
        2_600,
        Request::new(4, Method::Post, "sys/wrapping/unwrap").with_token(&wt),
    );
    assert_eq!(again.status, 400);
}

#[test]
fn a_bad_wrap_ttl_changes_nothing_and_starts_nothing() {
    let (mut n, root) = dev();
    // Data keys only (node-local Merkle page records are flushed on their own clock).
    let data = |n: &Node<MemStorage>| -> Vec<(String, Vec<u8>)> {
        n.storage()
            .map
            .iter()
            .filter(|(k, _)| !k.starts_with("node/"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let before = data(&n);
    let mut req = Request::new(1, Method::Post, "auth/token/create")
        .with_token(&root)
        .with_json(json!({"policies": ["default"]}));
    req.wrap_ttl = Some("zzz".into());
    let r = call(&mut n, 2_000, req);
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.body.unwrap().to_string().contains("X-Vault-Wrap-TTL"));
    assert!(data(&n) == before, "a token was stored");
    // A login with a bad wrap TTL asks the directory nothing.
    let mut req =
        Request::new(2, Method::Post, "auth/ldap/login/alice").with_json(json!({"password": "pw"}));
    req.wrap_ttl = Some("-1".into());
    n.handle(2_000, Input::Request(req));
    let out: Vec<Output> = std::iter::from_fn(|| n.poll_output()).collect();
    assert!(out.iter().all(|o| !matches!(o, Output::Ldap(_))));
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::Response(r) if r.id == 2 && r.status == 400)));
    assert!(data(&n) == before, "the login changed storage");
}

#[test]
fn a_wrapped_token_create_is_one_write_set() {
    let (mut n, root) = dev();
    let mut req = Request::new(1, Method::Post, "auth/token/create")
        .with_token(&root)
        .with_json(json!({"policies": ["default"]}));
    req.wrap_ttl = Some("5m".into());
    let wal_before = n.replication().wal.last;
    let commits_before = n.storage().map.len();
    let r = call(&mut n, 2_000, req);
    assert_eq!(r.status, 200, "{r:?}");
    let b = r.body.unwrap();
    assert!(
        b["auth"].is_null() && b["wrap_info"]["token"].is_string(),
        "{b}"
    );
    assert!(n.storage().map.len() > commits_before);
    // Both the token and its wrapping were applied by one commit (the WAL is off on a
    // dev node, so the write-set count is what the replication layer saw).
    assert_eq!(n.replication().wal.last, wal_before);
    let wt = b["wrap_info"]["token"].as_str().unwrap().to_string();
    let u = call(
        &mut n,
        2_100,
        Request::new(2, Method::Post, "sys/wrapping/unwrap").with_token(&wt),
    );
    assert_eq!(u.status, 200);
    assert!(u.body.unwrap()["auth"]["client_token"].is_string());
}

/// `create` lets a token write keys that do not exist yet and `update` keys that do, on KV
/// version 1 and 2 mounts; a token granted both (or root) writes either way.
#[test]
fn create_and_update_capabilities_follow_whether_the_key_exists() {
    let (mut n, root) = dev();
    let id = std::cell::Cell::new(10);
    let next = || {
        id.set(id.get() + 1);
        id.get()
    };
    let req = |n: &mut Node<MemStorage>, m: Method, path: &str, tok: &str, body: Value| {
        let mut r = Request::new(next(), m, path).with_token(tok);
        if !body.is_null() {
            r = r.with_json(body);
        }
        call(n, 2_000, r).status
    };
    let v2 = json!({"type": "kv", "options": {"version": "2"}});
    assert_eq!(
        req(
            &mut n,
            Method::Post,
            "sys/mounts/k1",
            &root,
            json!({"type": "kv"})
        ),
        204
    );
    assert_eq!(req(&mut n, Method::Post, "sys/mounts/k2", &root, v2), 204);
    let token = |n: &mut Node<MemStorage>, name: &str, caps: &str| {
        let pol = format!(
            "path \"k1/*\" {{ capabilities = [{caps}] }}\npath \"k2/data/*\" {{ capabilities = [{caps}] }}"
        );
        let p = format!("sys/policies/acl/{name}");
        assert_eq!(
            req(n, Method::Put, &p, &root, json!({ "policy": pol })),
            204
        );
        let r = call(
            n,
            2_000,
            Request::new(next(), Method::Post, "auth/token/create")
                .with_token(&root)
                .with_json(json!({"policies": [name]})),
        );
        r.body.unwrap()["auth"]["client_token"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let create = token(&mut n, "c", "\"create\"");
    let update = token(&mut n, "u", "\"update\"");
    let both = token(&mut n, "cu", "\"create\", \"update\"");
    for (path, body) in [
        ("k1/", json!({"v": 1})),
        ("k2/data/", json!({"data": {"v": 1}})),
    ] {
        let key = |k: &str| format!("{path}{k}");
        let ok = if path == "k1/" { 204 } else { 200 };
        // A new key: create yes, update no.
        assert_eq!(
            req(&mut n, Method::Put, &key("new"), &update, body.clone()),
            403,
            "{path}"
        );
        assert_eq!(
            req(&mut n, Method::Put, &key("new"), &create, body.clone()),
            ok,
            "{path}"
        );
        // It exists now: update yes, create no.
        assert_eq!(
            req(&mut n, Method::Put, &key("new"), &create, body.clone()),
            403,
            "{path}"
        );
        let s = req(&mut n, Method::Put, &key("new"), &update, body.clone());
        assert_eq!(s, ok, "{path}");
        // Both: new and existing keys.
        for _ in 0..2 {
            let s = req(&mut n, Method::Put, &key("other"), &both, body.clone());
            assert_eq!(s, ok, "{path}");
        }
    }
}

/// The prefetch hint of a KV write names the stored key the write reads and then writes
/// (version 1: the value; version 2: the key's metadata); reads, other paths and a sealed
/// node give none.
#[test]
fn a_kv_writes_prefetch_hint_names_the_key_it_stores() {
    let (mut n, root) = dev();
    let mut id = 100;
    let mut req = |m: Method, path: &str, body: Value| {
        id += 1;
        let r = Request::new(id, m, path).with_token(&root);
        if body.is_null() {
            r
        } else {
            r.with_json(body)
        }
    };
    let mounts = [
        ("sys/mounts/k1", json!({"type": "kv"})),
        (
            "sys/mounts/k2",
            json!({"type": "kv", "options": {"version": "2"}}),
        ),
    ];
    for (path, body) in mounts {
        assert_eq!(
            call(&mut n, 2_000, req(Method::Post, path, body)).status,
            204
        );
    }
    for (path, body) in [
        ("k1/a/b", json!({"v": 1})),
        ("k1/c", json!({"v": 1})),
        ("k2/data/d", json!({"data": {"v": 1}})),
    ] {
        let r = req(Method::Put, path, body);
        let keys = n.prefetch_keys(&r);
        assert_eq!(keys.len(), 1, "{path}: {keys:?}");
        assert!(!n.storage.map.contains_key(&keys[0]), "{path}");
        assert!(call(&mut n, 2_000, r).status < 300, "{path}");
        assert!(n.storage.map.contains_key(&keys[0]), "{path}: {keys:?}");
    }
    for r in [
        req(Method::Get, "k1/a/b", Value::Null),
        req(Method::Put, "k2/config", json!({"max_versions": 3})),
        req(Method::Put, "sys/policies/acl/p", json!({"policy": ""})),
        req(Method::Put, "nomount/x", json!({"v": 1})),
    ] {
        assert_eq!(n.prefetch_keys(&r), Vec::<String>::new(), "{}", r.path);
    }
    let put = req(Method::Put, "k1/a/b", json!({"v": 2}));
    assert_eq!(n.prefetch_keys(&put).len(), 1);
    // Only for a stored token: nobody else makes the node read keys of their choosing.
    for token in [None, Some(""), Some("hvs.not-a-token")] {
        let mut anon = put.clone();
        anon.token = token.map(str::to_string);
        assert_eq!(n.prefetch_keys(&anon), Vec::<String>::new(), "{token:?}");
    }
    n.barrier.seal();
    assert_eq!(n.prefetch_keys(&put), Vec::<String>::new());
}

/// `sys/health` and `sys/seal-status` are reads: another method is a 405 in the error
/// envelope, as in the reference, sealed or not. Before, a `DELETE` or `PUT` answered 200
/// with the status.
#[test]
fn health_and_seal_status_answer_only_reads() {
    let (mut n, _) = dev();
    let mut id = 10;
    for path in ["sys/health", "sys/seal-status"] {
        for m in [
            Method::Put,
            Method::Post,
            Method::Delete,
            Method::List,
            Method::Patch,
        ] {
            id += 1;
            let req = Request::new(id, m, path).with_json(serde_json::json!({}));
            let r = call(&mut n, 2_000, req);
            assert_eq!(r.status, 405, "{m:?} {path}: {:?}", r.body);
            assert_eq!(
                r.body.expect("body")["errors"][0],
                "unsupported operation",
                "{m:?} {path}"
            );
        }
        id += 1;
        let r = call(&mut n, 2_000, Request::new(id, Method::Get, path));
        assert_eq!(r.status, 200, "{path}: {:?}", r.body);
    }
}
