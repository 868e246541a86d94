//! Tests of the SQLite storage: typed errors, a full disk, checkpoints, scans, failed write sets and the read cache.

use super::*;

#[test]
fn sqlite_errors_are_typed() {
    use rusqlite::ffi;
    let e = |code| err(rusqlite::Error::SqliteFailure(ffi::Error::new(code), None));
    assert_eq!(e(ffi::SQLITE_FULL), StorageError::Full);
    assert!(matches!(e(ffi::SQLITE_CORRUPT), StorageError::Corrupt(_)));
    assert!(matches!(e(ffi::SQLITE_NOTADB), StorageError::Corrupt(_)));
    assert!(matches!(e(ffi::SQLITE_IOERR), StorageError::Io(_)));
    assert!(matches!(e(ffi::SQLITE_BUSY), StorageError::Io(_)));
}

#[test]
fn a_database_out_of_space_refuses_the_write_set_with_full() {
    let mut s = SqliteStorage::open(Path::new(":memory:")).unwrap();
    s.apply(&[("a".into(), Some(b"v".to_vec()))]).unwrap();
    let pages: i64 = s
        .conn
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .unwrap();
    s.conn
        .pragma_update(None, "max_page_count", pages + 2)
        .unwrap();
    let big = vec![7u8; 1 << 20];
    assert_eq!(s.apply(&[("b".into(), Some(big))]), Err(StorageError::Full));
    assert_eq!(s.get("a").unwrap(), Some(b"v".to_vec()));
    assert_eq!(s.get("b").unwrap(), None);
}

#[test]
fn checkpoints_wait_for_the_interval_unless_the_wal_grew_a_lot() {
    let mb = 1u64 << 20;
    let ms = Duration::from_millis;
    // Small WALs are left alone, whenever the last checkpoint ran.
    assert!(!checkpoint_due(CHECKPOINT_BYTES, None));
    assert!(!checkpoint_due(mb, Some((ms(60_000), 0))));
    // The first large one is checkpointed at once.
    assert!(checkpoint_due(CHECKPOINT_BYTES + 1, None));
    // Then at most once an interval...
    assert!(!checkpoint_due(10 * mb, Some((ms(100), 10 * mb))));
    assert!(!checkpoint_due(
        10 * mb,
        Some((CHECKPOINT_INTERVAL - ms(1), 10 * mb))
    ));
    assert!(checkpoint_due(
        10 * mb,
        Some((CHECKPOINT_INTERVAL, 10 * mb))
    ));
    // ...unless the file grew by the growth bound since.
    assert!(!checkpoint_due(
        10 * mb + CHECKPOINT_GROWTH_BYTES - 1,
        Some((ms(100), 10 * mb))
    ));
    assert!(checkpoint_due(
        10 * mb + CHECKPOINT_GROWTH_BYTES,
        Some((ms(100), 10 * mb))
    ));
}

#[test]
fn scan_is_prefix_exact_and_ordered() {
    let dir = std::env::temp_dir().join(format!("cairn-sqlite-test-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    let mut s = SqliteStorage::open(&dir).unwrap();
    s.apply(&[
        ("a/1".into(), Some(b"x".to_vec())),
        ("a/é".into(), Some(b"y".to_vec())),
        ("a0".into(), Some(b"z".to_vec())),
        ("b".into(), Some(b"w".to_vec())),
    ])
    .unwrap();
    let keys: Vec<String> = s.scan("a/").unwrap().into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, vec!["a/1", "a/é"]);
    s.begin().unwrap();
    s.apply(&[("a/1".into(), None)]).unwrap();
    s.rollback();
    assert!(s.get("a/1").unwrap().is_some());
    let _ = std::fs::remove_file(&dir);
    let _ = std::fs::remove_file(format!("{}-reserve", dir.display()));
}
#[test]
fn a_failed_write_set_is_undone_whole_and_its_batch_goes_on() {
    let dir = std::env::temp_dir().join(format!("cairn-sqlite-fail-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    let mut s = SqliteStorage::open(&dir).unwrap();
    // Any write of the key `bad` fails (after the write set's earlier keys went in).
    s.conn
        .execute_batch(
            "CREATE TEMP TRIGGER refuse BEFORE INSERT ON kv WHEN NEW.key = X'626164' \
                 BEGIN SELECT RAISE(ABORT, 'refused'); END;",
        )
        .unwrap();
    let put = |k: &str| (k.to_string(), Some(b"v".to_vec()));
    // A later write set of the batch fails: the earlier one and the next one stay.
    s.begin().unwrap();
    s.apply(&[put("a")]).unwrap();
    assert!(s.apply(&[put("x"), put("bad")]).is_err());
    s.apply(&[put("c")]).unwrap();
    assert!(s.commit_unsynced().unwrap());
    // The first write set of a batch fails (no savepoint: the transaction goes).
    s.begin().unwrap();
    assert!(s.apply(&[put("y"), put("bad")]).is_err());
    s.apply(&[put("d")]).unwrap();
    assert!(s.commit_unsynced().unwrap());
    // Only a first write set, failing: nothing to commit.
    s.begin().unwrap();
    assert!(s.apply(&[put("z"), put("bad")]).is_err());
    assert!(!s.commit_unsynced().unwrap());
    let other = SqliteStorage::open(&dir).unwrap();
    for (k, want) in [
        ("a", true),
        ("x", false),
        ("c", true),
        ("y", false),
        ("d", true),
        ("z", false),
    ] {
        assert_eq!(s.get(k).unwrap().is_some(), want, "{k} (cache)");
        assert_eq!(other.get(k).unwrap().is_some(), want, "{k} (file)");
    }
    drop((s, other));
    for suffix in ["", "-wal", "-shm", "-reserve"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", dir.display()));
    }
}

#[test]
fn the_read_cache_follows_writes_and_dropped_transactions() {
    let dir = std::env::temp_dir().join(format!("cairn-sqlite-cache-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    let mut s = SqliteStorage::open(&dir).unwrap();
    assert_eq!(s.get("k").unwrap(), None); // cached as absent
    s.apply(&[("k".into(), Some(b"1".to_vec()))]).unwrap();
    assert_eq!(s.get("k").unwrap(), Some(b"1".to_vec()));
    // A write in a transaction that is dropped: the cache forgets it.
    s.begin().unwrap();
    s.apply(&[("k".into(), Some(b"2".to_vec()))]).unwrap();
    s.apply(&[("j".into(), Some(b"x".to_vec()))]).unwrap();
    assert_eq!(s.get("k").unwrap(), Some(b"2".to_vec()));
    assert_eq!(s.get("j").unwrap(), Some(b"x".to_vec()));
    s.rollback();
    assert_eq!(s.get("k").unwrap(), Some(b"1".to_vec()));
    assert_eq!(s.get("j").unwrap(), None);
    // Committed, without and with a sync.
    s.begin().unwrap();
    s.apply(&[("k".into(), None)]).unwrap();
    assert!(s.commit_unsynced().unwrap());
    assert_eq!(s.get("k").unwrap(), None);
    s.wal_sync().unwrap().sync().unwrap();
    s.begin().unwrap();
    assert!(
        !s.commit_unsynced().unwrap(),
        "a read-only batch wrote nothing"
    );
    // Scans: cached, kept exact by writes under the prefix, forgotten by a rollback.
    s.apply(&[("p/a".into(), Some(b"1".to_vec()))]).unwrap();
    assert_eq!(s.scan("p/").unwrap().len(), 1);
    s.apply(&[("p/b".into(), Some(b"2".to_vec()))]).unwrap();
    assert_eq!(s.scan("p/").unwrap().len(), 2);
    s.begin().unwrap();
    s.apply(&[("p/c".into(), Some(b"3".to_vec()))]).unwrap();
    assert_eq!(s.scan("p/").unwrap().len(), 3);
    s.rollback();
    assert_eq!(s.scan("p/").unwrap().len(), 2);
    // What another reader of the file sees agrees.
    let other = SqliteStorage::open(&dir).unwrap();
    assert_eq!(other.get("k").unwrap(), None);
    drop((s, other));
    for suffix in ["", "-wal", "-shm", "-reserve"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", dir.display()));
    }
}
