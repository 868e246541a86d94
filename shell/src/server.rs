//! `cairn server`: loads the configuration (or the dev-mode defaults), opens its storage
//! (SQLite, or PostgreSQL with `storage "postgresql"`), starts
//! the core thread and the API listener, and in dev mode initialises and unseals itself.

use crate::config::{self, ServerConfig};
use crate::http::{self, ApiOptions, TlsFiles};
use crate::runtime::Core;
use crate::sqlite::SqliteStorage;
use crate::storage::ShellStorage;
use cairn_core::{Admin, AdminResult, NodeConfig};
use std::path::{Path, PathBuf};

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
    /// Development mode: SQLite in a temp dir, initialised and unsealed, KV at secret/, LDAP
    /// at auth/ldap, the root token stored in ~/.cairn-token for the CLI.
    #[arg(long)]
    pub dev: bool,
    /// Dev-mode API address (the cluster listener takes the next port).
    #[arg(
        long,
        env = "CAIRN_DEV_LISTEN_ADDRESS",
        default_value = "127.0.0.1:8200"
    )]
    pub dev_listen_address: String,
    /// Dev-mode root token id.
    #[arg(long)]
    pub dev_root_token_id: Option<String>,
    /// trace, debug, info, warn, error (or CAIRN_LOG).
    #[arg(long)]
    pub log_level: Option<String>,
}

/// Where the addresses and the storage path were set: what a message tells the operator to
/// change.
struct Origin {
    /// How to move the API listener.
    api: String,
    /// How to move the cluster listener.
    cluster: String,
    /// How to change the storage path (None in dev mode: a temp dir).
    storage: Option<String>,
}

impl Origin {
    fn dev() -> Origin {
        Origin {
            api: "move this server with --dev-listen-address 127.0.0.1:PORT (or \
                  CAIRN_DEV_LISTEN_ADDRESS); its cluster listener takes PORT+1"
                .into(),
            cluster: "move both listeners with --dev-listen-address 127.0.0.1:PORT (or \
                      CAIRN_DEV_LISTEN_ADDRESS): in dev mode the cluster listener takes the API \
                      port + 1"
                .into(),
            storage: None,
        }
    }

    fn file(path: &Path, text: &str) -> Origin {
        let at = |key: &str| match config::line_of(text, key) {
            Some(n) => format!("{}:{n}", path.display()),
            None => path.display().to_string(),
        };
        let cluster = if config::line_of(text, "cluster_address").is_some() {
            format!(
                "change `cluster_address` in the listener \"tcp\" block ({})",
                at("cluster_address")
            )
        } else {
            format!(
                "set `cluster_address` in the listener \"tcp\" block of {} (it defaults to \
                 the API port + 1)",
                path.display()
            )
        };
        Origin {
            api: format!(
                "change `address` in the listener \"tcp\" block ({})",
                at("address")
            ),
            cluster,
            storage: Some(format!(
                "change `path` in the storage \"sqlite\" block ({})",
                at("path")
            )),
        }
    }
}

fn load(a: &ServerArgs) -> Result<(ServerConfig, Origin, Option<tempfile::TempDir>), String> {
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
                    "--dev-listen-address: {:?} is not HOST:PORT (e.g. 127.0.0.1:8200)",
                    a.dev_listen_address
                )
            })?,
            max_request_size: config::DEFAULT_MAX_REQUEST_SIZE,
            cluster_name: "cairn-dev".into(),
            ..Default::default()
        };
        return Ok((c, Origin::dev(), Some(dir)));
    }
    let path = a
        .config
        .as_ref()
        .ok_or("either --dev or --config FILE is required (see `cairn server --help`)")?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let c = config::parse(&text).map_err(|e| e.render(path))?;
    Ok((c, Origin::file(path, &text), None))
}

/// Binds `addr` for `what` (the API or the cluster listener); a refusal names the address,
/// the port and how to move it (`remedy`).
fn listen(addr: &str, what: &str, remedy: &str) -> Result<std::net::TcpListener, String> {
    use std::io::ErrorKind;
    http::bind(addr).map_err(|e| {
        let port = addr.rsplit(':').next().unwrap_or(addr);
        let why = match e.kind() {
            ErrorKind::AddrInUse => format!(
                "port {port} is already in use (another Cairn server, or another program, \
                 listens there). Stop it, or {remedy}"
            ),
            ErrorKind::PermissionDenied => format!(
                "permission denied (ports below 1024 need privileges). Pick another port: \
                 {remedy}"
            ),
            ErrorKind::AddrNotAvailable => format!(
                "the address is not one of this machine's ({e}). Pick another address: \
                 {remedy}"
            ),
            _ => format!("{e}. To listen elsewhere, {remedy}"),
        };
        format!("cannot listen on {addr} ({what}): {why}.")
    })
}

/// Makes sure the directory of the database file `db` exists. A missing directory is created
/// (mode 0700, logged) when its parent exists; deeper missing paths are refused, so that a
/// mistyped path or an unmounted volume is not silently used as empty storage. Returns the
/// directory when it was created.
pub fn storage_dir(db: &Path, change: &str) -> Result<Option<PathBuf>, String> {
    let dir = match db.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => return Ok(None),
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => return Ok(None),
        Ok(_) => {
            return Err(format!(
                "the storage path {}: {} is not a directory; {change}",
                db.display(),
                dir.display()
            ))
        }
        Err(_) => {}
    }
    let parent = match dir.parent() {
        Some(p) if p.as_os_str().is_empty() => Path::new("."),
        Some(p) => p,
        None => Path::new("/"),
    };
    if !parent.is_dir() {
        return Err(format!(
            "the storage directory {} does not exist, nor does its parent {}. Create it \
             (mkdir -p {}), writable by the user this server runs as, or {change}. (The \
             server creates only the last directory of the path, so that a mistyped path or \
             an unmounted volume is not taken for empty storage.)",
            dir.display(),
            parent.display(),
            dir.display()
        ));
    }
    let mut b = std::fs::DirBuilder::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    match b.create(dir) {
        Ok(()) => Ok(Some(dir.to_path_buf())),
        // Created meanwhile by someone else: fine.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(None),
        Err(e) => Err(format!(
            "the storage directory {} does not exist and cannot be created ({e}). Create it \
             (mkdir -p {}), writable by the user this server runs as, or {change}.",
            dir.display(),
            dir.display()
        )),
    }
}

pub fn run(a: ServerArgs) -> i32 {
    // The dev-mode temp dir lives as long as the server.
    match start(&a) {
        Ok((core, _tmp)) => wait_for_shutdown(&core),
        Err(e) => {
            eprintln!("Error: {e}");
            1
        }
    }
}

/// Everything up to a serving server: settings, listeners, storage, core, dev set-up.
fn start(a: &ServerArgs) -> Result<(Core, Option<tempfile::TempDir>), String> {
    let (cfg, origin, tmp) = load(a)?;
    crate::logger::init(a.log_level.as_deref().or(cfg.log_level.as_deref()))?;
    let tls = match (&cfg.tls_cert_file, &cfg.tls_key_file) {
        (Some(c), Some(k)) => match (std::fs::read(c), std::fs::read(k)) {
            (Ok(cert_pem), Ok(key_pem)) => Some(TlsFiles { cert_pem, key_pem }),
            (Err(e), _) | (_, Err(e)) => {
                return Err(format!("cannot read TLS certificate or key: {e}"));
            }
        },
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let (replication, license) =
        crate::cluster::node_settings(&cfg, scheme, a.dev, crate::runtime::now_ms())?;
    // Both ports before anything else: a busy one stops the start before storage is opened.
    let api = listen(&cfg.address, "the API address", &origin.api)?;
    let cluster = listen(&cfg.cluster_address, "the cluster address", &origin.cluster)?;
    let storage = open_storage(&cfg, &origin)?;
    // An HA node is known to the others by its cluster address (stable across restarts).
    let ha = cfg.postgres.as_ref().filter(|p| p.ha_enabled).map(|_| {
        let mut h = cairn_core::ha::HaConfig::new(&replication.api_addr, &replication.cluster_addr);
        h.lease_ttl_ms = HA_LEASE_TTL.as_millis() as u64;
        h
    });
    let node_id = match &ha {
        Some(h) => h.cluster_addr.clone(),
        None => format!("node-{}", std::process::id()),
    };
    let node_config = NodeConfig {
        node_id: node_id.clone(),
        cluster_name: cfg.cluster_name.clone(),
        replication,
        license,
        ha: ha.clone(),
        storage_type: if cfg.postgres.is_some() {
            "postgresql"
        } else {
            "sqlite"
        }
        .into(),
        ..Default::default()
    };
    let lease = match (&ha, &cfg.postgres) {
        (Some(h), Some(pg)) => Some(crate::runtime::LeaseSpec {
            settings: crate::postgres::PgSettings::new(
                &pg.connection_url,
                pg.table.as_deref(),
                pg.ha_table.as_deref(),
            )
            .map_err(|e| format!("storage \"postgresql\": {e}"))?,
            identity: crate::ha::Identity {
                node_id,
                api_addr: h.api_addr.clone(),
                cluster_addr: h.cluster_addr.clone(),
                version: env!("CARGO_PKG_VERSION").to_string(),
            },
            ttl: HA_LEASE_TTL,
        }),
        _ => None,
    };
    let core = Core::start_with(storage, node_config, 8, lease)
        .map_err(|e| format!("storage \"postgresql\": the leadership lease: {e}"))?;
    crate::cluster::serve(
        cluster,
        core.clone(),
        8,
        config::tiny_limits(cfg.cluster_connection_limits),
    )
    .map_err(|e| format!("cluster listener: {e}"))?;
    // Dev mode sets itself up before the API answers: whoever waits for the API (a script
    // polling sys/health) then finds the server unsealed and the token file written.
    let addr = api
        .local_addr()
        .map_err(|e| format!("the API listener has no address: {e}"))?;
    let mut dev_lines = Vec::new();
    if a.dev {
        dev_lines = dev_setup(&core, a, addr)?;
    }
    // Printed before the API answers (connections wait in the listener's backlog meanwhile):
    // whoever sees the API answer finds these lines written. Both listeners are bound by
    // now, and the process id tells a supervisor (the e2e harness) that the server answering
    // on these addresses is the process it started, not another one on a reused port.
    out!(
        "==> Cairn server started. API: {scheme}://{addr}  Cluster: {}  PID: {}",
        cfg.cluster_address,
        std::process::id()
    );
    for l in dev_lines {
        out!("{l}");
    }
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let addr = http::serve(
        api,
        tls,
        core.clone(),
        ApiOptions {
            max_body: cfg.max_request_size,
            threads: 32,
            limits: config::tiny_limits(cfg.connection_limits),
        },
    )?;
    log::info!("API listening on {scheme}://{addr}");
    Ok((core, tmp))
}

/// How long the leadership lease lasts without a renewal: an active node paused or cut off
/// from the database loses it after this; one whose process died loses it at once (its
/// database session ends).
const HA_LEASE_TTL: std::time::Duration = std::time::Duration::from_secs(6);

/// Opens the configured storage: the SQLite file (creating its directory one level deep), or
/// the PostgreSQL database (its tables created when missing, its schema version checked). A
/// refusal says what to change and never contains the database password.
fn open_storage(cfg: &ServerConfig, origin: &Origin) -> Result<ShellStorage, String> {
    if let Some(pg) = &cfg.postgres {
        let settings = crate::postgres::PgSettings::new(
            &pg.connection_url,
            pg.table.as_deref(),
            pg.ha_table.as_deref(),
        )
        .map_err(|e| format!("storage \"postgresql\": {e}"))?;
        let mut storage = crate::postgres::PgStorage::open(&settings)
            .map_err(|e| format!("storage \"postgresql\": {e}"))?;
        // The only writer without HA: reads may be cached (see postgres/mod.rs).
        storage.set_read_cache(!pg.ha_enabled);
        log::info!(
            "storage: PostgreSQL at {} (table {}, lease table {})",
            settings.target,
            settings.table,
            settings.ha_table
        );
        if pg.ha_enabled {
            log::info!(
                "HA: this node starts as a standby and takes the leadership lease when it is \
                 free (lease {} s)",
                HA_LEASE_TTL.as_secs()
            );
        }
        return Ok(ShellStorage::Postgres(storage));
    }
    if let Some(change) = &origin.storage {
        if let Some(dir) = storage_dir(&cfg.storage_path, change)? {
            log::info!(
                "created the storage directory {} (it did not exist; its parent did)",
                dir.display()
            );
        }
    }
    SqliteStorage::open(&cfg.storage_path)
        .map(ShellStorage::Sqlite)
        .map_err(|e| {
            format!(
                "cannot open storage at {}: {e} (the file and its directory must be writable by \
                 the user this server runs as)",
                cfg.storage_path.display()
            )
        })
}

/// Initialises and unseals a dev server and stores its root token in the CLI's token file
/// (as `cairn login` does); returns the lines to print.
fn dev_setup(
    core: &Core,
    a: &ServerArgs,
    addr: std::net::SocketAddr,
) -> Result<Vec<String>, String> {
    let keys = match core.admin(Admin::DevSetup {
        root_token_id: a.dev_root_token_id.clone(),
    }) {
        Ok(AdminResult::DevSetup(keys)) => keys,
        Ok(AdminResult::Flushed) => {
            return Err("dev set-up failed: the core answered another command".into())
        }
        Err(e) => return Err(format!("dev set-up failed: {e}")),
    };
    let key = keys
        .keys_base64
        .first()
        .map(String::as_str)
        .unwrap_or_default();
    let token = keys.root_token.as_str();
    let stored = match crate::cli::store_token(token) {
        Ok(p) => format!(
            "The root token is stored in {}: `cairn` commands use it (CAIRN_TOKEN overrides it).",
            p.display()
        ),
        Err(e) => {
            log::warn!("dev mode: the root token is not stored for the CLI: {e}");
            "The root token is not stored for the CLI: export CAIRN_TOKEN with it.".into()
        }
    };
    Ok(vec![
        "WARNING: dev mode: storage in a temp dir, initialised and unsealed; do not use in production.".into(),
        String::new(),
        format!("    export CAIRN_ADDR='http://{addr}'"),
        String::new(),
        format!("Unseal Key: {key}"),
        format!("Root Token: {token}"),
        String::new(),
        stored,
        "KV v1 is mounted at secret/ and the LDAP auth method at auth/ldap/.".into(),
    ])
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_storage_directory_is_created_one_level_deep_only() {
        let base = tempfile::tempdir().unwrap();
        let change = "change `path`";
        // Exists: nothing to do. A bare file name: the working directory.
        assert_eq!(storage_dir(&base.path().join("x.db"), change), Ok(None));
        assert_eq!(storage_dir(Path::new("x.db"), change), Ok(None));
        // The last directory is missing: created, mode 0700.
        let data = base.path().join("data");
        assert_eq!(
            storage_dir(&data.join("x.db"), change),
            Ok(Some(data.clone()))
        );
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&data).unwrap().permissions().mode() & 0o777,
            0o700
        );
        // Two levels missing: refused, naming the directory, the command and the setting.
        let deep = base.path().join("a/b");
        let e = storage_dir(&deep.join("x.db"), change).unwrap_err();
        assert!(
            e.contains(&format!("{} does not exist", deep.display())),
            "{e}"
        );
        assert!(e.contains(&format!("mkdir -p {}", deep.display())), "{e}");
        assert!(e.contains(change), "{e}");
        assert!(!base.path().join("a").exists());
        // A file where the directory should be.
        std::fs::write(base.path().join("f"), "").unwrap();
        let e = storage_dir(&base.path().join("f/x.db"), change).unwrap_err();
        assert!(e.contains("is not a directory"), "{e}");
    }

    #[test]
    fn a_busy_port_names_the_port_and_the_remedy() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let port = taken.local_addr().unwrap().port();
        let e = listen(&addr, "the API address", "move it with --flag").unwrap_err();
        assert_eq!(
            e,
            format!(
                "cannot listen on {addr} (the API address): port {port} is already in use \
                 (another Cairn server, or another program, listens there). Stop it, or move \
                 it with --flag."
            )
        );
        let o = Origin::file(
            Path::new("c.hcl"),
            "listener \"tcp\" {\n  address = \"127.0.0.1:1\"\n}\n",
        );
        assert_eq!(
            o.api,
            "change `address` in the listener \"tcp\" block (c.hcl:2)"
        );
        assert!(
            o.cluster.contains("it defaults to the API port + 1"),
            "{}",
            o.cluster
        );
    }
}
