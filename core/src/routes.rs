//! The route table: every path the API serves, declared once with who may call it.
//!
//! A [`Route`] names a path pattern, the handler that serves it, its authentication
//! [`Class`] (no token, a login, a credential in the body, a token, a token with sudo),
//! its namespace [`Scope`] (any namespace, or the root namespace only) and its [`Audit`]
//! behaviour. The router ([`crate::node`]) canonicalises a path once ([`canonical`]),
//! looks it up here ([`lookup`]) and decides everything from the entry it finds: nothing
//! else in the code decides whether a request needs a token, sudo or the root namespace.
//!
//! Patterns are `/`-separated segments: a literal, `+` (exactly one segment) or a final
//! `*` (zero or more segments). The first matching entry of a table wins. Four tables:
//! [`SYS`] (`sys/...`), [`TOKEN`] (`auth/token/...`, relative to `auth/token/`),
//! [`IDENTITY`] (`identity/...`, relative to `identity/`), and the
//! tables each auth method and secrets engine declares for paths relative to its mount
//! ([`crate::auth::ldap::ROUTES`], [`KV`]). A path under `auth/` that is not a declared
//! login route of the mount's method is never a login.

use crate::api::{ApiError, ApiResult, Method};
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// No token and no credential: answers that reveal nothing secret (health, seal status).
    Public,
    /// The login route of an auth method: no token; a successful call creates one.
    Login,
    /// No client token; the handler checks a credential the request carries.
    Proof(Proof),
    /// A client token whose policies grant the capability the method needs on the path.
    Token,
    /// As [`Class::Token`], plus `sudo` on the path.
    Sudo,
    /// As [`Class::Sudo`]; on a DR secondary (which has no tokens of its own) the DR
    /// operation token in the body takes the client token's place.
    DrSecondary,
}

/// The credential a [`Class::Proof`] route checks itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    /// Unseal key shares (init, unseal, generate-root, DR operation token generation).
    KeyShares,
    /// A response-wrapping token (unwrap, lookup of the wrapping).
    WrappingToken,
    /// A DR operation token (revoking it).
    DrOperationToken,
}

/// Where a route may be called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// In any namespace, on that namespace's objects.
    Namespace,
    /// Only in the root namespace: operations on the whole cluster (seal, audit devices,
    /// replication, key shares, metrics).
    Root,
}

/// How a route's requests are recorded by audit devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audit {
    /// Every enabled device must record it, or the request is refused (fail closed).
    Required,
    /// Recorded where possible; a failing device does not refuse it (the routes that
    /// remove or repair a failing device).
    BestEffort,
    /// Not recorded (health and seal status, which must answer whatever the devices do).
    Skip,
}

/// The handlers of node-level and `sys/` routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sys {
    Init,
    Unseal,
    SealStatus,
    Health,
    Leader,
    /// `sys/step-down`: the active node of an HA cluster gives up its lease.
    StepDown,
    /// `sys/ha-status`: the nodes of the HA cluster.
    HaStatus,
    Seal,
    Mounts,
    Auth,
    Namespaces,
    Policies,
    Policy,
    Capabilities,
    ReplicationStatus,
    Replication,
    DrToken,
    GenerateRoot,
    Audit,
    AuditHash,
    Metrics,
    LockedUsers,
    License,
    Wrapping,
    Leases,
    UiMounts,
    /// `sys/key-status`: the barrier key's term, install time and encryption count.
    KeyStatus,
    /// `sys/remount` (move a mount) and `sys/remount/status/<id>`.
    Remount,
    /// `sys/storage/raft/snapshot`: take (GET) or restore (POST) a snapshot of storage.
    Snapshot,
}

/// The handlers of a secrets engine or auth method mount, and `auth/token/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `auth/token/<op>`.
    Token,
    /// The LDAP method's `config`.
    LdapConfig,
    /// `groups` (list) and `groups/<name>`.
    LdapGroups,
    /// `users` (list) and `users/<name>`.
    LdapUsers,
    /// `login/<username>`.
    LdapLogin,
    /// Any path of a KV (version 1) mount.
    Kv,
    /// Any path of a KV version 2 mount (`config`, `data/`, `metadata/`, ...).
    Kv2,
    /// `identity/<op>`: the identity store.
    Identity,
}

/// One declared route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route<H> {
    pub pattern: &'static str,
    pub class: Class,
    pub scope: Scope,
    pub audit: Audit,
    pub handler: H,
    /// Writes need `create` when the target does not exist yet and `update` when it does
    /// (the handler can tell); without it a write needs `update`.
    pub existence: bool,
}

const fn r<H>(
    pattern: &'static str,
    class: Class,
    scope: Scope,
    audit: Audit,
    handler: H,
) -> Route<H> {
    Route {
        pattern,
        class,
        scope,
        audit,
        handler,
        existence: false,
    }
}

use Audit::{BestEffort, Required, Skip};
use Class::{DrSecondary, Login, Public, Sudo, Token};
use Scope::{Namespace as Ns, Root};

/// `sys/...` and the node-level endpoints, in match order.
pub static SYS: &[Route<Sys>] = &[
    r(
        "sys/init",
        Class::Proof(Proof::KeyShares),
        Root,
        Skip,
        Sys::Init,
    ),
    r(
        "sys/unseal",
        Class::Proof(Proof::KeyShares),
        Root,
        Skip,
        Sys::Unseal,
    ),
    r("sys/seal-status", Public, Ns, Skip, Sys::SealStatus),
    r("sys/health", Public, Ns, Skip, Sys::Health),
    r("sys/leader", Public, Ns, Skip, Sys::Leader),
    r("sys/seal", Sudo, Root, Required, Sys::Seal),
    r("sys/step-down", Sudo, Root, Required, Sys::StepDown),
    r("sys/ha-status", Token, Root, Required, Sys::HaStatus),
    r("sys/mounts", Token, Ns, Required, Sys::Mounts),
    // An auth method's tune through the secrets table's path (`bao auth tune` asks there):
    // sudo, as under `sys/auth/`.
    r("sys/mounts/auth/*", Sudo, Ns, Required, Sys::Mounts),
    r("sys/mounts/*", Token, Ns, Required, Sys::Mounts),
    r("sys/auth", Token, Ns, Required, Sys::Auth),
    r("sys/auth/*", Sudo, Ns, Required, Sys::Auth),
    r("sys/namespaces", Token, Ns, Required, Sys::Namespaces),
    r("sys/namespaces/*", Token, Ns, Required, Sys::Namespaces),
    r("sys/policies/acl", Token, Ns, Required, Sys::Policies),
    r("sys/policies/acl/+", Token, Ns, Required, Sys::Policies),
    r("sys/policy", Token, Ns, Required, Sys::Policy),
    r("sys/policy/+", Token, Ns, Required, Sys::Policy),
    r(
        "sys/capabilities-self",
        Token,
        Ns,
        Required,
        Sys::Capabilities,
    ),
    r("sys/capabilities", Token, Ns, Required, Sys::Capabilities),
    r(
        "sys/capabilities-accessor",
        Token,
        Ns,
        Required,
        Sys::Capabilities,
    ),
    r(
        "sys/replication/status",
        Public,
        Ns,
        Skip,
        Sys::ReplicationStatus,
    ),
    r(
        "sys/replication/+/status",
        Public,
        Ns,
        Skip,
        Sys::ReplicationStatus,
    ),
    r(
        "sys/replication/dr/secondary/generate-operation-token/attempt",
        Class::Proof(Proof::KeyShares),
        Root,
        Required,
        Sys::DrToken,
    ),
    r(
        "sys/replication/dr/secondary/generate-operation-token/update",
        Class::Proof(Proof::KeyShares),
        Root,
        Required,
        Sys::DrToken,
    ),
    r(
        "sys/replication/dr/secondary/operation-token/delete",
        Class::Proof(Proof::DrOperationToken),
        Root,
        Required,
        Sys::DrToken,
    ),
    // The DR secondary's protected operations: the DR operation token on a DR secondary;
    // everything else under sys/replication/ needs a sudo token.
    r(
        "sys/replication/dr/secondary/promote",
        DrSecondary,
        Root,
        Required,
        Sys::Replication,
    ),
    r(
        "sys/replication/dr/secondary/disable",
        DrSecondary,
        Root,
        Required,
        Sys::Replication,
    ),
    r(
        "sys/replication/dr/secondary/update-primary",
        DrSecondary,
        Root,
        Required,
        Sys::Replication,
    ),
    r(
        "sys/replication/dr/secondary/reindex",
        DrSecondary,
        Root,
        Required,
        Sys::Replication,
    ),
    r(
        "sys/replication/dr/secondary/merkle-check",
        DrSecondary,
        Root,
        Required,
        Sys::Replication,
    ),
    r("sys/replication/*", Sudo, Root, Required, Sys::Replication),
    r(
        "sys/generate-root/*",
        Class::Proof(Proof::KeyShares),
        Root,
        Required,
        Sys::GenerateRoot,
    ),
    // OpenBao 2.6's path for the same attempt (its `sys/generate-root/` answers 405).
    r(
        "sys/generate-root-token/*",
        Class::Proof(Proof::KeyShares),
        Root,
        Required,
        Sys::GenerateRoot,
    ),
    r("sys/audit", Sudo, Root, BestEffort, Sys::Audit),
    r("sys/audit/+", Sudo, Root, BestEffort, Sys::Audit),
    r("sys/audit-hash/+", Token, Root, Required, Sys::AuditHash),
    r("sys/metrics", Token, Root, Required, Sys::Metrics),
    r("sys/locked-users", Token, Ns, Required, Sys::LockedUsers),
    r(
        "sys/locked-users/+/unlock/*",
        Token,
        Ns,
        Required,
        Sys::LockedUsers,
    ),
    r("sys/license/status", Token, Root, Required, Sys::License),
    r(
        "sys/wrapping/unwrap",
        Class::Proof(Proof::WrappingToken),
        Ns,
        Required,
        Sys::Wrapping,
    ),
    r(
        "sys/wrapping/lookup",
        Class::Proof(Proof::WrappingToken),
        Ns,
        Required,
        Sys::Wrapping,
    ),
    r("sys/wrapping/wrap", Token, Ns, Required, Sys::Wrapping),
    // Listing needs sudo, as in the reference; so does a lookup here (one route: `LIST
    // sys/leases/lookup/` is the lookup's path).
    r("sys/leases/lookup/*", Sudo, Ns, Required, Sys::Leases),
    r("sys/leases/renew", Token, Ns, Required, Sys::Leases),
    r("sys/leases/renew/*", Token, Ns, Required, Sys::Leases),
    r("sys/leases/revoke", Token, Ns, Required, Sys::Leases),
    r("sys/leases/revoke/*", Token, Ns, Required, Sys::Leases),
    r(
        "sys/leases/revoke-prefix/*",
        Sudo,
        Ns,
        Required,
        Sys::Leases,
    ),
    r("sys/leases/revoke-force/*", Sudo, Ns, Required, Sys::Leases),
    r("sys/leases/tidy", Token, Ns, Required, Sys::Leases),
    r("sys/key-status", Token, Root, Required, Sys::KeyStatus),
    r("sys/remount", Sudo, Ns, Required, Sys::Remount),
    r("sys/remount/status/+", Token, Ns, Required, Sys::Remount),
    // A read needs a valid token but no capability on this path: the handler shows only
    // the mounts the token's policies reach (as the reference, for the CLI's KV probe).
    r(
        "sys/internal/ui/mounts/*",
        Token,
        Ns,
        Required,
        Sys::UiMounts,
    ),
    r("sys/wrapping/rewrap", Token, Ns, Required, Sys::Wrapping),
    r(
        "sys/storage/raft/snapshot",
        Sudo,
        Root,
        Required,
        Sys::Snapshot,
    ),
    r(
        "sys/storage/raft/snapshot-force",
        Sudo,
        Root,
        Required,
        Sys::Snapshot,
    ),
];

/// `auth/token/...`, relative to `auth/token/`.
pub static TOKEN: &[Route<Endpoint>] = &[
    r("create", Token, Ns, Required, Endpoint::Token),
    r("create-orphan", Sudo, Ns, Required, Endpoint::Token),
    r("create/+", Token, Ns, Required, Endpoint::Token),
    r("roles", Token, Ns, Required, Endpoint::Token),
    r("roles/+", Token, Ns, Required, Endpoint::Token),
    r("lookup-self", Token, Ns, Required, Endpoint::Token),
    r("lookup", Token, Ns, Required, Endpoint::Token),
    r("lookup-accessor", Token, Ns, Required, Endpoint::Token),
    r("renew-self", Token, Ns, Required, Endpoint::Token),
    r("renew", Token, Ns, Required, Endpoint::Token),
    r("renew-accessor", Token, Ns, Required, Endpoint::Token),
    r("revoke-self", Token, Ns, Required, Endpoint::Token),
    r("revoke", Token, Ns, Required, Endpoint::Token),
    r("revoke-orphan", Sudo, Ns, Required, Endpoint::Token),
    r("revoke-accessor", Token, Ns, Required, Endpoint::Token),
    r("accessors", Sudo, Ns, Required, Endpoint::Token),
];

/// `identity/...`, relative to `identity/` (the identity store, [`crate::identity`]).
pub static IDENTITY: &[Route<Endpoint>] = &[
    r("entity", Token, Ns, Required, Endpoint::Identity),
    r("entity/id", Token, Ns, Required, Endpoint::Identity),
    r("entity/id/+", Token, Ns, Required, Endpoint::Identity),
    r("entity/name", Token, Ns, Required, Endpoint::Identity),
    r("entity/name/+", Token, Ns, Required, Endpoint::Identity),
    r("entity-alias", Token, Ns, Required, Endpoint::Identity),
    r("entity-alias/id", Token, Ns, Required, Endpoint::Identity),
    r("entity-alias/id/+", Token, Ns, Required, Endpoint::Identity),
    r("group", Token, Ns, Required, Endpoint::Identity),
    r("group/id", Token, Ns, Required, Endpoint::Identity),
    r("group/id/+", Token, Ns, Required, Endpoint::Identity),
    r("group/name", Token, Ns, Required, Endpoint::Identity),
    r("group/name/+", Token, Ns, Required, Endpoint::Identity),
    r("group-alias", Token, Ns, Required, Endpoint::Identity),
    r("group-alias/id", Token, Ns, Required, Endpoint::Identity),
    r("group-alias/id/+", Token, Ns, Required, Endpoint::Identity),
    r("lookup/entity", Token, Ns, Required, Endpoint::Identity),
    r("lookup/group", Token, Ns, Required, Endpoint::Identity),
];

/// A KV (version 1) mount, relative to the mount.
pub static KV: &[Route<Endpoint>] = &[Route {
    pattern: "*",
    class: Token,
    scope: Ns,
    audit: Required,
    handler: Endpoint::Kv,
    existence: true,
}];

/// A route of a KV version 2 mount; `existence` for the paths whose writes create a key.
const fn kv2(pattern: &'static str, existence: bool) -> Route<Endpoint> {
    Route {
        pattern,
        class: Token,
        scope: Ns,
        audit: Required,
        handler: Endpoint::Kv2,
        existence,
    }
}

/// A KV version 2 mount, relative to the mount. Policies name these API paths
/// (`secret/data/foo`, `secret/metadata/foo`), as in Vault.
pub static KV2: &[Route<Endpoint>] = &[
    kv2("config", false),
    kv2("data/*", true),
    kv2("metadata/*", true),
    kv2("delete/*", false),
    kv2("undelete/*", false),
    kv2("destroy/*", false),
    kv2("subkeys/*", false),
    // The mount's root and paths outside the API: a 404 with a warning naming the API.
    kv2("*", false),
];

/// The LDAP auth method, relative to its mount (`auth/<mount>/`).
pub static LDAP: &[Route<Endpoint>] = &[
    r("config", Token, Ns, Required, Endpoint::LdapConfig),
    r("groups", Token, Ns, Required, Endpoint::LdapGroups),
    r("groups/+", Token, Ns, Required, Endpoint::LdapGroups),
    r("users", Token, Ns, Required, Endpoint::LdapUsers),
    r("users/+", Token, Ns, Required, Endpoint::LdapUsers),
    r("login/+", Login, Ns, Required, Endpoint::LdapLogin),
];

/// The mount types this build serves, each with its route table: (auth method?, type, table).
/// A KV version 2 mount is listed as the type `kv-v2` (the type it is enabled with; it is
/// stored as `kv` with `options.version` 2: see [`crate::mounts::MountEntry::engine`]).
pub fn mount_tables() -> [(bool, &'static str, &'static [Route<Endpoint>]); 3] {
    [
        (true, "ldap", LDAP),
        (false, "kv", KV),
        (false, "kv-v2", KV2),
    ]
}

/// The route table of a mount's type; `None` for a type this build does not serve.
pub fn mount_table(auth: bool, kind: &str) -> Option<&'static [Route<Endpoint>]> {
    mount_tables()
        .into_iter()
        .find(|(a, k, _)| *a == auth && *k == kind)
        .map(|(_, _, t)| t)
}

/// One declared route with a concrete path that reaches it: what tests generated from the
/// table call (the router's `table_tests` in process, `tests/tests/route_audit.rs` over
/// HTTP against the real binary), so a new route is covered without touching them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// A request path the route serves: its table's prefix (`auth/token/`, the mount's path)
    /// and the pattern with `+` filled in as `x` and `*` as `y`.
    pub path: String,
    /// The declared pattern with the table's prefix (`sys/audit/+`, `auth/token/create`,
    /// `auth/ldap/login/+`, `secret/*`).
    pub pattern: String,
    pub class: Class,
    pub scope: Scope,
    /// For a route of a mount table, the mount it is called under (auth method?, type,
    /// path as [`example_mount`] gives it): it must be enabled there.
    pub mount: Option<(bool, &'static str, String)>,
}

/// Where the examples call a mount type's routes: auth methods at `auth/<type>/`, the KV
/// engine at `secret/` (as a dev server mounts it), other engines at `<type>/`.
pub fn example_mount(auth: bool, kind: &str) -> String {
    match (auth, kind) {
        (true, k) => format!("auth/{k}/"),
        (false, "kv") => "secret/".to_string(),
        (false, k) => format!("{k}/"),
    }
}

/// Every declared route of every table (sys, token, each mount type's), in table order,
/// with a concrete path for each (see [`Example`]).
pub fn examples() -> Vec<Example> {
    fn concrete(pattern: &str) -> String {
        pattern
            .split('/')
            .map(|s| match s {
                "+" => "x",
                "*" => "y",
                s => s,
            })
            .collect::<Vec<_>>()
            .join("/")
    }
    fn of<H>(
        prefix: &str,
        table: &[Route<H>],
        mount: Option<(bool, &'static str, String)>,
    ) -> Vec<Example> {
        table
            .iter()
            .map(|r| Example {
                path: format!("{prefix}{}", concrete(r.pattern)),
                pattern: format!("{prefix}{}", r.pattern),
                class: r.class,
                scope: r.scope,
                mount: mount.clone(),
            })
            .collect()
    }
    let mut out = of("", SYS, None);
    out.extend(of("auth/token/", TOKEN, None));
    out.extend(of("identity/", IDENTITY, None));
    for (auth, kind, table) in mount_tables() {
        let at = example_mount(auth, kind);
        out.extend(of(&at, table, Some((auth, kind, at.clone()))));
    }
    out
}

/// What a path that matches no declared route is treated as: a token is required (and
/// checked against the policies) before the caller learns that nothing is there.
pub const UNDECLARED: Class = Token;

/// Whether `pattern` matches the canonical `path`.
pub fn matches(pattern: &str, path: &str) -> bool {
    let mut pat = pattern.split('/');
    let mut segs = path.split('/').filter(|s| !s.is_empty());
    loop {
        match (pat.next(), segs.next()) {
            (Some("*"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(p), Some(s)) if p == s => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// The first route of `table` matching `path`.
pub fn lookup<H: Copy>(table: &'static [Route<H>], path: &str) -> Option<&'static Route<H>> {
    table.iter().find(|r| matches(r.pattern, path))
}

/// The routes of [`SYS`] that can match a path, by the path's second segment, for
/// [`lookup_sys`]: a route whose pattern's second segment is literal can only match a path
/// with that segment; the others (`+`, `*`, none) can match any. Each list is in table order.
struct SysIndex {
    by_second: BTreeMap<&'static str, Vec<usize>>,
    /// The routes without a literal second segment (for any other path).
    other: Vec<usize>,
}

static SYS_INDEX: OnceLock<SysIndex> = OnceLock::new();

impl SysIndex {
    fn of(table: &'static [Route<Sys>]) -> SysIndex {
        let literal = |r: &Route<Sys>| {
            let mut segs = r.pattern.split('/');
            match (segs.next(), segs.next()) {
                (Some(first), Some(second)) if first != "*" && second != "*" && second != "+" => {
                    Some(second)
                }
                _ => None,
            }
        };
        let other: Vec<usize> = (0..table.len())
            .filter(|&i| literal(&table[i]).is_none())
            .collect();
        let mut by_second: BTreeMap<&'static str, Vec<usize>> = BTreeMap::new();
        for (i, r) in table.iter().enumerate() {
            if let Some(second) = literal(r) {
                by_second.entry(second).or_default().push(i);
            }
        }
        for list in by_second.values_mut() {
            list.extend(&other);
            list.sort_unstable();
        }
        SysIndex { by_second, other }
    }
}

/// `lookup(SYS, path)`, trying only the routes that can match `path` (by its second
/// segment), in table order: the same first match, without matching every `sys/` pattern
/// against every request.
pub fn lookup_sys(path: &str) -> Option<&'static Route<Sys>> {
    let index = SYS_INDEX.get_or_init(|| SysIndex::of(SYS));
    let second = path.split('/').filter(|s| !s.is_empty()).nth(1);
    let candidates = second
        .and_then(|s| index.by_second.get(s))
        .unwrap_or(&index.other);
    candidates
        .iter()
        .map(|&i| &SYS[i])
        .find(|r| matches(r.pattern, path))
}

/// The audit behaviour of a canonical request path before anything is resolved (sys routes are
/// static; everything else is [`Audit::Required`]).
pub fn audit_of(path: &str) -> Audit {
    lookup_sys(path).map(|r| r.audit).unwrap_or(Required)
}

/// The one canonical form of a request path, decided before anything else looks at it:
/// no leading or trailing `/`, no empty, `.` or `..` segments (refused). `sys/seal/`,
/// `/sys/seal` and `sys/seal` are one route; a list of `secret/priv` is a list of the
/// directory `secret/priv/`.
pub fn canonical(path: &str) -> ApiResult<String> {
    let t = path.trim_matches('/');
    if t.len() > 4096 {
        return Err(ApiError::bad("path: longer than 4096 bytes"));
    }
    for seg in t.split('/') {
        match seg {
            "" if !t.is_empty() => {
                return Err(ApiError::bad(format!(
                    "path {path:?}: empty path segment ('//'); remove the doubled slash"
                )))
            }
            "." | ".." => {
                return Err(ApiError::bad(format!(
                    "path {path:?}: '.' and '..' segments are not allowed"
                )))
            }
            _ => {}
        }
    }
    Ok(t.to_string())
}

/// The path a policy is checked against for `method` on the canonical `path`: a list
/// is checked on the directory (`secret/priv/`), so `secret/priv/*` governs it.
pub fn acl_path(method: Method, path: &str) -> String {
    if method == Method::List && !path.is_empty() {
        format!("{path}/")
    } else {
        path.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_segments() {
        assert!(matches("sys/seal", "sys/seal"));
        assert!(!matches("sys/seal", "sys/seal/x"));
        assert!(!matches("sys/seal", "sys/sealx"));
        assert!(matches("sys/audit/+", "sys/audit/file"));
        assert!(!matches("sys/audit/+", "sys/audit"));
        assert!(!matches("sys/audit/+", "sys/audit/a/b"));
        assert!(matches("sys/mounts/*", "sys/mounts"));
        assert!(matches("sys/mounts/*", "sys/mounts/a/b/tune"));
        assert!(matches("login/+", "login/alice"));
        assert!(!matches("login/+", "login/a/b"));
        assert!(!matches("login/+", "login"));
        assert!(matches("*", ""));
    }

    #[test]
    fn canonical_forms() {
        assert_eq!(canonical("/sys/seal/").unwrap(), "sys/seal");
        assert_eq!(canonical("sys/seal//").unwrap(), "sys/seal");
        assert!(canonical("sys//seal").is_err());
        assert!(canonical("secret/../sys/seal").is_err());
        assert!(canonical("secret/./x").is_err());
        assert_eq!(canonical("").unwrap(), "");
        assert_eq!(acl_path(Method::List, "secret/priv"), "secret/priv/");
        assert_eq!(acl_path(Method::Get, "secret/priv"), "secret/priv");
    }

    #[test]
    fn trailing_slash_is_the_same_route() {
        let a = lookup(SYS, &canonical("sys/seal/").unwrap()).unwrap();
        assert_eq!(a.class, Sudo);
        assert_eq!(a.scope, Root);
    }

    #[test]
    fn every_example_path_reaches_its_own_route() {
        let ex = examples();
        assert_eq!(
            ex.len(),
            SYS.len()
                + TOKEN.len()
                + IDENTITY.len()
                + mount_tables().iter().map(|m| m.2.len()).sum::<usize>()
        );
        for e in ex {
            let found = if let Some(op) = e.path.strip_prefix("auth/token/") {
                lookup(TOKEN, op).map(|r| r.class)
            } else if let Some(op) = e.path.strip_prefix("identity/") {
                lookup(IDENTITY, op).map(|r| r.class)
            } else if let Some((auth, kind, at)) = &e.mount {
                let rest = e.path.strip_prefix(at.as_str()).unwrap_or_default();
                lookup(mount_table(*auth, kind).unwrap_or_default(), rest).map(|r| r.class)
            } else {
                lookup(SYS, &e.path).map(|r| r.class)
            };
            assert_eq!(found, Some(e.class), "{e:?}");
            assert_eq!(canonical(&e.path).unwrap(), e.path);
        }
    }

    /// Random paths made of the segments the `sys/` patterns name (and a few others, empty
    /// ones too): the indexed lookup finds the route the plain one finds.
    #[test]
    fn quickcheck_the_sys_index_finds_the_first_matching_route() {
        fn prop(segs: Vec<(u8, u8)>) -> bool {
            let mut pool: Vec<&str> = SYS.iter().flat_map(|r| r.pattern.split('/')).collect();
            pool.extend(["", "x", "sys", "a", "seal-status", "unlock", "kv"]);
            let path: Vec<&str> = std::iter::once("sys")
                .filter(|_| segs.first().is_none_or(|s| s.1 % 5 != 0))
                .chain(
                    segs.iter()
                        .take(7)
                        .map(|(i, _)| pool[usize::from(*i) % pool.len()]),
                )
                .collect();
            let path = path.join("/");
            let fast = lookup_sys(&path).map(|r| r as *const Route<Sys>);
            let plain = lookup(SYS, &path).map(|r| r as *const Route<Sys>);
            fast == plain
        }
        quickcheck::QuickCheck::new()
            .tests(5_000)
            .quickcheck(prop as fn(Vec<(u8, u8)>) -> bool);
        for e in examples() {
            let fast = lookup_sys(&e.path).map(|r| r as *const Route<Sys>);
            assert_eq!(
                fast,
                lookup(SYS, &e.path).map(|r| r as *const _),
                "{}",
                e.path
            );
        }
    }

    #[test]
    fn only_declared_login_routes_are_logins() {
        for p in [
            "users/login",
            "groups/login",
            "login",
            "login/a/b",
            "config",
            "users/x",
        ] {
            let class = lookup(LDAP, p).map(|r| r.class).unwrap_or(UNDECLARED);
            assert_ne!(class, Login, "{p}");
        }
        assert_eq!(lookup(LDAP, "login/alice").unwrap().class, Login);
        assert!(SYS.iter().all(|r| r.class != Login));
        assert!(TOKEN.iter().all(|r| r.class != Login));
    }
}
