//! The facts `LEASE.DEBUG CHECK` compares (`model::check`): one walk of
//! every database, and a read of each node-wide structure and gauge, all
//! in one command, so that nothing changes between them. Reads only: the
//! walk opens keys without effect (`rm::scan_db`), and no token is copied
//! out of a lease.

use std::collections::HashSet;

use crate::keyspace::sessions;
use crate::keyspace::state::{self, read, STATS};
use crate::model::check::{Facts, Gauges, IndexEntry, Node, Queue, SeenLease};
use crate::model::holds::Holds;
use crate::model::lease::{Lease, Resource};
use crate::rm::{self, Ctx, Key, Slot};

/// What the keyspace and the structures say at `now_ms`. The reaper's own
/// facts are the caller's to add.
pub fn gather(ctx: Ctx, now_ms: u64) -> Facts {
    let mut facts = Facts {
        now_ms,
        ..Facts::default()
    };
    // Every database the server has: selecting one past the last fails.
    let mut db = 0;
    while rm::in_db(ctx, db, || walk(ctx, db, &mut facts)).is_some() {
        match db.checked_add(1) {
            Some(next) => db = next,
            None => break,
        }
    }
    // Read before the gauges: a lazy free runs in another thread and counts
    // its values out of the gauges before it counts them out of this, and
    // none starts while this command runs. So with none pending here the
    // gauges read next are exact.
    let lazyfree_pending = rm::info_number(ctx, c"memory", c"lazyfree_pending_objects");
    let uptime_s = rm::info_number(ctx, c"server", c"uptime_in_seconds").unwrap_or(0);
    facts.node = Node {
        primary: state::is_primary(),
        databases: db,
        importing: state::importing_slots(),
        // Rounded down: the start is no later than this.
        started_ms: now_ms.saturating_sub(uptime_s.saturating_add(1).saturating_mul(1000)),
        lazyfree_pending: lazyfree_pending.unwrap_or(0),
    };
    facts.index = state::index()
        .entries()
        .map(|(db, at_ms, key)| IndexEntry {
            db,
            at_ms,
            key: key.into(),
        })
        .collect();
    let (bound, bound_holds, sessions) = {
        let index = state::bound();
        (index.audit(), index.holds(), index.sessions() as u64)
    };
    facts.bound = bound;
    let (queues, waiters) = {
        let waiters = state::waiters();
        let queues = waiters
            .queues()
            .map(|(db, key, len)| Queue {
                db,
                key: key.into(),
                len,
            })
            .collect();
        (queues, waiters.total() as u64)
    };
    facts.queues = queues;
    facts.gauges = Gauges {
        lease_keys: read(&STATS.lease_keys),
        resource_keys: read(&STATS.resource_keys),
        shared_holds: read(&STATS.shared_holds),
        bound_holds,
        sessions,
        waiters,
        indexed: state::index().len() as u64,
        fence_last: state::fences().last(),
    };
    facts
}

/// Every lease and record of database `db` (selected in `ctx`).
fn walk(ctx: Ctx, db: i32, facts: &mut Facts) {
    let now = facts.now_ms;
    // A key the scan gave twice is counted once.
    let mut seen: HashSet<Box<[u8]>> = HashSet::new();
    rm::scan_db(ctx, |name, key| {
        let bytes = rm::bytes(&name);
        if !seen.insert(bytes.into()) {
            return;
        }
        let mut opened;
        let key = match key {
            Some(key) => key,
            // Every server lends the key; were one not to, it is opened
            // here, for reading.
            None => match Key::open_read(ctx, name) {
                Some(k) => {
                    opened = k;
                    &mut opened
                }
                None => return,
            },
        };
        match key.value::<Lease>() {
            Slot::Ours(lease) => facts.leases.push(seen_lease(db, bytes, lease, now)),
            Slot::WrongType => {
                if matches!(key.value::<Resource>(), Slot::Ours(_)) {
                    facts.records += 1;
                }
            }
            Slot::Empty => {}
        }
    });
}

/// A lease as the check sees it: counts, deadlines, fences and bindings;
/// no token.
fn seen_lease(db: i32, key: &[u8], lease: &Lease, now: u64) -> SeenLease {
    let holds = lease.extended();
    SeenLease {
        db,
        key: key.into(),
        fence: lease.fence(),
        hold_fence: holds
            .and_then(|h| h.iter().map(|(_, g)| g.fence).max())
            .unwrap_or(0),
        // A compact lease stores its holder while it has a deadline.
        holds: holds.map_or(usize::from(lease.deadline().is_some()), Holds::len),
        shared_holds: lease.shared_holds(),
        next_look: lease.deadline(),
        bindings: holds
            .map(|h| h.iter().filter_map(|(_, g)| g.session().cloned()).collect())
            .unwrap_or_default(),
        as_session: sessions::session_grant(lease)
            .and_then(|(fence, _)| lease.session_state(fence, now).map(|s| (fence, s))),
    }
}
