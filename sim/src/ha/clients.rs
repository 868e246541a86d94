//! Clients of the HA tier and what they are told: writes of unique keys and reads of
//! acknowledged ones through any node of the primary cluster, and, once the performance
//! secondary cluster has a root token of its own, through any node of it too (a write there
//! goes on to the primary: a standby forwards it to its active node, which forwards it to
//! the primary cluster's active). `acked-write-readable`: a read through the primary cluster
//! gives exactly the acknowledged value; one through the secondary gives it or nothing yet
//! (it may lag), never another value. The operator's `sys/generate-root` flow on the
//! performance secondary (its tokens are its own; the key shares are the primary's since its
//! activation) and the routing of every answer to whoever waits for it are here too.

use super::{fail, Caller, Checked, Ev, HaWorld};
use cairn_core::api::{Method, Request, Response};
use cairn_core::replication::dr_token::decode_token;
use cairn_core::replication::Mode;
use serde_json::json;

/// Which step of the root-token flow a request is.
#[derive(Debug, Clone, Copy)]
pub(super) enum GenStep {
    Cancel,
    Attempt,
    Update,
}

/// Where the operator's root-token flow on the performance secondary stands.
#[derive(Debug, Clone, Default)]
pub(super) struct GenRoot {
    /// A step is out, to this node (incarnation).
    busy: Option<(usize, u64)>,
    /// The attempt in progress must be cancelled first.
    cancel: bool,
    /// (otp, nonce) of the attempt in progress.
    attempt: Option<(String, String)>,
}

impl HaWorld {
    /// The performance secondary cluster, if there is one.
    fn perf_cluster(&self) -> Option<usize> {
        self.clusters
            .iter()
            .position(|c| c.mode == Some(Mode::Performance))
    }

    pub(super) fn client_op(&mut self) {
        // Through the performance secondary now and then, once it has a token.
        let through = match (self.perf_cluster(), &self.perf_root) {
            (Some(c), Some(t)) if self.rng.chance(250) => Some((c, t.clone())),
            _ => None,
        };
        let (c, token, lag_ok) = match through {
            Some((c, t)) => (c, t, true),
            None => (0, self.root.clone(), false),
        };
        let members = &self.clusters[c].nodes;
        let i = members[self.rng.below(members.len() as u64) as usize];
        if !self.acked.is_empty() && self.rng.chance(300) {
            let pick = self.rng.below(self.acked.len() as u64) as usize;
            let Some(key) = self.acked.keys().nth(pick).cloned() else {
                return;
            };
            let req = Request::new(0, Method::Get, &format!("kv/{key}")).with_token(&token);
            self.send(i, req, Caller::Read { key, lag_ok });
        } else {
            self.next_key += 1;
            let key = format!("k{}", self.next_key);
            let value = self.next_key;
            let req = Request::new(0, Method::Put, &format!("kv/{key}"))
                .with_token(&token)
                .with_json(json!({ "v": value }));
            self.send(i, req, Caller::Write { key, value });
        }
    }

    /// The next step of the root-token flow, once the performance secondary finished its
    /// first sync and until it has the token; sent to its active node.
    pub(super) fn gen_root_step(&mut self) {
        let Some(c) = self.perf_cluster() else {
            return;
        };
        if let Some((n, boot)) = self.gen.busy {
            let h = &self.nodes[n].host;
            if h.is_up() && h.boot() == boot {
                return;
            }
            // It crashed meanwhile: the step is lost.
            self.gen.busy = None;
        }
        if self.perf_root.is_some() || !self.clusters[c].synced {
            return;
        }
        let Some(a) = self.active_of(c) else {
            return;
        };
        let base = "sys/generate-root/attempt";
        let (step, req) = match &self.gen.attempt {
            _ if self.gen.cancel => (GenStep::Cancel, Request::new(0, Method::Delete, base)),
            None => (
                GenStep::Attempt,
                Request::new(0, Method::Post, base).with_json(json!({})),
            ),
            Some((_, nonce)) => (
                GenStep::Update,
                Request::new(0, Method::Post, "sys/generate-root/update")
                    .with_json(json!({"key": self.key, "nonce": nonce})),
            ),
        };
        self.gen.busy = Some((a, self.nodes[a].host.boot()));
        self.send(a, req, Caller::GenRoot(step));
    }

    fn on_gen_answer(&mut self, step: GenStep, r: &Response) {
        self.gen.busy = None;
        let ok = r.status < 300;
        let body = r.body.clone().unwrap_or_default();
        let field = |k: &str| {
            body[k]
                .as_str()
                .or_else(|| body["data"][k].as_str())
                .map(str::to_string)
        };
        match step {
            GenStep::Cancel => {
                if ok {
                    self.gen.cancel = false;
                    self.gen.attempt = None;
                }
            }
            GenStep::Attempt => match (ok, field("otp"), field("nonce")) {
                (true, Some(o), Some(n)) => self.gen.attempt = Some((o, n)),
                _ => self.gen.cancel = true,
            },
            GenStep::Update => {
                let otp = self.gen.attempt.as_ref().map(|a| a.0.clone());
                let token = match (ok, field("encoded_token"), otp) {
                    (true, Some(e), Some(otp)) => decode_token(&e, &otp).ok(),
                    _ => None,
                };
                self.gen.attempt = None;
                match token {
                    Some(t) => {
                        self.trace.log(
                            self.now,
                            "the performance secondary has a root token of its own",
                        );
                        self.perf_root = Some(t);
                    }
                    None => self.gen.cancel = true,
                }
            }
        }
    }

    /// A request's answer reaches whoever waits for it.
    pub(super) fn answer(&mut self, i: usize, r: Response) -> Checked<()> {
        let Some(caller) = self.nodes[i].waiting.remove(&r.id) else {
            return Ok(());
        };
        match caller {
            Caller::Write { key, value } => {
                if r.status == 204 {
                    self.acked.insert(key, value);
                }
            }
            Caller::Read { key, lag_ok } => {
                let want = self.acked.get(&key).copied();
                if r.status == 200 {
                    self.count("acked-write-readable");
                    let got = r.body.as_ref().and_then(|b| b["data"]["v"].as_u64());
                    if got != want {
                        return fail(
                            "acked-write-readable",
                            format!(
                                "read of {key} through node {i} gave {got:?}, acknowledged \
                                 {want:?}"
                            ),
                        );
                    }
                } else if r.status == 404 && !lag_ok {
                    return fail(
                        "acked-write-readable",
                        format!("read of acknowledged {key} through node {i}: 404"),
                    );
                }
            }
            Caller::Unseal => {}
            Caller::Setup(c) => self.on_setup_answer(c, &r),
            Caller::GenRoot(step) => self.on_gen_answer(step, &r),
            Caller::Forged { key } => self.on_forged_answer(i, &key, &r)?,
            Caller::Http { from, boot, call } => self.on_http_answer(i, from, boot, call, r),
            Caller::Forwarded(j, id, boot) => {
                // Back over the cluster channel, unless it broke meanwhile.
                let cut = self.nodes[i].peers_cut_until > self.now
                    || self.nodes[j].peers_cut_until > self.now;
                let result = if cut {
                    Err("the connection to the active node broke".to_string())
                } else {
                    Ok(r)
                };
                let d = 1 + self.rng.delay(2);
                self.at(
                    d,
                    Ev::Deliver(j, boot, cairn_core::Input::Forwarded { id, result }),
                );
            }
        }
        Ok(())
    }
}
