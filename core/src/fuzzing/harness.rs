//! The node the API-level fuzz targets drive: an unsealed dev node over in-memory storage
//! (optionally an LDAP-configured DR primary with one registered secondary), its fake
//! directory, and the driver loop that answers the node's outbound calls. Each kind of
//! node is set up once per thread; every input gets a clone of it.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)] // a broken promise panics: that is the finding

use crate::api::{Method, Request, Response};
use crate::auth::ldap::fake::FakeDirectory;
use crate::node::{Admin, AdminResult, Input, Node, NodeConfig, Output};
use crate::replication::msg::PeerAuth;
use crate::replication::{HttpReply, PeerReply};
use crate::storage::MemStorage;
use crate::time::Millis;
use serde_json::{json, Value};
use std::sync::OnceLock;

pub(super) const ROOT: &str = "root-fuzz";
pub(super) const T0: Millis = 1_000_000;

/// The API endpoints the harness knows; the router and body targets pick from these so that
/// random bytes reach the handlers and not only the 404 path.
pub const ENDPOINTS: &[(Method, &str)] = &[
    (Method::Put, "sys/init"),
    (Method::Put, "sys/unseal"),
    (Method::Put, "sys/seal"),
    (Method::Get, "sys/seal-status"),
    (Method::Get, "sys/health"),
    (Method::Put, "secret/fuzz"),
    (Method::Get, "secret/fuzz"),
    (Method::List, "secret/"),
    (Method::Delete, "secret/fuzz"),
    (Method::Put, "sys/policies/acl/fuzz"),
    (Method::Put, "sys/policy/fuzz"),
    (Method::Get, "sys/policies/acl/fuzz"),
    (Method::Post, "sys/capabilities-self"),
    (Method::Post, "sys/capabilities"),
    (Method::Post, "sys/capabilities-accessor"),
    (Method::Post, "sys/mounts/fuzz"),
    (Method::Post, "sys/auth/fuzz"),
    (Method::Delete, "sys/mounts/secret"),
    (Method::Post, "auth/token/create"),
    (Method::Post, "auth/token/create-orphan"),
    (Method::Post, "auth/token/lookup"),
    (Method::Post, "auth/token/lookup-self"),
    (Method::Post, "auth/token/lookup-accessor"),
    (Method::Post, "auth/token/renew"),
    (Method::Post, "auth/token/renew-self"),
    (Method::Post, "auth/token/revoke"),
    (Method::Post, "auth/token/revoke-orphan"),
    (Method::Post, "auth/token/revoke-accessor"),
    (Method::List, "auth/token/accessors"),
    (Method::Post, "auth/ldap/config"),
    (Method::Post, "auth/ldap/groups/fuzz"),
    (Method::Post, "auth/ldap/users/alice"),
    (Method::Post, "auth/ldap/login/alice"),
    (Method::Post, "sys/wrapping/wrap"),
    (Method::Post, "sys/wrapping/unwrap"),
    (Method::Post, "sys/wrapping/lookup"),
    (Method::Post, "sys/audit/fuzz"),
    (Method::Post, "sys/audit-hash/fuzz"),
    (Method::Post, "sys/replication/dr/primary/enable"),
    (Method::Post, "sys/replication/performance/primary/enable"),
    (Method::Post, "sys/replication/dr/primary/secondary-token"),
    (
        Method::Post,
        "sys/replication/performance/primary/secondary-token",
    ),
    (Method::Post, "sys/replication/dr/primary/revoke-secondary"),
    (Method::Post, "sys/replication/dr/primary/demote"),
    (Method::Post, "sys/replication/dr/primary/disable"),
    (Method::Post, "sys/replication/dr/secondary/enable"),
    (Method::Post, "sys/replication/performance/secondary/enable"),
    (Method::Post, "sys/replication/dr/secondary/promote"),
    (Method::Post, "sys/replication/dr/secondary/disable"),
    (Method::Post, "sys/replication/dr/secondary/update-primary"),
    (
        Method::Post,
        "sys/replication/dr/secondary/generate-public-key",
    ),
    (
        Method::Post,
        "sys/replication/performance/primary/paths-filter/sec1",
    ),
    (
        Method::Post,
        "sys/replication/dr/secondary/generate-operation-token/attempt",
    ),
    (
        Method::Post,
        "sys/replication/dr/secondary/generate-operation-token/update",
    ),
    (
        Method::Post,
        "sys/replication/dr/secondary/operation-token/delete",
    ),
    (Method::Post, "sys/generate-root/attempt"),
    (Method::Post, "sys/generate-root/update"),
    (Method::Post, "sys/locked-users/fuzz/unlock/alice"),
    (Method::Get, "sys/locked-users"),
    (Method::Get, "sys/metrics"),
    (Method::Get, "sys/license/status"),
    (Method::Get, "sys/replication/status"),
    (Method::Get, "sys/replication/dr/status"),
];

/// Field names handlers read, for wrapping fuzz values into a body object.
pub(super) const FIELDS: &[&str] = &[
    "policies",
    "token_policies",
    "policy",
    "ttl",
    "type",
    "token",
    "key",
    "id",
    "paths",
    "path",
    "accessor",
    "num_uses",
    "meta",
    "options",
    "config",
    "url",
    "userfilter",
    "groupfilter",
    "password",
    "secret_shares",
    "secret_threshold",
    "input",
    "mode",
    "nonce",
    "pgp_key",
    "dr_operation_token",
    "update_primary_addrs",
    "primary_cluster_addr",
    "secondary_public_key",
    "file_path",
    "max_page_size",
    "groups",
];

pub(super) fn config() -> NodeConfig {
    let mut c = NodeConfig {
        node_id: "fuzz".into(),
        license: crate::license::LicenseState::hosted(),
        ..Default::default()
    };
    c.replication.api_addr = "http://fuzz-api".into();
    c.replication.cluster_addr = "fuzz-cluster".into();
    c
}

fn directory() -> FakeDirectory {
    let mut d = FakeDirectory::new();
    d.add("dc=example", &[("objectClass", &["domain"])])
        .add(
            "cn=admin,dc=example",
            &[("objectClass", &["person"]), ("userPassword", &["adminpw"])],
        )
        .add(
            "uid=alice,ou=people,dc=example",
            &[
                ("objectClass", &["person"]),
                ("uid", &["alice"]),
                ("userPassword", &["pw"]),
            ],
        )
        .add(
            "cn=devs,ou=groups,dc=example",
            &[
                ("objectClass", &["groupOfNames"]),
                ("member", &["uid=alice,ou=people,dc=example"]),
            ],
        );
    d
}

/// A node over in-memory storage, its fake directory, and what the driver answers to the
/// node's outbound calls.
#[derive(Clone)]
pub struct Harness {
    pub node: Node<MemStorage>,
    pub now: Millis,
    pub dir: FakeDirectory,
    next_id: u64,
    /// The answer to the next [`Output::HttpCall`]; a transport error when `None`.
    pub http_answer: Option<(u16, Vec<u8>)>,
    /// Peer messages the node sent.
    pub sent: Vec<crate::replication::PeerSend>,
}

/// A node's storage after set-up, and the unseal key that opens it.
pub(super) struct Snapshot {
    storage: MemStorage,
    key: String,
    /// Activation credential of a registered DR secondary (`primaries` snapshots).
    pub(super) auth: Option<PeerAuth>,
}

pub(super) fn raw_harness(storage: MemStorage, seed: u8) -> Harness {
    Harness {
        node: Node::new(storage, [seed; 32], config()),
        now: T0,
        dir: directory(),
        next_id: 1,
        http_answer: None,
        sent: Vec::new(),
    }
}

fn take_snapshot(h: Harness, key: String, auth: Option<PeerAuth>) -> Snapshot {
    Snapshot {
        storage: h.node.into_storage(),
        key,
        auth,
    }
}

fn dev_setup() -> (Harness, String) {
    let mut h = raw_harness(MemStorage::new(), 7);
    h.node.handle(
        h.now,
        Input::Admin {
            id: 1,
            cmd: Admin::DevSetup {
                root_token_id: Some(ROOT.into()),
            },
        },
    );
    let mut key = String::new();
    while let Some(o) = h.node.poll_output() {
        if let Output::AdminDone {
            result: Ok(AdminResult::DevSetup(k)),
            ..
        } = o
        {
            key = k.keys_base64.first().cloned().unwrap_or_default();
        }
    }
    (h, key)
}

fn expect(r: &Response, what: &str) {
    assert!(r.status < 300, "set-up step {what} failed: {r:?}");
}

pub(super) fn snapshot(primaries: bool) -> &'static Snapshot {
    static PLAIN: OnceLock<Snapshot> = OnceLock::new();
    static PRIMARY: OnceLock<Snapshot> = OnceLock::new();
    if !primaries {
        return PLAIN.get_or_init(|| {
            let (h, key) = dev_setup();
            take_snapshot(h, key, None)
        });
    }
    PRIMARY.get_or_init(|| {
        let (mut h, key) = dev_setup();
        let ldap = json!({
            "url": "ldap://fake",
            "binddn": "cn=admin,dc=example",
            "bindpass": "adminpw",
            "userdn": "ou=people,dc=example",
            "groupdn": "ou=groups,dc=example",
            "userattr": "uid",
        });
        let r = h.root(Method::Post, "auth/ldap/config", ldap);
        expect(&r, "ldap config");
        let r = h.root(Method::Post, "sys/replication/dr/primary/enable", json!({}));
        expect(&r, "dr primary");
        let r = h.root(
            Method::Post,
            "sys/replication/dr/primary/secondary-token",
            json!({"id": "sec1"}),
        );
        expect(&r, "secondary token");
        let token = r
            .body
            .as_ref()
            .and_then(|b| b["wrap_info"]["token"].as_str());
        let token = token.unwrap_or_default().to_string();
        let r = h.root(
            Method::Post,
            "sys/wrapping/unwrap",
            json!({ "token": token }),
        );
        expect(&r, "unwrap");
        let b = r.body.unwrap_or_default();
        let d = &b["data"];
        let s = |k: &str| d[k].as_str().unwrap_or_default().to_string();
        let auth = PeerAuth {
            secondary_id: s("secondary_id"),
            secret: s("secret"),
            primary_cluster_id: s("primary_cluster_id"),
            cluster_id: "fuzz-secondary".into(),
            node_id: "s".into(),
            api_addr: "http://s".into(),
            cluster_addr: "s:1".into(),
            version: String::new(),
        };
        take_snapshot(h, key, Some(auth))
    })
}

impl Harness {
    /// A restarted, unsealed dev node: `primaries` adds an LDAP config and a DR primary
    /// with one registered secondary. A clone of this thread's prototype: the set-up, the
    /// restart and the unseal run once per thread, not once per input (they were most of
    /// the cost of an input), and nothing an earlier input did is in the copy.
    pub fn new(primaries: bool) -> Harness {
        thread_local! {
            static PLAIN: Harness = Harness::restarted(false);
            static PRIMARY: Harness = Harness::restarted(true);
        }
        let proto = if primaries { &PRIMARY } else { &PLAIN };
        proto.with(Harness::clone)
    }

    /// The snapshot's storage under a new node, unsealed with the snapshot's key.
    fn restarted(primaries: bool) -> Harness {
        let snap = snapshot(primaries);
        let mut h = raw_harness(snap.storage.clone(), 9);
        let r =
            h.call(Request::new(0, Method::Put, "sys/unseal").with_json(json!({"key": snap.key})));
        assert_eq!(r.map(|r| r.status), Some(200), "unseal of the snapshot");
        // The replication state (Merkle trees rebuilt from the data, WAL position) is loaded
        // on the first input after the unseal: load it here, in the prototype, or every
        // copy rebuilds the trees on its first request (half of an `activation` input).
        let r = h.call(Request::new(0, Method::Get, "sys/seal-status"));
        assert_eq!(
            r.map(|r| r.status),
            Some(200),
            "seal status of the snapshot"
        );
        h
    }

    /// Sends one input and answers the node's outbound calls until it is quiet; returns the
    /// API responses that came out.
    pub fn pump(&mut self, first: Input) -> Vec<Response> {
        let mut out = Vec::new();
        let mut queue = vec![first];
        for _ in 0..64 {
            if queue.is_empty() {
                break;
            }
            for input in std::mem::take(&mut queue) {
                self.node.handle(self.now, input);
            }
            while let Some(o) = self.node.poll_output() {
                match o {
                    Output::Response(r) => out.push(r),
                    Output::Ldap(call) => queue.push(Input::Ldap(self.dir.answer(&call))),
                    Output::HttpCall(c) => queue.push(Input::HttpReply(HttpReply {
                        call_id: c.call_id,
                        result: self
                            .http_answer
                            .take()
                            .ok_or_else(|| "connection refused".to_string()),
                    })),
                    Output::PeerSend(s) => {
                        queue.push(Input::PeerReply(PeerReply {
                            call_id: s.call_id,
                            result: Err("connection refused".into()),
                        }));
                        self.sent.push(s);
                    }
                    _ => {}
                }
            }
        }
        out
    }

    /// Sends a request; returns its response (asserting it got exactly one).
    pub fn call(&mut self, mut req: Request) -> Option<Response> {
        self.next_id += 1;
        req.id = self.next_id;
        let id = req.id;
        let path = req.path.clone();
        let rs = self.pump(Input::Request(req));
        let mine: Vec<&Response> = rs.iter().filter(|r| r.id == id).collect();
        assert!(mine.len() <= 1, "{path:?}: {} responses", mine.len());
        let r = mine.first().map(|r| (*r).clone());
        if let Some(r) = &r {
            check_response(&path, r);
        }
        r
    }

    /// A request with the root token and a JSON body; panics when it gets no answer.
    pub fn root(&mut self, method: Method, path: &str, body: Value) -> Response {
        let req = Request::new(0, method, path)
            .with_token(ROOT)
            .with_json(body);
        match self.call(req) {
            Some(r) => r,
            None => panic!("{path}: no response"),
        }
    }
}

/// What every response to a hostile request must look like: a valid status; errors carry
/// a non-empty message; no internal error (a 500 means the input reached a state the
/// code did not expect).
pub fn check_response(path: &str, r: &Response) {
    let p = path.trim_start_matches('/');
    if p == "sys/health" {
        return; // the status comes from the caller's query (`activecode` ...)
    }
    assert!((200..600).contains(&r.status), "{p:?}: status {}", r.status);
    assert_ne!(r.status, 500, "{p:?}: internal error {:?}", r.body);
    // A KV version 2 read of a deleted or destroyed version (404 with the version's metadata
    // under `data.metadata`), or a patch of one (404 with the metadata as `data`): no error,
    // as Vault answers them (both found by `kv2_bodies`).
    let deleted_version = r.status == 404
        && r.body.as_ref().is_some_and(|b| {
            let d = &b["data"];
            (d["metadata"].is_object() && d["data"].is_null())
                || (d["version"].is_u64() && d["destroyed"].is_boolean())
        });
    if r.status >= 400 && !deleted_version {
        let errs = r.body.as_ref().and_then(|b| b["errors"].as_array());
        let ok = errs.is_some_and(|e| {
            !e.is_empty() && e.iter().all(|m| m.as_str().is_some_and(|s| !s.is_empty()))
        });
        assert!(
            ok,
            "{p:?}: error {} without a message: {:?}",
            r.status, r.body
        );
    }
}

pub(super) fn pick_method(b: u8) -> Method {
    [
        Method::Get,
        Method::List,
        Method::Put,
        Method::Post,
        Method::Delete,
    ][usize::from(b % 5)]
}

/// Tokens seen in responses (client tokens, wrapping tokens, accessors).
pub(super) fn harvest(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("client_token" | "token" | "accessor", Value::String(s)) if out.len() < 16 => {
                        out.push(s.clone())
                    }
                    _ => harvest(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| harvest(x, out)),
        _ => {}
    }
}
