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
//!
//! On the wire ([`PeerMsg::into_wire`], [`PeerAnswer::into_wire`]) a message is its JSON
//! text, followed, when it carries a bulk payload ([`Holdings`], [`SyncBatch`],
//! [`ChangeBatch`]), by a zero
//! byte and the payload's compact binary form (see [`Packed`]). Plain JSON is a valid frame
//! too: there a bulk payload is the base64 of its binary form.

use super::class::Class;
use super::merkle::{self, Hash, TreeKind};
use super::wal::WalEntry;
use super::Mode;
use base64::Engine;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeSet;

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
    /// The secondary's version (the primary refuses an older one: [`super::version`]).
    #[serde(default)]
    pub version: String,
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
    /// What the secondary holds in some buckets of one subtree (its keys after `after`, a
    /// key relative to the subtree's storage prefix, up to and including `until` when it
    /// sends only a window of them); answered with [`PeerAnswer::Synced`]: at most
    /// `max_values` of the primary's keys in that range that the secondary lacks, and which
    /// of the secondary's keys the primary does not hold.
    MerkleSync {
        subtree: SubtreeRef,
        after: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        until: Option<String>,
        max_values: u32,
        holdings: Holdings,
    },
    /// A client request a performance secondary authorized and sends to its primary's
    /// active node to be applied there ([`super::forward`]); answered with
    /// [`PeerAnswer::Forwarded`].
    Forward {
        req: Box<super::forward::ForwardedRequest>,
    },
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
    /// The primary's version.
    #[serde(default)]
    pub version: String,
    /// Every cluster address of the primary's cluster (the one it advertises first, then
    /// the other nodes of its HA cluster): the secondary keeps its known addresses up to
    /// date from it, so that it finds the next active node after a failover.
    #[serde(default)]
    pub cluster_addrs: Vec<String>,
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
    /// The full entries after the requested index are gone, but their keys are kept: the
    /// current value (or absence) of every key the entries after the requested index up to
    /// and including `upto` wrote (filtered for the secondary), read when the primary's WAL
    /// ended at `at`. The secondary holds a copy that is not a state of the primary's until
    /// it has applied the entries up to `at` (values newer than its position).
    Changes {
        info: PrimaryInfo,
        upto: u64,
        at: u64,
        batch: ChangeBatch,
    },
    Roots {
        info: PrimaryInfo,
        index: u64,
        roots: Vec<(SubtreeRef, String)>,
    },
    /// The page hashes of each subtree asked about.
    Pages {
        pages: Vec<(SubtreeRef, Hashes)>,
    },
    /// The subpage sums of each page asked about.
    Subpages {
        subpages: Vec<(SubtreeRef, u16, Hashes)>,
    },
    /// The answer to [`PeerBody::MerkleSync`]. `upto`: the end of the key range the answer
    /// covers (the primary read all its keys after the request's `after` up to and
    /// including it; `None`: to the end of the subtree); the `stale` positions count only
    /// for the secondary's keys in that range. With `more`, ask again after `upto` (after
    /// the last value when a primary sends no `upto`).
    Synced {
        batch: SyncBatch,
        more: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        upto: Option<String>,
    },
    /// The primary's answer to a [`PeerBody::Forward`], as its client would have had it.
    Forwarded {
        status: u16,
        body: Option<serde_json::Value>,
        /// The primary's `X-Vault-Index` after the request's writes.
        index: Option<String>,
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
    /// The client certificate to present (mutual TLS).
    pub client: Option<super::tls::ClientCert>,
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

/// Why a frame or a bulk payload could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The JSON part is not a message of the expected kind.
    Json(String),
    /// A binary payload ends early.
    Truncated,
    /// A binary payload is malformed.
    Malformed(&'static str),
    /// A binary attachment follows a message that carries no bulk payload.
    UnexpectedAttachment,
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Json(e) => write!(f, "malformed JSON: {e}"),
            WireError::Truncated => write!(f, "binary payload truncated"),
            WireError::Malformed(what) => write!(f, "malformed binary payload: {what}"),
            WireError::UnexpectedAttachment => {
                write!(f, "binary attachment to a message without a bulk payload")
            }
        }
    }
}

impl std::error::Error for WireError {}

/// Leaf hashes in a Merkle sync are cut to their first `SHORT_LEAF` bytes: a secondary's
/// key is taken as held by the primary when their short leaves are equal, which two
/// different (key, value) pairs are by chance with probability 2^-64.
pub const SHORT_LEAF: usize = 8;
pub type ShortLeaf = [u8; SHORT_LEAF];

pub fn short_leaf(h: &Hash) -> ShortLeaf {
    let mut s = [0u8; SHORT_LEAF];
    s.copy_from_slice(&h[..SHORT_LEAF]);
    s
}

/// Buckets of one subtree (`page * SUBPAGES + subpage`).
const BUCKETS: usize = merkle::PAGES * merkle::SUBPAGES;

/// A list of hashes; in JSON, one base64 string of their concatenation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hashes(pub Vec<Hash>);

impl Serialize for Hashes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let flat: Vec<u8> = self.0.iter().flatten().copied().collect();
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(flat))
    }
}

impl<'de> Deserialize<'de> for Hashes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let t = String::deserialize(d)?;
        let flat = base64::engine::general_purpose::STANDARD
            .decode(t)
            .map_err(serde::de::Error::custom)?;
        if flat.len() % 32 != 0 {
            return Err(serde::de::Error::custom(
                "hash list length not a multiple of 32",
            ));
        }
        Ok(Hashes(
            flat.chunks_exact(32)
                .map(|c| {
                    let mut h = merkle::ZERO;
                    h.copy_from_slice(c);
                    h
                })
                .collect(),
        ))
    }
}

/// What a secondary holds in some buckets of one subtree (a [`PeerBody::MerkleSync`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Holdings {
    /// The buckets covered (each below `PAGES * SUBPAGES`).
    pub buckets: BTreeSet<u32>,
    /// The short leaves of the secondary's keys there, in key order.
    pub leaves: Vec<ShortLeaf>,
}

/// The primary's answer to a [`PeerBody::MerkleSync`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SyncBatch {
    /// Positions in the request's `leaves` that the primary does not hold: the secondary
    /// deletes those keys (unless `values` holds a new value for one).
    pub stale: Vec<u32>,
    /// The primary's keys (relative to the subtree's storage prefix) whose leaves the
    /// secondary lacks, with their stored bytes, in key order.
    pub values: Vec<(String, Vec<u8>)>,
}

/// The keys a [`PeerAnswer::Changes`] brings, in key order, each with its class and its
/// stored bytes (`None`: deleted).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChangeBatch {
    pub changes: Vec<(String, Class, Option<Vec<u8>>)>,
}

/// A bulk payload's compact binary form: lengths and counts are LEB128 varints.
///
/// * [`Holdings`]: a bitmap of the `PAGES * SUBPAGES` buckets (bit `b % 8` of byte `b / 8`),
///   the number of leaves, then the leaves (`SHORT_LEAF` bytes each).
/// * [`SyncBatch`]: the number of stale positions and the positions; the number of values,
///   then each value as its key front-coded against the previous key (length of the shared
///   prefix, length and bytes of the rest) and the length and bytes of the stored value.
/// * [`ChangeBatch`]: the number of changes, then each as its key front-coded as above, a
///   tag byte (the class: 0 replicated, 1 cluster-local, 2 node-local; plus 0x80 when a
///   value follows) and, with 0x80, the length and bytes of the stored value.
pub trait Packed: Sized + Default + PartialEq {
    fn pack(&self, out: &mut Vec<u8>);
    fn unpack(r: &mut Reader<'_>) -> Result<Self, WireError>;

    /// Decodes a whole payload (trailing bytes are an error).
    fn from_packed(b: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader { b };
        let v = Self::unpack(&mut r)?;
        if !r.b.is_empty() {
            return Err(WireError::Malformed("trailing bytes"));
        }
        Ok(v)
    }
    fn to_packed(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.pack(&mut out);
        out
    }
}

/// Reads a binary payload.
pub struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if n > self.b.len() {
            return Err(WireError::Truncated);
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }
    fn varint(&mut self) -> Result<u64, WireError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.take(1)?[0];
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(WireError::Malformed("varint overflow"));
            }
            v |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(WireError::Malformed("varint too long"))
    }
    /// A length or count of items of at least `unit` bytes each, checked against what is
    /// left (so a forged count cannot make the decoder allocate more than the input).
    fn count(&mut self, unit: usize) -> Result<usize, WireError> {
        let n = usize::try_from(self.varint()?).map_err(|_| WireError::Truncated)?;
        if n.saturating_mul(unit.max(1)) > self.b.len() {
            return Err(WireError::Truncated);
        }
        Ok(n)
    }
    fn bytes(&mut self) -> Result<&'a [u8], WireError> {
        let n = self.count(1)?;
        self.take(n)
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

impl Packed for Holdings {
    fn pack(&self, out: &mut Vec<u8>) {
        let mut bitmap = [0u8; BUCKETS / 8];
        for &b in self.buckets.iter().filter(|b| (**b as usize) < BUCKETS) {
            bitmap[b as usize / 8] |= 1 << (b % 8);
        }
        out.extend_from_slice(&bitmap);
        put_varint(out, self.leaves.len() as u64);
        for l in &self.leaves {
            out.extend_from_slice(l);
        }
    }
    fn unpack(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let bitmap = r.take(BUCKETS / 8)?;
        let buckets = (0..BUCKETS as u32)
            .filter(|b| bitmap[*b as usize / 8] & (1 << (b % 8)) != 0)
            .collect();
        let n = r.count(SHORT_LEAF)?;
        let mut leaves = Vec::with_capacity(n);
        for _ in 0..n {
            let mut l = [0u8; SHORT_LEAF];
            l.copy_from_slice(r.take(SHORT_LEAF)?);
            leaves.push(l);
        }
        Ok(Holdings { buckets, leaves })
    }
}

impl Packed for SyncBatch {
    fn pack(&self, out: &mut Vec<u8>) {
        put_varint(out, self.stale.len() as u64);
        for &i in &self.stale {
            put_varint(out, u64::from(i));
        }
        put_varint(out, self.values.len() as u64);
        let mut prev: &[u8] = &[];
        for (k, v) in &self.values {
            put_key(out, prev, k.as_bytes());
            put_bytes(out, v);
            prev = k.as_bytes();
        }
    }
    fn unpack(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let n = r.count(1)?;
        let mut stale = Vec::with_capacity(n);
        for _ in 0..n {
            let i = u32::try_from(r.varint()?)
                .map_err(|_| WireError::Malformed("stale position out of range"))?;
            stale.push(i);
        }
        // Each value takes at least three bytes (shared length, key rest, value length).
        let n = r.count(3)?;
        let mut values = Vec::with_capacity(n);
        let mut prev: Vec<u8> = Vec::new();
        for _ in 0..n {
            let k = read_key(r, &prev)?;
            let v = r.bytes()?.to_vec();
            let key = String::from_utf8(k.clone())
                .map_err(|_| WireError::Malformed("key is not UTF-8"))?;
            values.push((key, v));
            prev = k;
        }
        Ok(SyncBatch { stale, values })
    }
}

/// Front-codes `k` against `prev` (see [`Packed`]).
fn put_key(out: &mut Vec<u8>, prev: &[u8], k: &[u8]) {
    let shared = prev.iter().zip(k).take_while(|(a, b)| a == b).count();
    put_varint(out, shared as u64);
    put_bytes(out, &k[shared..]);
}

/// Reads a key front-coded against `prev` (see [`Packed`]).
fn read_key(r: &mut Reader<'_>, prev: &[u8]) -> Result<Vec<u8>, WireError> {
    let shared = usize::try_from(r.varint()?).unwrap_or(usize::MAX);
    if shared > prev.len() {
        return Err(WireError::Malformed(
            "shared key prefix longer than the last key",
        ));
    }
    let mut k = prev[..shared].to_vec();
    k.extend_from_slice(r.bytes()?);
    Ok(k)
}

impl Packed for ChangeBatch {
    fn pack(&self, out: &mut Vec<u8>) {
        put_varint(out, self.changes.len() as u64);
        let mut prev: &[u8] = &[];
        for (k, class, v) in &self.changes {
            put_key(out, prev, k.as_bytes());
            let tag = class.tag() | if v.is_some() { 0x80 } else { 0 };
            out.push(tag);
            if let Some(v) = v {
                put_bytes(out, v);
            }
            prev = k.as_bytes();
        }
    }
    fn unpack(r: &mut Reader<'_>) -> Result<Self, WireError> {
        // Each change takes at least three bytes (shared length, key rest, tag).
        let n = r.count(3)?;
        let mut changes = Vec::with_capacity(n);
        let mut prev: Vec<u8> = Vec::new();
        for _ in 0..n {
            let k = read_key(r, &prev)?;
            let tag = r.take(1)?[0];
            let class =
                Class::from_tag(tag & 0x7f).ok_or(WireError::Malformed("unknown class tag"))?;
            let v = if tag & 0x80 != 0 {
                Some(r.bytes()?.to_vec())
            } else {
                None
            };
            let key = String::from_utf8(k.clone())
                .map_err(|_| WireError::Malformed("key is not UTF-8"))?;
            changes.push((key, class, v));
            prev = k;
        }
        Ok(ChangeBatch { changes })
    }
}

/// Serde for a [`Packed`] payload: the base64 of its binary form, `""` for an empty one.
macro_rules! packed_serde {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                if *self == <$t>::default() {
                    return s.serialize_str("");
                }
                s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(self.to_packed()))
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let t = String::deserialize(d)?;
                if t.is_empty() {
                    return Ok(<$t>::default());
                }
                let b = base64::engine::general_purpose::STANDARD
                    .decode(t)
                    .map_err(serde::de::Error::custom)?;
                <$t>::from_packed(&b).map_err(serde::de::Error::custom)
            }
        }
    };
}
packed_serde!(Holdings);
packed_serde!(SyncBatch);
packed_serde!(ChangeBatch);

/// A message's bulk payload moved to and from a frame's binary attachment.
trait Bulk {
    /// The payload's binary form; the payload is left empty.
    fn take_packed(&mut self) -> Vec<u8>;
    fn put_packed(&mut self, b: &[u8]) -> Result<(), WireError>;
}

impl<T: Packed> Bulk for T {
    fn take_packed(&mut self) -> Vec<u8> {
        std::mem::take(self).to_packed()
    }
    fn put_packed(&mut self, b: &[u8]) -> Result<(), WireError> {
        *self = T::from_packed(b)?;
        Ok(())
    }
}

/// Encodes a frame: the JSON of `m` with its bulk payload (if any) taken out and attached.
fn into_frame<M: Serialize>(
    mut m: M,
    bulk: impl FnOnce(&mut M) -> Option<&mut dyn Bulk>,
) -> Result<Vec<u8>, WireError> {
    let attachment = bulk(&mut m).map(|b| b.take_packed());
    let mut out = serde_json::to_vec(&m).map_err(|e| WireError::Json(e.to_string()))?;
    if let Some(a) = attachment {
        out.push(0);
        out.extend_from_slice(&a);
    }
    Ok(out)
}

/// Decodes a frame (see [`into_frame`]).
fn from_frame<M: for<'de> Deserialize<'de>>(
    b: &[u8],
    bulk: impl FnOnce(&mut M) -> Option<&mut dyn Bulk>,
) -> Result<M, WireError> {
    let (json, attachment) = match b.iter().position(|c| *c == 0) {
        Some(i) => (&b[..i], Some(&b[i + 1..])),
        None => (b, None),
    };
    let mut m: M = serde_json::from_slice(json).map_err(|e| WireError::Json(e.to_string()))?;
    if let Some(a) = attachment {
        bulk(&mut m)
            .ok_or(WireError::UnexpectedAttachment)?
            .put_packed(a)?;
    }
    Ok(m)
}

impl PeerMsg {
    fn bulk(&mut self) -> Option<&mut dyn Bulk> {
        match &mut self.body {
            PeerBody::MerkleSync { holdings, .. } => Some(holdings),
            _ => None,
        }
    }
    /// The message as a cluster channel frame (see the module doc).
    pub fn into_wire(self) -> Result<Vec<u8>, WireError> {
        into_frame(self, PeerMsg::bulk)
    }
    pub fn from_wire(b: &[u8]) -> Result<PeerMsg, WireError> {
        from_frame(b, PeerMsg::bulk)
    }
}

impl PeerAnswer {
    fn bulk(&mut self) -> Option<&mut dyn Bulk> {
        match self {
            PeerAnswer::Synced { batch, .. } => Some(batch),
            PeerAnswer::Changes { batch, .. } => Some(batch),
            _ => None,
        }
    }
    /// The answer as a cluster channel frame (see the module doc).
    pub fn into_wire(self) -> Result<Vec<u8>, WireError> {
        into_frame(self, PeerAnswer::bulk)
    }
    pub fn from_wire(b: &[u8]) -> Result<PeerAnswer, WireError> {
        from_frame(b, PeerAnswer::bulk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck::{quickcheck, TestResult};

    fn holdings(buckets: Vec<u16>, leaves: Vec<u64>) -> Holdings {
        Holdings {
            buckets: buckets
                .into_iter()
                .map(|b| u32::from(b) % BUCKETS as u32)
                .collect(),
            leaves: leaves.into_iter().map(u64::to_be_bytes).collect(),
        }
    }

    fn batch(stale: Vec<u32>, values: Vec<(String, Vec<u8>)>) -> SyncBatch {
        let mut values = values;
        values.sort();
        SyncBatch { stale, values }
    }

    fn auth() -> PeerAuth {
        PeerAuth {
            secondary_id: "s".into(),
            secret: "x".into(),
            primary_cluster_id: "p".into(),
            cluster_id: "c".into(),
            node_id: "n".into(),
            api_addr: "http://a".into(),
            cluster_addr: "b:1".into(),
            version: "1.2.3".into(),
        }
    }

    quickcheck! {
        fn holdings_round_trip(buckets: Vec<u16>, leaves: Vec<u64>) -> bool {
            let h = holdings(buckets, leaves);
            Holdings::from_packed(&h.to_packed()) == Ok(h)
        }

        fn sync_batch_round_trip(stale: Vec<u32>, values: Vec<(String, Vec<u8>)>) -> bool {
            let b = batch(stale, values);
            SyncBatch::from_packed(&b.to_packed()).as_ref() == Ok(&b)
        }

        /// Frames round-trip, through the binary attachment and as plain JSON.
        fn frames_round_trip(
            buckets: Vec<u16>,
            leaves: Vec<u64>,
            stale: Vec<u32>,
            values: Vec<(String, Vec<u8>)>,
            more: bool
        ) -> bool {
            let m = PeerMsg {
                mode: Mode::Dr,
                auth: auth(),
                body: PeerBody::MerkleSync {
                    subtree: (TreeKind::Local, "logical/u".into()),
                    after: values.first().map(|v| v.0.clone()),
                    until: values.last().map(|v| v.0.clone()),
                    max_values: 7,
                    holdings: holdings(buckets, leaves),
                },
            };
            let upto = more.then(|| values.last().map(|v| v.0.clone())).flatten();
            let a = PeerAnswer::Synced { batch: batch(stale, values), more, upto };
            let m_json = serde_json::to_vec(&m).unwrap();
            let a_json = serde_json::to_vec(&a).unwrap();
            PeerMsg::from_wire(&m.clone().into_wire().unwrap()).as_ref() == Ok(&m)
                && PeerAnswer::from_wire(&a.clone().into_wire().unwrap()).as_ref() == Ok(&a)
                && PeerMsg::from_wire(&m_json).as_ref() == Ok(&m)
                && PeerAnswer::from_wire(&a_json).as_ref() == Ok(&a)
        }

        fn change_batch_round_trip(changes: Vec<(String, u8, Option<Vec<u8>>)>, at: u64) -> bool {
            let mut changes: Vec<(String, Class, Option<Vec<u8>>)> = changes
                .into_iter()
                .map(|(k, c, v)| {
                    let c = [Class::Replicated, Class::ClusterLocal, Class::NodeLocal][c as usize % 3];
                    (k, c, v)
                })
                .collect();
            changes.sort();
            let b = ChangeBatch { changes };
            let a = PeerAnswer::Changes {
                info: PrimaryInfo::default(),
                upto: at / 2,
                at,
                batch: b.clone(),
            };
            let a_json = serde_json::to_vec(&a).unwrap();
            ChangeBatch::from_packed(&b.to_packed()).as_ref() == Ok(&b)
                && PeerAnswer::from_wire(&a.clone().into_wire().unwrap()).as_ref() == Ok(&a)
                && PeerAnswer::from_wire(&a_json).as_ref() == Ok(&a)
        }

        /// Arbitrary payloads decode to an error or to something that re-encodes to itself.
        fn garbage_never_panics(b: Vec<u8>) -> TestResult {
            if let Ok(x) = SyncBatch::from_packed(&b) {
                assert_eq!(SyncBatch::from_packed(&x.to_packed()), Ok(x));
            }
            if let Ok(x) = Holdings::from_packed(&b) {
                assert_eq!(Holdings::from_packed(&x.to_packed()), Ok(x));
            }
            if let Ok(x) = ChangeBatch::from_packed(&b) {
                assert_eq!(ChangeBatch::from_packed(&x.to_packed()), Ok(x));
            }
            let mut frame = br#"{"op":"synced","batch":"","more":true}"#.to_vec();
            frame.push(0);
            frame.extend_from_slice(&b);
            if let Ok(x) = PeerAnswer::from_wire(&frame) {
                let again = PeerAnswer::from_wire(&x.clone().into_wire().unwrap());
                assert_eq!(again, Ok(x));
            }
            TestResult::passed()
        }
    }

    #[test]
    fn attachment_only_where_a_payload_is() {
        let pong = PeerAnswer::Pong {
            info: PrimaryInfo::default(),
        };
        let mut w = pong.clone().into_wire().unwrap();
        assert_eq!(PeerAnswer::from_wire(&w), Ok(pong));
        assert!(!w.contains(&0));
        w.push(0);
        assert_eq!(
            PeerAnswer::from_wire(&w),
            Err(WireError::UnexpectedAttachment)
        );
        let a = PeerAnswer::Synced {
            batch: SyncBatch::default(),
            more: false,
            upto: None,
        };
        let w = a.clone().into_wire().unwrap();
        let json = br#"{"op":"synced","batch":"","more":false}"#;
        assert_eq!(&w[..json.len()], json);
        assert_eq!(w[json.len()], 0);
        assert_eq!(w[json.len() + 1..], SyncBatch::default().to_packed());
        assert_eq!(PeerAnswer::from_wire(&w), Ok(a));
    }

    #[test]
    fn sync_batch_is_compact() {
        // Keys sharing a prefix cost their differing tail; a value costs its length and bytes.
        let values: Vec<(String, Vec<u8>)> = (0..100)
            .map(|i| (format!("changed/{i:03}"), vec![7u8; 141]))
            .collect();
        let b = SyncBatch {
            stale: vec![1, 300],
            values,
        };
        let n = b.to_packed().len();
        assert!(n < 100 * (141 + 2 + 3 + 2) + 20, "{n}");
        let h = Holdings {
            buckets: (0..BUCKETS as u32).collect(),
            leaves: vec![[1; SHORT_LEAF]; 10],
        };
        assert_eq!(h.to_packed().len(), BUCKETS / 8 + 1 + 10 * SHORT_LEAF);
    }

    #[test]
    fn malformed_payloads_are_errors() {
        assert_eq!(SyncBatch::from_packed(&[]), Err(WireError::Truncated));
        // A count larger than the input.
        assert_eq!(
            SyncBatch::from_packed(&[0, 0x7f]),
            Err(WireError::Truncated)
        );
        // Shared prefix longer than the previous key.
        assert!(matches!(
            SyncBatch::from_packed(&[0, 1, 2, 0, 0]),
            Err(WireError::Malformed(_))
        ));
        // Not UTF-8.
        assert!(matches!(
            SyncBatch::from_packed(&[0, 1, 0, 1, 0xff, 0]),
            Err(WireError::Malformed(_))
        ));
        // Varint overflow.
        assert!(SyncBatch::from_packed(&[0xff; 12]).is_err());
        assert_eq!(
            SyncBatch::from_packed(&[0, 0, 9]),
            Err(WireError::Malformed("trailing bytes"))
        );
    }
}
