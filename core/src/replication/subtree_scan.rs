//! Range-bounded reads of one Merkle subtree: the keys of a subtree of one tree (optionally
//! only those in some buckets) strictly after a cursor, in key order, read from storage a
//! page at a time. A Merkle sync round reads what it covers, not the whole subtree, so
//! synchronising a subtree of `n` keys reads each of them a bounded number of times instead
//! of once per round (a first sync of 1M keys was quadratic).
//!
//! The system subtree has no storage prefix (it is "everything but mount data and node-local
//! keys"): its scan skips a whole mount's data or the node-local keys with one storage read
//! when a page shows that they go on past it.

use super::class::{self, Class};
use super::merkle::{self, TreeKind};
use crate::storage::{Storage, StorageError};
use std::collections::BTreeSet;

/// Keys read from storage per page.
const PAGE: usize = 1024;

/// A forward cursor over one subtree's keys; see the module documentation.
pub(crate) struct SubtreeScan<'a> {
    storage: &'a dyn Storage,
    uuids: &'a BTreeSet<String>,
    kind: TreeKind,
    sid: &'a str,
    /// The subtree's storage prefix (empty for the system subtree).
    prefix: String,
    buckets: Option<&'a BTreeSet<u32>>,
    /// The storage key the next page starts strictly after: the current page's last key,
    /// or where a skip over foreign keys lands.
    cursor: Option<String>,
    page: Vec<(String, Vec<u8>)>,
    at: usize,
    /// Keys read per page ([`PAGE`]; smaller in tests).
    page_size: usize,
    /// The storage has no keys of this subtree after the current page.
    exhausted: bool,
    /// The key equal to the prefix itself is still to be looked at (a scan strictly after
    /// the prefix would miss it).
    prefix_key: bool,
}

impl<'a> SubtreeScan<'a> {
    /// A scan of subtree `sid` of tree `kind` strictly after `after` (a key relative to the
    /// subtree's storage prefix; `None`: from its first key), limited to `buckets` if given.
    pub(crate) fn new(
        storage: &'a dyn Storage,
        uuids: &'a BTreeSet<String>,
        kind: TreeKind,
        sid: &'a str,
        buckets: Option<&'a BTreeSet<u32>>,
        after: Option<&str>,
    ) -> Self {
        let prefix = class::subtree_prefix(sid).unwrap_or_default();
        let (cursor, prefix_key) = match after {
            Some(a) => (Some(format!("{prefix}{a}")), false),
            None if prefix.is_empty() => (None, false),
            None => (Some(prefix.clone()), true),
        };
        SubtreeScan {
            storage,
            uuids,
            kind,
            sid,
            prefix,
            buckets,
            cursor,
            page: Vec::new(),
            at: 0,
            page_size: PAGE,
            exhausted: false,
            prefix_key,
        }
    }

    /// The same scan reading `n` keys per page.
    #[cfg(test)]
    fn paged(mut self, n: usize) -> Self {
        self.page_size = n.max(1);
        self
    }

    /// Whether a stored key belongs to this scan.
    fn wanted(&self, key: &str) -> bool {
        let kind = match class::classify(key, self.uuids) {
            Class::NodeLocal => return false,
            Class::Replicated => TreeKind::Replicated,
            Class::ClusterLocal => TreeKind::Local,
        };
        kind == self.kind
            && class::subtree(key) == self.sid
            && self
                .buckets
                .is_none_or(|b| b.contains(&merkle::bucket_index(key)))
    }

    /// For the system subtree: the storage prefix of a run of keys that are not its own
    /// (one mount's data, the node-local keys) that `key` starts.
    fn foreign_run(&self, key: &str) -> Option<String> {
        if !self.prefix.is_empty() {
            return None;
        }
        if key.starts_with(class::NODE_LOCAL) {
            return Some(class::NODE_LOCAL.to_string());
        }
        class::subtree_prefix(&class::subtree(key))
    }

    /// The next key of the subtree (its full storage key) with its stored bytes.
    pub(crate) fn next_entry(&mut self) -> Result<Option<(String, Vec<u8>)>, StorageError> {
        if std::mem::take(&mut self.prefix_key) {
            if let Some(v) = self.storage.get(&self.prefix)? {
                if self.wanted(&self.prefix) {
                    return Ok(Some((self.prefix.clone(), v)));
                }
            }
        }
        loop {
            while self.at < self.page.len() {
                let i = self.at;
                self.at += 1;
                let key = &self.page[i].0;
                if !key.starts_with(&self.prefix) {
                    self.exhausted = true;
                    self.page.clear();
                    self.at = 0;
                    return Ok(None);
                }
                if self.wanted(key) {
                    let (k, v) = std::mem::take(&mut self.page[i]);
                    return Ok(Some((k, v)));
                }
                // A run of foreign keys that goes on past this page: skip it in one read.
                if let Some(run) = self.foreign_run(key) {
                    // (The cursor is the page's last key.)
                    let past = self.cursor.as_ref().is_some_and(|l| l.starts_with(&run));
                    let jump = format!("{run}\u{10FFFF}");
                    if past && jump.as_str() > key.as_str() {
                        self.cursor = Some(jump);
                        self.page.clear();
                        self.at = 0;
                        break;
                    }
                }
            }
            if self.exhausted {
                return Ok(None);
            }
            let page = self
                .storage
                .scan_after(self.cursor.as_deref(), self.page_size)?;
            if page.len() < self.page_size {
                self.exhausted = true;
            }
            match page.last() {
                Some((last, _)) => self.cursor = Some(last.clone()),
                None => return Ok(None),
            }
            self.page = page;
            self.at = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemStorage;
    use quickcheck::quickcheck;

    /// One scan's parameters, run through the scan and through a filter of the whole store.
    struct Query<'a> {
        uuids: &'a BTreeSet<String>,
        kind: TreeKind,
        sid: &'a str,
        buckets: Option<&'a BTreeSet<u32>>,
        after: Option<&'a str>,
    }

    impl Query<'_> {
        /// What the scan returns, reading `page` keys at a time.
        fn scanned(&self, s: &MemStorage, page: usize) -> Vec<String> {
            let mut scan =
                SubtreeScan::new(s, self.uuids, self.kind, self.sid, self.buckets, self.after)
                    .paged(page);
            let mut out = Vec::new();
            while let Some((k, _)) = scan.next_entry().unwrap() {
                out.push(k);
            }
            out
        }

        /// What the scan must return: every stored key of the subtree, filtered the same way.
        fn expected(&self, s: &MemStorage) -> Vec<String> {
            let prefix = class::subtree_prefix(self.sid).unwrap_or_default();
            s.map
                .keys()
                .filter(|k| {
                    let kk = match class::classify(k, self.uuids) {
                        Class::NodeLocal => return false,
                        Class::Replicated => TreeKind::Replicated,
                        Class::ClusterLocal => TreeKind::Local,
                    };
                    kk == self.kind
                        && class::subtree(k) == self.sid
                        && self
                            .buckets
                            .is_none_or(|b| b.contains(&merkle::bucket_index(k)))
                        && self
                            .after
                            .is_none_or(|a| k.as_str() > format!("{prefix}{a}").as_str())
                })
                .cloned()
                .collect()
        }
    }

    #[test]
    fn a_scan_crosses_pages_skips_foreign_runs_and_keeps_the_prefix_key() {
        let mut s = MemStorage::new();
        let uuids: BTreeSet<String> = ["L".to_string()].into_iter().collect();
        for i in 0..3000 {
            s.map.insert(format!("logical/R/k{i:05}"), vec![1]);
            s.map.insert(format!("node/wal/{i:05}"), vec![2]);
        }
        for i in 0..1500 {
            s.map.insert(format!("sys/policy/p{i:05}"), vec![3]);
            s.map.insert(format!("sys/token/t{i:05}"), vec![4]);
            s.map.insert(format!("logical/L/x{i:05}"), vec![5]);
        }
        s.map.insert("logical/R/".into(), vec![6]);
        s.map.insert("core/mounts".into(), vec![7]);
        s.map.insert("logical/R0".into(), vec![8]);
        for (kind, sid) in [
            (TreeKind::Replicated, "logical/R"),
            (TreeKind::Replicated, "sys"),
            (TreeKind::Local, "sys"),
            (TreeKind::Local, "logical/L"),
        ] {
            for after in [None, Some("k01000"), Some("sys/policy/p00999"), Some("zzz")] {
                let q = Query {
                    uuids: &uuids,
                    kind,
                    sid,
                    buckets: None,
                    after,
                };
                assert_eq!(
                    q.scanned(&s, PAGE),
                    q.expected(&s),
                    "{kind:?} {sid} after {after:?}"
                );
            }
        }
        let whole = |sid, buckets| Query {
            uuids: &uuids,
            kind: TreeKind::Replicated,
            sid,
            buckets,
            after: None,
        };
        let all = whole("logical/R", None).scanned(&s, PAGE);
        assert_eq!(all.len(), 3001);
        assert_eq!(all[0], "logical/R/");
        let sys = whole("sys", None).scanned(&s, 7);
        assert!(sys.contains(&"logical/R0".to_string()));
        assert!(sys.contains(&"core/mounts".to_string()));
        let buckets: BTreeSet<u32> = (0..200).collect();
        let q = whole("logical/R", Some(&buckets));
        assert_eq!(q.scanned(&s, 100), q.expected(&s));
    }

    quickcheck! {
        fn a_scan_returns_exactly_the_subtree_after_the_cursor(
            keys: Vec<(u8, u16)>, after: Option<u16>, bucket_mod: u8
        ) -> bool {
            let mut s = MemStorage::new();
            let uuids: BTreeSet<String> = ["L".to_string()].into_iter().collect();
            let families = ["logical/R/", "logical/L/", "sys/token/", "sys/p/", "node/", "auth/A/", "core/"];
            for (f, n) in &keys {
                let fam = families[*f as usize % families.len()];
                // Runs long enough to cross pages (of 5 keys) now and then.
                for j in 0..(*n % 3 + 1) as u32 * 4 {
                    s.map.insert(format!("{fam}{n:05}-{j:04}"), vec![]);
                }
            }
            let buckets: Option<BTreeSet<u32>> = bucket_mod.is_multiple_of(3)
                .then(|| (0..(merkle::PAGES * merkle::SUBPAGES) as u32).filter(|b| b.is_multiple_of(3)).collect());
            let after = after.map(|a| format!("{a:05}"));
            [
                (TreeKind::Replicated, "logical/R"),
                (TreeKind::Local, "logical/L"),
                (TreeKind::Replicated, "sys"),
                (TreeKind::Local, "sys"),
                (TreeKind::Replicated, "auth/A"),
            ]
            .into_iter()
            .all(|(kind, sid)| {
                let a = after.as_deref().map(|a| {
                    if sid == "sys" { format!("sys/p/{a}") } else { a.to_string() }
                });
                let q = Query { uuids: &uuids, kind, sid, buckets: buckets.as_ref(), after: a.as_deref() };
                q.scanned(&s, 5) == q.expected(&s)
            })
        }
    }
}
