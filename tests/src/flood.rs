//! Connection floods for the listener tests (`tests/tests/floods.rs`,
//! `tests/tests/cluster_floods.rs`): idle connections that never send a byte, slow ones that
//! begin a request or handshake and never finish it, the server's threads and descriptors
//! while they are held, and whether the slow ones were closed.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;

/// Threads and open descriptors of process `pid`.
pub fn threads_and_fds(pid: u32) -> (usize, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let threads = status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    (threads, fds)
}

/// The connections of one flood.
pub struct Flood {
    /// Connected, never a byte sent.
    pub idle: Vec<TcpStream>,
    /// Each sent the first bytes of a request or handshake, and nothing more (yet).
    pub slow: Vec<TcpStream>,
}

impl Flood {
    /// Opens `idle` idle connections to `addr`, then `slow` that each send `first`.
    pub fn open(addr: &str, idle: usize, slow: usize, first: &[u8]) -> Flood {
        let idle = (0..idle)
            .map(|_| TcpStream::connect(addr).expect("idle connect"))
            .collect();
        let slow = (0..slow)
            .map(|_| {
                let mut c = TcpStream::connect(addr).expect("slow connect");
                let _ = c.write_all(first);
                c
            })
            .collect();
        Flood { idle, slow }
    }

    /// Sends `bytes` more on every slow connection (a server may have closed some).
    pub fn trickle(&mut self, bytes: &[u8]) {
        for c in self.slow.iter_mut() {
            let _ = c.write_all(bytes);
        }
    }

    /// How many slow connections the server closed: end of stream or a reset, perhaps after
    /// an answer or an alert; one still open answers nothing within 50 ms.
    pub fn slow_closed(&mut self) -> usize {
        let mut closed = 0;
        for c in self.slow.iter_mut() {
            c.set_read_timeout(Some(std::time::Duration::from_millis(50)))
                .ok();
            let mut b = [0u8; 64];
            for _ in 0..4 {
                match c.read(&mut b) {
                    Ok(0) => {
                        closed += 1;
                        break;
                    }
                    Ok(_) => continue,
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        break
                    }
                    Err(_) => {
                        closed += 1;
                        break;
                    }
                }
            }
        }
        closed
    }
}

/// Asserts that process `pid` holds threads and descriptors bounded by the listener's limit
/// `max` (not by the flood's size), given what it held before (`before`).
pub fn assert_bounded(pid: u32, before: (usize, usize), max: usize, what: &str) {
    let (threads0, fds0) = before;
    let (threads, fds) = threads_and_fds(pid);
    eprintln!(
        "{what}: before {threads0} threads / {fds0} fds; during the flood {threads} threads / \
         {fds} fds (limit {max} connections)"
    );
    // Threads of closed connections go back to the pool a moment after their socket is shut,
    // so the pool may briefly hold more threads than connections; never as many as the flood.
    assert!(
        threads < threads0 + 2 * max,
        "{what}: threads grew to {threads} (from {threads0}) with a limit of {max} connections"
    );
    // Each held connection: its read and write handles and the listener's handle on it.
    assert!(
        fds < fds0 + 3 * max + 50,
        "{what}: descriptors grew to {fds} (from {fds0}) with a limit of {max} connections"
    );
}
