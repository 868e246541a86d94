//! The node's side of `sys/storage/raft/snapshot`: who may take or restore a snapshot here,
//! and what a restore does to the node's in-memory state.
//!
//! `GET` answers the snapshot file of the node's storage as it is after every earlier input
//! (the core handles inputs one at a time, and the answer leaves only after its batch
//! commits); the answer's `X-Vault-Index` names that point on a replication primary. With
//! snapshot offload ([`Node::set_snapshot_offload`], the server and the simulator) the node
//! only fixes that point: it emits [`crate::Output::SnapshotSave`] with a
//! [`snapshot::Writer`] whose header carries the WAL index, the driver ends the batch there,
//! pins a consistent read of the committed storage and writes the file off the node's
//! thread, and the node answers when [`crate::Input::SnapshotSaved`] brings the file back,
//! serving other inputs meanwhile. Without it the node scans its storage itself. `POST`
//! (or `PUT`) restores a file taken on this cluster: the file is checked whole
//! ([`crate::snapshot::read`]) before anything is written, then one write set makes the
//! storage hold the file's rows, deletes the Merkle records and starts a new WAL history
//! after a gap. The node then reloads what it derives from storage the way it does at unseal
//! (trees rebuilt from the data, WAL position, roles, local mounts), and its secondaries,
//! whose next pull finds the entries they need gone, compare Merkle trees and fetch the
//! difference on their own. `snapshot-force` (Vault's restore of another cluster's file,
//! whose keys then replace this cluster's) is refused: a file of another cluster cannot be
//! authenticated with this cluster's keys.

use super::{Node, NodeState};
use crate::api::{ApiError, ApiResult, Method, Reply, Request, RequestId, Response};
use crate::ctx::Ctx;
use crate::replication::{self, merkle, wal};
use crate::snapshot::{self, Snapshot, SnapshotError};
use crate::storage::{Storage, StorageError, Write};
use crate::Output;

/// What the route's handler decided; the node carries it out with its storage once the
/// request was authorized and its other writes (a spent token use) were committed.
#[derive(Clone, Debug)]
pub enum SnapshotOp {
    Save,
    Restore(Box<Snapshot>),
}

/// A save the driver carries out ([`crate::Output::SnapshotSave`]): the request it answers
/// and the file's writer, whose header names the point in the write order it captures.
#[derive(Clone, Debug)]
pub struct SnapshotSave {
    pub id: RequestId,
    pub writer: snapshot::Writer,
}

impl From<SnapshotError> for ApiError {
    fn from(e: SnapshotError) -> Self {
        match e {
            SnapshotError::Storage(s) => s.into(),
            other => ApiError::BadRequest(other.to_string()),
        }
    }
}

/// The handler of `sys/storage/raft/snapshot` and `snapshot-force` (`rest`: the path after
/// `sys/`): checks the node's role and, for a restore, the whole file.
pub(crate) fn handle(ctx: &Ctx, st: &mut NodeState, req: &Request, rest: &str) -> ApiResult {
    if rest.trim_end_matches('/').ends_with("snapshot-force") {
        return match req.method {
            Method::Post | Method::Put => Err(ApiError::bad(
                "snapshot-force is not supported: a snapshot of another cluster cannot be \
                 authenticated with this cluster's keys, and installing its keys would \
                 replace the unseal keys of this one; restore a snapshot taken on this \
                 cluster with sys/storage/raft/snapshot",
            )),
            _ => Err(ApiError::MethodNotAllowed),
        };
    }
    if st.ha.is_standby() {
        let active = st
            .ha
            .leader()
            .map(|l| format!(" ({})", l.api_addr))
            .unwrap_or_default();
        return Err(ApiError::bad(format!(
            "this node is a standby of its HA cluster: take or restore a snapshot on the \
             active node{active}"
        )));
    }
    let keys = ctx.barrier.snapshot_keys().ok_or(ApiError::Sealed)?;
    let op = match req.method {
        Method::Get => SnapshotOp::Save,
        Method::Post | Method::Put => {
            for (m, name) in [
                (replication::Mode::Performance, "performance"),
                (replication::Mode::Dr, "DR"),
            ] {
                if st.repl.role(m) == replication::state::Role::Secondary {
                    return Err(ApiError::bad(format!(
                        "this node is a {name} secondary: its data follows its primary; \
                         restore the snapshot on the primary and this secondary converges \
                         with it"
                    )));
                }
            }
            if req.body.is_empty() {
                return Err(ApiError::bad(
                    "snapshot: the request body is empty; send the snapshot file as the body",
                ));
            }
            let snap = snapshot::read(&req.body, &keys)?;
            if snap.header.on_secondary {
                return Err(ApiError::bad(format!(
                    "snapshot: the file was taken on performance secondary {}, whose data is \
                     its primary's filtered view: restore a snapshot taken on the primary",
                    snap.header.node_id
                )));
            }
            SnapshotOp::Restore(Box::new(snap))
        }
        _ => return Err(ApiError::MethodNotAllowed),
    };
    st.snapshot_op = Some(op);
    Ok(Reply::Empty)
}

impl<S: Storage> Node<S> {
    /// Lets the driver write snapshot files ([`crate::Output::SnapshotSave`]) instead of the
    /// node scanning its storage while it handles the request.
    pub fn set_snapshot_offload(&mut self, on: bool) {
        self.st.snapshot_offload = on;
    }

    /// Saves the driver is still writing (request ids), in order.
    pub fn snapshot_saves_in_flight(&self) -> Vec<RequestId> {
        self.st.snapshot_saves.keys().copied().collect()
    }

    /// Carries out a snapshot operation the route's handler decided (`id`: the request).
    pub(super) fn run_snapshot(&mut self, id: RequestId, op: SnapshotOp) -> ApiResult {
        let keys = self.barrier.snapshot_keys().ok_or(ApiError::Sealed)?;
        match op {
            SnapshotOp::Save => {
                let header = snapshot::Header {
                    cluster: String::new(),
                    index: self.st.repl.wal.last,
                    rows: 0,
                    taken_at: self.now,
                    node_id: self.st.config.node_id.clone(),
                    on_secondary: self.st.repl.is_perf_secondary(),
                };
                let writer = snapshot::Writer::new(keys, header);
                let index = replication::index_state::current(&self.st.repl);
                if self.st.snapshot_offload {
                    self.st.snapshot_saves.insert(id, index);
                    self.st
                        .outputs
                        .push_back(Output::SnapshotSave(SnapshotSave { id, writer }));
                    return Ok(Reply::Pending);
                }
                let file = writer.write_all(&self.storage)?;
                self.st.snapshot_index = index;
                Ok(Reply::Text(200, "application/octet-stream".into(), file))
            }
            SnapshotOp::Restore(snap) => {
                self.restore(&snap)?;
                Ok(Reply::Empty)
            }
        }
    }

    /// Answers a save the driver finished (or could not): the file with the `X-Vault-Index` of
    /// the point it captured. An id of no save in flight is ignored.
    pub(super) fn snapshot_saved(&mut self, id: RequestId, result: Result<Vec<u8>, StorageError>) {
        let Some(index) = self.st.snapshot_saves.remove(&id) else {
            log::warn!("a snapshot file for request {id}, which waits for none, was dropped");
            return;
        };
        let resp = match result {
            Ok(file) => Response {
                id,
                status: 200,
                body: None,
                raw: Some(("application/octet-stream".into(), file)),
                index,
            },
            Err(e) => {
                log::error!("snapshot save failed: {e}");
                Response::error(id, &ApiError::from(e))
            }
        };
        self.st.outputs.push_back(Output::Response(resp));
    }

    /// Makes storage hold `snap` in one write set and reloads the state derived from it.
    fn restore(&mut self, snap: &Snapshot) -> ApiResult<()> {
        let mut writes: Vec<Write> = snapshot::restore_writes(&self.storage, snap)?;
        // The trees are rebuilt from the restored data when the state is reloaded.
        writes.extend(
            self.storage
                .scan(merkle::PREFIX)?
                .into_iter()
                .map(|(k, _)| (k, None)),
        );
        writes.push((merkle::MARKER.to_string(), None));
        // A new WAL history after a gap: a secondary asking for the entries after any index
        // it holds learns they are gone and compares Merkle trees with this node.
        let meta = self.st.repl.wal;
        wal::reset(&self.storage, meta, meta.last + 1, &mut writes);
        let changed = writes.len();
        self.storage.apply(&writes)?;
        self.st.repl.forget_uncommitted();
        let mut env = self.env();
        replication::ensure_loaded(&mut env)?;
        // Held pulls learn at once that their entries are gone.
        replication::serve_after_restore(&mut env);
        log::info!(
            "restored a snapshot of {} rows taken at WAL index {} ({changed} storage writes)",
            snap.header.rows,
            snap.header.index
        );
        Ok(())
    }
}
