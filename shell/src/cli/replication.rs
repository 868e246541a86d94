//! `replication status`: reads `sys/replication/status` (or the DR / performance view) and
//! shows each mode's role, state and WAL positions, then one row per peer with its
//! connection status, heartbeat, `last_remote_wal` and lag. A server without the endpoint is
//! reported plainly rather than as a crash.
//!
//! `replication reindex` and `replication merkle-check` run those operations (on a DR
//! secondary with `-dr-token`); while a reindex runs, a progress bar on stderr follows the
//! status's `reindex_building_progress` / `reindex_building_total`. `replication wait` waits
//! on a secondary until it streams WALs, with a progress bar from `sync_progress` /
//! `sync_total_keys` during a Merkle sync.

use super::output::{cell, table};
use super::{print_json, CliError, Client, CmdResult, Common, Ctx, Format};
use clap::Subcommand;
use serde_json::Value;

#[derive(Subcommand, Debug)]
pub enum ReplicationCmd {
    /// Show replication status as tables (role, state, WALs, peers).
    Status(StatusArgs),
    /// Rebuild the Merkle trees from storage, with a progress bar.
    Reindex(ReindexArgs),
    /// Check the persisted Merkle trees against the stored data.
    MerkleCheck(CheckArgs),
    /// On a secondary: wait until it streams WALs, with a progress bar during a Merkle sync.
    Wait(WaitArgs),
}

#[derive(clap::Args, Debug)]
pub struct WaitArgs {
    /// Which replication: dr or performance.
    #[arg(long, default_value = "performance")]
    pub mode: String,
    /// Give up after this many seconds (exit 2).
    #[arg(long = "wait-timeout", default_value_t = 600)]
    pub wait_timeout: u64,
    /// No progress bar.
    #[arg(long = "no-progress")]
    pub no_progress: bool,
    #[command(flatten)]
    pub common: Common,
}

#[derive(clap::Args, Debug)]
pub struct ReindexArgs {
    /// Key-level diagnosis of what disagrees (slower).
    #[arg(long)]
    pub diff: bool,
    /// Rewrite every tree record, not only those that differ.
    #[arg(long)]
    pub force: bool,
    /// Write the tree records in the background after answering.
    #[arg(long = "skip-flush")]
    pub skip_flush: bool,
    /// DR operation token: run on a DR secondary (sys/replication/dr/secondary/reindex).
    #[arg(
        long = "dr-token",
        env = "CAIRN_DR_OPERATION_TOKEN",
        hide_env_values = true
    )]
    pub dr_token: Option<String>,
    /// No progress bar.
    #[arg(long = "no-progress")]
    pub no_progress: bool,
    #[command(flatten)]
    pub common: Common,
}

#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// DR operation token: run on a DR secondary (sys/replication/dr/secondary/merkle-check).
    #[arg(
        long = "dr-token",
        env = "CAIRN_DR_OPERATION_TOKEN",
        hide_env_values = true
    )]
    pub dr_token: Option<String>,
    #[command(flatten)]
    pub common: Common,
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Which view: all (default), dr or performance.
    #[arg(long, default_value = "all")]
    pub mode: String,
    #[command(flatten)]
    pub common: Common,
}

pub fn run(cmd: ReplicationCmd) -> CmdResult {
    match cmd {
        ReplicationCmd::Status(a) => status(a),
        ReplicationCmd::Reindex(a) => reindex(a),
        ReplicationCmd::MerkleCheck(a) => merkle_check(a),
        ReplicationCmd::Wait(a) => wait(a),
    }
}

fn wait(a: WaitArgs) -> CmdResult {
    let mode = match a.mode.as_str() {
        "dr" => "dr",
        "performance" | "perf" => "performance",
        m => {
            return Err(CliError::Local(format!(
                "-mode={m:?}: expected dr or performance"
            )))
        }
    };
    let c = Client::new(&a.common)?;
    let path = format!("sys/replication/{mode}/status");
    let show = !a.no_progress;
    let start = std::time::Instant::now();
    let mut drawn = false;
    loop {
        let r = c
            .call("GET", &path, None)
            .ctx(|| "reading replication status".into())?;
        let d = &r.body["data"];
        if d["mode"] != "secondary" {
            if drawn {
                eprintln!();
            }
            eprintln!(
                "This cluster is not a {mode} secondary (mode {}).",
                cell(&d["mode"])
            );
            return Ok(2);
        }
        let state = d["state"].as_str().unwrap_or("");
        if state == "stream-wals" {
            if drawn {
                eprintln!();
            }
            println!(
                "{mode} secondary is streaming WALs (last_remote_wal {}).",
                cell(&d["last_remote_wal"])
            );
            return Ok(0);
        }
        if show {
            let done = d["sync_progress"].as_u64().unwrap_or(0);
            let total = d["sync_total_keys"].as_u64().unwrap_or(0);
            let line = if total > 0 {
                bar_line(state, done, total)
            } else {
                format!("{state:>12} ...")
            };
            eprint!("\r{line}");
            drawn = true;
        }
        if start.elapsed().as_secs() >= a.wait_timeout {
            if drawn {
                eprintln!();
            }
            eprintln!(
                "Timed out after {} s; the secondary is in state {state:?}{}.",
                a.wait_timeout,
                d["last_error"]
                    .as_str()
                    .map(|e| format!(" (last error: {e})"))
                    .unwrap_or_default()
            );
            return Ok(2);
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// `stage [#####-----]  42% done/total keys`.
fn bar_line(stage: &str, done: u64, total: u64) -> String {
    let total = total.max(1);
    let frac = (done as f64 / total as f64).clamp(0.0, 1.0);
    let width = 30;
    let full = (frac * width as f64).round() as usize;
    format!(
        "{stage:>12} [{}{}] {:>3}% {done}/{total} keys",
        "#".repeat(full),
        "-".repeat(width - full),
        (frac * 100.0).round() as u32
    )
}

/// The path and body of a scan operation (`reindex` or `merkle-check`).
fn scan_call(op: &str, dr_token: Option<&str>, mut body: Value) -> (String, Value) {
    match dr_token {
        Some(t) => {
            body["dr_operation_token"] = Value::String(t.to_string());
            (format!("sys/replication/dr/secondary/{op}"), body)
        }
        None => (format!("sys/replication/{op}"), body),
    }
}

fn reindex(a: ReindexArgs) -> CmdResult {
    let (path, body) = scan_call(
        "reindex",
        a.dr_token.as_deref(),
        serde_json::json!({ "diff": a.diff, "force": a.force, "skip_flush": a.skip_flush }),
    );
    // The call answers when the reindex is done: no client timeout shorter than an hour.
    let mut long = a.common.clone();
    long.timeout = long.timeout.max(3600);
    let worker = Client::new(&long)?;
    let watcher = Client::new(&a.common)?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(worker.send("POST", &path, Some(&body)));
    });
    let show = !a.no_progress && a.common.format != Format::Json;
    let mut bar = Progress::default();
    let result = loop {
        match rx.recv_timeout(std::time::Duration::from_millis(250)) {
            Ok(r) => break r,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if show {
                    if let Ok(st) = watcher.send("GET", "sys/replication/status", None) {
                        bar.draw(&st.body);
                    }
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(CliError::Local(
                    "the reindex call ended without an answer".into(),
                ))
            }
        }
    };
    bar.finish();
    let r = result.ctx(|| "running the reindex".into())?;
    if r.status >= 400 {
        return Err(watcher.api_error("POST", "sys/replication/reindex", &r))
            .ctx(|| "running the reindex".into());
    }
    if a.common.format == Format::Json {
        print_json(&r.body);
        return Ok(0);
    }
    for w in r.body["warnings"].as_array().into_iter().flatten() {
        println!("{}", w.as_str().unwrap_or_default());
    }
    Ok(0)
}

/// A one-line progress bar on stderr (redrawn in place).
#[derive(Default)]
struct Progress {
    drawn: bool,
}

impl Progress {
    fn draw(&mut self, status: &Value) {
        let Some(m) = ["dr", "performance"]
            .iter()
            .map(|k| &status["data"][*k])
            .find(|m| m["reindex_stage"].is_string())
        else {
            return;
        };
        let done = m["reindex_building_progress"].as_u64().unwrap_or(0);
        let total = m["reindex_building_total"].as_u64().unwrap_or(0);
        let stage = m["reindex_stage"].as_str().unwrap_or("");
        eprint!("\r{}", bar_line(stage, done, total));
        self.drawn = true;
    }
    fn finish(&self) {
        if self.drawn {
            eprintln!();
        }
    }
}

fn merkle_check(a: CheckArgs) -> CmdResult {
    let (path, body) = scan_call("merkle-check", a.dr_token.as_deref(), serde_json::json!({}));
    let mut long = a.common.clone();
    long.timeout = long.timeout.max(3600);
    let c = Client::new(&long)?;
    let r = c
        .call("POST", &path, Some(&body))
        .ctx(|| "running the Merkle check".into())?;
    if a.common.format == Format::Json {
        print_json(&r.body);
        return Ok(0);
    }
    let rep = &r.body["data"]["merkle_corruption_report"];
    let corrupted = rep["corrupted_root"].as_bool().unwrap_or(false);
    println!(
        "Merkle check at {}: {}",
        rep["last_corruption_check_epoch"].as_str().unwrap_or(""),
        if corrupted {
            "CORRUPTION FOUND"
        } else {
            "clean"
        }
    );
    let mut rows: Vec<Vec<String>> = Vec::new();
    for (_, e) in rep["corrupted_tree_map"].as_object().into_iter().flatten() {
        let pages: Vec<String> = e["corrupted_index_tuples_map"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(p, f)| format!("{p} {}", f["subpages"]))
            .collect();
        rows.push(vec![
            cell(&e["tree_type"]),
            cell(&e["subtree"]),
            cell(&e["corrupted_subtree_root"]),
            pages.join(", "),
        ]);
    }
    if !rows.is_empty() {
        print!(
            "{}",
            table(
                &["tree", "subtree", "root corrupt", "pages (subpages)"],
                &rows
            )
        );
        println!("Run `cairn replication reindex` to rebuild the trees.");
    }
    Ok(if corrupted { 2 } else { 0 })
}

fn status(a: StatusArgs) -> CmdResult {
    let path = match a.mode.as_str() {
        "all" | "" => "sys/replication/status",
        "dr" => "sys/replication/dr/status",
        "performance" | "perf" => "sys/replication/performance/status",
        m => {
            return Err(CliError::Local(format!(
                "-mode={m:?}: expected all, dr or performance"
            )))
        }
    };
    let c = Client::new(&a.common)?;
    let r = c
        .send("GET", path, None)
        .ctx(|| "reading replication status".into())?;
    if matches!(r.status, 404 | 405 | 501) {
        let why = match c.api_error("GET", path, &r) {
            CliError::Api { errors, .. } if !errors.is_empty() => errors.join("; "),
            _ => String::new(),
        };
        eprintln!(
            "Replication status is not available from this server: {path} answered {}{}.",
            r.status,
            if why.is_empty() {
                String::new()
            } else {
                format!(" ({why})")
            }
        );
        return Ok(2);
    }
    if r.status >= 400 {
        return Err(c.api_error("GET", path, &r)).ctx(|| "reading replication status".into());
    }
    if a.common.format == Format::Json {
        print_json(&r.body);
        return Ok(0);
    }
    let views = views(&r.body, &a.mode);
    if views.is_empty() {
        eprintln!("The server answered without replication status fields.");
        return Ok(2);
    }
    print!("{}", render(&views));
    Ok(0)
}

/// The per-mode status objects in a response: `(mode name, status)`.
fn views(body: &Value, mode: &str) -> Vec<(String, Value)> {
    let data = match body.get("data") {
        Some(d) if d.is_object() => d,
        _ => body,
    };
    let mut out = Vec::new();
    for m in ["dr", "performance"] {
        if let Some(v) = data.get(m).filter(|v| v.is_object()) {
            out.push((m.to_string(), v.clone()));
        }
    }
    if out.is_empty() && data.get("mode").is_some() {
        let name = match mode {
            "dr" => "dr",
            "performance" | "perf" => "performance",
            _ => "replication",
        };
        out.push((name.to_string(), data.clone()));
    }
    out
}

fn opt(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) if s.is_empty() => "-".into(),
        other => cell(other),
    }
}

fn lag(last_wal: &Value, remote: &Value) -> String {
    match (last_wal.as_u64(), remote.as_u64()) {
        (Some(a), Some(b)) => a.saturating_sub(b).to_string(),
        _ => "-".into(),
    }
}

fn state(v: &Value) -> String {
    let mut s = opt(&v["state"]);
    if let (Some(p), Some(t)) = (v["sync_progress"].as_u64(), v["sync_total_keys"].as_u64()) {
        s = format!("{s} ({p}/{t} keys)");
    }
    s
}

/// The two tables: one row per mode, then one row per peer.
fn render(views: &[(String, Value)]) -> String {
    let mut modes = Vec::new();
    let mut peers = Vec::new();
    let mut notes = Vec::new();
    for (name, v) in views {
        if let Some(e) = v["last_error"].as_str().filter(|e| !e.is_empty()) {
            notes.push(format!("{name}: last error: {e}"));
        }
        let role = opt(&v["mode"]);
        let last_wal = &v["last_wal"];
        modes.push(vec![
            name.clone(),
            role.clone(),
            state(v),
            opt(&v["connection_state"]),
            opt(last_wal),
            opt(&v["last_remote_wal"]),
            opt(&v["cluster_id"]),
        ]);
        for s in v["secondaries"].as_array().into_iter().flatten() {
            let remote = &s["last_remote_wal"];
            peers.push(vec![
                name.clone(),
                "secondary".into(),
                opt(&s["node_id"]),
                opt(&s["api_address"]),
                opt(&s["connection_status"]),
                opt(&s["last_heartbeat"]),
                opt(remote),
                if s["lag"].is_null() {
                    lag(last_wal, remote)
                } else {
                    opt(&s["lag"])
                },
            ]);
        }
        for p in v["primaries"].as_array().into_iter().flatten() {
            let conn = if p["connection_status"].is_null() {
                &v["connection_state"]
            } else {
                &p["connection_status"]
            };
            let primary_wal = if p["last_wal"].is_null() {
                &v["primary_last_wal"]
            } else {
                &p["last_wal"]
            };
            peers.push(vec![
                name.clone(),
                "primary".into(),
                opt(&p["node_id"]),
                opt(&p["api_address"]),
                opt(conn),
                opt(&p["last_heartbeat"]),
                opt(&v["last_remote_wal"]),
                lag(primary_wal, &v["last_remote_wal"]),
            ]);
        }
    }
    let mut out = table(
        &[
            "Mode",
            "Role",
            "State",
            "Connection",
            "Last WAL",
            "Last Remote WAL",
            "Cluster ID",
        ],
        &modes,
    );
    out.push('\n');
    if !peers.is_empty() {
        out.push('\n');
        out.push_str(&table(
            &[
                "Mode",
                "Peer",
                "Node ID",
                "API Address",
                "Connection",
                "Last Heartbeat",
                "Last Remote WAL",
                "Lag",
            ],
            &peers,
        ));
        out.push('\n');
    }
    if !notes.is_empty() {
        out.push('\n');
        for n in notes {
            out.push_str(&n);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn primary_and_secondary_views_render_peers_and_lag() {
        let body = json!({"data": {
            "dr": {"mode": "primary", "last_wal": 120, "cluster_id": "c1", "secondaries": [
                {"node_id": "dr-1", "api_address": "https://127.0.0.1:8210",
                 "connection_status": "connected", "last_heartbeat": "2026-01-01T00:00:00Z",
                 "last_remote_wal": 117}
            ]},
            "performance": {"mode": "secondary", "state": "merkle-sync", "sync_progress": 3,
                "sync_total_keys": 9, "last_remote_wal": 40, "connection_state": "ready",
                "last_error": "primary unreachable",
                "primaries": [{"api_address": "https://p:8200", "connection_status": "connected"}]}
        }});
        let v = views(&body, "all");
        assert_eq!(v.len(), 2);
        let out = render(&v);
        assert!(out.contains("primary"), "{out}");
        assert!(out.contains("merkle-sync (3/9 keys)"), "{out}");
        let peer = out.lines().find(|l| l.contains("dr-1")).unwrap_or_default();
        assert!(
            peer.contains("connected") && peer.contains("117") && peer.ends_with('3'),
            "{peer}"
        );
        assert!(out
            .lines()
            .any(|l| l.contains("https://p:8200") && l.contains("40")));
        assert!(
            out.contains("performance: last error: primary unreachable"),
            "{out}"
        );
    }

    #[test]
    fn a_disabled_mode_and_a_single_view() {
        let v = views(&json!({"data": {"mode": "disabled"}}), "dr");
        assert_eq!(v[0].0, "dr");
        let out = render(&v);
        assert!(
            out.lines().nth(2).unwrap_or_default().starts_with("dr"),
            "{out}"
        );
        assert!(views(&json!({"data": {}}), "all").is_empty());
    }
}
