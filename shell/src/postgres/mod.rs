//! PostgreSQL storage, the engine beside SQLite for servers that share one database (HA):
//! this module owns the connection settings (`storage "postgresql"`), the schema and its
//! version, [`PgStorage`] (the core's [`Storage`] with the runtime's batch interface) and
//! [`PgLease`] (the leader lease and the node registry, on a connection of their own: in
//! [`lease`]).
//!
//! ## Batches
//!
//! A batch's write sets are kept in memory ([`PgStorage::begin`], then [`Storage::apply`]
//! for each input): reads in the batch see them laid over what is committed, since only this
//! connection writes while the node is the active one. [`PgStorage::commit`] writes the
//! batch's last value of each key in one database transaction with few round trips (one
//! upsert of `unnest`ed arrays, one delete of an array), and `COMMIT` returns once PostgreSQL
//! made it durable: no separate sync step. A failed commit (or [`PgStorage::rollback`])
//! drops the batch whole; the runtime then answers its inputs with the error and the node
//! reloads what it derived from it. (A connection that breaks after `COMMIT` was sent leaves
//! the outcome unknown, as with any database client: the inputs are answered with the error,
//! and what the node reloads is whatever the database kept. The next use reconnects.)
//!
//! ## Read cache
//!
//! With one writer (no `ha_enabled`), reads go through SQLite's cache of recently read keys
//! and small scans ([`crate::sqlite`]'s `ReadCache`), kept exact by this storage's commits. With
//! several nodes on the database another one may write, so the cache is off
//! ([`PgStorage::set_read_cache`]; a node that becomes the only writer may turn it on, which
//! starts it empty). A failed commit or a reconnect empties it.
//!
//! ## Fencing
//!
//! `commit(Some(epoch))` locks the lease row (`SELECT epoch ... FOR SHARE`) in the batch's own
//! transaction and rolls the batch back with [`StorageError::Fenced`] if the lease is at
//! another epoch. Taking the lease ([`PgLease::try_acquire`]) bumps the epoch with an
//! `UPDATE` of that row, which waits for every transaction holding the share lock: a commit
//! that saw its epoch current finishes before a new holder's epoch exists, and one that
//! starts after sees the new epoch and writes nothing. Times in the lease table are the
//! database's clock (`now()`), so the nodes' clocks do not matter.
//!
//! ## Schema
//!
//! `cairn_schema(version)` holds [`SCHEMA_VERSION`]; the tables are created when missing (under
//! an advisory lock, so nodes starting together do not race). A database at a newer version
//! than this server knows is refused at start, naming both versions.
//!
//! TLS to the database follows libpq's `sslmode` and `sslrootcert` / `sslcert` / `sslkey`
//! in the URL ([`tls`]); several `host:port` pairs with `target_session_attrs=read-write`
//! reach whichever database server is the writable one (every connection, reconnections
//! included, tries them in order).

mod lease;
mod tls;

use cairn_core::storage::{Storage, StorageError, Write};
use postgres::{Client, NoTls, Statement};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Duration;

/// The schema version this server writes and understands.
pub const SCHEMA_VERSION: i32 = 1;

/// Default table names (Vault's stanza names them with `table` and `ha_table`).
pub const DEFAULT_TABLE: &str = "cairn_kv";
pub const DEFAULT_HA_TABLE: &str = "cairn_ha_lock";

/// How long a connection attempt may take when the URL sets no `connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Advisory lock key that serialises schema creation between nodes.
const SCHEMA_LOCK: i64 = 0x6361_6972_6e00_0001;

/// Where and how to reach the database: the parsed URL and the table names.
#[derive(Clone)]
pub struct PgSettings {
    config: postgres::Config,
    /// TLS to the database (`sslmode` and the certificate files).
    tls: tls::DbTls,
    /// Table of keys and values.
    pub table: String,
    /// The single-row lease table; the node registry is `<ha_table>_nodes`.
    pub ha_table: String,
    /// `host:port, database D, user U`: for messages (never the password).
    pub target: String,
}

impl std::fmt::Debug for PgSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSettings")
            .field("target", &self.target)
            .field("table", &self.table)
            .field("ha_table", &self.ha_table)
            .finish()
    }
}

/// Whether `name` may name a table: a plain lower-case SQL identifier (it is spliced into
/// statements), short enough for the `_nodes` suffix.
pub fn valid_table_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && name.len() <= 57
}

impl PgSettings {
    /// Parses a `postgres://` URL (or key=value string) and the table names. The message of a
    /// refusal never contains the password.
    pub fn new(url: &str, table: Option<&str>, ha_table: Option<&str>) -> Result<Self, String> {
        let (cleaned, tls) = tls::split(url)?;
        let mut config: postgres::Config = cleaned.parse().map_err(|e| {
            format!(
                "connection_url is not a valid PostgreSQL URL ({e}); expected \
                 postgres://USER:PASSWORD@HOST:PORT/DATABASE"
            )
        })?;
        if config.get_hosts().is_empty() {
            return Err(
                "connection_url names no host (expected postgres://USER:PASSWORD@HOST:PORT/DATABASE)"
                    .into(),
            );
        }
        if config.get_user().is_none() {
            return Err(
                "connection_url names no user (expected postgres://USER:PASSWORD@HOST:PORT/DATABASE)"
                    .into(),
            );
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let table = table.unwrap_or(DEFAULT_TABLE).to_string();
        if config.get_application_name().is_none() {
            // pg_stat_activity tells which cluster (table) a session serves.
            config.application_name(&format!("cairn {table}"));
        }
        let ha_table = ha_table.unwrap_or(DEFAULT_HA_TABLE).to_string();
        for (what, t) in [("table", &table), ("ha_table", &ha_table)] {
            if !valid_table_name(t) {
                return Err(format!(
                    "{what} = {t:?}: a table name must be a lower-case SQL identifier \
                     (a-z, 0-9, _; not starting with a digit; at most 57 characters)"
                ));
            }
        }
        if table == ha_table {
            return Err(format!(
                "table and ha_table must differ (both are {table:?})"
            ));
        }
        let target = format!("{}, sslmode={}", describe(&config), tls.mode.name());
        Ok(PgSettings {
            config,
            tls,
            table,
            ha_table,
            target,
        })
    }

    /// Opens a connection; a refusal names the server, database and user and says why.
    fn connect(&self) -> Result<Client, String> {
        let connected = match &self.tls.connector {
            None => self.config.connect(NoTls),
            Some(c) => self.config.connect(c.clone()),
        };
        connected.map_err(|e| {
            format!(
                "cannot connect to PostgreSQL at {}: {}",
                self.target,
                why(&e)
            )
        })
    }

    fn nodes_table(&self) -> String {
        format!("{}_nodes", self.ha_table)
    }
}

/// `host:port[, host:port...], database D, user U`.
fn describe(c: &postgres::Config) -> String {
    let hosts: Vec<String> = c
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let port = c
                .get_ports()
                .get(i)
                .or_else(|| c.get_ports().first())
                .copied()
                .unwrap_or(5432);
            match h {
                postgres::config::Host::Tcp(h) => format!("{h}:{port}"),
                #[cfg(unix)]
                postgres::config::Host::Unix(p) => format!("{}:{port}", p.display()),
            }
        })
        .collect();
    format!(
        "{} (database {}, user {})",
        hosts.join(", "),
        c.get_dbname().or(c.get_user()).unwrap_or("?"),
        c.get_user().unwrap_or("?")
    )
}

/// A PostgreSQL error as an operator reads it: the server's message for database errors,
/// the cause for connection errors.
fn why(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{}: {}", db.severity(), db.message());
    }
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        src = c.source();
    }
    s
}

/// The kind of a PostgreSQL error: a full disk, damaged data, or anything else.
fn err(e: postgres::Error) -> StorageError {
    use postgres::error::SqlState;
    match e.code() {
        Some(c) if *c == SqlState::DISK_FULL => StorageError::Full,
        Some(c) if *c == SqlState::DATA_CORRUPTED || *c == SqlState::INDEX_CORRUPTED => {
            StorageError::Corrupt(why(&e))
        }
        _ => StorageError::Io(format!("PostgreSQL: {}", why(&e))),
    }
}

/// Creates the tables when missing and checks the schema version, under an advisory lock.
fn ensure_schema(client: &mut Client, s: &PgSettings) -> Result<(), String> {
    let fail = |e: postgres::Error| {
        format!(
            "cannot set up the schema in PostgreSQL at {}: {}",
            s.target,
            why(&e)
        )
    };
    let mut tx = client.transaction().map_err(fail)?;
    // No "already exists, skipping" notices at every start.
    tx.batch_execute("SET LOCAL client_min_messages = warning")
        .map_err(fail)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])
        .map_err(fail)?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS cairn_schema (version int NOT NULL)")
        .map_err(fail)?;
    let found: Option<i32> = tx
        .query_opt("SELECT max(version) FROM cairn_schema", &[])
        .map_err(fail)?
        .and_then(|r| r.get(0));
    match found {
        Some(v) if v > SCHEMA_VERSION => {
            return Err(format!(
                "the database at {} has Cairn schema version {v}, newer than this server's \
                 version {SCHEMA_VERSION}: it was written by a newer Cairn. Run that version \
                 (or newer) of the server; refusing to start",
                s.target
            ));
        }
        Some(_) => {}
        None => {
            tx.execute(
                "INSERT INTO cairn_schema (version) VALUES ($1)",
                &[&SCHEMA_VERSION],
            )
            .map_err(fail)?;
        }
    }
    let (t, ha, nodes) = (&s.table, &s.ha_table, s.nodes_table());
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {t} (key bytea PRIMARY KEY, value bytea NOT NULL);
         CREATE TABLE IF NOT EXISTS {ha} (
             id int PRIMARY KEY CHECK (id = 1),
             epoch bigint NOT NULL,
             holder text,
             holder_pid int,
             api_addr text,
             cluster_addr text,
             acquired_at timestamptz,
             expires_at timestamptz NOT NULL);
         INSERT INTO {ha} (id, epoch, expires_at) VALUES (1, 0, '-infinity')
             ON CONFLICT (id) DO NOTHING;
         CREATE TABLE IF NOT EXISTS {nodes} (
             node_id text PRIMARY KEY,
             api_addr text NOT NULL,
             cluster_addr text NOT NULL,
             last_echo timestamptz NOT NULL,
             version text NOT NULL);"
    ))
    .map_err(fail)?;
    tx.commit().map_err(fail)
}

/// A connection and its prepared statements.
struct Conn {
    client: Client,
    get: Statement,
    scan: Statement,
    scan_after: Statement,
    count: Statement,
    count_in: Statement,
    upsert: Statement,
    delete: Statement,
    fence: Statement,
}

impl Conn {
    fn open(s: &PgSettings) -> Result<Conn, String> {
        let mut client = s.connect()?;
        let (t, ha) = (&s.table, &s.ha_table);
        let mut prep = |sql: &str| {
            client.prepare(sql).map_err(|e| {
                format!(
                    "PostgreSQL at {}: cannot prepare a statement: {}",
                    s.target,
                    why(&e)
                )
            })
        };
        let get = prep(&format!("SELECT value FROM {t} WHERE key = $1"))?;
        let scan = prep(&format!(
            "SELECT key, value FROM {t} WHERE key >= $1 AND key < $2 ORDER BY key"
        ))?;
        let scan_after = prep(&format!(
            "SELECT key, value FROM {t} WHERE key > $1 ORDER BY key LIMIT $2"
        ))?;
        let count = prep(&format!("SELECT count(*) FROM {t}"))?;
        let count_in = prep(&format!(
            "SELECT count(*) FROM {t} WHERE key = ANY($1::bytea[])"
        ))?;
        let upsert = prep(&format!(
            "INSERT INTO {t} (key, value) SELECT * FROM unnest($1::bytea[], $2::bytea[]) \
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
        ))?;
        let delete = prep(&format!("DELETE FROM {t} WHERE key = ANY($1::bytea[])"))?;
        let fence = prep(&format!("SELECT epoch FROM {ha} WHERE id = 1 FOR SHARE"))?;
        Ok(Conn {
            client,
            get,
            scan,
            scan_after,
            count,
            count_in,
            upsert,
            delete,
            fence,
        })
    }
}

/// The smallest byte string greater than every string starting with `prefix` (keys are
/// UTF-8, which never contains 0xff).
fn upper_bound(prefix: &[u8]) -> Vec<u8> {
    let mut v = prefix.to_vec();
    v.push(0xff);
    v
}

fn rows_to_pairs(rows: Vec<postgres::Row>) -> Vec<(String, Vec<u8>)> {
    rows.into_iter()
        .map(|r| {
            let k: Vec<u8> = r.get(0);
            (String::from_utf8_lossy(&k).into_owned(), r.get(1))
        })
        .collect()
}

/// The core's storage on PostgreSQL (see the module documentation).
pub struct PgStorage {
    settings: PgSettings,
    /// `None` after the connection broke and a reconnect failed (tried again at the next use).
    conn: RefCell<Option<Conn>>,
    /// A batch is open.
    batch: bool,
    /// The open batch's writes: each key's last value (`None`: deleted).
    pending: BTreeMap<String, Option<Vec<u8>>>,
    /// The condition [`ShellStorage`](crate::storage::ShellStorage) commits under.
    fence: FenceMode,
    /// Recently read keys and scans (`None`: off; see the module documentation).
    cache: RefCell<Option<crate::sqlite::ReadCache>>,
}

/// Under which condition a batch may be committed: the core's [`cairn_core::ha::Fence`]
/// (`None`; `Epoch(e)`: only while the lease is at epoch `e`, checked in the commit's
/// transaction; `Standby`: a batch that writes anything is refused; `Initialize`: applied only
/// if the store holds no seal configuration yet, checked with the lease row locked for update,
/// so racing initialisations run one after the other and the second finds the first's).
pub use cairn_core::ha::Fence as FenceMode;

impl PgStorage {
    /// Connects, creates the tables when missing and checks the schema version. A refusal is
    /// a message for the operator naming the server (never the password).
    pub fn open(settings: &PgSettings) -> Result<PgStorage, String> {
        let mut client = settings.connect()?;
        ensure_schema(&mut client, settings)?;
        drop(client);
        let conn = Conn::open(settings)?;
        Ok(PgStorage {
            settings: settings.clone(),
            conn: RefCell::new(Some(conn)),
            batch: false,
            pending: BTreeMap::new(),
            fence: FenceMode::None,
            cache: RefCell::new(None),
        })
    }

    /// The condition the runtime's commits are fenced with from now on.
    pub fn set_fence_mode(&mut self, mode: FenceMode) {
        self.fence = mode;
    }

    /// The condition commits are fenced with.
    pub fn fence_mode(&self) -> FenceMode {
        self.fence
    }

    /// Turns the read cache on (empty) or off. Only while this node is the database's only
    /// writer: another node's writes would not be seen through it.
    pub fn set_read_cache(&mut self, on: bool) {
        *self.cache.get_mut() = on.then(crate::sqlite::ReadCache::default);
    }

    /// Runs `f` on the connection, reconnecting first if it broke.
    fn with_conn<T>(
        &self,
        f: impl FnOnce(&mut Conn) -> Result<T, postgres::Error>,
    ) -> Result<T, StorageError> {
        let mut slot = self.conn.borrow_mut();
        if slot.as_ref().is_none_or(|c| c.client.is_closed()) {
            *slot = None;
            match Conn::open(&self.settings) {
                Ok(c) => {
                    log::warn!("reconnected to PostgreSQL at {}", self.settings.target);
                    *slot = Some(c);
                    if let Some(cache) = self.cache.borrow_mut().as_mut() {
                        cache.clear();
                    }
                }
                Err(e) => return Err(StorageError::Io(e)),
            }
        }
        match slot.as_mut() {
            Some(c) => f(c).map_err(err),
            None => Err(StorageError::Io("no connection to PostgreSQL".into())),
        }
    }

    /// Opens a batch: the inputs' write sets are kept until [`PgStorage::commit`].
    pub fn begin(&mut self) -> Result<(), StorageError> {
        if !self.batch {
            self.batch = true;
            self.pending.clear();
        }
        Ok(())
    }

    /// Drops the open batch.
    pub fn rollback(&mut self) {
        self.batch = false;
        self.pending.clear();
    }

    /// Writes the batch in one transaction; true when it wrote anything. With `fence`, the
    /// transaction first locks the lease row and the batch is refused whole with
    /// [`StorageError::Fenced`] unless the lease is at that epoch. On any error nothing of the
    /// batch is written and the batch is dropped.
    #[cfg(test)]
    pub fn commit(&mut self, fence: Option<u64>) -> Result<bool, StorageError> {
        self.commit_mode(fence.map_or(FenceMode::None, FenceMode::Epoch))
    }

    /// [`PgStorage::commit`] under any [`FenceMode`]: a standby's batch that writes anything
    /// is refused whole with [`StorageError::Fenced`] (`held: None`).
    pub fn commit_mode(&mut self, mode: FenceMode) -> Result<bool, StorageError> {
        self.batch = false;
        let pending = std::mem::take(&mut self.pending);
        if pending.is_empty() {
            return Ok(false);
        }
        let initialize = mode == FenceMode::Initialize;
        let fence = match mode {
            FenceMode::None | FenceMode::Initialize => None,
            FenceMode::Epoch(e) => Some(e),
            FenceMode::Standby => {
                let current = self
                    .with_conn(|c| c.client.query_opt(&c.fence, &[]))
                    .ok()
                    .flatten()
                    .map_or(0, |r| r.get::<_, i64>(0).max(0) as u64);
                log::warn!(
                    "commit refused: this node is a standby; {} writes dropped",
                    pending.len()
                );
                return Err(StorageError::Fenced {
                    held: None,
                    current,
                });
            }
        };
        let mut put_k: Vec<&[u8]> = Vec::new();
        let mut put_v: Vec<&[u8]> = Vec::new();
        let mut del: Vec<&[u8]> = Vec::new();
        for (k, v) in &pending {
            match v {
                Some(v) => {
                    put_k.push(k.as_bytes());
                    put_v.push(v);
                }
                None => del.push(k.as_bytes()),
            }
        }
        // Fenced inside the closure, reported after it (the transaction is dropped: rollback).
        let mut fenced = None;
        let mut initialized = false;
        let (lock_sql, seal_sql) = (
            format!(
                "SELECT epoch FROM {} WHERE id = 1 FOR UPDATE",
                self.settings.ha_table
            ),
            format!("SELECT 1 FROM {} WHERE key = $1", self.settings.table),
        );
        let res = self.with_conn(|c| {
            let mut tx = c.client.transaction()?;
            if initialize {
                tx.query_opt(&lock_sql, &[])?;
                let seal_key: &[u8] = cairn_core::seal::SEAL_CONFIG_KEY.as_bytes();
                if tx.query_opt(&seal_sql, &[&seal_key])?.is_some() {
                    initialized = true;
                    return Ok(());
                }
            }
            if let Some(held) = fence {
                let current: Option<i64> = tx.query_opt(&c.fence, &[])?.map(|r| r.get(0));
                let current = current.unwrap_or(0).max(0) as u64;
                if current != held {
                    fenced = Some(current);
                    return Ok(());
                }
            }
            if !put_k.is_empty() {
                tx.execute(&c.upsert, &[&put_k, &put_v])?;
            }
            if !del.is_empty() {
                tx.execute(&c.delete, &[&del])?;
            }
            tx.commit()
        });
        if let Some(cache) = self.cache.get_mut().as_mut() {
            for (k, v) in &pending {
                // A failed commit's outcome may be unknown (a broken connection): forget.
                match (&res, fenced, initialized) {
                    (Ok(()), None, false) => cache.wrote(k, v),
                    _ => cache.evict(k),
                }
            }
        }
        if initialized {
            log::warn!("initialisation refused: another node of this cluster initialised it first");
            return Err(StorageError::AlreadyInitialized);
        }
        if let Some(current) = fenced {
            let held = fence.unwrap_or(0);
            log::warn!(
                "commit refused: this node's lease epoch {held} is no longer current (now \
                 {current}); {} writes dropped",
                pending.len()
            );
            return Err(StorageError::Fenced {
                held: Some(held),
                current,
            });
        }
        res.map(|()| true)
    }

    /// A scan of what is committed (through the cache when it is on).
    fn scan_db(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        if let Some(rows) = self.cache.borrow().as_ref().and_then(|c| c.scanned(prefix)) {
            return Ok(rows);
        }
        let lo = prefix.as_bytes();
        let hi = upper_bound(lo);
        let rows = self
            .with_conn(|c| c.client.query(&c.scan, &[&lo, &hi]))
            .map(rows_to_pairs)?;
        if let Some(cache) = self.cache.borrow_mut().as_mut() {
            cache.fill_scan(prefix, &rows);
        }
        Ok(rows)
    }
}

impl Storage for PgStorage {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        if let Some(v) = self.pending.get(key) {
            return Ok(v.clone());
        }
        if let Some(v) = self.cache.borrow().as_ref().and_then(|c| c.get(key)) {
            return Ok(v);
        }
        let k = key.as_bytes();
        let v: Option<Vec<u8>> = self
            .with_conn(|c| c.client.query_opt(&c.get, &[&k]))
            .map(|r| r.map(|r| r.get(0)))?;
        if let Some(cache) = self.cache.borrow_mut().as_mut() {
            cache.fill(key, &v);
        }
        Ok(v)
    }

    fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        let rows = self.scan_db(prefix)?;
        if self.pending.is_empty() {
            return Ok(rows);
        }
        let mut merged: BTreeMap<String, Vec<u8>> = rows.into_iter().collect();
        for (k, v) in self
            .pending
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
        {
            match v {
                Some(v) => merged.insert(k.clone(), v.clone()),
                None => merged.remove(k),
            };
        }
        Ok(merged.into_iter().collect())
    }

    fn scan_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        use std::ops::Bound;
        let lower = match after {
            Some(a) => Bound::Excluded(a.to_string()),
            None => Bound::Unbounded,
        };
        let overlay: Vec<(&String, &Option<Vec<u8>>)> =
            self.pending.range((lower, Bound::Unbounded)).collect();
        // Enough rows that, after the batch's deletes, `limit` remain when the table has them.
        let want = limit.saturating_add(overlay.len());
        let from: &[u8] = after.map(str::as_bytes).unwrap_or(&[]);
        let n = i64::try_from(want).unwrap_or(i64::MAX);
        let rows = rows_to_pairs(self.with_conn(|c| c.client.query(&c.scan_after, &[&from, &n]))?);
        if overlay.is_empty() {
            return Ok(rows);
        }
        // Past the last row read, the table's keys are unknown: the batch's keys there wait.
        let complete = rows.len() < want;
        let last = rows.last().map(|(k, _)| k.clone());
        let mut merged: BTreeMap<String, Vec<u8>> = rows.into_iter().collect();
        for (k, v) in overlay {
            if !complete && last.as_ref().is_some_and(|l| k > l) {
                break;
            }
            match v {
                Some(v) => merged.insert(k.clone(), v.clone()),
                None => merged.remove(k),
            };
        }
        Ok(merged.into_iter().take(limit).collect())
    }

    fn count(&self) -> Result<u64, StorageError> {
        let keys: Vec<&[u8]> = self.pending.keys().map(|k| k.as_bytes()).collect();
        let (total, stored): (i64, i64) = self.with_conn(|c| {
            let total: i64 = c.client.query_one(&c.count, &[])?.get(0);
            let stored: i64 = if keys.is_empty() {
                0
            } else {
                c.client.query_one(&c.count_in, &[&keys])?.get(0)
            };
            Ok((total, stored))
        })?;
        let puts = self.pending.values().filter(|v| v.is_some()).count() as i64;
        Ok((total - stored + puts).max(0) as u64)
    }

    fn apply(&mut self, writes: &[Write]) -> Result<(), StorageError> {
        let in_batch = self.batch;
        if !in_batch {
            self.begin()?;
        }
        for (k, v) in writes {
            self.pending.insert(k.clone(), v.clone());
        }
        if in_batch {
            return Ok(());
        }
        // Outside a batch: a batch of its own.
        self.commit_mode(self.fence).map(|_| ())
    }
}

pub use lease::{Held, PgLease};

#[cfg(test)]
mod tests {
    //! Against a real PostgreSQL: `scripts/dev-postgres.sh` starts one per test process (it
    //! stops when the process exits); each test works in a database of its own.
    use super::*;
    use std::collections::BTreeMap as Map;
    use std::sync::OnceLock;
    use std::time::Instant;

    /// The dev server's `export` lines.
    fn server() -> &'static Map<String, String> {
        static ENV: OnceLock<Map<String, String>> = OnceLock::new();
        ENV.get_or_init(|| {
            let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let dir = std::env::temp_dir().join(format!("cairn-shell-pg-{}", std::process::id()));
            let out = std::process::Command::new("bash")
                .arg(root.join("scripts/dev-postgres.sh"))
                .arg("start")
                .arg(&dir)
                .env("CAIRN_PG_WATCH_PID", std::process::id().to_string())
                .output()
                .expect("run scripts/dev-postgres.sh");
            assert!(
                out.status.success(),
                "scripts/dev-postgres.sh start failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
                .map(|(k, v)| (k.to_string(), v.trim_matches('\'').to_string()))
                .collect()
        })
    }

    /// The URL of a new, empty database named after `tag`.
    fn fresh_db(tag: &str) -> String {
        let env = server();
        let mut admin = Client::connect(&env["CAIRN_PG_URL"], NoTls).expect("connect");
        let name = format!("t_{tag}");
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
            .expect("drop");
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create");
        format!(
            "postgres://{}:{}@127.0.0.1:{}/{name}?sslmode=disable",
            env["CAIRN_PG_USER"], env["CAIRN_PG_PASSWORD"], env["CAIRN_PG_PORT"]
        )
    }

    fn settings(url: &str) -> PgSettings {
        PgSettings::new(url, None, None).expect("settings")
    }

    fn put(k: &str, v: &str) -> Write {
        (k.to_string(), Some(v.as_bytes().to_vec()))
    }

    fn keys(rows: Vec<(String, Vec<u8>)>) -> Vec<String> {
        rows.into_iter().map(|(k, _)| k).collect()
    }

    /// Whether the session of `s`'s next connection runs over TLS, and its protocol version.
    fn session_tls(s: &PgSettings) -> Result<(bool, String), String> {
        let mut c = s.connect()?;
        let row = c
            .query_one(
                "SELECT ssl, coalesce(version, '') FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .map_err(|e| why(&e))?;
        Ok((row.get(0), row.get(1)))
    }

    #[test]
    fn tls_to_the_database_follows_sslmode() {
        let env = server();
        let base = fresh_db("tls").replace("?sslmode=disable", "");
        let ca = &env["CAIRN_PG_CA"];
        // Plain when asked; TLS (1.2 or newer) in every other mode the server offers it in.
        let (plain_tls, _) = session_tls(&settings(&format!("{base}?sslmode=disable"))).unwrap();
        assert!(!plain_tls, "sslmode=disable made an encrypted session");
        for url in [
            base.clone(),
            format!("{base}?sslmode=prefer"),
            format!("{base}?sslmode=require"),
            format!("{base}?sslmode=verify-ca&sslrootcert={ca}"),
            format!("{base}?sslmode=verify-full&sslrootcert={ca}"),
        ] {
            let (on, version) =
                session_tls(&settings(&url)).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert!(on, "{url}: the session is not encrypted");
            assert!(
                version == "TLSv1.3" || version == "TLSv1.2",
                "{url}: {version}"
            );
        }
        // The wrong CA: refused by every verifying mode, and by `require` given a root
        // certificate (libpq's rule); the message names the certificate problem.
        let other = &env["CAIRN_PG_OTHER_CA"];
        for mode in ["require", "verify-ca", "verify-full"] {
            let url = format!("{base}?sslmode={mode}&sslrootcert={other}");
            let e = session_tls(&settings(&url)).expect_err(&url);
            assert!(
                e.contains("cannot connect") && e.to_lowercase().contains("certificate"),
                "{e}"
            );
            assert!(!e.contains(&env["CAIRN_PG_PASSWORD"]), "{e}");
        }
        // verify-full checks the name: the certificate is for 127.0.0.1 and localhost, not for
        // db.invalid (reached here through `hostaddr`); verify-ca checks only the chain.
        let misnamed = format!(
            "{}&hostaddr=127.0.0.1&sslrootcert={ca}",
            base.replace("@127.0.0.1:", "@db.invalid:")
                .replacen("/t_tls", "/t_tls?x=1", 1)
                .replace("?x=1", "?connect_timeout=5")
        );
        let e = session_tls(&settings(&format!("{misnamed}&sslmode=verify-full")))
            .expect_err("a name the certificate does not carry");
        assert!(e.to_lowercase().contains("certificate"), "{e}");
        assert!(
            session_tls(&settings(&format!("{misnamed}&sslmode=verify-ca")))
                .unwrap()
                .0
        );
    }

    #[test]
    fn postgres_storage_contract() {
        let s = settings(&fresh_db("contract"));
        let mut st = PgStorage::open(&s).expect("open");
        st.set_read_cache(true);
        st.apply(&[
            put("a/1", "x"),
            put("a/é", "y"),
            put("a0", "z"),
            put("b", "w"),
            put("a/", "dir"),
        ])
        .unwrap();
        assert_eq!(st.get("a/1").unwrap(), Some(b"x".to_vec()));
        assert_eq!(st.get("nope").unwrap(), None);
        // Prefix-exact and in key (byte) order.
        assert_eq!(keys(st.scan("a/").unwrap()), vec!["a/", "a/1", "a/é"]);
        assert_eq!(
            keys(st.scan("").unwrap()),
            vec!["a/", "a/1", "a/é", "a0", "b"]
        );
        assert_eq!(
            keys(st.scan_after(Some("a/1"), 2).unwrap()),
            vec!["a/é", "a0"]
        );
        assert_eq!(keys(st.scan_after(None, 1).unwrap()), vec!["a/"]);
        assert_eq!(st.count().unwrap(), 5);

        // In a batch, reads see the batch's own writes; a rollback leaves nothing.
        st.begin().unwrap();
        st.apply(&[put("a/2", "new"), ("a/1".into(), None)])
            .unwrap();
        st.apply(&[put("c", "1")]).unwrap();
        assert_eq!(st.get("a/2").unwrap(), Some(b"new".to_vec()));
        assert_eq!(st.get("a/1").unwrap(), None);
        assert_eq!(keys(st.scan("a/").unwrap()), vec!["a/", "a/2", "a/é"]);
        assert_eq!(
            keys(st.scan_after(Some("a/"), 2).unwrap()),
            vec!["a/2", "a/é"]
        );
        assert_eq!(st.count().unwrap(), 6);
        st.rollback();
        assert_eq!(st.get("a/2").unwrap(), None);
        assert_eq!(st.get("a/1").unwrap(), Some(b"x".to_vec()));
        assert_eq!(st.count().unwrap(), 5);

        // Committed: another connection sees it.
        st.begin().unwrap();
        st.apply(&[put("a/2", "new"), ("a/1".into(), None)])
            .unwrap();
        assert!(st.commit(None).unwrap());
        let other = PgStorage::open(&s).expect("open");
        assert_eq!(other.get("a/2").unwrap(), Some(b"new".to_vec()));
        assert_eq!(other.get("a/1").unwrap(), None);
        // A batch that wrote nothing commits nothing.
        st.begin().unwrap();
        assert!(!st.commit(None).unwrap());

        // A commit that fails (a trigger refuses the key `bad`) leaves nothing of the batch,
        // and the next batch works.
        let mut admin = s.connect().unwrap();
        admin
            .batch_execute(
                "CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN \
                   IF NEW.key = '\\x626164'::bytea THEN RAISE EXCEPTION 'refused'; END IF; \
                   RETURN NEW; END $$ LANGUAGE plpgsql;
                 CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON cairn_kv \
                   FOR EACH ROW EXECUTE FUNCTION refuse();",
            )
            .unwrap();
        st.begin().unwrap();
        st.apply(&[put("d", "1"), ("b".into(), None)]).unwrap();
        st.apply(&[put("bad", "1")]).unwrap();
        let e = st.commit(None).unwrap_err();
        assert!(
            matches!(&e, StorageError::Io(m) if m.contains("refused")),
            "{e:?}"
        );
        assert_eq!(other.get("d").unwrap(), None);
        assert_eq!(other.get("b").unwrap(), Some(b"w".to_vec()));
        assert_eq!(st.get("d").unwrap(), None);
        st.begin().unwrap();
        st.apply(&[put("e", "1")]).unwrap();
        assert!(st.commit(None).unwrap());
        assert_eq!(other.get("e").unwrap(), Some(b"1".to_vec()));

        // The read cache is kept exact by this storage's own commits, and assumes it is the
        // only writer: another writer's change shows once the cache starts over.
        assert_eq!(st.get("e").unwrap(), Some(b"1".to_vec()));
        assert_eq!(st.scan("a/").unwrap().len(), 3);
        admin
            .batch_execute(
                "DROP TRIGGER refuse ON cairn_kv; DELETE FROM cairn_kv WHERE key = '\\x65'::bytea",
            )
            .unwrap();
        assert_eq!(
            st.get("e").unwrap(),
            Some(b"1".to_vec()),
            "served from the cache"
        );
        st.set_read_cache(true);
        assert_eq!(st.get("e").unwrap(), None);
        st.begin().unwrap();
        st.apply(&[put("a/3", "3")]).unwrap();
        assert!(st.commit(None).unwrap());
        assert_eq!(st.scan("a/").unwrap().len(), 4);
        assert_eq!(other.scan("a/").unwrap().len(), 4);
    }

    /// Reads in a batch agree with memory storage after the same writes, whatever the mix
    /// of stored keys and the batch's puts and deletes (scan_after's merge in particular).
    #[test]
    fn postgres_batch_reads_match_memory_storage() {
        batch_reads_match_memory_storage(false);
        batch_reads_match_memory_storage(true);
    }

    fn batch_reads_match_memory_storage(cached: bool) {
        use cairn_core::storage::MemStorage;
        let s = settings(&fresh_db(&format!("merge_{cached}")));
        let mut st = PgStorage::open(&s).expect("open");
        st.set_read_cache(cached);
        let mut mem = MemStorage::new();
        let mut seed: u64 = 0x5eed;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let base: Vec<Write> = (0..40)
            .map(|_| (format!("p/{:02}", next(60)), Some(vec![next(9) as u8])))
            .collect();
        st.apply(&base).unwrap();
        mem.apply(&base).unwrap();
        for round in 0..12 {
            st.begin().unwrap();
            let mut expect = mem.clone();
            for _ in 0..next(20) {
                let k = format!("p/{:02}", next(60));
                let w: Write = if next(2) == 0 {
                    (k, None)
                } else {
                    (k, Some(vec![next(9) as u8]))
                };
                st.apply(std::slice::from_ref(&w)).unwrap();
                expect.apply(&[w]).unwrap();
            }
            for after in [None, Some("p/"), Some("p/10"), Some("p/33"), Some("p/59")] {
                for limit in [1, 3, 7, 100] {
                    assert_eq!(
                        st.scan_after(after, limit).unwrap(),
                        expect.scan_after(after, limit).unwrap(),
                        "round {round}, after {after:?}, limit {limit}"
                    );
                }
            }
            assert_eq!(st.scan("p/1").unwrap(), expect.scan("p/1").unwrap());
            assert_eq!(
                st.count().unwrap(),
                expect.count().unwrap(),
                "round {round}"
            );
            if round % 3 == 0 {
                st.rollback();
            } else {
                st.commit(None).unwrap();
                mem = expect;
            }
            assert_eq!(st.scan("").unwrap(), mem.scan("").unwrap());
        }
    }

    #[test]
    fn postgres_newer_schema_version_is_refused() {
        let url = fresh_db("schema");
        let s = settings(&url);
        drop(PgStorage::open(&s).expect("open"));
        // Opening again: same version, fine.
        drop(PgStorage::open(&s).expect("open again"));
        let mut admin = s.connect().unwrap();
        admin
            .batch_execute("UPDATE cairn_schema SET version = 7")
            .unwrap();
        let e = PgStorage::open(&s).err().expect("refused");
        assert!(e.contains("schema version 7"), "{e}");
        assert!(e.contains(&format!("version {SCHEMA_VERSION}")), "{e}");
        assert!(!e.contains(&server()["CAIRN_PG_PASSWORD"]), "{e}");
    }

    #[test]
    fn postgres_lease_fences_the_old_holder() {
        let s = settings(&fresh_db("lease"));
        let mut st_a = PgStorage::open(&s).expect("open");
        let mut st_b = PgStorage::open(&s).expect("open");
        let mut a = PgLease::connect(&s).unwrap();
        let mut b = PgLease::connect(&s).unwrap();
        assert_eq!(a.leader().unwrap(), None);
        let ttl = Duration::from_millis(800);
        let mut held_a = a
            .try_acquire("a", "http://a:8200", "https://a:8201", ttl)
            .unwrap()
            .expect("A takes the free lease");
        assert!(held_a.epoch >= 1);
        assert!(held_a.valid_until <= Instant::now() + ttl);
        // B cannot while A holds it; A can renew.
        assert_eq!(
            b.try_acquire("b", "http://b", "https://b", ttl).unwrap(),
            None
        );
        assert!(a.renew(&mut held_a, ttl).unwrap());
        let l = b.leader().unwrap().expect("a leader");
        assert_eq!(
            (l.epoch, l.node_id.as_str(), l.api_addr.as_str()),
            (held_a.epoch, "a", "http://a:8200")
        );
        assert!(l.remaining_ms > 0 && l.remaining_ms <= 800, "{l:?}");
        // A's fenced commit goes through while it holds the lease.
        st_a.begin().unwrap();
        st_a.apply(&[put("k", "from-a")]).unwrap();
        assert!(st_a.commit(Some(held_a.epoch)).unwrap());

        // A's lease expires (A stopped renewing): B takes it at a higher epoch.
        std::thread::sleep(Duration::from_millis(1000));
        assert_eq!(b.leader().unwrap(), None, "expired");
        let held_b = b
            .try_acquire(
                "b",
                "http://b:8200",
                "https://b:8201",
                Duration::from_secs(30),
            )
            .unwrap()
            .expect("B takes the expired lease");
        assert!(held_b.epoch > held_a.epoch);
        assert!(!a.renew(&mut held_a, ttl).unwrap(), "A's renewal must fail");
        assert!(!a.release(&held_a).unwrap(), "A has nothing to release");
        // A's fenced commit is refused whole and writes nothing.
        st_a.begin().unwrap();
        st_a.apply(&[put("k", "stale"), put("k2", "stale")])
            .unwrap();
        let e = st_a.commit(Some(held_a.epoch)).unwrap_err();
        assert_eq!(
            e,
            StorageError::Fenced {
                held: Some(held_a.epoch),
                current: held_b.epoch
            }
        );
        assert!(e.to_string().contains("lost leadership"), "{e}");
        assert_eq!(st_b.get("k").unwrap(), Some(b"from-a".to_vec()));
        assert_eq!(st_b.get("k2").unwrap(), None);
        // B's commit succeeds (fenced as the runtime does: through the shared handle).
        st_b.set_fence_mode(FenceMode::Epoch(held_b.epoch));
        assert_eq!(st_b.fence_mode(), FenceMode::Epoch(held_b.epoch));
        let mut shell_b = crate::storage::ShellStorage::Postgres(st_b);
        shell_b.begin().unwrap();
        shell_b.apply(&[put("k", "from-b")]).unwrap();
        assert!(shell_b.commit_unsynced().unwrap());
        let crate::storage::ShellStorage::Postgres(mut st_b) = shell_b else {
            unreachable!()
        };
        assert_eq!(st_a.get("k").unwrap(), Some(b"from-b".to_vec()));
        // A standby writes nothing; a batch that only reads is fine.
        st_a.set_fence_mode(FenceMode::Standby);
        st_a.begin().unwrap();
        assert!(!st_a.commit_mode(st_a.fence_mode()).unwrap());
        st_a.begin().unwrap();
        st_a.apply(&[put("k", "standby")]).unwrap();
        let e = st_a.commit_mode(st_a.fence_mode()).unwrap_err();
        assert_eq!(
            e,
            StorageError::Fenced {
                held: None,
                current: held_b.epoch
            }
        );
        assert!(e.to_string().contains("standby"), "{e}");
        assert_eq!(st_a.apply(&[put("k", "standby")]), Err(e));
        assert_eq!(st_b.get("k").unwrap(), Some(b"from-b".to_vec()));

        // The node registry.
        a.echo("a", "http://a:8200", "https://a:8201", "0.1.0")
            .unwrap();
        b.echo("b", "http://b:8200", "https://b:8201", "0.1.0")
            .unwrap();
        a.echo("a", "http://a:9200", "https://a:9201", "0.1.1")
            .unwrap();
        let nodes = b.nodes().unwrap();
        assert_eq!(nodes.len(), 2);
        assert_eq!(
            (
                nodes[0].node_id.as_str(),
                nodes[0].api_addr.as_str(),
                nodes[0].version.as_str()
            ),
            ("a", "http://a:9200", "0.1.1")
        );
        assert!(
            nodes[1].age_ms >= 0 && nodes[1].age_ms < 60_000,
            "{nodes:?}"
        );

        // B steps down: the epoch moves on (B's own fenced commits are refused), and another
        // node can take the lease at once.
        assert!(b.release(&held_b).unwrap());
        assert_eq!(a.leader().unwrap(), None);
        st_b.begin().unwrap();
        st_b.apply(&[put("k", "after-release")]).unwrap();
        assert!(matches!(
            st_b.commit(Some(held_b.epoch)),
            Err(StorageError::Fenced { .. })
        ));
        let held_a2 = a
            .try_acquire("a", "http://a:8200", "https://a:8201", ttl)
            .unwrap()
            .expect("A takes the released lease");
        assert!(held_a2.epoch > held_b.epoch);
        assert_eq!(a.epoch().unwrap(), held_a2.epoch);
    }

    /// A commit that checked its epoch holds the lease row until it ends: a take-over waits.
    #[test]
    fn postgres_takeover_waits_for_a_fenced_commit_in_flight() {
        let s = settings(&fresh_db("linear"));
        drop(PgStorage::open(&s).expect("open"));
        let mut a = PgLease::connect(&s).unwrap();
        let held = a
            .try_acquire("a", "x", "y", Duration::from_millis(100))
            .unwrap()
            .expect("lease");
        std::thread::sleep(Duration::from_millis(200));
        // A commit in flight: the fence's row lock taken, not yet committed.
        let mut c = s.connect().unwrap();
        let mut tx = c.transaction().unwrap();
        let row = tx
            .query_one(
                "SELECT epoch FROM cairn_ha_lock WHERE id = 1 FOR SHARE",
                &[],
            )
            .unwrap();
        assert_eq!(row.get::<_, i64>(0) as u64, held.epoch);
        let s2 = s.clone();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            let mut b = PgLease::connect(&s2).unwrap();
            let r = b
                .try_acquire("b", "x", "y", Duration::from_secs(5))
                .unwrap();
            let _ = done_tx.send(());
            r
        });
        assert!(
            done_rx.recv_timeout(Duration::from_millis(500)).is_err(),
            "the take-over did not wait for the commit in flight"
        );
        tx.execute(
            "INSERT INTO cairn_kv (key, value) VALUES ('\\x6b'::bytea, '\\x31'::bytea)",
            &[],
        )
        .unwrap();
        tx.commit().unwrap();
        let held_b = t
            .join()
            .unwrap()
            .expect("B takes the lease after the commit");
        assert!(held_b.epoch > held.epoch);
    }

    #[test]
    fn postgres_connection_errors_name_the_server_not_the_password() {
        let env = server();
        let pw = env["CAIRN_PG_PASSWORD"].as_str();
        let port = env["CAIRN_PG_PORT"].as_str();
        // A wrong password.
        let url = format!("postgres://cairn:wrong-{pw}@127.0.0.1:{port}/cairn?sslmode=disable");
        let e = PgStorage::open(&settings(&url)).err().expect("refused");
        assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
        assert!(e.contains("password authentication failed"), "{e}");
        assert!(!e.contains(pw), "{e}");
        // Nothing listening.
        let e = PgStorage::open(&settings(&env["CAIRN_PG_DEAD_URL"]))
            .err()
            .expect("refused");
        let dead_port = env["CAIRN_PG_DEAD_URL"]
            .rsplit(':')
            .next()
            .and_then(|p| p.split('/').next())
            .unwrap();
        assert!(e.contains(&format!("127.0.0.1:{dead_port}")), "{e}");
        assert!(e.to_lowercase().contains("refused"), "{e}");
        assert!(!e.contains(pw), "{e}");
        // A URL that does not parse, and a verifying TLS mode without its CA.
        let e = PgSettings::new("postgres://cairn:secret@127.0.0.1:notaport/x", None, None)
            .unwrap_err();
        assert!(e.contains("not a valid PostgreSQL URL"), "{e}");
        assert!(!e.contains("secret"), "{e}");
        let e = PgSettings::new(
            "postgres://cairn:secret@127.0.0.1/x?sslmode=verify-full",
            None,
            None,
        )
        .unwrap_err();
        assert!(e.contains("needs sslrootcert"), "{e}");
        assert!(!e.contains("secret"), "{e}");
        assert!(PgSettings::new("postgres://u@h/db", Some("Bad-Name"), None).is_err());
        assert!(PgSettings::new("postgres://u@h/db", Some("same"), Some("same")).is_err());
        let ok = PgSettings::new("postgres://u:pw@h:5433/db?sslmode=prefer", None, None).unwrap();
        assert_eq!(ok.target, "h:5433 (database db, user u), sslmode=prefer");
        assert!(!format!("{ok:?}").contains("pw"));
    }
}
