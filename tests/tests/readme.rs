//! The README walkthroughs, run as they are written: the ```sh blocks preceded by
//! `<!-- walkthrough: NAME ... -->` are concatenated per NAME and run with
//! `bash -euo pipefail` against the real `cairn` binary, with the `DIR`, `P1` and `P2` the
//! README asks the reader to pick. So the documented commands cannot rot.
//!
//! The opening sections (`first-steps`) are what a newcomer pastes into a second terminal of a
//! fresh clone while the README's first line (`cargo run ... -- server --dev`) runs in the
//! first: the test starts that line's server itself (the same arguments, from the binary it
//! built, in the background), runs the blocks in a directory that looks like the clone
//! (`scripts/` and `target/release/cairn`), and moves the README's ports (8200, 8400, 8401)
//! to free ones.
//!
//! The cluster walkthrough (`ha`) also runs in a directory with the clone's `scripts/` (it
//! starts `scripts/dev-postgres.sh`) and gets a third port pair, `P3`.

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

/// The README's `## ` sections up to (not including) the first replication walkthrough: the
/// opening sections a newcomer meets first.
fn opening_sections() -> String {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("read README.md");
    let end = readme
        .find("\n## Replicate two clusters")
        .expect("README.md has a section \"Replicate two clusters\"");
    readme[..end].to_string()
}

/// The first line of the README's first ```sh block (`cargo run -p cairn --release --
/// server --dev`): the arguments it gives the binary.
fn fresh_machine_server_args() -> Vec<String> {
    let readme = opening_sections();
    let line = readme
        .lines()
        .skip_while(|l| l.trim() != "```sh")
        .nth(1)
        .expect("README.md has a ```sh block");
    let command = line.split('#').next().unwrap_or_default().trim();
    let args = command
        .strip_prefix("cargo run -p cairn --release --")
        .unwrap_or_else(|| {
            panic!(
                "the README's first command is not `cargo run -p cairn --release -- ...`: {line}"
            )
        });
    args.split_whitespace().map(str::to_string).collect()
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
const SECRET_VARS: &[&str] = &[
    "CAIRN_TOKEN",
    "OTP",
    "ENCODED",
    "DR_TOKEN",
    "ACTIVATION",
    "KEY",
    "CAIRN_PG_PASSWORD",
];

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
    let (p1, p2, p3) = (port(), port(), port());
    let secrets = dir.join("secrets.out");
    // On any exit: write the secret variables out, and stop the servers the walkthrough
    // started (it records their pids in $DIR/*/pid) and the sample directory.
    let mut prelude = format!(
        "trap 'for v in {vars}; do printf \"%s\\n\" \"${{!v:-}}\"; done > {secrets}; \
         kill -9 $(cat \"$DIR\"/*/pid 2>/dev/null) 2>/dev/null || true; \
         [ ! -d \"$DIR/cairn-dev-ldap\" ] || \"$DIR/scripts/dev-ldap.sh\" stop > /dev/null 2>&1 || true; \
         [ ! -d \"$DIR/cairn-dev-ad\" ] || \"$DIR/scripts/dev-ad.sh\" stop > /dev/null 2>&1 || true; \
         [ ! -d \"$DIR/cairn-dev-postgres\" ] || \"$DIR/scripts/dev-postgres.sh\" stop > /dev/null 2>&1 || true' EXIT\n",
        vars = SECRET_VARS.join(" "),
        secrets = secrets.display()
    );
    let mut text = walkthrough(name);
    if name == FIRST_STEPS || name == ACTIVE_DIRECTORY {
        // The clone: the scripts, and the binary where `cargo run --release` puts it.
        std::os::unix::fs::symlink(repo_root().join("scripts"), dir.join("scripts"))
            .expect("link scripts");
        std::fs::create_dir_all(dir.join("target/release")).expect("mkdir target/release");
        std::os::unix::fs::symlink(&bin, dir.join("target/release/cairn")).expect("link cairn");
        // The README's first line, in the background: the dev server the sections use.
        prelude.push_str(&format!(
            "mkdir -p \"$DIR/dev\"\n\
             CAIRN_DEV_LISTEN_ADDRESS=127.0.0.1:{p1} target/release/cairn {args} \
             > \"$DIR/dev/stdout.txt\" 2> \"$DIR/dev/server.log\" &\n\
             echo $! > \"$DIR/dev/pid\"\n",
            args = fresh_machine_server_args().join(" ")
        ));
        text = move_ports(&text, name, p1, p2);
    } else if name == HA_CLUSTER {
        // The clone's scripts (dev-postgres.sh); the database goes to $TMPDIR, i.e. $DIR.
        std::os::unix::fs::symlink(repo_root().join("scripts"), dir.join("scripts"))
            .expect("link scripts");
    }
    let script = dir.join("walkthrough.sh");
    std::fs::write(&script, format!("{prelude}{text}")).expect("write script");
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
        .env("TMPDIR", &dir)
        .env("P1", p1.to_string())
        .env("P2", p2.to_string())
        .env("P3", p3.to_string())
        // A sample directory that fails the walkthrough half-way stops with this process.
        .env("CAIRN_LDAP_WATCH_PID", std::process::id().to_string())
        .env("CAIRN_AD_WATCH_PID", std::process::id().to_string())
        .env("CAIRN_PG_WATCH_PID", std::process::id().to_string())
        .env_remove("CAIRN_LDAP_DIR")
        .env_remove("CAIRN_AD_DIR")
        .env_remove("CAIRN_PG_DIR")
        .env_remove("CAIRN_DEV_LISTEN_ADDRESS")
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

/// The opening sections' walkthrough.
const FIRST_STEPS: &str = "first-steps";
/// "Log in against Active Directory": like the opening sections, pasted into a second
/// terminal while the README's first line runs the dev server.
const ACTIVE_DIRECTORY: &str = "ad";
/// "Run a three-node cluster on PostgreSQL": three servers on the database of
/// `scripts/dev-postgres.sh`, with the set-up lines' `DIR`, `P1`, `P2`, `P3`.
const HA_CLUSTER: &str = "ha";

/// The README's ports moved to free ones: the dev server's API port 8200 to `p1`, the
/// configuration file's 8400 and 8401 (opening sections) to `p2` and `p2 + 1`. No other
/// well-known port may remain (the test must not touch a server the developer runs).
fn move_ports(text: &str, name: &str, p1: u16, p2: u16) -> String {
    let expected: &[&str] = if name == FIRST_STEPS {
        &["127.0.0.1:8200", "127.0.0.1:8400", "127.0.0.1:8401"]
    } else {
        &["127.0.0.1:8200"]
    };
    for p in expected {
        assert!(
            text.contains(p),
            "walkthrough {name} no longer uses {p}: update the test"
        );
    }
    let moved = text
        .replace("127.0.0.1:8200", &format!("127.0.0.1:{p1}"))
        .replace("127.0.0.1:8400", &format!("127.0.0.1:{p2}"))
        .replace("127.0.0.1:8401", &format!("127.0.0.1:{}", p2 + 1));
    for p in ["8200", "8201", "8400", "8401"] {
        assert!(
            !moved.contains(&format!(":{p}")),
            "port {p} left in walkthrough {name}'s blocks: teach move_ports about it"
        );
    }
    moved
}

/// The values after `prefix` on the lines of `file` (secrets a command printed).
fn values_after(file: &Path, prefix: &str) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .map(|v| v.trim().to_string())
        .collect()
}

/// Records the shares and root tokens of `$DIR/*/init.json` and `$DIR/*/init.txt`, the dev
/// server's (its output and the token file it wrote) and the secret variables.
fn record_secrets(dir: &Path, secrets: &Path) {
    for f in ["Unseal Key: ", "Root Token: "] {
        for v in values_after(&dir.join("dev/stdout.txt"), f) {
            note_secret(&v);
        }
    }
    note_secret(
        std::fs::read_to_string(dir.join(".cairn-token"))
            .unwrap_or_default()
            .trim(),
    );
    for e in std::fs::read_dir(dir).expect("read dir").flatten() {
        for f in ["Unseal Key 1: ", "Initial Root Token: "] {
            for v in values_after(&e.path().join("init.txt"), f) {
                note_secret(&v);
            }
        }
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

/// The opening sections, pasted in order into a second terminal while the README's first
/// line runs the dev server: every command works and prints what it did.
#[test]
fn readme_first_steps_run_as_pasted() {
    let r = run(FIRST_STEPS);
    let out = &r.output;
    assert_eq!(r.code, 0, "the walkthrough failed:\n{out}");
    let has = |s: &str| out.contains(s);
    // Try it: written, read back with the CLI and over HTTP with the stored root token.
    assert!(has("Success! Data written to: secret/hello"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().eq(["who", "world"])),
        "{out}"
    );
    assert!(has(r#""data":{"who":"world"}"#), "{out}");
    // A login: the directory says what it exported, the config is written, alice logs in.
    assert!(has("dev-ldap: exported ") && has("CAIRN_LDAP_URL"), "{out}");
    assert!(has("Success! Data written to: auth/ldap/config"), "{out}");
    assert!(
        has("Success! You are now authenticated. The token was not stored (-no-store)."),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().eq(["token_meta_username", "alice"])),
        "{out}"
    );
    // A configuration file: the storage directory was created and said so; init, unseal.
    assert!(has("created the storage directory "), "{out}");
    assert!(
        has("==> Cairn server started. API: http://127.0.0.1:"),
        "{out}"
    );
    assert!(has("Unseal Key 1: "), "{out}");
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().eq(["Sealed", "false"])),
        "{out}"
    );
    // The clean-up says what it stopped.
    assert!(has("stopped the server of "), "{out}");
    assert!(has("dev-ldap: stopped the directory in "), "{out}");
}

/// Every shell block of the opening sections is run by [`readme_first_steps_run_as_pasted`],
/// except the first (the dev server that test starts itself, and the whole test suite).
#[test]
fn readme_opening_sections_have_no_unrun_shell_block() {
    let text = opening_sections();
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = 0;
    for (i, l) in lines.iter().enumerate() {
        if l.trim() != "```sh" {
            continue;
        }
        blocks += 1;
        if blocks == 1 {
            continue;
        }
        let marker = i
            .checked_sub(1)
            .map(|j| lines[j].trim())
            .unwrap_or_default();
        assert_eq!(
            marker,
            format!("<!-- walkthrough: {FIRST_STEPS} -->"),
            "README.md line {}: a shell block of the opening sections the test does not run",
            i + 1
        );
    }
    assert!(blocks >= 4, "{blocks} shell blocks in the opening sections");
    assert!(
        !text.contains("$(...)") && !text.contains("FIRST_BUILD_FIGURES"),
        "a placeholder in the opening sections"
    );
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

/// "Back up and restore": a snapshot saved, a bad change undone by restoring it, a damaged
/// copy refused with the data left as it was.
#[test]
fn readme_backup_and_restore() {
    let r = run("backup");
    let out = &r.output;
    assert_eq!(r.code, 0, "the walkthrough failed:\n{out}");
    assert!(out.contains("Success! Snapshot saved to "), "{out}");
    assert!(out.contains("Success! Snapshot restored from "), "{out}");
    assert!(
        out.contains("secret/other is gone: it was written after the snapshot"),
        "{out}"
    );
    assert!(out.contains("the file is truncated (100 of "), "{out}");
    assert!(out.contains("refused; nothing was changed"), "{out}");
    let lines: Vec<&str> = out.lines().filter(|l| l.trim() == "first").collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(!out.contains("oops"), "{out}");
}

/// "Log in against Active Directory", pasted while the dev server runs: the DC starts, the
/// config an AD admin writes is taken, alice logs in with her UPN and gets the policies of
/// her group and of the group it is nested in; disabled carol is refused; the DC stops.
/// Needs root (the DC's loopback address), like `tests/tests/ad.rs`.
#[test]
fn readme_active_directory_login() {
    let r = run(ACTIVE_DIRECTORY);
    let out = &r.output;
    assert_eq!(r.code, 0, "the walkthrough failed:\n{out}");
    let has = |s: &str| out.contains(s);
    assert!(has("the DC answers at ldaps://127.0.0."), "{out}");
    assert!(has("Success! Data written to: auth/ldap/config"), "{out}");
    assert!(
        has("Success! You are now authenticated. The token was not stored (-no-store)."),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l
            .split_whitespace()
            .eq(["token_meta_username", "alice@cairn.test"])),
        "{out}"
    );
    assert!(
        out.lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.first() == Some(&"token_policies") && l.contains("eng") && l.contains("staff")
        }),
        "no token_policies line with eng and staff:\n{out}"
    );
    assert!(
        has("failed to bind as user") && has("carol is refused"),
        "{out}"
    );
    assert!(has("dev-ad: stopped the DC in "), "{out}");
}

/// "Run a three-node cluster on PostgreSQL": three nodes on one database, one active; a write
/// through a standby is read through the other; after a kill -9 of the active another node
/// takes over with the data; step-down hands the lease on again.
#[test]
fn readme_ha_cluster_on_postgresql() {
    let r = run(HA_CLUSTER);
    let out = &r.output;
    assert_eq!(r.code, 0, "the walkthrough failed:\n{out}");
    println!("{out}");
    let has = |s: &str| out.contains(s);
    let words = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    // All three unsealed; one active, two standbys.
    assert_eq!(
        out.lines()
            .filter(|l| l.split_whitespace().eq(["Sealed", "false"]))
            .count(),
        3,
        "{out}"
    );
    let first = out
        .lines()
        .find_map(|l| l.strip_prefix("active: "))
        .unwrap_or_else(|| panic!("no `active: ` line:\n{out}"));
    let first: Vec<&str> = first.split([',', ' ']).filter(|w| !w.is_empty()).collect();
    assert_eq!(first.len(), 4, "{out}");
    assert_eq!(first[1], "standbys:", "{out}");
    let active = first[0];
    // sys/leader through a standby names the active node; sys/ha-status lists three nodes.
    assert!(
        out.lines().any(|l| words(l) == ["is_self", "false"]),
        "{out}"
    );
    assert!(
        out.lines().any(|l| {
            let w = words(l);
            w.len() == 2 && w[0] == "leader_address" && w[1].starts_with("http://127.0.0.1:")
        }),
        "{out}"
    );
    assert_eq!(out.matches("\"hostname\"").count(), 3, "{out}");
    assert_eq!(out.matches("\"active_node\": true").count(), 1, "{out}");
    // Written through one standby, read through the other; after the kill on both
    // survivors; after the step-down through the node that stepped down.
    assert!(
        has("Success! Enabled the kv secrets engine at: secret/"),
        "{out}"
    );
    assert!(has("Success! Data written to: secret/hello"), "{out}");
    assert_eq!(out.lines().filter(|l| *l == "world").count(), 4, "{out}");
    // Another node took over after the kill -9, within the lease's time.
    let (new_active, ms, killed) = out
        .lines()
        .find_map(|l| {
            let w = words(l);
            (w.len() == 10 && w[1] == "is" && w[2] == "active," && w[4] == "ms")
                .then(|| (w[0].clone(), w[3].parse::<u64>().ok(), w[9].clone()))
        })
        .unwrap_or_else(|| panic!("no take-over line:\n{out}"));
    assert_eq!(killed, active, "{out}");
    assert_ne!(new_active, killed, "{out}");
    let ms = ms.unwrap_or_else(|| panic!("no take-over time:\n{out}"));
    assert!(ms < 10_000, "the take-over took {ms} ms:\n{out}");
    // Step-down: the lease went to the third node.
    assert!(has("Success! Data written to: sys/step-down"), "{out}");
    let stepped = out
        .lines()
        .find_map(|l| {
            let w = words(l);
            (w.len() == 6 && w[1] == "stepped" && w[4] == "is")
                .then(|| (w[0].clone(), w[3].clone()))
        })
        .unwrap_or_else(|| panic!("no step-down line:\n{out}"));
    assert_eq!(stepped.0, new_active, "{out}");
    assert!(stepped.1 != killed && stepped.1 != new_active, "{out}");
}
