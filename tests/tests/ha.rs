//! End-to-end: HA clusters of `cairn server` processes on one real PostgreSQL (started by
//! `scripts/dev-postgres.sh`, stopped when this process exits): one active node, standbys
//! that forward, failover on kill -9 under write load, a paused active node that comes back
//! and commits nothing, step-down, `sys/leader`, `sys/health` and `sys/ha-status`, writes
//! through a standby whose active node is killed (answered or 5xx, never applied twice), and
//! a database outage longer than the lease (nothing acknowledged meanwhile, one active node
//! again by itself afterwards, nothing acknowledged lost).

use cairn_tests::{fresh_port_pair, note_secret, start_dev_directory, tmpdir, Server};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn postgres() -> &'static BTreeMap<String, String> {
    static ENV: std::sync::OnceLock<BTreeMap<String, String>> = std::sync::OnceLock::new();
    ENV.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("cairn-e2e-ha-pg-{}", std::process::id()));
        let env = start_dev_directory("dev-postgres.sh", &dir, "CAIRN_PG_WATCH_PID");
        note_secret(&env["CAIRN_PG_PASSWORD"]);
        env
    })
}

/// One node's configuration: the cluster's tables on the shared database, its own ports,
/// and `extra` settings.
fn write_config_with(
    dir: &Path,
    port: u16,
    url: &str,
    table: &str,
    extra: &str,
) -> std::path::PathBuf {
    let cfg = format!(
        "storage \"postgresql\" {{\n  connection_url = \"{url}\"\n  ha_enabled = true\n  \
         table = \"{table}_kv\"\n  ha_table = \"{table}_lock\"\n}}\n\
         listener \"tcp\" {{\n  address = \"127.0.0.1:{port}\"\n  \
         cluster_address = \"127.0.0.1:{}\"\n  tls_disable = true\n}}\n\
         api_addr = \"http://127.0.0.1:{port}\"\ncluster_addr = \"https://127.0.0.1:{}\"\n",
        port + 1,
        port + 1
    );
    let cfg = format!("{cfg}{extra}");
    let path = dir.join(format!("node-{port}.hcl"));
    std::fs::write(&path, cfg).expect("write config");
    path
}

struct Cluster {
    nodes: Vec<Server>,
    configs: Vec<std::path::PathBuf>,
    _dir: cairn_tests::TempDir,
}

impl Cluster {
    /// `n` nodes on `table`, initialised through the first and unsealed, one of them active.
    fn start(n: usize, table: &str) -> Cluster {
        Cluster::start_with(n, table, |_| String::new())
    }

    /// As [`Cluster::start`], each node's configuration extended with `extra(dir)`.
    fn start_with(n: usize, table: &str, extra: impl Fn(&Path) -> String) -> Cluster {
        Cluster::start_on(n, table, &postgres()["CAIRN_PG_URL"], extra)
    }

    /// As [`Cluster::start_with`], on the database at `url`.
    fn start_on(n: usize, table: &str, url: &str, extra: impl Fn(&Path) -> String) -> Cluster {
        let mut c = Cluster::spawn_on(n, table, url, extra);
        c.nodes[0].init_unseal(1, 1);
        let (root, keys) = (
            c.nodes[0].root_token.clone(),
            c.nodes[0].unseal_keys.clone(),
        );
        for s in c.nodes.iter_mut().skip(1) {
            s.root_token = root.clone();
            s.unseal_keys = keys.clone();
            s.unseal();
        }
        c.wait_active(Duration::from_secs(15), None);
        c
    }

    /// `n` fresh nodes on `table`, sealed and not initialised.
    fn spawn(n: usize, table: &str, extra: impl Fn(&Path) -> String) -> Cluster {
        Cluster::spawn_on(n, table, &postgres()["CAIRN_PG_URL"], extra)
    }

    /// As [`Cluster::spawn`], on the database at `url`.
    fn spawn_on(n: usize, table: &str, url: &str, extra: impl Fn(&Path) -> String) -> Cluster {
        let dir = tmpdir(table);
        let mut nodes = Vec::new();
        let mut configs = Vec::new();
        for _ in 0..n {
            let port = fresh_port_pair();
            let cfg = write_config_with(&dir, port, url, table, &extra(&dir));
            let api = format!("http://127.0.0.1:{port}");
            let s = Server::spawn_config(&cfg, &api).unwrap_or_else(|e| panic!("start: {e}"));
            s.wait_ready();
            nodes.push(s);
            configs.push(cfg);
        }
        Cluster {
            nodes,
            configs,
            _dir: dir,
        }
    }

    /// The index of the node that says it is active (`sys/leader` `is_self`), waiting up to
    /// `limit`; never `not` (a node known to be down or deposed).
    fn wait_active(&self, limit: Duration, not: Option<usize>) -> usize {
        let deadline = Instant::now() + limit;
        loop {
            let active: Vec<usize> = (0..self.nodes.len())
                .filter(|&i| Some(i) != not)
                .filter(|&i| self.nodes[i].get("sys/leader").body["is_self"] == json!(true))
                .collect();
            if active.len() == 1 {
                return active[0];
            }
            assert!(
                active.len() <= 1,
                "two nodes say they are active: {active:?}"
            );
            assert!(
                Instant::now() < deadline,
                "no active node after {limit:?} (excluding {not:?})"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts node `i` again from its configuration (it comes back sealed) and unseals it.
    fn restart(&mut self, i: usize) {
        let old = &self.nodes[i];
        let (api, root, keys) = (
            old.addr.clone(),
            old.root_token.clone(),
            old.unseal_keys.clone(),
        );
        let mut s =
            Server::spawn_config(&self.configs[i], &api).unwrap_or_else(|e| panic!("restart: {e}"));
        s.wait_ready();
        s.root_token = root;
        s.unseal_keys = keys;
        s.unseal();
        self.nodes[i] = s;
    }

    /// Waits until node `i` answers `sys/health` with `status` (429: it became a standby).
    fn wait_health(&self, i: usize, status: u16, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.nodes[i].get("sys/health").status != status {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn pid(&self, i: usize) -> u32 {
        self.nodes[i]
            .child
            .as_ref()
            .map(|c| c.id())
            .expect("running")
    }
}

/// Writes `kv/<prefix><i>` through `node` (i = 1, 2, ...) until `stop`: each write answered
/// 204 is recorded in `acked` with when its answer came; the thread returns the other
/// statuses it was answered (no answer at all is not counted), pausing 20 ms after each.
fn spawn_writer(
    node: &Server,
    prefix: &str,
    acked: &Arc<Mutex<Vec<(String, Instant)>>>,
    stop: &Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<u16>> {
    let (addr, token, prefix) = (
        node.addr.clone(),
        node.root_token.clone(),
        prefix.to_string(),
    );
    let (acked, stop) = (acked.clone(), stop.clone());
    std::thread::spawn(move || {
        let agent = cairn_tests::agent(Duration::from_secs(30));
        let mut refused = Vec::new();
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            let key = format!("{prefix}{i}");
            let r = cairn_tests::request(
                &agent,
                &addr,
                Some(&token),
                "PUT",
                &format!("kv/{key}"),
                Some(&json!({ "v": i })),
            );
            match r.map(|r| r.status) {
                Some(204) => acked.lock().expect("lock").push((key, Instant::now())),
                other => {
                    refused.extend(other);
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        refused
    })
}

fn signal(pid: u32, sig: &str) {
    let st = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill {sig} {pid}");
}

#[test]
fn one_active_node_standbys_forward_and_a_kill_9_fails_over_without_losing_writes() {
    let mut c = Cluster::start(3, "ha_three");
    let a = c.wait_active(Duration::from_secs(5), None);
    let standbys: Vec<usize> = (0..3).filter(|&i| i != a).collect();
    let (b, d) = (standbys[0], standbys[1]);

    // A standby's own answers: health 429 (200 with standbyok), the leader's addresses.
    let h = c.nodes[b].get("sys/health");
    assert_eq!(h.status, 429, "{}", h.body);
    assert_eq!(h.body["standby"], json!(true));
    assert_eq!(c.nodes[b].get("sys/health?standbyok=true").status, 200);
    let l = c.nodes[b].get("sys/leader").body;
    assert_eq!(l["ha_enabled"], json!(true));
    assert_eq!(l["leader_address"], json!(c.nodes[a].addr));
    assert_eq!(c.nodes[a].get("sys/health").status, 200);

    // Writes through one standby, reads through the other: forwarded to the active.
    assert_eq!(
        c.nodes[b]
            .post("sys/mounts/kv", json!({"type": "kv"}))
            .status,
        204
    );
    for i in 0..10 {
        let r = c.nodes[b].put(&format!("kv/s{i}"), json!({ "v": i }));
        assert_eq!(r.status, 204, "{}", r.body);
    }
    for i in 0..10 {
        let r = c.nodes[d].get(&format!("kv/s{i}"));
        assert_eq!(r.body["data"]["v"], json!(i), "{}", r.body);
    }
    // Forwarded errors come back unchanged.
    let r = c.nodes[d].get("kv/missing");
    assert_eq!(r.status, 404, "{}", r.body);
    let r = c.nodes[d].call_as(Some("not-a-token"), "GET", "kv/s1", None);
    assert_eq!(r.status, 403, "{}", r.body);
    // The cluster's nodes, through a standby (the active reads the registry when it renews
    // its lease: every 1.5 s).
    let deadline = Instant::now() + Duration::from_secs(10);
    let (st, nodes) = loop {
        let st = c.nodes[b].get("sys/ha-status").body;
        let nodes = st["nodes"].as_array().cloned().unwrap_or_default();
        if nodes.len() == 3 || Instant::now() > deadline {
            break (st, nodes);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(nodes.len(), 3, "{st}");
    assert_eq!(
        nodes
            .iter()
            .filter(|n| n["active_node"] == json!(true))
            .count(),
        1,
        "{st}"
    );

    // kill -9 of the active under write load through a standby.
    let acked: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(&c.nodes[b], "load", &acked, &stop);
    std::thread::sleep(Duration::from_millis(1500));
    let killed_at = Instant::now();
    c.nodes[a].kill9();
    let new_active = c.wait_active(Duration::from_secs(15), Some(a));
    std::thread::sleep(Duration::from_millis(2000));
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    let acked = acked.lock().expect("lock").clone();
    let before = acked.iter().filter(|(_, t)| *t < killed_at).count();
    let first_after = acked
        .iter()
        .find(|(_, t)| *t > killed_at)
        .map(|(_, t)| t.duration_since(killed_at))
        .expect("writes acknowledged after the failover");
    eprintln!(
        "ha: {} writes acknowledged ({before} before the kill); first acknowledged write \
         {first_after:?} after the kill; node {new_active} is active",
        acked.len()
    );
    assert!(before > 0, "no write acknowledged before the kill");
    assert!(
        first_after < Duration::from_secs(10),
        "failover took {first_after:?}"
    );
    for (key, _) in &acked {
        let r = c.nodes[new_active].get(&format!("kv/{key}"));
        assert_eq!(r.status, 200, "acknowledged {key} lost: {}", r.body);
    }

    // The killed node comes back as a standby.
    c.restart(a);
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(c.nodes[a].get("sys/health").status, 429);
    assert_eq!(c.nodes[a].get("kv/s3").body["data"]["v"], json!(3));

    // Step-down (sudo): another node takes over.
    let r = c.nodes[new_active].put("sys/step-down", json!({}));
    assert_eq!(r.status, 204, "{}", r.body);
    let next = c.wait_active(Duration::from_secs(10), Some(new_active));
    assert_ne!(next, new_active);
    assert_eq!(c.nodes[next].get("kv/s9").body["data"]["v"], json!(9));
    let r = c.nodes[next].call_as(None, "PUT", "sys/step-down", Some(json!({})));
    assert_eq!(r.status, 403, "step-down without a token: {}", r.body);
}

#[test]
fn a_paused_active_node_commits_nothing_once_another_took_over() {
    let c = Cluster::start(2, "ha_pause");
    let a = c.wait_active(Duration::from_secs(5), None);
    let b = 1 - a;
    assert_eq!(
        c.nodes[a]
            .post("sys/mounts/kv", json!({"type": "kv"}))
            .status,
        204
    );
    assert_eq!(c.nodes[a].put("kv/before", json!({"v": 1})).status, 204);

    // SIGSTOP past the lease: the standby takes over and takes writes.
    signal(c.pid(a), "-STOP");
    let paused_at = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.nodes[b].get("sys/leader").body["is_self"] != json!(true) {
        assert!(Instant::now() < deadline, "the standby never took over");
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("ha: takeover {:?} after the pause", paused_at.elapsed());
    assert_eq!(c.nodes[b].put("kv/during", json!({"v": 2})).status, 204);

    // SIGCONT: the old active's answers are never a false success; it becomes a standby.
    signal(c.pid(a), "-CONT");
    let r = c.nodes[a].put("kv/from-old", json!({"v": 3}));
    let stored = c.nodes[b].get("kv/from-old");
    match r.status {
        204 => assert_eq!(
            stored.body["data"]["v"],
            json!(3),
            "acknowledged but not stored"
        ),
        s => {
            assert!(s >= 500, "{s} {}", r.body);
            assert_eq!(stored.status, 404, "refused but stored: {}", stored.body);
        }
    }
    c.wait_health(a, 429, "the old active never stepped down");
    assert_eq!(c.nodes[b].get("sys/leader").body["is_self"], json!(true));
    // It learns where the lease went and forwards there.
    let deadline = Instant::now() + Duration::from_secs(5);
    let v: Value = loop {
        let r = c.nodes[a].get("kv/during");
        if r.status != 503 || Instant::now() > deadline {
            break r.body;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(v["data"]["v"], json!(2), "{v}");
    assert_eq!(c.nodes[b].get("kv/before").body["data"]["v"], json!(1));
}

fn psql(sql: &str) -> String {
    cairn_tests::psql(postgres(), sql)
}

#[test]
fn database_sessions_terminated_under_the_nodes_do_not_split_or_lose_the_cluster() {
    let c = Cluster::start(2, "ha_term");
    let a = c.wait_active(Duration::from_secs(5), None);
    let b = 1 - a;
    assert_eq!(
        c.nodes[b]
            .post("sys/mounts/kv", json!({"type": "kv"}))
            .status,
        204
    );
    assert_eq!(c.nodes[a].put("kv/k0", json!({"v": 0})).status, 204);

    // The active's lease session is terminated: its lease is free at once, the standby
    // takes it; the old active's commits are refused (epoch) and it steps down.
    let killed = psql("select pg_terminate_backend(holder_pid) from ha_term_lock where id = 1");
    assert_eq!(killed, "t");
    let next = c.wait_active(Duration::from_secs(10), Some(a));
    assert_eq!(next, b);
    c.wait_health(a, 429, "the old active never stepped down");
    let mut acked = vec!["k0".to_string()];
    for (i, n) in [a, b, a, b].into_iter().enumerate() {
        let key = format!("k{}", i + 1);
        let r = c.nodes[n].put(&format!("kv/{key}"), json!({ "v": i + 1 }));
        if r.status == 204 {
            acked.push(key);
        } else {
            assert!(r.status >= 500, "{} {}", r.status, r.body);
        }
    }

    // Every session of this cluster terminated at once (its application name names its
    // table): the nodes reconnect, one of them holds the lease, nothing acknowledged is lost.
    let n = psql(
        "select count(pg_terminate_backend(pid)) from pg_stat_activity \
         where application_name = 'cairn ha_term_kv' and pid <> pg_backend_pid()",
    );
    assert!(
        n.parse::<u32>().unwrap_or(0) >= 4,
        "sessions terminated: {n}"
    );
    let active = c.wait_active(Duration::from_secs(15), None);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = c.nodes[1 - active].put("kv/after", json!({"v": "after"}));
        if r.status == 204 {
            acked.push("after".into());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no write through the standby: {}",
            r.body
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for key in &acked {
        let r = c.nodes[active].get(&format!("kv/{key}"));
        assert_eq!(r.status, 200, "acknowledged {key} lost: {}", r.body);
    }
}

#[test]
fn a_performance_secondary_follows_its_primary_cluster_through_an_active_failover() {
    use cairn_tests::cluster::{enable_secondary, licensed, status, token, wait_for};
    let mut c = Cluster::start_with(2, "ha_repl", |dir| {
        let lic = dir.join("license.json");
        std::fs::write(&lic, cairn_tests::TEST_LICENSE).expect("license");
        format!(
            "license_path = \"{}\"\nlicense_trusted_key = \"{}\"\n{}",
            lic.display(),
            cairn_tests::TEST_ISSUER_KEY,
            cairn_tests::cluster::TUNING
        )
    });
    let a = c.wait_active(Duration::from_secs(5), None);
    let p = &c.nodes[a];
    assert_eq!(p.post("sys/mounts/kv", json!({"type": "kv"})).status, 204);
    let r = p.post("sys/replication/performance/primary/enable", json!({}));
    assert_eq!(r.status, 200, "{}", r.body);
    // The standby's ha-status is known to the active before the token is made.
    std::thread::sleep(Duration::from_millis(1500));
    let tok = token(p, "performance", "perf-ha");
    let mut s = licensed("ha-perf-secondary");
    enable_secondary(&s, "performance", &tok);
    // The secondary's tokens are its own: a root token from the primary cluster's keys.
    let keys = p.unseal_keys.clone();
    wait_for("the secondary's first sync", 30, || {
        status(&s, "performance")["state"] == json!("stream-wals")
    });
    s.root_token = cairn_tests::cluster::generate_root(&s, &keys);
    let st = status(&s, "performance");
    assert_eq!(
        st["known_primary_cluster_addrs"].as_array().map(Vec::len),
        Some(2),
        "{st}"
    );
    assert_eq!(p.put("kv/one", json!({"v": 1})).status, 204);
    wait_for("the secondary to have kv/one", 30, || {
        s.get("kv/one").body["data"]["v"] == json!(1)
    });

    // kill -9 of the primary cluster's active node: the other node takes over and the
    // secondary finds it through the addresses it knows, and streams on.
    c.nodes[a].kill9();
    let b = c.wait_active(Duration::from_secs(15), Some(a));
    let r = c.nodes[b].put("kv/two", json!({"v": 2}));
    assert_eq!(r.status, 204, "{}", r.body);
    wait_for(
        "the secondary to have kv/two from the new active",
        60,
        || s.get("kv/two").body["data"]["v"] == json!(2),
    );
    assert_eq!(s.get("kv/one").body["data"]["v"], json!(1));
    let st = status(&s, "performance");
    assert_eq!(st["state"], json!("stream-wals"), "{st}");
}

#[test]
fn two_racing_initialisations_of_one_cluster_cannot_both_succeed() {
    for round in 0..3 {
        let c = Cluster::spawn(2, &format!("ha_init{round}"), |_| String::new());
        let body = json!({"secret_shares": 1, "secret_threshold": 1});
        let answers: Vec<(u16, Value)> = std::thread::scope(|sc| {
            let hs: Vec<_> = c
                .nodes
                .iter()
                .map(|n| {
                    let body = body.clone();
                    sc.spawn(move || {
                        let r = n.call_as(None, "PUT", "sys/init", Some(body));
                        (r.status, r.body)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("init")).collect()
        });
        let won: Vec<&Value> = answers
            .iter()
            .filter(|(st, _)| *st == 200)
            .map(|(_, b)| b)
            .collect();
        assert_eq!(won.len(), 1, "round {round}: {answers:?}");
        let lost = answers
            .iter()
            .find(|(st, _)| *st != 200)
            .expect("a refusal");
        assert_eq!(lost.0, 400, "{:?}", lost.1);
        assert!(
            lost.1.to_string().contains("already initialized"),
            "{:?}",
            lost.1
        );
        // The winner's key unseals both nodes; its root token works through either.
        let key = won[0]["keys"][0].as_str().expect("key").to_string();
        let root = won[0]["root_token"].as_str().expect("root").to_string();
        note_secret(&key);
        note_secret(&root);
        for n in &c.nodes {
            let r = n.call_as(None, "PUT", "sys/unseal", Some(json!({ "key": key })));
            assert_eq!(r.body["sealed"], json!(false), "{}", r.body);
        }
        let a = c.wait_active(Duration::from_secs(10), None);
        // The standby learns the active node from the lease (read every 0.5 s) and the
        // cluster CA from storage: until then it answers 503 "retry shortly", as a client
        // is told; then its forwards go through.
        let deadline = Instant::now() + Duration::from_secs(10);
        let r = loop {
            let r = c.nodes[1 - a].call_as(Some(&root), "GET", "auth/token/lookup-self", None);
            if r.status != 503 || Instant::now() > deadline {
                break r;
            }
            assert!(r.body.to_string().contains("retry shortly"), "{}", r.body);
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(r.status, 200, "{}", r.body);
    }
}

/// The configuration lines of a licensed node (replication needs the license).
fn licensed_extra(dir: &Path) -> String {
    let lic = dir.join("license.json");
    std::fs::write(&lic, cairn_tests::TEST_LICENSE).expect("license");
    format!(
        "license_path = \"{}\"\nlicense_trusted_key = \"{}\"\n{}",
        lic.display(),
        cairn_tests::TEST_ISSUER_KEY,
        cairn_tests::cluster::TUNING
    )
}

/// Waits until secondary `s` streams from `p` and has applied its whole WAL.
///
/// Waits until the secondary streams and has applied the primary's whole WAL, then checks
/// that both report the same Merkle root (the secondary's trees follow its data, the
/// primary's active node's follow the cluster's storage).
fn wait_streaming(p: &Server, s: &Server, mode: &str, when: &str) {
    use cairn_tests::cluster::status;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let (ps, ss) = (status(p, mode), status(s, mode));
        if ss["state"] == json!("stream-wals")
            && ss["last_remote_wal"] == ps["last_wal"]
            && ss["merkle_root"] == ps["merkle_root"]
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the {mode} secondary did not catch up {when}:\nprimary {ps}\nsecondary {ss}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_three_node_primary_cluster_fails_over_under_writes_and_its_secondaries_stream_on() {
    use cairn_tests::cluster::{enable_secondary, licensed, status, token, wait_for};
    let mut c = Cluster::start_with(3, "ha_tri", licensed_extra);
    let a = c.wait_active(Duration::from_secs(15), None);
    let keys = c.nodes[a].unseal_keys.clone();
    {
        let p = &c.nodes[a];
        assert_eq!(p.post("sys/mounts/kv", json!({"type": "kv"})).status, 204);
        for mode in ["performance", "dr"] {
            let r = p.post(&format!("sys/replication/{mode}/primary/enable"), json!({}));
            assert_eq!(r.status, 200, "{}", r.body);
        }
    }
    // Every node of the primary cluster is in its registry before the tokens are made, so
    // the secondaries learn all three addresses.
    wait_for("three nodes in ha-status", 60, || {
        c.nodes[a].get("sys/ha-status").body["nodes"]
            .as_array()
            .map(Vec::len)
            == Some(3)
    });
    // A performance secondary cluster of two nodes on its own tables.
    let mut sc = Cluster::start_with(2, "ha_tri_perf", licensed_extra);
    let sa = sc.wait_active(Duration::from_secs(15), None);
    let tok = token(&c.nodes[a], "performance", "perf-ha2");
    enable_secondary(&sc.nodes[sa], "performance", &tok);
    // The secondary cluster now holds the primary's keyring: its standby finds that its key
    // no longer reads the cluster's data and seals itself; it is unsealed, without a
    // restart, with the primary cluster's key shares.
    for i in (0..2).filter(|&i| i != sa) {
        wait_for("the secondary's standby seals itself", 60, || {
            sc.nodes[i].get("sys/seal-status").body["sealed"] == json!(true)
        });
        sc.nodes[i].unseal_keys = keys.clone();
        sc.nodes[i].unseal();
        assert_eq!(
            sc.nodes[i].get("sys/seal-status").body["sealed"],
            json!(false)
        );
    }
    let mut d = licensed("ha-tri-dr");
    let dtok = token(&c.nodes[a], "dr", "dr-ha");
    enable_secondary(&d, "dr", &dtok);
    for (s, mode) in [(&sc.nodes[sa], "performance"), (&d, "dr")] {
        wait_for("the first sync", 120, || {
            status(s, mode)["state"] == json!("stream-wals")
        });
        let st = status(s, mode);
        assert_eq!(
            st["known_primary_cluster_addrs"].as_array().map(Vec::len),
            Some(3),
            "{st}"
        );
    }
    sc.nodes[sa].root_token = cairn_tests::cluster::generate_root(&sc.nodes[sa], &keys);
    d.root_token = String::new();
    assert_eq!(c.nodes[a].put("kv/before", json!({"v": 0})).status, 204);
    for (s, mode) in [(&sc.nodes[sa], "performance"), (&d, "dr")] {
        wait_streaming(&c.nodes[a], s, mode, "before the failover");
    }
    let diffs = |s: &Server, mode: &str| status(s, mode)["merkle_diffs"].as_u64();
    let perf_diffs = diffs(&sc.nodes[sa], "performance");
    let dr_diffs = diffs(&d, "dr");
    assert!(perf_diffs.is_some() && dr_diffs.is_some());

    // Writes through every node of the primary cluster (standbys forward), while its
    // active node is killed with -9; only acknowledged writes are counted.
    let acked: Arc<Mutex<Vec<u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let addrs: Vec<String> = c.nodes.iter().map(|n| n.addr.clone()).collect();
    let root = c.nodes[a].root_token.clone();
    let writer = {
        let (acked, stop) = (acked.clone(), stop.clone());
        std::thread::spawn(move || {
            let agent = cairn_tests::agent(Duration::from_secs(30));
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let url = format!("{}/v1/kv/w{i}", addrs[i as usize % addrs.len()]);
                let ok = agent
                    .put(&url)
                    .header("X-Vault-Token", &root)
                    .send_json(json!({ "v": i }))
                    .map(|r| r.status().as_u16() == 204)
                    .unwrap_or(false);
                if ok {
                    acked.lock().expect("acked").push(i);
                } else {
                    std::thread::sleep(Duration::from_millis(100));
                }
                i += 1;
            }
        })
    };
    wait_for("writes before the kill", 120, || {
        acked.lock().expect("acked").len() >= 20
    });
    c.nodes[a].kill9();
    let b = c.wait_active(Duration::from_secs(60), Some(a));
    let at_kill = acked.lock().expect("acked").len();
    wait_for("writes after the failover", 180, || {
        acked.lock().expect("acked").len() >= at_kill + 20
    });
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    let acked = acked.lock().expect("acked").clone();

    // Both secondaries stream from the new active node and have applied its whole WAL,
    // without a Merkle resync: they resumed from their WAL index.
    let p = &c.nodes[b];
    for (s, mode) in [(&sc.nodes[sa], "performance"), (&d, "dr")] {
        wait_streaming(p, s, mode, "after the failover");
    }
    assert_eq!(diffs(&sc.nodes[sa], "performance"), perf_diffs);
    assert_eq!(diffs(&d, "dr"), dr_diffs);
    // Every acknowledged write is on the new active node and on the performance secondary
    // (the DR secondary serves no reads; it applied the same WAL).
    let s = &sc.nodes[sa];
    for i in &acked {
        assert_eq!(
            p.get(&format!("kv/w{i}")).body["data"]["v"],
            json!(i),
            "kv/w{i} lost on the primary cluster"
        );
        assert_eq!(
            s.get(&format!("kv/w{i}")).body["data"]["v"],
            json!(i),
            "kv/w{i} missing on the performance secondary"
        );
    }
}

/// A DR secondary that is itself an HA cluster of two nodes on its own tables: its standby,
/// whose keyring the activation replaced, seals itself and is unsealed with the primary's
/// key shares; it forwards to its active node over the cluster channel pinned to the CA the
/// cluster received from its primary by sync; when its active node is killed with -9 the
/// other node takes over and streams on from the WAL index the cluster stored, without a
/// Merkle diff (killed within the second its Merkle records are deferred, the node taking
/// over rebuilds its trees and compares roots with the primary once, by design); promoted
/// through its active node, the cluster serves the primary's data.
#[test]
fn a_dr_secondary_cluster_of_two_nodes_forwards_and_streams_on_through_a_failover() {
    use cairn_tests::cluster::{enable_secondary, licensed, promote_dr, status, token, wait_for};
    let started = Instant::now();
    let p = licensed("ha-dr2-primary");
    let keys = p.unseal_keys.clone();
    assert_eq!(p.post("sys/mounts/kv", json!({"type": "kv"})).status, 204);
    let r = p.post("sys/replication/dr/primary/enable", json!({}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(p.put("kv/before", json!({"v": 0})).status, 204);

    // The DR secondary cluster: two nodes on their own tables, DR secondary enabled on the
    // active one.
    let mut d = Cluster::start_with(2, "ha_dr2", licensed_extra);
    let a = d.wait_active(Duration::from_secs(15), None);
    let b = 1 - a;
    let tok = token(&p, "dr", "dr-ha2");
    enable_secondary(&d.nodes[a], "dr", &tok);
    // The cluster's tokens are gone (a DR secondary serves none); its keyring is the
    // primary's now: the standby's key no longer reads the cluster's data, it seals itself
    // and is unsealed, without a restart, with the primary's key shares.
    for n in d.nodes.iter_mut() {
        n.root_token = String::new();
        n.unseal_keys = keys.clone();
    }
    wait_for("the DR secondary's standby seals itself", 60, || {
        d.nodes[b].get("sys/seal-status").body["sealed"] == json!(true)
    });
    d.nodes[b].unseal();
    assert_eq!(
        d.nodes[b].get("sys/seal-status").body["sealed"],
        json!(false)
    );
    assert_eq!(
        d.nodes[a].get("sys/leader").body["is_self"],
        json!(true),
        "the DR secondary's active node stayed active"
    );
    wait_for("the DR secondary cluster's first sync", 120, || {
        status(&d.nodes[a], "dr")["state"] == json!("stream-wals")
    });
    wait_streaming(&p, &d.nodes[a], "dr", "after its first sync");
    eprintln!("ha-dr2: first sync done after {:?}", started.elapsed());

    // The standby forwards what it does not serve itself (the DR status included) to the
    // active node, over the cluster channel pinned to the primary's CA, received by sync.
    assert_eq!(d.nodes[b].get("sys/health").status, 429);
    assert_eq!(d.nodes[b].get("sys/leader").body["is_self"], json!(false));
    let deadline = Instant::now() + Duration::from_secs(30);
    let fwd = loop {
        let r = d.nodes[b].call_as(None, "GET", "sys/replication/dr/status", None);
        if r.status == 200 || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(fwd.status, 200, "forwarded DR status: {}", fwd.body);
    let (fwd, own) = (fwd.body["data"].clone(), status(&d.nodes[a], "dr"));
    assert_eq!(fwd["state"], json!("stream-wals"), "{fwd}");
    assert_eq!(fwd["secondary_id"], json!("dr-ha2"), "{fwd}");
    assert_eq!(fwd["cluster_id"], own["cluster_id"], "{fwd}\n{own}");
    assert_eq!(
        fwd["last_remote_wal"], own["last_remote_wal"],
        "{fwd}\n{own}"
    );
    assert_eq!(fwd["merkle_root"], own["merkle_root"], "{fwd}\n{own}");
    // A request the DR secondary refuses is refused the same way through its standby.
    let r = d.nodes[b].call_as(Some(&p.root_token), "GET", "kv/before", None);
    let r2 = d.nodes[a].call_as(Some(&p.root_token), "GET", "kv/before", None);
    assert_eq!((r.status, &r.body), (r2.status, &r2.body));
    assert!(r.status >= 400, "a DR secondary served a read: {}", r.body);

    // kill -9 of the DR secondary cluster's active node once it wrote its Merkle records
    // (they are written at most a second after the changes; the completeness marker is
    // stored again with them): the standby takes over and streams on from the WAL index the
    // cluster stored, without a Merkle diff.
    let wal_before = own["last_remote_wal"].as_u64().expect("last_remote_wal");
    // Paused once the marker is stored, and killed if it still is (nothing written since).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        wait_for("the DR secondary's Merkle records written", 30, || {
            merkle_marker_stored("ha_dr2")
        });
        signal(d.pid(a), "-STOP");
        if merkle_marker_stored("ha_dr2") {
            break;
        }
        signal(d.pid(a), "-CONT");
        assert!(Instant::now() < deadline, "the Merkle marker never stayed");
    }
    let killed_at = Instant::now();
    d.nodes[a].kill9();
    assert_eq!(d.wait_active(Duration::from_secs(30), Some(a)), b);
    eprintln!(
        "ha-dr2: node {b} active {:?} after the kill",
        killed_at.elapsed()
    );
    assert_eq!(p.put("kv/after", json!({"v": 1})).status, 204);
    wait_streaming(&p, &d.nodes[b], "dr", "after its active node was killed");
    let st = status(&d.nodes[b], "dr");
    eprintln!(
        "ha-dr2: streaming again {:?} after the kill",
        killed_at.elapsed()
    );
    assert!(
        st["last_remote_wal"].as_u64() > Some(wal_before),
        "{wal_before} {st}"
    );
    // The counter counts the Merkle diffs this node's process started as a secondary: it
    // was a standby until the kill and resumed from the stored WAL index.
    assert_eq!(st["merkle_diffs"].as_u64(), Some(0), "{st}");

    // The killed node comes back as a standby (unsealed with the primary's shares). Its
    // active node is killed while the primary writes: the Merkle records of what it applied
    // last are not written yet (the marker is absent), so the node taking over rebuilds the
    // trees from the data and, by design, compares its roots with the primary's once (a
    // value changed in storage behind the dead node's back would be in the rebuilt trees):
    // one Merkle diff, after which it streams on with the primary's roots.
    d.restart(a);
    wait_for("the restarted node to see the active one", 30, || {
        d.nodes[a].get("sys/health").status == 429
    });
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (addr, root, stop) = (p.addr.clone(), p.root_token.clone(), stop.clone());
        std::thread::spawn(move || {
            let agent = cairn_tests::agent(Duration::from_secs(30));
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let r = agent
                    .put(&format!("{addr}/v1/kv/w{i}"))
                    .header("X-Vault-Token", &root)
                    .send_json(json!({ "v": i }));
                assert_eq!(r.map(|r| r.status().as_u16()).ok(), Some(204), "kv/w{i}");
                i += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            i
        })
    };
    let from = status(&d.nodes[b], "dr")["last_remote_wal"].as_u64();
    wait_for("streamed writes on the DR secondary", 60, || {
        status(&d.nodes[b], "dr")["last_remote_wal"].as_u64() > from.map(|f| f + 20)
    });
    // Paused first, so that what it left in storage can be read before it is killed.
    signal(d.pid(b), "-STOP");
    let marker = merkle_marker_stored("ha_dr2");
    stop.store(true, Ordering::Relaxed);
    let writes = writer.join().expect("writer");
    d.nodes[b].kill9();
    assert_eq!(d.wait_active(Duration::from_secs(30), Some(b)), a);
    wait_streaming(&p, &d.nodes[a], "dr", "after its second failover");
    let st = status(&d.nodes[a], "dr");
    eprintln!(
        "ha-dr2: {writes} writes during the second failover; Merkle marker stored at the \
         kill: {marker}; {st}"
    );
    assert_eq!(
        st["merkle_diffs"].as_u64(),
        Some(if marker { 0 } else { 1 }),
        "{st}"
    );
    let last = writes.checked_sub(1).expect("writes");
    assert_eq!(p.get(&format!("kv/w{last}")).body["data"]["v"], json!(last));

    // Promoted through its active node with a DR operation token made from the primary's
    // shares: it serves the primary's data (and its tokens), through its standby as well.
    d.restart(b);
    promote_dr(&d.nodes[a], &keys);
    for n in d.nodes.iter_mut() {
        n.root_token = p.root_token.clone();
    }
    wait_for("the promoted cluster to serve the last write", 60, || {
        d.nodes[a].get(&format!("kv/w{last}")).body["data"]["v"] == json!(last)
    });
    assert_eq!(d.nodes[a].get("kv/before").body["data"]["v"], json!(0));
    wait_for(
        "kv/after through the promoted cluster's standby",
        30,
        || d.nodes[b].get("kv/after").body["data"]["v"] == json!(1),
    );
    eprintln!("ha-dr2: done after {:?}", started.elapsed());
}

/// Whether the Merkle completeness marker of the cluster on `table` is stored (every page
/// record of its trees written).
fn merkle_marker_stored(table: &str) -> bool {
    let n = psql(&format!(
        "select count(*) from {table}_kv where key = convert_to('node/merkle-version', 'UTF8')"
    ));
    n == "1"
}

/// A standby forwards its clients' requests on kept-alive connections to the active node.
/// When the active node is killed with such connections open, a write through the standby
/// gets its answer or a 5xx, and is never applied twice: KV version 2 keeps every applied
/// write as a version of the key, and no written value is in two of them.
#[test]
fn writes_through_a_standby_whose_active_node_is_killed_are_never_applied_twice() {
    let mut c = Cluster::start(2, "ha_kept_alive");
    let a = c.wait_active(Duration::from_secs(5), None);
    let b = 1 - a;
    let r = c.nodes[b].post(
        "sys/mounts/kv2",
        json!({"type": "kv", "options": {"version": "2"}}),
    );
    assert_eq!(r.status, 204, "{}", r.body);
    // Every version kept (10 by default), so that each applied write can be read back.
    let r = c.nodes[b].post("kv2/config", json!({"max_versions": 1_000_000}));
    assert!(r.status == 200 || r.status == 204, "{}", r.body);
    // Connections from the standby to the active node, kept alive.
    for _ in 0..20 {
        assert_eq!(c.nodes[b].get("sys/mounts").status, 200);
    }
    let answers: Arc<Mutex<Vec<(String, u16)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (addr, token) = (c.nodes[b].addr.clone(), c.nodes[b].root_token.clone());
            let (answers, stop) = (answers.clone(), stop.clone());
            std::thread::spawn(move || {
                let agent = cairn_tests::agent(Duration::from_secs(30));
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let value = format!("w{w}-{i}");
                    let r = cairn_tests::request(
                        &agent,
                        &addr,
                        Some(&token),
                        "PUT",
                        "kv2/data/k",
                        Some(&json!({ "data": { "v": value } })),
                    );
                    let status = r.map_or(0, |r| r.status);
                    answers.lock().expect("lock").push((value, status));
                    if status != 200 {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1000));
    c.nodes[a].kill9();
    assert_eq!(c.wait_active(Duration::from_secs(15), Some(a)), b);
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().expect("writer");
    }
    let answers = answers.lock().expect("lock").clone();
    for (value, status) in &answers {
        assert!(
            *status == 200 || *status >= 500,
            "write {value}: {status} (an answer or a 5xx)"
        );
    }
    let meta = c.nodes[b].get("kv2/metadata/k");
    assert_eq!(meta.status, 200, "{}", meta.body);
    let last = meta.body["data"]["current_version"]
        .as_u64()
        .expect("version");
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    for v in 1..=last {
        let r = c.nodes[b].get(&format!("kv2/data/k?version={v}"));
        assert_eq!(r.status, 200, "version {v}: {}", r.body);
        let value = r.body["data"]["data"]["v"]
            .as_str()
            .expect("value")
            .to_string();
        if let Some(first) = seen.insert(value.clone(), v) {
            panic!("{value} applied twice: versions {first} and {v}");
        }
    }
    for (value, status) in &answers {
        if *status == 200 {
            assert!(seen.contains_key(value), "acknowledged {value} lost");
        }
    }
    let failed = answers.iter().filter(|(_, s)| *s != 200).count();
    eprintln!(
        "ha: {} writes, {failed} answered with a 5xx, {last} versions",
        answers.len()
    );
    assert!(answers.len() > failed, "no write acknowledged");
}

#[test]
fn a_database_outage_longer_than_the_lease_acknowledges_nothing_and_the_cluster_recovers_alone() {
    use std::ffi::OsStr;
    // A database of its own: this test stops it.
    let pg = std::env::temp_dir().join(format!("cairn-e2e-ha-outage-{}", std::process::id()));
    let env = start_dev_directory("dev-postgres.sh", &pg, "CAIRN_PG_WATCH_PID");
    note_secret(&env["CAIRN_PG_PASSWORD"]);
    let url = format!("{}&connect_timeout=2", env["CAIRN_PG_URL"]);
    let c = Cluster::start_on(3, "ha_outage", &url, |_| String::new());
    let a = c.wait_active(Duration::from_secs(5), None);
    let b = (a + 1) % 3;
    assert_eq!(
        c.nodes[a]
            .post("sys/mounts/kv", json!({"type": "kv"}))
            .status,
        204
    );

    // Writers through the active node and through a standby, all along: every write
    // acknowledged is recorded with when its answer came.
    let acked: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = [a, b]
        .into_iter()
        .map(|n| spawn_writer(&c.nodes[n], &format!("n{n}-"), &acked, &stop))
        .collect();
    std::thread::sleep(Duration::from_millis(1000));

    // The database goes away for longer than the lease (6 s).
    let script = |cmd: &str| {
        cairn_tests::run_dev_script(
            "dev-postgres.sh",
            &[OsStr::new(cmd), pg.as_os_str()],
            "CAIRN_PG_WATCH_PID",
        )
    };
    script("down");
    let down_at = Instant::now();
    // Past the lease (6 s): every node still answers (no request hangs on the missing
    // database), and none says it is a healthy active node once the lease it could not
    // renew has run out.
    std::thread::sleep(Duration::from_millis(8000));
    for (i, n) in c.nodes.iter().enumerate() {
        let t = Instant::now();
        let h = n.get("sys/health");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "node {i} took {:?} to answer sys/health during the outage",
            t.elapsed()
        );
        assert_ne!(
            h.status, 200,
            "node {i} healthy and active without its database: {}",
            h.body
        );
    }
    let up_at = Instant::now();
    script("up");

    // One node takes the lease again by itself, and writes are acknowledged again.
    let active = c.wait_active(Duration::from_secs(30), None);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n = acked
            .lock()
            .expect("lock")
            .iter()
            .filter(|(_, t)| *t > up_at)
            .count();
        if n >= 10 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no writes acknowledged 20 s after the database came back ({n})"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let refused = w.join().expect("writer");
        // Refused, not failed: the cluster had no active node (5xx), never a client error.
        assert!(
            refused.iter().all(|s| *s >= 500),
            "writes answered {refused:?}"
        );
    }
    let acked = acked.lock().expect("lock").clone();
    // Nothing was acknowledged while the database was down (past the answers already on
    // their way when it went: 1 s), and nothing acknowledged is lost.
    let during: Vec<&String> = acked
        .iter()
        .filter(|(_, t)| *t > down_at + Duration::from_secs(1) && *t < up_at)
        .map(|(k, _)| k)
        .collect();
    assert!(
        during.is_empty(),
        "acknowledged while the database was down: {during:?}"
    );
    let before = acked.iter().filter(|(_, t)| *t < down_at).count();
    assert!(before > 0, "no write acknowledged before the outage");
    for (key, _) in &acked {
        let r = c.nodes[active].get(&format!("kv/{key}"));
        assert_eq!(r.status, 200, "acknowledged {key} lost: {}", r.body);
    }
    eprintln!(
        "outage: {} writes acknowledged ({before} before it); node {active} active after",
        acked.len()
    );
}
