//! Crypto primitives used by the core, all from well-kept crates: AES-256-GCM, SHA-256,
//! HMAC-SHA256, HKDF-SHA256, constant-time comparison, and random identifiers drawn from the node's
//! seeded RNG (never from the OS: the shell seeds the RNG, the simulator derives it).

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce};
use hmac::{Hmac, Mac};
use rand_core::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Encrypts with AES-256-GCM under `key`; output is nonce (12 bytes) || ciphertext.
pub fn seal(key: &[u8; 32], rng: &mut dyn RngCore, plaintext: &[u8], aad: &[u8]) -> Vec<u8> {
    let cipher = Aes256Gcm::new(key.into());
    let mut nonce = [0u8; 12];
    rng.fill_bytes(&mut nonce);
    let ct = cipher
        .encrypt(
            Nonce::from_slice(&nonce),
            aes_gcm::aead::Payload {
                msg: plaintext,
                aad,
            },
        )
        .unwrap_or_default();
    let mut out = nonce.to_vec();
    out.extend_from_slice(&ct);
    out
}

/// Decrypts what [`seal`] produced; `None` when the key is wrong or the data was altered.
pub fn open(key: &[u8; 32], data: &[u8], aad: &[u8]) -> Option<Vec<u8>> {
    if data.len() < 12 + 16 {
        return None;
    }
    let cipher = Aes256Gcm::new(key.into());
    cipher
        .decrypt(
            Nonce::from_slice(&data[..12]),
            aes_gcm::aead::Payload {
                msg: &data[12..],
                aad,
            },
        )
        .ok()
}

pub fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// SHA-256 of the concatenation of `parts` (no copy into one buffer).
pub fn sha256_parts(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(sha256(data))
}

pub fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    #[allow(clippy::expect_used)] // HMAC accepts a key of any length: this cannot fail
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// A 32-byte key derived from `ikm` for the purpose `info` (HKDF-SHA256, no salt).
pub fn hkdf_sha256(ikm: &[u8], info: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    // 32 bytes is far below HKDF-SHA256's output limit (255 × 32): this cannot fail.
    let _ = hkdf::Hkdf::<Sha256>::new(None, ikm).expand(info, &mut out);
    out
}

/// Constant-time equality of two byte strings.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A random base62 string of `len` characters (rejection sampling, no modulo bias).
pub fn base62(rng: &mut dyn RngCore, len: usize) -> String {
    let mut out = String::with_capacity(len);
    while out.len() < len {
        let b = (rng.next_u32() & 0xff) as u8;
        if b < 248 {
            out.push(BASE62[(b % 62) as usize] as char);
        }
    }
    out
}

pub fn random_key(rng: &mut dyn RngCore) -> [u8; 32] {
    let mut k = [0u8; 32];
    rng.fill_bytes(&mut k);
    k
}

/// A random UUID-shaped identifier (v4 layout).
pub fn uuid(rng: &mut dyn RngCore) -> String {
    let mut b = [0u8; 16];
    rng.fill_bytes(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    #[test]
    fn seal_open_roundtrip_and_tamper() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        let key = random_key(&mut rng);
        let ct = seal(&key, &mut rng, b"hello", b"path");
        assert_eq!(open(&key, &ct, b"path").as_deref(), Some(&b"hello"[..]));
        assert_eq!(open(&key, &ct, b"other"), None);
        let mut bad = ct.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert_eq!(open(&key, &bad, b"path"), None);
    }

    #[test]
    fn base62_has_length_and_alphabet() {
        let mut rng = ChaCha20Rng::seed_from_u64(2);
        let s = base62(&mut rng, 40);
        assert_eq!(s.len(), 40);
        assert!(s.chars().all(|c| c.is_ascii_alphanumeric()));
    }
}
