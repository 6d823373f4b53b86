//! The lease value as it is kept: 32 bytes for the usual tokens, the fence
//! sharing a word with the token's length and kind, the deadline with the
//! index mark, and the token inline, compact, in a buffer of its own, or
//! replaced by a pointer to the key's `Holds`.
//!
//! The one file of the lease with `unsafe` in it: which variant of the
//! token's union is the live one is written and read only here, through
//! methods the state machine and the views call. Miri runs these tests.

use crate::holds::{Grant, Holds};

use super::fence::FENCE_LIMIT;
use super::token::{
    compact, expand, tokens_equal, Holder, HolderRef, Token, INLINE_TOKEN, MAX_TOKEN_LEN, RAW,
};

const FENCE_BITS: u32 = 53;
const LEN_BITS: u32 = 9;
const KIND_SHIFT: u32 = FENCE_BITS + LEN_BITS;
/// Deadlines are below `MAX_DEADLINE_MS` < 2^44.
const DEADLINE_BITS: u32 = 44;
const DEADLINE_MASK: u64 = (1 << DEADLINE_BITS) - 1;
/// The index mark's distance field when no mark is kept.
const NO_MARK: u64 = (1 << (64 - DEADLINE_BITS)) - 1;
/// The kind beside `RAW`, `HEX` and `UUID`: not a token; the value points
/// to its `Holds` (shared or labelled holds).
const EXTENDED: u64 = 3;

/// The token's storage: inline (a raw token up to 16 bytes, or a compact
/// one), else a buffer of its own. The kind and length, kept beside the
/// fence, say which.
union TokenBytes {
    inline: [u8; INLINE_TOKEN],
    heap: std::mem::ManuallyDrop<Box<[u8]>>,
    extended: std::mem::ManuallyDrop<Box<Holds>>,
}

/// The value of a lease key: the last fence issued for the key, the holder
/// (token and deadline) if any, and where the deadline index holds the key.
///
/// 32 bytes in one allocation for the usual tokens, because a million
/// leases is a normal size: the fence (below 2^53) shares a word with the
/// token's length and kind, the deadline (below 2^44) with the index mark,
/// and a token of 32 lowercase hex digits or a lowercase UUID is kept as
/// the 16 bytes it spells (as Redis keeps a string that reads as an
/// integer as the integer). Other tokens up to 16 bytes are inline; longer
/// ones have a buffer of their own.
pub struct Lease {
    /// Fence in the low 53 bits, then the token's length (9 bits) and how
    /// it is kept (2 bits).
    fence_len: u64,
    /// Deadline in the low 44 bits (0 when free); above, how far before
    /// the deadline the index holds this key (`NO_MARK`: not known).
    deadline_mark: u64,
    token: TokenBytes,
}

impl Default for Lease {
    fn default() -> Self {
        Self {
            fence_len: 0,
            deadline_mark: NO_MARK << DEADLINE_BITS,
            token: TokenBytes {
                inline: [0; INLINE_TOKEN],
            },
        }
    }
}

impl Drop for Lease {
    #[inline]
    fn drop(&mut self) {
        self.drop_storage();
    }
}

/// A copy is a new value: same holds and fence, not yet in the index.
impl Clone for Lease {
    fn clone(&self) -> Self {
        match self.extended() {
            Some(holds) => {
                let mut copy = Self::from_holds(holds.clone(), self.fence());
                copy.set_deadline(self.deadline_ms());
                copy
            }
            None => Self::from_holder(self.holder(), self.fence()),
        }
    }
}

impl PartialEq for Lease {
    fn eq(&self, other: &Self) -> bool {
        self.fence() == other.fence()
            && self.holder() == other.holder()
            && match (self.extended(), other.extended()) {
                (None, None) => true,
                (Some(a), Some(b)) => {
                    a.mode() == b.mode() && a.limit() == b.limit() && a.by_grant() == b.by_grant()
                }
                _ => false,
            }
    }
}

impl Eq for Lease {}

impl std::fmt::Debug for Lease {
    #[inline]
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("fence", &self.fence())
            .field("deadline_ms", &self.deadline_ms())
            .field("token_len", &self.token_len())
            .field("index_mark", &self.index_mark())
            .finish()
    }
}

impl Lease {
    /// A lease record as stored: holder (if any), last fence.
    pub fn from_parts(holder: Option<Holder>, fence: u64) -> Self {
        let holder = holder.as_ref().map(|h| HolderRef {
            token: Token::Stored(&h.token),
            deadline_ms: h.deadline_ms,
        });
        Self::from_holder(holder, fence)
    }

    fn from_holder(holder: Option<HolderRef<'_>>, fence: u64) -> Self {
        let mut lease = Self::default();
        lease.set_fence(fence);
        if let Some(h) = holder {
            lease.set_holder(&h.token, h.deadline_ms);
        }
        lease
    }

    /// A lease with holds beyond the compact form, and its last fence.
    pub fn from_holds(holds: Holds, fence: u64) -> Self {
        let mut lease = Self::default();
        lease.set_fence(fence);
        let earliest = Self::next_look(&holds);
        lease.token = TokenBytes {
            extended: std::mem::ManuallyDrop::new(Box::new(holds)),
        };
        lease.fence_len = lease.fence() | EXTENDED << KIND_SHIFT;
        lease.set_deadline(earliest);
        lease
    }

    /// Frees what the token storage owns. The kind, length and storage are
    /// left as they were: every caller overwrites them or drops the lease.
    fn drop_storage(&mut self) {
        if self.token_on_heap() {
            // SAFETY: the kind and length say the buffer variant is the one
            // written (`set_holder` writes them together), and nothing reads
            // it after this: the caller overwrites or drops the storage.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.token.heap) };
        } else if self.token_kind() == EXTENDED {
            // SAFETY: the kind says the holds variant is the one written
            // (`from_holds`, `extend`), and nothing reads it after this.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.token.extended) };
        }
    }

    /// The holds, if this lease has left the compact form.
    #[inline]
    pub fn extended(&self) -> Option<&Holds> {
        // SAFETY: the kind says the holds variant is the one written.
        (self.token_kind() == EXTENDED).then(|| unsafe { &**self.token.extended })
    }

    #[inline]
    pub(super) fn extended_mut(&mut self) -> Option<&mut Holds> {
        // SAFETY: the kind says the holds variant is the one written.
        (self.token_kind() == EXTENDED).then(|| unsafe { &mut **self.token.extended })
    }

    #[inline]
    pub fn is_extended(&self) -> bool {
        self.token_kind() == EXTENDED
    }

    /// Moves a compact lease to the extended form: its holder, live or
    /// expired, becomes an exclusive hold with the key's fence.
    pub(super) fn extend(&mut self) {
        if self.is_extended() {
            return;
        }
        let mut holds = Holds::default();
        if let Some(h) = self.holder() {
            holds.insert(&h.token, Grant::new(self.fence(), h.deadline_ms));
        }
        let mark = self.index_mark();
        let deadline = self.deadline_ms();
        self.drop_storage();
        self.token = TokenBytes {
            extended: std::mem::ManuallyDrop::new(Box::new(holds)),
        };
        self.fence_len = self.fence() | EXTENDED << KIND_SHIFT;
        self.deadline_mark = deadline;
        self.set_index_mark(mark);
    }

    #[inline]
    fn token_len(&self) -> usize {
        ((self.fence_len >> FENCE_BITS) & ((1 << LEN_BITS) - 1)) as usize
    }

    #[inline]
    fn token_kind(&self) -> u64 {
        self.fence_len >> KIND_SHIFT
    }

    /// Whether the token lives in a buffer of its own.
    #[inline]
    fn token_on_heap(&self) -> bool {
        self.token_kind() == RAW && self.token_len() > INLINE_TOKEN
    }

    fn token(&self) -> Token<'_> {
        // SAFETY: the kind and length say which variant was written last
        // (`set_holder` writes them together): the buffer for a raw token
        // on the heap, the inline bytes otherwise.
        unsafe {
            match self.token_kind() {
                RAW if self.token_on_heap() => Token::Stored(&self.token.heap),
                // ok: a raw token not on the heap is at most INLINE_TOKEN long.
                RAW => Token::Stored(&self.token.inline[..self.token_len()]),
                EXTENDED => Token::Stored(&[]),
                kind => expand(kind, &self.token.inline),
            }
        }
    }

    #[inline]
    pub(super) fn deadline_ms(&self) -> u64 {
        self.deadline_mark & DEADLINE_MASK
    }

    #[inline]
    pub(super) fn set_fence(&mut self, fence: u64) {
        let fence = fence.min(FENCE_LIMIT - 1);
        self.fence_len = (self.fence_len & !(FENCE_LIMIT - 1)) | fence;
    }

    /// Moves the deadline, keeping the index mark where it was.
    #[inline]
    pub(super) fn set_deadline(&mut self, deadline_ms: u64) {
        let mark = self.index_mark();
        self.deadline_mark = deadline_ms.min(DEADLINE_MASK);
        self.set_index_mark(mark);
    }

    /// A token of at most `MAX_TOKEN_LEN` bytes (callers check) and its
    /// deadline; an empty token or a zero deadline leaves the lease free.
    pub(super) fn set_holder(&mut self, token: &[u8], deadline_ms: u64) {
        let (token, deadline_ms) = if token.is_empty() || deadline_ms == 0 {
            (&[][..], 0)
        } else {
            (&token[..token.len().min(MAX_TOKEN_LEN)], deadline_ms)
        };
        self.drop_storage();
        let kind = match compact(token) {
            Some((kind, inline)) => {
                self.token = TokenBytes { inline };
                kind
            }
            None if token.len() > INLINE_TOKEN => {
                self.token = TokenBytes {
                    heap: std::mem::ManuallyDrop::new(token.into()),
                };
                RAW
            }
            None => {
                let mut inline = [0; INLINE_TOKEN];
                // ok: this branch has token.len() <= INLINE_TOKEN.
                inline[..token.len()].copy_from_slice(token);
                self.token = TokenBytes { inline };
                RAW
            }
        };
        self.fence_len = self.fence() | (token.len() as u64) << FENCE_BITS | kind << KIND_SHIFT;
        self.set_deadline(deadline_ms);
    }

    /// The holder's deadline, live or expired; `None` when free. Reads no
    /// token, so the hot paths that only need the deadline never rebuild one.
    #[inline]
    pub fn deadline(&self) -> Option<u64> {
        Some(self.deadline_ms()).filter(|&d| d != 0)
    }

    /// Whether the live holder of a compact lease is `token`, at `now_ms`.
    #[inline]
    pub(super) fn held_by(&self, token: &[u8], now_ms: u64) -> bool {
        now_ms < self.deadline_ms() && self.holds(token)
    }

    /// Whether the stored token is `token`, live or not. A compact stored
    /// token is compared in its compact form, without rebuilding it.
    pub(super) fn holds(&self, token: &[u8]) -> bool {
        if token.len() != self.token_len() {
            return false;
        }
        match self.token_kind() {
            RAW => tokens_equal(&self.token(), token),
            kind => match compact(token) {
                // Both kinds are lowercase-only, so equal bytes and kind mean
                // an equal token.
                Some((k, bytes)) if k == kind => {
                    // SAFETY: a compact kind says the inline variant was
                    // written.
                    tokens_equal(&bytes, unsafe { &self.token.inline })
                }
                _ => false,
            },
        }
    }

    /// The stored holder of a compact lease, live or expired (for
    /// persistence); `None` when free or extended.
    #[inline]
    pub fn holder(&self) -> Option<HolderRef<'_>> {
        let deadline_ms = self.deadline_ms();
        (deadline_ms != 0 && !self.is_extended()).then(|| HolderRef {
            token: self.token(),
            deadline_ms,
        })
    }

    #[inline]
    pub fn fence(&self) -> u64 {
        self.fence_len & (FENCE_LIMIT - 1)
    }

    /// The holder as persisted and replicated: `(deadline_ms, token)`,
    /// `(0, "")` when free or extended (whose holds are persisted apart).
    #[inline]
    pub fn persisted_holder(&self) -> (u64, Token<'_>) {
        match self.is_extended() {
            false => (self.deadline_ms(), self.token()),
            true => (0, Token::Stored(&[])),
        }
    }

    /// Where the deadline index holds this key, if known: set by whoever
    /// inserts the entry, so a release removes it without a search for a
    /// deadline the lease has since moved past. Kept as a distance before
    /// the deadline; a renewal that carries the deadline more than about
    /// 17 minutes past the entry forgets the mark (the reaper then meets the
    /// entry when it falls due and drops it). A free lease has no mark.
    #[inline]
    pub fn index_mark(&self) -> Option<u64> {
        let distance = self.deadline_mark >> DEADLINE_BITS;
        let deadline_ms = self.deadline_ms();
        (distance != NO_MARK && deadline_ms != 0).then(|| deadline_ms - distance)
    }

    #[inline]
    pub fn set_index_mark(&mut self, at_ms: Option<u64>) {
        let distance = at_ms
            .and_then(|at| self.deadline_ms().checked_sub(at))
            .filter(|&d| d < NO_MARK)
            .unwrap_or(NO_MARK);
        self.deadline_mark = self.deadline_ms() | distance << DEADLINE_BITS;
    }

    /// The next time the reaper must look: the earliest own deadline of a
    /// hold, or the end of a lock-delay. What the deadline field of an
    /// extended lease holds.
    pub(super) fn next_look(holds: &Holds) -> u64 {
        let delay = Some(holds.delayed_until()).filter(|&d| d != 0);
        match (holds.earliest(), delay) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(0),
        }
    }

    /// Bytes owned by this value beyond the struct itself.
    #[inline]
    pub fn heap_size(&self) -> usize {
        if self.token_on_heap() {
            self.token_len()
        } else if let Some(holds) = self.extended() {
            std::mem::size_of::<Holds>() + holds.heap_size()
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{acquire, granted, key_with, renew, SHARED, T0};
    use super::*;
    use crate::holds::Unbound;
    use crate::lease::{Acquire, FenceSequence};

    #[test]
    fn a_lease_is_32_bytes() {
        assert_eq!(std::mem::size_of::<Lease>(), 32);
    }

    fn persisted(lease: &Lease) -> (u64, Vec<u8>) {
        let (deadline, token) = lease.persisted_holder();
        (deadline, token.to_vec())
    }

    /// Tokens of each storage form, and whether each needs a buffer of its own.
    fn token_cases() -> Vec<(Vec<u8>, bool)> {
        let hex = b"0123456789abcdef0123456789abcdef".to_vec();
        let uuid = b"123e4567-e89b-12d3-a456-426614174000".to_vec();
        let mut upper = hex.clone();
        upper[0] = b'A';
        let mut bad_dash = uuid.clone();
        bad_dash[8] = b'x';
        let mut dash_moved = uuid.clone();
        dash_moved.swap(8, 9);
        let mut cases = vec![
            (hex, false),
            (uuid, false),
            (b"ffffffffffffffffffffffffffffffff".to_vec(), false),
            (b"00000000-0000-0000-0000-000000000000".to_vec(), false),
            (upper, true),
            (bad_dash, true),
            (dash_moved, true),
            (b"0123456789abcdef0123456789abcde".to_vec(), true),
            (b"0123456789abcdef0123456789abcdef0".to_vec(), true),
        ];
        for len in [1, 15, 16, 17, 31, 32, 33, 36, 255, 256] {
            let raw: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8 | 0x80).collect();
            cases.push((raw, len > 16));
        }
        cases
    }

    #[test]
    fn tokens_of_every_form_round_trip() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        let mut cases = token_cases();
        // and back again, so each form replaces each other
        cases.extend(token_cases().into_iter().rev());
        for (now, (token, on_heap)) in (T0..).zip(cases) {
            let fence = granted(acquire(&mut lease, &token, 100, now, false, &mut seq));
            assert!(lease.is_live(now, &mut Unbound));
            let h = lease.holder().expect("held");
            assert_eq!((&h.token[..], h.deadline_ms), (&token[..], now + 100));
            assert_eq!(lease.fence(), fence);
            assert_eq!(persisted(&lease), (now + 100, token.clone()));
            let heap = if on_heap { token.len() } else { 0 };
            assert_eq!(
                lease.heap_size(),
                heap,
                "{:?}",
                String::from_utf8_lossy(&token)
            );
            let copy = lease.clone();
            assert_eq!(copy, lease);
            assert!(
                renew(&mut lease, &token, 100, now),
                "the stored form compares equal"
            );
            let mut other = token.clone();
            other[token.len() - 1] ^= 1;
            assert!(!renew(&mut lease, &other, 100, now), "one byte off");
            assert!(lease.release(&token, now, &mut Unbound).is_some());
            assert_eq!(persisted(&lease), (0, Vec::new()));
            assert_eq!(lease.fence(), fence, "release keeps the fence");
        }
    }

    #[test]
    fn from_parts_and_apply_store_what_they_are_given() {
        let long = Holder {
            token: vec![9u8; 100].into(),
            deadline_ms: T0,
        };
        let mut lease = Lease::from_parts(Some(long.clone()), FENCE_LIMIT - 1);
        assert_eq!(lease.fence(), FENCE_LIMIT - 1);
        assert_eq!(persisted(&lease), (T0, long.token.to_vec()));
        lease.apply(None, 7);
        assert_eq!((lease.fence(), lease.holder()), (7, None));
        lease.apply(Some(long), 8);
        assert_eq!(lease.holder().map(|h| h.token.len()), Some(100));
        assert_eq!(
            lease,
            Lease::from_parts(
                lease.holder().map(|h| Holder {
                    token: h.token.to_vec().into(),
                    deadline_ms: h.deadline_ms,
                }),
                8
            )
        );
    }

    #[test]
    fn index_mark_follows_renewals_until_it_cannot() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        assert_eq!(lease.index_mark(), None, "a free lease has no mark");
        granted(acquire(&mut lease, b"a", 1000, T0, false, &mut seq));
        assert_eq!(lease.index_mark(), None, "a new grant is not indexed yet");
        lease.set_index_mark(Some(T0 + 1000));
        assert!(renew(&mut lease, b"a", 60_000, T0 + 500));
        assert_eq!(
            lease.index_mark(),
            Some(T0 + 1000),
            "renewal keeps the entry"
        );
        assert!(matches!(
            acquire(&mut lease, b"a", 90_000, T0 + 600, false, &mut seq),
            Ok(Acquire::Retried { .. })
        ));
        assert_eq!(lease.index_mark(), Some(T0 + 1000));
        // a mark after the deadline or too far before it is not kept
        lease.set_index_mark(Some(T0 + 600 + 90_001));
        assert_eq!(lease.index_mark(), None);
        lease.set_index_mark(Some(T0 + 1000));
        assert!(renew(&mut lease, b"a", 3_600_000, T0 + 700));
        assert_eq!(lease.index_mark(), None, "17+ minutes past the entry");
        lease.set_index_mark(Some(T0 + 700 + 3_600_000));
        assert_eq!(lease.clone().index_mark(), None, "a copy is not indexed");
        assert!(lease.release(b"a", T0 + 800, &mut Unbound).is_some());
        assert_eq!(lease.index_mark(), None);
    }

    #[test]
    fn an_exclusive_lease_stays_32_bytes_and_a_copy_is_deep() {
        assert_eq!(std::mem::size_of::<Lease>(), 32);
        let mut fences = FenceSequence::new();
        let lease = key_with(&[(b"a", SHARED), (b"b", SHARED)], &mut fences);
        let copy = lease.clone();
        drop(lease);
        assert_eq!(copy.live_holds(T0, &mut Unbound).len(), 2);
        assert_eq!(copy.shared_holds(), 2);
        assert!(copy.heap_size() > 0);
    }
}
