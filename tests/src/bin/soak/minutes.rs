//! The soak's per-minute samples: each server's RSS and open file descriptors, and each
//! operation's count, errors and p99 latency over the minute, appended to
//! `soak-minutes.csv` in the output directory as they are taken (a stopped run keeps what
//! it sampled); and the level-off verdict at the end.

use super::Stats;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A column name from a label: lower case, runs of anything but letters and digits as `_`.
fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('_') {
            out.push('_');
        }
    }
    out.trim_matches('_').to_string()
}

/// One sample of the servers.
struct Row {
    minute: f64,
    rss_kib: Vec<u64>,
    fds: Vec<usize>,
}

pub struct Minutes {
    pub path: PathBuf,
    file: Option<std::fs::File>,
    servers: Vec<String>,
    rows: Vec<Row>,
}

/// Whether RSS and fds levelled off, and the lines saying so.
pub struct Level {
    pub flat: bool,
    pub text: String,
}

impl Minutes {
    /// Creates `soak-minutes.csv` in `dir` with its header.
    pub fn create(dir: &Path, servers: &[(&str, u32)], ops: &[&str]) -> Minutes {
        let path = dir.join("soak-minutes.csv");
        let mut header = vec!["minute".to_string()];
        for (name, _) in servers {
            header.push(format!("{}_rss_mib", slug(name)));
        }
        for (name, _) in servers {
            header.push(format!("{}_fds", slug(name)));
        }
        for op in ops {
            let o = slug(op);
            header.push(format!("{o}_count"));
            header.push(format!("{o}_errors"));
            header.push(format!("{o}_p99_ms"));
        }
        let file = std::fs::File::create(&path)
            .and_then(|mut f| writeln!(f, "{}", header.join(",")).map(|()| f))
            .map_err(|e| eprintln!("soak: cannot write {}: {e}", path.display()))
            .ok();
        Minutes {
            path,
            file,
            servers: servers.iter().map(|(n, _)| n.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Takes the sample at `el_secs` into the measured time: `usage` per server, and each
    /// operation's window (emptied).
    pub fn sample(&mut self, el_secs: u64, usage: &[(u64, usize)], stats: &[Arc<Mutex<Stats>>]) {
        let minute = el_secs as f64 / 60.0;
        let mut cells = vec![format!("{minute:.2}")];
        for (rss, _) in usage {
            cells.push(format!("{:.1}", *rss as f64 / 1024.0));
        }
        for (_, fds) in usage {
            cells.push(fds.to_string());
        }
        for st in stats {
            let (mut w, errors) = {
                let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
                (
                    std::mem::take(&mut s.window_ms),
                    std::mem::take(&mut s.window_errors),
                )
            };
            w.sort_by(|a, b| a.total_cmp(b));
            cells.push(w.len().to_string());
            cells.push(errors.to_string());
            cells.push(format!("{:.2}", super::pct(&w, 0.99)));
        }
        if let Some(f) = &mut self.file {
            if let Err(e) = writeln!(f, "{}", cells.join(",")) {
                eprintln!("soak: cannot append to {}: {e}", self.path.display());
            }
        }
        println!(
            "soak: minute {minute:.1}: RSS MiB / fds: {}",
            usage
                .iter()
                .map(|(r, f)| format!("{:.1}/{f}", *r as f64 / 1024.0))
                .collect::<Vec<_>>()
                .join(", ")
        );
        self.rows.push(Row {
            minute,
            rss_kib: usage.iter().map(|u| u.0).collect(),
            fds: usage.iter().map(|u| u.1).collect(),
        });
    }

    /// Growth of RSS and fds over the last 30 minutes (runs of 60 minutes or more) or the
    /// last half of the run: the least-squares line through the window's samples, its rise
    /// over the window against its value at the window's start; level when below 2 %. (A
    /// line through every sample, not the first few against the last few: RSS moves up and
    /// down by a few percent from minute to minute, and two ends of such a series compare
    /// the noise as much as the trend; that comparison is printed too.)
    pub fn level_off(&self, secs: u64) -> Level {
        let Some(last) = self.rows.last() else {
            return Level {
                flat: true,
                text: "level-off: no per-minute sample (run shorter than a minute)\n".into(),
            };
        };
        let span = if secs >= 3600 {
            30.0
        } else {
            secs as f64 / 120.0
        };
        let from = last.minute - span;
        let win: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| r.minute >= from - 1e-9)
            .collect();
        if win.len() < 2 {
            return Level {
                flat: true,
                text: format!(
                    "level-off: only {} sample(s) in the last {span:.1} minutes: too short to tell\n",
                    win.len()
                ),
            };
        }
        let k = (win.len() / 2).clamp(1, 3);
        let mean = |rows: &[&Row], f: &dyn Fn(&Row) -> f64| {
            rows.iter().map(|r| f(r)).sum::<f64>() / rows.len() as f64
        };
        let mut flat = true;
        let mut text = format!(
            "level-off over minutes {:.1}–{:.1} (least-squares trend over the window; level: growth < 2 %; in brackets the mean of the last {k} samples against the first {k}):\n",
            win[0].minute, last.minute
        );
        for (i, name) in self.servers.iter().enumerate() {
            let rss = |r: &Row| r.rss_kib[i] as f64 / 1024.0;
            let fds = |r: &Row| r.fds[i] as f64;
            for (what, f, unit) in [
                ("RSS", &rss as &dyn Fn(&Row) -> f64, " MiB"),
                ("fds", &fds as &dyn Fn(&Row) -> f64, ""),
            ] {
                let (start, end) = trend(&win, f);
                let growth = if start > 0.0 {
                    (end - start) / start * 100.0
                } else {
                    0.0
                };
                let a = mean(&win[..k], f);
                let b = mean(&win[win.len() - k..], f);
                let ends = if a > 0.0 { (b - a) / a * 100.0 } else { 0.0 };
                let ok = growth < 2.0;
                flat &= ok;
                text.push_str(&format!(
                    "  {name} {what}: trend {start:.1}{unit} → {end:.1}{unit} ({growth:+.2} %) [ends {a:.1} → {b:.1}: {ends:+.2} %]: {}\n",
                    if ok { "level" } else { "STILL GROWING" }
                ));
            }
        }
        text.push_str(&format!(
            "level-off: {}\n",
            if flat {
                "RSS and fds levelled off"
            } else {
                "NOT level"
            }
        ));
        Level { flat, text }
    }
}

/// The least-squares line through `f` of the rows against their minute: its values at the
/// first and the last row's minute.
fn trend(rows: &[&Row], f: &dyn Fn(&Row) -> f64) -> (f64, f64) {
    let n = rows.len() as f64;
    let mx = rows.iter().map(|r| r.minute).sum::<f64>() / n;
    let my = rows.iter().map(|r| f(r)).sum::<f64>() / n;
    let sxx: f64 = rows.iter().map(|r| (r.minute - mx).powi(2)).sum();
    let sxy: f64 = rows.iter().map(|r| (r.minute - mx) * (f(r) - my)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let at = |x: f64| my + slope * (x - mx);
    match (rows.first(), rows.last()) {
        (Some(a), Some(b)) => (at(a.minute), at(b.minute)),
        _ => (my, my),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An hour of samples of one server: RSS in MiB per minute from `rss`, fds 30.
    fn hour(rss: impl Fn(f64) -> f64) -> Minutes {
        Minutes {
            path: PathBuf::new(),
            file: None,
            servers: vec!["primary".into()],
            rows: (1..=60)
                .map(|m| Row {
                    minute: m as f64,
                    rss_kib: vec![(rss(m as f64) * 1024.0) as u64],
                    fds: vec![30],
                })
                .collect(),
        }
    }

    #[test]
    fn noise_around_a_level_is_level_and_a_steady_rise_is_not() {
        // RSS swinging by ±6 MiB around 48 MiB: the window's last three samples average
        // more than 2 % above its first three, but the series does not rise.
        let swing = |m: f64| 48.0 + 6.0 * (1.3 * m).sin();
        let ends = |ms: [f64; 3]| ms.iter().map(|m| swing(*m)).sum::<f64>() / 3.0;
        assert!(ends([58.0, 59.0, 60.0]) > 1.02 * ends([30.0, 31.0, 32.0]));
        let v = hour(swing).level_off(3600);
        assert!(v.flat, "{}", v.text);
        // 0.1 MiB a minute from 48 MiB: +6 % over the last 30 minutes.
        let v = hour(|m| 45.0 + 0.1 * m).level_off(3600);
        assert!(!v.flat, "{}", v.text);
        assert!(v.text.contains("STILL GROWING"), "{}", v.text);
        // Flat: level.
        assert!(hour(|_| 40.0).level_off(3600).flat);
    }
}
