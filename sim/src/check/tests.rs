//! Tests of the invariant checkers.

use super::*;
use crate::operator::Tok;
use cairn_core::DevKeys;
use serde_json::json;

const ROOT: &str = "cs.root0000000000000000000";
const T1: &str = "cs.t1000000000000000000000";

fn tok(label: &str, secret: &str) -> Tok {
    Tok {
        label: label.into(),
        secret: secret.into(),
    }
}

fn resp(status: u16, body: Option<Value>) -> Response {
    Response {
        id: 1,
        status,
        body,
        raw: None,
        index: None,
    }
}

fn see(
    c: &mut Checker,
    op: &Op,
    at: u64,
    status: u16,
    body: Option<Value>,
) -> Result<(), Violation> {
    c.observe(0, op, at, Observed::Response(&resp(status, body)))
}

/// A checker whose node 0 is initialised (1 share), unsealed, mounted, with a token T1
/// carrying policy `team-a` (read on `secret/a/*`) that expires at 100s.
fn ready() -> Checker {
    let mut c = Checker::new(1);
    let dev = Ok(AdminResult::DevSetup(DevKeys {
        keys: vec!["00".into()],
        keys_base64: vec!["AA==".into()],
        root_token: ROOT.into(),
    }));
    c.observe(0, &Op::DevSetup, 0, Observed::Admin(&dev))
        .unwrap();
    let root = tok("root", ROOT);
    let spec = crate::model::PolicySpec {
        rules: vec![crate::model::Rule {
            pattern: "secret/a/*".into(),
            caps: crate::model::READ,
        }],
    };
    let pw = Op::PolicyWrite {
        tok: root.clone(),
        name: "team-a".into(),
        spec,
        json: false,
    };
    see(&mut c, &pw, 0, 204, None).unwrap();
    let create = Op::TokenCreate {
        tok: root,
        policies: vec!["team-a".into()],
        ttl_s: 100,
        ttl_as_string: false,
        num_uses: 0,
        wrap: None,
    };
    let body = json!({"auth": {"client_token": T1, "lease_duration": 100,
        "policies": ["default", "team-a"], "num_uses": 0}});
    see(&mut c, &create, 0, 200, Some(body)).unwrap();
    c
}

fn kv(secret: &str, op: KvOp) -> Op {
    Op::Kv {
        tok: tok("t", secret),
        op,
        audit: false,
    }
}

fn get(key: &str) -> KvOp {
    KvOp::Get {
        key: key.into(),
        wrap: None,
    }
}

#[test]
fn policy_and_expiry_decide_denials() {
    let mut c = ready();
    // Covered read: fine either way it answers (404 here: no data yet).
    see(&mut c, &kv(T1, get("secret/a/k0")), 1_000, 404, None).unwrap();
    // Covered read refused: the allowed direction breaks.
    let e = see(&mut c, &kv(T1, get("secret/a/k0")), 1_000, 403, None).unwrap_err();
    assert_eq!(e.invariant, "authorized-succeeds");
    // Not covered: must be 403.
    let e = see(&mut c, &kv(T1, get("secret/b/k0")), 1_000, 404, None).unwrap_err();
    assert_eq!(e.invariant, "denied-stays-denied");
    // Expired at 100s: even a covered path must be refused.
    let e = see(&mut c, &kv(T1, get("secret/a/k0")), 100_000, 404, None).unwrap_err();
    assert_eq!(e.invariant, "denied-stays-denied");
    assert!(e.detail.contains("expired"), "{}", e.detail);
    see(&mut c, &kv(T1, get("secret/a/k0")), 100_000, 403, None).unwrap();
}

#[test]
fn revoked_token_stays_denied() {
    let mut c = ready();
    let revoke = Op::TokenRevoke {
        tok: tok("root", ROOT),
        target: tok("t1", T1),
        accessor: None,
    };
    see(&mut c, &revoke, 2_000, 204, None).unwrap();
    let look = Op::LookupSelf { tok: tok("t1", T1) };
    let e = see(&mut c, &look, 3_000, 200, Some(json!({"data": {}}))).unwrap_err();
    assert_eq!(e.invariant, "denied-stays-denied");
    assert!(e.detail.contains("revoked"), "{}", e.detail);
}

#[test]
fn reads_must_match_acknowledged_writes_and_survive_restarts() {
    let mut c = ready();
    let root = ROOT;
    let put = kv(
        root,
        KvOp::Put {
            key: "secret/a/k0".into(),
            value: json!({"v": 1}),
        },
    );
    see(&mut c, &put, 1_000, 204, None).unwrap();
    let e = see(
        &mut c,
        &kv(root, get("secret/a/k0")),
        1_000,
        200,
        Some(json!({"data": {"v": 2}})),
    )
    .unwrap_err();
    assert_eq!(e.invariant, "kv-consistency");
    c.on_crash(0);
    c.on_restart(0);
    let e = see(&mut c, &kv(root, get("secret/a/k0")), 2_000, 404, None).unwrap_err();
    assert_eq!(e.invariant, "sealed-503");
    let unseal = Op::Unseal { key: "00".into() };
    see(
        &mut c,
        &unseal,
        2_000,
        200,
        Some(json!({"sealed": false, "progress": 0})),
    )
    .unwrap();
    let e = see(&mut c, &kv(root, get("secret/a/k0")), 2_000, 404, None).unwrap_err();
    assert_eq!(e.invariant, "durability");
    see(
        &mut c,
        &kv(root, get("secret/a/k0")),
        2_000,
        200,
        Some(json!({"data": {"v": 1}})),
    )
    .unwrap();
}

/// A checker that saw root put `{"w": true}` at `secret/a/k1` and read it wrapped for 30 s
/// (the wrapping token `cs.wrap0000000000000000000`), both at 1 s; the wrapped read.
fn wrapped_k1() -> (Checker, Op) {
    let mut c = ready();
    let put = kv(
        ROOT,
        KvOp::Put {
            key: "secret/a/k1".into(),
            value: json!({"w": true}),
        },
    );
    see(&mut c, &put, 1_000, 204, None).unwrap();
    let wrap_get = kv(
        ROOT,
        KvOp::Get {
            key: "secret/a/k1".into(),
            wrap: Some(("30s".into(), 30)),
        },
    );
    let wrapped = json!({"data": null, "wrap_info": {"token": "cs.wrap0000000000000000000"}});
    see(&mut c, &wrap_get, 1_000, 200, Some(wrapped)).unwrap();
    (c, wrap_get)
}

#[test]
fn wrapping_tokens_unwrap_once_and_expire() {
    let (mut c, wrap_get) = wrapped_k1();
    let unwrap = Op::Unwrap {
        wrap: tok("w1", "cs.wrap0000000000000000000"),
        in_body: false,
    };
    let e = see(
        &mut c,
        &unwrap,
        2_000,
        200,
        Some(json!({"data": {"w": false}})),
    )
    .unwrap_err();
    assert_eq!(e.invariant, "wrapping");
    see(
        &mut c,
        &unwrap,
        2_000,
        200,
        Some(json!({"data": {"w": true}})),
    )
    .unwrap();
    let e = see(
        &mut c,
        &unwrap,
        3_000,
        200,
        Some(json!({"data": {"w": true}})),
    )
    .unwrap_err();
    assert_eq!(e.invariant, "single-use-wrapping");
    // A second wrap that expires unused.
    let wrapped = json!({"data": null, "wrap_info": {"token": "cs.wrap1111111111111111111"}});
    see(&mut c, &wrap_get, 4_000, 200, Some(wrapped)).unwrap();
    let late = Op::Unwrap {
        wrap: tok("w2", "cs.wrap1111111111111111111"),
        in_body: true,
    };
    let e = see(
        &mut c,
        &late,
        34_000,
        200,
        Some(json!({"data": {"w": true}})),
    )
    .unwrap_err();
    assert_eq!(e.invariant, "wrapping-ttl");
}

/// A checker that saw root create a token of `team-a` with `uses` uses; the token.
fn use_limited_token(uses: u64) -> (Checker, &'static str) {
    let mut c = ready();
    let create = Op::TokenCreate {
        tok: tok("root", ROOT),
        policies: vec!["team-a".into()],
        ttl_s: 100,
        ttl_as_string: false,
        num_uses: uses,
        wrap: None,
    };
    let t2 = "cs.t2000000000000000000000";
    let body = json!({"auth": {"client_token": t2, "lease_duration": 100,
        "policies": ["default", "team-a"], "num_uses": uses}});
    see(&mut c, &create, 0, 200, Some(body)).unwrap();
    (c, t2)
}

#[test]
fn use_limited_tokens_spend_uses_on_failed_requests() {
    let (mut c, t2) = use_limited_token(1);
    // The only use: a read of a missing key.
    see(&mut c, &kv(t2, get("secret/a/k2")), 1_000, 404, None).unwrap();
    let e = see(&mut c, &kv(t2, get("secret/a/k2")), 1_000, 404, None).unwrap_err();
    assert_eq!(e.invariant, "token-use-limit");
}

/// A request its policies refuse spends a use too (the reference counts it): with two
/// uses, one refusal and one read leave none.
#[test]
fn use_limited_tokens_spend_uses_on_refused_requests() {
    let (mut c, t2) = use_limited_token(2);
    see(&mut c, &kv(t2, get("secret/b/k0")), 1_000, 403, None).unwrap();
    see(&mut c, &kv(t2, get("secret/a/k2")), 1_000, 404, None).unwrap();
    let e = see(&mut c, &kv(t2, get("secret/a/k2")), 1_000, 404, None).unwrap_err();
    assert_eq!(e.invariant, "token-use-limit");
    // A request with a dead token spends nothing (and changes nothing).
    see(&mut c, &kv(t2, get("secret/b/k0")), 1_000, 403, None).unwrap();
}

/// A response-wrapping token has one use: presented as a client token (refused), it is
/// spent and must not unwrap afterwards.
#[test]
fn a_wrapping_token_tried_as_a_client_token_is_spent() {
    let (mut c, _) = wrapped_k1();
    let w = "cs.wrap0000000000000000000";
    // Tried as a client token: refused, and its one use is gone.
    see(&mut c, &kv(w, get("secret/a/k1")), 1_500, 403, None).unwrap();
    let unwrap = Op::Unwrap {
        wrap: tok("w1", w),
        in_body: true,
    };
    let e = see(
        &mut c,
        &unwrap,
        2_000,
        200,
        Some(json!({"data": {"w": true}})),
    )
    .unwrap_err();
    assert_eq!(e.invariant, "single-use-wrapping");
    assert!(e.detail.contains("client token"), "{}", e.detail);
    see(&mut c, &unwrap, 2_000, 400, None).unwrap();
}

#[test]
fn tenant_probes_are_refused_and_reveal_nothing() {
    let mut c = ready();
    let root = tok("root", ROOT);
    let tt = "cs.tenant00000000000000000";
    let setup = |step| Op::TenantSetup {
        tok: root.clone(),
        step,
    };
    see(
        &mut c,
        &setup(TenantStep::Namespace),
        0,
        200,
        Some(json!({})),
    )
    .unwrap();
    see(&mut c, &setup(TenantStep::Policy), 0, 204, None).unwrap();
    // The tenant token must carry the tenant's policy.
    let wrong =
        json!({"auth": {"client_token": tt, "policies": ["default"], "lease_duration": 60}});
    let e = see(&mut c, &setup(TenantStep::Token), 0, 200, Some(wrong)).unwrap_err();
    assert_eq!(e.invariant, "token-policies");
    let body = json!({"auth": {"client_token": tt, "policies": ["admin", "default"], "lease_duration": 60}});
    see(&mut c, &setup(TenantStep::Token), 0, 200, Some(body)).unwrap();
    assert_eq!(c.expected(0).tenant_tokens.get(tt), Some(&Some(60_000)));
    let put = kv(
        ROOT,
        KvOp::Put {
            key: "secret/a/k0".into(),
            value: json!({"v": "value-a0"}),
        },
    );
    see(&mut c, &put, 1_000, 204, None).unwrap();
    let probe = |reach: TenantReach| Op::TenantProbe {
        tok: tok("tenant", tt),
        reach,
    };
    let seal = probe(TenantReach::new(Method::Put, "sys/seal", true));
    see(
        &mut c,
        &seal,
        1_000,
        400,
        Some(json!({"errors": ["root namespace"]})),
    )
    .unwrap();
    let e = see(&mut c, &seal, 1_000, 204, None).unwrap_err();
    assert_eq!(e.invariant, "tenant-isolation");
    // Refused, but the answer carries the root token or a stored value.
    let lookup =
        probe(TenantReach::new(Method::Post, "auth/token/lookup", true).naming(&root, json!({})));
    assert!(!lookup.describe().contains(ROOT), "{}", lookup.describe());
    let e = see(&mut c, &lookup, 1_000, 400, Some(json!({"errors": [ROOT]}))).unwrap_err();
    assert_eq!(e.invariant, "tenant-isolation");
    assert!(e.detail.contains("root token"), "{}", e.detail);
    let read = probe(TenantReach::new(Method::Get, "secret/a/k0", true));
    see(&mut c, &read, 1_000, 404, Some(json!({"errors": []}))).unwrap();
    let e = see(
        &mut c,
        &read,
        1_000,
        404,
        Some(json!({"data": {"v": "value-a0"}})),
    )
    .unwrap_err();
    assert_eq!(e.invariant, "tenant-isolation");
    assert!(e.detail.contains("secret/a/k0"), "{}", e.detail);
    // A sealed node's 503 is a refusal; a `..` path is refused with 400 even then.
    c.on_crash(0);
    see(
        &mut c,
        &read,
        2_000,
        503,
        Some(json!({"errors": ["sealed"]})),
    )
    .unwrap();
    let dots = probe(TenantReach {
        malformed: true,
        ..TenantReach::new(Method::Get, "../secret/top0", true)
    });
    see(&mut c, &dots, 2_000, 400, None).unwrap();
    let unseal = Op::Unseal { key: "00".into() };
    see(
        &mut c,
        &unseal,
        2_000,
        200,
        Some(json!({"sealed": false, "progress": 0})),
    )
    .unwrap();
    // The revoke of the root token from the tenant is a no-op: 204 passes, and a root
    // token that stopped working afterwards is caught.
    let revoke = probe(TenantReach {
        noop: true,
        ..TenantReach::new(Method::Post, "auth/token/revoke", true).naming(&root, json!({}))
    });
    see(&mut c, &revoke, 3_000, 204, None).unwrap();
    let e = see(&mut c, &kv(ROOT, get("secret/a/k0")), 3_000, 403, None).unwrap_err();
    assert_eq!(e.invariant, "authorized-succeeds");
    assert!(c.counts()["tenant-isolation"] >= 8);
}

#[test]
fn unseal_follows_the_threshold() {
    let mut c = Checker::new(1);
    let init = Op::Init {
        shares: 3,
        threshold: 2,
    };
    let body = json!({"keys": ["0a", "0b", "0c"], "keys_base64": ["Cg==", "Cw==", "DA=="], "root_token": ROOT});
    see(&mut c, &init, 0, 200, Some(body)).unwrap();
    let u = |k: &str| Op::Unseal { key: k.into() };
    see(
        &mut c,
        &u("0a"),
        0,
        200,
        Some(json!({"sealed": true, "progress": 1})),
    )
    .unwrap();
    // The same share again (base64 form) does not count twice.
    let e = see(
        &mut c,
        &u("Cg=="),
        0,
        200,
        Some(json!({"sealed": false, "progress": 0})),
    )
    .unwrap_err();
    assert_eq!(e.invariant, "unseal-threshold");
    let mut c2 = Checker::new(1);
    let body = json!({"keys": ["0a", "0b", "0c"], "keys_base64": [], "root_token": ROOT});
    see(&mut c2, &init, 0, 200, Some(body)).unwrap();
    see(
        &mut c2,
        &u("0a"),
        0,
        200,
        Some(json!({"sealed": true, "progress": 1})),
    )
    .unwrap();
    // A wrong share at the threshold must not unseal.
    let e = see(
        &mut c2,
        &u("ffff"),
        0,
        200,
        Some(json!({"sealed": false, "progress": 0})),
    )
    .unwrap_err();
    assert_eq!(e.invariant, "unseal-threshold");
}
