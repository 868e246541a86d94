//! End-to-end test harness: starts real `cairn` processes on free loopback ports, talks to
//! them over HTTP, and stops them (gracefully or with `kill -9`).

pub mod bulk;
pub mod cluster;
pub mod flood;
pub mod growth;
pub mod keepalive;
pub mod kill9;
pub mod loadgen;
pub mod raw;
pub mod replbench;
mod server;
pub mod tls_hello;

pub use server::{Launch, Server, StartError};

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `cairn` binary, built on demand next to this test binary.
pub fn cairn_bin() -> PathBuf {
    if let Ok(p) = std::env::var("CAIRN_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    let mut dir = exe.parent().expect("exe dir");
    if dir.ends_with("deps") {
        dir = dir.parent().expect("target dir");
    }
    let bin = dir.join("cairn");
    static BUILD: std::sync::Once = std::sync::Once::new();
    BUILD.call_once(|| {
        let ok = Command::new(env!("CARGO"))
            .args(["build", "-p", "cairn", "--bin", "cairn"])
            .arg(if dir.ends_with("release") {
                "--release"
            } else {
                "--quiet"
            })
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            eprintln!("warning: building cairn failed; using the existing binary if there is one");
        }
    });
    assert!(bin.exists(), "no cairn binary at {}", bin.display());
    bin
}

/// Where every server started by the harness writes its log (stderr), and where the
/// secrets the tests handle are recorded, so `scripts/check-secrets.sh` can prove that no
/// log line contains one.
/// The servers' log level: `CAIRN_E2E_LOG_LEVEL`, default `debug` (benchmarks set `info`:
/// a debug log measures the logger).
pub fn log_level() -> String {
    std::env::var("CAIRN_E2E_LOG_LEVEL").unwrap_or_else(|_| "debug".into())
}

pub fn log_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let d = dir.join("e2e-logs");
    std::fs::create_dir_all(&d).expect("mkdir e2e-logs");
    d
}

fn log_path(tag: &str) -> PathBuf {
    log_dir().join(format!("{tag}-{}.log", std::process::id()))
}

fn log_file(p: &Path) -> Stdio {
    match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
    {
        Ok(f) => Stdio::from(f),
        Err(_) => Stdio::inherit(),
    }
}

/// The last `n` lines of a log file (what a server said before it exited).
fn log_tail(p: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Records a secret (token, password, key share, OTP) that must never appear in a log.
pub fn note_secret(secret: &str) {
    use std::io::Write;
    if secret.len() < 6 {
        return;
    }
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_dir().join("secrets.txt"))
    {
        // One write per line: several test processes append at once, and O_APPEND keeps a
        // single small write whole (a `writeln!` may split it and interleave lines).
        let _ = f.write_all(format!("{secret}\n").as_bytes());
    }
}

/// The repository root (the parent of the `tests` package).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

/// Starts the sample directory of `scripts/dev-ldap.sh` in a temp dir named by `tag` (it stops
/// when this process exits) and returns its `export` lines as a map.
pub fn start_dev_ldap(tag: &str) -> std::collections::BTreeMap<String, String> {
    let dir = std::env::temp_dir().join(format!("cairn-e2e-{tag}-ldap-{}", std::process::id()));
    start_dev_directory("dev-ldap.sh", &dir, "CAIRN_LDAP_WATCH_PID")
}

/// Runs `scripts/<script> start DIR` (a throwaway directory server that stops when this
/// process exits, told by `watch_env`) and returns its `export NAME='value'` lines as a map.
pub fn start_dev_directory(
    script: &str,
    dir: &Path,
    watch_env: &str,
) -> std::collections::BTreeMap<String, String> {
    run_dev_script(
        script,
        &[std::ffi::OsStr::new("start"), dir.as_os_str()],
        watch_env,
    )
}

/// Runs `scripts/SCRIPT ARGS...` with `watch_env` set to this process's pid (the service it
/// starts stops when this process exits) and returns the `export` lines it prints.
pub fn run_dev_script(
    script: &str,
    args: &[&std::ffi::OsStr],
    watch_env: &str,
) -> std::collections::BTreeMap<String, String> {
    let out = Command::new("bash")
        .arg(repo_root().join("scripts").join(script))
        .args(args)
        .env(watch_env, std::process::id().to_string())
        .output()
        .unwrap_or_else(|e| panic!("run scripts/{script}: {e}"));
    assert!(
        out.status.success(),
        "scripts/{script} {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches('\'').to_string()))
        .collect()
}

/// A free loopback port whose successor is also free (API + cluster). Tried first below the
/// kernel's ephemeral range, where no outgoing connection (nor its TIME_WAIT, of which a
/// benchmark leaves tens of thousands) holds the port.
pub fn free_port_pair() -> u16 {
    let low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    if low > 12_000 {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let span = u32::from(low) - 10_000;
        // Spreads concurrent test processes over the range (a port choice, not a test seed).
        let seed = std::process::id().wrapping_mul(7919) ^ (rand_suffix() as u32);
        for _ in 0..400 {
            let n = NEXT.fetch_add(2, std::sync::atomic::Ordering::Relaxed);
            let p = (10_000 + (seed.wrapping_add(n) % (span - 2))) as u16;
            if TcpListener::bind(("127.0.0.1", p)).is_ok()
                && TcpListener::bind(("127.0.0.1", p + 1)).is_ok()
            {
                return p;
            }
        }
    }
    for _ in 0..200 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let p = l.local_addr().expect("addr").port();
        if p < 65000 && TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
    panic!("no free port pair");
}

/// A free API/cluster port pair not handed out before in this process (tests run in
/// parallel threads, and `free_port_pair` alone can give two of them overlapping pairs).
pub fn fresh_port_pair() -> u16 {
    static USED: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut used = USED.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let p = free_port_pair();
        if !used.iter().any(|u| u.abs_diff(p) <= 1) {
            used.push(p);
            return p;
        }
    }
}

/// A random number for unique names (ports, directories).
fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(1);
    h.finish()
}

/// A response: status and JSON body (Null when empty).
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub body: Value,
}

impl Resp {
    pub fn errors(&self) -> String {
        self.body["errors"].to_string()
    }
}

/// A temporary directory removed when dropped (also when a test panics: it unwinds).
/// `CAIRN_KEEP_TEMP=1` keeps it (and prints where it is) for a post-mortem.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TempDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("CAIRN_KEEP_TEMP").is_some_and(|v| v != "0") {
            eprintln!("CAIRN_KEEP_TEMP: kept {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh temporary directory, removed when the returned guard is dropped.
pub fn tmpdir(tag: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!(
        "cairn-e2e-{tag}-{}-{:x}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&d).expect("mkdir");
    TempDir(d)
}

/// A child process killed (and reaped) when dropped, also when a test panics.
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl std::ops::Deref for KillOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One request to the server at `addr` (`http://host:port`) without a `Server` handle (load
/// generators, writers that outlive a restart). `None` when there is no HTTP answer.
/// Percent-encodes one path segment (everything but RFC 3986's unreserved characters), for
/// names with spaces, quotes or slashes in a request path.
pub fn enc_segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub fn request(
    agent: &ureq::Agent,
    addr: &str,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Option<Resp> {
    let url = format!("{addr}/v1/{path}");
    let mut b = ureq::http::Request::builder().method(method).uri(&url);
    if let Some(t) = token {
        b = b.header("X-Vault-Token", t);
    }
    if method == "PATCH" {
        b = b.header("Content-Type", "application/merge-patch+json");
    }
    let data = body
        .map(|v| serde_json::to_vec(v).unwrap_or_default())
        .unwrap_or_default();
    let mut resp = agent.run(b.body(data).ok()?).ok()?;
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().ok()?;
    let body = if text.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    Some(Resp { status, body })
}

/// An agent for [`request`]: statuses are answers, not errors; `timeout` bounds each call.
pub fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .allow_non_standard_methods(true)
        .build()
        .into()
}

/// A replication license signed by [`TEST_ISSUER_KEY`] (valid until 2100), for servers
/// started with `license_path` and `license_trusted_key`.
pub const TEST_LICENSE: &str = r#"{
  "license": {
    "license_id": "e2e-test-license",
    "customer": "cairn tests",
    "features": [
      "replication"
    ],
    "issue_time": 1700000000000,
    "expiration_time": 4102444800000,
    "dev": false
  },
  "signature": "jUA3uMpan95C0G4l0W/NFxRHWiEUOq2rN3/lin/wBxebzDq/bLWsYedgO5u1tcyt1/4CTaiRWBBsON1l7Jp/Cg=="
}"#;
/// The public key that signed [`TEST_LICENSE`].
pub const TEST_ISSUER_KEY: &str = "GX9rI+FshTLGq8g4+s1ep4m+DHaykgM0A5v6iz02jWE=";

/// Runs `sql` with `psql` against the PostgreSQL of `scripts/dev-postgres.sh` whose export
/// lines are `env`; its unaligned output, trimmed. Fails the test when psql fails.
pub fn psql(env: &std::collections::BTreeMap<String, String>, sql: &str) -> String {
    let out = Command::new("psql")
        .args(["-h", "127.0.0.1", "-p", &env["CAIRN_PG_PORT"]])
        .args(["-U", &env["CAIRN_PG_USER"], "-d", &env["CAIRN_PG_DB"]])
        .args(["-v", "ON_ERROR_STOP=1", "-Atc", sql])
        .env("PGPASSWORD", &env["CAIRN_PG_PASSWORD"])
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "psql: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// An OpenPGP key pair for the PGP modes of generate-root and the DR operation token
/// (Ed25519 primary, Curve25519 encryption subkey) for `user_id`, made from `seed`: a test
/// fixture, not a secret.
pub fn pgp_keypair(
    seed: u64,
    user_id: &str,
) -> (
    pgp::composed::SignedSecretKey,
    pgp::composed::SignedPublicKey,
) {
    use pgp::composed::{EncryptionCaps, KeyType, SecretKeyParamsBuilder, SubkeyParamsBuilder};
    use pgp::crypto::ecc_curve::ECCCurve;
    use rand_chacha::rand_core::SeedableRng;
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(seed);
    let mut enc = SubkeyParamsBuilder::default();
    enc.key_type(KeyType::ECDH(ECCCurve::Curve25519Legacy))
        .can_sign(false)
        .can_encrypt(EncryptionCaps::All)
        .can_authenticate(false);
    let mut p = SecretKeyParamsBuilder::default();
    p.key_type(KeyType::Ed25519Legacy)
        .can_certify(true)
        .can_sign(true)
        .can_encrypt(EncryptionCaps::None)
        .primary_user_id(user_id.into())
        .subkeys(vec![enc.build().expect("subkey params")]);
    let sk = p
        .build()
        .expect("key params")
        .generate(&mut rng)
        .expect("generate key");
    let pk = pgp::composed::SignedPublicKey::from(sk.clone());
    (sk, pk)
}
