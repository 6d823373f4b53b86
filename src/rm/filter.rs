//! A command as the command filter sees it: its arguments, read and
//! changed, and the database of the client that sent it.

use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;

use redis_module::raw;

use super::{string_bytes, OK};

/// The command a filter call is given. Lives no longer than that call
/// (`new`'s promise); argument bytes it lends end with the next change of
/// the arguments (`&mut self`), which may free the string they are in.
pub struct Filtered {
    fctx: NonNull<raw::RedisModuleCommandFilterCtx>,
}

impl Filtered {
    /// # Safety
    /// `fctx` is null or the filter context Redis passed the running filter
    /// callback, and the `Filtered` does not outlive that call.
    pub unsafe fn new(fctx: *mut raw::RedisModuleCommandFilterCtx) -> Option<Self> {
        NonNull::new(fctx).map(|fctx| Self { fctx })
    }

    /// The number of arguments, the command's name included.
    pub fn count(&self) -> usize {
        // SAFETY: `fctx` is live for the filter call (see `new`); the call
        // only reads it.
        let n = unsafe { api!(RedisModule_CommandFilterArgsCount)(self.fctx.as_ptr()) };
        usize::try_from(n).unwrap_or(0)
    }

    /// Argument `pos` (the name is 0).
    pub fn arg(&self, pos: usize) -> Option<&[u8]> {
        let pos = c_int::try_from(pos).ok()?;
        // SAFETY: `fctx` is live (see `new`); a position past the arguments
        // answers null.
        let s = unsafe { api!(RedisModule_CommandFilterArgGet)(self.fctx.as_ptr(), pos) };
        if s.is_null() {
            return None;
        }
        // SAFETY: the argument is the filter's, live until it is replaced
        // or the command is freed: the first takes `&mut self`, which this
        // borrow of `self` excludes, and the second comes after the filter
        // call that `self` does not outlive.
        Some(unsafe { string_bytes(s) })
    }

    /// Argument `pos` becomes `bytes`; false where there is none.
    pub fn replace(&mut self, pos: usize, bytes: &[u8]) -> bool {
        let Ok(pos) = c_int::try_from(pos) else {
            return false;
        };
        let arg = new_arg(bytes);
        // SAFETY: `fctx` is live (see `new`); on success the filter owns
        // `arg` (and frees the argument it replaced, which no borrow of
        // `self` reaches any more: this takes `&mut self`).
        let done =
            unsafe { api!(RedisModule_CommandFilterArgReplace)(self.fctx.as_ptr(), pos, arg) };
        kept_or_freed(done, arg)
    }

    /// `bytes` become the last argument.
    pub fn append(&mut self, bytes: &[u8]) -> bool {
        let Ok(pos) = c_int::try_from(self.count()) else {
            return false;
        };
        let arg = new_arg(bytes);
        // SAFETY: `fctx` is live (see `new`); inserting at the count
        // appends; on success the filter owns `arg`.
        let done =
            unsafe { api!(RedisModule_CommandFilterArgInsert)(self.fctx.as_ptr(), pos, arg) };
        kept_or_freed(done, arg)
    }

    /// The database the sending client has selected, where the server can
    /// tell: it names the client to a filter from Redis 7.2 (and Valkey;
    /// Redis 7.0 does not), and finds it by id only if it has a connection,
    /// which the client of a script or of a module's call does not. In `MULTI` this is the
    /// database when the command is queued (a `SELECT` queued before it has
    /// not run yet).
    pub fn client_db(&self) -> Option<i32> {
        // SAFETY: a read of the API table after RedisModule_Init wrote it
        // (see `api!`); `None` on a server without it.
        let client_id = unsafe { raw::RedisModule_CommandFilterGetClientId }?;
        // SAFETY: `fctx` is live (see `new`); the call only reads it.
        let id = unsafe { client_id(self.fctx.as_ptr()) };
        let mut info = raw::RedisModuleClientInfo {
            version: 1,
            flags: 0,
            id: 0,
            addr: [0; 46],
            port: 0,
            db: 0,
        };
        // SAFETY: `info` is a version-1 client info (the version set above
        // says which fields the server may write), live for the call; the
        // server keeps no pointer to it.
        let found = unsafe {
            api!(RedisModule_GetClientInfoById)(
                (&mut info as *mut raw::RedisModuleClientInfo).cast::<c_void>(),
                id,
            )
        };
        (found == OK).then_some(i32::from(info.db))
    }
}

/// The number of keys in the database selected in `ctx`.
pub fn db_size(ctx: super::Ctx) -> u64 {
    // SAFETY: `ctx` is valid by the handle rule; the call only reads the
    // selected database.
    unsafe { api!(RedisModule_DbSize)(ctx) }
}

/// A new string for the filter to own: made without a context, so no
/// automatic memory frees it behind the filter's back.
fn new_arg(bytes: &[u8]) -> *mut raw::RedisModuleString {
    // SAFETY: a null context is allowed (the string is then the caller's
    // alone); Redis copies `bytes.len()` bytes from `bytes`, a live slice.
    unsafe {
        api!(RedisModule_CreateString)(std::ptr::null_mut(), bytes.as_ptr().cast(), bytes.len())
    }
}

/// Whether the filter took `arg`; if it did not, `arg` is freed here.
fn kept_or_freed(result: c_int, arg: *mut raw::RedisModuleString) -> bool {
    if result == OK {
        return true;
    }
    // SAFETY: the filter refused `arg`, so it is still ours alone: made by
    // `new_arg` without a context and freed once, here.
    unsafe { api!(RedisModule_FreeString)(std::ptr::null_mut(), arg) };
    false
}
