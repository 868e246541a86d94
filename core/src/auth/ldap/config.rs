//! The LDAP method's configuration (`auth/<mount>/config`): fields with the reference's
//! defaults, partial updates over the stored value, validation that names the field, the
//! read view (never `bindpass` nor `client_tls_key`), and the connection settings a login
//! derives from it.

use super::escape;
use super::filter;
use super::ops::{ConnectSpec, Deref, Secret, TlsVersion};
use super::template;
use crate::api::{ApiError, ApiResult, Fields};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::net::IpAddr;

pub const DEFAULT_URL: &str = "ldap://127.0.0.1";
pub const DEFAULT_USERFILTER: &str = "({{.UserAttr}}={{.Username}})";
pub const DEFAULT_GROUPFILTER: &str =
    "(|(memberUid={{.Username}})(member={{.UserDN}})(uniqueMember={{.UserDN}}))";
/// Context fields of `userfilter` and `groupfilter`.
pub const USER_FIELDS: &[&str] = &["UserAttr", "Username"];
pub const GROUP_FIELDS: &[&str] = &["UserDN", "Username"];

/// The stored configuration of one LDAP mount.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LdapConfig {
    pub url: String,
    pub starttls: bool,
    pub insecure_tls: bool,
    pub certificate: String,
    pub client_tls_cert: String,
    pub client_tls_key: Secret,
    pub tls_min_version: String,
    pub tls_max_version: String,
    pub binddn: String,
    pub bindpass: Secret,
    pub userdn: String,
    pub userattr: String,
    pub userfilter: String,
    pub discoverdn: bool,
    pub deny_null_bind: bool,
    pub anonymous_group_search: bool,
    pub dereference_aliases: String,
    pub upndomain: String,
    pub groupfilter: String,
    pub groupdn: String,
    pub groupattr: String,
    pub username_as_alias: bool,
    pub case_sensitive_names: bool,
    pub use_token_groups: bool,
    pub use_pre111_group_cn_behavior: Option<bool>,
    pub max_page_size: i64,
    /// Seconds.
    pub request_timeout: u64,
    /// Seconds.
    pub connection_timeout: u64,
    pub token_policies: Vec<String>,
    pub token_ttl: u64,
    pub token_max_ttl: u64,
    pub token_explicit_max_ttl: u64,
    pub token_period: u64,
    pub token_num_uses: i64,
    pub token_no_default_policy: bool,
    pub token_bound_cidrs: Vec<String>,
    pub token_type: String,
    /// Failed logins that lock a user; 0 = the default (5).
    pub user_lockout_threshold: u64,
    /// Seconds a locked user stays locked; 0 = the default (15 minutes).
    pub user_lockout_duration: u64,
    /// Seconds without a failed login after which the count restarts; 0 = the default
    /// (15 minutes).
    pub user_lockout_counter_reset: u64,
    pub user_lockout_disable: bool,
}

impl Default for LdapConfig {
    fn default() -> Self {
        LdapConfig {
            url: DEFAULT_URL.into(),
            starttls: false,
            insecure_tls: false,
            certificate: String::new(),
            client_tls_cert: String::new(),
            client_tls_key: Secret::default(),
            tls_min_version: "tls12".into(),
            tls_max_version: "tls12".into(),
            binddn: String::new(),
            bindpass: Secret::default(),
            userdn: String::new(),
            userattr: "cn".into(),
            userfilter: DEFAULT_USERFILTER.into(),
            discoverdn: false,
            deny_null_bind: true,
            anonymous_group_search: false,
            dereference_aliases: "never".into(),
            upndomain: String::new(),
            groupfilter: DEFAULT_GROUPFILTER.into(),
            groupdn: String::new(),
            groupattr: "cn".into(),
            username_as_alias: false,
            case_sensitive_names: false,
            use_token_groups: false,
            use_pre111_group_cn_behavior: None,
            max_page_size: 0,
            request_timeout: 90,
            connection_timeout: 30,
            token_policies: Vec::new(),
            token_ttl: 0,
            token_max_ttl: 0,
            token_explicit_max_ttl: 0,
            token_period: 0,
            token_num_uses: 0,
            token_no_default_policy: false,
            token_bound_cidrs: Vec::new(),
            token_type: "default".into(),
            user_lockout_threshold: super::lockout::DEFAULT_THRESHOLD,
            user_lockout_duration: super::lockout::DEFAULT_DURATION,
            user_lockout_counter_reset: super::lockout::DEFAULT_COUNTER_RESET,
            user_lockout_disable: false,
        }
    }
}

/// Every field a config write accepts.
pub const FIELDS: &[&str] = &[
    "url",
    "starttls",
    "insecure_tls",
    "certificate",
    "client_tls_cert",
    "client_tls_key",
    "tls_min_version",
    "tls_max_version",
    "binddn",
    "bindpass",
    "userdn",
    "userattr",
    "userfilter",
    "discoverdn",
    "deny_null_bind",
    "anonymous_group_search",
    "dereference_aliases",
    "upndomain",
    "groupfilter",
    "groupdn",
    "groupattr",
    "username_as_alias",
    "case_sensitive_names",
    "use_token_groups",
    "use_pre111_group_cn_behavior",
    "max_page_size",
    "request_timeout",
    "connection_timeout",
    "token_policies",
    "token_ttl",
    "token_max_ttl",
    "token_explicit_max_ttl",
    "token_period",
    "token_num_uses",
    "token_no_default_policy",
    "token_bound_cidrs",
    "token_type",
    "token_strictly_bind_ip",
    "user_lockout_threshold",
    "user_lockout_duration",
    "user_lockout_counter_reset",
    "user_lockout_disable",
];

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::bad(msg)
}

/// Checks every comma-separated URL: `ldap://` or `ldaps://`, a host, an optional port.
pub fn parse_urls(url: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for raw in url.split(',') {
        let u = raw.trim();
        if u.is_empty() {
            continue;
        }
        let rest = u
            .strip_prefix("ldaps://")
            .or_else(|| u.strip_prefix("ldap://"))
            .ok_or_else(|| format!("{u:?} must use the ldap:// or ldaps:// scheme"))?;
        let hostport = rest.strip_suffix('/').unwrap_or(rest);
        if hostport.is_empty() {
            return Err(format!("{u:?} has no host"));
        }
        if hostport.contains(['/', '?', '@', ' ', '#']) {
            return Err(format!(
                "{u:?} must be scheme://host[:port] without path, user or query"
            ));
        }
        let (host, port) = if let Some(r) = hostport.strip_prefix('[') {
            let (h, after) = r
                .split_once(']')
                .ok_or_else(|| format!("{u:?} has an unterminated IPv6 address"))?;
            if h.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(format!("{u:?} has an invalid IPv6 address"));
            }
            match after {
                "" => (h, None),
                p => (
                    h,
                    Some(
                        p.strip_prefix(':')
                            .ok_or_else(|| format!("{u:?} has text after the IPv6 address"))?,
                    ),
                ),
            }
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(format!("{u:?} has no host"));
        }
        if let Some(p) = port {
            match p.parse::<u16>() {
                Ok(n) if n > 0 => {}
                _ => return Err(format!("{u:?} has an invalid port {p:?}")),
            }
        }
        out.push(u.to_string());
    }
    if out.is_empty() {
        return Err("at least one url must be provided".into());
    }
    Ok(out)
}

/// Checks a PEM bundle of one or more X.509 certificates.
fn check_certificates(field: &str, pem: &str) -> ApiResult<()> {
    let mut n = 0;
    for item in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
        let p = item.map_err(|e| bad(format!("{field}: failed to decode PEM block: {e}")))?;
        if p.label != "CERTIFICATE" {
            return Err(bad(format!(
                "{field}: expected a PEM CERTIFICATE block, found {:?}",
                p.label
            )));
        }
        p.parse_x509()
            .map_err(|e| bad(format!("{field}: failed to parse certificate: {e}")))?;
        n += 1;
    }
    if n == 0 {
        return Err(bad(format!(
            "{field}: failed to decode PEM block in the certificate"
        )));
    }
    Ok(())
}

/// Checks a PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC, unencrypted).
fn check_private_key(field: &str, pem: &str) -> ApiResult<()> {
    let mut found = false;
    for item in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
        // Never echo key material: errors name the field and the problem only.
        let p = item.map_err(|_| bad(format!("{field}: failed to decode PEM block")))?;
        match p.label.as_str() {
            "PRIVATE KEY" | "RSA PRIVATE KEY" | "EC PRIVATE KEY" => {}
            "ENCRYPTED PRIVATE KEY" => {
                return Err(bad(format!(
                    "{field}: encrypted private keys are not supported"
                )))
            }
            other => {
                return Err(bad(format!(
                    "{field}: expected a PEM private key, found {other:?}"
                )))
            }
        }
        match x509_parser::der_parser::parse_der(&p.contents) {
            Ok((rest, obj)) if rest.is_empty() && obj.as_sequence().is_ok() => {}
            _ => return Err(bad(format!("{field}: the private key is not valid DER"))),
        }
        if found {
            return Err(bad(format!("{field}: more than one private key")));
        }
        found = true;
    }
    if !found {
        return Err(bad(format!("{field}: failed to decode PEM block")));
    }
    Ok(())
}

/// Parses `a.b.c.d/n`, `x::y/n` or a bare address.
pub fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (ip, bits) = match s.split_once('/') {
        Some((ip, b)) => (ip, Some(b)),
        None => (s, None),
    };
    let ip: IpAddr = ip.trim().parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let bits = match bits {
        None => max,
        Some(b) => b.trim().parse::<u8>().ok().filter(|b| *b <= max)?,
    };
    Some((ip, bits))
}

/// Whether `addr` (an IP, optionally with `:port`) lies in the CIDR block.
pub fn cidr_contains(cidr: &str, addr: &str) -> bool {
    let Some((net, bits)) = parse_cidr(cidr) else {
        return false;
    };
    let ip: Option<IpAddr> = addr
        .parse()
        .ok()
        .or_else(|| addr.parse::<std::net::SocketAddr>().ok().map(|s| s.ip()));
    let Some(ip) = ip else { return false };
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(i)) => {
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(bits))
            };
            u32::from(n) & mask == u32::from(i) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(i)) => {
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(bits))
            };
            u128::from(n) & mask == u128::from(i) & mask
        }
        _ => false,
    }
}

/// Lower-cased, trimmed, de-duplicated and sorted policy names.
pub fn parse_policies(v: Vec<String>) -> Vec<String> {
    let mut p: Vec<String> = v
        .into_iter()
        .map(|s| s.trim().to_lowercase())
        .filter(|s| !s.is_empty())
        .collect();
    p.sort();
    p.dedup();
    p
}

fn check_template(
    field: &str,
    src: &str,
    fields: &[&str],
    sample: &[(&str, &str)],
) -> ApiResult<()> {
    let t = template::parse(src, fields).map_err(|e| bad(format!("invalid {field}: {e}")))?;
    let rendered = t.render(sample);
    filter::parse(&rendered).map_err(|e| {
        bad(format!(
            "invalid {field}: the rendered filter {rendered:?} is not a valid LDAP filter: {e}"
        ))
    })?;
    Ok(())
}

impl LdapConfig {
    /// Applies the fields present in a write body over `self`, validating each.
    pub fn apply(&mut self, f: &Fields) -> ApiResult<()> {
        let s = |name: &str| f.str(name);
        let b = |name: &str| f.bool(name);
        if let Some(u) = s("url")? {
            let u = u.trim().to_lowercase();
            if u.is_empty() {
                self.url = DEFAULT_URL.into();
            } else {
                parse_urls(&u).map_err(|e| bad(format!("url: {e}")))?;
                self.url = u;
            }
        }
        if let Some(v) = b("starttls")? {
            self.starttls = v;
        }
        if let Some(v) = b("insecure_tls")? {
            self.insecure_tls = v;
        }
        if let Some(v) = s("certificate")? {
            let v = v.trim().to_string();
            if !v.is_empty() {
                check_certificates("certificate", &v)?;
            }
            self.certificate = v;
        }
        if let Some(v) = s("client_tls_cert")? {
            let v = v.trim().to_string();
            if !v.is_empty() {
                check_certificates("client_tls_cert", &v)?;
            }
            self.client_tls_cert = v;
        }
        if let Some(v) = s("client_tls_key")? {
            let v = v.trim().to_string();
            if !v.is_empty() {
                check_private_key("client_tls_key", &v)?;
            }
            self.client_tls_key = Secret::new(v);
        }
        for (name, slot) in [
            ("tls_min_version", &mut self.tls_min_version),
            ("tls_max_version", &mut self.tls_max_version),
        ] {
            if let Some(v) = s(name)? {
                let v = if v.is_empty() { "tls12".to_string() } else { v };
                if TlsVersion::parse(&v).is_none() {
                    return Err(bad(format!(
                        "{name}: invalid value {v:?}; allowed: tls10, tls11, tls12, tls13"
                    )));
                }
                *slot = v;
            }
        }
        if let Some(v) = s("binddn")? {
            self.binddn = v;
        }
        if let Some(v) = s("bindpass")? {
            self.bindpass = Secret::new(v);
        }
        if let Some(v) = s("userdn")? {
            self.userdn = v;
        }
        if let Some(v) = s("userattr")? {
            let v = v.trim().to_lowercase();
            self.userattr = if v.is_empty() { "cn".into() } else { v };
            if !self
                .userattr
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == ';')
            {
                return Err(bad(format!(
                    "userattr: {:?} is not an attribute name",
                    self.userattr
                )));
            }
        }
        if let Some(v) = s("userfilter")? {
            self.userfilter = if v.is_empty() {
                DEFAULT_USERFILTER.into()
            } else {
                v
            };
        }
        if let Some(v) = b("discoverdn")? {
            self.discoverdn = v;
        }
        if let Some(v) = b("deny_null_bind")? {
            self.deny_null_bind = v;
        }
        if let Some(v) = b("anonymous_group_search")? {
            self.anonymous_group_search = v;
        }
        if let Some(v) = s("dereference_aliases")? {
            let v = if v.is_empty() { "never".to_string() } else { v };
            if Deref::parse(&v).is_none() {
                return Err(bad(format!(
                    "dereference_aliases: invalid value {v:?}; allowed: never, finding, searching, always"
                )));
            }
            self.dereference_aliases = v;
        }
        if let Some(v) = s("upndomain")? {
            self.upndomain = v;
        }
        if let Some(v) = s("groupfilter")? {
            self.groupfilter = if v.is_empty() {
                DEFAULT_GROUPFILTER.into()
            } else {
                v
            };
        }
        if let Some(v) = s("groupdn")? {
            self.groupdn = v;
        }
        if let Some(v) = s("groupattr")? {
            let v = v.trim().to_string();
            self.groupattr = if v.is_empty() { "cn".into() } else { v };
            if !self
                .groupattr
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == ';')
            {
                return Err(bad(format!(
                    "groupattr: {:?} is not an attribute name",
                    self.groupattr
                )));
            }
        }
        if let Some(v) = b("username_as_alias")? {
            self.username_as_alias = v;
        }
        if let Some(v) = b("case_sensitive_names")? {
            self.case_sensitive_names = v;
        }
        if let Some(v) = b("use_token_groups")? {
            self.use_token_groups = v;
        }
        // Read back as `false` (what a config read shows); binding tokens to the login's
        // address is not supported, so only `false` is accepted.
        if b("token_strictly_bind_ip")? == Some(true) {
            return Err(bad(
                "token_strictly_bind_ip: binding tokens to the login's IP address is not supported",
            ));
        }
        if let Some(v) = b("use_pre111_group_cn_behavior")? {
            self.use_pre111_group_cn_behavior = Some(v);
        }
        if let Some(v) = f.int("max_page_size")? {
            if v < 0 {
                return Err(bad("max_page_size: must be zero (no paging) or positive"));
            }
            if v > i64::from(i32::MAX) {
                return Err(bad("max_page_size: too large"));
            }
            self.max_page_size = v;
        }
        for (name, slot) in [
            ("request_timeout", &mut self.request_timeout),
            ("connection_timeout", &mut self.connection_timeout),
            ("token_ttl", &mut self.token_ttl),
            ("token_max_ttl", &mut self.token_max_ttl),
            ("token_explicit_max_ttl", &mut self.token_explicit_max_ttl),
            ("token_period", &mut self.token_period),
            ("user_lockout_duration", &mut self.user_lockout_duration),
            (
                "user_lockout_counter_reset",
                &mut self.user_lockout_counter_reset,
            ),
        ] {
            if let Some(v) = reject_negative(f, name)? {
                *slot = v;
            }
        }
        if let Some(v) = f.list("token_policies")? {
            self.token_policies = parse_policies(v);
        }
        if let Some(v) = f.int("token_num_uses")? {
            if v < 0 {
                return Err(bad("token_num_uses: must be zero (unlimited) or positive"));
            }
            self.token_num_uses = v;
        }
        if let Some(v) = f.int("user_lockout_threshold")? {
            if v < 0 {
                return Err(bad(
                    "user_lockout_threshold: must be zero (the default, 5) or positive",
                ));
            }
            self.user_lockout_threshold = v as u64;
        }
        if let Some(v) = b("user_lockout_disable")? {
            self.user_lockout_disable = v;
        }
        if let Some(v) = b("token_no_default_policy")? {
            self.token_no_default_policy = v;
        }
        if let Some(v) = f.list("token_bound_cidrs")? {
            for c in &v {
                if parse_cidr(c).is_none() {
                    return Err(bad(format!(
                        "token_bound_cidrs: {c:?} is not an IP address or CIDR block"
                    )));
                }
            }
            self.token_bound_cidrs = v;
        }
        if let Some(v) = s("token_type")? {
            let v = if v.is_empty() {
                "default".to_string()
            } else {
                v
            };
            match v.as_str() {
                "default" | "service" | "default-service" => self.token_type = v,
                "batch" | "default-batch" => {
                    return Err(bad("token_type: batch tokens are not supported"))
                }
                _ => {
                    return Err(bad(format!(
                    "token_type: invalid value {v:?}; allowed: default, service, default-service"
                )))
                }
            }
        }
        Ok(())
    }

    /// Cross-field checks, run after [`LdapConfig::apply`] and before storing.
    pub fn validate(&self) -> ApiResult<()> {
        parse_urls(&self.url).map_err(|e| bad(format!("url: {e}")))?;
        if !self.discoverdn
            && (self.binddn.is_empty() || self.bindpass.is_empty())
            && self.upndomain.is_empty()
            && self.userdn.is_empty()
        {
            return Err(bad(
                "cannot derive UserBindDN: set userdn, upndomain, binddn with bindpass, or discoverdn",
            ));
        }
        let min = TlsVersion::parse(&self.tls_min_version)
            .ok_or_else(|| bad("tls_min_version: invalid value"))?;
        let max = TlsVersion::parse(&self.tls_max_version)
            .ok_or_else(|| bad("tls_max_version: invalid value"))?;
        if max < min {
            return Err(bad(
                "tls_max_version: must be greater than or equal to tls_min_version",
            ));
        }
        match (
            self.client_tls_cert.is_empty(),
            self.client_tls_key.is_empty(),
        ) {
            (false, true) => {
                return Err(bad(
                    "client_tls_key: must also be provided when client_tls_cert is set",
                ))
            }
            (true, false) => {
                return Err(bad(
                    "client_tls_cert: must also be provided when client_tls_key is set",
                ))
            }
            _ => {}
        }
        check_template(
            "userfilter",
            &self.userfilter,
            USER_FIELDS,
            &[("UserAttr", "cn"), ("Username", "sample")],
        )?;
        check_template(
            "groupfilter",
            &self.groupfilter,
            GROUP_FIELDS,
            &[
                ("UserDN", &escape::filter_value("cn=sample,dc=example")),
                ("Username", "sample"),
            ],
        )?;
        if self.token_max_ttl > 0 && self.token_ttl > self.token_max_ttl {
            return Err(bad("token_ttl: cannot be greater than token_max_ttl"));
        }
        Ok(())
    }

    /// The `data` of a config read: everything but `bindpass` and `client_tls_key`.
    pub fn read_view(&self) -> Value {
        json!({
            "url": self.url,
            "starttls": self.starttls,
            "insecure_tls": self.insecure_tls,
            "certificate": self.certificate,
            "client_tls_cert": self.client_tls_cert,
            "tls_min_version": self.tls_min_version,
            "tls_max_version": self.tls_max_version,
            "binddn": self.binddn,
            "userdn": self.userdn,
            "userattr": self.userattr,
            "userfilter": self.userfilter,
            "discoverdn": self.discoverdn,
            "deny_null_bind": self.deny_null_bind,
            "anonymous_group_search": self.anonymous_group_search,
            "dereference_aliases": self.dereference_aliases,
            "upndomain": self.upndomain,
            "groupfilter": self.groupfilter,
            "groupdn": self.groupdn,
            "groupattr": self.groupattr,
            "username_as_alias": self.username_as_alias,
            "case_sensitive_names": self.case_sensitive_names,
            "use_token_groups": self.use_token_groups,
            "use_pre111_group_cn_behavior": self.use_pre111_group_cn_behavior.unwrap_or(false),
            "max_page_size": self.max_page_size,
            "request_timeout": self.request_timeout,
            "connection_timeout": self.connection_timeout,
            "token_policies": self.token_policies,
            "token_ttl": self.token_ttl,
            "token_max_ttl": self.token_max_ttl,
            "token_explicit_max_ttl": self.token_explicit_max_ttl,
            "token_period": self.token_period,
            "token_num_uses": self.token_num_uses,
            "token_no_default_policy": self.token_no_default_policy,
            "token_bound_cidrs": self.token_bound_cidrs,
            "token_type": self.token_type,
            // Cairn does not bind tokens to an IP; shown as the reference's default.
            "token_strictly_bind_ip": false,
            "user_lockout_threshold": self.user_lockout_threshold,
            "user_lockout_duration": self.user_lockout_duration,
            "user_lockout_counter_reset": self.user_lockout_counter_reset,
            "user_lockout_disable": self.user_lockout_disable,
        })
    }

    pub fn deref(&self) -> Deref {
        Deref::parse(&self.dereference_aliases).unwrap_or(Deref::Never)
    }

    /// Page size for searches: 0 = no paging.
    pub fn page_size(&self) -> u32 {
        u32::try_from(self.max_page_size.max(0)).unwrap_or(0)
    }

    /// The connection settings a login uses.
    pub fn connect_spec(&self) -> ConnectSpec {
        let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
        ConnectSpec {
            urls: parse_urls(&self.url).unwrap_or_default(),
            starttls: self.starttls,
            insecure_tls: self.insecure_tls,
            ca_pem: opt(&self.certificate),
            client_cert_pem: opt(&self.client_tls_cert),
            client_key_pem: (!self.client_tls_key.is_empty()).then(|| self.client_tls_key.clone()),
            tls_min: TlsVersion::parse(&self.tls_min_version).unwrap_or(TlsVersion::Tls12),
            tls_max: TlsVersion::parse(&self.tls_max_version).unwrap_or(TlsVersion::Tls12),
            connect_timeout_ms: self.connection_timeout.saturating_mul(1000),
            request_timeout_ms: self.request_timeout.saturating_mul(1000),
        }
    }

    /// Whether the user is found by a search (authenticated or anonymous) before binding.
    pub fn searches_for_user(&self) -> bool {
        self.discoverdn || (!self.binddn.is_empty() && !self.bindpass.is_empty())
    }

    /// Whether a service identity (binddn) performs the searches.
    pub fn has_service_bind(&self) -> bool {
        !self.binddn.is_empty() && !self.bindpass.is_empty()
    }
}

/// Reads a duration field refusing negative numbers with a message naming it.
fn reject_negative(f: &Fields, name: &str) -> ApiResult<Option<u64>> {
    if let Some(Value::Number(n)) = f.0.get(name) {
        if n.as_i64().is_some_and(|v| v < 0) {
            return Err(bad(format!("{name}: must not be negative")));
        }
    }
    f.duration(name)
}

/// Field names in a write body the config does not know (reported as warnings).
pub fn unknown_fields(body: &Map<String, Value>) -> Vec<String> {
    body.keys()
        .filter(|k| !FIELDS.contains(&k.as_str()))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::body_object;

    fn apply(v: Value) -> ApiResult<LdapConfig> {
        let body = body_object(&serde_json::to_vec(&v).unwrap()).unwrap();
        let mut c = LdapConfig::default();
        c.apply(&Fields(&body))?;
        c.validate()?;
        Ok(c)
    }

    #[test]
    fn defaults_match_the_reference() {
        let c = apply(json!({"userdn": "ou=people,dc=x"})).unwrap();
        let v = c.read_view();
        assert_eq!(v["url"], "ldap://127.0.0.1");
        assert_eq!(v["userattr"], "cn");
        assert_eq!(v["groupattr"], "cn");
        assert_eq!(v["userfilter"], DEFAULT_USERFILTER);
        assert_eq!(v["groupfilter"], DEFAULT_GROUPFILTER);
        assert_eq!(v["deny_null_bind"], true);
        assert_eq!(v["tls_min_version"], "tls12");
        assert_eq!(v["tls_max_version"], "tls12");
        assert_eq!(v["dereference_aliases"], "never");
        assert_eq!(v["max_page_size"], 0);
        assert_eq!(v["request_timeout"], 90);
        assert_eq!(v["connection_timeout"], 30);
        assert_eq!(v["user_lockout_threshold"], 5);
        assert_eq!(v["user_lockout_duration"], 900);
        assert_eq!(v["user_lockout_counter_reset"], 900);
        assert_eq!(v["user_lockout_disable"], false);
        assert!(v.get("bindpass").is_none());
        assert!(v.get("client_tls_key").is_none());
    }

    /// A config read can be written back as it is (the CLI and hvac round-trip it).
    #[test]
    fn a_config_read_is_accepted_as_a_write() {
        let c = apply(json!({"userdn": "ou=people,dc=x"})).unwrap();
        let v = c.read_view();
        let body = v.as_object().unwrap();
        assert_eq!(unknown_fields(body), Vec::<String>::new());
        apply(v.clone()).unwrap();
        let e = apply(json!({"userdn": "o=x", "token_strictly_bind_ip": true})).unwrap_err();
        assert!(e.to_string().contains("token_strictly_bind_ip"), "{e}");
    }

    #[test]
    fn lowercases_url_and_userattr() {
        let c =
            apply(json!({"url": "LDAP://Host:389, ldaps://b", "userattr": "UID", "userdn": "o=x"}))
                .unwrap();
        assert_eq!(c.url, "ldap://host:389, ldaps://b");
        assert_eq!(c.connect_spec().urls, vec!["ldap://host:389", "ldaps://b"]);
        assert_eq!(c.userattr, "uid");
    }

    #[test]
    fn each_invalid_value_names_its_field() {
        let cases = [
            (json!({"url": "http://x"}), "url"),
            (json!({"url": "ldap://x:99999"}), "url"),
            (json!({"url": "ldap://"}), "url"),
            (json!({"certificate": "not a pem"}), "certificate"),
            (
                json!({"certificate": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}),
                "certificate",
            ),
            (json!({"client_tls_key": "junk"}), "client_tls_key"),
            (
                json!({"dereference_aliases": "sometimes"}),
                "dereference_aliases",
            ),
            (
                json!({"userfilter": "({{.UserAttr}={{.Username}})"}),
                "userfilter",
            ),
            (json!({"userfilter": "({{.Nope}})"}), "userfilter"),
            (
                json!({"userfilter": "{{.UserAttr}}={{.Username}}"}),
                "userfilter",
            ),
            (json!({"groupfilter": "(member={{.UserDN}"}), "groupfilter"),
            (json!({"max_page_size": -1}), "max_page_size"),
            (json!({"tls_min_version": "ssl3"}), "tls_min_version"),
            (
                json!({"tls_min_version": "tls12", "tls_max_version": "tls11"}),
                "tls_max_version",
            ),
            (json!({"request_timeout": "soon"}), "request_timeout"),
            (json!({"token_ttl": -5}), "token_ttl"),
            (json!({"token_type": "batch"}), "token_type"),
            (
                json!({"token_bound_cidrs": "10.0.0.0/33"}),
                "token_bound_cidrs",
            ),
            (
                json!({"token_ttl": "2h", "token_max_ttl": "1h"}),
                "token_ttl",
            ),
            (json!({"starttls": "maybe"}), "starttls"),
            (
                json!({"user_lockout_threshold": -1}),
                "user_lockout_threshold",
            ),
            (
                json!({"user_lockout_duration": "forever"}),
                "user_lockout_duration",
            ),
            (
                json!({"user_lockout_counter_reset": -3}),
                "user_lockout_counter_reset",
            ),
            (
                json!({"user_lockout_disable": "no"}),
                "user_lockout_disable",
            ),
        ];
        for (body, field) in cases {
            let mut b = body.clone();
            b["userdn"] = json!("ou=people,dc=x");
            let e = apply(b).unwrap_err();
            assert_eq!(e.status(), 400);
            assert!(e.to_string().contains(field), "{body}: {e}");
        }
        let e = apply(json!({})).unwrap_err();
        assert!(e.to_string().contains("cannot derive UserBindDN"));
    }

    #[test]
    fn cidrs_match_addresses() {
        assert!(cidr_contains("10.0.0.0/8", "10.1.2.3:5555"));
        assert!(!cidr_contains("10.0.0.0/8", "11.1.2.3"));
        assert!(cidr_contains("127.0.0.1", "127.0.0.1"));
        assert!(cidr_contains("::1/128", "[::1]:80"));
    }
}
