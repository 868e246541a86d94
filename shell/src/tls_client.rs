//! TLS client pieces shared by the connections the server makes (to the directory, to the
//! database): a verifier for the modes that do not check the server's certificate, and
//! client certificates sent as the reference sends them.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WantsClientCert;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{ClientConfig, ConfigBuilder, DigitallySignedStruct, SignatureScheme};
use std::sync::Arc;

/// Finishes `builder` with a client certificate `chain` and its private `key`.
///
/// rustls's own `with_client_auth_cert` parses the certificate to compare its public key with
/// the private key's, and refuses a certificate its parser does not take — an X.509 v1
/// certificate (no extensions), still common in directory deployments, among them. Go's TLS
/// client (the reference's) sends such a certificate and lets the server judge it; so does
/// this: only a certificate whose key is known to differ from the private key is refused here.
pub fn with_client_cert(
    builder: ConfigBuilder<ClientConfig, WantsClientCert>,
    provider: &CryptoProvider,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<ClientConfig, String> {
    if chain.is_empty() {
        return Err("no certificate in the PEM data".into());
    }
    let signing = provider.key_provider.load_private_key(key).map_err(|_| {
        "the private key is not of a supported kind (RSA, ECDSA, Ed25519)".to_string()
    })?;
    let certified = CertifiedKey::new(chain, signing);
    if let Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) =
        certified.keys_match()
    {
        return Err("the private key does not belong to the certificate".into());
    }
    Ok(builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(certified))))
}

/// Accepts any server certificate (`insecure_tls`), still checking handshake signatures.
#[derive(Debug)]
pub struct NoVerify(pub Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use std::path::Path;
    use std::process::Command;

    /// A self-signed certificate and its key, made by openssl: X.509 v1 (no extensions) when
    /// `v1`, else v3.
    fn certificate(
        dir: &Path,
        name: &str,
        v1: bool,
    ) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let key = dir.join(format!("{name}.key"));
        let csr = dir.join(format!("{name}.csr"));
        let cert = dir.join(format!("{name}.pem"));
        let (k, r, c) = (
            key.to_str().unwrap(),
            csr.to_str().unwrap(),
            cert.to_str().unwrap(),
        );
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let subj = "/CN=test client";
        if v1 {
            run(&[
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", k, "-out", r, "-subj", subj,
            ]);
            run(&[
                "x509", "-req", "-in", r, "-signkey", k, "-out", c, "-days", "2",
            ]);
        } else {
            run(&[
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", k, "-out", c, "-days",
                "2", "-subj", subj,
            ]);
        }
        let chain = CertificateDer::pem_file_iter(&cert)
            .expect("read cert")
            .collect::<Result<Vec<_>, _>>()
            .expect("parse cert");
        (chain, PrivateKeyDer::from_pem_file(&key).expect("read key"))
    }

    fn builder(p: &Arc<CryptoProvider>) -> ConfigBuilder<ClientConfig, WantsClientCert> {
        ClientConfig::builder_with_provider(p.clone())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(p.clone())))
    }

    #[test]
    fn an_x509_v1_client_certificate_is_sent_not_refused_locally() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = Arc::new(rustls::crypto::ring::default_provider());
        let (chain, key) = certificate(dir.path(), "a", true);
        // rustls's own path refuses it before any connection...
        assert!(builder(&p)
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .is_err());
        // ...this one keeps it for the server to judge.
        let cfg = with_client_cert(builder(&p), &p, chain.clone(), key).expect("v1 accepted");
        assert!(cfg.client_auth_cert_resolver.has_certs());
        // A key known not to be the certificate's is refused, naming the problem; so is an
        // empty chain.
        let (v3, own) = certificate(dir.path(), "b", false);
        let (_, other_key) = certificate(dir.path(), "c", true);
        let e = with_client_cert(builder(&p), &p, v3.clone(), other_key.clone_key())
            .expect_err("a key of another certificate");
        assert!(e.contains("does not belong"), "{e}");
        assert!(with_client_cert(builder(&p), &p, v3, own).is_ok());
        let e =
            with_client_cert(builder(&p), &p, Vec::new(), other_key).expect_err("no certificate");
        assert!(e.contains("no certificate"), "{e}");
    }
}
