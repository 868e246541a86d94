//! Host wiring of the replication world: group commit, crashes, and the routing of what
//! nodes release (API answers, peer calls and answers, outbound HTTP) over the seeded
//! network.

use super::*;
use crate::host::{Batching, Sort};
use crate::storage::CommitInfo;

/// Group commit in the replication world (both tiers): outputs are held until their batch
/// commits, except LDAP calls (the shell hands them to its pool at once, before the batch
/// commits; here the directory answers a few ms later) and calls to the primary (the shell
/// sends them at the end of the batch, before the sync; here even earlier, so a crash in the
/// commit window loses what a pull already told the primary). Audit records and cluster TLS
/// material are dropped. Nodes batch (held long polls are answered at the end of the batch);
/// a batch commits after a seeded window, and then the WAL and the host are checked.
impl GroupCommit for ReplWorld {
    fn host_mut(&mut self, h: HostId) -> &mut Host {
        &mut self.hosts[h].host
    }

    fn sim_now(&self) -> u64 {
        self.now
    }

    fn faults(&mut self) -> &mut SimRng {
        &mut self.faults
    }

    fn batching(&self) -> Batching {
        Batching {
            window_ms: self.params.commit_window_ms,
            max_batch: None,
            crash_permille: (self.phase == Phase::Chaos)
                .then_some(self.params.crash_in_batch_permille),
        }
    }

    fn schedule_commit_at(&mut self, h: HostId, batch: u64, delay: u64) {
        self.schedule(delay, Ev::Commit { host: h, batch });
    }

    fn schedule_crash_at(&mut self, h: HostId, delay: u64) {
        self.schedule(delay, Ev::Crash(h));
    }

    fn sort(&self, o: &Output) -> Sort {
        match o {
            Output::Audit { .. } | Output::ClusterTls(_) => Sort::Drop,
            Output::Ldap(_) | Output::PeerSend(_) | Output::SnapshotSave(_) => Sort::Aside,
            _ => Sort::Hold,
        }
    }

    fn drained(&mut self, h: HostId, aside: Vec<Output>, held_from: usize) -> bool {
        let host = &self.hosts[h].host;
        let boot = host.boot();
        // The answer to a scan request is checked against the node as it answers.
        let scan_id = self.scan.filter(|s| s.h == h).map(|s| s.id);
        let scan_answer = host.held()[held_from..].iter().rev().find_map(|o| match o {
            Output::Response(r) if Some(r.id) == scan_id => Some(r.clone()),
            _ => None,
        });
        if let Some(r) = scan_answer {
            if self.pending.is_none() {
                if let Err(v) = self.on_scan_answer(h, &r) {
                    self.pending = Some(v);
                }
            }
        }
        let mut calls = Vec::new();
        let mut early = Vec::new();
        let mut saves = Vec::new();
        for o in aside {
            match o {
                Output::Ldap(c) => calls.push(c),
                Output::SnapshotSave(s) => saves.push(s),
                o => early.push(o),
            }
        }
        for o in early {
            self.release(h, o);
        }
        // A snapshot save: the file of the storage as the save's input left it (no later
        // input has run), handed back at once; its answer joins the open batch.
        let fed = !saves.is_empty();
        for s in saves {
            let id = s.id;
            let Some(node) = self.hosts[h].host.node() else {
                continue;
            };
            let result = s.writer.write_all(node.storage()).map_err(|e| match e {
                cairn_core::snapshot::SnapshotError::Storage(e) => e,
                other => cairn_core::StorageError::Io(other.to_string()),
            });
            let now = self.now;
            self.hosts[h]
                .host
                .handle(now, Input::SnapshotSaved { id, result });
        }
        for c in calls {
            let reply = self.ldap.dir.answer(&c);
            let d = 1 + self.faults.delay(2);
            self.schedule(
                d,
                Ev::LdapRep {
                    host: h,
                    boot,
                    reply,
                },
            );
        }
        fed
    }

    fn committed(&mut self, _h: HostId, _info: &CommitInfo, _held: &[Output]) {
        self.stats.commits += 1;
    }

    fn release_held(&mut self, h: HostId, o: Output) -> Result<(), Violation> {
        self.release(h, o);
        Ok(())
    }

    fn after_commit(&mut self, h: HostId) -> Result<(), Violation> {
        self.check_wal(h)?;
        self.check_host(h)
    }
}

impl ReplWorld {
    /// Cuts the link between hosts `a` and `b` (both ways).
    pub(super) fn cut_link(&mut self, a: HostId, b: HostId) {
        self.net.partition(Addr::Host(a), Addr::Host(b));
        if let Some(t) = self.tcp.as_mut() {
            t.partition(a, b);
        }
    }

    /// A peer request arrives at host `to`.
    pub(super) fn peer_request(
        &mut self,
        to: HostId,
        from: PeerFrom,
        msg: PeerMsg,
    ) -> Result<(), Violation> {
        self.stats.peer_msgs += 1;
        if !self.hosts[to].host.is_up() {
            if let PeerFrom::Net { host, boot, call } = from {
                self.peer_error(host, boot, call, "connection refused", to);
            }
            return Ok(());
        }
        let host = &mut self.hosts[to];
        host.next_peer += 1;
        let pid = host.next_peer;
        host.peer_in.insert(pid, from);
        let now = self.now;
        host.host
            .handle(now, Input::PeerRequest(PeerRequest { id: pid, msg }));
        self.drain(to);
        self.schedule_commit(to)
    }

    /// The answer (or transport error) to call `call` of incarnation `boot` of host `to`.
    pub(super) fn peer_reply(
        &mut self,
        to: HostId,
        boot: u64,
        call: u64,
        result: Result<PeerAnswer, String>,
    ) -> Result<(), Violation> {
        if self.hosts[to].host.boot() != boot || !self.hosts[to].host.is_up() {
            return Ok(());
        }
        if let Err(e) = &result {
            self.stats.peer_errors += 1;
            self.log(&format!("n{to} <- peer error call={call}: {e}"));
        }
        // Coverage: how secondaries behind the WAL came back.
        match &result {
            Ok(PeerAnswer::Changes { .. }) => self.bump("repl:catch-up-batches"),
            Ok(PeerAnswer::Roots { .. }) => self.bump("repl:merkle-diffs"),
            Ok(PeerAnswer::Gone { .. }) => self.bump("repl:wal-gone"),
            _ => {}
        }
        let now = self.now;
        self.hosts[to].host.handle(
            now,
            Input::PeerReply(PeerReply {
                call_id: call,
                result,
            }),
        );
        self.drain(to);
        self.schedule_commit(to)
    }

    pub(super) fn heal(&mut self, a: HostId, b: HostId) {
        let l = self.params.peer_link;
        self.net.set_link(Addr::Host(a), Addr::Host(b), l);
        self.net.set_link(Addr::Host(b), Addr::Host(a), l);
        if let Some(t) = self.tcp.as_mut() {
            t.repair(a, b);
        }
        self.log(&format!("net HEAL n{a} | n{b}"));
    }

    pub(super) fn peer_error(&mut self, to: HostId, boot: u64, call: u64, why: &str, from: HostId) {
        let d = match why {
            "connection refused" => self.net_delay(from, to),
            _ => TIMEOUT_MS,
        };
        self.schedule(
            d,
            Ev::PeerRep {
                to,
                boot,
                call,
                result: Err(why.to_string()),
            },
        );
    }

    pub(super) fn net_delay(&mut self, from: HostId, to: HostId) -> u64 {
        let l = self.net.link(Addr::Host(from), Addr::Host(to));
        self.faults.delay(l.delay_mean)
    }

    pub(super) fn reply_api(
        &mut self,
        from: HostId,
        to: Caller,
        id: RequestId,
        resp: Result<Response, String>,
    ) {
        let dest = match to {
            Caller::Operator => Addr::Client(0),
            Caller::Http { host, .. } => Addr::Host(host),
        };
        match self.net.route(self.now, Addr::Host(from), dest) {
            Route::Deliver(d) => self.schedule(d, Ev::ApiResp { to, id, resp }),
            Route::Lost(why) => {
                self.log(&format!("net n{from}->{dest} dropped a response ({why})"));
                self.schedule(
                    TIMEOUT_MS,
                    Ev::ApiResp {
                        to,
                        id,
                        resp: Err("connection timed out".into()),
                    },
                );
            }
        }
    }

    pub(super) fn resolve(&self, addr: &str, api: bool) -> Option<HostId> {
        (0..self.hosts.len()).find(|&j| {
            if api {
                addr.starts_with(&format!("{}/", api_addr(j)))
            } else {
                addr.trim_start_matches("https://")
                    .trim_start_matches("http://")
                    == cluster_addr(j)
            }
        })
    }

    pub(super) fn release(&mut self, h: HostId, o: Output) {
        let boot = self.hosts[h].host.boot();
        match o {
            Output::Response(r) => {
                if self.outstanding.as_ref().is_some_and(|o| o.0 == r.id) {
                    self.out_wal = self.hosts[h].host.node().map(|n| n.replication().wal.last);
                }
                self.hosts[h].op_in.remove(&r.id);
                let from = self.hosts[h]
                    .http_in
                    .remove(&r.id)
                    .unwrap_or(Caller::Operator);
                self.reply_api(h, from, r.id, Ok(r));
            }
            Output::PeerSend(s) => {
                let Some(j) = self.resolve(&s.to, false) else {
                    self.log(&format!("n{h} peer send to unknown {}", s.to));
                    self.schedule(
                        1,
                        Ev::PeerRep {
                            to: h,
                            boot,
                            call: s.call_id,
                            result: Err(format!("dns error: unknown host {}", s.to)),
                        },
                    );
                    return;
                };
                let what = serde_json::to_value(&s.msg.body)
                    .map(|v| shorten(&v.to_string(), 80))
                    .unwrap_or_default();
                self.log(&format!("n{h} -> n{j} peer call={} {what}", s.call_id));
                if let Some(t) = self.tcp.as_mut() {
                    t.send(h, boot, s);
                    return;
                }
                match self.net.route(self.now, Addr::Host(h), Addr::Host(j)) {
                    Route::Deliver(d) => self.schedule(
                        d,
                        Ev::PeerReq {
                            to: j,
                            from: h,
                            boot,
                            call: s.call_id,
                            msg: s.msg,
                        },
                    ),
                    Route::Lost(why) => {
                        let e = if why == "partitioned" {
                            "connection timed out (partitioned)"
                        } else {
                            "connection timed out"
                        };
                        self.peer_error(h, boot, s.call_id, e, j);
                    }
                }
            }
            Output::PeerResponse(r) => {
                let what = serde_json::to_value(&r.msg)
                    .map(|v| shorten(&v.to_string(), 100))
                    .unwrap_or_default();
                let (c, cboot, call) = match self.hosts[h].peer_in.remove(&r.id) {
                    None => return,
                    Some(PeerFrom::Net { host, boot, call }) => (host, boot, call),
                    Some(PeerFrom::Tcp(key)) => {
                        self.log(&format!("n{h} -> tcp peer answer key={key} {what}"));
                        if let Some(t) = self.tcp.as_mut() {
                            t.answer(key, r.msg);
                        }
                        return;
                    }
                };
                self.log(&format!("n{h} -> n{c} peer answer call={call} {what}"));
                match self.net.route(self.now, Addr::Host(h), Addr::Host(c)) {
                    Route::Deliver(d) => self.schedule(
                        d,
                        Ev::PeerRep {
                            to: c,
                            boot: cboot,
                            call,
                            result: Ok(r.msg),
                        },
                    ),
                    Route::Lost(_) => self.peer_error(c, cboot, call, "connection reset", h),
                }
            }
            Output::HttpCall(c) => {
                let target = self.resolve(&c.url, true);
                let path = c.url.split("/v1/").nth(1).map(str::to_string);
                let method = Method::parse(&c.method);
                let (Some(j), Some(path), Some(method)) = (target, path, method) else {
                    self.schedule(
                        1,
                        Ev::ApiResp {
                            to: Caller::Http {
                                host: h,
                                boot,
                                call: c.call_id,
                            },
                            id: 0,
                            resp: Err(format!("cannot reach {}", c.url)),
                        },
                    );
                    return;
                };
                self.next_id += 1;
                let id = self.next_id;
                let mut req = Request::new(id, method, &path);
                req.body = c.body;
                let from = Caller::Http {
                    host: h,
                    boot,
                    call: c.call_id,
                };
                match self.net.route(self.now, Addr::Host(h), Addr::Host(j)) {
                    Route::Deliver(d) => self.schedule(d, Ev::ApiReq { to: j, from, req }),
                    Route::Lost(_) => self.schedule(
                        TIMEOUT_MS,
                        Ev::ApiResp {
                            to: from,
                            id,
                            resp: Err("connection timed out".into()),
                        },
                    ),
                }
            }
            _ => {}
        }
    }

    pub(super) fn crash(&mut self, h: HostId) -> Result<(), Violation> {
        self.stats.crashes += 1;
        let host = &mut self.hosts[h];
        let Some((info, held)) = host.host.crash() else {
            return Ok(());
        };
        let http_in = std::mem::take(&mut host.http_in);
        let peer_in = std::mem::take(&mut host.peer_in);
        self.log(&format!(
            "n{h} CRASH dropped sets={} outputs={}",
            info.dropped_write_sets,
            held.len()
        ));
        // Operator requests handled but not answered: the connection resets.
        for id in std::mem::take(&mut self.hosts[h].op_in) {
            self.schedule(
                1,
                Ev::ApiResp {
                    to: Caller::Operator,
                    id,
                    resp: Err("connection reset".into()),
                },
            );
        }
        drop(held);
        for (id, c) in http_in {
            self.schedule(
                1,
                Ev::ApiResp {
                    to: c,
                    id,
                    resp: Err("connection reset".into()),
                },
            );
        }
        for (_, from) in peer_in {
            // Turmoil connections break with the turmoil host.
            if let PeerFrom::Net { host, boot, call } = from {
                self.peer_error(host, boot, call, "connection reset", h);
            }
        }
        if let Some(t) = self.tcp.as_mut() {
            t.crash(h);
        }
        let d = self.faults.delay(self.params.downtime_mean_ms).max(1);
        self.schedule(d, Ev::Restart(h));
        Ok(())
    }
}
