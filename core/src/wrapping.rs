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
