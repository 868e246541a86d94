//! Replay protection for forwarded requests.
//!
//! A standby's signature over a forwarded request ([`super::route::mac`]) also covers a
//! [`Stamp`]: the lease epoch of the active node it forwards to, the id of the path that
//! sends it (fresh and random for every route the node publishes, and one per process for
//! the node's own path) and that sender's sequence number. The active node takes each stamp
//! once ([`Seen::take`]): only of its own epoch (a forward captured under an earlier active
//! node is refused by every later one), and only a sequence number its sender has not used,
//! within a window of the sender's latest ones (forwards travel on several connections at
//! once, so they may arrive a little out of order). A number below the window may never have
//! been taken (a forward held up by a slow connect or a large body while a window of later
//! ones overtook it): it is refused as [`Verdict::Stale`], which the standby's driver treats as
//! a refusal (nothing applied: it sends the request again under a new number), never as a
//! replay, so a client never gets a replay's 403 for a request that was not applied.
//!
//! What is remembered is bounded: [`WINDOW`] numbers per sender, [`MAX_SENDERS`] senders
//! (the least recently heard from is forgotten first; only an unsealed node of the cluster
//! can make a sender, by signing with the cluster's key). Everything is forgotten when the
//! node's role changes: its epoch changes with it, and with the epoch every earlier stamp.

use std::collections::{BTreeMap, BTreeSet};

/// How many of a sender's latest sequence numbers the active node remembers.
pub const WINDOW: u64 = 4096;
/// How many senders the active node remembers.
pub const MAX_SENDERS: usize = 1024;
/// Longest sender id accepted.
const MAX_SENDER_LEN: usize = 64;

/// What a forward's signature names besides the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// The lease epoch of the active node the forward is meant for.
    pub epoch: u64,
    /// The sending path: lowercase hex, at most 64 characters.
    pub sender: String,
    /// The sender's sequence number.
    pub seq: u64,
}

impl Stamp {
    /// The bytes the signature covers (after the request's own).
    pub fn signed_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.sender.len() + 40);
        v.extend_from_slice(b"|stamp|");
        v.extend_from_slice(&self.epoch.to_be_bytes());
        v.extend_from_slice(&(self.sender.len() as u64).to_be_bytes());
        v.extend_from_slice(self.sender.as_bytes());
        v.extend_from_slice(&self.seq.to_be_bytes());
        v
    }

    /// The `forwarded` value of a request: the stamp and the signature.
    pub fn render(&self, mac: &str) -> String {
        format!("{}.{}.{}.{mac}", self.epoch, self.sender, self.seq)
    }

    /// The stamp and the signature of a `forwarded` value; `None` when it is malformed.
    pub fn parse(forwarded: &str) -> Option<(Stamp, &str)> {
        let mut parts = forwarded.splitn(4, '.');
        let epoch = number(parts.next()?)?;
        let sender = parts.next()?;
        let seq = number(parts.next()?)?;
        let mac = parts.next()?;
        let hex = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if sender.is_empty() || sender.len() > MAX_SENDER_LEN || !hex(sender) || !hex(mac) {
            return None;
        }
        Some((
            Stamp {
                epoch,
                sender: sender.to_string(),
                seq,
            },
            mac,
        ))
    }
}

/// A decimal number with no sign, no leading zero and no overflow.
fn number(s: &str) -> Option<u64> {
    if s.is_empty() || (s.len() > 1 && s.starts_with('0')) || !s.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    s.parse().ok()
}

/// What the active node makes of a correctly signed stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not seen before: the forward is served.
    Fresh,
    /// Made for another epoch: this node is not (or no longer) the active node it was
    /// meant for.
    OtherEpoch,
    /// Seen before: refused.
    Replayed,
    /// Below the sender's window, so too old to tell whether it was taken: refused, and
    /// nothing applied, but not as a replay (it may be a late forward that was never taken;
    /// its standby sends it again under a new number).
    Stale,
}

/// One sender's window.
#[derive(Debug, Clone, Default)]
struct Window {
    /// The sequence numbers taken, at most [`WINDOW`] of them, the highest last.
    taken: BTreeSet<u64>,
    /// When it was last heard from ([`Seen`]'s counter).
    used: u64,
}

/// The stamps an active node has taken.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    senders: BTreeMap<String, Window>,
    clock: u64,
}

impl Seen {
    /// Takes `stamp` for a node active under `epoch` (`None`: not active).
    pub fn take(&mut self, epoch: Option<u64>, stamp: &Stamp) -> Verdict {
        if epoch != Some(stamp.epoch) {
            return Verdict::OtherEpoch;
        }
        self.clock += 1;
        if !self.senders.contains_key(&stamp.sender) && self.senders.len() >= MAX_SENDERS {
            let oldest = self
                .senders
                .iter()
                .min_by_key(|(_, w)| w.used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.senders.remove(&k);
            }
        }
        let w = self.senders.entry(stamp.sender.clone()).or_default();
        w.used = self.clock;
        let top = w.taken.last().copied();
        // Below the window: its number may have been taken and forgotten, or never taken.
        if let Some(top) = top {
            if stamp.seq.saturating_add(WINDOW) <= top {
                return Verdict::Stale;
            }
        }
        if !w.taken.insert(stamp.seq) {
            return Verdict::Replayed;
        }
        while let Some(&low) = w.taken.first() {
            let high = w.taken.last().copied().unwrap_or(low);
            if low.saturating_add(WINDOW) > high {
                break;
            }
            w.taken.pop_first();
        }
        Verdict::Fresh
    }

    /// Forgets everything (the node's role changed).
    pub fn clear(&mut self) {
        self.senders.clear();
    }

    /// How many senders are remembered.
    pub fn senders(&self) -> usize {
        self.senders.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck::quickcheck;

    fn stamp(epoch: u64, sender: &str, seq: u64) -> Stamp {
        Stamp {
            epoch,
            sender: sender.into(),
            seq,
        }
    }

    #[test]
    fn a_stamp_is_taken_once_and_only_in_its_epoch() {
        let mut s = Seen::default();
        assert_eq!(s.take(Some(3), &stamp(3, "ab", 0)), Verdict::Fresh);
        assert_eq!(s.take(Some(3), &stamp(3, "ab", 0)), Verdict::Replayed);
        assert_eq!(s.take(Some(3), &stamp(3, "cd", 0)), Verdict::Fresh);
        assert_eq!(s.take(Some(4), &stamp(3, "ab", 1)), Verdict::OtherEpoch);
        assert_eq!(s.take(None, &stamp(3, "ab", 1)), Verdict::OtherEpoch);
        // Out of order within the window is fine; below it is refused.
        assert_eq!(s.take(Some(3), &stamp(3, "ab", 5)), Verdict::Fresh);
        assert_eq!(s.take(Some(3), &stamp(3, "ab", 2)), Verdict::Fresh);
        assert_eq!(s.take(Some(3), &stamp(3, "ab", 5 + WINDOW)), Verdict::Fresh);
        assert_eq!(s.take(Some(3), &stamp(3, "ab", 4)), Verdict::Stale);
        assert_eq!(
            s.take(Some(3), &stamp(3, "ab", 3)),
            Verdict::Stale,
            "never taken"
        );
        assert_eq!(s.take(Some(3), &stamp(3, "ab", 6)), Verdict::Fresh);
        assert_eq!(s.take(Some(3), &stamp(3, "ab", 6)), Verdict::Replayed);
    }

    #[test]
    fn senders_are_bounded() {
        let mut s = Seen::default();
        for i in 0..(MAX_SENDERS + 10) {
            assert_eq!(
                s.take(Some(1), &stamp(1, &format!("{i:x}"), 0)),
                Verdict::Fresh
            );
        }
        assert_eq!(s.senders(), MAX_SENDERS);
    }

    #[test]
    fn forwarded_values_parse_strictly() {
        let st = stamp(7, "0a1b", 42);
        let v = st.render("ff00");
        assert_eq!(Stamp::parse(&v), Some((st, "ff00")));
        for bad in [
            "",
            "ff00",
            "7.0a1b.42",
            "07.0a1b.42.ff",
            "7..42.ff",
            "7.0A1B.42.ff",
            "7.0a1b.-1.ff",
            "7.0a1b.42.zz",
            "18446744073709551616.a.1.ff",
            "7.0a1b.42.ff.00",
        ] {
            assert_eq!(Stamp::parse(bad), None, "{bad:?}");
        }
    }

    quickcheck! {
        /// Whatever order a sender's numbers come in, each is taken at most once, every
        /// number within the window of the highest one so far is taken the first time, and
        /// only a number taken before is called a replay (one below the window is stale).
        fn each_number_is_taken_at_most_once(seqs: Vec<u16>) -> bool {
            let mut s = Seen::default();
            let mut taken = std::collections::BTreeSet::new();
            let mut top: Option<u64> = None;
            for q in seqs {
                let q = u64::from(q);
                let v = s.take(Some(1), &stamp(1, "a", q));
                let below = top.is_some_and(|t| q.saturating_add(WINDOW) <= t);
                let expect = if below {
                    Verdict::Stale
                } else if taken.contains(&q) {
                    Verdict::Replayed
                } else {
                    Verdict::Fresh
                };
                if v != expect {
                    return false;
                }
                if v == Verdict::Fresh {
                    taken.insert(q);
                    top = Some(top.map_or(q, |t| t.max(q)));
                }
            }
            true
        }
    }
}
