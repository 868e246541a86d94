//! LDAP logins in the replication world: an in-memory directory (core's
//! [`FakeDirectory`], which runs each login machine the node emits to its end) whose users,
//! passwords and group memberships the operator changes as it goes, the group and user
//! mappings the operator writes on the primary, and a model of the user lockout of each
//! host.
//!
//! The directory has one of two flavours, drawn per seed from a stream of its own
//! (`directory-flavour`, so no other stream of a seed moves): an OpenLDAP-style one
//! (`groupOfNames` groups, `uid` binds under `userdn`, the default group filter), or, for
//! about a third of the seeds, an Active Directory one ([`FakeDirectory`] in its AD mode):
//! users carry `userPrincipalName`, `sAMAccountName` and `objectSid`, groups carry
//! `objectSid`, and group `g0` is nested in group `g2`. The AD config binds as
//! `user@upndomain` (with `userattr` `userPrincipalName` or `sAMAccountName`) and finds
//! groups either with the in-chain matching rule (`member:1.2.840.113556.1.4.1941:=`) or
//! with `use_token_groups`; both are transitive, so a member of `g0` is in `g2` too. Or
//! (`discoverdn`) a service account (`binddn`) finds the user's entry by `sAMAccountName`
//! and the user binds as that DN. The AD directory's changes include accounts that become
//! unusable and usable again: disabled, must change password, account expired, password
//! expired; AD refuses their right password with its `data` code (533, 773, 701, 532).
//!
//! Invariant `login`: a login succeeds iff the directory, at login time, says the password
//! is right and the account usable (AD), and the user is not locked out on that host: an
//! unusable account never gets a token, and its refusal counts towards the lockout like a
//! wrong password; a token's policies are `default` ∪
//! the policies of the mapped groups the directory puts the user in (with AD, nested
//! membership included) ∪ the user mapping's policies. On the primary the mappings are the
//! last acknowledged ones (or a later write whose answer was lost); a performance secondary
//! may serve any earlier version (it lags). A success of a user who is in a group only
//! through the nested one is counted as `login:ok-nested`, the refusal of an unusable
//! account's right password as `login:refused-account`.

use crate::check::Violation;
use crate::net::HostId;
use crate::rng::SimRng;
use cairn_core::auth::ldap::fake::FakeDirectory;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

pub const URL: &str = "ldap://dir.sim:389";
const BASE: &str = "dc=sim,dc=test";
pub const USERS: usize = 4;
pub const GROUPS: usize = 3;
/// Lockout settings written with the config (seconds).
pub const THRESHOLD: u64 = 3;
pub const DURATION_S: u64 = 20;
pub const RESET_S: u64 = 60;

/// The AD flavour's domain (`upndomain`) and domain SID.
pub const AD_DOMAIN: &str = "sim.test";
const AD_SID: &str = "S-1-5-21-3623811015-3361044348-30300820";
/// The group nested in another with the AD flavour: `g<NESTED.0>` is a member of
/// `g<NESTED.1>`.
pub const NESTED: (usize, usize) = (0, 2);

/// The AD configurations the operator may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdConfig {
    /// `userattr`: `sAMAccountName` (else `userPrincipalName`).
    pub sam: bool,
    /// Groups from `tokenGroups` (else the in-chain group filter).
    pub token_groups: bool,
    /// `discoverdn` with a service account (`binddn`) finding the entry by
    /// `sAMAccountName` (else binds as `user@upndomain`).
    pub discover: bool,
}

/// The states that make AD refuse an account's right password: (its `data` code, what it
/// means).
pub const AD_STATES: &[(&str, &str)] = &[
    ("533", "disabled"),
    ("773", "must change password"),
    ("701", "account expired"),
    ("532", "password expired"),
];

/// What one mapping (`g<i>` or `u<i>`) may hold.
#[derive(Debug, Clone, Default)]
struct NameHist {
    /// The last acknowledged value (`None`: never written).
    acked: Option<Vec<String>>,
    /// Values written since then whose answer was lost.
    lost: Vec<Vec<String>>,
    /// Every value that may have been applied, ever.
    ever: BTreeSet<Vec<String>>,
}

/// Lockout state of one user on one host, as the model knows it.
#[derive(Debug, Clone, Copy, Default)]
struct Lock {
    count: u64,
    last_failure: u64,
    locked_at: Option<u64>,
}

pub struct Ldap {
    pub dir: FakeDirectory,
    /// The AD flavour's config (`None`: OpenLDAP-style).
    pub ad: Option<AdConfig>,
    passwords: Vec<u64>,
    /// Per user: the AD state refusing its binds (an index into [`AD_STATES`]), if any.
    states: Vec<Option<usize>>,
    members: Vec<BTreeSet<usize>>,
    maps: BTreeMap<String, NameHist>,
    /// The mapping write in flight: (name, policies).
    pending: Option<(String, Vec<String>)>,
    locks: BTreeMap<(HostId, usize), Lock>,
    /// (host, user) pairs whose lockout state is unknown (a lost answer, an activation
    /// wipe, a failover): not checked until a successful login resets it.
    unsure: BTreeSet<(HostId, usize)>,
    /// Per user: the identity entity its first successful login on the original primary
    /// got. Every later login there must get the same one (the entity and its alias are
    /// written with the first login's token, so they are as durable as its answer).
    entities: BTreeMap<usize, String>,
}

/// What the operator expects of one login.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub host: HostId,
    pub user: usize,
    pub right_password: bool,
    /// Simulated time the node handled the request (lockout check).
    pub t0: u64,
    /// Member groups per the directory at login time.
    pub groups: BTreeSet<usize>,
    /// The user is in a group only through a nested one (AD flavour).
    pub nested: bool,
    /// The account's AD state at login time (an index into [`AD_STATES`]): its bind is
    /// refused whatever the password.
    pub barred: Option<usize>,
}

impl Ldap {
    /// The directory of the run with master seed `seed`: AD-flavoured for about a third
    /// of the seeds (drawn from the `directory-flavour` stream).
    pub fn for_seed(seed: u64) -> Ldap {
        let mut r = SimRng::derive(seed, "directory-flavour");
        if r.chance(333) {
            let sam = r.chance(500);
            let token_groups = r.chance(500);
            let discover = r.chance(333);
            Ldap::build(Some(AdConfig {
                sam: sam || discover,
                token_groups,
                discover,
            }))
        } else {
            Ldap::new()
        }
    }

    /// An OpenLDAP-style directory.
    pub fn new() -> Ldap {
        Ldap::build(None)
    }

    /// An AD-flavoured directory whose config is `ad`.
    pub fn active_directory(ad: AdConfig) -> Ldap {
        Ldap::build(Some(ad))
    }

    fn build(ad: Option<AdConfig>) -> Ldap {
        let mut dir = FakeDirectory::new();
        dir.active_directory = ad.is_some();
        let mut l = Ldap {
            dir,
            ad,
            passwords: vec![0; USERS],
            states: vec![None; USERS],
            members: vec![BTreeSet::new(); GROUPS],
            maps: BTreeMap::new(),
            pending: None,
            locks: BTreeMap::new(),
            unsure: BTreeSet::new(),
            entities: BTreeMap::new(),
        };
        l.dir
            .add(BASE, &[("objectClass", &["dcObject", "organization"])]);
        l.dir.add(
            &format!("cn=admin,{BASE}"),
            &[("objectClass", &["person"]), ("userPassword", &["adminpw"])],
        );
        for ou in ["people", "groups"] {
            l.dir.add(
                &format!("ou={ou},{BASE}"),
                &[("objectClass", &["organizationalUnit"])],
            );
        }
        for u in 0..USERS {
            l.put_user(u);
        }
        for g in 0..GROUPS {
            l.members[g] = (0..USERS).filter(|u| (u + g) % 2 == 0).collect();
            l.put_group(g);
        }
        l
    }

    fn user_dn(&self, u: usize) -> String {
        if self.ad.is_some() {
            format!("cn=u{u},ou=people,{BASE}")
        } else {
            format!("uid=u{u},ou=people,{BASE}")
        }
    }

    fn group_dn(g: usize) -> String {
        format!("cn=g{g},ou=groups,{BASE}")
    }

    /// The groups user `u` is in per the directory: direct membership, and with AD the
    /// groups that hold (transitively) a group `u` is in.
    pub fn groups_of(&self, u: usize) -> BTreeSet<usize> {
        let mut out: BTreeSet<usize> = (0..GROUPS)
            .filter(|g| self.members[*g].contains(&u))
            .collect();
        if self.ad.is_some() && out.contains(&NESTED.0) {
            out.insert(NESTED.1);
        }
        out
    }

    fn password(&self, u: usize) -> String {
        format!("pw-u{u}-{}", self.passwords[u])
    }

    fn put_user(&mut self, u: usize) {
        let pw = self.password(u);
        let uid = format!("u{u}");
        if self.ad.is_some() {
            let upn = format!("u{u}@{AD_DOMAIN}");
            let sid = format!("{AD_SID}-{}", 1100 + u);
            let state = self.states[u].map(|i| AD_STATES[i].0);
            let (uid, upn, sid, pw) = (
                [uid.as_str()],
                [upn.as_str()],
                [sid.as_str()],
                [pw.as_str()],
            );
            let mut attrs: Vec<(&str, &[&str])> = vec![
                ("objectClass", &["user"]),
                ("cn", &uid),
                ("sAMAccountName", &uid),
                ("userPrincipalName", &upn),
                ("objectSid", &sid),
                ("userPassword", &pw),
            ];
            let state_ref;
            if let Some(code) = state {
                state_ref = [code];
                // The fake directory refuses the right password with this AD code.
                attrs.push(("cairnAdState", &state_ref));
            }
            self.dir.add(&self.user_dn(u), &attrs);
            return;
        }
        self.dir.add(
            &self.user_dn(u),
            &[
                ("objectClass", &["inetOrgPerson"]),
                ("uid", &[uid.as_str()]),
                ("userPassword", &[pw.as_str()]),
            ],
        );
    }

    fn put_group(&mut self, g: usize) {
        let mut dns: Vec<String> = self.members[g].iter().map(|u| self.user_dn(*u)).collect();
        if self.ad.is_some() && g == NESTED.1 {
            dns.push(Ldap::group_dn(NESTED.0));
        }
        let dns: Vec<&str> = dns.iter().map(String::as_str).collect();
        let cn = format!("g{g}");
        let cn_ref = [cn.as_str()];
        let sid = format!("{AD_SID}-{}", 1200 + g);
        let sid_ref = [sid.as_str()];
        let mut attrs: Vec<(&str, &[&str])> = if self.ad.is_some() {
            vec![
                ("objectClass", &["group"]),
                ("cn", &cn_ref),
                ("objectSid", &sid_ref),
            ]
        } else {
            vec![("objectClass", &["groupOfNames"]), ("cn", &cn_ref)]
        };
        if !dns.is_empty() {
            attrs.push(("member", &dns));
        }
        self.dir.add(&Ldap::group_dn(g), &attrs);
    }

    /// The config the operator writes on the primary.
    pub fn config(&self) -> Value {
        if let Some(ad) = self.ad {
            let mut c = json!({
                "url": URL,
                "userdn": format!("ou=people,{BASE}"),
                "userattr": if ad.sam { "sAMAccountName" } else { "userPrincipalName" },
                "groupdn": format!("ou=groups,{BASE}"),
                "user_lockout_threshold": THRESHOLD,
                "user_lockout_duration": format!("{DURATION_S}s"),
                "user_lockout_counter_reset": format!("{RESET_S}s"),
            });
            if ad.discover {
                c["discoverdn"] = json!(true);
                c["binddn"] = json!(format!("cn=admin,{BASE}"));
                c["bindpass"] = json!("adminpw");
            } else {
                c["upndomain"] = json!(AD_DOMAIN);
            }
            if ad.token_groups {
                c["use_token_groups"] = json!(true);
            } else {
                c["groupfilter"] =
                    json!("(&(objectClass=group)(member:1.2.840.113556.1.4.1941:={{.UserDN}}))");
            }
            return c;
        }
        json!({
            "url": URL,
            "binddn": format!("cn=admin,{BASE}"),
            "bindpass": "adminpw",
            "userdn": format!("ou=people,{BASE}"),
            "userattr": "uid",
            "groupdn": format!("ou=groups,{BASE}"),
            "user_lockout_threshold": THRESHOLD,
            "user_lockout_duration": format!("{DURATION_S}s"),
            "user_lockout_counter_reset": format!("{RESET_S}s"),
        })
    }

    /// A directory change: a new password, a user joins or leaves a group, or (AD) an
    /// account becomes unusable (disabled, must change password, expired) or usable again.
    pub fn mutate(&mut self, r: &mut SimRng) -> String {
        // Drawn only with AD, so the OpenLDAP flavour's seeds keep their traces.
        if self.ad.is_some() && r.chance(250) {
            let u = r.below(USERS as u64) as usize;
            let what = match self.states[u] {
                Some(i) => {
                    self.states[u] = None;
                    format!("directory: u{u} is usable again (was {})", AD_STATES[i].1)
                }
                None => {
                    let i = r.below(AD_STATES.len() as u64) as usize;
                    self.states[u] = Some(i);
                    format!(
                        "directory: u{u} is now {} (AD data {})",
                        AD_STATES[i].1, AD_STATES[i].0
                    )
                }
            };
            self.put_user(u);
            return what;
        }
        if r.chance(400) {
            let u = r.below(USERS as u64) as usize;
            self.passwords[u] += 1;
            self.put_user(u);
            format!("directory: u{u} has a new password")
        } else {
            let g = r.below(GROUPS as u64) as usize;
            let u = r.below(USERS as u64) as usize;
            let joined = self.members[g].insert(u);
            if !joined {
                self.members[g].remove(&u);
            }
            self.put_group(g);
            format!(
                "directory: u{u} {} g{g}",
                if joined { "joins" } else { "leaves" }
            )
        }
    }

    /// A mapping write: (path, body).
    pub fn mapping_write(&mut self, r: &mut SimRng) -> (String, Value) {
        let pol = format!("lp{}", r.below(6));
        let (path, name) = if r.chance(600) {
            let g = format!("g{}", r.below(GROUPS as u64));
            (format!("auth/ldap/groups/{g}"), g)
        } else {
            let u = format!("u{}", r.below(USERS as u64));
            (format!("auth/ldap/users/{u}"), u)
        };
        let pols = if r.chance(150) {
            Vec::new()
        } else {
            vec![pol, format!("lq{}", r.below(3))]
        };
        let mut sorted = pols.clone();
        sorted.sort();
        sorted.dedup();
        self.pending = Some((name, sorted));
        (path, json!({ "policies": pols.join(",") }))
    }

    /// The answer to the mapping write just sent: acknowledged, lost (`None`), or refused.
    pub fn mapping_answer(&mut self, ok: Option<bool>) {
        let Some((name, v)) = self.pending.take() else {
            return;
        };
        let h = self.maps.entry(name).or_default();
        match ok {
            Some(true) => {
                h.acked = Some(v.clone());
                h.lost.clear();
                h.ever.insert(v);
            }
            None => {
                h.lost.push(v.clone());
                h.ever.insert(v);
            }
            Some(false) => {}
        }
    }

    /// The values mapping `name` may hold (`None`: absent) on the primary or a lagging
    /// secondary.
    fn candidates(&self, name: &str, primary: bool) -> Vec<Option<Vec<String>>> {
        let Some(h) = self.maps.get(name) else {
            return vec![None];
        };
        let mut out: Vec<Option<Vec<String>>> = Vec::new();
        if primary {
            out.push(h.acked.clone());
            out.extend(h.lost.iter().cloned().map(Some));
        } else {
            out.push(None);
            out.extend(h.ever.iter().cloned().map(Some));
        }
        out.sort();
        out.dedup();
        out
    }

    /// A login about to be sent.
    pub fn attempt(&self, r: &mut SimRng, host: HostId) -> (Attempt, String, Value) {
        let user = r.below(USERS as u64) as usize;
        let right = r.chance(750);
        let pw = if right {
            self.password(user)
        } else {
            format!("wrong-{}", r.below(1000))
        };
        let a = Attempt {
            host,
            user,
            right_password: right,
            t0: 0,
            groups: self.groups_of(user),
            nested: self.groups_of(user).len()
                > self.members.iter().filter(|m| m.contains(&user)).count(),
            barred: self.states[user],
        };
        (
            a,
            format!("auth/ldap/login/u{user}"),
            json!({ "password": pw }),
        )
    }

    fn locked(&self, host: HostId, user: usize, now: u64) -> bool {
        let Some(l) = self.locks.get(&(host, user)) else {
            return false;
        };
        let within = |t: u64| now.saturating_sub(t) < DURATION_S * 1000;
        (l.count >= THRESHOLD && within(l.last_failure)) || l.locked_at.is_some_and(within)
    }

    /// A host restarted: in-memory failure counts are gone, stored locks stay.
    pub fn on_boot(&mut self, host: HostId) {
        for ((h, _), l) in self.locks.iter_mut() {
            if *h == host {
                l.count = 0;
            }
        }
    }

    /// The host's cluster-local state was replaced (activation wipe, failover).
    pub fn forget(&mut self, host: HostId) {
        for u in 0..USERS {
            self.unsure.insert((host, u));
            self.locks.remove(&(host, u));
        }
    }

    /// Checks a login's answer and updates the lockout model. `t1`: when the node
    /// finished the login (handled the directory's answer); `primary`: the host is the
    /// primary (latest mappings); `ready`: the host holds the LDAP mount and config.
    #[allow(clippy::too_many_arguments)]
    /// Checks that a successful login on the original primary got the entity the user's
    /// first one did.
    fn same_entity(&mut self, a: &Attempt, body: &Value) -> Result<(), Violation> {
        let got = body["auth"]["entity_id"].as_str().unwrap_or_default();
        if got.is_empty() {
            return Err(Violation {
                invariant: "login",
                detail: format!("u{} logged in on n{} without an entity_id", a.user, a.host),
            });
        }
        match self.entities.get(&a.user) {
            Some(first) if first != got => Err(Violation {
                invariant: "login",
                detail: format!(
                    "u{} logged in on n{} as entity {got}; its first login there was entity {first}",
                    a.user, a.host
                ),
            }),
            Some(_) => Ok(()),
            None => {
                self.entities.insert(a.user, got.to_string());
                Ok(())
            }
        }
    }

    pub fn observe(
        &mut self,
        a: &Attempt,
        t1: Option<u64>,
        status: Option<u16>,
        body: &Value,
        primary: bool,
        ready: bool,
    ) -> Result<&'static str, Violation> {
        let key = (a.host, a.user);
        let unsure = self.unsure.contains(&key);
        let locked = self.locked(a.host, a.user, a.t0);
        let Some(status) = status else {
            // Lost answer: the outcome (and so the lockout state) is unknown.
            self.unsure.insert(key);
            return Ok("lost");
        };
        let fail = |detail: String| {
            Err(Violation {
                invariant: "login",
                detail,
            })
        };
        if status == 200 {
            if !a.right_password {
                return fail(format!(
                    "u{} logged in on n{} with a password the directory does not hold",
                    a.user, a.host
                ));
            }
            if let Some(i) = a.barred {
                return fail(format!(
                    "u{} logged in on n{} although the directory refuses its bind ({}, AD data {})",
                    a.user, a.host, AD_STATES[i].1, AD_STATES[i].0
                ));
            }
            if locked && !unsure {
                return fail(format!(
                    "u{} logged in on n{} while locked out (the model counted {:?})",
                    a.user,
                    a.host,
                    self.locks.get(&key)
                ));
            }
            let got: BTreeSet<String> = crate::check::str_list(&body["auth"]["policies"])
                .into_iter()
                .collect();
            let mut names: Vec<String> = a.groups.iter().map(|g| format!("g{g}")).collect();
            names.push(format!("u{}", a.user));
            // Every combination of what each relevant mapping may hold.
            let mut sets: Vec<BTreeSet<String>> = vec![["default".to_string()].into()];
            for n in &names {
                let mut next = Vec::new();
                for base in &sets {
                    for c in self.candidates(n, primary) {
                        let mut s = base.clone();
                        s.extend(c.unwrap_or_default());
                        next.push(s);
                    }
                }
                next.sort();
                next.dedup();
                sets = next;
            }
            if sets.contains(&got) {
                if primary {
                    self.same_entity(a, body)?;
                }
                self.locks.remove(&key);
                self.unsure.remove(&key);
                return Ok(if a.nested { "ok-nested" } else { "ok" });
            }
            return fail(format!(
                "u{} on n{} got policies {got:?}; the directory (groups {:?}) and the mappings allow only {:?}",
                a.user, a.host, a.groups, sets
            ));
        }
        if !(400..500).contains(&status) || status == 429 {
            // Sealed, standby, overloaded: no decision was made.
            self.unsure.insert(key);
            return Ok("no-decision");
        }
        if !ready {
            self.unsure.insert(key);
            return Ok("not-ready");
        }
        if a.right_password && a.barred.is_none() && !locked && !unsure {
            return fail(format!(
                "u{} with the right password and no lockout was refused on n{} ({status}: {})",
                a.user, a.host, body
            ));
        }
        if locked || unsure {
            // A locked user's attempt neither counts nor reaches the directory; an
            // unsure state stays unsure.
            return Ok("refused-locked");
        }
        // A bad credential: counts towards the lockout.
        let t1 = t1.unwrap_or(a.t0);
        let l = self.locks.entry(key).or_default();
        l.count = if l.count > 0 && t1.saturating_sub(l.last_failure) < RESET_S * 1000 {
            l.count + 1
        } else {
            1
        };
        l.last_failure = t1;
        if l.count >= THRESHOLD {
            l.locked_at = Some(t1);
        }
        Ok(if a.right_password && a.barred.is_some() {
            "refused-account"
        } else {
            "refused"
        })
    }
}

impl Default for Ldap {
    fn default() -> Self {
        Ldap::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::api::{body_object, Fields};
    use cairn_core::auth::ldap::config::LdapConfig;
    use cairn_core::auth::ldap::login::{Job, Login};
    use cairn_core::auth::ldap::LdapCall;
    use cairn_core::mounts::MountEntry;

    /// Runs one login of `u<user>` with `pw` against the model's directory and config: the
    /// groups the machine found.
    fn login(l: &mut Ldap, user: usize, pw: &str) -> Result<BTreeSet<String>, String> {
        let body = body_object(&serde_json::to_vec(&l.config()).unwrap()).unwrap();
        let mut c = LdapConfig::default();
        c.apply(&Fields(&body)).unwrap();
        c.validate().unwrap();
        let mount: MountEntry = serde_json::from_value(json!({
            "path": "ldap/", "type": "ldap", "description": "", "uuid": "u",
            "accessor": "a", "local": false,
        }))
        .unwrap();
        let (login, first) = Login::start(1, mount, c, &format!("u{user}"), pw, 7, "");
        let mut job = Job {
            login,
            first,
            outcome: None,
        };
        job.run(|op, close_after| {
            l.dir
                .answer(&LdapCall {
                    op_id: 1,
                    conn: 7,
                    op: op.clone(),
                    close_after,
                })
                .result
        });
        match job.outcome.take().unwrap() {
            Ok(f) => Ok(f.groups.into_iter().collect()),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn a_login_with_another_entity_than_the_first_breaks_the_invariant() {
        let mut l = Ldap::for_seed(3);
        let a = Attempt {
            host: 0,
            user: 1,
            right_password: true,
            t0: 0,
            groups: BTreeSet::new(),
            nested: false,
            barred: None,
        };
        let body = |e: &str| json!({"auth": {"entity_id": e}});
        assert!(l.same_entity(&a, &body("e-1")).is_ok());
        assert!(l.same_entity(&a, &body("e-1")).is_ok());
        let v = l.same_entity(&a, &body("e-2")).unwrap_err();
        assert_eq!(v.invariant, "login");
        assert!(l.same_entity(&a, &body("")).is_err());
        // Another user has its own.
        let b = Attempt { user: 2, ..a };
        assert!(l.same_entity(&b, &body("e-2")).is_ok());
    }

    #[test]
    fn ad_logins_find_the_nested_group_and_the_model_expects_it() {
        for (sam, discover) in [(false, false), (true, false), (true, true)] {
            for token_groups in [false, true] {
                let ad = AdConfig {
                    sam,
                    token_groups,
                    discover,
                };
                let mut l = Ldap::active_directory(ad);
                // u0 is in g0 only directly; g0 is nested in g2.
                l.members[NESTED.1].remove(&0);
                l.put_group(NESTED.1);
                assert!(l.members[NESTED.0].contains(&0));
                let want: BTreeSet<usize> = [NESTED.0, NESTED.1].into();
                assert_eq!(l.groups_of(0), want);
                let pw = l.password(0);
                let got = login(&mut l, 0, &pw).unwrap();
                let names: BTreeSet<String> = want.iter().map(|g| format!("g{g}")).collect();
                assert_eq!(got, names, "{ad:?}");
                assert!(login(&mut l, 0, "wrong").is_err(), "{ad:?}");

                // The model: a token with g2's policies is right, one without is not.
                let (mut a, _, _) = l.attempt(&mut SimRng::derive(0, "t"), 0);
                a.user = 0;
                a.right_password = true;
                a.groups = l.groups_of(0);
                a.nested = true;
                let nested = format!("g{}", NESTED.1);
                l.maps.insert(
                    nested,
                    NameHist {
                        acked: Some(vec!["nestp".into()]),
                        lost: Vec::new(),
                        ever: [vec!["nestp".to_string()]].into(),
                    },
                );
                let ok = json!({"auth": {"policies": ["default", "nestp"], "entity_id": "e-u0"}});
                assert_eq!(
                    l.observe(&a, None, Some(200), &ok, true, true),
                    Ok("ok-nested")
                );
                let short = json!({"auth": {"policies": ["default"], "entity_id": "e-u0"}});
                assert!(l.observe(&a, None, Some(200), &short, true, true).is_err());
            }
        }
    }

    #[test]
    fn unusable_ad_accounts_never_log_in_and_the_model_says_so() {
        for (sam, discover) in [(false, false), (true, false), (true, true)] {
            for token_groups in [false, true] {
                let ad = AdConfig {
                    sam,
                    token_groups,
                    discover,
                };
                let mut l = Ldap::active_directory(ad);
                let pw = l.password(1);
                assert!(login(&mut l, 1, &pw).is_ok(), "{ad:?}");
                for (i, (code, what)) in AD_STATES.iter().enumerate() {
                    l.states[1] = Some(i);
                    l.put_user(1);
                    let e = login(&mut l, 1, &pw).unwrap_err();
                    assert!(e.contains("failed to bind as user"), "{ad:?} {what}: {e}");
                    // The model: a refusal is right (and counts towards the lockout), a
                    // token is a violation.
                    let (mut a, _, _) = l.attempt(&mut SimRng::derive(0, "t"), 0);
                    a.user = 1;
                    a.right_password = true;
                    a.barred = l.states[1];
                    let refused =
                        json!({"errors": ["ldap operation failed: failed to bind as user"]});
                    assert_eq!(
                        l.observe(&a, Some(5), Some(400), &refused, true, true),
                        Ok("refused-account"),
                        "{code}"
                    );
                    let token = json!({"auth": {"policies": ["default"]}});
                    let v = l
                        .observe(&a, Some(6), Some(200), &token, true, true)
                        .unwrap_err();
                    assert!(v.detail.contains(code), "{}", v.detail);
                    l.locks.clear();
                }
                // Usable again: the right password works.
                l.states[1] = None;
                l.put_user(1);
                assert!(login(&mut l, 1, &pw).is_ok(), "{ad:?}");
            }
        }
    }

    #[test]
    fn an_ad_directory_change_may_bar_an_account_and_lift_it() {
        let mut l = Ldap::active_directory(AdConfig {
            sam: true,
            token_groups: false,
            discover: true,
        });
        let mut r = SimRng::derive(7, "m");
        let mut barred = 0;
        let mut lifted = 0;
        for _ in 0..400 {
            let what = l.mutate(&mut r);
            barred += usize::from(what.contains("is now"));
            lifted += usize::from(what.contains("usable again"));
        }
        assert!(barred > 0 && lifted > 0, "{barred} {lifted}");
        // The OpenLDAP flavour never bars an account.
        let mut o = Ldap::new();
        for _ in 0..400 {
            assert!(!o.mutate(&mut r).contains("is now"));
        }
        assert!(o.states.iter().all(Option::is_none));
    }

    #[test]
    fn the_flavour_comes_from_its_own_stream() {
        let ad = (1..=300)
            .filter(|s| Ldap::for_seed(*s).ad.is_some())
            .count();
        assert!((60..=140).contains(&ad), "{ad} AD seeds of 300");
        // The OpenLDAP flavour keeps its config.
        let l = Ldap::new();
        assert_eq!(l.config()["userattr"], "uid");
        assert!(l.config().get("upndomain").is_none());
    }
}
