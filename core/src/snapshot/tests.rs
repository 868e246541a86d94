//! Snapshot files through a node: round trip, each refusal changing nothing, and any
//! corruption of a valid file refused or harmless.
use super::*;
use crate::api::{Method, Request, Response};
use crate::node::tests::call;
use crate::node::Node;
use crate::storage::MemStorage;
use quickcheck::{quickcheck, TestResult};
use serde_json::json;

const SNAP: &str = "sys/storage/raft/snapshot";

fn node(seed: u8) -> Node<MemStorage> {
    Node::dev_in_memory([seed; 32], "root")
}

fn put(n: &mut Node<MemStorage>, id: u64, key: &str, v: u64) {
    let r = call(
        n,
        2_000,
        Request::new(id, Method::Put, &format!("secret/{key}"))
            .with_token("root")
            .with_json(json!({ "v": v })),
    );
    assert_eq!(r.status, 204, "{r:?}");
}

fn save(n: &mut Node<MemStorage>, id: u64) -> Vec<u8> {
    let r = call(
        n,
        2_000,
        Request::new(id, Method::Get, SNAP).with_token("root"),
    );
    assert_eq!(r.status, 200, "{r:?}");
    let (ct, file) = r.raw.expect("a snapshot body");
    assert_eq!(ct, "application/octet-stream");
    file
}

fn restore(n: &mut Node<MemStorage>, id: u64, file: &[u8]) -> Response {
    let mut req = Request::new(id, Method::Post, SNAP).with_token("root");
    req.body = file.to_vec();
    call(n, 2_000, req)
}

/// The data a snapshot carries (node-local keys aside).
fn data(n: &Node<MemStorage>) -> Vec<(String, Vec<u8>)> {
    n.storage()
        .map
        .iter()
        .filter(|(k, _)| in_snapshot(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn read_v(n: &mut Node<MemStorage>, id: u64, key: &str) -> Option<u64> {
    let r = call(
        n,
        2_000,
        Request::new(id, Method::Get, &format!("secret/{key}")).with_token("root"),
    );
    match r.status {
        200 => r.body.and_then(|b| b["data"]["v"].as_u64()),
        404 => None,
        s => panic!("read {key}: {s} {r:?}"),
    }
}

#[test]
fn a_restore_brings_back_exactly_the_data_at_the_snapshot() {
    let mut n = node(1);
    put(&mut n, 1, "a", 1);
    put(&mut n, 2, "b", 2);
    let at_save = data(&n);
    let roots = n.replication().merkle_root(crate::replication::Mode::Dr);
    let file = save(&mut n, 3);
    // Values are stored encrypted, and the file holds them as stored.
    assert!(!file.windows(2).any(|w| w == b"\"v"));
    put(&mut n, 4, "a", 10);
    put(&mut n, 5, "c", 3);
    let r = call(
        &mut n,
        2_000,
        Request::new(6, Method::Put, "sys/policies/acl/late")
            .with_token("root")
            .with_json(json!({"policy": "path \"x\" { capabilities = [\"read\"] }"})),
    );
    assert_eq!(r.status, 204);
    assert_ne!(
        n.replication().merkle_root(crate::replication::Mode::Dr),
        roots
    );
    let r = restore(&mut n, 7, &file);
    assert_eq!(r.status, 204, "{r:?}");
    assert!(data(&n) == at_save, "storage differs from the snapshot");
    // The trees were rebuilt from the restored data: the roots are those of the snapshot.
    assert_eq!(
        n.replication().merkle_root(crate::replication::Mode::Dr),
        roots
    );
    assert_eq!(read_v(&mut n, 8, "a"), Some(1));
    assert_eq!(read_v(&mut n, 9, "b"), Some(2));
    assert_eq!(read_v(&mut n, 10, "c"), None);
    let r = call(
        &mut n,
        2_000,
        Request::new(11, Method::Get, "sys/policies/acl/late").with_token("root"),
    );
    assert_eq!(r.status, 404);
    // The node's derived state matches: new writes work and the trees equal a rebuild.
    put(&mut n, 12, "d", 4);
    assert_eq!(read_v(&mut n, 13, "d"), Some(4));
    // The same file restored again changes no data.
    let before = data(&n);
    let file2 = save(&mut n, 14);
    assert_eq!(restore(&mut n, 15, &file2).status, 204);
    assert!(data(&n) == before);
}

/// Every refusal: 400 naming the problem, and storage byte-identical.
#[test]
fn each_bad_file_is_refused_and_changes_nothing() {
    let mut n = node(2);
    put(&mut n, 1, "a", 1);
    let file = save(&mut n, 2);
    put(&mut n, 3, "a", 2);
    let mut other = node(3);
    let foreign = save(&mut other, 1);
    let mut version = file.clone();
    version[9] = 9;
    let mut flipped = file.clone();
    let mid = file.len() / 2;
    flipped[mid] ^= 0x40;
    // Altered and checksummed again: only the MAC sees it.
    let mut resummed = file.clone();
    let body_end = resummed.len() - 64;
    resummed[body_end - 1] ^= 1;
    let sum = crypto::sha256(&resummed[..body_end]);
    resummed[body_end..body_end + 32].copy_from_slice(&sum);
    let mut longer = file.clone();
    longer.push(0);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", Vec::new(), "body is empty"),
        ("json", b"{\"a\":1}".to_vec(), "not a Cairn snapshot"),
        ("truncated", file[..file.len() - 10].to_vec(), "truncated"),
        ("preamble", file[..12].to_vec(), "truncated"),
        ("longer", longer, "after its end"),
        ("version", version, "format version 9"),
        ("corrupted", flipped, "checksum"),
        ("foreign", foreign, "another cluster"),
        ("tampered", resummed, "authentication code"),
    ];
    for (i, (name, body, want)) in cases.into_iter().enumerate() {
        let before = n.storage().map.clone();
        let r = restore(&mut n, 10 + i as u64, &body);
        assert_eq!(r.status, 400, "{name}: {r:?}");
        let msg = r.body.unwrap()["errors"][0].as_str().unwrap().to_string();
        assert!(msg.contains(want), "{name}: {msg}");
        assert!(n.storage().map == before, "{name}: storage changed");
    }
    assert_eq!(read_v(&mut n, 30, "a"), Some(2));
}

#[test]
fn snapshots_need_sudo_and_force_is_refused() {
    let mut n = node(4);
    let r = call(
        &mut n,
        2_000,
        Request::new(1, Method::Put, "sys/policies/acl/rw")
            .with_token("root")
            .with_json(json!({"policy": "path \"sys/storage/*\" { capabilities = [\"read\", \"update\", \"create\"] }"})),
    );
    assert_eq!(r.status, 204);
    let r = call(
        &mut n,
        2_000,
        Request::new(2, Method::Post, "auth/token/create")
            .with_token("root")
            .with_json(json!({"policies": ["rw"]})),
    );
    let t = r.body.unwrap()["auth"]["client_token"]
        .as_str()
        .unwrap()
        .to_string();
    let r = call(
        &mut n,
        2_000,
        Request::new(3, Method::Get, SNAP).with_token(&t),
    );
    assert_eq!(r.status, 403);
    let file = save(&mut n, 4);
    let before = n.storage().map.clone();
    let mut req =
        Request::new(5, Method::Post, "sys/storage/raft/snapshot-force").with_token("root");
    req.body = file;
    let r = call(&mut n, 2_000, req);
    assert_eq!(r.status, 400);
    assert!(r
        .body
        .unwrap()
        .to_string()
        .contains("snapshot-force is not supported"));
    assert!(n.storage().map == before);
}

#[test]
fn a_sealed_node_refuses_both() {
    let mut n = node(5);
    let file = save(&mut n, 1);
    let r = call(
        &mut n,
        2_000,
        Request::new(2, Method::Put, "sys/seal").with_token("root"),
    );
    assert_eq!(r.status, 204);
    let before = n.storage().map.clone();
    assert_eq!(restore(&mut n, 3, &file).status, 503);
    let r = call(
        &mut n,
        2_000,
        Request::new(4, Method::Get, SNAP).with_token("root"),
    );
    assert_eq!(r.status, 503);
    assert!(n.storage().map == before);
}

/// A file of a dev node with a few keys, that node's snapshot keys and its data.
type Sample = (Vec<u8>, Keys, Vec<(String, Vec<u8>)>);

fn sample() -> Sample {
    let mut n = node(6);
    for i in 0..5 {
        put(&mut n, i + 1, &format!("k{i}"), i);
    }
    let file = save(&mut n, 10);
    let keys = n.barrier_for_tests().snapshot_keys().expect("unsealed");
    (file, keys, data(&n))
}

quickcheck! {
    /// Any corruption of a valid file (bytes flipped, cut, extended) is refused, or (only
    /// when it changed nothing) read back with exactly the original rows.
    fn any_corruption_is_refused_or_harmless(edits: Vec<(u32, u8)>, cut: Option<u32>, extra: Vec<u8>) -> TestResult {
        thread_local! {
            static SAMPLE: Sample = sample();
        }
        SAMPLE.with(|(file, keys, rows)| {
            let mut f = file.clone();
            for (pos, x) in &edits {
                let p = *pos as usize % f.len();
                f[p] ^= x;
            }
            if let Some(c) = cut {
                f.truncate(c as usize % (f.len() + 1));
            }
            f.extend_from_slice(&extra);
            match read(&f, keys) {
                Err(_) => TestResult::from_bool(f != *file),
                Ok(s) => TestResult::from_bool(f == *file && s.rows == *rows),
            }
        })
    }
}

quickcheck! {
    /// Any history of writes and deletes with a snapshot somewhere in it: the restore gives
    /// back exactly the data at the snapshot's point, and the node's Merkle trees (derived
    /// state) are those it had then.
    fn a_restore_returns_to_the_snapshot_point(ops: Vec<(u8, Option<u8>)>, at: usize) -> TestResult {
        if ops.len() > 40 {
            return TestResult::discard();
        }
        let mut n = node(7);
        let at = at % (ops.len() + 1);
        let mut saved = None;
        for (i, (k, v)) in ops.iter().enumerate() {
            if i == at {
                let roots = n.replication().merkle_root(crate::replication::Mode::Dr);
                saved = Some((save(&mut n, 1_000 + i as u64), data(&n), roots));
            }
            let path = format!("secret/k{}", k % 8);
            let req = match v {
                Some(v) => Request::new(i as u64 + 1, Method::Put, &path)
                    .with_token("root")
                    .with_json(json!({ "v": v })),
                None => Request::new(i as u64 + 1, Method::Delete, &path).with_token("root"),
            };
            let r = call(&mut n, 2_000, req);
            if r.status != 204 {
                return TestResult::error(format!("{path}: {r:?}"));
            }
        }
        let (file, want, roots) = match saved {
            Some(s) => s,
            None => {
                let roots = n.replication().merkle_root(crate::replication::Mode::Dr);
                (save(&mut n, 999), data(&n), roots)
            }
        };
        let r = restore(&mut n, 5_000, &file);
        TestResult::from_bool(
            r.status == 204
                && data(&n) == want
                && n.replication().merkle_root(crate::replication::Mode::Dr) == roots,
        )
    }
}

#[test]
fn a_file_of_a_performance_secondary_is_refused() {
    let mut n = node(8);
    put(&mut n, 1, "a", 1);
    let file = save(&mut n, 2);
    let keys = n.barrier_for_tests().snapshot_keys().expect("unsealed");
    let mut snap = read(&file, &keys).expect("a good file");
    snap.header.on_secondary = true;
    let forged = encode(&snap.header, &snap.rows, &keys);
    put(&mut n, 3, "a", 2);
    let before = n.storage().map.clone();
    let r = restore(&mut n, 4, &forged);
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r
        .body
        .unwrap()
        .to_string()
        .contains("performance secondary"));
    assert!(n.storage().map == before);
}

/// With offload the node answers nothing itself: it emits the writer, serves other requests
/// meanwhile, and answers with the file the driver wrote from storage as it was at the
/// save's input; that file restores to exactly that point.
#[test]
fn an_offloaded_save_answers_the_drivers_file_of_the_point() {
    let mut n = node(7);
    n.set_snapshot_offload(true);
    put(&mut n, 1, "a", 1);
    n.handle(
        2_000,
        crate::Input::Request(Request::new(2, Method::Get, SNAP).with_token("root")),
    );
    let mut save = None;
    while let Some(o) = n.poll_output() {
        match o {
            crate::Output::SnapshotSave(s) => save = Some(s),
            crate::Output::Response(r) => assert_ne!(r.id, 2, "answered before the file: {r:?}"),
            _ => {}
        }
    }
    let save = save.expect("a SnapshotSave output");
    assert_eq!(save.id, 2);
    assert_eq!(n.snapshot_saves_in_flight(), vec![2]);
    // The driver pins storage as it is now; the node goes on meanwhile.
    let pinned = n.storage().clone();
    let point = data(&n);
    put(&mut n, 3, "a", 2);
    put(&mut n, 4, "b", 3);
    let file = save.writer.write_all(&pinned).expect("written");
    n.handle(
        2_000,
        crate::Input::SnapshotSaved {
            id: 2,
            result: Ok(file.clone()),
        },
    );
    let mut answer = None;
    while let Some(o) = n.poll_output() {
        if let crate::Output::Response(r) = o {
            answer = Some(r);
        }
    }
    let r = answer.expect("the save's answer");
    assert_eq!((r.id, r.status), (2, 200), "{r:?}");
    assert_eq!(r.raw.map(|(_, f)| f), Some(file.clone()));
    assert!(n.snapshot_saves_in_flight().is_empty());
    // A second answer for the same request is dropped.
    n.handle(
        2_000,
        crate::Input::SnapshotSaved {
            id: 2,
            result: Ok(Vec::new()),
        },
    );
    assert!(n.poll_output().is_none());
    let r = restore(&mut n, 5, &file);
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(data(&n), point);
    assert_eq!(read_v(&mut n, 6, "a"), Some(1));
    assert_eq!(read_v(&mut n, 7, "b"), None);
}

/// A driver that could not read storage: the save is answered with the storage error.
#[test]
fn an_offloaded_save_that_fails_answers_the_error() {
    let mut n = node(8);
    n.set_snapshot_offload(true);
    n.handle(
        2_000,
        crate::Input::Request(Request::new(2, Method::Get, SNAP).with_token("root")),
    );
    while n.poll_output().is_some() {}
    n.handle(
        2_000,
        crate::Input::SnapshotSaved {
            id: 2,
            result: Err(crate::storage::StorageError::Io("disk gone".into())),
        },
    );
    let r = std::iter::from_fn(|| n.poll_output())
        .find_map(|o| match o {
            crate::Output::Response(r) => Some(r),
            _ => None,
        })
        .expect("an answer");
    assert_eq!((r.id, r.status), (2, 500), "{r:?}");
}

/// The writer fed in pieces writes the same file as fed at once, and refuses rows out of
/// order.
#[test]
fn the_writer_fed_in_pieces_writes_the_same_file() {
    let keys = Keys::from_barrier_key(&[3; 32]);
    let header = Header {
        cluster: String::new(),
        index: 9,
        rows: 0,
        taken_at: 1,
        node_id: "n".into(),
        on_secondary: false,
    };
    let rows: Vec<(String, Vec<u8>)> = (0..50)
        .map(|i| (format!("k/{i:03}"), vec![i as u8; i]))
        .chain([("node/x".to_string(), vec![1])])
        .collect();
    let whole = encode(&header, &rows, &keys);
    let mut w = Writer::new(keys.clone(), header.clone());
    for piece in rows.chunks(7) {
        w.push(piece.to_vec()).expect("in order");
    }
    assert_eq!(w.finish(), whole);
    let snap = read(&whole, &keys).expect("reads back");
    assert_eq!(snap.rows.len(), 50, "node-local rows are left out");
    let mut w = Writer::new(keys, header);
    w.push(vec![("b".to_string(), vec![])]).expect("first");
    assert!(w.push(vec![("a".to_string(), vec![])]).is_err());
}
