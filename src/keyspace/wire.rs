//! Effects on the wire: `LEASE.APPLY key ...` written for an `Effect`
//! (`model::effect` makes the arguments), to the replication stream or to
//! an AOF rewrite. The one place an effect becomes a command.

use redis_module::raw;

use crate::model::effect::{Arg, Effect};
use crate::rm::{self, api, Ctx, OwnedString, RString};

/// A holder's token as `LEASE.APPLY` carries it: the client's own argument
/// where the token came from one (passed on as is, no copy), else its bytes.
#[derive(Clone, Copy)]
pub enum Wire<'a> {
    Arg(RString),
    Bytes(&'a [u8]),
}

impl AsRef<[u8]> for Wire<'_> {
    fn as_ref(&self) -> &[u8] {
        match self {
            Wire::Arg(arg) => rm::bytes(arg),
            Wire::Bytes(b) => b,
        }
    }
}

/// A token an effect can carry: bytes, or the client's module string.
pub trait WireToken: AsRef<[u8]> {
    /// The token as a module string of the command's, when it is one.
    fn arg(&self) -> Option<RString> {
        None
    }
}

impl WireToken for Wire<'_> {
    fn arg(&self) -> Option<RString> {
        match self {
            Wire::Arg(arg) => Some(*arg),
            Wire::Bytes(_) => None,
        }
    }
}

impl WireToken for &[u8] {}

/// Where an effect is written: the command's replication stream (replicas
/// and the AOF), or an AOF rewrite.
#[derive(Clone, Copy)]
pub enum Sink {
    Replicate(Ctx),
    Rewrite(*mut raw::RedisModuleIO),
}

/// Writes `LEASE.APPLY key ...` for `effect`: the one place an effect
/// becomes a command (`Effect::encode` makes its arguments).
#[inline(always)]
pub fn send<T: WireToken>(sink: Sink, key: RString, effect: &Effect<'_, T>) {
    effect.encode(|parts| match parts {
        [state, token] => send_two(sink, key, state, token),
        parts => send_many(sink, key, parts),
    })
}

/// The common case, two arguments after the key (`sbb`, or `sbs` for the
/// client's own token): no module string is made here.
#[inline(always)]
fn send_two<T: WireToken>(sink: Sink, key: RString, state: &Arg<'_, T>, token: &Arg<'_, T>) {
    let apply = c"LEASE.APPLY".as_ptr();
    let state = state.bytes();
    let (s, sl) = (state.as_ptr(), state.len());
    let arg = match token {
        Arg::Token(t) => t.arg(),
        Arg::Text(_) => None,
    };
    let token = token.bytes();
    let (t, tl) = (token.as_ptr(), token.len());
    // SAFETY: `key` and an argument token are valid by the handle rule, a
    // `Replicate` context is the command's, a `Rewrite` handle the one Redis
    // passed aof_rewrite; each format matches its arguments (`s`: a module
    // string, `b`: a pointer and a length, live for the call, which copies
    // them).
    unsafe {
        match (sink, arg) {
            (Sink::Replicate(ctx), Some(arg)) => {
                api!(RedisModule_Replicate)(ctx, apply, c"sbs".as_ptr(), key, s, sl, arg)
            }
            (Sink::Replicate(ctx), None) => {
                api!(RedisModule_Replicate)(ctx, apply, c"sbb".as_ptr(), key, s, sl, t, tl)
            }
            (Sink::Rewrite(aof), _) => {
                api!(RedisModule_EmitAOF)(aof, apply, c"sbb".as_ptr(), key, s, sl, t, tl);
                0
            }
        }
    };
}

/// Any number of arguments after the key (`DROP token ...`), each a module
/// string.
fn send_many<T: WireToken>(sink: Sink, key: RString, parts: &[Arg<'_, T>]) {
    let Sink::Replicate(ctx) = sink else {
        // An AOF rewrite writes whole leases, two arguments an effect.
        debug_assert!(false, "a rewrite writes no {}-argument effect", parts.len());
        return;
    };
    // The strings made here live to the end of the call (moving an
    // `OwnedString` leaves the string it owns where it is).
    let mut made = Vec::with_capacity(parts.len());
    let mut argv: Vec<RString> = Vec::with_capacity(parts.len() + 1);
    argv.push(key);
    for part in parts {
        let arg = match part {
            Arg::Token(t) => t.arg(),
            Arg::Text(_) => None,
        };
        argv.push(arg.unwrap_or_else(|| {
            let string = OwnedString::new(ctx, part.bytes());
            let ptr = string.as_ptr();
            made.push(string);
            ptr
        }));
    }
    // SAFETY: `ctx` is valid by the handle rule; the format `v` takes an
    // array of module strings and its length, all live for the call
    // (`made` outlives it).
    unsafe {
        api!(RedisModule_Replicate)(
            ctx,
            c"LEASE.APPLY".as_ptr(),
            c"v".as_ptr(),
            argv.as_ptr(),
            argv.len(),
        )
    };
}

/// A resource record's highest fence as `LEASE.FENCE resource highest`: to
/// replicas, or into an AOF rewrite. The one writer of the record's form.
pub fn send_record(sink: Sink, resource: RString, highest: u64) {
    let (name, format) = (c"LEASE.FENCE".as_ptr(), c"sl".as_ptr());
    // SAFETY: `resource` is valid by the handle rule, a `Replicate` context
    // the caller's, a `Rewrite` handle the one Redis passed aof_rewrite; the
    // format `sl` takes the module string and the i64 passed.
    unsafe {
        match sink {
            Sink::Replicate(ctx) => {
                api!(RedisModule_Replicate)(ctx, name, format, resource, highest as i64);
            }
            Sink::Rewrite(aof) => {
                api!(RedisModule_EmitAOF)(aof, name, format, resource, highest as i64);
            }
        }
    }
}
