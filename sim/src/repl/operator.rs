//! The replication operator's requests: what it manages (secondaries, [`Op`]) and how it
//! chooses its next request ([`ReplWorld::choose`]): set-up, traffic, LDAP logins,
//! secondary root tokens, disable/re-enable, revocations. Answers are in [`super::reply`].

use super::*;

/// What the operator's outstanding request is.
#[derive(Debug, Clone)]
pub(super) enum Op {
    Unseal(HostId),
    Mount,
    /// Enabling the KV version 2 mount `versioned/`.
    MountV2,
    /// A KV version 2 request on `versioned/` (a write, patch, soft delete or metadata
    /// write): its data is replicated like any other and checked by convergence.
    KvV2,
    EnablePrimary(Mode),
    SecToken(usize),
    Filter(usize),
    SecEnable(usize),
    Put {
        n: u64,
        other: bool,
    },
    /// A KV write sent to performance secondary `h` with its own root token: the secondary
    /// forwards it to its primary (at most once) and relays the answer.
    FwdPut {
        h: HostId,
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
    /// The snapshot drill on the primary (`snapshot.rs`): the save, a damaged copy of the
    /// file (cut at `at`, or byte `at` flipped), the restore.
    SnapSave,
    SnapDamaged {
        truncated: bool,
        at: usize,
    },
    SnapRestore,
}

/// A secondary the operator manages.
#[derive(Debug, Clone)]
pub(super) struct Sec {
    pub(super) host: HostId,
    pub(super) mode: Mode,
    pub(super) filtered: bool,
    pub(super) attempt: u32,
    pub(super) id: String,
    /// Every id an activation was attempted with (an enable whose answer was lost may
    /// have used any of them).
    pub(super) ids: Vec<String>,
    pub(super) revoke_left: Vec<String>,
    pub(super) token: Option<String>,
    pub(super) filter_set: bool,
    /// Upper bound of the WAL index of the acknowledged paths-filter write.
    pub(super) filter_wal: u64,
    /// A failover may have lost the filter (its write was not known to be replicated to the
    /// promoted DR secondary): filtered or not, both are right until it is set again.
    pub(super) filter_unsure: bool,
    pub(super) enabled: bool,
    /// Key number from which writes must not reach it (revoke acknowledged).
    pub(super) revoked_from: Option<u64>,
    pub(super) revoke_sent: bool,
    /// A root token generated on the secondary itself (its own tokens are gone once it
    /// follows a performance primary): the `sys/generate-root` flow, then the token.
    pub(super) root_gen: ShareFlow,
    pub(super) local_root: Option<String>,
    /// Pending re-point to a new primary: Some(true) by activation token, Some(false) by
    /// `update_primary_addrs`.
    pub(super) repoint: Option<bool>,
    pub(super) repoint_fails: u32,
    /// Joins with `update-primary` (the demoted old primary) rather than `enable`.
    pub(super) rejoin: bool,
    /// Promoted: no longer a secondary.
    pub(super) gone: bool,
    /// Its roots equalled the primary's at least once (a DR secondary that may be promoted).
    pub(super) synced_once: bool,
    /// Disable-and-re-enable drill pending.
    pub(super) disable: bool,
    /// Holds the LDAP mount and config (it matched the primary since they were written).
    pub(super) ldap_ready: bool,
}

impl Sec {
    /// A secondary of the topology, not yet enabled, whose first activation id is `id`.
    pub(super) fn new(host: HostId, mode: Mode, filtered: bool, id: String) -> Sec {
        Sec {
            host,
            mode,
            filtered,
            attempt: 0,
            id,
            ids: Vec::new(),
            revoke_left: Vec::new(),
            token: None,
            filter_set: false,
            filter_wal: u64::MAX,
            filter_unsure: false,
            enabled: false,
            revoked_from: None,
            revoke_sent: false,
            root_gen: ShareFlow::default(),
            local_root: None,
            repoint: None,
            repoint_fails: 0,
            rejoin: false,
            gone: false,
            synced_once: false,
            disable: false,
            ldap_ready: false,
        }
    }
}

pub(super) fn status_ok(r: &Result<Response, String>) -> bool {
    matches!(r, Ok(r) if r.status < 300)
}

pub(super) fn body_text(r: &Result<Response, String>) -> String {
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
pub(super) fn key_number(k: &str) -> Option<(bool, u64)> {
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
    pub(super) fn root(&self, h: HostId) -> String {
        self.hosts[h].root.clone()
    }

    pub(super) fn sec_of(&self, h: HostId) -> Option<&Sec> {
        self.secs.iter().find(|s| s.host == h)
    }

    /// The operator's next request, if any.
    pub(super) fn choose(&mut self) -> Option<(HostId, Op, Request)> {
        let id = self.next_id + 1;
        if let Some(r) = self.choose_unseal(id) {
            return Some(r);
        }
        if matches!(self.phase, Phase::Chaos | Phase::Final) {
            match self.choose_drill(id) {
                DrillNext::Off => {}
                DrillNext::Wait => return None,
                DrillNext::Send(r) => return Some(*r),
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
        if let Some(r) = self.choose_setup(id) {
            return Some(r);
        }
        if let Some(r) = self.choose_sec_root(id) {
            return Some(r);
        }
        if let Some(r) = self.choose_disable(id) {
            return Some(r);
        }
        if let Some(r) = self.choose_snapshot(id) {
            return Some(r);
        }
        if self.scan_rng.chance(self.params.scan_permille) {
            if let Some(r) = self.choose_scan(id) {
                return Some(r);
            }
        }
        self.choose_traffic(id)
    }

    /// An unseal of a host that needs one (every tier restarts sealed).
    fn choose_unseal(&mut self, id: RequestId) -> Option<(HostId, Op, Request)> {
        for h in 0..self.hosts.len() {
            if self.hosts[h].needs_unseal
                && self.hosts[h].host.is_up()
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
        None
    }

    /// The cluster set-up, one step at a time until acknowledged: the LDAP mount and its
    /// configuration, the second KV mount, the performance (and DR) primary, and for each
    /// secondary its revocations, activation token, paths filter and enable.
    fn choose_setup(&mut self, id: RequestId) -> Option<(HostId, Op, Request)> {
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
                .with_json(self.ldap.config());
            return Some((self.primary, Op::LdapConfig, req));
        }
        if !self.mounted {
            let req = Request::new(id, Method::Post, "sys/mounts/other")
                .with_token(&r0)
                .with_json(json!({"type": "kv"}));
            return Some((self.primary, Op::Mount, req));
        }
        if !self.v2_mounted {
            let req = Request::new(id, Method::Post, "sys/mounts/versioned")
                .with_token(&r0)
                .with_json(json!({"type": "kv-v2"}));
            return Some((self.primary, Op::MountV2, req));
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
        None
    }

    /// Now and then, a root token generated on a performance secondary with the primary's
    /// key (its own tokens are gone once it follows a performance primary).
    fn choose_sec_root(&mut self, id: RequestId) -> Option<(HostId, Op, Request)> {
        // A root token on each performance secondary, generated with the primary's key.
        for i in 0..self.secs.len() {
            let s = &self.secs[i];
            if !s.enabled
                || s.mode != Mode::Performance
                || s.local_root.is_some()
                || s.root_gen.tries > 20
                || self.hosts[s.host].needs_unseal
            {
                continue;
            }
            if !self.oprng.chance(200) {
                break;
            }
            return Some(self.gen_root_req(i, id));
        }
        None
    }

    /// The disable-and-re-enable drill of a secondary marked for it (its credentials
    /// first).
    fn choose_disable(&mut self, id: RequestId) -> Option<(HostId, Op, Request)> {
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
        None
    }

    /// Traffic: KV writes and deletes on two mounts, policies, tokens, probes of primary
    /// tokens and reads (some at an `X-Vault-Index`) on performance secondaries, LDAP
    /// logins, mapping writes and directory changes, token creation on secondaries, and
    /// the occasional disable or revocation of a secondary.
    fn choose_traffic(&mut self, id: RequestId) -> Option<(HostId, Op, Request)> {
        let r0 = self.root(0);
        let perf_secs: Vec<HostId> = self
            .secs
            .iter()
            .filter(|s| s.enabled && s.mode == Mode::Performance && s.local_root.is_some())
            .map(|s| s.host)
            .collect();
        let pick = self
            .oprng
            .weighted(&[35, 15, 8, 5, 4, 6, 15, 2, 1, 10, 3, 2, 2]);
        let existing = |r: &mut SimRng, next: u64| if next == 0 { 0 } else { r.below(next) };
        match pick {
            0 if self.v2_mounted && self.oprng.chance(250) => {
                let key = format!("versioned/data/v-{}", self.oprng.below(8));
                let v = self.oprng.below(1_000);
                let (m, path, body) = match self.oprng.below(4) {
                    0 => (Method::Patch, key, json!({"data": {"p": v}})),
                    1 => (Method::Delete, key, Value::Null),
                    2 => (
                        Method::Post,
                        key.replacen("/data/", "/metadata/", 1),
                        json!({"max_versions": 1 + v % 4, "custom_metadata": {"v": v.to_string()}}),
                    ),
                    _ => (Method::Put, key, json!({"data": {"v": v}})),
                };
                let req = Request::new(id, m, &path).with_token(&r0).with_json(body);
                Some((self.primary, Op::KvV2, req))
            }
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
                // Now and then through a performance secondary, which forwards it.
                let via = if perf_secs.is_empty() || !self.oprng.chance(120) {
                    None
                } else {
                    self.oprng.pick(&perf_secs).copied()
                };
                if let Some(h) = via {
                    let t = self
                        .sec_of(h)
                        .and_then(|s| s.local_root.clone())
                        .unwrap_or_default();
                    let req = Request::new(id, Method::Put, &key_name(other, n))
                        .with_token(&t)
                        .with_json(json!({ "v": v }));
                    return Some((h, Op::FwdPut { h, n: v, other }, req));
                }
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
            // Nor logins: a restore forgets the entities created after the save, which the
            // LDAP model keeps.
            9 if self.snap.busy() => None,
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
            // The LDAP model's mappings are not rewound by a snapshot restore: none are
            // written between the save and the restore.
            10 if self.snap.busy() => None,
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
    pub(super) fn gen_root_req(&self, i: usize, id: RequestId) -> (HostId, Op, Request) {
        let s = &self.secs[i];
        let h = s.host;
        let base = "sys/generate-root/attempt";
        match s.root_gen.next() {
            ShareStep::Cancel => (h, Op::GenCancel(i), Request::new(id, Method::Delete, base)),
            ShareStep::Start => (
                h,
                Op::GenAttempt(i),
                Request::new(id, Method::Post, base).with_json(json!({})),
            ),
            ShareStep::Update(nonce) => {
                let key = if s.root_gen.tries.is_multiple_of(2) {
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
    pub(super) fn optok_req(&self, h: HostId, id: RequestId) -> (HostId, Op, Request) {
        let t = &self.optok[h];
        let base = "sys/replication/dr/secondary/generate-operation-token/attempt";
        match t.flow.next() {
            ShareStep::Cancel => (h, Op::TokCancel(h), Request::new(id, Method::Delete, base)),
            ShareStep::Start => (
                h,
                Op::TokAttempt(h),
                Request::new(id, Method::Post, base).with_json(json!({})),
            ),
            ShareStep::Update(nonce) => {
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

    pub(super) fn up(&self, h: HostId) -> bool {
        self.hosts[h].host.is_up() && !self.hosts[h].needs_unseal
    }

    /// What secondary `i` needs before it can run a protected operation, if anything: a
    /// DR operation token (DR) or a local root token (performance).
    pub(super) fn sec_auth_req(&self, i: usize, id: RequestId) -> Option<(HostId, Op, Request)> {
        let s = &self.secs[i];
        match s.mode {
            Mode::Dr if self.optok[s.host].token.is_none() => Some(self.optok_req(s.host, id)),
            Mode::Performance if s.local_root.is_none() => Some(self.gen_root_req(i, id)),
            _ => None,
        }
    }

    /// Token and body fields for a protected operation on secondary `i`.
    pub(super) fn sec_auth(&self, i: usize) -> (String, serde_json::Map<String, Value>) {
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

    pub(super) fn update_primary_req(
        &self,
        i: usize,
        id: RequestId,
        by_token: bool,
    ) -> (HostId, Op, Request) {
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

    pub(super) fn wake(&mut self) -> Result<(), Violation> {
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
                        Method::Patch => "PATCH",
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

    pub(super) fn new_attempt(&mut self, i: usize) {
        let s = &mut self.secs[i];
        s.attempt += 1;
        s.id = format!("n{}-{}", s.host, s.attempt);
        s.token = None;
        s.filter_set = false;
    }
}
