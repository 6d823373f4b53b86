//! Decoding of persisted values (RDB, `RESTORE`, full sync), independent of
//! where the bytes come from: the module types read through Redis's IO API,
//! the fuzz targets through a plain byte reader. Every value read is
//! checked; anything out of range refuses the load instead of building a
//! lease the rest of the module would trust.

use crate::model::lease::{
    Holder, Lease, Resource, FENCE_LIMIT, MAX_DEADLINE_MS, MAX_TOKEN_LEN, MAX_TTL_MS,
};

/// The encoding version this build writes and reads.
pub const ENCODING_VERSION: i32 = 1;

/// A source of the primitive values module types persist.
pub trait Reader {
    /// `None` on a short or broken read.
    fn unsigned(&mut self) -> Option<u64>;
    fn buffer(&mut self) -> Option<Box<[u8]>>;
}

/// lease-key, version 1: `fence`, `deadline_ms` (0 when free), `token`
/// (empty when free).
///
/// `now_ms` bounds the deadline: no grant reaches past now + the longest
/// ttl, so a later deadline is a crafted or corrupt value, as is a deadline
/// without a token.
pub fn decode_lease(r: &mut impl Reader, encver: i32, now_ms: u64) -> Result<Lease, &'static str> {
    if encver != ENCODING_VERSION {
        return Err("a lease-key of an unknown encoding version");
    }
    let fence = r.unsigned().ok_or("a truncated lease-key")?;
    let deadline_ms = r.unsigned().ok_or("a truncated lease-key")?;
    let token = r.buffer().ok_or("a truncated lease-key")?;
    if fence >= FENCE_LIMIT {
        return Err("a lease-key whose fence is not below 2^53");
    }
    if token.len() > MAX_TOKEN_LEN {
        return Err("a lease-key whose token is longer than 256 bytes");
    }
    let latest = now_ms.saturating_add(MAX_TTL_MS).min(MAX_DEADLINE_MS);
    let holder = match (token.is_empty(), deadline_ms) {
        (true, 0) => None,
        (true, _) => return Err("a lease-key with a deadline but no token"),
        (false, d) if d == 0 || d > latest => {
            return Err("a lease-key with an impossible deadline")
        }
        (false, _) => Some(Holder { token, deadline_ms }),
    };
    Ok(Lease::from_parts(holder, fence))
}

/// fence-rec, version 1: `highest`.
pub fn decode_resource(r: &mut impl Reader, encver: i32) -> Result<Resource, &'static str> {
    if encver != ENCODING_VERSION {
        return Err("a fence-rec of an unknown encoding version");
    }
    match r.unsigned() {
        Some(highest) if highest < FENCE_LIMIT => Ok(Resource::new(highest)),
        Some(_) => Err("a fence-rec whose fence is not below 2^53"),
        None => Err("a truncated fence-rec"),
    }
}

/// The fence sequence's aux field, version 1: `last`.
pub fn decode_sequence(r: &mut impl Reader, encver: i32) -> Result<u64, &'static str> {
    if encver != ENCODING_VERSION {
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

    /// Values queued in order; `None` plays a short read.
    struct Queue(Vec<Option<Value>>);

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
