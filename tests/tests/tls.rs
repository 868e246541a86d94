//! The API listener over real TLS: a certificate from a throwaway CA, a client that trusts
//! only that CA, and a client that trusts nothing and must fail.

use cairn_tests::{fresh_port_pair, tmpdir, Server, StartError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A server whose API listener serves TLS with a certificate from a throwaway CA: the
/// server, its API port and the CA certificate.
fn tls_server() -> (Server, u16, rcgen::Certificate) {
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
    // The server's start line names its PID and API address: the answers below come from
    // this server, not from another process on a reused port; a taken port is retried.
    let mut start = None;
    for _ in 0..5 {
        let port = fresh_port_pair();
        let cfg = format!(
            "storage \"sqlite\" {{ path = \"{d}/c.db\" }}\nlistener \"tcp\" {{\n address = \"127.0.0.1:{port}\"\n cluster_address = \"127.0.0.1:{}\"\n tls_cert_file = \"{d}/tls.crt\"\n tls_key_file = \"{d}/tls.key\"\n}}\n",
            port + 1,
            d = dir.display()
        );
        std::fs::write(dir.join("c.hcl"), cfg).unwrap();
        match Server::spawn_config(&dir.join("c.hcl"), &format!("https://127.0.0.1:{port}")) {
            Ok(s) => {
                start = Some((s, port));
                break;
            }
            Err(e @ StartError::PortTaken(_)) => eprintln!("{e}; retrying on another port"),
            Err(e) => panic!("TLS server: {e}"),
        }
    }
    // Killed when dropped, also when an assertion fails.
    let (mut server, port) = start.expect("a TLS server after 5 port pairs");
    server.own(dir);
    (server, port, ca)
}

#[test]
fn api_serves_https_with_configured_certificate() {
    let (_server, port, ca) = tls_server();
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
    // Refused for its certificate (not, say, because nothing listens).
    let e = untrusting
        .get(&url)
        .call()
        .expect_err("an untrusted certificate");
    assert!(
        format!("{e:?}").contains("InvalidCertificate(UnknownIssuer)"),
        "{e:?}"
    );
    // Plain HTTP to the TLS port gets no HTTP answer: the server closes the connection (the
    // TLS handshake fails). (Vault's Go server answers a bare 400 "Client sent an HTTP
    // request to an HTTPS server." instead; neither is an API answer.)
    let plain: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(3)))
        .build()
        .into();
    let r = plain
        .get(&format!("http://127.0.0.1:{port}/v1/sys/seal-status"))
        .call();
    match r {
        Err(ureq::Error::Io(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
            ) => {}
        other => panic!("plain HTTP to the TLS port: want the connection closed, got {other:?}"),
    }
}

/// The API listener negotiates TLS 1.2 or 1.3 only (rustls, which implements nothing older;
/// `shell/vendor/tiny_http/src/ssl/rustls.rs` builds its config with rustls' safe defaults,
/// TLS 1.3 and 1.2): a TLS 1.0 or 1.1 ClientHello is answered with a protocol_version alert.
/// Then the same with the system's `openssl s_client`, when it can still offer TLS 1.1.
#[test]
fn api_listener_refuses_tls_below_1_2() {
    let (_server, port, _ca) = tls_server();
    let addr = format!("127.0.0.1:{port}");
    // The listener may take a moment to come up after the start line.
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(&addr).is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    cairn_tests::tls_hello::assert_refuses_below_tls12(&addr);

    let s_client = |flag: &str| {
        std::process::Command::new("openssl")
            .args(["s_client", "-connect", &addr, flag])
            // OpenSSL 3 offers TLS 1.0/1.1 only at security level 0.
            .args(["-cipher", "DEFAULT@SECLEVEL=0"])
            .stdin(std::process::Stdio::null())
            .output()
    };
    let Ok(out) = s_client("-tls1_1") else {
        eprintln!("SKIPPED the openssl check: no `openssl` command (the Rust-level check ran)");
        return;
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if text.contains("no protocols available") || text.contains("unknown option") {
        eprintln!(
            "SKIPPED the openssl check: this openssl cannot offer TLS 1.1 ({}) (the Rust-level check ran)",
            text.lines().find(|l| l.contains("protocols") || l.contains("option")).unwrap_or("")
        );
        return;
    }
    assert!(!out.status.success(), "openssl -tls1_1 connected: {text}");
    // The server answers with a fatal alert (rustls sends protocol_version or, for a hello
    // whose TLS 1.1 cipher suites it does not implement, handshake_failure): no certificate,
    // no cipher, no session.
    assert!(
        text.contains("SSL alert number") && text.contains("Cipher is (NONE)"),
        "openssl -tls1_1: want the server's fatal alert and no cipher: {text}"
    );
    assert!(!text.contains("BEGIN CERTIFICATE"), "{text}");
    let out = s_client("-tls1_2").expect("openssl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("TLSv1.2"),
        "openssl -tls1_2 (the control) did not negotiate TLS 1.2: {text}"
    );
}
