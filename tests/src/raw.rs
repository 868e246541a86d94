//! Calls with a byte body whose answer is kept as bytes with its `X-Vault-Index`: snapshot
//! files up and down, and writes whose index a test compares with a snapshot's point.

use std::time::Duration;

/// An answer with its raw body and `X-Vault-Index`.
pub struct Raw {
    pub status: u16,
    pub body: Vec<u8>,
    pub index: Option<String>,
}

impl Raw {
    /// The body as text (an error envelope, usually).
    pub fn errors(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `method` `addr/v1/path` with `token` and `body`; `None` when no answer came within
/// `timeout` (or the body passed 4 GiB).
pub fn call(
    addr: &str,
    token: &str,
    method: &str,
    path: &str,
    body: Vec<u8>,
    timeout: Duration,
) -> Option<Raw> {
    let agent = crate::agent(timeout);
    let req = ureq::http::Request::builder()
        .method(method)
        .uri(format!("{addr}/v1/{path}"))
        .header("X-Vault-Token", token)
        .body(body)
        .ok()?;
    let mut resp = agent.run(req).ok()?;
    let index = resp
        .headers()
        .get("X-Vault-Index")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let status = resp.status().as_u16();
    let body = resp
        .body_mut()
        .with_config()
        .limit(4 << 30)
        .read_to_vec()
        .ok()?;
    Some(Raw {
        status,
        body,
        index,
    })
}
