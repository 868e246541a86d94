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
const WRAPUSE: &str = "the reference spends the single use of a wrapping token on a denied lookup-self; Cairn spends uses only on authorised requests";
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
    ("wrapping unwrap wrap3", "status", WRAPUSE),
    ("wrapping unwrap wrap3", "data", WRAPUSE),
    ("wrapping unwrap wrap3", "auth", WRAPUSE),
    ("wrapping unwrap wrap3", "wrap_info", WRAPUSE),
    ("wrapping unwrap wrap3", "warnings", WRAPUSE),
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
