#![no_main]
//! Fuzz target `snapshot_file`: see `cairn_core::fuzzing::snapshot_file` for the input format and properties.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_core::fuzzing::snapshot_file(data));
