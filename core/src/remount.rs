//! `sys/remount`: moving a secrets engine or an auth method to another path (`bao secrets
//! move`, `bao auth move`), and `sys/remount/status/<id>`, what became of a move. A mount's
//! data lives under its uuid, so a move only rewrites its table entry and finishes within
//! the request; the status record says `success` at once (the reference runs the move in
//! the background and the CLI polls the status).

use crate::api::{body_object, ApiError, ApiResult, Fields, Method, Reply, Request};
use crate::crypto;
use crate::ctx::Ctx;
use crate::mounts::{self, Table};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Storage prefix of the moves' status records (by migration id, barrier-encrypted).
pub const PREFIX: &str = "core/remount/";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Migration {
    source_mount: String,
    target_mount: String,
    status: String,
    /// The namespace the move was made in: its status is read there only (a record written
    /// before this was kept reads as the root namespace's).
    #[serde(default)]
    namespace: String,
}

/// Which table a path names (`auth/<p>` is an auth method) and the path inside it.
fn table_of(p: &str) -> (Table, &str) {
    match p.trim_start_matches('/').strip_prefix("auth/") {
        Some(rest) => (Table::Auth, rest),
        None => (Table::Secrets, p),
    }
}

/// `sys/remount` (`tail` empty) and `sys/remount/status/<id>`.
pub fn handle(ctx: &mut Ctx, req: &Request, tail: &str) -> ApiResult {
    let ns = crate::namespace::of(req);
    match (req.method, tail) {
        (Method::Post | Method::Put, "") => {
            let body = body_object(&req.body)?;
            let f = Fields(&body);
            f.only(&["from", "to"])?;
            let from = f.req_str("from")?;
            let to = f.req_str("to")?;
            let (ft, fp) = table_of(&from);
            let (tt, tp) = table_of(&to);
            if ft != tt {
                return Err(ApiError::bad(match ft {
                    Table::Auth => format!("cannot remount auth mount to non-auth mount {to:?}"),
                    Table::Secrets => {
                        format!("cannot remount non-auth mount to auth mount {to:?}")
                    }
                }));
            }
            let from_full = format!("{ns}{}", mounts::mount_path(fp)?);
            let to_full = format!("{ns}{}", mounts::mount_path(tp)?);
            let moved = mounts::rename(ctx, ft, &from_full, &to_full, &ns)?;
            let prefix = if ft == Table::Auth { "auth/" } else { "" };
            let id = crypto::uuid(ctx.rng());
            let m = Migration {
                source_mount: format!("{prefix}{}", &from_full[ns.len()..]),
                target_mount: format!("{prefix}{}", &moved.path[ns.len()..]),
                status: "success".into(),
                namespace: ns.clone(),
            };
            ctx.put_json(&format!("{PREFIX}{id}"), &m)?;
            Ok(Reply::Data(json!({ "migration_id": id })))
        }
        (Method::Get, t) if t.starts_with("status/") => {
            let id = &t["status/".len()..];
            // A move of another namespace is not found from this one (its mount paths are
            // that namespace's business).
            let m: Migration = ctx
                .get_json::<Migration>(&format!("{PREFIX}{id}"))?
                .filter(|m| m.namespace == ns)
                .ok_or_else(|| ApiError::NotFound(String::new()))?;
            Ok(Reply::Data(json!({
                "migration_id": id,
                "migration_info": {
                    "source_mount": m.source_mount,
                    "target_mount": m.target_mount,
                    "status": m.status,
                },
            })))
        }
        _ => Err(ApiError::MethodNotAllowed),
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

    /// A move's status is read in the namespace it was made in only: from another one the
    /// id is not found (it named the other namespace's mounts).
    #[test]
    fn a_moves_status_is_not_read_from_another_namespace() {
        let mut n = Node::dev_in_memory([9; 32], "root");
        let r = call(&mut n, 1, Method::Post, "sys/namespaces/ns1", json!({}));
        assert!(r.status < 300, "{:?}", r.body);
        call(
            &mut n,
            2,
            Method::Post,
            "sys/mounts/hr",
            json!({"type": "kv"}),
        );
        let r = call(
            &mut n,
            3,
            Method::Post,
            "sys/remount",
            json!({"from": "hr", "to": "hr-2025"}),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
        let id = r.body.unwrap()["data"]["migration_id"]
            .as_str()
            .unwrap()
            .to_string();
        let status = format!("sys/remount/status/{id}");
        let mut req = Request::new(4, Method::Get, &status).with_token("root");
        req.namespace = Some("ns1".into());
        let r = crate::node::tests::call(&mut n, 2_000, req);
        assert_eq!(r.status, 404, "{:?}", r.body);
        let r = call(&mut n, 5, Method::Get, &status, json!(null));
        assert_eq!(
            r.body.unwrap()["data"]["migration_info"],
            json!({"source_mount": "hr/", "target_mount": "hr-2025/", "status": "success"})
        );
    }

    #[test]
    fn a_move_keeps_the_data_and_its_status_says_success() {
        let mut n = Node::dev_in_memory([9; 32], "root");
        call(
            &mut n,
            1,
            Method::Post,
            "sys/mounts/a",
            json!({"type": "kv"}),
        );
        call(&mut n, 2, Method::Put, "a/x", json!({"v": "1"}));
        let r = call(
            &mut n,
            3,
            Method::Post,
            "sys/remount",
            json!({"from": "a", "to": "b/c"}),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
        let id = r.body.unwrap()["data"]["migration_id"]
            .as_str()
            .unwrap()
            .to_string();
        let r = call(&mut n, 4, Method::Get, "b/c/x", json!(null));
        assert_eq!(r.body.unwrap()["data"]["v"], json!("1"));
        assert_eq!(call(&mut n, 5, Method::Get, "a/x", json!(null)).status, 404);
        let r = call(
            &mut n,
            6,
            Method::Get,
            &format!("sys/remount/status/{id}"),
            json!(null),
        );
        assert_eq!(
            r.body.unwrap()["data"]["migration_info"],
            json!({"source_mount": "a/", "target_mount": "b/c/", "status": "success"})
        );
        assert_eq!(
            call(
                &mut n,
                7,
                Method::Get,
                "sys/remount/status/nope",
                json!(null)
            )
            .status,
            404
        );
        for (body, err) in [
            (json!({"from": "nope", "to": "z"}), "no matching mount"),
            (json!({"from": "b/c", "to": "secret"}), "already in use"),
            (json!({"from": "b/c", "to": "auth/z"}), "auth mount"),
            (json!({"from": "sys", "to": "z"}), "built-in"),
            (json!({"from": "auth/ldap", "to": "z"}), "non-auth"),
        ] {
            let r = call(&mut n, 8, Method::Post, "sys/remount", body.clone());
            assert_eq!(r.status, 400, "{body}");
            let e = r.body.unwrap()["errors"][0].as_str().unwrap().to_string();
            assert!(e.contains(err), "{body}: {e}");
        }
        // An auth method moves within its table.
        let r = call(
            &mut n,
            9,
            Method::Post,
            "sys/remount",
            json!({"from": "auth/ldap", "to": "auth/corp"}),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
        let r = call(&mut n, 10, Method::Get, "sys/auth", json!(null));
        let b = r.body.unwrap();
        assert!(
            b["data"]["corp/"].is_object() && b["data"]["ldap/"].is_null(),
            "{b}"
        );
    }
}
