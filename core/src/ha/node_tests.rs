//! Two nodes of one HA cluster over a shared [`LeaseStore`], driven by hand: leadership,
//! forwarding, signatures, fencing of a paused active node, step-down.

use super::route::{self, ForwardRoute};
use super::store::{LeaseStore, NodeIdentity, SharedStorage};
use super::{Fence, HaConfig, LeaseOp};
use crate::api::{Method, Request, Response};
use crate::node::{Forward, Input, Node, NodeConfig, Output};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::rc::Rc;

mod ca;

struct Cluster {
    store: Rc<RefCell<LeaseStore>>,
    nodes: Vec<Node<SharedStorage>>,
    next_id: u64,
    /// Every forward route each node published, in order.
    routes: Vec<Vec<Option<ForwardRoute>>>,
}

fn cfg(i: usize) -> HaConfig {
    let mut c = HaConfig::new(
        &format!("http://10.0.0.{i}:8200"),
        &format!("10.0.0.{i}:8201"),
    );
    c.lease_ttl_ms = 10_000;
    c
}

fn identity(n: &Node<SharedStorage>) -> NodeIdentity {
    let c = n.config();
    let ha = c.ha.clone().unwrap_or_else(|| cfg(0));
    NodeIdentity {
        node_id: c.node_id.clone(),
        api_addr: ha.api_addr,
        cluster_addr: ha.cluster_addr,
        version: c.version.clone(),
    }
}

impl Cluster {
    fn new(n: usize) -> Cluster {
        Cluster::seeded(n, 0)
    }

    /// `n` nodes whose random generators are seeded `base + 1`, `base + 2`, ...
    fn seeded(n: usize, base: u8) -> Cluster {
        let store = Rc::new(RefCell::new(LeaseStore::new()));
        let nodes = (1..=n)
            .map(|i| {
                let config = NodeConfig {
                    node_id: format!("node-{i}"),
                    ha: Some(cfg(i)),
                    ..Default::default()
                };
                Node::new(
                    SharedStorage::new(store.clone()),
                    [base.wrapping_add(i as u8); 32],
                    config,
                )
            })
            .collect();
        Cluster {
            store,
            routes: vec![Vec::new(); n],
            nodes,
            next_id: 100,
        }
    }

    /// Hands `input` to node `i` at `now`, runs its lease operations against the store
    /// at once, commits its writes under its fence; returns the other outputs and whether
    /// the commit went through.
    fn step(&mut self, i: usize, now: u64, input: Input) -> (Vec<Output>, bool) {
        let n = &mut self.nodes[i];
        n.handle(now, input);
        let mut out = Vec::new();
        while let Some(o) = n.poll_output() {
            match o {
                Output::Lease(op) => {
                    let ttl = n.config().ha.as_ref().map_or(10_000, |c| c.lease_ttl_ms);
                    let r = self.store.borrow_mut().lease_op(now, &identity(n), op, ttl);
                    n.handle(now, Input::Lease(r));
                }
                Output::ForwardRoute(r) => self.routes[i].push(r),
                o => out.push(o),
            }
        }
        let fence = n.fence();
        let ok = n.storage_mut().commit(fence).is_ok();
        if !ok {
            n.storage_rolled_back();
        }
        (out, ok)
    }

    fn request(&mut self, i: usize, now: u64, mut req: Request) -> (Vec<Output>, bool) {
        self.next_id += 1;
        req.id = self.next_id;
        self.step(i, now, Input::Request(req))
    }

    fn tick(&mut self, i: usize, now: u64) {
        self.step(i, now, Input::Tick);
    }
}

fn response(out: &[Output]) -> Option<&Response> {
    out.iter().find_map(|o| match o {
        Output::Response(r) => Some(r),
        _ => None,
    })
}

fn forward(out: &[Output]) -> Option<&Forward> {
    out.iter().find_map(|o| match o {
        Output::Forward(f) => Some(f),
        _ => None,
    })
}

fn body(r: &Response) -> Value {
    r.body.clone().unwrap_or(Value::Null)
}

/// An initialised cluster of `n` nodes, all unsealed, node 0 active; the root token.
fn unsealed(n: usize) -> (Cluster, String) {
    let (c, root, _) = unsealed_with_key(n, 0);
    (c, root)
}

/// [`unsealed`] with the nodes' generators seeded from `seed_base` (clusters of different
/// bases have different keys); also the cluster's unseal key.
fn unsealed_with_key(n: usize, seed_base: u8) -> (Cluster, String, String) {
    let mut c = Cluster::seeded(n, seed_base);
    let (out, ok) = c.request(
        0,
        1_000,
        Request::new(0, Method::Put, "sys/init")
            .with_json(json!({"secret_shares": 1, "secret_threshold": 1})),
    );
    assert!(ok);
    let init = body(response(&out).expect("init answer"));
    let key = init["keys"][0].as_str().expect("key").to_string();
    let root = init["root_token"].as_str().expect("root").to_string();
    for i in 0..n {
        let (out, _) = c.request(
            i,
            1_100,
            Request::new(0, Method::Put, "sys/unseal").with_json(json!({ "key": key })),
        );
        assert_eq!(
            body(response(&out).expect("unseal"))["sealed"],
            json!(false)
        );
    }
    c.tick(0, 2_000);
    assert_eq!(c.nodes[0].fence(), Fence::Epoch(1));
    for i in 1..n {
        c.tick(i, 2_100);
        assert_eq!(c.nodes[i].fence(), Fence::Standby);
    }
    // The active mounts a KV engine (written under its epoch).
    let (out, ok) = c.request(
        0,
        2_200,
        Request::new(0, Method::Post, "sys/mounts/kv")
            .with_token(&root)
            .with_json(json!({"type": "kv"})),
    );
    assert!(ok);
    assert_eq!(response(&out).map(|r| r.status), Some(204));
    (c, root, key)
}

/// Readers beside a node answer from storage alone; an HA node (active or standby) shares
/// its storage with other writers, so neither hands out a view.
#[test]
fn no_node_of_an_ha_cluster_gives_readers_a_view() {
    let (c, _) = unsealed(2);
    assert!(!c.nodes[0].is_sealed() && !c.nodes[1].is_sealed());
    assert!(c.nodes.iter().all(|n| n.read_view().is_none()));
}

#[test]
fn one_node_is_active_and_a_standby_forwards_what_it_does_not_serve() {
    let (mut c, root) = unsealed(3);
    // The standby's health and leader answers are its own.
    let (out, _) = c.request(1, 3_000, Request::new(0, Method::Get, "sys/health"));
    let r = response(&out).expect("health");
    assert_eq!(r.status, 429);
    assert_eq!(body(r)["standby"], json!(true));
    let mut h = Request::new(0, Method::Get, "sys/health");
    h.query = vec![("standbyok".into(), "true".into())];
    let (out, _) = c.request(1, 3_000, h);
    assert_eq!(response(&out).map(|r| r.status), Some(200));
    let (out, _) = c.request(1, 3_000, Request::new(0, Method::Get, "sys/leader"));
    let l = body(response(&out).expect("leader"));
    assert_eq!(l["ha_enabled"], json!(true));
    assert_eq!(l["is_self"], json!(false));
    assert_eq!(l["leader_address"], json!("http://10.0.0.1:8200"));
    assert_eq!(l["leader_cluster_address"], json!("https://10.0.0.1:8201"));
    let (out, _) = c.request(0, 3_000, Request::new(0, Method::Get, "sys/leader"));
    assert_eq!(
        body(response(&out).expect("leader"))["is_self"],
        json!(true)
    );

    // A write through the standby: forwarded, signed, applied once by the active.
    let (out, ok) = c.request(
        1,
        3_100,
        Request::new(0, Method::Put, "kv/a")
            .with_token(&root)
            .with_json(json!({"v": 1})),
    );
    assert!(ok, "the standby writes nothing itself");
    assert!(response(&out).is_none(), "answered only by the active");
    let f = forward(&out).expect("forwarded").clone();
    assert_eq!(f.to, "10.0.0.1:8201");
    let standby_id = f.req.id;
    let (aout, ok) = c.step(0, 3_110, Input::Request(f.req.clone()));
    assert!(ok);
    let answer = response(&aout).expect("active's answer").clone();
    assert_eq!(answer.status, 204);
    let (out, _) = c.step(
        1,
        3_120,
        Input::Forwarded {
            id: standby_id,
            result: Ok(answer),
        },
    );
    let r = response(&out).expect("the standby's answer");
    assert_eq!((r.id, r.status), (standby_id, 204));

    // A read through another standby sees it.
    let (out, _) = c.request(
        2,
        3_200,
        Request::new(0, Method::Get, "kv/a").with_token(&root),
    );
    let f = forward(&out).expect("forwarded").clone();
    let (aout, _) = c.step(0, 3_210, Input::Request(f.req.clone()));
    assert_eq!(
        body(response(&aout).expect("read"))["data"],
        json!({"v": 1})
    );

    // A forwarded request whose signature does not match is refused, and so is one sent
    // to a standby (never passed on twice).
    let mut forged = f.clone();
    forged.req.path = "kv/b".into();
    forged.req.method = Method::Put;
    let (aout, _) = c.step(0, 3_300, Input::Request(forged.req.clone()));
    assert_eq!(response(&aout).map(|r| r.status), Some(403));
    let mut to_standby = f.req.clone();
    to_standby.id = 999;
    let (sout, _) = c.step(2, 3_300, Input::Request(to_standby));
    assert_eq!(response(&sout).map(|r| r.status), Some(503));
    assert!(forward(&sout).is_none());
}

/// A forward is taken once: sent again (a replay of a captured forward, or of one
/// whose answer was lost), it is refused and applies nothing; and only the active node of
/// the epoch it was stamped for takes it, so a forward captured under one active node is
/// refused by the next one.
#[test]
fn a_forward_is_taken_once_and_only_in_the_epoch_it_was_stamped_for() {
    let (mut c, root) = unsealed(3);
    let put = |v: i64| {
        Request::new(0, Method::Put, "kv/r")
            .with_token(&root)
            .with_json(json!({ "v": v }))
    };
    let (out, _) = c.request(1, 3_000, put(1));
    let first = forward(&out).expect("forwarded").clone();
    let (aout, ok) = c.step(0, 3_010, Input::Request(first.req.clone()));
    assert!(ok);
    assert_eq!(response(&aout).map(|r| r.status), Some(204));
    let (out, _) = c.request(1, 3_020, put(2));
    let second = forward(&out).expect("forwarded").clone();
    assert_ne!(
        first.req.forwarded, second.req.forwarded,
        "each forward has its own stamp"
    );
    let (aout, _) = c.step(0, 3_030, Input::Request(second.req.clone()));
    assert_eq!(response(&aout).map(|r| r.status), Some(204));

    // The first write, replayed: refused, and the value stays the second write's.
    let mut replay = first.req.clone();
    replay.id = 500;
    let (aout, _) = c.step(0, 3_040, Input::Request(replay));
    let r = response(&aout).expect("refused").clone();
    assert_eq!(r.status, 403);
    assert!(
        body(&r).to_string().contains("already taken"),
        "{:?}",
        body(&r)
    );
    let (out, _) = c.request(
        0,
        3_050,
        Request::new(0, Method::Get, "kv/r").with_token(&root),
    );
    assert_eq!(body(response(&out).expect("read"))["data"], json!({"v": 2}));

    // A stamp of another epoch: the active node changes (step-down), and the new one
    // refuses a forward made for the old one as a forward to a node that is not active
    // (503: nothing applied, the standby looks for the active node again).
    let (out, ok) = c.request(
        0,
        3_100,
        Request::new(0, Method::Put, "sys/step-down").with_token(&root),
    );
    assert!(ok);
    assert_eq!(response(&out).map(|r| r.status), Some(204));
    c.tick(1, 3_600);
    assert!(matches!(c.nodes[1].fence(), Fence::Epoch(_)));
    let (out, _) = c.request(2, 3_700, put(3));
    let stale = forward(&out).expect("forwarded").clone();
    let mut stale_req = stale.req.clone();
    stale_req.id = 501;
    let (aout, _) = c.step(1, 3_710, Input::Request(stale_req));
    assert_eq!(response(&aout).map(|r| r.status), Some(503));
    let (out, _) = c.request(
        1,
        3_720,
        Request::new(0, Method::Get, "kv/r").with_token(&root),
    );
    assert_eq!(body(response(&out).expect("read"))["data"], json!({"v": 2}));
}

/// A forward overtaken on its way by more than a window of its sender's later ones (a slow
/// connect, a large body) was never taken: the active node refuses it as a refusal the
/// standby's driver answers by sending the request again (503, nothing applied), never as a
/// replay, whose 403 would reach a client whose request was not applied. A forward that was
/// taken and falls below the window is refused the same way, and applies nothing either.
#[test]
fn a_forward_overtaken_by_a_window_of_later_ones_is_sent_again_not_refused_as_a_replay() {
    let (mut c, root) = unsealed(3);
    let r = c.routes[1]
        .last()
        .cloned()
        .flatten()
        .expect("the standby's route");
    let signed = |seq: u64, req: Request| {
        let mut q = req;
        assert!(route::sign(Some(&r), &r.sender, seq, &mut q));
        q
    };
    let put = |id: u64, v: i64| {
        let mut q = Request::new(0, Method::Put, "kv/late")
            .with_token(&root)
            .with_json(json!({ "v": v }));
        q.id = id;
        q
    };
    // Forward 0 is held up; forwards 1 to WINDOW + 1 (a write, then reads) reach the
    // active node first.
    let late = signed(0, put(9_000, 1));
    let taken = signed(1, put(9_001, 2));
    let (aout, ok) = c.step(0, 3_000, Input::Request(taken.clone()));
    assert!(ok);
    assert_eq!(response(&aout).map(|r| r.status), Some(204));
    let mut last = None;
    for seq in 2..=super::replay::WINDOW + 1 {
        let mut q = Request::new(0, Method::Get, "sys/mounts").with_token(&root);
        q.id = 10_000 + seq;
        let q = signed(seq, q);
        let (aout, _) = c.step(0, 3_000, Input::Request(q.clone()));
        assert_eq!(response(&aout).map(|r| r.status), Some(200), "{seq}");
        last = Some(q);
    }
    // One within the window sent again is a replay (403).
    let (aout, _) = c.step(0, 3_005, Input::Request(last.expect("sent")));
    assert_eq!(response(&aout).map(|r| r.status), Some(403));
    let (aout, _) = c.step(0, 3_010, Input::Request(late));
    let refused = response(&aout).expect("answered").clone();
    assert!(
        route::is_refusal(&refused),
        "the late forward is one its standby sends again: {} {:?}",
        refused.status,
        body(&refused)
    );
    assert_eq!(refused.status, 503);
    // The taken forward, sent again now that it is below the window: refused, not applied.
    let mut again = taken;
    again.id = 9_002;
    let (aout, _) = c.step(0, 3_020, Input::Request(again));
    assert!(route::is_refusal(response(&aout).expect("refused")));
    let (out, _) = c.request(
        0,
        3_030,
        Request::new(0, Method::Get, "kv/late").with_token(&root),
    );
    assert_eq!(body(response(&out).expect("read"))["data"], json!({"v": 2}));
    // The standby sends the late request again along its own path, stamped afresh: taken.
    let (out, _) = c.request(1, 3_040, put(0, 3));
    let resent = forward(&out).expect("forwarded").clone();
    let (aout, ok) = c.step(0, 3_050, Input::Request(resent.req));
    assert!(ok);
    assert_eq!(response(&aout).map(|r| r.status), Some(204));
}

#[test]
fn a_paused_active_node_commits_nothing_after_another_took_over() {
    let (mut c, root) = unsealed(2);
    // Node 0 is paused past its lease (no ticks); node 1 takes the lease.
    c.tick(1, 13_000);
    assert_eq!(c.nodes[1].fence(), Fence::Epoch(2));
    // Node 0 resumes with a write in the same batch as its first tick: the store refuses
    // the batch, and the write is not there.
    let before = c.store.borrow().data.clone();
    let (out, ok) = c.request(
        0,
        13_100,
        Request::new(0, Method::Put, "kv/late")
            .with_token(&root)
            .with_json(json!({"v": 1})),
    );
    // The request ran under epoch 1 (its tick had not come yet); the driver answers it
    // with the commit's error, never with the handler's success.
    assert!(!ok, "the deposed node's batch must be refused");
    assert!(response(&out).is_some());
    assert_eq!(c.store.borrow().data, before);
    // Its next tick steps it down; then it forwards to the new active.
    c.tick(0, 13_200);
    assert_eq!(c.nodes[0].fence(), Fence::Standby);
    c.tick(0, 13_800);
    let (out, _) = c.request(
        0,
        14_000,
        Request::new(0, Method::Get, "kv/late").with_token(&root),
    );
    assert_eq!(forward(&out).map(|f| f.to.as_str()), Some("10.0.0.2:8201"));
}

#[test]
fn step_down_hands_the_lease_over() {
    let (mut c, root) = unsealed(2);
    let (out, ok) = c.request(
        0,
        3_000,
        Request::new(0, Method::Put, "sys/step-down").with_token(&root),
    );
    assert!(ok);
    assert_eq!(response(&out).map(|r| r.status), Some(204));
    assert_eq!(c.nodes[0].fence(), Fence::Standby);
    assert!(out.iter().any(|o| matches!(o, Output::HaRole(None))));
    c.tick(1, 3_600);
    // The release moved the epoch on (2), the take-over again (3).
    assert_eq!(c.nodes[1].fence(), Fence::Epoch(3));
    // The node that stepped down leaves the lease alone for a while.
    c.tick(0, 4_000);
    assert_eq!(c.nodes[0].fence(), Fence::Standby);
    let (out, _) = c.request(
        1,
        4_100,
        Request::new(0, Method::Get, "sys/ha-status").with_token(&root),
    );
    let nodes = body(response(&out).expect("ha-status"))["nodes"].clone();
    let nodes = nodes.as_array().cloned().unwrap_or_default();
    assert_eq!(nodes.len(), 2);
    assert_eq!(
        nodes
            .iter()
            .filter(|n| n["active_node"] == json!(true))
            .count(),
        1
    );
    assert!(matches!(
        c.nodes[0].poll_output(),
        None | Some(Output::Lease(LeaseOp::Acquire))
    ));
}

/// `sys/ha-status` answers as the reference does (tests/tests/ha_differential.rs): the
/// standard envelope with the nodes in `data` and again at the top level, each node with
/// its `version` and `upgrade_version`, the active node first (here node 1, after node 0
/// stepped down).
#[test]
fn ha_status_answers_the_envelope_with_the_nodes_at_the_top_level_too() {
    let (mut c, root) = unsealed(2);
    let (out, _) = c.request(
        0,
        3_000,
        Request::new(0, Method::Put, "sys/step-down").with_token(&root),
    );
    assert_eq!(response(&out).map(|r| r.status), Some(204));
    c.tick(1, 3_600);
    assert_eq!(c.nodes[1].fence(), Fence::Epoch(3));
    let (out, _) = c.request(
        1,
        4_100,
        Request::new(0, Method::Get, "sys/ha-status").with_token(&root),
    );
    let r = response(&out).expect("ha-status");
    assert_eq!(r.status, 200);
    let b = body(r);
    assert!(b["request_id"].is_string(), "{b}");
    assert_eq!(b["auth"], Value::Null);
    let nodes = b["data"]["nodes"].as_array().cloned().unwrap_or_default();
    assert_eq!(nodes.len(), 2, "{b}");
    assert_eq!(b["nodes"], b["data"]["nodes"]);
    assert_eq!(
        nodes[0]["active_node"],
        json!(true),
        "the active node first: {b}"
    );
    for n in &nodes {
        assert!(n["version"].is_string(), "{n}");
        assert_eq!(n["upgrade_version"], n["version"], "{n}");
    }
}

#[test]
fn a_sealed_standby_answers_sealed_and_forwards_nothing() {
    let mut c = Cluster::new(2);
    let (out, _) = c.request(1, 1_000, Request::new(0, Method::Get, "kv/a"));
    assert_eq!(response(&out).map(|r| r.status), Some(503));
    assert!(forward(&out).is_none());
}

/// The active node's Merkle trees equal trees rebuilt from the cluster's storage, after
/// writes made on it and through standbys, and after the lease moves (so secondaries, whose
/// trees follow the data, agree with the primary's roots).
#[test]
fn the_active_nodes_trees_follow_the_shared_storage() {
    use crate::replication::reindex::rebuild_for_tests;
    let (mut c, root) = unsealed(3);
    let check = |c: &Cluster, i: usize, when: &str| {
        let n = &c.nodes[i];
        let fresh = rebuild_for_tests(n.storage(), n.replication());
        let diff = n.replication().trees.differing_buckets(&fresh);
        let keys: Vec<String> = diff
            .iter()
            .flat_map(|(sub, b)| {
                crate::storage::Storage::scan(n.storage(), "")
                    .unwrap_or_default()
                    .into_iter()
                    .filter(move |(k, _)| {
                        crate::replication::merkle::bucket_index(k) == *b
                            && crate::replication::class::subtree(k) == sub.1
                    })
                    .map(|(k, _)| k)
            })
            .collect();
        assert!(
            n.replication().trees == fresh,
            "node {i}'s trees differ from its storage {when}: {diff:?} keys {keys:?}"
        );
    };
    check(&c, 0, "after the first mount");
    for k in 0..5u64 {
        let (out, ok) = c.request(
            0,
            3_000 + k,
            Request::new(0, Method::Put, &format!("kv/a{k}"))
                .with_token(&root)
                .with_json(json!({"v": k})),
        );
        assert!(ok);
        assert_eq!(response(&out).map(|r| r.status), Some(204));
    }
    check(&c, 0, "after writes on it");
    for i in 1..3 {
        c.tick(i, 4_000);
    }
    c.tick(0, 4_100);
    check(&c, 0, "after the standbys' ticks");
    // The lease moves: node 0 steps down, node 1 takes over.
    let (out, _) = c.request(
        0,
        5_000,
        Request::new(0, Method::Put, "sys/step-down").with_token(&root),
    );
    assert_eq!(response(&out).map(|r| r.status), Some(204));
    c.tick(1, 5_100);
    c.tick(2, 5_100);
    let a = (0..3)
        .find(|&i| matches!(c.nodes[i].fence(), Fence::Epoch(_)))
        .expect("an active node");
    c.tick(a, 5_200);
    check(&c, a, "after it became active");
    let (out, ok) = c.request(
        a,
        5_300,
        Request::new(0, Method::Put, "kv/b")
            .with_token(&root)
            .with_json(json!({"v": 1})),
    );
    assert!(ok);
    assert_eq!(response(&out).map(|r| r.status), Some(204));
    check(&c, a, "after a write on the new active");
}

#[test]
fn a_standby_refuses_snapshots_and_names_the_active_node() {
    let (mut c, root) = unsealed(2);
    for m in [Method::Get, Method::Post] {
        let mut req = Request::new(0, m, "sys/storage/raft/snapshot").with_token(&root);
        req.body = b"CAIRNSNP".to_vec();
        let (out, ok) = c.request(1, 3_000, req);
        assert!(ok, "the standby writes nothing");
        assert!(
            forward(&out).is_none(),
            "{m:?}: answered by the standby itself"
        );
        let r = response(&out).expect("the standby's answer");
        assert_eq!(r.status, 400, "{m:?}: {r:?}");
        let msg = body(r).to_string();
        assert!(
            msg.contains("standby") && msg.contains("http://10.0.0.1:8200"),
            "{msg}"
        );
    }
    // The active node takes one.
    let (out, _) = c.request(
        0,
        3_000,
        Request::new(0, Method::Get, "sys/storage/raft/snapshot").with_token(&root),
    );
    assert_eq!(response(&out).map(|r| r.status), Some(200));
}

/// A standby whose cluster's keyring was replaced under it (its cluster made a replication
/// secondary: the storage now holds another cluster's data and keyring) seals itself, is
/// unsealed again with the new keyring's key shares without a restart, and a node in that
/// state never becomes active with its old key.
#[test]
fn a_standby_whose_keyring_was_replaced_seals_and_unseals_with_the_new_shares() {
    let sealed = |c: &mut Cluster, i: usize, now: u64| {
        let (out, _) = c.request(i, now, Request::new(0, Method::Get, "sys/seal-status"));
        body(response(&out).expect("seal status"))["sealed"].clone()
    };
    let (mut c, _root, _key) = unsealed_with_key(3, 0);
    let (other, other_root, other_key) = unsealed_with_key(1, 100);
    // Nothing changed: the standbys stay unsealed through their lease looks.
    c.tick(1, 2_500);
    assert_eq!(sealed(&mut c, 1, 2_600), json!(false));
    // The storage now holds the other cluster's data (as a secondary's activation leaves it).
    let data = other.store.borrow().data.clone();
    c.store.borrow_mut().data = data;
    for now in (3_000..=6_000).step_by(500) {
        c.tick(0, now);
        c.tick(1, now);
    }
    assert_eq!(
        sealed(&mut c, 1, 6_100),
        json!(true),
        "the standby sealed itself"
    );
    // Unsealed with the new keyring's share, no restart: it forwards again, with the
    // other cluster's root token.
    let (out, _) = c.request(
        1,
        6_200,
        Request::new(0, Method::Put, "sys/unseal").with_json(json!({ "key": other_key })),
    );
    assert_eq!(
        body(response(&out).expect("unseal"))["sealed"],
        json!(false)
    );
    for now in (6_500..=9_000).step_by(500) {
        c.tick(0, now);
        c.tick(1, now);
    }
    assert_eq!(sealed(&mut c, 1, 9_100), json!(false));
    let (out, _) = c.request(
        1,
        9_200,
        Request::new(0, Method::Get, "kv/a").with_token(&other_root),
    );
    assert!(forward(&out).is_some(), "the unsealed standby forwards");
    // Node 2 kept its old key; the active node 0 stops renewing: when node 2 takes the
    // lease it finds it cannot read the data, seals, gives the lease back, writes nothing.
    let before = c.store.borrow().data.clone();
    for now in (20_000..=22_000).step_by(500) {
        c.tick(2, now);
    }
    assert_eq!(sealed(&mut c, 2, 22_100), json!(true));
    assert_ne!(
        c.nodes[2].fence(),
        Fence::Epoch(2),
        "never active with the old key"
    );
    let after = c.store.borrow().data.clone();
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>(),
        "the node with the old key wrote nothing"
    );
}

/// A standby publishes its route to the active node only while it is unsealed and knows
/// the active node; a request signed along it is the node's own forward (the active node
/// runs it); the route follows a change of active node; an active node publishes none.
#[test]
fn a_standby_publishes_its_route_only_unsealed_with_a_known_active_node_and_follows_it() {
    let (mut c, root) = unsealed(3);
    // Sealed, then unsealed without an active node known: no route; then one to node 0.
    let routes = c.routes[1].clone();
    assert_eq!(
        routes.len(),
        1,
        "one route once the active node is known: {routes:?}"
    );
    let r = routes[0].clone().expect("a route");
    assert_eq!((r.to.as_str(), r.epoch), ("10.0.0.1:8201", 1));
    assert!(!r.ca_pem.is_empty(), "pinned to the cluster CA");
    assert!(c.routes[0].is_empty(), "the active node forwards nothing");

    // A write signed along the route is run by the active node, once.
    let mut req = Request::new(0, Method::Put, "kv/r")
        .with_token(&root)
        .with_json(json!({"v": 1}));
    req.id = 4_000;
    assert!(!r.sender.is_empty(), "the route names the driver's sender");
    assert!(route::sign(Some(&r), &r.sender, 0, &mut req));
    let (aout, ok) = c.step(0, 3_000, Input::Request(req.clone()));
    assert!(ok);
    assert_eq!(response(&aout).map(|r| r.status), Some(204));
    // The node's own path signs the same request for the same epoch, under a sender of
    // its own (its numbers never collide with the driver's).
    let mut unsigned = req.clone();
    unsigned.forwarded = None;
    let (out, _) = c.request(1, 3_010, unsigned);
    let own = forward(&out)
        .and_then(|f| f.req.forwarded.clone())
        .expect("signed");
    let (own_stamp, _) = crate::ha::replay::Stamp::parse(&own).expect("a stamp");
    assert_eq!(own_stamp.epoch, 1);
    assert_ne!(own_stamp.sender, r.sender);
    // Signed with another key, or sent to a standby: refused as such (nothing applied).
    // The cluster's barrier key alone is another key: a performance secondary holds its
    // primary's barrier key, but not the primary cluster's CA seed the key is bound to.
    let (barrier_key, seed) = c.nodes[0].forward_key_parts();
    let seed = seed.expect("the active node made the cluster CA");
    assert_eq!(*r.signing_key, route::signing_key(&barrier_key, &seed));
    for (i, key) in [
        route::signing_key(&[9u8; 32], &seed),
        ca::barrier_only_key(&barrier_key),
    ]
    .into_iter()
    .enumerate()
    {
        let mut forged = req.clone();
        let stamp = crate::ha::replay::Stamp {
            epoch: 1,
            sender: r.sender.clone(),
            seq: 1 + i as u64,
        };
        forged.forwarded = Some(stamp.render(&route::mac(&key, &stamp, &req)));
        let (aout, _) = c.step(0, 3_020, Input::Request(forged));
        let refused = response(&aout).expect("refused");
        assert!(route::is_refusal(refused), "{refused:?}");
        assert_eq!(refused.status, 403, "{refused:?}");
    }
    let (sout, _) = c.step(2, 3_030, Input::Request(req.clone()));
    assert!(route::is_refusal(response(&sout).expect("refused")));
    // A client's own error is not a refusal.
    let (out, _) = c.step(
        0,
        3_040,
        Input::Request({
            let mut q = Request::new(4_001, Method::Get, "kv/r").with_token("nope");
            route::sign(Some(&r), &r.sender, 2, &mut q);
            q
        }),
    );
    let denied = response(&out).expect("denied");
    assert_eq!(denied.status, 403);
    assert!(!route::is_refusal(denied));

    // Nothing changed: nothing published again.
    c.tick(1, 3_500);
    assert_eq!(c.routes[1].len(), 1);

    // Node 0 steps down; another takes over: the standbys' routes follow it, the new active
    // node's route is withdrawn, the old active node's is the new one.
    let (_, ok) = c.request(
        0,
        4_000,
        Request::new(0, Method::Put, "sys/step-down").with_token(&root),
    );
    assert!(ok);
    c.tick(1, 4_600);
    c.tick(2, 4_700);
    c.tick(0, 5_000);
    let active = (0..3)
        .find(|&i| matches!(c.nodes[i].fence(), Fence::Epoch(_)))
        .expect("an active node");
    assert_ne!(active, 0);
    assert_eq!(
        c.routes[active].last(),
        Some(&None),
        "withdrawn when active"
    );
    for i in (0..3).filter(|&i| i != active) {
        c.tick(i, 5_600);
        let last = c.routes[i].last().cloned().flatten().expect("a route");
        assert_eq!(last.to, format!("10.0.0.{}:8201", active + 1), "node {i}");
        assert!(last.epoch > 1, "node {i}: {last:?}");
    }
}

/// A token bound to CIDR blocks is checked on the active node against the address of the
/// client that reached the standby (carried in the signed forward), never the standby's:
/// from inside the blocks it works, from outside it is refused; a forward whose address
/// was changed after the standby signed it is refused whole (the address is signed).
#[test]
fn a_forwarded_request_is_checked_against_the_clients_address() {
    let (mut c, root) = unsealed(2);
    let (out, _) = c.request(
        0,
        3_000,
        Request::new(0, Method::Post, "auth/token/roles/bound")
            .with_token(&root)
            .with_json(json!({"token_bound_cidrs": ["192.0.2.0/24"]})),
    );
    assert_eq!(response(&out).map(|r| r.status), Some(204));
    let (out, _) = c.request(
        0,
        3_000,
        Request::new(0, Method::Post, "auth/token/create/bound")
            .with_token(&root)
            .with_json(json!({"policies": ["default"]})),
    );
    let created = body(response(&out).expect("created"));
    let token = created["auth"]["client_token"]
        .as_str()
        .expect("token")
        .to_string();
    // Through the standby (10.0.0.2) from a client inside and one outside the blocks.
    let through_standby = |c: &mut Cluster, now: u64, addr: &str| -> Forward {
        let mut req = Request::new(0, Method::Get, "auth/token/lookup-self").with_token(&token);
        req.remote_addr = addr.into();
        let (out, _) = c.request(1, now, req);
        assert!(
            response(&out).is_none(),
            "the standby answers nothing itself"
        );
        let f = forward(&out).expect("forwarded").clone();
        assert_eq!(f.req.remote_addr, addr, "the client's address travels");
        f
    };
    let inside = through_standby(&mut c, 3_100, "192.0.2.7:40000");
    let (aout, _) = c.step(0, 3_110, Input::Request(inside.req.clone()));
    let r = response(&aout).expect("answer");
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(body(r)["data"]["bound_cidrs"], json!(["192.0.2.0/24"]));

    let outside = through_standby(&mut c, 3_200, "198.51.100.9:40000");
    let (aout, _) = c.step(0, 3_210, Input::Request(outside.req.clone()));
    let r = response(&aout).expect("answer");
    assert_eq!(r.status, 403, "{:?}", r.body);
    assert!(
        !route::is_refusal(r),
        "refused as the token, not as the forward"
    );

    // The standby's own address is not the client's: a forward that claims an address
    // inside the blocks after it was signed is not the standby's forward.
    let mut moved = outside.req.clone();
    moved.remote_addr = "192.0.2.7:40000".into();
    let (aout, _) = c.step(0, 3_300, Input::Request(moved));
    let r = response(&aout).expect("answer");
    assert_eq!(r.status, 403);
    assert!(route::is_refusal(r), "{:?}", r.body);
}
