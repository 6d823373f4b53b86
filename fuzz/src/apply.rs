//! `LEASE.APPLY key ...`, a master's or the AOF's effect, in its four forms
//! (chosen as `src/commands/apply.rs` chooses them, on the first argument
//! after the key):
//! - `state token` with a hold's state `fence:deadline:mode:limit:delay:
//!   session_fence:owner_len:` then the owner and the session key
//!   (`args::parse_hold_args`, written by `args::hold_state`);
//! - `DROP token [token ...]` (`Lease::apply_drop`);
//! - `DELAY until` (`Lease::apply_delay`);
//! - otherwise `fence:deadline token` or `fence deadline token`
//!   (`args::parse_apply_args`, `Lease::apply`).

use crate::holds::{Grant, Hold, Mode, Refused, Unbound, MAX_LIMIT, NO_DEADLINE};
use crate::lease::{
    Acquire, FenceSequence, Holder, Lease, Persisted, Request, State, FENCES_PER_MS, FENCE_LIMIT,
    MAX_DEADLINE_MS, MAX_TOKEN_LEN, MAX_TTL_MS,
};
use crate::{
    args, check_views, error, reference_owner, reference_token, reference_u64, round_trip,
    DECODE_NOW, NOW,
};

pub(crate) fn check_apply(argv: &[&[u8]]) {
    match argv {
        [state, _] if args::is_hold_state(state) => check_hold(argv),
        [form, rest @ ..] if form.eq_ignore_ascii_case(b"DROP") && !rest.is_empty() => {
            check_drop(rest)
        }
        [form, rest @ ..] if form.eq_ignore_ascii_case(b"DELAY") => check_delay(rest),
        _ => check_whole(argv),
    }
}

/// `a:b` at its first colon.
fn halves(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut parts = b.splitn(2, |&c| c == b':');
    Some((parts.next()?, parts.next()?))
}

/// A HOLD effect as it must parse.
#[derive(Debug, PartialEq, Eq)]
struct ExpectedHold<'a> {
    token: &'a [u8],
    fence: u64,
    /// `NO_DEADLINE` for a bound hold with a deadline of 0.
    deadline_ms: u64,
    mode: Mode,
    limit: Option<u32>,
    delay_ms: u64,
    owner: Option<&'a [u8]>,
    /// The session's fence and key.
    session: Option<(u64, &'a [u8])>,
}

/// What `HOLD state token` must parse to, written apart from
/// `args::parse_hold_args`: the state's seven numbers and mode found by
/// walking its colons, then the owner's length of bytes, then the session
/// key; every refusal is the one APPLY_ARGS error, so no order matters.
fn reference_hold<'a>(argv: &[&'a [u8]]) -> Option<ExpectedHold<'a>> {
    let [state, token] = argv else {
        return None;
    };
    let mut fields: Vec<&'a [u8]> = Vec::new();
    let mut from = 0;
    for (i, &c) in state.iter().enumerate() {
        if c == b':' && fields.len() < 7 {
            fields.push(&state[from..i]);
            from = i + 1;
        }
    }
    if fields.len() < 7 {
        return None;
    }
    let rest = &state[from..];
    let n = |i: usize| reference_u64(fields[i]);
    let fence = n(0).filter(|&f| f > 0 && f < FENCE_LIMIT)?;
    let deadline = n(1).filter(|&d| d <= MAX_DEADLINE_MS)?;
    let mode = match fields[2] {
        b"X" => Mode::Exclusive,
        b"S" => Mode::Shared,
        _ => return None,
    };
    let limit = n(3).filter(|&l| l <= MAX_LIMIT)?;
    let delay_ms = n(4).filter(|&d| d <= MAX_TTL_MS)?;
    let session_fence = n(5).filter(|&f| f < FENCE_LIMIT)?;
    let owner_len = n(6).filter(|&l| l <= rest.len() as u64)? as usize;
    let (owner, session_key) = (&rest[..owner_len], &rest[owner_len..]);
    // No grant makes a limit on an exclusive hold or a delay on a shared one.
    match mode {
        Mode::Exclusive if limit > 0 => return None,
        Mode::Shared if delay_ms > 0 => return None,
        _ => {}
    }
    let session = match (session_fence, session_key.is_empty()) {
        (0, true) => None,
        (0, false) | (_, true) => return None,
        (f, false) => Some((f, session_key)),
    };
    let deadline_ms = match (deadline, session) {
        (0, Some(_)) => NO_DEADLINE,
        (0, None) => return None,
        (d, _) => d,
    };
    if !reference_token(token) {
        return None;
    }
    let owner = match owner {
        b"" => None,
        o if reference_owner(o) => Some(o),
        _ => return None,
    };
    Some(ExpectedHold {
        token,
        fence,
        deadline_ms,
        mode,
        limit: (limit > 0).then_some(limit as u32),
        delay_ms,
        owner,
        session,
    })
}

/// What a replica is told of a hold is what the master wrote: parsed, it
/// writes back (`hold_state`) to the very same argument, and applied to a
/// lease it is that lease's hold, saved and loaded as it is.
fn check_hold(argv: &[&[u8]]) {
    let parsed = args::parse_hold_args(argv, |a| *a);
    let expected = reference_hold(argv);
    let (token, grant, mode, limit) = match (parsed, expected) {
        (Err(e), None) => {
            assert_eq!(e, error::APPLY_ARGS);
            return;
        }
        (Ok(p), Some(e)) => {
            let (token, grant, mode, limit) = &p;
            let got = ExpectedHold {
                token,
                fence: grant.fence,
                deadline_ms: grant.deadline_ms,
                mode: *mode,
                limit: *limit,
                delay_ms: grant.delay_ms(),
                owner: grant.owner(),
                session: grant.session().map(|b| (b.fence, &*b.key)),
            };
            assert_eq!(got, e, "HOLD {argv:?}");
            p
        }
        (p, e) => panic!("HOLD {argv:?}: parsed {p:?}, expected {e:?}"),
    };
    let written = args::hold_state(&grant, mode, limit);
    assert_eq!(&written[..], argv[0], "written back");
    let again: Vec<&[u8]> = vec![&written, &token];
    assert_eq!(
        args::parse_hold_args(&again, |a| *a),
        Ok((token.clone(), grant.clone(), mode, limit))
    );

    // Applied to a new key: its one hold, on its terms.
    let mut lease = Lease::default();
    let replaced = lease.apply_hold(&token, grant.clone(), mode, limit);
    assert!(replaced.is_empty());
    assert_eq!(lease.fence(), grant.fence);
    let hold = Hold {
        token: token.clone(),
        grant: grant.clone(),
    };
    assert_eq!(
        lease.persisted_holds(),
        Some(Persisted {
            mode,
            limit,
            delayed_until: 0,
            holds: vec![hold.clone()],
        })
    );
    check_views(&lease, NOW, &mut Unbound);
    round_trip(&lease, DECODE_NOW);
    // Applied again (a renewal on the master), it replaces itself: the old
    // hold is handed back, for the glue to unbind it from its session.
    let mut renewed = grant.clone();
    renewed.deadline_ms = MAX_DEADLINE_MS;
    let replaced = lease.apply_hold(&token, renewed, mode, limit);
    assert_eq!(replaced, vec![hold]);
    assert_eq!(lease.persisted_holds().map(|p| p.holds.len()), Some(1));
    assert_eq!(lease.fence(), grant.fence);
}

/// `DROP token [token ...]`: the holds of these tokens go, the others stay.
/// The key's holds: a shared hold for each token at an even place (the
/// first ten distinct ones fit to be tokens), so that some are dropped and
/// some not.
fn check_drop(tokens: &[&[u8]]) {
    let mut held: Vec<&[u8]> = Vec::new();
    for t in tokens.iter().step_by(2) {
        if reference_token(t) && !held.contains(t) && held.len() < 10 {
            held.push(t);
        }
    }
    let deadline = NOW + 60_000;
    let mut lease = Lease::default();
    for (i, t) in held.iter().enumerate() {
        lease.apply_hold(t, Grant::new(100 + i as u64, deadline), Mode::Shared, None);
    }
    let fence = lease.fence();
    let compact = held.is_empty();
    let gone = lease.apply_drop(tokens.iter().copied());
    // Each held token named, once, in the order named.
    let mut dropped: Vec<&[u8]> = Vec::new();
    for t in tokens {
        if held.contains(t) && !dropped.contains(t) {
            dropped.push(t);
        }
    }
    let gone_tokens: Vec<&[u8]> = gone.iter().map(|h| &*h.token).collect();
    assert_eq!(gone_tokens, dropped);
    for h in &gone {
        let at = held.iter().position(|t| *t == &*h.token).expect("held");
        assert_eq!(h.grant, Grant::new(100 + at as u64, deadline));
    }
    let left: Vec<u64> = lease
        .live_holds(NOW, &mut Unbound)
        .iter()
        .map(|h| h.fence)
        .collect();
    let kept: Vec<u64> = (0..held.len())
        .filter(|&i| !dropped.contains(&held[i]))
        .map(|i| 100 + i as u64)
        .collect();
    assert_eq!(left, kept);
    assert_eq!(lease.fence(), fence);
    assert_eq!(lease.is_extended(), !compact);
    check_views(&lease, NOW, &mut Unbound);
    round_trip(&lease, NOW);
    // A compact lease has no holds to drop.
    let holder = Holder {
        token: b"tok"[..].into(),
        deadline_ms: deadline,
    };
    let mut compact = Lease::from_parts(Some(holder), 5);
    let before = compact.clone();
    assert!(compact.apply_drop(tokens.iter().copied()).is_empty());
    assert_eq!(compact, before);
}

/// `DELAY until`: no grant on the key before `until` (unix ms).
fn check_delay(rest: &[&[u8]]) {
    let [until] = rest else {
        return; // the glue's APPLY_ARGS
    };
    let parsed = args::parse_u64(until).filter(|&u| u <= MAX_DEADLINE_MS);
    assert_eq!(
        parsed,
        reference_u64(until).filter(|&u| u <= MAX_DEADLINE_MS)
    );
    let Some(until) = parsed else {
        return;
    };
    let mut lease = Lease::default();
    lease.apply_delay(until);
    // The end of a delay (0) leaves a compact lease as it is.
    assert_eq!(lease.is_extended(), until != 0);
    let state = match until.checked_sub(NOW).filter(|&d| d > 0) {
        Some(ttl_ms) => State::Delayed { ttl_ms },
        None => State::Free,
    };
    assert_eq!(lease.state(NOW, &mut Unbound), state);
    check_views(&lease, NOW, &mut Unbound);
    round_trip(&lease, DECODE_NOW);
    let mut fences = FenceSequence::new();
    let mut grant_at = |t: u64, lease: &mut Lease| {
        let request = Request {
            max_holders: 10,
            ..Request::plain(b"tok", 1000, t)
        };
        lease.acquire(request, &mut fences, &mut Unbound)
    };
    if until > NOW {
        assert_eq!(
            grant_at(NOW, &mut lease),
            Ok((Acquire::Busy, Default::default()))
        );
    }
    let t = until.max(NOW);
    let got = grant_at(t, &mut lease);
    if t.saturating_mul(FENCES_PER_MS) < FENCE_LIMIT {
        assert!(matches!(got, Ok((Acquire::Granted { .. }, _))), "{got:?}");
    } else {
        assert_eq!(got, Err(Refused::FenceExhausted));
    }
    // A live holder stays live through a delay.
    let holder = Holder {
        token: b"tok"[..].into(),
        deadline_ms: NOW + 1000,
    };
    let mut held = Lease::from_parts(Some(holder), 5);
    held.apply_delay(until);
    assert_eq!(held.state(NOW, &mut Unbound), State::Held { ttl_ms: 1000 });
    check_views(&held, NOW, &mut Unbound);
}

/// The whole state: `fence:deadline token`, or `fence deadline token`.
fn check_whole(argv: &[&[u8]]) {
    let parsed = args::parse_apply_args(argv, |a| a);
    // The oracle: `fence:deadline token`, or `fence deadline token`.
    let parts = match argv {
        [state, token] => halves(state).map(|(f, d)| (f, d, *token)),
        [fence, deadline, token] => Some((*fence, *deadline, *token)),
        _ => None,
    };
    let Some((fence, deadline, token)) = parts else {
        assert_eq!(parsed, Err(error::APPLY_ARGS), "apply {argv:?}");
        return;
    };
    match parsed {
        Ok((f, holder)) => {
            assert!(f < FENCE_LIMIT);
            assert_eq!(Some(f), reference_u64(fence));
            let d = reference_u64(deadline).expect("a deadline was parsed");
            match &holder {
                None => assert!(token.is_empty()),
                Some(h) => {
                    assert_eq!(&h.token[..], token);
                    assert_eq!(h.deadline_ms, d);
                    assert!((1..=MAX_TOKEN_LEN).contains(&h.token.len()));
                    assert!((1..=MAX_DEADLINE_MS).contains(&h.deadline_ms));
                }
            }
            // What the module writes for these numbers is what was read.
            let mut buf = [0u8; args::STATE_LEN];
            let state = args::apply_state(f, d, &mut buf);
            assert_eq!(state, [fence, b":", deadline].concat());
            // Applied, it is the whole state, over any holds the key had.
            let mut lease = Lease::default();
            lease.apply_hold(b"shared", Grant::new(1, NOW + 1), Mode::Shared, Some(3));
            lease.apply(holder.clone(), f);
            assert!(!lease.is_extended());
            assert_eq!(lease, Lease::from_parts(holder, f));
            check_views(&lease, NOW, &mut Unbound);
            round_trip(&lease, DECODE_NOW);
        }
        Err(e) => {
            assert_eq!(e, error::APPLY_ARGS);
            let well_formed = reference_u64(fence).is_some_and(|f| f < FENCE_LIMIT)
                && reference_u64(deadline).is_some_and(|d| {
                    d <= MAX_DEADLINE_MS
                        && (token.is_empty() || (d > 0 && token.len() <= MAX_TOKEN_LEN))
                });
            assert!(!well_formed, "apply {argv:?} refused");
        }
    }
}
