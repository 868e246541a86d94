#![no_main]
//! Fuzz target `shamir`: see `cairn_core::fuzzing::shamir` for the input format and properties.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_core::fuzzing::shamir(data));
