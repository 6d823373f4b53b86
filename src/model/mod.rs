//! The pure model: the lease state machine and fence sequence, the wait
//! queues, the deadline index, argument parsing, persisted-value decoding,
//! error replies and configs. No `redis_module` import: time comes in as
//! `now_ms`, and every rule is unit-tested beside its code.

pub mod args;
pub mod check;
pub mod config;
pub mod encoding;
pub mod error;
pub mod holds;
pub mod index;
pub mod lease;
pub mod migrate;
pub mod notifications;
pub mod sessions;
