//! The event log of one run.
//!
//! Every event the driver processes becomes one line `<time> <what happened>`. The lines
//! are hashed (SHA-256 over each line plus a newline) as they are written, so the trace hash
//! of a run identifies it byte for byte: the same seed must give the same hash. The last
//! lines are kept for failure reports; with `--trace` every line is also printed as it is
//! written. The core's log records (INFO and above) become lines too, at the simulated time
//! of the event that produced them ([`Trace::log_core_records`]).

use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::io::Write;

/// How many recent lines a failure report shows.
pub const TAIL: usize = 20;

/// Longest line kept for display (the hash always covers the whole line).
const DISPLAY_MAX: usize = 400;

pub struct Trace {
    hasher: Sha256,
    tail: VecDeque<String>,
    lines: u64,
    print: bool,
}

impl Trace {
    pub fn new(print: bool) -> Trace {
        Trace {
            hasher: Sha256::new(),
            tail: VecDeque::with_capacity(TAIL + 1),
            lines: 0,
            print,
        }
    }

    /// Records one line at simulated time `now_ms`.
    pub fn log(&mut self, now_ms: u64, what: &str) {
        let line = format!("{:>6}.{:03} {what}", now_ms / 1000, now_ms % 1000);
        self.hasher.update(line.as_bytes());
        self.hasher.update(b"\n");
        self.lines += 1;
        let shown = shorten(&line, DISPLAY_MAX);
        if self.print {
            // A closed pipe (`| head`) must not turn into a panic inside the simulation.
            let _ = writeln!(std::io::stdout().lock(), "{shown}");
        }
        if self.tail.len() == TAIL {
            self.tail.pop_front();
        }
        self.tail.push_back(shown);
    }

    /// Writes the core's log records collected since the last call ([`crate::logger`]) as
    /// lines at simulated time `now_ms`. Drivers call it after every event.
    pub fn log_core_records(&mut self, now_ms: u64) {
        for r in crate::logger::take_records() {
            self.log(now_ms, &r);
        }
    }

    /// The most recent lines, oldest first.
    pub fn tail(&self) -> Vec<String> {
        self.tail.iter().cloned().collect()
    }

    pub fn lines(&self) -> u64 {
        self.lines
    }

    /// Hex SHA-256 of every line so far.
    pub fn hash(&self) -> String {
        hex::encode(self.hasher.clone().finalize())
    }
}

/// Cuts `s` to at most `max` bytes on a character boundary, marking the cut.
pub fn shorten(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_depends_on_every_line_and_tail_is_bounded() {
        let mut a = Trace::new(false);
        let mut b = Trace::new(false);
        for i in 0..50 {
            a.log(i, &format!("event {i}"));
            b.log(i, &format!("event {i}"));
        }
        assert_eq!(a.hash(), b.hash());
        assert_eq!(a.tail().len(), TAIL);
        assert!(a.tail()[TAIL - 1].ends_with("event 49"));
        b.log(50, "one more");
        assert_ne!(a.hash(), b.hash());
        assert_eq!(shorten("héllo", 2), "h…");
    }
}
