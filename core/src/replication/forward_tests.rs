//! Requests a performance secondary forwards to its primary, on the in-memory network.

use super::*;

/// A primary (0) and its performance secondary (1), caught up, with a token on the
/// secondary whose policy allows `secret/team/*` only.
fn pair() -> (Net, String, String) {
    let (mut net, roots) = Net::new(2);
    let r0 = roots[0].clone();
    net.enable_primary(0, &r0, "performance");
    let pol = r#"
        path "secret/team/*" { capabilities = ["create", "read", "update", "list"] }
        path "auth/token/create" { capabilities = ["update"] }
    "#;
    net.ok(
        0,
        &r0,
        Method::Put,
        "sys/policies/acl/team",
        json!({ "policy": pol }),
    );
    net.activate(0, &r0, 1, &roots[1], "performance", "perf1");
    net.run_for(2_000);
    let t1 = generate_root(&mut net, 1, 0);
    let team = net.ok(
        1,
        &t1,
        Method::Post,
        "auth/token/create",
        json!({"policies": ["team"]}),
    )["auth"]["client_token"]
        .as_str()
        .unwrap()
        .to_string();
    (net, r0, team)
}

fn forwards(net: &Net) -> usize {
    net.ops.get("forward").copied().unwrap_or(0)
}

#[test]
fn a_write_on_a_perf_secondary_is_applied_by_the_primary_and_replicates_back() {
    let (mut net, r0, team) = pair();
    let wal = net.nodes[0].replication().wal.last;
    let w = net.call(1, &team, Method::Put, "secret/team/a", json!({"v": "one"}));
    assert_eq!(w.status, 204, "{:?}", w.body);
    assert_eq!(forwards(&net), 1);
    // The primary applied it (one more WAL entry) and answered with its index state.
    assert!(net.nodes[0].replication().wal.last > wal);
    let state = w.index.clone().expect("the primary's X-Vault-Index");
    let st = index_state::IndexState::decode(&state).unwrap();
    assert_eq!(st.index, net.nodes[0].replication().wal.last);
    let on_primary = net.ok(0, &r0, Method::Get, "secret/team/a", json!({}));
    assert_eq!(on_primary["data"]["v"], "one");
    // Back on the secondary by replication; with the index state, never a stale read.
    net.next_id += 1;
    let mut req = Request::new(net.next_id, Method::Get, "secret/team/a").with_token(&team);
    req.index = Some(state);
    let r = net.send(1, req);
    assert!(r.status == 200 || r.status == 412, "{r:?}");
    net.run_for(2_000);
    let r = net.ok(1, &team, Method::Get, "secret/team/a", json!({}));
    assert_eq!(r["data"]["v"], "one");
    // A secondary's own tokens stay its own: token writes are not forwarded.
    net.ok(
        1,
        &team,
        Method::Post,
        "auth/token/create",
        json!({"policies": ["team"]}),
    );
    assert_eq!(forwards(&net), 1);
}

#[test]
fn a_forbidden_write_is_refused_by_the_secondary_and_never_forwarded() {
    let (mut net, r0, team) = pair();
    let wal = net.nodes[0].replication().wal.last;
    let r = net.call(1, &team, Method::Put, "secret/other", json!({"v": 1}));
    assert_eq!(r.status, 403, "{:?}", r.body);
    let r = net.call(
        1,
        &team,
        Method::Put,
        "sys/policies/acl/x",
        json!({"policy": ""}),
    );
    assert_eq!(r.status, 403, "{:?}", r.body);
    assert_eq!(forwards(&net), 0);
    assert_eq!(net.nodes[0].replication().wal.last, wal);
    assert_eq!(
        net.call(0, &r0, Method::Get, "secret/other", json!({}))
            .status,
        404
    );
}

#[test]
fn with_the_primary_unreachable_a_write_is_a_502_naming_it_and_nothing_is_applied() {
    let (mut net, r0, team) = pair();
    let before = net.data_keys(1, "logical/");
    net.down.insert(0);
    let r = net.call(1, &team, Method::Put, "secret/team/lost", json!({"v": 1}));
    assert_eq!(r.status, 502, "{:?}", r.body);
    let msg = r.body.unwrap().to_string();
    assert!(msg.contains("cluster0") && msg.contains("nothing"), "{msg}");
    assert!(net.data_keys(1, "logical/") == before, "applied locally");
    net.down.clear();
    net.run_for(2_000);
    assert_eq!(
        net.call(0, &r0, Method::Get, "secret/team/lost", json!({}))
            .status,
        404,
        "the primary never got it"
    );
}

#[test]
fn a_primary_serves_only_registered_secondaries_and_only_replicated_routes() {
    let (mut net, r0, _team) = pair();
    let creds = net.nodes[1]
        .replication()
        .mode(Mode::Performance)
        .role
        .creds
        .clone()
        .unwrap();
    let forged = |net: &mut Net, secret: &str, path: &str| {
        let auth = msg::PeerAuth {
            secondary_id: creds.secondary_id.clone(),
            secret: secret.to_string(),
            primary_cluster_id: creds.primary_cluster_id.clone(),
            cluster_id: String::new(),
            node_id: "n1".into(),
            api_addr: String::new(),
            cluster_addr: String::new(),
            version: String::new(),
        };
        let req = Request::new(0, Method::Post, path).with_json(json!({"policies": ["root"]}));
        let caller = super::forward::OnBehalf {
            policies: vec!["root".into()],
            ..Default::default()
        };
        net.next_id += 1;
        let id = net.next_id;
        net.nodes[0].handle(
            net.now,
            Input::PeerRequest(PeerRequest {
                id,
                msg: PeerMsg {
                    mode: Mode::Performance,
                    auth,
                    body: PeerBody::Forward {
                        req: Box::new(super::forward::ForwardedRequest::of(&req, caller)),
                    },
                },
            }),
        );
        let out: Vec<Output> = std::iter::from_fn(|| net.nodes[0].poll_output()).collect();
        out.into_iter()
            .find_map(|o| match o {
                Output::PeerResponse(r) if r.id == id => Some(r.msg),
                _ => None,
            })
            .expect("an answer")
    };
    // A wrong secret: refused as an unknown secondary.
    match forged(&mut net, "wrong", "secret/x") {
        PeerAnswer::Error { code, .. } => assert_eq!(code, "unknown-secondary"),
        a => panic!("{a:?}"),
    }
    // Tokens are no replicated data: the route is refused (403) with nothing applied.
    let wal = net.nodes[0].replication().wal.last;
    match forged(&mut net, &creds.secret, "auth/token/create") {
        PeerAnswer::Forwarded { status, .. } => assert_eq!(status, 403),
        a => panic!("{a:?}"),
    }
    assert_eq!(net.nodes[0].replication().wal.last, wal);
    // A revoked secondary is refused.
    net.ok(
        0,
        &r0,
        Method::Post,
        "sys/replication/performance/primary/revoke-secondary",
        json!({"id": "perf1"}),
    );
    match forged(&mut net, &creds.secret, "secret/x") {
        PeerAnswer::Error { code, .. } => assert_eq!(code, "unknown-secondary"),
        a => panic!("{a:?}"),
    }
}

#[test]
fn x_vault_inconsistent_sends_a_lagging_read_to_the_primary_instead_of_412() {
    let (mut net, r0, team) = pair();
    net.down.insert(1);
    let w = net.call(0, &r0, Method::Put, "secret/team/new", json!({"v": 2}));
    let state = w.index.clone().expect("index");
    let get = |net: &mut Net, inconsistent: bool| {
        net.next_id += 1;
        let mut req = Request::new(net.next_id, Method::Get, "secret/team/new").with_token(&team);
        req.index = Some(state.clone());
        req.forward_inconsistent = inconsistent;
        net.send(1, req)
    };
    assert_eq!(get(&mut net, false).status, 412);
    // Reachable again but not caught up yet (its next pull waits for its back-off).
    net.down.clear();
    let r = get(&mut net, true);
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body.unwrap()["data"]["v"], 2);
    assert_eq!(forwards(&net), 1);
    // A token the policy does not allow there is refused by the secondary, not forwarded.
    net.next_id += 1;
    let mut req = Request::new(net.next_id, Method::Get, "secret/elsewhere").with_token(&team);
    req.index = Some(state.clone());
    req.forward_inconsistent = true;
    assert_eq!(net.send(1, req).status, 403);
    assert_eq!(forwards(&net), 1);
}

/// A secondary's caller reads through a forward only what replication gives its cluster:
/// a `local` mount of the primary and a mount its paths filter leaves out stay out of reach
/// (they were readable with `X-Vault-Inconsistent: forward-active-node` and a lagging
/// `X-Vault-Index`, and writable into the filtered mount by a plain write).
#[test]
fn a_forward_never_reaches_a_local_or_filtered_out_mount_of_the_primary() {
    let (mut net, roots) = Net::new(2);
    let r0 = roots[0].clone();
    net.enable_primary(0, &r0, "performance");
    for (path, local) in [("lsec", true), ("private", false)] {
        net.ok(
            0,
            &r0,
            Method::Post,
            &format!("sys/mounts/{path}"),
            json!({"type": "kv", "local": local}),
        );
    }
    net.ok(0, &r0, Method::Put, "lsec/a", json!({"v": "primary-local"}));
    net.ok(
        0,
        &r0,
        Method::Put,
        "private/a",
        json!({"v": "filtered-out"}),
    );
    net.ok(0, &r0, Method::Put, "secret/a", json!({"v": "shared"}));
    net.activate(0, &r0, 1, &roots[1], "performance", "perf1");
    net.ok(
        0,
        &r0,
        Method::Post,
        "sys/replication/performance/primary/paths-filter/perf1",
        json!({"mode": "deny", "paths": ["private/"]}),
    );
    net.run_for(3_000);
    let t1 = generate_root(&mut net, 1, 0);
    // A state of the primary the secondary has not reached: the read goes to the primary.
    let lagging = lagging_index(&net);
    let get = |net: &mut Net, path: &str| {
        net.next_id += 1;
        let mut req = Request::new(net.next_id, Method::Get, path).with_token(&t1);
        req.index = Some(lagging.clone());
        req.forward_inconsistent = true;
        net.send(1, req)
    };
    let shared = get(&mut net, "secret/a");
    assert_eq!(shared.status, 200, "{:?}", shared.body);
    assert_eq!(forwards(&net), 1);
    for path in ["lsec/a", "private/a"] {
        let r = get(&mut net, path);
        let body = r.body.clone().unwrap_or_default().to_string();
        assert_eq!(r.status, 403, "{path}: {body}");
        assert!(
            !body.contains("primary-local") && !body.contains("filtered-out"),
            "{path}: {body}"
        );
    }
    // A write into the filtered-out mount is refused by the primary, nothing applied.
    let wal = net.nodes[0].replication().wal.last;
    let w = net.call(
        1,
        &t1,
        Method::Put,
        "private/b",
        json!({"v": "from-secondary"}),
    );
    assert_eq!(w.status, 403, "{:?}", w.body);
    assert_eq!(net.nodes[0].replication().wal.last, wal);
    assert_eq!(
        net.call(0, &r0, Method::Get, "private/b", json!({})).status,
        404
    );
}

/// A client that asks for a response-wrapped answer never gets the secret in the clear: a
/// lagging read with `X-Vault-Inconsistent: forward-active-node` is not forwarded when it
/// also carries `X-Vault-Wrap-TTL` (the primary's answer could not be wrapped here), as a
/// forwarded write is not.
#[test]
fn a_lagging_read_asking_for_a_wrapped_answer_is_not_forwarded_unwrapped() {
    let (mut net, r0, team) = pair();
    net.down.insert(1);
    let w = net.call(
        0,
        &r0,
        Method::Put,
        "secret/team/new",
        json!({"v": "s3cr3t"}),
    );
    let state = w.index.clone().expect("index");
    net.down.clear();
    net.next_id += 1;
    let mut req = Request::new(net.next_id, Method::Get, "secret/team/new").with_token(&team);
    req.index = Some(state);
    req.forward_inconsistent = true;
    req.wrap_ttl = Some("60s".into());
    let r = net.send(1, req);
    let body = r.body.clone().unwrap_or_default().to_string();
    assert!(!body.contains("s3cr3t"), "{body}");
    assert_eq!(r.status, 400, "{body}");
    assert_eq!(forwards(&net), 0);
}

/// A mount the secondary's paths filter leaves out is the primary's alone through the
/// `sys/` routes too: a secondary's root token can neither unmount it, nor rewrite its data
/// with a tune, nor purge the namespace that holds it through a forward (each deleted or
/// rewrote on the primary the data that replication keeps away from the secondary).
#[test]
fn a_forward_never_unmounts_tunes_or_purges_what_the_filter_leaves_out() {
    let (mut net, roots) = Net::new(2);
    let r0 = roots[0].clone();
    net.enable_primary(0, &r0, "performance");
    net.ok(0, &r0, Method::Post, "sys/namespaces/hidden", json!({}));
    for (ns, path) in [(None, "private"), (None, "empty"), (Some("hidden"), "kv")] {
        net.next_id += 1;
        let mut req = Request::new(net.next_id, Method::Post, &format!("sys/mounts/{path}"))
            .with_token(&r0)
            .with_json(json!({"type": "kv"}));
        req.namespace = ns.map(String::from);
        assert_eq!(net.send(0, req).status, 204);
    }
    net.ok(
        0,
        &r0,
        Method::Put,
        "private/a",
        json!({"v": "filtered-out"}),
    );
    net.ok(
        0,
        &r0,
        Method::Put,
        "hidden/kv/a",
        json!({"v": "filtered-ns"}),
    );
    net.activate(0, &r0, 1, &roots[1], "performance", "perf1");
    net.ok(
        0,
        &r0,
        Method::Post,
        "sys/replication/performance/primary/paths-filter/perf1",
        json!({"mode": "deny", "paths": ["private/", "empty/", "hidden/"]}),
    );
    net.run_for(3_000);
    let t1 = generate_root(&mut net, 1, 0);
    let wal = net.nodes[0].replication().wal.last;
    for (method, path, body) in [
        // Only the mount table changes: the mount itself is refused.
        (
            Method::Post,
            "sys/mounts/private/tune",
            json!({"description": "renamed by a secondary"}),
        ),
        (Method::Delete, "sys/mounts/empty", json!({})),
        (Method::Delete, "sys/mounts/private", json!({})),
        (
            Method::Post,
            "sys/mounts/private/tune",
            json!({"options": {"version": "2"}}),
        ),
        (Method::Delete, "sys/namespaces/hidden", json!({})),
    ] {
        let r = net.call(1, &t1, method, path, body);
        let msg = r.body.clone().unwrap_or_default().to_string();
        assert_eq!(r.status, 403, "{path}: {msg}");
        assert!(msg.contains("paths filter"), "{path}: {msg}");
    }
    assert_eq!(net.nodes[0].replication().wal.last, wal, "nothing applied");
    let kept = net.ok(0, &r0, Method::Get, "private/a", json!({}));
    assert_eq!(kept["data"]["v"], "filtered-out");
    let kept = net.ok(0, &r0, Method::Get, "hidden/kv/a", json!({}));
    assert_eq!(kept["data"]["v"], "filtered-ns");
    let mounts = net.ok(0, &r0, Method::Get, "sys/mounts", json!({}));
    assert!(mounts["data"].get("empty/").is_some());
}

/// A limited-use token spends a use on a write it was checked for even when the secondary
/// refuses to forward it because it asks for a wrapped answer (the use was dropped with
/// the write set, so the token could be tried again and again at no cost).
#[test]
fn a_refused_wrapped_forward_still_spends_a_use_of_a_limited_use_token() {
    let (mut net, _r0, team) = pair();
    let once = net.ok(
        1,
        &team,
        Method::Post,
        "auth/token/create",
        json!({"policies": ["team"], "num_uses": 1}),
    )["auth"]["client_token"]
        .as_str()
        .unwrap()
        .to_string();
    net.next_id += 1;
    let mut req = Request::new(net.next_id, Method::Put, "secret/team/w")
        .with_token(&once)
        .with_json(json!({"v": 1}));
    req.wrap_ttl = Some("60s".into());
    let r = net.send(1, req);
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(forwards(&net), 0);
    // Its one use is gone: the next request is refused, and nothing is forwarded.
    let r = net.call(1, &once, Method::Put, "secret/team/w", json!({"v": 2}));
    assert_eq!(r.status, 403, "{:?}", r.body);
    assert_eq!(forwards(&net), 0);
}

/// The primary's `local` mounts are its own: a secondary's caller does not list them, nor
/// read their settings, through a forwarded read of `sys/mounts` or `sys/auth`.
#[test]
fn a_forwarded_read_of_the_mount_tables_shows_no_local_mount_of_the_primary() {
    let (mut net, roots) = Net::new(2);
    let r0 = roots[0].clone();
    net.enable_primary(0, &r0, "performance");
    net.ok(
        0,
        &r0,
        Method::Post,
        "sys/mounts/lsec",
        json!({"type": "kv", "local": true, "description": "primary-only"}),
    );
    net.ok(
        0,
        &r0,
        Method::Post,
        "sys/auth/lauth",
        json!({"type": "ldap", "local": true, "description": "primary-only"}),
    );
    net.activate(0, &r0, 1, &roots[1], "performance", "perf1");
    net.run_for(3_000);
    let t1 = generate_root(&mut net, 1, 0);
    let lagging = lagging_index(&net);
    for path in [
        "sys/mounts",
        "sys/auth",
        "sys/mounts/lsec/tune",
        "sys/auth/lauth/tune",
    ] {
        net.next_id += 1;
        let mut req = Request::new(net.next_id, Method::Get, path).with_token(&t1);
        req.index = Some(lagging.clone());
        req.forward_inconsistent = true;
        let r = net.send(1, req);
        let body = r.body.clone().unwrap_or_default().to_string();
        // (A tune's refusal names the path the client asked for, nothing more.)
        let listed = body.contains("lsec/\":") || body.contains("lauth/\":");
        assert!(
            !body.contains("primary-only") && !listed && !body.contains("\"local\":true"),
            "{path}: {} {body}",
            r.status
        );
    }
    // Forwarded all the same: the primary's replicated mounts are listed.
    net.next_id += 1;
    let mut req = Request::new(net.next_id, Method::Get, "sys/mounts").with_token(&t1);
    req.index = Some(lagging);
    req.forward_inconsistent = true;
    let r = net.send(1, req);
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert!(r.body.unwrap()["data"].get("secret/").is_some());
}

/// An `X-Vault-Index` of a state of node 0 (the primary) no secondary has reached: a read
/// sent with it to a secondary goes to the primary.
fn lagging_index(net: &Net) -> String {
    index_state::IndexState {
        perf_cluster_id: net.nodes[0]
            .replication()
            .mode(Mode::Performance)
            .role
            .cluster_id
            .clone(),
        dr_cluster_id: String::new(),
        index: u64::MAX,
    }
    .encode()
}
