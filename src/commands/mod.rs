//! The LEASE commands, one file each, every one read as parse, open the key,
//! ask the model, commit the change (`keyspace::commit`), reply; and
//! what they share: the panic guard and token redaction around each call,
//! where a call comes from, and the registration (`registry.rs`).
//!
//! Every effect is replicated with absolute values (`LEASE.APPLY key
//! fence:deadline token`, `DEL key`, `LEASE.FENCE resource fence`), or as the call
//! itself where that is already exact (`LEASE.FENCE` without a command, and
//! `LEASE.RELEASE` that deleted the key, which a replica applies as the
//! deletion), so replicas and AOF replay never consult their own clock or
//! random source.

mod acquire;
mod apply;
mod debug;
mod fence;
mod info;
mod inner;
mod registry;
mod release;
mod renew;
pub mod stats;

pub use registry::{register, subscribe_module_changes};

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::raw;

use crate::keyspace::state;
use crate::model::error;
use crate::model::lease::Lease;
use crate::rm::{self, Ctx, Key, RString, Slot};

pub(super) const OK: c_int = raw::REDISMODULE_OK as c_int;

/// A random 128-bit token as 32 lowercase hex characters, from the thread's
/// OS-seeded CSPRNG.
pub(super) fn generate_token() -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits: u128 = rand::random();
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = HEX[((bits >> (124 - 4 * i)) & 0xf) as usize];
    }
    out
}

/// Wraps a command body: a panic becomes an error reply and a log line.
///
/// `secret` names the arguments that carry a token; they are redacted from
/// MONITOR, SLOWLOG and logs once the body is done with it (some servers
/// replace the argument itself, so redacting earlier would hide the token
/// from the command too).
pub(super) fn command(
    name: &str,
    ctx: Ctx,
    argv: *mut RString,
    argc: c_int,
    body: fn(Ctx, &[RString]) -> c_int,
    secret: fn(&[RString]) -> Redact,
) -> c_int {
    rm::guard(
        name,
        || rm::reply_error(ctx, error::INTERNAL),
        || {
            let (status, redact) = {
                // SAFETY: `argv` and `argc` are what Redis passed the command
                // `command` runs for, and the slice ends with this block:
                // `body` and `secret` cannot keep it (their signatures).
                let args = unsafe { rm::args(argv, argc) };
                (body(ctx, args), secret(args))
            };
            // A redaction replaces the server's argument in place: done
            // once no slice of the arguments is borrowed.
            redact.each(|pos| rm::redact(ctx, pos));
            status
        },
    )
}

/// The arguments to redact, found while the arguments are borrowed: one
/// position in the usual case (nothing to allocate, nothing to iterate).
pub(super) enum Redact {
    Nothing,
    One(usize),
    From(usize, usize),
    Several(Vec<usize>),
}

impl Redact {
    fn each(self, mut redact: impl FnMut(usize)) {
        match self {
            Redact::Nothing => {}
            Redact::One(pos) => redact(pos),
            Redact::From(start, end) => (start..end).for_each(redact),
            Redact::Several(all) => all.into_iter().for_each(redact),
        }
    }
}

pub(super) fn no_secret(_: &[RString]) -> Redact {
    Redact::Nothing
}

/// RENEW and RELEASE: `key token ...`.
pub(super) fn second_argument(args: &[RString]) -> Redact {
    if args.len() > 2 {
        Redact::One(2)
    } else {
        Redact::Nothing
    }
}

/// ACQUIRE: every argument after a `TOKEN`, also in a call refused for
/// its syntax.
pub(super) fn token_option(args: &[RString]) -> Redact {
    let mut tokens = (3..args.len().saturating_sub(1))
        .filter(|&i| rm::bytes(&args[i]).eq_ignore_ascii_case(b"TOKEN"))
        .map(|i| i + 1);
    match (tokens.next(), tokens.next()) {
        (None, _) => Redact::Nothing,
        (Some(pos), None) => Redact::One(pos),
        // Only a call refused for its syntax repeats TOKEN.
        (Some(first), Some(second)) => {
            Redact::Several([first, second].into_iter().chain(tokens).collect())
        }
    }
}

/// FENCE: a nested LEASE command (refused) may carry a token anywhere.
pub(super) fn nested_lease_command(args: &[RString]) -> Redact {
    let nested = args.get(3).is_some_and(|c| {
        let name = rm::bytes(c);
        name.len() > 6 && name[..6].eq_ignore_ascii_case(b"lease.")
    });
    if nested {
        Redact::From(4, args.len())
    } else {
        Redact::Nothing
    }
}

/// The lease in an open key: `None` for an empty key, an error for a key of
/// another type.
pub(super) fn lease_in(key: &mut Key) -> Result<Option<&mut Lease>, &'static CStr> {
    match key.value::<Lease>() {
        Slot::WrongType => Err(error::WRONGTYPE),
        Slot::Empty => Ok(None),
        Slot::Ours(lease) => Ok(Some(lease)),
    }
}

/// Where the running command comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    /// A client: this node decides.
    Client,
    /// This node's master, or the AOF replay: an effect decided elsewhere.
    Master,
    /// The import client of an atomic slot migration into this primary
    /// (Valkey 9): the source's effects, for keys of slots not yet this
    /// node's.
    SlotImport,
}

/// A primary has no master, so there, outside slot imports, only the AOF
/// client's id is checked; the context flags, which compute every flag to
/// answer one, are asked on replicas and while slots are imported (the
/// import client is the only one a primary sees as replicated).
pub(super) fn origin(ctx: Ctx) -> Origin {
    if rm::replaying_aof(ctx) {
        return Origin::Master;
    }
    let primary = state::is_primary();
    if primary && !state::importing_slots() {
        return Origin::Client;
    }
    if rm::context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_REPLICATED == 0 {
        Origin::Client
    } else if primary {
        Origin::SlotImport
    } else {
        Origin::Master
    }
}

/// Whether the running command is an effect decided elsewhere.
pub(super) fn from_master_or_aof(ctx: Ctx) -> bool {
    origin(ctx) != Origin::Client
}

/// Whether this node may decide a write: a primary, or a replica applying
/// what its master or the AOF says. A writable replica
/// (`replica-read-only no`) takes other writes to its own keys, never to
/// leases: a grant there would be a second holder nobody else sees.
pub(super) fn writable(ctx: Ctx) -> bool {
    state::is_primary() || from_master_or_aof(ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_are_32_hex_and_differ() {
        let a = generate_token();
        let b = generate_token();
        assert!(a
            .iter()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }
}
