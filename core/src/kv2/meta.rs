//! KV version 2 bookkeeping: the mount's `config` and each key's metadata (its settings,
//! custom metadata and the list of its versions), how they are stored and shown, and the
//! `config` and `metadata/` endpoints.
//!
//! Storage under the mount's data prefix: `kv2/config` (the mount's settings),
//! `kv2/meta/<key>` (one [`KeyMeta`] per key) and `kv2/ver/<key>/<n>` (the data of
//! version `n`). Everything is under the mount's prefix, so replication, path filters and
//! local mounts treat it as they treat a KV version 1 key.

use super::{not_found, Kv2};
use crate::api::{body_object, ApiError, ApiResult, Fields, Method, Reply};
use crate::ctx::Ctx;
use crate::time::{go_duration, rfc3339_nanos, Millis};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// How many versions a key keeps when neither it nor the mount says (as the reference).
pub const DEFAULT_MAX_VERSIONS: u64 = 10;

/// The mount's settings (`config`): defaults for every key.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Config {
    pub max_versions: u64,
    pub cas_required: bool,
    /// Seconds after its creation a version is deleted (0: never).
    pub delete_version_after: u64,
}

/// One version of a key, without its data.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VersionMeta {
    pub created: Millis,
    /// When the version is (or was) soft-deleted; `None`: not scheduled.
    pub deletion: Option<Millis>,
    pub destroyed: bool,
}

impl VersionMeta {
    /// Soft-deleted at `now` (a deletion time in the future is only scheduled).
    pub fn deleted(&self, now: Millis) -> bool {
        self.deletion.is_some_and(|d| d <= now)
    }
    /// Readable: neither deleted nor destroyed.
    pub fn live(&self, now: Millis) -> bool {
        !self.destroyed && !self.deleted(now)
    }
}

/// A key's metadata: its settings and its versions.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct KeyMeta {
    pub created: Millis,
    pub updated: Millis,
    pub current_version: u64,
    pub oldest_version: u64,
    pub max_versions: u64,
    pub cas_required: bool,
    pub delete_version_after: u64,
    pub custom_metadata: Option<BTreeMap<String, String>>,
    pub current_metadata_version: u64,
    pub versions: BTreeMap<u64, VersionMeta>,
}

impl KeyMeta {
    pub fn new(now: Millis) -> KeyMeta {
        KeyMeta {
            created: now,
            updated: now,
            ..KeyMeta::default()
        }
    }

    /// How many versions the key keeps (its own setting, else the mount's, else 10).
    pub fn max_versions(&self, cfg: &Config) -> u64 {
        [self.max_versions, cfg.max_versions]
            .into_iter()
            .find(|&m| m > 0)
            .unwrap_or(DEFAULT_MAX_VERSIONS)
    }

    /// Seconds after which a new version is deleted (its own setting, else the mount's).
    pub fn delete_after(&self, cfg: &Config) -> u64 {
        if self.delete_version_after > 0 {
            self.delete_version_after
        } else {
            cfg.delete_version_after
        }
    }

    fn custom(&self) -> Value {
        match &self.custom_metadata {
            Some(m) => json!(m),
            None => Value::Null,
        }
    }

    /// The metadata of version `n` as the data endpoints show it.
    pub fn version_view(&self, n: u64) -> Value {
        let v = self.versions.get(&n);
        json!({
            "created_time": v.map(|v| rfc3339_nanos(v.created)).unwrap_or_default(),
            "custom_metadata": self.custom(),
            "deletion_time": v.and_then(|v| v.deletion).map(rfc3339_nanos).unwrap_or_default(),
            "destroyed": v.is_some_and(|v| v.destroyed),
            "version": n,
        })
    }

    /// The answer to a `metadata/` read.
    pub fn view(&self) -> Value {
        let versions: Map<String, Value> = self
            .versions
            .iter()
            .map(|(n, v)| {
                (
                    n.to_string(),
                    json!({
                        "created_time": rfc3339_nanos(v.created),
                        "deletion_time": v.deletion.map(rfc3339_nanos).unwrap_or_default(),
                        "destroyed": v.destroyed,
                    }),
                )
            })
            .collect();
        json!({
            "cas_required": self.cas_required,
            "created_time": rfc3339_nanos(self.created),
            "current_metadata_version": self.current_metadata_version,
            "current_version": self.current_version,
            "custom_metadata": self.custom(),
            "delete_version_after": go_duration(self.delete_version_after),
            "max_versions": self.max_versions,
            "metadata_cas_required": false,
            "oldest_version": self.oldest_version,
            "updated_time": rfc3339_nanos(self.updated),
            "versions": versions,
        })
    }
}

impl Kv2<'_> {
    fn config_key(&self) -> String {
        format!("{}kv2/config", self.prefix)
    }
    pub(super) fn meta_key(&self, key: &str) -> String {
        format!("{}kv2/meta/{key}", self.prefix)
    }
    pub(super) fn version_key(&self, key: &str, n: u64) -> String {
        format!("{}kv2/ver/{key}/{n}", self.prefix)
    }

    pub fn config(&self, ctx: &Ctx) -> ApiResult<Config> {
        Ok(ctx.get_json(&self.config_key())?.unwrap_or_default())
    }
    pub fn meta(&self, ctx: &Ctx, key: &str) -> ApiResult<Option<KeyMeta>> {
        ctx.get_json(&self.meta_key(key))
    }
    pub fn put_meta(&self, ctx: &mut Ctx, key: &str, m: &KeyMeta) -> ApiResult<()> {
        ctx.put_json(&self.meta_key(key), m)
    }

    /// `config`: the mount's settings.
    pub fn config_endpoint(&self, ctx: &mut Ctx, method: Method, body: &[u8]) -> ApiResult {
        match method {
            Method::Get => {
                let c = self.config(ctx)?;
                Ok(Reply::Data(json!({
                    "cas_required": c.cas_required,
                    "delete_version_after": go_duration(c.delete_version_after),
                    "max_versions": c.max_versions,
                    "metadata_cas_required": false,
                })))
            }
            Method::Put | Method::Post => {
                let body = body_object(body)?;
                let f = Fields(&body);
                let mut c = self.config(ctx)?;
                if let Some(m) = max_versions(&f)? {
                    c.max_versions = m;
                }
                if let Some(b) = f.bool("cas_required")? {
                    c.cas_required = b;
                }
                if let Some(d) = f.duration("delete_version_after")? {
                    c.delete_version_after = d;
                }
                ctx.put_json(&self.config_key(), &c)?;
                Ok(Reply::Empty)
            }
            _ => Err(ApiError::MethodNotAllowed),
        }
    }

    /// `metadata/<key>` (and a list of `metadata/<dir>`).
    pub fn metadata_endpoint(
        &self,
        ctx: &mut Ctx,
        method: Method,
        key: &str,
        body: &[u8],
    ) -> ApiResult {
        if method == Method::List {
            let dir = if key.is_empty() || key.ends_with('/') {
                key.to_string()
            } else {
                format!("{key}/")
            };
            let keys = ctx.list(&self.meta_key(&dir))?;
            if keys.is_empty() {
                return Err(not_found());
            }
            return Ok(Reply::Data(json!({ "keys": keys })));
        }
        super::check_key(key)?;
        match method {
            Method::Get => match self.meta(ctx, key)? {
                Some(m) => Ok(Reply::Data(m.view())),
                None => Err(not_found()),
            },
            Method::Put | Method::Post | Method::Patch => {
                let body = body_object(body)?;
                let patch = method == Method::Patch;
                let mut m = match (self.meta(ctx, key)?, patch) {
                    (Some(m), _) => m,
                    (None, true) => return Err(not_found()),
                    (None, false) => KeyMeta::new(ctx.now),
                };
                apply_settings(&mut m, &body, patch)?;
                m.updated = ctx.now;
                m.current_metadata_version += 1;
                self.put_meta(ctx, key, &m)?;
                Ok(Reply::Empty)
            }
            Method::Delete => {
                if let Some(m) = self.meta(ctx, key)? {
                    for n in m.versions.keys() {
                        ctx.delete(&self.version_key(key, *n));
                    }
                    ctx.delete(&self.meta_key(key));
                }
                Ok(Reply::Empty)
            }
            Method::List => Err(ApiError::MethodNotAllowed),
        }
    }
}

/// `max_versions` from a body: a non-negative integer (a negative one means "unset", 0).
fn max_versions(f: &Fields) -> ApiResult<Option<u64>> {
    Ok(f.int("max_versions")?
        .map(|m| u64::try_from(m).unwrap_or(0)))
}

/// Applies the settings of a `metadata/` write to `m`. A write replaces the custom
/// metadata it names; a patch merges it (a `null` value removes an entry).
fn apply_settings(m: &mut KeyMeta, body: &Map<String, Value>, patch: bool) -> ApiResult<()> {
    let f = Fields(body);
    if let Some(v) = max_versions(&f)? {
        m.max_versions = v;
    }
    if let Some(b) = f.bool("cas_required")? {
        m.cas_required = b;
    }
    if let Some(d) = f.duration("delete_version_after")? {
        m.delete_version_after = d;
    }
    match body.get("custom_metadata") {
        None => {}
        Some(Value::Null) if !patch => m.custom_metadata = None,
        Some(Value::Null) => {}
        Some(Value::Object(o)) => {
            let mut out = if patch {
                m.custom_metadata.clone().unwrap_or_default()
            } else {
                BTreeMap::new()
            };
            for (k, v) in o {
                match v {
                    Value::Null if patch => {
                        out.remove(k);
                    }
                    Value::String(s) => {
                        out.insert(k.clone(), s.clone());
                    }
                    _ => {
                        return Err(ApiError::bad(format!(
                            "custom_metadata: the value of {k:?} must be a string"
                        )))
                    }
                }
            }
            m.custom_metadata = (!out.is_empty()).then_some(out);
        }
        Some(_) => {
            return Err(ApiError::bad(
                "custom_metadata: expected an object of strings",
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_fall_back_to_the_mount_then_to_ten() {
        let mut m = KeyMeta::new(5);
        let mut c = Config::default();
        assert_eq!(m.max_versions(&c), 10);
        c.max_versions = 3;
        assert_eq!(m.max_versions(&c), 3);
        m.max_versions = 7;
        assert_eq!(m.max_versions(&c), 7);
        c.delete_version_after = 60;
        assert_eq!(m.delete_after(&c), 60);
        m.delete_version_after = 5;
        assert_eq!(m.delete_after(&c), 5);
    }

    #[test]
    fn a_patch_merges_custom_metadata_and_a_write_replaces_it() {
        let mut m = KeyMeta::new(0);
        let body = |v: Value| v.as_object().cloned().unwrap();
        apply_settings(
            &mut m,
            &body(json!({"custom_metadata": {"a": "1", "b": "2"}})),
            false,
        )
        .unwrap();
        apply_settings(
            &mut m,
            &body(json!({"custom_metadata": {"a": null, "c": "3"}})),
            true,
        )
        .unwrap();
        let got: Vec<_> = m.custom_metadata.clone().unwrap().into_keys().collect();
        assert_eq!(got, ["b", "c"]);
        apply_settings(&mut m, &body(json!({"custom_metadata": {"z": "9"}})), false).unwrap();
        assert_eq!(m.custom_metadata.clone().unwrap().len(), 1);
        let e = apply_settings(&mut m, &body(json!({"custom_metadata": {"z": 1}})), false);
        assert_eq!(e.unwrap_err().status(), 400);
        let e = apply_settings(&mut m, &body(json!({"max_versions": "x"})), false);
        assert_eq!(e.unwrap_err().status(), 400);
    }

    #[test]
    fn views_show_times_with_nanoseconds_and_empty_deletion_times() {
        let mut m = KeyMeta::new(1_000);
        m.current_version = 1;
        m.versions.insert(
            1,
            VersionMeta {
                created: 1_000,
                deletion: None,
                destroyed: false,
            },
        );
        let v = m.version_view(1);
        assert_eq!(v["created_time"], "1970-01-01T00:00:01.000000000Z");
        assert_eq!(v["deletion_time"], "");
        assert_eq!(v["custom_metadata"], Value::Null);
        let full = m.view();
        assert_eq!(full["delete_version_after"], "0s");
        assert!(full["versions"]["1"].is_object());
    }
}
