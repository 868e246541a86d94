//! The LDAP auth method: configuration, user and group mappings, and the login state
//! machine that asks the shell for LDAP operations and is advanced by their results.

use crate::api::{ApiError, ApiResult, Reply, Request};
use crate::ctx::Ctx;
use crate::mounts::MountEntry;
use crate::node::NodeState;
use crate::token::Caller;
use std::collections::BTreeMap;

/// An LDAP operation the node asks the shell to perform.
#[derive(Debug, Clone)]
pub struct LdapCall {
    pub op_id: u64,
}

/// The result of an [`LdapCall`].
#[derive(Debug, Clone)]
pub struct LdapReply {
    pub op_id: u64,
}

/// Logins in progress.
#[derive(Debug, Default)]
pub struct Logins {
    pub active: BTreeMap<u64, ()>,
}

pub fn handle(
    _ctx: &mut Ctx,
    _st: &mut NodeState,
    _req: &Request,
    _m: &MountEntry,
    _rest: &str,
    _caller: Option<&Caller>,
) -> ApiResult {
    Err(ApiError::NotFound(String::new()))
}

pub fn on_reply(
    _ctx: &mut Ctx,
    _st: &mut NodeState,
    _r: LdapReply,
) -> Option<(u64, ApiResult<Reply>)> {
    None
}
