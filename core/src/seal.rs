//! The seal: the root key split into key shares (Shamir, from the `blahaj` crate), the
//! unseal progress, and the barrier that encrypts every stored value.
//!
//! Layout in storage: `core/seal-config` (plaintext JSON: shares and threshold) and
//! `core/keyring` (the barrier key, AES-256-GCM-encrypted under the root key). Every other
//! value passes through [`Barrier`], which encrypts it with the barrier key, binding the
//! storage path as associated data so a value cannot be moved to another key unnoticed.

use crate::crypto;
use rand_core::RngCore;
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

pub const SEAL_CONFIG_KEY: &str = "core/seal-config";
pub const KEYRING_KEY: &str = "core/keyring";
/// When the barrier key was installed (at initialisation): milliseconds since the epoch, JSON.
pub const KEY_INSTALL_TIME_KEY: &str = "core/keyring-install-time";
/// The barrier key's term: Cairn has no key rotation, so the key installed at initialisation
/// is the first and only one.
pub const KEY_TERM: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SealConfig {
    pub secret_shares: u8,
    pub secret_threshold: u8,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SealError {
    BadConfig(String),
    BadShare(String),
    WrongKey,
    /// The stored keyring is missing (storage damaged or not initialised).
    NoKeyring,
}

impl std::fmt::Display for SealError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SealError::BadConfig(m) => write!(f, "{m}"),
            SealError::BadShare(m) => write!(f, "invalid key share: {m}"),
            SealError::WrongKey => write!(
                f,
                "unseal failed: the key shares do not reconstruct this cluster's root key"
            ),
            SealError::NoKeyring => write!(
                f,
                "the stored keyring is missing: this cluster's storage is not initialised or is damaged"
            ),
        }
    }
}

impl SealConfig {
    pub fn validate(&self) -> Result<(), SealError> {
        if self.secret_shares == 0 {
            return Err(SealError::BadConfig(
                "secret_shares must be at least 1".into(),
            ));
        }
        if self.secret_threshold == 0 || self.secret_threshold > self.secret_shares {
            return Err(SealError::BadConfig(
                "secret_threshold must be between 1 and secret_shares".into(),
            ));
        }
        if self.secret_shares > 1 && self.secret_threshold == 1 {
            return Err(SealError::BadConfig(
                "secret_threshold must be greater than 1 when secret_shares is greater than 1"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// Splits the root key into `cfg.secret_shares` shares.
pub fn split(root: &[u8; 32], cfg: &SealConfig, rng: &mut (impl RngCore + ?Sized)) -> Vec<Vec<u8>> {
    if cfg.secret_shares == 1 {
        return vec![root.to_vec()];
    }
    let mut seed = [0u8; 32];
    rng.fill_bytes(&mut seed);
    let mut r = <rand_chacha::ChaCha20Rng as rand_core::SeedableRng>::from_seed(seed);
    let sharks = blahaj::Sharks(cfg.secret_threshold);
    sharks
        .dealer_rng(root, &mut r)
        .take(cfg.secret_shares as usize)
        .map(|s| Vec::from(&s))
        .collect()
}

/// Recombines shares into a 32-byte candidate root key (not yet checked against a keyring).
pub fn combine(shares: &[Vec<u8>], cfg: &SealConfig) -> Result<[u8; 32], SealError> {
    if cfg.secret_shares == 1 {
        let s = shares
            .first()
            .ok_or_else(|| SealError::BadShare("no share".into()))?;
        return s
            .as_slice()
            .try_into()
            .map_err(|_| SealError::BadShare("expected a 32-byte key".into()));
    }
    let mut parsed = Vec::new();
    for s in shares {
        if s.len() != 33 {
            return Err(SealError::BadShare(format!(
                "expected 33 bytes, got {}",
                s.len()
            )));
        }
        parsed.push(
            blahaj::Share::try_from(s.as_slice())
                .map_err(|e| SealError::BadShare(e.to_string()))?,
        );
    }
    let secret = blahaj::Sharks(cfg.secret_threshold)
        .recover(parsed.iter())
        .map_err(|e| SealError::BadShare(e.to_string()))?;
    secret
        .as_slice()
        .try_into()
        .map_err(|_| SealError::WrongKey)
}

/// Decodes a key share given as hex or base64.
pub fn decode_share(s: &str) -> Result<Vec<u8>, SealError> {
    use base64::Engine;
    let s = s.trim();
    if let Ok(b) = hex::decode(s) {
        return Ok(b);
    }
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|_| SealError::BadShare("must be hex or base64".into()))
}

/// Refuses a decoded share that cannot be one of `cfg`'s shares (the wrong length, or not a
/// share at all), before it counts towards a threshold: a malformed share is refused at once
/// and the progress made so far is kept.
pub fn check_share(share: &[u8], cfg: &SealConfig) -> Result<(), SealError> {
    let want = if cfg.secret_shares == 1 { 32 } else { 33 };
    if share.len() != want {
        return Err(SealError::BadShare(format!(
            "expected {want} bytes, got {}; progress is unchanged",
            share.len()
        )));
    }
    if cfg.secret_shares > 1 {
        blahaj::Share::try_from(share)
            .map_err(|e| SealError::BadShare(format!("{e}; progress is unchanged")))?;
    }
    Ok(())
}

/// Decodes a key share given as hex or base64 and checks its shape against `cfg`
/// ([`decode_share`], then [`check_share`]).
pub fn decode_checked_share(s: &str, cfg: &SealConfig) -> Result<Vec<u8>, SealError> {
    let share = decode_share(s)?;
    check_share(&share, cfg)?;
    Ok(share)
}

/// The keyring: the barrier key, stored encrypted under the root key.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Keyring {
    pub term: u32,
    pub key: String,
}

pub fn wrap_keyring(root: &[u8; 32], barrier_key: &[u8; 32], rng: &mut dyn RngCore) -> Vec<u8> {
    let kr = Keyring {
        term: 1,
        key: hex::encode(barrier_key),
    };
    let plain = serde_json::to_vec(&kr).unwrap_or_default();
    crypto::seal(root, rng, &plain, KEYRING_KEY.as_bytes())
}

/// Opens the keyring with a candidate root key.
pub fn unwrap_keyring(root: &[u8; 32], sealed: &[u8]) -> Result<[u8; 32], SealError> {
    let plain = crypto::open(root, sealed, KEYRING_KEY.as_bytes()).ok_or(SealError::WrongKey)?;
    let kr: Keyring = serde_json::from_slice(&plain).map_err(|_| SealError::WrongKey)?;
    let key = hex::decode(kr.key).map_err(|_| SealError::WrongKey)?;
    key.as_slice().try_into().map_err(|_| SealError::WrongKey)
}

/// Encrypts and decrypts stored values with the barrier key (zeroed in memory when the
/// barrier seals or is dropped).
#[derive(Clone, Default)]
pub struct Barrier {
    key: Option<Zeroizing<[u8; 32]>>,
    /// Values encrypted with the key since this node last unsealed (`sys/key-status`).
    encryptions: std::cell::Cell<u64>,
}

impl std::fmt::Debug for Barrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Barrier {{ sealed: {} }}", self.key.is_none())
    }
}

impl Barrier {
    pub fn sealed(&self) -> bool {
        self.key.is_none()
    }
    pub fn unseal_with(&mut self, key: [u8; 32]) {
        self.key = Some(Zeroizing::new(key));
        self.encryptions.set(0);
    }
    /// An unsealed barrier with a copy of `key` (a reader's, [`crate::reads::ReadView`]).
    pub(crate) fn with_key(key: &Zeroizing<[u8; 32]>) -> Barrier {
        Barrier {
            key: Some(key.clone()),
            encryptions: std::cell::Cell::new(0),
        }
    }
    /// How many values were encrypted with the key since this node unsealed.
    pub fn encryptions(&self) -> u64 {
        self.encryptions.get()
    }
    pub fn seal(&mut self) {
        self.key = None;
    }
    /// The key, for a reader that decrypts beside the node ([`crate::reads::ReadView`]).
    pub(crate) fn key(&self) -> Option<&Zeroizing<[u8; 32]>> {
        self.key.as_ref()
    }
    /// The keys a snapshot file is tied to this cluster with (`None` while sealed).
    pub fn snapshot_keys(&self) -> Option<crate::snapshot::Keys> {
        self.key
            .as_deref()
            .map(crate::snapshot::Keys::from_barrier_key)
    }
    pub fn encrypt(&self, path: &str, plain: &[u8], rng: &mut dyn RngCore) -> Option<Vec<u8>> {
        let key = self.key.as_deref()?;
        self.encryptions
            .set(self.encryptions.get().saturating_add(1));
        let mut out = vec![1u8];
        out.extend(crypto::seal(key, rng, plain, path.as_bytes()));
        Some(out)
    }
    pub fn decrypt(&self, path: &str, data: &[u8]) -> Option<Vec<u8>> {
        let key = self.key.as_deref()?;
        if data.first() != Some(&1) {
            return None;
        }
        crypto::open(key, &data[1..], path.as_bytes())
    }
}

/// Key shares handed in one at a time until the seal's threshold: what every key-share
/// flow keeps (unseal, `sys/generate-root`, DR operation token generation). Shares are
/// compared in constant time; a share given twice counts once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShareAttempt {
    shares: Vec<Vec<u8>>,
}

/// What adding a share did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    /// A new share; the progress is now this many shares.
    New(usize),
    /// This share was already given: nothing changed.
    Duplicate,
}

impl ShareAttempt {
    /// Rebuilds an attempt from shares stored as hex (the DR token keeps its attempt in
    /// storage).
    pub fn from_hex(stored: &[String]) -> Result<ShareAttempt, SealError> {
        let shares = stored
            .iter()
            .map(|s| hex::decode(s).map_err(|e| SealError::BadShare(format!("stored share: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ShareAttempt { shares })
    }
    /// The shares as hex, for storage.
    pub fn to_hex(&self) -> Vec<String> {
        self.shares.iter().map(hex::encode).collect()
    }
    pub fn add(&mut self, share: Vec<u8>) -> Added {
        if self.shares.iter().any(|s| crypto::ct_eq(s, &share)) {
            return Added::Duplicate;
        }
        self.shares.push(share);
        Added::New(self.shares.len())
    }
    pub fn progress(&self) -> usize {
        self.shares.len()
    }
    /// Whether the threshold of `cfg` is reached.
    pub fn complete(&self, cfg: &SealConfig) -> bool {
        self.shares.len() >= usize::from(cfg.secret_threshold)
    }
    pub fn clear(&mut self) {
        self.shares.clear();
    }
    /// The barrier key these shares open (see [`recover_barrier_key`]).
    pub fn recover(&self, cfg: &SealConfig, keyring: Option<&[u8]>) -> Result<[u8; 32], SealError> {
        recover_barrier_key(&self.shares, cfg, keyring)
    }
}

/// The one key recovery of every key-share flow: shares → root key → the stored keyring
/// opened with it → the barrier key. Wrong shares (or shares of another cluster) fail with
/// [`SealError::WrongKey`].
pub fn recover_barrier_key(
    shares: &[Vec<u8>],
    cfg: &SealConfig,
    keyring: Option<&[u8]>,
) -> Result<[u8; 32], SealError> {
    let keyring = keyring.ok_or(SealError::NoKeyring)?;
    combine(shares, cfg).and_then(|root| unwrap_keyring(&root, keyring))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    #[test]
    fn a_share_attempt_counts_each_share_once_and_recovers_only_this_clusters_key() {
        let mut rng = ChaCha20Rng::from_seed([3; 32]);
        let cfg = SealConfig {
            secret_shares: 5,
            secret_threshold: 3,
        };
        let (root, bk) = ([7u8; 32], [9u8; 32]);
        let shares = split(&root, &cfg, &mut rng);
        let keyring = wrap_keyring(&root, &bk, &mut rng);
        let mut a = ShareAttempt::default();
        assert_eq!(a.add(shares[0].clone()), Added::New(1));
        assert_eq!(a.add(shares[0].clone()), Added::Duplicate);
        assert_eq!(a.add(shares[1].clone()), Added::New(2));
        assert!(!a.complete(&cfg));
        a.add(shares[4].clone());
        assert!(a.complete(&cfg));
        assert_eq!(a.recover(&cfg, Some(&keyring)), Ok(bk));
        assert_eq!(a.recover(&cfg, None), Err(SealError::NoKeyring));
        // Round trip through storage form.
        assert_eq!(ShareAttempt::from_hex(&a.to_hex()), Ok(a.clone()));
        // Shares of another cluster do not open this keyring.
        let other = split(&[8u8; 32], &cfg, &mut rng);
        let mut b = ShareAttempt::default();
        for s in other.into_iter().take(3) {
            b.add(s);
        }
        assert_eq!(b.recover(&cfg, Some(&keyring)), Err(SealError::WrongKey));
    }

    #[test]
    fn a_malformed_share_is_refused_before_it_counts() {
        let mut rng = ChaCha20Rng::from_seed([5; 32]);
        let cfg = SealConfig {
            secret_shares: 3,
            secret_threshold: 2,
        };
        let shares = split(&[7u8; 32], &cfg, &mut rng);
        assert_eq!(check_share(&shares[0], &cfg), Ok(()));
        // "AAAA" is valid hex (2 bytes): refused by its length, not counted.
        assert!(matches!(
            decode_checked_share("AAAA", &cfg),
            Err(SealError::BadShare(m)) if m.contains("expected 33 bytes, got 2")
        ));
        assert!(decode_checked_share("not a key", &cfg).is_err());
        assert!(check_share(&[0u8; 32], &cfg).is_err());
        let one = SealConfig {
            secret_shares: 1,
            secret_threshold: 1,
        };
        assert_eq!(check_share(&[1u8; 32], &one), Ok(()));
        assert!(check_share(&shares[0], &one).is_err());
    }

    #[test]
    fn split_and_combine_threshold() {
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let root = crypto::random_key(&mut rng);
        let cfg = SealConfig {
            secret_shares: 5,
            secret_threshold: 3,
        };
        let shares = split(&root, &cfg, &mut rng);
        assert_eq!(shares.len(), 5);
        assert_eq!(combine(&shares[1..4], &cfg).unwrap(), root);
        assert_eq!(
            combine(
                &[shares[0].clone(), shares[4].clone(), shares[2].clone()],
                &cfg
            )
            .unwrap(),
            root
        );
        // Two shares are not enough to reconstruct.
        let two = combine(&shares[..2], &cfg);
        assert!(two.is_err() || two.unwrap() != root);
    }

    #[test]
    fn keyring_rejects_wrong_root() {
        let mut rng = ChaCha20Rng::seed_from_u64(8);
        let root = crypto::random_key(&mut rng);
        let bk = crypto::random_key(&mut rng);
        let sealed = wrap_keyring(&root, &bk, &mut rng);
        assert_eq!(unwrap_keyring(&root, &sealed).unwrap(), bk);
        let other = crypto::random_key(&mut rng);
        assert_eq!(unwrap_keyring(&other, &sealed), Err(SealError::WrongKey));
    }

    #[test]
    fn config_validation() {
        assert!(SealConfig {
            secret_shares: 1,
            secret_threshold: 1
        }
        .validate()
        .is_ok());
        assert!(SealConfig {
            secret_shares: 3,
            secret_threshold: 4
        }
        .validate()
        .is_err());
        assert!(SealConfig {
            secret_shares: 3,
            secret_threshold: 1
        }
        .validate()
        .is_err());
        assert!(SealConfig {
            secret_shares: 0,
            secret_threshold: 0
        }
        .validate()
        .is_err());
    }
}
