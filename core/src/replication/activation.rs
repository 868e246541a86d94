//! Activation tokens: what `primary/secondary-token` hands out.
//!
//! The credential bundle is response-wrapped under an ordinary single-use wrapping token with
//! a TTL. The activation token the operator carries is a JWT-shaped string
//! `header.claims.signature` whose claims say where to unwrap it (`addr`, the primary's API
//! address), for which mode, until when, and the inner wrapping token (`id`). It is signed
//! with HMAC-SHA256 under a key only the primary cluster holds
//! (`core/local-replication/activation-key`), so a token whose address or mode was altered is
//! refused by the primary when the secondary presents it to `sys/wrapping/unwrap`.

use super::Mode;
use crate::api::{body_object, ApiError, ApiResult, Fields, Request};
use crate::crypto;
use crate::ctx::Ctx;
use base64::Engine;
use serde::{Deserialize, Serialize};

pub const KEY: &str = "core/local-replication/activation-key";
const HEADER: &str = r#"{"alg":"HS256","typ":"JWT"}"#;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The primary's API address to unwrap at.
    pub addr: String,
    /// The inner wrapping token.
    pub id: String,
    pub mode: Mode,
    /// Expiry, seconds since the epoch.
    pub exp: u64,
    /// The secondary id it activates.
    pub jti: String,
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

fn unb64(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .ok()
}

fn signing_key(ctx: &mut Ctx) -> ApiResult<Vec<u8>> {
    if let Some(k) = ctx.get(KEY)? {
        return Ok(k);
    }
    let k = crypto::random_key(ctx.rng()).to_vec();
    ctx.put(KEY, &k)?;
    Ok(k)
}

/// Signs `claims` into an activation token.
pub fn issue(ctx: &mut Ctx, claims: &Claims) -> ApiResult<String> {
    let key = signing_key(ctx)?;
    let payload = serde_json::to_vec(claims).map_err(|e| ApiError::Internal(e.to_string()))?;
    let signed = format!("{}.{}", b64(HEADER.as_bytes()), b64(&payload));
    let sig = crypto::hmac_sha256(&key, signed.as_bytes());
    Ok(format!("{signed}.{}", b64(&sig)))
}

/// Whether `token` has the activation-token shape (three dot-separated parts).
pub fn is_activation_token(token: &str) -> bool {
    token.split('.').count() == 3
}

/// Reads the claims without checking the signature (the secondary cannot: only the primary
/// holds the key). Errors name what is wrong with the token.
pub fn decode(token: &str) -> Result<Claims, String> {
    let parts: Vec<&str> = token.trim().split('.').collect();
    if parts.len() != 3 {
        return Err("not an activation token (expected three dot-separated parts)".into());
    }
    let payload = unb64(parts[1]).ok_or("its claims are not base64url")?;
    serde_json::from_slice(&payload).map_err(|e| format!("its claims are malformed: {e}"))
}

/// At the primary: checks an activation token's signature and expiry; returns its claims.
pub fn verify(ctx: &mut Ctx, token: &str) -> ApiResult<Claims> {
    let invalid = |why: &str| ApiError::bad(format!("activation token is not valid: {why}"));
    let parts: Vec<&str> = token.trim().split('.').collect();
    if parts.len() != 3 {
        return Err(invalid("expected three dot-separated parts"));
    }
    let Some(key) = ctx.get(KEY)? else {
        return Err(invalid("this cluster issued no activation tokens"));
    };
    let sig = unb64(parts[2]).ok_or_else(|| invalid("bad signature encoding"))?;
    let want = crypto::hmac_sha256(&key, format!("{}.{}", parts[0], parts[1]).as_bytes());
    if !crypto::ct_eq(&sig, &want) {
        return Err(invalid(
            "signature mismatch (altered, or issued by another cluster)",
        ));
    }
    let claims = decode(token).map_err(|e| invalid(&e))?;
    if claims.exp * 1000 <= ctx.now {
        return Err(invalid("it has expired"));
    }
    Ok(claims)
}

/// `sys/wrapping/unwrap` with an activation token: verified, then rewritten to unwrap the
/// inner wrapping token. `None` when the request carries an ordinary wrapping token.
pub fn unwrap_request(ctx: &mut Ctx, req: &Request) -> ApiResult<Option<Request>> {
    let body = body_object(&req.body)?;
    let token = match Fields(&body).str("token")? {
        Some(t) if !t.is_empty() => t,
        _ => match &req.token {
            Some(t) => t.clone(),
            None => return Ok(None),
        },
    };
    if !is_activation_token(&token) {
        return Ok(None);
    }
    let claims = verify(ctx, &token)?;
    let mut r = req.clone();
    r.token = None;
    r.body = serde_json::to_vec(&serde_json::json!({ "token": claims.id })).unwrap_or_default();
    Ok(Some(r))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::Barrier;
    use crate::storage::{MemStorage, Txn};
    use rand_core::SeedableRng;

    #[test]
    fn signed_claims_roundtrip_and_tamper() {
        let s = MemStorage::new();
        let mut b = Barrier::default();
        b.unseal_with([7; 32]);
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(1);
        let mut ctx = Ctx {
            txn: Txn::new(&s),
            barrier: &b,
            rng: &mut rng,
            now: 1_000,
        };
        let c = Claims {
            addr: "http://127.0.0.1:8200".into(),
            id: "cs.abc".into(),
            mode: Mode::Dr,
            exp: 100,
            jti: "s1".into(),
        };
        let t = issue(&mut ctx, &c).unwrap();
        assert_eq!(decode(&t).unwrap(), c);
        assert_eq!(verify(&mut ctx, &t).unwrap(), c);
        let mut evil = c.clone();
        evil.addr = "http://evil:1".into();
        let parts: Vec<&str> = t.split('.').collect();
        let forged = format!(
            "{}.{}.{}",
            parts[0],
            b64(&serde_json::to_vec(&evil).unwrap()),
            parts[2]
        );
        assert!(verify(&mut ctx, &forged)
            .unwrap_err()
            .to_string()
            .contains("signature"));
        ctx.now = 200_000;
        assert!(verify(&mut ctx, &t)
            .unwrap_err()
            .to_string()
            .contains("expired"));
        assert!(decode("garbage").is_err());
    }
}
