//! KV version 2 versions: writing a new version (with check-and-set and the trimming of
//! old versions), reading one, JSON merge patches, soft delete, undelete and destroy, and
//! the `subkeys/` view of a version's structure.

use super::meta::{KeyMeta, VersionMeta};
use super::{check_key, not_found, with_status, Kv2};
use crate::api::{body_object, ApiError, ApiResult, Fields, Method, Reply, Request};
use crate::ctx::Ctx;
use serde_json::{json, Map, Value};

impl Kv2<'_> {
    /// `data/<key>`.
    pub fn data_endpoint(&self, ctx: &mut Ctx, req: &Request, key: &str) -> ApiResult {
        if key.is_empty() || key.ends_with('/') {
            return match req.method {
                Method::Get | Method::List => Err(not_found()),
                _ => Err(ApiError::bad("cannot write to a path ending in '/'")),
            };
        }
        check_key(key)?;
        match req.method {
            Method::Get => self.read(ctx, key, version_param(req)?),
            Method::Put | Method::Post => {
                let body = body_object(&req.body)?;
                let data = data_field(&body)?;
                let cas = cas_option(&body)?;
                let m = self
                    .meta(ctx, key)?
                    .unwrap_or_else(|| KeyMeta::new(ctx.now));
                self.write(ctx, key, m, data, cas)
            }
            Method::Patch => {
                let body = body_object(&req.body)?;
                let patch = data_field(&body)?;
                let cas = cas_option(&body)?;
                let Some(m) = self.meta(ctx, key)? else {
                    return Err(not_found());
                };
                let n = m.current_version;
                match m.versions.get(&n) {
                    None => return Err(not_found()),
                    Some(v) if !v.live(ctx.now) => {
                        return with_status(ctx, 404, m.version_view(n));
                    }
                    Some(_) => {}
                }
                let mut current = self.version_data(ctx, key, n)?;
                merge_patch(&mut current, &Value::Object(patch));
                let data = match current {
                    Value::Object(o) => o,
                    _ => Map::new(),
                };
                self.write(ctx, key, m, data, cas)
            }
            Method::Delete => {
                if let Some(mut m) = self.meta(ctx, key)? {
                    let now = ctx.now;
                    let n = m.current_version;
                    if let Some(v) = m.versions.get_mut(&n) {
                        if !v.destroyed && !v.deleted(now) {
                            v.deletion = Some(now);
                            self.put_meta(ctx, key, &m)?;
                        }
                    }
                }
                Ok(Reply::Empty)
            }
            Method::List => Err(ApiError::MethodNotAllowed),
        }
    }

    /// The data of version `n` of `key` (an empty object when it is missing).
    fn version_data(&self, ctx: &Ctx, key: &str, n: u64) -> ApiResult<Value> {
        Ok(ctx
            .get_json(&self.version_key(key, n))?
            .unwrap_or_else(|| json!({})))
    }

    /// Version `n` (0: the current one) of `key` with `f` deciding what is shown of a
    /// readable version; a deleted or destroyed one is a 404 that still shows its metadata.
    fn version_answer(
        &self,
        ctx: &mut Ctx,
        key: &str,
        n: u64,
        f: impl Fn(Value) -> (&'static str, Value),
        hidden: &'static str,
    ) -> ApiResult {
        let Some(m) = self.meta(ctx, key)? else {
            return Err(not_found());
        };
        let n = if n == 0 { m.current_version } else { n };
        let Some(v) = m.versions.get(&n) else {
            return Err(not_found());
        };
        if !v.live(ctx.now) {
            return with_status(
                ctx,
                404,
                json!({ hidden: null, "metadata": m.version_view(n) }),
            );
        }
        let (name, shown) = f(self.version_data(ctx, key, n)?);
        Ok(Reply::Data(
            json!({ name: shown, "metadata": m.version_view(n) }),
        ))
    }

    fn read(&self, ctx: &mut Ctx, key: &str, n: u64) -> ApiResult {
        self.version_answer(ctx, key, n, |d| ("data", d), "data")
    }

    /// Stores `data` as the next version of `key` (metadata `m`), after the check-and-set
    /// test; trims versions beyond the key's maximum. One write set: the new version, the
    /// removal of trimmed ones, the metadata.
    pub(super) fn write(
        &self,
        ctx: &mut Ctx,
        key: &str,
        mut m: KeyMeta,
        data: Map<String, Value>,
        cas: Option<u64>,
    ) -> ApiResult {
        let cfg = self.config(ctx)?;
        match cas {
            None if m.cas_required || cfg.cas_required => {
                return Err(ApiError::bad(
                    "check-and-set parameter required for this call",
                ))
            }
            Some(c) if c != m.current_version => {
                return Err(ApiError::bad(
                    "check-and-set parameter did not match the current version",
                ))
            }
            _ => {}
        }
        let now = ctx.now;
        let n = m.current_version + 1;
        let after = m.delete_after(&cfg);
        m.versions.insert(
            n,
            VersionMeta {
                created: now,
                deletion: (after > 0).then(|| now.saturating_add(after.saturating_mul(1000))),
                destroyed: false,
            },
        );
        m.current_version = n;
        m.updated = now;
        ctx.put_json(&self.version_key(key, n), &Value::Object(data))?;
        let max = m.max_versions(&cfg);
        self.trim(ctx, key, &mut m, max);
        self.put_meta(ctx, key, &m)?;
        Ok(Reply::Data(m.version_view(n)))
    }

    /// Removes the oldest versions of `key` beyond `max`.
    fn trim(&self, ctx: &mut Ctx, key: &str, m: &mut KeyMeta, max: u64) {
        let mut trimmed = false;
        while m.versions.len() as u64 > max {
            let Some((old, _)) = m.versions.pop_first() else {
                break;
            };
            ctx.delete(&self.version_key(key, old));
            trimmed = true;
        }
        if trimmed {
            m.oldest_version = m.versions.keys().next().copied().unwrap_or(0);
        }
    }

    /// `delete/<key>`, `undelete/<key>` and `destroy/<key>`: an operation on the listed
    /// versions; versions that do not exist are skipped, a missing key is a no-op.
    pub fn versions_endpoint(
        &self,
        ctx: &mut Ctx,
        req: &Request,
        op: super::Op,
        key: &str,
    ) -> ApiResult {
        if !req.method.is_write() {
            return Err(ApiError::MethodNotAllowed);
        }
        check_key(key)?;
        let body = body_object(&req.body)?;
        let versions = version_list(&body)?;
        let Some(mut m) = self.meta(ctx, key)? else {
            return Ok(Reply::Empty);
        };
        let now = ctx.now;
        for n in versions {
            let Some(v) = m.versions.get_mut(&n) else {
                continue;
            };
            match op {
                super::Op::Delete if !v.destroyed && !v.deleted(now) => v.deletion = Some(now),
                super::Op::Undelete if !v.destroyed => v.deletion = None,
                super::Op::Destroy => {
                    v.destroyed = true;
                    ctx.delete(&self.version_key(key, n));
                }
                _ => {}
            }
        }
        self.put_meta(ctx, key, &m)?;
        Ok(Reply::Empty)
    }

    /// `subkeys/<key>`: the structure of a version's data with every leaf `null`, down to
    /// `depth` levels (0: all).
    pub fn subkeys_endpoint(&self, ctx: &mut Ctx, req: &Request, key: &str) -> ApiResult {
        if req.method != Method::Get {
            return Err(ApiError::MethodNotAllowed);
        }
        if key.is_empty() || key.ends_with('/') {
            return Err(not_found());
        }
        check_key(key)?;
        let depth = match req.query("depth") {
            None | Some("") => 0,
            Some(d) => d.parse::<u64>().map_err(|_| {
                ApiError::bad(format!("depth: expected a non-negative integer, got {d:?}"))
            })?,
        };
        let n = version_param(req)?;
        self.version_answer(
            ctx,
            key,
            n,
            move |d| ("subkeys", subkeys(&d, depth, 1)),
            "subkeys",
        )
    }
}

/// `?version=N` (absent or 0: the current version).
fn version_param(req: &Request) -> ApiResult<u64> {
    match req.query("version") {
        None | Some("") => Ok(0),
        Some(v) => v
            .parse()
            .map_err(|_| ApiError::bad(format!("version: expected a version number, got {v:?}"))),
    }
}

/// The `data` object of a write or patch body.
fn data_field(body: &Map<String, Value>) -> ApiResult<Map<String, Value>> {
    match body.get("data") {
        None | Some(Value::Null) => Err(ApiError::bad("no data provided")),
        Some(Value::Object(o)) => Ok(o.clone()),
        Some(_) => Err(ApiError::bad("data: expected an object")),
    }
}

/// `options.cas` of a write or patch body.
fn cas_option(body: &Map<String, Value>) -> ApiResult<Option<u64>> {
    let Some(opts) = body.get("options") else {
        return Ok(None);
    };
    let opts = match opts {
        Value::Null => return Ok(None),
        Value::Object(o) => o,
        _ => return Err(ApiError::bad("options: expected an object")),
    };
    Fields(opts)
        .int("cas")
        .map_err(|_| ApiError::bad("error parsing check-and-set parameter"))?
        .map(|c| {
            u64::try_from(c).map_err(|_| ApiError::bad("error parsing check-and-set parameter"))
        })
        .transpose()
}

/// `versions` of a delete, undelete or destroy body: a list of numbers (or of numeric
/// strings, or a comma-separated string), at least one.
fn version_list(body: &Map<String, Value>) -> ApiResult<Vec<u64>> {
    let bad = || ApiError::bad("versions: expected a list of version numbers");
    let items: Vec<Value> = match body.get("versions") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(Value::String(s)) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| json!(s))
            .collect(),
        Some(Value::Number(n)) => vec![Value::Number(n.clone())],
        Some(_) => return Err(bad()),
    };
    let mut out = Vec::new();
    for v in items {
        let n = match &v {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        };
        out.push(n.ok_or_else(bad)?);
    }
    if out.is_empty() {
        return Err(ApiError::bad("No version number provided"));
    }
    Ok(out)
}

/// RFC 7386 JSON merge patch: objects merge key by key, `null` removes, anything else
/// replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// The keys of `v` with leaves (and objects below `depth`) as `null`.
pub fn subkeys(v: &Value, depth: u64, level: u64) -> Value {
    match v {
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| {
                    let inner = match v {
                        Value::Object(_) if depth == 0 || level < depth => {
                            subkeys(v, depth, level + 1)
                        }
                        _ => Value::Null,
                    };
                    (k.clone(), inner)
                })
                .collect(),
        ),
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut t, &json!({"a": "z", "c": {"f": null}, "n": [1]}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}, "n": [1]}));
        let mut t = json!({"a": 1});
        merge_patch(&mut t, &json!({"a": {"b": 2}}));
        assert_eq!(t, json!({"a": {"b": 2}}));
    }

    #[test]
    fn subkeys_stop_at_the_depth() {
        let d = json!({"a": 1, "b": {"c": {"d": 2}}, "e": [1]});
        assert_eq!(
            subkeys(&d, 0, 1),
            json!({"a": null, "b": {"c": {"d": null}}, "e": null})
        );
        assert_eq!(subkeys(&d, 1, 1), json!({"a": null, "b": null, "e": null}));
        assert_eq!(
            subkeys(&d, 2, 1),
            json!({"a": null, "b": {"c": null}, "e": null})
        );
    }

    #[test]
    fn version_lists_and_cas_are_parsed_strictly() {
        let b = |v: Value| v.as_object().cloned().unwrap();
        assert_eq!(
            version_list(&b(json!({"versions": [1, "2"]}))).unwrap(),
            [1, 2]
        );
        assert_eq!(
            version_list(&b(json!({"versions": "3,4"}))).unwrap(),
            [3, 4]
        );
        let e = version_list(&b(json!({}))).unwrap_err();
        assert_eq!(e.to_string(), "No version number provided");
        assert_eq!(
            version_list(&b(json!({"versions": [-1]})))
                .unwrap_err()
                .status(),
            400
        );
        assert_eq!(
            cas_option(&b(json!({"options": {"cas": 2}}))).unwrap(),
            Some(2)
        );
        let e = cas_option(&b(json!({"options": {"cas": "x"}}))).unwrap_err();
        assert_eq!(e.to_string(), "error parsing check-and-set parameter");
        assert_eq!(
            data_field(&b(json!({"x": 1}))).unwrap_err().to_string(),
            "no data provided"
        );
    }
}
