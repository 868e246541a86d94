//! HA on real I/O: the leadership lease on PostgreSQL and request forwarding between the
//! nodes of a cluster.
//!
//! * [`LeaseWorker`]: a thread with its own database connection ([`PgLease`]) that runs the
//!   core's `Output::Lease` operations and hands the outcome back as `Input::Lease`, with the
//!   lease holder and the node registry as the database has them. Every operation is also
//!   the node's echo in the registry (`sys/ha-status`).
//! * Forwarding: a standby's requests are posted once to the active node's cluster
//!   listener (`POST /v1/cluster/forward`), over TLS pinned to the cluster CA (a cluster
//!   without one forwards nothing), and never retried after they were sent: a broken
//!   connection answers the client with a 503 rather than risk applying a write twice. The
//!   active node checks the request's signature (made with a key derived from the barrier
//!   key and the CA's seed) before it runs it. The API worker that read the request posts
//!   it itself along the route the node published ([`RouteSlot`], [`forward_direct`]); the
//!   node's own path
//!   (`Output::Forward`, posted on the cluster pool) takes the requests the worker hands
//!   back (no route, not sent, refused).

use crate::postgres::{Held, PgLease, PgSettings};
use crate::runtime::{Core, Msg};
use cairn_core::api::{Request, Response};
use cairn_core::ha::wire::{WireRequest, WireResponse};
use cairn_core::ha::{Leader, LeaseOp, LeaseOutcome, LeaseResult, Peer};
use cairn_core::Input;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Longest a forward's connection (TCP and TLS handshake) may take before it is tried again:
/// short, because one that hangs never sent the request.
const FORWARD_CONNECT_TIMEOUT: Duration = Duration::from_millis(750);

/// Path of the forwarding endpoint on the cluster listener.
pub const FORWARD_PATH: &str = "/v1/cluster/forward";

/// Who this node is in the registry and the lease.
#[derive(Debug, Clone)]
pub struct Identity {
    pub node_id: String,
    pub api_addr: String,
    pub cluster_addr: String,
    pub version: String,
}

/// The lease thread's handle.
#[derive(Clone)]
pub struct LeaseWorker {
    tx: Sender<LeaseOp>,
}

impl LeaseWorker {
    /// Starts the thread; its results go to the core through `core_tx`.
    pub fn start(
        settings: &PgSettings,
        me: Identity,
        ttl: Duration,
        core_tx: Sender<Msg>,
    ) -> Result<LeaseWorker, String> {
        let mut lease = PgLease::connect(settings)?;
        let (tx, rx) = mpsc::channel::<LeaseOp>();
        std::thread::Builder::new()
            .name("cairn-lease".into())
            .spawn(move || {
                let mut held: Option<Held> = None;
                for op in rx {
                    let r = run_op(&mut lease, &me, ttl, &mut held, op);
                    if core_tx.send(Msg::Input(Input::Lease(r))).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| format!("cannot start the lease thread: {e}"))?;
        Ok(LeaseWorker { tx })
    }

    pub fn submit(&self, op: LeaseOp) {
        let _ = self.tx.send(op);
    }
}

fn run_op(
    lease: &mut PgLease,
    me: &Identity,
    ttl: Duration,
    held: &mut Option<Held>,
    op: LeaseOp,
) -> LeaseResult {
    let outcome = match op {
        LeaseOp::Acquire => {
            match lease.try_acquire(&me.node_id, &me.api_addr, &me.cluster_addr, ttl) {
                Ok(Some(h)) => {
                    let epoch = h.epoch;
                    *held = Some(h);
                    LeaseOutcome::Acquired { epoch }
                }
                Ok(None) => LeaseOutcome::Busy,
                Err(e) => LeaseOutcome::Failed(e.to_string()),
            }
        }
        LeaseOp::Renew { epoch } => match held.as_mut() {
            Some(h) if h.epoch == epoch => match lease.renew(h, ttl) {
                Ok(true) => LeaseOutcome::Renewed,
                Ok(false) => {
                    *held = None;
                    LeaseOutcome::Lost
                }
                Err(e) => LeaseOutcome::Failed(e.to_string()),
            },
            _ => LeaseOutcome::Lost,
        },
        LeaseOp::Release { epoch } => {
            if let Some(h) = held.take().filter(|h| h.epoch == epoch) {
                if let Err(e) = lease.release(&h) {
                    log::warn!("the leadership lease could not be released (it expires): {e}");
                }
            }
            LeaseOutcome::Released
        }
        LeaseOp::Observe => LeaseOutcome::Observed,
    };
    if let Err(e) = lease.echo(&me.node_id, &me.api_addr, &me.cluster_addr, &me.version) {
        log::debug!("HA node registry not updated: {e}");
    }
    let leader = lease.leader().ok().flatten().map(|l| Leader {
        node_id: l.node_id,
        api_addr: l.api_addr,
        cluster_addr: l.cluster_addr,
        epoch: l.epoch,
        since_ms: l.acquired_at_ms.max(0) as u64,
    });
    let nodes = lease
        .nodes()
        .unwrap_or_default()
        .into_iter()
        .map(|n| Peer {
            node_id: n.node_id,
            api_addr: n.api_addr,
            cluster_addr: n.cluster_addr,
            version: n.version,
            last_echo_ms: n.last_echo_ms.max(0) as u64,
        })
        .collect();
    LeaseResult {
        op,
        outcome,
        leader,
        nodes,
    }
}

/// Serves `POST /v1/cluster/forward`: runs the forwarded request on this node (which checks
/// its signature and that it is the active node) and answers with the response.
pub fn serve_forward(body: &[u8], core: &Core) -> (u16, Vec<u8>) {
    let wire: WireRequest = match serde_json::from_slice(body) {
        Ok(w) => w,
        Err(e) => {
            let msg = serde_json::json!({"errors": [format!("malformed forwarded request: {e}")]});
            return (400, msg.to_string().into_bytes());
        }
    };
    let req = match wire.into_request(crate::http::next_request_id()) {
        Ok(r) => r,
        Err(e) => {
            let msg = serde_json::json!({"errors": [format!("malformed forwarded request: {e}")]});
            return (400, msg.to_string().into_bytes());
        }
    };
    let resp = core.request(req);
    let out = serde_json::to_vec(&WireResponse::of(resp)).unwrap_or_default();
    (200, out)
}

/// A standby's route to the active node as the shell uses it: the node's
/// [`cairn_core::ha::route::ForwardRoute`], the agent pinned to its CA and the URL.
pub struct Route {
    route: cairn_core::ha::route::ForwardRoute,
    agent: ureq::Agent,
    url: String,
    /// The next sequence number of the route's sender (`cairn_core::ha::replay`).
    seq: std::sync::atomic::AtomicU64,
}

/// Where the core thread puts the route it last got from the node and API workers read
/// it. Empty while the node forwards nothing (the node's own path then answers the
/// requests the workers hand it).
#[derive(Clone, Default)]
pub struct RouteSlot(Arc<RwLock<Option<Arc<Route>>>>);

impl RouteSlot {
    pub fn get(&self) -> Option<Arc<Route>> {
        self.0.read().ok().and_then(|g| g.clone())
    }

    /// The node published `route`.
    pub fn set(&self, route: Option<cairn_core::ha::route::ForwardRoute>) {
        let next = route.and_then(|r| {
            match crate::cluster::pinned_agent_with(
                &r.ca_pem,
                r.client.as_ref(),
                FORWARD_CONNECT_TIMEOUT,
            ) {
                Ok(agent) => Some(Arc::new(Route {
                    url: format!("https://{}{FORWARD_PATH}", host_of(&r.to)),
                    agent,
                    route: r,
                    seq: std::sync::atomic::AtomicU64::new(0),
                })),
                Err(e) => {
                    log::warn!("requests are forwarded through the core thread: {e}");
                    None
                }
            }
        });
        if let Some(r) = &next {
            log::debug!(
                "forwarding to {} (lease epoch {})",
                r.route.to,
                r.route.epoch
            );
        }
        if let Ok(mut g) = self.0.write() {
            *g = next;
        }
    }
}

/// Answers an API request on a standby that has a route: the decision and the signature
/// are the node's ([`cairn_core::ha::route::sign`]); the request is posted once from this
/// thread on a kept-alive TLS connection, and the active node's answer is the client's.
/// The node's own path takes the request instead when it is not forwarded, when the
/// connection failed before the request was sent, or when the receiving node refused it
/// (not active, not our cluster's signature, or a stamp older than it remembers: nothing was
/// applied there); it is told of
/// every failure, so it looks for the active node again. A request that may have left is
/// never sent again: its client gets a 503.
pub fn forward_direct(route: &Route, mut req: Request, core: &Core) -> Response {
    let seq = route.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if !cairn_core::ha::route::sign(Some(&route.route), &route.route.sender, seq, &mut req) {
        return core.request(req);
    }
    let id = req.id;
    match post_once(&route.agent, &route.url, &req) {
        Ok(resp) if !cairn_core::ha::route::is_refusal(&resp) => resp,
        Ok(resp) => {
            core.input(Input::ForwardFailed {
                reason: format!("{} refused a forward ({})", route.route.to, resp.status),
            });
            req.forwarded = None;
            core.request(req)
        }
        Err(Failure::NotSent(e)) => {
            log::debug!("forwarding to {}: {e}; through the core", route.route.to);
            core.input(Input::ForwardFailed { reason: e });
            req.forwarded = None;
            core.request(req)
        }
        Err(Failure::MaybeSent(e)) => {
            let e = format!("{e} (the request may or may not have been applied)");
            log::warn!(
                "request {id} not forwarded to the active node {}: {e}",
                route.route.to
            );
            core.input(Input::ForwardFailed { reason: e.clone() });
            cairn_core::ha::route::failed(id, &e)
        }
    }
}

/// Posts a standby's request to the active node once, on a thread of the cluster channel's
/// pool; the answer (or why there is none) goes back to the core as `Input::Forwarded`.
pub fn forward(f: cairn_core::node::Forward, tx: Sender<Msg>) {
    crate::cluster::on_pool(move || {
        let id = f.req.id;
        let result = post_forward(&f);
        if let Err(e) = &result {
            log::warn!(
                "request {id} not forwarded to the active node {}: {e}",
                f.to
            );
        }
        let _ = tx.send(Msg::Input(Input::Forwarded { id, result }));
    });
}

fn host_of(to: &str) -> &str {
    to.split("://").last().unwrap_or(to).trim_end_matches('/')
}

/// Why a forward has no answer.
enum Failure {
    /// The connection failed before the request could have been sent.
    NotSent(String),
    /// The request may have been sent (and applied).
    MaybeSent(String),
}

/// One post of `req` to `url`: the active node's answer, or why there is none.
fn post_once(agent: &ureq::Agent, url: &str, req: &Request) -> Result<Response, Failure> {
    let body = serde_json::to_vec(&WireRequest::of(req))
        .map_err(|e| Failure::NotSent(format!("encoding the request: {e}")))?;
    let mut resp = match agent
        .post(url)
        .header("Content-Type", "application/json")
        .send(&body[..])
    {
        Ok(r) => r,
        Err(e) if not_sent(&e) => return Err(Failure::NotSent(e.to_string())),
        Err(e) => return Err(Failure::MaybeSent(e.to_string())),
    };
    let status = resp.status().as_u16();
    let bytes = resp
        .body_mut()
        .with_config()
        .limit(256 << 20)
        .read_to_vec()
        .map_err(|e| Failure::MaybeSent(format!("reading the answer: {e}")))?;
    if status != 200 {
        return Err(Failure::MaybeSent(format!(
            "the active node refused the forwarded request ({status}): {}",
            String::from_utf8_lossy(&bytes)
        )));
    }
    let wire: WireResponse = serde_json::from_slice(&bytes)
        .map_err(|e| Failure::MaybeSent(format!("malformed answer: {e}")))?;
    wire.into_response(req.id).map_err(Failure::MaybeSent)
}

fn post_forward(f: &cairn_core::node::Forward) -> Result<Response, String> {
    let host = host_of(&f.to);
    let agent =
        crate::cluster::pinned_agent_with(&f.ca_pem, f.client.as_ref(), FORWARD_CONNECT_TIMEOUT)?;
    let url = format!("https://{host}{FORWARD_PATH}");
    // A connection that fails before the request could be sent (refused, or no TLS
    // handshake: an active node that has no certificate yet) is tried again; once the
    // request may have been sent it never is.
    let mut attempt = 0;
    loop {
        attempt += 1;
        match post_once(&agent, &url, &f.req) {
            Err(Failure::NotSent(e)) if attempt < 4 => {
                log::debug!("forwarding to {host}: {e}; connecting again");
                std::thread::sleep(Duration::from_millis(100 * attempt));
            }
            Err(Failure::NotSent(e)) => return Err(format!("{e} (the request was not sent)")),
            Err(Failure::MaybeSent(e)) => {
                return Err(format!(
                    "{e} (the request may or may not have been applied)"
                ))
            }
            Ok(r) => return Ok(r),
        }
    }
}

/// Whether the call failed before its request could have left: while connecting.
fn not_sent(e: &ureq::Error) -> bool {
    use ureq::Error;
    // Refused connects, failed TLS handshakes and the like are marked by the agents'
    // connector; resolving a name and the connect time limit come before it.
    crate::connecting::while_connecting(e)
        || matches!(
            e,
            Error::HostNotFound | Error::Timeout(ureq::Timeout::Connect | ureq::Timeout::Resolve)
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_forward_is_refused_with_400() {
        let (tx, _rx) = mpsc::channel();
        let core = Core::from_sender(tx);
        let (status, body) = serve_forward(b"{not json", &core);
        assert_eq!(status, 400);
        assert!(String::from_utf8_lossy(&body).contains("malformed forwarded request"));
    }
}
