//! Fast loading of many KV v1 keys for the growth benchmarks: the rows are written straight
//! into a stopped server's SQLite file, encrypted with the cluster's own barrier key (opened
//! here from the key shares and the stored keyring, as an unseal does), so that the server
//! reads them back the normal way. The Merkle trees do not know them until a reindex
//! (`POST sys/replication/reindex`), as with data restored behind the server's back.
//!
//! Also the baseline of the reindex: a raw scan of the same rows, hashing each as a Merkle
//! leaf.

use cairn_core::seal::{self, Barrier, SealConfig};
use rand_chacha::rand_core::SeedableRng;
use std::path::Path;
use std::time::Instant;

/// The storage key of bulk key `i` under mount `uuid`, and the API path it is read at under
/// the mount `secret/`.
pub fn key(uuid: &str, i: u64) -> (String, String) {
    (
        format!("logical/{uuid}/bulk/{i:09}"),
        format!("secret/bulk/{i:09}"),
    )
}

/// The value bulk key `i` holds (100 characters, different for every key).
pub fn value(i: u64) -> String {
    format!("{i:020}{}", "v".repeat(80))
}

/// The uuid of the mount at `path` (e.g. `secret/`) on `s`.
pub fn mount_uuid(s: &crate::Server, path: &str) -> String {
    let m = s.get("sys/mounts");
    m.body["data"][path]["uuid"]
        .as_str()
        .or_else(|| m.body[path]["uuid"].as_str())
        .unwrap_or_else(|| panic!("no uuid for mount {path}: {}", m.body))
        .to_string()
}

/// The barrier of the (stopped) server whose database is `db`, unsealed with `shares`.
pub fn barrier(db: &Path, shares: &[String]) -> Barrier {
    let c = rusqlite::Connection::open(db).expect("open db");
    let get = |k: &str| -> Vec<u8> {
        c.query_row("SELECT value FROM kv WHERE key = ?1", [k.as_bytes()], |r| {
            r.get(0)
        })
        .unwrap_or_else(|e| panic!("{k} in {}: {e}", db.display()))
    };
    let cfg: SealConfig = serde_json::from_slice(&get(seal::SEAL_CONFIG_KEY)).expect("seal config");
    let shares: Vec<Vec<u8>> = shares
        .iter()
        .map(|s| seal::decode_share(s).expect("key share"))
        .collect();
    let key = seal::recover_barrier_key(&shares, &cfg, Some(&get(seal::KEYRING_KEY)))
        .expect("the key shares open the keyring");
    let mut b = Barrier::default();
    b.unseal_with(key);
    b
}

/// Writes bulk keys `from..to` (see [`key`], [`value`]) as KV v1 values encrypted with the
/// barrier of `db` into `db` (the server stopped), in one transaction; returns the seconds
/// it took.
pub fn load(db: &Path, shares: &[String], uuid: &str, from: u64, to: u64) -> f64 {
    let t = Instant::now();
    let b = barrier(db, shares);
    let mut rng = rand_chacha::ChaCha20Rng::from_entropy();
    let mut c = rusqlite::Connection::open(db).expect("open db");
    c.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF;")
        .expect("pragmas");
    let tx = c.transaction().expect("tx");
    {
        let mut st = tx
            .prepare("INSERT OR REPLACE INTO kv (key, value) VALUES (?1, ?2)")
            .expect("prepare");
        for i in from..to {
            let (k, _) = key(uuid, i);
            let plain = serde_json::to_vec(&crate::replbench::body(&value(i))).expect("json");
            let sealed = b.encrypt(&k, &plain, &mut rng).expect("unsealed barrier");
            st.execute(rusqlite::params![k.as_bytes(), sealed])
                .expect("insert");
        }
    }
    tx.commit().expect("commit");
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
        .expect("checkpoint");
    t.elapsed().as_secs_f64()
}

/// The baseline of a reindex: every row of `db` read in key order, each hashed as a Merkle
/// leaf (SHA-256 of key and stored bytes). Returns (rows, seconds).
pub fn scan_and_hash(db: &Path) -> (u64, f64) {
    let t = Instant::now();
    let c = rusqlite::Connection::open(db).expect("open db");
    let mut st = c
        .prepare("SELECT key, value FROM kv ORDER BY key")
        .expect("prepare");
    let mut rows = st.query([]).expect("query");
    let (mut n, mut acc) = (0u64, 0u8);
    while let Ok(Some(r)) = rows.next() {
        let k: Vec<u8> = r.get(0).unwrap_or_default();
        let v: Vec<u8> = r.get(1).unwrap_or_default();
        let k = String::from_utf8(k).unwrap_or_default();
        let h = cairn_core::replication::merkle::leaf(&k, &v);
        acc ^= h[0];
        n += 1;
    }
    std::hint::black_box(acc);
    (n, t.elapsed().as_secs_f64())
}

/// `POST sys/replication/reindex` on `s` (waits for its answer, up to an hour); seconds.
pub fn reindex(s: &crate::Server) -> f64 {
    let a = crate::agent(std::time::Duration::from_secs(3600));
    let t = Instant::now();
    let r = crate::request(
        &a,
        &s.addr,
        Some(&s.root_token),
        "POST",
        "sys/replication/reindex",
        Some(&serde_json::json!({})),
    )
    .expect("reindex answered");
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(r.status, 200, "reindex: {}", r.body);
    secs
}

/// Reads `n` bulk keys of `0..total` spread evenly on `s` and counts those that did not
/// answer 200 with their value.
pub fn check_reads(s: &crate::Server, total: u64, n: u64) -> u64 {
    let a = crate::replbench::agent();
    let step = (total / n.max(1)).max(1);
    (0..total)
        .step_by(step as usize)
        .filter(|&i| {
            let (_, path) = key("", i);
            !crate::replbench::reads_back(&a, &s.addr, &s.root_token, &path, &value(i))
        })
        .count() as u64
}
