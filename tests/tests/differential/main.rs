//! Differential test: the same sequence of requests against the reference (OpenBao 2.6.2,
//! `bao server -dev`, obtained by `scripts/reference.sh`) and a dev `cairn`, both configured
//! against one real slapd (`scripts/dev-ldap.sh`); a second test runs the LDAP part against a
//! Samba AD domain controller (`scripts/dev-ad.sh`) the same way.
//!
//! Per request it compares the status code and the shapes (key sets and JSON value types,
//! presence and null-ness) of `data`, `auth`, `wrap_info` and `warnings`; it prints
//! `N/M statuses match, K/M shapes match` and a table of every difference. Per-server values
//! (tokens, accessors, nonces) are captured from earlier answers into variables (`${name}`)
//! so the same logical sequence runs on both.
//!
//! The test fails when a difference is not in [`ALLOWED`], and when an entry of [`ALLOWED`]
//! no longer differs (the list stays honest). The full bodies of both answers to every
//! differing request go to `target/<profile>/differential-report.txt` (outside `e2e-logs/`:
//! they hold tokens).

use cairn_tests::{agent, free_port_pair, note_secret, repo_root, start_dev_ldap, Resp, Server};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The aspects compared per request.
const ASPECTS: [&str; 5] = ["status", "data", "auth", "wrap_info", "warnings"];

// Reasons of the allow-list below, one per group of differences.
const MOUNTS: &str = "not implemented yet: the cubbyhole/ and identity/ mounts";
const KV2: &str = "the reference's dev secret/ is KV v2 (options.version 2); Cairn's dev secret/ is KV v1 without options";
const POLICY: &str = "not implemented yet: OpenBao's policy versioning fields (version, modified, cas_required, identity-template flags)";
const ORPHAN: &str = "deliberate: create-orphan needs sudo in Cairn (tests/tests/security.rs); the reference only wants the path's capabilities";
const LDAPCFG: &str = "Cairn extension: the lockout settings (user_lockout_*) live in the LDAP config (the reference's in sys/auth tune) and client_tls_cert is shown";
const DEREF: &str = "spec lists never/finding/searching/always for dereference_aliases: Cairn refuses other values, the reference stores anything";
const LOGINDATA: &str = "spec: the LDAP login response's data is null (the reference answers {})";
const UNWRAPLOGIN: &str = "deliberate: Cairn lets the wrapping token itself authorize an unwrap; the reference also wants a client token when the wrapping token is in the body";
const NESTBAD: &str = "the reference answers 500 to a group naming itself or an unknown group as a member; that is bad input, a 400 here";
const GENROOT: &str = "the reference (2.6) serves the attempt under sys/generate-root-token/ only (405 here); Cairn serves both paths";

/// Known differences: (request label, aspect, reason). Every entry must still differ.
const ALLOWED: &[(&str, &str, &str)] = &[
    ("mounts", "data", MOUNTS),
    ("mounts after mount", "data", MOUNTS),
    ("mounts end", "data", MOUNTS),
    ("tune secret read", "data", KV2),
    ("policy acl read reader", "data", POLICY),
    ("policy read writer", "data", POLICY),
    ("policy read default", "data", POLICY),
    ("policy acl read default", "data", POLICY),
    ("policy acl read root", "data", POLICY),
    ("token create-orphan without sudo", "status", ORPHAN),
    ("token create-orphan without sudo", "data", ORPHAN),
    ("token create-orphan without sudo", "auth", ORPHAN),
    ("token create-orphan without sudo", "wrap_info", ORPHAN),
    ("token create-orphan without sudo", "warnings", ORPHAN),
    ("ldap config read", "data", LDAPCFG),
    ("ldap config read after bad", "data", LDAPCFG),
    ("ldap config bad deref", "status", DEREF),
    ("ldap login alice", "data", LOGINDATA),
    ("ldap login bob", "data", LOGINDATA),
    ("ldap login alice uppercase", "data", LOGINDATA),
    ("wrapping unwrap login", "status", UNWRAPLOGIN),
    ("wrapping unwrap login", "data", UNWRAPLOGIN),
    ("wrapping unwrap login", "auth", UNWRAPLOGIN),
    ("wrapping unwrap login", "wrap_info", UNWRAPLOGIN),
    ("wrapping unwrap login", "warnings", UNWRAPLOGIN),
    ("identity nested self member", "status", NESTBAD),
    ("identity nested unknown member", "status", NESTBAD),
    ("generate-root status", "status", GENROOT),
    ("generate-root start", "status", GENROOT),
    ("generate-root status started", "status", GENROOT),
    ("generate-root start again", "status", GENROOT),
    ("generate-root update bad nonce", "status", GENROOT),
    ("generate-root cancel", "status", GENROOT),
    ("generate-root status after cancel", "status", GENROOT),
    ("generate-root cancel again", "status", GENROOT),
    ("generate-root update without attempt", "status", GENROOT),
];

/// The reference server: `bao server -dev`, killed on drop.
struct Reference {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Drop for Reference {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `bao` binary: `scripts/reference.sh` downloads and caches it. Fails loudly.
fn reference_bin() -> PathBuf {
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/reference.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/reference.sh");
    assert!(
        out.status.success(),
        "scripts/reference.sh could not obtain OpenBao 2.6.2 (the differential test needs it)"
    );
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(p.exists(), "scripts/reference.sh printed {}", p.display());
    p
}

fn start_reference() -> Reference {
    let bin = reference_bin();
    let dir = cairn_tests::tmpdir("differential-bao");
    for _ in 0..5 {
        let port = free_port_pair();
        let log = dir.join(format!("bao-{port}.log"));
        let f = std::fs::File::create(&log).expect("bao log");
        let child = Command::new(&bin)
            .args([
                "server",
                "-dev",
                "-dev-root-token-id=root",
                &format!("-dev-listen-address=127.0.0.1:{port}"),
            ])
            .env("HOME", &dir)
            .env_remove("BAO_ADDR")
            .env_remove("VAULT_ADDR")
            .stdout(f.try_clone().expect("log"))
            .stderr(f)
            .spawn()
            .expect("spawn bao");
        let mut r = Reference {
            child,
            addr: format!("http://127.0.0.1:{port}"),
            log,
        };
        let a = agent(Duration::from_secs(5));
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = r.child.try_wait() {
                break;
            }
            if let Some(x) = cairn_tests::request(&a, &r.addr, None, "GET", "sys/health", None) {
                if x.status == 200 {
                    return r;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = r.child.kill();
    }
    panic!("bao server -dev did not start (logs in {})", dir.display());
}

/// Whose token a request carries.
#[derive(Clone)]
enum Tok {
    None,
    Root,
    Var(&'static str),
}

/// One request of the sequence; strings may hold `${var}`.
struct Step {
    label: String,
    method: &'static str,
    path: String,
    body: Option<Value>,
    token: Tok,
    headers: Vec<(&'static str, String)>,
    captures: Vec<(&'static str, &'static str)>,
    /// Sent again (for up to 10 s) until it answers this status: the reference finishes some
    /// operations in the background (a namespace's deletion), Cairn before it answers.
    settle: Option<u16>,
}

#[derive(Default)]
struct Script {
    steps: Vec<Step>,
}

impl Script {
    fn add(&mut self, label: &str, method: &'static str, path: &str) -> &mut Step {
        assert!(
            self.steps.iter().all(|s| s.label != label),
            "duplicate label {label}"
        );
        self.steps.push(Step {
            label: label.to_string(),
            method,
            path: path.to_string(),
            body: None,
            token: Tok::Root,
            headers: Vec::new(),
            captures: Vec::new(),
            settle: None,
        });
        self.steps.last_mut().expect("just pushed")
    }
    fn get(&mut self, label: &str, path: &str) -> &mut Step {
        self.add(label, "GET", path)
    }
    fn list(&mut self, label: &str, path: &str) -> &mut Step {
        self.add(label, "LIST", path)
    }
    fn delete(&mut self, label: &str, path: &str) -> &mut Step {
        self.add(label, "DELETE", path)
    }
    fn post(&mut self, label: &str, path: &str, body: Value) -> &mut Step {
        self.add(label, "POST", path).body(body)
    }
    fn put(&mut self, label: &str, path: &str, body: Value) -> &mut Step {
        self.add(label, "PUT", path).body(body)
    }
    /// A JSON merge patch, with the content type the reference's CLI sends.
    fn patch(&mut self, label: &str, path: &str, body: Value) -> &mut Step {
        self.patch_as(label, path, body, Some("application/merge-patch+json"))
    }
    /// A `PATCH` with the given `Content-Type` (none: the header is left out).
    fn patch_as(
        &mut self,
        label: &str,
        path: &str,
        body: Value,
        content_type: Option<&str>,
    ) -> &mut Step {
        let step = self.add(label, "PATCH", path).body(body);
        if let Some(ct) = content_type {
            step.headers.push(("Content-Type", ct.to_string()));
        }
        step
    }
}

impl Step {
    fn body(&mut self, v: Value) -> &mut Self {
        self.body = Some(v);
        self
    }
    fn anon(&mut self) -> &mut Self {
        self.token = Tok::None;
        self
    }
    fn as_(&mut self, var: &'static str) -> &mut Self {
        self.token = Tok::Var(var);
        self
    }
    fn wrap(&mut self, ttl: &str) -> &mut Self {
        self.headers.push(("X-Vault-Wrap-TTL", ttl.to_string()));
        self
    }
    /// Runs the request in namespace `ns` (the `X-Vault-Namespace` header).
    fn ns(&mut self, ns: &str) -> &mut Self {
        self.headers.push(("X-Vault-Namespace", ns.to_string()));
        self
    }
    fn cap(&mut self, var: &'static str, pointer: &'static str) -> &mut Self {
        self.captures.push((var, pointer));
        self
    }
    fn settle(&mut self, status: u16) -> &mut Self {
        self.settle = Some(status);
        self
    }
}

/// One server under test with its variables.
struct Target {
    name: &'static str,
    addr: String,
    root: String,
    vars: BTreeMap<String, String>,
    agent: ureq::Agent,
}

impl Target {
    fn subst(&self, s: &str) -> String {
        let mut out = String::new();
        let mut rest = s;
        while let Some(i) = rest.find("${") {
            out.push_str(&rest[..i]);
            let after = &rest[i + 2..];
            let j = after.find('}').expect("unterminated ${");
            let name = &after[..j];
            let v = self
                .vars
                .get(name)
                .cloned()
                .unwrap_or_else(|| format!("<unset:{name}>"));
            out.push_str(&v);
            rest = &after[j + 1..];
        }
        out.push_str(rest);
        out
    }

    fn subst_value(&self, v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(self.subst(s)),
            Value::Array(a) => Value::Array(a.iter().map(|x| self.subst_value(x)).collect()),
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, x)| (k.clone(), self.subst_value(x)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    /// [`Target::run`], again until the step's settle status (if any) or 10 s.
    fn run_settled(&mut self, step: &Step) -> Resp {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let r = self.run(step);
            match step.settle {
                Some(s) if r.status != s && std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                _ => return r,
            }
        }
    }

    fn run(&mut self, step: &Step) -> Resp {
        let token = match &step.token {
            Tok::None => None,
            Tok::Root => Some(self.root.clone()),
            Tok::Var(v) => Some(self.subst(&format!("${{{v}}}"))),
        };
        let path = self.subst(&step.path);
        let url = format!("{}/v1/{}", self.addr, path);
        let mut b = ureq::http::Request::builder().method(step.method).uri(&url);
        if let Some(t) = &token {
            b = b.header("X-Vault-Token", t.as_str());
        }
        for (k, v) in &step.headers {
            b = b.header(*k, self.subst(v));
        }
        let data = step
            .body
            .as_ref()
            .map(|v| serde_json::to_vec(&self.subst_value(v)).expect("json"))
            .unwrap_or_default();
        let req = b.body(data).expect("request");
        let resp = match self.agent.run(req) {
            Ok(mut r) => {
                let status = r.status().as_u16();
                let text = r.body_mut().read_to_string().unwrap_or_default();
                let body = if text.trim().is_empty() {
                    Value::Null
                } else {
                    serde_json::from_str(&text).unwrap_or(Value::String(text))
                };
                Resp { status, body }
            }
            Err(e) => Resp {
                status: 0,
                body: Value::String(format!("transport error: {e}")),
            },
        };
        for (var, ptr) in &step.captures {
            let v = match resp.body.pointer(ptr) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => format!("<missing:{var}>"),
                Some(other) => other.to_string(),
            };
            // Tokens are secrets the server must never log; accessors (a mount's, a
            // token's) and nonces are identifiers, which its log may name.
            if self.name == "cairn" && (ptr.ends_with("client_token") || ptr.ends_with("/token")) {
                note_secret(&v);
            }
            self.vars.insert(var.to_string(), v);
        }
        resp
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The shape of one top-level field: absent, null, a scalar's type, an array's element
/// types, or an object's keys with their value types.
fn shape(body: &Value, field: &str) -> String {
    let Some(v) = body.as_object().and_then(|m| m.get(field)) else {
        return "absent".into();
    };
    match v {
        Value::Object(m) => {
            let inner: Vec<String> = m
                .iter()
                .map(|(k, x)| format!("{k}:{}", type_name(x)))
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        Value::Array(a) => {
            let types: BTreeSet<&str> = a.iter().map(type_name).collect();
            format!("[{}]", types.into_iter().collect::<Vec<_>>().join("|"))
        }
        other => type_name(other).into(),
    }
}

fn aspect(r: &Resp, a: &str) -> String {
    match a {
        "status" => r.status.to_string(),
        "policies" => policy_set(r),
        _ => shape(&r.body, a),
    }
}

/// Keys present on one side only, for a readable table.
fn describe(a: &str, b: &str) -> (String, String) {
    let split = |s: &str| -> Option<BTreeSet<String>> {
        let inner = s.strip_prefix('{')?.strip_suffix('}')?;
        Some(
            inner
                .split(',')
                .filter(|x| !x.is_empty())
                .map(str::to_string)
                .collect(),
        )
    };
    match (split(a), split(b)) {
        (Some(x), Some(y)) => {
            let only = |p: &BTreeSet<String>, q: &BTreeSet<String>| {
                let d: Vec<String> = p.difference(q).cloned().collect();
                if d.is_empty() {
                    "{..}".to_string()
                } else {
                    format!("{{.. +{}}}", d.join(" +"))
                }
            };
            (only(&x, &y), only(&y, &x))
        }
        _ => (a.to_string(), b.to_string()),
    }
}

/// The request sequence.
fn script() -> Script {
    let mut s = Script::default();
    script_sys::add(&mut s);
    script_kv::add(&mut s);
    script_identity::add(&mut s);
    script_misc::add(&mut s);
    s
}

struct Row {
    label: String,
    aspect: &'static str,
    reference: String,
    cairn: String,
}

/// What one run of a script on both targets found.
struct Comparison {
    total: usize,
    status_ok: usize,
    shape_ok: usize,
    rows: Vec<Row>,
    /// Both bodies of every differing request.
    report: String,
    /// Cairn's status and policy set per request label.
    cairn: BTreeMap<String, (u16, String)>,
}

/// Runs every step on the reference (`targets[0]`) then on Cairn (`targets[1]`) and
/// compares `aspects` of the two answers ("status" counts as the status, every other
/// aspect as the shape).
fn compare(targets: &mut [Target; 2], script: &Script, aspects: &[&'static str]) -> Comparison {
    let mut c = Comparison {
        total: script.steps.len(),
        status_ok: 0,
        shape_ok: 0,
        rows: Vec::new(),
        report: String::new(),
        cairn: BTreeMap::new(),
    };
    for step in &script.steps {
        let a = targets[0].run_settled(step);
        let b = targets[1].run_settled(step);
        let mut status_same = true;
        let mut shape_same = true;
        for &asp in aspects {
            let (x, y) = (aspect(&a, asp), aspect(&b, asp));
            if x != y {
                if asp == "status" {
                    status_same = false;
                } else {
                    shape_same = false;
                }
                c.rows.push(Row {
                    label: step.label.clone(),
                    aspect: asp,
                    reference: x,
                    cairn: y,
                });
            }
        }
        c.status_ok += usize::from(status_same);
        c.shape_ok += usize::from(shape_same);
        c.cairn
            .insert(step.label.clone(), (b.status, policy_set(&b)));
        if !status_same || !shape_same {
            let _ = writeln!(
                c.report,
                "## {} ({} {})\nreference {}: {}\ncairn {}: {}\n",
                step.label, step.method, step.path, a.status, a.body, b.status, b.body
            );
        }
    }
    c
}

/// Prints the figure and the table of differences, writes the bodies to
/// `target/<profile>/<report_name>`, and fails on a difference not in `allowed` or an
/// entry of `allowed` that no longer differs.
fn judge(
    c: &Comparison,
    figure: &str,
    allowed: &[(&str, &str, &str)],
    report_name: &str,
    reference: &Reference,
) {
    println!("{figure}");
    println!("allow-list: {} entries", allowed.len());
    let mut table = String::new();
    let _ = writeln!(
        table,
        "| request | aspect | reference | cairn | allowed |\n|---|---|---|---|---|"
    );
    let mut unexpected = Vec::new();
    for r in &c.rows {
        let ok = allowed
            .iter()
            .any(|(l, a, _)| *l == r.label && *a == r.aspect);
        let (x, y) = describe(&r.reference, &r.cairn);
        let _ = writeln!(
            table,
            "| {} | {} | {} | {} | {} |",
            r.label,
            r.aspect,
            x,
            y,
            if ok { "yes" } else { "NO" }
        );
        if !ok {
            unexpected.push(format!("(\"{}\", \"{}\", \"\"),", r.label, r.aspect));
        }
    }
    println!("{table}");
    let stale: Vec<String> = allowed
        .iter()
        .filter(|(l, a, _)| !c.rows.iter().any(|r| r.label == *l && r.aspect == *a))
        .map(|(l, a, why)| format!("{l} / {a} ({why})"))
        .collect();
    let out = cairn_tests::log_dir()
        .parent()
        .expect("profile dir")
        .join(report_name);
    let _ = std::fs::write(
        &out,
        format!(
            "{figure}\n\n{table}\n\nBodies of the differing requests:\n\n{}",
            c.report
        ),
    );
    println!(
        "bodies of the differing requests: {}; reference log: {}",
        out.display(),
        reference.log.display()
    );
    assert!(
        unexpected.is_empty(),
        "{} differences not in the allow-list:\n{}",
        unexpected.len(),
        unexpected.join("\n")
    );
    assert!(
        stale.is_empty(),
        "allow-list entries that no longer differ (remove them):\n{}",
        stale.join("\n")
    );
}

#[test]
fn the_same_requests_answer_alike_on_the_reference_and_cairn() {
    let reference = start_reference();
    let cairn = Server::dev();
    let ldap = start_dev_ldap("differential");
    let ldap_vars = |root: &str| -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        m.insert("root".into(), root.to_string());
        m.insert(
            "ldap_url".into(),
            ldap.get("CAIRN_LDAP_URL").cloned().expect("ldap url"),
        );
        m.insert(
            "ldap_binddn".into(),
            ldap.get("CAIRN_LDAP_BINDDN").cloned().expect("ldap binddn"),
        );
        m
    };
    let mut targets = [
        Target {
            name: "reference",
            addr: reference.addr.clone(),
            root: "root".into(),
            vars: ldap_vars("root"),
            agent: agent(Duration::from_secs(60)),
        },
        Target {
            name: "cairn",
            addr: cairn.addr.clone(),
            root: cairn.root_token.clone(),
            vars: ldap_vars(&cairn.root_token),
            agent: agent(Duration::from_secs(60)),
        },
    ];

    // The one set-up difference not compared: a dev Cairn mounts the LDAP method at
    // auth/ldap/ (the reference's dev server does not), so it is unmounted first and both
    // servers start from the same auth table.
    let r = cairn.delete("sys/auth/ldap");
    assert!(r.status < 300, "unmount cairn's dev ldap: {r:?}");

    let script = script();
    assert!(
        script.steps.len() >= 200,
        "only {} requests",
        script.steps.len()
    );
    let c = compare(&mut targets, &script, &ASPECTS);
    let figure = format!(
        "{}/{} statuses match, {}/{} shapes match",
        c.status_ok, c.total, c.shape_ok, c.total
    );
    judge(&c, &figure, ALLOWED, "differential-report.txt", &reference);
}

// --- The LDAP part against Active Directory.

/// The aspects compared for the AD logins: those of the main test, and the token's
/// policies (the groups found, nested ones included, mapped to policies) by value.
const AD_ASPECTS: [&str; 6] = [
    "status",
    "data",
    "auth",
    "wrap_info",
    "warnings",
    "policies",
];

/// Known differences of the AD script: the config read's extensions and the two of every
/// successful LDAP login.
const AD_ALLOWED: &[(&str, &str, &str)] = &[
    ("ad config upn read", "data", LDAPCFG),
    ("ad upn login alice", "data", LOGINDATA),
    ("ad upn login bob", "data", LOGINDATA),
    ("ad upn login alice by UPN", "data", LOGINDATA),
    ("ad sam login alice", "data", LOGINDATA),
    ("ad sam login alice uppercase", "data", LOGINDATA),
    ("ad tokengroups login alice", "data", LOGINDATA),
    ("ad tokengroups login bob", "data", LOGINDATA),
];

/// The LDAP requests against the AD: three configurations an AD admin writes (UPN binds
/// with the in-chain group filter; a service account finding users by sAMAccountName with
/// groups from memberOf; tokenGroups), each with good and wrong passwords, UPN names,
/// nested groups, a disabled account and an unknown user. Alice's wrong password is tried
/// once per server only: the domain locks an account after three bad binds.
fn ad_script() -> Script {
    let mut s = Script::default();
    s.post("ad enable ldap", "sys/auth/ldap", json!({"type": "ldap"}));
    // eng holds alice; all-staff holds eng (alice is in it through the nesting only).
    for (g, p) in [
        ("eng", "eng-pol"),
        ("all-staff", "staff-pol"),
        ("ops", "ops-pol"),
    ] {
        s.post(
            &format!("ad group write {g}"),
            &format!("auth/ldap/groups/{g}"),
            json!({ "policies": p }),
        );
    }
    let login = |s: &mut Script, label: &str, user: &str, pw: &str| {
        s.post(
            label,
            &format!("auth/ldap/login/{user}"),
            json!({ "password": pw }),
        )
        .anon();
    };
    // 1. UPN binds (alice -> alice@cairn.test), the user's own identity searches; groups
    // by the in-chain rule, so nested groups count.
    s.post(
        "ad config upn",
        "auth/ldap/config",
        json!({"url": "${ad_url}", "certificate": "${ad_ca}", "upndomain": "cairn.test",
               "userdn": "CN=Users,DC=cairn,DC=test", "userattr": "userPrincipalName",
               "groupdn": "DC=cairn,DC=test",
               "groupfilter": "(&(objectClass=group)(member:1.2.840.113556.1.4.1941:={{.UserDN}}))",
               "groupattr": "cn"}),
    );
    s.get("ad config upn read", "auth/ldap/config");
    login(&mut s, "ad upn login alice", "alice", "Alice-Pass1!");
    login(&mut s, "ad upn login bob", "bob", "Bob-Pass1!");
    login(
        &mut s,
        "ad upn login alice wrong password",
        "alice",
        "Wrong-Pass1!",
    );
    login(
        &mut s,
        "ad upn login unknown user",
        "nobody",
        "Nobody-Pass1!",
    );
    login(
        &mut s,
        "ad upn login disabled carol",
        "carol",
        "Carol-Pass1!",
    );
    login(
        &mut s,
        "ad upn login must-change dave",
        "dave",
        "Dave-Pass1!",
    );
    // 2. A UPN as the login name: a service account finds the entry by userPrincipalName.
    // (A config write keeps the fields it does not name, on both servers: upndomain goes.)
    s.post(
        "ad config upn names",
        "auth/ldap/config",
        json!({"url": "${ad_url}", "certificate": "${ad_ca}", "upndomain": "",
               "binddn": "${ad_binddn}", "bindpass": "${ad_bindpass}",
               "userdn": "CN=Users,DC=cairn,DC=test", "userattr": "userPrincipalName",
               "groupdn": "DC=cairn,DC=test",
               "groupfilter": "(&(objectClass=group)(member:1.2.840.113556.1.4.1941:={{.UserDN}}))",
               "groupattr": "cn"}),
    );
    login(
        &mut s,
        "ad upn login alice by UPN",
        "alice@cairn.test",
        "Alice-Pass1!",
    );
    login(
        &mut s,
        "ad upn login bob by UPN wrong password",
        "bob@cairn.test",
        "Wrong-Pass1!",
    );
    // 3. sAMAccountName with discoverdn; groups from memberOf (direct ones only).
    s.post(
        "ad config sam",
        "auth/ldap/config",
        json!({"url": "${ad_url}", "certificate": "${ad_ca}", "discoverdn": true, "upndomain": "",
               "binddn": "${ad_binddn}", "bindpass": "${ad_bindpass}",
               "userdn": "CN=Users,DC=cairn,DC=test", "userattr": "sAMAccountName",
               "groupdn": "CN=Users,DC=cairn,DC=test",
               "groupfilter": "(&(objectClass=user)(sAMAccountName={{.Username}}))",
               "groupattr": "memberOf"}),
    );
    login(&mut s, "ad sam login alice", "alice", "Alice-Pass1!");
    login(
        &mut s,
        "ad sam login alice uppercase",
        "ALICE",
        "Alice-Pass1!",
    );
    login(
        &mut s,
        "ad sam login unknown user",
        "nobody",
        "Nobody-Pass1!",
    );
    login(&mut s, "ad sam login expired gina", "gina", "Gina-Pass1!");
    // 4. tokenGroups: every group, nested ones included, from the user entry's SIDs.
    s.post(
        "ad config tokengroups",
        "auth/ldap/config",
        json!({"url": "${ad_url}", "certificate": "${ad_ca}", "discoverdn": false,
               "binddn": "${ad_binddn}", "bindpass": "${ad_bindpass}",
               "userdn": "CN=Users,DC=cairn,DC=test", "userattr": "sAMAccountName",
               "groupdn": "DC=cairn,DC=test", "groupattr": "cn",
               "use_token_groups": true}),
    );
    login(
        &mut s,
        "ad tokengroups login alice",
        "alice",
        "Alice-Pass1!",
    );
    login(&mut s, "ad tokengroups login bob", "bob", "Bob-Pass1!");
    login(
        &mut s,
        "ad tokengroups login unknown user",
        "nobody",
        "Nobody-Pass1!",
    );
    s
}

/// The token policies of a login, sorted, or "-" when the answer has none.
fn policy_set(r: &Resp) -> String {
    match r.body["auth"]["policies"].as_array() {
        Some(a) => {
            let mut p: Vec<&str> = a.iter().filter_map(Value::as_str).collect();
            p.sort_unstable();
            p.join(",")
        }
        None => "-".into(),
    }
}

#[test]
fn the_ldap_logins_answer_alike_against_active_directory() {
    // The DC starts (about 10 s) while the reference does.
    let dc = std::thread::spawn(|| {
        let dir = std::env::temp_dir().join(format!("cairn-e2e-diff-ad-{}", std::process::id()));
        cairn_tests::start_dev_directory("dev-ad.sh", &dir, "CAIRN_AD_WATCH_PID")
    });
    let reference = start_reference();
    let cairn = Server::dev();
    let ad = dc.join().expect("dev-ad.sh start");
    let get = |k: &str| {
        ad.get(k)
            .cloned()
            .unwrap_or_else(|| panic!("dev-ad.sh did not export {k}"))
    };
    let ca = std::fs::read_to_string(get("AD_CA")).expect("the DC's CA");
    let vars = |root: &str| -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        m.insert("root".into(), root.to_string());
        m.insert("ad_url".into(), get("AD_URL"));
        m.insert("ad_ca".into(), ca.clone());
        m.insert("ad_binddn".into(), get("AD_BINDDN"));
        m.insert("ad_bindpass".into(), get("AD_BINDPASS"));
        m
    };
    let mut targets = [
        Target {
            name: "reference",
            addr: reference.addr.clone(),
            root: "root".into(),
            vars: vars("root"),
            agent: agent(Duration::from_secs(60)),
        },
        Target {
            name: "cairn",
            addr: cairn.addr.clone(),
            root: cairn.root_token.clone(),
            vars: vars(&cairn.root_token),
            agent: agent(Duration::from_secs(60)),
        },
    ];
    let r = cairn.delete("sys/auth/ldap");
    assert!(r.status < 300, "unmount cairn's dev ldap: {r:?}");
    let script = ad_script();
    let c = compare(&mut targets, &script, &AD_ASPECTS);
    let figure = format!(
        "active directory: {}/{} statuses match, {}/{} shapes and policy sets match",
        c.status_ok, c.total, c.shape_ok, c.total
    );
    // Not alike by accident: the logins succeed and fail where AD says so (the same on
    // the reference, or the comparison below fails), and nested groups count.
    let want = [
        ("ad upn login alice", 200, "default,eng-pol,staff-pol"),
        ("ad upn login bob", 200, "default,ops-pol"),
        ("ad upn login alice wrong password", 400, "-"),
        ("ad upn login unknown user", 400, "-"),
        ("ad upn login disabled carol", 400, "-"),
        ("ad upn login must-change dave", 400, "-"),
        (
            "ad upn login alice by UPN",
            200,
            "default,eng-pol,staff-pol",
        ),
        ("ad upn login bob by UPN wrong password", 400, "-"),
        ("ad sam login alice", 200, "default,eng-pol"),
        ("ad sam login alice uppercase", 200, "default,eng-pol"),
        ("ad sam login unknown user", 400, "-"),
        ("ad sam login expired gina", 400, "-"),
        (
            "ad tokengroups login alice",
            200,
            "default,eng-pol,staff-pol",
        ),
        ("ad tokengroups login bob", 200, "default,ops-pol"),
        ("ad tokengroups login unknown user", 400, "-"),
    ];
    for (label, status, policies) in want {
        let got = c.cairn.get(label).expect(label);
        if *got != (status, policies.to_string()) {
            println!("{figure}\n{}", c.report);
        }
        assert_eq!(*got, (status, policies.to_string()), "{label}");
    }
    judge(
        &c,
        &figure,
        AD_ALLOWED,
        "differential-ad-report.txt",
        &reference,
    );
}

mod script_identity;
mod script_kv;
mod script_misc;
mod script_sys;
