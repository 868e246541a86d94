//! The cluster channel on real I/O.
//!
//! * Inbound: a second tiny_http listener on the cluster address. `POST /v1/cluster/replication`
//!   carries one [`PeerMsg`] frame (JSON, perhaps with a binary attachment: see
//!   `cairn_core::replication::msg`); it becomes an `Input::PeerRequest` for the core, and the
//!   core's `Output::PeerResponse` (perhaps held a while: long poll) is the HTTP answer.
//!   Requests with ambiguous framing are refused on the connection, as on the API listener
//!   (`crate::framing`).
//! * Outbound: `Output::PeerSend` (a secondary asking its primary) and `Output::HttpCall`
//!   (unwrapping an activation token at the primary's API) run on short-lived threads with a
//!   shared ureq agent; their results come back to the core as `Input::PeerReply` /
//!   `Input::HttpReply`.
//!
//! TLS: a node serves its cluster listener in plain HTTP until it becomes a primary; the core
//! then hands over a certificate issued by the cluster CA (`Output::ClusterTls`) and the
//! listener accepts TLS from then on, without closing its socket; a request still arriving
//! over plain TCP on a connection from before the switch is refused. The TLS is mutual: a
//! client must present a certificate of the cluster CA (`ClusterTls::ca_pem`). Secondaries
//! pin the cluster CA from their activation credential (no system roots), present the client
//! certificate it carries, and prove themselves with their secret on every request; standbys
//! present the certificate their cluster's nodes derive from the CA they share.

use crate::runtime::{Core, Msg};
use cairn_core::replication::tls::ClientCert;
use cairn_core::replication::{HttpCall, HttpReply, PeerAnswer, PeerMsg, PeerReply, PeerSend};
use cairn_core::Input;
use std::collections::BTreeMap;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tiny_http::{Header, Server};

/// Path of the replication endpoint on the cluster listener.
pub const PATH: &str = "/v1/cluster/replication";
/// Longest a peer call may take in all (large Merkle sync batches).
const PEER_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest the answer may take to start: a long poll is held a few seconds at most, so a
/// call that hears nothing for this long is dropped and retried.
const PEER_RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a connection (TCP and TLS handshake) may take.
const PEER_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Largest accepted peer message.
const MAX_BODY: u64 = 256 << 20;

/// The cluster listener: plain HTTP until the node hands it a certificate (it became a
/// primary or an HA cluster's active node), then HTTPS with the cluster CA's certificate.
/// The switch happens in place ([`tiny_http::Server::set_ssl`]): the socket stays bound, so
/// a peer connecting during it is never refused or reset, and connections accepted before
/// it are served to their end.
struct Listener {
    addr: String,
    server: Arc<Server>,
    /// The certificate it serves, once it serves TLS: from then on a request that arrives
    /// over plain TCP (on a connection accepted before the switch) is refused ([`admits`]).
    cert: Mutex<Option<Vec<u8>>>,
}

static LISTENER: OnceLock<Arc<Listener>> = OnceLock::new();

/// Serves the bound cluster listener on worker threads.
pub fn serve(
    listener: std::net::TcpListener,
    core: Core,
    threads: usize,
    limits: tiny_http::ConnectionLimits,
) -> Result<std::net::SocketAddr, String> {
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let server = Server::from_listener_with_inline(
        listener,
        None,
        Some(crate::framing::head_check),
        limits,
        Some(forward_inline(core.clone())),
    )
    .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| format!("cluster listener on {addr} has no IP address"))?;
    let l = Arc::new(Listener {
        addr: local.to_string(),
        server: Arc::new(server),
        cert: Mutex::new(None),
    });
    let _ = LISTENER.set(l.clone());
    for i in 0..threads.max(1) {
        let core = core.clone();
        let server = l.server.clone();
        std::thread::Builder::new()
            .name(format!("cairn-cluster-{i}"))
            .spawn(move || loop {
                match server.recv() {
                    Ok(rq) => handle(rq, &core),
                    Err(e) => {
                        log::warn!("cluster accept error: {e}");
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            })
            .map_err(|e| e.to_string())?;
    }
    Ok(local)
}

/// Switches the cluster listener to TLS with `t` (connections accepted from now on).
pub fn use_tls(t: cairn_core::replication::tls::ClusterTls) {
    let Some(l) = LISTENER.get() else {
        return;
    };
    let Ok(mut cert) = l.cert.lock() else {
        return;
    };
    let pem = t.cert_pem.into_bytes();
    if cert.as_deref() == Some(pem.as_slice()) {
        return;
    }
    match l.server.set_ssl(tiny_http::SslConfig {
        certificate: pem.clone(),
        private_key: t.key_pem.as_bytes().to_vec(),
        client_ca: Some(t.ca_pem.into_bytes()),
    }) {
        Ok(()) => {
            *cert = Some(pem);
            log::info!("cluster listener on {} now serves TLS", l.addr);
        }
        Err(e) => log::error!(
            "cannot serve TLS on the cluster listener on {}: {e}",
            l.addr
        ),
    }
}

/// Body bytes this process sent / received on the cluster channel (peer-call request and
/// answer bodies, as the client and as the server; TLS and HTTP framing not included).
static BYTES_SENT: AtomicU64 = AtomicU64::new(0);
static BYTES_RECEIVED: AtomicU64 = AtomicU64::new(0);

/// The cluster channel byte counters in Prometheus text format (appended to
/// `sys/metrics?format=prometheus` with the listener's latency histograms).
pub fn render_bytes() -> String {
    let name = "cairn_cluster_bytes_total";
    format!(
        "# HELP {name} Body bytes of peer calls on the cluster channel (client and server side).\n\
         # TYPE {name} counter\n\
         {name}{{direction=\"sent\"}} {}\n\
         {name}{{direction=\"received\"}} {}\n",
        BYTES_SENT.load(Ordering::Relaxed),
        BYTES_RECEIVED.load(Ordering::Relaxed)
    )
}

/// Content type of peer message frames.
const FRAME_TYPE: &str = "application/octet-stream";

fn reply(rq: tiny_http::Request, status: u16, body: Vec<u8>) {
    BYTES_SENT.fetch_add(body.len() as u64, Ordering::Relaxed);
    #[allow(clippy::expect_used)] // a constant, valid header
    let h = Header::from_bytes(&b"Content-Type"[..], FRAME_TYPE.as_bytes()).expect("static header");
    if let Err(e) = rq.respond(
        tiny_http::Response::from_data(body)
            .with_status_code(status)
            .with_header(h),
    ) {
        log::debug!("peer went away before the answer: {e}");
    }
}

/// Forwarded requests (`POST /v1/cluster/forward`) are answered on their connection's
/// thread: a standby's client waits for each, and a hand-off to a worker thread and back
/// would add two thread wake-ups to its path. Each standby connection carries one forward at
/// a time, and the workers stay free for replication calls (long polls).
fn forward_inline(core: Core) -> tiny_http::Inline {
    Arc::new(move |rq| {
        if !is_forward(&rq) {
            return Some(rq);
        }
        answer_forward(rq, &core);
        None
    })
}

/// Whether a request that came over TLS (`secure`) or plain TCP may be served when the
/// listener does (`tls_on`) or does not serve TLS yet: plain requests only until it does.
fn admits(secure: bool, tls_on: bool) -> bool {
    secure || !tls_on
}

/// Refuses `rq` (and answers it) when it came over plain TCP after the switch to TLS.
fn refused_plain(rq: tiny_http::Request) -> Option<tiny_http::Request> {
    let tls_on = LISTENER
        .get()
        .is_some_and(|l| l.cert.lock().map_or(true, |c| c.is_some()));
    if admits(rq.secure(), tls_on) {
        return Some(rq);
    }
    reply(
        rq,
        400,
        br#"{"errors":["the cluster listener serves TLS only now: connect again with TLS (nothing was applied)"]}"#
            .to_vec(),
    );
    None
}

fn is_forward(rq: &tiny_http::Request) -> bool {
    rq.url() == crate::ha::FORWARD_PATH && rq.method() == &tiny_http::Method::Post
}

fn answer_forward(rq: tiny_http::Request, core: &Core) {
    let Some(mut rq) = refused_plain(rq) else {
        return;
    };
    let mut body = Vec::new();
    if let Err(e) = rq.as_reader().take(MAX_BODY).read_to_end(&mut body) {
        log::debug!("cannot read a forwarded request: {e}");
        return;
    }
    let (status, out) = crate::ha::serve_forward(&body, core);
    reply(rq, status, out)
}

fn handle(rq: tiny_http::Request, core: &Core) {
    if is_forward(&rq) {
        return answer_forward(rq, core);
    }
    let Some(mut rq) = refused_plain(rq) else {
        return;
    };
    if rq.url() != PATH || rq.method() != &tiny_http::Method::Post {
        return reply(
            rq,
            404,
            br#"{"errors":["no such cluster endpoint"]}"#.to_vec(),
        );
    }
    let mut body = Vec::new();
    if let Err(e) = rq.as_reader().take(MAX_BODY).read_to_end(&mut body) {
        log::debug!("cannot read peer request: {e}");
        return;
    }
    BYTES_RECEIVED.fetch_add(body.len() as u64, Ordering::Relaxed);
    let msg = match PeerMsg::from_wire(&body) {
        Ok(m) => m,
        Err(e) => {
            let a = PeerAnswer::Error {
                code: "bad-request".into(),
                message: format!("malformed peer message: {e}"),
            };
            return reply(rq, 400, a.into_wire().unwrap_or_default());
        }
    };
    let answer = core.peer(msg);
    reply(rq, 200, answer.into_wire().unwrap_or_default());
}

/// Idle keep-alive connections kept for reuse: a standby forwards each of its concurrent
/// clients' requests on a connection of its own, and one not kept for the next request
/// costs a TCP and TLS handshake (ureq keeps 3 per host by default).
const IDLE_CONNECTIONS_PER_PEER: usize = 32;
const IDLE_CONNECTIONS: usize = 256;

/// The cluster channel's agent for peers without a cluster CA (plain HTTP).
pub(crate) fn agent() -> &'static ureq::Agent {
    static AGENT: OnceLock<ureq::Agent> = OnceLock::new();
    AGENT.get_or_init(|| crate::resolve::agent(peer_config(PEER_CONNECT_TIMEOUT).build()))
}

/// What every agent of the cluster channel sets: answers of any status, the idle
/// connections kept, and its time limits (`connect` for the TCP and TLS handshake).
fn peer_config(connect: Duration) -> ureq::config::ConfigBuilder<ureq::typestate::AgentScope> {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        // Peers never redirect; following one would connect again after the request may
        // have been sent, and a failure there would look like one made while connecting.
        .max_redirects(0)
        .max_idle_connections(IDLE_CONNECTIONS)
        .max_idle_connections_per_host(IDLE_CONNECTIONS_PER_PEER)
        .timeout_global(Some(PEER_TIMEOUT))
        .timeout_recv_response(Some(PEER_RESPONSE_TIMEOUT))
        .timeout_connect(Some(connect))
}

/// An agent that trusts only the cluster CA `ca_pem` and presents `client` (one per CA and
/// client certificate, reused).
pub(crate) fn pinned_agent(
    ca_pem: &str,
    client: Option<&ClientCert>,
) -> Result<ureq::Agent, String> {
    pinned_agent_with(ca_pem, client, PEER_CONNECT_TIMEOUT)
}

/// As [`pinned_agent`], with its own limit on connecting (TCP and TLS handshake): a standby
/// forwarding a client's request gives up a connection that hangs sooner, and connects
/// again (nothing was sent).
pub(crate) fn pinned_agent_with(
    ca_pem: &str,
    client: Option<&ClientCert>,
    connect: Duration,
) -> Result<ureq::Agent, String> {
    type Agents = Mutex<BTreeMap<(String, String, u128), ureq::Agent>>;
    static AGENTS: OnceLock<Agents> = OnceLock::new();
    let map = AGENTS.get_or_init(|| Mutex::new(BTreeMap::new()));
    let mut g = map.lock().map_err(|_| "agent cache poisoned".to_string())?;
    let cert_pem = client.map(|c| c.cert_pem.clone()).unwrap_or_default();
    let key = (ca_pem.to_string(), cert_pem, connect.as_millis());
    if let Some(a) = g.get(&key) {
        return Ok(a.clone());
    }
    let certs: Vec<_> = ureq::tls::parse_pem(ca_pem.as_bytes())
        .filter_map(|i| match i {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        return Err("the cluster CA in the credential holds no certificate".into());
    }
    let client = match client {
        Some(c) => Some(client_identity(c)?),
        None => None,
    };
    let config = peer_config(connect)
        .tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::new_with_certs(&certs))
                .client_cert(client)
                .build(),
        )
        .build();
    let a = crate::resolve::agent(config);
    g.insert(key, a.clone());
    Ok(a)
}

/// `c` in ureq's form.
fn client_identity(c: &ClientCert) -> Result<ureq::tls::ClientCert, String> {
    let chain = ureq::tls::Certificate::from_pem(c.cert_pem.as_bytes())
        .map_err(|e| format!("the cluster client certificate is unreadable: {e}"))?;
    let key = ureq::tls::PrivateKey::from_pem(c.key_pem.as_bytes())
        .map_err(|e| format!("the cluster client key is unreadable: {e}"))?;
    Ok(ureq::tls::ClientCert::new_with_certs(&[chain], key))
}

fn peer_url(to: &str, tls: bool) -> String {
    let host = to.split("://").last().unwrap_or(to).trim_end_matches('/');
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{host}{PATH}")
}

fn post_peer(s: &PeerSend) -> Result<PeerAnswer, String> {
    let body = s.msg.clone().into_wire().map_err(|e| e.to_string())?;
    let tls = !s.ca_pem.is_empty();
    let agent = if tls {
        pinned_agent(&s.ca_pem, s.client.as_ref())?
    } else {
        agent().clone()
    };
    BYTES_SENT.fetch_add(body.len() as u64, Ordering::Relaxed);
    let mut resp = agent
        .post(&peer_url(&s.to, tls))
        .header("Content-Type", FRAME_TYPE)
        .send(&body[..])
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let text = resp
        .body_mut()
        .with_config()
        .limit(MAX_BODY)
        .read_to_vec()
        .map_err(|e| e.to_string())?;
    BYTES_RECEIVED.fetch_add(text.len() as u64, Ordering::Relaxed);
    PeerAnswer::from_wire(&text).map_err(|e| format!("answer {status} is not a peer message: {e}"))
}

type Job = Box<dyn FnOnce() + Send>;

/// Threads for outbound peer calls, kept between calls (a secondary makes one call per batch
/// of WAL entries; a thread per call cost more than the call). A call never waits for a
/// thread: one is started when none is free, since a long poll holds its thread for up to
/// `pull_wait_ms`. Threads beyond [`PeerPool::KEEP`] leave after a minute without work.
struct PeerPool {
    tx: Mutex<Sender<Job>>,
    rx: Arc<Mutex<std::sync::mpsc::Receiver<Job>>>,
    /// Threads alive, and calls handed over and not yet taken by a thread.
    threads: AtomicU64,
    waiting_threads: AtomicU64,
    queued: AtomicU64,
}

impl PeerPool {
    const KEEP: u64 = 4;
    const IDLE: Duration = Duration::from_secs(60);

    fn get() -> &'static PeerPool {
        static POOL: OnceLock<PeerPool> = OnceLock::new();
        POOL.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<Job>();
            PeerPool {
                tx: Mutex::new(tx),
                rx: Arc::new(Mutex::new(rx)),
                threads: AtomicU64::new(0),
                waiting_threads: AtomicU64::new(0),
                queued: AtomicU64::new(0),
            }
        })
    }

    fn submit(&'static self, job: Job) {
        let queued = self.queued.fetch_add(1, Ordering::SeqCst) + 1;
        if queued > self.waiting_threads.load(Ordering::SeqCst) {
            self.spawn();
        }
        let sent = match self.tx.lock() {
            Ok(tx) => tx.send(job).is_ok(),
            Err(_) => false,
        };
        if !sent {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            log::error!("the peer call pool is gone; a cluster call was dropped");
        }
    }

    fn spawn(&'static self) {
        self.threads.fetch_add(1, Ordering::SeqCst);
        let spawned = std::thread::Builder::new()
            .name("cairn-peer".into())
            .spawn(move || self.work());
        if let Err(e) = spawned {
            self.threads.fetch_sub(1, Ordering::SeqCst);
            log::error!("cannot start a peer call thread: {e}");
        }
    }

    fn work(&'static self) {
        loop {
            self.waiting_threads.fetch_add(1, Ordering::SeqCst);
            let next = match self.rx.lock() {
                Ok(rx) => rx.recv_timeout(Self::IDLE),
                Err(_) => Err(std::sync::mpsc::RecvTimeoutError::Disconnected),
            };
            self.waiting_threads.fetch_sub(1, Ordering::SeqCst);
            match next {
                Ok(job) => {
                    self.queued.fetch_sub(1, Ordering::SeqCst);
                    job();
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout)
                    if self.threads.load(Ordering::SeqCst) <= Self::KEEP => {}
                Err(_) => {
                    self.threads.fetch_sub(1, Ordering::SeqCst);
                    return;
                }
            }
        }
    }
}

/// Runs a cluster-channel call on the pool's threads (kept a while when idle, more started
/// when all are busy).
pub(crate) fn on_pool(job: impl FnOnce() + Send + 'static) {
    PeerPool::get().submit(Box::new(job));
}

/// Performs a `PeerSend` on a pool thread; the answer goes back to the core.
pub fn send_peer(s: PeerSend, tx: Sender<Msg>) {
    PeerPool::get().submit(Box::new(move || {
        let result = post_peer(&s);
        let _ = tx.send(Msg::Input(Input::PeerReply(PeerReply {
            call_id: s.call_id,
            result,
        })));
    }));
}

fn tls_agent(call: &HttpCall) -> Result<ureq::Agent, String> {
    let mut pems: Vec<Vec<u8>> = Vec::new();
    if !call.ca_file.is_empty() {
        pems.push(
            std::fs::read(&call.ca_file)
                .map_err(|e| format!("cannot read ca_file {}: {e}", call.ca_file))?,
        );
    }
    if !call.ca_path.is_empty() {
        let dir = std::fs::read_dir(&call.ca_path)
            .map_err(|e| format!("cannot read ca_path {}: {e}", call.ca_path))?;
        let mut files: Vec<_> = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for f in files {
            if f.is_file() {
                pems.push(
                    std::fs::read(&f).map_err(|e| format!("cannot read {}: {e}", f.display()))?,
                );
            }
        }
    }
    let mut cb = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)));
    if !pems.is_empty() {
        let mut certs = Vec::new();
        for pem in &pems {
            for item in ureq::tls::parse_pem(pem) {
                if let Ok(ureq::tls::PemItem::Certificate(c)) = item {
                    certs.push(c);
                }
            }
        }
        if certs.is_empty() {
            return Err("ca_file/ca_path hold no PEM certificate".into());
        }
        cb = cb.tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::new_with_certs(&certs))
                .build(),
        );
    }
    Ok(cb.build().into())
}

fn do_http(call: &HttpCall) -> Result<(u16, Vec<u8>), String> {
    let agent = tls_agent(call)?;
    let req = ureq::http::Request::builder()
        .method(call.method.as_str())
        .uri(&call.url)
        .header("Content-Type", "application/json")
        .body(call.body.clone())
        .map_err(|e| e.to_string())?;
    let mut resp = agent.run(req).map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .body_mut()
        .with_config()
        .limit(16 << 20)
        .read_to_vec()
        .map_err(|e| e.to_string())?;
    Ok((status, body))
}

/// Performs an `HttpCall` on its own thread; the result goes back to the core.
pub fn http_call(call: HttpCall, tx: Sender<Msg>) {
    let spawned = std::thread::Builder::new()
        .name("cairn-http-out".into())
        .spawn(move || {
            let result = do_http(&call);
            let _ = tx.send(Msg::Input(Input::HttpReply(HttpReply {
                call_id: call.call_id,
                result,
            })));
        });
    if let Err(e) = spawned {
        log::error!("cannot start an outbound call thread: {e}");
    }
}

/// Replication settings and the license from the server configuration.
///
/// ```hcl
/// replication {
///   wal_max_entries = 100000     # log shipper length
///   wal_max_bytes   = 268435456  # log shipper size
///   wal_max_key_entries = 1000000 # keys of dropped entries kept (0: none; a secondary
///                                 # behind them all goes through Merkle diff and sync)
///   pull_wait_ms    = 2000       # long-poll hold time
///   pull_gap_ms     = 10         # least time between two WAL pulls of a secondary while
///                                # writes come faster than that (0: none)
///   batch_entries   = 512        # most WAL entries per pull answer
///   scan_pace_ms    = 1          # least time between two steps of a reindex
///   scan_chunk      = 1024       # keys read per step of a reindex or Merkle check
/// }
/// license_path        = "/etc/cairn/license.json"
/// license_trusted_key = "<base64 Ed25519 public key of the issuer>"
/// hosted              = false
/// ```
pub fn node_settings(
    cfg: &crate::config::ServerConfig,
    api_scheme: &str,
    dev: bool,
    now_ms: u64,
) -> Result<
    (
        cairn_core::replication::ReplicationConfig,
        cairn_core::license::LicenseState,
    ),
    String,
> {
    use cairn_core::license::{self, LicenseState};
    let mut rc = cairn_core::replication::ReplicationConfig {
        api_addr: cfg
            .api_addr
            .clone()
            .unwrap_or_else(|| format!("{api_scheme}://{}", cfg.address)),
        cluster_addr: cfg
            .cluster_addr
            .clone()
            .unwrap_or_else(|| cfg.cluster_address.clone())
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string(),
        // A reindex or Merkle check steps once per round of the core thread's loop.
        scan_pace_ms: 0,
        // 1,024 keys a step (about half a millisecond of hashing): each round also costs a
        // transaction, a tick and a re-seek of the scan, which 512 paid twice as often.
        scan_chunk: 1024,
        // Under a steady write load a secondary pulls at most 100 times a second, each pull
        // carrying up to 10 ms of the primary's commits, instead of once per commit (each
        // pull costs both sides a commit whatever it carries). A quiet primary's writes still
        // leave at once. BENCHMARKS.md, "Write throughput and replication lag vs performance
        // secondaries", has the trade: lag for CPU per write.
        pull_gap_ms: 10,
        ..Default::default()
    };
    if let Some(v) = cfg.extra.get("replication") {
        let block = match v {
            serde_json::Value::Array(a) if a.len() == 1 => &a[0],
            other => other,
        };
        let obj = block.as_object().ok_or("replication: expected a block")?;
        for (k, val) in obj {
            if k == "wal_max_key_entries" {
                rc.wal.max_key_entries = val
                    .as_u64()
                    .ok_or_else(|| format!("replication.{k}: expected a number (0: keep none)"))?;
                continue;
            }
            if k == "pull_gap_ms" {
                rc.pull_gap_ms = val.as_u64().ok_or_else(|| {
                    format!("replication.{k}: expected a number of milliseconds (0: none)")
                })?;
                continue;
            }
            let n = val
                .as_u64()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("replication.{k}: expected a positive number"))?;
            match k.as_str() {
                "wal_max_entries" => rc.wal.max_entries = n,
                "wal_max_bytes" => rc.wal.max_bytes = n,
                "pull_wait_ms" => rc.pull_wait_ms = n,
                "batch_entries" => rc.batch_entries = n.min(u32::MAX as u64) as u32,
                "scan_pace_ms" => rc.scan_pace_ms = n,
                "scan_chunk" => rc.scan_chunk = n.min(1 << 20) as usize,
                other => return Err(format!("replication: unknown key {other:?}")),
            }
        }
    }
    let hosted = match cfg.extra.get("hosted") {
        None => false,
        Some(serde_json::Value::Bool(b)) => *b,
        Some(_) => return Err("hosted: expected true or false".into()),
    };
    let mut lic = LicenseState {
        hosted,
        ..Default::default()
    };
    if dev {
        lic.license = Some(license::dev_license(now_ms));
    } else if let Some(path) = &cfg.license_path {
        let key = cfg
            .extra
            .get("license_trusted_key")
            .and_then(|v| v.as_str())
            .ok_or(
                "license_path is set but license_trusted_key (the issuer's public key) is not",
            )?;
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read license {}: {e}", path.display()))?;
        match license::verify(&text, key) {
            Ok(l) => lic.license = Some(l),
            Err(e) => {
                log::error!("license {} refused: {e}", path.display());
                lic.problem = Some(e);
            }
        }
    }
    Ok((rc, lic))
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};

    /// A CA, a certificate for 127.0.0.1 signed by it and a client certificate it signed
    /// (PEM: CA, then cert and key, then the client's).
    fn ca_and_cert() -> (String, String, String, super::ClientCert) {
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.clone().self_signed(&ca_key).expect("ca");
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .expect("params")
            .signed_by(&key, &issuer)
            .expect("cert");
        let client_key = rcgen::KeyPair::generate().expect("key");
        let mut cp = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        cp.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let client = cp.signed_by(&client_key, &issuer).expect("client cert");
        (
            ca_cert.pem(),
            cert.pem(),
            key.serialize_pem(),
            super::ClientCert {
                cert_pem: client.pem(),
                key_pem: client_key.serialize_pem().into(),
            },
        )
    }

    /// One GET on a plain keep-alive connection: the status line.
    fn get_plain(conn: &mut BufReader<std::net::TcpStream>) -> std::io::Result<String> {
        conn.get_mut()
            .write_all(b"GET /x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n")?;
        let mut status = String::new();
        conn.read_line(&mut status)?;
        let mut line = String::new();
        while conn.read_line(&mut line)? > 2 {
            line.clear();
        }
        let mut body = [0u8; 2];
        std::io::Read::read_exact(conn, &mut body)?;
        Ok(status)
    }

    #[test]
    fn plain_requests_are_served_only_until_the_listener_serves_tls() {
        assert!(super::admits(false, false));
        assert!(super::admits(true, false));
        assert!(super::admits(true, true));
        assert!(!super::admits(false, true));
    }

    /// The switch to TLS keeps the socket: a connection made before it is served to its
    /// end in plain HTTP, one made after it gets TLS, and nothing in between is refused.
    #[test]
    fn the_listener_switches_to_tls_in_place() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server =
            std::sync::Arc::new(tiny_http::Server::from_listener(listener, None).expect("server"));
        let srv = server.clone();
        std::thread::spawn(move || {
            while let Ok(rq) = srv.recv() {
                let _ = rq.respond(tiny_http::Response::from_string("ok"));
            }
        });
        let mut before = BufReader::new(std::net::TcpStream::connect(addr).expect("connect"));
        assert!(get_plain(&mut before).expect("plain").contains("200"));

        let (ca, cert, key, client) = ca_and_cert();
        server
            .set_ssl(tiny_http::SslConfig {
                certificate: cert.into_bytes(),
                private_key: key.into_bytes(),
                client_ca: Some(ca.clone().into_bytes()),
            })
            .expect("set_ssl");

        assert!(
            get_plain(&mut before)
                .expect("same connection")
                .contains("200"),
            "a connection from before the switch is still served"
        );
        let agent = super::pinned_agent(&ca, Some(&client)).expect("agent");
        let mut r = agent.get(&format!("https://{addr}/x")).call().expect("TLS");
        assert_eq!(r.status().as_u16(), 200);
        assert_eq!(r.body_mut().read_to_string().expect("body"), "ok");

        // Mutual TLS: a client that pins the right CA but presents no certificate, or one
        // of another CA, fails the handshake and gets no answer.
        let anonymous =
            super::pinned_agent_with(&ca, None, std::time::Duration::from_secs(2)).expect("agent");
        assert!(
            anonymous.get(&format!("https://{addr}/x")).call().is_err(),
            "a client without a certificate is refused"
        );
        let (_, _, _, stranger) = ca_and_cert();
        let other = super::pinned_agent(&ca, Some(&stranger)).expect("agent");
        assert!(
            other.get(&format!("https://{addr}/x")).call().is_err(),
            "a client certificate of another CA is refused"
        );
        let mut after = BufReader::new(std::net::TcpStream::connect(addr).expect("connect"));
        assert!(
            get_plain(&mut after).is_err(),
            "a plain request after the switch gets no answer"
        );
    }

    /// The replication settings of a server configuration with this `replication` block
    /// (none when empty).
    fn settings(block: &str) -> Result<cairn_core::replication::ReplicationConfig, String> {
        let replication = if block.is_empty() {
            String::new()
        } else {
            format!("replication {{\n{block}}}\n")
        };
        let cfg = crate::config::parse(&format!(
            "storage \"sqlite\" {{ path = \"/x\" }}\nlistener \"tcp\" {{\n address = \
             \"127.0.0.1:1\"\n tls_disable = true\n}}\n{replication}"
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        super::node_settings(&cfg, "http", true, 0).map(|(rc, _)| rc)
    }

    #[test]
    fn every_replication_key_the_configuration_accepts_is_applied() {
        let rc = settings(
            " wal_max_entries = 7\n wal_max_bytes = 8\n pull_wait_ms = 9\n pull_gap_ms = 0\n \
             batch_entries = 11\n scan_pace_ms = 12\n scan_chunk = 13\n wal_max_key_entries = 0\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (
                rc.wal.max_entries,
                rc.wal.max_bytes,
                rc.pull_wait_ms,
                rc.pull_gap_ms,
                rc.batch_entries,
                rc.scan_pace_ms,
                rc.scan_chunk,
                rc.wal.max_key_entries
            ),
            (7, 8, 9, 0, 11, 12, 13, 0)
        );
        // Unset, a secondary's pulls keep a gap; a gap is not a positive-only number.
        let rc = settings("").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rc.pull_gap_ms, 10);
        let err = settings(" pull_gap_ms = \"soon\"\n")
            .err()
            .unwrap_or_default();
        assert!(err.contains("replication.pull_gap_ms"), "{err}");
    }
}
