//! This node's place in the cluster: whether it serves a key's slot, read
//! from `CLUSTER KEYSLOT` and its own line of `CLUSTER NODES`.

use crate::keyspace::state;
use crate::rm::{api, Ctx, RString};

/// Whether this node serves `key`'s slot and is not migrating it away:
/// always outside cluster mode. Read from `CLUSTER KEYSLOT` and this node's
/// line of `CLUSTER NODES`, so only for rare paths (a waiter whose key
/// vanished).
pub fn serves_slot_of(ctx: Ctx, key: RString) -> bool {
    if !state::is_cluster() {
        return true;
    }
    // SAFETY: `ctx` and `key` are valid by the handle rule; the format `cs`
    // takes the NUL-terminated string and the module string passed.
    let slot = unsafe {
        api!(RedisModule_Call)(
            ctx,
            c"CLUSTER".as_ptr(),
            c"cs".as_ptr(),
            c"KEYSLOT".as_ptr(),
            key,
        )
    };
    if slot.is_null() {
        return false;
    }
    // SAFETY: `slot` is a live reply (not null, not yet freed); one that is
    // no integer answers 0.
    let slot_number = unsafe { api!(RedisModule_CallReplyInteger)(slot) };
    // SAFETY: `slot` came from RedisModule_Call and is freed once, here.
    unsafe { api!(RedisModule_FreeCallReply)(slot) };
    // SAFETY: `ctx` is valid by the handle rule; the format `c` takes the
    // one NUL-terminated string passed.
    let nodes = unsafe {
        api!(RedisModule_Call)(ctx, c"CLUSTER".as_ptr(), c"c".as_ptr(), c"NODES".as_ptr())
    };
    if nodes.is_null() {
        return false;
    }
    let mut len = 0usize;
    // SAFETY: `nodes` is live until freed below; a reply that is no string
    // answers null.
    let ptr = unsafe { api!(RedisModule_CallReplyStringPtr)(nodes, &mut len) };
    let serves = !ptr.is_null() && {
        // SAFETY: Redis gave `len` bytes at `ptr`, inside `nodes`, which is
        // freed only after this block.
        let text = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
        let text = String::from_utf8_lossy(text);
        text.lines()
            .find(|l| l.split(' ').nth(2).is_some_and(|f| f.contains("myself")))
            .is_some_and(|myself| slot_served(myself, slot_number))
    };
    // SAFETY: `nodes` came from RedisModule_Call and is freed once, here;
    // `serves` borrows nothing from it.
    unsafe { api!(RedisModule_FreeCallReply)(nodes) };
    serves
}

/// Whether a `CLUSTER NODES` line lists `slot` among its own and not as
/// migrating (`[slot->-id]`).
fn slot_served(line: &str, slot: i64) -> bool {
    let mut owned = false;
    for field in line.split(' ').skip(8) {
        if let Some(inner) = field.strip_prefix('[') {
            let migrating = inner
                .split_once("->-")
                .and_then(|(s, _)| s.parse::<i64>().ok());
            if migrating == Some(slot) {
                return false;
            }
            continue;
        }
        let (lo, hi) = field.split_once('-').unwrap_or((field, field));
        if let (Ok(lo), Ok(hi)) = (lo.parse::<i64>(), hi.parse::<i64>()) {
            owned |= lo <= slot && slot <= hi;
        }
    }
    owned
}

#[cfg(test)]
mod tests {
    use super::slot_served;

    #[test]
    fn cluster_nodes_slots_are_read_with_migrations() {
        let line = "id 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 7000 [5461->-other] [9000-<-other]";
        // (slot, served)
        let cases = [
            (0, true),
            (5460, true),
            (5461, false),
            (7000, true),
            (7001, false),
            (9000, false),
            (16383, false),
        ];
        for (slot, served) in cases {
            assert_eq!(slot_served(line, slot), served, "slot {slot}");
        }
        let migrating_owned = "id a myself,master - 0 0 1 connected 0-100 [50->-other]";
        assert!(!slot_served(migrating_owned, 50));
        assert!(slot_served(migrating_owned, 51));
    }
}
