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
mod connecting;
mod framing;
mod ha;
mod http;
mod latency;
mod ldap;
mod logger;
mod postgres;
mod reads;
mod resolve;
mod runtime;
mod server;
mod snapshot_read;
mod sqlite;
mod storage;
mod tls_client;

use clap::{Parser, Subcommand};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay`: its place in `mi_option_e` of the library's header
/// (mimalloc 3, which the bindings build; they name no constant for it). `alloc_settings`
/// sets it only where it reads as the library's documented default (1,000 ms), so an index
/// that named another option would change nothing.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Memory the allocator frees goes back to the system at once rather than after mimalloc's
/// delay (a second by default), so a long-running server's RSS follows its live heap
/// instead of creeping up with freed pages the allocator keeps (BENCHMARKS, the one-hour
/// soak). An operator's own `MIMALLOC_PURGE_DELAY` is left as it is.
#[allow(unsafe_code)]
fn alloc_settings() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: reads and sets one of the allocator's options, before any other thread
        // exists (the option's first read looks at the environment).
        unsafe {
            if libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) == 1_000 {
                libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0);
            }
        }
    }
}

/// The environment variables the binary reads, shown by `cairn --help` (a test checks that
/// every variable the sources read is listed).
const ENVIRONMENT: &str = "\
Environment:
  CAIRN_ADDR                   Server of the client commands (-address; default http://127.0.0.1:8200)
  CAIRN_TOKEN                  Token of the client commands (else the token file ~/.cairn-token)
  CAIRN_NAMESPACE              Namespace of the client requests (-namespace)
  CAIRN_FORMAT                 Output of the client commands: table or json (-format)
  CAIRN_CACERT                 CA file to verify the server's TLS certificate (-ca-cert)
  CAIRN_CAPATH                 CA directory to verify the server's TLS certificate (-ca-path)
  CAIRN_SKIP_VERIFY            Do not verify the server's TLS certificate (insecure; -tls-skip-verify)
  CAIRN_WRAP_TTL               Wrap responses in a single-use token with this TTL (-wrap-ttl)
  CAIRN_CLIENT_TIMEOUT         Seconds a client command waits for the server (default 60)
  CAIRN_DR_OPERATION_TOKEN     DR operation token of `cairn replication ... -dr-token`
  HOME                         Holds the token file .cairn-token (`cairn login` and `server --dev` write it)
  USER                         Default username of `cairn login -method=ldap`
  CAIRN_LOG                    Server log level: trace, debug, info, warn, error (--log-level wins)
  CAIRN_DEV_LISTEN_ADDRESS     API address of `cairn server --dev` (--dev-listen-address)
  CAIRN_STORAGE_RESERVE_BYTES  Size of the server's disk-full reserve file (default 2 MiB; 0: none)
  TMPDIR                       Where `cairn server --dev` keeps its storage
  SSL_CERT_FILE                CA certificates the server trusts for LDAPS when auth/ldap sets none
  SSL_CERT_DIR                 The same, a directory
  MIMALLOC_PURGE_DELAY         Milliseconds before freed memory goes back to the system (default 0)
VAULT_ADDR and VAULT_TOKEN are not read (they are for Vault clients such as hvac).";

#[derive(Parser)]
#[command(
    name = "cairn",
    version,
    about = "Cairn: LDAP login and cluster replication with a Vault-compatible API",
    after_help = ENVIRONMENT
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
    alloc_settings();
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
