//! Token roles (`auth/token/roles[/<name>]`) and what a role does to a token created
//! through it (`auth/token/create/<role>`), as the reference (OpenBao 2.6) does it:
//!
//! - policies: without any asked for, the role's `allowed_policies` (else the caller's);
//!   with `allowed_policies` set, those asked for must be among them (or `default`); none
//!   may be in `disallowed_policies`, whether asked for or, with none asked for and no
//!   `allowed_policies`, inherited from the caller (a disallowed `default` asked for is
//!   dropped; one the caller's policies carry is refused, as the reference refuses it);
//! - `orphan`: the role alone decides (no `no_parent`, no sudo needed);
//! - `renewable: false` makes every token of the role non-renewable;
//! - `token_num_uses` limits its tokens' uses (the lesser of it and the request's), and
//!   `token_bound_cidrs` binds them to those client addresses (the role's, never the
//!   caller's);
//! - `token_period` / `token_explicit_max_ttl` (the older `period` / `explicit_max_ttl`
//!   set both the old and the new field, as in the reference): the lesser of the role's
//!   and the request's, with a warning when both are set;
//! - `token_type`: `service` and `batch` force the type, `default-service` (the default)
//!   and `default-batch` only choose it when the request names none; a `batch` role must
//!   be an orphan, non-renewable and not periodic (refused when written).
//!
//! `token_ttl` and `token_max_ttl` are not token role fields in the reference: it accepts
//! and ignores them, and so does this.
//!
//! Storage: `sys/token/role/<namespace path><name>` (cluster-local class, like tokens).

use super::issue::Lifetimes;
use crate::api::{ApiError, ApiResult, Fields, Method, Reply, Request};
use crate::ctx::Ctx;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Token roles: `sys/token/role/<namespace path><name>`.
pub const PREFIX: &str = "sys/token/role/";

/// The token types a role may name.
pub const TOKEN_TYPES: [&str; 4] = ["service", "batch", "default-service", "default-batch"];

/// A token role (`auth/token/roles/<name>`): what `auth/token/create/<name>` may issue.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(default)]
pub struct Role {
    pub name: String,
    /// Empty (and no globs): any policy (of the caller's) may be asked for.
    pub allowed_policies: Vec<String>,
    /// `allowed_policies_glob`: policies matching one of these may be asked for too.
    pub allowed_policies_glob: Vec<String>,
    pub disallowed_policies: Vec<String>,
    /// `disallowed_policies_glob`: no policy matching one of these.
    pub disallowed_policies_glob: Vec<String>,
    pub orphan: bool,
    pub renewable: bool,
    /// `token_period`, seconds; 0 = not periodic.
    pub period: u64,
    /// `token_explicit_max_ttl`, seconds; 0 = none.
    pub explicit_max_ttl: u64,
    /// The older `period` field as last written (shown as `period`).
    pub legacy_period: u64,
    /// The older `explicit_max_ttl` field as last written.
    pub legacy_explicit_max_ttl: u64,
    pub path_suffix: String,
    pub no_default_policy: bool,
    /// One of [`TOKEN_TYPES`]; empty means `default-service` (roles written before the
    /// field existed).
    pub token_type: String,
    /// `token_num_uses`: the most uses a token of the role gets (the lesser of this and
    /// the request's `num_uses` when both are set); 0 = unlimited.
    pub num_uses: i64,
    /// `token_bound_cidrs`: the CIDR blocks its tokens may be used from (empty: any).
    pub bound_cidrs: Vec<String>,
}

impl Role {
    fn token_type(&self) -> &str {
        if self.token_type.is_empty() {
            "default-service"
        } else {
            &self.token_type
        }
    }

    fn view(&self) -> Value {
        let mut v = json!({
            "name": self.name,
            "allowed_policies": self.allowed_policies,
            "allowed_policies_glob": self.allowed_policies_glob,
            "disallowed_policies": self.disallowed_policies,
            "disallowed_policies_glob": self.disallowed_policies_glob,
            "allowed_entity_aliases": null,
            "orphan": self.orphan,
            "renewable": self.renewable,
            "period": self.legacy_period,
            "token_period": self.period,
            "explicit_max_ttl": self.legacy_explicit_max_ttl,
            "token_explicit_max_ttl": self.explicit_max_ttl,
            "path_suffix": self.path_suffix,
            "token_no_default_policy": self.no_default_policy,
            "token_type": self.token_type(),
        });
        // Shown only when set, as the reference shows them.
        if self.num_uses > 0 {
            v["token_num_uses"] = json!(self.num_uses);
        }
        if !self.bound_cidrs.is_empty() {
            v["token_bound_cidrs"] = json!(self.bound_cidrs);
        }
        v
    }

    /// The path of a token created through this role, `auth/token/create/<name>` and the
    /// role's `path_suffix` after it (so that `sys/leases/revoke-prefix` on it revokes the
    /// tokens issued under that suffix, as in the reference).
    pub fn token_path(&self) -> String {
        if self.path_suffix.is_empty() {
            format!("auth/token/create/{}", self.name)
        } else {
            format!("auth/token/create/{}/{}", self.name, self.path_suffix)
        }
    }

    /// Whether a token of this role is a batch token, given the type the request named.
    pub fn batch(&self, requested: Option<bool>) -> bool {
        match self.token_type() {
            "batch" => true,
            "default-batch" => requested.unwrap_or(true),
            "service" => false,
            _ => requested.unwrap_or(false),
        }
    }

    /// Whether the role bounds the policies asked for (allowed policies or globs), rather
    /// than the caller's own policies.
    pub fn bounds_policies(&self) -> bool {
        !self.allowed_policies.is_empty() || !self.allowed_policies_glob.is_empty()
    }

    /// Whether the role disallows `default` (by name or by a glob matching it): it is then
    /// not added to its tokens.
    pub fn disallows_default(&self) -> bool {
        self.disallowed("default")
    }

    fn disallowed(&self, p: &str) -> bool {
        self.disallowed_policies.iter().any(|d| d == p)
            || self.disallowed_policies_glob.iter().any(|g| glob(g, p))
    }

    /// The policies of a token of this role: `asked` (or the allowed ones when none were
    /// asked for, `None` when the role allows any) checked against the role's lists (a
    /// glob allows what it matches, but none is added when nothing is asked for, as in the
    /// reference).
    pub fn policies(&self, asked: Vec<String>) -> ApiResult<Option<Vec<String>>> {
        let mut policies = if asked.is_empty() {
            if !self.bounds_policies() {
                return Ok(None);
            }
            self.allowed_policies.clone()
        } else {
            asked
        };
        // A disallowed `default` is left out rather than refused, as in the reference.
        if self.disallows_default() {
            policies.retain(|p| p != "default");
        }
        if self.bounds_policies() {
            let allowed = super::normalize_policies(self.allowed_policies.clone(), true);
            let shown = super::normalize_policies(policies.clone(), !self.no_default_policy);
            let ok = |p: &String| {
                allowed.contains(p) || self.allowed_policies_glob.iter().any(|g| glob(g, p))
            };
            if !shown.iter().all(ok) {
                return Err(ApiError::bad(format!(
                    "token policies ({}) must be subset of the role's allowed policies ({}) or glob policies ({})",
                    go_list(&shown),
                    go_list(&allowed),
                    go_list(&self.allowed_policies_glob)
                )));
            }
        }
        self.refuse_disallowed(&policies)?;
        Ok(Some(policies))
    }

    /// A 400 naming the first of `policies` that the role disallows.
    pub fn refuse_disallowed(&self, policies: &[String]) -> ApiResult<()> {
        match policies.iter().find(|p| self.disallowed(p)) {
            Some(p) => Err(ApiError::bad(format!(
                "token policy {p:?} is disallowed by this role"
            ))),
            None => Ok(()),
        }
    }

    /// Applies the role's period and explicit max TTL to what the request asked for: the
    /// lesser of both where both are set, with the reference's warning.
    pub(super) fn bound(&self, l: &mut Lifetimes, warnings: &mut Vec<String>) {
        if self.period > 0 {
            if l.period > 0 && l.period != self.period {
                let p = l.period.min(self.period);
                warnings.push(format!(
                    "Period specified both during creation call and in role; using the lesser value of {p} seconds"
                ));
                l.period = p;
            } else {
                l.period = self.period;
            }
        }
        if self.explicit_max_ttl > 0 {
            if l.explicit_max_ttl > 0 && l.explicit_max_ttl != self.explicit_max_ttl {
                let e = l.explicit_max_ttl.min(self.explicit_max_ttl);
                warnings.push(format!(
                    "Explicit max TTL specified both during creation call and in role; using the lesser value of {e} seconds"
                ));
                l.explicit_max_ttl = e;
            } else {
                l.explicit_max_ttl = self.explicit_max_ttl;
            }
        }
    }
}

/// Whether a role's path suffix passes the reference's check: some run of it matches
/// `\w[\w-.]+\w` (a word character, at least one of word characters, `-` and `.`, a word
/// character), and it names no other segment of the path (`..`, an empty segment, or a
/// leading or trailing `/`, which the reference's unanchored pattern lets through).
fn valid_path_suffix(p: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let matches = p
        .split(|c: char| !(word(c) || c == '-' || c == '.'))
        .any(|run| {
            let first = run.find(word);
            let last = run.rfind(word);
            matches!((first, last), (Some(i), Some(j)) if j >= i + 2)
        });
    matches
        && p.split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
}

/// Whether policy name `s` matches `pattern`, whose every `*` stands for any run of
/// characters (none included) and every other character for itself (the reference's
/// policy globs).
fn glob(pattern: &str, s: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = s.strip_prefix(first) else {
        return false;
    };
    let mut parts: Vec<&str> = parts.collect();
    let Some(last) = parts.pop() else {
        // No `*`: the whole name.
        return rest.is_empty();
    };
    for mid in parts {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// A list as the reference's messages print one: `["a" "b"]`.
fn go_list(v: &[String]) -> String {
    let items: Vec<String> = v.iter().map(|p| format!("{p:?}")).collect();
    format!("[{}]", items.join(" "))
}

fn role_key(ns: &str, name: &str) -> String {
    format!("{PREFIX}{ns}{name}")
}

/// Role `name` of namespace `ns`; a 400 naming it when there is none.
pub fn load(ctx: &Ctx, ns: &str, name: &str) -> ApiResult<Role> {
    ctx.get_json::<Role>(&role_key(ns, name))?
        .ok_or_else(|| ApiError::bad(format!("unknown role {name}")))
}

/// Reads the fields of a role write over `r`; nothing is stored when one is refused.
fn update(r: &mut Role, f: &Fields) -> ApiResult<()> {
    if let Some(p) = f.list("allowed_policies")? {
        r.allowed_policies = super::normalize_policies(p, false);
    }
    if let Some(p) = f.list("disallowed_policies")? {
        r.disallowed_policies = super::normalize_policies(p, false);
    }
    if let Some(p) = f.list("allowed_policies_glob")? {
        r.allowed_policies_glob = super::normalize_policies(p, false);
    }
    if let Some(p) = f.list("disallowed_policies_glob")? {
        r.disallowed_policies_glob = super::normalize_policies(p, false);
    }
    if let Some(b) = f.bool("orphan")? {
        r.orphan = b;
    }
    if let Some(b) = f.bool("renewable")? {
        r.renewable = b;
    }
    if let Some(b) = f.bool("token_no_default_policy")? {
        r.no_default_policy = b;
    }
    // The older names set the older field and the newer one; the newer name only its own.
    if let Some(d) = f.duration("period")? {
        r.legacy_period = d;
        r.period = d;
    }
    if let Some(d) = f.duration("token_period")? {
        r.period = d;
    }
    if let Some(d) = f.duration("explicit_max_ttl")? {
        r.legacy_explicit_max_ttl = d;
        r.explicit_max_ttl = d;
    }
    if let Some(d) = f.duration("token_explicit_max_ttl")? {
        r.explicit_max_ttl = d;
    }
    if let Some(p) = f.str("path_suffix")? {
        if !p.is_empty() && !valid_path_suffix(&p) {
            return Err(ApiError::bad(
                "given role path suffix contains invalid characters; must match \\w[\\w-.]+\\w",
            ));
        }
        r.path_suffix = p;
    }
    if let Some(n) = f.int("token_num_uses")? {
        if n < 0 {
            return Err(ApiError::bad("token_num_uses: must be zero or positive"));
        }
        r.num_uses = n;
    }
    if let Some(v) = f.list("token_bound_cidrs")? {
        if let Some(c) = v
            .iter()
            .find(|c| crate::auth::ldap::config::parse_cidr(c).is_none())
        {
            return Err(ApiError::bad(format!(
                "token_bound_cidrs: {c:?} is not an IP address or CIDR block"
            )));
        }
        r.bound_cidrs = v;
    }
    if let Some(t) = f.str("token_type")? {
        if !TOKEN_TYPES.contains(&t.as_str()) {
            return Err(ApiError::bad(format!("invalid 'token_type' value {t:?}")));
        }
        r.token_type = t;
    }
    if r.token_type() == "batch" {
        let refuse = |what: &str| {
            Err(ApiError::bad(format!(
                "'token_type' cannot be 'batch' when role is set to generate {what} tokens"
            )))
        };
        if !r.orphan {
            return refuse("non-orphan");
        }
        if r.period > 0 {
            return refuse("periodic");
        }
        if r.renewable {
            return refuse("renewable");
        }
    }
    Ok(())
}

/// `auth/token/roles[/<name>]`.
pub fn roles(ctx: &mut Ctx, req: &Request, f: &Fields, ns: &str, name: &str) -> ApiResult {
    if name.contains('/') {
        return Err(ApiError::NotFound(String::new()));
    }
    match (req.method, name) {
        (Method::List | Method::Get, "") => {
            let prefix = format!("{PREFIX}{ns}");
            let keys: Vec<String> = ctx
                .keys(&prefix)?
                .into_iter()
                .map(|k| k[prefix.len()..].to_string())
                .filter(|k| !k.contains('/'))
                .collect();
            if keys.is_empty() {
                return Err(ApiError::NotFound(String::new()));
            }
            Ok(Reply::Data(json!({ "keys": keys })))
        }
        (Method::Get, n) => match ctx.get_json::<Role>(&role_key(ns, n))? {
            Some(r) => Ok(Reply::Data(r.view())),
            None => Err(ApiError::NotFound(String::new())),
        },
        (Method::Post | Method::Put, n) => {
            let mut r = ctx
                .get_json::<Role>(&role_key(ns, n))?
                .unwrap_or_else(|| Role {
                    name: n.to_string(),
                    renewable: true,
                    ..Default::default()
                });
            update(&mut r, f)?;
            ctx.put_json(&role_key(ns, n), &r)?;
            Ok(Reply::Empty)
        }
        (Method::Delete, n) => {
            ctx.delete(&role_key(ns, n));
            Ok(Reply::Empty)
        }
        _ => Err(ApiError::MethodNotAllowed),
    }
}

#[cfg(test)]
mod tests {
    use crate::api::{Method, Request};
    use crate::node::{Input, Node, Output};
    use crate::storage::MemStorage;
    use crate::Response;
    use serde_json::{json, Value};

    struct T {
        node: Node<MemStorage>,
        next: u64,
    }

    const ROOT: &str = "role-tests-root";

    impl T {
        /// Stores the policy `maker` (it may create tokens against roles) and returns a
        /// token root creates with `body`.
        fn maker_and_token(&mut self, body: Value) -> String {
            let pol = r#"path "auth/token/create/*" { capabilities = ["create", "update"] }"#;
            let r = self.call(
                ROOT,
                Method::Put,
                "sys/policies/acl/maker",
                json!({ "policy": pol }),
            );
            assert_eq!(r.status, 204, "{:?}", r.body);
            let r = self.call(ROOT, Method::Post, "auth/token/create", body);
            r.body.unwrap_or_default()["auth"]["client_token"]
                .as_str()
                .expect("token")
                .to_string()
        }

        fn new() -> T {
            T {
                node: Node::dev_in_memory([7; 32], ROOT),
                next: 0,
            }
        }
        fn call(&mut self, tok: &str, m: Method, path: &str, body: Value) -> Response {
            self.next += 1;
            let id = self.next;
            let req = Request::new(id, m, path).with_token(tok).with_json(body);
            self.node.handle(10_000, Input::Request(req));
            let mut out = None;
            while let Some(o) = self.node.poll_output() {
                if let Output::Response(r) = o {
                    if r.id == id {
                        out = Some(r);
                    }
                }
            }
            out.unwrap_or_else(|| panic!("no response for {path}"))
        }
        fn role(&mut self, name: &str, body: Value) -> Response {
            self.call(
                ROOT,
                Method::Post,
                &format!("auth/token/roles/{name}"),
                body,
            )
        }
        fn read(&mut self, name: &str) -> Value {
            let r = self.call(
                ROOT,
                Method::Get,
                &format!("auth/token/roles/{name}"),
                json!({}),
            );
            assert_eq!(r.status, 200, "{:?}", r.body);
            r.body.map(|b| b["data"].clone()).unwrap_or_default()
        }
        /// `auth/token/create/<role>` as `tok`: status, auth block, warnings.
        fn create(&mut self, tok: &str, role: &str, body: Value) -> (u16, Value, Value) {
            let r = self.call(
                tok,
                Method::Post,
                &format!("auth/token/create/{role}"),
                body,
            );
            let b = r.body.unwrap_or_default();
            let detail = if r.status == 200 {
                b["auth"].clone()
            } else {
                b["errors"][0].clone()
            };
            (r.status, detail, b["warnings"].clone())
        }
    }

    /// A role that allows `root` does not let a token that is not root make root tokens
    /// (the caller needs only `update` on the role paths otherwise).
    #[test]
    fn a_role_allowing_root_mints_root_tokens_only_for_root() {
        let mut t = T::new();
        let r = t.call(
            ROOT,
            Method::Put,
            "sys/policies/acl/roles",
            json!({"policy": "path \"auth/token/*\" { capabilities = [\"create\", \"update\", \"read\"] }"}),
        );
        assert_eq!(r.status, 204, "{:?}", r.body);
        let r = t.call(
            ROOT,
            Method::Post,
            "auth/token/create",
            json!({"policies": ["roles"]}),
        );
        let tok = r.body.unwrap_or_default()["auth"]["client_token"]
            .as_str()
            .expect("token")
            .to_string();
        let r = t.call(
            &tok,
            Method::Post,
            "auth/token/roles/escalate",
            json!({"allowed_policies": ["root"]}),
        );
        assert!(r.status < 300, "{:?}", r.body);
        for body in [json!({}), json!({"policies": ["root"]})] {
            let (status, detail, _) = t.create(&tok, "escalate", body);
            assert_eq!(status, 400, "{detail}");
            assert!(
                detail
                    .to_string()
                    .contains("root tokens may not be created"),
                "{detail}"
            );
        }
        let (status, auth, _) = t.create(ROOT, "escalate", json!({}));
        assert_eq!(status, 200, "{auth}");
        assert_eq!(auth["policies"], json!(["root"]));
    }

    #[test]
    fn role_fields_are_stored_as_the_reference_stores_them() {
        let mut t = T::new();
        let r = t.role(
            "old",
            json!({"period": "30m", "explicit_max_ttl": "5h", "orphan": true}),
        );
        assert_eq!(r.status, 204, "{:?}", r.body);
        let d = t.read("old");
        assert_eq!(
            [
                &d["period"],
                &d["token_period"],
                &d["explicit_max_ttl"],
                &d["token_explicit_max_ttl"]
            ],
            [&json!(1800), &json!(1800), &json!(18000), &json!(18000)]
        );
        assert_eq!(d["token_type"], "default-service");
        let r = t.role(
            "new",
            json!({"token_period": "30m", "token_explicit_max_ttl": "5h"}),
        );
        assert_eq!(r.status, 204);
        let d = t.read("new");
        assert_eq!(
            [
                &d["period"],
                &d["token_period"],
                &d["explicit_max_ttl"],
                &d["token_explicit_max_ttl"]
            ],
            [&json!(0), &json!(1800), &json!(0), &json!(18000)]
        );
        // token_ttl and token_max_ttl are not role fields: accepted, ignored, not shown.
        assert_eq!(
            t.role("ttl", json!({"token_ttl": 60, "token_max_ttl": 120}))
                .status,
            204
        );
        let d = t.read("ttl");
        assert!(
            d.get("token_ttl").is_none() && d.get("token_max_ttl").is_none(),
            "{d}"
        );
        let (s, a, _) = t.create(ROOT, "ttl", json!({"policies": ["default"]}));
        assert_eq!(
            (s, a["lease_duration"].clone()),
            (200, json!(super::super::DEFAULT_TTL))
        );
        // Refused writes store nothing.
        for (body, want) in [
            (
                json!({"token_type": "bogus"}),
                "invalid 'token_type' value \"bogus\"",
            ),
            (json!({"token_type": "batch"}), "non-orphan"),
            (json!({"token_type": "batch", "orphan": true}), "renewable"),
            (
                json!({"token_type": "batch", "orphan": true, "renewable": false, "token_period": "1h"}),
                "periodic",
            ),
        ] {
            let r = t.role("bad", body.clone());
            assert_eq!(r.status, 400, "{body}");
            let e = r
                .body
                .map(|b| b["errors"][0].as_str().unwrap_or_default().to_string())
                .unwrap_or_default();
            assert!(e.contains(want), "{body}: {e}");
            let r = t.call(ROOT, Method::Get, "auth/token/roles/bad", json!({}));
            assert_eq!(r.status, 404, "{body}");
        }
        // default-batch carries no such constraint.
        assert_eq!(
            t.role("db", json!({"token_type": "default-batch"})).status,
            204
        );
        assert_eq!(t.read("db")["token_type"], "default-batch");
    }

    #[test]
    fn a_role_bounds_policies_lifetimes_type_and_renewal() {
        let mut t = T::new();
        let body = json!({"allowed_policies": ["a", "b"], "disallowed_policies": ["c"], "renewable": false});
        assert_eq!(t.role("ab", body).status, 204);
        let (s, a, _) = t.create(ROOT, "ab", json!({}));
        assert_eq!(s, 200, "{a}");
        assert_eq!(a["policies"], json!(["a", "b", "default"]));
        assert_eq!(a["renewable"], false);
        let (s, a, _) = t.create(
            ROOT,
            "ab",
            json!({"policies": ["a"], "ttl": "3h", "renewable": true}),
        );
        assert_eq!(
            (s, a["lease_duration"].clone(), a["renewable"].clone()),
            (200, json!(10800), json!(false))
        );
        let (s, e, _) = t.create(ROOT, "ab", json!({"policies": ["c"]}));
        assert_eq!(s, 400);
        assert_eq!(
            e,
            r#"token policies (["c" "default"]) must be subset of the role's allowed policies (["a" "b" "default"]) or glob policies ([])"#
        );
        assert_eq!(
            t.role("noc", json!({"disallowed_policies": ["c"]})).status,
            204
        );
        let (s, e, _) = t.create(ROOT, "noc", json!({"policies": ["c"]}));
        assert_eq!(
            (s, e),
            (400, json!("token policy \"c\" is disallowed by this role"))
        );
        let (s, a, _) = t.create(ROOT, "noc", json!({"policies": ["a"]}));
        assert_eq!((s, a["policies"].clone()), (200, json!(["a", "default"])));

        // Period and explicit max: the lesser of role and request, with a warning.
        assert_eq!(
            t.role(
                "per",
                json!({"token_period": "1h", "token_explicit_max_ttl": "2h"})
            )
            .status,
            204
        );
        let (s, a, w) = t.create(
            ROOT,
            "per",
            json!({"policies": ["a"], "period": "2h", "explicit_max_ttl": "3h"}),
        );
        assert_eq!((s, a["lease_duration"].clone()), (200, json!(3600)));
        let w = w.to_string();
        assert!(
            w.contains("Period specified both") && w.contains("Explicit max TTL specified both"),
            "{w}"
        );
        assert_eq!(
            t.role("emax", json!({"token_explicit_max_ttl": "2h"}))
                .status,
            204
        );
        let (s, a, w) = t.create(ROOT, "emax", json!({"policies": ["a"], "ttl": "5h"}));
        assert_eq!((s, a["lease_duration"].clone()), (200, json!(7200)));
        assert!(
            w.to_string()
                .contains(r#"TTL of \"5h\" exceeded the effective max_ttl of \"2h\""#),
            "{w}"
        );

        // Types: service and batch force, default-* choose when the request does not.
        assert_eq!(t.role("svc", json!({"token_type": "service"})).status, 204);
        let (_, a, _) = t.create(ROOT, "svc", json!({"policies": ["a"], "type": "batch"}));
        assert_eq!(a["token_type"], "service");
        let body = json!({"token_type": "batch", "orphan": true, "renewable": false});
        assert_eq!(t.role("bat", body).status, 204);
        let (_, a, _) = t.create(ROOT, "bat", json!({"policies": ["a"], "type": "service"}));
        assert_eq!(
            (a["token_type"].clone(), a["orphan"].clone()),
            (json!("batch"), json!(true))
        );
        assert_eq!(
            t.role(
                "dbat",
                json!({"token_type": "default-batch", "orphan": true})
            )
            .status,
            204
        );
        let (_, a, _) = t.create(ROOT, "dbat", json!({"policies": ["a"]}));
        assert_eq!(
            (a["token_type"].clone(), a["renewable"].clone()),
            (json!("batch"), json!(false))
        );
        let (_, a, _) = t.create(ROOT, "dbat", json!({"policies": ["a"], "type": "service"}));
        assert_eq!(a["token_type"], "service");
        let (s, e, _) = t.create(ROOT, "dbat", json!({}));
        assert_eq!((s, e), (400, json!("batch tokens cannot be root tokens")));
    }

    /// Naming no policies does not get round a role's disallowed ones: without allowed
    /// policies the token would carry the caller's own, and those are checked too (the
    /// reference's answer).
    #[test]
    fn disallowed_policies_bound_the_policies_a_token_inherits() {
        let mut t = T::new();
        let caller = t.maker_and_token(json!({"policies": ["maker", "a", "c"]}));
        assert_eq!(
            t.role("noc", json!({"disallowed_policies": ["c"]})).status,
            204
        );
        let (s, e, _) = t.create(&caller, "noc", json!({}));
        assert_eq!(
            (s, e),
            (400, json!("token policy \"c\" is disallowed by this role"))
        );
        let (s, a, _) = t.create(&caller, "noc", json!({"policies": ["a"]}));
        assert_eq!((s, a["policies"].clone()), (200, json!(["a", "default"])));
        // A disallowed `default` is not added; one the caller carries is refused.
        assert_eq!(
            t.role("nodef", json!({"disallowed_policies": ["default"]}))
                .status,
            204
        );
        let (s, a, _) = t.create(&caller, "nodef", json!({"policies": ["a"]}));
        assert_eq!((s, a["policies"].clone()), (200, json!(["a"])));
        let (s, e, _) = t.create(&caller, "nodef", json!({}));
        assert_eq!(
            (s, e),
            (
                400,
                json!("token policy \"default\" is disallowed by this role")
            )
        );
        let bare =
            t.maker_and_token(json!({"policies": ["maker", "a"], "no_default_policy": true}));
        let (s, a, _) = t.create(&bare, "nodef", json!({}));
        assert_eq!((s, a["policies"].clone()), (200, json!(["a", "maker"])));
    }

    /// A role's path suffix is part of its tokens' path, so that revoking by that prefix
    /// revokes exactly the tokens issued under it.
    #[test]
    fn a_path_suffix_names_the_tokens_revoked_by_its_prefix() {
        let mut t = T::new();
        let alive = |t: &mut T, tok: &str| {
            t.call(tok, Method::Get, "auth/token/lookup-self", json!({}))
                .status
        };
        assert_eq!(t.role("suf", json!({"path_suffix": "ver1"})).status, 204);
        let (s, a, _) = t.create(ROOT, "suf", json!({"policies": ["a"]}));
        assert_eq!(s, 200, "{a}");
        let v1 = a["client_token"].as_str().expect("token").to_string();
        let r = t.call(&v1, Method::Get, "auth/token/lookup-self", json!({}));
        assert_eq!(
            r.body.unwrap_or_default()["data"]["path"],
            "auth/token/create/suf/ver1"
        );
        assert_eq!(t.role("suf", json!({"path_suffix": "ver2"})).status, 204);
        let (_, a, _) = t.create(ROOT, "suf", json!({"policies": ["a"]}));
        let v2 = a["client_token"].as_str().expect("token").to_string();
        let r = t.call(
            ROOT,
            Method::Post,
            "sys/leases/revoke-prefix/auth/token/create/suf/ver1",
            json!({}),
        );
        assert_eq!(r.status, 204, "{:?}", r.body);
        assert_eq!((alive(&mut t, &v1), alive(&mut t, &v2)), (403, 200));
        // The reference's pattern, and no suffix that names another path segment.
        for bad in ["v1", "a b", "../abc", "abc/../x", "abc/", "/abc", "abc//x"] {
            let r = t.role("suf", json!({ "path_suffix": bad }));
            assert_eq!(r.status, 400, "{bad}: {:?}", r.body);
        }
        assert_eq!(t.read("suf")["path_suffix"], "ver2");
        for good in ["v-1.2", "team/app_1", ""] {
            assert_eq!(t.role("suf", json!({ "path_suffix": good })).status, 204);
        }
    }

    /// `token_num_uses` and `token_bound_cidrs` reach the role's tokens (they were
    /// accepted and ignored: unlimited tokens usable from anywhere).
    #[test]
    fn a_role_limits_uses_and_binds_addresses() {
        let mut t = T::new();
        let r = t.role(
            "lim",
            json!({"token_num_uses": 2, "token_bound_cidrs": ["10.0.0.0/8"]}),
        );
        assert_eq!(r.status, 204, "{:?}", r.body);
        let d = t.read("lim");
        assert_eq!(
            (d["token_num_uses"].clone(), d["token_bound_cidrs"].clone()),
            (json!(2), json!(["10.0.0.0/8"]))
        );
        // Unset, neither is shown (the reference's read).
        assert_eq!(t.role("plain", json!({})).status, 204);
        let d = t.read("plain");
        assert!(
            d.get("token_num_uses").is_none() && d.get("token_bound_cidrs").is_none(),
            "{d}"
        );
        for (asked, got) in [
            (json!({}), 2),
            (json!({"num_uses": 5}), 2),
            (json!({"num_uses": 1}), 1),
        ] {
            let mut body = asked.clone();
            body["policies"] = json!(["a"]);
            let (s, a, _) = t.create(ROOT, "lim", body);
            assert_eq!((s, a["num_uses"].clone()), (200, json!(got)), "{asked}");
        }
        let (_, a, _) = t.create(ROOT, "lim", json!({"policies": ["a"]}));
        let tok = a["client_token"].as_str().expect("token").to_string();
        let mut from_to = |addr: &str, help: bool| {
            t.next += 1;
            let id = t.next;
            let mut req = Request::new(id, Method::Get, "auth/token/lookup-self").with_token(&tok);
            if help {
                req.query = vec![("help".into(), "1".into())];
            }
            req.remote_addr = addr.into();
            t.node.handle(10_000, Input::Request(req));
            let mut status = 0;
            while let Some(o) = t.node.poll_output() {
                if let Output::Response(r) = o {
                    if r.id == id {
                        status = r.status;
                    }
                }
            }
            status
        };
        assert_eq!(from_to("127.0.0.1:5000", false), 403);
        assert_eq!(from_to("", false), 403);
        assert_eq!(from_to("10.9.8.7:5000", false), 200);
        // The routes' help too: a bound token is nobody's from elsewhere.
        assert_eq!(from_to("127.0.0.1:5000", true), 403);
        assert_eq!(from_to("10.9.8.7:5000", true), 200);
        for bad in [
            json!({"token_num_uses": -1}),
            json!({"token_bound_cidrs": ["10.0.0.0/33"]}),
        ] {
            assert_eq!(t.role("lim", bad.clone()).status, 400, "{bad}");
        }
    }

    /// Policy globs bound a role's tokens as the reference's do (they were shown as `[]`
    /// and ignored: a disallowed glob let its policies through). Answers as OpenBao 2.6
    /// gives them.
    #[test]
    fn policy_globs_allow_and_disallow() {
        let mut t = T::new();
        let maker = t.maker_and_token(json!({"policies": ["maker"]}));
        let r = t.role("g1", json!({"allowed_policies_glob": ["user*", "adm*-a"]}));
        assert_eq!(r.status, 204, "{:?}", r.body);
        assert_eq!(
            t.read("g1")["allowed_policies_glob"],
            json!(["adm*-a", "user*"])
        );
        for (asked, want) in [
            (json!([]), json!(["default"])),
            (json!(["user"]), json!(["default", "user"])),
            (json!(["userx"]), json!(["default", "userx"])),
            (json!(["admin-a"]), json!(["admin-a", "default"])),
        ] {
            let (s, a, _) = t.create(&maker, "g1", json!({ "policies": asked }));
            assert_eq!((s, a["policies"].clone()), (200, want), "{asked}");
        }
        for (asked, shown) in [
            ("admin-b", r#"["admin-b" "default"]"#),
            ("maker", r#"["default" "maker"]"#),
        ] {
            let (s, e, _) = t.create(&maker, "g1", json!({ "policies": [asked] }));
            assert_eq!(s, 400, "{asked}");
            assert_eq!(
                e,
                json!(format!(
                    r#"token policies ({shown}) must be subset of the role's allowed policies (["default"]) or glob policies (["adm*-a" "user*"])"#
                ))
            );
        }
        let r = t.role("g2", json!({"disallowed_policies_glob": ["def*", "adm*"]}));
        assert_eq!(r.status, 204, "{:?}", r.body);
        let caller = t.maker_and_token(json!({"policies": ["maker", "user", "admin-a"]}));
        let (s, a, _) = t.create(&caller, "g2", json!({"policies": ["user"]}));
        assert_eq!((s, a["policies"].clone()), (200, json!(["user"])));
        for body in [json!({}), json!({"policies": ["user", "admin-a"]})] {
            let (s, e, _) = t.create(&caller, "g2", body.clone());
            assert_eq!(s, 400, "{body}: {e}");
            assert!(e.to_string().contains("is disallowed by this role"), "{e}");
        }
        assert!(super::glob("a*b*c", "abc") && super::glob("a*b*c", "axxbyyc"));
        assert!(!super::glob("a*b*c", "acb") && !super::glob("ab", "abc"));
        assert!(super::glob("*", "") && super::glob("a**", "a") && !super::glob("a*a", "a"));
    }

    #[test]
    fn an_orphan_role_needs_no_sudo_and_no_parent_does_not_override_a_role() {
        let mut t = T::new();
        let maker = t.maker_and_token(json!({"policies": ["maker"]}));
        assert_eq!(
            t.role("orph", json!({"orphan": true, "allowed_policies": ["a"]}))
                .status,
            204
        );
        assert_eq!(
            t.role("kids", json!({"allowed_policies": ["a"]})).status,
            204
        );
        let (s, a, _) = t.create(&maker, "orph", json!({"policies": ["a"]}));
        assert_eq!((s, a["orphan"].clone()), (200, json!(true)), "{a}");
        let (s, a, _) = t.create(
            &maker,
            "kids",
            json!({"policies": ["a"], "no_parent": true}),
        );
        assert_eq!((s, a["orphan"].clone()), (200, json!(false)), "{a}");
        let (s, a, _) = t.create(ROOT, "orph", json!({"policies": ["a"], "no_parent": false}));
        assert_eq!((s, a["orphan"].clone()), (200, json!(true)), "{a}");
    }
}
