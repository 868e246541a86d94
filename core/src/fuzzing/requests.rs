//! The request-level targets: `router` (sequences of arbitrary requests) and `json_bodies`
//! (one endpoint, an arbitrary body).
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)] // a broken promise panics: that is the finding

use super::harness::{harvest, pick_method, Harness, ENDPOINTS, FIELDS, ROOT};
use super::Bytes;
use crate::api::{self, Method, Request};
use crate::node::Input;
use crate::time::Millis;

/// The request router: up to 8 requests with arbitrary method, path, token, headers, query
/// and body against an unsealed dev node. Every request gets exactly one well-formed
/// answer; nothing panics.
pub fn router(data: &[u8]) {
    let mut b = Bytes::new(data);
    let mut h = Harness::new(b.byte() & 1 == 1);
    let mut tokens: Vec<String> = vec![ROOT.into()];
    for _ in 0..8 {
        if b.is_empty() {
            break;
        }
        let flags = b.byte();
        let method = if flags & 0x80 != 0 {
            match Method::parse(&b.string()) {
                Some(m) => m,
                None => continue, // 405 in the shell
            }
        } else {
            pick_method(flags)
        };
        let sel = usize::from(b.byte());
        let path = match ENDPOINTS.get(sel) {
            Some((_, p)) => format!("{p}{}", b.string()),
            None if sel % 2 == 0 => {
                // Long paths, to reach the path length limit.
                let unit = b.string();
                let n = usize::from(b.byte()) * 64;
                unit.repeat(n.min(8192 / unit.len().max(1)))
            }
            None => b.string(),
        };
        let mut req = Request::new(0, method, &path);
        req.token = match (flags >> 3) & 3 {
            0 => None,
            1 => Some(ROOT.into()),
            2 => Some(b.string()),
            _ => tokens.get(usize::from(b.byte()) % tokens.len()).cloned(),
        };
        if flags & 0x20 != 0 {
            req.wrap_ttl = Some(b.string());
        }
        if flags & 0x40 != 0 {
            let q = b.string();
            req.query = q
                .split('&')
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    (k.to_string(), v.to_string())
                })
                .collect();
            req.namespace = Some(b.string());
        }
        req.body = b.long_chunk().to_vec();
        h.now += Millis::from(b.byte()) * 1000;
        if let Some(r) = h.call(req) {
            if let Some(v) = &r.body {
                harvest(v, &mut tokens);
            }
        }
    }
    h.node.handle(h.now + 3_600_000, Input::Tick);
}

/// Write endpoints that take no body (and so need not refuse a deep one).
const IGNORE_BODY: &[&str] = &[
    "sys/seal",
    "sys/replication/dr/primary/demote",
    "sys/replication/dr/primary/disable",
    "sys/replication/dr/secondary/generate-public-key",
    "sys/locked-users/fuzz/unlock/alice",
];

/// Every endpoint's body decoding: one endpoint, a body made of arbitrary bytes (raw, or an
/// arbitrary JSON value under a field the handlers read), with the root token. Beyond the
/// router's promises: a body nesting deeper than the limit is a 4xx.
pub fn json_bodies(data: &[u8]) {
    let mut b = Bytes::new(data);
    let flags = b.byte();
    let (listed, path) = ENDPOINTS[usize::from(b.byte()) % ENDPOINTS.len()];
    let method = if flags & 2 != 0 { Method::Put } else { listed };
    let body = if flags & 4 != 0 {
        let field = FIELDS[usize::from(b.byte()) % FIELDS.len()];
        let mut v = format!("{{\"{field}\":").into_bytes();
        v.extend_from_slice(b.rest());
        v.push(b'}');
        v
    } else {
        b.rest().to_vec()
    };
    let mut h = Harness::new(flags & 1 == 1);
    let mut req = Request::new(0, method, path).with_token(ROOT);
    if flags & 8 != 0 {
        req.wrap_ttl = Some("1m".into());
    }
    req.body = body.clone();
    let Some(r) = h.call(req) else {
        return; // nothing else to check: pending calls are answered by `pump`
    };
    let reads_body = listed.is_write() && method.is_write() && !IGNORE_BODY.contains(&path);
    if reads_body && api::json_too_deep(&body, api::MAX_JSON_DEPTH) && r.status < 300 {
        panic!("{path}: a body nesting deeper than the limit was accepted: {r:?}");
    }
}
