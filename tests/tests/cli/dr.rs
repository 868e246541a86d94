//! The DR operation-token workflow through the CLI, as an operator at a terminal runs it.

use super::*;

/// A DR primary and its DR secondary (hosted, SQLite, 3 shares / threshold 2), streaming.
fn dr_pair() -> (Server, Server) {
    let mut p = Server::start_owned("cli-drp", "hosted = true");
    p.init_unseal(3, 2);
    let mut d = Server::start_owned("cli-drs", "hosted = true");
    d.init_unseal(3, 2);
    let r = p.post("sys/replication/dr/primary/enable", json!({}));
    assert!(r.status == 200, "dr enable: {r:?}");
    let r = p.post(
        "sys/replication/dr/primary/secondary-token",
        json!({"id": "dr-tmux"}),
    );
    assert!(r.status == 200, "secondary-token: {r:?}");
    let tok = r.body["wrap_info"]["token"]
        .as_str()
        .expect("activation token")
        .to_string();
    let r = d.post(
        "sys/replication/dr/secondary/enable",
        json!({ "token": tok }),
    );
    assert!(r.status == 200, "secondary enable: {r:?}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = d.call_as(None, "GET", "sys/replication/dr/status", None);
        if st.body["data"]["state"] == "stream-wals" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "DR secondary never streamed: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    (p, d)
}

#[test]
fn a_person_at_a_terminal_generates_a_dr_operation_token() {
    if Command::new("tmux").arg("-V").output().is_err() {
        panic!("tmux is not installed (scripts/setup.sh installs it)");
    }
    let (p, d) = dr_pair();
    let home = tmpdir("cli-tmux-dr");
    let bin = cairn_bin();
    let tmux = Tmux {
        socket: format!("cairn-cli-dr-test-{}", std::process::id()),
    };
    let shell = format!(
        "env -i PATH=/usr/bin:/bin HOME={} TERM=xterm CAIRN_ADDR={} PS1='$ ' bash --norc --noprofile",
        home.display(),
        d.addr
    );
    let o = tmux.cmd(&[
        "new-session",
        "-d",
        "-s",
        "cli",
        "-x",
        "200",
        "-y",
        "50",
        &shell,
    ]);
    assert!(o.status.success(), "tmux new-session: {o:?}");
    tmux.wait_for("$");

    // -init on the DR secondary shows the OTP once.
    tmux.type_line(&format!(
        "{} operator generate-root -dr-token -init",
        bin.display()
    ));
    let screen = tmux.wait_for("OTP Length");
    assert!(screen.contains("One-Time-Password"), "{screen}");
    let otp = screen
        .lines()
        .find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 2 && w[0] == "OTP").then(|| w[1].to_string())
        })
        .unwrap_or_else(|| panic!("no OTP row:\n{screen}"));
    cairn_tests::note_secret(&otp);

    // Each share holder types the primary's share at a prompt that does not echo it.
    for (i, key) in p.unseal_keys[..2].iter().enumerate() {
        tmux.type_line("clear");
        tmux.type_line(&format!(
            "{} operator generate-root -dr-token",
            bin.display()
        ));
        tmux.wait_for("Unseal Key (will be hidden):");
        tmux.type_line(key);
        let screen = tmux.wait_for(if i == 0 { "1/2" } else { "Decode the token" });
        assert!(
            !screen.contains(key.as_str()),
            "the share was echoed:\n{screen}"
        );
    }
    let screen = tmux.screen();
    assert!(
        screen
            .lines()
            .any(|l| l.split_whitespace().eq(["Complete", "true"])),
        "{screen}"
    );
    let encoded = screen
        .lines()
        .find_map(|l| l.trim().split("-decode=").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no decode hint:\n{screen}"))
        .to_string();

    // Decoding with the OTP prints the DR operation token, which the secondary accepts.
    tmux.type_line("clear");
    tmux.type_line(&format!(
        "{} operator generate-root -dr-token -decode={encoded} -otp={otp}; echo rc\"\"=$?",
        bin.display()
    ));
    let screen = tmux.wait_for("rc=");
    assert!(screen.contains("rc=0"), "{screen}");
    // The line printed just before `rc=0` (the typed command may wrap over several lines).
    let lines: Vec<&str> = screen.lines().map(str::trim).collect();
    let token = lines
        .iter()
        .position(|l| *l == "rc=0")
        .and_then(|i| i.checked_sub(1))
        .map(|i| lines[i].to_string())
        .filter(|t| !t.is_empty() && !t.contains(' '))
        .unwrap_or_else(|| panic!("no token:\n{screen}"));
    cairn_tests::note_secret(&token);
    let r = d.call_as(
        None,
        "POST",
        "sys/replication/dr/secondary/merkle-check",
        Some(json!({ "dr_operation_token": token })),
    );
    assert_eq!(r.status, 200, "the decoded token was refused: {r:?}");
}
