//! `replica`: the replication contract, checked without a server. A random
//! sequence of operations (grants in either mode, with owners, limits and
//! lock-delays; renewals; releases; the reaper's look; time passing) runs
//! on a primary's lease; after each, what the module's commit path would
//! send (the change the
//! model decided, `effect::replicated`) is encoded, decoded and applied to a
//! replica's lease the way `LEASE.APPLY` and a replayed `LEASE.RELEASE` apply
//! it. After every step both nodes hold the same lease, argument for argument
//! as `DEBUG DIGEST` and the AOF rewrite write it (`effect::whole`), or both
//! hold none.
//!
//! Input: four bytes an operation (kind, token, ttl, terms); see `step`.

use crate::holds::{Mode, Terms, Unbound};
use crate::lease::{Acquire, FenceSequence, Lease, Renew, Request};
use crate::model::change::{Change, Fate};
use crate::model::effect::{self, Effect, Emitted};

/// Three tokens, so grants meet, replace and refuse each other.
const TOKENS: [&[u8]; 3] = [b"token-a", b"token-b", b"token-c"];
/// A cap as `lease.max-holders` sets one, low enough to be reached.
const MAX_HOLDERS: usize = 3;
/// The clock's start: any time after the epoch.
const START_MS: u64 = 1_700_000_000_000;

/// One node's copy of the key: a lease, or no key.
type Node = Option<Lease>;

pub fn fuzz_replica(data: &[u8]) {
    let mut primary: Node = None;
    let mut replica: Node = None;
    let mut fences = FenceSequence::new();
    let mut now = START_MS;
    for (n, op) in data.chunks(4).enumerate() {
        let mut op = op.to_vec();
        op.resize(4, 0);
        step(&op, &mut primary, &mut replica, &mut fences, &mut now);
        assert_eq!(
            state(&primary),
            state(&replica),
            "after step {n} {op:?} of {data:?}"
        );
    }
}

/// The lease as its whole-state effects' arguments; none for no key.
fn state(node: &Node) -> Vec<Vec<Vec<u8>>> {
    let mut all = Vec::new();
    if let Some(lease) = node {
        effect::whole(lease, |e| all.push(e.to_args()));
    }
    all
}

/// One operation on the primary, and what it replicates, on the replica.
fn step(
    op: &[u8],
    primary: &mut Node,
    replica: &mut Node,
    fences: &mut FenceSequence,
    now: &mut u64,
) {
    let token = TOKENS[usize::from(op[1]) % TOKENS.len()];
    // 0 to 25.5 s; a grant's at least 100 ms (its parser refuses a ttl of 0
    // without a session), a renewal's as sent (0 is refused there).
    let ttl = u64::from(op[2]) * 100;
    let grant_ttl = ttl.max(100);
    match op[0] % 7 {
        0 | 1 => {
            let shared = op[3] & 1 == 1;
            let terms = Terms {
                mode: if shared {
                    Mode::Shared
                } else {
                    Mode::Exclusive
                },
                limit: (shared && op[3] & 2 == 2).then_some(2),
                owner: (op[3] & 4 == 4).then_some(&b"worker-1"[..]),
                session: None,
                delay_ms: if !shared && op[3] & 8 == 8 { 500 } else { 0 },
            };
            let mut fresh = Lease::default();
            let stored = primary.is_some();
            let lease = primary.as_mut().unwrap_or(&mut fresh);
            let shared_before = lease.shared_holds();
            let request = Request {
                terms,
                max_holders: MAX_HOLDERS,
                ..Request::plain(token, grant_ttl, *now)
            };
            let outcome = lease.acquire(request, fences, &mut Unbound);
            let change = Change::acquired(
                &outcome,
                None,
                None,
                (shared_before, lease.shared_holds()),
                false,
            );
            let granted = matches!(
                outcome,
                Ok((Acquire::Granted { .. } | Acquire::Retried { .. }, _))
            );
            if granted && !stored {
                *primary = Some(fresh);
            }
            replicate(&change, primary, replica, token);
        }
        2 => {
            let Some(lease) = primary.as_mut() else {
                return;
            };
            if lease.renew(token, ttl, *now, &mut Unbound) == Renew::Renewed {
                replicate(&Change::renewed(false), primary, replica, token);
            }
        }
        3 => {
            let Some(lease) = primary.as_mut() else {
                return;
            };
            let mark = lease.index_mark();
            let shared_before = lease.shared_holds();
            let Some(released) = lease.release(token, *now, &mut Unbound) else {
                return;
            };
            let stays = lease.extended().is_some_and(|h| !h.is_empty());
            let shared = (shared_before, lease.shared_holds());
            let change = Change::released(
                &released,
                *now,
                stays,
                false,
                lease.is_extended(),
                mark,
                shared,
            );
            replicate(&change, primary, replica, token);
            if change.fate == Fate::Deleted {
                // The commit path deletes the key (its verbatim release
                // deletes it where replayed).
                *primary = None;
            }
        }
        4 => {
            // The reaper's look at the key (`reaper::reap_key`): a compact
            // lease past its deadline is deleted, an extended one settled.
            let Some(lease) = primary.as_mut() else {
                return;
            };
            let change = if lease.is_extended() {
                Change::settled(lease, *now, &mut Unbound, None, false, *now)
            } else if !lease.is_live(*now, &mut Unbound) {
                Change::reaped(true)
            } else {
                return;
            };
            replicate(&change, primary, replica, token);
            if change.fate == Fate::Deleted {
                *primary = None;
            }
        }
        _ => *now += u64::from(op[2]) * 50,
    }
}

/// Sends what `change` replicates from the primary's lease to the replica,
/// through the encoding, as the replica's commands apply it.
fn replicate(change: &Change, primary: &Node, replica: &mut Node, token: &[u8]) {
    effect::replicated(
        change,
        primary.as_ref(),
        Some(token),
        |emitted| match emitted {
            Emitted::Token(e) => apply(replica, &e),
            Emitted::Stored(e) => apply(replica, &e),
            Emitted::Deleted => *replica = None,
            // The client's command itself: a release, replayed.
            Emitted::Verbatim => {
                let Some(lease) = replica.as_mut() else {
                    return;
                };
                lease.apply_drop([token]);
                if !lease.stays_after_release() {
                    *replica = None;
                }
            }
        },
    );
}

/// `LEASE.APPLY key ...` on the replica, from the effect's wire form.
fn apply<T: AsRef<[u8]>>(replica: &mut Node, e: &Effect<'_, T>) {
    let args = e.to_args();
    let parts: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    let decoded = Effect::decode(&parts).unwrap_or_else(|err| panic!("{args:?}: {err:?}"));
    effect::apply(replica.get_or_insert_with(Lease::default), decoded);
}
