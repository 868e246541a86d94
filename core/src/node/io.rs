//! What goes into a node and what comes out: the [`Input`]s a driver hands
//! [`super::Node::handle`], the [`Output`]s it takes from [`super::Node::poll_output`], and
//! the [`NodeConfig`] fixed at start. Plain data only; no behaviour beyond defaults.

use super::snapshot;
use crate::admin::{Admin, AdminAnswer, AdminId};
use crate::api::{Request, RequestId, Response};
use crate::auth::ldap::{LdapCall, LdapReply};
use crate::replication::{
    self, HttpCall, HttpReply, PeerReply, PeerRequest, PeerResponse, PeerSend,
};
use crate::time::Millis;

/// Something that happens to a node.
#[derive(Debug, Clone)]
pub enum Input {
    /// An API request.
    Request(Request),
    /// The result of an LDAP operation the node asked for.
    Ldap(LdapReply),
    /// Time passed; do periodic work (expiry, heartbeats).
    Tick,
    /// Operator actions of the process itself (dev mode set-up, shutdown); answered with
    /// [`Output::AdminDone`] carrying the same `id`.
    Admin { id: AdminId, cmd: Admin },
    /// A message that arrived on the cluster listener (replication).
    PeerRequest(PeerRequest),
    /// The answer to a [`Output::PeerSend`].
    PeerReply(PeerReply),
    /// The result of an [`Output::HttpCall`].
    HttpReply(HttpReply),
    /// The result of an [`Output::AuditProbe`]: the file opened for appending, or why not.
    AuditProbed {
        id: RequestId,
        result: Result<(), String>,
    },
    /// The outcome of an [`Output::Lease`] (HA clusters).
    Lease(crate::ha::LeaseResult),
    /// The active node's answer to a request this standby forwarded
    /// ([`Output::Forward`]), or why it could not be had.
    Forwarded {
        id: RequestId,
        result: Result<Response, String>,
    },
    /// A request the driver forwarded along the [`Output::ForwardRoute`] failed or was
    /// refused: the node looks for the active node again (its answer went to the client).
    ForwardFailed { reason: String },
    /// The file a driver wrote for an [`Output::SnapshotSave`], or why it could not.
    SnapshotSaved {
        id: RequestId,
        result: Result<Vec<u8>, crate::storage::StorageError>,
    },
}

/// Something the node wants done.
#[derive(Debug, Clone)]
pub enum Output {
    Response(Response),
    Ldap(LdapCall),
    /// The answer to the [`Input::Admin`] command `id` (dev set-up: keys and root token).
    AdminDone {
        id: AdminId,
        result: AdminAnswer,
    },
    /// Send a message to a peer's cluster address; answer with [`Input::PeerReply`].
    PeerSend(PeerSend),
    /// The answer to an [`Input::PeerRequest`].
    PeerResponse(PeerResponse),
    /// Make an outbound HTTP call; answer with [`Input::HttpReply`].
    HttpCall(HttpCall),
    /// Serve the cluster listener with this certificate (the node became a primary).
    ClusterTls(replication::tls::ClusterTls),
    /// Append one line to an audit device's file before the batch commits. When
    /// `required`, a failure fails the batch closed (and is reported with
    /// [`super::Node::audit_device_failed`]); otherwise it is only logged.
    /// A file the line creates gets the permission bits `mode` (0: 0600).
    Audit {
        file_path: String,
        mode: u32,
        line: String,
        required: bool,
    },
    /// Open `file_path` for appending (creating it) and answer with
    /// [`Input::AuditProbed`]: an audit device being enabled by request `id`. The file is
    /// created with, or set to, the permission bits `mode` (0: an existing file's mode is
    /// left alone, a new one gets 0600).
    AuditProbe {
        id: RequestId,
        file_path: String,
        mode: u32,
    },
    /// Acquire, renew or release the cluster's leadership lease; answer with
    /// [`Input::Lease`]. The driver commits every batch under [`super::Node::fence`].
    Lease(crate::ha::LeaseOp),
    /// Send a client request to the active node of this HA cluster and answer with
    /// [`Input::Forwarded`]: sent at most once, never retried after it left.
    Forward(Forward),
    /// A standby's route to the active node changed (`None`: it forwards nothing itself
    /// now). A driver may forward requests along it without the node
    /// ([`crate::ha::route::sign`] decides and signs), and hands a request back to the node
    /// when it has no route, when the connection failed before the request was sent, or
    /// when the receiving node refused it ([`crate::ha::route::is_refusal`]); after a
    /// failure it reports [`Input::ForwardFailed`].
    ForwardRoute(Option<crate::ha::route::ForwardRoute>),
    /// This node became the active node (`Some(epoch)`) or a standby (`None`). The driver
    /// drops caches of storage it kept while the other role wrote.
    HaRole(Option<u64>),
    /// Write a snapshot file of the storage as it is once this input's batch is committed
    /// (with snapshot offload on: [`super::Node::set_snapshot_offload`]), then answer with
    /// [`Input::SnapshotSaved`]. The driver ends the batch after the input that emitted it,
    /// commits it, pins a consistent read of the storage at once (before the next batch
    /// writes), and feeds every row of that read in key order to the writer, off the thread
    /// that runs the node, which meanwhile goes on with other inputs.
    SnapshotSave(snapshot::SnapshotSave),
}

/// A request a standby sends to its cluster's active node.
#[derive(Debug, Clone)]
pub struct Forward {
    /// The request as the client sent it, with its signature in `forwarded`.
    pub req: Request,
    /// The active node's cluster address.
    pub to: String,
    /// The cluster CA (PEM) the active node's cluster listener presents a certificate of:
    /// the connection is TLS pinned to it.
    pub ca_pem: String,
    /// The client certificate the standby presents (mutual TLS).
    pub client: Option<crate::replication::tls::ClientCert>,
}

/// Settings fixed at start.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub node_id: String,
    pub cluster_name: String,
    pub version: String,
    /// Interval between ticks the node asks for.
    pub tick_ms: Millis,
    /// Replication settings (addresses, WAL retention).
    pub replication: replication::ReplicationConfig,
    /// The verified license (replication needs one).
    pub license: crate::license::LicenseState,
    /// HA settings when the node is one of several sharing a storage.
    pub ha: Option<crate::ha::HaConfig>,
    /// The storage engine's name as `sys/seal-status` reports it.
    pub storage_type: String,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            node_id: "node".into(),
            cluster_name: "cairn-cluster".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            tick_ms: 1000,
            replication: Default::default(),
            license: Default::default(),
            ha: None,
            storage_type: "sqlite".into(),
        }
    }
}
