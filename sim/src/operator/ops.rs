//! The operator's requests: [`Op`] (what a client asks, and the HTTP request it becomes),
//! the tokens it holds ([`Tok`]), the tenant set-up steps and probes, and the key universe.

use crate::model::PolicySpec;
use cairn_core::api::RequestId;
use cairn_core::{Method, Request};
use serde_json::{json, Value};

/// A token as the operator holds it: a label for the trace and the secret it sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tok {
    pub label: String,
    /// Empty: no token header at all.
    pub secret: String,
}

impl Tok {
    pub fn none() -> Tok {
        Tok {
            label: "-".into(),
            secret: String::new(),
        }
    }
}

/// A KV operation on the `secret/` mount.
#[derive(Debug, Clone)]
pub enum KvOp {
    Put {
        key: String,
        value: Value,
    },
    Get {
        key: String,
        /// Response wrapping: the header value sent and the seconds it means.
        wrap: Option<(String, u64)>,
    },
    Delete {
        key: String,
    },
    List {
        dir: String,
        /// Send `GET ?list=true` instead of the LIST method.
        via_query: bool,
    },
}

/// One thing a client asks a node for.
#[derive(Debug, Clone)]
pub enum Op {
    SealStatus,
    Init {
        shares: u8,
        threshold: u8,
    },
    /// `Admin::DevSetup` (not an HTTP request).
    DevSetup,
    Unseal {
        key: String,
    },
    Seal {
        tok: Tok,
    },
    Mount {
        tok: Tok,
    },
    Unmount {
        tok: Tok,
    },
    PolicyWrite {
        tok: Tok,
        name: String,
        spec: PolicySpec,
        json: bool,
    },
    PolicyDelete {
        tok: Tok,
        name: String,
    },
    TokenCreate {
        tok: Tok,
        policies: Vec<String>,
        ttl_s: u64,
        ttl_as_string: bool,
        /// 0: unlimited.
        num_uses: u64,
        /// Response wrapping of the new token: header value and seconds.
        wrap: Option<(String, u64)>,
    },
    TokenRevoke {
        tok: Tok,
        target: Tok,
        /// Revoke through `revoke-accessor` with this accessor instead of the token.
        accessor: Option<String>,
    },
    /// `auth/token/revoke-self` (granted by the default policy).
    RevokeSelf {
        tok: Tok,
    },
    Kv {
        tok: Tok,
        op: KvOp,
        /// Part of the admin's read-back after an unseal.
        audit: bool,
    },
    Unwrap {
        wrap: Tok,
        in_body: bool,
    },
    LookupSelf {
        tok: Tok,
    },
    /// An admin endpoint a limited token must never reach.
    Probe {
        tok: Tok,
        method: Method,
        path: &'static str,
    },
    /// One step of the tenant set-up, with the root token.
    TenantSetup {
        tok: Tok,
        step: TenantStep,
    },
    /// The tenant's admin token (`tok`, of namespace [`TENANT`]) reaching outside it.
    TenantProbe {
        tok: Tok,
        reach: TenantReach,
    },
}

/// The tenant's namespace.
pub const TENANT: &str = "t";
/// The policy the tenant's admin token carries, written in the tenant's namespace.
pub const TENANT_POLICY: &str = "admin";
/// Its text: everything, sudo included, inside the namespace.
pub const TENANT_POLICY_TEXT: &str =
    r#"path "*" { capabilities = ["create","read","update","delete","list","sudo"] }"#;

/// The steps of the tenant set-up, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenantStep {
    /// `PUT sys/namespaces/t` (root namespace).
    Namespace,
    /// `PUT sys/policies/acl/admin` in namespace `t`.
    Policy,
    /// `POST auth/token/create {"policies":["admin"]}` in namespace `t`.
    Token,
}

/// One request of the tenant's admin token outside its namespace.
#[derive(Debug, Clone)]
pub struct TenantReach {
    pub method: Method,
    pub path: String,
    /// Sent in namespace [`TENANT`]; otherwise with no namespace.
    pub in_tenant: bool,
    pub body: Option<Value>,
    /// The root token named in the body (shown by label in the trace).
    pub names: Option<Tok>,
    /// A no-op the node may acknowledge (revoking a token the tenant cannot see: 204).
    pub noop: bool,
    /// A path the node refuses before anything else, the seal included (a `..` segment).
    pub malformed: bool,
}

impl TenantReach {
    pub fn new(method: Method, path: &str, in_tenant: bool) -> TenantReach {
        TenantReach {
            method,
            path: path.to_string(),
            in_tenant,
            body: None,
            names: None,
            noop: false,
            malformed: false,
        }
    }
    pub fn body(mut self, body: Value) -> TenantReach {
        self.body = Some(body);
        self
    }
    /// A body `{"token": <root secret>, ...extra}`.
    pub fn naming(mut self, root: &Tok, extra: Value) -> TenantReach {
        let mut body = json!({ "token": root.secret });
        if let (Some(b), Value::Object(more)) = (body.as_object_mut(), extra) {
            b.extend(more);
        }
        self.body = Some(body);
        self.names = Some(root.clone());
        self
    }
}

/// Admin endpoints no generated policy grants.
pub const PROBES: &[(Method, &str)] = &[
    (Method::Get, "sys/mounts"),
    (Method::Put, "sys/policies/acl/evil"),
    (Method::Post, "auth/token/create"),
    (Method::List, "auth/token/accessors"),
    (Method::Put, "sys/seal"),
    (Method::Delete, "sys/mounts/secret"),
    (Method::Post, "sys/mounts/evil"),
    (Method::Post, "auth/token/revoke-accessor"),
    // The red team's: mapping names that look like logins, trailing slashes, sudo and
    // root-namespace routes. None is granted by the operator's policies, so each must be
    // refused whatever the faults.
    (Method::Put, "auth/ldap/users/login"),
    (Method::Put, "auth/ldap/groups/login"),
    (Method::Delete, "auth/ldap/users/login"),
    (Method::Put, "auth/ldap/users/x/login"),
    (Method::Put, "sys/seal/"),
    (Method::Put, "/sys/seal//"),
    (Method::Put, "sys/audit/evil"),
    (Method::Post, "sys/audit-hash/evil"),
    (Method::Post, "auth/token/create-orphan"),
    (Method::List, "auth/token/accessors/"),
    (Method::Post, "sys/locked-users/x/unlock/alice"),
    (Method::Get, "sys/metrics"),
];

/// Teams: each owns `secret/<team>/...`.
pub const TEAMS: &[&str] = &["a", "b", "c"];
/// Names inside a team directory.
pub const TEAM_KEYS: &[&str] = &["k0", "k1", "k2", "private0", "deep/x"];
/// Keys directly under the mount.
pub const TOP_KEYS: &[&str] = &["top0", "top1"];
/// Names of the policies the admin writes.
pub const POLICY_NAMES: &[&str] = &["team-a", "team-b", "team-c", "reader", "mixed"];

/// Every KV key (API path) the operator ever touches.
pub fn key_universe() -> Vec<String> {
    let mut v = Vec::new();
    for t in TEAMS {
        for k in TEAM_KEYS {
            v.push(format!("secret/{t}/{k}"));
        }
    }
    for k in TOP_KEYS {
        v.push(format!("secret/{k}"));
    }
    v
}

/// Every directory (API path, trailing `/`) of the key universe.
pub fn dir_universe() -> Vec<String> {
    let mut v = vec!["secret/".to_string()];
    for t in TEAMS {
        v.push(format!("secret/{t}/"));
        v.push(format!("secret/{t}/deep/"));
    }
    v
}

impl Op {
    /// The HTTP request for this op; `None` for [`Op::DevSetup`].
    pub fn request(&self, id: RequestId) -> Option<Request> {
        let with = |r: Request, tok: &Tok| {
            if tok.secret.is_empty() {
                r
            } else {
                r.with_token(&tok.secret)
            }
        };
        Some(match self {
            Op::DevSetup => return None,
            Op::SealStatus => Request::new(id, Method::Get, "sys/seal-status"),
            Op::Init { shares, threshold } => Request::new(id, Method::Put, "sys/init")
                .with_json(json!({"secret_shares": shares, "secret_threshold": threshold})),
            Op::Unseal { key } => {
                Request::new(id, Method::Put, "sys/unseal").with_json(json!({ "key": key }))
            }
            Op::Seal { tok } => with(Request::new(id, Method::Put, "sys/seal"), tok),
            Op::Mount { tok } => with(
                Request::new(id, Method::Post, "sys/mounts/secret")
                    .with_json(json!({"type": "kv", "description": "sim data"})),
                tok,
            ),
            Op::Unmount { tok } => with(Request::new(id, Method::Delete, "sys/mounts/secret"), tok),
            Op::PolicyWrite {
                tok,
                name,
                spec,
                json: as_json,
            } => {
                let text = if *as_json { spec.json() } else { spec.hcl() };
                with(
                    Request::new(id, Method::Put, &format!("sys/policies/acl/{name}"))
                        .with_json(json!({ "policy": text })),
                    tok,
                )
            }
            Op::PolicyDelete { tok, name } => with(
                Request::new(id, Method::Delete, &format!("sys/policies/acl/{name}")),
                tok,
            ),
            Op::TokenCreate {
                tok,
                policies,
                ttl_s,
                ttl_as_string,
                num_uses,
                wrap,
            } => {
                let ttl = if *ttl_as_string {
                    json!(format!("{ttl_s}s"))
                } else {
                    json!(ttl_s)
                };
                let mut body = json!({ "policies": policies, "ttl": ttl });
                if *num_uses > 0 {
                    body["num_uses"] = json!(num_uses);
                }
                let mut r = with(
                    Request::new(id, Method::Post, "auth/token/create").with_json(body),
                    tok,
                );
                r.wrap_ttl = wrap.as_ref().map(|(h, _)| h.clone());
                r
            }
            Op::TokenRevoke {
                tok,
                target,
                accessor,
            } => match accessor {
                Some(a) => with(
                    Request::new(id, Method::Post, "auth/token/revoke-accessor")
                        .with_json(json!({ "accessor": a })),
                    tok,
                ),
                None => with(
                    Request::new(id, Method::Post, "auth/token/revoke")
                        .with_json(json!({ "token": target.secret })),
                    tok,
                ),
            },
            Op::RevokeSelf { tok } => with(
                Request::new(id, Method::Post, "auth/token/revoke-self"),
                tok,
            ),
            Op::Kv { tok, op, .. } => match op {
                KvOp::Put { key, value } => with(
                    Request::new(id, Method::Put, key).with_json(value.clone()),
                    tok,
                ),
                KvOp::Get { key, wrap } => {
                    let mut r = with(Request::new(id, Method::Get, key), tok);
                    r.wrap_ttl = wrap.as_ref().map(|(h, _)| h.clone());
                    r
                }
                KvOp::Delete { key } => with(Request::new(id, Method::Delete, key), tok),
                KvOp::List { dir, via_query } => {
                    if *via_query {
                        let mut r = with(Request::new(id, Method::Get, dir), tok);
                        r.query.push(("list".into(), "true".into()));
                        r
                    } else {
                        with(Request::new(id, Method::List, dir), tok)
                    }
                }
            },
            Op::Unwrap { wrap, in_body } => {
                let r = Request::new(id, Method::Post, "sys/wrapping/unwrap");
                if *in_body {
                    r.with_json(json!({ "token": wrap.secret }))
                } else {
                    with(r, wrap)
                }
            }
            Op::LookupSelf { tok } => {
                with(Request::new(id, Method::Get, "auth/token/lookup-self"), tok)
            }
            Op::Probe { tok, method, path } => with(Request::new(id, *method, path), tok),
            Op::TenantSetup { tok, step } => {
                let r = match step {
                    TenantStep::Namespace => {
                        Request::new(id, Method::Put, &format!("sys/namespaces/{TENANT}"))
                            .with_json(json!({}))
                    }
                    TenantStep::Policy => {
                        let mut r = Request::new(
                            id,
                            Method::Put,
                            &format!("sys/policies/acl/{TENANT_POLICY}"),
                        )
                        .with_json(json!({ "policy": TENANT_POLICY_TEXT }));
                        r.namespace = Some(TENANT.into());
                        r
                    }
                    TenantStep::Token => {
                        let mut r = Request::new(id, Method::Post, "auth/token/create")
                            .with_json(json!({ "policies": [TENANT_POLICY] }));
                        r.namespace = Some(TENANT.into());
                        r
                    }
                };
                with(r, tok)
            }
            Op::TenantProbe { tok, reach } => {
                let mut r = Request::new(id, reach.method, &reach.path);
                if let Some(b) = &reach.body {
                    r = r.with_json(b.clone());
                }
                if reach.in_tenant {
                    r.namespace = Some(TENANT.into());
                }
                with(r, tok)
            }
        })
    }

    /// One line for the trace (token secrets shown by label only).
    pub fn describe(&self) -> String {
        match self {
            Op::SealStatus => "GET sys/seal-status".into(),
            Op::Init { shares, threshold } => format!("PUT sys/init shares={shares} t={threshold}"),
            Op::DevSetup => "ADMIN dev-setup".into(),
            Op::Unseal { key } => format!("PUT sys/unseal key={}", crate::trace::shorten(key, 12)),
            Op::Seal { tok } => format!("PUT sys/seal tok={}", tok.label),
            Op::Mount { tok } => format!("POST sys/mounts/secret tok={}", tok.label),
            Op::Unmount { tok } => format!("DELETE sys/mounts/secret tok={}", tok.label),
            Op::PolicyWrite {
                tok,
                name,
                spec,
                json: as_json,
            } => format!(
                "PUT sys/policies/acl/{name} tok={} {}{}",
                tok.label,
                if *as_json { "json " } else { "" },
                spec.summary()
            ),
            Op::PolicyDelete { tok, name } => {
                format!("DELETE sys/policies/acl/{name} tok={}", tok.label)
            }
            Op::TokenCreate {
                tok,
                policies,
                ttl_s,
                num_uses,
                wrap,
                ..
            } => format!(
                "POST auth/token/create tok={} policies={} ttl={ttl_s}s{}{}",
                tok.label,
                policies.join(","),
                if *num_uses > 0 {
                    format!(" num_uses={num_uses}")
                } else {
                    String::new()
                },
                match wrap {
                    Some((h, _)) => format!(" wrap={h}"),
                    None => String::new(),
                }
            ),
            Op::TokenRevoke {
                tok,
                target,
                accessor,
            } => format!(
                "POST auth/token/{} tok={} target={}",
                if accessor.is_some() {
                    "revoke-accessor"
                } else {
                    "revoke"
                },
                tok.label,
                target.label
            ),
            Op::RevokeSelf { tok } => format!("POST auth/token/revoke-self tok={}", tok.label),
            Op::Kv { tok, op, audit } => {
                let a = if *audit { " (audit)" } else { "" };
                match op {
                    KvOp::Put { key, value } => format!("PUT {key} tok={} {value}{a}", tok.label),
                    KvOp::Get { key, wrap: None } => format!("GET {key} tok={}{a}", tok.label),
                    KvOp::Get {
                        key,
                        wrap: Some((h, _)),
                    } => format!("GET {key} tok={} wrap={h}{a}", tok.label),
                    KvOp::Delete { key } => format!("DELETE {key} tok={}{a}", tok.label),
                    KvOp::List { dir, via_query } => format!(
                        "{} {dir} tok={}{a}",
                        if *via_query { "GET?list" } else { "LIST" },
                        tok.label
                    ),
                }
            }
            Op::Unwrap { wrap, in_body } => format!(
                "POST sys/wrapping/unwrap {}={}",
                if *in_body { "body" } else { "tok" },
                wrap.label
            ),
            Op::LookupSelf { tok } => format!("GET auth/token/lookup-self tok={}", tok.label),
            Op::Probe { tok, method, path } => {
                format!("{} {path} tok={} (probe)", method.as_str(), tok.label)
            }
            Op::TenantSetup { tok, step } => match step {
                TenantStep::Namespace => {
                    format!("PUT sys/namespaces/{TENANT} tok={} (tenant set-up)", tok.label)
                }
                TenantStep::Policy => format!(
                    "PUT sys/policies/acl/{TENANT_POLICY} ns={TENANT} tok={} \"*\"=all+sudo (tenant set-up)",
                    tok.label
                ),
                TenantStep::Token => format!(
                    "POST auth/token/create ns={TENANT} tok={} policies={TENANT_POLICY} (tenant set-up)",
                    tok.label
                ),
            },
            Op::TenantProbe { tok, reach } => {
                let body = match &reach.body {
                    Some(b) => {
                        let mut text = format!(" {b}");
                        if let Some(n) = &reach.names {
                            text = text.replace(&n.secret, &format!("<{}>", n.label));
                        }
                        text
                    }
                    None => String::new(),
                };
                format!(
                    "{} {} ns={} tok={}{body} (tenant probe)",
                    reach.method.as_str(),
                    reach.path,
                    if reach.in_tenant { TENANT } else { "-" },
                    tok.label
                )
            }
        }
    }
}
