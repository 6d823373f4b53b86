//! The two module types: lease keys (`lease-key`) and resource records
//! (`fence-rec`), with their RDB, AOF, memory and copy callbacks, and the RDB
//! aux field that carries the fence sequence.
//!
//! Neither type ever has a Redis TTL: the module enforces lease expiry
//! itself, so `noeviction` and every `volatile-*` policy leave these keys
//! alone.
//!
//! RDB encoding, version 2 (version 1 files load as they are):
//! - lease-key: `fence` (unsigned), `deadline_ms` (unsigned, 0 when free),
//!   `token` (string buffer, empty when free): version 1's fields; then
//!   `0` for a compact lease, or `1` and its holds (`encoding.rs`)
//! - fence-rec: `highest` (unsigned)
//! - aux (before the keyspace): the fence sequence's `last` (unsigned)

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::keyspace::commit::values;
use crate::keyspace::removals::{self, Floor};
use crate::keyspace::state::{self, STATS};
use crate::keyspace::unlinked::{self, Saved};
use crate::model::effect;
use crate::model::encoding::{self, Encoded, Reader, Writer};
use crate::model::holds::Unbound;
use crate::model::lease::{Lease, Resource, FENCE_LIMIT};
use crate::rm::{self, api, Key, ModuleValue};

pub use crate::model::encoding::ENCODING_VERSION;

pub static LEASE_TYPE: RedisType = RedisType::new(
    "lease-key",
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(lease_rdb_load),
        rdb_save: Some(lease_rdb_save),
        aof_rewrite: Some(lease_aof_rewrite),
        mem_usage: Some(lease_mem_usage),
        digest: Some(lease_digest),
        free: Some(lease_free),
        aux_load: Some(aux_load),
        aux_save: Some(aux_save),
        aux_save_triggers: raw::REDISMODULE_AUX_BEFORE_RDB as c_int,
        free_effort: None,
        unlink: None,
        copy: Some(lease_copy),
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: Some(lease_unlink),
        copy2: None,
        aux_save2: None,
    },
);

pub static RESOURCE_TYPE: RedisType = RedisType::new(
    "fence-rec",
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(resource_rdb_load),
        rdb_save: Some(resource_rdb_save),
        aof_rewrite: Some(resource_aof_rewrite),
        mem_usage: Some(resource_mem_usage),
        digest: Some(resource_digest),
        free: Some(resource_free),
        aux_load: None,
        aux_save: None,
        aux_save_triggers: 0,
        free_effort: None,
        unlink: None,
        copy: Some(resource_copy),
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: Some(resource_unlink),
        copy2: None,
        aux_save2: None,
    },
);

// SAFETY: `lease-key` values are made only as `Box<Lease>` (`Key::set`,
// `lease_rdb_load`; copies are refused) and freed as one (`lease_free`).
unsafe impl ModuleValue for Lease {
    fn module_type() -> *mut raw::RedisModuleType {
        lease_type()
    }
}

// SAFETY: `fence-rec` values are made only as `Box<Resource>` (`Key::set`,
// `resource_rdb_load`, `resource_copy`) and freed as one (`resource_free`).
unsafe impl ModuleValue for Resource {
    fn module_type() -> *mut raw::RedisModuleType {
        resource_type()
    }
}

fn lease_type() -> *mut raw::RedisModuleType {
    *LEASE_TYPE.raw_type.borrow()
}

fn resource_type() -> *mut raw::RedisModuleType {
    *RESOURCE_TYPE.raw_type.borrow()
}

/// Stores a new lease value in an empty key.
pub fn store_lease(key: &mut Key, lease: Lease) -> &mut Lease {
    state::arm_leases();
    state::bump(&STATS.lease_keys);
    state::note_name(key.name());
    key.set(Box::new(lease))
}

/// Set while the module deletes a key itself: that removal replaces
/// nothing, leaves no waiter and is no eviction (see `lease_unlink`).
static OWN_DELETE: AtomicBool = AtomicBool::new(false);

/// Deletes a lease key the module is done with (released, reaped, or
/// deleted on a master's word).
pub fn delete(key: &mut Key) {
    OWN_DELETE.store(true, Ordering::Relaxed);
    key.delete();
    OWN_DELETE.store(false, Ordering::Relaxed);
}

/// Stores a new resource record in an empty key.
pub fn store_resource(key: &mut Key, resource: Resource) -> &mut Resource {
    state::arm_records();
    state::bump(&STATS.resource_keys);
    state::note_name(key.name());
    key.set(Box::new(resource))
}

/// Notes the name of the key an RDB load, a full sync or a `RESTORE` is
/// reading (see `state::note_name`).
fn note_loaded_name(rdb: *mut raw::RedisModuleIO) {
    // SAFETY: `rdb` is the IO handle Redis passed the running load callback
    // (the handle rule); the name is null where the load has none.
    let name = unsafe { api!(RedisModule_GetKeyNameFromIO)(rdb) };
    if !name.is_null() {
        state::note_name(rm::bytes(&name.cast_mut()));
    }
}

/// A lease read: counted in the gauge; one read by an RDB load or a full
/// sync has its bound holds in the session index at once, on a replica as
/// on a primary. (A `RESTORE` binds when the key arrives: the server may
/// still refuse the payload.)
fn note_loaded(rdb: *mut raw::RedisModuleIO, lease: &Lease) {
    let name = (lease.bound_holds() > 0)
        .then(|| loading_db(rdb))
        .flatten()
        .map(|(db, name)| (db, name.cast_mut()));
    values::lease_loaded(name.as_ref().map(|(db, n)| (*db, rm::bytes(n))), lease);
}

/// The database and key name an RDB load or full sync is reading; none
/// for a `RESTORE` (or a server that cannot say).
fn loading_db(rdb: *mut raw::RedisModuleIO) -> Option<(i32, *const raw::RedisModuleString)> {
    let loading = rm::context_flags(rm::module_ctx()) & raw::REDISMODULE_CTX_FLAGS_LOADING != 0;
    // SAFETY: a read of the API table after RedisModule_Init wrote it (see
    // `api!`); `None` on a server without it.
    let db_of = unsafe { raw::RedisModule_GetDbIdFromIO }?;
    // SAFETY: `rdb` is the IO handle Redis passed the running load callback
    // (the handle rule); the name is null where the load has none.
    let name = unsafe { api!(RedisModule_GetKeyNameFromIO)(rdb) };
    // SAFETY: as above.
    (loading && !name.is_null()).then(|| (unsafe { db_of(rdb) }, name))
}

fn load_failed(what: &str) -> *mut c_void {
    rm::log_warning(
        std::ptr::null_mut(),
        &format!("redis-lease: refusing to load {what}"),
    );
    std::ptr::null_mut()
}

/// Redis's IO API as a `Reader`: a short read is an IO error, which the
/// module opted to handle (`REDISMODULE_OPTIONS_HANDLE_IO_ERRORS`).
struct Io(*mut raw::RedisModuleIO);

impl Reader for Io {
    fn unsigned(&mut self) -> Option<u64> {
        raw::load_unsigned(self.0).ok()
    }

    fn buffer(&mut self) -> Option<Box<[u8]>> {
        raw::load_string_buffer(self.0)
            .ok()
            .map(|b| b.as_ref().into())
    }
}

/// # Safety
/// Called by Redis with a valid IO handle, from RDB load, `RESTORE` and
/// replication.
unsafe extern "C" fn lease_rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    rm::guard("lease-key load", std::ptr::null_mut, || {
        match encoding::decode_lease(&mut Io(rdb), encver, rm::now_ms()) {
            Ok(lease) => {
                state::arm_leases();
                note_loaded_name(rdb);
                // The fence it carries raises the sequence once the key is
                // really stored (the `restore` event, a rescan): Redis may still
                // refuse the payload after this returns.
                state::bump(&STATS.lease_keys);
                note_loaded(rdb, &lease);
                Box::into_raw(Box::new(lease)).cast()
            }
            Err(what) => load_failed(what),
        }
    })
}

/// # Safety
/// `rdb` is a valid IO handle open for saving; `value` is null or a `Lease`
/// this module stored, not being changed during the call.
unsafe extern "C" fn lease_rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: `value` is a Lease this module stored under this type: Redis
    // hands each type's callbacks only its own values.
    let Some(lease) = (unsafe { value.cast::<Lease>().as_ref() }) else {
        return;
    };
    // All that could fail comes before the first write. If it fails, the
    // lease is saved free with its fence: a whole value, no fence lost
    // (half a value would be an RDB that does not load).
    let saved = rm::guard(
        "lease-key save",
        || Encoded::free(lease.fence()),
        || Encoded::of(lease),
    );
    saved.write(&mut IoWriter(rdb));
}

/// Redis's IO API as a `Writer`.
struct IoWriter(*mut raw::RedisModuleIO);

impl Writer for IoWriter {
    fn unsigned(&mut self, value: u64) {
        // The crate's writer: the handle is the one Redis passed rdb_save.
        raw::save_unsigned(self.0, value);
    }

    fn buffer(&mut self, bytes: &[u8]) {
        raw::save_slice(self.0, bytes);
    }
}

/// # Safety
/// `aof` is a valid IO handle of an AOF rewrite; `key` is the value's
/// name; `value` is null or a `Lease` this module stored.
unsafe extern "C" fn lease_aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    rm::guard(
        "lease-key AOF rewrite",
        || (),
        || {
            // SAFETY: `value` is a Lease this module stored under this
            // type: Redis hands each type's callbacks only its own values.
            let Some(lease) = (unsafe { value.cast::<Lease>().as_ref() }) else {
                return;
            };
            values::lease_rewritten(aof, key, lease);
        },
    )
}

/// # Safety
/// `value` is null or a `Lease` this module stored.
unsafe extern "C" fn lease_mem_usage(value: *const c_void) -> usize {
    let size = std::mem::size_of::<Lease>();
    // SAFETY: `value` is a Lease this module stored under this type: Redis
    // hands each type's callbacks only its own values.
    let lease = unsafe { value.cast::<Lease>().as_ref() };
    rm::guard(
        "lease-key memory usage",
        || size,
        || size + lease.map_or(0, Lease::heap_size),
    )
}

/// # Safety
/// `md` is a valid digest handle; `value` is null or a `Lease` this module
/// stored.
unsafe extern "C" fn lease_digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    // SAFETY: `value` is a Lease this module stored under this type: Redis
    // hands each type's callbacks only its own values.
    let Some(lease) = (unsafe { value.cast::<Lease>().as_ref() }) else {
        return;
    };
    // Its whole state as effects (`effect::whole`), each argument in turn:
    // two nodes with equal digests would replicate the same lease. A state
    // that cannot be read is digested as nothing: the digest then differs
    // from a replica's, which says so.
    rm::guard(
        "lease-key digest",
        || (),
        || {
            effect::whole(lease, |e| {
                e.encode(|parts| {
                    for part in parts {
                        let bytes = part.bytes();
                        // SAFETY: Redis passes a valid digest handle to
                        // digest; the bytes are live for the call, which
                        // copies them.
                        unsafe {
                            api!(RedisModule_DigestAddStringBuffer)(
                                md,
                                bytes.as_ptr().cast(),
                                bytes.len(),
                            )
                        };
                    }
                })
            });
        },
    );
    // SAFETY: Redis passes a valid digest handle to digest.
    unsafe { api!(RedisModule_DigestEndSequence)(md) };
}

/// # Safety
/// `value` is null or a `Lease` this module stored, which nothing uses
/// after this call; Redis frees each value once.
unsafe extern "C" fn lease_free(value: *mut c_void) {
    if value.is_null() {
        return;
    }
    // A drop that panicked leaks the value rather than abort the server.
    rm::guard(
        "lease-key free",
        || (),
        || {
            // SAFETY: `value` is a `Box<Lease>` this module stored under
            // this type (`ModuleValue for Lease`), freed only here, once.
            let lease = unsafe { Box::from_raw(value.cast::<Lease>()) };
            values::lease_freed(&lease);
        },
    );
    state::drop_one(&STATS.lease_keys);
}

/// `COPY` of a lease key is refused (the server answers with an error):
/// a copy would be a second key held by the same token with the same
/// fence. A lease belongs to its key name; records copy. Nothing here can
/// fail. Reads none of its arguments, so not `unsafe`.
extern "C" fn lease_copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    _value: *const c_void,
) -> *mut c_void {
    std::ptr::null_mut()
}

/// The key's database and name, from an unlink callback's context. The
/// name's handle, not its bytes: `rm::bytes` then ties them to the caller.
///
/// # Safety
/// `ctx` is the context Redis passed to the running unlink callback.
unsafe fn unlinked_key(ctx: *mut raw::RedisModuleKeyOptCtx) -> Option<(i32, rm::RString)> {
    // SAFETY: `ctx` is the running unlink callback's (the caller's
    // promise); both calls only read it.
    let (name, db) = unsafe {
        (
            api!(RedisModule_GetKeyNameFromOptCtx)(ctx),
            api!(RedisModule_GetDbIdFromOptCtx)(ctx),
        )
    };
    (!name.is_null()).then(|| (db, name.cast_mut()))
}

/// A lease leaves the keyspace (`DEL`, an overwrite, `RENAME` away,
/// `MIGRATE` away, eviction, the reaper): its index entry goes with it, a
/// note of its fence stays for the value that may replace it in the same
/// command, its waiters are offered the key again (Redis 7.0 serves no
/// client blocked on a key that was overwritten), and a live one goes to
/// `eviction.rs` in case this removal is an eviction.
///
/// # Safety
/// `ctx` is a valid key context; `value` is null or a `Lease` this module
/// stored.
unsafe extern "C" fn lease_unlink(ctx: *mut raw::RedisModuleKeyOptCtx, value: *const c_void) {
    rm::guard(
        "lease-key unlink",
        || (),
        || {
            // SAFETY: `ctx` is the context Redis passed this unlink callback.
            let Some((db, name)) = (unsafe { unlinked_key(ctx) }) else {
                return;
            };
            let key = rm::bytes(&name);
            // SAFETY: `value` is a Lease this module stored under this type:
            // Redis hands each type's callbacks only its own values, and
            // no Key of the module holds it open while it is unlinked.
            let Some(lease) = (unsafe { value.cast::<Lease>().as_ref() }) else {
                return;
            };
            values::lease_unlinked(db, key, lease);
            // The module's own deletions (a release, the reaper, a master's
            // word) replace nothing, leave no waiter behind and are no
            // eviction: the rest is for the server's removals.
            if OWN_DELETE.load(Ordering::Relaxed) {
                return;
            }
            removals::note_removed(db, key, Floor::Lease(lease.fence()));
            if state::waiting_on(db, key) {
                state::wake_later(rm::module_ctx(), db, key);
            }
            // Bound holds count as live here: no other key can be read from
            // an unlink, and a copy of a hold whose session ended is free
            // when it is put back.
            let live = Some(lease).filter(|l| l.is_live(rm::now_ms(), &mut Unbound));
            unlinked::note_unlinked(db, key, live.map(|l| || Saved::Lease(l.clone())));
        },
    )
}

/// # Safety
/// `ctx` is a valid key context; `value` is null or a `Resource` this
/// module stored.
unsafe extern "C" fn resource_unlink(ctx: *mut raw::RedisModuleKeyOptCtx, value: *const c_void) {
    rm::guard(
        "fence-rec unlink",
        || (),
        || {
            // SAFETY: `ctx` is the context Redis passed this unlink callback.
            if let Some((db, name)) = unsafe { unlinked_key(ctx) } {
                let key = rm::bytes(&name);
                // SAFETY: `value` is a Resource this module stored under
                // this type: Redis hands each type's callbacks only its own
                // values, and no Key of the module holds it open meanwhile.
                let record = unsafe { value.cast::<Resource>().as_ref() };
                if let Some(r) = record {
                    removals::note_removed(db, key, Floor::Record(r.highest()));
                }
                unlinked::note_unlinked(db, key, record.map(|r| || Saved::Resource(*r)));
            }
        },
    )
}

/// # Safety
/// Called by Redis with a valid IO handle while loading an RDB.
unsafe extern "C" fn aux_load(rdb: *mut raw::RedisModuleIO, encver: c_int, _when: c_int) -> c_int {
    rm::guard(
        "fence sequence load",
        || raw::REDISMODULE_ERR as c_int,
        || match encoding::decode_sequence(&mut Io(rdb), encver) {
            Ok(last) => {
                state::fences().observe(last, rm::now_ms());
                raw::REDISMODULE_OK as c_int
            }
            Err(what) => {
                load_failed(what);
                raw::REDISMODULE_ERR as c_int
            }
        },
    )
}

/// # Safety
/// Called by Redis with a valid IO handle while saving an RDB.
unsafe extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, _when: c_int) {
    // Read before the write; 0 if that failed (the clock floor then keeps
    // the next fences rising).
    let last = rm::guard("fence sequence save", || 0, || state::fences().last());
    raw::save_unsigned(rdb, last);
}

/// # Safety
/// Called by Redis with a valid IO handle.
unsafe extern "C" fn resource_rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    rm::guard(
        "fence-rec load",
        std::ptr::null_mut,
        || match encoding::decode_resource(&mut Io(rdb), encver) {
            Ok(record) => {
                state::arm_records();
                note_loaded_name(rdb);
                state::bump(&STATS.resource_keys);
                Box::into_raw(Box::new(record)).cast()
            }
            Err(what) => load_failed(what),
        },
    )
}

/// # Safety
/// `rdb` is a valid IO handle open for saving; `value` is null or a
/// `Resource` this module stored.
unsafe extern "C" fn resource_rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: `value` is a Resource this module stored under this type:
    // Redis hands each type's callbacks only its own values.
    if let Some(r) = unsafe { value.cast::<Resource>().as_ref() } {
        // Read before the write. Were the read to fail, the highest fence
        // there is is saved: a whole value, on the side that refuses stale
        // writes.
        let highest = rm::guard("fence-rec save", || FENCE_LIMIT - 1, || r.highest());
        raw::save_unsigned(rdb, highest);
    }
}

/// # Safety
/// `aof` is a valid IO handle of an AOF rewrite; `key` is the value's
/// name; `value` is null or a `Resource` this module stored.
unsafe extern "C" fn resource_aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    // SAFETY: `value` is a Resource this module stored under this type:
    // Redis hands each type's callbacks only its own values.
    if let Some(r) = unsafe { value.cast::<Resource>().as_ref() } {
        let highest = rm::guard("fence-rec AOF rewrite", || FENCE_LIMIT - 1, || r.highest());
        values::record_rewritten(aof, key, highest);
    }
}

/// A fixed size: nothing to read, nothing that can fail (so not `unsafe`).
extern "C" fn resource_mem_usage(_value: *const c_void) -> usize {
    std::mem::size_of::<Resource>()
}

/// # Safety
/// `md` is a valid digest handle; `value` is null or a `Resource` this
/// module stored.
unsafe extern "C" fn resource_digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    // SAFETY: `value` is a Resource this module stored under this type:
    // Redis hands each type's callbacks only its own values.
    if let Some(r) = unsafe { value.cast::<Resource>().as_ref() } {
        let highest = rm::guard("fence-rec digest", || 0, || r.highest());
        // SAFETY: Redis passes a valid digest handle to digest.
        unsafe {
            api!(RedisModule_DigestAddLongLong)(md, highest as i64);
            api!(RedisModule_DigestEndSequence)(md);
        }
    }
}

/// # Safety
/// `value` is null or a `Resource` this module stored, which nothing uses
/// after this call; Redis frees each value once.
unsafe extern "C" fn resource_free(value: *mut c_void) {
    if value.is_null() {
        return;
    }
    rm::guard(
        "fence-rec free",
        || (),
        // SAFETY: `value` is a `Box<Resource>` this module stored under this
        // type (`ModuleValue for Resource`), freed only here, once.
        || drop(unsafe { Box::from_raw(value.cast::<Resource>()) }),
    );
    state::drop_one(&STATS.resource_keys);
}

/// # Safety
/// `value` is null or a `Resource` this module stored.
unsafe extern "C" fn resource_copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    // SAFETY: `value` is a Resource this module stored under this type:
    // Redis hands each type's callbacks only its own values.
    let source = unsafe { value.cast::<Resource>().as_ref() };
    // A copy that cannot be made refuses the COPY (null).
    rm::guard("fence-rec copy", std::ptr::null_mut, || match source {
        Some(r) => {
            state::bump(&STATS.resource_keys);
            Box::into_raw(Box::new(*r)).cast()
        }
        None => std::ptr::null_mut(),
    })
}
