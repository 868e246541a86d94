//! Licensing: replication needs a license with the `replication` feature (or a hosted
//! cluster).
//!
//! A license file is JSON `{"license": {...}, "signature": "<base64>"}` where the signature
//! is Ed25519 over the exact bytes of the `license` object as serialised by
//! [`License::signing_bytes`], verified against a trusted issuer public key from the server
//! configuration. The shell verifies the file at start and hands the result to the node in
//! [`LicenseState`]; `cairn server --dev` issues itself a development license. The core only
//! checks the verified license against the clock it is given.

use crate::api::{ApiError, ApiResult};
use crate::time::{rfc3339, Millis};
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub const FEATURE_REPLICATION: &str = "replication";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct License {
    pub license_id: String,
    pub customer: String,
    pub features: Vec<String>,
    /// Milliseconds since the epoch.
    pub issue_time: Millis,
    pub expiration_time: Millis,
    /// Issued by a dev-mode server to itself.
    #[serde(default)]
    pub dev: bool,
}

impl License {
    /// The bytes the signature covers.
    pub fn signing_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A signed license file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SignedLicense {
    pub license: License,
    pub signature: String,
}

/// What the node knows about its license.
#[derive(Debug, Clone, Default)]
pub struct LicenseState {
    pub license: Option<License>,
    /// A hosted (managed) cluster: licensed by its operator.
    pub hosted: bool,
    /// Why no license is installed (shown by `sys/license/status`).
    pub problem: Option<String>,
}

impl LicenseState {
    /// A licensed state for tests and simulations.
    pub fn hosted() -> LicenseState {
        LicenseState {
            hosted: true,
            ..Default::default()
        }
    }
}

/// Refuses unless the license allows `feature` at `now`.
pub fn require(st: &LicenseState, now: Millis, feature: &str) -> ApiResult<()> {
    if st.hosted {
        return Ok(());
    }
    let Some(l) = &st.license else {
        return Err(ApiError::bad(format!(
            "this operation requires a license with the {feature:?} feature; none is installed{}",
            st.problem
                .as_deref()
                .map(|p| format!(" ({p})"))
                .unwrap_or_else(|| {
                    " (set license_path and license_trusted_key in the server configuration)".into()
                })
        )));
    };
    if l.expiration_time <= now {
        return Err(ApiError::bad(format!(
            "the license {} expired at {}",
            l.license_id,
            rfc3339(l.expiration_time)
        )));
    }
    if !l.features.iter().any(|f| f == feature) {
        return Err(ApiError::bad(format!(
            "the license {} does not include the {feature:?} feature",
            l.license_id
        )));
    }
    Ok(())
}

/// `sys/license/status`.
pub fn status(st: &LicenseState, now: Millis) -> Value {
    match &st.license {
        Some(l) => json!({
            "autoloading_used": false,
            "autoloaded": {
                "license_id": l.license_id,
                "customer": l.customer,
                "features": l.features,
                "start_time": rfc3339(l.issue_time),
                "expiration_time": rfc3339(l.expiration_time),
                "termination_time": rfc3339(l.expiration_time),
                "dev": l.dev,
                "expired": l.expiration_time <= now,
            },
            "hosted": st.hosted,
        }),
        None => json!({
            "autoloading_used": false,
            "autoloaded": null,
            "hosted": st.hosted,
            "problem": st.problem,
        }),
    }
}

/// Verifies a signed license file against the issuer's Ed25519 public key (base64, 32 bytes).
pub fn verify(text: &str, trusted_key_b64: &str) -> Result<License, String> {
    let f: SignedLicense =
        serde_json::from_str(text).map_err(|e| format!("license file is malformed: {e}"))?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = b64
        .decode(trusted_key_b64.trim())
        .map_err(|_| "license_trusted_key is not base64".to_string())?;
    let sig = b64
        .decode(f.signature.trim())
        .map_err(|_| "license signature is not base64".to_string())?;
    let pk = ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, &key);
    pk.verify(&f.license.signing_bytes(), &sig).map_err(|_| {
        "license signature does not verify against the trusted issuer key".to_string()
    })?;
    Ok(f.license)
}

/// Signs a license with an Ed25519 key given as its 32-byte seed; returns the file text and
/// the base64 public key (used by dev mode and tests).
pub fn sign(license: &License, seed: &[u8; 32]) -> Result<(String, String), String> {
    use ring::signature::KeyPair;
    let kp = ring::signature::Ed25519KeyPair::from_seed_unchecked(seed)
        .map_err(|e| format!("bad signing key: {e}"))?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let sig = kp.sign(&license.signing_bytes());
    let file = SignedLicense {
        license: license.clone(),
        signature: b64.encode(sig.as_ref()),
    };
    Ok((
        serde_json::to_string_pretty(&file).map_err(|e| e.to_string())?,
        b64.encode(kp.public_key().as_ref()),
    ))
}

/// The license a dev-mode server issues itself (all features, 30 days).
pub fn dev_license(now: Millis) -> License {
    License {
        license_id: "dev-license".into(),
        customer: "development".into(),
        features: vec![FEATURE_REPLICATION.into()],
        issue_time: now,
        expiration_time: now + 30 * 86_400_000,
        dev: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_license_verifies_and_gates() {
        let l = dev_license(1_000);
        let (text, pk) = sign(&l, &[9; 32]).unwrap();
        assert_eq!(verify(&text, &pk).unwrap(), l);
        let (_, other) = sign(&l, &[8; 32]).unwrap();
        assert!(verify(&text, &other).is_err());
        let tampered = text.replace("development", "evil-corp");
        assert!(verify(&tampered, &pk).is_err());
        let st = LicenseState {
            license: Some(l.clone()),
            ..Default::default()
        };
        assert!(require(&st, 2_000, FEATURE_REPLICATION).is_ok());
        assert!(require(&st, l.expiration_time, FEATURE_REPLICATION)
            .unwrap_err()
            .to_string()
            .contains("expired"));
        assert!(require(&st, 2_000, "other").is_err());
        assert!(require(&LicenseState::default(), 0, FEATURE_REPLICATION).is_err());
        assert!(require(&LicenseState::hosted(), 0, FEATURE_REPLICATION).is_ok());
    }
}

#[cfg(test)]
mod fixture {
    /// Prints a signed test license (run with `--ignored --nocapture` to regenerate the
    /// fixture used by the end-to-end replication tests).
    #[test]
    #[ignore]
    fn print_test_license() {
        let l = super::License {
            license_id: "e2e-test-license".into(),
            customer: "cairn tests".into(),
            features: vec![super::FEATURE_REPLICATION.into()],
            issue_time: 1_700_000_000_000,
            expiration_time: 4_102_444_800_000,
            dev: false,
        };
        let (text, pk) = super::sign(&l, &[42; 32]).unwrap();
        println!("KEY={pk}\n{text}");
    }
}
