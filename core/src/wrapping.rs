//! Response wrapping: any response can be stored under a single-use wrapping token with a
//! TTL (`X-Service-Wrap-TTL`); `sys/wrapping/unwrap` returns it once, `sys/wrapping/lookup`
//! describes it. Activation tokens for secondaries use this.

use crate::api::{body_object, ApiError, ApiResult, Fields, Reply, Request};
use crate::ctx::Ctx;
use crate::time::rfc3339;
use crate::token::{self, NewToken};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Storage prefix of wrapped responses (cluster-local, like tokens).
pub const RESPONSE: &str = "sys/token/wrapped/";
/// Longest wrap TTL accepted.
pub const MAX_WRAP_TTL: u64 = 768 * 3600;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Wrapped {
    pub status: u16,
    pub body: Option<Value>,
    pub creation_path: String,
    pub creation_time: u64,
    pub ttl: u64,
}

/// Wraps a finished response body; returns the `wrap_info` object.
pub fn wrap(
    ctx: &mut Ctx,
    status: u16,
    body: Option<Value>,
    path: &str,
    ttl: u64,
) -> ApiResult<Value> {
    if ttl == 0 || ttl > MAX_WRAP_TTL {
        return Err(ApiError::bad(format!(
            "wrap ttl must be between 1s and {MAX_WRAP_TTL}s"
        )));
    }
    let wrapped_accessor = body
        .as_ref()
        .and_then(|b| b.pointer("/auth/accessor"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let (id, e) = token::create(
        ctx,
        NewToken {
            policies: vec!["response-wrapping".into()],
            num_uses: 1,
            ttl: Some(ttl),
            explicit_max_ttl: ttl,
            path: path.into(),
            kind: "wrapping".into(),
            display_name: "response-wrapping".into(),
            ..Default::default()
        },
    )?;
    let h = token::hash(ctx, &id)?;
    let w = Wrapped {
        status,
        body,
        creation_path: path.into(),
        creation_time: ctx.now,
        ttl,
    };
    ctx.put_json(&format!("{RESPONSE}{h}"), &w)?;
    let mut info = json!({
        "token": id,
        "accessor": e.accessor,
        "ttl": ttl,
        "creation_time": rfc3339(ctx.now),
        "creation_path": path,
    });
    // Only a wrapped token has an accessor to show (the reference omits the key otherwise).
    if !wrapped_accessor.is_empty() {
        info["wrapped_accessor"] = json!(wrapped_accessor);
    }
    Ok(info)
}

fn wrapping_token(req: &Request) -> ApiResult<String> {
    let body = body_object(&req.body)?;
    match Fields(&body).str("token")? {
        Some(t) if !t.is_empty() => Ok(t),
        _ => req
            .token
            .clone()
            // No token at all: the reference's 403.
            .ok_or_else(|| {
                ApiError::Forbidden("error validating wrapping token: token is empty".into())
            }),
    }
}

fn load(ctx: &mut Ctx, t: &str) -> ApiResult<(String, Wrapped)> {
    let invalid = || ApiError::bad("wrapping token is not valid or does not exist");
    let (h, e) = token::lookup(ctx, t)?.ok_or_else(invalid)?;
    if e.kind != "wrapping" {
        return Err(invalid());
    }
    let w: Wrapped = ctx
        .get_json(&format!("{RESPONSE}{h}"))?
        .ok_or_else(invalid)?;
    Ok((h, w))
}

/// `sys/wrapping/unwrap`: returns the stored response once.
pub fn unwrap(ctx: &mut Ctx, req: &Request) -> ApiResult {
    let t = wrapping_token(req)?;
    let (h, w) = load(ctx, &t)?;
    token::revoke_tree(ctx, &h)?;
    match w.body {
        None => Ok(Reply::Empty),
        Some(b) => Ok(Reply::Envelope(b)),
    }
}

/// `sys/wrapping/rewrap`: the same response under a new wrapping token (same TTL and
/// creation path); the old token stops working.
pub fn rewrap(ctx: &mut Ctx, req: &Request) -> ApiResult {
    let t = wrapping_token(req)?;
    let (h, w) = load(ctx, &t)?;
    token::revoke_tree(ctx, &h)?;
    Ok(Reply::Wrapped(wrap(
        ctx,
        w.status,
        w.body,
        &w.creation_path,
        w.ttl,
    )?))
}

/// `sys/wrapping/lookup`.
pub fn lookup(ctx: &mut Ctx, req: &Request) -> ApiResult {
    let t = wrapping_token(req)?;
    let (_, w) = load(ctx, &t)?;
    Ok(Reply::Data(json!({
        "creation_path": w.creation_path,
        "creation_time": rfc3339(w.creation_time),
        "creation_ttl": w.ttl,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Method;
    use crate::seal::Barrier;
    use crate::storage::{MemStorage, Txn};
    use crate::time::Millis;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    const T0: Millis = 1_700_000_000_000;

    struct Parts {
        storage: MemStorage,
        barrier: Barrier,
        rng: ChaCha20Rng,
    }

    fn parts() -> Parts {
        let mut barrier = Barrier::default();
        barrier.unseal_with([5; 32]);
        Parts {
            storage: MemStorage::new(),
            barrier,
            rng: ChaCha20Rng::seed_from_u64(3),
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

    fn unwrap_req(token: Option<&str>, body: Value) -> Request {
        let r = Request::new(1, Method::Post, "sys/wrapping/unwrap").with_json(body);
        match token {
            Some(t) => r.with_token(t),
            None => r,
        }
    }

    fn invalid(r: ApiResult) {
        let e = r.unwrap_err();
        assert_eq!(
            e,
            ApiError::bad("wrapping token is not valid or does not exist")
        );
    }

    #[test]
    fn the_wrap_ttl_is_bounded() {
        let mut p = parts();
        let mut c = ctx(&mut p);
        for ttl in [0, MAX_WRAP_TTL + 1, u64::MAX] {
            let e = wrap(&mut c, 200, None, "sys/x", ttl).unwrap_err();
            assert_eq!(e.status(), 400, "{ttl}");
            assert!(e.to_string().contains("between 1s and"), "{ttl}: {e}");
        }
        assert!(wrap(&mut c, 200, None, "sys/x", 1).is_ok());
        assert!(wrap(&mut c, 200, None, "sys/x", MAX_WRAP_TTL).is_ok());
    }

    #[test]
    fn a_wrapped_response_unwraps_once() {
        let mut p = parts();
        let mut c = ctx(&mut p);
        let body = json!({"data": {"secret": "s3cr3t"}});
        let info = wrap(&mut c, 200, Some(body.clone()), "secret/x", 300).unwrap();
        let t = info["token"].as_str().unwrap().to_string();
        assert_eq!(info["ttl"], 300);
        assert_eq!(info["creation_path"], "secret/x");
        assert_eq!(info["creation_time"], json!(rfc3339(T0)));
        assert!(
            info.get("wrapped_accessor").is_none(),
            "no auth block: no wrapped_accessor key (as the reference): {info}"
        );
        // Looked up (any number of times) before it is unwrapped.
        let look = Request::new(2, Method::Post, "sys/wrapping/lookup").with_token(&t);
        for _ in 0..2 {
            let Reply::Data(d) = lookup(&mut c, &look).unwrap() else {
                panic!("lookup: not data");
            };
            assert_eq!(d["creation_path"], "secret/x");
            assert_eq!(d["creation_ttl"], 300);
        }
        assert_eq!(
            unwrap(&mut c, &unwrap_req(Some(&t), json!({}))).unwrap(),
            Reply::Envelope(body)
        );
        // Once: the token and its stored response are gone.
        invalid(unwrap(&mut c, &unwrap_req(Some(&t), json!({}))));
        invalid(lookup(&mut c, &look));
        assert!(c.keys(RESPONSE).unwrap().is_empty());
    }

    #[test]
    fn the_wrapping_token_is_single_use_and_expires_with_its_ttl() {
        let mut p = parts();
        let mut c = ctx(&mut p);
        let info = wrap(&mut c, 204, None, "sys/y", 60).unwrap();
        let t = info["token"].as_str().unwrap().to_string();
        let (_, e) = token::lookup(&mut c, &t).unwrap().unwrap();
        assert_eq!(e.kind, "wrapping");
        assert_eq!(e.num_uses, 1);
        assert_eq!(e.policies, vec!["response-wrapping".to_string()]);
        assert_eq!((e.ttl, e.explicit_max_ttl), (60, 60));
        assert_eq!(e.accessor, info["accessor"].as_str().unwrap());
        // Past its TTL it no longer unwraps.
        c.now = T0 + 60_001;
        invalid(unwrap(&mut c, &unwrap_req(Some(&t), json!({}))));
        // Before it, an empty response unwraps to an empty reply.
        c.now = T0 + 59_000;
        assert_eq!(
            unwrap(&mut c, &unwrap_req(Some(&t), json!({}))).unwrap(),
            Reply::Empty
        );
    }

    #[test]
    fn the_token_in_the_body_wins_over_the_request_token() {
        let mut p = parts();
        let mut c = ctx(&mut p);
        let a = wrap(&mut c, 200, Some(json!({"data": {"n": "a"}})), "p/a", 60).unwrap();
        let b = wrap(&mut c, 200, Some(json!({"data": {"n": "b"}})), "p/b", 60).unwrap();
        let (ta, tb) = (a["token"].as_str().unwrap(), b["token"].as_str().unwrap());
        let r = unwrap(&mut c, &unwrap_req(Some(ta), json!({ "token": tb }))).unwrap();
        assert_eq!(r, Reply::Envelope(json!({"data": {"n": "b"}})));
        // An empty body token falls back to the request's token.
        let r = unwrap(&mut c, &unwrap_req(Some(ta), json!({ "token": "" }))).unwrap();
        assert_eq!(r, Reply::Envelope(json!({"data": {"n": "a"}})));
        // Neither: the reference's 403 for an empty wrapping token.
        let e = unwrap(&mut c, &unwrap_req(None, json!({}))).unwrap_err();
        assert_eq!(e.status(), 403, "{e:?}");
        // A token field that is not a string is refused, not ignored.
        let e = unwrap(&mut c, &unwrap_req(Some(ta), json!({ "token": 5 }))).unwrap_err();
        assert_eq!(e.status(), 400);
    }

    #[test]
    fn only_wrapping_tokens_unwrap() {
        let mut p = parts();
        let mut c = ctx(&mut p);
        let (service, _) = token::create(
            &mut c,
            NewToken {
                policies: vec!["default".into()],
                ttl: Some(60),
                ..Default::default()
            },
        )
        .unwrap();
        invalid(unwrap(&mut c, &unwrap_req(Some(&service), json!({}))));
        invalid(unwrap(
            &mut c,
            &unwrap_req(Some("cs.nonexistent"), json!({})),
        ));
        // The service token is untouched by the attempt.
        assert!(token::lookup(&mut c, &service).unwrap().is_some());
    }

    #[test]
    fn the_wrapped_accessor_is_the_wrapped_auth_blocks() {
        let mut p = parts();
        let mut c = ctx(&mut p);
        let body = json!({"auth": {"client_token": "cs.inner", "accessor": "acc-inner"}});
        let info = wrap(&mut c, 200, Some(body), "auth/token/create", 60).unwrap();
        assert_eq!(info["wrapped_accessor"], "acc-inner");
        assert_ne!(
            info["accessor"], "acc-inner",
            "the wrapping token's own differs"
        );
    }

    #[test]
    fn a_dev_node_wraps_on_request_and_unwraps_once() {
        use crate::node::{Input, Node, Output};
        let mut n = Node::dev_in_memory([4; 32], "root");
        let call = |n: &mut Node<MemStorage>, id: u64, req: Request| {
            n.handle(2_000, Input::Request(req));
            let mut out = None;
            while let Some(o) = n.poll_output() {
                if let Output::Response(r) = o {
                    if r.id == id {
                        out = Some(r);
                    }
                }
            }
            out.expect("a response")
        };
        let mut req = Request::new(1, Method::Post, "auth/token/create")
            .with_token("root")
            .with_json(json!({"policies": ["default"]}));
        req.wrap_ttl = Some("2m".into());
        let r = call(&mut n, 1, req);
        assert_eq!(r.status, 200, "{:?}", r.body);
        let b = r.body.unwrap();
        assert_eq!(
            b["auth"],
            Value::Null,
            "the token is only in the wrapped response"
        );
        assert_eq!(b["wrap_info"]["ttl"], 120);
        assert_eq!(b["wrap_info"]["creation_path"], "auth/token/create");
        let t = b["wrap_info"]["token"].as_str().unwrap().to_string();
        let with_id = |id: u64| {
            let mut r = unwrap_req(Some(&t), json!({}));
            r.id = id;
            r
        };
        let r = call(&mut n, 2, with_id(2));
        assert_eq!(r.status, 200, "{:?}", r.body);
        let inner = r.body.unwrap();
        assert!(inner["auth"]["client_token"].is_string(), "{inner}");
        assert_eq!(
            b["wrap_info"]["wrapped_accessor"],
            inner["auth"]["accessor"]
        );
        let r = call(&mut n, 3, with_id(3));
        assert_eq!(r.status, 400, "{:?}", r.body);
    }
}
