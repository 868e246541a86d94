//! `login` (LDAP or an existing token; the token is stored in `~/.cairn-token`) and the
//! `token create|lookup|renew|revoke` commands.

use super::client::token_file;
use super::kv::{parse_data, print_secret};
use super::output::{cell, duration, kv_table};
use super::{
    print_json, prompt_secret, read_stdin, CliError, Client, CmdResult, Common, Ctx, Format,
};
use clap::Subcommand;
use serde_json::{json, Value};

#[derive(clap::Args, Debug)]
pub struct LoginArgs {
    /// Auth method: `token` (default) or `ldap`.
    #[arg(long, default_value = "token")]
    pub method: String,
    /// Mount path of the auth method (default: the method's name).
    #[arg(long)]
    pub path: Option<String>,
    /// Do not store the token in ~/.cairn-token.
    #[arg(long)]
    pub no_store: bool,
    /// Print only the token, and do not store it.
    #[arg(long)]
    pub token_only: bool,
    /// Print only this field (e.g. token).
    #[arg(long)]
    pub field: Option<String>,
    /// ldap: username=U [password=P] (the password is prompted without echo when absent);
    /// token: the token (prompted when absent).
    pub args: Vec<String>,
    #[command(flatten)]
    pub common: Common,
}

/// Rows of an `auth` block, as `login` and `token renew` show them.
pub fn auth_rows(a: &Value) -> Vec<(String, String)> {
    let policies = |k: &str| match &a[k] {
        Value::Null => "[]".to_string(),
        v => cell(v),
    };
    let mut rows = vec![
        ("token".to_string(), cell(&a["client_token"])),
        ("token_accessor".into(), cell(&a["accessor"])),
        (
            "token_duration".into(),
            duration(a["lease_duration"].as_u64().unwrap_or(0)),
        ),
        ("token_renewable".into(), cell(&a["renewable"])),
        (
            "token_policies".into(),
            if a["token_policies"].is_null() {
                policies("policies")
            } else {
                policies("token_policies")
            },
        ),
        ("identity_policies".into(), policies("identity_policies")),
        ("policies".into(), policies("policies")),
    ];
    if let Some(m) = a["metadata"].as_object() {
        for (k, v) in m {
            rows.push((format!("token_meta_{k}"), cell(v)));
        }
    }
    rows
}

/// Writes `token` to the token file (mode 0600) and returns its path.
pub fn store_token(token: &str) -> Result<std::path::PathBuf, CliError> {
    let p = token_file().ok_or_else(|| {
        CliError::Local("HOME is not set: cannot store the token (use -no-store)".into())
    })?;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    let mut f = o
        .open(&p)
        .map_err(|e| CliError::Local(format!("cannot write {}: {e}", p.display())))?;
    use std::io::Write;
    f.write_all(token.as_bytes())
        .map_err(|e| CliError::Local(format!("cannot write {}: {e}", p.display())))?;
    Ok(p)
}

/// Percent-encodes one path segment (a username may hold any character).
fn segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~@".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub fn login(a: LoginArgs) -> CmdResult {
    let mut c = Client::new(&a.common)?;
    let env_token = std::env::var("CAIRN_TOKEN").is_ok_and(|t| !t.is_empty());
    let (token, body) = match a.method.as_str() {
        "token" => login_token(&mut c, &a)?,
        "ldap" => login_ldap(&mut c, &a)?,
        m => {
            return Err(CliError::Local(format!(
                "unknown auth method {m:?}: supported methods are ldap and token"
            )))
        }
    };
    let Some(token) = token else {
        // A wrapped login answer: show the wrapping token, store nothing.
        return print_secret(&body, a.common.format, a.field.as_deref());
    };
    if a.token_only {
        println!("{token}");
        return Ok(0);
    }
    let store = !a.no_store;
    if store {
        store_token(&token)?;
    }
    if env_token {
        eprintln!(
            "WARNING! The CAIRN_TOKEN environment variable is set! It takes precedence over the\n\
             stored token: unset it, or set it to the new token, for the new token to be used.\n"
        );
    }
    if a.field.is_some() {
        return print_secret(&body, a.common.format, a.field.as_deref());
    }
    match a.common.format {
        Format::Json => print_json(&body),
        Format::Table => {
            if store {
                println!(
                    "Success! You are now authenticated. The token information displayed below\n\
                     is already stored in the token file. You do NOT need to run \"cairn login\"\n\
                     again. Future Cairn requests will automatically use this token.\n"
                );
            } else {
                println!(
                    "Success! You are now authenticated. The token was not stored (-no-store).\n"
                );
            }
            println!("{}", kv_table(&auth_rows(&body["auth"])));
        }
    }
    Ok(0)
}

fn login_ldap(c: &mut Client, a: &LoginArgs) -> Result<(Option<String>, Value), CliError> {
    let mut data = parse_data(&a.args, read_stdin)?;
    let username = match data.remove("username") {
        Some(Value::String(u)) if !u.is_empty() => u,
        Some(_) => return Err(CliError::Local("username: expected one value".into())),
        None => std::env::var("USER")
            .ok()
            .filter(|u| !u.is_empty())
            .ok_or_else(|| CliError::Local("username=... is required".into()))?,
    };
    let password = match data.remove("password") {
        Some(Value::String(p)) => p,
        Some(_) => return Err(CliError::Local("password: expected one value".into())),
        None => prompt_secret("Password (will be hidden): ")?,
    };
    data.insert("password".into(), Value::String(password));
    let mount = a.path.as_deref().unwrap_or("ldap").trim_matches('/');
    let path = format!("auth/{mount}/login/{}", segment(&username));
    c.token = None;
    let r = c
        .call("POST", &path, Some(&Value::Object(data)))
        .ctx(|| "authenticating".into())?;
    let token = r.body["auth"]["client_token"].as_str().map(str::to_string);
    if token.is_none() && r.body["wrap_info"].is_null() {
        return Err(CliError::Api {
            method: "POST".into(),
            url: c.url(&path),
            status: r.status,
            errors: vec!["the response carries no auth.client_token".into()],
            hint: None,
        })
        .ctx(|| "authenticating".into());
    }
    Ok((token, r.body))
}

fn login_token(c: &mut Client, a: &LoginArgs) -> Result<(Option<String>, Value), CliError> {
    let t = match a.args.as_slice() {
        [] => prompt_secret("Token (will be hidden): ")?,
        [one] if one == "-" => read_stdin()?.trim().to_string(),
        [one] => one.strip_prefix("token=").unwrap_or(one).to_string(),
        _ => {
            return Err(CliError::Local(
                "too many arguments: the token method takes one token".into(),
            ))
        }
    };
    if t.is_empty() {
        return Err(CliError::Local("a token is required".into()));
    }
    c.token = Some(t.clone());
    let r = c
        .call("GET", "auth/token/lookup-self", None)
        .ctx(|| "validating the token".into())?;
    let d = &r.body["data"];
    let auth = json!({
        "client_token": t,
        "accessor": d["accessor"],
        "lease_duration": d["ttl"],
        "renewable": d["renewable"],
        "policies": d["policies"],
        "token_policies": d["policies"],
        "identity_policies": d["identity_policies"],
        "metadata": d["meta"],
    });
    let mut body = r.body.clone();
    body["auth"] = auth;
    body["data"] = Value::Null;
    Ok((Some(t), body))
}

#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Create a token (child of the current one).
    Create(TokenCreateArgs),
    /// Show a token's properties (the current token when none is given).
    Lookup(TokenArgs),
    /// Renew a token's lease (the current token when none is given).
    Renew(TokenRenewArgs),
    /// Revoke a token and its children.
    Revoke(TokenRevokeArgs),
}

#[derive(clap::Args, Debug)]
pub struct TokenArgs {
    /// The token (or accessor with -accessor).
    pub token: Option<String>,
    /// Treat the argument as an accessor.
    #[arg(long)]
    pub accessor: bool,
    /// Print only this field.
    #[arg(long)]
    pub field: Option<String>,
    #[command(flatten)]
    pub common: Common,
}

#[derive(clap::Args, Debug)]
pub struct TokenRenewArgs {
    /// The token; the current token when absent.
    pub token: Option<String>,
    /// Requested lease extension, e.g. 1h.
    #[arg(long)]
    pub increment: Option<String>,
    #[arg(long)]
    pub field: Option<String>,
    #[command(flatten)]
    pub common: Common,
}

#[derive(clap::Args, Debug)]
pub struct TokenRevokeArgs {
    /// The token (or accessor with -accessor).
    pub token: Option<String>,
    /// Revoke the current token.
    #[arg(long = "self")]
    pub self_: bool,
    /// Treat the argument as an accessor.
    #[arg(long)]
    pub accessor: bool,
    /// `orphan`: revoke the token but not its children.
    #[arg(long)]
    pub mode: Option<String>,
    #[command(flatten)]
    pub common: Common,
}

#[derive(clap::Args, Debug)]
pub struct TokenCreateArgs {
    /// A policy for the token (repeatable).
    #[arg(long = "policy")]
    pub policies: Vec<String>,
    /// Initial TTL, e.g. 1h.
    #[arg(long)]
    pub ttl: Option<String>,
    #[arg(long)]
    pub display_name: Option<String>,
    /// Create a token with no parent.
    #[arg(long)]
    pub orphan: bool,
    /// Number of uses (0 = unlimited).
    #[arg(long)]
    pub use_limit: Option<u64>,
    #[arg(long)]
    pub field: Option<String>,
    #[command(flatten)]
    pub common: Common,
}

fn lookup_rows(d: &Value) -> Vec<(String, String)> {
    let mut rows = Vec::new();
    if let Some(m) = d.as_object() {
        for (k, v) in m {
            let s = match (k.as_str(), v.as_u64()) {
                ("ttl" | "creation_ttl" | "explicit_max_ttl" | "period", Some(0)) => "0s".into(),
                ("ttl" | "creation_ttl" | "explicit_max_ttl" | "period", Some(n)) => duration(n),
                _ => cell(v),
            };
            rows.push((k.clone(), s));
        }
    }
    rows
}

pub fn token(cmd: TokenCmd) -> CmdResult {
    match cmd {
        TokenCmd::Create(a) => {
            let c = Client::new(&a.common)?;
            let mut body = json!({});
            if !a.policies.is_empty() {
                body["policies"] = json!(a.policies);
            }
            if let Some(t) = &a.ttl {
                body["ttl"] = json!(t);
            }
            if let Some(d) = &a.display_name {
                body["display_name"] = json!(d);
            }
            if let Some(n) = a.use_limit {
                body["num_uses"] = json!(n);
            }
            let path = if a.orphan {
                "auth/token/create-orphan"
            } else {
                "auth/token/create"
            };
            let r = c
                .call("POST", path, Some(&body))
                .ctx(|| "creating the token".into())?;
            print_secret(&r.body, a.common.format, a.field.as_deref())
        }
        TokenCmd::Lookup(a) => {
            let c = Client::new(&a.common)?;
            let r = match (&a.token, a.accessor) {
                (None, true) => return Err(CliError::Local("-accessor needs an accessor".into())),
                (None, false) => c.call("GET", "auth/token/lookup-self", None),
                (Some(t), false) => c.call("POST", "auth/token/lookup", Some(&json!({"token": t}))),
                (Some(t), true) => c.call(
                    "POST",
                    "auth/token/lookup-accessor",
                    Some(&json!({"accessor": t})),
                ),
            }
            .ctx(|| "looking up the token".into())?;
            if let Some(f) = &a.field {
                let rows = lookup_rows(&r.body["data"]);
                return match rows.iter().find(|(k, _)| k == f) {
                    Some((_, v)) => {
                        println!("{v}");
                        Ok(0)
                    }
                    None => Err(CliError::Local(format!("field {f:?} not present"))),
                };
            }
            match a.common.format {
                Format::Json => print_json(&r.body),
                Format::Table => println!("{}", kv_table(&lookup_rows(&r.body["data"]))),
            }
            Ok(0)
        }
        TokenCmd::Renew(a) => {
            let c = Client::new(&a.common)?;
            let mut body = json!({});
            if let Some(i) = &a.increment {
                body["increment"] = json!(i);
            }
            let path = match &a.token {
                None => "auth/token/renew-self",
                Some(t) => {
                    body["token"] = json!(t);
                    "auth/token/renew"
                }
            };
            let r = c
                .call("POST", path, Some(&body))
                .ctx(|| "renewing the token".into())?;
            print_secret(&r.body, a.common.format, a.field.as_deref())
        }
        TokenCmd::Revoke(a) => {
            let c = Client::new(&a.common)?;
            let orphan = match a.mode.as_deref() {
                None | Some("") => false,
                Some("orphan") => true,
                Some(m) => {
                    return Err(CliError::Local(format!(
                        "-mode={m:?}: the supported mode is orphan"
                    )))
                }
            };
            let (path, body) = match (&a.token, a.self_, a.accessor) {
                (None, true, false) => ("auth/token/revoke-self", json!({})),
                (Some(_), true, _) => {
                    return Err(CliError::Local("-self takes no token argument".into()))
                }
                (Some(t), false, true) => ("auth/token/revoke-accessor", json!({"accessor": t})),
                (Some(t), false, false) if orphan => {
                    ("auth/token/revoke-orphan", json!({"token": t}))
                }
                (Some(t), false, false) => ("auth/token/revoke", json!({"token": t})),
                _ => {
                    return Err(CliError::Local(
                        "a token (or -self, or -accessor ACCESSOR) is required".into(),
                    ))
                }
            };
            c.call("POST", path, Some(&body))
                .ctx(|| "revoking the token".into())?;
            if a.common.format == Format::Table {
                println!("Success! Revoked token (if it existed)");
            }
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usernames_are_encoded_as_one_segment() {
        assert_eq!(segment("alice"), "alice");
        assert_eq!(segment("a b/c"), "a%20b%2Fc");
        assert_eq!(segment("jörg"), "j%C3%B6rg");
    }

    #[test]
    fn auth_rows_show_policies_and_meta() {
        let rows = auth_rows(&json!({
            "client_token": "t", "accessor": "a", "lease_duration": 3600, "renewable": true,
            "policies": ["default", "dev"], "metadata": {"username": "alice"}
        }));
        assert!(rows.contains(&("token_duration".into(), "1h".into())));
        assert!(rows.contains(&("token_policies".into(), "[default dev]".into())));
        assert!(rows.contains(&("identity_policies".into(), "[]".into())));
        assert!(rows.contains(&("token_meta_username".into(), "alice".into())));
    }
}
