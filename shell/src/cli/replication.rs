//! `replication status`: reads `sys/replication/status` (or the DR / performance view) and
//! shows each mode's role, state and WAL positions, then one row per peer with its
//! connection status, heartbeat, `last_remote_wal` and lag. A server without the endpoint is
//! reported plainly rather than as a crash.

use super::output::{cell, table};
use super::{print_json, CliError, Client, CmdResult, Common, Ctx, Format};
use clap::Subcommand;
use serde_json::Value;

#[derive(Subcommand, Debug)]
pub enum ReplicationCmd {
    /// Show replication status as tables (role, state, WALs, peers).
    Status(StatusArgs),
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
    }
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
