//! Model-based property tests: random sequences of client operations (token creation and
//! revocation, KV version 1 writes, reads and deletes, KV version 2 writes, patches, soft
//! deletes and reads of versions, under `rw` / `ro` / no-access policies) run
//! against the real `Node` and against a few maps that say what must happen; after every
//! sequence the incrementally kept Merkle trees equal a recomputation from storage and the
//! WAL holds one entry per replicated change.

use crate::api::{Method, Request, Response};
use crate::node::{Admin, Input, Node, NodeConfig, Output};
use crate::storage::MemStorage;
use quickcheck::{QuickCheck, TestResult};
use serde_json::{json, Value};
use std::collections::BTreeMap;

struct Harness {
    node: Node<MemStorage>,
    now: u64,
    next: u64,
}

impl Harness {
    fn new() -> Harness {
        let cfg = NodeConfig {
            license: crate::license::LicenseState::hosted(),
            ..Default::default()
        };
        let mut node = Node::new(MemStorage::new(), [4; 32], cfg);
        node.handle(
            1_000,
            Input::Admin {
                id: 1,
                cmd: Admin::DevSetup {
                    root_token_id: Some("root".into()),
                },
            },
        );
        while node.poll_output().is_some() {}
        let mut h = Harness {
            node,
            now: 1_000,
            next: 0,
        };
        h.call(
            "root",
            Method::Post,
            "sys/replication/performance/primary/enable",
            json!({}),
        );
        h.call(
            "root",
            Method::Post,
            "sys/mounts/kv2",
            json!({"type": "kv-v2"}),
        );
        let rw = r#"path "secret/*" { capabilities = ["create", "read", "update", "delete", "list"] }
            path "kv2/data/*" { capabilities = ["create", "read", "update", "delete", "patch"] }"#;
        let ro = r#"path "secret/*" { capabilities = ["read", "list"] }
            path "kv2/data/*" { capabilities = ["read"] }"#;
        h.call(
            "root",
            Method::Put,
            "sys/policies/acl/rw",
            json!({ "policy": rw }),
        );
        h.call(
            "root",
            Method::Put,
            "sys/policies/acl/ro",
            json!({ "policy": ro }),
        );
        h
    }

    fn call(&mut self, token: &str, method: Method, path: &str, body: Value) -> Response {
        self.next += 1;
        self.now += 1;
        let id = self.next;
        let req = Request::new(id, method, path)
            .with_token(token)
            .with_json(body);
        self.node.handle(self.now, Input::Request(req));
        for _ in 0..1_000 {
            while let Some(o) = self.node.poll_output() {
                if let Output::Response(r) = o {
                    if r.id == id {
                        return r;
                    }
                }
            }
            self.now += 1;
            self.node.handle(self.now, Input::Tick);
        }
        panic!("no response to {path}");
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Access {
    Rw,
    Ro,
    None,
}

fn run(ops: Vec<(u8, u8, u8, u8)>) -> TestResult {
    let mut h = Harness::new();
    // Model: live tokens and their access, and the KV data.
    let mut tokens: Vec<(String, Access, bool)> = vec![("root".into(), Access::Rw, true)];
    let mut kv: BTreeMap<String, u8> = BTreeMap::new();
    // KV version 2: each key's versions (value, soft-deleted).
    let mut kv2: BTreeMap<String, Vec<(u8, bool)>> = BTreeMap::new();
    // How many versions each key has had (the next write's number is one more).
    let mut kv2_count: BTreeMap<String, u64> = BTreeMap::new();
    for (op, a, b, v) in ops.into_iter().take(40) {
        let ti = a as usize % tokens.len();
        let (tok, access, alive) = tokens[ti].clone();
        let key = format!("secret/k{}", b % 6);
        let key2 = format!("kv2/data/k{}", b % 4);
        let write = alive && access == Access::Rw;
        match op % 8 {
            0 => {
                let (pol, acc) = match v % 3 {
                    0 => ("rw", Access::Rw),
                    1 => ("ro", Access::Ro),
                    _ => ("default", Access::None),
                };
                let r = h.call(
                    "root",
                    Method::Post,
                    "auth/token/create",
                    json!({ "policies": [pol] }),
                );
                if r.status != 200 {
                    return TestResult::error(format!("token create: {} {:?}", r.status, r.body));
                }
                let id = r.body.as_ref().map(|b| b["auth"]["client_token"].clone());
                let Some(Value::String(id)) = id else {
                    return TestResult::error("no client token");
                };
                tokens.push((id, acc, true));
            }
            1 if ti != 0 => {
                let r = h.call(&tok, Method::Post, "auth/token/revoke-self", json!({}));
                let want = if alive { 204 } else { 403 };
                if r.status != want {
                    return TestResult::error(format!("revoke-self: {} want {want}", r.status));
                }
                tokens[ti].2 = false;
            }
            2 => {
                let r = h.call(&tok, Method::Put, &key, json!({ "v": v }));
                let allowed = alive && access == Access::Rw;
                let want = if allowed { 204 } else { 403 };
                if r.status != want {
                    return TestResult::error(format!(
                        "write {key} with {access:?} alive={alive}: {} want {want}",
                        r.status
                    ));
                }
                if allowed {
                    kv.insert(key, v);
                }
            }
            3 => {
                let r = h.call(&tok, Method::Get, &key, json!(null));
                let allowed = alive && access != Access::None;
                let want = match (allowed, kv.get(&key)) {
                    (false, _) => 403,
                    (true, Some(_)) => 200,
                    (true, None) => 404,
                };
                if r.status != want {
                    return TestResult::error(format!("read {key}: {} want {want}", r.status));
                }
                if want == 200 {
                    let got = r.body.as_ref().map(|b| b["data"]["v"].clone());
                    if got != Some(json!(kv[&key])) {
                        return TestResult::error(format!("read {key}: {got:?} want {}", kv[&key]));
                    }
                }
            }
            5 | 6 => {
                // A write (5) or a merge patch (6) of a new version.
                let patch = op % 8 == 6;
                let versions = kv2.entry(key2.clone()).or_default();
                let live = versions.last().is_some_and(|(_, d)| !d);
                let (m, body) = if patch {
                    (Method::Patch, json!({"data": {"v": v}}))
                } else {
                    (Method::Put, json!({"data": {"v": v, "w": b}}))
                };
                let r = h.call(&tok, m, &key2, body);
                let want = match (write, patch, live) {
                    (false, ..) => 403,
                    (true, true, false) => 404,
                    _ => 200,
                };
                if r.status != want {
                    return TestResult::error(format!("v2 {m:?} {key2}: {} want {want}", r.status));
                }
                if want == 200 {
                    versions.push((v, false));
                    if versions.len() > 10 {
                        versions.remove(0);
                    }
                    let n = r.body.as_ref().map(|b| b["data"]["version"].clone());
                    let all = kv2_count.entry(key2.clone()).or_default();
                    *all += 1;
                    if n != Some(json!(all)) {
                        return TestResult::error(format!(
                            "v2 write {key2}: version {n:?} want {all}"
                        ));
                    }
                }
            }
            7 if v % 2 == 0 => {
                let r = h.call(&tok, Method::Delete, &key2, json!(null));
                let want = if write { 204 } else { 403 };
                if r.status != want {
                    return TestResult::error(format!(
                        "v2 delete {key2}: {} want {want}",
                        r.status
                    ));
                }
                if let Some(last) = kv2
                    .get_mut(&key2)
                    .and_then(|vs| vs.last_mut())
                    .filter(|_| write)
                {
                    last.1 = true;
                }
            }
            7 => {
                let r = h.call(&tok, Method::Get, &key2, json!(null));
                let latest = kv2.get(&key2).and_then(|vs| vs.last());
                let want = match (alive && access != Access::None, latest) {
                    (false, _) => 403,
                    (true, Some((_, false))) => 200,
                    (true, _) => 404,
                };
                if r.status != want {
                    return TestResult::error(format!("v2 read {key2}: {} want {want}", r.status));
                }
                if let (200, Some((val, _))) = (want, latest) {
                    let got = r.body.as_ref().map(|b| b["data"]["data"]["v"].clone());
                    if got != Some(json!(val)) {
                        return TestResult::error(format!("v2 read {key2}: {got:?} want {val}"));
                    }
                }
            }
            _ => {
                let r = h.call(&tok, Method::Delete, &key, json!(null));
                let allowed = alive && access == Access::Rw;
                let want = if allowed { 204 } else { 403 };
                if r.status != want {
                    return TestResult::error(format!("delete {key}: {} want {want}", r.status));
                }
                if allowed {
                    kv.remove(&key);
                }
            }
        }
    }
    // WAL/Merkle: the incrementally kept trees equal a recomputation from storage.
    let repl = h.node.replication();
    let fresh = crate::replication::reindex::rebuild_for_tests(h.node.storage(), repl);
    TestResult::from_bool(repl.trees == fresh)
}

#[test]
fn random_client_sequences_match_the_model() {
    QuickCheck::new()
        .tests(40)
        .quickcheck(run as fn(Vec<(u8, u8, u8, u8)>) -> TestResult);
}
