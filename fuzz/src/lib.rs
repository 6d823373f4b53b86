//! The fuzz harness of redis-lease: the module's pure files, compiled in as
//! they are, and the two entry points the libFuzzer targets call.
//!
//! The whole of `model/src/` sits in a `model` module as in the module's
//! own tree, so its `crate::model::...` paths resolve here exactly as
//! there. Nothing here links Redis.
//!
//! - `acquire`: `LEASE.ACQUIRE`'s options against an oracle written apart,
//!   and the grants a parsed call makes (compact and extended forms);
//! - `apply`: `LEASE.APPLY`'s forms (whole state, HOLD, DROP, DELAY);
//! - `decode`: persisted values of every encoding version;
//! - `effect`: `LEASE.APPLY`'s forms decode and encode back to themselves;
//! - `replica`: a primary's changes, replicated through the wire form, leave
//!   a replica with the same lease after every step.

#![allow(dead_code)]

/// The module's whole pure model: the crate the module itself builds on.
pub use redis_lease_model as model;

pub use model::{args, encoding, error, holds, lease, rdb, sessions};

pub mod reader;

mod acquire;
mod apply;
mod decode;
mod effect;
mod replica;

use holds::{Binding, Mode, SessionState, Sessions, MAX_OWNER_LEN, NO_DEADLINE};
use lease::{Lease, State, FENCE_LIMIT, MAX_DEADLINE_MS, MAX_TOKEN_LEN, MAX_TTL_MS};

pub use decode::fuzz_decode;
pub use effect::fuzz_effect;
pub use replica::fuzz_replica;

/// Splits a fuzz input into a selector byte and NUL-separated arguments.
fn split(data: &[u8]) -> Option<(u8, Vec<&[u8]>)> {
    let (&selector, rest) = data.split_first()?;
    Some((selector, rest.split(|&b| b == 0).collect()))
}

/// The decimal integers Redis clients send: exactly the canonical text of a
/// `u64` (no sign, no leading zero, no space). An oracle written apart from
/// `args::parse_u64`, on the standard library.
fn reference_u64(b: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(b).ok()?;
    let v: u64 = text.parse().ok()?;
    (v.to_string().as_bytes() == b).then_some(v)
}

/// A token as callers may choose it: 1 to 256 bytes, anything.
fn reference_token(b: &[u8]) -> bool {
    !b.is_empty() && b.len() <= MAX_TOKEN_LEN
}

/// An `OWNER` label: 1 to 128 bytes, none of them a control character
/// (below 0x20, or 0x7f). Written apart from `holds::valid_owner`.
fn reference_owner(b: &[u8]) -> bool {
    (1..=MAX_OWNER_LEN).contains(&b.len()) && b.iter().all(|&c| c >= 0x20 && c != 0x7f)
}

/// The unix clock the grants are made at.
const NOW: u64 = 1_700_000_000_000;

/// The clock values are loaded at: late enough that every deadline up to
/// `MAX_DEADLINE_MS` is within reach of a grant.
const DECODE_NOW: u64 = MAX_DEADLINE_MS - MAX_TTL_MS;

/// Target `args`: the first byte picks the parser (mod 5: ttl, fence,
/// token and OWNER label, `LEASE.ACQUIRE` after the key, `LEASE.APPLY`
/// after the key), the rest are its arguments, split at NUL bytes.
pub fn fuzz_args(data: &[u8]) {
    let Some((selector, argv)) = split(data) else {
        return;
    };
    // Every target checks the integer parser on its first argument.
    let first = argv.first().copied().unwrap_or_default();
    check_u64(first);
    match selector % 5 {
        0 => check_ttl(first),
        1 => check_fence(first),
        2 => check_token(first),
        3 => acquire::check_acquire(&argv),
        _ => apply::check_apply(&argv),
    }
}

fn check_u64(b: &[u8]) {
    let parsed = args::parse_u64(b);
    assert_eq!(parsed, reference_u64(b), "parse_u64({b:?})");
    if let Some(v) = parsed {
        // Parse, format, parse: the same number and the same bytes.
        assert_eq!(v.to_string().as_bytes(), b);
        assert_eq!(args::parse_u64(v.to_string().as_bytes()), Some(v));
    }
}

fn check_ttl(b: &[u8]) {
    match args::parse_ttl_or_zero(b) {
        Ok(ttl) => {
            assert!(ttl <= MAX_TTL_MS, "ttl {ttl} from {b:?}");
            assert_eq!(Some(ttl), reference_u64(b));
        }
        Err(e) => {
            assert_eq!(e, error::TTL);
            assert!(reference_u64(b).is_none_or(|v| v > MAX_TTL_MS));
        }
    }
}

fn check_fence(b: &[u8]) {
    match args::parse_fence(b) {
        Ok(fence) => {
            assert!(fence < FENCE_LIMIT, "fence {fence} from {b:?}");
            assert_eq!(Some(fence), reference_u64(b));
        }
        Err(e) => {
            assert_eq!(e, error::FENCE);
            assert!(reference_u64(b).is_none_or(|v| v >= FENCE_LIMIT));
        }
    }
}

fn check_token(b: &[u8]) {
    match args::check_token(b) {
        Ok(t) => {
            assert!(reference_token(t));
            assert_eq!(t, b);
            assert_eq!(t.as_ptr(), b.as_ptr(), "the token is the argument itself");
        }
        Err(e) => {
            assert_eq!(e, error::TOKEN);
            assert!(!reference_token(b));
        }
    }
    assert_eq!(holds::valid_owner(b), reference_owner(b), "owner {b:?}");
}

/// Module values as Redis serializes them (see `reader`), written through
/// the model's own `Writer`: what a save of the module writes.
#[derive(Default)]
struct Saved(Vec<u8>);

impl encoding::Writer for Saved {
    fn unsigned(&mut self, value: u64) {
        rdb::push_unsigned(&mut self.0, value);
    }

    fn buffer(&mut self, bytes: &[u8]) {
        rdb::push_buffer(&mut self.0, bytes);
    }
}

/// A lease saved as the module saves it (the current encoding version).
fn save(lease: &Lease) -> Vec<u8> {
    let mut out = Saved::default();
    encoding::Encoded::of(lease).write(&mut out);
    out.0
}

/// Saves `lease`, loads it back at `now_ms` and checks it is the same
/// lease, saved again to the same bytes. Returns what was loaded.
fn round_trip(lease: &Lease, now_ms: u64) -> Lease {
    let saved = save(lease);
    let loaded = encoding::decode_lease(
        &mut reader::Reader::new(&saved),
        encoding::ENCODING_VERSION,
        now_ms,
    );
    check_invariants(lease);
    let loaded = match loaded {
        Ok(l) => l,
        Err(e) => panic!(
            "a saved lease does not load: {e}: {lease:?} {:?} saved as {saved:02x?}",
            lease.persisted_holds()
        ),
    };
    assert_eq!(&loaded, lease, "saved {saved:02x?}");
    assert_eq!(loaded.is_extended(), lease.is_extended());
    assert_eq!(loaded.persisted_holds(), lease.persisted_holds());
    assert_eq!(save(&loaded), saved, "saved again");
    loaded
}

/// One session key as the glue reads it (`keyspace::sessions::Lookup`):
/// its lease's grant with the binding's fence, or, once that grant is
/// gone, ended when the index noted it.
struct SessionKey<'a> {
    key: &'a [u8],
    lease: &'a Lease,
    now_ms: u64,
    /// When the grant was released or its key deleted (0: not known).
    ended_at: u64,
}

impl Sessions for SessionKey<'_> {
    fn state(&mut self, binding: &Binding) -> SessionState {
        if *binding.key != *self.key {
            return SessionState::Ended { at_ms: 0 };
        }
        self.lease
            .session_state(binding.fence, self.now_ms)
            .unwrap_or(SessionState::Ended {
                at_ms: self.ended_at,
            })
    }
}

/// Every session ended long ago.
struct NoSessions;

impl Sessions for NoSessions {
    fn state(&mut self, _: &Binding) -> SessionState {
        SessionState::Ended { at_ms: 0 }
    }
}

/// What every lease the model makes or loads keeps to: fences below 2^53;
/// an extended lease's holds oldest grant first with rising fences, none
/// above the key's; a token, an owner, a deadline, a session and a delay
/// each in range; at most one exclusive hold and no limit on it; no more
/// shared holds than the limit.
fn check_invariants(lease: &Lease) {
    assert!(lease.fence() < FENCE_LIMIT);
    let Some(holds) = lease.extended() else {
        if let Some(h) = lease.holder() {
            assert!(reference_token(&h.token));
            assert!((1..=MAX_DEADLINE_MS).contains(&h.deadline_ms));
        }
        return;
    };
    assert!(
        lease.holder().is_none(),
        "an extended lease has no compact holder"
    );
    let all = holds.by_grant();
    let mut last = None;
    for (token, g) in &all {
        assert!(g.fence <= lease.fence(), "a hold above the key's fence");
        assert!(last.is_none_or(|l| g.fence > l), "fences rise");
        last = Some(g.fence);
        assert!(reference_token(token));
        assert!(g.owner().is_none_or(reference_owner));
        let session = g.session();
        assert!(session.is_none_or(|b| b.fence < FENCE_LIMIT));
        match g.deadline_ms {
            NO_DEADLINE => assert!(session.is_some(), "no deadline without a session"),
            d => assert!((1..=MAX_DEADLINE_MS).contains(&d)),
        }
        assert!(g.delay_ms() <= MAX_TTL_MS);
    }
    let bound = all.iter().filter(|(_, g)| g.session().is_some()).count();
    assert_eq!(holds.bound(), bound);
    match holds.mode() {
        Mode::Exclusive => {
            assert!(all.len() <= 1, "{} exclusive holds", all.len());
            assert_eq!(holds.limit(), None, "a limit on an exclusive lease");
        }
        Mode::Shared => {
            assert!(holds.limit().is_none_or(|n| all.len() <= n as usize));
            assert!(
                all.iter().all(|(_, g)| g.delay_ms() == 0),
                "a delay on a shared hold"
            );
        }
    }
}

/// What a lease shows at `now_ms` agrees with itself: `is_live`,
/// `live_holds` (oldest grant first, each ending after now), `view` and
/// `state` (held until the last live hold ends).
fn check_views(lease: &Lease, now_ms: u64, sessions: &mut impl Sessions) {
    let live = lease.live_holds(now_ms, sessions);
    let view = lease.view(now_ms, sessions);
    let state = lease.state(now_ms, sessions);
    let is_live = lease.is_live(now_ms, sessions);
    assert_eq!(is_live, !live.is_empty(), "is_live at {now_ms}: {live:?}");
    assert_eq!(view.holders, live.len(), "view at {now_ms}");
    assert_eq!(view.mode.is_some(), is_live);
    let mut last = None;
    for h in &live {
        assert!(h.deadline_ms > now_ms);
        assert!(h.fence <= lease.fence());
        assert!(last.is_none_or(|l| h.fence > l));
        last = Some(h.fence);
        assert_eq!(Some(h.mode), view.mode);
    }
    if view.mode == Some(Mode::Exclusive) {
        assert_eq!(live.len(), 1);
        assert_eq!(view.owner, live[0].owner);
        assert_eq!(view.session, live[0].session);
    }
    assert!(view.limit.is_none_or(|n| live.len() <= n as usize));
    match state {
        State::Held { ttl_ms } => {
            let latest = live.iter().map(|h| h.deadline_ms).max();
            assert_eq!(latest.map(|d| d - now_ms), Some(ttl_ms), "held at {now_ms}");
        }
        State::Delayed { ttl_ms } => {
            assert!(!is_live && ttl_ms > 0);
            assert_eq!(lease.delayed(now_ms, sessions), Some(now_ms + ttl_ms));
        }
        State::Free => assert!(!is_live),
    }
}
