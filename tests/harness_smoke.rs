//! Proves the harness itself on each server: start, version, restart, crash recovery,
//! replication. These tests start plain servers, so they need no module build; the
//! module-loading test is the one place they meet the module.

#[macro_use]
extern crate harness;

use harness::calls::get;
use harness::{Server, ServerOptions};

fn set(con: &mut redis::Connection, key: &str, value: &str) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query(con)
        .unwrap_or_else(|e| panic!("SET {key} failed: {e}"));
}

for_each_server!(starts_the_expected_server, |flavor| {
    let server = Server::start_with(flavor, ServerOptions::without_module());
    let mut con = server.client();
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");

    // The version the matrix (tests/servers.txt) gives in the server's label.
    let info = server.info("server");
    let entry = flavor.entry();
    let expected = format!("{}_version:{}.", entry.product(), entry.version());
    assert!(
        info.lines().any(|l| l.starts_with(&expected)),
        "{}: no {expected} in INFO server:\n{info}",
        entry.label
    );
    assert_eq!(
        flavor.is_valkey(),
        entry.product() == "valkey",
        "{}",
        entry.label
    );
    if flavor.is_valkey() {
        assert!(info.contains("server_name:valkey"), "INFO server:\n{info}");
    } else {
        assert!(!info.contains("valkey"), "INFO server:\n{info}");
    }
});

for_each_server!(resp3_client_speaks_resp3, |flavor| {
    let server = Server::start_with(flavor, ServerOptions::without_module());
    let mut con = server.client_resp3();
    let hello: redis::Value = redis::cmd("HELLO").query(&mut con).unwrap();
    let redis::Value::Map(fields) = hello else {
        panic!("HELLO did not answer a RESP3 map: {hello:?}");
    };
    let proto = fields
        .iter()
        .find(|(k, _)| *k == redis::Value::BulkString(b"proto".to_vec()))
        .map(|(_, v)| v.clone());
    assert_eq!(proto, Some(redis::Value::Int(3)));
});

for_each_server!(restart_keeps_saved_data, |flavor| {
    let options = ServerOptions::without_module().config("save", "3600 1");
    let mut server = Server::start_with(flavor, options);
    let mut con = server.client();
    set(&mut con, "k", "v");
    let _: () = redis::cmd("SAVE").query(&mut con).unwrap();
    drop(con);

    let first_pid = server.pid;
    server.restart();
    assert_ne!(server.pid, first_pid);
    assert!(server.dir.join("dump.rdb").is_file());
    assert_eq!(get(&mut server.client(), "k").as_deref(), Some("v"));
});

for_each_server!(kill9_then_start_again_replays_the_aof, |flavor| {
    let options = ServerOptions::without_module()
        .config("appendonly", "yes")
        .config("appendfsync", "always");
    let mut server = Server::start_with(flavor, options);
    let mut con = server.client();
    set(&mut con, "k", "v");
    drop(con);

    server.kill9();
    assert!(!server.is_running());
    server.start_again();
    assert_eq!(get(&mut server.client(), "k").as_deref(), Some("v"));
});

for_each_server!(replica_follows_master, |flavor| {
    let master = Server::start_with(flavor, ServerOptions::without_module());
    let replica = Server::start_with(flavor, ServerOptions::without_module());
    set(&mut master.client(), "before", "1");
    replica.replicaof(&master);
    assert_eq!(get(&mut replica.client(), "before").as_deref(), Some("1"));

    set(&mut master.client(), "after", "2");
    replica.wait_for_sync(&master);
    assert_eq!(get(&mut replica.client(), "after").as_deref(), Some("2"));
});

for_each_server!(module_loads, |flavor| {
    let server = Server::start(flavor);
    let mut con = server.client();
    let modules: Vec<redis::Value> = redis::cmd("MODULE").arg("LIST").query(&mut con).unwrap();
    let names: Vec<String> = modules
        .iter()
        .filter_map(|module| {
            let redis::Value::Array(fields) = module else {
                return None;
            };
            fields.chunks(2).find_map(|pair| match pair {
                [redis::Value::BulkString(k), redis::Value::BulkString(v)] if k == b"name" => {
                    Some(String::from_utf8_lossy(v).into_owned())
                }
                _ => None,
            })
        })
        .collect();
    assert!(
        names.iter().any(|name| name == "lease"),
        "module `lease` not in MODULE LIST: {names:?}\n{}",
        server.log()
    );
});
