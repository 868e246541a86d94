//! The `shamir` target: key-share decoding, split/combine, and unsealing a 3-of-5 node with
//! arbitrary, real or altered shares.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)] // a broken promise panics: that is the finding

use super::harness::raw_harness;
use super::Bytes;
use crate::api::{Method, Request};
use crate::seal::{self, SealConfig};
use crate::storage::MemStorage;
use serde_json::json;
use std::sync::OnceLock;

/// Shamir share decoding: arbitrary key text through the share decoder, arbitrary shares
/// through the combiner, split/combine round trips, and a 3-of-5 sealed node given
/// arbitrary (or real, or altered) unseal keys answers 200 or 400 and unseals only with
/// keys that reconstruct the root key.
pub fn shamir(data: &[u8]) {
    let mut b = Bytes::new(data);
    let flags = b.byte();
    let text = b.string();
    let _ = seal::decode_share(&text);
    let t = b.byte() % 6;
    let n = b.byte() % 6;
    let cfg = SealConfig {
        secret_shares: n,
        secret_threshold: t,
    };
    let shares: Vec<Vec<u8>> = (0..usize::from(flags % 5))
        .map(|_| b.chunk().to_vec())
        .collect();
    if cfg.validate().is_ok() {
        let _ = seal::combine(&shares, &cfg);
        let mut root = [0u8; 32];
        let r = b.take(32);
        root[..r.len()].copy_from_slice(r);
        let mut rng = <rand_chacha::ChaCha20Rng as rand_core::SeedableRng>::seed_from_u64(1);
        let all = seal::split(&root, &cfg, &mut rng);
        assert_eq!(all.len(), usize::from(n));
        let got = seal::combine(&all[..usize::from(t)], &cfg);
        assert_eq!(got.ok(), Some(root), "split/combine {cfg:?}");
    }

    // A sealed 3-of-5 node.
    let (snap, keys) = sealed_node();
    let mut h = raw_harness(snap.clone(), 11);
    let mut used = Vec::new();
    for _ in 0..4 {
        if b.is_empty() {
            break;
        }
        let sel = b.byte();
        let key = match sel % 4 {
            0 => b.string(),
            1 => keys[usize::from(sel / 4) % keys.len()].clone(),
            _ => {
                // A real share, altered.
                let k = &keys[usize::from(sel / 4) % keys.len()];
                let mut raw = seal::decode_share(k).unwrap_or_default();
                if !raw.is_empty() {
                    let at = usize::from(b.byte()) % raw.len();
                    raw[at] ^= b.byte().max(1);
                }
                if sel % 4 == 2 {
                    hex::encode(raw)
                } else {
                    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, raw)
                }
            }
        };
        used.push(key.clone());
        let Some(r) =
            h.call(Request::new(0, Method::Put, "sys/unseal").with_json(json!({"key": key})))
        else {
            panic!("unseal: no response");
        };
        assert!(r.status == 200 || r.status == 400, "unseal: {r:?}");
    }
    if !h.node.is_sealed() {
        // Shamir shares are not authenticated: altered shares whose changes cancel out
        // still reconstruct the root key (the fuzzer finds such pairs). The promise is that
        // the node unseals only when three of the shares given reconstruct the real root.
        let cfg = SealConfig {
            secret_shares: 5,
            secret_threshold: 3,
        };
        let real: Vec<Vec<u8>> = keys
            .iter()
            .filter_map(|k| seal::decode_share(k).ok())
            .collect();
        let root = seal::combine(&real[..3], &cfg).ok();
        let given: Vec<Vec<u8>> = used
            .iter()
            .filter_map(|k| seal::decode_share(k).ok())
            .collect();
        let n = given.len();
        let mut ok = false;
        for i in 0..n {
            for j in i + 1..n {
                for k in j + 1..n {
                    let three = [given[i].clone(), given[j].clone(), given[k].clone()];
                    ok |= root.is_some() && seal::combine(&three, &cfg).ok() == root;
                }
            }
        }
        assert!(
            ok,
            "unsealed without shares that reconstruct the root: {used:?}"
        );
    }
}

fn sealed_node() -> &'static (MemStorage, Vec<String>) {
    static SEALED: OnceLock<(MemStorage, Vec<String>)> = OnceLock::new();
    SEALED.get_or_init(|| {
        let mut h = raw_harness(MemStorage::new(), 13);
        let r = h.call(
            Request::new(0, Method::Put, "sys/init")
                .with_json(json!({"secret_shares": 5, "secret_threshold": 3})),
        );
        let keys: Vec<String> = r
            .and_then(|r| r.body)
            .and_then(|b| b["keys"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|k| k.as_str().map(String::from))
            .collect();
        assert_eq!(keys.len(), 5, "init of the sealed node");
        (h.node.into_storage(), keys)
    })
}
