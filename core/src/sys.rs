//! `sys/*` endpoints that need no node-level state: policies, capabilities and the barrier
//! key's status.
//! (Seal, init and health live in `node`, which owns the barrier.)

use crate::api::{body_object, ApiError, ApiResult, Fields, Method, Reply, Request};
use crate::ctx::Ctx;
use crate::policy::{self, Acl, Policy};
use crate::token::Caller;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// Storage prefix of policies (replicated class).
pub const POLICY: &str = "sys/policy/";
/// Largest accepted policy document.
pub const MAX_POLICY_BYTES: usize = 256 * 1024;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredPolicy {
    pub name: String,
    pub policy: String,
}

/// The policy of response-wrapping tokens (built in, never stored).
const RESPONSE_WRAPPING_NAME: &str = "response-wrapping";

const RESPONSE_WRAPPING: &str = r#"
path "sys/wrapping/unwrap" { capabilities = ["update"] }
path "sys/wrapping/lookup" { capabilities = ["update"] }
"#;

/// Storage key of policy `name` of namespace `ns` (`""`: root).
pub fn policy_key(ns: &str, name: &str) -> String {
    if ns.is_empty() {
        format!("{POLICY}{name}")
    } else {
        format!("{}{ns}{name}", crate::namespace::POLICY_PREFIX)
    }
}

/// Loads a policy by name (built-ins included); `None` for an unknown name.
pub fn load_policy(ctx: &Ctx, name: &str) -> ApiResult<Option<Policy>> {
    load_policy_in(ctx, "", name)
}

/// [`load_policy`] in namespace `ns`.
pub fn load_policy_in(ctx: &Ctx, ns: &str, name: &str) -> ApiResult<Option<Policy>> {
    // Built in and never stored (a copy stored before writes of it were refused is ignored).
    if name == RESPONSE_WRAPPING_NAME {
        return Ok(Policy::parse_cached(RESPONSE_WRAPPING).ok());
    }
    if let Some(sp) = ctx.get_json::<StoredPolicy>(&policy_key(ns, name))? {
        return Ok(Policy::parse_cached(&sp.policy).ok());
    }
    Ok(match name {
        "default" => Policy::parse_cached(policy::DEFAULT_POLICY).ok(),
        _ => None,
    })
}

/// The ACL of a set of policy names.
pub fn acl_for(ctx: &Ctx, names: &[String]) -> ApiResult<Acl> {
    acl_for_in(ctx, "", names)
}

/// The ACL of a set of policy names of namespace `ns` (paths relative to `ns`).
pub fn acl_for_in(ctx: &Ctx, ns: &str, names: &[String]) -> ApiResult<Acl> {
    let root = names.iter().any(|n| n == "root");
    let mut ps = Vec::new();
    for n in names {
        if let Some(p) = load_policy_in(ctx, ns, n)? {
            ps.push(p);
        }
    }
    Ok(Acl::new(ps.iter(), root))
}

fn policy_names(ctx: &Ctx, ns: &str) -> ApiResult<Vec<String>> {
    let prefix = policy_key(ns, "");
    let mut names: Vec<String> = ctx
        .list(&prefix)?
        .into_iter()
        .filter(|n| !n.ends_with('/'))
        .collect();
    for b in ["default", "root"] {
        if !names.iter().any(|n| n == b) {
            names.push(b.into());
        }
    }
    names.sort();
    Ok(names)
}

fn read_policy(ctx: &Ctx, ns: &str, name: &str) -> ApiResult<Option<String>> {
    if let Some(sp) = ctx.get_json::<StoredPolicy>(&policy_key(ns, name))? {
        return Ok(Some(sp.policy));
    }
    Ok(match name {
        "default" => Some(policy::DEFAULT_POLICY.trim().to_string()),
        "root" => Some(String::new()),
        _ => None,
    })
}

/// `sys/policies/acl[/<name>]` (`legacy` = `sys/policy[/<name>]`, which names the text `rules`).
pub fn policies(ctx: &mut Ctx, req: &Request, name: &str, legacy: bool) -> ApiResult {
    let name = name.trim_matches('/').to_lowercase();
    let ns = crate::namespace::of(req);
    match (req.method, name.as_str()) {
        (Method::List, "") | (Method::Get, "") => {
            let names = policy_names(ctx, &ns)?;
            if legacy {
                Ok(Reply::Envelope(
                    json!({"policies": names, "keys": names, "data": {"policies": names, "keys": names}}),
                ))
            } else {
                Ok(Reply::Data(json!({ "keys": names })))
            }
        }
        (Method::Get, n) => {
            let text = read_policy(ctx, &ns, n)?
                .ok_or_else(|| ApiError::NotFound(format!("no policy named {n:?}")))?;
            let field = if legacy { "rules" } else { "policy" };
            let mut d = Map::new();
            d.insert("name".into(), json!(n));
            d.insert(field.into(), json!(text));
            if legacy {
                Ok(Reply::Envelope(
                    json!({"name": n, "rules": text, "data": Value::Object(d)}),
                ))
            } else {
                Ok(Reply::Data(Value::Object(d)))
            }
        }
        (Method::Put | Method::Post, n) => {
            // `response-wrapping` is every wrapping token's policy: a stored one would
            // give each of them its rules (the reference refuses it too).
            if n == "root" || n == RESPONSE_WRAPPING_NAME {
                return Err(ApiError::bad(format!("cannot update {n:?} policy")));
            }
            if !policy::valid_name(n) {
                return Err(ApiError::bad(format!("name: invalid policy name {n:?}")));
            }
            let body = body_object(&req.body)?;
            let f = Fields(&body);
            // An empty text is refused, as in the reference: it would store a policy
            // granting nothing (over an existing one, silently).
            let text = f
                .str("policy")?
                .filter(|t| !t.is_empty())
                .or(f.str("rules")?.filter(|t| !t.is_empty()))
                .ok_or_else(|| ApiError::bad("'policy' parameter not supplied or empty"))?;
            let text = decode_maybe_base64(&text);
            if text.len() > MAX_POLICY_BYTES {
                return Err(ApiError::TooLarge(format!(
                    "policy: larger than {MAX_POLICY_BYTES} bytes"
                )));
            }
            Policy::parse(&text).map_err(|e| ApiError::bad(format!("policy: {e}")))?;
            ctx.put_json(
                &policy_key(&ns, n),
                &StoredPolicy {
                    name: n.into(),
                    policy: text,
                },
            )?;
            Ok(Reply::Empty)
        }
        (Method::Delete, n) => {
            if n == "root" || n == "default" || n == RESPONSE_WRAPPING_NAME {
                return Err(ApiError::bad(format!("cannot delete {n:?} policy")));
            }
            ctx.delete(&policy_key(&ns, n));
            Ok(Reply::Empty)
        }
        _ => Err(ApiError::MethodNotAllowed),
    }
}

fn decode_maybe_base64(text: &str) -> String {
    use base64::Engine;
    if text.contains('{') || text.contains('"') {
        return text.to_string();
    }
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_else(|| text.to_string())
}

/// `sys/capabilities-self`, `sys/capabilities`, `sys/capabilities-accessor`.
pub fn capabilities(
    ctx: &mut Ctx,
    req: &Request,
    which: &str,
    caller: Option<&Caller>,
) -> ApiResult {
    let body = body_object(&req.body)?;
    let f = Fields(&body);
    let paths = match f.list("paths")? {
        Some(p) => p,
        None => vec![f.req_str("path")?],
    };
    let entry = match which {
        "capabilities-self" => caller.ok_or(ApiError::PermissionDenied)?.entry.clone(),
        "capabilities" => {
            let t = f.req_str("token")?;
            crate::token::lookup_in(ctx, &t, &crate::namespace::of(req))?
                .ok_or_else(|| ApiError::bad("invalid token"))?
                .1
        }
        _ => {
            let a = f.req_str("accessor")?;
            let h = crate::token::hash_by_accessor_in(ctx, &a, &crate::namespace::of(req))?
                .ok_or_else(|| ApiError::bad("invalid accessor"))?;
            crate::token::lookup_hash(ctx, &h)?.ok_or_else(|| ApiError::bad("invalid accessor"))?
        }
    };
    let acl = acl_for_in(ctx, &entry.namespace, &entry.policies)?;
    let mut out = Map::new();
    let mut all = Vec::new();
    for p in &paths {
        let p = p.trim_start_matches('/');
        let caps = acl.capabilities(p);
        let names: Vec<&str> = if acl.is_root() {
            vec!["root"]
        } else if caps == 0 {
            vec!["deny"]
        } else {
            policy::cap_names(caps)
        };
        out.insert(p.to_string(), json!(names));
        all.extend(names.iter().map(|s| s.to_string()));
    }
    if paths.len() == 1 {
        out.insert("capabilities".into(), json!(all));
    }
    let mut env = out.clone();
    env.insert("data".into(), Value::Object(out));
    Ok(Reply::Envelope(Value::Object(env)))
}

/// `GET sys/key-status`: the barrier key's term, when it was installed (at initialisation;
/// a cluster initialised before this was recorded reports the epoch) and how many values
/// were encrypted with it since this node unsealed (the reference counts since the key was
/// installed; Cairn keeps no persistent counter).
pub fn key_status(ctx: &Ctx, req: &Request) -> ApiResult {
    if req.method != Method::Get {
        return Err(ApiError::MethodNotAllowed);
    }
    let installed: u64 = ctx
        .get_json(crate::seal::KEY_INSTALL_TIME_KEY)?
        .unwrap_or_default();
    Ok(Reply::Data(json!({
        "term": crate::seal::KEY_TERM,
        "install_time": crate::time::rfc3339(installed),
        "encryptions": ctx.barrier.encryptions(),
    })))
}

#[cfg(test)]
mod tests {
    use crate::api::{Method, Request, Response};
    use crate::node::Node;
    use crate::storage::MemStorage;
    use serde_json::{json, Value};

    fn call(n: &mut Node<MemStorage>, id: u64, tok: &str, m: Method, path: &str) -> Response {
        call_with(n, id, tok, m, path, json!({}), None)
    }

    fn call_with(
        n: &mut Node<MemStorage>,
        id: u64,
        tok: &str,
        m: Method,
        path: &str,
        body: Value,
        wrap: Option<&str>,
    ) -> Response {
        let mut req = Request::new(id, m, path).with_token(tok).with_json(body);
        req.wrap_ttl = wrap.map(str::to_string);
        crate::node::tests::call(n, 2_000, req)
    }

    /// `response-wrapping` is the policy of every wrapping token: it can be neither written
    /// nor deleted (the reference's rule), in any spelling or through the legacy path, so
    /// whoever may write policies cannot hand every wrapping token new rights. Before, a
    /// stored one was every wrapping token's policy.
    #[test]
    fn the_response_wrapping_policy_is_neither_written_nor_deleted() {
        let mut n = Node::dev_in_memory([4; 32], "root");
        let all = r#"path "*" { capabilities = ["read", "list"] }"#;
        let mut id = 0;
        for path in [
            "sys/policies/acl/response-wrapping",
            "sys/policies/acl/Response-Wrapping",
            "sys/policy/response-wrapping",
        ] {
            id += 1;
            let r = call_with(
                &mut n,
                id,
                "root",
                Method::Put,
                path,
                json!({ "policy": all, "rules": all }),
                None,
            );
            assert_eq!(r.status, 400, "{path}: {:?}", r.body);
            assert_eq!(
                r.body.unwrap()["errors"][0],
                "cannot update \"response-wrapping\" policy"
            );
            id += 1;
            let r = call(&mut n, id, "root", Method::Delete, path);
            assert_eq!(r.status, 400, "{path}: {:?}", r.body);
        }
        // A wrapping token can still only unwrap: it reads nothing.
        let r = call_with(
            &mut n,
            100,
            "root",
            Method::Post,
            "sys/wrapping/wrap",
            json!({ "k": "v" }),
            Some("5m"),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
        let w = r.body.unwrap()["wrap_info"]["token"]
            .as_str()
            .unwrap()
            .to_string();
        let r = call(&mut n, 101, &w, Method::Get, "sys/policies/acl");
        assert_eq!(r.status, 403, "{:?}", r.body);
    }
    /// An empty policy text is refused on both paths, as in the reference, and an existing
    /// policy is left as it was. Before, `{"policy": ""}` stored (or overwrote with) a
    /// policy granting nothing.
    #[test]
    fn an_empty_policy_is_refused_and_replaces_nothing() {
        let mut n = Node::dev_in_memory([6; 32], "root");
        let rules = r#"path "secret/*" { capabilities = ["read"] }"#;
        let r = call_with(
            &mut n,
            1,
            "root",
            Method::Put,
            "sys/policies/acl/p",
            json!({ "policy": rules }),
            None,
        );
        assert_eq!(r.status, 204, "{:?}", r.body);
        let mut id = 1;
        for (path, body) in [
            ("sys/policies/acl/p", json!({ "policy": "" })),
            ("sys/policies/acl/p", json!({})),
            ("sys/policy/p", json!({ "rules": "" })),
            ("sys/policy/p", json!({ "policy": "", "rules": "" })),
            ("sys/policies/acl/new", json!({ "policy": "" })),
        ] {
            id += 1;
            let r = call_with(&mut n, id, "root", Method::Put, path, body.clone(), None);
            assert_eq!(r.status, 400, "{path} {body}: {:?}", r.body);
            assert_eq!(
                r.body.unwrap()["errors"][0],
                "'policy' parameter not supplied or empty"
            );
        }
        let r = call(&mut n, 50, "root", Method::Get, "sys/policies/acl/p");
        assert_eq!(r.body.unwrap()["data"]["policy"], rules);
        let r = call(&mut n, 51, "root", Method::Get, "sys/policies/acl/new");
        assert_eq!(r.status, 404, "{:?}", r.body);
    }
}
