//! User lockout, like the reference's: after `user_lockout_threshold` failed logins of one
//! user on one mount (each within `user_lockout_counter_reset` of the previous one), the
//! user is locked for `user_lockout_duration`: logins are refused with "permission denied"
//! without asking the directory. A successful login resets the count.
//! `user_lockout_disable` turns it off for the mount.
//!
//! As in the reference, the failure counts live in memory ([`Failures`], in the node
//! state): a failed attempt costs no storage write, and names an attacker invents cannot
//! grow storage. A user who reaches the threshold is written to storage under
//! `core/local-lockout/<mount accessor>/<alias>` (a cluster-local prefix: a performance
//! secondary keeps its own lockouts, a DR secondary receives them), so a lockout survives
//! a restart. Counts restart from zero after a restart, as in the reference.
//!
//! The alias is the login name as the directory compares it ([`alias`]): leading and
//! trailing whitespace dropped, inner runs of whitespace one space (the string preparation
//! of LDAP's `caseIgnoreMatch`), lower-cased unless the mount has `case_sensitive_names`
//! (LDAP matches names without regard to case), so `ALICE` or ` alice ` get no fresh
//! attempts. When the user search resolves the login to a directory entry, the failure
//! counts against the entry's name as well ([`super::login::Login::entry_alias`]: its
//! `userattr` value, else its DN), and a lock of that name refuses the login whatever name
//! reached it. Only credential failures count: a refused user bind and an unknown user. A
//! directory that cannot be reached, or a configuration error, does not.
//!
//! `GET sys/locked-users[?mount_accessor=]` lists the locked users by mount accessor;
//! `POST sys/locked-users/<mount_accessor>/unlock/<alias>` unlocks (idempotent).

use super::config::LdapConfig;
use super::load_config;
use crate::api::{ApiError, ApiResult, Method, Reply, Request};
use crate::ctx::Ctx;
use crate::mounts::{self, MountEntry, Table};
use crate::time::Millis;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Storage prefix of locked users (classified cluster-local by the replication layer).
pub const PREFIX: &str = "core/local-lockout/";
pub const DEFAULT_THRESHOLD: u64 = 5;
/// Seconds.
pub const DEFAULT_DURATION: u64 = 15 * 60;
/// Seconds.
pub const DEFAULT_COUNTER_RESET: u64 = 15 * 60;
/// Most (mount, alias) failure counts kept in memory; when full, stale ones are dropped
/// first, then new names are not counted until room frees up.
pub const MAX_TRACKED: usize = 100_000;

/// Failed logins of one alias.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Count {
    pub count: u64,
    pub last_failure: Millis,
}

/// In-memory failure counts by (mount accessor, alias).
#[derive(Clone, Debug, Default)]
pub struct Failures {
    map: BTreeMap<(String, String), Count>,
}

impl Failures {
    pub fn len(&self) -> usize {
        self.map.len()
    }
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    pub fn get(&self, accessor: &str, alias: &str) -> Option<Count> {
        self.map
            .get(&(accessor.to_string(), alias.to_string()))
            .copied()
    }
}

/// A locked user as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Locked {
    pub alias: String,
    /// When the last counted failure happened (the lock runs from here).
    pub locked_at: Millis,
    pub count: u64,
}

/// The lockout settings of a mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub threshold: u64,
    pub duration_ms: Millis,
    pub reset_ms: Millis,
    pub disabled: bool,
}

impl Settings {
    pub fn of(cfg: &LdapConfig) -> Settings {
        let or = |v: u64, d: u64| if v == 0 { d } else { v };
        Settings {
            threshold: or(cfg.user_lockout_threshold, DEFAULT_THRESHOLD),
            duration_ms: or(cfg.user_lockout_duration, DEFAULT_DURATION).saturating_mul(1000),
            reset_ms: or(cfg.user_lockout_counter_reset, DEFAULT_COUNTER_RESET)
                .saturating_mul(1000),
            disabled: cfg.user_lockout_disable,
        }
    }
}

/// The alias a login counts against: `username` as the directory compares names (RFC 4518
/// insignificant-space handling: no leading or trailing whitespace, inner runs of
/// whitespace one space), lower-cased unless the mount has `case_sensitive_names`.
pub fn alias(cfg: &LdapConfig, username: &str) -> String {
    let spaced = username.split_whitespace().collect::<Vec<_>>().join(" ");
    if cfg.case_sensitive_names {
        spaced
    } else {
        spaced.to_lowercase()
    }
}

/// Percent-encodes everything but `[A-Za-z0-9._-]`, so any alias is one key segment.
fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"._-".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub fn key(accessor: &str, alias: &str) -> String {
    format!("{PREFIX}{}/{}", enc(accessor), enc(alias))
}

/// What the lockout says about a login about to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Check {
    pub locked: bool,
    /// A lock is stored (expired or not): a successful login removes it.
    pub stored: bool,
}

/// Whether `alias` is locked on the mount now: counted failures in memory at or over the
/// threshold within the duration, or a stored lock within the duration.
pub fn check(
    ctx: &Ctx,
    failures: &Failures,
    cfg: &LdapConfig,
    accessor: &str,
    alias: &str,
) -> ApiResult<Check> {
    let s = Settings::of(cfg);
    if s.disabled {
        return Ok(Check::default());
    }
    let within = |t: Millis| ctx.now.saturating_sub(t) < s.duration_ms;
    let counted = failures
        .get(accessor, alias)
        .is_some_and(|c| c.count >= s.threshold && within(c.last_failure));
    let stored: Option<Locked> = ctx.get_json(&key(accessor, alias))?;
    Ok(Check {
        locked: counted || stored.as_ref().is_some_and(|l| within(l.locked_at)),
        stored: stored.is_some(),
    })
}

/// Whether `alias` is locked on the mount now.
pub fn is_locked(
    ctx: &Ctx,
    failures: &Failures,
    cfg: &LdapConfig,
    accessor: &str,
    alias: &str,
) -> ApiResult<bool> {
    Ok(check(ctx, failures, cfg, accessor, alias)?.locked)
}

/// Counts a failed login; returns true when it locks the user (the lock is then staged in
/// `ctx`, and the caller must let the write set commit although the login fails).
pub fn failed(
    ctx: &mut Ctx,
    failures: &mut Failures,
    cfg: &LdapConfig,
    accessor: &str,
    alias: &str,
) -> ApiResult<bool> {
    let s = Settings::of(cfg);
    if s.disabled {
        return Ok(false);
    }
    let now = ctx.now;
    let k = (accessor.to_string(), alias.to_string());
    if !failures.map.contains_key(&k) && failures.map.len() >= MAX_TRACKED {
        // Drop counts nobody can build on any more.
        failures
            .map
            .retain(|_, c| now.saturating_sub(c.last_failure) < s.reset_ms.max(s.duration_ms));
        if failures.map.len() >= MAX_TRACKED {
            log::warn!(
                "user lockout: {MAX_TRACKED} users with recent failed logins are tracked already; not counting a failure on mount {accessor}"
            );
            return Ok(false);
        }
    }
    let c = failures.map.entry(k).or_default();
    c.count = if c.count > 0 && now.saturating_sub(c.last_failure) < s.reset_ms {
        c.count + 1
    } else {
        1
    };
    c.last_failure = now;
    let count = c.count;
    if count >= s.threshold {
        log::warn!(
            "user lockout: {alias:?} on mount {accessor} is locked for {} s after {count} failed logins",
            s.duration_ms / 1000
        );
        ctx.put_json(
            &key(accessor, alias),
            &Locked {
                alias: alias.to_string(),
                locked_at: now,
                count,
            },
        )?;
        return Ok(true);
    }
    Ok(false)
}

/// A successful login: forgets the count, and the stale stored lock the login started
/// with (`stored`, from [`check`]).
pub fn succeeded(
    ctx: &mut Ctx,
    failures: &mut Failures,
    accessor: &str,
    alias: &str,
    stored: bool,
) {
    if !failures.map.is_empty() {
        failures
            .map
            .remove(&(accessor.to_string(), alias.to_string()));
    }
    if stored {
        ctx.delete(&key(accessor, alias));
    }
}

/// The error of a locked user: the reference answers "permission denied" (403) before
/// asking the auth method anything.
pub fn locked_error() -> ApiError {
    ApiError::PermissionDenied
}

/// The LDAP mounts of namespace `ns` and below (a caller sees no other namespace's locks).
fn ldap_mounts(ctx: &Ctx, ns: &str) -> ApiResult<Vec<MountEntry>> {
    Ok(mounts::all(ctx, Table::Auth)?
        .into_iter()
        .filter(|m| m.kind == "ldap" && m.namespace.starts_with(ns))
        .collect())
}

/// `sys/locked-users` (GET, optional `mount_accessor`) and
/// `sys/locked-users/<mount_accessor>/unlock/<alias>` (POST).
pub fn handle(ctx: &mut Ctx, failures: &mut Failures, req: &Request, tail: &str) -> ApiResult {
    if tail.is_empty() {
        if req.method != Method::Get {
            return Err(ApiError::MethodNotAllowed);
        }
        return list(
            ctx,
            failures,
            &crate::namespace::of(req),
            req.query("mount_accessor"),
        );
    }
    let (accessor, alias) = match tail.split_once("/unlock/") {
        Some((a, u)) if !a.is_empty() && !a.contains('/') => (a, u),
        _ => return Err(ApiError::NotFound(String::new())),
    };
    if !req.method.is_write() {
        return Err(ApiError::MethodNotAllowed);
    }
    if alias.is_empty() {
        return Err(ApiError::bad("missing alias_identifier"));
    }
    // Only a mount of the request's namespace (or below) can be unlocked from it.
    let Some(m) = ldap_mounts(ctx, &crate::namespace::of(req))?
        .into_iter()
        .find(|m| m.accessor == accessor)
    else {
        return Err(ApiError::bad(format!(
            "mount_accessor {accessor:?}: no LDAP auth mount has this accessor in this namespace"
        )));
    };
    // Unlock the alias as given and as the mount canonicalises it.
    let mut aliases = vec![alias.to_string()];
    let cfg = load_config(ctx, &m)?.unwrap_or_default();
    let canon = self::alias(&cfg, alias);
    if canon != alias {
        aliases.push(canon);
    }
    for a in &aliases {
        failures.map.remove(&(accessor.to_string(), a.clone()));
        let k = key(accessor, a);
        if ctx.get(&k)?.is_some() {
            ctx.delete(&k);
            log::info!("user lockout: {a:?} on mount {accessor} unlocked");
        }
    }
    Ok(Reply::Empty)
}

/// Locked users of every LDAP mount (or of one), grouped by mount accessor, the mounts
/// with most locked users first; expired locks and locks of removed mounts are left out.
fn list(ctx: &Ctx, failures: &Failures, ns: &str, only: Option<&str>) -> ApiResult {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for m in ldap_mounts(ctx, ns)? {
        if only.is_some_and(|a| a != m.accessor) {
            continue;
        }
        let cfg = load_config(ctx, &m)?.unwrap_or_default();
        let prefix = format!("{PREFIX}{}/", enc(&m.accessor));
        let mut aliases = Vec::new();
        for k in ctx.keys(&prefix)? {
            let Some(l) = ctx.get_json::<Locked>(&k)? else {
                continue;
            };
            if is_locked(ctx, failures, &cfg, &m.accessor, &l.alias)? {
                aliases.push(l.alias);
            }
        }
        if !aliases.is_empty() {
            groups.push((m.accessor.clone(), aliases));
        }
    }
    groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
    let total: usize = groups.iter().map(|g| g.1.len()).sum();
    let accessors: Vec<Value> = groups
        .into_iter()
        .map(|(a, u)| json!({ "mount_accessor": a, "counts": u.len(), "alias_identifiers": u }))
        .collect();
    let by_namespace = if accessors.is_empty() {
        json!([])
    } else {
        json!([{
            "namespace_id": "root",
            "namespace_path": "",
            "counts": total,
            "mount_accessors": accessors,
        }])
    };
    Ok(Reply::Data(
        json!({ "by_namespace": by_namespace, "total": total }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_encode_any_alias_as_one_segment() {
        assert_eq!(
            key("auth_ldap_1a", "o'brien, jr/x"),
            "core/local-lockout/auth_ldap_1a/o%27brien%2C%20jr%2Fx"
        );
        assert_eq!(
            crate::replication::class::classify(&key("a", "b"), &std::collections::BTreeSet::new()),
            crate::replication::class::Class::ClusterLocal
        );
    }

    #[test]
    fn settings_default_and_zero_means_default() {
        let mut c = LdapConfig::default();
        let s = Settings::of(&c);
        assert_eq!(
            (s.threshold, s.duration_ms, s.reset_ms, s.disabled),
            (5, 900_000, 900_000, false)
        );
        c.user_lockout_threshold = 2;
        c.user_lockout_duration = 60;
        assert_eq!(Settings::of(&c).threshold, 2);
        assert_eq!(Settings::of(&c).duration_ms, 60_000);
        c.case_sensitive_names = false;
        assert_eq!(alias(&c, "ALICE"), "alice");
        c.case_sensitive_names = true;
        assert_eq!(alias(&c, "ALICE"), "ALICE");
    }

    #[test]
    fn aliases_are_canonical_like_the_directory_compares_names() {
        let mut c = LdapConfig::default();
        for name in [
            "alice",
            " alice",
            "alice  ",
            "ALICE",
            "\talice\n",
            " Alice ",
        ] {
            assert_eq!(alias(&c, name), "alice", "{name:?}");
        }
        assert_eq!(alias(&c, "  Alice   \t Liddell "), "alice liddell");
        c.case_sensitive_names = true;
        assert_eq!(alias(&c, "  Alice   Liddell "), "Alice Liddell");
    }
}
