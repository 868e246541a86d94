//! Simulated durable storage with group commit and crash semantics.
//!
//! [`SimStorage`] implements [`cairn_core::Storage`] the way the real shell's SQLite
//! storage behaves: every write set the node applies lands in an *uncommitted* buffer that
//! the node itself reads through (so later inputs of the same batch see earlier ones), and
//! only [`SimStorage::commit`] makes the batch durable. The driver releases a batch's outputs
//! (HTTP responses) only after that commit. [`SimStorage::crash`] throws the uncommitted
//! buffer away, as a power loss would; the committed map is what a restarted node finds.
//!
//! For testing the checkers themselves, a storage can carry a [`StorageFault`]: a planted
//! bug (a lying disk) that the durability checker must catch.

use cairn_core::{Storage, StorageError, Write};
use std::collections::BTreeMap;

/// Storage prefix of secrets-engine data in the core (`logical/<mount uuid>/...`).
pub const KV_DATA_PREFIX: &str = "logical/";

/// A planted storage bug, used to prove the checkers catch real durability failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageFault {
    /// At the first crash after a commit that wrote KV data, one KV value of the most recent
    /// such commit, if nothing changed that key since, silently reverts to what it was before
    /// (a disk that acknowledged a write it had not made durable). Fires once.
    DropCommittedWrite,
    /// (HA tier) The shared store applies a commit whatever the lease's epoch: a deposed
    /// node's late batch lands after its successor's (the fencing bug HA must not have).
    SkipFenceCheck,
    /// A reader beside the node reads the open batch too, not only what is committed (the
    /// bug the shell's commit seqlock and durable wait exist to prevent): it answers with
    /// writes a crash may still take back.
    ReadBesideUncommitted,
}

/// What one commit made durable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitInfo {
    /// Write sets (one per input that changed storage) in the batch.
    pub write_sets: usize,
    /// Distinct keys the batch changed.
    pub keys: usize,
}

/// What a crash threw away.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CrashInfo {
    pub dropped_write_sets: usize,
    pub dropped_keys: usize,
    /// The key a planted [`StorageFault`] reverted at this crash, if any.
    pub fault_reverted: Option<String>,
}

/// Counters over the storage's life (all boots).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StorageStats {
    pub commits: u64,
    pub write_sets: u64,
    pub crashes: u64,
}

#[derive(Debug, Clone, Default)]
pub struct SimStorage {
    committed: BTreeMap<String, Vec<u8>>,
    /// Writes applied since the last commit; `None` deletes.
    uncommitted: BTreeMap<String, Option<Vec<u8>>>,
    uncommitted_sets: usize,
    fault: Option<StorageFault>,
    /// For [`StorageFault::DropCommittedWrite`]: the key of the latest committed KV write and
    /// its value before that commit.
    undo: Option<(String, Option<Vec<u8>>)>,
    stats: StorageStats,
}

impl SimStorage {
    pub fn new() -> Self {
        Self::default()
    }

    /// A storage carrying a planted bug.
    pub fn with_fault(fault: Option<StorageFault>) -> Self {
        SimStorage {
            fault,
            ..Self::default()
        }
    }

    /// The planted bug this storage carries, if any.
    pub fn fault(&self) -> Option<StorageFault> {
        self.fault
    }

    /// Whether writes are waiting for a commit.
    pub fn is_dirty(&self) -> bool {
        self.uncommitted_sets > 0
    }

    pub fn stats(&self) -> StorageStats {
        self.stats
    }

    /// Number of durable keys.
    pub fn committed_len(&self) -> usize {
        self.committed.len()
    }

    /// Makes every write applied since the last commit durable.
    pub fn commit(&mut self) -> CommitInfo {
        let info = CommitInfo {
            write_sets: self.uncommitted_sets,
            keys: self.uncommitted.len(),
        };
        if self.fault == Some(StorageFault::DropCommittedWrite) {
            // A later change to the remembered key makes reverting it pointless.
            if self
                .undo
                .as_ref()
                .is_some_and(|(k, _)| self.uncommitted.contains_key(k))
            {
                self.undo = None;
            }
            // Remember the last KV value this batch writes (the greatest key, to stay
            // deterministic) with its previous durable value.
            if let Some((k, _)) = self
                .uncommitted
                .iter()
                .rev()
                .find(|(k, v)| k.starts_with(KV_DATA_PREFIX) && v.is_some())
            {
                self.undo = Some((k.clone(), self.committed.get(k).cloned()));
            }
        }
        for (k, v) in std::mem::take(&mut self.uncommitted) {
            match v {
                Some(v) => {
                    self.committed.insert(k, v);
                }
                None => {
                    self.committed.remove(&k);
                }
            }
        }
        self.uncommitted_sets = 0;
        if info.write_sets > 0 {
            self.stats.commits += 1;
        }
        info
    }

    /// Durable keys under `prefix` that no uncommitted write touches (candidates for
    /// [`SimStorage::corrupt`]).
    pub fn committed_keys(&self, prefix: &str) -> Vec<String> {
        self.committed
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter(|(k, _)| !self.uncommitted.contains_key(*k))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Bit rot planted by the simulator: XORs byte `at` (modulo the length) of the durable
    /// value of `key` with `xor` (non-zero), behind the node's back. Refused (`None`) when
    /// the key is absent or empty, or an uncommitted write would hide the change. Returns
    /// the corrupted bytes.
    pub fn corrupt(&mut self, key: &str, at: usize, xor: u8) -> Option<Vec<u8>> {
        if xor == 0 || self.uncommitted.contains_key(key) {
            return None;
        }
        let v = self.committed.get_mut(key)?;
        if v.is_empty() {
            return None;
        }
        let i = at % v.len();
        v[i] ^= xor;
        Some(v.clone())
    }

    /// A power loss: uncommitted writes vanish.
    pub fn crash(&mut self) -> CrashInfo {
        let mut info = CrashInfo {
            dropped_write_sets: self.uncommitted_sets,
            dropped_keys: self.uncommitted.len(),
            fault_reverted: None,
        };
        self.uncommitted.clear();
        self.uncommitted_sets = 0;
        self.stats.crashes += 1;
        if let Some((k, old)) = self.undo.take() {
            match old {
                Some(v) => {
                    self.committed.insert(k.clone(), v);
                }
                None => {
                    self.committed.remove(&k);
                }
            }
            info.fault_reverted = Some(k);
            self.fault = None;
        }
        info
    }
}

/// The committed (durable) state of a [`SimStorage`] alone, without the open batch: what a
/// reader beside the node reads ([`cairn_core::reads`]), as the shell's readers read the
/// committed database.
pub struct Committed<'a>(&'a SimStorage);

impl SimStorage {
    pub fn committed_view(&self) -> Committed<'_> {
        Committed(self)
    }
}

impl Storage for Committed<'_> {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.0.committed.get(key).cloned())
    }

    fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        Ok(self
            .0
            .committed
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn apply(&mut self, _writes: &[Write]) -> Result<(), StorageError> {
        Err(StorageError::Io(
            "a reader beside the node does not write".into(),
        ))
    }
}

impl Storage for SimStorage {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        match self.uncommitted.get(key) {
            Some(v) => Ok(v.clone()),
            None => Ok(self.committed.get(key).cloned()),
        }
    }

    fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        let mut merged: BTreeMap<String, Vec<u8>> = self
            .committed
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (k, v) in self
            .uncommitted
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
        {
            match v {
                Some(v) => {
                    merged.insert(k.clone(), v.clone());
                }
                None => {
                    merged.remove(k);
                }
            }
        }
        Ok(merged.into_iter().collect())
    }

    fn apply(&mut self, writes: &[Write]) -> Result<(), StorageError> {
        if writes.is_empty() {
            return Ok(());
        }
        for (k, v) in writes {
            self.uncommitted.insert(k.clone(), v.clone());
        }
        self.uncommitted_sets += 1;
        self.stats.write_sets += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(k: &str, v: &str) -> Write {
        (k.to_string(), Some(v.as_bytes().to_vec()))
    }

    #[test]
    fn uncommitted_is_visible_until_a_crash() {
        let mut s = SimStorage::new();
        s.apply(&[put("a", "1"), put("b", "1")]).unwrap();
        s.commit();
        s.apply(&[put("a", "2"), ("b".into(), None), put("c", "2")])
            .unwrap();
        assert_eq!(s.get("a").unwrap(), Some(b"2".to_vec()));
        assert_eq!(s.get("b").unwrap(), None);
        let keys: Vec<String> = s.scan("").unwrap().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, vec!["a", "c"]);
        let info = s.crash();
        assert_eq!(info.dropped_write_sets, 1);
        assert_eq!(s.get("a").unwrap(), Some(b"1".to_vec()));
        assert_eq!(s.get("b").unwrap(), Some(b"1".to_vec()));
        assert_eq!(s.get("c").unwrap(), None);
    }

    #[test]
    fn corrupt_flips_a_durable_byte_only() {
        let mut s = SimStorage::new();
        s.apply(&[put("a", "xy"), put("b", "1")]).unwrap();
        s.commit();
        s.apply(&[put("b", "2")]).unwrap();
        assert_eq!(s.committed_keys(""), vec!["a".to_string()]);
        assert_eq!(s.corrupt("a", 3, 0x01), Some(b"xx".to_vec()));
        assert_eq!(s.get("a").unwrap(), Some(b"xx".to_vec()));
        assert_eq!(s.corrupt("b", 0, 0x01), None);
        assert_eq!(s.corrupt("c", 0, 0x01), None);
        s.crash();
        assert_eq!(s.get("a").unwrap(), Some(b"xx".to_vec()));
    }

    #[test]
    fn planted_fault_reverts_one_kv_write_once() {
        let mut s = SimStorage::with_fault(Some(StorageFault::DropCommittedWrite));
        s.apply(&[put("logical/m/k", "old")]).unwrap();
        s.commit();
        s.apply(&[put("logical/m/k", "new"), put("sys/x", "1")])
            .unwrap();
        s.commit();
        assert_eq!(s.get("logical/m/k").unwrap(), Some(b"new".to_vec()));
        let info = s.crash();
        assert_eq!(info.fault_reverted.as_deref(), Some("logical/m/k"));
        assert_eq!(s.get("logical/m/k").unwrap(), Some(b"old".to_vec()));
        assert_eq!(s.get("sys/x").unwrap(), Some(b"1".to_vec()));
        s.apply(&[put("logical/m/k", "newer")]).unwrap();
        s.commit();
        assert_eq!(s.crash().fault_reverted, None);
        assert_eq!(s.get("logical/m/k").unwrap(), Some(b"newer".to_vec()));
    }
}
