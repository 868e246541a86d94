#![no_main]
//! Fuzz target `router`: see `cairn_core::fuzzing::router` for the input format and properties.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_core::fuzzing::router(data));
