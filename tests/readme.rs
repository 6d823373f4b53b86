//! The README's `redis-cli` sessions run as shown, on each real server: every block
//! whose first line is a `127.0.0.1:6379>` prompt, in the README's order on one server,
//! each command through `redis-cli --no-raw` (which prints replies as the interactive
//! prompt does), each reply compared with the README's line by line.
//!
//! What a reader cannot reproduce is let differ: a fence (an integer of 13 digits or
//! more) is bound to the one the server gave at its first appearance, must then be the
//! same wherever the README repeats it, and is put in place of the README's in later
//! commands; a `ttl` in `LEASE.INFO` may be any count of milliseconds left; the
//! `(0.50s)` timing line the interactive prompt adds after a slow command is skipped.
//! Everything else must match exactly.

#[macro_use]
extern crate harness;

use std::collections::BTreeMap;
use std::fs;
use std::process::Command;

use harness::Server;

const PROMPT: &str = "127.0.0.1:6379> ";

/// One command of a session and the reply lines the README shows for it.
struct Step {
    line: usize,
    command: String,
    reply: Vec<String>,
}

/// Every prompt-led block of the README, as steps in order.
fn sessions(readme: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut in_block = false;
    let mut in_session = false;
    for (n, line) in readme.lines().enumerate() {
        if line.starts_with("```") {
            in_block = !in_block;
            in_session = false;
            continue;
        }
        if !in_block {
            continue;
        }
        if let Some(command) = line.strip_prefix(PROMPT) {
            in_session = true;
            steps.push(Step {
                line: n + 1,
                command: command.to_string(),
                reply: Vec::new(),
            });
        } else if in_session {
            steps
                .last_mut()
                .expect("a step")
                .reply
                .push(line.to_string());
        }
    }
    steps
}

fn is_fence(word: &str) -> bool {
    word.len() >= 13 && word.bytes().all(|b| b.is_ascii_digit())
}

fn is_timing(line: &str) -> bool {
    line.strip_prefix('(')
        .and_then(|l| l.strip_suffix("s)"))
        .is_some_and(|t| t.parse::<f64>().is_ok())
}

/// Whether `got` reads as `shown`, binding the README's fences to the server's.
fn same(shown: &str, got: &str, after_ttl: bool, fences: &mut BTreeMap<String, String>) -> bool {
    let (a, b): (Vec<&str>, Vec<&str>) = (shown.split(' ').collect(), got.split(' ').collect());
    if a.len() != b.len() {
        return false;
    }
    for (x, y) in a.iter().zip(&b) {
        if x == y && !is_fence(x) {
            continue;
        }
        if is_fence(x) && is_fence(y) {
            match fences.get(*x) {
                Some(bound) if bound != y => return false,
                Some(_) => {}
                None => {
                    fences.insert(x.to_string(), y.to_string());
                }
            }
            continue;
        }
        if after_ttl && x.parse::<i64>().is_ok() && y.parse::<i64>().is_ok_and(|t| t >= 0) {
            continue;
        }
        return false;
    }
    true
}

for_each_server!(readme_sessions_run_as_shown, |flavor| {
    let readme = fs::read_to_string(harness::repo_dir().join("README.md")).expect("README.md");
    let steps = sessions(&readme);
    assert!(
        steps.len() >= 10,
        "the README's redis-cli sessions: {} commands found",
        steps.len()
    );
    let server = Server::start(flavor);
    let mut fences: BTreeMap<String, String> = BTreeMap::new();
    for step in &steps {
        let args: Vec<String> = step
            .command
            .split_whitespace()
            .map(|w| fences.get(w).cloned().unwrap_or_else(|| w.to_string()))
            .collect();
        let out = Command::new("redis-cli")
            .args(["-p", &server.port.to_string(), "--no-raw"])
            .args(&args)
            .output()
            .unwrap_or_else(|e| panic!("redis-cli: {e}"));
        assert!(
            out.status.success(),
            "README.md:{}: redis-cli failed: {out:?}",
            step.line
        );
        let got = String::from_utf8_lossy(&out.stdout);
        let got: Vec<&str> = got.lines().collect();
        let shown: Vec<&str> = step
            .reply
            .iter()
            .map(String::as_str)
            .filter(|l| !is_timing(l))
            .collect();
        let mut matched = got.len() == shown.len();
        for (k, (a, b)) in shown.iter().zip(&got).enumerate() {
            let after_ttl = k > 0 && shown[k - 1].ends_with("\"ttl\"");
            matched &= same(a, b, after_ttl, &mut fences);
        }
        assert!(
            matched,
            "README.md:{}: `{}` answered\n{}\nwhere the README shows\n{}",
            step.line,
            step.command,
            got.join("\n"),
            shown.join("\n")
        );
    }
});

#[test]
fn the_reader_lets_only_fences_and_ttls_differ() {
    let mut fences = BTreeMap::new();
    assert!(same(
        "2) (integer) 1839251830372160",
        "2) (integer) 1839251999999999",
        false,
        &mut fences
    ));
    assert!(!same(
        "2) (integer) 1839251830372160",
        "2) (integer) 1839251000000000",
        false,
        &mut fences
    ));
    assert!(same(
        "(error) STALE fencing token 1839251830372160 is older than 1",
        "(error) STALE fencing token 1839251999999999 is older than 1",
        false,
        &mut fences
    ));
    assert!(!same("(integer) 1", "(integer) 0", false, &mut fences));
    assert!(same(
        " 4) (integer) 29874",
        " 4) (integer) 29999",
        true,
        &mut fences
    ));
    assert!(!same(
        " 4) (integer) 29874",
        " 4) (integer) 29999",
        false,
        &mut fences
    ));
    assert!(!same(
        "1) \"worker-a\"",
        "1) \"worker-b\"",
        false,
        &mut fences
    ));
    assert!(is_timing("(1.00s)") && !is_timing("(nil)"));
    let steps =
        sessions("```\n127.0.0.1:6379> PING\nPONG\n(0.60s)\n```\n\n```sh\nnot a session\n```\n");
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].reply, ["PONG", "(0.60s)"]);
}
