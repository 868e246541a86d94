//! What the growth-curve benchmarks (`tests/src/bin/bench-growth-*.rs`) share: size lists
//! given on the command line (`100k,1M,5M`), a table kept as Markdown and CSV at once, and
//! the figure drawn from that CSV with `scripts/plot.py`. The CSV and SVG go to
//! `GROWTH_OUT` (default `tests/figures/` of the repository).

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Parses `1k,10k,100k,1M` (k = 1,000, M = 1,000,000; plain numbers too); `default` when the
/// argument is missing, none when it is empty (`""` skips a curve).
pub fn sizes(arg: Option<&String>, default: &[u64]) -> Vec<u64> {
    let Some(a) = arg else {
        return default.to_vec();
    };
    if a.trim().is_empty() {
        return Vec::new();
    }
    a.split(',')
        .map(|s| {
            let s = s.trim();
            let (num, mul) = match s.chars().last() {
                Some('k' | 'K') => (&s[..s.len() - 1], 1_000),
                Some('m' | 'M') => (&s[..s.len() - 1], 1_000_000),
                _ => (s, 1),
            };
            num.parse::<u64>()
                .map(|n| n * mul)
                .unwrap_or_else(|_| panic!("not a size: {s:?} (e.g. 100k, 1M, 5000)"))
        })
        .collect()
}

/// `n` written short: 5M, 100k, 35.
pub fn short(n: u64) -> String {
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}M", n / 1_000_000)
    } else if n >= 1_000 && n.is_multiple_of(1_000) {
        format!("{}k", n / 1_000)
    } else {
        n.to_string()
    }
}

/// The `p` quantile (0..=1) of `v` (sorted here), 0 when empty.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Calls `f` every 2 ms until it says yes; panics after `secs` naming `what`.
pub fn wait(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    panic!("timed out waiting for {what}");
}

/// Where the figures go: `GROWTH_OUT`, else `tests/figures/`.
pub fn out_dir() -> PathBuf {
    let d = std::env::var_os("GROWTH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join("tests").join("figures"));
    std::fs::create_dir_all(&d).expect("create the figures directory");
    d
}

/// One curve's table: columns with a Markdown title and a CSV name each; rows of numbers or
/// words. Printed as Markdown, written as `<name>.csv`.
pub struct Table {
    name: String,
    columns: Vec<(String, String)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// `columns`: (CSV name, Markdown title).
    pub fn new(name: &str, columns: &[(&str, &str)]) -> Table {
        Table {
            name: name.to_string(),
            columns: columns
                .iter()
                .map(|(c, t)| (c.to_string(), t.to_string()))
                .collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (as many cells as columns) and prints the table so far to stderr, so a
    /// long run shows its progress.
    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(cells.len(), self.columns.len(), "{}: row width", self.name);
        eprintln!("{}: {}", self.name, cells.join(" | "));
        self.rows.push(cells);
    }

    /// The table in Markdown (numbers right-aligned).
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "| {} |\n|{}\n",
            self.columns
                .iter()
                .map(|c| c.1.as_str())
                .collect::<Vec<_>>()
                .join(" | "),
            "---:|".repeat(self.columns.len())
        );
        for r in &self.rows {
            s.push_str(&format!("| {} |\n", r.join(" | ")));
        }
        s
    }

    /// Writes `<out>/<name>.csv` and returns its path.
    pub fn write_csv(&self) -> PathBuf {
        let path = out_dir().join(format!("{}.csv", self.name));
        let mut s = self
            .columns
            .iter()
            .map(|c| c.0.as_str())
            .collect::<Vec<_>>()
            .join(",");
        s.push('\n');
        for r in &self.rows {
            s.push_str(&r.join(","));
            s.push('\n');
        }
        std::fs::write(&path, s).expect("write the CSV");
        path
    }

    /// Prints the table, writes the CSV and draws `<name>.svg` from it with
    /// `scripts/plot.py ARGS` (e.g. `--x keys --y rss_mib --logx`).
    pub fn finish(&self, plot_args: &[&str]) {
        println!("{}", self.markdown());
        self.write_csv();
        self.plot("", plot_args);
    }

    /// Draws `<name><suffix>.svg` from the CSV written by [`Table::finish`].
    pub fn plot(&self, suffix: &str, plot_args: &[&str]) {
        let csv = out_dir().join(format!("{}.csv", self.name));
        let svg = out_dir().join(format!("{}{suffix}.svg", self.name));
        let ok = std::process::Command::new("python3")
            .arg(crate::repo_root().join("scripts").join("plot.py"))
            .arg(&csv)
            .arg(&svg)
            .args(plot_args)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            println!("figure: {} (data: {})", svg.display(), csv.display());
        } else {
            println!("plot.py failed; data: {}", csv.display());
        }
    }
}

/// A number for a CSV cell and a table: `digits` decimals.
pub fn num(v: f64, digits: usize) -> String {
    format!("{v:.digits$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_k_and_m() {
        let a = "1k, 10k,2M,35".to_string();
        assert_eq!(sizes(Some(&a), &[]), vec![1_000, 10_000, 2_000_000, 35]);
        assert_eq!(sizes(None, &[7]), vec![7]);
        assert!(sizes(Some(&String::new()), &[7]).is_empty());
        assert_eq!(short(5_000_000), "5M");
        assert_eq!(short(100_000), "100k");
        assert_eq!(short(35), "35");
    }
}
