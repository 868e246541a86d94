//! Catch-up by changed keys: a secondary behind the primary's full WAL entries but within
//! its key-only ones fetches the current values of the keys written meanwhile, streams on,
//! and, caught up, compares its roots with the primary's (which then agree).

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

/// A primary (node 0, 10 keys) and a secondary of `mode` (node 1, activated as `perf1` or
/// `dr1`) that was away while 60 more keys were written (past the 20 full WAL entries,
/// within the 10,000 key-only ones), just back on the network; and the primary's token.
fn away_past_the_wal(mode: Mode) -> (Net, String) {
    let (mut net, roots) = Net::with_key_entries(2, 10_000);
    let r0 = roots[0].clone();
    put_many(&mut net, &r0, "old", 10, 1);
    let id = if mode == Mode::Dr { "dr1" } else { "perf1" };
    net.enable_primary(0, &r0, mode.name());
    net.activate(0, &r0, 1, &roots[1], mode.name(), id);
    net.run_for(3_000);
    net.down.insert(1);
    put_many(&mut net, &r0, "new", 60, 2);
    net.run_for(6_000);
    net.down.clear();
    (net, r0)
}

/// Ticks and delivers until node 1 has applied its first catch-up batch in `mode` (its copy
/// then holds values newer than its position), and stops there.
fn first_catch_up_batch(net: &mut Net, mode: Mode) {
    for _ in 0..200 {
        net.now += 50;
        for i in 0..net.nodes.len() {
            if net.nodes[i].poll_timeout() <= net.now {
                net.nodes[i].handle(net.now, Input::Tick);
            }
        }
        if net.settle_until(|n| n.nodes[1].replication().syncing(mode)) {
            return;
        }
    }
    panic!("the {} secondary never started catching up", mode.name());
}

#[test]
fn secondaries_behind_the_wal_catch_up_by_changed_keys_then_compare_roots() {
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
    // One Merkle diff each, after catching up: the roots agreed, nothing more was fetched.
    assert_eq!(
        (diffs(&net, 1, Mode::Performance), diffs(&net, 2, Mode::Dr)),
        (before.0 + 1, before.1 + 1)
    );
    assert_eq!(net.ops.get("merkle-roots"), Some(&2), "{:?}", net.ops);
    assert!(!net.ops.contains_key("merkle-pages"), "{:?}", net.ops);
    // The copies are complete again: a promote needs no force.
    assert!(!net.nodes[1].replication().syncing(Mode::Performance));
    assert!(!net.nodes[2].replication().syncing(Mode::Dr));
    // The changed data (keys and stored values, to two secondaries) and 30 % (the two roots
    // answers among it), plus what 5 s of pulls cost anyway.
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
        moved * 10 < 2 * changed * 13,
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

/// A restart in the middle of a catch-up (the copy holds values newer than its position)
/// catches up again and then compares roots with the primary: a Merkle diff that, with the
/// primary idle, finds nothing to fetch.
#[test]
fn a_secondary_restarted_during_a_catch_up_catches_up_and_then_runs_a_merkle_diff() {
    let (mut net, _) = away_past_the_wal(Mode::Performance);
    // Restart it where its copy holds values newer than its position.
    first_catch_up_batch(&mut net, Mode::Performance);
    net.ops.clear();
    net.restart_as(1, "", 0);
    net.run_for(8_000);
    let uuid = kv_mount_uuid(&net.nodes[0]);
    let prefix = format!("logical/{uuid}/");
    assert_eq!(net.status(1, "performance")["state"], "stream-wals");
    assert_eq!(net.data_keys(1, &prefix), net.data_keys(0, &prefix));
    assert!(!net.nodes[1].replication().syncing(Mode::Performance));
    // The restarted node counts from zero: its one diff is the one after the restart, and
    // it came after the catch-up, with nothing left to synchronise.
    assert_eq!(
        net.nodes[1].replication().merkle_diffs(Mode::Performance),
        1
    );
    assert!(net.ops.contains_key("merkle-roots"), "{:?}", net.ops);
    assert!(!net.ops.contains_key("merkle-pages"), "{:?}", net.ops);
    assert!(!net.ops.contains_key("merkle-sync"), "{:?}", net.ops);
}

/// A DR secondary's WAL copy holds the primary's entries under the primary's indices (it
/// continues the sequence after a promotion): a catch-up writes none of its own, also when
/// a pull after a catch-up batch fails and the stream resumes through `connecting`.
#[test]
fn a_dr_secondarys_wal_copy_stays_the_primarys_across_an_interrupted_catch_up() {
    let (mut net, r0) = away_past_the_wal(Mode::Dr);
    first_catch_up_batch(&mut net, Mode::Dr);
    // The next pull fails: the primary is unreachable for a moment.
    net.down.insert(0);
    net.settle();
    net.down.clear();
    net.run_for(8_000);
    net.ok(0, &r0, Method::Put, "secret/after", json!({"v": 6}));
    net.run_for(1_000);
    assert_eq!(net.status(1, "dr")["state"], "stream-wals");
    let (w0, w1) = (
        net.nodes[0].replication().wal,
        net.nodes[1].replication().wal,
    );
    assert_eq!(w1.last, w0.last);
    let mut compared = 0;
    for i in w1.first..=w1.last {
        let ours = wal::read(net.nodes[1].storage(), i).unwrap();
        let theirs = wal::read(net.nodes[0].storage(), i).unwrap();
        let ours = ours.unwrap_or_else(|| panic!("entry {i} missing from the DR copy {w1:?}"));
        if let Some(t) = theirs {
            assert_eq!((&ours.key, &ours.value), (&t.key, &t.value), "entry {i}");
            compared += 1;
        }
    }
    assert!(compared >= 1);
    let k0 = wal::read_keys(net.nodes[0].storage(), &w0, 0, 100_000).unwrap();
    for k in wal::read_keys(net.nodes[1].storage(), &w1, 0, 100_000).unwrap() {
        if let Some(p) = k0.iter().find(|x| x.index == k.index) {
            assert_eq!(p.key, k.key, "key-only entry {}", k.index);
        }
    }
}
