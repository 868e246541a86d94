//! End-to-end: connection floods on the TLS cluster listener of a replication primary.
//! The cluster listener has limits of its own in the listener stanza
//! (`cluster_max_connections`, `cluster_read_header_timeout`, `cluster_idle_timeout`):
//! 2,000 connections that never start or never finish a TLS handshake do not keep the
//! performance secondary from streaming, nor a new cluster client from getting its
//! ServerHello within a second, and the primary's threads and descriptors stay bounded.

use cairn_tests::cluster::{self, ok};
use cairn_tests::flood::{assert_bounded, threads_and_fds, Flood};
use cairn_tests::tls_hello::{client_hello_prefix, server_hello_time};
use cairn_tests::{fresh_port_pair, tmpdir, Server, TEST_ISSUER_KEY, TEST_LICENSE};
use serde_json::json;
use std::time::{Duration, Instant};

#[test]
fn a_flood_on_the_cluster_listener_does_not_stop_replication() {
    const MAX: usize = 200;
    let dir = tmpdir("cflood");
    let port = fresh_port_pair();
    let lic = dir.join("license.json");
    std::fs::write(&lic, TEST_LICENSE).expect("write license");
    let cfg = dir.join("cairn.hcl");
    std::fs::write(
        &cfg,
        format!(
            "storage \"sqlite\" {{ path = \"{d}/c.db\" }}\nlistener \"tcp\" {{\n  \
             address = \"127.0.0.1:{port}\"\n  cluster_address = \"127.0.0.1:{c}\"\n  \
             tls_disable = true\n  cluster_max_connections = {MAX}\n  \
             cluster_read_header_timeout = \"3s\"\n}}\napi_addr = \"http://127.0.0.1:{port}\"\n\
             license_path = \"{l}\"\nlicense_trusted_key = \"{TEST_ISSUER_KEY}\"\n{t}",
            d = dir.display(),
            c = port + 1,
            l = lic.display(),
            t = cluster::TUNING,
        ),
    )
    .expect("write config");
    let api = format!("http://127.0.0.1:{port}");
    let mut p = Server::spawn_config(&cfg, &api).unwrap_or_else(|e| panic!("start: {e}"));
    p.wait_ready();
    p.init_unseal(3, 2);
    let s = cluster::licensed("cflood-sec");
    ok(
        204,
        p.post("sys/mounts/secret", json!({"type": "kv"})),
        "mount",
    );
    ok(
        200,
        p.post("sys/replication/performance/primary/enable", json!({})),
        "perf enable",
    );
    let tok = cluster::token(&p, "performance", "perf");
    cluster::enable_secondary(&s, "performance", &tok);
    cluster::wait_caught_up("the secondary to stream", 60, &p, &s, "performance", "perf");
    let caddr = format!("127.0.0.1:{}", port + 1);
    cluster::wait_for("the cluster listener to serve TLS", 20, || {
        server_hello_time(&caddr).is_some()
    });
    let pid = p.child.as_ref().map(|c| c.id()).expect("running");
    let before = threads_and_fds(pid);

    // 1,800 connections that never send a byte and 200 that send a ClientHello a few bytes
    // at a time and never finish it.
    let hello = client_hello_prefix(64);
    let mut flood = Flood::open(&caddr, 1800, 200, &hello[..5]);
    for round in 0..3 {
        flood.trickle(&hello[5 + round..6 + round]);
        // A new cluster client gets its ServerHello within a second.
        let took = server_hello_time(&caddr);
        assert!(
            took.is_some_and(|t| t < Duration::from_secs(1)),
            "round {round}: a new cluster client waited {took:?}"
        );
        // The secondary keeps streaming: a write reaches it.
        let t = Instant::now();
        ok(
            204,
            p.put(&format!("secret/flood-{round}"), json!({"v": round})),
            "write",
        );
        cluster::wait_caught_up(
            "the secondary during the flood",
            10,
            &p,
            &s,
            "performance",
            "perf",
        );
        eprintln!(
            "cluster floods: round {round}: ServerHello in {took:?}, the write reached the \
             secondary in {:?}",
            t.elapsed()
        );
    }
    assert_bounded(pid, before, MAX, "cluster floods (cluster_max_connections)");

    // Handshakes that never finish are dropped after cluster_read_header_timeout.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        flood.slow_closed(),
        flood.slow.len(),
        "unfinished handshakes still held"
    );
    drop(flood);
    ok(204, p.put("secret/after", json!({"v": 1})), "write");
    cluster::wait_caught_up(
        "the secondary after the flood",
        10,
        &p,
        &s,
        "performance",
        "perf",
    );
}
