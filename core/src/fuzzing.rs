//! Hostile-input entry points: each function takes arbitrary bytes, feeds them to one decoder
//! (or to a whole node over in-memory storage) and panics only when a promise the service
//! makes about hostile input is broken, never merely because the input is invalid. The
//! cargo-fuzz targets in `core/fuzz/` call these; the tests (`fuzzing/tests.rs`) run the same
//! functions on the committed corpora and on a ChaCha-seeded generator so `cargo test`
//! exercises them on stable. Not an API: hidden from the docs and free to change.
//!
//! This module owns the byte reader the targets share; each family of targets has its own
//! submodule, and [`harness`] holds the in-memory node they drive (built once per thread
//! and cloned for every input, so inputs are independent and cheap).
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)] // a broken promise panics: that is the finding

mod forwarded;
mod harness;
mod kv2;
mod ldap;
mod policy;
mod replication;
mod requests;
mod seal;
mod server_config;
mod snapshot_file;

pub use forwarded::forwarded_request;
pub use harness::{check_response, Harness, ENDPOINTS};
pub use kv2::kv2_bodies;
pub use ldap::ldap_filter;
pub use policy::policy;
pub use replication::{activation, peer_msg};
pub use requests::{json_bodies, router};
pub use seal::shamir;
pub use server_config::server_config;
pub use snapshot_file::snapshot_file;

/// Reads structured values off the front of fuzz bytes; past the end everything is empty.
pub struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes(data)
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
    /// A chunk prefixed by a one-byte length.
    pub fn chunk(&mut self) -> &'a [u8] {
        let n = usize::from(self.byte());
        self.take(n)
    }
    /// A chunk prefixed by a two-byte (little-endian) length.
    pub fn long_chunk(&mut self) -> &'a [u8] {
        let n = usize::from(self.byte()) | usize::from(self.byte()) << 8;
        self.take(n)
    }
    pub fn string(&mut self) -> String {
        String::from_utf8_lossy(self.chunk()).into_owned()
    }
    pub fn rest(&mut self) -> &'a [u8] {
        self.take(self.0.len())
    }
}

#[cfg(test)]
mod tests;
