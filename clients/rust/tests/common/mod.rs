//! Real servers for the client's tests: each test starts its own (a temp dir, a free
//! loopback port, the module loaded, `enable-debug-command local`) and stops it by pid
//! when it is dropped. No mocks.
//!
//! The module: `LEASE_MODULE`, else `<repo>/target/release/libredis_lease.so` (build it
//! with `cargo build --release --lib` at the repo root; `clients/rust/test` does). The
//! servers are the matrix of the repo's tests (`tests/servers.txt`), each from its
//! variable (`LEASE_REDIS7_SERVER` ...) or where `scripts/install-deps` puts it: the
//! flavors, the per-server tests and the hash slot are the repo's test harness's
//! (`tests/harness`). A missing binary fails the test; `clients/rust/test` skips the
//! servers that are not set.

#![allow(dead_code)]

use std::fs;
use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};

pub const START_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(5);

pub use harness::cluster::key_slot as slot;
pub use harness::Flavor;

/// `for_each_server!(name, |flavor| { async body })`: the harness's `for_each_server!`
/// (a module `name` with one test per server of the matrix: `name::redis7`, ...), each
/// running the body on a multi-threaded runtime of its own.
#[macro_export]
macro_rules! for_each_server {
    ($name:ident, |$flavor:ident| $body:block) => {
        harness::for_each_server!($name, |flavor| {
            let $flavor = flavor;
            $crate::common::block_on(async move $body)
        });
    };
}

pub fn block_on<F: Future<Output = ()>>(test: F) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(test)
}

pub fn repo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn module_path() -> PathBuf {
    let path = match std::env::var_os("LEASE_MODULE") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => repo_dir().join("target/release/libredis_lease.so"),
    };
    assert!(
        path.is_file(),
        "module not found at {}: run `cargo build --release --lib` at the repo root (or set LEASE_MODULE)",
        path.display()
    );
    path
}

/// A server of its own: a temp dir, a free port, the module loaded. Dropping it kills
/// it (by pid) and removes its dir, or keeps the dir and prints the log if the test is
/// failing.
pub struct Server {
    pub flavor: Flavor,
    pub port: u16,
    child: Child,
    dir: PathBuf,
}

impl Server {
    pub fn start(flavor: Flavor) -> Server {
        Server::start_with(flavor, &[])
    }

    pub fn start_with(flavor: Flavor, extra: &[(&str, &str)]) -> Server {
        let mut last_error = String::new();
        for _ in 0..5 {
            let dir = fresh_dir("server");
            let port = free_port();
            let mut conf = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\ndaemonize no\nsave \"\"\n\
                 appendonly no\nlogfile {dir}/server.log\nenable-debug-command local\n\
                 loadmodule {module}\n",
                dir = dir.display(),
                module = module_path().display(),
            );
            for (name, value) in extra {
                conf.push_str(&format!("{name} {value}\n"));
            }
            fs::write(dir.join("server.conf"), conf).expect("config");
            let child = spawn(flavor, &dir, &["server.conf"]);
            let mut server = Server {
                flavor,
                port,
                child,
                dir,
            };
            match server.wait_ready() {
                Ok(()) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("{} would not start: {last_error}", flavor.name());
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited with {status}:\n{}", self.log()));
            }
            if let Ok(client) = redis::Client::open(self.url()) {
                if let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(1)) {
                    if redis::cmd("PING").query::<String>(&mut conn).is_ok() {
                        return Ok(());
                    }
                }
            }
            if start.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "no PING answer in {START_TIMEOUT:?}:\n{}",
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("client")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// A connection for the test's own commands: no response timeout (DEBUG SLEEP).
    pub async fn admin(&self) -> MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection_with_config(
                &AsyncConnectionConfig::new().set_response_timeout(None),
            )
            .await
            .expect("admin connection")
    }

    /// Stops the server process (SIGSTOP): it neither answers nor expires anything.
    pub fn freeze(&self) {
        signal(self.pid(), "-STOP");
    }

    pub fn thaw(&self) {
        signal(self.pid(), "-CONT");
    }

    /// Kills the server (SIGKILL) for good.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Kills the server (SIGKILL, even when stopped) and starts it again on the same
    /// port, directory and config: what it had persisted (AOF) is back, what sat unread
    /// in its sockets is gone.
    pub fn crash_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let start = Instant::now();
        loop {
            self.child = spawn(self.flavor, &self.dir, &["server.conf"]);
            match self.wait_ready() {
                Ok(()) => return,
                // The port may take a moment to be free again.
                Err(e) if start.elapsed() > START_TIMEOUT => panic!("no restart: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Bytes sent to the server that it has not read yet (the receive queues of its
    /// connections, from /proc/net/tcp): a stopped server's pending requests.
    pub fn unread_bytes(&self) -> u64 {
        let table = fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        let port = format!("{:04X}", self.port);
        table
            .lines()
            .skip(1)
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let local_port = fields.get(1)?.rsplit(':').next()?;
                // Connections to the server: local port is its port, state 01 (ESTABLISHED).
                if local_port != port || *fields.get(3)? != "01" {
                    return None;
                }
                let rx = fields.get(4)?.rsplit(':').next()?;
                u64::from_str_radix(rx, 16).ok()
            })
            .sum()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        signal(self.pid(), "-CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- {} log ({}) ---\n{}",
                self.flavor.name(),
                self.dir.display(),
                self.log()
            );
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// An empty temp dir of its own for one process.
fn fresh_dir(what: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "redis-lease-client-{what}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// The flavor's server binary with `args`, in `dir` (its config file is one of the args).
fn spawn(flavor: Flavor, dir: &Path, args: &[&str]) -> Child {
    Command::new(flavor.binary())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn server")
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(sig)
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Polls `check` until it holds, failing the test with `what` after `timeout`.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return;
        }
        assert!(start.elapsed() < timeout, "not within {timeout:?}: {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// A field of `INFO <section>`.
pub async fn info_field(conn: &mut MultiplexedConnection, section: &str, field: &str) -> String {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or("")
        .trim()
        .to_string()
}

/// `LEASE.RENEW` calls the server has seen (`INFO commandstats`).
pub async fn renew_calls(conn: &mut MultiplexedConnection) -> u64 {
    command_calls(conn, "lease.renew").await
}

pub async fn command_calls(conn: &mut MultiplexedConnection, command: &str) -> u64 {
    let stat = info_field(conn, "commandstats", &format!("cmdstat_{command}")).await;
    stat.split(',')
        .find_map(|kv| kv.strip_prefix("calls="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A field of `LEASE.INFO key` (None: no lease record, or no such field).
pub async fn lease_info(conn: &mut MultiplexedConnection, key: &str, field: &str) -> Option<Value> {
    let reply: Value = redis::cmd("LEASE.INFO")
        .arg(key)
        .query_async(conn)
        .await
        .expect("LEASE.INFO");
    let items = match reply {
        Value::Array(items) => items,
        Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        _ => return None,
    };
    let mut it = items.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        if redis::from_redis_value::<String>(k).ok().as_deref() == Some(field) {
            return Some(v);
        }
    }
    None
}

/// `held`, `free`, `delayed`, or `none` for a key without a lease record.
pub async fn lease_state(conn: &mut MultiplexedConnection, key: &str) -> String {
    match lease_info(conn, key, "state").await {
        Some(v) => redis::from_redis_value(v).expect("state"),
        None => "none".to_string(),
    }
}

pub async fn lease_fence(conn: &mut MultiplexedConnection, key: &str) -> u64 {
    redis::from_redis_value(lease_info(conn, key, "fence").await.expect("fence")).expect("fence")
}

/// A key a single test uses on one server; the flavor in it helps when reading logs.
pub fn key(flavor: Flavor, name: &str) -> String {
    format!("lock:{}:{name}", flavor.name())
}

/// A three-master cluster of one flavor, slots split evenly, formed with
/// `CLUSTER ADDSLOTSRANGE` and `CLUSTER MEET`.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    pub async fn start(flavor: Flavor) -> Cluster {
        Cluster::start_with(flavor, &[]).await
    }

    /// Three masters with `extra` config lines each.
    pub async fn start_with(flavor: Flavor, extra: &[(&str, &str)]) -> Cluster {
        let mut config = vec![
            ("cluster-enabled", "yes"),
            ("cluster-config-file", "nodes.conf"),
            ("cluster-node-timeout", "2000"),
        ];
        config.extend_from_slice(extra);
        let nodes: Vec<Server> = (0..3)
            .map(|_| Server::start_with(flavor, &config))
            .collect();
        let ranges = [(0, 5460), (5461, 10922), (10923, 16383)];
        for (i, node) in nodes.iter().enumerate() {
            let mut conn = node.admin().await;
            let (lo, hi) = ranges[i];
            let _: () = redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(lo)
                .arg(hi)
                .query_async(&mut conn)
                .await
                .expect("ADDSLOTSRANGE");
            let _: () = redis::cmd("CLUSTER")
                .arg("SET-CONFIG-EPOCH")
                .arg(i + 1)
                .query_async(&mut conn)
                .await
                .expect("SET-CONFIG-EPOCH");
        }
        let mut first = nodes[0].admin().await;
        for node in &nodes[1..] {
            let _: () = redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(node.port)
                .query_async(&mut first)
                .await
                .expect("MEET");
        }
        for node in &nodes {
            let conn = node.admin().await;
            eventually(
                Duration::from_secs(20),
                "cluster_state:ok on every node",
                || {
                    let mut conn = conn.clone();
                    async move {
                        let conn = &mut conn;
                        let info: String = redis::cmd("CLUSTER")
                            .arg("INFO")
                            .query_async(conn)
                            .await
                            .unwrap_or_default();
                        let slots: Vec<Value> = redis::cmd("CLUSTER")
                            .arg("SLOTS")
                            .query_async(conn)
                            .await
                            .unwrap_or_default();
                        info.contains("cluster_state:ok")
                            && info.contains("cluster_known_nodes:3")
                            && slots.len() == 3
                    }
                },
            )
            .await;
        }
        Cluster { nodes }
    }

    pub fn client(&self) -> redis::cluster::ClusterClient {
        redis::cluster::ClusterClient::new(self.nodes.iter().map(|n| n.url()).collect::<Vec<_>>())
            .expect("cluster client")
    }

    /// The node that serves `key`, to stop or restart.
    pub fn node_for_mut(&mut self, key: &str) -> &mut Server {
        let port = self.node_for(key).port;
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node")
    }

    /// The node that serves `key`.
    pub fn node_for(&self, key: &str) -> &Server {
        let slot = slot(key.as_bytes());
        let index = match slot {
            0..=5460 => 0,
            5461..=10922 => 1,
            _ => 2,
        };
        &self.nodes[index]
    }
}

/// A replica of `primary` with the module, once its link is up.
pub async fn start_replica(flavor: Flavor, primary: &Server) -> Server {
    let replicaof = format!("127.0.0.1 {}", primary.port);
    // Either node may be the primary later (a failover): both sync a replica at once.
    let replica = Server::start_with(
        flavor,
        &[("repl-diskless-sync-delay", "0"), ("replicaof", &replicaof)],
    );
    let admin = replica.admin().await;
    eventually(Duration::from_secs(20), "the replica to sync", || {
        let mut admin = admin.clone();
        async move { info_field(&mut admin, "replication", "master_link_status").await == "up" }
    })
    .await;
    replica
}

/// Stops `server`, sends `write` through `lease` (with `retries`), waits until it sits
/// unread in the stopped server's socket, then kills and restarts the server (from its
/// AOF): the write never ran there. Returns the write's outcome.
pub async fn fenced_write_across_a_restart(
    server: &mut Server,
    lease: &redis_lease_client::Lease,
    resource: &str,
    write: redis::Cmd,
    retries: u32,
) -> redis_lease_client::Result<i64> {
    server.freeze();
    let writer = {
        let lease = lease.clone();
        let resource = resource.to_string();
        tokio::spawn(async move {
            lease
                .fence_call_retrying::<i64>(&resource, &write, retries)
                .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.unread_bytes() <= 1000 {
        assert!(
            Instant::now() < deadline,
            "the write never reached the socket"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.crash_and_restart();
    writer.await.expect("the writer task")
}

/// The lease is held again (a renewal confirmed after a failure), and two renewals more
/// have gone by since: time for anything that would resend a write to have done it.
pub async fn held_again_and_renewed(lease: &redis_lease_client::Lease) {
    eventually(Duration::from_secs(4), "held again", || async {
        lease.state() == redis_lease_client::State::Held
    })
    .await;
    let renewals = lease.renewals();
    eventually(Duration::from_secs(5), "two more renewals", || async {
        lease.renewals() >= renewals + 2
    })
    .await;
}

pub const MASTER_NAME: &str = "mymaster";

/// Held by each Sentinel test for its whole run: one set of Sentinels at a time. Several
/// at once on a loaded 2-core machine delay Sentinel's timer past 2 s, which puts it in
/// TILT mode (30 s of no failover).
pub async fn one_sentinel_set_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

/// A Sentinel: the server binary in Sentinel mode (`--sentinel`), no module (Sentinel
/// mode holds no data). Stopped by pid when dropped.
pub struct Sentinel {
    pub port: u16,
    child: Child,
    dir: PathBuf,
}

impl Sentinel {
    fn start(flavor: Flavor, primary_port: u16) -> Sentinel {
        let dir = fresh_dir("sentinel");
        let port = free_port();
        // Down after 1 s; a failover may start again after 2 * 2 s.
        let conf = format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/server.log\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
             sentinel failover-timeout {MASTER_NAME} 2000\n",
            dir = dir.display(),
        );
        fs::write(dir.join("sentinel.conf"), conf).expect("config");
        let child = spawn(flavor, &dir, &["sentinel.conf", "--sentinel"]);
        Sentinel { port, child, dir }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// `SENTINEL MASTER mymaster` as a map (empty when it does not answer).
    pub async fn master(&self) -> std::collections::HashMap<String, String> {
        let Ok(client) = redis::Client::open(self.url()) else {
            return Default::default();
        };
        let config = AsyncConnectionConfig::new()
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_connection_timeout(Some(Duration::from_secs(2)));
        let Ok(mut conn) = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
        else {
            return Default::default();
        };
        redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(MASTER_NAME)
            .query_async(&mut conn)
            .await
            .unwrap_or_default()
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- sentinel :{} log ---\n{}", self.port, self.log());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// A primary and a replica, both with the module, watched by three Sentinels (quorum 2,
/// down after 1 s) under the name `mymaster`.
pub struct SentinelSet {
    pub sentinels: Vec<Sentinel>,
    pub nodes: Vec<Server>,
}

impl SentinelSet {
    pub async fn start(flavor: Flavor) -> SentinelSet {
        // Either node may be the primary later: both sync a replica at once.
        let primary = Server::start_with(flavor, &[("repl-diskless-sync-delay", "0")]);
        let replica = start_replica(flavor, &primary).await;
        let sentinels = (0..3)
            .map(|_| Sentinel::start(flavor, primary.port))
            .collect();
        let set = SentinelSet {
            sentinels,
            nodes: vec![primary, replica],
        };
        eventually(Duration::from_secs(30), "the Sentinels to agree", || {
            set.settled()
        })
        .await;
        set
    }

    pub fn addresses(&self) -> Vec<String> {
        self.sentinels.iter().map(Sentinel::url).collect()
    }

    /// Every Sentinel names the same primary, sees it up with its replica and the two
    /// other Sentinels.
    pub async fn settled(&self) -> bool {
        let mut seen = std::collections::HashSet::new();
        for s in &self.sentinels {
            let m = s.master().await;
            if m.get("flags").map(String::as_str) != Some("master")
                || m.get("num-slaves").map(String::as_str) != Some("1")
                || m.get("num-other-sentinels").map(String::as_str) != Some("2")
            {
                return false;
            }
            seen.insert(m.get("port").cloned());
        }
        seen.len() == 1
    }

    /// The primary's port as the first Sentinel that answers names it.
    pub async fn primary_port(&self) -> Option<u16> {
        for s in &self.sentinels {
            if let Some(port) = s.master().await.get("port").and_then(|p| p.parse().ok()) {
                return Some(port);
            }
        }
        None
    }

    pub fn node(&self, port: u16) -> &Server {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .expect("a node of the set")
    }

    pub fn node_mut(&mut self, port: u16) -> &mut Server {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of the set")
    }

    /// `SENTINEL FAILOVER`, then waits until the other node is the primary and says so
    /// itself; returns its port.
    pub async fn failover(&self) -> u16 {
        let old = self.primary_port().await.expect("a primary");
        let mut conn = redis::Client::open(self.sentinels[0].url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(MASTER_NAME)
            .query_async(&mut conn)
            .await
            .expect("SENTINEL FAILOVER");
        self.wait_new_primary(old).await
    }

    /// Waits until the Sentinels name a primary other than `old` that says it is one.
    pub async fn wait_new_primary(&self, old: u16) -> u16 {
        let start = Instant::now();
        loop {
            if let Some(port) = self.primary_port().await.filter(|&p| p != old) {
                let mut conn = self.node(port).admin().await;
                if info_field(&mut conn, "replication", "role").await == "master" {
                    return port;
                }
            }
            assert!(start.elapsed() < Duration::from_secs(30), "no new primary");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
