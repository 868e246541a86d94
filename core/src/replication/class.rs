//! Key classes: which keys replicate where.
//!
//! | class | keys | perf secondary | DR secondary |
//! |---|---|---|---|
//! | replicated | everything else (mount tables, policies, identity under `sys/identity/`, KV data of non-local mounts, keyring) | yes, unless path-filtered | yes |
//! | cluster-local | `sys/token/`, `core/local-*` (e.g. a perf secondary's `core/local-identity/`), data of `local` mounts | no | yes |
//! | node-local | `node/` | no | no |
//!
//! Whether `logical/<uuid>/…` (or `auth/<uuid>/…`) is cluster-local depends on the mount
//! table, so [`classify`] takes the set of UUIDs of local mounts.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Prefix of node-local keys (never replicated).
pub const NODE_LOCAL: &str = "node/";
/// Cluster-local prefix of replication bookkeeping (secondary records, activation key).
pub const LOCAL_REPLICATION: &str = "core/local-replication/";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Class {
    Replicated,
    ClusterLocal,
    NodeLocal,
}

impl Class {
    /// The class as one byte in the compact forms (key-only WAL entries, catch-up
    /// batches): 0 replicated, 1 cluster-local, 2 node-local.
    pub fn tag(self) -> u8 {
        match self {
            Class::Replicated => 0,
            Class::ClusterLocal => 1,
            Class::NodeLocal => 2,
        }
    }
    /// The class of a [`Class::tag`] byte.
    pub fn from_tag(b: u8) -> Option<Class> {
        match b {
            0 => Some(Class::Replicated),
            1 => Some(Class::ClusterLocal),
            2 => Some(Class::NodeLocal),
            _ => None,
        }
    }
}

/// The mount UUID a data key belongs to (`logical/<uuid>/…`, `auth/<uuid>/…`).
pub fn mount_uuid(key: &str) -> Option<&str> {
    let rest = key
        .strip_prefix("logical/")
        .or_else(|| key.strip_prefix("auth/"))?;
    let (uuid, _) = rest.split_once('/')?;
    (!uuid.is_empty()).then_some(uuid)
}

/// The class of `key`, given the UUIDs of local mounts (secrets and auth).
pub fn classify(key: &str, local_uuids: &BTreeSet<String>) -> Class {
    if key.starts_with(NODE_LOCAL) {
        Class::NodeLocal
    } else if key.starts_with("sys/token/")
        || key.starts_with("core/local-")
        || mount_uuid(key).is_some_and(|u| local_uuids.contains(u))
    {
        Class::ClusterLocal
    } else {
        Class::Replicated
    }
}

/// The Merkle subtree a key belongs to: `logical/<uuid>` or `auth/<uuid>` for mount data,
/// `sys` for everything else.
pub fn subtree(key: &str) -> String {
    match subtree_ref(key) {
        SubtreeRef::Mount { auth, uuid } => {
            let kind = if auth { "auth" } else { "logical" };
            format!("{kind}/{uuid}")
        }
        SubtreeRef::System => SYSTEM_SUBTREE.to_string(),
    }
}

/// [`subtree`] without building its id: two keys of the same subtree give equal values (a
/// scan in key order meets each subtree's keys in runs, and names the subtree once per run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubtreeRef<'a> {
    Mount { auth: bool, uuid: &'a str },
    System,
}

/// The subtree `key` belongs to, borrowed from the key.
pub fn subtree_ref(key: &str) -> SubtreeRef<'_> {
    match mount_uuid(key) {
        Some(uuid) => SubtreeRef::Mount {
            auth: key.starts_with("auth/"),
            uuid,
        },
        None => SubtreeRef::System,
    }
}

/// Subtree id of system data (everything outside mount data).
pub const SYSTEM_SUBTREE: &str = "sys";

/// Storage prefix of a subtree's keys (`None` for the system subtree, which is "the rest").
pub fn subtree_prefix(id: &str) -> Option<String> {
    (id != SYSTEM_SUBTREE).then(|| format!("{id}/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_by_prefix_and_local_mounts() {
        let local: BTreeSet<String> = ["L1".to_string()].into_iter().collect();
        assert_eq!(classify("node/replication/dr", &local), Class::NodeLocal);
        assert_eq!(classify("sys/token/id/abc", &local), Class::ClusterLocal);
        assert_eq!(classify("core/local-mounts", &local), Class::ClusterLocal);
        assert_eq!(classify("logical/L1/x", &local), Class::ClusterLocal);
        assert_eq!(classify("auth/L1/users/x", &local), Class::ClusterLocal);
        assert_eq!(classify("logical/R1/x", &local), Class::Replicated);
        assert_eq!(classify("core/mounts", &local), Class::Replicated);
        assert_eq!(classify("core/keyring", &local), Class::Replicated);
        assert_eq!(classify("sys/policy/p", &local), Class::Replicated);
        // Identity data replicates like policies; what a perf secondary's logins create
        // stays in its cluster (its DR secondaries get it, its primary never does).
        assert_eq!(classify("sys/identity/entity/e", &local), Class::Replicated);
        assert_eq!(
            classify("core/local-identity/entity/e", &local),
            Class::ClusterLocal
        );
        assert_eq!(subtree("sys/identity/group/g"), "sys");
        assert_eq!(subtree("logical/R1/a/b"), "logical/R1");
        assert_eq!(subtree("auth/X/users/u"), "auth/X");
        assert_eq!(subtree("core/mounts"), "sys");
        assert_eq!(subtree("logical/"), "sys");
    }
}
