//! `cairn server`: loads the configuration (or the dev-mode defaults), opens SQLite, starts
//! the core thread and the API listener, and in dev mode initialises and unseals itself.

use crate::config::{self, ServerConfig};
use crate::http::{self, ApiOptions, TlsFiles};
use crate::runtime::Core;
use crate::sqlite::SqliteStorage;
use cairn_core::{Admin, AdminResult, NodeConfig};
use std::path::PathBuf;

/// Prints to stdout, ignoring a closed pipe (the server must not die with its reader).
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

#[derive(clap::Args)]
pub struct ServerArgs {
    /// Path to the HCL configuration file.
    #[arg(long, short = 'c', alias = "config-file")]
    pub config: Option<PathBuf>,
    /// Development mode: SQLite in a temp dir, initialised and unsealed, KV at secret/, LDAP at auth/ldap.
    #[arg(long)]
    pub dev: bool,
    /// Dev-mode API address (the cluster listener takes the next port).
    #[arg(long, default_value = "127.0.0.1:8200")]
    pub dev_listen_address: String,
    /// Dev-mode root token id.
    #[arg(long)]
    pub dev_root_token_id: Option<String>,
    /// trace, debug, info, warn, error (or CAIRN_LOG).
    #[arg(long)]
    pub log_level: Option<String>,
}

fn load(a: &ServerArgs) -> Result<(ServerConfig, Option<tempfile::TempDir>), String> {
    if a.dev {
        let dir = tempfile::Builder::new()
            .prefix("cairn-dev-")
            .tempdir()
            .map_err(|e| format!("cannot create a temp dir: {e}"))?;
        let c = ServerConfig {
            storage_path: dir.path().join("cairn.db"),
            address: a.dev_listen_address.clone(),
            cluster_address: config::next_port(&a.dev_listen_address).ok_or_else(|| {
                format!(
                    "--dev-listen-address: {:?} is not HOST:PORT",
                    a.dev_listen_address
                )
            })?,
            max_request_size: config::DEFAULT_MAX_REQUEST_SIZE,
            cluster_name: "cairn-dev".into(),
            ..Default::default()
        };
        return Ok((c, Some(dir)));
    }
    let path = a
        .config
        .as_ref()
        .ok_or("either --dev or --config FILE is required")?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let c = config::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((c, None))
}

pub fn run(a: ServerArgs) -> i32 {
    let (cfg, _tmp) = match load(&a) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("Error: {e}");
            return 1;
        }
    };
    if let Err(e) = crate::logger::init(a.log_level.as_deref().or(cfg.log_level.as_deref())) {
        eprintln!("Error: {e}");
        return 1;
    }
    let storage = match SqliteStorage::open(&cfg.storage_path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "Error: cannot open storage at {}: {e}",
                cfg.storage_path.display()
            );
            return 1;
        }
    };
    let tls = match (&cfg.tls_cert_file, &cfg.tls_key_file) {
        (Some(c), Some(k)) => match (std::fs::read(c), std::fs::read(k)) {
            (Ok(cert_pem), Ok(key_pem)) => Some(TlsFiles { cert_pem, key_pem }),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("Error: cannot read TLS certificate or key: {e}");
                return 1;
            }
        },
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let (replication, license) =
        match crate::cluster::node_settings(&cfg, scheme, a.dev, crate::runtime::now_ms()) {
            Ok(x) => x,
            Err(e) => {
                eprintln!("Error: {e}");
                return 1;
            }
        };
    let node_config = NodeConfig {
        node_id: format!("node-{}", std::process::id()),
        cluster_name: cfg.cluster_name.clone(),
        replication,
        license,
        ..Default::default()
    };
    let core = Core::start(storage, node_config, 8);
    if let Err(e) = crate::cluster::serve(&cfg.cluster_address, core.clone(), 8) {
        eprintln!("Error: cluster listener: {e}");
        return 1;
    }
    let addr = match http::serve(
        &cfg.address,
        tls,
        core.clone(),
        ApiOptions {
            max_body: cfg.max_request_size,
            threads: 32,
        },
    ) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("Error: {e}");
            return 1;
        }
    };
    log::info!("API listening on {scheme}://{addr}");
    out!(
        "==> Cairn server started. API: {scheme}://{addr}  Cluster: {}",
        cfg.cluster_address
    );
    if a.dev {
        match core.admin(Admin::DevSetup {
            root_token_id: a.dev_root_token_id.clone(),
        }) {
            Ok(AdminResult::DevSetup(keys)) => {
                let key = keys
                    .keys_base64
                    .first()
                    .map(String::as_str)
                    .unwrap_or_default();
                let token = &keys.root_token;
                out!("WARNING: dev mode: storage in a temp dir, initialised and unsealed; do not use in production.");
                out!("");
                out!("    export CAIRN_ADDR='{scheme}://{addr}'");
                out!("");
                out!("Unseal Key: {key}");
                out!("Root Token: {token}");
                out!("");
                out!("KV v1 is mounted at secret/ and the LDAP auth method at auth/ldap/.");
            }
            Ok(AdminResult::Flushed) => {
                eprintln!("Error: dev set-up failed: the core answered another command");
                return 1;
            }
            Err(e) => {
                eprintln!("Error: dev set-up failed: {e}");
                return 1;
            }
        }
    }
    let _ = std::io::Write::flush(&mut std::io::stdout());
    wait_for_shutdown(&core)
}

/// Blocks until SIGTERM or SIGINT, then lets the core finish deferred storage work (a
/// reindex's skipped tree flush) and commit before the process exits.
fn wait_for_shutdown(core: &Core) -> i32 {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = match signal_hook::iterator::Signals::new([SIGTERM, SIGINT]) {
        Ok(s) => s,
        Err(e) => {
            log::warn!("cannot watch for shutdown signals ({e}); stop the server with SIGKILL");
            loop {
                std::thread::park();
            }
        }
    };
    let sig = signals.forever().next().unwrap_or(SIGTERM);
    log::info!("signal {sig}: shutting down");
    match core.admin(Admin::Shutdown) {
        Ok(AdminResult::Flushed) => {
            log::info!("storage is complete; exiting");
            0
        }
        Ok(AdminResult::DevSetup(_)) => {
            log::error!("shutdown: the core answered another command");
            1
        }
        Err(e) => {
            log::error!("shutdown: deferred work not finished: {e}");
            1
        }
    }
}
