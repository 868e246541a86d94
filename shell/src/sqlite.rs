//! SQLite storage for the core: one table of binary keys and values, WAL journal, and
//! explicit batch transactions so the runtime can group many inputs into one durable commit
//! and release their responses only after it.
//!
//! ## Durability
//!
//! The database runs with `synchronous=NORMAL`: a `COMMIT` writes the transaction's frames to
//! the `-wal` file without waiting for the disk, and [`WalSync::sync`] (an `fdatasync` of that
//! file) makes every transaction committed before it durable. SQLite itself syncs the WAL
//! before each checkpoint and the database after it, so a checkpoint never loses a committed
//! frame. [`SqliteStorage::commit`] commits and syncs at once; the runtime instead uses
//! [`SqliteStorage::commit_unsynced`] and has a separate thread sync and then release the
//! batch's answers, so the core thread runs the next batch while the disk works (pipelined
//! group commit; nothing is answered before the sync that covers it). Checkpoints run on a
//! thread of their own ([`Checkpointer`]), so neither of the two ever waits for one.
//!
//! ## A full disk
//!
//! The node applies each input's write set to the open batch transaction and updates its
//! in-memory replication state (Merkle trees, WAL position) as soon as the write set is in;
//! SQLite writes the pages at `COMMIT`. A `COMMIT` that fails for lack of space would leave
//! the node's memory ahead of its storage. So:
//!
//! - each write set is applied inside a savepoint (the transaction's first one needs none: the
//!   transaction itself is rolled back): one that fails (`SQLITE_FULL` or anything else) is
//!   undone whole and the node drops it, as it does for any failed input;
//! - a reserve file (`<db>-reserve`, [`RESERVE_BYTES`] or `CAIRN_STORAGE_RESERVE_BYTES`)
//!   holds space back: when `COMMIT` (or a write) meets a full disk, the reserve is deleted
//!   and the batch's write sets, kept in memory until the commit, are written again in a new
//!   transaction and committed, so what the node holds in memory is what is on disk;
//! - from then on the storage is in "disk full" mode: every write set is refused with
//!   [`StorageError::Full`] (the API answers 507) and reads keep working, until the reserve
//!   can be written again (tried at most once a second), which means space came back.
//!
//! Errors are typed ([`StorageError`]): a full disk (`SQLITE_FULL`, or no room for the
//! reserve) is `Full`, a damaged file (`SQLITE_CORRUPT`, `SQLITE_NOTADB`) is `Corrupt`,
//! anything else `Io`; the core chooses the API's status from the kind.
//!
//! ## Read cache
//!
//! Reads go through a small cache of recently read keys (negative answers included): the
//! node reads the same few keys (mount table, salt, policies, auth config) on every request.
//! Writes keep cached keys exact; a dropped transaction evicts the keys it wrote, a lost
//! batch empties the cache. Only this connection writes the database while the server runs.
//!
//! If even the replay fails, [`SqliteStorage::take_lost_batch`] tells the runtime, which
//! drops the node's in-memory state (it comes back sealed, from what is on disk).

use cairn_core::storage::{Storage, StorageError, Write};
use rusqlite::{params, Connection, OptionalExtension};
use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Default size of the reserve file: room for one more batch when the disk fills up (a batch
/// larger than this that meets a full disk makes the runtime drop the node's memory).
pub const RESERVE_BYTES: u64 = 2 << 20;

/// How often a storage in "disk full" mode checks whether space came back.
const PROBE_EVERY: Duration = Duration::from_secs(1);

pub struct SqliteStorage {
    conn: Connection,
    in_txn: bool,
    /// A batch is open ([`SqliteStorage::begin`]); its transaction may not have begun yet.
    batch: bool,
    /// Write sets applied in the open transaction, replayed if its `COMMIT` meets a full disk.
    log: Vec<Write>,
    /// The reserve file and its size (no reserve for in-memory databases or size 0).
    reserve: Option<(PathBuf, u64)>,
    /// Refusing writes because the disk is full (the reserve is used up).
    full: bool,
    last_probe: Option<Instant>,
    /// A batch the node already holds in memory could not be made durable.
    lost_batch: bool,
    /// Syncs committed transactions (none for an in-memory database).
    wal_sync: Option<WalSync>,
    cache: RefCell<ReadCache>,
}

/// Values of recently read keys (`None`: read and absent), and the results of recent small
/// prefix scans (audit devices, mounts: read on every request).
pub(crate) struct ReadCache {
    map: HashMap<String, Option<Vec<u8>>>,
    bytes: usize,
    scans: HashMap<String, Vec<(String, Vec<u8>)>>,
    /// Most bytes of values held ([`ReadCache::MAX_BYTES`] unless made smaller).
    max_bytes: usize,
}

impl Default for ReadCache {
    fn default() -> Self {
        ReadCache::holding(Self::MAX_BYTES)
    }
}

impl ReadCache {
    /// Most keys and bytes held; past either, the cache starts over.
    const MAX_KEYS: usize = 16_384;
    const MAX_BYTES: usize = 32 << 20;
    /// Larger values are not cached.
    const MAX_VALUE: usize = 64 << 10;

    /// Most prefixes, entries per scan and bytes per scan kept.
    const MAX_SCANS: usize = 256;
    const MAX_SCAN_ENTRIES: usize = 64;
    const MAX_SCAN_BYTES: usize = 64 << 10;

    /// An empty cache that holds at most `max_bytes` of values.
    pub(crate) fn holding(max_bytes: usize) -> Self {
        ReadCache {
            map: HashMap::new(),
            bytes: 0,
            scans: HashMap::new(),
            max_bytes,
        }
    }

    pub(crate) fn get(&self, key: &str) -> Option<Option<Vec<u8>>> {
        self.map.get(key).cloned()
    }

    pub(crate) fn scanned(&self, prefix: &str) -> Option<Vec<(String, Vec<u8>)>> {
        self.scans.get(prefix).cloned()
    }

    pub(crate) fn fill_scan(&mut self, prefix: &str, rows: &[(String, Vec<u8>)]) {
        let bytes: usize = rows.iter().map(|(k, v)| k.len() + v.len()).sum();
        if rows.len() > Self::MAX_SCAN_ENTRIES || bytes > Self::MAX_SCAN_BYTES {
            return;
        }
        if self.scans.len() >= Self::MAX_SCANS {
            self.scans.clear();
        }
        self.scans.insert(prefix.to_string(), rows.to_vec());
    }

    /// Scans whose prefix covers `key` are out of date.
    fn wrote_in_scans(&mut self, key: &str) {
        if !self.scans.is_empty() {
            self.scans.retain(|p, _| !key.starts_with(p.as_str()));
        }
    }

    pub(crate) fn fill(&mut self, key: &str, value: &Option<Vec<u8>>) {
        let size = value.as_ref().map_or(0, Vec::len);
        if size > Self::MAX_VALUE {
            return;
        }
        if self.map.len() >= Self::MAX_KEYS || self.bytes + size > self.max_bytes {
            self.clear();
        }
        self.bytes += size + key.len();
        if let Some(old) = self.map.insert(key.to_string(), value.clone()) {
            self.bytes -= old.map_or(0, |v| v.len()) + key.len();
        }
    }

    /// A write: a cached key takes the new value (keys not cached stay out).
    pub(crate) fn wrote(&mut self, key: &str, value: &Option<Vec<u8>>) {
        self.wrote_in_scans(key);
        if self.map.contains_key(key) {
            self.evict(key);
            self.fill(key, value);
        }
    }

    pub(crate) fn evict(&mut self, key: &str) {
        self.wrote_in_scans(key);
        if let Some(old) = self.map.remove(key) {
            self.bytes -= old.map_or(0, |v| v.len()) + key.len();
        }
    }

    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.bytes = 0;
        self.scans.clear();
    }
}

/// Makes committed transactions durable: `fdatasync` of the database's `-wal` file (of the
/// database file when there is no WAL file). Keeps the WAL file open between syncs (so a
/// write-back error is reported to this descriptor), reopening it when the file was
/// replaced.
pub struct WalSync {
    wal: PathBuf,
    db: PathBuf,
    open: Option<(File, u64)>,
}

/// A WAL file below this size is left alone (SQLite's own default threshold is 1,000
/// pages, about 4 MiB).
const CHECKPOINT_BYTES: u64 = 4 << 20;
/// A WAL past [`CHECKPOINT_BYTES`] is checkpointed at most this often, unless it grows by
/// [`CHECKPOINT_GROWTH_BYTES`] in between. Every checkpoint copies each page the WAL holds
/// into the database file and syncs that file, and its writes delay the WAL syncs that
/// acknowledgements wait for: checkpointing every 100 ms instead cost the login benchmark
/// about a tenth of its throughput (a page written many times in a second is copied once).
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// Growth of the WAL file since the last checkpoint that calls for one at once (a burst of
/// writes; the WAL is reused from its start after a checkpoint, so it grows only when more
/// is written between two checkpoints than it held before).
const CHECKPOINT_GROWTH_BYTES: u64 = 64 << 20;
/// The writer's own automatic checkpoint, in pages, once a [`Checkpointer`] runs them: a
/// backstop only, should the passive checkpoints keep failing to finish.
const BACKSTOP_CHECKPOINT_PAGES: i64 = 65_536;

/// Checkpoints the database from a connection of its own, on a thread of its own, so that
/// neither the core thread (which writes) nor the sync thread (which releases answers)
/// ever waits for a checkpoint's copying and syncs.
pub struct Checkpointer {
    wal: PathBuf,
    db: PathBuf,
    /// Opened at the first checkpoint.
    conn: Option<Connection>,
    /// When the last checkpoint ran and the WAL file's size then.
    last: Option<(Instant, u64)>,
}

/// Whether a WAL file of `size` bytes is due for a checkpoint, given the time since the last
/// one ran and the file's size then (`last`; none before the first).
fn checkpoint_due(size: u64, last: Option<(Duration, u64)>) -> bool {
    if size <= CHECKPOINT_BYTES {
        return false;
    }
    match last {
        None => true,
        Some((since, size_then)) => {
            since >= CHECKPOINT_INTERVAL
                || size >= size_then.saturating_add(CHECKPOINT_GROWTH_BYTES)
        }
    }
}

impl Checkpointer {
    /// Copies the WAL's frames into the database file when it is due ([`checkpoint_due`]),
    /// without blocking the writer (`PASSIVE`); the writer then starts the WAL over at its
    /// next transaction. A failure is logged and retried next time; a checkpoint never
    /// changes what is stored.
    pub fn run_if_due(&mut self) {
        let size = std::fs::metadata(&self.wal).map(|m| m.len()).unwrap_or(0);
        if !checkpoint_due(size, self.last.map(|(t, s)| (t.elapsed(), s))) {
            return;
        }
        self.last = Some((Instant::now(), size));
        if self.conn.is_none() {
            match Connection::open(&self.db) {
                Ok(c) => self.conn = Some(c),
                Err(e) => {
                    log::warn!("cannot open the database for a checkpoint: {e}");
                    return;
                }
            }
        }
        if let Some(c) = &self.conn {
            let res = c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(0));
            if let Err(e) = res {
                log::warn!("WAL checkpoint failed (retried later): {e}");
            }
        }
    }
}

impl WalSync {
    fn new(db: &Path) -> WalSync {
        WalSync {
            wal: PathBuf::from(format!("{}-wal", db.display())),
            db: db.to_path_buf(),
            open: None,
        }
    }

    /// Waits until every transaction committed so far is on disk.
    pub fn sync(&mut self) -> std::io::Result<()> {
        match std::fs::metadata(&self.wal) {
            Ok(m) => {
                if self.open.as_ref().map(|(_, ino)| *ino) != Some(m.ino()) {
                    self.open = Some((File::open(&self.wal)?, m.ino()));
                }
                match &self.open {
                    Some((f, _)) => f.sync_data(),
                    None => Ok(()),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.open = None;
                File::open(&self.db)?.sync_data()
            }
            Err(e) => Err(e),
        }
    }
}

fn is_full(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
}

/// The kind of a SQLite error: a full disk, a damaged file, or anything else.
pub(crate) fn err(e: rusqlite::Error) -> StorageError {
    use rusqlite::ErrorCode;
    match e.sqlite_error_code() {
        Some(ErrorCode::DiskFull) => StorageError::Full,
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => {
            StorageError::Corrupt(e.to_string())
        }
        _ => StorageError::Io(e.to_string()),
    }
}

/// The smallest byte string greater than every string starting with `prefix`.
/// One key read through `cache`, from `conn` on a miss (an absent key is cached too).
pub(crate) fn cached_get(
    conn: &Connection,
    cache: &RefCell<ReadCache>,
    key: &str,
) -> Result<Option<Vec<u8>>, StorageError> {
    if let Some(v) = cache.borrow().get(key) {
        return Ok(v);
    }
    let mut st = conn
        .prepare_cached("SELECT value FROM kv WHERE key = ?1")
        .map_err(err)?;
    let v = st
        .query_row(params![key.as_bytes()], |r| r.get::<_, Vec<u8>>(0))
        .optional()
        .map_err(err)?;
    cache.borrow_mut().fill(key, &v);
    Ok(v)
}

/// Every key under `prefix` with its value, in key order, through `cache`.
pub(crate) fn cached_scan(
    conn: &Connection,
    cache: &RefCell<ReadCache>,
    prefix: &str,
) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
    if let Some(rows) = cache.borrow().scanned(prefix) {
        return Ok(rows);
    }
    let rows = scan_rows(conn, prefix)?;
    cache.borrow_mut().fill_scan(prefix, &rows);
    Ok(rows)
}

/// Every key under `prefix` with its value, in key order, from `conn`.
fn scan_rows(conn: &Connection, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
    let mut st = conn
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
        out.push((crate::storage::key_string(k), v));
    }
    Ok(out)
}

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
        // Commits do not wait for the disk; `WalSync` does (see the module documentation).
        conn.pragma_update(None, "synchronous", "NORMAL")
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
        let on_disk = !file.is_empty() && file != ":memory:";
        let reserve =
            (size > 0 && on_disk).then(|| (PathBuf::from(format!("{file}-reserve")), size));
        let wal_sync = on_disk.then(|| WalSync::new(path));
        let mut s = SqliteStorage {
            conn,
            in_txn: false,
            batch: false,
            log: Vec::new(),
            reserve,
            full: false,
            last_probe: None,
            lost_batch: false,
            wal_sync,
            cache: RefCell::new(ReadCache::default()),
        };
        if let Some((p, size)) = &s.reserve {
            let have = std::fs::metadata(p)
                .map(|m| m.len() >= *size)
                .unwrap_or(false);
            if !have {
                if let Err(e) = write_reserve(p, *size) {
                    log::error!(
                        "disk full: cannot write the storage reserve {} ({e}); writes are \
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

    /// The connection, for tests that plant triggers or attach databases on it.
    #[cfg(test)]
    pub(crate) fn conn(&self) -> &Connection {
        &self.conn
    }

    /// A read of everything committed so far on a connection of its own
    /// ([`crate::snapshot_read`]); `None` for an in-memory database, which no second
    /// connection sees.
    pub fn pinned_read(&self) -> Result<Option<crate::snapshot_read::PinnedRead>, StorageError> {
        match &self.wal_sync {
            Some(w) => crate::snapshot_read::open_sqlite(&w.db).map(Some),
            None => Ok(None),
        }
    }

    /// The open batch holds write sets a commit would store.
    pub fn has_uncommitted_writes(&self) -> bool {
        self.in_txn && !self.log.is_empty()
    }

    /// The database file (`None` for an in-memory database).
    pub fn file(&self) -> Option<PathBuf> {
        self.wal_sync.as_ref().map(|w| w.db.clone())
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
                "disk full: the database's file system has no space left; using the reserve \
                 to finish the current batch and refusing writes until space is freed"
            );
        }
        self.full = true;
        self.last_probe = Some(Instant::now());
        if let Some((p, _)) = &self.reserve {
            let _ = std::fs::remove_file(p);
        }
    }

    /// Opens a batch: its transaction begins at its first write, so a batch that only reads
    /// (a login's first step, a token look-up) costs no `BEGIN`/`COMMIT`.
    pub fn begin(&mut self) -> Result<(), StorageError> {
        if !self.in_txn && !self.batch {
            self.probe_space();
            self.batch = true;
            self.log.clear();
        }
        Ok(())
    }

    /// Commits the batch durably (commit, then sync).
    pub fn commit(&mut self) -> Result<(), StorageError> {
        if self.commit_unsynced()? {
            if let Some(w) = self.wal_sync.as_mut() {
                w.sync()
                    .map_err(|e| StorageError::Io(format!("cannot sync the database: {e}")))?;
            }
        }
        Ok(())
    }

    /// Hands checkpoints over to the returned [`Checkpointer`] (none for an in-memory
    /// database): this connection then only checkpoints by itself past a much larger
    /// backstop.
    pub fn checkpointer(&mut self) -> Result<Option<Checkpointer>, StorageError> {
        let Some(w) = &self.wal_sync else {
            return Ok(None);
        };
        let c = Checkpointer {
            wal: w.wal.clone(),
            db: w.db.clone(),
            conn: None,
            last: None,
        };
        self.conn
            .pragma_update(None, "wal_autocheckpoint", BACKSTOP_CHECKPOINT_PAGES)
            .map_err(err)?;
        Ok(Some(c))
    }

    /// A syncer (its own descriptor) for [`SqliteStorage::commit_unsynced`] commits, to run
    /// on another thread (none for an in-memory database).
    pub fn wal_sync(&self) -> Option<WalSync> {
        self.wal_sync.as_ref().map(|w| WalSync::new(&w.db))
    }

    /// Commits the batch without waiting for the disk; true when it wrote anything (the
    /// caller must then sync with [`WalSync::sync`] before answering anyone). When the disk
    /// is full, the batch is written again with the reserve's space (see the module
    /// documentation).
    pub fn commit_unsynced(&mut self) -> Result<bool, StorageError> {
        self.batch = false;
        if !self.in_txn {
            return Ok(false);
        }
        self.in_txn = false;
        let wrote = !self.log.is_empty();
        match self.conn.execute_batch("COMMIT") {
            Ok(()) => {
                self.log.clear();
                Ok(wrote)
            }
            Err(e) => {
                if !self.conn.is_autocommit() {
                    let _ = self.conn.execute_batch("ROLLBACK");
                }
                if is_full(&e) {
                    self.enter_full();
                }
                self.replay().map(|()| wrote).inspect_err(|_| {
                    self.lost_batch = true;
                    self.cache.get_mut().clear();
                })
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
        self.batch = false;
        if self.in_txn {
            self.in_txn = false;
            let cache = self.cache.get_mut();
            for (k, _) in &self.log {
                cache.evict(k);
            }
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
    /// Applies a write set in the open batch, beginning its transaction at the first one.
    fn apply_in_batch(&mut self, writes: &[Write]) -> Result<(), StorageError> {
        if !self.in_txn {
            if self.full {
                return Err(StorageError::Full);
            }
            self.conn.execute_batch("BEGIN IMMEDIATE").map_err(err)?;
            self.in_txn = true;
        }
        self.apply_in_txn(writes)
    }

    fn apply_in_txn(&mut self, writes: &[Write]) -> Result<(), StorageError> {
        if self.full {
            return Err(StorageError::Full);
        }
        if self.log.is_empty() {
            // The transaction's first write set needs no savepoint (which would copy every
            // page it touches into a sub-journal): if it fails, the whole transaction goes.
            return match self.write_all(writes) {
                Ok(()) => {
                    let cache = self.cache.get_mut();
                    for (k, v) in writes {
                        cache.wrote(k, v);
                    }
                    self.log.extend(writes.iter().cloned());
                    Ok(())
                }
                Err(e) => {
                    if !self.conn.is_autocommit() {
                        let _ = self.conn.execute_batch("ROLLBACK");
                    }
                    // The batch stays open; its next write set begins a new transaction.
                    self.in_txn = false;
                    if e == StorageError::Full {
                        self.enter_full();
                    }
                    Err(e)
                }
            };
        }
        self.exec_cached("SAVEPOINT apply")?;
        match self.write_all(writes) {
            Ok(()) => {
                let released = self.exec_cached("RELEASE apply");
                let cache = self.cache.get_mut();
                for (k, v) in writes {
                    // Evicted if the release failed: the write set's fate is unknown here.
                    match &released {
                        Ok(()) => cache.wrote(k, v),
                        Err(_) => cache.evict(k),
                    }
                }
                released?;
                self.log.extend(writes.iter().cloned());
                Ok(())
            }
            Err(e) => {
                if self.conn.is_autocommit() {
                    // SQLite rolled the whole transaction back: start a new one holding the
                    // batch's earlier write sets (with the reserve's space if the disk is
                    // full), so that they are still committed with the batch.
                    if e == StorageError::Full {
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
                    if e == StorageError::Full {
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
        cached_get(&self.conn, &self.cache, key)
    }

    fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        cached_scan(&self.conn, &self.cache, prefix)
    }

    fn scan_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        let mut out = Vec::with_capacity(limit.min(4096));
        self.visit_after(after, limit, &mut |k, v| {
            out.push((k.to_string(), v.to_vec()))
        })?;
        Ok(out)
    }

    fn visit_after(
        &self,
        after: Option<&str>,
        limit: usize,
        visit: &mut dyn FnMut(&str, &[u8]),
    ) -> Result<usize, StorageError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT key, value FROM kv WHERE key > ?1 ORDER BY key LIMIT ?2")
            .map_err(err)?;
        let from: &[u8] = after.map(|a| a.as_bytes()).unwrap_or(&[]);
        let mut rows = st.query(params![from, limit as i64]).map_err(err)?;
        let mut n = 0;
        // Each row is borrowed from SQLite's cursor until the next step: no copy of the key
        // or the value (a key that is not UTF-8, which the core never writes, is converted
        // lossily, as `storage::key_string` converts the keys of the other reads).
        while let Some(row) = rows.next().map_err(err)? {
            let bytes = |i: usize| -> Result<&[u8], StorageError> {
                row.get_ref(i)
                    .map_err(err)?
                    .as_bytes()
                    .map_err(|e| StorageError::Io(e.to_string()))
            };
            let (k, v) = (bytes(0)?, bytes(1)?);
            visit(&String::from_utf8_lossy(k), v);
            n += 1;
        }
        Ok(n)
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
        if self.in_txn || self.batch {
            return self.apply_in_batch(writes);
        }
        // Outside a batch: a batch of its own.
        self.begin()?;
        match self.apply_in_batch(writes) {
            Ok(()) => self.commit(),
            Err(e) => {
                self.rollback();
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests;
