//! What a newcomer sees when the server refuses to start (a missing token, a busy port, a
//! missing storage directory, a configuration typo) and what `--help` lists.

use super::*;

/// A server process run to its exit (or killed after `limit`): what a newcomer sees when it
/// refuses to start.
fn server_run(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Out {
    let dir = tmpdir("cli-server-run");
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let mut cmd = Command::new(cairn_bin());
    cmd.args(args)
        .env("HOME", &dir)
        .env_remove("CAIRN_DEV_LISTEN_ADDRESS")
        .env_remove("CAIRN_LOG")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(std::fs::File::create(&err).expect("stderr file"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = KillOnDrop(cmd.spawn().expect("spawn cairn server"));
    let deadline = Instant::now() + limit;
    let code = loop {
        if let Some(st) = child.try_wait().expect("wait cairn") {
            break st.code().unwrap_or(-1);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break -9;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Out {
        code,
        stdout: std::fs::read_to_string(out).unwrap_or_default(),
        stderr: std::fs::read_to_string(err).unwrap_or_default(),
    }
}

/// A configuration file in a fresh directory: storage at `db` (relative to the directory),
/// the API on `port`, the cluster on `port + 1`, then `extra` lines in the listener block.
fn config_file(db: &str, port: u16, extra: &str) -> (TempDir, PathBuf) {
    let dir = tmpdir("cli-config");
    let text = format!(
        "storage \"sqlite\" {{ path = \"{}\" }}\n\
         listener \"tcp\" {{\n  address         = \"127.0.0.1:{port}\"\n  \
         cluster_address = \"127.0.0.1:{}\"\n{extra}  tls_disable     = true\n}}\n",
        dir.join(db).display(),
        port + 1
    );
    let file = dir.join("cairn.hcl");
    std::fs::write(&file, text).expect("write config");
    (dir, file)
}

#[test]
fn a_missing_token_says_how_to_get_one() {
    let s = Server::dev();
    let o = User::new(&s, None).run(&["read", "secret/x"]);
    assert_eq!(o.code, 2, "{o:?}");
    assert!(
        o.stderr
            .contains("no token: set CAIRN_TOKEN or run `cairn login`"),
        "{o:?}"
    );
    // With a token that may not read there, the hint would be wrong: it is not given.
    let o = User::new(&s, Some("not-a-token")).run(&["read", "secret/x"]);
    assert_eq!(o.code, 2, "{o:?}");
    assert!(!o.stderr.contains("no token"), "{o:?}");
}

#[test]
fn a_busy_port_is_named_with_the_setting_that_moves_it() {
    let limit = Duration::from_secs(20);
    // The dev server's API port.
    let port = free_port_pair();
    let taken = std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind");
    let addr = format!("127.0.0.1:{port}");
    let o = server_run(
        &["server", "--dev", "--dev-listen-address", &addr],
        &[],
        limit,
    );
    assert_eq!(o.code, 1, "{o:?}");
    assert!(
        o.stderr.contains(&format!(
            "cannot listen on {addr} (the API address): port {port} is already in use"
        )),
        "{o:?}"
    );
    assert!(o.stderr.contains("--dev-listen-address"), "{o:?}");
    // The same through the environment variable.
    let o = server_run(
        &["server", "--dev"],
        &[("CAIRN_DEV_LISTEN_ADDRESS", &addr)],
        limit,
    );
    assert_eq!(o.code, 1, "{o:?}");
    assert!(
        o.stderr.contains(&format!("port {port} is already in use")),
        "{o:?}"
    );
    drop(taken);

    // The dev server's cluster port (the API port + 1).
    let port = free_port_pair();
    let taken = std::net::TcpListener::bind(("127.0.0.1", port + 1)).expect("bind");
    let o = server_run(
        &[
            "server",
            "--dev",
            "--dev-listen-address",
            &format!("127.0.0.1:{port}"),
        ],
        &[],
        limit,
    );
    assert_eq!(o.code, 1, "{o:?}");
    assert!(
        o.stderr.contains(&format!(
            "cannot listen on 127.0.0.1:{} (the cluster address): port {} is already in use",
            port + 1,
            port + 1
        )),
        "{o:?}"
    );
    assert!(o.stderr.contains("--dev-listen-address"), "{o:?}");
    drop(taken);

    // A configuration file: the key and its line.
    let port = free_port_pair();
    let taken = std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind");
    let (_dir, file) = config_file("cairn.db", port, "");
    let o = server_run(&["server", "--config", &file.to_string_lossy()], &[], limit);
    assert_eq!(o.code, 1, "{o:?}");
    assert!(
        o.stderr.contains(&format!("port {port} is already in use")),
        "{o:?}"
    );
    assert!(
        o.stderr.contains(&format!(
            "change `address` in the listener \"tcp\" block ({}:3)",
            file.display()
        )),
        "{o:?}"
    );
    drop(taken);
    let port = free_port_pair();
    let taken = std::net::TcpListener::bind(("127.0.0.1", port + 1)).expect("bind");
    let (_dir, file) = config_file("cairn.db", port, "");
    let o = server_run(&["server", "--config", &file.to_string_lossy()], &[], limit);
    assert_eq!(o.code, 1, "{o:?}");
    assert!(
        o.stderr.contains(&format!(
            "change `cluster_address` in the listener \"tcp\" block ({}:4)",
            file.display()
        )),
        "{o:?}"
    );
    drop(taken);
}

#[test]
fn a_missing_storage_directory_is_created_one_level_deep_and_named_otherwise() {
    let limit = Duration::from_secs(20);
    // Two levels missing: refused, with the path and what to do.
    let port = free_port_pair();
    let (dir, file) = config_file("absent/data/cairn.db", port, "");
    let o = server_run(&["server", "--config", &file.to_string_lossy()], &[], limit);
    assert_eq!(o.code, 1, "{o:?}");
    let missing = dir.join("absent/data");
    for want in [
        format!("the storage directory {} does not exist", missing.display()),
        format!("mkdir -p {}", missing.display()),
        format!(
            "change `path` in the storage \"sqlite\" block ({}:1)",
            file.display()
        ),
    ] {
        assert!(o.stderr.contains(&want), "{want}: {o:?}");
    }
    assert!(!dir.join("absent").exists(), "nothing was created");

    // One level missing: created (0700), said in the log, and the server starts.
    let (dir, file) = config_file("data/cairn.db", port, "");
    // Killed when dropped, also if an assertion below fails.
    let mut child = KillOnDrop(
        Command::new(cairn_bin())
            .args(["server", "--config", &file.to_string_lossy()])
            .env_remove("CAIRN_LOG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("server.log")).expect("log"))
            .spawn()
            .expect("spawn cairn"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let log = loop {
        let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
        if log.contains("API listening") || Instant::now() > deadline {
            break log;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("the server exited ({st}): {log}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    let data = dir.join("data");
    assert!(
        log.contains(&format!(
            "created the storage directory {} (it did not exist; its parent did)",
            data.display()
        )),
        "{log}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&data)
        .expect("data dir")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    assert!(data.join("cairn.db").exists());
}

#[test]
fn a_config_typo_names_the_file_the_line_and_the_closest_key() {
    let port = free_port_pair();
    let (_dir, file) = config_file("cairn.db", port, "  cluster_adress  = \"127.0.0.1:1\"\n");
    let o = server_run(
        &["server", "--config", &file.to_string_lossy()],
        &[],
        Duration::from_secs(20),
    );
    assert_eq!(o.code, 1, "{o:?}");
    assert_eq!(
        o.stderr.trim_end(),
        format!(
            "Error: {}:5: unknown key `cluster_adress` in the listener \"tcp\" block (did you \
             mean `cluster_address`?)",
            file.display()
        ),
        "{o:?}"
    );
}

/// `cairn --help` lists every environment variable the binary reads: those its sources read
/// (`env::var("X")`, `env::var_os("X")`, clap's `env = "X"`) and those its libraries read.
#[test]
fn help_lists_the_environment_variables_it_reads() {
    let o = Command::new(cairn_bin())
        .arg("--help")
        .output()
        .expect("run cairn --help");
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout).into_owned();
    let env_section = help
        .split_once("Environment:\n")
        .map(|(_, s)| s)
        .unwrap_or_else(|| panic!("no Environment section: {help}"));
    let listed: Vec<&str> = env_section
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let mut read = vec!["TMPDIR", "SSL_CERT_FILE", "SSL_CERT_DIR"];
    let mut sources = Vec::new();
    let mut dirs = vec![cairn_tests::repo_root().join("shell/src")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("read shell/src").flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                sources.push(std::fs::read_to_string(&p).expect("read source"));
            }
        }
    }
    let mut found = Vec::new();
    for text in &sources {
        for pat in ["env::var(\"", "env::var_os(\"", "env = \""] {
            for (i, _) in text.match_indices(pat) {
                let rest = &text[i + pat.len()..];
                if let Some(end) = rest.find('"') {
                    found.push(rest[..end].to_string());
                }
            }
        }
    }
    for n in ["CAIRN_ADDR", "CAIRN_TOKEN", "CAIRN_LOG", "HOME"] {
        assert!(found.iter().any(|f| f == n), "the scan missed {n}");
    }
    read.extend(found.iter().map(String::as_str));
    for name in read {
        assert!(
            listed.contains(&name),
            "`cairn --help` does not list {name}:\n{env_section}"
        );
    }
}
