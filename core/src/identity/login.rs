//! What a login does to the identity store: the entity of the alias the auth method reports
//! (mount accessor + alias name), created with its alias when missing, and the entity's
//! memberships of the external groups whose alias on that mount names one of the user's
//! directory groups, refreshed (joined and left) at every login.
//!
//! On a performance secondary (`local`) what the login creates goes to the cluster-local
//! base ([`super::LOCAL`]); the rest of the time to the replicated one.

use super::entity::{self, Alias};
use super::group::{self, member_key, EXTERNAL};
use super::{lookup, namespace_id, put_id, LOCAL, REPLICATED};
use crate::api::ApiResult;
use crate::crypto;
use crate::ctx::Ctx;
use crate::mounts::MountEntry;
use std::collections::BTreeSet;

/// The identity a login resolved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoginIdentity {
    pub entity_id: String,
    /// The entity is disabled: the login is refused.
    pub disabled: bool,
    /// The entity's identity policies after the refresh.
    pub policies: Vec<String>,
}

/// Finds or creates the entity of `alias_name` on `mount` and refreshes its external groups
/// from `groups` (the user's group names as the method reports them).
pub fn resolve(
    ctx: &mut Ctx,
    local: bool,
    mount: &MountEntry,
    alias_name: &str,
    groups: &[String],
) -> ApiResult<LoginIdentity> {
    let base = if local { LOCAL } else { REPLICATED };
    let ns_id = namespace_id(ctx, &mount.namespace)?;
    let accessor = mount.accessor.as_str();
    let existing = match entity::alias_by_key(ctx, accessor, alias_name)? {
        Some(a) => entity::load(ctx, &a.canonical_id)?.map(|e| (a, e)),
        None => None,
    };
    let entity_id = match existing {
        Some((_, e)) => e.id,
        None => {
            let e = entity::new_entity(ctx, &ns_id, "");
            entity::store(ctx, base, &e)?;
            // An alias whose entity is gone is replaced by one for the new entity. A
            // performance secondary removes only its own (local) records: the replicated
            // ones are the primary's (an alias can arrive before its entity during a sync).
            if let Some(old) = entity::alias_by_key(ctx, accessor, alias_name)? {
                let bases: &[&str] = if local {
                    &[LOCAL]
                } else {
                    &[REPLICATED, LOCAL]
                };
                for &b in bases {
                    for k in [
                        entity::alias_key(&old.id),
                        entity::alias_index(accessor, alias_name),
                        entity::entity_alias_index(&old.canonical_id, &old.id),
                    ] {
                        ctx.delete(&format!("{b}{k}"));
                    }
                }
            }
            let a = Alias {
                id: crypto::uuid(ctx.rng()),
                name: alias_name.to_string(),
                canonical_id: e.id.clone(),
                mount_accessor: accessor.to_string(),
                namespace_id: ns_id.clone(),
                creation_time: ctx.now,
                last_update_time: ctx.now,
                local,
            };
            entity::store_alias(ctx, base, &a)?;
            log::info!(
                "identity: login on auth/{} created entity {} for alias {alias_name:?}",
                mount.path,
                e.id
            );
            e.id
        }
    };
    refresh_external(ctx, base, accessor, &ns_id, &entity_id, groups)?;
    let standing = lookup::standing(ctx, &entity_id)?.unwrap_or_default();
    Ok(LoginIdentity {
        entity_id,
        disabled: standing.disabled,
        policies: standing.policies,
    })
}

/// Refreshes the external groups of entity `entity_id` from `groups` (a renewal's fresh
/// look-up of the directory); nothing happens when the entity is gone.
pub fn refresh(
    ctx: &mut Ctx,
    local: bool,
    mount: &MountEntry,
    entity_id: &str,
    groups: &[String],
) -> ApiResult<()> {
    if entity::load(ctx, entity_id)?.is_none() {
        return Ok(());
    }
    let base = if local { LOCAL } else { REPLICATED };
    let ns_id = namespace_id(ctx, &mount.namespace)?;
    refresh_external(ctx, base, &mount.accessor, &ns_id, entity_id, groups)
}

/// Makes the entity a member of exactly the external groups whose alias on `accessor` names
/// one of `groups`, among the external groups aliased on that mount; writes only changes.
fn refresh_external(
    ctx: &mut Ctx,
    base: &str,
    accessor: &str,
    ns_id: &str,
    entity_id: &str,
    groups: &[String],
) -> ApiResult<()> {
    let mut wanted = BTreeSet::new();
    for name in groups {
        if let Some(a) = group::alias_by_key(ctx, accessor, name)? {
            if let Some(g) = group::load(ctx, &a.canonical_id)? {
                if g.kind == EXTERNAL && g.namespace_id == ns_id {
                    wanted.insert(g.id);
                }
            }
        }
    }
    for g in group::of_entity(ctx, entity_id)? {
        if g.kind != EXTERNAL || wanted.contains(&g.id) {
            continue;
        }
        let on_mount = match g.alias_id.as_deref() {
            Some(a) => group::load_alias(ctx, a)?.is_some_and(|a| a.mount_accessor == accessor),
            None => false,
        };
        if on_mount {
            let k = format!("{base}{}", member_key(entity_id, &g.id));
            if ctx.get(&k)?.is_some() {
                ctx.delete(&k);
            }
        }
    }
    for g in wanted {
        let rel = member_key(entity_id, &g);
        if super::get_id(ctx, &rel)?.is_none() {
            put_id(ctx, base, &rel, &g)?;
        }
    }
    Ok(())
}
