//! The keyspace: the module types (RDB, AOF, copy, free, unlink), the
//! node-wide state beside them (fence sequence, deadline index, waiters,
//! role, counters), and the one place that carries out the effects of a
//! state change: index, replicate, notify, wake waiters. Commands and
//! background work call down into it; it calls nothing above it. And what
//! `LEASE.DEBUG CHECK` reads of all this (`audit.rs`).

pub mod audit;
pub mod cluster;
pub mod commit;
pub mod removals;
pub mod sessions;
pub mod state;
pub mod types;
pub mod unlinked;
pub mod wake;
pub mod wire;
