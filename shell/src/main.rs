//! `cairn`: the server and its command-line client in one binary.

mod config;
mod http;
mod ldap;
mod logger;
mod runtime;
mod server;
mod sqlite;

use clap::{Parser, Subcommand};

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
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.cmd {
        Cmd::Server(a) => server::run(a),
    };
    std::process::exit(code);
}
