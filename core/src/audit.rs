//! Audit devices: `sys/audit/<name>` (type `file`) and `sys/audit-hash/<name>`.
//!
//! A device's configuration (with a random per-device HMAC key drawn from the node RNG) is
//! stored under `core/audit/<name>` through the barrier. For every API request the node
//! asks [`on_request`] to log a `request` entry and, once the response exists,
//! [`on_response`] to log a `response` entry, one JSON line each, handed to the shell as
//! [`Output::Audit`]. Every string leaf of request data and response data/auth (tokens,
//! accessors, passwords, bindpass, key shares, wrap tokens…) is replaced by
//! `hmac-sha256:<hex>` under the device key, as the reference does by default. The shell
//! appends the lines before it commits the batch and fails the batch closed when it cannot.
//!
//! A device's options are the reference's file device's ([`FileOptions`]): `file_path`
//! (or `path`), `mode`, `format` (`json` only: `jsonx` is refused), `prefix`, `log_raw`,
//! `hmac_accessor`, `elide_list_responses`. They are checked when the device is enabled
//! (an unknown option or a bad value is a 400; the reference ignores unknown ones) and
//! stored as strings, as the reference keeps them.
//!
//! Enabling a device first asks the shell to open its file ([`Output::AuditProbe`]); the
//! device is stored only when that works, and a file that cannot be opened is refused
//! with 400. A device that fails later is reported by the shell
//! ([`crate::node::Node::audit_device_failed`]) and [`DeviceHealth`] remembers it for
//! [`RETRY_MS`]: meanwhile requests are recorded by the devices that still work, and when
//! none does, requests are refused (500), as the reference does, except the routes the
//! route table exempts: health and seal status are never audited, and the `sys/audit`
//! routes that remove or repair a device are audited on a best-effort basis, so a root
//! token can always undo a bad device.

use crate::api::{self, ApiError, ApiResult, Method, Reply, Request, RequestId, Response};
use crate::ctx::Ctx;
use crate::node::Output;
use crate::routes;
use crate::{crypto, time, token};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, VecDeque};

/// Storage prefix of device configurations.
pub const PREFIX: &str = "core/audit/";

/// How long a device that failed is skipped before it is tried again.
pub const RETRY_MS: u64 = 1_000;

/// In-memory state of the devices: which failed lately, and enables waiting for their
/// file to be opened.
#[derive(Clone, Debug, Default)]
pub struct DeviceHealth {
    /// file path → (skip until, why it failed).
    failing: BTreeMap<String, (u64, String)>,
    /// Request id → (storage key, device) of an enable waiting for its probe.
    probes: BTreeMap<RequestId, (String, Device)>,
}

impl DeviceHealth {
    /// Records that writing to `file_path` failed at `now`.
    pub fn failed(&mut self, file_path: &str, error: &str, now: u64) {
        self.failing.insert(
            file_path.to_string(),
            (now.saturating_add(RETRY_MS), error.to_string()),
        );
    }
    fn failing(&self, file_path: &str, now: u64) -> Option<&str> {
        self.failing
            .get(file_path)
            .filter(|(until, _)| *until > now)
            .map(|(_, e)| e.as_str())
    }
}

/// One configured audit device.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Device {
    pub path: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub description: String,
    pub local: bool,
    pub options: Map<String, Value>,
    /// Hex HMAC key (never shown by the API).
    pub hmac_key: String,
}

/// The options of a file audit device, as the reference's `file` device reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileOptions {
    pub file_path: String,
    /// The file's permission bits: it is created with them and set to them when the device
    /// is enabled. 0 (`"0000"`) leaves an existing file's mode alone (a new file gets 0600).
    pub mode: u32,
    /// Written before each line's JSON.
    pub prefix: String,
    /// Log values as they are instead of their HMACs.
    pub log_raw: bool,
    /// HMAC token accessors (when false they are logged as they are; tokens stay hashed).
    pub hmac_accessor: bool,
    /// In a list's response entry, `keys` and `key_info` become their number of entries.
    pub elide_list_responses: bool,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            file_path: String::new(),
            mode: 0o600,
            prefix: String::new(),
            log_raw: false,
            hmac_accessor: true,
            elide_list_responses: false,
        }
    }
}

/// The options a file device knows (`path` is the reference's older name of `file_path`).
const KNOWN_OPTIONS: [&str; 8] = [
    "file_path",
    "path",
    "mode",
    "format",
    "prefix",
    "log_raw",
    "hmac_accessor",
    "elide_list_responses",
];

/// A boolean option as Go's `strconv.ParseBool` reads it (the reference's), or a JSON bool.
fn option_bool(name: &str, v: &Value) -> ApiResult<bool> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::String(s) => match s.as_str() {
            "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
            "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
            _ => Err(ApiError::bad(format!(
                "options.{name}: {s:?} is not a boolean; use \"true\" or \"false\""
            ))),
        },
        _ => Err(ApiError::bad(format!(
            "options.{name}: expected \"true\" or \"false\", got {v}"
        ))),
    }
}

/// `mode`: octal permission bits (a string such as `"0640"`; a JSON number is read the same
/// way, as the reference reads it, `640` as 0640). Read and write bits only: an audit file
/// is not executable, and set-id and sticky bits are refused too.
fn option_mode(v: &Value) -> ApiResult<u32> {
    let text = match v {
        Value::String(s) => s.clone(),
        Value::Number(n) if n.is_u64() => n.to_string(),
        _ => {
            return Err(ApiError::bad(format!(
                "options.mode: expected an octal mode such as \"0600\", got {v}"
            )))
        }
    };
    let bad = || {
        ApiError::bad(format!(
            "options.mode: {text:?} is not an octal file mode; use read and write bits \
             only, such as \"0600\" or \"0640\" (\"0000\" leaves the file's mode alone)"
        ))
    };
    if text.is_empty() || text.len() > 4 || !text.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return Err(bad());
    }
    let mode = u32::from_str_radix(&text, 8).map_err(|_| bad())?;
    if mode & !0o666 != 0 {
        return Err(bad());
    }
    Ok(mode)
}

/// Checks a file device's `options`: the settings, and the options to store (every value
/// a string, `file_path` set).
pub fn parse_options(options: &Map<String, Value>) -> ApiResult<(FileOptions, Map<String, Value>)> {
    if let Some(k) = options
        .keys()
        .find(|k| !KNOWN_OPTIONS.contains(&k.as_str()))
    {
        return Err(ApiError::bad(format!(
            "options: {k:?} is not an option of a file audit device (known: {})",
            KNOWN_OPTIONS.join(", ")
        )));
    }
    let text = |name: &str| -> ApiResult<Option<String>> {
        match options.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(ApiError::bad(format!(
                "options.{name}: expected a string, got {v}"
            ))),
        }
    };
    let file_path = match text("file_path")? {
        Some(p) => Some(p),
        None => text("path")?,
    }
    .filter(|p| !p.is_empty())
    .ok_or_else(|| ApiError::bad("options.file_path: required for a file audit device"))?;
    if file_path == "stdout" || file_path == "discard" || !file_path.starts_with('/') {
        return Err(ApiError::bad(
            "options.file_path: must be an absolute path to a file",
        ));
    }
    match text("format")?.as_deref() {
        None | Some("json") => {}
        Some("jsonx") => {
            return Err(ApiError::bad(
                "options.format: \"jsonx\" (XML) is not supported by this server; use \"json\"",
            ))
        }
        Some(f) => {
            return Err(ApiError::bad(format!(
                "options.format: unknown format type {f:?}; use \"json\""
            )))
        }
    }
    let mut o = FileOptions {
        file_path,
        prefix: text("prefix")?.unwrap_or_default(),
        ..FileOptions::default()
    };
    let mut stored = Map::new();
    for (k, v) in options {
        let v = match (k.as_str(), v) {
            (_, Value::Null) => continue,
            ("mode", v) => {
                o.mode = option_mode(v)?;
                format!("{:04o}", o.mode)
            }
            ("log_raw" | "hmac_accessor" | "elide_list_responses", v) => {
                let b = option_bool(k, v)?;
                match k.as_str() {
                    "log_raw" => o.log_raw = b,
                    "hmac_accessor" => o.hmac_accessor = b,
                    _ => o.elide_list_responses = b,
                }
                b.to_string()
            }
            (_, Value::String(s)) => s.clone(),
            (_, v) => v.to_string(),
        };
        stored.insert(k.clone(), Value::String(v));
    }
    stored.insert("file_path".into(), json!(o.file_path));
    Ok((o, stored))
}

impl Device {
    fn file_path(&self) -> String {
        self.options
            .get("file_path")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    }
    /// The device's settings. Its options were checked when it was enabled; a device
    /// stored before they were (whose options may not parse) keeps the defaults, which
    /// hash every value, as it did then.
    fn settings(&self) -> FileOptions {
        parse_options(&self.options)
            .map(|(o, _)| o)
            .unwrap_or_else(|_| FileOptions {
                file_path: self.file_path(),
                ..FileOptions::default()
            })
    }
    fn key(&self) -> Vec<u8> {
        hex::decode(&self.hmac_key).unwrap_or_default()
    }
    fn public(&self) -> Value {
        json!({
            "path": format!("{}/", self.path),
            "type": self.kind,
            "description": self.description,
            "local": self.local,
            "options": self.options,
        })
    }
}

/// The device a request's entries go to, captured when the request arrives.
#[derive(Debug, Clone)]
pub struct Sink {
    pub file_path: String,
    pub key: Vec<u8>,
    pub options: FileOptions,
}

impl Sink {
    /// A value as this device logs it: its HMAC, or itself with `log_raw`.
    fn hash(&self, s: &str) -> String {
        if self.options.log_raw {
            s.to_string()
        } else {
            hash(&self.key, s)
        }
    }
    /// An accessor as this device logs it (as itself with `hmac_accessor` false).
    fn accessor(&self, s: &str) -> String {
        if self.options.hmac_accessor {
            self.hash(s)
        } else {
            s.to_string()
        }
    }
    fn leaves(&self, v: &Value) -> Value {
        if self.options.log_raw {
            v.clone()
        } else {
            hash_leaves(&self.key, v)
        }
    }
    /// `auth` or `wrap_info` of a response, with its accessors as this device logs them.
    fn auth(&self, v: &Value, wrap_info: bool) -> Value {
        let mut out = match (self.options.log_raw, wrap_info) {
            (true, _) => v.clone(),
            (false, true) => hash_leaves(&self.key, v),
            (false, false) => hash_auth(&self.key, v),
        };
        if !self.options.hmac_accessor {
            for k in ["accessor", "wrapped_accessor"] {
                if let (Some(x), Some(Value::String(_))) = (out.get_mut(k), v.get(k)) {
                    *x = v[k].clone();
                }
            }
        }
        out
    }
    /// A line of this device: its prefix, then the entry's JSON.
    fn line(&self, entry: &Value) -> String {
        format!("{}{entry}", self.options.prefix)
    }
}

/// With `elide_list_responses`, a list's response data: `keys` and `key_info` replaced by
/// their number of entries (the reference's eliding).
fn elide_list(data: &Value) -> Value {
    let mut out = data.clone();
    for k in ["keys", "key_info"] {
        let n = match data.get(k) {
            Some(Value::Array(a)) => a.len(),
            Some(Value::Object(m)) => m.len(),
            _ => continue,
        };
        out[k] = json!(n);
    }
    out
}

/// What the response entry repeats from the request entry.
#[derive(Debug, Clone)]
pub struct Started {
    /// Whether a failure to record refuses the request (the route's audit class).
    pub required: bool,
    pub sinks: Vec<Sink>,
    pub request: Value,
    /// `auth` of the request entry, per sink (hmacs differ per key).
    pub auth: Vec<Value>,
    pub request_data: Vec<Value>,
}

/// `hmac-sha256:<hex>` of a value under a device key.
pub fn hash(key: &[u8], s: &str) -> String {
    format!(
        "hmac-sha256:{}",
        hex::encode(crypto::hmac_sha256(key, s.as_bytes()))
    )
}

/// Replaces every string leaf with its hmac.
fn hash_leaves(key: &[u8], v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(hash(key, s)),
        Value::Array(a) => Value::Array(a.iter().map(|x| hash_leaves(key, x)).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), hash_leaves(key, x)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// `auth` of a response: tokens, accessors and metadata hashed; policies and types kept.
fn hash_auth(key: &[u8], v: &Value) -> Value {
    let Value::Object(m) = v else {
        return v.clone();
    };
    let keep = [
        "policies",
        "token_policies",
        "identity_policies",
        "token_type",
        "lease_duration",
        "renewable",
        "orphan",
        "num_uses",
        "entity_id",
        "mfa_requirement",
    ];
    Value::Object(
        m.iter()
            .map(|(k, x)| {
                let x = if keep.contains(&k.as_str()) {
                    x.clone()
                } else {
                    hash_leaves(key, x)
                };
                (k.clone(), x)
            })
            .collect(),
    )
}

fn operation(m: Method) -> &'static str {
    match m {
        Method::Get => "read",
        Method::List => "list",
        Method::Put | Method::Post => "update",
        Method::Delete => "delete",
        Method::Patch => "patch",
    }
}

/// Every configured device (none while sealed or when storage cannot be read).
pub fn devices(ctx: &Ctx) -> Vec<Device> {
    let Ok(keys) = ctx.keys(PREFIX) else {
        return Vec::new();
    };
    keys.iter()
        .filter_map(|k| ctx.get_json::<Device>(k).ok().flatten())
        .collect()
}

/// Logs the request entry to every working device; returns what the response entry needs.
/// Refuses the request when it must be recorded and every device is failing.
pub fn on_request(
    ctx: &mut Ctx,
    health: &DeviceHealth,
    outputs: &mut Vec<Output>,
    req: &Request,
    mode: routes::Audit,
) -> ApiResult<Option<Started>> {
    if ctx.barrier.sealed() || mode == routes::Audit::Skip {
        return Ok(None);
    }
    let all = devices(ctx);
    if all.is_empty() {
        return Ok(None);
    }
    let required = mode == routes::Audit::Required;
    let mut why = Vec::new();
    let devs: Vec<Device> = all
        .into_iter()
        .filter(|d| match health.failing(&d.file_path(), ctx.now) {
            Some(e) => {
                why.push(format!("{}: {e}", d.path));
                false
            }
            None => true,
        })
        .collect();
    if devs.is_empty() {
        if required {
            return Err(ApiError::Internal(format!(
                "no audit device can record this request, so it is refused ({}); failed \
                 devices are tried again every second, and a root token can still disable or \
                 re-enable a device at sys/audit/<name>",
                why.join("; ")
            )));
        }
        return Ok(None);
    }
    // A request a performance secondary forwarded is audited as its caller's.
    let entry = match &req.on_behalf {
        Some(on) => Some(("", on.entry())),
        None => req
            .token
            .as_deref()
            .filter(|t| !t.is_empty())
            .and_then(|t| token::lookup(ctx, t).ok().flatten().map(|(_, e)| (t, e))),
    };
    let data: Value = if req.body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&req.body).unwrap_or(Value::Null)
    };
    let request = json!({
        "id": format!("{:08x}-0000-4000-8000-{:012x}", req.id >> 48, req.id & 0xffff_ffff_ffff),
        "operation": operation(req.method),
        "namespace": {"id": "root"},
        "path": req.path,
        "remote_address": req.remote_addr,
        "wrap_ttl": req.wrap_ttl.as_deref().and_then(|t| time::parse_duration(t).ok()).unwrap_or(0),
    });
    let now = time::rfc3339(ctx.now);
    let mut st = Started {
        required,
        sinks: Vec::new(),
        request,
        auth: Vec::new(),
        request_data: Vec::new(),
    };
    for d in devs {
        let sink = Sink {
            file_path: d.file_path(),
            key: d.key(),
            options: d.settings(),
        };
        let mut auth = json!({});
        let mut request = st.request.clone();
        if let Some(t) = req.token.as_deref().filter(|t| !t.is_empty()) {
            request["client_token"] = json!(sink.hash(t));
        }
        if let Some((_, e)) = &entry {
            auth = json!({
                "client_token": request["client_token"],
                "accessor": sink.accessor(&e.accessor),
                "display_name": e.display_name,
                "policies": e.policies,
                "token_policies": e.policies,
                "metadata": sink.leaves(&json!(e.meta)),
                "token_type": if e.kind.is_empty() { "service" } else { e.kind.as_str() },
                "token_ttl": e.ttl,
            });
            request["client_token_accessor"] = json!(sink.accessor(&e.accessor));
        }
        let hdata = sink.leaves(&data);
        if !hdata.is_null() {
            request["data"] = hdata.clone();
        }
        let line = json!({
            "time": now,
            "type": "request",
            "auth": auth,
            "request": request,
        });
        outputs.push(Output::Audit {
            file_path: sink.file_path.clone(),
            mode: sink.options.mode,
            line: sink.line(&line),
            required,
        });
        st.sinks.push(sink);
        st.auth.push(auth);
        st.request_data.push(hdata);
    }
    Ok(Some(st))
}

/// Logs the response entry for a request logged by [`on_request`]. `note` is what the
/// server knows of a failure and the client is not told (why a directory refused a login):
/// it follows the client's error text in parentheses in the entry's `error`.
pub fn on_response(
    st: &Started,
    resp: &Response,
    note: Option<&str>,
    now: u64,
    outputs: &mut Vec<Output>,
) {
    let now = time::rfc3339(now);
    let body = resp.body.as_ref();
    let mut error = body
        .and_then(|b| b.get("errors"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default();
    let no_error = error.is_empty();
    if let Some(n) = note.filter(|_| !no_error) {
        error = format!("{error} ({n})");
    }
    let list = st.request.get("operation") == Some(&json!("list"));
    for (i, s) in st.sinks.iter().enumerate() {
        let mut request = st.request.clone();
        if let Some(Value::String(t)) = st.auth.get(i).and_then(|a| a.get("client_token")) {
            request["client_token"] = json!(t);
        }
        if let Some(d) = st.request_data.get(i).filter(|d| !d.is_null()) {
            request["data"] = d.clone();
        }
        let mut response = json!({ "status": resp.status });
        let data = |x: &Value| {
            if list && s.options.elide_list_responses {
                s.leaves(&elide_list(x))
            } else {
                s.leaves(x)
            }
        };
        match body {
            Some(b) if no_error => {
                let envelope = b.get("request_id").is_some();
                if envelope {
                    if let Some(x) = b.get("data").filter(|x| !x.is_null()) {
                        response["data"] = data(x);
                    }
                    if let Some(x) = b.get("wrap_info").filter(|x| !x.is_null()) {
                        response["wrap_info"] = s.auth(x, true);
                    }
                    if let Some(a) = b.get("auth").filter(|x| !x.is_null()) {
                        response["auth"] = s.auth(a, false);
                    }
                } else {
                    response["data"] = data(b);
                }
            }
            _ => {}
        }
        let line = json!({
            "time": now,
            "type": "response",
            "auth": st.auth.get(i).cloned().unwrap_or(json!({})),
            "request": request,
            "response": response,
            "error": error,
        });
        outputs.push(Output::Audit {
            file_path: s.file_path.clone(),
            mode: s.options.mode,
            line: s.line(&line),
            required: st.required,
        });
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// `sys/audit` (list) and `sys/audit/<name>` (enable, read, disable).
/// An enable is answered once the shell has opened the file: it queues an
/// [`Output::AuditProbe`] on `outputs` and waits in `health`.
pub fn handle(
    ctx: &mut Ctx,
    health: &mut DeviceHealth,
    outputs: &mut VecDeque<Output>,
    req: &Request,
    tail: &str,
) -> ApiResult {
    let name = tail.trim_end_matches('/');
    if name.is_empty() {
        if req.method != Method::Get {
            return Err(ApiError::MethodNotAllowed);
        }
        let mut out = Map::new();
        for d in devices(ctx) {
            out.insert(format!("{}/", d.path), d.public());
        }
        return Ok(Reply::Data(Value::Object(out)));
    }
    if !valid_name(name) {
        return Err(ApiError::bad(format!(
            "path: {name:?} is not a valid audit device name (letters, digits, - _ .)"
        )));
    }
    let key = format!("{PREFIX}{name}");
    match req.method {
        Method::Get => match ctx.get_json::<Device>(&key)? {
            Some(d) => Ok(Reply::Data(d.public())),
            None => Err(ApiError::NotFound(String::new())),
        },
        Method::Put | Method::Post => {
            if ctx.get(&key)?.is_some() {
                return Err(ApiError::bad(format!("path already in use at {name}/")));
            }
            let body = api::body_object(&req.body)?;
            let f = api::Fields(&body);
            let kind = f.req_str("type")?;
            if kind != "file" {
                return Err(ApiError::bad(format!(
                    "type: unknown audit backend type {kind:?} (only \"file\" is supported)"
                )));
            }
            let options = match body.get("options") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(m)) => m.clone(),
                Some(_) => return Err(ApiError::bad("options: expected an object")),
            };
            let (settings, options) = parse_options(&options)?;
            let d = Device {
                path: name.to_string(),
                kind,
                description: f.str("description")?.unwrap_or_default(),
                local: f.bool("local")?.unwrap_or(false),
                options,
                hmac_key: hex::encode(crypto::random_key(ctx.rng)),
            };
            // Stored once the shell has opened the file ([`on_probed`]).
            outputs.push_back(Output::AuditProbe {
                id: req.id,
                file_path: settings.file_path,
                mode: settings.mode,
            });
            health.probes.insert(req.id, (key, d));
            Ok(Reply::Pending)
        }
        Method::Delete => {
            if let Some(d) = ctx.get_json::<Device>(&key)? {
                health.failing.remove(&d.file_path());
            }
            ctx.delete(&key);
            Ok(Reply::Empty)
        }
        Method::List | Method::Patch => Err(ApiError::MethodNotAllowed),
    }
}

/// The shell opened (or failed to open) the file of the device enabled by request `id`:
/// store the device, or refuse the enable. `None` when no enable waits for `id`.
pub fn on_probed(
    ctx: &mut Ctx,
    health: &mut DeviceHealth,
    id: RequestId,
    result: Result<(), String>,
) -> Option<ApiResult> {
    let (key, d) = health.probes.remove(&id)?;
    let file_path = d.file_path();
    Some(match result {
        Err(e) => Err(ApiError::bad(format!(
            "options.file_path: cannot open {file_path:?} for appending ({e}); nothing was \
             enabled: pick a path in a directory the server can write"
        ))),
        Ok(()) => (|| {
            if ctx.get(&key)?.is_some() {
                return Err(ApiError::bad(format!("path already in use at {}/", d.path)));
            }
            ctx.put_json(&key, &d)?;
            health.failing.remove(&file_path);
            Ok(Reply::Empty)
        })(),
    })
}

/// `POST sys/audit-hash/<name> {input}`.
pub fn hash_handler(ctx: &mut Ctx, req: &Request, tail: &str) -> ApiResult {
    if !req.method.is_write() {
        return Err(ApiError::MethodNotAllowed);
    }
    let name = tail.trim_end_matches('/');
    let d: Device = ctx
        .get_json(&format!("{PREFIX}{name}"))?
        .ok_or_else(|| ApiError::bad(format!("unknown audit backend {name:?}")))?;
    let body = api::body_object(&req.body)?;
    let input = api::Fields(&body).req_str("input")?;
    Ok(Reply::Data(json!({ "hash": hash(&d.key(), &input) })))
}

#[cfg(test)]
mod tests;
