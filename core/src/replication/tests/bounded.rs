//! A performance secondary under the soak's kind of traffic for many token lifetimes: tokens
//! of 60 s created on it, KV reads on it, its primary's KV writes streaming in. What it keeps
//! in memory per request, call or write drains, and its stored tokens are bounded by the
//! tokens alive, not by the tokens it ever created.
use super::*;

const TTL_S: u64 = 60;
/// Token creations (and KV reads) per simulated minute on the secondary.
const PER_MINUTE: u64 = 40;

/// Stored keys of node `i` under `prefix`.
fn count(net: &Net, i: usize, prefix: &str) -> usize {
    net.data_keys(i, prefix).len()
}

/// One minute of traffic: a token created and a KV key read on the secondary (1) every
/// 1.5 s, a KV key overwritten on the primary (0) every 3 s.
fn minute(net: &mut Net, r0: &str, t1: &str, m: u64) {
    for i in 0..PER_MINUTE {
        net.ok(
            1,
            t1,
            Method::Post,
            "auth/token/create",
            json!({ "ttl": format!("{TTL_S}s"), "policies": ["default"] }),
        );
        let k = (m * PER_MINUTE + i) % 10;
        let r = net.ok(1, t1, Method::Get, &format!("secret/r{k}"), json!({}));
        assert_eq!(r["data"]["v"], k, "{r}");
        if i % 2 == 0 {
            net.ok(
                0,
                r0,
                Method::Put,
                &format!("secret/w{}", i % 8),
                json!({ "v": m * PER_MINUTE + i }),
            );
        }
        net.run_for(1_500);
    }
}

#[test]
fn a_perf_secondary_creating_short_lived_tokens_keeps_bounded_state() {
    let (mut net, roots) = Net::new(2);
    let r0 = roots[0].clone();
    for k in 0..10 {
        net.ok(
            0,
            &r0,
            Method::Put,
            &format!("secret/r{k}"),
            json!({ "v": k }),
        );
    }
    net.enable_primary(0, &r0, "performance");
    net.activate(0, &r0, 1, &roots[1], "performance", "perf1");
    net.run_for(2_000);
    let t1 = generate_root(&mut net, 1, 0);
    let tokens_at_start = count(&net, 1, "sys/token/");

    // Warm-up (tokens start expiring after the first minute), then a sample; six more
    // minutes, then another.
    for m in 0..3 {
        minute(&mut net, &r0, &t1, m);
    }
    let tokens_3 = count(&net, 1, "sys/token/");
    let book_3 = net.nodes[1].bookkeeping_for_tests();
    for m in 3..9 {
        minute(&mut net, &r0, &t1, m);
    }
    let tokens_9 = count(&net, 1, "sys/token/");
    let book_9 = net.nodes[1].bookkeeping_for_tests();

    // Tokens: those of the last minute (each with its accessor, expiry and parent records)
    // and the roots; the same after nine minutes as after three.
    let live_bound = tokens_at_start + 4 * (PER_MINUTE as usize + 2);
    assert!(tokens_3 > tokens_at_start, "tokens were created");
    assert!(tokens_3 <= live_bound, "{tokens_3} > {live_bound}");
    assert!(
        tokens_9 <= tokens_3,
        "token records grew: {tokens_3} -> {tokens_9}"
    );
    // In memory: nothing per request, call or write is left between requests, and the
    // counters are keyed by kind, not by request.
    for ((name, at_3), (_, at_9)) in book_3.iter().zip(&book_9) {
        assert!(at_9 <= at_3, "{name} grew: {at_3} -> {at_9}");
        let most = match *name {
            "request counters" | "login counters" => 16,
            "peer calls" => 1,
            _ => 0,
        };
        assert!(*at_9 <= most, "{name}: {at_9} (at most {most})");
    }
    // Replication kept up, and the secondary's reads saw its primary's last write.
    let s1 = net.status(1, "performance");
    assert_eq!(
        s1["last_remote_wal"],
        net.status(0, "performance")["last_wal"]
    );

    // A token lifetime later with no new tokens, every token created is gone from storage.
    net.run_for((TTL_S + 2) * 1_000);
    assert_eq!(count(&net, 1, "sys/token/"), tokens_at_start);
}
