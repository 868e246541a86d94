#![no_main]
//! Fuzz target `server_config` (the HCL server configuration parser): see `cairn_core::fuzzing::server_config` for the input format and
//! the promises it checks.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_core::fuzzing::server_config(data));
