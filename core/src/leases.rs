//! `sys/leases/*` over the only leases Cairn issues: those of its tokens. A token with an
//! expiry (neither a batch token nor a response-wrapping one) has the lease
//! `<its creation path>/<its hash>`, e.g. `auth/token/create/<hash>` or
//! `auth/ldap/login/alice/<hash>`, as in the reference. Lookup, renewal and revocation by
//! lease id (a lookup or listing needs sudo), revocation by prefix (`revoke-prefix` and
//! `revoke-force`, sudo), and `tidy` (a no-op:
//! expired tokens are swept on ticks).

use crate::api::{body_object, ApiError, ApiResult, Fields, Method, Reply, Request};
use crate::ctx::Ctx;
use crate::time::rfc3339;
use crate::token::{self, TokenEntry};
use serde_json::json;
use std::collections::BTreeSet;

/// The lease of token `h` when it has one visible from namespace `ns`: its lease id.
fn lease_of(h: &str, e: &TokenEntry, ns: &str) -> Option<String> {
    if e.expire_time.is_none() || e.kind == "wrapping" || e.is_batch() || !token::within(e, ns) {
        return None;
    }
    Some(format!("{}/{h}", e.path.trim_end_matches('/')))
}

/// Every token lease of namespace `ns` and below: (lease id, token hash, entry).
fn all(ctx: &Ctx, ns: &str) -> ApiResult<Vec<(String, String, TokenEntry)>> {
    let mut out = Vec::new();
    for h in token::hashes(ctx)? {
        let Some(e) = token::lookup_hash(ctx, &h)? else {
            continue;
        };
        if let Some(id) = lease_of(&h, &e, ns) {
            out.push((id, h, e));
        }
    }
    Ok(out)
}

/// The token whose lease is `id`: the id ends with the token's hash, so one look-up, not
/// a scan of every token.
fn find(ctx: &Ctx, ns: &str, id: &str) -> ApiResult<Option<(String, TokenEntry)>> {
    let Some((_, h)) = id.rsplit_once('/') else {
        return Ok(None);
    };
    let Some(e) = token::lookup_hash(ctx, h)? else {
        return Ok(None);
    };
    Ok((lease_of(h, &e, ns).as_deref() == Some(id)).then(|| (h.to_string(), e)))
}

/// `sys/leases/<rest>`.
pub fn handle(ctx: &mut Ctx, req: &Request, rest: &str) -> ApiResult {
    let ns = crate::namespace::of(req);
    let body = body_object(&req.body)?;
    let f = Fields(&body);
    let lease_id = |suffix: &str| -> ApiResult<String> {
        let id = f
            .str("lease_id")?
            .filter(|s| !s.is_empty())
            .or_else(|| (!suffix.is_empty()).then(|| suffix.to_string()));
        id.ok_or_else(|| ApiError::bad("lease_id must be specified"))
    };
    // `GET ?list=true` reaches handlers as LIST (the request head).
    let listing = req.method == Method::List;
    match (req.method, rest) {
        (_, r) if listing && (r == "lookup" || r.starts_with("lookup/")) => {
            let prefix = r["lookup".len()..].trim_start_matches('/');
            let prefix = if prefix.is_empty() || prefix.ends_with('/') {
                prefix.to_string()
            } else {
                format!("{prefix}/")
            };
            let keys: BTreeSet<String> = all(ctx, &ns)?
                .into_iter()
                .filter_map(|(l, _, _)| {
                    let tail = l.strip_prefix(&prefix)?;
                    Some(match tail.split_once('/') {
                        Some((dir, _)) => format!("{dir}/"),
                        None => tail.to_string(),
                    })
                })
                .collect();
            if keys.is_empty() {
                return Err(ApiError::NotFound(String::new()));
            }
            Ok(Reply::Data(json!({ "keys": keys })))
        }
        (Method::Put | Method::Post, "lookup") => {
            let id = lease_id("")?;
            let (_, e) = find(ctx, &ns, &id)?.ok_or_else(|| ApiError::bad("invalid lease"))?;
            Ok(Reply::Data(json!({
                "id": id,
                "issue_time": rfc3339(e.creation_time),
                "expire_time": e.expire_time.map(rfc3339),
                "last_renewal": e.last_renewal.map(rfc3339),
                "renewable": e.renewable,
                "ttl": e.remaining_ttl(ctx.now),
            })))
        }
        (Method::Put | Method::Post, r) if r == "renew" || r.starts_with("renew/") => {
            let id = lease_id(
                r.strip_prefix("renew")
                    .unwrap_or("")
                    .trim_start_matches('/'),
            )?;
            let (h, mut e) =
                find(ctx, &ns, &id)?.ok_or_else(|| ApiError::bad("lease not found"))?;
            if e.auth_mount.is_some() {
                // A login token's renewal re-checks its auth method: through the token store.
                return Err(ApiError::bad(
                    "tokens from an auth method are renewed with auth/token/renew or renew-self",
                ));
            }
            token::renew(ctx, &h, &mut e, f.duration("increment")?)?;
            Ok(Reply::Envelope(json!({
                "lease_id": id,
                "renewable": e.renewable,
                "lease_duration": e.ttl,
            })))
        }
        (Method::Put | Method::Post, r) if r == "revoke" || r.starts_with("revoke/") => {
            let id = lease_id(
                r.strip_prefix("revoke")
                    .unwrap_or("")
                    .trim_start_matches('/'),
            )?;
            // An unknown lease is no error, as in the reference.
            if let Some((h, _)) = find(ctx, &ns, &id)? {
                token::revoke_tree(ctx, &h)?;
            }
            Ok(Reply::Empty)
        }
        // `revoke-force` is the reference's revocation that ignores a secrets engine's
        // failure to revoke; token leases have no engine to fail, so it is the same as
        // `revoke-prefix`.
        (Method::Put | Method::Post, r)
            if r.starts_with("revoke-prefix/") || r.starts_with("revoke-force/") =>
        {
            let prefix = r
                .split_once('/')
                .map_or("", |(_, p)| p)
                .trim_end_matches('/');
            if prefix.is_empty() {
                return Err(ApiError::bad("prefix must be specified"));
            }
            for (l, h, _) in all(ctx, &ns)? {
                let under = l
                    .strip_prefix(prefix)
                    .is_some_and(|t| t.is_empty() || t.starts_with('/'));
                // A child revoked with an earlier parent is gone already.
                if under && token::lookup_hash(ctx, &h)?.is_some() {
                    token::revoke_tree(ctx, &h)?;
                }
            }
            Ok(Reply::Empty)
        }
        (Method::Put | Method::Post, "tidy") => Ok(Reply::Raw(
            202,
            json!({
                "request_id": "",
                "lease_id": "",
                "renewable": false,
                "lease_duration": 0,
                "data": null,
                "wrap_info": null,
                "warnings": ["Tidy operation successfully started. Cairn sweeps expired tokens on its own; there is nothing else to tidy."],
                "auth": null,
            }),
        )),
        _ => Err(ApiError::NotFound(String::new())),
    }
}

#[cfg(test)]
mod tests {
    use crate::api::{Method, Request, Response};
    use crate::node::Node;
    use crate::storage::MemStorage;
    use serde_json::{json, Value};

    fn call(n: &mut Node<MemStorage>, id: u64, m: Method, path: &str, body: Value) -> Response {
        let req = Request::new(id, m, path).with_token("root").with_json(body);
        crate::node::tests::call(n, 2_000, req)
    }

    #[test]
    fn token_leases_are_listed_looked_up_and_revoked_by_prefix() {
        let mut n = Node::dev_in_memory([6; 32], "root");
        let r = call(
            &mut n,
            1,
            Method::Post,
            "auth/token/create",
            json!({"ttl": "1h"}),
        );
        let tok = r.body.unwrap()["auth"]["client_token"]
            .as_str()
            .unwrap()
            .to_string();
        let r = call(&mut n, 2, Method::List, "sys/leases/lookup", json!({}));
        assert_eq!(r.body.unwrap()["data"]["keys"], json!(["auth/"]));
        let r = call(
            &mut n,
            3,
            Method::List,
            "sys/leases/lookup/auth/token/create/",
            json!({}),
        );
        let keys = r.body.unwrap()["data"]["keys"].clone();
        assert_eq!(keys.as_array().unwrap().len(), 1, "{keys}");
        let id = format!("auth/token/create/{}", keys[0].as_str().unwrap());
        let r = call(
            &mut n,
            4,
            Method::Put,
            "sys/leases/lookup",
            json!({ "lease_id": id }),
        );
        assert_eq!(r.status, 200);
        assert_eq!(r.body.unwrap()["data"]["ttl"], 3600);
        for (i, (path, body, status)) in [
            ("sys/leases/lookup", json!({"lease_id": "x/y"}), 400),
            ("sys/leases/lookup", json!({}), 400),
            ("sys/leases/renew", json!({"lease_id": "x/y"}), 400),
            ("sys/leases/revoke", json!({"lease_id": "x/y"}), 204),
            ("sys/leases/tidy", json!({}), 202),
        ]
        .into_iter()
        .enumerate()
        {
            let r = call(&mut n, 10 + i as u64, Method::Put, path, body);
            assert_eq!(r.status, status, "{path}: {:?}", r.body);
        }
        let r = call(
            &mut n,
            20,
            Method::Put,
            "sys/leases/revoke-prefix/auth/token",
            json!({}),
        );
        assert_eq!(r.status, 204);
        let r = call(
            &mut n,
            21,
            Method::Post,
            "auth/token/lookup",
            json!({ "token": tok }),
        );
        assert_eq!(r.status, 403, "revoked by prefix");
        // `revoke-force/<prefix>` revokes the same way.
        let r = call(
            &mut n,
            30,
            Method::Post,
            "auth/token/create",
            json!({"ttl": "1h"}),
        );
        let tok = r.body.unwrap()["auth"]["client_token"]
            .as_str()
            .unwrap()
            .to_string();
        let r = call(
            &mut n,
            31,
            Method::Put,
            "sys/leases/revoke-force/auth/token/create",
            json!({}),
        );
        assert_eq!(r.status, 204);
        let r = call(
            &mut n,
            32,
            Method::Post,
            "auth/token/lookup",
            json!({ "token": tok }),
        );
        assert_eq!(r.status, 403, "revoked by revoke-force");
        let r = call(&mut n, 22, Method::List, "sys/leases/lookup", json!({}));
        assert_eq!(r.status, 404);
    }
}
