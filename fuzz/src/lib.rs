//! The fuzz harness of redis-lease: the module's pure files, compiled in as
//! they are, and the two entry points the libFuzzer targets call.
//!
//! `args.rs`, `encoding.rs`, `error.rs` and `lease.rs` sit in a `model`
//! module as in the module's own tree, so their `crate::model::...` paths
//! resolve here exactly as there. Nothing here links Redis.

#![allow(dead_code)]

/// The module's whole pure model, as it is in its tree.
#[path = "../../src/model/mod.rs"]
pub mod model;

pub use model::{args, encoding, error, lease};

/// The encoder of module values, shared with the integration tests.
#[path = "../../tests/common/rdb.rs"]
pub mod rdb;
pub mod reader;

use lease::{
    FenceSequence, Lease, State, FENCES_PER_MS, FENCE_LIMIT, MAX_DEADLINE_MS, MAX_TOKEN_LEN, MAX_TTL_MS,
};

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

/// Target `args`: the first byte picks the parser, the rest are its
/// arguments, split at NUL bytes.
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
        3 => check_acquire(&argv),
        _ => check_apply(&argv),
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
            assert!((1..=MAX_TOKEN_LEN).contains(&t.len()));
            assert_eq!(t, b);
            assert_eq!(t.as_ptr(), b.as_ptr(), "the token is the argument itself");
        }
        Err(e) => {
            assert_eq!(e, error::TOKEN);
            assert!(b.is_empty() || b.len() > MAX_TOKEN_LEN);
        }
    }
}

/// ttl, token, block timeout.
type Expected<'a> = Result<(u64, Option<&'a [u8]>, Option<u64>), &'static std::ffi::CStr>;

/// What `LEASE.ACQUIRE key ttl [TOKEN t] [BLOCK ms]` must decide, written
/// apart from `args::parse_acquire`: the ttl first, then the options pair
/// by pair in order, the first bad pair deciding the error.
fn reference_acquire<'a>(ttl: &[u8], options: &[&'a [u8]]) -> Expected<'a> {
    let ttl = reference_u64(ttl)
        .filter(|v| (1..=MAX_TTL_MS).contains(v))
        .ok_or(error::TTL)?;
    let (mut token, mut block) = (None, None);
    for pair in options.chunks(2) {
        let [name, value] = pair else {
            return Err(error::ACQUIRE_SYNTAX);
        };
        let upper = name.to_ascii_uppercase();
        if upper == b"TOKEN" && token.is_none() {
            if value.is_empty() || value.len() > MAX_TOKEN_LEN {
                return Err(error::TOKEN);
            }
            token = Some(*value);
        } else if upper == b"BLOCK" && block.is_none() {
            match reference_u64(value) {
                Some(v) if v <= MAX_TTL_MS => block = Some(v),
                _ => return Err(error::BLOCK_TIMEOUT),
            }
        } else {
            return Err(error::ACQUIRE_SYNTAX);
        }
    }
    Ok((ttl, token, block))
}

fn check_acquire(argv: &[&[u8]]) {
    let Some((ttl, options)) = argv.split_first() else {
        return;
    };
    let parsed = args::parse_acquire(ttl, options, |o| *o);
    let expected = reference_acquire(ttl, options);
    match (&parsed, &expected) {
        (Ok(p), Ok((ttl_ms, token, block_ms))) => {
            assert_eq!(
                (p.ttl_ms, p.token.copied(), p.block_ms),
                (*ttl_ms, *token, *block_ms)
            );
            assert!((1..=MAX_TTL_MS).contains(&p.ttl_ms));
            assert!(p
                .token
                .is_none_or(|t| (1..=MAX_TOKEN_LEN).contains(&t.len())));
            assert!(p.block_ms.is_none_or(|b| b <= MAX_TTL_MS));
            check_grant(p.ttl_ms, p.token.copied().unwrap_or(b"generated-token"));
        }
        (Err(a), Err(b)) => assert_eq!(a, b, "acquire {argv:?}"),
        _ => panic!("acquire {argv:?}: parsed {parsed:?}, expected {expected:?}"),
    }
}

/// A parsed ACQUIRE drives the state machine: the grant's deadline and fence
/// stay in range whatever the ttl, and the holder's token is the one asked.
fn check_grant(ttl_ms: u64, token: &[u8]) {
    let now = 1_700_000_000_000;
    let mut fences = FenceSequence::new();
    let mut lease = Lease::default();
    let granted = lease.acquire(token, ttl_ms, now, false, &mut fences);
    let Ok(lease::Acquire::Granted { fence }) = granted else {
        panic!("a free lease was not granted: {granted:?}");
    };
    assert!(fence < FENCE_LIMIT);
    assert!(lease.is_live(now));
    let holder = lease.holder().expect("held");
    assert_eq!(&holder.token[..], token);
    assert!(holder.deadline_ms <= MAX_DEADLINE_MS);
    assert_eq!(lease.state(now), State::Held { ttl_ms });
    assert_eq!(
        lease.acquire(token, ttl_ms, now, false, &mut fences),
        Ok(lease::Acquire::Retried { fence })
    );
    assert!(!lease.release(b"\xffnot the token", now));
    assert!(lease.release(token, now));
}

fn check_apply(argv: &[&[u8]]) {
    let parsed = args::parse_apply_args(argv, |a| a);
    // The oracle: `fence:deadline token`, or `fence deadline token`.
    let parts = match argv {
        [state, token] => {
            let mut halves = state.splitn(2, |&c| c == b':');
            match (halves.next(), halves.next()) {
                (Some(f), Some(d)) => Some((f, d, *token)),
                _ => None,
            }
        }
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
            match holder {
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

/// Target `decode`: the first byte is the encoding version (0..=255, 1 is
/// the one the module knows), the rest a module value as Redis serializes it
/// (see `reader`). Each decoder reads the same bytes from the start.
pub fn fuzz_decode(data: &[u8]) {
    let Some((&version, value)) = data.split_first() else {
        return;
    };
    let encver = i32::from(version);
    check_lease(value, encver);
    check_resource(value, encver);
    check_sequence(value, encver);
}

/// The values a reader yields, in order, until the first short read.
#[derive(Debug, PartialEq)]
enum Item {
    U(u64),
    B(Box<[u8]>),
}

/// The clock the lease decoder is given: late enough that every deadline up
/// to `MAX_DEADLINE_MS` is within reach of a grant.
const DECODE_NOW: u64 = MAX_DEADLINE_MS - MAX_TTL_MS;

fn check_lease(value: &[u8], encver: i32) {
    let decoded = encoding::decode_lease(&mut reader::Reader::new(value), encver, DECODE_NOW);
    let Ok(lease) = decoded else {
        return;
    };
    assert_eq!(encver, encoding::ENCODING_VERSION);
    // What was read is exactly fence, deadline, token, in range.
    let mut r = reader::Reader::new(value);
    let items = [
        r.next_unsigned().map(Item::U),
        r.next_unsigned().map(Item::U),
        r.next_buffer().map(Item::B),
    ];
    let [Some(Item::U(fence)), Some(Item::U(deadline)), Some(Item::B(token))] = items else {
        panic!("decoded a lease from {items:?}");
    };
    assert_eq!(lease.fence(), fence);
    assert!(fence < FENCE_LIMIT);
    match lease.holder() {
        Some(h) => {
            assert_eq!(&h.token[..], &token[..]);
            assert_eq!(h.deadline_ms, deadline);
            assert!((1..=MAX_TOKEN_LEN).contains(&h.token.len()));
            assert!((1..=MAX_DEADLINE_MS).contains(&h.deadline_ms));
            // The state arithmetic holds at every instant around the deadline.
            for now in [0, h.deadline_ms - 1, h.deadline_ms, u64::MAX] {
                match lease.state(now) {
                    State::Held { ttl_ms } => {
                        assert!(now < h.deadline_ms);
                        assert_eq!(ttl_ms, h.deadline_ms - now);
                    }
                    State::Free => assert!(now >= h.deadline_ms),
                }
            }
        }
        None => assert!(token.is_empty() && deadline == 0),
    }
    // Saved again as the module saves it, it decodes to the same lease.
    let (deadline, token) = lease.persisted_holder();
    let again = rdb::encode_lease(lease.fence(), deadline, &token);
    let reloaded = encoding::decode_lease(&mut reader::Reader::new(&again), encver, DECODE_NOW);
    assert_eq!(reloaded.as_ref(), Ok(&lease));
    // A restored fence raises the sequence (up to its ceiling), and the
    // key's next grant is above its own fence either way; other keys are
    // still granted.
    let mut fences = FenceSequence::new();
    fences.observe(lease.fence(), 0);
    if let Ok(next) = fences.next(lease.fence(), 0) {
        assert!(next > lease.fence() && next < FENCE_LIMIT);
    }
    assert!(fences.next(0, 0).is_ok());
}

fn check_resource(value: &[u8], encver: i32) {
    let decoded = encoding::decode_resource(&mut reader::Reader::new(value), encver);
    let Ok(record) = decoded else {
        return;
    };
    assert_eq!(encver, encoding::ENCODING_VERSION);
    let first = reader::Reader::new(value).next_unsigned();
    assert_eq!(first, Some(record.highest()));
    assert!(record.highest() < FENCE_LIMIT);
    // Fences at and above the highest pass, below it are stale.
    assert!(record.check(record.highest()).is_ok());
    if let Some(below) = record.highest().checked_sub(1) {
        assert!(record.check(below).is_err());
    }
    let again = rdb::encode_unsigned(record.highest());
    let reloaded = encoding::decode_resource(&mut reader::Reader::new(&again), encver);
    assert_eq!(reloaded, Ok(record));
}

fn check_sequence(value: &[u8], encver: i32) {
    let Ok(last) = encoding::decode_sequence(&mut reader::Reader::new(value), encver) else {
        return;
    };
    assert_eq!(encver, encoding::ENCODING_VERSION);
    assert!(last < FENCE_LIMIT);
    assert_eq!(reader::Reader::new(value).next_unsigned(), Some(last));
    // Observed at a clock where it is within reach of the floor, it is kept.
    let mut fences = FenceSequence::new();
    fences.observe(last, last / FENCES_PER_MS);
    assert_eq!(fences.last(), last);
}
