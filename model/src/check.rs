//! `LEASE.DEBUG CHECK`: whether the module's own structures agree with the
//! keyspace.
//!
//! Pure: the keyspace layer gathers `Facts` (one walk of every database,
//! and a read of each structure, all inside one command, so nothing moves
//! meanwhile) and `problems` compares them. Facts hold no token: a problem
//! cannot show one.
//!
//! The rules, each exact for the code as it is (the doc comment of each
//! check says why it holds, and what it allows where the live server may
//! legitimately disagree for a moment):
//!
//! - gauges of `INFO lease`: `lease_keys`, `resource_keys` and
//!   `shared_holds` match the keyspace (see `check_gauges`);
//!   `indexed_deadlines`, `waiters`, `bound_holds` and `sessions` match
//!   the structures they count;
//! - deadline index: empty on a replica; on a primary every lease the
//!   reaper must visit has an entry, no later than it must visit it, and
//!   no entry stays due while the reaper is held up (`check_index`);
//! - bound-hold index: per session grant, the holds stored in the keyspace
//!   and bound to it, and whether that session has ended (`check_bound`);
//! - waiter queues: their total, no empty queue, valid databases;
//! - fences: no hold above its key's fence; on a primary the sequence has
//!   observed every stored lease fence (`check_fences`).

use std::collections::HashMap;
use std::fmt;

use crate::holds::{Binding, SessionState};
use crate::lease::{FENCES_PER_MS, FENCE_LIMIT, MAX_AHEAD};

/// Problems the reply lists; it says how many there are in all.
pub const SHOWN: usize = 5;
/// Bytes of a key name a problem shows: the reply stays one bounded line.
const NAME_SHOWN: usize = 48;
/// How long an index entry may stay due beyond a reaper period while the
/// reaper is held up before it counts as left behind: a tick is late by
/// the time the event loop spends elsewhere (a slow command, a fork).
pub const STALE_GRACE_MS: u64 = 2_000;
/// The longest reaper period (`lease.reap-hz` 1). The reaper looks at a
/// free key with waiters again one period later, with an entry that the
/// waiter's grant keeps (its ttl may be shorter than the period), so a
/// lease's first entry may be up to one period, at the `reap-hz` of that
/// time, after its deadline.
pub const LONGEST_REAP_INTERVAL_MS: u64 = 1_000;

/// One lease key as the walk saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenLease {
    pub db: i32,
    pub key: Box<[u8]>,
    /// The last fence issued for the key.
    pub fence: u64,
    /// The highest fence among its holds (0 without holds).
    pub hold_fence: u64,
    /// Holds stored, live or not (a compact lease's holder is one).
    pub holds: usize,
    pub shared_holds: usize,
    /// When the reaper must look next (`Lease::deadline`): the earliest own
    /// deadline of a hold, or the end of a lock-delay; `None` when nothing
    /// is timed (free, or only holds that live as long as their session).
    pub next_look: Option<u64>,
    /// The session of each of its bound holds.
    pub bindings: Vec<Binding>,
    /// Its own grant, if that can be a session: the fence, and what the
    /// key says of it (`Lease::session_state`).
    pub as_session: Option<(u64, SessionState)>,
}

/// One entry of the deadline index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub db: i32,
    pub at_ms: u64,
    pub key: Box<[u8]>,
}

/// One entry of the bound-hold index: a session grant and what is bound
/// to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexedSession {
    pub db: i32,
    pub session: Box<[u8]>,
    pub fence: u64,
    /// Holds bound to it.
    pub total: u64,
    /// The keys that hold them, with how many each (kept while the session
    /// has not ended).
    pub keys: Vec<(Box<[u8]>, u32)>,
    pub ended: bool,
}

/// One key's wait queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queue {
    pub db: i32,
    pub key: Box<[u8]>,
    pub len: usize,
}

/// What `INFO lease` reports, read together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gauges {
    pub lease_keys: u64,
    pub resource_keys: u64,
    pub shared_holds: u64,
    /// `BoundIndex::holds`.
    pub bound_holds: u64,
    /// `BoundIndex::sessions`.
    pub sessions: u64,
    /// `WaitQueues::total`.
    pub waiters: u64,
    /// `DeadlineIndex::len`.
    pub indexed: u64,
    pub fence_last: u64,
}

/// The node around the structures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Node {
    pub primary: bool,
    /// Databases the walk found (`0..databases`).
    pub databases: i32,
    /// Slots are being imported (Valkey 9): their keys are indexed by a
    /// scan once they are this node's.
    pub importing: bool,
    /// When the server started (unix ms, rounded down): every fence the
    /// sequence observed was observed since.
    pub started_ms: u64,
    /// Values a lazy free has still to free (`lazyfree_pending_objects`):
    /// a flush `ASYNC` frees them, and counts them out of the gauges, in a
    /// background thread after the keys left.
    pub lazyfree_pending: u64,
}

/// What the reaper says of itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reaper {
    /// Its period at the `lease.reap-hz` of now.
    pub interval_ms: u64,
    /// The clock of its last tick that took every due entry (at the
    /// module's load, the index was empty: swept).
    pub swept_at: Option<u64>,
    /// Writes are paused now, or were at its last tick: it waits.
    pub held_back: bool,
    /// The index is being rebuilt by a scan (after a load, a promotion or
    /// a slot import), a little each tick.
    pub rescanning: bool,
}

/// Everything the check compares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    pub now_ms: u64,
    pub node: Node,
    pub reaper: Reaper,
    pub gauges: Gauges,
    pub leases: Vec<SeenLease>,
    pub records: u64,
    pub index: Vec<IndexEntry>,
    pub bound: Vec<IndexedSession>,
    pub queues: Vec<Queue>,
}

/// A key as a problem shows it: its database and its name, quoted, with
/// bytes outside printable ASCII escaped and long names cut.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Name(i32, Box<[u8]>);

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:\"", self.0)?;
        for &b in self.1.iter().take(NAME_SHOWN) {
            match b {
                b'"' | b'\\' => write!(f, "\\{}", b as char)?,
                0x20..=0x7e => write!(f, "{}", b as char)?,
                _ => write!(f, "\\x{b:02x}")?,
            }
        }
        if self.1.len() > NAME_SHOWN {
            f.write_str("...")?;
        }
        f.write_str("\"")
    }
}

fn name(db: i32, key: &[u8]) -> Name {
    Name(db, key.into())
}

/// One disagreement. Ordered as the reply lists them: by kind, then key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Problem {
    /// A gauge of `INFO lease` against what it counts.
    Gauge {
        gauge: &'static str,
        value: u64,
        counted: u64,
        what: &'static str,
    },
    /// A replica keeps no deadline index.
    ReplicaIndex { entries: u64 },
    /// A lease the reaper must visit has no index entry.
    NotIndexed { key: Name, due_ms: Option<u64> },
    /// Its first entry is later than its deadline allows.
    IndexedLate {
        key: Name,
        entry_ms: u64,
        due_ms: u64,
    },
    /// An entry due long ago while the reaper is held up.
    Stale {
        key: Name,
        overdue_ms: u64,
        swept_ago_ms: Option<u64>,
    },
    /// Holds bound to a session grant that the bound-hold index lacks.
    BoundMissing {
        session: Name,
        fence: u64,
        stored: u64,
    },
    /// An entry with no stored hold bound to it.
    BoundExtra {
        session: Name,
        fence: u64,
        total: u64,
    },
    /// An entry's count against the holds stored.
    BoundCount {
        session: Name,
        fence: u64,
        total: u64,
        stored: u64,
    },
    /// An entry's count for one key against that key's holds.
    BoundKey {
        session: Name,
        fence: u64,
        key: Name,
        counted: u32,
        stored: u32,
    },
    /// An entry marked ended whose session is live.
    EndedLive { session: Name, fence: u64 },
    /// An entry not marked ended whose session is gone.
    NotEnded { session: Name, fence: u64 },
    /// The index's count of holds against its entries.
    BoundHolds { holds: u64, entries: u64 },
    /// The waiter queues' total against their lengths.
    WaitersTotal { total: u64, queued: u64 },
    /// A queue kept with nobody in it.
    EmptyQueue { key: Name },
    /// A queue in a database the server does not have.
    QueueDb { key: Name, databases: i32 },
    /// A hold with a fence above its key's.
    HoldAboveFence { key: Name, hold: u64, fence: u64 },
    /// A stored fence the sequence has not observed.
    FenceUnseen { key: Name, fence: u64, last: u64 },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Gauge {
                gauge,
                value,
                counted,
                what,
            } => write!(f, "gauge lease_{gauge} is {value} but {what} {counted}"),
            Problem::ReplicaIndex { entries } => write!(
                f,
                "deadline index on a replica holds {entries} entries (replicas keep none)"
            ),
            Problem::NotIndexed { key, due_ms: None } => write!(
                f,
                "deadline index misses free lease {key} (nobody waits; the reaper must delete it)"
            ),
            Problem::NotIndexed {
                key,
                due_ms: Some(due),
            } => write!(f, "deadline index misses lease {key} (due at {due})"),
            Problem::IndexedLate {
                key,
                entry_ms,
                due_ms,
            } => write!(
                f,
                "deadline index holds lease {key} at {entry_ms}, {} ms after its deadline {due_ms}",
                entry_ms - due_ms
            ),
            Problem::Stale {
                key,
                overdue_ms,
                swept_ago_ms,
            } => {
                write!(
                    f,
                    "deadline index entry {key} due {overdue_ms} ms ago was left by the reaper"
                )?;
                match swept_ago_ms {
                    Some(ago) => write!(f, " (last sweep {ago} ms ago)"),
                    None => f.write_str(" (it never swept)"),
                }
            }
            Problem::BoundMissing {
                session,
                fence,
                stored,
            } => write!(
                f,
                "bound-hold index misses session {session} fence {fence} ({stored} stored holds bound to it)"
            ),
            Problem::BoundExtra {
                session,
                fence,
                total,
            } => write!(
                f,
                "bound-hold index has session {session} fence {fence} with {total} holds, none stored"
            ),
            Problem::BoundCount {
                session,
                fence,
                total,
                stored,
            } => write!(
                f,
                "bound-hold index counts {total} holds for session {session} fence {fence}, {stored} stored"
            ),
            Problem::BoundKey {
                session,
                fence,
                key,
                counted,
                stored,
            } => write!(
                f,
                "bound-hold index counts {counted} holds on {key} for session {session} fence {fence}, {stored} stored"
            ),
            Problem::EndedLive { session, fence } => write!(
                f,
                "bound-hold index marks session {session} fence {fence} ended, but it is live"
            ),
            Problem::NotEnded { session, fence } => write!(
                f,
                "bound-hold index keeps session {session} fence {fence} open, but no such session is stored"
            ),
            Problem::BoundHolds { holds, entries } => write!(
                f,
                "bound-hold index counts {holds} holds, its entries {entries}"
            ),
            Problem::WaitersTotal { total, queued } => write!(
                f,
                "waiter queues count {total} waiters, their queues hold {queued}"
            ),
            Problem::EmptyQueue { key } => write!(f, "waiter queue of {key} is kept empty"),
            Problem::QueueDb { key, databases } => write!(
                f,
                "waiter queue of {key} is in a database the server lacks ({databases} databases)"
            ),
            Problem::HoldAboveFence { key, hold, fence } => write!(
                f,
                "lease {key} has a hold with fence {hold} above the key's fence {fence}"
            ),
            Problem::FenceUnseen { key, fence, last } => write!(
                f,
                "lease {key} has fence {fence} but the fence sequence is at {last}"
            ),
        }
    }
}

/// The error reply for a list of problems, or `None` when there is none:
/// `ERR lease check: <n> problems: <first>; <second>; ...`, one line, the
/// first `SHOWN` only.
pub fn reply(problems: &[Problem]) -> Option<String> {
    if problems.is_empty() {
        return None;
    }
    let shown: Vec<String> = problems.iter().take(SHOWN).map(|p| p.to_string()).collect();
    let mut text = format!(
        "ERR lease check: {} problems: {}",
        problems.len(),
        shown.join("; ")
    );
    if problems.len() > SHOWN {
        text.push_str(&format!("; and {} more", problems.len() - SHOWN));
    }
    Some(text)
}

/// `LEASE.DEBUG CHECK` with arguments after it.
pub const CHECK_ARITY: &std::ffi::CStr =
    c"ERR wrong number of arguments for 'lease.debug|check' command";

/// `LEASE.DEBUG` with a subcommand it does not have (its name shown as
/// a key name is: printable, cut).
pub fn unknown_subcommand(name: &[u8]) -> String {
    let shown = Name(0, name.into()).to_string();
    let quoted = shown.strip_prefix("0:").unwrap_or(&shown);
    format!("ERR unknown subcommand {quoted} for 'lease.debug' (CHECK is the only one)")
}

/// Every problem the facts show, in the order the reply lists them.
pub fn problems(facts: &Facts) -> Vec<Problem> {
    let mut found = Vec::new();
    check_gauges(facts, &mut found);
    check_index(facts, &mut found);
    check_bound(facts, &mut found);
    check_waiters(facts, &mut found);
    check_fences(facts, &mut found);
    found.sort();
    found.dedup();
    found
}

/// `lease_keys`, `resource_keys` and `shared_holds` count values as they
/// are made (stored, loaded, copied) and freed, so they equal what the walk
/// finds, except that a lazy free (`FLUSHALL ASYNC`, Valkey's lazy-flush
/// defaults, a replica's full sync) frees values, and counts them out, in a
/// background thread after they left the keyspace: while it has values
/// pending, a gauge may be above the walk's count, never below.
/// `indexed_deadlines`, `waiters`, `bound_holds` and `sessions` are the
/// structures' own counts, kept as they change: they equal what their
/// entries add up to.
fn check_gauges(facts: &Facts, found: &mut Vec<Problem>) {
    let g = &facts.gauges;
    let pending = facts.node.lazyfree_pending > 0;
    let keyspace = |gauge, value: u64, counted: u64, what| {
        let freeing = pending && value > counted;
        (value != counted && !freeing).then_some(Problem::Gauge {
            gauge,
            value,
            counted,
            what,
        })
    };
    let leases = facts.leases.len() as u64;
    let shared: u64 = facts.leases.iter().map(|l| l.shared_holds as u64).sum();
    found.extend(keyspace(
        "keys",
        g.lease_keys,
        leases,
        "the keyspace holds lease keys:",
    ));
    found.extend(keyspace(
        "resource_keys",
        g.resource_keys,
        facts.records,
        "the keyspace holds resource records:",
    ));
    found.extend(keyspace(
        "shared_holds",
        g.shared_holds,
        shared,
        "the keyspace holds shared holds:",
    ));
    let own = |gauge, value: u64, counted: u64, what| {
        (value != counted).then_some(Problem::Gauge {
            gauge,
            value,
            counted,
            what,
        })
    };
    found.extend(own(
        "indexed_deadlines",
        g.indexed,
        facts.index.len() as u64,
        "the deadline index has entries:",
    ));
    let queued: u64 = facts.queues.iter().map(|q| q.len as u64).sum();
    if g.waiters != queued {
        found.push(Problem::WaitersTotal {
            total: g.waiters,
            queued,
        });
    }
    let totals: u64 = facts.bound.iter().map(|b| b.total).sum();
    if g.bound_holds != totals {
        found.push(Problem::BoundHolds {
            holds: g.bound_holds,
            entries: totals,
        });
    }
    let open = facts.bound.iter().filter(|b| !b.ended).count() as u64;
    found.extend(own(
        "sessions",
        g.sessions,
        open,
        "the bound-hold index has sessions not ended:",
    ));
}

/// Whether the reaper must come to a lease by itself: it has a deadline or
/// a lock-delay (`next_look`), or it is a key with no hold at all, which
/// the reaper deletes. Not a free key with waiters: it is there for the
/// queue's head, who is offered it (the release or the reaper signals
/// it), and the reaper looks again once the queue has moved. Not holds
/// that live as long as their session and have no deadline: their
/// session's end hands them to the reaper (`check_bound`).
fn must_visit(lease: &SeenLease, waiting: bool) -> bool {
    lease.next_look.is_some() || (lease.holds == 0 && !waiting)
}

/// The deadline index is a hint: the reaper re-reads every key it pops, so
/// an entry may be early, or be for a key that has gone or changed. What it
/// must never do is miss a lease for good.
///
/// - A replica keeps none (`on_role_changed` clears it; only a primary
///   indexes).
/// - On a primary, every lease the reaper must visit (`must_visit`) has an
///   entry: every place a lease appears or changes indexes it
///   (`state::index_lease`), and the reaper, popping an entry of a lease
///   it leaves, indexes it again in the same tick. Not while the index is
///   rebuilt by a scan, or slots are imported (their keys are indexed by a
///   scan once they are this node's).
/// - Its first entry is no later than `LONGEST_REAP_INTERVAL_MS` after its
///   deadline: an entry is put at the deadline, a renewal keeps it (the
///   lease then looks early), a deadline moved before it gets a new one
///   (the mark is cleared and the lease indexed), and only the reaper's
///   recheck of a free key with waiters is set a period ahead.
/// - No entry stays due beyond a period and `STALE_GRACE_MS` while the
///   reaper is held up. A tick that takes every due entry leaves none at
///   or before its clock (it puts what it keeps at later deadlines), so
///   while the reaper sweeps every period, an entry due before its last
///   sweep arrived since (a `RESTORE` of an expired lease is indexed at
///   its past deadline) and goes at the next tick. Only when it has not
///   swept for longer than that, writes not being paused (it then waits,
///   as the server's own expiry does), is an entry due long ago left
///   behind.
fn check_index(facts: &Facts, found: &mut Vec<Problem>) {
    if !facts.node.primary {
        if !facts.index.is_empty() {
            found.push(Problem::ReplicaIndex {
                entries: facts.index.len() as u64,
            });
        }
        return;
    }
    let now = facts.now_ms;
    let reaper = &facts.reaper;
    let patience = reaper.interval_ms + STALE_GRACE_MS;
    let held_up = !reaper.held_back
        && reaper
            .swept_at
            .map_or(true, |at| now.saturating_sub(at) > patience);
    if held_up {
        for e in &facts.index {
            if e.at_ms.saturating_add(patience) < now {
                found.push(Problem::Stale {
                    key: name(e.db, &e.key),
                    overdue_ms: now - e.at_ms,
                    swept_ago_ms: reaper.swept_at.map(|at| now.saturating_sub(at)),
                });
            }
        }
    }
    if reaper.rescanning || facts.node.importing {
        return;
    }
    let mut first: HashMap<(i32, &[u8]), u64> = HashMap::new();
    for e in &facts.index {
        let at = first.entry((e.db, &e.key)).or_insert(e.at_ms);
        *at = (*at).min(e.at_ms);
    }
    let waiting = waiting(facts);
    for lease in &facts.leases {
        let queued = waiting.contains_key(&(lease.db, &*lease.key));
        if !must_visit(lease, queued) {
            continue;
        }
        let Some(&entry) = first.get(&(lease.db, &*lease.key)) else {
            found.push(Problem::NotIndexed {
                key: name(lease.db, &lease.key),
                due_ms: lease.next_look,
            });
            continue;
        };
        if let Some(due) = lease.next_look {
            if entry > due.saturating_add(LONGEST_REAP_INTERVAL_MS) {
                found.push(Problem::IndexedLate {
                    key: name(lease.db, &lease.key),
                    entry_ms: entry,
                    due_ms: due,
                });
            }
        }
    }
}

fn waiting(facts: &Facts) -> HashMap<(i32, &[u8]), usize> {
    facts
        .queues
        .iter()
        .filter(|q| q.len > 0)
        .map(|q| ((q.db, &*q.key), q.len))
        .collect()
}

/// A session grant: database, session key, fence.
type Grant<'a> = (i32, &'a [u8], u64);

/// The bound-hold index against the holds stored in the keyspace, per
/// session grant (`Binding`: the session key and its grant's fence, in the
/// bound key's database):
///
/// - an entry's `total` is the number of stored holds bound to it (binds
///   and unbinds follow every hold that is stored or leaves), and there is
///   an entry for every grant that stored holds are bound to, none for one
///   with none (the last unbind removes it);
/// - while not ended, its per-key counts are the stored holds per key (an
///   end hands the keys to the reaper, after which only `total` is kept);
/// - an entry marked ended is for a session that is not live: a session
///   grant that ended never becomes live again (the spec's session
///   invariant);
/// - an entry not marked ended is for a live session, or for one whose key
///   still stores the grant with its deadline passed (expired, and not yet
///   handled by the reaper, or, on a replica, by the primary's effects).
///   Or for holds that arrived (`MOVE`, `RESTORE`) where their session is
///   not: the arrival binds them (`bind_all`), and they are free from then
///   on; on a primary they are on keys the index has due now (an arrival
///   without a deadline is indexed at once), which the reaper's next tick
///   drops; a replica keeps them until its primary's effects drop them.
fn check_bound(facts: &Facts, found: &mut Vec<Problem>) {
    let mut stored: HashMap<Grant<'_>, HashMap<&[u8], u32>> = HashMap::new();
    for lease in &facts.leases {
        for b in &lease.bindings {
            *stored
                .entry((lease.db, &b.key, b.fence))
                .or_default()
                .entry(&lease.key)
                .or_default() += 1;
        }
    }
    let sessions: HashMap<(i32, &[u8]), (u64, SessionState)> = facts
        .leases
        .iter()
        .filter_map(|l| l.as_session.map(|s| ((l.db, &*l.key), s)))
        .collect();
    let due_now: std::collections::HashSet<(i32, &[u8])> = facts
        .index
        .iter()
        .filter(|e| e.at_ms <= facts.now_ms)
        .map(|e| (e.db, &*e.key))
        .collect();
    let mut indexed: std::collections::HashSet<Grant<'_>> = std::collections::HashSet::new();
    for entry in &facts.bound {
        let grant = (entry.db, &*entry.session, entry.fence);
        indexed.insert(grant);
        let session = || name(entry.db, &entry.session);
        let keys = stored.get(&grant);
        let held: u64 = keys.map_or(0, |k| k.values().map(|&n| u64::from(n)).sum());
        if held == 0 {
            found.push(Problem::BoundExtra {
                session: session(),
                fence: entry.fence,
                total: entry.total,
            });
        } else if held != entry.total {
            found.push(Problem::BoundCount {
                session: session(),
                fence: entry.fence,
                total: entry.total,
                stored: held,
            });
        }
        if !entry.ended {
            let empty = HashMap::new();
            let keys = keys.unwrap_or(&empty);
            let counted: HashMap<&[u8], u32> = entry.keys.iter().map(|(k, n)| (&**k, *n)).collect();
            let mut all: Vec<&[u8]> = keys.keys().chain(counted.keys()).copied().collect();
            all.sort();
            all.dedup();
            for key in all {
                let (c, s) = (
                    counted.get(key).copied().unwrap_or(0),
                    keys.get(key).copied().unwrap_or(0),
                );
                if c != s {
                    found.push(Problem::BoundKey {
                        session: session(),
                        fence: entry.fence,
                        key: name(entry.db, key),
                        counted: c,
                        stored: s,
                    });
                }
            }
        }
        let state = sessions
            .get(&(entry.db, &*entry.session))
            .filter(|(fence, _)| *fence == entry.fence)
            .map(|(_, state)| *state);
        let live = matches!(state, Some(SessionState::Live { .. }));
        if entry.ended && live {
            found.push(Problem::EndedLive {
                session: session(),
                fence: entry.fence,
            });
        }
        let arrived = !facts.node.primary
            || keys.is_some_and(|k| k.keys().all(|key| due_now.contains(&(entry.db, *key))));
        if !entry.ended && state.is_none() && !arrived {
            found.push(Problem::NotEnded {
                session: session(),
                fence: entry.fence,
            });
        }
    }
    for (grant, keys) in &stored {
        if !indexed.contains(grant) {
            found.push(Problem::BoundMissing {
                session: name(grant.0, grant.1),
                fence: grant.2,
                stored: keys.values().map(|&n| u64::from(n)).sum(),
            });
        }
    }
}

/// A waiter is queued when it blocks and leaves its queue once, whatever
/// ends its wait (`free_waiter`); a queue that empties is dropped; a queue
/// is for a key of the database the client had selected.
fn check_waiters(facts: &Facts, found: &mut Vec<Problem>) {
    for q in &facts.queues {
        if q.len == 0 {
            found.push(Problem::EmptyQueue {
                key: name(q.db, &q.key),
            });
        }
        if q.db < 0 || q.db >= facts.node.databases {
            found.push(Problem::QueueDb {
                key: name(q.db, &q.key),
                databases: facts.node.databases,
            });
        }
    }
}

/// Every grant takes a fence above the key's last (`FenceSequence::next`)
/// and a hold from elsewhere raises the key's fence to its own
/// (`apply_hold`), so no hold is above its key's fence.
///
/// On a primary the sequence has observed every stored lease fence: a
/// grant moves it, and a fence that comes from elsewhere is observed where
/// it arrives (an effect, a `RESTORE`, `MOVE` or `RENAME`, the scan after a
/// load, a promotion or a slot import). An observation raises it no higher
/// than `MAX_AHEAD` above the clock floor of its time, which is no earlier
/// than the server's start: so the sequence is at least the fence, or that
/// ceiling. (A replica observes the effects it applies, not the keys of a
/// full sync, until it is promoted.)
fn check_fences(facts: &Facts, found: &mut Vec<Problem>) {
    let ceiling = facts
        .node
        .started_ms
        .saturating_mul(FENCES_PER_MS)
        .saturating_add(MAX_AHEAD)
        .min(FENCE_LIMIT - 1);
    let observed = facts.node.primary && !facts.reaper.rescanning && !facts.node.importing;
    for lease in &facts.leases {
        if lease.hold_fence > lease.fence {
            found.push(Problem::HoldAboveFence {
                key: name(lease.db, &lease.key),
                hold: lease.hold_fence,
                fence: lease.fence,
            });
        }
        if observed && lease.fence.min(ceiling) > facts.gauges.fence_last {
            found.push(Problem::FenceUnseen {
                key: name(lease.db, &lease.key),
                fence: lease.fence,
                last: facts.gauges.fence_last,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000_000;
    const FENCE: u64 = NOW * FENCES_PER_MS;

    fn lease(db: i32, key: &str) -> SeenLease {
        SeenLease {
            db,
            key: key.as_bytes().into(),
            fence: FENCE,
            hold_fence: FENCE,
            holds: 1,
            shared_holds: 0,
            next_look: Some(NOW + 60_000),
            bindings: Vec::new(),
            as_session: Some((
                FENCE,
                SessionState::Live {
                    deadline_ms: NOW + 60_000,
                },
            )),
        }
    }

    fn bound(key: &str, session: &str, fence: u64) -> SeenLease {
        SeenLease {
            next_look: None,
            bindings: vec![Binding {
                key: session.as_bytes().into(),
                fence,
            }],
            as_session: None,
            ..lease(0, key)
        }
    }

    fn entry(db: i32, at_ms: u64, key: &str) -> IndexEntry {
        IndexEntry {
            db,
            at_ms,
            key: key.as_bytes().into(),
        }
    }

    fn session(name: &str, fence: u64, keys: &[(&str, u32)], ended: bool) -> IndexedSession {
        IndexedSession {
            db: 0,
            session: name.as_bytes().into(),
            fence,
            total: keys.iter().map(|(_, n)| u64::from(*n)).sum(),
            keys: keys
                .iter()
                .map(|(k, n)| (k.as_bytes().into(), *n))
                .collect(),
            ended,
        }
    }

    /// A consistent primary: an exclusive lease, a session with two bound
    /// keys, a shared lease, a record, a waiter.
    fn clean() -> Facts {
        let mut shared = lease(0, "shared");
        shared.holds = 3;
        shared.shared_holds = 3;
        shared.as_session = None;
        let leases = vec![
            lease(0, "plain"),
            lease(0, "s"),
            bound("a", "s", FENCE),
            bound("b", "s", FENCE),
            shared,
            lease(2, "other-db"),
        ];
        let index = vec![
            entry(0, NOW + 60_000, "plain"),
            entry(0, NOW + 60_000, "s"),
            entry(0, NOW + 60_000, "shared"),
            entry(2, NOW + 60_000, "other-db"),
        ];
        Facts {
            now_ms: NOW,
            node: Node {
                primary: true,
                databases: 16,
                importing: false,
                started_ms: NOW - 3_600_000,
                lazyfree_pending: 0,
            },
            reaper: Reaper {
                interval_ms: 100,
                swept_at: Some(NOW - 50),
                held_back: false,
                rescanning: false,
            },
            gauges: Gauges {
                lease_keys: leases.len() as u64,
                resource_keys: 1,
                shared_holds: 3,
                bound_holds: 2,
                sessions: 1,
                waiters: 1,
                indexed: index.len() as u64,
                fence_last: FENCE,
            },
            leases,
            records: 1,
            index,
            bound: vec![session("s", FENCE, &[("a", 1), ("b", 1)], false)],
            queues: vec![Queue {
                db: 0,
                key: b"plain"[..].into(),
                len: 1,
            }],
        }
    }

    /// The problems' kinds, as the first word of their variant's Debug.
    fn kinds(facts: &Facts) -> Vec<String> {
        problems(facts)
            .iter()
            .map(|p| {
                format!("{p:?}")
                    .split([' ', '{'])
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn a_consistent_node_has_no_problem() {
        assert_eq!(kinds(&clean()), Vec::<String>::new());
        assert_eq!(reply(&problems(&clean())), None);
    }

    #[test]
    fn each_planted_disagreement_is_found() {
        type Plant = fn(&mut Facts);
        let cases: &[(&str, Plant, &[&str])] = &[
            (
                "lease_keys one up",
                |f| f.gauges.lease_keys += 1,
                &["Gauge"],
            ),
            (
                "lease_keys one down",
                |f| f.gauges.lease_keys -= 1,
                &["Gauge"],
            ),
            ("resource_keys", |f| f.gauges.resource_keys += 1, &["Gauge"]),
            ("shared_holds", |f| f.gauges.shared_holds -= 1, &["Gauge"]),
            ("indexed", |f| f.gauges.indexed += 1, &["Gauge"]),
            ("sessions", |f| f.gauges.sessions = 0, &["Gauge"]),
            (
                "a lease without its entry",
                |f| f.index.retain(|e| &*e.key != b"plain"),
                &["Gauge", "NotIndexed"],
            ),
            (
                "a lease indexed after its deadline",
                |f| f.index[0].at_ms = NOW + 65_000,
                &["IndexedLate"],
            ),
            (
                "a free key nobody waits for, unindexed",
                |f| {
                    let mut free = lease(1, "free");
                    free.holds = 0;
                    free.next_look = None;
                    free.as_session = None;
                    f.leases.push(free);
                    f.gauges.lease_keys += 1;
                },
                &["NotIndexed"],
            ),
            (
                "an entry stuck while the reaper has not swept",
                |f| {
                    f.reaper.swept_at = Some(NOW - 10_000);
                    f.index.push(entry(0, NOW - 5_000, "ghost"));
                    f.gauges.indexed += 1;
                },
                &["Stale"],
            ),
            (
                "an entry stuck, the reaper never swept",
                |f| {
                    f.reaper.swept_at = None;
                    f.index.push(entry(0, NOW - 5_000, "ghost"));
                    f.gauges.indexed += 1;
                },
                &["Stale"],
            ),
            (
                "a replica with an index",
                |f| f.node.primary = false,
                &["ReplicaIndex"],
            ),
            (
                "a bound-index entry missing",
                |f| {
                    f.bound.clear();
                    f.gauges.bound_holds = 0;
                    f.gauges.sessions = 0;
                },
                &["BoundMissing"],
            ),
            (
                "a bound-index entry for nothing stored",
                |f| {
                    f.bound.push(session("ghost", 1, &[("z", 1)], false));
                    f.gauges.bound_holds += 1;
                    f.gauges.sessions += 1;
                },
                &["BoundExtra", "BoundKey", "NotEnded"],
            ),
            (
                "a bound-index count one up",
                |f| {
                    f.bound[0].total += 1;
                    f.bound[0].keys[0].1 += 1;
                    f.gauges.bound_holds += 1;
                },
                &["BoundCount", "BoundKey"],
            ),
            (
                "the bound-index holds gauge",
                |f| f.gauges.bound_holds += 1,
                &["BoundHolds"],
            ),
            (
                "an ended entry whose session is live",
                |f| {
                    f.bound[0].ended = true;
                    f.bound[0].keys.clear();
                    f.gauges.sessions = 0;
                },
                &["EndedLive"],
            ),
            (
                "an open entry whose session is gone",
                |f| {
                    f.leases.retain(|l| &*l.key != b"s");
                    f.index.retain(|e| &*e.key != b"s");
                    f.gauges.lease_keys -= 1;
                    f.gauges.indexed -= 1;
                },
                &["NotEnded"],
            ),
            (
                "bound holds arrived where their session is not, one not due",
                |f| {
                    f.leases.retain(|l| &*l.key != b"s");
                    f.index.retain(|e| &*e.key != b"s");
                    f.index.push(entry(0, NOW, "a"));
                    f.index.push(entry(0, NOW + 1, "b"));
                    f.gauges.lease_keys -= 1;
                    f.gauges.indexed += 1;
                },
                &["NotEnded"],
            ),
            (
                "an open entry whose session key holds another grant",
                |f| f.leases[1].as_session = Some((FENCE + 1, SessionState::Ended { at_ms: NOW })),
                &["NotEnded"],
            ),
            (
                "the waiters total one up",
                |f| f.gauges.waiters += 1,
                &["WaitersTotal"],
            ),
            (
                "an empty queue kept",
                |f| f.queues[0].len = 0,
                &["WaitersTotal", "EmptyQueue"],
            ),
            (
                "a queue in no database",
                |f| f.queues[0].db = 16,
                &["QueueDb"],
            ),
            (
                "a hold above its key's fence",
                |f| f.leases[0].hold_fence = FENCE + 1,
                &["HoldAboveFence"],
            ),
            (
                "a fence the sequence has not seen",
                |f| f.leases[0].fence = FENCE + 5,
                &["FenceUnseen"],
            ),
        ];
        for (what, plant, want) in cases {
            let mut facts = clean();
            plant(&mut facts);
            assert_eq!(kinds(&facts), *want, "{what}");
        }
    }

    #[test]
    fn legitimate_moments_are_not_problems() {
        type Plant = fn(&mut Facts);
        let cases: &[(&str, Plant)] = &[
            ("a lazy free still counting out values", |f| {
                f.node.lazyfree_pending = 10;
                f.gauges.lease_keys += 3;
                f.gauges.shared_holds += 2;
                f.gauges.resource_keys += 1;
            }),
            ("a renewed lease, looked at early", |f| {
                f.leases[0].next_look = Some(NOW + 600_000)
            }),
            ("a recheck a period after a short waiter's grant", |f| {
                f.index[0].at_ms = NOW + 60_000 + LONGEST_REAP_INTERVAL_MS
            }),
            ("an entry of a key that left", |f| {
                f.index.push(entry(0, NOW + 5_000, "gone"));
                f.gauges.indexed += 1;
            }),
            ("a past entry that arrived after the last sweep", |f| {
                f.index.push(entry(0, NOW - 60_000, "restored"));
                f.gauges.indexed += 1;
            }),
            ("entries due while writes are paused", |f| {
                f.reaper.held_back = true;
                f.reaper.swept_at = Some(NOW - 60_000);
                f.index.push(entry(0, NOW - 30_000, "expired"));
                f.gauges.indexed += 1;
            }),
            ("a free key owed to its waiters", |f| {
                f.leases[0].holds = 0;
                f.leases[0].next_look = None;
                f.leases[0].as_session = None;
                f.index.retain(|e| &*e.key != b"plain");
                f.gauges.indexed -= 1;
            }),
            ("an index being rebuilt", |f| {
                f.reaper.rescanning = true;
                f.index.clear();
                f.gauges.indexed = 0;
            }),
            ("slots being imported", |f| {
                f.node.importing = true;
                f.index.retain(|e| e.db != 2);
                f.gauges.indexed -= 1;
            }),
            ("a session expired, not yet reaped", |f| {
                f.leases[1].as_session = Some((FENCE, SessionState::Ended { at_ms: NOW - 5 }))
            }),
            ("an ended session's entry without its keys", |f| {
                f.leases[1].as_session = Some((FENCE, SessionState::Ended { at_ms: NOW - 5 }));
                f.bound[0].ended = true;
                f.bound[0].keys.clear();
                f.gauges.sessions = 0;
            }),
            ("bound keys arrived where their session is not", |f| {
                f.leases.retain(|l| &*l.key != b"s");
                f.index.retain(|e| &*e.key != b"s");
                f.index.push(entry(0, NOW, "a"));
                f.index.push(entry(0, NOW - 1, "b"));
                f.gauges.lease_keys -= 1;
                f.gauges.indexed += 1;
            }),
            ("a replica: holds arrived where their session is not", |f| {
                f.node.primary = false;
                f.index.clear();
                f.gauges.indexed = 0;
                f.leases.retain(|l| &*l.key != b"s");
                f.gauges.lease_keys -= 1;
            }),
            ("a replica: no index, fences unobserved", |f| {
                f.node.primary = false;
                f.index.clear();
                f.gauges.indexed = 0;
                f.gauges.fence_last = 0;
            }),
            ("a fence beyond the ceiling of the server's start", |f| {
                f.leases[0].fence = FENCE_LIMIT - 1;
                f.leases[0].hold_fence = FENCE_LIMIT - 1;
                f.gauges.fence_last = f.node.started_ms * FENCES_PER_MS + MAX_AHEAD;
            }),
        ];
        for (what, plant) in cases {
            let mut facts = clean();
            plant(&mut facts);
            assert_eq!(kinds(&facts), Vec::<String>::new(), "{what}");
        }
    }

    #[test]
    fn the_reply_is_one_bounded_line_without_secrets() {
        let mut facts = clean();
        facts.gauges.lease_keys += 1;
        let text = reply(&problems(&facts)).expect("a problem");
        assert_eq!(
            text,
            "ERR lease check: 1 problems: gauge lease_keys is 7 but the keyspace holds lease keys: 6"
        );
        // Many problems: the first few, and how many more.
        let mut facts = clean();
        let long = vec![b'\n'; 1_000];
        for i in 0..20 {
            let mut key = long.clone();
            key.push(i);
            facts.leases.push(SeenLease {
                key: key.into(),
                ..lease(0, "")
            });
        }
        facts.gauges.lease_keys += 20;
        let all = problems(&facts);
        assert_eq!(all.len(), 20);
        let text = reply(&all).expect("problems");
        assert!(text.starts_with(
            "ERR lease check: 20 problems: deadline index misses lease 0:\"\\x0a\\x0a"
        ));
        assert!(text.ends_with("; and 15 more"), "{text}");
        assert!(!text.contains('\n') && !text.contains('\r'));
        assert!(text.len() < 2_000, "{}", text.len());
    }

    #[test]
    fn an_unknown_subcommand_is_named_printably() {
        assert_eq!(
            unknown_subcommand(b"nope\r\n"),
            r#"ERR unknown subcommand "nope\x0d\x0a" for 'lease.debug' (CHECK is the only one)"#
        );
    }

    #[test]
    fn names_are_quoted_escaped_and_cut() {
        assert_eq!(name(3, b"a\"b\\c\x01").to_string(), r#"3:"a\"b\\c\x01""#);
        let long = name(0, &[b'k'; 100]).to_string();
        assert_eq!(long.len(), "0:\"".len() + NAME_SHOWN + "...\"".len());
    }
}
