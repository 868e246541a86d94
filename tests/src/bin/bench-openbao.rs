//! `bench-openbao`: Cairn next to the reference server on the same machine, with the same load
//! generator (`cairn_tests::loadgen`: keep-alive connections, every answer checked), the same
//! request bodies and the same setup. Run through `scripts/bench.sh`.
//!
//! `bench-openbao openbao [SECONDS] [ROUNDS] [CLIENTS]`: `cairn server --dev` (SQLite) and
//! OpenBao 2.6.2 (`bao` from `scripts/reference.sh`, non-dev on its raft integrated storage
//! in a temp dir, initialised and unsealed here), both durable, both logging in against one
//! slapd (`scripts/dev-ldap.sh`). The phases alternate between the servers (Cairn, OpenBao,
//! next workload, ...), ROUNDS times over: LDAP login, token create, KV v1 write, KV v2
//! write, KV v1 read, `auth/token/lookup-self`. Each phase: correct answers/s, p50/p99, and
//! the server's CPU per request (utime + stime from `/proc/<pid>/stat` over the phase);
//! the spread over the rounds is printed, then both servers' RSS.
//! `BENCH_ONLY=cairn` or `BENCH_ONLY=openbao` runs one side (for profiling).
//!
//! `bench-openbao kv-read-limit [SECONDS] [CLIENTS] [ROUNDS]`: Cairn's KV v1 reads over HTTP
//! against `bench-hello` (the same vendored tiny_http and thread model answering a fixed
//! body, the bytes of a Cairn read), phases alternating.

use cairn_tests::keepalive::KeepAlive;
use cairn_tests::loadgen::{self, spread, MakeOp, Op, Phase};
use cairn_tests::{agent, cairn_bin, free_port_pair, repo_root, request, tmpdir, Resp, TempDir};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Keys each client reads (written before the run).
const READ_KEYS: u64 = 20;
/// The slapd sample directory's users with two groups each, their password and the policies
/// their login must carry (the groups mapped below plus `default`).
const USERS: &[(&str, &str, &[&str])] = &[
    ("alice", "alice-pw", &["default", "eng", "ops"]),
    ("bob", "bob-pw", &["default", "ops", "posix"]),
];
/// LDAP groups and the policy each maps to, on both servers.
const GROUPS: &[(&str, &str)] = &[
    ("engineers", "eng"),
    ("ops", "ops"),
    ("posix-users", "posix"),
];
const BENCH_POLICY: &str = r#"path "kv1/*" { capabilities = ["create", "read", "update", "list"] }
path "kv2/*" { capabilities = ["create", "read", "update", "list"] }"#;

/// A server under test and what the workloads need from it.
struct Target {
    name: &'static str,
    /// `http://127.0.0.1:PORT`.
    url: String,
    pid: u32,
    root: String,
    /// A token with the `bench` policy (KV and lookup-self).
    token: String,
    child: Child,
    _dir: TempDir,
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn call(t_url: &str, token: Option<&str>, method: &str, path: &str, body: Option<Value>) -> Resp {
    let a = agent(Duration::from_secs(30));
    request(&a, t_url, token, method, path, body.as_ref()).unwrap_or(Resp {
        status: 0,
        body: Value::Null,
    })
}

/// Polls `ready` every 100 ms for up to `secs`.
fn wait_for(what: &str, secs: u64, mut ready: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ready() {
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "{what}: not ready after {secs} s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `cairn server --dev` (release build next to this binary) at log level info.
fn start_cairn() -> Target {
    let dir = tmpdir("bench-vs-cairn");
    let port = free_port_pair();
    let bin = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("cairn")))
        .filter(|b| b.exists())
        .unwrap_or_else(cairn_bin);
    let log = std::fs::File::create(dir.join("cairn.log")).expect("log file");
    let mut child = Command::new(bin)
        .args(["server", "--dev", "--dev-listen-address"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["--dev-root-token-id", "root-bench", "--log-level", "info"])
        .env("HOME", dir.path())
        .env("TMPDIR", dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn cairn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    for line in lines.by_ref() {
        if line.expect("cairn stdout").starts_with("Root Token: ") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let url = format!("http://127.0.0.1:{port}");
    wait_for("cairn", 30, || {
        call(&url, None, "GET", "sys/health", None).status == 200
    });
    Target {
        name: "Cairn",
        url,
        pid: child.id(),
        root: "root-bench".into(),
        token: String::new(),
        child,
        _dir: dir,
    }
}

/// OpenBao 2.6.2 on raft storage in a temp dir, initialised (one key share) and unsealed.
fn start_openbao() -> Target {
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/reference.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/reference.sh");
    assert!(out.status.success(), "scripts/reference.sh failed");
    let bao = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let dir = tmpdir("bench-vs-openbao");
    let port = free_port_pair();
    std::fs::create_dir_all(dir.join("raft")).expect("raft dir");
    let cfg = format!(
        r#"storage "raft" {{
  path = "{raft}"
  node_id = "n1"
}}
listener "tcp" {{
  address = "127.0.0.1:{port}"
  tls_disable = true
}}
api_addr = "http://127.0.0.1:{port}"
cluster_addr = "http://127.0.0.1:{cport}"
disable_mlock = true
log_level = "info"
"#,
        raft = dir.join("raft").display(),
        cport = port + 1
    );
    std::fs::write(dir.join("bao.hcl"), cfg).expect("write bao.hcl");
    let log = std::fs::File::create(dir.join("bao.log")).expect("log file");
    let child = Command::new(&bao)
        .arg("server")
        .arg(format!("-config={}", dir.join("bao.hcl").display()))
        .stdout(Stdio::from(log.try_clone().expect("log file")))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {bao}: {e}"));
    let url = format!("http://127.0.0.1:{port}");
    wait_for("openbao listener", 60, || {
        call(&url, None, "GET", "sys/seal-status", None).status == 200
    });
    let init = call(
        &url,
        None,
        "PUT",
        "sys/init",
        Some(json!({"secret_shares": 1, "secret_threshold": 1})),
    );
    assert_eq!(init.status, 200, "openbao init: {}", init.body);
    let key = init.body["keys_base64"][0].as_str().expect("unseal key");
    let root = init.body["root_token"]
        .as_str()
        .expect("root token")
        .to_string();
    let r = call(&url, None, "PUT", "sys/unseal", Some(json!({ "key": key })));
    assert_eq!(r.status, 200, "openbao unseal: {}", r.body);
    // Raft elects this node first; then it is active.
    wait_for("openbao active", 60, || {
        call(&url, None, "GET", "sys/health", None).status == 200
    });
    Target {
        name: "OpenBao",
        url,
        pid: child.id(),
        root,
        token: String::new(),
        child,
        _dir: dir,
    }
}

/// The same setup on both servers: policies, the LDAP method (mounted if absent) with the same
/// configuration and group mappings, KV v1 at `kv1/`, KV v2 at `kv2/`, a `bench` token, and the
/// keys the read phases read.
fn setup(t: &mut Target, ldap: &BTreeMap<String, String>, clients: usize) {
    let root = t.root.clone();
    let c = |method: &str, path: &str, body: Option<Value>| {
        call(&t.url, Some(&root), method, path, body)
    };
    let ok = |r: Resp, what: &str| {
        assert!(
            r.status < 300,
            "{}: {what}: {} {}",
            t.name,
            r.status,
            r.body
        );
        r
    };
    ok(
        c(
            "PUT",
            "sys/policy/bench",
            Some(json!({ "policy": BENCH_POLICY })),
        ),
        "policy bench",
    );
    for (_, p) in GROUPS {
        let rule = format!(r#"path "kv1/{p}/*" {{ capabilities = ["read"] }}"#);
        ok(
            c(
                "PUT",
                &format!("sys/policy/{p}"),
                Some(json!({ "policy": rule })),
            ),
            "policy",
        );
    }
    let auths = c("GET", "sys/auth", None);
    let has_ldap = auths.body.get("ldap/").is_some() || auths.body["data"].get("ldap/").is_some();
    if !has_ldap {
        ok(
            c("POST", "sys/auth/ldap", Some(json!({"type": "ldap"}))),
            "enable ldap",
        );
    }
    let get = |k: &str| ldap.get(k).cloned().unwrap_or_default();
    ok(
        c(
            "POST",
            "auth/ldap/config",
            Some(json!({
                "url": get("CAIRN_LDAP_URL"),
                "binddn": get("CAIRN_LDAP_BINDDN"),
                "bindpass": get("CAIRN_LDAP_BINDPASS"),
                "userdn": "ou=people,dc=cairn,dc=test",
                "userattr": "uid",
                "groupdn": "ou=groups,dc=cairn,dc=test",
                "groupfilter": "(|(memberUid={{.Username}})(member={{.UserDN}})(uniqueMember={{.UserDN}}))",
            })),
        ),
        "ldap config",
    );
    for (g, p) in GROUPS {
        ok(
            c(
                "POST",
                &format!("auth/ldap/groups/{g}"),
                Some(json!({ "policies": p })),
            ),
            "ldap group",
        );
    }
    for (path, version) in [("kv1", "1"), ("kv2", "2")] {
        ok(
            c(
                "POST",
                &format!("sys/mounts/{path}"),
                Some(json!({"type": "kv", "options": {"version": version}})),
            ),
            "mount",
        );
    }
    let tok = ok(
        c(
            "POST",
            "auth/token/create",
            Some(json!({"policies": ["bench"], "ttl": "24h"})),
        ),
        "bench token",
    );
    t.token = tok.body["auth"]["client_token"]
        .as_str()
        .expect("bench token")
        .to_string();
    let token = t.token.clone();
    // A new KV v2 mount may take a moment to accept writes (the reference upgrades it).
    wait_for("kv2 writable", 60, || {
        call(
            &t.url,
            Some(&token),
            "POST",
            "kv2/data/probe",
            Some(json!({"data": {"v": 1}})),
        )
        .status
            == 200
    });
    for th in 0..clients as u64 {
        for k in 0..READ_KEYS {
            let r = call(
                &t.url,
                Some(&token),
                "PUT",
                &format!("kv1/r/{th}/{k}"),
                Some(json!({ "value": read_value(th, k) })),
            );
            ok(r, "read key");
        }
    }
}

/// The value stored at `kv1/r/<client>/<k>` (64 bytes).
fn read_value(client: u64, k: u64) -> String {
    let v = format!("v-{client}-{k}-");
    format!("{v}{}", "x".repeat(64 - v.len()))
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Work {
    Login,
    TokenCreate,
    Kv1Write,
    Kv2Write,
    KvRead,
    LookupSelf,
}

const WORKLOADS: [Work; 6] = [
    Work::Login,
    Work::TokenCreate,
    Work::Kv1Write,
    Work::Kv2Write,
    Work::KvRead,
    Work::LookupSelf,
];

impl Work {
    fn label(self) -> &'static str {
        match self {
            Work::Login => "LDAP login `POST auth/ldap/login/<user>`",
            Work::TokenCreate => "token create `POST auth/token/create`",
            Work::Kv1Write => "KV v1 write `PUT kv1/<new key>`",
            Work::Kv2Write => "KV v2 write `POST kv2/data/<new key>`",
            Work::KvRead => "KV v1 read `GET kv1/<key>`",
            Work::LookupSelf => "`GET auth/token/lookup-self`",
        }
    }
    /// Whether the issue's throughput target (≥ 5×) applies.
    fn throughput_target(self) -> bool {
        matches!(
            self,
            Work::Login | Work::TokenCreate | Work::Kv1Write | Work::Kv2Write
        )
    }
}

fn parse(body: &[u8]) -> Result<Value, String> {
    serde_json::from_slice(body).map_err(|e| format!("not JSON ({e})"))
}

/// The sorted strings of a JSON array.
fn sorted_strings(v: &Value) -> Vec<String> {
    let mut out: Vec<String> = v
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Client `t`'s operation for `work` against `target`; `tag` makes written keys new in
/// every phase. Every answer is checked: status and the field that shows it did its work.
fn make_op(work: Work, root: &str, token: &str, tag: u64) -> MakeOp {
    let (root, token) = (root.to_string(), token.to_string());
    Arc::new(move |t: usize| -> Op {
        let (root, token) = (root.clone(), token.clone());
        let t = t as u64;
        let json_ct = ("Content-Type", "application/json");
        match work {
            Work::Login => {
                let reqs: Vec<(String, Vec<u8>, Vec<String>)> = USERS
                    .iter()
                    .map(|(u, p, pol)| {
                        (
                            format!("/v1/auth/ldap/login/{u}"),
                            json!({ "password": p }).to_string().into_bytes(),
                            pol.iter().map(|s| s.to_string()).collect(),
                        )
                    })
                    .collect();
                Box::new(move |c: &mut KeepAlive, i| {
                    let (path, body, want) = &reqs[((t + i) % reqs.len() as u64) as usize];
                    let r = c.call("POST", path, &[json_ct], body)?;
                    let v = parse(&r.body)?;
                    let got = sorted_strings(&v["auth"]["policies"]);
                    let tok = v["auth"]["client_token"].as_str().unwrap_or("");
                    if r.status == 200 && !tok.is_empty() && &got == want {
                        Ok(())
                    } else {
                        Err(format!("login {path}: {} policies {got:?}", r.status))
                    }
                })
            }
            Work::TokenCreate => {
                let body = json!({"policies": ["bench"], "ttl": "1h"})
                    .to_string()
                    .into_bytes();
                Box::new(move |c: &mut KeepAlive, _| {
                    let r = c.call(
                        "POST",
                        "/v1/auth/token/create",
                        &[("X-Vault-Token", &root), json_ct],
                        &body,
                    )?;
                    let v = parse(&r.body)?;
                    let got = sorted_strings(&v["auth"]["policies"]);
                    let tok = v["auth"]["client_token"].as_str().unwrap_or("");
                    if r.status == 200 && !tok.is_empty() && got == ["bench", "default"] {
                        Ok(())
                    } else {
                        Err(format!("token create: {} policies {got:?}", r.status))
                    }
                })
            }
            Work::Kv1Write => Box::new(move |c: &mut KeepAlive, i| {
                let body = json!({ "value": read_value(t, i) }).to_string();
                let path = format!("/v1/kv1/w/{tag}/{t}/{i}");
                let r = c.call(
                    "PUT",
                    &path,
                    &[("X-Vault-Token", &token), json_ct],
                    body.as_bytes(),
                )?;
                if r.status == 204 {
                    Ok(())
                } else {
                    Err(format!(
                        "kv1 write: {} {}",
                        r.status,
                        String::from_utf8_lossy(&r.body)
                    ))
                }
            }),
            Work::Kv2Write => Box::new(move |c: &mut KeepAlive, i| {
                let body = json!({"data": { "value": read_value(t, i) }}).to_string();
                let path = format!("/v1/kv2/data/w/{tag}/{t}/{i}");
                let r = c.call(
                    "POST",
                    &path,
                    &[("X-Vault-Token", &token), json_ct],
                    body.as_bytes(),
                )?;
                let v = parse(&r.body)?;
                // A new key: its first version.
                if r.status == 200 && v["data"]["version"] == json!(1) {
                    Ok(())
                } else {
                    Err(format!("kv2 write: {} {v}", r.status))
                }
            }),
            Work::KvRead => Box::new(move |c: &mut KeepAlive, i| {
                let k = i % READ_KEYS;
                let path = format!("/v1/kv1/r/{t}/{k}");
                let r = c.call("GET", &path, &[("X-Vault-Token", &token)], b"")?;
                let v = parse(&r.body)?;
                if r.status == 200 && v["data"]["value"].as_str() == Some(&read_value(t, k)) {
                    Ok(())
                } else {
                    Err(format!("kv read {path}: {} {v}", r.status))
                }
            }),
            Work::LookupSelf => Box::new(move |c: &mut KeepAlive, _| {
                let r = c.call(
                    "GET",
                    "/v1/auth/token/lookup-self",
                    &[("X-Vault-Token", &token)],
                    b"",
                )?;
                let v = parse(&r.body)?;
                let pol = sorted_strings(&v["data"]["policies"]);
                if r.status == 200
                    && v["data"]["id"].as_str() == Some(&token)
                    && pol == ["bench", "default"]
                {
                    Ok(())
                } else {
                    Err(format!("lookup-self: {} policies {pol:?}", r.status))
                }
            }),
        }
    })
}

fn addr_of(url: &str) -> &str {
    url.trim_start_matches("http://")
}

/// Prints a phase's errors (first messages) on stderr.
fn report_errors(name: &str, work: Work, p: &Phase) {
    if p.errors > 0 {
        eprintln!("{name} {work:?}: {} failed or wrong answers", p.errors);
        for s in &p.samples {
            eprintln!("  {s}");
        }
    }
}

fn openbao(secs: f64, rounds: usize, clients: usize) {
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let ldap_dir = std::env::temp_dir().join(format!("cairn-bench-vs-ldap-{}", std::process::id()));
    let ldap = cairn_tests::start_dev_directory("dev-ldap.sh", &ldap_dir, "CAIRN_LDAP_WATCH_PID");
    let slapd_pid: u32 = std::fs::read_to_string(ldap_dir.join("main/slapd.pid"))
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or(0);
    let mut servers = Vec::new();
    if only != "openbao" {
        servers.push(start_cairn());
    }
    if only != "cairn" {
        servers.push(start_openbao());
    }
    for s in servers.iter_mut() {
        setup(s, &ldap, clients);
    }
    eprintln!(
        "set up; {rounds} rounds of {} phases of {secs} s",
        WORKLOADS.len() * servers.len()
    );
    // results[(work, server index)] = one phase per round.
    let mut results: BTreeMap<(Work, usize), Vec<Phase>> = BTreeMap::new();
    for round in 0..rounds {
        for work in WORKLOADS {
            for (si, s) in servers.iter().enumerate() {
                let op = make_op(work, &s.root, &s.token, round as u64);
                let p = loadgen::run(addr_of(&s.url), clients, secs, &[s.pid, slapd_pid], op);
                report_errors(s.name, work, &p);
                eprintln!(
                    "round {} {} {work:?}: {:.0}/s p99 {:.2} ms, {:.0} µs CPU/req, {} errors",
                    round + 1,
                    s.name,
                    p.rate(),
                    p.pct(0.99),
                    p.cpu_us(0),
                    p.errors
                );
                results.entry((work, si)).or_default().push(p);
            }
        }
    }
    let rss: Vec<(f64, f64)> = servers.iter().map(|s| loadgen::rss_mib(s.pid)).collect();
    print_openbao(&servers, &results, &rss, secs, rounds, clients);
    drop(servers);
    let _ = Command::new("bash")
        .arg(repo_root().join("scripts/dev-ldap.sh"))
        .arg("stop")
        .arg(&ldap_dir)
        .stderr(Stdio::null())
        .status();
}

fn print_openbao(
    servers: &[Target],
    results: &BTreeMap<(Work, usize), Vec<Phase>>,
    rss: &[(f64, f64)],
    secs: f64,
    rounds: usize,
    clients: usize,
) {
    let metric = |w: Work, si: usize, f: &dyn Fn(&Phase) -> f64| -> Vec<f64> {
        results
            .get(&(w, si))
            .map(|v| v.iter().map(f).collect())
            .unwrap_or_default()
    };
    let ratio = |a: &[f64], b: &[f64]| -> Vec<f64> {
        a.iter().zip(b).map(|(x, y)| x / y.max(1e-9)).collect()
    };
    println!("{clients} clients, {rounds} rounds, {secs} s per phase; each cell is the min–max over the rounds.");
    println!();
    if servers.len() < 2 {
        println!("| workload | server | requests/s | p50 ms | p99 ms | server CPU µs/req | wrong or failed |");
        println!("|---|---|---:|---:|---:|---:|---:|");
        for w in WORKLOADS {
            for (si, s) in servers.iter().enumerate() {
                let errs: u64 = results
                    .get(&(w, si))
                    .map(|v| v.iter().map(|p| p.errors).sum())
                    .unwrap_or(0);
                println!(
                    "| {} | {} | {} | {} | {} | {} | {errs} |",
                    w.label(),
                    s.name,
                    spread(&metric(w, si, &|p| p.rate()), 0),
                    spread(&metric(w, si, &|p| p.pct(0.5)), 2),
                    spread(&metric(w, si, &|p| p.pct(0.99)), 2),
                    spread(&metric(w, si, &|p| p.cpu_us(0)), 0),
                );
            }
        }
        return;
    }
    println!("| workload | Cairn req/s | OpenBao req/s | req/s ratio | Cairn p50 / p99 ms | OpenBao p50 / p99 ms | p99 ratio | Cairn CPU µs/req | OpenBao CPU µs/req | CPU ratio | wrong or failed (Cairn / OpenBao) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut verdicts = Vec::new();
    for w in WORKLOADS {
        let rate = [metric(w, 0, &|p| p.rate()), metric(w, 1, &|p| p.rate())];
        let p50 = [metric(w, 0, &|p| p.pct(0.5)), metric(w, 1, &|p| p.pct(0.5))];
        let p99 = [
            metric(w, 0, &|p| p.pct(0.99)),
            metric(w, 1, &|p| p.pct(0.99)),
        ];
        let cpu = [
            metric(w, 0, &|p| p.cpu_us(0)),
            metric(w, 1, &|p| p.cpu_us(0)),
        ];
        let errs = [
            metric(w, 0, &|p| p.errors as f64).iter().sum::<f64>(),
            metric(w, 1, &|p| p.errors as f64).iter().sum::<f64>(),
        ];
        let (rr, pr, cr) = (
            ratio(&rate[0], &rate[1]),
            ratio(&p99[0], &p99[1]),
            ratio(&cpu[0], &cpu[1]),
        );
        println!(
            "| {} | {} | {} | **{}×** | {} / {} | {} / {} | {}× | {} | {} | **{}×** | {} / {} |",
            w.label(),
            spread(&rate[0], 0),
            spread(&rate[1], 0),
            spread(&rr, 2),
            spread(&p50[0], 2),
            spread(&p99[0], 2),
            spread(&p50[1], 2),
            spread(&p99[1], 2),
            spread(&pr, 2),
            spread(&cpu[0], 0),
            spread(&cpu[1], 0),
            spread(&cr, 2),
            errs[0],
            errs[1]
        );
        let max = |v: &[f64]| v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
        let yes = |b: bool| if b { "met" } else { "MISSED" };
        let mut v = format!(
            "- {:?}: CPU ≤ 1/5: {}; p99 not higher: {}",
            w,
            yes(max(&cr) <= 0.2),
            yes(max(&pr) <= 1.0)
        );
        if w.throughput_target() {
            v.push_str(&format!("; throughput ≥ 5×: {}", yes(min(&rr) >= 5.0)));
        }
        verdicts.push(v);
    }
    let slapd: Vec<String> = (0..2)
        .map(|si| spread(&metric(Work::Login, si, &|p| p.cpu_us(1)), 0))
        .collect();
    println!();
    println!(
        "slapd CPU µs per login: behind Cairn {}, behind OpenBao {}",
        slapd[0], slapd[1]
    );
    println!();
    println!("| after the run | VmRSS MiB | VmHWM MiB |");
    println!("|---|---:|---:|");
    for (s, (r, h)) in servers.iter().zip(rss) {
        println!("| {} | {r:.0} | {h:.0} |", s.name);
    }
    println!();
    for v in verdicts {
        println!("{v}");
    }
}

/// `bench-hello` on a free port answering `body`.
fn start_hello(body: &[u8]) -> (Child, String) {
    let port = free_port_pair();
    let bin = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("bench-hello")))
        .expect("bench-hello next to this binary");
    let child = Command::new(bin)
        .arg(port.to_string())
        .env("BENCH_HELLO_BODY", String::from_utf8_lossy(body).as_ref())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn bench-hello");
    let url = format!("http://127.0.0.1:{port}");
    wait_for("bench-hello", 10, || {
        call(&url, None, "GET", "x", None).status == 200
    });
    (child, url)
}

fn kv_read_limit(secs: f64, clients: usize, rounds: usize) {
    let mut cairn = start_cairn();
    let no_ldap = BTreeMap::new();
    setup(&mut cairn, &no_ldap, clients);
    let mut probe = KeepAlive::new(addr_of(&cairn.url), Duration::from_secs(10));
    let sample = probe
        .call(
            "GET",
            "/v1/kv1/r/0/0",
            &[("X-Vault-Token", &cairn.token)],
            b"",
        )
        .expect("a Cairn read");
    assert_eq!(sample.status, 200);
    let (mut hello, hello_url) = start_hello(&sample.body);
    let hello_pid = hello.id();
    let fixed = Arc::new(sample.body.clone());
    let hello_op: MakeOp = Arc::new(move |_| {
        let fixed = fixed.clone();
        Box::new(move |c: &mut KeepAlive, i| {
            let k = i % READ_KEYS;
            let r = c.call(
                "GET",
                &format!("/v1/kv1/r/0/{k}"),
                &[("X-Vault-Token", "x")],
                b"",
            )?;
            if r.status == 200 && r.body == *fixed {
                Ok(())
            } else {
                Err(format!("hello: {}", r.status))
            }
        })
    });
    let (mut c_runs, mut h_runs) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let op = make_op(Work::KvRead, &cairn.root, &cairn.token, 0);
        let p = loadgen::run(addr_of(&cairn.url), clients, secs, &[cairn.pid], op);
        report_errors("Cairn", Work::KvRead, &p);
        c_runs.push(p);
        let p = loadgen::run(
            addr_of(&hello_url),
            clients,
            secs,
            &[hello_pid],
            hello_op.clone(),
        );
        report_errors("hello", Work::KvRead, &p);
        h_runs.push(p);
    }
    let _ = hello.kill();
    let _ = hello.wait();
    let col = |v: &[Phase], f: &dyn Fn(&Phase) -> f64| -> Vec<f64> { v.iter().map(f).collect() };
    println!("{clients} clients, {rounds} rounds, {secs} s per phase (min–max over the rounds).");
    println!();
    println!("| server | requests/s | p50 ms | p99 ms | server CPU µs/req | wrong or failed |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, v) in [
        (
            "Cairn `GET kv1/<key>` (KV v1 read, token checked, value decrypted)",
            &c_runs,
        ),
        (
            "tiny_http hello-world (`bench-hello`, same thread model, fixed body)",
            &h_runs,
        ),
    ] {
        println!(
            "| {name} | {} | {} | {} | {} | {} |",
            spread(&col(v, &|p| p.rate()), 0),
            spread(&col(v, &|p| p.pct(0.5)), 2),
            spread(&col(v, &|p| p.pct(0.99)), 2),
            spread(&col(v, &|p| p.cpu_us(0)), 0),
            v.iter().map(|p| p.errors).sum::<u64>()
        );
    }
    let ratios: Vec<f64> = c_runs
        .iter()
        .zip(&h_runs)
        .map(|(c, h)| c.rate() / h.rate().max(1e-9))
        .collect();
    let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    println!();
    println!(
        "Cairn reads / hello-world = {}× per round (target ≥ 0.7×: {})",
        spread(&ratios, 2),
        if min >= 0.7 { "met" } else { "MISSED" }
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let what = args.first().map(String::as_str).unwrap_or("openbao");
    let num = |i: usize, d: f64| -> f64 { args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d) };
    match what {
        "openbao" => openbao(
            num(1, 5.0),
            num(2, 3.0).max(1.0) as usize,
            num(3, 16.0) as usize,
        ),
        "kv-read-limit" => kv_read_limit(
            num(1, 5.0),
            num(2, 16.0) as usize,
            num(3, 3.0).max(1.0) as usize,
        ),
        other => {
            eprintln!("unknown benchmark {other:?}; available: openbao, kv-read-limit");
            std::process::exit(1);
        }
    }
}
