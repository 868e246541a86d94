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
//! batch's last value of each key in one statement, hence one round trip and one implicit
//! transaction (the fence, an upsert of `unnest`ed arrays and a delete of an array, as
//! common table expressions; `MATERIALIZED` needs PostgreSQL 12 or newer). Without
//! pipelining the statement returns once PostgreSQL made its commit durable; the runtime
//! pipelines ([`PgStorage::pipeline`], see [`flush`]): it returns before the WAL flush and a
//! barrier on another connection makes the batch durable before its answers leave. A failed
//! commit (or [`PgStorage::rollback`]) drops the batch whole; the runtime then answers its
//! inputs with the error and the node reloads what it derived from it. (A connection that
//! breaks after the statement was sent leaves the outcome unknown, as with any database client: the inputs are answered with the error,
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
//! statement, before any row is written, and writes nothing (reporting
//! [`StorageError::Fenced`]) if the lease is at another epoch. Taking the lease ([`PgLease::try_acquire`]) bumps the epoch with an
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

mod flush;
mod lease;
mod tls;

use cairn_core::storage::{Storage, StorageError, Write};
use postgres::{Client, NoTls, Statement};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

pub use flush::{Ledger, PgFlush, Ticket};

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
         CREATE TABLE IF NOT EXISTS {t}_flush (
             id int PRIMARY KEY CHECK (id = 1),
             n bigint NOT NULL);
         INSERT INTO {t}_flush (id, n) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
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
    get_many: Statement,
    scan: Statement,
    scan_after: Statement,
    count: Statement,
    count_in: Statement,
    fence: Statement,
    /// A batch's whole commit in one statement (one round trip): the fence, the upsert and
    /// the delete (see [`Conn::open`]).
    write: Statement,
    /// The server this session is on ([`flush::server_identity`]).
    server: String,
}

impl Conn {
    /// A session for the storage; `pipelined`: its commits do not wait for the WAL flush
    /// (a [`PgFlush`] barrier makes them durable before anything depends on them).
    fn open(s: &PgSettings, pipelined: bool) -> Result<Conn, String> {
        let mut client = s.connect()?;
        let setup = |client: &mut Client| -> Result<String, postgres::Error> {
            if pipelined {
                client.batch_execute("SET synchronous_commit = off")?;
            }
            flush::server_identity(client)
        };
        let server = setup(&mut client).map_err(|e| {
            format!(
                "PostgreSQL at {}: cannot set up the session: {}",
                s.target,
                why(&e)
            )
        })?;
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
        let get_many = prep(&format!(
            "SELECT key, value FROM {t} WHERE key = ANY($1::bytea[])"
        ))?;
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
        let fence = prep(&format!("SELECT epoch FROM {ha} WHERE id = 1 FOR SHARE"))?;
        // One implicit transaction. `lease` share-locks the lease row's newest version
        // before any row is written (the writes' `EXISTS (ok)` is evaluated first, and `ok`
        // reads `lease`), so a new holder's epoch `UPDATE` waits for this commit; a
        // statement that finds another epoch ($3 NULL: no fence) writes nothing and reports
        // it. The rows: the locked epoch (NULL without a fence) and whether it wrote.
        let write = prep(&format!(
            "WITH lease AS MATERIALIZED (
                 SELECT epoch FROM {ha} WHERE id = 1 AND $3::bigint IS NOT NULL FOR SHARE),
             ok AS MATERIALIZED (
                 SELECT 1 WHERE $3::bigint IS NULL
                     OR EXISTS (SELECT 1 FROM lease WHERE epoch = $3::bigint)),
             up AS (
                 INSERT INTO {t} (key, value)
                 SELECT k, v FROM unnest($1::bytea[], $2::bytea[]) AS u(k, v)
                 WHERE EXISTS (SELECT 1 FROM ok)
                 ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value),
             del AS (
                 DELETE FROM {t} WHERE key = ANY($4::bytea[]) AND EXISTS (SELECT 1 FROM ok))
             SELECT (SELECT epoch FROM lease), EXISTS (SELECT 1 FROM ok)"
        ))?;
        Ok(Conn {
            client,
            get,
            get_many,
            scan,
            scan_after,
            count,
            count_in,
            fence,
            write,
            server,
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
            (crate::storage::key_string(k), r.get(1))
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
    /// Pipelined commits ([`PgStorage::pipeline`]): what the flush barrier confirms.
    ledger: Option<Arc<Ledger>>,
    /// The commits since [`PgStorage::take_tickets`] last ran, each to be confirmed.
    tickets: Vec<Ticket>,
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
        let conn = Conn::open(settings, false)?;
        Ok(PgStorage {
            settings: settings.clone(),
            conn: RefCell::new(Some(conn)),
            batch: false,
            pending: BTreeMap::new(),
            fence: FenceMode::None,
            cache: RefCell::new(None),
            ledger: None,
            tickets: Vec::new(),
        })
    }

    /// Switches to pipelined commits (see [`flush`]): from now on a commit returns before
    /// its batch is durable and leaves a [`Ticket`] ([`PgStorage::take_tickets`]) that the
    /// returned [`PgFlush`] must confirm before anything depending on the batch leaves the
    /// node. On an error the storage stays as it was (every commit durable at `COMMIT`).
    pub fn pipeline(&mut self) -> Result<PgFlush, String> {
        let ledger = Arc::new(Ledger::default());
        let flush = PgFlush::open(&self.settings, ledger.clone())?;
        let conn = Conn::open(&self.settings, true)?;
        *self.conn.get_mut() = Some(conn);
        self.ledger = Some(ledger);
        Ok(flush)
    }

    /// The tickets of the commits since the last call, oldest first: each must be confirmed
    /// by the [`PgFlush`] before what depends on its batch is released.
    pub fn take_tickets(&mut self) -> Vec<Ticket> {
        std::mem::take(&mut self.tickets)
    }

    /// A read of everything committed so far on a new connection
    /// ([`crate::snapshot_read`]).
    pub fn pinned_read(&self) -> Result<crate::snapshot_read::PinnedRead, StorageError> {
        let client = self.settings.connect().map_err(StorageError::Io)?;
        crate::snapshot_read::open_postgres(client, &self.settings.table)
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

    /// Reads `keys` into the read cache in one round trip (when it is on): the values, and
    /// the absence of those not stored. The batch's later reads of them are then answered
    /// from memory. Keys the open batch wrote or the cache holds are skipped; a failed read
    /// is left to the reads themselves to report.
    pub fn prefetch(&self, keys: &[String]) {
        if self.cache.borrow().is_none() || keys.is_empty() {
            return;
        }
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        if let Err(e) = self.get_many(&keys) {
            log::debug!("prefetch of {} keys failed: {e}", keys.len());
        }
    }

    /// Runs `f` on the connection, reconnecting first if it broke.
    fn with_conn<T>(
        &self,
        f: impl FnOnce(&mut Conn) -> Result<T, postgres::Error>,
    ) -> Result<T, StorageError> {
        let mut slot = self.conn.borrow_mut();
        if slot.as_ref().is_none_or(|c| c.client.is_closed()) {
            *slot = None;
            if let Some(l) = self.ledger.as_ref().filter(|l| l.has_unconfirmed()) {
                // Commits of the broken session may be unflushed, hence lost if the server
                // went down: nothing is committed until the node has reloaded its view.
                l.mark_lost();
            }
            match Conn::open(&self.settings, self.ledger.is_some()) {
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
        let ledger = self.ledger.clone();
        if pending.is_empty() {
            if ledger.as_ref().is_some_and(|l| l.take_lost()) {
                return Err(self.lost_view());
            }
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
        // Pipelined: the flush generation the batch begins under, the server that took it,
        // and whether an earlier commit's loss stopped it.
        let gen = ledger.as_ref().map_or(0, |l| l.gen());
        let mut took: Option<String> = None;
        let mut lost = false;
        let res = self.with_conn(|c| {
            // After a reconnect (which marks it) or a failed barrier: refused, see `flush`.
            if ledger.as_ref().is_some_and(|l| l.is_lost()) {
                lost = true;
                return Ok(());
            }
            let held = fence.map(|e| e as i64);
            let row = if initialize {
                // Only if no other node initialised it first (under the lease row's lock).
                let mut tx = c.client.transaction()?;
                let (ha, t) = (&self.settings.ha_table, &self.settings.table);
                tx.query_opt(&format!("SELECT 1 FROM {ha} WHERE id = 1 FOR UPDATE"), &[])?;
                let seal_key: &[u8] = cairn_core::seal::SEAL_CONFIG_KEY.as_bytes();
                let seal_sql = format!("SELECT 1 FROM {t} WHERE key = $1");
                if tx.query_opt(&seal_sql, &[&seal_key])?.is_some() {
                    initialized = true;
                    return Ok(());
                }
                let row = tx.query_one(&c.write, &[&put_k, &put_v, &held, &del])?;
                tx.commit()?;
                row
            } else {
                c.client
                    .query_one(&c.write, &[&put_k, &put_v, &held, &del])?
            };
            if !row.get::<_, bool>(1) {
                let current: Option<i64> = row.get(0);
                fenced = Some(current.unwrap_or(0).max(0) as u64);
                return Ok(());
            }
            took = Some(c.server.clone());
            Ok(())
        });
        if lost {
            if let Some(l) = &ledger {
                l.take_lost();
            }
            return Err(self.lost_view());
        }
        if let Some(cache) = self.cache.get_mut().as_mut() {
            for (k, v) in &pending {
                // A failed commit's outcome may be unknown (a broken connection): forget.
                match (&res, fenced, initialized) {
                    (Ok(()), None, false) => cache.wrote(k, v),
                    _ => cache.evict(k),
                }
            }
        }
        if let (Some(l), Some(server)) = (&ledger, took) {
            l.committed();
            self.tickets.push(Ticket { gen, server });
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

    /// The refusal of a batch after an earlier pipelined commit could not be confirmed
    /// durable: the runtime answers the batch with it and the node reloads what it derived
    /// from storage before its next batch. The read cache may hold the lost writes: emptied.
    fn lost_view(&mut self) -> StorageError {
        if let Some(cache) = self.cache.get_mut().as_mut() {
            cache.clear();
        }
        log::error!(
            "an earlier batch may not be in the database at {} (its WAL flush was not \
             confirmed): this batch is refused and the node reloads its state from the \
             database",
            self.settings.target
        );
        StorageError::Io(
            "PostgreSQL: an earlier write may have been lost (the database did not confirm \
             its flush); this request was not applied, retry it"
                .into(),
        )
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

    fn get_many(&self, keys: &[&str]) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        // The open batch's writes, then the cache; the rest in one query.
        let mut out: Vec<Option<Option<Vec<u8>>>> = keys
            .iter()
            .map(|k| {
                self.pending
                    .get(*k)
                    .cloned()
                    .or_else(|| self.cache.borrow().as_ref().and_then(|c| c.get(k)))
            })
            .collect();
        let missing: Vec<&[u8]> = keys
            .iter()
            .zip(&out)
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.as_bytes())
            .collect();
        if missing.is_empty() {
            return Ok(out.into_iter().map(Option::flatten).collect());
        }
        let found: BTreeMap<String, Vec<u8>> = self
            .with_conn(|c| c.client.query(&c.get_many, &[&missing]))
            .map(rows_to_pairs)?
            .into_iter()
            .collect();
        let mut cache = self.cache.borrow_mut();
        for (k, v) in keys.iter().zip(out.iter_mut()) {
            if v.is_none() {
                let read = found.get(*k).cloned();
                if let Some(cache) = cache.as_mut() {
                    cache.fill(k, &read);
                }
                *v = Some(read);
            }
        }
        Ok(out.into_iter().map(Option::flatten).collect())
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
mod tests;
