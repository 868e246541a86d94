//! The real OpenBao CLI as a client of Cairn: the unmodified `bao` binary of OpenBao 2.6.2
//! (obtained by `scripts/reference.sh`, as the differential test does) drives real Cairn
//! servers through operator workflows, with `BAO_ADDR`/`BAO_TOKEN` and a home directory of
//! its own. Every step asserts the exit code (0 success, 1 a local or usage error, 2 an API
//! error or "no value", as the CLI defines them) and what the CLI printed.
//!
//! One server per scenario group: an uninitialised SQLite server for `operator` (init,
//! unseal, seal, key-status, generate-root in every mode), dev servers for the engines, the
//! tokens and the LDAP login (against a real slapd from `scripts/dev-ldap.sh`).

use cairn_tests::{note_secret, repo_root, start_dev_ldap, tmpdir, Server, TempDir};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The `bao` binary (OpenBao 2.6.2), downloaded and cached by `scripts/reference.sh`.
fn bao_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo_root().join("scripts/reference.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("run scripts/reference.sh");
        assert!(
            out.status.success(),
            "scripts/reference.sh could not obtain OpenBao 2.6.2 (this test needs its CLI)"
        );
        let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        assert!(p.exists(), "scripts/reference.sh printed {}", p.display());
        p
    })
}

/// What one CLI run did.
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }
    /// The value column of the line of a `Key  Value` table whose key is `key`.
    fn field(&self, key: &str) -> String {
        self.stdout
            .lines()
            .find_map(|l| {
                let rest = l.strip_prefix(key)?;
                rest.starts_with(char::is_whitespace)
                    .then(|| rest.trim().to_string())
            })
            .unwrap_or_else(|| panic!("no {key:?} line: {self:?}"))
    }
    fn line(&self) -> &str {
        self.stdout.trim()
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

/// A `bao` user: the server's address, a token (or none) and a home directory of its own
/// (where `bao login` stores its token).
struct Bao {
    addr: String,
    token: Option<String>,
    home: std::sync::Arc<TempDir>,
}

impl Bao {
    fn new(s: &Server, token: Option<&str>) -> Bao {
        Bao {
            addr: s.addr.clone(),
            token: token.map(str::to_string),
            home: std::sync::Arc::new(tmpdir("bao-cli-home")),
        }
    }

    /// The same user with another token.
    fn with(&self, token: &str) -> Bao {
        Bao {
            addr: self.addr.clone(),
            token: Some(token.to_string()),
            home: self.home.clone(),
        }
    }

    fn run(&self, args: &[&str]) -> Out {
        let mut c = Command::new(bao_bin());
        c.args(args)
            .env("BAO_ADDR", &self.addr)
            .env("HOME", self.home.path())
            .env("NO_COLOR", "1")
            .stdin(Stdio::null());
        for v in [
            "BAO_TOKEN",
            "VAULT_TOKEN",
            "VAULT_ADDR",
            "BAO_NAMESPACE",
            "VAULT_NAMESPACE",
            "BAO_FORMAT",
            "VAULT_FORMAT",
        ] {
            c.env_remove(v);
        }
        if let Some(t) = &self.token {
            c.env("BAO_TOKEN", t);
        }
        let t0 = std::time::Instant::now();
        let o = c.output().expect("run bao");
        let took = t0.elapsed();
        if took > std::time::Duration::from_millis(700) {
            eprintln!("slow step ({took:?}): bao {}", args.join(" "));
        }
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    /// Runs `args` and asserts the exit code.
    fn step(&self, args: &[&str], code: i32) -> Out {
        let o = self.run(args);
        assert_eq!(o.code, code, "bao {}: {o:?}", args.join(" "));
        o
    }

    fn ok(&self, args: &[&str]) -> Out {
        self.step(args, 0)
    }

    /// Runs `args` (which ask for `-format=json`), asserts success, parses stdout.
    fn json(&self, args: &[&str]) -> Value {
        self.ok(args).json()
    }

    /// Runs `args`, asserts exit code `code` and that stderr says `says`.
    fn fails(&self, args: &[&str], code: i32, says: &str) -> Out {
        let o = self.step(args, code);
        assert!(
            o.stderr.contains(says) || o.stdout.contains(says),
            "bao {}: expected {says:?}: {o:?}",
            args.join(" ")
        );
        o
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_str().unwrap_or_default().to_string())
        .collect()
}

fn keys(v: &Value) -> Vec<String> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .cloned()
        .collect()
}

/// Decrypts a base64 OpenPGP message (an `encoded_token` of the PGP mode) with `sk`.
fn pgp_decrypt(sk: &pgp::composed::SignedSecretKey, b64: &str) -> String {
    use base64::Engine;
    use pgp::composed::Message;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("base64 encoded_token");
    let mut m = Message::from_bytes(raw.as_slice())
        .expect("OpenPGP message")
        .decrypt(&"".into(), sk)
        .expect("decrypt with the private key");
    if m.is_compressed() {
        m = m.decompress().expect("decompress");
    }
    String::from_utf8(m.as_data_vec().expect("data")).expect("utf8")
}

/// `operator init`, `unseal` (a malformed share refused at once, the progress kept), `status`
/// exit codes, `key-status`, every mode of `generate-root`, and `seal`, on a non-dev SQLite
/// server.
#[test]
fn operator_init_unseal_generate_root_and_seal() {
    let s = Server::start_owned("bao-cli-op", "");
    let b = Bao::new(&s, None);

    // Uninitialised: sealed, so `status` exits 2.
    let j = b.step(&["status", "-format=json"], 2).json();
    assert_eq!(
        (j["initialized"].clone(), j["sealed"].clone()),
        (json!(false), json!(true))
    );
    let o = b.step(&["status"], 2);
    assert_eq!(o.field("Initialized"), "false");

    let init = b.json(&[
        "operator",
        "init",
        "-key-shares=3",
        "-key-threshold=2",
        "-format=json",
    ]);
    let shares = strings(&init["unseal_keys_b64"]);
    assert_eq!(shares.len(), 3, "{init}");
    assert_eq!(strings(&init["unseal_keys_hex"]).len(), 3, "{init}");
    assert_eq!(init["unseal_shares"], json!(3));
    assert_eq!(init["unseal_threshold"], json!(2));
    let root = init["root_token"].as_str().expect("root_token").to_string();
    note_secret(&root);
    shares.iter().for_each(|k| note_secret(k));
    b.fails(
        &["operator", "init", "-key-shares=1", "-key-threshold=1"],
        2,
        "already initialized",
    );

    let o = b.step(&["status"], 2);
    assert_eq!(o.field("Initialized"), "true");
    assert_eq!(o.field("Sealed"), "true");
    assert_eq!(o.field("Unseal Progress"), "0/2");
    assert_eq!(o.field("Total Shares"), "3");

    let j = b.json(&["operator", "unseal", "-format=json", &shares[0]]);
    assert_eq!(
        (j["sealed"].clone(), j["progress"].clone()),
        (json!(true), json!(1))
    );
    // A malformed share ("AAAA" is 2 bytes of hex) is refused at once and keeps the progress.
    b.fails(
        &["operator", "unseal", "AAAA"],
        2,
        "expected 33 bytes, got 2",
    );
    b.fails(
        &["operator", "unseal", "not-a-share!"],
        2,
        "must be hex or base64",
    );
    let j = b.step(&["status", "-format=json"], 2).json();
    assert_eq!(j["progress"], json!(1), "{j}");
    let o = b.ok(&["operator", "unseal", &shares[1]]);
    assert_eq!(o.field("Sealed"), "false", "{o:?}");
    let o = b.ok(&["status"]);
    assert_eq!(o.field("Sealed"), "false");
    assert_eq!(o.field("Storage Type"), "sqlite");

    // key-status: needs a token.
    b.fails(&["operator", "key-status"], 2, "Code: 4");
    let r = b.with(&root);
    let j = r.json(&["operator", "key-status", "-format=json"]);
    assert_eq!(j["term"], json!(1), "{j}");
    let installed = j["install_time"].as_str().expect("install_time");
    assert!(
        installed.len() > 20 && installed.ends_with('Z') && installed.contains('T'),
        "{installed}"
    );
    let before = j["encryptions"].as_u64().expect("encryptions");
    // A write encrypts under the barrier key: the count grows.
    r.ok(&["secrets", "enable", "-path=kv", "kv"]);
    r.ok(&["kv", "put", "kv/a", "b=1"]);
    let o = r.ok(&["operator", "key-status"]);
    assert_eq!(o.field("Key Term"), "1");
    let after: u64 = o.field("Encryption Count").parse().expect("count");
    assert!(after >= before + 2, "{before} -> {o:?}");
    assert!(!o.field("Install Time").is_empty());

    // generate-root: -status, -generate-otp, -init -otp, the update loop, -decode.
    let j = b.json(&["operator", "generate-root", "-status", "-format=json"]);
    assert_eq!(j["started"], json!(false), "{j}");
    assert_eq!(j["required"], json!(2));
    let otp_len = j["otp_length"].as_u64().expect("otp_length") as usize;
    let otp = b
        .ok(&["operator", "generate-root", "-generate-otp"])
        .line()
        .to_string();
    assert_eq!(otp.len(), otp_len, "{otp}");
    assert!(otp.bytes().all(|c| c.is_ascii_alphanumeric()), "{otp}");
    let j = b.json(&[
        "operator",
        "generate-root",
        "-init",
        "-otp",
        &otp,
        "-format=json",
    ]);
    assert_eq!(
        (j["started"].clone(), j["progress"].clone()),
        (json!(true), json!(0))
    );
    assert_eq!(j["otp"], json!(""), "the operator's OTP is not echoed: {j}");
    let nonce = j["nonce"].as_str().expect("nonce").to_string();
    b.fails(
        &["operator", "generate-root", "-init", "-otp", &otp],
        2,
        "already in progress",
    );
    let o = b.ok(&["operator", "generate-root", "-status"]);
    assert_eq!(o.field("Nonce"), nonce);
    assert_eq!(o.field("Started"), "true");
    let j = b.json(&[
        "operator",
        "generate-root",
        "-nonce",
        &nonce,
        "-format=json",
        &shares[0],
    ]);
    assert_eq!(
        (j["progress"].clone(), j["complete"].clone()),
        (json!(1), json!(false))
    );
    b.fails(
        &["operator", "generate-root", "-nonce", &nonce, "AAAA"],
        2,
        "progress is unchanged",
    );
    b.fails(
        &[
            "operator",
            "generate-root",
            "-nonce",
            "not-the-nonce",
            &shares[1],
        ],
        2,
        "nonce",
    );
    let o = b.ok(&["operator", "generate-root", "-status"]);
    assert_eq!(o.field("Progress"), "1/2");
    let j = b.json(&[
        "operator",
        "generate-root",
        "-nonce",
        &nonce,
        "-format=json",
        &shares[1],
    ]);
    assert_eq!(j["complete"], json!(true), "{j}");
    let encoded = j["encoded_token"]
        .as_str()
        .expect("encoded_token")
        .to_string();
    let token = b
        .ok(&[
            "operator",
            "generate-root",
            "-decode",
            &encoded,
            "-otp",
            &otp,
        ])
        .line()
        .to_string();
    note_secret(&token);
    assert!(token.starts_with("cs."), "{token}");
    let j = b.with(&token).json(&["token", "lookup", "-format=json"]);
    assert_eq!(strings(&j["data"]["policies"]), ["root"], "{j}");
    assert_eq!(j["data"]["path"], json!("auth/token/root"));

    // -init without -otp: the server makes the OTP and the CLI prints it; -cancel.
    let j = b.json(&["operator", "generate-root", "-init", "-format=json"]);
    let server_otp = j["otp"].as_str().expect("otp");
    assert_eq!(server_otp.len(), otp_len, "{j}");
    note_secret(server_otp);
    let o = b.ok(&["operator", "generate-root", "-cancel"]);
    assert!(
        o.stdout
            .contains("Success! Root token generation canceled (if it was started)"),
        "{o:?}"
    );
    let j = b.json(&["operator", "generate-root", "-status", "-format=json"]);
    assert_eq!(
        (j["started"].clone(), j["nonce"].clone()),
        (json!(false), json!(""))
    );

    // -pgp-key: the token comes back encrypted to the operator's key.
    let (sk, pk) = cairn_tests::pgp_keypair(7, "Operator <op@example.com>");
    let dir = tmpdir("bao-cli-pgp");
    let file = dir.join("operator.gpg");
    {
        use pgp::ser::Serialize as _;
        std::fs::write(&file, pk.to_bytes().expect("serialize key")).expect("write key");
    }
    let fingerprint = {
        use pgp::types::KeyDetails as _;
        format!("{:x}", pk.fingerprint())
    };
    let pgp_arg = format!("-pgp-key={}", file.display());
    let j = b.json(&[
        "operator",
        "generate-root",
        "-init",
        &pgp_arg,
        "-format=json",
    ]);
    assert_eq!(j["pgp_fingerprint"], json!(fingerprint), "{j}");
    assert_eq!(j["otp"], json!(""));
    let nonce = j["nonce"].as_str().expect("nonce").to_string();
    for k in [&shares[2], &shares[0]] {
        b.ok(&["operator", "generate-root", "-nonce", &nonce, k]);
    }
    // The last update's answer is gone; the CLI printed it. Run the flow's end again to
    // read the encoded token: a new attempt, completed in one JSON call at the threshold.
    let j = b.json(&[
        "operator",
        "generate-root",
        "-init",
        &pgp_arg,
        "-format=json",
    ]);
    let nonce = j["nonce"].as_str().expect("nonce").to_string();
    b.ok(&["operator", "generate-root", "-nonce", &nonce, &shares[1]]);
    let j = b.json(&[
        "operator",
        "generate-root",
        "-nonce",
        &nonce,
        "-format=json",
        &shares[2],
    ]);
    assert_eq!(j["complete"], json!(true), "{j}");
    assert_eq!(j["pgp_fingerprint"], json!(fingerprint));
    let token = pgp_decrypt(&sk, j["encoded_token"].as_str().expect("encoded_token"));
    note_secret(&token);
    let j = b.with(&token).json(&["token", "lookup", "-format=json"]);
    assert_eq!(strings(&j["data"]["policies"]), ["root"], "{j}");

    // seal: needs a token with sudo; then `status` exits 2 until a threshold of shares.
    b.with("not-a-token")
        .fails(&["operator", "seal"], 2, "Code: 403");
    let o = r.ok(&["operator", "seal"]);
    assert!(
        o.stdout.contains("Success! OpenBao is sealed.")
            || o.stdout.contains("Success! Vault is sealed."),
        "{o:?}"
    );
    let o = b.step(&["status"], 2);
    assert_eq!(o.field("Sealed"), "true");
    r.fails(&["token", "lookup"], 2, "Code: 503");
    let j = b.json(&["operator", "unseal", "-format=json", &shares[2]]);
    assert_eq!(j["progress"], json!(1));
    let j = b.json(&["operator", "unseal", "-format=json", "-reset"]);
    assert_eq!(j["progress"], json!(0), "-reset clears the progress: {j}");
    b.ok(&["operator", "unseal", &shares[2]]);
    let o = b.ok(&["operator", "unseal", &shares[0]]);
    assert_eq!(o.field("Sealed"), "false");
    b.ok(&["status"]);
    let j = r.json(&["token", "lookup", "-format=json"]);
    assert_eq!(j["data"]["id"], json!(root));
}

/// `secrets` enable/tune/list/move/disable, `auth` enable/tune/list/move, KV v1 through
/// `kv` (with `-mount=` too) and through `read`/`write`/`list`/`delete`, `policy`, and
/// `path-help`, on a dev server.
#[test]
fn secrets_auth_kv_v1_policies_and_path_help() {
    let s = Server::dev();
    let b = Bao::new(&s, Some(&s.root_token));

    let o = b.ok(&["status"]);
    assert_eq!(o.field("Sealed"), "false");
    assert_eq!(o.field("Initialized"), "true");

    // secrets enable / tune / list / move / disable
    let o = b.ok(&["secrets", "enable", "-path=kv1", "-version=1", "kv"]);
    assert_eq!(o.line(), "Success! Enabled the kv secrets engine at: kv1/");
    b.fails(
        &["secrets", "enable", "-path=kv1", "kv"],
        2,
        "path is already in use at kv1/",
    );
    b.fails(
        &["secrets", "enable", "-path=pki", "pki"],
        2,
        "unknown secrets engine type",
    );
    b.ok(&["secrets", "enable", "-path=tmp", "kv"]);
    let o = b.ok(&[
        "secrets",
        "tune",
        "-default-lease-ttl=1h",
        "-description=first",
        "kv1",
    ]);
    assert_eq!(o.line(), "Success! Tuned the secrets engine at: kv1/");
    let j = b.json(&["read", "-format=json", "sys/mounts/kv1/tune"]);
    assert_eq!(j["data"]["default_lease_ttl"], json!(3600), "{j}");
    assert_eq!(j["data"]["description"], json!("first"));
    let j = b.json(&["secrets", "list", "-format=json"]);
    assert_eq!(keys(&j), ["kv1/", "secret/", "sys/", "tmp/"], "{j}");
    assert_eq!(j["kv1/"]["type"], json!("kv"));
    assert_eq!(j["kv1/"]["description"], json!("first"));
    assert_eq!(j["kv1/"]["config"]["default_lease_ttl"], json!(3600));
    let o = b.ok(&["secrets", "move", "tmp", "moved"]);
    assert!(
        o.stdout
            .contains("Success! Finished moving secrets engine tmp/ to moved/"),
        "{o:?}"
    );
    b.fails(
        &["secrets", "move", "moved", "kv1"],
        2,
        "path already in use at \"kv1/\"",
    );
    b.fails(
        &["secrets", "move", "nope", "kv9"],
        2,
        "no matching mount at \"nope/\"",
    );
    let o = b.ok(&["secrets", "disable", "moved"]);
    assert_eq!(
        o.line(),
        "Success! Disabled the secrets engine (if it existed) at: moved/"
    );
    let o = b.ok(&["secrets", "list"]);
    assert!(
        o.stdout.contains("kv1/ ") && !o.stdout.contains("moved/"),
        "{o:?}"
    );

    // auth enable / tune / list / move
    let o = b.ok(&[
        "auth",
        "enable",
        "-path=corp",
        "-description=corporate directory",
        "ldap",
    ]);
    assert_eq!(o.line(), "Success! Enabled ldap auth method at: corp/");
    b.fails(
        &["auth", "enable", "userpass"],
        2,
        "unknown auth method type",
    );
    let o = b.ok(&[
        "auth",
        "tune",
        "-default-lease-ttl=30m",
        "-max-lease-ttl=2h",
        "corp",
    ]);
    assert_eq!(o.line(), "Success! Tuned the auth method at: corp/");
    let j = b.json(&["read", "-format=json", "sys/auth/corp/tune"]);
    assert_eq!(
        (
            j["data"]["default_lease_ttl"].clone(),
            j["data"]["max_lease_ttl"].clone()
        ),
        (json!(1800), json!(7200)),
        "{j}"
    );
    let j = b.json(&["auth", "list", "-format=json"]);
    assert_eq!(keys(&j), ["corp/", "ldap/", "token/"], "{j}");
    assert_eq!(j["corp/"]["type"], json!("ldap"));
    assert_eq!(j["corp/"]["description"], json!("corporate directory"));
    let o = b.ok(&["auth", "move", "auth/corp", "auth/dir"]);
    assert!(
        o.stdout
            .contains("Success! Finished moving auth method auth/corp/ to auth/dir/"),
        "{o:?}"
    );
    b.fails(
        &["auth", "move", "auth/dir", "plain"],
        2,
        "cannot remount auth mount to non-auth mount \"plain/\"",
    );
    let o = b.ok(&["auth", "list"]);
    assert!(
        o.stdout.contains("dir/ ") && !o.stdout.contains("corp/"),
        "{o:?}"
    );
    let j = b.json(&["read", "-format=json", "sys/auth/dir/tune"]);
    assert_eq!(
        j["data"]["default_lease_ttl"],
        json!(1800),
        "the tune moved along: {j}"
    );

    // kv on a version 1 mount, by path and with -mount=
    let o = b.ok(&["kv", "put", "kv1/app", "a=1", "b=2"]);
    assert_eq!(o.line(), "Success! Data written to: kv1/app");
    b.ok(&["kv", "put", "-mount=kv1", "app2", "c=3"]);
    let j = b.json(&["kv", "get", "-format=json", "kv1/app"]);
    assert_eq!(j["data"], json!({"a": "1", "b": "2"}), "{j}");
    let o = b.ok(&["kv", "get", "kv1/app"]);
    assert_eq!(o.field("a"), "1");
    let o = b.ok(&["kv", "get", "-mount=kv1", "-field=c", "app2"]);
    assert_eq!(o.line(), "3");
    b.fails(
        &["kv", "get", "kv1/missing"],
        2,
        "No value found at kv1/missing",
    );
    let j = b.json(&["kv", "list", "-format=json", "kv1"]);
    assert_eq!(strings(&j), ["app", "app2"]);
    b.fails(
        &["kv", "patch", "kv1/app", "c=3"],
        2,
        "K/V engine mount must be version 2 for patch support",
    );
    b.fails(
        &["kv", "metadata", "get", "kv1/app"],
        1,
        "Metadata not supported on KV Version 1",
    );
    b.fails(
        &["kv", "undelete", "-versions=1", "kv1/app"],
        1,
        "Undelete not supported on KV Version 1",
    );
    b.fails(
        &["kv", "destroy", "-versions=1", "kv1/app"],
        1,
        "Destroy not supported on KV Version 1",
    );
    let o = b.ok(&["kv", "delete", "kv1/app"]);
    assert_eq!(
        o.line(),
        "Success! Data deleted (if it existed) at: kv1/app"
    );
    b.ok(&["kv", "delete", "-mount=kv1", "app2"]);
    b.fails(&["kv", "list", "kv1"], 2, "No value found at kv1");

    // read / write / list / delete, and write -force (a JSON null body)
    let o = b.ok(&["write", "kv1/x", "y=1", "z=two"]);
    assert_eq!(o.line(), "Success! Data written to: kv1/x");
    assert_eq!(b.ok(&["read", "-field=z", "kv1/x"]).line(), "two");
    let j = b.json(&["read", "-format=json", "kv1/x"]);
    assert_eq!(j["data"], json!({"y": "1", "z": "two"}));
    assert_eq!(strings(&b.json(&["list", "-format=json", "kv1"])), ["x"]);
    b.fails(&["write", "-force", "kv1/empty"], 2, "missing data fields");
    let o = b.ok(&["write", "-force", "sys/leases/tidy"]);
    assert!(
        o.stderr.contains("Tidy operation successfully started"),
        "{o:?}"
    );
    let o = b.ok(&["delete", "kv1/x"]);
    assert_eq!(o.line(), "Success! Data deleted (if it existed) at: kv1/x");
    b.fails(&["read", "kv1/x"], 2, "No value found at kv1/x");
    b.fails(&["list", "kv1"], 2, "No value found at kv1");

    // policy write / read / list / delete
    let dir = tmpdir("bao-cli-policy");
    let file = dir.join("reader.hcl");
    let text = "path \"kv1/*\" { capabilities = [\"read\", \"list\"] }\n";
    std::fs::write(&file, text).expect("write policy");
    let o = b.ok(&[
        "policy",
        "write",
        "reader",
        file.to_str().unwrap_or_default(),
    ]);
    assert_eq!(o.line(), "Success! Uploaded policy: reader");
    assert_eq!(b.ok(&["policy", "read", "reader"]).line(), text.trim());
    assert_eq!(b.ok(&["policy", "list"]).stdout, "default\nreader\nroot\n");
    b.fails(&["policy", "read", "nope"], 2, "No policy named: nope");
    let bad = dir.join("bad.hcl");
    std::fs::write(&bad, "path \"kv1/*\" { capabilities = [\"fly\"] }\n").expect("write");
    b.fails(
        &["policy", "write", "bad", bad.to_str().unwrap_or_default()],
        2,
        "Code: 400",
    );
    b.fails(&["policy", "read", "bad"], 2, "No policy named: bad");
    let o = b.ok(&["policy", "delete", "reader"]);
    assert_eq!(o.line(), "Success! Deleted policy: reader");
    assert_eq!(b.ok(&["policy", "list"]).stdout, "default\nroot\n");

    // path-help: the route a path reaches, generated from the route tables.
    let o = b.ok(&["path-help", "sys/mounts"]);
    assert!(o.stdout.contains("Request:        mounts"), "{o:?}");
    assert!(o.stdout.contains("Matching Route: sys/mounts"), "{o:?}");
    assert!(o.stdout.contains("secrets engines"), "{o:?}");
    let o = b.ok(&["path-help", "kv1/"]);
    assert!(
        o.stdout.contains("## PATHS") && o.stdout.contains("kv1/*"),
        "{o:?}"
    );
    let o = b.ok(&["path-help", "kv1/foo"]);
    assert!(o.stdout.contains("Request:        foo"), "{o:?}");
    let o = b.ok(&["path-help", "auth/token/create"]);
    assert!(
        o.stdout.contains("Matching Route: auth/token/create"),
        "{o:?}"
    );
    let o = b.ok(&["path-help", "auth/dir/login/alice"]);
    assert!(
        o.stdout.contains("Matching Route: auth/dir/login/+"),
        "{o:?}"
    );
    assert!(o.stdout.contains("No token is needed"), "{o:?}");
    let o = b.ok(&["path-help", "-format=json", "sys/mounts"]);
    let j: Value = serde_json::from_str(o.line()).expect("openapi JSON");
    assert!(j["paths"]["/sys/mounts"]["description"].is_string(), "{j}");
    b.fails(&["path-help", "nope/x"], 2, "Code: 404");
    b.with("not-a-token")
        .fails(&["path-help", "sys/mounts"], 2, "Code: 403");
}

mod engines;
mod tokens;
