//! The operator model: the people and programs that talk to the nodes.
//!
//! Each node has one *admin* client (the operator proper) and a few *traffic* clients.
//! Every client has at most one request outstanding, thinks for a seeded while after each
//! answer, then picks its next [`Op`]. The admin initialises the node (`sys/init` with
//! various share counts and thresholds, or the dev set-up command), keeps the key shares,
//! unseals after every restart or seal, mounts `secret/`, writes policies, creates tokens
//! with limited policies and revokes them, and after each unseal reads every key back (the
//! audit the durability checker relies on). Traffic clients read, write, delete and list KV
//! entries with the root token, with limited tokens (some revoked or expired), with wrapping
//! tokens and with bogus ones; they wrap responses and unwrap them (sometimes twice), and
//! probe admin endpoints with tokens that must be refused.
//!
//! Tenant: once `secret/` is mounted, the admin sets up a tenant on its node, one step at a
//! time and retried until acknowledged ([`Op::TenantSetup`], [`TenantStep`]): the namespace
//! (`PUT sys/namespaces/t` with the root token), its `admin` policy (`path "*"` with every
//! capability and sudo, written in namespace `t`) and a token of it (`POST auth/token/create
//! {"policies":["admin"]}` in namespace `t`), whose secret the answer's `auth.client_token`
//! teaches it. Acknowledged steps are durable, so a restart does not repeat them; a tenant
//! token found dead (a 403 where the tenant's own namespace would answer 404) is created
//! again. Once the tenant token is known, traffic clients sometimes send
//! [`Op::TenantProbe`]s ([`TenantReach`]): the tenant admin token reaching outside `t/` —
//! sealing (with and without the namespace), enabling an audit device and hashing with one,
//! looking up, asking the capabilities of and revoking the root token, the root namespace's
//! KV keys (without the namespace, and as `t/secret/...`), `../secret/top0`, remounting
//! `secret/`, enabling replication and unlocking an LDAP user. Every one must be refused
//! (the revoke is a no-op 204) and none may reveal the root token or a stored value.
//!
//! The operator only knows what its answers told it. The harness's own view of the truth
//! lives in [`crate::model`]; the two are deliberately separate.

mod ops;

pub use ops::*;

use crate::model::{PolicySpec, Rule, CREATE, DELETE, DENY, LIST, READ, UPDATE};
use crate::net::{ClientId, HostId};
use crate::rng::SimRng;
use cairn_core::{AdminAnswer, AdminResult, Method, Response};
use serde_json::{json, Value};
use std::collections::{BTreeSet, VecDeque};

/// What a client learns about its request.
#[derive(Debug, Clone)]
pub enum Reply {
    Response(Response),
    Admin(AdminAnswer),
    /// No answer: the node was down or crashed before committing.
    Lost,
}

/// What a client does next.
#[derive(Debug, Clone)]
pub enum Next {
    Send(Op),
    /// Nothing to do now; ask again after this many ms.
    Sleep(u64),
    /// Finished (final phase).
    Idle,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Admin,
    Traffic,
}

#[derive(Debug, Clone)]
pub struct Client {
    pub id: ClientId,
    pub host: HostId,
    pub role: Role,
}

/// Per-seed settings of the operator model.
#[derive(Debug, Clone)]
pub struct OperatorParams {
    pub hosts: usize,
    pub traffic_per_host: usize,
    pub think_mean_ms: u64,
    pub admin_think_mean_ms: u64,
    /// Chance (per mille) that a node is set up with the dev command instead of `sys/init`.
    pub dev_setup_permille: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InitBelief {
    Unknown,
    Uninit,
    Init,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FinalState {
    Off,
    Pending,
    Done,
}

/// What the operator knows of its node's tenant: the set-up steps acknowledged so far.
#[derive(Debug, Clone, Default)]
struct Tenant {
    namespace: bool,
    policy: bool,
    /// The tenant's admin token.
    tok: Option<Tok>,
}

impl Tenant {
    /// The next set-up step, if any is left.
    fn next_step(&self) -> Option<TenantStep> {
        if !self.namespace {
            Some(TenantStep::Namespace)
        } else if !self.policy {
            Some(TenantStep::Policy)
        } else if self.tok.is_none() {
            Some(TenantStep::Token)
        } else {
            None
        }
    }
}

#[derive(Debug, Clone)]
struct KnownToken {
    tok: Tok,
    accessor: String,
    revoked: bool,
}

/// What the operator believes about one node.
#[derive(Debug, Clone)]
struct View {
    init: InitBelief,
    sealed: bool,
    keys: Vec<String>,
    keys_b64: Vec<String>,
    threshold: usize,
    root: Option<Tok>,
    unseal_plan: VecDeque<String>,
    mounted: bool,
    tokens: Vec<KnownToken>,
    wraps: Vec<Tok>,
    policies: BTreeSet<String>,
    audit: VecDeque<Op>,
    tenant: Tenant,
    next_label: u64,
    fin: FinalState,
}

impl View {
    fn new() -> View {
        View {
            init: InitBelief::Unknown,
            sealed: true,
            keys: Vec::new(),
            keys_b64: Vec::new(),
            threshold: 0,
            root: None,
            unseal_plan: VecDeque::new(),
            mounted: false,
            tokens: Vec::new(),
            wraps: Vec::new(),
            policies: BTreeSet::new(),
            audit: VecDeque::new(),
            tenant: Tenant::default(),
            next_label: 0,
            fin: FinalState::Off,
        }
    }
    fn label(&mut self, prefix: &str) -> String {
        self.next_label += 1;
        format!("{prefix}{}", self.next_label)
    }
}

pub struct Operator {
    rng: SimRng,
    params: OperatorParams,
    clients: Vec<Client>,
    views: Vec<View>,
    counter: u64,
    final_phase: bool,
}

impl Operator {
    pub fn new(rng: SimRng, params: OperatorParams) -> Operator {
        let mut clients = Vec::new();
        for h in 0..params.hosts {
            clients.push(Client {
                id: clients.len(),
                host: h,
                role: Role::Admin,
            });
            for _ in 0..params.traffic_per_host {
                clients.push(Client {
                    id: clients.len(),
                    host: h,
                    role: Role::Traffic,
                });
            }
        }
        Operator {
            rng,
            views: (0..params.hosts).map(|_| View::new()).collect(),
            params,
            clients,
            counter: 0,
            final_phase: false,
        }
    }

    pub fn clients(&self) -> &[Client] {
        &self.clients
    }

    /// Think time before a client's first request.
    pub fn initial_delay(&mut self, c: ClientId) -> u64 {
        match self.clients[c].role {
            Role::Admin => self.rng.range(0, 5),
            Role::Traffic => self.rng.delay(self.params.think_mean_ms),
        }
    }

    /// Enters the final phase: traffic stops, each admin re-checks its node (the world has
    /// just crashed them all), unseals it and reads every key back.
    pub fn begin_final(&mut self) {
        self.final_phase = true;
        for v in &mut self.views {
            v.init = InitBelief::Unknown;
            v.audit.clear();
            v.fin = FinalState::Pending;
        }
    }

    /// Whether every admin has finished its final audit.
    pub fn final_done(&self) -> bool {
        self.final_phase && self.views.iter().all(|v| v.fin == FinalState::Done)
    }

    /// A fresh KV value, unique across the run.
    fn value(&mut self, c: ClientId) -> Value {
        self.counter += 1;
        let mut v = json!({ "v": format!("c{c}-{}", self.counter), "n": self.counter });
        if self.rng.chance(200) {
            let len = self.rng.range(1, 48) as usize;
            v["blob"] = json!(hex::encode(self.rng.bytes(len)));
        }
        v
    }

    /// The next thing client `c` does.
    pub fn next(&mut self, c: ClientId) -> Next {
        let client = self.clients[c].clone();
        match client.role {
            Role::Admin => self.next_admin(c, client.host),
            Role::Traffic => {
                if self.final_phase {
                    Next::Idle
                } else {
                    Next::Send(self.traffic_op(c, client.host))
                }
            }
        }
    }

    fn next_admin(&mut self, c: ClientId, h: HostId) -> Next {
        let fin = self.final_phase;
        if self.views[h].fin == FinalState::Done {
            return Next::Idle;
        }
        match self.views[h].init {
            InitBelief::Unknown => return Next::Send(Op::SealStatus),
            InitBelief::Uninit => {
                if fin {
                    self.views[h].fin = FinalState::Done;
                    return Next::Idle;
                }
                return Next::Send(self.init_op());
            }
            InitBelief::Init => {}
        }
        if self.views[h].sealed {
            if self.views[h].keys.is_empty() {
                // Cannot happen while client links are reliable: an initialised node's
                // keys always reach the operator. Give up on this node rather than spin.
                self.views[h].fin = FinalState::Done;
                return Next::Idle;
            }
            if self.views[h].unseal_plan.is_empty() {
                self.plan_unseal(h);
            }
            let key = self.views[h].unseal_plan.pop_front().unwrap_or_default();
            return Next::Send(Op::Unseal { key });
        }
        let Some(root) = self.views[h].root.clone() else {
            self.views[h].fin = FinalState::Done;
            return Next::Idle;
        };
        if !self.views[h].mounted {
            return Next::Send(Op::Mount { tok: root });
        }
        // The tenant set-up goes before the read-back: three requests once, where the
        // read-back starts over after every unseal (and on a node that crashes every few
        // seconds would never leave room for it).
        if !fin {
            if let Some(step) = self.views[h].tenant.next_step() {
                return Next::Send(Op::TenantSetup { tok: root, step });
            }
        }
        if let Some(op) = self.views[h].audit.pop_front() {
            return Next::Send(op);
        }
        if fin {
            self.views[h].fin = FinalState::Done;
            return Next::Idle;
        }
        self.admin_op(c, h, root)
    }

    fn init_op(&mut self) -> Op {
        if self.rng.chance(self.params.dev_setup_permille) {
            return Op::DevSetup;
        }
        if self.rng.chance(60) {
            // An invalid configuration the node must refuse.
            let shares = self.rng.range(2, 5) as u8;
            let threshold = if self.rng.chance(500) { 1 } else { shares + 1 };
            return Op::Init { shares, threshold };
        }
        let shares = self.rng.range(1, 6) as u8;
        let threshold = if shares == 1 {
            1
        } else {
            self.rng.range(2, shares as u64) as u8
        };
        Op::Init { shares, threshold }
    }

    /// Chooses the shares for the next unseal attempt: `threshold` distinct valid shares in
    /// random order, sometimes spoiled by a duplicate, an undecodable or a wrong share.
    fn plan_unseal(&mut self, h: HostId) {
        let n = self.views[h].keys.len();
        let mut idx: Vec<usize> = (0..n).collect();
        self.rng.shuffle(&mut idx);
        idx.truncate(self.views[h].threshold.max(1));
        let mut plan: Vec<String> = idx
            .iter()
            .map(|&i| {
                if self.rng.chance(300) && i < self.views[h].keys_b64.len() {
                    self.views[h].keys_b64[i].clone()
                } else {
                    self.views[h].keys[i].clone()
                }
            })
            .collect();
        match self.rng.below(20) {
            0 => {
                let len = self.views[h]
                    .keys
                    .first()
                    .map(|k| k.len() / 2)
                    .unwrap_or(33);
                let pos = self.rng.below(plan.len() as u64 + 1) as usize;
                let wrong = hex::encode(self.rng.bytes(len));
                plan.insert(pos, wrong);
            }
            1 => {
                let pos = self.rng.below(plan.len() as u64 + 1) as usize;
                plan.insert(pos, "not-a-key-share!".into());
            }
            2 => {
                if let Some(first) = plan.first().cloned() {
                    plan.insert(1, first);
                }
            }
            _ => {}
        }
        self.views[h].unseal_plan = plan.into();
    }

    fn admin_op(&mut self, c: ClientId, h: HostId, root: Tok) -> Next {
        let live = self.views[h].tokens.iter().filter(|t| !t.revoked).count() as u64;
        let weights = [
            15,                             // policy write
            2,                              // policy delete
            if live < 12 { 15 } else { 3 }, // token create
            if live > 0 { 6 } else { 0 },   // token revoke
            1,                              // seal
            1,                              // unmount (then mount again)
            2,                              // seal status
            25,                             // traffic as root or otherwise
        ];
        match self.rng.weighted(&weights) {
            0 => {
                let name = self.pick_str(POLICY_NAMES);
                let spec = self.policy_spec(&name);
                let as_json = self.rng.chance(250);
                Next::Send(Op::PolicyWrite {
                    tok: root,
                    name,
                    spec,
                    json: as_json,
                })
            }
            1 => {
                let name = self.pick_str(POLICY_NAMES);
                Next::Send(Op::PolicyDelete { tok: root, name })
            }
            2 => {
                let k = self.rng.range(1, 3);
                let mut policies: Vec<String> =
                    (0..k).map(|_| self.pick_str(POLICY_NAMES)).collect();
                if self.rng.chance(50) {
                    policies.push("no-such-policy".into());
                }
                policies.sort();
                policies.dedup();
                let ttl_s = match self.rng.below(5) {
                    0 | 1 => self.rng.range(1, 30),
                    2 => self.rng.range(30, 3600),
                    3 => self.rng.range(3600, 86_400),
                    _ => self.rng.range(86_400, 40 * 86_400),
                };
                let ttl_as_string = self.rng.chance(500);
                let num_uses = if self.rng.chance(150) {
                    self.rng.range(1, 3)
                } else {
                    0
                };
                let wrap = if self.rng.chance(100) {
                    Some(("10m".to_string(), 600))
                } else {
                    None
                };
                Next::Send(Op::TokenCreate {
                    tok: root,
                    policies,
                    ttl_s,
                    ttl_as_string,
                    num_uses,
                    wrap,
                })
            }
            3 => {
                let live: Vec<KnownToken> = self.views[h]
                    .tokens
                    .iter()
                    .filter(|t| !t.revoked)
                    .cloned()
                    .collect();
                match self.rng.pick(&live).cloned() {
                    Some(t) => {
                        let accessor = (self.rng.chance(300) && !t.accessor.is_empty())
                            .then(|| t.accessor.clone());
                        Next::Send(Op::TokenRevoke {
                            tok: root,
                            target: t.tok,
                            accessor,
                        })
                    }
                    None => Next::Send(Op::SealStatus),
                }
            }
            4 => Next::Send(Op::Seal { tok: root }),
            5 => Next::Send(Op::Unmount { tok: root }),
            6 => Next::Send(Op::SealStatus),
            _ => Next::Send(self.traffic_op(c, h)),
        }
    }

    fn pick_str(&mut self, xs: &[&str]) -> String {
        self.rng.pick(xs).map(|s| s.to_string()).unwrap_or_default()
    }

    fn caps(&mut self) -> u8 {
        if self.rng.chance(120) {
            return DENY;
        }
        let mut c = 0;
        for bit in [CREATE, READ, UPDATE, DELETE, LIST] {
            if self.rng.chance(550) {
                c |= bit;
            }
        }
        if c == 0 {
            READ
        } else {
            c
        }
    }

    /// A policy for `name`: a team policy covers its own directory, `reader` the whole
    /// mount, `mixed` a bit of everything.
    fn policy_spec(&mut self, name: &str) -> PolicySpec {
        let mut rules = Vec::new();
        let add = |pattern: String, caps: u8, rules: &mut Vec<Rule>| {
            if !rules.iter().any(|r: &Rule| r.pattern == pattern) {
                rules.push(Rule { pattern, caps });
            }
        };
        match name.strip_prefix("team-") {
            Some(t) => {
                let c = self.caps();
                add(format!("secret/{t}/*"), c, &mut rules);
                if self.rng.chance(400) {
                    let c = self.caps();
                    add(format!("secret/{t}/private*"), c, &mut rules);
                }
                if self.rng.chance(250) {
                    let k = self.pick_str(&["k0", "k1", "deep/x"]);
                    let c = self.caps();
                    add(format!("secret/{t}/{k}"), c, &mut rules);
                }
            }
            None if name == "reader" => {
                let c = if self.rng.chance(700) {
                    READ | LIST
                } else {
                    self.caps()
                };
                add("secret/*".into(), c, &mut rules);
            }
            None => {
                for _ in 0..self.rng.range(1, 3) {
                    let t = self.pick_str(TEAMS);
                    let pattern = match self.rng.below(4) {
                        0 => format!("secret/{t}/*"),
                        1 => format!("secret/{t}/private*"),
                        2 => format!("secret/{t}/deep/*"),
                        _ => format!("secret/{t}/k{}", self.rng.below(3)),
                    };
                    let c = self.caps();
                    add(pattern, c, &mut rules);
                }
            }
        }
        PolicySpec { rules }
    }

    /// A token for traffic: mostly root or a limited token the operator holds (revoked and
    /// expired ones included), sometimes a wrapping token, another node's token, a bogus
    /// one or none at all.
    fn traffic_tok(&mut self, h: HostId) -> Tok {
        let v = &self.views[h];
        let roll = self.rng.below(100);
        if roll < 35 {
            if let Some(r) = &v.root {
                return r.clone();
            }
        } else if roll < 88 {
            if let Some(t) = self.rng.pick(&v.tokens) {
                return t.tok.clone();
            }
            if let Some(r) = &v.root {
                return r.clone();
            }
        } else if roll < 91 {
            if let Some(w) = self.rng.pick(&v.wraps) {
                return w.clone();
            }
        } else if roll < 94 && self.views.len() > 1 {
            let other =
                (h + 1 + self.rng.below(self.views.len() as u64 - 1) as usize) % self.views.len();
            let ov = &self.views[other];
            if let Some(t) = self.rng.pick(&ov.tokens) {
                return Tok {
                    label: format!("{}@n{other}", t.tok.label),
                    secret: t.tok.secret.clone(),
                };
            }
        } else if roll < 97 {
            return Tok {
                label: "bogus".into(),
                secret: format!("cs.{}", hex::encode(self.rng.bytes(12))),
            };
        }
        Tok::none()
    }

    fn traffic_op(&mut self, c: ClientId, h: HostId) -> Op {
        let tok = self.traffic_tok(h);
        let keys = key_universe();
        let key = self.rng.pick(&keys).cloned().unwrap_or_default();
        let has_wraps = !self.views[h].wraps.is_empty();
        let has_tenant = self.views[h].tenant.tok.is_some() && self.views[h].root.is_some();
        let weights = [
            30,                                        // put
            25,                                        // get
            8,                                         // delete
            8,                                         // list
            6,                                         // get wrapped
            if has_wraps { 6 } else { 0 },             // unwrap
            4,                                         // lookup-self
            if tok.secret.is_empty() { 1 } else { 4 }, // probe
            if has_tenant { 3 } else { 0 },            // tenant probe
        ];
        let op = match self.rng.weighted(&weights) {
            0 => KvOp::Put {
                key,
                value: self.value(c),
            },
            1 => KvOp::Get { key, wrap: None },
            2 => KvOp::Delete { key },
            3 => {
                let dirs = dir_universe();
                KvOp::List {
                    dir: self.rng.pick(&dirs).cloned().unwrap_or_default(),
                    via_query: self.rng.chance(300),
                }
            }
            4 => {
                let (hdr, secs) = match self.rng.below(5) {
                    0 => ("2s".to_string(), 2),
                    1 => ("30s".to_string(), 30),
                    2 => ("5m".to_string(), 300),
                    3 => ("120".to_string(), 120),
                    _ => ("1h".to_string(), 3600),
                };
                KvOp::Get {
                    key,
                    wrap: Some((hdr, secs)),
                }
            }
            5 => {
                let wraps = self.views[h].wraps.clone();
                let wrap = self.rng.pick(&wraps).cloned().unwrap_or_else(Tok::none);
                return Op::Unwrap {
                    wrap,
                    in_body: self.rng.chance(500),
                };
            }
            6 => {
                if self.rng.chance(150) && tok.label != "root" {
                    return Op::RevokeSelf { tok };
                }
                return Op::LookupSelf { tok };
            }
            8 => return self.tenant_probe(h, &key),
            _ => {
                let (method, path) = *self.rng.pick(PROBES).unwrap_or(&PROBES[0]);
                // Root may do anything; probes are for everyone else.
                let tok = if Some(&tok) == self.views[h].root.as_ref() {
                    Tok::none()
                } else {
                    tok
                };
                return Op::Probe { tok, method, path };
            }
        };
        Op::Kv {
            tok,
            op,
            audit: false,
        }
    }

    /// The tenant's admin token reaching for something outside its namespace (`key`: a key
    /// of the universe, for the KV reaches).
    fn tenant_probe(&mut self, h: HostId, key: &str) -> Op {
        let v = &self.views[h];
        let (Some(tok), Some(root)) = (v.tenant.tok.clone(), v.root.clone()) else {
            return Op::SealStatus;
        };
        let weights = [
            2, // seal, in the namespace
            2, // seal, no namespace
            2, // enable an audit device
            2, // hash with an audit device
            2, // look the root token up
            2, // the root token's capabilities
            8, // the root namespace's KV keys
            1, // ../secret/top0
            1, // remount secret/
            1, // enable replication
            1, // unlock an LDAP user
            2, // revoke the root token
        ];
        let reach = match self.rng.weighted(&weights) {
            0 => TenantReach::new(Method::Put, "sys/seal", true),
            1 => TenantReach::new(Method::Put, "sys/seal", false),
            2 => TenantReach::new(Method::Put, "sys/audit/evil", true)
                .body(json!({"type": "file", "options": {"file_path": "/tmp/sim-evil.log"}})),
            3 => TenantReach::new(Method::Post, "sys/audit-hash/evil", true)
                .body(json!({"input": "x"})),
            4 => TenantReach::new(Method::Post, "auth/token/lookup", true).naming(&root, json!({})),
            5 => TenantReach::new(Method::Post, "sys/capabilities", true)
                .naming(&root, json!({"path": "secret/a/k0"})),
            6 => {
                let in_tenant = self.rng.chance(500);
                match self.rng.below(4) {
                    0 => TenantReach::new(Method::Get, key, in_tenant),
                    1 => {
                        let value = json!({"v": format!("tenant-{}", self.rng.below(1000))});
                        TenantReach::new(Method::Put, key, in_tenant).body(value)
                    }
                    2 => {
                        let dirs = dir_universe();
                        let dir = self.rng.pick(&dirs).cloned().unwrap_or_default();
                        TenantReach::new(Method::List, &dir, in_tenant)
                    }
                    _ => TenantReach::new(Method::Delete, key, in_tenant),
                }
            }
            7 => TenantReach {
                malformed: true,
                ..TenantReach::new(Method::Get, "../secret/top0", true)
            },
            8 => TenantReach::new(Method::Put, "sys/mounts/secret", false)
                .body(json!({"type": "kv"})),
            9 => TenantReach::new(
                Method::Put,
                "sys/replication/performance/primary/enable",
                true,
            )
            .body(json!({})),
            10 => TenantReach::new(Method::Post, "sys/locked-users/x/unlock/alice", true),
            _ => TenantReach {
                noop: true,
                ..TenantReach::new(Method::Post, "auth/token/revoke", true).naming(&root, json!({}))
            },
        };
        Op::TenantProbe { tok, reach }
    }

    /// Learns from the answer to `op`; returns the think time before the client's next op.
    pub fn on_reply(&mut self, c: ClientId, op: &Op, reply: &Reply) -> u64 {
        let client = self.clients[c].clone();
        let h = client.host;
        let think = match client.role {
            Role::Admin => self.rng.delay(self.params.admin_think_mean_ms),
            Role::Traffic => self.rng.delay(self.params.think_mean_ms),
        };
        let resp = match reply {
            Reply::Lost => {
                if client.role == Role::Admin {
                    // Maybe restarted: find out before going on.
                    let v = &mut self.views[h];
                    v.init = InitBelief::Unknown;
                    v.audit.clear();
                    // A node that is down refuses at once: back off a little.
                    return think + self.rng.range(20, 500);
                }
                // Traffic backs off too, so a node that is down is not hammered.
                return think + self.rng.range(50, 1000);
            }
            Reply::Admin(v) => {
                if let Op::DevSetup = op {
                    self.learn_dev_setup(h, v);
                }
                return think;
            }
            Reply::Response(r) => r,
        };
        if client.role == Role::Traffic && resp.status == 503 {
            // Sealed: a client retries, but not in a tight loop.
            return think + self.rng.range(10, 300);
        }
        if client.role == Role::Admin && resp.status == 503 {
            let v = &mut self.views[h];
            if v.init != InitBelief::Uninit {
                v.init = InitBelief::Unknown;
            }
            v.audit.clear();
        }
        let body = resp.body.clone().unwrap_or(Value::Null);
        match op {
            Op::SealStatus if resp.status == 200 => {
                let v = &mut self.views[h];
                let initialized = body["initialized"].as_bool().unwrap_or(false);
                v.init = if initialized {
                    InitBelief::Init
                } else {
                    InitBelief::Uninit
                };
                let sealed = body["sealed"].as_bool().unwrap_or(true);
                if v.sealed && !sealed {
                    self.on_unsealed(h);
                }
                self.views[h].sealed = sealed;
            }
            Op::Init { .. } => {
                let v = &mut self.views[h];
                if resp.status == 200 {
                    v.keys = str_list(&body["keys"]);
                    v.keys_b64 = str_list(&body["keys_base64"]);
                    v.threshold = 0;
                    v.root = body["root_token"].as_str().map(|s| Tok {
                        label: "root".into(),
                        secret: s.to_string(),
                    });
                    v.init = InitBelief::Init;
                    v.sealed = true;
                    v.unseal_plan.clear();
                    v.mounted = false;
                    v.tenant = Tenant::default();
                    if let Op::Init { threshold, .. } = op {
                        v.threshold = *threshold as usize;
                    }
                } else {
                    v.init = InitBelief::Unknown;
                }
            }
            Op::Unseal { .. } => {
                if resp.status == 200 {
                    let sealed = body["sealed"].as_bool().unwrap_or(true);
                    if self.views[h].sealed && !sealed {
                        self.on_unsealed(h);
                    }
                    self.views[h].sealed = sealed;
                } else {
                    self.views[h].unseal_plan.clear();
                }
            }
            Op::Seal { .. } if resp.status == 204 => {
                let v = &mut self.views[h];
                v.sealed = true;
                v.unseal_plan.clear();
            }
            Op::Mount { .. } if resp.status == 204 || resp.status == 400 => {
                self.views[h].mounted = true;
            }
            Op::Unmount { .. } if resp.status == 204 => {
                self.views[h].mounted = false;
            }
            Op::PolicyWrite { name, .. } if resp.status == 204 => {
                self.views[h].policies.insert(name.clone());
            }
            Op::PolicyDelete { name, .. } if resp.status == 204 => {
                self.views[h].policies.remove(name);
            }
            Op::TokenCreate { .. } | Op::Unwrap { .. } if resp.status == 200 => {
                if let Some(s) = body["auth"]["client_token"].as_str() {
                    let v = &mut self.views[h];
                    let label = format!("{}{}", v.label("t"), crate::check::short(s));
                    v.tokens.push(KnownToken {
                        tok: Tok {
                            label,
                            secret: s.to_string(),
                        },
                        accessor: body["auth"]["accessor"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        revoked: false,
                    });
                }
                self.learn_wrap(h, &body);
            }
            Op::TokenRevoke { target: who, .. } | Op::RevokeSelf { tok: who }
                if resp.status == 204 =>
            {
                for t in &mut self.views[h].tokens {
                    if t.tok.secret == who.secret {
                        t.revoked = true;
                    }
                }
            }
            Op::Kv {
                op: KvOp::Get { wrap: Some(_), .. },
                ..
            } if resp.status == 200 => self.learn_wrap(h, &body),
            Op::TenantSetup { step, .. } => {
                let t = &mut self.views[h].tenant;
                match (step, resp.status) {
                    (TenantStep::Namespace, 200 | 204) => t.namespace = true,
                    (TenantStep::Policy, 200 | 204) => t.policy = true,
                    (TenantStep::Token, 200) => {
                        if let Some(s) = body["auth"]["client_token"].as_str() {
                            t.tok = Some(Tok {
                                label: format!("tenant{}", crate::check::short(s)),
                                secret: s.to_string(),
                            });
                        }
                    }
                    _ => {}
                }
            }
            // Inside its namespace the tenant's token may do anything: a 403 there means the
            // token is gone (expired), so the admin creates another.
            Op::TenantProbe { tok, reach }
                if resp.status == 403 && reach.in_tenant && reach.path.starts_with("secret/") =>
            {
                let t = &mut self.views[h].tenant;
                if t.tok.as_ref() == Some(tok) {
                    t.tok = None;
                }
            }
            _ => {}
        }
        think
    }

    /// Keeps the wrapping token of a wrapped answer.
    fn learn_wrap(&mut self, h: HostId, body: &Value) {
        if let Some(s) = body["wrap_info"]["token"].as_str() {
            let v = &mut self.views[h];
            let label = format!("{}{}", v.label("w"), crate::check::short(s));
            v.wraps.push(Tok {
                label,
                secret: s.to_string(),
            });
            if v.wraps.len() > 16 {
                v.wraps.remove(0);
            }
        }
    }

    fn learn_dev_setup(&mut self, h: HostId, answer: &AdminAnswer) {
        let v = &mut self.views[h];
        let Ok(AdminResult::DevSetup(keys)) = answer else {
            v.init = InitBelief::Unknown;
            return;
        };
        v.keys = keys.keys.clone();
        v.keys_b64 = keys.keys_base64.clone();
        v.threshold = 1;
        v.root = Some(Tok {
            label: "root".into(),
            secret: keys.root_token.clone(),
        });
        v.init = InitBelief::Init;
        v.sealed = false;
        v.mounted = true;
        v.tenant = Tenant::default();
        v.unseal_plan.clear();
    }

    /// After every unseal the admin reads the whole key universe back with the root token.
    fn on_unsealed(&mut self, h: HostId) {
        let Some(root) = self.views[h].root.clone() else {
            return;
        };
        let mut audit: VecDeque<Op> = key_universe()
            .into_iter()
            .map(|key| Op::Kv {
                tok: root.clone(),
                op: KvOp::Get { key, wrap: None },
                audit: true,
            })
            .collect();
        for dir in dir_universe() {
            audit.push_back(Op::Kv {
                tok: root.clone(),
                op: KvOp::List {
                    dir,
                    via_query: false,
                },
                audit: true,
            });
        }
        self.views[h].audit = audit;
    }
}

fn str_list(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}
