//! `soak [SECONDS]`: sustained mixed traffic against a primary with a performance secondary
//! and a DR secondary (real `cairn` processes on loopback, replicating over their TLS cluster
//! channel), through `scripts/soak.sh`.
//!
//! Traffic (closed loop, one thread per line): KV writes (two threads, overwriting a bounded
//! key set) and KV reads on the primary, LDAP logins on the primary and on the performance
//! secondary (the LDAP configuration replicates), KV reads and token creation on the
//! performance secondary. Tokens live 60 s, so storage stays bounded.
//!
//! Reports per operation: count, rate, errors (anything but a 2xx; target 0), p50/p99
//! latency; per server: RSS (`VmRSS`) and open file descriptors (`/proc/<pid>/fd`) after
//! setup, after a warm-up and at the end; and whether both secondaries converged on the
//! primary's Merkle roots after the traffic stopped.
//!
//! Environment: `CAIRN_BIN` (the server binary), `SOAK_DIR` (data and logs; a temp dir by
//! default), `CAIRN_LDAP_URL`/`CAIRN_LDAP_BINDDN`/`CAIRN_LDAP_BINDPASS` (a directory of
//! `scripts/dev-ldap.sh`; started here when unset), `SOAK_WARMUP` (seconds, default 10),
//! `SOAK_OUT` (where the per-minute samples go, `soak-minutes.csv`: RSS and fds per server,
//! count, errors and p99 per operation; default `out/` in the data directory). At the end
//! it says whether RSS and fds levelled off (their least-squares trend grows < 2 % over the
//! last 30 minutes of runs of an hour or more, over the last half of shorter ones; exit 1
//! if not).

use cairn_tests::{
    agent, free_port_pair, request, start_dev_ldap, Resp, Server, TEST_ISSUER_KEY, TEST_LICENSE,
};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "soak/minutes.rs"]
mod minutes;

use minutes::Minutes;

const BASE: &str = "dc=cairn,dc=test";
const USERS: &[(&str, &str)] = &[("alice", "alice-pw"), ("bob", "bob-pw")];
const READ_KEYS: usize = 200;
const WRITE_KEYS: u64 = 500;

/// Records secrets for `scripts/check-secrets.sh <dir>` (the server logs are checked).
struct Secrets(Mutex<std::fs::File>);

impl Secrets {
    fn note(&self, s: &str) {
        if s.len() >= 6 {
            let mut f = self.0.lock().unwrap_or_else(|e| e.into_inner());
            let _ = f.write_all(format!("{s}\n").as_bytes());
        }
    }
}

fn ports() -> u16 {
    static USED: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut used = USED.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let p = free_port_pair();
        if !used.iter().any(|u| u.abs_diff(p) <= 1) {
            used.push(p);
            return p;
        }
    }
}

/// Starts `cairn server --config` (info logging into `logs/<name>.log`) and waits for it.
fn start_server(name: &str, root: &Path, bin: &Path) -> Server {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let lic = dir.join("license.json");
    std::fs::write(&lic, TEST_LICENSE).expect("license");
    for _ in 0..4 {
        let port = ports();
        let cfg = format!(
            "storage \"sqlite\" {{ path = \"{}\" }}\nlistener \"tcp\" {{\n address = \"127.0.0.1:{port}\"\n cluster_address = \"127.0.0.1:{}\"\n tls_disable = true\n}}\napi_addr = \"http://127.0.0.1:{port}\"\nlicense_path = \"{}\"\nlicense_trusted_key = \"{TEST_ISSUER_KEY}\"\n",
            dir.join("cairn.db").display(),
            port + 1,
            lic.display()
        );
        let cfg_path = dir.join("cairn.hcl");
        std::fs::write(&cfg_path, cfg).expect("config");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(root.join("logs").join(format!("{name}.log")))
            .expect("log file");
        let mut child = Command::new(bin)
            .args(["server", "--config"])
            .arg(&cfg_path)
            .args(["--log-level", "info"])
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn cairn");
        let a = agent(Duration::from_secs(5));
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = format!("http://127.0.0.1:{port}");
        let mut up = false;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            if request(&a, &addr, None, "GET", "sys/health", None).is_some() {
                up = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if up {
            let mut s = Server::adopt(child, port, "");
            s.dir = dir;
            return s;
        }
        let _ = child.kill();
        let _ = child.wait();
        eprintln!("soak: {name} did not start on port {port}; retrying");
    }
    panic!("soak: {name} did not start");
}

fn ok(r: Resp, what: &str) -> Value {
    assert!(r.status < 300, "{what}: {} {}", r.status, r.body);
    r.body
}

fn status(s: &Server, mode: &str) -> Value {
    s.call_as(None, "GET", &format!("sys/replication/{mode}/status"), None)
        .body["data"]
        .clone()
}

fn caught_up(p: &Server, s: &Server, mode: &str) -> bool {
    let ps = status(p, mode);
    let ss = status(s, mode);
    ss["state"] == "stream-wals"
        && ss["last_remote_wal"] == ps["last_wal"]
        && ss["merkle_root"] == ps["merkle_root"]
}

fn wait_caught_up(p: &Server, s: &Server, mode: &str, secs: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if caught_up(p, s, mode) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

/// VmRSS in KiB and the number of open file descriptors of `pid`.
fn usage(pid: u32) -> (u64, usize) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    (rss, fds)
}

#[derive(Default)]
struct Stats {
    lat_ms: Vec<f64>,
    errors: BTreeMap<String, u64>,
    /// The latencies and errors since the last per-minute sample.
    window_ms: Vec<f64>,
    window_errors: u64,
}

type Op = Box<dyn FnMut(u64) -> Result<(), String> + Send>;

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn expect_2xx(r: Option<Resp>) -> Result<Resp, String> {
    match r {
        None => Err("no answer".into()),
        Some(r) if r.status < 300 => Ok(r),
        Some(r) => Err(format!(
            "{} {}",
            r.status,
            r.body["errors"]
                .as_array()
                .and_then(|a| a.first())
                .cloned()
                .unwrap_or_default()
        )),
    }
}

fn main() {
    let secs: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let warmup: u64 = std::env::var("SOAK_WARMUP")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let root = std::env::var("SOAK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            std::env::temp_dir().join(format!("cairn-soak-{}", std::process::id()))
        });
    std::fs::create_dir_all(root.join("logs")).expect("mkdir logs");
    let secrets = Arc::new(Secrets(Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(root.join("logs/secrets.txt"))
            .expect("secrets file"),
    )));
    let out_dir = std::env::var("SOAK_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("out"));
    std::fs::create_dir_all(&out_dir).expect("mkdir SOAK_OUT");
    println!("soak: per-minute samples go to {}", out_dir.display());
    let bin = cairn_tests::cairn_bin();
    println!(
        "soak: {secs}s of traffic after a {warmup}s warm-up; servers {}; data and logs in {}",
        bin.display(),
        root.display()
    );

    // The directory: from scripts/dev-ldap.sh (started by scripts/soak.sh, or here).
    let mut ldap: BTreeMap<String, String> =
        ["CAIRN_LDAP_URL", "CAIRN_LDAP_BINDDN", "CAIRN_LDAP_BINDPASS"]
            .iter()
            .filter_map(|k| Some((k.to_string(), std::env::var(k).ok()?)))
            .collect();
    if ldap.len() < 3 {
        ldap = start_dev_ldap("soak");
    }
    for (_, pw) in USERS {
        secrets.note(pw);
    }
    secrets.note(&ldap["CAIRN_LDAP_BINDPASS"]);

    // Primary, performance secondary, DR secondary.
    let t0 = Instant::now();
    let mut p = start_server("primary", &root, &bin);
    let mut perf = start_server("perf", &root, &bin);
    let mut dr = start_server("dr", &root, &bin);
    p.init_unseal(3, 2);
    perf.init_unseal(1, 1);
    dr.init_unseal(1, 1);
    for s in [&p, &perf, &dr] {
        secrets.note(&s.root_token);
        for k in &s.unseal_keys {
            secrets.note(k);
        }
    }
    ok(p.post("sys/mounts/secret", json!({"type": "kv"})), "mount");
    ok(
        p.post("sys/auth/ldap", json!({"type": "ldap"})),
        "enable ldap",
    );
    ok(
        p.post(
            "auth/ldap/config",
            json!({
                "url": ldap["CAIRN_LDAP_URL"],
                "binddn": ldap["CAIRN_LDAP_BINDDN"],
                "bindpass": ldap["CAIRN_LDAP_BINDPASS"],
                "userdn": format!("ou=people,{BASE}"),
                "userattr": "uid",
                "groupdn": format!("ou=groups,{BASE}"),
                "token_ttl": "60s",
            }),
        ),
        "ldap config",
    );
    ok(
        p.post("auth/ldap/groups/engineers", json!({"policies": "eng"})),
        "group",
    );
    let pad = "v".repeat(200);
    for i in 0..READ_KEYS {
        ok(
            p.put(&format!("secret/soak/r{i}"), json!({"v": i, "pad": pad})),
            "prepopulate",
        );
    }
    ok(
        p.post("sys/replication/performance/primary/enable", json!({})),
        "perf enable",
    );
    ok(
        p.post("sys/replication/dr/primary/enable", json!({})),
        "dr enable",
    );
    for (s, mode, id) in [(&perf, "performance", "soak-perf"), (&dr, "dr", "soak-dr")] {
        let b = ok(
            p.post(
                &format!("sys/replication/{mode}/primary/secondary-token"),
                json!({ "id": id }),
            ),
            "secondary-token",
        );
        let t = b["wrap_info"]["token"].as_str().expect("token").to_string();
        secrets.note(&t);
        ok(
            s.post(
                &format!("sys/replication/{mode}/secondary/enable"),
                json!({ "token": t }),
            ),
            "secondary enable",
        );
    }
    perf.unseal_keys = p.unseal_keys.clone();
    dr.unseal_keys = p.unseal_keys.clone();
    assert!(
        wait_caught_up(&p, &perf, "performance", 120),
        "perf secondary did not catch up"
    );
    assert!(
        wait_caught_up(&p, &dr, "dr", 120),
        "DR secondary did not catch up"
    );
    perf.root_token =
        cairn_tests::cluster::generate_noting(&perf, "sys/generate-root", &p.unseal_keys, |x| {
            secrets.note(x)
        });
    println!(
        "soak: cluster up and replicating in {:.1}s",
        t0.elapsed().as_secs_f64()
    );

    let servers: Vec<(&str, u32)> = vec![
        ("primary", p.child.as_ref().expect("child").id()),
        ("perf secondary", perf.child.as_ref().expect("child").id()),
        ("DR secondary", dr.child.as_ref().expect("child").id()),
    ];
    let sample = |servers: &[(&str, u32)]| -> Vec<(u64, usize)> {
        servers.iter().map(|(_, pid)| usage(*pid)).collect()
    };
    let at_setup = sample(&servers);

    // The operations.
    let login = |addr: String, secrets: Arc<Secrets>| -> Op {
        let a = agent(Duration::from_secs(30));
        let mut noted = 0;
        Box::new(move |i| {
            let (u, pw) = USERS[i as usize % USERS.len()];
            let r = expect_2xx(request(
                &a,
                &addr,
                None,
                "POST",
                &format!("auth/ldap/login/{u}"),
                Some(&json!({ "password": pw })),
            ))?;
            let tok = r.body["auth"]["client_token"].as_str().unwrap_or("");
            if tok.is_empty() {
                return Err("login without a token".into());
            }
            if noted < 50 {
                secrets.note(tok);
                noted += 1;
            }
            Ok(())
        })
    };
    let write = |addr: String, token: String, t: u64| -> Op {
        let a = agent(Duration::from_secs(30));
        let pad = "w".repeat(200);
        Box::new(move |i| {
            expect_2xx(request(
                &a,
                &addr,
                Some(&token),
                "PUT",
                &format!("secret/soak/w{t}-{}", i % WRITE_KEYS),
                Some(&json!({ "v": i, "pad": pad })),
            ))
            .map(|_| ())
        })
    };
    let read = |addr: String, token: String| -> Op {
        let a = agent(Duration::from_secs(30));
        Box::new(move |i| {
            let r = expect_2xx(request(
                &a,
                &addr,
                Some(&token),
                "GET",
                &format!("secret/soak/r{}", i as usize % READ_KEYS),
                None,
            ))?;
            if r.body["data"]["v"] != json!(i as usize % READ_KEYS) {
                return Err(format!("wrong value: {}", r.body["data"]["v"]));
            }
            Ok(())
        })
    };
    let token_create = |addr: String, token: String, secrets: Arc<Secrets>| -> Op {
        let a = agent(Duration::from_secs(30));
        let mut noted = 0;
        Box::new(move |_| {
            let r = expect_2xx(request(
                &a,
                &addr,
                Some(&token),
                "POST",
                "auth/token/create",
                Some(&json!({ "ttl": "60s", "policies": ["default"] })),
            ))?;
            let tok = r.body["auth"]["client_token"].as_str().unwrap_or("");
            if tok.is_empty() {
                return Err("no token created".into());
            }
            if noted < 50 {
                secrets.note(tok);
                noted += 1;
            }
            Ok(())
        })
    };
    let ops: Vec<(&str, Op)> = vec![
        (
            "primary: KV write (1)",
            write(p.addr.clone(), p.root_token.clone(), 0),
        ),
        (
            "primary: KV write (2)",
            write(p.addr.clone(), p.root_token.clone(), 1),
        ),
        (
            "primary: KV read",
            read(p.addr.clone(), p.root_token.clone()),
        ),
        (
            "primary: LDAP login",
            login(p.addr.clone(), secrets.clone()),
        ),
        (
            "perf secondary: LDAP login",
            login(perf.addr.clone(), secrets.clone()),
        ),
        (
            "perf secondary: KV read",
            read(perf.addr.clone(), perf.root_token.clone()),
        ),
        (
            "perf secondary: token create",
            token_create(perf.addr.clone(), perf.root_token.clone(), secrets.clone()),
        ),
    ];
    let names: Vec<&str> = ops.iter().map(|(n, _)| *n).collect();
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let stats: Vec<Arc<Mutex<Stats>>> = names.iter().map(|_| Default::default()).collect();
    let handles: Vec<_> = ops
        .into_iter()
        .zip(stats.iter().cloned())
        .map(|((_, mut op), st)| {
            let (measuring, stop) = (measuring.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i: u64 = 0;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let r = op(i);
                    let ms = t.elapsed().as_secs_f64() * 1000.0;
                    i += 1;
                    if measuring.load(Ordering::Relaxed) {
                        let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
                        s.lat_ms.push(ms);
                        s.window_ms.push(ms);
                        if let Err(e) = r {
                            *s.errors.entry(e).or_default() += 1;
                            s.window_errors += 1;
                        }
                    } else if let Err(e) = r {
                        eprintln!("soak: warm-up error: {e}");
                    }
                }
            })
        })
        .collect();

    std::thread::sleep(Duration::from_secs(warmup));
    let at_start = sample(&servers);
    let mut minutes = Minutes::create(&out_dir, &servers, &names);
    measuring.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let mut next_report = 30;
    let mut next_minute = 60;
    while started.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_millis(200));
        let el = started.elapsed().as_secs();
        if el >= next_minute {
            next_minute += 60;
            minutes.sample(el, &sample(&servers), &stats);
        }
        if el >= next_report && el < secs {
            next_report += 30;
            let total: usize = stats.iter().map(|s| s.lock().unwrap().lat_ms.len()).sum();
            let errs: u64 = stats
                .iter()
                .map(|s| s.lock().unwrap().errors.values().sum::<u64>())
                .sum();
            let u = sample(&servers);
            println!(
                "soak: {el}s: {total} ops ({:.0}/s), {errs} errors; RSS MiB / fds: {}",
                total as f64 / el as f64,
                u.iter()
                    .map(|(r, f)| format!("{:.1}/{f}", *r as f64 / 1024.0))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    measuring.store(false, Ordering::SeqCst);
    let elapsed = started.elapsed().as_secs_f64();
    let at_end = sample(&servers);
    // The last, partial minute (if at least 10 s long) is a sample too.
    let el = started.elapsed().as_secs();
    if el + 50 >= next_minute {
        minutes.sample(el, &at_end, &stats);
    }
    stop.store(true, Ordering::SeqCst);
    for h in handles {
        let _ = h.join();
    }
    let perf_ok = wait_caught_up(&p, &perf, "performance", 120);
    let dr_ok = wait_caught_up(&p, &dr, "dr", 120);

    // Report.
    println!();
    println!(
        "machine: {} cores; {:.0}s measured after a {warmup}s warm-up",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        elapsed
    );
    println!();
    println!("| operation | count | rate (/s) | p50 (ms) | p99 (ms) | errors |");
    println!("|---|---:|---:|---:|---:|---:|");
    let mut total = 0usize;
    let mut total_err = 0u64;
    let mut all_errors: BTreeMap<String, u64> = BTreeMap::new();
    for (name, st) in names.iter().zip(&stats) {
        let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
        s.lat_ms.sort_by(|a, b| a.total_cmp(b));
        let n = s.lat_ms.len();
        let e: u64 = s.errors.values().sum();
        total += n;
        total_err += e;
        for (k, v) in &s.errors {
            *all_errors.entry(format!("{name}: {k}")).or_default() += v;
        }
        println!(
            "| {name} | {n} | {:.0} | {:.2} | {:.2} | {e} |",
            n as f64 / elapsed,
            pct(&s.lat_ms, 0.5),
            pct(&s.lat_ms, 0.99)
        );
    }
    println!(
        "| **all** | {total} | {:.0} | | | {total_err} |",
        total as f64 / elapsed
    );
    println!();
    println!("| server | RSS after setup (MiB) | RSS after warm-up | RSS at end | fds after setup | fds after warm-up | fds at end |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (i, (name, _)) in servers.iter().enumerate() {
        let mib = |k: u64| k as f64 / 1024.0;
        println!(
            "| {name} | {:.1} | {:.1} | {:.1} | {} | {} | {} |",
            mib(at_setup[i].0),
            mib(at_start[i].0),
            mib(at_end[i].0),
            at_setup[i].1,
            at_start[i].1,
            at_end[i].1
        );
    }
    println!();
    println!(
        "after the traffic: perf secondary {}, DR secondary {} (equal Merkle roots, same last WAL)",
        if perf_ok {
            "converged"
        } else {
            "NOT converged"
        },
        if dr_ok { "converged" } else { "NOT converged" }
    );
    for (k, v) in &all_errors {
        println!("error: {v} × {k}");
    }
    let level = minutes.level_off(secs);
    println!();
    print!("{}", level.text);
    println!(
        "per-minute samples: {} (plots: scripts/soak.sh draws them next to it)",
        minutes.path.display()
    );
    drop((p, perf, dr));
    if total_err > 0 || !perf_ok || !dr_ok || !level.flat {
        std::process::exit(1);
    }
}
