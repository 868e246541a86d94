//! An attacker who runs a performance secondary cluster: it holds the primary's barrier key
//! (the activation credential carries it), a certificate of the primary's CA, a valid token
//! of the primary (the primary's root token here) and the forward route its own standbys
//! publish, signing key included. With those it sends forged forwarded writes to every node
//! of the other clusters (the primary and the DR secondary), stamped for the target
//! cluster's current lease epoch, at any point of the run: before and after its own CA
//! exists, while a DR secondary has no CA yet (between its activation wipe and its first
//! sync), across failovers.
//!
//! Invariant `forged-forward-refused`: every such forward is refused (an answer of 400 or
//! more; half of them are reads of `sys/replication/status`, which a node that took the
//! forward answers with 200 whatever its role), and at the end none of the forged keys
//! exists on the primary's active node. The forger draws from a random stream of its own,
//! so that the other draws of a seed stay as they were.

use super::{fail, Caller, Checked, HaWorld};
use cairn_core::api::{Method, Request, Response};
use cairn_core::ha::route::{self, ForwardRoute};
use cairn_core::replication::Mode;
use serde_json::json;

/// One forged write in 40 client operations, once a performance secondary published a
/// route.
const FORGE_PERMILLE: u64 = 25;

/// The forger's state: the routes the performance secondary's nodes published, and what it
/// sent.
#[derive(Default)]
pub(super) struct Forger {
    /// The last route each node of a performance secondary cluster published.
    routes: std::collections::BTreeMap<usize, ForwardRoute>,
    /// The keys of the forged writes sent.
    pub(super) keys: Vec<String>,
    seq: u64,
}

impl HaWorld {
    /// Node `i` published `route` (`None`: it forwards nothing now). The forger keeps the
    /// performance secondaries' ones.
    pub(super) fn route_published(&mut self, i: usize, route: Option<ForwardRoute>) {
        let c = self.nodes[i].cluster;
        if self.clusters[c].mode != Some(Mode::Performance) {
            return;
        }
        match route {
            Some(r) => {
                self.forger.routes.insert(i, r);
            }
            None => {
                self.forger.routes.remove(&i);
            }
        }
    }

    /// Now and then, a forged forward from a performance secondary's route to a node of
    /// another cluster.
    pub(super) fn forge(&mut self) {
        if self.forger.routes.is_empty() || !self.forger_rng.chance(FORGE_PERMILLE) {
            return;
        }
        let routes: Vec<&ForwardRoute> = self.forger.routes.values().collect();
        let pick = self.forger_rng.below(routes.len() as u64) as usize;
        let mut route = routes[pick].clone();
        let targets: Vec<usize> = self
            .clusters
            .iter()
            .filter(|c| c.mode != Some(Mode::Performance))
            .flat_map(|c| c.nodes.iter().copied())
            .collect();
        let t = targets[self.forger_rng.below(targets.len() as u64) as usize];
        route.epoch = self.clusters[self.nodes[t].cluster].store.borrow().epoch();
        self.forger.seq += 1;
        // Half of them a read every unsealed node answers with 200 without a token
        // (`sys/replication/status`): a node that took the forward answers it, so a forged
        // forward a DR secondary accepted shows too (it refuses a client's write after it
        // took the forward: the write's error status alone would hide it).
        let probe = self.forger_rng.chance(500);
        let key = format!("forged{}", self.forger.seq);
        let mut req = if probe {
            Request::new(0, Method::Get, "sys/replication/status")
        } else {
            Request::new(0, Method::Put, &format!("kv/{key}"))
                .with_token(&self.root)
                .with_json(json!({ "v": self.forger.seq }))
        };
        let sender = format!("f{:x}", self.forger_rng.below(u64::MAX));
        if !route::sign(Some(&route), &sender, self.forger.seq, &mut req) {
            return;
        }
        if !probe {
            self.forger.keys.push(key.clone());
        }
        let delay = self.forger_rng.delay(2);
        self.send_after(t, req, Caller::Forged { key }, delay);
    }

    /// The answer to a forged forward: a refusal, or the invariant is broken.
    pub(super) fn on_forged_answer(&mut self, i: usize, key: &str, r: &Response) -> Checked<()> {
        if r.status < 400 {
            return fail(
                "forged-forward-refused",
                format!(
                    "node {i} answered {} to forged forward {key} (a write, or a read of \
                     sys/replication/status) signed with a performance secondary's signing \
                     key: {:?}",
                    r.status, r.body
                ),
            );
        }
        self.count("forged-forward-refused");
        Ok(())
    }

    /// After the run: no forged key exists on the primary's active node `a`.
    pub(super) fn forged_absent(&mut self, a: usize) -> Checked<()> {
        let root = self.root.clone();
        for key in self.forger.keys.clone() {
            let req = Request::new(0, Method::Get, &format!("kv/{key}")).with_token(&root);
            let r = self.direct(a, req);
            if r.status != 404 {
                return fail(
                    "forged-forward-refused",
                    format!(
                        "after the run, forged {key} reads with status {} on the primary's \
                         active node {a}: {:?}",
                        r.status, r.body
                    ),
                );
            }
            self.count("forged-forward-refused");
        }
        Ok(())
    }
}
