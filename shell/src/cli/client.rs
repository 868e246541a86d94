//! The CLI's HTTP client: builds a ureq agent (rustls, optional custom CA or no verification)
//! from the common options and environment, sends API requests with the token and namespace
//! headers, and turns failures into [`CliError`]s (exit 2 for the server's errors).

use super::{CliError, Common};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig};

/// What to do when a request needed a token and the CLI found none.
pub const NO_TOKEN: &str = "no token: set CAIRN_TOKEN or run `cairn login` (it stores the \
                            token in ~/.cairn-token; `cairn server --dev` stores its root token \
                            there too)";

/// The token file the CLI reads when `CAIRN_TOKEN` is not set, and `login` writes.
pub fn token_file() -> Option<std::path::PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| Path::new(&h).join(".cairn-token"))
}

/// The token from `CAIRN_TOKEN`, else from the token file.
pub fn stored_token() -> Option<String> {
    if let Ok(t) = std::env::var("CAIRN_TOKEN") {
        if !t.trim().is_empty() {
            return Some(t.trim().to_string());
        }
    }
    let p = token_file()?;
    let t = std::fs::read_to_string(p).ok()?;
    let t = t.trim();
    (!t.is_empty()).then(|| t.to_string())
}

/// A response: status and JSON body (`Null` when empty, a string when not JSON).
#[derive(Debug, Clone)]
pub struct ApiResponse {
    pub status: u16,
    pub body: Value,
}

pub struct Client {
    agent: ureq::Agent,
    addr: String,
    pub token: Option<String>,
    namespace: Option<String>,
    wrap_ttl: Option<String>,
}

fn read_certs(path: &Path, out: &mut Vec<Certificate<'static>>) -> Result<(), CliError> {
    let pem = std::fs::read(path)
        .map_err(|e| CliError::Local(format!("cannot read CA file {}: {e}", path.display())))?;
    let before = out.len();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(PemItem::Certificate(c)) => out.push(c),
            Ok(_) => {}
            Err(e) => {
                return Err(CliError::Local(format!(
                    "{}: not a valid PEM file: {e}",
                    path.display()
                )))
            }
        }
    }
    if out.len() == before {
        return Err(CliError::Local(format!(
            "{}: no PEM CERTIFICATE block found",
            path.display()
        )));
    }
    Ok(())
}

fn tls_config(c: &Common) -> Result<TlsConfig, CliError> {
    let mut certs = Vec::new();
    if let Some(f) = c.ca_cert.as_deref().filter(|s| !s.is_empty()) {
        read_certs(Path::new(f), &mut certs)?;
    }
    if let Some(d) = c.ca_path.as_deref().filter(|s| !s.is_empty()) {
        let dir = std::fs::read_dir(d)
            .map_err(|e| CliError::Local(format!("cannot read CA directory {d}: {e}")))?;
        let mut files: Vec<_> = dir
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        for f in files {
            // Non-certificate files in a CA directory are skipped, as OpenSSL does.
            let _ = read_certs(&f, &mut certs);
        }
        if certs.is_empty() {
            return Err(CliError::Local(format!(
                "CA directory {d}: no PEM certificates found"
            )));
        }
    }
    let mut b = TlsConfig::builder().disable_verification(c.tls_skip_verify);
    if !certs.is_empty() {
        b = b.root_certs(RootCerts::Specific(Arc::new(certs)));
    }
    Ok(b.build())
}

impl Client {
    pub fn new(c: &Common) -> Result<Client, CliError> {
        let addr = c.address.trim_end_matches('/').to_string();
        if !(addr.starts_with("http://") || addr.starts_with("https://")) {
            return Err(CliError::Local(format!(
                "address {addr:?}: must start with http:// or https:// (set CAIRN_ADDR or -address)"
            )));
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .allow_non_standard_methods(true)
            .timeout_global(Some(Duration::from_secs(c.timeout.max(1))))
            .tls_config(tls_config(c)?)
            .build()
            .into();
        Ok(Client {
            agent,
            addr,
            token: stored_token(),
            namespace: c.namespace.clone().filter(|n| !n.is_empty()),
            wrap_ttl: c.wrap_ttl.clone().filter(|n| !n.is_empty()),
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}/v1/{}", self.addr, path.trim_start_matches('/'))
    }

    /// Sends one request; any HTTP status is returned, transport failures are errors.
    pub fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<ApiResponse, CliError> {
        let url = self.url(path);
        let mut b = ureq::http::Request::builder().method(method).uri(&url);
        if let Some(t) = &self.token {
            b = b.header("X-Service-Token", t.as_str());
        }
        if let Some(n) = &self.namespace {
            b = b.header("X-Service-Namespace", n.as_str());
        }
        if let Some(w) = &self.wrap_ttl {
            b = b.header("X-Service-Wrap-TTL", w.as_str());
        }
        let data = match body {
            Some(v) => {
                b = b.header("Content-Type", "application/json");
                serde_json::to_vec(v).map_err(|e| CliError::Local(e.to_string()))?
            }
            None => Vec::new(),
        };
        let req = b
            .body(data)
            .map_err(|e| CliError::Local(format!("bad request for {url}: {e}")))?;
        let mut resp = self.agent.run(req).map_err(|e| CliError::Transport {
            method: method.to_string(),
            url: url.clone(),
            msg: e.to_string(),
        })?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(|e| CliError::Transport {
                method: method.to_string(),
                url: url.clone(),
                msg: format!("reading the response: {e}"),
            })?;
        let body = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Ok(ApiResponse { status, body })
    }

    /// Sends `body` as `application/octet-stream` (when not empty) and returns the status,
    /// the raw response body (at most `limit` bytes) and its `X-Vault-Index`.
    pub fn send_bytes(
        &self,
        method: &str,
        path: &str,
        body: Vec<u8>,
        limit: u64,
    ) -> Result<(u16, Vec<u8>, Option<String>), CliError> {
        let url = self.url(path);
        let mut b = ureq::http::Request::builder().method(method).uri(&url);
        if let Some(t) = &self.token {
            b = b.header("X-Service-Token", t.as_str());
        }
        if let Some(n) = &self.namespace {
            b = b.header("X-Service-Namespace", n.as_str());
        }
        if !body.is_empty() {
            b = b.header("Content-Type", "application/octet-stream");
        }
        let req = b
            .body(body)
            .map_err(|e| CliError::Local(format!("bad request for {url}: {e}")))?;
        let transport = |msg: String| CliError::Transport {
            method: method.to_string(),
            url: url.clone(),
            msg,
        };
        let mut resp = self.agent.run(req).map_err(|e| transport(e.to_string()))?;
        let status = resp.status().as_u16();
        let index = resp
            .headers()
            .get("X-Vault-Index")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let bytes = resp
            .body_mut()
            .with_config()
            .limit(limit)
            .read_to_vec()
            .map_err(|e| transport(format!("reading the response: {e}")))?;
        Ok((status, bytes, index))
    }

    /// Like [`Client::send`], but a status of 400 or more is an [`CliError::Api`].
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<ApiResponse, CliError> {
        let r = self.send(method, path, body)?;
        if r.status >= 400 {
            return Err(self.api_error(method, path, &r));
        }
        Ok(r)
    }

    pub fn api_error(&self, method: &str, path: &str, r: &ApiResponse) -> CliError {
        let errors = match &r.body {
            Value::Object(m) => match m.get("errors") {
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|e| {
                        e.as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| e.to_string())
                    })
                    .collect(),
                _ => vec![r.body.to_string()],
            },
            Value::Null => Vec::new(),
            Value::String(s) => vec![s.clone()],
            v => vec![v.to_string()],
        };
        // The server refused a request that needs a token, and the CLI had none to send.
        let hint = (self.token.is_none()
            && r.status == 403
            && errors.iter().any(|e| e.contains("needs a token")))
        .then(|| NO_TOKEN.to_string());
        CliError::Api {
            method: method.to_string(),
            url: self.url(path),
            status: r.status,
            errors,
            hint,
        }
    }
}
