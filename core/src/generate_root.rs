//! `sys/generate-root`: a new root token from a threshold of root key shares, returned
//! encoded with a one-time password (the reference's flow: `encoded_token` is the token's
//! bytes XORed with the OTP's, base64).
//!
//! Replication needs it: a performance secondary's tokens are wiped at activation and it
//! unseals with the primary's key shares, so an operator mints its first token this way.
//! Unauthenticated (the key shares are the authorization); one attempt at a time, kept in
//! memory.

use crate::api::{body_object, ApiError, ApiResult, Fields, Method, Reply, Request};
use crate::crypto;
use crate::ctx::Ctx;
use crate::replication::dr_token;
use crate::seal::{self, Added, SealConfig, ShareAttempt};
use crate::token::{self, NewToken};
use serde_json::json;

/// Length of a client token (`cs.` + 24), and so of the OTP.
const OTP_LEN: usize = 27;

#[derive(Debug, Clone)]
pub struct Attempt {
    nonce: String,
    otp: String,
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
        "pgp_fingerprint": "",
        "otp_length": OTP_LEN,
        "complete": !encoded.is_empty(),
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
            if Fields(&body).str("pgp_key")?.is_some_and(|k| !k.is_empty()) {
                return Err(ApiError::bad("pgp_key: not supported for root generation"));
            }
            let a = Attempt {
                nonce: crypto::uuid(ctx.rng()),
                otp: crypto::base62(ctx.rng(), OTP_LEN),
                shares: ShareAttempt::default(),
            };
            let mut v = view(Some(&a), cfg.secret_threshold, "");
            v["otp"] = json!(a.otp);
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
            let share = seal::decode_share(&key).map_err(|e| ApiError::bad(format!("key: {e}")))?;
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
            let encoded = dr_token::encode_token(&id, &a.otp).map_err(ApiError::Internal)?;
            Ok(Reply::Raw(200, view(None, cfg.secret_threshold, &encoded)))
        }
        (_, "attempt" | "update") => Err(ApiError::MethodNotAllowed),
        _ => Err(ApiError::NotFound(String::new())),
    }
}
