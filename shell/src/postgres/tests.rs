//! Against a real PostgreSQL: `scripts/dev-postgres.sh` starts one per test process (it
//! stops when the process exits); each test works in a database of its own.
use super::*;
use std::collections::BTreeMap as Map;
use std::sync::OnceLock;
use std::time::Instant;

/// The dev server's `export` lines.
fn server() -> &'static Map<String, String> {
    static ENV: OnceLock<Map<String, String>> = OnceLock::new();
    ENV.get_or_init(|| {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let dir = std::env::temp_dir().join(format!("cairn-shell-pg-{}", std::process::id()));
        let out = std::process::Command::new("bash")
            .arg(root.join("scripts/dev-postgres.sh"))
            .arg("start")
            .arg(&dir)
            .env("CAIRN_PG_WATCH_PID", std::process::id().to_string())
            .output()
            .expect("run scripts/dev-postgres.sh");
        assert!(
            out.status.success(),
            "scripts/dev-postgres.sh start failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim_matches('\'').to_string()))
            .collect()
    })
}

/// The URL of a new, empty database named after `tag`.
fn fresh_db(tag: &str) -> String {
    let env = server();
    let mut admin = Client::connect(&env["CAIRN_PG_URL"], NoTls).expect("connect");
    let name = format!("t_{tag}");
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
        .expect("drop");
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .expect("create");
    format!(
        "postgres://{}:{}@127.0.0.1:{}/{name}?sslmode=disable",
        env["CAIRN_PG_USER"], env["CAIRN_PG_PASSWORD"], env["CAIRN_PG_PORT"]
    )
}

fn settings(url: &str) -> PgSettings {
    PgSettings::new(url, None, None).expect("settings")
}

fn put(k: &str, v: &str) -> Write {
    (k.to_string(), Some(v.as_bytes().to_vec()))
}

fn keys(rows: Vec<(String, Vec<u8>)>) -> Vec<String> {
    rows.into_iter().map(|(k, _)| k).collect()
}

/// Whether the session of `s`'s next connection runs over TLS, and its protocol version.
fn session_tls(s: &PgSettings) -> Result<(bool, String), String> {
    let mut c = s.connect()?;
    let row = c
        .query_one(
            "SELECT ssl, coalesce(version, '') FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .map_err(|e| why(&e))?;
    Ok((row.get(0), row.get(1)))
}

#[test]
fn tls_to_the_database_follows_sslmode() {
    let env = server();
    let base = fresh_db("tls").replace("?sslmode=disable", "");
    let ca = &env["CAIRN_PG_CA"];
    // Plain when asked; TLS (1.2 or newer) in every other mode the server offers it in.
    let (plain_tls, _) = session_tls(&settings(&format!("{base}?sslmode=disable"))).unwrap();
    assert!(!plain_tls, "sslmode=disable made an encrypted session");
    for url in [
        base.clone(),
        format!("{base}?sslmode=prefer"),
        format!("{base}?sslmode=require"),
        format!("{base}?sslmode=verify-ca&sslrootcert={ca}"),
        format!("{base}?sslmode=verify-full&sslrootcert={ca}"),
    ] {
        let (on, version) = session_tls(&settings(&url)).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert!(on, "{url}: the session is not encrypted");
        assert!(
            version == "TLSv1.3" || version == "TLSv1.2",
            "{url}: {version}"
        );
    }
    // The wrong CA: refused by every verifying mode, and by `require` given a root
    // certificate (libpq's rule); the message names the certificate problem.
    let other = &env["CAIRN_PG_OTHER_CA"];
    for mode in ["require", "verify-ca", "verify-full"] {
        let url = format!("{base}?sslmode={mode}&sslrootcert={other}");
        let e = session_tls(&settings(&url)).expect_err(&url);
        assert!(
            e.contains("cannot connect") && e.to_lowercase().contains("certificate"),
            "{e}"
        );
        assert!(!e.contains(&env["CAIRN_PG_PASSWORD"]), "{e}");
    }
    // verify-full checks the name: the certificate is for 127.0.0.1 and localhost, not for
    // db.invalid (reached here through `hostaddr`); verify-ca checks only the chain.
    let misnamed = format!(
        "{}&hostaddr=127.0.0.1&sslrootcert={ca}",
        base.replace("@127.0.0.1:", "@db.invalid:")
            .replacen("/t_tls", "/t_tls?x=1", 1)
            .replace("?x=1", "?connect_timeout=5")
    );
    let e = session_tls(&settings(&format!("{misnamed}&sslmode=verify-full")))
        .expect_err("a name the certificate does not carry");
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    assert!(
        session_tls(&settings(&format!("{misnamed}&sslmode=verify-ca")))
            .unwrap()
            .0
    );
}

#[test]
fn postgres_storage_contract() {
    let s = settings(&fresh_db("contract"));
    let mut st = PgStorage::open(&s).expect("open");
    st.set_read_cache(true);
    st.apply(&[
        put("a/1", "x"),
        put("a/é", "y"),
        put("a0", "z"),
        put("b", "w"),
        put("a/", "dir"),
    ])
    .unwrap();
    assert_eq!(st.get("a/1").unwrap(), Some(b"x".to_vec()));
    assert_eq!(st.get("nope").unwrap(), None);
    // Prefix-exact and in key (byte) order.
    assert_eq!(keys(st.scan("a/").unwrap()), vec!["a/", "a/1", "a/é"]);
    assert_eq!(
        keys(st.scan("").unwrap()),
        vec!["a/", "a/1", "a/é", "a0", "b"]
    );
    assert_eq!(
        keys(st.scan_after(Some("a/1"), 2).unwrap()),
        vec!["a/é", "a0"]
    );
    assert_eq!(keys(st.scan_after(None, 1).unwrap()), vec!["a/"]);
    assert_eq!(st.count().unwrap(), 5);

    // In a batch, reads see the batch's own writes; a rollback leaves nothing.
    st.begin().unwrap();
    st.apply(&[put("a/2", "new"), ("a/1".into(), None)])
        .unwrap();
    st.apply(&[put("c", "1")]).unwrap();
    assert_eq!(st.get("a/2").unwrap(), Some(b"new".to_vec()));
    assert_eq!(st.get("a/1").unwrap(), None);
    assert_eq!(keys(st.scan("a/").unwrap()), vec!["a/", "a/2", "a/é"]);
    assert_eq!(
        keys(st.scan_after(Some("a/"), 2).unwrap()),
        vec!["a/2", "a/é"]
    );
    assert_eq!(st.count().unwrap(), 6);
    st.rollback();
    assert_eq!(st.get("a/2").unwrap(), None);
    assert_eq!(st.get("a/1").unwrap(), Some(b"x".to_vec()));
    assert_eq!(st.count().unwrap(), 5);

    // Committed: another connection sees it.
    st.begin().unwrap();
    st.apply(&[put("a/2", "new"), ("a/1".into(), None)])
        .unwrap();
    assert!(st.commit(None).unwrap());
    let other = PgStorage::open(&s).expect("open");
    assert_eq!(other.get("a/2").unwrap(), Some(b"new".to_vec()));
    assert_eq!(other.get("a/1").unwrap(), None);
    // A batch that wrote nothing commits nothing.
    st.begin().unwrap();
    assert!(!st.commit(None).unwrap());

    // A commit that fails (a trigger refuses the key `bad`) leaves nothing of the batch,
    // and the next batch works.
    let mut admin = s.connect().unwrap();
    admin
        .batch_execute(
            "CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN \
                   IF NEW.key = '\\x626164'::bytea THEN RAISE EXCEPTION 'refused'; END IF; \
                   RETURN NEW; END $$ LANGUAGE plpgsql;
                 CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON cairn_kv \
                   FOR EACH ROW EXECUTE FUNCTION refuse();",
        )
        .unwrap();
    st.begin().unwrap();
    st.apply(&[put("d", "1"), ("b".into(), None)]).unwrap();
    st.apply(&[put("bad", "1")]).unwrap();
    let e = st.commit(None).unwrap_err();
    assert!(
        matches!(&e, StorageError::Io(m) if m.contains("refused")),
        "{e:?}"
    );
    assert_eq!(other.get("d").unwrap(), None);
    assert_eq!(other.get("b").unwrap(), Some(b"w".to_vec()));
    assert_eq!(st.get("d").unwrap(), None);
    st.begin().unwrap();
    st.apply(&[put("e", "1")]).unwrap();
    assert!(st.commit(None).unwrap());
    assert_eq!(other.get("e").unwrap(), Some(b"1".to_vec()));

    // The read cache is kept exact by this storage's own commits, and assumes it is the
    // only writer: another writer's change shows once the cache starts over.
    assert_eq!(st.get("e").unwrap(), Some(b"1".to_vec()));
    assert_eq!(st.scan("a/").unwrap().len(), 3);
    admin
        .batch_execute(
            "DROP TRIGGER refuse ON cairn_kv; DELETE FROM cairn_kv WHERE key = '\\x65'::bytea",
        )
        .unwrap();
    assert_eq!(
        st.get("e").unwrap(),
        Some(b"1".to_vec()),
        "served from the cache"
    );
    st.set_read_cache(true);
    assert_eq!(st.get("e").unwrap(), None);
    st.begin().unwrap();
    st.apply(&[put("a/3", "3")]).unwrap();
    assert!(st.commit(None).unwrap());
    assert_eq!(st.scan("a/").unwrap().len(), 4);
    assert_eq!(other.scan("a/").unwrap().len(), 4);
}

/// Reads in a batch agree with memory storage after the same writes, whatever the mix
/// of stored keys and the batch's puts and deletes (scan_after's merge in particular).
#[test]
fn postgres_batch_reads_match_memory_storage() {
    batch_reads_match_memory_storage(false);
    batch_reads_match_memory_storage(true);
}

fn batch_reads_match_memory_storage(cached: bool) {
    use cairn_core::storage::MemStorage;
    let s = settings(&fresh_db(&format!("merge_{cached}")));
    let mut st = PgStorage::open(&s).expect("open");
    st.set_read_cache(cached);
    let mut mem = MemStorage::new();
    let mut seed: u64 = 0x5eed;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let base: Vec<Write> = (0..40)
        .map(|_| (format!("p/{:02}", next(60)), Some(vec![next(9) as u8])))
        .collect();
    st.apply(&base).unwrap();
    mem.apply(&base).unwrap();
    for round in 0..12 {
        st.begin().unwrap();
        let mut expect = mem.clone();
        for _ in 0..next(20) {
            let k = format!("p/{:02}", next(60));
            let w: Write = if next(2) == 0 {
                (k, None)
            } else {
                (k, Some(vec![next(9) as u8]))
            };
            st.apply(std::slice::from_ref(&w)).unwrap();
            expect.apply(&[w]).unwrap();
        }
        for after in [None, Some("p/"), Some("p/10"), Some("p/33"), Some("p/59")] {
            for limit in [1, 3, 7, 100] {
                assert_eq!(
                    st.scan_after(after, limit).unwrap(),
                    expect.scan_after(after, limit).unwrap(),
                    "round {round}, after {after:?}, limit {limit}"
                );
            }
        }
        assert_eq!(st.scan("p/1").unwrap(), expect.scan("p/1").unwrap());
        // Several keys at once (some cached, some written in the batch, some absent, one
        // asked twice) read as one by one.
        let many: Vec<String> = (0..12).map(|_| format!("p/{:02}", next(62))).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).chain(["p/00"]).collect();
        let one_by_one: Vec<Option<Vec<u8>>> =
            many.iter().map(|k| expect.get(k).unwrap()).collect();
        assert_eq!(st.get_many(&many).unwrap(), one_by_one, "round {round}");
        assert_eq!(
            st.count().unwrap(),
            expect.count().unwrap(),
            "round {round}"
        );
        if round % 3 == 0 {
            st.rollback();
        } else {
            st.commit(None).unwrap();
            mem = expect;
        }
        assert_eq!(st.scan("").unwrap(), mem.scan("").unwrap());
    }
}

#[test]
fn postgres_newer_schema_version_is_refused() {
    let url = fresh_db("schema");
    let s = settings(&url);
    drop(PgStorage::open(&s).expect("open"));
    // Opening again: same version, fine.
    drop(PgStorage::open(&s).expect("open again"));
    let mut admin = s.connect().unwrap();
    admin
        .batch_execute("UPDATE cairn_schema SET version = 7")
        .unwrap();
    let e = PgStorage::open(&s).err().expect("refused");
    assert!(e.contains("schema version 7"), "{e}");
    assert!(e.contains(&format!("version {SCHEMA_VERSION}")), "{e}");
    assert!(!e.contains(&server()["CAIRN_PG_PASSWORD"]), "{e}");
}

#[test]
fn postgres_lease_fences_the_old_holder() {
    let s = settings(&fresh_db("lease"));
    let mut st_a = PgStorage::open(&s).expect("open");
    let mut st_b = PgStorage::open(&s).expect("open");
    let mut a = PgLease::connect(&s).unwrap();
    let mut b = PgLease::connect(&s).unwrap();
    assert_eq!(a.leader().unwrap(), None);
    let ttl = Duration::from_millis(800);
    let mut held_a = a
        .try_acquire("a", "http://a:8200", "https://a:8201", ttl)
        .unwrap()
        .expect("A takes the free lease");
    assert!(held_a.epoch >= 1);
    assert!(held_a.valid_until <= Instant::now() + ttl);
    // B cannot while A holds it; A can renew.
    assert_eq!(
        b.try_acquire("b", "http://b", "https://b", ttl).unwrap(),
        None
    );
    assert!(a.renew(&mut held_a, ttl).unwrap());
    let l = b.leader().unwrap().expect("a leader");
    assert_eq!(
        (l.epoch, l.node_id.as_str(), l.api_addr.as_str()),
        (held_a.epoch, "a", "http://a:8200")
    );
    assert!(l.remaining_ms > 0 && l.remaining_ms <= 800, "{l:?}");
    // A's fenced commit goes through while it holds the lease.
    st_a.begin().unwrap();
    st_a.apply(&[put("k", "from-a")]).unwrap();
    assert!(st_a.commit(Some(held_a.epoch)).unwrap());

    // A's lease expires (A stopped renewing): B takes it at a higher epoch.
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(b.leader().unwrap(), None, "expired");
    let held_b = b
        .try_acquire(
            "b",
            "http://b:8200",
            "https://b:8201",
            Duration::from_secs(30),
        )
        .unwrap()
        .expect("B takes the expired lease");
    assert!(held_b.epoch > held_a.epoch);
    assert!(!a.renew(&mut held_a, ttl).unwrap(), "A's renewal must fail");
    assert!(!a.release(&held_a).unwrap(), "A has nothing to release");
    // A's fenced commit is refused whole and writes nothing (nor deletes anything).
    st_a.begin().unwrap();
    // The batch's last write of `k` is a delete: the statement carries a put and a delete.
    st_a.apply(&[
        put("k", "stale"),
        put("k2", "stale"),
        ("k".to_string(), None),
    ])
    .unwrap();
    let e = st_a.commit(Some(held_a.epoch)).unwrap_err();
    assert_eq!(
        e,
        StorageError::Fenced {
            held: Some(held_a.epoch),
            current: held_b.epoch
        }
    );
    assert!(e.to_string().contains("lost leadership"), "{e}");
    assert_eq!(st_b.get("k").unwrap(), Some(b"from-a".to_vec()));
    assert_eq!(st_b.get("k2").unwrap(), None);
    // B's commit succeeds (fenced as the runtime does: through the shared handle).
    st_b.set_fence_mode(FenceMode::Epoch(held_b.epoch));
    assert_eq!(st_b.fence_mode(), FenceMode::Epoch(held_b.epoch));
    let mut shell_b = crate::storage::ShellStorage::Postgres(st_b);
    shell_b.begin().unwrap();
    shell_b.apply(&[put("k", "from-b")]).unwrap();
    assert!(shell_b.commit_unsynced().unwrap());
    let crate::storage::ShellStorage::Postgres(mut st_b) = shell_b else {
        unreachable!()
    };
    assert_eq!(st_a.get("k").unwrap(), Some(b"from-b".to_vec()));
    // A standby writes nothing; a batch that only reads is fine.
    st_a.set_fence_mode(FenceMode::Standby);
    st_a.begin().unwrap();
    assert!(!st_a.commit_mode(st_a.fence_mode()).unwrap());
    st_a.begin().unwrap();
    st_a.apply(&[put("k", "standby")]).unwrap();
    let e = st_a.commit_mode(st_a.fence_mode()).unwrap_err();
    assert_eq!(
        e,
        StorageError::Fenced {
            held: None,
            current: held_b.epoch
        }
    );
    assert!(e.to_string().contains("standby"), "{e}");
    assert_eq!(st_a.apply(&[put("k", "standby")]), Err(e));
    assert_eq!(st_b.get("k").unwrap(), Some(b"from-b".to_vec()));

    // The node registry.
    a.echo("a", "http://a:8200", "https://a:8201", "0.1.0")
        .unwrap();
    b.echo("b", "http://b:8200", "https://b:8201", "0.1.0")
        .unwrap();
    a.echo("a", "http://a:9200", "https://a:9201", "0.1.1")
        .unwrap();
    let nodes = b.nodes().unwrap();
    assert_eq!(nodes.len(), 2);
    assert_eq!(
        (
            nodes[0].node_id.as_str(),
            nodes[0].api_addr.as_str(),
            nodes[0].version.as_str()
        ),
        ("a", "http://a:9200", "0.1.1")
    );
    assert!(
        nodes[1].age_ms >= 0 && nodes[1].age_ms < 60_000,
        "{nodes:?}"
    );

    // B steps down: the epoch moves on (B's own fenced commits are refused), and another
    // node can take the lease at once.
    assert!(b.release(&held_b).unwrap());
    assert_eq!(a.leader().unwrap(), None);
    st_b.begin().unwrap();
    st_b.apply(&[put("k", "after-release")]).unwrap();
    assert!(matches!(
        st_b.commit(Some(held_b.epoch)),
        Err(StorageError::Fenced { .. })
    ));
    let held_a2 = a
        .try_acquire("a", "http://a:8200", "https://a:8201", ttl)
        .unwrap()
        .expect("A takes the released lease");
    assert!(held_a2.epoch > held_b.epoch);
    assert_eq!(a.epoch().unwrap(), held_a2.epoch);
}

/// A commit that checked its epoch holds the lease row until it ends: a take-over waits.
/// Node `b` tries to take the lease on a thread of its own, and is still waiting 500 ms
/// later (a commit in flight holds the lease row); the thread answers once it has it.
fn takeover_waiting(s: &PgSettings) -> std::thread::JoinHandle<Option<Held>> {
    let s2 = s.clone();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let mut b = PgLease::connect(&s2).unwrap();
        let r = b
            .try_acquire("b", "x", "y", Duration::from_secs(5))
            .unwrap();
        let _ = done_tx.send(());
        r
    });
    assert!(
        done_rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "the take-over did not wait for the commit in flight"
    );
    t
}

/// Commits `k` = `value` and a delete of `gone` under `epoch` on a thread of its own, and
/// checks that the commit is still waiting 300 ms later (on a row lock another session
/// holds); the thread answers with the storage and the commit's result.
fn commit_waiting(
    mut st: PgStorage,
    value: &'static str,
    epoch: u64,
) -> std::thread::JoinHandle<(PgStorage, Result<bool, StorageError>)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let writer = std::thread::spawn(move || {
        st.begin().unwrap();
        st.apply(&[put("k", value), ("gone".to_string(), None)])
            .unwrap();
        let r = st.commit(Some(epoch));
        let _ = tx.send(());
        (st, r)
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "the commit did not wait for the row lock"
    );
    writer
}

/// A fresh database, a storage on it, and the lease taken by node `a` for `ttl` (its
/// session kept open: a holder's ended session frees the lease).
fn leased_storage(name: &str, ttl: Duration) -> (PgSettings, PgStorage, Held, PgLease) {
    let s = settings(&fresh_db(name));
    let st = PgStorage::open(&s).expect("open");
    let mut a = PgLease::connect(&s).unwrap();
    let held = a.try_acquire("a", "x", "y", ttl).unwrap().expect("lease");
    (s, st, held, a)
}

#[test]
fn postgres_takeover_waits_for_a_fenced_commit_in_flight() {
    let s = settings(&fresh_db("linear"));
    drop(PgStorage::open(&s).expect("open"));
    let mut a = PgLease::connect(&s).unwrap();
    let held = a
        .try_acquire("a", "x", "y", Duration::from_millis(100))
        .unwrap()
        .expect("lease");
    std::thread::sleep(Duration::from_millis(200));
    // A commit in flight: the fence's row lock taken, not yet committed.
    let mut c = s.connect().unwrap();
    let mut tx = c.transaction().unwrap();
    let row = tx
        .query_one(
            "SELECT epoch FROM cairn_ha_lock WHERE id = 1 FOR SHARE",
            &[],
        )
        .unwrap();
    assert_eq!(row.get::<_, i64>(0) as u64, held.epoch);
    let t = takeover_waiting(&s);
    tx.execute(
        "INSERT INTO cairn_kv (key, value) VALUES ('\\x6b'::bytea, '\\x31'::bytea)",
        &[],
    )
    .unwrap();
    tx.commit().unwrap();
    let held_b = t
        .join()
        .unwrap()
        .expect("B takes the lease after the commit");
    assert!(held_b.epoch > held.epoch);
}

/// The storage's own commit statement, held up on a row lock after its fence: a take-over
/// waits for it (the lease row is share-locked before any row is written), the write lands
/// under the old epoch, and the old holder's next commit is refused.
#[test]
fn a_takeover_waits_for_the_storage_commit_in_flight() {
    let (s, mut st, held, _a) = leased_storage("inflight", Duration::from_millis(100));
    st.begin().unwrap();
    st.apply(&[put("k", "before")]).unwrap();
    assert!(st.commit(Some(held.epoch)).unwrap());
    std::thread::sleep(Duration::from_millis(200));
    // Another session holds the row `k`: the storage's upsert will wait for it.
    let mut blocker = s.connect().unwrap();
    let mut btx = blocker.transaction().unwrap();
    btx.query_one(
        "SELECT value FROM cairn_kv WHERE key = '\\x6b'::bytea FOR UPDATE",
        &[],
    )
    .unwrap();
    let writer = commit_waiting(st, "in-flight", held.epoch);
    let taker = takeover_waiting(&s);
    btx.commit().unwrap();
    let (mut st, r) = writer.join().unwrap();
    assert_eq!(r, Ok(true), "the commit in flight holds the lease's epoch");
    let held_b = taker.join().unwrap().expect("B takes the lease after it");
    assert!(held_b.epoch > held.epoch);
    assert_eq!(st.get("k").unwrap(), Some(b"in-flight".to_vec()));
    st.begin().unwrap();
    st.apply(&[put("k", "stale")]).unwrap();
    assert_eq!(
        st.commit(Some(held.epoch)),
        Err(StorageError::Fenced {
            held: Some(held.epoch),
            current: held_b.epoch
        })
    );
    assert_eq!(st.get("k").unwrap(), Some(b"in-flight".to_vec()));
}

/// A prefetch reads the keys into the read cache in one query, the absent ones as absent:
/// the later reads are answered from it (a change made behind the cache's back shows that).
/// Without the cache (a standby, or several writers) it reads nothing.
#[test]
fn a_prefetch_fills_the_read_cache_with_values_and_absences() {
    let s = settings(&fresh_db("prefetch"));
    let mut st = PgStorage::open(&s).expect("open");
    commit_one(&mut st, "a", "1").unwrap();
    let mut other = s.connect().unwrap();
    let behind = |c: &mut postgres::Client, k: &str, v: &str| {
        c.execute(
            "INSERT INTO cairn_kv (key, value) VALUES ($1, $2) \
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            &[&k.as_bytes(), &v.as_bytes()],
        )
        .unwrap();
    };
    // Off: nothing is cached, reads see the database.
    st.prefetch(&["a".to_string(), "b".to_string()]);
    behind(&mut other, "a", "2");
    assert_eq!(st.get("a").unwrap(), Some(b"2".to_vec()));
    // On: the value of `a` and the absence of `b` are held from the prefetch.
    st.set_read_cache(true);
    st.prefetch(&["a".to_string(), "b".to_string()]);
    behind(&mut other, "a", "3");
    behind(&mut other, "b", "3");
    assert_eq!(st.get("a").unwrap(), Some(b"2".to_vec()));
    assert_eq!(st.get("b").unwrap(), None);
    // The open batch's own writes win over anything prefetched.
    st.begin().unwrap();
    st.apply(&[put("c", "mine")]).unwrap();
    behind(&mut other, "c", "theirs");
    st.prefetch(&["c".to_string()]);
    assert_eq!(st.get("c").unwrap(), Some(b"mine".to_vec()));
    assert!(st.commit(None).unwrap());
    assert_eq!(st.get("c").unwrap(), Some(b"mine".to_vec()));
}

#[test]
fn postgres_connection_errors_name_the_server_not_the_password() {
    let env = server();
    let pw = env["CAIRN_PG_PASSWORD"].as_str();
    let port = env["CAIRN_PG_PORT"].as_str();
    // A wrong password.
    let url = format!("postgres://cairn:wrong-{pw}@127.0.0.1:{port}/cairn?sslmode=disable");
    let e = PgStorage::open(&settings(&url)).err().expect("refused");
    assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
    assert!(e.contains("password authentication failed"), "{e}");
    assert!(!e.contains(pw), "{e}");
    // Nothing listening.
    let e = PgStorage::open(&settings(&env["CAIRN_PG_DEAD_URL"]))
        .err()
        .expect("refused");
    let dead_port = env["CAIRN_PG_DEAD_URL"]
        .rsplit(':')
        .next()
        .and_then(|p| p.split('/').next())
        .unwrap();
    assert!(e.contains(&format!("127.0.0.1:{dead_port}")), "{e}");
    assert!(e.to_lowercase().contains("refused"), "{e}");
    assert!(!e.contains(pw), "{e}");
    // A URL that does not parse, and a verifying TLS mode without its CA.
    let e =
        PgSettings::new("postgres://cairn:secret@127.0.0.1:notaport/x", None, None).unwrap_err();
    assert!(e.contains("not a valid PostgreSQL URL"), "{e}");
    assert!(!e.contains("secret"), "{e}");
    let e = PgSettings::new(
        "postgres://cairn:secret@127.0.0.1/x?sslmode=verify-full",
        None,
        None,
    )
    .unwrap_err();
    assert!(e.contains("needs sslrootcert"), "{e}");
    assert!(!e.contains("secret"), "{e}");
    assert!(PgSettings::new("postgres://u@h/db", Some("Bad-Name"), None).is_err());
    assert!(PgSettings::new("postgres://u@h/db", Some("same"), Some("same")).is_err());
    let ok = PgSettings::new("postgres://u:pw@h:5433/db?sslmode=prefer", None, None).unwrap();
    assert_eq!(ok.target, "h:5433 (database db, user u), sslmode=prefer");
    assert!(!format!("{ok:?}").contains("pw"));
}

/// The backend pid of the storage's own session.
fn storage_pid(st: &PgStorage) -> i32 {
    st.with_conn(|c| c.client.query_one("SELECT pg_backend_pid()", &[]))
        .expect("pid")
        .get(0)
}

/// Commits one batch of `k = v` under no fence.
fn commit_one(st: &mut PgStorage, k: &str, v: &str) -> Result<bool, StorageError> {
    st.begin().expect("begin");
    st.apply(&[put(k, v)]).expect("apply");
    st.commit(None)
}

/// Pipelined: the storage's session commits without waiting for the WAL flush, each commit
/// leaves a ticket, and one barrier on the flush connection confirms them all and leaves
/// the WAL flushed past them; the flush table holds one row, updated once per barrier.
#[test]
fn pipelined_commits_are_confirmed_by_one_barrier_that_flushes_past_them() {
    let url = fresh_db("pipe");
    let mut st = PgStorage::open(&settings(&url)).expect("open");
    // Not pipelined: no tickets, commits are durable at COMMIT.
    assert!(commit_one(&mut st, "before", "0").unwrap());
    assert!(st.take_tickets().is_empty());

    let mut flush = st.pipeline().expect("pipeline");
    let sync: String = st
        .with_conn(|c| c.client.query_one("SHOW synchronous_commit", &[]))
        .unwrap()
        .get(0);
    assert_eq!(sync, "off");
    assert!(commit_one(&mut st, "a", "1").unwrap());
    assert!(commit_one(&mut st, "b", "2").unwrap());
    let lsn: String = st
        .with_conn(|c| {
            c.client
                .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        })
        .unwrap()
        .get(0);
    let tickets = st.take_tickets();
    assert_eq!(tickets.len(), 2, "{tickets:?}");
    assert_eq!(tickets[0], tickets[1], "same flush generation and server");
    assert!(st.take_tickets().is_empty(), "taken once");
    // A batch that writes nothing leaves none.
    st.begin().unwrap();
    assert!(!st.commit(None).unwrap());
    assert!(st.take_tickets().is_empty());

    assert!(flush.confirm(&tickets).iter().all(Result::is_ok));
    let mut other = Client::connect(&url, NoTls).expect("connect");
    let row = other
        .query_one(
            "SELECT pg_current_wal_flush_lsn() >= $1::text::pg_lsn, \
             (SELECT n FROM cairn_kv_flush WHERE id = 1), \
             (SELECT count(*) FROM cairn_kv_flush)",
            &[&lsn],
        )
        .unwrap();
    assert!(row.get::<_, bool>(0), "the WAL is flushed past the commits");
    assert_eq!((row.get::<_, i64>(1), row.get::<_, i64>(2)), (1, 1));
    let st2 = PgStorage::open(&settings(&url)).expect("open");
    assert_eq!(st2.get("b").unwrap(), Some(b"2".to_vec()));
    // Nothing to confirm: no barrier.
    assert!(flush.confirm(&[]).is_empty());
}

/// A ticket is honoured only by a barrier on the server that took the commit and on a flush
/// connection already open when its transaction began.
#[test]
fn a_ticket_of_another_server_or_flush_generation_is_not_confirmed() {
    let url = fresh_db("ticket");
    let mut st = PgStorage::open(&settings(&url)).expect("open");
    let mut flush = st.pipeline().expect("pipeline");
    assert!(commit_one(&mut st, "a", "1").unwrap());
    let t = st.take_tickets().pop().expect("ticket");
    let elsewhere = Ticket {
        server: "1999-01-01 00:00:00+00".into(),
        ..t.clone()
    };
    let older = Ticket {
        gen: t.gen - 1,
        ..t.clone()
    };
    let v = flush.confirm(&[t, elsewhere, older]);
    assert!(v[0].is_ok(), "{v:?}");
    assert!(
        v[1].as_ref()
            .is_err_and(|e| e.contains("another database server")),
        "{v:?}"
    );
    assert!(
        v[2].as_ref().is_err_and(|e| e.contains("reopened")),
        "{v:?}"
    );
    // The failure refuses the storage's next commit (the node reloads), then commits resume.
    let e = commit_one(&mut st, "c", "3").expect_err("refused");
    assert!(e.to_string().contains("may have been lost"), "{e}");
    assert!(st.take_tickets().is_empty());
    assert!(commit_one(&mut st, "d", "4").unwrap());
    assert_eq!(
        st.get("c").unwrap(),
        None,
        "the refused batch wrote nothing"
    );
}

/// The flush connection breaks (its session terminated, as a database restart would): the
/// batches waiting for it fail, the storage's next commit is refused, and later batches
/// are confirmed on the reopened flush connection.
#[test]
fn a_broken_flush_connection_fails_its_batches_and_refuses_the_next_commit() {
    let url = fresh_db("flushbreak");
    let mut st = PgStorage::open(&settings(&url)).expect("open");
    let mut flush = st.pipeline().expect("pipeline");
    assert!(commit_one(&mut st, "a", "1").unwrap());
    let t1 = st.take_tickets();
    assert!(flush.confirm(&t1).iter().all(Result::is_ok));
    assert!(commit_one(&mut st, "b", "2").unwrap());
    let t2 = st.take_tickets();
    let mut admin = Client::connect(&url, NoTls).expect("connect");
    let killed: i64 = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND query LIKE 'UPDATE cairn_kv_flush%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(killed, 1);
    std::thread::sleep(Duration::from_millis(100));
    let v = flush.confirm(&t2);
    assert!(v.len() == 1 && v[0].is_err(), "{v:?}");
    assert!(
        commit_one(&mut st, "c", "3").is_err(),
        "refused after the loss"
    );
    assert!(commit_one(&mut st, "d", "4").unwrap());
    let t4 = st.take_tickets();
    assert_eq!(t4.len(), 1);
    assert!(t4[0].gen > t2[0].gen, "{t4:?} {t2:?}");
    assert!(flush.confirm(&t4).iter().all(Result::is_ok));
}

/// The storage's own session breaks while a commit is unconfirmed (the server may have lost
/// it): the reconnected storage refuses its next commit, so that the node reloads its state
/// before it builds on what may be gone; then it commits again.
#[test]
fn a_reconnect_with_unconfirmed_commits_refuses_the_next_commit() {
    let url = fresh_db("corebreak");
    let mut st = PgStorage::open(&settings(&url)).expect("open");
    let mut flush = st.pipeline().expect("pipeline");
    assert!(commit_one(&mut st, "a", "1").unwrap());
    let t1 = st.take_tickets();
    let pid = storage_pid(&st);
    let mut admin = Client::connect(&url, NoTls).expect("connect");
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // The first use finds the session gone (an error like any broken commit's), the next
    // reconnects and is refused.
    assert!(commit_one(&mut st, "b", "2").is_err());
    let e = commit_one(&mut st, "b", "2").expect_err("refused");
    assert!(e.to_string().contains("may have been lost"), "{e}");
    assert_ne!(storage_pid(&st), pid, "reconnected");
    assert!(commit_one(&mut st, "c", "3").unwrap());
    let mut all = t1;
    all.extend(st.take_tickets());
    // The server did not restart: the first commit is durable too.
    assert!(flush.confirm(&all).iter().all(Result::is_ok));
    assert_eq!(st.get("b").unwrap(), None);
    assert_eq!(st.get("a").unwrap(), Some(b"1".to_vec()));

    // With everything confirmed, a reconnect refuses nothing.
    let pid = storage_pid(&st);
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(commit_one(&mut st, "d", "4").is_err(), "the broken session");
    assert!(commit_one(&mut st, "d", "4").unwrap());
}

/// A fenced batch of deletes only, and one mixing a delete with puts, write nothing
/// (the existing fence test's batch ends up without any delete: its last write of `k` is a
/// put). With the cache on, the fenced keys are forgotten, not taken.
#[test]
fn a_fenced_commit_deletes_nothing() {
    let (s, mut st, held, _a) = leased_storage("fencedel", Duration::from_millis(100));
    st.set_read_cache(true);
    st.begin().unwrap();
    st.apply(&[put("k", "1"), put("j", "1")]).unwrap();
    assert!(st.commit(Some(held.epoch)).unwrap());
    assert_eq!(st.get("k").unwrap(), Some(b"1".to_vec()));
    std::thread::sleep(Duration::from_millis(200));
    let mut b = PgLease::connect(&s).unwrap();
    let held_b = b
        .try_acquire("b", "x", "y", Duration::from_secs(30))
        .unwrap()
        .expect("B takes the lease");
    let fenced = Err(StorageError::Fenced {
        held: Some(held.epoch),
        current: held_b.epoch,
    });
    // Deletes only.
    st.begin().unwrap();
    st.apply(&[("k".to_string(), None)]).unwrap();
    assert_eq!(st.commit(Some(held.epoch)), fenced);
    // A delete and a put.
    st.begin().unwrap();
    st.apply(&[("j".to_string(), None), put("n", "stale")])
        .unwrap();
    assert_eq!(st.commit(Some(held.epoch)), fenced);
    let mut other = PgStorage::open(&s).expect("open");
    assert_eq!(other.get("k").unwrap(), Some(b"1".to_vec()));
    assert_eq!(other.get("j").unwrap(), Some(b"1".to_vec()));
    assert_eq!(other.get("n").unwrap(), None);
    // The writer's cache agrees with the database.
    assert_eq!(st.get("k").unwrap(), Some(b"1".to_vec()));
    assert_eq!(st.get("j").unwrap(), Some(b"1".to_vec()));
    assert_eq!(st.get("n").unwrap(), None);
    other.begin().unwrap();
    other.apply(&[put("k", "b")]).unwrap();
    assert!(other.commit(Some(held_b.epoch)).unwrap());
}

/// A commit whose statement waits on a take-over's uncommitted epoch `UPDATE` (the
/// row lock), then finds the row changed (EvalPlanQual): it writes nothing and reports the
/// new epoch, not the one in its snapshot.
#[test]
fn a_commit_waiting_on_a_takeover_reports_the_new_epoch() {
    let (s, st, held, _a) = leased_storage("epq", Duration::from_secs(30));
    let mut taker = s.connect().unwrap();
    let mut ttx = taker.transaction().unwrap();
    let new: i64 = ttx
        .query_one(
            "UPDATE cairn_ha_lock SET epoch = epoch + 1, holder = 'b' WHERE id = 1 \
             RETURNING epoch",
            &[],
        )
        .unwrap()
        .get(0);
    let writer = commit_waiting(st, "stale", held.epoch);
    ttx.commit().unwrap();
    let (st, r) = writer.join().unwrap();
    assert_eq!(
        r,
        Err(StorageError::Fenced {
            held: Some(held.epoch),
            current: new as u64
        })
    );
    assert_eq!(st.get("k").unwrap(), None);
}
