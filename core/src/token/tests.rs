//! The token store's functions over an in-memory storage, and the `auth/token/*` rules
//! driven through a whole node (no I/O).

use super::*;
use crate::node::{Input, Node, Output};
use crate::storage::MemStorage;
use crate::Response;

struct T {
    node: Node<MemStorage>,
    root: String,
    next_id: u64,
    now: Millis,
}

const HOUR: Millis = 3_600_000;

impl T {
    fn new() -> T {
        let root = "token-tests-root".to_string();
        let node = Node::dev_in_memory([9; 32], &root);
        T {
            node,
            root,
            next_id: 0,
            now: 2_000,
        }
    }

    fn call(&mut self, token: &str, method: Method, path: &str, body: Value) -> Response {
        self.next_id += 1;
        let id = self.next_id;
        let req = Request::new(id, method, path)
            .with_token(token)
            .with_json(body);
        self.node.handle(self.now, Input::Request(req));
        while let Some(o) = self.node.poll_output() {
            if let Output::Response(r) = o {
                if r.id == id {
                    return r;
                }
            }
        }
        panic!("no response for {path}");
    }

    fn create(&mut self, token: &str, body: Value) -> Response {
        self.call(token, Method::Post, "auth/token/create", body)
    }

    /// A token whose only policy grants `caps` on `auth/token/*`.
    fn token_with(&mut self, name: &str, caps: &str) -> String {
        let root = self.root.clone();
        let pol = format!(r#"path "auth/token/*" {{ capabilities = [{caps}] }}"#);
        let r = self.call(
            &root,
            Method::Put,
            &format!("sys/policies/acl/{name}"),
            json!({ "policy": pol }),
        );
        assert_eq!(r.status, 204, "{:?}", r.body);
        let r = self.create(&root, json!({ "policies": [name], "ttl": "2h" }));
        assert_eq!(r.status, 200, "{:?}", r.body);
        client_token(&r)
    }

    fn plain(&mut self) -> String {
        self.token_with("plain", r#""create", "update", "read""#)
    }

    fn sudo(&mut self) -> String {
        self.token_with("sudoer", r#""create", "update", "read", "sudo""#)
    }

    fn lookup_self(&mut self, token: &str) -> Value {
        let r = self.call(token, Method::Get, "auth/token/lookup-self", json!({}));
        assert_eq!(r.status, 200, "{:?}", r.body);
        r.body.unwrap()["data"].clone()
    }
}

fn client_token(r: &Response) -> String {
    r.body.as_ref().unwrap()["auth"]["client_token"]
        .as_str()
        .unwrap()
        .to_string()
}

fn auth(r: &Response) -> Value {
    r.body.as_ref().unwrap()["auth"].clone()
}

fn error(r: &Response) -> String {
    r.body.as_ref().unwrap()["errors"][0]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn no_parent_needs_root_or_sudo() {
    let mut t = T::new();
    let plain = t.plain();
    let r = t.create(&plain, json!({ "no_parent": true }));
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(
        error(&r),
        "no_parent: root or sudo privileges required to create orphan token"
    );
    // A plain child is fine.
    let r = t.create(&plain, json!({}));
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(auth(&r)["orphan"], false);
    // Sudo on the path is enough.
    let sudo = t.sudo();
    let r = t.create(&sudo, json!({ "no_parent": true }));
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(auth(&r)["orphan"], true);
    // Root, on both endpoints.
    let root = t.root.clone();
    let r = t.create(&root, json!({ "no_parent": true }));
    assert_eq!(auth(&r)["orphan"], true);
    let r = t.call(&root, Method::Post, "auth/token/create-orphan", json!({}));
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(auth(&r)["orphan"], true);
}

#[test]
fn periodic_tokens_need_root_or_sudo() {
    let mut t = T::new();
    let plain = t.plain();
    for period in [json!("87600h"), json!("1h"), json!(60)] {
        let r = t.create(&plain, json!({ "period": period }));
        assert_eq!(r.status, 400, "{period}: {:?}", r.body);
        assert_eq!(
            error(&r),
            "period: root or sudo privileges required to create periodic token"
        );
    }
    // Nothing was stored for the refused requests: the plain token has no children.
    let sudo = t.sudo();
    let r = t.create(&sudo, json!({ "period": "2h" }));
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(auth(&r)["lease_duration"], 7200);
    let root = t.root.clone();
    let r = t.create(&root, json!({ "period": "30m" }));
    assert_eq!(auth(&r)["lease_duration"], 1800);
    // A periodic root token expires with its period (it is not forever).
    let id = client_token(&r);
    assert_eq!(t.lookup_self(&id)["period"], 1800);
    t.now += HOUR;
    t.node.handle(t.now, Input::Tick);
    let r = t.call(&id, Method::Get, "auth/token/lookup-self", json!({}));
    assert_eq!(r.status, 403);
}

#[test]
fn ttl_and_explicit_max_ttl_are_capped_without_sudo() {
    let mut t = T::new();
    let plain = t.plain();
    let r = t.create(
        &plain,
        json!({ "ttl": "87600h", "explicit_max_ttl": "87600h" }),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(auth(&r)["lease_duration"], MAX_TTL);
    let warnings = r.body.as_ref().unwrap()["warnings"].clone();
    assert_eq!(
        warnings,
        json!([
            "ttl of 315360000s exceeded the effective max_ttl of 2764800s; ttl value is capped accordingly",
            "explicit_max_ttl of 315360000s exceeded the effective max_ttl of 2764800s; explicit_max_ttl value is capped accordingly",
        ])
    );
    let id = client_token(&r);
    assert_eq!(t.lookup_self(&id)["explicit_max_ttl"], MAX_TTL);
    // Sudo keeps the explicit max it asked for; the TTL is capped for everyone.
    let sudo = t.sudo();
    let r = t.create(
        &sudo,
        json!({ "ttl": "87600h", "explicit_max_ttl": "87600h" }),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(auth(&r)["lease_duration"], MAX_TTL);
    let id = client_token(&r);
    assert_eq!(t.lookup_self(&id)["explicit_max_ttl"], 87_600 * 3600);
    // Within the limits, no warnings.
    let r = t.create(&plain, json!({ "ttl": "1h" }));
    assert_eq!(r.body.as_ref().unwrap()["warnings"], Value::Null);
}

#[test]
fn explicit_max_ttl_bounds_periodic_tokens_on_create_and_renew() {
    let mut t = T::new();
    let root = t.root.clone();
    let created = t.now;
    let r = t.create(
        &root,
        json!({ "policies": ["default"], "period": "1h", "explicit_max_ttl": "45m" }),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(auth(&r)["lease_duration"], 45 * 60);
    let id = client_token(&r);
    let cap = rfc3339(created + 45 * 60_000);
    assert_eq!(t.lookup_self(&id)["expire_time"], json!(cap));
    // A renewal half an hour later would give an hour more: held at the cap.
    t.now += HOUR / 2;
    let r = t.call(&id, Method::Post, "auth/token/renew-self", json!({}));
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(auth(&r)["lease_duration"], 15 * 60);
    assert_eq!(t.lookup_self(&id)["expire_time"], json!(cap));
    // Renewed by another token, the same.
    let r = t.call(
        &root,
        Method::Post,
        "auth/token/renew",
        json!({ "token": id, "increment": "10h" }),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(t.lookup_self(&id)["expire_time"], json!(cap));
    // Past the cap it is gone.
    t.now = created + 45 * 60_000 + 1;
    t.node.handle(t.now, Input::Tick);
    let r = t.call(&id, Method::Get, "auth/token/lookup-self", json!({}));
    assert_eq!(r.status, 403);
}

#[test]
fn huge_durations_are_refused_naming_the_field() {
    let mut t = T::new();
    let root = t.root.clone();
    for field in ["period", "ttl", "explicit_max_ttl"] {
        for v in [
            json!("9999999999999999s"),
            json!(u64::MAX),
            json!("18446744073709551615"),
            json!("876001h"),
        ] {
            let r = t.create(&root, json!({ field: v }));
            assert_eq!(r.status, 400, "{field} {v}: {:?}", r.body);
            let e = error(&r);
            assert!(
                e.starts_with(&format!("{field}: invalid duration")) && e.contains("100 years"),
                "{field} {v}: {e}"
            );
        }
    }
    // The largest accepted values do not overflow either.
    let r = t.create(
        &root,
        json!({ "period": "876000h", "explicit_max_ttl": "876000h" }),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    let id = client_token(&r);
    for inc in [json!("9999999999999999s"), json!(u64::MAX)] {
        let r = t.call(
            &id,
            Method::Post,
            "auth/token/renew-self",
            json!({ "increment": inc }),
        );
        assert_eq!(r.status, 400, "{inc}: {:?}", r.body);
        assert!(error(&r).starts_with("increment: "), "{}", error(&r));
    }
    let r = t.call(&id, Method::Post, "auth/token/renew-self", json!({}));
    assert_eq!(r.status, 200, "{:?}", r.body);
}

#[test]
fn expiry_arithmetic_is_checked() {
    assert_eq!(after(1_000, 2, "ttl"), Ok(3_000));
    let e = after(u64::MAX - 10, 1, "period").unwrap_err();
    assert_eq!(e, ApiError::bad("period: duration too long"));
    let e = after(0, u64::MAX, "ttl").unwrap_err();
    assert_eq!(e.status(), 400);
    assert_eq!(ceiling(5, u64::MAX), u64::MAX);
    assert_eq!(ceiling(5, 1), 1_005);
}

/// The store's functions directly, in one write set over an in-memory storage.
mod store {
    use super::super::*;
    use crate::seal::Barrier;
    use crate::storage::{MemStorage, Txn};
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    const T0: Millis = 1_700_000_000_000;

    struct Parts {
        storage: MemStorage,
        barrier: Barrier,
        rng: ChaCha20Rng,
    }

    fn parts(seed: u64) -> Parts {
        let mut barrier = Barrier::default();
        barrier.unseal_with([7; 32]);
        Parts {
            storage: MemStorage::new(),
            barrier,
            rng: ChaCha20Rng::seed_from_u64(seed),
        }
    }

    fn ctx(p: &mut Parts) -> Ctx<'_> {
        Ctx {
            txn: Txn::new(&p.storage),
            barrier: &p.barrier,
            rng: &mut p.rng,
            now: T0,
        }
    }

    fn new(policies: &[&str], ttl: Option<u64>) -> NewToken {
        NewToken {
            policies: policies.iter().map(|p| p.to_string()).collect(),
            ttl,
            renewable: true,
            ..Default::default()
        }
    }

    fn child_of(parent: &str, ttl: u64) -> NewToken {
        NewToken {
            parent: Some(parent.to_string()),
            ..new(&["default"], Some(ttl))
        }
    }

    #[test]
    fn policies_are_sorted_unique_with_default_unless_root() {
        let v = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            normalize_policies(v(&["b", "a", "b"]), true),
            v(&["a", "b", "default"])
        );
        assert_eq!(normalize_policies(v(&["b", "a"]), false), v(&["a", "b"]));
        assert_eq!(
            normalize_policies(v(&["default", "x"]), true),
            v(&["default", "x"])
        );
        assert_eq!(normalize_policies(v(&["root"]), true), v(&["root"]));
        assert_eq!(normalize_policies(v(&[]), true), v(&["default"]));
        assert_eq!(normalize_policies(v(&[]), false), Vec::<String>::new());
    }

    #[test]
    fn hashes_are_salted_stable_and_distinct() {
        let mut p = parts(1);
        let mut c = ctx(&mut p);
        let a = hash(&mut c, "cs.one").unwrap();
        assert_eq!(a.len(), 64, "{a}");
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()), "{a}");
        assert_eq!(hash(&mut c, "cs.one").unwrap(), a, "the salt is kept");
        assert_ne!(hash(&mut c, "cs.two").unwrap(), a);
        assert!(c.get(SALT_KEY).unwrap().is_some(), "the salt is stored");
        // Another store draws another salt: the same token hashes differently there.
        let mut q = parts(2);
        let mut d = ctx(&mut q);
        assert_ne!(hash(&mut d, "cs.one").unwrap(), a);
    }

    #[test]
    fn create_stores_the_entry_accessor_and_expiry_index() {
        let mut p = parts(3);
        let mut c = ctx(&mut p);
        let (id, e) = create(&mut c, new(&["default", "dev"], Some(60))).unwrap();
        assert!(id.starts_with("cs.") && id.len() == 27, "{id}");
        assert_eq!(e.ttl, 60);
        assert_eq!(e.expire_time, Some(T0 + 60_000));
        assert_eq!(e.creation_time, T0);
        assert!(e.orphan && e.parent.is_none(), "no parent: an orphan");
        assert_eq!(e.kind, "service");
        assert!(e.renewable);
        let (h, found) = lookup(&mut c, &id).unwrap().expect("stored");
        assert_eq!(found, e);
        assert_eq!(hash_by_accessor(&c, &e.accessor).unwrap(), Some(h.clone()));
        assert_eq!(c.keys(EXPIRY).unwrap(), vec![expiry_key(T0 + 60_000, &h)]);
        // Another token gets another id and accessor.
        let (id2, e2) = create(&mut c, new(&["default"], Some(60))).unwrap();
        assert_ne!(id2, id);
        assert_ne!(e2.accessor, e.accessor);
    }

    #[test]
    fn a_chosen_id_is_refused_when_taken() {
        let mut p = parts(4);
        let mut c = ctx(&mut p);
        let req = NewToken {
            id: Some("my-token".into()),
            ..new(&["default"], Some(60))
        };
        let (id, _) = create(&mut c, req.clone()).unwrap();
        assert_eq!(id, "my-token");
        let e = create(&mut c, req).unwrap_err();
        assert_eq!(e, ApiError::bad("id: a token with this id already exists"));
    }

    #[test]
    fn too_many_policies_are_refused() {
        let mut p = parts(5);
        let mut c = ctx(&mut p);
        let names: Vec<String> = (0..=MAX_POLICIES).map(|i| format!("p{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let e = create(&mut c, new(&refs, None)).unwrap_err();
        assert_eq!(e.status(), 400);
        assert!(e.to_string().contains("at most 256 policies"), "{e}");
        assert!(create(&mut c, new(&refs[..MAX_POLICIES], None)).is_ok());
    }

    #[test]
    fn lifetimes_on_create() {
        let mut p = parts(6);
        let mut c = ctx(&mut p);
        // A root token asked for no lifetime never expires (and so is not renewable).
        let (_, e) = create(&mut c, new(&["root"], None)).unwrap();
        assert_eq!((e.ttl, e.expire_time, e.renewable), (0, None, false));
        // Others get the default TTL, capped at the maximum.
        let (_, e) = create(&mut c, new(&["default"], None)).unwrap();
        assert_eq!(e.ttl, DEFAULT_TTL);
        let (_, e) = create(&mut c, new(&["default"], Some(MAX_TTL * 2))).unwrap();
        assert_eq!(e.ttl, MAX_TTL);
        // A zero TTL is the default, not "never".
        let (_, e) = create(&mut c, new(&["default"], Some(0))).unwrap();
        assert_eq!(e.ttl, DEFAULT_TTL);
        // A period is the TTL; an explicit max caps it, periodic or not.
        let periodic = NewToken {
            period: 120,
            ..new(&["default"], Some(10))
        };
        let (_, e) = create(&mut c, periodic.clone()).unwrap();
        assert_eq!(e.ttl, 120);
        let capped = NewToken {
            explicit_max_ttl: 30,
            ..periodic
        };
        let (_, e) = create(&mut c, capped).unwrap();
        assert_eq!((e.ttl, e.expire_time), (30, Some(T0 + 30_000)));
        // A root token with an explicit max does expire.
        let root_capped = NewToken {
            explicit_max_ttl: 90,
            ..new(&["root"], None)
        };
        let (_, e) = create(&mut c, root_capped).unwrap();
        assert_eq!(e.ttl, 90);
    }

    #[test]
    fn expired_tokens_are_absent_and_swept_in_expiry_order_within_the_limit() {
        let mut p = parts(7);
        let mut c = ctx(&mut p);
        let mut ids = Vec::new();
        for ttl in [30, 10, 20] {
            ids.push(create(&mut c, new(&["default"], Some(ttl))).unwrap().0);
        }
        let accessors: Vec<String> = ids
            .iter()
            .map(|id| lookup(&mut c, id).unwrap().unwrap().1.accessor)
            .collect();
        // 15 s later the 10 s token is gone for lookups even before the sweep.
        c.now = T0 + 15_000;
        assert!(lookup(&mut c, &ids[1]).unwrap().is_none());
        assert!(lookup(&mut c, &ids[0]).unwrap().is_some());
        // The sweep revokes only what expired.
        assert_eq!(expire(&mut c, 10).unwrap(), 1);
        assert!(hash_by_accessor(&c, &accessors[1]).unwrap().is_none());
        assert!(hash_by_accessor(&c, &accessors[2]).unwrap().is_some());
        assert_eq!(expire(&mut c, 10).unwrap(), 0);
        // Later both others expired; the limit bounds one sweep, in expiry order.
        c.now = T0 + 31_000;
        assert_eq!(expire(&mut c, 1).unwrap(), 1);
        assert!(
            hash_by_accessor(&c, &accessors[2]).unwrap().is_none(),
            "20 s first"
        );
        assert!(hash_by_accessor(&c, &accessors[0]).unwrap().is_some());
        assert_eq!(expire(&mut c, 1).unwrap(), 1);
        assert!(hash_by_accessor(&c, &accessors[0]).unwrap().is_none());
        assert!(c.keys(EXPIRY).unwrap().is_empty());
        assert!(c.keys(ID).unwrap().is_empty());
    }

    #[test]
    fn revoking_a_tree_revokes_every_descendant_and_nothing_else() {
        let mut p = parts(8);
        let mut c = ctx(&mut p);
        let (parent, _) = create(&mut c, new(&["default"], Some(600))).unwrap();
        let ph = hash(&mut c, &parent).unwrap();
        let (child, ce) = create(&mut c, child_of(&ph, 600)).unwrap();
        assert!(!ce.orphan && ce.parent.as_deref() == Some(ph.as_str()));
        let chh = hash(&mut c, &child).unwrap();
        let (grandchild, _) = create(&mut c, child_of(&chh, 600)).unwrap();
        let (other, _) = create(&mut c, new(&["default"], Some(600))).unwrap();
        revoke_tree(&mut c, &ph).unwrap();
        for id in [&parent, &child, &grandchild] {
            assert!(lookup(&mut c, id).unwrap().is_none(), "{id} survived");
        }
        assert!(lookup(&mut c, &other).unwrap().is_some());
        assert!(c.keys(PARENT).unwrap().is_empty(), "no parent links left");
        assert_eq!(c.keys(ACCESSOR).unwrap().len(), 1);
        assert_eq!(c.keys(EXPIRY).unwrap().len(), 1);
    }

    #[test]
    fn revoking_an_orphan_keeps_its_children_as_orphans() {
        let mut p = parts(9);
        let mut c = ctx(&mut p);
        let (parent, _) = create(&mut c, new(&["default"], Some(600))).unwrap();
        let ph = hash(&mut c, &parent).unwrap();
        let (child, _) = create(&mut c, child_of(&ph, 600)).unwrap();
        let chh = hash(&mut c, &child).unwrap();
        let (grandchild, _) = create(&mut c, child_of(&chh, 600)).unwrap();
        revoke_orphan(&mut c, &ph).unwrap();
        assert!(lookup(&mut c, &parent).unwrap().is_none());
        let (_, ce) = lookup(&mut c, &child).unwrap().expect("child kept");
        assert!(ce.orphan && ce.parent.is_none(), "{ce:?}");
        // The grandchild still belongs to the child: revoking the child takes it along.
        revoke_tree(&mut c, &chh).unwrap();
        assert!(lookup(&mut c, &grandchild).unwrap().is_none());
    }

    /// A batch child is not orphaned: it goes with its parent (the reference refuses a
    /// batch token whose parent is gone), links and index keys included.
    #[test]
    fn revoking_an_orphan_takes_its_batch_children_along() {
        let mut p = parts(9);
        let mut c = ctx(&mut p);
        let (parent, _) = create(&mut c, new(&["default"], Some(600))).unwrap();
        let ph = hash(&mut c, &parent).unwrap();
        let (service, _) = create(&mut c, child_of(&ph, 600)).unwrap();
        let batch_req = NewToken {
            kind: "batch".into(),
            ..child_of(&ph, 600)
        };
        let (batch, _) = create(&mut c, batch_req).unwrap();
        revoke_orphan(&mut c, &ph).unwrap();
        assert!(
            lookup(&mut c, &batch).unwrap().is_none(),
            "batch child kept"
        );
        assert!(lookup(&mut c, &service).unwrap().is_some());
        assert!(c.keys(PARENT).unwrap().is_empty(), "no parent links left");
        assert_eq!(c.keys(ACCESSOR).unwrap().len(), 1);
        assert_eq!(c.keys(EXPIRY).unwrap().len(), 1);
    }

    #[test]
    fn limited_use_tokens_count_down_and_go_after_the_last_use() {
        let mut p = parts(10);
        let mut c = ctx(&mut p);
        let req = NewToken {
            num_uses: 2,
            ..new(&["default"], Some(600))
        };
        let (id, _) = create(&mut c, req).unwrap();
        let (h, mut e) = lookup(&mut c, &id).unwrap().unwrap();
        use_once(&mut c, &h, &mut e).unwrap();
        assert_eq!(lookup(&mut c, &id).unwrap().unwrap().1.num_uses, 1);
        use_once(&mut c, &h, &mut e).unwrap();
        assert!(
            lookup(&mut c, &id).unwrap().is_none(),
            "revoked after its last use"
        );
        assert!(hash_by_accessor(&c, &e.accessor).unwrap().is_none());
        // 0 is unlimited: nothing changes.
        let (id, _) = create(&mut c, new(&["default"], Some(600))).unwrap();
        let (h, mut e) = lookup(&mut c, &id).unwrap().unwrap();
        for _ in 0..3 {
            use_once(&mut c, &h, &mut e).unwrap();
        }
        assert_eq!(lookup(&mut c, &id).unwrap().unwrap().1.num_uses, 0);
    }

    #[test]
    fn renewal_moves_the_expiry_index_and_respects_the_caps() {
        let mut p = parts(11);
        let mut c = ctx(&mut p);
        let req = NewToken {
            explicit_max_ttl: 3_600,
            ..new(&["default"], Some(600))
        };
        let (id, _) = create(&mut c, req).unwrap();
        let (h, mut e) = lookup(&mut c, &id).unwrap().unwrap();
        c.now = T0 + 60_000;
        renew(&mut c, &h, &mut e, Some(1_200)).unwrap();
        assert_eq!(e.expire_time, Some(T0 + 60_000 + 1_200_000));
        assert_eq!(e.ttl, 1_200);
        // The index holds the new expiry only.
        assert_eq!(
            c.keys(EXPIRY).unwrap(),
            vec![expiry_key(T0 + 60_000 + 1_200_000, &h)]
        );
        // Never past creation + explicit_max_ttl.
        renew(&mut c, &h, &mut e, Some(100_000)).unwrap();
        assert_eq!(e.expire_time, Some(T0 + 3_600_000));
        // A token that may not renew says so.
        let fixed = NewToken {
            renewable: false,
            ..new(&["default"], Some(600))
        };
        let (id, _) = create(&mut c, fixed).unwrap();
        let (h, mut e) = lookup(&mut c, &id).unwrap().unwrap();
        let err = renew(&mut c, &h, &mut e, None).unwrap_err();
        assert_eq!(err, ApiError::bad("lease is not renewable"));
    }

    #[test]
    fn lookups_of_empty_or_oversized_ids_find_nothing() {
        let mut p = parts(12);
        let mut c = ctx(&mut p);
        let long = "x".repeat(513);
        let req = NewToken {
            id: Some(long.clone()),
            ..new(&["default"], Some(60))
        };
        create(&mut c, req).unwrap();
        assert!(lookup(&mut c, "").unwrap().is_none());
        assert!(lookup(&mut c, &long).unwrap().is_none(), "over 512 bytes");
        assert!(lookup(&mut c, "cs.unknown").unwrap().is_none());
    }

    #[test]
    fn namespaces_contain_their_descendants_only() {
        let e = |ns: &str| TokenEntry {
            namespace: ns.into(),
            ..Default::default()
        };
        assert!(within(&e(""), ""));
        assert!(within(&e("a/"), ""));
        assert!(within(&e("a/"), "a/"));
        assert!(within(&e("a/b/"), "a/"));
        assert!(!within(&e(""), "a/"));
        assert!(!within(&e("ab/"), "a/"), "a sibling with a longer name");
        assert!(!within(&e("a/"), "a/b/"));
    }

    #[test]
    fn lookup_data_reports_the_remaining_ttl_and_nulls() {
        let mut e = TokenEntry {
            accessor: "acc".into(),
            policies: vec!["default".into()],
            creation_time: T0,
            ttl: 600,
            expire_time: Some(T0 + 600_000),
            ..Default::default()
        };
        let d = lookup_data(&e, Some("cs.x"), T0 + 100_500);
        assert_eq!(d["ttl"], 499);
        assert_eq!(d["creation_ttl"], 600);
        assert_eq!(d["creation_time"], T0 / 1000);
        assert_eq!(d["id"], "cs.x");
        assert_eq!(d["meta"], Value::Null);
        assert_eq!(d["period"], Value::Null);
        assert_eq!(d["expire_time"], json!(rfc3339(T0 + 600_000)));
        // Past expiry the remaining TTL is 0, not a wrapped-around number; no id: "".
        assert_eq!(lookup_data(&e, None, T0 + 700_000)["ttl"], 0);
        assert_eq!(lookup_data(&e, None, T0)["id"], "");
        e.period = 60;
        e.meta.insert("k".into(), "v".into());
        e.expire_time = None;
        let d = lookup_data(&e, None, T0);
        assert_eq!(d["period"], 60);
        assert_eq!(d["meta"], json!({"k": "v"}));
        assert_eq!(d["expire_time"], Value::Null);
        assert_eq!(d["ttl"], 0);
    }
}

/// Shapes the differential test against the reference checks (tests/tests/differential/).
#[test]
fn answers_are_shaped_like_the_reference() {
    let mut t = T::new();
    let root = t.root.clone();
    // A token without metadata shows `metadata: null` and no identity policies.
    let r = t.create(&root, json!({ "ttl": "1h", "explicit_max_ttl": "2h" }));
    let b = r.body.clone().unwrap();
    assert_eq!(b["auth"]["metadata"], Value::Null);
    assert!(b["auth"].get("identity_policies").is_none(), "{b}");
    let id = b["auth"]["client_token"].as_str().unwrap().to_string();
    // No period key unless periodic; a last renewal only after one.
    let l = t.lookup_self(&id);
    assert!(
        l.get("period").is_none() && l.get("last_renewal").is_none(),
        "{l}"
    );
    // A renewal capped by the explicit max says so in a warning.
    let r = t.call(
        &root,
        Method::Post,
        "auth/token/renew",
        json!({ "token": id, "increment": "10h" }),
    );
    assert_eq!(r.status, 200);
    assert!(r.body.unwrap()["warnings"][0]
        .as_str()
        .unwrap()
        .contains("capped"));
    assert!(t.lookup_self(&id)["last_renewal_time"].is_u64());
    // Lookup of an unknown token is a 403; without a token, of the caller's own.
    let r = t.call(
        &root,
        Method::Post,
        "auth/token/lookup",
        json!({"token": "cs.nope"}),
    );
    assert_eq!(r.status, 403);
    let r = t.call(&root, Method::Post, "auth/token/lookup", json!({}));
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap()["data"]["id"], json!(root));
    // Revoking an unknown accessor: 200 with a warning.
    let r = t.call(
        &root,
        Method::Post,
        "auth/token/revoke-accessor",
        json!({"accessor": "nope"}),
    );
    assert_eq!(r.status, 200);
    assert!(r.body.unwrap()["warnings"].is_array());
    // A `null` body is an empty one (the reference's CLI sends it).
    let r = t.call(&id, Method::Post, "auth/token/renew-self", Value::Null);
    assert_eq!(r.status, 200, "{:?}", r.body);
}

#[test]
fn batch_tokens_are_neither_renewed_nor_revoked_and_types_are_checked() {
    let mut t = T::new();
    let root = t.root.clone();
    let r = t.create(&root, json!({ "type": "weird" }));
    assert_eq!(r.status, 400);
    let r = t.create(&root, json!({ "type": "batch", "period": "1h" }));
    assert_eq!(r.status, 400);
    // A batch token of root's policy is refused (the reference's rule).
    let r = t.create(&root, json!({ "type": "batch", "ttl": "30m" }));
    assert_eq!(r.status, 400);
    assert_eq!(error(&r), "batch tokens cannot be root tokens");
    let r = t.create(
        &root,
        json!({ "type": "batch", "ttl": "30m", "policies": ["default"] }),
    );
    assert_eq!(r.status, 200);
    let b = r.body.unwrap();
    assert_eq!(b["auth"]["token_type"], "batch");
    assert_eq!(b["auth"]["accessor"], "");
    assert_eq!(b["auth"]["renewable"], false);
    let id = b["auth"]["client_token"].as_str().unwrap().to_string();
    assert_eq!(t.lookup_self(&id)["type"], "batch");
    let r = t.call(&id, Method::Post, "auth/token/renew-self", json!({}));
    assert_eq!(r.status, 400);
    let r = t.call(
        &root,
        Method::Post,
        "auth/token/revoke",
        json!({ "token": id }),
    );
    assert_eq!(r.status, 400);
    assert_eq!(t.lookup_self(&id)["type"], "batch");
}

#[test]
fn token_roles_bound_policies_and_set_orphan_and_period() {
    let mut t = T::new();
    let root = t.root.clone();
    let r = t.call(&root, Method::List, "auth/token/roles", json!({}));
    assert_eq!(r.status, 404);
    let r = t.call(
        &root,
        Method::Post,
        "auth/token/roles/r1",
        json!({"allowed_policies": ["reader"], "orphan": true, "token_period": "1h"}),
    );
    assert_eq!(r.status, 204, "{:?}", r.body);
    let r = t.call(&root, Method::Get, "auth/token/roles/r1", json!({}));
    let d = r.body.unwrap()["data"].clone();
    assert_eq!(d["allowed_policies"], json!(["reader"]));
    assert_eq!(d["token_period"], 3600);
    let r = t.call(&root, Method::List, "auth/token/roles", json!({}));
    assert_eq!(r.body.unwrap()["data"]["keys"], json!(["r1"]));
    let r = t.call(
        &root,
        Method::Post,
        "auth/token/create/r1",
        json!({"policies": ["writer"]}),
    );
    assert_eq!(r.status, 400, "outside the role's allowed policies");
    let r = t.call(&root, Method::Post, "auth/token/create/r1", json!({}));
    assert_eq!(r.status, 200, "{:?}", r.body);
    let id = client_token(&r);
    let l = t.lookup_self(&id);
    assert_eq!(l["policies"], json!(["default", "reader"]));
    assert_eq!(
        (l["orphan"].clone(), l["role"].clone()),
        (json!(true), json!("r1"))
    );
    assert_eq!(l["path"], "auth/token/create/r1");
    assert_eq!(l["creation_ttl"], 3600);
    let r = t.call(&root, Method::Post, "auth/token/create/nope", json!({}));
    assert_eq!(r.status, 400);
    let r = t.call(&root, Method::Delete, "auth/token/roles/r1", json!({}));
    assert_eq!(r.status, 204);
    let r = t.call(&root, Method::Get, "auth/token/roles/r1", json!({}));
    assert_eq!(r.status, 404);
}

/// A token created by a token with an entity acts for that entity (its identity policies
/// come along); an orphan (no_parent, create-orphan, an orphan role) has none.
#[test]
fn child_tokens_inherit_the_parents_entity_and_orphans_do_not() {
    use crate::auth::ldap::tests::{authenticated_search, World};
    let mut w = World::new();
    w.configure(authenticated_search());
    let login = w.login("alice", "alicepw");
    let la = auth(&login);
    let parent = la["client_token"].as_str().unwrap_or_default().to_string();
    let eid = la["entity_id"].as_str().unwrap_or_default().to_string();
    assert_eq!(eid.len(), 36, "{la}");
    let pol = r#"path "auth/token/*" { capabilities = ["create", "update", "read", "sudo"] }"#;
    let r = w.admin(
        Method::Put,
        "sys/policies/acl/tok-maker",
        json!({ "policy": pol }),
    );
    assert_eq!(r.status, 204, "{:?}", r.body);
    let r = w.admin(
        Method::Post,
        "identity/group",
        json!({"name": "makers", "policies": ["tok-maker"], "member_entity_ids": [eid]}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    for (role, orphan) in [("kid", false), ("orphans", true)] {
        let r = w.admin(
            Method::Post,
            &format!("auth/token/roles/{role}"),
            json!({ "orphan": orphan }),
        );
        assert_eq!(r.status, 204, "{:?}", r.body);
    }
    let cases = [
        ("auth/token/create", json!({"policies": ["default"]}), true),
        ("auth/token/create", json!({"type": "batch"}), true),
        ("auth/token/create/kid", json!({}), true),
        ("auth/token/create", json!({"no_parent": true}), false),
        ("auth/token/create-orphan", json!({}), false),
        ("auth/token/create/orphans", json!({}), false),
    ];
    for (path, body, inherits) in cases {
        let r = w.call(Method::Post, path, body.clone(), Some(&parent));
        assert_eq!(r.status, 200, "{path} {body}: {:?}", r.body);
        let a = auth(&r);
        let want = if inherits { eid.as_str() } else { "" };
        assert_eq!(a["entity_id"], want, "{path} {body}: {a}");
        assert_eq!(a["orphan"], !inherits, "{path} {body}: {a}");
        if inherits {
            assert_eq!(a["identity_policies"], json!(["tok-maker"]), "{a}");
            // The child's own requests carry the entity's policies.
            let child = a["client_token"].as_str().unwrap_or_default().to_string();
            let l = w.call(
                Method::Get,
                "auth/token/lookup-self",
                json!({}),
                Some(&child),
            );
            assert_eq!(l.status, 200, "{:?}", l.body);
            let d = l
                .body
                .as_ref()
                .map(|b| b["data"].clone())
                .unwrap_or_default();
            assert_eq!(d["entity_id"], eid.as_str(), "{d}");
            assert_eq!(d["identity_policies"], json!(["tok-maker"]), "{d}");
        } else {
            assert!(a.get("identity_policies").is_none(), "{a}");
        }
    }
}

/// A limited-use token creates no tokens (a child, or an orphan through a role, would
/// escape its use count), nor does a batch token: the reference's rules and messages.
/// Before, both created a service token with no use limit.
#[test]
fn limited_use_and_batch_tokens_create_no_tokens() {
    let mut t = T::new();
    let root = t.root.clone();
    let pol = r#"path "auth/token/*" { capabilities = ["create", "update", "read"] }"#;
    let r = t.call(
        &root,
        Method::Put,
        "sys/policies/acl/maker",
        json!({ "policy": pol }),
    );
    assert_eq!(r.status, 204, "{:?}", r.body);
    let r = t.call(
        &root,
        Method::Post,
        "auth/token/roles/orphans",
        json!({ "allowed_policies": ["maker"], "orphan": true }),
    );
    assert!(r.status < 300, "{:?}", r.body);
    let limited = client_token(&t.create(&root, json!({ "policies": ["maker"], "num_uses": 5 })));
    let batch = client_token(&t.create(
        &root,
        json!({ "policies": ["maker"], "type": "batch", "ttl": "1h" }),
    ));
    for (tok, want) in [
        (
            &limited,
            "restricted use token cannot generate child tokens",
        ),
        (&batch, "batch tokens cannot create more tokens"),
    ] {
        for path in ["auth/token/create", "auth/token/create/orphans"] {
            let r = t.call(tok, Method::Post, path, json!({ "policies": ["maker"] }));
            assert_eq!(r.status, 400, "{path}: {:?}", r.body);
            assert_eq!(error(&r), want, "{path}");
        }
    }
    // An unlimited service token of the same policy still may.
    let plain = client_token(&t.create(&root, json!({ "policies": ["maker"] })));
    let r = t.create(&plain, json!({ "policies": ["maker"] }));
    assert_eq!(r.status, 200, "{:?}", r.body);
}
