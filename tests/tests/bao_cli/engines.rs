//! The LDAP login, KV v2 and raft snapshots through the real `bao`.

use super::*;

/// `bao login -method=ldap` against a real slapd: the token is stored in the CLI's token
/// helper (`~/.vault-token`) and used by later commands; a wrong password is refused.
#[test]
fn ldap_login_with_the_real_cli() {
    let d = start_dev_ldap("bao-cli");
    let s = Server::dev();
    let root = Bao::new(&s, Some(&s.root_token));
    let base = &d["CAIRN_LDAP_BASE"];
    let o = root.ok(&[
        "write",
        "auth/ldap/config",
        &format!("url={}", d["CAIRN_LDAP_URL"]),
        &format!("binddn={}", d["CAIRN_LDAP_BINDDN"]),
        &format!("bindpass={}", d["CAIRN_LDAP_BINDPASS"]),
        &format!("userdn=ou=people,{base}"),
        "userattr=uid",
        &format!("groupdn=ou=groups,{base}"),
    ]);
    assert_eq!(o.line(), "Success! Data written to: auth/ldap/config");
    root.ok(&["write", "auth/ldap/groups/engineers", "policies=eng"]);

    let u = Bao::new(&s, None);
    let j = u.json(&[
        "login",
        "-method=ldap",
        "-format=json",
        "username=alice",
        "password=alice-pw",
    ]);
    let a = &j["auth"];
    assert!(strings(&a["policies"]).contains(&"eng".to_string()), "{j}");
    assert_eq!(a["metadata"]["username"], json!("alice"), "{j}");
    let tok = a["client_token"].as_str().expect("token").to_string();
    note_secret(&tok);
    let stored = std::fs::read_to_string(u.home.join(".vault-token")).expect("stored token");
    assert_eq!(stored.trim(), tok);
    // Later commands use the stored token.
    let j = u.json(&["token", "lookup", "-format=json"]);
    assert_eq!(j["data"]["display_name"], json!("ldap-alice"), "{j}");
    assert_eq!(j["data"]["path"], json!("auth/ldap/login/alice"));
    let o = u.ok(&[
        "login",
        "-method=ldap",
        "-no-store",
        "username=bob",
        "password=bob-pw",
    ]);
    assert!(
        o.stdout.contains("Success! You are now authenticated."),
        "{o:?}"
    );
    assert_eq!(o.field("token_policies"), "[\"default\"]");
    u.fails(
        &["login", "-method=ldap", "username=alice", "password=wrong"],
        2,
        "Code: 400",
    );
    u.fails(
        &[
            "login",
            "-method=ldap",
            "-path=nope",
            "username=a",
            "password=b",
        ],
        2,
        "",
    );
}

/// KV version 2 through `bao kv` (put/get/list/delete/patch/metadata/undelete/destroy, with
/// `-mount=` too).
#[test]
fn kv_v2_with_the_real_cli() {
    let s = Server::dev();
    let b = Bao::new(&s, Some(&s.root_token));
    b.ok(&["secrets", "enable", "-path=kv2", "-version=2", "kv"]);
    let j = b.json(&["secrets", "list", "-format=json"]);
    assert_eq!(j["kv2/"]["options"]["version"], json!("2"), "{j}");

    let o = b.ok(&["kv", "put", "kv2/app", "a=1", "b=2"]);
    assert!(o.stdout.contains("Secret Path"), "{o:?}");
    assert_eq!(o.field("version"), "1");
    let j = b.json(&["kv", "put", "-mount=kv2", "-format=json", "app", "a=10"]);
    assert_eq!(j["data"]["version"], json!(2), "{j}");
    let j = b.json(&["kv", "get", "-format=json", "kv2/app"]);
    assert_eq!(j["data"]["data"], json!({"a": "10"}), "{j}");
    assert_eq!(j["data"]["metadata"]["version"], json!(2));
    let j = b.json(&[
        "kv",
        "get",
        "-version=1",
        "-format=json",
        "-mount=kv2",
        "app",
    ]);
    assert_eq!(j["data"]["data"], json!({"a": "1", "b": "2"}), "{j}");
    assert_eq!(b.ok(&["kv", "get", "-field=a", "kv2/app"]).line(), "10");
    b.ok(&["kv", "put", "kv2/dir/x", "y=1"]);
    assert_eq!(
        strings(&b.json(&["kv", "list", "-format=json", "kv2"])),
        ["app", "dir/"]
    );
    assert_eq!(
        strings(&b.json(&["kv", "list", "-format=json", "-mount=kv2", "dir"])),
        ["x"]
    );

    // patch
    let j = b.json(&["kv", "patch", "-format=json", "kv2/app", "c=3"]);
    assert_eq!(j["data"]["version"], json!(3), "{j}");
    let j = b.json(&["kv", "get", "-format=json", "kv2/app"]);
    assert_eq!(j["data"]["data"], json!({"a": "10", "c": "3"}), "{j}");
    b.fails(&["kv", "patch", "kv2/missing", "a=1"], 2, "");

    // metadata
    let j = b.json(&["kv", "metadata", "get", "-format=json", "kv2/app"]);
    assert_eq!(j["data"]["current_version"], json!(3), "{j}");
    assert_eq!(keys(&j["data"]["versions"]), ["1", "2", "3"]);
    b.ok(&["kv", "metadata", "put", "-max-versions=5", "kv2/app"]);
    let j = b.json(&["kv", "metadata", "get", "-format=json", "-mount=kv2", "app"]);
    assert_eq!(j["data"]["max_versions"], json!(5), "{j}");

    // delete / undelete / destroy
    let o = b.ok(&["kv", "delete", "kv2/app"]);
    assert_eq!(
        o.line(),
        "Success! Data deleted (if it existed) at: kv2/data/app"
    );
    // As the reference: a soft-deleted latest version shows its metadata (with its
    // deletion_time) and exits 0.
    let o = b.step(&["kv", "get", "kv2/app"], 0);
    assert!(o.stdout.contains("deletion_time"), "{o:?}");
    let o = b.ok(&["kv", "undelete", "-versions=3", "kv2/app"]);
    assert!(
        o.stdout
            .contains("Success! Data written to: kv2/undelete/app"),
        "{o:?}"
    );
    assert_eq!(b.ok(&["kv", "get", "-field=c", "kv2/app"]).line(), "3");
    let o = b.ok(&["kv", "destroy", "-versions=1", "kv2/app"]);
    assert!(
        o.stdout
            .contains("Success! Data written to: kv2/destroy/app"),
        "{o:?}"
    );
    let j = b.json(&["kv", "metadata", "get", "-format=json", "kv2/app"]);
    assert_eq!(j["data"]["versions"]["1"]["destroyed"], json!(true), "{j}");
    b.ok(&["kv", "delete", "-versions=2", "-mount=kv2", "app"]);
    let j = b.json(&["kv", "metadata", "get", "-format=json", "kv2/app"]);
    assert_ne!(
        j["data"]["versions"]["2"]["deletion_time"],
        json!(""),
        "{j}"
    );
    let o = b.ok(&["kv", "metadata", "delete", "kv2/app"]);
    assert!(o.stdout.contains("Success! Data deleted"), "{o:?}");
    b.step(&["kv", "metadata", "get", "kv2/app"], 2);
}

/// `bao operator raft snapshot restore` (a POST of the file to `sys/storage/raft/snapshot`)
/// restores a snapshot `cairn operator snapshot save` wrote, and relays the server's
/// refusals: a damaged file, and `-force` (another cluster's file). Its `save` writes the
/// file too but then checks it as a raft archive, which a Cairn snapshot is not (exit 2).
#[test]
fn raft_snapshot_restore_with_the_real_cli() {
    let s = Server::dev();
    let b = Bao::new(&s, Some(&s.root_token));
    b.ok(&["write", "secret/snap", "v=1"]);
    let dir = tmpdir("bao-snap");
    let file = dir.path().join("backup.snap");
    let f = file.to_str().expect("path");
    let o = Command::new(cairn_tests::cairn_bin())
        .args(["operator", "snapshot", "save", f])
        .env("CAIRN_ADDR", &s.addr)
        .env("CAIRN_TOKEN", &s.root_token)
        .env("HOME", b.home.path())
        .output()
        .expect("run cairn");
    assert!(o.status.success(), "{o:?}");
    b.ok(&["write", "secret/snap", "v=2"]);
    b.ok(&["write", "secret/late", "v=3"]);
    let bytes = std::fs::read(&file).expect("snapshot");
    let bad = dir.path().join("bad.snap");
    std::fs::write(&bad, &bytes[..bytes.len() / 2]).expect("write");
    b.fails(
        &[
            "operator",
            "raft",
            "snapshot",
            "restore",
            bad.to_str().expect("path"),
        ],
        2,
        "truncated",
    );
    b.fails(
        &["operator", "raft", "snapshot", "restore", "-force", f],
        2,
        "snapshot-force is not supported",
    );
    assert_eq!(
        b.json(&["read", "-format=json", "secret/snap"])["data"]["v"],
        json!("2")
    );
    b.ok(&["operator", "raft", "snapshot", "restore", f]);
    assert_eq!(
        b.json(&["read", "-format=json", "secret/snap"])["data"]["v"],
        json!("1")
    );
    b.step(&["read", "secret/late"], 2);
}
