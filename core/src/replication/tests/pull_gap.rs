//! The pull gap of a streaming secondary: a least time between the starts of two pulls while
//! writes come faster than that, and no wait at all for a write to a quiet primary; a pull
//! the primary holds is answered at once when the primary stops serving (sealed).
use super::*;

/// How far performance secondary 1 has applied its primary's WAL.
fn applied(net: &Net) -> u64 {
    net.nodes[1]
        .replication()
        .mode(Mode::Performance)
        .role
        .last_remote_wal
}

/// A KV write on the primary (0), delivered as far as the network takes it at this instant.
fn write(net: &mut Net, token: &str, path: &str) {
    net.ok(0, token, Method::Put, path, json!({"v": 1}));
    net.settle();
}

fn pulls(net: &Net) -> usize {
    net.ops.get("pull").copied().unwrap_or(0)
}

#[test]
fn a_pull_gap_batches_a_burst_and_costs_a_quiet_primary_nothing() {
    let (mut net, roots) = Net::new(2);
    let r0 = roots[0].clone();
    net.nodes[1]
        .state_mut_for_tests()
        .config
        .replication
        .pull_gap_ms = 200;
    net.enable_primary(0, &r0, "performance");
    net.activate(0, &r0, 1, &roots[1], "performance", "perf1");
    net.run_for(2_000);
    assert_eq!(
        applied(&net),
        net.nodes[0].replication().wal.last,
        "in sync"
    );

    // Quiet: the secondary's pull waits on the primary (held, then answered empty after
    // `pull_wait_ms`, longer than the gap), so a write reaches it at once.
    net.run_for(1_000);
    // (until the held pull is older than the gap: one answered within it is paced)
    let held_since = |net: &Net| {
        net.nodes[1]
            .replication()
            .mode(Mode::Performance)
            .sec
            .pulled_at
            .unwrap_or(net.now)
    };
    while net.now - held_since(&net) <= 200 {
        net.run_for(50);
    }
    net.ok(0, &r0, Method::Put, "secret/quiet", json!({"v": 1}));
    net.settle();
    assert_eq!(
        applied(&net),
        net.nodes[0].replication().wal.last,
        "a write to a quiet primary is applied with no gap"
    );

    // A burst at the same instant: the pull that carried its first write was answered
    // within the gap, so the next one waits for the gap, and the rest of the burst travels
    // in one pull.
    let before = pulls(&net);
    let first_done = net.nodes[0].replication().wal.last;
    for i in 0..10 {
        write(&mut net, &r0, &format!("secret/burst{i}"));
        if i == 0 {
            // The pull that carried the quiet write had waited longer than the gap: the
            // next one left at once and carries this one.
            assert_eq!(applied(&net), net.nodes[0].replication().wal.last);
        }
    }
    let last = net.nodes[0].replication().wal.last;
    assert!(last > first_done + 9);
    assert!(
        applied(&net) < last,
        "within the gap the secondary has not pulled the rest yet"
    );
    assert!(pulls(&net) - before <= 2, "{} pulls", pulls(&net) - before);
    net.run_for(250);
    assert_eq!(applied(&net), last, "after the gap it has everything");
    assert!(pulls(&net) - before <= 4, "{} pulls", pulls(&net) - before);

    // Without a gap, every write of a burst goes out in a pull of its own.
    net.nodes[1]
        .state_mut_for_tests()
        .config
        .replication
        .pull_gap_ms = 0;
    net.run_for(1_000);
    let before = pulls(&net);
    for i in 0..10 {
        write(&mut net, &r0, &format!("secret/nogap{i}"));
        assert_eq!(applied(&net), net.nodes[0].replication().wal.last);
    }
    assert!(pulls(&net) - before >= 10);
}

/// A perf primary with a log that is switched off and joins another primary as its
/// secondary: the join wipes its storage, and the entries it kept in memory for pulls go too.
#[test]
fn a_primary_that_joins_as_a_secondary_keeps_no_entries_of_its_old_log() {
    let (mut net, roots) = Net::new(2);
    let (r0, r1) = (roots[0].clone(), roots[1].clone());
    net.enable_primary(0, &r0, "performance");
    for i in 0..5 {
        write(&mut net, &r0, &format!("secret/old{i}"));
    }
    let tail = |net: &Net| net.nodes[0].replication().tail.len();
    assert!(tail(&net) >= 5, "the primary keeps its newest entries");
    net.ok(
        0,
        &r0,
        Method::Post,
        "sys/replication/performance/primary/disable",
        json!({}),
    );
    net.enable_primary(1, &r1, "performance");
    net.activate(1, &r1, 0, &r0, "performance", "perf0");
    net.run_for(2_000);
    let n0 = &net.nodes[0];
    assert_eq!(n0.replication().tail_drift(n0.storage(), usize::MAX), None);
    assert_eq!(tail(&net), 0);
}

/// A primary sealed while it holds a secondary's pull answers the pull at once (an error),
/// so the secondary does not wait out its read timeout to learn it.
#[test]
fn a_primary_sealed_while_it_holds_a_pull_answers_it_at_once() {
    let (mut net, roots) = Net::new(2);
    let r0 = roots[0].clone();
    net.enable_primary(0, &r0, "performance");
    net.activate(0, &r0, 1, &roots[1], "performance", "perf1");
    net.run_for(2_000);
    let held = |net: &Net| net.peer_calls.keys().filter(|(j, _)| *j == 0).count();
    assert_eq!(held(&net), 1, "the secondary's pull is held by the primary");

    let r = net.call(0, &r0, Method::Put, "sys/seal", json!({}));
    assert!(r.status < 300, "seal: {r:?}");
    net.settle();
    assert_eq!(
        held(&net),
        0,
        "the held pull is answered when the primary seals"
    );
    let last_error = &net.nodes[1]
        .replication()
        .mode(Mode::Performance)
        .sec
        .last_error;
    assert!(last_error.contains("sealed"), "{last_error}");
}
