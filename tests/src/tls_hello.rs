//! Hand-written TLS ClientHellos: checks that a TLS listener refuses protocol versions below
//! TLS 1.2 whatever the local TLS libraries can still offer (the API listener in `tls.rs`, the
//! cluster listener in `route_audit.rs`).

use std::io::{Read, Write};
use std::time::Duration;

/// A ClientHello as a TLS 1.0/1.1/1.2 client without the TLS 1.3 `supported_versions`
/// extension sends it, offering `version` (0x0301 TLS 1.0, 0x0302 TLS 1.1, 0x0303 TLS 1.2)
/// and otherwise the same ECDHE/AES-GCM suites, groups and signature schemes, so that the
/// version is the only difference between the refused hellos and the accepted control.
fn client_hello(version: u16) -> Vec<u8> {
    let mut ext = Vec::new();
    let mut push_ext = |id: u16, body: &[u8]| {
        ext.extend_from_slice(&id.to_be_bytes());
        ext.extend_from_slice(&(body.len() as u16).to_be_bytes());
        ext.extend_from_slice(body);
    };
    // supported_groups: x25519, secp256r1, secp384r1.
    push_ext(0x000a, &[0, 6, 0x00, 0x1d, 0x00, 0x17, 0x00, 0x18]);
    // ec_point_formats: uncompressed.
    push_ext(0x000b, &[1, 0]);
    // signature_algorithms: ecdsa_secp256r1_sha256, rsa_pss_rsae_sha256, rsa_pkcs1_sha256.
    push_ext(0x000d, &[0, 6, 0x04, 0x03, 0x08, 0x04, 0x04, 0x01]);
    let suites: [u16; 6] = [0xc02b, 0xc02f, 0xc02c, 0xc030, 0xcca9, 0xcca8];
    let mut body = Vec::new();
    body.extend_from_slice(&version.to_be_bytes());
    body.extend_from_slice(&[0x5a; 32]); // random
    body.push(0); // no session id
    body.extend_from_slice(&((suites.len() * 2) as u16).to_be_bytes());
    for c in suites {
        body.extend_from_slice(&c.to_be_bytes());
    }
    body.extend_from_slice(&[1, 0]); // compression: null only
    body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    body.extend_from_slice(&ext);
    let mut hs = vec![1]; // ClientHello
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut rec = vec![0x16, 0x03, 0x01];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

/// What the listener at `addr` answers to [`client_hello`] with `version`: the first bytes it
/// sends before closing (or 3 s).
fn hello_answer(addr: &str, version: u16) -> Vec<u8> {
    let mut c = std::net::TcpStream::connect(addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    c.write_all(&client_hello(version)).expect("send the hello");
    let mut out = vec![0; 16];
    let mut n = 0;
    while n < out.len() {
        match c.read(&mut out[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    out.truncate(n);
    out
}

/// How long the TLS listener at `addr` takes to answer a new connection's TLS 1.2
/// ClientHello with a ServerHello (`None`: it answered something else, or nothing in 3 s).
pub fn server_hello_time(addr: &str) -> Option<std::time::Duration> {
    let t = std::time::Instant::now();
    let a = hello_answer(addr, 0x0303);
    (a.len() >= 6 && a[0] == 0x16 && a[5] == 2).then(|| t.elapsed())
}

/// The first bytes of a TLS 1.2 ClientHello record, for a client that never finishes it.
pub fn client_hello_prefix(n: usize) -> Vec<u8> {
    let mut h = client_hello(0x0303);
    h.truncate(n);
    h
}

/// Asserts the TLS listener at `addr` refuses TLS 1.0 and 1.1 with a `protocol_version` alert
/// and answers the same hello offering TLS 1.2 with a TLS 1.2 ServerHello (the control: the
/// hello is well formed and only its version is refused).
pub fn assert_refuses_below_tls12(addr: &str) {
    let ok = hello_answer(addr, 0x0303);
    assert!(
        ok.len() >= 11 && ok[0] == 0x16 && ok[5] == 2 && ok[9..11] == [3, 3],
        "{addr}: a TLS 1.2 hello: want a TLS 1.2 ServerHello, got {ok:02x?}"
    );
    for (name, v) in [("TLS 1.0", 0x0301), ("TLS 1.1", 0x0302)] {
        let a = hello_answer(addr, v);
        // Alert record, fatal, protocol_version (70); never a ServerHello.
        assert!(
            a.len() >= 7 && a[0] == 0x15 && a[5] == 2 && a[6] == 70,
            "{addr}: a {name} hello: want a fatal protocol_version alert, got {a:02x?}"
        );
    }
}
