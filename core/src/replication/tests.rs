//! Multi-node tests over an in-memory network: a tiny driver that shuttles `PeerSend` /
//! `PeerResponse` and `HttpCall` / `Response` between bare nodes (the same wiring a
//! simulator needs).

use super::*;
use crate::api::{Method, Request, Response};
use crate::node::{Admin, AdminResult, Input, Node, NodeConfig, Output};
use crate::storage::MemStorage;
use serde_json::{json, Value};
use std::collections::BTreeMap;

struct Net {
    nodes: Vec<Node<MemStorage>>,
    now: Millis,
    next_id: u64,
    /// (node, peer request id) → (caller node, call id)
    peer_calls: BTreeMap<(usize, u64), (usize, u64)>,
    /// (node, api request id) → (caller node, call id)
    http_calls: BTreeMap<(usize, u64), (usize, u64)>,
    responses: BTreeMap<(usize, u64), Response>,
    /// Nodes cut off from the network.
    down: BTreeSet<usize>,
    /// Each node's unseal key (one share).
    keys: Vec<String>,
    /// Key-only WAL entries the nodes keep (`wal::Limits::max_key_entries`).
    key_entries: u64,
    /// Peer requests delivered, by `op`.
    ops: BTreeMap<String, usize>,
    /// Frame bytes of peer requests and answers delivered.
    wire_bytes: usize,
}

fn cfg(i: usize, key_entries: u64) -> NodeConfig {
    NodeConfig {
        node_id: format!("n{i}"),
        replication: ReplicationConfig {
            api_addr: format!("http://api{i}"),
            cluster_addr: format!("cluster{i}"),
            wal: wal::Limits {
                max_entries: 20,
                max_bytes: 1 << 20,
                // Most tests here are about Merkle diff and sync; `catch_up.rs` turns the
                // key-only entries on.
                max_key_entries: key_entries,
            },
            pull_wait_ms: 500,
            fetch_batch: 3,
            sync_window: 12,
            ..Default::default()
        },
        license: crate::license::LicenseState::hosted(),
        ..Default::default()
    }
}

impl Net {
    fn new(n: usize) -> (Net, Vec<String>) {
        Net::with_versions(&vec![""; n])
    }

    /// One node per entry of `versions` (an empty entry: this build's version).
    fn with_versions(versions: &[&str]) -> (Net, Vec<String>) {
        Net::build(versions, 0)
    }

    /// `n` nodes keeping `key_entries` key-only WAL entries.
    fn with_key_entries(n: usize, key_entries: u64) -> (Net, Vec<String>) {
        Net::build(&vec![""; n], key_entries)
    }

    fn build(versions: &[&str], key_entries: u64) -> (Net, Vec<String>) {
        let mut nodes = Vec::new();
        let mut roots = Vec::new();
        let mut keys = Vec::new();
        for (i, v) in versions.iter().enumerate() {
            let mut c = cfg(i, key_entries);
            if !v.is_empty() {
                c.version = v.to_string();
            }
            let mut node = Node::new(MemStorage::new(), [i as u8 + 1; 32], c);
            node.handle(
                1_000,
                Input::Admin {
                    id: 1,
                    cmd: Admin::DevSetup {
                        root_token_id: Some(format!("root{i}")),
                    },
                },
            );
            while let Some(o) = node.poll_output() {
                if let Output::AdminDone {
                    result: Ok(AdminResult::DevSetup(k)),
                    ..
                } = o
                {
                    keys.push(k.keys_base64[0].clone());
                }
            }
            roots.push(format!("root{i}"));
            nodes.push(node);
        }
        (
            Net {
                nodes,
                now: 1_000,
                next_id: 1_000,
                peer_calls: BTreeMap::new(),
                http_calls: BTreeMap::new(),
                responses: BTreeMap::new(),
                down: BTreeSet::new(),
                keys,
                ops: BTreeMap::new(),
                wire_bytes: 0,
                key_entries,
            },
            roots,
        )
    }

    /// Restarts node `i` on its storage running `version`, and unseals it with the key share
    /// of node `key_of` (a secondary's are its primary's).
    fn restart_as(&mut self, i: usize, version: &str, key_of: usize) {
        let mut c = cfg(i, self.key_entries);
        c.version = version.to_string();
        let old = std::mem::replace(
            &mut self.nodes[i],
            Node::new(MemStorage::new(), [0; 32], cfg(i, self.key_entries)),
        );
        self.nodes[i] = Node::new(old.into_storage(), [i as u8 + 101; 32], c);
        // Connections to the old process break: its callers see a reset.
        let broken: Vec<(u64, (usize, u64))> = self
            .peer_calls
            .iter()
            .filter(|((j, _), _)| *j == i)
            .map(|((_, id), v)| (*id, *v))
            .collect();
        for (id, (caller, call_id)) in broken {
            self.peer_calls.remove(&(i, id));
            self.nodes[caller].handle(
                self.now,
                Input::PeerReply(PeerReply {
                    call_id,
                    result: Err("connection reset".into()),
                }),
            );
        }
        let key = self.keys[key_of].clone();
        let r = self.call(i, "", Method::Put, "sys/unseal", json!({ "key": key }));
        assert_eq!(r.status, 200, "unseal after restart: {:?}", r.body);
        self.run_for(1_000);
    }

    fn node_by_cluster(&self, to: &str) -> Option<usize> {
        (0..self.nodes.len()).find(|i| format!("cluster{i}") == to)
    }

    /// Delivers everything until nothing moves (held long polls stay held).
    fn settle(&mut self) {
        self.settle_until(|_| false);
    }

    /// Delivers until nothing moves or, checked after each delivery, `stop` holds (then
    /// true; what was not delivered yet stays with its node).
    fn settle_until(&mut self, stop: impl Fn(&Net) -> bool) -> bool {
        for _ in 0..10_000 {
            let mut moved = false;
            for i in 0..self.nodes.len() {
                while let Some(o) = self.nodes[i].poll_output() {
                    moved = true;
                    self.route(i, o);
                    if stop(self) {
                        return true;
                    }
                }
            }
            if !moved {
                return false;
            }
        }
        panic!("network did not settle");
    }

    fn route(&mut self, i: usize, o: Output) {
        let now = self.now;
        match o {
            Output::Response(r) => {
                if let Some((c, call)) = self.http_calls.remove(&(i, r.id)) {
                    let body = r
                        .body
                        .as_ref()
                        .map(|b| serde_json::to_vec(b).unwrap())
                        .unwrap_or_default();
                    self.nodes[c].handle(
                        now,
                        Input::HttpReply(HttpReply {
                            call_id: call,
                            result: Ok((r.status, body)),
                        }),
                    );
                } else {
                    self.responses.insert((i, r.id), r);
                }
            }
            Output::PeerSend(s) => {
                let target = self.node_by_cluster(&s.to);
                match target {
                    Some(j) if !self.down.contains(&j) && !self.down.contains(&i) => {
                        // Through the wire encoding, as the shell sends it.
                        let op = serde_json::to_value(&s.msg.body).unwrap()["op"]
                            .as_str()
                            .unwrap()
                            .to_string();
                        *self.ops.entry(op).or_default() += 1;
                        let frame = s.msg.into_wire().unwrap();
                        self.wire_bytes += frame.len();
                        let msg = PeerMsg::from_wire(&frame).unwrap();
                        self.next_id += 1;
                        self.peer_calls.insert((j, self.next_id), (i, s.call_id));
                        self.nodes[j].handle(
                            now,
                            Input::PeerRequest(PeerRequest {
                                id: self.next_id,
                                msg,
                            }),
                        );
                    }
                    _ => self.nodes[i].handle(
                        now,
                        Input::PeerReply(PeerReply {
                            call_id: s.call_id,
                            result: Err("connection refused".into()),
                        }),
                    ),
                }
            }
            Output::PeerResponse(r) => {
                if let Some((c, call)) = self.peer_calls.remove(&(i, r.id)) {
                    let result = if self.down.contains(&c) || self.down.contains(&i) {
                        Err("connection reset".into())
                    } else {
                        let frame = r.msg.into_wire().unwrap();
                        self.wire_bytes += frame.len();
                        Ok(PeerAnswer::from_wire(&frame).unwrap())
                    };
                    self.nodes[c].handle(
                        now,
                        Input::PeerReply(PeerReply {
                            call_id: call,
                            result,
                        }),
                    );
                }
            }
            Output::HttpCall(c) => {
                let target =
                    (0..self.nodes.len()).find(|j| c.url.starts_with(&format!("http://api{j}/")));
                let Some(j) = target else {
                    self.nodes[i].handle(
                        now,
                        Input::HttpReply(HttpReply {
                            call_id: c.call_id,
                            result: Err("no route to host".into()),
                        }),
                    );
                    return;
                };
                self.next_id += 1;
                let path = c.url.split("/v1/").nth(1).unwrap_or("").to_string();
                let mut req = Request::new(self.next_id, Method::Post, &path);
                req.body = c.body;
                self.http_calls.insert((j, self.next_id), (i, c.call_id));
                self.nodes[j].handle(now, Input::Request(req));
            }
            _ => {}
        }
    }

    /// Advances time by `ms` in steps, ticking every node and settling.
    fn run_for(&mut self, ms: u64) {
        let end = self.now + ms;
        while self.now < end {
            self.now += 50;
            for i in 0..self.nodes.len() {
                if self.nodes[i].poll_timeout() <= self.now {
                    self.nodes[i].handle(self.now, Input::Tick);
                }
            }
            self.settle();
        }
    }

    fn call(&mut self, i: usize, token: &str, method: Method, path: &str, body: Value) -> Response {
        self.next_id += 1;
        let id = self.next_id;
        let req = Request::new(id, method, path)
            .with_token(token)
            .with_json(body);
        self.send(i, req)
    }

    fn send(&mut self, i: usize, req: Request) -> Response {
        let (id, path) = (req.id, req.path.clone());
        self.nodes[i].handle(self.now, Input::Request(req));
        for _ in 0..100 {
            self.settle();
            if let Some(r) = self.responses.remove(&(i, id)) {
                return r;
            }
            self.run_for(50);
        }
        panic!("no response to {path}");
    }

    fn ok(&mut self, i: usize, token: &str, method: Method, path: &str, body: Value) -> Value {
        let r = self.call(i, token, method, path, body);
        assert!(r.status < 300, "{path} -> {} {:?}", r.status, r.body);
        r.body.unwrap_or(Value::Null)
    }

    fn status(&mut self, i: usize, mode: &str) -> Value {
        self.ok(
            i,
            "",
            Method::Get,
            &format!("sys/replication/{mode}/status"),
            json!({}),
        )["data"]
            .clone()
    }

    /// Makes node `i` a primary of `mode` (`performance` or `dr`).
    fn enable_primary(&mut self, i: usize, token: &str, mode: &str) {
        self.ok(
            i,
            token,
            Method::Post,
            &format!("sys/replication/{mode}/primary/enable"),
            json!({}),
        );
    }

    fn activate(&mut self, p: usize, ptoken: &str, s: usize, stoken: &str, mode: &str, id: &str) {
        let t = self.ok(
            p,
            ptoken,
            Method::Post,
            &format!("sys/replication/{mode}/primary/secondary-token"),
            json!({ "id": id }),
        );
        let tok = t["wrap_info"]["token"].as_str().unwrap().to_string();
        self.ok(
            s,
            stoken,
            Method::Post,
            &format!("sys/replication/{mode}/secondary/enable"),
            json!({ "token": tok }),
        );
    }

    /// Generates a DR operation token on node `i` with the key share of node `key_of`.
    fn dr_token(&mut self, i: usize, key_of: usize) -> String {
        let base = "sys/replication/dr/secondary/generate-operation-token";
        let a = self.ok(i, "", Method::Post, &format!("{base}/attempt"), json!({}));
        let otp = a["otp"].as_str().unwrap().to_string();
        let nonce = a["nonce"].as_str().unwrap().to_string();
        let key = self.keys[key_of].clone();
        let u = self.ok(
            i,
            "",
            Method::Post,
            &format!("{base}/update"),
            json!({"key": key, "nonce": nonce}),
        );
        let enc = u["encoded_token"]
            .as_str()
            .unwrap_or_else(|| panic!("{u}"))
            .to_string();
        dr_token::decode_token(&enc, &otp).unwrap()
    }

    fn data_keys(&self, i: usize, prefix: &str) -> Vec<(String, Vec<u8>)> {
        self.nodes[i].storage().scan(prefix).unwrap()
    }
}

fn kv_mount_uuid(n: &Node<MemStorage>) -> String {
    let keys: Vec<String> = n
        .storage()
        .map
        .keys()
        .filter(|k| k.starts_with("logical/"))
        .cloned()
        .collect();
    class::mount_uuid(&keys[0]).unwrap().to_string()
}

/// Readers beside a node answer from its own storage: a secondary's storage is the
/// primary's copy, which a secondary serves under its own rules (forwarding, filters, the
/// DR secondary's refusals), so a secondary hands out no view; the primary keeps its own.
#[test]
fn a_perf_or_dr_secondary_gives_readers_no_view_and_the_primary_keeps_one() {
    let (mut net, roots) = Net::new(3);
    let r0 = roots[0].clone();
    assert!(net.nodes.iter().all(|n| n.read_view().is_some()));
    net.enable_primary(0, &r0, "performance");
    net.enable_primary(0, &r0, "dr");
    net.activate(0, &r0, 1, &roots[1], "performance", "perf1");
    net.activate(0, &r0, 2, &roots[2], "dr", "dr1");
    net.run_for(2_000);
    assert!(net.nodes[0].read_view().is_some(), "the primary's view");
    assert!(
        net.nodes[1].read_view().is_none(),
        "a performance secondary"
    );
    assert!(net.nodes[2].read_view().is_none(), "a DR secondary");
}

/// A performance secondary holds its primary's barrier key, and the activation wipe takes
/// its own cluster CA away: it makes a CA of its own there, so that its HA cluster can
/// forward at once (a cluster without a CA forwards nothing), with a signing key bound to a
/// seed only its nodes read, not to its barrier key (which the primary and every other
/// performance secondary of it hold too). A DR secondary ends up with its primary's CA
/// (cluster-local data replicates to it).
#[test]
fn a_perf_secondary_has_a_cluster_ca_of_its_own_and_a_dr_secondary_its_primarys() {
    let (mut net, roots) = Net::new(3);
    let r0 = roots[0].clone();
    net.enable_primary(0, &r0, "performance");
    net.enable_primary(0, &r0, "dr");
    let (_, own1) = net.nodes[1].forward_key_parts();
    net.activate(0, &r0, 1, &roots[1], "performance", "perf1");
    net.activate(0, &r0, 2, &roots[2], "dr", "dr1");
    net.run_for(3_000);
    let (k0, s0) = net.nodes[0].forward_key_parts();
    let s0 = s0.expect("the primary's CA");
    let (k1, s1) = net.nodes[1].forward_key_parts();
    assert_eq!(k1, k0, "the perf secondary holds the primary's barrier key");
    let s1 = s1.expect("the perf secondary has a CA of its own");
    assert_ne!(s1, s0);
    assert_ne!(Some(s1), own1, "a fresh one");
    let (k2, s2) = net.nodes[2].forward_key_parts();
    assert_eq!(k2, k0);
    assert_eq!(s2, Some(s0), "the DR secondary holds its primary's CA");
}

#[test]
fn perf_and_dr_secondaries_converge_and_resync_after_retention() {
    let (mut net, roots) = Net::new(3);
    let r0 = roots[0].clone();
    net.ok(0, &r0, Method::Put, "secret/a", json!({"v": 1}));
    net.enable_primary(0, &r0, "performance");
    net.enable_primary(0, &r0, "dr");
    net.activate(0, &r0, 1, &roots[1], "performance", "perf1");
    net.activate(0, &r0, 2, &roots[2], "dr", "dr1");
    net.run_for(2_000);
    let p = net.status(0, "performance");
    let s1 = net.status(1, "performance");
    assert_eq!(s1["mode"], "secondary");
    assert_eq!(s1["state"], "stream-wals", "{s1}");
    assert_eq!(s1["merkle_root"], p["merkle_root"], "{s1} vs {p}");
    let pd = net.status(0, "dr");
    let s2 = net.status(2, "dr");
    assert_eq!(s2["merkle_root"], pd["merkle_root"], "{s2} vs {pd}");
    assert_eq!(s2["cluster_id"], pd["cluster_id"]);
    // Streaming: a new write appears on both.
    net.ok(0, &r0, Method::Put, "secret/b", json!({"v": 2}));
    net.run_for(200);
    let uuid = kv_mount_uuid(&net.nodes[0]);
    let want = net.data_keys(0, &format!("logical/{uuid}/"));
    assert_eq!(want.len(), 2);
    assert_eq!(net.data_keys(1, &format!("logical/{uuid}/")), want);
    assert_eq!(net.data_keys(2, &format!("logical/{uuid}/")), want);
    // Tokens reach the DR secondary only.
    let tok = |n: &Node<MemStorage>| n.storage().scan("sys/token/id/").unwrap();
    assert_eq!(tok(&net.nodes[2]), tok(&net.nodes[0]));
    assert_ne!(tok(&net.nodes[1]), tok(&net.nodes[0]));
    assert_eq!(
        net.status(1, "performance")["last_remote_wal"],
        net.status(0, "performance")["last_wal"]
    );
    // DR secondary refuses client requests.
    let r = net.call(2, &r0, Method::Get, "secret/a", json!({}));
    assert_eq!(r.status, 400);
    assert!(r.body.unwrap().to_string().contains("DR secondary"));
    // The perf secondary is cut off past WAL retention, then resyncs via Merkle diff/sync.
    net.down.insert(1);
    for i in 0..60 {
        net.ok(
            0,
            &r0,
            Method::Put,
            &format!("secret/k{i}"),
            json!({"v": i}),
        );
    }
    net.ok(0, &r0, Method::Delete, "secret/a", json!({}));
    net.run_for(6_000);
    assert_eq!(net.status(1, "performance")["state"], "idle");
    net.down.clear();
    net.run_for(8_000);
    let s1 = net.status(1, "performance");
    let p = net.status(0, "performance");
    assert_eq!(s1["state"], "stream-wals", "{s1}");
    assert_eq!(s1["merkle_root"], p["merkle_root"]);
    assert_eq!(
        net.data_keys(1, &format!("logical/{uuid}/")),
        net.data_keys(0, &format!("logical/{uuid}/"))
    );
    let s2 = net.status(2, "dr");
    assert_eq!(s2["merkle_root"], net.status(0, "dr")["merkle_root"]);
}

#[test]
fn dr_failover_update_primary_and_old_primary_rejoins() {
    let (mut net, roots) = Net::new(3);
    let r0 = roots[0].clone();
    net.ok(0, &r0, Method::Put, "secret/a", json!({"v": 1}));
    net.enable_primary(0, &r0, "performance");
    net.enable_primary(0, &r0, "dr");
    net.activate(0, &r0, 1, &roots[1], "performance", "perf1");
    net.activate(0, &r0, 2, &roots[2], "dr", "dr1");
    net.run_for(2_000);
    let perf_cluster = net.status(0, "performance")["cluster_id"].clone();
    assert_eq!(
        net.status(2, "dr")["merkle_root"],
        net.status(0, "dr")["merkle_root"]
    );
    // The primary is lost; a write it made in isolation never reaches anyone.
    net.down.insert(0);
    net.ok(0, &r0, Method::Put, "secret/lost", json!({"v": 1}));
    // Promote without a DR operation token: refused.
    let r = net.call(
        2,
        "",
        Method::Post,
        "sys/replication/dr/secondary/promote",
        json!({}),
    );
    assert_eq!(r.status, 403, "{:?}", r.body);
    // The DR secondary unseals with the primary's shares: its token comes from key 0.
    let t = net.dr_token(2, 0);
    net.ok(
        2,
        "",
        Method::Post,
        "sys/replication/dr/secondary/promote",
        json!({"dr_operation_token": t}),
    );
    let d2 = net.status(2, "dr");
    assert_eq!(d2["mode"], "primary");
    // Its own record (it was a secondary of the old primary) is not one of its secondaries.
    assert!(
        !d2["known_secondaries"].to_string().contains("\"dr1\""),
        "{d2}"
    );
    // It took over the performance set of its former primary.
    let p2 = net.status(2, "performance");
    assert_eq!(p2["mode"], "primary");
    assert_eq!(p2["cluster_id"], perf_cluster);
    // The perf secondary's own tokens were wiped at activation: it unseals with the
    // primary's shares, so a root token is generated with the primary's key.
    let r = net.call(
        1,
        &roots[1],
        Method::Get,
        "sys/replication/performance/status",
        json!({}),
    );
    assert_eq!(r.status, 200);
    let bad = net.call(
        1,
        &roots[1],
        Method::Post,
        "sys/replication/performance/secondary/update-primary",
        json!({}),
    );
    assert_eq!(bad.status, 403);
    let t1 = generate_root(&mut net, 1, 0);
    net.ok(
        1,
        &t1,
        Method::Post,
        "sys/replication/performance/secondary/update-primary",
        json!({"update_primary_addrs": ["cluster9", "cluster2"]}),
    );
    net.ok(
        2,
        &r0,
        Method::Put,
        "secret/after-failover",
        json!({"v": 2}),
    );
    net.run_for(3_000);
    let s1 = net.status(1, "performance");
    assert_eq!(s1["state"], "stream-wals", "{s1}");
    assert_eq!(s1["known_primary_cluster_addrs"][0], "cluster2");
    assert_eq!(
        s1["merkle_root"],
        net.status(2, "performance")["merkle_root"]
    );
    // The old primary comes back, is demoted in both modes, and rejoins as a DR secondary.
    net.down.clear();
    net.ok(
        0,
        &r0,
        Method::Post,
        "sys/replication/performance/primary/demote",
        json!({}),
    );
    net.ok(
        0,
        &r0,
        Method::Post,
        "sys/replication/dr/primary/demote",
        json!({}),
    );
    assert_eq!(net.status(0, "dr")["mode"], "secondary");
    let tok = net.ok(
        2,
        &r0,
        Method::Post,
        "sys/replication/dr/primary/secondary-token",
        json!({"id": "old-primary"}),
    );
    let tok = tok["wrap_info"]["token"].as_str().unwrap().to_string();
    let t0 = net.dr_token(0, 0);
    net.ok(
        0,
        "",
        Method::Post,
        "sys/replication/dr/secondary/update-primary",
        json!({"dr_operation_token": t0, "token": tok}),
    );
    net.run_for(3_000);
    let s0 = net.status(0, "dr");
    assert_eq!(s0["state"], "stream-wals", "{s0}");
    assert_eq!(s0["merkle_root"], net.status(2, "dr")["merkle_root"]);
    let uuid = kv_mount_uuid(&net.nodes[2]);
    assert_eq!(
        net.data_keys(0, &format!("logical/{uuid}/")),
        net.data_keys(2, &format!("logical/{uuid}/"))
    );
    assert!(!net
        .data_keys(0, &format!("logical/{uuid}/"))
        .iter()
        .any(|(k, _)| k.ends_with("/lost")));
}

/// A root token from `sys/generate-root` with node `key_of`'s key share.
fn generate_root(net: &mut Net, i: usize, key_of: usize) -> String {
    let a = net.ok(i, "", Method::Post, "sys/generate-root/attempt", json!({}));
    let otp = a["otp"].as_str().unwrap().to_string();
    let nonce = a["nonce"].as_str().unwrap().to_string();
    let key = net.keys[key_of].clone();
    let u = net.ok(
        i,
        "",
        Method::Post,
        "sys/generate-root/update",
        json!({"key": key, "nonce": nonce}),
    );
    assert_eq!(u["complete"], true, "{u}");
    dr_token::decode_token(u["encoded_token"].as_str().unwrap(), &otp).unwrap()
}

#[test]
fn dr_secondary_reindex_and_merkle_check_need_the_dr_token_and_heal_corruption() {
    let (mut net, roots) = Net::new(2);
    let r0 = roots[0].clone();
    for i in 0..12 {
        net.ok(
            0,
            &r0,
            Method::Put,
            &format!("secret/k{i}"),
            json!({ "v": i }),
        );
    }
    net.enable_primary(0, &r0, "dr");
    net.activate(0, &r0, 1, &roots[1], "dr", "dr1");
    net.run_for(2_000);
    let root = |net: &mut Net, i: usize| net.status(i, "dr")["merkle_root"].clone();
    assert_eq!(root(&mut net, 0), root(&mut net, 1));
    let base = "sys/replication/dr/secondary";
    // No token, a client token, the wrong path: refused, nothing runs.
    for (path, body, code) in [
        (format!("{base}/reindex"), json!({}), 403),
        (
            format!("{base}/merkle-check"),
            json!({ "dr_operation_token": r0.clone() }),
            403,
        ),
        ("sys/replication/reindex".to_string(), json!({}), 403),
    ] {
        let r = net.call(1, "", Method::Post, &path, body);
        assert_eq!(r.status, code, "{path}: {:?}", r.body);
    }
    assert!(net.nodes[1].replication().scan_progress().is_none());
    let t = net.dr_token(1, 0);
    // Corrupt one replicated value on the DR secondary.
    let uuid = kv_mount_uuid(&net.nodes[0]);
    let key = net.data_keys(1, &format!("logical/{uuid}/"))[3].0.clone();
    let good = net.nodes[0].storage().map[&key].clone();
    let mut bad = good.clone();
    bad[0] ^= 0x55;
    net.nodes[1].storage_mut().map.insert(key.clone(), bad);
    let tok = json!({ "dr_operation_token": t });
    let rep = net.ok(
        1,
        "",
        Method::Post,
        &format!("{base}/merkle-check"),
        tok.clone(),
    );
    let rep = &rep["data"]["merkle_corruption_report"];
    assert_eq!(rep["corrupted_root"], true, "{rep}");
    let (p, s) = merkle::bucket(&key);
    let entry = rep["corrupted_tree_map"]
        .as_object()
        .unwrap()
        .values()
        .next()
        .unwrap();
    assert_eq!(
        entry["corrupted_index_tuples_map"][p.to_string()]["subpages"],
        json!([s]),
        "{rep}"
    );
    assert_eq!(net.status(1, "dr")["corrupted_merkle_tree"], true);
    let w = net.ok(1, "", Method::Post, &format!("{base}/reindex"), tok.clone());
    assert!(w["warnings"].to_string().contains("Merkle diff"), "{w}");
    // The secondary fetches the differing value back from its primary.
    net.run_for(3_000);
    assert_eq!(net.nodes[1].storage().map[&key], good);
    assert_eq!(root(&mut net, 0), root(&mut net, 1));
    let rep = net.ok(1, "", Method::Post, &format!("{base}/merkle-check"), tok);
    assert_eq!(
        rep["data"]["merkle_corruption_report"]["corrupted_root"], false,
        "{rep}"
    );
    assert_eq!(net.status(1, "dr")["corrupted_merkle_tree"], false);
}

#[test]
fn a_writes_index_state_gives_read_after_write_on_a_perf_secondary() {
    use super::index_state::IndexState;
    let (mut net, roots) = Net::new(2);
    let r0 = roots[0].clone();
    let w = net.call(0, &r0, Method::Put, "secret/before", json!({"v": 0}));
    assert_eq!(w.index, None, "no replication, no state");
    net.enable_primary(0, &r0, "performance");
    net.activate(0, &r0, 1, &roots[1], "performance", "perf1");
    net.run_for(2_000);
    let t1 = generate_root(&mut net, 1, 0);
    // Cut the secondary off, then write: the answer carries the primary's state.
    net.down.insert(1);
    let w = net.call(0, &r0, Method::Put, "secret/x", json!({"v": 1}));
    let state = w
        .index
        .clone()
        .expect("a write on a primary returns X-Vault-Index");
    let st = IndexState::decode(&state).unwrap();
    let p = net.status(0, "performance");
    assert_eq!(st.perf_cluster_id, p["cluster_id"].as_str().unwrap());
    assert_eq!(st.dr_cluster_id, "");
    assert_eq!(json!(st.index), p["last_wal"]);
    // Reads return no state; errors neither.
    assert_eq!(
        net.call(0, &r0, Method::Get, "secret/x", json!({})).index,
        None
    );
    let get = |net: &mut Net, header: &str| {
        net.next_id += 1;
        let mut req = Request::new(net.next_id, Method::Get, "secret/x").with_token(&t1);
        req.index = Some(header.to_string());
        net.send(1, req)
    };
    // Not there yet: 412 with a reason; the secondary is unchanged.
    let r = get(&mut net, &state);
    assert_eq!(r.status, 412, "{:?}", r.body);
    let msg = r.body.unwrap().to_string();
    assert!(msg.contains("not yet") && msg.contains("retry"), "{msg}");
    // Garbage is a 400; a state of another cluster is not ours to judge.
    assert_eq!(get(&mut net, "%%%").status, 400);
    let other = IndexState {
        perf_cluster_id: "someone-else".into(),
        dr_cluster_id: String::new(),
        index: 1 << 40,
    };
    assert_eq!(
        get(&mut net, &other.encode()).status,
        404,
        "read goes through (no key yet)"
    );
    // Reconnected and caught up: the same state now passes and the value is there.
    net.down.clear();
    net.run_for(2_000);
    let r = get(&mut net, &state);
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body.unwrap()["data"]["v"], 1);
}

#[test]
fn identity_data_streams_to_perf_and_dr_secondaries() {
    let (mut net, roots) = Net::new(3);
    let r0 = roots[0].clone();
    net.enable_primary(0, &r0, "performance");
    net.enable_primary(0, &r0, "dr");
    net.activate(0, &r0, 1, &roots[1], "performance", "perf1");
    net.activate(0, &r0, 2, &roots[2], "dr", "dr1");
    net.run_for(2_000);
    let e = net.ok(
        0,
        &r0,
        Method::Post,
        "identity/entity",
        json!({"name": "e1", "policies": ["p"]}),
    );
    let id = e["data"]["id"].as_str().unwrap_or_default().to_string();
    assert_eq!(id.len(), 36, "{e}");
    net.ok(
        0,
        &r0,
        Method::Post,
        "identity/group",
        json!({"name": "g", "member_entity_ids": [id]}),
    );
    net.run_for(300);
    let want = net.data_keys(0, crate::identity::REPLICATED);
    // The entity, its name, the group, its name, the membership.
    assert_eq!(
        want.len(),
        5,
        "{:?}",
        want.iter().map(|k| &k.0).collect::<Vec<_>>()
    );
    assert_eq!(net.data_keys(1, crate::identity::REPLICATED), want);
    assert_eq!(net.data_keys(2, crate::identity::REPLICATED), want);
    assert_eq!(
        net.status(1, "performance")["merkle_root"],
        net.status(0, "performance")["merkle_root"]
    );
    // A delete streams too.
    net.ok(0, &r0, Method::Delete, "identity/group/name/g", json!({}));
    net.run_for(300);
    let want = net.data_keys(0, crate::identity::REPLICATED);
    assert_eq!(want.len(), 2);
    assert_eq!(net.data_keys(1, crate::identity::REPLICATED), want);
    assert_eq!(net.data_keys(2, crate::identity::REPLICATED), want);
    // The DR secondary still refuses client requests, identity ones included.
    let r = net.call(
        2,
        &r0,
        Method::Get,
        &format!("identity/entity/id/{id}"),
        json!({}),
    );
    assert_eq!(r.status, 400);
}

/// A DR secondary serves no client request, the replication API's performance operations
/// included: a token of its primary (replicated there) neither makes it a performance
/// primary (not even in memory, behind an error answer) nor wipes it into a performance
/// secondary of another cluster; only its DR operation token acts on it.
#[test]
fn a_dr_secondary_refuses_performance_replication_operations_with_a_client_token() {
    let (mut net, roots) = Net::new(3);
    let r0 = roots[0].clone();
    net.ok(0, &r0, Method::Put, "secret/a", json!({"v": 1}));
    net.enable_primary(0, &r0, "dr");
    net.activate(0, &r0, 2, &roots[2], "dr", "dr1");
    net.run_for(2_000);
    let uuid = kv_mount_uuid(&net.nodes[0]);
    let held = net.data_keys(2, &format!("logical/{uuid}/"));
    assert!(!held.is_empty());
    // Another cluster, a performance primary, and an activation token of it.
    net.enable_primary(1, &roots[1], "performance");
    let other = net.ok(
        1,
        &roots[1],
        Method::Post,
        "sys/replication/performance/primary/secondary-token",
        json!({"id": "victim"}),
    )["wrap_info"]["token"]
        .as_str()
        .unwrap()
        .to_string();
    let r = net.call(
        2,
        &r0,
        Method::Post,
        "sys/replication/performance/primary/enable",
        json!({}),
    );
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(net.status(2, "performance")["mode"], "disabled");
    let r = net.call(
        2,
        &r0,
        Method::Post,
        "sys/replication/performance/secondary/enable",
        json!({"token": other}),
    );
    assert_eq!(r.status, 400, "{:?}", r.body);
    net.run_for(1_000);
    assert_eq!(net.status(2, "performance")["mode"], "disabled");
    assert_eq!(net.status(2, "dr")["mode"], "secondary");
    assert_eq!(net.data_keys(2, &format!("logical/{uuid}/")), held);
    // Its status stays public.
    assert_eq!(net.status(2, "dr")["state"], "stream-wals");
}

/// Disabling replication on a primary ends the activation tokens it issued and nobody used
/// yet, as revoking their secondaries does: the credential bundle (the barrier key among
/// it) is not handed out any more.
#[test]
fn disabling_a_primary_revokes_its_unused_activation_tokens() {
    let (mut net, roots) = Net::new(1);
    let r0 = roots[0].clone();
    for mode in ["performance", "dr"] {
        net.enable_primary(0, &r0, mode);
        let tok = net.ok(
            0,
            &r0,
            Method::Post,
            &format!("sys/replication/{mode}/primary/secondary-token"),
            json!({"id": "unused"}),
        )["wrap_info"]["token"]
            .as_str()
            .unwrap()
            .to_string();
        net.ok(
            0,
            &r0,
            Method::Post,
            &format!("sys/replication/{mode}/primary/disable"),
            json!({}),
        );
        let r = net.call(
            0,
            "",
            Method::Post,
            "sys/wrapping/unwrap",
            json!({"token": tok}),
        );
        let body = r.body.clone().unwrap_or_default().to_string();
        assert_eq!(r.status, 400, "{mode}: {body}");
        assert!(!body.contains("barrier_key"), "{mode}: {body}");
    }
}

#[path = "forward_tests.rs"]
mod forwarding;

mod joining;

mod restore;

mod bounded;

mod sync;

mod catch_up;

mod pull_gap;
