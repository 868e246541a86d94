//! The seeded in-memory network.
//!
//! Everything that travels between parties of a simulated world goes through
//! [`Network::route`]: client requests to nodes, responses back, and (later) peer messages
//! between nodes for replication. The network decides, from its own random stream, whether
//! a message arrives and after how long; the world then puts the delivery in its event
//! queue. Each directed link has its own settings ([`Link`]): mean delay, loss, FIFO order,
//! and whether it is cut (a partition). Messages on a non-FIFO link can overtake each other.
//!
//! Client links are reliable by default: a response lost after its batch committed would
//! make the operator forget key shares or tokens that exist, which is an operator disaster
//! rather than a bug worth finding. Loss and partitions are meant for peer links.

use crate::rng::SimRng;
use cairn_core::api::RequestId;
use cairn_core::{Admin, AdminAnswer, Request, Response};
use std::collections::BTreeMap;

pub type HostId = usize;
pub type ClientId = usize;

/// A party on the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Addr {
    Host(HostId),
    Client(ClientId),
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Host(h) => write!(f, "n{h}"),
            Addr::Client(c) => write!(f, "c{c}"),
        }
    }
}

/// What a message carries.
#[derive(Debug, Clone)]
pub enum Payload {
    /// An API request from a client to a node.
    Request(Request),
    /// A command of the node's own process (dev set-up), from the operator.
    Admin { id: RequestId, admin: Admin },
    /// An API response back to the client.
    Response(Response),
    /// The result of an [`Payload::Admin`] command.
    AdminDone { id: RequestId, result: AdminAnswer },
    /// The request never got an answer: the node was down or crashed before committing.
    Refused { id: RequestId, why: String },
}

/// Settings of one directed link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// Mean one-way delay in ms.
    pub delay_mean: u64,
    /// Probability of losing a message, per mille.
    pub loss_permille: u64,
    /// Deliver in send order (a stream connection) instead of letting messages overtake.
    pub fifo: bool,
    /// False while the link is cut by a partition: every message is dropped.
    pub up: bool,
}

/// The network's verdict on one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Arrives after this many ms.
    Deliver(u64),
    /// Never arrives.
    Lost(&'static str),
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    pub sent: u64,
    pub lost: u64,
}

pub struct Network {
    rng: SimRng,
    default_link: Link,
    links: BTreeMap<(Addr, Addr), Link>,
    /// Latest delivery time scheduled per FIFO link.
    fifo_last: BTreeMap<(Addr, Addr), u64>,
    stats: NetStats,
}

impl Network {
    pub fn new(rng: SimRng, default_link: Link) -> Network {
        Network {
            rng,
            default_link,
            links: BTreeMap::new(),
            fifo_last: BTreeMap::new(),
            stats: NetStats::default(),
        }
    }

    pub fn link(&self, from: Addr, to: Addr) -> Link {
        self.links
            .get(&(from, to))
            .copied()
            .unwrap_or(self.default_link)
    }

    pub fn set_link(&mut self, from: Addr, to: Addr, link: Link) {
        self.links.insert((from, to), link);
    }

    /// Cuts both directions between `a` and `b`.
    pub fn partition(&mut self, a: Addr, b: Addr) {
        for (x, y) in [(a, b), (b, a)] {
            let mut l = self.link(x, y);
            l.up = false;
            self.set_link(x, y, l);
        }
    }

    /// Restores every link to the default settings.
    pub fn heal_all(&mut self) {
        self.links.clear();
    }

    pub fn stats(&self) -> NetStats {
        self.stats
    }

    /// Decides the fate of one message sent at `now` from `from` to `to`.
    pub fn route(&mut self, now: u64, from: Addr, to: Addr) -> Route {
        self.stats.sent += 1;
        let link = self.link(from, to);
        if !link.up {
            self.stats.lost += 1;
            return Route::Lost("partitioned");
        }
        if link.loss_permille > 0 && self.rng.chance(link.loss_permille) {
            self.stats.lost += 1;
            return Route::Lost("lost");
        }
        let mut at = now + self.rng.delay(link.delay_mean);
        if link.fifo {
            let last = self.fifo_last.entry((from, to)).or_insert(0);
            at = at.max(*last);
            *last = at;
        }
        Route::Deliver(at - now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_drop_and_fifo_keeps_order() {
        let link = Link {
            delay_mean: 5,
            loss_permille: 0,
            fifo: true,
            up: true,
        };
        let mut n = Network::new(SimRng::derive(1, "net"), link);
        let (a, b) = (Addr::Host(0), Addr::Host(1));
        let mut last = 0;
        for t in 0..100 {
            let Route::Deliver(d) = n.route(t, a, b) else {
                panic!("reliable link lost a message")
            };
            assert!(t + d >= last);
            last = t + d;
        }
        n.partition(a, b);
        assert_eq!(n.route(200, b, a), Route::Lost("partitioned"));
        n.heal_all();
        assert!(matches!(n.route(300, b, a), Route::Deliver(_)));
    }
}
