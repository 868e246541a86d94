//! The write-ahead log a primary keeps for its secondaries (the reference's "log shipper").
//!
//! Every committed change on a node that is a primary (either mode) becomes one
//! [`WalEntry`] with the next index; the last entry of a write set is marked `end`, so a
//! secondary applies whole write sets only. A DR secondary stores its primary's entries under
//! the primary's indices, so that after promotion it continues the same sequence.
//!
//! Retention is bounded by entry count and bytes ([`Limits`]); the oldest entries are
//! dropped first. A secondary that needs an entry older than the first retained one has to
//! go through Merkle diff and sync.
//!
//! Layout (node-local): `node/wal/meta` (JSON [`Meta`]) and `node/wal/e/<index, 20 digits>`
//! (JSON entry).

use super::class::Class;
use crate::storage::{Storage, StorageError, Write};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const META: &str = "node/wal/meta";
pub const ENTRY: &str = "node/wal/e/";

/// Retention bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_entries: u64,
    pub max_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entries: 100_000,
            max_bytes: 256 << 20,
        }
    }
}

/// One logged change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalEntry {
    pub index: u64,
    pub key: String,
    pub class: Class,
    /// Stored bytes (`None` = delete).
    #[serde(with = "b64opt")]
    pub value: Option<Vec<u8>>,
    /// Hex SHA-256 of the stored bytes (empty for a delete).
    pub hash: String,
    /// Last entry of its write set.
    pub end: bool,
}

impl WalEntry {
    /// Approximate size for retention accounting.
    pub fn size(&self) -> u64 {
        (self.key.len() + self.value.as_ref().map_or(0, Vec::len) + 96) as u64
    }
}

/// Retained range and size: entries `first..=last` are stored (empty when `first > last`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    pub first: u64,
    pub last: u64,
    pub bytes: u64,
    /// Whether the WAL is being written (the node is a primary or a DR secondary).
    #[serde(default)]
    pub active: bool,
}

impl Default for Meta {
    fn default() -> Self {
        Meta {
            first: 1,
            last: 0,
            bytes: 0,
            active: false,
        }
    }
}

impl Meta {
    pub fn count(&self) -> u64 {
        (self.last + 1).saturating_sub(self.first)
    }
    /// Whether every entry after `after` is still retained.
    pub fn has_after(&self, after: u64) -> bool {
        after >= self.last || after + 1 >= self.first
    }
}

pub fn entry_key(index: u64) -> String {
    format!("{ENTRY}{index:020}")
}

pub fn load_meta(s: &dyn Storage) -> Result<Meta, StorageError> {
    Ok(s.get(META)?
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default())
}

pub fn read(s: &dyn Storage, index: u64) -> Result<Option<WalEntry>, StorageError> {
    Ok(s.get(&entry_key(index))?
        .and_then(|b| serde_json::from_slice(&b).ok()))
}

/// Stages `entries` (already indexed, ascending, all after `meta.last`) and the trimming
/// they cause; returns the new meta. `writes` receives the storage writes.
pub fn append(
    s: &dyn Storage,
    meta: Meta,
    entries: &[WalEntry],
    limits: Limits,
    writes: &mut Vec<Write>,
) -> Result<Meta, StorageError> {
    let mut m = meta;
    let mut fresh: BTreeMap<u64, u64> = BTreeMap::new();
    for e in entries {
        if m.first > m.last {
            m.first = e.index;
        }
        m.last = e.index;
        let b = serde_json::to_vec(e).unwrap_or_default();
        m.bytes += e.size();
        fresh.insert(e.index, e.size());
        writes.push((entry_key(e.index), Some(b)));
    }
    while m.first <= m.last && (m.count() > limits.max_entries || m.bytes > limits.max_bytes) {
        let size = match fresh.get(&m.first) {
            Some(sz) => *sz,
            None => read(s, m.first)?.map_or(0, |e| e.size()),
        };
        writes.push((entry_key(m.first), None));
        m.bytes = m.bytes.saturating_sub(size);
        m.first += 1;
    }
    if m.first > m.last {
        m.bytes = 0;
    }
    writes.push((META.to_string(), serde_json::to_vec(&m).ok()));
    Ok(m)
}

/// Empties the log and restarts it after `last` (the next entry gets `last + 1`).
pub fn reset(s: &dyn Storage, meta: Meta, last: u64, writes: &mut Vec<Write>) -> Meta {
    if let Ok(all) = s.scan(ENTRY) {
        for (k, _) in all {
            writes.push((k, None));
        }
    }
    let m = Meta {
        first: last + 1,
        last,
        bytes: 0,
        active: meta.active,
    };
    writes.push((META.to_string(), serde_json::to_vec(&m).ok()));
    m
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemStorage;

    fn e(i: u64) -> WalEntry {
        WalEntry {
            index: i,
            key: format!("k{i}"),
            class: Class::Replicated,
            value: Some(vec![0; 10]),
            hash: String::new(),
            end: true,
        }
    }

    #[test]
    fn retention_by_entries_and_bytes() {
        let mut s = MemStorage::new();
        let lim = Limits {
            max_entries: 3,
            max_bytes: 10_000,
        };
        let mut m = Meta::default();
        for i in 1..=5 {
            let mut w = Vec::new();
            m = append(&s, m, &[e(i)], lim, &mut w).unwrap();
            s.apply(&w).unwrap();
        }
        assert_eq!((m.first, m.last), (3, 5));
        assert!(read(&s, 2).unwrap().is_none());
        assert_eq!(read(&s, 4).unwrap().unwrap().key, "k4");
        assert!(m.has_after(2) && m.has_after(5) && !m.has_after(1));
        let lim = Limits {
            max_entries: 100,
            max_bytes: e(1).size() * 2,
        };
        let mut w = Vec::new();
        m = append(&s, m, &[e(6), e(7), e(8)], lim, &mut w).unwrap();
        s.apply(&w).unwrap();
        assert_eq!((m.first, m.last), (7, 8));
        assert_eq!(load_meta(&s).unwrap(), m);
        let mut w = Vec::new();
        let r = reset(&s, m, 20, &mut w);
        s.apply(&w).unwrap();
        assert_eq!((r.first, r.last, r.count()), (21, 20, 0));
        assert!(s.scan(ENTRY).unwrap().is_empty());
    }
}
