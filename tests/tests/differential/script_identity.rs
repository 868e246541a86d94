//! The differential script, part: the LDAP method, identity entities, aliases and (nested) groups, and the lockout.

use super::*;

/// Adds this part's requests to `s`.
pub(super) fn add(s: &mut Script) {
    // --- LDAP auth.
    s.post(
        "ldap config write",
        "auth/ldap/config",
        json!({"url": "${ldap_url}", "binddn": "${ldap_binddn}", "bindpass": "reader-secret",
               "userdn": "ou=people,dc=cairn,dc=test", "userattr": "uid",
               "groupdn": "ou=groups,dc=cairn,dc=test"}),
    );
    s.get("ldap config read", "auth/ldap/config");
    s.post(
        "ldap config bad certificate",
        "auth/ldap/config",
        json!({"url": "${ldap_url}", "certificate": "not a pem"}),
    );
    s.post(
        "ldap config bad groupfilter",
        "auth/ldap/config",
        json!({"url": "${ldap_url}", "groupfilter": "{{.Bad"}),
    );
    s.post(
        "ldap config bad deref",
        "auth/ldap/config",
        json!({"url": "${ldap_url}", "dereference_aliases": "sometimes"}),
    );
    s.get("ldap config read after bad", "auth/ldap/config");
    s.post(
        "ldap group write engineers",
        "auth/ldap/groups/engineers",
        json!({"policies": "reader,eng"}),
    );
    s.post(
        "ldap group write ops",
        "auth/ldap/groups/ops",
        json!({"policies": ["ops-pol"]}),
    );
    s.post(
        "ldap group write posix",
        "auth/ldap/groups/posix-users",
        json!({"policies": "posix-pol"}),
    );
    s.get("ldap group read engineers", "auth/ldap/groups/engineers");
    s.list("ldap groups list", "auth/ldap/groups");
    s.get("ldap group read missing", "auth/ldap/groups/nothere");
    s.post(
        "ldap group write temp",
        "auth/ldap/groups/temp",
        json!({"policies": "x"}),
    );
    s.delete("ldap group delete temp", "auth/ldap/groups/temp");
    s.delete("ldap group delete temp again", "auth/ldap/groups/temp");
    s.post(
        "ldap user write alice",
        "auth/ldap/users/alice",
        json!({"groups": "local-team", "policies": "own"}),
    );
    s.get("ldap user read alice", "auth/ldap/users/alice");
    s.list("ldap users list", "auth/ldap/users");
    s.get("ldap user read missing", "auth/ldap/users/nobody");
    s.post(
        "ldap user write temp",
        "auth/ldap/users/temp",
        json!({"policies": ["a", "b"]}),
    );
    s.delete("ldap user delete temp", "auth/ldap/users/temp");
    s.list("ldap users list after delete", "auth/ldap/users");
    // --- identity: entities, aliases, groups (an external one aliased to the directory
    // group `engineers` on auth/ldap/, so alice's logins below carry its policies).
    s.post(
        "identity entity create",
        "identity/entity",
        json!({"name": "svc-e", "policies": ["reader"], "metadata": {"team": "a"}}),
    )
    .cap("eid", "/data/id");
    s.post(
        "identity entity create existing name",
        "identity/entity",
        json!({"name": "svc-e", "policies": ["reader", "eng"]}),
    );
    s.get("identity entity read by id", "identity/entity/id/${eid}");
    s.get("identity entity read by name", "identity/entity/name/svc-e");
    s.list("identity entity list by id", "identity/entity/id");
    s.list("identity entity list by name", "identity/entity/name");
    s.post(
        "identity entity update by id",
        "identity/entity/id/${eid}",
        json!({"metadata": {"team": "b"}}),
    );
    s.post(
        "identity entity create by name",
        "identity/entity/name/tmp-e",
        json!({"policies": ["x"]}),
    );
    s.get("identity entity read missing", "identity/entity/id/nope");
    s.post(
        "identity entity update missing id",
        "identity/entity/id/nope",
        json!({"policies": ["x"]}),
    );
    s.post(
        "identity entity-alias bad accessor",
        "identity/entity-alias",
        json!({"name": "svc-alias", "canonical_id": "${eid}", "mount_accessor": "bogus"}),
    );
    s.post(
        "identity entity-alias bad canonical id",
        "identity/entity-alias",
        json!({"name": "svc-alias", "canonical_id": "nope", "mount_accessor": "${ldap_accessor}"}),
    );
    s.post(
        "identity entity-alias create",
        "identity/entity-alias",
        json!({"name": "svc-alias", "canonical_id": "${eid}", "mount_accessor": "${ldap_accessor}"}),
    )
    .cap("eaid", "/data/id");
    s.get(
        "identity entity-alias read",
        "identity/entity-alias/id/${eaid}",
    );
    s.list("identity entity-alias list", "identity/entity-alias/id");
    s.get(
        "identity entity read with alias",
        "identity/entity/id/${eid}",
    );
    s.post(
        "identity group create internal",
        "identity/group",
        json!({"name": "int-g", "policies": ["ops-pol"], "member_entity_ids": ["${eid}"]}),
    )
    .cap("gint", "/data/id");
    s.post(
        "identity group create external",
        "identity/group",
        json!({"name": "eng-ext", "type": "external", "policies": ["eng-id"]}),
    )
    .cap("gext", "/data/id");
    s.post(
        "identity group bad type",
        "identity/group",
        json!({"name": "bad-g", "type": "weird"}),
    );
    s.post(
        "identity group external with members",
        "identity/group",
        json!({"name": "bad-g", "type": "external", "member_entity_ids": ["${eid}"]}),
    );
    s.post(
        "identity group update by name",
        "identity/group/name/int-g",
        json!({"policies": ["ops-pol", "more"]}),
    );
    s.post(
        "identity group-alias on internal group",
        "identity/group-alias",
        json!({"name": "x", "mount_accessor": "${ldap_accessor}", "canonical_id": "${gint}"}),
    );
    s.post(
        "identity group-alias create",
        "identity/group-alias",
        json!({"name": "engineers", "mount_accessor": "${ldap_accessor}", "canonical_id": "${gext}"}),
    )
    .cap("gaid", "/data/id");
    s.get(
        "identity group-alias read",
        "identity/group-alias/id/${gaid}",
    );
    s.list("identity group-alias list", "identity/group-alias/id");
    s.get("identity group read internal", "identity/group/id/${gint}");
    s.get(
        "identity group read external",
        "identity/group/name/eng-ext",
    );
    s.list("identity group list by id", "identity/group/id");
    s.list("identity group list by name", "identity/group/name");
    s.get("identity group read missing", "identity/group/id/nope");
    s.post(
        "identity lookup entity by name",
        "identity/lookup/entity",
        json!({"name": "svc-e"}),
    );
    s.post(
        "identity lookup entity by alias",
        "identity/lookup/entity",
        json!({"alias_name": "svc-alias", "alias_mount_accessor": "${ldap_accessor}"}),
    );
    s.post(
        "identity lookup entity missing",
        "identity/lookup/entity",
        json!({"name": "nobody"}),
    );
    s.post(
        "identity lookup entity no criteria",
        "identity/lookup/entity",
        json!({}),
    );
    s.post(
        "identity lookup group by alias",
        "identity/lookup/group",
        json!({"alias_name": "engineers", "alias_mount_accessor": "${ldap_accessor}"}),
    );
    s.post(
        "identity lookup group by name",
        "identity/lookup/group",
        json!({"name": "int-g"}),
    );
    s.post(
        "ldap login alice",
        "auth/ldap/login/alice",
        json!({"password": "alice-pw"}),
    )
    .anon()
    .cap("tok_alice", "/auth/client_token")
    .cap("acc_alice", "/auth/accessor");
    s.post(
        "ldap login bob",
        "auth/ldap/login/bob",
        json!({"password": "bob-pw"}),
    )
    .anon()
    .cap("tok_bob", "/auth/client_token");
    s.post(
        "ldap login alice uppercase",
        "auth/ldap/login/ALICE",
        json!({"password": "alice-pw"}),
    )
    .anon();
    s.post(
        "ldap login wrong password",
        "auth/ldap/login/alice",
        json!({"password": "wrong"}),
    )
    .anon();
    s.post(
        "ldap login unknown user",
        "auth/ldap/login/nobody",
        json!({"password": "x"}),
    )
    .anon();
    s.post(
        "ldap login empty password",
        "auth/ldap/login/alice",
        json!({"password": ""}),
    )
    .anon();
    s.post("ldap login no password", "auth/ldap/login/alice", json!({}))
        .anon();
    s.post(
        "ldap login wrapped",
        "auth/ldap/login/bob",
        json!({"password": "bob-pw"}),
    )
    .anon()
    .wrap("3m")
    .cap("wrap_login", "/wrap_info/token");
    s.post(
        "wrapping unwrap login",
        "sys/wrapping/unwrap",
        json!({"token": "${wrap_login}"}),
    )
    .anon();
    s.get("lookup-self alice", "auth/token/lookup-self")
        .as_("tok_alice");
    s.post(
        "renew-self alice",
        "auth/token/renew-self",
        json!({"increment": "10m"}),
    )
    .as_("tok_alice");
    s.post(
        "lookup-accessor alice",
        "auth/token/lookup-accessor",
        json!({"accessor": "${acc_alice}"}),
    );
    s.get("kv1 read as alice", "kv1/dir/bar").as_("tok_alice");
    s.post(
        "identity lookup entity of alice",
        "identity/lookup/entity",
        json!({"alias_name": "alice", "alias_mount_accessor": "${ldap_accessor}"}),
    )
    .cap("alice_eid", "/data/id");
    s.get(
        "identity group read external after login",
        "identity/group/id/${gext}",
    );
    s.get(
        "identity entity read alice",
        "identity/entity/id/${alice_eid}",
    );
    s.put(
        "kv1 write as alice before group change",
        "kv1/dir/alice-w",
        json!({"x": 1}),
    )
    .as_("tok_alice");
    s.post(
        "identity group add policy later",
        "identity/group/id/${gext}",
        json!({"policies": ["eng-id", "writer"]}),
    );
    s.get(
        "lookup-self alice after group change",
        "auth/token/lookup-self",
    )
    .as_("tok_alice");
    s.put(
        "kv1 write as alice via group",
        "kv1/dir/alice-w",
        json!({"x": 1}),
    )
    .as_("tok_alice");
    // Nested groups: alice's entity in nest-c, nest-c in nest-p, nest-p in nest-g; her
    // token carries all three groups' policies.
    s.post(
        "identity nested child create",
        "identity/group",
        json!({"name": "nest-c", "policies": ["tokmaker"], "member_entity_ids": ["${alice_eid}"]}),
    )
    .cap("nest_c", "/data/id");
    s.post(
        "identity nested parent create",
        "identity/group",
        json!({"name": "nest-p", "policies": ["nest-p-pol"], "member_group_ids": ["${nest_c}"]}),
    )
    .cap("nest_p", "/data/id");
    s.post(
        "identity nested grand create",
        "identity/group",
        json!({"name": "nest-g", "policies": ["writer"], "member_group_ids": ["${nest_p}"]}),
    )
    .cap("nest_g", "/data/id");
    s.get("identity nested read child", "identity/group/id/${nest_c}");
    s.get("identity nested read parent", "identity/group/id/${nest_p}");
    s.get("identity nested read grand", "identity/group/name/nest-g");
    s.post(
        "identity nested cycle",
        "identity/group/id/${nest_c}",
        json!({"member_group_ids": ["${nest_g}"]}),
    );
    s.post(
        "identity nested self member",
        "identity/group/id/${nest_p}",
        json!({"member_group_ids": ["${nest_p}"]}),
    );
    s.post(
        "identity nested unknown member",
        "identity/group/id/${nest_p}",
        json!({"member_group_ids": ["nope"]}),
    );
    s.post(
        "identity nested external with member groups",
        "identity/group",
        json!({"name": "nest-x", "type": "external", "member_group_ids": ["${nest_c}"]}),
    );
    s.list("identity nested list", "identity/group/id");
    s.get("lookup-self alice nested", "auth/token/lookup-self")
        .as_("tok_alice");
    // A child token of alice's acts for her entity (tokmaker reaches her through nest-c).
    s.post(
        "token create child of alice",
        "auth/token/create",
        json!({"policies": ["default"], "ttl": "10m"}),
    )
    .as_("tok_alice")
    .cap("tok_alice_child", "/auth/client_token");
    s.get("lookup-self child of alice", "auth/token/lookup-self")
        .as_("tok_alice_child");
    s.get(
        "identity entity read alice nested",
        "identity/entity/id/${alice_eid}",
    );
    s.delete(
        "identity nested delete parent",
        "identity/group/id/${nest_p}",
    );
    s.get(
        "identity nested read grand after delete",
        "identity/group/id/${nest_g}",
    );
    s.get(
        "lookup-self alice nested after delete",
        "auth/token/lookup-self",
    )
    .as_("tok_alice");
    s.delete(
        "identity entity-alias delete",
        "identity/entity-alias/id/${eaid}",
    );
    s.get(
        "identity entity-alias read deleted",
        "identity/entity-alias/id/${eaid}",
    );
    s.delete(
        "identity entity delete by name",
        "identity/entity/name/tmp-e",
    );
    s.delete(
        "identity entity delete by name again",
        "identity/entity/name/tmp-e",
    );
    s.delete(
        "identity group-alias delete",
        "identity/group-alias/id/${gaid}",
    );
    s.list("identity group-alias list empty", "identity/group-alias/id");
    s.delete(
        "identity group delete internal",
        "identity/group/id/${gint}",
    );
    s.get(
        "identity entity read after group delete",
        "identity/entity/id/${eid}",
    );
    s.delete("identity entity delete by id", "identity/entity/id/${eid}");

    s.post(
        "capabilities-self alice",
        "sys/capabilities-self",
        json!({"path": "kv1/dir/bar"}),
    )
    .as_("tok_alice");
    s.post("revoke-self alice", "auth/token/revoke-self", json!(null))
        .as_("tok_alice");
    s.get("lookup-self alice revoked", "auth/token/lookup-self")
        .as_("tok_alice");
    // Lockout: the reference locks a user after 5 failed logins (default user lockout).
    for i in 1..=5 {
        s.post(
            &format!("ldap login carol bad {i}"),
            "auth/ldap/login/carol",
            json!({"password": "bad"}),
        )
        .anon();
    }
    s.post(
        "ldap login carol good after lockout",
        "auth/ldap/login/carol",
        json!({"password": "carol-pw"}),
    )
    .anon();
    s.get("locked users", "sys/locked-users");
    s.post(
        "unlock carol",
        "sys/locked-users/${ldap_accessor}/unlock/carol",
        json!(null),
    );
    s.post(
        "ldap login carol after unlock",
        "auth/ldap/login/carol",
        json!({"password": "carol-pw"}),
    )
    .anon();
    s.post(
        "ldap login on missing mount",
        "auth/nothere/login/alice",
        json!({"password": "alice-pw"}),
    )
    .anon();
}
