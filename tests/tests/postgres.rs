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

    // TLS to the database is refused at start, before any connection.
    let url = format!(
        "{}&sslmode=require",
        env["CAIRN_PG_URL"].replace("?sslmode=disable", "?x=1")
    );
    let url = url.replace("?x=1&", "?");
    let cfg = write_config(&dir, fresh_port_pair(), &url);
    let (code, err) = failed_start(&cfg);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("TLS to the database is not built yet"),
        "{err}"
    );
    assert!(err.contains("cairn.hcl:2"), "names the line: {err}");
    assert!(!err.contains(&env["CAIRN_PG_PASSWORD"]), "{err}");
}
