//! Tests of the isolation model: the promises hold over the vocabulary and random
//! sequences, and planted breaches are reported at the request that made them.
use super::*;
use quickcheck::{QuickCheck, TestResult};

#[test]
fn every_vocabulary_request_without_a_token_changes_nothing() {
    let mut w = World::new();
    for path in 0..PATHS.len() {
        for m in 0..5u8 {
            for body in [0u8, 1, 5, 6, 12] {
                for ns in 0..NAMESPACES.len() {
                    let op = Op {
                        method: m,
                        path: path as u8,
                        body,
                        namespace: ns as u8,
                    };
                    for garbage in [false, true] {
                        if let Err(e) = w.unauthenticated(op, garbage) {
                            panic!("{e}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn every_tenant_request_of_the_vocabulary_stays_inside_its_namespace() {
    for path in 0..PATHS.len() {
        for m in 0..5u8 {
            let mut w = World::new();
            let ops: Vec<Op> = (0..BODIES.len() * NAMESPACES.len())
                .map(|i| Op {
                    method: m,
                    path: path as u8,
                    body: (i / NAMESPACES.len()) as u8,
                    namespace: (i % NAMESPACES.len()) as u8,
                })
                .collect();
            if let Err(e) = w.tenant_checked(&ops, Compare::AtEnd) {
                panic!("{e}");
            }
        }
    }
}

#[test]
fn quickcheck_tenant_sequences_stay_inside_their_namespace() {
    fn prop(ops: Vec<(u8, u8, u8, u8)>) -> TestResult {
        let ops: Vec<Op> = ops
            .into_iter()
            .take(20)
            .map(|(a, b, c, d)| Op::from_bytes([a, b, c, d]))
            .collect();
        match World::fresh().tenant(&ops) {
            Ok(()) => TestResult::passed(),
            Err(e) => TestResult::error(e),
        }
    }
    QuickCheck::new()
        .tests(60)
        .quickcheck(prop as fn(Vec<(u8, u8, u8, u8)>) -> TestResult);
}

#[test]
fn quickcheck_unauthenticated_sequences_change_nothing() {
    fn prop(ops: Vec<(u8, u8, u8, u8, bool)>) -> TestResult {
        let mut w = World::fresh();
        for (a, b, c, d, g) in ops.into_iter().take(20) {
            if let Err(e) = w.unauthenticated(Op::from_bytes([a, b, c, d]), g) {
                return TestResult::error(e);
            }
        }
        TestResult::passed()
    }
    QuickCheck::new()
        .tests(60)
        .quickcheck(prop as fn(Vec<(u8, u8, u8, u8, bool)>) -> TestResult);
}

#[test]
fn quickcheck_a_refused_request_leaves_storage_byte_identical() {
    fn prop(ops: Vec<(u8, u8, u8, u8, u8, u8)>) -> TestResult {
        let mut w = World::fresh();
        for (a, b, c, d, who, wrap) in ops.into_iter().take(25) {
            if let Err(e) = w.refused_changes_nothing(Op::from_bytes([a, b, c, d]), who, wrap) {
                return TestResult::error(e);
            }
        }
        TestResult::passed()
    }
    QuickCheck::new()
        .tests(60)
        .quickcheck(prop as fn(Vec<(u8, u8, u8, u8, u8, u8)>) -> TestResult);
}

fn op(method: Method, path: &str, namespace: Option<&str>) -> Op {
    let at = |n: usize| u8::try_from(n).unwrap();
    Op {
        method: at([
            Method::Get,
            Method::List,
            Method::Put,
            Method::Post,
            Method::Delete,
        ]
        .iter()
        .position(|m| *m == method)
        .unwrap()),
        path: at(PATHS.iter().position(|p| *p == path).unwrap()),
        body: 0,
        namespace: at(NAMESPACES.iter().position(|n| *n == namespace).unwrap()),
    }
}

/// The tenant check can fail, and says at which request: a planted breach (the tenant
/// holds the root token, and its second request deletes the root namespace's secret) is
/// reported at that request when comparing after every request or after every write
/// (what the fuzz target does), and at the last one when comparing once at the end.
#[test]
fn a_planted_breach_by_the_tenant_is_caught_at_its_request() {
    let ops = [
        op(Method::Get, "kv/s", Some("a")),
        op(Method::Delete, "secret/r", None),
        op(Method::Get, "kv/s", Some("a")),
        op(Method::List, "kv/", Some("a")),
    ];
    for (when, at) in [
        (Compare::EveryRequest, "op 1:"),
        (Compare::AfterWrites, "op 1:"),
        (Compare::OutsideChanges, "op 1:"),
        (Compare::AtEnd, "op 3:"),
    ] {
        let mut w = World::new();
        assert_eq!(
            w.tenant_checked(&ops, when),
            Ok(()),
            "{when:?} without the plant"
        );
        let mut w = World::new();
        w.a = ROOT.to_string();
        let e = w.tenant_checked(&ops, when).unwrap_err();
        assert!(e.starts_with(at) && e.contains("secret/r"), "{when:?}: {e}");
    }
}

/// `OutsideChanges` reads the outside only after a change outside `a/`: not after the
/// tenant's writes to its own secrets, nor at the end of a sequence of them, but after a
/// write of a key of the root namespace, which it then reports at that request.
#[test]
fn the_outside_is_read_only_after_a_change_outside_a() {
    let put = |path: &str, ns: Option<&str>| Op {
        method: 2,
        body: 13,
        ..op(Method::Put, path, ns)
    };
    let own = [
        put("kv/s", Some("a")),
        put("kv/s", Some("a/c")),
        op(Method::Get, "kv/s", Some("a")),
        put("a/kv/s", None),
    ];
    let mut w = World::new();
    let before = w.outside();
    w.probes = 0;
    assert_eq!(
        w.tenant_against(&own, &before, Compare::OutsideChanges),
        Ok(())
    );
    assert_eq!(w.probes, 0, "nothing outside changed: not read at all");
    let mut w = World::new();
    w.probes = 0;
    assert_eq!(
        w.tenant_against(&own, &before, Compare::AfterWrites),
        Ok(())
    );
    assert_eq!(
        w.probes, 3,
        "after each of the three writes (the last is the end)"
    );
    // The tenant creating a token of its own writes the shared token store: read once.
    let token = [
        put("kv/s", Some("a")),
        op(Method::Post, "auth/token/create", Some("a")),
        op(Method::Get, "kv/s", Some("a")),
    ];
    let mut w = World::new();
    w.probes = 0;
    assert_eq!(
        w.tenant_against(&token, &before, Compare::OutsideChanges),
        Ok(())
    );
    assert_eq!(w.probes, 1, "after the token's creation only");
    // The same with the root token planted: its write of the root namespace's secret
    // (second request) is outside `a/`.
    let breach = [
        put("kv/s", Some("a")),
        put("secret/r", None),
        put("kv/s", Some("a")),
        op(Method::Get, "kv/s", Some("a")),
    ];
    let mut w = World::new();
    w.a = ROOT.to_string();
    w.probes = 0;
    let e = w
        .tenant_against(&breach, &before, Compare::OutsideChanges)
        .unwrap_err();
    assert!(e.starts_with("op 1:") && e.contains("secret/r"), "{e}");
    assert_eq!(w.probes, 1);
}

/// A breach that changes only in-memory state the probes read (no storage write: an
/// unseal key share counted, as if a request had fed the unseal flow) is reported at
/// the request that made it, in the middle of a sequence and at its last request, by
/// every mode but `AtEnd` (which reports it at the end); and a sequence that changes
/// nothing outside is not read even once.
#[test]
fn a_planted_in_memory_breach_is_caught_at_its_request() {
    let ops = [
        op(Method::Get, "kv/s", Some("a")),
        op(Method::Get, "kv/s", Some("a")),
        op(Method::List, "kv/", Some("a")),
    ];
    fn share(n: &mut Node<CowStorage>) {
        n.state_mut_for_tests().unseal_progress.add(vec![7; 33]);
    }
    for at in [1, 2] {
        for (when, reported) in [
            (Compare::EveryRequest, at),
            // No request writes: `AfterWrites` reads the outside at the end only.
            (Compare::AfterWrites, 2),
            (Compare::OutsideChanges, at),
            (Compare::AtEnd, 2),
        ] {
            let mut w = World::new();
            w.plant = Some((at, share));
            let e = w.tenant_checked(&ops, when).unwrap_err();
            assert!(
                e.starts_with(&format!("op {reported}:")) && e.contains("sys/seal-status"),
                "{when:?}, planted at {at}: {e}"
            );
        }
    }
    let mut w = World::new();
    let before = w.outside();
    w.probes = 0;
    assert_eq!(
        w.tenant_against(&ops, &before, Compare::OutsideChanges),
        Ok(())
    );
    assert_eq!(w.probes, 0);
    // Each piece of the in-memory view is seen.
    let w = World::new();
    let mut v = w.clone();
    share(&mut v.node);
    assert_ne!(w.memory_view(), v.memory_view(), "unseal progress");
    let mut v = w.clone();
    v.node.audit_device_failed(2_000, "/tmp/x.log", "disk full");
    assert_ne!(w.memory_view(), v.memory_view(), "audit health");
    let mut v = w.clone();
    v.node.state_mut_for_tests().repl.perf.role.role = crate::replication::state::Role::Primary;
    assert_eq!(v.memory_view(), None, "replication enabled: compare always");
}

/// The key classification of `OutsideChanges`: the tenant's own mounts, policies and
/// child namespaces are inside, the root namespace's and `b/`'s data, the token store,
/// the mount table and `a/`'s own record are not.
#[test]
fn what_lies_inside_a_by_storage_key() {
    let w = World::new();
    for k in [
        format!("{}r", w.inside[0]),
        format!("{}s", w.inside[1]),
        "sys/ns-policy/a/admin".to_string(),
        "sys/ns-policy/a/c/p".to_string(),
        "core/namespace/a/c/".to_string(),
        format!("{}1", wal::ENTRY),
    ] {
        assert!(w.inside(&k), "{k}");
    }
    let storage = w.node.storage().to_map();
    let outside: Vec<&String> = storage.keys().filter(|k| !w.inside(k)).collect();
    for k in [
        "core/namespace/a/",
        "core/namespace/b/",
        "sys/ns-policy/b/admin",
        "sys/ns-policy/ab/x",
        "sys/token/salt",
    ] {
        assert!(!w.inside(k), "{k}");
    }
    // Every kv mount's data but the two of `a/` lies outside: the root's secret and
    // `b/`'s are among the stored keys.
    let data: Vec<&&String> = outside
        .iter()
        .filter(|k| k.starts_with("logical/"))
        .collect();
    assert!(data.len() >= 2, "{data:?}");
}

/// The checks can fail: a planted breach (the root token revoked from outside) is seen.
#[test]
fn a_planted_breach_is_caught() {
    let mut w = World::new();
    let before = w.outside();
    w.call(
        Some(ROOT),
        None,
        Method::Post,
        "auth/token/revoke-self",
        None,
    );
    assert_ne!(before, w.outside());
}

/// The fuzz target's memo ([`Checked`]): a state is read once (a second input with the same
/// first requests reads nothing again), two copies sent the same requests end in the same
/// state (what the memo rests on), and a breach after a checked state is still reported at
/// its request.
#[test]
fn the_fuzz_target_reads_each_state_once_and_still_catches_a_breach() {
    let bytes = |ops: &[Op]| -> Vec<u8> {
        ops.iter()
            .flat_map(|o| [o.method, o.path, o.body, o.namespace])
            .collect()
    };
    let create = op(Method::Post, "auth/token/create", Some("a"));
    let ops = [create, op(Method::Get, "kv/s", Some("a")), create];
    let data = bytes(&ops);
    let mut proto = World::new();
    let before = proto.outside();
    let mut checked = Checked::default();
    let mut w = proto.clone();
    assert_eq!(
        w.tenant_run(
            &ops,
            &before,
            Compare::OutsideChanges,
            Some((&data, &mut checked))
        ),
        Ok(())
    );
    assert_eq!(checked.states.len(), 2, "after each token creation");
    assert_eq!(checked.skipped, 0);
    assert_eq!(
        w.probes, proto.probes,
        "read on a copy, not on the world itself"
    );
    let mut again = proto.clone();
    assert_eq!(
        again.tenant_run(
            &ops,
            &before,
            Compare::OutsideChanges,
            Some((&data, &mut checked))
        ),
        Ok(())
    );
    assert_eq!((checked.states.len(), checked.skipped), (2, 2));
    // The same requests, the same state: storage and the in-memory view.
    assert_eq!(w.node.storage().to_map(), again.node.storage().to_map());
    assert_eq!(w.memory_view(), again.memory_view());
    assert!(w.memory_view().is_some());

    // A breach (the root token planted: its delete of the root namespace's secret) after a
    // state the memo holds is reported at its request.
    let mut root = proto.clone();
    root.a = ROOT.to_string();
    let first = [create];
    let mut checked = Checked::default();
    assert_eq!(
        root.clone().tenant_run(
            &first,
            &before,
            Compare::OutsideChanges,
            Some((&bytes(&first), &mut checked))
        ),
        Ok(())
    );
    assert_eq!(checked.states.len(), 1);
    let breach = [create, op(Method::Delete, "secret/r", None)];
    let e = root
        .tenant_run(
            &breach,
            &before,
            Compare::OutsideChanges,
            Some((&bytes(&breach), &mut checked)),
        )
        .unwrap_err();
    assert!(e.starts_with("op 1:") && e.contains("secret/r"), "{e}");
    assert_eq!(
        checked.skipped, 1,
        "the token creation's state was read before"
    );
}
