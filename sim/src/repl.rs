//! The fast tier with replication: a performance primary (host 0) and 1–3 secondaries
//! (performance, some path-filtered, or DR) as real [`cairn_core::Node`]s on [`SimStorage`],
//! with the cluster channel and outbound HTTP routed over the seeded [`Network`].
//!
//! Wiring, as the shell does it (`shell/src/cluster.rs`, `shell/src/runtime.rs`):
//! * `Output::PeerSend` → the peer's `Input::PeerRequest`; its `Output::PeerResponse` (perhaps
//!   held: long poll) → the caller's `Input::PeerReply`. A message the network loses, a peer
//!   that is down or crashes while holding the request, becomes `PeerReply { result: Err }`
//!   after a transport timeout, as ureq's error does in the shell.
//! * `Output::HttpCall` (activation-token unwrap at the primary's API address) → an API
//!   request to that host; its response → `Input::HttpReply`; transport failures → `Err`.
//! * Outputs are held until their batch commits (group commit); a crash drops them.
//! * Replies reach only the incarnation (boot) of the node that made the call.
//!
//! One operator client sets the topology up (mount, primary enable, secondary-token,
//! paths-filter, secondary enable), then mixes KV writes and deletes on two mounts, policy
//! writes, token creation, reads on secondaries, probes of primary tokens on performance
//! secondaries and revocations, while faults crash hosts and partition primary↔secondary
//! links. The final phase stops faults and traffic, heals the network, restarts and unseals
//! every host and waits (bounded) for convergence, then reads every acknowledged write back
//! from the primary.
//!
//! Failover drill (seeds with a DR secondary, ~70% of them): the primary is lost (crashed and
//! held down, or partitioned from every host); the operator generates a DR operation token
//! on the DR secondary (`generate-operation-token/attempt` + `update` with the primary's key
//! share; a share of another keyring first, which must be refused), probes promote without
//! a valid token (`gates`), promotes (with or without `force`), re-points every other
//! secondary (`update-primary` by a new activation token — with the paths filter set again
//! for filtered ones — or by `update_primary_addrs`; DR ones with their own operation
//! token), then brings the old primary back, disables its performance primary, demotes its
//! DR primary and re-joins it as a DR secondary of the new primary with `update-primary`.
//! Also: secondaries disabled and re-enabled; LDAP logins ([`crate::ldap`]) on the primary
//! and performance secondaries; token creation on performance secondaries.
//!
//! Invariants: `failover` (after the promote, each key on the new primary holds a value the
//! old primary's history allows at the WAL index the DR secondary had replicated — checked
//! by the final read-back), `wal-continues` (the primary's WAL index never goes back, and
//! continues from the promoted secondary's), `gates`, `login` (see [`crate::ldap`]),
//! `filters` (no KV data of the denied mount, no primary token on a performance
//! secondary; a primary token gets 403 there), `revocation` (no key written after the revoke
//! was acknowledged reaches the revoked secondary), `convergence` + `liveness` (every active
//! secondary matches the primary — equal Merkle roots, or equal replicated KV for filtered
//! ones — within [`CONVERGE_MS`] of the final phase), `durability` (acknowledged writes on the
//! primary survive its crashes).

use crate::check::Violation;
use crate::net::{Addr, HostId, Link, Network, Route};
use crate::rng::SimRng;
use crate::storage::SimStorage;
use crate::trace::{shorten, Trace};
use cairn_core::api::RequestId;
use cairn_core::replication::class::{self as rclass, Class};
use cairn_core::replication::merkle::{self, Record, TreeKind, Trees};
use cairn_core::replication::reindex::report_json as reindex_report;
use cairn_core::replication::{
    HttpReply, Mode, PeerAnswer, PeerMsg, PeerReply, PeerRequest, ReplicationConfig,
};
use cairn_core::{
    Admin, AdminResult, Input, Method, Node, NodeConfig, Output, Request, Response, Storage,
};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// Simulated time the final phase may take to converge, plus [`SYNC_MS_PER_CALL`] for each
/// Merkle-sync fetch the primary's keys need (a lossy link restarts the diff after a
/// transport error, so a large store with small fetch batches syncs at a few keys a second).
pub const CONVERGE_MS: u64 = 180_000;
/// See [`CONVERGE_MS`].
pub const SYNC_MS_PER_CALL: u64 = 500;
/// Transport timeout after which a lost message becomes an error at the caller.
const TIMEOUT_MS: u64 = 3_000;

/// Whether seed `seed` runs a replication topology (about a third of the seeds).
pub fn wants_replication(seed: u64) -> bool {
    SimRng::derive(seed, "topology-0").chance(350)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Primary,
    Perf { filtered: bool },
    Dr,
}

#[derive(Debug, Clone)]
pub struct Params {
    pub kinds: Vec<Kind>,
    pub client_link: Link,
    pub peer_link: Link,
    pub commit_window_ms: u64,
    pub tick_ms: u64,
    pub wal_max_entries: u64,
    pub pull_wait_ms: u64,
    pub fetch_batch: usize,
    pub batch_entries: u32,
    pub crash_mean_ms: u64,
    pub crash_in_batch_permille: u64,
    pub downtime_mean_ms: u64,
    pub partition_mean_ms: u64,
    pub partition_len_ms: u64,
    pub think_ms: u64,
    pub revoke_permille: u64,
    /// Mean time between planted corruptions (a Merkle record anywhere, a replicated value
    /// on a secondary); 0: none.
    pub corrupt_mean_ms: u64,
    /// Chance (‰) per operator step of a reindex or Merkle check.
    pub scan_permille: u64,
}

impl Params {
    pub fn derive(seed: u64) -> Params {
        let mut r = SimRng::derive(seed, "repl-params");
        let n = r.range(1, 3) as usize;
        let mut kinds = vec![Kind::Primary];
        for _ in 0..n {
            kinds.push(match r.below(10) {
                0..=4 => Kind::Perf { filtered: false },
                5..=7 => Kind::Perf { filtered: true },
                _ => Kind::Dr,
            });
        }
        Params {
            kinds,
            client_link: Link {
                delay_mean: r.range(0, 3),
                loss_permille: 0,
                fifo: true,
                up: true,
            },
            peer_link: Link {
                delay_mean: r.range(0, 20),
                loss_permille: *r.pick(&[0, 0, 10, 50]).unwrap_or(&0),
                fifo: r.chance(500),
                up: true,
            },
            commit_window_ms: r.range(0, 5),
            tick_ms: *r.pick(&[250, 1000]).unwrap_or(&1000),
            wal_max_entries: *r.pick(&[8, 30, 1000]).unwrap_or(&1000),
            pull_wait_ms: *r.pick(&[100, 500, 2000]).unwrap_or(&500),
            fetch_batch: *r.pick(&[2, 16, 512]).unwrap_or(&16),
            batch_entries: *r.pick(&[4, 512]).unwrap_or(&512) as u32,
            crash_mean_ms: *r.pick(&[5_000, 20_000, 60_000]).unwrap_or(&20_000),
            crash_in_batch_permille: *r.pick(&[0, 2, 10]).unwrap_or(&2),
            downtime_mean_ms: *r.pick(&[100, 1_000, 5_000]).unwrap_or(&1_000),
            partition_mean_ms: *r.pick(&[3_000, 15_000, 60_000]).unwrap_or(&15_000),
            partition_len_ms: *r.pick(&[500, 5_000, 20_000]).unwrap_or(&5_000),
            think_ms: *r.pick(&[5, 30, 200]).unwrap_or(&30),
            revoke_permille: *r.pick(&[0, 5, 20]).unwrap_or(&5),
            corrupt_mean_ms: *r.pick(&[0, 8_000, 30_000]).unwrap_or(&0),
            scan_permille: *r.pick(&[4, 12, 30]).unwrap_or(&12),
        }
    }

    pub fn describe(&self) -> String {
        let kinds: Vec<String> = self
            .kinds
            .iter()
            .map(|k| match k {
                Kind::Primary => "perf+primary".to_string(),
                Kind::Perf { filtered: false } => "perf".to_string(),
                Kind::Perf { filtered: true } => "perf(filtered)".to_string(),
                Kind::Dr => "dr".to_string(),
            })
            .collect();
        format!(
            "topology=[{}] peer-delay={}ms peer-loss={}‰ peer-fifo={} commit-window={}ms tick={}ms \
             wal-max={} pull-wait={}ms fetch-batch={} batch-entries={} crash-every~{}ms downtime~{}ms \
             partition-every~{}ms partition-len~{}ms think={}ms revoke={}‰ corrupt-every~{}ms scans={}‰",
            kinds.join(","),
            self.peer_link.delay_mean,
            self.peer_link.loss_permille,
            self.peer_link.fifo,
            self.commit_window_ms,
            self.tick_ms,
            self.wal_max_entries,
            self.pull_wait_ms,
            self.fetch_batch,
            self.batch_entries,
            self.crash_mean_ms,
            self.downtime_mean_ms,
            self.partition_mean_ms,
            self.partition_len_ms,
            self.think_ms,
            self.revoke_permille,
            self.corrupt_mean_ms,
            self.scan_permille,
        )
    }
}

fn api_addr(h: HostId) -> String {
    format!("http://api{h}:8200")
}
fn cluster_addr(h: HostId) -> String {
    format!("cluster{h}:8201")
}

/// Who waits for an API response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    Operator,
    Http { host: HostId, boot: u64, call: u64 },
}

#[derive(Debug, Clone)]
enum Ev {
    ApiReq {
        to: HostId,
        from: Caller,
        req: Request,
    },
    ApiResp {
        to: Caller,
        id: RequestId,
        resp: Result<Response, String>,
    },
    PeerReq {
        to: HostId,
        from: HostId,
        boot: u64,
        call: u64,
        msg: PeerMsg,
    },
    PeerRep {
        to: HostId,
        boot: u64,
        call: u64,
        result: Result<PeerAnswer, String>,
    },
    Commit {
        host: HostId,
        batch: u64,
    },
    Crash(HostId),
    Restart(HostId),
    Wake,
    LdapRep {
        host: HostId,
        boot: u64,
        reply: cairn_core::auth::ldap::LdapReply,
    },
    NextCrash,
    NextPartition,
    Heal(HostId, HostId),
    NextCorrupt,
}

struct Host {
    kind: Kind,
    node: Option<Node<SimStorage>>,
    parked: Option<SimStorage>,
    boot: u64,
    batch: u64,
    held: Vec<Output>,
    commit_scheduled: bool,
    /// API requests from other nodes' HttpCalls: request id → caller.
    http_in: BTreeMap<RequestId, Caller>,
    /// Operator requests handled and not yet answered.
    op_in: BTreeSet<RequestId>,
    /// Peer requests being served: peer id → (caller host, boot, call id).
    peer_in: BTreeMap<u64, (HostId, u64, u64)>,
    next_peer: u64,
    seeds: SimRng,
    root: String,
    key: String,
    needs_unseal: bool,
    /// Planted corruption (see [`Rot`]).
    rot: Rot,
}

/// Corruption planted in one host's storage and what repairs it.
#[derive(Debug, Clone, Default)]
struct Rot {
    /// Bumped by every planting; `values` by value plantings only.
    gen: u64,
    values_gen: u64,
    /// Something was planted since the start of the last reindex whose answer arrived:
    /// a Merkle check must then be clean, and the final phase reindexes the host.
    dirty: bool,
    /// Every planted Merkle record: key → the corrupted bytes (while storage still holds
    /// exactly them, a Merkle check must report that record). A key is planted once.
    records: BTreeMap<String, Vec<u8>>,
    /// Replicated values planted (storage keys): after the final repair they must equal
    /// the primary's.
    values: BTreeSet<String>,
    /// Failed final-phase repair attempts.
    repair_tries: u32,
}

/// A reindex or Merkle check the operator has in flight, as the node took it.
#[derive(Debug, Clone, Copy)]
struct ScanStart {
    id: RequestId,
    h: HostId,
    gen: u64,
    values_gen: u64,
    /// A scan was already running on the node (the request must be refused).
    busy: bool,
}

/// What the operator's outstanding request is.
#[derive(Debug, Clone)]
enum Op {
    Unseal(HostId),
    Mount,
    EnablePrimary(Mode),
    SecToken(usize),
    Filter(usize),
    SecEnable(usize),
    Put {
        n: u64,
        other: bool,
    },
    Delete {
        n: u64,
        other: bool,
    },
    Policy,
    TokenCreate,
    Probe(HostId),
    Read(HostId, bool, u64),
    /// A read on a performance secondary carrying the `X-Vault-Index` of the last
    /// acknowledged write (its key, and its position in that key's history).
    ReadAt {
        h: HostId,
        other: bool,
        key: u64,
        pos: usize,
    },
    Revoke(usize),
    GenAttempt(usize),
    GenCancel(usize),
    GenUpdate(usize),
    ReadBack(u64),
    /// DR operation token generation on a host: start, cancel, give a share (`wrong`: a
    /// share of another keyring, which must be refused).
    TokAttempt(HostId),
    TokCancel(HostId),
    TokUpdate(HostId, bool),
    /// DR promote of the drill's secondary (`with_token: false` is the gate probe).
    Promote {
        h: HostId,
        with_token: bool,
    },
    /// Re-pointing (or re-joining) secondary `i` to the current primary.
    UpdatePrimary {
        i: usize,
        by_token: bool,
    },
    /// On the old primary: performance `primary/disable`, or DR `primary/demote`.
    OldPrimary {
        h: HostId,
        mode: Mode,
    },
    /// `secondary/disable` then the setup loop re-enables it with a fresh token.
    SecDisable(usize),
    LdapMount,
    LdapConfig,
    LdapMap,
    Login(crate::ldap::Attempt),
    SecTokenCreate(HostId),
    /// `reindex` (with flags diff, force, skip_flush) or `merkle-check` on host `h`;
    /// `repair`: the final phase's repair of planted corruption.
    Scan {
        h: HostId,
        reindex: Option<[bool; 3]>,
        repair: bool,
    },
}

/// The DR operation token state of one host.
#[derive(Debug, Clone, Default)]
struct OpTok {
    gen: Option<(String, String)>,
    cancel: bool,
    tries: u32,
    token: Option<String>,
    wrong_tried: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DStep {
    Promote,
    Repoint,
    Rejoin,
    Done,
}

/// A DR failover drill: primary lost → DR promote → secondaries re-pointed → the old
/// primary demoted and re-joined as a DR secondary of the new one.
#[derive(Debug, Clone)]
struct Drill {
    /// Index (in `secs`) of the DR secondary that is promoted.
    dr: usize,
    old: HostId,
    force: bool,
    /// The unforced promote was refused because the secondary had not finished its Merkle
    /// sync; the forced one accepts losing what it had not fetched.
    lossy: bool,
    step: DStep,
    gate_probed: bool,
    perf_off: bool,
    dr_demoted: bool,
    rejoin: Option<usize>,
}

/// A secondary the operator manages.
#[derive(Debug, Clone)]
struct Sec {
    host: HostId,
    mode: Mode,
    filtered: bool,
    attempt: u32,
    id: String,
    /// Every id an activation was attempted with (an enable whose answer was lost may
    /// have used any of them).
    ids: Vec<String>,
    revoke_left: Vec<String>,
    token: Option<String>,
    filter_set: bool,
    /// Upper bound of the WAL index of the acknowledged paths-filter write.
    filter_wal: u64,
    /// A failover may have lost the filter (its write was not known to be replicated to the
    /// promoted DR secondary): filtered or not, both are right until it is set again.
    filter_unsure: bool,
    enabled: bool,
    /// Key number from which writes must not reach it (revoke acknowledged).
    revoked_from: Option<u64>,
    revoke_sent: bool,
    /// A root token generated on the secondary itself (its own tokens are gone once it
    /// follows a performance primary): (otp, nonce) of the attempt, then the token.
    gen: Option<(String, String)>,
    gen_cancel: bool,
    gen_tries: u32,
    local_root: Option<String>,
    /// Pending re-point to a new primary: Some(true) by activation token, Some(false) by
    /// `update_primary_addrs`.
    repoint: Option<bool>,
    repoint_fails: u32,
    /// Joins with `update-primary` (the demoted old primary) rather than `enable`.
    rejoin: bool,
    /// Promoted: no longer a secondary.
    gone: bool,
    /// Its roots equalled the primary's at least once (a DR secondary that may be promoted).
    synced_once: bool,
    /// Disable-and-re-enable drill pending.
    disable: bool,
    /// Holds the LDAP mount and config (it matched the primary since they were written).
    ldap_ready: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Chaos,
    Final,
    ReadBack,
    Done,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub events: u64,
    pub ticks: u64,
    pub commits: u64,
    pub crashes: u64,
    pub restarts: u64,
    pub requests: u64,
    pub lost_requests: u64,
    pub peer_msgs: u64,
    pub peer_errors: u64,
    pub partitions: u64,
    pub converge_ms: u64,
}

pub struct ReplWorld {
    pub now: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Ev>,
    hosts: Vec<Host>,
    net: Network,
    params: Params,
    faults: SimRng,
    oprng: SimRng,
    trace: Trace,
    next_id: RequestId,
    outstanding: Option<(RequestId, HostId, Op)>,
    unseal_tries: Vec<usize>,
    /// No unseal attempt on a host before this time (it answered "not initialized").
    unseal_after: Vec<u64>,
    /// Hosts that answered "not initialized" to an unseal (known core bug
    /// `secondary-uninitialized-after-restart`).
    uninit: BTreeSet<HostId>,
    tolerate: bool,
    last_conv_check: u64,
    secs: Vec<Sec>,
    mounted: bool,
    perf_enabled: bool,
    dr_enabled: bool,
    next_key: u64,
    /// Acknowledged state of each key on the primary: Some(value) or None (deleted);
    /// absent from the map: unknown (a write whose answer was lost).
    model: BTreeMap<(bool, u64), Option<u64>>,
    uncertain: BTreeSet<(bool, u64)>,
    primary_tokens: Vec<String>,
    readback: Vec<(bool, u64)>,
    phase: Phase,
    chaos_steps: u64,
    final_start: u64,
    pub stats: Stats,
    pub checks: BTreeMap<&'static str, u64>,
    /// The current primary (host 0 until a failover).
    primary: HostId,
    /// The convergence bound of this run's final phase (see [`CONVERGE_MS`]).
    converge_bound: u64,
    drill: Option<Drill>,
    /// Chaos event count from which a failover drill may start (seeds with a DR secondary).
    drill_at: Option<u64>,
    /// A crashed host that stays down until the drill brings it back.
    held_down: Option<HostId>,
    /// A host cut off from every other host until the drill heals it.
    isolated: Option<HostId>,
    optok: Vec<OpTok>,
    /// Acknowledged (and uncertain) writes of each key on the primary, in order: (upper
    /// bound of the WAL index it got, value); `u64::MAX` when unknown.
    hist: BTreeMap<(bool, u64), Vec<WalWrite>>,
    /// The last acknowledged write on the primary with its `X-Vault-Index`: (other, key,
    /// position in `hist`, state). Cleared by a failover (a new primary, new cluster ids).
    last_put: Option<(bool, u64, usize, String)>,
    /// After a failover: the values each key may hold on the new primary.
    failover_allowed: BTreeMap<(bool, u64), BTreeSet<Option<u64>>>,
    /// The primary's `wal.last` when the outstanding operator request's answer was released.
    out_wal: Option<u64>,
    /// The primary's WAL never goes back (and continues from the promoted DR secondary's).
    wal_floor: u64,
    /// `wal.last` of a host just before it handled a DR promote.
    pre_promote_wal: BTreeMap<HostId, u64>,
    failed_over: bool,
    ldap: crate::ldap::Ldap,
    ldap_rng: SimRng,
    ldap_mounted: bool,
    ldap_configured: bool,
    /// When each host last handled a directory answer.
    ldap_at: BTreeMap<HostId, u64>,
    corrupt_rng: SimRng,
    scan_rng: SimRng,
    scan: Option<ScanStart>,
    /// A violation found while draining a node's outputs (returned by the next step).
    pending: Option<Violation>,
}

/// A write of a key: (upper bound of its WAL index, value or delete).
type WalWrite = (u64, Option<u64>);

fn fail<T>(invariant: &'static str, detail: impl Into<String>) -> Result<T, Violation> {
    Err(Violation {
        invariant,
        detail: detail.into(),
    })
}

fn key_name(other: bool, n: u64) -> String {
    if other {
        format!("other/o-{n}")
    } else {
        format!("secret/s-{n}")
    }
}

impl ReplWorld {
    pub fn new(cfg: &crate::RunConfig) -> ReplWorld {
        let seed = cfg.seed;
        let params = Params::derive(seed);
        let mut trace = Trace::new(cfg.print_trace);
        trace.log(
            0,
            &format!("seed={seed} tier=fast replication {}", params.describe()),
        );
        let hosts = params
            .kinds
            .iter()
            .enumerate()
            .map(|(h, k)| Host {
                kind: *k,
                node: None,
                parked: Some(SimStorage::new()),
                boot: 0,
                batch: 0,
                held: Vec::new(),
                commit_scheduled: false,
                http_in: BTreeMap::new(),
                op_in: BTreeSet::new(),
                peer_in: BTreeMap::new(),
                next_peer: 0,
                seeds: SimRng::derive(seed, &format!("host/{h}/boot-seeds")),
                root: format!("root-n{h}"),
                key: String::new(),
                needs_unseal: false,
                rot: Rot::default(),
            })
            .collect();
        let secs = params
            .kinds
            .iter()
            .enumerate()
            .filter_map(|(h, k)| match k {
                Kind::Primary => None,
                Kind::Perf { filtered } => Some((h, Mode::Performance, *filtered)),
                Kind::Dr => Some((h, Mode::Dr, false)),
            })
            .map(|(host, mode, filtered)| Sec {
                host,
                mode,
                filtered,
                attempt: 0,
                id: format!("n{host}-0"),
                ids: Vec::new(),
                revoke_left: Vec::new(),
                token: None,
                filter_set: false,
                filter_wal: u64::MAX,
                filter_unsure: false,
                enabled: false,
                revoked_from: None,
                revoke_sent: false,
                gen: None,
                gen_cancel: false,
                gen_tries: 0,
                local_root: None,
                repoint: None,
                repoint_fails: 0,
                rejoin: false,
                gone: false,
                synced_once: false,
                disable: false,
                ldap_ready: false,
            })
            .collect();
        let mut net = Network::new(SimRng::derive(seed, "network"), params.client_link);
        let n = params.kinds.len();
        let mut w = ReplWorld {
            now: 0,
            seq: 0,
            queue: BTreeMap::new(),
            hosts,
            net: Network::new(SimRng::derive(seed, "unused"), params.client_link),
            faults: SimRng::derive(seed, "faults"),
            oprng: SimRng::derive(seed, "operator"),
            trace,
            next_id: 1,
            outstanding: None,
            unseal_tries: vec![0; n],
            unseal_after: vec![0; n],
            uninit: BTreeSet::new(),
            tolerate: cfg.tolerate_known_bugs,
            last_conv_check: 0,
            secs,
            mounted: false,
            perf_enabled: false,
            dr_enabled: false,
            next_key: 0,
            model: BTreeMap::new(),
            uncertain: BTreeSet::new(),
            primary_tokens: Vec::new(),
            readback: Vec::new(),
            phase: Phase::Chaos,
            chaos_steps: cfg.steps,
            final_start: 0,
            stats: Stats::default(),
            checks: BTreeMap::new(),
            primary: 0,
            converge_bound: CONVERGE_MS,
            drill: None,
            drill_at: None,
            held_down: None,
            isolated: None,
            optok: vec![OpTok::default(); n],
            hist: BTreeMap::new(),
            last_put: None,
            failover_allowed: BTreeMap::new(),
            out_wal: None,
            wal_floor: 0,
            pre_promote_wal: BTreeMap::new(),
            failed_over: false,
            ldap: crate::ldap::Ldap::new(),
            ldap_rng: SimRng::derive(seed, "ldap"),
            ldap_mounted: false,
            ldap_configured: false,
            ldap_at: BTreeMap::new(),
            corrupt_rng: SimRng::derive(seed, "repl-corrupt"),
            scan_rng: SimRng::derive(seed, "repl-scan"),
            scan: None,
            pending: None,
            params,
        };
        {
            let mut r = SimRng::derive(seed, "repl-drill");
            let has_dr = w.secs.iter().any(|s| s.mode == Mode::Dr);
            if has_dr && r.chance(700) {
                let lo = cfg.steps / 6;
                w.drill_at = Some(lo + r.below(cfg.steps / 3 + 1));
            }
        }
        for a in 0..n {
            for b in 0..n {
                if a != b {
                    net.set_link(Addr::Host(a), Addr::Host(b), w.params.peer_link);
                }
            }
        }
        w.net = net;
        for h in 0..n {
            w.boot(h);
            w.dev_setup(h);
        }
        w.schedule(1, Ev::Wake);
        let d = w.faults.delay(w.params.crash_mean_ms);
        w.schedule(d, Ev::NextCrash);
        let d = w.faults.delay(w.params.partition_mean_ms);
        w.schedule(d, Ev::NextPartition);
        if w.params.corrupt_mean_ms > 0 {
            let d = w.corrupt_rng.delay(w.params.corrupt_mean_ms).max(1);
            w.schedule(d, Ev::NextCorrupt);
        }
        w
    }

    pub fn params(&self) -> &Params {
        &self.params
    }
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    fn bump(&mut self, inv: &'static str) {
        *self.checks.entry(inv).or_insert(0) += 1;
    }

    fn schedule(&mut self, delay: u64, ev: Ev) {
        self.seq += 1;
        self.queue.insert((self.now + delay, self.seq), ev);
    }

    fn log(&mut self, what: &str) {
        self.trace.log(self.now, what);
    }

    fn config(&self, h: HostId) -> NodeConfig {
        NodeConfig {
            node_id: format!("n{h}"),
            tick_ms: self.params.tick_ms,
            replication: ReplicationConfig {
                api_addr: api_addr(h),
                cluster_addr: cluster_addr(h),
                wal: cairn_core::replication::wal::Limits {
                    max_entries: self.params.wal_max_entries,
                    max_bytes: 64 << 20,
                },
                pull_wait_ms: self.params.pull_wait_ms,
                batch_entries: self.params.batch_entries,
                fetch_batch: self.params.fetch_batch,
                ..Default::default()
            },
            license: cairn_core::license::LicenseState::hosted(),
            ..NodeConfig::default()
        }
    }

    fn boot(&mut self, h: HostId) {
        let config = self.config(h);
        let host = &mut self.hosts[h];
        let Some(storage) = host.parked.take() else {
            return;
        };
        let seed = host.seeds.seed32();
        host.boot += 1;
        host.batch += 1;
        host.commit_scheduled = false;
        let mut node = Node::new(storage, seed, config);
        // Batched like the shell: held pulls are answered at the batch's commit.
        node.set_batched(true);
        host.node = Some(node);
        host.needs_unseal = host.boot > 1;
        let boot = host.boot;
        self.ldap.on_boot(h);
        let kind = host.kind;
        self.log(&format!("n{h} ({kind:?}) start boot={boot}"));
    }

    /// Dev set-up at time 0, committed at once (not part of the fault model).
    fn dev_setup(&mut self, h: HostId) {
        let root = self.hosts[h].root.clone();
        let now = self.now;
        let host = &mut self.hosts[h];
        let Some(node) = host.node.as_mut() else {
            return;
        };
        node.handle(
            now,
            Input::Admin {
                id: 1,
                cmd: Admin::DevSetup {
                    root_token_id: Some(root),
                },
            },
        );
        while let Some(o) = node.poll_output() {
            if let Output::AdminDone {
                result: Ok(AdminResult::DevSetup(keys)),
                ..
            } = o
            {
                host.key = keys.keys_base64.first().cloned().unwrap_or_default();
            }
        }
        node.storage_mut().commit();
        let ok = !host.key.is_empty();
        self.log(&format!(
            "n{h} dev set-up key={}",
            if ok { "ok" } else { "MISSING" }
        ));
    }

    fn next_tick(&self) -> Option<(u64, HostId)> {
        self.hosts
            .iter()
            .enumerate()
            .filter_map(|(h, x)| x.node.as_ref().map(|n| (n.poll_timeout(), h)))
            .min()
    }

    /// Processes one event.
    pub fn step(&mut self) -> Result<bool, Violation> {
        if self.phase == Phase::Chaos && self.stats.events >= self.chaos_steps {
            self.begin_final();
        }
        if self.phase == Phase::Final {
            self.check_convergence()?;
        }
        if self.phase == Phase::Done {
            return Ok(false);
        }
        let tick = self.next_tick();
        let queued = self.queue.first_key_value().map(|((at, _), _)| *at);
        let take_tick = match (tick, queued) {
            (Some((t, _)), Some(q)) => t < q,
            (Some(_), None) => true,
            (None, _) => false,
        };
        self.stats.events += 1;
        if take_tick {
            let (at, h) = tick.unwrap_or_default();
            self.now = self.now.max(at);
            self.stats.ticks += 1;
            let now = self.now;
            if let Some(n) = self.hosts[h].node.as_mut() {
                n.handle(now, Input::Tick);
            }
            self.drain(h);
            self.schedule_commit(h)?;
        } else if let Some(((at, _), ev)) = self.queue.pop_first() {
            self.now = self.now.max(at);
            self.event(ev)?;
        } else {
            return fail("liveness", "nothing left to happen");
        }
        if let Some(v) = self.pending.take() {
            return Err(v);
        }
        Ok(true)
    }

    fn begin_final(&mut self) {
        self.phase = Phase::Final;
        self.final_start = self.now;
        let keys = self.hosts[self.primary]
            .parked
            .as_ref()
            .map(|s| s.committed_len())
            .or_else(|| {
                self.hosts[self.primary]
                    .node
                    .as_ref()
                    .map(|n| n.storage().committed_len())
            })
            .unwrap_or(0) as u64;
        self.converge_bound =
            CONVERGE_MS + keys.div_ceil(self.params.fetch_batch.max(1) as u64) * SYNC_MS_PER_CALL;
        self.log("final phase: faults and writes stop, network heals, every host restarts and is unsealed; waiting for convergence");
        let n = self.hosts.len();
        for a in 0..n {
            for b in 0..n {
                if a != b && self.isolated != Some(a) && self.isolated != Some(b) {
                    self.net
                        .set_link(Addr::Host(a), Addr::Host(b), self.params.peer_link);
                }
            }
        }
        for h in 0..n {
            if self.hosts[h].node.is_none() && self.held_down != Some(h) {
                self.boot(h);
            }
        }
    }

    fn event(&mut self, ev: Ev) -> Result<(), Violation> {
        match ev {
            Ev::ApiReq { to, from, req } => {
                let id = req.id;
                if self.hosts[to].node.is_none() {
                    self.log(&format!("n{to} is down: #{id} refused"));
                    self.reply_api(to, from, id, Err("connection refused".into()));
                    return Ok(());
                }
                if req.path.starts_with("auth/ldap/login/") {
                    if let Some((_, _, Op::Login(a))) = self.outstanding.as_mut() {
                        a.t0 = self.now;
                    }
                }
                if from == Caller::Operator
                    && matches!(&self.outstanding, Some((o, _, Op::Scan { .. })) if *o == id)
                {
                    let x = &self.hosts[to];
                    self.scan = Some(ScanStart {
                        id,
                        h: to,
                        gen: x.rot.gen,
                        values_gen: x.rot.values_gen,
                        busy: x
                            .node
                            .as_ref()
                            .is_some_and(|n| n.replication().scan_progress().is_some()),
                    });
                }
                let Some(node) = self.hosts[to].node.as_mut() else {
                    return Ok(());
                };
                if req.path == "sys/replication/dr/secondary/promote" {
                    let last = node.replication().wal.last;
                    self.pre_promote_wal.insert(to, last);
                    // A promote of a copy that has not finished its Merkle sync can only
                    // succeed forced, and then loses what was not fetched yet.
                    if node.replication().syncing(Mode::Dr) {
                        if let Some(d) = self.drill.as_mut() {
                            d.lossy = true;
                        }
                    }
                }
                node.handle(self.now, Input::Request(req));
                match from {
                    Caller::Http { .. } => {
                        self.hosts[to].http_in.insert(id, from);
                    }
                    Caller::Operator => {
                        self.hosts[to].op_in.insert(id);
                    }
                }
                self.drain(to);
                self.schedule_commit(to)
            }
            Ev::ApiResp { to, id, resp } => match to {
                Caller::Http { host, boot, call } => {
                    if self.hosts[host].boot != boot || self.hosts[host].node.is_none() {
                        return Ok(());
                    }
                    let result = resp.map(|r| {
                        let body = r
                            .body
                            .as_ref()
                            .map(|b| serde_json::to_vec(b).unwrap_or_default())
                            .unwrap_or_default();
                        (r.status, body)
                    });
                    self.log(&format!(
                        "n{host} <- http reply call={call} {}",
                        match &result {
                            Ok((s, _)) => s.to_string(),
                            Err(e) => e.clone(),
                        }
                    ));
                    let now = self.now;
                    if let Some(n) = self.hosts[host].node.as_mut() {
                        n.handle(
                            now,
                            Input::HttpReply(HttpReply {
                                call_id: call,
                                result,
                            }),
                        );
                    }
                    self.drain(host);
                    self.schedule_commit(host)
                }
                Caller::Operator => self.on_reply(id, resp),
            },
            Ev::PeerReq {
                to,
                from,
                boot,
                call,
                msg,
            } => {
                self.stats.peer_msgs += 1;
                if self.hosts[to].node.is_none() {
                    self.peer_error(from, boot, call, "connection refused", to);
                    return Ok(());
                }
                let host = &mut self.hosts[to];
                host.next_peer += 1;
                let pid = host.next_peer;
                host.peer_in.insert(pid, (from, boot, call));
                let now = self.now;
                if let Some(n) = host.node.as_mut() {
                    n.handle(now, Input::PeerRequest(PeerRequest { id: pid, msg }));
                }
                self.drain(to);
                self.schedule_commit(to)
            }
            Ev::PeerRep {
                to,
                boot,
                call,
                result,
            } => {
                if self.hosts[to].boot != boot || self.hosts[to].node.is_none() {
                    return Ok(());
                }
                if let Err(e) = &result {
                    self.stats.peer_errors += 1;
                    self.log(&format!("n{to} <- peer error call={call}: {e}"));
                }
                let now = self.now;
                if let Some(n) = self.hosts[to].node.as_mut() {
                    n.handle(
                        now,
                        Input::PeerReply(PeerReply {
                            call_id: call,
                            result,
                        }),
                    );
                }
                self.drain(to);
                self.schedule_commit(to)
            }
            Ev::Commit { host, batch } => {
                if self.hosts[host].batch == batch {
                    self.commit(host)?;
                }
                Ok(())
            }
            Ev::Crash(h) => self.crash(h),
            Ev::Restart(h) => {
                if self.held_down == Some(h) {
                    self.log(&format!("n{h} stays down (failover drill)"));
                    return Ok(());
                }
                self.stats.restarts += 1;
                self.boot(h);
                Ok(())
            }
            Ev::Wake => self.wake(),
            Ev::LdapRep { host, boot, reply } => {
                if self.hosts[host].boot != boot || self.hosts[host].node.is_none() {
                    return Ok(());
                }
                let now = self.now;
                self.ldap_at.insert(host, now);
                if let Some(n) = self.hosts[host].node.as_mut() {
                    n.handle(now, Input::Ldap(reply));
                }
                self.drain(host);
                self.schedule_commit(host)
            }
            Ev::NextCrash => {
                if self.phase == Phase::Chaos {
                    let h = self.faults.below(self.hosts.len() as u64) as usize;
                    if self.hosts[h].node.is_some() {
                        self.crash(h)?;
                    }
                    let d = self.faults.delay(self.params.crash_mean_ms).max(1);
                    self.schedule(d, Ev::NextCrash);
                }
                Ok(())
            }
            Ev::NextPartition => {
                if self.phase == Phase::Chaos && self.hosts.len() > 1 {
                    let p = self.primary;
                    let s = (p + 1 + self.faults.below(self.hosts.len() as u64 - 1) as usize)
                        % self.hosts.len();
                    if self.isolated != Some(p) && self.isolated != Some(s) {
                        self.stats.partitions += 1;
                        self.net.partition(Addr::Host(p), Addr::Host(s));
                        self.log(&format!("net PARTITION n{p} | n{s}"));
                        let d = self.faults.delay(self.params.partition_len_ms).max(1);
                        self.schedule(d, Ev::Heal(p, s));
                    }
                    let d = self.faults.delay(self.params.partition_mean_ms).max(1);
                    self.schedule(d, Ev::NextPartition);
                }
                Ok(())
            }
            Ev::Heal(a, b) => {
                if self.isolated == Some(a) || self.isolated == Some(b) {
                    return Ok(());
                }
                self.heal(a, b);
                Ok(())
            }
            Ev::NextCorrupt => {
                if self.phase == Phase::Chaos {
                    self.plant_corruption();
                    let d = self.corrupt_rng.delay(self.params.corrupt_mean_ms).max(1);
                    self.schedule(d, Ev::NextCorrupt);
                }
                Ok(())
            }
        }
    }

    fn heal(&mut self, a: HostId, b: HostId) {
        let l = self.params.peer_link;
        self.net.set_link(Addr::Host(a), Addr::Host(b), l);
        self.net.set_link(Addr::Host(b), Addr::Host(a), l);
        self.log(&format!("net HEAL n{a} | n{b}"));
    }

    fn peer_error(&mut self, to: HostId, boot: u64, call: u64, why: &str, from: HostId) {
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

    fn net_delay(&mut self, from: HostId, to: HostId) -> u64 {
        let l = self.net.link(Addr::Host(from), Addr::Host(to));
        self.faults.delay(l.delay_mean)
    }

    fn reply_api(
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

    fn drain(&mut self, h: HostId) {
        let host = &mut self.hosts[h];
        let Some(node) = host.node.as_mut() else {
            return;
        };
        let mut calls = Vec::new();
        let mut early = Vec::new();
        let scan_id = self.scan.filter(|s| s.h == h).map(|s| s.id);
        let mut scan_answer = None;
        while let Some(o) = node.poll_output() {
            if let Output::Response(r) = &o {
                if Some(r.id) == scan_id {
                    scan_answer = Some(r.clone());
                }
            }
            match o {
                Output::Audit { .. } | Output::ClusterTls(_) => {}
                // The shell hands LDAP calls to its pool at once, before the batch commits.
                Output::Ldap(c) => calls.push(c),
                // Calls to the primary leave before the batch is durable (the shell sends
                // them at the end of the batch, before the sync); here even earlier, so a
                // crash in the commit window loses what a pull already told the primary.
                o @ Output::PeerSend(_) => early.push(o),
                other => host.held.push(other),
            }
        }
        let boot = host.boot;
        if let Some(r) = scan_answer {
            if self.pending.is_none() {
                if let Err(v) = self.on_scan_answer(h, &r) {
                    self.pending = Some(v);
                }
            }
        }
        for o in early {
            self.release(h, o);
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
    }

    fn schedule_commit(&mut self, h: HostId) -> Result<(), Violation> {
        let host = &self.hosts[h];
        let dirty = host.node.as_ref().is_some_and(|n| n.storage().is_dirty());
        if host.held.is_empty() && !dirty {
            return Ok(());
        }
        if host.commit_scheduled {
            return Ok(());
        }
        let batch = host.batch;
        let d = self.faults.range(0, self.params.commit_window_ms);
        if self.phase == Phase::Chaos && self.faults.chance(self.params.crash_in_batch_permille) {
            let c = self.faults.range(0, d);
            self.schedule(c, Ev::Crash(h));
        }
        self.hosts[h].commit_scheduled = true;
        self.schedule(d, Ev::Commit { host: h, batch });
        Ok(())
    }

    fn commit(&mut self, h: HostId) -> Result<(), Violation> {
        // The end of the batch: held pulls get the batch's WAL entries.
        let now = self.now;
        if let Some(n) = self.hosts[h].node.as_mut() {
            n.end_batch(now);
        }
        self.drain(h);
        let host = &mut self.hosts[h];
        let Some(node) = host.node.as_mut() else {
            return Ok(());
        };
        node.storage_mut().commit();
        host.batch += 1;
        host.commit_scheduled = false;
        self.stats.commits += 1;
        let held = std::mem::take(&mut host.held);
        for o in held {
            self.release(h, o);
        }
        self.check_wal(h)?;
        self.check_host(h)
    }

    /// `wal-continues`: the primary's WAL index never goes back, and after a failover it
    /// continues from the promoted DR secondary's. Also notes DR secondaries that synced.
    fn check_wal(&mut self, h: HostId) -> Result<(), Violation> {
        if self.hosts[h].needs_unseal {
            return Ok(());
        }
        let Some(last) = self.hosts[h]
            .node
            .as_ref()
            .map(|n| n.replication().wal.last)
        else {
            return Ok(());
        };
        if h == self.primary && last > 0 {
            self.bump("wal-continues");
            if last < self.wal_floor {
                return fail(
                    "wal-continues",
                    format!(
                        "primary n{h}'s WAL went back from {} to {last}",
                        self.wal_floor
                    ),
                );
            }
            self.wal_floor = last;
        }
        if self.ldap_configured {
            if let Some(i) = self.secs.iter().position(|s| {
                s.host == h && s.mode == Mode::Performance && s.enabled && !s.ldap_ready
            }) {
                let s = self.secs[i].clone();
                if self.converged(&s).is_ok() {
                    self.secs[i].ldap_ready = true;
                }
            }
        }
        if self.drill_at.is_some() && self.drill.is_none() {
            if let Some(i) = self
                .secs
                .iter()
                .position(|s| s.host == h && s.mode == Mode::Dr && s.enabled && !s.synced_once)
            {
                let s = self.secs[i].clone();
                if self.converged(&s).is_ok() {
                    self.secs[i].synced_once = true;
                }
            }
        }
        Ok(())
    }

    fn resolve(&self, addr: &str, api: bool) -> Option<HostId> {
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

    fn release(&mut self, h: HostId, o: Output) {
        let boot = self.hosts[h].boot;
        match o {
            Output::Response(r) => {
                if self.outstanding.as_ref().is_some_and(|o| o.0 == r.id) {
                    self.out_wal = self.hosts[h]
                        .node
                        .as_ref()
                        .map(|n| n.replication().wal.last);
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
                let Some((c, cboot, call)) = self.hosts[h].peer_in.remove(&r.id) else {
                    return;
                };
                let what = serde_json::to_value(&r.msg)
                    .map(|v| shorten(&v.to_string(), 100))
                    .unwrap_or_default();
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
                let method = match c.method.as_str() {
                    "GET" => Some(Method::Get),
                    "PUT" => Some(Method::Put),
                    "POST" => Some(Method::Post),
                    "DELETE" => Some(Method::Delete),
                    _ => None,
                };
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

    fn crash(&mut self, h: HostId) -> Result<(), Violation> {
        self.stats.crashes += 1;
        let host = &mut self.hosts[h];
        let Some(node) = host.node.take() else {
            return Ok(());
        };
        let mut storage = node.into_storage();
        let info = storage.crash();
        host.parked = Some(storage);
        host.batch += 1;
        host.commit_scheduled = false;
        let held = std::mem::take(&mut host.held);
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
        for (_, (c, boot, call)) in peer_in {
            self.peer_error(c, boot, call, "connection reset", h);
        }
        let d = self.faults.delay(self.params.downtime_mean_ms).max(1);
        self.schedule(d, Ev::Restart(h));
        Ok(())
    }
}

fn status_ok(r: &Result<Response, String>) -> bool {
    matches!(r, Ok(r) if r.status < 300)
}

fn body_text(r: &Result<Response, String>) -> String {
    match r {
        Ok(r) => format!(
            "{} {}",
            r.status,
            r.body.as_ref().map(|b| b.to_string()).unwrap_or_default()
        ),
        Err(e) => e.clone(),
    }
}

/// The key number of a KV storage key written by the operator (`.../s-N` or `.../o-N`).
fn key_number(k: &str) -> Option<(bool, u64)> {
    let last = k.rsplit('/').next()?;
    if let Some(n) = last.strip_prefix("s-") {
        return n.parse().ok().map(|n| (false, n));
    }
    if let Some(n) = last.strip_prefix("o-") {
        return n.parse().ok().map(|n| (true, n));
    }
    None
}

impl ReplWorld {
    fn root(&self, h: HostId) -> String {
        self.hosts[h].root.clone()
    }

    fn sec_of(&self, h: HostId) -> Option<&Sec> {
        self.secs.iter().find(|s| s.host == h)
    }

    /// The operator's next request, if any.
    fn choose(&mut self) -> Option<(HostId, Op, Request)> {
        let id = self.next_id + 1;
        for h in 0..self.hosts.len() {
            if self.hosts[h].needs_unseal
                && self.hosts[h].node.is_some()
                && self.unseal_after[h] <= self.now
            {
                let t = self.unseal_tries[h];
                let key = if t.is_multiple_of(2) || h == 0 {
                    self.hosts[h].key.clone()
                } else {
                    self.hosts[0].key.clone()
                };
                let req =
                    Request::new(id, Method::Put, "sys/unseal").with_json(json!({ "key": key }));
                return Some((h, Op::Unseal(h), req));
            }
        }
        if matches!(self.phase, Phase::Chaos | Phase::Final) {
            if let Some(r) = self.choose_drill(id) {
                return r;
            }
        }
        if self.phase == Phase::Final {
            if let Some(r) = self.choose_repair(id) {
                return Some(r);
            }
        }
        match self.phase {
            Phase::Chaos => {}
            Phase::ReadBack => {
                let (other, n) = *self.readback.last()?;
                let req =
                    Request::new(id, Method::Get, &key_name(other, n)).with_token(&self.root(0));
                return Some((self.primary, Op::ReadBack(n), req));
            }
            _ => return None,
        }
        let r0 = self.root(0);
        if self.mounted && !self.ldap_mounted {
            let req = Request::new(id, Method::Post, "sys/auth/ldap")
                .with_token(&r0)
                .with_json(json!({"type": "ldap"}));
            return Some((self.primary, Op::LdapMount, req));
        }
        if self.mounted && !self.ldap_configured {
            let req = Request::new(id, Method::Post, "auth/ldap/config")
                .with_token(&r0)
                .with_json(crate::ldap::Ldap::config());
            return Some((self.primary, Op::LdapConfig, req));
        }
        if !self.mounted {
            let req = Request::new(id, Method::Post, "sys/mounts/other")
                .with_token(&r0)
                .with_json(json!({"type": "kv"}));
            return Some((self.primary, Op::Mount, req));
        }
        let need_dr = self.secs.iter().any(|s| s.mode == Mode::Dr);
        for (mode, done) in [
            (Mode::Performance, self.perf_enabled),
            (Mode::Dr, self.dr_enabled || !need_dr),
        ] {
            if !done {
                let req = Request::new(
                    id,
                    Method::Post,
                    &format!("sys/replication/{}/primary/enable", mode.name()),
                )
                .with_token(&r0)
                .with_json(json!({}));
                return Some((self.primary, Op::EnablePrimary(mode), req));
            }
        }
        for i in 0..self.secs.len() {
            let s = self.secs[i].clone();
            if !s.revoke_left.is_empty() {
                let rid = s.revoke_left[0].clone();
                let req = Request::new(
                    id,
                    Method::Post,
                    &format!("sys/replication/{}/primary/revoke-secondary", s.mode.name()),
                )
                .with_token(&r0)
                .with_json(json!({ "id": rid }));
                return Some((self.primary, Op::Revoke(i), req));
            }
            if s.enabled || s.revoked_from.is_some() || s.gone {
                continue;
            }
            let m = s.mode.name();
            if s.token.is_none() {
                let req = Request::new(
                    id,
                    Method::Post,
                    &format!("sys/replication/{m}/primary/secondary-token"),
                )
                .with_token(&r0)
                .with_json(json!({ "id": s.id }));
                return Some((self.primary, Op::SecToken(i), req));
            }
            if s.filtered && !s.filter_set {
                let req = Request::new(
                    id,
                    Method::Post,
                    &format!("sys/replication/performance/primary/paths-filter/{}", s.id),
                )
                .with_token(&r0)
                .with_json(json!({"mode": "deny", "paths": ["other/"]}));
                return Some((self.primary, Op::Filter(i), req));
            }
            let req = Request::new(
                id,
                Method::Post,
                &format!("sys/replication/{m}/secondary/enable"),
            )
            .with_token(&self.root(s.host))
            .with_json(json!({ "token": s.token.clone().unwrap_or_default() }));
            return Some((s.host, Op::SecEnable(i), req));
        }
        // A root token on each performance secondary, generated with the primary's key.
        for i in 0..self.secs.len() {
            let s = &self.secs[i];
            if !s.enabled
                || s.mode != Mode::Performance
                || s.local_root.is_some()
                || s.gen_tries > 20
                || self.hosts[s.host].needs_unseal
            {
                continue;
            }
            if !self.oprng.chance(200) {
                break;
            }
            return Some(self.gen_root_req(i, id));
        }
        // Traffic.
        let perf_secs: Vec<HostId> = self
            .secs
            .iter()
            .filter(|s| s.enabled && s.mode == Mode::Performance && s.local_root.is_some())
            .map(|s| s.host)
            .collect();
        // Disable and re-enable a secondary now and then.
        if let Some(i) = self
            .secs
            .iter()
            .position(|s| s.disable && s.enabled && !s.gone)
        {
            if self.up(self.secs[i].host) {
                if let Some(r) = self.sec_auth_req(i, id) {
                    return Some(r);
                }
                let s = &self.secs[i];
                let (tok, body) = self.sec_auth(i);
                let req = Request::new(
                    id,
                    Method::Post,
                    &format!("sys/replication/{}/secondary/disable", s.mode.name()),
                )
                .with_token(&tok)
                .with_json(Value::Object(body));
                return Some((s.host, Op::SecDisable(i), req));
            }
        }
        if self.scan_rng.chance(self.params.scan_permille) {
            if let Some(r) = self.choose_scan(id) {
                return Some(r);
            }
        }
        let pick = self
            .oprng
            .weighted(&[35, 15, 8, 5, 4, 6, 15, 2, 1, 10, 3, 2, 2]);
        let existing = |r: &mut SimRng, next: u64| if next == 0 { 0 } else { r.below(next) };
        match pick {
            0 | 1 => {
                let other = pick == 1;
                let fresh = self.next_key == 0 || self.oprng.chance(700);
                let n = if fresh {
                    self.next_key += 1;
                    self.next_key - 1
                } else {
                    existing(&mut self.oprng, self.next_key)
                };
                let v = n + 1_000_000 * self.oprng.below(100);
                let req = Request::new(id, Method::Put, &key_name(other, n))
                    .with_token(&r0)
                    .with_json(json!({ "v": v }));
                Some((self.primary, Op::Put { n: v, other }, req))
            }
            2 => {
                let other = self.oprng.chance(300);
                let n = existing(&mut self.oprng, self.next_key);
                let req = Request::new(id, Method::Delete, &key_name(other, n)).with_token(&r0);
                Some((self.primary, Op::Delete { n, other }, req))
            }
            3 => {
                let name = format!("p{}", self.oprng.below(5));
                let req = Request::new(id, Method::Put, &format!("sys/policies/acl/{name}"))
                    .with_token(&r0)
                    .with_json(
                        json!({"policy": "path \"secret/*\" { capabilities = [\"read\"] }"}),
                    );
                Some((self.primary, Op::Policy, req))
            }
            4 => {
                let req = Request::new(id, Method::Post, "auth/token/create")
                    .with_token(&r0)
                    .with_json(json!({"policies": ["default"], "ttl": "24h"}));
                Some((self.primary, Op::TokenCreate, req))
            }
            5 if !perf_secs.is_empty() && !self.primary_tokens.is_empty() => {
                let h = *self.oprng.pick(&perf_secs)?;
                let t = self.oprng.pick(&self.primary_tokens)?.clone();
                let req = Request::new(id, Method::Get, "secret/s-0").with_token(&t);
                Some((h, Op::Probe(h), req))
            }
            6 if !perf_secs.is_empty() => {
                let h = *self.oprng.pick(&perf_secs)?;
                let filtered = self.sec_of(h).is_some_and(|s| s.filtered);
                let t = self
                    .sec_of(h)
                    .and_then(|s| s.local_root.clone())
                    .unwrap_or_default();
                let at = self
                    .last_put
                    .clone()
                    .filter(|(other, ..)| !(self.failed_over || filtered && *other));
                if let Some((other, key, pos, state)) = at.filter(|_| self.oprng.chance(500)) {
                    let mut req =
                        Request::new(id, Method::Get, &key_name(other, key)).with_token(&t);
                    req.index = Some(state);
                    return Some((h, Op::ReadAt { h, other, key, pos }, req));
                }
                let other = self.oprng.chance(300);
                let n = existing(&mut self.oprng, self.next_key);
                let req = Request::new(id, Method::Get, &key_name(other, n)).with_token(&t);
                Some((h, Op::Read(h, other, n), req))
            }
            9 => {
                let mut hosts = vec![self.primary];
                hosts.extend(
                    self.secs
                        .iter()
                        .filter(|s| s.enabled && !s.gone && s.mode == Mode::Performance)
                        .map(|s| s.host),
                );
                let h = *self.oprng.pick(&hosts)?;
                let (a, path, body) = self.ldap.attempt(&mut self.ldap_rng, h);
                let req = Request::new(id, Method::Post, &path).with_json(body);
                Some((h, Op::Login(a), req))
            }
            10 => {
                let (path, body) = self.ldap.mapping_write(&mut self.ldap_rng);
                let req = Request::new(id, Method::Post, &path)
                    .with_token(&r0)
                    .with_json(body);
                Some((self.primary, Op::LdapMap, req))
            }
            11 => {
                let what = self.ldap.mutate(&mut self.ldap_rng);
                self.log(&what);
                None
            }
            12 if !perf_secs.is_empty() => {
                let h = *self.oprng.pick(&perf_secs)?;
                let t = self
                    .sec_of(h)
                    .and_then(|s| s.local_root.clone())
                    .unwrap_or_default();
                let req = Request::new(id, Method::Post, "auth/token/create")
                    .with_token(&t)
                    .with_json(json!({"policies": ["default"], "ttl": "1h"}));
                Some((h, Op::SecTokenCreate(h), req))
            }
            8 if self.oprng.chance(self.params.revoke_permille * 20) => {
                let cands: Vec<usize> = (0..self.secs.len())
                    .filter(|&i| {
                        let s = &self.secs[i];
                        s.enabled && !s.gone && s.revoked_from.is_none() && !s.revoke_sent
                    })
                    .collect();
                let i = *self.oprng.pick(&cands)?;
                self.secs[i].disable = true;
                self.log(&format!(
                    "op: n{} will be disabled and re-enabled",
                    self.secs[i].host
                ));
                None
            }
            7 if self.oprng.chance(self.params.revoke_permille * 20) => {
                let i = self
                    .secs
                    .iter()
                    .position(|s| s.enabled && s.revoked_from.is_none())?;
                let s = &mut self.secs[i];
                s.revoke_left = s.ids.clone();
                s.revoke_sent = true;
                self.choose()
            }
            _ => None,
        }
    }

    /// The next `sys/generate-root` step on performance secondary `i`.
    fn gen_root_req(&self, i: usize, id: RequestId) -> (HostId, Op, Request) {
        let s = &self.secs[i];
        let h = s.host;
        let base = "sys/generate-root/attempt";
        if s.gen_cancel {
            return (h, Op::GenCancel(i), Request::new(id, Method::Delete, base));
        }
        match &s.gen {
            None => (
                h,
                Op::GenAttempt(i),
                Request::new(id, Method::Post, base).with_json(json!({})),
            ),
            Some((_, nonce)) => {
                let key = if s.gen_tries.is_multiple_of(2) {
                    self.hosts[0].key.clone()
                } else {
                    self.hosts[h].key.clone()
                };
                (
                    h,
                    Op::GenUpdate(i),
                    Request::new(id, Method::Post, "sys/generate-root/update")
                        .with_json(json!({"key": key, "nonce": nonce})),
                )
            }
        }
    }

    /// The next step of DR operation token generation on host `h` (unauthenticated: the
    /// key shares are the authorization). The first update on a DR secondary (other than
    /// the original primary) gives a share of another keyring, which must be refused.
    fn optok_req(&self, h: HostId, id: RequestId) -> (HostId, Op, Request) {
        let t = &self.optok[h];
        let base = "sys/replication/dr/secondary/generate-operation-token/attempt";
        if t.cancel {
            return (h, Op::TokCancel(h), Request::new(id, Method::Delete, base));
        }
        match &t.gen {
            None => (
                h,
                Op::TokAttempt(h),
                Request::new(id, Method::Post, base).with_json(json!({})),
            ),
            Some((_, nonce)) => {
                let wrong = h != 0 && !t.wrong_tried;
                let key = if wrong {
                    self.hosts[h].key.clone()
                } else {
                    self.hosts[0].key.clone()
                };
                (
                    h,
                    Op::TokUpdate(h, wrong),
                    Request::new(
                        id,
                        Method::Post,
                        "sys/replication/dr/secondary/generate-operation-token/update",
                    )
                    .with_json(json!({"key": key, "nonce": nonce})),
                )
            }
        }
    }

    fn up(&self, h: HostId) -> bool {
        self.hosts[h].node.is_some() && !self.hosts[h].needs_unseal
    }

    /// What secondary `i` needs before it can run a protected operation, if anything: a
    /// DR operation token (DR) or a local root token (performance).
    fn sec_auth_req(&self, i: usize, id: RequestId) -> Option<(HostId, Op, Request)> {
        let s = &self.secs[i];
        match s.mode {
            Mode::Dr if self.optok[s.host].token.is_none() => Some(self.optok_req(s.host, id)),
            Mode::Performance if s.local_root.is_none() => Some(self.gen_root_req(i, id)),
            _ => None,
        }
    }

    /// Token and body fields for a protected operation on secondary `i`.
    fn sec_auth(&self, i: usize) -> (String, serde_json::Map<String, Value>) {
        let s = &self.secs[i];
        let mut body = serde_json::Map::new();
        match s.mode {
            Mode::Dr => {
                body.insert(
                    "dr_operation_token".into(),
                    json!(self.optok[s.host].token.clone().unwrap_or_default()),
                );
                (self.root(0), body)
            }
            Mode::Performance => (s.local_root.clone().unwrap_or_default(), body),
        }
    }

    fn update_primary_req(&self, i: usize, id: RequestId, by_token: bool) -> (HostId, Op, Request) {
        let s = &self.secs[i];
        let (tok, mut body) = self.sec_auth(i);
        if by_token {
            body.insert("token".into(), json!(s.token.clone().unwrap_or_default()));
        } else {
            body.insert(
                "update_primary_addrs".into(),
                json!([cluster_addr(self.primary)]),
            );
        }
        let req = Request::new(
            id,
            Method::Post,
            &format!("sys/replication/{}/secondary/update-primary", s.mode.name()),
        )
        .with_token(&tok)
        .with_json(Value::Object(body));
        (s.host, Op::UpdatePrimary { i, by_token }, req)
    }

    /// The failover drill's next request: `None` when no drill is running (normal
    /// operation), `Some(None)` when it waits.
    #[allow(clippy::option_option)]
    fn choose_drill(&mut self, id: RequestId) -> Option<Option<(HostId, Op, Request)>> {
        let Some(d) = self.drill.clone() else {
            let at = self.drill_at?;
            if self.phase != Phase::Chaos || self.stats.events < at || !self.up(self.primary) {
                return None;
            }
            let i = self.secs.iter().position(|s| {
                s.mode == Mode::Dr
                    && s.enabled
                    && s.synced_once
                    && !s.gone
                    && !s.revoke_sent
                    && s.revoked_from.is_none()
                    && s.host != self.primary
            })?;
            let old = self.primary;
            let partition = self.oprng.chance(400);
            let force = self.oprng.chance(500);
            self.drill = Some(Drill {
                dr: i,
                old,
                force,
                lossy: false,
                step: DStep::Promote,
                gate_probed: false,
                perf_off: false,
                dr_demoted: false,
                rejoin: None,
            });
            self.drill_at = None;
            let dh = self.secs[i].host;
            self.log(&format!(
                "DRILL: primary n{old} lost ({}); DR secondary n{dh} will be promoted{}",
                if partition {
                    "partitioned from every host"
                } else {
                    "crashed, stays down"
                },
                if force { " with force" } else { "" }
            ));
            if partition {
                self.isolated = Some(old);
                for b in 0..self.hosts.len() {
                    if b != old {
                        self.net.partition(Addr::Host(old), Addr::Host(b));
                    }
                }
            } else {
                self.held_down = Some(old);
                if self.crash(old).is_err() {
                    return Some(None);
                }
            }
            return Some(None);
        };
        let dh = self.secs[d.dr].host;
        match d.step {
            DStep::Done => None,
            DStep::Promote => {
                if !self.up(dh) {
                    return Some(None);
                }
                if self.optok[dh].token.is_none() {
                    return Some(Some(self.optok_req(dh, id)));
                }
                let path = "sys/replication/dr/secondary/promote";
                if !d.gate_probed {
                    let bogus = if self.oprng.chance(500) {
                        json!({})
                    } else {
                        json!({"dr_operation_token": "cdr.AAAAAAAAAAAAAAAAAAAAAAAA"})
                    };
                    let req = Request::new(id, Method::Post, path)
                        .with_token(&self.root(0))
                        .with_json(bogus);
                    return Some(Some((
                        dh,
                        Op::Promote {
                            h: dh,
                            with_token: false,
                        },
                        req,
                    )));
                }
                let mut body = json!({
                    "dr_operation_token": self.optok[dh].token.clone().unwrap_or_default(),
                    "primary_cluster_addr": cluster_addr(dh),
                });
                if d.force {
                    body["force"] = json!(true);
                }
                let req = Request::new(id, Method::Post, path)
                    .with_token(&self.root(0))
                    .with_json(body);
                Some(Some((
                    dh,
                    Op::Promote {
                        h: dh,
                        with_token: true,
                    },
                    req,
                )))
            }
            DStep::Repoint => {
                let mut waiting = false;
                for i in 0..self.secs.len() {
                    let s = &self.secs[i];
                    let Some(by_token) = s.repoint else {
                        continue;
                    };
                    waiting = true;
                    if !self.up(s.host) || !self.up(self.primary) {
                        continue;
                    }
                    if let Some(r) = self.sec_auth_req(i, id) {
                        return Some(Some(r));
                    }
                    let r0 = self.root(0);
                    if by_token && s.token.is_none() {
                        let req = Request::new(
                            id,
                            Method::Post,
                            &format!("sys/replication/{}/primary/secondary-token", s.mode.name()),
                        )
                        .with_token(&r0)
                        .with_json(json!({ "id": s.id }));
                        return Some(Some((self.primary, Op::SecToken(i), req)));
                    }
                    if by_token && s.filtered && !s.filter_set {
                        let req = Request::new(
                            id,
                            Method::Post,
                            &format!("sys/replication/performance/primary/paths-filter/{}", s.id),
                        )
                        .with_token(&r0)
                        .with_json(json!({"mode": "deny", "paths": ["other/"]}));
                        return Some(Some((self.primary, Op::Filter(i), req)));
                    }
                    return Some(Some(self.update_primary_req(i, id, by_token)));
                }
                if !waiting {
                    self.set_step(DStep::Rejoin);
                    self.log("DRILL: every secondary re-pointed; the old primary comes back");
                }
                Some(None)
            }
            DStep::Rejoin => {
                let o = d.old;
                if self.held_down == Some(o) {
                    self.held_down = None;
                    if self.hosts[o].node.is_none() {
                        self.stats.restarts += 1;
                        self.boot(o);
                    }
                }
                if self.isolated == Some(o) {
                    self.isolated = None;
                    for b in 0..self.hosts.len() {
                        if b != o {
                            self.heal(o, b);
                        }
                    }
                }
                if !self.up(o) || !self.up(self.primary) {
                    return Some(None);
                }
                let r0 = self.root(0);
                for (done, mode, what) in [
                    (d.perf_off, Mode::Performance, "disable"),
                    (d.dr_demoted, Mode::Dr, "demote"),
                ] {
                    if !done {
                        let req = Request::new(
                            id,
                            Method::Post,
                            &format!("sys/replication/{}/primary/{what}", mode.name()),
                        )
                        .with_token(&r0)
                        .with_json(json!({}));
                        return Some(Some((o, Op::OldPrimary { h: o, mode }, req)));
                    }
                }
                let i = match d.rejoin {
                    Some(i) => i,
                    None => {
                        let i = self.secs.len();
                        self.secs.push(Sec {
                            host: o,
                            mode: Mode::Dr,
                            filtered: false,
                            attempt: 0,
                            id: format!("n{o}-r0"),
                            ids: Vec::new(),
                            revoke_left: Vec::new(),
                            token: None,
                            filter_set: false,
                            filter_wal: u64::MAX,
                            filter_unsure: false,
                            enabled: false,
                            revoked_from: None,
                            revoke_sent: false,
                            gen: None,
                            gen_cancel: false,
                            gen_tries: 0,
                            local_root: None,
                            repoint: None,
                            repoint_fails: 0,
                            rejoin: true,
                            gone: false,
                            synced_once: false,
                            disable: false,
                            ldap_ready: false,
                        });
                        if let Some(dr) = self.drill.as_mut() {
                            dr.rejoin = Some(i);
                        }
                        i
                    }
                };
                let s = &self.secs[i];
                if s.enabled {
                    self.set_step(DStep::Done);
                    self.log(&format!(
                        "DRILL: done; n{o} is a DR secondary of n{}",
                        self.primary
                    ));
                    return None;
                }
                if s.token.is_none() {
                    let req = Request::new(
                        id,
                        Method::Post,
                        "sys/replication/dr/primary/secondary-token",
                    )
                    .with_token(&r0)
                    .with_json(json!({ "id": s.id }));
                    return Some(Some((self.primary, Op::SecToken(i), req)));
                }
                if let Some(r) = self.sec_auth_req(i, id) {
                    return Some(Some(r));
                }
                Some(Some(self.update_primary_req(i, id, true)))
            }
        }
    }

    fn set_step(&mut self, step: DStep) {
        if let Some(d) = self.drill.as_mut() {
            d.step = step;
        }
    }

    /// A DR promote was acknowledged (or seen to have happened): host `h` is the primary.
    fn on_promoted(&mut self, h: HostId) -> Result<(), Violation> {
        let Some(d) = self.drill.clone() else {
            return Ok(());
        };
        let l = self.pre_promote_wal.get(&h).copied().unwrap_or(0);
        self.primary = h;
        self.failed_over = true;
        self.ldap.forget(h);
        self.secs[d.dr].gone = true;
        self.secs[d.dr].enabled = false;
        self.wal_floor = l;
        self.set_step(DStep::Repoint);
        let mut repointed = Vec::new();
        for j in 0..self.secs.len() {
            let s = &self.secs[j];
            if s.gone || s.revoked_from.is_some() || s.revoke_sent {
                continue;
            }
            if !s.enabled {
                // Its token came from the lost primary: start over with the new one.
                self.new_attempt(j);
                continue;
            }
            let by_token = self.oprng.chance(500);
            if by_token {
                self.new_attempt(j);
            }
            let s = &mut self.secs[j];
            if s.filtered && s.mode == Mode::Performance && s.filter_wal > l {
                // The filter's write may be past what the DR secondary had replicated: the
                // new primary may not know it (as the reference would not).
                s.filter_unsure = true;
            }
            self.secs[j].repoint = Some(by_token);
            repointed.push(format!(
                "n{} by {}",
                self.secs[j].host,
                if by_token { "token" } else { "addresses" }
            ));
        }
        // Failover: what the new primary holds is the old primary's history up to the WAL
        // index it had replicated (L) — each key holds its last value written at or before
        // L, or a later one (a write's index is only known from above).
        let mut exact = 0;
        for (k, h) in &self.hist {
            let j = h.iter().rposition(|(u, _)| *u <= l);
            let mut allowed: BTreeSet<Option<u64>> =
                h[j.unwrap_or(0)..].iter().map(|(_, v)| *v).collect();
            if j.is_none() || d.lossy {
                allowed.insert(None);
            }
            if d.lossy {
                // A forced promote of an unsynced copy: any value the key ever had, or none.
                allowed.extend(h.iter().map(|(_, v)| *v));
            }
            if allowed.len() == 1 {
                exact += 1;
            }
            self.model.remove(k);
            self.uncertain.remove(k);
            self.failover_allowed.insert(*k, allowed);
        }
        self.log(&format!(
            "DRILL: n{h} promoted at replicated WAL index {l}; {} keys to check ({exact} exactly); re-pointing [{}]",
            self.hist.len(),
            repointed.join(", ")
        ));
        self.bump("failover");
        Ok(())
    }

    fn wake(&mut self) -> Result<(), Violation> {
        if self.outstanding.is_some() || self.phase == Phase::Done {
            return Ok(());
        }
        match self.choose() {
            Some((h, op, req)) => {
                self.next_id += 1;
                let id = req.id;
                self.stats.requests += 1;
                self.log(&format!(
                    "op -> n{h} #{id} {} {} {}",
                    match req.method {
                        Method::Get => "GET",
                        Method::Put => "PUT",
                        Method::Post => "POST",
                        Method::Delete => "DELETE",
                        _ => "?",
                    },
                    req.path,
                    shorten(&String::from_utf8_lossy(&req.body), 60)
                ));
                self.outstanding = Some((id, h, op));
                match self.net.route(self.now, Addr::Client(0), Addr::Host(h)) {
                    Route::Deliver(d) => self.schedule(
                        d,
                        Ev::ApiReq {
                            to: h,
                            from: Caller::Operator,
                            req,
                        },
                    ),
                    Route::Lost(_) => self.schedule(
                        TIMEOUT_MS,
                        Ev::ApiResp {
                            to: Caller::Operator,
                            id,
                            resp: Err("connection timed out".into()),
                        },
                    ),
                }
            }
            None => {
                let d = self.oprng.delay(self.params.think_ms).max(20);
                self.schedule(d, Ev::Wake);
            }
        }
        Ok(())
    }

    fn new_attempt(&mut self, i: usize) {
        let s = &mut self.secs[i];
        s.attempt += 1;
        s.id = format!("n{}-{}", s.host, s.attempt);
        s.token = None;
        s.filter_set = false;
    }

    fn on_reply(&mut self, id: RequestId, resp: Result<Response, String>) -> Result<(), Violation> {
        let Some((oid, h, op)) = self.outstanding.clone() else {
            return Ok(());
        };
        if oid != id {
            return Ok(());
        }
        self.outstanding = None;
        let wal_at = self.out_wal.take().unwrap_or(u64::MAX);
        let text = body_text(&resp);
        self.log(&format!("op <- n{h} #{id} {}", shorten(&text, 160)));
        if resp.is_err() {
            self.stats.lost_requests += 1;
        }
        let ok = status_ok(&resp);
        let status = resp.as_ref().map(|r| r.status).unwrap_or(0);
        let body = resp
            .as_ref()
            .ok()
            .and_then(|r| r.body.clone())
            .unwrap_or(Value::Null);
        match op {
            Op::Unseal(h) => {
                let sealed = body
                    .get("sealed")
                    .or_else(|| body.get("data").and_then(|d| d.get("sealed")))
                    .and_then(Value::as_bool);
                if ok && sealed == Some(false) {
                    self.hosts[h].needs_unseal = false;
                    self.unseal_tries[h] = 0;
                } else if resp.is_ok() && text.contains("not sealed") {
                    self.hosts[h].needs_unseal = false;
                } else if text.contains("not initialized") {
                    // A secondary mid-sync may lack the seal configuration: try again later
                    // (the final phase's convergence bound catches one that stays so).
                    self.unseal_after[h] = self.now + 1_000;
                    self.uninit.insert(h);
                    self.log(&format!("n{h} is not initialized: unseal again in 1s"));
                } else if resp.is_ok() {
                    self.unseal_tries[h] += 1;
                    if self.unseal_tries[h] > 50 {
                        return fail("liveness", format!("n{h} cannot be unsealed: {text}"));
                    }
                }
            }
            Op::Mount => {
                if ok
                    || text.contains("already")
                    || text.contains("in use")
                    || text.contains("exist")
                {
                    self.mounted = true;
                }
            }
            Op::EnablePrimary(m) => {
                if ok || text.contains("already") {
                    match m {
                        Mode::Performance => self.perf_enabled = true,
                        Mode::Dr => self.dr_enabled = true,
                    }
                }
            }
            Op::SecToken(i) => {
                let sid = self.secs[i].id.clone();
                if !self.secs[i].ids.contains(&sid) {
                    self.secs[i].ids.push(sid);
                }
                match body["wrap_info"]["token"].as_str() {
                    Some(t) if ok => self.secs[i].token = Some(t.to_string()),
                    _ => self.new_attempt(i),
                }
            }
            Op::Filter(i) => {
                if ok {
                    self.secs[i].filter_set = true;
                    self.secs[i].filter_wal = wal_at;
                    self.secs[i].filter_unsure = false;
                } else if status == 400 || status == 404 {
                    self.new_attempt(i);
                }
            }
            Op::SecEnable(i) => {
                if ok || text.contains("already a") {
                    self.secs[i].enabled = true;
                    self.secs[i].ldap_ready = false;
                    let h = self.secs[i].host;
                    self.ldap.forget(h);
                    self.log(&format!(
                        "n{} is a {} secondary",
                        self.secs[i].host,
                        self.secs[i].mode.name()
                    ));
                } else if resp.is_ok() {
                    self.new_attempt(i);
                } else {
                    // Lost: the enable may or may not have happened; a retry with the same
                    // token tells ("already a secondary") or fails (token used) → new token.
                }
            }
            Op::Put { n, other } => {
                let k = (other, n % 1_000_000);
                let u = if ok { wal_at } else { u64::MAX };
                let hist = self.hist.entry(k).or_default();
                hist.push((u, Some(n)));
                let pos = hist.len() - 1;
                if ok && !self.failed_over {
                    let Some(state) = resp.as_ref().ok().and_then(|r| r.index.clone()) else {
                        return fail(
                            "read-your-writes",
                            format!("a write on primary n{h} answered without X-Vault-Index"),
                        );
                    };
                    self.last_put = Some((other, k.1, pos, state));
                }
                self.failover_allowed.remove(&k);
                if ok {
                    self.model.insert(k, Some(n));
                    self.uncertain.remove(&k);
                } else {
                    self.model.remove(&k);
                    self.uncertain.insert(k);
                }
            }
            Op::Delete { n, other } => {
                let k = (other, n);
                let u = if ok { wal_at } else { u64::MAX };
                self.hist.entry(k).or_default().push((u, None));
                self.failover_allowed.remove(&k);
                if ok {
                    self.model.insert(k, None);
                    self.uncertain.remove(&k);
                } else {
                    self.model.remove(&k);
                    self.uncertain.insert(k);
                }
            }
            Op::Policy => {}
            Op::TokenCreate => {
                if let Some(t) = body["auth"]["client_token"].as_str() {
                    self.primary_tokens.push(t.to_string());
                }
            }
            Op::Probe(h) => {
                self.bump("filters");
                if ok {
                    return fail(
                        "filters",
                        format!(
                            "a primary token was accepted by performance secondary n{h}: {text}"
                        ),
                    );
                }
                if resp.is_ok() && status != 403 && status != 503 {
                    self.log(&format!(
                        "note: primary token on n{h} got {status}, not 403"
                    ));
                }
            }
            Op::ReadAt { h, other, key, pos } => {
                // Served at all: the secondary applied the write, so it holds that value or
                // a later one of the key's history (a later delete: not found).
                let later: Vec<Option<u64>> = self
                    .hist
                    .get(&(other, key))
                    .map(|v| v.iter().skip(pos).map(|(_, val)| *val).collect())
                    .unwrap_or_default();
                let served = match status {
                    200 => Some(body["data"]["v"].as_u64()),
                    404 => Some(None),
                    _ => None,
                };
                if let Some(got) = served {
                    self.bump("read-your-writes");
                    if !later.contains(&got) {
                        return fail(
                            "read-your-writes",
                            format!(
                                "n{h} served {} = {got:?} for a request carrying the \
                                 X-Vault-Index of a later write (values since: {later:?})",
                                key_name(other, key)
                            ),
                        );
                    }
                }
            }
            Op::Read(h, other, n) => {
                if ok {
                    self.bump("prefix");
                    let filtered = self
                        .sec_of(h)
                        .is_some_and(|s| s.filtered && !s.filter_unsure);
                    if other && filtered {
                        return fail(
                            "filters",
                            format!("filtered n{h} served {}: {text}", key_name(other, n)),
                        );
                    }
                    // Values of key n are n + 1e6·k: a value of another key is corrupt data.
                    if let Some(v) = body["data"]["v"].as_u64() {
                        if v % 1_000_000 != n {
                            return fail(
                                "prefix",
                                format!(
                                    "n{h} served {} = {v}, never written to that key",
                                    key_name(other, n)
                                ),
                            );
                        }
                    }
                }
            }
            Op::Revoke(i) => {
                if ok || text.contains("no secondary") || text.contains("no performance secondary")
                {
                    self.secs[i].revoke_left.remove(0);
                    if self.secs[i].revoke_left.is_empty() {
                        self.secs[i].revoked_from = Some(self.next_key);
                        self.log(&format!(
                            "revoke of n{} acknowledged; keys >= {} must not reach it",
                            self.secs[i].host, self.next_key
                        ));
                    }
                }
            }
            Op::GenAttempt(i) => {
                let otp = body["otp"]
                    .as_str()
                    .or_else(|| body["data"]["otp"].as_str());
                let nonce = body["nonce"]
                    .as_str()
                    .or_else(|| body["data"]["nonce"].as_str());
                match (ok, otp, nonce) {
                    (true, Some(o), Some(n)) => {
                        self.secs[i].gen = Some((o.to_string(), n.to_string()))
                    }
                    _ if resp.is_ok() => {
                        self.secs[i].gen_cancel = true;
                        self.secs[i].gen_tries += 1;
                    }
                    _ => {}
                }
            }
            Op::GenCancel(i) => {
                if resp.is_ok() {
                    self.secs[i].gen_cancel = false;
                    self.secs[i].gen = None;
                }
            }
            Op::GenUpdate(i) => {
                let enc = body["encoded_token"]
                    .as_str()
                    .or_else(|| body["data"]["encoded_token"].as_str());
                let otp = self.secs[i]
                    .gen
                    .as_ref()
                    .map(|g| g.0.clone())
                    .unwrap_or_default();
                match enc.map(|e| cairn_core::replication::dr_token::decode_token(e, &otp)) {
                    Some(Ok(t)) if ok => {
                        self.log(&format!("n{} root token generated", self.secs[i].host));
                        self.secs[i].local_root = Some(t);
                        self.secs[i].gen = None;
                    }
                    _ if resp.is_ok() => {
                        self.secs[i].gen = None;
                        self.secs[i].gen_cancel = true;
                        self.secs[i].gen_tries += 1;
                    }
                    _ => {}
                }
            }
            Op::TokAttempt(h) => {
                let otp = body["otp"]
                    .as_str()
                    .or_else(|| body["data"]["otp"].as_str());
                let nonce = body["nonce"]
                    .as_str()
                    .or_else(|| body["data"]["nonce"].as_str());
                match (ok, otp, nonce) {
                    (true, Some(o), Some(n)) => {
                        self.optok[h].gen = Some((o.to_string(), n.to_string()))
                    }
                    _ if resp.is_ok() => {
                        self.optok[h].cancel = true;
                        self.optok[h].tries += 1;
                    }
                    _ => {}
                }
            }
            Op::TokCancel(h) => {
                if resp.is_ok() {
                    self.optok[h].cancel = false;
                    self.optok[h].gen = None;
                }
            }
            Op::TokUpdate(h, wrong) => {
                let enc = body["encoded_token"]
                    .as_str()
                    .or_else(|| body["data"]["encoded_token"].as_str());
                if wrong {
                    self.optok[h].wrong_tried = true;
                    self.bump("gates");
                    if ok && enc.is_some_and(|e| !e.is_empty()) {
                        return fail(
                            "gates",
                            format!("n{h} generated a DR operation token from a key share of another keyring: {text}"),
                        );
                    }
                    if resp.is_ok() && !ok {
                        // Refused, progress reset: the attempt goes on with the right share.
                    }
                } else {
                    let otp = self.optok[h]
                        .gen
                        .as_ref()
                        .map(|g| g.0.clone())
                        .unwrap_or_default();
                    match enc.map(|e| cairn_core::replication::dr_token::decode_token(e, &otp)) {
                        Some(Ok(t)) if ok => {
                            self.log(&format!("n{h} DR operation token generated"));
                            self.optok[h].token = Some(t);
                            self.optok[h].gen = None;
                        }
                        _ if resp.is_ok() => {
                            self.optok[h].gen = None;
                            self.optok[h].cancel = true;
                            self.optok[h].tries += 1;
                        }
                        _ => {}
                    }
                }
            }
            Op::Promote { h, with_token } => {
                if !with_token {
                    self.bump("gates");
                    if ok {
                        return fail(
                            "gates",
                            format!("DR promote of n{h} succeeded without a valid DR operation token: {text}"),
                        );
                    }
                    if let Some(d) = self.drill.as_mut() {
                        d.gate_probed = true;
                    }
                } else {
                    let promoted = ok
                        || self.hosts[h].node.as_ref().is_some_and(|n| {
                            n.replication().role(Mode::Dr)
                                == cairn_core::replication::state::Role::Primary
                        });
                    if promoted {
                        self.on_promoted(h)?;
                    } else if status == 403 {
                        self.optok[h].token = None;
                    } else if status == 400 && text.contains("force=true") {
                        // The secondary had not finished its Merkle sync when its primary was
                        // lost: like an operator, accept the possible loss and force it (the
                        // failover checker bounds what may be lost).
                        self.bump("promote-needs-force");
                        if let Some(d) = self.drill.as_mut() {
                            d.force = true;
                            d.lossy = true;
                        }
                    }
                }
            }
            Op::UpdatePrimary { i, by_token } => {
                let not_sec =
                    text.contains(&format!("not a {} secondary", self.secs[i].mode.name()));
                if ok {
                    let s = &mut self.secs[i];
                    s.repoint = None;
                    s.repoint_fails = 0;
                    if s.rejoin {
                        s.enabled = true;
                        if !s.ids.contains(&s.id) {
                            let id = s.id.clone();
                            s.ids.push(id);
                        }
                    }
                    let h = s.host;
                    self.log(&format!(
                        "n{h} re-pointed to n{} by {}",
                        self.primary,
                        if by_token { "token" } else { "addresses" }
                    ));
                } else if not_sec {
                    // It never became a secondary (its enable was lost): set it up afresh.
                    let s = &mut self.secs[i];
                    s.repoint = None;
                    s.enabled = false;
                    self.new_attempt(i);
                } else if status == 403 && text.contains("dr_operation_token") {
                    let h = self.secs[i].host;
                    self.optok[h].token = None;
                } else if resp.is_err() {
                    // Lost: it may have happened; by addresses is idempotent.
                    if by_token && !self.secs[i].rejoin {
                        self.secs[i].repoint = Some(false);
                    }
                } else {
                    let s = &mut self.secs[i];
                    s.repoint_fails += 1;
                    if by_token || s.repoint_fails > 3 {
                        if s.repoint.is_some() {
                            s.repoint = Some(true);
                        }
                        self.new_attempt(i);
                    }
                }
            }
            Op::OldPrimary { h, mode } => {
                let done = ok || text.contains("not a ") || text.contains("is not");
                if done {
                    if let Some(d) = self.drill.as_mut() {
                        match mode {
                            Mode::Performance => d.perf_off = true,
                            Mode::Dr => d.dr_demoted = true,
                        }
                    }
                    self.log(&format!("n{h} {} primary stepped down", mode.name()));
                }
            }
            Op::SecDisable(i) => {
                if ok || text.contains("not a ") {
                    let s = &mut self.secs[i];
                    s.enabled = false;
                    s.disable = false;
                    s.local_root = None;
                    s.gen = None;
                    s.gen_tries = 0;
                    s.synced_once = false;
                    s.ldap_ready = false;
                    let h = s.host;
                    self.ldap.forget(h);
                    self.new_attempt(i);
                    self.log(&format!(
                        "n{h} secondary disabled; it will be enabled again"
                    ));
                }
            }
            Op::LdapMount => {
                if ok || text.contains("already") || text.contains("in use") {
                    self.ldap_mounted = true;
                }
            }
            Op::LdapConfig => {
                if ok {
                    self.ldap_configured = true;
                }
            }
            Op::LdapMap => self
                .ldap
                .mapping_answer(if resp.is_err() { None } else { Some(ok) }),
            Op::Login(a) => {
                let t1 = self.ldap_at.get(&a.host).copied().filter(|t| *t >= a.t0);
                let primary = a.host == self.primary && !self.failed_over;
                let ready = if a.host == self.primary {
                    self.ldap_configured
                } else {
                    self.sec_of(a.host).is_some_and(|s| s.ldap_ready)
                };
                let st = resp.as_ref().ok().map(|r| r.status);
                self.bump("login");
                let what = self.ldap.observe(&a, t1, st, &body, primary, ready)?;
                self.bump(match what {
                    "ok" => "login:ok",
                    "refused" => "login:refused",
                    "refused-locked" => "login:locked",
                    _ => "login:undecided",
                });
            }
            Op::Scan { h, reindex, repair } => {
                let start = self.scan.take().filter(|s| s.id == id);
                let busy = text.contains("already running") || text.contains("still flushing");
                if ok && reindex.is_some() {
                    let rot = &mut self.hosts[h].rot;
                    if start.is_some_and(|s| s.gen == rot.gen) && rot.dirty {
                        rot.dirty = false;
                        rot.repair_tries = 0;
                        self.log(&format!(
                            "n{h}: planted corruption repaired by this reindex"
                        ));
                    }
                } else if !ok {
                    if repair && !busy {
                        self.hosts[h].rot.repair_tries += 1;
                    }
                    if status == 403 {
                        if let Some(i) = self.active_sec(h) {
                            match self.secs[i].mode {
                                Mode::Dr => self.optok[h].token = None,
                                Mode::Performance => self.secs[i].local_root = None,
                            }
                        }
                    }
                }
            }
            Op::SecTokenCreate(h) => {
                if ok {
                    self.bump("perf-secondary-token");
                } else if resp.is_ok() && status != 503 && status != 403 {
                    self.log(&format!("note: token creation on n{h}: {text}"));
                }
            }
            Op::ReadBack(n) => {
                if resp.is_ok() {
                    let (other, k) = self.readback.pop().unwrap_or((false, n));
                    let want = self.model.get(&(other, k)).cloned().flatten();
                    let got = if status == 404 {
                        None
                    } else {
                        body["data"]["v"].as_u64()
                    };
                    self.bump("durability");
                    if status != 404 && !ok {
                        return fail(
                            "durability",
                            format!("read-back of {} on the primary: {text}", key_name(other, k)),
                        );
                    }
                    if let Some(allowed) = self.failover_allowed.get(&(other, k)).cloned() {
                        self.bump("failover");
                        if !allowed.contains(&got) {
                            return fail(
                                "failover",
                                format!(
                                    "{} on the promoted primary n{} is {got:?}; the old primary's history up to the WAL index the DR secondary had replicated allows only {allowed:?}",
                                    key_name(other, k),
                                    self.primary
                                ),
                            );
                        }
                    } else if got != want {
                        return fail(
                            "durability",
                            format!(
                                "acknowledged state of {} on the primary was {want:?}, read back {got:?}",
                                key_name(other, k)
                            ),
                        );
                    }
                    if self.readback.is_empty() {
                        self.log("final: every acknowledged write read back from the primary");
                        self.phase = Phase::Done;
                        return Ok(());
                    }
                }
            }
        }
        let d = self.oprng.delay(self.params.think_ms);
        self.schedule(d, Ev::Wake);
        Ok(())
    }

    fn keys(&self, h: HostId, prefix: &str) -> Vec<(String, Vec<u8>)> {
        self.hosts[h]
            .node
            .as_ref()
            .and_then(|n| n.storage().scan(prefix).ok())
            .unwrap_or_default()
    }

    /// Filters and revocation, on the state host `h` just committed.
    fn check_host(&mut self, h: HostId) -> Result<(), Violation> {
        let Some(s) = self.sec_of(h).cloned() else {
            return Ok(());
        };
        if s.gone || (!s.enabled && s.revoked_from.is_none()) {
            return Ok(());
        }
        let logical = self.keys(h, "logical/");
        if s.mode == Mode::Performance {
            self.bump("filters");
            let mine: BTreeSet<String> = self
                .keys(h, "sys/token/")
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            let theirs: BTreeSet<String> = self
                .keys(self.primary, "sys/token/")
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            if let Some(k) = mine
                .intersection(&theirs)
                .find(|k| k.starts_with("sys/token/id/"))
            {
                return fail(
                    "filters",
                    format!("performance secondary n{h} holds the primary's token entry {k}"),
                );
            }
            if s.filtered && !s.filter_unsure {
                if let Some((k, _)) = logical
                    .iter()
                    .find(|(k, _)| key_number(k).is_some_and(|(o, _)| o))
                {
                    return fail(
                        "filters",
                        format!("filtered performance secondary n{h} (deny other/) holds {k}"),
                    );
                }
            }
        }
        if let Some(from) = s.revoked_from {
            self.bump("revocation");
            if let Some((k, _)) = logical
                .iter()
                .find(|(k, _)| key_number(k).is_some_and(|(_, n)| n >= from))
            {
                return fail(
                    "revocation",
                    format!("n{h} received {k}, written after its revoke was acknowledged (keys >= {from})"),
                );
            }
        }
        Ok(())
    }

    fn converged(&self, s: &Sec) -> Result<(), String> {
        let (Some(p), Some(n)) = (
            self.hosts[self.primary].node.as_ref(),
            self.hosts[s.host].node.as_ref(),
        ) else {
            return Err("down".into());
        };
        let unsure = s.filter_unsure;
        match (s.mode, s.filtered) {
            (Mode::Dr, _) | (Mode::Performance, false) => {
                let (a, b) = (
                    p.replication().merkle_root(s.mode),
                    n.replication().merkle_root(s.mode),
                );
                if a == b {
                    Ok(())
                } else {
                    Err(format!(
                        "{} root {} vs primary {} (primary last_wal {})",
                        s.mode.name(),
                        &b[..12.min(b.len())],
                        &a[..12.min(a.len())],
                        p.replication().wal.last
                    ))
                }
            }
            (Mode::Performance, true) => {
                let want: Vec<(String, Vec<u8>)> = self
                    .keys(self.primary, "logical/")
                    .into_iter()
                    .filter(|(k, _)| key_number(k).is_some_and(|(o, _)| !o))
                    .collect();
                let got: Vec<(String, Vec<u8>)> = self
                    .keys(s.host, "logical/")
                    .into_iter()
                    .filter(|(k, _)| key_number(k).is_some())
                    .collect();
                let whole = || {
                    p.replication().merkle_root(Mode::Performance)
                        == n.replication().merkle_root(Mode::Performance)
                };
                if want == got || (unsure && whole()) {
                    Ok(())
                } else {
                    Err(format!(
                        "replicated KV differs: {} keys vs primary's {}",
                        got.len(),
                        want.len()
                    ))
                }
            }
        }
    }

    /// Final phase: every active secondary reaches the primary within [`CONVERGE_MS`].
    fn check_convergence(&mut self) -> Result<(), Violation> {
        if self.now < self.last_conv_check + 250 {
            return Ok(());
        }
        self.last_conv_check = self.now;
        let mut bad = Vec::new();
        let tolerated = |h: HostId| self.tolerate && self.uninit.contains(&h);
        for s in &self.secs {
            if !s.enabled
                || s.gone
                || s.revoked_from.is_some()
                || s.revoke_sent
                || tolerated(s.host)
            {
                continue;
            }
            if let Err(e) = self.converged(s) {
                bad.push(format!("n{}: {e}", s.host));
            } else if !self.hosts[s.host].rot.dirty {
                // Repaired values (reindex, then the Merkle diff with the primary).
                let (p, x) = (&self.hosts[self.primary], &self.hosts[s.host]);
                if let (Some(p), Some(n)) = (p.node.as_ref(), x.node.as_ref()) {
                    for k in &x.rot.values {
                        if s.filtered && key_number(k).is_some_and(|(o, _)| o) {
                            continue;
                        }
                        let (a, b) = (p.storage().get(k).ok(), n.storage().get(k).ok());
                        if a != b {
                            bad.push(format!(
                                "n{}: {k}, corrupted and then reindexed, still differs from the primary's",
                                s.host
                            ));
                            break;
                        }
                    }
                }
            }
        }
        for h in 0..self.hosts.len() {
            if self.hosts[h].rot.dirty && self.repair_wanted(h) {
                bad.push(format!(
                    "n{h}: planted corruption not yet repaired by a reindex"
                ));
            }
        }
        for h in 0..self.hosts.len() {
            let x = &self.hosts[h];
            if (x.needs_unseal || x.node.is_none()) && !tolerated(h) {
                let why = if self.uninit.contains(&h) {
                    " (it answers \"Vault is not initialized\": a performance/DR secondary restarted before its first Merkle sync delivered core/seal-config and core/keyring, which activation wiped; core bug secondary-uninitialized-after-restart)"
                } else {
                    ""
                };
                bad.push(format!("n{h} is still sealed{why}"));
            }
        }
        if bad.is_empty() {
            self.bump("convergence");
            if self.tolerate && !self.uninit.is_empty() {
                self.bump("known-bug:secondary-uninitialized-after-restart");
            }
            self.stats.converge_ms = self.now - self.final_start;
            self.log(&format!(
                "final: converged after {}ms",
                self.stats.converge_ms
            ));
            self.phase = Phase::ReadBack;
            let keys: BTreeSet<(bool, u64)> = self
                .model
                .keys()
                .chain(self.failover_allowed.keys())
                .copied()
                .collect();
            self.readback = keys.into_iter().rev().collect();
            if self.readback.is_empty() {
                self.phase = Phase::Done;
            } else if self.outstanding.is_none() {
                self.schedule(0, Ev::Wake);
            }
            return Ok(());
        }
        if self.now > self.final_start + self.converge_bound {
            return fail(
                "convergence",
                format!(
                    "secondaries not converged {}s after faults and writes stopped: {}",
                    self.converge_bound / 1000,
                    bad.join("; ")
                ),
            );
        }
        Ok(())
    }
}

/// Failed (not "busy") final-phase repair reindexes after which a host is left out of the
/// convergence check.
const REPAIR_TRIES: u32 = 40;

/// The trees recomputed from a node's storage, and its stored Merkle records. Local mounts
/// are those the node's served local tree has subtrees for (their UUIDs are in the
/// encrypted local mount tables).
fn recompute(node: &Node<SimStorage>) -> (Trees, Vec<(String, Vec<u8>)>) {
    let served = &node.replication().trees;
    let uuids: BTreeSet<String> = served
        .subtrees
        .keys()
        .filter(|(k, _)| *k == TreeKind::Local)
        .filter_map(|(_, id)| id.split_once('/').map(|(_, u)| u.to_string()))
        .collect();
    let mut t = Trees::default();
    for (k, v) in node.storage().scan("").unwrap_or_default() {
        let kind = match rclass::classify(&k, &uuids) {
            Class::NodeLocal => continue,
            Class::Replicated => TreeKind::Replicated,
            Class::ClusterLocal => TreeKind::Local,
        };
        t.add_bulk(kind, &rclass::subtree(&k), &k, &v);
    }
    t.finish();
    let stored = node.storage().scan(merkle::PREFIX).unwrap_or_default();
    (t, stored)
}

fn sample<T: std::fmt::Debug>(v: &[T]) -> String {
    let first: Vec<String> = v.iter().take(3).map(|x| format!("{x:?}")).collect();
    format!("{} (e.g. {})", v.len(), first.join(", "))
}

impl ReplWorld {
    fn storage_of(&mut self, h: HostId) -> Option<&mut SimStorage> {
        let x = &mut self.hosts[h];
        match x.node.as_mut() {
            Some(n) => Some(n.storage_mut()),
            None => x.parked.as_mut(),
        }
    }

    /// Plants bit rot: a byte of a stored Merkle record (any host), or of a replicated KV
    /// value on a secondary that can never become a primary (a performance secondary, or
    /// a DR one once no failover drill is pending) — on a primary it would destroy
    /// acknowledged data. The final phase repairs it with a reindex.
    fn plant_corruption(&mut self) {
        let h = self.corrupt_rng.below(self.hosts.len() as u64) as usize;
        let value = self.corrupt_rng.chance(400);
        let at = self.corrupt_rng.below(1 << 16) as usize;
        let xor = 1 + self.corrupt_rng.below(255) as u8;
        if value {
            let drill_pending = self.drill_at.is_some()
                || self.drill.as_ref().is_some_and(|d| d.step != DStep::Done);
            let ok = h != self.primary
                && self.secs.iter().any(|s| {
                    s.host == h
                        && s.enabled
                        && !s.gone
                        && (s.mode == Mode::Performance || !drill_pending)
                });
            if !ok {
                return;
            }
        }
        let planted: BTreeSet<String> = self.hosts[h].rot.records.keys().cloned().collect();
        let Some(st) = self.storage_of(h) else {
            return;
        };
        let cands: Vec<String> = if value {
            st.committed_keys(crate::storage::KV_DATA_PREFIX)
                .into_iter()
                .filter(|k| key_number(k).is_some())
                .collect()
        } else {
            st.committed_keys(merkle::PREFIX)
                .into_iter()
                .filter(|k| merkle::parse_key(k).is_some() && !planted.contains(k))
                .collect()
        };
        let Some(k) = self.corrupt_rng.pick(&cands).cloned() else {
            return;
        };
        let Some(bytes) = self.storage_of(h).and_then(|st| st.corrupt(&k, at, xor)) else {
            return;
        };
        let rot = &mut self.hosts[h].rot;
        rot.gen += 1;
        rot.dirty = true;
        if value {
            rot.values_gen += 1;
            rot.values.insert(k.clone());
        } else {
            rot.records.insert(k.clone(), bytes);
        }
        self.bump(if value { "rot:value" } else { "rot:record" });
        self.log(&format!("n{h} ROT: flipped a stored byte of {k}"));
    }

    /// Whether the final phase repairs host `h`'s planted corruption (it is the primary
    /// or an active secondary, and repairs have not kept failing).
    fn repair_wanted(&self, h: HostId) -> bool {
        self.hosts[h].rot.repair_tries < REPAIR_TRIES
            && (h == self.primary
                || self.secs.iter().any(|s| {
                    s.host == h
                        && s.enabled
                        && !s.gone
                        && s.revoked_from.is_none()
                        && !s.revoke_sent
                }))
    }

    fn active_sec(&self, h: HostId) -> Option<usize> {
        self.secs
            .iter()
            .position(|s| s.host == h && s.enabled && !s.gone)
    }

    /// A reindex (random flags) or Merkle check on host `h`, if its credentials are known.
    fn scan_req(
        &mut self,
        h: HostId,
        id: RequestId,
        reindex: bool,
        repair: bool,
    ) -> Option<(HostId, Op, Request)> {
        let (tok, mut body, dr) = if h == self.primary {
            (self.root(0), serde_json::Map::new(), false)
        } else {
            let i = self.active_sec(h)?;
            if self.sec_auth_req(i, id).is_some() {
                return None;
            }
            let (t, b) = self.sec_auth(i);
            (t, b, self.secs[i].mode == Mode::Dr)
        };
        let flags = reindex.then(|| {
            [
                self.scan_rng.chance(300),
                self.scan_rng.chance(300),
                self.scan_rng.chance(300),
            ]
        });
        if let Some(f) = flags {
            for (name, on) in ["diff", "force", "skip_flush"].iter().zip(f) {
                if on {
                    body.insert((*name).into(), json!(true));
                }
            }
        }
        let path = format!(
            "sys/replication/{}{}",
            if dr { "dr/secondary/" } else { "" },
            if reindex { "reindex" } else { "merkle-check" }
        );
        let req = Request::new(id, Method::Post, &path)
            .with_token(&tok)
            .with_json(Value::Object(body));
        Some((
            h,
            Op::Scan {
                h,
                reindex: flags,
                repair,
            },
            req,
        ))
    }

    /// Chaos: a reindex or Merkle check on a random host whose credentials are known.
    fn choose_scan(&mut self, id: RequestId) -> Option<(HostId, Op, Request)> {
        let mut hosts = vec![self.primary];
        for s in &self.secs {
            if s.enabled && !s.gone && !hosts.contains(&s.host) {
                hosts.push(s.host);
            }
        }
        let h = *self.scan_rng.pick(&hosts)?;
        if !self.up(h) {
            return None;
        }
        let reindex = self.scan_rng.chance(500);
        self.scan_req(h, id, reindex, false)
    }

    /// Final phase: a reindex on every host with planted corruption (getting its
    /// credentials first when needed).
    fn choose_repair(&mut self, id: RequestId) -> Option<(HostId, Op, Request)> {
        for h in 0..self.hosts.len() {
            if !self.hosts[h].rot.dirty || !self.repair_wanted(h) || !self.up(h) {
                continue;
            }
            if h != self.primary {
                let i = self.active_sec(h)?;
                if let Some(r) = self.sec_auth_req(i, id) {
                    return Some(r);
                }
            }
            return self.scan_req(h, id, true, true);
        }
        None
    }

    /// Checks a reindex or Merkle check answer the moment the node produced it (its
    /// storage and trees are as the scan left them).
    ///
    /// * `scan-busy`: a scan requested while another ran is refused.
    /// * `reindex`: afterwards the served trees equal a recomputation from storage, and
    ///   (without `skip_flush`) so do the stored records.
    /// * `merkle-check`: a record still holding planted bytes is reported; a host with
    ///   nothing planted since its last reindex is clean; and, when no value was planted
    ///   while it ran, the report equals the one computed from the node's storage.
    fn on_scan_answer(&mut self, h: HostId, r: &Response) -> Result<(), Violation> {
        let Some(ss) = self.scan else {
            return Ok(());
        };
        let Some((_, _, Op::Scan { reindex, .. })) = self.outstanding.clone() else {
            return Ok(());
        };
        let ok = r.status < 300;
        let text = r.body.as_ref().map(|b| b.to_string()).unwrap_or_default();
        if ss.busy {
            self.bump("scan-busy");
            if ok {
                return fail(
                    "scan-busy",
                    format!(
                        "n{h} accepted a scan while another ran: {}",
                        shorten(&text, 200)
                    ),
                );
            }
        }
        if !ok {
            return Ok(());
        }
        let x = &self.hosts[h];
        let Some(node) = x.node.as_ref() else {
            return Ok(());
        };
        let rot = &x.rot;
        let quiet = rot.values_gen == ss.values_gen;
        let (fresh, stored) = recompute(node);
        let served = &node.replication().trees;
        let mut bumps: Vec<&'static str> = Vec::new();
        let res = match reindex {
            Some(f) if quiet => {
                bumps.push("reindex");
                if *served != fresh {
                    let b = served.differing_buckets(&fresh);
                    fail(
                        "reindex",
                        format!(
                            "after a reindex (diff/force/skip_flush={f:?}) n{h} serves trees that differ from a recomputation over its storage in buckets {}",
                            sample(&b)
                        ),
                    )
                } else if !f[2] && !merkle::check(&fresh, served, &stored).is_clean() {
                    let rep = merkle::check(&fresh, served, &stored);
                    let bad: Vec<(String, Vec<usize>, bool)> = rep
                        .subtrees
                        .iter()
                        .map(|s| {
                            (
                                s.id.1.clone(),
                                s.pages.keys().copied().collect(),
                                s.corrupted_root,
                            )
                        })
                        .collect();
                    fail(
                        "reindex",
                        format!(
                            "after a reindex without skip_flush n{h}'s stored Merkle records differ from its trees: {}",
                            sample(&bad)
                        ),
                    )
                } else {
                    Ok(())
                }
            }
            Some(_) => Ok(()),
            None => {
                let body = r.body.clone().unwrap_or(Value::Null);
                let rep = &body["data"]["merkle_corruption_report"];
                let corrupted = rep["corrupted_root"].as_bool();
                let map = rep["corrupted_tree_map"].as_object();
                bumps.push("merkle-check");
                let (Some(corrupted), Some(map)) = (corrupted, map) else {
                    return fail(
                        "merkle-check",
                        format!(
                            "n{h}: malformed Merkle check answer {}",
                            shorten(&text, 200)
                        ),
                    );
                };
                let mut res = Ok(());
                for (k, bytes) in &rot.records {
                    if node.storage().get(k).ok().flatten().as_ref() != Some(bytes) {
                        continue;
                    }
                    let Some(rec) = merkle::parse_key(k) else {
                        continue;
                    };
                    bumps.push("merkle-check:planted");
                    let is = |e: &Value, id: &merkle::SubtreeId| {
                        e["subtree"].as_str() == Some(id.1.as_str())
                            && e["tree_type"].as_str() == Some(id.0.name())
                    };
                    let found = match &rec {
                        Record::Page(id, p) => map.values().any(|e| {
                            is(e, id)
                                && e["corrupted_index_tuples_map"][p.to_string()]["corrupted"]
                                    == json!(true)
                        }),
                        Record::Root(id) => map
                            .values()
                            .any(|e| is(e, id) && e["corrupted_subtree_root"] == json!(true)),
                    };
                    if !found || !corrupted {
                        res = fail(
                            "merkle-check",
                            format!(
                                "n{h} still stores the planted corruption of {k}, but its Merkle check does not report it: {}",
                                shorten(&rep.to_string(), 300)
                            ),
                        );
                        break;
                    }
                }
                if res.is_ok() && !rot.dirty && (corrupted || !map.is_empty()) {
                    res = fail(
                        "merkle-check",
                        format!(
                            "nothing was planted on n{h} since its last reindex, yet its Merkle check reports corruption: {}",
                            shorten(&rep.to_string(), 300)
                        ),
                    );
                }
                if res.is_ok() && quiet {
                    bumps.push("merkle-check:exact");
                    let mine = reindex_report(&merkle::check(&fresh, served, &stored), self.now);
                    if mine["corrupted_root"] != rep["corrupted_root"]
                        || mine["corrupted_tree_map"] != rep["corrupted_tree_map"]
                    {
                        res = fail(
                            "merkle-check",
                            format!(
                                "n{h}'s Merkle check answered {} but its storage and trees give {}",
                                shorten(&rep.to_string(), 300),
                                shorten(&mine.to_string(), 300)
                            ),
                        );
                    }
                }
                res
            }
        };
        for b in bumps {
            self.bump(b);
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regression_seeds_stay_single_node_and_a_third_replicate() {
        for s in [1u64, 2, 5, 6, 38, 40, 10_451_216_379_200_822_465] {
            assert!(!wants_replication(s), "seed {s}");
        }
        let n = crate::seed_sequence(0, 1000)
            .filter(|s| wants_replication(*s))
            .count();
        assert!((250..450).contains(&n), "{n}");
    }
}
