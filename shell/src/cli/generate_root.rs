//! `operator generate-root`: drives a key-share token generation attempt from the command
//! line. With `-dr-token` it generates the DR operation token on a DR secondary
//! (`sys/replication/dr/secondary/generate-operation-token/*`); root token generation
//! (`sys/generate-root/*`) is not served by Cairn, so without `-dr-token` only `-decode` and
//! `-generate-otp` work.
//!
//! Modes (one at a time): `-init [-otp OTP] [-pgp-key FILE]` starts an attempt and prints
//! the nonce and the one-time password (shown once); `-status`; `-cancel`; `-generate-otp`
//! prints a fresh OTP; `-decode ENCODED -otp OTP` prints the token an encoded token holds.
//! Without a mode flag, one key share is given to the attempt: from the argument, `-` for
//! stdin, or prompted for without echo; `-nonce` defaults to the attempt in progress.

use super::output::kv_table;
use super::Format;
use super::{print_json, prompt_secret, read_stdin, CliError, Client, CmdResult, Common, Ctx};
use base64::Engine;
use cairn_core::replication::dr_token;
use serde_json::{json, Value};

#[derive(clap::Args, Debug)]
pub struct GenerateRootArgs {
    /// Generate a DR operation token (run against a DR secondary) instead of a root token.
    #[arg(long)]
    pub dr_token: bool,
    /// Start a new generation attempt (prints the nonce and, once, the OTP).
    #[arg(long)]
    pub init: bool,
    /// Print the status of the attempt in progress.
    #[arg(long)]
    pub status: bool,
    /// Cancel the attempt in progress (its progress is discarded).
    #[arg(long)]
    pub cancel: bool,
    /// Print a new random OTP to pass with -init -otp.
    #[arg(long)]
    pub generate_otp: bool,
    /// Decode this encoded token (needs -otp) and print the token.
    #[arg(long, value_name = "ENCODED")]
    pub decode: Option<String>,
    /// With -init: use this OTP instead of one from the server. With -decode: the OTP the
    /// token was encoded with.
    #[arg(long)]
    pub otp: Option<String>,
    /// With -init: file holding an OpenPGP public key (binary, base64 or ASCII-armored); the
    /// token is then encrypted to it instead of encoded with an OTP.
    #[arg(long, value_name = "FILE")]
    pub pgp_key: Option<String>,
    /// Nonce of the attempt the key share is for (default: the attempt in progress).
    #[arg(long)]
    pub nonce: Option<String>,
    /// One root key share (hex or base64); `-` reads it from stdin; prompted when absent.
    pub key: Option<String>,
    #[command(flatten)]
    pub common: Common,
}

struct Paths {
    attempt: &'static str,
    update: &'static str,
    what: &'static str,
}

fn paths(dr: bool) -> Paths {
    if dr {
        Paths {
            attempt: "sys/replication/dr/secondary/generate-operation-token/attempt",
            update: "sys/replication/dr/secondary/generate-operation-token/update",
            what: "DR operation token",
        }
    } else {
        Paths {
            attempt: "sys/generate-root/attempt",
            update: "sys/generate-root/update",
            what: "root token",
        }
    }
}

pub fn run(a: GenerateRootArgs) -> CmdResult {
    let modes = [
        a.init,
        a.status,
        a.cancel,
        a.generate_otp,
        a.decode.is_some(),
    ];
    if modes.iter().filter(|m| **m).count() > 1 {
        return Err(CliError::Local(
            "use only one of -init, -status, -cancel, -generate-otp and -decode".into(),
        ));
    }
    if let Some(enc) = &a.decode {
        return decode(&a, enc);
    }
    if a.generate_otp {
        let otp = cairn_core::crypto::base62(&mut rand_core::OsRng, dr_token::TOKEN_LEN);
        match a.common.format {
            Format::Json => print_json(&json!({ "otp": otp })),
            Format::Table => println!("{otp}"),
        }
        return Ok(0);
    }
    if !a.dr_token {
        return Err(CliError::Local(
            "this server generates DR operation tokens with key shares, not root tokens: add -dr-token \
             (and run it against the DR secondary)"
                .into(),
        ));
    }
    let p = paths(a.dr_token);
    let c = Client::new(&a.common)?;
    if a.init {
        return init(&a, &c, &p);
    }
    if a.status {
        let r = call(&c, "GET", p.attempt, None)
            .ctx(|| format!("getting the {} generation status", p.what))?;
        print_attempt(&r, a.common.format);
        return Ok(0);
    }
    if a.cancel {
        call(&c, "DELETE", p.attempt, None)
            .ctx(|| format!("cancelling the {} generation", p.what))?;
        if a.common.format == Format::Table {
            println!(
                "Success! {} generation canceled (if it was started)",
                p.what
            );
        }
        return Ok(0);
    }
    provide(&a, &c, &p)
}

/// Sends a request; an error status is an [`CliError::Api`].
fn call(c: &Client, method: &str, path: &str, body: Option<&Value>) -> Result<Value, CliError> {
    let r = c.send(method, path, body)?;
    if r.status >= 400 {
        return Err(c.api_error(method, path, &r));
    }
    Ok(r.body)
}

fn read_pgp_key(file: &str) -> Result<String, CliError> {
    let bytes = std::fs::read(file)
        .map_err(|e| CliError::Local(format!("cannot read PGP key file {file}: {e}")))?;
    if let Ok(text) = std::str::from_utf8(&bytes) {
        let t = text.trim();
        if t.starts_with("-----BEGIN PGP") {
            return Ok(t.to_string());
        }
        let compact: String = t.chars().filter(|c| !c.is_whitespace()).collect();
        if !compact.is_empty()
            && base64::engine::general_purpose::STANDARD
                .decode(compact.as_bytes())
                .is_ok()
        {
            return Ok(compact);
        }
    }
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

fn init(a: &GenerateRootArgs, c: &Client, p: &Paths) -> CmdResult {
    let mut body = serde_json::Map::new();
    if let Some(f) = a.pgp_key.as_deref().filter(|f| !f.is_empty()) {
        body.insert("pgp_key".into(), json!(read_pgp_key(f)?));
    }
    if let Some(otp) = a.otp.as_deref().filter(|o| !o.is_empty()) {
        body.insert("otp".into(), json!(otp.trim()));
    }
    let r = call(c, "PUT", p.attempt, Some(&Value::Object(body)))
        .ctx(|| format!("initializing the {} generation", p.what))?;
    if a.common.format == Format::Table && r["otp"].as_str().is_some_and(|o| !o.is_empty()) {
        println!(
            "A One-Time-Password has been generated for you and is shown in the OTP field.\n\
             You will need this value to decode the resulting {}, so keep it safe.",
            p.what
        );
    }
    print_attempt(&r, a.common.format);
    Ok(0)
}

fn provide(a: &GenerateRootArgs, c: &Client, p: &Paths) -> CmdResult {
    let nonce = match a.nonce.as_deref().filter(|n| !n.is_empty()) {
        Some(n) => n.to_string(),
        None => {
            let st = call(c, "GET", p.attempt, None)
                .ctx(|| format!("getting the {} generation status", p.what))?;
            match st["nonce"].as_str().filter(|n| !n.is_empty()) {
                Some(n) => n.to_string(),
                None => {
                    return Err(CliError::Local(format!(
                        "no {} generation is in progress; start one with -init",
                        p.what
                    )))
                }
            }
        }
    };
    let key = match a.key.as_deref() {
        Some("-") => read_stdin()?.trim().to_string(),
        Some(k) => k.trim().to_string(),
        None => prompt_secret("Unseal Key (will be hidden): ")?
            .trim()
            .to_string(),
    };
    if key.is_empty() {
        return Err(CliError::Local("a key share is required".into()));
    }
    let r = call(
        c,
        "PUT",
        p.update,
        Some(&json!({ "key": key, "nonce": nonce })),
    )
    .ctx(|| format!("providing a key share for the {} generation", p.what))?;
    // A client-supplied OTP given again here decodes the token at once.
    let done = r["complete"].as_bool().unwrap_or(false);
    let enc = r["encoded_token"].as_str().unwrap_or("").to_string();
    print_attempt(&r, a.common.format);
    if done
        && a.common.format == Format::Table
        && r["pgp_fingerprint"].as_str().unwrap_or("").is_empty()
    {
        match a.otp.as_deref().filter(|o| !o.is_empty()) {
            Some(otp) => match dr_token::decode_token(&enc, otp) {
                Ok(t) => println!("\nDecoded Token: {t}"),
                Err(e) => eprintln!("\nCould not decode the token with the -otp given: {e}"),
            },
            None => println!(
                "\nDecode the token with:\n  cairn operator generate-root{} -decode={enc} -otp=<OTP from -init>",
                if p.what == "DR operation token" { " -dr-token" } else { "" }
            ),
        }
    }
    Ok(0)
}

fn decode(a: &GenerateRootArgs, enc: &str) -> CmdResult {
    let otp = a
        .otp
        .as_deref()
        .filter(|o| !o.trim().is_empty())
        .ok_or_else(|| CliError::Local("-decode needs -otp (the OTP printed by -init)".into()))?;
    let enc = if enc == "-" {
        read_stdin()?.trim().to_string()
    } else {
        enc.trim().to_string()
    };
    let token = dr_token::decode_token(&enc, otp)
        .map_err(|e| CliError::Local(format!("cannot decode the token: {e}")))?;
    match a.common.format {
        Format::Json => print_json(&json!({ "token": token })),
        Format::Table => println!("{token}"),
    }
    Ok(0)
}

/// The attempt as a Key/Value table (or its JSON).
fn print_attempt(v: &Value, format: Format) {
    if format == Format::Json {
        print_json(v);
        return;
    }
    let s = |k: &str| match &v[k] {
        Value::String(x) => x.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    };
    let mut rows = vec![
        ("Nonce".to_string(), s("nonce")),
        ("Started".into(), s("started")),
        (
            "Progress".into(),
            format!("{}/{}", s("progress"), s("required")),
        ),
        ("Complete".into(), s("complete")),
    ];
    if !s("pgp_fingerprint").is_empty() {
        rows.push(("PGP Fingerprint".into(), s("pgp_fingerprint")));
    }
    if !s("encoded_token").is_empty() {
        rows.push(("Encoded Token".into(), s("encoded_token")));
    }
    if !s("otp").is_empty() {
        rows.push(("OTP".into(), s("otp")));
    }
    if v.get("otp_length").is_some() && s("otp_length") != "0" {
        rows.push(("OTP Length".into(), s("otp_length")));
    }
    println!("{}", kv_table(&rows));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgp_key_files_are_sent_as_base64_or_armor() {
        let d = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let bin = d.path().join("k.gpg");
        std::fs::write(&bin, [0x99u8, 0x01, 0xff, 0x00]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            read_pgp_key(bin.to_str().unwrap_or_default()).unwrap_or_default(),
            "mQH/AA=="
        );
        let arm = d.path().join("k.asc");
        std::fs::write(&arm, "\n-----BEGIN PGP PUBLIC KEY BLOCK-----\nx\n")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(read_pgp_key(arm.to_str().unwrap_or_default())
            .unwrap_or_default()
            .starts_with("-----BEGIN PGP PUBLIC KEY BLOCK-----"));
        let b64 = d.path().join("k.b64");
        std::fs::write(&b64, "mQH/\nAA==\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            read_pgp_key(b64.to_str().unwrap_or_default()).unwrap_or_default(),
            "mQH/AA=="
        );
    }
}
