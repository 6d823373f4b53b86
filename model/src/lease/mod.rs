//! The lease: its state machine, the fence sequence, the stored form of its
//! token and holds, the wait queues and the fence record.
//!
//! Pure logic: time comes in as `now_ms` (unix milliseconds) and nothing here
//! touches Redis, so every rule is unit-tested on an injected clock. The
//! commands open keys, call these methods, and hand what changed to the
//! keyspace's `commit`.
//!
//! By concern, each with its tests:
//! - `fence.rs`: the node-wide fence sequence and the bounds of a fence;
//! - `token.rs`: a token's stored forms and `tokens_equal`;
//! - `packed.rs`: the 32-byte `Lease` value, the one file with `unsafe`;
//! - `machine.rs`: acquire, renew, release, prune, and a master's effects;
//! - `view.rs`: what a caller may read of a lease (never the token);
//! - `queue.rs`: the clients blocked on a key name;
//! - `resource.rs`: the highest fence a resource accepted.

mod fence;
mod machine;
mod packed;
mod queue;
mod resource;
mod token;
mod view;

pub use fence::{FenceExhausted, FenceSequence, FENCES_PER_MS, FENCE_LIMIT, MAX_AHEAD};
pub use machine::{Acquire, Renew, Replaced, Request};
pub use packed::Lease;
pub use queue::WaitQueues;
pub use resource::{Resource, Stale};
pub use token::{tokens_equal, Holder, HolderRef, Token, MAX_TOKEN_LEN};
pub use view::{LiveHold, NotSession, Persisted, State, View};

/// Longest lease a caller may ask for, in milliseconds (about 34 years).
pub const MAX_TTL_MS: u64 = 1 << 40;
/// Deadlines are unix milliseconds; anything past this is corrupt input.
pub const MAX_DEADLINE_MS: u64 = FENCE_LIMIT / FENCES_PER_MS + MAX_TTL_MS;

#[cfg(test)]
mod testing;
