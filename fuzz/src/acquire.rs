//! `LEASE.ACQUIRE key ttl [TOKEN token] [BLOCK timeout] [SHARED [LIMIT n]]
//! [SESSION session-key session-token] [OWNER label] [DELAY ms]`: the
//! parser against an oracle written apart from it, then the grants a parsed
//! call makes (`Lease::acquire`), on the compact form and on the terms it
//! asked.

use std::ffi::CStr;

use crate::holds::{Holds, Mode, Refused, Terms, Unbound, MAX_LIMIT, NO_DEADLINE};
use crate::lease::{
    Acquire, FenceSequence, Lease, LiveHold, NotSession, Renew, Replaced, Request, State, View,
    FENCES_PER_MS, FENCE_LIMIT, MAX_DEADLINE_MS, MAX_TTL_MS,
};
use crate::{
    args, check_views, error, reference_owner, reference_token, reference_u64, round_trip, save,
    SessionKey, NOW,
};

/// What a call must parse to: every field `args::Acquire` carries, as bytes.
#[derive(Debug, PartialEq, Eq)]
struct Expected<'a> {
    ttl_ms: u64,
    token: Option<&'a [u8]>,
    block_ms: Option<u64>,
    mode: Mode,
    limit: Option<u32>,
    owner: Option<&'a [u8]>,
    delay_ms: u64,
    /// Session key and session token.
    session: Option<(&'a [u8], &'a [u8])>,
}

impl<'a> Expected<'a> {
    fn of(p: &args::Acquire<'a, &'a [u8]>) -> Self {
        Expected {
            ttl_ms: p.ttl_ms,
            token: p.token.copied(),
            block_ms: p.block_ms,
            mode: p.terms.mode,
            limit: p.terms.limit,
            owner: p.terms.owner,
            delay_ms: p.terms.delay_ms,
            session: p.session.map(|(k, t)| (*k, *t)),
        }
    }
}

/// What `LEASE.ACQUIRE key ttl [options]` must decide, written apart from
/// `args::parse_acquire` (an index over the options, names upper-cased,
/// numbers and labels checked here):
///
/// 1. the ttl: 0 to 2^40, else the TTL error at once;
/// 2. the options left to right, each at most once, any case: `SHARED`
///    (a `LIMIT n` right after it is its limit, 1 to 1,000,000, or the
///    LIMIT error, also when `n` is missing), `SESSION key token`, `DELAY
///    ms`, `OWNER label`, `TOKEN token`, `BLOCK ms`; the first bad one
///    decides: a value out of range is that option's error, a missing
///    value, an unknown name or a second use the syntax error;
/// 3. then a ttl of 0 without `SESSION`: the TTL error;
/// 4. then `DELAY` with `SHARED`: DELAY_SHARED.
///
/// The order of 2, 3 and 4 is the parser's choice; the oracle follows it.
fn reference_acquire<'a>(ttl: &[u8], options: &[&'a [u8]]) -> Result<Expected<'a>, &'static CStr> {
    let ttl_ms = reference_u64(ttl)
        .filter(|&v| v <= MAX_TTL_MS)
        .ok_or(error::TTL)?;
    let mut e = Expected {
        ttl_ms,
        token: None,
        block_ms: None,
        mode: Mode::Exclusive,
        limit: None,
        owner: None,
        delay_ms: 0,
        session: None,
    };
    let (mut shared, mut delayed, mut owned) = (false, false, false);
    let at = |i: usize| options.get(i).copied();
    let mut i = 0;
    while let Some(option) = at(i) {
        let name = option.to_ascii_uppercase();
        let value = at(i + 1);
        match (&name[..], value) {
            (b"SHARED", _) if !shared => {
                shared = true;
                e.mode = Mode::Shared;
                i += 1;
                if at(i).is_some_and(|o| o.eq_ignore_ascii_case(b"LIMIT")) {
                    let n = at(i + 1).and_then(reference_u64);
                    match n {
                        Some(n) if (1..=MAX_LIMIT).contains(&n) => e.limit = Some(n as u32),
                        _ => return Err(error::LIMIT),
                    }
                    i += 2;
                }
            }
            (_, None) => return Err(error::ACQUIRE_SYNTAX),
            (b"SESSION", Some(key)) if e.session.is_none() => {
                let token = at(i + 2).ok_or(error::ACQUIRE_SYNTAX)?;
                if !reference_token(token) {
                    return Err(error::TOKEN);
                }
                if key.is_empty() {
                    return Err(error::SESSION_KEY);
                }
                e.session = Some((key, token));
                i += 3;
            }
            (b"DELAY", Some(ms)) if !delayed => {
                delayed = true;
                e.delay_ms = reference_u64(ms)
                    .filter(|&v| v <= MAX_TTL_MS)
                    .ok_or(error::DELAY)?;
                i += 2;
            }
            (b"OWNER", Some(label)) if !owned => {
                owned = true;
                if !reference_owner(label) {
                    return Err(error::OWNER);
                }
                e.owner = Some(label);
                i += 2;
            }
            (b"TOKEN", Some(token)) if e.token.is_none() => {
                if !reference_token(token) {
                    return Err(error::TOKEN);
                }
                e.token = Some(token);
                i += 2;
            }
            (b"BLOCK", Some(ms)) if e.block_ms.is_none() => {
                let ms = reference_u64(ms).filter(|&v| v <= MAX_TTL_MS);
                e.block_ms = Some(ms.ok_or(error::BLOCK_TIMEOUT)?);
                i += 2;
            }
            _ => return Err(error::ACQUIRE_SYNTAX),
        }
    }
    if ttl_ms == 0 && e.session.is_none() {
        return Err(error::TTL);
    }
    if delayed && shared {
        return Err(error::DELAY_SHARED);
    }
    Ok(e)
}

pub(crate) fn check_acquire(argv: &[&[u8]]) {
    let Some((ttl, options)) = argv.split_first() else {
        return;
    };
    let parsed = args::parse_acquire(ttl, options, |o| *o);
    let expected = reference_acquire(ttl, options);
    match (&parsed, &expected) {
        (Ok(p), Ok(e)) => {
            assert_eq!(&Expected::of(p), e, "acquire {argv:?}");
            assert!(p.terms.session.is_none(), "the caller resolves the session");
            // The token handed back is the argument itself, not a copy.
            if let Some(t) = p.token {
                assert!(options.iter().any(|o| std::ptr::eq(o, t)));
            }
            check_grant(p);
        }
        (Err(a), Err(b)) => assert_eq!(a, b, "acquire {argv:?}"),
        _ => panic!("acquire {argv:?}: parsed {parsed:?}, expected {expected:?}"),
    }
}

/// The key the grants are made on.
const KEY: &[u8] = b"{fuzz}lease";
/// The token when the call names none: the form the module generates.
const GENERATED: &[u8] = b"0123456789abcdef0123456789abcdef";
const SESSION_TTL: u64 = 60_000;
/// `lease.max-holders` for these grants: small, so that it is reached.
const MAX_HOLDERS: usize = 4;

/// A token that is none of `taken`.
fn other_token(taken: &[&[u8]]) -> &'static [u8] {
    [
        &b"\xffnot the token"[..],
        b"\xfeanother one",
        b"\xfda third",
    ]
    .into_iter()
    .find(|t| !taken.contains(t))
    .expect("three candidates for at most two taken")
}

/// A parsed ACQUIRE drives the state machine.
fn check_grant(p: &args::Acquire<'_, &[u8]>) {
    let token = p.token.map_or(GENERATED, |t| *t);
    if p.session.is_none() && p.terms.is_plain() {
        check_compact(token, p.ttl_ms);
    }
    check_terms(token, p);
}

/// Version 1's grant: the compact form, held by `token` for `ttl_ms`.
fn check_compact(token: &[u8], ttl_ms: u64) {
    let other = other_token(&[token]);
    let mut fences = FenceSequence::new();
    let mut lease = Lease::default();
    let granted = plain(&mut lease, token, ttl_ms, NOW, false, &mut fences);
    let Ok(Acquire::Granted { fence }) = granted else {
        panic!("a free lease was not granted: {granted:?}");
    };
    assert!((NOW * FENCES_PER_MS..FENCE_LIMIT).contains(&fence));
    assert!(!lease.is_extended());
    assert!(lease.is_live(NOW, &mut Unbound));
    let holder = lease.holder().expect("held");
    assert_eq!(&holder.token[..], token);
    assert_eq!(holder.deadline_ms, NOW + ttl_ms);
    assert!(holder.deadline_ms <= MAX_DEADLINE_MS);
    assert_eq!(lease.state(NOW, &mut Unbound), State::Held { ttl_ms });
    assert_eq!(lease.as_session(token, NOW), Ok(fence));
    assert_eq!(lease.as_session(other, NOW), Err(NotSession::NoLiveSession));
    // The same grant made on the general path (the key's form extended,
    // with no hold) is the same grant, and goes back to the compact form.
    let mut same = Lease::from_holds(Holds::default(), 0);
    let got = same.acquire(
        request(token, ttl_ms, Terms::PLAIN, NOW),
        &mut FenceSequence::new(),
        &mut Unbound,
    );
    assert_eq!(got, Ok((Acquire::Granted { fence }, Replaced::default())));
    assert_eq!(same, lease);
    assert!(!same.is_extended());
    round_trip(&lease, NOW);
    assert_eq!(
        plain(&mut lease, token, ttl_ms, NOW, false, &mut fences),
        Ok(Acquire::Retried { fence })
    );
    assert_eq!(
        plain(&mut lease, other, ttl_ms, NOW, false, &mut fences),
        Ok(Acquire::Busy)
    );
    assert_eq!(lease.renew(other, 1, NOW, &mut Unbound), Renew::NotHeld);
    assert_eq!(
        lease.renew(token, 0, NOW, &mut Unbound),
        Renew::ZeroTtlUnbound
    );
    assert_eq!(
        lease.renew(token, ttl_ms, NOW, &mut Unbound),
        Renew::Renewed
    );
    let deadline = NOW + ttl_ms;
    assert_eq!(lease.deadline(), Some(deadline));
    // At its deadline it is free, and the next grant takes a higher fence
    // (unless a waiter is ahead).
    let mut expired = lease.clone();
    assert!(!expired.is_live(deadline, &mut Unbound));
    assert_eq!(expired.state(deadline, &mut Unbound), State::Free);
    assert_eq!(
        expired.renew(token, 1, deadline, &mut Unbound),
        Renew::NotHeld
    );
    assert_eq!(expired.release(token, deadline, &mut Unbound), None);
    assert_eq!(
        plain(&mut expired, other, 1, deadline, true, &mut fences),
        Ok(Acquire::Busy)
    );
    let again = plain(&mut expired, other, 1, deadline, false, &mut fences);
    let Ok(Acquire::Granted { fence: next }) = again else {
        panic!("an expired lease was not granted: {again:?}");
    };
    assert!(next > fence && next < FENCE_LIMIT);
    // Released by its token only; the fence stays.
    assert_eq!(lease.release(other, NOW, &mut Unbound), None);
    let released = lease.release(token, NOW, &mut Unbound).expect("held");
    assert_eq!(released.fence, fence);
    assert!(!lease.is_live(NOW, &mut Unbound));
    assert_eq!(lease.state(NOW, &mut Unbound), State::Free);
    assert_eq!(lease.release(token, NOW, &mut Unbound), None);
    assert_eq!(lease.fence(), fence);
    round_trip(&lease, NOW);
}

/// `LEASE.ACQUIRE` on `terms` as the module asks it, nobody waiting.
fn request<'a>(token: &'a [u8], ttl_ms: u64, terms: Terms<'a>, now_ms: u64) -> Request<'a> {
    Request {
        terms,
        max_holders: MAX_HOLDERS,
        ..Request::plain(token, ttl_ms, now_ms)
    }
}

/// Version 1's grant, behind the queue if `queue_ahead`.
fn plain(
    lease: &mut Lease,
    token: &[u8],
    ttl_ms: u64,
    now_ms: u64,
    queue_ahead: bool,
    fences: &mut FenceSequence,
) -> Result<Acquire, Refused> {
    let request = Request {
        queue_ahead,
        ..request(token, ttl_ms, Terms::PLAIN, now_ms)
    };
    lease.acquire(request, fences, &mut Unbound).map(|(a, _)| a)
}

/// The sessions the key's holds may be bound to, as read at `now_ms`.
fn sessions<'s>(key: &'s [u8], lease: &'s Lease, now_ms: u64, ended_at: u64) -> SessionKey<'s> {
    SessionKey {
        key,
        lease,
        now_ms,
        ended_at,
    }
}

/// The grant on the terms asked: shared or exclusive,
/// limit, owner, session, delay; then more holders up to the limit or
/// `lease.max-holders`, the refusals that change nothing, renewal,
/// persistence, expiry (with its lock-delay), a session's end, release.
fn check_terms(token: &[u8], p: &args::Acquire<'_, &[u8]>) {
    let mut fences = FenceSequence::new();
    let mut terms = p.terms;
    let ttl_ms = p.ttl_ms;
    // The session: an exclusive lease on its own key, granted first.
    let mut session = Lease::default();
    let (skey, stoken) = p.session.map_or((&b""[..], &b""[..]), |(k, t)| (*k, *t));
    let bound = p.session.is_some();
    if bound {
        if skey == KEY {
            return; // SESSION_SELF: the glue's refusal.
        }
        let got = plain(&mut session, stoken, SESSION_TTL, NOW, false, &mut fences);
        let Ok(Acquire::Granted { fence }) = got else {
            panic!("a free session key was not granted: {got:?}");
        };
        assert_eq!(session.as_session(stoken, NOW), Ok(fence));
        let not_it = other_token(&[stoken]);
        assert_eq!(
            session.as_session(not_it, NOW),
            Err(NotSession::NoLiveSession)
        );
        terms.session = Some((skey, fence));
    }
    let session_fence = terms.session.map(|(_, f)| f);
    let mode = terms.mode;
    let exclusive = mode == Mode::Exclusive;
    let own_deadline = match ttl_ms {
        0 => NO_DEADLINE,
        ttl => NOW + ttl,
    };
    let session_deadline = NOW + SESSION_TTL;
    let until = match bound {
        true => own_deadline.min(session_deadline),
        false => own_deadline,
    };
    let other = other_token(&[token, stoken]);
    let round_trip = crate::round_trip;

    let mut lease = Lease::default();
    let got = lease.acquire(
        request(token, ttl_ms, terms, NOW),
        &mut fences,
        &mut sessions(skey, &session, NOW, 0),
    );
    let Ok((Acquire::Granted { fence }, replaced)) = got else {
        panic!("a free lease was not granted on {terms:?}: {got:?}");
    };
    assert_eq!(replaced, Replaced::default());
    assert!(fence < FENCE_LIMIT && session_fence.is_none_or(|s| fence > s));
    assert_eq!(lease.fence(), fence);
    assert_eq!(lease.is_extended(), !terms.is_plain());
    assert_eq!(
        lease.state(NOW, &mut sessions(skey, &session, NOW, 0)),
        State::Held {
            ttl_ms: until - NOW
        }
    );
    let skey_shown = bound.then_some(skey);
    assert_eq!(
        lease.view(NOW, &mut sessions(skey, &session, NOW, 0)),
        View {
            mode: Some(mode),
            holders: 1,
            limit: terms.limit,
            owner: terms.owner.filter(|_| exclusive),
            session: skey_shown.filter(|_| exclusive),
        }
    );
    assert_eq!(
        lease.live_holds(NOW, &mut sessions(skey, &session, NOW, 0)),
        vec![LiveHold {
            fence,
            deadline_ms: until,
            mode,
            owner: terms.owner,
            session: skey_shown,
        }]
    );
    let as_session = match (exclusive, bound) {
        (true, false) => Ok(fence),
        (false, _) => Err(NotSession::Shared),
        (true, true) => Err(NotSession::Bound),
    };
    assert_eq!(lease.as_session(token, NOW), as_session);
    round_trip(&lease, NOW);

    // The same call again is the idempotent retry.
    let again = lease.acquire(
        request(token, ttl_ms, terms, NOW),
        &mut fences,
        &mut sessions(skey, &session, NOW, 0),
    );
    assert_eq!(again, Ok((Acquire::Retried { fence }, Replaced::default())));

    // Refusals change nothing: the other mode first, then another limit,
    // another session, a ttl of 0 for an unbound hold.
    let before = save(&lease);
    let other_mode = match mode {
        Mode::Exclusive => Mode::Shared,
        Mode::Shared => Mode::Exclusive,
    };
    let other_limit = match terms.limit {
        None => Some(7),
        Some(_) => None,
    };
    let mut refusals = vec![
        (
            ttl_ms,
            Terms {
                mode: other_mode,
                limit: other_limit,
                delay_ms: 0,
                ..terms
            },
            Refused::OtherMode,
        ),
        (
            ttl_ms,
            Terms {
                limit: other_limit,
                ..terms
            },
            Refused::LimitMismatch(terms.limit),
        ),
        (
            ttl_ms,
            Terms {
                session: Some((&b"{fuzz}elsewhere"[..], 1)),
                ..terms
            },
            Refused::OtherSession,
        ),
    ];
    // (A compact lease is only ever asked version 1's terms, whose ttl the
    // parser keeps above 0.)
    if !bound && lease.is_extended() {
        refusals.push((0, terms, Refused::NoDeadlineUnbound));
    }
    for (ttl, asked, refused) in refusals {
        let got = lease.acquire(
            request(token, ttl, asked, NOW),
            &mut fences,
            &mut sessions(skey, &session, NOW, 0),
        );
        assert_eq!(got, Err(refused), "{asked:?}");
        assert_eq!(save(&lease), before, "refused {asked:?}");
    }

    // Other tokens: busy for an exclusive hold; shared holders up to the
    // limit, or to `lease.max-holders` (the error), whichever comes first.
    let room = terms.limit.map_or(usize::MAX, |n| n as usize);
    let mut granted = vec![fence];
    for i in 0..MAX_HOLDERS + 2 {
        let name = format!("fuzz-holder-{i}");
        if name.as_bytes() == token {
            continue;
        }
        let asked = Terms {
            owner: None,
            ..terms
        };
        let got = lease.acquire(
            request(name.as_bytes(), ttl_ms, asked, NOW),
            &mut fences,
            &mut sessions(skey, &session, NOW, 0),
        );
        let live = granted.len();
        if exclusive || live >= room {
            assert_eq!(got, Ok((Acquire::Busy, Replaced::default())));
            break;
        }
        if live >= MAX_HOLDERS {
            assert_eq!(got, Err(Refused::TooManyHolders));
            break;
        }
        let Ok((Acquire::Granted { fence: next }, replaced)) = got else {
            panic!("shared holder {i} of {room} was not granted: {got:?}");
        };
        assert_eq!(replaced, Replaced::default());
        assert!(next > *granted.last().expect("one") && next < FENCE_LIMIT);
        granted.push(next);
    }
    let holders = granted.len();
    assert!(holders <= room && holders <= MAX_HOLDERS.max(1));
    assert_eq!(lease.fence(), *granted.last().expect("one"));
    // The other mode, asked by another token: busy (or its limit differs).
    let asked = Terms {
        mode: other_mode,
        ..Terms::PLAIN
    };
    let got = lease.acquire(
        request(other, 1000, asked, NOW),
        &mut fences,
        &mut sessions(skey, &session, NOW, 0),
    );
    match terms.limit {
        Some(_) => assert_eq!(got, Err(Refused::LimitMismatch(terms.limit))),
        None => assert_eq!(got, Ok((Acquire::Busy, Replaced::default()))),
    }
    // A waiter queued ahead is served first, whatever room there is.
    let ahead = Request {
        waiting: true,
        queue_ahead: true,
        ..request(
            other,
            1000,
            Terms {
                owner: None,
                ..terms
            },
            NOW,
        )
    };
    let got = lease.acquire(ahead, &mut fences, &mut sessions(skey, &session, NOW, 0));
    assert_eq!(got, Ok((Acquire::Busy, Replaced::default())));

    check_views(&lease, NOW, &mut sessions(skey, &session, NOW, 0));
    let live = lease.live_holds(NOW, &mut sessions(skey, &session, NOW, 0));
    let fences_seen: Vec<u64> = live.iter().map(|h| h.fence).collect();
    assert_eq!(fences_seen, granted, "live holds, oldest grant first");
    assert!(live
        .iter()
        .all(|h| h.deadline_ms == until && h.mode == mode));
    let view = lease.view(NOW, &mut sessions(skey, &session, NOW, 0));
    assert_eq!((view.holders, view.limit), (holders, terms.limit));
    let shared_holds = if exclusive { 0 } else { holders };
    assert_eq!(lease.shared_holds(), shared_holds);
    assert_eq!(lease.bound_holds(), if bound { holders } else { 0 });
    round_trip(&lease, NOW);

    // Renewal: by the holder only; a ttl of 0 only for a bound hold.
    assert_eq!(
        lease.renew(other, 1000, NOW, &mut sessions(skey, &session, NOW, 0)),
        Renew::NotHeld
    );
    let zero = lease.renew(token, 0, NOW, &mut sessions(skey, &session, NOW, 0));
    assert_eq!(
        zero,
        match bound {
            true => Renew::Renewed,
            false => Renew::ZeroTtlUnbound,
        }
    );
    if ttl_ms > 0 {
        let renewed = lease.renew(token, ttl_ms, NOW, &mut sessions(skey, &session, NOW, 0));
        assert_eq!(renewed, Renew::Renewed);
    }
    round_trip(&lease, NOW);

    // Expiry: every hold ends at `until` (own deadline or the session's);
    // an exclusive hold with DELAY keeps the key from any grant for that
    // long after.
    let delay = if exclusive { terms.delay_ms } else { 0 };
    let last = *granted.last().expect("one");
    check_expiry(&lease, until, delay, holders, last, skey, &session, 0);
    if bound {
        // The session released: its bound holds end at once.
        let mut ended = session.clone();
        assert!(ended.release(stoken, NOW, &mut Unbound).is_some());
        check_expiry(&lease, NOW, delay, holders, last, skey, &ended, NOW);
        // Pruned, they are gone with when they ended, and the delay stays.
        let mut pruned = lease.clone();
        let gone = pruned.prune(NOW, &mut sessions(skey, &ended, NOW, NOW));
        assert_eq!(gone.len(), holders);
        assert!(gone.iter().all(|(_, at)| *at == NOW));
        let state = pruned.state(NOW, &mut sessions(skey, &ended, NOW, NOW));
        assert_eq!(state, delayed_or_free(delay));
        round_trip(&pruned, NOW);
    }

    // Release: by its token only, the others stay; no lock-delay.
    assert_eq!(
        lease.release(other, NOW, &mut sessions(skey, &session, NOW, 0)),
        None
    );
    let released = lease.release(token, NOW, &mut sessions(skey, &session, NOW, 0));
    assert_eq!(released.map(|g| g.fence), Some(fence));
    assert_eq!(
        lease.release(token, NOW, &mut sessions(skey, &session, NOW, 0)),
        None
    );
    let left = lease.live_holds(NOW, &mut sessions(skey, &session, NOW, 0));
    assert_eq!(left.len(), holders - 1);
    let state = lease.state(NOW, &mut sessions(skey, &session, NOW, 0));
    match holders {
        1 => assert_eq!(state, State::Free),
        _ => assert_eq!(
            state,
            State::Held {
                ttl_ms: until - NOW
            }
        ),
    }
    assert_eq!(lease.fence(), last);
    check_views(&lease, NOW, &mut sessions(skey, &session, NOW, 0));
    round_trip(&lease, NOW);
}

fn delayed_or_free(delay_ms: u64) -> State {
    match delay_ms {
        0 => State::Free,
        ttl_ms => State::Delayed { ttl_ms },
    }
}

/// `lease`'s `holders` holds all end at `end`: from then it is free, or
/// delayed for `delay_ms`; then a grant replaces them with a higher fence.
#[allow(clippy::too_many_arguments)]
fn check_expiry(
    lease: &Lease,
    end: u64,
    delay_ms: u64,
    holders: usize,
    last_fence: u64,
    skey: &[u8],
    session: &Lease,
    ended_at: u64,
) {
    let mut lease = lease.clone();
    let mut fences = FenceSequence::new();
    fences.observe(last_fence, NOW);
    let at = |t: u64| sessions(skey, session, t, ended_at);
    if let Some(before) = end.checked_sub(1).filter(|&t| t >= NOW) {
        assert!(lease.is_live(before, &mut at(before)));
    }
    assert!(!lease.is_live(end, &mut at(end)));
    assert!(lease.live_holds(end, &mut at(end)).is_empty());
    assert_eq!(lease.view(end, &mut at(end)).holders, 0);
    assert_eq!(lease.state(end, &mut at(end)), delayed_or_free(delay_ms));
    check_views(&lease, end, &mut at(end));
    let other = other_token(&[]);
    let asked = |t: u64, lease: &mut Lease, fences: &mut FenceSequence| {
        lease.acquire(request(other, 1000, Terms::PLAIN, t), fences, &mut at(t))
    };
    let mut t = end;
    if delay_ms > 0 {
        let got = asked(end, &mut lease, &mut fences);
        assert_eq!(got, Ok((Acquire::Busy, Replaced::default())));
        t = end + delay_ms;
        assert_eq!(lease.state(t, &mut at(t)), State::Free);
    }
    let got = asked(t, &mut lease, &mut fences);
    let Ok((Acquire::Granted { fence }, replaced)) = got else {
        panic!("no grant after every hold ended: {got:?}");
    };
    assert!(fence > last_fence && fence < FENCE_LIMIT);
    assert_eq!(replaced.count, holders);
    assert!(replaced.holds.iter().all(|(_, ended)| *ended == end));
    assert!(!lease.is_extended(), "version 1's terms: the compact form");
    assert_eq!(lease.holder().map(|h| h.deadline_ms), Some(t + 1000));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(ttl: &str, options: &[&str]) -> Result<(), &'static CStr> {
        let options: Vec<&[u8]> = options.iter().map(|o| o.as_bytes()).collect();
        let mut argv = vec![ttl.as_bytes()];
        argv.extend(&options);
        check_acquire(&argv);
        reference_acquire(ttl.as_bytes(), &options).map(|_| ())
    }

    #[test]
    fn the_oracle_agrees_on_the_documented_cases() {
        let ok = Ok(());
        assert_eq!(both("100", &[]), ok);
        assert_eq!(both("0", &[]), Err(error::TTL));
        assert_eq!(both("0", &["SESSION", "{w}s", "st"]), ok);
        assert_eq!(both("0", &["SESSION", "{w}s", "st", "DELAY", "5"]), ok);
        assert_eq!(both("0", &["DELAY", "5", "SHARED"]), Err(error::TTL));
        assert_eq!(
            both("5", &["DELAY", "5", "SHARED"]),
            Err(error::DELAY_SHARED)
        );
        assert_eq!(both("5", &["SHARED", "LIMIT", "2", "OWNER", "me"]), ok);
        assert_eq!(
            both("5", &["shared", "limit", "1000001"]),
            Err(error::LIMIT)
        );
        assert_eq!(both("5", &["SHARED", "LIMIT"]), Err(error::LIMIT));
        assert_eq!(
            both("5", &["LIMIT", "2", "SHARED"]),
            Err(error::ACQUIRE_SYNTAX)
        );
        assert_eq!(both("5", &["SESSION", "s"]), Err(error::ACQUIRE_SYNTAX));
        assert_eq!(both("5", &["SESSION", "s", ""]), Err(error::TOKEN));
        assert_eq!(both("5", &["OWNER", "a\x7f"]), Err(error::OWNER));
        assert_eq!(both("5", &["DELAY", "1099511627777"]), Err(error::DELAY));
        assert_eq!(
            both("5", &["TOKEN", "t", "SESSION", "t", "t", "SHARED"]),
            ok
        );
        assert_eq!(
            both("5", &["SESSION", "a", "b", "SESSION", "a", "b"]),
            Err(error::ACQUIRE_SYNTAX)
        );
        assert_eq!(
            both("5", &["SHARED", "SESSION", "{w}s", "st", "LIMIT", "3"]),
            Err(error::ACQUIRE_SYNTAX)
        );
        assert_eq!(
            both(
                "1",
                &["SHARED", "LIMIT", "3", "SESSION", "{w}s", "st", "OWNER", "x"]
            ),
            ok
        );
        assert_eq!(
            both(
                "1099511627776",
                &["DELAY", "1099511627776", "OWNER", "o", "BLOCK", "0"]
            ),
            ok
        );
    }
}
