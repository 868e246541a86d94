#![no_main]
//! Fuzz target `policy`: see `cairn_core::fuzzing::policy` for the input format and properties.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_core::fuzzing::policy(data));
