//! Path filters for performance secondaries.
//!
//! A filter is `allow` (only the listed mounts and namespaces replicate) or `deny` (the listed
//! ones do not). Paths end with `/`; auth mounts are written `auth/<path>/`. System data
//! (mount tables, policies, the keyring) always replicates; a filter decides which mounts'
//! data subtrees do. The dynamic filter is the filter resolved against the mounts that exist
//! now.

use super::class::SYSTEM_SUBTREE;
use super::msg::FilterView;
use super::state::PathsFilter;
use crate::api::{ApiError, ApiResult};
use crate::ctx::Ctx;
use crate::mounts::MountEntry;
use std::collections::BTreeMap;

/// Replicated mounts by data subtree (`logical/<uuid>` → `secret/`, `auth/<uuid>` →
/// `auth/ldap/`).
#[derive(Debug, Clone, Default)]
pub struct MountMap {
    pub by_subtree: BTreeMap<String, String>,
}

pub fn mount_map(ctx: &Ctx) -> ApiResult<MountMap> {
    let mut m = MountMap::default();
    let secrets: Vec<MountEntry> = ctx.get_json("core/mounts")?.unwrap_or_default();
    for e in secrets {
        m.by_subtree.insert(format!("logical/{}", e.uuid), e.path);
    }
    let auth: Vec<MountEntry> = ctx.get_json("core/auth")?.unwrap_or_default();
    for e in auth {
        m.by_subtree
            .insert(format!("auth/{}", e.uuid), format!("auth/{}", e.path));
    }
    Ok(m)
}

/// Checks and normalises a filter from a request.
pub fn validate(mode: &str, paths: Vec<String>) -> ApiResult<PathsFilter> {
    let mode = if mode.is_empty() { "allow" } else { mode };
    if mode != "allow" && mode != "deny" {
        return Err(ApiError::bad(format!(
            "mode: must be \"allow\" or \"deny\", got {mode:?}"
        )));
    }
    let mut out = Vec::new();
    for p in paths {
        let p = p.trim().trim_start_matches('/').to_string();
        if p.is_empty() || p.split('/').any(|s| s == "." || s == "..") {
            return Err(ApiError::bad(format!("paths: invalid path {p:?}")));
        }
        let p = if p.ends_with('/') { p } else { format!("{p}/") };
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out.sort();
    Ok(PathsFilter {
        mode: mode.into(),
        paths: out,
    })
}

fn matches(paths: &[String], full: &str) -> bool {
    paths.iter().any(|p| full.starts_with(p.as_str()))
}

/// Whether a subtree replicates to a secondary with filter `f`. Subtrees of mounts that no
/// longer exist replicate (only their deletes are left).
pub fn included(f: Option<&PathsFilter>, mm: &MountMap, subtree: &str) -> bool {
    if subtree == SYSTEM_SUBTREE {
        return true;
    }
    let Some(f) = f else { return true };
    let Some(path) = mm.by_subtree.get(subtree) else {
        return true;
    };
    let hit = matches(&f.paths, path);
    if f.mode == "deny" {
        !hit
    } else {
        hit
    }
}

/// The filter as reported to the secondary and by the dynamic-filter endpoints.
pub fn view(f: Option<&PathsFilter>, mm: &MountMap) -> FilterView {
    let Some(flt) = f else {
        return FilterView::default();
    };
    let mut mounts: Vec<String> = mm
        .by_subtree
        .iter()
        .filter(|(id, _)| !included(f, mm, id))
        .map(|(_, p)| p.clone())
        .collect();
    mounts.sort();
    let namespaces = if flt.mode == "deny" {
        flt.paths
            .iter()
            .filter(|p| !mm.by_subtree.values().any(|m| m == *p))
            .cloned()
            .collect()
    } else {
        Vec::new()
    };
    FilterView {
        mode: flt.mode.clone(),
        paths: flt.paths.clone(),
        dynamic_filtered_mounts: mounts,
        dynamic_filtered_namespaces: namespaces,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_and_deny() {
        let mut mm = MountMap::default();
        mm.by_subtree.insert("logical/a".into(), "secret/".into());
        mm.by_subtree.insert("logical/b".into(), "team/".into());
        mm.by_subtree.insert("auth/c".into(), "auth/ldap/".into());
        let deny = validate("deny", vec!["team".into()]).unwrap();
        assert_eq!(deny.paths, vec!["team/"]);
        assert!(included(Some(&deny), &mm, "logical/a"));
        assert!(!included(Some(&deny), &mm, "logical/b"));
        assert!(included(Some(&deny), &mm, "sys"));
        let allow = validate("", vec!["secret/".into(), "auth/ldap/".into()]).unwrap();
        assert!(included(Some(&allow), &mm, "logical/a"));
        assert!(!included(Some(&allow), &mm, "logical/b"));
        assert!(included(Some(&allow), &mm, "auth/c"));
        assert_eq!(
            view(Some(&allow), &mm).dynamic_filtered_mounts,
            vec!["team/"]
        );
        assert!(validate("maybe", vec![]).is_err());
        assert!(included(None, &mm, "logical/b"));
    }
}
