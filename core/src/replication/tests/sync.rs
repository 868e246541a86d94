//! Merkle diffs and syncs: a promote refused until the copy is known complete, a secondary
//! that rebuilt its trees comparing them once, resyncs that update, delete and narrow crowded
//! pages, and syncs larger than one window of leaves.

use super::*;

#[test]
fn promote_refuses_an_unsynced_secondary_unless_forced() {
    let (mut net, roots) = Net::new(2);
    let r0 = roots[0].clone();
    net.ok(0, &r0, Method::Put, "secret/a", json!({ "v": 1 }));
    net.enable_primary(0, &r0, "performance");
    // The cluster channel to the primary is cut (its API still answers the unwrap): the
    // secondary activates but never finishes its first Merkle sync, so its copy is incomplete.
    net.down.insert(0);
    net.activate(0, &r0, 1, &roots[1], "performance", "p1");
    net.run_for(500);
    let t1 = generate_root(&mut net, 1, 0);
    let r = net.call(
        1,
        &t1,
        Method::Post,
        "sys/replication/performance/secondary/promote",
        json!({}),
    );
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert!(
        r.body.unwrap().to_string().contains("force=true"),
        "the error says how to override"
    );
    assert_eq!(net.status(1, "performance")["mode"], "secondary");
    net.ok(
        1,
        &t1,
        Method::Post,
        "sys/replication/performance/secondary/promote",
        json!({ "force": true }),
    );
    assert_eq!(net.status(1, "performance")["mode"], "primary");
}

/// A primary (node 0, holding `secret/a`) and its performance secondary (node 1) in sync;
/// then node 1 stops with its Merkle records' marker missing (as after a crash between a
/// write and the records' flush) and is started again, sealed: it will rebuild its trees.
/// Returns the net and the primary's root token.
fn secondary_restarted_without_marker() -> (Net, String) {
    let (mut net, roots) = Net::new(2);
    let r0 = roots[0].clone();
    net.ok(0, &r0, Method::Put, "secret/a", json!({ "v": 1 }));
    net.enable_primary(0, &r0, "performance");
    net.activate(0, &r0, 1, &roots[1], "performance", "p1");
    net.run_for(3_000);
    assert_eq!(
        net.status(1, "performance")["merkle_root"],
        net.status(0, "performance")["merkle_root"]
    );
    let mut storage = net.nodes[1].storage().clone();
    storage
        .apply(&[(merkle::MARKER.to_string(), None)])
        .unwrap();
    net.nodes[1] = Node::new(storage, [9; 32], cfg(1, 0));
    (net, r0)
}

/// A secondary that rebuilt its Merkle trees at start (stopped before their records were
/// written) cannot know its copy is complete until it has compared them with the primary's:
/// cut off from the primary, an unforced promote is refused; once the comparison is done
/// the copy is known complete again and the promote needs no `force`.
#[test]
fn a_rebuilt_secondary_refuses_an_unforced_promote_until_its_diff_completes() {
    // The secondary starts again while the primary is unreachable.
    let (mut net, _) = secondary_restarted_without_marker();
    net.down.insert(0);
    let key = net.keys[0].clone();
    let r = net.call(1, "", Method::Post, "sys/unseal", json!({ "key": key }));
    assert_eq!(r.status, 200, "{:?}", r.body);
    net.run_for(500);
    let t1 = generate_root(&mut net, 1, 0);
    let promote = "sys/replication/performance/secondary/promote";
    let r = net.call(1, &t1, Method::Post, promote, json!({}));
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert!(r.body.unwrap().to_string().contains("force=true"));
    assert_eq!(net.status(1, "performance")["mode"], "secondary");

    // Back in touch: the trees are compared (nothing differs) and the promote is accepted.
    net.down.remove(&0);
    net.run_for(3_000);
    assert_eq!(
        net.status(1, "performance")["merkle_root"],
        net.status(0, "performance")["merkle_root"]
    );
    net.ok(1, &t1, Method::Post, promote, json!({}));
    assert_eq!(net.status(1, "performance")["mode"], "primary");
}

/// A secondary that rebuilt its trees at start compares them with the primary's once; when
/// it later reloads its state from complete Merkle records (a batch rolled back, an HA
/// takeover), it streams on from its WAL index without another diff.
#[test]
fn a_reload_from_complete_records_after_a_rebuild_starts_no_second_diff() {
    let (mut net, r0) = secondary_restarted_without_marker();
    let key = net.keys[0].clone();
    let r = net.call(1, "", Method::Post, "sys/unseal", json!({ "key": key }));
    assert_eq!(r.status, 200, "{:?}", r.body);
    net.run_for(3_000);
    let diffs = net.nodes[1].replication().merkle_diffs(Mode::Performance);
    assert_eq!(diffs, 1, "the rebuilt trees are compared once");
    assert!(
        net.nodes[1]
            .storage()
            .get(merkle::MARKER)
            .unwrap()
            .is_some(),
        "the records are complete again"
    );
    // The driver drops a batch: the state is reloaded from the complete records.
    net.nodes[1].storage_rolled_back();
    net.ok(0, &r0, Method::Put, "secret/b", json!({ "v": 2 }));
    net.run_for(3_000);
    // The counter runs since the node started (a reload does not start it over, or a diff
    // begun by the reload would hide behind the reset): still the one diff.
    assert_eq!(
        net.nodes[1].replication().merkle_diffs(Mode::Performance),
        1,
        "a reload from complete records started another Merkle diff (or reset the counter)"
    );
    assert_eq!(
        net.status(1, "performance")["merkle_root"],
        net.status(0, "performance")["merkle_root"]
    );
}

/// A perf secondary away past WAL retention resyncs: values changed and keys added and
/// deleted on the primary meanwhile arrive (in batches of `fetch_batch`), a page crowded with
/// the secondary's keys is narrowed down through its subpage sums, and what moves is close to
/// the changed data.
#[test]
fn merkle_resync_updates_deletes_and_narrows_crowded_pages() {
    let (mut net, roots) = Net::new(2);
    let r0 = roots[0].clone();
    net.ok(0, &r0, Method::Put, "secret/seed", json!({"v": 0}));
    let uuid = kv_mount_uuid(&net.nodes[0]);
    let prefix = format!("logical/{uuid}/");
    // More keys in page 0 of the KV subtree than a page synchronised whole may hold.
    let crowd: Vec<String> = (0..)
        .map(|i| format!("crowd/{i}"))
        .filter(|k| merkle::bucket(&format!("{prefix}{k}")).0 == 0)
        .take(300)
        .collect();
    for k in &crowd {
        net.ok(0, &r0, Method::Put, &format!("secret/{k}"), json!({"v": 1}));
    }
    let put = |net: &mut _, keys: &mut dyn Iterator<Item = String>, v: u32| {
        for k in keys {
            Net::ok(
                net,
                0,
                &r0,
                Method::Put,
                &format!("secret/{k}"),
                json!({ "v": v }),
            );
        }
    };
    put(&mut net, &mut (0..30).map(|i| format!("k{i}")), 1);
    net.enable_primary(0, &r0, "performance");
    net.activate(0, &r0, 1, &roots[1], "performance", "perf1");
    net.run_for(3_000);
    let p = net.status(0, "performance");
    assert_eq!(
        net.status(1, "performance")["merkle_root"],
        p["merkle_root"]
    );

    net.down.insert(1);
    // Past retention (20 entries): updates, deletes and new keys, in the crowded page too.
    for k in &crowd[..3] {
        net.ok(0, &r0, Method::Put, &format!("secret/{k}"), json!({"v": 2}));
    }
    net.ok(
        0,
        &r0,
        Method::Delete,
        &format!("secret/{}", crowd[3]),
        json!({}),
    );
    put(&mut net, &mut (0..10).map(|i| format!("k{i}")), 2);
    for i in 10..15 {
        net.ok(0, &r0, Method::Delete, &format!("secret/k{i}"), json!({}));
    }
    put(&mut net, &mut (0..10).map(|i| format!("new{i}")), 3);
    net.run_for(3_000);
    assert_eq!(net.status(1, "performance")["state"], "idle");
    net.ops.clear();
    net.wire_bytes = 0;
    net.down.clear();
    net.run_for(8_000);
    let s1 = net.status(1, "performance");
    let p = net.status(0, "performance");
    assert_eq!(s1["state"], "stream-wals", "{s1}");
    assert_eq!(s1["merkle_root"], p["merkle_root"]);
    assert_eq!(net.data_keys(1, &prefix), net.data_keys(0, &prefix));
    assert!(net.ops.contains_key("merkle-subpages"), "{:?}", net.ops);
    // 23 values written in batches of 3 (the 6 deletes ride along).
    assert_eq!(net.ops["merkle-sync"], 8, "{:?}", net.ops);
    // The stored values of the 23 written keys are about 100 bytes each; the diff and the
    // heartbeats of 8 s of polling cost a few kilobytes more.
    assert!(
        net.wire_bytes < 40_000,
        "{} bytes, {:?}",
        net.wire_bytes,
        net.ops
    );
}

/// A Merkle sync larger than one window of the secondary's leaves (`sync_window` 12) converges: a fresh secondary's first sync, and a resync where most of the
/// secondary's keys were deleted, changed or joined by new ones, so that stale keys sit on
/// both sides of where each answer's range ends.
#[test]
fn merkle_sync_in_windows_converges_on_first_sync_and_heavy_resync() {
    let (mut net, roots) = Net::new(3);
    let r0 = roots[0].clone();
    net.ok(0, &r0, Method::Put, "secret/seed", json!({"v": 0}));
    let uuid = kv_mount_uuid(&net.nodes[0]);
    let prefix = format!("logical/{uuid}/");
    for i in 0..400 {
        net.ok(
            0,
            &r0,
            Method::Put,
            &format!("secret/w{i:03}"),
            json!({"v": 1}),
        );
    }
    net.enable_primary(0, &r0, "performance");
    net.activate(0, &r0, 1, &roots[1], "performance", "perf1");
    net.run_for(20_000);
    let s1 = net.status(1, "performance");
    assert_eq!(s1["state"], "stream-wals", "{s1}");
    assert_eq!(net.data_keys(1, &prefix), net.data_keys(0, &prefix));
    assert!(net.ops["merkle-sync"] >= 400 / 3, "{:?}", net.ops);

    net.down.insert(1);
    for i in 0..400 {
        let k = format!("secret/w{i:03}");
        match i % 4 {
            0 | 1 => {
                net.ok(0, &r0, Method::Delete, &k, json!({}));
            }
            2 => {
                net.ok(0, &r0, Method::Put, &k, json!({"v": 2}));
            }
            _ => {}
        }
    }
    for i in 0..150 {
        net.ok(
            0,
            &r0,
            Method::Put,
            &format!("secret/n{i:03}"),
            json!({"v": 3}),
        );
    }
    net.run_for(3_000);
    net.down.clear();
    // A third cluster's first sync meanwhile.
    net.activate(0, &r0, 2, &roots[2], "performance", "perf2");
    net.run_for(30_000);
    for s in [1, 2] {
        let st = net.status(s, "performance");
        assert_eq!(st["state"], "stream-wals", "{s}: {st}");
        assert_eq!(
            st["merkle_root"],
            net.status(0, "performance")["merkle_root"]
        );
        assert_eq!(net.data_keys(s, &prefix), net.data_keys(0, &prefix), "{s}");
    }
    // The seed, half of the 400 and the 150 new ones.
    assert_eq!(net.data_keys(1, &prefix).len(), 1 + 400 / 2 + 150);
}
