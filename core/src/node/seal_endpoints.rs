//! The seal endpoints of a node: `sys/init`, `sys/unseal`, `sys/seal-status`,
//! `sys/health` and the dev-mode set-up. They run before the barrier is open (the router
//! and its authorization only run on an unsealed node), read the plaintext seal
//! configuration and keyring, and recover the barrier key from key shares with
//! [`crate::seal::recover_barrier_key`], the one function every key-share flow uses
//! (unseal, generate-root, the DR operation token).

use super::Node;
use crate::api::{self, ApiError, ApiResult, Method, Reply, Request};
use crate::crypto;
use crate::ctx::Ctx;
use crate::mounts::{self, Table};
use crate::replication;
use crate::seal::{self, Barrier, SealConfig};
use crate::storage::{Storage, Txn};
use crate::token::{self, NewToken};
use serde_json::{json, Value};

impl<S: Storage> Node<S> {
    pub(super) fn seal_config(&self) -> ApiResult<Option<SealConfig>> {
        match self.storage.get(seal::SEAL_CONFIG_KEY)? {
            None => Ok(None),
            Some(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| ApiError::Internal(format!("seal config: {e}"))),
        }
    }

    pub(super) fn seal_status(&self) -> ApiResult {
        let cfg = self.seal_config()?;
        let (t, n) = cfg
            .as_ref()
            .map(|c| (c.secret_threshold, c.secret_shares))
            .unwrap_or((0, 0));
        Ok(Reply::Raw(
            200,
            json!({
                "type": "shamir",
                "initialized": cfg.is_some(),
                "sealed": self.barrier.sealed(),
                "t": t,
                "n": n,
                "progress": self.st.unseal_progress.progress(),
                "nonce": "",
                "version": self.st.config.version,
                "build_date": "",
                "migration": false,
                "cluster_name": self.st.config.cluster_name,
                "cluster_id": "",
                "recovery_seal": false,
                "storage_type": self.st.config.storage_type,
            }),
        ))
    }

    pub(super) fn health(&self, req: &Request) -> ApiResult {
        let init = self.seal_config()?.is_some();
        let sealed = self.barrier.sealed();
        let code = |name: &str, default: u16| -> ApiResult<u16> {
            match req.query(name) {
                None => Ok(default),
                Some(v) => match v.parse::<u16>() {
                    Ok(c) if (100..=599).contains(&c) => Ok(c),
                    _ => Err(ApiError::bad(format!(
                        "{name}: expected an HTTP status code between 100 and 599, got {v:?}"
                    ))),
                },
            }
        };
        let standby = !sealed && self.st.ha.is_standby();
        let standby_ok = match req.query("standbyok") {
            None => false,
            Some(v) => matches!(v, "" | "true" | "1" | "t" | "T" | "TRUE" | "True"),
        };
        let status = if !init {
            code("uninitcode", 501)?
        } else if sealed {
            code("sealedcode", 503)?
        } else if standby && standby_ok {
            code("activecode", 200)?
        } else if standby {
            code("standbycode", 429)?
        } else {
            code("activecode", 200)?
        };
        Ok(Reply::Raw(
            status,
            json!({
                "initialized": init,
                "sealed": sealed,
                "standby": standby,
                "performance_standby": false,
                "replication_performance_mode": "disabled",
                "replication_dr_mode": "disabled",
                "server_time_utc": self.now / 1000,
                "version": self.st.config.version,
                "cluster_name": self.st.config.cluster_name,
                "cluster_id": "",
            }),
        ))
    }

    pub(super) fn init(&mut self, req: &Request) -> ApiResult {
        match req.method {
            Method::Get => Ok(Reply::Raw(
                200,
                json!({ "initialized": self.seal_config()?.is_some() }),
            )),
            Method::Put | Method::Post => {
                let body = api::body_object(&req.body)?;
                let f = api::Fields(&body);
                let shares = f
                    .int("secret_shares")?
                    .ok_or_else(|| ApiError::bad("missing required field \"secret_shares\""))?;
                let threshold = f
                    .int("secret_threshold")?
                    .ok_or_else(|| ApiError::bad("missing required field \"secret_threshold\""))?;
                if !(1..=255).contains(&shares) || !(1..=255).contains(&threshold) {
                    return Err(ApiError::bad(
                        "secret_shares and secret_threshold must be between 1 and 255",
                    ));
                }
                let cfg = SealConfig {
                    secret_shares: shares as u8,
                    secret_threshold: threshold as u8,
                };
                let (v, _) = self.initialize(cfg, None)?;
                Ok(Reply::Raw(200, v))
            }
            _ => Err(ApiError::MethodNotAllowed),
        }
    }

    /// Creates the seal, keyring and root token; the node stays sealed. Returns the response
    /// body and the root key.
    pub(super) fn initialize(
        &mut self,
        cfg: SealConfig,
        root_token_id: Option<String>,
    ) -> ApiResult<(Value, [u8; 32])> {
        cfg.validate().map_err(|e| ApiError::bad(e.to_string()))?;
        if self.seal_config()?.is_some() {
            return Err(ApiError::bad("Vault is already initialized"));
        }
        let root = crypto::random_key(&mut self.rng);
        let barrier_key = crypto::random_key(&mut self.rng);
        let shares = seal::split(&root, &cfg, &mut self.rng);
        let mut b = Barrier::default();
        b.unseal_with(barrier_key);
        let now = self.now;
        let mut ctx = Ctx {
            txn: Txn::new(&self.storage),
            barrier: &b,
            rng: &mut self.rng,
            now,
        };
        ctx.txn.put(
            seal::SEAL_CONFIG_KEY,
            serde_json::to_vec(&cfg).unwrap_or_default(),
        );
        let kr = seal::wrap_keyring(&root, &barrier_key, ctx.rng);
        ctx.txn.put(seal::KEYRING_KEY, kr);
        ctx.put_json(seal::KEY_INSTALL_TIME_KEY, &now)?;
        let created = token::create(
            &mut ctx,
            NewToken {
                id: root_token_id,
                policies: vec!["root".into()],
                path: "auth/token/root".into(),
                display_name: "root".into(),
                ..Default::default()
            },
        );
        let (root_token, _) = match created {
            Ok(t) => t,
            // Another node of this HA cluster initialised the shared storage since the check
            // above: what the token store read (its salt) is under that node's barrier key.
            Err(_) if self.seal_config().ok().flatten().is_some() => {
                return Err(crate::storage::StorageError::AlreadyInitialized.into())
            }
            Err(e) => return Err(e),
        };
        let writes = ctx.txn.into_write_set();
        self.commit(writes)?;
        use base64::Engine;
        let v = json!({
            "keys": shares.iter().map(hex::encode).collect::<Vec<_>>(),
            "keys_base64": shares.iter().map(|s| base64::engine::general_purpose::STANDARD.encode(s)).collect::<Vec<_>>(),
            "root_token": root_token,
        });
        Ok((v, root))
    }

    pub(super) fn unseal(&mut self, req: &Request) -> ApiResult {
        if !req.method.is_write() {
            return Err(ApiError::MethodNotAllowed);
        }
        let body = api::body_object(&req.body)?;
        let f = api::Fields(&body);
        if f.bool("reset")?.unwrap_or(false) {
            self.st.unseal_progress.clear();
            return self.seal_status();
        }
        let cfg = self
            .seal_config()?
            .ok_or_else(|| ApiError::bad("Vault is not initialized"))?;
        if !self.barrier.sealed() {
            return self.seal_status();
        }
        let key = f.req_str("key")?;
        // A malformed share is refused here, before it counts: the progress is kept.
        let share = seal::decode_checked_share(&key, &cfg)
            .map_err(|e| ApiError::bad(format!("key: {e}")))?;
        // A share given twice counts once (the status shows the unchanged progress).
        self.st.unseal_progress.add(share);
        if self.st.unseal_progress.complete(&cfg) {
            let attempt = std::mem::take(&mut self.st.unseal_progress);
            let keyring = self.storage.get(seal::KEYRING_KEY)?;
            let bk = attempt
                .recover(&cfg, keyring.as_deref())
                .map_err(|e| ApiError::bad(e.to_string()))?;
            self.barrier.unseal_with(bk);
            self.st.repl.barrier_key = Some(zeroize::Zeroizing::new(bk));
        }
        self.seal_status()
    }

    pub(super) fn dev_setup(&mut self, root_token_id: Option<String>) -> ApiResult<Value> {
        let cfg = SealConfig {
            secret_shares: 1,
            secret_threshold: 1,
        };
        let (v, root) = self.initialize(cfg, root_token_id)?;
        let keyring = self
            .storage
            .get(seal::KEYRING_KEY)?
            .ok_or_else(|| ApiError::Internal("keyring missing".into()))?;
        let bk =
            seal::unwrap_keyring(&root, &keyring).map_err(|e| ApiError::Internal(e.to_string()))?;
        self.barrier.unseal_with(bk);
        self.st.repl.barrier_key = Some(zeroize::Zeroizing::new(bk));
        if let Err(e) = replication::ensure_loaded(&mut self.env()) {
            log::error!("replication state not loaded: {e}");
        }
        let mut ctx = node_ctx!(self);
        mounts::enable(
            &mut ctx,
            Table::Secrets,
            "secret",
            "kv",
            "key/value secret storage",
            false,
            Default::default(),
        )?;
        mounts::enable(
            &mut ctx,
            Table::Auth,
            "ldap",
            "ldap",
            "LDAP directory login",
            false,
            Default::default(),
        )?;
        let writes = ctx.txn.into_write_set();
        self.commit(writes)?;
        Ok(v)
    }
}
