//! Cairn patch: bounds on the connections a listener holds, so idle or slow clients cannot
//! take every thread or file descriptor (each connection is served on a thread of its own).
//!
//! A connection is *waiting* while its thread waits for the next request head (a fresh
//! connection, or one kept alive after a response) and *busy* from a complete head until its
//! request was handed on. Waiting connections are closed (their read side shut, so a
//! response still being written is not cut) when they wait longer than
//! [`ConnectionLimits::header_timeout`] (never served yet) or
//! [`ConnectionLimits::idle_timeout`] (served before); and when a new connection arrives with
//! [`ConnectionLimits::max_connections`] held, the one that has waited longest makes room.
//! Only when every held connection is busy is the new one refused (closed at once).

use crate::connection::Connection;
use std::collections::BTreeMap;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The limits of one listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections held at once.
    pub max_connections: usize,
    /// How long a new connection may take to send its first complete request head.
    pub header_timeout: Duration,
    /// How long a connection may stay open between requests.
    pub idle_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 1000,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
        }
    }
}

struct Held {
    /// A second handle on the socket, to shut it from outside its thread.
    sock: Connection,
    /// Since when it waits for a request head (`None`: busy).
    waiting_since: Option<Instant>,
    /// Whether it was served a request before (decides which timeout applies).
    served: bool,
}

/// The connections a listener holds.
pub(crate) struct Registry {
    limits: ConnectionLimits,
    held: Mutex<(u64, BTreeMap<u64, Held>)>,
}

/// Why a new connection was not admitted.
#[derive(Debug)]
pub(crate) struct Full;

impl Registry {
    pub(crate) fn new(limits: ConnectionLimits) -> Arc<Registry> {
        Arc::new(Registry {
            limits,
            held: Mutex::new((0, BTreeMap::new())),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, BTreeMap<u64, Held>)> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a new connection (its id), closing the longest-waiting one to make room when
    /// the listener is full; [`Full`] when every held connection is busy.
    pub(crate) fn admit(&self, sock: &Connection, now: Instant) -> Result<u64, Full> {
        let handle = sock.try_clone().map_err(|_| Full)?;
        let mut g = self.lock();
        if g.1.len() >= self.limits.max_connections.max(1) {
            let oldest = g
                .1
                .iter()
                .filter_map(|(id, h)| h.waiting_since.map(|t| (t, *id)))
                .min();
            match oldest {
                Some((_, id)) => {
                    if let Some(h) = g.1.remove(&id) {
                        let _ = h.sock.shutdown(Shutdown::Read);
                    }
                }
                None => return Err(Full),
            }
        }
        g.0 += 1;
        let id = g.0;
        g.1.insert(
            id,
            Held {
                sock: handle,
                waiting_since: Some(now),
                served: false,
            },
        );
        Ok(id)
    }

    /// Connection `id` has a complete request head.
    pub(crate) fn busy(&self, id: u64) {
        if let Some(h) = self.lock().1.get_mut(&id) {
            h.waiting_since = None;
            h.served = true;
        }
    }

    /// Connection `id` waits for its next request head.
    pub(crate) fn waiting(&self, id: u64, now: Instant) {
        if let Some(h) = self.lock().1.get_mut(&id) {
            h.waiting_since = Some(now);
        }
    }

    /// Connection `id` is gone.
    pub(crate) fn release(&self, id: u64) {
        self.lock().1.remove(&id);
    }

    /// Closes the connections that waited past their timeout; how many.
    pub(crate) fn reap(&self, now: Instant) -> usize {
        let mut g = self.lock();
        let late: Vec<u64> = g
            .1
            .iter()
            .filter(|(_, h)| {
                let limit = if h.served {
                    self.limits.idle_timeout
                } else {
                    self.limits.header_timeout
                };
                h.waiting_since
                    .is_some_and(|t| now.saturating_duration_since(t) > limit)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &late {
            if let Some(h) = g.1.remove(id) {
                let _ = h.sock.shutdown(Shutdown::Read);
            }
        }
        late.len()
    }

    /// Runs [`Registry::reap`] every quarter of the shorter timeout (at most every second)
    /// until `closed`.
    pub(crate) fn spawn_reaper(self: &Arc<Self>, closed: Arc<AtomicBool>) {
        let reg = self.clone();
        let every = (reg.limits.header_timeout.min(reg.limits.idle_timeout) / 4)
            .clamp(Duration::from_millis(50), Duration::from_secs(1));
        let _ = std::thread::Builder::new()
            .name("http-reaper".into())
            .spawn(move || {
                while !closed.load(Ordering::Relaxed) {
                    std::thread::sleep(every);
                    let n = reg.reap(Instant::now());
                    if n > 0 {
                        log::debug!("closed {n} connections that sent no request in time");
                    }
                }
            });
    }
}
