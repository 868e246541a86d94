//! Catch-up by changed keys: a secondary behind the primary's full WAL entries but within
//! its key-only ones fetches the current values of the keys written meanwhile, without a
//! Merkle diff, and streams on.

use super::*;

/// Writes `n` values (`secret/<name><i>`) on node 0.
fn put_many(net: &mut Net, root: &str, name: &str, n: usize, v: u32) {
    for i in 0..n {
        net.ok(
            0,
            root,
            Method::Put,
            &format!("secret/{name}{i}"),
            json!({ "v": v, "pad": "x".repeat(60) }),
        );
    }
}

#[test]
fn secondaries_behind_the_wal_catch_up_by_changed_keys_without_a_merkle_diff() {
    let (mut net, roots) = Net::with_key_entries(3, 10_000);
    let r0 = roots[0].clone();
    put_many(&mut net, &r0, "old", 40, 1);
    net.enable_primary(0, &r0, "performance");
    net.enable_primary(0, &r0, "dr");
    net.activate(0, &r0, 1, &roots[1], "performance", "perf1");
    net.activate(0, &r0, 2, &roots[2], "dr", "dr1");
    net.run_for(3_000);
    let uuid = kv_mount_uuid(&net.nodes[0]);
    let prefix = format!("logical/{uuid}/");
    assert_eq!(net.data_keys(1, &prefix), net.data_keys(0, &prefix));
    let diffs = |net: &Net, i: usize, m: Mode| net.nodes[i].replication().merkle_diffs(m);
    let before = (diffs(&net, 1, Mode::Performance), diffs(&net, 2, Mode::Dr));
    // What 5 s of pulls and heartbeats cost with nothing to send.
    net.wire_bytes = 0;
    net.run_for(5_000);
    let idle = net.wire_bytes;

    // Both away well past the WAL's 20 entries: new keys, updates of old ones (twice for
    // some), deletes, and a key written then deleted while they were away.
    net.down.insert(1);
    net.down.insert(2);
    put_many(&mut net, &r0, "new", 50, 2);
    put_many(&mut net, &r0, "old", 10, 3);
    put_many(&mut net, &r0, "old", 5, 4);
    for i in 30..35 {
        net.ok(0, &r0, Method::Delete, &format!("secret/old{i}"), json!({}));
    }
    net.ok(0, &r0, Method::Put, "secret/brief", json!({"v": 5}));
    net.ok(0, &r0, Method::Delete, "secret/brief", json!({}));
    net.run_for(6_000);
    let wal = net.nodes[0].replication().wal;
    assert!(wal.kept > 60, "key-only entries kept: {wal:?}");
    net.down.clear();
    net.ops.clear();
    net.wire_bytes = 0;
    net.run_for(5_000);

    let s1 = net.status(1, "performance");
    let s2 = net.status(2, "dr");
    assert_eq!(s1["state"], "stream-wals", "{s1}");
    assert_eq!(s2["state"], "stream-wals", "{s2}");
    assert_eq!(
        s1["merkle_root"],
        net.status(0, "performance")["merkle_root"]
    );
    assert_eq!(s2["merkle_root"], net.status(0, "dr")["merkle_root"]);
    assert_eq!(net.data_keys(1, &prefix), net.data_keys(0, &prefix));
    assert_eq!(net.data_keys(2, &prefix), net.data_keys(0, &prefix));
    assert!(!net
        .data_keys(1, &prefix)
        .iter()
        .any(|(k, _)| k.ends_with("brief")));
    // No Merkle diff: the roots were never asked for.
    assert_eq!(
        (diffs(&net, 1, Mode::Performance), diffs(&net, 2, Mode::Dr)),
        before
    );
    assert!(!net.ops.contains_key("merkle-roots"), "{:?}", net.ops);
    // The copies are complete again: a promote needs no force.
    assert!(!net.nodes[1].replication().syncing(Mode::Performance));
    assert!(!net.nodes[2].replication().syncing(Mode::Dr));
    // The changed data (keys and stored values, to two secondaries), plus what 5 s of
    // pulls cost anyway.
    let changed: usize = net
        .data_keys(0, &prefix)
        .iter()
        .filter(|(k, _)| {
            let name = k.rsplit('/').next().unwrap_or("");
            name.starts_with("new")
                || name
                    .strip_prefix("old")
                    .and_then(|n| n.parse::<u32>().ok())
                    .is_some_and(|n| n < 10)
        })
        .map(|(k, v)| k.len() + v.len())
        .sum();
    assert!(changed > 60 * 100, "{changed}");
    let moved = net.wire_bytes.saturating_sub(idle);
    assert!(
        moved * 10 < 2 * changed * 12,
        "{} bytes ({idle} idle) for 2 x {changed} bytes changed, {:?}",
        net.wire_bytes,
        net.ops
    );

    // The DR secondary's WAL copy goes on under the primary's indices, and both stream on.
    net.ok(0, &r0, Method::Put, "secret/after", json!({"v": 6}));
    net.run_for(500);
    assert_eq!(net.data_keys(1, &prefix), net.data_keys(0, &prefix));
    assert_eq!(net.data_keys(2, &prefix), net.data_keys(0, &prefix));
    let last = net.nodes[0].replication().wal.last;
    assert_eq!(net.nodes[2].replication().wal.last, last);
    assert_eq!(net.status(2, "dr")["last_remote_wal"], json!(last));
}

#[test]
fn a_secondary_behind_the_key_only_entries_too_runs_a_merkle_diff() {
    let (mut net, roots) = Net::with_key_entries(2, 15);
    let r0 = roots[0].clone();
    put_many(&mut net, &r0, "old", 10, 1);
    net.enable_primary(0, &r0, "performance");
    net.activate(0, &r0, 1, &roots[1], "performance", "perf1");
    net.run_for(3_000);
    let before = net.nodes[1].replication().merkle_diffs(Mode::Performance);
    net.down.insert(1);
    // 60 entries: past the 20 full and the 15 key-only ones.
    put_many(&mut net, &r0, "new", 60, 2);
    net.run_for(6_000);
    net.down.clear();
    net.run_for(8_000);
    let uuid = kv_mount_uuid(&net.nodes[0]);
    let prefix = format!("logical/{uuid}/");
    assert_eq!(net.status(1, "performance")["state"], "stream-wals");
    assert_eq!(net.data_keys(1, &prefix), net.data_keys(0, &prefix));
    assert_eq!(
        net.nodes[1].replication().merkle_diffs(Mode::Performance),
        before + 1
    );
}

#[test]
fn a_secondary_restarted_during_a_catch_up_finishes_by_merkle_diff() {
    let (mut net, roots) = Net::with_key_entries(2, 10_000);
    let r0 = roots[0].clone();
    put_many(&mut net, &r0, "old", 10, 1);
    net.enable_primary(0, &r0, "performance");
    net.activate(0, &r0, 1, &roots[1], "performance", "perf1");
    net.run_for(3_000);
    net.down.insert(1);
    put_many(&mut net, &r0, "new", 60, 2);
    net.run_for(6_000);
    net.down.clear();
    // Deliver until the secondary has applied its first catch-up batch (its copy then holds
    // values newer than its position), and restart it there.
    let mut seen = false;
    for _ in 0..200 {
        net.now += 50;
        for i in 0..net.nodes.len() {
            if net.nodes[i].poll_timeout() <= net.now {
                net.nodes[i].handle(net.now, Input::Tick);
            }
        }
        if net.settle_until(|n| n.nodes[1].replication().syncing(Mode::Performance)) {
            seen = true;
            break;
        }
    }
    assert!(seen, "the secondary never started catching up");
    net.restart_as(1, "", 0);
    net.run_for(8_000);
    let uuid = kv_mount_uuid(&net.nodes[0]);
    let prefix = format!("logical/{uuid}/");
    assert_eq!(net.status(1, "performance")["state"], "stream-wals");
    assert_eq!(net.data_keys(1, &prefix), net.data_keys(0, &prefix));
    assert!(!net.nodes[1].replication().syncing(Mode::Performance));
    // The restarted node counts from zero: its one diff is the one after the restart.
    assert_eq!(
        net.nodes[1].replication().merkle_diffs(Mode::Performance),
        1
    );
}
