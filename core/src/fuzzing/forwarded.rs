//! The `forwarded_request` target: hostile HA forwarded requests (the wire format of
//! `POST /v1/cluster/forward`, [`crate::ha::wire`]) decoded as the active node's cluster
//! listener decodes them, then handed to the active node of a one-node HA cluster.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)] // a broken promise panics: that is the finding

use super::harness::{check_response, config, ENDPOINTS};
use super::Bytes;
use crate::api::{Method, Request, Response};
use crate::ha::store::{LeaseStore, NodeIdentity, SharedStorage};
use crate::ha::wire::WireRequest;
use crate::ha::{Fence, HaConfig};
use crate::node::{Input, Node, Output};
use crate::time::Millis;
use base64::Engine;
use serde_json::{json, Value};
use std::cell::RefCell;
use std::rc::Rc;

const T: Millis = 5_000;

/// The active node of a one-node HA cluster over its own copy of the shared store.
struct Active {
    node: Node<SharedStorage>,
    store: Rc<RefCell<LeaseStore>>,
    root: String,
}

fn identity() -> NodeIdentity {
    NodeIdentity {
        node_id: "fuzz".into(),
        api_addr: "http://fuzz-api".into(),
        cluster_addr: "fuzz-cluster".into(),
        version: String::new(),
    }
}

impl Active {
    /// Hands `input` over, runs its lease operations against the store, commits its writes
    /// under its fence; the responses that came out.
    fn step(&mut self, now: Millis, input: Input) -> Vec<Response> {
        self.node.handle(now, input);
        let mut out = Vec::new();
        while let Some(o) = self.node.poll_output() {
            match o {
                Output::Lease(op) => {
                    let r = self
                        .store
                        .borrow_mut()
                        .lease_op(now, &identity(), op, 10_000);
                    self.node.handle(now, Input::Lease(r));
                }
                Output::Response(r) => out.push(r),
                _ => {}
            }
        }
        let fence = self.node.fence();
        if self.node.storage_mut().commit(fence).is_err() {
            self.node.storage_rolled_back();
        }
        out
    }

    fn build() -> Active {
        let store = Rc::new(RefCell::new(LeaseStore::new()));
        let mut cfg = config();
        cfg.ha = Some(HaConfig::new("http://fuzz-api", "fuzz-cluster"));
        let node = Node::new(SharedStorage::new(store.clone()), [21; 32], cfg);
        let mut a = Active {
            node,
            store,
            root: String::new(),
        };
        let init = Request::new(1, Method::Put, "sys/init")
            .with_json(json!({"secret_shares": 1, "secret_threshold": 1}));
        let r = a.step(1_000, Input::Request(init));
        let b = r.first().and_then(|r| r.body.clone()).unwrap_or_default();
        let key = b["keys"][0].as_str().unwrap_or_default().to_string();
        a.root = b["root_token"].as_str().unwrap_or_default().to_string();
        let unseal = Request::new(2, Method::Put, "sys/unseal").with_json(json!({ "key": key }));
        a.step(1_100, Input::Request(unseal));
        a.step(2_000, Input::Tick);
        assert_eq!(a.node.fence(), Fence::Epoch(1), "the node is not active");
        let mount = Request::new(3, Method::Post, "sys/mounts/secret")
            .with_token(&a.root)
            .with_json(json!({"type": "kv"}));
        let r = a.step(2_100, Input::Request(mount));
        assert_eq!(r.first().map(|r| r.status), Some(204), "mount: {r:?}");
        // What the node does on its own by the time inputs arrive (lease renewal, periodic
        // work) happens here, so that what an input changes is the input's doing.
        a.step(T, Input::Tick);
        a
    }

    /// A copy of this thread's prototype over a copy of its store: nothing an earlier
    /// input did is in it.
    fn fresh() -> Active {
        thread_local! {
            static PROTO: Active = Active::build();
        }
        PROTO.with(|p| {
            let store = Rc::new(RefCell::new(p.store.borrow().clone()));
            let mut node = p.node.clone();
            node.storage_mut().store = store.clone();
            Active {
                node,
                store,
                root: p.root.clone(),
            }
        })
    }
}

/// A structured wire request, so that most inputs decode: method, path (a known endpoint
/// and a suffix), token, headers, query and body from the bytes.
fn structured(b: &mut Bytes, root: &str) -> Vec<u8> {
    let flags = b.byte();
    let method = match b.byte() % 9 {
        0 => "GET",
        1 => "PUT",
        2 => "POST",
        3 => "DELETE",
        4 => "LIST",
        5 => "PATCH",
        6 => "HEAD",
        7 => "list",
        _ => "",
    };
    let method = if method.is_empty() {
        b.string()
    } else {
        method.to_string()
    };
    let (_, p) = ENDPOINTS[usize::from(b.byte()) % ENDPOINTS.len()];
    let path = format!("{p}{}", b.string());
    let opt = |b: &mut Bytes, bit: u8| (flags & bit != 0).then(|| b.string());
    let token = match flags & 3 {
        0 => None,
        1 => Some(root.to_string()),
        _ => Some(b.string()),
    };
    let body = b.long_chunk();
    let body = if flags & 4 != 0 {
        String::from_utf8_lossy(body).into_owned() // perhaps not base64
    } else {
        base64::engine::general_purpose::STANDARD.encode(body)
    };
    let w = json!({
        "method": method,
        "path": path,
        "token": token,
        "namespace": opt(b, 8),
        "wrap_ttl": opt(b, 16),
        "index": opt(b, 32),
        "query": [[b.string(), b.string()]],
        "remote_addr": b.string(),
        "body": body,
        "mac": b.string(),
        "forward_inconsistent": flags & 64 != 0,
        "content_type": opt(b, 128),
    });
    w.to_string().into_bytes()
}

/// Changes one signed part of a request (what a tampered or replayed-and-edited forward
/// would look like).
fn tamper(req: &mut Request, what: u8, b: &mut Bytes) {
    let s = b.string();
    match what % 9 {
        0 => req.path.push_str(if s.is_empty() { "x" } else { &s }),
        1 => req.token = Some(format!("{}{s}.", req.token.clone().unwrap_or_default())),
        2 => req.namespace = Some(format!("{}{s}/", req.namespace.clone().unwrap_or_default())),
        3 => req.body.push(b.byte()),
        4 => req.query.push((s, String::new())),
        5 => req.wrap_ttl = Some(format!("{}{s}1", req.wrap_ttl.clone().unwrap_or_default())),
        6 => req.remote_addr.push('1'),
        7 => req.forward_inconsistent = !req.forward_inconsistent,
        _ => {
            req.content_type = Some(format!(
                "{}{s};",
                req.content_type.clone().unwrap_or_default()
            ))
        }
    }
}

/// Forwarded requests: the first byte chooses a structured request (odd) or the rest as
/// raw wire bytes, whether the harness signs the decoded request with the cluster's real
/// key (so it reaches the handlers) and whether one signed part is changed afterwards.
/// Promises: decoding never panics and a decoded request re-encodes to itself; the active
/// node answers at most once and never with an internal error; a request whose signature
/// is not the cluster's for exactly what it carries is refused and changes nothing.
pub fn forwarded_request(data: &[u8]) {
    let mut b = Bytes::new(data);
    let flags = b.byte();
    let mut a = Active::fresh();
    let wire = if flags & 1 != 0 {
        structured(&mut b, &a.root)
    } else {
        b.rest().to_vec()
    };
    let Ok(w) = serde_json::from_slice::<WireRequest>(&wire) else {
        return; // the listener answers 400
    };
    let Ok(mut req) = w.into_request(4242) else {
        return; // 400 too
    };
    let again = serde_json::to_vec(&WireRequest::of(&req))
        .ok()
        .and_then(|v| serde_json::from_slice::<WireRequest>(&v).ok())
        .and_then(|w| w.into_request(4242).ok());
    let same = |x: &Request| serde_json::to_value(WireRequest::of(x)).ok();
    assert_eq!(
        again.as_ref().and_then(same),
        same(&req),
        "a decoded forward does not re-encode to itself"
    );

    // Genuine: signed by the harness and left as signed, or (never in practice) carrying
    // the cluster's signature of what it holds.
    let genuine = if flags & 2 != 0 {
        req.forwarded = a.node.forward_signature(&req);
        let tampered = flags & 4 != 0;
        if tampered {
            tamper(&mut req, b.byte(), &mut b);
        }
        !tampered
    } else {
        a.node.forward_signed(&req)
    };
    let before = a.store.borrow().data.clone();
    let path = req.path.clone();
    let out = a.step(T, Input::Request(req));
    let mine: Vec<&Response> = out.iter().filter(|r| r.id == 4242).collect();
    assert!(mine.len() <= 1, "{path:?}: {} answers", mine.len());
    let Some(r) = mine.first() else {
        return;
    };
    check_response(&path, r);
    if !genuine {
        assert_eq!(
            r.status, 403,
            "{path:?}: a forward whose signature does not match was served: {r:?}"
        );
        assert!(
            a.store.borrow().data == before,
            "{path:?}: a refused forward changed storage"
        );
        let text = r.body.as_ref().map(Value::to_string).unwrap_or_default();
        assert!(
            !text.contains(&a.root),
            "{path:?}: the root token in an answer"
        );
    }
}
