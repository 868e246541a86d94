//! The mount tables: secrets engines (`sys/mounts`) and auth methods (`sys/auth`).
//!
//! Replicated mounts live in `core/mounts` and `core/auth`; mounts enabled with `local`
//! live in `core/local-mounts` and `core/local-auth` (cluster-local class, never sent to
//! performance secondaries). A mount's data lives under `logical/<uuid>/` (secrets) or
//! `auth/<uuid>/` (auth methods), so one prefix holds everything a mount owns.

use crate::api::{body_object, ApiError, ApiResult, Fields, Method, Reply, Request};
use crate::crypto;
use crate::ctx::Ctx;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MountEntry {
    /// With trailing `/`, e.g. `secret/` or (auth) `ldap/`.
    pub path: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub description: String,
    pub uuid: String,
    pub accessor: String,
    pub local: bool,
    #[serde(default)]
    pub options: Map<String, Value>,
    #[serde(default)]
    pub default_lease_ttl: u64,
    #[serde(default)]
    pub max_lease_ttl: u64,
    /// The namespace the mount lives in (`""`: root; else its full path, e.g. `ns1/`, which
    /// is also the prefix of `path`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

impl MountEntry {
    /// Storage prefix of this mount's data.
    pub fn data_prefix(&self, auth: bool) -> String {
        if auth {
            format!("auth/{}/", self.uuid)
        } else {
            format!("logical/{}/", self.uuid)
        }
    }
    /// The KV version of a `kv` mount (2 when its options say `version: "2"`, else 1); 0
    /// for any other type.
    pub fn kv_version(&self) -> u8 {
        if self.kind != "kv" {
            return 0;
        }
        match self.options.get("version").and_then(Value::as_str) {
            Some("2") => 2,
            _ => 1,
        }
    }
    /// The name of the route table serving this mount: the type, except that a KV version 2
    /// mount is served by the `kv-v2` table.
    pub fn engine(&self) -> &str {
        if self.kv_version() == 2 {
            "kv-v2"
        } else {
            &self.kind
        }
    }
    fn api_view(&self) -> Value {
        // Built-in mounts have no options; an enabled one shows `{}` when it has none.
        let builtin = self.uuid == self.kind;
        json!({
            "type": self.kind,
            "description": self.description,
            "accessor": self.accessor,
            "uuid": self.uuid,
            "local": self.local,
            "seal_wrap": false,
            "external_entropy_access": false,
            "deprecation_status": "supported",
            "plugin_version": "",
            "running_plugin_version": format!("v{}+builtin.cairn", env!("CARGO_PKG_VERSION")),
            "running_sha256": "",
            "options": if builtin && self.options.is_empty() { Value::Null } else { Value::Object(self.options.clone()) },
            "config": {
                "default_lease_ttl": self.default_lease_ttl,
                "max_lease_ttl": self.max_lease_ttl,
                "force_no_cache": false,
            },
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Secrets,
    Auth,
}

impl Table {
    fn keys(self) -> (&'static str, &'static str) {
        match self {
            Table::Secrets => ("core/mounts", "core/local-mounts"),
            Table::Auth => ("core/auth", "core/local-auth"),
        }
    }
    fn known_types(self) -> &'static [&'static str] {
        match self {
            Table::Secrets => &["kv", "generic", "kv-v2"],
            Table::Auth => &["ldap"],
        }
    }
}

/// Built-in mounts every node has; they cannot be disabled or shadowed.
fn builtin(table: Table) -> Vec<MountEntry> {
    let mk = |path: &str, kind: &str, desc: &str| MountEntry {
        path: path.into(),
        kind: kind.into(),
        description: desc.into(),
        uuid: kind.into(),
        accessor: format!("{kind}_builtin"),
        local: false,
        options: Map::new(),
        default_lease_ttl: 0,
        max_lease_ttl: 0,
        namespace: String::new(),
    };
    match table {
        Table::Secrets => vec![mk(
            "sys/",
            "system",
            "system endpoints used for control, policy and debugging",
        )],
        Table::Auth => vec![mk("token/", "token", "token based credentials")],
    }
}

/// Every mount of a table (replicated and local), sorted by path.
pub fn all(ctx: &Ctx, table: Table) -> ApiResult<Vec<MountEntry>> {
    let (r, l) = table.keys();
    let mut v: Vec<MountEntry> = ctx.get_json(r)?.unwrap_or_default();
    v.extend(ctx.get_json::<Vec<MountEntry>>(l)?.unwrap_or_default());
    v.extend(builtin(table));
    v.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(v)
}

/// The mounts of a table that `req` may see: all of them, but for a request a performance
/// secondary forwarded to its primary, which sees only the replicated ones (the primary's
/// `local` mounts, like their data, stay in its cluster).
fn seen_by(ctx: &Ctx, req: &Request, table: Table) -> ApiResult<Vec<MountEntry>> {
    let mut v = all(ctx, table)?;
    if req.on_behalf.is_some() {
        v.retain(|m| !m.local);
    }
    Ok(v)
}

/// A request a performance secondary forwarded changes only a mount replicated to that
/// secondary (not one its paths filter leaves out), even where only the mount table
/// changes ([`crate::replication::forward::check_replicated_to`]).
fn check_forwarded(ctx: &Ctx, req: &Request, table: Table, m: &MountEntry) -> ApiResult<()> {
    match &req.on_behalf {
        Some(on) => {
            crate::replication::forward::check_replicated_to(ctx, on, m, table == Table::Auth)
        }
        None => Ok(()),
    }
}

/// The mount of namespace `ns` owning `path` (relative to `ns`), and the path inside it.
/// Built-in mounts belong to every namespace.
pub fn resolve_in(
    ctx: &Ctx,
    table: Table,
    ns: &str,
    path: &str,
) -> ApiResult<Option<(MountEntry, String)>> {
    if ns.is_empty() {
        return resolve(ctx, table, path);
    }
    let full = format!("{ns}{path}");
    let with_slash = format!("{full}/");
    let mut best: Option<MountEntry> = None;
    for m in all(ctx, table)? {
        let (mpath, hit) = if m.namespace == ns {
            (
                m.path.clone(),
                full.starts_with(&m.path) || with_slash == m.path,
            )
        } else if m.namespace.is_empty() && builtin(table).iter().any(|b| b.uuid == m.uuid) {
            (
                m.path.clone(),
                path.starts_with(&m.path) || format!("{path}/") == m.path,
            )
        } else {
            continue;
        };
        if hit && best.as_ref().is_none_or(|b| mpath.len() > b.path.len()) {
            best = Some(m);
        }
    }
    Ok(best.map(|m| {
        let inner = if m.namespace == ns {
            full.get(m.path.len()..).unwrap_or("").to_string()
        } else {
            path.get(m.path.len()..).unwrap_or("").to_string()
        };
        (m, inner)
    }))
}

/// The mount owning `path` (longest prefix match), and the path inside it.
pub fn resolve(ctx: &Ctx, table: Table, path: &str) -> ApiResult<Option<(MountEntry, String)>> {
    let with_slash = format!("{path}/");
    let mut best: Option<MountEntry> = None;
    for m in all(ctx, table)? {
        if (path.starts_with(&m.path) || with_slash == m.path)
            && best.as_ref().is_none_or(|b| m.path.len() > b.path.len())
        {
            best = Some(m);
        }
    }
    Ok(best.map(|m| {
        let rest = path.get(m.path.len()..).unwrap_or("").to_string();
        (m, rest)
    }))
}

fn normalize_path(p: &str) -> ApiResult<String> {
    let p = p.trim_matches('/');
    if p.is_empty() {
        return Err(ApiError::bad("path: a mount path is required"));
    }
    if p.len() > 256 || p.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
        return Err(ApiError::bad(format!("path: invalid mount path {p:?}")));
    }
    Ok(format!("{p}/"))
}

/// Adds a mount; refuses duplicates and paths that nest inside or around another mount.
pub fn enable(
    ctx: &mut Ctx,
    table: Table,
    path: &str,
    kind: &str,
    description: &str,
    local: bool,
    options: Map<String, Value>,
) -> ApiResult<MountEntry> {
    enable_in(ctx, table, "", path, kind, description, local, options)
}

/// [`enable`] in namespace `ns` (`""`: root): the entry's path is `ns` + `path`.
#[allow(clippy::too_many_arguments)]
pub fn enable_in(
    ctx: &mut Ctx,
    table: Table,
    ns: &str,
    path: &str,
    kind: &str,
    description: &str,
    local: bool,
    options: Map<String, Value>,
) -> ApiResult<MountEntry> {
    let rel = normalize_path(path)?;
    let path = format!("{ns}{rel}");
    // A mount path must not run into a namespace below `ns` (it could never be reached).
    let mut pre = ns.to_string();
    for seg in rel.trim_end_matches('/').split('/') {
        pre = format!("{pre}{seg}/");
        if crate::namespace::get(ctx, &pre)?.is_some() {
            return Err(ApiError::bad(format!(
                "path is already in use by the namespace {pre:?}"
            )));
        }
    }
    if !table.known_types().contains(&kind) {
        return Err(ApiError::bad(format!(
            "type: unknown {} type {kind:?}",
            match table {
                Table::Secrets => "secrets engine",
                Table::Auth => "auth method",
            }
        )));
    }
    for m in all(ctx, table)? {
        if path.starts_with(&m.path) || m.path.starts_with(&path) {
            return Err(ApiError::bad(format!(
                "path is already in use at {}",
                m.path
            )));
        }
    }
    if table == Table::Secrets
        && (rel.starts_with("auth/") || rel.starts_with("sys/") || rel == "auth/")
    {
        return Err(ApiError::bad(format!(
            "path: cannot mount under reserved path {path:?}"
        )));
    }
    let uuid = crypto::uuid(ctx.rng());
    let (kind, options) = kv_options(kind, options)?;
    let entry = MountEntry {
        path,
        // As the reference names them: `auth_ldap_1a2b3c4d`, `kv_1a2b3c4d`.
        accessor: match table {
            Table::Auth => format!("auth_{}_{}", kind, &uuid[..8]),
            Table::Secrets => format!("{}_{}", kind, &uuid[..8]),
        },
        kind,
        description: description.into(),
        uuid,
        local,
        options,
        default_lease_ttl: 0,
        max_lease_ttl: 0,
        namespace: ns.to_string(),
    };
    let (r, l) = table.keys();
    let key = if local { l } else { r };
    let mut v: Vec<MountEntry> = ctx.get_json(key)?.unwrap_or_default();
    v.push(entry.clone());
    v.sort_by(|a, b| a.path.cmp(&b.path));
    ctx.put_json(key, &v)?;
    Ok(entry)
}

/// The stored type and options of a new mount: `generic` and `kv-v2` are `kv` mounts (the
/// latter with `version: "2"`, as the reference shows it); a KV `options.version` is
/// normalised to a string and must be 1 or 2.
fn kv_options(
    kind: &str,
    mut options: Map<String, Value>,
) -> ApiResult<(String, Map<String, Value>)> {
    let kind = match kind {
        "generic" => "kv",
        "kv-v2" => {
            options.insert("version".into(), json!("2"));
            "kv"
        }
        k => k,
    };
    if kind == "kv" {
        if let Some(v) = options.get("version") {
            let v = version_option(v)?;
            options.insert("version".into(), json!(v));
        }
    }
    Ok((kind.to_string(), options))
}

/// A KV `options.version` value (`"2"`, `2`, `""`) as `"1"` or `"2"`; others are refused.
fn version_option(v: &Value) -> ApiResult<&'static str> {
    let s = match v {
        Value::String(s) => s.trim().to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => String::new(),
        _ => String::from("?"),
    };
    match s.as_str() {
        "" | "1" => Ok("1"),
        "2" => Ok("2"),
        other => Err(ApiError::bad(format!(
            "options.version: KV version {other:?} does not exist (1 or 2)"
        ))),
    }
}

/// Removes a mount and all of its data.
pub fn disable(ctx: &mut Ctx, table: Table, path: &str) -> ApiResult<()> {
    let path = normalize_path(path)?;
    if builtin(table).iter().any(|m| m.path == path) {
        return Err(ApiError::bad(format!(
            "cannot disable built-in mount {path:?}"
        )));
    }
    let (r, l) = table.keys();
    for key in [r, l] {
        let mut v: Vec<MountEntry> = ctx.get_json(key)?.unwrap_or_default();
        if let Some(i) = v.iter().position(|m| m.path == path) {
            let m = v.remove(i);
            ctx.put_json(key, &v)?;
            ctx.delete_prefix(&m.data_prefix(table == Table::Auth))?;
            return Ok(());
        }
    }
    // Disabling a path that is not mounted succeeds, as in the reference.
    Ok(())
}

/// The mount a `<path>/tune` request names (in namespace `ns`); 400 when there is none.
fn tuned_mount(ctx: &Ctx, req: &Request, table: Table, ns: &str, p: &str) -> ApiResult<MountEntry> {
    let path = normalize_path(p.strip_suffix("tune").unwrap_or(p))?;
    let full = format!("{ns}{path}");
    seen_by(ctx, req, table)?
        .into_iter()
        .find(|m| m.path == full && (m.namespace == ns || m.uuid == m.kind))
        .ok_or_else(|| {
            ApiError::bad(format!(
                "cannot fetch mount configuration: no mount at {path:?}"
            ))
        })
}

/// The answer to a `GET <mount>/tune`: lease TTLs (the system's when the mount has none).
fn tune_view(m: &MountEntry, table: Table) -> Value {
    let or_system = |t: u64| if t > 0 { t } else { crate::token::MAX_TTL };
    let mut v = json!({
        "default_lease_ttl": or_system(m.default_lease_ttl),
        "max_lease_ttl": or_system(m.max_lease_ttl),
        "description": m.description,
        "force_no_cache": false,
    });
    match table {
        Table::Auth => v["token_type"] = json!("default-service"),
        Table::Secrets if !m.options.is_empty() => v["options"] = Value::Object(m.options.clone()),
        Table::Secrets => {}
    }
    v
}

/// Applies `f` to the stored entry of the mount at `path` (a built-in one cannot be tuned).
fn tune(
    ctx: &mut Ctx,
    table: Table,
    path: &str,
    f: impl Fn(&mut MountEntry) -> ApiResult<()>,
) -> ApiResult<()> {
    let (r, l) = table.keys();
    for key in [r, l] {
        let mut v: Vec<MountEntry> = ctx.get_json(key)?.unwrap_or_default();
        if let Some(m) = v.iter_mut().find(|m| m.path == path) {
            f(m)?;
            ctx.put_json(key, &v)?;
            return Ok(());
        }
    }
    Err(ApiError::bad(format!(
        "cannot tune built-in mount {path:?}"
    )))
}

/// The lease TTLs of a new mount's `config` (`default_lease_ttl`, `max_lease_ttl`; 0 is the
/// system's), checked as a tune checks them. Its other settings are not kept.
fn config_ttls(config: Option<&Value>) -> ApiResult<(u64, u64)> {
    let c = match config {
        None | Some(Value::Null) => return Ok((0, 0)),
        Some(Value::Object(c)) => c,
        Some(_) => return Err(ApiError::bad("config: expected an object")),
    };
    let f = Fields(c);
    let ttl = |name: &str| {
        f.duration(name)
            .map(Option::unwrap_or_default)
            .map_err(|e| ApiError::bad(format!("config.{e}")))
    };
    let (default_ttl, max_ttl) = (ttl("default_lease_ttl")?, ttl("max_lease_ttl")?);
    let max = if max_ttl > 0 {
        max_ttl
    } else {
        crate::token::MAX_TTL
    };
    if default_ttl > max {
        return Err(ApiError::bad(
            "config.default_lease_ttl: cannot be longer than max_lease_ttl",
        ));
    }
    Ok((default_ttl, max_ttl))
}

/// The mounts of namespace `ns` (and the built-ins), by path relative to `ns`.
fn table_view(ctx: &Ctx, req: &Request, table: Table, ns: &str) -> ApiResult<Map<String, Value>> {
    let mut out = Map::new();
    let builtins: Vec<String> = builtin(table).into_iter().map(|m| m.path).collect();
    for m in seen_by(ctx, req, table)? {
        if m.namespace == ns {
            out.insert(m.path[ns.len()..].to_string(), m.api_view());
        } else if builtins.contains(&m.path) && m.namespace.is_empty() {
            out.insert(m.path.clone(), m.api_view());
        }
    }
    Ok(out)
}

/// `sys/mounts[/<path>]` and `sys/auth[/<path>]`.
pub fn handle(ctx: &mut Ctx, req: &Request, table: Table, rest: &str) -> ApiResult {
    let ns = crate::namespace::of(req);
    // `sys/mounts/auth/<path>/tune` is the auth method's tune (`bao auth tune` asks there).
    if table == Table::Secrets {
        if let Some(p) = rest.trim_matches('/').strip_prefix("auth/") {
            if p.ends_with("/tune") {
                return handle(ctx, req, Table::Auth, p);
            }
        }
    }
    match (req.method, rest.trim_matches('/')) {
        (Method::Get, "") => {
            let t = table_view(ctx, req, table, &ns)?;
            // The reference repeats the table at the top level for old clients.
            let mut env = t.clone();
            env.insert("data".into(), Value::Object(t));
            Ok(Reply::Envelope(Value::Object(env)))
        }
        (Method::Get, p) if p.ends_with("/tune") || p == "tune" => {
            let m = tuned_mount(ctx, req, table, &ns, p)?;
            Ok(Reply::Data(tune_view(&m, table)))
        }
        (Method::Post | Method::Put, p) if p.ends_with("/tune") => {
            let m = tuned_mount(ctx, req, table, &ns, p)?;
            check_forwarded(ctx, req, table, &m)?;
            let body = body_object(&req.body)?;
            let f = Fields(&body);
            let default_ttl = f.duration("default_lease_ttl")?;
            let max_ttl = f.duration("max_lease_ttl")?;
            let description = f.str("description")?;
            let options: Map<String, Value> = match body.get("options") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(o)) => o.clone(),
                Some(_) => return Err(ApiError::bad("options: expected an object")),
            };
            // A KV mount's version may go from 1 to 2 (its keys become version 1 of
            // themselves, in this request's write set), never back.
            let upgrade = match (m.kv_version(), options.get("version")) {
                (0, _) | (_, None) => false,
                (from, Some(v)) => match (from, version_option(v)?) {
                    (2, "1") => return Err(ApiError::bad("cannot downgrade mount from version 2")),
                    (1, "2") => true,
                    _ => false,
                },
            };
            tune(ctx, table, &m.path, |e| {
                for (k, v) in &options {
                    let v = match (k.as_str(), e.kind.as_str()) {
                        ("version", "kv") => json!(version_option(v)?),
                        _ => v.clone(),
                    };
                    e.options.insert(k.clone(), v);
                }
                if let Some(t) = default_ttl {
                    e.default_lease_ttl = t;
                }
                if let Some(t) = max_ttl {
                    e.max_lease_ttl = t;
                }
                if let Some(d) = &description {
                    e.description = d.clone();
                }
                let max = if e.max_lease_ttl > 0 {
                    e.max_lease_ttl
                } else {
                    crate::token::MAX_TTL
                };
                if e.default_lease_ttl > max {
                    return Err(ApiError::bad(
                        "default_lease_ttl: cannot be longer than max_lease_ttl",
                    ));
                }
                Ok(())
            })?;
            if upgrade {
                crate::kv2::upgrade(ctx, &m)?;
                return Ok(Reply::Envelope(json!({
                    "warnings": [format!(
                        "Upgrading mount {} from KV version 1 to version 2: its keys are now version 1 of themselves.",
                        m.path
                    )],
                })));
            }
            Ok(Reply::Empty)
        }
        (Method::Post | Method::Put, p) if !p.is_empty() => {
            let body = body_object(&req.body)?;
            let f = Fields(&body);
            f.only(&[
                "type",
                "description",
                "config",
                "options",
                "local",
                "seal_wrap",
                "plugin_name",
                "external_entropy_access",
                "plugin_version",
            ])?;
            let kind = f.req_str("type")?;
            let options: Map<String, Value> = match body.get("options") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(o)) => o.clone(),
                Some(_) => return Err(ApiError::bad("options: expected an object")),
            };
            let (default_ttl, max_ttl) = config_ttls(body.get("config"))?;
            let entry = enable_in(
                ctx,
                table,
                &ns,
                p,
                &kind,
                &f.str("description")?.unwrap_or_default(),
                f.bool("local")?.unwrap_or(false),
                options,
            )?;
            if (default_ttl, max_ttl) != (0, 0) {
                // In the enable's write set: the mount is stored with its TTLs or not at all.
                tune(ctx, table, &entry.path, |e| {
                    e.default_lease_ttl = default_ttl;
                    e.max_lease_ttl = max_ttl;
                    Ok(())
                })?;
            }
            Ok(Reply::Empty)
        }
        (Method::Get, p) => {
            let path = normalize_path(p)?;
            let full = format!("{ns}{path}");
            all(ctx, table)?
                .into_iter()
                .find(|m| m.path == full && m.namespace == ns)
                .map(|m| Reply::Data(m.api_view()))
                .ok_or_else(|| ApiError::bad(format!("no mount at {path:?}")))
        }
        (Method::Delete, p) if !p.is_empty() => {
            let full = format!("{ns}{}", normalize_path(p)?);
            if let Some(m) = seen_by(ctx, req, table)?.iter().find(|m| m.path == full) {
                check_forwarded(ctx, req, table, m)?;
            }
            disable(ctx, table, &full)?;
            Ok(Reply::Empty)
        }
        _ => Err(ApiError::MethodNotAllowed),
    }
}

/// Moves the mount at `from` to `to` (both full paths, namespace included, with their
/// trailing `/`; `to` in namespace `to_ns`): only the table entry changes, as a mount's data
/// lives under its uuid. Refuses a built-in mount, an unknown one, and a target in use
/// (overlapping another mount, a namespace, or a reserved path). Returns the moved entry.
pub(crate) fn rename(
    ctx: &mut Ctx,
    table: Table,
    from: &str,
    to: &str,
    to_ns: &str,
) -> ApiResult<MountEntry> {
    if builtin(table)
        .iter()
        .any(|m| m.path == from || m.path == to)
    {
        return Err(ApiError::bad(format!(
            "cannot move built-in mount {from:?} or onto one"
        )));
    }
    let rel = to.get(to_ns.len()..).unwrap_or(to);
    if table == Table::Secrets && (rel.starts_with("auth/") || rel.starts_with("sys/")) {
        return Err(ApiError::bad(format!(
            "path: cannot mount under reserved path {to:?}"
        )));
    }
    let mut pre = to_ns.to_string();
    for seg in rel.trim_end_matches('/').split('/') {
        pre = format!("{pre}{seg}/");
        if crate::namespace::get(ctx, &pre)?.is_some() {
            return Err(ApiError::bad(format!(
                "path is already in use by the namespace {pre:?}"
            )));
        }
    }
    for m in all(ctx, table)? {
        if to.starts_with(&m.path) || m.path.starts_with(to) {
            return Err(ApiError::bad(format!(
                "path already in use at {:?}",
                m.path
            )));
        }
    }
    let (r, l) = table.keys();
    for key in [r, l] {
        let mut v: Vec<MountEntry> = ctx.get_json(key)?.unwrap_or_default();
        if let Some(m) = v.iter_mut().find(|m| m.path == from) {
            m.path = to.to_string();
            m.namespace = to_ns.to_string();
            let moved = m.clone();
            v.sort_by(|a, b| a.path.cmp(&b.path));
            ctx.put_json(key, &v)?;
            return Ok(moved);
        }
    }
    Err(ApiError::bad(format!("no matching mount at {from:?}")))
}

/// A mount path as the API takes it (no leading `/`, one trailing `/`); 400 when invalid.
pub(crate) fn mount_path(p: &str) -> ApiResult<String> {
    normalize_path(p)
}

/// `sys/internal/ui/mounts[/<path>]`: the mounts the caller may use (both tables), or the
/// mount owning `<path>` with its `path` (the reference's CLI asks this before every `kv`
/// command to learn the KV version). A caller without root sees a mount when its policies
/// grant something on the mount's own path; an unknown or hidden mount is a 403, as in the
/// reference.
pub fn ui_mounts(
    ctx: &Ctx,
    req: &Request,
    rest: &str,
    caller: Option<&crate::token::Caller>,
) -> ApiResult {
    if req.method != Method::Get {
        return Err(ApiError::MethodNotAllowed);
    }
    let caller = caller.ok_or(ApiError::PermissionDenied)?;
    let ns = crate::namespace::of(req);
    let tns = caller.entry.namespace.clone();
    let acl = crate::sys::acl_for_in(ctx, &tns, &caller.entry.policies)?;
    let visible = |rel: &str, table: Table| {
        let p = match table {
            Table::Secrets => rel.to_string(),
            Table::Auth => format!("auth/{rel}"),
        };
        acl.any_under(&format!("{}{p}", &ns[tns.len().min(ns.len())..]))
    };
    let path = rest.trim_matches('/');
    if path.is_empty() {
        let mut data = Map::new();
        for (key, table) in [("secret", Table::Secrets), ("auth", Table::Auth)] {
            let t: Map<String, Value> = table_view(ctx, req, table, &ns)?
                .into_iter()
                .filter(|(rel, _)| visible(rel, table))
                .collect();
            data.insert(key.into(), Value::Object(t));
        }
        return Ok(Reply::Data(Value::Object(data)));
    }
    let (table, inner) = match path.strip_prefix("auth/") {
        Some(p) => (Table::Auth, p),
        None => (Table::Secrets, path),
    };
    // A token that reaches nothing there is refused as on any other path; one that could
    // reach the path gets the reference's message when no mount (or one it may not see)
    // owns it.
    let asked = format!("{}{path}/", &ns[tns.len().min(ns.len())..]);
    let missing = || {
        if acl.any_under(&asked) {
            ApiError::Forbidden(format!(
                "preflight capability check returned 403, please ensure client's policies grant access to path \"{path}/\""
            ))
        } else {
            ApiError::PermissionDenied
        }
    };
    let (m, _) = resolve_in(ctx, table, &ns, inner)?.ok_or_else(missing)?;
    let rel = m.path[m.namespace.len()..].to_string();
    if !visible(&rel, table) {
        return Err(missing());
    }
    let mut v = m.api_view();
    v["path"] = json!(rel);
    Ok(Reply::Data(v))
}

#[cfg(test)]
mod tests {
    //! Tune, rewrap and OpenBao's generate-root path, driven through a dev node.

    use crate::api::{Method, Request, Response};
    use crate::node::Node;
    use crate::storage::MemStorage;
    use serde_json::{json, Value};

    fn call(n: &mut Node<MemStorage>, id: u64, m: Method, path: &str, body: Value) -> Response {
        let mut req = Request::new(id, m, path).with_token("root").with_json(body);
        if path == "sys/wrapping/wrap" {
            req.wrap_ttl = Some("5m".into());
        }
        crate::node::tests::call(n, 2_000, req)
    }

    fn data(r: &Response) -> Value {
        r.body.as_ref().expect("body")["data"].clone()
    }

    #[test]
    fn mounts_and_auth_methods_are_tuned_and_read_back() {
        let mut n = Node::dev_in_memory([3; 32], "root");
        let r = call(&mut n, 1, Method::Get, "sys/mounts/secret/tune", json!({}));
        assert_eq!(r.status, 200);
        assert_eq!(data(&r)["default_lease_ttl"], crate::token::MAX_TTL);
        let r = call(
            &mut n,
            2,
            Method::Post,
            "sys/mounts/secret/tune",
            json!({"default_lease_ttl": "1h", "max_lease_ttl": "2h", "description": "d"}),
        );
        assert_eq!(r.status, 204, "{:?}", r.body);
        let d = data(&call(
            &mut n,
            3,
            Method::Get,
            "sys/mounts/secret/tune",
            json!({}),
        ));
        assert_eq!(
            (d["default_lease_ttl"].clone(), d["max_lease_ttl"].clone()),
            (json!(3600), json!(7200))
        );
        assert_eq!(d["description"], "d");
        // Not a new mount at `secret/tune/`.
        let m = call(&mut n, 4, Method::Get, "sys/mounts", json!({}));
        assert!(data(&m).get("secret/tune/").is_none());
        let r = call(
            &mut n,
            5,
            Method::Post,
            "sys/mounts/secret/tune",
            json!({"default_lease_ttl": "3h"}),
        );
        assert_eq!(r.status, 400, "default over max");
        let r = call(
            &mut n,
            6,
            Method::Post,
            "sys/mounts/secret/tune",
            json!({"max_lease_ttl": "x"}),
        );
        assert_eq!(r.status, 400);
        let r = call(&mut n, 7, Method::Get, "sys/mounts/nothere/tune", json!({}));
        assert_eq!(r.status, 400);
        let r = call(&mut n, 8, Method::Get, "sys/auth/token/tune", json!({}));
        assert_eq!(data(&r)["token_type"], "default-service");
        let r = call(
            &mut n,
            9,
            Method::Post,
            "sys/auth/ldap/tune",
            json!({"default_lease_ttl": "30m"}),
        );
        assert_eq!(r.status, 204, "{:?}", r.body);
        let d = data(&call(&mut n, 10, Method::Get, "sys/auth/ldap", json!({})));
        assert_eq!(d["config"]["default_lease_ttl"], 1800);
        assert_eq!(d["options"], json!({}));
        assert_eq!(d["deprecation_status"], "supported");
    }

    /// A new mount's `config` TTLs are kept (an LDAP mount's bound its logins' tokens), and
    /// a bad `config` refuses the mount: nothing is enabled.
    #[test]
    fn a_new_mounts_config_ttls_are_kept_or_refuse_the_mount() {
        let mut n = Node::dev_in_memory([5; 32], "root");
        let cfg = json!({"default_lease_ttl": "1h", "max_lease_ttl": 7200});
        for (id, (enable, tune)) in [
            ("sys/mounts/kv9", "sys/mounts/kv9/tune"),
            ("sys/auth/ldap9", "sys/auth/ldap9/tune"),
        ]
        .into_iter()
        .enumerate()
        {
            let kind = if enable.starts_with("sys/auth") {
                "ldap"
            } else {
                "kv"
            };
            let id = 10 * id as u64;
            let r = call(
                &mut n,
                id + 1,
                Method::Post,
                enable,
                json!({"type": kind, "config": cfg}),
            );
            assert_eq!(r.status, 204, "{:?}", r.body);
            let d = data(&call(&mut n, id + 2, Method::Get, tune, json!({})));
            assert_eq!(
                (d["default_lease_ttl"].clone(), d["max_lease_ttl"].clone()),
                (json!(3600), json!(7200)),
                "{enable}"
            );
        }
        for (id, config) in [
            json!({"default_lease_ttl": "3h", "max_lease_ttl": "1h"}),
            json!({"default_lease_ttl": "-5s"}),
            json!({"max_lease_ttl": "zzz"}),
            json!({"default_lease_ttl": "9999h"}),
            json!("not an object"),
        ]
        .into_iter()
        .enumerate()
        {
            let id = 100 + 2 * id as u64;
            let r = call(
                &mut n,
                id,
                Method::Post,
                "sys/mounts/bad",
                json!({"type": "kv", "config": config}),
            );
            assert_eq!(r.status, 400, "{config}: {:?}", r.body);
            let e = r.body.expect("body")["errors"][0].to_string();
            assert!(e.contains("config"), "{e}");
            let m = call(&mut n, id + 1, Method::Get, "sys/mounts", json!({}));
            assert!(data(&m).get("bad/").is_none(), "{config}");
        }
    }

    #[test]
    fn ui_mounts_list_both_tables_and_name_the_mount_of_a_path() {
        let mut n = Node::dev_in_memory([7; 32], "root");
        let d = data(&call(
            &mut n,
            1,
            Method::Get,
            "sys/internal/ui/mounts",
            json!({}),
        ));
        assert!(
            d["secret"]["secret/"].is_object() && d["auth"]["token/"].is_object(),
            "{d}"
        );
        let d = data(&call(
            &mut n,
            2,
            Method::Get,
            "sys/internal/ui/mounts/secret/a/b",
            json!({}),
        ));
        assert_eq!(
            (d["path"].clone(), d["type"].clone()),
            (json!("secret/"), json!("kv"))
        );
        let d = data(&call(
            &mut n,
            3,
            Method::Get,
            "sys/internal/ui/mounts/auth/ldap",
            json!({}),
        ));
        assert_eq!(d["type"], "ldap");
        let r = call(
            &mut n,
            4,
            Method::Get,
            "sys/internal/ui/mounts/nothere",
            json!({}),
        );
        assert_eq!(r.status, 403);
    }

    #[test]
    fn rewrap_moves_the_response_to_a_new_token() {
        let mut n = Node::dev_in_memory([4; 32], "root");
        let r = call(
            &mut n,
            1,
            Method::Post,
            "sys/wrapping/wrap",
            json!({"a": 1}),
        );
        let info = r.body.unwrap()["wrap_info"].clone();
        assert!(info.get("wrapped_accessor").is_none(), "{info}");
        let old = info["token"].as_str().unwrap().to_string();
        let r = call(
            &mut n,
            2,
            Method::Post,
            "sys/wrapping/rewrap",
            json!({"token": old}),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
        let new = r.body.unwrap()["wrap_info"]["token"]
            .as_str()
            .unwrap()
            .to_string();
        assert_ne!(new, old);
        let r = call(
            &mut n,
            3,
            Method::Post,
            "sys/wrapping/unwrap",
            json!({"token": old}),
        );
        assert_eq!(r.status, 400);
        let r = call(
            &mut n,
            4,
            Method::Post,
            "sys/wrapping/unwrap",
            json!({"token": new}),
        );
        assert_eq!(data(&r)["a"], 1);
    }

    #[test]
    fn openbao_generate_root_token_path_answers_in_the_envelope() {
        let mut n = Node::dev_in_memory([5; 32], "root");
        let r = call(
            &mut n,
            1,
            Method::Get,
            "sys/generate-root-token/attempt",
            json!({}),
        );
        assert_eq!(r.status, 200);
        let d = data(&r);
        assert_eq!(d["started"], false);
        assert_eq!(d["otp"], "");
        assert!(
            d.get("nonce").is_none() && d.get("encoded_root_token").is_none(),
            "{d}"
        );
        let r = call(
            &mut n,
            2,
            Method::Put,
            "sys/generate-root-token/attempt",
            json!({}),
        );
        assert!(data(&r)["nonce"].is_string());
        // The Vault path still answers with the bare object.
        let r = call(
            &mut n,
            3,
            Method::Get,
            "sys/generate-root/attempt",
            json!({}),
        );
        assert_eq!(r.body.unwrap()["started"], true);
    }
}
