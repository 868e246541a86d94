//! The replication targets: `activation` (activation tokens and encrypted credentials) and
//! `peer_msg` (cluster-channel frames given to a DR primary).
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)] // a broken promise panics: that is the finding

use super::harness::{snapshot, Harness, ROOT, T0};
use super::Bytes;
use crate::api::{Method, Request};
use crate::node::{Input, Output};
use crate::replication::msg::{PeerAnswer, PeerBody, PeerMsg, PeerRequest};
use crate::replication::{activation, Mode};
use crate::storage::MemStorage;
use serde_json::json;

fn activation_ctx_parts() -> (MemStorage, crate::seal::Barrier, rand_chacha::ChaCha20Rng) {
    let mut b = crate::seal::Barrier::default();
    b.unseal_with([3; 32]);
    let rng = <rand_chacha::ChaCha20Rng as rand_core::SeedableRng>::seed_from_u64(5);
    (MemStorage::new(), b, rng)
}

/// Activation token and encrypted credential decoding: arbitrary tokens through the
/// decoders (claims, signature check, encrypted-token decryption), a tampered encrypted
/// token never decrypts, and a secondary `enable` whose token and unwrapped credential
/// (the primary's answer) are arbitrary answers 4xx, never a crash.
pub fn activation(data: &[u8]) {
    let mut b = Bytes::new(data);
    let flags = b.byte();
    let token = b.string();
    let _ = activation::is_activation_token(&token);
    let _ = activation::decode(&token);
    let (s, barrier, mut rng) = activation_ctx_parts();
    let mut ctx = crate::ctx::Ctx {
        txn: crate::storage::Txn::new(&s),
        barrier: &barrier,
        rng: &mut rng,
        now: T0,
    };
    let claims = activation::Claims {
        addr: "http://fuzz-api".into(),
        id: "cs.inner".into(),
        mode: Mode::Dr,
        exp: T0 / 1000 + 600,
        jti: "sec1".into(),
    };
    if let Ok(signed) = activation::issue(&mut ctx, &claims) {
        let _ = activation::verify(&mut ctx, &token);
        if token != signed {
            // Any other token is refused, never accepted with the issued claims' rights.
            if let Ok(c) = activation::verify(&mut ctx, &token) {
                assert_eq!(c, claims, "a forged token verified with other claims");
            }
        }
    }
    let _ = activation::is_encrypted_token(&token);
    if let Ok(pk) = activation::generate_public_key(&mut ctx, Mode::Dr) {
        let _ = activation::decrypt(&ctx, Mode::Dr, &token);
        let sealed = activation::Sealed {
            mode: Mode::Dr,
            exp: T0 / 1000 + 600,
            bundle: crate::replication::state::Bundle {
                mode: Mode::Dr,
                primary_cluster_id: "c".into(),
                primary_cluster_addrs: vec!["p:1".into()],
                primary_api_addr: "http://p".into(),
                secondary_id: "sec1".into(),
                secret: "s".into(),
                ca_pem: String::new(),
                barrier_key: hex::encode([4u8; 32]),
                seal_config: String::new(),
                keyring: String::new(),
                primary_version: String::new(),
            },
        };
        if let Ok(enc) = activation::encrypt_to(&mut ctx, &pk, &sealed) {
            assert_eq!(
                activation::decrypt(&ctx, Mode::Dr, &enc).ok(),
                Some(sealed.bundle.clone())
            );
            // Flip one byte of the encrypted token: it must not decrypt to anything.
            let mut t = enc.into_bytes();
            let at = usize::from(b.byte()) % t.len();
            t[at] ^= b.byte().max(1);
            if let Ok(t) = String::from_utf8(t) {
                if let Ok(got) = activation::decrypt(&ctx, Mode::Dr, &t) {
                    assert_eq!(got, sealed.bundle, "a tampered token decrypted: {t:?}");
                }
            }
        }
    }
    drop(ctx);

    // End to end: `secondary/enable` with the token, the primary answering with arbitrary
    // bytes (or an arbitrary credential in an unwrap envelope).
    let mut h = Harness::new(false);
    let body = b.rest();
    let status = [200u16, 400, 403, 500][usize::from(flags >> 4) % 4];
    let answer = if flags & 1 != 0 {
        let mut v = b"{\"data\":".to_vec();
        v.extend_from_slice(body);
        v.push(b'}');
        v
    } else {
        body.to_vec()
    };
    h.http_answer = Some((status, answer));
    let token = if flags & 2 != 0 {
        // A well-formed token so the call reaches the primary's answer.
        let c = activation::Claims {
            addr: token.clone(),
            ..claims
        };
        format!(
            "e30.{}.c2ln",
            base64::Engine::encode(
                &base64::engine::general_purpose::URL_SAFE_NO_PAD,
                serde_json::to_vec(&c).unwrap_or_default()
            )
        )
    } else {
        token
    };
    let mode = if flags & 4 != 0 { "dr" } else { "performance" };
    let path = format!("sys/replication/{mode}/secondary/enable");
    let _ = h.call(
        Request::new(0, Method::Post, &path)
            .with_token(ROOT)
            .with_json(json!({ "token": token })),
    );
    let _ = h.call(Request::new(0, Method::Get, "sys/replication/status").with_token(ROOT));
}

/// Peer message decoding: arbitrary bytes decoded as a request and an answer frame of the
/// cluster channel (JSON, perhaps with a binary attachment; a decoded message re-encodes to
/// itself), then given to a DR primary, with the credential of a registered secondary when
/// the first byte says so. The primary answers with at most one message per request and
/// never an internal error.
pub fn peer_msg(data: &[u8]) {
    let mut b = Bytes::new(data);
    let flags = b.byte();
    let rest = b.rest();
    if let Ok(a) = PeerAnswer::from_wire(rest) {
        let again = a.clone().into_wire().map(|w| PeerAnswer::from_wire(&w));
        assert_eq!(again, Ok(Ok(a)), "answer does not round-trip");
    }
    let msg = if flags & 1 != 0 {
        let Ok(body) = serde_json::from_slice::<PeerBody>(rest) else {
            return;
        };
        let Some(auth) = snapshot(true).auth.clone() else {
            return;
        };
        PeerMsg {
            mode: Mode::Dr,
            auth,
            body,
        }
    } else {
        match PeerMsg::from_wire(rest) {
            Ok(m) => m,
            Err(_) => return,
        }
    };
    let again = msg.clone().into_wire().map(|w| PeerMsg::from_wire(&w));
    assert_eq!(
        again.as_ref().ok().and_then(|r| r.as_ref().ok()),
        Some(&msg),
        "message does not round-trip"
    );
    let mut h = Harness::new(true);
    h.node.handle(
        h.now,
        Input::PeerRequest(PeerRequest {
            id: 77,
            msg: msg.clone(),
        }),
    );
    h.node.handle(h.now + 60_000, Input::Tick);
    let mut answers = 0;
    while let Some(o) = h.node.poll_output() {
        if let Output::PeerResponse(r) = o {
            assert_eq!(r.id, 77);
            answers += 1;
            if let PeerAnswer::Error { code, message } = &r.msg {
                assert_ne!(code, "internal", "{msg:?} -> {message}");
            }
        }
    }
    assert!(answers <= 1, "{answers} answers to one request");
}
