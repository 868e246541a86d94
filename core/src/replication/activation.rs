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

// ---- Encrypted activation (`secondary_public_key`) ----------------------------------------
//
// `secondary/generate-public-key` makes an X25519 key pair on the secondary; the private half
// is node-local (`node/activation-key/<mode>`, barrier-encrypted; the activation wipe removes
// it). `primary/secondary-token` with `secondary_public_key` returns the credential bundle
// encrypted to that key (ECIES: ephemeral X25519, HKDF-SHA256, AES-256-GCM) instead of
// response-wrapped, so the secondary's `enable` decrypts it locally without calling the
// primary. The token is `enc.v1.<ephemeral public key>.<nonce || ciphertext>` (base64url).

const ENC_PREFIX: &str = "enc.v1.";
const HKDF_INFO: &[u8] = b"cairn replication activation v1";

/// Storage key of a mode's activation private key on a secondary (node-local).
pub fn private_key_key(mode: Mode) -> String {
    format!("node/activation-key/{}", mode.name())
}

/// What an encrypted activation token carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sealed {
    pub mode: Mode,
    /// Expiry, seconds since the epoch.
    pub exp: u64,
    pub bundle: super::state::Bundle,
}

/// Whether `token` is an encrypted activation token.
pub fn is_encrypted_token(token: &str) -> bool {
    token.trim().starts_with(ENC_PREFIX)
}

fn aead_key(shared: &[u8; 32], epk: &[u8; 32], rpk: &[u8; 32]) -> ApiResult<[u8; 32]> {
    let mut salt = epk.to_vec();
    salt.extend_from_slice(rpk);
    let hk = hkdf::Hkdf::<sha2::Sha256>::new(Some(&salt), shared);
    let mut k = [0u8; 32];
    hk.expand(HKDF_INFO, &mut k)
        .map_err(|_| ApiError::Internal("hkdf expand".into()))?;
    Ok(k)
}

fn parse_public_key(s: &str) -> ApiResult<[u8; 32]> {
    let t = s.trim();
    let raw = base64::engine::general_purpose::STANDARD
        .decode(t)
        .ok()
        .or_else(|| unb64(t));
    raw.and_then(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
        .ok_or_else(|| {
            ApiError::bad(
                "secondary_public_key: expected the base64 X25519 public key from secondary/generate-public-key",
            )
        })
}

/// At the secondary: a new key pair for `mode`; stores the private key and returns the
/// public key (base64).
pub fn generate_public_key(ctx: &mut Ctx, mode: Mode) -> ApiResult<String> {
    let mut sk = [0u8; 32];
    rand_core::RngCore::fill_bytes(ctx.rng(), &mut sk);
    let secret = x25519_dalek::StaticSecret::from(sk);
    let public = x25519_dalek::PublicKey::from(&secret);
    ctx.put(&private_key_key(mode), secret.as_bytes())?;
    Ok(base64::engine::general_purpose::STANDARD.encode(public.as_bytes()))
}

/// At the primary: encrypts `sealed` to the secondary's public key.
pub fn encrypt_to(ctx: &mut Ctx, public_key: &str, sealed: &Sealed) -> ApiResult<String> {
    let rpk = parse_public_key(public_key)?;
    let mut ek = [0u8; 32];
    rand_core::RngCore::fill_bytes(ctx.rng(), &mut ek);
    let esk = x25519_dalek::StaticSecret::from(ek);
    let epk = x25519_dalek::PublicKey::from(&esk);
    let shared = esk.diffie_hellman(&x25519_dalek::PublicKey::from(rpk));
    if !shared.was_contributory() {
        return Err(ApiError::bad(
            "secondary_public_key: not a usable X25519 public key",
        ));
    }
    let key = aead_key(shared.as_bytes(), epk.as_bytes(), &rpk)?;
    let pt = serde_json::to_vec(sealed).map_err(|e| ApiError::Internal(e.to_string()))?;
    let ct = crypto::seal(&key, ctx.rng(), &pt, ENC_PREFIX.as_bytes());
    Ok(format!("{ENC_PREFIX}{}.{}", b64(epk.as_bytes()), b64(&ct)))
}

/// At the secondary: decrypts an encrypted activation token with the stored private key and
/// checks its mode and expiry. Errors name what is wrong.
pub fn decrypt(ctx: &Ctx, mode: Mode, token: &str) -> ApiResult<super::state::Bundle> {
    let bad = |why: &str| ApiError::bad(format!("token: invalid activation token: {why}"));
    let rest = token
        .trim()
        .strip_prefix(ENC_PREFIX)
        .ok_or_else(|| bad("not an encrypted activation token"))?;
    let (e, c) = rest
        .split_once('.')
        .ok_or_else(|| bad("expected enc.v1.<key>.<ciphertext>"))?;
    let epk = unb64(e)
        .and_then(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
        .ok_or_else(|| bad("bad ephemeral key encoding"))?;
    let ct = unb64(c).ok_or_else(|| bad("bad ciphertext encoding"))?;
    let sk = ctx
        .get(&private_key_key(mode))?
        .and_then(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
        .ok_or_else(|| {
            bad(&format!(
                "it is encrypted, but this cluster has no {} activation key: call sys/replication/{}/secondary/generate-public-key and issue a new token for that key",
                mode.name(),
                mode.name()
            ))
        })?;
    let secret = x25519_dalek::StaticSecret::from(sk);
    let rpk = x25519_dalek::PublicKey::from(&secret);
    let shared = secret.diffie_hellman(&x25519_dalek::PublicKey::from(epk));
    let key = aead_key(shared.as_bytes(), &epk, rpk.as_bytes())?;
    let pt = crypto::open(&key, &ct, ENC_PREFIX.as_bytes()).ok_or_else(|| {
        bad("it cannot be decrypted with this cluster's key (issued for another key, or altered)")
    })?;
    let sealed: Sealed =
        serde_json::from_slice(&pt).map_err(|e| bad(&format!("malformed contents: {e}")))?;
    if sealed.mode != mode || sealed.bundle.mode != mode {
        return Err(bad(&format!(
            "it is for {} replication, not {}",
            sealed.mode.name(),
            mode.name()
        )));
    }
    if sealed.exp * 1000 <= ctx.now {
        return Err(bad("it has expired"));
    }
    Ok(sealed.bundle)
}

/// A `secondary/enable` or `secondary/update-primary` request whose encrypted activation
/// token was decrypted locally: queued by the handler, finished by [`finish_local`].
#[derive(Debug, Clone)]
pub(crate) struct LocalActivation {
    pub request: crate::api::RequestId,
    pub mode: Mode,
    /// `update-primary` (re-point a secondary to a new primary) rather than `enable`.
    pub update_primary: bool,
    pub bundle: super::state::Bundle,
}

/// Finishes the `enable`/`update-primary` requests whose encrypted token was decrypted
/// locally (queued by the handler, run by the node with the replication environment).
pub fn finish_local(env: &mut super::Env) -> Vec<(crate::api::RequestId, ApiResult)> {
    let queued = std::mem::take(&mut *env.st.local_activations);
    queued
        .into_iter()
        .map(|a| {
            let result = super::secondary::on_bundle(env, a.mode, a.update_primary, a.bundle);
            (a.request, result)
        })
        .collect()
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
