//! End-to-end: `cairn server` on PostgreSQL storage (`storage "postgresql"`), against a real
//! PostgreSQL started by `scripts/dev-postgres.sh` (stopped when this process exits).

use cairn_tests::{
    cairn_bin, fresh_port_pair, note_secret, psql, start_dev_directory, tmpdir, Server,
};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The dev server's `export` lines (one server per test process).
fn postgres() -> &'static BTreeMap<String, String> {
    static ENV: std::sync::OnceLock<BTreeMap<String, String>> = std::sync::OnceLock::new();
    ENV.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("cairn-e2e-pg-{}", std::process::id()));
        let env = start_dev_directory("dev-postgres.sh", &dir, "CAIRN_PG_WATCH_PID");
        note_secret(&env["CAIRN_PG_PASSWORD"]);
        env
    })
}

/// A configuration on PostgreSQL at `url` with its API on `port` (cluster `port + 1`).
fn write_config(dir: &Path, port: u16, url: &str) -> std::path::PathBuf {
    let cfg = format!(
        "storage \"postgresql\" {{\n  connection_url = \"{url}\"\n  ha_enabled = false\n  \
         table = \"cairn_e2e_kv\"\n}}\nlistener \"tcp\" {{\n  address = \"127.0.0.1:{port}\"\n  \
         cluster_address = \"127.0.0.1:{}\"\n  tls_disable = true\n}}\n\
         api_addr = \"http://127.0.0.1:{port}\"\n",
        port + 1
    );
    let path = dir.join("cairn.hcl");
    std::fs::write(&path, cfg).expect("write config");
    path
}

#[test]
fn kv_written_on_postgres_survives_kill_9() {
    let env = postgres();
    let dir = tmpdir("pg-kv");
    let port = fresh_port_pair();
    let cfg = write_config(&dir, port, &env["CAIRN_PG_URL"]);
    let api = format!("http://127.0.0.1:{port}");
    let mut s = Server::spawn_config(&cfg, &api).unwrap_or_else(|e| panic!("start: {e}"));
    s.wait_ready();
    s.init_unseal(1, 1);
    assert_eq!(s.post("sys/mounts/kv", json!({"type": "kv"})).status, 204);
    for i in 0..20 {
        let r = s.put(&format!("kv/k{i}"), json!({ "v": format!("value-{i}") }));
        assert_eq!(r.status, 204, "{:?}", r.body);
    }
    assert_eq!(s.get("kv/k7").body["data"]["v"], json!("value-7"));
    let (root, keys) = (s.root_token.clone(), s.unseal_keys.clone());
    s.kill9();

    // The same configuration again: sealed, then everything acknowledged is there.
    let mut s = Server::spawn_config(&cfg, &api).unwrap_or_else(|e| panic!("restart: {e}"));
    s.wait_ready();
    s.root_token = root;
    s.unseal_keys = keys;
    assert_eq!(s.get("sys/seal-status").body["initialized"], json!(true));
    s.unseal();
    for i in 0..20 {
        let r = s.get(&format!("kv/k{i}"));
        assert_eq!(r.status, 200, "kv/k{i}: {:?}", r.body);
        assert_eq!(r.body["data"]["v"], json!(format!("value-{i}")));
    }
    let r = s.list("kv/");
    assert_eq!(r.body["data"]["keys"].as_array().map(Vec::len), Some(20));
    // Values are encrypted at rest.
    let hits = psql(
        env,
        "select count(*) from cairn_e2e_kv where position('value-7'::bytea in value) > 0",
    );
    assert_eq!(hits, "0");

    // A commit the database refuses: the request is answered with the error, nothing of it
    // is stored, and the server goes on (the node reloads what it derived from the batch).
    psql(
        env,
        "create table refuse_writes (on_ bool); \
         create function refuse() returns trigger as $$ begin \
           if exists (select 1 from refuse_writes) then raise exception 'writes refused by test'; \
           end if; return new; end $$ language plpgsql; \
         create trigger refuse before insert or update or delete on cairn_e2e_kv \
           for each row execute function refuse(); \
         insert into refuse_writes values (true); select 1",
    );
    let r = s.put("kv/refused", json!({"v": "no"}));
    assert_eq!(r.status, 500, "{:?}", r.body);
    assert!(
        r.errors().contains("writes refused by test"),
        "{}",
        r.errors()
    );
    psql(env, "delete from refuse_writes; select 1");
    assert_eq!(s.get("kv/refused").status, 404);
    assert_eq!(s.put("kv/after", json!({"v": "yes"})).status, 204);
    assert_eq!(s.get("kv/after").body["data"]["v"], json!("yes"));
    assert_eq!(s.get("kv/k3").body["data"]["v"], json!("value-3"));
}

/// Runs `cairn server -config` expecting it to fail at start: its exit code and stderr.
fn failed_start(cfg: &Path) -> (i32, String) {
    let mut child = Command::new(cairn_bin())
        .args(["server", "-config"])
        .arg(cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cairn");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return (status.code().unwrap_or(-1), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server did not exit within 60 s (it should refuse to start)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_wrong_password_or_an_unreachable_database_stops_the_start() {
    let env = postgres();
    let dir = tmpdir("pg-refused");
    let pg_port = &env["CAIRN_PG_PORT"];
    let wrong = "not-the-pg-password-4711";
    note_secret(wrong);
    let url = format!("postgres://cairn:{wrong}@127.0.0.1:{pg_port}/cairn?sslmode=disable");
    let cfg = write_config(&dir, fresh_port_pair(), &url);
    let (code, err) = failed_start(&cfg);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("password authentication failed"), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{pg_port}")), "{err}");
    assert!(!err.contains(wrong), "the password was printed: {err}");

    let dead = &env["CAIRN_PG_DEAD_URL"];
    let dead_port = dead
        .rsplit(':')
        .next()
        .and_then(|p| p.split('/').next())
        .expect("a port");
    let cfg = write_config(&dir, fresh_port_pair(), dead);
    let (code, err) = failed_start(&cfg);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains(&format!("127.0.0.1:{dead_port}")), "{err}");
    assert!(err.contains("cannot connect to PostgreSQL"), "{err}");
    assert!(!err.contains(&env["CAIRN_PG_PASSWORD"]), "{err}");

    // A database whose certificate the configured CA did not sign: refused at start, the
    // message names the certificate problem; a verifying mode without its CA: refused before
    // any connection, naming the configuration line.
    let tls_url = |q: &str| env["CAIRN_PG_URL"].replace("?sslmode=disable", q);
    let cfg = write_config(
        &dir,
        fresh_port_pair(),
        &tls_url(&format!(
            "?sslmode=verify-full&sslrootcert={}",
            env["CAIRN_PG_OTHER_CA"]
        )),
    );
    let (code, err) = failed_start(&cfg);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("cannot connect to PostgreSQL"), "{err}");
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    assert!(!err.contains(&env["CAIRN_PG_PASSWORD"]), "{err}");
    let cfg = write_config(&dir, fresh_port_pair(), &tls_url("?sslmode=verify-ca"));
    let (code, err) = failed_start(&cfg);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("needs sslrootcert"), "{err}");
    assert!(err.contains("cairn.hcl:2"), "names the line: {err}");
    assert!(!err.contains(&env["CAIRN_PG_PASSWORD"]), "{err}");
}

/// A database failover under a running node: PostgreSQL with a synchronous streaming standby,
/// the node's `connection_url` naming both servers (`target_session_attrs=read-write`, TLS
/// checked against the dev CA), writes going on while the database primary is killed (-9,
/// with its backends) and the standby promoted. Every write the node acknowledged is there
/// afterwards, and the node writes to the promoted server over TLS.
#[test]
fn a_database_failover_to_a_synchronous_standby_loses_no_acknowledged_write() {
    use std::ffi::OsStr;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let t0 = Instant::now();
    let base = std::env::temp_dir().join(format!("cairn-e2e-pgfo-{}", std::process::id()));
    let (pdir, sdir) = (base.join("primary"), base.join("standby"));
    let primary = start_dev_directory("dev-postgres.sh", &pdir, "CAIRN_PG_WATCH_PID");
    let standby = cairn_tests::run_dev_script(
        "dev-postgres.sh",
        &[OsStr::new("standby"), sdir.as_os_str(), pdir.as_os_str()],
        "CAIRN_PG_WATCH_PID",
    );
    note_secret(&primary["CAIRN_PG_PASSWORD"]);
    eprintln!(
        "pg failover: database primary and synchronous standby up in {:?}",
        t0.elapsed()
    );
    let url = format!(
        "postgres://{user}:{pw}@127.0.0.1:{p},127.0.0.1:{s}/{db}?target_session_attrs=read-write\
         &sslmode=verify-full&sslrootcert={ca}&connect_timeout=3",
        user = primary["CAIRN_PG_USER"],
        pw = primary["CAIRN_PG_PASSWORD"],
        p = primary["CAIRN_PG_PORT"],
        s = standby["CAIRN_PG_PORT"],
        db = primary["CAIRN_PG_DB"],
        ca = primary["CAIRN_PG_CA"],
    );
    let dir = tmpdir("pg-failover");
    let port = fresh_port_pair();
    let cfg = dir.join("cairn.hcl");
    std::fs::write(
        &cfg,
        format!(
            "storage \"postgresql\" {{\n  connection_url = \"{url}\"\n  ha_enabled = true\n}}\n\
             listener \"tcp\" {{\n  address = \"127.0.0.1:{port}\"\n  \
             cluster_address = \"127.0.0.1:{c}\"\n  tls_disable = true\n}}\n\
             api_addr = \"http://127.0.0.1:{port}\"\ncluster_addr = \"https://127.0.0.1:{c}\"\n",
            c = port + 1
        ),
    )
    .expect("write config");
    let api = format!("http://127.0.0.1:{port}");
    let mut s = Server::spawn_config(&cfg, &api).unwrap_or_else(|e| panic!("start: {e}"));
    s.wait_ready();
    s.init_unseal(1, 1);
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.get("sys/leader").body["is_self"] != json!(true) {
        assert!(Instant::now() < deadline, "the node never became active");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(s.post("sys/mounts/kv", json!({"type": "kv"})).status, 204);

    let acked: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (addr, token) = (s.addr.clone(), s.root_token.clone());
        let (acked, stop) = (acked.clone(), stop.clone());
        std::thread::spawn(move || {
            let agent = cairn_tests::agent(Duration::from_secs(30));
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let r = cairn_tests::request(
                    &agent,
                    &addr,
                    Some(&token),
                    "PUT",
                    &format!("kv/w{i}"),
                    Some(&json!({ "v": i })),
                );
                if r.as_ref().map(|r| r.status) == Some(204) {
                    acked.lock().expect("lock").push((i, Instant::now()));
                } else {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(1500));

    // The database primary's machine dies: the postmaster stopped first (so it restarts
    // nothing), then every backend and the postmaster killed.
    let pg_pid = primary["CAIRN_PG_PID"].clone();
    let killed_at = Instant::now();
    let kill = |args: &[&str]| {
        let _ = Command::new(args[0]).args(&args[1..]).status();
    };
    kill(&["kill", "-STOP", &pg_pid]);
    kill(&["pkill", "-9", "-P", &pg_pid]);
    kill(&["kill", "-9", &pg_pid]);
    std::thread::sleep(Duration::from_millis(1000));
    let promoted_at = Instant::now();
    cairn_tests::run_dev_script(
        "dev-postgres.sh",
        &[OsStr::new("promote"), sdir.as_os_str()],
        "CAIRN_PG_WATCH_PID",
    );
    // Writes resume on the promoted server.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let after = acked
            .lock()
            .expect("lock")
            .iter()
            .filter(|(_, t)| *t > promoted_at)
            .count();
        if after >= 20 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no writes acknowledged within 60 s of the promotion ({after})"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    let acked = acked.lock().expect("lock").clone();
    let before = acked.iter().filter(|(_, t)| *t < killed_at).count();
    let resumed = acked
        .iter()
        .find(|(_, t)| *t > promoted_at)
        .map(|(_, t)| t.duration_since(promoted_at));
    eprintln!(
        "pg failover: {} writes acknowledged, {before} before the kill; first after the \
         promotion {resumed:?} after it",
        acked.len()
    );
    assert!(before > 10, "too few writes before the kill ({before})");
    for (i, _) in &acked {
        let r = s.get(&format!("kv/w{i}"));
        assert_eq!(r.status, 200, "acknowledged kv/w{i} lost: {}", r.body);
        assert_eq!(r.body["data"]["v"], json!(i));
    }
    // The node's sessions on the promoted server are encrypted.
    let sessions = psql(
        &standby,
        "select count(*) || ' ' || bool_and(s.ssl) from pg_stat_ssl s \
         join pg_stat_activity a using (pid) where a.application_name like 'cairn %'",
    );
    let (n, all_tls) = sessions.split_once(' ').expect("count and flag");
    assert!(
        n.parse::<u32>().unwrap_or(0) > 0,
        "no sessions of the node: {sessions}"
    );
    assert_eq!(
        all_tls, "true",
        "a session of the node is not encrypted: {sessions}"
    );
}
