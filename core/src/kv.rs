//! The KV version 1 secrets engine: JSON objects stored at paths under a mount.

use crate::api::{body_object, ApiError, ApiResult, Method, Reply, Request};
use crate::ctx::Ctx;
use crate::mounts::MountEntry;
use serde_json::{json, Value};

/// Longest key path accepted inside a mount.
pub const MAX_KEY_LEN: usize = 1024;

pub fn handle(ctx: &mut Ctx, req: &Request, mount: &MountEntry, rest: &str) -> ApiResult {
    let prefix = mount.data_prefix(false);
    if rest.len() > MAX_KEY_LEN {
        return Err(ApiError::bad(format!(
            "path: longer than {MAX_KEY_LEN} bytes"
        )));
    }
    match req.method {
        Method::List => {
            let dir = if rest.is_empty() || rest.ends_with('/') {
                rest.to_string()
            } else {
                format!("{rest}/")
            };
            let keys = ctx.list(&format!("{prefix}{dir}"))?;
            if keys.is_empty() {
                return Err(ApiError::NotFound(String::new()));
            }
            Ok(Reply::Data(json!({ "keys": keys })))
        }
        _ if rest.is_empty() || rest.ends_with('/') => Err(ApiError::bad(
            "path: a key is required (paths ending in '/' are directories)",
        )),
        Method::Get => match ctx.get(&format!("{prefix}{rest}"))? {
            Some(b) => {
                let v: Value =
                    serde_json::from_slice(&b).map_err(|e| ApiError::Internal(e.to_string()))?;
                Ok(Reply::Data(v))
            }
            None => Err(ApiError::NotFound(String::new())),
        },
        Method::Put | Method::Post => {
            let body = body_object(&req.body)?;
            if body.is_empty() {
                return Err(ApiError::bad("missing data fields"));
            }
            ctx.put(
                &format!("{prefix}{rest}"),
                &serde_json::to_vec(&Value::Object(body)).unwrap_or_default(),
            )?;
            Ok(Reply::Empty)
        }
        Method::Delete => {
            ctx.delete(&format!("{prefix}{rest}"));
            Ok(Reply::Empty)
        }
        Method::Patch => Err(ApiError::MethodNotAllowed),
    }
}

/// The stored key a write at `rest` replaces (see [`crate::router::prefetch_keys`]).
pub fn prefetch_key(mount: &MountEntry, rest: &str) -> Option<String> {
    (!rest.is_empty() && !rest.ends_with('/'))
        .then(|| format!("{}{rest}", mount.data_prefix(false)))
}

/// Whether a KV key exists (decides create vs update capability).
pub fn exists(ctx: &Ctx, mount: &MountEntry, rest: &str) -> ApiResult<bool> {
    Ok(ctx
        .txn
        .get(&format!("{}{rest}", mount.data_prefix(false)))?
        .is_some())
}
