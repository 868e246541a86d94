//! `bench-login [SECONDS] [CLIENTS] [ROUNDS]`: LDAP logins/s and latency through a real `cairn`
//! (release build, `POST auth/ldap/login/<user>` over HTTP) against the throwaway slapd of
//! `scripts/dev-ldap.sh`, next to the same directory round trips made directly with ldap3's
//! sync client in the same run and with the same concurrency. Run through
//! `scripts/bench.sh login`.
//!
//! Configuration measured: authenticated search (binddn + bindpass + userfilter) and a group
//! search under `groupdn` with the default groupfilter. Per login, the direct baseline opens
//! one connection and makes the four round trips of the issue: service bind, user search,
//! user bind, group search (then unbinds). Cairn makes the same ones plus the reference's
//! re-bind as `binddn` before the group search (so the groups are searched by the service
//! identity, not the user), answers over HTTP and stores a token durably (SQLite commit).
//!
//! The phases alternate (direct, cairn, direct, cairn, ...: ROUNDS pairs, 2 by default),
//! each for SECONDS / ROUNDS after a short warm-up, so background load on the machine and
//! drifts in its speed hit both sides alike. A last phase measures a request without LDAP
//! (`auth/token/lookup-self`) for reading the figures.
//!
//! Cairn's clients are load generators sharing the 2 cores with what they measure: each
//! keeps one keep-alive connection with a lean HTTP client (`cairn_tests::keepalive`) and
//! checks every answer for a token; `BENCH_CLIENT=ureq` uses ureq instead (more CPU per
//! request on the client side, which this machine charges to Cairn's throughput).
//!
//! `bench-login --ad [SECONDS] [CLIENTS] [ROUNDS]` (`scripts/bench.sh ad-login`) measures the
//! same against the Samba Active Directory domain controller of `scripts/dev-ad.sh`, with the
//! configuration an AD administrator writes: LDAPS verified against the domain's CA, a
//! service account (`binddn`), users found by `sAMAccountName` under `CN=Users`, groups by
//! the in-chain matching rule from the domain root (nested groups count; the search
//! references AD returns are ignored). The direct baseline makes the same round trips over
//! LDAPS with the same CA, one connection per login.
//!
//! Diagnostics: `BENCH_DEBUG=1` prints each phase's time spent inside operations;
//! `BENCH_LOG_LEVEL=debug BENCH_KEEP_LOGS=1` keeps Cairn's log with each login's LDAP
//! timings (debug logging slows Cairn down). `TMPDIR` places Cairn's dev storage (and the
//! directory), e.g. on tmpfs to see what the durable commit costs.

use cairn_tests::keepalive::KeepAlive;
use cairn_tests::{cairn_bin, free_port_pair, tmpdir, Server};
use ldap3::{LdapConn, LdapConnSettings, Scope, SearchEntry};
use serde_json::json;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which directory the logins go to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The OpenLDAP slapd of `scripts/dev-ldap.sh`.
    Slapd,
    /// The Samba AD domain controller of `scripts/dev-ad.sh`.
    Ad,
}

impl Kind {
    fn script(self) -> &'static str {
        match self {
            Kind::Slapd => "dev-ldap.sh",
            Kind::Ad => "dev-ad.sh",
        }
    }
    fn watch_env(self) -> &'static str {
        match self {
            Kind::Slapd => "CAIRN_LDAP_WATCH_PID",
            Kind::Ad => "CAIRN_AD_WATCH_PID",
        }
    }
}

const BASE: &str = "dc=cairn,dc=test";
/// Users of the sample directory in two groups each (not carol: her 60 groups exceed the
/// server's size limit without paging; the twins are in none).
const USERS: &[&str] = &["alice", "bob"];
const GROUPFILTER: &str =
    "(|(memberUid={{.Username}})(member={{.UserDN}})(uniqueMember={{.UserDN}}))";

const AD_BASE: &str = "DC=cairn,DC=test";
/// The seeded domain's users: alice is in eng (nested in all-staff) and twenty more groups,
/// bob in ops.
const AD_USERS: &[(&str, &str)] = &[("alice", "Alice-Pass1!"), ("bob", "Bob-Pass1!")];
const AD_GROUPFILTER: &str = "(&(objectClass=group)(member:1.2.840.113556.1.4.1941:={{.UserDN}}))";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The directory of `scripts/dev-ldap.sh` or `scripts/dev-ad.sh`, stopped on drop (and
/// when this process dies).
struct Directory {
    kind: Kind,
    dir: PathBuf,
    env: BTreeMap<String, String>,
}

impl Directory {
    fn start(kind: Kind) -> Directory {
        let dir = std::env::temp_dir().join(format!(
            "cairn-bench-{}-{}",
            if kind == Kind::Ad { "ad" } else { "ldap" },
            std::process::id()
        ));
        let out = Command::new("bash")
            .arg(root().join("scripts").join(kind.script()))
            .arg("start")
            .arg(&dir)
            .env(kind.watch_env(), std::process::id().to_string())
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("run scripts/{}: {e}", kind.script()));
        assert!(
            out.status.success(),
            "scripts/{} start failed",
            kind.script()
        );
        let mut env = BTreeMap::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some((k, v)) = line.strip_prefix("export ").and_then(|l| l.split_once('=')) {
                env.insert(k.to_string(), v.trim_matches('\'').to_string());
            }
        }
        Directory { kind, dir, env }
    }

    fn get(&self, k: &str) -> String {
        self.env
            .get(k)
            .cloned()
            .unwrap_or_else(|| panic!("{} did not export {k}", self.kind.script()))
    }

    /// The directory server's pid (for its CPU use).
    fn pid(&self) -> u32 {
        let file = match self.kind {
            Kind::Slapd => self.dir.join("main/slapd.pid"),
            Kind::Ad => self.dir.join("samba.pid"),
        };
        std::fs::read_to_string(file)
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Directory {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(root().join("scripts").join(self.kind.script()))
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}

/// A rustls client configuration trusting only the PEM certificates of `ca_file`.
fn tls_trusting(ca_file: &str) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca_file).expect("read the DC's CA") {
        roots
            .add(c.expect("a PEM certificate"))
            .expect("add the CA");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// `cairn server --dev` at log level `info` (the harness's `Server::dev` logs at debug,
/// which would measure the logger).
fn start_cairn(logs: &Path) -> Server {
    let port = free_port_pair();
    let addr = format!("127.0.0.1:{port}");
    let log = std::fs::File::create(logs.join("cairn.log")).expect("log file");
    // BENCH_LOG_LEVEL=debug shows each login's LDAP timings (and slows Cairn down).
    let level = std::env::var("BENCH_LOG_LEVEL").unwrap_or_else(|_| "info".into());
    // `scripts/bench.sh` built the release `cairn` next to this binary: use it as is.
    let bin = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("cairn")))
        .filter(|b| b.exists())
        .unwrap_or_else(cairn_bin);
    let mut child = Command::new(bin)
        .args([
            "server",
            "--dev",
            "--dev-listen-address",
            &addr,
            "--dev-root-token-id",
            "root-bench",
            "--log-level",
            &level,
        ])
        // A dev server stores its root token in ~/.cairn-token: not in the developer's home.
        .env("HOME", logs)
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn cairn");
    let stdout = child.stdout.take().expect("stdout");
    let mut reader = BufReader::new(stdout).lines();
    for line in reader.by_ref() {
        if line.expect("read stdout").starts_with("Root Token: ") {
            break;
        }
    }
    std::thread::spawn(move || for _ in reader {});
    let s = Server::adopt(child, port, "root-bench");
    s.wait_ready();
    s
}

fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// What one phase measured: latencies (ms) of the successful operations started in the
/// measured window (also those that ended after it), operations completed in it, errors,
/// operations slower than a second, and the window's length.
#[derive(Default)]
struct Run {
    lat: Vec<f64>,
    completed: u64,
    errors: u64,
    stalls: u64,
    secs: f64,
    /// CPU seconds used while the phase ran (warm-up included), by process.
    cpu: [f64; 3],
    /// Wall seconds of the phase, warm-up included.
    wall: f64,
}

/// CPU seconds (user + system) a process has used so far, from `/proc/<pid>/stat`.
fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) start at field 3.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15, i.e. 11 and 12 here; 100 ticks per second.
    (ticks(11) + ticks(12)) / 100.0
}

/// The processes whose CPU a phase is charged: the client (this process), Cairn, slapd.
struct Pids([u32; 3]);

impl Pids {
    fn now(&self) -> [f64; 3] {
        self.0.map(cpu_secs)
    }
}

/// Runs a phase and records the CPU each process used during it.
fn measured(pids: &Pids, clients: usize, secs: f64, make: MakeOp) -> Run {
    let (c0, t0) = (pids.now(), Instant::now());
    let mut r = drive(clients, secs, make);
    let c1 = pids.now();
    r.wall = t0.elapsed().as_secs_f64();
    r.cpu = [c1[0] - c0[0], c1[1] - c0[1], c1[2] - c0[2]];
    r
}

impl Run {
    fn add(&mut self, o: Run) {
        self.lat.extend(o.lat);
        self.completed += o.completed;
        self.errors += o.errors;
        self.stalls += o.stalls;
        self.secs += o.secs;
        self.wall += o.wall;
        for (a, b) in self.cpu.iter_mut().zip(o.cpu) {
            *a += b;
        }
    }
    /// CPU milliseconds per operation for each process (client, Cairn, slapd), taking the
    /// phase's rate as holding through its warm-up.
    fn cpu_per_op(&self) -> [f64; 3] {
        let ops = self.rate() * self.wall;
        self.cpu.map(|c| c * 1000.0 / ops.max(1.0))
    }
    fn rate(&self) -> f64 {
        self.completed as f64 / self.secs.max(1e-9)
    }
    fn sorted(mut self) -> Run {
        self.lat
            .sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        self
    }
}

type Op = Box<dyn FnMut(u64) -> Result<(), String>>;
/// Makes a client's operation; called on the client's thread, one client at a time.
type MakeOp = Arc<dyn Fn(usize) -> Op + Send + Sync>;

/// Runs `clients` threads, each with its own operation from `make(thread)`, for a warm-up
/// and then `secs`; returns what was measured after the warm-up. Clients are set up one
/// after the other (each makes its first call before the next starts): tiny_http's
/// connection task pool can leave a connection unserved while others live when many
/// open at the same instant, which would measure that start-up race instead of logins.
fn drive(clients: usize, secs: f64, make: MakeOp) -> Run {
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let setup = Arc::new(std::sync::Mutex::new(()));
    let handles: Vec<_> = (0..clients)
        .map(|t| {
            let (measuring, stop, make) = (measuring.clone(), stop.clone(), make.clone());
            let setup = setup.clone();
            std::thread::spawn(move || {
                let mut op = {
                    let _one_at_a_time = setup.lock().unwrap_or_else(|p| p.into_inner());
                    let mut op = make(t);
                    let _ = op(t as u64);
                    op
                };
                let mut run = Run::default();
                let mut i = 1u64;
                let mut shown = 0;
                while !stop.load(Ordering::Relaxed) {
                    let counted = measuring.load(Ordering::Relaxed);
                    let t0 = Instant::now();
                    let r = op(i * clients as u64 + t as u64);
                    let ms = t0.elapsed().as_secs_f64() * 1000.0;
                    i += 1;
                    if !counted {
                        continue;
                    }
                    if !stop.load(Ordering::Relaxed) {
                        run.completed += 1;
                    }
                    if ms > 1000.0 {
                        run.stalls += 1;
                        if std::env::var("BENCH_DEBUG").is_ok() {
                            eprintln!("client {t}: operation {i} took {ms:.0} ms");
                        }
                    }
                    match r {
                        Ok(()) => run.lat.push(ms),
                        Err(e) => {
                            run.errors += 1;
                            if shown < 3 {
                                shown += 1;
                                eprintln!("client {t}: {e}");
                            }
                        }
                    }
                }
                run
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64((secs / 5.0).clamp(0.5, 2.0)));
    measuring.store(true, Ordering::Relaxed);
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let secs = start.elapsed().as_secs_f64();
    let mut all = Run::default();
    for h in handles {
        all.add(h.join().expect("client thread"));
    }
    all.secs = secs;
    all
}

/// What the logins go to, and how the direct baseline makes them.
struct Target {
    url: String,
    binddn: String,
    bindpass: String,
    /// (login name, password).
    users: Vec<(String, String)>,
    userdn: String,
    userattr: &'static str,
    groupdn: String,
    groupfilter: &'static str,
    /// TLS settings of the direct baseline (LDAPS to the AD).
    tls: Option<Arc<rustls::ClientConfig>>,
}

/// One login made directly: connect, service bind, user search, user bind, group search.
fn direct_login(t: &Target, user: &str, password: &str) -> Result<(), String> {
    let mut settings = LdapConnSettings::new().set_conn_timeout(Duration::from_secs(30));
    if let Some(c) = &t.tls {
        settings = settings.set_config(c.clone());
    }
    let mut c = LdapConn::with_settings(settings, &t.url).map_err(|e| format!("connect: {e}"))?;
    let r = (|| {
        c.simple_bind(&t.binddn, &t.bindpass)
            .and_then(|r| r.success())
            .map_err(|e| format!("service bind: {e}"))?;
        let (users, _) = c
            .search(
                &t.userdn,
                Scope::Subtree,
                &format!("({}={user})", t.userattr),
                vec![t.userattr],
            )
            .and_then(|r| r.success())
            .map_err(|e| format!("user search: {e}"))?;
        if users.len() != 1 {
            return Err(format!("user search matched {} entries", users.len()));
        }
        let dn = SearchEntry::construct(users.into_iter().next().expect("one entry")).dn;
        c.simple_bind(&dn, password)
            .and_then(|r| r.success())
            .map_err(|e| format!("user bind: {e}"))?;
        let filter = t
            .groupfilter
            .replace("{{.Username}}", user)
            .replace("{{.UserDN}}", &dn);
        // AD's search references (from the domain root) come back as non-entries: only
        // entries count, as in Cairn.
        let (groups, _) = c
            .search(&t.groupdn, Scope::Subtree, &filter, vec!["cn"])
            .and_then(|r| r.success())
            .map_err(|e| format!("group search: {e}"))?;
        let groups = groups
            .iter()
            .filter(|e| !e.is_ref() && !e.is_intermediate())
            .count();
        if groups == 0 {
            return Err(format!("no groups for {user}"));
        }
        Ok(())
    })();
    let _ = c.unbind();
    r
}

fn row(name: &str, r: &Run) {
    let mean = r.lat.iter().sum::<f64>() / r.lat.len().max(1) as f64;
    if std::env::var("BENCH_DEBUG").is_ok() {
        eprintln!(
            "{name}: {} completed in {:.2} s, time inside operations {:.2} s",
            r.completed,
            r.secs,
            r.lat.iter().sum::<f64>() / 1000.0
        );
    }
    println!(
        "| {name} | {:.0} | {:.2} | {:.2} | {mean:.2} | {:.2} | {} | {} |",
        r.rate(),
        percentile(&r.lat, 0.5),
        percentile(&r.lat, 0.99),
        r.lat.last().copied().unwrap_or(0.0),
        r.stalls,
        r.errors
    );
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let kind = if args.first().is_some_and(|a| a == "--ad") {
        args.remove(0);
        Kind::Ad
    } else {
        Kind::Slapd
    };
    let secs: f64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(10.0);
    let clients: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(16);
    // Direct and Cairn phases alternate this many times (SECONDS split among them), so a
    // drift in the machine's speed during the run hits both sides alike.
    let rounds: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2).max(1);

    let d = Directory::start(kind);
    let logs = tmpdir("bench-login");
    let s = start_cairn(&logs);
    let target = Arc::new(match kind {
        Kind::Slapd => Target {
            url: d.get("CAIRN_LDAP_URL"),
            binddn: d.get("CAIRN_LDAP_BINDDN"),
            bindpass: d.get("CAIRN_LDAP_BINDPASS"),
            users: USERS
                .iter()
                .map(|u| (u.to_string(), format!("{u}-pw")))
                .collect(),
            userdn: format!("ou=people,{BASE}"),
            userattr: "uid",
            groupdn: format!("ou=groups,{BASE}"),
            groupfilter: GROUPFILTER,
            tls: None,
        },
        Kind::Ad => Target {
            url: d.get("AD_URL"),
            binddn: d.get("AD_BINDDN"),
            bindpass: d.get("AD_BINDPASS"),
            users: AD_USERS
                .iter()
                .map(|(u, p)| (u.to_string(), p.to_string()))
                .collect(),
            userdn: format!("CN=Users,{AD_BASE}"),
            userattr: "sAMAccountName",
            groupdn: AD_BASE.to_string(),
            groupfilter: AD_GROUPFILTER,
            tls: Some(tls_trusting(&d.get("AD_CA"))),
        },
    });
    let mut config = json!({
        "url": target.url,
        "binddn": target.binddn,
        "bindpass": target.bindpass,
        "userdn": target.userdn,
        "userattr": target.userattr,
        "groupdn": target.groupdn,
        "groupfilter": target.groupfilter,
    });
    let groups: &[(&str, &str)] = match kind {
        Kind::Slapd => &[
            ("engineers", "eng"),
            ("ops", "ops"),
            ("posix-users", "posix"),
        ],
        Kind::Ad => {
            config["certificate"] =
                json!(std::fs::read_to_string(d.get("AD_CA")).expect("the DC's CA"));
            config["groupattr"] = json!("cn");
            &[("eng", "eng"), ("all-staff", "staff"), ("ops", "ops")]
        }
    };
    let r = s.post("auth/ldap/config", config);
    assert!(r.status < 300, "config: {} {}", r.status, r.errors());
    for (g, p) in groups {
        let r = s.post(&format!("auth/ldap/groups/{g}"), json!({ "policies": p }));
        assert_eq!(r.status, 204, "group {g}: {}", r.errors());
    }
    let users: Arc<Vec<(String, String)>> = Arc::new(target.users.clone());

    let direct_op: MakeOp = {
        let target = target.clone();
        Arc::new(move |_| {
            let target = target.clone();
            Box::new(move |i| {
                let (u, p) = &target.users[i as usize % target.users.len()];
                direct_login(&target, u, p)
            })
        })
    };
    // The load generator shares the 2 cores with what it measures: by default each client
    // keeps one connection with a lean HTTP client (`cairn_tests::keepalive`), so that its
    // own CPU is not charged to Cairn; `BENCH_CLIENT=ureq` uses ureq instead.
    let use_ureq = std::env::var("BENCH_CLIENT").is_ok_and(|v| v == "ureq");
    let cairn_op: MakeOp = {
        let addr = s.addr.clone();
        Arc::new(move |_| {
            let addr = addr.clone();
            let users = users.clone();
            let check = |user: &str, status: u16, body: &[u8]| {
                // A login answers 200 with a token: anything else is an error.
                let ok = status == 200
                    && serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| {
                        v["auth"]["client_token"]
                            .as_str()
                            .is_some_and(|t| !t.is_empty())
                    });
                if ok {
                    Ok(())
                } else {
                    Err(format!(
                        "login {user}: {status} {}",
                        String::from_utf8_lossy(body)
                    ))
                }
            };
            if use_ureq {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(30)))
                    .build()
                    .into();
                Box::new(move |i: u64| {
                    let (user, password) = &users[i as usize % users.len()];
                    let mut r = agent
                        .post(&format!("{addr}/v1/auth/ldap/login/{user}"))
                        .send_json(json!({ "password": password }))
                        .map_err(|e| format!("login {user}: {e}"))?;
                    let status = r.status().as_u16();
                    let body = r.body_mut().read_to_vec().unwrap_or_default();
                    check(user, status, &body)
                }) as Op
            } else {
                let mut conn = KeepAlive::new(&addr, Duration::from_secs(30));
                let bodies: Vec<(String, Vec<u8>)> = users
                    .iter()
                    .map(|(u, p)| {
                        let body = json!({ "password": p }).to_string();
                        (format!("/v1/auth/ldap/login/{u}"), body.into_bytes())
                    })
                    .collect();
                Box::new(move |i| {
                    let k = i as usize % users.len();
                    let r = conn
                        .call(
                            "POST",
                            &bodies[k].0,
                            &[("Content-Type", "application/json")],
                            &bodies[k].1,
                        )
                        .map_err(|e| format!("login {}: {e}", users[k].0))?;
                    check(&users[k].0, r.status, &r.body)
                })
            }
        })
    };

    // The request path alone (HTTP, routing, a token look-up): what any Cairn request
    // costs on this machine, for reading the login figures.
    let floor_op: MakeOp = {
        let addr = s.addr.clone();
        Arc::new(move |_| {
            let mut conn = KeepAlive::new(&addr, Duration::from_secs(30));
            Box::new(move |_| {
                let r = conn
                    .call(
                        "GET",
                        "/v1/auth/token/lookup-self",
                        &[("X-Vault-Token", "root-bench")],
                        b"",
                    )
                    .map_err(|e| format!("lookup-self: {e}"))?;
                if r.status != 200 {
                    return Err(format!("lookup-self: {}", r.status));
                }
                Ok(())
            })
        })
    };

    let cairn_pid = s.pid();
    let pids = Pids([std::process::id(), cairn_pid, d.pid()]);
    let (mut direct, mut cairn) = (Run::default(), Run::default());
    // BENCH_ONLY=cairn runs only Cairn's login phases (for profiling Cairn).
    let only_cairn = std::env::var("BENCH_ONLY").is_ok_and(|v| v == "cairn");
    for _ in 0..rounds {
        if !only_cairn {
            direct.add(measured(
                &pids,
                clients,
                secs / rounds as f64,
                direct_op.clone(),
            ));
        }
        cairn.add(measured(
            &pids,
            clients,
            secs / rounds as f64,
            cairn_op.clone(),
        ));
    }
    let (direct, cairn) = (direct.sorted(), cairn.sorted());
    let floor = measured(&pids, clients, secs / rounds as f64, floor_op).sorted();

    println!("| measurement ({clients} clients, {secs} s each) | logins/s | p50 (ms) | p99 (ms) | mean (ms) | max (ms) | over 1 s | errors |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    row(
        "direct ldap3 (connect, service bind, user search, user bind, group search)",
        &direct,
    );
    row("Cairn `POST auth/ldap/login/<user>` over HTTP", &cairn);
    row(
        "(for reference) Cairn `GET auth/token/lookup-self` over HTTP, no LDAP",
        &floor,
    );
    println!();
    let server = if kind == Kind::Ad {
        "samba (AD)"
    } else {
        "slapd"
    };
    println!("| CPU ms per operation | client | Cairn | {server} | total |");
    println!("|---|---:|---:|---:|---:|");
    for (name, r) in [
        ("direct ldap3", &direct),
        ("Cairn login", &cairn),
        ("Cairn lookup-self", &floor),
    ] {
        let c = r.cpu_per_op();
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} | {:.3} |",
            c[0],
            c[1],
            c[2],
            c.iter().sum::<f64>()
        );
    }
    println!();
    let tput = cairn.rate() / direct.rate().max(1e-9);
    let p99 = percentile(&cairn.lat, 0.99) / percentile(&direct.lat, 0.99).max(1e-9);
    println!(
        "throughput ratio (Cairn / direct) = {tput:.2}x (target >= 0.8x: {}); p99 ratio = {p99:.2}x (target <= 1.5x: {})",
        if tput >= 0.8 { "met" } else { "MISSED" },
        if p99 <= 1.5 { "met" } else { "MISSED" }
    );
    drop(s);
    if std::env::var("BENCH_KEEP_LOGS").is_ok() {
        eprintln!("cairn log kept in {}", logs.display());
    } else {
        let _ = std::fs::remove_dir_all(&logs);
    }
}
