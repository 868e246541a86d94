//! The API listener: each request is turned into a core request, its body size limit
//! enforced and the core's response written back, on the connection's own thread when it can
//! be ([`answer_inline`]), else on a tiny_http worker thread. Requests whose framing
//! is ambiguous never get here: tiny_http refuses them on the connection (`crate::framing`).

use crate::runtime::Core;
use cairn_core::api::{ApiError, Method, Response};
use std::io::Read;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tiny_http::{Header, Server};

pub struct ApiOptions {
    pub max_body: usize,
    pub threads: usize,
    /// Connections held at once and how long they may wait for a request.
    pub limits: tiny_http::ConnectionLimits,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A request id no other request of this process has (API and forwarded requests).
pub fn next_request_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

pub struct TlsFiles {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

/// Binds a TCP listener with `TCP_NODELAY` set; the sockets it accepts inherit it, so a
/// response written in more than one segment is not held back waiting for the client's
/// delayed ACK. The error is the system's, so the caller can tell a busy port.
pub fn bind(addr: &str) -> std::io::Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr)?;
    if let Err(e) = socket2::SockRef::from(&l).set_tcp_nodelay(true) {
        log::warn!("TCP_NODELAY not set on {addr}: {e}");
    }
    Ok(l)
}

/// Serves the bound `listener` (TLS when `tls` is given) on worker threads. Connections made
/// since it was bound wait in its backlog until then.
pub fn serve(
    listener: std::net::TcpListener,
    tls: Option<TlsFiles>,
    core: Core,
    opts: ApiOptions,
) -> Result<std::net::SocketAddr, String> {
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let ssl = tls.map(|t| tiny_http::SslConfig {
        certificate: t.cert_pem,
        private_key: t.key_pem,
        client_ca: None,
    });
    let opts = Arc::new(opts);
    // Requests with ambiguous framing are refused before their body is read (crate::framing).
    let server = Server::from_listener_with_inline(
        listener,
        ssl,
        Some(crate::framing::head_check),
        opts.limits,
        Some(answer_inline(core.clone(), opts.clone())),
    )
    .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| format!("listener on {addr} has no IP address"))?;
    let server = Arc::new(server);
    for i in 0..opts.threads.max(1) {
        let server = server.clone();
        let core = core.clone();
        let opts = opts.clone();
        std::thread::Builder::new()
            .name(format!("cairn-http-{i}"))
            .spawn(move || loop {
                match server.recv() {
                    Ok(rq) => handle(rq, &core, &opts),
                    Err(e) => {
                        log::warn!("http accept error: {e}");
                    }
                }
            })
            .map_err(|e| e.to_string())?;
    }
    Ok(local)
}

/// API requests are answered on their connection's own thread when they can be: the
/// request goes to the core thread (or, on a standby that forwards along a route
/// ([`Core::forwards`]), out to the active node) and the answer is written from there, with
/// no hand-off to a worker thread and back (each a thread wake-up on the request's path).
/// On the core path only requests whose body is already in memory (none, or a small one
/// read with the head) are taken, so a slow body never holds a connection busy here (a busy
/// connection cannot make room for a new one); a forward takes any request, as before.
/// At most [`inline_places`] at once: beyond that, and for the requests not taken, the
/// workers answer them as before.
fn answer_inline(core: Core, opts: Arc<ApiOptions>) -> tiny_http::Inline {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let places = inline_places(&opts);
    Arc::new(move |rq| {
        if !core.forwards() && !rq.body_in_memory() {
            return Some(rq);
        }
        let Some(_slot) = Slot::take(&in_flight, places) else {
            return Some(rq);
        };
        handle(rq, &core, &opts);
        None
    })
}

/// How many requests are answered on their connections' threads at once: as many as the
/// workers, and at most half of `max_connections`, so that the other half of the held
/// connections can always make room for a new client (a connection being answered on its
/// own thread is busy, not waiting).
fn inline_places(opts: &ApiOptions) -> usize {
    opts.threads
        .max(1)
        .min(opts.limits.max_connections / 2)
        .max(1)
}

/// One of a bounded number of places (released when dropped).
struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// A place among `max`, if one is free.
    fn take(count: &Arc<AtomicUsize>, max: usize) -> Option<Slot> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(count.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The first non-empty value of the first of `names` that has one (`X-Service-*` before
/// `X-Vault-*`): an empty header is as if absent, as in the reference.
fn first_header(headers: &[(String, String)], names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| {
        headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.trim())
            .find(|v| !v.is_empty())
            .map(str::to_string)
    })
}

/// The client token, as the reference reads it: `X-Vault-Token` (or its `X-Service-Token`
/// alias, first) when non-empty, else the first `Authorization` header of the form
/// `Bearer <token>` (the scheme's case as the reference has it; other schemes are someone
/// else's and ignored).
fn request_token(headers: &[(String, String)]) -> Option<String> {
    first_header(headers, &["X-Service-Token", "X-Vault-Token"]).or_else(|| {
        headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("Authorization"))
            .find_map(|(_, v)| v.strip_prefix("Bearer ").map(|t| t.trim().to_string()))
    })
}

/// The query string's parameters in order, form-decoded (`+` is a space).
fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k, true), percent_decode(v, true))
        })
        .collect()
}

/// The core request for an HTTP request: `url` is the request target (path and query),
/// `headers` its headers in order. A path outside `/v1/` is a 404.
fn core_request(
    id: u64,
    method: Method,
    url: &str,
    headers: &[(String, String)],
    body: Vec<u8>,
) -> Result<cairn_core::Request, ApiError> {
    let (raw_path, query) = url.split_once('?').unwrap_or((url, ""));
    let Some(path) = raw_path.strip_prefix("/v1/") else {
        return Err(ApiError::NotFound(format!(
            "no handler for {raw_path}: API paths start with /v1/"
        )));
    };
    let mut req = cairn_core::Request::new(id, method, &percent_decode(path, false));
    req.token = request_token(headers);
    req.namespace = first_header(headers, &["X-Service-Namespace", "X-Vault-Namespace"]);
    req.wrap_ttl = first_header(headers, &["X-Service-Wrap-TTL", "X-Vault-Wrap-TTL"]);
    req.index = first_header(headers, &["X-Service-Index", "X-Vault-Index"]);
    req.content_type = first_header(headers, &["Content-Type"]);
    // The only value the reference knows: send the request on rather than answer 412.
    req.forward_inconsistent = first_header(headers, &["X-Vault-Inconsistent"])
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("forward-active-node"));
    req.body = body;
    req.query = parse_query(query);
    Ok(req)
}

/// Reads a request body of at most `max` bytes: a declared length over the limit is refused
/// before anything is read, and a body that turns out longer (chunked, or lying about its
/// length) is refused once `max + 1` bytes were read (413 both).
fn read_body(declared: Option<usize>, reader: impl Read, max: usize) -> Result<Vec<u8>, ApiError> {
    let too_large = || ApiError::TooLarge(format!("request body larger than {max} bytes"));
    if declared.is_some_and(|n| n > max) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    reader
        .take(max as u64 + 1)
        .read_to_end(&mut body)
        .map_err(|e| ApiError::bad(format!("cannot read request body: {e}")))?;
    if body.len() > max {
        return Err(too_large());
    }
    Ok(body)
}

/// Decodes `%XX` escapes; `plus_is_space` for query strings (form encoding), never for paths.
pub(crate) fn percent_decode(s: &str, plus_is_space: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Some(v) = std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if plus_is_space && b[i] == b'+' {
            b' '
        } else {
            b[i]
        });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The headers of every API answer besides `Content-Type`: `Cache-Control: no-store` (as
/// Vault sends on every API response: answers carry tokens, secrets and wrapped responses,
/// and no cache or proxy between client and server may keep them), and `X-Vault-Index` after
/// a write (the replication state, for read-after-write on secondaries).
#[allow(clippy::expect_used)] // the constant header is valid
fn common_headers(resp: &Response) -> Vec<Header> {
    let mut out =
        vec![Header::from_bytes(&b"Cache-Control"[..], &b"no-store"[..]).expect("static header")];
    out.extend(
        resp.index
            .as_ref()
            .and_then(|v| Header::from_bytes(&b"X-Vault-Index"[..], v.as_bytes()).ok()),
    );
    out
}

/// Writes `resp` as the answer to `rq`.
#[allow(clippy::expect_used)] // the constant header is valid
fn respond(rq: tiny_http::Request, resp: Response) {
    let json =
        Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]).expect("static header");
    let headers = common_headers(&resp);
    let mut out = if let Some((ct, bytes)) = resp.raw {
        let h = Header::from_bytes(&b"Content-Type"[..], ct.as_bytes()).unwrap_or(json);
        tiny_http::Response::from_data(bytes)
            .with_status_code(resp.status)
            .with_header(h)
    } else if let Some(body) = resp.body {
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        tiny_http::Response::from_data(bytes)
            .with_status_code(resp.status)
            .with_header(json)
    } else {
        tiny_http::Response::from_data(Vec::new()).with_status_code(resp.status)
    };
    for h in headers {
        out.add_header(h);
    }
    if let Err(e) = rq.respond(out) {
        log::debug!("client went away before the response: {e}");
    }
}

fn handle(mut rq: tiny_http::Request, core: &Core, opts: &ApiOptions) {
    let id = next_request_id();
    let started = std::time::Instant::now();
    let url = rq.url().to_string();
    let headers: Vec<(String, String)> = rq
        .headers()
        .iter()
        .map(|h| (h.field.as_str().to_string(), h.value.as_str().to_string()))
        .collect();
    if !url.split('?').next().unwrap_or("").starts_with("/v1/") {
        // Answered before the method or the body is looked at.
        let e = core_request(id, Method::Get, &url, &headers, Vec::new())
            .err()
            .unwrap_or(ApiError::NotFound(String::new()));
        return respond(rq, Response::error(id, &e));
    }
    let Some(method) = Method::parse(rq.method().as_str()) else {
        return respond(rq, Response::error(id, &ApiError::MethodNotAllowed));
    };
    let declared = rq.body_length();
    // The body is read before the request is authorized, so every body is bounded by the
    // listener's `max_request_size`, a snapshot to restore too (a larger bound for it would
    // let anyone make the server hold that much): a bigger file is restored through a
    // listener configured with a larger `max_request_size` (loopback only, say).
    let body = match read_body(declared, rq.as_reader(), opts.max_body) {
        Ok(b) => b,
        Err(ApiError::TooLarge(m)) if url.contains("/v1/sys/storage/raft/snapshot") => {
            let e = ApiError::TooLarge(format!(
                "{m}: a snapshot larger than the listener's max_request_size is restored \
                 through a listener configured with a larger max_request_size"
            ));
            return respond(rq, Response::error(id, &e));
        }
        Err(e) => return respond(rq, Response::error(id, &e)),
    };
    let mut req = match core_request(id, method, &url, &headers, body) {
        Ok(r) => r,
        Err(e) => return respond(rq, Response::error(id, &e)),
    };
    req.remote_addr = rq.remote_addr().map(|a| a.to_string()).unwrap_or_default();
    let method = cairn_core::metrics::method_name(req.method);
    let class = cairn_core::metrics::path_class(&req.path);
    let metrics = req.path.trim_end_matches('/') == "sys/metrics";
    // This thread (the connection's own, or a worker) waits for the answer and writes it
    // itself. Writing it from the thread
    // that releases it (the core or sync thread) saves a hand-off, but a write can wait on
    // the connection: for a pipelined earlier request's answer (tiny_http writes answers in
    // request order), or for a client that does not read. That thread would then stall the
    // server (a pipelined login behind which a health check waited deadlocked it; see the
    // e2e test `pipelined_requests_behind_a_login_are_answered_in_order`).
    let mut resp = core.api_request(req);
    crate::latency::observe(method, &class, started.elapsed());
    if metrics {
        if let Some((ct, bytes)) = resp.raw.as_mut() {
            if ct.starts_with("text/plain") {
                bytes.extend_from_slice(crate::latency::render().as_bytes());
            }
        }
    }
    respond(rq, resp);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain listener on a free loopback port with `inline` as its inline handler.
    fn inline_server(inline: tiny_http::Inline) -> (Server, std::net::SocketAddr) {
        let listener = bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let server = Server::from_listener_with_inline(
            listener,
            None,
            None,
            tiny_http::ConnectionLimits::default(),
            Some(inline),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        (server, addr)
    }

    /// Clients that connect at once are all served while all of them stay connected: no new
    /// connection waits for a connection thread behind kept-alive ones (the vendored
    /// tiny_http's thread pool once queued it until another client left).
    #[test]
    fn clients_connecting_at_once_are_all_served_while_they_stay_connected() {
        use std::io::Write;
        let (_server, addr) = inline_server(Arc::new(|rq: tiny_http::Request| {
            let _ = rq.respond(tiny_http::Response::from_string("served"));
            None
        }));
        for round in 0..5 {
            let mut clients: Vec<std::net::TcpStream> = (0..24)
                .map(|_| std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}")))
                .collect();
            for (i, c) in clients.iter_mut().enumerate() {
                c.set_read_timeout(Some(std::time::Duration::from_secs(5)))
                    .unwrap_or_else(|e| panic!("{e}"));
                c.write_all(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
                    .unwrap_or_else(|e| panic!("{e}"));
                let mut got = Vec::new();
                let mut buf = [0u8; 256];
                while !String::from_utf8_lossy(&got).ends_with("served") {
                    match c.read(&mut buf) {
                        Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                        other => panic!(
                            "round {round}: client {i} of 24 was not served while the others \
                             stayed connected: {other:?}"
                        ),
                    }
                }
            }
        }
    }

    #[test]
    fn an_inline_handler_answers_on_the_connection_thread_and_hands_back_the_rest() {
        use std::io::Write;
        let (server, addr) = inline_server(Arc::new(|rq: tiny_http::Request| {
            if rq.url() != "/inline" {
                return Some(rq);
            }
            let _ = rq.respond(tiny_http::Response::from_string("answered inline"));
            None
        }));
        let mut c = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap_or_else(|e| panic!("{e}"));
        let read_answer = |c: &mut std::net::TcpStream| {
            let mut got = Vec::new();
            let mut buf = [0u8; 512];
            while !String::from_utf8_lossy(&got).ends_with("inline")
                && !String::from_utf8_lossy(&got).ends_with("queued")
            {
                let n = c.read(&mut buf).unwrap_or_else(|e| panic!("{e}"));
                assert!(
                    n > 0,
                    "connection closed: {}",
                    String::from_utf8_lossy(&got)
                );
                got.extend_from_slice(&buf[..n]);
            }
            String::from_utf8_lossy(&got).into_owned()
        };
        // Answered although nobody calls recv().
        c.write_all(b"GET /inline HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(read_answer(&mut c).ends_with("answered inline"));
        assert!(matches!(server.try_recv(), Ok(None)));
        // Anything else on the same connection is queued for the workers as before.
        c.write_all(b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let rq = server
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("the other request was not queued"));
        assert_eq!(rq.url(), "/other");
        let _ = rq.respond(tiny_http::Response::from_string("queued"));
        assert!(read_answer(&mut c).ends_with("queued"));
    }

    /// On a node that does not forward, an API request whose body is in memory (none, or a
    /// small one) is answered on its connection's thread through the core, with no worker
    /// running; a large or chunked body is left for the workers.
    #[test]
    fn api_requests_with_their_body_in_memory_are_answered_on_the_connection_thread() {
        use std::io::Write;
        let (tx, rx) = std::sync::mpsc::channel::<crate::runtime::Msg>();
        // The core: answers each request with its path and body length.
        std::thread::spawn(move || {
            while let Ok(m) = rx.recv() {
                if let crate::runtime::Msg::Request(req, answer) = m {
                    let body = serde_json::json!({"path": req.path, "len": req.body.len()});
                    let _ = answer.send(Response::json(req.id, 200, body));
                }
            }
        });
        let opts = Arc::new(ApiOptions {
            max_body: 1 << 20,
            threads: 4,
            limits: tiny_http::ConnectionLimits::default(),
        });
        let listener = bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let core = Core::from_sender(tx);
        let server = Server::from_listener_with_inline(
            listener,
            None,
            None,
            opts.limits,
            Some(answer_inline(core.clone(), opts.clone())),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut c = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap_or_else(|e| panic!("{e}"));
        let read_answer = |c: &mut std::net::TcpStream, end: &str| {
            let mut got = Vec::new();
            let mut buf = [0u8; 512];
            while !String::from_utf8_lossy(&got).ends_with(end) {
                let n = c.read(&mut buf).unwrap_or_else(|e| panic!("{e}"));
                assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
                got.extend_from_slice(&buf[..n]);
            }
            String::from_utf8_lossy(&got).into_owned()
        };
        // No body, then a small one: answered although no worker calls recv().
        c.write_all(b"GET /v1/kv1/a HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let a = read_answer(&mut c, "}");
        assert!(a.contains("\"path\":\"kv1/a\""), "{a}");
        assert!(
            a.to_ascii_lowercase().contains("cache-control: no-store"),
            "{a}"
        );
        c.write_all(b"PUT /v1/kv1/b HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\n{\"v\":1}")
            .unwrap_or_else(|e| panic!("{e}"));
        let a = read_answer(&mut c, "}");
        assert!(a.contains("\"len\":7"), "{a}");
        assert!(matches!(server.try_recv(), Ok(None)));
        // A body larger than what is read with the head, and a chunked one: for the workers.
        let big = vec![b'x'; 2000];
        c.write_all(
            format!(
                "PUT /v1/kv1/c HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
                big.len()
            )
            .as_bytes(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        c.write_all(&big).unwrap_or_else(|e| panic!("{e}"));
        let rq = server
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("the large body was not queued"));
        assert_eq!(rq.url(), "/v1/kv1/c");
        assert!(!rq.body_in_memory());
        handle(rq, &core, &opts);
        let a = read_answer(&mut c, "}");
        assert!(a.contains("\"len\":2000"), "{a}");
        c.write_all(
            b"PUT /v1/kv1/d HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let rq = server
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("the chunked body was not queued"));
        assert_eq!(rq.url(), "/v1/kv1/d");
    }

    #[test]
    fn inline_places_leave_half_the_connections_free() {
        let opts = |threads, max_connections| ApiOptions {
            max_body: 1,
            threads,
            limits: tiny_http::ConnectionLimits {
                max_connections,
                ..Default::default()
            },
        };
        assert_eq!(inline_places(&opts(32, 1000)), 32);
        assert_eq!(inline_places(&opts(32, 20)), 10);
        assert_eq!(inline_places(&opts(0, 1000)), 1);
        assert_eq!(inline_places(&opts(4, 1)), 1);
    }

    #[test]
    fn inline_forwards_take_at_most_their_share_of_places() {
        let count = Arc::new(AtomicUsize::new(0));
        let a = Slot::take(&count, 2).unwrap_or_else(|| panic!("first place"));
        let b = Slot::take(&count, 2).unwrap_or_else(|| panic!("second place"));
        assert!(Slot::take(&count, 2).is_none());
        drop(a);
        let c = Slot::take(&count, 2).unwrap_or_else(|| panic!("a freed place"));
        drop((b, c));
        assert_eq!(count.load(Ordering::Acquire), 0);
    }

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn req(url: &str, headers: &[(&str, &str)]) -> cairn_core::Request {
        core_request(7, Method::Get, url, &h(headers), Vec::new()).expect("a /v1/ request")
    }

    #[test]
    fn paths_are_percent_decoded_but_plus_stays_a_plus() {
        let r = req("/v1/secret/a%2Fb%20c+d", &[]);
        assert_eq!(r.path, "secret/a/b c+d");
        // Escapes that are not two hex digits, or cut short, are kept as written.
        assert_eq!(percent_decode("a%zzb%4", false), "a%zzb%4");
        assert_eq!(percent_decode("%", false), "%");
        assert_eq!(percent_decode("%41%42", false), "AB");
        assert_eq!(percent_decode("x%4", false), "x%4");
        // Bytes that are not UTF-8 become replacement characters, never a panic.
        assert_eq!(percent_decode("%ff", false), "\u{fffd}");
    }

    #[test]
    fn the_query_is_form_decoded_in_order() {
        let r = req("/v1/sys/health?standbyok=true&a+b=c%26d+e&flag&&x=1=2", &[]);
        assert_eq!(r.path, "sys/health");
        assert_eq!(
            r.query,
            vec![
                ("standbyok".to_string(), "true".to_string()),
                ("a b".to_string(), "c&d e".to_string()),
                ("flag".to_string(), String::new()),
                ("x".to_string(), "1=2".to_string()),
            ]
        );
        assert_eq!(r.query("a b"), Some("c&d e"));
    }

    #[test]
    fn paths_outside_v1_are_404_naming_the_path() {
        for url in ["/v2/secret/x", "/secret/x", "/v1", "/", "v1/secret/x"] {
            let e = core_request(1, Method::Get, url, &[], Vec::new()).unwrap_err();
            assert_eq!(e.status(), 404, "{url}");
            let raw = url.split('?').next().unwrap_or(url);
            assert!(
                e.to_string().contains(&format!("no handler for {raw}")),
                "{url}: {e}"
            );
        }
        // The query is not part of the path it names.
        let e = core_request(1, Method::Get, "/v2/x?token=abc", &[], Vec::new()).unwrap_err();
        assert!(!e.to_string().contains("abc"), "{e}");
    }

    #[test]
    fn token_header_precedence_follows_the_reference() {
        let tok = |hs: &[(&str, &str)]| req("/v1/auth/token/lookup-self", hs).token;
        assert_eq!(tok(&[]), None);
        assert_eq!(tok(&[("X-Vault-Token", "v")]), Some("v".into()));
        assert_eq!(tok(&[("Authorization", "Bearer b")]), Some("b".into()));
        // X-Vault-Token wins over Authorization, in either order.
        assert_eq!(
            tok(&[("Authorization", "Bearer b"), ("X-Vault-Token", "v")]),
            Some("v".into())
        );
        assert_eq!(
            tok(&[("X-Vault-Token", "v"), ("Authorization", "Bearer b")]),
            Some("v".into())
        );
        // Cairn's own alias comes first.
        assert_eq!(
            tok(&[("X-Vault-Token", "v"), ("X-Service-Token", "s")]),
            Some("s".into())
        );
        // Header names compare without case.
        assert_eq!(tok(&[("x-vault-token", "v")]), Some("v".into()));
        assert_eq!(tok(&[("AUTHORIZATION", "Bearer b")]), Some("b".into()));
        // An empty X-Vault-Token is as if absent: the bearer token is used.
        assert_eq!(
            tok(&[("X-Vault-Token", ""), ("Authorization", "Bearer b")]),
            Some("b".into())
        );
        assert_eq!(tok(&[("X-Vault-Token", "  ")]), None);
        // The token is trimmed.
        assert_eq!(tok(&[("Authorization", "Bearer   b  ")]), Some("b".into()));
    }

    #[test]
    fn malformed_authorization_headers_give_no_token() {
        let tok = |v: &str| req("/v1/sys/mounts", &[("Authorization", v)]).token;
        // Other schemes belong to someone else; the scheme is matched as the reference does
        // (`Bearer ` with its case and a space).
        for v in [
            "Basic dXNlcjpwYXNz",
            "Bearer",
            "bearer b",
            "BEARER b",
            "Bearerb",
            "",
        ] {
            assert_eq!(tok(v), None, "{v:?}");
        }
        // The first Authorization header with a bearer token counts.
        let r = req(
            "/v1/sys/mounts",
            &[
                ("Authorization", "Basic x"),
                ("Authorization", "Bearer second"),
            ],
        );
        assert_eq!(r.token.as_deref(), Some("second"));
    }

    #[test]
    fn namespace_wrap_ttl_and_index_headers_alias_and_precedence() {
        let r = req(
            "/v1/secret/x",
            &[
                ("X-Vault-Namespace", "ns1/"),
                ("X-Vault-Wrap-TTL", "5m"),
                ("X-Vault-Index", "idx"),
            ],
        );
        assert_eq!(r.namespace.as_deref(), Some("ns1/"));
        assert_eq!(r.wrap_ttl.as_deref(), Some("5m"));
        assert_eq!(r.index.as_deref(), Some("idx"));
        let r = req(
            "/v1/secret/x",
            &[
                ("X-Vault-Namespace", "vault/"),
                ("x-service-namespace", "service/"),
                ("X-Vault-Wrap-TTL", "5m"),
                ("X-Service-Wrap-TTL", "1h"),
            ],
        );
        assert_eq!(r.namespace.as_deref(), Some("service/"));
        assert_eq!(r.wrap_ttl.as_deref(), Some("1h"));
        assert_eq!(r.index, None);
        // Empty values are absent (no wrapping asked for with an empty TTL).
        let r = req(
            "/v1/secret/x",
            &[("X-Vault-Wrap-TTL", ""), ("X-Vault-Namespace", " ")],
        );
        assert_eq!(r.wrap_ttl, None);
        assert_eq!(r.namespace, None);
    }

    #[test]
    fn body_limit_refuses_declared_and_actual_overruns() {
        // Within the limit, and exactly at it.
        assert_eq!(read_body(Some(3), &b"abc"[..], 3).unwrap(), b"abc");
        assert_eq!(read_body(None, &b"abc"[..], 3).unwrap(), b"abc");
        assert_eq!(read_body(None, &b""[..], 0).unwrap(), b"");
        // A declared length over the limit is refused before reading: the reader would fail.
        struct Unread;
        impl Read for Unread {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                panic!("the body was read");
            }
        }
        let e = read_body(Some(4), Unread, 3).unwrap_err();
        assert_eq!(e.status(), 413);
        assert!(e.to_string().contains("larger than 3 bytes"), "{e}");
        // No declared length (chunked) or a lying one: refused once one byte too many came.
        for declared in [None, Some(1)] {
            let e = read_body(declared, &b"abcd"[..], 3).unwrap_err();
            assert_eq!(e.status(), 413, "{declared:?}");
        }
        // Only max + 1 bytes are read of an endless body.
        let e = read_body(None, std::io::repeat(b'x'), 1 << 10).unwrap_err();
        assert_eq!(e.status(), 413);
        // A read error is a 400 saying so.
        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("connection reset"))
            }
        }
        let e = read_body(None, Broken, 10).unwrap_err();
        assert_eq!(e.status(), 400);
        assert!(e.to_string().contains("connection reset"), "{e}");
    }

    /// Every kind of API answer (JSON data, JSON error, empty, raw text such as metrics, and
    /// one after a write) goes out with `Cache-Control: no-store`, written by [`respond`]
    /// over a real connection.
    #[test]
    fn every_answer_is_sent_with_cache_control_no_store() {
        use std::io::Write;
        let mut with_index =
            Response::json(4, 200, serde_json::json!({"auth": {"client_token": "s"}}));
        with_index.index = Some("idx".into());
        let answers = vec![
            Response::json(1, 200, serde_json::json!({"data": {"secret": "v"}})),
            Response::error(2, &ApiError::PermissionDenied),
            Response::no_content(3),
            with_index,
            Response {
                raw: Some(("text/plain; version=0.0.4".into(), b"cairn_up 1\n".to_vec())),
                ..Response::no_content(5)
            },
        ];
        let server = tiny_http::Server::http("127.0.0.1:0").expect("listen");
        let addr = server.server_addr().to_ip().expect("an IP address");
        for resp in answers {
            let status = resp.status;
            let index = resp.index.is_some();
            let client = std::thread::spawn(move || {
                let mut c = std::net::TcpStream::connect(addr).expect("connect");
                c.write_all(b"GET /v1/secret/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
                    .expect("write");
                let mut out = String::new();
                c.read_to_string(&mut out).expect("read");
                out
            });
            let rq = server.recv().expect("a request");
            respond(rq, resp);
            let text = client.join().expect("client").to_ascii_lowercase();
            let head = text.split("\r\n\r\n").next().unwrap_or_default();
            assert!(head.starts_with(&format!("http/1.1 {status}")), "{head}");
            assert!(
                head.lines().any(|l| l.trim() == "cache-control: no-store"),
                "{status}: {head}"
            );
            assert_eq!(head.contains("x-vault-index: idx"), index, "{head}");
        }
    }

    #[test]
    fn the_body_and_method_reach_the_core_request() {
        let r = core_request(
            9,
            Method::Put,
            "/v1//secret/x",
            &h(&[("Content-Type", "application/json")]),
            b"{\"v\":1}".to_vec(),
        )
        .unwrap();
        assert_eq!(r.id, 9);
        assert_eq!(r.method, Method::Put);
        assert_eq!(r.path, "secret/x");
        assert_eq!(r.body, b"{\"v\":1}");
        assert_eq!(r.token, None);
    }
}
