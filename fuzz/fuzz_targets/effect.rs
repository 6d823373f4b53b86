//! `effect`: `LEASE.APPLY`'s forms decoded from arbitrary arguments must encode and
//! decode back to themselves (model/src/effect.rs). Input: the arguments after the
//! key, separated by NUL bytes. See `lease_fuzz::fuzz_effect`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lease_fuzz::fuzz_effect(data));
