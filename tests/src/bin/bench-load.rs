//! `bench-load`: the Rust load generator for `scripts/bench-ha.py`, so that the HA bench's
//! clients, which share the machine's cores with the three nodes and PostgreSQL, cost little
//! CPU (the Python clients took a large share of it). Every answer is checked; a failed or
//! wrong one is counted and reported, never part of a rate or a latency. Prints one JSON
//! object on stdout.
//!
//! * `bench-load kv-put ADDR TOKEN CLIENTS SECONDS`: `CLIENTS` keep-alive clients PUT unique
//!   KV keys (`kv/w/<client>/<n>`, 64-byte value, answer 204) to `ADDR` (host:port) for a
//!   warm-up and `SECONDS` measured seconds: `{"rate", "p50", "p99", "errors", "first_error"}`.
//! * `bench-load latency ACTIVE STANDBY TOKEN SECONDS`: one client per node, interleaved
//!   (PUT active, PUT standby, GET active, GET standby, ...), each GET checked against the
//!   value just written: per kind (`wa`, `ws`, `ra`, `rs`) the ops, p50, p99 and errors.
//! * `bench-load read-latency ADDR TOKEN SECONDS`: one client writes one key, then reads it
//!   back for `SECONDS` (each answer checked): `{"ops", "p50", "p99", "errors", "first_error"}`
//!   (for profiling one path on its own).

use cairn_tests::keepalive::KeepAlive;
use cairn_tests::loadgen::{self, MakeOp, Op};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

const VALUE: &str = "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";

fn usage() -> ! {
    eprintln!(
        "usage: bench-load kv-put ADDR TOKEN CLIENTS SECONDS\n       \
         bench-load latency ACTIVE STANDBY TOKEN SECONDS\n       \
         bench-load read-latency ADDR TOKEN SECONDS"
    );
    std::process::exit(2)
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize) -> T {
    args.get(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| usage())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = match args.first().map(String::as_str) {
        Some("kv-put") if args.len() == 5 => kv_put(
            &args[1],
            &args[2],
            arg::<usize>(&args, 3),
            arg::<f64>(&args, 4),
        ),
        Some("latency") if args.len() == 5 => {
            latency(&args[1], &args[2], &args[3], arg::<f64>(&args, 4))
        }
        Some("read-latency") if args.len() == 4 => {
            read_latency(&args[1], &args[2], arg::<f64>(&args, 3))
        }
        _ => usage(),
    };
    println!("{out}");
}

fn kv_put(addr: &str, token: &str, clients: usize, secs: f64) -> Value {
    let token = token.to_string();
    let body = json!({ "value": VALUE }).to_string().into_bytes();
    let make: MakeOp = Arc::new(move |t: usize| -> Op {
        let (token, body) = (token.clone(), body.clone());
        Box::new(move |c: &mut KeepAlive, i| {
            let path = format!("/v1/kv/w/{t}/{i}");
            let r = c.call(
                "PUT",
                &path,
                &[
                    ("X-Vault-Token", &token),
                    ("Content-Type", "application/json"),
                ],
                &body,
            )?;
            if r.status == 204 {
                Ok(())
            } else {
                Err(format!(
                    "PUT {path}: {} {}",
                    r.status,
                    String::from_utf8_lossy(&r.body)
                ))
            }
        })
    });
    let p = loadgen::run(addr, clients, secs, &[], make);
    json!({
        "rate": p.rate(),
        "p50": p.pct(0.5),
        "p99": p.pct(0.99),
        "ok": p.ok,
        "errors": p.errors,
        "first_error": p.samples.first(),
    })
}

/// Latencies of one kind of request and its failures.
#[derive(Default)]
struct Kind {
    lat: Vec<f64>,
    errors: u64,
    first: Option<String>,
}

impl Kind {
    fn record(&mut self, t0: Instant, r: Result<(), String>) {
        match r {
            Ok(()) => self.lat.push(t0.elapsed().as_secs_f64() * 1000.0),
            Err(e) => {
                self.errors += 1;
                self.first.get_or_insert(e);
            }
        }
    }

    fn summary(mut self) -> Value {
        self.lat
            .sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        let pct = |p: f64| {
            if self.lat.is_empty() {
                0.0
            } else {
                self.lat[((self.lat.len() as f64 - 1.0) * p).round() as usize]
            }
        };
        json!({
            "ops": self.lat.len(),
            "p50": pct(0.5),
            "p99": pct(0.99),
            "errors": self.errors,
            "first_error": self.first,
        })
    }
}

fn latency(active: &str, standby: &str, token: &str, secs: f64) -> Value {
    let mut conns = [
        KeepAlive::new(active, Duration::from_secs(10)),
        KeepAlive::new(standby, Duration::from_secs(10)),
    ];
    let headers = [
        ("X-Vault-Token", token),
        ("Content-Type", "application/json"),
    ];
    let body = json!({ "value": VALUE }).to_string().into_bytes();
    let put = |c: &mut KeepAlive, path: &str| -> Result<(), String> {
        let r = c.call("PUT", path, &headers, &body)?;
        match r.status {
            204 => Ok(()),
            s => Err(format!(
                "PUT {path}: {s} {}",
                String::from_utf8_lossy(&r.body)
            )),
        }
    };
    let get = |c: &mut KeepAlive, path: &str| get_value(c, &headers, path);
    // Warm up: one write and one read on each connection.
    for (i, c) in conns.iter_mut().enumerate() {
        let path = format!("/v1/kv/l/{i}/warm");
        let _ = put(c, &path);
        let _ = get(c, &path);
    }
    let mut kinds: [Kind; 4] = Default::default(); // wa, ws, ra, rs
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut n = 0u64;
    while Instant::now() < end {
        for (i, c) in conns.iter_mut().enumerate() {
            let t0 = Instant::now();
            let r = put(c, &format!("/v1/kv/l/{i}/{n}"));
            kinds[i].record(t0, r);
        }
        for (i, c) in conns.iter_mut().enumerate() {
            let t0 = Instant::now();
            let r = get(c, &format!("/v1/kv/l/{i}/{n}"));
            kinds[2 + i].record(t0, r);
        }
        n += 1;
    }
    let [wa, ws, ra, rs] = kinds;
    json!({ "wa": wa.summary(), "ws": ws.summary(), "ra": ra.summary(), "rs": rs.summary() })
}

fn read_latency(addr: &str, token: &str, secs: f64) -> Value {
    let mut c = KeepAlive::new(addr, Duration::from_secs(10));
    let headers = [
        ("X-Vault-Token", token),
        ("Content-Type", "application/json"),
    ];
    let body = json!({ "value": VALUE }).to_string().into_bytes();
    let path = "/v1/kv/read-latency";
    let mut kind = Kind::default();
    if let Err(e) = c.call("PUT", path, &headers, &body) {
        kind.record(Instant::now(), Err(e));
        return kind.summary();
    }
    let end = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        let t0 = Instant::now();
        let r = get_value(&mut c, &headers, path);
        kind.record(t0, r);
    }
    kind.summary()
}

/// GET `path` and check that it holds [`VALUE`].
fn get_value(c: &mut KeepAlive, headers: &[(&str, &str)], path: &str) -> Result<(), String> {
    let r = c.call("GET", path, headers, b"")?;
    let v: Value = serde_json::from_slice(&r.body).map_err(|e| format!("GET {path}: {e}"))?;
    match (r.status, v["data"]["value"].as_str()) {
        (200, Some(VALUE)) => Ok(()),
        (s, _) => Err(format!("GET {path}: {s} {v}")),
    }
}
