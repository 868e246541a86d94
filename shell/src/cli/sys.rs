//! System commands: `status`, `policy read|write|list|delete`, `secrets|auth
//! enable|disable|list`, and `operator init|unseal|seal`.

use super::output::{cell, kv_table, table};
use super::{
    print_json, prompt_secret, read_stdin, CliError, Client, CmdResult, Common, Ctx, Format,
};
use clap::Subcommand;
use serde_json::{json, Map, Value};

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub common: Common,
}

/// The seal status as a table, with the HA rows from `sys/leader` when the node answered
/// it; exit 2 when sealed (as the reference CLI does).
fn print_seal_status(v: &Value, leader: Option<&Value>, format: Format) -> CmdResult {
    let sealed = v["sealed"].as_bool().unwrap_or(true);
    match format {
        Format::Json => print_json(v),
        Format::Table => {
            let mut rows = vec![
                ("Seal Type".to_string(), cell(&v["type"])),
                ("Initialized".into(), cell(&v["initialized"])),
                ("Sealed".into(), cell(&v["sealed"])),
                ("Total Shares".into(), cell(&v["n"])),
                ("Threshold".into(), cell(&v["t"])),
            ];
            if sealed {
                rows.push((
                    "Unseal Progress".into(),
                    format!("{}/{}", cell(&v["progress"]), cell(&v["t"])),
                ));
                rows.push(("Unseal Nonce".into(), cell(&v["nonce"])));
            }
            rows.push(("Version".into(), cell(&v["version"])));
            if v["build_date"].as_str().is_some_and(|s| !s.is_empty()) {
                rows.push(("Build Date".into(), cell(&v["build_date"])));
            }
            rows.push(("Storage Type".into(), cell(&v["storage_type"])));
            if !sealed {
                rows.push(("Cluster Name".into(), cell(&v["cluster_name"])));
                rows.push(("Cluster ID".into(), cell(&v["cluster_id"])));
            }
            let ha = leader.filter(|l| l["ha_enabled"] == json!(true));
            match ha {
                Some(l) => {
                    rows.push(("HA Enabled".into(), "true".into()));
                    if !sealed {
                        let mode = if l["is_self"] == json!(true) {
                            "active"
                        } else {
                            "standby"
                        };
                        rows.push(("HA Mode".into(), mode.into()));
                        if l["is_self"] == json!(true) {
                            rows.push(("Active Since".into(), cell(&l["active_time"])));
                        } else {
                            rows.push(("Active Node Address".into(), cell(&l["leader_address"])));
                        }
                    }
                }
                None => rows.push(("HA Enabled".into(), "false".into())),
            }
            println!("{}", kv_table(&rows));
        }
    }
    Ok(if sealed { 2 } else { 0 })
}

pub fn status(a: StatusArgs) -> CmdResult {
    let c = Client::new(&a.common)?;
    let r = c
        .call("GET", "sys/seal-status", None)
        .ctx(|| "checking seal status".into())?;
    let leader = c.call("GET", "sys/leader", None).ok().map(|l| l.body);
    print_seal_status(&r.body, leader.as_ref(), a.common.format)
}

#[derive(Subcommand, Debug)]
pub enum PolicyCmd {
    /// Print a policy's rules.
    Read(NameArgs),
    /// Upload a policy from a file (or - for stdin).
    Write(PolicyWriteArgs),
    /// List policy names.
    List(NoArgs),
    /// Delete a policy.
    Delete(NameArgs),
}

#[derive(clap::Args, Debug)]
pub struct NoArgs {
    #[command(flatten)]
    pub common: Common,
}

#[derive(clap::Args, Debug)]
pub struct NameArgs {
    pub name: String,
    #[command(flatten)]
    pub common: Common,
}

#[derive(clap::Args, Debug)]
pub struct PolicyWriteArgs {
    pub name: String,
    /// HCL policy file, or - for stdin.
    pub file: String,
    #[command(flatten)]
    pub common: Common,
}

fn policy_path(name: &str) -> Result<String, CliError> {
    let n = name.trim();
    if n.is_empty() || n.contains('/') {
        return Err(CliError::Local(format!("invalid policy name {name:?}")));
    }
    Ok(format!("sys/policies/acl/{}", n.to_lowercase()))
}

pub fn policy(cmd: PolicyCmd) -> CmdResult {
    match cmd {
        PolicyCmd::Read(a) => {
            let c = Client::new(&a.common)?;
            let path = policy_path(&a.name)?;
            let r = c
                .send("GET", &path, None)
                .ctx(|| "reading the policy".into())?;
            if r.status == 404 {
                eprintln!("No policy named: {}", a.name);
                return Ok(2);
            }
            if r.status >= 400 {
                return Err(c.api_error("GET", &path, &r)).ctx(|| "reading the policy".into());
            }
            match a.common.format {
                Format::Json => print_json(&r.body),
                Format::Table => println!("{}", r.body["data"]["policy"].as_str().unwrap_or("")),
            }
            Ok(0)
        }
        PolicyCmd::Write(a) => {
            let path = policy_path(&a.name)?;
            let text = if a.file == "-" {
                read_stdin()?
            } else {
                std::fs::read_to_string(&a.file)
                    .map_err(|e| CliError::Local(format!("cannot read {}: {e}", a.file)))?
            };
            let c = Client::new(&a.common)?;
            c.call("PUT", &path, Some(&json!({ "policy": text })))
                .ctx(|| "uploading the policy".into())?;
            if a.common.format == Format::Table {
                println!("Success! Uploaded policy: {}", a.name);
            }
            Ok(0)
        }
        PolicyCmd::List(a) => {
            let c = Client::new(&a.common)?;
            let r = c
                .call("LIST", "sys/policies/acl", None)
                .ctx(|| "listing policies".into())?;
            let keys = r.body["data"]["keys"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            match a.common.format {
                Format::Json => print_json(&Value::Array(keys)),
                Format::Table => {
                    for k in keys {
                        println!("{}", cell(&k));
                    }
                }
            }
            Ok(0)
        }
        PolicyCmd::Delete(a) => {
            let c = Client::new(&a.common)?;
            let path = policy_path(&a.name)?;
            c.call("DELETE", &path, None)
                .ctx(|| "deleting the policy".into())?;
            if a.common.format == Format::Table {
                println!("Success! Deleted policy: {}", a.name);
            }
            Ok(0)
        }
    }
}

/// Which mount table a `secrets`/`auth` command works on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    Secrets,
    Auth,
}

impl Table {
    fn api(self) -> &'static str {
        match self {
            Table::Secrets => "sys/mounts",
            Table::Auth => "sys/auth",
        }
    }
    fn noun(self) -> &'static str {
        match self {
            Table::Secrets => "secrets engine",
            Table::Auth => "auth method",
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum MountCmd {
    /// Enable an engine or method of TYPE at -path (default: TYPE).
    Enable(EnableArgs),
    /// Disable the engine or method at PATH.
    Disable(MountPathArgs),
    /// List enabled engines or methods.
    List(ListMountsArgs),
}

#[derive(clap::Args, Debug)]
pub struct EnableArgs {
    /// The type, e.g. kv or ldap.
    #[arg(value_name = "TYPE")]
    pub kind: String,
    /// Where to mount it (default: the type).
    #[arg(long)]
    pub path: Option<String>,
    #[arg(long)]
    pub description: Option<String>,
    /// Do not replicate this mount.
    #[arg(long)]
    pub local: bool,
    /// KV version (1 or 2).
    #[arg(long)]
    pub version: Option<String>,
    /// Mount option k=v (repeatable).
    #[arg(long = "options")]
    pub options: Vec<String>,
    #[command(flatten)]
    pub common: Common,
}

#[derive(clap::Args, Debug)]
pub struct MountPathArgs {
    pub path: String,
    #[command(flatten)]
    pub common: Common,
}

#[derive(clap::Args, Debug)]
pub struct ListMountsArgs {
    /// Show more columns (local, options).
    #[arg(long)]
    pub detailed: bool,
    #[command(flatten)]
    pub common: Common,
}

fn mount_dir(p: &str) -> String {
    format!("{}/", p.trim_matches('/'))
}

pub fn mounts(cmd: MountCmd, t: Table) -> CmdResult {
    match cmd {
        MountCmd::Enable(a) => {
            let path = a.path.clone().unwrap_or_else(|| a.kind.clone());
            let path = path.trim_matches('/');
            if path.is_empty() {
                return Err(CliError::Local("-path must not be empty".into()));
            }
            let mut options = Map::new();
            for o in &a.options {
                let (k, v) = o.split_once('=').ok_or_else(|| {
                    CliError::Local(format!("-options {o:?}: expected key=value"))
                })?;
                options.insert(k.to_string(), json!(v));
            }
            if let Some(v) = &a.version {
                options.insert("version".into(), json!(v));
            }
            let mut body = json!({ "type": a.kind, "local": a.local });
            if let Some(d) = &a.description {
                body["description"] = json!(d);
            }
            if !options.is_empty() {
                body["options"] = Value::Object(options);
            }
            let c = Client::new(&a.common)?;
            c.call("POST", &format!("{}/{path}", t.api()), Some(&body))
                .ctx(|| format!("enabling the {} at {path}/", t.noun()))?;
            if a.common.format == Format::Table {
                println!("Success! Enabled the {} {} at: {path}/", a.kind, t.noun());
            }
            Ok(0)
        }
        MountCmd::Disable(a) => {
            let path = a.path.trim_matches('/');
            if path.is_empty() {
                return Err(CliError::Local("a mount path is required".into()));
            }
            let c = Client::new(&a.common)?;
            c.call("DELETE", &format!("{}/{path}", t.api()), None)
                .ctx(|| format!("disabling the {} at {path}/", t.noun()))?;
            if a.common.format == Format::Table {
                println!(
                    "Success! Disabled the {} (if it existed) at: {path}/",
                    t.noun()
                );
            }
            Ok(0)
        }
        MountCmd::List(a) => {
            let c = Client::new(&a.common)?;
            let r = c
                .call("GET", t.api(), None)
                .ctx(|| format!("listing {}s", t.noun()))?;
            let data = match r.body.get("data") {
                Some(d @ Value::Object(_)) => d.clone(),
                _ => r.body.clone(),
            };
            if a.common.format == Format::Json {
                print_json(&data);
                return Ok(0);
            }
            let mut rows = Vec::new();
            if let Some(m) = data.as_object() {
                for (p, v) in m {
                    if !v.is_object() {
                        continue;
                    }
                    let mut row = vec![
                        mount_dir(p),
                        cell(&v["type"]),
                        cell(&v["accessor"]),
                        v["description"].as_str().unwrap_or("n/a").to_string(),
                    ];
                    if a.detailed {
                        row.push(cell(&v["local"]));
                        row.push(match &v["options"] {
                            Value::Null => "map[]".into(),
                            o => cell(o),
                        });
                    }
                    rows.push(row);
                }
            }
            rows.sort();
            let mut headers = vec!["Path", "Type", "Accessor", "Description"];
            if a.detailed {
                headers.extend(["Replication", "Options"]);
                for r in rows.iter_mut() {
                    r[4] = if r[4] == "true" {
                        "local"
                    } else {
                        "replicated"
                    }
                    .into();
                }
            }
            println!("{}", table(&headers, &rows));
            Ok(0)
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum OperatorCmd {
    /// Initialise a new server: prints the unseal key shares and the root token.
    Init(InitArgs),
    /// Give one unseal key share (prompted without echo when absent).
    Unseal(UnsealArgs),
    /// Seal the server.
    Seal(NoArgs),
    /// Generate a token from root key shares (`-dr-token`: the DR operation token).
    GenerateRoot(super::generate_root::GenerateRootArgs),
    /// Save or restore a snapshot of the server's storage.
    #[command(subcommand)]
    Snapshot(super::snapshot::SnapshotCmd),
}

#[derive(clap::Args, Debug)]
pub struct InitArgs {
    /// Number of key shares.
    #[arg(long, default_value_t = 5)]
    pub key_shares: u8,
    /// Shares needed to unseal.
    #[arg(long, default_value_t = 3)]
    pub key_threshold: u8,
    /// Only report whether the server is initialised (exit 0 yes, 2 no).
    #[arg(long)]
    pub status: bool,
    #[command(flatten)]
    pub common: Common,
}

#[derive(clap::Args, Debug)]
pub struct UnsealArgs {
    /// One unseal key share (hex or base64).
    pub key: Option<String>,
    /// Discard the shares given so far.
    #[arg(long)]
    pub reset: bool,
    #[command(flatten)]
    pub common: Common,
}

pub fn operator(cmd: OperatorCmd) -> CmdResult {
    match cmd {
        OperatorCmd::Init(a) => {
            let c = Client::new(&a.common)?;
            if a.status {
                let r = c
                    .call("GET", "sys/init", None)
                    .ctx(|| "checking the init status".into())?;
                let init = r.body["initialized"].as_bool().unwrap_or(false);
                if a.common.format == Format::Json {
                    print_json(&r.body);
                } else if init {
                    println!("Cairn is initialized");
                } else {
                    println!("Cairn is not initialized");
                }
                return Ok(if init { 0 } else { 2 });
            }
            if a.key_threshold == 0 || a.key_threshold > a.key_shares {
                return Err(CliError::Local(
                    "-key-threshold must be between 1 and -key-shares".into(),
                ));
            }
            let r = c
                .call(
                    "PUT",
                    "sys/init",
                    Some(&json!({
                        "secret_shares": a.key_shares,
                        "secret_threshold": a.key_threshold,
                    })),
                )
                .ctx(|| "initializing".into())?;
            let b = &r.body;
            match a.common.format {
                Format::Json => print_json(&json!({
                    "unseal_keys_b64": b["keys_base64"],
                    "unseal_keys_hex": b["keys"],
                    "unseal_shares": a.key_shares,
                    "unseal_threshold": a.key_threshold,
                    "root_token": b["root_token"],
                })),
                Format::Table => {
                    let keys = b["keys_base64"]
                        .as_array()
                        .or_else(|| b["keys"].as_array())
                        .cloned()
                        .unwrap_or_default();
                    for (i, k) in keys.iter().enumerate() {
                        println!("Unseal Key {}: {}", i + 1, cell(k));
                    }
                    println!();
                    println!("Initial Root Token: {}", cell(&b["root_token"]));
                    println!();
                    println!(
                        "Cairn initialized with {} key shares and a key threshold of {}. Please\n\
                         securely distribute the key shares printed above. When the server is\n\
                         re-sealed or restarted, at least {} of these keys are needed to unseal it\n\
                         (\"cairn operator unseal\").",
                        a.key_shares, a.key_threshold, a.key_threshold
                    );
                }
            }
            Ok(0)
        }
        OperatorCmd::Unseal(a) => {
            let c = Client::new(&a.common)?;
            let body = if a.reset {
                json!({ "reset": true })
            } else {
                let key = match a.key {
                    Some(k) if k == "-" => read_stdin()?.trim().to_string(),
                    Some(k) => k,
                    None => prompt_secret("Unseal Key (will be hidden): ")?,
                };
                if key.trim().is_empty() {
                    return Err(CliError::Local("an unseal key is required".into()));
                }
                json!({ "key": key.trim() })
            };
            let r = c
                .call("PUT", "sys/unseal", Some(&body))
                .ctx(|| "unsealing".into())?;
            // Still sealed after a valid share is progress, not an error.
            let leader = c.call("GET", "sys/leader", None).ok().map(|l| l.body);
            print_seal_status(&r.body, leader.as_ref(), a.common.format).map(|_| 0)
        }
        OperatorCmd::Seal(a) => {
            let c = Client::new(&a.common)?;
            c.call("PUT", "sys/seal", None).ctx(|| "sealing".into())?;
            if a.common.format == Format::Table {
                println!("Success! Cairn is sealed.");
            }
            Ok(0)
        }
        OperatorCmd::GenerateRoot(a) => super::generate_root::run(a),
        OperatorCmd::Snapshot(c) => super::snapshot::run(c),
    }
}
