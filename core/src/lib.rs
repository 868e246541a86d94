//! cairn-core: the deterministic heart of Cairn. No threads, sockets, clocks or OS
//! randomness: a [`Node`] is driven by inputs carrying the time and emits outputs.

// No panics on request paths: outside tests, `unwrap`, `expect` and `panic!` are refused
// (the fuzz and isolation harnesses, whose panics are their findings, opt out).
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod admin;
pub mod api;
pub mod audit;
pub mod auth;
pub mod crypto;
pub mod ctx;
#[doc(hidden)]
pub mod fuzzing;
pub mod generate_root;
pub mod ha;
pub mod help;
#[doc(hidden)]
pub mod identity;
pub mod isolation;
pub mod kv;
pub mod kv2;
pub mod leases;
pub mod license;
pub mod metrics;
#[cfg(test)]
mod model_tests;
pub mod mounts;
pub mod namespace;
pub mod node;
pub mod policy;
pub mod reads;
pub mod remount;
pub mod replication;
pub mod router;
pub mod routes;
pub mod seal;
pub mod server_config;
pub mod snapshot;
pub mod storage;
pub mod sys;
pub mod time;
pub mod token;
pub mod wrapping;

pub use admin::{Admin, AdminAnswer, AdminId, AdminResult, DevKeys};
pub use api::{Method, Request, Response};
pub use node::{Input, Node, NodeConfig, Output, SnapshotSave};
pub use storage::{MemStorage, Storage, StorageError, Write};
