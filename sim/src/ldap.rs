//! LDAP logins in the replication world: an in-memory directory (core's
//! [`FakeDirectory`], which runs each login machine the node emits to its end) whose users,
//! passwords and group memberships the operator changes as it goes, the group and user
//! mappings the operator writes on the primary, and a model of the user lockout of each
//! host.
//!
//! Invariant `login`: a login succeeds iff the directory, at login time, says the password
//! is right and the user is not locked out on that host; a token's policies are `default` ∪
//! the policies of the mapped groups the directory puts the user in ∪ the user mapping's
//! policies. On the primary the mappings are the last acknowledged ones (or a later write
//! whose answer was lost); a performance secondary may serve any earlier version (it lags).

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

fn user_dn(u: usize) -> String {
    format!("uid=u{u},ou=people,{BASE}")
}

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
    passwords: Vec<u64>,
    members: Vec<BTreeSet<usize>>,
    maps: BTreeMap<String, NameHist>,
    /// The mapping write in flight: (name, policies).
    pending: Option<(String, Vec<String>)>,
    locks: BTreeMap<(HostId, usize), Lock>,
    /// (host, user) pairs whose lockout state is unknown (a lost answer, an activation
    /// wipe, a failover): not checked until a successful login resets it.
    unsure: BTreeSet<(HostId, usize)>,
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
}

impl Ldap {
    pub fn new() -> Ldap {
        let mut l = Ldap {
            dir: FakeDirectory::new(),
            passwords: vec![0; USERS],
            members: vec![BTreeSet::new(); GROUPS],
            maps: BTreeMap::new(),
            pending: None,
            locks: BTreeMap::new(),
            unsure: BTreeSet::new(),
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

    fn password(&self, u: usize) -> String {
        format!("pw-u{u}-{}", self.passwords[u])
    }

    fn put_user(&mut self, u: usize) {
        let pw = self.password(u);
        let uid = format!("u{u}");
        self.dir.add(
            &user_dn(u),
            &[
                ("objectClass", &["inetOrgPerson"]),
                ("uid", &[uid.as_str()]),
                ("userPassword", &[pw.as_str()]),
            ],
        );
    }

    fn put_group(&mut self, g: usize) {
        let dns: Vec<String> = self.members[g].iter().map(|u| user_dn(*u)).collect();
        let dns: Vec<&str> = dns.iter().map(String::as_str).collect();
        let cn = format!("g{g}");
        let cn_ref = [cn.as_str()];
        let mut attrs: Vec<(&str, &[&str])> =
            vec![("objectClass", &["groupOfNames"]), ("cn", &cn_ref)];
        if !dns.is_empty() {
            attrs.push(("member", &dns));
        }
        self.dir.add(&format!("cn=g{g},ou=groups,{BASE}"), &attrs);
    }

    /// The config the operator writes on the primary.
    pub fn config() -> Value {
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

    /// A directory change: a new password, or a user joins or leaves a group.
    pub fn mutate(&mut self, r: &mut SimRng) -> String {
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
            groups: (0..GROUPS)
                .filter(|g| self.members[*g].contains(&user))
                .collect(),
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
                self.locks.remove(&key);
                self.unsure.remove(&key);
                return Ok("ok");
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
        if a.right_password && !locked && !unsure {
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
        Ok("refused")
    }
}

impl Default for Ldap {
    fn default() -> Self {
        Ldap::new()
    }
}
