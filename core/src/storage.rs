//! Storage: the one synchronous dependency of the core.
//!
//! A [`Storage`] is an ordered key/value map of opaque bytes. The core never writes to it
//! directly while handling an input: every handler works through a [`Txn`], a write set laid
//! over the storage, and the node applies the whole write set at the end of a successful
//! input with [`Storage::apply`]. A failed input drops its write set, so no input is ever
//! half-applied. The shell groups several inputs into one durable transaction (SQLite); the
//! in-memory [`MemStorage`] serves unit tests and the simulator.

pub mod cow;

use std::collections::{BTreeMap, BTreeSet};

/// One change in a write set: `None` deletes the key.
pub type Write = (String, Option<Vec<u8>>);

/// Error from a storage backend. The kind decides the API's answer (see
/// `impl From<StorageError> for ApiError`): a full disk is 507, a fenced commit 503, anything
/// else 500.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageError {
    /// The file system of the storage has no space left: writes are refused until space is
    /// freed; reads keep working.
    Full,
    /// The database is damaged or is not a database.
    Corrupt(String),
    /// Any other failure of the backend (an I/O error, a lock, a failed sync).
    Io(String),
    /// A fenced commit (shared storage, one active node at a time): this node held the
    /// leader lease at epoch `held` (`None`: it is a standby, which writes nothing), the lease
    /// is at epoch `current`, so the batch was rolled back whole and nothing of it was written.
    Fenced { held: Option<u64>, current: u64 },
    /// An initialisation refused by shared storage: another node of the cluster initialised
    /// it first (the two raced); nothing of this one was written.
    AlreadyInitialized,
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StorageError::Full => write!(
                f,
                "disk full: the file system of the database has no space left; writes are \
                 refused until space is freed"
            ),
            StorageError::Corrupt(m) => write!(
                f,
                "storage error: the database file is damaged ({m}); stop the server and \
                 restore the file from a backup"
            ),
            StorageError::Io(m) => write!(f, "storage error: {m}"),
            StorageError::Fenced {
                held: Some(held),
                current,
            } => write!(
                f,
                "this node lost leadership (it held the lease at epoch {held}, the lease is \
                 now at epoch {current}): the write was not applied; retry on the active node"
            ),
            StorageError::Fenced { held: None, .. } => write!(
                f,
                "this node is a standby: it does not write to the cluster's storage, and the \
                 write was not applied; retry on the active node"
            ),
            StorageError::AlreadyInitialized => write!(
                f,
                "Vault is already initialized (another node of this cluster initialised it \
                 first; use its key shares and root token)"
            ),
        }
    }
}

impl std::error::Error for StorageError {}

/// Ordered key/value storage.
pub trait Storage {
    /// Reads one key.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError>;
    /// Reads several keys, answers in the order asked. Engines whose reads are round trips
    /// override it to read them at once.
    fn get_many(&self, keys: &[&str]) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        keys.iter().map(|k| self.get(k)).collect()
    }
    /// Every key that starts with `prefix`, in key order, with its value.
    fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StorageError>;
    /// Applies a write set atomically (in the shell: inside the open batch transaction).
    fn apply(&mut self, writes: &[Write]) -> Result<(), StorageError>;
    /// Up to `limit` keys strictly after `after` (`None`: from the first key), in key order,
    /// with their values: the cursor of background scans (reindex, Merkle check).
    fn scan_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        Ok(self
            .scan("")?
            .into_iter()
            .filter(|(k, _)| after.is_none_or(|a| k.as_str() > a))
            .take(limit)
            .collect())
    }
    /// [`Storage::scan_after`] handing each row to `visit` as it is read instead of
    /// collecting copies (a bulk scan's rows are hashed once and dropped); returns how many
    /// rows it visited. Engines that can lend rows override it.
    fn visit_after(
        &self,
        after: Option<&str>,
        limit: usize,
        visit: &mut dyn FnMut(&str, &[u8]),
    ) -> Result<usize, StorageError> {
        let rows = self.scan_after(after, limit)?;
        for (k, v) in &rows {
            visit(k, v);
        }
        Ok(rows.len())
    }
    /// How many keys are stored.
    fn count(&self) -> Result<u64, StorageError> {
        Ok(self.scan("")?.len() as u64)
    }
}

/// In-memory storage for tests and the simulator.
#[derive(Debug, Clone, Default)]
pub struct MemStorage {
    pub map: BTreeMap<String, Vec<u8>>,
}

impl MemStorage {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Storage for MemStorage {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.map.get(key).cloned())
    }
    fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        Ok(self
            .map
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
    fn scan_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        use std::ops::Bound;
        let lower = match after {
            Some(a) => Bound::Excluded(a.to_string()),
            None => Bound::Unbounded,
        };
        Ok(self
            .map
            .range((lower, Bound::Unbounded))
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
    fn count(&self) -> Result<u64, StorageError> {
        Ok(self.map.len() as u64)
    }
    fn apply(&mut self, writes: &[Write]) -> Result<(), StorageError> {
        for (k, v) in writes {
            match v {
                Some(v) => {
                    self.map.insert(k.clone(), v.clone());
                }
                None => {
                    self.map.remove(k);
                }
            }
        }
        Ok(())
    }
}

/// A write set over a storage: reads see the set's own writes first.
pub struct Txn<'a> {
    base: &'a dyn Storage,
    writes: BTreeMap<String, Option<Vec<u8>>>,
    /// Keys written with [`Txn::put_new`].
    fresh: BTreeSet<String>,
}

/// A handler's write set as the node commits it.
#[derive(Debug, Default)]
pub struct WriteSet {
    /// In key order.
    pub writes: Vec<Write>,
    /// Keys the handler created under names it drew at random (so no earlier value may
    /// exist): the commit refuses the whole set if one exists after all.
    pub fresh: BTreeSet<String>,
}

impl WriteSet {
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }
}

impl<'a> Txn<'a> {
    pub fn new(base: &'a dyn Storage) -> Self {
        Txn {
            base,
            writes: BTreeMap::new(),
            fresh: BTreeSet::new(),
        }
    }
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        match self.writes.get(key) {
            Some(v) => Ok(v.clone()),
            None => self.base.get(key),
        }
    }
    /// Writes a key whose name the caller drew at random (a token's hash, an accessor): no
    /// value can exist under it yet, and the commit refuses the set if one does (a collision
    /// or a bug, never overwritten silently). Any other write or delete of the key in this
    /// set makes it an ordinary write again.
    pub fn put_new(&mut self, key: &str, value: Vec<u8>) {
        self.writes.insert(key.to_string(), Some(value));
        self.fresh.insert(key.to_string());
    }
    pub fn put(&mut self, key: &str, value: Vec<u8>) {
        self.fresh.remove(key);
        self.writes.insert(key.to_string(), Some(value));
    }
    pub fn delete(&mut self, key: &str) {
        self.fresh.remove(key);
        self.writes.insert(key.to_string(), None);
    }
    /// Keys and values under `prefix` in key order, merged with this set's writes.
    pub fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        let mut merged: BTreeMap<String, Vec<u8>> = self.base.scan(prefix)?.into_iter().collect();
        for (k, v) in self
            .writes
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
    /// The first keys under `prefix` in key order, at most `limit` of them read from the
    /// storage (merged with this set's writes up to the last key read), without reading the
    /// rest of the prefix: the cursor of periodic sweeps over large prefixes.
    pub fn first_keys(&self, prefix: &str, limit: usize) -> Result<Vec<String>, StorageError> {
        let mut merged: BTreeSet<String> = self
            .base
            .scan_after(Some(prefix), limit)?
            .into_iter()
            .map(|(k, _)| k)
            .take_while(|k| k.starts_with(prefix))
            .collect();
        // Fewer than `limit` under the prefix: the storage has no more of them.
        let complete = merged.len() < limit;
        let last = merged.last().cloned();
        for (k, v) in self
            .writes
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
        {
            if !complete && last.as_ref().is_some_and(|l| k > l) {
                break;
            }
            match v {
                Some(_) => merged.insert(k.clone()),
                None => merged.remove(k),
            };
        }
        Ok(merged.into_iter().collect())
    }
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }
    /// The write set in key order.
    pub fn into_writes(self) -> Vec<Write> {
        self.writes.into_iter().collect()
    }
    /// The write set with its fresh keys.
    pub fn into_write_set(self) -> WriteSet {
        WriteSet {
            writes: self.writes.into_iter().collect(),
            fresh: self.fresh,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck::quickcheck;

    #[test]
    fn a_later_write_of_a_fresh_key_makes_it_ordinary() {
        let s = MemStorage::new();
        let mut t = Txn::new(&s);
        t.put_new("a", vec![1]);
        t.put_new("b", vec![2]);
        t.put_new("c", vec![3]);
        t.put("b", vec![4]);
        t.delete("c");
        let ws = t.into_write_set();
        assert_eq!(
            ws.fresh.into_iter().collect::<Vec<_>>(),
            vec!["a".to_string()]
        );
        assert_eq!(ws.writes.len(), 3);
    }

    /// Memory storage whose writes fail with [`StorageError::Full`] while `full` is set.
    struct FullDisk {
        inner: MemStorage,
        full: bool,
    }

    impl Storage for FullDisk {
        fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError> {
            self.inner.get(key)
        }
        fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
            self.inner.scan(prefix)
        }
        fn apply(&mut self, writes: &[Write]) -> Result<(), StorageError> {
            if self.full {
                return Err(StorageError::Full);
            }
            self.inner.apply(writes)
        }
    }

    #[test]
    fn the_kind_of_a_storage_error_chooses_the_status() {
        use crate::api::ApiError;
        assert_eq!(ApiError::from(StorageError::Full), ApiError::StorageFull);
        assert_eq!(ApiError::from(StorageError::Full).status(), 507);
        assert_eq!(ApiError::from(StorageError::Io("x".into())).status(), 500);
        assert_eq!(
            ApiError::from(StorageError::Corrupt("x".into())).status(),
            500
        );
        let fenced = ApiError::from(StorageError::Fenced {
            held: Some(3),
            current: 4,
        });
        assert_eq!(fenced.status(), 503);
        let msg = fenced.to_string();
        assert!(msg.contains("lost leadership"), "{msg}");
        assert!(msg.contains("not applied"), "{msg}");
    }

    #[test]
    fn a_full_disk_answers_507_applies_nothing_and_still_serves_reads() {
        use crate::api::{Method, Request, Response};
        use crate::node::{Admin, Input, Node, NodeConfig, Output};
        use serde_json::json;
        let mut n = Node::new(
            FullDisk {
                inner: MemStorage::new(),
                full: false,
            },
            [3; 32],
            NodeConfig::default(),
        );
        n.handle(
            1_000,
            Input::Admin {
                id: 1,
                cmd: Admin::DevSetup {
                    root_token_id: Some("root".into()),
                },
            },
        );
        while n.poll_output().is_some() {}
        let call = |n: &mut Node<FullDisk>, id, method, path: &str| -> Response {
            let req = Request::new(id, method, path)
                .with_token("root")
                .with_json(json!({"v": id}));
            n.handle(2_000, Input::Request(req));
            std::iter::from_fn(|| n.poll_output())
                .find_map(|o| match o {
                    Output::Response(r) if r.id == id => Some(r),
                    _ => None,
                })
                .expect("a response")
        };
        assert_eq!(call(&mut n, 1, Method::Put, "secret/a").status, 204);
        n.storage_mut().full = true;
        let before = n.storage().inner.map.clone();
        let r = call(&mut n, 2, Method::Put, "secret/b");
        assert_eq!(r.status, 507, "{r:?}");
        let msg = r.body.as_ref().expect("a body")["errors"][0]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(msg.starts_with("disk full: "), "{msg}");
        assert!(
            msg.ends_with("(nothing of this request was applied)"),
            "{msg}"
        );
        assert_eq!(
            n.storage().inner.map,
            before,
            "a refused write changed storage"
        );
        let r = call(&mut n, 3, Method::Get, "secret/a");
        assert_eq!(r.status, 200, "{r:?}");
    }

    quickcheck! {
        /// `first_keys` is a prefix of the full merged key list, and all of it when the
        /// storage holds fewer keys under the prefix than the limit.
        fn txn_first_keys_is_a_prefix(base: Vec<(u8, u8)>, ops: Vec<(u8, Option<u8>)>, limit: u8) -> bool {
            let limit = usize::from(limit % 8) + 1;
            let mut s = MemStorage::new();
            let mut init: Vec<Write> = base.iter().map(|(k, v)| (format!("p/{k:03}"), Some(vec![*v]))).collect();
            init.push(("a".into(), Some(vec![1])));
            init.push(("q".into(), Some(vec![1])));
            s.apply(&init).unwrap();
            let mut t = Txn::new(&s);
            for (k, v) in &ops {
                match v {
                    Some(v) => t.put(&format!("p/{k:03}"), vec![*v]),
                    None => t.delete(&format!("p/{k:03}")),
                }
            }
            let all: Vec<String> = t.scan("p/").unwrap().into_iter().map(|(k, _)| k).collect();
            let first = t.first_keys("p/", limit).unwrap();
            let stored = s.scan("p/").unwrap().len();
            all.starts_with(&first) && (stored >= limit || first == all)
        }

        /// A scan through a write set equals a scan of the storage after applying it.
        fn txn_scan_matches_applied(base: Vec<(u8, u8)>, ops: Vec<(u8, Option<u8>)>) -> bool {
            let mut s = MemStorage::new();
            let init: Vec<Write> = base.iter().map(|(k, v)| (format!("p/{k}"), Some(vec![*v]))).collect();
            s.apply(&init).unwrap();
            let mut t = Txn::new(&s);
            for (k, v) in &ops {
                match v { Some(v) => t.put(&format!("p/{k}"), vec![*v]), None => t.delete(&format!("p/{k}")) }
            }
            let through = t.scan("p/").unwrap();
            let writes = t.into_writes();
            let mut s2 = s.clone();
            s2.apply(&writes).unwrap();
            through == s2.scan("p/").unwrap()
        }
    }
}
