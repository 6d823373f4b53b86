//! The lease state machine and the fence sequence.
//!
//! Pure logic: time comes in as `now_ms` (unix milliseconds) and nothing here
//! touches Redis, so every rule is unit-tested on an injected clock. The glue
//! in `commands.rs` opens keys, calls these methods and turns the outcomes
//! into replies, replication and notifications.

use std::collections::{HashMap, VecDeque};

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

    fn deref(&self) -> &[u8] {
        match self {
            Token::Stored(bytes) => bytes,
            // ok: `expand` writes at most UUID_LEN bytes and says how many.
            Token::Rebuilt { bytes, len } => &bytes[..usize::from(*len)],
        }
    }
}

impl PartialEq for Token<'_> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Token<'_> {}

impl std::fmt::Debug for Token<'_> {
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
    Held { ttl_ms: u64 },
    Free,
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
    fn drop(&mut self) {
        if self.token_on_heap() {
            // SAFETY: the kind and length say the buffer variant is the one
            // written (`set_holder` writes them together), and this drop is
            // its last use.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.token.heap) };
        }
    }
}

/// A copy is a new value: same holder and fence, not yet in the index.
impl Clone for Lease {
    fn clone(&self) -> Self {
        Self::from_holder(self.holder(), self.fence())
    }
}

impl PartialEq for Lease {
    fn eq(&self, other: &Self) -> bool {
        self.fence() == other.fence() && self.holder() == other.holder()
    }
}

impl Eq for Lease {}

impl std::fmt::Debug for Lease {
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

    fn token_len(&self) -> usize {
        ((self.fence_len >> FENCE_BITS) & ((1 << LEN_BITS) - 1)) as usize
    }

    fn token_kind(&self) -> u64 {
        self.fence_len >> KIND_SHIFT
    }

    /// Whether the token lives in a buffer of its own.
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
                kind => expand(kind, &self.token.inline),
            }
        }
    }

    fn deadline_ms(&self) -> u64 {
        self.deadline_mark & DEADLINE_MASK
    }

    fn set_fence(&mut self, fence: u64) {
        let fence = fence.min(FENCE_LIMIT - 1);
        self.fence_len = (self.fence_len & !(FENCE_LIMIT - 1)) | fence;
    }

    /// Moves the deadline, keeping the index mark where it was.
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
        if self.token_on_heap() {
            // SAFETY: the kind and length say the buffer variant is the one
            // written, and it is overwritten below without being read again.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.token.heap) };
        }
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
    pub fn deadline(&self) -> Option<u64> {
        Some(self.deadline_ms()).filter(|&d| d != 0)
    }

    /// Whether a holder is live at `now_ms`.
    pub fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.deadline_ms()
    }

    /// Whether the live holder is `token`, at `now_ms`.
    fn held_by(&self, token: &[u8], now_ms: u64) -> bool {
        self.is_live(now_ms) && self.holds(token)
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

    /// The stored holder, live or expired (for persistence).
    pub fn holder(&self) -> Option<HolderRef<'_>> {
        let deadline_ms = self.deadline_ms();
        (deadline_ms != 0).then(|| HolderRef {
            token: self.token(),
            deadline_ms,
        })
    }

    pub fn fence(&self) -> u64 {
        self.fence_len & (FENCE_LIMIT - 1)
    }

    /// The holder as persisted and replicated: `(deadline_ms, token)`,
    /// `(0, "")` when free.
    pub fn persisted_holder(&self) -> (u64, Token<'_>) {
        (self.deadline_ms(), self.token())
    }

    /// Where the deadline index holds this key, if known: set by whoever
    /// inserts the entry, so a release removes it without a search for a
    /// deadline the lease has since moved past. Kept as a distance before
    /// the deadline; a renewal that carries the deadline more than about
    /// 17 minutes past the entry forgets the mark (the reaper then meets the
    /// entry when it falls due and drops it). A free lease has no mark.
    pub fn index_mark(&self) -> Option<u64> {
        let distance = self.deadline_mark >> DEADLINE_BITS;
        let deadline_ms = self.deadline_ms();
        (distance != NO_MARK && deadline_ms != 0).then(|| deadline_ms - distance)
    }

    pub fn set_index_mark(&mut self, at_ms: Option<u64>) {
        let distance = at_ms
            .and_then(|at| self.deadline_ms().checked_sub(at))
            .filter(|&d| d < NO_MARK)
            .unwrap_or(NO_MARK);
        self.deadline_mark = self.deadline_ms() | distance << DEADLINE_BITS;
    }

    pub fn state(&self, now_ms: u64) -> State {
        if self.is_live(now_ms) {
            State::Held {
                ttl_ms: self.deadline_ms() - now_ms,
            }
        } else {
            State::Free
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
        if self.is_live(now_ms) {
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

    /// Moves the deadline of a live lease held by `token` to `now + ttl`.
    /// Never revives an expired lease.
    pub fn renew(&mut self, token: &[u8], ttl_ms: u64, now_ms: u64) -> bool {
        let held = self.held_by(token, now_ms);
        if held {
            self.set_deadline(now_ms.saturating_add(ttl_ms));
        }
        held
    }

    /// Ends a live lease held by `token`.
    pub fn release(&mut self, token: &[u8], now_ms: u64) -> bool {
        let held = self.held_by(token, now_ms);
        if held {
            self.set_holder(&[], 0);
        }
        held
    }

    /// Overwrites the state with values decided elsewhere (a master's effect,
    /// an AOF entry). The fence sequence must have observed `fence` already.
    pub fn apply(&mut self, holder: Option<Holder>, fence: u64) {
        self.set_fence(fence);
        match holder {
            Some(h) => self.set_holder(&h.token, h.deadline_ms),
            None => self.set_holder(&[], 0),
        }
    }

    /// Bytes owned by this value beyond the struct itself.
    pub fn heap_size(&self) -> usize {
        if self.token_on_heap() {
            self.token_len()
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
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Waiters on all keys.
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

    pub fn head(&self, db: i32, key: &[u8]) -> Option<u64> {
        self.queue(db, key).and_then(|q| q.front().copied())
    }

    pub fn len(&self, db: i32, key: &[u8]) -> usize {
        self.queue(db, key).map_or(0, VecDeque::len)
    }

    fn queue(&self, db: i32, key: &[u8]) -> Option<&VecDeque<u64>> {
        if self.total == 0 {
            return None;
        }
        self.by_db.get(&db)?.get(key)
    }

    /// Every key with waiters in database `db`, or in all (`db < 0`).
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

    pub fn highest(&self) -> u64 {
        self.highest
    }

    /// Checks `fence` without recording it.
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(lease.state(T0), State::Held { ttl_ms: 1000 });
        assert!(lease.is_live(T0));
        assert_eq!(lease.deadline(), Some(T0 + 1000));
    }

    #[test]
    fn idempotent_retry_keeps_fence_and_moves_deadline() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        let fence = granted(lease.acquire(b"a", 1000, T0, false, &mut seq));
        let again = lease.acquire(b"a", 5000, T0 + 400, false, &mut seq);
        assert_eq!(again, Ok(Acquire::Retried { fence }));
        assert_eq!(lease.state(T0 + 400), State::Held { ttl_ms: 5000 });
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
        assert_eq!(lease.state(T0 + 999), State::Held { ttl_ms: 1 });
        assert_eq!(lease.state(T0 + 1000), State::Free);
        assert!(!lease.renew(b"a", 1000, T0 + 1000), "never revives");
        assert!(!lease.release(b"a", T0 + 1000));
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
            assert_eq!(lease.renew(token, 300, at), expect, "{token:?} at {at}");
            let want = if expect {
                State::Held { ttl_ms: 300 }
            } else if at < T0 + 1000 {
                State::Held {
                    ttl_ms: T0 + 1000 - at,
                }
            } else {
                State::Free
            };
            assert_eq!(lease.state(at), want);
            assert_eq!(lease.fence(), fence, "renew keeps the fence");
        }
    }

    #[test]
    fn release_only_by_the_live_holder() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        granted(lease.acquire(b"a", 1000, T0, false, &mut seq));
        assert!(!lease.release(b"b", T0 + 1));
        assert_eq!(lease.state(T0 + 1), State::Held { ttl_ms: 999 });
        assert!(lease.release(b"a", T0 + 1));
        assert_eq!(lease.state(T0 + 1), State::Free);
        assert!(!lease.release(b"a", T0 + 2), "a second release is a no-op");
    }

    #[test]
    fn fences_rise_across_release_expiry_and_new_keys() {
        let mut seq = FenceSequence::new();
        let mut fences = Vec::new();
        let mut lease = Lease::default();
        fences.push(granted(lease.acquire(b"a", 10, T0, false, &mut seq)));
        assert!(lease.release(b"a", T0));
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
        assert!(lease.release(b"a", T0 + 1));
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
            assert!(lease.is_live(now));
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
                lease.renew(&token, 100, now),
                "the stored form compares equal"
            );
            let mut other = token.clone();
            other[token.len() - 1] ^= 1;
            assert!(!lease.renew(&other, 100, now), "one byte off");
            assert!(lease.release(&token, now));
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
        assert!(lease.renew(b"a", 60_000, T0 + 500));
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
        assert!(lease.renew(b"a", 3_600_000, T0 + 700));
        assert_eq!(lease.index_mark(), None, "17+ minutes past the entry");
        lease.set_index_mark(Some(T0 + 700 + 3_600_000));
        assert_eq!(lease.clone().index_mark(), None, "a copy is not indexed");
        assert!(lease.release(b"a", T0 + 800));
        assert_eq!(lease.index_mark(), None);
    }

    #[test]
    fn deadline_saturates_instead_of_wrapping() {
        let mut seq = FenceSequence::new();
        let mut lease = Lease::default();
        granted(lease.acquire(b"a", MAX_TTL_MS, T0, false, &mut seq));
        assert_eq!(lease.state(T0), State::Held { ttl_ms: MAX_TTL_MS });
    }
}
