#![no_main]
//! Fuzz target `kv2_bodies` (KV version 2 requests and bodies): see `cairn_core::fuzzing::kv2_bodies` for the input format and
//! the promises it checks.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_core::fuzzing::kv2_bodies(data));
