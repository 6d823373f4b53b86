//! Panics inside the module never take the server down: a debug build with the
//! `fault-injection` feature makes chosen guarded entry points panic (the
//! `inject-panic` module argument), and the server goes on, logging each, with its
//! data whole. Injected here: the reaper's tick, an RDB save of a lease, and a blocked
//! waiter's reply callback.

#[macro_use]
extern crate harness;

use std::time::{Duration, Instant};

use harness::calls::{call, int, take, text};
use harness::lease::lease_info;
use harness::reply::assert_ok;
use harness::waiter::Waiter;
use harness::{debug_module_path, wait_until, Server, ServerOptions};
use redis::Value;

const WAIT: Duration = Duration::from_secs(10);

/// A server that loads the faulty module with `inject-panic <names>`. One whose reaper
/// panics at every tick leaves due entries in the deadline index on purpose, which the
/// after-test `LEASE.DEBUG CHECK` would rightly name: it is not checked.
fn start_with_faults(flavor: harness::Flavor, names: &str) -> Server {
    let module = debug_module_path("faults", "fault-injection");
    let line = format!("{} inject-panic \"{names}\"", module.display());
    let mut options = ServerOptions::without_module().config("loadmodule", &line);
    if names.split('|').any(|n| n == "reaper") {
        options = options.without_final_check();
    }
    Server::start_with(flavor, options)
}

fn logged(server: &Server, what: &str) -> bool {
    server.log().contains(&format!(
        "redis-lease: internal error in {what}: injected into {what}"
    ))
}

for_each_server!(a_panic_in_the_reaper_is_logged_and_survived, |flavor| {
    let server = start_with_faults(flavor, "reaper");
    let mut con = server.client();
    call(&mut con, "LEASE.ACQUIRE", ("L", 50, "TOKEN", "t"));
    wait_until("the reaper's panic in the log", WAIT, || {
        logged(&server, "reaper")
    });
    // Alive, and the lease is free on its deadline whatever the reaper does.
    assert_eq!(text(call(&mut con, "PING", Vec::<String>::new())), "PONG");
    assert_eq!(lease_info(&mut con, "L").expect("L").state, "free");
    let reply = call(&mut con, "LEASE.ACQUIRE", ("L", 60_000, "TOKEN", "u"));
    assert!(matches!(reply, Value::Array(_)), "{reply:?}");
});

for_each_server!(a_panic_in_an_rdb_save_saves_a_whole_value, |flavor| {
    let server = start_with_faults(flavor, "lease-key save");
    let mut con = server.client();
    let fence = take(&mut con, "L", 60_000, "t");
    call(&mut con, "LEASE.FENCE", ("R", 7));
    assert_ok(call(&mut con, "SAVE", Vec::<String>::new()), "SAVE");
    assert!(logged(&server, "lease-key save"));
    // The RDB loads: the lease comes back free with its fence, the record whole.
    assert_ok(
        call(&mut con, "DEBUG", ("RELOAD", "NOSAVE")),
        "DEBUG RELOAD NOSAVE",
    );
    let info = lease_info(&mut con, "L").expect("L after the reload");
    assert_eq!((info.state.as_str(), info.fence), ("free", fence));
    assert_eq!(int(call(&mut con, "LEASE.FENCE", ("R", 7))), 7);
    let next = take(&mut con, "L", 60_000, "u");
    assert!(next > fence);
});

for_each_server!(
    a_panic_in_a_waiters_callback_is_logged_and_survived,
    |flavor| {
        let server = start_with_faults(flavor, "LEASE.ACQUIRE waiter");
        let mut con = server.client();
        call(&mut con, "LEASE.ACQUIRE", ("L", 60_000, "TOKEN", "t"));
        let started = Instant::now();
        let waiter = Waiter::block(&server, "L", 60_000, "w", 500, &[]);
        assert_eq!(int(call(&mut con, "LEASE.RELEASE", ("L", "t"))), 1);
        // The callback panics each time it is offered the lease: the waiter stays
        // blocked until its timeout, and the server answers everyone meanwhile.
        let (reply, answered) = waiter.reply(WAIT, "the waiter");
        let waited = answered - started;
        assert_eq!(reply, Value::Nil, "after {waited:?}");
        assert!(logged(&server, "LEASE.ACQUIRE waiter"));
        assert_eq!(text(call(&mut con, "PING", Vec::<String>::new())), "PONG");
        let reply = call(&mut con, "LEASE.ACQUIRE", ("L", 60_000, "TOKEN", "u"));
        assert!(matches!(reply, Value::Array(_)), "{reply:?}");
    }
);
