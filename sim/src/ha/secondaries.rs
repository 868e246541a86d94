//! Secondary clusters of the HA tier: when the primary cluster is a replication primary, a
//! performance and a DR secondary cluster (one to three nodes each, on a store of their own)
//! are activated against it. Only a secondary cluster's active node streams (its standbys
//! serve no replication and forward what clients send them to it); it finds the primary's
//! active node through the cluster addresses it knows (a standby answers that it is one; a
//! crashed or cut node does not answer). This module owns their set-up, the routing of the
//! cluster channel between hosts (peer calls and their answers, the activation token's
//! unwrap over HTTP), the errors a caller sees when its peer crashes, is cut off or never
//! answers, and the final phase's replication checks (`secondary-converges`: each secondary
//! cluster's active node reaches the primary's Merkle root once faults heal; the
//! performance secondary serves every acknowledged write; `resume-without-resync`).

use super::{fail, Caller, Checked, Ev, HaWorld};
use cairn_core::api::{Method, Request, Response};
use cairn_core::replication::{
    HttpCall, HttpReply, Mode, PeerAnswer, PeerReply, PeerRequest, PeerResponse, PeerSend,
};
use cairn_core::Input;
use serde_json::json;
use std::collections::BTreeMap;

/// How long a caller waits for a peer's answer before giving up (the shell's read timeout).
const PEER_TIMEOUT_MS: u64 = 20_000;

/// A peer call in flight: who made it (node, boot, call id).
#[derive(Debug, Clone, Copy)]
pub(super) struct PeerCall {
    pub from: usize,
    pub boot: u64,
    pub call: u64,
}

pub(super) fn mode_path(m: Mode) -> &'static str {
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
    /// Initialises and unseals each secondary cluster on its own keys (its first node takes
    /// its lease), then asks that node (through the event loop: the activation needs the
    /// primary) to become a secondary of the primary cluster.
    pub(super) fn activate_secondaries(&mut self) {
        for c in 1..self.clusters.len() {
            let Some(mode) = self.clusters[c].mode else {
                continue;
            };
            let (_, root) = self.init_cluster(c);
            let mode = mode_path(mode);
            // One secondary of each kind keeps its plain id; more (the scale profile) are
            // numbered by their cluster.
            let many = self
                .clusters
                .iter()
                .filter(|x| x.mode == self.clusters[c].mode)
                .count()
                > 1;
            let id = if many {
                format!("{mode}-secondary-{c}")
            } else {
                format!("{mode}-secondary")
            };
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
            let first = self.clusters[c].nodes[0];
            self.send(first, enable, Caller::Setup(c));
        }
    }

    /// The operator's activation request to cluster `c` was answered.
    pub(super) fn on_setup_answer(&mut self, c: usize, r: &Response) {
        let ok = r.status < 300;
        self.clusters[c].enabled |= ok;
        self.trace.log(
            self.now,
            &format!(
                "cluster {c} secondary enable: {} {}",
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

    /// A peer call still unanswered after [`PEER_TIMEOUT_MS`]: the caller gives up. A node
    /// holds a call (a pull waiting for entries) only while it is active: one that is now a
    /// running standby (not paused, its store reachable) has stepped down without answering
    /// it, which leaves its secondary waiting out the timeout (`held-call-after-step-down`).
    pub(super) fn peer_timeout(&mut self, j: usize, id: u64) -> Checked<()> {
        if !self.nodes[j].peer_in.contains_key(&id) {
            return Ok(());
        }
        let now = self.now;
        let h = &self.nodes[j];
        let running = h.paused_until <= now && h.store_cut_until <= now;
        if let Some(n) = h.host.node() {
            if running && !n.is_sealed() && n.ha().is_standby() {
                return fail(
                    "held-call-after-step-down",
                    format!(
                        "node {j} is a standby and still holds peer call {id} after {} ms: it \
                         stepped down without answering it",
                        PEER_TIMEOUT_MS
                    ),
                );
            }
        }
        *self.checks.entry("held-call-after-step-down").or_default() += 1;
        if let Some(c) = self.nodes[j].peer_in.remove(&id) {
            let input = Input::PeerReply(PeerReply {
                call_id: c.call,
                result: Err("timed out waiting for the peer's answer".into()),
            });
            self.at(0, Ev::Deliver(c.from, c.boot, input));
        }
        Ok(())
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

    /// The replication status of the primary's active node `a` and of each secondary
    /// cluster's nodes (for a failure's report).
    fn replication_statuses(&mut self, a: usize) -> String {
        let mut out = Vec::new();
        for c in 1..self.clusters.len() {
            let Some(m) = self.clusters[c].mode else {
                continue;
            };
            let path = format!("sys/replication/{}/status", mode_path(m));
            let mut who = vec![("primary active", a)];
            who.extend(self.clusters[c].nodes.iter().map(|&i| ("secondary", i)));
            for (what, i) in who {
                let r = self.direct(i, Request::new(0, Method::Get, &path));
                let data = r.body.map(|b| b["data"].to_string()).unwrap_or_default();
                out.push(format!("{what} node {i} {path}: {data}"));
            }
        }
        out.join("; ")
    }

    /// Whether every secondary cluster has an active node that reached the primary's
    /// active node `a`'s Merkle root (its mode's); the first one that has not, described.
    fn secondaries_behind(&self, a: usize) -> Option<String> {
        let active = self.nodes[a].host.node()?;
        for c in 1..self.clusters.len() {
            let Some(m) = self.clusters[c].mode else {
                continue;
            };
            let Some(s) = self.active_of(c) else {
                return Some(format!("secondary cluster {c} has no active node"));
            };
            let Some(n) = self.nodes[s].host.node() else {
                return Some(format!("secondary node {s} is down"));
            };
            let want = active.replication().merkle_root(m);
            let got = n.replication().merkle_root(m);
            if want != got {
                return Some(format!(
                    "{} secondary cluster {c} (active node {s}) has Merkle root {got}, the \
                     primary's active node {a} {want}",
                    mode_path(m),
                ));
            }
        }
        if self.perf_root.is_none()
            && self
                .clusters
                .iter()
                .any(|c| c.mode == Some(Mode::Performance))
        {
            return Some("the performance secondary has no root token yet".into());
        }
        None
    }

    /// The final phase's replication part (faults healed, the primary's keys read back):
    /// every secondary cluster was activated and its active node reaches the primary's
    /// Merkle root within a bound (`secondary-converges`), the performance secondary then
    /// serves every acknowledged write, also those written through it
    /// (`acked-write-readable`), and a cluster that never heard that the WAL it needed was
    /// gone got through every failover without a Merkle resync (`resume-without-resync`;
    /// each new diff was checked as it started).
    pub(super) fn converge(&mut self) -> Checked<()> {
        for c in 1..self.clusters.len() {
            if !self.clusters[c].enabled {
                return fail(
                    "secondary-converges",
                    format!("secondary cluster {c} was never activated"),
                );
            }
        }
        let limit = self.now + 60_000;
        loop {
            let Some(a) = self.active_node() else {
                return fail(
                    "failover-liveness",
                    "the primary's active node stepped down after every fault healed".into(),
                );
            };
            let Some(behind) = self.secondaries_behind(a) else {
                break;
            };
            match self.events.first_key_value() {
                Some(((t, _), _)) if *t <= limit => {
                    self.step()?;
                }
                _ => {
                    let statuses = self.replication_statuses(a);
                    return fail(
                        "secondary-converges",
                        format!("60 s after the faults healed: {behind}; {statuses}"),
                    );
                }
            }
        }
        for c in 1..self.clusters.len() {
            self.count("secondary-converges");
            let cl = &self.clusters[c];
            if !cl.synced {
                return fail(
                    "secondary-converges",
                    format!("secondary cluster {c} converged but never finished its first sync"),
                );
            }
            if cl.gone == 0 {
                self.count("resume-without-resync");
            }
        }
        if let (Some(c), Some(token)) = (
            self.clusters
                .iter()
                .position(|c| c.mode == Some(Mode::Performance)),
            self.perf_root.clone(),
        ) {
            let Some(s) = self.active_of(c) else {
                return fail(
                    "failover-liveness",
                    format!(
                        "secondary cluster {c}'s active node stepped down after the faults healed"
                    ),
                );
            };
            self.read_back(s, &token, "the performance secondary's active node")?;
        }
        Ok(())
    }
}
