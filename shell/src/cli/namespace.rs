//! `namespace create|list|delete|lookup`: manage namespaces (`sys/namespaces`) relative to the
//! namespace given by `-namespace` / `CAIRN_NAMESPACE`.

use super::output::{cell, kv_table, object_rows, table};
use super::{print_json, CliError, Client, CmdResult, Common, Ctx, Format};
use clap::Subcommand;
use serde_json::{json, Map, Value};

#[derive(Subcommand, Debug)]
pub enum NamespaceCmd {
    /// Create a namespace (relative to the current namespace).
    Create(CreateArgs),
    /// List the child namespaces of the current namespace.
    List(ListArgs),
    /// Delete a namespace with its mounts, data, policies and tokens (refused while it has
    /// child namespaces).
    Delete(PathArgs),
    /// Show a namespace's id, path and custom metadata.
    Lookup(PathArgs),
}

#[derive(clap::Args, Debug)]
pub struct CreateArgs {
    pub path: String,
    /// Custom metadata as key=value (repeatable).
    #[arg(long = "custom-metadata")]
    pub custom_metadata: Vec<String>,
    #[command(flatten)]
    pub common: Common,
}

#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// Also print each namespace's id and custom metadata.
    #[arg(long)]
    pub detailed: bool,
    #[command(flatten)]
    pub common: Common,
}

#[derive(clap::Args, Debug)]
pub struct PathArgs {
    pub path: String,
    #[command(flatten)]
    pub common: Common,
}

fn ns_path(p: &str) -> Result<String, CliError> {
    let t = p.trim().trim_matches('/');
    if t.is_empty() {
        return Err(CliError::Local("a namespace path is required".into()));
    }
    Ok(format!("sys/namespaces/{t}"))
}

fn print_ns(data: &Value, format: Format) {
    match format {
        Format::Json => print_json(data),
        Format::Table => println!("{}", kv_table(&object_rows(data))),
    }
}

pub fn run(cmd: NamespaceCmd) -> CmdResult {
    match cmd {
        NamespaceCmd::Create(a) => {
            let path = ns_path(&a.path)?;
            let mut meta = Map::new();
            for kv in &a.custom_metadata {
                let (k, v) = kv.split_once('=').ok_or_else(|| {
                    CliError::Local(format!("custom-metadata: expected key=value, got {kv:?}"))
                })?;
                meta.insert(k.to_string(), json!(v));
            }
            let body = if meta.is_empty() {
                json!({})
            } else {
                json!({ "custom_metadata": meta })
            };
            let c = Client::new(&a.common)?;
            let r = c
                .call("POST", &path, Some(&body))
                .ctx(|| "creating the namespace".into())?;
            print_ns(&r.body["data"], a.common.format);
            Ok(0)
        }
        NamespaceCmd::List(a) => {
            let c = Client::new(&a.common)?;
            let r = c
                .send("LIST", "sys/namespaces", None)
                .ctx(|| "listing namespaces".into())?;
            if r.status == 404 {
                if a.common.format == Format::Json {
                    print_json(&json!([]));
                } else {
                    eprintln!("No namespaces found");
                }
                return Ok(if a.common.format == Format::Json {
                    0
                } else {
                    2
                });
            }
            if r.status >= 400 {
                return Err(c.api_error("LIST", "sys/namespaces", &r))
                    .ctx(|| "listing namespaces".into());
            }
            let keys = r.body["data"]["keys"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let info = &r.body["data"]["key_info"];
            match (a.common.format, a.detailed) {
                (Format::Json, false) => print_json(&Value::Array(keys)),
                (Format::Json, true) => print_json(info),
                (Format::Table, false) => {
                    println!(
                        "{}",
                        table(
                            &["Keys"],
                            &keys.iter().map(|k| vec![cell(k)]).collect::<Vec<_>>()
                        )
                    );
                }
                (Format::Table, true) => {
                    let rows: Vec<Vec<String>> = keys
                        .iter()
                        .map(|k| {
                            let i = &info[k.as_str().unwrap_or_default()];
                            vec![cell(k), cell(&i["id"]), cell(&i["custom_metadata"])]
                        })
                        .collect();
                    println!("{}", table(&["Keys", "id", "custom_metadata"], &rows));
                }
            }
            Ok(0)
        }
        NamespaceCmd::Delete(a) => {
            let path = ns_path(&a.path)?;
            let c = Client::new(&a.common)?;
            c.call("DELETE", &path, None)
                .ctx(|| "deleting the namespace".into())?;
            if a.common.format == Format::Table {
                println!(
                    "Success! Namespace deleted at: {}/",
                    a.path.trim_matches('/')
                );
            }
            Ok(0)
        }
        NamespaceCmd::Lookup(a) => {
            let path = ns_path(&a.path)?;
            let c = Client::new(&a.common)?;
            let r = c
                .send("GET", &path, None)
                .ctx(|| "looking up the namespace".into())?;
            if r.status == 404 {
                eprintln!("Namespace not found: {}", a.path);
                return Ok(2);
            }
            if r.status >= 400 {
                return Err(c.api_error("GET", &path, &r))
                    .ctx(|| "looking up the namespace".into());
            }
            print_ns(&r.body["data"], a.common.format);
            Ok(0)
        }
    }
}
