//! The cluster CA and the cluster listener's certificate.
//!
//! A primary creates its cluster CA on first enable: an Ed25519 key drawn from the node's
//! seeded RNG (so the core stays deterministic: Ed25519 signing needs no randomness) and a
//! self-signed CA certificate made with `rcgen`. The CA seed is cluster-local
//! (`core/local-replication/cluster-ca`, encrypted by the barrier), so a DR secondary holds it
//! too and, once promoted, serves certificates the same secondaries already trust. Activation
//! credentials carry the CA certificate; secondaries pin it for the cluster channel.
//!
//! The listener's certificate is derived from the CA seed and the host names it serves, and
//! handed to the shell in [`crate::node::Output::ClusterTls`].
//!
//! The channel is mutual TLS: the listener accepts only clients presenting a certificate of
//! the same CA ([`ClusterTls::ca_pem`]). A secondary's client certificate comes in its
//! activation credential (a fresh key per credential, [`secondary_client`]); the nodes of an
//! HA cluster, which share the CA seed, derive theirs from it ([`node_client`]). The
//! certificate is a second lock, not the only one: a secondary still proves itself with its
//! secret on every call (which revocation removes), a standby signs every forward.

use crate::api::{ApiError, ApiResult};
use crate::ctx::Ctx;
use serde::{Deserialize, Serialize};

pub const CA_KEY: &str = "core/local-replication/cluster-ca";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredCa {
    /// Hex Ed25519 seed of the CA key.
    seed: String,
}

/// Certificate and key (PEM) for the cluster listener.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterTls {
    /// Server certificate followed by the CA certificate.
    pub cert_pem: String,
    pub key_pem: zeroize::Zeroizing<String>,
    /// The cluster CA alone: clients must present a certificate it signed.
    pub ca_pem: String,
}

impl std::fmt::Debug for ClusterTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterTls")
            .field("cert_pem", &"<pem>")
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// A client certificate for the cluster channel (certificate and PKCS#8 key, PEM), signed by
/// the cluster CA of the listener it is presented to.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientCert {
    pub cert_pem: String,
    pub key_pem: zeroize::Zeroizing<String>,
}

impl std::fmt::Debug for ClientCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCert")
            .field("cert_pem", &"<pem>")
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// PKCS#8 v1 document of an Ed25519 key from its seed (RFC 8410).
fn pkcs8(seed: &[u8; 32]) -> Vec<u8> {
    let mut v = vec![
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    v.extend_from_slice(seed);
    v
}

fn key_pair(seed: &[u8; 32]) -> Result<rcgen::KeyPair, String> {
    let der = pkcs8(seed);
    rcgen::KeyPair::try_from(der.as_slice()).map_err(|e| format!("cluster key: {e}"))
}

fn ca_params() -> Result<rcgen::CertificateParams, String> {
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "cairn cluster CA");
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}

fn load_seed(ctx: &mut Ctx, create: bool) -> ApiResult<Option<[u8; 32]>> {
    let seed = match ctx.get_json::<StoredCa>(CA_KEY)? {
        Some(s) => s.seed,
        None if create => {
            let s = hex::encode(crate::crypto::random_key(ctx.rng()));
            ctx.put_json(CA_KEY, &StoredCa { seed: s.clone() })?;
            s
        }
        None => return Ok(None),
    };
    let b = hex::decode(seed).map_err(|e| ApiError::Internal(format!("cluster CA: {e}")))?;
    Ok(b.as_slice().try_into().ok())
}

/// The cluster CA's seed (`None` before the cluster has a CA): what the forward signing key
/// is bound to ([`crate::ha::route::signing_key`]).
pub(crate) fn ca_seed(ctx: &mut Ctx) -> ApiResult<Option<[u8; 32]>> {
    load_seed(ctx, false)
}

/// The cluster CA certificate (PEM), creating the CA when `create`.
pub fn ca_pem(ctx: &mut Ctx, create: bool) -> ApiResult<Option<String>> {
    let Some(seed) = load_seed(ctx, create)? else {
        return Ok(None);
    };
    ca_cert(&seed).map(Some).map_err(ApiError::Internal)
}

fn ca_cert(seed: &[u8; 32]) -> Result<String, String> {
    let kp = key_pair(seed)?;
    let cert = ca_params()?.self_signed(&kp).map_err(|e| e.to_string())?;
    Ok(cert.pem())
}

/// The listener certificate for `hosts` (IP addresses or DNS names), signed by the CA.
pub fn server_tls(ctx: &mut Ctx, hosts: &[String]) -> ApiResult<Option<ClusterTls>> {
    let Some(seed) = load_seed(ctx, false)? else {
        return Ok(None);
    };
    issue(&seed, hosts).map(Some).map_err(ApiError::Internal)
}

/// A client certificate for secondary `id`, with a fresh key (from the node's RNG): `None`
/// before the cluster has a CA.
pub fn secondary_client(ctx: &mut Ctx, id: &str) -> ApiResult<Option<ClientCert>> {
    let Some(seed) = load_seed(ctx, false)? else {
        return Ok(None);
    };
    let leaf = crate::crypto::random_key(ctx.rng());
    issue_client(&seed, &leaf, &format!("cairn secondary {id}"))
        .map(Some)
        .map_err(ApiError::Internal)
}

/// The client certificate the nodes of this cluster present to each other (a standby
/// forwarding to the active node), derived from the CA seed they share: `None` before the
/// cluster has a CA.
pub fn node_client(ctx: &mut Ctx) -> ApiResult<Option<ClientCert>> {
    let Some(seed) = load_seed(ctx, false)? else {
        return Ok(None);
    };
    let leaf = crate::crypto::sha256_parts(&[&seed, b"cluster-node-client"]);
    issue_client(&seed, &leaf, "cairn cluster node")
        .map(Some)
        .map_err(ApiError::Internal)
}

fn issue_client(seed: &[u8; 32], leaf_seed: &[u8; 32], name: &str) -> Result<ClientCert, String> {
    let issuer = rcgen::Issuer::new(ca_params()?, key_pair(seed)?);
    let leaf_key = key_pair(leaf_seed)?;
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    p.distinguished_name.push(rcgen::DnType::CommonName, name);
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    let cert = p.signed_by(&leaf_key, &issuer).map_err(|e| e.to_string())?;
    Ok(ClientCert {
        cert_pem: cert.pem(),
        key_pem: zeroize::Zeroizing::new(leaf_key.serialize_pem()),
    })
}

fn issue(seed: &[u8; 32], hosts: &[String]) -> Result<ClusterTls, String> {
    let ca_key = key_pair(seed)?;
    let ca_cert = ca_params()?
        .self_signed(&ca_key)
        .map_err(|e| e.to_string())?;
    let issuer = rcgen::Issuer::new(ca_params()?, ca_key);
    let mut material = seed.to_vec();
    material.extend_from_slice(b"cluster-listener");
    for h in hosts {
        material.extend_from_slice(h.as_bytes());
        material.push(0);
    }
    let leaf_seed = crate::crypto::sha256(&material);
    let leaf_key = key_pair(&leaf_seed)?;
    let mut p = rcgen::CertificateParams::new(hosts.to_vec()).map_err(|e| e.to_string())?;
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "cairn cluster listener");
    p.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = p.signed_by(&leaf_key, &issuer).map_err(|e| e.to_string())?;
    Ok(ClusterTls {
        cert_pem: format!("{}{}", cert.pem(), ca_cert.pem()),
        key_pem: zeroize::Zeroizing::new(leaf_key.serialize_pem()),
        ca_pem: ca_cert.pem(),
    })
}

/// The host part of `host:port` (or of a URL).
pub fn host_of(addr: &str) -> String {
    let a = addr.split("://").last().unwrap_or(addr);
    let a = a.split('/').next().unwrap_or(a);
    if let Some(rest) = a.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest).to_string();
    }
    match a.rsplit_once(':') {
        Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => h.to_string(),
        _ => a.to_string(),
    }
}

/// Whether `host` can name the listener certificate's subject: an IP address, or a DNS name
/// of ASCII letters, digits, `-` and `_` in dot-separated labels (at most 63 characters each,
/// 253 in all).
pub fn valid_host(host: &str) -> bool {
    if host.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// Checks a cluster address an operator gives in `field` (`host:port` or
/// `https://host:port`): the host must be an IP address or a DNS name, the port (when given)
/// a number from 1 to 65535. The host names the cluster listener's certificate, so an
/// address no certificate can carry is refused before anything is stored.
pub fn check_cluster_addr(field: &str, addr: &str) -> ApiResult<()> {
    let bad = |why: &str| {
        ApiError::bad(format!(
            "{field} {addr:?} is not a usable cluster address: {why} (expected host:port or \
             https://host:port, the host an IP address or a DNS name)"
        ))
    };
    let rest = match addr.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => rest,
        Some(_) => return Err(bad("the scheme must be https")),
        None => addr,
    };
    let hostport = rest.split('/').next().unwrap_or(rest);
    let port = if let Some(v6) = hostport.strip_prefix('[') {
        match v6.split_once(']') {
            Some((_, after)) => after.strip_prefix(':'),
            None => return Err(bad("an unclosed '['")),
        }
    } else {
        hostport.rsplit_once(':').map(|(_, p)| p)
    };
    if !valid_host(&host_of(addr)) {
        return Err(bad("the host is neither an IP address nor a DNS name"));
    }
    if let Some(p) = port {
        if !matches!(p.parse::<u16>(), Ok(n) if n > 0) {
            return Err(bad("the port must be a number from 1 to 65535"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_addresses_are_checked_before_a_certificate_is_made() {
        for ok in [
            "127.0.0.1:8201",
            "https://node-1.example.com:8201",
            "[::1]:8201",
            "https://[fe80::1]:8201/",
            "localhost",
            "cairn_2:8201",
        ] {
            assert!(
                check_cluster_addr("primary_cluster_addr", ok).is_ok(),
                "{ok}"
            );
            issue(&[5u8; 32], &[host_of(ok)]).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            "GETi\u{604}3tkg=,o2430",
            "http://node:8201",
            "node:0",
            "node:99999",
            "node:port",
            "no de:8201",
            "[::1:8201",
            ":8201",
            "a..b:8201",
        ] {
            let e = check_cluster_addr("primary_cluster_addr", bad).unwrap_err();
            assert_eq!(e.status(), 400, "{bad}");
            assert!(e.to_string().contains("primary_cluster_addr"), "{bad}: {e}");
        }
    }

    #[test]
    fn deterministic_ca_and_leaf() {
        let seed = [5u8; 32];
        assert_eq!(ca_cert(&seed).unwrap(), ca_cert(&seed).unwrap());
        let t = issue(&seed, &["127.0.0.1".into(), "localhost".into()]).unwrap();
        assert_eq!(
            t,
            issue(&seed, &["127.0.0.1".into(), "localhost".into()]).unwrap()
        );
        assert!(t.cert_pem.matches("BEGIN CERTIFICATE").count() == 2);
        assert!(t.key_pem.contains("PRIVATE KEY"));
        assert!(t.cert_pem.ends_with(&t.ca_pem));
        let c = issue_client(&seed, &[6u8; 32], "cairn secondary s1").unwrap();
        assert_eq!(
            c,
            issue_client(&seed, &[6u8; 32], "cairn secondary s1").unwrap()
        );
        assert_ne!(
            c,
            issue_client(&seed, &[7u8; 32], "cairn secondary s1").unwrap()
        );
        assert!(
            !format!("{c:?}").contains("PRIVATE"),
            "the key stays out of logs"
        );
        assert_eq!(host_of("127.0.0.1:8201"), "127.0.0.1");
        assert_eq!(host_of("https://node.example:8201"), "node.example");
        assert_eq!(host_of("[::1]:8201"), "::1");
    }
}
