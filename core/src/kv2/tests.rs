//! KV version 2 driven through a dev node: mounting both ways, the endpoints' answers and
//! status codes, policies on the API paths, the upgrade of a version 1 mount, and a
//! quickcheck property comparing random operations with a model of each key's versions.

use crate::api::{Method, Request, Response};
use crate::node::Node;
use crate::storage::MemStorage;
use quickcheck::{QuickCheck, TestResult};
use serde_json::{json, Value};
use std::collections::BTreeMap;

struct H {
    node: Node<MemStorage>,
    now: u64,
    id: u64,
}

impl H {
    fn new() -> H {
        let mut h = H {
            node: Node::dev_in_memory([9; 32], "root"),
            now: 10_000,
            id: 0,
        };
        let r = h.call(
            "root",
            Method::Post,
            "sys/mounts/v2",
            json!({"type": "kv-v2"}),
        );
        assert_eq!(r.status, 204, "{r:?}");
        h
    }

    fn call(&mut self, token: &str, m: Method, path: &str, body: Value) -> Response {
        self.id += 1;
        self.now += 1_000;
        let (path, query) = path.split_once('?').unwrap_or((path, ""));
        let mut req = Request::new(self.id, m, path)
            .with_token(token)
            .with_json(body);
        req.query = query
            .split('&')
            .filter(|q| !q.is_empty())
            .map(|q| {
                let (k, v) = q.split_once('=').unwrap_or((q, ""));
                (k.to_string(), v.to_string())
            })
            .collect();
        crate::node::tests::call(&mut self.node, self.now, req)
    }

    fn root(&mut self, m: Method, path: &str, body: Value) -> Response {
        self.call("root", m, path, body)
    }

    fn token(&mut self, policy: &str) -> String {
        let r = self.root(
            Method::Put,
            "sys/policies/acl/p",
            json!({ "policy": policy }),
        );
        assert_eq!(r.status, 204, "{r:?}");
        let r = self.root(
            Method::Post,
            "auth/token/create",
            json!({"policies": ["p"], "no_default_policy": true}),
        );
        r.body.unwrap()["auth"]["client_token"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

fn data(r: &Response) -> Value {
    r.body
        .as_ref()
        .map(|b| b["data"].clone())
        .unwrap_or(Value::Null)
}

#[test]
fn both_ways_of_enabling_show_version_2_where_the_cli_looks() {
    let mut h = H::new();
    let r = h.root(
        Method::Post,
        "sys/mounts/v2b",
        json!({"type": "kv", "options": {"version": 2}}),
    );
    assert_eq!(r.status, 204);
    for p in ["v2", "v2b"] {
        let d = data(&h.root(Method::Get, &format!("sys/mounts/{p}"), json!(null)));
        assert_eq!(
            (d["type"].clone(), d["options"].clone()),
            (json!("kv"), json!({"version": "2"}))
        );
        let d = data(&h.root(Method::Get, &format!("sys/mounts/{p}/tune"), json!(null)));
        assert_eq!(d["options"], json!({"version": "2"}));
        let d = data(&h.root(
            Method::Get,
            &format!("sys/internal/ui/mounts/{p}/a/b"),
            json!(null),
        ));
        assert_eq!(d["options"]["version"], "2");
        assert_eq!(d["path"], format!("{p}/"));
    }
    let d = data(&h.root(Method::Get, "sys/mounts", json!(null)));
    assert_eq!(d["v2/"]["options"]["version"], "2");
    let r = h.root(
        Method::Post,
        "sys/mounts/v3",
        json!({"type": "kv", "options": {"version": "3"}}),
    );
    assert_eq!(r.status, 400);
}

#[test]
fn writes_reads_versions_and_check_and_set() {
    let mut h = H::new();
    let r = h.root(
        Method::Put,
        "v2/data/a",
        json!({"data": {"x": 1, "n": {"m": 2}}}),
    );
    assert_eq!(r.status, 200, "{r:?}");
    let d = data(&r);
    assert_eq!(d["version"], 1);
    assert_eq!(d["deletion_time"], "");
    // The time is the node's clock input (12 s after the epoch here).
    assert_eq!(d["created_time"], "1970-01-01T00:00:12.000000000Z");
    let r = h.root(
        Method::Put,
        "v2/data/a",
        json!({"data": {"x": 2}, "options": {"cas": 0}}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body.unwrap()["errors"][0],
        "check-and-set parameter did not match the current version"
    );
    let r = h.root(
        Method::Post,
        "v2/data/a",
        json!({"data": {"x": 2}, "options": {"cas": 1}}),
    );
    assert_eq!(data(&r)["version"], 2);
    let d = data(&h.root(Method::Get, "v2/data/a", json!(null)));
    assert_eq!(d["data"], json!({"x": 2}));
    assert_eq!(d["metadata"]["version"], 2);
    let d = data(&h.root(Method::Get, "v2/data/a?version=1", json!(null)));
    assert_eq!(d["data"], json!({"x": 1, "n": {"m": 2}}));
    assert_eq!(
        h.root(Method::Get, "v2/data/a?version=7", json!(null))
            .status,
        404
    );
    assert_eq!(h.root(Method::Get, "v2/data/none", json!(null)).status, 404);
    assert_eq!(
        h.root(Method::Get, "v2/data/a?version=x", json!(null))
            .status,
        400
    );
    assert_eq!(
        h.root(Method::Put, "v2/data/b", json!({"x": 1})).status,
        400
    );
    assert_eq!(
        h.root(Method::Put, "v2/data/", json!({"data": {}})).status,
        400
    );
    // Subkeys of version 1, to a depth.
    let d = data(&h.root(Method::Get, "v2/subkeys/a?version=1", json!(null)));
    assert_eq!(d["subkeys"], json!({"n": {"m": null}, "x": null}));
    let d = data(&h.root(Method::Get, "v2/subkeys/a?version=1&depth=1", json!(null)));
    assert_eq!(d["subkeys"], json!({"n": null, "x": null}));
    // The mount's root and paths outside the API.
    let r = h.root(Method::Get, "v2/", json!(null));
    assert_eq!(r.status, 404);
    assert!(r.body.unwrap()["warnings"][0]
        .as_str()
        .unwrap()
        .contains("root"));
    assert_eq!(h.root(Method::Get, "v2/other/x", json!(null)).status, 404);
}

#[test]
fn cas_required_by_the_mount_or_the_key() {
    let mut h = H::new();
    let r = h.root(
        Method::Post,
        "v2/config",
        json!({"cas_required": true, "max_versions": 4}),
    );
    assert_eq!(r.status, 204);
    let d = data(&h.root(Method::Get, "v2/config", json!(null)));
    assert_eq!(
        d,
        json!({"cas_required": true, "delete_version_after": "0s", "max_versions": 4, "metadata_cas_required": false})
    );
    let r = h.root(Method::Put, "v2/data/a", json!({"data": {"x": 1}}));
    assert_eq!(
        r.body.unwrap()["errors"][0],
        "check-and-set parameter required for this call"
    );
    let r = h.root(
        Method::Put,
        "v2/data/a",
        json!({"data": {"x": 1}, "options": {"cas": 0}}),
    );
    assert_eq!(r.status, 200);
    h.root(Method::Post, "v2/config", json!({"cas_required": false}));
    h.root(Method::Post, "v2/metadata/a", json!({"cas_required": true}));
    let r = h.root(Method::Put, "v2/data/a", json!({"data": {"x": 1}}));
    assert_eq!(r.status, 400);
}

#[test]
fn patch_merges_into_the_current_version() {
    let mut h = H::new();
    h.root(
        Method::Put,
        "v2/data/p",
        json!({"data": {"a": "1", "b": {"c": "2", "d": "3"}}}),
    );
    let r = h.root(
        Method::Patch,
        "v2/data/p",
        json!({"data": {"a": null, "b": {"d": "4"}, "e": "5"}}),
    );
    assert_eq!(data(&r)["version"], 2, "{r:?}");
    let d = data(&h.root(Method::Get, "v2/data/p", json!(null)));
    assert_eq!(d["data"], json!({"b": {"c": "2", "d": "4"}, "e": "5"}));
    assert_eq!(
        h.root(Method::Patch, "v2/data/none", json!({"data": {"a": 1}}))
            .status,
        404
    );
    assert_eq!(h.root(Method::Patch, "v2/data/p", json!({})).status, 400);
    let r = h.root(
        Method::Patch,
        "v2/data/p",
        json!({"data": {"a": 1}, "options": {"cas": 1}}),
    );
    assert_eq!(r.status, 400);
    // A deleted current version is a 404 showing its metadata.
    h.root(Method::Delete, "v2/data/p", json!(null));
    let r = h.root(Method::Patch, "v2/data/p", json!({"data": {"a": 1}}));
    assert_eq!(r.status, 404);
    assert_eq!(data(&r)["version"], 2);
}

#[test]
fn delete_undelete_destroy_and_metadata() {
    let mut h = H::new();
    for i in 0..3 {
        h.root(Method::Put, "v2/data/k", json!({"data": {"i": i}}));
    }
    assert_eq!(h.root(Method::Delete, "v2/data/k", json!(null)).status, 204);
    let r = h.root(Method::Get, "v2/data/k", json!(null));
    assert_eq!(r.status, 404);
    let d = data(&r);
    assert_eq!(d["data"], Value::Null);
    assert_ne!(d["metadata"]["deletion_time"], "");
    assert_eq!(
        h.root(Method::Post, "v2/undelete/k", json!({"versions": [3]}))
            .status,
        204
    );
    assert_eq!(
        data(&h.root(Method::Get, "v2/data/k", json!(null)))["data"]["i"],
        2
    );
    assert_eq!(
        h.root(Method::Post, "v2/delete/k", json!({"versions": [1, 9]}))
            .status,
        204
    );
    assert_eq!(
        h.root(Method::Get, "v2/data/k?version=1", json!(null))
            .status,
        404
    );
    let r = h.root(Method::Put, "v2/destroy/k", json!({"versions": [2]}));
    assert_eq!(r.status, 204);
    let r = h.root(Method::Get, "v2/data/k?version=2", json!(null));
    assert_eq!(
        (r.status, data(&r)["metadata"]["destroyed"].clone()),
        (404, json!(true))
    );
    let r = h.root(Method::Post, "v2/undelete/k", json!({"versions": [1, 2]}));
    assert_eq!(r.status, 204);
    assert_eq!(
        h.root(Method::Get, "v2/data/k?version=1", json!(null))
            .status,
        200
    );
    assert_eq!(
        h.root(Method::Get, "v2/data/k?version=2", json!(null))
            .status,
        404
    );
    let r = h.root(Method::Post, "v2/delete/k", json!({}));
    assert_eq!(r.body.unwrap()["errors"][0], "No version number provided");
    assert_eq!(
        h.root(Method::Post, "v2/destroy/none", json!({"versions": [1]}))
            .status,
        204
    );
    // Metadata: settings, custom metadata, the versions.
    let r = h.root(
        Method::Post,
        "v2/metadata/k",
        json!({"max_versions": 2, "custom_metadata": {"owner": "me"}, "delete_version_after": "1h"}),
    );
    assert_eq!(r.status, 204);
    let d = data(&h.root(Method::Get, "v2/metadata/k", json!(null)));
    assert_eq!(d["current_version"], 3);
    assert_eq!(d["max_versions"], 2);
    assert_eq!(d["delete_version_after"], "1h0m0s");
    assert_eq!(d["custom_metadata"], json!({"owner": "me"}));
    assert_eq!(d["current_metadata_version"], 1);
    assert_eq!(d["versions"]["2"]["destroyed"], true);
    // The next write trims to two versions and schedules its deletion an hour on.
    let r = h.root(Method::Put, "v2/data/k", json!({"data": {"i": 3}}));
    let v = data(&r);
    assert_eq!(v["custom_metadata"], json!({"owner": "me"}));
    let created = v["created_time"].as_str().unwrap().to_string();
    let deletion = v["deletion_time"].as_str().unwrap().to_string();
    assert_eq!(&created[..11], &deletion[..11]);
    assert_ne!(created, deletion);
    let d = data(&h.root(Method::Get, "v2/metadata/k", json!(null)));
    let kept: Vec<&String> = d["versions"].as_object().unwrap().keys().collect();
    assert_eq!(kept, ["3", "4"]);
    assert_eq!(d["oldest_version"], 3);
    assert_eq!(
        h.root(Method::Get, "v2/data/k?version=1", json!(null))
            .status,
        404
    );
    // Patch of metadata merges custom metadata.
    let r = h.root(
        Method::Patch,
        "v2/metadata/k",
        json!({"custom_metadata": {"k": "v"}}),
    );
    assert_eq!(r.status, 204);
    let d = data(&h.root(Method::Get, "v2/metadata/k", json!(null)));
    assert_eq!(d["custom_metadata"], json!({"k": "v", "owner": "me"}));
    assert_eq!(
        h.root(
            Method::Patch,
            "v2/metadata/none",
            json!({"max_versions": 1})
        )
        .status,
        404
    );
    // Listing.
    h.root(Method::Put, "v2/data/dir/x", json!({"data": {"a": 1}}));
    let d = data(&h.root(Method::List, "v2/metadata", json!(null)));
    assert_eq!(d["keys"], json!(["dir/", "k"]));
    assert_eq!(
        data(&h.root(Method::List, "v2/metadata/dir", json!(null)))["keys"],
        json!(["x"])
    );
    assert_eq!(
        h.root(Method::List, "v2/metadata/none", json!(null)).status,
        404
    );
    // Deleting the metadata removes every version.
    assert_eq!(
        h.root(Method::Delete, "v2/metadata/k", json!(null)).status,
        204
    );
    assert_eq!(
        h.root(Method::Get, "v2/metadata/k", json!(null)).status,
        404
    );
    assert_eq!(
        h.root(Method::Get, "v2/data/k?version=4", json!(null))
            .status,
        404
    );
    let left: Vec<String> = h
        .node
        .storage()
        .map
        .keys()
        .filter(|k| k.contains("/kv2/") && k.contains("/k/") || k.ends_with("/meta/k"))
        .cloned()
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn policies_name_the_api_paths_and_create_is_not_update() {
    let mut h = H::new();
    h.root(Method::Put, "v2/data/old", json!({"data": {"a": 1}}));
    let t = h.token(
        r#"path "v2/data/*" { capabilities = ["create", "read"] }
           path "v2/metadata/*" { capabilities = ["list"] }"#,
    );
    assert_eq!(
        h.call(&t, Method::Put, "v2/data/new", json!({"data": {"a": 1}}))
            .status,
        200
    );
    assert_eq!(
        h.call(&t, Method::Put, "v2/data/old", json!({"data": {"a": 2}}))
            .status,
        403
    );
    assert_eq!(
        h.call(&t, Method::Get, "v2/data/old", json!(null)).status,
        200
    );
    assert_eq!(
        h.call(&t, Method::Patch, "v2/data/old", json!({"data": {"a": 2}}))
            .status,
        403
    );
    assert_eq!(
        h.call(&t, Method::List, "v2/metadata/", json!(null)).status,
        200
    );
    assert_eq!(
        h.call(&t, Method::Get, "v2/metadata/old", json!(null))
            .status,
        403
    );
    assert_eq!(
        h.call(&t, Method::Post, "v2/destroy/old", json!({"versions": [1]}))
            .status,
        403
    );
    // The CLI's probe of the mount answers for a token that reaches only `v2/data/...`,
    // and hides the mount from one that reaches nothing under it.
    let r = h.call(
        &t,
        Method::Get,
        "sys/internal/ui/mounts/v2/old",
        json!(null),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(data(&r)["options"]["version"], "2");
    let d = data(&h.call(&t, Method::Get, "sys/internal/ui/mounts", json!(null)));
    assert!(
        d["secret"]["v2/"].is_object() && d["secret"]["secret/"].is_null(),
        "{d}"
    );
    let r = h.call(
        &t,
        Method::Get,
        "sys/internal/ui/mounts/secret/x",
        json!(null),
    );
    assert_eq!(r.status, 403, "{r:?}");
    let t = h.token(r#"path "v2/data/*" { capabilities = ["patch"] }"#);
    assert_eq!(
        h.call(&t, Method::Patch, "v2/data/old", json!({"data": {"a": 2}}))
            .status,
        200
    );
    let r = h.root(
        Method::Post,
        "sys/capabilities",
        json!({"token": t, "path": "v2/data/old"}),
    );
    assert_eq!(data(&r)["capabilities"], json!(["patch"]), "{r:?}");
}

#[test]
fn a_failed_write_applies_nothing() {
    let mut h = H::new();
    h.root(Method::Put, "v2/data/a", json!({"data": {"a": 1}}));
    let before = h.node.storage().map.clone();
    let r = h.root(
        Method::Put,
        "v2/data/a",
        json!({"data": {"a": 2}, "options": {"cas": 5}}),
    );
    assert_eq!(r.status, 400);
    let after = &h.node.storage().map;
    let changed: Vec<&String> = after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(v))
        .map(|(k, _)| k)
        .chain(before.keys().filter(|k| !after.contains_key(*k)))
        // The Merkle pages of earlier writes are flushed lazily; only data matters here.
        .filter(|k| k.starts_with("logical/"))
        .collect();
    assert!(changed.is_empty(), "{changed:?}");
}

#[test]
fn tuning_version_2_upgrades_a_version_1_mount_and_there_is_no_way_back() {
    let mut h = H::new();
    h.root(Method::Post, "sys/mounts/old", json!({"type": "kv"}));
    h.root(Method::Put, "old/a", json!({"x": 1}));
    h.root(Method::Put, "old/dir/b", json!({"y": 2}));
    let r = h.root(
        Method::Post,
        "sys/mounts/old/tune",
        json!({"options": {"version": "2"}}),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.unwrap()["warnings"][0]
        .as_str()
        .unwrap()
        .contains("Upgrading"));
    let d = data(&h.root(Method::Get, "old/data/dir/b", json!(null)));
    assert_eq!(
        (d["data"].clone(), d["metadata"]["version"].clone()),
        (json!({"y": 2}), json!(1))
    );
    assert_eq!(
        data(&h.root(Method::Get, "old/metadata/a", json!(null)))["oldest_version"],
        1
    );
    assert_eq!(h.root(Method::Get, "old/a", json!(null)).status, 404);
    let d = data(&h.root(Method::Get, "sys/mounts/old/tune", json!(null)));
    assert_eq!(d["options"], json!({"version": "2"}));
    let r = h.root(
        Method::Post,
        "sys/mounts/old/tune",
        json!({"options": {"version": "1"}}),
    );
    assert_eq!(
        r.body.unwrap()["errors"][0],
        "cannot downgrade mount from version 2"
    );
}

/// What the model keeps of one version.
#[derive(Clone, Debug)]
struct MVer {
    data: u8,
    deleted: bool,
    destroyed: bool,
}

/// Random operations (put with and without cas, patch, delete latest, delete/undelete/
/// destroy of one version, metadata write of max_versions, metadata delete) on three keys
/// against a model of each key's versions; every read of every version agrees.
fn run(ops: Vec<(u8, u8, u8)>) -> TestResult {
    let mut h = H::new();
    let mut model: BTreeMap<String, (u64, BTreeMap<u64, MVer>, u64)> = BTreeMap::new();
    for (op, k, v) in ops.into_iter().take(30) {
        let key = format!("k{}", k % 3);
        let entry = model.entry(key.clone()).or_insert((0, BTreeMap::new(), 0));
        let (current, versions, max) = &mut *entry;
        let n = u64::from(v % 5);
        let status = match op % 8 {
            0 | 1 => {
                let cas = (op % 8 == 1).then_some(n);
                let mut body = json!({"data": {"v": v}});
                if let Some(c) = cas {
                    body["options"] = json!({"cas": c});
                }
                let r = h.root(Method::Put, &format!("v2/data/{key}"), body);
                let ok = cas.is_none_or(|c| c == *current);
                if ok {
                    *current += 1;
                    versions.insert(
                        *current,
                        MVer {
                            data: v,
                            deleted: false,
                            destroyed: false,
                        },
                    );
                    let keep = if *max > 0 { *max } else { 10 };
                    while versions.len() as u64 > keep {
                        versions.pop_first();
                    }
                }
                (r.status, if ok { 200 } else { 400 })
            }
            2 => {
                let r = h.root(
                    Method::Patch,
                    &format!("v2/data/{key}"),
                    json!({"data": {"v": v}}),
                );
                let live = versions
                    .get(current)
                    .is_some_and(|m| !m.deleted && !m.destroyed);
                if live {
                    *current += 1;
                    versions.insert(
                        *current,
                        MVer {
                            data: v,
                            deleted: false,
                            destroyed: false,
                        },
                    );
                    let keep = if *max > 0 { *max } else { 10 };
                    while versions.len() as u64 > keep {
                        versions.pop_first();
                    }
                }
                (r.status, if live { 200 } else { 404 })
            }
            3 => {
                let r = h.root(Method::Delete, &format!("v2/data/{key}"), json!(null));
                if let Some(m) = versions.get_mut(current) {
                    m.deleted = !m.destroyed || m.deleted;
                }
                (r.status, 204)
            }
            4..=6 => {
                let path = ["delete", "undelete", "destroy"][usize::from(op % 8 - 4)];
                let r = h.root(
                    Method::Post,
                    &format!("v2/{path}/{key}"),
                    json!({"versions": [n]}),
                );
                if let Some(m) = versions.get_mut(&n) {
                    match path {
                        "delete" if !m.destroyed => m.deleted = true,
                        "undelete" if !m.destroyed => m.deleted = false,
                        "destroy" => m.destroyed = true,
                        _ => {}
                    }
                }
                (r.status, 204)
            }
            _ if v % 2 == 0 => {
                let r = h.root(
                    Method::Post,
                    &format!("v2/metadata/{key}"),
                    json!({"max_versions": n}),
                );
                *max = n;
                (r.status, 204)
            }
            _ => {
                let r = h.root(Method::Delete, &format!("v2/metadata/{key}"), json!(null));
                *entry = (0, BTreeMap::new(), 0);
                (r.status, 204)
            }
        };
        if status.0 != status.1 {
            return TestResult::error(format!("op {op} on {key}: {} want {}", status.0, status.1));
        }
        // Every version of every key reads as the model says.
        for (key, (current, versions, _)) in model.clone() {
            for n in 1..=current + 1 {
                let r = h.root(
                    Method::Get,
                    &format!("v2/data/{key}?version={n}"),
                    json!(null),
                );
                let want = match versions.get(&n) {
                    Some(m) if !m.deleted && !m.destroyed => Some(m.data),
                    _ => None,
                };
                match want {
                    Some(d) if r.status != 200 || data(&r)["data"]["v"] != json!(d) => {
                        return TestResult::error(format!("{key} v{n}: {r:?} want {d}"))
                    }
                    None if r.status != 404 => {
                        return TestResult::error(format!("{key} v{n}: {} want 404", r.status))
                    }
                    _ => {}
                }
            }
        }
    }
    TestResult::passed()
}

#[test]
fn random_version_operations_match_the_model() {
    QuickCheck::new()
        .tests(30)
        .quickcheck(run as fn(Vec<(u8, u8, u8)>) -> TestResult);
}
