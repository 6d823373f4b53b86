//! `args`: LEASE command argument parsing (model/src/args.rs) on arbitrary bytes,
//! and what a parsed command does to a lease (model/src/lease/, holds.rs).
//! Input: one selector byte (ttl, fence, token and OWNER label, ACQUIRE with every
//! version 2 option, APPLY in its whole-state / HOLD / DROP / DELAY forms), then the
//! arguments separated by NUL bytes. See `lease_fuzz::fuzz_args`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lease_fuzz::fuzz_args(data));
