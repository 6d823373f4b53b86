//! Argument parsing for the LEASE commands, on plain byte slices: client
//! input is untrusted bytes, and this is the code the fuzz targets drive.

use std::ffi::CStr;

use crate::error;
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

pub fn parse_ttl(b: &[u8]) -> Result<u64, &'static CStr> {
    parse_u64(b)
        .filter(|v| (1..=MAX_TTL_MS).contains(v))
        .ok_or(error::TTL)
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
}

/// Parses ttl and options; each option at most once, in any order, any case.
pub fn parse_acquire<'a, T>(
    ttl: &[u8],
    options: &'a [T],
    bytes: impl Fn(&'a T) -> &'a [u8],
) -> Result<Acquire<'a, T>, &'static CStr> {
    let mut parsed = Acquire {
        ttl_ms: parse_ttl(ttl)?,
        token: None,
        block_ms: None,
    };
    let mut rest = options;
    while let [option, value, tail @ ..] = rest {
        let option = bytes(option);
        if option.eq_ignore_ascii_case(b"TOKEN") && parsed.token.is_none() {
            check_token(bytes(value))?;
            parsed.token = Some(value);
        } else if option.eq_ignore_ascii_case(b"BLOCK") && parsed.block_ms.is_none() {
            let timeout = parse_u64(bytes(value)).filter(|v| *v <= MAX_TTL_MS);
            parsed.block_ms = Some(timeout.ok_or(error::BLOCK_TIMEOUT)?);
        } else {
            return Err(error::ACQUIRE_SYNTAX);
        }
        rest = tail;
    }
    if !rest.is_empty() {
        return Err(error::ACQUIRE_SYNTAX);
    }
    Ok(parsed)
}

/// `LEASE.APPLY key fence deadline token`, after the key: the state a master
/// or the AOF sends. An empty token means free.
pub fn parse_apply(
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
        assert!(parse_ttl(b"0").is_err());
        assert_eq!(parse_ttl(b"1"), Ok(1));
        assert_eq!(parse_ttl(b"1099511627776"), Ok(MAX_TTL_MS));
        assert!(parse_ttl(b"1099511627777").is_err());
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
    fn apply_effects_are_validated() {
        assert_eq!(parse_apply(b"5", b"0", b""), Ok((5, None)));
        assert_eq!(
            parse_apply(b"5", b"1000", b"tok"),
            Ok((
                5,
                Some(Holder {
                    token: b"tok"[..].into(),
                    deadline_ms: 1000
                })
            ))
        );
        for (f, d, t) in [
            (&b"x"[..], &b"1"[..], &b"t"[..]),
            (b"9007199254740992", b"1", b"t"),
            (b"5", b"0", b"t"),
            (b"5", b"99999999999999999", b"t"),
            (b"5", b"1", &[b'x'; 257][..]),
        ] {
            assert_eq!(parse_apply(f, d, t), Err(error::APPLY_ARGS));
        }
    }
}
