//! Tests of reindex and the Merkle check: progress, interruption and resumption, deferred
//! Merkle records, repairs, and what a rolled-back batch leaves behind.

use super::*;
use crate::api::{Method, Response};
use crate::node::{Admin, AdminResult, Input, Node, NodeConfig, Output};
use crate::replication::ReplicationConfig;
use crate::storage::{MemStorage, Storage};

/// A dev node on memory storage, its unseal key, and a clock.
struct One {
    node: Node<MemStorage>,
    key: String,
    now: u64,
    next: u64,
}

fn config(chunk: usize) -> NodeConfig {
    NodeConfig {
        replication: ReplicationConfig {
            scan_chunk: chunk,
            // These tests look at the stored records after each request.
            defer_merkle_ms: 0,
            ..Default::default()
        },
        license: crate::license::LicenseState::hosted(),
        ..Default::default()
    }
}

impl One {
    fn new(chunk: usize) -> One {
        One::with_config(config(chunk))
    }

    fn with_config(cfg: NodeConfig) -> One {
        let mut node = Node::new(MemStorage::new(), [9; 32], cfg);
        node.handle(
            1_000,
            Input::Admin {
                id: 1,
                cmd: Admin::DevSetup {
                    root_token_id: Some("root".into()),
                },
            },
        );
        let mut key = String::new();
        while let Some(o) = node.poll_output() {
            if let Output::AdminDone {
                result: Ok(AdminResult::DevSetup(k)),
                ..
            } = o
            {
                key = k.keys_base64[0].clone();
            }
        }
        One {
            node,
            key,
            now: 1_000,
            next: 0,
        }
    }

    /// The same storage in a new process (a crash: in-memory state is lost), unsealed.
    fn restart(&mut self, chunk: usize) {
        let storage = self.node.storage().clone();
        self.node = Node::new(storage, [10; 32], config(chunk));
        let key = self.key.clone();
        let r = self.call(Method::Post, "sys/unseal", json!({ "key": key }));
        assert_eq!(r.status, 200, "{:?}", r.body);
        // The next input loads replication state (trees, roles, an interrupted reindex).
        self.tick();
    }

    fn send(&mut self, method: Method, path: &str, body: Value) -> u64 {
        self.next += 1;
        let req = crate::api::Request::new(self.next, method, path)
            .with_token("root")
            .with_json(body);
        self.node.handle(self.now, Input::Request(req));
        self.next
    }

    /// Waits (ticking) for the response to request `id`.
    fn wait(&mut self, id: u64) -> Response {
        for _ in 0..100_000 {
            while let Some(o) = self.node.poll_output() {
                if let Output::Response(r) = o {
                    if r.id == id {
                        return r;
                    }
                }
            }
            self.tick();
        }
        panic!("no response to request {id}");
    }

    fn tick(&mut self) {
        self.now += 1;
        self.node.handle(self.now, Input::Tick);
    }

    fn call(&mut self, method: Method, path: &str, body: Value) -> Response {
        let id = self.send(method, path, body);
        self.wait(id)
    }

    fn ok(&mut self, method: Method, path: &str, body: Value) -> Value {
        let r = self.call(method, path, body);
        assert!(r.status < 300, "{path}: {} {:?}", r.status, r.body);
        r.body.unwrap_or(Value::Null)
    }

    fn report(&mut self) -> Value {
        self.ok(Method::Post, "sys/replication/merkle-check", json!({}))["data"]
            ["merkle_corruption_report"]
            .clone()
    }

    fn storage(&mut self) -> &mut MemStorage {
        self.node.storage_mut()
    }

    /// The trees the node serves equal a recomputation from storage, and so do the
    /// persisted records.
    fn assert_exact(&self) {
        let s = self.node.storage();
        let uuids = &self.node.replication().local_uuids;
        let fresh = rebuild(s, uuids).unwrap();
        assert!(
            self.node.replication().trees == fresh,
            "served trees drifted"
        );
        let report = merkle::check(&fresh, &fresh, &s.scan(merkle::PREFIX).unwrap());
        assert!(report.is_clean(), "persisted records drifted: {report:?}");
    }
}

fn fill(one: &mut One, n: usize) {
    for i in 0..n {
        one.ok(Method::Put, &format!("secret/k{i:03}"), json!({ "v": i }));
    }
}

fn clean(r: &Value) -> bool {
    r["corrupted_root"] == json!(false)
        && r["corrupted_tree_map"]
            .as_object()
            .is_some_and(|m| m.is_empty())
}

/// The stored page records of the KV mount's subtree.
fn kv_pages(s: &MemStorage) -> Vec<String> {
    s.map
        .keys()
        .filter(|k| k.starts_with("node/merkle/r/logical/") && !k.ends_with("/root"))
        .cloned()
        .collect()
}

#[test]
fn check_is_clean_on_a_healthy_node_and_status_records_it() {
    let mut one = One::new(5);
    fill(&mut one, 30);
    let r = one.report();
    assert!(clean(&r), "{r}");
    assert!(r["last_corruption_check_epoch"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    let st = one.ok(Method::Get, "sys/replication/performance/status", json!({}));
    let _ = st;
    one.assert_exact();
}

#[test]
fn corrupt_page_is_reported_precisely_and_repaired_by_reindex() {
    let mut one = One::new(4);
    fill(&mut one, 40);
    let pages = kv_pages(one.node.storage());
    let victim = pages[pages.len() / 2].clone();
    let page: usize = victim.rsplit('/').next().unwrap().parse().unwrap();
    let mut bytes = one.storage().map[&victim].clone();
    // Find a non-zero subpage and flip one byte of its sum.
    let sp = (0..merkle::SUBPAGES)
        .find(|i| bytes[i * 32..i * 32 + 32].iter().any(|b| *b != 0))
        .unwrap();
    bytes[sp * 32 + 5] ^= 0x40;
    one.storage().map.insert(victim.clone(), bytes);
    let r = one.report();
    assert_eq!(r["corrupted_root"], true, "{r}");
    let map = r["corrupted_tree_map"].as_object().unwrap();
    assert_eq!(map.len(), 1, "{r}");
    let entry = map.values().next().unwrap();
    assert_eq!(entry["tree_type"], "replicated");
    assert_eq!(entry["corrupted_subtree_root"], false, "{r}");
    let pm = entry["corrupted_index_tuples_map"].as_object().unwrap();
    assert_eq!(pm.len(), 1, "{r}");
    assert_eq!(pm[&page.to_string()]["corrupted"], true);
    assert_eq!(pm[&page.to_string()]["subpages"], json!([sp]));
    let st = one.ok(Method::Get, "sys/replication/dr/status", json!({}));
    let _ = st;
    // Reindex repairs it; the next check is clean.
    let w = one.ok(Method::Post, "sys/replication/reindex", json!({}));
    let warnings = w["warnings"].to_string();
    assert!(warnings.contains("records that differed"), "{warnings}");
    assert!(clean(&one.report()));
    one.assert_exact();
}

#[test]
fn corrupt_value_is_found_in_its_bucket_and_diff_names_the_key() {
    let mut one = One::new(6);
    one.ok(
        Method::Post,
        "sys/replication/performance/primary/enable",
        json!({}),
    );
    fill(&mut one, 25);
    let key = one
        .node
        .storage()
        .map
        .keys()
        .find(|k| k.starts_with("logical/"))
        .cloned()
        .unwrap();
    let mut v = one.storage().map[&key].clone();
    let last = v.len() - 1;
    v[last] ^= 1;
    one.storage().map.insert(key.clone(), v);
    let (p, s) = merkle::bucket(&key);
    let r = one.report();
    assert_eq!(r["corrupted_root"], true);
    let entry = r["corrupted_tree_map"]
        .as_object()
        .unwrap()
        .values()
        .next()
        .unwrap()
        .clone();
    assert_eq!(entry["corrupted_subtree_root"], true, "{r}");
    assert_eq!(
        entry["corrupted_index_tuples_map"][p.to_string()]["subpages"],
        json!([s]),
        "{r}"
    );
    let w = one.ok(
        Method::Post,
        "sys/replication/reindex",
        json!({ "diff": true, "force": true }),
    );
    let warnings = w["warnings"].to_string();
    assert!(warnings.contains(&key), "{warnings}");
    assert!(warnings.contains("the value is corrupt"), "{warnings}");
    assert!(clean(&one.report()));
    one.assert_exact();
}

#[test]
fn writes_during_a_scan_keep_the_fresh_trees_exact() {
    for seed in 0..6u64 {
        let mut one = One::new(3 + seed as usize);
        fill(&mut one, 20);
        let id = one.send(Method::Post, "sys/replication/reindex", json!({}));
        let mut resp = None;
        for i in 0..400u64 {
            let k = (i * 7 + seed * 13) % 30;
            if i % 3 == 0 {
                let _ = one.send(Method::Delete, &format!("secret/k{k:03}"), json!({}));
            } else {
                let _ = one.send(Method::Put, &format!("secret/k{k:03}"), json!({ "i": i }));
            }
            one.tick();
            while let Some(o) = one.node.poll_output() {
                if let Output::Response(r) = o {
                    if r.id == id {
                        resp = Some(r);
                    }
                }
            }
        }
        let r = resp.unwrap_or_else(|| one.wait(id));
        assert_eq!(r.status, 200, "{:?}", r.body);
        one.assert_exact();
        assert!(clean(&one.report()), "seed {seed}");
    }
}

#[test]
fn a_second_scan_is_refused_while_one_runs() {
    let mut one = One::new(1);
    fill(&mut one, 10);
    let id = one.send(Method::Post, "sys/replication/reindex", json!({}));
    let r = one.call(Method::Post, "sys/replication/merkle-check", json!({}));
    assert_eq!(r.status, 400);
    assert!(r.body.unwrap().to_string().contains("already running"));
    let st = one.ok(Method::Get, "sys/replication/status", json!({}));
    assert_eq!(st["data"]["dr"]["mode"], "disabled");
    assert_eq!(one.wait(id).status, 200);
}

#[test]
fn a_crash_mid_reindex_resumes_after_unseal() {
    let mut one = One::new(2);
    fill(&mut one, 20);
    let page = kv_pages(one.node.storage())[0].clone();
    let mut b = one.storage().map[&page].clone();
    b[0] ^= 0xff;
    one.storage().map.insert(page, b);
    let _ = one.send(Method::Post, "sys/replication/reindex", json!({}));
    for _ in 0..5 {
        one.tick();
    }
    assert!(one.node.replication().scan_progress().is_some());
    assert!(one.node.storage().map.contains_key(REINDEX_KEY));
    one.restart(2);
    assert!(
        one.node.replication().scan_progress().is_some(),
        "not resumed"
    );
    for _ in 0..2_000 {
        one.tick();
    }
    assert!(one.node.replication().scan_progress().is_none());
    assert!(!one.node.storage().map.contains_key(REINDEX_KEY));
    assert!(clean(&one.report()));
    one.assert_exact();
}

#[test]
fn deferred_merkle_records_are_written_within_a_second_and_a_crash_before_rebuilds() {
    let mut cfg = config(50);
    cfg.replication.defer_merkle_ms = 1_000;
    let mut one = One::with_config(cfg.clone());
    one.tick();
    fill(&mut one, 30);
    // Served at once, written later: the marker is gone and the records are behind.
    assert!(!one.node.storage().map.contains_key(merkle::MARKER));
    assert!(!one.node.replication().deferred.is_empty());
    let served = one.node.replication().trees.clone();
    let stored = one.node.storage().scan(merkle::PREFIX).unwrap();
    assert!(!merkle::check(&served, &served, &stored).is_clean());
    // A crash now: the next start rebuilds the same trees from the data, writes them.
    let mut crashed = One {
        node: Node::new(one.node.storage().clone(), [3; 32], cfg.clone()),
        key: one.key.clone(),
        now: one.now,
        next: 100,
    };
    crashed.restart(50);
    assert!(crashed.node.replication().trees == served);
    assert!(crashed.node.storage().map.contains_key(merkle::MARKER));
    crashed.assert_exact();
    // Without a crash they are written a second after the writes.
    one.now += 1_000;
    one.tick();
    assert!(one.node.storage().map.contains_key(merkle::MARKER));
    assert!(one.node.replication().deferred.is_empty());
    one.assert_exact();
    // A Merkle check writes what is deferred before it reads the records.
    fill(&mut one, 35);
    assert!(!one.node.storage().map.contains_key(merkle::MARKER));
    assert!(clean(&one.report()));
    one.assert_exact();
    one.tick();
    assert!(one.node.storage().map.contains_key(merkle::MARKER));
}

#[test]
fn skip_flush_writes_later_and_a_crash_before_it_rebuilds_on_load() {
    let mut one = One::new(50);
    fill(&mut one, 40);
    for p in kv_pages(one.node.storage()) {
        one.storage().map.remove(&p);
    }
    let w = one.ok(
        Method::Post,
        "sys/replication/reindex",
        json!({ "skip_flush": true }),
    );
    assert!(w["warnings"].to_string().contains("skip_flush"), "{w}");
    // The trees are served already; the records are not all written yet.
    assert!(!one.node.storage().map.contains_key(merkle::MARKER));
    let served = one.node.replication().trees.clone();
    // Crash now: the next start rebuilds from storage.
    let mut crashed = One {
        node: Node::new(one.node.storage().clone(), [3; 32], config(50)),
        key: one.key.clone(),
        now: one.now,
        next: 100,
    };
    crashed.restart(50);
    assert!(crashed.node.replication().trees == served);
    crashed.assert_exact();
    // Without a crash the flush finishes on its own.
    for _ in 0..20 {
        one.tick();
    }
    assert!(one.node.storage().map.contains_key(merkle::MARKER));
    one.assert_exact();
    assert!(clean(&one.report()));
}

#[test]
fn a_clean_shutdown_finishes_a_skipped_flush() {
    let mut one = One::new(50);
    fill(&mut one, 30);
    for p in kv_pages(one.node.storage()) {
        one.storage().map.remove(&p);
    }
    one.ok(
        Method::Post,
        "sys/replication/reindex",
        json!({ "skip_flush": true }),
    );
    assert!(!one.node.storage().map.contains_key(merkle::MARKER));
    one.node.handle(
        one.now,
        Input::Admin {
            id: 1,
            cmd: Admin::Shutdown,
        },
    );
    let mut done = None;
    while let Some(o) = one.node.poll_output() {
        if let Output::AdminDone { id: 1, result } = o {
            done = Some(result);
        }
    }
    assert_eq!(done, Some(Ok(AdminResult::Flushed)));
    assert!(one.node.storage().map.contains_key(merkle::MARKER));
    one.assert_exact();
}

#[test]
fn a_rolled_back_batch_is_forgotten_by_the_trees_and_the_wal() {
    let mut one = One::new(8);
    one.ok(
        Method::Post,
        "sys/replication/performance/primary/enable",
        json!({}),
    );
    fill(&mut one, 5);
    let before = one.node.storage().clone();
    let wal_before = one.node.replication().wal;
    one.ok(Method::Put, "secret/lost", json!({ "v": 1 }));
    assert!(one.node.replication().wal.last > wal_before.last);
    // The shell's transaction is rolled back: storage is as before the write.
    *one.node.storage_mut() = before;
    one.node.storage_rolled_back();
    one.tick();
    assert_eq!(one.node.replication().wal, wal_before);
    one.assert_exact();
    assert!(clean(&one.report()));
}

#[test]
fn reindex_needs_post_and_a_sudo_token() {
    let mut one = One::new(8);
    let r = one.call(Method::Get, "sys/replication/reindex", json!({}));
    assert_eq!(r.status, 405);
    one.next += 1;
    let req = crate::api::Request::new(one.next, Method::Post, "sys/replication/reindex");
    one.node.handle(one.now, Input::Request(req));
    let r = one.wait(one.next);
    assert_eq!(r.status, 403);
    let r = one.call(
        Method::Post,
        "sys/replication/reindex",
        json!({ "diff": "maybe" }),
    );
    assert_eq!(r.status, 400);
    assert!(r.body.unwrap().to_string().contains("diff"));
}

/// `scan_pace_ms = 0` (the server's setting): the node asks to be polled again at once while
/// a scan runs, each tick runs one chunk without the clock moving, a request sent between
/// two ticks is answered before the scan ends, and the scan finishes with the same result.
#[test]
fn an_unpaced_scan_runs_a_chunk_per_tick_without_the_clock_moving() {
    let mut cfg = config(5);
    cfg.replication.scan_pace_ms = 0;
    let mut one = One::with_config(cfg);
    fill(&mut one, 60);
    let id = one.send(Method::Post, "sys/replication/merkle-check", json!({}));
    let mut chunks = 0;
    let mut read = None;
    let report = loop {
        let mut done = None;
        while let Some(o) = one.node.poll_output() {
            if let Output::Response(r) = o {
                if r.id == id {
                    done = Some(r);
                } else if Some(r.id) == read {
                    assert_eq!(r.status, 200, "{:?}", r.body);
                    read = Some(0);
                }
            }
        }
        if let Some(r) = done {
            break r;
        }
        assert!(
            one.node.poll_timeout() <= one.now,
            "a running scan wants the next tick at once"
        );
        if chunks == 3 {
            read = Some(one.send(Method::Get, "secret/k007", json!({})));
        }
        one.node.handle(one.now, Input::Tick);
        chunks += 1;
        assert!(chunks < 10_000, "the scan does not end");
    };
    assert_eq!(read, Some(0), "the read between two chunks was answered");
    // 60 keys and the system's own, 5 a chunk.
    assert!(chunks > 12, "{chunks} ticks");
    let body = report.body.unwrap();
    assert!(clean(&body["data"]["merkle_corruption_report"]), "{body}");
}
