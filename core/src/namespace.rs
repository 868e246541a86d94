//! Namespaces (`sys/namespaces/<path>`): isolated tenants inside one cluster.
//!
//! A namespace is a record at `core/namespace/<full path>` (replicated class, so it reaches
//! performance and DR secondaries), e.g. `core/namespace/a/` and `core/namespace/a/b/`.
//! A request is routed into a namespace by the `X-Vault-Namespace` / `X-Service-Namespace`
//! header and/or a path prefix (`/v1/ns1/secret/foo`); [`resolve`] turns both into the
//! namespace's full path (`ns1/`, or `""` for the root namespace) and the path inside it.
//!
//! What lives in a namespace is stored under its full path: secrets mounts as `ns1/secret/`
//! in the mount table (with `namespace` = `ns1/`), auth mounts as `ns1/ldap/` (reached as
//! `auth/ldap/` inside the namespace), policies at `sys/ns-policy/ns1/<name>`. So a mount of
//! a namespace is reached from the root namespace by its full path, path filters naming a
//! namespace (`ns1/`) cover every mount under it, and nothing of a namespace is visible from
//! a sibling. Tokens carry the namespace they were created in; their policies are those of
//! that namespace, evaluated against paths relative to it, and they act only in it and below.
//! Deleting a namespace deletes everything in it ([`purge`]).

pub mod purge;

use crate::api::{body_object, ApiError, ApiResult, Method, Reply, Request};
use crate::ctx::Ctx;
use crate::mounts::{self, Table};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// Storage prefix of namespace records.
pub const PREFIX: &str = "core/namespace/";
/// Storage prefix of the policies of non-root namespaces.
pub const POLICY_PREFIX: &str = "sys/ns-policy/";

/// Path segments that can never name a namespace (they are routes of every namespace).
const RESERVED: &[&str] = &["sys", "auth", "root", "cubbyhole", "identity"];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    pub id: String,
    /// Full path with a trailing `/`, e.g. `a/b/`.
    pub path: String,
    #[serde(default)]
    pub custom_metadata: BTreeMap<String, String>,
    /// A UUID shown on reads, as the reference does (empty for namespaces created before).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uuid: String,
}

impl Namespace {
    fn view(&self) -> Value {
        // Cairn never locks or taints a namespace; the reference's flags are shown false.
        json!({
            "id": self.id,
            "path": self.path,
            "custom_metadata": self.custom_metadata,
            "uuid": self.uuid,
            "locked": false,
            "tainted": false,
        })
    }
}

/// The namespace a (routed) request runs in: `""` (root) or a full path like `ns1/`.
pub fn of(req: &Request) -> String {
    normalize(req.namespace.as_deref().unwrap_or("")).unwrap_or_default()
}

/// The path of a namespace below the caller's, relative to it (`a/b/`). A path that names
/// no child (`root`, `/`, blanks) is refused: read, written or deleted through its own
/// `sys/namespaces/`, a namespace would otherwise act on itself — a delete of everything in
/// it by anyone allowed to manage its children.
fn child(p: &str) -> ApiResult<String> {
    let rel = normalize(p)?;
    if rel.is_empty() {
        return Err(ApiError::bad(format!(
            "namespace: {p:?} names no namespace below the current one"
        )));
    }
    Ok(rel)
}

/// `""`, `/`, `root` → root; otherwise `a/b/` (validated segments).
pub fn normalize(ns: &str) -> ApiResult<String> {
    let t = ns.trim().trim_matches('/');
    if t.is_empty() || t == "root" {
        return Ok(String::new());
    }
    for seg in t.split('/') {
        if !valid_segment(seg) {
            return Err(ApiError::bad(format!("namespace: invalid path {ns:?}")));
        }
    }
    Ok(format!("{t}/"))
}

fn valid_segment(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !RESERVED.contains(&s)
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && s != "."
        && s != ".."
}

/// The record of the namespace at full path `full` (`a/b/`).
pub fn get(ctx: &Ctx, full: &str) -> ApiResult<Option<Namespace>> {
    if full.is_empty() {
        return Ok(None);
    }
    ctx.get_json(&format!("{PREFIX}{full}"))
}

/// The namespace a request runs in and the path inside it, from the namespace header and the
/// leading path segments that name child namespaces.
pub fn resolve(ctx: &Ctx, header: Option<&str>, path: &str) -> ApiResult<(String, String)> {
    let mut ns = normalize(header.unwrap_or(""))?;
    // Replication endpoints answer for themselves (root namespace only, status anywhere).
    if !ns.is_empty() && !path.starts_with("sys/replication/") && get(ctx, &ns)?.is_none() {
        return Err(ApiError::NotFound(format!(
            "namespace {ns:?} does not exist"
        )));
    }
    let mut rest = path;
    while let Some((seg, tail)) = rest.split_once('/') {
        if !valid_segment(seg) {
            break;
        }
        let cand = format!("{ns}{seg}/");
        if get(ctx, &cand)?.is_none() {
            break;
        }
        ns = cand;
        rest = tail;
    }
    Ok((ns, rest.to_string()))
}

/// Direct children of namespace `ns` (full paths).
pub fn children(ctx: &Ctx, ns: &str) -> ApiResult<Vec<Namespace>> {
    let prefix = format!("{PREFIX}{ns}");
    let mut out = Vec::new();
    for k in ctx.keys(&prefix)? {
        let rel = &k[prefix.len()..];
        // Exactly one more segment: `child/`.
        if rel.ends_with('/') && rel.matches('/').count() == 1 {
            if let Some(n) = ctx.get_json::<Namespace>(&k)? {
                out.push(n);
            }
        }
    }
    Ok(out)
}

/// Every namespace (full paths, sorted).
pub fn all_paths(ctx: &Ctx) -> ApiResult<Vec<String>> {
    Ok(ctx
        .keys(PREFIX)?
        .into_iter()
        .map(|k| k[PREFIX.len()..].to_string())
        .collect())
}

/// `sys/namespaces[/<path>]`, relative to the request's namespace.
pub fn handle(ctx: &mut Ctx, req: &Request, tail: &str) -> ApiResult {
    let cur = of(req);
    let rel = tail.trim_matches('/');
    match (req.method, rel) {
        (Method::List | Method::Get, "") => {
            let kids = children(ctx, &cur)?;
            if kids.is_empty() {
                return Err(ApiError::NotFound(String::new()));
            }
            let mut keys = Vec::new();
            let mut info = Map::new();
            for n in kids {
                let k = n.path[cur.len()..].to_string();
                info.insert(k.clone(), n.view());
                keys.push(k);
            }
            Ok(Reply::Data(json!({ "keys": keys, "key_info": info })))
        }
        (Method::Get, p) => {
            let full = format!("{cur}{}", child(p)?);
            match get(ctx, &full)? {
                Some(n) => Ok(Reply::Data(n.view())),
                None => Err(ApiError::NotFound(format!("no namespace at {full:?}"))),
            }
        }
        (Method::Put | Method::Post, p) if !p.is_empty() => {
            let rel = child(p)?;
            let full = format!("{cur}{rel}");
            let body = body_object(&req.body)?;
            let meta: Option<BTreeMap<String, String>> = match body.get("custom_metadata") {
                None | Some(Value::Null) => None,
                Some(v) => Some(serde_json::from_value(v.clone()).map_err(|_| {
                    ApiError::bad("custom_metadata: expected an object of strings")
                })?),
            };
            if let Some(mut n) = get(ctx, &full)? {
                if let Some(m) = meta {
                    n.custom_metadata = m;
                    ctx.put_json(&format!("{PREFIX}{full}"), &n)?;
                }
                return Ok(Reply::Data(n.view()));
            }
            // The parent must exist (nested paths are created one level at a time).
            let parent = match full.trim_end_matches('/').rsplit_once('/') {
                Some((pp, _)) => format!("{pp}/"),
                None => String::new(),
            };
            if !parent.is_empty() && get(ctx, &parent)?.is_none() {
                return Err(ApiError::bad(format!(
                    "parent namespace {parent:?} does not exist; create it first"
                )));
            }
            // A mount at that path in the parent would be shadowed.
            for table in [Table::Secrets, Table::Auth] {
                if let Some(m) = mounts::all(ctx, table)?
                    .into_iter()
                    .find(|m| m.namespace == parent && full.starts_with(&m.path))
                {
                    return Err(ApiError::bad(format!(
                        "path {full:?} is already in use by the mount at {:?}",
                        m.path
                    )));
                }
            }
            // A namespace's id names its identity records and tokens: never reuse one.
            let mut taken = std::collections::BTreeSet::new();
            for path in all_paths(ctx)? {
                if let Some(n) = get(ctx, &path)? {
                    taken.insert(n.id);
                }
            }
            let mut id = crate::crypto::base62(ctx.rng(), 5);
            while taken.contains(&id) {
                id = crate::crypto::base62(ctx.rng(), 5);
            }
            let n = Namespace {
                id,
                path: full.clone(),
                custom_metadata: meta.unwrap_or_default(),
                uuid: crate::crypto::uuid(ctx.rng()),
            };
            ctx.put_json(&format!("{PREFIX}{full}"), &n)?;
            Ok(Reply::Data(n.view()))
        }
        (Method::Delete, p) if !p.is_empty() => {
            let full = format!("{cur}{}", child(p)?);
            let Some(n) = get(ctx, &full)? else {
                // 200 with a warning, as the reference answers.
                return Ok(Reply::Envelope(
                    json!({ "warnings": ["requested namespace does not exist"] }),
                ));
            };
            purge::delete(ctx, &n)?;
            // The reference deletes in the background and answers `in-progress`; here it
            // is done when the answer leaves.
            Ok(Reply::Data(json!({ "status": "deleted" })))
        }
        _ => Err(ApiError::MethodNotAllowed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{Input, Node, Output};
    use crate::storage::MemStorage;
    use crate::Response;

    struct T {
        n: Node<MemStorage>,
        id: u64,
    }

    impl T {
        fn new() -> T {
            let n = Node::dev_in_memory([9; 32], "root");
            T { n, id: 0 }
        }
        fn call(&mut self, ns: &str, tok: &str, m: Method, path: &str, body: Value) -> Response {
            self.id += 1;
            let mut req = Request::new(self.id, m, path)
                .with_token(tok)
                .with_json(body);
            if !ns.is_empty() {
                req.namespace = Some(ns.into());
            }
            self.n.handle(2_000, Input::Request(req));
            while let Some(o) = self.n.poll_output() {
                if let Output::Response(r) = o {
                    if r.id == self.id {
                        return r;
                    }
                }
            }
            panic!("no response to {path}");
        }
        fn ok(&mut self, ns: &str, tok: &str, m: Method, path: &str, body: Value) -> Value {
            let r = self.call(ns, tok, m, path, body);
            assert!(r.status < 300, "{path}: {} {:?}", r.status, r.body);
            r.body.unwrap_or(Value::Null)
        }
    }

    /// A token allowed to manage the child namespaces of `ns1` cannot reach `ns1` itself
    /// through a path that names no child (`root`, `/`, blanks): its delete would take
    /// everything in it.
    #[test]
    fn a_namespace_cannot_be_deleted_or_rewritten_from_inside() {
        let mut t = T::new();
        t.ok("", "root", Method::Post, "sys/namespaces/ns1", json!({}));
        t.ok(
            "ns1",
            "root",
            Method::Put,
            "sys/policies/acl/nsadmin",
            json!({"policy": "path \"sys/namespaces/*\" { capabilities = [\"create\", \"read\", \"update\", \"delete\", \"list\"] }"}),
        );
        let tok = t.ok(
            "ns1",
            "root",
            Method::Post,
            "auth/token/create",
            json!({"policies": ["nsadmin"]}),
        )["auth"]["client_token"]
            .as_str()
            .expect("token")
            .to_string();
        // Its children it manages.
        t.ok("ns1", &tok, Method::Post, "sys/namespaces/kid", json!({}));
        t.ok("ns1", &tok, Method::Delete, "sys/namespaces/kid", json!({}));
        for path in [
            "sys/namespaces/root",
            "sys/namespaces/%20",
            "sys/namespaces/ ",
        ] {
            for m in [Method::Delete, Method::Put, Method::Get] {
                let r = t.call("ns1", &tok, m, path, json!({"custom_metadata": {"x": "y"}}));
                assert!(
                    r.status == 400 || r.status == 405,
                    "{m:?} {path}: {} {:?}",
                    r.status,
                    r.body
                );
            }
        }
        // ns1 is still there, unchanged, and so is the token.
        let g = t.ok("", "root", Method::Get, "sys/namespaces/ns1", json!({}));
        assert_eq!(g["data"]["custom_metadata"], json!({}));
        t.ok(
            "ns1",
            &tok,
            Method::Get,
            "auth/token/lookup-self",
            json!({}),
        );
        // And the root namespace has no record named after itself.
        let r = t.call("", "root", Method::Put, "sys/namespaces/root", json!({}));
        assert_eq!(r.status, 400, "{:?}", r.body);
    }

    #[test]
    fn namespaces_isolate_mounts_policies_and_tokens() {
        let mut t = T::new();
        let c = t.ok("", "root", Method::Post, "sys/namespaces/ns1", json!({}));
        assert_eq!(c["data"]["path"], "ns1/");
        assert_eq!(c["data"]["id"].as_str().unwrap().len(), 5);
        // The reference's fields: a UUID, and the lock and taint flags (never set here).
        assert_eq!(c["data"]["uuid"].as_str().unwrap().len(), 36);
        assert_eq!(
            (&c["data"]["locked"], &c["data"]["tainted"]),
            (&json!(false), &json!(false))
        );
        // Nested: from inside ns1, and from the root by full path.
        t.ok("ns1", "root", Method::Put, "sys/namespaces/kid", json!({}));
        let r = t.call("", "root", Method::Post, "sys/namespaces/x/y", json!({}));
        assert_eq!(r.status, 400, "parent must exist");
        t.ok(
            "",
            "root",
            Method::Post,
            "sys/namespaces/ns2",
            json!({"custom_metadata": {"a": "b"}}),
        );
        let l = t.ok("", "root", Method::List, "sys/namespaces", json!({}));
        assert_eq!(l["data"]["keys"], json!(["ns1/", "ns2/"]));
        assert_eq!(l["data"]["key_info"]["ns2/"]["custom_metadata"]["a"], "b");
        let l = t.ok("ns1/", "root", Method::List, "sys/namespaces", json!({}));
        assert_eq!(l["data"]["keys"], json!(["kid/"]));
        assert_eq!(l["data"]["key_info"]["kid/"]["path"], "ns1/kid/");
        let g = t.ok("", "root", Method::Get, "sys/namespaces/ns1/kid", json!({}));
        assert_eq!(g["data"]["path"], "ns1/kid/");
        // A mount inside ns1 (header form), reached from the root by the full path.
        t.ok(
            "ns1",
            "root",
            Method::Post,
            "sys/mounts/secret",
            json!({"type": "kv"}),
        );
        t.ok("ns1", "root", Method::Put, "secret/a", json!({"v": 1}));
        let v = t.ok("", "root", Method::Get, "ns1/secret/a", json!({}));
        assert_eq!(v["data"]["v"], 1);
        assert_eq!(
            t.call("", "root", Method::Get, "secret/a", json!({}))
                .status,
            404
        );
        assert_eq!(
            t.call("ns2", "root", Method::Get, "secret/a", json!({}))
                .status,
            404
        );
        let m = t.ok("ns1", "root", Method::Get, "sys/mounts", json!({}));
        assert!(m["data"]["secret/"].is_object(), "{m}");
        let root_m = t.ok("", "root", Method::Get, "sys/mounts", json!({}));
        assert!(root_m["data"]["ns1/secret/"].is_null());
        // Policies live in their namespace; a token of ns1 evaluates them relative to ns1.
        let pol = r#"path "secret/*" { capabilities = ["read"] }"#;
        t.ok(
            "ns1",
            "root",
            Method::Put,
            "sys/policies/acl/team",
            json!({"policy": pol}),
        );
        let rl = t.ok("", "root", Method::List, "sys/policies/acl", json!({}));
        assert!(!rl["data"]["keys"].to_string().contains("team"));
        let tok = t.ok(
            "ns1",
            "root",
            Method::Post,
            "auth/token/create",
            json!({"policies": ["team"]}),
        )["auth"]["client_token"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(
            t.ok("ns1", &tok, Method::Get, "secret/a", json!({}))["data"]["v"],
            1
        );
        assert_eq!(
            t.ok("", &tok, Method::Get, "ns1/secret/a", json!({}))["data"]["v"],
            1
        );
        // Not outside its namespace, not in a sibling, not beyond its policies.
        t.ok("", "root", Method::Put, "secret/r", json!({"v": 2}));
        assert_eq!(
            t.call("", &tok, Method::Get, "secret/r", json!({})).status,
            403
        );
        assert_eq!(
            t.call("ns2", &tok, Method::Get, "secret/a", json!({}))
                .status,
            403
        );
        assert_eq!(
            t.call("ns1", &tok, Method::Put, "secret/a", json!({}))
                .status,
            403
        );
        // An unknown namespace is a clear 404.
        let r = t.call("nope", "root", Method::Get, "secret/a", json!({}));
        assert_eq!(r.status, 404);
        // Delete refuses a namespace with child namespaces, and deletes everything else
        // in it ([`purge`]'s tests).
        let r = t.call("", "root", Method::Delete, "sys/namespaces/ns1", json!({}));
        assert_eq!(r.status, 400);
        let e = r.body.unwrap().to_string();
        assert!(e.contains("child namespaces"), "{e}");
        t.ok(
            "ns1",
            "root",
            Method::Delete,
            "sys/namespaces/kid",
            json!({}),
        );
        t.ok("", "root", Method::Delete, "sys/namespaces/ns1", json!({}));
        assert_eq!(
            t.call("", "root", Method::Get, "sys/namespaces/ns1", json!({}))
                .status,
            404
        );
        // Its tokens die with it, even if the path is created again.
        t.ok("", "root", Method::Post, "sys/namespaces/ns1", json!({}));
        assert_eq!(
            t.call("ns1", &tok, Method::Get, "sys/mounts", json!({}))
                .status,
            403
        );
    }

    #[test]
    fn normalize_paths() {
        assert_eq!(normalize("").unwrap(), "");
        assert_eq!(normalize("root").unwrap(), "");
        assert_eq!(normalize("/a/b").unwrap(), "a/b/");
        assert_eq!(normalize("ns1/").unwrap(), "ns1/");
        assert!(normalize("a//b").is_err());
        assert!(normalize("sys").is_err());
        assert!(normalize("a/../b").is_err());
    }
}
