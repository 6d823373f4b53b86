//! `decode`: the decoding of persisted lease-key, fence-rec and fence
//! sequence values (model/src/encoding.rs, encodings 1 to 3) from a hostile
//! RDB / DUMP payload. Input: one byte of encoding version, then a module
//! value as Redis serializes it. See `lease_fuzz::fuzz_decode` and
//! `lease_fuzz::reader`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lease_fuzz::fuzz_decode(data));
