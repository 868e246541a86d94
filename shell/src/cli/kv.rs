//! Generic path commands: `read`, `write`, `list`, `delete`, and the parsing of Vault-style
//! data arguments (`k=v`, `k=@file`, `k=-`, `@file.json`, `-`).

use super::output::{self, cell, duration, kv_table};
use super::{print_json, read_stdin, CliError, Client, CmdResult, Common, Ctx, Format};
use serde_json::{Map, Value};

#[derive(clap::Args, Debug)]
pub struct PathArgs {
    /// API path, e.g. secret/app.
    pub path: String,
    #[command(flatten)]
    pub common: Common,
}

#[derive(clap::Args, Debug)]
pub struct ReadArgs {
    /// API path, e.g. secret/app.
    pub path: String,
    /// Print only this field's value.
    #[arg(long)]
    pub field: Option<String>,
    #[command(flatten)]
    pub common: Common,
}

#[derive(clap::Args, Debug)]
pub struct WriteArgs {
    /// API path, e.g. secret/app.
    pub path: String,
    /// Data: k=v, k=@file (value from a file), k=- (value from stdin), @file.json or - (a JSON
    /// object from stdin).
    pub data: Vec<String>,
    /// Print only this field of the response.
    #[arg(long)]
    pub field: Option<String>,
    /// Send POST instead of PUT.
    #[arg(long)]
    pub post: bool,
    #[command(flatten)]
    pub common: Common,
}

fn insert(m: &mut Map<String, Value>, k: &str, v: Value) {
    match m.get_mut(k) {
        None => {
            m.insert(k.to_string(), v);
        }
        // A repeated key becomes a list, as in the reference CLI.
        Some(Value::Array(a)) => a.push(v),
        Some(old) => {
            let prev = old.take();
            *old = Value::Array(vec![prev, v]);
        }
    }
}

fn json_object(text: &str, from: &str) -> Result<Map<String, Value>, CliError> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(CliError::Local(format!("{from}: expected a JSON object"))),
        Err(e) => Err(CliError::Local(format!("{from}: invalid JSON: {e}"))),
    }
}

/// Parses write arguments into a JSON object; `stdin` supplies what `-` reads (once).
pub fn parse_data(
    args: &[String],
    mut stdin: impl FnMut() -> Result<String, CliError>,
) -> Result<Map<String, Value>, CliError> {
    let mut m = Map::new();
    let mut stdin_used = false;
    let mut take_stdin = |m: &str| -> Result<String, CliError> {
        if stdin_used {
            return Err(CliError::Local(format!(
                "{m}: stdin can be read only once per command"
            )));
        }
        stdin_used = true;
        stdin()
    };
    for a in args {
        if a == "-" {
            let text = take_stdin("-")?;
            for (k, v) in json_object(&text, "stdin")? {
                insert(&mut m, &k, v);
            }
            continue;
        }
        if let Some(file) = a.strip_prefix('@') {
            let text = std::fs::read_to_string(file)
                .map_err(|e| CliError::Local(format!("cannot read {file}: {e}")))?;
            for (k, v) in json_object(&text, file)? {
                insert(&mut m, &k, v);
            }
            continue;
        }
        let Some((k, v)) = a.split_once('=') else {
            return Err(CliError::Local(format!(
                "invalid argument {a:?}: expected key=value, key=@file, @file.json or -"
            )));
        };
        if k.is_empty() {
            return Err(CliError::Local(format!(
                "invalid argument {a:?}: the key is empty"
            )));
        }
        let value = if v == "-" {
            take_stdin(k)?
        } else if let Some(file) = v.strip_prefix('@') {
            std::fs::read_to_string(file)
                .map_err(|e| CliError::Local(format!("{k}: cannot read {file}: {e}")))?
        } else if let Some(lit) = v.strip_prefix("\\@") {
            format!("@{lit}")
        } else {
            v.to_string()
        };
        insert(&mut m, k, Value::String(value));
    }
    Ok(m)
}

/// The rows a response shows in table form: wrapping info, an auth block, or the data.
pub fn secret_rows(body: &Value) -> Vec<(String, String)> {
    if let Some(w) = body.get("wrap_info").filter(|w| w.is_object()) {
        return vec![
            ("wrapping_token:".into(), cell(&w["token"])),
            ("wrapping_accessor:".into(), cell(&w["accessor"])),
            (
                "wrapping_token_ttl:".into(),
                duration(w["ttl"].as_u64().unwrap_or(0)),
            ),
            (
                "wrapping_token_creation_time:".into(),
                cell(&w["creation_time"]),
            ),
            (
                "wrapping_token_creation_path:".into(),
                cell(&w["creation_path"]),
            ),
        ];
    }
    if let Some(a) = body.get("auth").filter(|a| a.is_object()) {
        return super::auth::auth_rows(a);
    }
    let mut rows = Vec::new();
    let data = match body.get("data") {
        Some(d) => d,
        None => body,
    };
    if let Some(l) = body.get("lease_duration").and_then(Value::as_u64) {
        if l > 0 {
            let key = if body["lease_id"].as_str().is_some_and(|s| !s.is_empty()) {
                rows.push(("lease_id".into(), cell(&body["lease_id"])));
                "lease_duration"
            } else {
                "refresh_interval"
            };
            rows.push((key.into(), duration(l)));
        }
    }
    rows.extend(output::object_rows(data));
    rows
}

/// Prints a response per format (and `-field`); used by read, write and token commands.
pub fn print_secret(body: &Value, format: Format, field: Option<&str>) -> CmdResult {
    if let Some(f) = field {
        let rows = secret_rows(body);
        let want = f.trim_end_matches(':');
        return match rows.iter().find(|(k, _)| k.trim_end_matches(':') == want) {
            Some((_, v)) => {
                println!("{v}");
                Ok(0)
            }
            None => Err(CliError::Local(format!(
                "field {f:?} not present in the response"
            ))),
        };
    }
    match format {
        Format::Json => print_json(&secret_view(body)),
        Format::Table => {
            let rows = secret_rows(body);
            if !rows.is_empty() {
                println!("{}", kv_table(&rows));
            }
        }
    }
    Ok(0)
}

/// The fields of an answer in the standard envelope that a secret has, as Vault's CLI prints
/// it: a copy some `sys/` answers repeat at the top level (`sys/mounts`, `sys/ha-status`) is
/// left out. An answer without the envelope (`sys/seal-status`) is printed whole.
fn secret_view(body: &Value) -> Value {
    const FIELDS: [&str; 9] = [
        "request_id",
        "lease_id",
        "lease_duration",
        "renewable",
        "data",
        "warnings",
        "wrap_info",
        "auth",
        "mount_type",
    ];
    match body.as_object() {
        Some(o) if o.contains_key("request_id") => Value::Object(
            o.iter()
                .filter(|(k, _)| FIELDS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        _ => body.clone(),
    }
}

pub fn read(a: ReadArgs) -> CmdResult {
    let c = Client::new(&a.common)?;
    let path = a.path.trim_start_matches('/');
    let r = c
        .send("GET", path, None)
        .ctx(|| format!("reading {path}"))?;
    if r.status == 404 {
        eprintln!("No value found at {path}");
        return Ok(2);
    }
    if r.status >= 400 {
        return Err(c.api_error("GET", path, &r)).ctx(|| format!("reading {path}"));
    }
    if r.body.is_null() {
        eprintln!("No value found at {path}");
        return Ok(2);
    }
    print_secret(&r.body, a.common.format, a.field.as_deref())
}

pub fn write(a: WriteArgs) -> CmdResult {
    let data = parse_data(&a.data, read_stdin)?;
    let c = Client::new(&a.common)?;
    let path = a.path.trim_start_matches('/');
    let method = if a.post { "POST" } else { "PUT" };
    let r = c
        .call(method, path, Some(&Value::Object(data)))
        .ctx(|| format!("writing data to {path}"))?;
    if r.body.is_null() {
        if a.common.format == Format::Table && a.field.is_none() {
            println!("Success! Data written to: {path}");
        }
        return Ok(0);
    }
    print_secret(&r.body, a.common.format, a.field.as_deref())
}

pub fn list(a: PathArgs) -> CmdResult {
    let c = Client::new(&a.common)?;
    let path = a.path.trim_start_matches('/');
    let r = c
        .send("LIST", path, None)
        .ctx(|| format!("listing {path}"))?;
    let shown = if path.ends_with('/') {
        path.to_string()
    } else {
        format!("{path}/")
    };
    if r.status == 404 {
        eprintln!("No value found at {shown}");
        return Ok(2);
    }
    if r.status >= 400 {
        return Err(c.api_error("LIST", path, &r)).ctx(|| format!("listing {path}"));
    }
    let keys = r.body["data"]["keys"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    match a.common.format {
        Format::Json => print_json(&Value::Array(keys)),
        Format::Table => {
            if keys.is_empty() {
                eprintln!("No value found at {shown}");
                return Ok(2);
            }
            println!("Keys\n----");
            for k in keys {
                println!("{}", cell(&k));
            }
        }
    }
    Ok(0)
}

pub fn delete(a: PathArgs) -> CmdResult {
    let c = Client::new(&a.common)?;
    let path = a.path.trim_start_matches('/');
    c.call("DELETE", path, None)
        .ctx(|| format!("deleting {path}"))?;
    if a.common.format == Format::Table {
        println!("Success! Data deleted (if it existed) at: {path}");
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_output_keeps_the_envelope_and_drops_its_top_level_copy() {
        let body = serde_json::json!({
            "request_id": "r", "lease_id": "", "lease_duration": 0, "renewable": false,
            "data": { "nodes": [{ "hostname": "a" }] }, "warnings": null,
            "nodes": [{ "hostname": "a" }],
        });
        let v = super::secret_view(&body);
        assert!(v.get("nodes").is_none(), "{v}");
        assert_eq!(v["data"]["nodes"][0]["hostname"], "a");
        assert_eq!(v["request_id"], "r");
        assert!(
            v.as_object().is_some_and(|o| o.contains_key("warnings")),
            "{v}"
        );
        // Not an envelope: printed whole.
        let raw = serde_json::json!({ "initialized": true, "sealed": false });
        assert_eq!(super::secret_view(&raw), raw);
    }

    use super::*;
    use serde_json::json;

    fn parse(args: &[&str], stdin: &str) -> Result<Value, CliError> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let s = stdin.to_string();
        parse_data(&args, move || Ok(s.clone())).map(Value::Object)
    }

    #[test]
    fn data_arguments() {
        assert_eq!(
            parse(&["a=1", "b=x=y", "a=2", "c=\\@lit"], "").unwrap(),
            json!({"a": ["1", "2"], "b": "x=y", "c": "@lit"})
        );
        assert_eq!(
            parse(&["-", "z=1"], r#"{"k": {"n": 1}}"#).unwrap(),
            json!({"k": {"n": 1}, "z": "1"})
        );
        assert_eq!(
            parse(&["pw=-"], "s3cret\n").unwrap(),
            json!({"pw": "s3cret\n"})
        );
        assert!(parse(&["-", "x=-"], "{}").is_err());
        assert!(parse(&["novalue"], "").is_err());
        assert!(parse(&["=v"], "").is_err());
        assert!(parse(&["-"], "[1]").is_err());
        assert_eq!(parse(&["k=@/nonexistent/file"], "").unwrap_err().code(), 1);
    }

    #[test]
    fn rows_prefer_wrap_then_auth_then_data() {
        let r = secret_rows(&json!({"data": {"k": "v"}, "lease_duration": 0}));
        assert_eq!(r, vec![("k".to_string(), "v".to_string())]);
        let r = secret_rows(&json!({"data": null, "wrap_info": {"token": "w", "ttl": 300}}));
        assert_eq!(r[0], ("wrapping_token:".to_string(), "w".to_string()));
        assert_eq!(r[2].1, "5m");
    }
}
