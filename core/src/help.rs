//! Path help (`GET <path>?help=1`, what `bao path-help` asks): a text describing the declared
//! route a path reaches (its pattern, what it does, what a caller needs), and for a mount's
//! own path the routes its engine or method declares. Generated from the route tables
//! (`routes.rs`), so it covers every declared route and says nothing about undeclared ones.
//! The answer is not enveloped, as in the reference: `{"help": text, "openapi": {...}}`.

use crate::api::Reply;
use crate::routes::{Class, Endpoint, Route, Sys};
use serde_json::json;

/// What a sys handler does, in one sentence.
fn sys_synopsis(h: Sys) -> &'static str {
    match h {
        Sys::Init => {
            "Initialise the cluster: the root key split into key shares, and a root token."
        }
        Sys::Unseal => "Give one key share towards unsealing (or reset the progress).",
        Sys::SealStatus => "Whether the node is initialised and sealed, and the unseal progress.",
        Sys::Health => "The node's health, as an HTTP status code.",
        Sys::Leader => "Whether this node is the active one, and the active node's address.",
        Sys::StepDown => "Make the active node of an HA cluster give up its lease.",
        Sys::HaStatus => "The nodes of the HA cluster.",
        Sys::Seal => "Seal the node: it forgets the barrier key until it is unsealed again.",
        Sys::Mounts => "List, enable, read, tune and disable secrets engines.",
        Sys::Auth => "List, enable, tune and disable auth methods.",
        Sys::Namespaces => "List, create, read and delete namespaces.",
        Sys::Policies | Sys::Policy => "List, read, write and delete ACL policies.",
        Sys::Capabilities => "The capabilities a token has on paths.",
        Sys::ReplicationStatus => "The status of performance and DR replication.",
        Sys::Replication => "Manage performance and DR replication.",
        Sys::DrToken => "Generate and use the DR operation token of a DR secondary.",
        Sys::GenerateRoot => "Generate a new root token from a threshold of key shares.",
        Sys::Audit => "List, enable and disable audit devices.",
        Sys::AuditHash => "Hash a value with an audit device's salt.",
        Sys::Metrics => "The node's metrics (Prometheus or JSON).",
        Sys::LockedUsers => "Users locked out by failed logins, and unlocking them.",
        Sys::License => "The license's status.",
        Sys::Wrapping => "Wrap, look up, rewrap and unwrap response-wrapping tokens.",
        Sys::Leases => "Look up, renew and revoke leases (by id or prefix).",
        Sys::UiMounts => "The mounts a token may use (what the CLI asks before a kv command).",
        Sys::KeyStatus => "The barrier key's term, install time and encryption count.",
        Sys::Remount => "Move a secrets engine or auth method to another path.",
        Sys::Snapshot => "Take (GET) or restore (POST) a snapshot of the storage.",
        // Handlers added on other branches describe themselves once listed above.
        #[allow(unreachable_patterns)]
        _ => "A system endpoint.",
    }
}

/// What a mount endpoint does, in one sentence.
fn endpoint_synopsis(h: Endpoint) -> &'static str {
    match h {
        Endpoint::Token => "Create, look up, renew and revoke tokens, and manage token roles.",
        Endpoint::LdapConfig => "The LDAP method's connection and search configuration.",
        Endpoint::LdapGroups => "LDAP groups mapped to policies.",
        Endpoint::LdapUsers => "LDAP users mapped to extra groups and policies.",
        Endpoint::LdapLogin => "Log in with an LDAP username and password.",
        Endpoint::Kv => "Read, write, list and delete secrets of a key/value store.",
        #[allow(unreachable_patterns)]
        _ => "An endpoint of this mount.",
    }
}

/// What a caller needs, by the route's class.
fn needs(c: Class) -> &'static str {
    match c {
        Class::Public => "No token is needed.",
        Class::Login => "No token is needed: a successful call creates one.",
        Class::Proof(_) => "No client token: the request carries its own credential (key shares or a wrapping or DR operation token).",
        Class::Token => "A token whose policies grant the method's capability on the path.",
        Class::Sudo | Class::DrSecondary => "A token whose policies grant the method's capability and sudo on the path.",
    }
}

fn answer(request: &str, pattern: &str, synopsis: &str, description: &str) -> Reply {
    let help = format!(
        "Request:        {request}\nMatching Route: {pattern}\n\n{synopsis}\n\n## DESCRIPTION\n\n{description}\n"
    );
    Reply::Raw(
        200,
        json!({
            "help": help,
            "openapi": {
                "openapi": "3.0.2",
                "info": {"title": "Cairn API", "version": env!("CARGO_PKG_VERSION")},
                "paths": {format!("/{pattern}"): {"description": synopsis}},
            },
        }),
    )
}

/// Help of a sys route; `request` is the path after `sys/`.
pub fn sys(request: &str, r: &Route<Sys>) -> Reply {
    answer(request, r.pattern, sys_synopsis(r.handler), needs(r.class))
}

/// Help of a route of a mount (or of `auth/token/`): `request` is the path inside the mount,
/// `prefix` the mount's path as the caller names it (`kv1/`, `auth/ldap/`).
pub fn endpoint(request: &str, prefix: &str, r: &Route<Endpoint>) -> Reply {
    let pattern = format!("{prefix}{}", r.pattern);
    answer(
        request,
        &pattern,
        endpoint_synopsis(r.handler),
        needs(r.class),
    )
}

/// Help of a mount's own path: its type and the routes it declares.
pub fn mount(prefix: &str, kind: &str, table: &[Route<Endpoint>]) -> Reply {
    let mut paths = String::new();
    for r in table {
        paths.push_str(&format!(
            "    {prefix}{}\n        {}\n\n",
            r.pattern,
            endpoint_synopsis(r.handler)
        ));
    }
    let help = format!(
        "## DESCRIPTION\n\nThe {kind} mount at {prefix}.\n\n## PATHS\n\nThe following paths are supported by this mount ('+' is one path segment, '*' any rest).\n\n{paths}"
    );
    Reply::Raw(
        200,
        json!({
            "help": help,
            "openapi": {
                "openapi": "3.0.2",
                "info": {"title": "Cairn API", "version": env!("CARGO_PKG_VERSION")},
                "paths": table.iter().map(|r| (format!("/{prefix}{}", r.pattern), json!({"description": endpoint_synopsis(r.handler)}))).collect::<serde_json::Map<_, _>>(),
            },
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_names_the_route_and_what_it_needs() {
        let r = crate::routes::lookup(crate::routes::SYS, "sys/mounts/kv1").unwrap();
        let Reply::Raw(200, v) = sys("mounts/kv1", r) else {
            panic!("not raw")
        };
        let text = v["help"].as_str().unwrap();
        assert!(text.contains("Matching Route: sys/mounts/*"), "{text}");
        assert!(text.contains("secrets engines"), "{text}");
        assert!(text.contains("A token whose policies"), "{text}");
        assert_eq!(
            v["openapi"]["paths"]["/sys/mounts/*"]["description"],
            json!(sys_synopsis(Sys::Mounts))
        );
        let Reply::Raw(200, v) = mount("auth/ldap/", "ldap", crate::routes::LDAP) else {
            panic!("not raw")
        };
        let text = v["help"].as_str().unwrap();
        for p in ["auth/ldap/config", "auth/ldap/login/+", "auth/ldap/users/+"] {
            assert!(text.contains(p), "{p}: {text}");
        }
    }
}
