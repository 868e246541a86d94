//! End-to-end: connection floods on the TLS cluster listener of a replication primary.
//! The cluster listener has limits of its own in the listener stanza
//! (`cluster_max_connections`, `cluster_read_header_timeout`, `cluster_idle_timeout`):
//! 2,000 connections that never start or never finish a TLS handshake do not keep the
//! performance secondary from streaming, nor a new cluster client from getting its
//! ServerHello within a second, and the primary's threads and descriptors stay bounded.

use cairn_tests::cluster::{self, ok};
use cairn_tests::tls_hello::{client_hello_prefix, server_hello_time};
use cairn_tests::{fresh_port_pair, tmpdir, Server, TEST_ISSUER_KEY, TEST_LICENSE};
use serde_json::json;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Threads and open descriptors of process `pid`.
fn threads_and_fds(pid: u32) -> (usize, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let threads = status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    (threads, fds)
}

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
    let (threads0, fds0) = threads_and_fds(pid);

    // 1,800 connections that never send a byte and 200 that send a ClientHello a few bytes
    // at a time and never finish it.
    let mut idle = Vec::new();
    for _ in 0..1800 {
        idle.push(TcpStream::connect(&caddr).expect("idle connect"));
    }
    let hello = client_hello_prefix(64);
    let mut slow = Vec::new();
    for _ in 0..200 {
        let mut c = TcpStream::connect(&caddr).expect("slow connect");
        let _ = c.write_all(&hello[..5]);
        slow.push(c);
    }
    for round in 0..3 {
        for c in slow.iter_mut() {
            let _ = c.write_all(&hello[5 + round..6 + round]);
        }
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
    let (threads, fds) = threads_and_fds(pid);
    eprintln!(
        "cluster floods: before {threads0} threads / {fds0} fds; with 2,000 flood connections \
         {threads} threads / {fds} fds (cluster_max_connections {MAX})"
    );
    assert!(
        threads < threads0 + 2 * MAX,
        "threads grew to {threads} (from {threads0}) with cluster_max_connections {MAX}"
    );
    assert!(
        fds < fds0 + 3 * MAX + 50,
        "descriptors grew to {fds} (from {fds0}) with cluster_max_connections {MAX}"
    );

    // Handshakes that never finish are dropped after cluster_read_header_timeout.
    std::thread::sleep(Duration::from_secs(4));
    let mut closed = 0;
    for c in slow.iter_mut() {
        c.set_read_timeout(Some(Duration::from_millis(50))).ok();
        let mut b = [0u8; 64];
        // Closed: end of stream or a reset, perhaps after an alert; open: no answer.
        for _ in 0..4 {
            match c.read(&mut b) {
                Ok(0) => {
                    closed += 1;
                    break;
                }
                Ok(_) => continue,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
                Err(_) => {
                    closed += 1;
                    break;
                }
            }
        }
    }
    assert_eq!(closed, slow.len(), "unfinished handshakes still held");
    drop(idle);
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
