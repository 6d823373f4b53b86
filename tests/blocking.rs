//! `LEASE.ACQUIRE key ttl [TOKEN t] BLOCK timeout` on real servers: handoff on release,
//! expiry and DEL; first come, first served; timeouts, `BLOCK 0`, MULTI and scripts,
//! disconnects, `CLIENT UNBLOCK`, replication of a handoff, a contended stress run, and
//! a handoff-latency report against a polling client.
//!
//! Every blocked client has its own connection and thread; its reply, and when it
//! arrived, comes back over a channel. Tests learn that a client is blocked by polling
//! `LEASE.INFO key` `waiters`, never by sleeping.

use std::net::Shutdown;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use harness::calls::{acquire_cmd, client_id, digest, release, take};
use harness::lease::{lease_info, lease_stat, parse_info, wait_for_waiters, waiters};
use harness::reply::grant;
use harness::waiter::raw_blocked_acquire;
use harness::*;
use redis::Value;

/// How long a test waits for a reply that must come.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a test waits for the server to count a new waiter.
const WAITER_TIMEOUT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------
// Replies and commands

#[derive(Clone, Debug, PartialEq, Eq)]
enum Reply {
    Granted { token: String, fence: u64 },
    Nil,
}

impl Reply {
    fn fence(&self) -> u64 {
        match self {
            Reply::Granted { fence, .. } => *fence,
            Reply::Nil => panic!("expected a grant, got nil"),
        }
    }

    fn token(&self) -> &str {
        match self {
            Reply::Granted { token, .. } => token,
            Reply::Nil => panic!("expected a grant, got nil"),
        }
    }

    fn is_granted(&self) -> bool {
        matches!(self, Reply::Granted { .. })
    }
}

fn to_reply(value: Value) -> Reply {
    match grant(value, "LEASE.ACQUIRE") {
        None => Reply::Nil,
        Some((token, fence)) => Reply::Granted {
            token: String::from_utf8(token).unwrap_or_else(|e| panic!("token is not UTF-8: {e}")),
            fence,
        },
    }
}

fn acquire(con: &mut redis::Connection, key: &str, ttl: u64, token: Option<&str>) -> Reply {
    let value: Value = acquire_cmd(key, ttl, token, None)
        .query(con)
        .unwrap_or_else(|e| panic!("LEASE.ACQUIRE {key} {ttl} failed: {e}"));
    to_reply(value)
}

/// Takes a free lease; panics unless it is granted to `token`.
fn hold(con: &mut redis::Connection, key: &str, ttl: u64, token: &str) -> Reply {
    Reply::Granted {
        token: token.to_string(),
        fence: take(con, key, ttl, token),
    }
}

/// The server is alive and its log shows no module panic or internal error.
fn assert_server_healthy(server: &Server) {
    let mut con = server.client();
    let pong: String = redis::cmd("PING")
        .query(&mut con)
        .unwrap_or_else(|e| panic!("PING failed after the test: {e}"));
    assert_eq!(pong, "PONG");
    let log = server.log().to_lowercase();
    assert!(
        !log.contains("panic") && !log.contains("internal error"),
        "the server log reports a panic or an internal error:\n{}",
        server.log()
    );
}

// ---------------------------------------------------------------------------------
// Blocked clients on their own threads

/// What a waiter thread saw.
#[derive(Debug)]
struct Outcome {
    tag: usize,
    reply: Reply,
    sent: Instant,
    received: Instant,
    /// The reply of the waiter's own LEASE.RELEASE, when it was told to release.
    released: Option<i64>,
}

struct Waiter {
    tag: usize,
    client_id: i64,
    handle: JoinHandle<()>,
}

/// Starts a thread that sends `cmd` on its own connection and reports the reply on
/// `tx`. With `release_key`, a granted waiter releases the lease from its connection
/// after noting when the reply came, and before reporting.
fn spawn_waiter(
    server: &Server,
    tag: usize,
    cmd: redis::Cmd,
    release_key: Option<&str>,
    tx: &Sender<Outcome>,
) -> Waiter {
    let mut con = server.client();
    con.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap_or_else(|e| panic!("cannot set a read timeout: {e}"));
    let client_id = client_id(&mut con);
    let tx = tx.clone();
    let release_key = release_key.map(str::to_string);
    let handle = thread::Builder::new()
        .name(format!("waiter-{tag}"))
        .spawn(move || {
            let sent = Instant::now();
            let value: Value = cmd
                .query(&mut con)
                .unwrap_or_else(|e| panic!("waiter {tag}: blocking LEASE.ACQUIRE failed: {e}"));
            let received = Instant::now();
            let reply = to_reply(value);
            let released = match (&release_key, &reply) {
                (Some(key), Reply::Granted { token, .. }) => Some(release(&mut con, key, token)),
                _ => None,
            };
            let _ = tx.send(Outcome {
                tag,
                reply,
                sent,
                received,
                released,
            });
        })
        .unwrap_or_else(|e| panic!("cannot spawn a waiter thread: {e}"));
    Waiter {
        tag,
        client_id,
        handle,
    }
}

/// Starts waiter `tag` (token `w<tag>`) and returns once the server counts it as the
/// `position`th waiter of `key`, so waiters started one after another are queued in
/// that order.
fn block_waiter(
    server: &Server,
    con: &mut redis::Connection,
    key: &str,
    tag: usize,
    block: u64,
    position: i64,
    tx: &Sender<Outcome>,
) -> Waiter {
    let cmd = acquire_cmd(key, 10_000, Some(&format!("w{tag}")), Some(block));
    let waiter = spawn_waiter(server, tag, cmd, None, tx);
    wait_for_waiters(con, key, position);
    waiter
}

fn recv(rx: &Receiver<Outcome>, what: &str) -> Outcome {
    rx.recv_timeout(REPLY_TIMEOUT)
        .unwrap_or_else(|e| panic!("no reply from {what} within {REPLY_TIMEOUT:?}: {e}"))
}

fn assert_no_reply(rx: &Receiver<Outcome>, what: &str) {
    match rx.try_recv() {
        Err(TryRecvError::Empty) => {}
        Ok(outcome) => panic!("{what}: a waiter replied too early: {outcome:?}"),
        Err(TryRecvError::Disconnected) => panic!("{what}: every waiter thread is gone"),
    }
}

fn join_waiters(waiters: Vec<Waiter>) {
    for w in waiters {
        join(w.handle);
    }
}

// ---------------------------------------------------------------------------------
// 1. Handoff on release

for_each_server!(release_hands_the_lease_to_the_waiter, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let (tx, rx) = mpsc::channel();

    let held = hold(&mut con, "k", 10_000, "a");
    let before = lease_stat(&server, "grants_to_waiters");
    // No TOKEN: the waiter gets a generated one with its grant.
    let w = spawn_waiter(
        &server,
        0,
        acquire_cmd("k", 10_000, None, Some(5_000)),
        None,
        &tx,
    );
    wait_for_waiters(&mut con, "k", 1);
    assert_no_reply(&rx, "while A holds the lease");

    assert_eq!(release(&mut con, "k", "a"), 1);
    let got = recv(&rx, "the waiter after A's release");
    let token = got.reply.token().to_string();
    assert_eq!(token.len(), 32, "generated token {token:?}");
    assert!(
        token
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "generated token {token:?} is not lowercase hex"
    );
    assert!(
        got.reply.fence() > held.fence(),
        "waiter fence {} is not above A's {}",
        got.reply.fence(),
        held.fence()
    );

    // W holds it now: a later non-blocking acquire by C gets nil.
    let mut c = server.client();
    assert_eq!(acquire(&mut c, "k", 10_000, Some("c")), Reply::Nil);
    let info = lease_info(&mut con, "k").expect("the lease key exists");
    assert_eq!(info.state, "held");
    assert_eq!(info.fence, got.reply.fence());
    assert_eq!(info.waiters, 0);
    assert!(info.ttl > 0 && info.ttl <= 10_000, "ttl {}", info.ttl);
    assert_eq!(lease_stat(&server, "grants_to_waiters"), before + 1);
    // The waiter's token is the capability to release.
    assert_eq!(release(&mut c, "k", &token), 1);
    join_waiters(vec![w]);
});

// 2. First come, first served

for_each_server!(waiters_are_served_in_arrival_order, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let (tx, rx) = mpsc::channel();
    const N: usize = 5;

    let held = hold(&mut con, "k", 10_000, "a");
    let waiters_list: Vec<Waiter> = (0..N)
        .map(|i| block_waiter(&server, &mut con, "k", i, 0, i as i64 + 1, &tx))
        .collect();
    assert_eq!(lease_stat(&server, "waiters"), N as u64);

    let mut holder = "a".to_string();
    let mut last_fence = held.fence();
    for i in 0..N {
        assert_eq!(release(&mut con, "k", &holder), 1, "release by {holder}");
        let got = recv(&rx, &format!("waiter {i}"));
        assert_eq!(
            got.tag, i,
            "waiter {} was served before waiter {i}: not first come, first served",
            got.tag
        );
        assert_eq!(got.reply.token(), format!("w{i}"));
        assert!(got.reply.fence() > last_fence);
        last_fence = got.reply.fence();
        let info = lease_info(&mut con, "k").expect("lease key");
        assert_eq!(info.state, "held");
        assert_eq!(info.fence, last_fence);
        assert_eq!(info.waiters, (N - i - 1) as i64);
        assert_no_reply(&rx, "after one handoff");
        holder = format!("w{i}");
    }
    assert_eq!(release(&mut con, "k", &holder), 1);
    // The last release had no waiter: the key is gone.
    assert!(lease_info(&mut con, "k").is_none());
    assert_eq!(lease_stat(&server, "waiters"), 0);
    join_waiters(waiters_list);
});

// 3. Fifty waiters, each served once, in order

for_each_server!(fifty_waiters_each_served_once_in_order, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let (tx, rx) = mpsc::channel();
    const N: usize = 50;

    let held = hold(&mut con, "k", 10_000, "a");
    let all: Vec<Waiter> = (0..N)
        .map(|i| {
            // Each waiter releases the lease from its own connection once granted.
            let cmd = acquire_cmd("k", 10_000, Some(&format!("w{i}")), Some(0));
            let waiter = spawn_waiter(&server, i, cmd, Some("k"), &tx);
            wait_for_waiters(&mut con, "k", i as i64 + 1);
            waiter
        })
        .collect();
    assert_eq!(waiters(&mut con, "k"), N as i64);

    // One release starts the chain: each waiter releases once it has its reply.
    assert_eq!(release(&mut con, "k", "a"), 1);
    let mut outcomes: Vec<Outcome> = (0..N).map(|i| recv(&rx, &format!("grant #{i}"))).collect();
    outcomes.sort_by_key(|o| o.received);

    let mut tags: Vec<usize> = outcomes.iter().map(|o| o.tag).collect();
    assert_eq!(
        tags,
        (0..N).collect::<Vec<_>>(),
        "grant order differs from arrival order"
    );
    let mut last_fence = held.fence();
    for o in &outcomes {
        assert_eq!(o.reply.token(), format!("w{}", o.tag));
        assert!(
            o.reply.fence() > last_fence,
            "waiter {} got fence {} after fence {last_fence}",
            o.tag,
            o.reply.fence()
        );
        last_fence = o.reply.fence();
        assert_eq!(o.released, Some(1), "waiter {} could not release", o.tag);
    }
    tags.dedup();
    assert_eq!(tags.len(), N, "a waiter was served twice");
    assert_no_reply(&rx, "after all 50 grants");
    assert_eq!(waiters(&mut con, "k"), 0);
    assert_eq!(lease_stat(&server, "waiters"), 0);
    // The last waiter released with nobody waiting: the key is gone.
    assert!(lease_info(&mut con, "k").is_none());
    join_waiters(all);
});

// 4. Expiry wakes the first waiter

for_each_server!(expiry_wakes_the_first_waiter_promptly, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let (tx, rx) = mpsc::channel();

    // A takes a 200 ms lease and never releases it.
    let a_sent = Instant::now();
    let held = hold(&mut con, "k", 200, "a");
    let w = block_waiter(&server, &mut con, "k", 0, 5_000, 1, &tx);

    let got = recv(&rx, "the waiter after A's lease expired");
    // On the server's clock, read from the fences: A's deadline is exactly its grant
    // time + 200 ms, and the waiter's grant must come after it, and soon.
    let deadline_ms = fence_ms(held.fence()) + 200;
    let granted_ms = fence_ms(got.reply.fence());
    assert!(
        granted_ms >= deadline_ms,
        "the waiter was granted at {granted_ms} ms, before A's deadline {deadline_ms} ms"
    );
    let server_late = granted_ms - deadline_ms;
    // On the client's clock: A's deadline is at least 200 ms after A's request was
    // sent, so this adds the round trips and any scheduling stall of the client.
    let deadline = a_sent + Duration::from_millis(200);
    let client_late = got.received.saturating_duration_since(deadline);
    eprintln!(
        "{flavor}: expiry wake-up: waiter granted {server_late} ms after the lease deadline \
         (server clock); reply read {:.1} ms after it (client clock, from A's request + 200 ms)",
        client_late.as_secs_f64() * 1e3
    );
    assert!(
        server_late <= 150,
        "the waiter was granted {server_late} ms after the deadline"
    );
    assert!(
        client_late <= Duration::from_secs(1),
        "the waiter read its grant {client_late:?} after the deadline"
    );
    assert_eq!(got.reply.token(), "w0");
    assert!(got.reply.fence() > held.fence());
    let info = lease_info(&mut con, "k").expect("lease key");
    assert_eq!(info.state, "held");
    assert_eq!(info.fence, got.reply.fence());
    assert_eq!(info.waiters, 0);
    join_waiters(vec![w]);
});

for_each_server!(
    a_lease_handed_over_on_release_still_expires_to_the_next_waiter,
    |flavor| {
        // A release hands the key to the first waiter; that waiter's lease must expire
        // to the second on time, though the key was never deleted in between.
        let server = Server::start(flavor);
        let mut con = server.client();
        let (tx, rx) = mpsc::channel();
        hold(&mut con, "k", 60_000, "a");
        let first = spawn_waiter(
            &server,
            0,
            acquire_cmd("k", 200, Some("w0"), Some(5_000)),
            None,
            &tx,
        );
        wait_for_waiters(&mut con, "k", 1);
        let second = block_waiter(&server, &mut con, "k", 1, 5_000, 2, &tx);
        assert_eq!(release(&mut con, "k", "a"), 1);

        let got0 = recv(&rx, "the first waiter after A's release");
        assert_eq!(got0.reply.token(), "w0");
        let got1 = recv(&rx, "the second waiter after the first one's lease expired");
        assert_eq!(got1.reply.token(), "w1");
        let deadline_ms = fence_ms(got0.reply.fence()) + 200;
        let granted_ms = fence_ms(got1.reply.fence());
        assert!(
            granted_ms >= deadline_ms,
            "w1 was granted at {granted_ms} ms, before w0's deadline {deadline_ms} ms"
        );
        assert!(
            granted_ms - deadline_ms <= 150,
            "w1 was granted {} ms after w0's deadline",
            granted_ms - deadline_ms
        );
        assert_eq!(release(&mut con, "k", "w1"), 1);
        assert!(
            lease_info(&mut con, "k").is_none(),
            "released with no waiter: deleted"
        );
        // The reaper's own re-check entry for the handoff goes at its next tick.
        let give_up = Instant::now() + Duration::from_secs(5);
        while lease_stat(&server, "indexed_deadlines") != 0 {
            assert!(Instant::now() < give_up, "index entries left behind");
            thread::sleep(Duration::from_millis(20));
        }
        join_waiters(vec![first, second]);
    }
);

for_each_server!(newcomer_does_not_jump_the_queue, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let mut c = server.client();
    let (tx, rx) = mpsc::channel();

    // Released with a waiter: C's acquire, pipelined right behind the release, finds
    // the lease already handed to the waiter.
    hold(&mut con, "rel", 10_000, "a");
    let w1 = block_waiter(&server, &mut con, "rel", 0, 5_000, 1, &tx);
    let replies: Vec<Value> = redis::pipe()
        .cmd("LEASE.RELEASE")
        .arg("rel")
        .arg("a")
        .add_command(acquire_cmd("rel", 10_000, Some("c"), None))
        .query(&mut c)
        .unwrap_or_else(|e| panic!("RELEASE + ACQUIRE pipeline failed: {e}"));
    assert_eq!(replies[0], Value::Int(1));
    assert_eq!(
        to_reply(replies[1].clone()),
        Reply::Nil,
        "a non-blocking acquire took a released lease ahead of its waiter"
    );
    let got = recv(&rx, "the waiter of the released lease");
    assert_eq!(got.reply.token(), "w0");

    // Expired with a waiter: DEBUG SLEEP holds the event loop past the deadline, so
    // the acquires pipelined behind it run after the expiry and before any timer could
    // serve the waiter. They must still find the lease reserved for the queue: the
    // non-blocking one gets nil at once, the blocking one queues behind the waiter and
    // times out. The LEASE.INFO in front proves the lease was still held when the sleep
    // began; on a machine so slow that it was not, the scenario is set up again.
    let mut attempt = 0;
    let (held, replies, w2, got) = loop {
        attempt += 1;
        let key = format!("exp{attempt}");
        let held = hold(&mut con, &key, 300, "a");
        let w2 = block_waiter(&server, &mut con, &key, attempt, 5_000, 1, &tx);
        let replies: Vec<Value> = redis::pipe()
            .cmd("LEASE.INFO")
            .arg(&key)
            .cmd("DEBUG")
            .arg("SLEEP")
            .arg("0.4")
            .add_command(acquire_cmd(&key, 10_000, Some("c"), None))
            .add_command(acquire_cmd(&key, 10_000, Some("c2"), Some(50)))
            .cmd("LEASE.INFO")
            .arg(&key)
            .query(&mut c)
            .unwrap_or_else(|e| panic!("DEBUG SLEEP + ACQUIRE pipeline failed: {e}"));
        let got = recv(&rx, "the waiter of the expired lease");
        assert_eq!(got.tag, attempt);
        let before = parse_info(replies[0].clone(), &key).expect("lease key");
        if before.state == "held" && before.waiters == 1 {
            break (held, replies, w2, got);
        }
        join(w2.handle);
        assert!(
            attempt < 5,
            "the 300 ms lease expired before the pipeline ran, {attempt} times"
        );
    };
    let jumped = to_reply(replies[2].clone());
    assert_eq!(
        jumped,
        Reply::Nil,
        "after expiry, a non-blocking acquire took the lease while a client waited \
         (LEASE.INFO then: {:?}; the waiter then got {:?})",
        replies[4],
        got.reply
    );
    assert_eq!(
        to_reply(replies[3].clone()),
        Reply::Nil,
        "after expiry, a blocking acquire took the lease ahead of the waiter"
    );
    assert_eq!(got.reply.token(), format!("w{attempt}"));
    assert!(got.reply.fence() > held.fence());
    let info = lease_info(&mut con, &format!("exp{attempt}")).expect("lease key");
    assert_eq!(info.fence, got.reply.fence());
    assert_eq!(info.waiters, 0);
    join_waiters(vec![w1, w2]);
});

// 5. Timeout

for_each_server!(block_timeout_replies_nil, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let (tx, rx) = mpsc::channel();

    hold(&mut con, "k", 10_000, "a");
    let timeouts = lease_stat(&server, "block_timeouts");
    let w = spawn_waiter(
        &server,
        0,
        acquire_cmd("k", 1_000, Some("w"), Some(100)),
        None,
        &tx,
    );
    let got = recv(&rx, "the timed-out waiter");
    assert_eq!(got.reply, Reply::Nil);
    let waited = got.received - got.sent;
    assert!(
        waited >= Duration::from_millis(100),
        "BLOCK 100 replied after {waited:?}"
    );
    assert!(waited < Duration::from_secs(2), "BLOCK 100 took {waited:?}");
    assert_eq!(lease_stat(&server, "block_timeouts"), timeouts + 1);
    let info = lease_info(&mut con, "k").expect("lease key");
    assert_eq!(info.waiters, 0);
    assert_eq!(info.state, "held");
    assert_eq!(lease_stat(&server, "waiters"), 0);
    // The holder is untouched and its release deletes the key (no one waits).
    assert_eq!(release(&mut con, "k", "a"), 1);
    assert!(lease_info(&mut con, "k").is_none());
    join_waiters(vec![w]);
});

// 6. BLOCK 0

for_each_server!(block_zero_waits_until_release, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let (tx, rx) = mpsc::channel();

    let held = hold(&mut con, "k", 60_000, "a");
    let w = block_waiter(&server, &mut con, "k", 0, 0, 1, &tx);
    // Time has to pass here: the point is that nothing happens for a while.
    thread::sleep(Duration::from_millis(300));
    assert_no_reply(&rx, "BLOCK 0 after 300 ms");
    assert_eq!(waiters(&mut con, "k"), 1);

    assert_eq!(release(&mut con, "k", "a"), 1);
    let got = recv(&rx, "the BLOCK 0 waiter");
    assert_eq!(got.reply.token(), "w0");
    assert!(got.reply.fence() > held.fence());
    assert!(got.received - got.sent >= Duration::from_millis(300));
    join_waiters(vec![w]);
});

// 7. No blocking inside MULTI or a script

for_each_server!(block_does_not_block_in_multi_or_scripts, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let mut c = server.client();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    hold(&mut con, "k", 60_000, "a");
    let timeouts = lease_stat(&server, "block_timeouts");

    let start = Instant::now();
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .add_command(acquire_cmd("k", 1_000, Some("m"), Some(0)))
        .add_command(acquire_cmd("free", 1_000, Some("m"), Some(0)))
        .query(&mut c)
        .unwrap_or_else(|e| panic!("MULTI/EXEC failed: {e}"));
    assert_eq!(replies.len(), 2, "EXEC replied {replies:?}");
    assert_eq!(to_reply(replies[0].clone()), Reply::Nil);
    assert_eq!(to_reply(replies[1].clone()).token(), "m");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "MULTI/EXEC took {:?}",
        start.elapsed()
    );

    let start = Instant::now();
    let script = "return redis.call('LEASE.ACQUIRE', KEYS[1], '1000', 'TOKEN', 'e', 'BLOCK', '0')";
    let value: Value = redis::cmd("EVAL")
        .arg(script)
        .arg(1)
        .arg("k")
        .query(&mut c)
        .unwrap_or_else(|e| panic!("EVAL failed: {e}"));
    assert_eq!(to_reply(value), Reply::Nil);
    let value: Value = redis::cmd("EVAL")
        .arg(script)
        .arg(1)
        .arg("free2")
        .query(&mut c)
        .unwrap_or_else(|e| panic!("EVAL failed: {e}"));
    assert_eq!(to_reply(value).token(), "e");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "EVAL took {:?}",
        start.elapsed()
    );

    assert_eq!(waiters(&mut con, "k"), 0);
    assert_eq!(lease_stat(&server, "waiters"), 0);
    // Not blocked, so never timed out either.
    assert_eq!(lease_stat(&server, "block_timeouts"), timeouts);
    // The holder is untouched.
    assert_eq!(release(&mut con, "k", "a"), 1);
});

// 8. A waiter that disconnects leaves the queue

for_each_server!(disconnected_waiter_leaves_the_queue, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let (tx, rx) = mpsc::channel();

    let held = hold(&mut con, "k", 60_000, "a");
    // The head of the queue is a bare socket that goes away.
    let gone = raw_blocked_acquire(&server, "k", "gone", 1);
    let w1 = block_waiter(&server, &mut con, "k", 1, 0, 2, &tx);
    let w2 = block_waiter(&server, &mut con, "k", 2, 0, 3, &tx);

    gone.shutdown(Shutdown::Both)
        .unwrap_or_else(|e| panic!("cannot shut down the socket: {e}"));
    drop(gone);
    wait_for_waiters(&mut con, "k", 2);
    assert_eq!(lease_stat(&server, "waiters"), 2);
    assert_no_reply(&rx, "after the disconnect");

    assert_eq!(release(&mut con, "k", "a"), 1);
    let got = recv(&rx, "the next waiter");
    assert_eq!(got.tag, 1, "the lease went to waiter {}", got.tag);
    assert_eq!(got.reply.token(), "w1");
    assert!(got.reply.fence() > held.fence());
    assert_eq!(waiters(&mut con, "k"), 1);
    assert_eq!(release(&mut con, "k", "w1"), 1);
    let got = recv(&rx, "the last waiter");
    assert_eq!(got.tag, 2);
    assert_eq!(release(&mut con, "k", "w2"), 1);
    assert!(lease_info(&mut con, "k").is_none());
    join_waiters(vec![w1, w2]);
    assert_server_healthy(&server);
});

// 9. CLIENT UNBLOCK

for_each_server!(client_unblock_replies_nil_and_keeps_the_order, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let (tx, rx) = mpsc::channel();

    hold(&mut con, "k", 60_000, "a");
    let ws: Vec<Waiter> = (0..4)
        .map(|i| block_waiter(&server, &mut con, "k", i, 0, i as i64 + 1, &tx))
        .collect();

    // Unblock one in the middle, then the head.
    for (victim, left) in [(1usize, 3i64), (0, 2)] {
        let n: i64 = redis::cmd("CLIENT")
            .arg("UNBLOCK")
            .arg(ws[victim].client_id)
            .query(&mut con)
            .unwrap_or_else(|e| panic!("CLIENT UNBLOCK failed: {e}"));
        assert_eq!(n, 1, "CLIENT UNBLOCK of waiter {victim}");
        let got = recv(&rx, &format!("unblocked waiter {victim}"));
        assert_eq!(got.tag, victim);
        assert_eq!(got.reply, Reply::Nil);
        assert_eq!(waiters(&mut con, "k"), left);
    }
    assert_no_reply(&rx, "after CLIENT UNBLOCK");

    let mut holder = "a".to_string();
    for expected in [2usize, 3] {
        assert_eq!(release(&mut con, "k", &holder), 1);
        let got = recv(&rx, &format!("waiter {expected}"));
        assert_eq!(got.tag, expected, "queue order broken after CLIENT UNBLOCK");
        assert_eq!(got.reply.token(), format!("w{expected}"));
        holder = format!("w{expected}");
    }
    assert_eq!(release(&mut con, "k", &holder), 1);
    assert_eq!(lease_stat(&server, "waiters"), 0);
    let tags: Vec<usize> = ws.iter().map(|w| w.tag).collect();
    assert_eq!(tags, vec![0, 1, 2, 3]);
    join_waiters(ws);
});

// 10. DEL of a held lease key

for_each_server!(del_of_a_held_key_serves_the_first_waiter, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let (tx, rx) = mpsc::channel();

    let held = hold(&mut con, "k", 60_000, "a");
    let w0 = block_waiter(&server, &mut con, "k", 0, 0, 1, &tx);
    let w1 = block_waiter(&server, &mut con, "k", 1, 0, 2, &tx);

    let deleted: i64 = redis::cmd("DEL").arg("k").query(&mut con).unwrap();
    assert_eq!(deleted, 1);
    let got = recv(&rx, "the first waiter after DEL");
    assert_eq!(got.tag, 0);
    assert_eq!(got.reply.token(), "w0");
    assert!(
        got.reply.fence() > held.fence(),
        "fence {} after DEL is not above {}",
        got.reply.fence(),
        held.fence()
    );
    let info = lease_info(&mut con, "k").expect("the waiter's lease key");
    assert_eq!(info.state, "held");
    assert_eq!(info.waiters, 1);
    assert_no_reply(&rx, "the second waiter after DEL");
    // A's token no longer holds anything.
    assert_eq!(release(&mut con, "k", "a"), 0);

    assert_eq!(release(&mut con, "k", "w0"), 1);
    let got = recv(&rx, "the second waiter");
    assert_eq!(got.tag, 1);
    join_waiters(vec![w0, w1]);
});

// 11. A handoff is replicated

for_each_server!(handoff_is_replicated, |flavor| {
    let master = Server::start(flavor);
    let replica = Server::start(flavor);
    replica.replicaof(&master);
    let mut con = master.client();
    let mut rcon = replica.client();
    let (tx, rx) = mpsc::channel();

    let held = hold(&mut con, "k", 60_000, "a");
    let w = block_waiter(&master, &mut con, "k", 0, 0, 1, &tx);
    assert_eq!(release(&mut con, "k", "a"), 1);
    let got = recv(&rx, "the waiter");
    assert!(got.reply.fence() > held.fence());

    replica.wait_for_sync(&master);
    let on_master = lease_info(&mut con, "k").expect("lease on the master");
    let on_replica = lease_info(&mut rcon, "k").expect("lease on the replica");
    assert_eq!(on_replica.fence, got.reply.fence());
    assert_eq!(on_replica.fence, on_master.fence);
    assert_eq!(on_replica.state, "held");
    assert!(on_replica.ttl > 0, "replica ttl {}", on_replica.ttl);
    assert_eq!(on_replica.waiters, 0);
    let d = digest(&master);
    assert_ne!(d, "0".repeat(40), "empty digest");
    assert_eq!(d, digest(&replica), "DEBUG DIGEST differs after a handoff");

    // And the replica knows it is the waiter's lease: its release replicates too.
    assert_eq!(release(&mut con, "k", "w0"), 1);
    replica.wait_for_sync(&master);
    assert!(lease_info(&mut rcon, "k").is_none());
    assert_eq!(digest(&master), digest(&replica));
    join_waiters(vec![w]);
});

// ---------------------------------------------------------------------------------
// 12. Contended stress

/// A small deterministic generator (xorshift64*), enough to vary the workload.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

#[derive(Clone, Debug)]
struct Grant {
    key: usize,
    fence: u64,
    sent: Instant,
    received: Instant,
    client: usize,
    blocking: bool,
    ttl: u64,
    /// When (unix ms) the holder sent a LEASE.RELEASE that replied 1.
    released_at_ms: Option<u64>,
}

#[derive(Default)]
struct StressCounts {
    attempts: u64,
    nil: u64,
    released: u64,
    released_late: u64,
    expired: u64,
}

const STRESS_KEYS: usize = 3;
const STRESS_CLIENTS: usize = 16;
const STRESS_RUN: Duration = Duration::from_secs(3);

/// The server's clock when it issued `fence`: fences are `max(last + 1, unix_ms *
/// 1024)`, and far fewer than 1024 are issued per millisecond here.
fn fence_ms(fence: u64) -> u64 {
    fence >> 10
}

fn stress_client(
    mut con: redis::Connection,
    client: usize,
    until: Instant,
) -> (Vec<Grant>, StressCounts) {
    let mut rng = Rng::new(client as u64 + 1);
    let mut grants = Vec::new();
    let mut counts = StressCounts::default();
    let mut n = 0u64;
    while Instant::now() < until {
        n += 1;
        let key = rng.range(0, STRESS_KEYS as u64 - 1) as usize;
        let key_name = format!("s{key}");
        let ttl = rng.range(20, 100);
        let blocking = rng.chance(50);
        let block = blocking.then(|| rng.range(100, 500));
        // A fresh token each time: a retry by a holder would repeat its fence.
        let token = format!("c{client}-{n}");
        let cmd = acquire_cmd(&key_name, ttl, Some(&token), block);
        counts.attempts += 1;
        let sent = Instant::now();
        let value: Value = cmd
            .query(&mut con)
            .unwrap_or_else(|e| panic!("stress client {client}: LEASE.ACQUIRE failed: {e}"));
        let received = Instant::now();
        match to_reply(value) {
            Reply::Nil => {
                counts.nil += 1;
                if !blocking {
                    // Busy: back off a little before trying again.
                    thread::sleep(Duration::from_millis(rng.range(0, 5)));
                }
            }
            Reply::Granted { token: got, fence } => {
                assert_eq!(
                    got, token,
                    "stress client {client} got someone else's token"
                );
                grants.push(Grant {
                    key,
                    fence,
                    sent,
                    received,
                    client,
                    blocking,
                    ttl,
                    released_at_ms: None,
                });
                // Work while holding the lease, then release it or let it expire.
                thread::sleep(Duration::from_millis(rng.range(0, 10)));
                if rng.chance(60) {
                    let release_sent = now_ms();
                    match release(&mut con, &key_name, &token) {
                        1 => {
                            counts.released += 1;
                            if let Some(g) = grants.last_mut() {
                                g.released_at_ms = Some(release_sent);
                            }
                        }
                        _ => counts.released_late += 1,
                    }
                } else {
                    counts.expired += 1;
                }
            }
        }
    }
    (grants, counts)
}

for_each_server!(contended_stress_keeps_fences_ordered, |flavor| {
    let server = Server::start(flavor);
    let grants_before = lease_stat(&server, "grants");
    let until = Instant::now() + STRESS_RUN;
    let handles: Vec<_> = (0..STRESS_CLIENTS)
        .map(|client| {
            let con = server.client();
            con.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            thread::Builder::new()
                .name(format!("stress-{client}"))
                .spawn(move || stress_client(con, client, until))
                .unwrap()
        })
        .collect();
    let mut grants = Vec::new();
    let mut totals = StressCounts::default();
    for h in handles {
        let (g, c) = join(h);
        grants.extend(g);
        totals.attempts += c.attempts;
        totals.nil += c.nil;
        totals.released += c.released;
        totals.released_late += c.released_late;
        totals.expired += c.expired;
    }
    let to_waiters = grants.iter().filter(|g| g.blocking).count();
    let handoffs = lease_stat(&server, "grants_to_waiters");
    eprintln!(
        "{flavor}: stress: {} attempts, {} grants ({to_waiters} to BLOCK acquires, \
         {handoffs} of them to queued waiters), {} nil, {} released, {} released too late, \
         {} left to expire",
        totals.attempts,
        grants.len(),
        totals.nil,
        totals.released,
        totals.released_late,
        totals.expired
    );
    assert!(
        grants.len() > 50,
        "only {} grants in the stress run",
        grants.len()
    );
    assert!(
        handoffs > 0 && handoffs as usize <= to_waiters,
        "{handoffs} grants to queued waiters, {to_waiters} grants to BLOCK acquires"
    );
    assert!(
        totals.released > 0,
        "no holder could release its lease ({} releases replied 0)",
        totals.released_late
    );
    assert_eq!(
        lease_stat(&server, "grants") - grants_before,
        grants.len() as u64,
        "INFO lease_grants disagrees with the grants the clients saw"
    );

    // Fences are unique.
    let mut fences: Vec<u64> = grants.iter().map(|g| g.fence).collect();
    fences.sort_unstable();
    for pair in fences.windows(2) {
        assert!(pair[0] < pair[1], "fence {} was issued twice", pair[0]);
    }

    // Per key, in fence order (the order the server granted them), each lease ended
    // before the next began: the next grant came no earlier than the holder's
    // successful release was sent, or else than the holder's deadline. Server and
    // clients read the same clock. Where the holder released, its reply also came
    // before the next holder's. (Sorting all grants by reply time is not a sound
    // check: a holder that lets its lease expire may read its reply after the next
    // holder reads theirs when a loaded machine stalls it for longer than the ttl.)
    for key in 0..STRESS_KEYS {
        let mut on_key: Vec<&Grant> = grants.iter().filter(|g| g.key == key).collect();
        on_key.sort_by_key(|g| g.fence);
        for pair in on_key.windows(2) {
            let (x, y) = (pair[0], pair[1]);
            let granted = fence_ms(y.fence);
            match x.released_at_ms {
                Some(released) => {
                    assert!(
                        x.received < y.received,
                        "key s{key}: {x:?} released its lease, yet the next grant {y:?} \
                         got its reply first"
                    );
                    assert!(
                        granted + 1 >= released,
                        "key s{key}: {y:?} was granted at {granted} ms, before {x:?} \
                         released its lease at {released} ms"
                    );
                }
                None => {
                    let deadline = fence_ms(x.fence) + x.ttl;
                    assert!(
                        granted + 1 >= deadline,
                        "key s{key}: {y:?} was granted at {granted} ms, before the \
                         deadline {deadline} ms of {x:?}"
                    );
                }
            }
        }
    }

    // One client's grants came one after another, so their fences rise.
    for client in 0..STRESS_CLIENTS {
        let mine: Vec<u64> = grants
            .iter()
            .filter(|g| g.client == client)
            .map(|g| g.fence)
            .collect();
        assert!(
            mine.windows(2).all(|p| p[0] < p[1]),
            "client {client}'s fences are not increasing: {mine:?}"
        );
    }

    // Real-time order across all keys: a grant whose reply came before another's
    // request was sent has the lower fence. Walking from the highest fence down, keep
    // the earliest reply among higher fences; it must not precede this one's request.
    let mut by_fence: Vec<&Grant> = grants.iter().collect();
    by_fence.sort_by_key(|g| std::cmp::Reverse(g.fence));
    let mut earliest_higher: Option<&Grant> = None;
    for g in by_fence {
        if let Some(x) = earliest_higher {
            assert!(
                x.received >= g.sent,
                "grant {x:?} was received before grant {g:?} was sent, yet has the higher fence"
            );
        }
        match earliest_higher {
            Some(x) if x.received <= g.received => {}
            _ => earliest_higher = Some(g),
        }
    }

    assert_eq!(lease_stat(&server, "waiters"), 0);
    assert_server_healthy(&server);
});

// ---------------------------------------------------------------------------------
// Handoff latency: BLOCK versus a client polling every 50 ms

#[derive(Clone, Copy, Debug, PartialEq)]
enum Contender {
    Blocking,
    Polling,
}

const POLL_INTERVAL_MS: u64 = 50;

enum ContenderMsg {
    /// A polling contender's first attempt found the lease held.
    Tried,
    Got {
        received: Instant,
        fence: u64,
        released: i64,
    },
}

/// One holder and one contender on `key` for `rounds` handoffs: the holder takes the
/// lease, the contender starts wanting it, the holder releases (noting when), and the
/// contender notes when its grant arrived and gives the lease back. Returns the
/// release-to-grant latencies.
fn handoff_pair(
    server: &Server,
    key: String,
    mode: Contender,
    rounds: usize,
    seed: u64,
) -> JoinHandle<Vec<Duration>> {
    let mut holder = server.client();
    let mut contender = server.client();
    for con in [&holder, &contender] {
        con.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    }
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (msg_tx, msg_rx) = mpsc::channel::<ContenderMsg>();

    let contender_key = key.clone();
    let contender_thread = thread::spawn(move || {
        let key = contender_key;
        while go_rx.recv().is_ok() {
            let (reply, received) = match mode {
                Contender::Blocking => {
                    let value: Value = acquire_cmd(&key, 60_000, Some("c"), Some(10_000))
                        .query(&mut contender)
                        .unwrap_or_else(|e| panic!("blocking contender: {e}"));
                    (to_reply(value), Instant::now())
                }
                Contender::Polling => {
                    let mut first = true;
                    loop {
                        let reply = acquire(&mut contender, &key, 60_000, Some("c"));
                        let received = Instant::now();
                        if reply.is_granted() {
                            break (reply, received);
                        }
                        if first {
                            first = false;
                            let _ = msg_tx.send(ContenderMsg::Tried);
                        }
                        thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
                    }
                }
            };
            let released = release(&mut contender, &key, "c");
            let _ = msg_tx.send(ContenderMsg::Got {
                received,
                fence: reply.fence(),
                released,
            });
        }
    });

    thread::spawn(move || {
        let mut rng = Rng::new(seed);
        let mut latencies = Vec::with_capacity(rounds);
        let mut last_fence = 0;
        for round in 0..rounds {
            let held = acquire(&mut holder, &key, 60_000, Some("h"));
            assert!(
                held.is_granted(),
                "round {round}: the holder found {key} held"
            );
            assert!(held.fence() > last_fence);
            go_tx.send(()).unwrap();
            match mode {
                Contender::Blocking => {
                    // Tight polling (1 ms), so the wait adds little to the run time.
                    let deadline = Instant::now() + WAITER_TIMEOUT;
                    while waiters(&mut holder, &key) != 1 {
                        assert!(Instant::now() < deadline, "round {round}: no waiter");
                        thread::sleep(Duration::from_millis(1));
                    }
                }
                Contender::Polling => {
                    match msg_rx.recv_timeout(REPLY_TIMEOUT) {
                        Ok(ContenderMsg::Tried) => {}
                        _ => panic!("round {round}: the polling contender never tried"),
                    }
                    // Release at a random point of the poller's 50 ms cycle.
                    thread::sleep(Duration::from_millis(rng.range(0, POLL_INTERVAL_MS - 1)));
                }
            }
            let released_at = Instant::now();
            assert_eq!(release(&mut holder, &key, "h"), 1, "round {round}");
            match msg_rx.recv_timeout(REPLY_TIMEOUT) {
                Ok(ContenderMsg::Got {
                    received,
                    fence,
                    released,
                }) => {
                    assert!(fence > held.fence(), "round {round}: fence did not rise");
                    assert_eq!(
                        released, 1,
                        "round {round}: the contender could not release"
                    );
                    last_fence = fence;
                    latencies.push(received - released_at);
                }
                _ => panic!("round {round}: the {mode:?} contender did not get the lease"),
            }
        }
        drop(go_tx);
        join(contender_thread);
        latencies
    })
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

for_each_server!(handoff_latency_report, |flavor| {
    const PAIRS: usize = 8;
    const ROUNDS: usize = 25;
    let server = Server::start(flavor);
    let mut report = Vec::new();
    for mode in [Contender::Blocking, Contender::Polling] {
        let to_waiters = lease_stat(&server, "grants_to_waiters");
        let pairs: Vec<_> = (0..PAIRS)
            .map(|p| handoff_pair(&server, format!("{mode:?}-{p}"), mode, ROUNDS, p as u64 + 7))
            .collect();
        let mut latencies: Vec<Duration> = pairs.into_iter().flat_map(join).collect();
        assert_eq!(
            latencies.len(),
            PAIRS * ROUNDS,
            "{mode:?}: missing handoffs"
        );
        let granted_to_waiters = lease_stat(&server, "grants_to_waiters") - to_waiters;
        match mode {
            Contender::Blocking => assert_eq!(granted_to_waiters, (PAIRS * ROUNDS) as u64),
            Contender::Polling => assert_eq!(granted_to_waiters, 0),
        }
        latencies.sort();
        let mean = latencies.iter().sum::<Duration>() / latencies.len() as u32;
        report.push(format!(
            "{flavor}: handoff latency, {mode:?} ({} handoffs, {PAIRS} keys in parallel): \
             p50 {:.2} ms, p99 {:.2} ms, mean {:.2} ms, max {:.2} ms",
            latencies.len(),
            ms(percentile(&latencies, 50)),
            ms(percentile(&latencies, 99)),
            ms(mean),
            ms(latencies[latencies.len() - 1]),
        ));
    }
    for line in &report {
        eprintln!("{line}");
    }
    assert_eq!(lease_stat(&server, "waiters"), 0);
    assert_server_healthy(&server);
});
