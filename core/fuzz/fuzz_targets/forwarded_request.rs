#![no_main]
//! Fuzz target `forwarded_request` (HA forwarded requests on the wire and at the active node): see `cairn_core::fuzzing::forwarded_request` for the input format and
//! the promises it checks.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_core::fuzzing::forwarded_request(data));
