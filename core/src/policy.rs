//! ACL policies: parsing (HCL and its JSON form), the built-in `root` and `default`
//! policies, and the decision for one path and capability.
//!
//! Matching follows the reference: an exact path rule wins; otherwise among the rules whose
//! pattern matches (`*` at the end matches any suffix, `+` matches one path segment) the most
//! specific one decides (the one whose first wildcard comes latest, then the longest, then the
//! one with fewer `+`). Rules for the same pattern from several policies are merged; `deny`
//! overrides everything on that pattern.

use serde_json::Value;
use std::collections::BTreeMap;

pub const CREATE: u8 = 1;
pub const READ: u8 = 2;
pub const UPDATE: u8 = 4;
pub const DELETE: u8 = 8;
pub const LIST: u8 = 16;
pub const SUDO: u8 = 32;
/// Applying a merge patch (KV v2 `PATCH`), as Vault's `patch` capability.
pub const PATCH: u8 = 64;
pub const DENY: u8 = 128;

pub const DEFAULT_POLICY: &str = r#"
# Allow tokens to look up their own properties
path "auth/token/lookup-self" {
    capabilities = ["read"]
}
# Allow tokens to renew themselves
path "auth/token/renew-self" {
    capabilities = ["update"]
}
# Allow tokens to revoke themselves
path "auth/token/revoke-self" {
    capabilities = ["update"]
}
# Allow a token to look up its own capabilities on a path
path "sys/capabilities-self" {
    capabilities = ["update"]
}
# Allow a token to look up its own entity by id or name
path "sys/wrapping/wrap" {
    capabilities = ["update"]
}
path "sys/wrapping/lookup" {
    capabilities = ["update"]
}
path "sys/wrapping/unwrap" {
    capabilities = ["update"]
}
path "sys/tools/hash" {
    capabilities = ["update"]
}
path "sys/tools/hash/*" {
    capabilities = ["update"]
}
"#;

pub fn cap_from_name(s: &str) -> Option<u8> {
    Some(match s {
        "create" => CREATE,
        "read" => READ,
        "update" => UPDATE,
        "delete" => DELETE,
        "list" => LIST,
        "sudo" => SUDO,
        "patch" => PATCH,
        "deny" => DENY,
        _ => return None,
    })
}

pub fn cap_names(c: u8) -> Vec<&'static str> {
    if c & DENY != 0 {
        return vec!["deny"];
    }
    let mut v = Vec::new();
    for (bit, n) in [
        (CREATE, "create"),
        (DELETE, "delete"),
        (LIST, "list"),
        (PATCH, "patch"),
        (READ, "read"),
        (SUDO, "sudo"),
        (UPDATE, "update"),
    ] {
        if c & bit != 0 {
            v.push(n);
        }
    }
    v
}

/// A parsed policy: pattern → capabilities.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    pub rules: BTreeMap<String, u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError(pub String);

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "failed to parse policy: {}", self.0)
    }
}

/// Most capabilities a single policy may name; larger documents are refused.
pub const MAX_RULES: usize = 4096;

/// Deepest nesting of brackets, braces and parentheses a policy may have, and the most
/// operators and template interpolations: the HCL parser recurses per level and per
/// operator, so more would exhaust the stack. Policies need no operators at all.
pub const MAX_DEPTH: usize = 64;

/// Why `text` is too deep for the HCL parser, if it is: `[`, `{`, `(` nesting outside
/// strings and comments, operators outside strings and comments, or template
/// interpolations (`${`, `%{`) anywhere.
pub(crate) fn too_deep(text: &str) -> Option<String> {
    hcl_too_deep(text, "policy")
}

/// [`too_deep`] for any HCL text; `what` names it in the message (the server configuration
/// file goes through the same parser).
pub(crate) fn hcl_too_deep(text: &str, what: &str) -> Option<String> {
    let b = text.as_bytes();
    let (mut depth, mut ops, mut templates) = (0usize, 0usize, 0usize);
    let mut in_str = false;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied().unwrap_or(0);
        if (c == b'$' || c == b'%') && next == b'{' {
            templates += 1;
        }
        if in_str {
            match c {
                b'\\' => i += 1,
                b'"' => in_str = false,
                _ => {}
            }
        } else {
            match (c, next) {
                (b'"', _) => in_str = true,
                (b'#', _) | (b'/', b'/') => {
                    while i < b.len() && b[i] != b'\n' {
                        i += 1;
                    }
                }
                (b'/', b'*') => {
                    i += 2;
                    while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                        i += 1;
                    }
                    i += 1;
                }
                (b'[' | b'{' | b'(', _) => depth += 1,
                (b']' | b'}' | b')', _) => depth = depth.saturating_sub(1),
                (b'+' | b'-' | b'*' | b'/' | b'%' | b'!' | b'<' | b'>' | b'&' | b'|' | b'?', _)
                | (b'=', b'=') => ops += 1,
                _ => {}
            }
        }
        if depth > MAX_DEPTH {
            return Some(format!("the {what} nests deeper than {MAX_DEPTH} levels"));
        }
        if ops > MAX_DEPTH {
            return Some(format!(
                "the {what} has more than {MAX_DEPTH} operators (it needs none)"
            ));
        }
        if templates > MAX_DEPTH {
            return Some(format!(
                "the {what} has more than {MAX_DEPTH} template interpolations"
            ));
        }
        i += 1;
    }
    None
}

/// Texts of parsed policies kept by [`Policy::parse_cached`] (and their total bytes), beyond
/// which the cache starts over.
const PARSED_CACHE_BYTES: usize = 1 << 20;
const PARSED_CACHE_ENTRIES: usize = 256;

/// Policies [`Policy::parse_cached`] parsed on this thread, by their text: (result, total
/// bytes of the texts held).
type ParsedCache = (BTreeMap<String, Result<Policy, PolicyError>>, usize);

std::thread_local! {
    static PARSED: std::cell::RefCell<ParsedCache> =
        const { std::cell::RefCell::new((BTreeMap::new(), 0)) };
}

impl Policy {
    /// [`Policy::parse`] of a text this thread parsed recently without parsing it again.
    /// Every request builds its token's ACL from the stored policy texts, and parsing HCL
    /// costs more than the rest of a read; the answer is a function of the text alone, so a
    /// text's cached answer is the one a new parse would give. The cache holds at most
    /// [`PARSED_CACHE_ENTRIES`] texts and [`PARSED_CACHE_BYTES`] bytes, then starts over.
    pub fn parse_cached(text: &str) -> Result<Policy, PolicyError> {
        if let Some(hit) = PARSED.with(|c| c.borrow().0.get(text).cloned()) {
            return hit;
        }
        let parsed = Policy::parse(text);
        if text.len() <= PARSED_CACHE_BYTES / 4 {
            PARSED.with(|c| {
                let mut c = c.borrow_mut();
                if c.0.len() >= PARSED_CACHE_ENTRIES || c.1 + text.len() > PARSED_CACHE_BYTES {
                    *c = (BTreeMap::new(), 0);
                }
                c.1 += text.len();
                c.0.insert(text.to_string(), parsed.clone());
            });
        }
        parsed
    }

    /// Parses a policy in HCL or in its JSON form.
    pub fn parse(text: &str) -> Result<Policy, PolicyError> {
        if let Some(why) = too_deep(text) {
            return Err(PolicyError(why));
        }
        let value: Value = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| PolicyError(e.to_string()))?
        } else {
            hcl::from_str(text).map_err(|e| PolicyError(e.to_string()))?
        };
        let mut p = Policy::default();
        let obj = match value {
            Value::Object(o) => o,
            _ => return Err(PolicyError("expected an object".into())),
        };
        for k in obj.keys() {
            if k != "path" && k != "name" {
                return Err(PolicyError(format!("unknown top-level key {k:?}")));
            }
        }
        let paths = match obj.get("path") {
            None => return Ok(p),
            Some(Value::Object(m)) => m.clone(),
            // JSON form may give a list of single-key objects.
            Some(Value::Array(a)) => {
                let mut m = serde_json::Map::new();
                for item in a {
                    if let Value::Object(o) = item {
                        for (k, v) in o {
                            m.insert(k.clone(), v.clone());
                        }
                    }
                }
                m
            }
            Some(_) => return Err(PolicyError("\"path\" must be a block".into())),
        };
        if paths.len() > MAX_RULES {
            return Err(PolicyError(format!("more than {MAX_RULES} path rules")));
        }
        for (pattern, body) in paths {
            let body = match body {
                Value::Array(mut a) if a.len() == 1 => a.remove(0),
                b => b,
            };
            let caps = body
                .get("capabilities")
                .ok_or_else(|| PolicyError(format!("path {pattern:?}: missing capabilities")))?;
            let list = caps.as_array().ok_or_else(|| {
                PolicyError(format!("path {pattern:?}: capabilities must be a list"))
            })?;
            let mut bits = 0u8;
            for c in list {
                let name = c.as_str().unwrap_or_default();
                bits |= cap_from_name(name).ok_or_else(|| {
                    PolicyError(format!("path {pattern:?}: invalid capability {c}"))
                })?;
            }
            let pattern = pattern.trim_start_matches('/').to_string();
            *p.rules.entry(pattern).or_default() |= bits;
        }
        Ok(p)
    }
}

/// The merged rules of a token's policies.
#[derive(Debug, Clone, Default)]
pub struct Acl {
    root: bool,
    exact: BTreeMap<String, u8>,
    globs: Vec<(String, u8)>,
}

impl Acl {
    pub fn new<'a>(policies: impl IntoIterator<Item = &'a Policy>, root: bool) -> Acl {
        let mut exact: BTreeMap<String, u8> = BTreeMap::new();
        let mut globs: BTreeMap<String, u8> = BTreeMap::new();
        for p in policies {
            for (pat, caps) in &p.rules {
                let target = if pat.contains('*') || pat.contains('+') {
                    &mut globs
                } else {
                    &mut exact
                };
                *target.entry(pat.clone()).or_default() |= *caps;
            }
        }
        Acl {
            root,
            exact,
            globs: globs.into_iter().collect(),
        }
    }

    /// Capabilities granted on `path` (all for root).
    pub fn capabilities(&self, path: &str) -> u8 {
        if self.root {
            return CREATE | READ | UPDATE | DELETE | LIST | SUDO | PATCH;
        }
        if let Some(c) = self.exact.get(path) {
            return *c;
        }
        let mut best: Option<(&str, u8)> = None;
        for (pat, caps) in &self.globs {
            if glob_match(pat, path) && best.is_none_or(|(b, _)| more_specific(pat, b)) {
                best = Some((pat, *caps));
            }
        }
        best.map(|(_, c)| c).unwrap_or(0)
    }

    /// True when every bit of `need` (or, for writes, one of create/update) is granted.
    pub fn allows(&self, path: &str, need: u8) -> bool {
        let c = self.capabilities(path);
        c & DENY == 0 && c & need == need
    }

    pub fn is_root(&self) -> bool {
        self.root
    }

    /// Whether some path at or under `prefix` (e.g. a mount's `secret/`) is granted any
    /// capability: a rule naming such a path (`secret/data/*`), or one whose pattern covers
    /// the prefix itself (`secret/*`, `sec*`). What the reference's UI mount lookup asks.
    pub fn any_under(&self, prefix: &str) -> bool {
        let here = self.capabilities(prefix);
        if self.root || here != 0 && here & DENY == 0 {
            return true;
        }
        let rules = self.exact.iter().map(|(p, c)| (p.as_str(), *c));
        let globs = self.globs.iter().map(|(p, c)| (p.as_str(), *c));
        rules.chain(globs).any(|(pat, caps)| {
            caps & DENY == 0 && caps != 0 && {
                let lit = &pat[..first_wildcard(pat)];
                lit.starts_with(prefix) || glob_match(pat, prefix)
            }
        })
    }
}

fn first_wildcard(p: &str) -> usize {
    p.find(['*', '+']).unwrap_or(p.len())
}

/// Is `a` more specific than `b` (both matching the same path)?
fn more_specific(a: &str, b: &str) -> bool {
    let (fa, fb) = (first_wildcard(a), first_wildcard(b));
    if fa != fb {
        return fa > fb;
    }
    let (ea, eb) = (a.ends_with('*'), b.ends_with('*'));
    if ea != eb {
        return !ea;
    }
    let (pa, pb) = (a.matches('+').count(), b.matches('+').count());
    if pa != pb {
        return pa < pb;
    }
    if a.len() != b.len() {
        return a.len() > b.len();
    }
    a > b
}

/// Matches a pattern with `+` segments and an optional trailing `*`.
pub fn glob_match(pattern: &str, path: &str) -> bool {
    let (pat, prefix) = match pattern.strip_suffix('*') {
        Some(p) => (p, true),
        None => (pattern, false),
    };
    if !pat.contains('+') {
        return if prefix {
            path.starts_with(pat)
        } else {
            path == pat
        };
    }
    let pat_segs: Vec<&str> = pat.split('/').collect();
    let path_segs: Vec<&str> = path.split('/').collect();
    if path_segs.len() < pat_segs.len() || (!prefix && path_segs.len() != pat_segs.len()) {
        return false;
    }
    for (i, ps) in pat_segs.iter().enumerate() {
        let seg = path_segs[i];
        let last = i == pat_segs.len() - 1;
        if *ps == "+" {
            continue;
        }
        if last && prefix {
            if !seg.starts_with(ps) {
                return false;
            }
        } else if seg != *ps {
            return false;
        }
    }
    if !prefix {
        return true;
    }
    // With a trailing '*', the last pattern segment may be a prefix of the path segment; the
    // rest of the path is free.
    true
}

/// Validates a policy name.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck::quickcheck;

    /// The cached parse answers what a parse does, for good and bad texts, again and again,
    /// also after the cache started over (more texts than it holds).
    #[test]
    fn a_cached_parse_is_the_parse() {
        let texts: Vec<String> = (0..PARSED_CACHE_ENTRIES + 10)
            .map(|i| match i % 3 {
                0 => format!(r#"path "a/{i}/*" {{ capabilities = ["read"] }}"#),
                1 => format!(r#"{{"path":{{"b/{i}":{{"capabilities":["update","list"]}}}}}}"#),
                _ => format!(r#"path "c/{i}" {{ capabilities = ["fly"] }}"#),
            })
            .collect();
        for _ in 0..2 {
            for t in &texts {
                assert_eq!(Policy::parse_cached(t), Policy::parse(t), "{t}");
            }
        }
        assert_eq!(
            Policy::parse_cached(DEFAULT_POLICY),
            Policy::parse(DEFAULT_POLICY)
        );
        assert!(Policy::parse_cached(DEFAULT_POLICY).is_ok_and(|p| !p.rules.is_empty()));
    }

    #[test]
    fn parses_hcl_and_json() {
        let h = Policy::parse(
            r#"path "secret/*" { capabilities = ["read", "list"] }
               path "secret/private" { capabilities = ["deny"] }"#,
        )
        .unwrap();
        assert_eq!(h.rules["secret/*"], READ | LIST);
        let j = Policy::parse(r#"{"path":{"secret/*":{"capabilities":["read","list"]},"secret/private":{"capabilities":["deny"]}}}"#).unwrap();
        assert_eq!(h, j);
        assert!(Policy::parse(r#"path "x" { capabilities = ["fly"] }"#).is_err());
        assert!(Policy::parse("path {").is_err());
    }

    #[test]
    fn acl_decisions() {
        let p = Policy::parse(
            r#"path "secret/*" { capabilities = ["read", "list"] }
               path "secret/private" { capabilities = ["deny"] }
               path "secret/+/team" { capabilities = ["create", "update"] }
               path "secret/a/b*" { capabilities = ["delete"] }"#,
        )
        .unwrap();
        let acl = Acl::new([&p], false);
        assert!(acl.allows("secret/foo", READ));
        assert!(!acl.allows("secret/foo", UPDATE));
        assert!(!acl.allows("secret/private", READ));
        assert!(acl.allows("secret/x/team", UPDATE));
        assert!(!acl.allows("secret/x/team", READ));
        assert!(acl.allows("secret/a/bcd", DELETE));
        assert!(!acl.allows("other/foo", READ));
        assert!(Acl::new([], true).allows("anything", SUDO));
        let mut p = Policy::default();
        p.rules.insert("kv/data/*".into(), READ);
        p.rules.insert("sec*".into(), LIST);
        p.rules.insert("gone/*".into(), DENY);
        let acl = Acl::new([&p], false);
        assert!(acl.any_under("kv/"));
        assert!(acl.any_under("secret/"));
        assert!(!acl.any_under("gone/"));
        assert!(!acl.any_under("other/"));
    }

    /// Regression (fuzzing): deep HCL overflowed the parser's stack and aborted the process.
    #[test]
    fn deep_or_operator_heavy_hcl_is_refused_not_a_crash() {
        for text in [
            format!("x = {}1{}", "[".repeat(100_000), "]".repeat(100_000)),
            format!("x = {}1", "!".repeat(100_000)),
            format!("x = {}1", "1 + ".repeat(100_000)),
            format!("x = {}", "\"${".repeat(100_000)),
        ] {
            let e = Policy::parse(&text).unwrap_err().to_string();
            assert!(
                e.contains("more than 64") || e.contains("deeper than 64"),
                "{e}"
            );
        }
    }

    quickcheck! {
        /// An exact rule always decides for its own path, whatever globs exist.
        fn exact_rule_wins(seg: String, caps: u8) -> bool {
            let seg: String = seg.chars().filter(|c| c.is_ascii_alphanumeric()).take(10).collect();
            let path = format!("kv/{seg}");
            let caps = caps & (CREATE | READ | UPDATE | DELETE | LIST);
            let mut p = Policy::default();
            p.rules.insert("kv/*".into(), READ | LIST | UPDATE);
            p.rules.insert("+/+".into(), SUDO);
            p.rules.insert(path.clone(), caps);
            Acl::new([&p], false).capabilities(&path) == caps
        }
    }
}
