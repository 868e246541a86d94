//! `cairn`: the server and its command-line client in one binary.

// No panics on request paths: outside tests, `unwrap`, `expect` and `panic!` are refused.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod audit_file;
mod cli;
mod cluster;
mod config;
mod framing;
mod http;
mod latency;
mod ldap;
mod logger;
mod runtime;
mod server;
mod sqlite;

use clap::{Parser, Subcommand};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "cairn",
    version,
    about = "Cairn: LDAP login and cluster replication with a Vault-compatible API"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the server.
    Server(server::ServerArgs),
    #[command(flatten)]
    Client(cli::Command),
}

fn main() {
    // Usage errors exit 1 (local error); help and version exit 0.
    let cli = match Cli::try_parse_from(cli::normalize_args(std::env::args_os())) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            std::process::exit(if e.use_stderr() { 1 } else { 0 });
        }
    };
    let code = match cli.cmd {
        Cmd::Server(a) => server::run(a),
        Cmd::Client(c) => cli::run(c),
    };
    std::process::exit(code);
}
