//! TLS to the database, as libpq's connection parameters ask for it.
//!
//! The `postgres` crate understands `sslmode=disable|prefer|require` only and refuses libpq's
//! file parameters, so [`split`] takes them out of the connection string first and hands the
//! crate a string it accepts plus a [`DbTls`]: the mode and, when TLS may be used, a rustls
//! client configuration (the same rustls and ring provider as the listeners).
//!
//! | `sslmode`      | TLS        | server certificate checked                                 |
//! |----------------|------------|------------------------------------------------------------|
//! | `disable`      | never      | —                                                          |
//! | `allow`        | never      | — (libpq tries plain first, which a server that allows it takes) |
//! | `prefer` (default) | if the server offers it | not checked, or as `verify-ca` when `sslrootcert` is set |
//! | `require`      | always     | not checked, or as `verify-ca` when `sslrootcert` is set (libpq's rule) |
//! | `verify-ca`    | always     | chain to `sslrootcert`                                     |
//! | `verify-full`  | always     | chain to `sslrootcert` and the host name (or IP) in the certificate |
//!
//! `sslrootcert` is a PEM file of CA certificates, or `system` for the machine's trust store;
//! `verify-ca` and `verify-full` need it (libpq's `~/.postgresql/root.crt` fallback is not
//! used: where trust comes from is stated in the URL). `sslcert` + `sslkey` (PEM) send a
//! client certificate. Files are read at start; a missing or unusable file stops the start
//! with a message naming it. TLS 1.2 is the lowest version offered.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::sync::Arc;
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str) -> Result<SslMode, String> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(format!(
                    "connection_url: sslmode={other} is not one of disable, allow, prefer, \
                     require, verify-ca, verify-full"
                ))
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// The mode the `postgres` crate is given.
    fn crate_mode(self) -> &'static str {
        match self {
            SslMode::Disable | SslMode::Allow => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => "require",
        }
    }
}

/// The TLS side of a connection string: its mode and, unless TLS is off, the connector.
#[derive(Clone)]
pub struct DbTls {
    pub mode: SslMode,
    pub connector: Option<MakeRustlsConnect>,
}

/// libpq's TLS parameters as found in a connection string (values percent-decoded).
#[derive(Default, Debug, PartialEq, Eq)]
struct Params {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
    sslcert: Option<String>,
    sslkey: Option<String>,
}

impl Params {
    /// Takes `key=value` if it is one of ours; false otherwise.
    fn take(&mut self, key: &str, value: String) -> bool {
        let slot = match key {
            "sslmode" => &mut self.sslmode,
            "sslrootcert" => &mut self.sslrootcert,
            "sslcert" => &mut self.sslcert,
            "sslkey" => &mut self.sslkey,
            _ => return false,
        };
        *slot = Some(value);
        true
    }
}

/// Splits a `postgres://` URL or a `key=value` string into the string the `postgres` crate
/// parses (libpq's TLS parameters removed, `sslmode` mapped to one it knows) and the TLS
/// settings, reading the files they name.
pub fn split(url: &str) -> Result<(String, DbTls), String> {
    /// The connection string's parameters other than libpq's TLS ones, by form.
    enum Form<'a> {
        Url { base: &'a str, kept: Vec<&'a str> },
        KeyValue(Vec<&'a str>),
    }
    let mut p = Params::default();
    let form = if let Some((base, query)) = url.split_once('?') {
        let kept = query
            .split('&')
            .filter(|kv| match kv.split_once('=') {
                Some((k, v)) => !p.take(k, crate::http::percent_decode(v, false)),
                None => true,
            })
            .collect();
        Form::Url { base, kept }
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Form::Url {
            base: url,
            kept: Vec::new(),
        }
    } else {
        Form::KeyValue(
            url.split_whitespace()
                .filter(|kv| match kv.split_once('=') {
                    Some((k, v)) => !p.take(k.trim(), v.trim_matches('\'').to_string()),
                    None => true,
                })
                .collect(),
        )
    };
    let mode = match &p.sslmode {
        Some(m) => SslMode::parse(m)?,
        None => SslMode::Prefer,
    };
    let param = format!("sslmode={}", mode.crate_mode());
    let cleaned = match form {
        Form::Url { base, mut kept } => {
            kept.push(&param);
            format!("{base}?{}", kept.join("&"))
        }
        Form::KeyValue(mut kept) => {
            kept.push(&param);
            kept.join(" ")
        }
    };
    let connector = match mode {
        SslMode::Disable | SslMode::Allow => None,
        _ => Some(MakeRustlsConnect::new(client_config(mode, &p)?)),
    };
    Ok((cleaned, DbTls { mode, connector }))
}

fn read_file(what: &str, path: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("connection_url: {what}={path}: cannot read it ({e})"))
}

fn client_config(mode: SslMode, p: &Params) -> Result<ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS12, &rustls::version::TLS13])
        .map_err(|e| format!("TLS to the database: {e}"))?;
    let verifier: Arc<dyn ServerCertVerifier> = match (&p.sslrootcert, mode) {
        (None, SslMode::VerifyCa | SslMode::VerifyFull) => {
            return Err(format!(
                "connection_url: sslmode={} needs sslrootcert=FILE (the PEM file of the CA that \
                 signed the database's certificate) or sslrootcert=system (the machine's trust \
                 store)",
                mode.name()
            ))
        }
        (None, _) => Arc::new(crate::tls_client::NoVerify(provider.clone())),
        (Some(file), _) => {
            let roots = Arc::new(roots(file)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| format!("connection_url: sslrootcert={file}: {e}"))?;
            if mode == SslMode::VerifyFull {
                webpki
            } else {
                Arc::new(ChainOnly(webpki))
            }
        }
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    match (&p.sslcert, &p.sslkey) {
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(cert), Some(key)) => {
            let chain: Vec<CertificateDer<'static>> =
                CertificateDer::pem_slice_iter(&read_file("sslcert", cert)?)
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("connection_url: sslcert={cert}: {e}"))?;
            // The key parser's own message could quote key bytes: say only what failed.
            let k = PrivateKeyDer::from_pem_slice(&read_file("sslkey", key)?).map_err(|_| {
                format!("connection_url: sslkey={key}: not a usable PEM private key")
            })?;
            crate::tls_client::with_client_cert(builder, &provider, chain, k)
                .map_err(|e| format!("connection_url: sslcert/sslkey: {e}"))
        }
        _ => Err(
            "connection_url: sslcert and sslkey go together (a client certificate and \
                  its private key)"
                .into(),
        ),
    }
}

fn roots(file: &str) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    if file == "system" {
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
    } else {
        for cert in CertificateDer::pem_slice_iter(&read_file("sslrootcert", file)?) {
            let cert = cert.map_err(|e| format!("connection_url: sslrootcert={file}: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("connection_url: sslrootcert={file}: {e}"))?;
        }
    }
    if roots.is_empty() {
        return Err(format!(
            "connection_url: sslrootcert={file} holds no CA certificate"
        ));
    }
    Ok(roots)
}

/// `verify-ca`: the chain must lead to a trusted root; the name in the certificate is not
/// compared with the host (libpq's rule for that mode).
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_parameters_are_taken_out_and_the_mode_mapped() {
        let (s, t) = split("postgres://u:p@h:5432/db?sslmode=disable&connect_timeout=5").unwrap();
        assert_eq!(
            s,
            "postgres://u:p@h:5432/db?connect_timeout=5&sslmode=disable"
        );
        assert_eq!(t.mode, SslMode::Disable);
        assert!(t.connector.is_none());

        let (s, t) = split("postgres://u:p@h/db?sslmode=require").unwrap();
        assert_eq!(s, "postgres://u:p@h/db?sslmode=require");
        assert_eq!(t.mode, SslMode::Require);
        assert!(t.connector.is_some());

        // No sslmode: libpq's default, prefer.
        let (s, t) = split("postgres://u:p@h/db").unwrap();
        assert_eq!(s, "postgres://u:p@h/db?sslmode=prefer");
        assert_eq!(t.mode, SslMode::Prefer);

        let (s, t) = split("postgres://u:p@h/db?sslmode=allow").unwrap();
        assert_eq!(s, "postgres://u:p@h/db?sslmode=disable");
        assert_eq!(t.mode, SslMode::Allow);

        let (s, _) = split("host=h user=u sslmode=disable dbname=d").unwrap();
        assert_eq!(s, "host=h user=u dbname=d sslmode=disable");
    }

    #[test]
    fn verifying_modes_need_a_readable_root_certificate() {
        let e = split("postgres://u:p@h/db?sslmode=verify-full")
            .err()
            .unwrap();
        assert!(e.contains("needs sslrootcert"), "{e}");
        let e = split("postgres://u:p@h/db?sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem")
            .err()
            .unwrap();
        assert!(
            e.contains("sslrootcert=/nonexistent/ca.pem: cannot read it"),
            "{e}"
        );
        let e = split("postgres://u:p@h/db?sslmode=bogus").err().unwrap();
        assert!(e.contains("sslmode=bogus is not one of"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let e = split(&format!(
            "postgres://u:p@h/db?sslmode=verify-full&sslrootcert={}",
            empty.display()
        ))
        .err()
        .unwrap();
        assert!(e.contains("holds no CA certificate"), "{e}");
        let e = split("postgres://u:p@h/db?sslmode=require&sslcert=/x.pem")
            .err()
            .unwrap();
        assert!(e.contains("sslcert and sslkey go together"), "{e}");
    }

    #[test]
    fn escaped_paths_are_decoded() {
        let decode = |s| crate::http::percent_decode(s, false);
        assert_eq!(decode("%2Ftmp%2Fca.pem"), "/tmp/ca.pem");
        assert_eq!(decode("a%2"), "a%2");
        assert_eq!(decode("100%"), "100%");
    }
}
