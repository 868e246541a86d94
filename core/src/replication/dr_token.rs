//! The DR operation token: the credential that authorizes the sensitive operations of a DR
//! secondary (promote, disable, update-primary, operation-token delete, reindex, Merkle
//! check), and the multi-step key-share process that generates it.
//!
//! Endpoints (under `sys/replication/dr/secondary/`, unauthenticated like the reference's
//! `sys/generate-root`: the key shares are the authorization):
//!
//! * `GET generate-operation-token/attempt` — the attempt (started, nonce, progress, required,
//!   encoded_token, pgp_fingerprint, otp_length, complete; never the OTP).
//! * `POST|PUT generate-operation-token/attempt {pgp_key?, otp?}` — starts one attempt (only
//!   one at a time). The node draws the nonce and a base62 one-time password as long as the
//!   token from its seeded RNG and returns the OTP this once; with `pgp_key` (an OpenPGP public
//!   key, base64 of the binary key or ASCII-armored) the token is encrypted to that key instead
//!   and its fingerprint is reported. `otp` lets a client supply its own base62 OTP of
//!   [`TOKEN_LEN`] characters (it is then not echoed).
//! * `DELETE generate-operation-token/attempt` — cancels the attempt.
//! * `POST|PUT generate-operation-token/update {key, nonce}` — one root key share (hex or
//!   base64). The nonce must match; a share already given is refused. When `required` (the
//!   seal threshold) shares are in, they are combined and checked against the stored keyring
//!   (on a DR secondary: the primary's, replicated); wrong shares are refused and the progress
//!   reset. On success the token is created and returned as `encoded_token`: base64 (unpadded,
//!   as the reference encodes root tokens) of the token's bytes XORed with the OTP's bytes, or
//!   base64 of the OpenPGP message encrypted to `pgp_key`.
//! * `POST|PUT operation-token/delete {dr_operation_token}` — deletes that token.
//!
//! The token has no TTL and is local to this node: only its salted HMAC is stored, next to
//! the attempt, under the node-local prefix [`PREFIX`] (never replicated; values pass through
//! the barrier like every other stored value). [`check_dr_operation_token`] is what the
//! protected operations call; it compares in constant time and refuses a missing, wrong or
//! deleted token with [`ApiError::Forbidden`] before anything is changed.

use crate::api::{body_object, ApiError, ApiResult, Fields, Method, Reply, Request};
use crate::crypto;
use crate::ctx::Ctx;
use crate::seal::{self, Added, SealConfig, ShareAttempt};
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// Node-local storage prefix of everything this module keeps.
pub const PREFIX: &str = "node/dr-token/";
/// The generation attempt in progress (absent when there is none).
pub const ATTEMPT_KEY: &str = "node/dr-token/attempt";
/// The salted hashes of the DR operation tokens that exist on this node.
pub const HASH_KEY: &str = "node/dr-token/hash";
/// The salt of those hashes (drawn once, node-local).
pub const SALT_KEY: &str = "node/dr-token/salt";

/// Prefix of DR operation tokens (client tokens start with `cs.`).
pub const TOKEN_PREFIX: &str = "cdr.";
/// Length of a DR operation token, and so of the OTP.
pub const TOKEN_LEN: usize = 28;
/// Most DR operation tokens kept at once; generating one more drops the oldest.
pub const MAX_TOKENS: usize = 32;

/// Whether generation and the protected operations run only on a DR secondary (they do: the
/// DR secondary holds the primary's seal configuration and checks the shares against it).
pub const REQUIRE_DR_SECONDARY: bool = true;

const BASE: &str = "sys/replication/dr/secondary/";
const ATTEMPT: &str = "generate-operation-token/attempt";
const UPDATE: &str = "generate-operation-token/update";
const DELETE: &str = "operation-token/delete";

/// The body field carrying the token in protected operations.
pub const FIELD: &str = "dr_operation_token";

/// Whether this module serves `path` (full path, e.g.
/// `sys/replication/dr/secondary/generate-operation-token/attempt`).
pub fn owns(path: &str) -> bool {
    path.strip_prefix(BASE).is_some_and(owns_tail)
}

fn owns_tail(t: &str) -> bool {
    matches!(t, ATTEMPT | UPDATE | DELETE)
}

/// Refuses unless this node may serve DR operation token requests (see
/// [`REQUIRE_DR_SECONDARY`]).
pub fn require_dr_secondary(is_dr_secondary: bool) -> ApiResult<()> {
    if REQUIRE_DR_SECONDARY && !is_dr_secondary {
        return Err(ApiError::bad(
            "this cluster is not a DR secondary: DR operation tokens are generated and used on a DR secondary",
        ));
    }
    Ok(())
}

/// A generation attempt, kept in node-local storage (encrypted by the barrier).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Attempt {
    nonce: String,
    /// The OTP the token is XORed with; empty when the token is PGP-encrypted.
    otp: String,
    /// The OpenPGP public key as given (base64 or armored); empty without PGP.
    #[serde(default)]
    pgp_key: String,
    #[serde(default)]
    pgp_fingerprint: String,
    /// Key shares given so far, hex.
    #[serde(default)]
    shares: Vec<String>,
}

/// Salted hashes of the tokens of this node.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Tokens {
    hashes: Vec<TokenHash>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct TokenHash {
    hash: String,
    created_ms: u64,
}

/// Handles `sys/replication/<tail>` for the paths [`owns`] names: root namespace, license and
/// (when switched on) the DR secondary role first, then the operation.
/// Reads only the node's license and whether it is a DR secondary.
pub fn handle(
    ctx: &mut Ctx,
    license: &crate::license::LicenseState,
    is_dr_secondary: bool,
    req: &Request,
    tail: &str,
) -> ApiResult {
    let op = tail
        .strip_prefix("dr/secondary/")
        .filter(|t| owns_tail(t))
        .ok_or_else(|| ApiError::NotFound(String::new()))?;
    let ns = req.namespace.as_deref().unwrap_or("").trim_matches('/');
    if !ns.is_empty() && ns != "root" {
        return Err(ApiError::bad(format!(
            "replication endpoints can be called only from the root namespace, not from namespace {ns:?}"
        )));
    }
    crate::license::require(license, ctx.now, crate::license::FEATURE_REPLICATION)?;
    require_dr_secondary(is_dr_secondary)?;
    dispatch(ctx, req, op)
}

/// The operations themselves, after the gates.
fn dispatch(ctx: &mut Ctx, req: &Request, op: &str) -> ApiResult {
    match (op, req.method) {
        (ATTEMPT, Method::Get) => status(ctx),
        (ATTEMPT, Method::Post | Method::Put) => start(ctx, &body_object(&req.body)?),
        (ATTEMPT, Method::Delete) => cancel(ctx),
        (UPDATE, Method::Post | Method::Put) => update(ctx, &body_object(&req.body)?),
        (DELETE, Method::Post | Method::Put) => delete_token(ctx, &body_object(&req.body)?),
        _ => Err(ApiError::MethodNotAllowed),
    }
}

fn seal_config(ctx: &Ctx) -> ApiResult<SealConfig> {
    let b = ctx.get(seal::SEAL_CONFIG_KEY)?.ok_or_else(|| {
        ApiError::bad("this node is not initialized: it has no seal configuration")
    })?;
    serde_json::from_slice(&b).map_err(|e| ApiError::Internal(format!("seal config: {e}")))
}

fn load_attempt(ctx: &Ctx) -> ApiResult<Option<Attempt>> {
    ctx.get_json(ATTEMPT_KEY)
}

/// The attempt object as the API shows it.
fn view(a: Option<&Attempt>, required: u8) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("started".into(), json!(a.is_some()));
    m.insert(
        "nonce".into(),
        json!(a.map(|a| a.nonce.as_str()).unwrap_or("")),
    );
    m.insert(
        "progress".into(),
        json!(a.map(|a| a.shares.len()).unwrap_or(0)),
    );
    m.insert("required".into(), json!(required));
    m.insert("encoded_token".into(), json!(""));
    m.insert(
        "pgp_fingerprint".into(),
        json!(a.map(|a| a.pgp_fingerprint.as_str()).unwrap_or("")),
    );
    let otp_length = match a {
        Some(a) if a.pgp_key.is_empty() => TOKEN_LEN,
        _ => 0,
    };
    m.insert("otp_length".into(), json!(otp_length));
    m.insert("complete".into(), json!(false));
    m
}

/// `GET .../attempt`.
fn status(ctx: &Ctx) -> ApiResult {
    let cfg = seal_config(ctx)?;
    let a = load_attempt(ctx)?;
    Ok(Reply::Raw(
        200,
        Value::Object(view(a.as_ref(), cfg.secret_threshold)),
    ))
}

/// How a new attempt's token is to reach the operator: encrypted to `pgp_key` (with its
/// fingerprint), or encoded with the operator's `otp`; neither given, the caller generates an
/// OTP. Shared by the DR operation token and generate-root, each with its own OTP check.
pub(crate) struct Delivery {
    pub pgp_key: String,
    pub pgp_fingerprint: String,
    pub otp: String,
}

/// Reads `pgp_key` and `otp` from an attempt's body: not both, the key parsed, the OTP
/// checked by `check_otp`.
pub(crate) fn delivery(f: &Fields, check_otp: fn(&str) -> ApiResult<()>) -> ApiResult<Delivery> {
    let pgp_key = f.str("pgp_key")?.unwrap_or_default().trim().to_string();
    let otp = f.str("otp")?.unwrap_or_default().trim().to_string();
    if !pgp_key.is_empty() && !otp.is_empty() {
        return Err(ApiError::bad(
            "pgp_key and otp: give one or the other (the token is either encrypted to the PGP key or encoded with the OTP)",
        ));
    }
    let mut pgp_fingerprint = String::new();
    if !pgp_key.is_empty() {
        let key = openpgp::parse_public_key(&pgp_key)
            .map_err(|e| ApiError::bad(format!("pgp_key: {e}")))?;
        pgp_fingerprint = openpgp::fingerprint(&key);
    }
    if !otp.is_empty() {
        check_otp(&otp)?;
    }
    Ok(Delivery {
        pgp_key,
        pgp_fingerprint,
        otp,
    })
}

/// `POST .../attempt`.
fn start(ctx: &mut Ctx, body: &Map<String, Value>) -> ApiResult {
    let f = Fields(body);
    f.only(&["pgp_key", "otp"])?;
    let cfg = seal_config(ctx)?;
    if let Some(a) = load_attempt(ctx)? {
        return Err(ApiError::bad(format!(
            "a DR operation token generation attempt is already in progress (nonce {}); \
             finish it, or cancel it with DELETE sys/replication/dr/secondary/generate-operation-token/attempt",
            a.nonce
        )));
    }
    let Delivery {
        pgp_key,
        pgp_fingerprint,
        otp: given_otp,
    } = delivery(&f, check_otp)?;
    let nonce = crypto::uuid(ctx.rng());
    let generated = pgp_key.is_empty() && given_otp.is_empty();
    let otp = if generated {
        crypto::base62(ctx.rng(), TOKEN_LEN)
    } else {
        given_otp
    };
    let a = Attempt {
        nonce,
        otp: if pgp_key.is_empty() {
            otp.clone()
        } else {
            String::new()
        },
        pgp_key,
        pgp_fingerprint,
        shares: Vec::new(),
    };
    ctx.put_json(ATTEMPT_KEY, &a)?;
    let mut m = view(Some(&a), cfg.secret_threshold);
    m.insert(
        "otp".into(),
        json!(if generated { otp } else { String::new() }),
    );
    Ok(Reply::Raw(200, Value::Object(m)))
}

fn check_otp(otp: &str) -> ApiResult<()> {
    if otp.len() != TOKEN_LEN || !otp.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(ApiError::bad(format!(
            "otp: must be {TOKEN_LEN} base62 characters (0-9, A-Z, a-z), the length of a DR operation token; \
             leave it out to have the server generate one"
        )));
    }
    Ok(())
}

/// `DELETE .../attempt`.
fn cancel(ctx: &mut Ctx) -> ApiResult {
    ctx.delete(ATTEMPT_KEY);
    Ok(Reply::Empty)
}

/// A 400 answer that still commits the handler's writes (the reset progress).
fn refused_keeping_writes(msg: String) -> ApiResult {
    Ok(Reply::Raw(400, json!({ "errors": [msg] })))
}

/// `POST .../update`.
fn update(ctx: &mut Ctx, body: &Map<String, Value>) -> ApiResult {
    let f = Fields(body);
    f.only(&["key", "nonce"])?;
    let cfg = seal_config(ctx)?;
    let mut a = load_attempt(ctx)?.ok_or_else(|| {
        ApiError::bad(
            "no DR operation token generation attempt is in progress; start one with \
             POST sys/replication/dr/secondary/generate-operation-token/attempt",
        )
    })?;
    let nonce = f.req_str("nonce")?;
    if !crypto::ct_eq(nonce.trim().as_bytes(), a.nonce.as_bytes()) {
        return Err(ApiError::bad(format!(
            "nonce: {:?} does not match the nonce of the generation attempt in progress; \
             use the nonce printed when the attempt started (GET .../generate-operation-token/attempt shows it)",
            nonce.trim()
        )));
    }
    let key = f.req_str("key")?;
    let share = seal::decode_share(&key).map_err(|e| ApiError::bad(format!("key: {e}")))?;
    let want = if cfg.secret_shares == 1 { 32 } else { 33 };
    if share.len() != want {
        return Err(ApiError::bad(format!(
            "key: not a root key share of this cluster (expected {want} bytes, got {}); progress is unchanged",
            share.len()
        )));
    }
    let mut have =
        ShareAttempt::from_hex(&a.shares).map_err(|e| ApiError::Internal(e.to_string()))?;
    if have.add(share) == Added::Duplicate {
        return Err(ApiError::bad(format!(
            "key: this key share was already provided in this attempt; progress stays {} of {}",
            have.progress(),
            cfg.secret_threshold
        )));
    }
    let required = cfg.secret_threshold as usize;
    if !have.complete(&cfg) {
        a.shares = have.to_hex();
        ctx.put_json(ATTEMPT_KEY, &a)?;
        let mut m = view(Some(&a), cfg.secret_threshold);
        m.remove("otp_length");
        return Ok(Reply::Raw(200, Value::Object(m)));
    }
    // Threshold reached: the shares must reconstruct the root key that opens the keyring.
    let keyring = ctx.get(seal::KEYRING_KEY)?;
    let ok = have.recover(&cfg, keyring.as_deref());
    if ok.is_err() {
        a.shares.clear();
        ctx.put_json(ATTEMPT_KEY, &a)?;
        return refused_keeping_writes(format!(
            "the {required} key shares given do not reconstruct this cluster's root key \
             (a share is wrong or from another cluster); progress was reset to 0 of {required}, \
             the attempt (nonce {}) stays open: provide the shares again",
            a.nonce
        ));
    }
    let token = format!(
        "{TOKEN_PREFIX}{}",
        crypto::base62(ctx.rng(), TOKEN_LEN - TOKEN_PREFIX.len())
    );
    let encoded = if a.pgp_key.is_empty() {
        encode_token(&token, &a.otp).map_err(ApiError::Internal)?
    } else {
        let key = openpgp::parse_public_key(&a.pgp_key)
            .map_err(|e| ApiError::bad(format!("pgp_key: {e}")))?;
        let msg = openpgp::encrypt(&key, token.as_bytes(), ctx.rng())
            .map_err(|e| ApiError::Internal(format!("encrypting the token to the PGP key: {e}")))?;
        base64::engine::general_purpose::STANDARD.encode(msg)
    };
    store_token(ctx, &token)?;
    ctx.delete(ATTEMPT_KEY);
    let mut m = view(Some(&a), cfg.secret_threshold);
    m.insert("progress".into(), json!(required));
    m.insert("encoded_token".into(), json!(encoded));
    m.insert("complete".into(), json!(true));
    m.remove("otp_length");
    Ok(Reply::Raw(200, Value::Object(m)))
}

fn salt(ctx: &mut Ctx) -> ApiResult<Vec<u8>> {
    if let Some(s) = ctx.get(SALT_KEY)? {
        return Ok(s);
    }
    let s = crypto::random_key(ctx.rng()).to_vec();
    ctx.put(SALT_KEY, &s)?;
    Ok(s)
}

fn token_hash(salt: &[u8], token: &str) -> [u8; 32] {
    crypto::hmac_sha256(salt, token.as_bytes())
}

fn store_token(ctx: &mut Ctx, token: &str) -> ApiResult<()> {
    let s = salt(ctx)?;
    let mut t: Tokens = ctx.get_json(HASH_KEY)?.unwrap_or_default();
    t.hashes.push(TokenHash {
        hash: hex::encode(token_hash(&s, token)),
        created_ms: ctx.now,
    });
    if t.hashes.len() > MAX_TOKENS {
        let extra = t.hashes.len() - MAX_TOKENS;
        t.hashes.drain(..extra);
    }
    ctx.put_json(HASH_KEY, &t)
}

/// Index of the stored token matching `token`, compared in constant time over all of them.
fn find_token(ctx: &Ctx, token: &str) -> ApiResult<Option<(Tokens, usize)>> {
    let Some(s) = ctx.get(SALT_KEY)? else {
        return Ok(None);
    };
    let Some(t) = ctx.get_json::<Tokens>(HASH_KEY)? else {
        return Ok(None);
    };
    let h = token_hash(&s, token);
    let mut found = None;
    for (i, e) in t.hashes.iter().enumerate() {
        let stored = hex::decode(&e.hash).unwrap_or_default();
        if crypto::ct_eq(&stored, &h) && found.is_none() {
            found = Some(i);
        }
    }
    Ok(found.map(|i| (t, i)))
}

/// Refuses unless `token` is a DR operation token of this node. This is what the protected
/// DR operations (promote, disable, update-primary, operation-token delete, reindex,
/// merkle-check) call before they change anything. An empty `token` counts as missing.
pub fn check_dr_operation_token(ctx: &Ctx, token: &str) -> Result<(), ApiError> {
    let token = token.trim();
    if token.is_empty() {
        return Err(ApiError::Forbidden(format!(
            "missing required field {FIELD:?}: this DR operation is authorized by a DR operation token \
             (generate one with `cairn operator generate-root -dr-token`)"
        )));
    }
    if find_token(ctx, token)?.is_some() {
        return Ok(());
    }
    if !token.starts_with(TOKEN_PREFIX) {
        return Err(ApiError::Forbidden(format!(
            "{FIELD}: not a DR operation token (a client or root token does not authorize DR operations); \
             generate one with `cairn operator generate-root -dr-token`"
        )));
    }
    Err(ApiError::Forbidden(format!(
        "{FIELD}: invalid DR operation token: it does not exist on this node \
         (it is wrong, was deleted, or was generated on another node)"
    )))
}

/// [`check_dr_operation_token`] on the `dr_operation_token` field of a request body.
pub fn check_body(ctx: &Ctx, body: &Map<String, Value>) -> Result<(), ApiError> {
    let t = Fields(body)
        .str(FIELD)
        .map_err(|_| ApiError::Forbidden(format!("{FIELD}: expected a string")))?
        .unwrap_or_default();
    check_dr_operation_token(ctx, &t)
}

/// `POST operation-token/delete`.
fn delete_token(ctx: &mut Ctx, body: &Map<String, Value>) -> ApiResult {
    check_body(ctx, body)?;
    let t = Fields(body).str(FIELD)?.unwrap_or_default();
    if let Some((mut tokens, i)) = find_token(ctx, t.trim())? {
        tokens.hashes.remove(i);
        if tokens.hashes.is_empty() {
            ctx.delete(HASH_KEY);
        } else {
            ctx.put_json(HASH_KEY, &tokens)?;
        }
    }
    Ok(Reply::Empty)
}

/// The reference's root-token encoding: base64 (unpadded) of `token` XOR `otp`.
pub fn encode_token(token: &str, otp: &str) -> Result<String, String> {
    if token.len() != otp.len() {
        return Err(format!(
            "the OTP is {} characters but the token is {}",
            otp.len(),
            token.len()
        ));
    }
    let x: Vec<u8> = token.bytes().zip(otp.bytes()).map(|(a, b)| a ^ b).collect();
    Ok(base64::engine::general_purpose::STANDARD_NO_PAD.encode(x))
}

/// Decodes an `encoded_token` with its OTP (padded or unpadded base64).
pub fn decode_token(encoded: &str, otp: &str) -> Result<String, String> {
    let e = encoded.trim().trim_end_matches('=');
    let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(e)
        .map_err(|err| format!("the encoded token is not valid base64: {err}"))?;
    let otp = otp.trim();
    if bytes.len() != otp.len() {
        return Err(format!(
            "the OTP is {} characters but the encoded token holds {} bytes: wrong OTP for this token",
            otp.len(),
            bytes.len()
        ));
    }
    let plain: Vec<u8> = bytes.iter().zip(otp.bytes()).map(|(a, b)| a ^ b).collect();
    String::from_utf8(plain)
        .map_err(|_| "the decoded token is not text: wrong OTP for this token".to_string())
}

/// OpenPGP: parsing the operator's public key and encrypting the token to it (rpgp).
pub mod openpgp {
    use ::pgp::composed::{Deserializable, MessageBuilder, SignedPublicKey};
    use ::pgp::crypto::sym::SymmetricKeyAlgorithm;
    use ::pgp::types::KeyDetails;
    use base64::Engine;
    use rand_core::{CryptoRng, RngCore};

    /// Parses an OpenPGP public key given as base64 of the binary key (as the reference
    /// takes it) or ASCII-armored; checks its self-signatures.
    pub fn parse_public_key(s: &str) -> Result<SignedPublicKey, String> {
        let s = s.trim();
        let key = if s.starts_with("-----BEGIN PGP") {
            SignedPublicKey::from_string(s)
                .map(|(k, _)| k)
                .map_err(|e| format!("not a valid ASCII-armored OpenPGP public key: {e}"))?
        } else {
            let compact: String = s.chars().filter(|c| !c.is_whitespace()).collect();
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(compact.as_bytes())
                .map_err(|_| {
                    "expected an OpenPGP public key as base64 of the binary key, or ASCII-armored"
                        .to_string()
                })?;
            SignedPublicKey::from_bytes(bytes.as_slice())
                .map_err(|e| format!("not a valid OpenPGP public key: {e}"))?
        };
        key.verify_bindings()
            .map_err(|e| format!("the key's self-signatures do not verify: {e}"))?;
        if !has_encryption_key(&key) {
            return Err("the key has no encryption-capable (sub)key".into());
        }
        Ok(key)
    }

    /// The primary key's fingerprint, lowercase hex.
    pub fn fingerprint(key: &SignedPublicKey) -> String {
        format!("{:x}", key.fingerprint())
    }

    fn subkey_for_encryption(key: &SignedPublicKey) -> Option<usize> {
        key.public_subkeys.iter().position(|sk| {
            sk.key.algorithm().can_encrypt()
                && sk.signatures.iter().any(|sig| {
                    let f = sig.key_flags();
                    f.encrypt_comms() || f.encrypt_storage()
                })
        })
    }

    fn has_encryption_key(key: &SignedPublicKey) -> bool {
        subkey_for_encryption(key).is_some() || key.primary_key.algorithm().can_encrypt()
    }

    /// Encrypts `plain` to the key's encryption subkey (or its primary key), as a binary
    /// OpenPGP message (SEIPD v1, AES-256), drawing randomness from `rng`.
    pub fn encrypt<R: RngCore + CryptoRng>(
        key: &SignedPublicKey,
        plain: &[u8],
        rng: &mut R,
    ) -> Result<Vec<u8>, String> {
        let mut builder = MessageBuilder::from_bytes("", plain.to_vec())
            .seipd_v1(&mut *rng, SymmetricKeyAlgorithm::AES256);
        match subkey_for_encryption(key) {
            Some(i) => builder
                .encrypt_to_key(&mut *rng, &key.public_subkeys[i])
                .map_err(|e| e.to_string())?,
            None if key.primary_key.algorithm().can_encrypt() => builder
                .encrypt_to_key(&mut *rng, &key.primary_key)
                .map_err(|e| e.to_string())?,
            None => return Err("the key has no encryption-capable (sub)key".into()),
        };
        builder.to_vec(&mut *rng).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
#[path = "dr_token_tests.rs"]
mod tests;
