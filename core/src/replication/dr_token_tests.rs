//! Tests of the DR operation token: the generation attempt, the key shares, the OTP and
//! PGP deliveries, and the checks the protected operations make.

use super::*;
use crate::seal::Barrier;
use crate::storage::{MemStorage, Storage, Txn};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;

/// A sealed-then-unsealed 3-of-5 cluster on in-memory storage.
struct Fixture {
    storage: MemStorage,
    barrier: Barrier,
    rng: ChaCha20Rng,
    shares: Vec<String>,
    now: u64,
}

impl Fixture {
    fn new(seed: u64) -> Fixture {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let cfg = SealConfig {
            secret_shares: 5,
            secret_threshold: 3,
        };
        let root = crypto::random_key(&mut rng);
        let bk = crypto::random_key(&mut rng);
        let shares = seal::split(&root, &cfg, &mut rng);
        let mut storage = MemStorage::new();
        let kr = seal::wrap_keyring(&root, &bk, &mut rng);
        storage
            .apply(&[
                (
                    seal::SEAL_CONFIG_KEY.into(),
                    Some(serde_json::to_vec(&cfg).unwrap()),
                ),
                (seal::KEYRING_KEY.into(), Some(kr)),
            ])
            .unwrap();
        let mut barrier = Barrier::default();
        barrier.unseal_with(bk);
        Fixture {
            storage,
            barrier,
            rng,
            shares: shares.iter().map(hex::encode).collect(),
            now: 1_000,
        }
    }

    /// Runs `f` like the node does: the writes are applied when it returns a reply.
    fn run(&mut self, f: impl FnOnce(&mut Ctx) -> ApiResult) -> (u16, Value) {
        let mut ctx = Ctx {
            txn: Txn::new(&self.storage),
            barrier: &self.barrier,
            rng: &mut self.rng,
            now: self.now,
        };
        let r = f(&mut ctx);
        let writes = ctx.txn.into_writes();
        match r {
            Ok(reply) => {
                self.storage.apply(&writes).unwrap();
                match reply {
                    Reply::Raw(s, v) => (s, v),
                    Reply::Empty => (204, Value::Null),
                    other => panic!("unexpected reply {other:?}"),
                }
            }
            Err(e) => (e.status(), json!({ "errors": [e.to_string()] })),
        }
    }

    fn req(&mut self, method: Method, op: &str, body: Value) -> (u16, Value) {
        let r = Request::new(1, method, &format!("{BASE}{op}")).with_json(body);
        self.run(|ctx| dispatch(ctx, &r, op))
    }

    fn start(&mut self, body: Value) -> (u16, Value) {
        self.req(Method::Post, ATTEMPT, body)
    }

    fn update(&mut self, key: &str, nonce: &str) -> (u16, Value) {
        self.req(Method::Post, UPDATE, json!({ "key": key, "nonce": nonce }))
    }

    fn check(&mut self, token: &str) -> Result<(), ApiError> {
        let ctx = Ctx {
            txn: Txn::new(&self.storage),
            barrier: &self.barrier,
            rng: &mut self.rng,
            now: self.now,
        };
        check_dr_operation_token(&ctx, token)
    }

    /// Starts, gives shares 0, 2, 4 and decodes the token.
    fn generate(&mut self) -> String {
        let (s, b) = self.start(json!({}));
        assert_eq!(s, 200, "{b}");
        let nonce = b["nonce"].as_str().unwrap().to_string();
        let otp = b["otp"].as_str().unwrap().to_string();
        let mut last = Value::Null;
        for i in [0, 2, 4] {
            let k = self.shares[i].clone();
            let (s, b) = self.update(&k, &nonce);
            assert_eq!(s, 200, "{b}");
            last = b;
        }
        decode_token(last["encoded_token"].as_str().unwrap(), &otp).unwrap()
    }
}

fn errors(b: &Value) -> String {
    b["errors"].to_string()
}

#[test]
fn dr_token_full_flow_three_of_five() {
    let mut fx = Fixture::new(1);
    let (s, b) = fx.start(json!({}));
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["started"], json!(true));
    assert_eq!(b["progress"], json!(0));
    assert_eq!(b["required"], json!(3));
    assert_eq!(b["complete"], json!(false));
    assert_eq!(b["encoded_token"], json!(""));
    assert_eq!(b["pgp_fingerprint"], json!(""));
    let otp = b["otp"].as_str().unwrap().to_string();
    assert_eq!(otp.len(), TOKEN_LEN);
    assert_eq!(b["otp_length"], json!(TOKEN_LEN));
    assert!(otp.bytes().all(|c| c.is_ascii_alphanumeric()));
    let nonce = b["nonce"].as_str().unwrap().to_string();
    assert_eq!(nonce.len(), 36);

    // GET shows the attempt but never the OTP.
    let (s, g) = fx.req(Method::Get, ATTEMPT, Value::Null);
    assert_eq!(s, 200);
    assert_eq!(g["nonce"], json!(nonce));
    assert_eq!(g["otp_length"], json!(TOKEN_LEN));
    assert!(g.get("otp").is_none(), "{g}");
    assert!(!g.to_string().contains(&otp));

    // Shares in hex and base64 both count.
    let b64 = base64::engine::general_purpose::STANDARD.encode(hex::decode(&fx.shares[1]).unwrap());
    let (s, u) = fx.update(&b64, &nonce);
    assert_eq!((s, u["progress"].clone()), (200, json!(1)), "{u}");
    assert!(u.get("otp").is_none());
    let k = fx.shares[3].clone();
    let (_, u) = fx.update(&k, &nonce);
    assert_eq!(u["progress"], json!(2));
    assert_eq!(u["complete"], json!(false));
    assert_eq!(u["encoded_token"], json!(""));
    let k = fx.shares[0].clone();
    let (s, u) = fx.update(&k, &nonce);
    assert_eq!(s, 200, "{u}");
    assert_eq!(u["complete"], json!(true));
    assert_eq!(u["progress"], json!(3));
    let enc = u["encoded_token"].as_str().unwrap();
    assert!(!enc.is_empty() && !enc.ends_with('='));
    let token = decode_token(enc, &otp).unwrap();
    assert!(token.starts_with(TOKEN_PREFIX), "{token}");
    assert_eq!(token.len(), TOKEN_LEN);
    assert_eq!(fx.check(&token), Ok(()));
    // The token is stored only hashed.
    for v in fx.storage.map.values() {
        assert!(!String::from_utf8_lossy(v).contains(&token));
    }
    // The attempt is over; a new one may start.
    let (_, g) = fx.req(Method::Get, ATTEMPT, Value::Null);
    assert_eq!(g["started"], json!(false));
    assert_eq!(fx.start(json!({})).0, 200);
    // The token stays valid (no TTL).
    fx.now += 400 * 24 * 3600 * 1000;
    assert_eq!(fx.check(&token), Ok(()));
}

#[test]
fn dr_token_check_refuses_missing_wrong_and_client_tokens() {
    let mut fx = Fixture::new(2);
    let e = fx.check("").unwrap_err();
    assert_eq!(e.status(), 403);
    assert!(e.to_string().contains("missing required field"), "{e}");
    let token = fx.generate();
    let mut wrong = token.clone().into_bytes();
    wrong[10] = if wrong[10] == b'a' { b'b' } else { b'a' };
    let e = fx.check(&String::from_utf8(wrong).unwrap()).unwrap_err();
    assert!(matches!(e, ApiError::Forbidden(_)));
    assert!(e.to_string().contains("does not exist on this node"), "{e}");
    let e = fx.check("cs.AAAAAAAAAAAAAAAAAAAAAAAA").unwrap_err();
    assert!(e.to_string().contains("not a DR operation token"), "{e}");
}

#[test]
fn dr_token_wrong_nonce_refused() {
    let mut fx = Fixture::new(3);
    let (_, b) = fx.start(json!({}));
    let k = fx.shares[0].clone();
    let (s, u) = fx.update(&k, "00000000-0000-4000-8000-000000000000");
    assert_eq!(s, 400);
    assert!(errors(&u).contains("does not match the nonce"), "{u}");
    let (_, g) = fx.req(Method::Get, ATTEMPT, Value::Null);
    assert_eq!(g["progress"], json!(0));
    assert_eq!(g["nonce"], b["nonce"]);
    // Without an attempt, an update says so.
    assert_eq!(fx.req(Method::Delete, ATTEMPT, Value::Null).0, 204);
    let (s, u) = fx.update(&k, b["nonce"].as_str().unwrap());
    assert_eq!(s, 400);
    assert!(
        errors(&u).contains("no DR operation token generation attempt"),
        "{u}"
    );
}

#[test]
fn dr_token_second_attempt_refused_until_cancelled() {
    let mut fx = Fixture::new(4);
    let (_, first) = fx.start(json!({}));
    let (s, b) = fx.start(json!({}));
    assert_eq!(s, 400);
    assert!(errors(&b).contains("already in progress"), "{b}");
    let (_, g) = fx.req(Method::Get, ATTEMPT, Value::Null);
    assert_eq!(g["nonce"], first["nonce"]);
    assert_eq!(fx.req(Method::Delete, ATTEMPT, Value::Null).0, 204);
    let (s, second) = fx.start(json!({}));
    assert_eq!(s, 200);
    assert_ne!(second["nonce"], first["nonce"]);
    assert_ne!(second["otp"], first["otp"]);
    assert_eq!(fx.req(Method::List, ATTEMPT, Value::Null).0, 405);
    assert_eq!(fx.start(json!({"bogus": 1})).0, 400);
}

#[test]
fn dr_token_bad_share_refused_and_progress_reset() {
    let mut fx = Fixture::new(5);
    let other = Fixture::new(6);
    let (_, b) = fx.start(json!({}));
    let nonce = b["nonce"].as_str().unwrap().to_string();
    // Not a share at all: refused, progress unchanged.
    let (s, u) = fx.update("not-a-key!", &nonce);
    assert_eq!(s, 400);
    assert!(errors(&u).contains("hex or base64"), "{u}");
    let (s, u) = fx.update("abcd", &nonce);
    assert_eq!(s, 400);
    assert!(errors(&u).contains("expected 33 bytes"), "{u}");
    // A share of another cluster: found out when the threshold is reached.
    let (k0, k1) = (fx.shares[0].clone(), fx.shares[1].clone());
    fx.update(&k0, &nonce);
    fx.update(&k1, &nonce);
    let (s, u) = fx.update(&other.shares[2], &nonce);
    assert_eq!(s, 400);
    assert!(errors(&u).contains("do not reconstruct"), "{u}");
    let (_, g) = fx.req(Method::Get, ATTEMPT, Value::Null);
    assert_eq!(
        (g["started"].clone(), g["progress"].clone()),
        (json!(true), json!(0))
    );
    assert!(!fx.storage.map.contains_key(HASH_KEY));
    // The same attempt then completes with good shares.
    let mut last = Value::Null;
    for i in [4, 3, 2] {
        let k = fx.shares[i].clone();
        last = fx.update(&k, &nonce).1;
    }
    assert_eq!(last["complete"], json!(true), "{last}");
    let token = decode_token(
        last["encoded_token"].as_str().unwrap(),
        b["otp"].as_str().unwrap(),
    )
    .unwrap();
    assert_eq!(fx.check(&token), Ok(()));
}

#[test]
fn dr_token_duplicate_share_refused() {
    let mut fx = Fixture::new(7);
    let (_, b) = fx.start(json!({}));
    let nonce = b["nonce"].as_str().unwrap().to_string();
    let k = fx.shares[2].clone();
    assert_eq!(fx.update(&k, &nonce).0, 200);
    let b64 = base64::engine::general_purpose::STANDARD.encode(hex::decode(&k).unwrap());
    let (s, u) = fx.update(&b64, &nonce);
    assert_eq!(s, 400);
    assert!(errors(&u).contains("already provided"), "{u}");
    let (_, g) = fx.req(Method::Get, ATTEMPT, Value::Null);
    assert_eq!(g["progress"], json!(1));
}

#[test]
fn dr_token_deleted_token_refused() {
    let mut fx = Fixture::new(8);
    let t1 = fx.generate();
    let t2 = fx.generate();
    assert_ne!(t1, t2);
    // Deleting needs a valid token.
    let (s, b) = fx.req(Method::Post, DELETE, json!({}));
    assert_eq!(s, 403, "{b}");
    let (s, _) = fx.req(Method::Post, DELETE, json!({ FIELD: "cdr.nope" }));
    assert_eq!(s, 403);
    let before = fx.storage.map.clone();
    assert_eq!(fx.req(Method::Post, DELETE, json!({ FIELD: t1 })).0, 204);
    assert_ne!(before, fx.storage.map);
    let e = fx.check(&t1).unwrap_err();
    assert_eq!(e.status(), 403);
    assert_eq!(fx.check(&t2), Ok(()));
    let (s, b) = fx.req(Method::Post, DELETE, json!({ FIELD: t1 }));
    assert_eq!(s, 403, "{b}");
    assert_eq!(fx.req(Method::Post, DELETE, json!({ FIELD: t2 })).0, 204);
    assert!(fx.check(&t2).is_err());
    assert!(!fx.storage.map.contains_key(HASH_KEY));
}

#[test]
fn dr_token_keys_are_node_local() {
    let mut fx = Fixture::new(9);
    fx.generate();
    fx.start(json!({}));
    for k in [ATTEMPT_KEY, HASH_KEY, SALT_KEY] {
        assert!(fx.storage.map.contains_key(k), "{k}");
        assert_eq!(
            crate::replication::class::classify(k, &Default::default()),
            crate::replication::class::Class::NodeLocal
        );
    }
}

#[test]
fn dr_token_client_supplied_otp() {
    let mut fx = Fixture::new(10);
    assert_eq!(fx.start(json!({"otp": "short"})).0, 400);
    let otp = "0123456789abcdefghijABCDEFGH";
    let (s, b) = fx.start(json!({ "otp": otp }));
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["otp"], json!(""));
    let nonce = b["nonce"].as_str().unwrap().to_string();
    let mut last = Value::Null;
    for i in [0, 1, 2] {
        let k = fx.shares[i].clone();
        last = fx.update(&k, &nonce).1;
    }
    let token = decode_token(last["encoded_token"].as_str().unwrap(), otp).unwrap();
    assert_eq!(fx.check(&token), Ok(()));
}

#[test]
fn dr_token_encoding_matches_reference() {
    // A root token and OTP as the reference's generate-root produces them (public sample).
    let t = decode_token(
        "PzVHSRMXERYIFCl9IhIMKwUoMz8OJBEgXAIIdQ",
        "WC4gXgKrEUZIRDxHRNTiiUIf9GO8",
    )
    .unwrap();
    assert!(t.starts_with("hvs."), "{t}");
    assert_eq!(
        encode_token(&t, "WC4gXgKrEUZIRDxHRNTiiUIf9GO8").unwrap(),
        "PzVHSRMXERYIFCl9IhIMKwUoMz8OJBEgXAIIdQ"
    );
    // Padded input decodes too; a wrong OTP length is a clear error.
    let enc = encode_token("cdr.abc", "1234567").unwrap();
    assert_eq!(
        decode_token(&format!("{enc}="), "1234567").unwrap(),
        "cdr.abc"
    );
    assert!(decode_token(&enc, "123").unwrap_err().contains("wrong OTP"));
}

fn test_pgp_key(rng: &mut ChaCha20Rng) -> ::pgp::composed::SignedSecretKey {
    use ::pgp::composed::{EncryptionCaps, KeyType, SecretKeyParamsBuilder, SubkeyParamsBuilder};
    use ::pgp::crypto::ecc_curve::ECCCurve;
    let mut enc = SubkeyParamsBuilder::default();
    enc.key_type(KeyType::ECDH(ECCCurve::Curve25519Legacy))
        .can_sign(false)
        .can_encrypt(EncryptionCaps::All)
        .can_authenticate(false);
    let mut p = SecretKeyParamsBuilder::default();
    p.key_type(KeyType::Ed25519Legacy)
        .can_certify(true)
        .can_sign(true)
        .can_encrypt(EncryptionCaps::None)
        .primary_user_id("DR operator <dr@example.com>".into())
        .subkeys(vec![enc.build().unwrap()]);
    p.build().unwrap().generate(rng).unwrap()
}

#[test]
fn dr_token_pgp_flow() {
    use ::pgp::composed::{Message, SignedPublicKey};
    use ::pgp::ser::Serialize as _;
    use ::pgp::types::KeyDetails;
    let mut fx = Fixture::new(11);
    let mut krng = ChaCha20Rng::seed_from_u64(99);
    let sk = test_pgp_key(&mut krng);
    let pk = SignedPublicKey::from(sk.clone());
    let b64 = base64::engine::general_purpose::STANDARD.encode(pk.to_bytes().unwrap());
    assert_eq!(fx.start(json!({"pgp_key": "bm90IGEga2V5"})).0, 400);
    assert_eq!(
        fx.start(json!({"pgp_key": b64, "otp": "0123456789abcdefghijABCDEFGH"}))
            .0,
        400
    );
    let (s, b) = fx.start(json!({ "pgp_key": b64 }));
    assert_eq!(s, 200, "{b}");
    let fp = format!("{:x}", pk.fingerprint());
    assert_eq!(b["pgp_fingerprint"], json!(fp));
    assert_eq!(b["otp"], json!(""));
    let nonce = b["nonce"].as_str().unwrap().to_string();
    let (_, g) = fx.req(Method::Get, ATTEMPT, Value::Null);
    assert_eq!(g["pgp_fingerprint"], json!(fp));
    let mut last = Value::Null;
    for i in [1, 2, 3] {
        let k = fx.shares[i].clone();
        last = fx.update(&k, &nonce).1;
    }
    assert_eq!(last["complete"], json!(true), "{last}");
    assert_eq!(last["pgp_fingerprint"], json!(fp));
    let raw = base64::engine::general_purpose::STANDARD
        .decode(last["encoded_token"].as_str().unwrap())
        .unwrap();
    let mut m = Message::from_bytes(raw.as_slice())
        .unwrap()
        .decrypt(&"".into(), &sk)
        .unwrap();
    if m.is_compressed() {
        m = m.decompress().unwrap();
    }
    let token = String::from_utf8(m.as_data_vec().unwrap()).unwrap();
    assert!(token.starts_with(TOKEN_PREFIX), "{token}");
    assert_eq!(fx.check(&token), Ok(()));
    // ASCII-armored keys are accepted as well.
    let armored = pk.to_armored_string(Default::default()).unwrap();
    let (s, b) = fx.start(json!({ "pgp_key": armored }));
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["pgp_fingerprint"], json!(fp));
}

#[test]
fn dr_token_operations_need_a_dr_secondary() {
    use crate::node::{Input, Node, NodeConfig, Output};
    let cfg = NodeConfig {
        license: crate::license::LicenseState::hosted(),
        ..Default::default()
    };
    let mut n = Node::new(MemStorage::new(), [5; 32], cfg);
    let mut next = 0u64;
    let mut call = |n: &mut Node<MemStorage>, req: Request| -> (u16, Value) {
        next += 1;
        let mut req = req;
        req.id = next;
        n.handle(1_000, Input::Request(req));
        while let Some(o) = n.poll_output() {
            if let Output::Response(r) = o {
                if r.id == next {
                    return (r.status, r.body.unwrap_or(Value::Null));
                }
            }
        }
        panic!("no response");
    };
    let (s, init) = call(
        &mut n,
        Request::new(0, Method::Put, "sys/init")
            .with_json(json!({"secret_shares": 5, "secret_threshold": 3})),
    );
    assert_eq!(s, 200);
    let keys: Vec<String> = init["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    for k in &keys[..3] {
        call(
            &mut n,
            Request::new(0, Method::Put, "sys/unseal").with_json(json!({ "key": k })),
        );
    }
    // Not a DR secondary: generation and the protected operations are refused (the
    // full flow through the node on a DR secondary is in replication/tests.rs).
    let path = |op: &str| format!("{BASE}{op}");
    let (s, b) = call(&mut n, Request::new(0, Method::Post, &path(ATTEMPT)));
    assert_eq!(s, 400, "{b}");
    assert!(b.to_string().contains("not a DR secondary"), "{b}");
    let (s, b) = call(
        &mut n,
        Request::new(0, Method::Post, &path(DELETE)).with_json(json!({ FIELD: "cdr.x" })),
    );
    assert_eq!(s, 400, "{b}");
    let _ = (UPDATE, &keys);
}
