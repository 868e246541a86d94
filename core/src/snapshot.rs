//! Snapshots of a node's storage (`sys/storage/raft/snapshot`): the file format, how a file
//! is written from storage and checked when it is read back, and the write set a restore
//! applies.
//!
//! The file holds the stored values as they are: barrier-encrypted (AES-256-GCM under the
//! barrier key, the path bound as associated data), so it is useless without the unseal
//! keys; nothing is decrypted into it. Layout, all integers big-endian:
//!
//! ```text
//! magic "CAIRNSNP" | format version u16 | body length u64 | header length u32 | header (JSON)
//! | rows: (key length u32, key, value length u32, value) in key order
//! | SHA-256 of everything before | HMAC-SHA256 of everything before (incl. the checksum)
//! ```
//!
//! The header names the cluster the file came from (a fingerprint of its barrier key), the
//! point in the write order it captured (the WAL index, when the node keeps a WAL), the
//! number of rows and whether a performance secondary took it (no restore takes such a file). The checksum tells a damaged file from a good one whatever the keys; the
//! MAC, under a key derived from the barrier key (HKDF-SHA256), refuses a file that was
//! altered and checksummed again, or made under other keys. Node-local keys (`node/`: WAL,
//! Merkle records, replication roles) are not in the file: they describe this node, not the
//! data. A restore keeps this cluster's keys and replication bookkeeping ([`kept`]).

use crate::crypto;
use crate::seal::{KEYRING_KEY, KEY_INSTALL_TIME_KEY, SEAL_CONFIG_KEY};
use crate::storage::{Storage, StorageError, Write};
use crate::time::Millis;
use serde::{Deserialize, Serialize};

mod writer;
pub use writer::{Writer, CHUNK};

/// The first bytes of every snapshot file.
pub const MAGIC: &[u8; 8] = b"CAIRNSNP";
/// The format version this server writes and reads.
pub const VERSION: u16 = 1;
/// Magic, version, body length, header length.
const PREAMBLE: usize = 8 + 2 + 8 + 4;
/// Checksum and MAC.
const TRAILER: usize = 32 + 32;
/// Largest header accepted (it is a few hundred bytes).
const MAX_HEADER: usize = 64 * 1024;

/// What the file says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// Fingerprint of the barrier key of the cluster the file came from ([`cluster_id`]).
    pub cluster: String,
    /// The node's WAL index when the snapshot was taken: every write acknowledged with an
    /// `X-Vault-Index` at or below it is in the file, none above it (0 without a WAL).
    pub index: u64,
    /// Number of rows.
    pub rows: u64,
    /// The node's clock when the snapshot was taken (milliseconds since the epoch).
    pub taken_at: Millis,
    /// The node that took it.
    pub node_id: String,
    /// Taken on a performance secondary: its data is its primary's filtered view plus its
    /// own cluster-local data, so no cluster is restored from it.
    #[serde(default)]
    pub on_secondary: bool,
}

/// A file that passed every check: its header and its rows in key order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub header: Header,
    pub rows: Vec<(String, Vec<u8>)>,
}

/// Why a file was refused. Every message names the problem and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotError {
    /// Not a snapshot of this server (wrong magic or too short for one).
    NotASnapshot,
    /// A format version this server does not read.
    Version(u16),
    /// Fewer bytes than the file declares.
    Truncated { have: u64, want: u64 },
    /// More bytes than the file declares.
    TrailingBytes { extra: u64 },
    /// The checksum does not match: the file was damaged.
    Checksum,
    /// The header or the rows do not parse (with the checksum right: written by another
    /// program).
    Malformed(String),
    /// The file came from another cluster (other barrier keys).
    WrongCluster { file: String, this: String },
    /// The MAC does not match: the file was altered after it was written.
    Mac,
    /// Reading storage failed.
    Storage(StorageError),
}

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotError::NotASnapshot => write!(
                f,
                "snapshot: the body is not a Cairn snapshot file (no CAIRNSNP header); send \
                 the file `operator snapshot save` wrote"
            ),
            SnapshotError::Version(v) => write!(
                f,
                "snapshot: the file has format version {v}, this server reads version \
                 {VERSION}; restore it with the server version that wrote it"
            ),
            SnapshotError::Truncated { have, want } => write!(
                f,
                "snapshot: the file is truncated ({have} of {want} bytes); copy it again \
                 from where it was kept"
            ),
            SnapshotError::TrailingBytes { extra } => write!(
                f,
                "snapshot: the file has {extra} bytes after its end; copy it again from \
                 where it was kept"
            ),
            SnapshotError::Checksum => write!(
                f,
                "snapshot: the file is corrupted (its SHA-256 checksum does not match); \
                 copy it again from where it was kept"
            ),
            SnapshotError::Malformed(m) => write!(f, "snapshot: the file is malformed: {m}"),
            SnapshotError::WrongCluster { file, this } => write!(
                f,
                "snapshot: the file was taken on another cluster (cluster {file}, this is \
                 cluster {this}); a restore only takes a snapshot of this cluster"
            ),
            SnapshotError::Mac => write!(
                f,
                "snapshot: the file's authentication code does not match this cluster's \
                 keys: it was altered after it was written; nothing was restored"
            ),
            SnapshotError::Storage(e) => write!(f, "{e}"),
        }
    }
}

impl From<StorageError> for SnapshotError {
    fn from(e: StorageError) -> Self {
        SnapshotError::Storage(e)
    }
}

/// The keys a snapshot carries: everything but node-local state.
pub fn in_snapshot(key: &str) -> bool {
    !key.starts_with(crate::replication::class::NODE_LOCAL)
}

/// Keys a restore leaves as they are: node-local state, the seal configuration and the
/// keyring (the unseal keys the operators hold now keep working) and this cluster's
/// replication bookkeeping (its secondaries, its cluster CA).
pub fn kept(key: &str) -> bool {
    !in_snapshot(key)
        || key.starts_with(crate::replication::class::LOCAL_REPLICATION)
        || key == SEAL_CONFIG_KEY
        || key == KEYRING_KEY
        || key == KEY_INSTALL_TIME_KEY
}

/// The keys derived from the barrier key: the cluster's fingerprint and the MAC key.
#[derive(Clone)]
pub struct Keys {
    cluster: String,
    mac: [u8; 32],
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("cluster", &self.cluster)
            .finish()
    }
}

impl Keys {
    pub fn from_barrier_key(barrier_key: &[u8; 32]) -> Keys {
        let id = crypto::hkdf_sha256(barrier_key, b"cairn snapshot cluster id v1");
        Keys {
            cluster: hex::encode(&id[..16]),
            mac: crypto::hkdf_sha256(barrier_key, b"cairn snapshot mac v1"),
        }
    }
    /// This cluster's fingerprint as files name it.
    pub fn cluster_id(&self) -> &str {
        &self.cluster
    }
}

/// Writes every key of `storage` that belongs in a snapshot into a file whose header is
/// `header` with this cluster's fingerprint and the row count filled in.
pub fn write(storage: &dyn Storage, keys: &Keys, header: Header) -> Result<Vec<u8>, SnapshotError> {
    Writer::new(keys.clone(), header).write_all(storage)
}

/// The file of `header` and `rows` (in strictly ascending key order) under `keys`.
pub(crate) fn encode(header: &Header, rows: &[(String, Vec<u8>)], keys: &Keys) -> Vec<u8> {
    let mut w = Writer::new(keys.clone(), header.clone());
    match w.push(rows.iter().cloned()) {
        Ok(()) => w.finish(),
        // Rows out of order make a file the reader refuses; the caller gets one anyway.
        Err(_) => Vec::new(),
    }
}

/// Checks a file's framing and checksum (no keys needed) and reads its header.
pub fn inspect(file: &[u8]) -> Result<Header, SnapshotError> {
    if file.len() < MAGIC.len() || &file[..MAGIC.len()] != MAGIC {
        return Err(SnapshotError::NotASnapshot);
    }
    if file.len() < PREAMBLE {
        return Err(SnapshotError::Truncated {
            have: file.len() as u64,
            want: PREAMBLE as u64,
        });
    }
    let version = u16::from_be_bytes([file[8], file[9]]);
    if version != VERSION {
        return Err(SnapshotError::Version(version));
    }
    let want = u64::from_be_bytes(file[10..18].try_into().unwrap_or_default());
    let have = file.len() as u64;
    if have < want {
        return Err(SnapshotError::Truncated { have, want });
    }
    if have > want {
        return Err(SnapshotError::TrailingBytes { extra: have - want });
    }
    if file.len() < PREAMBLE + TRAILER {
        return Err(SnapshotError::Malformed(
            "the file is shorter than its fixed parts".into(),
        ));
    }
    let sum_at = file.len() - TRAILER;
    if !crypto::ct_eq(&crypto::sha256(&file[..sum_at]), &file[sum_at..sum_at + 32]) {
        return Err(SnapshotError::Checksum);
    }
    let head_len = u32::from_be_bytes(file[18..22].try_into().unwrap_or_default()) as usize;
    if head_len > MAX_HEADER || PREAMBLE + head_len > sum_at {
        return Err(SnapshotError::Malformed(format!(
            "the header length {head_len} does not fit the file"
        )));
    }
    serde_json::from_slice(&file[PREAMBLE..PREAMBLE + head_len])
        .map_err(|e| SnapshotError::Malformed(format!("the header does not parse: {e}")))
}

/// Reads a file taken on the cluster of `keys`: framing, checksum, cluster, MAC, then the
/// rows (strictly ascending keys, each one a snapshot carries, as many as the header says).
pub fn read(file: &[u8], keys: &Keys) -> Result<Snapshot, SnapshotError> {
    let header = inspect(file)?;
    if header.cluster != keys.cluster {
        return Err(SnapshotError::WrongCluster {
            file: header.cluster,
            this: keys.cluster.clone(),
        });
    }
    let mac_at = file.len() - 32;
    if !crypto::ct_eq(
        &crypto::hmac_sha256(&keys.mac, &file[..mac_at]),
        &file[mac_at..],
    ) {
        return Err(SnapshotError::Mac);
    }
    let head_len = u32::from_be_bytes(file[18..22].try_into().unwrap_or_default()) as usize;
    let rows = rows(
        &file[PREAMBLE + head_len..file.len() - TRAILER],
        header.rows,
    )?;
    Ok(Snapshot { header, rows })
}

/// Parses the rows section.
fn rows(mut b: &[u8], count: u64) -> Result<Vec<(String, Vec<u8>)>, SnapshotError> {
    let bad = |m: &str| SnapshotError::Malformed(m.to_string());
    let take = |b: &mut &[u8]| -> Result<Vec<u8>, SnapshotError> {
        if b.len() < 4 {
            return Err(bad("a row is cut short"));
        }
        let n = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
        if b.len() - 4 < n {
            return Err(bad("a row is longer than the file"));
        }
        let v = b[4..4 + n].to_vec();
        *b = &b[4 + n..];
        Ok(v)
    };
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    while !b.is_empty() {
        let k = String::from_utf8(take(&mut b)?).map_err(|_| bad("a key is not UTF-8"))?;
        let v = take(&mut b)?;
        if out.last().is_some_and(|(p, _)| *p >= k) {
            return Err(bad("the keys are not in strictly ascending order"));
        }
        if !in_snapshot(&k) {
            return Err(bad("a row holds a node-local key"));
        }
        out.push((k, v));
    }
    if out.len() as u64 != count {
        return Err(SnapshotError::Malformed(format!(
            "the header declares {count} rows, the file holds {}",
            out.len()
        )));
    }
    Ok(out)
}

/// The write set that makes `storage` hold the snapshot's rows, keys [`kept`] aside: deletes
/// of keys the snapshot lacks, writes of keys it holds with another value. Nothing for a
/// storage that already holds it.
pub fn restore_writes(storage: &dyn Storage, snap: &Snapshot) -> Result<Vec<Write>, StorageError> {
    let mut writes = Vec::new();
    let mut want = snap.rows.iter().filter(|(k, _)| !kept(k)).peekable();
    let mut after: Option<String> = None;
    loop {
        let chunk = storage.scan_after(after.as_deref(), CHUNK)?;
        let Some((last, _)) = chunk.last() else { break };
        after = Some(last.clone());
        let done = chunk.len() < CHUNK;
        for (k, v) in chunk.into_iter().filter(|(k, _)| !kept(k)) {
            // Rows of the snapshot before this stored key are missing here.
            while let Some((wk, wv)) = want.next_if(|(wk, _)| *wk < k) {
                writes.push((wk.clone(), Some(wv.clone())));
            }
            match want.next_if(|(wk, _)| *wk == k) {
                Some((_, wv)) if *wv == v => {}
                Some((_, wv)) => writes.push((k, Some(wv.clone()))),
                None => writes.push((k, None)),
            }
        }
        if done {
            break;
        }
    }
    writes.extend(want.map(|(k, v)| (k.clone(), Some(v.clone()))));
    Ok(writes)
}

#[cfg(test)]
mod tests;
