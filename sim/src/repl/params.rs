//! Per-seed parameters of the replication tier (topology, links, limits, fault rates) and
//! the hosts' addresses.

use crate::net::{HostId, Link};
use crate::rng::SimRng;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Primary,
    Perf { filtered: bool },
    Dr,
}

#[derive(Debug, Clone)]
pub struct Params {
    pub kinds: Vec<Kind>,
    pub client_link: Link,
    pub peer_link: Link,
    pub commit_window_ms: u64,
    pub tick_ms: u64,
    pub wal_max_entries: u64,
    /// Key-only entries kept behind the full ones (0: a secondary behind the WAL always
    /// goes through Merkle diff and sync; otherwise it may catch up by changed keys).
    pub wal_max_key_entries: u64,
    pub pull_wait_ms: u64,
    /// A caught-up secondary's least wait before its next pull (0: at once).
    pub pull_gap_ms: u64,
    pub fetch_batch: usize,
    /// Most of a secondary's leaves per Merkle sync request.
    pub sync_window: usize,
    pub batch_entries: u32,
    pub crash_mean_ms: u64,
    pub crash_in_batch_permille: u64,
    pub downtime_mean_ms: u64,
    pub partition_mean_ms: u64,
    pub partition_len_ms: u64,
    pub think_ms: u64,
    pub revoke_permille: u64,
    /// Mean time between planted corruptions (a Merkle record anywhere, a replicated value
    /// on a secondary); 0: none.
    pub corrupt_mean_ms: u64,
    /// Chance (‰) per operator step of a reindex or Merkle check.
    pub scan_permille: u64,
    /// Chance (‰) per operator step that the snapshot drill starts (once per seed; see
    /// `repl/snapshot.rs`); 0: never.
    pub snapshot_permille: u64,
}

impl Params {
    pub fn derive(seed: u64, profile: crate::Profile) -> Params {
        let mut r = SimRng::derive(seed, "repl-params");
        let n = r.range(1, 3) as usize;
        let mut kinds = vec![Kind::Primary];
        for _ in 0..n {
            kinds.push(match r.below(10) {
                0..=4 => Kind::Perf { filtered: false },
                5..=7 => Kind::Perf { filtered: true },
                _ => Kind::Dr,
            });
        }
        if profile == crate::Profile::Scale {
            // The draws above still happen, so that the other parameters of a seed are
            // those of the default profile.
            kinds.truncate(1);
            kinds.extend((0..12).map(|i| Kind::Perf {
                filtered: i % 3 == 2,
            }));
            kinds.extend((0..3).map(|_| Kind::Dr));
        }
        Params {
            kinds,
            client_link: Link {
                delay_mean: r.range(0, 3),
                loss_permille: 0,
                fifo: true,
                up: true,
            },
            peer_link: Link {
                delay_mean: r.range(0, 20),
                loss_permille: *r.pick(&[0, 0, 10, 50]).unwrap_or(&0),
                fifo: r.chance(500),
                up: true,
            },
            commit_window_ms: r.range(0, 5),
            tick_ms: *r.pick(&[250, 1000]).unwrap_or(&1000),
            wal_max_entries: *r.pick(&[8, 30, 1000]).unwrap_or(&1000),
            pull_wait_ms: *r.pick(&[100, 500, 2000]).unwrap_or(&500),
            fetch_batch: *r.pick(&[2, 16, 512]).unwrap_or(&16),
            batch_entries: *r.pick(&[4, 512]).unwrap_or(&512) as u32,
            crash_mean_ms: *r.pick(&[5_000, 20_000, 60_000]).unwrap_or(&20_000),
            crash_in_batch_permille: *r.pick(&[0, 2, 10]).unwrap_or(&2),
            downtime_mean_ms: *r.pick(&[100, 1_000, 5_000]).unwrap_or(&1_000),
            partition_mean_ms: *r.pick(&[3_000, 15_000, 60_000]).unwrap_or(&15_000),
            partition_len_ms: *r.pick(&[500, 5_000, 20_000]).unwrap_or(&5_000),
            think_ms: *r.pick(&[5, 30, 200]).unwrap_or(&30),
            revoke_permille: *r.pick(&[0, 5, 20]).unwrap_or(&5),
            corrupt_mean_ms: *r.pick(&[0, 8_000, 30_000]).unwrap_or(&0),
            scan_permille: *r.pick(&[4, 12, 30]).unwrap_or(&12),
            sync_window: *r.pick(&[64, 16 * 1024]).unwrap_or(&64),
            pull_gap_ms: *r.pick(&[0, 0, 5, 50]).unwrap_or(&0),
            // Not drawn.
            snapshot_permille: 40,
            // Drawn from a stream of its own, so that the draws above (and the seeds in
            // `sim/regressions`) stay what they were before it existed.
            wal_max_key_entries: *SimRng::derive(seed, "repl-key-entries")
                .pick(&[0, 20, 100_000])
                .unwrap_or(&0),
        }
    }

    pub fn describe(&self) -> String {
        let kinds: Vec<String> = self
            .kinds
            .iter()
            .map(|k| match k {
                Kind::Primary => "perf+primary".to_string(),
                Kind::Perf { filtered: false } => "perf".to_string(),
                Kind::Perf { filtered: true } => "perf(filtered)".to_string(),
                Kind::Dr => "dr".to_string(),
            })
            .collect();
        format!(
            "topology=[{}] peer-delay={}ms peer-loss={}‰ peer-fifo={} commit-window={}ms tick={}ms \
             wal-max={} wal-keys={} pull-wait={}ms pull-gap={}ms fetch-batch={} sync-window={} batch-entries={} crash-every~{}ms downtime~{}ms \
             partition-every~{}ms partition-len~{}ms think={}ms revoke={}‰ corrupt-every~{}ms scans={}‰ snapshots={}‰",
            kinds.join(","),
            self.peer_link.delay_mean,
            self.peer_link.loss_permille,
            self.peer_link.fifo,
            self.commit_window_ms,
            self.tick_ms,
            self.wal_max_entries,
            self.wal_max_key_entries,
            self.pull_wait_ms,
            self.pull_gap_ms,
            self.fetch_batch,
            self.sync_window,
            self.batch_entries,
            self.crash_mean_ms,
            self.downtime_mean_ms,
            self.partition_mean_ms,
            self.partition_len_ms,
            self.think_ms,
            self.revoke_permille,
            self.corrupt_mean_ms,
            self.scan_permille,
            self.snapshot_permille,
        )
    }
}

pub(super) fn api_addr(h: HostId) -> String {
    format!("http://api{h}:8200")
}
pub(super) fn cluster_addr(h: HostId) -> String {
    format!("cluster{h}:8201")
}
