//! LDAP operations executed for the core on a thread pool (placeholder until the executor lands).

use cairn_core::auth::ldap::{LdapCall, LdapReply};

pub struct LdapPool {
    _deliver: Box<dyn Fn(LdapReply) + Send + Sync>,
}

impl LdapPool {
    pub fn new(_threads: usize, deliver: Box<dyn Fn(LdapReply) + Send + Sync>) -> Self {
        LdapPool { _deliver: deliver }
    }
    pub fn submit(&self, call: LdapCall) {
        (self._deliver)(LdapReply { op_id: call.op_id });
    }
}
