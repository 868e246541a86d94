//! Copy-on-write in-memory storage: a shared, immutable base map and the changes made over
//! it. Cloning one costs a reference count and a copy of the changes, not of the base, so a
//! harness can start each input from a copy of a prepared node (`isolation`'s fuzz target).
//! A journal of the writes since the freeze (each key with what it held before) tells which
//! keys a stretch of inputs changed without comparing whole maps.

use super::{Storage, StorageError, Write};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

/// Storage = `base` with `changes` laid over it (`None`: deleted).
#[derive(Debug, Clone, Default)]
pub struct CowStorage {
    base: Arc<BTreeMap<String, Vec<u8>>>,
    changes: BTreeMap<String, Option<Vec<u8>>>,
    /// Every key written since the freeze, in order, with what it held before that write.
    journal: Vec<(String, Option<Vec<u8>>)>,
}

impl CowStorage {
    /// Storage holding `base`, with no changes.
    pub fn new(base: BTreeMap<String, Vec<u8>>) -> Self {
        CowStorage {
            base: Arc::new(base),
            changes: BTreeMap::new(),
            journal: Vec::new(),
        }
    }

    /// Folds the changes into a new shared base (copies the base once when it is shared).
    pub fn freeze(&mut self) {
        self.journal = Vec::new();
        if self.changes.is_empty() {
            return;
        }
        let base = Arc::make_mut(&mut self.base);
        for (k, v) in std::mem::take(&mut self.changes) {
            match v {
                Some(v) => {
                    base.insert(k, v);
                }
                None => {
                    base.remove(&k);
                }
            }
        }
    }

    /// A point in the journal, for [`CowStorage::changed_since`].
    pub fn position(&self) -> usize {
        self.journal.len()
    }

    /// The keys whose value now differs from what they held at `position` (a key written
    /// and then written back is not among them), in key order.
    pub fn changed_since(&self, position: usize) -> Vec<&str> {
        let mut then: BTreeMap<&str, Option<&Vec<u8>>> = BTreeMap::new();
        for (k, old) in self.journal.get(position..).unwrap_or_default() {
            then.entry(k.as_str()).or_insert(old.as_ref());
        }
        then.into_iter()
            .filter(|(k, old)| self.value(k) != *old)
            .map(|(k, _)| k)
            .collect()
    }

    fn value(&self, key: &str) -> Option<&Vec<u8>> {
        match self.changes.get(key) {
            Some(v) => v.as_ref(),
            None => self.base.get(key),
        }
    }

    /// The whole map as it reads now.
    pub fn to_map(&self) -> BTreeMap<String, Vec<u8>> {
        let mut m = (*self.base).clone();
        for (k, v) in &self.changes {
            match v {
                Some(v) => {
                    m.insert(k.clone(), v.clone());
                }
                None => {
                    m.remove(k);
                }
            }
        }
        m
    }

    /// The entries in `range` of keys, in key order, the changes applied.
    fn merged(
        &self,
        lower: Bound<String>,
        mut keep: impl FnMut(&str) -> bool,
        limit: usize,
    ) -> Vec<(String, Vec<u8>)> {
        let range = (lower, Bound::<String>::Unbounded);
        let mut base = self.base.range(range.clone()).peekable();
        let mut over = self.changes.range(range).peekable();
        let mut out = Vec::new();
        while out.len() < limit {
            let next = match (base.peek(), over.peek()) {
                (None, None) => break,
                (Some((bk, _)), Some((ok, _))) if bk < ok => base.next().map(|(k, v)| (k, Some(v))),
                (Some((bk, _)), Some((ok, _))) if bk == ok => {
                    base.next();
                    over.next().map(|(k, v)| (k, v.as_ref()))
                }
                (Some(_), None) => base.next().map(|(k, v)| (k, Some(v))),
                _ => over.next().map(|(k, v)| (k, v.as_ref())),
            };
            let Some((k, v)) = next else { break };
            if !keep(k) {
                break;
            }
            if let Some(v) = v {
                out.push((k.clone(), v.clone()));
            }
        }
        out
    }
}

impl Storage for CowStorage {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.value(key).cloned())
    }
    fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        Ok(self.merged(
            Bound::Included(prefix.to_string()),
            |k| k.starts_with(prefix),
            usize::MAX,
        ))
    }
    fn scan_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        let lower = match after {
            Some(a) => Bound::Excluded(a.to_string()),
            None => Bound::Unbounded,
        };
        Ok(self.merged(lower, |_| true, limit))
    }
    fn count(&self) -> Result<u64, StorageError> {
        let mut n = self.base.len() as i64;
        for (k, v) in &self.changes {
            n += i64::from(v.is_some()) - i64::from(self.base.contains_key(k));
        }
        Ok(u64::try_from(n).unwrap_or(0))
    }
    fn apply(&mut self, writes: &[Write]) -> Result<(), StorageError> {
        for (k, v) in writes {
            let old = self.value(k).cloned();
            self.journal.push((k.clone(), old));
            self.changes.insert(k.clone(), v.clone());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemStorage;
    use quickcheck::quickcheck;

    fn key(n: u8) -> String {
        format!("k/{}", n % 24)
    }

    quickcheck! {
        /// Every read of a copy-on-write storage answers what a plain map given the same
        /// writes answers, before and after a freeze, and a clone taken before later writes
        /// does not see them.
        fn reads_as_a_plain_map(base: Vec<(u8, u8)>, sets: Vec<Vec<(u8, Option<u8>)>>, probe: u8) -> bool {
            let mut mem = MemStorage::new();
            for (k, v) in &base {
                mem.map.insert(key(*k), vec![*v]);
            }
            let mut cow = CowStorage::new(mem.map.clone());
            let frozen = cow.clone();
            let frozen_map = mem.map.clone();
            for (i, set) in sets.iter().enumerate() {
                let (at, map_then) = (cow.position(), mem.map.clone());
                let writes: Vec<Write> = set.iter().map(|(k, v)| (key(*k), v.map(|v| vec![v]))).collect();
                mem.apply(&writes).unwrap();
                cow.apply(&writes).unwrap();
                let changed: Vec<&str> = mem.map.keys().chain(map_then.keys())
                    .filter(|k| mem.map.get(*k) != map_then.get(*k))
                    .map(String::as_str)
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect();
                if cow.changed_since(at) != changed {
                    return false;
                }
                if i % 3 == 2 {
                    cow.freeze();
                }
                let after = Some(key(probe)).filter(|_| probe.is_multiple_of(2));
                let same = cow.to_map() == mem.map
                    && cow.count().unwrap() == mem.count().unwrap()
                    && cow.get(&key(probe)).unwrap() == mem.get(&key(probe)).unwrap()
                    && cow.scan("k/1").unwrap() == mem.scan("k/1").unwrap()
                    && cow.scan("").unwrap() == mem.scan("").unwrap()
                    && cow.scan_after(after.as_deref(), usize::from(probe % 7)).unwrap()
                        == mem.scan_after(after.as_deref(), usize::from(probe % 7)).unwrap();
                if !same {
                    return false;
                }
            }
            frozen.to_map() == frozen_map
        }
    }
}
