//! A `cairn` server process under test: how it is launched ([`Launch`]), started and
//! recognised by its start line ([`StartError`]), called, restarted, and killed when its
//! handle drops ([`Server`]).

use super::*;

/// How a server process is started, besides its directory and configuration.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    /// A command the server runs under (a command line ending where the server's own begins,
    /// e.g. `nsenter -t PID -U -m --`, to run it in a namespace). It must exec the server, so
    /// that the PID the server prints is the child's. Empty: none.
    pub wrapper: Vec<String>,
    /// Where the configuration file is written (default `<dir>/cairn.hcl`), e.g. outside a
    /// data directory that only the server's namespace sees.
    pub config_file: Option<PathBuf>,
}

/// A running `cairn` server. Dropping it (also when a test panics) kills its process, then
/// removes the temporary directories it owns.
pub struct Server {
    pub child: Option<Child>,
    pub addr: String,
    pub port: u16,
    pub root_token: String,
    pub unseal_keys: Vec<String>,
    pub dir: PathBuf,
    pub stdout_lines: Vec<String>,
    /// The configuration's extra lines, for [`Server::restart`].
    pub extra: String,
    /// How the process is started, for [`Server::restart`].
    pub launch: Launch,
    /// Removed after the process is killed (fields drop after [`Drop::drop`]).
    owned: Vec<TempDir>,
}

/// Why a server did not start.
#[derive(Debug)]
pub enum StartError {
    /// Its API or cluster port was taken (by another test's server, or any other process).
    PortTaken(String),
    /// Anything else (the log's last lines, or what was printed instead of the start line).
    Failed(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::PortTaken(m) => write!(f, "port taken: {m}"),
            StartError::Failed(m) => write!(f, "did not start: {m}"),
        }
    }
}

/// Waits for the `==> Cairn server started. API: <api>  Cluster: ...  PID: <pid>` line of
/// the server `child` (its stdout is `lines`): the line is printed once both listeners are
/// bound, so a line naming this child's PID and the expected API address proves that the
/// server answering there is this child and not another process that took the port. On
/// success a thread keeps draining stdout (the server never writes into a closed pipe) and
/// the lines read so far are returned.
fn await_start_line(
    child: &mut Child,
    api: &str,
    log: &Path,
    until: impl Fn(&str) -> bool + Send + 'static,
) -> Result<Vec<String>, StartError> {
    let stdout = child.stdout.take().expect("stdout piped");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(t) = &tx {
                let done = until(&line);
                if t.send(line).is_err() || done {
                    tx = None;
                }
            }
        }
    });
    let pid = child.id();
    let want = format!("API: {api}");
    let mut lines = Vec::new();
    let mut started = false;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if line.starts_with("==> Cairn server started.") {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    let named_pid = fields
                        .windows(2)
                        .find(|w| w[0] == "PID:")
                        .and_then(|w| w[1].parse::<u32>().ok());
                    if named_pid != Some(pid) || !line.contains(&format!("{want} ")) {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err(StartError::Failed(format!(
                            "the start line names another server (want pid {pid}, {want}): {line}"
                        )));
                    }
                    started = true;
                }
                lines.push(line);
            }
            // The drain thread stopped forwarding: the wanted last line was read, or stdout
            // closed (the server exited).
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(StartError::Failed(format!(
                    "no start line in 60 s (pid {pid}); log:\n{}",
                    log_tail(log, 20)
                )));
            }
        }
    }
    if started && child.try_wait().ok().flatten().is_none() {
        return Ok(lines);
    }
    // Exited: say why (its log's last lines).
    let _ = child.kill();
    let _ = child.wait();
    let tail = log_tail(log, 20);
    let taken = tail.contains("in use") || tail.contains("AddrInUse");
    let msg = format!("pid {pid} for {api} exited; its log ends:\n{tail}");
    Err(if taken {
        StartError::PortTaken(msg)
    } else {
        StartError::Failed(msg)
    })
}

impl Server {
    /// `cairn server --dev` with a fixed root token.
    pub fn dev() -> Server {
        // A port picked free can be taken by a concurrent test before the server binds it:
        // such a start is retried on another port.
        let mut last = None;
        for _ in 0..5 {
            match Self::try_dev() {
                Ok(s) => return s,
                Err(e @ StartError::PortTaken(_)) => {
                    eprintln!("dev server: {e}; retrying on another port");
                    last = Some(e);
                }
                Err(e) => panic!("cairn server --dev {e}"),
            }
        }
        panic!("cairn server --dev did not start after 5 attempts: {last:?}");
    }

    fn try_dev() -> Result<Server, StartError> {
        let port = fresh_port_pair();
        let addr = format!("127.0.0.1:{port}");
        let log = log_path(&format!("dev-{port}"));
        // A dev server stores its root token in ~/.cairn-token: a home of its own (removed
        // with it), not the developer's.
        let home = tmpdir("dev-home");
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
            .env("HOME", home.path())
            .env_remove("CAIRN_DEV_LISTEN_ADDRESS")
            .stdout(Stdio::piped())
            .stderr(log_file(&log))
            .spawn()
            .expect("spawn cairn");
        let lines = await_start_line(&mut child, &format!("http://{addr}"), &log, |l| {
            l.starts_with("Root Token: ")
        })?;
        let Some(key) = lines
            .iter()
            .find_map(|l| l.strip_prefix("Unseal Key: "))
            .map(str::to_string)
        else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(StartError::Failed(format!(
                "no unseal key printed: {lines:?}"
            )));
        };
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
            extra: String::new(),
            launch: Launch::default(),
            owned: vec![home],
        };
        s.wait_ready();
        Ok(s)
    }

    /// `cairn server --config` on SQLite in `dir` (kept across restarts), not initialised,
    /// on a fresh API/cluster port pair; a start that finds a port taken (by another test's
    /// server or any other process) is retried on another pair.
    pub fn start(dir: &Path, extra: &str) -> Server {
        Self::start_in(dir, extra, &Launch::default())
    }

    /// [`Server::start`] started as `launch` says.
    pub fn start_in(dir: &Path, extra: &str, launch: &Launch) -> Server {
        let mut last = None;
        for _ in 0..5 {
            let port = fresh_port_pair();
            match Self::try_config_in(dir, port, extra, launch) {
                Ok(s) => return s,
                Err(e @ StartError::PortTaken(_)) => {
                    eprintln!("server in {}: {e}; retrying on another port", dir.display());
                    last = Some(e);
                }
                Err(e) => panic!("server in {}: {e}", dir.display()),
            }
        }
        panic!(
            "server in {}: no start after 5 port pairs: {last:?}",
            dir.display()
        );
    }

    /// [`Server::start`] in a new temporary directory owned by the server (removed after it
    /// is killed).
    pub fn start_owned(tag: &str, extra: &str) -> Server {
        let dir = tmpdir(tag);
        let mut s = Self::start(&dir, extra);
        s.own(dir);
        s
    }

    /// A handle for a server process started by the caller (its API at
    /// `http://127.0.0.1:<port>`), killed when the handle is dropped.
    pub fn adopt(child: Child, port: u16, root_token: &str) -> Server {
        Server {
            child: Some(child),
            addr: format!("http://127.0.0.1:{port}"),
            port,
            root_token: root_token.to_string(),
            unseal_keys: Vec::new(),
            dir: PathBuf::new(),
            stdout_lines: Vec::new(),
            extra: String::new(),
            launch: Launch::default(),
            owned: Vec::new(),
        }
    }

    /// The server process's PID (0 when this handle started none).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// Makes `dir` live as long as this server: it is removed after the process is killed.
    pub fn own(&mut self, dir: TempDir) {
        self.owned.push(dir);
    }

    /// `cairn server --config` on SQLite in `dir` on the API port `port` (cluster
    /// `port + 1`); panics, saying why, when it does not start (a taken port included: the
    /// caller chose it). See [`Server::start`] for a start that picks its ports.
    pub fn with_config(dir: &Path, port: u16, extra: &str) -> Server {
        Self::try_with_config(dir, port, extra)
            .unwrap_or_else(|e| panic!("server on port {port} in {}: {e}", dir.display()))
    }

    /// [`Server::with_config`] returning why the server did not start.
    pub fn try_with_config(dir: &Path, port: u16, extra: &str) -> Result<Server, StartError> {
        Self::try_config_in(dir, port, extra, &Launch::default())
    }

    fn try_config_in(
        dir: &Path,
        port: u16,
        extra: &str,
        launch: &Launch,
    ) -> Result<Server, StartError> {
        let cfg = format!(
            "storage \"sqlite\" {{ path = \"{}\" }}\nlistener \"tcp\" {{\n address = \"127.0.0.1:{port}\"\n cluster_address = \"127.0.0.1:{}\"\n tls_disable = true\n}}\napi_addr = \"http://127.0.0.1:{port}\"\n{extra}\n",
            dir.join("cairn.db").display(),
            port + 1
        );
        let cfg_path = launch
            .config_file
            .clone()
            .unwrap_or_else(|| dir.join("cairn.hcl"));
        std::fs::write(&cfg_path, cfg).expect("write config");
        let mut s = Self::spawn_config_in(&cfg_path, &format!("http://127.0.0.1:{port}"), launch)?;
        s.port = port;
        s.dir = dir.to_path_buf();
        s.extra = extra.to_string();
        s.wait_ready();
        Ok(s)
    }

    /// `cairn server --config <cfg_path>` whose API is `api` (`http://127.0.0.1:<port>` or
    /// `https://...`): returns once the process said it bound its listeners (its start line,
    /// naming its PID and `api`); the API may not answer yet.
    pub fn spawn_config(cfg_path: &Path, api: &str) -> Result<Server, StartError> {
        Self::spawn_config_in(cfg_path, api, &Launch::default())
    }

    fn spawn_config_in(cfg_path: &Path, api: &str, launch: &Launch) -> Result<Server, StartError> {
        let port: u16 = api
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("api address with a port");
        let log = log_path(&format!("cfg-{port}"));
        let mut cmd = match launch.wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(cairn_bin());
                c
            }
            None => Command::new(cairn_bin()),
        };
        let mut child = cmd
            .args(["server", "--config"])
            .arg(cfg_path)
            .args(["--log-level", &log_level()])
            .stdout(Stdio::piped())
            .stderr(log_file(&log))
            .spawn()
            .expect("spawn cairn");
        let lines = await_start_line(&mut child, api, &log, |l| {
            l.starts_with("==> Cairn server started.")
        })?;
        Ok(Server {
            child: Some(child),
            addr: api.to_string(),
            port,
            root_token: String::new(),
            unseal_keys: Vec::new(),
            dir: cfg_path.parent().map(Path::to_path_buf).unwrap_or_default(),
            stdout_lines: lines,
            extra: String::new(),
            launch: launch.clone(),
            owned: Vec::new(),
        })
    }

    /// Starts the server again (after [`Server::kill9`] or [`Server::terminate`]; a running
    /// one is killed first) on the same directory, port and configuration, keeping its root
    /// token and key shares; it comes back sealed. The port must stay the same (a
    /// replication peer knows it), so when another process took it meanwhile this retries
    /// for a few seconds and then fails saying so.
    pub fn restart(&mut self) {
        self.kill9();
        let mut last = None;
        for _ in 0..10 {
            match Self::try_config_in(&self.dir, self.port, &self.extra, &self.launch) {
                Ok(mut s) => {
                    std::mem::swap(&mut s.child, &mut self.child);
                    self.stdout_lines = std::mem::take(&mut s.stdout_lines);
                    return;
                }
                Err(e @ StartError::PortTaken(_)) => {
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => panic!(
                    "restart on port {} in {}: {e}",
                    self.port,
                    self.dir.display()
                ),
            }
        }
        panic!(
            "restart on port {} in {}: the port this server had is taken by another process \
             (it cannot move: replication peers know it): {last:?}",
            self.port,
            self.dir.display()
        );
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

    /// Waits until the API answers `sys/health`. The process bound the port (its start line
    /// said so, with its PID), so the answer is this server's; `sys/health` answers 200, 429,
    /// 472, 473, 501 or 503 whatever the seal state, so any other status is a failure.
    pub fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(r) = self.try_call("GET", "sys/health", None, None) {
                assert!(
                    [200, 429, 472, 473, 501, 503].contains(&r.status),
                    "server at {}: sys/health answered {} {}",
                    self.addr,
                    r.status,
                    r.body
                );
                assert!(
                    r.body["initialized"].is_boolean(),
                    "server at {}: not a sys/health answer: {}",
                    self.addr,
                    r.body
                );
                return;
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
        if method == "PATCH" {
            b = b.header("Content-Type", "application/merge-patch+json");
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
