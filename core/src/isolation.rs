//! The attacker's-eye model of authorization, shared by the quickcheck properties below and
//! the fuzz targets `unauthenticated` and `namespace_isolation` (`core/fuzz/`).
//!
//! A [`World`] is a dev node with three tenants: the root namespace (a secret, the LDAP
//! mount), namespace `a/` (with a child `a/c/`) and namespace `b/` (a secret), each of
//! `a/` and `b/` with an all-powerful tenant admin token (policy `*` with every capability
//! and sudo). Requests are built from a small vocabulary of paths, bodies and namespace
//! headers aimed at the places a tenant could reach out of its namespace (other tokens,
//! accessors, cluster-wide sys routes, sibling mounts, path tricks). Two promises:
//!
//! 1. [`World::unauthenticated`]: a request without a valid token changes nothing in
//!    storage, except the key-share flows ([`routes::Proof::KeyShares`]: generate-root, DR
//!    operation token generation), which keep their own attempt state.
//! 2. [`World::tenant`]: a token of namespace `a/` never reads, writes, lists, looks up,
//!    revokes or unlocks anything outside `a/` and its children (nothing of the root
//!    namespace or `b/` changes, and no answer carries their secrets, tokens or accessors),
//!    and no cluster-wide sys operation (a root-scoped route) succeeds for it.
//!
//! Not an API: hidden from the docs and free to change.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)] // a broken promise panics: that is the finding

use crate::api::{Method, Request, Response};
use crate::node::{Input, Node, Output};
use crate::replication::{merkle, wal};
use crate::routes::{self, Class, Proof, Scope};
use crate::storage::cow::CowStorage;
use serde_json::{json, Value};
use std::sync::Arc;

const ROOT: &str = "root-isolation";
const ROOT_SECRET: &str = "ROOT-SENTINEL-7f3a";
const B_SECRET: &str = "B-SENTINEL-91c2";
const ADMIN: &str =
    r#"path "*" { capabilities = ["create", "read", "update", "delete", "list", "sudo"] }"#;

/// Paths a request may name (`{..}` are filled in by [`World::fill`]).
const PATHS: &[&str] = &[
    "sys/seal",
    "sys/seal/",
    "sys/audit/x",
    "sys/audit",
    "sys/audit-hash/x",
    "sys/replication/performance/primary/enable",
    "sys/replication/dr/primary/enable",
    "sys/replication/dr/secondary/promote",
    "sys/generate-root/attempt",
    "sys/metrics",
    "sys/license/status",
    "sys/mounts/m",
    "sys/mounts/secret",
    "sys/mounts/kv",
    "sys/mounts/kv/tune",
    "sys/auth/ldap",
    "sys/auth/x",
    "sys/policies/acl/admin",
    "sys/policies/acl/p",
    "sys/policy/p",
    "sys/namespaces/b",
    "sys/namespaces/a",
    "sys/namespaces/n",
    "sys/locked-users",
    "sys/locked-users/{ldap_acc}/unlock/alice",
    "sys/capabilities",
    "sys/capabilities-accessor",
    "sys/capabilities-self",
    "sys/wrapping/wrap",
    "sys/wrapping/unwrap",
    "sys/wrapping/lookup",
    "auth/token/lookup",
    "auth/token/lookup-accessor",
    "auth/token/revoke",
    "auth/token/revoke-accessor",
    "auth/token/revoke-orphan",
    "auth/token/renew",
    "auth/token/accessors",
    "auth/token/accessors/",
    "auth/token/create",
    "auth/token/create-orphan",
    "auth/token/lookup-self",
    "secret/r",
    "secret/",
    "secret",
    "kv/s",
    "kv/",
    "b/kv/s",
    "a/kv/s",
    "a/c/kv/s",
    "root/secret/r",
    "b/sys/seal",
    "b/auth/token/lookup",
    "auth/ldap/config",
    "auth/ldap/users/alice",
    "auth/ldap/users/login",
    "auth/ldap/login/alice",
    "auth/ldap/groups/g",
    "sys/raw/x",
    "sys/rotate",
    "identity/entity",
    "{root}",
];

/// Request bodies.
const BODIES: &[&str] = &[
    "{}",
    r#"{"token": "{root}"}"#,
    r#"{"token": "{b}"}"#,
    r#"{"accessor": "{root_acc}"}"#,
    r#"{"accessor": "{b_acc}"}"#,
    r#"{"type": "file", "options": {"file_path": "/tmp/isolation-audit.log"}}"#,
    r#"{"type": "kv"}"#,
    r#"{"policy": "path \"*\" { capabilities = [\"sudo\", \"read\", \"list\"] }"}"#,
    r#"{"input": "hunter2"}"#,
    r#"{"path": "secret/r", "token": "{root}"}"#,
    r#"{"paths": ["secret/r"], "accessor": "{b_acc}"}"#,
    r#"{"policies": ["root"], "period": "87600h"}"#,
    r#"{"policies": "root"}"#,
    r#"{"v": "x"}"#,
    "null",
];

/// Namespace headers.
const NAMESPACES: &[Option<&str>] = &[None, Some("a"), Some("a/c"), Some("b"), Some("root")];

/// One request of the vocabulary, by indices (wrapped around).
#[derive(Debug, Clone, Copy)]
pub struct Op {
    pub method: u8,
    pub path: u8,
    pub body: u8,
    pub namespace: u8,
}

impl Op {
    pub fn from_bytes(b: [u8; 4]) -> Op {
        Op {
            method: b[0],
            path: b[1],
            body: b[2],
            namespace: b[3],
        }
    }
}

/// A read that shows the state of another tenant: (token, namespace, method, path).
type Probe<'a> = (&'a str, Option<&'a str>, Method, &'a str);

#[derive(Clone)]
pub struct World {
    /// Over copy-on-write storage frozen after the set-up: a copy costs little, and the
    /// storage's journal says which keys a request changed.
    node: Node<CowStorage>,
    /// Storage key prefixes that hold only what lies inside `a/` (its and `a/c/`'s mounts
    /// and policies, `a/`'s child namespaces): see [`World::inside`].
    inside: Vec<String>,
    /// How many times [`World::outside`] was read (the probes' cost).
    pub probes: u64,
    next_id: u64,
    a: String,
    b: String,
    root_acc: String,
    b_acc: String,
    ldap_acc: String,
    /// The vocabulary with its placeholders filled in and its bodies parsed, once per
    /// world (shared by its copies): [`World::request_of`] only picks from it.
    vocab: Arc<Vocab>,
    /// A breach planted for a test: run on the node after the request of that index.
    #[cfg(test)]
    plant: Option<Plant>,
}

/// [`PATHS`] and [`BODIES`] as a request of this world sends them: placeholders filled in
/// ([`World::fill`]), each body parsed (`None`: not JSON, sent without a body) with its text
/// as the tenant sent it (what [`World::tenant_against`] counts as sent by the tenant).
#[derive(Default)]
struct Vocab {
    paths: Vec<String>,
    bodies: Vec<(Option<Value>, String)>,
}

impl Vocab {
    /// The body `op` sends, parsed, and its text.
    fn body(&self, op: Op) -> &(Option<Value>, String) {
        &self.bodies[usize::from(op.body) % BODIES.len()]
    }
}

/// A test's planted breach: after which request, and what it does to the node.
#[cfg(test)]
type Plant = (usize, fn(&mut Node<CowStorage>));

fn method(n: u8) -> Method {
    [
        Method::Get,
        Method::List,
        Method::Put,
        Method::Post,
        Method::Delete,
    ][usize::from(n) % 5]
}

impl Default for World {
    fn default() -> Self {
        World::new()
    }
}

impl World {
    /// A copy of this thread's prototype world (set up once by [`World::new`]): what a fuzz
    /// input starts from. Nothing an earlier input did is in it, so an input's outcome does
    /// not depend on the ones before it, and no input pays for the set-up.
    pub fn fresh() -> World {
        thread_local! {
            static PROTOTYPE: World = World::new();
        }
        PROTOTYPE.with(World::clone)
    }

    /// The three tenants, set up by the root token.
    pub fn new() -> World {
        let node = Node::dev_over(CowStorage::default(), [42; 32], ROOT);
        let mut w = World {
            node,
            inside: Vec::new(),
            probes: 0,
            next_id: 1,
            a: String::new(),
            b: String::new(),
            root_acc: String::new(),
            b_acc: String::new(),
            ldap_acc: String::new(),
            vocab: Arc::default(),
            #[cfg(test)]
            plant: None,
        };
        let setup: &[(Option<&str>, Method, &str, Value)] = &[
            (None, Method::Put, "secret/r", json!({ "v": ROOT_SECRET })),
            (None, Method::Put, "sys/namespaces/a", json!({})),
            (None, Method::Put, "sys/namespaces/b", json!({})),
            (Some("a"), Method::Put, "sys/namespaces/c", json!({})),
            (
                Some("a"),
                Method::Put,
                "sys/mounts/kv",
                json!({"type": "kv"}),
            ),
            (
                Some("a/c"),
                Method::Put,
                "sys/mounts/kv",
                json!({"type": "kv"}),
            ),
            (
                Some("b"),
                Method::Put,
                "sys/mounts/kv",
                json!({"type": "kv"}),
            ),
            (Some("b"), Method::Put, "kv/s", json!({ "v": B_SECRET })),
            (Some("a"), Method::Put, "kv/s", json!({"v": "a-own"})),
            (
                Some("a"),
                Method::Put,
                "sys/policies/acl/admin",
                json!({ "policy": ADMIN }),
            ),
            (
                Some("b"),
                Method::Put,
                "sys/policies/acl/admin",
                json!({ "policy": ADMIN }),
            ),
        ];
        for (ns, m, p, body) in setup {
            let r = w.call(Some(ROOT), *ns, *m, p, Some(body.clone()));
            assert!(r.status < 300, "setup {p}: {r:?}");
        }
        let mk = |w: &mut World, ns: &str| -> String {
            let r = w.call(
                Some(ROOT),
                Some(ns),
                Method::Post,
                "auth/token/create",
                Some(json!({"policies": ["admin"]})),
            );
            r.body
                .as_ref()
                .map(|b| b["auth"]["client_token"].clone())
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| panic!("setup: token in {ns}: {r:?}"))
        };
        w.a = mk(&mut w, "a");
        w.b = mk(&mut w, "b");
        let acc = |w: &mut World, t: &str, ns: Option<&str>| -> String {
            let r = w.call(Some(t), ns, Method::Get, "auth/token/lookup-self", None);
            r.body
                .as_ref()
                .and_then(|b| b["data"]["accessor"].as_str().map(str::to_string))
                .unwrap_or_else(|| panic!("setup: lookup-self: {r:?}"))
        };
        w.root_acc = acc(&mut w, ROOT, None);
        let b = w.b.clone();
        w.b_acc = acc(&mut w, &b, Some("b"));
        let r = w.call(Some(ROOT), None, Method::Get, "sys/auth", None);
        w.ldap_acc = r
            .body
            .as_ref()
            .and_then(|b| b["data"]["ldap/"]["accessor"].as_str().map(str::to_string))
            .unwrap_or_else(|| panic!("setup: ldap accessor: {r:?}"));
        // What lives inside `a/`: the data of the mounts of `a/` and `a/c/` (not the
        // built-in ones, whose storage every namespace shares), their policies, the records
        // of `a/`'s children (not `a/`'s own record, which its parent owns).
        for ns in ["a", "a/c"] {
            let r = w.call(Some(ROOT), Some(ns), Method::Get, "sys/mounts", None);
            let mounts = r.body.as_ref().map(|b| b["data"].clone());
            let Some(Value::Object(mounts)) = mounts else {
                panic!("setup: mounts of {ns}: {r:?}");
            };
            for m in mounts.values() {
                if let (Some(uuid), Some(kind)) = (m["uuid"].as_str(), m["type"].as_str()) {
                    let prefix = format!("logical/{uuid}/");
                    if uuid != kind && !w.inside.contains(&prefix) {
                        w.inside.push(prefix);
                    }
                }
            }
        }
        assert!(w.inside.len() >= 2, "setup: the kv mounts of a/ and a/c/");
        w.inside
            .push(format!("{}a/", crate::namespace::POLICY_PREFIX));
        let paths = PATHS.iter().map(|p| w.fill(p)).collect();
        let bodies = BODIES
            .iter()
            .map(|b| {
                let body: Option<Value> = serde_json::from_str(&w.fill(b)).ok();
                let text = body.as_ref().map(Value::to_string).unwrap_or_default();
                (body, text)
            })
            .collect();
        w.vocab = Arc::new(Vocab { paths, bodies });
        w.node.storage_mut().freeze();
        w
    }

    /// Whether a change of storage key `k` can change nothing [`World::outside`] reads: `k`
    /// holds only what lies inside `a/`, or is the replication bookkeeping derived from the
    /// other keys written in the same write set (WAL entries, Merkle pages), which no probe
    /// reads while replication is off (it cannot be turned on from `a/`: a cluster-wide
    /// route).
    fn inside(&self, k: &str) -> bool {
        let child_ns = k
            .strip_prefix(crate::namespace::PREFIX)
            .and_then(|p| p.strip_prefix("a/"))
            .is_some_and(|rest| !rest.is_empty());
        child_ns
            || self.inside.iter().any(|p| k.starts_with(p.as_str()))
            || k.starts_with(wal::ENTRY)
            || k.starts_with(wal::KEYS)
            || k == wal::META
            || k.starts_with(merkle::PREFIX)
    }

    /// The node's in-memory state that the probes of [`World::outside`] read besides
    /// storage, as text to compare: the seal and the unseal progress (`sys/seal-status`),
    /// the LDAP failure counts (`sys/locked-users`), the audit devices' health (`sys/audit`,
    /// and whether an audited request runs at all), the replication roles and secondaries'
    /// heartbeats (`sys/replication/status`) and the HA state (whether the node answers or
    /// forwards). Everything else they read is in storage (tokens, policies, mounts,
    /// namespaces, secrets, the LDAP configuration and locked users, the seal configuration),
    /// and the clock does not move. `None` (compare always) while a replication role is
    /// enabled: the status then shows the WAL position and Merkle roots, which every write
    /// moves, inside `a/` too.
    #[cfg(test)]
    fn memory_view(&self) -> Option<String> {
        let mut out = String::new();
        self.memory_view_into(&mut out).then_some(out)
    }

    /// [`World::memory_view`] written into `out` (cleared first, its allocation kept: the
    /// fuzz target writes it after every request); `false` for `None`.
    fn memory_view_into(&self, out: &mut String) -> bool {
        use crate::replication::state::Role;
        use std::fmt::Write as _;
        out.clear();
        let st = self.node.state();
        let repl = &st.repl;
        if repl.perf.role.role != Role::Disabled || repl.dr.role.role != Role::Disabled {
            return false;
        }
        write!(
            out,
            "{:?}",
            (
                self.node.is_sealed(),
                st.unseal_progress.progress(),
                &st.logins.failures,
                &st.audit,
                (&repl.perf, &repl.dr, &repl.live),
                &st.ha,
            )
        )
        .is_ok()
    }

    /// A point in this world's storage history, for [`World::changed_since`].
    fn mark(&self) -> usize {
        self.node.storage().position()
    }

    /// The storage keys whose value changed since `mark`.
    fn changed_since(&self, mark: usize) -> Vec<&str> {
        self.node.storage().changed_since(mark)
    }

    /// One request; its answer (a request left pending answers `202` with no body).
    fn call(
        &mut self,
        token: Option<&str>,
        ns: Option<&str>,
        m: Method,
        path: &str,
        body: Option<Value>,
    ) -> Response {
        let id = self.next_id;
        self.next_id += 1;
        let mut req = Request::new(id, m, path);
        req.token = token.map(str::to_string);
        req.namespace = ns.map(str::to_string);
        if let Some(b) = body {
            req = req.with_json(b);
        }
        self.node.handle(2_000, Input::Request(req));
        let mut answer = None;
        while let Some(o) = self.node.poll_output() {
            match o {
                Output::Response(r) if r.id == id => answer = Some(r),
                // No file is opened: a device being enabled waits forever.
                _ => {}
            }
        }
        answer.unwrap_or(Response {
            id,
            status: 202,
            body: None,
            raw: None,
            index: None,
        })
    }

    fn fill(&self, s: &str) -> String {
        s.replace("{root}", ROOT)
            .replace("{b}", &self.b)
            .replace("{root_acc}", &self.root_acc)
            .replace("{b_acc}", &self.b_acc)
            .replace("{ldap_acc}", &self.ldap_acc)
    }

    fn request_of(&self, op: Op) -> (Method, String, Option<&'static str>, Option<Value>) {
        let path = self.vocab.paths[usize::from(op.path) % PATHS.len()].clone();
        let body = self.vocab.body(op).0.clone();
        let ns = NAMESPACES[usize::from(op.namespace) % NAMESPACES.len()];
        (method(op.method), path, ns, body)
    }

    /// The declared class and scope of `path` as the router would see it (leading
    /// namespace segments skipped); `None` when it is not a sys route.
    fn sys_route(path: &str) -> Option<(Class, Scope)> {
        let p = routes::canonical(path).ok()?;
        let segs: Vec<&str> = p.split('/').collect();
        let at = segs.iter().position(|s| *s == "sys")?;
        let rel = segs[at..].join("/");
        routes::lookup_sys(&rel).map(|r| (r.class, r.scope))
    }

    /// Promise 1 for `op` sent with no token (`garbage`: with a token that does not exist).
    pub fn unauthenticated(&mut self, op: Op, garbage: bool) -> Result<(), String> {
        let (m, path, ns, body) = self.request_of(op);
        let before = self.mark();
        let token = garbage.then_some("hvs.not-a-token");
        let r = self.call(token, ns, m, &path, body);
        let key_shares = matches!(
            Self::sys_route(&path),
            Some((Class::Proof(Proof::KeyShares), _))
        );
        if !self.changed_since(before).is_empty() && !key_shares {
            return Err(format!(
                "{m:?} {path} (namespace {ns:?}) without a valid token changed storage; answer {r:?}"
            ));
        }
        if self.node.is_sealed() {
            return Err(format!(
                "{m:?} {path} without a valid token sealed the node"
            ));
        }
        Ok(())
    }

    /// Promise 3 (one input, one write set): a request that is refused (4xx or 5xx) leaves
    /// storage byte-identical, whoever sends it (`who`: none, root, the `a/` or `b/` admin,
    /// a made-up token) and whatever `X-Vault-Wrap-TTL` it carries (`wrap`: none, valid,
    /// malformed, negative).
    pub fn refused_changes_nothing(&mut self, op: Op, who: u8, wrap: u8) -> Result<(), String> {
        let (m, path, ns, body) = self.request_of(op);
        let token = match who % 5 {
            0 => None,
            1 => Some(ROOT.to_string()),
            2 => Some(self.a.clone()),
            3 => Some(self.b.clone()),
            _ => Some("hvs.made-up".to_string()),
        };
        let id = self.next_id;
        self.next_id += 1;
        let mut req = Request::new(id, m, &path);
        req.token = token;
        req.namespace = ns.map(str::to_string);
        req.wrap_ttl =
            [None, Some("5m"), Some("zzz"), Some("-1")][usize::from(wrap % 4)].map(str::to_string);
        if let Some(b) = body {
            req = req.with_json(b);
        }
        let before = self.mark();
        self.node.handle(2_000, Input::Request(req));
        let mut status = 202;
        while let Some(o) = self.node.poll_output() {
            if let Output::Response(r) = o {
                if r.id == id {
                    status = r.status;
                }
            }
        }
        if status >= 400 && !self.changed_since(before).is_empty() {
            return Err(format!(
                "{m:?} {path} (namespace {ns:?}, who {who}, wrap {wrap}) was refused with \
                 {status} but changed storage"
            ));
        }
        Ok(())
    }

    /// What the root namespace and `b/` look like to their own admins.
    fn outside(&mut self) -> Vec<Seen> {
        self.probes += 1;
        let b = self.b.clone();
        let probes: Vec<Probe> = vec![
            (ROOT, None, Method::Get, "secret/r"),
            (&b, Some("b"), Method::Get, "kv/s"),
            (ROOT, None, Method::Get, "auth/token/lookup-self"),
            (&b, Some("b"), Method::Get, "auth/token/lookup-self"),
            (ROOT, None, Method::List, "sys/policies/acl"),
            (&b, Some("b"), Method::List, "sys/policies/acl"),
            (&b, Some("b"), Method::Get, "sys/policies/acl/admin"),
            (ROOT, None, Method::Get, "sys/audit"),
            (ROOT, None, Method::Get, "sys/mounts"),
            (&b, Some("b"), Method::Get, "sys/mounts"),
            (ROOT, None, Method::Get, "sys/auth"),
            (&b, Some("b"), Method::Get, "sys/auth"),
            (ROOT, None, Method::List, "sys/namespaces"),
            (ROOT, None, Method::Get, "sys/seal-status"),
            (ROOT, None, Method::Get, "sys/replication/status"),
            (ROOT, None, Method::Get, "auth/ldap/config"),
            (ROOT, None, Method::List, "auth/ldap/users"),
            (ROOT, None, Method::Get, "sys/locked-users"),
        ];
        let mut out = Vec::new();
        for (t, ns, m, p) in probes {
            let t = t.to_string();
            let r = self.call(Some(&t), ns, m, p, None);
            let mut v = r.body.unwrap_or(Value::Null);
            if let Value::Object(o) = &mut v {
                o.remove("request_id");
            }
            out.push((format!("{ns:?} {m:?} {p}"), r.status, v));
        }
        out
    }

    /// Promise 2 for a sequence of requests by the admin token of `a/`; what lies outside
    /// is compared after every request.
    pub fn tenant(&mut self, ops: &[Op]) -> Result<(), String> {
        self.tenant_checked(ops, Compare::EveryRequest)
    }

    /// Promise 2, comparing what lies outside `a/` as `when` says.
    pub fn tenant_checked(&mut self, ops: &[Op], when: Compare) -> Result<(), String> {
        let before = self.outside();
        self.tenant_against(ops, &before, when)
    }

    /// Promise 2 for `ops` with `before`, what [`World::outside`] answered in this state (a
    /// fuzz input starts from a copy of a world whose view was taken once).
    fn tenant_against(&mut self, ops: &[Op], before: &[Seen], when: Compare) -> Result<(), String> {
        self.tenant_run(ops, before, when, None)
    }

    /// [`World::tenant_against`]; with `memo` (the input's bytes and the states already
    /// checked), the outside is read on a copy of the world, so what this world does next
    /// does not depend on whether it was read, and not read again for a state that
    /// [`Checked`] holds.
    fn tenant_run(
        &mut self,
        ops: &[Op],
        before: &[Seen],
        when: Compare,
        mut memo: Option<(&[u8], &mut Checked)>,
    ) -> Result<(), String> {
        let secrets = [
            ROOT.to_string(),
            self.b.clone(),
            self.root_acc.clone(),
            self.b_acc.clone(),
            ROOT_SECRET.to_string(),
            B_SECRET.to_string(),
        ];
        let a = self.a.clone();
        // Where the storage and the in-memory state the probes read stood when the outside
        // was last compared.
        let mut compared = self.mark();
        // (`false`: `None`, compare always.)
        let mut view = String::new();
        let mut view_some = self.memory_view_into(&mut view);
        let mut now_view = String::new();
        // Secrets the tenant itself has sent in a body (the generator may put another
        // namespace's token in one, say as a KV value it then reads back): an answer that
        // repeats them reveals nothing the tenant did not hold.
        let mut sent: Vec<&String> = Vec::new();
        let vocab = Arc::clone(&self.vocab);
        for (i, &op) in ops.iter().enumerate() {
            let (m, path, ns, body) = self.request_of(op);
            let body_text = &vocab.body(op).1;
            sent.extend(secrets.iter().filter(|s| body_text.contains(s.as_str())));
            let r = self.call(Some(&a), ns, m, &path, body);
            #[cfg(test)]
            if let Some((at, plant)) = self.plant {
                if at == i {
                    plant(&mut self.node);
                }
            }
            // Only for a finding: formatted when one is reported.
            let what = || format!("op {i}: {m:?} {path} (namespace {ns:?}) → {}", r.status);
            let text = r.body.as_ref().map(Value::to_string).unwrap_or_default();
            if let Some(s) = secrets
                .iter()
                .filter(|s| !sent.contains(s))
                .find(|s| text.contains(s.as_str()))
            {
                return Err(format!(
                    "{}: the answer carries {s:?} of another namespace: {text}",
                    what()
                ));
            }
            // Key-share routes answer anyone (the shares are the credential); every other
            // cluster-wide route needs a root-namespace token.
            if r.status < 300 {
                if let Some((Class::Token | Class::Sudo | Class::DrSecondary, Scope::Root)) =
                    Self::sys_route(&path)
                {
                    return Err(format!(
                        "{}: a cluster-wide route succeeded: {text}",
                        what()
                    ));
                }
            }
            if self.node.is_sealed() {
                return Err(format!("{}: the node is sealed", what()));
            }
            let last = i + 1 == ops.len();
            let changed = self.changed_since(compared);
            let wrote = !changed.is_empty();
            let outside_written = changed.iter().any(|k| !self.inside(k));
            // The in-memory view is written only when the keys alone do not decide.
            let outside_changed = outside_written || {
                let now_some = self.memory_view_into(&mut now_view);
                !now_some || !view_some || now_view != view
            };
            let compare = match when {
                Compare::EveryRequest => true,
                Compare::AfterWrites => last || wrote,
                Compare::OutsideChanges => outside_changed,
                Compare::AtEnd => last,
            };
            if !compare {
                continue;
            }
            // The input's first i + 1 requests, which alone made this state (see `Checked`).
            let prefix = memo.as_ref().and_then(|(data, _)| data.get(..4 * (i + 1)));
            let after = match (&mut memo, prefix) {
                (Some((_, checked)), Some(prefix)) => {
                    if checked.states.contains(prefix) {
                        checked.skipped += 1;
                        compared = self.mark();
                        view_some = self.memory_view_into(&mut view);
                        continue;
                    }
                    self.clone().outside()
                }
                _ => self.outside(),
            };
            if let Some((b, a)) = before.iter().zip(&after).find(|(b, a)| b != a) {
                // Comparing after every request also checks the rule of `OutsideChanges`:
                // a change it would not have looked for is a finding of its own.
                let missed = if outside_changed {
                    ""
                } else {
                    " (and neither a key outside a/ nor the in-memory state the probes read \
                     changed: `OutsideChanges` misses this)"
                };
                return Err(format!(
                    "{}: changed what lies outside a/{missed}: {}\n before: {} {}\n after:  {} {}",
                    what(),
                    b.0,
                    b.1,
                    b.2,
                    a.1,
                    a.2
                ));
            }
            if let (Some((_, checked)), Some(prefix)) = (&mut memo, prefix) {
                checked.insert(prefix);
            }
            // After the probes: a read may write what an earlier write left pending (the
            // Merkle pages are flushed by the next request).
            compared = self.mark();
            view_some = self.memory_view_into(&mut view);
        }
        Ok(())
    }
}

/// The states of the fuzz target's world whose outside was read and found as before, each by
/// the input bytes that made it: the requests of `a/`'s admin up to that point (4 bytes
/// each). Every input starts from a copy of the same world, the node is deterministic (a
/// seeded RNG, a fixed clock) and the outside is read on a copy, so the same bytes make the
/// same state, storage and memory alike: reading the outside there again would answer the
/// same. Mutated inputs share their parent's first requests, so most of the outside reads of
/// a grown corpus are of states already read. Capped (cleared when full).
#[derive(Default)]
pub struct Checked {
    states: std::collections::BTreeSet<Vec<u8>>,
    /// Outside reads skipped because their state was here.
    pub skipped: u64,
}

impl Checked {
    /// At most this many states are kept (each at most 96 bytes).
    const CAP: usize = 1 << 19;

    fn insert(&mut self, prefix: &[u8]) {
        if self.states.len() >= Self::CAP {
            self.states.clear();
        }
        self.states.insert(prefix.to_vec());
    }
}

/// One answer of [`World::outside`]: (what was asked, status, body without its request id).
type Seen = (String, u16, Value);

/// When [`World::tenant_checked`] compares what lies outside `a/` with what it was before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    /// After every request.
    EveryRequest,
    /// After every request that changed storage, and after the last one. What the probes
    /// read lives in storage (mounts, policies, tokens, secrets, namespaces, LDAP config)
    /// or is checked after every request anyway (sealed, a cluster-wide route that
    /// succeeded); an in-memory change that no write accompanies is still seen at the end
    /// unless a later request undid it. A change is reported at the request that made it.
    AfterWrites,
    /// After every request that changed a storage key outside `a/` (the write set against
    /// `a/`'s key prefixes, [`World::inside`]) or the in-memory state the probes read
    /// ([`World::memory_view`]), and at no other time: not at the end of a sequence that
    /// changed neither since the last comparison. The probes' answers are a function of
    /// storage outside `a/`, that in-memory state and the (fixed) clock, so this sees every
    /// change the other modes see, at the request that made it (an in-memory one too),
    /// without reading the outside after the tenant's own writes or at the end of an input
    /// that stayed inside ([`Compare::EveryRequest`] checks that rule on every request).
    OutsideChanges,
    /// Once, after the last request (faster; the change is reported at the last one).
    AtEnd,
}

/// Fuzz entry (target `unauthenticated`): 5 bytes per request (4 for [`Op`], 1 for a
/// missing or a made-up token); panics when promise 1 breaks.
pub fn fuzz_unauthenticated(data: &[u8]) {
    let mut w = World::fresh();
    for c in data.chunks_exact(5).take(32) {
        if let Err(e) = w.unauthenticated(Op::from_bytes([c[0], c[1], c[2], c[3]]), c[4] & 1 == 1) {
            panic!("{e}");
        }
    }
}

/// Fuzz entry (target `namespace_isolation`): 4 bytes per request of the `a/` admin;
/// panics when promise 2 breaks. Every input starts from a copy of this thread's world taken
/// after its outside view was read (what the probes answer there is read once, not per
/// input; the copy shares the world's storage and Merkle sums, copy-on-write), and compares
/// that view after every request that changed a storage key outside `a/` or the in-memory
/// state the probes read ([`Compare::OutsideChanges`]), on a copy of the world, once per
/// state: a state this thread has read before (the same first requests: [`Checked`]) is not
/// read again. Every answer is checked for the other namespaces' secrets, and for a
/// cluster-wide route that succeeded, at every request.
pub fn fuzz_namespace_isolation(data: &[u8]) {
    thread_local! {
        static PROTOTYPE: (World, Vec<Seen>) = {
            let mut w = World::new();
            let before = w.outside();
            (w, before)
        };
        static CHECKED: std::cell::RefCell<Checked> = std::cell::RefCell::default();
    }
    let ops: Vec<Op> = data
        .chunks_exact(4)
        .take(24)
        .map(|c| Op::from_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let result = PROTOTYPE.with(|(w, before)| {
        CHECKED.with_borrow_mut(|checked| {
            w.clone()
                .tenant_run(&ops, before, Compare::OutsideChanges, Some((data, checked)))
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[cfg(test)]
mod tests;
