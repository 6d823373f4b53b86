//! Work that runs outside a client's command: the reaper, blocked waiters,
//! eviction handling and server events. It calls the keyspace layer, never
//! the command code.

pub mod armed;
pub mod events;
pub mod eviction;
pub mod migrate;
pub mod reaper;
pub mod waiters;
