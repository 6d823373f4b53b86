//! Shared holds (version 2 of the contract) everywhere a lease travels: `DEBUG RELOAD`,
//! an RDB and a restart, AOF replay (with and without a rewrite, with and without the
//! RDB preamble), replicas (the same digest after every kind of change, expiry seen
//! before the master reaps, promotion), `DUMP`/`RESTORE`, `MIGRATE`, and cluster slot
//! migration (keys moved by `MIGRATE`, and Valkey 9's atomic slot migration). Every
//! hold comes back with its token, fence, mode, owner and deadline, every key with its
//! limit, and later grants take fences above all of them.

#[macro_use]
extern crate harness;

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use harness::calls::{
    call, call_error, digest, exists, int, release, renew, restore, select, text,
};
use harness::cluster::{key_slot, migrate_slot_atomically, Cluster};
use harness::errors::{limit_mismatch, OTHER_MODE_ERR};
use harness::holds::{holds_still, info_of, info_still, Acquire, Holder, Still, WAIT};
use harness::lease::{dump, lease_info, lease_stat, Info, INFO_FIELDS};
use harness::rdb::{seal, Body};
use harness::reply::{error_text, expect_error, grant};
use harness::waiter::Waiter;
use harness::{info_field, master_and_replica, now_ms, wait_until, Flavor, Server, ServerOptions};
use redis::{Connection, ConnectionLike, Value};

const MINUTE: u64 = 60_000;

/// Lets the wall clock move on by `ms`, so that a deadline a load wrongly reset to
/// now+ttl shows in the ttl.
fn let_clock_advance(ms: u64) {
    let until = now_ms() + ms;
    wait_until("the wall clock to move on", Duration::from_secs(5), || {
        now_ms() >= until
    });
}

// ---------------------------------------------------------------------------
// What a test expects to find again

/// A hold the test made, with the window its absolute deadline must lie in.
#[derive(Clone, Debug)]
struct Hold {
    db: i64,
    key: String,
    token: String,
    fence: u64,
    shared: bool,
    limit: Option<u64>,
    owner: Option<String>,
    ttl: u64,
    earliest: u64,
    latest: u64,
}

impl Hold {
    fn mode(&self) -> &'static str {
        if self.shared {
            "shared"
        } else {
            "exclusive"
        }
    }

    /// The ACQUIRE that made it (and that retries it).
    fn acquire(&self, ttl: u64) -> Acquire {
        let mut a = if self.shared {
            Acquire::shared(&self.key, ttl)
        } else {
            Acquire::exclusive(&self.key, ttl)
        };
        a = a.token(&self.token);
        if let Some(n) = self.limit {
            a = a.limit(n);
        }
        if let Some(o) = &self.owner {
            a = a.owner(o);
        }
        a
    }
}

/// Makes a hold in `db` with `acquire` (which must carry a token) and notes its window.
fn hold(con: &mut Connection, db: i64, acquire: Acquire) -> Hold {
    select(con, db);
    let before = now_ms();
    let fence = acquire.take(con);
    let after = now_ms();
    select(con, 0);
    Hold {
        db,
        key: acquire.key.clone(),
        token: String::from_utf8(acquire.token.clone().expect("a chosen token"))
            .expect("a UTF-8 token"),
        fence,
        shared: acquire.shared,
        limit: acquire.limit,
        owner: acquire
            .owner
            .as_ref()
            .map(|o| String::from_utf8_lossy(o).into_owned()),
        ttl: acquire.ttl,
        earliest: before + acquire.ttl,
        latest: after + acquire.ttl,
    }
}

fn renew_hold(con: &mut Connection, h: &mut Hold, ttl: u64) {
    select(con, h.db);
    let before = now_ms();
    assert_eq!(
        renew(con, &h.key, &h.token, ttl),
        1,
        "renew {} {}",
        h.key,
        h.token
    );
    let after = now_ms();
    select(con, 0);
    h.ttl = ttl;
    h.earliest = before + ttl;
    h.latest = after + ttl;
}

#[derive(Debug, Default)]
struct World {
    holds: Vec<Hold>,
    /// Holds released: (db, key, token); their tokens must stay powerless.
    released: Vec<(i64, String, String)>,
    max_fence: u64,
    new_keys: usize,
}

impl World {
    fn add(&mut self, h: Hold) {
        self.max_fence = self.max_fence.max(h.fence);
        self.holds.push(h);
    }

    fn get_mut(&mut self, key: &str, token: &str) -> &mut Hold {
        self.holds
            .iter_mut()
            .find(|h| h.key == key && h.token == token && h.db == 0)
            .unwrap_or_else(|| panic!("the test holds no {key} for {token}"))
    }

    fn release(&mut self, con: &mut Connection, key: &str, token: &str) {
        let at = self
            .holds
            .iter()
            .position(|h| h.key == key && h.token == token && h.db == 0)
            .unwrap_or_else(|| panic!("the test holds no {key} for {token}"));
        let h = self.holds.remove(at);
        assert_eq!(release(con, key, token), 1, "release {key} {token}");
        self.released.push((0, h.key, h.token));
    }

    /// The keys held, each once: (db, key).
    fn keys(&self) -> Vec<(i64, String)> {
        let mut keys: Vec<(i64, String)> =
            self.holds.iter().map(|h| (h.db, h.key.clone())).collect();
        keys.sort();
        keys.dedup();
        keys
    }

    fn holds_of(&self, db: i64, key: &str) -> Vec<&Hold> {
        let mut holds: Vec<&Hold> = self
            .holds
            .iter()
            .filter(|h| h.db == db && h.key == key)
            .collect();
        holds.sort_by_key(|h| h.fence);
        holds
    }
}

/// A read/write key with three readers (one renewed, one released, owners on two), a
/// semaphore of three permits with two taken, an exclusive hold with an owner, one
/// without (a version 1 client's), and a shared hold in db 1.
fn populate(con: &mut Connection) -> World {
    let mut w = World::default();
    w.add(hold(
        con,
        0,
        Acquire::shared("sh:rw", MINUTE)
            .token("r1")
            .owner("reader-1"),
    ));
    w.add(hold(con, 0, Acquire::shared("sh:rw", 20_000).token("r2")));
    renew_hold(con, w.get_mut("sh:rw", "r2"), 90_000);
    w.add(hold(
        con,
        0,
        Acquire::shared("sh:rw", 45_000)
            .token("r3")
            .owner("reader-3"),
    ));
    w.add(hold(con, 0, Acquire::shared("sh:rw", MINUTE).token("r4")));
    w.release(con, "sh:rw", "r4");
    w.add(hold(
        con,
        0,
        Acquire::shared("sh:sem", MINUTE)
            .token("p1")
            .limit(3)
            .owner("permit-1"),
    ));
    w.add(hold(
        con,
        0,
        Acquire::shared("sh:sem", 50_000).token("p2").limit(3),
    ));
    w.add(hold(
        con,
        0,
        Acquire::exclusive("sh:ex", MINUTE)
            .token("w")
            .owner("writer@host-1 pid 7"),
    ));
    w.add(hold(con, 0, Acquire::exclusive("sh:v1", MINUTE).token("v")));
    w.add(hold(
        con,
        1,
        Acquire::shared("sh:db1", MINUTE)
            .token("d")
            .limit(2)
            .owner("db-one"),
    ));
    let_clock_advance(50);
    w
}

/// More of every kind of change: a renewal, a release of one shared hold, a new one,
/// a permit handed on, an exclusive key turned shared.
fn write_more(con: &mut Connection, w: &mut World) {
    renew_hold(con, w.get_mut("sh:rw", "r1"), 120_000);
    w.release(con, "sh:rw", "r3");
    w.add(hold(
        con,
        0,
        Acquire::shared("sh:rw", 70_000)
            .token("r5")
            .owner("reader-5"),
    ));
    w.release(con, "sh:sem", "p2");
    w.add(hold(
        con,
        0,
        Acquire::shared("sh:sem", MINUTE)
            .token("p3")
            .limit(3)
            .owner("permit-3"),
    ));
    w.release(con, "sh:ex", "w");
    w.add(hold(
        con,
        0,
        Acquire::shared("sh:ex", MINUTE)
            .token("q1")
            .limit(2)
            .owner("now shared"),
    ));
    let_clock_advance(50);
}

/// Checks every key of `w`: `LEASE.INFO`, `LEASE.HOLDERS` with each hold's deadline,
/// each token's retry (same fence) and renewal, the limit, the other mode refused;
/// released tokens powerless; the gauges; and that new grants are above every fence.
fn verify(server: &Server, con: &mut Connection, w: &mut World, when: &str) {
    let keys = w.keys();
    let shared = w.holds.iter().filter(|h| h.shared).count() as u64;
    // Polled: a server that frees the replaced dataset lazily (Valkey 9 after
    // DEBUG RELOAD) counts its values until the free is done.
    wait_until(
        &format!(
            "{when}: INFO lease_keys {} and lease_shared_holds {shared}",
            keys.len()
        ),
        Duration::from_secs(5),
        || {
            lease_stat(server, "keys") == keys.len() as u64
                && lease_stat(server, "shared_holds") == shared
        },
    );
    for (db, key) in &keys {
        select(con, *db);
        assert_eq!(text(call(con, "TYPE", key)), "lease-key", "{when}: {key}");
        let expected = w.holds_of(*db, key);
        let first = expected[0];
        let i = info_of(con, key);
        let exclusive_owner = (!first.shared).then(|| first.owner.clone()).flatten();
        assert_eq!(
            info_still(&i),
            Info {
                state: "held".into(),
                ttl: 0,
                fence: i.fence,
                waiters: 0,
                mode: Some(first.mode().to_string()),
                holders: expected.len() as i64,
                limit: first.limit.map(|n| n as i64),
                owner: exclusive_owner,
                session: None,
                bound: 0,
                fields: INFO_FIELDS.map(String::from).to_vec(),
            },
            "{when}: LEASE.INFO {key} (db {db})"
        );
        let top = expected.iter().map(|h| h.fence).max().unwrap_or(0);
        assert!(
            i.fence >= top,
            "{when}: {key} fence {} below {top}",
            i.fence
        );

        let before = now_ms();
        let listed: Vec<Holder> = harness::holds::holders(con, key);
        let after = now_ms();
        let shown: Vec<(u64, String, Option<String>, Option<String>)> = listed
            .iter()
            .map(|h| (h.fence, h.mode.clone(), h.owner.clone(), h.session.clone()))
            .collect();
        let wanted: Vec<(u64, String, Option<String>, Option<String>)> = expected
            .iter()
            .map(|h| (h.fence, h.mode().to_string(), h.owner.clone(), None))
            .collect();
        assert_eq!(shown, wanted, "{when}: LEASE.HOLDERS {key} (db {db})");
        for (h, l) in expected.iter().zip(&listed) {
            let low = h.earliest as i64 - after as i64 - 1;
            let high = h.latest as i64 - before as i64 + 1;
            assert!(
                (low..=high).contains(&l.ttl),
                "{when}: {key} {} has ttl {} ms; its deadline puts it in {low}..={high} (a \
                 deadline reset on load would show as more)",
                h.token,
                l.ttl
            );
        }
        select(con, 0);
    }

    let mut holds = std::mem::take(&mut w.holds);
    for h in holds.iter_mut() {
        select(con, h.db);
        assert_eq!(
            h.acquire(h.ttl).fence(con),
            Some(h.fence),
            "{when}: {} {}: a retry repeats the fence",
            h.key,
            h.token
        );
        let other = if h.shared {
            Acquire::exclusive(&h.key, 1_000).token(&h.token)
        } else {
            Acquire::shared(&h.key, 1_000).token(&h.token)
        };
        assert_eq!(other.error(con), OTHER_MODE_ERR, "{when}: {}", h.key);
        select(con, 0);
        let ttl = h.ttl;
        renew_hold(con, h, ttl);
    }
    w.holds = holds;
    for (db, key, token) in &w.released {
        select(con, *db);
        assert_eq!(
            renew(con, key, token, MINUTE),
            0,
            "{when}: released {key} {token}"
        );
        select(con, 0);
    }

    // Each key's limit is remembered; each key refuses the other mode.
    for (db, key) in &keys {
        select(con, *db);
        let expected = w.holds_of(*db, key);
        let first = expected[0].clone();
        let room = first.limit.map(|n| n as usize > expected.len());
        if first.shared {
            let other_limit = Acquire::shared(key, 1_000)
                .token("other")
                .limit(first.limit.map_or(7, |n| n + 1));
            assert_eq!(
                other_limit.error(con),
                limit_mismatch(first.limit),
                "{when}: {key}"
            );
            if first.limit.is_none() {
                Acquire::exclusive(key, 1_000).token("writer").refused(con);
            }
        } else {
            Acquire::exclusive(key, 1_000).token("other").refused(con);
            Acquire::shared(key, 1_000).token("reader").refused(con);
        }
        if room == Some(true) {
            // One permit left: taken, then none.
            let mut extra = first.clone();
            extra.token = "extra".into();
            extra.owner = None;
            let f = extra.acquire(1_000).take(con);
            assert!(f > w.max_fence, "{when}: {key}: {f} after {}", w.max_fence);
            w.max_fence = f;
            let mut more = first.clone();
            more.token = "more".into();
            more.acquire(1_000).refused(con);
            assert_eq!(release(con, key, "extra"), 1);
        }
        select(con, 0);
    }

    let last = lease_stat(server, "fence_last");
    assert!(
        last >= w.max_fence,
        "{when}: lease_fence_last {last} below the fence {} issued before",
        w.max_fence
    );
    w.new_keys += 1;
    let key = format!("sh:new{}", w.new_keys);
    let fresh = hold(con, 0, Acquire::shared(&key, MINUTE).token("n"));
    assert!(
        fresh.fence > w.max_fence,
        "{when}: a new grant got {}, not above {}",
        fresh.fence,
        w.max_fence
    );
    w.add(fresh);
}

// ---------------------------------------------------------------------------
// DEBUG RELOAD, RDB, AOF

for_each_server!(debug_reload_keeps_shared_holds, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let mut w = populate(&mut con);
    assert_eq!(call(&mut con, "DEBUG", "RELOAD"), Value::Okay);
    verify(&server, &mut con, &mut w, "after DEBUG RELOAD");
    write_more(&mut con, &mut w);
    assert_eq!(call(&mut con, "DEBUG", "RELOAD"), Value::Okay);
    verify(&server, &mut con, &mut w, "after a second DEBUG RELOAD");
});

for_each_server!(restart_from_an_rdb_keeps_shared_holds, |flavor| {
    let mut server = Server::start_with(flavor, ServerOptions::new().config("save", "3600 1"));
    let mut con = server.client();
    let mut w = populate(&mut con);
    drop(con);
    server.restart();
    let mut con = server.client();
    verify(&server, &mut con, &mut w, "after SHUTDOWN and restart");
    write_more(&mut con, &mut w);
    drop(con);
    server.restart();
    let mut con = server.client();
    verify(&server, &mut con, &mut w, "after a second restart");
});

fn aof_options() -> ServerOptions {
    ServerOptions::new()
        .config("appendonly", "yes")
        .config("appendfsync", "always")
}

for_each_server!(aof_replay_keeps_shared_holds, |flavor| {
    let mut server = Server::start_with(flavor, aof_options());
    let mut con = server.client();
    let mut w = populate(&mut con);
    drop(con);
    server.kill9();
    server.start_again();
    let mut con = server.client();
    verify(&server, &mut con, &mut w, "after AOF replay");
    write_more(&mut con, &mut w);
    drop(con);
    server.kill9();
    server.start_again();
    let mut con = server.client();
    verify(&server, &mut con, &mut w, "after a second AOF replay");
});

/// The base file the AOF manifest names.
fn aof_base(server: &Server) -> Option<PathBuf> {
    let dir = server.dir.join("appendonlydir");
    let manifest = fs::read_to_string(dir.join("appendonly.aof.manifest")).ok()?;
    manifest.lines().find_map(|line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        let name = words.windows(2).find(|w| w[0] == "file")?[1];
        words
            .windows(2)
            .any(|w| w[0] == "type" && w[1] == "b")
            .then(|| dir.join(name))
    })
}

fn rewrite_then_crash(flavor: Flavor, preamble: &str) {
    let mut server = Server::start_with(
        flavor,
        aof_options().config("aof-use-rdb-preamble", preamble),
    );
    let mut con = server.client();
    let mut w = populate(&mut con);
    let before = aof_base(&server);
    let reply = call(&mut con, "BGREWRITEAOF", harness::calls::NONE);
    assert!(error_text(&reply).is_none(), "BGREWRITEAOF: {reply:?}");
    wait_until("the AOF rewrite to finish", WAIT, || {
        let info = server.info("persistence");
        info_field(&info, "aof_rewrite_in_progress").as_deref() == Some("0")
            && info_field(&info, "aof_rewrite_scheduled").as_deref() == Some("0")
            && aof_base(&server) != before
    });
    assert_eq!(
        server
            .info_field("persistence", "aof_last_bgrewrite_status")
            .as_deref(),
        Some("ok")
    );
    let base = aof_base(&server).expect("a base file");
    let contents = fs::read(&base).unwrap_or_else(|e| panic!("{}: {e}", base.display()));
    if preamble == "no" {
        assert!(base.to_string_lossy().ends_with(".base.aof"), "{base:?}");
        let has = |needle: &[u8]| contents.windows(needle.len()).any(|w| w == needle);
        assert!(has(b"LEASE.APPLY"), "no LEASE.APPLY in {}", base.display());
        assert!(has(b"reader-1"), "no owner label in {}", base.display());
    } else {
        assert!(base.to_string_lossy().ends_with(".base.rdb"), "{base:?}");
    }
    write_more(&mut con, &mut w);
    drop(con);
    server.kill9();
    server.start_again();
    let mut con = server.client();
    verify(
        &server,
        &mut con,
        &mut w,
        &format!("after a rewrite (preamble {preamble}), more writes and kill -9"),
    );
}

for_each_server!(
    aof_rewrite_without_rdb_preamble_keeps_shared_holds,
    |flavor| {
        rewrite_then_crash(flavor, "no");
    }
);

for_each_server!(aof_rewrite_with_rdb_preamble_keeps_shared_holds, |flavor| {
    rewrite_then_crash(flavor, "yes");
});

for_each_server!(
    an_expired_shared_hold_is_not_revived_by_a_reload,
    |flavor| {
        let server = Server::start(flavor);
        let mut con = server.client();
        // One transaction: the reaper cannot drop `a` between its expiry and the save.
        let replies: Vec<Value> = redis::pipe()
            .atomic()
            .add_command(Acquire::shared("k", 1).token("a").limit(3).cmd())
            .add_command(Acquire::shared("k", MINUTE).token("b").limit(3).cmd())
            .cmd("DEBUG")
            .arg(("SLEEP", "0.01"))
            .cmd("DEBUG")
            .arg("RELOAD")
            .query(&mut con)
            .unwrap_or_else(|e| panic!("MULTI ... DEBUG RELOAD: {e}"));
        assert_eq!(replies[3], Value::Okay, "DEBUG RELOAD");
        let (_, fb) = grant(replies[1].clone(), "b").expect("granted");
        assert_eq!(
            holds_still(&mut con, "k"),
            [(fb, "shared".to_string(), None)]
        );
        assert_eq!(
            renew(&mut con, "k", "a", MINUTE),
            0,
            "an expired hold revived"
        );
        assert_eq!(release(&mut con, "k", "a"), 0);
        assert_eq!(info_of(&mut con, "k").holders, 1);
        assert_eq!(renew(&mut con, "k", "b", MINUTE), 1);
    }
);

// ---------------------------------------------------------------------------
// Replication

/// The replica has caught up and says of each key what the master says (ttls within
/// 100 ms: both run on this machine's clock); the datasets hash the same.
fn assert_same(master: &Server, replica: &Server, keys: &[&str], when: &str) {
    replica.wait_for_sync(master);
    let mut m = master.client();
    let mut r = replica.client();
    for key in keys {
        let (a, b) = (lease_info(&mut m, key), lease_info(&mut r, key));
        match (&a, &b) {
            (None, None) => {}
            (Some(a), Some(b)) => {
                assert_eq!(info_still(a), info_still(b), "{when}: LEASE.INFO {key}");
                assert!((a.ttl - b.ttl).abs() <= 100, "{when}: {key}: {a:?} {b:?}");
            }
            _ => panic!("{when}: {key}: master {a:?}, replica {b:?}"),
        }
        let (a, b) = (
            harness::holds::holders(&mut m, key),
            harness::holds::holders(&mut r, key),
        );
        assert_eq!(a.len(), b.len(), "{when}: LEASE.HOLDERS {key}: {a:?} {b:?}");
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(
                (x.fence, &x.mode, &x.owner, &x.session),
                (y.fence, &y.mode, &y.owner, &y.session),
                "{when}: LEASE.HOLDERS {key}"
            );
            assert!((x.ttl - y.ttl).abs() <= 100, "{when}: {key}: {x:?} {y:?}");
        }
    }
    assert_eq!(
        digest(master),
        digest(replica),
        "{when}: DEBUG DIGEST differs"
    );
    for field in ["keys", "shared_holds", "fence_last"] {
        assert_eq!(
            lease_stat(master, field),
            lease_stat(replica, field),
            "{when}: INFO lease_{field}"
        );
    }
}

for_each_server!(
    the_replica_agrees_after_every_kind_of_shared_change,
    |flavor| {
        let (master, replica) = master_and_replica(flavor);
        let mut m = master.client();
        let mut r = replica.client();
        config_set_reap(&mut m);
        let keys = ["rw", "sem"];

        Acquire::shared("rw", MINUTE)
            .token("r1")
            .owner("reader-1")
            .take(&mut m);
        Acquire::shared("rw", MINUTE).token("r2").take(&mut m);
        Acquire::shared("sem", MINUTE)
            .token("p1")
            .limit(2)
            .take(&mut m);
        assert_same(&master, &replica, &keys, "after shared grants");

        Acquire::shared("rw", 90_000)
            .token("r1")
            .owner("reader-1")
            .take(&mut m);
        assert_same(&master, &replica, &keys, "after a retry");

        assert_eq!(renew(&mut m, "rw", "r2", 120_000), 1);
        assert_same(&master, &replica, &keys, "after a renewal");

        assert_eq!(release(&mut m, "rw", "r1"), 1);
        assert_same(&master, &replica, &keys, "after the release of one hold");

        let expired = lease_stat(&master, "expired");
        Acquire::shared("rw", 200).token("r3").take(&mut m);
        wait_until("the master's reaper to drop r3", WAIT, || {
            lease_stat(&master, "expired") == expired + 1
        });
        assert_same(&master, &replica, &keys, "after the expiry of one hold");
        assert_eq!(lease_stat(&replica, "expired"), 0, "a replica never reaps");

        // Refusals replicate nothing.
        Acquire::shared("sem", MINUTE)
            .token("p2")
            .limit(3)
            .error(&mut m);
        Acquire::exclusive("rw", MINUTE).token("w").refused(&mut m);
        Acquire::shared("sem", MINUTE)
            .token("p2")
            .limit(2)
            .take(&mut m);
        Acquire::shared("sem", MINUTE)
            .token("p3")
            .limit(2)
            .refused(&mut m);
        assert_same(&master, &replica, &keys, "after refusals and a full limit");

        assert_eq!(release(&mut m, "rw", "r2"), 1);
        assert!(!exists(&mut m, "rw"));
        Acquire::exclusive("rw", MINUTE)
            .token("w")
            .owner("writer")
            .take(&mut m);
        assert_same(
            &master,
            &replica,
            &keys,
            "after an exclusive grant after shared",
        );

        // A handoff from the writer to two readers waiting.
        let s1 = harness::holds::queue(
            &master,
            &Acquire::shared("rw", MINUTE).token("s1").block(0),
            1,
        );
        let s2 = harness::holds::queue(
            &master,
            &Acquire::shared("rw", MINUTE)
                .token("s2")
                .owner("reader-s2")
                .block(0),
            2,
        );
        assert_eq!(release(&mut m, "rw", "w"), 1);
        harness::holds::granted_to(s1, "s1", "s1");
        harness::holds::granted_to(s2, "s2", "s2");
        assert_same(&master, &replica, &keys, "after a handoff to two readers");

        assert_eq!(int(call(&mut m, "DEL", "sem")), 1);
        assert_same(&master, &replica, &keys, "after DEL of a shared key");

        // The replica lists holders and refuses writes.
        assert_eq!(harness::holds::holders(&mut r, "rw").len(), 2);
        let e = call_error(&mut r, "LEASE.ACQUIRE", ("rw", MINUTE, "SHARED"));
        assert!(e.starts_with("READONLY"), "{e}");
    }
);

fn config_set_reap(con: &mut Connection) {
    harness::calls::config_set(con, "lease.reap-hz", "100");
}

for_each_server!(
    an_expired_shared_hold_is_not_listed_on_the_replica_before_the_master_reaps,
    |flavor| {
        let master = Server::start_with(flavor, ServerOptions::new().config("lease.reap-hz", "1"));
        let replica = Server::start(flavor);
        harness::attach(&replica, &master);
        let mut m = master.client();
        let mut r = replica.client();
        let fb = Acquire::shared("k", MINUTE).token("b").take(&mut m);
        let before = now_ms();
        let fa = Acquire::shared("k", 600).token("a").take(&mut m);
        let after = now_ms();
        // The master sleeps at once, so it cannot reap before the replica is seen past
        // the deadline.
        let mut sleeper = master.client();
        sleeper
            .send_packed_command(
                &redis::cmd("DEBUG")
                    .arg("SLEEP")
                    .arg("1.5")
                    .get_packed_command(),
            )
            .unwrap_or_else(|e| panic!("DEBUG SLEEP: {e}"));
        wait_until(
            "the grant to reach the replica",
            Duration::from_secs(2),
            || harness::holds::holder_fences(&mut r, "k").len() == 2 || now_ms() > before + 600,
        );
        if now_ms() < before + 600 {
            assert_eq!(harness::holds::holder_fences(&mut r, "k"), [fb, fa]);
        }
        wait_until("a's deadline to pass", Duration::from_secs(5), || {
            now_ms() > after + 600
        });
        assert_eq!(
            harness::holds::holder_fences(&mut r, "k"),
            [fb],
            "the replica lists an expired hold"
        );
        let i = info_of(&mut r, "k");
        assert_eq!((i.state.as_str(), i.holders), ("held", 1), "{i:?}");
        assert!(i.ttl > 50_000, "{i:?}");
        let woke = sleeper.recv_response().expect("DEBUG SLEEP");
        assert_eq!(woke, Value::Okay);
        wait_until("the master to reap a", WAIT, || {
            lease_stat(&master, "expired") == 1
        });
        assert_same(&master, &replica, &["k"], "after the master reaped");
    }
);

for_each_server!(a_promoted_replica_keeps_shared_holds, |flavor| {
    let (master, replica) = master_and_replica(flavor);
    let mut m = master.client();
    let f1 = Acquire::shared("sem", MINUTE)
        .token("p1")
        .limit(2)
        .owner("permit-1")
        .take(&mut m);
    let f2 = Acquire::shared("sem", MINUTE)
        .token("p2")
        .limit(2)
        .take(&mut m);
    // A token the master generated inside a script reaches the replica as it is.
    let script = "return redis.call('LEASE.ACQUIRE', KEYS[1], 60000, 'SHARED', 'OWNER', 'lua')";
    let reply = call(&mut m, "EVAL", (script, 1, "gen"));
    let (generated, fg) = grant(reply, "EVAL LEASE.ACQUIRE SHARED").expect("granted");
    assert_eq!(generated.len(), 32);
    let issued = lease_stat(&master, "fence_last");
    assert_same(&master, &replica, &["sem", "gen"], "before the promotion");
    let mut r = replica.client();
    assert_eq!(call(&mut r, "REPLICAOF", ("NO", "ONE")), Value::Okay);
    wait_until("the replica to see itself primary", WAIT, || {
        lease_stat(&replica, "role_primary") == 1
    });
    drop(master);

    assert_eq!(
        Acquire::shared("sem", MINUTE)
            .token("p1")
            .limit(2)
            .fence(&mut r),
        Some(f1)
    );
    assert_eq!(renew(&mut r, "sem", "p2", MINUTE), 1);
    Acquire::shared("sem", MINUTE)
        .token("p3")
        .limit(2)
        .refused(&mut r);
    assert_eq!(
        Acquire::shared("sem", MINUTE).token("p3").error(&mut r),
        limit_mismatch(Some(2))
    );
    assert_eq!(release(&mut r, "sem", "p2"), 1);
    let f3 = Acquire::shared("sem", MINUTE)
        .token("p3")
        .limit(2)
        .take(&mut r);
    assert!(f3 > issued && issued >= f2, "{f3} after {issued}");
    assert_eq!(
        holds_still(&mut r, "sem"),
        [
            (f1, "shared".to_string(), Some("permit-1".to_string())),
            (f3, "shared".to_string(), None)
        ]
    );
    assert_eq!(
        holds_still(&mut r, "gen"),
        [(fg, "shared".to_string(), Some("lua".to_string()))]
    );
    assert_eq!(renew(&mut r, "gen", &generated, MINUTE), 1);
    assert_eq!(release(&mut r, "gen", &generated), 1);
    assert!(!exists(&mut r, "gen"));
});

for_each_server!(keyspace_commands_on_shared_keys_replicate, |flavor| {
    let (master, replica) = master_and_replica(flavor);
    let mut m = master.client();
    let keys = ["a", "b", "c", "one"];
    for t in ["r1", "r2"] {
        Acquire::shared("a", MINUTE)
            .token(t)
            .limit(3)
            .owner(t)
            .take(&mut m);
        Acquire::shared("c", MINUTE).token(t).take(&mut m);
    }
    Acquire::shared("one", MINUTE).token("o").take(&mut m);
    assert_same(&master, &replica, &keys, "after the grants");

    assert_eq!(call(&mut m, "RENAME", ("a", "b")), Value::Okay);
    assert_same(&master, &replica, &keys, "after RENAME");
    let payload = dump(&mut m, "one").payload();
    assert_eq!(
        call(&mut m, "RESTORE", ("c", 0, &payload[..], "REPLACE")),
        Value::Okay
    );
    assert_same(&master, &replica, &keys, "after RESTORE REPLACE");
    assert_eq!(int(call(&mut m, "MOVE", ("b", 1))), 1);
    assert_same(&master, &replica, &keys, "after MOVE");
    let mut r = replica.client();
    select(&mut r, 1);
    assert_eq!(harness::holds::holders(&mut r, "b").len(), 2, "b in db 1");
    assert_eq!(call(&mut m, "SET", ("one", "v")), Value::Okay);
    assert_same(&master, &replica, &keys[..3], "after SET over a shared key");
    assert_eq!(lease_stat(&replica, "shared_holds"), 3);
});

for_each_server!(a_version_1_payload_loads_as_an_exclusive_hold, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    Acquire::exclusive("template", MINUTE)
        .token("t")
        .take(&mut con);
    let template = dump(&mut con, "template");
    let fence = lease_stat(&server, "fence_last") + 1_000;
    let body = Body::new("lease-key", 1).lease_fields(fence, now_ms() + MINUTE, b"v1-token");
    assert_eq!(body.module_id() & 1023, 1, "a version 1 value");
    let payload = seal(&body.0, template.version);
    assert_eq!(restore(&mut con, "old", &payload), Value::Okay);

    let i = info_of(&mut con, "old");
    assert_eq!(
        info_still(&i),
        Info {
            state: "held".into(),
            ttl: 0,
            fence,
            waiters: 0,
            mode: Some("exclusive".into()),
            holders: 1,
            limit: None,
            owner: None,
            session: None,
            bound: 0,
            fields: INFO_FIELDS.map(String::from).to_vec(),
        }
    );
    assert!(i.ttl > 50_000, "{i:?}");
    assert_eq!(
        holds_still(&mut con, "old"),
        [(fence, "exclusive".to_string(), None)]
    );
    Acquire::shared("old", MINUTE).token("r").refused(&mut con);
    assert_eq!(
        Acquire::shared("old", MINUTE)
            .token("v1-token")
            .error(&mut con),
        OTHER_MODE_ERR
    );
    assert_eq!(
        Acquire::exclusive("old", MINUTE)
            .token("v1-token")
            .fence(&mut con),
        Some(fence)
    );
    assert!(lease_stat(&server, "fence_last") >= fence);
    // Saved again, it is a value of the current encoding (3) that loads the same.
    assert_eq!(dump(&mut con, "old").module_id() & 1023, 3);
    assert_eq!(call(&mut con, "DEBUG", "RELOAD"), Value::Okay);
    assert_eq!(
        holds_still(&mut con, "old"),
        [(fence, "exclusive".to_string(), None)]
    );
    assert_eq!(release(&mut con, "old", "v1-token"), 1);
    let next = Acquire::shared("old", MINUTE).token("r").take(&mut con);
    assert!(next > fence);
});

// ---------------------------------------------------------------------------
// DUMP / RESTORE / MIGRATE

/// `(fence, mode, owner)` of each hold and `LEASE.INFO` without its ttl.
type Shape = (Vec<Still>, Option<Info>);

fn shape<C: ConnectionLike>(con: &mut C, key: &str) -> Shape {
    (
        holds_still(con, key),
        lease_info(con, key).map(|i| info_still(&i)),
    )
}

/// Three readers (two with owners), a semaphore, an exclusive hold with an owner.
fn seed_keys(con: &mut Connection) -> u64 {
    Acquire::shared("sh:rw", MINUTE)
        .token("r1")
        .owner("reader-1")
        .take(con);
    Acquire::shared("sh:rw", MINUTE).token("r2").take(con);
    Acquire::shared("sh:rw", MINUTE)
        .token("r3")
        .owner("reader-3")
        .take(con);
    Acquire::shared("sh:sem", MINUTE)
        .token("p1")
        .limit(4)
        .take(con);
    Acquire::exclusive("sh:ex", MINUTE)
        .token("w")
        .owner("writer")
        .take(con)
}

const SEEDED: [&str; 3] = ["sh:rw", "sh:sem", "sh:ex"];

for_each_server!(dump_and_restore_carry_shared_holds, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let top = seed_keys(&mut con);
    for key in SEEDED {
        let d = dump(&mut con, key);
        assert_eq!(
            d.module_id() & 1023,
            3,
            "{key} is saved with encoding version 3"
        );
        let copy = format!("{key}:copy");
        assert_eq!(restore(&mut con, &copy, &d.payload()), Value::Okay);
        assert_eq!(shape(&mut con, &copy), shape(&mut con, key), "{copy}");
        let a = harness::holds::holders(&mut con, key);
        let b = harness::holds::holders(&mut con, &copy);
        for (x, y) in a.iter().zip(&b) {
            assert!(y.ttl <= x.ttl + 5 && y.ttl > x.ttl - 1_000, "{x:?} {y:?}");
        }
    }
    // The copies are leases like any other: each token acts on its own hold there.
    assert_eq!(release(&mut con, "sh:rw:copy", "r2"), 1);
    assert_eq!(renew(&mut con, "sh:rw:copy", "r1", MINUTE), 1);
    assert_eq!(harness::holds::holders(&mut con, "sh:rw:copy").len(), 2);
    assert_eq!(
        harness::holds::holders(&mut con, "sh:rw").len(),
        3,
        "the original"
    );
    assert_eq!(
        Acquire::shared("sh:sem:copy", MINUTE)
            .token("x")
            .limit(5)
            .error(&mut con),
        limit_mismatch(Some(4))
    );
    assert_eq!(
        Acquire::shared("sh:ex:copy", MINUTE)
            .token("w")
            .error(&mut con),
        OTHER_MODE_ERR
    );

    // Into a fresh server: its fences go above every restored one.
    let payloads: Vec<(String, Vec<u8>)> = SEEDED
        .iter()
        .map(|k| (k.to_string(), dump(&mut con, k).payload()))
        .collect();
    let shapes: Vec<Shape> = SEEDED.iter().map(|k| shape(&mut con, k)).collect();
    drop(con);
    drop(server);
    let target = Server::start(flavor);
    let mut t = target.client();
    for ((key, payload), wanted) in payloads.iter().zip(&shapes) {
        assert_eq!(restore(&mut t, key, payload), Value::Okay, "{key}");
        assert_eq!(&shape(&mut t, key), wanted, "{key} on a fresh server");
    }
    assert!(lease_stat(&target, "fence_last") >= top);
    assert_eq!(lease_stat(&target, "shared_holds"), 4);
    let next = Acquire::shared("sh:rw", MINUTE).token("r4").take(&mut t);
    assert!(next > top, "{next} after restored fences up to {top}");
    assert_eq!(renew(&mut t, "sh:rw", "r3", MINUTE), 1);
    assert_eq!(renew(&mut t, "sh:ex", "w", MINUTE), 1);
});

for_each_server!(migrate_carries_shared_holds, |flavor| {
    let source = Server::start(flavor);
    let target = Server::start(flavor);
    let mut s = source.client();
    let top = seed_keys(&mut s);
    let shapes: Vec<Shape> = SEEDED.iter().map(|k| shape(&mut s, k)).collect();
    let mut args: Vec<String> = [
        "127.0.0.1",
        &target.port.to_string(),
        "",
        "0",
        "5000",
        "KEYS",
    ]
    .map(String::from)
    .to_vec();
    args.extend(SEEDED.map(String::from));
    let reply = call(&mut s, "MIGRATE", &args);
    assert_eq!(reply, Value::Okay, "MIGRATE");
    for key in SEEDED {
        assert!(!exists(&mut s, key), "{key} left the source");
    }
    assert_eq!(lease_stat(&source, "shared_holds"), 0);
    assert_eq!(lease_stat(&source, "keys"), 0);

    let mut t = target.client();
    for (key, wanted) in SEEDED.iter().zip(&shapes) {
        assert_eq!(&shape(&mut t, key), wanted, "{key} on the target");
    }
    assert_eq!(lease_stat(&target, "shared_holds"), 4);
    assert!(lease_stat(&target, "fence_last") >= top);
    for (key, token) in [
        ("sh:rw", "r1"),
        ("sh:rw", "r2"),
        ("sh:sem", "p1"),
        ("sh:ex", "w"),
    ] {
        assert_eq!(renew(&mut t, key, token, MINUTE), 1, "{key} {token}");
    }
    let next = Acquire::shared("sh:sem", MINUTE)
        .token("p2")
        .limit(4)
        .take(&mut t);
    assert!(next > top);
});

// ---------------------------------------------------------------------------
// Clusters

for_each_server!(slot_migration_carries_shared_holds, |flavor| {
    let cluster = Cluster::start(flavor, 3, 0);
    let slot = key_slot(b"{m}");
    let from = cluster.owner(slot);
    let to = (from + 1) % 3;
    let (src, dst) = (&cluster.nodes[from], &cluster.nodes[to]);
    let mut s = src.client();
    Acquire::shared("{m}rw", MINUTE)
        .token("r1")
        .owner("reader-1")
        .take(&mut s);
    Acquire::shared("{m}rw", MINUTE).token("r2").take(&mut s);
    Acquire::shared("{m}sem", MINUTE)
        .token("p1")
        .limit(2)
        .owner("permit-1")
        .take(&mut s);
    let top = Acquire::exclusive("{m}ex", MINUTE)
        .token("w")
        .owner("writer")
        .take(&mut s);
    let keys = ["{m}ex", "{m}rw", "{m}sem"];
    let shapes: Vec<Shape> = keys.iter().map(|k| shape(&mut s, k)).collect();

    let mut moved = cluster.migrate_slot(slot, to, |_, _, _| {});
    moved.sort();
    assert_eq!(moved, keys);
    assert_eq!(cluster.owner(slot), to);
    assert_eq!(lease_stat(src, "shared_holds"), 0);
    assert_eq!(lease_stat(dst, "shared_holds"), 3);

    let mut d = dst.client();
    for (key, wanted) in keys.iter().zip(&shapes) {
        assert_eq!(&shape(&mut d, key), wanted, "{key} on the destination");
    }
    for (key, token) in [
        ("{m}rw", "r1"),
        ("{m}rw", "r2"),
        ("{m}sem", "p1"),
        ("{m}ex", "w"),
    ] {
        assert_eq!(renew(&mut d, key, token, MINUTE), 1, "{key} {token}");
    }
    assert_eq!(
        Acquire::shared("{m}sem", MINUTE).token("p2").error(&mut d),
        limit_mismatch(Some(2))
    );
    Acquire::exclusive("{m}rw", MINUTE)
        .token("x")
        .refused(&mut d);
    let next = Acquire::shared("{m}sem", MINUTE)
        .token("p2")
        .limit(2)
        .take(&mut d);
    assert!(next > top, "{next} after migrated fences up to {top}");
    Acquire::shared("{m}sem", MINUTE)
        .token("p3")
        .limit(2)
        .refused(&mut d);
});

/// Valkey 9 only: the other servers of the matrix have no atomic slot migration.
mod atomic_slot_migration_carries_shared_holds {
    use super::*;

    #[test]
    fn valkey9() {
        atomic_slot_migration();
    }
}

fn atomic_slot_migration() {
    let cluster = Cluster::start(Flavor::Valkey9, 2, 1);
    let (from, to) = (0, 1);
    let tag = cluster.tag_on(from, &[]);
    let slot = key_slot(tag.as_bytes());
    let key = |name: &str| format!("{tag}{name}");
    let source = &cluster.nodes[from];
    let target = &cluster.nodes[to];
    let mut con = source.client();

    Acquire::shared(&key("rw"), MINUTE)
        .token("r1")
        .owner("reader-1")
        .take(&mut con);
    Acquire::shared(&key("rw"), MINUTE)
        .token("r2")
        .take(&mut con);
    // A full semaphore, and a reader waiting for it on the source when it leaves.
    Acquire::shared(&key("sem"), MINUTE)
        .token("p1")
        .limit(2)
        .take(&mut con);
    let top = Acquire::shared(&key("sem"), MINUTE)
        .token("p2")
        .limit(2)
        .take(&mut con);
    let shapes: Vec<Shape> = ["rw", "sem"]
        .iter()
        .map(|k| shape(&mut con, &key(k)))
        .collect();
    let waiter = Waiter::send(
        source,
        &[],
        Acquire::shared(&key("sem"), MINUTE)
            .token("p3")
            .limit(2)
            .block(0)
            .cmd(),
    );
    wait_until("the waiter to block", WAIT, || {
        lease_stat(source, "waiters") == 1
    });

    migrate_slot_atomically(&cluster, slot, to);

    let mut t = target.client();
    for (name, wanted) in ["rw", "sem"].iter().zip(&shapes) {
        assert_eq!(
            &shape(&mut t, &key(name)),
            wanted,
            "{name} on the destination"
        );
    }
    assert_eq!(lease_stat(target, "shared_holds"), 4);
    assert_eq!(renew(&mut t, &key("rw"), "r2", MINUTE), 1);
    assert_eq!(release(&mut t, &key("sem"), "p1"), 1);
    let next = Acquire::shared(&key("sem"), MINUTE)
        .token("p4")
        .limit(2)
        .take(&mut t);
    assert!(next > top);
    // The waiter on the source was sent on, not granted there.
    let (reply, _) = waiter.reply(WAIT, "the waiter on the source");
    let e = expect_error(&reply, "the waiter on the source");
    assert!(e.starts_with("MOVED"), "{e}");
    assert_eq!(lease_stat(source, "shared_holds"), 0);

    let replica = &cluster.nodes[cluster.replica_of(to)];
    replica.wait_for_sync(target);
    assert_eq!(digest(replica), digest(target));
}

for_each_server!(eviction_of_a_shared_key_reaches_the_replica, |flavor| {
    let (master, replica) = master_and_replica(flavor);
    let mut m = master.client();
    for (t, owner) in [("r1", "reader-1"), ("r2", "reader-2")] {
        Acquire::shared("lock:rw", 600_000)
            .token(t)
            .limit(3)
            .owner(owner)
            .take(&mut m);
    }
    let seeded = holds_still(&mut m, "lock:rw");
    // Redis 7.0 has no post-notification jobs, so no restore: the loss is replicated.
    let mode = if flavor == Flavor::Redis7 {
        "allow"
    } else {
        "restore"
    };
    for (name, value) in [
        ("maxmemory", "20mb"),
        ("maxmemory-policy", "allkeys-lru"),
        ("lease.allkeys-eviction", mode),
    ] {
        harness::calls::config_set(&mut m, name, value);
    }
    let value = vec![b'v'; 1024];
    let mut evicted = false;
    'fill: for round in 0..5 {
        for batch in 0..120 {
            let mut pipe = redis::pipe();
            for i in 0..500 {
                pipe.cmd("SET")
                    .arg(format!("cache:{round}:{batch}:{i}"))
                    .arg(&value[..])
                    .ignore();
            }
            let () = pipe.query(&mut m).unwrap_or_else(|e| panic!("fill: {e}"));
            if lease_stat(&master, "evicted") > 0 {
                evicted = true;
                break 'fill;
            }
        }
    }
    harness::calls::config_set(&mut m, "maxmemory", "0");
    assert!(evicted, "five rounds of writes never evicted lock:rw");
    replica.wait_for_sync(&master);
    let mut r = replica.client();
    if mode == "restore" {
        assert_eq!(holds_still(&mut m, "lock:rw"), seeded);
        assert_eq!(holds_still(&mut r, "lock:rw"), seeded, "on the replica");
    } else {
        assert!(!exists(&mut m, "lock:rw"));
        assert!(
            !exists(&mut r, "lock:rw"),
            "the replica kept an evicted key"
        );
    }
    assert_same(&master, &replica, &["lock:rw"], "after the eviction");
});

/// A version 2 lease-key value of holds, field by field (model/src/encoding.rs): the
/// key's fence, a free version 1 head, `EXTENDED`, mode (0 exclusive, 1 shared), limit
/// (0: none), the count, then per hold: fence, deadline, token, owner (empty: none).
fn extended_body(fence: u64, mode: u64, limit: u64, holds: &[(u64, u64, &[u8], &[u8])]) -> Body {
    let mut b = Body::new("lease-key", 2)
        .unsigned(fence)
        .unsigned(0)
        .string(b"")
        .unsigned(1)
        .unsigned(mode)
        .unsigned(limit)
        .unsigned(holds.len() as u64);
    for (f, deadline, token, owner) in holds {
        b = b
            .unsigned(*f)
            .unsigned(*deadline)
            .string(token)
            .string(owner);
    }
    b.eof()
}

for_each_server!(inconsistent_shared_payloads_are_refused, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    Acquire::shared("template", MINUTE)
        .token("t")
        .take(&mut con);
    let version = dump(&mut con, "template").version;
    let live = now_ms() + MINUTE;
    let base = lease_stat(&server, "fence_last") + 100;

    // The encoder is right: a well-formed value of two shared holds under LIMIT 2 loads.
    let good = extended_body(
        base + 2,
        1,
        2,
        &[
            (base + 1, live, b"a", b"owner-a"),
            (base + 2, live, b"b", b""),
        ],
    );
    assert_eq!(
        restore(&mut con, "good", &seal(&good.0, version)),
        Value::Okay
    );
    assert_eq!(
        holds_still(&mut con, "good"),
        [
            (base + 1, "shared".to_string(), Some("owner-a".to_string())),
            (base + 2, "shared".to_string(), None)
        ]
    );
    assert_eq!(info_of(&mut con, "good").limit, Some(2));

    let three: [(u64, u64, &[u8], &[u8]); 3] = [
        (base + 1, live, b"a", b""),
        (base + 2, live, b"b", b""),
        (base + 3, live, b"c", b""),
    ];
    let cases = [
        (
            "three shared holds under LIMIT 2",
            extended_body(base + 3, 1, 2, &three),
        ),
        (
            "an exclusive hold with a limit",
            extended_body(base + 1, 0, 3, &three[..1]),
        ),
        (
            "two holds with one fence",
            extended_body(
                base + 1,
                1,
                0,
                &[(base + 1, live, b"a", b""), (base + 1, live, b"b", b"")],
            ),
        ),
        (
            "a hold with fence 0",
            extended_body(base + 1, 1, 0, &[(0, live, b"a", b"")]),
        ),
    ];
    let mut loaded = Vec::new();
    for (what, body) in &cases {
        let reply = restore(&mut con, "victim", &seal(&body.0, version));
        match error_text(&reply) {
            Some(e) => assert!(e.contains("Bad data format"), "{what}: {e}"),
            None => {
                loaded.push(format!(
                    "{what}: loaded; LEASE.INFO {:?}; LEASE.HOLDERS {:?}",
                    call(&mut con, "LEASE.INFO", "victim"),
                    call(&mut con, "LEASE.HOLDERS", "victim")
                ));
                assert_eq!(int(call(&mut con, "DEL", "victim")), 1);
            }
        }
    }
    assert!(
        loaded.is_empty(),
        "inconsistent values were accepted:\n{}",
        loaded.join("\n")
    );
});

/// Bytes in the AOF's incremental files.
fn aof_bytes(server: &Server) -> u64 {
    let dir = server.dir.join("appendonlydir");
    let entries =
        fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".incr.aof"))
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum()
}

// As tests/pause.rs for version 1: while writes are paused nothing may reach the AOF
// or a replica (the server asserts it). A shared hold's deadline passes inside a pause:
// the hold is gone for readers at once, and dropped (and its key's waiter served) only
// once the pause ends. Sleeping is the point here: time has to pass inside the pause.
for_each_server!(
    a_shared_hold_expiring_in_a_write_pause_is_dropped_after_it,
    |flavor| {
        let master = Server::start_with(flavor, aof_options());
        let replica = Server::start(flavor);
        harness::attach(&replica, &master);
        let mut m = master.client();
        let fb = Acquire::shared("k", MINUTE).token("b").take(&mut m);
        let asked = std::time::Instant::now();
        Acquire::shared("k", 300).token("a").take(&mut m);
        Acquire::shared("k2", 300).token("a2").take(&mut m);
        let deadline = asked + Duration::from_millis(300);
        let w = harness::holds::queue(
            &master,
            &Acquire::exclusive("k2", MINUTE).token("w").block(0),
            1,
        );
        let expired = lease_stat(&master, "expired");

        let sent = std::time::Instant::now();
        assert_eq!(
            call(&mut m, "CLIENT", ("PAUSE", 1_500, "WRITE")),
            Value::Okay
        );
        let pause_ends = sent + Duration::from_millis(1_499);
        assert!(
            std::time::Instant::now() < deadline,
            "the setup outlasted the holds: too slow for this test"
        );
        let aof = aof_bytes(&master);
        let offset = harness::repl_offset(&master);
        std::thread::sleep(deadline + Duration::from_millis(300) - std::time::Instant::now());
        let listed = harness::holds::holder_fences(&mut m, "k");
        let k2 = info_of(&mut m, "k2");
        let expired_during = lease_stat(&master, "expired");
        let (aof_during, offset_during) = (aof_bytes(&master), harness::repl_offset(&master));
        w.assert_waiting("the writer on k2 during the pause");
        assert!(
            std::time::Instant::now() < pause_ends,
            "observed too late to be sure the pause was on: too slow for this test"
        );
        assert_eq!(listed, [fb], "an expired hold listed during the pause");
        assert_eq!((k2.state.as_str(), k2.holders), ("free", 0), "{k2:?}");
        assert_eq!(expired_during, expired, "dropped during the pause");
        assert_eq!(aof_during, aof, "the AOF grew during the pause");
        assert_eq!(offset_during, offset, "replicated during the pause");

        wait_until("both holds dropped after the pause", WAIT, || {
            lease_stat(&master, "expired") == expired + 2
        });
        harness::holds::granted_to(w, "w", "the writer on k2 after the pause");
        assert_same(&master, &replica, &["k", "k2"], "after the pause");
        let before = digest(&master);
        assert_eq!(call(&mut m, "DEBUG", "LOADAOF"), Value::Okay);
        assert_eq!(digest(&master), before, "DEBUG DIGEST after DEBUG LOADAOF");
        assert_eq!(harness::holds::holder_fences(&mut m, "k"), [fb]);
    }
);
