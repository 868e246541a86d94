#![no_main]
//! Fuzz target `namespace_isolation`: see `cairn_core::isolation::fuzz_namespace_isolation` for the input format and the
//! promise it checks.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_core::isolation::fuzz_namespace_isolation(data));
