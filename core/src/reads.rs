//! Reads answered beside the node: a KV read served by a thread of the driver's own from
//! the committed storage, in parallel with the node and with other reads.
//!
//! The node owns its state and handles one input at a time; a read that needs nothing of
//! that state but the barrier key (the token, its policies, the mount and the value are all
//! in storage) can be answered by [`answer`] on any thread, over a read-only view of the
//! storage as some commit left it. The node hands out what such a reader needs as a
//! [`ReadView`] ([`crate::node::Node::read_view`]) only while nothing else it holds in
//! memory changes a read's answer: unsealed, not part of an HA cluster (a standby
//! forwards, an active node's storage is shared), neither kind of replication secondary
//! (their reads check `X-Vault-Index` and their role), with its replication roles loaded.
//!
//! [`answer`] takes only what it can answer exactly as the node would: `GET` or `LIST` on
//! a KV version 1 or 2 data route, with a token that is not use-limited, no response
//! wrapping, no `X-Vault-Index`, no `?help`, not forwarded, while no audit device is
//! enabled, and only a successful answer whose handler wrote nothing. Anything else,
//! refusals and errors included, is left for the node to run (a reader has no side
//! effect, so running the request again there changes nothing). The node
//! counts what readers answered ([`crate::node::Node::count_answered`]).
//!
//! The driver decides which committed state a reader sees and must not answer from a state
//! it has not made durable (the shell waits for the sync that covers the reader's
//! snapshot); read-your-writes holds because a write is acknowledged only after its commit.

use crate::api::{Method, Reply, Request, Response};
use crate::ctx::Ctx;
use crate::metrics::{self, Answered};
use crate::node::head::Head;
use crate::seal::Barrier;
use crate::storage::{Storage, Txn};
use crate::time::Millis;
use rand_chacha::ChaCha20Rng;

/// What a reader needs from the node: the barrier key. Replaced whole when the node's
/// state changes (see [`crate::node::Node::read_view`]); compared to tell.
#[derive(Clone, PartialEq, Eq)]
pub struct ReadView {
    key: zeroize::Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for ReadView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReadView { key: <redacted> }")
    }
}

impl ReadView {
    pub(crate) fn new(key: &zeroize::Zeroizing<[u8; 32]>) -> ReadView {
        ReadView { key: key.clone() }
    }
}

/// A read answered by [`answer`]: the client's answer and what the node counts of it.
#[derive(Debug, Clone)]
pub struct Served {
    pub response: Response,
    pub answered: Answered,
}

/// Answers `req` from `storage` (a consistent, committed state) when it is a read the node
/// would answer the same way from that state; `None`: the node must run it. `rng` draws the
/// answer's `request_id` only.
pub fn answer<S: Storage>(
    view: &ReadView,
    storage: &S,
    now: Millis,
    rng: &mut ChaCha20Rng,
    req: &Request,
) -> Option<Served> {
    if !matches!(req.method, Method::Get | Method::List)
        || req.forwarded.is_some()
        || req.on_behalf.is_some()
    {
        return None;
    }
    let mut r = req.clone();
    match Head::parse(&mut r) {
        Ok(h) if h.wrap_ttl.is_none() && h.index.is_none() => {}
        _ => return None,
    }
    let barrier = Barrier::with_key(&view.key);
    let mut ctx = Ctx {
        txn: Txn::new(storage),
        barrier: &barrier,
        rng: &mut *rng,
        now,
    };
    // An audit device records every request with its answer: the node's to do. Any device
    // stored, even one that does not decode, and any failure to tell, sends the read to
    // the node (`audit::devices` reads a failed scan as "none": a reader must not answer
    // unaudited because its own connection could not read the device list).
    if !matches!(ctx.keys(crate::audit::PREFIX), Ok(k) if k.is_empty()) {
        return None;
    }
    let reply = match crate::router::read_only(&mut ctx, &r) {
        Some(Ok(reply @ (Reply::Data(_) | Reply::Envelope(_)))) => reply,
        _ => return None,
    };
    if !ctx.txn.into_write_set().is_empty() {
        return None;
    }
    let request_id = crate::crypto::uuid(rng);
    Some(Served {
        response: Response::json(req.id, 200, crate::node::envelope_of(&request_id, reply)),
        answered: Answered {
            method: metrics::method_name(r.method),
            class: metrics::path_class(&r.path),
            status: 200,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{Input, Node, Output};
    use crate::storage::MemStorage;
    use quickcheck::{Arbitrary, Gen, QuickCheck};
    use rand_core::SeedableRng;
    use serde_json::{json, Value};

    const ROOT: &str = "root";
    const NOW: Millis = 5_000;

    fn call(n: &mut Node<MemStorage>, req: Request) -> Response {
        let id = req.id;
        n.handle(NOW, Input::Request(req));
        let mut found = None;
        while let Some(o) = n.poll_output() {
            if let Output::Response(r) = o {
                if r.id == id {
                    found = Some(r);
                }
            }
        }
        found.unwrap_or_else(|| panic!("no response for request {id}"))
    }

    fn put(n: &mut Node<MemStorage>, path: &str, body: Value) -> Value {
        let r = call(
            n,
            Request::new(9_000, Method::Put, path)
                .with_token(ROOT)
                .with_json(body),
        );
        assert!(r.status < 300, "{path}: {} {:?}", r.status, r.body);
        r.body.unwrap_or(Value::Null)
    }

    fn token(n: &mut Node<MemStorage>, body: Value) -> String {
        let v = put(n, "auth/token/create", body);
        v["auth"]["client_token"]
            .as_str()
            .unwrap_or_else(|| panic!("no token in {v}"))
            .to_string()
    }

    /// A dev node with KV version 1 and 2 data, a namespace, and tokens: a reader, a
    /// reader of one path only, a use-limited reader, and root.
    fn world() -> (Node<MemStorage>, Vec<String>) {
        let mut n = Node::dev_in_memory([3; 32], ROOT);
        put(
            &mut n,
            "sys/mounts/kv2",
            json!({"type": "kv", "options": {"version": "2"}}),
        );
        put(&mut n, "sys/namespaces/ns1", json!({}));
        put(&mut n, "secret/a", json!({"v": 1}));
        put(&mut n, "secret/dir/b", json!({"v": 2}));
        put(&mut n, "kv2/data/c", json!({"data": {"v": 3}}));
        put(
            &mut n,
            "sys/policies/acl/reader",
            json!({"policy": "path \"secret/*\" { capabilities = [\"read\", \"list\"] }\n\
                   path \"kv2/*\" { capabilities = [\"read\", \"list\"] }"}),
        );
        put(
            &mut n,
            "sys/policies/acl/one",
            json!({"policy": "path \"secret/a\" { capabilities = [\"read\"] }"}),
        );
        let reader = token(&mut n, json!({"policies": ["reader"]}));
        let one = token(&mut n, json!({"policies": ["one"]}));
        let limited = token(&mut n, json!({"policies": ["reader"], "num_uses": 3}));
        let short = token(&mut n, json!({"policies": ["reader"], "ttl": "1s"}));
        (
            n,
            vec![ROOT.into(), reader, one, limited, short, "nonsense".into()],
        )
    }

    fn rng() -> ChaCha20Rng {
        ChaCha20Rng::from_seed([7; 32])
    }

    /// The answer without its `request_id` (drawn at random on either side).
    fn comparable(r: &Response) -> (u16, Option<Value>) {
        let mut body = r.body.clone();
        if let Some(Value::Object(m)) = body.as_mut() {
            m.remove("request_id");
        }
        (r.status, body)
    }

    /// Answers `req` beside the node if it can, then by the node: they must agree.
    /// True when the reader answered.
    fn agree(n: &mut Node<MemStorage>, req: Request, now: Millis) -> bool {
        let Some(view) = n.read_view() else {
            return false;
        };
        let beside = answer(&view, n.storage(), now, &mut rng(), &req);
        let by_node = {
            let id = req.id;
            n.handle(now, Input::Request(req));
            let mut found = None;
            while let Some(o) = n.poll_output() {
                if let Output::Response(r) = o {
                    if r.id == id {
                        found = Some(r);
                    }
                }
            }
            found.unwrap_or_else(|| panic!("no response for {id}"))
        };
        match beside {
            Some(served) => {
                assert_eq!(
                    comparable(&served.response),
                    comparable(&by_node),
                    "the reader's answer differs from the node's"
                );
                assert_eq!(served.answered.status, by_node.status);
                true
            }
            None => false,
        }
    }

    #[test]
    fn a_plain_kv_read_is_answered_beside_the_node_as_the_node_answers_it() {
        let (mut n, tokens) = world();
        let reader = &tokens[1];
        for (method, path) in [
            (Method::Get, "secret/a"),
            (Method::List, "secret/"),
            (Method::Get, "kv2/data/c"),
            (Method::List, "kv2/metadata/"),
        ] {
            let req = Request::new(1, method, path).with_token(reader);
            assert!(agree(&mut n, req, NOW), "{path} was not answered beside");
        }
        // `GET ?list=true` is a LIST.
        let mut req = Request::new(2, Method::Get, "secret/dir").with_token(reader);
        req.query = vec![("list".into(), "true".into())];
        assert!(agree(&mut n, req, NOW));
    }

    #[test]
    fn what_needs_the_node_is_handed_back() {
        let (mut n, tokens) = world();
        let (reader, one, limited) = (&tokens[1], &tokens[2], &tokens[3]);
        let get = |path: &str, t: &str| Request::new(3, Method::Get, path).with_token(t);
        let mut wrapped = get("secret/a", reader);
        wrapped.wrap_ttl = Some("60s".into());
        let mut help = get("secret/a", reader);
        help.query = vec![("help".into(), "1".into())];
        let mut forwarded = get("secret/a", reader);
        forwarded.forwarded = Some("1.2.3.4".into());
        let cases = [
            ("a use-limited token", get("secret/a", limited)),
            ("response wrapping", wrapped),
            ("help", help),
            ("a forward", forwarded),
            (
                "a write",
                Request::new(3, Method::Put, "secret/x").with_token(reader),
            ),
            ("a refusal", get("secret/dir/b", one)),
            ("no token", Request::new(3, Method::Get, "secret/a")),
            ("a missing key", get("secret/nothing", reader)),
            ("a sys route", get("sys/mounts", ROOT)),
            ("a token route", get("auth/token/lookup-self", reader)),
        ];
        let view = n.read_view().expect("an unsealed dev node has a view");
        for (what, req) in cases {
            let got = answer(&view, n.storage(), NOW, &mut rng(), &req);
            assert!(got.is_none(), "{what} was answered beside the node");
        }
        // The limited token's three uses were all still there when this lookup ran:
        // nothing was spent beside the node.
        let r = call(
            &mut n,
            Request::new(4, Method::Get, "auth/token/lookup-self").with_token(limited),
        );
        assert_eq!(
            r.body.as_ref().map(|b| b["data"]["num_uses"].clone()),
            Some(json!(3))
        );
    }

    #[test]
    fn an_enabled_audit_device_sends_every_read_to_the_node() {
        let (mut n, tokens) = world();
        let view = n.read_view().expect("view");
        let req = Request::new(5, Method::Get, "secret/a").with_token(&tokens[1]);
        assert!(answer(&view, n.storage(), NOW, &mut rng(), &req).is_some());
        let dir = std::env::temp_dir().join(format!("cairn-reads-{}", std::process::id()));
        let file = dir.join("audit.log");
        let _ = std::fs::create_dir_all(&dir);
        let id = 9_100;
        n.handle(
            NOW,
            Input::Request(
                Request::new(id, Method::Put, "sys/audit/file")
                    .with_token(ROOT)
                    .with_json(json!({"type": "file", "options": {"file_path": file}})),
            ),
        );
        // The driver opens the file and tells the node.
        while let Some(o) = n.poll_output() {
            if let Output::AuditProbe { id, .. } = o {
                n.handle(NOW, Input::AuditProbed { id, result: Ok(()) });
            }
        }
        while n.poll_output().is_some() {}
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            answer(&view, n.storage(), NOW, &mut rng(), &req).is_none(),
            "a read beside the node would not be audited"
        );
    }

    /// A storage whose scans of one prefix fail (a reader's connection that cannot read
    /// the audit devices).
    struct FailingScan<'a> {
        inner: &'a MemStorage,
        prefix: &'static str,
    }

    impl Storage for FailingScan<'_> {
        fn get(&self, key: &str) -> Result<Option<Vec<u8>>, crate::storage::StorageError> {
            self.inner.get(key)
        }
        fn scan(
            &self,
            prefix: &str,
        ) -> Result<Vec<(String, Vec<u8>)>, crate::storage::StorageError> {
            match prefix.starts_with(self.prefix) {
                true => Err(crate::storage::StorageError::Io("busy".into())),
                false => self.inner.scan(prefix),
            }
        }
        fn apply(
            &mut self,
            _: &[crate::storage::Write],
        ) -> Result<(), crate::storage::StorageError> {
            Err(crate::storage::StorageError::Io("read-only".into()))
        }
    }

    /// A reader that cannot read the audit devices cannot know the read needs no audit: it
    /// hands the read to the node (it answered, unaudited, reading a failed scan as "no
    /// device").
    #[test]
    fn a_reader_that_cannot_read_the_audit_devices_hands_the_read_back() {
        let (n, tokens) = world();
        let view = n.read_view().expect("view");
        let req = Request::new(5, Method::Get, "secret/a").with_token(&tokens[1]);
        assert!(answer(&view, n.storage(), NOW, &mut rng(), &req).is_some());
        let failing = FailingScan {
            inner: n.storage(),
            prefix: crate::audit::PREFIX,
        };
        assert!(
            answer(&view, &failing, NOW, &mut rng(), &req).is_none(),
            "answered without knowing whether an audit device must record the read"
        );
    }

    #[test]
    fn a_sealed_node_gives_no_view() {
        let (mut n, _) = world();
        assert!(n.read_view().is_some());
        call(
            &mut n,
            Request::new(6, Method::Put, "sys/seal").with_token(ROOT),
        );
        assert!(n.is_sealed());
        assert!(n.read_view().is_none(), "sealed");
        // Secondaries: `replication::tests`; HA nodes: `ha::node_tests`.
    }

    #[test]
    fn an_expired_token_is_not_served_beside_the_node() {
        let (mut n, tokens) = world();
        let short = &tokens[4];
        let req = Request::new(7, Method::Get, "secret/a").with_token(short);
        assert!(agree(&mut n, req.clone(), NOW));
        // Past its TTL (1 s from its creation at `NOW`): refused, by the node.
        assert!(!agree(&mut n, req, NOW + 60_000));
    }

    /// A request drawn from paths, methods, tokens and headers that reach every branch.
    #[derive(Debug, Clone)]
    struct Drawn {
        method: Method,
        path: &'static str,
        token: usize,
        namespace: Option<&'static str>,
        query: Option<(&'static str, &'static str)>,
        wrap: bool,
    }

    impl Drawn {
        /// The drawn request with id `id` on `path`, with `token` if any.
        fn request(&self, id: u64, path: &str, token: Option<&String>) -> Request {
            let mut req = Request::new(id, self.method, path);
            req.token = token.cloned();
            req.namespace = self.namespace.map(str::to_string);
            req.query = self
                .query
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            if self.wrap {
                req.wrap_ttl = Some("30s".into());
            }
            req
        }
    }

    impl Arbitrary for Drawn {
        fn arbitrary(g: &mut Gen) -> Drawn {
            let paths = [
                "secret/a",
                "secret/a/",
                "/secret/a",
                "secret//a",
                "secret/dir/b",
                "secret/dir",
                "secret/",
                "secret",
                "secret/nothing",
                "kv2/data/c",
                "kv2/data/c/",
                "kv2/metadata/c",
                "kv2/metadata/",
                "kv2/config",
                "kv2/data/nothing",
                "ns1/secret/a",
                "sys/mounts",
                "auth/token/lookup-self",
                "cubbyhole/x",
                "nomount/x",
            ];
            Drawn {
                method: *g
                    .choose(&[
                        Method::Get,
                        Method::Get,
                        Method::List,
                        Method::Put,
                        Method::Delete,
                    ])
                    .unwrap_or(&Method::Get),
                path: g.choose(&paths).copied().unwrap_or("secret/a"),
                token: usize::arbitrary(g) % 7,
                namespace: *g
                    .choose(&[None, None, None, Some("ns1"), Some("nope")])
                    .unwrap_or(&None),
                query: *g
                    .choose(&[
                        None,
                        None,
                        Some(("list", "true")),
                        Some(("help", "1")),
                        Some(("version", "1")),
                    ])
                    .unwrap_or(&None),
                wrap: u8::arbitrary(g) % 8 == 0,
            }
        }
    }

    /// A change made as root between reads: every kind of state a read depends on.
    #[derive(Debug, Clone, Copy)]
    enum Change {
        RevokeReader,
        DeletePolicy,
        DenyPolicy,
        DisableSecret,
        RemountKv2,
        TuneKv2MaxVersions,
        DeleteKv2,
        DestroyKv2,
        WriteKv2Cas,
        DeleteNamespace,
        WaitTwoSeconds,
    }

    impl Arbitrary for Change {
        fn arbitrary(g: &mut Gen) -> Change {
            *g.choose(&[
                Change::RevokeReader,
                Change::DeletePolicy,
                Change::DenyPolicy,
                Change::DisableSecret,
                Change::RemountKv2,
                Change::TuneKv2MaxVersions,
                Change::DeleteKv2,
                Change::DestroyKv2,
                Change::WriteKv2Cas,
                Change::DeleteNamespace,
                Change::WaitTwoSeconds,
            ])
            .unwrap_or(&Change::WaitTwoSeconds)
        }
    }

    /// A request drawn as [`Drawn`] with more shapes, or a change of state.
    #[derive(Debug, Clone)]
    enum Step {
        Read(Drawn, usize),
        Change(Change),
    }

    impl Arbitrary for Step {
        fn arbitrary(g: &mut Gen) -> Step {
            match u8::arbitrary(g) % 4 {
                0 => Step::Change(Change::arbitrary(g)),
                _ => Step::Read(Drawn::arbitrary(g), usize::arbitrary(g) % 3),
            }
        }
    }

    /// [`world`] plus a token bound to `10.0.0.0/8`, a KV mount in `ns1` with a value and a
    /// token of `ns1`: tokens 6 and 7.
    fn wider_world() -> (Node<MemStorage>, Vec<String>) {
        let (mut n, mut tokens) = world();
        put(
            &mut n,
            "auth/token/roles/bound",
            json!({"allowed_policies": ["reader"], "token_bound_cidrs": ["10.0.0.0/8"]}),
        );
        tokens.push(token_at(
            &mut n,
            "auth/token/create/bound",
            json!({"policies": ["reader"]}),
        ));
        let in_ns = |path: &str, body: Value| {
            let mut r = Request::new(9_001, Method::Put, path)
                .with_token(ROOT)
                .with_json(body);
            r.namespace = Some("ns1".into());
            r
        };
        for (path, body) in [
            ("sys/mounts/secret", json!({"type": "kv"})),
            ("secret/a", json!({"v": 4})),
            (
                "sys/policies/acl/reader",
                json!({"policy": "path \"secret/*\" { capabilities = [\"read\", \"list\"] }"}),
            ),
        ] {
            let r = call(&mut n, in_ns(path, body));
            assert!(r.status < 300, "ns1/{path}: {} {:?}", r.status, r.body);
        }
        let r = call(
            &mut n,
            in_ns("auth/token/create", json!({"policies": ["reader"]})),
        );
        let t = r
            .body
            .as_ref()
            .and_then(|b| b["auth"]["client_token"].as_str());
        tokens.push(
            t.unwrap_or_else(|| panic!("no ns1 token: {:?}", r.body))
                .to_string(),
        );
        (n, tokens)
    }

    fn token_at(n: &mut Node<MemStorage>, path: &str, body: Value) -> String {
        let v = put(n, path, body);
        v["auth"]["client_token"]
            .as_str()
            .unwrap_or_else(|| panic!("no token in {v}"))
            .to_string()
    }

    /// Runs `change` as root (refusals included: a change may no longer apply).
    fn change(n: &mut Node<MemStorage>, tokens: &[String], c: Change, now: &mut Millis) {
        let req = |m: Method, path: &str, body: Value| {
            Request::new(9_500, m, path)
                .with_token(ROOT)
                .with_json(body)
        };
        let r = match c {
            Change::RevokeReader => req(
                Method::Put,
                "auth/token/revoke",
                json!({"token": tokens[1]}),
            ),
            Change::DeletePolicy => req(Method::Delete, "sys/policies/acl/reader", json!({})),
            Change::DenyPolicy => req(
                Method::Put,
                "sys/policies/acl/reader",
                json!({"policy": "path \"secret/*\" { capabilities = [\"deny\"] }\n\
                       path \"kv2/*\" { capabilities = [\"deny\"] }"}),
            ),
            Change::DisableSecret => req(Method::Delete, "sys/mounts/secret", json!({})),
            Change::RemountKv2 => req(
                Method::Put,
                "sys/remount",
                json!({"from": "kv2", "to": "kv9"}),
            ),
            Change::TuneKv2MaxVersions => {
                req(Method::Put, "kv2/config", json!({"max_versions": 1}))
            }
            Change::DeleteKv2 => req(Method::Delete, "kv2/data/c", json!({})),
            Change::DestroyKv2 => req(Method::Put, "kv2/destroy/c", json!({"versions": [1]})),
            Change::WriteKv2Cas => req(
                Method::Put,
                "kv2/data/c",
                json!({"options": {"cas": 1}, "data": {"v": 5}}),
            ),
            Change::DeleteNamespace => req(Method::Delete, "sys/namespaces/ns1", json!({})),
            Change::WaitTwoSeconds => {
                *now += 2_000;
                return;
            }
        };
        n.handle(*now, Input::Request(r));
        while n.poll_output().is_some() {}
    }

    /// As [`the_reader_answers_as_the_node_or_not_at_all`], with the state changed between
    /// reads (tokens revoked or expired, policies changed or deleted, mounts disabled,
    /// moved or tuned, versions deleted or destroyed, a namespace deleted), from addresses inside and outside a token's bound CIDR blocks.
    #[test]
    fn the_reader_answers_as_the_node_or_not_at_all_as_the_state_changes() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static ANSWERED: AtomicUsize = AtomicUsize::new(0);
        fn prop(steps: Vec<Step>) -> bool {
            let (mut n, tokens) = wider_world();
            let mut now = NOW;
            for (i, s) in steps.iter().enumerate() {
                let (d, addr) = match s {
                    Step::Change(c) => {
                        change(&mut n, &tokens, *c, &mut now);
                        continue;
                    }
                    Step::Read(d, addr) => (d, *addr),
                };
                let path = match d.path {
                    "kv2/data/c" if addr == 2 => "kv9/data/c",
                    p => p,
                };
                let mut req = d.request(100 + i as u64, path, tokens.get(d.token + (addr % 2) * 6));
                req.remote_addr = ["10.1.2.3:4000", "192.168.0.9:4000", ""][addr].into();
                if agree(&mut n, req, now) {
                    ANSWERED.fetch_add(1, Ordering::Relaxed);
                }
            }
            true
        }
        QuickCheck::new()
            .tests(200)
            .quickcheck(prop as fn(Vec<Step>) -> bool);
        assert!(
            ANSWERED.load(Ordering::Relaxed) > 0,
            "no drawn request was answered beside the node: the property checked nothing"
        );
    }

    /// Whatever is asked, the reader either hands the request back or answers exactly as
    /// the node does from the same state.
    #[test]
    fn the_reader_answers_as_the_node_or_not_at_all() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static ANSWERED: AtomicUsize = AtomicUsize::new(0);
        fn prop(reqs: Vec<Drawn>) -> bool {
            let (mut n, tokens) = world();
            for (i, d) in reqs.iter().enumerate() {
                let req = d.request(100 + i as u64, d.path, tokens.get(d.token));
                if agree(&mut n, req, NOW) {
                    ANSWERED.fetch_add(1, Ordering::Relaxed);
                }
            }
            true
        }
        QuickCheck::new()
            .tests(150)
            .quickcheck(prop as fn(Vec<Drawn>) -> bool);
        assert!(
            ANSWERED.load(Ordering::Relaxed) > 0,
            "no drawn request was answered beside the node: the property checked nothing"
        );
    }
}
