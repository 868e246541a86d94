//! The API listener: tiny_http worker threads turn HTTP requests into core requests,
//! enforce the body size limit, and write the core's responses back. Requests whose framing
//! is ambiguous never get here: tiny_http refuses them on the connection (`crate::framing`).

use crate::runtime::Core;
use cairn_core::api::{ApiError, Method, Response};
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tiny_http::{Header, Server};

pub struct ApiOptions {
    pub max_body: usize,
    pub threads: usize,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

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

/// [`bind`] with the error as a message.
pub fn nodelay_listener(addr: &str) -> Result<std::net::TcpListener, String> {
    bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))
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
    });
    // Requests with ambiguous framing are refused before their body is read (crate::framing).
    let server =
        Server::from_listener_with_head_check(listener, ssl, Some(crate::framing::head_check))
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| format!("listener on {addr} has no IP address"))?;
    let server = Arc::new(server);
    let opts = Arc::new(opts);
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

fn header(rq: &tiny_http::Request, name: &str) -> Option<String> {
    rq.headers()
        .iter()
        .find(|h| h.field.as_str().as_str().eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str().to_string())
}

/// Decodes `%XX` escapes; `plus_is_space` for query strings (form encoding), never for paths.
fn percent_decode(s: &str, plus_is_space: bool) -> String {
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

/// Adds the `X-Vault-Index` header when there is one.
fn with_index<R: std::io::Read>(
    mut r: tiny_http::Response<R>,
    index: Option<Header>,
) -> tiny_http::Response<R> {
    if let Some(h) = index {
        r.add_header(h);
    }
    r
}

#[allow(clippy::expect_used)] // the two constant headers are valid
fn respond(rq: tiny_http::Request, resp: Response) {
    let json =
        Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]).expect("static header");
    let nocache =
        Header::from_bytes(&b"Cache-Control"[..], &b"no-store"[..]).expect("static header");
    // The replication state after a write, for read-after-write on secondaries.
    let index = resp
        .index
        .as_ref()
        .and_then(|v| Header::from_bytes(&b"X-Vault-Index"[..], v.as_bytes()).ok());
    let result = if let Some((ct, bytes)) = resp.raw {
        let h = Header::from_bytes(&b"Content-Type"[..], ct.as_bytes()).unwrap_or(json);
        rq.respond(
            tiny_http::Response::from_data(bytes)
                .with_status_code(resp.status)
                .with_header(h),
        )
    } else if let Some(body) = resp.body {
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        rq.respond(with_index(
            tiny_http::Response::from_data(bytes)
                .with_status_code(resp.status)
                .with_header(json)
                .with_header(nocache),
            index,
        ))
    } else {
        rq.respond(with_index(
            tiny_http::Response::empty(resp.status).with_header(nocache),
            index,
        ))
    };
    if let Err(e) = result {
        log::debug!("client went away before the response: {e}");
    }
}

fn handle(mut rq: tiny_http::Request, core: &Core, opts: &ApiOptions) {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let started = std::time::Instant::now();
    let url = rq.url().to_string();
    let (raw_path, query) = url.split_once('?').unwrap_or((&url, ""));
    let Some(path) = raw_path.strip_prefix("/v1/") else {
        return respond(
            rq,
            Response::error(
                id,
                &ApiError::NotFound(format!(
                    "no handler for {raw_path}: API paths start with /v1/"
                )),
            ),
        );
    };
    let Some(method) = Method::parse(rq.method().as_str()) else {
        return respond(rq, Response::error(id, &ApiError::MethodNotAllowed));
    };
    if rq.body_length().is_some_and(|n| n > opts.max_body) {
        return respond(
            rq,
            Response::error(
                id,
                &ApiError::TooLarge(format!("request body larger than {} bytes", opts.max_body)),
            ),
        );
    }
    let mut body = Vec::new();
    if let Err(e) = rq
        .as_reader()
        .take(opts.max_body as u64 + 1)
        .read_to_end(&mut body)
    {
        return respond(
            rq,
            Response::error(id, &ApiError::bad(format!("cannot read request body: {e}"))),
        );
    }
    if body.len() > opts.max_body {
        return respond(
            rq,
            Response::error(
                id,
                &ApiError::TooLarge(format!("request body larger than {} bytes", opts.max_body)),
            ),
        );
    }
    let token = header(&rq, "X-Service-Token")
        .or_else(|| header(&rq, "X-Vault-Token"))
        .or_else(|| {
            header(&rq, "Authorization")
                .and_then(|a| a.strip_prefix("Bearer ").map(|t| t.trim().to_string()))
        });
    let mut req = cairn_core::Request::new(id, method, &percent_decode(path, false));
    req.token = token;
    req.namespace = header(&rq, "X-Service-Namespace").or_else(|| header(&rq, "X-Vault-Namespace"));
    req.wrap_ttl = header(&rq, "X-Service-Wrap-TTL").or_else(|| header(&rq, "X-Vault-Wrap-TTL"));
    req.index = header(&rq, "X-Service-Index").or_else(|| header(&rq, "X-Vault-Index"));
    req.body = body;
    req.remote_addr = rq.remote_addr().map(|a| a.to_string()).unwrap_or_default();
    req.query = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k, true), percent_decode(v, true))
        })
        .collect();
    let method = cairn_core::metrics::method_name(req.method);
    let class = cairn_core::metrics::path_class(&req.path);
    let metrics = req.path.trim_end_matches('/') == "sys/metrics";
    // This worker waits for the answer and writes it itself. Writing it from the thread
    // that releases it (the core or sync thread) saves a hand-off, but a write can wait on
    // the connection: for a pipelined earlier request's answer (tiny_http writes answers in
    // request order), or for a client that does not read. That thread would then stall the
    // server (a pipelined login behind which a health check waited deadlocked it; see the
    // e2e test `pipelined_requests_behind_a_login_are_answered_in_order`).
    let mut resp = core.request(req);
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
