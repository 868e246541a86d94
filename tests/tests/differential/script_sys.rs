//! The differential script, part: sys status, mounts, auth methods, policies, tokens (create, lookup, renew, roles) and capabilities.

use super::*;

/// Adds this part's requests to `s`.
pub(super) fn add(s: &mut Script) {
    let kv_reader = r#"path "kv1/*" { capabilities = ["read", "list"] }"#;
    let kv_writer =
        r#"path "kv1/*" { capabilities = ["create", "read", "update", "delete", "list"] }"#;
    let tok_maker = r#"path "auth/token/create" { capabilities = ["create", "update"] }
path "auth/token/create-orphan" { capabilities = ["create", "update"] }"#;

    // --- sys: status endpoints, unauthenticated.
    s.get("health", "sys/health").anon();
    s.get("health standbyok", "sys/health?standbyok=true")
        .anon();
    s.get(
        "health perfstandbyok",
        "sys/health?perfstandbyok=true&sealedcode=503",
    )
    .anon();
    s.get("seal-status", "sys/seal-status").anon();
    s.get("leader", "sys/leader").anon();
    s.get("key-status", "sys/key-status");
    s.get("mounts without token", "sys/mounts").anon();
    s.get("mounts with bad token", "sys/mounts").as_("bogus");

    // --- sys: mounts and tune.
    s.get("mounts", "sys/mounts");
    s.post(
        "mount kv1",
        "sys/mounts/kv1",
        json!({"type": "kv", "options": {"version": "1"}, "description": "kv one"}),
    );
    s.post(
        "mount kv1 again",
        "sys/mounts/kv1",
        json!({"type": "kv", "options": {"version": "1"}}),
    );
    s.post(
        "mount unknown type",
        "sys/mounts/zz",
        json!({"type": "nope"}),
    );
    s.post(
        "mount kv-tmp",
        "sys/mounts/kv-tmp",
        json!({"type": "kv", "options": {"version": "1"}}),
    );
    s.post("mount kv-up", "sys/mounts/kv-up", json!({"type": "kv"}));
    s.get("read mount kv1", "sys/mounts/kv1");
    s.get("mounts after mount", "sys/mounts");
    s.get("tune kv1 read", "sys/mounts/kv1/tune");
    s.post(
        "tune kv1 ttls",
        "sys/mounts/kv1/tune",
        json!({"default_lease_ttl": "1h", "max_lease_ttl": "2h"}),
    );
    s.get("tune kv1 read after", "sys/mounts/kv1/tune");
    s.post(
        "tune kv1 description",
        "sys/mounts/kv1/tune",
        json!({"description": "tuned"}),
    );
    s.post(
        "tune kv1 bad ttl",
        "sys/mounts/kv1/tune",
        json!({"default_lease_ttl": "forever"}),
    );
    s.get("tune missing mount", "sys/mounts/nothere/tune");
    s.get("tune secret read", "sys/mounts/secret/tune");
    s.delete("unmount kv-tmp", "sys/mounts/kv-tmp");
    s.delete("unmount kv-tmp again", "sys/mounts/kv-tmp");
    s.get("internal ui mounts", "sys/internal/ui/mounts");
    s.get("internal ui mounts kv1", "sys/internal/ui/mounts/kv1");
    s.get("internal ui mounts secret", "sys/internal/ui/mounts/secret");
    s.get(
        "internal ui mounts missing",
        "sys/internal/ui/mounts/nothere",
    );

    // --- sys: auth methods and tune.
    s.get("auth list", "sys/auth");
    s.post("enable ldap", "sys/auth/ldap", json!({"type": "ldap"}));
    s.post(
        "enable ldap again",
        "sys/auth/ldap",
        json!({"type": "ldap"}),
    );
    s.post(
        "enable ldap2",
        "sys/auth/ldap2",
        json!({"type": "ldap", "description": "second"}),
    );
    s.post(
        "enable unknown auth",
        "sys/auth/zz",
        json!({"type": "nope"}),
    );
    s.get("auth list after", "sys/auth")
        .cap("ldap_accessor", "/data/ldap~1/accessor");
    s.get("auth ldap tune read", "sys/auth/ldap/tune");
    s.post(
        "auth ldap tune ttls",
        "sys/auth/ldap/tune",
        json!({"default_lease_ttl": "30m", "max_lease_ttl": "1h"}),
    );
    s.get("auth ldap tune read after", "sys/auth/ldap/tune");
    s.get("auth token tune read", "sys/auth/token/tune");
    s.get("auth missing tune read", "sys/auth/nothere/tune");
    s.delete("disable ldap2", "sys/auth/ldap2");
    s.get("auth list after disable", "sys/auth");
    s.get("read auth ldap", "sys/auth/ldap");

    // --- sys: policies.
    s.get("policy list", "sys/policy");
    s.list("policies acl list", "sys/policies/acl");
    s.get("policies acl list via get", "sys/policies/acl?list=true");
    s.put(
        "policy acl write reader",
        "sys/policies/acl/reader",
        json!({ "policy": kv_reader }),
    );
    s.get("policy acl read reader", "sys/policies/acl/reader");
    s.put(
        "policy write writer",
        "sys/policy/writer",
        json!({ "policy": kv_writer }),
    );
    s.get("policy read writer", "sys/policy/writer");
    s.put(
        "policy acl write tokmaker",
        "sys/policies/acl/tokmaker",
        json!({ "policy": tok_maker }),
    );
    s.get("policy read default", "sys/policy/default");
    s.get("policy acl read default", "sys/policies/acl/default");
    s.get("policy acl read root", "sys/policies/acl/root");
    s.put(
        "policy acl write root",
        "sys/policies/acl/root",
        json!({"policy": kv_reader}),
    );
    s.delete("policy acl delete default", "sys/policies/acl/default");
    s.delete("policy acl delete root", "sys/policies/acl/root");
    s.put(
        "policy acl write bad hcl",
        "sys/policies/acl/bad",
        json!({"policy": "path \"x\" {"}),
    );
    s.put(
        "policy acl write empty",
        "sys/policies/acl/empty",
        json!({}),
    );
    s.get("policy acl read missing", "sys/policies/acl/missing");
    s.get("policy read missing", "sys/policy/missing");
    s.put(
        "policy acl write temp",
        "sys/policies/acl/temp",
        json!({"policy": kv_reader}),
    );
    s.delete("policy acl delete temp", "sys/policies/acl/temp");
    s.delete("policy acl delete temp again", "sys/policies/acl/temp");
    s.list("policies acl list after", "sys/policies/acl");
    s.get("policy list after", "sys/policy");

    // --- tokens: create.
    s.post(
        "token create reader",
        "auth/token/create",
        json!({"policies": ["reader"], "ttl": "1h"}),
    )
    .cap("tok_reader", "/auth/client_token")
    .cap("acc_reader", "/auth/accessor");
    s.post(
        "token create full",
        "auth/token/create",
        json!({"policies": ["reader", "writer"], "ttl": "1h", "renewable": true,
               "meta": {"team": "x"}, "display_name": "svc", "num_uses": 0}),
    )
    .cap("tok_full", "/auth/client_token")
    .cap("acc_full", "/auth/accessor");
    s.post(
        "token create batch",
        "auth/token/create",
        json!({"type": "batch", "policies": ["reader"], "ttl": "30m"}),
    )
    .cap("tok_batch", "/auth/client_token");
    s.post(
        "token create batch no parent",
        "auth/token/create",
        json!({"type": "batch", "policies": ["reader"], "no_parent": true}),
    )
    .cap("tok_batch_orphan", "/auth/client_token");
    s.post(
        "token create no_parent",
        "auth/token/create",
        json!({"no_parent": true, "policies": ["reader"]}),
    )
    .cap("tok_noparent", "/auth/client_token");
    s.post(
        "token create-orphan",
        "auth/token/create-orphan",
        json!({"policies": ["reader"], "ttl": "2h"}),
    )
    .cap("tok_orphan", "/auth/client_token")
    .cap("acc_orphan", "/auth/accessor");
    s.post(
        "token create periodic",
        "auth/token/create",
        json!({"period": "1h", "policies": ["reader"]}),
    )
    .cap("tok_periodic", "/auth/client_token")
    .cap("acc_periodic", "/auth/accessor");
    s.post(
        "token create explicit max",
        "auth/token/create",
        json!({"explicit_max_ttl": "2h", "ttl": "1h"}),
    )
    .cap("tok_explicit", "/auth/client_token");
    s.post(
        "token create num_uses",
        "auth/token/create",
        json!({"num_uses": 2, "policies": ["reader"]}),
    )
    .cap("tok_uses", "/auth/client_token");
    s.post(
        "token create no default policy",
        "auth/token/create",
        json!({"no_default_policy": true, "policies": ["reader"]}),
    );
    s.post(
        "token create bad ttl",
        "auth/token/create",
        json!({"ttl": "bogus"}),
    );
    s.post(
        "token create bad type",
        "auth/token/create",
        json!({"type": "weird"}),
    );
    s.post(
        "token create batch renewable",
        "auth/token/create",
        json!({"type": "batch", "renewable": true, "period": "1h"}),
    );
    s.post(
        "token create maker",
        "auth/token/create",
        json!({"policies": ["tokmaker"], "ttl": "1h"}),
    )
    .cap("tok_maker", "/auth/client_token")
    .cap("acc_maker", "/auth/accessor");
    s.post(
        "token create child of maker",
        "auth/token/create",
        json!({"policies": ["default"], "ttl": "30m"}),
    )
    .as_("tok_maker")
    .cap("tok_child", "/auth/client_token");
    s.post(
        "token create child with root policy",
        "auth/token/create",
        json!({"policies": ["root"]}),
    )
    .as_("tok_maker");
    s.post(
        "token create-orphan without sudo",
        "auth/token/create-orphan",
        json!({}),
    )
    .as_("tok_maker");
    s.post("token create as reader", "auth/token/create", json!({}))
        .as_("tok_reader");
    s.post(
        "token create second maker",
        "auth/token/create",
        json!({"policies": ["tokmaker"]}),
    )
    .cap("tok_maker2", "/auth/client_token");
    s.post(
        "token create child of maker2",
        "auth/token/create",
        json!({"policies": ["default"]}),
    )
    .as_("tok_maker2")
    .cap("tok_child2", "/auth/client_token");
    s.post(
        "token create wrapped",
        "auth/token/create",
        json!({"policies": ["reader"]}),
    )
    .wrap("5m")
    .cap("wrap_tok", "/wrap_info/token");

    // --- tokens: lookup.
    s.get("lookup-self root", "auth/token/lookup-self");
    s.get("lookup-self reader", "auth/token/lookup-self")
        .as_("tok_reader");
    s.get("lookup-self full", "auth/token/lookup-self")
        .as_("tok_full");
    s.get("lookup-self batch", "auth/token/lookup-self")
        .as_("tok_batch");
    s.get("lookup-self periodic", "auth/token/lookup-self")
        .as_("tok_periodic");
    s.get("lookup-self orphan", "auth/token/lookup-self")
        .as_("tok_orphan");
    s.get("lookup-self bogus", "auth/token/lookup-self")
        .as_("bogus");
    s.get("lookup-self no token", "auth/token/lookup-self")
        .anon();
    s.post(
        "lookup reader",
        "auth/token/lookup",
        json!({"token": "${tok_reader}"}),
    );
    s.post(
        "lookup batch",
        "auth/token/lookup",
        json!({"token": "${tok_batch}"}),
    );
    s.post(
        "lookup explicit",
        "auth/token/lookup",
        json!({"token": "${tok_explicit}"}),
    );
    s.post(
        "lookup unknown",
        "auth/token/lookup",
        json!({"token": "s.doesnotexist"}),
    );
    s.post("lookup empty", "auth/token/lookup", json!({}));
    s.post(
        "lookup as reader",
        "auth/token/lookup",
        json!({"token": "${tok_full}"}),
    )
    .as_("tok_reader");
    s.post(
        "lookup-accessor reader",
        "auth/token/lookup-accessor",
        json!({"accessor": "${acc_reader}"}),
    );
    s.post(
        "lookup-accessor unknown",
        "auth/token/lookup-accessor",
        json!({"accessor": "nosuchaccessor"}),
    );
    s.list("token accessors", "auth/token/accessors");
    s.list("token accessors as reader", "auth/token/accessors")
        .as_("tok_reader");
    s.get("lookup-self uses 1", "auth/token/lookup-self")
        .as_("tok_uses");
    s.get("lookup-self uses 2", "auth/token/lookup-self")
        .as_("tok_uses");
    s.get("lookup-self uses exhausted", "auth/token/lookup-self")
        .as_("tok_uses");

    // --- tokens: renew.
    s.post(
        "renew-self reader",
        "auth/token/renew-self",
        json!({"increment": "30m"}),
    )
    .as_("tok_reader");
    s.post(
        "renew reader",
        "auth/token/renew",
        json!({"token": "${tok_reader}", "increment": "1h"}),
    );
    s.post(
        "renew-accessor reader",
        "auth/token/renew-accessor",
        json!({"accessor": "${acc_reader}"}),
    );
    s.post(
        "renew periodic",
        "auth/token/renew",
        json!({"token": "${tok_periodic}"}),
    );
    s.post(
        "renew root",
        "auth/token/renew",
        json!({"token": "${root}"}),
    );
    s.post("renew-self root", "auth/token/renew-self", json!({}));
    s.post("renew-self batch", "auth/token/renew-self", json!({}))
        .as_("tok_batch");
    s.post(
        "renew unknown",
        "auth/token/renew",
        json!({"token": "s.doesnotexist"}),
    );
    s.post(
        "renew explicit max",
        "auth/token/renew",
        json!({"token": "${tok_explicit}", "increment": "10h"}),
    );
    s.post(
        "renew-self full without body",
        "auth/token/renew-self",
        json!(null),
    )
    .as_("tok_full");

    // --- tokens: roles.
    s.post(
        "token role write",
        "auth/token/roles/r1",
        json!({"allowed_policies": ["reader"], "orphan": true, "token_period": "1h",
               "renewable": true}),
    );
    s.get("token role read", "auth/token/roles/r1");
    s.list("token roles list", "auth/token/roles");
    s.post(
        "token create with role",
        "auth/token/create/r1",
        json!({"policies": ["reader"]}),
    )
    .cap("tok_role", "/auth/client_token");
    s.post(
        "token create with role bad policy",
        "auth/token/create/r1",
        json!({"policies": ["writer"]}),
    );
    s.get("lookup-self role token", "auth/token/lookup-self")
        .as_("tok_role");
    // Role fields: the older names, token types, lifetimes and policy bounds.
    s.post(
        "token role write old names",
        "auth/token/roles/r2",
        json!({"period": "30m", "explicit_max_ttl": "5h", "orphan": true, "token_ttl": "1h",
               "token_max_ttl": "2h"}),
    );
    s.get("token role read old names", "auth/token/roles/r2");
    s.post(
        "token create with role old names",
        "auth/token/create/r2",
        json!({"policies": ["reader"], "period": "1h"}),
    );
    s.post(
        "token role write batch non-orphan",
        "auth/token/roles/rb",
        json!({"token_type": "batch"}),
    );
    s.post(
        "token role write batch renewable",
        "auth/token/roles/rb",
        json!({"token_type": "batch", "orphan": true}),
    );
    s.post(
        "token role write bad type",
        "auth/token/roles/rb",
        json!({"token_type": "bogus"}),
    );
    s.get("token role read refused", "auth/token/roles/rb");
    s.post(
        "token role write typed",
        "auth/token/roles/r3",
        json!({"token_type": "service", "renewable": false, "allowed_policies": ["reader", "writer"],
               "disallowed_policies": ["tokmaker"], "token_explicit_max_ttl": "2h"}),
    );
    s.get("token role read typed", "auth/token/roles/r3");
    s.post(
        "token create with role typed",
        "auth/token/create/r3",
        json!({"policies": ["reader"], "type": "batch", "ttl": "5h", "renewable": true}),
    )
    .cap("tok_role3", "/auth/client_token");
    s.get("lookup-self role typed token", "auth/token/lookup-self")
        .as_("tok_role3");
    s.post(
        "token create with role outside allowed",
        "auth/token/create/r3",
        json!({"policies": ["tokmaker"]}),
    );
    s.post(
        "token create with role allowed by default",
        "auth/token/create/r3",
        json!({}),
    );
    s.post(
        "token role write disallowed only",
        "auth/token/roles/r5",
        json!({"disallowed_policies": ["tokmaker"]}),
    );
    s.post(
        "token create with role disallowed",
        "auth/token/create/r5",
        json!({"policies": ["tokmaker"]}),
    );
    s.post(
        "token create with role no_parent ignored",
        "auth/token/create/r5",
        json!({"policies": ["reader"], "no_parent": true}),
    );
    s.post(
        "token role write default-batch",
        "auth/token/roles/r4",
        json!({"token_type": "default-batch", "orphan": true, "renewable": false}),
    );
    s.get("token role read default-batch", "auth/token/roles/r4");
    s.post(
        "token create with role default-batch",
        "auth/token/create/r4",
        json!({"policies": ["reader"]}),
    );
    s.post(
        "token create with role default-batch as service",
        "auth/token/create/r4",
        json!({"policies": ["reader"], "type": "service"}),
    );
    s.post(
        "token create with role default-batch root",
        "auth/token/create/r4",
        json!({}),
    );
    s.get("token role read missing", "auth/token/roles/missing");
    s.delete("token role delete", "auth/token/roles/r1");
    s.list("token roles list after delete", "auth/token/roles");

    // --- sys: capabilities.
    s.post(
        "capabilities root",
        "sys/capabilities",
        json!({"token": "${root}", "path": "kv1/foo"}),
    );
    s.post(
        "capabilities reader paths",
        "sys/capabilities",
        json!({"token": "${tok_reader}", "paths": ["kv1/foo", "secret/x"]}),
    );
    s.post(
        "capabilities-self reader",
        "sys/capabilities-self",
        json!({"path": "kv1/foo"}),
    )
    .as_("tok_reader");
    s.post(
        "capabilities-self reader paths",
        "sys/capabilities-self",
        json!({"paths": ["kv1/foo", "sys/mounts"]}),
    )
    .as_("tok_reader");
    s.post(
        "capabilities-self root",
        "sys/capabilities-self",
        json!({"paths": ["a", "b/c"]}),
    );
    s.post(
        "capabilities-accessor reader",
        "sys/capabilities-accessor",
        json!({"accessor": "${acc_reader}", "path": "kv1/foo"}),
    );
    s.post(
        "capabilities unknown token",
        "sys/capabilities",
        json!({"token": "s.nothing", "path": "kv1/foo"}),
    );
    s.post(
        "capabilities no path",
        "sys/capabilities",
        json!({"token": "${tok_reader}"}),
    );
}
