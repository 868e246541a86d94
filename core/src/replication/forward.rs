//! Requests a performance secondary sends to its primary cluster's active node.
//!
//! A performance secondary holds its primary's replicated data read-only. As in the
//! reference, a request that would write replicated data there is not refused: it runs on
//! the secondary as far as its commit (so the token, which lives only on the secondary, is
//! checked with the ACL in the router's one place, and the handler's own checks run), its
//! write set is dropped, and the request goes to the primary instead, which applies it and
//! whose answer (status, body, `X-Vault-Index`) the client gets unchanged. A client that
//! sends `X-Vault-Inconsistent: forward-active-node` with an `X-Vault-Index` the secondary
//! has not reached yet has its request (read or write) sent the same way instead of the 412.
//!
//! The way there is the replication channel the secondary already pulls over: a
//! [`PeerBody::Forward`] to the address its pulls use (the primary cluster's active node; a
//! standby there refuses it unapplied), TLS pinned to the primary's cluster CA, with the
//! secondary's credential. The primary:
//! * admits it only from a registered, non-revoked performance secondary ([`admit`]);
//! * runs it as a request of its own on behalf of the caller the secondary vouches for
//!   ([`OnBehalf`]: the token's policies, namespace, accessor and display name; never the
//!   token itself, which the primary could not resolve). The router checks that caller's
//!   policies again on the primary, and serves only the routes of replicated data
//!   ([`crate::router`]); the node refuses a write set that touches anything else;
//! * answers with [`PeerAnswer::Forwarded`] after the batch is durable.
//!
//! A forward is sent once and never retried once it may have left: a broken connection is
//! a 502 naming the primary (the write may or may not have been applied there; the client
//! decides), an unreachable or refusing primary a 502/503; nothing is applied on the
//! secondary either way. On the secondary the forward is an `Output::PeerSend` and its
//! answer an `Input::PeerReply`, as every call to the primary; the waiting request is
//! answered as a standby's forward is ([`crate::node::standby`]).

use super::msg::{PeerAnswer, PeerBody, PeerMsg, PeerRequest, PeerSend};
use super::{primary, secondary, Call, Env, Mode};
use crate::api::{ApiError, Method, Request, RequestId, Response};
use crate::node::Output;
use crate::token::TokenEntry;
use base64::Engine;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Request ids the primary gives the requests it runs for its secondaries: above any id a
/// driver gives (`1 << 62` plus the peer request's id).
pub const ID_BASE: u64 = 1 << 62;

/// The caller a performance secondary authorized, as the primary acts for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct OnBehalf {
    pub accessor: String,
    pub display_name: String,
    pub policies: Vec<String>,
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    /// The token's namespace (`""`: root) and its id.
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub namespace_id: String,
    /// The secondary that forwarded the request (set by the primary from the credential,
    /// never taken from the message).
    #[serde(default)]
    pub secondary_id: String,
}

impl OnBehalf {
    pub fn of(e: &TokenEntry) -> OnBehalf {
        OnBehalf {
            accessor: e.accessor.clone(),
            display_name: e.display_name.clone(),
            policies: e.policies.clone(),
            meta: e.meta.clone(),
            namespace: e.namespace.clone(),
            namespace_id: e.namespace_id.clone(),
            secondary_id: String::new(),
        }
    }

    /// A token entry standing for the caller (policies, namespace; no uses to spend, no
    /// expiry: the secondary checked the token a moment ago), for the ACL and the audit.
    pub fn entry(&self) -> TokenEntry {
        TokenEntry {
            accessor: self.accessor.clone(),
            policies: self.policies.clone(),
            meta: self.meta.clone(),
            display_name: self.display_name.clone(),
            namespace: self.namespace.clone(),
            namespace_id: self.namespace_id.clone(),
            kind: "service".into(),
            ..TokenEntry::default()
        }
    }
}

/// A client request as a secondary forwards it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardedRequest {
    pub method: String,
    /// The canonical path, with any namespace segments the client put there.
    pub path: String,
    pub namespace: Option<String>,
    pub query: Vec<(String, String)>,
    /// Base64 of the body.
    pub body: String,
    pub remote_addr: String,
    pub caller: OnBehalf,
}

impl ForwardedRequest {
    pub fn of(req: &Request, caller: OnBehalf) -> ForwardedRequest {
        ForwardedRequest {
            method: req.method.as_str().into(),
            path: req.path.clone(),
            namespace: req.namespace.clone(),
            query: req.query.clone(),
            body: B64.encode(&req.body),
            remote_addr: req.remote_addr.clone(),
            caller,
        }
    }

    /// The request the primary runs under `id`, on behalf of `caller`.
    fn into_request(self, id: RequestId, caller: OnBehalf) -> Result<Request, String> {
        let method = Method::parse(&self.method)
            .ok_or_else(|| format!("unknown method {:?}", self.method))?;
        let mut r = Request::new(id, method, &self.path);
        r.namespace = self.namespace;
        r.query = self.query;
        r.remote_addr = self.remote_addr;
        r.body = B64
            .decode(self.body)
            .map_err(|e| format!("body is not base64: {e}"))?;
        r.on_behalf = Some(Box::new(caller));
        Ok(r)
    }
}

/// Secondary: sends `req` (authorized here for `caller`) to the primary's active node.
/// `Ok(call id)` once the call is queued; `Err` (503) when there is no primary to ask.
pub(crate) fn send(env: &mut Env, req: &Request, caller: OnBehalf) -> Result<u64, ApiError> {
    let (to, auth, ca_pem, client) =
        secondary::addressed(env, Mode::Performance).map_err(|why| {
            ApiError::Unavailable(format!(
                "this performance secondary cannot forward the request to its primary: {why}"
            ))
        })?;
    let id = env.repl().call_id();
    env.st.repl.calls.insert(
        id,
        Call::Forward {
            request: req.id,
            to: to.clone(),
        },
    );
    env.push(Output::PeerSend(PeerSend {
        call_id: id,
        to,
        msg: PeerMsg {
            mode: Mode::Performance,
            auth,
            body: PeerBody::Forward {
                req: Box::new(ForwardedRequest::of(req, caller)),
            },
        },
        ca_pem,
        client,
    }));
    Ok(id)
}

/// Secondary: the request waiting for forward call `call_id`, and the primary it went to,
/// if that call is one.
pub(crate) fn take(env: &mut Env, call_id: u64) -> Option<(RequestId, String)> {
    match env.st.repl.calls.get(&call_id) {
        Some(Call::Forward { .. }) => match env.st.repl.calls.remove(&call_id) {
            Some(Call::Forward { request, to }) => Some((request, to)),
            _ => None,
        },
        _ => None,
    }
}

/// Secondary: the answer its client gets for the primary's answer (or failure) `result`.
pub(crate) fn client_answer(
    id: RequestId,
    to: &str,
    result: Result<PeerAnswer, String>,
) -> Response {
    let e = match result {
        Ok(PeerAnswer::Forwarded {
            status,
            body,
            index,
        }) => {
            return Response {
                id,
                status,
                body,
                raw: None,
                index,
            }
        }
        Ok(PeerAnswer::Error { code, message }) if code == super::STANDBY_CODE => {
            ApiError::Unavailable(format!(
                "the request was not forwarded: the primary cluster's node at {to} is a \
                 standby ({message}); nothing was applied, retry shortly"
            ))
        }
        Ok(PeerAnswer::Error { code, message }) => ApiError::Upstream(format!(
            "the primary cluster at {to} refused the forwarded request ({code}): {message}"
        )),
        Ok(other) => ApiError::Upstream(format!(
            "the primary cluster at {to} answered the forwarded request with {}",
            answer_name(&other)
        )),
        Err(e) => ApiError::Upstream(format!(
            "the request could not be forwarded to the primary cluster at {to}: {e}; nothing \
             was applied on this secondary (if the request left, the primary may have applied \
             it)"
        )),
    };
    Response::error(id, &e)
}

fn answer_name(a: &PeerAnswer) -> &'static str {
    match a {
        PeerAnswer::Pong { .. } => "pong",
        PeerAnswer::Entries { .. } => "entries",
        PeerAnswer::Gone { .. } => "gone",
        PeerAnswer::Changes { .. } => "changes",
        PeerAnswer::Roots { .. } => "roots",
        PeerAnswer::Pages { .. } => "pages",
        PeerAnswer::Subpages { .. } => "subpages",
        PeerAnswer::Synced { .. } => "synced",
        PeerAnswer::Forwarded { .. } => "forwarded",
        PeerAnswer::Error { .. } => "error",
    }
}

/// Primary: admits a forwarded request from a registered performance secondary: the
/// request to run (id [`ID_BASE`] plus the peer request's id), or the refusal to answer.
pub(crate) fn admit(env: &mut Env, r: PeerRequest) -> Result<Request, Box<PeerAnswer>> {
    let refuse = |code: &str, message: String| {
        Box::new(PeerAnswer::Error {
            code: code.into(),
            message,
        })
    };
    if r.msg.mode != Mode::Performance {
        return Err(refuse(
            "bad-request",
            "only performance secondaries forward requests".into(),
        ));
    }
    let rec = match primary::authenticate(env, &r.msg) {
        Ok(Ok(rec)) => rec,
        Ok(Err(a)) => return Err(Box::new(a)),
        Err(e) => return Err(refuse("internal", e.to_string())),
    };
    let PeerBody::Forward { req } = r.msg.body else {
        return Err(refuse("bad-request", "not a forwarded request".into()));
    };
    let mut caller = req.caller.clone();
    caller.secondary_id = rec.id;
    req.into_request(ID_BASE | r.id, caller)
        .map_err(|e| refuse("bad-request", format!("malformed forwarded request: {e}")))
}

/// Primary: refuses a request a performance secondary forwarded on `mount` (an auth mount
/// when `auth`) unless that secondary holds the mount's data: not a `local` mount of this
/// cluster, and one its paths filter includes. Otherwise a secondary's caller would read
/// (or write) through the primary what replication keeps away from its cluster.
pub(crate) fn check_replicated_to(
    ctx: &crate::ctx::Ctx,
    on: &OnBehalf,
    mount: &crate::mounts::MountEntry,
    auth: bool,
) -> Result<(), ApiError> {
    let refuse = || {
        ApiError::Forbidden(format!(
            "{} is not replicated to performance secondary {:?} (a local mount of the primary, \
             or left out by its paths filter): a primary serves a secondary's requests only \
             on the data replicated to it",
            mount.path, on.secondary_id
        ))
    };
    if mount.local {
        return Err(refuse());
    }
    let Some(rec) = primary::load_record(ctx, Mode::Performance, &on.secondary_id)? else {
        return Err(refuse());
    };
    if rec.filter.is_some() {
        let mm = super::filter::mount_map(ctx)?;
        let prefix = mount.data_prefix(auth);
        if !super::filter::included(rec.filter.as_ref(), &mm, prefix.trim_end_matches('/')) {
            return Err(refuse());
        }
    }
    Ok(())
}

/// Primary: refuses the write set (`keys`) of a request a performance secondary forwarded
/// when it touches the data of a mount that secondary's paths filter leaves out: through
/// the `sys/` routes (an unmount, a tune that rewrites a mount's keys, a namespace's purge)
/// as through the mount's own, a secondary's caller changes only what replication gives
/// its cluster.
pub(crate) fn check_writes_replicated_to<'a>(
    ctx: &crate::ctx::Ctx,
    on: &OnBehalf,
    keys: impl IntoIterator<Item = &'a str>,
) -> Result<(), ApiError> {
    let Some(rec) = primary::load_record(ctx, Mode::Performance, &on.secondary_id)? else {
        return Err(ApiError::Forbidden(format!(
            "performance secondary {:?} is not registered here: nothing was applied",
            on.secondary_id
        )));
    };
    if rec.filter.is_none() {
        return Ok(());
    }
    let mm = super::filter::mount_map(ctx)?;
    for key in keys {
        let subtree = super::class::subtree(key);
        if !super::filter::included(rec.filter.as_ref(), &mm, &subtree) {
            let mount = mm.by_subtree.get(&subtree).map_or(subtree.as_str(), |m| m);
            return Err(ApiError::Forbidden(format!(
                "this request would change the data of {mount}, which is not replicated to \
                 performance secondary {:?} (left out by its paths filter): a primary applies \
                 a secondary's requests only to the data replicated to it; nothing was applied",
                on.secondary_id
            )));
        }
    }
    Ok(())
}

/// Primary: the answer to the secondary for its request's response.
pub(crate) fn peer_answer(r: Response) -> PeerAnswer {
    let body = match (r.body, r.raw) {
        (Some(b), _) => Some(b),
        (None, Some((_, bytes))) => Some(serde_json::Value::String(
            String::from_utf8_lossy(&bytes).into_owned(),
        )),
        (None, None) => None,
    };
    PeerAnswer::Forwarded {
        status: r.status,
        body,
        index: r.index,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forwarded_request_keeps_what_the_primary_needs_and_takes_no_secondary_id() {
        let mut r = Request::new(9, Method::Put, "ns1/secret/a");
        r.namespace = Some("ns1".into());
        r.body = vec![b'{', 0, 255, b'}'];
        r.query = vec![("x".into(), "1".into())];
        r.token = Some("s.secret-token".into());
        let caller = OnBehalf {
            policies: vec!["writer".into()],
            accessor: "acc".into(),
            secondary_id: "forged".into(),
            ..OnBehalf::default()
        };
        let f = ForwardedRequest::of(&r, caller.clone());
        let wire = serde_json::to_string(&f).expect("json");
        assert!(!wire.contains("s.secret-token"), "the token left: {wire}");
        let back: ForwardedRequest = serde_json::from_str(&wire).expect("json");
        let mut vouched = back.caller.clone();
        vouched.secondary_id = "perf-1".into();
        let run = back.into_request(ID_BASE | 4, vouched).expect("request");
        assert_eq!(run.id, ID_BASE | 4);
        assert_eq!(
            (run.method, run.path.as_str(), run.namespace.as_deref()),
            (Method::Put, "ns1/secret/a", Some("ns1"))
        );
        assert_eq!((&run.body, &run.query), (&r.body, &r.query));
        assert_eq!(run.token, None);
        let on = run.on_behalf.expect("caller");
        assert_eq!(on.secondary_id, "perf-1");
        assert_eq!(on.policies, caller.policies);
    }

    #[test]
    fn failures_name_the_primary_and_keep_its_answer_otherwise() {
        let ok = client_answer(
            3,
            "p:8201",
            Ok(PeerAnswer::Forwarded {
                status: 204,
                body: None,
                index: Some("idx".into()),
            }),
        );
        assert_eq!(
            (ok.id, ok.status, ok.index.as_deref()),
            (3, 204, Some("idx"))
        );
        let down = client_answer(3, "p:8201", Err("connection refused".into()));
        assert_eq!(down.status, 502);
        assert!(down.body.expect("body").to_string().contains("p:8201"));
        let standby = client_answer(
            3,
            "p:8201",
            Ok(PeerAnswer::Error {
                code: super::super::STANDBY_CODE.into(),
                message: "standby".into(),
            }),
        );
        assert_eq!(standby.status, 503);
    }
}
