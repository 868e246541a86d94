//! Tests of the runtime: admin answers, and batches that meet a full disk or a failed commit.

use super::*;
use cairn_core::admin::{AdminResult, DevKeys};

#[test]
fn admin_answers_find_their_callers_by_id_whatever_their_order() {
    let mut w = Waiting::default();
    let (tx1, rx1) = mpsc::sync_channel(1);
    let (tx2, rx2) = mpsc::sync_channel(1);
    let first = w.admin(tx1);
    let second = w.admin(tx2);
    assert_ne!(first, second);
    let keys = DevKeys {
        root_token: "root".into(),
        keys: vec!["0a".into()],
        keys_base64: vec!["Cg==".into()],
    };
    // The second command is answered first.
    let out: Vec<Delivery> = [
        w.admin_done(second, Ok(AdminResult::Flushed), None),
        w.admin_done(first, Ok(AdminResult::DevSetup(keys.clone())), None),
    ]
    .into_iter()
    .flatten()
    .collect();
    assert_eq!(out.len(), 2);
    let (core_tx, _core_rx) = mpsc::channel();
    for d in out {
        d.deliver(&core_tx);
    }
    assert_eq!(rx1.try_recv(), Ok(Ok(AdminResult::DevSetup(keys))));
    assert_eq!(rx2.try_recv(), Ok(Ok(AdminResult::Flushed)));
    // An answer nobody waits for (any more) goes nowhere.
    assert!(w
        .admin_done(first, Ok(AdminResult::Flushed), None)
        .is_none());
}

#[test]
fn a_batch_that_meets_a_full_disk_answers_507() {
    let mut w = Waiting::default();
    let full = BatchFailed::Storage(StorageError::Full);
    let (tx, _rx) = mpsc::sync_channel(1);
    w.requests.insert(7, tx);
    let ok = Response::no_content(7);
    let Some(Delivery::Response(_, r)) = w.response(ok, Some(&full)) else {
        panic!("no delivery for the waiting request");
    };
    assert_eq!(r.status, 507);
    let msg = r.body.as_ref().and_then(|b| b["errors"][0].as_str());
    assert!(msg.is_some_and(|m| m.starts_with("disk full: ")), "{r:?}");
    let (atx, arx) = mpsc::sync_channel(1);
    let id = w.admin(atx);
    let (core_tx, _core_rx) = mpsc::channel();
    if let Some(d) = w.admin_done(id, Ok(AdminResult::Flushed), Some(&full)) {
        d.deliver(&core_tx);
    }
    assert_eq!(arx.try_recv(), Ok(Err(ApiError::StorageFull)));
    // Any other storage failure stays a 500; a commit fenced off by a newer leader is a
    // 503 saying the write was not applied.
    let io = BatchFailed::Storage(StorageError::Io("disk I/O error".into()));
    assert_eq!(io.api_error().status(), 500);
    let fenced = BatchFailed::Storage(StorageError::Fenced {
        held: Some(1),
        current: 2,
    });
    assert_eq!(fenced.api_error().status(), 503);
    assert!(fenced.to_string().contains("not applied"), "{fenced}");
    assert_eq!(
        BatchFailed::Audit("x".into()).api_error(),
        ApiError::Internal("audit device failed: x".into())
    );
}

/// A batch whose commit fails and whose re-commit fails too (a deferred foreign key
/// planted on the storage's connection makes every `COMMIT` that wrote a key fail while
/// armed): every request of the batch is answered with a 5xx, nothing of it is stored,
/// and the node drops its in-memory state and comes back sealed; unsealed again, it
/// serves what was committed before and takes writes again.
#[test]
fn a_batch_whose_recommit_fails_too_answers_5xx_and_the_node_comes_back_sealed() {
    use cairn_core::api::{Method, Request};
    use serde_json::json;
    let dir = std::env::temp_dir().join(format!("cairn-recommit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let arm_db = dir.join("arm.db");
    let storage = crate::sqlite::SqliteStorage::open(&dir.join("cairn.db")).unwrap();
    storage
        .conn()
        .execute_batch(&format!(
            "PRAGMA foreign_keys = ON;
                 ATTACH '{}' AS arm;
                 CREATE TABLE IF NOT EXISTS arm.flag (x);
                 CREATE TEMP TABLE parent (id INTEGER PRIMARY KEY);
                 CREATE TEMP TABLE child (pid INTEGER REFERENCES parent (id)
                     DEFERRABLE INITIALLY DEFERRED);
                 CREATE TEMP TRIGGER doom AFTER INSERT ON main.kv
                     WHEN EXISTS (SELECT 1 FROM arm.flag)
                     BEGIN INSERT INTO child VALUES (1); END;",
            arm_db.display()
        ))
        .unwrap();
    let core = Core::start_with(
        ShellStorage::Sqlite(storage),
        NodeConfig::default(),
        1,
        None,
    )
    .unwrap();
    let Ok(AdminResult::DevSetup(keys)) = core.admin(Admin::DevSetup {
        root_token_id: Some("root-recommit".into()),
    }) else {
        panic!("dev setup failed");
    };
    let req = |id: u64, method: Method, path: &str, body: Option<serde_json::Value>| {
        let mut r = Request::new(id, method, path).with_token("root-recommit");
        if let Some(b) = body {
            r = r.with_json(b);
        }
        r
    };
    let put = |id: u64, path: &str, v: u64| {
        core.request(req(id, Method::Put, path, Some(json!({ "v": v }))))
    };
    let r = put(1, "secret/before", 1);
    assert!(r.status < 300, "{r:?}");

    // Armed: every commit that wrote a key fails, and so does its replay.
    let arm = rusqlite::Connection::open(&arm_db).unwrap();
    arm.busy_timeout(Duration::from_secs(10)).unwrap();
    arm.execute("INSERT INTO flag VALUES (1)", []).unwrap();
    let answers: Vec<Response> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4u64)
            .map(|i| {
                let put = &put;
                sc.spawn(move || put(10 + i, &format!("secret/doomed{i}"), i))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    arm.execute("DELETE FROM flag", []).unwrap();
    for a in &answers {
        // Never a false success: 500 for the failed commit, 503 for a request the
        // reset node (sealed) refused.
        assert!(a.status >= 500, "a request of the lost batch: {a:?}");
        let msg = a.body.as_ref().and_then(|b| b["errors"][0].as_str());
        assert!(
            msg.is_some_and(|m| !m.is_empty()),
            "no error message: {a:?}"
        );
    }
    assert!(
        answers.iter().any(|a| a.status == 500),
        "the failed batch itself answers 500: {answers:?}"
    );

    // The node dropped its memory: it is sealed, and refuses requests clearly.
    let st = core.request(Request::new(20, Method::Get, "sys/seal-status"));
    assert_eq!(
        st.body.as_ref().map(|b| b["sealed"].clone()),
        Some(json!(true)),
        "{st:?}"
    );
    let r = core.request(req(21, Method::Get, "secret/before", None));
    assert_eq!(r.status, 503, "{r:?}");

    // Unsealed again: what was committed before is there, nothing of the lost batch is,
    // and writes are taken again.
    let r = core.request(
        Request::new(22, Method::Put, "sys/unseal").with_json(json!({ "key": keys.keys[0] })),
    );
    assert_eq!(
        r.body.as_ref().map(|b| b["sealed"].clone()),
        Some(json!(false)),
        "{r:?}"
    );
    let r = core.request(req(23, Method::Get, "secret/before", None));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.body.as_ref().map(|b| b["data"]["v"].clone()),
        Some(json!(1))
    );
    for i in 0..4u64 {
        let r = core.request(req(30 + i, Method::Get, &format!("secret/doomed{i}"), None));
        assert_eq!(r.status, 404, "doomed{i} half-applied: {r:?}");
    }
    let r = put(40, "secret/after", 2);
    assert!(r.status < 300, "{r:?}");
    let r = core.request(req(41, Method::Get, "secret/after", None));
    assert_eq!(
        r.body.as_ref().map(|b| b["data"]["v"].clone()),
        Some(json!(2))
    );
    // The directory stays (the next run of this test empties it first): the node's
    // threads outlive this handle, and its sync thread, finding the database gone under
    // a late batch, would stop the whole test process as a server must (SIGABRT).
    drop(core);
}
