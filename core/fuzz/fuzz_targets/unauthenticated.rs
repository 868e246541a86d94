#![no_main]
//! Fuzz target `unauthenticated`: see `cairn_core::isolation::fuzz_unauthenticated` for the input format and the
//! promise it checks.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_core::isolation::fuzz_unauthenticated(data));
