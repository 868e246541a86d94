//! LDAP operations as plain data: what the node asks the shell to do ([`LdapCall`]) and
//! what comes back ([`LdapReply`]). Nothing here performs I/O; the shell executes calls
//! with a real directory client, the sim and the unit tests answer them with
//! [`super::fake::FakeDirectory`].
//!
//! Secrets (bind passwords, the client key) travel inside [`Secret`], whose `Debug`
//! prints `<redacted>`, so logging a call never leaks them.
//!
//! Logins travel as one [`LdapOp::Run`]: the executor runs the login machine
//! ([`super::login::Job::run`]) with its own connection, performing each operation, and
//! answers with the finished job; the machine itself stays free of I/O.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Identifies one operation; the reply carries the same id.
pub type OpId = u64;
/// Identifies one directory connection (one per login).
pub type ConnId = u64;

/// A secret string: never shown by `Debug`, stored as a plain JSON string (the barrier
/// encrypts stored values).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }
    /// The secret itself; only for handing it to the directory.
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            write!(f, "\"\"")
        } else {
            write!(f, "<redacted>")
        }
    }
}

/// TLS protocol versions, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TlsVersion {
    Tls10,
    Tls11,
    Tls12,
    Tls13,
}

impl TlsVersion {
    pub fn parse(s: &str) -> Option<TlsVersion> {
        Some(match s {
            "tls10" => TlsVersion::Tls10,
            "tls11" => TlsVersion::Tls11,
            "tls12" => TlsVersion::Tls12,
            "tls13" => TlsVersion::Tls13,
            _ => return None,
        })
    }
}

/// How to open a connection: the URLs are tried in order until one connects (TCP, then
/// TLS for `ldaps://` or StartTLS when asked).
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectSpec {
    pub urls: Vec<String>,
    /// Issue StartTLS after connecting to an `ldap://` URL.
    pub starttls: bool,
    /// Skip verification of the server certificate.
    pub insecure_tls: bool,
    /// CA certificates (PEM) that verify the server; system roots when absent.
    pub ca_pem: Option<String>,
    /// Client certificate chain (PEM) presented to the server.
    pub client_cert_pem: Option<String>,
    /// Key of the client certificate (PEM).
    pub client_key_pem: Option<Secret>,
    pub tls_min: TlsVersion,
    pub tls_max: TlsVersion,
    /// Time allowed to connect to one URL (TCP and TLS handshake).
    pub connect_timeout_ms: u64,
    /// Time allowed for each operation on the connection; 0 = none.
    pub request_timeout_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Base,
    One,
    Sub,
}

/// Alias dereferencing during a search (RFC 4511 `derefAliases`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Deref {
    Never,
    /// Only while locating the search base.
    Finding,
    /// Only for entries below the base.
    Searching,
    Always,
}

impl Deref {
    pub fn parse(s: &str) -> Option<Deref> {
        Some(match s {
            "never" => Deref::Never,
            "finding" => Deref::Finding,
            "searching" => Deref::Searching,
            "always" => Deref::Always,
            _ => return None,
        })
    }
}

/// One search request.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchSpec {
    pub base: String,
    pub scope: Scope,
    /// An RFC 4515 filter, with every user-supplied value already escaped.
    pub filter: String,
    /// Attributes to return; empty = all user attributes.
    pub attrs: Vec<String>,
    pub deref: Deref,
    /// Use the paged results control with pages of this size; 0 = no paging.
    pub page_size: u32,
}

/// What to do.
#[derive(Debug, Clone, PartialEq)]
pub enum LdapOp {
    /// Open the connection `conn`.
    Connect(ConnectSpec),
    /// Open the connection `conn` bound as `dn` (connect, then a simple bind). The
    /// executor may instead hand out an idle connection of its own opened with the same
    /// settings and left bound as the same identity by an earlier login; answered like
    /// `Connect`, a refused bind failing like `Bind`.
    ConnectBound {
        spec: ConnectSpec,
        dn: String,
        password: Secret,
    },
    /// Simple bind. An empty `dn` with an empty password is an anonymous bind; a `dn` with
    /// an empty password is an unauthenticated bind (RFC 4513 5.1.2).
    Bind {
        dn: String,
        password: Secret,
    },
    Search(SearchSpec),
    /// Check credentials with a simple bind on a connection of its own opened with `spec`,
    /// leaving the call's connection, and the identity it is bound as, as they are. The
    /// executor may keep connections for such checks between logins (their identity is
    /// never used for anything else). Answered like `Bind`.
    CheckBind {
        spec: ConnectSpec,
        dn: String,
        password: Secret,
    },
    /// Unbind and drop the connection.
    Close,
    /// Run a whole login (or look-up) on a connection of its own, opened and closed by
    /// the executor, without a round trip through the node per step; answered with
    /// [`LdapDone::Ran`].
    Run(Box<super::login::Job>),
}

/// An operation the node asks for, on one connection.
#[derive(Debug, Clone, PartialEq)]
pub struct LdapCall {
    pub op_id: OpId,
    pub conn: ConnId,
    pub op: LdapOp,
    /// Close the connection after this operation, whatever its outcome.
    pub close_after: bool,
}

/// One entry returned by a search.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LdapEntry {
    pub dn: String,
    /// Attribute name (as the server spelled it) to values.
    pub attrs: BTreeMap<String, Vec<String>>,
}

impl LdapEntry {
    /// Values of `name`, matched case-insensitively (attribute names are).
    pub fn values(&self, name: &str) -> Vec<&str> {
        self.attrs
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .flat_map(|(_, v)| v.iter().map(String::as_str))
            .collect()
    }
}

/// A successful outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum LdapDone {
    /// Connected to this URL (the first that worked).
    Connected {
        url: String,
    },
    Bound,
    Entries(Vec<LdapEntry>),
    Closed,
    /// The job of an [`LdapOp::Run`], its outcome set.
    Ran(Box<super::login::Job>),
}

/// Why an operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailKind {
    /// No URL could be reached (TCP), or the connection broke.
    Connect,
    /// The TLS handshake (ldaps or StartTLS) failed, e.g. an unknown CA.
    Tls,
    /// The bind was refused: result code 49.
    InvalidCredentials,
    /// The server capped the results (result code 4) and paging was not used.
    SizeLimit,
    /// The operation did not finish in time.
    Timeout,
    /// Any other LDAP result code or a malformed request (bad filter).
    Ldap,
    /// The connection id is unknown to the executor.
    NoConnection,
}

/// A failed outcome. `message` never contains a password.
#[derive(Debug, Clone, PartialEq)]
pub struct LdapFailure {
    pub kind: FailKind,
    /// The LDAP result code when the server sent one.
    pub code: Option<u32>,
    pub message: String,
}

impl LdapFailure {
    pub fn new(kind: FailKind, code: Option<u32>, message: impl Into<String>) -> LdapFailure {
        LdapFailure {
            kind,
            code,
            message: message.into(),
        }
    }
}

/// The answer to an [`LdapCall`].
#[derive(Debug, Clone, PartialEq)]
pub struct LdapReply {
    pub op_id: OpId,
    pub conn: ConnId,
    pub result: Result<LdapDone, LdapFailure>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_in_debug() {
        let call = LdapCall {
            op_id: 1,
            conn: 1,
            op: LdapOp::Bind {
                dn: "cn=admin".into(),
                password: Secret::new("hunter2"),
            },
            close_after: false,
        };
        let s = format!("{call:?}");
        assert!(!s.contains("hunter2"), "{s}");
        assert!(s.contains("<redacted>"));
    }
}
