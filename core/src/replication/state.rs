//! Persisted replication state.
//!
//! * [`RoleState`] — this node's role in one mode (node-local, `node/replication/<mode>`,
//!   encrypted by the barrier): disabled, primary (with its cluster id) or secondary (with
//!   the credential it activated with and its `last_remote_wal`).
//! * [`SecondaryRecord`] — a primary's record of one secondary (cluster-local,
//!   `core/local-replication/<mode>/secondary/<id>`, so a DR secondary of this primary holds
//!   it too and can serve the same secondaries after a promotion).
//! * [`Bundle`] — the activation credential a secondary gets by unwrapping its token.

use super::Mode;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    #[default]
    Disabled,
    Primary,
    Secondary,
}

/// What a secondary needs to reach and prove itself to its primary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Creds {
    pub secondary_id: String,
    pub secret: String,
    pub primary_cluster_id: String,
    pub primary_api_addr: String,
    pub primary_cluster_addrs: Vec<String>,
    /// PEM of the primary's cluster CA (empty: plain HTTP cluster channel).
    pub ca_pem: String,
    /// The client certificate this secondary presents on the cluster channel.
    #[serde(default)]
    pub client: Option<super::tls::ClientCert>,
}

/// A path filter (performance mode).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PathsFilter {
    /// `allow` or `deny`.
    pub mode: String,
    pub paths: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RoleState {
    pub role: Role,
    /// Primary: this cluster's id in the mode. DR secondary: the primary's. Performance
    /// secondary: its own.
    pub cluster_id: String,
    /// Primary: the cluster address advertised to secondaries.
    #[serde(default)]
    pub primary_cluster_addr: String,
    /// Secondary: the current credential (`None`: not connected to any primary).
    #[serde(default)]
    pub creds: Option<Creds>,
    #[serde(default)]
    pub last_remote_wal: u64,
    /// Secondary: the filter the primary last reported (performance).
    #[serde(default)]
    pub filter: Option<super::msg::FilterView>,
    /// Secondary: a Merkle diff is due before streaming (after update-primary).
    #[serde(default)]
    pub needs_sync: bool,
}

/// A primary's record of one secondary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SecondaryRecord {
    pub id: String,
    /// Hex SHA-256 of the secret.
    pub secret_hash: String,
    pub created: u64,
    /// Accessor of the activation (wrapping) token, revoked with the secondary.
    #[serde(default)]
    pub wrap_accessor: String,
    #[serde(default)]
    pub filter: Option<PathsFilter>,
}

/// The activation credential bundle (response-wrapped at the primary).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bundle {
    pub mode: Mode,
    pub primary_cluster_id: String,
    pub primary_cluster_addrs: Vec<String>,
    pub primary_api_addr: String,
    pub secondary_id: String,
    pub secret: String,
    pub ca_pem: String,
    /// The secondary's client certificate for the cluster channel (mutual TLS).
    #[serde(default)]
    pub client: Option<super::tls::ClientCert>,
    /// Hex barrier key, so the activated secondary can read what it receives before it is
    /// next unsealed with the primary's key shares.
    pub barrier_key: String,
    /// The primary's seal configuration and sealed keyring (hex), written by the secondary in
    /// the same write set as its wipe, so that it can be unsealed with the primary's key
    /// shares after a restart even before its first Merkle sync completes.
    #[serde(default)]
    pub seal_config: String,
    #[serde(default)]
    pub keyring: String,
    /// The version of the primary that minted the credential (a secondary older than it
    /// refuses it: [`super::version`]).
    #[serde(default)]
    pub primary_version: String,
}
