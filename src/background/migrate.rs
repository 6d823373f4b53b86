//! A `MIGRATE` takes each session's whole group: the command filter closes
//! its key list over the session groups of this node before the server
//! runs it (the rule and the edits: `model::migrate`). The session then
//! leaves with every hold bound to it, so no hold is freed on the source
//! and none arrives on the target before its session.
//!
//! Limits, each a choice of the filter API: the groups are the ones when
//! the filter runs, which in `MULTI` is when the command is queued (a hold
//! bound between that and `EXEC` stays behind and is freed when its session
//! leaves); the database is the client's at that moment where the server
//! names the client (Redis 7.2+, Valkey), else 0 when no other database
//! holds a key, else unknown and the MIGRATE is left as it came (see
//! `database`); a large group makes one large MIGRATE, under the caller's
//! timeout.

use std::collections::HashMap;

use redis_module::raw;

use crate::keyspace::sessions;
use crate::keyspace::state;
use crate::model::holds::Binding;
use crate::model::lease::Lease;
use crate::model::migrate::{self, Edit, Groups, Related};
use crate::rm::filter::{self, Filtered};
use crate::rm::{self, Ctx, Key, OwnedString, Slot};

/// Rewrites the MIGRATE the filter was given, if a session group needs
/// it. Until a hold has been bound on this node it costs one load.
///
/// # Safety
/// `fctx` is the filter context Redis passed the running filter callback;
/// nothing here keeps it past the call.
pub unsafe fn on_migrate(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    if !sessions::any_bound() {
        return;
    }
    // SAFETY: the caller's promise; `command` does not leave this call.
    let Some(mut command) = (unsafe { Filtered::new(fctx) }) else {
        return;
    };
    // A panic (planning comes before the first edit) leaves the MIGRATE as
    // it came: it moves what it names, as it did before this filter.
    rm::guard("MIGRATE filter", || (), || rewrite(&mut command));
}

fn rewrite(command: &mut Filtered) {
    let ctx = rm::module_ctx();
    let Some(db) = database(command, ctx) else {
        return;
    };
    let edits = {
        let args: Vec<&[u8]> = (0..command.count())
            .map(|i| command.arg(i).unwrap_or_default())
            .collect();
        let mut node = Node {
            ctx,
            db,
            here: HashMap::new(),
        };
        rm::in_db(ctx, db, || {
            migrate::plan(&args, &mut node, state::is_cluster())
        })
        .unwrap_or_default()
    };
    let mut applied = true;
    for edit in edits {
        applied &= match edit {
            Edit::Replace(pos, arg) => command.replace(pos, &arg),
            Edit::Append(arg) => command.append(&arg),
        };
    }
    if !applied {
        rm::log_warning(
            std::ptr::null_mut(),
            "redis-lease: a MIGRATE could not be given its session groups whole",
        );
    }
}

/// The database the MIGRATE runs in: the client's, where the server names
/// the client to a filter (Redis 7.2+, Valkey; not a script's or a module's
/// call). Else 0 if no other database holds a key: the MIGRATE then moves
/// keys of database 0 or none at all. Else unknown, and the MIGRATE is left
/// as it came rather than given names of another database's keys.
fn database(command: &Filtered, ctx: Ctx) -> Option<i32> {
    if let Some(db) = command.client_db() {
        return Some(db);
    }
    let others_empty = (1..)
        .map(|db| rm::in_db(ctx, db, || filter::db_size(ctx)))
        .take_while(Option::is_some)
        .all(|keys| keys == Some(0));
    others_empty.then_some(0)
}

/// The keyspace of one database, read from the filter.
///
/// A filter runs outside any command, before the server has looked the
/// command up; keys are read through the module's own context with the
/// client's database selected (as `touch_expired_leases` does before an
/// `EXEC`), which is sound: it is the main thread between commands (or
/// inside the script that calls MIGRATE), no key of the module is open,
/// and a read changes nothing of ours. Only names that have held a lease
/// are opened, and those keep no Redis TTL, so no read expires a key here;
/// the MIGRATE looks up every key it names right after anyway.
struct Node {
    ctx: Ctx,
    db: i32,
    /// Whether each session grant a key was found bound to is on this
    /// node: asked once, not once for every key of its group.
    here: HashMap<Binding, bool>,
}

impl Groups for Node {
    fn related(&mut self, key: &[u8]) -> Related {
        // A name that never held a lease holds no session and no bound
        // hold: it costs a hash, not a lookup.
        if !state::may_be_ours(key) {
            return Related::default();
        }
        let Some((own, bindings)) = self.read(key) else {
            return Related::default();
        };
        let mut related = Related::default();
        if let Some(fence) = own {
            // Copied out: no lock of the index is held while keys are read.
            related.bound = state::bound()
                .bound_keys(self.db, key, fence)
                .map(Box::from)
                .collect();
        }
        for binding in bindings {
            if self.is_here(&binding) {
                related.sessions.push(binding.key);
            }
        }
        related
    }
}

impl Node {
    /// Whether `binding`'s session is on this node: its key holds that very
    /// grant (one that ended and was granted again is another).
    fn is_here(&mut self, binding: &Binding) -> bool {
        if let Some(&here) = self.here.get(binding) {
            return here;
        }
        let here = self.read(&binding.key).and_then(|(own, _)| own) == Some(binding.fence);
        self.here.insert(binding.clone(), here);
        here
    }

    /// What `key`'s lease says: the fence of its grant if that can be a
    /// session, and the sessions its holds are bound to (each once).
    fn read(&self, key: &[u8]) -> Option<(Option<u64>, Vec<Binding>)> {
        let name = OwnedString::new(self.ctx, key);
        let mut open = Key::open_read(self.ctx, name.as_ptr())?;
        let Slot::Ours(lease) = open.value::<Lease>() else {
            return None;
        };
        let own = sessions::session_grant(lease).map(|(fence, _)| fence);
        let mut bindings: Vec<Binding> = Vec::new();
        if let Some(holds) = lease.extended().filter(|_| lease.bound_holds() > 0) {
            for binding in holds.iter().filter_map(|(_, grant)| grant.session()) {
                if !bindings.contains(binding) {
                    bindings.push(binding.clone());
                }
            }
        }
        Some((own, bindings))
    }
}
