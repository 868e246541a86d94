//! Snapshot saves off the core thread: a consistent read of the committed storage, opened on
//! a connection of its own at the point the node chose ([`cairn_core::Output::SnapshotSave`]),
//! and the thread that feeds its rows to the core's file writer and hands the file back to
//! the core as [`cairn_core::Input::SnapshotSaved`].
//!
//! SQLite (WAL journal): `BEGIN` and a first read on a second connection pin the database as
//! of the last commit; later commits of the core thread's connection go to the WAL beyond
//! that mark and the reader never sees them (a checkpoint meanwhile stops at the mark, so the
//! WAL file grows for the length of the save). PostgreSQL: a `REPEATABLE READ` transaction
//! takes its snapshot at its first query. Both are opened on the core thread right after the
//! batch that fixed the point commits and before the next one writes; only the reading runs
//! on the save's thread.

use crate::runtime::Msg;
use cairn_core::snapshot::SnapshotError;
use cairn_core::storage::{Storage, StorageError, Write};
use cairn_core::{Input, SnapshotSave};
use std::cell::RefCell;
use std::sync::mpsc::Sender;

/// A read of the whole storage as of the moment it was opened.
pub enum PinnedRead {
    Sqlite(rusqlite::Connection),
    Postgres {
        client: Box<RefCell<postgres::Client>>,
        table: String,
    },
}

/// Writes the file of `save` from `read` on a thread of its own and sends the result to the
/// core thread.
pub fn spawn(read: PinnedRead, save: SnapshotSave, core: Sender<Msg>) {
    let id = save.id;
    let spawned = std::thread::Builder::new()
        .name("cairn-snapshot".into())
        .spawn({
            let core = core.clone();
            move || {
                let started = std::time::Instant::now();
                let result = write(&read, save);
                if let Ok(file) = &result {
                    log::info!(
                        "snapshot of {} bytes written in {} ms",
                        file.len(),
                        started.elapsed().as_millis()
                    );
                }
                let _ = core.send(Msg::Input(Input::SnapshotSaved { id, result }));
            }
        });
    if let Err(e) = spawned {
        let _ = core.send(Msg::Input(Input::SnapshotSaved {
            id,
            result: Err(StorageError::Io(format!(
                "cannot start the thread that writes the snapshot: {e}"
            ))),
        }));
    }
}

/// The file of `save` from `storage` (the core thread's own storage where no second
/// connection can be had: an in-memory SQLite database).
pub fn write(storage: &dyn Storage, save: SnapshotSave) -> Result<Vec<u8>, StorageError> {
    save.writer.write_all(storage).map_err(|e| match e {
        SnapshotError::Storage(s) => s,
        other => StorageError::Io(other.to_string()),
    })
}

fn sqlite_err(e: rusqlite::Error) -> StorageError {
    StorageError::Io(format!("snapshot read of SQLite: {e}"))
}

fn pg_err(e: postgres::Error) -> StorageError {
    StorageError::Io(format!("snapshot read of PostgreSQL: {e}"))
}

impl Storage for PinnedRead {
    fn get(&self, _key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        Err(StorageError::Io("a snapshot read only scans".into()))
    }
    fn scan(&self, _prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        Err(StorageError::Io(
            "a snapshot read only scans in order".into(),
        ))
    }
    fn apply(&mut self, _writes: &[Write]) -> Result<(), StorageError> {
        Err(StorageError::Io("a snapshot read writes nothing".into()))
    }
    fn count(&self) -> Result<u64, StorageError> {
        Err(StorageError::Io(
            "a snapshot read only scans in order".into(),
        ))
    }
    fn scan_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        let from: &[u8] = after.map(str::as_bytes).unwrap_or(&[]);
        let n = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows: Vec<(Vec<u8>, Vec<u8>)> = match self {
            PinnedRead::Sqlite(c) => {
                let mut st = c
                    .prepare_cached(
                        "SELECT key, value FROM kv WHERE key > ?1 ORDER BY key LIMIT ?2",
                    )
                    .map_err(sqlite_err)?;
                let it = st
                    .query_map(rusqlite::params![from, n], |r| Ok((r.get(0)?, r.get(1)?)))
                    .map_err(sqlite_err)?;
                it.collect::<Result<_, _>>().map_err(sqlite_err)?
            }
            PinnedRead::Postgres { client, table } => client
                .borrow_mut()
                .query(
                    &format!("SELECT key, value FROM {table} WHERE key > $1 ORDER BY key LIMIT $2"),
                    &[&from, &n],
                )
                .map_err(pg_err)?
                .into_iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect(),
        };
        Ok(rows
            .into_iter()
            .map(|(k, v)| (crate::storage::key_string(k), v))
            .collect())
    }
}

/// Opens a pinned read of the SQLite database at `db`: `BEGIN` and a first read.
pub fn open_sqlite(db: &std::path::Path) -> Result<PinnedRead, StorageError> {
    let c = rusqlite::Connection::open(db).map_err(sqlite_err)?;
    c.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(sqlite_err)?;
    c.execute_batch("BEGIN").map_err(sqlite_err)?;
    // The first read starts the read transaction: from here on it sees this commit's state.
    c.query_row("SELECT count(*) FROM (SELECT 1 FROM kv LIMIT 1)", [], |r| {
        r.get::<_, i64>(0)
    })
    .map_err(sqlite_err)?;
    Ok(PinnedRead::Sqlite(c))
}

/// Opens a pinned read on a new PostgreSQL connection: a read-only `REPEATABLE READ`
/// transaction and a first query, which takes its snapshot.
pub fn open_postgres(
    mut client: postgres::Client,
    table: &str,
) -> Result<PinnedRead, StorageError> {
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .map_err(pg_err)?;
    client
        .query(&format!("SELECT 1 FROM {table} LIMIT 1"), &[])
        .map_err(pg_err)?;
    Ok(PinnedRead::Postgres {
        client: Box::new(RefCell::new(client)),
        table: table.to_string(),
    })
}
