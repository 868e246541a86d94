#![no_main]
//! Fuzz target `peer_msg`: see `cairn_core::fuzzing::peer_msg` for the input format and properties.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_core::fuzzing::peer_msg(data));
