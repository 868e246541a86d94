#![no_main]
//! Fuzz target `json_bodies`: see `cairn_core::fuzzing::json_bodies` for the input format and properties.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_core::fuzzing::json_bodies(data));
