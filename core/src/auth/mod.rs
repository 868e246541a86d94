//! Auth methods other than tokens.
pub mod ldap;
