//! The node-wide fence sequence, and the bounds every fence stays within.

/// Fences stay below 2^53 so that JavaScript clients read them exactly.
pub const FENCE_LIMIT: u64 = 1 << 53;
/// Fences issued per millisecond of wall clock before the sequence runs
/// ahead of the clock floor. 2^53 / 1024 ms reaches the year 2248.
pub const FENCES_PER_MS: u64 = 1024;
/// How far above its clock floor an observed fence may carry the sequence:
/// 30 days of fences, far more than any clock skew between nodes.
pub const MAX_AHEAD: u64 = 30 * 86_400_000 * FENCES_PER_MS;

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

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_700_000_000_000;

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
}
