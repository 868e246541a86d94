//! A snapshot restored on a primary: its performance and DR secondaries find their WAL
//! position gone, compare Merkle trees and converge on the restored data by themselves.
use super::*;

fn save(net: &mut Net, i: usize, token: &str) -> Vec<u8> {
    let r = net.call(
        i,
        token,
        Method::Get,
        "sys/storage/raft/snapshot",
        json!(null),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.index.is_some(),
        "a primary's snapshot names its WAL index"
    );
    r.raw.expect("a snapshot body").1
}

fn restore(net: &mut Net, i: usize, token: &str, file: &[u8]) -> Response {
    net.next_id += 1;
    let mut req =
        Request::new(net.next_id, Method::Post, "sys/storage/raft/snapshot").with_token(token);
    req.body = file.to_vec();
    net.send(i, req)
}

#[test]
fn secondaries_converge_on_a_restored_primary() {
    let (mut net, roots) = Net::new(3);
    let r0 = roots[0].clone();
    net.ok(0, &r0, Method::Put, "secret/a", json!({"v": 1}));
    net.enable_primary(0, &r0, "performance");
    net.enable_primary(0, &r0, "dr");
    net.activate(0, &r0, 1, &roots[1], "performance", "perf1");
    net.activate(0, &r0, 2, &roots[2], "dr", "dr1");
    net.run_for(2_000);
    net.ok(0, &r0, Method::Put, "secret/b", json!({"v": 2}));
    let file = save(&mut net, 0, &r0);
    let uuid = kv_mount_uuid(&net.nodes[0]);
    let prefix = format!("logical/{uuid}/");
    let at_snapshot = net.data_keys(0, &prefix);
    net.ok(0, &r0, Method::Put, "secret/a", json!({"v": 10}));
    net.ok(0, &r0, Method::Put, "secret/c", json!({"v": 3}));
    net.run_for(1_000);
    assert_eq!(net.data_keys(1, &prefix).len(), 3);
    let wal_before = net.status(0, "performance")["last_wal"].as_u64().unwrap();
    // A DR secondary refuses: its data follows its primary.
    let r = restore(&mut net, 2, &r0, &file);
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.body.unwrap().to_string().contains("DR secondary"));
    let r = restore(&mut net, 0, &r0, &file);
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(net.data_keys(0, &prefix), at_snapshot);
    // A new WAL history after a gap.
    let p = net.status(0, "performance");
    assert!(p["last_wal"].as_u64().unwrap() > wal_before, "{p}");
    net.run_for(5_000);
    let p = net.status(0, "performance");
    let s1 = net.status(1, "performance");
    assert_eq!(s1["merkle_root"], p["merkle_root"], "{s1} vs {p}");
    assert_eq!(s1["state"], "stream-wals", "{s1}");
    let pd = net.status(0, "dr");
    let s2 = net.status(2, "dr");
    assert_eq!(s2["merkle_root"], pd["merkle_root"], "{s2} vs {pd}");
    assert_eq!(net.data_keys(1, &prefix), at_snapshot);
    assert_eq!(net.data_keys(2, &prefix), at_snapshot);
    assert!(
        net.ops.get("merkle-sync").copied().unwrap_or(0) > 0,
        "{:?}",
        net.ops
    );
    // Streaming goes on from the new history.
    net.ok(0, &r0, Method::Put, "secret/d", json!({"v": 4}));
    net.run_for(500);
    assert_eq!(net.data_keys(1, &prefix), net.data_keys(0, &prefix));
    assert_eq!(net.data_keys(2, &prefix), net.data_keys(0, &prefix));
}
