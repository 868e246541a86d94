//! The README walkthroughs, run as they are written: the ```sh blocks preceded by
//! `<!-- walkthrough: NAME ... -->` are concatenated per NAME and run with
//! `bash -euo pipefail` against the real `cairn` binary, with the `DIR`, `P1` and `P2` the
//! README asks the reader to pick. So the documented commands cannot rot.

use cairn_tests::{cairn_bin, free_port_pair, log_dir, note_secret, repo_root, tmpdir};
use serde_json::Value;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The ```sh blocks of README.md marked for `name`, in order.
fn walkthrough(name: &str) -> String {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("read README.md");
    let mut lines = readme.lines();
    let mut script = String::new();
    let mut blocks = 0;
    while let Some(line) = lines.next() {
        let Some(names) = line
            .trim()
            .strip_prefix("<!-- walkthrough:")
            .and_then(|r| r.strip_suffix("-->"))
        else {
            continue;
        };
        if !names.split_whitespace().any(|n| n == name) {
            continue;
        }
        assert_eq!(
            lines.next().map(str::trim),
            Some("```sh"),
            "a walkthrough marker must be followed by a ```sh block"
        );
        for l in lines.by_ref().take_while(|l| l.trim() != "```") {
            script.push_str(l);
            script.push('\n');
        }
        blocks += 1;
    }
    assert!(blocks >= 2, "README.md has no walkthrough {name:?}");
    script
}

/// A free API/cluster port pair not handed out before in this process.
fn port() -> u16 {
    static USED: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut used = USED.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let p = free_port_pair();
        if !used.iter().any(|u| u.abs_diff(p) <= 1) {
            used.push(p);
            return p;
        }
    }
}

/// Variables of the walkthroughs that hold secrets, recorded (on any exit) for
/// `scripts/check-secrets.sh`.
const SECRET_VARS: &[&str] = &["CAIRN_TOKEN", "OTP", "ENCODED", "DR_TOKEN", "ACTIVATION"];

struct Run {
    code: i32,
    output: String,
}

/// Runs walkthrough `name` in a fresh directory; returns its exit code and its output
/// (stdout and stderr interleaved).
fn run(name: &str) -> Run {
    let dir = tmpdir(&format!("readme-{name}"));
    let bin = cairn_bin();
    let path = format!(
        "{}:{}",
        bin.parent().expect("bin dir").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let secrets = dir.join("secrets.out");
    // On any exit: write the secret variables out, and stop the servers the walkthrough
    // started (it records their pids in $DIR/*/pid).
    let prelude = format!(
        "trap 'for v in {vars}; do printf \"%s\\n\" \"${{!v:-}}\"; done > {secrets}; \
         kill -9 $(cat \"$DIR\"/*/pid 2>/dev/null) 2>/dev/null || true' EXIT\n",
        vars = SECRET_VARS.join(" "),
        secrets = secrets.display()
    );
    let script = dir.join("walkthrough.sh");
    std::fs::write(&script, format!("{prelude}{}", walkthrough(name))).expect("write script");
    let out_path = dir.join("output.txt");
    let out = std::fs::File::create(&out_path).expect("create output");
    let mut child = Command::new("bash")
        .arg("-euo")
        .arg("pipefail")
        .arg(&script)
        .current_dir(&dir)
        .env("PATH", path)
        .env("HOME", &dir)
        .env("DIR", &dir)
        .env("P1", port().to_string())
        .env("P2", port().to_string())
        .env_remove("CAIRN_ADDR")
        .env_remove("CAIRN_TOKEN")
        .env_remove("CAIRN_FORMAT")
        .env_remove("CAIRN_NAMESPACE")
        .stdin(Stdio::null())
        .stdout(Stdio::from(out.try_clone().expect("dup output")))
        .stderr(Stdio::from(out))
        .process_group(0)
        .spawn()
        .expect("spawn bash");
    let deadline = Instant::now() + Duration::from_secs(240);
    let code = loop {
        if let Some(st) = child.try_wait().expect("wait bash") {
            break st.code().unwrap_or(-1);
        }
        if Instant::now() > deadline {
            break -2;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // Whatever is left in the walkthrough's process group (servers after a failure).
    let _ = Command::new("kill")
        .args(["-9", "--", &format!("-{}", child.id())])
        .stderr(Stdio::null())
        .status();
    let _ = child.wait();
    record_secrets(&dir, &secrets);
    collect_logs(name, &dir);
    Run {
        code,
        output: std::fs::read_to_string(&out_path).unwrap_or_default(),
    }
}

/// Records the shares and root tokens of `$DIR/*/init.json` and the secret variables.
fn record_secrets(dir: &Path, secrets: &Path) {
    for e in std::fs::read_dir(dir).expect("read dir").flatten() {
        let Ok(text) = std::fs::read_to_string(e.path().join("init.json")) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        note_secret(v["root_token"].as_str().unwrap_or_default());
        for k in ["unseal_keys_b64", "unseal_keys_hex"] {
            for s in v[k].as_array().into_iter().flatten() {
                note_secret(s.as_str().unwrap_or_default());
            }
        }
    }
    for l in std::fs::read_to_string(secrets).unwrap_or_default().lines() {
        note_secret(l.trim());
    }
}

/// Copies the servers' logs (`$DIR/NAME/server.log`) into the harness log directory.
fn collect_logs(name: &str, dir: &Path) {
    for e in std::fs::read_dir(dir).expect("read dir").flatten() {
        let log = e.path().join("server.log");
        if log.exists() {
            let to = log_dir().join(format!(
                "readme-{name}-{}-{}.log",
                e.file_name().to_string_lossy(),
                std::process::id()
            ));
            let _ = std::fs::copy(&log, to);
        }
    }
}

/// The table row starting with `mode` whose columns include all of `cols`.
fn has_row(out: &str, mode: &str, cols: &[&str]) -> bool {
    out.lines().any(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        words.first() == Some(&mode) && cols.iter().all(|c| words.contains(c))
    })
}

#[test]
fn readme_replicate_two_clusters_on_one_machine() {
    let r = run("replicate");
    let out = &r.output;
    assert_eq!(r.code, 0, "the walkthrough failed:\n{out}");
    // The secondary returns the value written on the primary.
    assert!(out.lines().any(|l| l == "world"), "{out}");
    // Status on the secondary, then on the primary.
    assert!(
        has_row(out, "performance", &["secondary", "stream-wals", "ready"]),
        "{out}"
    );
    assert!(
        has_row(out, "performance", &["primary", "running"]),
        "{out}"
    );
    assert!(
        has_row(out, "performance", &["secondary", "west", "connected"]),
        "{out}"
    );
}

#[test]
fn readme_dr_failover_runbook() {
    let r = run("dr");
    let out = &r.output;
    assert_eq!(r.code, 0, "the walkthrough failed:\n{out}");
    // The DR operation token was generated from the primary's shares and accepted.
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().eq(["Progress", "1/2"])),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("Merkle check") && l.ends_with("clean")),
        "{out}"
    );
    // After the promotion the survivor is the DR primary and holds the primary's data,
    // readable with the primary's root token.
    assert!(has_row(out, "dr", &["primary", "running"]), "{out}");
    assert_eq!(out.lines().last(), Some("2026-11"), "{out}");
}
