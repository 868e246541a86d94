//! End-to-end test harness: starts real `cairn` processes on free loopback ports, talks to
//! them over HTTP, and stops them (gracefully or with `kill -9`).

pub mod cluster;
pub mod keepalive;

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

fn log_file(tag: &str) -> Stdio {
    let p = log_dir().join(format!("{tag}-{}.log", std::process::id()));
    match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&p)
    {
        Ok(f) => Stdio::from(f),
        Err(_) => Stdio::inherit(),
    }
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
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/dev-ldap.sh"))
        .arg("start")
        .arg(&dir)
        .env("CAIRN_LDAP_WATCH_PID", std::process::id().to_string())
        .output()
        .expect("run scripts/dev-ldap.sh");
    assert!(
        out.status.success(),
        "scripts/dev-ldap.sh start failed:\n{}",
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
        let seed = std::process::id().wrapping_mul(7919)
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
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

/// A running `cairn` server.
pub struct Server {
    pub child: Option<Child>,
    pub addr: String,
    pub port: u16,
    pub root_token: String,
    pub unseal_keys: Vec<String>,
    pub dir: PathBuf,
    pub stdout_lines: Vec<String>,
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

pub fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "cairn-e2e-{tag}-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos() ^ (rand_suffix() as u128)
    ));
    std::fs::create_dir_all(&d).expect("mkdir");
    d
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(1);
    h.finish()
}

/// The home directory of this process's dev servers (they write `~/.cairn-token`).
fn dev_home() -> &'static Path {
    static HOME: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    HOME.get_or_init(|| tmpdir("dev-home"))
}

impl Server {
    /// `cairn server --dev` with a fixed root token.
    pub fn dev() -> Server {
        // A port picked free can be taken by a concurrent test before the server binds it;
        // a server that exits before printing its token is retried on another port.
        for _ in 0..5 {
            if let Some(s) = Self::try_dev() {
                return s;
            }
        }
        panic!("cairn server --dev did not start after 5 attempts");
    }

    fn try_dev() -> Option<Server> {
        let port = free_port_pair();
        let addr = format!("127.0.0.1:{port}");
        let mut child = Command::new(cairn_bin())
            .args([
                "server",
                "--dev",
                "--dev-listen-address",
                &addr,
                "--dev-root-token-id",
                "root-e2e",
                "--log-level",
                &log_level(),
            ])
            // A dev server stores its root token in ~/.cairn-token: not in the developer's
            // home.
            .env("HOME", dev_home())
            .env_remove("CAIRN_DEV_LISTEN_ADDRESS")
            .stdout(Stdio::piped())
            .stderr(log_file(&format!("dev-{port}")))
            .spawn()
            .expect("spawn cairn");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = Vec::new();
        let mut key = String::new();
        let mut reader = BufReader::new(stdout).lines();
        let mut started = false;
        for line in reader.by_ref() {
            let Ok(line) = line else { break };
            if let Some(k) = line.strip_prefix("Unseal Key: ") {
                key = k.to_string();
            }
            let done = line.starts_with("Root Token: ");
            lines.push(line);
            if done {
                started = true;
                break;
            }
        }
        if !started {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        // Keep draining stdout so the server never writes into a closed pipe.
        std::thread::spawn(move || for _ in reader {});
        note_secret("root-e2e");
        note_secret(&key);
        let s = Server {
            child: Some(child),
            addr: format!("http://{addr}"),
            port,
            root_token: "root-e2e".into(),
            unseal_keys: vec![key],
            dir: PathBuf::new(),
            stdout_lines: lines,
        };
        s.wait_ready();
        Some(s)
    }

    /// `cairn server --config` on SQLite in `dir` (kept across restarts), not initialised.
    pub fn with_config(dir: &Path, port: u16, extra: &str) -> Server {
        let cfg = format!(
            "storage \"sqlite\" {{ path = \"{}\" }}\nlistener \"tcp\" {{\n address = \"127.0.0.1:{port}\"\n cluster_address = \"127.0.0.1:{}\"\n tls_disable = true\n}}\napi_addr = \"http://127.0.0.1:{port}\"\n{extra}\n",
            dir.join("cairn.db").display(),
            port + 1
        );
        let cfg_path = dir.join("cairn.hcl");
        std::fs::write(&cfg_path, cfg).expect("write config");
        let child = Command::new(cairn_bin())
            .args(["server", "--config"])
            .arg(&cfg_path)
            .args(["--log-level", &log_level()])
            .stdout(Stdio::null())
            .stderr(log_file(&format!("cfg-{port}")))
            .spawn()
            .expect("spawn cairn");
        let s = Server {
            child: Some(child),
            addr: format!("http://127.0.0.1:{port}"),
            port,
            root_token: String::new(),
            unseal_keys: Vec::new(),
            dir: dir.to_path_buf(),
            stdout_lines: Vec::new(),
        };
        s.wait_ready();
        s
    }

    /// Initialises with `shares`/`threshold` and unseals.
    pub fn init_unseal(&mut self, shares: u8, threshold: u8) {
        let r = self.put(
            "sys/init",
            serde_json::json!({"secret_shares": shares, "secret_threshold": threshold}),
        );
        assert_eq!(r.status, 200, "init: {:?}", r.body);
        self.root_token = r.body["root_token"]
            .as_str()
            .expect("root token")
            .to_string();
        self.unseal_keys = r.body["keys"]
            .as_array()
            .expect("keys")
            .iter()
            .map(|k| k.as_str().unwrap_or_default().to_string())
            .collect();
        note_secret(&self.root_token);
        for k in &self.unseal_keys {
            note_secret(k);
        }
        for k in r.body["keys_base64"].as_array().into_iter().flatten() {
            note_secret(k.as_str().unwrap_or_default());
        }
        self.unseal();
    }

    pub fn unseal(&self) {
        for k in &self.unseal_keys {
            let r = self.put("sys/unseal", serde_json::json!({ "key": k }));
            assert_eq!(r.status, 200, "unseal: {:?}", r.body);
            if r.body["sealed"] == Value::Bool(false) {
                return;
            }
        }
        panic!("still sealed after all keys");
    }

    pub fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(r) = self.try_call("GET", "sys/health", None, None) {
                if r.status != 0 {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("server at {} did not become ready", self.addr);
    }

    fn try_call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> Option<Resp> {
        let url = format!("{}/v1/{}", self.addr, path);
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .allow_non_standard_methods(true)
            .build()
            .into();
        let mut b = ureq::http::Request::builder().method(method).uri(&url);
        if let Some(t) = token {
            b = b.header("X-Service-Token", t);
        }
        let data = body
            .map(|v| serde_json::to_vec(v).unwrap_or_default())
            .unwrap_or_default();
        let req = b.body(data).ok()?;
        let mut resp = agent.run(req).ok()?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        let body = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Some(Resp { status, body })
    }

    /// Any method with the root token (or none when the root token is empty).
    pub fn call(&self, method: &str, path: &str, body: Option<Value>) -> Resp {
        let t = (!self.root_token.is_empty()).then_some(self.root_token.as_str());
        self.call_as(t, method, path, body)
    }

    pub fn call_as(
        &self,
        token: Option<&str>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Resp {
        self.try_call(method, path, token, body.as_ref())
            .unwrap_or_else(|| panic!("{method} {path}: no response from {}", self.addr))
    }

    pub fn get(&self, path: &str) -> Resp {
        self.call("GET", path, None)
    }
    pub fn put(&self, path: &str, body: Value) -> Resp {
        self.call("PUT", path, Some(body))
    }
    pub fn post(&self, path: &str, body: Value) -> Resp {
        self.call("POST", path, Some(body))
    }
    pub fn delete(&self, path: &str) -> Resp {
        self.call("DELETE", path, None)
    }
    pub fn list(&self, path: &str) -> Resp {
        self.call("LIST", path, None)
    }

    /// Raw request with custom headers and body bytes.
    pub fn raw(&self, method: &str, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Resp {
        let url = format!("{}{}", self.addr, path);
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .allow_non_standard_methods(true)
            .build()
            .into();
        let mut b = ureq::http::Request::builder().method(method).uri(&url);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let mut resp = agent.run(b.body(body).expect("request")).expect("response");
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .unwrap_or_default();
        let body = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Resp { status, body }
    }

    /// Stops the server cleanly (SIGTERM: it finishes deferred storage work, such as Merkle
    /// records not yet written, before exiting); kills it after 30 s.
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while std::time::Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `kill -9`.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// One request to the server at `addr` (`http://host:port`) without a `Server` handle (load
/// generators, writers that outlive a restart). `None` when there is no HTTP answer.
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
