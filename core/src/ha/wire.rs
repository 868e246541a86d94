//! The wire format of a request an HA standby forwards to its cluster's active node
//! (`POST /v1/cluster/forward` on the cluster listener) and of the active node's answer:
//! JSON, the body in base64, the standby's signature in `mac`. Pure data: the shell posts
//! and serves it; the fuzz target `forwarded_request` decodes hostile ones.

use crate::api::{Method, Request, Response};
use base64::Engine;
use serde::{Deserialize, Serialize};

/// A forwarded request on the wire.
#[derive(Debug, Serialize, Deserialize)]
pub struct WireRequest {
    pub method: String,
    pub path: String,
    pub token: Option<String>,
    pub namespace: Option<String>,
    pub wrap_ttl: Option<String>,
    pub index: Option<String>,
    pub query: Vec<(String, String)>,
    pub remote_addr: String,
    /// Base64 of the body.
    pub body: String,
    /// The standby's signature.
    pub mac: String,
    /// `X-Vault-Inconsistent: forward-active-node`.
    #[serde(default)]
    pub forward_inconsistent: bool,
    /// The client's `Content-Type` (the active node checks a `PATCH`'s).
    #[serde(default)]
    pub content_type: Option<String>,
}

/// The active node's answer on the wire.
#[derive(Debug, Serialize, Deserialize)]
pub struct WireResponse {
    pub status: u16,
    pub body: Option<serde_json::Value>,
    /// Content type and base64 of a non-JSON body.
    pub raw: Option<(String, String)>,
    pub index: Option<String>,
}

impl WireRequest {
    pub fn of(req: &Request) -> WireRequest {
        WireRequest {
            method: req.method.as_str().into(),
            path: req.path.clone(),
            token: req.token.clone(),
            namespace: req.namespace.clone(),
            wrap_ttl: req.wrap_ttl.clone(),
            index: req.index.clone(),
            query: req.query.clone(),
            remote_addr: req.remote_addr.clone(),
            body: base64::engine::general_purpose::STANDARD.encode(&req.body),
            mac: req.forwarded.clone().unwrap_or_default(),
            forward_inconsistent: req.forward_inconsistent,
            content_type: req.content_type.clone(),
        }
    }

    /// The request the active node runs, under its own id `id`.
    pub fn into_request(self, id: u64) -> Result<Request, String> {
        let method = match self.method.as_str() {
            "LIST" => Method::List,
            m => Method::parse(m).ok_or_else(|| format!("unknown method {m:?}"))?,
        };
        let mut r = Request::new(id, method, &self.path);
        r.path = self.path;
        r.token = self.token;
        r.namespace = self.namespace;
        r.wrap_ttl = self.wrap_ttl;
        r.index = self.index;
        r.query = self.query;
        r.remote_addr = self.remote_addr;
        r.body = base64::engine::general_purpose::STANDARD
            .decode(self.body)
            .map_err(|e| format!("body: {e}"))?;
        r.forwarded = Some(self.mac);
        r.forward_inconsistent = self.forward_inconsistent;
        r.content_type = self.content_type;
        Ok(r)
    }
}

impl WireResponse {
    pub fn of(r: Response) -> WireResponse {
        WireResponse {
            status: r.status,
            body: r.body,
            raw: r
                .raw
                .map(|(ct, b)| (ct, base64::engine::general_purpose::STANDARD.encode(b))),
            index: r.index,
        }
    }

    pub fn into_response(self, id: u64) -> Result<Response, String> {
        let raw = match self.raw {
            Some((ct, b)) => Some((
                ct,
                base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .map_err(|e| format!("answer body: {e}"))?,
            )),
            None => None,
        };
        Ok(Response {
            id,
            status: self.status,
            body: self.body,
            raw,
            index: self.index,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forwarded_request_survives_the_wire_whole() {
        let mut r = Request::new(5, Method::List, "kv/dir/");
        r.token = Some("s.x".into());
        r.namespace = Some("t/".into());
        r.wrap_ttl = Some("60s".into());
        r.index = Some("idx".into());
        r.query = vec![("list".into(), "true".into())];
        r.remote_addr = "10.0.0.9:5555".into();
        r.body = vec![0, 1, 2, 255];
        r.forwarded = Some("mac".into());
        r.forward_inconsistent = true;
        let wire = serde_json::to_vec(&WireRequest::of(&r)).expect("json");
        let back: WireRequest = serde_json::from_slice(&wire).expect("json");
        let b = back.into_request(77).expect("request");
        assert_eq!(b.id, 77);
        assert_eq!(
            (
                b.method,
                &b.path,
                &b.token,
                &b.namespace,
                &b.wrap_ttl,
                &b.index
            ),
            (
                r.method,
                &r.path,
                &r.token,
                &r.namespace,
                &r.wrap_ttl,
                &r.index
            )
        );
        assert_eq!(
            (&b.query, &b.remote_addr, &b.body),
            (&r.query, &r.remote_addr, &r.body)
        );
        assert_eq!(b.forwarded.as_deref(), Some("mac"));
        assert!(b.forward_inconsistent);
    }
}
