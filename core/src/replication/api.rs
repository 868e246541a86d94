//! The `sys/replication/*` endpoints (spec sections B and C, except the DR operation token
//! generation): status (per mode and combined; unauthenticated), primary
//! enable/demote/disable/secondary-token/revoke-secondary, paths and dynamic filters,
//! secondary enable/promote/disable/update-primary, and the entry points of reindex and
//! the Merkle check (`sys/replication/{reindex,merkle-check}` with a sudo token, and
//! `sys/replication/dr/secondary/{reindex,merkle-check}` with a DR operation token on a DR
//! secondary; the scans themselves live in `reindex`).
//!
//! Every endpoint but the status ones requires the root namespace and a license with the
//! replication feature.

use super::activation::{self, Claims};
use super::filter;
use super::msg::HttpCall;
use super::primary::{self, load_record, load_records, record_key};
use super::secondary;
use super::state::{Bundle, Role, RoleState, SecondaryRecord};
use super::wal;
use super::{Call, Mode, Phase, ReplIo, SecRt};
use crate::api::{body_object, ApiError, ApiResult, Fields, Method, Reply, Request};
use crate::ctx::Ctx;
use crate::node::Output;
use crate::time::rfc3339;
use crate::token::Caller;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// Cluster-local record of this cluster's performance primary role, so that a DR secondary
/// that is promoted takes over the performance set of its former primary.
const PERF_PRIMARY: &str = "core/local-replication/performance/primary";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PerfPrimary {
    cluster_id: String,
}

/// `sys/replication/<tail>`.
pub fn handle(
    ctx: &mut Ctx,
    st: &mut ReplIo<'_>,
    req: &Request,
    tail: &str,
    _caller: Option<&Caller>,
) -> ApiResult {
    super::require_loaded(st)?;
    if tail == "status" {
        return match req.method {
            Method::Get => Ok(Reply::Data(json!({
                "dr": status(ctx, st, Mode::Dr, true)?,
                "performance": status(ctx, st, Mode::Performance, true)?,
            }))),
            _ => Err(ApiError::MethodNotAllowed),
        };
    }
    if matches!(
        tail,
        "reindex" | "merkle-check" | "dr/secondary/reindex" | "dr/secondary/merkle-check"
    ) {
        gates(ctx, st, req)?;
        if let Some(r) = scan_endpoint(ctx, st, req, tail) {
            return r;
        }
    }
    let (m, rest) = tail.split_once('/').unwrap_or((tail, ""));
    let Some(mode) = Mode::parse(m) else {
        return Err(ApiError::NotFound(String::new()));
    };
    if rest == "status" {
        return match req.method {
            Method::Get => Ok(Reply::Data(status(ctx, st, mode, false)?)),
            _ => Err(ApiError::MethodNotAllowed),
        };
    }
    gates(ctx, st, req)?;
    let write = req.method.is_write();
    match (rest, write) {
        ("primary/enable", true) => primary_enable(ctx, st, req, mode),
        ("primary/demote", true) => primary_demote(ctx, st, mode),
        ("primary/disable", true) => primary_disable(ctx, st, mode),
        ("primary/secondary-token", true) => secondary_token(ctx, st, req, mode),
        ("primary/revoke-secondary", true) => revoke(ctx, st, req, mode),
        ("secondary/generate-public-key", true) => Ok(Reply::Data(json!({
            "secondary_public_key": activation::generate_public_key(ctx, mode)?,
        }))),
        ("secondary/enable", true) => secondary_enable(ctx, st, req, mode),
        ("secondary/promote", true) => promote(ctx, st, req, mode),
        ("secondary/disable", true) => secondary_disable(ctx, st, req, mode),
        ("secondary/update-primary", true) => update_primary(ctx, st, req, mode),
        _ => {
            if mode == Mode::Performance {
                if let Some(id) = rest.strip_prefix("primary/paths-filter/") {
                    return paths_filter(ctx, st, req, id);
                }
                if let Some(id) = rest.strip_prefix("primary/dynamic-filter/") {
                    return only_get(req).and_then(|_| primary_dynamic(ctx, st, id));
                }
                if let Some(id) = rest.strip_prefix("secondary/dynamic-filter/") {
                    return only_get(req).and_then(|_| secondary_dynamic(st, id));
                }
            }
            let known = [
                "primary/enable",
                "primary/demote",
                "primary/disable",
                "primary/secondary-token",
                "primary/revoke-secondary",
                "secondary/generate-public-key",
                "secondary/enable",
                "secondary/promote",
                "secondary/disable",
                "secondary/update-primary",
            ];
            if known.contains(&rest) {
                Err(ApiError::MethodNotAllowed)
            } else {
                Err(ApiError::NotFound(String::new()))
            }
        }
    }
}

/// `reindex` and `merkle-check`: `sys/replication/<op>` (any role but DR secondary, sudo
/// token) and `sys/replication/dr/secondary/<op>` (a DR secondary with its DR operation
/// token; on other roles a sudo token, as the reference allows reindex on primaries).
fn scan_endpoint(
    ctx: &mut Ctx,
    st: &mut ReplIo<'_>,
    req: &Request,
    tail: &str,
) -> Option<ApiResult> {
    let (op, dr_path) = match tail {
        "reindex" | "merkle-check" => (tail, false),
        "dr/secondary/reindex" => ("reindex", true),
        "dr/secondary/merkle-check" => ("merkle-check", true),
        _ => return None,
    };
    Some((|| {
        if !matches!(req.method, Method::Post | Method::Put) {
            return Err(ApiError::MethodNotAllowed);
        }
        if st.repl.is_dr_secondary() {
            if !dr_path {
                return Err(ApiError::bad(format!(
                    "this cluster is a DR secondary: use sys/replication/dr/secondary/{op} with a dr_operation_token"
                )));
            }
            super::dr_token::check_body(ctx, &body_object(&req.body)?)?;
        }
        match op {
            "reindex" => super::reindex::start_reindex(ctx, &mut st.repl.jobs, req),
            _ => super::reindex::start_check(ctx, &mut st.repl.jobs, req),
        }
    })())
}

fn only_get(req: &Request) -> ApiResult<()> {
    if req.method == Method::Get {
        Ok(())
    } else {
        Err(ApiError::MethodNotAllowed)
    }
}

/// Root namespace and license.
fn gates(ctx: &Ctx, st: &ReplIo<'_>, req: &Request) -> ApiResult<()> {
    let ns = req
        .namespace
        .as_deref()
        .unwrap_or("")
        .trim_matches('/')
        .to_string();
    if !ns.is_empty() && ns != "root" {
        return Err(ApiError::bad(format!(
            "replication endpoints can be called only from the root namespace, not from namespace {ns:?}"
        )));
    }
    crate::license::require(
        &st.config.license,
        ctx.now,
        crate::license::FEATURE_REPLICATION,
    )
}

fn mode_of<'s>(st: &'s ReplIo<'_>, mode: Mode) -> &'s RoleState {
    &st.repl.mode(mode).role
}

fn save_role(ctx: &mut Ctx, st: &ReplIo<'_>, mode: Mode) -> ApiResult<()> {
    ctx.put_json(&mode.role_key(), &st.repl.mode(mode).role)
}

/// Turns WAL writing on or off to match the roles (through the handler's write set).
fn wal_activity(ctx: &mut Ctx, st: &mut ReplIo<'_>) -> ApiResult<()> {
    let want = st.repl.wal_wanted();
    let meta = st.repl.wal;
    if meta.active == want {
        return Ok(());
    }
    let mut m = meta;
    if want {
        for k in ctx
            .keys(wal::ENTRY)?
            .into_iter()
            .chain(ctx.keys(wal::KEYS)?)
        {
            ctx.delete(&k);
        }
        m = wal::Meta {
            first: meta.last + 2,
            last: meta.last + 1,
            bytes: 0,
            active: true,
            kept: 0,
        };
    } else {
        m.active = false;
    }
    ctx.txn
        .put(wal::META, serde_json::to_vec(&m).unwrap_or_default());
    st.repl.set_wal(m);
    Ok(())
}

fn connection(now: u64, last: Option<u64>, timeout: u64) -> &'static str {
    match last {
        Some(t) if now.saturating_sub(t) <= timeout => "connected",
        _ => "disconnected",
    }
}

fn status(ctx: &Ctx, st: &ReplIo<'_>, mode: Mode, combined: bool) -> ApiResult<Value> {
    let rt = st.repl.mode(mode);
    let r = &rt.role;
    let now = ctx.now;
    let timeout = st.config.replication.heartbeat_timeout_ms;
    let mut o = Map::new();
    match r.role {
        Role::Disabled => {
            o.insert("mode".into(), json!("disabled"));
        }
        Role::Primary => {
            let recs = load_records(ctx, mode)?;
            let mm = if mode == Mode::Performance {
                filter::mount_map(ctx)?
            } else {
                filter::MountMap::default()
            };
            let mut secs = Vec::new();
            for rec in &recs {
                let live = primary::live_view(&st.repl.live, mode, &rec.id);
                // The root this secondary should reach (its filtered view).
                let root = match mode {
                    Mode::Performance => hex::encode(
                        st.repl
                            .trees
                            .root(super::merkle::TreeKind::Replicated, &|s| {
                                filter::included(rec.filter.as_ref(), &mm, s)
                            }),
                    ),
                    Mode::Dr => st.repl.merkle_root(mode),
                };
                secs.push(json!({
                    "merkle_root": root,
                    "node_id": rec.id,
                    "api_address": live.as_ref().map(|l| l.api_addr.clone()).unwrap_or_default(),
                    "cluster_address": live.as_ref().map(|l| l.cluster_addr.clone()).unwrap_or_default(),
                    "connection_status": connection(now, live.as_ref().map(|l| l.last_seen), timeout),
                    "last_heartbeat": live.as_ref().map(|l| rfc3339(l.last_seen)),
                    "cluster_id": live.as_ref().map(|l| l.cluster_id.clone()).unwrap_or_default(),
                    "version": live.as_ref().map(|l| l.version.clone()).unwrap_or_default(),
                }));
            }
            o.insert("mode".into(), json!("primary"));
            o.insert("version".into(), json!(st.config.version));
            o.insert("cluster_id".into(), json!(r.cluster_id));
            o.insert(
                "known_secondaries".into(),
                json!(recs.iter().map(|r| r.id.clone()).collect::<Vec<_>>()),
            );
            o.insert("last_wal".into(), json!(st.repl.wal.last));
            let extra = match mode {
                Mode::Performance => "last_performance_wal",
                Mode::Dr => "last_dr_wal",
            };
            o.insert(extra.into(), json!(st.repl.wal.last));
            o.insert("merkle_root".into(), json!(st.repl.merkle_root(mode)));
            super::reindex::status_fields(ctx, &st.repl.jobs, &mut o)?;
            o.insert("primary_cluster_addr".into(), json!(r.primary_cluster_addr));
            o.insert("secondaries".into(), Value::Array(secs));
            o.insert("state".into(), json!("running"));
        }
        Role::Secondary => {
            let addrs = r
                .creds
                .as_ref()
                .map(|c| c.primary_cluster_addrs.clone())
                .unwrap_or_default();
            let conn = connection(now, rt.sec.last_heartbeat, timeout);
            let primaries: Vec<Value> = r
                .creds
                .iter()
                .map(|c| {
                    json!({
                        "api_address": if rt.sec.info.api_addr.is_empty() { c.primary_api_addr.clone() } else { rt.sec.info.api_addr.clone() },
                        "cluster_address": addrs.get(rt.sec.addr_idx % addrs.len().max(1)).cloned().unwrap_or_default(),
                        "connection_status": conn,
                        "last_heartbeat": rt.sec.last_heartbeat.map(rfc3339),
                    })
                })
                .collect();
            o.insert("mode".into(), json!("secondary"));
            o.insert("version".into(), json!(st.config.version));
            o.insert("primary_version".into(), json!(rt.sec.info.version));
            o.insert("cluster_id".into(), json!(r.cluster_id));
            o.insert("known_primary_cluster_addrs".into(), json!(addrs));
            o.insert("last_remote_wal".into(), json!(r.last_remote_wal));
            o.insert("merkle_root".into(), json!(st.repl.merkle_root(mode)));
            o.insert("primaries".into(), Value::Array(primaries));
            o.insert(
                "primary_cluster_addr".into(),
                json!(addrs.first().cloned().unwrap_or_default()),
            );
            o.insert(
                "secondary_id".into(),
                json!(r
                    .creds
                    .as_ref()
                    .map(|c| c.secondary_id.clone())
                    .unwrap_or_default()),
            );
            o.insert("state".into(), json!(secondary::state_name(rt)));
            o.insert(
                "connection_state".into(),
                json!(if conn == "connected" {
                    "ready"
                } else if r.creds.is_some() {
                    "transient_failure"
                } else {
                    "shutdown"
                }),
            );
            // Merkle diffs (resyncs) this node started since it started; streaming on
            // after a primary cluster's failover starts none.
            o.insert("merkle_diffs".into(), json!(st.repl.merkle_diffs(mode)));
            if rt.sec.phase == Phase::MerkleSync {
                o.insert("sync_progress".into(), json!(rt.sec.sync_done));
                o.insert("sync_total_keys".into(), json!(rt.sec.sync_total));
            }
            if !rt.sec.last_error.is_empty() {
                o.insert("last_error".into(), json!(rt.sec.last_error));
            }
            if mode == Mode::Dr {
                o.insert("last_dr_wal".into(), json!(st.repl.wal.last));
            }
            super::reindex::status_fields(ctx, &st.repl.jobs, &mut o)?;
        }
    }
    let _ = combined;
    Ok(Value::Object(o))
}

fn new_cluster_id(ctx: &mut Ctx) -> String {
    crate::crypto::uuid(ctx.rng())
}

fn primary_enable(ctx: &mut Ctx, st: &mut ReplIo<'_>, req: &Request, mode: Mode) -> ApiResult {
    let body = body_object(&req.body)?;
    let f = Fields(&body);
    match mode_of(st, mode).role {
        Role::Secondary => {
            return Err(ApiError::bad(format!(
                "this cluster is a {} secondary: promote it instead of enabling it as a primary",
                mode.name()
            )))
        }
        Role::Primary => {
            return Err(ApiError::bad(format!(
                "this cluster is already a {} primary",
                mode.name()
            )))
        }
        Role::Disabled => {}
    }
    let addr = f
        .str("primary_cluster_addr")?
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| st.config.replication.cluster_addr.clone());
    if !addr.is_empty() {
        super::tls::check_cluster_addr("primary_cluster_addr", &addr)?;
    }
    let cluster_id = new_cluster_id(ctx);
    {
        let rt = st.repl.mode_mut(mode);
        rt.role = RoleState {
            role: Role::Primary,
            cluster_id: cluster_id.clone(),
            primary_cluster_addr: addr,
            ..Default::default()
        };
        rt.sec = SecRt::default();
    }
    save_role(ctx, st, mode)?;
    if mode == Mode::Performance {
        ctx.put_json(PERF_PRIMARY, &PerfPrimary { cluster_id })?;
    }
    wal_activity(ctx, st)?;
    super::tls::ca_pem(ctx, true)?;
    super::announce_tls(ctx, st)?;
    Ok(Reply::Envelope(json!({
        "warnings": ["This cluster is being enabled as a primary for replication. Vault will be unavailable for a brief period and will resume service shortly."]
    })))
}

fn require_role(st: &ReplIo<'_>, mode: Mode, want: Role) -> ApiResult<()> {
    let have = mode_of(st, mode).role;
    if have == want {
        return Ok(());
    }
    let what = match want {
        Role::Primary => "primary",
        Role::Secondary => "secondary",
        Role::Disabled => "cluster with replication disabled",
    };
    Err(ApiError::bad(format!(
        "this cluster is not a {} {what} (it is {})",
        mode.name(),
        match have {
            Role::Primary => "a primary",
            Role::Secondary => "a secondary",
            Role::Disabled => "disabled",
        }
    )))
}

fn stop_serving(st: &mut ReplIo<'_>, mode: Mode, why: &str) {
    let ReplIo { outputs, repl, .. } = st;
    primary::drop_waiters(outputs, &mut repl.waiters, mode, None, why);
    repl.live.retain(|(m, _), _| *m != mode);
}

fn primary_demote(ctx: &mut Ctx, st: &mut ReplIo<'_>, mode: Mode) -> ApiResult {
    require_role(st, mode, Role::Primary)?;
    stop_serving(st, mode, "the primary was demoted");
    {
        let rt = st.repl.mode_mut(mode);
        rt.role.role = Role::Secondary;
        rt.role.creds = None;
        rt.role.primary_cluster_addr.clear();
        rt.sec = SecRt::default();
    }
    save_role(ctx, st, mode)?;
    if mode == Mode::Performance {
        ctx.delete(PERF_PRIMARY);
    }
    wal_activity(ctx, st)?;
    Ok(Reply::Empty)
}

fn primary_disable(ctx: &mut Ctx, st: &mut ReplIo<'_>, mode: Mode) -> ApiResult {
    require_role(st, mode, Role::Primary)?;
    stop_serving(st, mode, "replication was disabled on the primary");
    for rec in load_records(ctx, mode)? {
        ctx.delete(&record_key(mode, &rec.id));
        revoke_activation_token(ctx, &rec)?;
    }
    {
        let rt = st.repl.mode_mut(mode);
        rt.role = RoleState::default();
        rt.sec = SecRt::default();
    }
    save_role(ctx, st, mode)?;
    if mode == Mode::Performance {
        ctx.delete(PERF_PRIMARY);
    }
    wal_activity(ctx, st)?;
    Ok(Reply::Empty)
}

fn valid_id(id: &str) -> ApiResult<()> {
    if id.len() > 128
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(ApiError::bad(format!(
            "id: {id:?} must be 1-128 characters of letters, digits, '-', '_' or '.'"
        )));
    }
    Ok(())
}

fn secondary_token(ctx: &mut Ctx, st: &mut ReplIo<'_>, req: &Request, mode: Mode) -> ApiResult {
    require_role(st, mode, Role::Primary)?;
    let body = body_object(&req.body)?;
    let f = Fields(&body);
    let id = f.req_str("id")?;
    valid_id(&id)?;
    let ttl = f.duration("ttl")?.unwrap_or(1800);
    if ttl == 0 {
        return Err(ApiError::bad("ttl: must be greater than zero"));
    }
    let public_key = f.str("secondary_public_key")?.filter(|k| !k.is_empty());
    if load_record(ctx, mode, &id)?.is_some() {
        return Err(ApiError::bad(format!(
            "id: a secondary with id {id:?} already exists; revoke it first or choose another id"
        )));
    }
    let api_addr = st.config.replication.api_addr.clone();
    if api_addr.is_empty() {
        return Err(ApiError::bad(
            "this server has no api_addr configured; secondaries would not know where to unwrap their token",
        ));
    }
    let key = st
        .repl
        .barrier_key
        .clone()
        .ok_or_else(|| ApiError::Internal("barrier key not available".into()))?;
    let role = mode_of(st, mode).clone();
    let secret = crate::crypto::base62(ctx.rng(), 40);
    let bundle = Bundle {
        mode,
        primary_cluster_id: role.cluster_id.clone(),
        primary_cluster_addrs: super::primary_cluster_addrs(st, &role),
        primary_api_addr: api_addr.clone(),
        secondary_id: id.clone(),
        secret: secret.clone(),
        ca_pem: super::tls::ca_pem(ctx, false)?.unwrap_or_default(),
        client: super::tls::secondary_client(ctx, &id)?,
        barrier_key: hex::encode(&key[..]),
        seal_config: String::from_utf8_lossy(
            &ctx.txn
                .get(crate::seal::SEAL_CONFIG_KEY)?
                .unwrap_or_default(),
        )
        .into_owned(),
        keyring: hex::encode(ctx.txn.get(crate::seal::KEYRING_KEY)?.unwrap_or_default()),
        primary_version: st.config.version.clone(),
    };
    if let Some(pk) = public_key {
        // Encrypted to the secondary's key instead of response-wrapped.
        let token = activation::encrypt_to(
            ctx,
            &pk,
            &activation::Sealed {
                mode,
                exp: ctx.now / 1000 + ttl,
                bundle,
            },
        )?;
        let rec = SecondaryRecord {
            id: id.clone(),
            secret_hash: crate::crypto::sha256_hex(secret.as_bytes()),
            created: ctx.now,
            wrap_accessor: String::new(),
            filter: None,
        };
        ctx.put_json(&record_key(mode, &id), &rec)?;
        return Ok(Reply::Data(json!({
            "token": token,
            "id": id,
            "ttl": ttl,
            "creation_time": rfc3339(ctx.now),
        })));
    }
    let path = format!("sys/replication/{}/primary/secondary-token", mode.name());
    let wrapped = json!({ "data": bundle });
    let mut info = crate::wrapping::wrap(ctx, 200, Some(wrapped), &path, ttl)?;
    let inner = info["token"].as_str().unwrap_or_default().to_string();
    let token = activation::issue(
        ctx,
        &Claims {
            addr: api_addr,
            id: inner,
            mode,
            exp: ctx.now / 1000 + ttl,
            jti: id.clone(),
        },
    )?;
    let rec = SecondaryRecord {
        id: id.clone(),
        secret_hash: crate::crypto::sha256_hex(secret.as_bytes()),
        created: ctx.now,
        wrap_accessor: info["accessor"].as_str().unwrap_or_default().to_string(),
        filter: None,
    };
    ctx.put_json(&record_key(mode, &id), &rec)?;
    info["token"] = json!(token);
    Ok(Reply::Envelope(json!({ "wrap_info": info })))
}

fn revoke(ctx: &mut Ctx, st: &mut ReplIo<'_>, req: &Request, mode: Mode) -> ApiResult {
    require_role(st, mode, Role::Primary)?;
    let body = body_object(&req.body)?;
    let id = Fields(&body).req_str("id")?;
    let Some(rec) = load_record(ctx, mode, &id)? else {
        return Err(ApiError::bad(format!("id: no secondary with id {id:?}")));
    };
    ctx.delete(&record_key(mode, &id));
    revoke_activation_token(ctx, &rec)?;
    let ReplIo { outputs, repl, .. } = st;
    primary::drop_waiters(
        outputs,
        &mut repl.waiters,
        mode,
        Some(&id),
        "this secondary was revoked",
    );
    repl.live.remove(&(mode, id));
    Ok(Reply::Empty)
}

/// Revokes the wrapping token of `rec`'s activation token, if it was response-wrapped and
/// is still unused: its credential bundle (the barrier key among it) is handed out no more.
fn revoke_activation_token(ctx: &mut Ctx, rec: &SecondaryRecord) -> ApiResult<()> {
    if !rec.wrap_accessor.is_empty() {
        if let Some(h) = crate::token::hash_by_accessor(ctx, &rec.wrap_accessor)? {
            crate::token::revoke_tree(ctx, &h)?;
        }
    }
    Ok(())
}

/// Finds a secondary record by its id or by the cluster id it reports.
fn find_record(ctx: &Ctx, st: &ReplIo<'_>, id: &str) -> ApiResult<SecondaryRecord> {
    if let Some(r) = load_record(ctx, Mode::Performance, id)? {
        return Ok(r);
    }
    for ((m, sid), l) in &st.repl.live {
        if *m == Mode::Performance && l.cluster_id == id {
            if let Some(r) = load_record(ctx, Mode::Performance, sid)? {
                return Ok(r);
            }
        }
    }
    Err(ApiError::bad(format!(
        "no performance secondary with id {id:?}"
    )))
}

fn paths_filter(ctx: &mut Ctx, st: &mut ReplIo<'_>, req: &Request, id: &str) -> ApiResult {
    require_role(st, Mode::Performance, Role::Primary)?;
    let mut rec = find_record(ctx, st, id)?;
    match req.method {
        Method::Put | Method::Post => {
            let body = body_object(&req.body)?;
            let f = Fields(&body);
            f.only(&["mode", "paths"])?;
            let flt = filter::validate(
                &f.str("mode")?.unwrap_or_default(),
                f.list("paths")?.unwrap_or_default(),
            )?;
            rec.filter = Some(flt);
            ctx.put_json(&record_key(Mode::Performance, &rec.id), &rec)?;
            Ok(Reply::Empty)
        }
        Method::Get => match rec.filter {
            Some(f) => Ok(Reply::Data(json!({ "mode": f.mode, "paths": f.paths }))),
            None => Err(ApiError::NotFound(format!(
                "no paths filter for secondary {id:?}"
            ))),
        },
        Method::Delete => {
            rec.filter = None;
            ctx.put_json(&record_key(Mode::Performance, &rec.id), &rec)?;
            Ok(Reply::Empty)
        }
        Method::List | Method::Patch => Err(ApiError::MethodNotAllowed),
    }
}

fn primary_dynamic(ctx: &mut Ctx, st: &ReplIo<'_>, id: &str) -> ApiResult {
    require_role(st, Mode::Performance, Role::Primary)?;
    let rec = find_record(ctx, st, id)?;
    let mm = filter::mount_map(ctx)?;
    let v = filter::view(rec.filter.as_ref(), &mm);
    Ok(Reply::Data(json!({
        "dynamic_filtered_mounts": v.dynamic_filtered_mounts,
        "dynamic_filtered_namespaces": v.dynamic_filtered_namespaces,
    })))
}

fn secondary_dynamic(st: &ReplIo<'_>, id: &str) -> ApiResult {
    require_role(st, Mode::Performance, Role::Secondary)?;
    let r = mode_of(st, Mode::Performance);
    let mine = r.creds.as_ref().is_some_and(|c| c.secondary_id == id) || r.cluster_id == id;
    if !mine {
        return Err(ApiError::bad(format!(
            "{id:?} is not this secondary's id or cluster id"
        )));
    }
    let v = r.filter.clone().unwrap_or_default();
    Ok(Reply::Data(json!({
        "dynamic_filtered_mounts": v.dynamic_filtered_mounts,
        "dynamic_filtered_namespaces": v.dynamic_filtered_namespaces,
    })))
}

fn secondary_enable(ctx: &mut Ctx, st: &mut ReplIo<'_>, req: &Request, mode: Mode) -> ApiResult {
    let body = body_object(&req.body)?;
    let f = Fields(&body);
    match mode_of(st, mode).role {
        Role::Primary => {
            return Err(ApiError::bad(format!(
                "this cluster is a {} primary: disable or demote it before enabling it as a secondary",
                mode.name()
            )))
        }
        Role::Secondary => {
            return Err(ApiError::bad(format!(
                "this cluster is already a {} secondary: use secondary/update-primary to change its primary",
                mode.name()
            )))
        }
        Role::Disabled => {}
    }
    if mode == Mode::Dr && st.repl.role(Mode::Performance) != Role::Disabled {
        return Err(ApiError::bad(
            "performance replication is enabled on this cluster: disable it before enabling it as a DR secondary",
        ));
    }
    let token = f.req_str("token")?;
    start_unwrap(ctx, st, req, mode, &f, &token, false)
}

fn start_unwrap(
    ctx: &mut Ctx,
    st: &mut ReplIo<'_>,
    req: &Request,
    mode: Mode,
    f: &Fields,
    token: &str,
    update: bool,
) -> ApiResult {
    if activation::is_encrypted_token(token) {
        let bundle = activation::decrypt(ctx, mode, token)?;
        st.local_activations.push(activation::LocalActivation {
            request: req.id,
            mode,
            update_primary: update,
            bundle,
        });
        return Ok(Reply::Pending);
    }
    let claims = activation::decode(token)
        .map_err(|e| ApiError::bad(format!("token: invalid activation token: {e}")))?;
    if claims.mode != mode {
        return Err(ApiError::bad(format!(
            "token: this activation token is for {} replication; use sys/replication/{}/secondary/{}",
            claims.mode.name(),
            claims.mode.name(),
            if update { "update-primary" } else { "enable" }
        )));
    }
    let addr = f
        .str("primary_api_addr")?
        .filter(|a| !a.is_empty())
        .unwrap_or(claims.addr);
    if addr.is_empty() {
        return Err(ApiError::bad(
            "token: the activation token names no primary API address; give primary_api_addr",
        ));
    }
    let addr = if addr.contains("://") {
        addr
    } else {
        format!("https://{addr}")
    };
    let call_id = st.repl.call_id();
    st.repl.calls.insert(
        call_id,
        Call::Unwrap {
            request: req.id,
            mode,
            update,
        },
    );
    st.outputs.push_back(Output::HttpCall(HttpCall {
        call_id,
        method: "POST".into(),
        url: format!("{}/v1/sys/wrapping/unwrap", addr.trim_end_matches('/')),
        body: serde_json::to_vec(&json!({ "token": token })).unwrap_or_default(),
        ca_file: f.str("ca_file")?.unwrap_or_default(),
        ca_path: f.str("ca_path")?.unwrap_or_default(),
    }));
    Ok(Reply::Pending)
}

fn promote(ctx: &mut Ctx, st: &mut ReplIo<'_>, req: &Request, mode: Mode) -> ApiResult {
    require_role(st, mode, Role::Secondary)?;
    let body = body_object(&req.body)?;
    let f = Fields(&body);
    if mode == Mode::Dr {
        super::dr_token::check_body(ctx, &body)?;
    }
    let force = f.bool("force")?.unwrap_or(false);
    // The safety check `force` skips: a secondary that has not finished its Merkle sync
    // holds an incomplete copy, and promoting it would lose what it has not fetched yet.
    let rt = st.repl.mode(mode);
    let syncing = st.repl.syncing(mode);
    if syncing && !force {
        return Err(ApiError::bad(format!(
            "this {} secondary has not finished synchronising with its primary (state {}, {} of {} keys fetched): promoting it now may lose data; wait until its state is stream-wals, or promote with force=true",
            mode.name(),
            secondary::state_name(rt),
            rt.sec.sync_done,
            rt.sec.sync_total
        )));
    }
    let addr = f
        .str("primary_cluster_addr")?
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| st.config.replication.cluster_addr.clone());
    if !addr.is_empty() {
        super::tls::check_cluster_addr("primary_cluster_addr", &addr)?;
    }
    // A DR secondary holds its former primary's records of its secondaries, its own among
    // them: it is not its own secondary.
    if let Some(own) = st
        .repl
        .mode(mode)
        .role
        .creds
        .as_ref()
        .map(|c| c.secondary_id.clone())
    {
        if mode == Mode::Dr && load_record(ctx, mode, &own)?.is_some() {
            ctx.delete(&record_key(mode, &own));
        }
    }
    {
        let rt = st.repl.mode_mut(mode);
        rt.role.role = Role::Primary;
        rt.role.creds = None;
        rt.role.primary_cluster_addr = addr.clone();
        rt.role.needs_sync = false;
        rt.role.filter = None;
        rt.sec = SecRt::default();
    }
    save_role(ctx, st, mode)?;
    if mode == Mode::Performance {
        let cid = mode_of(st, mode).cluster_id.clone();
        ctx.put_json(PERF_PRIMARY, &PerfPrimary { cluster_id: cid })?;
    } else if st.repl.role(Mode::Performance) == Role::Disabled {
        // Join the performance set of the former primary.
        if let Some(pp) = ctx.get_json::<PerfPrimary>(PERF_PRIMARY)? {
            let rt = st.repl.mode_mut(Mode::Performance);
            rt.role = RoleState {
                role: Role::Primary,
                cluster_id: pp.cluster_id,
                primary_cluster_addr: addr,
                ..Default::default()
            };
            rt.sec = SecRt::default();
            save_role(ctx, st, Mode::Performance)?;
        }
    }
    wal_activity(ctx, st)?;
    super::tls::ca_pem(ctx, true)?;
    super::announce_tls(ctx, st)?;
    if mode == Mode::Dr {
        return Ok(Reply::Envelope(json!({
            "progress": 0, "required": 0, "complete": true,
            "data": { "complete": true, "progress": 0, "required": 0 },
        })));
    }
    Ok(Reply::Empty)
}

fn secondary_disable(ctx: &mut Ctx, st: &mut ReplIo<'_>, req: &Request, mode: Mode) -> ApiResult {
    require_role(st, mode, Role::Secondary)?;
    if mode == Mode::Dr {
        super::dr_token::check_body(ctx, &body_object(&req.body)?)?;
    }
    {
        let rt = st.repl.mode_mut(mode);
        rt.role = RoleState::default();
        rt.sec = SecRt::default();
    }
    save_role(ctx, st, mode)?;
    wal_activity(ctx, st)?;
    Ok(Reply::Empty)
}

fn update_primary(ctx: &mut Ctx, st: &mut ReplIo<'_>, req: &Request, mode: Mode) -> ApiResult {
    require_role(st, mode, Role::Secondary)?;
    let body = body_object(&req.body)?;
    if mode == Mode::Dr {
        super::dr_token::check_body(ctx, &body)?;
    }
    let f = Fields(&body);
    let token = f.str("token")?;
    let addrs = f.list("update_primary_addrs")?.unwrap_or_default();
    match (token, addrs.is_empty()) {
        (Some(t), false) if !t.is_empty() => Err(ApiError::bad(
            "use either token or update_primary_addrs, not both",
        )),
        (Some(t), true) if t.is_empty() => {
            let rt = st.repl.mode_mut(mode);
            rt.role.creds = None;
            rt.sec = SecRt::default();
            save_role(ctx, st, mode)?;
            Ok(Reply::Empty)
        }
        (Some(t), _) if !t.is_empty() => start_unwrap(ctx, st, req, mode, &f, &t, true),
        (_, false) => {
            if mode_of(st, mode).creds.is_none() {
                return Err(ApiError::bad(
                    "update_primary_addrs: this secondary has no primary credential; use token",
                ));
            }
            // Pings go out as outputs; the first address to answer wins.
            secondary::ping(st, req.id, mode, addrs, 0);
            Ok(Reply::Pending)
        }
        _ => Err(ApiError::bad("token or update_primary_addrs is required")),
    }
}
