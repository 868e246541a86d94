//! DR operation token end to end: real `cairn` servers (SQLite, 3-of-5 seal), a DR primary
//! and its DR secondary over the real cluster channel, and the real
//! `cairn operator generate-root -dr-token` client: the OTP flow, the PGP flow, the refusals
//! (wrong nonce, second attempt, bad and duplicate shares, deleted token), persistence across
//! a restart, the protected operations, and reindex and the Merkle check repairing a tree
//! corrupted directly in SQLite.

use base64::Engine;
use cairn_tests::{cairn_bin, note_secret, tmpdir, Resp, Server};
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BASE: &str = "sys/replication/dr/secondary/";
const ATTEMPT: &str = "sys/replication/dr/secondary/generate-operation-token/attempt";
const UPDATE: &str = "sys/replication/dr/secondary/generate-operation-token/update";
const DELETE: &str = "sys/replication/dr/secondary/operation-token/delete";

/// A hosted (licensed) server on SQLite (in a directory it owns), initialised 5/3 and
/// unsealed.
fn server(tag: &str) -> Server {
    let mut s = Server::start_owned(tag, "hosted = true");
    s.init_unseal(5, 3);
    s
}

/// An unauthenticated call (the shares and the DR operation token are the authorization).
fn anon(s: &Server, method: &str, path: &str, body: Option<Value>) -> Resp {
    s.call_as(None, method, path, body)
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs the `cairn` client against `s` with no client token.
fn cli(s: &Server, args: &[&str], stdin: Option<&str>) -> Out {
    let home = tmpdir("dr-token-home");
    let mut child = Command::new(cairn_bin())
        .args(args)
        .env("HOME", &home)
        .env("CAIRN_ADDR", &s.addr)
        .env_remove("CAIRN_TOKEN")
        .env_remove("CAIRN_FORMAT")
        .env_remove("CAIRN_NAMESPACE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cairn client");
    {
        let mut i = child.stdin.take().expect("stdin");
        if let Some(t) = stdin {
            i.write_all(t.as_bytes()).expect("write stdin");
        }
    }
    let o = child.wait_with_output().expect("wait cairn client");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn cli_json(s: &Server, args: &[&str], stdin: Option<&str>) -> Value {
    let o = cli(s, args, stdin);
    assert_eq!(o.code, 0, "cairn {args:?}: {}{}", o.stdout, o.stderr);
    serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", o.stdout))
}

fn start(s: &Server, body: Value) -> Value {
    let r = anon(s, "POST", ATTEMPT, Some(body));
    assert_eq!(r.status, 200, "start: {}", r.body);
    r.body
}

fn update(s: &Server, key: &str, nonce: &str) -> Resp {
    anon(
        s,
        "POST",
        UPDATE,
        Some(json!({ "key": key, "nonce": nonce })),
    )
}

/// The OTP flow over HTTP with `keys` (3 of them); returns the decoded token.
fn generate(s: &Server, keys: &[String]) -> String {
    let b = start(s, json!({}));
    let nonce = b["nonce"].as_str().expect("nonce").to_string();
    let otp = b["otp"].as_str().expect("otp").to_string();
    let mut last = Value::Null;
    for k in keys {
        let r = update(s, k, &nonce);
        assert_eq!(r.status, 200, "update: {}", r.body);
        last = r.body;
    }
    assert_eq!(last["complete"], json!(true), "{last}");
    let token = decode(last["encoded_token"].as_str().expect("encoded"), &otp);
    note_secret(&otp);
    note_secret(&token);
    token
}

/// The reference's decoding, written out independently of the server's code.
fn decode(encoded: &str, otp: &str) -> String {
    let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(encoded.trim_end_matches('='))
        .expect("base64");
    assert_eq!(bytes.len(), otp.len());
    String::from_utf8(bytes.iter().zip(otp.bytes()).map(|(a, b)| a ^ b).collect()).expect("utf8")
}

fn delete_token(s: &Server, token: &str) -> Resp {
    anon(
        s,
        "POST",
        DELETE,
        Some(json!({ "dr_operation_token": token })),
    )
}

#[test]
fn dr_token_cli_full_flow_survives_restart_and_delete() {
    let (p, mut s) = dr_pair();
    // A DR secondary checks shares against its primary's seal.
    let keys = p.unseal_keys.clone();

    let init = cli_json(
        &s,
        &[
            "operator",
            "generate-root",
            "-dr-token",
            "-init",
            "-format=json",
        ],
        None,
    );
    assert_eq!(init["started"], json!(true));
    assert_eq!(init["progress"], json!(0));
    assert_eq!(init["required"], json!(3));
    assert_eq!(init["complete"], json!(false));
    let otp = init["otp"].as_str().expect("otp").to_string();
    assert_eq!(init["otp_length"], json!(otp.len()));
    assert!(
        otp.len() >= 24 && otp.chars().all(|c| c.is_ascii_alphanumeric()),
        "{otp}"
    );
    let nonce = init["nonce"].as_str().expect("nonce").to_string();

    // Status (table and JSON) never shows the OTP again.
    let st = cli(
        &s,
        &["operator", "generate-root", "-dr-token", "-status"],
        None,
    );
    assert_eq!(st.code, 0, "{}", st.stderr);
    assert!(
        st.stdout.contains(&nonce) && st.stdout.contains("0/3"),
        "{}",
        st.stdout
    );
    assert!(!st.stdout.contains(&otp));
    let g = anon(&s, "GET", ATTEMPT, None);
    assert_eq!(g.status, 200);
    assert!(
        g.body.get("otp").is_none() && !g.body.to_string().contains(&otp),
        "{}",
        g.body
    );

    // One share on the command line with -nonce, one from stdin, one with the nonce looked up.
    let o = cli(
        &s,
        &[
            "operator",
            "generate-root",
            "-dr-token",
            "-nonce",
            &nonce,
            &keys[0],
        ],
        None,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("1/3"), "{}", o.stdout);
    let o = cli(
        &s,
        &[
            "operator",
            "generate-root",
            "-dr-token",
            "-nonce",
            &nonce,
            "-",
        ],
        Some(&keys[2]),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("2/3"), "{}", o.stdout);
    let last = cli_json(
        &s,
        &[
            "operator",
            "generate-root",
            "-dr-token",
            "-format=json",
            &keys[4],
        ],
        None,
    );
    assert_eq!(last["complete"], json!(true), "{last}");
    let enc = last["encoded_token"].as_str().expect("encoded").to_string();

    let o = cli(
        &s,
        &[
            "operator",
            "generate-root",
            "-dr-token",
            "-decode",
            &enc,
            "-otp",
            &otp,
        ],
        None,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let token = o.stdout.trim().to_string();
    note_secret(&otp);
    note_secret(&token);
    assert_eq!(token, decode(&enc, &otp));
    assert_eq!(token.len(), otp.len());
    // -decode without -otp is a local usage error.
    assert_eq!(
        cli(
            &s,
            &["operator", "generate-root", "-dr-token", "-decode", &enc],
            None
        )
        .code,
        1
    );

    // The attempt is over.
    let g = anon(&s, "GET", ATTEMPT, None);
    assert_eq!(g.body["started"], json!(false), "{}", g.body);

    // The token is node-local storage: it survives a restart (no TTL).
    s.kill9();
    s.restart();
    s.unseal_keys = keys.clone();
    s.unseal();
    let s2 = &s; // the restarted server

    // A wrong token or a client token changes nothing; the real one deletes it once.
    let r = delete_token(s2, "cdr.0000000000000000000000000");
    assert_eq!(r.status, 403, "{}", r.body);
    let r = delete_token(s2, &s.root_token);
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(
        r.errors().contains("not a DR operation token"),
        "{}",
        r.errors()
    );
    let r = anon(s2, "POST", DELETE, Some(json!({})));
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.errors().contains("dr_operation_token"), "{}", r.errors());
    let r = delete_token(s2, &token);
    assert_eq!(r.status, 204, "{}", r.body);
    let r = delete_token(s2, &token);
    assert_eq!(r.status, 403, "deleted token must be refused: {}", r.body);
    assert!(r.errors().contains("does not exist"), "{}", r.errors());
}

#[test]
fn dr_token_refusals_wrong_nonce_second_attempt_bad_and_duplicate_share() {
    let (p, s) = dr_pair();
    let keys = p.unseal_keys.clone();
    let b = start(&s, json!({}));
    let nonce = b["nonce"].as_str().expect("nonce").to_string();

    // A second attempt while one is active.
    let r = anon(&s, "POST", ATTEMPT, Some(json!({})));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.errors().contains("already in progress"), "{}", r.errors());

    // Wrong nonce.
    let r = update(&s, &keys[0], "2dbd10f1-8528-6246-09e7-82b25b8aba63");
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.errors().contains("nonce"), "{}", r.errors());

    // Duplicate share (hex, then the same share in base64).
    assert_eq!(update(&s, &keys[0], &nonce).status, 200);
    let b64 = base64::engine::general_purpose::STANDARD.encode(
        (0..keys[0].len() / 2)
            .map(|i| u8::from_str_radix(&keys[0][2 * i..2 * i + 2], 16).unwrap_or(0))
            .collect::<Vec<u8>>(),
    );
    let r = update(&s, &b64, &nonce);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.errors().contains("already provided"), "{}", r.errors());

    // Not a share at all: refused, progress kept.
    let r = update(&s, "zzzz", &nonce);
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(anon(&s, "GET", ATTEMPT, None).body["progress"], json!(1));

    // A corrupted share: found at the threshold, progress reset, no token created.
    let mut bad = keys[1].clone().into_bytes();
    let i = bad.len() - 3;
    bad[i] = if bad[i] == b'0' { b'1' } else { b'0' };
    let bad = String::from_utf8(bad).expect("hex");
    assert_eq!(update(&s, &keys[3], &nonce).status, 200);
    let r = update(&s, &bad, &nonce);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.errors().contains("do not reconstruct"), "{}", r.errors());
    let g = anon(&s, "GET", ATTEMPT, None).body;
    assert_eq!(
        (
            g["started"].clone(),
            g["progress"].clone(),
            g["nonce"].clone()
        ),
        (json!(true), json!(0), json!(nonce))
    );

    // Cancel; then a new attempt (new nonce) completes.
    assert_eq!(anon(&s, "DELETE", ATTEMPT, None).status, 204);
    assert_eq!(anon(&s, "GET", ATTEMPT, None).body["started"], json!(false));
    let r = update(&s, &keys[0], &nonce);
    assert_eq!(r.status, 400, "{}", r.body);
    let token = generate(&s, &keys[2..5]);
    assert_eq!(delete_token(&s, &token).status, 204);
    // Methods the paths do not take.
    assert_eq!(anon(&s, "GET", UPDATE, None).status, 405);
    assert_eq!(
        anon(&s, "GET", &format!("{BASE}operation-token/delete"), None).status,
        405
    );
}

#[test]
fn dr_token_pgp_flow_decrypts_with_the_private_key() {
    use pgp::composed::Message;
    use pgp::ser::Serialize as _;
    use pgp::types::KeyDetails;
    let (p, s) = dr_pair();
    let keys = p.unseal_keys.clone();
    let (sk, pk) = cairn_tests::pgp_keypair(42, "DR operator <dr@example.com>");
    let dir = tmpdir("drt-pgp-key");
    let file = dir.join("operator.gpg");
    std::fs::write(&file, pk.to_bytes().expect("serialize key")).expect("write key");

    let init = cli_json(
        &s,
        &[
            "operator",
            "generate-root",
            "-dr-token",
            "-init",
            "-pgp-key",
            file.to_str().unwrap_or_default(),
            "-format=json",
        ],
        None,
    );
    let fp = format!("{:x}", pk.fingerprint());
    assert_eq!(init["pgp_fingerprint"], json!(fp), "{init}");
    assert_eq!(init["otp"], json!(""));
    let nonce = init["nonce"].as_str().expect("nonce").to_string();
    assert_eq!(
        anon(&s, "GET", ATTEMPT, None).body["pgp_fingerprint"],
        json!(fp)
    );

    let mut last = Value::Null;
    for k in &keys[1..4] {
        let r = update(&s, k, &nonce);
        assert_eq!(r.status, 200, "{}", r.body);
        last = r.body;
    }
    assert_eq!(last["complete"], json!(true), "{last}");
    assert_eq!(last["pgp_fingerprint"], json!(fp));
    let raw = base64::engine::general_purpose::STANDARD
        .decode(last["encoded_token"].as_str().expect("encoded"))
        .expect("base64");
    let mut m = Message::from_bytes(raw.as_slice())
        .expect("OpenPGP message")
        .decrypt(&"".into(), &sk)
        .expect("decrypt with the private key");
    if m.is_compressed() {
        m = m.decompress().expect("decompress");
    }
    let token = String::from_utf8(m.as_data_vec().expect("data")).expect("utf8");
    assert!(token.starts_with("cdr."), "{token}");
    assert_eq!(delete_token(&s, &token).status, 204);

    // A key that is not OpenPGP is refused at start.
    let r = anon(
        &s,
        "POST",
        ATTEMPT,
        Some(json!({"pgp_key": "bm90IGEga2V5"})),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.errors().contains("pgp_key"), "{}", r.errors());
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            eprintln!("waited {:?} for {what}", t0.elapsed());
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out waiting for {what}");
}

/// A DR primary and a DR secondary that has caught up with it.
fn dr_pair() -> (Server, Server) {
    let p = server("drt-prim");
    let d = server("drt-sec");
    let r = p.post("sys/replication/dr/primary/enable", json!({}));
    assert!(r.status == 200, "dr enable: {}", r.body);
    let r = p.post(
        "sys/replication/dr/primary/secondary-token",
        json!({"id": "dr-1"}),
    );
    assert!(r.status == 200, "secondary-token: {}", r.body);
    let tok = r.body["wrap_info"]["token"]
        .as_str()
        .expect("activation token")
        .to_string();
    let r = d.post(
        "sys/replication/dr/secondary/enable",
        json!({ "token": tok }),
    );
    assert!(r.status == 200, "secondary enable: {}", r.body);
    wait_for("the DR secondary to stream", 60, || {
        let st = anon(&d, "GET", "sys/replication/dr/status", None);
        st.body["data"]["mode"] == "secondary" && st.body["data"]["state"] == "stream-wals"
    });
    (p, d)
}

#[test]
fn dr_token_on_dr_secondary_uses_the_primarys_shares() {
    let (p, d) = dr_pair();
    // The DR secondary's own (pre-activation) shares no longer open its keyring.
    let b = start(&d, json!({}));
    assert_eq!(b["required"], json!(3));
    let nonce = b["nonce"].as_str().expect("nonce").to_string();
    let mut last = Resp {
        status: 0,
        body: Value::Null,
    };
    for k in &d.unseal_keys[..3] {
        last = update(&d, k, &nonce);
    }
    assert_eq!(last.status, 400, "{}", last.body);
    assert!(
        last.errors().contains("do not reconstruct"),
        "{}",
        last.errors()
    );
    assert_eq!(anon(&d, "DELETE", ATTEMPT, None).status, 204);

    // The primary's shares do; the token authorizes promote.
    let token = generate(&d, &p.unseal_keys[..3]);
    let r = anon(
        &d,
        "POST",
        "sys/replication/dr/secondary/promote",
        Some(json!({ "dr_operation_token": token })),
    );
    assert!(
        r.status == 200,
        "promote with the DR operation token: {} {}",
        r.status,
        r.body
    );
    wait_for("the promoted cluster to be a DR primary", 30, || {
        anon(&d, "GET", "sys/replication/dr/status", None).body["data"]["mode"] == "primary"
    });
}

/// Protected operations refuse a missing, wrong or deleted token and change nothing.
#[test]
fn dr_secondary_operations_require_the_operation_token() {
    let (p, d) = dr_pair();
    let token = generate(&d, &p.unseal_keys[..3]);
    let mode = || anon(&d, "GET", "sys/replication/dr/status", None).body["data"]["mode"].clone();
    for op in [
        "promote",
        "disable",
        "update-primary",
        "reindex",
        "merkle-check",
    ] {
        let path = format!("{BASE}{op}");
        let r = anon(&d, "POST", &path, Some(json!({})));
        assert_eq!(r.status, 403, "{op} without token: {}", r.body);
        let r = anon(
            &d,
            "POST",
            &path,
            Some(json!({"dr_operation_token": "cdr.0000000000000000000000000"})),
        );
        assert_eq!(r.status, 403, "{op} with a wrong token: {}", r.body);
        let r = anon(
            &d,
            "POST",
            &path,
            Some(json!({"dr_operation_token": p.root_token})),
        );
        assert_eq!(r.status, 403, "{op} with a root token: {}", r.body);
        assert_eq!(mode(), json!("secondary"));
    }
    assert_eq!(delete_token(&d, &token).status, 204);
    let r = anon(
        &d,
        "POST",
        &format!("{BASE}promote"),
        Some(json!({ "dr_operation_token": token })),
    );
    assert_eq!(r.status, 403, "promote with a deleted token: {}", r.body);
    assert_eq!(mode(), json!("secondary"));
}

/// Flips one byte of `key`'s stored value in the SQLite file of a stopped server.
fn corrupt(db: &std::path::Path, key: &str, at: usize) {
    let c = rusqlite::Connection::open(db).expect("open db");
    let mut v: Vec<u8> = c
        .query_row(
            "SELECT value FROM kv WHERE key = ?1",
            [key.as_bytes()],
            |r| r.get(0),
        )
        .unwrap_or_else(|e| panic!("{key}: {e}"));
    let i = at.min(v.len() - 1);
    v[i] ^= 0x5a;
    c.execute(
        "UPDATE kv SET value = ?1 WHERE key = ?2",
        rusqlite::params![v, key.as_bytes()],
    )
    .expect("update");
}

/// Keys of the stopped server's SQLite file that start with `prefix`.
fn keys_with(db: &std::path::Path, prefix: &str) -> Vec<String> {
    let c = rusqlite::Connection::open(db).expect("open db");
    let mut st = c
        .prepare("SELECT key FROM kv ORDER BY key")
        .expect("prepare");
    let rows = st.query_map([], |r| r.get::<_, Vec<u8>>(0)).expect("query");
    rows.filter_map(Result::ok)
        .map(|k| String::from_utf8_lossy(&k).into_owned())
        .filter(|k| k.starts_with(prefix))
        .collect()
}

#[test]
fn merkle_check_reports_sqlite_corruption_and_reindex_repairs_it() {
    let (p, mut d) = dr_pair();
    let r = p.post("sys/mounts/secret", json!({ "type": "kv" }));
    assert!(r.status == 204, "mount: {}", r.body);
    for i in 0..40 {
        let r = p.put(&format!("secret/item{i:02}"), json!({ "v": i }));
        assert!(r.status == 204, "{}", r.body);
    }
    let root = |s: &Server| {
        anon(s, "GET", "sys/replication/dr/status", None).body["data"]["merkle_root"].clone()
    };
    wait_for("the DR secondary to catch up", 60, || root(&p) == root(&d));
    let token = generate(&d, &p.unseal_keys[..3]);
    let tok = json!({ "dr_operation_token": token });
    let check = |s: &Server| {
        let r = anon(s, "POST", &format!("{BASE}merkle-check"), Some(tok.clone()));
        assert_eq!(r.status, 200, "merkle-check: {}", r.body);
        r.body["data"]["merkle_corruption_report"].clone()
    };
    let clean = check(&d);
    assert_eq!(clean["corrupted_root"], json!(false), "{clean}");

    // Stop the DR secondary and corrupt, in SQLite, one Merkle page (a subpage sum) and one
    // replicated value of a KV mount.
    let db = d.dir.join("cairn.db");
    // A clean stop: the Merkle records the node had not written yet are written (after a
    // kill the next start rebuilds the trees from the data and the planted record is gone).
    d.terminate();
    let page = keys_with(&db, "node/merkle/r/logical/")
        .into_iter()
        .find(|k| !k.ends_with("/root"))
        .expect("a stored page");
    let value_key = keys_with(&db, "logical/")
        .into_iter()
        .nth(7)
        .expect("a value");
    // Pick the first non-zero subpage sum of the page to corrupt.
    let c = rusqlite::Connection::open(&db).expect("open");
    let bytes: Vec<u8> = c
        .query_row(
            "SELECT value FROM kv WHERE key = ?1",
            [page.as_bytes()],
            |r| r.get(0),
        )
        .expect("page");
    drop(c);
    let sub = (0..64)
        .find(|i| bytes[i * 32..i * 32 + 32].iter().any(|b| *b != 0))
        .expect("non-empty subpage");
    corrupt(&db, &page, sub * 32 + 3);
    corrupt(&db, &value_key, 0);
    d.restart();
    d.unseal_keys = p.unseal_keys.clone();
    d.unseal();

    let rep = check(&d);
    assert_eq!(rep["corrupted_root"], json!(true), "{rep}");
    let page_no: usize = page
        .rsplit('/')
        .next()
        .and_then(|x| x.parse().ok())
        .expect("page no");
    let page_sub = page
        .trim_start_matches("node/merkle/r/")
        .rsplit_once('/')
        .map(|x| x.0.to_string())
        .unwrap_or_default();
    let map = rep["corrupted_tree_map"].as_object().expect("map").clone();
    let found_page = map.values().any(|e| {
        e["subtree"] == json!(page_sub)
            && e["tree_type"] == "replicated"
            && e["corrupted_index_tuples_map"][page_no.to_string()]["corrupted"] == json!(true)
            && e["corrupted_index_tuples_map"][page_no.to_string()]["subpages"]
                .as_array()
                .is_some_and(|a| a.contains(&json!(sub)))
    });
    assert!(found_page, "page {page} subpage {sub} not reported: {rep}");
    assert!(
        map.values()
            .any(|e| e["corrupted_subtree_root"] == json!(true)),
        "the corrupted value changes its subtree's root: {rep}"
    );
    let st = anon(&d, "GET", "sys/replication/dr/status", None).body;
    assert_eq!(st["data"]["corrupted_merkle_tree"], json!(true), "{st}");
    // The CLI shows the same finding as a table and exits 2.
    let o = cli(
        &d,
        &["replication", "merkle-check", "-dr-token", &token],
        None,
    );
    assert_eq!(o.code, 2, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains("CORRUPTION FOUND") && o.stdout.contains(&page_sub),
        "{}",
        o.stdout
    );

    // Reindex: refused without the token, then repairs; the secondary re-fetches the value.
    let r = anon(
        &d,
        "POST",
        &format!("{BASE}reindex"),
        Some(json!({ "force": true })),
    );
    assert_eq!(r.status, 403, "{}", r.body);
    let o = cli(
        &d,
        &["replication", "reindex", "-dr-token", &token, "-diff"],
        None,
    );
    assert_eq!(o.code, 0, "reindex: {}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains("rebuilt the Merkle trees"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains(&value_key),
        "diff names the corrupted key: {}",
        o.stdout
    );
    wait_for("the DR secondary to re-converge", 60, || {
        root(&p) == root(&d)
    });
    let after = check(&d);
    assert_eq!(after["corrupted_root"], json!(false), "{after}");
    let o = cli(
        &d,
        &["replication", "merkle-check", "-dr-token", &token],
        None,
    );
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("clean"), "{}", o.stdout);
    assert_eq!(
        anon(&d, "GET", "sys/replication/dr/status", None).body["data"]["corrupted_merkle_tree"],
        json!(false)
    );
}
