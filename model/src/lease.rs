//! The lease state machine and the fence sequence.
//!
//! Pure logic: time comes in as `now_ms` (unix milliseconds) and nothing here
//! touches Redis, so every rule is unit-tested on an injected clock. The glue
//! in `commands.rs` opens keys, calls these methods and turns the outcomes
//! into replies, replication and notifications.

use std::collections::{HashMap, VecDeque};

use crate::holds::{
    Binding, Grant, Hold, Holds, Mode, Refused, SessionState, Sessions, Terms, NO_DEADLINE,
};

/// Longest lease a caller may ask for, in milliseconds (about 34 years).
pub const MAX_TTL_MS: u64 = 1 << 40;
/// Longest token a caller may choose, in bytes.
pub const MAX_TOKEN_LEN: usize = 256;
/// Fences stay below 2^53 so that JavaScript clients read them exactly.
pub const FENCE_LIMIT: u64 = 1 << 53;
/// Fences issued per millisecond of wall clock before the sequence runs
/// ahead of the clock floor. 2^53 / 1024 ms reaches the year 2248.
pub const FENCES_PER_MS: u64 = 1024;
/// How far above its clock floor an observed fence may carry the sequence:
/// 30 days of fences, far more than any clock skew between nodes.
pub const MAX_AHEAD: u64 = 30 * 86_400_000 * FENCES_PER_MS;
/// Deadlines are unix milliseconds; anything past this is corrupt input.
pub const MAX_DEADLINE_MS: u64 = FENCE_LIMIT / FENCES_PER_MS + MAX_TTL_MS;

/// The node-wide fence sequence: every grant on this node, for any key, takes
/// the next value, so a key's fences rise across release, expiry, `DEL`,
/// restart and promotion without per-key bookkeeping.
///
/// `next = max(last + 1, now_ms * 1024)`. The clock floor is what keeps fences
/// rising where `last` was lost (an AOF rewritten without its preamble, a
/// replica promoted before it saw the last grants): it assumes the wall clock
/// of the node that issues next is not behind the clock of the node that
/// issued before, by more than the grants made in between.
///
/// What the sequence observes from outside (a restored key, a master's
/// effect, RDB aux data) raises it at most `MAX_AHEAD` above this node's
/// clock floor: one crafted or corrupt fence near 2^53 would otherwise end
/// every grant on the node for good. A grant's fence is also above the
/// key's own last fence, so a key that carries a fence from a node whose
/// clock ran further ahead still sees its fences rise.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FenceSequence {
    last: u64,
}

/// The sequence would pass 2^53; no grant can be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceExhausted;

impl FenceSequence {
    pub const fn new() -> Self {
        Self { last: 0 }
    }

    /// The highest fence issued or observed.
    #[inline]
    pub fn last(&self) -> u64 {
        self.last
    }

    /// Issues the next fence for a key whose last fence is `key_fence`.
    pub fn next(&mut self, key_fence: u64, now_ms: u64) -> Result<u64, FenceExhausted> {
        let floor = now_ms.saturating_mul(FENCES_PER_MS);
        let from_sequence = self.last.saturating_add(1).max(floor);
        let fence = from_sequence.max(key_fence.saturating_add(1));
        if fence >= FENCE_LIMIT {
            return Err(FenceExhausted);
        }
        // A fence taken from the key's own, beyond the ceiling, stays the
        // key's: the sequence moves no further than an observation would.
        self.last = fence.min(Self::ceiling(now_ms).max(from_sequence));
        Ok(fence)
    }

    /// Raises the sequence to at least `fence`, up to `MAX_AHEAD` above the
    /// clock floor: a fence seen in replication, in an AOF, in RDB aux data
    /// or in a restored key was issued somewhere, and the next grant here
    /// must be above it.
    #[inline]
    pub fn observe(&mut self, fence: u64, now_ms: u64) {
        self.last = self.last.max(fence.min(Self::ceiling(now_ms)));
    }

    /// The most an observation may raise the sequence to at `now_ms`.
    fn ceiling(now_ms: u64) -> u64 {
        now_ms
            .saturating_mul(FENCES_PER_MS)
            .saturating_add(MAX_AHEAD)
            .min(FENCE_LIMIT - 1)
    }
}

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
const INLINE_TOKEN: usize = 16;
const HEX_LEN: usize = 32;
const UUID_LEN: usize = 36;
/// Where a UUID's dashes are: `8-4-4-4-12`.
const UUID_DASHES: [usize; 4] = [8, 13, 18, 23];

/// How a token is kept: as given.
const RAW: u64 = 0;
/// 32 lowercase hex digits (the module's own tokens, `uuid4().hex`, most
/// random-bytes-as-hex tokens), kept as the 16 bytes they spell.
const HEX: u64 = 1;
/// A lowercase UUID with dashes, kept as its 16 bytes.
const UUID: u64 = 2;
/// Not a token: the value points to its `Holds` (shared or labelled holds).
const EXTENDED: u64 = 3;

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
fn compact(token: &[u8]) -> Option<(u64, [u8; INLINE_TOKEN])> {
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
fn expand(kind: u64, packed: &[u8; INLINE_TOKEN]) -> Token<'static> {
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

const FENCE_BITS: u32 = 53;
const LEN_BITS: u32 = 9;
const KIND_SHIFT: u32 = FENCE_BITS + LEN_BITS;
/// Deadlines are below `MAX_DEADLINE_MS` < 2^44.
const DEADLINE_BITS: u32 = 44;
const DEADLINE_MASK: u64 = (1 << DEADLINE_BITS) - 1;
/// The index mark's distance field when no mark is kept.
const NO_MARK: u64 = (1 << (64 - DEADLINE_BITS)) - 1;

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

/// What `Lease::acquire` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// A new grant with a new fence.
    Granted { fence: u64 },
    /// The same token asked again while holding: deadline moved, same fence.
    Retried { fence: u64 },
    /// Held by another token, or free with waiters queued ahead of the caller.
    Busy,
}

/// What a caller may see of a lease: never the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// `ttl_ms`: until no hold is left.
    Held {
        ttl_ms: u64,
    },
    /// No hold, and no grant for `ttl_ms` (a lock-delay).
    Delayed {
        ttl_ms: u64,
    },
    Free,
}

/// `LEASE.INFO`'s fields beyond state and ttl.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View<'a> {
    /// `None` when free.
    pub mode: Option<Mode>,
    pub holders: usize,
    pub limit: Option<u32>,
    /// The exclusive holder's label.
    pub owner: Option<&'a [u8]>,
    /// The session key the exclusive hold is bound to.
    pub session: Option<&'a [u8]>,
}

/// One live hold as `LEASE.HOLDERS` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveHold<'a> {
    pub fence: u64,
    /// When it ends as things stand (its own deadline or its session's).
    pub deadline_ms: u64,
    pub mode: Mode,
    pub owner: Option<&'a [u8]>,
    pub session: Option<&'a [u8]>,
}

/// The holds a grant replaced because they were not live: counted and
/// announced as expiries, and unbound from their sessions.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Replaced {
    pub count: usize,
    /// Each with when it ended (empty for a compact lease's holder).
    pub holds: Vec<(Hold, u64)>,
}

impl Replaced {
    fn compact(replaced: bool) -> Self {
        Self {
            count: usize::from(replaced),
            holds: Vec::new(),
        }
    }

    fn ended(holds: Vec<Hold>, now_ms: u64, sessions: &mut impl Sessions) -> Self {
        let holds: Vec<(Hold, u64)> = holds
            .into_iter()
            .map(|h| {
                let at = h.grant.ended_at(now_ms, sessions).unwrap_or(now_ms);
                (h, at)
            })
            .collect();
        Self {
            count: holds.len(),
            holds,
        }
    }
}

/// What `renew_hold` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renew {
    Renewed,
    /// No live hold of that token: refused, as version 1 refuses.
    NotHeld,
    /// A ttl of 0 for a hold bound to no session: an error.
    ZeroTtlUnbound,
}

/// Why a lease cannot be a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotSession {
    NoLiveSession,
    Shared,
    Bound,
}

/// An extended lease as persisted and replicated whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persisted {
    pub mode: Mode,
    pub limit: Option<u32>,
    pub delayed_until: u64,
    pub holds: Vec<Hold>,
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
    fn extended_mut(&mut self) -> Option<&mut Holds> {
        // SAFETY: the kind says the holds variant is the one written.
        (self.token_kind() == EXTENDED).then(|| unsafe { &mut **self.token.extended })
    }

    #[inline]
    pub fn is_extended(&self) -> bool {
        self.token_kind() == EXTENDED
    }

    /// Moves a compact lease to the extended form: its holder, live or
    /// expired, becomes an exclusive hold with the key's fence.
    fn extend(&mut self) {
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
    fn deadline_ms(&self) -> u64 {
        self.deadline_mark & DEADLINE_MASK
    }

    #[inline]
    fn set_fence(&mut self, fence: u64) {
        let fence = fence.min(FENCE_LIMIT - 1);
        self.fence_len = (self.fence_len & !(FENCE_LIMIT - 1)) | fence;
    }

    /// Moves the deadline, keeping the index mark where it was.
    #[inline]
    fn set_deadline(&mut self, deadline_ms: u64) {
        let mark = self.index_mark();
        self.deadline_mark = deadline_ms.min(DEADLINE_MASK);
        self.set_index_mark(mark);
    }

    /// A token of at most `MAX_TOKEN_LEN` bytes (callers check) and its
    /// deadline; an empty token or a zero deadline leaves the lease free.
    fn set_holder(&mut self, token: &[u8], deadline_ms: u64) {
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

    /// Whether any hold is live at `now_ms`.
    #[inline]
    pub fn is_live(&self, now_ms: u64, sessions: &mut impl Sessions) -> bool {
        match self.extended() {
            None => now_ms < self.deadline_ms(),
            Some(holds) => holds.live(now_ms, self.deadline_ms(), sessions) > 0,
        }
    }

    /// Whether a hold's deadline (or a lock-delay's end) has passed without
    /// its being dealt with: what the reaper is for. Bound holds whose
    /// session ended are the session's reaping, not this.
    #[inline]
    pub fn has_expired_hold(&self, now_ms: u64) -> bool {
        let deadline = self.deadline_ms();
        deadline != 0
            && now_ms >= deadline
            && self.extended().map_or(true, |h| {
                h.iter().any(|(_, g)| !g.own_live(now_ms))
                    || (h.delayed_until() != 0 && now_ms >= h.delayed_until())
            })
    }

    /// Until when a lock-delay keeps the key from any grant, if it does.
    #[inline]
    pub fn delayed(&self, now_ms: u64, sessions: &mut impl Sessions) -> Option<u64> {
        let holds = self.extended()?;
        Some(holds.delay_end(now_ms, sessions)).filter(|&until| now_ms < until)
    }

    /// Whether the live holder of a compact lease is `token`, at `now_ms`.
    #[inline]
    fn held_by(&self, token: &[u8], now_ms: u64) -> bool {
        now_ms < self.deadline_ms() && self.holds(token)
    }

    /// Whether the stored token is `token`, live or not. A compact stored
    /// token is compared in its compact form, without rebuilding it.
    fn holds(&self, token: &[u8]) -> bool {
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

    pub fn state(&self, now_ms: u64, sessions: &mut impl Sessions) -> State {
        let last = match self.extended() {
            None => Some(self.deadline_ms()).filter(|&d| now_ms < d),
            Some(holds) => holds.latest_live(now_ms, sessions),
        };
        match last {
            Some(deadline) => State::Held {
                ttl_ms: deadline - now_ms,
            },
            None => match self.delayed(now_ms, sessions) {
                Some(until) => State::Delayed {
                    ttl_ms: until - now_ms,
                },
                None => State::Free,
            },
        }
    }

    /// What `LEASE.INFO` shows beyond state and ttl.
    pub fn view(&self, now_ms: u64, sessions: &mut impl Sessions) -> View<'_> {
        match self.extended() {
            None => {
                let live = now_ms < self.deadline_ms();
                View {
                    mode: live.then_some(Mode::Exclusive),
                    holders: usize::from(live),
                    limit: None,
                    owner: None,
                    session: None,
                }
            }
            Some(holds) => {
                let holders = holds.live(now_ms, self.deadline_ms(), sessions);
                let exclusive = match holds.mode() {
                    Mode::Exclusive if holders > 0 => holds
                        .iter()
                        .find(|(_, g)| g.is_live(now_ms, sessions))
                        .map(|(_, g)| g),
                    _ => None,
                };
                View {
                    mode: (holders > 0).then_some(holds.mode()),
                    holders,
                    limit: holds.limit(),
                    owner: exclusive.and_then(Grant::owner),
                    session: exclusive.and_then(|g| g.session()).map(|b| &*b.key),
                }
            }
        }
    }

    /// The live holds, oldest grant first.
    pub fn live_holds(&self, now_ms: u64, sessions: &mut impl Sessions) -> Vec<LiveHold<'_>> {
        match self.extended() {
            None => self
                .holder()
                .filter(|h| now_ms < h.deadline_ms)
                .map(|h| LiveHold {
                    fence: self.fence(),
                    deadline_ms: h.deadline_ms,
                    mode: Mode::Exclusive,
                    owner: None,
                    session: None,
                })
                .into_iter()
                .collect(),
            Some(holds) => holds
                .by_grant()
                .into_iter()
                .filter_map(|(_, g)| {
                    let until = g.until(now_ms, sessions)?;
                    Some(LiveHold {
                        fence: g.fence,
                        deadline_ms: until,
                        mode: holds.mode(),
                        owner: g.owner(),
                        session: g.session().map(|b| &*b.key),
                    })
                })
                .collect(),
        }
    }

    /// Stored shared holds, live or not (the `lease_shared_holds` gauge).
    #[inline]
    pub fn shared_holds(&self) -> usize {
        self.extended()
            .filter(|h| h.mode() == Mode::Shared)
            .map_or(0, Holds::len)
    }

    /// Stored holds bound to a session (the `lease_bound_holds` gauge).
    #[inline]
    pub fn bound_holds(&self) -> usize {
        self.extended().map_or(0, Holds::bound)
    }

    /// What a session's key says of its grant with `fence`: live (until
    /// when), ended (when), or `None` when the key has no grant with that
    /// fence any more.
    pub fn session_state(&self, fence: u64, now_ms: u64) -> Option<SessionState> {
        let deadline = match self.extended() {
            None => self.holder().filter(|_| self.fence() == fence)?.deadline_ms,
            Some(holds) => {
                let (_, g) = holds.iter().find(|(_, g)| g.fence == fence)?;
                if holds.mode() != Mode::Exclusive || g.session().is_some() {
                    return None;
                }
                g.deadline_ms
            }
        };
        Some(if now_ms < deadline {
            SessionState::Live {
                deadline_ms: deadline,
            }
        } else {
            SessionState::Ended { at_ms: deadline }
        })
    }

    /// Whether `token` holds a live exclusive hold fit to be a session:
    /// its fence, or why not.
    pub fn as_session(&self, token: &[u8], now_ms: u64) -> Result<u64, NotSession> {
        match self.extended() {
            None if self.held_by(token, now_ms) => Ok(self.fence()),
            None => Err(NotSession::NoLiveSession),
            Some(holds) => {
                let grant = holds
                    .get(token)
                    .filter(|g| g.own_live(now_ms))
                    .ok_or(NotSession::NoLiveSession)?;
                if holds.mode() == Mode::Shared {
                    Err(NotSession::Shared)
                } else if grant.session().is_some() {
                    Err(NotSession::Bound)
                } else {
                    Ok(grant.fence)
                }
            }
        }
    }

    /// The next time the reaper must look: the earliest own deadline of a
    /// hold, or the end of a lock-delay.
    fn next_look(holds: &Holds) -> u64 {
        let delay = Some(holds.delayed_until()).filter(|&d| d != 0);
        match (holds.earliest(), delay) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(0),
        }
    }

    /// The earliest deadline of any hold after `deadline` moved to a new one.
    #[inline]
    fn lower_earliest(&mut self, deadline_ms: u64) {
        if deadline_ms == NO_DEADLINE {
            return;
        }
        let earliest = self.deadline_ms();
        if earliest == 0 || deadline_ms < earliest {
            self.set_deadline(deadline_ms);
        }
    }

    /// Grants a hold on the terms asked (mode, limit, owner, session,
    /// delay), or repeats the grant to a token that holds it. `waiting`
    /// says clients wait for this key; `queue_ahead` that one of them is
    /// ahead of this caller, who then gets `Busy` for a hold the queue is
    /// owed. A `ttl_ms` of 0 (with a session) is no deadline of its own.
    /// Also returns the holds that were not live and the grant replaced.
    #[allow(clippy::too_many_arguments)]
    pub fn acquire_on(
        &mut self,
        token: &[u8],
        ttl_ms: u64,
        terms: Terms,
        now_ms: u64,
        waiting: bool,
        queue_ahead: bool,
        max_holders: usize,
        fences: &mut FenceSequence,
        sessions: &mut impl Sessions,
    ) -> Result<(Acquire, Replaced), Refused> {
        let deadline_ms = match ttl_ms {
            0 => NO_DEADLINE,
            ttl => now_ms.saturating_add(ttl),
        };
        if !self.is_extended() && terms.is_plain() {
            // A grant over a holder is a grant over an expired one.
            let had_holder = self.deadline().is_some();
            return self
                .acquire(token, ttl_ms, now_ms, queue_ahead, fences)
                .map(|a| {
                    let replaced = had_holder && matches!(a, Acquire::Granted { .. });
                    (a, Replaced::compact(replaced))
                })
                .map_err(|_| Refused::FenceExhausted);
        }
        let binding = terms.session.map(|(key, fence)| Binding {
            key: key.into(),
            fence,
        });
        // What the key is, read alike from either form: decided before any
        // change, so a refusal or a busy key is left exactly as it was.
        let (mode, limit, live, own, delayed) = match self.extended() {
            None => {
                let live = now_ms < self.deadline_ms();
                let own = (live && self.holds(token)).then(|| (self.fence(), None));
                (Mode::Exclusive, None, usize::from(live), own, false)
            }
            Some(holds) => {
                let own = holds
                    .get(token)
                    .filter(|g| g.is_live(now_ms, sessions))
                    .map(|g| (g.fence, g.session().cloned()));
                let live = holds.live(now_ms, self.deadline_ms(), sessions);
                let delayed = now_ms < holds.delay_end(now_ms, sessions);
                (holds.mode(), holds.limit(), live, own, delayed)
            }
        };
        if let Some((fence, bound_to)) = own {
            if mode != terms.mode {
                return Err(Refused::OtherMode);
            }
            if limit != terms.limit {
                return Err(Refused::LimitMismatch(limit));
            }
            if binding.is_some() && binding != bound_to {
                return Err(Refused::OtherSession);
            }
            if ttl_ms == 0 && bound_to.is_none() {
                return Err(Refused::NoDeadlineUnbound);
            }
            self.extend();
            if let Some(holds) = self.extended_mut() {
                if let Some(mut grant) = holds.get(token).cloned() {
                    grant.deadline_ms = deadline_ms;
                    if let Some(owner) = terms.owner {
                        grant.set_owner(owner);
                    }
                    holds.insert(token, grant);
                }
            }
            self.lower_earliest(deadline_ms);
            return Ok((Acquire::Retried { fence }, Replaced::default()));
        }
        if (live > 0 || waiting) && limit != terms.limit {
            return Err(Refused::LimitMismatch(limit));
        }
        let room = terms.limit.map_or(usize::MAX, |n| n as usize);
        let busy = queue_ahead
            || delayed
            || (live > 0 && (mode == Mode::Exclusive || terms.mode == Mode::Exclusive))
            || live >= room;
        if busy {
            return Ok((Acquire::Busy, Replaced::default()));
        }
        if live >= max_holders {
            return Err(Refused::TooManyHolders);
        }
        let fence = fences
            .next(self.fence(), now_ms)
            .map_err(|_| Refused::FenceExhausted)?;
        self.extend();
        // ok: `extend` just made the holds.
        let Some(holds) = self.extended_mut() else {
            return Ok((Acquire::Busy, Replaced::default()));
        };
        let replaced = match terms.mode {
            Mode::Exclusive => holds.clear(),
            Mode::Shared => holds
                .remove(token)
                .map(|grant| Hold {
                    token: token.into(),
                    grant,
                })
                .into_iter()
                .collect(),
        };
        let replaced = Replaced::ended(replaced, now_ms, sessions);
        holds.set_delayed_until(0);
        if terms.is_plain() {
            // Nothing beyond what version 1 keeps: back to the compact form.
            self.set_fence(fence);
            self.set_holder(token, deadline_ms);
            return Ok((Acquire::Granted { fence }, replaced));
        }
        holds.set_terms(terms.mode, terms.limit);
        let grant = Grant::with(
            fence,
            deadline_ms,
            terms.owner.map(Into::into),
            binding,
            terms.delay_ms,
        );
        holds.insert(token, grant);
        // An exclusive hold is the only one: the next look is its deadline
        // (none for a hold that lives as long as its session). A shared one
        // only lowers it, without a walk over the others.
        let exclusive = terms.mode == Mode::Exclusive;
        let next = exclusive.then(|| Self::next_look(holds));
        self.set_fence(fence);
        match next {
            Some(next) => self.set_deadline(next),
            None => self.lower_earliest(deadline_ms),
        }
        Ok((Acquire::Granted { fence }, replaced))
    }

    /// Removes every hold of an extended lease that is not live (its own
    /// deadline passed, or its session ended); returns them with when each
    /// ended. The next look is then exact again.
    pub fn prune(&mut self, now_ms: u64, sessions: &mut impl Sessions) -> Vec<(Hold, u64)> {
        let Some(holds) = self.extended_mut() else {
            return Vec::new();
        };
        let ended = holds.prune(now_ms, sessions);
        if holds.delayed_until() <= now_ms {
            holds.set_delayed_until(0);
        }
        let next = Self::next_look(holds);
        self.set_deadline(next);
        ended
    }

    /// Makes an extended lease's next look exact again: a release or a
    /// renewal of the hold that had the earliest deadline leaves an earlier
    /// one, which costs only a look too soon, until this.
    #[inline]
    pub fn refresh_earliest(&mut self) {
        if let Some(holds) = self.extended() {
            let next = Self::next_look(holds);
            self.set_deadline(next);
        }
    }

    /// A master's effect: `token`'s hold is `grant`, on the key's terms
    /// `mode` and `limit` (an exclusive hold is the only one). Returns the
    /// holds it replaced.
    pub fn apply_hold(
        &mut self,
        token: &[u8],
        grant: Grant,
        mode: Mode,
        limit: Option<u32>,
    ) -> Vec<Hold> {
        self.extend();
        let fence = self.fence().max(grant.fence);
        let deadline_ms = grant.deadline_ms;
        let mut replaced = Vec::new();
        if let Some(holds) = self.extended_mut() {
            if mode == Mode::Exclusive {
                // Every hold goes, the token's own too (its binding with it).
                replaced = holds.clear();
            }
            holds.set_terms(mode, limit);
            holds.set_delayed_until(0);
            if let Some(old) = holds.insert(token, grant) {
                replaced.push(Hold {
                    token: token.into(),
                    grant: old,
                });
            }
        }
        self.set_fence(fence);
        if mode == Mode::Exclusive {
            self.set_deadline(if deadline_ms == NO_DEADLINE {
                0
            } else {
                deadline_ms
            });
        } else {
            self.lower_earliest(deadline_ms);
        }
        replaced
    }

    /// A `LEASE.RELEASE` replayed from a master or the AOF: the effect of a
    /// release where it was decided, `token`'s hold gone whatever this
    /// node's clock says. Returns the holds gone and whether others stay
    /// (else the key goes).
    #[inline]
    pub fn replay_release(&mut self, token: &[u8]) -> (Vec<Hold>, bool) {
        let gone = self.apply_drop([token]);
        let stays = self.extended().is_some_and(|h| !h.is_empty());
        (gone, stays)
    }

    /// A master's effect: these holds are gone (released or ended); returns
    /// them.
    pub fn apply_drop<'a>(&mut self, tokens: impl IntoIterator<Item = &'a [u8]>) -> Vec<Hold> {
        let Some(holds) = self.extended_mut() else {
            return Vec::new();
        };
        let gone: Vec<Hold> = tokens
            .into_iter()
            .filter_map(|token| {
                holds.remove(token).map(|grant| Hold {
                    token: token.into(),
                    grant,
                })
            })
            .collect();
        if holds.is_empty() {
            let next = Self::next_look(holds);
            self.set_deadline(next);
        }
        gone
    }

    /// A master's effect: no grant before `until_ms` (a lock-delay).
    pub fn apply_delay(&mut self, until_ms: u64) {
        if until_ms == 0 && !self.is_extended() {
            return;
        }
        self.extend();
        if let Some(holds) = self.extended_mut() {
            holds.set_delayed_until(until_ms);
            let next = Self::next_look(holds);
            self.set_deadline(next);
        }
    }

    /// Grants the lease to `token` for `ttl_ms`, or repeats the grant to its
    /// current holder. `queue_ahead` says other clients are already waiting
    /// for this key: a free lease then goes to them, not to this caller.
    pub fn acquire(
        &mut self,
        token: &[u8],
        ttl_ms: u64,
        now_ms: u64,
        queue_ahead: bool,
        fences: &mut FenceSequence,
    ) -> Result<Acquire, FenceExhausted> {
        let deadline_ms = now_ms.saturating_add(ttl_ms);
        if now_ms < self.deadline_ms() {
            if !self.holds(token) {
                return Ok(Acquire::Busy);
            }
            self.set_deadline(deadline_ms);
            return Ok(Acquire::Retried {
                fence: self.fence(),
            });
        }
        if queue_ahead {
            return Ok(Acquire::Busy);
        }
        let fence = fences.next(self.fence(), now_ms)?;
        self.set_fence(fence);
        self.set_holder(token, deadline_ms);
        Ok(Acquire::Granted { fence })
    }

    /// Moves the deadline of a live hold of `token` to `now + ttl` (a
    /// `ttl_ms` of 0: no deadline of its own, for a bound hold). Never
    /// revives a hold that is not live.
    #[inline]
    pub fn renew_hold(
        &mut self,
        token: &[u8],
        ttl_ms: u64,
        now_ms: u64,
        sessions: &mut impl Sessions,
    ) -> Renew {
        let Some(holds) = self.extended_mut() else {
            if ttl_ms == 0 {
                return match self.held_by(token, now_ms) {
                    true => Renew::ZeroTtlUnbound,
                    false => Renew::NotHeld,
                };
            }
            return match self.renew(token, ttl_ms, now_ms) {
                true => Renew::Renewed,
                false => Renew::NotHeld,
            };
        };
        let deadline_ms = match ttl_ms {
            0 => NO_DEADLINE,
            ttl => now_ms.saturating_add(ttl),
        };
        // One lookup of the token: the deadline moves in place (nothing else
        // of the hold changes, so the table's counts stay right).
        let Some(grant) = holds.get_mut(token) else {
            return Renew::NotHeld;
        };
        if !grant.is_live(now_ms, sessions) {
            return Renew::NotHeld;
        }
        if ttl_ms == 0 && grant.session().is_none() {
            return Renew::ZeroTtlUnbound;
        }
        grant.deadline_ms = deadline_ms;
        self.lower_earliest(deadline_ms);
        Renew::Renewed
    }

    /// Moves the deadline of a live compact lease held by `token` to
    /// `now + ttl`. Never revives an expired one.
    #[inline]
    fn renew(&mut self, token: &[u8], ttl_ms: u64, now_ms: u64) -> bool {
        let held = self.held_by(token, now_ms);
        if held {
            self.set_deadline(now_ms.saturating_add(ttl_ms));
        }
        held
    }

    /// Ends the live hold of `token`, other holds staying; returns it.
    #[inline]
    pub fn release(
        &mut self,
        token: &[u8],
        now_ms: u64,
        sessions: &mut impl Sessions,
    ) -> Option<Grant> {
        if let Some(holds) = self.extended_mut() {
            let held = holds
                .get(token)
                .is_some_and(|g| g.is_live(now_ms, sessions));
            let gone = held.then(|| holds.remove(token)).flatten();
            if holds.is_empty() {
                let next = Self::next_look(holds);
                self.set_deadline(next);
            }
            return gone;
        }
        let held = self.held_by(token, now_ms);
        if held {
            let grant = Grant::new(self.fence(), self.deadline_ms());
            self.set_holder(&[], 0);
            return Some(grant);
        }
        None
    }

    /// Every hold, for persistence: `None` for a compact lease (whose
    /// holder is `persisted_holder`).
    /// The session bindings of the lease's bound holds: none, and no
    /// allocation, for a lease without one.
    #[inline]
    pub fn bindings(&self) -> Vec<Binding> {
        match self.extended().filter(|_| self.bound_holds() > 0) {
            None => Vec::new(),
            Some(holds) => holds
                .iter()
                .filter_map(|(_, g)| g.session().cloned())
                .collect(),
        }
    }

    pub fn persisted_holds(&self) -> Option<Persisted> {
        let holds = self.extended()?;
        let list = holds
            .by_grant()
            .into_iter()
            .map(|(t, g)| Hold {
                token: t.into(),
                grant: g.clone(),
            })
            .collect();
        Some(Persisted {
            mode: holds.mode(),
            limit: holds.limit(),
            delayed_until: holds.delayed_until(),
            holds: list,
        })
    }

    /// Overwrites the state with values decided elsewhere (a master's effect,
    /// an AOF entry). The fence sequence must have observed `fence` already.
    #[inline]
    pub fn apply(&mut self, holder: Option<Holder>, fence: u64) {
        self.set_fence(fence);
        match holder {
            Some(h) => self.set_holder(&h.token, h.deadline_ms),
            None => self.set_holder(&[], 0),
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

/// Clients blocked in `LEASE.ACQUIRE ... BLOCK`, first come first served,
/// per key name and database.
///
/// Waiters wait for a key *name*, as `BLPOP` does: the queue outlives a
/// `DEL` of the key and a new lease under the same name, so it lives beside
/// the keyspace rather than inside a lease value.
#[derive(Debug, Default)]
pub struct WaitQueues {
    by_db: HashMap<i32, HashMap<Box<[u8]>, VecDeque<u64>>>,
    next_id: u64,
    total: usize,
}

impl WaitQueues {
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Waiters on all keys.
    #[inline]
    pub fn total(&self) -> usize {
        self.total
    }

    /// Queues a new waiter at the back and returns its id.
    pub fn enqueue(&mut self, db: i32, key: &[u8]) -> u64 {
        self.next_id += 1;
        let queue = self
            .by_db
            .entry(db)
            .or_default()
            .entry(key.into())
            .or_default();
        queue.push_back(self.next_id);
        self.total += 1;
        self.next_id
    }

    #[inline]
    pub fn head(&self, db: i32, key: &[u8]) -> Option<u64> {
        self.queue(db, key).and_then(|q| q.front().copied())
    }

    #[inline]
    pub fn len(&self, db: i32, key: &[u8]) -> usize {
        self.queue(db, key).map_or(0, VecDeque::len)
    }

    #[inline]
    fn queue(&self, db: i32, key: &[u8]) -> Option<&VecDeque<u64>> {
        if self.total == 0 {
            return None;
        }
        self.by_db.get(&db)?.get(key)
    }

    /// Every key with waiters in database `db`, or in all (`db < 0`).
    #[inline]
    pub fn keys(&self, db: i32) -> Vec<(i32, Box<[u8]>)> {
        self.by_db
            .iter()
            .filter(|(&d, _)| db < 0 || d == db)
            .flat_map(|(&d, keys)| keys.keys().map(move |k| (d, k.clone())))
            .collect()
    }

    /// Takes a waiter out, wherever it is in its queue.
    pub fn remove(&mut self, db: i32, key: &[u8], id: u64) -> bool {
        let Some(keys) = self.by_db.get_mut(&db) else {
            return false;
        };
        let Some(queue) = keys.get_mut(key) else {
            return false;
        };
        let Some(pos) = queue.iter().position(|&w| w == id) else {
            return false;
        };
        queue.remove(pos);
        self.total -= 1;
        if queue.is_empty() {
            keys.remove(key);
            if keys.is_empty() {
                self.by_db.remove(&db);
            }
        }
        true
    }
}

/// A resource record: the highest fence a protected resource accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Resource {
    highest: u64,
}

/// A fence below the highest accepted; carries that highest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stale {
    pub highest: u64,
}

impl Resource {
    pub fn new(highest: u64) -> Self {
        Self { highest }
    }

    #[inline]
    pub fn highest(&self) -> u64 {
        self.highest
    }

    /// Checks `fence` without recording it.
    #[inline]
    pub fn check(&self, fence: u64) -> Result<(), Stale> {
        if fence < self.highest {
            Err(Stale {
                highest: self.highest,
            })
        } else {
            Ok(())
        }
    }

    /// Records `fence` as the highest accepted; equal fences pass, so one
    /// holder may write several times under one grant.
    #[inline]
    pub fn accept(&mut self, fence: u64) -> Result<(), Stale> {
        self.check(fence)?;
        self.highest = fence;
        Ok(())
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

/// What `LEASE.DEBUG CHECK` reads (`model::check`), and, in a
/// `fault-injection` build, a way to make it wrong on purpose.
impl WaitQueues {
    /// Every key's queue: database, key name, waiters in it.
    #[inline]
    pub fn queues(&self) -> impl Iterator<Item = (i32, &[u8], usize)> + '_ {
        self.by_db
            .iter()
            .flat_map(|(&db, keys)| keys.iter().map(move |(k, q)| (db, &**k, q.len())))
    }

    /// Miscounts the waiters by one (`LEASE.DEBUG CORRUPT waiters`).
    #[cfg(feature = "fault-injection")]
    #[inline]
    pub fn miscount(&mut self) {
        self.total += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::holds::Unbound;

    fn renew(lease: &mut Lease, token: &[u8], ttl_ms: u64, now_ms: u64) -> bool {
        lease.renew_hold(token, ttl_ms, now_ms, &mut Unbound) == Renew::Renewed
    }

    const T0: u64 = 1_700_000_000_000;

    fn granted(r: Result<Acquire, FenceExhausted>) -> u64 {
        match r {
            Ok(Acquire::Granted { fence }) => fence,
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    #[test]
    fn grant_on_free_key_issues_fence_and_deadline() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        let fence = granted(lease.acquire(b"a", 1000, T0, false, &mut seq));
        assert_eq!(fence, T0 * FENCES_PER_MS);
        assert_eq!(lease.fence(), fence);
        assert_eq!(lease.state(T0, &mut Unbound), State::Held { ttl_ms: 1000 });
        assert!(lease.is_live(T0, &mut Unbound));
        assert_eq!(lease.deadline(), Some(T0 + 1000));
    }

    #[test]
    fn idempotent_retry_keeps_fence_and_moves_deadline() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        let fence = granted(lease.acquire(b"a", 1000, T0, false, &mut seq));
        let again = lease.acquire(b"a", 5000, T0 + 400, false, &mut seq);
        assert_eq!(again, Ok(Acquire::Retried { fence }));
        assert_eq!(
            lease.state(T0 + 400, &mut Unbound),
            State::Held { ttl_ms: 5000 }
        );
        assert_eq!(seq.last(), fence, "a retry issues no fence");
    }

    #[test]
    fn other_token_is_busy_while_live() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        granted(lease.acquire(b"a", 1000, T0, false, &mut seq));
        for now in [T0, T0 + 1, T0 + 999] {
            assert_eq!(
                lease.acquire(b"b", 1000, now, false, &mut seq),
                Ok(Acquire::Busy)
            );
        }
    }

    #[test]
    fn expiry_happens_at_the_exact_deadline() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        let first = granted(lease.acquire(b"a", 1000, T0, false, &mut seq));
        assert_eq!(
            lease.state(T0 + 999, &mut Unbound),
            State::Held { ttl_ms: 1 }
        );
        assert_eq!(lease.state(T0 + 1000, &mut Unbound), State::Free);
        assert!(!renew(&mut lease, b"a", 1000, T0 + 1000), "never revives");
        assert!(lease.release(b"a", T0 + 1000, &mut Unbound).is_none());
        let second = granted(lease.acquire(b"b", 1000, T0 + 1000, false, &mut seq));
        assert!(second > first);
    }

    #[test]
    fn renew_table() {
        // (token, at, expect)
        let cases: &[(&[u8], u64, bool)] = &[
            (b"a", T0, true),
            (b"a", T0 + 999, true),
            (b"a", T0 + 1000, false),
            (b"b", T0, false),
            (b"", T0, false),
            (b"aa", T0, false),
        ];
        for &(token, at, expect) in cases {
            let mut seq = FenceSequence::new();
            let mut lease = Lease::default();
            let fence = granted(lease.acquire(b"a", 1000, T0, false, &mut seq));
            assert_eq!(
                renew(&mut lease, token, 300, at),
                expect,
                "{token:?} at {at}"
            );
            let want = if expect {
                State::Held { ttl_ms: 300 }
            } else if at < T0 + 1000 {
                State::Held {
                    ttl_ms: T0 + 1000 - at,
                }
            } else {
                State::Free
            };
            assert_eq!(lease.state(at, &mut Unbound), want);
            assert_eq!(lease.fence(), fence, "renew keeps the fence");
        }
    }

    #[test]
    fn release_only_by_the_live_holder() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        granted(lease.acquire(b"a", 1000, T0, false, &mut seq));
        assert!(lease.release(b"b", T0 + 1, &mut Unbound).is_none());
        assert_eq!(
            lease.state(T0 + 1, &mut Unbound),
            State::Held { ttl_ms: 999 }
        );
        assert!(lease.release(b"a", T0 + 1, &mut Unbound).is_some());
        assert_eq!(lease.state(T0 + 1, &mut Unbound), State::Free);
        assert!(
            lease.release(b"a", T0 + 2, &mut Unbound).is_none(),
            "a second release is a no-op"
        );
    }

    #[test]
    fn fences_rise_across_release_expiry_and_new_keys() {
        let mut seq = FenceSequence::new();
        let mut fences = Vec::new();
        let mut lease = Lease::default();
        fences.push(granted(lease.acquire(b"a", 10, T0, false, &mut seq)));
        assert!(lease.release(b"a", T0, &mut Unbound).is_some());
        fences.push(granted(lease.acquire(b"b", 10, T0, false, &mut seq)));
        // expiry
        fences.push(granted(lease.acquire(b"c", 10, T0 + 10, false, &mut seq)));
        // the key was deleted: a new record starts from fence 0
        let mut fresh = Lease::default();
        fences.push(granted(fresh.acquire(b"d", 10, T0 + 10, false, &mut seq)));
        // the clock went backwards: the sequence still rises
        let mut other = Lease::default();
        fences.push(granted(other.acquire(
            b"e",
            10,
            T0 - 60_000,
            false,
            &mut seq,
        )));
        assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
        assert!(fences.iter().all(|&f| f < FENCE_LIMIT));
    }

    #[test]
    fn fence_sequence_clock_floor_and_observe() {
        let mut seq = FenceSequence::new();
        assert_eq!(seq.next(0, T0), Ok(T0 * 1024));
        assert_eq!(seq.next(0, T0), Ok(T0 * 1024 + 1));
        // a later clock jumps to the floor
        assert_eq!(seq.next(0, T0 + 1), Ok((T0 + 1) * 1024));
        // observing a fence issued elsewhere (a master, a restored key)
        seq.observe((T0 + 50) * 1024 + 7, T0 + 2);
        assert_eq!(seq.next(0, T0 + 2), Ok((T0 + 50) * 1024 + 8));
        // observing a lower fence never lowers the sequence
        seq.observe(5, T0 + 2);
        assert_eq!(seq.last(), (T0 + 50) * 1024 + 8);
    }

    #[test]
    fn observations_move_the_sequence_at_most_max_ahead_of_the_clock() {
        let ceiling = T0 * FENCES_PER_MS + MAX_AHEAD;
        // (observed fence, sequence after) at clock T0
        let cases = [
            (T0 * FENCES_PER_MS + 5, T0 * FENCES_PER_MS + 5),
            (ceiling - 1, ceiling - 1),
            (ceiling, ceiling),
            (ceiling + 1, ceiling),
            (FENCE_LIMIT - 1, ceiling),
            (u64::MAX, ceiling),
        ];
        for (observed, after) in cases {
            let mut seq = FenceSequence::new();
            seq.observe(observed, T0);
            assert_eq!(seq.last(), after, "observed {observed}");
            // and the node still grants, above what it kept
            assert_eq!(seq.next(0, T0), Ok(after + 1), "observed {observed}");
        }
        // the ceiling moves with the clock
        let mut seq = FenceSequence::new();
        seq.observe(FENCE_LIMIT - 1, T0);
        seq.observe(FENCE_LIMIT - 1, T0 + 10);
        assert_eq!(seq.last(), ceiling + 10 * FENCES_PER_MS);
    }

    #[test]
    fn a_grant_is_above_the_keys_own_fence() {
        // (sequence last, key's fence, clock) -> (fence, sequence after)
        let floor = T0 * FENCES_PER_MS;
        let ceiling = floor + MAX_AHEAD;
        let cases = [
            // the usual: the sequence is ahead of the key
            (floor + 10, floor + 3, T0, Ok(floor + 11), floor + 11),
            // the key carries a fence the sequence has not seen
            (floor + 10, floor + 99, T0, Ok(floor + 100), floor + 100),
            // from a node whose clock ran further ahead than MAX_AHEAD: the
            // key's fences rise, the sequence moves one, as for any grant
            (ceiling, ceiling + 50, T0, Ok(ceiling + 51), ceiling + 1),
            (floor, ceiling + 50, T0, Ok(ceiling + 51), ceiling),
            // a key whose own fence is the last below 2^53 is exhausted...
            (floor, FENCE_LIMIT - 1, T0, Err(FenceExhausted), floor),
        ];
        for (last, key_fence, now, fence, after) in cases {
            let mut seq = FenceSequence::new();
            seq.observe(last, now);
            assert_eq!(seq.next(key_fence, now), fence, "key fence {key_fence}");
            assert_eq!(seq.last(), after, "key fence {key_fence}");
            // ...and the others are not
            assert!(seq.next(0, now).is_ok());
        }
    }

    #[test]
    fn fence_sequence_refuses_to_reach_two_to_the_53() {
        // a clock past year 2248 is refused rather than wrapped
        let mut seq = FenceSequence::new();
        assert_eq!(
            seq.next(0, FENCE_LIMIT / FENCES_PER_MS),
            Err(FenceExhausted)
        );
        let late = FENCE_LIMIT / FENCES_PER_MS - 1;
        seq.observe(u64::MAX, late);
        assert_eq!(seq.last(), FENCE_LIMIT - 1);
        assert_eq!(seq.next(0, late), Err(FenceExhausted));
    }

    #[test]
    fn a_free_lease_goes_to_the_queue_first() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        granted(lease.acquire(b"a", 1000, T0, false, &mut seq));
        // the holder's retry is not a queue jump
        assert!(matches!(
            lease.acquire(b"a", 1000, T0 + 1, true, &mut seq),
            Ok(Acquire::Retried { .. })
        ));
        assert!(lease.release(b"a", T0 + 1, &mut Unbound).is_some());
        assert_eq!(
            lease.acquire(b"late", 1000, T0 + 1, true, &mut seq),
            Ok(Acquire::Busy),
            "no jumping the queue"
        );
        granted(lease.acquire(b"head", 1000, T0 + 1, false, &mut seq));
    }

    #[test]
    fn wait_queues_list_their_keys_per_database() {
        let mut queues = WaitQueues::default();
        queues.enqueue(0, b"a");
        queues.enqueue(0, b"a");
        queues.enqueue(0, b"b");
        let gone = queues.enqueue(3, b"c");
        queues.enqueue(5, b"d");
        let mut keys = queues.keys(0);
        keys.sort();
        assert_eq!(keys, vec![(0, b"a"[..].into()), (0, b"b"[..].into())]);
        assert_eq!(queues.keys(3), vec![(3, b"c"[..].into())]);
        assert_eq!(queues.keys(-1).len(), 4);
        queues.remove(3, b"c", gone);
        assert!(queues.keys(3).is_empty());
        assert!(queues.keys(9).is_empty());
    }

    #[test]
    fn wait_queues_are_fifo_per_key_and_database() {
        let mut q = WaitQueues::default();
        let a = q.enqueue(0, b"k");
        let b = q.enqueue(0, b"k");
        let c = q.enqueue(0, b"k");
        let other_db = q.enqueue(1, b"k");
        assert_eq!(q.len(0, b"k"), 3);
        assert_eq!(q.head(0, b"k"), Some(a));
        assert_eq!(q.head(1, b"k"), Some(other_db));
        // a waiter leaving from the middle keeps the order of the rest
        assert!(q.remove(0, b"k", b));
        assert!(!q.remove(0, b"k", b), "removal is idempotent");
        assert!(q.remove(0, b"k", a));
        assert_eq!(q.head(0, b"k"), Some(c));
        assert!(q.remove(0, b"k", c));
        assert_eq!(q.head(0, b"k"), None);
        assert_eq!(q.len(0, b"k"), 0);
        assert_eq!(q.total(), 1);
        assert!(q.remove(1, b"k", other_db));
        assert!(q.is_empty());
    }

    #[test]
    fn resource_accepts_equal_and_higher_rejects_lower() {
        let mut r = Resource::default();
        assert_eq!(r.accept(10), Ok(()));
        assert_eq!(r.accept(10), Ok(()));
        assert_eq!(r.accept(9), Err(Stale { highest: 10 }));
        assert_eq!(r.highest(), 10);
        assert_eq!(r.accept(11), Ok(()));
        assert_eq!(r.check(10), Err(Stale { highest: 11 }));
        assert_eq!(r.highest(), 11);
    }

    #[test]
    fn token_comparison() {
        assert!(tokens_equal(b"abc", b"abc"));
        assert!(!tokens_equal(b"abc", b"abd"));
        assert!(!tokens_equal(b"abc", b"ab"));
        assert!(!tokens_equal(b"", b"a"));
    }

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

    #[test]
    fn tokens_of_every_form_round_trip() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        let mut cases = token_cases();
        // and back again, so each form replaces each other
        cases.extend(token_cases().into_iter().rev());
        for (now, (token, on_heap)) in (T0..).zip(cases) {
            let fence = granted(lease.acquire(&token, 100, now, false, &mut seq));
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
        granted(lease.acquire(b"a", 1000, T0, false, &mut seq));
        assert_eq!(lease.index_mark(), None, "a new grant is not indexed yet");
        lease.set_index_mark(Some(T0 + 1000));
        assert!(renew(&mut lease, b"a", 60_000, T0 + 500));
        assert_eq!(
            lease.index_mark(),
            Some(T0 + 1000),
            "renewal keeps the entry"
        );
        assert!(matches!(
            lease.acquire(b"a", 90_000, T0 + 600, false, &mut seq),
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
    fn deadline_saturates_instead_of_wrapping() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        granted(lease.acquire(b"a", MAX_TTL_MS, T0, false, &mut seq));
        assert_eq!(
            lease.state(T0, &mut Unbound),
            State::Held { ttl_ms: MAX_TTL_MS }
        );
    }

    // ---- Shared and labelled holds ----

    const SHARED: Terms<'static> = Terms {
        mode: Mode::Shared,
        limit: None,
        owner: None,
        session: None,
        delay_ms: 0,
    };

    fn shared(limit: u32) -> Terms<'static> {
        Terms {
            limit: Some(limit),
            ..SHARED
        }
    }

    fn on(
        lease: &mut Lease,
        token: &[u8],
        terms: Terms,
        now: u64,
        fences: &mut FenceSequence,
    ) -> Result<Acquire, Refused> {
        lease
            .acquire_on(
                token,
                1000,
                terms,
                now,
                false,
                false,
                10_000,
                fences,
                &mut Unbound,
            )
            .map(|(a, _)| a)
    }

    /// The key's state before the call, by the calls that make it.
    fn key_with(holds: &[(&[u8], Terms<'static>)], fences: &mut FenceSequence) -> Lease {
        let mut lease = Lease::default();
        for (token, terms) in holds {
            assert!(matches!(
                on(&mut lease, token, *terms, T0, fences),
                Ok(Acquire::Granted { .. })
            ));
        }
        lease
    }

    #[test]
    fn mode_by_state_table() {
        use Acquire::{Busy, Granted, Retried};
        type Case = (
            &'static str,
            Vec<(&'static [u8], Terms<'static>)>,
            &'static [u8],
            Terms<'static>,
            fn(&Result<Acquire, Refused>) -> bool,
        );
        let cases: Vec<Case> = vec![
            ("shared on free", vec![], b"a", SHARED, |r| {
                matches!(r, Ok(Granted { .. }))
            }),
            (
                "shared beside shared",
                vec![(b"a", SHARED)],
                b"b",
                SHARED,
                |r| matches!(r, Ok(Granted { .. })),
            ),
            (
                "exclusive beside shared",
                vec![(b"a", SHARED)],
                b"b",
                Terms::PLAIN,
                |r| matches!(r, Ok(Busy)),
            ),
            (
                "shared beside exclusive",
                vec![(b"a", Terms::PLAIN)],
                b"b",
                SHARED,
                |r| matches!(r, Ok(Busy)),
            ),
            (
                "limit full",
                vec![(b"a", shared(2)), (b"b", shared(2))],
                b"c",
                shared(2),
                |r| matches!(r, Ok(Busy)),
            ),
            (
                "limit room",
                vec![(b"a", shared(2))],
                b"c",
                shared(2),
                |r| matches!(r, Ok(Granted { .. })),
            ),
            ("retry shared", vec![(b"a", SHARED)], b"a", SHARED, |r| {
                matches!(r, Ok(Retried { .. }))
            }),
            (
                "other mode, shared holder",
                vec![(b"a", SHARED)],
                b"a",
                Terms::PLAIN,
                |r| *r == Err(Refused::OtherMode),
            ),
            (
                "other mode, exclusive holder",
                vec![(b"a", Terms::PLAIN)],
                b"a",
                SHARED,
                |r| *r == Err(Refused::OtherMode),
            ),
            (
                "another limit",
                vec![(b"a", shared(2))],
                b"b",
                shared(3),
                |r| *r == Err(Refused::LimitMismatch(Some(2))),
            ),
            (
                "no limit where one is",
                vec![(b"a", shared(2))],
                b"b",
                SHARED,
                |r| *r == Err(Refused::LimitMismatch(Some(2))),
            ),
            (
                "exclusive where a limit is",
                vec![(b"a", shared(2))],
                b"b",
                Terms::PLAIN,
                |r| *r == Err(Refused::LimitMismatch(Some(2))),
            ),
            (
                "a limit where none is",
                vec![(b"a", SHARED)],
                b"b",
                shared(2),
                |r| *r == Err(Refused::LimitMismatch(None)),
            ),
            (
                "a limit on an exclusive key",
                vec![(b"a", Terms::PLAIN)],
                b"b",
                shared(2),
                |r| *r == Err(Refused::LimitMismatch(None)),
            ),
        ];
        for (name, before, token, terms, expect) in cases {
            let mut fences = FenceSequence::new();
            let mut lease = key_with(&before, &mut fences);
            let snapshot = lease.clone();
            let got = on(&mut lease, token, terms, T0 + 1, &mut fences);
            assert!(expect(&got), "{name}: {got:?}");
            if !matches!(got, Ok(Granted { .. }) | Ok(Retried { .. })) {
                assert_eq!(lease, snapshot, "{name}: a refusal changes nothing");
            }
        }
    }

    #[test]
    fn every_hold_has_its_own_rising_fence_and_deadline() {
        let mut fences = FenceSequence::new();
        let mut lease = Lease::default();
        let mut seen = Vec::new();
        for (i, token) in [&b"a"[..], b"b", b"c"].into_iter().enumerate() {
            let now = T0 + i as u64;
            let fence = match on(&mut lease, token, SHARED, now, &mut fences) {
                Ok(Acquire::Granted { fence }) => fence,
                other => panic!("{other:?}"),
            };
            seen.push(fence);
        }
        assert!(seen.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(lease.fence(), seen[2]);
        let holds = lease.live_holds(T0 + 10, &mut Unbound);
        assert_eq!(holds.iter().map(|h| h.fence).collect::<Vec<_>>(), seen);
        assert_eq!(holds[1].deadline_ms, T0 + 1 + 1000);
        // The retry keeps its fence and moves only its own deadline.
        assert_eq!(
            on(&mut lease, b"a", SHARED, T0 + 500, &mut fences),
            Ok(Acquire::Retried { fence: seen[0] })
        );
        let holds = lease.live_holds(T0 + 10, &mut Unbound);
        assert_eq!(holds[0].deadline_ms, T0 + 1500);
        assert_eq!(holds[1].deadline_ms, T0 + 1001);
        assert_eq!(
            lease.state(T0 + 10, &mut Unbound),
            State::Held { ttl_ms: 1490 }
        );
    }

    #[test]
    fn renew_and_release_act_on_one_hold() {
        let mut fences = FenceSequence::new();
        let mut lease = key_with(&[(b"a", SHARED), (b"b", SHARED)], &mut fences);
        assert!(renew(&mut lease, b"a", 5000, T0 + 100));
        assert!(!renew(&mut lease, b"zz", 5000, T0 + 100));
        assert!(lease.release(b"b", T0 + 100, &mut Unbound).is_some());
        assert!(lease.release(b"b", T0 + 100, &mut Unbound).is_none());
        assert_eq!(lease.view(T0 + 100, &mut Unbound).holders, 1);
        // b is gone; a lives to T0 + 5100.
        assert!(!renew(&mut lease, b"b", 10, T0 + 200));
        assert!(lease.is_live(T0 + 5099, &mut Unbound));
        assert!(!lease.is_live(T0 + 5100, &mut Unbound));
        assert!(!renew(&mut lease, b"a", 10, T0 + 5100), "never revives");
        assert!(lease.release(b"a", T0 + 5099, &mut Unbound).is_some());
        assert_eq!(lease.deadline(), None);
    }

    #[test]
    fn expired_holds_free_their_place_and_the_reaper_takes_them() {
        let mut fences = FenceSequence::new();
        let mut lease = key_with(&[(b"a", shared(2))], &mut fences);
        assert!(renew(&mut lease, b"a", 10, T0));
        assert!(matches!(
            on(&mut lease, b"b", shared(2), T0 + 1, &mut fences),
            Ok(Acquire::Granted { .. })
        ));
        assert_eq!(lease.view(T0 + 5, &mut Unbound).holders, 2);
        assert_eq!(lease.deadline(), Some(T0 + 10), "the earliest deadline");
        assert!(lease.has_expired_hold(T0 + 10));
        assert_eq!(lease.view(T0 + 10, &mut Unbound).holders, 1);
        // The expired hold makes room at once, before any reaping.
        assert!(matches!(
            on(&mut lease, b"c", shared(2), T0 + 10, &mut fences),
            Ok(Acquire::Granted { .. })
        ));
        let pruned = lease.prune(T0 + 10, &mut Unbound);
        assert_eq!(pruned.len(), 1);
        assert_eq!((&*pruned[0].0.token, pruned[0].1), (&b"a"[..], T0 + 10));
        assert_eq!(lease.deadline(), Some(T0 + 1001));
        assert!(!lease.has_expired_hold(T0 + 10));
        // Once no hold is live the key forgets its limit and mode.
        assert!(matches!(
            on(&mut lease, b"d", shared(9), T0 + 3000, &mut fences),
            Ok(Acquire::Granted { .. })
        ));
        assert_eq!(lease.view(T0 + 3000, &mut Unbound).limit, Some(9));
    }

    #[test]
    fn the_earliest_deadline_is_made_exact_again() {
        let mut fences = FenceSequence::new();
        let mut lease = key_with(&[(b"a", SHARED), (b"b", SHARED)], &mut fences);
        assert!(renew(&mut lease, b"a", 10, T0));
        assert!(renew(&mut lease, b"b", 5000, T0));
        assert!(lease.release(b"a", T0 + 1, &mut Unbound).is_some());
        // Left at a's deadline: a look too soon, never too late.
        assert_eq!(lease.deadline(), Some(T0 + 10));
        assert!(!lease.has_expired_hold(T0 + 10));
        lease.refresh_earliest();
        assert_eq!(lease.deadline(), Some(T0 + 5000));
    }

    #[test]
    fn queue_and_caps() {
        let mut fences = FenceSequence::new();
        let mut lease = key_with(&[(b"a", SHARED)], &mut fences);
        let snapshot = lease.clone();
        // A waiter ahead: no new hold, shared or not; a retry still renews.
        let ahead = |lease: &mut Lease, token: &[u8], fences: &mut FenceSequence| {
            lease
                .acquire_on(
                    token,
                    1000,
                    SHARED,
                    T0 + 1,
                    true,
                    true,
                    10_000,
                    fences,
                    &mut Unbound,
                )
                .map(|(a, _)| a)
        };
        assert_eq!(ahead(&mut lease, b"b", &mut fences), Ok(Acquire::Busy));
        assert_eq!(lease, snapshot);
        assert!(matches!(
            ahead(&mut lease, b"a", &mut fences),
            Ok(Acquire::Retried { .. })
        ));
        let capped = lease.acquire_on(
            b"c",
            1000,
            SHARED,
            T0 + 1,
            false,
            false,
            1,
            &mut fences,
            &mut Unbound,
        );
        assert_eq!(capped, Err(Refused::TooManyHolders));
        // The limit is kept while clients wait, even with no hold left.
        let mut lease = key_with(&[(b"a", shared(2))], &mut fences);
        assert!(lease.release(b"a", T0 + 1, &mut Unbound).is_some());
        let waiting = lease.acquire_on(
            b"w",
            1000,
            SHARED,
            T0 + 2,
            true,
            false,
            10,
            &mut fences,
            &mut Unbound,
        );
        assert_eq!(waiting, Err(Refused::LimitMismatch(Some(2))));
        let waiting = lease.acquire_on(
            b"w",
            1000,
            shared(2),
            T0 + 2,
            true,
            false,
            10,
            &mut fences,
            &mut Unbound,
        );
        assert!(matches!(waiting, Ok((Acquire::Granted { .. }, _))));
    }

    #[test]
    fn an_exclusive_grant_replaces_expired_holds_and_goes_back_to_compact() {
        let mut fences = FenceSequence::new();
        let mut lease = key_with(&[(b"a", SHARED), (b"b", SHARED)], &mut fences);
        let after = T0 + 1000;
        let got = lease.acquire_on(
            b"x",
            50,
            Terms::PLAIN,
            after,
            false,
            false,
            10,
            &mut fences,
            &mut Unbound,
        );
        assert!(matches!(
            got,
            Ok((Acquire::Granted { .. }, Replaced { count: 2, .. }))
        ));
        assert!(!lease.is_extended());
        assert_eq!(lease.shared_holds(), 0);
        let owned = Terms {
            owner: Some(b"host-1"),
            ..Terms::PLAIN
        };
        let got = lease.acquire_on(
            b"y",
            50,
            owned,
            after + 50,
            false,
            false,
            10,
            &mut fences,
            &mut Unbound,
        );
        assert!(matches!(
            got,
            Ok((Acquire::Granted { .. }, Replaced { count: 1, .. }))
        ));
        assert!(lease.is_extended());
        assert_eq!(
            lease.view(after + 50, &mut Unbound).owner,
            Some(&b"host-1"[..])
        );
        assert_eq!(
            lease.view(after + 50, &mut Unbound).mode,
            Some(Mode::Exclusive)
        );
    }

    #[test]
    fn a_replica_applies_holds_to_the_same_state() {
        let mut fences = FenceSequence::new();
        let master = key_with(&[(b"a", shared(3)), (b"b", shared(3))], &mut fences);
        let mut replica = Lease::default();
        let whole = master.persisted_holds().expect("extended");
        for hold in whole.holds {
            replica.apply_hold(&hold.token, hold.grant, whole.mode, whole.limit);
        }
        assert_eq!(replica, master);
        let mut master = master;
        assert!(master.release(b"a", T0 + 1, &mut Unbound).is_some());
        replica.apply_drop([&b"a"[..]]);
        assert_eq!(replica, master);
        // An exclusive hold is the only one.
        let grant = Grant::new(master.fence() + 1, T0 + 99);
        replica.apply_hold(b"x", grant, Mode::Exclusive, None);
        assert_eq!(replica.live_holds(T0, &mut Unbound).len(), 1);
        assert_eq!(replica.fence(), master.fence() + 1);
        // The version 1 form puts the compact lease back.
        replica.apply(None, 7);
        assert!(!replica.is_extended());
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
