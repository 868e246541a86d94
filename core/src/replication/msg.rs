//! The replication protocol as plain data: what a secondary asks its primary over the cluster
//! channel ([`PeerMsg`]), what the primary answers ([`PeerAnswer`]), and the I/O envelopes
//! the node exchanges with its driver (shell or simulator):
//!
//! * [`PeerSend`] (output): send `msg` to the cluster address `to`; answer with a
//!   [`PeerReply`] input carrying the same `call_id`.
//! * [`PeerRequest`] (input): a message that arrived on this node's cluster listener; the node
//!   answers with a [`PeerResponse`] output with the same `id` (perhaps later: long poll).
//! * [`HttpCall`] (output) / [`HttpReply`] (input): an outbound API call (the secondary
//!   unwrapping its activation token at the primary's API address).

use super::class::Class;
use super::merkle::TreeKind;
use super::wal::WalEntry;
use super::Mode;
use serde::{Deserialize, Serialize};

/// Who is asking: the secondary's credential and what it reports about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerAuth {
    pub secondary_id: String,
    pub secret: String,
    /// The primary cluster the secondary believes it talks to.
    pub primary_cluster_id: String,
    pub cluster_id: String,
    pub node_id: String,
    pub api_addr: String,
    pub cluster_addr: String,
}

/// A subtree of one Merkle tree.
pub type SubtreeRef = (TreeKind, String);

/// What a secondary asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum PeerBody {
    /// Liveness and credential check (update-primary by addresses).
    Ping,
    /// WAL entries after `after`; the primary may hold the request up to `wait_ms`.
    Pull {
        after: u64,
        max_entries: u32,
        wait_ms: u64,
    },
    /// Subtree roots of the (filtered) trees and the WAL index they were taken at.
    MerkleRoots,
    /// Page hashes of subtrees.
    MerklePages { subtrees: Vec<SubtreeRef> },
    /// Subpage sums of pages.
    MerkleSubpages { want: Vec<(SubtreeRef, Vec<u16>)> },
    /// Keys and leaf hashes in buckets (`page * SUBPAGES + subpage`).
    MerkleKeys { want: Vec<(SubtreeRef, Vec<u32>)> },
    /// Stored values of keys.
    Fetch { keys: Vec<String> },
}

/// One request on the cluster channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerMsg {
    pub mode: Mode,
    pub auth: PeerAuth,
    pub body: PeerBody,
}

/// A path filter as the primary applies it to one performance secondary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct FilterView {
    pub mode: String,
    pub paths: Vec<String>,
    pub dynamic_filtered_mounts: Vec<String>,
    pub dynamic_filtered_namespaces: Vec<String>,
}

/// What every answer tells about the primary (heartbeat).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PrimaryInfo {
    pub cluster_id: String,
    pub last_wal: u64,
    pub api_addr: String,
    pub cluster_addr: String,
    /// The path filter for this secondary (performance mode).
    pub filter: Option<FilterView>,
}

/// A stored value sent during Merkle sync.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncValue {
    pub key: String,
    pub class: Class,
    #[serde(with = "b64opt")]
    pub value: Option<Vec<u8>>,
}

/// What the primary answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum PeerAnswer {
    Pong {
        info: PrimaryInfo,
    },
    /// Entries after the requested index (filtered), up to and including `last`.
    Entries {
        info: PrimaryInfo,
        entries: Vec<WalEntry>,
        last: u64,
    },
    /// The entries after the requested index are no longer retained (or the secondary is
    /// ahead of this primary): run Merkle diff.
    Gone {
        info: PrimaryInfo,
    },
    Roots {
        info: PrimaryInfo,
        index: u64,
        roots: Vec<(SubtreeRef, String)>,
    },
    Pages {
        pages: Vec<(SubtreeRef, Vec<String>)>,
    },
    Subpages {
        subpages: Vec<(SubtreeRef, u16, Vec<String>)>,
    },
    Keys {
        keys: Vec<(SubtreeRef, Vec<(String, String)>)>,
    },
    Values {
        values: Vec<SyncValue>,
    },
    /// Refused: `code` is `unknown-secondary`, `not-primary`, `wrong-cluster`, `bad-request`.
    Error {
        code: String,
        message: String,
    },
}

/// Output: send a message to a peer's cluster address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSend {
    pub call_id: u64,
    /// Cluster address (`host:port`, or a URL).
    pub to: String,
    pub msg: PeerMsg,
    /// PEM of the cluster CA to trust (empty: plain HTTP).
    pub ca_pem: String,
}

/// Input: the answer to a [`PeerSend`], or why there is none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerReply {
    pub call_id: u64,
    pub result: Result<PeerAnswer, String>,
}

/// Input: a message that arrived on the cluster listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRequest {
    pub id: u64,
    pub msg: PeerMsg,
}

/// Output: the answer to a [`PeerRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerResponse {
    pub id: u64,
    pub msg: PeerAnswer,
}

/// Output: an outbound HTTP call (JSON body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpCall {
    pub call_id: u64,
    pub method: String,
    pub url: String,
    pub body: Vec<u8>,
    /// PEM CA file and directory of PEM files to trust (empty: system roots).
    pub ca_file: String,
    pub ca_path: String,
}

/// Input: the result of an [`HttpCall`]: status and body, or a transport error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpReply {
    pub call_id: u64,
    pub result: Result<(u16, Vec<u8>), String>,
}

mod b64opt {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            None => s.serialize_none(),
            Some(b) => s.serialize_some(&base64::engine::general_purpose::STANDARD.encode(b)),
        }
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let o: Option<String> = Option::deserialize(d)?;
        match o {
            None => Ok(None),
            Some(t) => base64::engine::general_purpose::STANDARD
                .decode(t)
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }
}
