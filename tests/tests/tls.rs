//! The API listener over real TLS: a certificate from a throwaway CA, a client that trusts
//! only that CA, and a client that trusts nothing and must fail.

use cairn_tests::{cairn_bin, free_port_pair, tmpdir};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn api_serves_https_with_configured_certificate() {
    let dir = tmpdir("tls");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let cert = params.signed_by(&key, &issuer).unwrap();
    std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
    let port = free_port_pair();
    let cfg = format!(
        "storage \"sqlite\" {{ path = \"{d}/c.db\" }}\nlistener \"tcp\" {{\n address = \"127.0.0.1:{port}\"\n tls_cert_file = \"{d}/tls.crt\"\n tls_key_file = \"{d}/tls.key\"\n}}\n",
        d = dir.display()
    );
    std::fs::write(dir.join("c.hcl"), cfg).unwrap();
    let mut child = Command::new(cairn_bin())
        .args(["server", "--config"])
        .arg(dir.join("c.hcl"))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let trusted: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::Specific(Arc::new(vec![
                    ureq::tls::Certificate::from_der(ca.der()).to_owned(),
                ])))
                .build(),
        )
        .build()
        .into();
    let url = format!("https://localhost:{port}/v1/sys/seal-status");
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        match trusted.get(&url).call() {
            Ok(mut r) => break r.body_mut().read_to_string().unwrap(),
            Err(e) if Instant::now() > deadline => panic!("no TLS answer: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    assert!(body.contains("\"initialized\":false"), "{body}");
    // A client that does not trust the CA refuses the connection.
    let untrusting: ureq::Agent = ureq::Agent::config_builder()
        .tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::Specific(Arc::new(vec![])))
                .build(),
        )
        .build()
        .into();
    assert!(untrusting.get(&url).call().is_err());
    // Plain HTTP to the TLS port gets no API answer.
    let plain: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(3)))
        .build()
        .into();
    assert!(plain
        .get(&format!("http://127.0.0.1:{port}/v1/sys/seal-status"))
        .call()
        .is_err());
    let _ = child.kill();
    let _ = child.wait();
}
