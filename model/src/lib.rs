//! The pure model of redis-lease: the lease state machine and fence
//! sequence, the wait queues, the deadline index, argument parsing,
//! persisted-value decoding (and, for tests and fuzzing, the bytes Redis
//! writes for a module value), error replies and configs. A crate of its
//! own with no dependency: time comes in as `now_ms`, every rule is
//! unit-tested beside its code, and the module, the fuzz targets and the
//! benches all use it the same way.

pub mod args;
pub mod change;
pub mod check;
pub mod config;
pub mod effect;
pub mod encoding;
pub mod error;
pub mod holds;
pub mod index;
pub mod lease;
pub mod migrate;
pub mod notifications;
pub mod rdb;
pub mod sessions;
pub mod table;
#[cfg(test)]
mod testing;
