//! Argument parsing for the LEASE commands, on plain byte slices: client
//! input is untrusted bytes, and this is the code the fuzz targets drive.
//! Also the one argument the module writes itself: `LEASE.APPLY`'s state.

use std::ffi::CStr;

use crate::error;
use crate::holds::{valid_owner, Binding, Grant, Mode, Terms, MAX_LIMIT, NO_DEADLINE};
use crate::lease::{Holder, FENCE_LIMIT, MAX_DEADLINE_MS, MAX_TOKEN_LEN, MAX_TTL_MS};

/// Parses a non-negative decimal integer as Redis does: no sign, no
/// leading zeros, no spaces.
pub fn parse_u64(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 20 || (b.len() > 1 && b[0] == b'0') {
        return None;
    }
    b.iter().try_fold(0u64, |acc, &c| {
        let digit = c.checked_sub(b'0').filter(|d| *d <= 9)?;
        acc.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// A ttl, or 0 (which only a hold bound to a session may have: the caller
/// checks).
pub fn parse_ttl_or_zero(b: &[u8]) -> Result<u64, &'static CStr> {
    parse_u64(b).filter(|v| *v <= MAX_TTL_MS).ok_or(error::TTL)
}

pub fn parse_fence(b: &[u8]) -> Result<u64, &'static CStr> {
    parse_u64(b)
        .filter(|v| *v < FENCE_LIMIT)
        .ok_or(error::FENCE)
}

pub fn check_token(b: &[u8]) -> Result<&[u8], &'static CStr> {
    if (1..=MAX_TOKEN_LEN).contains(&b.len()) {
        Ok(b)
    } else {
        Err(error::TOKEN)
    }
}

/// `LEASE.ACQUIRE key ttl [TOKEN token] [BLOCK timeout]`, after the key.
#[derive(Debug, PartialEq, Eq)]
pub struct Acquire<'a, T> {
    pub ttl_ms: u64,
    /// The argument that carries the token, checked: the caller can pass the
    /// argument itself on rather than copy its bytes.
    pub token: Option<&'a T>,
    pub block_ms: Option<u64>,
    /// Mode, limit, label and delay (version 2 options); the session is
    /// filled in by the caller, who resolves it (`session`).
    pub terms: Terms<'a>,
    /// `SESSION session-key session-token`: the arguments, the token
    /// checked.
    pub session: Option<(&'a T, &'a T)>,
}

/// Parses ttl and options; each option at most once, in any order, any case.
pub fn parse_acquire<'a, T>(
    ttl: &[u8],
    options: &'a [T],
    bytes: impl Fn(&'a T) -> &'a [u8],
) -> Result<Acquire<'a, T>, &'static CStr> {
    // 0 only with a session: checked once the options are read.
    let ttl_ms = parse_ttl_or_zero(ttl)?;
    let mut parsed = Acquire {
        ttl_ms,
        token: None,
        block_ms: None,
        terms: Terms::PLAIN,
        session: None,
    };
    let mut rest = options;
    let mut shared = false;
    let mut owned = false;
    let mut delayed = false;
    while let [option, tail @ ..] = rest {
        let option = bytes(option);
        // Version 1's options first: the calls that use nothing else pay
        // for no other comparison.
        if let [value, after @ ..] = tail {
            if option.eq_ignore_ascii_case(b"TOKEN") && parsed.token.is_none() {
                check_token(bytes(value))?;
                parsed.token = Some(value);
                rest = after;
                continue;
            }
            if option.eq_ignore_ascii_case(b"BLOCK") && parsed.block_ms.is_none() {
                let timeout = parse_u64(bytes(value)).filter(|v| *v <= MAX_TTL_MS);
                parsed.block_ms = Some(timeout.ok_or(error::BLOCK_TIMEOUT)?);
                rest = after;
                continue;
            }
        }
        if option.eq_ignore_ascii_case(b"SHARED") && !shared {
            shared = true;
            parsed.terms.mode = Mode::Shared;
            rest = tail;
            if let [limit, value, after @ ..] = rest {
                if bytes(limit).eq_ignore_ascii_case(b"LIMIT") {
                    let n = parse_u64(bytes(value)).filter(|n| (1..=MAX_LIMIT).contains(n));
                    parsed.terms.limit = Some(n.ok_or(error::LIMIT)? as u32);
                    rest = after;
                }
            } else if let [limit] = rest {
                if bytes(limit).eq_ignore_ascii_case(b"LIMIT") {
                    return Err(error::LIMIT);
                }
            }
            continue;
        }
        let [value, tail @ ..] = tail else {
            return Err(error::ACQUIRE_SYNTAX);
        };
        if option.eq_ignore_ascii_case(b"SESSION") && parsed.session.is_none() {
            let [session_token, after @ ..] = tail else {
                return Err(error::ACQUIRE_SYNTAX);
            };
            check_token(bytes(session_token))?;
            if bytes(value).is_empty() {
                return Err(error::SESSION_KEY);
            }
            parsed.session = Some((value, session_token));
            rest = after;
            continue;
        }
        if option.eq_ignore_ascii_case(b"DELAY") && !delayed {
            delayed = true;
            let delay = parse_u64(bytes(value)).filter(|v| *v <= MAX_TTL_MS);
            parsed.terms.delay_ms = delay.ok_or(error::DELAY)?;
        } else if option.eq_ignore_ascii_case(b"OWNER") && !owned {
            owned = true;
            if !valid_owner(bytes(value)) {
                return Err(error::OWNER);
            }
            parsed.terms.owner = Some(bytes(value));
        } else {
            return Err(error::ACQUIRE_SYNTAX);
        }
        rest = tail;
    }
    if !rest.is_empty() {
        return Err(error::ACQUIRE_SYNTAX);
    }
    if parsed.ttl_ms == 0 && parsed.session.is_none() {
        return Err(error::TTL);
    }
    if delayed && shared {
        return Err(error::DELAY_SHARED);
    }
    Ok(parsed)
}

/// "00" to "99": the two digits of every value below 100.
const DIGIT_PAIRS: [[u8; 2]; 100] = {
    let mut pairs = [[0; 2]; 100];
    let mut i = 0;
    while i < 100 {
        pairs[i] = [b'0' + (i / 10) as u8, b'0' + (i % 10) as u8];
        i += 1;
    }
    pairs
};

/// Writes `v` in decimal into `buf`, ending just before `end`, two digits
/// per division; returns where it starts. `end` must be at least 20, the
/// digits of `u64::MAX`.
fn decimal_before(mut v: u64, buf: &mut [u8], end: usize) -> usize {
    let mut at = end;
    // ok: at most 10 pairs of digits, and the caller leaves room for 20;
    // a pair's index is below 100.
    while v >= 100 {
        at -= 2;
        buf[at..at + 2].copy_from_slice(&DIGIT_PAIRS[(v % 100) as usize]);
        v /= 100;
    }
    if v >= 10 {
        at -= 2;
        buf[at..at + 2].copy_from_slice(&DIGIT_PAIRS[v as usize]);
    } else {
        at -= 1;
        buf[at] = b'0' + v as u8;
    }
    at
}

/// Room for `fence:deadline`, each any u64.
pub const STATE_LEN: usize = 41;

/// `LEASE.APPLY`'s state argument, `fence:deadline` in decimal: one
/// argument for the two numbers, because every argument of a replicated
/// call is an allocation of its own on the server.
pub fn apply_state(fence: u64, deadline_ms: u64, buf: &mut [u8; STATE_LEN]) -> &[u8] {
    let mut at = decimal_before(deadline_ms, buf, STATE_LEN);
    at -= 1;
    buf[at] = b':';
    let at = decimal_before(fence, buf, at);
    &buf[at..]
}

/// Room for any u64 in decimal.
pub const DECIMAL_LEN: usize = 20;

/// `v` in decimal, written into `buf`.
pub fn decimal(v: u64, buf: &mut [u8; DECIMAL_LEN]) -> &[u8] {
    let at = decimal_before(v, buf, DECIMAL_LEN);
    &buf[at..]
}

/// Appends `v` in decimal.
fn push_decimal(out: &mut Vec<u8>, v: u64) {
    let mut buf = [0u8; 20];
    let at = decimal_before(v, &mut buf, 20);
    // ok: `decimal_before` starts within the buffer it wrote.
    out.extend_from_slice(&buf[at..]);
}

/// `LEASE.APPLY key state token`'s state for one hold, one argument for the
/// whole hold (each argument of a replicated call costs the server an
/// object), told from a whole lease's `fence:deadline` by its colons:
/// `fence:deadline:mode:limit:delay:session_fence:owner_len:` then the
/// owner's bytes, then the session key's. Mode `X` or `S`; limit 0: none;
/// a deadline of 0: none of its own (a bound hold); session fence 0: no
/// session. Replication, the AOF rewrite and the digest all write a hold
/// this way.
pub fn hold_state(grant: &Grant, mode: Mode, limit: Option<u32>) -> Vec<u8> {
    let owner = grant.owner().unwrap_or_default();
    let session = grant.session();
    let session_key = session.map_or(&[][..], |b| &b.key);
    let mut out = Vec::with_capacity(96 + owner.len() + session_key.len());
    let deadline = match grant.deadline_ms {
        NO_DEADLINE => 0,
        d => d,
    };
    let mode = match mode {
        Mode::Exclusive => b"X",
        Mode::Shared => b"S",
    };
    for (i, v) in [grant.fence, deadline].into_iter().enumerate() {
        if i > 0 {
            out.push(b':');
        }
        push_decimal(&mut out, v);
    }
    out.push(b':');
    out.extend_from_slice(mode);
    for v in [
        u64::from(limit.unwrap_or(0)),
        grant.delay_ms(),
        session.map_or(0, |b| b.fence),
        owner.len() as u64,
    ] {
        out.push(b':');
        push_decimal(&mut out, v);
    }
    out.push(b':');
    out.extend_from_slice(owner);
    out.extend_from_slice(session_key);
    out
}

/// A hold as `LEASE.APPLY ... HOLD` carries it: token, grant, and the key's
/// mode and limit.
pub type HoldEffect = (Box<[u8]>, Grant, Mode, Option<u32>);

/// Whether a `LEASE.APPLY` state argument is a hold's (`hold_state`: seven
/// colons) rather than a whole lease's `fence:deadline` (one).
pub fn is_hold_state(state: &[u8]) -> bool {
    state.iter().filter(|&&c| c == b':').take(2).count() == 2
}

/// `LEASE.APPLY key state token` with a hold's state: the hold and the key's
/// terms, checked; what no grant makes is refused (a limit on an exclusive
/// hold, a lock-delay on a shared one, fence 0, a deadline of 0 without a
/// session).
pub fn parse_hold_args<'a, T>(
    args: &'a [T],
    bytes: impl Fn(&'a T) -> &'a [u8],
) -> Result<HoldEffect, &'static CStr> {
    let [state, token] = args else {
        return Err(error::APPLY_ARGS);
    };
    parse_hold(bytes(state), bytes(token)).ok_or(error::APPLY_ARGS)
}

fn parse_hold(state: &[u8], token: &[u8]) -> Option<HoldEffect> {
    let mut fields = state.splitn(8, |&c| c == b':');
    let mut number = || parse_u64(fields.next()?);
    let (fence, deadline) = (number()?, number()?);
    let mode = match fields.next()? {
        b"X" => Mode::Exclusive,
        b"S" => Mode::Shared,
        _ => return None,
    };
    let mut number = || parse_u64(fields.next()?);
    let (limit, delay, session_fence, owner_len) = (number()?, number()?, number()?, number()?);
    let rest = fields.next()?;
    let owner_len = usize::try_from(owner_len)
        .ok()
        .filter(|&n| n <= rest.len())?;
    let (owner, session_key) = rest.split_at(owner_len);
    let fence = Some(fence).filter(|&f| f > 0 && f < FENCE_LIMIT)?;
    let limit = Some(limit).filter(|&n| n <= MAX_LIMIT)? as u32;
    let delay = Some(delay).filter(|&d| d <= MAX_TTL_MS)?;
    let impossible = match mode {
        Mode::Exclusive => limit > 0,
        Mode::Shared => delay > 0,
    };
    if impossible || !(1..=MAX_TOKEN_LEN).contains(&token.len()) {
        return None;
    }
    let session = match (session_fence, session_key) {
        (0, []) => None,
        (0, _) | (_, []) => return None,
        (f, key) if f < FENCE_LIMIT => Some(Binding {
            key: key.into(),
            fence: f,
        }),
        _ => return None,
    };
    let deadline_ms = match deadline {
        0 if session.is_some() => NO_DEADLINE,
        d if (1..=MAX_DEADLINE_MS).contains(&d) => d,
        _ => return None,
    };
    let owner = match owner {
        [] => None,
        label if valid_owner(label) => Some(label.into()),
        _ => return None,
    };
    let grant = Grant::with(fence, deadline_ms, owner, session, delay);
    Some((token.into(), grant, mode, (limit > 0).then_some(limit)))
}

/// The fence and deadline of a `fence:deadline` state, unparsed.
fn split_state(state: &[u8]) -> Option<(&[u8], &[u8])> {
    let colon = state.iter().position(|&c| c == b':')?;
    Some((&state[..colon], &state[colon + 1..]))
}

/// `LEASE.APPLY`'s effect, after the key: `fence:deadline token`, or
/// `fence deadline token` as earlier versions wrote it (old AOF files and
/// masters). An empty token means free.
pub fn parse_apply_args<'a, T>(
    args: &'a [T],
    bytes: impl Fn(&'a T) -> &'a [u8],
) -> Result<(u64, Option<Holder>), &'static CStr> {
    let (fence, deadline, token) = match args {
        [state, token] => {
            let (fence, deadline) = split_state(bytes(state)).ok_or(error::APPLY_ARGS)?;
            (fence, deadline, bytes(token))
        }
        [fence, deadline, token] => (bytes(fence), bytes(deadline), bytes(token)),
        _ => return Err(error::APPLY_ARGS),
    };
    parse_apply(fence, deadline, token)
}

/// The numbers and token of an effect, checked.
fn parse_apply(
    fence: &[u8],
    deadline: &[u8],
    token: &[u8],
) -> Result<(u64, Option<Holder>), &'static CStr> {
    let fence = parse_fence(fence).map_err(|_| error::APPLY_ARGS)?;
    let deadline_ms = parse_u64(deadline)
        .filter(|d| *d <= MAX_DEADLINE_MS)
        .ok_or(error::APPLY_ARGS)?;
    match token.len() {
        0 => Ok((fence, None)),
        n if n <= MAX_TOKEN_LEN && deadline_ms > 0 => {
            let token = token.into();
            Ok((fence, Some(Holder { token, deadline_ms })))
        }
        _ => Err(error::APPLY_ARGS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acquire<'a>(
        ttl: &str,
        options: &'a [&'a str],
    ) -> Result<Acquire<'a, &'a str>, &'static CStr> {
        parse_acquire(ttl.as_bytes(), options, |o| o.as_bytes())
    }

    #[test]
    fn integers_parse_like_redis_clients_send_them() {
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b"30000"), Some(30000));
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b"-1",
            b"+1",
            b"1.5",
            b" 1",
            b"1e3",
            b"18446744073709551616",
            b"abc",
            b"007",
            b"00",
        ] {
            assert_eq!(parse_u64(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn ttl_and_fence_ranges() {
        assert_eq!(parse_ttl_or_zero(b"0"), Ok(0));
        assert_eq!(parse_ttl_or_zero(b"1"), Ok(1));
        assert_eq!(parse_ttl_or_zero(b"1099511627776"), Ok(MAX_TTL_MS));
        assert!(parse_ttl_or_zero(b"1099511627777").is_err());
        assert!(parse_ttl_or_zero(b"-1").is_err());
        assert_eq!(parse_fence(b"0"), Ok(0));
        assert_eq!(parse_fence(b"9007199254740991"), Ok(FENCE_LIMIT - 1));
        assert!(parse_fence(b"9007199254740992").is_err());
    }

    #[test]
    fn token_length_limits() {
        assert!(check_token(b"").is_err());
        assert!(check_token(&[b'x'; 256]).is_ok());
        assert!(check_token(&[b'x'; 257]).is_err());
    }

    #[test]
    fn acquire_options_table() {
        let ok = |ttl: u64, token: Option<&'static &'static str>, block: Option<u64>| {
            Ok(Acquire {
                ttl_ms: ttl,
                token,
                block_ms: block,
                terms: Terms::PLAIN,
                session: None,
            })
        };
        assert_eq!(acquire("100", &[]), ok(100, None, None));
        assert_eq!(acquire("100", &["token", "t"]), ok(100, Some(&"t"), None));
        assert_eq!(
            acquire("100", &["BLOCK", "0", "TOKEN", "t"]),
            ok(100, Some(&"t"), Some(0))
        );
        let syntax = Err(error::ACQUIRE_SYNTAX);
        assert_eq!(acquire("100", &["TOKEN"]), syntax);
        assert_eq!(acquire("100", &["TOKEN", "a", "TOKEN", "b"]), syntax);
        assert_eq!(acquire("100", &["NX", "1"]), syntax);
        assert_eq!(acquire("100", &["TOKEN", ""]), Err(error::TOKEN));
        assert_eq!(acquire("100", &["BLOCK", "-1"]), Err(error::BLOCK_TIMEOUT));
        assert_eq!(acquire("0", &[]), Err(error::TTL));
    }

    #[test]
    fn version_2_options_table() {
        let terms = |options: &'static [&'static str]| {
            acquire("100", options).map(|a| {
                (
                    a.terms.mode,
                    a.terms.limit,
                    a.terms.owner.map(<[u8]>::to_vec),
                )
            })
        };
        let shared = Mode::Shared;
        assert_eq!(terms(&["SHARED"]), Ok((shared, None, None)));
        assert_eq!(
            terms(&["shared", "limit", "3"]),
            Ok((shared, Some(3), None))
        );
        assert_eq!(
            terms(&["SHARED", "LIMIT", "1000000", "TOKEN", "t"]),
            Ok((shared, Some(1_000_000), None))
        );
        assert_eq!(
            terms(&["OWNER", "w-1", "SHARED", "BLOCK", "5"]),
            Ok((shared, None, Some(b"w-1".to_vec())))
        );
        assert_eq!(
            terms(&["OWNER", "w"]),
            Ok((Mode::Exclusive, None, Some(b"w".to_vec())))
        );
        for (options, err) in [
            (&["SHARED", "LIMIT", "0"][..], error::LIMIT),
            (&["SHARED", "LIMIT", "1000001"][..], error::LIMIT),
            (&["SHARED", "LIMIT", "x"][..], error::LIMIT),
            (&["SHARED", "LIMIT"][..], error::LIMIT),
            (&["LIMIT", "3"][..], error::ACQUIRE_SYNTAX),
            (&["LIMIT", "3", "SHARED"][..], error::ACQUIRE_SYNTAX),
            (&["SHARED", "SHARED"][..], error::ACQUIRE_SYNTAX),
            (
                &["SHARED", "TOKEN", "t", "LIMIT", "2"][..],
                error::ACQUIRE_SYNTAX,
            ),
            (&["OWNER", ""][..], error::OWNER),
            (&["OWNER", "a\nb"][..], error::OWNER),
            (&["OWNER", "a", "OWNER", "b"][..], error::ACQUIRE_SYNTAX),
            (&["OWNER"][..], error::ACQUIRE_SYNTAX),
        ] {
            let got = acquire("100", options).map(|_| ());
            assert_eq!(got, Err(err), "{options:?}");
        }
        assert_eq!(
            acquire("100", &["OWNER", "a\u{7}b"]).map(|_| ()),
            Err(error::OWNER)
        );
    }

    #[test]
    fn hold_effects_round_trip() {
        let args: [&[u8]; 2] = [b"9:1000:S:3:0:0:4:host", b"tok"];
        let (token, grant, mode, limit) = parse_hold_args(&args, |a| a).expect("valid");
        assert_eq!(
            (&*token, grant.fence, grant.deadline_ms),
            (&b"tok"[..], 9, 1000)
        );
        assert_eq!(
            (mode, limit, grant.owner(), grant.session()),
            (Mode::Shared, Some(3), Some(&b"host"[..]), None)
        );
        let args: [&[u8]; 2] = [b"9:0:X:0:250:8:1:w{w}s:1", b"tok"];
        let (_, grant, mode, _) = parse_hold_args(&args, |a| a).expect("a bound hold");
        assert_eq!(grant.deadline_ms, NO_DEADLINE);
        assert_eq!(grant.delay_ms(), 250);
        assert_eq!(grant.owner(), Some(&b"w"[..]));
        let binding = Binding {
            key: b"{w}s:1"[..].into(),
            fence: 8,
        };
        assert_eq!(grant.session(), Some(&binding));
        // What goes out comes back, byte for byte.
        let state = hold_state(&grant, mode, None);
        assert_eq!(state, args[0]);
        let again: [&[u8]; 2] = [&state, b"tok"];
        assert_eq!(parse_hold_args(&again, |a| a).map(|h| h.1), Ok(grant));
        for bad in [
            &b"9:1000:Q:3:0:0:0:"[..],
            b"9:1000:S:1000001:0:0:0:",
            b"9:1000:S:3:0:0:0",
            b"9:0:S:3:0:0:0:",
            b"0:1000:X:0:0:0:0:",
            b"9:1000:X:2:0:0:0:",
            b"9:1000:S:0:5:0:0:",
            b"9:1000:S:0:0:0:3:a\nb",
            b"9:1000:S:0:0:0:9:ab",
            b"9:1000:S:0:0:7:0:",
            b"9:1000:S:0:0:0:0:key",
        ] {
            assert!(
                parse_hold_args(&[bad, &b"tok"[..]], |a| a).is_err(),
                "{bad:?}"
            );
        }
        assert!(parse_hold_args(&[&b"9:1000:S:0:0:0:0:"[..], b""], |a| a).is_err());
    }

    fn apply(args: &[&[u8]]) -> Result<(u64, Option<Holder>), &'static CStr> {
        parse_apply_args(args, |a| a)
    }

    #[test]
    fn apply_effects_are_validated() {
        let tok = Some(Holder {
            token: b"tok"[..].into(),
            deadline_ms: 1000,
        });
        assert_eq!(apply(&[b"5:0", b""]), Ok((5, None)));
        assert_eq!(apply(&[b"5:1000", b"tok"]), Ok((5, tok.clone())));
        // As earlier versions wrote it.
        assert_eq!(apply(&[b"5", b"0", b""]), Ok((5, None)));
        assert_eq!(apply(&[b"5", b"1000", b"tok"]), Ok((5, tok)));
        for (f, d, t) in [
            (&b"x"[..], &b"1"[..], &b"t"[..]),
            (b"9007199254740992", b"1", b"t"),
            (b"5", b"0", b"t"),
            (b"5", b"99999999999999999", b"t"),
            (b"5", b"1", &[b'x'; 257][..]),
        ] {
            assert_eq!(apply(&[f, d, t]), Err(error::APPLY_ARGS));
            let state = [f, b":", d].concat();
            assert_eq!(apply(&[&state, t]), Err(error::APPLY_ARGS));
        }
        for malformed in [
            &[&b"5"[..], b"tok"][..],
            &[b"5:", b"tok"],
            &[b":1000", b"tok"],
            &[b"5:1000:1", b"tok"],
            &[b"5 1000", b"tok"],
            &[b"5:1000"],
            &[b"5", b"1000", b"tok", b"x"],
            &[],
        ] {
            assert_eq!(apply(malformed), Err(error::APPLY_ARGS), "{malformed:?}");
        }
    }

    #[test]
    fn apply_state_writes_every_u64_as_rust_does_and_reads_back() {
        let mut values = vec![0, 1, 9, 10, 99, 100, u64::MAX, u64::MAX - 1, 1 << 53];
        values.extend((0..20).map(|p| 10u64.pow(p)));
        values.extend((1..20).map(|p| 10u64.pow(p) - 1));
        values.extend((1..20).map(|p| 10u64.pow(p) + 1));
        values.extend(0..1000);
        let mut buf = [0u8; STATE_LEN];
        for &fence in &values {
            for deadline in [fence, u64::MAX - fence, 7] {
                let state = apply_state(fence, deadline, &mut buf);
                assert_eq!(state, format!("{fence}:{deadline}").as_bytes());
                let (f, d) = split_state(state).expect("a colon");
                assert_eq!((parse_u64(f), parse_u64(d)), (Some(fence), Some(deadline)));
            }
        }
    }
}
