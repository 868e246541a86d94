//! Commands of the server process itself, not of an API client (dev mode set-up, clean
//! shutdown), and their typed answers. Each command carries an [`AdminId`] chosen by the
//! driver; the node's [`crate::node::Output::AdminDone`] carries it back, so a driver
//! matches answers to callers by id, never by position.

use crate::api::{ApiError, ApiResult};
use serde_json::Value;

/// Identifies one admin command to its driver (unique among the commands it has in flight).
pub type AdminId = u64;

/// An admin command, given with [`crate::node::Input::Admin`].
#[derive(Debug, Clone)]
pub enum Admin {
    /// Initialise with one key share, unseal, mount `secret/` (kv) and `auth/ldap/`.
    DevSetup { root_token_id: Option<String> },
    /// The process is about to exit cleanly: finish deferred work (a reindex's skipped
    /// flush) so storage is complete.
    Shutdown,
}

/// What a successful admin command did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminResult {
    /// [`Admin::DevSetup`]: the node is initialised, unsealed and mounted.
    DevSetup(DevKeys),
    /// [`Admin::Shutdown`]: deferred work is flushed; storage is complete.
    Flushed,
}

/// The answer to an admin command: what it did, or why it failed.
pub type AdminAnswer = Result<AdminResult, ApiError>;

/// The secrets a dev set-up hands the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevKeys {
    /// The root token.
    pub root_token: String,
    /// The unseal key shares (one in dev mode), hex.
    pub keys: Vec<String>,
    /// The same shares, base64.
    pub keys_base64: Vec<String>,
}

impl DevKeys {
    /// The keys and root token of an init answer's body (`keys`, `keys_base64`,
    /// `root_token`).
    pub(crate) fn from_init_body(v: &Value) -> ApiResult<DevKeys> {
        let strings = |field: &str| -> Vec<String> {
            v[field]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let root_token = v["root_token"].as_str().unwrap_or_default().to_string();
        let keys = strings("keys");
        if root_token.is_empty() || keys.is_empty() {
            return Err(ApiError::Internal(
                "dev set-up: the initialisation returned no root token or keys".into(),
            ));
        }
        Ok(DevKeys {
            root_token,
            keys,
            keys_base64: strings("keys_base64"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dev_keys_come_from_the_init_body() {
        let k = DevKeys::from_init_body(
            &json!({"keys": ["0a"], "keys_base64": ["Cg=="], "root_token": "hvs.x"}),
        )
        .unwrap();
        assert_eq!(
            k,
            DevKeys {
                root_token: "hvs.x".into(),
                keys: vec!["0a".into()],
                keys_base64: vec!["Cg==".into()],
            }
        );
        assert!(DevKeys::from_init_body(&json!({"keys": ["0a"]})).is_err());
    }
}
