//! `args`: LEASE command argument parsing (src/model/args.rs) on arbitrary bytes.
//! Input: one selector byte (parser: ttl, fence, token, ACQUIRE, APPLY),
//! then the arguments separated by NUL bytes. See `lease_fuzz::fuzz_args`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lease_fuzz::fuzz_args(data));
