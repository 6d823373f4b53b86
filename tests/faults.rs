//! Panics inside the module never take the server down: a debug build with the
//! `fault-injection` feature makes chosen guarded entry points panic (the
//! `inject-panic` module argument), and the server goes on, logging each, with its
//! data whole. Injected here: the reaper's tick, an RDB save of a lease, and a blocked
//! waiter's reply callback.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use common::calls::{call, int, text};
use common::lease::lease_info;
use common::reply::assert_ok;
use common::{repo_dir, wait_until, Server, ServerOptions};
use redis::Value;

const WAIT: Duration = Duration::from_secs(10);

/// The module built in debug with `fault-injection`, once per test process, in a
/// target directory of its own (the release module the other tests load is left alone).
fn faulty_module() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let target = repo_dir().join("target").join("faults");
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let output = Command::new(cargo)
                .args(["build", "--lib", "--features", "fault-injection"])
                .arg("--target-dir")
                .arg(&target)
                .current_dir(repo_dir())
                .stdin(Stdio::null())
                .output()
                .expect("run cargo");
            assert!(
                output.status.success(),
                "cargo build --features fault-injection failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            target.join("debug").join("libredis_lease.so")
        })
        .clone()
}

/// A server that loads the faulty module with `inject-panic <names>`.
fn start_with_faults(flavor: common::Flavor, names: &str) -> Server {
    let line = format!("{} inject-panic \"{names}\"", faulty_module().display());
    Server::start_with(
        flavor,
        ServerOptions::without_module().config("loadmodule", &line),
    )
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
    let fence = match call(&mut con, "LEASE.ACQUIRE", ("L", 60_000, "TOKEN", "t")) {
        Value::Array(items) => int(items[1].clone()) as u64,
        other => panic!("ACQUIRE: {other:?}"),
    };
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
    let next = match call(&mut con, "LEASE.ACQUIRE", ("L", 60_000, "TOKEN", "u")) {
        Value::Array(items) => int(items[1].clone()) as u64,
        other => panic!("ACQUIRE after the reload: {other:?}"),
    };
    assert!(next > fence);
});

for_each_server!(
    a_panic_in_a_waiters_callback_is_logged_and_survived,
    |flavor| {
        let server = start_with_faults(flavor, "LEASE.ACQUIRE waiter");
        let mut con = server.client();
        call(&mut con, "LEASE.ACQUIRE", ("L", 60_000, "TOKEN", "t"));
        let mut waiter_con = server.client();
        let waiter = thread::spawn(move || {
            let started = Instant::now();
            let reply = call(
                &mut waiter_con,
                "LEASE.ACQUIRE",
                ("L", 60_000, "TOKEN", "w", "BLOCK", 500),
            );
            (reply, started.elapsed())
        });
        wait_until("the waiter to block", WAIT, || {
            common::lease::lease_stat(&server, "waiters") == 1
        });
        assert_eq!(int(call(&mut con, "LEASE.RELEASE", ("L", "t"))), 1);
        // The callback panics each time it is offered the lease: the waiter stays
        // blocked until its timeout, and the server answers everyone meanwhile.
        let (reply, waited) = waiter.join().expect("the waiter's thread");
        assert_eq!(reply, Value::Nil, "after {waited:?}");
        assert!(logged(&server, "LEASE.ACQUIRE waiter"));
        assert_eq!(text(call(&mut con, "PING", Vec::<String>::new())), "PONG");
        let reply = call(&mut con, "LEASE.ACQUIRE", ("L", 60_000, "TOKEN", "u"));
        assert!(matches!(reply, Value::Array(_)), "{reply:?}");
    }
);
