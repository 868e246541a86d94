//! An in-memory directory that answers [`LdapCall`]s the way an OpenLDAP server would,
//! for unit tests and the simulator: simple binds against stored passwords (and
//! `userPrincipalName` binds like Active Directory), searches with scope, filter, attribute
//! selection, alias dereferencing, a size limit that paging lifts, dead and TLS-failing
//! URLs. Deterministic: results come in insertion order.
//!
//! With [`FakeDirectory::active_directory`] it answers like Active Directory: a refused
//! bind says why in AD's words (`..., data 52e, v1db1`; an entry's `cairnAdState` value,
//! e.g. `533`, refuses its right password with that code), `memberOf` is computed from the
//! groups' `member` values, the in-chain matching rule (`member:1.2.840.113556.1.4.1941:=`)
//! follows nested groups, and `tokenGroups` (the `objectSid`s of every group the entry is
//! in, nested ones included) is given to base searches only. (Search references, which AD
//! returns next to the entries of a subtree search from the domain root, are dropped by
//! the shell, so no answer of the core's carries them.)

use super::dn;
use super::filter;
use super::ops::{
    ConnId, Deref, FailKind, LdapCall, LdapDone, LdapEntry, LdapFailure, LdapOp, LdapReply, Scope,
    Secret,
};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone)]
struct Entry {
    dn: String,
    norm: String,
    attrs: BTreeMap<String, Vec<String>>,
}

impl Entry {
    fn values(&self, name: &str) -> Vec<String> {
        self.attrs
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .flat_map(|(_, v)| v.iter().cloned())
            .collect()
    }
    fn is_alias(&self) -> bool {
        self.values("objectClass")
            .iter()
            .any(|c| c.eq_ignore_ascii_case("alias"))
    }
}

/// The fake directory.
#[derive(Debug, Default, Clone)]
pub struct FakeDirectory {
    entries: Vec<Entry>,
    /// Whether anonymous (unbound) clients may search.
    pub anonymous_search: bool,
    /// Most entries a search without paging returns before failing with code 4; 0 = none.
    pub size_limit: usize,
    /// URLs that refuse connections.
    pub dead_urls: BTreeSet<String>,
    /// URLs whose TLS handshake fails.
    pub tls_failing_urls: BTreeSet<String>,
    /// Open connections and who is bound on them (`None` = anonymous).
    conns: BTreeMap<ConnId, Option<String>>,
    /// Every call answered, in order.
    pub log: Vec<LdapCall>,
    /// Answer like Active Directory (see the module documentation).
    pub active_directory: bool,
}

/// AD's diagnostic message of a refused bind with `code` (`52e`, `533`, ...).
pub fn ad_refusal(code: &str) -> String {
    format!("80090308: LdapErr: DSID-0C0903A9, comment: AcceptSecurityContext error, data {code}, v1db1")
}

fn fail(kind: FailKind, code: Option<u32>, msg: &str) -> LdapFailure {
    LdapFailure::new(kind, code, msg)
}

impl FakeDirectory {
    pub fn new() -> FakeDirectory {
        FakeDirectory::default()
    }

    /// Adds an entry; `attrs` pairs an attribute with its values.
    pub fn add(&mut self, dn_str: &str, attrs: &[(&str, &[&str])]) -> &mut Self {
        let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (k, vs) in attrs {
            map.entry(k.to_string())
                .or_default()
                .extend(vs.iter().map(|v| v.to_string()));
        }
        let norm = dn::normalize(dn_str).unwrap_or_else(|| dn_str.to_lowercase());
        self.entries.retain(|e| e.norm != norm);
        self.entries.push(Entry {
            dn: dn_str.to_string(),
            norm,
            attrs: map,
        });
        self
    }

    /// Number of connections still open.
    pub fn open_connections(&self) -> usize {
        self.conns.len()
    }

    /// The groups `norm` is in, directly (`nested` false) or through nested groups too,
    /// in insertion order.
    fn groups_of(&self, norm: &str, nested: bool) -> Vec<&Entry> {
        let mut found: Vec<&Entry> = Vec::new();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        let mut todo = vec![norm.to_string()];
        while let Some(n) = todo.pop() {
            for g in &self.entries {
                let is_member = g
                    .values("member")
                    .iter()
                    .any(|m| dn::normalize(m).as_deref() == Some(n.as_str()));
                if is_member && seen.insert(g.norm.clone()) {
                    found.push(g);
                    if nested {
                        todo.push(g.norm.clone());
                    }
                }
            }
        }
        found
    }

    /// The members of group `g`, through nested groups too.
    fn members_in_chain(&self, g: &Entry) -> Vec<String> {
        let mut out = Vec::new();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        let mut todo: Vec<String> = g.values("member");
        while let Some(m) = todo.pop() {
            let n = dn::normalize(&m).unwrap_or_else(|| m.to_lowercase());
            if !seen.insert(n) {
                continue;
            }
            if let Some(e) = self.find(&m) {
                todo.extend(e.values("member"));
            }
            out.push(m);
        }
        out
    }

    /// The values of `a` on `e` as searches see them: stored, or computed (AD's
    /// `memberOf`, and the `;in-chain` values the filter evaluator asks for).
    fn search_values(&self, e: &Entry, a: &str) -> Vec<String> {
        let lower = a.to_ascii_lowercase();
        match lower.as_str() {
            "member;in-chain" => self.members_in_chain(e),
            "memberof;in-chain" => self
                .groups_of(&e.norm, true)
                .iter()
                .map(|g| g.dn.clone())
                .collect(),
            "memberof" if self.active_directory => self
                .groups_of(&e.norm, false)
                .iter()
                .map(|g| g.dn.clone())
                .collect(),
            _ => e.values(a),
        }
    }

    fn find(&self, dn_str: &str) -> Option<&Entry> {
        let n = dn::normalize(dn_str)?;
        self.entries.iter().find(|e| e.norm == n)
    }

    /// Answers one call. A [`LdapOp::Run`] is run to the end, each of its operations
    /// answered (and logged) like a call of its own on the call's connection.
    pub fn answer(&mut self, call: &LdapCall) -> LdapReply {
        if let LdapOp::ConnectBound { spec, dn, password } = &call.op {
            // A fresh connection every time: a connect and a bind, logged as such.
            let mut step = LdapCall {
                op_id: call.op_id,
                conn: call.conn,
                op: LdapOp::Connect(spec.clone()),
                close_after: false,
            };
            let connected = self.answer(&step);
            if connected.result.is_err() {
                return connected;
            }
            step.op = LdapOp::Bind {
                dn: dn.clone(),
                password: password.clone(),
            };
            step.close_after = call.close_after;
            let bound = self.answer(&step);
            return LdapReply {
                result: bound.result.and(connected.result),
                ..bound
            };
        }
        if let LdapOp::Run(job) = &call.op {
            let mut job = job.clone();
            job.run(|op, close_after| {
                let step = LdapCall {
                    op_id: call.op_id,
                    conn: call.conn,
                    op: op.clone(),
                    close_after,
                };
                self.answer(&step).result
            });
            self.conns.remove(&call.conn);
            return LdapReply {
                op_id: call.op_id,
                conn: call.conn,
                result: Ok(LdapDone::Ran(job)),
            };
        }
        self.log.push(call.clone());
        let result = self.perform(call);
        if call.close_after {
            self.conns.remove(&call.conn);
        }
        LdapReply {
            op_id: call.op_id,
            conn: call.conn,
            result,
        }
    }

    /// Checks a simple bind's credentials: the bound entry's normalized DN (none for an
    /// anonymous bind) or the refusal.
    fn credentials(&self, who: &str, password: &Secret) -> Result<Option<String>, LdapFailure> {
        if who.is_empty() && password.is_empty() {
            return Ok(None);
        }
        if password.is_empty() {
            return Err(fail(
                FailKind::Ldap,
                Some(53),
                "unwilling to perform: unauthenticated bind (DN with no password) disallowed",
            ));
        }
        let entry = if who.contains('@') && !who.contains('=') {
            self.entries.iter().find(|e| {
                e.values("userPrincipalName")
                    .iter()
                    .any(|u| u.eq_ignore_ascii_case(who))
            })
        } else {
            self.find(who)
        };
        let ok = entry.is_some_and(|e| {
            e.values("userPassword")
                .iter()
                .any(|p| p == password.expose())
        });
        if self.active_directory {
            // AD checks the password first: a wrong one is 52e whatever the account's state.
            let state = entry
                .and_then(|e| e.values("cairnAdState").first().cloned())
                .filter(|_| ok);
            return match (ok, state) {
                (true, None) => Ok(entry.map(|e| e.norm.clone())),
                (true, Some(code)) => Err(LdapFailure::new(
                    FailKind::InvalidCredentials,
                    Some(49),
                    format!(
                        "LDAP result code 49 (invalidCredentials): {}",
                        ad_refusal(&code)
                    ),
                )),
                (false, _) => Err(LdapFailure::new(
                    FailKind::InvalidCredentials,
                    Some(49),
                    format!(
                        "LDAP result code 49 (invalidCredentials): {}",
                        ad_refusal("52e")
                    ),
                )),
            };
        }
        if ok {
            Ok(entry.map(|e| e.norm.clone()))
        } else {
            Err(fail(
                FailKind::InvalidCredentials,
                Some(49),
                "invalid credentials",
            ))
        }
    }

    fn perform(&mut self, call: &LdapCall) -> Result<LdapDone, LdapFailure> {
        if !matches!(call.op, LdapOp::Connect(_)) && !self.conns.contains_key(&call.conn) {
            return Err(fail(FailKind::NoConnection, None, "no such connection"));
        }
        match &call.op {
            LdapOp::Connect(spec) => {
                let mut errors = Vec::new();
                let mut kind = FailKind::Connect;
                for u in &spec.urls {
                    if self.dead_urls.contains(u) {
                        errors.push(format!(
                            "error connecting to host {u:?}: connection refused"
                        ));
                        continue;
                    }
                    let tls = u.starts_with("ldaps://") || spec.starttls;
                    if tls && self.tls_failing_urls.contains(u) && !spec.insecure_tls {
                        errors.push(format!(
                            "error connecting to host {u:?}: invalid peer certificate: UnknownIssuer"
                        ));
                        kind = FailKind::Tls;
                        continue;
                    }
                    self.conns.insert(call.conn, None);
                    return Ok(LdapDone::Connected { url: u.clone() });
                }
                Err(fail(kind, None, &errors.join("; ")))
            }
            LdapOp::Close => {
                self.conns.remove(&call.conn);
                Ok(LdapDone::Closed)
            }
            LdapOp::Run(_) | LdapOp::ConnectBound { .. } => {
                Err(fail(FailKind::Ldap, None, "not a single operation"))
            }
            LdapOp::CheckBind { spec, dn, password } => {
                // A connection of its own: reachable like a connect, checked like a bind,
                // and the call's connection keeps its identity.
                if spec.urls.iter().all(|u| self.dead_urls.contains(u)) {
                    return Err(fail(FailKind::Connect, None, "connection refused"));
                }
                self.credentials(dn, password).map(|_| LdapDone::Bound)
            }
            LdapOp::Bind { dn: who, password } => {
                let norm = self.credentials(who, password)?;
                self.conns.insert(call.conn, norm);
                Ok(LdapDone::Bound)
            }
            LdapOp::Search(s) => {
                let bound = self.conns.get(&call.conn).cloned().flatten();
                if bound.is_none() && !self.anonymous_search {
                    return Ok(LdapDone::Entries(Vec::new()));
                }
                let token_groups = s
                    .attrs
                    .iter()
                    .any(|a| a.eq_ignore_ascii_case("tokenGroups"));
                if token_groups && s.scope != Scope::Base && self.active_directory {
                    return Err(fail(
                        FailKind::Ldap,
                        Some(1),
                        "LDAP result code 1 (operationsError): 00002020: operational_search_post_process failed for attribute 'tokenGroups' - Cannot provide tokenGroups attribute, this is not a BASE search",
                    ));
                }
                let f = filter::parse(&s.filter)
                    .map_err(|e| fail(FailKind::Ldap, None, &format!("filter parse error: {e}")))?;
                let mut base = dn::normalize(&s.base).unwrap_or_default();
                if matches!(s.deref, Deref::Finding | Deref::Always) {
                    if let Some(e) = self.entries.iter().find(|e| e.norm == base && e.is_alias()) {
                        if let Some(t) = e.values("aliasedObjectName").first() {
                            base = dn::normalize(t).unwrap_or_default();
                        }
                    }
                }
                let in_scope = |n: &str| -> bool {
                    let under = base.is_empty() || n.ends_with(&format!(",{base}"));
                    match s.scope {
                        Scope::Base => n == base,
                        Scope::Sub => n == base || under,
                        Scope::One => {
                            under && {
                                let head = if base.is_empty() {
                                    n
                                } else {
                                    &n[..n.len() - base.len() - 1]
                                };
                                dn::parse(head).map(|r| r.len() == 1).unwrap_or(false)
                            }
                        }
                    }
                };
                let deref_search = matches!(s.deref, Deref::Searching | Deref::Always);
                let mut seen = BTreeSet::new();
                let mut out = Vec::new();
                for e in self.entries.iter().filter(|e| in_scope(&e.norm)) {
                    let target = if deref_search && e.is_alias() {
                        match e
                            .values("aliasedObjectName")
                            .first()
                            .and_then(|t| self.find(t))
                        {
                            Some(t) => t,
                            None => continue,
                        }
                    } else {
                        e
                    };
                    if !f.matches(&|a: &str| self.search_values(target, a))
                        || !seen.insert(target.norm.clone())
                    {
                        continue;
                    }
                    let all = s.attrs.is_empty() || s.attrs.iter().any(|a| a == "*");
                    let mut attrs: BTreeMap<String, Vec<String>> = target
                        .attrs
                        .iter()
                        .filter(|(k, _)| {
                            !k.eq_ignore_ascii_case("userPassword")
                                && !k.eq_ignore_ascii_case("cairnAdState")
                        })
                        .filter(|(k, _)| all || s.attrs.iter().any(|a| a.eq_ignore_ascii_case(k)))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    let wants = |n: &str| s.attrs.iter().any(|a| a.eq_ignore_ascii_case(n));
                    if self.active_directory && (all || wants("memberOf")) {
                        let v = self.search_values(target, "memberOf");
                        if !v.is_empty() {
                            attrs.insert("memberOf".into(), v);
                        }
                    }
                    if token_groups && s.scope == Scope::Base {
                        let sids: Vec<String> = self
                            .groups_of(&target.norm, true)
                            .iter()
                            .flat_map(|g| g.values("objectSid"))
                            .collect();
                        if !sids.is_empty() {
                            attrs.insert("tokenGroups".into(), sids);
                        }
                    }
                    out.push(LdapEntry {
                        dn: target.dn.clone(),
                        attrs,
                    });
                }
                if s.page_size == 0 && self.size_limit > 0 && out.len() > self.size_limit {
                    return Err(fail(FailKind::SizeLimit, Some(4), "size limit exceeded"));
                }
                Ok(LdapDone::Entries(out))
            }
        }
    }
}
