//! Deterministic telemetry kept in the node: request counters by method, path class and
//! status, login outcomes by reason, replication gauges, rendered as Prometheus text by
//! `GET sys/metrics?format=prometheus`. The node calls [`before_request`] when a request
//! arrives (which also writes its audit request entry) and [`after_input`] after every
//! input, which finds the responses that input produced, counts them and writes their
//! audit response entries. Latency histograms are the shell's (wall clock).

use crate::api::{ApiError, ApiResult, Method, Reply, Request, RequestId};
use crate::audit::{self, Started};
use crate::ctx::Ctx;
use crate::node::{NodeState, Output};
use crate::replication::Mode;
use serde_json::json;
use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;

/// Most requests remembered while they wait for their response (LDAP logins).
const MAX_INFLIGHT: usize = 100_000;
/// Most distinct path classes counted; further ones are counted as `other`.
const MAX_CLASSES: usize = 256;

/// Content type of the Prometheus text exposition format.
pub const PROMETHEUS: &str = "text/plain; version=0.0.4";

#[derive(Clone, Debug)]
struct Inflight {
    method: &'static str,
    class: String,
    login_mount: Option<String>,
    audit: Option<Started>,
    /// What the response's audit entry adds to its error text (see [`note_for_audit`]).
    audit_note: Option<String>,
}

/// Counters and requests waiting for their response.
#[derive(Clone, Debug, Default)]
pub struct Observability {
    /// (method, path class, status) → count.
    pub requests: BTreeMap<(String, String, u16), u64>,
    /// (mount, outcome, reason) → count.
    pub logins: BTreeMap<(String, String, String), u64>,
    inflight: BTreeMap<RequestId, Inflight>,
}

impl Observability {
    /// Requests waiting for their response.
    #[cfg(test)]
    pub(crate) fn inflight_len(&self) -> usize {
        self.inflight.len()
    }
}

/// What request accounting changes: the counters and requests in flight, and the output
/// queue (audit entries); it reads the audit devices' health.
pub struct ObsIo<'a> {
    pub obs: &'a mut Observability,
    pub audit: &'a crate::audit::DeviceHealth,
    pub outputs: &'a mut VecDeque<Output>,
}

impl<'a> ObsIo<'a> {
    /// The request accounting part of `st`.
    pub(crate) fn of(st: &'a mut NodeState) -> ObsIo<'a> {
        ObsIo {
            obs: &mut st.obs,
            audit: &st.audit,
            outputs: &mut st.outputs,
        }
    }
}

/// What `sys/metrics` reads: the counters, the LDAP logins waiting for the directory and
/// the replication state (roles, WAL, secondaries, scans).
pub struct MetricsView<'a> {
    pub obs: &'a Observability,
    pub logins_in_progress: usize,
    pub repl: &'a crate::replication::Replication,
}

impl<'a> MetricsView<'a> {
    /// The part of `st` the metrics show.
    pub(crate) fn of(st: &'a NodeState) -> MetricsView<'a> {
        MetricsView {
            obs: &st.obs,
            logins_in_progress: st.logins.len(),
            repl: &st.repl,
        }
    }
}

/// The method label of a request.
pub fn method_name(m: Method) -> &'static str {
    m.as_str()
}

/// First one or two path segments: `sys/mounts`, `auth/ldap`, `secret`.
pub fn path_class(path: &str) -> String {
    let p = path.trim_start_matches('/');
    let mut it = p.split('/').filter(|s| !s.is_empty());
    let first = it.next().unwrap_or("");
    let raw = match first {
        "sys" | "auth" => match it.next() {
            Some(s) => format!("{first}/{s}"),
            None => first.to_string(),
        },
        _ => first.to_string(),
    };
    raw.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '_' | '.'))
        .take(64)
        .collect()
}

/// Marks request `id` as a login on `mount` (the router found a declared login route).
pub fn mark_login(
    obs: &mut Observability,
    id: crate::api::RequestId,
    mount: &crate::mounts::MountEntry,
) {
    if let Some(inf) = obs.inflight.get_mut(&id) {
        inf.login_mount = Some(format!("auth/{}", mount.path.trim_end_matches('/')));
    }
}

/// Adds `note` to the error text of request `id`'s audit response entry (not to the
/// client's answer): why a directory refused a login, which the client is not told.
pub fn note_for_audit(st: &mut NodeState, id: crate::api::RequestId, note: String) {
    if let Some(inf) = st.obs.inflight.get_mut(&id) {
        inf.audit_note = Some(note);
    }
}

/// Why a login failed, from its error.
fn failure_reason(status: u16, error: &str) -> &'static str {
    if error == crate::auth::ldap::login::USER_BIND_FAILED || error.contains("invalid credentials")
    {
        "bad_credentials"
    } else if error.contains("connect to LDAP server")
        || error.contains("lost the connection")
        || error.contains("did not answer in time")
        || error.contains("TLS handshake")
    {
        "unreachable"
    } else if status == 429 {
        "locked"
    } else if status == 403 {
        "denied"
    } else {
        "error"
    }
}

/// Records a request as it arrives and logs its audit request entry.
///
/// Refuses the request (before it runs) when it must be audited and no device can record it.
pub fn before_request(
    ctx: &mut Ctx,
    st: &mut ObsIo<'_>,
    req: &Request,
    mode: crate::routes::Audit,
) -> crate::api::ApiResult<()> {
    let mut lines = Vec::new();
    let audit = match audit::on_request(ctx, st.audit, &mut lines, req, mode) {
        Ok(a) => a,
        Err(e) => {
            count_refused(st, req);
            return Err(e);
        }
    };
    st.outputs.extend(lines);
    let obs = &mut st.obs;
    if obs.inflight.len() >= MAX_INFLIGHT {
        obs.inflight.pop_first();
    }
    // The request head already made `GET ?list=true` a LIST.
    obs.inflight.insert(
        req.id,
        Inflight {
            method: method_name(req.method),
            class: path_class(&req.path),
            login_mount: None,
            audit,
            audit_note: None,
        },
    );
    Ok(())
}

/// Makes a request refused before it ran count like any other (its answer is counted when
/// it is produced).
fn count_refused(st: &mut ObsIo<'_>, req: &Request) {
    st.obs.inflight.insert(
        req.id,
        Inflight {
            method: method_name(req.method),
            class: path_class(&req.path),
            login_mount: None,
            audit: None,
            audit_note: None,
        },
    );
}

/// Counts the responses produced since output `from` and logs their audit entries.
pub fn after_input(st: &mut ObsIo<'_>, from: usize, now: u64) {
    if st.obs.inflight.is_empty() {
        return;
    }
    let mut lines = Vec::new();
    let mut done = Vec::new();
    for o in st.outputs.iter().skip(from) {
        let Output::Response(r) = o else { continue };
        let Some(inf) = st.obs.inflight.remove(&r.id) else {
            continue;
        };
        let class = counted_class(st.obs, &inf.class);
        done.push((
            (inf.method.to_string(), class, r.status),
            inf.login_mount.clone(),
            r.clone(),
        ));
        if let Some(a) = &inf.audit {
            audit::on_response(a, r, inf.audit_note.as_deref(), now, &mut lines);
        }
    }
    for (key, login, r) in done {
        *st.obs.requests.entry(key).or_default() += 1;
        if let Some(mount) = login {
            let error = r
                .body
                .as_ref()
                .and_then(|b| b.get("errors"))
                .and_then(|e| e.get(0))
                .and_then(|e| e.as_str())
                .unwrap_or("");
            let (outcome, reason) = if r.status < 300 {
                ("success", "")
            } else {
                ("failure", failure_reason(r.status, error))
            };
            *st.obs
                .logins
                .entry((mount, outcome.to_string(), reason.to_string()))
                .or_default() += 1;
        }
    }
    st.outputs.extend(lines);
}

/// The class a request is counted under: its own, or `other` once [`MAX_CLASSES`]
/// distinct classes are counted.
fn counted_class(obs: &Observability, class: &str) -> String {
    let known = obs.requests.keys().any(|(_, c, _)| c == class);
    let distinct = || {
        obs.requests
            .keys()
            .map(|(_, c, _)| c)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    };
    if known || distinct() < MAX_CLASSES {
        class.to_string()
    } else {
        "other".to_string()
    }
}

/// A request answered beside the node ([`crate::reads`]), to be counted by it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Answered {
    pub method: &'static str,
    pub class: String,
    pub status: u16,
}

/// Counts requests answered beside the node as the node counts its own: each kind of
/// answer with how many there were.
pub fn count_answered(
    obs: &mut Observability,
    answered: impl IntoIterator<Item = (Answered, u64)>,
) {
    for (a, n) in answered {
        let class = counted_class(obs, &a.class);
        *obs.requests
            .entry((a.method.to_string(), class, a.status))
            .or_default() += n;
    }
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// The core's metrics in Prometheus text format.
pub fn render(st: &MetricsView<'_>, sealed: bool, now: u64) -> String {
    let mut out = String::new();
    header(
        &mut out,
        "cairn_requests_total",
        "counter",
        "API requests by method, path class and status.",
    );
    for ((m, c, s), n) in &st.obs.requests {
        let _ = writeln!(
            out,
            "cairn_requests_total{{method=\"{}\",path=\"{}\",status=\"{s}\"}} {n}",
            esc(m),
            esc(c)
        );
    }
    header(
        &mut out,
        "cairn_logins_total",
        "counter",
        "Logins by auth mount, outcome and failure reason.",
    );
    for ((m, o, r), n) in &st.obs.logins {
        let _ = writeln!(
            out,
            "cairn_logins_total{{mount=\"{}\",outcome=\"{}\",reason=\"{}\"}} {n}",
            esc(m),
            esc(o),
            esc(r)
        );
    }
    header(
        &mut out,
        "cairn_sealed",
        "gauge",
        "1 when the node is sealed.",
    );
    let _ = writeln!(out, "cairn_sealed {}", u8::from(sealed));
    header(
        &mut out,
        "cairn_logins_in_progress",
        "gauge",
        "LDAP logins waiting for the directory.",
    );
    let _ = writeln!(out, "cairn_logins_in_progress {}", st.logins_in_progress);

    let repl = st.repl;
    header(
        &mut out,
        "cairn_wal_last_index",
        "gauge",
        "Index of the last WAL entry.",
    );
    let _ = writeln!(out, "cairn_wal_last_index {}", repl.wal.last);
    header(
        &mut out,
        "cairn_wal_first_index",
        "gauge",
        "Index of the oldest WAL entry still retained.",
    );
    let _ = writeln!(out, "cairn_wal_first_index {}", repl.wal.first);
    header(
        &mut out,
        "cairn_wal_retained_entries",
        "gauge",
        "WAL entries retained.",
    );
    let _ = writeln!(out, "cairn_wal_retained_entries {}", repl.wal.count());
    header(
        &mut out,
        "cairn_wal_retained_bytes",
        "gauge",
        "WAL bytes retained.",
    );
    let _ = writeln!(out, "cairn_wal_retained_bytes {}", repl.wal.bytes);
    header(
        &mut out,
        "cairn_replication_role",
        "gauge",
        "Replication role per mode (1 for the current role).",
    );
    for m in [Mode::Performance, Mode::Dr] {
        let role = format!("{:?}", repl.role(m)).to_lowercase();
        let _ = writeln!(
            out,
            "cairn_replication_role{{mode=\"{}\",role=\"{role}\"}} 1",
            m.name()
        );
    }
    header(
        &mut out,
        "cairn_replication_last_remote_wal",
        "gauge",
        "Secondary: last primary WAL index applied.",
    );
    header(
        &mut out,
        "cairn_replication_lag_entries",
        "gauge",
        "Secondary: primary's last known WAL index minus last_remote_wal.",
    );
    header(
        &mut out,
        "cairn_replication_connected",
        "gauge",
        "Secondary: 1 while streaming WALs from the primary.",
    );
    header(
        &mut out,
        "cairn_replication_sync_progress",
        "gauge",
        "Secondary: Merkle sync (reindex) keys done and total.",
    );
    header(
        &mut out,
        "cairn_replication_merkle_diffs_total",
        "counter",
        "Secondary: Merkle diffs (resyncs) started since the process started.",
    );
    for m in [Mode::Performance, Mode::Dr] {
        let rt = repl.mode(m);
        if rt.role.role != crate::replication::state::Role::Secondary {
            continue;
        }
        let mode = m.name();
        let last = rt.role.last_remote_wal;
        let _ = writeln!(
            out,
            "cairn_replication_last_remote_wal{{mode=\"{mode}\"}} {last}"
        );
        let lag = rt.sec.info.last_wal.saturating_sub(last);
        let _ = writeln!(
            out,
            "cairn_replication_lag_entries{{mode=\"{mode}\"}} {lag}"
        );
        let conn = u8::from(rt.sec.phase == crate::replication::Phase::StreamWals);
        let _ = writeln!(out, "cairn_replication_connected{{mode=\"{mode}\"}} {conn}");
        let _ = writeln!(
            out,
            "cairn_replication_sync_progress{{mode=\"{mode}\",kind=\"done\"}} {}",
            rt.sec.sync_done
        );
        let _ = writeln!(
            out,
            "cairn_replication_sync_progress{{mode=\"{mode}\",kind=\"total\"}} {}",
            rt.sec.sync_total
        );
        let _ = writeln!(
            out,
            "cairn_replication_merkle_diffs_total{{mode=\"{mode}\"}} {}",
            repl.merkle_diffs(m)
        );
    }
    header(
        &mut out,
        "cairn_replication_reindex_progress",
        "gauge",
        "Reindex or Merkle check running on this node: keys scanned and keys in storage.",
    );
    let (done, total) = repl.scan_progress().unwrap_or((0, 0));
    let _ = writeln!(
        out,
        "cairn_replication_reindex_progress{{kind=\"done\"}} {done}"
    );
    let _ = writeln!(
        out,
        "cairn_replication_reindex_progress{{kind=\"total\"}} {total}"
    );
    header(
        &mut out,
        "cairn_replication_secondary_last_seen_seconds",
        "gauge",
        "Primary: seconds since each secondary's last contact.",
    );
    for ((m, id), live) in &repl.live {
        let age = now.saturating_sub(live.last_seen) as f64 / 1000.0;
        let _ = writeln!(
            out,
            "cairn_replication_secondary_last_seen_seconds{{mode=\"{}\",secondary=\"{}\"}} {age}",
            m.name(),
            esc(id)
        );
    }
    out
}

/// `GET sys/metrics`: Prometheus text with `format=prometheus`, else the counters as JSON.
pub fn handle(ctx: &Ctx, st: &MetricsView<'_>, req: &Request, tail: &str) -> ApiResult {
    if !tail.is_empty() {
        return Err(ApiError::NotFound(String::new()));
    }
    if req.method != Method::Get {
        return Err(ApiError::MethodNotAllowed);
    }
    let text = render(st, ctx.barrier.sealed(), ctx.now);
    match req.query("format") {
        Some("prometheus") => Ok(Reply::Text(200, PROMETHEUS.into(), text.into_bytes())),
        None | Some("") => {
            let counters: Vec<_> = st
                .obs
                .requests
                .iter()
                .map(|((m, c, s), n)| json!({"method": m, "path": c, "status": s, "count": n}))
                .collect();
            let logins: Vec<_> = st
                .obs
                .logins
                .iter()
                .map(|((m, o, r), n)| json!({"mount": m, "outcome": o, "reason": r, "count": n}))
                .collect();
            Ok(Reply::Raw(
                200,
                json!({"requests": counters, "logins": logins}),
            ))
        }
        Some(f) => Err(ApiError::bad(format!(
            "format: unknown format {f:?} (use \"prometheus\")"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(path_class("sys/mounts/secret"), "sys/mounts");
        assert_eq!(path_class("secret/a/b"), "secret");
        assert_eq!(path_class("auth/ldap/login/bob"), "auth/ldap");
    }
}
