//! A load generator for benchmarks that compare servers phase by phase: concurrent clients,
//! each with one keep-alive connection (`crate::keepalive`), run one checked operation in a
//! loop; a phase records the successful operations' latencies, the failed or wrong answers
//! (never counted in a rate), and the CPU the measured processes used meanwhile
//! (`/proc/<pid>/stat`), so that CPU per request can be compared between servers.

use crate::keepalive::KeepAlive;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One client's operation, given its connection and a number unique within the phase for
/// this client; `Err` says what was wrong with the answer.
pub type Op = Box<dyn FnMut(&mut KeepAlive, u64) -> Result<(), String> + Send>;
/// Makes client `t`'s operation (on the client's thread, one client at a time).
pub type MakeOp = Arc<dyn Fn(usize) -> Op + Send + Sync>;

/// What one phase measured.
#[derive(Debug, Default, Clone)]
pub struct Phase {
    /// Latencies (ms) of the correct answers in the measured window, sorted.
    pub lat: Vec<f64>,
    /// Correct answers in the measured window.
    pub ok: u64,
    /// Failed or wrong answers over the whole phase (set-up and warm-up included).
    pub errors: u64,
    /// The first few error messages.
    pub samples: Vec<String>,
    /// Length of the measured window (s).
    pub secs: f64,
    /// Answers of any kind over the whole phase, for CPU per request.
    pub total: u64,
    /// CPU seconds each measured process used over the whole phase.
    pub cpu: Vec<f64>,
}

impl Phase {
    /// Correct answers per second in the measured window.
    pub fn rate(&self) -> f64 {
        self.ok as f64 / self.secs.max(1e-9)
    }
    /// The `p` quantile (0..=1) of the latencies, in ms.
    pub fn pct(&self, p: f64) -> f64 {
        if self.lat.is_empty() {
            return 0.0;
        }
        self.lat[((self.lat.len() as f64 - 1.0) * p).round() as usize]
    }
    /// CPU microseconds per request of the `i`th measured process.
    pub fn cpu_us(&self, i: usize) -> f64 {
        self.cpu.get(i).copied().unwrap_or(0.0) * 1e6 / (self.total.max(1) as f64)
    }
}

/// CPU seconds (user + system) process `pid` has used so far, from `/proc/<pid>/stat`
/// (0 when it cannot be read).
pub fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The fields after the command name (which may hold spaces and parentheses).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line, 11 and 12 after the name.
    (ticks(11) + ticks(12)) / clock_ticks()
}

/// The kernel's clock ticks per second for `/proc` times (`getconf CLK_TCK`, else 100).
fn clock_ticks() -> f64 {
    static TCK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TCK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// `VmRSS` and `VmHWM` of process `pid` in MiB (0 when unknown).
pub fn rss_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .map(|kib| kib / 1024.0)
            .unwrap_or(0.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Runs `clients` clients against `addr` for a warm-up and then `secs` measured seconds,
/// charging the CPU of `pids` over the whole phase. Clients connect one after the other
/// (each makes one first call before the next starts), so the phase measures the server,
/// not a race of simultaneous connects.
pub fn run(addr: &str, clients: usize, secs: f64, pids: &[u32], make: MakeOp) -> Phase {
    let cpu0: Vec<f64> = pids.iter().map(|&p| cpu_secs(p)).collect();
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let setup = Arc::new(Mutex::new(()));
    let handles: Vec<_> = (0..clients)
        .map(|t| {
            let (measuring, stop, make, setup) =
                (measuring.clone(), stop.clone(), make.clone(), setup.clone());
            let addr = addr.to_string();
            std::thread::spawn(move || {
                let mut conn = KeepAlive::new(&addr, Duration::from_secs(30));
                let mut p = Phase::default();
                let note = |p: &mut Phase, e: String| {
                    p.errors += 1;
                    if p.samples.len() < 3 {
                        p.samples.push(format!("client {t}: {e}"));
                    }
                };
                let mut op = {
                    let _one_at_a_time = setup.lock().unwrap_or_else(|e| e.into_inner());
                    let mut op = make(t);
                    p.total += 1;
                    if let Err(e) = op(&mut conn, 0) {
                        note(&mut p, e);
                    }
                    op
                };
                let mut i = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    let counted = measuring.load(Ordering::Relaxed);
                    let t0 = Instant::now();
                    let r = op(&mut conn, i);
                    let ms = t0.elapsed().as_secs_f64() * 1000.0;
                    i += 1;
                    p.total += 1;
                    match r {
                        Ok(()) if counted && !stop.load(Ordering::Relaxed) => {
                            p.ok += 1;
                            p.lat.push(ms);
                        }
                        Ok(()) => {}
                        Err(e) => note(&mut p, e),
                    }
                }
                p
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64((secs / 5.0).clamp(0.3, 1.0)));
    measuring.store(true, Ordering::Relaxed);
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let window = start.elapsed().as_secs_f64();
    let mut all = Phase {
        secs: window,
        ..Phase::default()
    };
    for h in handles {
        match h.join() {
            Ok(p) => {
                all.lat.extend(p.lat);
                all.ok += p.ok;
                all.errors += p.errors;
                all.total += p.total;
                all.samples
                    .extend(p.samples.into_iter().take(3 - all.samples.len().min(3)));
            }
            Err(_) => {
                all.errors += 1;
                all.samples.push("a client thread panicked".into());
            }
        }
    }
    all.cpu = pids
        .iter()
        .zip(cpu0)
        .map(|(&p, c0)| cpu_secs(p) - c0)
        .collect();
    all.lat
        .sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    all
}

/// `min–max` of `v` with `digits` decimals (`a` alone when they round the same).
pub fn spread(v: &[f64], digits: usize) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if v.is_empty() {
        return "-".into();
    }
    let (a, b) = (format!("{min:.digits$}"), format!("{max:.digits$}"));
    if a == b {
        a
    } else {
        format!("{a}–{b}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_and_quantiles() {
        assert_eq!(spread(&[2.0, 1.04, 3.5], 1), "1.0–3.5");
        assert_eq!(spread(&[2.0, 2.01], 1), "2.0");
        assert_eq!(spread(&[], 1), "-");
        let p = Phase {
            lat: vec![1.0, 2.0, 3.0, 4.0, 5.0],
            ok: 5,
            secs: 2.0,
            total: 10,
            cpu: vec![0.5],
            ..Phase::default()
        };
        assert_eq!(p.pct(0.5), 3.0);
        assert_eq!(p.pct(0.99), 5.0);
        assert_eq!(p.rate(), 2.5);
        assert_eq!(p.cpu_us(0), 50_000.0);
    }

    #[test]
    fn this_process_uses_cpu_and_memory() {
        let me = std::process::id();
        let c0 = cpu_secs(me);
        let mut x = 0u64;
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(60) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
        assert!(cpu_secs(me) > c0, "no CPU time seen for a busy process");
        let (rss, hwm) = rss_mib(me);
        assert!(rss > 0.0 && hwm >= rss);
    }
}
