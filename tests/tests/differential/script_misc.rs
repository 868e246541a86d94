//! The differential script, part: revoke modes, leases, generate-root, namespaces and the rest of sys.

use super::*;

/// Adds this part's requests to `s`.
pub(super) fn add(s: &mut Script) {
    // --- tokens: revoke modes.
    s.post(
        "revoke-orphan maker",
        "auth/token/revoke-orphan",
        json!({"token": "${tok_maker}"}),
    );
    s.get(
        "lookup-self child after revoke-orphan",
        "auth/token/lookup-self",
    )
    .as_("tok_child");
    s.post(
        "revoke maker2",
        "auth/token/revoke",
        json!({"token": "${tok_maker2}"}),
    );
    s.get("lookup-self child2 after revoke", "auth/token/lookup-self")
        .as_("tok_child2");
    s.post(
        "revoke-accessor orphan",
        "auth/token/revoke-accessor",
        json!({"accessor": "${acc_orphan}"}),
    );
    s.get("lookup-self orphan after revoke", "auth/token/lookup-self")
        .as_("tok_orphan");
    s.post("revoke-self full", "auth/token/revoke-self", json!(null))
        .as_("tok_full");
    s.post(
        "revoke unknown",
        "auth/token/revoke",
        json!({"token": "s.doesnotexist"}),
    );
    s.post(
        "revoke-accessor unknown",
        "auth/token/revoke-accessor",
        json!({"accessor": "nosuchaccessor"}),
    );
    s.post("revoke empty", "auth/token/revoke", json!({}));
    s.post(
        "revoke batch",
        "auth/token/revoke",
        json!({"token": "${tok_batch_orphan}"}),
    );
    s.post(
        "revoke-orphan without sudo",
        "auth/token/revoke-orphan",
        json!({"token": "${tok_periodic}"}),
    )
    .as_("tok_reader");

    // --- leases.
    s.list("leases lookup list", "sys/leases/lookup/");
    s.list(
        "leases lookup token prefix",
        "sys/leases/lookup/auth/token/create/",
    );
    s.put(
        "leases lookup bogus",
        "sys/leases/lookup",
        json!({"lease_id": "kv1/nothing/abc"}),
    );
    s.put(
        "leases renew bogus",
        "sys/leases/renew",
        json!({"lease_id": "kv1/nothing/abc"}),
    );
    s.put(
        "leases revoke bogus",
        "sys/leases/revoke",
        json!({"lease_id": "kv1/nothing/abc"}),
    );
    s.put("leases lookup empty", "sys/leases/lookup", json!({}));
    s.put(
        "leases revoke-prefix ldap",
        "sys/leases/revoke-prefix/auth/ldap/login/bob",
        json!(null),
    );
    s.put("leases tidy", "sys/leases/tidy", json!(null));

    // --- generate-root.
    s.get("generate-root status", "sys/generate-root/attempt");
    s.put(
        "generate-root start",
        "sys/generate-root/attempt",
        json!({}),
    )
    .cap("gr_nonce", "/nonce");
    s.get("generate-root status started", "sys/generate-root/attempt");
    s.put(
        "generate-root start again",
        "sys/generate-root/attempt",
        json!({}),
    );
    s.put(
        "generate-root update bad nonce",
        "sys/generate-root/update",
        json!({"key": "AAAA", "nonce": "not-the-nonce"}),
    );
    s.delete("generate-root cancel", "sys/generate-root/attempt");
    s.get(
        "generate-root status after cancel",
        "sys/generate-root/attempt",
    );
    s.delete("generate-root cancel again", "sys/generate-root/attempt");
    s.put(
        "generate-root update without attempt",
        "sys/generate-root/update",
        json!({"key": "AAAA", "nonce": "x"}),
    );

    // OpenBao 2.6 serves the attempt under sys/generate-root-token/ (sys/generate-root/ is
    // the Vault path).
    s.get(
        "generate-root-token status",
        "sys/generate-root-token/attempt",
    );
    s.put(
        "generate-root-token start",
        "sys/generate-root-token/attempt",
        json!({}),
    );
    s.get(
        "generate-root-token status started",
        "sys/generate-root-token/attempt",
    );
    s.delete(
        "generate-root-token cancel",
        "sys/generate-root-token/attempt",
    );
    s.get(
        "generate-root-token status after cancel",
        "sys/generate-root-token/attempt",
    );

    // --- namespaces (OpenBao 2.6 has them).
    s.list("namespaces list empty", "sys/namespaces");
    s.post("namespace create", "sys/namespaces/team1", json!({}));
    s.get("namespace read", "sys/namespaces/team1");
    s.list("namespaces list", "sys/namespaces");
    s.get("namespace read missing", "sys/namespaces/nothere");
    s.delete("namespace delete", "sys/namespaces/team1");
    // A namespace holding a KV mount with data, an auth mount, a policy and a token is
    // deleted with all of it; one holding a child namespace is not.
    s.post("namespace create team2", "sys/namespaces/team2", json!({}));
    s.post(
        "namespace team2 mount kv",
        "sys/mounts/kv",
        json!({"type": "kv", "options": {"version": "1"}}),
    )
    .ns("team2");
    s.post("namespace team2 kv write", "kv/a", json!({"v": "1"}))
        .ns("team2");
    s.post(
        "namespace team2 auth enable",
        "sys/auth/ldap",
        json!({"type": "ldap"}),
    )
    .ns("team2");
    s.put(
        "namespace team2 policy write",
        "sys/policies/acl/p1",
        json!({"policy": "path \"kv/*\" { capabilities = [\"read\"] }"}),
    )
    .ns("team2");
    s.post(
        "namespace team2 token create",
        "auth/token/create",
        json!({"policies": ["p1"]}),
    )
    .ns("team2")
    .cap("tok_team2", "/auth/client_token");
    s.get("namespace team2 kv read as its token", "kv/a")
        .ns("team2")
        .as_("tok_team2");
    s.post(
        "namespace team2 child create",
        "sys/namespaces/kid",
        json!({}),
    )
    .ns("team2");
    s.delete("namespace delete team2 with child", "sys/namespaces/team2");
    s.delete("namespace team2 child delete", "sys/namespaces/kid")
        .ns("team2");
    s.get("namespace team2 child gone", "sys/namespaces/kid")
        .ns("team2")
        .settle(404);
    s.delete("namespace delete team2 with mounts", "sys/namespaces/team2");
    s.get("namespace read deleted team2", "sys/namespaces/team2")
        .settle(404);
    s.get("namespace team2 kv read after delete", "kv/a")
        .ns("team2");
    s.get(
        "namespace team2 token after delete",
        "auth/token/lookup-self",
    )
    .as_("tok_team2");
    s.delete("namespace delete missing", "sys/namespaces/team2");

    // --- misc sys.
    s.get("audit list", "sys/audit");
    s.get("seal-status end", "sys/seal-status").anon();
    s.get("health end", "sys/health").anon();
    s.get("unknown sys path", "sys/nothing-here");
    s.get("unknown top path", "nomount/x");
    s.post("unwrap with no token", "sys/wrapping/unwrap", json!(null))
        .anon();
    s.get("mounts end", "sys/mounts");
    s.get("auth end", "sys/auth");
}
