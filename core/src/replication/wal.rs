//! The write-ahead log a primary keeps for its secondaries (the reference's "log shipper").
//!
//! Every committed change on a node that is a primary (either mode) becomes one
//! [`WalEntry`] with the next index; the last entry of a write set is marked `end`, so a
//! secondary applies whole write sets only. A DR secondary stores its primary's entries under
//! the primary's indices, so that after promotion it continues the same sequence.
//!
//! Retention is bounded by entry count and bytes ([`Limits`]); the oldest entries are
//! dropped first. A dropped entry leaves its key behind (a key-only entry: class and key, no
//! value), up to `max_key_entries` of them, the oldest dropped first: they cover indices
//! `first - kept ..= first - 1` without a gap. A secondary that needs entries older than the
//! first retained one but still covered by key-only entries catches up by fetching the
//! current values of those keys (`primary::changes`): what changed, not the whole copy.
//! One that needs older ones still has to go through Merkle diff and sync.
//!
//! Layout (node-local): `node/wal/meta` (JSON [`Meta`]), `node/wal/e/<index, 20 digits>`
//! (JSON entry) and `node/wal/k/<index, 20 digits>` (key-only entry: a class byte, then
//! the key).

use super::class::Class;
use crate::storage::{Storage, StorageError, Write};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

pub const META: &str = "node/wal/meta";
pub const ENTRY: &str = "node/wal/e/";
pub const KEYS: &str = "node/wal/k/";

/// Retention bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_entries: u64,
    pub max_bytes: u64,
    /// Most key-only entries kept behind the full ones (0: none; a secondary behind the
    /// full entries then always goes through Merkle diff and sync).
    pub max_key_entries: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entries: 100_000,
            max_bytes: 256 << 20,
            max_key_entries: 1_000_000,
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
    /// Key-only entries kept right before `first` (indices `first - kept ..= first - 1`).
    #[serde(default)]
    pub kept: u64,
}

impl Default for Meta {
    fn default() -> Self {
        Meta {
            first: 1,
            last: 0,
            bytes: 0,
            active: false,
            kept: 0,
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
    /// Whether the entries after `after` are retained, the older of them as key-only
    /// entries at least (and `after` is not past the end).
    pub fn keys_after(&self, after: u64) -> bool {
        after <= self.last && after + 1 >= self.first.saturating_sub(self.kept)
    }
}

/// The newest entries of the log, kept in memory as they are appended, so that the pulls
/// of secondaries that keep up read nothing back from storage (each pull used to read and
/// parse every entry it sends, once per secondary). It holds a contiguous run of indices
/// ending at the last entry appended, at most [`Tail::MAX_ENTRIES`] entries and
/// [`Tail::MAX_BYTES`] bytes, and never an entry the stored log no longer has. A log
/// position that does not come from an append (a reset, a reload, a wipe, the log switched
/// on or off: `Replication::set_wal`) or a rolled-back batch clears it; the checkers
/// compare it with storage ([`Tail::drift`]).
#[derive(Debug, Clone, Default)]
pub struct Tail {
    entries: VecDeque<WalEntry>,
    bytes: u64,
}

impl Tail {
    pub const MAX_ENTRIES: usize = 8_192;
    pub const MAX_BYTES: u64 = 16 << 20;

    /// The entry at `index`, if it is kept here.
    pub fn get(&self, index: u64) -> Option<&WalEntry> {
        let first = self.entries.front()?.index;
        let at = usize::try_from(index.checked_sub(first)?).ok()?;
        self.entries.get(at)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Adds entries just appended to the log whose retained range is now `meta` (entries
    /// before `meta.first` were trimmed from it). Entries that do not continue the kept run
    /// start a new one.
    pub fn extend(&mut self, appended: Vec<WalEntry>, meta: &Meta) {
        for e in appended {
            if self.entries.back().is_some_and(|b| b.index + 1 != e.index) {
                self.clear();
            }
            self.bytes += e.size();
            self.entries.push_back(e);
        }
        while let Some(front) = self.entries.front() {
            let over = self.entries.len() > Self::MAX_ENTRIES || self.bytes > Self::MAX_BYTES;
            if !over && front.index >= meta.first && front.index <= meta.last {
                break;
            }
            self.bytes = self.bytes.saturating_sub(front.size());
            self.entries.pop_front();
        }
    }

    /// The first kept entry that differs from the stored log (for checkers), among the
    /// oldest and the newest `ends` of them (all of them when `ends` covers the run).
    pub fn drift(&self, s: &dyn Storage, ends: usize) -> Option<String> {
        let n = self.entries.len();
        let picked = self
            .entries
            .iter()
            .enumerate()
            .filter(|(i, _)| *i < ends || *i + ends >= n)
            .map(|(_, e)| e);
        for e in picked {
            match read(s, e.index) {
                Ok(Some(stored)) if &stored == e => {}
                Ok(stored) => {
                    return Some(format!(
                        "the WAL entry {} kept in memory is {e:?}, the stored one {stored:?}",
                        e.index
                    ))
                }
                Err(err) => {
                    return Some(format!(
                        "the WAL entry {} could not be read: {err}",
                        e.index
                    ))
                }
            }
        }
        None
    }
}

pub fn entry_key(index: u64) -> String {
    format!("{ENTRY}{index:020}")
}

pub fn key_entry_key(index: u64) -> String {
    format!("{KEYS}{index:020}")
}

/// A key-only entry: the key of a dropped entry and its class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEntry {
    pub index: u64,
    pub class: Class,
    pub key: String,
}

fn encode_key_entry(e: &WalEntry) -> Vec<u8> {
    let mut b = Vec::with_capacity(e.key.len() + 1);
    b.push(e.class.tag());
    b.extend_from_slice(e.key.as_bytes());
    b
}

fn decode_key_entry(index: u64, b: &[u8]) -> Option<KeyEntry> {
    let (c, key) = b.split_first()?;
    Some(KeyEntry {
        index,
        class: Class::from_tag(*c)?,
        key: String::from_utf8(key.to_vec()).ok()?,
    })
}

/// Up to `n` key-only entries after `after`, in index order; stops at the first index not
/// kept as a key-only entry (from `first` on, the full entries are there to read).
pub fn read_keys(
    s: &dyn Storage,
    meta: &Meta,
    after: u64,
    n: usize,
) -> Result<Vec<KeyEntry>, StorageError> {
    let start = (after + 1).max(meta.first.saturating_sub(meta.kept));
    let end = meta.first; // exclusive
    let n = n.min(end.saturating_sub(start) as usize);
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return Ok(out);
    }
    let from = key_entry_key(start - 1);
    let mut next = start;
    let mut broken = false;
    s.visit_after(Some(&from), n, &mut |k, v| {
        if broken {
            return;
        }
        let parsed = k
            .strip_prefix(KEYS)
            .and_then(|i| i.parse::<u64>().ok())
            .filter(|i| *i == next)
            .and_then(|i| decode_key_entry(i, v));
        match parsed {
            Some(e) => {
                out.push(e);
                next += 1;
            }
            None => broken = true,
        }
    })?;
    Ok(out)
}

/// Deletes every key-only entry (they must cover a range without a gap up to `first`).
fn drop_keys(m: &mut Meta, writes: &mut Vec<Write>) {
    for i in m.first.saturating_sub(m.kept)..m.first {
        writes.push((key_entry_key(i), None));
    }
    m.kept = 0;
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
    let mut fresh: BTreeMap<u64, &WalEntry> = BTreeMap::new();
    for e in entries {
        if m.first > m.last {
            if e.index != m.first {
                // A gap: the key-only entries no longer reach the first full one.
                drop_keys(&mut m, writes);
            }
            m.first = e.index;
        }
        m.last = e.index;
        let b = serde_json::to_vec(e).unwrap_or_default();
        m.bytes += e.size();
        fresh.insert(e.index, e);
        writes.push((entry_key(e.index), Some(b)));
    }
    while m.first <= m.last && (m.count() > limits.max_entries || m.bytes > limits.max_bytes) {
        let stored;
        let dropped = match fresh.get(&m.first) {
            Some(e) => Some(*e),
            None => {
                stored = read(s, m.first)?;
                stored.as_ref()
            }
        };
        writes.push((entry_key(m.first), None));
        m.bytes = m.bytes.saturating_sub(dropped.map_or(0, WalEntry::size));
        match dropped {
            Some(e) if limits.max_key_entries > 0 => {
                writes.push((key_entry_key(m.first), Some(encode_key_entry(e))));
                m.kept += 1;
            }
            // Missing (or none are kept): the key-only entries cannot go on without a gap.
            _ => drop_keys(&mut m, writes),
        }
        m.first += 1;
    }
    while m.kept > limits.max_key_entries {
        writes.push((key_entry_key(m.first - m.kept), None));
        m.kept -= 1;
    }
    if m.first > m.last {
        m.bytes = 0;
    }
    writes.push((META.to_string(), serde_json::to_vec(&m).ok()));
    Ok(m)
}

/// Empties the log (key-only entries too) and restarts it after `last` (the next entry
/// gets `last + 1`).
pub fn reset(s: &dyn Storage, meta: Meta, last: u64, writes: &mut Vec<Write>) -> Meta {
    if let Ok(all) = s.scan(ENTRY) {
        for (k, _) in all {
            writes.push((k, None));
        }
    }
    let mut old = meta;
    drop_keys(&mut old, writes);
    let m = Meta {
        first: last + 1,
        last,
        bytes: 0,
        active: meta.active,
        kept: 0,
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

    quickcheck::quickcheck! {
        /// Whatever is appended (batches of any size, gaps that restart the log, trimming
        /// by count and by bytes), the tail holds a contiguous run ending at the log's last
        /// entry, every entry of it as stored, none the log no longer has.
        fn the_tail_is_the_newest_stored_entries(steps: Vec<(u8, u8, bool)>) -> bool {
            let mut s = MemStorage::new();
            let lim = Limits {
                max_entries: 6,
                max_bytes: e(1).size() * 5,
                max_key_entries: 2,
            };
            let mut m = Meta::default();
            let mut tail = Tail::default();
            let mut next = 1u64;
            for (n, skip, gap) in steps.into_iter().take(40) {
                if gap {
                    next += 1 + u64::from(skip % 3);
                    let mut w = Vec::new();
                    m = reset(&s, m, next - 1, &mut w);
                    s.apply(&w).unwrap();
                    tail.clear();
                }
                let batch: Vec<WalEntry> = (0..u64::from(n % 4)).map(|k| e(next + k)).collect();
                next += batch.len() as u64;
                if batch.is_empty() {
                    continue;
                }
                let mut w = Vec::new();
                m = append(&s, m, &batch, lim, &mut w).unwrap();
                s.apply(&w).unwrap();
                tail.extend(batch, &m);
                if tail.drift(&s, usize::MAX).is_some() {
                    return false;
                }
                let first = tail.entries.front().map(|e| e.index);
                let last = tail.entries.back().map(|e| e.index);
                if last != Some(m.last) || first.is_some_and(|f| f < m.first) {
                    return false;
                }
                if (m.first..=m.last).any(|i| tail.get(i).is_some_and(|t| t.index != i)) {
                    return false;
                }
            }
            true
        }
    }

    #[test]
    fn the_tail_keeps_its_bounds() {
        let mut tail = Tail::default();
        let m = Meta {
            first: 1,
            last: Tail::MAX_ENTRIES as u64 + 10,
            ..Meta::default()
        };
        tail.extend((1..=m.last).map(e).collect(), &m);
        assert_eq!(tail.len(), Tail::MAX_ENTRIES);
        assert!(tail.get(10).is_none() && tail.get(11).is_some() && tail.get(m.last + 1).is_none());
        let big = WalEntry {
            value: Some(vec![0; (Tail::MAX_BYTES / 2) as usize]),
            ..e(m.last + 1)
        };
        let m2 = Meta {
            last: m.last + 3,
            ..m
        };
        tail.extend(
            vec![
                big.clone(),
                WalEntry {
                    index: m.last + 2,
                    ..big.clone()
                },
                e(m.last + 3),
            ],
            &m2,
        );
        assert!(tail.bytes <= Tail::MAX_BYTES && tail.get(m.last + 3).is_some());
        assert!(tail.get(m.last + 1).is_none());
        // A run that does not continue the kept one replaces it.
        tail.extend(
            vec![e(m.last + 10)],
            &Meta {
                last: m.last + 10,
                ..m
            },
        );
        assert_eq!(tail.len(), 1);
    }

    #[test]
    fn retention_by_entries_and_bytes() {
        let mut s = MemStorage::new();
        let lim = Limits {
            max_entries: 3,
            max_bytes: 10_000,
            max_key_entries: 0,
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
            max_key_entries: 0,
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

    #[test]
    fn dropped_entries_leave_their_keys_behind() {
        let mut s = MemStorage::new();
        let lim = Limits {
            max_entries: 3,
            max_bytes: 1 << 20,
            max_key_entries: 4,
        };
        let mut m = Meta::default();
        for i in 1..=9 {
            let mut w = Vec::new();
            m = append(&s, m, &[e(i)], lim, &mut w).unwrap();
            s.apply(&w).unwrap();
        }
        // Full entries 7..=9, key-only entries 3..=6.
        assert_eq!((m.first, m.last, m.kept), (7, 9, 4));
        assert!(!m.has_after(5) && m.keys_after(2) && m.keys_after(5) && !m.keys_after(1));
        assert!(!m.keys_after(10));
        let ks = read_keys(&s, &m, 2, 100).unwrap();
        let idx: Vec<u64> = ks.iter().map(|k| k.index).collect();
        assert_eq!(idx, vec![3, 4, 5, 6]);
        assert_eq!(ks[1].key, "k4");
        assert_eq!(ks[1].class, Class::Replicated);
        assert_eq!(read_keys(&s, &m, 4, 1).unwrap()[0].index, 5);
        assert!(read_keys(&s, &m, 6, 10).unwrap().is_empty());
        assert_eq!(s.scan(KEYS).unwrap().len(), 4);
        // A smaller limit trims the oldest key-only entries.
        let lim2 = Limits {
            max_key_entries: 2,
            ..lim
        };
        let mut w = Vec::new();
        m = append(&s, m, &[e(10)], lim2, &mut w).unwrap();
        s.apply(&w).unwrap();
        assert_eq!((m.first, m.kept), (8, 2));
        assert_eq!(s.scan(KEYS).unwrap().len(), 2);
        assert_eq!(read_keys(&s, &m, 0, 10).unwrap()[0].index, 6);
        // A reset drops them all.
        let mut w = Vec::new();
        let r = reset(&s, m, 20, &mut w);
        s.apply(&w).unwrap();
        assert_eq!(r.kept, 0);
        assert!(s.scan(KEYS).unwrap().is_empty());
    }

    #[test]
    fn a_gap_drops_the_key_only_entries() {
        let mut s = MemStorage::new();
        let lim = Limits {
            max_entries: 1,
            max_bytes: 1 << 20,
            max_key_entries: 10,
        };
        let mut m = Meta::default();
        for i in 1..=4 {
            let mut w = Vec::new();
            m = append(&s, m, &[e(i)], lim, &mut w).unwrap();
            s.apply(&w).unwrap();
        }
        assert_eq!((m.first, m.kept), (4, 3));
        // The full entry 4 goes missing behind the log's back: its key cannot be kept.
        s.apply(&[(entry_key(4), None)]).unwrap();
        let mut w = Vec::new();
        m = append(&s, m, &[e(5)], lim, &mut w).unwrap();
        s.apply(&w).unwrap();
        assert_eq!((m.first, m.kept), (5, 0));
        assert!(s.scan(KEYS).unwrap().is_empty());
        assert!(!m.keys_after(3) && m.keys_after(4));
    }
}
