//! SQLite storage for the core: one table of binary keys and values, WAL journal,
//! `synchronous=FULL`, and explicit batch transactions so the runtime can group many inputs
//! into one durable commit and release their responses only after it.

use cairn_core::storage::{Storage, StorageError, Write};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;

pub struct SqliteStorage {
    conn: Connection,
    in_txn: bool,
}

fn err(e: rusqlite::Error) -> StorageError {
    StorageError(e.to_string())
}

/// The smallest byte string greater than every string starting with `prefix`.
fn upper_bound(prefix: &[u8]) -> Vec<u8> {
    let mut v = prefix.to_vec();
    v.push(0xff);
    v
}

impl SqliteStorage {
    pub fn open(path: &Path) -> Result<Self, StorageError> {
        let conn = Connection::open(path).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(err)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;",
        )
        .map_err(err)?;
        Ok(SqliteStorage {
            conn,
            in_txn: false,
        })
    }

    /// Opens a batch transaction.
    pub fn begin(&mut self) -> Result<(), StorageError> {
        if !self.in_txn {
            self.conn.execute_batch("BEGIN IMMEDIATE").map_err(err)?;
            self.in_txn = true;
        }
        Ok(())
    }

    /// Commits the batch durably.
    pub fn commit(&mut self) -> Result<(), StorageError> {
        if self.in_txn {
            self.in_txn = false;
            if let Err(e) = self.conn.execute_batch("COMMIT") {
                let _ = self.conn.execute_batch("ROLLBACK");
                return Err(err(e));
            }
        }
        Ok(())
    }

    /// Drops the batch.
    pub fn rollback(&mut self) {
        if self.in_txn {
            self.in_txn = false;
            let _ = self.conn.execute_batch("ROLLBACK");
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

    fn apply(&mut self, writes: &[Write]) -> Result<(), StorageError> {
        let own = !self.in_txn;
        if own {
            self.begin()?;
        }
        let res = (|| {
            for (k, v) in writes {
                match v {
                    Some(v) => {
                        let mut st = self
                            .conn
                            .prepare_cached(
                                "INSERT OR REPLACE INTO kv (key, value) VALUES (?1, ?2)",
                            )
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
        })();
        if own {
            match res {
                Ok(()) => self.commit()?,
                Err(_) => self.rollback(),
            }
        }
        res
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
    }
}
