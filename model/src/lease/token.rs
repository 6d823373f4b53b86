//! A holder's token as stored: the forms a lease keeps it in (raw, or the
//! 16 bytes that 32 lowercase hex digits or a lowercase UUID spell), the
//! `Token` that reads back as bytes whatever the form, and the comparison
//! that does not leak how much of a guess was right.

/// Longest token a caller may choose, in bytes.
pub const MAX_TOKEN_LEN: usize = 256;

/// A holder as it arrives from outside: an `LEASE.APPLY` effect, an RDB
/// value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub token: Box<[u8]>,
    /// Absolute unix ms; the lease is live while `now_ms < deadline_ms`.
    pub deadline_ms: u64,
}

/// The current holder of a stored lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HolderRef<'a> {
    pub token: Token<'a>,
    /// Absolute unix ms; the lease is live while `now_ms < deadline_ms`.
    pub deadline_ms: u64,
}

/// A stored token's bytes: borrowed from the lease, or rebuilt from its
/// compact form (see `Lease`). Reads as `&[u8]`.
#[derive(Clone, Copy)]
pub enum Token<'a> {
    Stored(&'a [u8]),
    Rebuilt { bytes: [u8; UUID_LEN], len: u8 },
}

impl std::ops::Deref for Token<'_> {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        match self {
            Token::Stored(bytes) => bytes,
            // ok: `expand` writes at most UUID_LEN bytes and says how many.
            Token::Rebuilt { bytes, len } => &bytes[..usize::from(*len)],
        }
    }
}

impl PartialEq for Token<'_> {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Token<'_> {}

impl std::fmt::Debug for Token<'_> {
    #[inline]
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token({} bytes)", self.len())
    }
}

/// Bytes stored inside the lease value: raw tokens up to this long, and
/// the 128 bits of a hex or UUID token.
pub(super) const INLINE_TOKEN: usize = 16;
const HEX_LEN: usize = 32;
const UUID_LEN: usize = 36;
/// Where a UUID's dashes are: `8-4-4-4-12`.
const UUID_DASHES: [usize; 4] = [8, 13, 18, 23];

/// How a token is kept: as given.
pub(super) const RAW: u64 = 0;
/// 32 lowercase hex digits (the module's own tokens, `uuid4().hex`, most
/// random-bytes-as-hex tokens), kept as the 16 bytes they spell.
pub(super) const HEX: u64 = 1;
/// A lowercase UUID with dashes, kept as its 16 bytes.
pub(super) const UUID: u64 = 2;

/// Each byte's value as a lowercase hex digit; 0xff for any other byte.
const HEX_VALUE: [u8; 256] = {
    let mut table = [0xff; 256];
    let mut i = 0;
    while i < 16 {
        table[b"0123456789abcdef"[i] as usize] = i as u8;
        i += 1;
    }
    table
};

/// The 16 bytes that 32 lowercase hex digits spell. One table lookup per
/// digit and no branch per digit: a non-digit's 0xff sets high bits that
/// no digit has, and they are checked once at the end.
fn pack_hex(digits: &[u8; HEX_LEN]) -> Option<[u8; INLINE_TOKEN]> {
    let mut out = [0u8; INLINE_TOKEN];
    let mut seen = 0u8;
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        let high = HEX_VALUE[usize::from(pair[0])];
        let low = HEX_VALUE[usize::from(pair[1])];
        seen |= high | low;
        *byte = high << 4 | low;
    }
    (seen < 16).then_some(out)
}

/// A token's compact form, if it has one: kind and 16 bytes.
pub(super) fn compact(token: &[u8]) -> Option<(u64, [u8; INLINE_TOKEN])> {
    if let Ok(digits) = <&[u8; HEX_LEN]>::try_from(token) {
        return pack_hex(digits).map(|b| (HEX, b));
    }
    let uuid = <&[u8; UUID_LEN]>::try_from(token).ok()?;
    if UUID_DASHES.iter().any(|&i| uuid[i] != b'-') {
        return None;
    }
    // The 8-4-4-4-12 groups without their dashes.
    let mut digits = [0u8; HEX_LEN];
    digits[..8].copy_from_slice(&uuid[..8]);
    digits[8..12].copy_from_slice(&uuid[9..13]);
    digits[12..16].copy_from_slice(&uuid[14..18]);
    digits[16..20].copy_from_slice(&uuid[19..23]);
    digits[20..].copy_from_slice(&uuid[24..]);
    pack_hex(&digits).map(|b| (UUID, b))
}

/// The token a compact form stands for.
pub(super) fn expand(kind: u64, packed: &[u8; INLINE_TOKEN]) -> Token<'static> {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut bytes = [0u8; UUID_LEN];
    let mut at = 0;
    // ok: 16 bytes make 32 digits, plus 4 dashes for a UUID: at most
    // UUID_LEN positions; a nibble indexes 16 digits.
    for (i, byte) in packed.iter().enumerate() {
        // A UUID's dashes come before its 5th, 7th, 9th and 11th byte.
        if kind == UUID && matches!(i, 4 | 6 | 8 | 10) {
            bytes[at] = b'-';
            at += 1;
        }
        bytes[at] = DIGITS[usize::from(byte >> 4)];
        bytes[at + 1] = DIGITS[usize::from(byte & 0xf)];
        at += 2;
    }
    Token::Rebuilt {
        bytes,
        len: at as u8,
    }
}

/// Compares tokens without an early exit on the first differing byte: the
/// token is a capability, and timing must not reveal how much of a guess was
/// right. The length is not secret.
pub fn tokens_equal(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison() {
        assert!(tokens_equal(b"abc", b"abc"));
        assert!(!tokens_equal(b"abc", b"abd"));
        assert!(!tokens_equal(b"abc", b"ab"));
        assert!(!tokens_equal(b"", b"a"));
    }

    #[test]
    fn compact_forms_take_exactly_lowercase_hex_digits() {
        let hex = b"0123456789abcdef0123456789abcdef".to_vec();
        let uuid = b"123e4567-e89b-12d3-a456-426614174000".to_vec();
        for (base, kind) in [(hex, HEX), (uuid, UUID)] {
            for at in 0..base.len() {
                for byte in 0..=255u8 {
                    let mut token = base.clone();
                    token[at] = byte;
                    let fits = if kind == UUID && UUID_DASHES.contains(&at) {
                        byte == b'-'
                    } else {
                        matches!(byte, b'0'..=b'9' | b'a'..=b'f')
                    };
                    let packed = compact(&token);
                    assert_eq!(packed.is_some(), fits, "{kind} byte {byte} at {at}");
                    if let Some((k, bytes)) = packed {
                        assert_eq!(k, kind);
                        assert_eq!(&expand(k, &bytes)[..], &token[..]);
                    }
                }
            }
        }
    }
}
