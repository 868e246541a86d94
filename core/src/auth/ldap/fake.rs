//! An in-memory directory that answers [`LdapCall`]s the way an OpenLDAP server would,
//! for unit tests and the simulator: simple binds against stored passwords (and
//! `userPrincipalName` binds like Active Directory), searches with scope, filter, attribute
//! selection, alias dereferencing, a size limit that paging lifts, dead and TLS-failing
//! URLs. Deterministic: results come in insertion order.

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
#[derive(Debug, Default)]
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
                    if !f.matches(&|a: &str| target.values(a)) || !seen.insert(target.norm.clone())
                    {
                        continue;
                    }
                    let all = s.attrs.is_empty() || s.attrs.iter().any(|a| a == "*");
                    let attrs = target
                        .attrs
                        .iter()
                        .filter(|(k, _)| !k.eq_ignore_ascii_case("userPassword"))
                        .filter(|(k, _)| all || s.attrs.iter().any(|a| a.eq_ignore_ascii_case(k)))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
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
