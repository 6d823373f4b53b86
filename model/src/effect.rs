//! What a primary tells its replicas and its AOF: every form of
//! `LEASE.APPLY key ...`, as one type with one encoding and one decoding.
//!
//! Replication, the AOF rewrite, `DEBUG DIGEST` and the replica's
//! `LEASE.APPLY` all go through `Effect::encode` and `Effect::decode`, so a
//! form is written in one place and read in one place. Every number is
//! absolute (a fence, a unix-ms deadline), so replicas and AOF replay never
//! consult their own clock or random source.
//!
//! The forms, after the key:
//! - `fence:deadline token`: a compact lease's whole state, an empty token
//!   meaning free; it also ends any extended holds. Earlier versions wrote
//!   `fence deadline token`, which is still read.
//! - `state token`, the state a hold's (`args::hold_state`, seven colons):
//!   one hold of an extended lease (an exclusive one is the only hold);
//! - `DROP token [token ...]`: these holds of an extended lease are gone;
//! - `DELAY until`: no grant on the key before `until`.
//!
//! An effect is generic in its token: the module replicates the client's
//! own argument where it has one (no copy), a replica decodes into owned
//! bytes, and the tests use plain vectors.

use std::borrow::Cow;
use std::ffi::CStr;

use crate::args;
use crate::change::{bindings, Change, Replicate};
use crate::error;
use crate::holds::{Binding, Grant, Mode};
use crate::lease::{Holder, Lease, MAX_DEADLINE_MS};

/// One `LEASE.APPLY` form.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect<'a, T> {
    /// A compact lease's whole state: its fence and its holder (deadline
    /// and token), or none.
    Whole {
        fence: u64,
        holder: Option<(u64, T)>,
    },
    /// One hold of an extended lease, and the key's terms.
    Hold {
        token: T,
        grant: Cow<'a, Grant>,
        mode: Mode,
        limit: Option<u32>,
    },
    /// Holds of an extended lease gone; the key stays.
    Drop(Vec<T>),
    /// No grant on the key before this unix-ms time.
    Delay(u64),
}

/// One argument of an encoded effect: text the encoding made, or a token
/// as the effect holds it.
#[derive(Debug)]
pub enum Arg<'e, T> {
    Text(&'e [u8]),
    Token(&'e T),
}

impl<T: AsRef<[u8]>> Arg<'_, T> {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Arg::Text(b) => b,
            Arg::Token(t) => t.as_ref(),
        }
    }
}

/// A decoded effect: tokens owned, the grant owned.
pub type Decoded = Effect<'static, Box<[u8]>>;

impl<T: AsRef<[u8]>> Effect<'_, T> {
    /// Hands `emit` the effect's arguments after the key. Built on the
    /// stack where the form allows (a whole state, a delay): every
    /// argument of a replicated call is an allocation of its own on the
    /// server, so none is made here that the server does not need.
    #[inline(always)]
    pub fn encode<R>(&self, emit: impl FnOnce(&[Arg<'_, T>]) -> R) -> R {
        match self {
            Effect::Whole { fence, holder } => {
                let mut buf = [0u8; args::STATE_LEN];
                let deadline = holder.as_ref().map_or(0, |(d, _)| *d);
                let state = args::apply_state(*fence, deadline, &mut buf);
                match holder {
                    Some((_, token)) => emit(&[Arg::Text(state), Arg::Token(token)]),
                    None => emit(&[Arg::Text(state), Arg::Text(b"")]),
                }
            }
            Effect::Hold {
                token,
                grant,
                mode,
                limit,
            } => {
                let state = args::hold_state(grant, *mode, *limit);
                emit(&[Arg::Text(&state), Arg::Token(token)])
            }
            Effect::Drop(tokens) => {
                let mut all = Vec::with_capacity(tokens.len() + 1);
                all.push(Arg::Text(b"DROP"));
                all.extend(tokens.iter().map(Arg::Token));
                emit(&all)
            }
            Effect::Delay(until) => {
                let mut buf = [0u8; args::DECIMAL_LEN];
                emit(&[
                    Arg::Text(b"DELAY"),
                    Arg::Text(args::decimal(*until, &mut buf)),
                ])
            }
        }
    }

    /// The effect's arguments after the key, as owned bytes (tests, fuzzing).
    pub fn to_args(&self) -> Vec<Vec<u8>> {
        self.encode(|parts| parts.iter().map(|p| p.bytes().to_vec()).collect())
    }
}

impl Effect<'static, Box<[u8]>> {
    /// Reads the arguments after the key; anything no build of the module
    /// writes is refused (`error::APPLY_ARGS`).
    pub fn decode(parts: &[&[u8]]) -> Result<Decoded, &'static CStr> {
        let Some(&form) = parts.first() else {
            return Err(error::APPLY_ARGS);
        };
        if parts.len() == 2 && args::is_hold_state(form) {
            let (token, grant, mode, limit) = args::parse_hold_args(parts, |p| p)?;
            return Ok(Effect::Hold {
                token,
                grant: Cow::Owned(grant),
                mode,
                limit,
            });
        }
        if form.eq_ignore_ascii_case(b"DROP") {
            return match &parts[1..] {
                [] => Err(error::APPLY_ARGS),
                tokens => Ok(Effect::Drop(tokens.iter().map(|&t| t.into()).collect())),
            };
        }
        if form.eq_ignore_ascii_case(b"DELAY") {
            return match parts {
                [_, until] => args::parse_u64(until)
                    .filter(|&u| u <= MAX_DEADLINE_MS)
                    .map(Effect::Delay)
                    .ok_or(error::APPLY_ARGS),
                _ => Err(error::APPLY_ARGS),
            };
        }
        let (fence, holder) = args::parse_apply_args(parts, |p| p)?;
        Ok(Effect::Whole {
            fence,
            holder: holder.map(|h| (h.deadline_ms, h.token)),
        })
    }
}

impl<T> Effect<'_, T> {
    /// The fence the effect carries, which a replica's fence sequence
    /// observes: a whole state's, a hold's grant's.
    pub fn fence(&self) -> Option<u64> {
        match self {
            Effect::Whole { fence, .. } => Some(*fence),
            Effect::Hold { grant, .. } => Some(grant.fence),
            Effect::Drop(_) | Effect::Delay(_) => None,
        }
    }
}

/// What replicates one token's hold after a grant or a renewal.
pub enum Held<'l, T> {
    /// The one effect: the hold of an extended lease, or a compact
    /// lease's whole state with this token as its holder.
    One(Effect<'l, T>),
    /// The lease's whole state (`whole`): a compact lease without a
    /// deadline.
    Whole,
    /// The token holds nothing on the lease: nothing to replicate.
    Nothing,
}

/// The effect that replicates `token`'s hold on `lease`.
#[inline(always)]
pub fn held<T: AsRef<[u8]>>(lease: &Lease, token: T) -> Held<'_, T> {
    if let Some(holds) = lease.extended() {
        return match holds.get(token.as_ref()) {
            Some(grant) => Held::One(Effect::Hold {
                token,
                grant: Cow::Borrowed(grant),
                mode: holds.mode(),
                limit: holds.limit(),
            }),
            None => Held::Nothing,
        };
    }
    match lease.deadline() {
        Some(deadline) => Held::One(Effect::Whole {
            fence: lease.fence(),
            holder: Some((deadline, token)),
        }),
        None => Held::Whole,
    }
}

/// A lease's whole state as effects, in the order a fresh key must apply
/// them: the compact state (for an extended lease, its fence, free), then
/// each hold, oldest grant first, then its lock-delay. Replicating a whole
/// lease, the AOF rewrite and the digest all use it.
pub fn whole(lease: &Lease, mut each: impl FnMut(&Effect<'_, &[u8]>)) {
    let (deadline, token) = lease.persisted_holder();
    let holder = (!token.is_empty()).then_some((deadline, &*token));
    each(&Effect::Whole {
        fence: lease.fence(),
        holder,
    });
    let Some(persisted) = lease.persisted_holds() else {
        return;
    };
    for hold in &persisted.holds {
        each(&Effect::Hold {
            token: &hold.token,
            grant: Cow::Borrowed(&hold.grant),
            mode: persisted.mode,
            limit: persisted.limit,
        });
    }
    if persisted.delayed_until != 0 {
        each(&Effect::Delay(persisted.delayed_until));
    }
}

/// What the commit path writes for a change's `Replicate`.
pub enum Emitted<'l, T> {
    /// An effect naming the operation's token.
    Token(Effect<'l, T>),
    /// An effect of the stored lease (its whole state).
    Stored(&'l Effect<'l, &'l [u8]>),
    /// The client's command itself.
    Verbatim,
    /// The key's deletion (`DEL`).
    Deleted,
}

/// Hands `emit` what replicates `change` of `lease`, made by an operation
/// with `token`, as its `replicate` says: the one mapping from a change to
/// the wire, which the commit path and the replication fuzz target share.
#[inline(always)]
pub fn replicated<'l, T: AsRef<[u8]>>(
    change: &'l Change,
    lease: Option<&'l Lease>,
    token: Option<T>,
    mut emit: impl FnMut(Emitted<'_, T>),
) {
    match (&change.replicate, lease, token) {
        (Replicate::Nothing, ..) => {}
        (Replicate::Verbatim, ..) => emit(Emitted::Verbatim),
        (Replicate::Deleted, ..) => emit(Emitted::Deleted),
        (Replicate::Held, Some(lease), Some(token)) => match held(lease, token) {
            Held::One(e) => emit(Emitted::Token(e)),
            Held::Whole => whole(lease, |e| emit(Emitted::Stored(e))),
            Held::Nothing => {}
        },
        (Replicate::Whole, Some(lease), _) => whole(lease, |e| emit(Emitted::Stored(e))),
        (Replicate::DropToken, _, Some(token)) => emit(Emitted::Token(Effect::Drop(vec![token]))),
        (Replicate::Pruned, ..) => {
            let Some(ended) = change.ended.as_deref() else {
                return;
            };
            if !ended.dropped.is_empty() {
                let tokens = ended.dropped.iter().map(|t| &t[..]).collect();
                emit(Emitted::Stored(&Effect::Drop(tokens)));
            }
            if let Some(until) = ended.delay {
                emit(Emitted::Stored(&Effect::Delay(until)));
            }
        }
        (Replicate::Held | Replicate::Whole | Replicate::DropToken, ..) => {
            debug_assert!(
                false,
                "{:?} without the lease or the token it names",
                change.replicate
            );
        }
    }
}

/// What applying an effect did to the session index's entries.
#[derive(Debug, Default)]
pub struct Applied {
    /// Bindings of the holds it replaced or dropped.
    pub unbound: Vec<Binding>,
    /// The binding of the hold it set.
    pub bound: Option<Binding>,
}

/// A master's or the AOF's effect on `lease` (a replica's `LEASE.APPLY`).
pub fn apply(lease: &mut Lease, effect: Decoded) -> Applied {
    match effect {
        Effect::Whole { fence, holder } => {
            let unbound = lease.bindings();
            lease.apply(
                holder.map(|(deadline_ms, token)| Holder { token, deadline_ms }),
                fence,
            );
            Applied {
                unbound,
                bound: None,
            }
        }
        Effect::Hold {
            token,
            grant,
            mode,
            limit,
        } => {
            let grant = grant.into_owned();
            let bound = grant.session().cloned();
            let unbound = bindings(&lease.apply_hold(&token, grant, mode, limit));
            Applied { unbound, bound }
        }
        Effect::Drop(tokens) => Applied {
            unbound: bindings(&lease.apply_drop(tokens.iter().map(|t| &**t))),
            bound: None,
        },
        Effect::Delay(until) => {
            lease.apply_delay(until);
            Applied::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::holds::Binding;
    use crate::testing::Gen;

    fn grant(g: &mut Gen, mode: Mode) -> Grant {
        let fence = g.number(crate::lease::FENCE_LIMIT - 1);
        let session = (g.below(2) == 0).then(|| Binding {
            key: g.bytes(1, 40, false).into(),
            fence: g.number(crate::lease::FENCE_LIMIT - 1),
        });
        let deadline = match (&session, g.below(2)) {
            (Some(_), 0) => crate::holds::NO_DEADLINE,
            _ => g.number(MAX_DEADLINE_MS),
        };
        let owner = (g.below(2) == 0).then(|| g.bytes(1, 128, true).into());
        let delay = match mode {
            Mode::Exclusive if g.below(2) == 0 => g.number(crate::lease::MAX_TTL_MS),
            _ => 0,
        };
        Grant::with(fence, deadline, owner, session, delay)
    }

    fn token(g: &mut Gen) -> Vec<u8> {
        g.bytes(1, crate::lease::MAX_TOKEN_LEN, false)
    }

    fn effect(g: &mut Gen) -> Effect<'static, Vec<u8>> {
        match g.below(4) {
            0 => Effect::Whole {
                fence: g.below(crate::lease::FENCE_LIMIT),
                holder: (g.below(3) > 0).then(|| (g.number(MAX_DEADLINE_MS), token(g))),
            },
            1 => {
                let mode = match g.below(2) {
                    0 => Mode::Exclusive,
                    _ => Mode::Shared,
                };
                let limit = match mode {
                    Mode::Shared if g.below(2) == 0 => {
                        Some(g.number(crate::holds::MAX_LIMIT) as u32)
                    }
                    _ => None,
                };
                Effect::Hold {
                    token: token(g),
                    grant: Cow::Owned(grant(g, mode)),
                    mode,
                    limit,
                }
            }
            2 => Effect::Drop((0..1 + g.below(5)).map(|_| token(g)).collect()),
            _ => Effect::Delay(g.number(MAX_DEADLINE_MS)),
        }
    }

    fn decoded(args: &[Vec<u8>]) -> Result<Decoded, &'static CStr> {
        let parts: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        Effect::decode(&parts)
    }

    fn boxed(e: &Effect<'_, Vec<u8>>) -> Decoded {
        match e {
            Effect::Whole { fence, holder } => Effect::Whole {
                fence: *fence,
                holder: holder.as_ref().map(|(d, t)| (*d, t.clone().into())),
            },
            Effect::Hold {
                token,
                grant,
                mode,
                limit,
            } => Effect::Hold {
                token: token.clone().into(),
                grant: Cow::Owned(grant.as_ref().clone()),
                mode: *mode,
                limit: *limit,
            },
            Effect::Drop(tokens) => Effect::Drop(tokens.iter().map(|t| t.clone().into()).collect()),
            Effect::Delay(u) => Effect::Delay(*u),
        }
    }

    #[test]
    fn every_effect_decodes_to_itself() {
        for seed in 1..=20_000u64 {
            let mut g = Gen(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let e = effect(&mut g);
            let args = e.to_args();
            assert_eq!(decoded(&args), Ok(boxed(&e)), "seed {seed}: {args:?}");
        }
    }

    #[test]
    fn what_no_build_writes_is_refused() {
        let refused: [&[&[u8]]; 8] = [
            &[],
            &[b"DROP"],
            &[b"DELAY"],
            &[b"DELAY", b"1", b"2"],
            &[b"DELAY", b"-1"],
            &[b"1:2"],
            &[b"1:0", b"tok"],
            &[b"1:2:Q:0:0:0:0:", b"tok"],
        ];
        for parts in refused {
            assert_eq!(Effect::decode(parts), Err(error::APPLY_ARGS), "{parts:?}");
        }
    }

    #[test]
    fn the_older_three_argument_form_is_read() {
        let e = Effect::decode(&[b"7", b"1000", b"tok"]).unwrap();
        assert_eq!(
            e,
            Effect::Whole {
                fence: 7,
                holder: Some((1000, b"tok"[..].into()))
            }
        );
        // Written back in today's form.
        assert_eq!(e.to_args(), [b"7:1000".to_vec(), b"tok".to_vec()]);
    }

    #[test]
    fn a_whole_lease_is_its_effects_in_order() {
        let mut lease = Lease::default();
        lease.apply_hold(
            b"a",
            Grant::with(3, 5_000, None, None, 0),
            Mode::Shared,
            Some(2),
        );
        lease.apply_hold(
            b"b",
            Grant::with(4, 6_000, None, None, 0),
            Mode::Shared,
            Some(2),
        );
        let mut seen = Vec::new();
        whole(&lease, |e| seen.push(e.to_args()));
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert_eq!(seen[0][1], b"", "an extended lease's compact state is free");
        assert_eq!(seen[1][1], b"a");
        assert_eq!(seen[2][1], b"b");
        // Applied in that order to a fresh lease, they give the same lease.
        let mut copy = Lease::default();
        for args in &seen {
            match decoded(args).unwrap() {
                Effect::Whole { fence, holder } => copy.apply(
                    holder.map(|(deadline_ms, token)| crate::lease::Holder { token, deadline_ms }),
                    fence,
                ),
                Effect::Hold {
                    token,
                    grant,
                    mode,
                    limit,
                } => {
                    copy.apply_hold(&token, grant.into_owned(), mode, limit);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        let mut again = Vec::new();
        whole(&copy, |e| again.push(e.to_args()));
        assert_eq!(again, seen);
    }
}
