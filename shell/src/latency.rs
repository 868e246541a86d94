//! Request latency histograms measured by the HTTP listener (wall clock, so they live in
//! the shell, not in the deterministic core), per method and path class, appended to the
//! core's Prometheus text for `sys/metrics?format=prometheus`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the buckets, in seconds.
const BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Most distinct (method, class) series; further ones are counted under class `other`.
const MAX_SERIES: usize = 512;

#[derive(Default, Clone)]
struct Hist {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

static HISTS: Mutex<BTreeMap<(String, String), Hist>> = Mutex::new(BTreeMap::new());

/// Records one request's latency.
pub fn observe(method: &str, class: &str, took: Duration) {
    let secs = took.as_secs_f64();
    let Ok(mut h) = HISTS.lock() else { return };
    let mut key = (method.to_string(), class.to_string());
    if !h.contains_key(&key) && h.len() >= MAX_SERIES {
        key.1 = "other".into();
    }
    let e = h.entry(key).or_default();
    for (i, b) in BUCKETS.iter().enumerate() {
        if secs <= *b {
            e.counts[i] += 1;
        }
    }
    e.count += 1;
    e.sum += secs;
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The histograms (and the cluster channel byte counters) in Prometheus text format.
pub fn render() -> String {
    let snapshot = match HISTS.lock() {
        Ok(h) => h.clone(),
        Err(_) => return String::new(),
    };
    let mut out = String::new();
    let name = "cairn_request_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} API request latency by method and path class, as seen by the listener."
    );
    let _ = writeln!(out, "# TYPE {name} histogram");
    for ((m, c), h) in snapshot {
        let l = format!("method=\"{}\",path=\"{}\"", esc(&m), esc(&c));
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(out, "{name}_bucket{{{l},le=\"{b}\"}} {}", h.counts[i]);
        }
        let _ = writeln!(out, "{name}_bucket{{{l},le=\"+Inf\"}} {}", h.count);
        let _ = writeln!(out, "{name}_sum{{{l}}} {}", h.sum);
        let _ = writeln!(out, "{name}_count{{{l}}} {}", h.count);
    }
    out.push_str(&crate::cluster::render_bytes());
    out
}
