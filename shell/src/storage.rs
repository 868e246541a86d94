//! The server's storage engine: SQLite (a file, one server) or PostgreSQL (a shared
//! database), behind the one batch interface the runtime drives (begin, apply through
//! [`Storage`], commit, rollback).
//!
//! Both engines' `commit_unsynced` return before the batch is durable and the runtime's sync
//! thread makes it durable before answering: SQLite's with an `fdatasync` of its WAL
//! ([`ShellStorage::wal_sync`]), PostgreSQL's (pipelined, [`ShellStorage::pg_flush`]) with a
//! barrier commit on a connection of its own that confirms the batch's [`Ticket`]
//! ([`ShellStorage::take_tickets`]). PostgreSQL has no checkpointer. A PostgreSQL commit may
//! be fenced ([`ShellStorage::set_fence_mode`]): refused whole when another node took the
//! leader lease.

use crate::postgres::{FenceMode, PgFlush, PgStorage, Ticket};
use crate::sqlite::{Checkpointer, SqliteStorage, WalSync};
use cairn_core::storage::{Storage, StorageError, Write};

// One per server, owned by the core thread: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum ShellStorage {
    Sqlite(SqliteStorage),
    Postgres(PgStorage),
}

impl ShellStorage {
    /// Opens a batch.
    pub fn begin(&mut self) -> Result<(), StorageError> {
        match self {
            ShellStorage::Sqlite(s) => s.begin(),
            ShellStorage::Postgres(p) => p.begin(),
        }
    }

    /// Commits the batch; true when it wrote anything. Not yet durable: SQLite's syncs with
    /// [`ShellStorage::wal_sync`]'s syncer, PostgreSQL's (once pipelined) with the
    /// [`ShellStorage::pg_flush`] barrier confirming its [`ShellStorage::take_tickets`],
    /// before answering; PostgreSQL's is fenced under [`ShellStorage::set_fence_mode`]. On an error nothing of the
    /// batch is stored (or, SQLite, [`ShellStorage::take_lost_batch`] says so).
    pub fn commit_unsynced(&mut self) -> Result<bool, StorageError> {
        match self {
            ShellStorage::Sqlite(s) => s.commit_unsynced(),
            ShellStorage::Postgres(p) => {
                let mode = p.fence_mode();
                p.commit_mode(mode)
            }
        }
    }

    /// The open batch holds writes a commit would store.
    pub fn has_uncommitted_writes(&self) -> bool {
        match self {
            ShellStorage::Sqlite(s) => s.has_uncommitted_writes(),
            ShellStorage::Postgres(_) => true,
        }
    }

    /// The database file, for readers beside the core thread: SQLite on disk only (no
    /// second connection sees an in-memory database; PostgreSQL's HA nodes share theirs).
    pub fn sqlite_file(&self) -> Option<std::path::PathBuf> {
        match self {
            ShellStorage::Sqlite(s) => s.file(),
            ShellStorage::Postgres(_) => None,
        }
    }

    /// Drops the batch.
    pub fn rollback(&mut self) {
        match self {
            ShellStorage::Sqlite(s) => s.rollback(),
            ShellStorage::Postgres(p) => p.rollback(),
        }
    }

    /// True once after a batch the node holds in memory could not be stored even though the
    /// engine reported it committed (SQLite's disk-full replay failing); the runtime then
    /// drops the node's memory.
    pub fn take_lost_batch(&mut self) -> bool {
        match self {
            ShellStorage::Sqlite(s) => s.take_lost_batch(),
            ShellStorage::Postgres(_) => false,
        }
    }

    /// SQLite's checkpoint thread's work (none for PostgreSQL or an in-memory database).
    pub fn checkpointer(&mut self) -> Result<Option<Checkpointer>, StorageError> {
        match self {
            ShellStorage::Sqlite(s) => s.checkpointer(),
            ShellStorage::Postgres(_) => Ok(None),
        }
    }

    /// The syncer of SQLite's unsynced commits (none for PostgreSQL).
    pub fn wal_sync(&self) -> Option<WalSync> {
        match self {
            ShellStorage::Sqlite(s) => s.wal_sync(),
            ShellStorage::Postgres(_) => None,
        }
    }

    /// PostgreSQL: switches to pipelined commits and returns their flush barrier (see
    /// `postgres::flush`). `None` for SQLite, and when the flush connection cannot be opened
    /// (logged; every commit then waits for its flush at `COMMIT`, as without pipelining).
    pub fn pg_flush(&mut self) -> Option<PgFlush> {
        match self {
            ShellStorage::Sqlite(_) => None,
            ShellStorage::Postgres(p) => match p.pipeline() {
                Ok(f) => Some(f),
                Err(e) => {
                    log::warn!("PostgreSQL commits are not pipelined: {e}");
                    None
                }
            },
        }
    }

    /// The tickets of PostgreSQL's pipelined commits since the last call (none for SQLite).
    pub fn take_tickets(&mut self) -> Vec<Ticket> {
        match self {
            ShellStorage::Sqlite(_) => Vec::new(),
            ShellStorage::Postgres(p) => p.take_tickets(),
        }
    }

    /// Fences the following commits under `mode` (PostgreSQL; the core's `ha::Fence` one to
    /// one). SQLite takes only [`FenceMode::None`].
    pub fn set_fence_mode(&mut self, mode: FenceMode) -> Result<(), StorageError> {
        match self {
            ShellStorage::Postgres(p) => {
                p.set_fence_mode(mode);
                Ok(())
            }
            ShellStorage::Sqlite(_) if mode == FenceMode::None => Ok(()),
            ShellStorage::Sqlite(_) => Err(StorageError::Io(
                "SQLite storage has no leader lease to fence commits with".into(),
            )),
        }
    }

    /// A read of everything committed so far on a connection of its own, for a snapshot
    /// save off the core thread; `None` where there is none (in-memory SQLite).
    pub fn pinned_read(&self) -> Result<Option<crate::snapshot_read::PinnedRead>, StorageError> {
        match self {
            ShellStorage::Sqlite(s) => s.pinned_read(),
            ShellStorage::Postgres(p) => p.pinned_read().map(Some),
        }
    }

    /// The PostgreSQL storage, if that is the engine.
    pub fn postgres(&mut self) -> Option<&mut PgStorage> {
        match self {
            ShellStorage::Postgres(p) => Some(p),
            ShellStorage::Sqlite(_) => None,
        }
    }
}

impl Storage for ShellStorage {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        match self {
            ShellStorage::Sqlite(s) => s.get(key),
            ShellStorage::Postgres(p) => p.get(key),
        }
    }
    fn get_many(&self, keys: &[&str]) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        match self {
            ShellStorage::Sqlite(s) => s.get_many(keys),
            ShellStorage::Postgres(p) => p.get_many(keys),
        }
    }
    fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        match self {
            ShellStorage::Sqlite(s) => s.scan(prefix),
            ShellStorage::Postgres(p) => p.scan(prefix),
        }
    }
    fn apply(&mut self, writes: &[Write]) -> Result<(), StorageError> {
        match self {
            ShellStorage::Sqlite(s) => s.apply(writes),
            ShellStorage::Postgres(p) => p.apply(writes),
        }
    }
    fn scan_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        match self {
            ShellStorage::Sqlite(s) => s.scan_after(after, limit),
            ShellStorage::Postgres(p) => p.scan_after(after, limit),
        }
    }
    fn visit_after(
        &self,
        after: Option<&str>,
        limit: usize,
        visit: &mut dyn FnMut(&str, &[u8]),
    ) -> Result<usize, StorageError> {
        match self {
            ShellStorage::Sqlite(s) => s.visit_after(after, limit, visit),
            ShellStorage::Postgres(p) => p.visit_after(after, limit, visit),
        }
    }
    fn count(&self) -> Result<u64, StorageError> {
        match self {
            ShellStorage::Sqlite(s) => s.count(),
            ShellStorage::Postgres(p) => p.count(),
        }
    }
}

/// A stored key read back as a string, without copying it when it is UTF-8 (every key the
/// core writes is); any other bytes are replaced, as a lossy conversion does.
pub fn key_string(k: Vec<u8>) -> String {
    String::from_utf8(k).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}
