//! Target `decode`: persisted lease-key, fence-rec and fence-sequence values
//! (model/src/encoding.rs) from a hostile RDB / DUMP payload, at every
//! encoding version.

use crate::holds::{Sessions, Unbound, NO_DEADLINE};
use crate::lease::{FenceSequence, Lease, FENCES_PER_MS, FENCE_LIMIT};
use crate::{
    check_invariants, check_views, encoding, rdb, reader, round_trip, NoSessions, DECODE_NOW,
};

/// The first byte is the encoding version (0..=255; the module reads 1 to
/// `ENCODING_VERSION`), the rest a module value as Redis serializes it (see
/// `reader`). Each decoder reads the same bytes from the start.
pub fn fuzz_decode(data: &[u8]) {
    let Some((&version, value)) = data.split_first() else {
        return;
    };
    let encver = i32::from(version);
    check_lease(value, encver);
    check_resource(value, encver);
    check_sequence(value, encver);
}

fn known_version(encver: i32) -> bool {
    (1..=encoding::ENCODING_VERSION).contains(&encver)
}

/// A value that loads is a lease the rest of the module may trust: within
/// every bound (`check_invariants`), saved at the current version to bytes
/// that load back to the same lease, and consistent in what it shows at
/// every instant that matters, whether its sessions are live or not.
fn check_lease(value: &[u8], encver: i32) {
    let decoded = encoding::decode_lease(&mut reader::Reader::new(value), encver, DECODE_NOW);
    let Ok(lease) = decoded else {
        return;
    };
    assert!(known_version(encver), "loaded at version {encver}");
    check_invariants(&lease);
    round_trip(&lease, DECODE_NOW);
    let mut instants = vec![0, DECODE_NOW, u64::MAX];
    let mut around = |t: u64| instants.extend([t.saturating_sub(1), t, t.saturating_add(1)]);
    match lease.extended() {
        None => lease.deadline().into_iter().for_each(&mut around),
        Some(holds) => {
            holds
                .iter()
                .map(|(_, g)| g.deadline_ms)
                .filter(|&d| d != NO_DEADLINE)
                .take(8)
                .for_each(&mut around);
            around(holds.delayed_until());
        }
    }
    for now in instants {
        check_at(&lease, now, &mut Unbound);
        check_at(&lease, now, &mut NoSessions);
    }
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

/// What the lease shows at `now_ms`, and what pruning it then leaves: its
/// live holds exactly, showing the same.
fn check_at(lease: &Lease, now_ms: u64, sessions: &mut impl Sessions) {
    check_views(lease, now_ms, sessions);
    let live = lease.live_holds(now_ms, sessions);
    let state = lease.state(now_ms, sessions);
    let mut pruned = lease.clone();
    let gone = pruned.prune(now_ms, sessions);
    let stored = lease.extended().map_or(0, |h| h.len());
    if lease.is_extended() {
        assert_eq!(gone.len() + live.len(), stored, "pruned at {now_ms}");
        assert!(gone.iter().all(|(_, at)| *at <= now_ms));
        assert_eq!(pruned.extended().map(|h| h.len()), Some(live.len()));
    }
    assert_eq!(pruned.live_holds(now_ms, sessions), live);
    assert_eq!(pruned.state(now_ms, sessions), state);
    check_views(&pruned, now_ms, sessions);
    check_invariants(&pruned);
}

fn check_resource(value: &[u8], encver: i32) {
    let decoded = encoding::decode_resource(&mut reader::Reader::new(value), encver);
    let Ok(record) = decoded else {
        return;
    };
    assert!(known_version(encver), "loaded at version {encver}");
    let first = reader::Reader::new(value).next_unsigned();
    assert_eq!(first, Some(record.highest()));
    assert!(record.highest() < FENCE_LIMIT);
    // Fences at and above the highest pass, below it are stale.
    assert!(record.check(record.highest()).is_ok());
    if let Some(below) = record.highest().checked_sub(1) {
        assert!(record.check(below).is_err());
    }
    let again = rdb::encode_unsigned(record.highest());
    let reloaded =
        encoding::decode_resource(&mut reader::Reader::new(&again), encoding::ENCODING_VERSION);
    assert_eq!(reloaded, Ok(record));
}

fn check_sequence(value: &[u8], encver: i32) {
    let Ok(last) = encoding::decode_sequence(&mut reader::Reader::new(value), encver) else {
        return;
    };
    assert!(known_version(encver), "loaded at version {encver}");
    assert!(last < FENCE_LIMIT);
    assert_eq!(reader::Reader::new(value).next_unsigned(), Some(last));
    // Observed at a clock where it is within reach of the floor, it is kept.
    let mut fences = FenceSequence::new();
    fences.observe(last, last / FENCES_PER_MS);
    assert_eq!(fences.last(), last);
}
