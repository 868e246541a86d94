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
    /// Full paths of the namespaces that exist (`ns1/`, `ns1/child/`).
    pub namespaces: Vec<String>,
}

pub fn mount_map(ctx: &Ctx) -> ApiResult<MountMap> {
    let mut m = MountMap::default();
    let secrets: Vec<MountEntry> = ctx.get_json("core/mounts")?.unwrap_or_default();
    for e in secrets {
        m.by_subtree.insert(format!("logical/{}", e.uuid), e.path);
    }
    let auth: Vec<MountEntry> = ctx.get_json("core/auth")?.unwrap_or_default();
    for e in auth {
        // An auth mount of namespace `ns1/` is `ns1/auth/<path>/`, so `ns1/` covers it.
        let rel = e.path.get(e.namespace.len()..).unwrap_or(&e.path);
        m.by_subtree.insert(
            format!("auth/{}", e.uuid),
            format!("{}auth/{rel}", e.namespace),
        );
    }
    m.namespaces = crate::namespace::all_paths(ctx)?;
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
    // Namespaces the filter leaves out: in deny mode those at or under a listed path; in
    // allow mode those neither at or under a listed path nor above one.
    let namespaces = mm
        .namespaces
        .iter()
        .filter(|ns| {
            let hit = matches(&flt.paths, ns);
            if flt.mode == "deny" {
                hit
            } else {
                !hit && !flt.paths.iter().any(|p| p.starts_with(ns.as_str()))
            }
        })
        .cloned()
        .collect();
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

    #[test]
    fn namespace_paths_cover_their_mounts() {
        let mut mm = MountMap::default();
        mm.by_subtree.insert("logical/a".into(), "secret/".into());
        mm.by_subtree
            .insert("logical/n".into(), "ns1/secret/".into());
        mm.by_subtree
            .insert("auth/l".into(), "ns1/auth/ldap/".into());
        mm.by_subtree
            .insert("logical/k".into(), "ns1/kid/kv/".into());
        mm.by_subtree.insert("logical/o".into(), "ns2/kv/".into());
        mm.namespaces = vec!["ns1/".into(), "ns1/kid/".into(), "ns2/".into()];
        let deny = validate("deny", vec!["ns1".into()]).unwrap();
        for s in ["logical/n", "auth/l", "logical/k"] {
            assert!(!included(Some(&deny), &mm, s), "{s}");
        }
        assert!(included(Some(&deny), &mm, "logical/a"));
        assert!(included(Some(&deny), &mm, "logical/o"));
        let v = view(Some(&deny), &mm);
        assert_eq!(v.dynamic_filtered_namespaces, vec!["ns1/", "ns1/kid/"]);
        assert_eq!(
            v.dynamic_filtered_mounts,
            vec!["ns1/auth/ldap/", "ns1/kid/kv/", "ns1/secret/"]
        );
        let allow = validate("allow", vec!["ns1/kid/".into()]).unwrap();
        assert!(included(Some(&allow), &mm, "logical/k"));
        assert!(!included(Some(&allow), &mm, "logical/n"));
        assert_eq!(
            view(Some(&allow), &mm).dynamic_filtered_namespaces,
            vec!["ns2/"]
        );
    }
}
