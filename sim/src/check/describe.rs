//! How the checker names what it saw: the category and invariant of a denial, the token
//! an operation presents, and answers and capabilities as text for violation reports.

use super::*;

/// Coverage counter key: why the model expects a refusal.
pub(super) fn deny_category(a: &Auth) -> &'static str {
    match a {
        Auth::Invalid(why) if why.contains(USES_SPENT) => "denied:uses-spent",
        Auth::Invalid(why) if why.contains("revoked") => "denied:revoked",
        Auth::Invalid(why) if why.contains("expired") => "denied:expired",
        Auth::Invalid(why) if why.contains("unknown") => "denied:unknown-token",
        Auth::Invalid(_) => "denied:no-token",
        Auth::Limited {
            kind: TokenKind::Wrapping,
            ..
        } => "denied:wrapping-token",
        Auth::Limited { .. } => "denied:policy",
        Auth::Root => "denied:root",
    }
}

/// The invariant a request with this token breaks when it is not refused.
pub(super) fn deny_invariant(a: &Auth) -> &'static str {
    match a {
        Auth::Invalid(why) if why.contains(USES_SPENT) => "token-use-limit",
        _ => "denied-stays-denied",
    }
}

/// The token a request presents on an authenticated path.
pub(super) fn op_token(op: &Op) -> Option<&str> {
    match op {
        Op::Seal { tok }
        | Op::Mount { tok }
        | Op::Unmount { tok }
        | Op::PolicyWrite { tok, .. }
        | Op::PolicyDelete { tok, .. }
        | Op::TokenCreate { tok, .. }
        | Op::TokenRevoke { tok, .. }
        | Op::RevokeSelf { tok }
        | Op::Kv { tok, .. }
        | Op::LookupSelf { tok }
        | Op::Probe { tok, .. }
        | Op::TenantSetup { tok, .. }
        | Op::TenantProbe { tok, .. } => Some(tok.secret.as_str()),
        Op::SealStatus | Op::Init { .. } | Op::DevSetup | Op::Unseal { .. } | Op::Unwrap { .. } => {
            None
        }
    }
}

pub(super) fn auth_reason(a: &Auth) -> String {
    match a {
        Auth::Root => "root token".into(),
        Auth::Limited { kind, policies, .. } => {
            format!("{kind:?} token with policies {policies:?}")
        }
        Auth::Invalid(why) => why.clone(),
    }
}

pub(super) fn caps_text(c: u8) -> String {
    let names: Vec<&str> = [
        (crate::model::CREATE, "create"),
        (crate::model::READ, "read"),
        (crate::model::UPDATE, "update"),
        (crate::model::DELETE, "delete"),
        (crate::model::LIST, "list"),
    ]
    .iter()
    .filter(|(b, _)| c & b != 0)
    .map(|(_, n)| *n)
    .collect();
    if names.is_empty() {
        "nothing".into()
    } else {
        names.join("+")
    }
}

pub(super) fn body_text(r: &Response) -> String {
    match &r.body {
        Some(b) => crate::trace::shorten(&b.to_string(), 300),
        None => String::new(),
    }
}

pub fn str_list(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}
