//! `sys/generate-root`: a new root token from a threshold of root key shares, returned
//! encoded with a one-time password (the reference's flow: `encoded_token` is the token's
//! bytes XORed with the OTP's, base64) or encrypted to an operator's OpenPGP key. The OTP is
//! the operator's (`otp`, e.g. from `bao operator generate-root -generate-otp`) or, given
//! neither `otp` nor `pgp_key`, generated here and returned once by the call that starts.
//!
//! Replication needs it: a performance secondary's tokens are wiped at activation and it
//! unseals with the primary's key shares, so an operator mints its first token this way.
//! Unauthenticated (the key shares are the authorization); one attempt at a time, kept in
//! memory.

use crate::api::{body_object, ApiError, ApiResult, Fields, Method, Reply, Request};
use crate::crypto;
use crate::ctx::Ctx;
use crate::replication::dr_token;
use crate::replication::dr_token::openpgp;
use crate::seal::{self, Added, SealConfig, ShareAttempt};
use crate::token::{self, NewToken};
use serde_json::json;

/// Length of a client token (`cs.` + 24), and so of the OTP.
const OTP_LEN: usize = 27;

#[derive(Debug, Clone)]
pub struct Attempt {
    nonce: String,
    /// The OTP the token is XORed with; empty when it is encrypted to `pgp_key`.
    otp: String,
    /// The operator's OpenPGP public key as given (base64 or armored); empty without PGP.
    pgp_key: String,
    pgp_fingerprint: String,
    shares: ShareAttempt,
}

fn config(ctx: &Ctx) -> ApiResult<SealConfig> {
    ctx.get_json(seal::SEAL_CONFIG_KEY)?
        .ok_or_else(|| ApiError::bad("Vault is not initialized"))
}

fn view(a: Option<&Attempt>, required: u8, encoded: &str) -> serde_json::Value {
    json!({
        "started": a.is_some(),
        "nonce": a.map(|a| a.nonce.clone()).unwrap_or_default(),
        "progress": a.map(|a| a.shares.progress()).unwrap_or(0),
        "required": required,
        "encoded_token": encoded,
        "encoded_root_token": encoded,
        "pgp_fingerprint": a.map(|a| a.pgp_fingerprint.clone()).unwrap_or_default(),
        "otp_length": OTP_LEN,
        "complete": !encoded.is_empty(),
    })
}

/// The operator's OTP: [`OTP_LEN`] base62 characters.
fn check_otp(otp: &str) -> ApiResult<()> {
    if otp.len() != OTP_LEN || !otp.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(ApiError::bad(format!(
            "otp: must be {OTP_LEN} base62 characters (the length of a root token; \
             GET sys/generate-root/attempt says otp_length), got {}",
            otp.len()
        )));
    }
    Ok(())
}

/// A new attempt from the body of `POST .../attempt`: `otp` (the operator's, [`OTP_LEN`]
/// base62 characters), `pgp_key`, or neither (an OTP generated here).
fn start(ctx: &mut Ctx, body: &serde_json::Map<String, serde_json::Value>) -> ApiResult<Attempt> {
    let f = Fields(body);
    let dr_token::Delivery {
        pgp_key,
        pgp_fingerprint,
        otp: given_otp,
    } = dr_token::delivery(&f, check_otp)?;
    let nonce = crypto::uuid(ctx.rng());
    let otp = if !pgp_key.is_empty() {
        String::new()
    } else if given_otp.is_empty() {
        crypto::base62(ctx.rng(), OTP_LEN)
    } else {
        given_otp
    };
    Ok(Attempt {
        nonce,
        otp,
        pgp_key,
        pgp_fingerprint,
        shares: ShareAttempt::default(),
    })
}

/// `sys/generate-root/<tail>`.
/// `slot` is the node's attempt in progress (at most one).
pub fn handle(ctx: &mut Ctx, slot: &mut Option<Attempt>, req: &Request, tail: &str) -> ApiResult {
    let cfg = config(ctx)?;
    match (req.method, tail) {
        (Method::Get, "attempt") => Ok(Reply::Raw(
            200,
            view(slot.as_ref(), cfg.secret_threshold, ""),
        )),
        (Method::Post | Method::Put, "attempt") => {
            if slot.is_some() {
                return Err(ApiError::bad(
                    "a root generation attempt is already in progress; cancel it first",
                ));
            }
            let body = body_object(&req.body)?;
            let a = start(ctx, &body)?;
            let mut v = view(Some(&a), cfg.secret_threshold, "");
            // The OTP is returned only when it was generated here.
            let generated = a.pgp_key.is_empty()
                && Fields(&body)
                    .str("otp")?
                    .is_none_or(|o| o.trim().is_empty());
            v["otp"] = json!(if generated { a.otp.as_str() } else { "" });
            *slot = Some(a);
            Ok(Reply::Raw(200, v))
        }
        (Method::Delete, "attempt") => {
            *slot = None;
            Ok(Reply::Empty)
        }
        (Method::Post | Method::Put, "update") => {
            let body = body_object(&req.body)?;
            let f = Fields(&body);
            let key = f.req_str("key")?;
            let nonce = f.req_str("nonce")?;
            let Some(a) = slot.as_mut() else {
                return Err(ApiError::bad("no root generation attempt in progress"));
            };
            if !crypto::ct_eq(a.nonce.as_bytes(), nonce.as_bytes()) {
                return Err(ApiError::bad("nonce: does not match the current attempt"));
            }
            // A malformed share is refused before it counts: the progress is kept.
            let share = seal::decode_checked_share(&key, &cfg)
                .map_err(|e| ApiError::bad(format!("key: {e}")))?;
            if a.shares.add(share) == Added::Duplicate {
                return Err(ApiError::bad("key: this key share was already provided"));
            }
            if !a.shares.complete(&cfg) {
                let v = view(Some(a), cfg.secret_threshold, "");
                return Ok(Reply::Raw(200, v));
            }
            let Some(a) = slot.take() else {
                return Err(ApiError::bad("no root generation attempt in progress"));
            };
            let keyring = ctx.get(seal::KEYRING_KEY)?;
            a.shares
                .recover(&cfg, keyring.as_deref())
                .map_err(|e| ApiError::bad(format!("root generation failed: {e}")))?;
            let (id, _) = token::create(
                ctx,
                NewToken {
                    policies: vec!["root".into()],
                    path: "auth/token/root".into(),
                    display_name: "root".into(),
                    ..Default::default()
                },
            )?;
            let encoded = if a.pgp_key.is_empty() {
                dr_token::encode_token(&id, &a.otp).map_err(ApiError::Internal)?
            } else {
                let key = openpgp::parse_public_key(&a.pgp_key)
                    .map_err(|e| ApiError::bad(format!("pgp_key: {e}")))?;
                let msg = openpgp::encrypt(&key, id.as_bytes(), ctx.rng()).map_err(|e| {
                    ApiError::Internal(format!("encrypting the token to the PGP key: {e}"))
                })?;
                base64::Engine::encode(&base64::engine::general_purpose::STANDARD, msg)
            };
            Ok(Reply::Raw(
                200,
                view(Some(&a), cfg.secret_threshold, &encoded),
            ))
        }
        (_, "attempt" | "update") => Err(ApiError::MethodNotAllowed),
        _ => Err(ApiError::NotFound(String::new())),
    }
}

#[cfg(test)]
mod tests {
    use crate::api::{Method, Request, Response};
    use crate::node::{Node, NodeConfig};
    use crate::storage::MemStorage;
    use serde_json::{json, Value};

    fn call(n: &mut Node<MemStorage>, id: u64, m: Method, path: &str, body: Value) -> Response {
        crate::node::tests::call(n, 2_000, Request::new(id, m, path).with_json(body))
    }

    /// An initialised, unsealed node with 3 shares of threshold 2: (node, shares).
    fn node() -> (Node<MemStorage>, Vec<String>) {
        let mut n = Node::new(MemStorage::new(), [4; 32], NodeConfig::default());
        let b = call(
            &mut n,
            1,
            Method::Put,
            "sys/init",
            json!({"secret_shares": 3, "secret_threshold": 2}),
        )
        .body
        .unwrap();
        let keys: Vec<String> = b["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_string())
            .collect();
        for (i, k) in keys.iter().take(2).enumerate() {
            call(
                &mut n,
                2 + i as u64,
                Method::Put,
                "sys/unseal",
                json!({"key": k}),
            );
        }
        assert!(!n.is_sealed());
        (n, keys)
    }

    #[test]
    fn the_operators_otp_encodes_the_token_and_a_malformed_share_keeps_the_progress() {
        let (mut n, keys) = node();
        let otp = "A".repeat(super::OTP_LEN);
        // A wrong-length OTP is refused; nothing starts.
        let r = call(
            &mut n,
            10,
            Method::Put,
            "sys/generate-root/attempt",
            json!({"otp": "short"}),
        );
        assert_eq!(r.status, 400, "{:?}", r.body);
        let r = call(
            &mut n,
            11,
            Method::Put,
            "sys/generate-root/attempt",
            json!({"otp": otp}),
        );
        assert_eq!(r.status, 200);
        let b = r.body.unwrap();
        assert_eq!(b["otp"], json!(""), "the operator's OTP is not echoed");
        let nonce = b["nonce"].as_str().unwrap().to_string();
        let upd = |n: &mut Node<MemStorage>, id, key: &str| {
            call(
                n,
                id,
                Method::Put,
                "sys/generate-root/update",
                json!({"key": key, "nonce": nonce}),
            )
        };
        let r = upd(&mut n, 12, &keys[0]);
        assert_eq!(r.body.unwrap()["progress"], json!(1));
        // "AAAA" decodes (as hex) but is no share: refused, the progress stays 1.
        let r = upd(&mut n, 13, "AAAA");
        assert_eq!(r.status, 400);
        let r = call(
            &mut n,
            14,
            Method::Get,
            "sys/generate-root/attempt",
            json!(null),
        );
        assert_eq!(r.body.unwrap()["progress"], json!(1));
        let r = upd(&mut n, 15, &keys[2]);
        let b = r.body.unwrap();
        assert_eq!(b["complete"], json!(true), "{b}");
        assert_eq!(b["progress"], json!(2));
        assert_eq!(b["nonce"], json!(nonce));
        let token =
            crate::replication::dr_token::decode_token(b["encoded_token"].as_str().unwrap(), &otp)
                .unwrap();
        let r = crate::node::tests::call(
            &mut n,
            2_000,
            Request::new(16, Method::Get, "auth/token/lookup-self").with_token(&token),
        );
        assert_eq!(r.body.unwrap()["data"]["policies"], json!(["root"]));
        // Without an OTP, one is generated and returned by the start only.
        let r = call(
            &mut n,
            17,
            Method::Put,
            "sys/generate-root/attempt",
            json!({}),
        );
        let b = r.body.unwrap();
        assert_eq!(b["otp"].as_str().unwrap().len(), super::OTP_LEN);
        // A PGP key that is not one is refused.
        call(
            &mut n,
            18,
            Method::Delete,
            "sys/generate-root/attempt",
            json!(null),
        );
        let r = call(
            &mut n,
            19,
            Method::Put,
            "sys/generate-root/attempt",
            json!({"pgp_key": "bm90IGEga2V5"}),
        );
        assert_eq!(r.status, 400);
        assert!(r.body.unwrap()["errors"][0]
            .as_str()
            .unwrap()
            .contains("pgp_key"));
    }
}
