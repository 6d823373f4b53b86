//! Server events and keyspace notifications that keep the node-wide state
//! true: the role (only a primary reaps), the deadline index (keys that
//! appear by `RENAME`, `MOVE`, `COPY`, `RESTORE`, a load or a promotion),
//! waiters (a deleted, flushed, swapped or overwritten key frees the lease
//! for the queue) and the eviction settings; and what the server's own
//! commands may not do to a lease or a record: carry a Redis TTL, or put an
//! older value over a newer one (`RESTORE ... REPLACE`, `RENAME`, `COPY ...
//! REPLACE` onto an existing key).

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};

use redis_module::raw;

use crate::background::armed;
use crate::keyspace::commit::values;
use crate::keyspace::removals::{any_removed, forget_removed, take_removed, Floor};
use crate::keyspace::sessions;
use crate::keyspace::state;
use crate::keyspace::unlinked;
use crate::keyspace::wake;
use crate::model::lease::{Lease, Resource};
use crate::rm::{self, api, Ctx, Key, OwnedString, RString, Slot};

const OK: c_int = raw::REDISMODULE_OK as c_int;

pub fn subscribe(ctx: Ctx) -> Result<(), String> {
    let server_events: [(u64, raw::RedisModuleEventCallback); 5] = [
        (
            raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
            Some(on_role_changed),
        ),
        (raw::REDISMODULE_EVENT_LOADING, Some(on_loading)),
        (raw::REDISMODULE_EVENT_FLUSHDB, Some(on_flush)),
        (raw::REDISMODULE_EVENT_SWAPDB, Some(on_swapdb)),
        (raw::REDISMODULE_EVENT_CONFIG, Some(on_config_change)),
    ];
    for (id, callback) in server_events {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        // SAFETY: `ctx` is the load context (the handle rule); each callback
        // is a function of the module, which is never unloaded (it has data
        // types), taking the arguments Redis gives that event.
        if unsafe { api!(RedisModule_SubscribeToServerEvent)(ctx, event, callback) } != OK {
            return Err(format!("cannot subscribe to server event {id}"));
        }
    }
    armed::install(on_command, on_keyspace_event);
    Ok(())
}

/// `VALKEYMODULE_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION` (Valkey 9): the
/// module handles its keys moving by atomic slot migration.
pub const VALKEY_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION: i32 = 1 << 5;
/// `VALKEYMODULE_EVENT_ATOMIC_SLOT_MIGRATION` and its subevents (Valkey 9;
/// Redis gives 19 another meaning, so it is subscribed on Valkey only).
const VALKEY_EVENT_ATOMIC_SLOT_MIGRATION: u64 = 19;
const IMPORT_STARTED: u64 = 0;
const IMPORT_ABORTED: u64 = 2;
const IMPORT_COMPLETED: u64 = 4;

pub fn subscribe_slot_migration(ctx: Ctx) -> Result<(), String> {
    let event = raw::RedisModuleEvent {
        id: VALKEY_EVENT_ATOMIC_SLOT_MIGRATION,
        dataver: 1,
    };
    // SAFETY: `ctx` is the load context; the callback is a function of the
    // module, which is never unloaded.
    if unsafe { api!(RedisModule_SubscribeToServerEvent)(ctx, event, Some(on_slot_migration)) }
        != OK
    {
        return Err("cannot subscribe to atomic slot migration events".into());
    }
    Ok(())
}

/// An atomic slot migration into this node started or ended. While one
/// runs, the import client's effects are accepted as a master's (see
/// `commands::origin`); the keys it brings are not indexed as they come
/// (their slots are not this node's yet), but by a scan once they are.
///
/// Reads only `sub`, so not `unsafe`.
extern "C" fn on_slot_migration(_ctx: Ctx, _e: raw::RedisModuleEvent, sub: u64, _d: *mut c_void) {
    rm::guard(
        "slot migration",
        || (),
        || match sub {
            IMPORT_STARTED => state::import_started(),
            IMPORT_ABORTED => state::import_ended(),
            IMPORT_COMPLETED => {
                state::import_ended();
                if state::is_primary() {
                    crate::background::reaper::scan_keyspace();
                }
            }
            _ => {}
        },
    )
}

pub fn refresh_role(ctx: Ctx) {
    let primary = rm::context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_MASTER != 0;
    state::set_primary(primary);
}

/// # Safety
/// `ctx` is the event's context, valid for the call.
unsafe extern "C" fn on_role_changed(
    ctx: Ctx,
    _e: raw::RedisModuleEvent,
    sub: u64,
    _d: *mut c_void,
) {
    rm::guard(
        "role change",
        || (),
        || {
            let primary = sub == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER;
            state::set_primary(primary);
            if primary {
                // The replica kept no index; build it from what it replicated.
                crate::background::reaper::rescan();
            } else {
                values::index_cleared();
            }
            let _ = ctx;
        },
    )
}

/// # Safety
/// `ctx` is the event's context, valid for the call.
unsafe extern "C" fn on_loading(ctx: Ctx, _e: raw::RedisModuleEvent, sub: u64, _d: *mut c_void) {
    rm::guard(
        "loading",
        || (),
        || {
            if sub == raw::REDISMODULE_SUBEVENT_LOADING_ENDED {
                refresh_role(ctx);
                if state::is_primary() {
                    crate::background::reaper::rescan();
                }
            }
        },
    )
}

/// # Safety
/// `ctx` is the event's context; `data` is null or a `RedisModuleFlushInfo`
/// (the flush event's data), both valid for the call.
unsafe extern "C" fn on_flush(ctx: Ctx, _e: raw::RedisModuleEvent, sub: u64, data: *mut c_void) {
    if sub != raw::REDISMODULE_SUBEVENT_FLUSHDB_END {
        return;
    }
    rm::guard(
        "flush",
        || (),
        || {
            // SAFETY: Redis passes the flush event a RedisModuleFlushInfo,
            // live for the call, of the version subscribed (1).
            if let Some(info) = unsafe { data.cast::<raw::RedisModuleFlushInfo>().as_ref() } {
                values::flushed(info.dbnum);
                forget_removed();
                if info.dbnum < 0 {
                    state::forget_names();
                }
                // Redis 7.0 serves no client blocked on a key that a flush
                // took: its waiters are offered the lease again.
                wake_all(ctx, info.dbnum);
            }
        },
    )
}

/// Offers the lease again to the waiters of every key in `db` (all: < 0).
fn wake_all(ctx: Ctx, db: i32) {
    let keys = state::waiters().keys(db);
    for (db, key) in keys {
        wake::resignal_later(ctx, db, &key);
    }
}

/// # Safety
/// `ctx` is the event's context; `data` is null or a
/// `RedisModuleSwapDbInfo` (the swapdb event's data), both valid for the
/// call.
unsafe extern "C" fn on_swapdb(ctx: Ctx, _e: raw::RedisModuleEvent, _sub: u64, data: *mut c_void) {
    rm::guard(
        "swapdb",
        || (),
        || {
            // SAFETY: Redis passes the swapdb event a RedisModuleSwapDbInfo,
            // live for the call, of the version subscribed (1).
            if let Some(info) = unsafe { data.cast::<raw::RedisModuleSwapDbInfo>().as_ref() } {
                values::swapped(info.dbnum_first, info.dbnum_second);
                // Waiters stay with their database number, whose keys
                // changed under them.
                wake_all(ctx, info.dbnum_first);
                wake_all(ctx, info.dbnum_second);
            }
        },
    )
}

/// # Safety
/// `ctx` is the event's context; `data` is null or a
/// `RedisModuleConfigChange` (the config event's data) whose
/// `num_changes` names are NUL-terminated strings, all valid for the call.
unsafe extern "C" fn on_config_change(
    ctx: Ctx,
    _e: raw::RedisModuleEvent,
    _sub: u64,
    data: *mut c_void,
) {
    rm::guard(
        "config change",
        || (),
        || {
            // SAFETY: Redis passes the config event a
            // RedisModuleConfigChange, live for the call, of the version
            // subscribed (1).
            let Some(change) = (unsafe { data.cast::<raw::RedisModuleConfigChange>().as_ref() })
            else {
                return;
            };
            // SAFETY: `config_names` holds `num_changes` name pointers,
            // live for the call (the event's contract).
            let names = unsafe {
                std::slice::from_raw_parts(change.config_names, change.num_changes as usize)
            };
            let changed = |prefix: &[u8]| {
                names.iter().any(|&n| {
                    // SAFETY: each name is a NUL-terminated config name,
                    // live for the call.
                    unsafe { CStr::from_ptr(n) }.to_bytes().starts_with(prefix)
                })
            };
            if changed(b"maxmemory") {
                crate::background::eviction::refresh(ctx);
            }
            if changed(b"latency-monitor-threshold") {
                crate::background::reaper::refresh_latency_threshold(ctx);
            }
        },
    )
}

/// # Safety
/// `ctx`, `event` (NUL-terminated) and `key` are a keyspace notification's,
/// valid for the call; the context's database is the key's.
unsafe extern "C" fn on_keyspace_event(
    ctx: Ctx,
    _class: c_int,
    event: *const c_char,
    key: RString,
) -> c_int {
    rm::guard(
        "keyspace event",
        || OK,
        || {
            // SAFETY: Redis passes a notification's event name as a
            // NUL-terminated string, live for the call.
            let event = unsafe { CStr::from_ptr(event) }.to_bytes();
            match event {
                b"move_to" | b"rename_to" | b"copy_to" | b"restore" => {
                    unlinked::forget_unlinked();
                    arrived(ctx, key);
                    if event == b"move_to" {
                        // Valkey 8.1 notifies through the client that runs
                        // MOVE, selecting the destination on it, and leaves
                        // it there: put the client back where MOVE began.
                        rm::select_db(ctx, MOVED_FROM_DB.load(Ordering::Relaxed));
                    }
                }
                // Sent for every TTL set on the server: a name that never
                // held a lease or a record is not looked up.
                b"expire" if state::may_be_ours(rm::bytes(&key)) => keep_without_ttl(ctx, key),
                // Every key of an RDB load: only `DEBUG RELOAD ... MERGE`
                // replaces a value first (its unlink left a note). The name
                // is the loader's, on its stack: a key handle needs a copy.
                b"loaded" if any_removed() => {
                    let name = OwnedString::new(ctx, rm::bytes(&key));
                    arrived(ctx, name.as_ptr());
                }
                b"evicted" => {
                    crate::background::eviction::on_evicted(ctx, key);
                    forget_removed();
                    wake_waiters(ctx, key);
                }
                b"del" | b"expired" => {
                    unlinked::forget_unlinked();
                    forget_removed();
                    wake_waiters(ctx, key);
                }
                // Not the removals' notes: a RENAME onto an existing key
                // unlinks the destination's value before `rename_from`.
                b"rename_from" | b"move_from" => {
                    unlinked::forget_unlinked();
                    wake_waiters(ctx, key);
                    if event == b"move_from" {
                        MOVED_FROM_DB.store(rm::selected_db(ctx), Ordering::Relaxed);
                    }
                }
                _ => {}
            }
            OK
        },
    )
}

/// The database of the last `move_from`, which comes just before its
/// `move_to`.
static MOVED_FROM_DB: AtomicI32 = AtomicI32::new(0);

/// The key left the keyspace: its waiters must not wait for a release that
/// will never come.
fn wake_waiters(ctx: Ctx, key: RString) {
    if wake::has_waiters(ctx, key) {
        wake::resignal_later(ctx, rm::selected_db(ctx), rm::bytes(&key));
    }
}

/// A lease key or record appeared under a name (`RENAME`, `MOVE`, `COPY`,
/// `RESTORE`, `MIGRATE`).
///
/// - If it replaced a value of the same kind in this command, it may not
///   go below it: a record keeps the higher highest; a lease older than the
///   one it replaced (a lower fence) arrives free, with the replaced fence,
///   so an old token never comes back. Every node applies this to the same
///   two values (replicas and the AOF replay the same command), so it needs
///   no replication of its own.
/// - Its fence raises the sequence (a restored key carries a fence issued
///   elsewhere, and the next grant here must be above it).
/// - A primary indexes it: a held lease at its deadline, a free one at once
///   (the reaper deletes it if nobody waits for it).
/// - It keeps no Redis TTL (`RESTORE key ttl`, and `RENAME`, `MOVE`, `COPY`
///   carry the source's).
fn arrived(ctx: Ctx, name: RString) {
    let Some(mut key) = Key::open_read(ctx, name) else {
        forget_removed();
        return;
    };
    let db = key.db();
    let key_bytes = rm::bytes(&name);
    let floor = take_removed(db, key_bytes);
    let now = rm::now_ms();
    match key.value::<Lease>() {
        Slot::Ours(lease) => {
            state::note_name(key_bytes);
            if let Some(Floor::Lease(replaced)) = floor {
                if lease.fence() < replaced {
                    lease.apply(None, replaced);
                }
            }
            values::lease_arrived(db, key_bytes, lease, now);
            state::fences().observe(lease.fence(), now);
        }
        Slot::WrongType => match key.value::<Resource>() {
            Slot::Ours(record) => {
                state::note_name(key_bytes);
                if let Some(Floor::Record(replaced)) = floor {
                    // A lower highest is refused: the record keeps its own.
                    let _ = record.accept(replaced);
                }
                state::fences().observe(record.highest(), now);
            }
            _ => return,
        },
        Slot::Empty => return,
    }
    remove_ttl(ctx, key, name);
}

/// Removes a Redis TTL from a lease key or record: the module expires
/// leases itself, and a TTL would let the server expire or (`volatile-*`)
/// evict a held lease or a record silently.
///
/// Where the server runs post-notification jobs soundly (7.2.4+, Valkey),
/// the TTL goes in a job, before the next command, and `PERSIST` is
/// replicated after the command that set it; a replica or a loading server
/// (which may not add jobs) gets that `PERSIST` from its master or the AOF.
/// Redis 7.0 has no jobs: every node removes it at once, in the
/// notification, which on 7.0 is the last thing each command that sends it
/// does (`EXPIRE`, `RESTORE`, `RENAME`, `MOVE`, `COPY`); a `PERSIST`
/// replicated from there would reach replicas before the command itself.
fn keep_without_ttl(ctx: Ctx, name: RString) {
    let Some(mut key) = Key::open_read(ctx, name) else {
        return;
    };
    if is_ours(&mut key) {
        remove_ttl(ctx, key, name);
    }
}

/// `keep_without_ttl` for a key already open and known to be ours.
fn remove_ttl(ctx: Ctx, key: Key, name: RString) {
    if !key.has_ttl() {
        return;
    }
    if rm::post_notification_jobs() {
        let job = Box::new(TtlJob {
            db: key.db(),
            key: rm::bytes(&name).into(),
        });
        drop(key);
        let pd = Box::into_raw(job).cast::<c_void>();
        // SAFETY: `ctx` is the notification's context; `pd` is a `TtlJob`
        // that Redis hands to `ttl_job`, then to `free_ttl_job` once, both
        // of which read it as one.
        let added = unsafe {
            api!(RedisModule_AddPostNotificationJob)(ctx, Some(ttl_job), pd, Some(free_ttl_job))
        };
        if added != OK {
            // Not ours to free any more only when added.
            // SAFETY: not added, so Redis did not take `pd`: it is still the
            // `Box<TtlJob>` made above, freed only here.
            drop(unsafe { Box::from_raw(pd.cast::<TtlJob>()) });
        }
        return;
    }
    drop(key);
    if let Some(mut key) = Key::open_write(ctx, name) {
        key.persist();
    }
}

fn is_ours(key: &mut Key) -> bool {
    matches!(key.value::<Lease>(), Slot::Ours(_))
        || matches!(key.value::<Resource>(), Slot::Ours(_))
}

struct TtlJob {
    db: i32,
    key: Box<[u8]>,
}

/// # Safety
/// `ctx` is the job's context, valid for the call; `pd` is null or the
/// `TtlJob` `keep_without_ttl` queued, not yet freed.
unsafe extern "C" fn ttl_job(ctx: Ctx, pd: *mut c_void) {
    rm::guard(
        "TTL removal",
        || (),
        || {
            // SAFETY: `pd` is the job's data, a `TtlJob` that Redis frees
            // (with `free_ttl_job`) only after this runs.
            let Some(job) = (unsafe { pd.cast::<TtlJob>().as_ref() }) else {
                return;
            };
            rm::in_db(ctx, job.db, || {
                let name = OwnedString::new(ctx, &job.key);
                let Some(mut key) = Key::open_write(ctx, name.as_ptr()) else {
                    return;
                };
                if is_ours(&mut key) && key.has_ttl() && key.persist() {
                    drop(key);
                    values::persisted(ctx, name.as_ptr());
                }
            });
        },
    )
}

/// # Safety
/// `pd` is null or the `TtlJob` `keep_without_ttl` queued, which nothing
/// uses after this call.
unsafe extern "C" fn free_ttl_job(pd: *mut c_void) {
    if !pd.is_null() {
        rm::guard(
            "TTL job free",
            || (),
            // SAFETY: `pd` is the `Box<TtlJob>` queued in `keep_without_ttl`;
            // Redis calls this free function once per job.
            || drop(unsafe { Box::from_raw(pd.cast::<TtlJob>()) }),
        );
    }
}

/// Most due leases an `EXEC` looks at: they are reaped at their deadline, so
/// more than a few are due at once only while the reaper is held back.
const EXEC_DUE_LIMIT: usize = 64;

/// `WATCH`: Redis aborts an `EXEC` when a watched key expired since the
/// `WATCH`. A lease expires by its deadline, not a Redis TTL, and the reaper
/// deletes it (which does touch watched keys) at that deadline, an event
/// loop turn later at best: so before every `EXEC`, the leases whose
/// deadline has passed and that the reaper has not reached yet are touched
/// as a deletion would touch them. A `MIGRATE` is given its session groups
/// whole (`migrate.rs`). And the first `WATCH` or `CLIENT TRACKING` is
/// noted: from then on a session's end touches its bound keys.
///
/// # Safety
/// `fctx` is a command filter context, valid for the call.
unsafe extern "C" fn on_command(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    // SAFETY: `fctx` is the filter context Redis passed this call; an index
    // past the arguments answers null.
    let name = unsafe { api!(RedisModule_CommandFilterArgGet)(fctx, 0) };
    if name.is_null() {
        return;
    }
    let name = rm::bytes(&name);
    if name.eq_ignore_ascii_case(b"MIGRATE") {
        // SAFETY: `fctx` is this call's filter context, kept by nothing.
        return unsafe { super::migrate::on_migrate(fctx) };
    }
    if name.eq_ignore_ascii_case(b"EXEC") {
        rm::guard("EXEC filter", || (), touch_expired_leases);
    } else if !sessions::watched() {
        // SAFETY: `fctx` is the filter context Redis passed this call; an
        // index past the arguments answers null.
        let sub = || unsafe { api!(RedisModule_CommandFilterArgGet)(fctx, 1) };
        if name.eq_ignore_ascii_case(b"WATCH")
            || (name.eq_ignore_ascii_case(b"CLIENT")
                && !sub().is_null()
                && rm::bytes(&sub()).eq_ignore_ascii_case(b"TRACKING"))
        {
            sessions::note_watched();
        }
    }
}

fn touch_expired_leases() {
    let now = rm::now_ms();
    if !state::index().next_deadline().is_some_and(|d| d <= now) {
        return;
    }
    let due = state::index().due(now, EXEC_DUE_LIMIT);
    let ctx = rm::module_ctx();
    for (db, key) in due {
        rm::in_db(ctx, db, || {
            let name = OwnedString::new(ctx, &key);
            let mut session = None;
            let expired =
                Key::open_read(ctx, name.as_ptr()).is_some_and(|mut k| match k.value::<Lease>() {
                    Slot::Ours(l) if l.has_expired_hold(now) => {
                        session = sessions::session_grant(l);
                        true
                    }
                    _ => false,
                });
            if expired {
                // A session's bound holds expire with it.
                values::expiring_touched(ctx, name.as_ptr(), session.map(|(fence, _)| fence));
            }
        });
    }
}
