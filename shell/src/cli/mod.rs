//! The command-line client: Vault-style commands (`status`, `login`, `read`, `write`, `list`,
//! `delete`, `token`, `policy`, `secrets`, `auth`, `operator`, `replication`, `namespace`) that talk to a
//! Cairn server over its HTTP API.
//!
//! Flags may be written Vault's way with one dash (`-format=json`) or with two. The server is
//! chosen by `-address`/`CAIRN_ADDR`, the token by `CAIRN_TOKEN` or the token file
//! `~/.cairn-token` that `login` writes. Exit codes: 0 success, 1 local error (bad usage,
//! unreadable file), 2 an error from the server (or no answer from it), with the server's
//! messages on stderr.

mod auth;
mod client;
mod generate_root;
mod kv;
mod namespace;
mod output;
mod replication;
mod snapshot;
mod sys;

use clap::builder::FalseyValueParser;
use clap::{ArgAction, Args, Subcommand, ValueEnum};
use std::ffi::OsString;
use std::fmt;

pub use auth::store_token;
pub use client::Client;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// Options every client command takes.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Address of the Cairn server.
    #[arg(long, env = "CAIRN_ADDR", default_value = "http://127.0.0.1:8200")]
    pub address: String,
    /// Namespace for the request (sent as X-Service-Namespace).
    #[arg(long, env = "CAIRN_NAMESPACE", alias = "ns")]
    pub namespace: Option<String>,
    /// PEM file of CA certificates to verify the server's TLS certificate.
    #[arg(long, env = "CAIRN_CACERT")]
    pub ca_cert: Option<String>,
    /// Directory of PEM CA certificates to verify the server's TLS certificate.
    #[arg(long, env = "CAIRN_CAPATH")]
    pub ca_path: Option<String>,
    /// Do not verify the server's TLS certificate (insecure).
    #[arg(long, env = "CAIRN_SKIP_VERIFY", action = ArgAction::SetTrue, value_parser = FalseyValueParser::new())]
    pub tls_skip_verify: bool,
    /// Output format.
    #[arg(long, env = "CAIRN_FORMAT", value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Ask the server to wrap the response in a single-use token with this TTL (e.g. 5m).
    #[arg(long, env = "CAIRN_WRAP_TTL")]
    pub wrap_ttl: Option<String>,
    /// Seconds to wait for the server before giving up.
    #[arg(
        long = "client-timeout",
        env = "CAIRN_CLIENT_TIMEOUT",
        default_value_t = 60
    )]
    pub timeout: u64,
}

/// The client commands (the `server` command lives in `main`).
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the seal status of the server (exit 2 when sealed).
    Status(sys::StatusArgs),
    /// Authenticate (LDAP or an existing token) and store the token.
    Login(auth::LoginArgs),
    /// Read data at any API path.
    Read(kv::ReadArgs),
    /// Write data (k=v, k=@file, k=-, or - for a JSON object on stdin) to any API path.
    Write(kv::WriteArgs),
    /// List the keys under a path.
    List(kv::PathArgs),
    /// Delete data at a path.
    Delete(kv::PathArgs),
    /// Look up, renew and revoke tokens.
    #[command(subcommand)]
    Token(auth::TokenCmd),
    /// Read, write, list and delete ACL policies.
    #[command(subcommand)]
    Policy(sys::PolicyCmd),
    /// Enable, disable and list secrets engines.
    #[command(subcommand)]
    Secrets(sys::MountCmd),
    /// Enable, disable and list auth methods.
    #[command(subcommand)]
    Auth(sys::MountCmd),
    /// Initialise, unseal and seal the server.
    #[command(subcommand)]
    Operator(sys::OperatorCmd),
    /// Replication helpers.
    #[command(subcommand)]
    Replication(replication::ReplicationCmd),
    /// Create, list, delete and look up namespaces.
    #[command(subcommand)]
    Namespace(namespace::NamespaceCmd),
}

/// Why a command failed; decides the exit code.
#[derive(Debug)]
pub enum CliError {
    /// Bad usage or a local failure (exit 1).
    Local(String),
    /// No usable answer from the server (exit 2).
    Transport {
        method: String,
        url: String,
        msg: String,
    },
    /// The server answered with an error status (exit 2).
    Api {
        method: String,
        url: String,
        status: u16,
        errors: Vec<String>,
        /// What to do about it, when the CLI knows (e.g. no token was sent).
        hint: Option<String>,
    },
    /// A message with context around an inner error.
    Context(String, Box<CliError>),
}

impl CliError {
    pub fn code(&self) -> i32 {
        match self {
            CliError::Local(_) => 1,
            CliError::Transport { .. } | CliError::Api { .. } => 2,
            CliError::Context(_, e) => e.code(),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Local(m) => write!(f, "{m}"),
            CliError::Transport { method, url, msg } => {
                write!(f, "Error making API request.\n\nURL: {method} {url}\n{msg}")
            }
            CliError::Api {
                method,
                url,
                status,
                errors,
                hint,
            } => {
                write!(
                    f,
                    "Error making API request.\n\nURL: {method} {url}\nCode: {status}. Errors:\n"
                )?;
                for e in errors {
                    write!(f, "\n* {e}")?;
                }
                if let Some(h) = hint {
                    write!(f, "\n\n{h}")?;
                }
                Ok(())
            }
            CliError::Context(c, e) => write!(f, "{c}: {e}"),
        }
    }
}

/// Adds "Error <doing what>" context to an error.
pub trait Ctx<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, CliError>;
}

impl<T> Ctx<T> for Result<T, CliError> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, CliError> {
        self.map_err(|e| CliError::Context(format!("Error {}", what()), Box::new(e)))
    }
}

/// What a command returns: its exit code on success paths (e.g. 2 for "sealed").
pub type CmdResult = Result<i32, CliError>;

/// Rewrites Vault's single-dash long flags (`-format=json`, `-method ldap`) to `--format=json`
/// so clap parses them; one-letter flags, `-` (stdin) and everything after `--` are kept.
pub fn normalize_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut rest = false;
    for (i, a) in args.into_iter().enumerate() {
        if i == 0 || rest {
            out.push(a);
            continue;
        }
        let Some(s) = a.to_str() else {
            out.push(a);
            continue;
        };
        if s == "--" {
            rest = true;
            out.push(a);
            continue;
        }
        let name = s
            .strip_prefix('-')
            .filter(|r| !r.starts_with('-'))
            .map(|r| r.split('=').next().unwrap_or(r));
        match name {
            Some(n)
                if n.len() >= 2
                    && n.starts_with(|c: char| c.is_ascii_alphabetic())
                    && n.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') =>
            {
                out.push(OsString::from(format!("-{s}")));
            }
            _ => out.push(a),
        }
    }
    out
}

/// Runs a client command; returns the process exit code.
pub fn run(cmd: Command) -> i32 {
    let result = match cmd {
        Command::Status(a) => sys::status(a),
        Command::Login(a) => auth::login(a),
        Command::Read(a) => kv::read(a),
        Command::Write(a) => kv::write(a),
        Command::List(a) => kv::list(a),
        Command::Delete(a) => kv::delete(a),
        Command::Token(c) => auth::token(c),
        Command::Policy(c) => sys::policy(c),
        Command::Secrets(c) => sys::mounts(c, sys::Table::Secrets),
        Command::Auth(c) => sys::mounts(c, sys::Table::Auth),
        Command::Operator(c) => sys::operator(c),
        Command::Replication(c) => replication::run(c),
        Command::Namespace(c) => namespace::run(c),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{}", message(&e));
            e.code()
        }
    }
}

fn message(e: &CliError) -> String {
    match e {
        CliError::Context(..) => e.to_string(),
        CliError::Local(m) => format!("Error: {m}"),
        other => format!("Error: {other}"),
    }
}

/// Prints a JSON value, pretty.
pub fn print_json(v: &serde_json::Value) {
    println!("{}", output::pretty(v));
}

/// Reads all of stdin (for `-` arguments).
pub fn read_stdin() -> Result<String, CliError> {
    use std::io::Read;
    let mut s = String::new();
    std::io::stdin()
        .read_to_string(&mut s)
        .map_err(|e| CliError::Local(format!("cannot read stdin: {e}")))?;
    Ok(s)
}

/// Asks for a secret: without echo on a terminal, else one line from stdin.
pub fn prompt_secret(prompt: &str) -> Result<String, CliError> {
    use std::io::IsTerminal;
    if std::io::stdin().is_terminal() {
        rpassword::prompt_password(prompt)
            .map_err(|e| CliError::Local(format!("cannot read from the terminal: {e}")))
    } else {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .map_err(|e| CliError::Local(format!("cannot read stdin: {e}")))?;
        Ok(line.trim_end_matches(['\r', '\n']).to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(v: &[&str]) -> Vec<String> {
        normalize_args(v.iter().map(OsString::from))
            .into_iter()
            .map(|s| s.into_string().unwrap_or_default())
            .collect()
    }

    #[test]
    fn single_dash_long_flags_become_double() {
        assert_eq!(
            norm(&[
                "cairn",
                "login",
                "-method=ldap",
                "-path",
                "corp",
                "username=a"
            ]),
            vec![
                "cairn",
                "login",
                "--method=ldap",
                "--path",
                "corp",
                "username=a"
            ]
        );
        assert_eq!(
            norm(&[
                "cairn",
                "write",
                "secret/x",
                "-",
                "-h",
                "--format=json",
                "-format=json"
            ]),
            vec![
                "cairn",
                "write",
                "secret/x",
                "-",
                "-h",
                "--format=json",
                "--format=json"
            ]
        );
        assert_eq!(
            norm(&["cairn", "write", "--", "-not-a-flag"]),
            vec!["cairn", "write", "--", "-not-a-flag"]
        );
        assert_eq!(norm(&["cairn", "x", "-5m"]), vec!["cairn", "x", "-5m"]);
    }

    #[test]
    fn exit_codes_follow_the_error_kind() {
        assert_eq!(CliError::Local("x".into()).code(), 1);
        let api = CliError::Api {
            method: "GET".into(),
            url: "u".into(),
            status: 403,
            errors: vec!["permission denied".into()],
            hint: None,
        };
        assert_eq!(api.code(), 2);
        let s = CliError::Context("Error reading x".into(), Box::new(api)).to_string();
        assert!(
            s.contains("Code: 403. Errors:\n\n* permission denied"),
            "{s}"
        );
        // A hint follows the server's errors.
        let api = CliError::Api {
            method: "GET".into(),
            url: "u".into(),
            status: 403,
            errors: vec!["permission denied (this request needs a token)".into()],
            hint: Some(client::NO_TOKEN.into()),
        };
        assert!(
            api.to_string().ends_with(
                "* permission denied (this request needs a token)\n\n\
                 no token: set CAIRN_TOKEN or run `cairn login` (it stores the token in \
                 ~/.cairn-token; `cairn server --dev` stores its root token there too)"
            ),
            "{api}"
        );
    }
}
