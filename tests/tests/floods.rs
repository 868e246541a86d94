//! End-to-end: connection floods and slow clients against a real server. Each connection is
//! served on a thread, so the listener bounds what idle and slow clients hold
//! (`max_connections`, `http_read_header_timeout`, `http_idle_timeout` in the listener stanza):
//! 2,000 idle connections and a few hundred slowloris clients do not keep a new client from
//! being answered within a second, and the server's threads and descriptors stay bounded.

use cairn_tests::flood::{assert_bounded, threads_and_fds, Flood};
use cairn_tests::{fresh_port_pair, tmpdir, Server};
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One plain HTTP/1.1 `GET /v1/sys/health` on a new connection: the status and how long the
/// answer took.
fn health(addr: &str) -> (u16, Duration) {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        s,
        "GET /v1/sys/health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, t.elapsed())
}

#[test]
fn idle_and_slow_connections_do_not_lock_out_a_new_client() {
    const MAX: usize = 300;
    let dir = tmpdir("floods");
    let port = fresh_port_pair();
    let cfg = dir.join("cairn.hcl");
    std::fs::write(
        &cfg,
        format!(
            "storage \"sqlite\" {{ path = \"{d}/c.db\" }}\nlistener \"tcp\" {{\n  \
             address = \"127.0.0.1:{port}\"\n  cluster_address = \"127.0.0.1:{c}\"\n  \
             tls_disable = true\n  max_connections = {MAX}\n  \
             http_read_header_timeout = \"3s\"\n  http_idle_timeout = \"30s\"\n}}\n",
            d = dir.display(),
            c = port + 1
        ),
    )
    .expect("write config");
    let api = format!("http://127.0.0.1:{port}");
    let mut s = Server::spawn_config(&cfg, &api).unwrap_or_else(|e| panic!("start: {e}"));
    s.wait_ready();
    s.init_unseal(1, 1);
    let pid = s.child.as_ref().map(|c| c.id()).expect("running");
    let addr = format!("127.0.0.1:{port}");
    let before = threads_and_fds(pid);

    // 2,000 idle connections (connected, never a byte) and 200 slowloris clients (a request
    // head begun, one header line at a time, never finished).
    let mut flood = Flood::open(
        &addr,
        2000,
        200,
        b"GET /v1/sys/health HTTP/1.1\r\nHost: x\r\n",
    );
    for round in 0..3 {
        flood.trickle(format!("X-Slow-{round}: y\r\n").as_bytes());
        // A new client is answered within a second while the flood holds on.
        let (status, took) = health(&addr);
        assert_eq!(status, 200, "a new client was not served during the flood");
        assert!(
            took < Duration::from_secs(1),
            "a new client waited {took:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_bounded(pid, before, MAX, "floods (max_connections)");

    // The slowloris heads never finish: they are closed after http_read_header_timeout.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        flood.slow_closed(),
        flood.slow.len(),
        "slow clients still held after the header timeout"
    );
    drop(flood);
    let (status, took) = health(&addr);
    assert_eq!(status, 200);
    assert!(took < Duration::from_secs(1), "{took:?}");
    // The server still does its work.
    assert_eq!(s.post("sys/mounts/kv", json!({"type": "kv"})).status, 204);
    assert_eq!(s.put("kv/after", json!({"v": 1})).status, 204);
}
