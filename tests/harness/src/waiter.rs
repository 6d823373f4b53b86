//! Clients blocked in `LEASE.ACQUIRE ... BLOCK`, each on its own connection: on a
//! thread of its own, whose reply (or how its connection failed) and when it came back
//! arrive over a channel, or on a bare socket the test can close. A test learns that a
//! client is blocked by polling the server's count of waiters, never by sleeping.

use std::io::Write;
use std::net::TcpStream;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use redis::{Cmd, ConnectionLike, RedisResult, Value};

use super::calls::{acquire_cmd, call, client_id};
use super::lease::{lease_stat, wait_for_waiters};
use super::reply::error_text;
use super::{join, wait_until, Server};

/// How long a client gets to show up among the waiters.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `answer` waits for a reply that must come.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// What a blocked command got: its reply (error replies included), or how its
/// connection failed; and when.
pub type Outcome = (RedisResult<Value>, Instant);

/// A command sent from its own thread and connection, whose reply the test collects.
pub struct Waiter {
    /// `CLIENT ID` of the waiter's connection.
    pub client_id: i64,
    rx: Receiver<Outcome>,
    handle: JoinHandle<()>,
}

impl Waiter {
    /// Runs `setup` (each must succeed) on a new connection to `server`, then sends `cmd`
    /// on it from a thread of its own. Returns at once.
    pub fn send(server: &Server, setup: &[&[&str]], cmd: Cmd) -> Waiter {
        let mut con = server.client();
        for command in setup {
            let reply = call(&mut con, command[0], &command[1..]);
            assert!(error_text(&reply).is_none(), "{command:?}: {reply:?}");
        }
        let client_id = client_id(&mut con);
        let (tx, rx) = mpsc::channel();
        let handle = thread::spawn(move || {
            let reply = con.req_command(&cmd);
            let _ = tx.send((reply, Instant::now()));
        });
        Waiter {
            client_id,
            rx,
            handle,
        }
    }

    /// `LEASE.ACQUIRE key ttl TOKEN token BLOCK block` after `setup`; returns once
    /// `INFO lease` counts one waiter more than before it was sent.
    pub fn block(
        server: &Server,
        key: &str,
        ttl: u64,
        token: &str,
        block: u64,
        setup: &[&[&str]],
    ) -> Waiter {
        let before = lease_stat(server, "waiters");
        let waiter = Self::send(
            server,
            setup,
            acquire_cmd(key, ttl, Some(token), Some(block)),
        );
        wait_until(&format!("{token} to block on {key}"), BLOCK_TIMEOUT, || {
            lease_stat(server, "waiters") == before + 1
        });
        waiter
    }

    /// `LEASE.ACQUIRE key ttl TOKEN token BLOCK block`; returns once `LEASE.INFO key`
    /// counts it as the `position`th waiter of `key`, so waiters queued one after
    /// another are served in that order.
    pub fn queue(
        server: &Server,
        key: &str,
        ttl: u64,
        token: &str,
        block: u64,
        position: i64,
    ) -> Waiter {
        let waiter = Self::send(server, &[], acquire_cmd(key, ttl, Some(token), Some(block)));
        wait_for_waiters(&mut server.client(), key, position);
        waiter
    }

    /// Whether the waiter's thread is done: it was answered, or its connection failed.
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Panics if the waiter has been answered (or its thread is gone).
    pub fn assert_waiting(&self, what: &str) {
        match self.rx.try_recv() {
            Err(TryRecvError::Empty) => {}
            Ok(reply) => panic!("{what}: answered {reply:?} while it should still wait"),
            Err(TryRecvError::Disconnected) => panic!("{what}: the waiter thread is gone"),
        }
    }

    /// What the waiter got, which must come `within` that long; joins the thread.
    pub fn outcome(self, within: Duration, what: &str) -> Outcome {
        let got = self
            .rx
            .recv_timeout(within)
            .unwrap_or_else(|e| panic!("{what}: no reply within {within:?}: {e}"));
        join(self.handle);
        got
    }

    /// The reply, or how the connection failed, which must come within 10 s.
    pub fn answer(self, what: &str) -> RedisResult<Value> {
        self.outcome(ANSWER_TIMEOUT, what).0
    }

    /// The reply and when it came; panics if the connection failed.
    pub fn reply(self, within: Duration, what: &str) -> (Value, Instant) {
        match self.outcome(within, what) {
            (Ok(reply), at) => (reply, at),
            (Err(e), _) => panic!("{what}: the connection failed: {e}"),
        }
    }
}

/// `LEASE.ACQUIRE key 10000 TOKEN token BLOCK 0` on a bare socket, which the test can
/// shut down while the server holds the client blocked; returns once `LEASE.INFO key`
/// counts it as the `position`th waiter.
pub fn raw_blocked_acquire(server: &Server, key: &str, token: &str, position: i64) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", server.port))
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", server.flavor));
    let args = ["LEASE.ACQUIRE", key, "10000", "TOKEN", token, "BLOCK", "0"];
    let mut packet = format!("*{}\r\n", args.len());
    for arg in args {
        packet.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream
        .write_all(packet.as_bytes())
        .unwrap_or_else(|e| panic!("cannot send on a raw socket: {e}"));
    wait_for_waiters(&mut server.client(), key, position);
    stream
}
