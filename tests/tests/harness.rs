//! The end-to-end harness itself: a server is only taken for the test's own when its start
//! line names its PID and address, a taken port is reported as such (and retried on another
//! pair by `Server::start`), a restart whose port was taken fails saying so, and what a
//! server owns is cleaned up when it is dropped, also by a panic.

use cairn_tests::{fresh_port_pair, tmpdir, KillOnDrop, Server, StartError};
use std::net::TcpListener;

#[test]
fn a_taken_api_or_cluster_port_is_reported_as_taken() {
    let dir = tmpdir("harness-taken");
    for offset in [0u16, 1] {
        let port = fresh_port_pair();
        let _other = TcpListener::bind(("127.0.0.1", port + offset)).expect("bind");
        match Server::try_with_config(&dir, port, "") {
            Err(StartError::PortTaken(m)) => {
                assert!(m.contains("already in use"), "{m}");
            }
            Err(e) => panic!("offset {offset}: want PortTaken, got {e}"),
            Ok(s) => panic!(
                "offset {offset}: a server was taken for started on a port another process \
                 holds: {}",
                s.addr
            ),
        }
    }
}

#[test]
fn the_started_server_is_the_child_named_in_its_start_line() {
    let s = Server::start_owned("harness-pid", "");
    let pid = s.child.as_ref().expect("running").id();
    let line = s
        .stdout_lines
        .iter()
        .find(|l| l.starts_with("==> Cairn server started."))
        .expect("start line");
    assert!(line.ends_with(&format!("PID: {pid}")), "{line}");
    assert!(line.contains(&format!("API: {}  ", s.addr)), "{line}");
    assert_eq!(s.get("sys/health").status, 501, "not initialised yet");
}

#[test]
fn a_restart_whose_port_was_taken_fails_saying_so() {
    let mut s = Server::start_owned("harness-restart", "");
    s.kill9();
    // Another process takes the port while the server is down.
    let _other = TcpListener::bind(("127.0.0.1", s.port)).expect("bind the freed port");
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.restart()));
    let e = r.expect_err("restart on a taken port");
    let msg = e
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        msg.contains(&format!("restart on port {}", s.port))
            && msg.contains("taken by another process"),
        "{msg}"
    );
    assert!(s.child.is_none(), "no process left running");
}

#[test]
fn servers_and_their_directories_are_cleaned_up_on_panic() {
    let (dir, pid) = std::thread::spawn(|| {
        let s = Server::start_owned("harness-cleanup", "");
        let dir = s.dir.clone();
        let pid = s.child.as_ref().expect("running").id();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _s = s;
            panic!("an assertion failed");
        }));
        assert!(r.is_err());
        (dir, pid)
    })
    .join()
    .expect("thread");
    assert!(!dir.exists(), "{} left behind", dir.display());
    // The process was killed and reaped: no /proc entry (a zombie would still have one).
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "pid {pid} still there"
    );
    // A KillOnDrop child, too.
    let child = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .expect("sleep");
    let pid = child.id();
    drop(KillOnDrop(child));
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
}
