//! The leader lease and the node registry of an HA cluster on PostgreSQL, on a connection
//! of their own (see the parent module's "Fencing"): [`PgLease`] takes, renews and releases
//! the lease (its epoch grows at every take-over and release) and records each node's echo.

use super::{err, PgSettings};
use cairn_core::storage::StorageError;
use postgres::Client;
use std::time::{Duration, Instant};

/// The lease as its holder has it: the epoch fences its commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub epoch: u64,
    pub node_id: String,
    pub api_addr: String,
    pub cluster_addr: String,
    /// When the lease expires by the database's clock (ms since the Unix epoch).
    pub expires_at_ms: i64,
    /// A local deadline no later than the database's expiry: the request that took or
    /// renewed the lease was sent at or before the database read its clock, so the lease is
    /// surely held until then. A holder stops acting as the leader by this instant unless a
    /// renewal succeeded meanwhile.
    pub valid_until: Instant,
}

/// The lease row as anyone reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderRow {
    pub epoch: u64,
    pub node_id: String,
    pub api_addr: String,
    pub cluster_addr: String,
    /// ms since the Unix epoch, by the database's clock.
    pub acquired_at_ms: i64,
    pub expires_at_ms: i64,
    /// How long it is still valid, by the database's clock (ms).
    pub remaining_ms: i64,
}

/// One node of the registry ([`PgLease::echo`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    pub node_id: String,
    pub api_addr: String,
    pub cluster_addr: String,
    pub version: String,
    /// Last echo, ms since the Unix epoch by the database's clock.
    pub last_echo_ms: i64,
    /// How long ago that was, by the database's clock (ms).
    pub age_ms: i64,
}

/// The leader lease and the node registry, on a connection of their own (see the module
/// documentation): a lease's epoch grows by one at every take-over and release.
pub struct PgLease {
    settings: PgSettings,
    client: Option<Client>,
}

/// `$n * interval '1 millisecond'` for a duration.
fn ms(d: Duration) -> f64 {
    d.as_millis() as f64
}

impl PgLease {
    /// Connects (the schema is [`PgStorage::open`]'s: open the storage first).
    pub fn connect(settings: &PgSettings) -> Result<PgLease, String> {
        Ok(PgLease {
            settings: settings.clone(),
            client: Some(settings.connect()?),
        })
    }

    fn client(&mut self) -> Result<&mut Client, StorageError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.client = None;
            self.client = Some(self.settings.connect().map_err(StorageError::Io)?);
        }
        self.client
            .as_mut()
            .ok_or_else(|| StorageError::Io("no connection to PostgreSQL".into()))
    }

    /// Takes the lease if it is free, expired (by the database's clock) or its holder's lease
    /// session is gone from the database (the holder's process died: its connection closed;
    /// a paused holder keeps its session, so only the expiry frees its lease), bumping its
    /// epoch; `None` while another node holds it (or this node already does: see
    /// [`PgLease::renew`]).
    pub fn try_acquire(
        &mut self,
        node_id: &str,
        api_addr: &str,
        cluster_addr: &str,
        ttl: Duration,
    ) -> Result<Option<Held>, StorageError> {
        let sent = Instant::now();
        let sql = format!(
            "UPDATE {} SET epoch = epoch + 1, holder = $1, api_addr = $2, cluster_addr = $3, \
             holder_pid = pg_backend_pid(), \
             acquired_at = now(), expires_at = now() + $4 * interval '1 millisecond' \
             WHERE id = 1 AND (holder IS NULL OR expires_at <= now() \
                 OR NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = holder_pid)) \
             RETURNING epoch, (extract(epoch from expires_at) * 1000)::bigint",
            self.settings.ha_table
        );
        let row = self
            .client()?
            .query_opt(&sql, &[&node_id, &api_addr, &cluster_addr, &ms(ttl)])
            .map_err(err)?;
        Ok(row.map(|r| Held {
            epoch: r.get::<_, i64>(0).max(0) as u64,
            node_id: node_id.into(),
            api_addr: api_addr.into(),
            cluster_addr: cluster_addr.into(),
            expires_at_ms: r.get(1),
            valid_until: sent + ttl,
        }))
    }

    /// Extends the lease by `ttl` from now if `held` is still the lease (same epoch and
    /// holder); false when another node took it or it was released. Updates `held`'s expiry.
    pub fn renew(&mut self, held: &mut Held, ttl: Duration) -> Result<bool, StorageError> {
        let sent = Instant::now();
        let sql = format!(
            "UPDATE {} SET expires_at = now() + $3 * interval '1 millisecond', \
             holder_pid = pg_backend_pid() \
             WHERE id = 1 AND epoch = $1 AND holder = $2 \
             RETURNING (extract(epoch from expires_at) * 1000)::bigint",
            self.settings.ha_table
        );
        let epoch = held.epoch as i64;
        let row = self
            .client()?
            .query_opt(&sql, &[&epoch, &held.node_id, &ms(ttl)])
            .map_err(err)?;
        Ok(match row {
            Some(r) => {
                held.expires_at_ms = r.get(0);
                held.valid_until = sent + ttl;
                true
            }
            None => false,
        })
    }

    /// Steps down: frees the lease (if `held` is still it) and bumps the epoch, so commits
    /// fenced with the released epoch are refused from now on. True when it was released.
    pub fn release(&mut self, held: &Held) -> Result<bool, StorageError> {
        let sql = format!(
            "UPDATE {} SET epoch = epoch + 1, holder = NULL, api_addr = NULL, \
             cluster_addr = NULL, acquired_at = NULL, expires_at = '-infinity' \
             WHERE id = 1 AND epoch = $1 AND holder = $2",
            self.settings.ha_table
        );
        let epoch = held.epoch as i64;
        let n = self
            .client()?
            .execute(&sql, &[&epoch, &held.node_id])
            .map_err(err)?;
        Ok(n == 1)
    }

    /// The current holder, if the lease is held and not expired.
    pub fn leader(&mut self) -> Result<Option<LeaderRow>, StorageError> {
        let sql = format!(
            "SELECT epoch, holder, api_addr, cluster_addr, \
             (extract(epoch from acquired_at) * 1000)::bigint, \
             (extract(epoch from expires_at) * 1000)::bigint, \
             (extract(epoch from expires_at - now()) * 1000)::bigint \
             FROM {} WHERE id = 1 AND holder IS NOT NULL AND expires_at > now()",
            self.settings.ha_table
        );
        let row = self.client()?.query_opt(&sql, &[]).map_err(err)?;
        Ok(row.map(|r| LeaderRow {
            epoch: r.get::<_, i64>(0).max(0) as u64,
            node_id: r.get::<_, Option<String>>(1).unwrap_or_default(),
            api_addr: r.get::<_, Option<String>>(2).unwrap_or_default(),
            cluster_addr: r.get::<_, Option<String>>(3).unwrap_or_default(),
            acquired_at_ms: r.get::<_, Option<i64>>(4).unwrap_or_default(),
            expires_at_ms: r.get::<_, Option<i64>>(5).unwrap_or_default(),
            remaining_ms: r.get::<_, Option<i64>>(6).unwrap_or_default(),
        }))
    }

    /// The lease's current epoch (whether held or not).
    #[cfg(test)]
    pub fn epoch(&mut self) -> Result<u64, StorageError> {
        let sql = format!("SELECT epoch FROM {} WHERE id = 1", self.settings.ha_table);
        let row = self.client()?.query_opt(&sql, &[]).map_err(err)?;
        Ok(row.map_or(0, |r| r.get::<_, i64>(0).max(0) as u64))
    }

    /// Records that `node_id` is alive (its addresses and version), by the database's clock.
    pub fn echo(
        &mut self,
        node_id: &str,
        api_addr: &str,
        cluster_addr: &str,
        version: &str,
    ) -> Result<(), StorageError> {
        let sql = format!(
            "INSERT INTO {} (node_id, api_addr, cluster_addr, last_echo, version) \
             VALUES ($1, $2, $3, now(), $4) ON CONFLICT (node_id) DO UPDATE SET \
             api_addr = EXCLUDED.api_addr, cluster_addr = EXCLUDED.cluster_addr, \
             last_echo = EXCLUDED.last_echo, version = EXCLUDED.version",
            self.settings.nodes_table()
        );
        self.client()?
            .execute(&sql, &[&node_id, &api_addr, &cluster_addr, &version])
            .map_err(err)
            .map(|_| ())
    }

    /// Every node that ever echoed, by node id.
    pub fn nodes(&mut self) -> Result<Vec<NodeRow>, StorageError> {
        let sql = format!(
            "SELECT node_id, api_addr, cluster_addr, version, \
             (extract(epoch from last_echo) * 1000)::bigint, \
             (extract(epoch from now() - last_echo) * 1000)::bigint \
             FROM {} ORDER BY node_id",
            self.settings.nodes_table()
        );
        let rows = self.client()?.query(&sql, &[]).map_err(err)?;
        Ok(rows
            .into_iter()
            .map(|r| NodeRow {
                node_id: r.get(0),
                api_addr: r.get(1),
                cluster_addr: r.get(2),
                version: r.get(3),
                last_echo_ms: r.get(4),
                age_ms: r.get(5),
            })
            .collect())
    }
}
