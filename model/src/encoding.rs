//! Decoding of persisted values (RDB, `RESTORE`, full sync), independent of
//! where the bytes come from: the module types read through Redis's IO API,
//! the fuzz targets through a plain byte reader. Every value read is
//! checked; anything out of range refuses the load instead of building a
//! lease the rest of the module would trust.

use crate::holds::{valid_owner, Binding, Grant, Hold, Holds, Mode, MAX_LIMIT, NO_DEADLINE};
use crate::lease::{
    Holder, Lease, Persisted, Resource, Token, FENCE_LIMIT, MAX_DEADLINE_MS, MAX_TOKEN_LEN,
    MAX_TTL_MS,
};

/// The encoding version this build writes; it reads this and every older.
pub const ENCODING_VERSION: i32 = 3;

/// Version 2's marker after the version 1 fields: none follow.
pub const COMPACT: u64 = 0;
/// Version 2's marker: the key's holds follow.
pub const EXTENDED: u64 = 1;

/// The most holds one persisted key may carry.
const MAX_HOLDS: u64 = MAX_LIMIT;

/// A source of the primitive values module types persist.
pub trait Reader {
    /// `None` on a short or broken read.
    fn unsigned(&mut self) -> Option<u64>;
    fn buffer(&mut self) -> Option<Box<[u8]>>;
}

/// Where module types write the primitive values they persist.
pub trait Writer {
    fn unsigned(&mut self, value: u64);
    fn buffer(&mut self, bytes: &[u8]);
}

/// A lease as it will be written, read out of it first: everything that
/// can fail (allocation, a panic) happens while building this, none while
/// writing it, so a save never leaves half a value.
pub struct Encoded<'a> {
    fence: u64,
    deadline_ms: u64,
    token: Token<'a>,
    holds: Option<Persisted>,
}

impl<'a> Encoded<'a> {
    pub fn of(lease: &'a Lease) -> Self {
        let (deadline_ms, token) = lease.persisted_holder();
        Encoded {
            fence: lease.fence(),
            deadline_ms,
            token,
            holds: lease.persisted_holds(),
        }
    }

    /// The lease free, with its fence: what is saved when reading it failed.
    pub fn free(fence: u64) -> Self {
        Encoded {
            fence,
            deadline_ms: 0,
            token: Token::Stored(&[]),
            holds: None,
        }
    }

    /// Writes the current version's encoding (see `decode_lease`).
    pub fn write(&self, w: &mut impl Writer) {
        w.unsigned(self.fence);
        w.unsigned(self.deadline_ms);
        w.buffer(&self.token);
        let Some(whole) = &self.holds else {
            w.unsigned(COMPACT);
            return;
        };
        w.unsigned(EXTENDED);
        w.unsigned(u64::from(whole.mode == Mode::Shared));
        w.unsigned(u64::from(whole.limit.unwrap_or(0)));
        w.unsigned(whole.delayed_until);
        w.unsigned(whole.holds.len() as u64);
        for Hold { token, grant } in &whole.holds {
            w.unsigned(grant.fence);
            w.unsigned(match grant.deadline_ms {
                NO_DEADLINE => 0,
                d => d,
            });
            w.buffer(token);
            w.buffer(grant.owner().unwrap_or_default());
            let session = grant.session();
            w.buffer(session.map_or(&[][..], |b| &b.key));
            w.unsigned(session.map_or(0, |b| b.fence));
            w.unsigned(grant.delay_ms());
        }
    }
}

/// lease-key, version 1: `fence`, `deadline_ms` (0 when free), `token`
/// (empty when free).
///
/// Version 2: the same three (free for an extended lease), then `COMPACT`,
/// or `EXTENDED` and `mode` (0 exclusive, 1 shared), `limit` (0: none),
/// `count`, and per hold, oldest grant first: `fence`, `deadline_ms`,
/// `token`, `owner` (empty: none).
///
/// Version 3: as version 2, with the key's `delayed_until` (0: none) after
/// `limit`, and per hold after `owner`: `session` (the session key, empty:
/// none), `session_fence`, `delay_ms`; a bound hold's `deadline_ms` of 0 is
/// none of its own.
///
/// `now_ms` bounds the deadline: no grant reaches past now + the longest
/// ttl, so a later deadline is a crafted or corrupt value, as is a deadline
/// without a token.
pub fn decode_lease(r: &mut impl Reader, encver: i32, now_ms: u64) -> Result<Lease, &'static str> {
    if !(1..=ENCODING_VERSION).contains(&encver) {
        return Err("a lease-key of an unknown encoding version");
    }
    let lease = decode_compact(r, now_ms)?;
    if encver == 1 {
        return Ok(lease);
    }
    match r.unsigned().ok_or("a truncated lease-key")? {
        COMPACT => Ok(lease),
        EXTENDED if lease.deadline().is_none() => decode_holds(r, encver, lease.fence(), now_ms),
        _ => Err("a lease-key with an unknown form"),
    }
}

fn decode_holds(
    r: &mut impl Reader,
    encver: i32,
    fence: u64,
    now_ms: u64,
) -> Result<Lease, &'static str> {
    let truncated = "a truncated lease-key";
    let mode = match r.unsigned().ok_or(truncated)? {
        0 => Mode::Exclusive,
        1 => Mode::Shared,
        _ => return Err("a lease-key with an unknown mode"),
    };
    let limit = match r.unsigned().ok_or(truncated)? {
        0 => None,
        n if n <= MAX_LIMIT => Some(n as u32),
        _ => return Err("a lease-key whose limit is out of range"),
    };
    let delayed_until = match encver {
        2 => 0,
        _ => r.unsigned().ok_or(truncated)?,
    };
    if delayed_until > now_ms.saturating_add(2 * MAX_TTL_MS) {
        return Err("a lease-key with an impossible lock-delay");
    }
    let count = r.unsigned().ok_or(truncated)?;
    if count > MAX_HOLDS || (mode == Mode::Exclusive && count > 1) {
        return Err("a lease-key with more holds than its mode allows");
    }
    if mode == Mode::Exclusive && limit.is_some() {
        return Err("a lease-key with a limit on an exclusive hold");
    }
    if limit.is_some_and(|n| count > u64::from(n)) {
        return Err("a lease-key with more holds than its limit");
    }
    let mut holds = Holds::new(mode, limit);
    holds.set_delayed_until(delayed_until);
    let mut last_fence = 0;
    for _ in 0..count {
        let hold_fence = r.unsigned().ok_or(truncated)?;
        let deadline_ms = r.unsigned().ok_or(truncated)?;
        let token = r.buffer().ok_or(truncated)?;
        let owner = r.buffer().ok_or(truncated)?;
        let (session, delay_ms) = match encver {
            2 => (None, 0),
            _ => {
                let key = r.buffer().ok_or(truncated)?;
                let session_fence = r.unsigned().ok_or(truncated)?;
                let delay_ms = r.unsigned().ok_or(truncated)?;
                if session_fence >= FENCE_LIMIT || delay_ms > MAX_TTL_MS {
                    return Err("a lease-key with a session or delay out of range");
                }
                let session = (!key.is_empty()).then_some(Binding {
                    key,
                    fence: session_fence,
                });
                (session, delay_ms)
            }
        };
        if hold_fence > fence {
            return Err("a lease-key with a hold above the key's fence");
        }
        // Oldest grant first, and every grant took a new fence.
        if hold_fence <= last_fence {
            return Err("a lease-key whose holds' fences do not rise");
        }
        last_fence = hold_fence;
        let unbounded = deadline_ms == 0 && session.is_some();
        if !unbounded {
            check_holder(&token, deadline_ms, now_ms)?;
        }
        if delay_ms > 0 && mode != Mode::Exclusive {
            return Err("a lease-key with a lock-delay on a shared hold");
        }
        if token.is_empty() {
            return Err("a lease-key with a hold without a token");
        }
        if !owner.is_empty() && !valid_owner(&owner) {
            return Err("a lease-key with an invalid owner label");
        }
        if holds.get(&token).is_some() {
            return Err("a lease-key with two holds of one token");
        }
        let deadline_ms = if unbounded { NO_DEADLINE } else { deadline_ms };
        let owner = (!owner.is_empty()).then_some(owner);
        let grant = Grant::with(hold_fence, deadline_ms, owner, session, delay_ms);
        holds.insert(&token, grant);
    }
    Ok(Lease::from_holds(holds, fence))
}

/// A holder's token and deadline, as version 1 checks them.
fn check_holder(token: &[u8], deadline_ms: u64, now_ms: u64) -> Result<(), &'static str> {
    if token.len() > MAX_TOKEN_LEN {
        return Err("a lease-key whose token is longer than 256 bytes");
    }
    let latest = now_ms.saturating_add(MAX_TTL_MS).min(MAX_DEADLINE_MS);
    match (token.is_empty(), deadline_ms) {
        (true, 0) => Ok(()),
        (true, _) => Err("a lease-key with a deadline but no token"),
        (false, d) if d == 0 || d > latest => Err("a lease-key with an impossible deadline"),
        (false, _) => Ok(()),
    }
}

/// Version 1's fields.
fn decode_compact(r: &mut impl Reader, now_ms: u64) -> Result<Lease, &'static str> {
    let fence = r.unsigned().ok_or("a truncated lease-key")?;
    let deadline_ms = r.unsigned().ok_or("a truncated lease-key")?;
    let token = r.buffer().ok_or("a truncated lease-key")?;
    if fence >= FENCE_LIMIT {
        return Err("a lease-key whose fence is not below 2^53");
    }
    check_holder(&token, deadline_ms, now_ms)?;
    let holder = (!token.is_empty()).then_some(Holder { token, deadline_ms });
    Ok(Lease::from_parts(holder, fence))
}

/// fence-rec, versions 1 and 2: `highest`.
pub fn decode_resource(r: &mut impl Reader, encver: i32) -> Result<Resource, &'static str> {
    if !(1..=ENCODING_VERSION).contains(&encver) {
        return Err("a fence-rec of an unknown encoding version");
    }
    match r.unsigned() {
        Some(highest) if highest < FENCE_LIMIT => Ok(Resource::new(highest)),
        Some(_) => Err("a fence-rec whose fence is not below 2^53"),
        None => Err("a truncated fence-rec"),
    }
}

/// The fence sequence's aux field, versions 1 and 2: `last`.
pub fn decode_sequence(r: &mut impl Reader, encver: i32) -> Result<u64, &'static str> {
    if !(1..=ENCODING_VERSION).contains(&encver) {
        return Err("a fence sequence of an unknown encoding version");
    }
    match r.unsigned() {
        Some(last) if last < FENCE_LIMIT => Ok(last),
        Some(_) => Err("a fence sequence not below 2^53"),
        None => Err("a truncated fence sequence"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::holds::Unbound;

    /// Values queued in order; `None` plays a short read.
    struct Queue(Vec<Option<Value>>);

    #[derive(Clone)]
    enum Value {
        U(u64),
        B(&'static [u8]),
    }

    impl Reader for Queue {
        fn unsigned(&mut self) -> Option<u64> {
            match self.0.pop()? {
                Some(Value::U(v)) => Some(v),
                _ => None,
            }
        }

        fn buffer(&mut self) -> Option<Box<[u8]>> {
            match self.0.pop()? {
                Some(Value::B(b)) => Some(b.into()),
                _ => None,
            }
        }
    }

    fn reader(mut values: Vec<Option<Value>>) -> Queue {
        values.reverse();
        Queue(values)
    }

    use Value::{B, U};

    const NOW: u64 = 1_800_000_000_000;

    #[test]
    fn lease_round_trip_values() {
        let mut r = reader(vec![Some(U(7)), Some(U(1000)), Some(B(b"tok"))]);
        let lease = decode_lease(&mut r, 1, NOW).expect("valid");
        assert_eq!(lease.fence(), 7);
        assert_eq!(lease.holder().map(|h| h.deadline_ms), Some(1000));
        let mut r = reader(vec![Some(U(7)), Some(U(0)), Some(B(b""))]);
        assert!(decode_lease(&mut r, 1, NOW)
            .expect("free")
            .holder()
            .is_none());
        let latest = NOW + MAX_TTL_MS;
        let mut r = reader(vec![Some(U(7)), Some(U(latest)), Some(B(b"tok"))]);
        assert!(decode_lease(&mut r, 1, NOW).is_ok(), "the longest ttl");
    }

    #[test]
    fn lease_refusals() {
        let long: &'static [u8] = &[b'x'; 257];
        let cases: Vec<(i32, Vec<Option<Value>>)> = vec![
            (3, vec![Some(U(7)), Some(U(1000)), Some(B(b"tok"))]),
            (2, vec![Some(U(7)), Some(U(1000)), Some(B(b"tok"))]),
            (0, vec![Some(U(7)), Some(U(1000)), Some(B(b"tok"))]),
            (1, vec![Some(U(7))]),
            (1, vec![Some(U(7)), Some(U(1000)), None]),
            (
                1,
                vec![Some(U(FENCE_LIMIT)), Some(U(1000)), Some(B(b"tok"))],
            ),
            (1, vec![Some(U(u64::MAX)), Some(U(1000)), Some(B(b"tok"))]),
            (1, vec![Some(U(7)), Some(U(0)), Some(B(b"tok"))]),
            (
                1,
                vec![Some(U(7)), Some(U(MAX_DEADLINE_MS + 1)), Some(B(b"tok"))],
            ),
            (1, vec![Some(U(7)), Some(U(u64::MAX)), Some(B(b"tok"))]),
            (1, vec![Some(U(7)), Some(U(1000)), Some(B(long))]),
            // a deadline past now + the longest ttl
            (
                1,
                vec![Some(U(7)), Some(U(NOW + MAX_TTL_MS + 1)), Some(B(b"tok"))],
            ),
            // a deadline without a holder
            (1, vec![Some(U(7)), Some(U(1000)), Some(B(b""))]),
        ];
        for (encver, values) in cases {
            assert!(decode_lease(&mut reader(values), encver, NOW).is_err());
        }
    }

    /// Values as a writer received them, read back in order.
    #[derive(Default)]
    struct Tape(Vec<Option<Value>>);

    impl Writer for Tape {
        fn unsigned(&mut self, value: u64) {
            self.0.push(Some(U(value)));
        }

        fn buffer(&mut self, bytes: &[u8]) {
            let leaked: &'static [u8] = Box::leak(bytes.into());
            self.0.push(Some(B(leaked)));
        }
    }

    fn round_trip(lease: &Lease) -> Lease {
        let mut tape = Tape::default();
        Encoded::of(lease).write(&mut tape);
        decode_lease(&mut reader(tape.0), ENCODING_VERSION, NOW).expect("its own encoding")
    }

    #[test]
    fn every_form_round_trips_through_version_2() {
        use crate::holds::Terms;
        use crate::lease::{Acquire, FenceSequence, Request};
        let mut fences = FenceSequence::new();
        let mut compact = Lease::default();
        assert!(matches!(
            compact.acquire(Request::plain(b"tok", 5000, NOW), &mut fences, &mut Unbound),
            Ok((Acquire::Granted { .. }, _))
        ));
        let mut shared = Lease::default();
        for (token, owner) in [
            (&b"a"[..], Some(&b"host-a"[..])),
            (b"b", None),
            (b"c", Some(b"c")),
        ] {
            let terms = Terms {
                mode: Mode::Shared,
                limit: Some(5),
                owner,
                ..Terms::PLAIN
            };
            let request = Request {
                terms,
                max_holders: 10,
                ..Request::plain(token, 5000, NOW)
            };
            let got = shared.acquire(request, &mut fences, &mut Unbound);
            assert!(matches!(got, Ok((Acquire::Granted { .. }, _))));
        }
        let mut labelled = Lease::default();
        let terms = Terms {
            owner: Some(b"me"),
            ..Terms::PLAIN
        };
        let request = Request {
            terms,
            max_holders: 10,
            ..Request::plain(b"x", 5000, NOW)
        };
        let got = labelled.acquire(request, &mut fences, &mut Unbound);
        assert!(matches!(got, Ok((Acquire::Granted { .. }, _))));
        let free = Lease::from_parts(None, 77);
        for lease in [compact, shared, labelled, free] {
            let back = round_trip(&lease);
            assert_eq!(back, lease);
            assert_eq!(back.is_extended(), lease.is_extended());
            assert_eq!(
                back.live_holds(NOW, &mut Unbound),
                lease.live_holds(NOW, &mut Unbound)
            );
        }
    }

    #[test]
    fn version_2_refusals() {
        // fence, deadline, token, EXTENDED, mode, limit, count, holds...
        let hold = |fence: u64, token: &'static [u8]| {
            vec![
                Some(U(fence)),
                Some(U(NOW + 10)),
                Some(B(token)),
                Some(B(b"")),
            ]
        };
        let head = |mode: u64, limit: u64, count: u64| {
            vec![
                Some(U(9)),
                Some(U(0)),
                Some(B(b"")),
                Some(U(EXTENDED)),
                Some(U(mode)),
                Some(U(limit)),
                Some(U(count)),
            ]
        };
        let valid = [head(1, 2, 2), hold(8, b"a"), hold(9, b"b")].concat();
        assert!(decode_lease(&mut reader(valid), 2, NOW).is_ok());
        let cases: Vec<Vec<Option<Value>>> = vec![
            [head(2, 0, 1), hold(8, b"a")].concat(),
            [head(1, MAX_LIMIT + 1, 1), hold(8, b"a")].concat(),
            [head(0, 0, 2), hold(8, b"a"), hold(9, b"b")].concat(),
            [head(1, 0, 1), hold(10, b"a")].concat(),
            [head(1, 0, 2), hold(8, b"a"), hold(9, b"a")].concat(),
            [head(1, 0, 1), hold(8, b"")].concat(),
            [head(1, 0, 2), hold(8, b"a")].concat(),
            vec![Some(U(9)), Some(U(NOW)), Some(B(b"t")), Some(U(EXTENDED))],
            vec![Some(U(9)), Some(U(0)), Some(B(b"")), Some(U(7))],
            vec![Some(U(9)), Some(U(0)), Some(B(b""))],
        ];
        for (i, values) in cases.into_iter().enumerate() {
            assert!(
                decode_lease(&mut reader(values), 2, NOW).is_err(),
                "case {i}"
            );
        }
        assert!(decode_lease(
            &mut reader(vec![Some(U(7)), Some(U(0)), Some(B(b""))]),
            3,
            NOW
        )
        .is_err());
    }

    #[test]
    fn resource_and_sequence_refusals() {
        assert_eq!(
            decode_resource(&mut reader(vec![Some(U(5))]), 1).map(|r| r.highest()),
            Ok(5)
        );
        assert!(decode_resource(&mut reader(vec![Some(U(FENCE_LIMIT))]), 1).is_err());
        assert!(decode_resource(&mut reader(vec![None]), 1).is_err());
        assert!(decode_resource(&mut reader(vec![Some(U(5))]), 9).is_err());
        assert_eq!(decode_sequence(&mut reader(vec![Some(U(5))]), 1), Ok(5));
        assert!(decode_sequence(&mut reader(vec![Some(U(FENCE_LIMIT))]), 1).is_err());
        assert!(decode_sequence(&mut reader(vec![]), 1).is_err());
    }
}
