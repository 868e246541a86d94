//! The cluster CA and the forward signing key bound to it: the active node's listener
//! serves a certificate of the CA, a standby pins it, a cluster without a CA forwards
//! nothing, a missing CA is made on the active node's tick, one brought by replication is
//! served at once, and a sealed node keeps no key.

use super::*;

/// The first active node creates the cluster CA and hands its listener a certificate of it
/// at once (the standbys forward to that listener); a later active node too.
#[test]
fn an_active_node_serves_its_cluster_listener_with_the_cluster_ca() {
    let tls = |out: &[Output]| out.iter().any(|o| matches!(o, Output::ClusterTls(_)));
    let mut c = Cluster::new(2);
    let (out, ok) = c.request(
        0,
        1_000,
        Request::new(0, Method::Put, "sys/init")
            .with_json(json!({"secret_shares": 1, "secret_threshold": 1})),
    );
    assert!(ok);
    let key = body(response(&out).expect("init"))["keys"][0]
        .as_str()
        .expect("key")
        .to_string();
    for i in 0..2 {
        c.request(
            i,
            1_100,
            Request::new(0, Method::Put, "sys/unseal").with_json(json!({ "key": key })),
        );
    }
    let (out, _) = c.step(0, 2_000, Input::Tick);
    assert_eq!(c.nodes[0].fence(), Fence::Epoch(1));
    assert!(
        tls(&out),
        "the first active node announced no listener certificate"
    );
    // Node 0 stops renewing; node 1 takes over and serves the same CA's certificate.
    let (out, _) = c.step(1, 13_000, Input::Tick);
    assert_eq!(c.nodes[1].fence(), Fence::Epoch(2));
    let (more, _) = c.step(1, 13_010, Input::Tick);
    assert!(
        tls(&out) || tls(&more),
        "the new active node announced no listener certificate"
    );
}

/// A standby reads the cluster CA it pins once, not once per forwarded request (its
/// storage reads go to the database), and reads it again after a forward failed.
#[test]
fn a_standby_reads_the_cluster_ca_once_and_again_after_a_failed_forward() {
    let (mut c, root) = unsealed(2);
    let get = |c: &mut Cluster, now: u64| {
        let (out, _) = c.request(
            1,
            now,
            Request::new(0, Method::Get, "kv/a").with_token(&root),
        );
        forward(&out).expect("forwarded").clone()
    };
    let first = get(&mut c, 3_000);
    let pem = first.ca_pem.clone();
    // The cluster's CA is replaced in storage: the standby still pins the one it read,
    // without reading and parsing it again (its signing key follows the stored record).
    let n = &mut c.nodes[0];
    n.replicate_ca([5; 32]).expect("replaced");
    while n.poll_output().is_some() {}
    let fence = n.fence();
    n.storage_mut().commit(fence).expect("committed");
    let second = get(&mut c, 3_100);
    assert_eq!(second.ca_pem, pem);
    // A forward fails: the next one reads the CA again (and pins the new one).
    let (out, _) = c.step(
        1,
        3_200,
        Input::Forwarded {
            id: second.req.id,
            result: Err("connection refused".into()),
        },
    );
    assert_eq!(response(&out).map(|r| r.status), Some(503));
    let third = get(&mut c, 3_300);
    assert_ne!(third.ca_pem, pem, "read again after the failure");
}

/// While its cluster has no CA (a DR secondary between its activation wipe and its first
/// sync, or a CA whose creation failed), no node forwards or takes a forward: a standby
/// answers 503 and sends nothing, and the active node refuses a forward signed with the
/// barrier key alone (all a performance secondary of the cluster could sign with), with
/// nothing applied.
#[test]
fn a_cluster_without_a_ca_forwards_nothing_and_takes_no_forward() {
    let (mut c, root) = unsealed(2);
    remove_ca(&mut c);
    let (out, _) = c.request(
        1,
        3_000,
        Request::new(0, Method::Put, "kv/w")
            .with_token(&root)
            .with_json(json!({"v": 1})),
    );
    assert!(forward(&out).is_none(), "nothing sent");
    let r = response(&out).expect("answered");
    assert_eq!(r.status, 503, "{r:?}");
    assert!(format!("{r:?}").contains("has no CA yet"), "{r:?}");
    let mut forged = Request::new(4_000, Method::Put, "kv/w")
        .with_token(&root)
        .with_json(json!({"v": 1}));
    let stamp = crate::ha::replay::Stamp {
        epoch: 1,
        sender: "ab".into(),
        seq: 0,
    };
    let key = barrier_only_key(&c.nodes[0].forward_key_parts().0);
    forged.forwarded = Some(stamp.render(&route::mac(&key, &stamp, &forged)));
    let (aout, _) = c.step(0, 3_010, Input::Request(forged));
    let refused = response(&aout).expect("refused");
    assert_eq!(refused.status, 403, "{refused:?}");
    assert!(route::is_refusal(refused));
    assert_not_written(&mut c, &root, 3_020, "kv/w");
}

/// `path` reads 404 on the active node 0 at `now`: nothing was applied there.
fn assert_not_written(c: &mut Cluster, root: &str, now: u64, path: &str) {
    let (out, _) = c.request(0, now, Request::new(0, Method::Get, path).with_token(root));
    assert_eq!(
        response(&out).map(|r| r.status),
        Some(404),
        "nothing applied"
    );
}

/// Removes the cluster CA record from the shared store.
fn remove_ca(c: &mut Cluster) {
    let ca = crate::replication::tls::CA_KEY;
    assert!(c.store.borrow().data.contains_key(ca), "the CA is stored");
    c.store.borrow_mut().data.remove(ca);
}

/// The signing key a forward would have from the barrier key alone (the derivation used
/// before the key was bound to the CA seed): what anyone holding the cluster's barrier key,
/// a performance secondary included, can compute.
pub(super) fn barrier_only_key(barrier_key: &[u8; 32]) -> [u8; 32] {
    crate::crypto::hmac_sha256(barrier_key, b"cairn ha: forwarded request signing key")
}

/// An active node whose cluster CA is missing (its creation's commit failed as it took
/// over) makes it on its next periodic tick: the cluster does not stay unable to forward
/// (no CA, no signing key) until another node takes over.
#[test]
fn an_active_node_without_a_cluster_ca_makes_it_on_its_tick() {
    let ca = crate::replication::tls::CA_KEY;
    let (mut c, root) = unsealed(2);
    remove_ca(&mut c);
    let probe = Request::new(0, Method::Get, "kv/a").with_token(&root);
    assert!(
        c.nodes[0].forward_signature(&probe).is_none(),
        "no signing key without a CA"
    );
    // Past the tick interval (1 s), within the lease: the CA is made again, under a new seed.
    c.tick(0, 3_000);
    assert!(
        matches!(c.nodes[0].fence(), Fence::Epoch(_)),
        "still active"
    );
    assert!(
        c.store.borrow().data.contains_key(ca),
        "made again on the tick"
    );
    let (key, seed) = c.nodes[0].forward_key_parts();
    let seed = seed.expect("a seed");
    let sig = c.nodes[0].forward_signature(&probe).expect("signs again");
    assert!(
        crate::ha::forward_mac_ok(&route::signing_key(&key, &seed), &probe, &sig).is_some(),
        "bound to the new seed"
    );
}

/// A cluster CA that arrives by replication while a node is active (a DR secondary's copy
/// of its primary's, synced after its activation wipe) is served by its cluster listener at
/// once: its standbys pin that CA when they forward to it.
#[test]
fn an_active_node_serves_a_cluster_ca_that_replication_brought() {
    let (mut c, _) = unsealed(2);
    let n = &mut c.nodes[0];
    while n.poll_output().is_some() {}
    n.replicate_ca([5; 32]).expect("applied");
    let tls: Vec<_> = std::iter::from_fn(|| n.poll_output())
        .filter_map(|o| match o {
            Output::ClusterTls(t) => Some(t),
            _ => None,
        })
        .collect();
    assert_eq!(tls.len(), 1, "the listener's certificate of the new CA");
    let (_, seed) = n.forward_key_parts();
    assert_eq!(seed, Some([5; 32]));
}

/// A sealed node keeps no forward signing key in memory, nor the copy of the barrier key it
/// was derived from: they go as the barrier's key is zeroed.
#[test]
fn a_sealed_node_keeps_no_forward_key() {
    let (mut c, root) = unsealed(2);
    let (out, _) = c.request(
        1,
        3_000,
        Request::new(0, Method::Put, "kv/s")
            .with_token(&root)
            .with_json(json!({"v": 1})),
    );
    let f = forward(&out).expect("forwarded").req.clone();
    let (aout, _) = c.step(0, 3_010, Input::Request(f));
    assert_eq!(response(&aout).map(|r| r.status), Some(204));
    assert!(
        c.nodes[0].state().forward_key.is_some(),
        "derived to check it"
    );
    let (out, _) = c.request(
        0,
        3_100,
        Request::new(0, Method::Put, "sys/seal").with_token(&root),
    );
    assert_eq!(response(&out).map(|r| r.status), Some(204));
    assert!(c.nodes[0].is_sealed());
    assert!(
        c.nodes[0].state().forward_key.is_none(),
        "dropped as the node sealed"
    );
}

/// The 503 a standby answers while its cluster has no CA reads as one sentence: no run of
/// spaces left in it by a string broken over lines without its continuation.
#[test]
fn the_no_ca_answer_has_no_runs_of_spaces() {
    let r = Response::error(1, &route::no_cluster_ca());
    let text = format!("{:?}", r.body);
    assert!(text.contains("has no CA yet"), "{text}");
    assert!(
        !text.contains("  "),
        "a run of spaces in the answer: {text}"
    );
}

/// The cluster CA is replaced under a standby that published a route (a DR secondary's
/// copy of its primary's arriving after the standby pinned the one made in the window):
/// the driver's forward along the stale route is refused, the driver tells the node
/// (`Input::ForwardFailed`), and the node publishes a route with the new CA and the key
/// bound to its seed, which the active node takes.
#[test]
fn a_standby_publishes_a_route_of_the_new_ca_after_a_refused_forward() {
    let (mut c, root) = unsealed(2);
    let old = c.routes[1].last().cloned().flatten().expect("a route");
    let n = &mut c.nodes[0];
    n.replicate_ca([5; 32]).expect("replaced");
    while n.poll_output().is_some() {}
    let fence = n.fence();
    n.storage_mut().commit(fence).expect("committed");
    let write = |id: u64| {
        let mut r = Request::new(0, Method::Put, "kv/n")
            .with_token(&root)
            .with_json(json!({"v": 1}));
        r.id = id;
        r
    };
    let mut stale = write(5_000);
    assert!(route::sign(Some(&old), &old.sender, 0, &mut stale));
    let (aout, _) = c.step(0, 3_000, Input::Request(stale));
    let refused = response(&aout).expect("refused");
    assert!(route::is_refusal(refused), "{refused:?}");
    let published = c.routes[1].len();
    c.step(
        1,
        3_010,
        Input::ForwardFailed {
            reason: "refused".into(),
        },
    );
    assert_eq!(c.routes[1].len(), published + 1, "a new route published");
    let new = c.routes[1].last().cloned().flatten().expect("a route");
    assert_ne!(new.ca_pem, old.ca_pem, "pinned to the new CA");
    assert_ne!(new.signing_key, old.signing_key, "bound to the new seed");
    let mut fresh = write(5_001);
    assert!(route::sign(Some(&new), &new.sender, 0, &mut fresh));
    let (aout, ok) = c.step(0, 3_020, Input::Request(fresh));
    assert!(ok);
    assert_eq!(response(&aout).map(|r| r.status), Some(204));
}

/// A standby that pinned the cluster CA sees it removed (and the active node refuse its
/// forwards), withdraws its route, and, once the active node made a CA again on its tick,
/// forwards along the node's own path and publishes a route of the new CA: it is not left
/// without a route.
#[test]
fn a_standby_without_a_route_forwards_again_once_the_ca_is_made_again() {
    let (mut c, root) = unsealed(2);
    let old = c.routes[1].last().cloned().flatten().expect("a route");
    remove_ca(&mut c);
    c.step(
        1,
        3_000,
        Input::ForwardFailed {
            reason: "refused".into(),
        },
    );
    assert_eq!(c.routes[1].last(), Some(&None), "withdrawn without a CA");
    let put = |c: &mut Cluster, now: u64| {
        c.request(
            1,
            now,
            Request::new(0, Method::Put, "kv/m")
                .with_token(&root)
                .with_json(json!({"v": 1})),
        )
    };
    let (out, _) = put(&mut c, 3_100);
    assert_eq!(response(&out).map(|r| r.status), Some(503));
    c.tick(0, 4_000);
    let (out, _) = put(&mut c, 4_100);
    let f = forward(&out)
        .expect("forwarded along the node's path")
        .clone();
    assert_ne!(f.ca_pem, old.ca_pem);
    let new = c.routes[1]
        .last()
        .cloned()
        .flatten()
        .expect("a route again");
    assert_eq!(new.ca_pem, f.ca_pem);
    let (aout, ok) = c.step(0, 4_110, Input::Request(f.req));
    assert!(ok);
    assert_eq!(response(&aout).map(|r| r.status), Some(204));
}

/// A standby that cannot read its cluster's storage (the database cut off) says so instead
/// of claiming the cluster has no CA, and sends nothing; the active node in the same state
/// refuses a forward with 503 and applies nothing.
#[test]
fn a_node_that_cannot_read_the_ca_says_so_and_forwards_nothing() {
    let (mut c, root) = unsealed(2);
    let write = || {
        Request::new(0, Method::Put, "kv/u")
            .with_token(&root)
            .with_json(json!({"v": 1}))
    };
    // A signed forward, made while the store could be read.
    let req = write();
    let (out, _) = c.request(1, 3_000, req);
    let signed = forward(&out).expect("forwarded").req.clone();
    c.store.borrow_mut().unreadable = true;
    let req = write();
    let (out, _) = c.request(1, 3_100, req);
    assert!(forward(&out).is_none(), "nothing sent");
    let r = response(&out).expect("answered");
    assert_eq!(r.status, 503, "{r:?}");
    let msg = format!("{r:?}");
    assert!(msg.contains("could not read its cluster's CA"), "{msg}");
    assert!(!msg.contains("no CA yet"), "{msg}");
    let (aout, _) = c.step(0, 3_200, Input::Request(signed.clone()));
    let r = response(&aout).expect("answered");
    assert_eq!(r.status, 503, "{r:?}");
    c.store.borrow_mut().unreadable = false;
    assert_not_written(&mut c, &root, 3_300, "kv/u");
}
