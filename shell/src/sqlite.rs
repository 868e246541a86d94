//! SQLite storage for the core: one table of binary keys and values, WAL journal,
//! `synchronous=FULL`, and explicit batch transactions so the runtime can group many inputs
//! into one durable commit and release their responses only after it.
//!
//! ## A full disk
//!
//! The node applies each input's write set to the open batch transaction and updates its
//! in-memory replication state (Merkle trees, WAL position) as soon as the write set is in;
//! SQLite writes the pages at `COMMIT`. A `COMMIT` that fails for lack of space would leave
//! the node's memory ahead of its storage. So:
//!
//! - each write set is applied inside a savepoint: one that fails (`SQLITE_FULL` or anything
//!   else) is undone whole and the node drops it, as it does for any failed input;
//! - a reserve file (`<db>-reserve`, [`RESERVE_BYTES`] or `CAIRN_STORAGE_RESERVE_BYTES`)
//!   holds space back: when `COMMIT` (or a write) meets a full disk, the reserve is deleted
//!   and the batch's write sets, kept in memory until the commit, are written again in a new
//!   transaction and committed, so what the node holds in memory is what is on disk;
//! - from then on the storage is in "disk full" mode: every write set is refused with a
//!   [`DISK_FULL`] error (the API answers 507) and reads keep working, until the reserve can
//!   be written again (tried at most once a second), which means space came back.
//!
//! If even the replay fails, [`SqliteStorage::take_lost_batch`] tells the runtime, which
//! drops the node's in-memory state (it comes back sealed, from what is on disk).

use cairn_core::storage::{Storage, StorageError, Write};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Start of the message of every storage error caused by a full disk (the runtime turns
/// requests that fail with it into 507 answers).
pub const DISK_FULL: &str = "disk full";

/// Default size of the reserve file: room for one more batch when the disk fills up (a batch
/// larger than this that meets a full disk makes the runtime drop the node's memory).
pub const RESERVE_BYTES: u64 = 2 << 20;

/// How often a storage in "disk full" mode checks whether space came back.
const PROBE_EVERY: Duration = Duration::from_secs(1);

pub struct SqliteStorage {
    conn: Connection,
    in_txn: bool,
    /// Write sets applied in the open transaction, replayed if its `COMMIT` meets a full disk.
    log: Vec<Write>,
    /// The reserve file and its size (no reserve for in-memory databases or size 0).
    reserve: Option<(PathBuf, u64)>,
    /// Refusing writes because the disk is full (the reserve is used up).
    full: bool,
    last_probe: Option<Instant>,
    /// A batch the node already holds in memory could not be made durable.
    lost_batch: bool,
}

fn is_full(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
}

fn full_error() -> StorageError {
    StorageError(format!(
        "{DISK_FULL}: the file system of the database has no space left; writes are refused \
         until space is freed (nothing of this request was applied)"
    ))
}

fn err(e: rusqlite::Error) -> StorageError {
    if is_full(&e) {
        return full_error();
    }
    StorageError(e.to_string())
}

/// The smallest byte string greater than every string starting with `prefix`.
fn upper_bound(prefix: &[u8]) -> Vec<u8> {
    let mut v = prefix.to_vec();
    v.push(0xff);
    v
}

/// Writes the reserve file (real blocks, not a sparse file) or removes what was written.
fn write_reserve(path: &Path, size: u64) -> std::io::Result<()> {
    use std::io::Write as _;
    let res = (|| {
        let mut f = std::fs::File::create(path)?;
        let chunk = vec![0u8; 1 << 20];
        let mut left = size;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            f.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        f.sync_all()
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(path);
    }
    res
}

impl SqliteStorage {
    pub fn open(path: &Path) -> Result<Self, StorageError> {
        let conn = Connection::open(path).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err)?;
        // Savepoint journals stay in memory: a full disk must not fail them.
        conn.pragma_update(None, "temp_store", "MEMORY")
            .map_err(err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(err)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;",
        )
        .map_err(err)?;
        let size = std::env::var("CAIRN_STORAGE_RESERVE_BYTES")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(RESERVE_BYTES);
        let file = path.as_os_str().to_string_lossy().into_owned();
        let reserve = (size > 0 && !file.is_empty() && file != ":memory:")
            .then(|| (PathBuf::from(format!("{file}-reserve")), size));
        let mut s = SqliteStorage {
            conn,
            in_txn: false,
            log: Vec::new(),
            reserve,
            full: false,
            last_probe: None,
            lost_batch: false,
        };
        if let Some((p, size)) = &s.reserve {
            let have = std::fs::metadata(p)
                .map(|m| m.len() >= *size)
                .unwrap_or(false);
            if !have {
                if let Err(e) = write_reserve(p, *size) {
                    log::error!(
                        "{DISK_FULL}: cannot write the storage reserve {} ({e}); writes are \
                         refused until space is freed",
                        p.display()
                    );
                    s.full = true;
                    s.last_probe = Some(Instant::now());
                }
            }
        }
        Ok(s)
    }

    /// True once after a batch the node holds in memory could not be committed.
    pub fn take_lost_batch(&mut self) -> bool {
        std::mem::take(&mut self.lost_batch)
    }

    /// In "disk full" mode, checks (at most once a second) whether the reserve can be
    /// written again; if so, writes are accepted again.
    fn probe_space(&mut self) {
        if !self.full {
            return;
        }
        let Some((p, size)) = self.reserve.clone() else {
            self.full = false;
            return;
        };
        if self.last_probe.is_some_and(|t| t.elapsed() < PROBE_EVERY) {
            return;
        }
        self.last_probe = Some(Instant::now());
        if write_reserve(&p, size).is_ok() {
            self.full = false;
            log::warn!("storage: space is available again; accepting writes");
        }
    }

    /// Enters "disk full" mode, giving the reserve's space to SQLite.
    fn enter_full(&mut self) {
        if !self.full {
            log::error!(
                "{DISK_FULL}: the database's file system has no space left; using the reserve \
                 to finish the current batch and refusing writes until space is freed"
            );
        }
        self.full = true;
        self.last_probe = Some(Instant::now());
        if let Some((p, _)) = &self.reserve {
            let _ = std::fs::remove_file(p);
        }
    }

    /// Opens a batch transaction.
    pub fn begin(&mut self) -> Result<(), StorageError> {
        if !self.in_txn {
            self.probe_space();
            self.conn.execute_batch("BEGIN IMMEDIATE").map_err(err)?;
            self.in_txn = true;
            self.log.clear();
        }
        Ok(())
    }

    /// Commits the batch durably. When the disk is full, the batch is written again with the
    /// reserve's space (see the module documentation).
    pub fn commit(&mut self) -> Result<(), StorageError> {
        if !self.in_txn {
            return Ok(());
        }
        self.in_txn = false;
        match self.conn.execute_batch("COMMIT") {
            Ok(()) => {
                self.log.clear();
                Ok(())
            }
            Err(e) => {
                if !self.conn.is_autocommit() {
                    let _ = self.conn.execute_batch("ROLLBACK");
                }
                if is_full(&e) {
                    self.enter_full();
                }
                self.replay().inspect_err(|_| self.lost_batch = true)
            }
        }
    }

    /// Writes the batch's write sets again in a new transaction and commits them.
    fn replay(&mut self) -> Result<(), StorageError> {
        let log = std::mem::take(&mut self.log);
        if log.is_empty() {
            return Ok(());
        }
        let res = (|| {
            self.conn.execute_batch("BEGIN IMMEDIATE").map_err(err)?;
            if let Err(e) = self.write_all(&log) {
                let _ = self.conn.execute_batch("ROLLBACK");
                return Err(e);
            }
            if let Err(e) = self.conn.execute_batch("COMMIT") {
                if !self.conn.is_autocommit() {
                    let _ = self.conn.execute_batch("ROLLBACK");
                }
                return Err(err(e));
            }
            Ok(())
        })();
        match &res {
            Ok(()) => log::warn!(
                "storage: the batch was committed again after a failed commit ({} writes)",
                log.len()
            ),
            Err(e) => log::error!("storage: the batch could not be committed again: {e}"),
        }
        res
    }

    /// Drops the batch.
    pub fn rollback(&mut self) {
        if self.in_txn {
            self.in_txn = false;
            self.log.clear();
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }

    fn write_all(&self, writes: &[Write]) -> Result<(), StorageError> {
        for (k, v) in writes {
            match v {
                Some(v) => {
                    let mut st = self
                        .conn
                        .prepare_cached("INSERT OR REPLACE INTO kv (key, value) VALUES (?1, ?2)")
                        .map_err(err)?;
                    st.execute(params![k.as_bytes(), v]).map_err(err)?;
                }
                None => {
                    let mut st = self
                        .conn
                        .prepare_cached("DELETE FROM kv WHERE key = ?1")
                        .map_err(err)?;
                    st.execute(params![k.as_bytes()]).map_err(err)?;
                }
            }
        }
        Ok(())
    }

    fn exec_cached(&self, sql: &str) -> Result<(), StorageError> {
        self.conn
            .prepare_cached(sql)
            .and_then(|mut st| st.execute([]))
            .map(|_| ())
            .map_err(err)
    }

    /// Applies one write set inside the batch transaction, whole or not at all.
    fn apply_in_txn(&mut self, writes: &[Write]) -> Result<(), StorageError> {
        if self.full {
            return Err(full_error());
        }
        self.exec_cached("SAVEPOINT apply")?;
        match self.write_all(writes) {
            Ok(()) => {
                self.exec_cached("RELEASE apply")?;
                self.log.extend(writes.iter().cloned());
                Ok(())
            }
            Err(e) => {
                if self.conn.is_autocommit() {
                    // SQLite rolled the whole transaction back: start a new one holding the
                    // batch's earlier write sets (with the reserve's space if the disk is
                    // full), so that they are still committed with the batch.
                    if e.0.starts_with(DISK_FULL) {
                        self.enter_full();
                    }
                    // If this fails too, `commit` replays the log.
                    let again = self
                        .conn
                        .execute_batch("BEGIN IMMEDIATE")
                        .map_err(err)
                        .and_then(|()| self.write_all(&self.log));
                    if let Err(e2) = again {
                        log::error!("storage: cannot restart the batch transaction: {e2}");
                    }
                } else {
                    let _ = self.exec_cached("ROLLBACK TO apply");
                    let _ = self.exec_cached("RELEASE apply");
                    if e.0.starts_with(DISK_FULL) {
                        self.enter_full();
                    }
                }
                Err(e)
            }
        }
    }
}

impl Storage for SqliteStorage {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT value FROM kv WHERE key = ?1")
            .map_err(err)?;
        st.query_row(params![key.as_bytes()], |r| r.get::<_, Vec<u8>>(0))
            .optional()
            .map_err(err)
    }

    fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT key, value FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key")
            .map_err(err)?;
        let rows = st
            .query_map(
                params![prefix.as_bytes(), upper_bound(prefix.as_bytes())],
                |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, Vec<u8>>(1)?)),
            )
            .map_err(err)?;
        let mut out = Vec::new();
        for row in rows {
            let (k, v) = row.map_err(err)?;
            out.push((String::from_utf8_lossy(&k).into_owned(), v));
        }
        Ok(out)
    }

    fn scan_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT key, value FROM kv WHERE key > ?1 ORDER BY key LIMIT ?2")
            .map_err(err)?;
        let from: &[u8] = after.map(|a| a.as_bytes()).unwrap_or(&[]);
        let rows = st
            .query_map(params![from, limit as i64], |r| {
                Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, Vec<u8>>(1)?))
            })
            .map_err(err)?;
        let mut out = Vec::with_capacity(limit.min(4096));
        for row in rows {
            let (k, v) = row.map_err(err)?;
            out.push((String::from_utf8_lossy(&k).into_owned(), v));
        }
        Ok(out)
    }

    fn count(&self) -> Result<u64, StorageError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT count(*) FROM kv")
            .map_err(err)?;
        st.query_row([], |r| r.get::<_, i64>(0))
            .map(|n| n.max(0) as u64)
            .map_err(err)
    }

    fn apply(&mut self, writes: &[Write]) -> Result<(), StorageError> {
        if self.in_txn {
            return self.apply_in_txn(writes);
        }
        self.begin()?;
        match self.apply_in_txn(writes) {
            Ok(()) => self.commit(),
            Err(e) => {
                self.rollback();
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
