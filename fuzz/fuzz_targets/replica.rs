//! `replica`: the replication contract without a server. Operations on a primary's
//! lease, their replication applied to a replica's through the wire encoding; both
//! must hold the same lease after every step. See `lease_fuzz::fuzz_replica`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lease_fuzz::fuzz_replica(data));
