//! A standby's forward route: the plain data a driver needs to forward a client's request
//! to the active node itself, without a round trip through the node (where to, the cluster
//! CA to pin, the key forwards are signed with, the lease epoch the active node was learnt
//! under). The node publishes it with `Output::ForwardRoute` whenever it changes; the one
//! decision whether a request is forwarded and its signature are here ([`sign`]), used by
//! the node's own forwarding path and by the driver's. How the active node's refusal of a
//! forward looks ([`is_refusal`]) lets the driver fall back to the node's path, which
//! then looks for the active node again.

use super::replay::Stamp;
use crate::api::{ApiError, Request, Response};
use crate::crypto;

/// Where and how a standby forwards requests now.
#[derive(Clone, PartialEq, Eq)]
pub struct ForwardRoute {
    /// The active node's cluster address.
    pub to: String,
    /// The cluster CA (PEM) the active node's cluster listener presents a certificate of.
    /// A cluster without a CA has no route: a standby forwards nothing then.
    pub ca_pem: String,
    /// The client certificate the standby presents to the active node's listener.
    pub client: Option<crate::replication::tls::ClientCert>,
    /// The key forwards are signed with ([`signing_key`]).
    pub signing_key: zeroize::Zeroizing<[u8; 32]>,
    /// The lease epoch of the active node this route leads to.
    pub epoch: u64,
    /// The sender id the driver stamps its forwards along this route with (fresh for every
    /// route published; the driver numbers its forwards from 0: [`super::replay`]).
    pub sender: String,
}

impl std::fmt::Debug for ForwardRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardRoute")
            .field("to", &self.to)
            .field("ca_pem", &"<pem>")
            .field("signing_key", &"<redacted>")
            .field("epoch", &self.epoch)
            .field("sender", &self.sender)
            .finish()
    }
}

/// The key a standby signs forwards with, derived from the barrier key and the seed of the
/// cluster's CA: only a node unsealed with the cluster's keys that reads this cluster's
/// storage has it, and it opens nothing. The CA seed is cluster-local, so a performance
/// secondary, which holds its primary's barrier key, cannot sign a forward to the primary.
/// A cluster without a CA (before its first active node made it, or a DR secondary between
/// its activation wipe and its first sync) has no signing key: no node forwards or takes a
/// forward then.
pub fn signing_key(barrier_key: &[u8; 32], ca_seed: &[u8; 32]) -> [u8; 32] {
    crypto::hmac_sha256(
        barrier_key,
        &[
            &b"cairn ha: forwarded request signing key, cluster CA "[..],
            ca_seed,
        ]
        .concat(),
    )
}

/// What a standby answers while its cluster has no CA: it cannot forward yet.
pub fn no_cluster_ca() -> ApiError {
    ApiError::Unavailable(
        "this node is a standby and its cluster has no CA yet (the active node makes it as it \
         takes over; a DR secondary receives its primary's at its first sync): requests are \
         forwarded once it exists; retry shortly"
            .into(),
    )
}

/// The signature of `req` with `stamp` under `signing_key`.
pub fn mac(signing_key: &[u8; 32], stamp: &Stamp, req: &Request) -> String {
    let mut m = super::forward_message(req);
    m.extend_from_slice(&stamp.signed_bytes());
    hex::encode(crypto::hmac_sha256(signing_key, &m))
}

/// Whether a standby with `route` (its current one; `None` when it forwards nothing now:
/// sealed, active, or no active node known) forwards `req`: every request but the ones a
/// standby answers itself ([`super::served_locally`]), and never one that was itself
/// forwarded here.
pub fn forwards(route: Option<&ForwardRoute>, req: &Request) -> bool {
    route.is_some() && req.forwarded.is_none() && !super::served_locally(&req.path)
}

/// Signs `req` for the active node when it is forwarded along `route` ([`forwards`]), as
/// forward `seq` of `sender`; false (and `req` unchanged) when it is not.
pub fn sign(route: Option<&ForwardRoute>, sender: &str, seq: u64, req: &mut Request) -> bool {
    match route {
        Some(r) if forwards(route, req) => {
            let stamp = Stamp {
                epoch: r.epoch,
                sender: sender.to_string(),
                seq,
            };
            req.forwarded = Some(stamp.render(&mac(&r.signing_key, &stamp, req)));
            true
        }
        _ => false,
    }
}

/// What a node that is not the active one answers a forwarded request (nothing applied).
pub fn not_active() -> ApiError {
    ApiError::Unavailable(
        "this node is not the active node of its cluster any more; retry the request".into(),
    )
}

/// What the active node answers a forward it has already taken (nothing applied again).
pub fn replayed() -> ApiError {
    ApiError::Forbidden(
        "permission denied: this forwarded request was already taken (a replay); nothing was \
         applied again"
            .into(),
    )
}

/// What the active node answers a forward whose stamp is below its sender's window
/// ([`super::replay::Verdict::Stale`]): it may never have been taken, so it is a refusal
/// (nothing applied) that the standby answers by sending the request again, not a replay.
pub fn stale() -> ApiError {
    ApiError::Unavailable(
        "this forwarded request was not taken: its stamp is older than the active node \
         remembers (nothing was applied); retry the request"
            .into(),
    )
}

/// What the active node answers a forward whose signature is not its cluster's (nothing
/// applied).
pub fn bad_signature() -> ApiError {
    ApiError::Forbidden(
        "permission denied: the forwarded request is not signed with this cluster's key".into(),
    )
}

/// Whether `resp` is the receiving node's refusal of a forward ([`not_active`],
/// [`bad_signature`], [`stale`]): nothing of the request was applied there.
pub fn is_refusal(resp: &Response) -> bool {
    [not_active(), bad_signature(), stale()].iter().any(|e| {
        let r = Response::error(resp.id, e);
        r.status == resp.status && r.body == resp.body && resp.raw.is_none()
    })
}

/// The answer to a request whose forward failed with `error` (a 503 that says so).
pub fn failed(id: crate::api::RequestId, error: &str) -> Response {
    Response::error(
        id,
        &ApiError::Unavailable(format!(
            "this node is a standby and the request could not be forwarded to the active \
             node: {error}"
        )),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Method;

    fn route() -> ForwardRoute {
        ForwardRoute {
            to: "10.0.0.1:8201".into(),
            ca_pem: "pem".into(),
            client: None,
            signing_key: zeroize::Zeroizing::new(signing_key(&[7u8; 32], &[1u8; 32])),
            epoch: 3,
            sender: "5e".into(),
        }
    }

    #[test]
    fn a_request_is_signed_as_the_node_signs_it() {
        let r = route();
        let mut req = Request::new(1, Method::Put, "secret/a").with_token("s.t");
        req.body = br#"{"v":1}"#.to_vec();
        assert!(sign(Some(&r), &r.sender, 9, &mut req));
        let mac = req.forwarded.clone().expect("signed");
        let stamp = super::super::forward_mac_ok(&r.signing_key, &req, &mac).expect("valid");
        assert_eq!(
            (stamp.epoch, stamp.sender.as_str(), stamp.seq),
            (3, "5e", 9)
        );
        // Another barrier key, another CA seed, or the barrier key alone (what a performance
        // secondary of this cluster holds) does not make the signature.
        for other in [
            signing_key(&[8u8; 32], &[1u8; 32]),
            signing_key(&[7u8; 32], &[2u8; 32]),
            crypto::hmac_sha256(&[7u8; 32], b"cairn ha: forwarded request signing key"),
        ] {
            assert!(super::super::forward_mac_ok(&other, &req, &mac).is_none());
        }
        // The stamp is signed: another number, sender or epoch breaks the signature.
        let (_, sig) = Stamp::parse(&mac).expect("parses");
        for other in [
            Stamp {
                seq: 10,
                ..stamp.clone()
            },
            Stamp {
                epoch: 4,
                ..stamp.clone()
            },
            Stamp {
                sender: "5f".into(),
                ..stamp.clone()
            },
        ] {
            assert!(
                super::super::forward_mac_ok(&r.signing_key, &req, &other.render(sig)).is_none()
            );
        }
    }

    #[test]
    fn without_a_route_nothing_is_forwarded() {
        // Sealed, active, or no active node known: the node publishes no route.
        let mut req = Request::new(1, Method::Get, "secret/a");
        assert!(!sign(None, "a", 0, &mut req));
        assert!(req.forwarded.is_none());
    }

    #[test]
    fn the_node_local_endpoints_are_not_forwarded() {
        let r = route();
        for p in [
            "sys/health",
            "sys/leader",
            "sys/seal-status",
            "sys/unseal",
            "sys/init",
            "sys/storage/raft/snapshot",
        ] {
            let mut req = Request::new(1, Method::Get, p);
            assert!(!sign(Some(&r), "a", 0, &mut req), "{p}");
            assert!(req.forwarded.is_none(), "{p}");
        }
        let mut req = Request::new(1, Method::Get, "sys/mounts");
        assert!(sign(Some(&r), "a", 0, &mut req));
    }

    #[test]
    fn a_forwarded_request_is_never_forwarded_again() {
        let r = route();
        let mut req = Request::new(1, Method::Get, "secret/a");
        req.forwarded = Some("theirs".into());
        assert!(!sign(Some(&r), "a", 0, &mut req));
        assert_eq!(req.forwarded.as_deref(), Some("theirs"));
    }

    #[test]
    fn only_the_two_refusals_are_refusals() {
        assert!(is_refusal(&Response::error(4, &not_active())));
        assert!(is_refusal(&Response::error(4, &bad_signature())));
        assert!(!is_refusal(&Response::error(
            4,
            &ApiError::PermissionDenied
        )));
        assert!(!is_refusal(&Response::error(
            4,
            &ApiError::Unavailable("retry".into())
        )));
        assert!(!is_refusal(&Response::no_content(4)));
        assert_eq!(failed(9, "x").status, 503);
    }

    #[test]
    fn the_route_does_not_show_its_key() {
        let s = format!("{:?}", route());
        assert!(!s.contains(&format!("{:?}", route().signing_key)));
        assert!(s.contains("10.0.0.1:8201"));
    }
}
