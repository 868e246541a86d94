#![no_main]
//! Fuzz target `ldap_filter`: see `cairn_core::fuzzing::ldap_filter` for the input format and properties.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_core::fuzzing::ldap_filter(data));
