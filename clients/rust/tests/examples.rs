//! The README's quick start is `examples/quick_start.rs`, word for word, and it runs
//! against a server, closes its client and exits (a task left behind would keep the
//! process alive past the timeout).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::Server;

/// The example's binary, built once per test run (`cargo build --example`: `cargo test`
/// builds examples only to check that they compile).
fn example(name: &'static str) -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-q", "-p", "redis-lease-client", "--example", name])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo build --example");
        assert!(status.success(), "cargo build --example {name}: {status}");
        // target/<profile>/deps/<this test> -> target/debug/examples/<name>
        let exe = std::env::current_exe().expect("test binary");
        let target = exe.ancestors().nth(3).expect("target dir");
        target.join("debug").join("examples").join(name)
    })
}

#[test]
fn readme_quick_start_is_the_example() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let code = std::fs::read_to_string(root.join("examples/quick_start.rs")).unwrap();
    assert!(
        readme.contains(&format!("```rust\n{code}```\n")),
        "README.md's quick start differs from examples/quick_start.rs"
    );
}

for_each_server!(quick_start_runs_and_exits, |flavor| {
    let server = Server::start(flavor);
    let binary = tokio::task::spawn_blocking(|| example("quick_start"))
        .await
        .unwrap();
    assert!(binary.is_file(), "{} not built", binary.display());
    let mut child = Command::new(binary)
        .env("REDIS_URL", server.url())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the quick start did not exit within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(status.success(), "{status}: {stdout}");
    assert!(stdout.contains("wrote total 42"), "{stdout}");
    assert!(stdout.contains("job done with fence"), "{stdout}");
    assert!(stdout.contains("exported"), "{stdout}");
    let mut admin = server.admin().await;
    let total: String = redis::cmd("HGET")
        .arg("report")
        .arg("total")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(total, "42");
});
