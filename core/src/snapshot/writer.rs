//! The snapshot file writer, fed in pieces: rows go in as a reader of storage produces them
//! (any number per call, in key order), the file comes out at the end. It does no I/O, so
//! the node uses it on its own storage and a driver uses it on a thread of its own that reads
//! a consistent view of the storage ([`crate::Output::SnapshotSave`]); both write the same
//! file. Nothing is decrypted: rows are the stored, barrier-encrypted values.
//!
//! The file's preamble carries its total length and the header its row count, so the body is
//! kept until [`Writer::finish`], which puts the preamble and header in front of it and the
//! checksum and MAC after it.

use super::{in_snapshot, Header, Keys, SnapshotError, MAGIC, PREAMBLE, TRAILER, VERSION};
use crate::crypto;
use crate::storage::Storage;

/// Rows are read from storage this many at a time.
pub const CHUNK: usize = 1024;

/// A snapshot file being written (see the module documentation).
#[derive(Clone)]
pub struct Writer {
    keys: Keys,
    header: Header,
    body: Vec<u8>,
    rows: u64,
    last: Option<String>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The MAC key stays out of logs and traces.
        f.debug_struct("Writer")
            .field("header", &self.header)
            .field("rows", &self.rows)
            .field("body_bytes", &self.body.len())
            .finish()
    }
}

impl Writer {
    /// A file of this cluster (`keys`) whose header is `header` (the cluster's fingerprint and
    /// the row count are filled in at the end).
    pub fn new(keys: Keys, header: Header) -> Writer {
        Writer {
            keys,
            header,
            body: Vec::new(),
            rows: 0,
            last: None,
        }
    }

    /// The header the file will carry (its WAL index is the point the file captures).
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Adds rows of storage in ascending key order, continuing after the last one added; keys
    /// a snapshot does not carry (node-local state) are skipped. A key at or before the last
    /// one added is refused: the reader went wrong, and the file would not read back.
    pub fn push<I>(&mut self, rows: I) -> Result<(), SnapshotError>
    where
        I: IntoIterator<Item = (String, Vec<u8>)>,
    {
        for (k, v) in rows {
            if self.last.as_ref().is_some_and(|l| *l >= k) {
                return Err(SnapshotError::Malformed(format!(
                    "storage returned key {k:?} out of order while a snapshot was written"
                )));
            }
            if in_snapshot(&k) {
                self.body.extend_from_slice(&(k.len() as u32).to_be_bytes());
                self.body.extend_from_slice(k.as_bytes());
                self.body.extend_from_slice(&(v.len() as u32).to_be_bytes());
                self.body.extend_from_slice(&v);
                self.rows += 1;
            }
            self.last = Some(k);
        }
        Ok(())
    }

    /// The key after which the next rows go (`None` before the first).
    pub fn after(&self) -> Option<&str> {
        self.last.as_deref()
    }

    /// The whole file: preamble, header, the rows pushed, checksum, MAC.
    pub fn finish(self) -> Vec<u8> {
        let Writer {
            keys,
            mut header,
            body,
            rows,
            ..
        } = self;
        header.cluster = keys.cluster.clone();
        header.rows = rows;
        let head = serde_json::to_vec(&header).unwrap_or_default();
        let total = PREAMBLE + head.len() + body.len() + TRAILER;
        let mut front = Vec::with_capacity(PREAMBLE + head.len());
        front.extend_from_slice(MAGIC);
        front.extend_from_slice(&VERSION.to_be_bytes());
        front.extend_from_slice(&(total as u64).to_be_bytes());
        front.extend_from_slice(&(head.len() as u32).to_be_bytes());
        front.extend_from_slice(&head);
        let mut out = body;
        out.reserve_exact(front.len() + TRAILER);
        out.splice(0..0, front);
        let sum = crypto::sha256(&out);
        out.extend_from_slice(&sum);
        let tag = crypto::hmac_sha256(&keys.mac, &out);
        out.extend_from_slice(&tag);
        out
    }

    /// Reads every row of `storage` in chunks of [`CHUNK`] into the file and finishes it.
    pub fn write_all(mut self, storage: &dyn Storage) -> Result<Vec<u8>, SnapshotError> {
        loop {
            let chunk = storage.scan_after(self.after(), CHUNK)?;
            let done = chunk.len() < CHUNK;
            self.push(chunk)?;
            if done {
                return Ok(self.finish());
            }
        }
    }
}
