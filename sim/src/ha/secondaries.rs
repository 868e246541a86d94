//! Secondaries of the HA tier's cluster: when the cluster is a replication primary, a
//! performance and a DR secondary (each a single node on a store of its own) are activated
//! against it and stream from whichever node is active, finding it through the cluster
//! addresses they know (a standby answers that it is one; a crashed or cut node does not
//! answer). This module owns their set-up, the routing of the cluster channel between hosts
//! (peer calls and their answers, the activation token's unwrap over HTTP), the errors a
//! caller sees when its peer crashes, is cut off or never answers, and the final phase's
//! `secondary-converges` check (each secondary reaches the active node's Merkle root and
//! WAL index once faults heal).

use super::{Caller, Ev, HaNode, HaWorld};
use crate::host::Host;
use cairn_core::api::{Method, Request, Response};
use cairn_core::ha::store::{LeaseStore, NodeIdentity, SharedStorage};
use cairn_core::replication::{
    HttpCall, HttpReply, Mode, PeerAnswer, PeerReply, PeerRequest, PeerResponse, PeerSend,
};
use cairn_core::Input;
use serde_json::json;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

/// How long a caller waits for a peer's answer before giving up (the shell's read timeout).
const PEER_TIMEOUT_MS: u64 = 20_000;

/// One secondary: its host index among the world's nodes, its mode, its own root token.
#[derive(Debug, Clone)]
pub(super) struct Secondary {
    pub node: usize,
    pub mode: Mode,
    pub enabled: bool,
}

/// A peer call in flight: who made it (node, boot, call id).
#[derive(Debug, Clone, Copy)]
pub(super) struct PeerCall {
    pub from: usize,
    pub boot: u64,
    pub call: u64,
}

fn mode_path(m: Mode) -> &'static str {
    match m {
        Mode::Performance => "performance",
        Mode::Dr => "dr",
    }
}

fn bare(addr: &str) -> &str {
    let a = addr
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    a.split('/').next().unwrap_or(a)
}

impl HaWorld {
    /// Adds a performance and a DR secondary host (not started yet).
    pub(super) fn add_secondaries(&mut self, seed: u64) {
        for (k, mode) in [Mode::Performance, Mode::Dr].into_iter().enumerate() {
            let i = self.nodes.len();
            let store = Rc::new(RefCell::new(LeaseStore::new()));
            self.nodes.push(HaNode::new(
                Host::new(i, seed, SharedStorage::new(store)),
                NodeIdentity {
                    node_id: format!("{}-secondary", mode_path(mode)),
                    api_addr: format!("http://10.0.1.{}:8200", k + 1),
                    cluster_addr: format!("10.0.1.{}:8201", k + 1),
                    version: "sim".into(),
                },
                0,
            ));
            self.secs.push(Secondary {
                node: i,
                mode,
                enabled: false,
            });
        }
    }

    /// Initialises and unseals each secondary on its own keys, then asks it (through the
    /// event loop: the activation needs the primary) to become a secondary of the cluster.
    pub(super) fn activate_secondaries(&mut self) {
        for s in self.secs.clone() {
            let init = Request::new(0, Method::Put, "sys/init")
                .with_json(json!({"secret_shares": 1, "secret_threshold": 1}));
            let body = self.direct(s.node, init).body.unwrap_or_default();
            let key = body["keys"][0].as_str().unwrap_or_default().to_string();
            let root = body["root_token"].as_str().unwrap_or_default().to_string();
            let unseal = Request::new(0, Method::Put, "sys/unseal").with_json(json!({"key": key}));
            self.direct(s.node, unseal);
            let mode = mode_path(s.mode);
            let id = format!("{mode}-secondary");
            let gen = Request::new(
                0,
                Method::Post,
                &format!("sys/replication/{mode}/primary/secondary-token"),
            )
            .with_token(&self.root)
            .with_json(json!({ "id": id }));
            let r = self.direct(0, gen);
            let token = r
                .body
                .as_ref()
                .and_then(|b| b["wrap_info"]["token"].as_str())
                .unwrap_or_default()
                .to_string();
            self.trace.log(
                self.now,
                &format!("{mode} secondary token for {id}: {}", r.status),
            );
            let enable = Request::new(
                0,
                Method::Post,
                &format!("sys/replication/{mode}/secondary/enable"),
            )
            .with_token(&root)
            .with_json(json!({ "token": token }));
            self.send(s.node, enable, Caller::Setup(s.node));
        }
    }

    /// The operator's activation request was answered.
    pub(super) fn on_setup_answer(&mut self, node: usize, r: &Response) {
        let ok = r.status < 300;
        if let Some(s) = self.secs.iter_mut().find(|s| s.node == node) {
            s.enabled |= ok;
        }
        self.trace.log(
            self.now,
            &format!(
                "node {node} secondary enable: {} {}",
                r.status,
                r.body.as_ref().map(|b| b.to_string()).unwrap_or_default()
            ),
        );
    }

    fn node_at(&self, addr: &str, api: bool) -> Option<usize> {
        let want = bare(addr);
        self.nodes.iter().position(|h| {
            let a = if api {
                &h.identity.api_addr
            } else {
                &h.identity.cluster_addr
            };
            bare(a) == want
        })
    }

    fn cut_between(&self, a: usize, b: usize) -> bool {
        self.nodes[a].peers_cut_until > self.now || self.nodes[b].peers_cut_until > self.now
    }

    /// A peer call leaves node `i`: to the node at its address, unless that is down or cut
    /// off (then the caller sees a transport error after a while).
    pub(super) fn route_peer_send(&mut self, i: usize, s: PeerSend) {
        let boot = self.nodes[i].host.boot();
        let target = self.node_at(&s.to, false);
        let Some(j) = target.filter(|&j| self.nodes[j].host.is_up() && !self.cut_between(i, j))
        else {
            let d = 1_000 + self.rng.delay(500);
            let input = Input::PeerReply(PeerReply {
                call_id: s.call_id,
                result: Err(format!("connection to {} failed", s.to)),
            });
            self.at(d, Ev::Deliver(i, boot, input));
            return;
        };
        self.next_peer_id += 1;
        let id = self.next_peer_id;
        self.nodes[j].peer_in.insert(
            id,
            PeerCall {
                from: i,
                boot,
                call: s.call_id,
            },
        );
        let jboot = self.nodes[j].host.boot();
        let d = 1 + self.rng.delay(2);
        self.at(
            d,
            Ev::Deliver(j, jboot, Input::PeerRequest(PeerRequest { id, msg: s.msg })),
        );
        self.at(PEER_TIMEOUT_MS, Ev::PeerTimeout(j, id));
    }

    /// Node `j` answers peer request `r.id` (`failed`: its batch did not commit, so what it
    /// says is not true: the connection breaks instead).
    pub(super) fn route_peer_response(&mut self, j: usize, r: PeerResponse, failed: bool) {
        let Some(c) = self.nodes[j].peer_in.remove(&r.id) else {
            return;
        };
        let result: Result<PeerAnswer, String> = if failed || self.cut_between(j, c.from) {
            Err("connection reset".into())
        } else {
            Ok(r.msg)
        };
        let d = 1 + self.rng.delay(2);
        let input = Input::PeerReply(PeerReply {
            call_id: c.call,
            result,
        });
        self.at(d, Ev::Deliver(c.from, c.boot, input));
    }

    /// A peer call still unanswered after [`PEER_TIMEOUT_MS`]: the caller gives up.
    pub(super) fn peer_timeout(&mut self, j: usize, id: u64) {
        if let Some(c) = self.nodes[j].peer_in.remove(&id) {
            let input = Input::PeerReply(PeerReply {
                call_id: c.call,
                result: Err("timed out waiting for the peer's answer".into()),
            });
            self.at(0, Ev::Deliver(c.from, c.boot, input));
        }
    }

    /// An outbound HTTP call (the activation token's unwrap at the primary's API address).
    pub(super) fn route_http_call(&mut self, i: usize, c: HttpCall) {
        let boot = self.nodes[i].host.boot();
        let path = c.url.split("/v1/").nth(1).map(str::to_string);
        let method = Method::parse(&c.method);
        let target = self
            .node_at(&c.url, true)
            .filter(|&j| !self.cut_between(i, j));
        let (Some(j), Some(path), Some(method)) = (target, path, method) else {
            let input = Input::HttpReply(HttpReply {
                call_id: c.call_id,
                result: Err(format!("cannot reach {}", c.url)),
            });
            self.at(1_000, Ev::Deliver(i, boot, input));
            return;
        };
        let mut req = Request::new(0, method, &path);
        req.body = c.body;
        self.send(
            j,
            req,
            Caller::Http {
                from: i,
                boot,
                call: c.call_id,
            },
        );
    }

    /// Node `j` answered an HTTP call of node `from`.
    pub(super) fn on_http_answer(
        &mut self,
        j: usize,
        from: usize,
        boot: u64,
        call: u64,
        r: Response,
    ) {
        let result = if self.cut_between(j, from) {
            Err("connection reset".to_string())
        } else {
            let body = r
                .body
                .map(|b| b.to_string().into_bytes())
                .unwrap_or_default();
            Ok((r.status, body))
        };
        let input = Input::HttpReply(HttpReply {
            call_id: call,
            result,
        });
        let d = 1 + self.rng.delay(2);
        self.at(d, Ev::Deliver(from, boot, input));
    }

    /// Node `j` crashed: every peer call and HTTP call it was serving breaks.
    pub(super) fn calls_broken_by_crash(&mut self, j: usize, waiting: BTreeMap<u64, Caller>) {
        let peer_in = std::mem::take(&mut self.nodes[j].peer_in);
        for c in peer_in.into_values() {
            let input = Input::PeerReply(PeerReply {
                call_id: c.call,
                result: Err("connection reset".into()),
            });
            self.at(1, Ev::Deliver(c.from, c.boot, input));
        }
        for caller in waiting.into_values() {
            if let Caller::Http { from, boot, call } = caller {
                let input = Input::HttpReply(HttpReply {
                    call_id: call,
                    result: Err("connection reset".into()),
                });
                self.at(1, Ev::Deliver(from, boot, input));
            }
        }
    }

    /// The replication status of the active node `a` and of each secondary (for a failure's
    /// report).
    pub(super) fn replication_statuses(&mut self, a: usize) -> String {
        let mut out = Vec::new();
        for s in self.secs.clone() {
            let path = format!("sys/replication/{}/status", mode_path(s.mode));
            for (who, i) in [("active", a), ("secondary", s.node)] {
                let r = self.direct(i, Request::new(0, Method::Get, &path));
                let data = r.body.map(|b| b["data"].to_string()).unwrap_or_default();
                out.push(format!("{who} node {i} {path}: {data}"));
            }
        }
        out.join("; ")
    }

    /// Whether every enabled secondary has reached the active node `a`'s Merkle root (its
    /// mode's) and WAL index; the first one that has not, described.
    pub(super) fn secondaries_behind(&self, a: usize) -> Option<String> {
        let active = self.nodes[a].host.node()?;
        for s in self.secs.iter().filter(|s| s.enabled) {
            let Some(n) = self.nodes[s.node].host.node() else {
                return Some(format!("secondary node {} is down", s.node));
            };
            let want = active.replication().merkle_root(s.mode);
            let got = n.replication().merkle_root(s.mode);
            if want != got {
                return Some(format!(
                    "{} secondary (node {}) has Merkle root {got}, the active node {a} {want}",
                    mode_path(s.mode),
                    s.node
                ));
            }
        }
        None
    }
}
