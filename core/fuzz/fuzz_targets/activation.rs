#![no_main]
//! Fuzz target `activation`: see `cairn_core::fuzzing::activation` for the input format and properties.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_core::fuzzing::activation(data));
