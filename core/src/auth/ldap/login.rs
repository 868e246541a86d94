//! The login state machine: one value per login in progress, advanced by the result of the
//! LDAP operation it asked for last. It never blocks and never touches I/O; each step
//! returns the next operation or the outcome.
//!
//! Steps, following the reference's order:
//! 1. connect (URL list in order, StartTLS when configured);
//! 2. bind as `binddn` when one is configured;
//! 3. find the user's bind DN: search `userdn` with the rendered `userfilter` (when
//!    `discoverdn`, or `binddn`+`bindpass`), else `username@upndomain`, else
//!    `userattr=<escaped username>,userdn`;
//! 4. bind as the user with the password (the actual authentication); on a connection
//!    bound as `binddn`, this bind is a [`LdapOp::CheckBind`] on a connection of its own,
//!    so the service connection keeps its identity. When the search resolves no single
//!    entry, the bind is still made, as a DN that names no entry ([`DUMMY_RDN`] under
//!    `userdn`) with the password given, and its refusal is answered like a wrong
//!    password: an unknown user costs the same operations and gets the same answer;
//! 5. otherwise re-bind as `binddn` so the service identity searches groups;
//! 6. with `upndomain`, search the user's DN by `userPrincipalName`;
//! 7. bind anonymously when `anonymous_group_search`;
//! 8. search `groupdn` with the rendered `groupfilter`, reading `groupattr`; or, with
//!    `use_token_groups` (Active Directory), read the user entry's `tokenGroups` (a base
//!    search: every group the user is in, nested ones included, as SIDs) and search
//!    `groupdn` for the groups with those `objectSid`s, reading `groupattr`.
//!
//! A [`Job`] carries a machine to the executor, which runs it to the end with
//! [`Login::run`] on one connection (the node sees only the outcome, not each step), and
//! hands it back. A look-up ([`Login::lookup`], for token renewals) makes the same steps
//! as the service identity without the user's password: connect, bind as `binddn`, search
//! the user, search the groups.

use super::config::LdapConfig;
use super::dn;
use super::escape;
use super::ops::{
    ConnId, FailKind, LdapDone, LdapEntry, LdapFailure, LdapOp, Scope, SearchSpec, Secret,
};
use super::template;
use crate::api::{ApiError, RequestId};
use crate::mounts::MountEntry;
use std::collections::BTreeSet;

/// The message of a refused user bind (the reference's wording); also used when the user
/// is not found, so the answer does not tell which usernames exist.
pub const USER_BIND_FAILED: &str = "ldap operation failed: failed to bind as user";

/// The RDN bound as (under `userdn`) when the user search resolves no single entry: the
/// bind is made anyway so an unknown user costs what a wrong password does.
pub const DUMMY_RDN: &str = "cn=cairn-no-such-user-5c1f0e9a";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Connect,
    ConnectBound,
    ServiceBind,
    UserSearch,
    UserBind,
    Rebind,
    UpnSearch,
    AnonBind,
    GroupSearch,
    /// Reading the user entry's `tokenGroups` (Active Directory).
    TokenGroups,
    /// Searching `groupdn` for the groups of the token's SIDs.
    SidGroups,
}

/// Why a machine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Authenticate the user with the password, then find the groups.
    Login,
    /// Find the user and the groups as the service identity (no password): renewals.
    Lookup,
}

/// Most operations one run may make (a machine never needs more than nine).
pub const MAX_STEPS: usize = 32;

/// Most entries one search may return to a login or look-up; more is refused with 400
/// (the executor may stop reading, and paging, once it holds more than this many).
pub const MAX_SEARCH_ENTRIES: usize = 10_000;

/// What the directory said about the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Group names found in the directory (sorted, unique).
    pub groups: Vec<String>,
    pub user_dn: String,
    /// The alias name: the username or the user entry's `userattr` value.
    pub alias: String,
    pub warnings: Vec<String>,
}

/// What to do after a step.
#[derive(Debug)]
pub enum Next {
    /// Send this operation.
    Call {
        op: LdapOp,
        /// Close the connection after it (the login's last operation).
        close_after: bool,
    },
    Done(Result<Found, ApiError>),
}

/// One login in progress.
#[derive(Debug, Clone, PartialEq)]
pub struct Login {
    pub request_id: RequestId,
    pub purpose: Purpose,
    pub mount: MountEntry,
    pub cfg: LdapConfig,
    pub username: String,
    password: Secret,
    pub conn: ConnId,
    pub step: Step,
    /// The connection is closed already (never opened, or closed after the last call).
    pub closed: bool,
    close_pending: bool,
    bind_dn: String,
    user_dn: String,
    alias_value: Option<String>,
    /// Remote address of the client, for logs.
    pub remote_addr: String,
    /// The failure was the user's credentials (a refused user bind, or no such user): it
    /// counts towards the user lockout.
    pub bad_credentials: bool,
    /// The connection is bound as the service identity (`binddn`) now.
    service_bound: bool,
    /// An operation failed in a way that leaves the connection unusable or unknown.
    broken: bool,
    /// The user's bind was checked on a connection of its own (the service connection
    /// stayed bound as `binddn`, so no re-bind follows).
    bind_aside: bool,
    /// The user search resolved no single entry: the user bind is made as a DN of no
    /// entry, and whatever it answers, the login fails like a wrong password.
    unresolved: bool,
    /// The name of the entry the user search resolved: its single `userattr` value, else
    /// its DN lower-cased (for the lockout, see [`Login::entry_alias`]).
    entry_alias: Option<String>,
    /// Why the directory refused the user's bind, when it said (Active Directory's `data`
    /// code, e.g. "account disabled (AD data 533)"): for the server's log and audit only;
    /// the client's answer is the same for every refusal.
    pub directory_reason: Option<String>,
}

/// A machine sent to the executor to run to the end, and its outcome when it comes back.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub login: Login,
    /// The first operation (connect).
    pub first: LdapOp,
    /// Set by [`Job::run`].
    pub outcome: Option<Result<Found, ApiError>>,
}

impl Job {
    /// Runs the machine with `exec` performing each operation (`true` = close the
    /// connection after it) and keeps the outcome.
    pub fn run(&mut self, exec: impl FnMut(&LdapOp, bool) -> Result<LdapDone, LdapFailure>) {
        let first = self.first.clone();
        self.outcome = Some(self.login.run(first, exec));
    }
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::bad(msg)
}

impl Login {
    /// Starts a login; returns the machine and its first operation (connect).
    pub fn start(
        request_id: RequestId,
        mount: MountEntry,
        cfg: LdapConfig,
        username: &str,
        password: &str,
        conn: ConnId,
        remote_addr: &str,
    ) -> (Login, LdapOp) {
        // With a service identity the connection starts bound as it, which lets the
        // executor reuse a connection an earlier login left bound so.
        let (op, step) = if cfg.has_service_bind() {
            (
                LdapOp::ConnectBound {
                    spec: cfg.connect_spec(),
                    dn: cfg.binddn.clone(),
                    password: cfg.bindpass.clone(),
                },
                Step::ConnectBound,
            )
        } else {
            (LdapOp::Connect(cfg.connect_spec()), Step::Connect)
        };
        (
            Login {
                request_id,
                purpose: Purpose::Login,
                mount,
                cfg,
                username: username.to_string(),
                password: Secret::new(password),
                conn,
                step,
                closed: false,
                close_pending: false,
                bind_dn: String::new(),
                user_dn: String::new(),
                alias_value: None,
                remote_addr: remote_addr.to_string(),
                bad_credentials: false,
                service_bound: false,
                broken: false,
                bind_aside: false,
                unresolved: false,
                entry_alias: None,
                directory_reason: None,
            },
            op,
        )
    }

    /// Starts a look-up of `username`'s groups as the service identity (the config must
    /// have `binddn` and `bindpass`); returns the machine and its first operation.
    pub fn lookup(
        request_id: RequestId,
        mount: MountEntry,
        cfg: LdapConfig,
        username: &str,
        conn: ConnId,
    ) -> (Login, LdapOp) {
        let (mut l, op) = Login::start(request_id, mount, cfg, username, "", conn, "");
        l.purpose = Purpose::Lookup;
        (l, op)
    }

    /// Runs the machine to its outcome from `first`, with `exec` performing each
    /// operation (`true` = close the connection after it).
    pub fn run(
        &mut self,
        first: LdapOp,
        mut exec: impl FnMut(&LdapOp, bool) -> Result<LdapDone, LdapFailure>,
    ) -> Result<Found, ApiError> {
        let (mut op, mut close) = (first, false);
        for _ in 0..MAX_STEPS {
            let r = exec(&op, close);
            match self.advance(r) {
                Next::Call {
                    op: next,
                    close_after,
                } => {
                    op = next;
                    close = close_after;
                }
                Next::Done(result) => return result,
            }
        }
        Err(ApiError::Internal(
            "the LDAP login made more operations than any login needs".into(),
        ))
    }

    fn call(&mut self, step: Step, op: LdapOp) -> Next {
        self.step = step;
        Next::Call {
            op,
            close_after: false,
        }
    }

    fn search(&self, base: &str, filter: String, attr: &str) -> LdapOp {
        LdapOp::Search(SearchSpec {
            base: base.to_string(),
            scope: Scope::Sub,
            filter,
            attrs: vec![attr.to_string()],
            deref: self.cfg.deref(),
            page_size: self.cfg.page_size(),
        })
    }

    fn done(&mut self, r: Result<Found, ApiError>) -> Next {
        Next::Done(r)
    }

    /// The name the directory entry found by the user search goes by: its single
    /// `userattr` value, else its DN lower-cased; `None` when no search resolved exactly
    /// one entry. Two login names that resolve to one entry share it, so the lockout
    /// counts their failures together.
    pub fn entry_alias(&self) -> Option<&str> {
        self.entry_alias.as_deref()
    }

    /// Whether the connection may serve another login after this one ended: it is bound
    /// as the service identity and nothing failed on it in a way that leaves its state
    /// unknown.
    pub fn reusable(&self) -> bool {
        self.service_bound && !self.broken
    }

    /// Advances with the result of the last operation.
    pub fn advance(&mut self, result: Result<LdapDone, LdapFailure>) -> Next {
        if self.close_pending {
            self.closed = true;
        }
        let aside = self.step == Step::UserBind && self.bind_aside;
        if let Err(f) = &result {
            if !aside
                && matches!(
                    f.kind,
                    FailKind::Connect | FailKind::Tls | FailKind::Timeout | FailKind::NoConnection
                )
            {
                self.broken = true;
            }
        }
        match self.step {
            Step::ConnectBound | Step::ServiceBind | Step::Rebind => {
                self.service_bound = result.is_ok();
            }
            Step::UserBind if aside => {}
            Step::UserBind | Step::AnonBind => self.service_bound = false,
            _ => {}
        }
        if let Ok(LdapDone::Entries(e)) = &result {
            if e.len() > MAX_SEARCH_ENTRIES {
                let narrow = if matches!(self.step, Step::GroupSearch | Step::SidGroups) {
                    "groupdn or groupfilter"
                } else {
                    "userdn or userfilter"
                };
                return self.done(Err(bad(format!(
                    "ldap operation failed: a search returned more than {MAX_SEARCH_ENTRIES} entries; narrow {narrow}"
                ))));
            }
        }
        match (self.step, result) {
            (Step::ConnectBound, Ok(LdapDone::Connected { url })) => {
                log::debug!(
                    "ldap login {}: connected to {url} as the service identity",
                    self.request_id
                );
                self.find_user()
            }
            (Step::ConnectBound, Err(f)) if matches!(f.kind, FailKind::Connect | FailKind::Tls) => {
                self.closed = true;
                self.connect_failed(&f)
            }
            (Step::ConnectBound, Err(f)) => self.service_bind_failed(&f),
            (Step::Connect, Ok(LdapDone::Connected { url })) => {
                log::debug!("ldap login {}: connected to {url}", self.request_id);
                self.after_connect()
            }
            (Step::Connect, Err(f)) => {
                self.closed = true;
                self.connect_failed(&f)
            }
            (Step::ServiceBind, Ok(LdapDone::Bound)) => self.find_user(),
            (Step::ServiceBind, Err(f)) => self.service_bind_failed(&f),
            (Step::UserSearch, Ok(LdapDone::Entries(entries))) => self.user_found(entries),
            (Step::UserSearch, Err(f)) => self.done(Err(search_failed(
                "LDAP search for the user's bind DN failed",
                &f,
            ))),
            (Step::UserBind, Ok(LdapDone::Bound)) if self.unresolved => {
                // A DN of no entry bound (an unauthenticated bind with an empty password,
                // say): still no user.
                self.bad_credentials = true;
                self.done(Err(bad(USER_BIND_FAILED)))
            }
            (Step::UserBind, Ok(LdapDone::Bound)) => {
                if aside {
                    self.after_rebind()
                } else if self.cfg.has_service_bind() {
                    let op = LdapOp::Bind {
                        dn: self.cfg.binddn.clone(),
                        password: self.cfg.bindpass.clone(),
                    };
                    self.call(Step::Rebind, op)
                } else {
                    self.after_rebind()
                }
            }
            (Step::UserBind, Err(f)) => {
                if let Some((code, reason)) = super::ad::bind_refusal(&f.message) {
                    let r = format!("{reason} (AD data {code})");
                    log::warn!(
                        "ldap login {}: the directory refused the bind as {:?}: {r}",
                        self.request_id,
                        self.bind_dn,
                    );
                    self.directory_reason = Some(r);
                } else {
                    log::debug!(
                        "ldap login {}: bind as {:?} failed: {}",
                        self.request_id,
                        self.bind_dn,
                        f.message
                    );
                }
                let e = match f.kind {
                    FailKind::InvalidCredentials => {
                        self.bad_credentials = true;
                        bad(USER_BIND_FAILED)
                    }
                    FailKind::Connect | FailKind::Timeout => lost_or(&f, USER_BIND_FAILED),
                    _ => bad(format!("{USER_BIND_FAILED}: {}", f.message)),
                };
                self.done(Err(e))
            }
            (Step::Rebind, Ok(LdapDone::Bound)) => self.after_rebind(),
            (Step::Rebind, Err(f)) => self.done(Err(lost_or(
                &f,
                "ldap operation failed: failed to re-bind with the BindDN user",
            ))),
            (Step::UpnSearch, Ok(LdapDone::Entries(entries))) => {
                // The reference takes the last entry; a UPN is unique in practice.
                if let Some(e) = entries.last() {
                    self.user_dn = e.dn.clone();
                    self.take_alias(e);
                } else {
                    self.user_dn = String::new();
                }
                self.groups()
            }
            (Step::UpnSearch, Err(f)) => self.done(Err(search_failed(
                "LDAP search failed for detecting user",
                &f,
            ))),
            (Step::AnonBind, Ok(LdapDone::Bound)) => self.group_search(),
            (Step::AnonBind, Err(f)) => self.done(Err(lost_or(
                &f,
                "ldap operation failed: failed to bind anonymously for the group search",
            ))),
            (Step::GroupSearch, Ok(LdapDone::Entries(entries))) => {
                let groups = self.group_names(&entries);
                self.finish(groups)
            }
            (Step::GroupSearch, Err(f)) => {
                self.done(Err(search_failed("LDAP search for groups failed", &f)))
            }
            (Step::TokenGroups, Ok(LdapDone::Entries(entries))) => self.token_groups(&entries),
            (Step::TokenGroups, Err(f)) => self.done(Err(search_failed(
                "LDAP search for the user's tokenGroups failed",
                &f,
            ))),
            (Step::SidGroups, Ok(LdapDone::Entries(entries))) => {
                let groups = self.group_names(&entries);
                self.finish(groups)
            }
            (Step::SidGroups, Err(f)) => self.done(Err(search_failed(
                "LDAP search for the groups of the user's tokenGroups failed",
                &f,
            ))),
            (step, Ok(other)) => self.done(Err(ApiError::Internal(format!(
                "unexpected LDAP result {other:?} in step {step:?}"
            )))),
        }
    }

    fn connect_failed(&mut self, f: &LdapFailure) -> Next {
        let what = if f.kind == FailKind::Tls {
            "TLS handshake with the LDAP server failed"
        } else {
            "failed to connect to LDAP server"
        };
        self.done(Err(bad(format!(
            "ldap operation failed: {what}: {}",
            f.message
        ))))
    }

    fn service_bind_failed(&mut self, f: &LdapFailure) -> Next {
        log::warn!(
            "ldap login {}: bind as binddn {:?} failed: {}",
            self.request_id,
            self.cfg.binddn,
            f.message
        );
        self.done(Err(lost_or(
            f,
            "ldap operation failed: failed to bind with the configured binddn",
        )))
    }

    fn after_connect(&mut self) -> Next {
        if !self.cfg.binddn.is_empty() || !self.cfg.bindpass.is_empty() {
            let op = LdapOp::Bind {
                dn: self.cfg.binddn.clone(),
                password: self.cfg.bindpass.clone(),
            };
            self.call(Step::ServiceBind, op)
        } else {
            self.find_user()
        }
    }

    /// The rendered user filter with the username escaped for filters.
    pub fn user_filter(&self) -> Result<String, String> {
        let t = template::parse(&self.cfg.userfilter, super::config::USER_FIELDS)?;
        let user = escape::filter_value(&self.username);
        let (attr, name) = if self.cfg.upndomain.is_empty() {
            (escape::filter_value(&self.cfg.userattr), user)
        } else {
            (
                "userPrincipalName".to_string(),
                format!("{user}@{}", self.cfg.upndomain),
            )
        };
        Ok(t.render(&[("UserAttr", &attr), ("Username", &name)]))
    }

    /// The rendered group filter.
    pub fn group_filter(&self) -> Result<String, String> {
        let t = template::parse(&self.cfg.groupfilter, super::config::GROUP_FIELDS)?;
        Ok(t.render(&[
            ("UserDN", &escape::filter_value(&self.user_dn)),
            ("Username", &escape::filter_value(&self.username)),
        ]))
    }

    fn find_user(&mut self) -> Next {
        if self.purpose == Purpose::Lookup && !self.cfg.has_service_bind() {
            return self.done(Err(bad("a directory look-up needs binddn and bindpass")));
        }
        if self.cfg.searches_for_user() {
            let filter = match self.user_filter() {
                Ok(f) => f,
                Err(e) => return self.done(Err(bad(format!("invalid userfilter: {e}")))),
            };
            let op = self.search(&self.cfg.userdn, filter, &self.cfg.userattr);
            return self.call(Step::UserSearch, op);
        }
        let user = escape::dn_value(&self.username);
        self.bind_dn = if !self.cfg.upndomain.is_empty() {
            format!("{user}@{}", self.cfg.upndomain)
        } else if self.cfg.userdn.is_empty() {
            format!("{}={user}", self.cfg.userattr)
        } else {
            format!("{}={user},{}", self.cfg.userattr, self.cfg.userdn)
        };
        self.user_bind()
    }

    fn user_found(&mut self, entries: Vec<LdapEntry>) -> Next {
        match entries.len() {
            1 if self.purpose == Purpose::Lookup => {
                // Found by the service identity: no user bind; search its groups.
                self.user_dn = entries[0].dn.clone();
                self.take_alias(&entries[0]);
                self.groups()
            }
            1 => {
                self.bind_dn = entries[0].dn.clone();
                self.take_alias(&entries[0]);
                self.entry_alias = Some(
                    self.alias_value
                        .clone()
                        .unwrap_or_else(|| entries[0].dn.to_lowercase()),
                );
                self.user_bind()
            }
            0 if self.purpose == Purpose::Lookup => self.done(Err(bad(
                "the user is no longer found in the directory",
            ))),
            n if self.purpose == Purpose::Lookup => self.done(Err(bad(format!(
                "{USER_BIND_FAILED}: the user search matched {n} entries, not exactly one; make userfilter and userattr select a unique entry"
            )))),
            n => {
                // The answer must not tell an unknown (or ambiguous) name from a wrong
                // password: bind anyway, as no entry, and fail the same way.
                if n == 0 {
                    log::debug!(
                        "ldap login {}: no entry under {:?} matches the user filter",
                        self.request_id,
                        self.cfg.userdn
                    );
                } else {
                    log::warn!(
                        "ldap login {}: the user search under {:?} matched {n} entries, not exactly one; make userfilter and userattr select a unique entry",
                        self.request_id,
                        self.cfg.userdn
                    );
                }
                self.unresolved = true;
                self.bind_dn = self.dummy_dn();
                self.user_bind()
            }
        }
    }

    /// The DN bound as when the user search resolved no single entry.
    fn dummy_dn(&self) -> String {
        if self.cfg.userdn.is_empty() {
            DUMMY_RDN.to_string()
        } else {
            format!("{DUMMY_RDN},{}", self.cfg.userdn)
        }
    }

    fn take_alias(&mut self, e: &LdapEntry) {
        let v = e.values(&self.cfg.userattr);
        if v.len() == 1 {
            self.alias_value = Some(v[0].to_string());
        }
    }

    fn user_bind(&mut self) -> Next {
        // On a service connection, check the password aside: the connection stays bound
        // as `binddn` for the group search and the next login, with no re-bind.
        self.bind_aside = self.service_bound && self.cfg.has_service_bind();
        let op = if self.bind_aside {
            LdapOp::CheckBind {
                spec: self.cfg.connect_spec(),
                dn: self.bind_dn.clone(),
                password: self.password.clone(),
            }
        } else {
            LdapOp::Bind {
                dn: self.bind_dn.clone(),
                password: self.password.clone(),
            }
        };
        self.call(Step::UserBind, op)
    }

    fn after_rebind(&mut self) -> Next {
        if !self.cfg.upndomain.is_empty() {
            let filter = format!(
                "(userPrincipalName={}@{})",
                escape::filter_value(&self.username),
                escape::filter_value(&self.cfg.upndomain)
            );
            let op = self.search(&self.cfg.userdn, filter, &self.cfg.userattr);
            return self.call(Step::UpnSearch, op);
        }
        self.user_dn = self.bind_dn.clone();
        self.groups()
    }

    fn groups(&mut self) -> Next {
        if self.cfg.use_token_groups {
            if self.user_dn.is_empty() || self.cfg.groupdn.is_empty() {
                return self.finish(Vec::new());
            }
            // tokenGroups is computed, and AD gives it to base searches only.
            let op = LdapOp::Search(SearchSpec {
                base: self.user_dn.clone(),
                scope: Scope::Base,
                filter: "(objectClass=*)".into(),
                attrs: vec!["tokenGroups".into()],
                deref: self.cfg.deref(),
                page_size: 0,
            });
            return self.call(Step::TokenGroups, op);
        }
        if self.cfg.groupfilter.is_empty() || self.cfg.groupdn.is_empty() {
            return self.finish(Vec::new());
        }
        if self.cfg.anonymous_group_search {
            let op = LdapOp::Bind {
                dn: String::new(),
                password: Secret::default(),
            };
            return self.call(Step::AnonBind, op);
        }
        self.group_search()
    }

    fn group_search(&mut self) -> Next {
        let filter = match self.group_filter() {
            Ok(f) => f,
            Err(e) => return self.done(Err(bad(format!("invalid groupfilter: {e}")))),
        };
        let op = self.search(&self.cfg.groupdn, filter, &self.cfg.groupattr);
        self.step = Step::GroupSearch;
        self.close_pending = true;
        Next::Call {
            op,
            close_after: true,
        }
    }

    /// The SIDs of the user entry's `tokenGroups` (in string form: the shell converts the
    /// binary values), then one search of `groupdn` for the groups with those SIDs.
    fn token_groups(&mut self, entries: &[LdapEntry]) -> Next {
        let mut sids: BTreeSet<String> = BTreeSet::new();
        for e in entries {
            for v in e.values("tokenGroups") {
                // A value the shell could not convert is skipped (never put in a filter).
                if super::ad::sid_from_string(v).is_some() {
                    sids.insert(v.to_string());
                }
            }
        }
        if sids.is_empty() {
            return self.finish(Vec::new());
        }
        let filter = if sids.len() == 1 {
            format!(
                "(objectSid={})",
                sids.first().map(String::as_str).unwrap_or("")
            )
        } else {
            let mut f = String::from("(|");
            for s in &sids {
                f.push_str(&format!("(objectSid={s})"));
            }
            f.push(')');
            f
        };
        let op = self.search(&self.cfg.groupdn, filter, &self.cfg.groupattr);
        self.step = Step::SidGroups;
        self.close_pending = true;
        Next::Call {
            op,
            close_after: true,
        }
    }

    /// Group names from the entries of the group search: each `groupattr` value, a DN
    /// value standing for its first `cn`. An entry without the attribute names itself by
    /// its DN's `cn` when `groupattr` is `cn` (group objects).
    pub fn group_names(&self, entries: &[LdapEntry]) -> Vec<String> {
        let mut set = BTreeSet::new();
        for e in entries {
            let vals = e.values(&self.cfg.groupattr);
            if vals.is_empty() {
                if self.cfg.groupattr.eq_ignore_ascii_case("cn") {
                    if let Some(cn) = dn::first_cn(&e.dn) {
                        set.insert(cn);
                    }
                }
                continue;
            }
            for v in vals {
                let name = dn::group_name(v);
                if !name.is_empty() {
                    set.insert(name);
                }
            }
        }
        set.into_iter().collect()
    }

    fn finish(&mut self, groups: Vec<String>) -> Next {
        let mut warnings = Vec::new();
        if groups.is_empty() {
            warnings.push(format!(
                "no LDAP groups found in groupDN {:?}; only policies from locally-defined groups available",
                self.cfg.groupdn
            ));
        }
        let alias = if self.cfg.username_as_alias {
            self.username.clone()
        } else {
            self.alias_value
                .clone()
                .unwrap_or_else(|| self.username.clone())
        };
        let user_dn = self.user_dn.clone();
        self.done(Ok(Found {
            groups,
            user_dn,
            alias,
            warnings,
        }))
    }
}

/// The error for a failed step: a lost connection or timeout says so; otherwise `msg`.
fn lost_or(f: &LdapFailure, msg: &str) -> ApiError {
    match f.kind {
        FailKind::Connect | FailKind::NoConnection => bad(format!(
            "ldap operation failed: lost the connection to the LDAP server: {}",
            f.message
        )),
        FailKind::Timeout => bad(format!(
            "ldap operation failed: the LDAP server did not answer in time (request_timeout): {}",
            f.message
        )),
        _ => bad(msg.to_string()),
    }
}

fn search_failed(what: &str, f: &LdapFailure) -> ApiError {
    match f.kind {
        FailKind::SizeLimit => bad(format!(
            "{what}: the server's size limit was exceeded; set max_page_size to page through the results"
        )),
        FailKind::Connect | FailKind::NoConnection | FailKind::Timeout => lost_or(f, what),
        _ => bad(format!("{what}: {}", f.message)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount() -> MountEntry {
        serde_json::from_value(serde_json::json!({
            "path": "ldap/", "type": "ldap", "description": "", "uuid": "u",
            "accessor": "a", "local": false,
        }))
        .unwrap()
    }

    /// Runs a login whose group search returns `groups` entries.
    fn login_with_groups(groups: usize) -> Result<Found, ApiError> {
        let cfg = LdapConfig {
            binddn: "cn=svc,dc=x".into(),
            bindpass: Secret::new("pw"),
            userdn: "ou=people,dc=x".into(),
            groupdn: "ou=groups,dc=x".into(),
            ..Default::default()
        };
        let (mut l, first) = Login::start(1, mount(), cfg, "bob", "pw", 1, "");
        l.run(first, |op, _| match op {
            LdapOp::ConnectBound { .. } => Ok(LdapDone::Connected { url: "u".into() }),
            LdapOp::Bind { .. } | LdapOp::CheckBind { .. } => Ok(LdapDone::Bound),
            LdapOp::Search(s) if s.base.starts_with("ou=people") => {
                Ok(LdapDone::Entries(vec![LdapEntry {
                    dn: "uid=bob,ou=people,dc=x".into(),
                    attrs: Default::default(),
                }]))
            }
            LdapOp::Search(_) => Ok(LdapDone::Entries(
                (0..groups)
                    .map(|i| LdapEntry {
                        dn: format!("cn=g{i},ou=groups,dc=x"),
                        attrs: Default::default(),
                    })
                    .collect(),
            )),
            other => panic!("unexpected {other:?}"),
        })
    }

    #[test]
    fn oversized_search_results_are_refused() {
        assert_eq!(
            login_with_groups(MAX_SEARCH_ENTRIES).unwrap().groups.len(),
            MAX_SEARCH_ENTRIES
        );
        let e = login_with_groups(MAX_SEARCH_ENTRIES + 1).unwrap_err();
        assert_eq!(e.status(), 400);
        assert_eq!(
            e.to_string(),
            "ldap operation failed: a search returned more than 10000 entries; narrow groupdn or groupfilter"
        );
    }
}
