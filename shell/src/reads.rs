//! KV reads answered on the API thread that read them, in parallel, from the committed
//! SQLite database, instead of taking turns on the core thread ([`cairn_core::reads`] says
//! which requests, and answers them exactly as the node would).
//!
//! Three things make an answer given here one the core thread could have given:
//!
//! - **One state.** The reads of one request (token, policies, mounts, audit devices, the
//!   value) must all see the same commit. The [`CommitClock`]'s sequence works as a
//!   seqlock: the core thread makes it odd before a `COMMIT` that writes and even again
//!   after, and steps it when the node's [`ReadView`] changes. A reader notes it before
//!   and after; if it was odd or moved, the answer is dropped and the request goes to the
//!   core thread. So no commit became visible while the reader read, and its reads, from
//!   SQLite or from its connection's cache, are of one state. A connection's cache is kept
//!   only while the sequence stays where it was filled.
//! - **Durable.** The core thread commits without waiting for the disk and acknowledges
//!   after the sync. A reader answers only once the sync thread has made every commit it
//!   could see durable ([`CommitClock::wait_durable`]), so nothing it answers can be lost
//!   in a crash. (The write a client was acknowledged is committed, hence visible to every
//!   later read: read-your-writes holds.)
//! - **The node's state.** The view (the barrier key) is what the node publishes after each
//!   batch ([`cairn_core::Node::read_view`]); when it changes (sealed, a replication role)
//!   it is withdrawn before that batch commits and the sequence is stepped, so no reader
//!   pairs the new storage with the old view.
//!
//! Requests the node counts: what readers answered is tallied here and handed to the node
//! at its next batch ([`Readers::take_answered`]), before any request of that batch (a
//! `sys/metrics` after a read counts it).

use crate::sqlite::{err, ReadCache};
use cairn_core::api::{Request, Response};
use cairn_core::metrics::Answered;
use cairn_core::reads::ReadView;
use cairn_core::storage::{Storage, StorageError, Write};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use rusqlite::{Connection, OpenFlags};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, RwLock};
use std::time::Duration;

/// Most read connections (each with its cache): as many as the API's worker threads, so
/// that a read finds one free; one that does not goes to the core thread.
const MAX_READERS: usize = 32;
/// Most bytes of values each connection's cache holds (the hot keys of a read are small:
/// the token entry, its policies, the mount table, the value).
const CACHE_BYTES: usize = 1 << 20;
/// Longest a reader waits for the sync that covers what it read; then the core thread
/// answers instead.
const DURABLE_WAIT: Duration = Duration::from_secs(2);
/// Most kinds of answer tallied between two batches (the classes are bounded by the
/// mounts; beyond this the core thread answers the reads of a new kind, and counts them).
const MAX_TALLIES: usize = 256;

/// Where the core thread's commits stand, for readers beside it.
#[derive(Default)]
pub struct CommitClock {
    /// Odd while a commit that writes is under way; stepped by 2 when the view changes.
    seq: AtomicU64,
    /// Commits that wrote so far.
    commits: AtomicU64,
    /// Commits made durable by the sync thread so far.
    durable: AtomicU64,
    lock: Mutex<()>,
    synced: Condvar,
}

impl CommitClock {
    /// The core thread is about to commit a batch that wrote.
    pub fn begin_commit(&self) {
        self.seq.fetch_add(1, SeqCst);
    }

    /// The commit begun with [`CommitClock::begin_commit`] returned; `wrote`: it stored the
    /// batch. Returns the number of commits that wrote so far, for
    /// [`CommitClock::synced`] once this one is durable.
    pub fn end_commit(&self, wrote: bool) -> u64 {
        let n = match wrote {
            true => self.commits.fetch_add(1, SeqCst) + 1,
            false => self.commits.load(SeqCst),
        };
        self.seq.fetch_add(1, SeqCst);
        n
    }

    /// The node's state that readers depend on changed: readers under way drop their
    /// answers.
    pub fn changed(&self) {
        self.seq.fetch_add(2, SeqCst);
    }

    /// The sync thread made the first `n` commits durable.
    pub fn synced(&self, n: u64) {
        self.durable.fetch_max(n, SeqCst);
        let _g = self.lock.lock();
        self.synced.notify_all();
    }

    /// Waits until the first `n` commits are durable; false after [`DURABLE_WAIT`].
    fn wait_durable(&self, n: u64) -> bool {
        if self.durable.load(SeqCst) >= n {
            return true;
        }
        let deadline = std::time::Instant::now() + DURABLE_WAIT;
        let Ok(mut g) = self.lock.lock() else {
            return false;
        };
        while self.durable.load(SeqCst) < n {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            g = match self.synced.wait_timeout(g, left) {
                Ok((g, _)) => g,
                Err(_) => return false,
            };
        }
        true
    }
}

/// Held by the core thread while it runs: when that thread ends, by returning or by a
/// panic, the readers' view is withdrawn, so that no read is answered beside a core that
/// no longer answers anything (every other request then fails with "core stopped").
pub struct Withdraw(pub Option<std::sync::Arc<Readers>>);

impl Drop for Withdraw {
    fn drop(&mut self) {
        if let Some(r) = &self.0 {
            r.set_view(None);
        }
    }
}

/// One read-only connection to the database and its cache of what it read at `seq`.
struct ReadConn {
    conn: Connection,
    cache: RefCell<ReadCache>,
    /// The clock's sequence the cache's entries were read at.
    seq: Option<u64>,
}

impl ReadConn {
    fn open(db: &Path) -> Result<ReadConn, StorageError> {
        let conn = Connection::open_with_flags(
            db,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(err)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(err)?;
        Ok(ReadConn {
            conn,
            cache: RefCell::new(ReadCache::holding(CACHE_BYTES)),
            seq: None,
        })
    }
}

impl Storage for ReadConn {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        crate::sqlite::cached_get(&self.conn, &self.cache, key)
    }

    fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        crate::sqlite::cached_scan(&self.conn, &self.cache, prefix)
    }

    fn apply(&mut self, _writes: &[Write]) -> Result<(), StorageError> {
        Err(StorageError::Io(
            "a reader beside the core thread does not write".into(),
        ))
    }
}

thread_local! {
    /// Draws the `request_id` of answers given on this thread.
    static RNG: RefCell<ChaCha20Rng> = RefCell::new({
        let mut seed = [0u8; 32];
        rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut seed);
        ChaCha20Rng::from_seed(seed)
    });
}

/// The readers of one SQLite database beside its core thread.
pub struct Readers {
    db: PathBuf,
    pub(crate) clock: CommitClock,
    view: RwLock<Option<ReadView>>,
    idle: Mutex<Vec<ReadConn>>,
    opened: AtomicUsize,
    answered: Mutex<BTreeMap<Answered, u64>>,
    /// The latest time the node was handed ([`Readers::advance_clock`]): a reader's clock
    /// never reads earlier (the node's never goes back).
    floor: AtomicU64,
}

impl Readers {
    pub fn new(db: &Path) -> Readers {
        Readers {
            db: db.to_path_buf(),
            clock: CommitClock::default(),
            view: RwLock::new(None),
            idle: Mutex::new(Vec::new()),
            opened: AtomicUsize::new(0),
            answered: Mutex::new(BTreeMap::new()),
            floor: AtomicU64::new(0),
        }
    }

    /// The view readers answer under (`None`: they answer nothing).
    pub fn view(&self) -> Option<ReadView> {
        self.view.read().ok().and_then(|v| v.clone())
    }

    /// Replaces the view and makes readers under way drop their answers.
    pub fn set_view(&self, view: Option<ReadView>) {
        if let Ok(mut v) = self.view.write() {
            *v = view;
        }
        self.clock.changed();
    }

    /// The core thread handed the node `now`: the node's clock never goes back from it
    /// (it keeps the latest time it was given), so neither do the readers'. Without this, a
    /// wall clock stepped back would have readers serve a token the node already holds
    /// expired.
    pub fn advance_clock(&self, now: u64) {
        self.floor.fetch_max(now, SeqCst);
    }

    /// The time a read is answered at: the wall clock, never before the node's.
    fn now(&self) -> u64 {
        crate::runtime::now_ms().max(self.floor.load(SeqCst))
    }

    /// What readers answered since the last call, for the node to count.
    pub fn take_answered(&self) -> Vec<(Answered, u64)> {
        match self.answered.lock() {
            Ok(mut m) if !m.is_empty() => std::mem::take(&mut *m).into_iter().collect(),
            _ => Vec::new(),
        }
    }

    /// An idle connection, or a new one while there are fewer than [`MAX_READERS`].
    fn take_conn(&self) -> Option<ReadConn> {
        if let Some(c) = self.idle.lock().ok()?.pop() {
            return Some(c);
        }
        self.opened
            .fetch_update(SeqCst, SeqCst, |n| (n < MAX_READERS).then_some(n + 1))
            .ok()?;
        match ReadConn::open(&self.db) {
            Ok(c) => Some(c),
            Err(e) => {
                self.opened.fetch_sub(1, SeqCst);
                log::warn!("a read connection could not be opened ({e}); reads go to the core");
                None
            }
        }
    }

    fn put_back(&self, c: ReadConn) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(c);
        }
    }

    /// Answers `req` here when it is a read [`cairn_core::reads::answer`] takes and no
    /// commit or change of the view came in between; `None`: the core thread must.
    pub fn answer(&self, req: &Request) -> Option<Response> {
        // Only reads are ever taken: anything else goes to the core without touching a
        // connection.
        if !matches!(
            req.method,
            cairn_core::api::Method::Get | cairn_core::api::Method::List
        ) {
            return None;
        }
        let seq = self.clock.seq.load(SeqCst);
        if seq % 2 == 1 {
            return None;
        }
        let view = self.view()?;
        let mut conn = self.take_conn()?;
        if conn.seq != Some(seq) {
            conn.cache.get_mut().clear();
            conn.seq = Some(seq);
        }
        let commits = self.clock.commits.load(SeqCst);
        let now = self.now();
        let served = RNG.with(|rng| {
            let mut rng = rng.borrow_mut();
            cairn_core::reads::answer(&view, &conn, now, &mut rng, req)
        });
        // The reads above happen before the sequence is read again (a seqlock reader's
        // fence: an atomic load alone lets earlier plain loads, SQLite's, pass it on weakly
        // ordered processors).
        std::sync::atomic::fence(SeqCst);
        if self.clock.seq.load(SeqCst) != seq {
            // A commit or a change of view came in between: what was read may mix two
            // states, and so may the cache.
            conn.cache.get_mut().clear();
            conn.seq = None;
            self.put_back(conn);
            return None;
        }
        self.put_back(conn);
        let served = served?;
        if !self.clock.wait_durable(commits) {
            return None;
        }
        // Tallied under its own class, as the node counts its own answers: with the tally
        // full of other kinds (or unusable), the node answers and counts it instead (under
        // `other` here, it would count what the node counts under its class).
        let Ok(mut m) = self.answered.lock() else {
            return None;
        };
        if m.len() >= MAX_TALLIES && !m.contains_key(&served.answered) {
            return None;
        }
        *m.entry(served.answered).or_default() += 1;
        drop(m);
        Some(served.response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::SqliteStorage;
    use cairn_core::api::Method;
    use cairn_core::{Input, Node, Output};
    use serde_json::{json, Value};
    use std::sync::atomic::{AtomicBool, AtomicU64};
    use std::sync::Arc;

    /// A dev node on an SQLite file, with readers beside it showing the node's view.
    fn setup() -> (tempfile::TempDir, Node<SqliteStorage>, Arc<Readers>) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let db = dir.path().join("cairn.db");
        let storage = SqliteStorage::open(&db).unwrap_or_else(|e| panic!("{e}"));
        let mut node = Node::dev_over(storage, [4; 32], "root");
        node.storage_mut()
            .commit_unsynced()
            .unwrap_or_else(|e| panic!("{e}"));
        let readers = Arc::new(Readers::new(&db));
        readers.set_view(node.read_view());
        assert!(readers.view().is_some(), "an unsealed dev node has a view");
        (dir, node, readers)
    }

    /// Runs `req` on the node as the core thread does: one batch, its commit bracketed on
    /// the readers' clock and synced at once.
    fn batch(node: &mut Node<SqliteStorage>, readers: &Readers, req: Request) -> Response {
        batch_at(node, readers, req, crate::runtime::now_ms())
    }

    /// Runs `reqs` on the node as one batch of the core thread (see [`batch`]).
    fn batch_all(node: &mut Node<SqliteStorage>, readers: &Readers, reqs: Vec<Request>) {
        let _ = node.storage_mut().begin();
        for req in reqs {
            node.handle(crate::runtime::now_ms(), Input::Request(req));
        }
        while node.poll_output().is_some() {}
        if readers.view() != node.read_view() {
            readers.set_view(None);
        }
        commit(node, readers);
        readers.set_view(node.read_view());
    }

    /// Commits the node's batch as the core thread does, bracketed on the readers' clock
    /// and counted durable at once.
    fn commit(node: &mut Node<SqliteStorage>, readers: &Readers) {
        let writes = node.storage_mut().has_uncommitted_writes();
        if writes {
            readers.clock.begin_commit();
        }
        let wrote = node
            .storage_mut()
            .commit_unsynced()
            .unwrap_or_else(|e| panic!("{e}"));
        if writes {
            let n = readers.clock.end_commit(wrote);
            readers.clock.synced(n);
        }
    }

    /// [`batch`] at time `now`.
    fn batch_at(
        node: &mut Node<SqliteStorage>,
        readers: &Readers,
        req: Request,
        now: u64,
    ) -> Response {
        let id = req.id;
        let _ = node.storage_mut().begin();
        node.handle(now, Input::Request(req));
        let mut found = None;
        while let Some(o) = node.poll_output() {
            if let Output::Response(r) = o {
                if r.id == id {
                    found = Some(r);
                }
            }
        }
        commit(node, readers);
        found.unwrap_or_else(|| panic!("no answer to {id}"))
    }

    /// Writes `{"v": v}` at `secret/a` as root.
    fn put(node: &mut Node<SqliteStorage>, readers: &Readers, v: u64) {
        let put = Request::new(2, Method::Put, "secret/a")
            .with_token("root")
            .with_json(json!({ "v": v }));
        assert_eq!(batch(node, readers, put).status, 204);
    }

    /// A token root creates with `body`.
    fn token(node: &mut Node<SqliteStorage>, readers: &Readers, body: Value) -> String {
        let create = Request::new(3, Method::Post, "auth/token/create")
            .with_token("root")
            .with_json(body);
        let r = batch(node, readers, create);
        match r.body.as_ref().map(|b| b["auth"]["client_token"].clone()) {
            Some(Value::String(t)) => t,
            _ => panic!("no token: {:?}", r.body),
        }
    }

    fn get(path: &str, token: &str) -> Request {
        Request::new(1, Method::Get, path).with_token(token)
    }

    fn value(r: &Response) -> Value {
        r.body
            .as_ref()
            .map(|b| b["data"]["v"].clone())
            .unwrap_or(Value::Null)
    }

    #[test]
    fn a_reader_sees_every_committed_write_never_its_cache_of_an_older_one() {
        let (_dir, mut node, readers) = setup();
        for v in 1..=3 {
            put(&mut node, &readers, v);
            // Twice: the second from the connection's cache.
            for _ in 0..2 {
                let r = readers
                    .answer(&get("secret/a", "root"))
                    .unwrap_or_else(|| panic!("not answered beside the core"));
                assert_eq!(value(&r), json!(v));
            }
        }
        let counted = readers.take_answered();
        assert_eq!(
            counted.iter().map(|(_, n)| n).sum::<u64>(),
            6,
            "{counted:?}"
        );
        assert!(readers.take_answered().is_empty(), "handed over once");
    }

    #[test]
    fn a_revoked_token_reads_nothing_beside_the_core() {
        let (_dir, mut node, readers) = setup();
        put(&mut node, &readers, 1);
        let t = token(&mut node, &readers, json!({"policies": ["root"]}));
        assert!(readers.answer(&get("secret/a", &t)).is_some());
        let revoke = Request::new(4, Method::Post, "auth/token/revoke-self").with_token(&t);
        assert_eq!(batch(&mut node, &readers, revoke).status, 204);
        assert!(
            readers.answer(&get("secret/a", &t)).is_none(),
            "a revoked token was served from a reader's cache"
        );
    }

    #[test]
    fn nothing_is_answered_during_a_commit_or_before_what_was_read_is_durable() {
        let (_dir, mut node, readers) = setup();
        put(&mut node, &readers, 1);
        assert!(readers.answer(&get("secret/a", "root")).is_some());
        assert!(
            readers.answer(&get("secret/none", "root")).is_none(),
            "a missing key is the node's to answer"
        );
        readers.clock.begin_commit();
        assert!(
            readers.answer(&get("secret/a", "root")).is_none(),
            "answered while a commit was under way"
        );
        // A commit that wrote, not yet durable: a reader waits for its sync.
        let n = readers.clock.end_commit(true);
        let synced = Arc::new(AtomicBool::new(false));
        let syncer = std::thread::spawn({
            let (readers, synced) = (readers.clone(), synced.clone());
            move || {
                std::thread::sleep(Duration::from_millis(200));
                synced.store(true, SeqCst);
                readers.clock.synced(n);
            }
        });
        let r = readers.answer(&get("secret/a", "root"));
        let was_synced = synced.load(SeqCst);
        let _ = syncer.join();
        assert!(r.is_some(), "answered once durable");
        assert!(
            was_synced,
            "answered before the commit it could see was durable"
        );
    }

    /// The node keeps the latest time it was given; a reader must not answer at an earlier
    /// one (a wall clock stepped back): a token the node holds expired stays refused.
    #[test]
    fn a_wall_clock_stepped_back_does_not_bring_an_expired_token_back() {
        let (_dir, mut node, readers) = setup();
        put(&mut node, &readers, 1);
        let t = token(
            &mut node,
            &readers,
            json!({"policies": ["root"], "ttl": "60s"}),
        );
        assert!(readers.answer(&get("secret/a", &t)).is_some());
        // The core thread ran the node at a time past the token's TTL; the wall clock then
        // stepped back to now.
        let later = crate::runtime::now_ms() + 120_000;
        readers.advance_clock(later);
        let by_node = batch_at(&mut node, &readers, get("secret/a", &t), later);
        assert_eq!(by_node.status, 403, "the node holds the token expired");
        // From now on the node answers at `later` or after, whatever the wall clock says.
        let by_node = batch(&mut node, &readers, get("secret/a", &t));
        assert_eq!(by_node.status, 403, "the node's clock went back");
        assert!(
            readers.answer(&get("secret/a", &t)).is_none(),
            "a reader served a token the node holds expired"
        );
    }

    /// Reads of many mounts between two batches are counted under their own classes, as the
    /// node counts them, never under `other` (the readers' tally once lumped them there when
    /// it held 256 kinds: a deployment with more than 128 KV mounts read within one batch).
    #[test]
    fn a_full_tally_never_counts_a_read_under_another_class() {
        let (_dir, mut node, readers) = setup();
        put(&mut node, &readers, 1);
        if let Ok(mut m) = readers.answered.lock() {
            for i in 0..MAX_TALLIES {
                let a = Answered {
                    method: "GET",
                    class: format!("mount{i}"),
                    status: 200,
                };
                m.insert(a, 1);
            }
        }
        let served = readers.answer(&get("secret/a", "root")).is_some();
        let counted = readers.take_answered();
        assert!(
            counted.iter().all(|(a, _)| a.class != "other"),
            "a read was counted under `other`: {:?}",
            counted
                .iter()
                .filter(|(a, _)| a.class == "other")
                .collect::<Vec<_>>()
        );
        let secret: u64 = counted
            .iter()
            .filter(|(a, _)| a.class == "secret")
            .map(|(_, n)| n)
            .sum();
        assert_eq!(
            secret,
            u64::from(served),
            "answered beside the core: {served}"
        );
    }

    /// Under a stream of batches that each write `secret/a` = k and let the reader's policy
    /// read it only when k is even, readers on other threads answer only from one whole
    /// commit: never an odd value (the new value with the old policy, or a cached policy),
    /// never a value older than the last batch done before the read began.
    #[test]
    fn readers_under_a_stream_of_commits_answer_from_one_whole_commit() {
        let (_dir, mut node, readers) = setup();
        let policy = |allow: bool| {
            let caps = if allow { "[\"read\"]" } else { "[\"deny\"]" };
            Request::new(5, Method::Put, "sys/policies/acl/p")
                .with_token("root")
                .with_json(
                    json!({ "policy": format!("path \"secret/a\" {{ capabilities = {caps} }}") }),
                )
        };
        let value = |k: u64| {
            Request::new(6, Method::Put, "secret/a")
                .with_token("root")
                .with_json(json!({ "v": k }))
        };
        batch_all(&mut node, &readers, vec![value(0), policy(true)]);
        let t = token(&mut node, &readers, json!({"policies": ["p"]}));
        let done = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicU64::new(0));
        let answered = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (readers, done, acked, answered, t) = (
                    readers.clone(),
                    done.clone(),
                    acked.clone(),
                    answered.clone(),
                    t.clone(),
                );
                std::thread::spawn(move || {
                    while !done.load(SeqCst) {
                        let floor = acked.load(SeqCst);
                        let Some(r) = readers.answer(&get("secret/a", &t)) else {
                            continue;
                        };
                        let v = value_of(&r);
                        assert!(
                            v.is_multiple_of(2),
                            "answered {v}, which the policy then denied"
                        );
                        assert!(v >= floor, "answered {v} after batch {floor} was done");
                        answered.fetch_add(1, SeqCst);
                    }
                })
            })
            .collect();
        for k in 1..=300u64 {
            batch_all(
                &mut node,
                &readers,
                vec![value(k), policy(k.is_multiple_of(2))],
            );
            acked.store(k, SeqCst);
        }
        done.store(true, SeqCst);
        for th in threads {
            th.join().unwrap_or_else(|_| panic!("a reader failed"));
        }
        assert!(
            answered.load(SeqCst) > 0,
            "nothing was answered beside the core"
        );
    }

    fn value_of(r: &Response) -> u64 {
        value(r)
            .as_u64()
            .unwrap_or_else(|| panic!("no value: {:?}", r.body))
    }

    /// A core thread that dies (a panic) takes the readers' view with it: reads are not
    /// answered beside a core that answers nothing else.
    #[test]
    fn a_core_thread_that_dies_leaves_no_view_behind() {
        let (_dir, mut node, readers) = setup();
        put(&mut node, &readers, 1);
        assert!(readers.answer(&get("secret/a", "root")).is_some());
        let core = std::thread::spawn({
            let readers = readers.clone();
            move || {
                let _withdraw = Withdraw(Some(readers));
                panic!("the core thread failed");
            }
        });
        assert!(core.join().is_err());
        assert!(
            readers.answer(&get("secret/a", "root")).is_none(),
            "a read was answered beside a dead core thread"
        );
    }

    #[test]
    fn a_withdrawn_view_answers_nothing() {
        let (_dir, mut node, readers) = setup();
        put(&mut node, &readers, 1);
        assert!(readers.answer(&get("secret/a", "root")).is_some());
        readers.set_view(None);
        assert!(readers.answer(&get("secret/a", "root")).is_none());
    }
}
