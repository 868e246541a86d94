//! Merkle trees over stored data, kept up to date on every write and persisted.
//!
//! There are two trees, one per replicated class ([`TreeKind::Replicated`] and
//! [`TreeKind::Local`]). Each tree is a set of subtrees, one per mount (`logical/<uuid>`,
//! `auth/<uuid>`) plus one for system data (`sys`), so that the view a path-filtered
//! performance secondary should hold is just a subset of subtrees.
//!
//! Every subtree has the same fixed shape: [`PAGES`] pages of [`SUBPAGES`] subpages. A key
//! falls into one subpage chosen by the SHA-256 of its name. A subpage's value is the sum
//! (mod 2^256) of the leaf hashes `SHA-256(key, stored bytes)` of its keys, so a write
//! updates it in O(1) (subtract the old leaf, add the new one) and the result does not
//! depend on the order of writes. A page hash is the SHA-256 of its subpage sums, a subtree
//! root the SHA-256 of its page hashes, and a tree root the SHA-256 of the non-empty
//! subtrees' ids and roots in id order. Comparing two trees top-down (roots, page hashes,
//! subpage sums, then key hashes) finds the differing keys while transferring little.
//!
//! Persisted (node-local: each node keeps its own) as one storage key per non-empty page,
//! `node/merkle/<r|l>/<subtree>/<page>`, holding the page's subpage sums followed by the page
//! hash, and one per non-empty subtree, `node/merkle/<r|l>/<subtree>/root`, holding its root.
//! The stored hashes are redundant on purpose: the Merkle check ([`check`]) compares every
//! stored record with the one recomputed from the data, and so can say which page, which
//! subpages and which subtree roots are corrupt.

use super::class;
use crate::crypto;
use crate::storage::Write;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

pub const PAGES: usize = 64;
pub const SUBPAGES: usize = 64;
/// Prefix of persisted pages.
pub const PREFIX: &str = "node/merkle/";
/// Marker: the persisted trees are complete (absent = rebuild from storage).
pub const MARKER: &str = "node/merkle-version";
pub const VERSION: &[u8] = b"2";
/// Size of a persisted page record: the subpage sums, then the page hash.
pub const PAGE_RECORD: usize = SUBPAGES * 32 + 32;
/// Last path segment of a subtree's root record.
const ROOT_SEGMENT: &str = "root";

pub type Hash = [u8; 32];
pub const ZERO: Hash = [0; 32];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TreeKind {
    Replicated,
    Local,
}

impl TreeKind {
    fn tag(self) -> &'static str {
        match self {
            TreeKind::Replicated => "r",
            TreeKind::Local => "l",
        }
    }
    fn from_tag(t: &str) -> Option<TreeKind> {
        match t {
            "r" => Some(TreeKind::Replicated),
            "l" => Some(TreeKind::Local),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            TreeKind::Replicated => "replicated",
            TreeKind::Local => "local",
        }
    }
}

/// The subpage (page, subpage) a key falls into.
pub fn bucket(key: &str) -> (usize, usize) {
    let h = crypto::sha256(key.as_bytes());
    (h[0] as usize % PAGES, h[1] as usize % SUBPAGES)
}

/// Flat bucket number `page * SUBPAGES + subpage`.
pub fn bucket_index(key: &str) -> u32 {
    let (p, s) = bucket(key);
    (p * SUBPAGES + s) as u32
}

/// The leaf hash of a key and its stored bytes.
pub fn leaf(key: &str, value: &[u8]) -> Hash {
    crypto::sha256_parts(&[&(key.len() as u64).to_be_bytes(), key.as_bytes(), value])
}

/// The two big-endian 128-bit halves of a hash (high, low).
fn halves(h: &Hash) -> (u128, u128) {
    let (mut hi, mut lo) = ([0u8; 16], [0u8; 16]);
    hi.copy_from_slice(&h[..16]);
    lo.copy_from_slice(&h[16..]);
    (u128::from_be_bytes(hi), u128::from_be_bytes(lo))
}

/// `a += b` mod 2^256, both read as big-endian numbers (two 128-bit words: a bulk rebuild
/// adds one leaf per key).
fn add(a: &mut Hash, b: &Hash) {
    let ((ah, al), (bh, bl)) = (halves(a), halves(b));
    let (lo, carry) = al.overflowing_add(bl);
    let hi = ah.wrapping_add(bh).wrapping_add(carry as u128);
    a[..16].copy_from_slice(&hi.to_be_bytes());
    a[16..].copy_from_slice(&lo.to_be_bytes());
}

/// `a -= b` mod 2^256 (the inverse of [`add`], in the same two words).
fn sub(a: &mut Hash, b: &Hash) {
    let ((ah, al), (bh, bl)) = (halves(a), halves(b));
    let (lo, borrow) = al.overflowing_sub(bl);
    let hi = ah.wrapping_sub(bh).wrapping_sub(borrow as u128);
    a[..16].copy_from_slice(&hi.to_be_bytes());
    a[16..].copy_from_slice(&lo.to_be_bytes());
}

/// One subtree: subpage sums, page hashes and root.
///
/// The 4,096 subpage sums (128 KiB) are shared between copies of a node and copied on the
/// first write to one of them: copying a node (a harness's prepared node, a simulated
/// node's state) costs a reference count per subtree, not its sums.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subtree {
    sums: Arc<Vec<Hash>>,
    pages: Vec<Hash>,
    root: Hash,
}

impl Default for Subtree {
    fn default() -> Self {
        let mut s = Subtree {
            sums: Arc::new(vec![ZERO; PAGES * SUBPAGES]),
            pages: vec![zero_page(); PAGES],
            root: ZERO,
        };
        s.recompute_root();
        s
    }
}

impl Subtree {
    fn recompute_page(&mut self, p: usize) {
        self.pages[p] = page_hash(&self.sums[p * SUBPAGES..(p + 1) * SUBPAGES]);
    }
    fn recompute_root(&mut self) {
        self.root = root_of(&self.pages);
    }
    pub fn is_empty(&self) -> bool {
        self.sums.iter().all(|s| *s == ZERO)
    }
    pub fn root(&self) -> Hash {
        self.root
    }
    pub fn page_hashes(&self) -> &[Hash] {
        &self.pages
    }
    /// The subpage sums of page `p`.
    pub fn subpages(&self, p: usize) -> &[Hash] {
        &self.sums[p * SUBPAGES..(p + 1) * SUBPAGES]
    }
    /// The persisted record of page `p` (`None` when the page is empty).
    pub fn page_bytes(&self, p: usize) -> Option<Vec<u8>> {
        page_record(self.subpages(p), &self.pages[p])
    }
    /// Adds a key's leaf to its subpage without recomputing hashes (bulk rebuilds; call
    /// [`Subtree::finish`] after the last one).
    fn add_leaf(&mut self, key: &str, value: &[u8]) {
        let (p, s) = bucket(key);
        add(
            &mut Arc::make_mut(&mut self.sums)[p * SUBPAGES + s],
            &leaf(key, value),
        );
    }
    /// Recomputes every page hash and the root.
    fn finish(&mut self) {
        for p in 0..PAGES {
            self.recompute_page(p);
        }
        self.recompute_root();
    }
    fn set_page_bytes(&mut self, p: usize, bytes: &[u8]) {
        let sums = Arc::make_mut(&mut self.sums);
        for (i, chunk) in bytes.chunks_exact(32).take(SUBPAGES).enumerate() {
            let mut h = ZERO;
            h.copy_from_slice(chunk);
            sums[p * SUBPAGES + i] = h;
        }
        self.recompute_page(p);
    }
}

/// Identifies a subtree: which tree, and the subtree id (`sys`, `logical/<uuid>`, ...).
pub type SubtreeId = (TreeKind, String);

/// Both trees.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trees {
    pub subtrees: BTreeMap<SubtreeId, Subtree>,
}

/// The touched pages of a staged update, to persist and then to install. Only the touched
/// pages' subpage sums are copied (a subtree holds 4,096 sums; copying them all on every
/// write set was most of the cost of a small write).
#[derive(Debug, Default)]
pub struct Staged {
    scratch: BTreeMap<SubtreeId, StagedSubtree>,
}

#[derive(Debug)]
struct StagedSubtree {
    /// Every page hash of the subtree: the base's, with the touched pages' new ones once
    /// persisted.
    pages: Vec<Hash>,
    /// The touched pages' new subpage sums.
    touched: BTreeMap<usize, Vec<Hash>>,
    root: Hash,
    /// No sum of the subtree is left non-zero.
    empty: bool,
    /// Page hashes, root and `empty` recomputed ([`Trees::persist`]).
    done: bool,
}

impl StagedSubtree {
    /// Recomputes the touched pages' hashes and the root; `base` is the subtree staged on.
    fn finish(&mut self, base: Option<&Subtree>) {
        if self.done {
            return;
        }
        for (p, sums) in &self.touched {
            self.pages[*p] = page_hash(sums);
        }
        self.root = root_of(&self.pages);
        // The untouched pages are read only when every touched one became empty (rare).
        // (Their hashes may be stale in a tree under bulk rebuild, their sums never are.)
        let touched_empty = self.touched.values().flatten().all(|h| *h == ZERO);
        self.empty = touched_empty
            && base.is_none_or(|b| {
                (0..PAGES)
                    .filter(|p| !self.touched.contains_key(p))
                    .all(|p| b.subpages(p).iter().all(|h| *h == ZERO))
            });
        self.done = true;
    }
}

/// The persisted record of a page: its subpage sums, then its hash (`None` when the page is
/// empty).
fn page_record(sums: &[Hash], hash: &Hash) -> Option<Vec<u8>> {
    if sums.iter().all(|h| *h == ZERO) {
        return None;
    }
    let mut out: Vec<u8> = Vec::with_capacity(PAGE_RECORD);
    for h in sums {
        out.extend_from_slice(h);
    }
    out.extend_from_slice(hash);
    Some(out)
}

/// The hash of a page from its subpage sums.
fn page_hash(sums: &[Hash]) -> Hash {
    let mut buf = Vec::with_capacity(SUBPAGES * 32);
    for s in sums {
        buf.extend_from_slice(s);
    }
    crypto::sha256(&buf)
}

/// The root of a subtree from its page hashes.
fn root_of(pages: &[Hash]) -> Hash {
    let mut buf = Vec::with_capacity(PAGES * 32);
    for p in pages {
        buf.extend_from_slice(p);
    }
    crypto::sha256(&buf)
}

/// The hash of an empty page.
fn zero_page() -> Hash {
    static ZERO_PAGE: std::sync::OnceLock<Hash> = std::sync::OnceLock::new();
    *ZERO_PAGE.get_or_init(|| crypto::sha256(&[0u8; SUBPAGES * 32]))
}

impl Staged {
    pub fn is_empty(&self) -> bool {
        self.scratch.is_empty()
    }
}

fn page_key(id: &SubtreeId, page: usize) -> String {
    format!("{PREFIX}{}/{}/{page:02}", id.0.tag(), id.1)
}

fn root_key(id: &SubtreeId) -> String {
    format!("{PREFIX}{}/{}/{ROOT_SEGMENT}", id.0.tag(), id.1)
}

/// What a persisted record's key names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Record {
    Page(SubtreeId, usize),
    Root(SubtreeId),
}

/// Parses a key under [`PREFIX`].
pub fn parse_key(k: &str) -> Option<Record> {
    let rest = k.strip_prefix(PREFIX)?;
    let (tag, rest) = rest.split_once('/')?;
    let (sub, last) = rest.rsplit_once('/')?;
    let kind = TreeKind::from_tag(tag)?;
    let id = (kind, sub.to_string());
    if last == ROOT_SEGMENT {
        return Some(Record::Root(id));
    }
    // Pages are written with two digits; anything else is not a page of ours.
    if last.len() != 2 || !last.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let p: usize = last.parse().ok()?;
    (p < PAGES).then_some(Record::Page(id, p))
}

/// The storage key of a record.
pub fn record_key(r: &Record) -> String {
    match r {
        Record::Page(id, p) => page_key(id, *p),
        Record::Root(id) => root_key(id),
    }
}
impl Trees {
    /// Stages one key change into `staged` (reading the current state from `self`).
    pub fn stage(
        &self,
        staged: &mut Staged,
        tree: TreeKind,
        subtree: &str,
        key: &str,
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) {
        if old == new {
            return;
        }
        let id = (tree, subtree.to_string());
        let base = self.subtrees.get(&id);
        let st = staged.scratch.entry(id).or_insert_with(|| StagedSubtree {
            pages: base.map_or_else(|| vec![zero_page(); PAGES], |b| b.pages.clone()),
            touched: BTreeMap::new(),
            root: ZERO,
            empty: false,
            done: false,
        });
        st.done = false;
        let (p, s) = bucket(key);
        let sums = st.touched.entry(p).or_insert_with(|| {
            base.map_or_else(|| vec![ZERO; SUBPAGES], |b| b.subpages(p).to_vec())
        });
        if let Some(o) = old {
            sub(&mut sums[s], &leaf(key, o));
        }
        if let Some(n) = new {
            add(&mut sums[s], &leaf(key, n));
        }
    }

    /// Finishes a staged update: recomputes touched pages and roots, and returns the storage
    /// writes that persist them.
    pub fn persist(&self, staged: &mut Staged) -> Vec<Write> {
        let mut out = Vec::new();
        for (id, st) in staged.scratch.iter_mut() {
            st.finish(self.subtrees.get(id));
        }
        for (id, st) in &staged.scratch {
            for (p, sums) in &st.touched {
                out.push((page_key(id, *p), page_record(sums, &st.pages[*p])));
            }
        }
        for (id, st) in &staged.scratch {
            let root = (!st.empty).then(|| st.root.to_vec());
            out.push((root_key(id), root));
        }
        out
    }

    /// Installs a staged update after its writes were applied.
    pub fn install(&mut self, staged: Staged) {
        for (id, mut st) in staged.scratch {
            st.finish(self.subtrees.get(&id));
            if st.empty {
                self.subtrees.remove(&id);
                continue;
            }
            let t = self.subtrees.entry(id).or_default();
            let all = Arc::make_mut(&mut t.sums);
            for (p, sums) in st.touched {
                all[p * SUBPAGES..(p + 1) * SUBPAGES].copy_from_slice(&sums);
            }
            t.pages = st.pages;
            t.root = st.root;
        }
    }

    /// Applies one change directly (tests, rebuilds).
    pub fn apply(
        &mut self,
        tree: TreeKind,
        subtree: &str,
        key: &str,
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) {
        let mut s = Staged::default();
        self.stage(&mut s, tree, subtree, key, old, new);
        self.persist(&mut s);
        self.install(s);
    }

    /// Loads persisted pages (`scan` of [`PREFIX`]). Hashes are recomputed from the subpage
    /// sums; malformed records are skipped (the Merkle check reports them).
    pub fn load(pages: &[(String, Vec<u8>)]) -> Trees {
        let mut t = Trees::default();
        for (k, v) in pages {
            let Some(Record::Page(id, p)) = parse_key(k) else {
                continue;
            };
            if v.len() != PAGE_RECORD {
                continue;
            }
            t.subtrees.entry(id).or_default().set_page_bytes(p, v);
        }
        for st in t.subtrees.values_mut() {
            st.recompute_root();
        }
        t.subtrees.retain(|_, s| !s.is_empty());
        t
    }

    /// Every record write that persists the whole of `self` (after a rebuild).
    pub fn all_page_writes(&self) -> Vec<Write> {
        let mut out = Vec::new();
        for (id, st) in &self.subtrees {
            for p in 0..PAGES {
                if let Some(b) = st.page_bytes(p) {
                    out.push((page_key(id, p), Some(b)));
                }
            }
            out.push((root_key(id), Some(st.root.to_vec())));
        }
        out
    }

    /// The record `r` should hold given `self` (`None`: the record should not exist).
    pub fn record(&self, r: &Record) -> Option<Vec<u8>> {
        match r {
            Record::Page(id, p) => self.subtrees.get(id).and_then(|s| s.page_bytes(*p)),
            Record::Root(id) => self.subtrees.get(id).map(|s| s.root.to_vec()),
        }
    }

    /// Every record `self` persists (non-empty pages and subtree roots).
    pub fn records(&self) -> Vec<Record> {
        let mut out = Vec::new();
        for (id, st) in &self.subtrees {
            for p in 0..PAGES {
                if st.subpages(p).iter().any(|h| *h != ZERO) {
                    out.push(Record::Page(id.clone(), p));
                }
            }
            out.push(Record::Root(id.clone()));
        }
        out
    }

    /// Bulk rebuilds: adds a stored key without recomputing hashes; [`Trees::finish`] after.
    pub fn add_bulk(&mut self, tree: TreeKind, subtree: &str, key: &str, value: &[u8]) {
        self.subtrees
            .entry((tree, subtree.to_string()))
            .or_default()
            .add_leaf(key, value);
    }

    /// [`Trees::add_bulk`] for rows in key order, each with its tree: the subtree is looked up
    /// (and its id built) once per run of keys that share it, not once per key.
    pub fn add_bulk_sorted<'a>(
        &mut self,
        rows: impl IntoIterator<Item = (TreeKind, &'a str, &'a [u8])>,
    ) {
        let mut bulk = self.bulk();
        for (tree, key, value) in rows {
            bulk.add(tree, key, value);
        }
    }

    /// A [`BulkAdd`] over `self`: [`Trees::add_bulk_sorted`] one row at a time, for rows
    /// that are only lent (a storage cursor's).
    pub fn bulk(&mut self) -> BulkAdd<'_> {
        BulkAdd {
            trees: self,
            run: None,
        }
    }

    /// Recomputes every hash after [`Trees::add_bulk`] and drops empty subtrees.
    pub fn finish(&mut self) {
        for st in self.subtrees.values_mut() {
            st.finish();
        }
        self.subtrees.retain(|_, s| !s.is_empty());
    }

    /// The buckets (subtree, `page * SUBPAGES + subpage`) whose sums differ between two trees.
    pub fn differing_buckets(&self, other: &Trees) -> Vec<(SubtreeId, u32)> {
        let empty = Subtree::default();
        let ids: BTreeSet<&SubtreeId> = self.subtrees.keys().chain(other.subtrees.keys()).collect();
        let mut out = Vec::new();
        for id in ids {
            let a = self.subtrees.get(id).unwrap_or(&empty);
            let b = other.subtrees.get(id).unwrap_or(&empty);
            if a.root == b.root {
                continue;
            }
            for (i, (x, y)) in a.sums.iter().zip(b.sums.iter()).enumerate() {
                if x != y {
                    out.push((id.clone(), i as u32));
                }
            }
        }
        out
    }

    pub fn get(&self, tree: TreeKind, subtree: &str) -> Option<&Subtree> {
        self.subtrees.get(&(tree, subtree.to_string()))
    }

    /// Non-empty subtree ids and roots of one tree that `include` accepts, in id order.
    pub fn roots(&self, tree: TreeKind, include: &dyn Fn(&str) -> bool) -> Vec<(String, Hash)> {
        self.subtrees
            .iter()
            .filter(|((k, id), _)| *k == tree && include(id))
            .map(|((_, id), s)| (id.clone(), s.root))
            .collect()
    }

    /// The root of one tree restricted to the subtrees `include` accepts.
    pub fn root(&self, tree: TreeKind, include: &dyn Fn(&str) -> bool) -> Hash {
        combine_roots(&self.roots(tree, include))
    }
}

/// Adds rows in key order to trees under bulk rebuild ([`Trees::add_bulk`]'s rule, hashes
/// recomputed by [`Trees::finish`]); the rows need to live only for their call. The subtree
/// of the current run of keys is held out of the map while the run lasts and put back when
/// the next run starts or the adder is dropped.
pub struct BulkAdd<'t> {
    trees: &'t mut Trees,
    run: Option<Run>,
}

/// The subtree a run of keys falls into, taken out of [`Trees::subtrees`].
struct Run {
    tree: TreeKind,
    /// `(auth, uuid)` of a mount's subtree, `None` for the system subtree.
    mount: Option<(bool, String)>,
    id: SubtreeId,
    subtree: Subtree,
}

impl Run {
    fn holds(&self, tree: TreeKind, r: class::SubtreeRef<'_>) -> bool {
        self.tree == tree
            && match (r, &self.mount) {
                (class::SubtreeRef::System, None) => true,
                (class::SubtreeRef::Mount { auth, uuid }, Some((a, u))) => auth == *a && uuid == u,
                _ => false,
            }
    }
}

impl BulkAdd<'_> {
    /// Adds one stored key to the subtree of `tree` it belongs to.
    pub fn add(&mut self, tree: TreeKind, key: &str, value: &[u8]) {
        let r = class::subtree_ref(key);
        if !self.run.as_ref().is_some_and(|run| run.holds(tree, r)) {
            self.put_back();
            let id = (tree, class::subtree(key));
            let subtree = self.trees.subtrees.remove(&id).unwrap_or_default();
            let mount = match r {
                class::SubtreeRef::Mount { auth, uuid } => Some((auth, uuid.to_string())),
                class::SubtreeRef::System => None,
            };
            self.run = Some(Run {
                tree,
                mount,
                id,
                subtree,
            });
        }
        if let Some(run) = self.run.as_mut() {
            run.subtree.add_leaf(key, value);
        }
    }

    fn put_back(&mut self) {
        if let Some(run) = self.run.take() {
            self.trees.subtrees.insert(run.id, run.subtree);
        }
    }
}

impl Drop for BulkAdd<'_> {
    fn drop(&mut self) {
        self.put_back();
    }
}

/// A tree root from its subtrees' ids and roots (in id order).
pub fn combine_roots(roots: &[(String, Hash)]) -> Hash {
    let mut buf = Vec::new();
    for (id, r) in roots {
        buf.extend_from_slice(&(id.len() as u64).to_be_bytes());
        buf.extend_from_slice(id.as_bytes());
        buf.extend_from_slice(r);
    }
    crypto::sha256(&buf)
}

/// One page of a subtree that the Merkle check found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageFinding {
    /// The stored page record differs from the one recomputed from the data (or is
    /// malformed, or missing, or should not exist).
    pub corrupted: bool,
    /// Subpages whose stored sums differ from the data's.
    pub subpages: Vec<u16>,
}

/// One subtree with at least one finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubtreeFinding {
    /// Position of the subtree among all checked subtrees (both trees, in id order).
    pub index: usize,
    pub id: SubtreeId,
    pub pages: BTreeMap<usize, PageFinding>,
    /// The stored subtree root differs from the data's.
    pub corrupted_root: bool,
    /// The stored root (zero when there is none).
    pub stored_root: Hash,
    /// The root recomputed from the data (zero for an empty subtree).
    pub expected_root: Hash,
}

/// What [`check`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// A tree root the node serves differs from the one recomputed from the data.
    pub corrupted_root: bool,
    pub subtrees: Vec<SubtreeFinding>,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        !self.corrupted_root && self.subtrees.is_empty()
    }
}

fn sums_of(bytes: Option<&[u8]>) -> Vec<Hash> {
    let mut out = vec![ZERO; SUBPAGES];
    if let Some(b) = bytes {
        for (i, chunk) in b.chunks_exact(32).take(SUBPAGES).enumerate() {
            out[i].copy_from_slice(chunk);
        }
    }
    out
}

/// The Merkle check: compares every persisted record (`stored`, a scan of [`PREFIX`]) and
/// the trees the node serves (`live`) with `fresh`, the trees recomputed from the data.
pub fn check(fresh: &Trees, live: &Trees, stored: &[(String, Vec<u8>)]) -> CheckReport {
    let mut records: BTreeMap<Record, &[u8]> = BTreeMap::new();
    for (k, v) in stored {
        if let Some(r) = parse_key(k) {
            records.insert(r, v.as_slice());
        }
    }
    let mut ids: BTreeSet<SubtreeId> = fresh.subtrees.keys().cloned().collect();
    for r in records.keys() {
        match r {
            Record::Page(id, _) | Record::Root(id) => {
                ids.insert(id.clone());
            }
        }
    }
    let empty = Subtree::default();
    let mut report = CheckReport::default();
    for (index, id) in ids.into_iter().enumerate() {
        let f = fresh.subtrees.get(&id).unwrap_or(&empty);
        let mut pages = BTreeMap::new();
        for p in 0..PAGES {
            let expected = f.page_bytes(p);
            let got = records.get(&Record::Page(id.clone(), p)).copied();
            if expected.as_deref() == got {
                continue;
            }
            let want = f.subpages(p);
            let have = sums_of(got);
            let subpages = (0..SUBPAGES)
                .filter(|&i| want[i] != have[i])
                .map(|i| i as u16)
                .collect();
            pages.insert(
                p,
                PageFinding {
                    corrupted: true,
                    subpages,
                },
            );
        }
        let expected_root = if f.is_empty() { ZERO } else { f.root };
        let stored_root = match records.get(&Record::Root(id.clone())) {
            Some(b) if b.len() == 32 => {
                let mut h = ZERO;
                h.copy_from_slice(b);
                h
            }
            Some(_) => [0xff; 32],
            None => ZERO,
        };
        let corrupted_root = stored_root != expected_root;
        if corrupted_root || !pages.is_empty() {
            report.subtrees.push(SubtreeFinding {
                index,
                id,
                pages,
                corrupted_root,
                stored_root,
                expected_root,
            });
        }
    }
    let all = |_: &str| true;
    report.corrupted_root = !report.subtrees.is_empty()
        || [TreeKind::Replicated, TreeKind::Local]
            .iter()
            .any(|k| live.root(*k, &all) != fresh.root(*k, &all));
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck::quickcheck;

    fn key(k: u8) -> (String, &'static str) {
        let sub = match k % 3 {
            0 => "sys",
            1 => "logical/a",
            _ => "logical/b",
        };
        (format!("{sub}/k{k}"), sub)
    }

    quickcheck! {
        /// The incrementally maintained trees equal a full recomputation from the final data,
        /// and survive a persist/load round trip.
        fn incremental_equals_full(ops: Vec<(u8, Option<u8>, bool)>) -> bool {
            let mut inc = Trees::default();
            let mut data: BTreeMap<(TreeKind, String), Vec<u8>> = BTreeMap::new();
            let mut persisted: BTreeMap<String, Vec<u8>> = BTreeMap::new();
            for (k, v, local) in &ops {
                let (name, sub) = key(*k);
                let kind = if *local { TreeKind::Local } else { TreeKind::Replicated };
                let dk = (kind, name.clone());
                let old = data.get(&dk).cloned();
                let new = v.map(|b| vec![b; (b % 7) as usize]);
                let mut s = Staged::default();
                inc.stage(&mut s, kind, sub, &name, old.as_deref(), new.as_deref());
                for (pk, pv) in inc.persist(&mut s) {
                    match pv { Some(b) => { persisted.insert(pk, b); } None => { persisted.remove(&pk); } }
                }
                inc.install(s);
                match new { Some(n) => { data.insert(dk, n); } None => { data.remove(&dk); } }
            }
            let mut full = Trees::default();
            for ((kind, name), v) in &data {
                let sub = crate::replication::class::subtree(name);
                full.apply(*kind, &sub, name, None, Some(v));
            }
            let loaded = Trees::load(&persisted.into_iter().collect::<Vec<_>>());
            let all = |_: &str| true;
            inc == full
                && loaded == full
                && inc.root(TreeKind::Replicated, &all) == full.root(TreeKind::Replicated, &all)
                && inc.root(TreeKind::Local, &all) == full.root(TreeKind::Local, &all)
        }
    }

    quickcheck! {
        /// A bulk rebuild by runs of subtrees equals one made key by key, whatever the mix of
        /// trees, mounts (`auth/` and `logical/` of the same uuid are different subtrees) and
        /// system keys in the sorted rows.
        fn bulk_sorted_equals_bulk_per_key(rows: Vec<(u8, u8, bool, Vec<u8>)>) -> bool {
            let mut sorted: BTreeMap<String, (TreeKind, Vec<u8>)> = BTreeMap::new();
            for (mount, k, local, v) in rows {
                let name = match mount % 5 {
                    0 => format!("sys/k{k}"),
                    1 => format!("logical/u1/k{k}"),
                    2 => format!("auth/u1/k{k}"),
                    3 => format!("logical/u2/k{k}"),
                    _ => format!("core/k{k}"),
                };
                let kind = if local { TreeKind::Local } else { TreeKind::Replicated };
                sorted.insert(name, (kind, v));
            }
            let mut per_key = Trees::default();
            for (name, (kind, v)) in &sorted {
                per_key.add_bulk(*kind, &crate::replication::class::subtree(name), name, v);
            }
            let mut runs = Trees::default();
            runs.add_bulk_sorted(sorted.iter().map(|(n, (k, v))| (*k, n.as_str(), v.as_slice())));
            per_key.finish();
            runs.finish();
            per_key == runs
        }
    }

    /// The byte-wise sum the persisted sums were defined with.
    fn add_bytewise(a: &mut Hash, b: &Hash) {
        let mut carry = 0u16;
        for i in (0..32).rev() {
            let s = a[i] as u16 + b[i] as u16 + carry;
            a[i] = s as u8;
            carry = s >> 8;
        }
    }

    quickcheck! {
        /// The word-wise sum equals the byte-wise one (carries across the halves and out of
        /// the top included), and `sub` undoes it.
        fn add_equals_bytewise(a: Vec<u8>, b: Vec<u8>, fill: u8) -> bool {
            let mut x = [fill; 32];
            let mut y = [!fill; 32];
            for (i, v) in a.iter().take(32).enumerate() { x[i] = *v; }
            for (i, v) in b.iter().take(32).enumerate() { y[31 - i] = *v; }
            let (mut words, mut bytes) = (x, x);
            add(&mut words, &y);
            add_bytewise(&mut bytes, &y);
            let mut back = words;
            sub(&mut back, &y);
            words == bytes && back == x
        }
    }

    #[test]
    fn add_carries_across_words() {
        let mut a = [0xff; 32];
        let mut one = ZERO;
        one[31] = 1;
        add(&mut a, &one);
        assert_eq!(a, ZERO);
        let mut b = ZERO;
        b[16..].copy_from_slice(&[0xff; 16]);
        add(&mut b, &one);
        let mut want = ZERO;
        want[15] = 1;
        assert_eq!(b, want);
    }

    #[test]
    fn add_then_remove_is_empty_and_roots_differ_by_content() {
        let mut t = Trees::default();
        let all = |_: &str| true;
        let empty = t.root(TreeKind::Replicated, &all);
        t.apply(TreeKind::Replicated, "sys", "core/x", None, Some(b"1"));
        let one = t.root(TreeKind::Replicated, &all);
        assert_ne!(empty, one);
        t.apply(
            TreeKind::Replicated,
            "sys",
            "core/x",
            Some(b"1"),
            Some(b"2"),
        );
        assert_ne!(one, t.root(TreeKind::Replicated, &all));
        t.apply(TreeKind::Replicated, "sys", "core/x", Some(b"2"), None);
        assert!(t.subtrees.is_empty());
        assert_eq!(empty, t.root(TreeKind::Replicated, &all));
        let only_sys = |id: &str| id == "sys";
        t.apply(
            TreeKind::Replicated,
            "logical/u",
            "logical/u/a",
            None,
            Some(b"1"),
        );
        assert_eq!(empty, t.root(TreeKind::Replicated, &only_sys));
    }
}
