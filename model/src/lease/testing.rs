//! What the lease's tests share: a clock, and the grants they make, written
//! short.

use crate::holds::{Mode, Refused, Terms, Unbound};

use super::{Acquire, FenceSequence, Lease, Renew, Request};

pub const T0: u64 = 1_700_000_000_000;

pub const SHARED: Terms<'static> = Terms {
    mode: Mode::Shared,
    limit: None,
    owner: None,
    session: None,
    delay_ms: 0,
};

pub fn shared(limit: u32) -> Terms<'static> {
    Terms {
        limit: Some(limit),
        ..SHARED
    }
}

/// A plain grant (version 1's terms), with `queue_ahead` as given.
pub fn acquire(
    lease: &mut Lease,
    token: &[u8],
    ttl_ms: u64,
    now_ms: u64,
    queue_ahead: bool,
    fences: &mut FenceSequence,
) -> Result<Acquire, Refused> {
    let request = Request {
        queue_ahead,
        ..Request::plain(token, ttl_ms, now_ms)
    };
    lease.acquire(request, fences, &mut Unbound).map(|(a, _)| a)
}

pub fn granted(r: Result<Acquire, Refused>) -> u64 {
    match r {
        Ok(Acquire::Granted { fence }) => fence,
        other => panic!("expected a grant, got {other:?}"),
    }
}

pub fn renew(lease: &mut Lease, token: &[u8], ttl_ms: u64, now_ms: u64) -> bool {
    lease.renew(token, ttl_ms, now_ms, &mut Unbound) == Renew::Renewed
}

/// A grant of 1000 ms on `terms`, nobody waiting.
pub fn on(
    lease: &mut Lease,
    token: &[u8],
    terms: Terms,
    now: u64,
    fences: &mut FenceSequence,
) -> Result<Acquire, Refused> {
    let request = Request {
        terms,
        max_holders: 10_000,
        ..Request::plain(token, 1000, now)
    };
    lease.acquire(request, fences, &mut Unbound).map(|(a, _)| a)
}

/// The key's state before the call, by the calls that make it.
pub fn key_with(holds: &[(&[u8], Terms<'static>)], fences: &mut FenceSequence) -> Lease {
    let mut lease = Lease::default();
    for (token, terms) in holds {
        assert!(matches!(
            on(&mut lease, token, *terms, T0, fences),
            Ok(Acquire::Granted { .. })
        ));
    }
    lease
}
