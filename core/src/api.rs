//! The HTTP API as plain data: a parsed request, a response, the Vault-compatible envelope
//! and the typed errors every handler returns. The shell turns bytes on a socket into a
//! [`Request`] and a [`Response`] back into bytes; nothing here touches I/O.

use serde_json::{json, Map, Value};

pub type RequestId = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Method {
    Get,
    List,
    Put,
    Post,
    Delete,
    /// A JSON merge patch (KV v2 `data/` and `metadata/`); needs the `patch` capability.
    Patch,
}

impl Method {
    /// Parses an HTTP method; `None` for one the API does not serve (405).
    pub fn parse(s: &str) -> Option<Method> {
        Some(match s.to_ascii_uppercase().as_str() {
            "GET" | "HEAD" => Method::Get,
            "LIST" => Method::List,
            "PUT" => Method::Put,
            "POST" => Method::Post,
            "DELETE" => Method::Delete,
            "PATCH" => Method::Patch,
            _ => return None,
        })
    }
    /// The method's name as the API spells it (`LIST` for a list).
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::List => "LIST",
            Method::Put => "PUT",
            Method::Post => "POST",
            Method::Delete => "DELETE",
            Method::Patch => "PATCH",
        }
    }
    pub fn is_write(self) -> bool {
        matches!(self, Method::Put | Method::Post)
    }
}

/// One API request, already split from its transport.
#[derive(Debug, Clone)]
pub struct Request {
    pub id: RequestId,
    pub method: Method,
    /// Path after `/v1/`, without query string, e.g. `secret/foo`.
    pub path: String,
    pub token: Option<String>,
    pub namespace: Option<String>,
    /// Raw `X-Service-Wrap-TTL` header value.
    pub wrap_ttl: Option<String>,
    /// Raw body bytes (JSON expected when non-empty).
    pub body: Vec<u8>,
    /// Query parameters in order of appearance.
    pub query: Vec<(String, String)>,
    /// Client address, for audit and metrics.
    pub remote_addr: String,
    /// Raw `Content-Type` header (a `PATCH` must be a JSON merge patch,
    /// [`crate::node`]'s head check).
    pub content_type: Option<String>,
    /// Raw `X-Vault-Index` header: the replication state a write left on the primary,
    /// which this node must have applied before it serves the request.
    pub index: Option<String>,
    /// Set on a request a standby forwarded to this node (the active one of its HA
    /// cluster): the standby's signature over the request ([`crate::ha::forward_mac`]).
    pub forwarded: Option<String>,
    /// `X-Vault-Inconsistent: forward-active-node`: when this node has not reached the
    /// request's `X-Vault-Index`, a performance secondary forwards the request to its
    /// primary instead of answering 412.
    pub forward_inconsistent: bool,
    /// Set only by a primary on a request a performance secondary forwarded to it: the
    /// caller the secondary authorized ([`crate::replication::forward`]). Never taken from
    /// a client.
    pub on_behalf: Option<Box<crate::replication::forward::OnBehalf>>,
}

impl Request {
    pub fn new(id: RequestId, method: Method, path: &str) -> Request {
        Request {
            id,
            method,
            path: path.trim_start_matches('/').to_string(),
            token: None,
            namespace: None,
            wrap_ttl: None,
            body: Vec::new(),
            query: Vec::new(),
            remote_addr: String::new(),
            content_type: None,
            index: None,
            forwarded: None,
            forward_inconsistent: false,
            on_behalf: None,
        }
    }
    pub fn with_token(mut self, t: &str) -> Self {
        self.token = Some(t.to_string());
        self
    }
    /// A JSON body with the content type its method takes: a JSON merge patch for
    /// `PATCH`, plain JSON otherwise.
    pub fn with_json(mut self, v: Value) -> Self {
        self.body = serde_json::to_vec(&v).unwrap_or_default();
        self.content_type = Some(
            if self.method == Method::Patch {
                MERGE_PATCH
            } else {
                "application/json"
            }
            .to_string(),
        );
        self
    }
    pub fn query(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One API response.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    pub id: RequestId,
    pub status: u16,
    /// JSON body; `None` for 204.
    pub body: Option<Value>,
    /// Content type when the body is not JSON (e.g. Prometheus text), body in `raw`.
    pub raw: Option<(String, Vec<u8>)>,
    /// `X-Vault-Index` to return: the replication state after this request's writes.
    pub index: Option<String>,
}

impl Response {
    pub fn json(id: RequestId, status: u16, body: Value) -> Response {
        Response {
            id,
            status,
            body: Some(body),
            raw: None,
            index: None,
        }
    }
    pub fn no_content(id: RequestId) -> Response {
        Response {
            id,
            status: 204,
            body: None,
            raw: None,
            index: None,
        }
    }
    pub fn error(id: RequestId, err: &ApiError) -> Response {
        Response::json(id, err.status(), json!({ "errors": [err.to_string()] }))
    }
}

/// What a handler hands back before the envelope is put around it.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// 204.
    Empty,
    /// `data` of the standard envelope.
    Data(Value),
    /// A full envelope-shaped object from the handler (login `auth`, wrap responses).
    Envelope(Value),
    /// A bare JSON object returned as-is (seal status, health, init).
    Raw(u16, Value),
    /// Non-JSON body.
    Text(u16, String, Vec<u8>),
    /// No answer yet: outside work (LDAP) will finish the request later.
    Pending,
    /// The `wrap_info` of a reply stored under a response-wrapping token (the answer is
    /// the envelope with only `wrap_info` set).
    Wrapped(Value),
}

/// The standard envelope around `data`.
pub fn envelope(request_id: &str, data: Value) -> Value {
    json!({
        "request_id": request_id,
        "lease_id": "",
        "renewable": false,
        "lease_duration": 0,
        "data": data,
        "wrap_info": null,
        "warnings": null,
        "auth": null,
    })
}

/// An envelope whose fields the caller fills in (auth, wrap_info, warnings).
pub fn envelope_with(request_id: &str, fields: Map<String, Value>) -> Value {
    let mut env = envelope(request_id, Value::Null);
    if let Value::Object(m) = &mut env {
        for (k, v) in fields {
            m.insert(k, v);
        }
    }
    env
}

/// The media type a `PATCH` body must have (RFC 7396 JSON merge patch).
pub const MERGE_PATCH: &str = "application/merge-patch+json";

/// Errors a request can end in; each maps to one status code and a message a user can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    /// 400: the input is wrong; the message names the field.
    BadRequest(String),
    /// 403: invalid token, or the policy does not allow the operation.
    PermissionDenied,
    /// 403: the route needs a token and the request carries none.
    MissingToken,
    /// 403 with a specific reason (e.g. DR operation token refused).
    Forbidden(String),
    /// 404: no such path or entry.
    NotFound(String),
    /// 405: the path exists but does not take this method.
    MethodNotAllowed,
    /// 409/412-style conflicts reported as 400 by the reference; kept separate for clarity.
    Conflict(String),
    /// 413: body too large.
    TooLarge(String),
    /// 415: the body's media type is not one the method takes (`PATCH` wants a JSON merge
    /// patch).
    UnsupportedMediaType(String),
    /// 412: the node has not yet applied the replication state the request requires.
    NotCaughtUp(String),
    /// 429: rate or lockout limits.
    TooMany(String),
    /// 500: a fault inside the service (storage error); nothing was applied.
    Internal(String),
    /// 507: the storage's disk is full; nothing was applied, and writes are refused until
    /// space is freed (reads keep working).
    StorageFull,
    /// 502: an upstream (LDAP, primary) failed.
    Upstream(String),
    /// 503: the node is sealed.
    Sealed,
    /// 503: the node cannot serve this request in its current role.
    Unavailable(String),
}

impl ApiError {
    pub fn status(&self) -> u16 {
        match self {
            ApiError::BadRequest(_) | ApiError::Conflict(_) => 400,
            ApiError::PermissionDenied | ApiError::MissingToken | ApiError::Forbidden(_) => 403,
            ApiError::NotFound(_) => 404,
            ApiError::MethodNotAllowed => 405,
            ApiError::NotCaughtUp(_) => 412,
            ApiError::TooLarge(_) => 413,
            ApiError::UnsupportedMediaType(_) => 415,
            ApiError::TooMany(_) => 429,
            ApiError::Internal(_) => 500,
            ApiError::Upstream(_) => 502,
            ApiError::Sealed | ApiError::Unavailable(_) => 503,
            ApiError::StorageFull => 507,
        }
    }
    pub fn bad(msg: impl Into<String>) -> ApiError {
        ApiError::BadRequest(msg.into())
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::BadRequest(m)
            | ApiError::Conflict(m)
            | ApiError::TooLarge(m)
            | ApiError::UnsupportedMediaType(m)
            | ApiError::TooMany(m)
            | ApiError::NotCaughtUp(m)
            | ApiError::Forbidden(m)
            | ApiError::Unavailable(m) => write!(f, "{m}"),
            ApiError::PermissionDenied => write!(f, "permission denied"),
            ApiError::MissingToken => write!(
                f,
                "permission denied (this request needs a token: send it in the X-Vault-Token header)"
            ),
            ApiError::NotFound(m) if m.is_empty() => write!(f, "no handler for route"),
            ApiError::NotFound(m) => write!(f, "{m}"),
            ApiError::MethodNotAllowed => write!(f, "unsupported operation"),
            ApiError::Internal(m) => write!(f, "internal error: {m}"),
            ApiError::Upstream(m) => write!(f, "{m}"),
            ApiError::Sealed => write!(f, "Vault is sealed"),
            ApiError::StorageFull => write!(
                f,
                "{} (nothing of this request was applied)",
                crate::storage::StorageError::Full
            ),
        }
    }
}

/// The kind of a storage error chooses the answer: a full disk is 507 (the client may try
/// again once space is freed), a commit fenced off by a newer leader 503 (this node is no
/// longer the active one; the client retries elsewhere), any other failure 500.
impl From<crate::storage::StorageError> for ApiError {
    fn from(e: crate::storage::StorageError) -> Self {
        use crate::storage::StorageError;
        match e {
            StorageError::Full => ApiError::StorageFull,
            StorageError::Corrupt(_) | StorageError::Io(_) => ApiError::Internal(e.to_string()),
            StorageError::Fenced { .. } => ApiError::Unavailable(e.to_string()),
            StorageError::AlreadyInitialized => ApiError::bad(e.to_string()),
        }
    }
}

pub type ApiResult<T = Reply> = Result<T, ApiError>;

/// Deepest nesting of arrays and objects a request body may have.
pub const MAX_JSON_DEPTH: usize = 64;

/// Most entries a policy list field (`policies`, `token_policies`, ...) may have; the same
/// cap as the policies one token may carry.
pub const MAX_POLICIES: usize = crate::token::MAX_POLICIES;

/// Whether `body` nests arrays/objects deeper than `max` (strings skipped; the bytes need
/// not be valid JSON: the parser reports that).
pub fn json_too_deep(body: &[u8], max: usize) -> bool {
    let (mut depth, mut in_str, mut esc) = (0usize, false, false);
    for &b in body {
        if in_str {
            if esc {
                esc = false;
            } else if b == b'\\' {
                esc = true;
            } else if b == b'"' {
                in_str = false;
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// The request body as a JSON object (empty body = empty object). Bodies nesting deeper
/// than [`MAX_JSON_DEPTH`] are refused before parsing.
pub fn body_object(body: &[u8]) -> ApiResult<Map<String, Value>> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(Map::new());
    }
    if json_too_deep(body, MAX_JSON_DEPTH) {
        return Err(ApiError::bad(format!(
            "request body nests deeper than {MAX_JSON_DEPTH} levels"
        )));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        // The reference's CLI sends `null` for `write -force` and a bare `unwrap`.
        Ok(Value::Null) => Ok(Map::new()),
        Ok(_) => Err(ApiError::bad("request body must be a JSON object")),
        Err(e) => Err(ApiError::bad(format!("failed to parse JSON input: {e}"))),
    }
}

/// Typed field access on a request body with messages that name the field.
pub struct Fields<'a>(pub &'a Map<String, Value>);

impl Fields<'_> {
    pub fn str(&self, name: &str) -> ApiResult<Option<String>> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(Value::Bool(b)) => Ok(Some(b.to_string())),
            Some(_) => Err(ApiError::bad(format!("{name}: expected a string"))),
        }
    }
    pub fn req_str(&self, name: &str) -> ApiResult<String> {
        match self.str(name)? {
            Some(s) if !s.is_empty() => Ok(s),
            _ => Err(ApiError::bad(format!("missing required field {name:?}"))),
        }
    }
    pub fn bool(&self, name: &str) -> ApiResult<Option<bool>> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(Value::String(s)) => match s.to_ascii_lowercase().as_str() {
                "true" | "1" | "t" => Ok(Some(true)),
                "false" | "0" | "f" | "" => Ok(Some(false)),
                _ => Err(ApiError::bad(format!(
                    "{name}: expected a boolean, got {s:?}"
                ))),
            },
            Some(Value::Number(n)) => Ok(Some(n.as_i64() != Some(0))),
            Some(_) => Err(ApiError::bad(format!("{name}: expected a boolean"))),
        }
    }
    pub fn int(&self, name: &str) -> ApiResult<Option<i64>> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => n
                .as_i64()
                .map(Some)
                .ok_or_else(|| ApiError::bad(format!("{name}: expected an integer"))),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => s
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| ApiError::bad(format!("{name}: expected an integer, got {s:?}"))),
            Some(_) => Err(ApiError::bad(format!("{name}: expected an integer"))),
        }
    }
    /// Seconds from a number or a duration string.
    pub fn duration(&self, name: &str) -> ApiResult<Option<u64>> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(v) => crate::time::duration_value(v)
                .map(Some)
                .map_err(|e| ApiError::bad(format!("{name}: {e}"))),
        }
    }
    /// A list from a JSON array or a comma-separated string; entries trimmed, empties dropped.
    /// A policy list (a field named `policies` or ending in `_policies`) has at most
    /// [`MAX_POLICIES`] entries.
    pub fn list(&self, name: &str) -> ApiResult<Option<Vec<String>>> {
        let list = self.list_any(name)?;
        let policies = name == "policies" || name.ends_with("_policies");
        match list {
            Some(l) if policies && l.len() > MAX_POLICIES => Err(ApiError::bad(format!(
                "{name}: at most {MAX_POLICIES} policies are allowed, got {}",
                l.len()
            ))),
            l => Ok(l),
        }
    }

    fn list_any(&self, name: &str) -> ApiResult<Option<Vec<String>>> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(
                s.split(',')
                    .map(|p| p.trim().to_string())
                    .filter(|p| !p.is_empty())
                    .collect(),
            )),
            Some(Value::Array(a)) => {
                let mut out = Vec::new();
                for v in a {
                    match v {
                        Value::String(s) => {
                            let s = s.trim();
                            if !s.is_empty() {
                                out.push(s.to_string())
                            }
                        }
                        _ => {
                            return Err(ApiError::bad(format!(
                                "{name}: expected a list of strings"
                            )))
                        }
                    }
                }
                Ok(Some(out))
            }
            Some(_) => Err(ApiError::bad(format!(
                "{name}: expected a list or a comma-separated string"
            ))),
        }
    }
    /// Refuses fields not in `known`, naming them.
    pub fn only(&self, known: &[&str]) -> ApiResult<()> {
        let unknown: Vec<&str> = self
            .0
            .keys()
            .map(String::as_str)
            .filter(|k| !known.contains(k))
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(ApiError::bad(format!(
                "unknown field(s): {}",
                unknown.join(", ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_parsing_errors_are_clear() {
        assert!(body_object(b"").unwrap().is_empty());
        let e = body_object(b"{bad").unwrap_err();
        assert_eq!(e.status(), 400);
        assert!(e.to_string().contains("failed to parse JSON"));
        assert_eq!(body_object(b"[1]").unwrap_err().status(), 400);
        // `null` (the reference's CLI sends it for `write -force`) is an empty body.
        assert!(body_object(b"null").unwrap().is_empty());
    }

    #[test]
    fn deep_bodies_are_refused_before_parsing() {
        let ok = format!("{{\"a\":{}1{}}}", "[".repeat(63), "]".repeat(63));
        assert!(body_object(ok.as_bytes()).is_ok());
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(64), "]".repeat(64));
        let e = body_object(deep.as_bytes()).unwrap_err();
        assert_eq!(e.status(), 400);
        assert_eq!(e.to_string(), "request body nests deeper than 64 levels");
        // Brackets inside strings (escaped quotes included) do not count.
        let s = format!("{{\"a\":\"\\\"{}\"}}", "[".repeat(500));
        assert!(body_object(s.as_bytes()).is_ok(), "{s}");
        // Unterminated deep input is refused without recursion.
        assert_eq!(body_object(&[b'['; 100_000]).unwrap_err().status(), 400);
    }

    #[test]
    fn policy_lists_are_capped() {
        let names: Vec<String> = (0..=MAX_POLICIES).map(|i| format!("p{i}")).collect();
        let m = body_object(
            &serde_json::to_vec(&json!({
                "policies": names,
                "token_policies": names.join(","),
                "paths": names,
            }))
            .unwrap(),
        )
        .unwrap();
        let f = Fields(&m);
        for field in ["policies", "token_policies"] {
            let e = f.list(field).unwrap_err();
            assert_eq!(e.status(), 400);
            assert_eq!(
                e.to_string(),
                format!("{field}: at most 256 policies are allowed, got 257")
            );
        }
        assert_eq!(f.list("paths").unwrap().unwrap().len(), 257);
    }

    #[test]
    fn lists_accept_strings_and_arrays() {
        let m = body_object(br#"{"a":"x, y,,z","b":["p"," q "],"c":5}"#).unwrap();
        let f = Fields(&m);
        assert_eq!(f.list("a").unwrap().unwrap(), vec!["x", "y", "z"]);
        assert_eq!(f.list("b").unwrap().unwrap(), vec!["p", "q"]);
        assert!(f.list("c").unwrap_err().to_string().contains("c:"));
    }
}
