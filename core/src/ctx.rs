//! The per-input handler context: the write set of the input being handled, the barrier
//! that encrypts what it stores, the node's RNG and clock. Handlers read and write through
//! it; the node applies the write set only when the handler succeeds.

use crate::api::{ApiError, ApiResult};
use crate::seal::Barrier;
use crate::storage::Txn;
use crate::time::Millis;
use rand_chacha::ChaCha20Rng;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Keys stored in plaintext (they hold what is needed to unseal).
fn plaintext(key: &str) -> bool {
    key == crate::seal::SEAL_CONFIG_KEY || key == crate::seal::KEYRING_KEY
}

pub struct Ctx<'a> {
    pub txn: Txn<'a>,
    pub barrier: &'a Barrier,
    pub rng: &'a mut ChaCha20Rng,
    pub now: Millis,
}

impl<'a> Ctx<'a> {
    /// Reads and decrypts one value.
    pub fn get(&self, key: &str) -> ApiResult<Option<Vec<u8>>> {
        let Some(raw) = self.txn.get(key)? else {
            return Ok(None);
        };
        if plaintext(key) {
            return Ok(Some(raw));
        }
        if self.barrier.sealed() {
            return Err(ApiError::Sealed);
        }
        self.barrier.decrypt(key, &raw).map(Some).ok_or_else(|| {
            ApiError::Internal(format!("stored value at {key:?} failed authentication"))
        })
    }

    pub fn get_json<T: DeserializeOwned>(&self, key: &str) -> ApiResult<Option<T>> {
        match self.get(key)? {
            None => Ok(None),
            Some(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
                ApiError::Internal(format!("stored value at {key:?} is malformed: {e}"))
            }),
        }
    }

    /// The stored form of a value: encrypted, except for the few plaintext keys.
    fn seal(&mut self, key: &str, value: &[u8]) -> ApiResult<Vec<u8>> {
        if plaintext(key) {
            return Ok(value.to_vec());
        }
        self.barrier
            .encrypt(key, value, self.rng)
            .ok_or(ApiError::Sealed)
    }

    /// Encrypts and stages one value.
    pub fn put(&mut self, key: &str, value: &[u8]) -> ApiResult<()> {
        let enc = self.seal(key, value)?;
        self.txn.put(key, enc);
        Ok(())
    }

    /// Encrypts and stages a key whose name was drawn at random (see [`Txn::put_new`]).
    pub fn put_new(&mut self, key: &str, value: &[u8]) -> ApiResult<()> {
        let enc = self.seal(key, value)?;
        self.txn.put_new(key, enc);
        Ok(())
    }

    pub fn put_json<T: Serialize>(&mut self, key: &str, value: &T) -> ApiResult<()> {
        let b = serde_json::to_vec(value).map_err(|e| ApiError::Internal(e.to_string()))?;
        self.put(key, &b)
    }

    /// [`Ctx::put_json`] for a key whose name was drawn at random.
    pub fn put_json_new<T: Serialize>(&mut self, key: &str, value: &T) -> ApiResult<()> {
        let b = serde_json::to_vec(value).map_err(|e| ApiError::Internal(e.to_string()))?;
        self.put_new(key, &b)
    }

    pub fn delete(&mut self, key: &str) {
        self.txn.delete(key);
    }

    /// Every key under `prefix` (full keys), in order.
    pub fn keys(&self, prefix: &str) -> ApiResult<Vec<String>> {
        Ok(self.txn.scan(prefix)?.into_iter().map(|(k, _)| k).collect())
    }

    /// The first keys under `prefix` (see [`Txn::first_keys`]): for sweeps that stop early.
    pub fn first_keys(&self, prefix: &str, limit: usize) -> ApiResult<Vec<String>> {
        Ok(self.txn.first_keys(prefix, limit)?)
    }

    /// Deletes every key under `prefix`.
    pub fn delete_prefix(&mut self, prefix: &str) -> ApiResult<()> {
        for k in self.keys(prefix)? {
            self.txn.delete(&k);
        }
        Ok(())
    }

    /// One level of children under `prefix`, folders with a trailing `/` (Vault LIST).
    pub fn list(&self, prefix: &str) -> ApiResult<Vec<String>> {
        let mut out: Vec<String> = Vec::new();
        for k in self.keys(prefix)? {
            let rest = &k[prefix.len()..];
            let child = match rest.find('/') {
                Some(i) => &rest[..=i],
                None => rest,
            };
            if out.last().map(String::as_str) != Some(child) {
                out.push(child.to_string());
            }
        }
        out.dedup();
        Ok(out)
    }

    pub fn rng(&mut self) -> &mut ChaCha20Rng {
        self.rng
    }
}
