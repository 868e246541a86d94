//! The differential script, part: KV version 1 and 2 and response wrapping.

use super::*;

/// Adds this part's requests to `s`.
pub(super) fn add(s: &mut Script) {
    // --- KV version 1 at kv1/.
    s.put("kv1 write foo", "kv1/foo", json!({"a": "b", "n": 1}));
    s.get("kv1 read foo", "kv1/foo");
    s.put("kv1 write dir/bar", "kv1/dir/bar", json!({"x": true}));
    s.put(
        "kv1 write ttl",
        "kv1/withttl",
        json!({"ttl": "30m", "v": "x"}),
    );
    s.get("kv1 read ttl", "kv1/withttl");
    s.list("kv1 list root", "kv1/");
    s.get("kv1 list via get", "kv1/?list=true");
    s.list("kv1 list dir", "kv1/dir");
    s.list("kv1 list missing", "kv1/nothing/");
    s.get("kv1 read missing", "kv1/missing");
    s.get("kv1 read as reader", "kv1/dir/bar").as_("tok_reader");
    s.list("kv1 list as reader", "kv1/").as_("tok_reader");
    s.put("kv1 write as reader", "kv1/nope", json!({"a": 1}))
        .as_("tok_reader");
    s.put("kv1 write as full", "kv1/byfull", json!({"a": 1}))
        .as_("tok_full");
    s.get("kv1 read without token", "kv1/foo").anon();
    s.put("kv1 write empty body", "kv1/empty", json!({}));
    s.post("kv1 post", "kv1/posted", json!({"p": "q"}));
    s.get("kv1 read wrapped", "kv1/foo")
        .wrap("2m")
        .cap("wrap_kv", "/wrap_info/token");
    s.delete("kv1 delete foo", "kv1/foo");
    s.get("kv1 read deleted", "kv1/foo");
    s.delete("kv1 delete missing", "kv1/foo");
    s.get("secret kv2 read missing", "secret/data/nothing");

    // --- KV version 2 at kvv2/ (enabled as kv-v2) and kvv2b/ (kv with options.version 2).
    s.post(
        "kv2 mount kv-v2",
        "sys/mounts/kvv2",
        json!({"type": "kv-v2"}),
    );
    s.post(
        "kv2 mount options version 2",
        "sys/mounts/kvv2b",
        json!({"type": "kv", "options": {"version": "2"}}),
    );
    s.post(
        "kv2 mount version 3",
        "sys/mounts/kvv3",
        json!({"type": "kv", "options": {"version": "3"}}),
    );
    s.get("kv2 read mount", "sys/mounts/kvv2");
    s.get("kv2 read mount b", "sys/mounts/kvv2b");
    s.get("kv2 tune read", "sys/mounts/kvv2/tune");
    s.get("kv2 ui mount", "sys/internal/ui/mounts/kvv2/foo");
    s.get("kv2 config read", "kvv2/config");
    s.post(
        "kv2 config write",
        "kvv2b/config",
        json!({"max_versions": 3, "cas_required": true, "delete_version_after": "2h"}),
    );
    s.get("kv2 config read after", "kvv2b/config");
    s.put(
        "kv2 put b without cas",
        "kvv2b/data/c",
        json!({"data": {"a": 1}}),
    );
    s.put(
        "kv2 put b with cas",
        "kvv2b/data/c",
        json!({"data": {"a": 1}, "options": {"cas": 0}}),
    );
    s.put(
        "kv2 put",
        "kvv2/data/foo",
        json!({"data": {"a": "b", "n": {"x": 1}}}),
    );
    s.put(
        "kv2 put cas mismatch",
        "kvv2/data/foo",
        json!({"data": {"a": "c"}, "options": {"cas": 0}}),
    );
    s.put(
        "kv2 put cas match",
        "kvv2/data/foo",
        json!({"data": {"a": "c"}, "options": {"cas": 1}}),
    );
    s.put(
        "kv2 put bad cas",
        "kvv2/data/foo",
        json!({"data": {"a": "c"}, "options": {"cas": "x"}}),
    );
    s.put("kv2 put no data", "kvv2/data/foo", json!({"a": 1}));
    s.put(
        "kv2 put data not object",
        "kvv2/data/foo",
        json!({"data": "s"}),
    );
    s.post(
        "kv2 post",
        "kvv2/data/dir/bar",
        json!({"data": {"q": true}}),
    );
    s.get("kv2 read", "kvv2/data/foo");
    s.get("kv2 read version 1", "kvv2/data/foo?version=1");
    s.get("kv2 read version missing", "kvv2/data/foo?version=9");
    s.get("kv2 read missing", "kvv2/data/nothing");
    s.patch(
        "kv2 patch",
        "kvv2/data/foo",
        json!({"data": {"a": null, "z": "1", "n": {"y": 2}}}),
    );
    s.patch(
        "kv2 patch missing",
        "kvv2/data/nothing",
        json!({"data": {"a": 1}}),
    );
    // A PATCH that is not a JSON merge patch: 415 (another type) or 400 (none), before
    // anything else is looked at, even without a token.
    s.patch_as(
        "kv2 patch as plain json",
        "kvv2/data/foo",
        json!({"data": {"a": 1}}),
        Some("application/json"),
    );
    s.patch_as(
        "kv2 patch without content type",
        "kvv2/data/foo",
        json!({"data": {"a": 1}}),
        None,
    );
    s.patch_as(
        "kv2 patch as form",
        "kvv2/data/nothing",
        json!({"data": {"a": 1}}),
        Some("application/x-www-form-urlencoded"),
    );
    s.patch_as(
        "kv2 metadata patch as plain json",
        "kvv2/metadata/foo",
        json!({"max_versions": 3}),
        Some("application/json"),
    );
    s.patch_as(
        "kv2 patch as text without token",
        "kvv2/data/foo",
        json!({"data": {"a": 1}}),
        Some("text/plain"),
    )
    .anon();
    s.patch_as(
        "kv2 patch merge-patch with charset",
        "kvv2/data/foo",
        json!({"data": {"c": 3}}),
        Some("Application/Merge-Patch+JSON; charset=utf-8"),
    );
    s.patch("kv2 patch no data", "kvv2/data/foo", json!({}));
    s.patch(
        "kv2 patch cas mismatch",
        "kvv2/data/foo",
        json!({"data": {"a": 1}, "options": {"cas": 1}}),
    );
    s.get("kv2 read patched", "kvv2/data/foo");
    s.get("kv2 subkeys", "kvv2/subkeys/foo");
    s.get("kv2 subkeys depth", "kvv2/subkeys/foo?depth=1");
    s.get("kv2 subkeys missing", "kvv2/subkeys/nothing");
    s.get("kv2 metadata read", "kvv2/metadata/foo");
    s.get("kv2 metadata read missing", "kvv2/metadata/nothing");
    s.post(
        "kv2 metadata write",
        "kvv2/metadata/foo",
        json!({"max_versions": 2, "custom_metadata": {"owner": "me"}, "delete_version_after": "1h"}),
    );
    s.patch(
        "kv2 metadata patch",
        "kvv2/metadata/foo",
        json!({"custom_metadata": {"k": "v"}}),
    );
    s.patch(
        "kv2 metadata patch missing",
        "kvv2/metadata/nothing",
        json!({"max_versions": 1}),
    );
    s.post(
        "kv2 metadata create",
        "kvv2/metadata/newkey",
        json!({"max_versions": 3}),
    );
    s.get("kv2 metadata read new", "kvv2/metadata/newkey");
    s.get("kv2 read metadata-only key", "kvv2/data/newkey");
    s.put("kv2 put trims", "kvv2/data/foo", json!({"data": {"t": 1}}));
    s.get("kv2 metadata read trimmed", "kvv2/metadata/foo");
    s.list("kv2 metadata list", "kvv2/metadata");
    s.list("kv2 metadata list dir", "kvv2/metadata/dir");
    s.list("kv2 metadata list missing", "kvv2/metadata/nothing");
    s.delete("kv2 delete latest", "kvv2/data/foo");
    s.get("kv2 read deleted", "kvv2/data/foo");
    s.get("kv2 subkeys deleted", "kvv2/subkeys/foo");
    s.patch(
        "kv2 patch deleted",
        "kvv2/data/foo",
        json!({"data": {"a": 1}}),
    );
    s.post(
        "kv2 undelete",
        "kvv2/undelete/foo",
        json!({"versions": [4]}),
    );
    s.post("kv2 undelete no versions", "kvv2/undelete/foo", json!({}));
    s.post(
        "kv2 delete versions",
        "kvv2/delete/foo",
        json!({"versions": [3, 7]}),
    );
    s.post(
        "kv2 delete no versions",
        "kvv2/delete/foo",
        json!({"versions": []}),
    );
    s.post(
        "kv2 delete missing key",
        "kvv2/delete/nothing",
        json!({"versions": [1]}),
    );
    s.put("kv2 destroy", "kvv2/destroy/foo", json!({"versions": [3]}));
    s.get("kv2 read destroyed", "kvv2/data/foo?version=3");
    s.post(
        "kv2 destroy missing key",
        "kvv2/destroy/nothing",
        json!({"versions": [1]}),
    );
    s.get("kv2 read mount root", "kvv2/");
    s.get("kv2 read invalid path", "kvv2/other/x");
    s.put("kv2 put empty key", "kvv2/data/", json!({"data": {"a": 1}}));
    s.delete("kv2 metadata delete", "kvv2/metadata/foo");
    s.get("kv2 metadata read deleted", "kvv2/metadata/foo");
    s.delete("kv2 metadata delete again", "kvv2/metadata/foo");
    s.put(
        "kv2 policy write",
        "sys/policies/acl/kv2writer",
        json!({"policy": "path \"kvv2/data/*\" { capabilities = [\"create\", \"read\"] }\npath \"kvv2/metadata/*\" { capabilities = [\"list\"] }"}),
    );
    s.post(
        "kv2 token create",
        "auth/token/create",
        json!({"policies": ["kv2writer"], "ttl": "1h"}),
    )
    .cap("tok_kv2", "/auth/client_token");
    s.put(
        "kv2 create as writer",
        "kvv2/data/w",
        json!({"data": {"a": 1}}),
    )
    .as_("tok_kv2");
    s.put(
        "kv2 update as writer",
        "kvv2/data/w",
        json!({"data": {"a": 2}}),
    )
    .as_("tok_kv2");
    s.get("kv2 read as writer", "kvv2/data/w").as_("tok_kv2");
    s.patch(
        "kv2 patch as writer",
        "kvv2/data/w",
        json!({"data": {"a": 3}}),
    )
    .as_("tok_kv2");
    s.list("kv2 list as writer", "kvv2/metadata").as_("tok_kv2");
    s.get("kv2 metadata as writer", "kvv2/metadata/w")
        .as_("tok_kv2");
    s.put("kv1 upgrade write", "kv-up/old", json!({"x": 1}));
    s.post(
        "kv1 upgrade tune",
        "sys/mounts/kv-up/tune",
        json!({"options": {"version": "2"}}),
    );
    s.get("kv1 upgrade tune read", "sys/mounts/kv-up/tune");
    s.get("kv1 upgrade read", "kv-up/data/old");
    s.post(
        "kv1 upgrade downgrade",
        "sys/mounts/kv-up/tune",
        json!({"options": {"version": "1"}}),
    );

    // --- wrapping.
    s.post("wrap data", "sys/wrapping/wrap", json!({"a": "b", "n": 2}))
        .wrap("5m")
        .cap("wrap1", "/wrap_info/token")
        .cap("wrap1_accessor", "/wrap_info/accessor");
    s.post("wrap without ttl", "sys/wrapping/wrap", json!({"a": "b"}));
    s.post("wrap with bad ttl", "sys/wrapping/wrap", json!({"a": "b"}))
        .wrap("bogus");
    s.post(
        "wrapping lookup",
        "sys/wrapping/lookup",
        json!({"token": "${wrap1}"}),
    )
    .anon();
    s.post(
        "wrapping lookup with root",
        "sys/wrapping/lookup",
        json!({"token": "${wrap1}"}),
    );
    s.post(
        "wrapping lookup bogus",
        "sys/wrapping/lookup",
        json!({"token": "s.bogus"}),
    )
    .anon();
    s.post(
        "wrapping rewrap",
        "sys/wrapping/rewrap",
        json!({"token": "${wrap1}"}),
    )
    .cap("wrap2", "/wrap_info/token");
    s.post(
        "wrapping unwrap rewrapped-away",
        "sys/wrapping/unwrap",
        json!({"token": "${wrap1}"}),
    );
    s.post("wrapping unwrap self", "sys/wrapping/unwrap", json!(null))
        .as_("wrap2");
    s.post(
        "wrapping unwrap self again",
        "sys/wrapping/unwrap",
        json!(null),
    )
    .as_("wrap2");
    s.post(
        "wrapping unwrap token create",
        "sys/wrapping/unwrap",
        json!({"token": "${wrap_tok}"}),
    );
    s.post(
        "wrapping unwrap kv",
        "sys/wrapping/unwrap",
        json!({"token": "${wrap_kv}"}),
    );
    s.post(
        "wrapping unwrap bogus",
        "sys/wrapping/unwrap",
        json!({"token": "s.bogus"}),
    );
    s.post("wrap for lookup-self", "sys/wrapping/wrap", json!({"z": 1}))
        .wrap("90s")
        .cap("wrap3", "/wrap_info/token");
    s.get("lookup-self wrapping token", "auth/token/lookup-self")
        .as_("wrap3");
    s.post(
        "wrapping unwrap wrap3",
        "sys/wrapping/unwrap",
        json!({"token": "${wrap3}"}),
    );
}
