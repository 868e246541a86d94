//! The KV version 2 secrets engine: versioned JSON objects at paths under a mount, as
//! Vault and OpenBao serve them (`config`, `data/`, `metadata/`, `delete/`, `undelete/`,
//! `destroy/`, `subkeys/`). This module splits a path into its operation and key and
//! dispatches; [`meta`] owns the settings and per-key metadata, [`versions`] the versions.
//!
//! A request's reads and writes go through the handler context's one write set, so a
//! request that fails applies nothing. Times come from the node's clock input.

pub mod meta;
pub mod versions;

#[cfg(test)]
mod tests;

use crate::api::{envelope, ApiError, ApiResult, Method, Reply, Request};
use crate::ctx::Ctx;
use crate::mounts::MountEntry;
use serde_json::{json, Value};

/// A KV version 2 mount, seen through its storage prefix.
pub struct Kv2<'a> {
    prefix: &'a str,
}

/// The version operations of `delete/`, `undelete/` and `destroy/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Delete,
    Undelete,
    Destroy,
}

/// What a path inside a v2 mount names.
enum Target<'p> {
    Config,
    Data(&'p str),
    Metadata(&'p str),
    Versions(Op, &'p str),
    Subkeys(&'p str),
    /// The mount's root or a path outside the API.
    Other,
}

fn target(rest: &str) -> Target<'_> {
    let (head, key) = rest.split_once('/').unwrap_or((rest, ""));
    match head {
        "config" if key.is_empty() => Target::Config,
        "data" => Target::Data(key),
        "metadata" => Target::Metadata(key),
        "delete" => Target::Versions(Op::Delete, key),
        "undelete" => Target::Versions(Op::Undelete, key),
        "destroy" => Target::Versions(Op::Destroy, key),
        "subkeys" => Target::Subkeys(key),
        _ => Target::Other,
    }
}

/// The 404 of a missing key or version (the reference's has no message).
pub(crate) fn not_found() -> ApiError {
    ApiError::NotFound("no secret at this path".into())
}

/// A full envelope around `data` with a status other than 200 (a read of a deleted or
/// destroyed version is a 404 that still shows the version's metadata).
pub(crate) fn with_status(ctx: &mut Ctx, status: u16, data: Value) -> ApiResult {
    let id = crate::crypto::uuid(ctx.rng());
    Ok(Reply::Raw(status, envelope(&id, data)))
}

/// Refuses a key longer than the KV limit.
pub(crate) fn check_key(key: &str) -> ApiResult<()> {
    if key.len() > crate::kv::MAX_KEY_LEN {
        return Err(ApiError::bad(format!(
            "path: longer than {} bytes",
            crate::kv::MAX_KEY_LEN
        )));
    }
    Ok(())
}

/// Serves a request at `rest` inside the v2 mount `mount`.
pub fn handle(ctx: &mut Ctx, req: &Request, mount: &MountEntry, rest: &str) -> ApiResult {
    let prefix = mount.data_prefix(false);
    let kv = Kv2 { prefix: &prefix };
    match target(rest) {
        Target::Config => kv.config_endpoint(ctx, req.method, &req.body),
        Target::Data(key) if req.method != Method::List => kv.data_endpoint(ctx, req, key),
        Target::Metadata(key) => kv.metadata_endpoint(ctx, req.method, key, &req.body),
        Target::Versions(op, key) => kv.versions_endpoint(ctx, req, op, key),
        Target::Subkeys(key) => kv.subkeys_endpoint(ctx, req, key),
        Target::Data(_) => Err(ApiError::MethodNotAllowed),
        Target::Other => {
            let warning = if rest.is_empty() {
                "Non-listing operations on the root of a K/V v2 mount are not supported."
            } else {
                "Invalid path for a versioned K/V secrets engine. See the API docs for the \
                 appropriate API endpoints to use. With the bao or vault CLI, use 'kv get' \
                 for this operation."
            };
            let id = crate::crypto::uuid(ctx.rng());
            let mut env = envelope(&id, Value::Null);
            env["warnings"] = json!([warning]);
            Ok(Reply::Raw(404, env))
        }
    }
}

/// Whether the target of a write at `rest` exists (decides create vs update): the key of
/// a `data/` or `metadata/` path has metadata.
pub fn exists(ctx: &Ctx, mount: &MountEntry, rest: &str) -> ApiResult<bool> {
    let prefix = mount.data_prefix(false);
    let kv = Kv2 { prefix: &prefix };
    match target(rest) {
        Target::Data(key) | Target::Metadata(key) if !key.is_empty() => {
            Ok(ctx.txn.get(&kv.meta_key(key))?.is_some())
        }
        _ => Ok(true),
    }
}

/// The stored key a write at `rest` reads first (see [`crate::router::prefetch_keys`]): the
/// metadata of a `data/` or `metadata/` path's key.
pub fn prefetch_key(mount: &MountEntry, rest: &str) -> Option<String> {
    let prefix = mount.data_prefix(false);
    let kv = Kv2 { prefix: &prefix };
    match target(rest) {
        Target::Data(key) | Target::Metadata(key) if !key.is_empty() => Some(kv.meta_key(key)),
        _ => None,
    }
}

/// Upgrades a KV version 1 mount's keys in place: each becomes version 1 of itself (in
/// the caller's write set, with the mount's new options).
pub fn upgrade(ctx: &mut Ctx, mount: &MountEntry) -> ApiResult<()> {
    let prefix = mount.data_prefix(false);
    let kv = Kv2 { prefix: &prefix };
    // Every original is read and removed before anything is written: a version 1 key may
    // itself be named like one of the version 2 records.
    let mut originals = Vec::new();
    for full in ctx.keys(&prefix)? {
        let data = match ctx.get_json::<Value>(&full)? {
            Some(Value::Object(o)) => o,
            _ => serde_json::Map::new(),
        };
        ctx.delete(&full);
        originals.push((full[prefix.len()..].to_string(), data));
    }
    for (key, data) in originals {
        let mut m = meta::KeyMeta::new(ctx.now);
        m.oldest_version = 1;
        kv.write(ctx, &key, m, data, None)?;
    }
    Ok(())
}
