//! The `cairn` command-line client run as a real process against a real dev server (and an
//! uninitialised SQLite server for `operator`): outputs, stored token, exit codes.

use cairn_tests::{cairn_bin, free_port_pair, tmpdir, KillOnDrop, Server, TempDir};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The sample directory of `scripts/dev-ldap.sh` (one for this test binary, stopped when it
/// exits): its `export` lines.
fn directory() -> &'static BTreeMap<String, String> {
    static DIR: OnceLock<BTreeMap<String, String>> = OnceLock::new();
    DIR.get_or_init(|| cairn_tests::start_dev_ldap("cli"))
}

/// A dev server whose `auth/ldap` uses the sample directory; `engineers` maps to `eng`.
fn ldap_server() -> Server {
    let d = directory();
    let base = &d["CAIRN_LDAP_BASE"];
    let s = Server::dev();
    let r = s.post(
        "auth/ldap/config",
        json!({
            "url": d["CAIRN_LDAP_URL"],
            "binddn": d["CAIRN_LDAP_BINDDN"],
            "bindpass": d["CAIRN_LDAP_BINDPASS"],
            "userdn": format!("ou=people,{base}"),
            "userattr": "uid",
            "groupdn": format!("ou=groups,{base}"),
        }),
    );
    assert!(r.status == 204, "ldap config: {r:?}");
    let r = s.post("auth/ldap/groups/engineers", json!({"policies": "eng"}));
    assert!(r.status == 204, "group mapping: {r:?}");
    s
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout))
    }
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// A CLI user: a home directory (for ~/.cairn-token), an address and maybe a token.
struct User {
    addr: String,
    /// Shared by the users made from this one (`home: u.home.clone()`).
    home: std::sync::Arc<TempDir>,
    token: Option<String>,
}

impl User {
    fn new(s: &Server, token: Option<&str>) -> User {
        User {
            addr: s.addr.clone(),
            home: std::sync::Arc::new(tmpdir("cli-home")),
            token: token.map(str::to_string),
        }
    }

    fn run_with(&self, args: &[&str], stdin: Option<&str>, env: &[(&str, &str)]) -> Out {
        let mut cmd = Command::new(cairn_bin());
        cmd.args(args)
            .env("HOME", self.home.path())
            .env("CAIRN_ADDR", &self.addr)
            .env_remove("CAIRN_TOKEN")
            .env_remove("CAIRN_FORMAT")
            .env_remove("CAIRN_NAMESPACE")
            .env_remove("CAIRN_CACERT")
            .env_remove("CAIRN_CAPATH")
            .env_remove("CAIRN_SKIP_VERIFY")
            .env_remove("CAIRN_WRAP_TTL")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(t) = &self.token {
            cmd.env("CAIRN_TOKEN", t);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn cairn");
        {
            let mut si = child.stdin.take().expect("stdin");
            if let Some(s) = stdin {
                si.write_all(s.as_bytes()).expect("write stdin");
            }
        }
        let o = child.wait_with_output().expect("wait cairn");
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    fn run(&self, args: &[&str]) -> Out {
        self.run_with(args, None, &[])
    }

    fn ok(&self, args: &[&str]) -> Out {
        let o = self.run(args);
        assert_eq!(o.code, 0, "cairn {args:?}: {o:?}");
        o
    }
}

/// The value column of a `Key Value` table row.
fn row<'a>(out: &'a str, key: &str) -> Option<&'a str> {
    out.lines().find_map(|l| {
        let (k, v) = l.split_once("    ")?;
        (k.trim() == key).then(|| v.trim())
    })
}

#[test]
fn status_prints_the_seal_table_and_json() {
    let s = Server::dev();
    let u = User::new(&s, None);
    let o = u.ok(&["status"]);
    assert_eq!(row(&o.stdout, "Sealed"), Some("false"), "{o:?}");
    assert_eq!(row(&o.stdout, "Initialized"), Some("true"), "{o:?}");
    assert_eq!(row(&o.stdout, "Seal Type"), Some("shamir"), "{o:?}");
    let j = u.ok(&["status", "-format=json"]).json();
    assert_eq!(j["sealed"], Value::Bool(false));
    // The format can come from the environment too.
    let o = u.run_with(&["status"], None, &[("CAIRN_FORMAT", "json")]);
    assert_eq!(o.json()["initialized"], Value::Bool(true));
}

#[test]
fn write_read_list_delete_any_path() {
    let s = Server::dev();
    let u = User::new(&s, Some("root-e2e"));
    let file = u.home.join("cert.txt");
    std::fs::write(&file, "line one\nline two").expect("write file");
    let file_arg = format!("cert=@{}", file.display());
    let o = u.ok(&["write", "secret/app", "user=alice", "n=1", &file_arg]);
    assert!(
        o.stdout.contains("Success! Data written to: secret/app"),
        "{o:?}"
    );
    let o = u.run_with(
        &["write", "-format=json", "secret/json", "-"],
        Some(r#"{"nested": {"a": [1, 2]}, "flag": true}"#),
        &[],
    );
    assert_eq!(o.code, 0, "{o:?}");
    let o = u.run_with(
        &["write", "secret/pw", "password=-"],
        Some("from-stdin"),
        &[],
    );
    assert_eq!(o.code, 0, "{o:?}");

    let o = u.ok(&["read", "secret/app"]);
    assert_eq!(row(&o.stdout, "user"), Some("alice"), "{o:?}");
    assert_eq!(row(&o.stdout, "n"), Some("1"), "{o:?}");
    let o = u.ok(&["read", "-field=cert", "secret/app"]);
    assert_eq!(o.stdout, "line one\nline two\n");
    let j = u.ok(&["read", "--format=json", "secret/json"]).json();
    assert_eq!(j["data"]["nested"]["a"], serde_json::json!([1, 2]));
    assert_eq!(j["data"]["flag"], Value::Bool(true));
    let o = u.ok(&["read", "secret/pw", "-field", "password"]);
    assert_eq!(o.stdout.trim_end(), "from-stdin");

    let o = u.ok(&["list", "secret/"]);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines, vec!["Keys", "----", "app", "json", "pw"], "{o:?}");
    let j = u.ok(&["list", "-format=json", "secret"]).json();
    assert_eq!(j, serde_json::json!(["app", "json", "pw"]));

    let o = u.ok(&["delete", "secret/app"]);
    assert!(o
        .stdout
        .contains("Success! Data deleted (if it existed) at: secret/app"));
    let o = u.run(&["read", "secret/app"]);
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("No value found at secret/app"), "{o:?}");
    let o = u.run(&["read", "-field=nope", "secret/json"]);
    assert_eq!(o.code, 1, "{o:?}");
}

#[test]
fn exit_codes_and_server_messages() {
    let s = Server::dev();
    // No token: the server refuses; its message is on stderr and the exit code is 2.
    let anon = User::new(&s, None);
    let o = anon.run(&["read", "secret/x"]);
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("Error reading secret/x"), "{o:?}");
    assert!(o.stderr.contains("Code: 403"), "{o:?}");
    assert!(o.stderr.contains("* permission denied"), "{o:?}");
    assert!(o.stdout.is_empty(), "{o:?}");

    let u = User::new(&s, Some("root-e2e"));
    // The server's 400 message comes through.
    let o = u.run(&["write", "sys/policies/acl/broken", "policy=path {"]);
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("Code: 400"), "{o:?}");
    assert!(o.stderr.contains("* policy:"), "{o:?}");
    // Local errors exit 1: bad data argument, unknown flag, bad format, unreadable file.
    for args in [
        vec!["write", "secret/x", "novalue"],
        vec!["read", "-no-such-flag", "secret/x"],
        vec!["read", "-format=yaml", "secret/x"],
        vec!["write", "secret/x", "k=@/nonexistent/cairn-file"],
        vec!["policy", "write", "p", "/nonexistent/cairn.hcl"],
        vec!["token", "revoke"],
    ] {
        let o = u.run(&args);
        assert_eq!(o.code, 1, "cairn {args:?}: {o:?}");
        assert!(!o.stderr.is_empty(), "cairn {args:?}: {o:?}");
    }
    // Nobody listening: exit 2 with the address in the message.
    let port = free_port_pair();
    let addr = format!("http://127.0.0.1:{port}");
    let o = u.run_with(&["status"], None, &[("CAIRN_ADDR", &addr)]);
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains(&addr), "{o:?}");
    let o = u.run(&["status", "-address=ftp://x"]);
    assert_eq!(o.code, 1, "{o:?}");
    // Help is not an error.
    assert_eq!(u.run(&["read", "-help"]).code, 0);
}

#[test]
fn login_with_a_token_stores_it_for_later_commands() {
    let s = Server::dev();
    let u = User::new(&s, None);
    let o = u.ok(&["login", "root-e2e"]);
    assert!(
        o.stdout.contains("Success! You are now authenticated"),
        "{o:?}"
    );
    assert_eq!(row(&o.stdout, "token"), Some("root-e2e"), "{o:?}");
    assert_eq!(row(&o.stdout, "token_policies"), Some("[root]"), "{o:?}");
    let stored = std::fs::read_to_string(u.home.join(".cairn-token")).expect("token file");
    assert_eq!(stored, "root-e2e");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(u.home.join(".cairn-token"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "token file readable by others: {mode:o}");
    }
    // Later commands use the stored token.
    let o = u.ok(&["token", "lookup"]);
    assert_eq!(row(&o.stdout, "policies"), Some("[root]"), "{o:?}");
    assert_eq!(row(&o.stdout, "id"), Some("root-e2e"), "{o:?}");
    // A bad token is refused and not stored; the token prompt reads stdin when not a tty.
    let o = u.run_with(&["login", "-method=token"], Some("not-a-token\n"), &[]);
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("permission denied"), "{o:?}");
    assert_eq!(
        std::fs::read_to_string(u.home.join(".cairn-token")).expect("token file"),
        "root-e2e"
    );
    // -token-only prints just the token and stores nothing.
    let child = u
        .ok(&[
            "token",
            "create",
            "-policy=default",
            "-ttl=1h",
            "-field=token",
        ])
        .stdout
        .trim()
        .to_string();
    let o = u.ok(&["login", "-token-only", &child]);
    assert_eq!(o.stdout.trim(), child);
    assert_eq!(
        std::fs::read_to_string(u.home.join(".cairn-token")).expect("token file"),
        "root-e2e"
    );
    let j = u.ok(&["login", "-no-store", "-format=json", &child]).json();
    assert_eq!(j["auth"]["client_token"], Value::String(child.clone()));
}

#[test]
fn login_ldap_sends_username_and_prompted_password() {
    let s = Server::dev();
    let u = User::new(&s, None);
    // An auth mount that does not exist: the server's error, exit 2, nothing stored.
    let o = u.run(&[
        "login",
        "-method=ldap",
        "-path=nosuch",
        "username=alice",
        "password=x",
    ]);
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("Error authenticating"), "{o:?}");
    assert!(
        o.stderr.contains("/v1/auth/nosuch/login/alice"),
        "the request goes to the mount's login path: {o:?}"
    );
    assert!(!u.home.join(".cairn-token").exists());
    // Without password=, the password is read (no echo on a tty; here from stdin).
    let o = u.run_with(
        &["login", "-method=ldap", "username=alice"],
        Some("wrong\n"),
        &[],
    );
    assert_ne!(o.code, 0, "{o:?}");
    assert!(
        !o.stdout.contains("wrong") && !o.stderr.contains("wrong"),
        "{o:?}"
    );
    assert!(!u.home.join(".cairn-token").exists());
    let o = u.run(&["login", "-method=kerberos"]);
    assert_eq!(o.code, 1, "{o:?}");
}

#[test]
fn token_create_lookup_renew_revoke() {
    let s = Server::dev();
    let u = User::new(&s, Some("root-e2e"));
    let o = u.ok(&["token", "create", "-policy=default", "-ttl=1h"]);
    let t = row(&o.stdout, "token").expect("token row").to_string();
    assert_eq!(row(&o.stdout, "token_duration"), Some("1h"), "{o:?}");
    let o = u.ok(&["token", "lookup", &t]);
    assert_eq!(row(&o.stdout, "policies"), Some("[default]"), "{o:?}");
    let accessor = row(&o.stdout, "accessor").expect("accessor").to_string();
    let o = u.ok(&["token", "lookup", "-accessor", &accessor]);
    assert_eq!(row(&o.stdout, "policies"), Some("[default]"), "{o:?}");
    let j = u.ok(&["token", "lookup", "-format=json", &t]).json();
    assert_eq!(j["data"]["id"], Value::String(t.clone()));

    let o = u.ok(&["token", "renew", "-increment=30m", &t]);
    assert_eq!(row(&o.stdout, "token"), Some(t.as_str()), "{o:?}");
    // The token renews itself with its own identity.
    let me = User {
        addr: u.addr.clone(),
        home: u.home.clone(),
        token: Some(t.clone()),
    };
    me.ok(&["token", "renew"]);
    let o = me.ok(&["token", "lookup", "-field=display_name"]);
    assert!(!o.stdout.trim().is_empty(), "{o:?}");

    let o = u.ok(&["token", "revoke", &t]);
    assert!(o.stdout.contains("Success! Revoked token"), "{o:?}");
    let o = u.run(&["token", "lookup", &t]);
    assert_eq!(o.code, 2, "{o:?}");
    let o = me.run(&["token", "lookup"]);
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("permission denied"), "{o:?}");

    let t2 = u
        .ok(&["token", "create", "-field=token"])
        .stdout
        .trim()
        .to_string();
    let me2 = User {
        addr: u.addr.clone(),
        home: u.home.clone(),
        token: Some(t2),
    };
    me2.ok(&["token", "revoke", "-self"]);
    assert_eq!(me2.run(&["token", "lookup"]).code, 2);
}

#[test]
fn policies_limit_what_a_token_can_do() {
    let s = Server::dev();
    let u = User::new(&s, Some("root-e2e"));
    let hcl = u.home.join("team.hcl");
    std::fs::write(
        &hcl,
        "path \"secret/team/*\" { capabilities = [\"create\", \"read\", \"update\", \"list\"] }\n",
    )
    .expect("write policy");
    let o = u.ok(&["policy", "write", "team", &hcl.display().to_string()]);
    assert!(o.stdout.contains("Success! Uploaded policy: team"), "{o:?}");
    let o = u.run_with(
        &["policy", "write", "ro", "-"],
        Some("path \"secret/*\" { capabilities = [\"read\"] }"),
        &[],
    );
    assert_eq!(o.code, 0, "{o:?}");
    let o = u.ok(&["policy", "list"]);
    let names: Vec<&str> = o.stdout.lines().collect();
    for n in ["default", "ro", "root", "team"] {
        assert!(names.contains(&n), "{n} missing: {o:?}");
    }
    let o = u.ok(&["policy", "read", "team"]);
    assert!(o.stdout.contains("secret/team/*"), "{o:?}");

    let t = u
        .ok(&["token", "create", "-policy=team", "-field=token"])
        .stdout
        .trim()
        .to_string();
    let member = User {
        addr: u.addr.clone(),
        home: u.home.clone(),
        token: Some(t),
    };
    member.ok(&["write", "secret/team/a", "v=1"]);
    let o = member.run(&["write", "secret/other", "v=1"]);
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("permission denied"), "{o:?}");

    let o = u.ok(&["policy", "delete", "team"]);
    assert!(o.stdout.contains("Success! Deleted policy: team"), "{o:?}");
    let o = u.run(&["policy", "read", "team"]);
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("No policy named: team"), "{o:?}");
}

#[test]
fn secrets_and_auth_enable_list_disable() {
    let s = Server::dev();
    let u = User::new(&s, Some("root-e2e"));
    let o = u.ok(&[
        "secrets",
        "enable",
        "-path=team-kv",
        "-description=team data",
        "kv",
    ]);
    assert!(
        o.stdout
            .contains("Success! Enabled the kv secrets engine at: team-kv/"),
        "{o:?}"
    );
    let o = u.ok(&["secrets", "list"]);
    let line = o
        .stdout
        .lines()
        .find(|l| l.starts_with("team-kv/"))
        .unwrap_or_else(|| panic!("no team-kv/ row: {o:?}"));
    assert!(line.contains("kv") && line.ends_with("team data"), "{line}");
    assert!(
        o.stdout
            .lines()
            .next()
            .unwrap_or_default()
            .starts_with("Path"),
        "{o:?}"
    );
    assert!(o.stdout.lines().any(|l| l.starts_with("secret/")), "{o:?}");
    u.ok(&["write", "team-kv/x", "a=b"]);
    let j = u.ok(&["secrets", "list", "-format=json"]).json();
    assert_eq!(j["team-kv/"]["type"], Value::String("kv".into()));
    u.ok(&["secrets", "enable", "-version=2", "-path=v2", "kv"]);
    let j = u.ok(&["secrets", "list", "-format=json"]).json();
    assert_eq!(j["v2/"]["options"]["version"], Value::String("2".into()));
    let o = u.run(&["secrets", "enable", "-version=3", "-path=v3", "kv"]);
    assert_eq!(o.code, 2, "{o:?}");
    u.ok(&["secrets", "disable", "v2"]);
    let o = u.ok(&["secrets", "disable", "team-kv"]);
    assert!(o
        .stdout
        .contains("Success! Disabled the secrets engine (if it existed) at: team-kv/"));
    assert!(!u.ok(&["secrets", "list"]).stdout.contains("team-kv/"));

    let o = u.ok(&["auth", "list"]);
    assert!(
        o.stdout
            .lines()
            .any(|l| l.starts_with("ldap/") && l.contains("ldap")),
        "{o:?}"
    );
    assert!(o.stdout.lines().any(|l| l.starts_with("token/")), "{o:?}");
    let o = u.ok(&["auth", "enable", "-path=corp", "ldap"]);
    assert!(
        o.stdout
            .contains("Success! Enabled the ldap auth method at: corp/"),
        "{o:?}"
    );
    assert!(u
        .ok(&["auth", "list", "-detailed"])
        .stdout
        .contains("corp/"));
    u.ok(&["auth", "disable", "corp/"]);
    assert!(!u.ok(&["auth", "list"]).stdout.contains("corp/"));
    let o = u.run(&["auth", "enable", "nosuchtype"]);
    assert_eq!(o.code, 2, "{o:?}");
}

#[test]
fn operator_init_unseal_seal_on_a_fresh_server() {
    let dir = tmpdir("cli-operator");
    let s = Server::start(&dir, "");
    let u = User::new(&s, None);
    let o = u.run(&["operator", "init", "-status"]);
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stdout.contains("not initialized"), "{o:?}");
    let o = u.run(&["status"]);
    assert_eq!(o.code, 2, "sealed means exit 2: {o:?}");
    assert_eq!(row(&o.stdout, "Initialized"), Some("false"), "{o:?}");
    let o = u.run(&["operator", "init", "-key-shares=2", "-key-threshold=3"]);
    assert_eq!(o.code, 1, "{o:?}");

    let o = u.ok(&["operator", "init", "-key-shares=3", "-key-threshold=2"]);
    let keys: Vec<String> = o
        .stdout
        .lines()
        .filter_map(|l| {
            l.split_once(": ")
                .filter(|(k, _)| k.starts_with("Unseal Key "))
        })
        .map(|(_, v)| v.to_string())
        .collect();
    assert_eq!(keys.len(), 3, "{o:?}");
    let root = o
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("Initial Root Token: "))
        .expect("root token line")
        .to_string();
    assert_eq!(u.run(&["operator", "init", "-status"]).code, 0);

    let o = u.ok(&["operator", "unseal", &keys[0]]);
    assert_eq!(row(&o.stdout, "Sealed"), Some("true"), "{o:?}");
    assert_eq!(row(&o.stdout, "Unseal Progress"), Some("1/2"), "{o:?}");
    // The key is prompted when absent (stdin when not a terminal).
    let o = u.run_with(
        &["operator", "unseal"],
        Some(&format!("{}\n", keys[2])),
        &[],
    );
    assert_eq!(o.code, 0, "{o:?}");
    assert_eq!(row(&o.stdout, "Sealed"), Some("false"), "{o:?}");
    assert_eq!(u.run(&["status"]).code, 0);

    let o = u.run(&["operator", "seal"]);
    assert_eq!(o.code, 2, "sealing needs a token: {o:?}");
    let admin = User {
        addr: u.addr.clone(),
        home: u.home.clone(),
        token: Some(root),
    };
    let o = admin.ok(&["operator", "seal"]);
    assert!(o.stdout.contains("Success! Cairn is sealed."), "{o:?}");
    assert_eq!(u.run(&["status"]).code, 2);
    let o = admin.run(&["read", "secret/x"]);
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("sealed"), "{o:?}");
}

#[test]
fn wrapped_responses_unwrap_through_the_cli() {
    let s = Server::dev();
    let u = User::new(&s, Some("root-e2e"));
    u.ok(&["write", "secret/w", "k=v"]);
    let o = u.ok(&["read", "-wrap-ttl=5m", "secret/w"]);
    let wt = row(&o.stdout, "wrapping_token:")
        .expect("wrapping token")
        .to_string();
    assert_eq!(row(&o.stdout, "wrapping_token_ttl:"), Some("5m"), "{o:?}");
    let arg = format!("token={wt}");
    let o = u.ok(&["write", "sys/wrapping/unwrap", &arg]);
    assert_eq!(row(&o.stdout, "k"), Some("v"), "{o:?}");
    let o = u.run(&["write", "sys/wrapping/unwrap", &arg]);
    assert_eq!(o.code, 2, "single use: {o:?}");
}

#[test]
fn replication_status_shows_a_table_or_says_it_is_unavailable() {
    let s = Server::dev();
    let u = User::new(&s, Some("root-e2e"));
    let raw = s.get("sys/replication/status");
    let o = u.run(&["replication", "status"]);
    if raw.status == 404 {
        assert_eq!(o.code, 2, "{o:?}");
        assert!(o.stderr.contains("not available"), "{o:?}");
        assert!(!o.stderr.contains("panicked"), "{o:?}");
    } else {
        assert_eq!(o.code, 0, "{o:?}");
        let first = o.stdout.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("Mode") && first.contains("Last Remote WAL"),
            "{o:?}"
        );
        let j = u.ok(&["replication", "status", "-format=json"]).json();
        assert!(j.is_object());
    }
    let o = u.run(&["replication", "status", "-mode=bogus"]);
    assert_eq!(o.code, 1, "{o:?}");
}

#[test]
fn custom_ca_file_must_be_pem() {
    let s = Server::dev();
    let u = User::new(&s, None);
    let bad = u.home.join("ca.pem");
    std::fs::write(&bad, "not a certificate").expect("write");
    let o = u.run_with(
        &["status"],
        None,
        &[("CAIRN_CACERT", Path::new(&bad).to_str().unwrap_or_default())],
    );
    assert_eq!(o.code, 1, "{o:?}");
    assert!(o.stderr.contains("PEM"), "{o:?}");
    // CAIRN_SKIP_VERIFY parses as a boolean and does not disturb plain HTTP.
    let o = u.run_with(&["status"], None, &[("CAIRN_SKIP_VERIFY", "true")]);
    assert_eq!(o.code, 0, "{o:?}");
}

#[test]
fn login_ldap_against_a_directory_stores_the_token() {
    let s = ldap_server();
    let u = User::new(&s, None);
    // Password on stdin (the prompt reads stdin when it is not a terminal).
    let o = u.run_with(
        &["login", "-method=ldap", "username=alice"],
        Some("alice-pw\n"),
        &[],
    );
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        o.stdout.contains("Success! You are now authenticated"),
        "{o:?}"
    );
    assert!(!o.stdout.contains("alice-pw"), "{o:?}");
    assert_eq!(
        row(&o.stdout, "token_meta_username"),
        Some("alice"),
        "{o:?}"
    );
    let policies = row(&o.stdout, "token_policies")
        .unwrap_or_default()
        .to_string();
    assert!(
        policies.contains("eng") && policies.contains("default"),
        "{o:?}"
    );
    let token = row(&o.stdout, "token").expect("token row").to_string();
    let stored = std::fs::read_to_string(u.home.join(".cairn-token")).expect("token file");
    assert_eq!(stored, token);
    let o = u.ok(&["token", "lookup", "-field=policies"]);
    assert!(o.stdout.contains("eng"), "{o:?}");

    // password= on the command line, -format=json, another mount path.
    let r = s.post("sys/auth/corp", json!({"type": "ldap"}));
    assert!(r.status == 204, "{r:?}");
    let cfg = s.get("auth/ldap/config").body["data"].clone();
    let mut cfg = cfg.as_object().cloned().unwrap_or_default();
    cfg.insert("bindpass".into(), json!(directory()["CAIRN_LDAP_BINDPASS"]));
    let r = s.post("auth/corp/config", Value::Object(cfg));
    assert!(r.status == 204, "{r:?}");
    let j = u
        .ok(&[
            "login",
            "-method=ldap",
            "-path=corp",
            "-format=json",
            "-no-store",
            "username=bob",
            "password=bob-pw",
        ])
        .json();
    assert_eq!(j["auth"]["metadata"]["username"], json!("bob"));
    assert_eq!(
        std::fs::read_to_string(u.home.join(".cairn-token")).expect("token file"),
        token,
        "-no-store keeps the old token"
    );
    let o = u.ok(&[
        "login",
        "-method=ldap",
        "-token-only",
        "username=bob",
        "password=bob-pw",
    ]);
    assert!(
        o.stdout.trim().len() > 10 && !o.stdout.contains("Success"),
        "{o:?}"
    );

    // A wrong password: the server's message, exit 2, the stored token unchanged.
    let o = u.run(&["login", "-method=ldap", "username=alice", "password=wrong"]);
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("Code: 400"), "{o:?}");
    assert!(o.stderr.contains("failed to bind"), "{o:?}");
    assert_eq!(
        std::fs::read_to_string(u.home.join(".cairn-token")).expect("token file"),
        token
    );
}

/// A tmux server of our own (its own socket), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn cmd(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run tmux")
    }
    fn screen(&self) -> String {
        String::from_utf8_lossy(
            &self
                .cmd(&["capture-pane", "-p", "-t", "cli", "-S", "-200"])
                .stdout,
        )
        .into_owned()
    }
    fn wait_for(&self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = self.screen();
            if s.contains(what) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "screen never showed {what:?}:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    fn type_line(&self, line: &str) {
        let o = self.cmd(&["send-keys", "-t", "cli", "-l", line]);
        assert!(o.status.success(), "send-keys: {o:?}");
        self.cmd(&["send-keys", "-t", "cli", "Enter"]);
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

#[test]
fn a_person_at_a_terminal_logs_in_and_reads_replication_status() {
    if Command::new("tmux").arg("-V").output().is_err() {
        panic!("tmux is not installed (scripts/setup.sh installs it)");
    }
    let s = ldap_server();
    let home = tmpdir("cli-tmux");
    let bin = cairn_bin();
    let tmux = Tmux {
        socket: format!("cairn-cli-test-{}", std::process::id()),
    };
    let shell = format!(
        "env -i PATH=/usr/bin:/bin HOME={} TERM=xterm CAIRN_ADDR={} PS1='$ ' bash --norc --noprofile",
        home.display(),
        s.addr
    );
    let o = tmux.cmd(&[
        "new-session",
        "-d",
        "-s",
        "cli",
        "-x",
        "160",
        "-y",
        "50",
        &shell,
    ]);
    assert!(o.status.success(), "tmux new-session: {o:?}");
    // capture-pane trims trailing blanks: the prompt shows as "$".
    tmux.wait_for("$");

    // Login: the password is prompted on the terminal and not echoed.
    tmux.type_line(&format!(
        "{} login -method=ldap username=alice",
        bin.display()
    ));
    tmux.wait_for("Password (will be hidden):");
    // The prompt is printed just before the terminal's echo is switched off (rpassword):
    // a person types after reading it, not within those microseconds. Typing at once raced
    // the switch on a loaded machine and showed the keys as echoed.
    std::thread::sleep(std::time::Duration::from_millis(300));
    tmux.type_line("alice-pw");
    let screen = tmux.wait_for("token_policies");
    assert!(
        screen.contains("Success! You are now authenticated"),
        "{screen}"
    );
    assert!(
        !screen.contains("alice-pw"),
        "the password was echoed:\n{screen}"
    );
    let token_line = screen
        .lines()
        .find(|l| l.starts_with("token "))
        .unwrap_or_else(|| panic!("no token row:\n{screen}"));
    let stored = std::fs::read_to_string(home.join(".cairn-token")).expect("token file");
    assert!(token_line.ends_with(&stored), "{token_line} vs {stored}");

    // Replication status as a person sees it: a table, or a plain note when the server
    // has no replication status endpoint.
    tmux.type_line("clear");
    tmux.type_line(&format!(
        "{} replication status; echo rc\"\"=$?",
        bin.display()
    ));
    // The typed line shows `rc""=`, the output `rc=N`.
    let screen = tmux.wait_for("rc=");
    let raw = s.get("sys/replication/status");
    if raw.status == 404 {
        assert!(
            screen.contains("not available") && screen.contains("rc=2"),
            "{screen}"
        );
    } else {
        assert!(screen.contains("rc=0"), "{screen}");
        let header = screen
            .lines()
            .find(|l| l.starts_with("Mode"))
            .unwrap_or_else(|| panic!("no table:\n{screen}"));
        for col in ["Role", "State", "Last WAL", "Last Remote WAL"] {
            assert!(header.contains(col), "{col} missing:\n{screen}");
        }
        assert!(
            screen.lines().any(|l| l.starts_with("dr ")),
            "no dr row:\n{screen}"
        );
    }
}

#[test]
fn tls_with_a_custom_ca_file_directory_or_no_verification() {
    let dir = tmpdir("cli-tls");
    let ca_key = rcgen::KeyPair::generate().expect("ca key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).expect("ca cert");
    let key = rcgen::KeyPair::generate().expect("key");
    let params =
        rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .expect("params");
    let cert = params
        .signed_by(&key, &rcgen::Issuer::new(ca_params, ca_key))
        .expect("cert");
    std::fs::write(dir.join("tls.crt"), cert.pem()).expect("write");
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).expect("write");
    let cas = dir.join("cas");
    std::fs::create_dir_all(&cas).expect("mkdir");
    std::fs::write(cas.join("ca.pem"), ca.pem()).expect("write");
    std::fs::write(cas.join("README"), "not a certificate").expect("write");
    let port = free_port_pair();
    let cfg = format!(
        "storage \"sqlite\" {{ path = \"{d}/c.db\" }}\nlistener \"tcp\" {{\n address = \"127.0.0.1:{port}\"\n tls_cert_file = \"{d}/tls.crt\"\n tls_key_file = \"{d}/tls.key\"\n cluster_address = \"127.0.0.1:{}\"\n}}\n",
        port + 1,
        d = dir.display()
    );
    std::fs::write(dir.join("c.hcl"), cfg).expect("write config");
    let _server = KillOnDrop(
        Command::new(cairn_bin())
            .args(["server", "--config"])
            .arg(dir.join("c.hcl"))
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn cairn"),
    );
    let u = User {
        addr: format!("https://localhost:{port}"),
        home: std::sync::Arc::new(tmpdir("cli-tls-home")),
        token: None,
    };
    let ca_file = cas.join("ca.pem").display().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    let o = loop {
        let o = u.run_with(
            &["read", "-format=json", "sys/seal-status"],
            None,
            &[("CAIRN_CACERT", &ca_file)],
        );
        if o.code == 0 || Instant::now() > deadline {
            break o;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(o.code, 0, "{o:?}");
    assert_eq!(o.json()["initialized"], Value::Bool(false));
    // Without the CA the certificate is refused: exit 2, nothing on stdout.
    let o = u.run(&["read", "sys/seal-status"]);
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stdout.is_empty(), "{o:?}");
    // A CA directory (other files in it are skipped), the flag and the variable.
    let ca_dir = cas.display().to_string();
    let o = u.run_with(
        &["read", "sys/seal-status"],
        None,
        &[("CAIRN_CAPATH", &ca_dir)],
    );
    assert_eq!(o.code, 0, "{o:?}");
    let o = u.run(&["read", "-ca-cert", &ca_file, "sys/seal-status"]);
    assert_eq!(o.code, 0, "{o:?}");
    let o = u.run(&["read", "-tls-skip-verify", "sys/seal-status"]);
    assert_eq!(o.code, 0, "{o:?}");
    let o = u.run_with(
        &["read", "sys/seal-status"],
        None,
        &[("CAIRN_SKIP_VERIFY", "1")],
    );
    assert_eq!(o.code, 0, "{o:?}");
    let o = u.run_with(
        &["read", "sys/seal-status"],
        None,
        &[("CAIRN_SKIP_VERIFY", "false")],
    );
    assert_eq!(o.code, 2, "{o:?}");
}

#[test]
fn namespace_create_list_lookup_delete() {
    let s = Server::dev();
    let u = User::new(&s, Some(&s.root_token));
    let o = u.ok(&["namespace", "create", "-custom-metadata=team=a", "ns1/"]);
    assert_eq!(row(&o.stdout, "path"), Some("ns1/"), "{o:?}");
    // Nested, relative to the namespace given by -namespace (or CAIRN_NAMESPACE).
    let j = u
        .ok(&[
            "namespace",
            "create",
            "-namespace=ns1",
            "-format=json",
            "kid",
        ])
        .json();
    assert_eq!(j["path"], "ns1/kid/");
    let o = u.run_with(
        &["namespace", "list", "-format=json"],
        None,
        &[("CAIRN_NAMESPACE", "ns1")],
    );
    assert_eq!(o.json(), json!(["kid/"]), "{o:?}");
    let o = u.ok(&["namespace", "list", "-detailed"]);
    assert!(
        o.stdout.contains("ns1/") && o.stdout.contains("team"),
        "{o:?}"
    );
    let j = u
        .ok(&["namespace", "lookup", "-format=json", "ns1/kid"])
        .json();
    assert_eq!(j["path"], "ns1/kid/");
    assert_eq!(j["id"].as_str().map(str::len), Some(5));
    // A mount in the namespace, reached through the CLI's namespace flag.
    u.ok(&["secrets", "enable", "-namespace=ns1", "-path=app", "kv"]);
    u.ok(&["write", "-namespace=ns1", "app/x", "v=1"]);
    let o = u.ok(&["read", "-namespace=ns1", "-field=v", "app/x"]);
    assert_eq!(o.stdout.trim(), "1");
    // With a child namespace: refused, exit 2. Its mounts and data go with it.
    let o = u.run(&["namespace", "delete", "ns1"]);
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("child namespaces"), "{o:?}");
    u.ok(&["namespace", "delete", "-namespace=ns1", "kid"]);
    let o = u.ok(&["namespace", "delete", "ns1/"]);
    assert!(
        o.stdout.contains("Success! Namespace deleted at: ns1/"),
        "{o:?}"
    );
    let o = u.run(&["namespace", "lookup", "ns1"]);
    assert_eq!(o.code, 2, "{o:?}");
    let o = u.run(&["namespace", "list"]);
    assert_eq!(o.code, 2, "{o:?}");
}

mod dr;
mod first_run;
