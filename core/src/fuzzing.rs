//! Hostile-input entry points: each function takes arbitrary bytes, feeds them to one decoder
//! (or to a whole node over in-memory storage) and panics only when a promise the service
//! makes about hostile input is broken, never merely because the input is invalid. The
//! cargo-fuzz targets in `core/fuzz/` call these; the tests below run the same functions on
//! a ChaCha-seeded generator so `cargo test` exercises them on stable. Not an API: hidden
//! from the docs and free to change.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)] // a broken promise panics: that is the finding

use crate::api::{self, Method, Request, Response};
use crate::auth::ldap::config::{LdapConfig, DEFAULT_GROUPFILTER, DEFAULT_USERFILTER};
use crate::auth::ldap::fake::FakeDirectory;
use crate::auth::ldap::login::Login;
use crate::auth::ldap::{dn, escape, filter, template, LdapDone, LdapEntry, LdapOp, Secret};
use crate::mounts::MountEntry;
use crate::node::{Admin, AdminResult, Input, Node, NodeConfig, Output};
use crate::policy::{self, Acl, Policy};
use crate::replication::msg::{PeerAnswer, PeerAuth, PeerBody, PeerMsg, PeerRequest};
use crate::replication::{activation, HttpReply, Mode, PeerReply};
use crate::seal::{self, SealConfig};
use crate::storage::MemStorage;
use crate::time::Millis;
use serde_json::{json, Value};
use std::sync::OnceLock;

mod snapshot_file;
pub use snapshot_file::snapshot_file;

/// Reads structured values off the front of fuzz bytes; past the end everything is empty.
pub struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes(data)
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
    /// A chunk prefixed by a one-byte length.
    pub fn chunk(&mut self) -> &'a [u8] {
        let n = usize::from(self.byte());
        self.take(n)
    }
    /// A chunk prefixed by a two-byte (little-endian) length.
    pub fn long_chunk(&mut self) -> &'a [u8] {
        let n = usize::from(self.byte()) | usize::from(self.byte()) << 8;
        self.take(n)
    }
    pub fn string(&mut self) -> String {
        String::from_utf8_lossy(self.chunk()).into_owned()
    }
    pub fn rest(&mut self) -> &'a [u8] {
        self.take(self.0.len())
    }
}

const ROOT: &str = "root-fuzz";
const T0: Millis = 1_000_000;

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
const FIELDS: &[&str] = &[
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

fn config() -> NodeConfig {
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
struct Snapshot {
    storage: MemStorage,
    key: String,
    /// Activation credential of a registered DR secondary (`primaries` snapshots).
    auth: Option<PeerAuth>,
}

fn raw_harness(storage: MemStorage, seed: u8) -> Harness {
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

fn snapshot(primaries: bool) -> &'static Snapshot {
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
    /// with one registered secondary.
    pub fn new(primaries: bool) -> Harness {
        let snap = snapshot(primaries);
        let mut h = raw_harness(snap.storage.clone(), 9);
        let r =
            h.call(Request::new(0, Method::Put, "sys/unseal").with_json(json!({"key": snap.key})));
        assert_eq!(r.map(|r| r.status), Some(200), "unseal of the snapshot");
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
    if r.status >= 400 {
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

fn pick_method(b: u8) -> Method {
    [
        Method::Get,
        Method::List,
        Method::Put,
        Method::Post,
        Method::Delete,
    ][usize::from(b % 5)]
}

/// Tokens seen in responses (client tokens, wrapping tokens, accessors).
fn harvest(v: &Value, out: &mut Vec<String>) {
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

/// The LDAP filter templates a login renders the username into.
const USER_TEMPLATES: &[&str] = &[
    DEFAULT_USERFILTER,
    "(&(objectClass=person)({{.UserAttr}}={{.Username}}))",
    "(&({{.UserAttr}}={{.Username}})(!(disabled=TRUE)))",
    "(|({{.UserAttr}}={{ .Username }})(mail={{.Username}}))",
];
const GROUP_TEMPLATES: &[&str] = &[
    DEFAULT_GROUPFILTER,
    "(&(objectClass=group)(member:1.2.840.113556.1.4.1941:={{.UserDN}}))",
    "(&(objectClass=posixGroup)(memberUid={{.Username}}))",
];

fn entry_values<'a>(pairs: &'a [(&'a str, String)]) -> impl Fn(&str) -> Vec<String> + 'a {
    move |a: &str| {
        pairs
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(a))
            .map(|(_, v)| v.clone())
            .collect()
    }
}

fn ldap_mount() -> MountEntry {
    // Through serde, so fields added later with defaults need no change here.
    let v = json!({
        "path": "ldap/", "type": "ldap", "description": "", "uuid": "fuzz",
        "accessor": "auth_ldap_fuzz", "local": false,
    });
    match serde_json::from_value(v) {
        Ok(m) => m,
        Err(e) => panic!("mount entry: {e}"),
    }
}

/// LDAP filter template rendering and RFC 4514/4515 escaping. Property: for any username
/// (and user DN the directory returns), the filters a login sends parse, and the user
/// filter matches exactly the entries whose `userattr` value is the literal username
/// (compared case-insensitively, as the directory does), nothing else; the group filter
/// matches the literal DN and username only. Arbitrary templates, filters and DNs never
/// panic the parsers.
pub fn ldap_filter(data: &[u8]) {
    let mut b = Bytes::new(data);
    let flags = b.byte();
    let username = b.string();
    let other = b.string();
    let user_dn_value = b.string();
    let tail = b.rest();
    let text = String::from_utf8_lossy(tail);

    // Parsers on arbitrary text.
    let _ = filter::parse(&text).map(|f| f.matches(&|_: &str| vec![username.clone()]));
    let _ = dn::parse(&text);
    let _ = dn::normalize(&text);
    let _ = dn::group_name(&text);
    if let Ok(t) = template::parse(&text, crate::auth::ldap::config::USER_FIELDS) {
        let _ = filter::parse(&t.render(&[
            ("UserAttr", "uid"),
            ("Username", &escape::filter_value(&username)),
        ]));
    }

    // Escaping round trips.
    let f = format!("(uid={})", escape::filter_value(&username));
    match filter::parse(&f) {
        Ok(filter::Filter::Eq(a, v)) => {
            assert!(a == "uid" && v == username.as_bytes(), "{f:?}")
        }
        other => panic!("escaped username {username:?} gave {f:?} = {other:?}"),
    }
    if !username.is_empty() {
        let full = format!("cn={},dc=example", escape::dn_value(&username));
        let rdns = dn::parse(&full).unwrap_or_else(|e| panic!("{full:?}: {e}"));
        assert!(
            rdns.len() == 2 && rdns[0] == vec![("cn".to_string(), username.clone())],
            "{full:?} parsed as {rdns:?}"
        );
    }

    // The filters of a real login.
    let attrs = ["uid", "cn", "sAMAccountName"];
    let userattr = attrs[usize::from(flags % 3)];
    let upn = flags & 0x80 != 0;
    let cfg = LdapConfig {
        binddn: "cn=admin,dc=example".into(),
        bindpass: Secret::new("adminpw"),
        userdn: "ou=people,dc=example".into(),
        groupdn: "ou=groups,dc=example".into(),
        userattr: userattr.into(),
        userfilter: USER_TEMPLATES[usize::from(flags >> 2) % USER_TEMPLATES.len()].into(),
        groupfilter: GROUP_TEMPLATES[usize::from(flags >> 4) % GROUP_TEMPLATES.len()].into(),
        upndomain: if upn {
            "example.com".into()
        } else {
            String::new()
        },
        ..Default::default()
    };
    let user_dn = if user_dn_value.is_empty() {
        format!("{userattr}=x,ou=people,dc=example")
    } else {
        format!(
            "{userattr}={},ou=people,dc=example",
            escape::dn_value(&user_dn_value)
        )
    };
    let (mut login, first) = Login::start(1, ldap_mount(), cfg, &username, "pw", 1, "");
    let mut filters: Vec<(String, String)> = Vec::new();
    let _ = login.run(first, |op, _| match op {
        LdapOp::Connect(_) | LdapOp::ConnectBound { .. } => Ok(LdapDone::Connected {
            url: "ldap://fake".into(),
        }),
        LdapOp::Bind { .. } | LdapOp::CheckBind { .. } => Ok(LdapDone::Bound),
        LdapOp::Search(s) => {
            filters.push((s.base.clone(), s.filter.clone()));
            Ok(LdapDone::Entries(if s.base.starts_with("ou=people") {
                vec![LdapEntry {
                    dn: user_dn.clone(),
                    attrs: Default::default(),
                }]
            } else {
                Vec::new()
            }))
        }
        _ => Ok(LdapDone::Closed),
    });
    let name = if upn {
        format!("{username}@example.com")
    } else {
        username.clone()
    };
    let key = if upn { "userPrincipalName" } else { userattr };
    let fold = |s: &str| s.to_lowercase();
    for (i, (base, text)) in filters.iter().enumerate() {
        let f = filter::parse(text)
            .unwrap_or_else(|e| panic!("login filter {text:?} does not parse: {e}"));
        if i == 0 {
            assert!(base.starts_with("ou=people"), "first search {base:?}");
            // Exactly the literal username matches.
            for cand in [&name, &other, &format!("{name}x"), &"*".to_string()] {
                let entry = [
                    ("objectClass", "person".to_string()),
                    (key, cand.clone()),
                    ("mail", cand.clone()),
                ];
                let m = f.matches(&entry_values(&entry));
                assert_eq!(
                    m,
                    fold(cand) == fold(&name),
                    "user filter {text:?} for {name:?} on {key}={cand:?}"
                );
            }
        } else if base.starts_with("ou=groups") {
            let me = [
                ("objectClass", "group".to_string()),
                ("objectClass", "groupOfNames".to_string()),
                ("objectClass", "posixGroup".to_string()),
                ("member", user_dn.clone()),
                ("memberUid", username.clone()),
            ];
            assert!(f.matches(&entry_values(&me)), "group filter {text:?}");
            let not_me = [
                ("objectClass", "group".to_string()),
                ("objectClass", "posixGroup".to_string()),
                ("member", "cn=someone-else,dc=example".to_string()),
                ("memberUid", format!("{username}-not")),
            ];
            assert!(!f.matches(&entry_values(&not_me)), "group filter {text:?}");
        }
    }
}

/// HCL and JSON policy parsing. Property: no panic; a parsed policy re-encoded in the JSON
/// form parses to the same rules (deny standing alone), and ACL decisions never panic.
pub fn policy(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(p) = Policy::parse(&text) else {
        return;
    };
    let mut paths = serde_json::Map::new();
    for (pat, caps) in &p.rules {
        paths.insert(
            pat.clone(),
            json!({ "capabilities": policy::cap_names(*caps) }),
        );
    }
    let again = Policy::parse(&json!({ "path": paths }).to_string())
        .unwrap_or_else(|e| panic!("re-encoded policy does not parse: {e}"));
    for (pat, caps) in &p.rules {
        let want = if caps & policy::DENY != 0 {
            policy::DENY
        } else {
            *caps
        };
        let pat2 = pat.trim_start_matches('/');
        assert_eq!(again.rules.get(pat2).copied(), Some(want), "rule {pat:?}");
    }
    let acl = Acl::new([&p], false);
    for path in ["secret/a", "sys/mounts", "", "a/b/c/d"] {
        let _ = acl.capabilities(path);
    }
    for pat in p.rules.keys().take(16) {
        let _ = acl.allows(pat, policy::READ);
    }
}

fn activation_ctx_parts() -> (MemStorage, crate::seal::Barrier, rand_chacha::ChaCha20Rng) {
    let mut b = crate::seal::Barrier::default();
    b.unseal_with([3; 32]);
    let rng = <rand_chacha::ChaCha20Rng as rand_core::SeedableRng>::seed_from_u64(5);
    (MemStorage::new(), b, rng)
}

/// Activation token and encrypted credential decoding: arbitrary tokens through the
/// decoders (claims, signature check, encrypted-token decryption), a tampered encrypted
/// token never decrypts, and a secondary `enable` whose token and unwrapped credential
/// (the primary's answer) are arbitrary answers 4xx, never a crash.
pub fn activation(data: &[u8]) {
    let mut b = Bytes::new(data);
    let flags = b.byte();
    let token = b.string();
    let _ = activation::is_activation_token(&token);
    let _ = activation::decode(&token);
    let (s, barrier, mut rng) = activation_ctx_parts();
    let mut ctx = crate::ctx::Ctx {
        txn: crate::storage::Txn::new(&s),
        barrier: &barrier,
        rng: &mut rng,
        now: T0,
    };
    let claims = activation::Claims {
        addr: "http://fuzz-api".into(),
        id: "cs.inner".into(),
        mode: Mode::Dr,
        exp: T0 / 1000 + 600,
        jti: "sec1".into(),
    };
    if let Ok(signed) = activation::issue(&mut ctx, &claims) {
        let _ = activation::verify(&mut ctx, &token);
        if token != signed {
            // Any other token is refused, never accepted with the issued claims' rights.
            if let Ok(c) = activation::verify(&mut ctx, &token) {
                assert_eq!(c, claims, "a forged token verified with other claims");
            }
        }
    }
    let _ = activation::is_encrypted_token(&token);
    if let Ok(pk) = activation::generate_public_key(&mut ctx, Mode::Dr) {
        let _ = activation::decrypt(&ctx, Mode::Dr, &token);
        let sealed = activation::Sealed {
            mode: Mode::Dr,
            exp: T0 / 1000 + 600,
            bundle: crate::replication::state::Bundle {
                mode: Mode::Dr,
                primary_cluster_id: "c".into(),
                primary_cluster_addrs: vec!["p:1".into()],
                primary_api_addr: "http://p".into(),
                secondary_id: "sec1".into(),
                secret: "s".into(),
                ca_pem: String::new(),
                barrier_key: hex::encode([4u8; 32]),
                seal_config: String::new(),
                keyring: String::new(),
                primary_version: String::new(),
            },
        };
        if let Ok(enc) = activation::encrypt_to(&mut ctx, &pk, &sealed) {
            assert_eq!(
                activation::decrypt(&ctx, Mode::Dr, &enc).ok(),
                Some(sealed.bundle.clone())
            );
            // Flip one byte of the encrypted token: it must not decrypt to anything.
            let mut t = enc.into_bytes();
            let at = usize::from(b.byte()) % t.len();
            t[at] ^= b.byte().max(1);
            if let Ok(t) = String::from_utf8(t) {
                if let Ok(got) = activation::decrypt(&ctx, Mode::Dr, &t) {
                    assert_eq!(got, sealed.bundle, "a tampered token decrypted: {t:?}");
                }
            }
        }
    }
    drop(ctx);

    // End to end: `secondary/enable` with the token, the primary answering with arbitrary
    // bytes (or an arbitrary credential in an unwrap envelope).
    let mut h = Harness::new(false);
    let body = b.rest();
    let status = [200u16, 400, 403, 500][usize::from(flags >> 4) % 4];
    let answer = if flags & 1 != 0 {
        let mut v = b"{\"data\":".to_vec();
        v.extend_from_slice(body);
        v.push(b'}');
        v
    } else {
        body.to_vec()
    };
    h.http_answer = Some((status, answer));
    let token = if flags & 2 != 0 {
        // A well-formed token so the call reaches the primary's answer.
        let c = activation::Claims {
            addr: token.clone(),
            ..claims
        };
        format!(
            "e30.{}.c2ln",
            base64::Engine::encode(
                &base64::engine::general_purpose::URL_SAFE_NO_PAD,
                serde_json::to_vec(&c).unwrap_or_default()
            )
        )
    } else {
        token
    };
    let mode = if flags & 4 != 0 { "dr" } else { "performance" };
    let path = format!("sys/replication/{mode}/secondary/enable");
    let _ = h.call(
        Request::new(0, Method::Post, &path)
            .with_token(ROOT)
            .with_json(json!({ "token": token })),
    );
    let _ = h.call(Request::new(0, Method::Get, "sys/replication/status").with_token(ROOT));
}

/// Peer message decoding: arbitrary bytes decoded as a request and an answer frame of the
/// cluster channel (JSON, perhaps with a binary attachment; a decoded message re-encodes to
/// itself), then given to a DR primary, with the credential of a registered secondary when
/// the first byte says so. The primary answers with at most one message per request and
/// never an internal error.
pub fn peer_msg(data: &[u8]) {
    let mut b = Bytes::new(data);
    let flags = b.byte();
    let rest = b.rest();
    if let Ok(a) = PeerAnswer::from_wire(rest) {
        let again = a.clone().into_wire().map(|w| PeerAnswer::from_wire(&w));
        assert_eq!(again, Ok(Ok(a)), "answer does not round-trip");
    }
    let msg = if flags & 1 != 0 {
        let Ok(body) = serde_json::from_slice::<PeerBody>(rest) else {
            return;
        };
        let Some(auth) = snapshot(true).auth.clone() else {
            return;
        };
        PeerMsg {
            mode: Mode::Dr,
            auth,
            body,
        }
    } else {
        match PeerMsg::from_wire(rest) {
            Ok(m) => m,
            Err(_) => return,
        }
    };
    let again = msg.clone().into_wire().map(|w| PeerMsg::from_wire(&w));
    assert_eq!(
        again.as_ref().ok().and_then(|r| r.as_ref().ok()),
        Some(&msg),
        "message does not round-trip"
    );
    let mut h = Harness::new(true);
    h.node.handle(
        h.now,
        Input::PeerRequest(PeerRequest {
            id: 77,
            msg: msg.clone(),
        }),
    );
    h.node.handle(h.now + 60_000, Input::Tick);
    let mut answers = 0;
    while let Some(o) = h.node.poll_output() {
        if let Output::PeerResponse(r) = o {
            assert_eq!(r.id, 77);
            answers += 1;
            if let PeerAnswer::Error { code, message } = &r.msg {
                assert_ne!(code, "internal", "{msg:?} -> {message}");
            }
        }
    }
    assert!(answers <= 1, "{answers} answers to one request");
}

/// Shamir share decoding: arbitrary key text through the share decoder, arbitrary shares
/// through the combiner, split/combine round trips, and a 3-of-5 sealed node given
/// arbitrary (or real, or altered) unseal keys answers 200 or 400 and unseals only with
/// keys that reconstruct the root key.
pub fn shamir(data: &[u8]) {
    let mut b = Bytes::new(data);
    let flags = b.byte();
    let text = b.string();
    let _ = seal::decode_share(&text);
    let t = b.byte() % 6;
    let n = b.byte() % 6;
    let cfg = SealConfig {
        secret_shares: n,
        secret_threshold: t,
    };
    let shares: Vec<Vec<u8>> = (0..usize::from(flags % 5))
        .map(|_| b.chunk().to_vec())
        .collect();
    if cfg.validate().is_ok() {
        let _ = seal::combine(&shares, &cfg);
        let mut root = [0u8; 32];
        let r = b.take(32);
        root[..r.len()].copy_from_slice(r);
        let mut rng = <rand_chacha::ChaCha20Rng as rand_core::SeedableRng>::seed_from_u64(1);
        let all = seal::split(&root, &cfg, &mut rng);
        assert_eq!(all.len(), usize::from(n));
        let got = seal::combine(&all[..usize::from(t)], &cfg);
        assert_eq!(got.ok(), Some(root), "split/combine {cfg:?}");
    }

    // A sealed 3-of-5 node.
    let (snap, keys) = sealed_node();
    let mut h = raw_harness(snap.clone(), 11);
    let mut used = Vec::new();
    for _ in 0..4 {
        if b.is_empty() {
            break;
        }
        let sel = b.byte();
        let key = match sel % 4 {
            0 => b.string(),
            1 => keys[usize::from(sel / 4) % keys.len()].clone(),
            _ => {
                // A real share, altered.
                let k = &keys[usize::from(sel / 4) % keys.len()];
                let mut raw = seal::decode_share(k).unwrap_or_default();
                if !raw.is_empty() {
                    let at = usize::from(b.byte()) % raw.len();
                    raw[at] ^= b.byte().max(1);
                }
                if sel % 4 == 2 {
                    hex::encode(raw)
                } else {
                    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, raw)
                }
            }
        };
        used.push(key.clone());
        let Some(r) =
            h.call(Request::new(0, Method::Put, "sys/unseal").with_json(json!({"key": key})))
        else {
            panic!("unseal: no response");
        };
        assert!(r.status == 200 || r.status == 400, "unseal: {r:?}");
    }
    if !h.node.is_sealed() {
        // Shamir shares are not authenticated: altered shares whose changes cancel out
        // still reconstruct the root key (the fuzzer finds such pairs). The promise is that
        // the node unseals only when three of the shares given reconstruct the real root.
        let cfg = SealConfig {
            secret_shares: 5,
            secret_threshold: 3,
        };
        let real: Vec<Vec<u8>> = keys
            .iter()
            .filter_map(|k| seal::decode_share(k).ok())
            .collect();
        let root = seal::combine(&real[..3], &cfg).ok();
        let given: Vec<Vec<u8>> = used
            .iter()
            .filter_map(|k| seal::decode_share(k).ok())
            .collect();
        let n = given.len();
        let mut ok = false;
        for i in 0..n {
            for j in i + 1..n {
                for k in j + 1..n {
                    let three = [given[i].clone(), given[j].clone(), given[k].clone()];
                    ok |= root.is_some() && seal::combine(&three, &cfg).ok() == root;
                }
            }
        }
        assert!(
            ok,
            "unsealed without shares that reconstruct the root: {used:?}"
        );
    }
}

fn sealed_node() -> &'static (MemStorage, Vec<String>) {
    static SEALED: OnceLock<(MemStorage, Vec<String>)> = OnceLock::new();
    SEALED.get_or_init(|| {
        let mut h = raw_harness(MemStorage::new(), 13);
        let r = h.call(
            Request::new(0, Method::Put, "sys/init")
                .with_json(json!({"secret_shares": 5, "secret_threshold": 3})),
        );
        let keys: Vec<String> = r
            .and_then(|r| r.body)
            .and_then(|b| b["keys"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|k| k.as_str().map(String::from))
            .collect();
        assert_eq!(keys.len(), 5, "init of the sealed node");
        (h.node.into_storage(), keys)
    })
}

#[cfg(test)]
mod tests;
