//! Real-server harness for the integration tests.
//!
//! Every test owns its servers: each one gets a fresh directory under the system temp
//! dir, a free loopback port, and a config file written there. A server that does not
//! answer PING within the start deadline fails the test with its log; a test that panics
//! prints the log of every server it still holds and keeps their directories.
//!
//! The server flavors are the matrix, `tests/servers.txt` (`matrix`): `scripts/install-deps`
//! installs them from it, and each flavor's variable there (`LEASE_REDIS7_SERVER` ...)
//! points the tests at another binary. A missing server fails the test: it is never
//! skipped.
//!
//! The module a server loads is built at most once per test run and is never older than
//! its sources (`module_path`). The submodules hold the one set of helpers every test
//! file uses: `calls` (commands and their replies), `reply` (reading replies), `lease`
//! (`LEASE.INFO`, `INFO lease`, DUMP payloads), `holds` (version 2: shared holds,
//! the ten-field `LEASE.INFO`, `LEASE.HOLDERS`), `rdb` (the module-value encoder, shared
//! with fuzz/), `waiter` (blocked clients), `errors`, `cluster` (with the one hash-slot
//! function of the tests and benches, `cluster::key_slot`), and `matrix`.

#![allow(dead_code)]

use std::fmt;
use std::fs::{self, File};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a server gets to answer PING after it is spawned (AOF/RDB loading included).
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a graceful SHUTDOWN may take; Redis waits up to 10 s for lagging replicas.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(15);
/// How long `Drop` waits after `SHUTDOWN NOSAVE` before it sends SIGKILL.
const DROP_GRACE: Duration = Duration::from_secs(2);
/// Replication handshakes and catch-up.
pub const REPLICATION_TIMEOUT: Duration = Duration::from_secs(10);
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// A port picked from `bind(127.0.0.1:0)` can be taken by someone else before the server
/// binds it; starting again on a new port makes that race harmless.
const PORT_ATTEMPTS: usize = 5;

/// The servers the module is tested against: one variant per line of the matrix,
/// `tests/servers.txt`, in its order (the harness's own tests hold the two to each
/// other). Where each comes from, its version and its binary are the matrix's; what
/// sets one apart in behaviour is here and in the tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flavor {
    Redis7,
    Redis8,
    Valkey8,
    Valkey9,
}

impl Flavor {
    pub const ALL: [Flavor; 4] = [
        Flavor::Redis7,
        Flavor::Redis8,
        Flavor::Valkey8,
        Flavor::Valkey9,
    ];

    /// The suffix of every per-server test name (`<test>::<name>`).
    pub fn name(&self) -> &'static str {
        match self {
            Flavor::Redis7 => "redis7",
            Flavor::Redis8 => "redis8",
            Flavor::Valkey8 => "valkey8",
            Flavor::Valkey9 => "valkey9",
        }
    }

    /// The flavor a name (`redis7`, `redis8`, `valkey8`, `valkey9`) stands for.
    pub fn from_name(name: &str) -> Option<Flavor> {
        Flavor::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The flavor's line of the matrix.
    pub fn entry(&self) -> &'static matrix::Entry {
        matrix::entry(self.name())
    }

    /// The environment variable that overrides the server binary.
    pub fn env_var(&self) -> &'static str {
        &self.entry().variable
    }

    /// The server and its major.minor version, as reports name it (`Redis 7.0`).
    pub fn label(&self) -> &'static str {
        &self.entry().label
    }

    pub fn is_valkey(&self) -> bool {
        matches!(self, Flavor::Valkey8 | Flavor::Valkey9)
    }

    /// The `sanitize-dump-payload` settings a RESTORE test goes through, each set with
    /// `CONFIG SET` first; `None` stands for the server's only behaviour. Valkey 9
    /// validates every RESTORE payload deeply (`dump_payload_sanitizations` counts each
    /// one) and no longer has the config: `CONFIG SET` answers that it is unknown, and a
    /// config file line is accepted and ignored.
    pub fn sanitize_dump_payload_settings(&self) -> &'static [Option<&'static str>] {
        match self {
            Flavor::Valkey9 => &[None],
            _ => &[Some("no"), Some("yes")],
        }
    }

    /// Where the server binary is when the environment does not say.
    pub fn default_binary(&self) -> PathBuf {
        self.entry().default_binary(&repo_dir())
    }

    /// The server binary; panics (failing the test) when it is not installed.
    pub fn binary(&self) -> PathBuf {
        let path = match std::env::var_os(self.env_var()) {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => self.default_binary(),
        };
        if !path.is_file() {
            panic!(
                "{} server not found at {} (set by {} or its default): run scripts/install-deps",
                self.name(),
                path.display(),
                self.env_var()
            );
        }
        path
    }
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Expands `for_each_server!(name, |flavor| { ... })` into a module `name` holding one
/// `#[test]` per flavor: `name::redis7`, `name::redis8`, `name::valkey8`,
/// `name::valkey9`. The test runner runs and reports them separately, and the name's
/// last segment tells the server. Attributes written before the name (`#[ignore]`,
/// `#[should_panic]`) go on each of the four tests. The body sees the test file's items through `use super::*`.
///
/// The test file imports the harness's macros (`#[macro_use] extern crate harness;`).
#[macro_export]
macro_rules! for_each_server {
    ($(#[$attr:meta])* $name:ident, |$flavor:ident| $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            fn run($flavor: $crate::Flavor) $body

            $(#[$attr])*
            #[test]
            fn redis7() {
                run($crate::Flavor::Redis7)
            }

            $(#[$attr])*
            #[test]
            fn redis8() {
                run($crate::Flavor::Redis8)
            }

            $(#[$attr])*
            #[test]
            fn valkey8() {
                run($crate::Flavor::Valkey8)
            }

            $(#[$attr])*
            #[test]
            fn valkey9() {
                run($crate::Flavor::Valkey9)
            }
        }
    };
}

/// The repository root (where the module's Cargo.toml is; this crate is
/// tests/harness).
pub fn repo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => repo_dir().join(dir),
        _ => repo_dir().join("target"),
    }
}

/// The module, built at most once per test run and never older than its sources.
///
/// nextest runs every test in a process of its own: building in each process meant one
/// `cargo build --release --lib` per test, hundreds a run, each a no-op that still waits
/// for cargo's lock on the target directory and fingerprints every dependency. So the first process of a
/// `cargo nextest run` takes an exclusive lock (`flock`) on
/// `redis-lease-module.lock` in the build's target directory, builds, and writes the
/// run's id (`NEXTEST_RUN_ID`) to `redis-lease-module.stamp` there; every other process
/// of the run waits for the lock, finds its run's id and does not build. Cargo still
/// decides what a build has to redo (sources, dependencies, flags): the harness only
/// decides how often it is asked, and asking once a run (rather than trusting a stamp
/// across runs) keeps cargo the judge. Outside nextest (`cargo test`, one process per
/// test file; the benches) each process builds once.
///
/// Then, built or not, the `.so` must be newer than every file under `src/` and
/// `commands/` (build.rs reads it) and than `Cargo.toml` and `build.rs`: a source edited
/// during the run, or a build that went to another target directory, panics here with
/// the file that is newer, instead of loading a module that is not the code under test.
/// Panics with cargo's output when the build fails.
pub fn module_path() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| ModuleBuild::release().built());
    match built {
        Ok(path) => path.clone(),
        Err(message) => panic!("{message}"),
    }
}

/// The module built in debug with `--features <features>`, in `target/<dir>`: a target
/// directory of its own, so the release module the other tests load is left alone.
/// Built once per run and checked as `module_path`'s is.
pub fn debug_module_path(dir: &str, features: &str) -> PathBuf {
    /// (target dir, features) and what building it gave.
    type Built = ((String, String), Result<PathBuf, String>);
    static BUILT: Mutex<Vec<Built>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let key = (dir.to_string(), features.to_string());
    let result = match built.iter().find(|(k, _)| *k == key) {
        Some((_, result)) => result.clone(),
        None => {
            let result = ModuleBuild::debug(dir, features).built();
            built.push((key, result.clone()));
            result
        }
    };
    result.unwrap_or_else(|message| panic!("{message}"))
}

/// One way of building the module: cargo's arguments and where the `.so` lands.
struct ModuleBuild {
    args: Vec<String>,
    target: PathBuf,
    file: PathBuf,
}

impl ModuleBuild {
    /// `cargo build --release --lib`, the module every server loads by default.
    fn release() -> ModuleBuild {
        let target = target_dir();
        ModuleBuild {
            args: ["build", "--release", "--lib"].map(String::from).to_vec(),
            file: target.join("release").join("libredis_lease.so"),
            target,
        }
    }

    fn debug(dir: &str, features: &str) -> ModuleBuild {
        let target = target_dir().join(dir);
        let mut args: Vec<String> = ["build", "--lib", "--features", features, "--target-dir"]
            .map(String::from)
            .to_vec();
        args.push(target.to_string_lossy().into_owned());
        ModuleBuild {
            args,
            file: target.join("debug").join("libredis_lease.so"),
            target,
        }
    }

    /// The `.so`, built once per run and no older than its sources.
    fn built(&self) -> Result<PathBuf, String> {
        self.build_once_per_run()?;
        check_fresh(&self.file)?;
        Ok(self.file.clone())
    }

    /// `build` once per `cargo nextest run`, under a lock the run's processes share.
    fn build_once_per_run(&self) -> Result<(), String> {
        let run = match std::env::var("NEXTEST_RUN_ID") {
            Ok(run) if !run.is_empty() => run,
            _ => return self.build(),
        };
        let dir = &self.target;
        fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let lock_path = dir.join("redis-lease-module.lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| format!("cannot open {}: {e}", lock_path.display()))?;
        // Held until `lock` is closed, when this function returns (or the process dies).
        loop {
            // SAFETY: `lock` owns the descriptor and outlives the call; flock only reads it.
            if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(format!("cannot lock {}: {e}", lock_path.display()));
            }
        }
        let stamp = dir.join("redis-lease-module.stamp");
        if fs::read_to_string(&stamp).is_ok_and(|built_by| built_by == run) {
            return Ok(());
        }
        self.build()?;
        fs::write(&stamp, &run).map_err(|e| format!("cannot write {}: {e}", stamp.display()))
    }

    fn build(&self) -> Result<(), String> {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let command = format!("cargo {}", self.args.join(" "));
        let output = Command::new(&cargo)
            .args(&self.args)
            .current_dir(repo_dir())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", Path::new(&cargo).display()))?;
        if !output.status.success() {
            return Err(format!(
                "{command} failed ({}):\n{}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        if !self.file.is_file() {
            return Err(format!(
                "{command} succeeded but {} does not exist",
                self.file.display()
            ));
        }
        Ok(())
    }
}

/// An error when a file the module is built from is newer than the module.
fn check_fresh(module: &Path) -> Result<(), String> {
    let modified = |path: &Path| {
        fs::metadata(path)
            .and_then(|m| m.modified())
            .map_err(|e| format!("cannot read the mtime of {}: {e}", path.display()))
    };
    let built = modified(module)?;
    let repo = repo_dir();
    let mut inputs = vec![repo.join("Cargo.toml"), repo.join("model/Cargo.toml")];
    if repo.join("build.rs").exists() {
        inputs.push(repo.join("build.rs"));
    }
    // The module's sources and its model crate's.
    let mut dirs = vec![repo.join("src"), repo.join("model/src")];
    if repo.join("commands").is_dir() {
        dirs.push(repo.join("commands"));
    }
    while let Some(dir) = dirs.pop() {
        let entries =
            fs::read_dir(&dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        for entry in entries {
            let path = entry
                .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
                .path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                inputs.push(path);
            }
        }
    }
    for input in inputs {
        let changed = modified(&input)?;
        if changed > built {
            let ago = |t: std::time::SystemTime| {
                std::time::SystemTime::now()
                    .duration_since(t)
                    .map_or("just now".to_string(), |d| {
                        format!("{:.1} s ago", d.as_secs_f64())
                    })
            };
            return Err(format!(
                "STALE MODULE: {} (built {}) is older than {} (changed {}): the tests would \
                 load a module that is not the code under test. Build it with \
                 `cargo build --release --lib` (scripts/test does) and run the tests again; if \
                 cargo finds nothing to rebuild (an edit that does not change the library), \
                 `touch src/lib.rs` first.",
                module.display(),
                ago(built),
                input.display(),
                ago(changed)
            ));
        }
    }
    Ok(())
}

/// This machine's clock (which the servers share) in unix milliseconds.
pub fn now_ms() -> u64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_else(|e| panic!("the clock is before 1970: {e}"));
    since_epoch.as_millis() as u64
}

/// Joins a thread, re-raising its panic in the test thread.
pub fn join<T>(handle: JoinHandle<T>) -> T {
    match handle.join() {
        Ok(v) => v,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Polls `f` every 10 ms until it returns true; panics naming `what` after `timeout`.
pub fn wait_until<F: FnMut() -> bool>(what: &str, timeout: Duration, mut f: F) {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// How a server is started. `ServerOptions::default()` loads the module with no
/// arguments; `..Default::default()` keeps that.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Config directives, written to the server's config file after the `loadmodule`
    /// line (so `lease.*` module configs work here) as `name value`, the value verbatim
    /// as in redis.conf (`("save", "900 1")`); an empty value is written as `""`.
    /// A name the harness sets by default (`save`, `bind`, ...) replaces the default;
    /// `port`, `dir`, `logfile` and `daemonize` belong to the harness.
    pub config: Vec<(String, String)>,
    /// Arguments after the module path on the `loadmodule` line.
    pub module_args: Vec<String>,
    /// Load the module (default true).
    pub load_module: bool,
    /// A command the server binary runs under (`valgrind --tool=callgrind ...`), empty
    /// for none. It must exec the server in its own process: the pid is the server's.
    pub launcher: Vec<String>,
    /// Run `LEASE.DEBUG CHECK` when the server is dropped (default true; see `Drop`).
    /// Off only for a server whose structures a test breaks on purpose.
    pub final_check: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            config: Vec::new(),
            module_args: Vec::new(),
            load_module: true,
            launcher: Vec::new(),
            final_check: true,
        }
    }
}

impl ServerOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Options for a plain server, without the module.
    pub fn without_module() -> Self {
        ServerOptions {
            load_module: false,
            ..Self::default()
        }
    }

    pub fn config(mut self, name: &str, value: &str) -> Self {
        self.config.push((name.to_string(), value.to_string()));
        self
    }

    pub fn module_arg(mut self, arg: &str) -> Self {
        self.module_args.push(arg.to_string());
        self
    }

    /// No `LEASE.DEBUG CHECK` when the server is dropped: for a server whose
    /// structures the test corrupts on purpose (tests/debug_check.rs).
    pub fn without_final_check(mut self) -> Self {
        self.final_check = false;
        self
    }
}

/// Directives the harness writes unless the options replace them.
const DEFAULT_CONFIG: &[(&str, &str)] = &[
    ("bind", "127.0.0.1"),
    ("protected-mode", "yes"),
    ("save", "\"\""),
    ("appendonly", "no"),
    ("enable-debug-command", "yes"),
    ("enable-module-command", "yes"),
    // A full sync would otherwise wait 5 s for more replicas to join.
    ("repl-diskless-sync-delay", "0"),
];

const HARNESS_CONFIG: &[&str] = &["port", "dir", "logfile", "daemonize"];

/// Quotes a string for a config file line (sdssplitargs syntax) when it needs it.
fn quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| !c.is_whitespace() && !c.is_control() && !matches!(c, '"' | '\'' | '\\'));
    if plain {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn fresh_dir() -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("redis-lease-test-{}-{n}", std::process::id()));
    // A directory left by an earlier process with the same pid is stale.
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create server dir {}: {e}", dir.display()));
    dir
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1:0 to find a free port: {e}"));
    listener
        .local_addr()
        .unwrap_or_else(|e| panic!("cannot read the local address of a listener: {e}"))
        .port()
}

/// One server process owned by a test. Dropping it stops the server (`SHUTDOWN NOSAVE`,
/// SIGKILL after 2 s) and removes its directory, unless the test is panicking: then its
/// log goes to stderr and the directory stays for a look.
pub struct Server {
    pub flavor: Flavor,
    pub port: u16,
    /// The server's own directory: config file, logs, RDB and AOF files.
    pub dir: PathBuf,
    /// The pid of the current process (it changes on restart); 0 while stopped.
    pub pid: u32,
    options: ServerOptions,
    binary: PathBuf,
    child: Option<Child>,
    /// Set once a panic message has carried the log, so `Drop` does not print it again.
    log_reported: bool,
    /// The harness's own connection for read-only polls (`INFO`, `CLUSTER NODES`),
    /// kept between calls: a test that polls a gauge every 10 ms would otherwise open a
    /// connection each time, and a whole run's sockets in TIME_WAIT can use up the
    /// loopback's ephemeral ports (connect then fails with EAGAIN).
    polls: Mutex<Option<redis::Connection>>,
}

impl Server {
    /// Starts `flavor` with the module loaded.
    pub fn start(flavor: Flavor) -> Server {
        Self::start_with(flavor, ServerOptions::default())
    }

    pub fn start_with(flavor: Flavor, options: ServerOptions) -> Server {
        for (name, _) in &options.config {
            if HARNESS_CONFIG.contains(&name.to_ascii_lowercase().as_str()) {
                panic!("ServerOptions may not set `{name}`: the harness owns it");
            }
        }
        let binary = flavor.binary();
        let mut server = Server {
            flavor,
            port: 0,
            dir: fresh_dir(),
            pid: 0,
            options,
            binary,
            child: None,
            log_reported: false,
            polls: Mutex::new(None),
        };
        for attempt in 1..=PORT_ATTEMPTS {
            server.port = free_port();
            // A cluster bus port can be taken as well: pick it afresh each time.
            for (name, value) in server.options.config.iter_mut() {
                if name.eq_ignore_ascii_case("cluster-port") {
                    *value = free_port().to_string();
                }
            }
            server.write_config();
            server.spawn();
            match server.wait_ready() {
                Ok(()) => return server,
                Err(StartError::PortTaken) if attempt < PORT_ATTEMPTS => {
                    server.reap();
                    let _ = fs::remove_file(server.log_path());
                    let _ = fs::remove_file(server.stdio_path());
                }
                Err(e) => server.fail_start(e),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A new RESP2 connection. No read timeout: blocking commands may wait as long as the
    /// test wants (the test runner's slow-timeout ends a hung test).
    pub fn client(&self) -> redis::Connection {
        self.connect(&self.url())
    }

    /// A new RESP3 connection (`HELLO 3`).
    pub fn client_resp3(&self) -> redis::Connection {
        self.connect(&format!("{}?protocol=resp3", self.url()))
    }

    fn connect(&self, url: &str) -> redis::Connection {
        let client = redis::Client::open(url).unwrap_or_else(|e| panic!("bad url {url}: {e}"));
        client
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("cannot connect to {} at {url}: {e}", self.flavor))
    }

    /// A connection for the harness's own queries, which never wait long.
    fn control(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(self.url())?;
        let con = client.get_connection_with_timeout(Duration::from_secs(1))?;
        con.set_read_timeout(Some(Duration::from_secs(5)))?;
        con.set_write_timeout(Some(Duration::from_secs(5)))?;
        Ok(con)
    }

    /// A read-only command on the harness's kept connection (`polls`), opened again once
    /// if it fails (the server restarted, or closed it): only for commands that are safe
    /// to send twice.
    pub fn poll_query(&self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        let mut kept = self.polls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(con) = kept.as_mut() {
            match cmd.query::<redis::Value>(con) {
                Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => {}
                done => return done,
            }
        }
        *kept = None;
        let mut con = self.control()?;
        let reply = cmd.query::<redis::Value>(&mut con);
        if reply.is_ok() {
            *kept = Some(con);
        }
        reply
    }

    /// The text of `INFO <section>`.
    pub fn info(&self, section: &str) -> String {
        let reply = self
            .poll_query(redis::cmd("INFO").arg(section))
            .unwrap_or_else(|e| panic!("INFO {section} failed on {}: {e}", self.flavor));
        redis::from_redis_value(reply)
            .unwrap_or_else(|e| panic!("INFO {section} on {}: {e}", self.flavor))
    }

    /// One `field:value` line of `INFO <section>`.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        info_field(&self.info(section), field)
    }

    /// The server log, with whatever the process wrote to stdout/stderr before its log
    /// file was open (config errors go there).
    pub fn log(&self) -> String {
        let mut out = String::new();
        for path in [self.stdio_path(), self.log_path()] {
            match fs::read(&path) {
                Ok(bytes) if !bytes.is_empty() => {
                    out.push_str(&format!("--- {} ---\n", path.display()));
                    out.push_str(&String::from_utf8_lossy(&bytes));
                    if !out.ends_with('\n') {
                        out.push('\n');
                    }
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => out.push_str(&format!("--- cannot read {}: {e} ---\n", path.display())),
            }
        }
        out
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Graceful `SHUTDOWN` (it saves an RDB when `save` is configured) and a start on the
    /// same port, directory and options. Returns once PING answers.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// Graceful `SHUTDOWN`; returns once the process has exited. Panics if the server
    /// refuses (e.g. it cannot save) or does not exit.
    pub fn stop(&mut self) {
        self.shutdown(&[]);
    }

    /// `SHUTDOWN <args...>` (e.g. `&["SAVE"]`, `&["NOSAVE"]`); returns once the process
    /// has exited.
    pub fn shutdown(&mut self, args: &[&str]) {
        if self.child.is_none() {
            panic!("{} on port {} is not running", self.flavor, self.port);
        }
        let mut con = self
            .control()
            .unwrap_or_else(|e| panic!("cannot connect to {} for SHUTDOWN: {e}", self.flavor));
        // Saving a large dataset can take longer than the control read timeout.
        let _ = con.set_read_timeout(Some(SHUTDOWN_TIMEOUT));
        // On success the server closes the connection without a reply.
        let reply: redis::RedisResult<redis::Value> =
            redis::cmd("SHUTDOWN").arg(args).query(&mut con);
        match reply {
            Err(e) if e.code().is_some() => {
                panic!(
                    "SHUTDOWN {} refused by {}: {e}",
                    args.join(" "),
                    self.flavor
                )
            }
            Ok(v) => panic!(
                "SHUTDOWN {} answered {v:?} instead of exiting",
                args.join(" ")
            ),
            Err(_) => {}
        }
        if !self.wait_exit(SHUTDOWN_TIMEOUT) {
            panic!(
                "{} on port {} did not exit within {SHUTDOWN_TIMEOUT:?} of SHUTDOWN",
                self.flavor, self.port
            );
        }
    }

    /// SIGKILL, as a crash: nothing is saved beyond what is already on disk. Returns once
    /// the process is gone.
    pub fn kill9(&mut self) {
        let Some(child) = self.child.as_mut() else {
            panic!("{} on port {} is not running", self.flavor, self.port);
        };
        child
            .kill()
            .unwrap_or_else(|e| panic!("cannot SIGKILL pid {}: {e}", self.pid));
        self.reap();
    }

    /// Starts the stopped server again on the same port, directory and config file (with
    /// whatever CONFIG REWRITE put there). Returns once PING answers.
    pub fn start_again(&mut self) {
        if self.child.is_some() {
            panic!("{} on port {} is still running", self.flavor, self.port);
        }
        self.spawn();
        if let Err(e) = self.wait_ready() {
            self.fail_start(e);
        }
    }

    /// Makes this server a replica of `master` and waits until the link is up and the
    /// initial sync is done.
    pub fn replicaof(&self, master: &Server) {
        let mut con = self.client();
        let _: () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(master.port)
            .query(&mut con)
            .unwrap_or_else(|e| panic!("REPLICAOF failed on {}: {e}", self.flavor));
        wait_until(
            &format!(
                "{} replica link to master port {}",
                self.flavor, master.port
            ),
            REPLICATION_TIMEOUT,
            || {
                self.info_field("replication", "master_link_status")
                    .is_some_and(|s| s == "up")
            },
        );
        self.wait_for_sync(master);
    }

    /// Waits until this replica has processed everything `master` has replicated so far.
    /// Call it after writes to the master and before reading the replica.
    pub fn wait_for_sync(&self, master: &Server) {
        let target = repl_offset(master);
        wait_until(
            &format!(
                "{} replica to reach master_repl_offset {target} of port {}",
                self.flavor, master.port
            ),
            REPLICATION_TIMEOUT,
            || repl_offset(self) >= target,
        );
    }

    fn config_path(&self) -> PathBuf {
        self.dir.join("server.conf")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    fn stdio_path(&self) -> PathBuf {
        self.dir.join("stdio.log")
    }

    fn write_config(&self) {
        let dir = self.dir.to_string_lossy();
        let log = self.log_path();
        let mut text = String::from("# Written by the test harness (tests/harness/src/lib.rs).\n");
        text.push_str(&format!("port {}\n", self.port));
        text.push_str(&format!("dir {}\n", quote(&dir)));
        text.push_str(&format!("logfile {}\n", quote(&log.to_string_lossy())));
        text.push_str("daemonize no\n");
        let overridden = |name: &str| {
            self.options
                .config
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case(name))
        };
        for (name, value) in DEFAULT_CONFIG {
            if !overridden(name) {
                text.push_str(&format!("{name} {value}\n"));
            }
        }
        if self.options.load_module {
            let mut line = format!("loadmodule {}", quote(&module_path().to_string_lossy()));
            for arg in &self.options.module_args {
                line.push(' ');
                line.push_str(&quote(arg));
            }
            text.push_str(&line);
            text.push('\n');
        }
        for (name, value) in &self.options.config {
            let value = if value.is_empty() { "\"\"" } else { value };
            text.push_str(&format!("{name} {value}\n"));
        }
        fs::write(self.config_path(), text).unwrap_or_else(|e| {
            panic!("cannot write {}: {e}", self.config_path().display());
        });
    }

    fn spawn(&mut self) {
        let stdio = File::options()
            .create(true)
            .append(true)
            .open(self.stdio_path())
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.stdio_path().display()));
        let stderr = stdio
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot clone a file handle: {e}"));
        let mut command = match self.options.launcher.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(&self.binary);
                c
            }
            None => Command::new(&self.binary),
        };
        let child = command
            .arg(self.config_path())
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(stdio)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.binary.display()));
        self.pid = child.id();
        self.child = Some(child);
    }

    fn wait_ready(&mut self) -> Result<(), StartError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    self.pid = 0;
                    if self.log().contains("Address already in use") {
                        return Err(StartError::PortTaken);
                    }
                    return Err(StartError::Exited(status.to_string()));
                }
            }
            let last_error = match self.ping() {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(StartError::Timeout(last_error));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    fn ping(&self) -> Result<(), String> {
        let mut con = self.control().map_err(|e| e.to_string())?;
        let reply: String = redis::cmd("PING")
            .query(&mut con)
            .map_err(|e| e.to_string())?;
        if reply != "PONG" {
            return Err(format!("PING answered {reply:?}"));
        }
        // Another server may have taken the port between free_port() and our bind; it
        // would answer PING while ours is about to exit with "Address already in use".
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut con)
            .map_err(|e| e.to_string())?;
        match info_field(&info, "process_id") {
            Some(pid) if pid == self.pid.to_string() => Ok(()),
            other => Err(format!(
                "port {} is answered by process {other:?}, not {}",
                self.port, self.pid
            )),
        }
    }

    fn fail_start(&mut self, error: StartError) -> ! {
        self.kill_now();
        self.log_reported = true;
        let reason = match error {
            StartError::PortTaken => "its port stayed taken".to_string(),
            StartError::Exited(status) => format!("it exited ({status})"),
            StartError::Timeout(last) => {
                format!("it did not answer PING within {START_TIMEOUT:?} (last: {last})")
            }
        };
        panic!(
            "{} ({}) failed to start on port {}: {reason}\nconfig {}:\n{}\n{}",
            self.flavor,
            self.binary.display(),
            self.port,
            self.config_path().display(),
            fs::read_to_string(self.config_path()).unwrap_or_default(),
            self.log()
        );
    }

    fn wait_exit(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let Some(child) = self.child.as_mut() else {
                return true;
            };
            match child.try_wait() {
                Ok(Some(_)) => {
                    self.child = None;
                    self.pid = 0;
                    return true;
                }
                Ok(None) if Instant::now() < deadline => thread::sleep(POLL_INTERVAL),
                Ok(None) => return false,
                Err(e) => panic!("cannot wait for pid {}: {e}", self.pid),
            }
        }
    }

    /// Waits for a process that has been signalled or has exited.
    fn reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
        self.pid = 0;
    }

    fn kill_now(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
        }
        self.reap();
    }
}

/// How long the after-test `LEASE.DEBUG CHECK` may wait for a reply: a server that
/// pauses clients (`CLIENT PAUSE ALL`), is asleep or is gone is not checked.
const FINAL_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Replies to the after-test check that mean it cannot run there, not that anything
/// is wrong: no module or an older build without the command, a server that wants a
/// password or whose default user may not run it, one still loading or busy.
const FINAL_CHECK_SKIPS: &[&str] = &[
    "unknown command",
    "NOAUTH",
    "NOPERM",
    "WRONGPASS",
    "LOADING",
    "BUSY",
    "MASTERDOWN",
];

/// The last lines of a server log, for a failure message.
fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Server {
    /// `LEASE.DEBUG CHECK` on a server that is running and has the module: `None` when it
    /// answers `OK` or cannot be asked (see `FINAL_CHECK_SKIPS`, and a server that does
    /// not answer within `FINAL_CHECK_TIMEOUT`), else what it answered. The check is
    /// exact at every moment (`model/src/check.rs` says why each rule holds while the
    /// server runs), so it is asked once, not polled.
    fn final_check(&self) -> Option<String> {
        let client = redis::Client::open(self.url()).ok()?;
        let mut con = client
            .get_connection_with_timeout(FINAL_CHECK_TIMEOUT)
            .ok()?;
        con.set_read_timeout(Some(FINAL_CHECK_TIMEOUT)).ok()?;
        con.set_write_timeout(Some(FINAL_CHECK_TIMEOUT)).ok()?;
        let reply: redis::RedisResult<redis::Value> =
            redis::cmd("LEASE.DEBUG").arg("CHECK").query(&mut con);
        match reply {
            Ok(redis::Value::Okay) => None,
            Ok(other) => Some(format!("{other:?}")),
            Err(e) if e.is_io_error() || e.is_timeout() => None,
            Err(e) => {
                let text = reply::redis_error_text(&e);
                (!FINAL_CHECK_SKIPS.iter().any(|s| text.contains(s))).then_some(text)
            }
        }
    }
}

impl Drop for Server {
    /// Checks the module's structures (`LEASE.DEBUG CHECK`) unless the test is already
    /// failing or opted out, then stops the server (`SHUTDOWN NOSAVE`, SIGKILL after
    /// `DROP_GRACE`), and fails the test with the check's reply and the log's tail if
    /// the check found a problem, keeping the server's directory.
    fn drop(&mut self) {
        let failed_check =
            match self.child.is_some() && self.options.final_check && !thread::panicking() {
                true => self.final_check(),
                false => None,
            };
        if self.child.is_some() {
            if let Ok(mut con) = self.control() {
                let _: redis::RedisResult<redis::Value> =
                    redis::cmd("SHUTDOWN").arg("NOSAVE").query(&mut con);
            }
            if !self.wait_exit(DROP_GRACE) {
                self.kill_now();
            }
        }
        if let Some(reply) = failed_check {
            panic!(
                "LEASE.DEBUG CHECK after the test, on {} port {} (dir {} kept): {reply}\n\
                 ---- last lines of its log ----\n{}",
                self.flavor,
                self.port,
                self.dir.display(),
                tail(&self.log(), 40)
            );
        }
        if thread::panicking() && self.log_reported {
            eprintln!(
                "==== {} server on port {}: dir {} kept ====",
                self.flavor,
                self.port,
                self.dir.display()
            );
        } else if thread::panicking() {
            eprintln!(
                "==== {} server on port {} (dir {} kept) ====\n{}==== end of {} server log ====",
                self.flavor,
                self.port,
                self.dir.display(),
                self.log(),
                self.flavor
            );
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// `replica.replicaof(master)`, then waits until the master streams writes to it.
/// After a diskless full sync, Redis 7.0 holds the stream back until the replica's first
/// `REPLCONF ACK` (up to a second later), which offsets alone do not show; tests that
/// race a lease deadline must not spend that second unknowingly.
pub fn attach(replica: &Server, master: &Server) {
    replica.replicaof(master);
    let mut m = master.client();
    let mut r = replica.client();
    reply::assert_ok(
        calls::call(&mut m, "SET", ("attach:marker", "1")),
        "SET attach:marker",
    );
    wait_until(
        "the master to stream writes to the new replica",
        Duration::from_secs(5),
        || calls::exists(&mut r, "attach:marker"),
    );
    assert_eq!(calls::int(calls::call(&mut m, "DEL", "attach:marker")), 1);
    replica.wait_for_sync(master);
    assert!(!calls::exists(&mut r, "attach:marker"));
}

/// A master and a replica attached to it, streaming.
pub fn master_and_replica(flavor: Flavor) -> (Server, Server) {
    let master = Server::start(flavor);
    let replica = Server::start(flavor);
    attach(&replica, &master);
    (master, replica)
}

#[derive(Debug)]
enum StartError {
    PortTaken,
    Exited(String),
    Timeout(String),
}

/// The value of `field` in the text of an INFO reply.
pub fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name == field).then(|| value.trim().to_string())
    })
}

/// A numeric field of an INFO section.
pub fn info_number(server: &Server, section: &str, field: &str) -> u64 {
    let value = server
        .info_field(section, field)
        .unwrap_or_else(|| panic!("{} INFO {section} has no {field}", server.flavor));
    value
        .parse()
        .unwrap_or_else(|e| panic!("{} INFO {section} {field}:{value}: {e}", server.flavor))
}

/// `master_repl_offset` of `INFO replication`.
pub fn repl_offset(server: &Server) -> u64 {
    let value = server
        .info_field("replication", "master_repl_offset")
        .unwrap_or_else(|| {
            panic!(
                "{} INFO replication has no master_repl_offset",
                server.flavor
            )
        });
    value
        .parse()
        .unwrap_or_else(|e| panic!("bad master_repl_offset {value:?}: {e}"))
}

pub mod calls;
pub mod cluster;
pub mod errors;
pub mod evict;
pub mod holds;
pub mod lease;
pub mod matrix;
pub use redis_lease_model::rdb;
pub mod reply;
pub mod resp;
pub mod session;
pub mod waiter;
pub mod workload;
