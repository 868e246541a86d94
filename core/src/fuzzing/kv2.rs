//! The `kv2_bodies` target: KV version 2 requests (data, patch, options, metadata, version
//! operations, subkeys, config) with arbitrary keys, queries and bodies, against a node
//! with a `kv2/` mount holding two versions of one key.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)] // a broken promise panics: that is the finding

use super::harness::{Harness, ROOT};
use super::Bytes;
use crate::api::{self, Method, Request};
use serde_json::{json, Value};

/// The mount's keys the inputs pick from (an input may also name its own).
const KEYS: &[&str] = &["k", "fresh", "dir/k", "dir/", "", "k/"];

/// Top-level fields of the engine's bodies, to wrap a fuzz value in.
const FIELDS: &[&str] = &[
    "data",
    "options",
    "cas",
    "versions",
    "max_versions",
    "cas_required",
    "delete_version_after",
    "custom_metadata",
];

/// What one operation sends: method, path under `kv2/`, whether its body is the mount's
/// JSON merge patch.
const OPS: &[(Method, &str, bool)] = &[
    (Method::Put, "data/", false),
    (Method::Post, "data/", false),
    (Method::Patch, "data/", true),
    (Method::Get, "data/", false),
    (Method::Delete, "data/", false),
    (Method::Post, "metadata/", false),
    (Method::Patch, "metadata/", true),
    (Method::Get, "metadata/", false),
    (Method::List, "metadata/", false),
    (Method::Delete, "metadata/", false),
    (Method::Post, "delete/", false),
    (Method::Post, "undelete/", false),
    (Method::Post, "destroy/", false),
    (Method::Get, "subkeys/", false),
    (Method::Post, "config", false),
    (Method::Get, "config", false),
];

/// This thread's node with the `kv2/` mount (two versions of `k`, metadata on it).
fn kv2_harness() -> Harness {
    thread_local! {
        static KV2: Harness = {
            let mut h = Harness::new(false);
            let steps = [
                (Method::Post, "sys/mounts/kv2", json!({"type": "kv-v2"})),
                (Method::Put, "kv2/data/k", json!({"data": {"v": 1, "n": {"a": [1, 2]}}})),
                (Method::Put, "kv2/data/k", json!({"data": {"v": 2}, "options": {"cas": 1}})),
                (Method::Post, "kv2/metadata/k", json!({"max_versions": 5, "custom_metadata": {"o": "x"}})),
                (Method::Put, "kv2/data/dir/k", json!({"data": {"x": "y"}})),
            ];
            for (m, p, b) in steps {
                let r = h.root(m, p, b);
                assert!(r.status < 300, "set-up {p}: {r:?}");
            }
            h
        };
    }
    KV2.with(Harness::clone)
}

/// A body for an operation: the rest of a chunk raw, or a fuzz JSON text under one of the
/// engine's fields (`{"data": …, "options": {"cas": N}}` for writes).
fn body(b: &mut Bytes, mode: u8) -> Vec<u8> {
    let raw = b.long_chunk();
    let wrap = |field: &str, extra: &str| {
        let mut v = format!("{{{extra}\"{field}\":").into_bytes();
        v.extend_from_slice(raw);
        v.push(b'}');
        v
    };
    match mode % 4 {
        0 => raw.to_vec(),
        1 => wrap("data", ""),
        2 => wrap(
            "data",
            &format!("\"options\":{{\"cas\":{}}},", b.byte() % 4),
        ),
        _ => wrap(FIELDS[usize::from(b.byte()) % FIELDS.len()], ""),
    }
}

/// Up to 6 KV version 2 operations: each an operation, a key (listed or arbitrary), a
/// query (`version`, `versions`, `depth`, `cas`…: arbitrary) and a body. Promises beyond
/// the router's (one well-formed answer, no internal error): a refused request leaves
/// storage byte-identical; a successful write of `{"data": D}` is read back as `D` with the
/// version the write answered.
pub fn kv2_bodies(data: &[u8]) {
    let mut b = Bytes::new(data);
    let mut h = kv2_harness();
    for _ in 0..6 {
        if b.is_empty() {
            break;
        }
        let sel = b.byte();
        let (method, op, patch) = OPS[usize::from(sel) % OPS.len()];
        let kb = b.byte();
        let key = match KEYS.get(usize::from(kb)) {
            Some(k) => (*k).to_string(),
            None => b.string(),
        };
        let path = if op == "config" {
            format!("kv2/{op}")
        } else {
            format!("kv2/{op}{key}")
        };
        let mut req = Request::new(0, method, &path).with_token(ROOT);
        if sel & 0x80 != 0 {
            let name = ["version", "versions", "depth", "cas", "list"][usize::from(kb % 5)];
            req.query = vec![(name.to_string(), b.string())];
        }
        let mode = b.byte();
        req.body = body(&mut b, mode);
        req.content_type = Some(if patch && mode & 0x10 == 0 {
            api::MERGE_PATCH.to_string()
        } else {
            "application/json".to_string()
        });
        h.now += u64::from(b.byte()) * 1000;
        let before = h.node.storage().map.clone();
        let sent = req.body.clone();
        let Some(r) = h.call(req) else {
            panic!("{method:?} {path}: no answer");
        };
        if r.status >= 400 {
            // The Merkle pages are derived from the data and written lazily (the first
            // request after a write flushes them): only the data counts.
            let after = &h.node.storage().map;
            let changed: Vec<&String> = after
                .iter()
                .filter(|(k, v)| before.get(*k) != Some(*v))
                .map(|(k, _)| k)
                .chain(before.keys().filter(|k| !after.contains_key(*k)))
                .filter(|k| !k.starts_with("node/merkle"))
                .collect();
            assert!(
                changed.is_empty(),
                "{method:?} {path} was refused ({}) but changed storage: {changed:?}",
                r.status
            );
            continue;
        }
        // Read-your-write for a plain version write.
        if op == "data/" && matches!(method, Method::Put | Method::Post) {
            let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(&sent) else {
                continue;
            };
            let Some(written) = o.get("data").filter(|d| d.is_object()) else {
                continue;
            };
            let version = r.body.as_ref().map(|v| v["data"]["version"].clone());
            let got = h.root(Method::Get, &path, Value::Null);
            assert_eq!(got.status, 200, "{path}: written, then {got:?}");
            let g = got.body.unwrap_or_default();
            assert_eq!(&g["data"]["data"], written, "{path}: read back other data");
            assert_eq!(
                Some(g["data"]["metadata"]["version"].clone()),
                version,
                "{path}: read back another version"
            );
        }
    }
}
