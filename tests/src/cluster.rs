//! Helpers shared by the replication end-to-end tests: licensed servers on fresh port pairs,
//! activation, status reads and waiting until a secondary caught up with its primary.

use crate::{tmpdir, Resp, Server, TEST_ISSUER_KEY, TEST_LICENSE};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Small WAL retention so a secondary kept away must resync through Merkle diff/sync.
pub const TUNING: &str = "replication {\n wal_max_entries = 50\n pull_wait_ms = 500\n}\n";

/// A free API/cluster port pair not handed out before in this process.
pub fn port() -> u16 {
    crate::fresh_port_pair()
}

/// A server with the signed test license, initialised and unsealed.
pub fn licensed(tag: &str) -> Server {
    let dir = tmpdir(tag);
    let lic = dir.join("license.json");
    std::fs::write(&lic, TEST_LICENSE).expect("write license");
    let extra = format!(
        "license_path = \"{}\"\nlicense_trusted_key = \"{TEST_ISSUER_KEY}\"\n{TUNING}",
        lic.display()
    );
    let mut s = start(&dir, &extra);
    s.own(dir);
    s.init_unseal(3, 2);
    s
}

/// Starts a server on a fresh port pair, retrying on another pair when a port was taken
/// meanwhile (outgoing connections of other tests draw local ports from the same range).
pub fn start(dir: &std::path::Path, extra: &str) -> Server {
    Server::start(dir, extra)
}

/// The body of an answer with the status the reference gives (`status`: 204 for a write
/// that returns nothing, 200 for one that returns data or warnings).
#[track_caller]
pub fn ok(status: u16, r: Resp, what: &str) -> Value {
    assert_eq!(r.status, status, "{what}: {} {}", r.status, r.body);
    r.body
}

pub fn status(s: &Server, mode: &str) -> Value {
    let r = s.call_as(None, "GET", &format!("sys/replication/{mode}/status"), None);
    assert_eq!(r.status, 200, "status: {}", r.body);
    r.body["data"].clone()
}

pub fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out waiting for {what}");
}

pub fn token(p: &Server, mode: &str, id: &str) -> String {
    let b = ok(
        200,
        p.post(
            &format!("sys/replication/{mode}/primary/secondary-token"),
            json!({ "id": id }),
        ),
        "secondary-token",
    );
    assert_eq!(b["data"], Value::Null);
    assert!(b["wrap_info"]["ttl"].as_u64() == Some(1800), "{b}");
    b["wrap_info"]["token"].as_str().expect("token").to_string()
}

pub fn enable_secondary(s: &Server, mode: &str, tok: &str) {
    ok(
        200,
        s.post(
            &format!("sys/replication/{mode}/secondary/enable"),
            json!({ "token": tok }),
        ),
        "secondary enable",
    );
}

/// The root the primary expects this secondary to reach (its filtered view).
pub fn expected_root(p: &Server, mode: &str, id: &str) -> String {
    let st = status(p, mode);
    st["secondaries"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["node_id"] == id))
        .map(|s| s["merkle_root"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default()
}

pub fn caught_up(p: &Server, s: &Server, mode: &str, id: &str) -> bool {
    let ps = status(p, mode);
    let ss = status(s, mode);
    ss["state"] == "stream-wals"
        && ss["last_remote_wal"] == ps["last_wal"]
        && ss["merkle_root"].as_str() == Some(expected_root(p, mode, id).as_str())
}

/// Waits until `s` caught up with `p`; on timeout shows both statuses.
pub fn wait_caught_up(what: &str, secs: u64, p: &Server, s: &Server, mode: &str, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if caught_up(p, s, mode, id) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "timed out waiting for {what}:\nprimary {}\nsecondary {}",
        status(p, mode),
        status(s, mode)
    );
}

/// Runs an OTP-encoded token generation on `s` with `keys` — `sys/generate-root`, or the DR
/// operation token's `sys/replication/dr/secondary/generate-operation-token` — and returns the
/// decoded token. `note` receives the OTP and the token (secrets the log scan looks for).
pub fn generate_noting(s: &Server, base: &str, keys: &[String], note: impl Fn(&str)) -> String {
    use base64::Engine;
    let data = |b: Value| {
        if b["data"].is_object() {
            b["data"].clone()
        } else {
            b
        }
    };
    let a = data(ok(
        200,
        s.call_as(None, "POST", &format!("{base}/attempt"), Some(json!({}))),
        "token generation attempt",
    ));
    let otp = a["otp"].as_str().expect("otp").to_string();
    note(&otp);
    let nonce = a["nonce"].as_str().expect("nonce").to_string();
    let mut last = Value::Null;
    for k in keys {
        last = data(ok(
            200,
            s.call_as(
                None,
                "POST",
                &format!("{base}/update"),
                Some(json!({"key": k, "nonce": nonce})),
            ),
            "token generation update",
        ));
        if last["complete"] == true {
            break;
        }
    }
    let enc = last["encoded_token"].as_str().expect("encoded token");
    let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(enc.trim_end_matches('='))
        .expect("base64");
    let token: String = bytes
        .iter()
        .zip(otp.bytes())
        .map(|(a, b)| (a ^ b) as char)
        .collect();
    note(&token);
    token
}

/// [`generate_noting`] recording the secrets for `scripts/check-secrets.sh`.
pub fn generate(s: &Server, base: &str, keys: &[String]) -> String {
    generate_noting(s, base, keys, crate::note_secret)
}

/// Promotes the DR secondary `d` with a DR operation token made from the primary's key
/// shares (the primary is gone).
pub fn promote_dr(d: &Server, keys: &[String]) {
    let op = generate(
        d,
        "sys/replication/dr/secondary/generate-operation-token",
        keys,
    );
    ok(
        200,
        d.call_as(
            None,
            "POST",
            "sys/replication/dr/secondary/promote",
            Some(json!({ "dr_operation_token": op })),
        ),
        "promote",
    );
}

/// A root token on `s` (e.g. a secondary, whose own tokens were wiped at activation) from the
/// primary's key shares.
pub fn generate_root(s: &Server, keys: &[String]) -> String {
    generate(s, "sys/generate-root", keys)
}
