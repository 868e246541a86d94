//! Renewal of tokens issued by an LDAP mount re-checks the directory, like the reference:
//! `auth/token/renew-self` and `auth/token/renew` of a token whose `auth_mount` is an LDAP
//! mount look the user's groups up again, recompute the policies from the current
//! mappings and config, and refuse the renewal ("policies have changed, not renewing")
//! when the set differs from the token's (`default` aside).
//!
//! The reference keeps the user's password with the token and repeats the whole login.
//! Cairn never stores passwords: the look-up runs as the service identity (`binddn` and
//! `bindpass`): search the user (refused when no longer found), search its groups. A
//! mount without a service identity renews as a plain token renewal (policies fixed at
//! login), as does a token whose mount is gone or no longer LDAP.

use super::login::{Job, Login};
use super::ops::{LdapCall, LdapOp, Secret};
use super::{load_config, login_policies, Found, Waiting};
use crate::api::{body_object, ApiError, ApiResult, Fields, Method, Reply, Request};
use crate::ctx::Ctx;
use crate::mounts::{self, Table};
use crate::node::Output;
use crate::token::{self, Caller};
use serde_json::json;
use std::collections::BTreeSet;

/// What a renewal waiting for the directory needs to finish.
#[derive(Clone, Debug)]
pub struct Renewal {
    /// The token's secret id (for the response), never logged.
    pub token: Secret,
    pub hash: String,
    pub increment: Option<u64>,
}

/// Starts the directory re-check for a renewal under `auth/token/` when the token comes
/// from an LDAP mount with a service identity; `None` leaves the request to the token
/// store (plain renewal, or its error for a bad token).
pub fn start(
    ctx: &mut Ctx,
    st: &mut super::LdapIo<'_>,
    req: &Request,
    rest: &str,
    caller: Option<&Caller>,
) -> ApiResult<Option<Reply>> {
    if !matches!(req.method, Method::Post | Method::Put) || !matches!(rest, "renew-self" | "renew")
    {
        return Ok(None);
    }
    let Some(caller) = caller else {
        return Ok(None);
    };
    let body = body_object(&req.body)?;
    let f = Fields(&body);
    let increment = f.duration("increment")?;
    let (id, hash, entry) = if rest == "renew-self" {
        (caller.id.clone(), caller.hash.clone(), caller.entry.clone())
    } else {
        let t = f.req_str("token")?;
        match token::lookup(ctx, &t)? {
            Some((h, e)) => (t, h, e),
            None => return Ok(None),
        }
    };
    if !entry.renewable || entry.expire_time.is_none() {
        return Ok(None);
    }
    let Some(path) = entry
        .auth_mount
        .as_deref()
        .and_then(|p| p.strip_prefix("auth/"))
    else {
        return Ok(None);
    };
    let Some((m, _)) = mounts::resolve(ctx, Table::Auth, path)? else {
        return Ok(None);
    };
    if m.kind != "ldap"
        || format!("auth/{}", m.path) != entry.auth_mount.clone().unwrap_or_default()
    {
        return Ok(None);
    }
    let Some(cfg) = load_config(ctx, &m)? else {
        return Ok(None);
    };
    let username = entry
        .login_name
        .clone()
        .or_else(|| entry.meta.get("username").cloned())
        .unwrap_or_default();
    if !cfg.has_service_bind() || username.is_empty() {
        log::debug!(
            "renewal of a token from auth/{} without a directory re-check: no binddn configured",
            m.path
        );
        return Ok(None);
    }
    if st.logins.len() >= super::MAX_ACTIVE_LOGINS {
        return Err(ApiError::TooMany(
            "too many LDAP logins in progress; try again".into(),
        ));
    }
    let conn = st.logins.conn_id();
    let op_id = st.logins.op_id();
    let (login, first) = Login::lookup(req.id, m, cfg, &username, conn);
    st.outputs.push_back(Output::Ldap(LdapCall {
        op_id,
        conn,
        op: LdapOp::Run(Box::new(Job {
            login,
            first,
            outcome: None,
        })),
        close_after: true,
    }));
    st.logins.active.insert(
        op_id,
        Waiting {
            request_id: req.id,
            renew: Some(Renewal {
                token: Secret::new(id),
                hash,
                increment,
            }),
            lock_stored: false,
        },
    );
    Ok(Some(Reply::Pending))
}

/// Policies without `default`, for comparing sets the way the reference does.
fn comparable(p: &[String]) -> BTreeSet<String> {
    p.iter().filter(|p| *p != "default").cloned().collect()
}

/// Finishes a renewal with the outcome of the look-up.
pub fn finish(
    ctx: &mut Ctx,
    identity_local: bool,
    login: &Login,
    outcome: Result<Found, ApiError>,
    r: Renewal,
) -> ApiResult<Reply> {
    let found = outcome.map_err(|e| {
        log::info!(
            "renewal of a token of {:?} from auth/{} refused: the directory look-up failed: {e}",
            login.username,
            login.mount.path
        );
        e
    })?;
    let (policies, all_groups) = login_policies(
        ctx,
        &login.mount,
        &login.cfg,
        &login.username,
        &found.groups,
    )?;
    let mut e = token::lookup_hash(ctx, &r.hash)?.ok_or_else(|| ApiError::bad("bad token"))?;
    if comparable(&policies) != comparable(&e.policies) {
        log::info!(
            "renewal of a token of {:?} from auth/{} refused: policies now {:?}, token has {:?}",
            login.username,
            login.mount.path,
            policies,
            e.policies
        );
        return Err(ApiError::bad("policies have changed, not renewing"));
    }
    token::renew(ctx, &r.hash, &mut e, r.increment)?;
    // The directory was just asked: the entity's external groups follow it, as at login.
    if !e.entity_id.is_empty() {
        crate::identity::login::refresh(
            ctx,
            identity_local,
            &login.mount,
            &e.entity_id,
            &all_groups,
        )?;
    }
    let tp = e.policies.clone();
    Ok(Reply::Envelope(
        json!({ "auth": token::auth_view(ctx, r.token.expose(), &e, &tp)? }),
    ))
}
