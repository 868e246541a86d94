//! The harness's model of what each node must be holding.
//!
//! The driver sees every request a node handles and every response it releases after a
//! commit, in the order the node handled them, so it can keep an exact expected state: KV
//! contents (with the boot in which each write was acknowledged), policies, tokens with
//! their expiry and revocation, wrapped responses, and the seal. Requests that were lost
//! in a crash before their batch committed are, by construction of the storage, not
//! applied, and the model ignores them.
//!
//! The ACL evaluator here is written independently of the core's: it covers the policy
//! shapes the operator generates (exact paths and prefix globs ending in `*`) and answers
//! only what the reference semantics make unambiguous.

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

pub const CREATE: u8 = 1;
pub const READ: u8 = 2;
pub const UPDATE: u8 = 4;
pub const DELETE: u8 = 8;
pub const LIST: u8 = 16;
pub const DENY: u8 = 128;

/// One `path "<pattern>" { capabilities = [...] }` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub pattern: String,
    pub caps: u8,
}

/// A policy as the operator writes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicySpec {
    pub rules: Vec<Rule>,
}

fn cap_list(caps: u8) -> Vec<&'static str> {
    if caps & DENY != 0 {
        return vec!["deny"];
    }
    [
        (CREATE, "create"),
        (READ, "read"),
        (UPDATE, "update"),
        (DELETE, "delete"),
        (LIST, "list"),
    ]
    .iter()
    .filter(|(b, _)| caps & b != 0)
    .map(|(_, n)| *n)
    .collect()
}

impl PolicySpec {
    /// The HCL text.
    pub fn hcl(&self) -> String {
        let mut s = String::new();
        for r in &self.rules {
            let caps: Vec<String> = cap_list(r.caps)
                .iter()
                .map(|c| format!("\"{c}\""))
                .collect();
            s.push_str(&format!(
                "path \"{}\" {{\n  capabilities = [{}]\n}}\n",
                r.pattern,
                caps.join(", ")
            ));
        }
        s
    }

    /// The JSON form.
    pub fn json(&self) -> String {
        let mut paths = serde_json::Map::new();
        for r in &self.rules {
            paths.insert(
                r.pattern.clone(),
                json!({ "capabilities": cap_list(r.caps) }),
            );
        }
        json!({ "path": paths }).to_string()
    }

    /// Compact form for the trace.
    pub fn summary(&self) -> String {
        self.rules
            .iter()
            .map(|r| format!("{}={}", r.pattern, cap_list(r.caps).join("+")))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Capabilities a set of policies grants on `path`: an exact rule wins, else the longest
/// matching prefix glob; rules for the same pattern are merged; `deny` takes everything.
pub fn caps_on(policies: &[&PolicySpec], path: &str) -> u8 {
    let mut merged: BTreeMap<&str, u8> = BTreeMap::new();
    for p in policies {
        for r in &p.rules {
            *merged.entry(r.pattern.as_str()).or_default() |= r.caps;
        }
    }
    let chosen = match merged.get(path) {
        Some(c) => *c,
        None => merged
            .iter()
            .filter_map(|(pat, c)| {
                let prefix = pat.strip_suffix('*')?;
                path.starts_with(prefix).then_some((prefix.len(), *c))
            })
            .max_by_key(|(len, _)| *len)
            .map(|(_, c)| c)
            .unwrap_or(0),
    };
    if chosen & DENY != 0 {
        0
    } else {
        chosen
    }
}

/// What the model says about an access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Denied,
    Allowed,
    /// The semantics leave room (e.g. a write with only one of create/update).
    Unsure,
}

fn has(caps: u8, bit: u8) -> Decision {
    if caps & bit != 0 {
        Decision::Allowed
    } else {
        Decision::Denied
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvKind {
    Get,
    List,
    Put,
    Delete,
}

/// The decision for a KV operation given the granted capabilities and whether the key
/// exists (a write to a new key needs `create`, to an existing key `update`).
pub fn decide_kv(kind: KvKind, caps: u8, exists: bool) -> Decision {
    match kind {
        KvKind::Get => has(caps, READ),
        KvKind::List => has(caps, LIST),
        KvKind::Delete => has(caps, DELETE),
        KvKind::Put => {
            if caps & (CREATE | UPDATE) == 0 {
                Decision::Denied
            } else if (exists && caps & UPDATE != 0) || (!exists && caps & CREATE != 0) {
                Decision::Allowed
            } else {
                Decision::Unsure
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Root,
    Service,
    Wrapping,
}

#[derive(Debug, Clone)]
pub struct TokenFact {
    pub label: String,
    pub accessor: String,
    pub kind: TokenKind,
    /// Policies the token carries (`default` included for service tokens).
    pub policies: Vec<String>,
    /// Simulated ms at which it stops working; `None` never.
    pub expire_at: Option<u64>,
    pub revoked: bool,
    /// Uses left of a use-limited token (`None`: unlimited; a wrapping token has one).
    /// Every request that presents it while it is valid spends one, whatever its outcome:
    /// a refusal by its policies (403) included, as in the reference.
    pub uses_left: Option<u64>,
}

/// How the model sees the token of a request at a given time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    Root,
    Limited {
        kind: TokenKind,
        policies: Vec<String>,
        /// The token has a use limit: the reference may spend uses on requests that fail,
        /// so the model does not insist such a token still works.
        use_limited: bool,
    },
    Invalid(String),
}

/// Reason text of a token whose uses are spent.
pub const USES_SPENT: &str = "use limit reached";

#[derive(Debug, Clone)]
pub struct KvEntry {
    pub value: Value,
    /// Boot of the node in which the write was acknowledged.
    pub boot: u64,
}

/// What a wrapping token holds.
#[derive(Debug, Clone)]
pub enum Wrapped {
    /// A KV read: the `data` it returned.
    Data(Value),
    /// A token created by `auth/token/create`: its secret becomes known on unwrap.
    Token {
        policies: Vec<String>,
        ttl_s: u64,
        num_uses: u64,
        created_at: u64,
    },
}

#[derive(Debug, Clone)]
pub struct WrapFact {
    pub label: String,
    pub content: Wrapped,
    pub expire_at: u64,
    pub unwrapped: bool,
    /// Its one use went to a request that presented it as a client token (refused, but
    /// spent all the same): it unwraps no more.
    pub spent: bool,
}

impl WrapFact {
    /// Whether it still unwraps at time `at`.
    pub fn valid(&self, at: u64) -> bool {
        !self.unwrapped && !self.spent && at < self.expire_at
    }

    /// The invariant an unwrap of it breaks when it is no longer valid: used once
    /// (unwrapped, or spent as a client token) or expired.
    pub fn dead_invariant(&self) -> &'static str {
        if self.unwrapped || self.spent {
            "single-use-wrapping"
        } else {
            "wrapping-ttl"
        }
    }
}

/// Expected state of one node.
#[derive(Debug, Clone, Default)]
pub struct Expected {
    /// Incremented at every restart.
    pub boot: u64,
    pub initialized: bool,
    pub sealed: bool,
    pub threshold: usize,
    /// Key shares as returned by init, hex and base64.
    pub shares_hex: Vec<String>,
    pub shares_b64: Vec<String>,
    /// Distinct shares submitted since the last seal (identities, see [`Share`]).
    pub progress: Vec<Share>,
    pub mounted: bool,
    /// Keyed by API path (`secret/a/k0`).
    pub kv: BTreeMap<String, KvEntry>,
    /// Keys whose acknowledged delete happened in this boot number.
    pub deleted: BTreeMap<String, u64>,
    /// Policy name to the spec and the exact text stored.
    pub policies: BTreeMap<String, PolicySpec>,
    pub policy_texts: BTreeMap<String, String>,
    /// Keyed by secret.
    pub tokens: BTreeMap<String, TokenFact>,
    /// Keyed by wrapping token secret.
    pub wraps: BTreeMap<String, WrapFact>,
    /// The tenant's namespace (`t/`) and its `admin` policy were acknowledged.
    pub tenant_namespace: bool,
    pub tenant_policy: bool,
    /// Tokens of the tenant's namespace, by secret: when each expires (`None`: never).
    pub tenant_tokens: BTreeMap<String, Option<u64>>,
}

/// An unseal key as the model classifies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Share {
    Valid(usize),
    /// Decodes, but is no share of this node.
    Wrong(String),
    /// Neither hex nor base64.
    Undecodable,
}

impl Expected {
    pub fn new() -> Expected {
        Expected {
            sealed: true,
            ..Default::default()
        }
    }

    pub fn classify_share(&self, key: &str) -> Share {
        if let Some(i) = self.shares_hex.iter().position(|k| k == key) {
            return Share::Valid(i);
        }
        if let Some(i) = self.shares_b64.iter().position(|k| k == key) {
            return Share::Valid(i);
        }
        let hex_ok = key.len().is_multiple_of(2) && key.bytes().all(|b| b.is_ascii_hexdigit());
        let b64_ok = key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'=');
        if hex_ok || b64_ok {
            Share::Wrong(key.to_string())
        } else {
            Share::Undecodable
        }
    }

    /// The root token's secret (empty before initialisation).
    pub fn root_secret(&self) -> &str {
        self.tokens
            .iter()
            .find(|(_, f)| f.kind == TokenKind::Root)
            .map(|(s, _)| s.as_str())
            .unwrap_or_default()
    }

    /// The token `secret` as of time `at`.
    pub fn auth(&self, secret: &str, at: u64) -> Auth {
        if secret.is_empty() {
            return Auth::Invalid("no token".into());
        }
        let Some(f) = self.tokens.get(secret) else {
            return Auth::Invalid("unknown token".into());
        };
        if f.revoked {
            return Auth::Invalid(format!("token {} was revoked", f.label));
        }
        if f.uses_left == Some(0) {
            return Auth::Invalid(format!("token {}: {USES_SPENT}", f.label));
        }
        if let Some(e) = f.expire_at {
            if at >= e {
                return Auth::Invalid(format!(
                    "token {} expired at {}.{:03}",
                    f.label,
                    e / 1000,
                    e % 1000
                ));
            }
        }
        match f.kind {
            TokenKind::Root => Auth::Root,
            kind => Auth::Limited {
                kind,
                policies: f.policies.clone(),
                use_limited: f.uses_left.is_some(),
            },
        }
    }

    /// Capabilities of a set of policy names on `path` under the current policies.
    pub fn caps(&self, policies: &[String], path: &str) -> u8 {
        let specs: Vec<&PolicySpec> = policies
            .iter()
            .filter_map(|n| self.policies.get(n))
            .collect();
        caps_on(&specs, path)
    }

    /// The children a LIST of `dir` (API path ending in `/`) must return.
    pub fn children(&self, dir: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for k in self.kv.keys() {
            if let Some(rest) = k.strip_prefix(dir) {
                match rest.find('/') {
                    Some(i) => out.insert(rest[..=i].to_string()),
                    None => out.insert(rest.to_string()),
                };
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rules: &[(&str, u8)]) -> PolicySpec {
        PolicySpec {
            rules: rules
                .iter()
                .map(|(p, c)| Rule {
                    pattern: p.to_string(),
                    caps: *c,
                })
                .collect(),
        }
    }

    #[test]
    fn longest_prefix_and_exact_rules_decide() {
        let team = spec(&[("secret/a/*", CREATE | UPDATE), ("secret/a/private*", DENY)]);
        let reader = spec(&[("secret/*", READ | LIST)]);
        let exact = spec(&[("secret/a/k0", READ)]);
        let all = [&team, &reader, &exact];
        assert_eq!(caps_on(&all, "secret/a/k1"), CREATE | UPDATE);
        assert_eq!(caps_on(&all, "secret/a/private0"), 0);
        assert_eq!(caps_on(&all, "secret/a/k0"), READ);
        assert_eq!(caps_on(&all, "secret/top0"), READ | LIST);
        assert_eq!(caps_on(&all, "secret/a/"), CREATE | UPDATE);
        assert_eq!(caps_on(&[&team], "secret/b/k0"), 0);
        assert_eq!(decide_kv(KvKind::Put, CREATE, true), Decision::Unsure);
        assert_eq!(decide_kv(KvKind::Put, CREATE, false), Decision::Allowed);
        assert_eq!(decide_kv(KvKind::Put, READ, false), Decision::Denied);
    }

    #[test]
    fn policy_texts_parse_in_the_core_alike() {
        let s = spec(&[
            ("secret/a/*", CREATE | READ | LIST),
            ("secret/a/private*", DENY),
        ]);
        let h = cairn_core::policy::Policy::parse(&s.hcl()).expect("hcl parses");
        let j = cairn_core::policy::Policy::parse(&s.json()).expect("json parses");
        assert_eq!(h, j);
        assert_eq!(h.rules.len(), 2);
    }
}
