//! The replication targets: `activation` (activation tokens and encrypted credentials) and
//! `peer_msg` (cluster-channel frames given to a DR primary).
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)] // a broken promise panics: that is the finding

use super::harness::{snapshot, Harness, ROOT, T0};
use super::Bytes;
use crate::api::{Method, Request};
use crate::node::{Input, Output};
use crate::replication::msg::{PeerAnswer, PeerBody, PeerMsg, PeerRequest};
use crate::replication::{activation, Mode};
use crate::storage::{MemStorage, Storage};
use serde_json::json;

/// What every `activation` input is checked against, made once per thread: the claims of
/// an issued token and the token, a secondary's activation key pair (the private half in
/// `storage`, as `generate-public-key` leaves it) and a credential bundle encrypted to it.
/// None of it depends on the input, so no input pays for the key generation and the
/// encryption (three X25519 multiplications and a signature were most of an input's cost);
/// the round trip the input used to check is checked here, once.
struct ActivationFixture {
    storage: MemStorage,
    barrier: crate::seal::Barrier,
    claims: activation::Claims,
    /// `claims` signed by the key in `storage`.
    signed: String,
    sealed: activation::Sealed,
    /// `sealed` encrypted to the public key whose private half is in `storage`.
    encrypted: String,
}

fn activation_rng() -> rand_chacha::ChaCha20Rng {
    <rand_chacha::ChaCha20Rng as rand_core::SeedableRng>::seed_from_u64(5)
}

impl ActivationFixture {
    fn new() -> ActivationFixture {
        let mut barrier = crate::seal::Barrier::default();
        barrier.unseal_with([3; 32]);
        let mut storage = MemStorage::new();
        let mut rng = activation_rng();
        let claims = activation::Claims {
            addr: "http://fuzz-api".into(),
            id: "cs.inner".into(),
            mode: Mode::Dr,
            exp: T0 / 1000 + 600,
            jti: "sec1".into(),
        };
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
                client: None,
                barrier_key: hex::encode([4u8; 32]),
                seal_config: String::new(),
                keyring: String::new(),
                primary_version: String::new(),
            },
        };
        let (signed, encrypted, writes) = {
            let mut ctx = crate::ctx::Ctx {
                txn: crate::storage::Txn::new(&storage),
                barrier: &barrier,
                rng: &mut rng,
                now: T0,
            };
            let signed = activation::issue(&mut ctx, &claims).expect("issue");
            assert_eq!(
                activation::verify(&mut ctx, &signed).ok(),
                Some(claims.clone())
            );
            let pk = activation::generate_public_key(&mut ctx, Mode::Dr).expect("key pair");
            let encrypted = activation::encrypt_to(&mut ctx, &pk, &sealed).expect("encrypt");
            assert_eq!(
                activation::decrypt(&ctx, Mode::Dr, &encrypted).ok(),
                Some(sealed.bundle.clone()),
                "an encrypted token does not decrypt to its bundle"
            );
            (signed, encrypted, ctx.txn.into_writes())
        };
        storage.apply(&writes).expect("in-memory storage");
        ActivationFixture {
            storage,
            barrier,
            claims,
            signed,
            sealed,
            encrypted,
        }
    }
}

/// Activation token and encrypted credential decoding: arbitrary tokens through the
/// decoders (claims, signature check, encrypted-token decryption), a tampered encrypted
/// token never decrypts, and a secondary `enable` whose token and unwrapped credential
/// (the primary's answer) are arbitrary answers 4xx, never a crash.
pub fn activation(data: &[u8]) {
    thread_local! {
        static FIXTURE: ActivationFixture = ActivationFixture::new();
    }
    FIXTURE.with(|f| activation_with(f, data));
}

fn activation_with(f: &ActivationFixture, data: &[u8]) {
    let mut b = Bytes::new(data);
    let flags = b.byte();
    let token = b.string();
    let _ = activation::is_activation_token(&token);
    let _ = activation::decode(&token);
    let mut rng = activation_rng();
    let mut ctx = crate::ctx::Ctx {
        txn: crate::storage::Txn::new(&f.storage),
        barrier: &f.barrier,
        rng: &mut rng,
        now: T0,
    };
    let claims = f.claims.clone();
    if token != f.signed {
        // Any other token is refused, never accepted with the issued claims' rights.
        if let Ok(c) = activation::verify(&mut ctx, &token) {
            assert_eq!(c, claims, "a forged token verified with other claims");
        }
    }
    let _ = activation::is_encrypted_token(&token);
    let _ = activation::decrypt(&ctx, Mode::Dr, &token);
    // Flip one byte of the encrypted token: it must not decrypt to anything else.
    let mut t = f.encrypted.clone().into_bytes();
    let at = usize::from(b.byte()) % t.len();
    t[at] ^= b.byte().max(1);
    if let Ok(t) = String::from_utf8(t) {
        if let Ok(got) = activation::decrypt(&ctx, Mode::Dr, &t) {
            assert_eq!(got, f.sealed.bundle, "a tampered token decrypted: {t:?}");
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
