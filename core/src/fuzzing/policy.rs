//! The `policy` target: HCL and JSON policy parsing and ACL decisions.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)] // a broken promise panics: that is the finding

use crate::policy::{self, Acl, Policy};
use serde_json::json;

/// HCL and JSON policy parsing. Property: no panic; a parsed policy re-encoded in the JSON
/// form parses to the same rules (deny standing alone), and ACL decisions never panic.
pub fn policy(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(p) = Policy::parse(&text) else {
        return;
    };
    let mut paths = serde_json::Map::new();
    for (pat, caps) in &p.rules {
        paths.insert(
            pat.clone(),
            json!({ "capabilities": policy::cap_names(*caps) }),
        );
    }
    let again = Policy::parse(&json!({ "path": paths }).to_string())
        .unwrap_or_else(|e| panic!("re-encoded policy does not parse: {e}"));
    for (pat, caps) in &p.rules {
        let want = if caps & policy::DENY != 0 {
            policy::DENY
        } else {
            *caps
        };
        let pat2 = pat.trim_start_matches('/');
        assert_eq!(again.rules.get(pat2).copied(), Some(want), "rule {pat:?}");
    }
    let acl = Acl::new([&p], false);
    for path in ["secret/a", "sys/mounts", "", "a/b/c/d"] {
        let _ = acl.capabilities(path);
    }
    for pat in p.rules.keys().take(16) {
        let _ = acl.allows(pat, policy::READ);
    }
}
