//! The exact error replies the LEASE commands give for bad input, shared by the tests
//! that check them (tests/commands.rs, tests/hostile.rs).

pub const TTL_ERR: &str = "ERR ttl must be an integer from 1 to 1099511627776 (milliseconds)";
pub const TOKEN_ERR: &str = "ERR token must be 1 to 256 bytes";
pub const BLOCK_ERR: &str =
    "ERR BLOCK timeout must be an integer from 0 to 1099511627776 (milliseconds)";
pub const SYNTAX_ERR: &str =
    "ERR syntax error: LEASE.ACQUIRE key ttl [TOKEN token] [BLOCK timeout] [SHARED [LIMIT n]] [SESSION session-key session-token] [OWNER label] [DELAY ms]";
pub const FENCE_ERR: &str = "ERR fence must be an integer from 0 to 9007199254740991";
pub const NESTED_ERR: &str = "ERR LEASE.FENCE cannot run LEASE commands";
pub const UNKNOWN_INNER_ERR: &str = "ERR LEASE.FENCE: unknown inner command";
pub const RESOURCE_ERR: &str =
    "ERR LEASE.FENCE: the inner command may not use the resource key itself";

/// The refusal of a forbidden inner command of LEASE.FENCE.
pub fn forbidden(name: &str) -> String {
    format!(
        "ERR LEASE.FENCE cannot run '{name}': blocking, scripting, transaction, admin and dangerous commands are not allowed"
    )
}

pub const LIMIT_ERR: &str = "ERR LIMIT must be an integer from 1 to 1000000";
pub const OTHER_MODE_ERR: &str = "ERR this token holds the lease in the other mode";
pub const MAX_HOLDERS_ERR: &str = "ERR too many holders for this key (see lease.max-holders)";
pub const OWNER_ERR: &str = "ERR OWNER must be 1 to 128 bytes without control characters";
pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// `ERR LIMIT does not match this lease's limit <m|none>`.
pub fn limit_mismatch(limit: Option<u64>) -> String {
    let shown = limit.map_or_else(|| "none".to_string(), |n| n.to_string());
    format!("ERR LIMIT does not match this lease's limit {shown}")
}
