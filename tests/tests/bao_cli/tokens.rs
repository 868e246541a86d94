//! Tokens, response wrapping, leases, audit devices and namespaces through the real `bao`.

use super::*;

/// `token` create (batch, role, orphan, period, use limit) / lookup / capabilities / renew /
/// revoke, response wrapping, `lease` lookup/renew/revoke (by prefix, forced), `audit`, and
/// `namespace`, on a dev server.
#[test]
fn tokens_wrapping_leases_audit_and_namespaces() {
    let s = Server::dev();
    let b = Bao::new(&s, Some(&s.root_token));
    b.ok(&["secrets", "enable", "-path=kv1", "kv"]);
    let dir = tmpdir("bao-cli-tokens");
    let file = dir.join("reader.hcl");
    std::fs::write(
        &file,
        "path \"kv1/*\" { capabilities = [\"read\", \"list\"] }\n",
    )
    .expect("write policy");
    b.ok(&[
        "policy",
        "write",
        "reader",
        file.to_str().unwrap_or_default(),
    ]);

    // token create: service, batch, from a role, orphan with a period, with a use limit
    let j = b.json(&[
        "token",
        "create",
        "-policy=reader",
        "-ttl=1h",
        "-format=json",
    ]);
    let a = &j["auth"];
    assert_eq!(strings(&a["policies"]), ["default", "reader"], "{j}");
    assert_eq!(
        (
            a["lease_duration"].clone(),
            a["renewable"].clone(),
            a["orphan"].clone()
        ),
        (json!(3600), json!(true), json!(false))
    );
    let tok = a["client_token"].as_str().expect("token").to_string();
    let acc = a["accessor"].as_str().expect("accessor").to_string();
    note_secret(&tok);
    let j = b.json(&[
        "token",
        "create",
        "-type=batch",
        "-policy=reader",
        "-format=json",
    ]);
    let batch = j["auth"]["client_token"]
        .as_str()
        .expect("batch")
        .to_string();
    note_secret(&batch);
    assert_eq!(j["auth"]["renewable"], json!(false), "{j}");
    assert_eq!(
        j["auth"]["accessor"],
        json!(""),
        "a batch token has no accessor: {j}"
    );
    let j = b.json(&["token", "lookup", "-format=json", &batch]);
    assert_eq!(j["data"]["type"], json!("batch"), "{j}");
    let o = b.ok(&[
        "write",
        "auth/token/roles/r1",
        "allowed_policies=reader",
        "orphan=true",
    ]);
    assert_eq!(o.line(), "Success! Data written to: auth/token/roles/r1");
    let j = b.json(&["token", "create", "-role=r1", "-format=json"]);
    assert_eq!(j["auth"]["orphan"], json!(true), "{j}");
    assert_eq!(strings(&j["auth"]["policies"]), ["default", "reader"]);
    let role_tok = j["auth"]["client_token"]
        .as_str()
        .expect("token")
        .to_string();
    note_secret(&role_tok);
    let j = b.json(&["token", "lookup", "-format=json", &role_tok]);
    assert_eq!(j["data"]["path"], json!("auth/token/create/r1"), "{j}");
    b.fails(&["token", "create", "-role=nope"], 2, "Code: 400");
    let j = b.json(&[
        "token",
        "create",
        "-orphan",
        "-period=30m",
        "-policy=default",
        "-format=json",
    ]);
    assert_eq!(
        (
            j["auth"]["orphan"].clone(),
            j["auth"]["lease_duration"].clone()
        ),
        (json!(true), json!(1800)),
        "{j}"
    );
    let periodic = j["auth"]["client_token"]
        .as_str()
        .expect("token")
        .to_string();
    note_secret(&periodic);
    let j = b.json(&["token", "lookup", "-format=json", &periodic]);
    assert_eq!(j["data"]["period"], json!(1800), "{j}");
    let j = b.json(&[
        "token",
        "create",
        "-use-limit=2",
        "-policy=reader",
        "-format=json",
    ]);
    let limited = j["auth"]["client_token"]
        .as_str()
        .expect("token")
        .to_string();
    note_secret(&limited);
    let j = b.json(&["token", "lookup", "-format=json", &limited]);
    assert_eq!(j["data"]["num_uses"], json!(2), "{j}");
    // Two uses: the second call spends the last one, then the token is gone.
    let l = b.with(&limited);
    l.ok(&["token", "lookup"]);
    l.ok(&["token", "lookup"]);
    l.fails(&["token", "lookup"], 2, "Code: 403");

    // lookup (table and by accessor), capabilities
    let o = b.ok(&["token", "lookup", &tok]);
    assert_eq!(o.field("policies"), "[default reader]");
    assert_eq!(o.field("accessor"), acc);
    let j = b.json(&["token", "lookup", "-format=json", "-accessor", &acc]);
    assert_eq!(j["data"]["accessor"], json!(acc), "{j}");
    assert_eq!(
        j["data"]["id"].as_str().unwrap_or(""),
        "",
        "no id by accessor: {j}"
    );
    assert_eq!(
        b.ok(&["token", "capabilities", &tok, "kv1/foo"]).line(),
        "list, read"
    );
    assert_eq!(
        b.ok(&["token", "capabilities", &tok, "sys/mounts"]).line(),
        "deny"
    );
    assert_eq!(b.ok(&["token", "capabilities", "kv1/foo"]).line(), "root");

    // renew: by token, by accessor, itself
    let j = b.json(&["token", "renew", "-increment=30m", "-format=json", &tok]);
    assert_eq!(j["auth"]["lease_duration"], json!(1800), "{j}");
    let o = b.ok(&["token", "renew", "-accessor", &acc]);
    assert_eq!(o.field("token_accessor"), acc);
    assert_eq!(o.field("token"), "n/a");
    let t = b.with(&tok);
    let j = t.json(&["token", "renew", "-increment=20m", "-format=json"]);
    assert_eq!(j["auth"]["client_token"], json!(tok), "{j}");
    assert_eq!(j["auth"]["lease_duration"], json!(1200));
    b.fails(&["token", "renew", &batch], 2, "Code: 400");

    // revoke: -self, -accessor, -mode=path, -mode=orphan, plain
    let o = t.ok(&["token", "revoke", "-self"]);
    assert_eq!(o.line(), "Success! Revoked token (if it existed)");
    b.fails(&["token", "lookup", &tok], 2, "Code: 403");
    let j = b.json(&["token", "create", "-policy=default", "-format=json"]);
    let (t2, a2) = (
        j["auth"]["client_token"].as_str().expect("t").to_string(),
        j["auth"]["accessor"].as_str().expect("a").to_string(),
    );
    note_secret(&t2);
    b.ok(&["token", "revoke", "-accessor", &a2]);
    b.fails(&["token", "lookup", &t2], 2, "Code: 403");
    b.ok(&["token", "revoke", "-mode=path", "auth/token/create/r1"]);
    b.fails(&["token", "lookup", &role_tok], 2, "Code: 403");
    let j = b.json(&["token", "create", "-format=json"]);
    let parent = j["auth"]["client_token"].as_str().expect("t").to_string();
    note_secret(&parent);
    let j = b
        .with(&parent)
        .json(&["token", "create", "-policy=default", "-format=json"]);
    let child = j["auth"]["client_token"].as_str().expect("t").to_string();
    note_secret(&child);
    b.ok(&["token", "revoke", "-mode=orphan", &parent]);
    b.fails(&["token", "lookup", &parent], 2, "Code: 403");
    let j = b.json(&["token", "lookup", "-format=json", &child]);
    assert_eq!(
        j["data"]["orphan"],
        json!(true),
        "the child survives as an orphan: {j}"
    );
    let o = b.ok(&["token", "revoke", &child]);
    assert_eq!(o.line(), "Success! Revoked token (if it existed)");
    b.fails(&["token", "lookup", &child], 2, "Code: 403");
    b.fails(&["token", "revoke"], 1, "Not enough arguments");

    // response wrapping: write -wrap-ttl, unwrap with the token as argument and without
    let j = b.json(&[
        "write",
        "-wrap-ttl=5m",
        "-format=json",
        "auth/token/create",
        "policies=default",
    ]);
    let w = &j["wrap_info"];
    assert_eq!(w["ttl"], json!(300), "{j}");
    assert_eq!(w["creation_path"], json!("auth/token/create"));
    let wtok = w["token"].as_str().expect("wrapping token").to_string();
    note_secret(&wtok);
    let j = b.json(&["unwrap", "-format=json", &wtok]);
    assert_eq!(strings(&j["auth"]["policies"]), ["default"], "{j}");
    b.fails(&["unwrap", &wtok], 2, "Code: 400");
    b.ok(&["kv", "put", "kv1/w", "z=1"]);
    let wtok = b
        .ok(&["read", "-wrap-ttl=5m", "-field=wrapping_token", "kv1/w"])
        .line()
        .to_string();
    note_secret(&wtok);
    let j = b.with(&wtok).json(&["unwrap", "-format=json"]);
    assert_eq!(j["data"], json!({"z": "1"}), "{j}");
    b.with(&wtok).fails(&["unwrap"], 2, "Code: 400");

    // leases: the token leases of a role's tokens
    b.ok(&["write", "auth/token/roles/lr", "allowed_policies=default"]);
    let mk = |n: usize| -> Vec<String> {
        (0..n)
            .map(|_| {
                let t = b
                    .ok(&["token", "create", "-role=lr", "-ttl=1h", "-field=token"])
                    .line()
                    .to_string();
                note_secret(&t);
                t
            })
            .collect()
    };
    let toks = mk(1);
    let j = b.json(&[
        "list",
        "-format=json",
        "sys/leases/lookup/auth/token/create/lr/",
    ]);
    let ids = strings(&j);
    assert_eq!(ids.len(), 1, "{j}");
    let lease = format!("auth/token/create/lr/{}", ids[0]);
    let j = b.json(&["lease", "lookup", "-format=json", &lease]);
    assert_eq!(j["data"]["id"], json!(lease), "{j}");
    assert_eq!(j["data"]["renewable"], json!(true));
    let ttl = j["data"]["ttl"].as_u64().expect("ttl");
    assert!(ttl > 3500 && ttl <= 3600, "{j}");
    let j = b.json(&["lease", "renew", "-increment=2h", "-format=json", &lease]);
    assert_eq!(
        (j["lease_id"].clone(), j["lease_duration"].clone()),
        (json!(lease), json!(7200)),
        "{j}"
    );
    let o = b.ok(&["lease", "revoke", &lease]);
    assert_eq!(o.line(), "All revocation operations queued successfully!");
    b.fails(&["token", "lookup", &toks[0]], 2, "Code: 403");
    let toks = mk(2);
    b.ok(&["lease", "revoke", "-prefix", "auth/token/create/lr"]);
    for t in &toks {
        b.fails(&["token", "lookup", t], 2, "Code: 403");
    }
    let toks = mk(1);
    let o = b.ok(&[
        "lease",
        "revoke",
        "-force",
        "-prefix",
        "auth/token/create/lr",
    ]);
    assert!(
        o.stdout
            .contains("Success! Force revoked any leases with prefix: auth/token/create/lr"),
        "{o:?}"
    );
    b.fails(&["token", "lookup", &toks[0]], 2, "Code: 403");
    b.fails(&["lease", "lookup", "kv1/w"], 2, "invalid lease");
    b.fails(&["lease", "renew", "kv1/nolease"], 2, "lease not found");
    b.fails(&["lease", "revoke", "-force", "kv1/w"], 1, "-prefix");

    // audit enable / list
    let log = dir.join("audit.log");
    let o = b.ok(&[
        "audit",
        "enable",
        "file",
        &format!("file_path={}", log.display()),
    ]);
    assert_eq!(o.line(), "Success! Enabled the file audit device at: file/");
    let j = b.json(&["audit", "list", "-format=json"]);
    assert_eq!(keys(&j), ["file/"], "{j}");
    assert_eq!(j["file/"]["type"], json!("file"));
    assert_eq!(
        j["file/"]["options"]["file_path"],
        json!(log.display().to_string())
    );
    let o = b.ok(&["audit", "list", "-detailed"]);
    assert!(
        o.stdout.contains(&format!("file_path={}", log.display())),
        "{o:?}"
    );
    b.ok(&["kv", "get", "kv1/w"]);
    let text = std::fs::read_to_string(&log).expect("audit log");
    assert!(text.contains("\"path\":\"kv1/w\""), "{text}");
    b.fails(
        &[
            "audit",
            "enable",
            "-path=file",
            "file",
            "file_path=/dev/null",
        ],
        2,
        "Code: 400",
    );

    // namespace create / list / lookup / delete
    let j = b.json(&["namespace", "create", "-format=json", "ns1"]);
    assert_eq!(j["path"], json!("ns1/"), "{j}");
    let j = b.json(&[
        "namespace",
        "create",
        "-namespace=ns1",
        "-format=json",
        "team",
    ]);
    assert_eq!(j["path"], json!("ns1/team/"), "{j}");
    assert_eq!(
        strings(&b.json(&["namespace", "list", "-format=json"])),
        ["ns1/"]
    );
    assert_eq!(
        strings(&b.json(&["namespace", "list", "-namespace=ns1", "-format=json"])),
        ["team/"]
    );
    let o = b.ok(&["namespace", "lookup", "ns1"]);
    assert_eq!(o.field("path"), "ns1/");
    b.ok(&["secrets", "enable", "-namespace=ns1/team", "-path=kv", "kv"]);
    b.ok(&["kv", "put", "-namespace=ns1/team", "kv/a", "b=1"]);
    let j = b.json(&["kv", "get", "-namespace=ns1/team", "-format=json", "kv/a"]);
    assert_eq!(j["data"], json!({"b": "1"}), "{j}");
    b.fails(&["kv", "get", "kv/a"], 2, "");
    // A namespace with child namespaces is refused; one that holds mounts and data is
    // deleted with them, as the reference does.
    b.fails(
        &["namespace", "delete", "ns1"],
        2,
        "unable to delete namespace containing child namespaces",
    );
    let o = b.ok(&["namespace", "delete", "-namespace=ns1", "team"]);
    assert_eq!(o.line(), "Success! Namespace deletion scheduled: team/");
    let o = b.ok(&["namespace", "delete", "ns1"]);
    assert_eq!(o.line(), "Success! Namespace deletion scheduled: ns1/");
    b.fails(&["namespace", "list"], 2, "No namespaces found");
    b.fails(&["namespace", "lookup", "ns1"], 2, "");
}
