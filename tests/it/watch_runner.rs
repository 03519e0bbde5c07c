//! `zkgate watch`, the real binary against real zkgate processes and ZooKeeper: its command
//! runs for every change of a key, in order, and through a `kill -9` of the instance it follows
//! it resumes through another with no change missed or run twice, a gap being a `resync` the
//! command is told of; without a command it prints the events; it says why it cannot start.
//!
//! The commands report on their stdout (the watcher's), so the test waits for each report,
//! never for time.

use crate::common;

use std::time::Duration;

use common::process::{self, Process};
use common::{within, zookeeper};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

/// A `zkgate watch` process and its stdout's lines.
struct Watcher {
    child: Child,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Watcher {
    /// `zkgate watch <args> --url <url>...` (then `-- <command>...` if given).
    fn start(args: &[&str], urls: &[&str], command: &[&str]) -> Watcher {
        let mut child = process::client(&[&["watch"], args].concat(), urls, command)
            .spawn()
            .expect("start the watcher");
        let stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Watcher { child, stdout }
    }

    /// The next line on its stdout.
    async fn line(&mut self) -> String {
        within(
            Duration::from_secs(30),
            "the watcher's next line",
            self.stdout.next_line(),
        )
        .await
        .expect("read the watcher's output")
        .expect("the watcher's output ended")
    }

    /// SIGTERM, then its exit code and what it said on stderr.
    async fn stop(self) -> (i32, String) {
        let pid = self.child.id().expect("the watcher runs") as libc::pid_t;
        // SAFETY: kill(2) on our own child's pid, not yet reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        self.exit().await
    }

    /// Its exit code, once it exits by itself, and what it said on stderr.
    async fn exit(mut self) -> (i32, String) {
        let status = within(Duration::from_secs(30), "the watcher to exit", self.child.wait())
            .await
            .expect("wait for the watcher");
        let mut stderr = String::new();
        let mut pipe = self.child.stderr.take().expect("stderr");
        pipe.read_to_string(&mut stderr).await.expect("read stderr");
        (status.code().expect("exited, not killed"), stderr)
    }
}

/// A command's report: `<ZKGATE_EVENT_TYPE> <the event from stdin>`, as (type, the key's value
/// in the event's state, the event).
fn report(line: &str) -> (String, Option<u64>, Value) {
    let (kind, event) = line.split_once(' ').unwrap_or_else(|| panic!("a report: {line:?}"));
    let event: Value = serde_json::from_str(event).unwrap_or_else(|_| panic!("an event: {line:?}"));
    assert_eq!(
        event["type"], kind,
        "the type in the environment is the event's: {line}"
    );
    let value = event["state"]["data"]
        .as_str()
        .map(|data| data.parse().expect("a number"));
    (kind.to_string(), value, event)
}

#[tokio::test]
async fn the_command_runs_for_every_change_in_order_and_resumes_through_another_instance_after_a_kill_9() {
    let zk = zookeeper().await;
    let mut first = Process::start(&zk.connect_string()).await;
    let second = Process::start(&zk.connect_string()).await;
    let command = ["sh", "-c", r#"read event; echo "$ZKGATE_EVENT_TYPE $event""#];
    let mut watcher = Watcher::start(&["kv", "app/config"], &[&first.url, &second.url], &command);
    let (kind, value, _) = report(&watcher.line().await);
    assert_eq!(
        (kind.as_str(), value),
        ("state", None),
        "first the key's state: none yet"
    );

    // Written 200 times, each once the command has reported the one before (a change that
    // came faster could be one event of ZooKeeper's); the instance followed dies half way.
    let mut seen = Vec::new();
    for written in 1..=200u64 {
        if written == 101 {
            first.kill().await;
        }
        let (status, answer) = second
            .call(Method::PUT, "/v1/kv/app/config", Some(json!(written)))
            .await;
        assert!(status.is_success(), "{status} {answer}");
        loop {
            let (kind, value, event) = report(&watcher.line().await);
            let reached = value >= Some(written);
            seen.push((kind, value, event));
            if reached {
                break;
            }
        }
    }

    // No change ran twice, and they ran in order.
    let is_change = |kind: &str| kind == "created" || kind == "changed";
    let changes: Vec<u64> = (seen.iter())
        .filter(|(kind, ..)| is_change(kind))
        .map(|(_, value, _)| value.expect("a value"))
        .collect();
    assert!(changes.windows(2).all(|pair| pair[0] < pair[1]), "{changes:?}");
    // The instance the watch followed is gone, and the other cannot replay its events: the
    // watch went on through a resync, which says why.
    let resyncs = seen.iter().filter(|(kind, ..)| kind == "resync").count();
    assert!(resyncs >= 1, "the other instance resumed with a resync");
    for (_, _, event) in seen.iter().filter(|(kind, ..)| kind == "resync") {
        assert!(event["reason"].is_string(), "a resync says why: {event}");
    }
    // No change was missed but where the command was told of the gap: a resync after the
    // change before it, whose state has that value or a later one.
    for written in 1..=200 {
        if changes.contains(&written) {
            continue;
        }
        let before = (seen.iter()).rposition(|(kind, value, _)| is_change(kind) && *value < Some(written));
        let told = seen.iter().enumerate().any(|(at, (kind, value, _))| {
            kind == "resync" && *value >= Some(written) && before.is_none_or(|before| at > before)
        });
        assert!(
            told,
            "change {written} was missed and no resync told of it: {changes:?}"
        );
    }
    let (code, stderr) = watcher.stop().await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("resuming"), "it said it resumed: {stderr}");
    assert!(stderr.contains(&format!("again through {}", second.url)), "{stderr}");
}

#[tokio::test]
async fn without_a_command_each_event_is_a_json_line_and_a_watch_that_cannot_start_says_why() {
    let zk = zookeeper().await;
    let gate = Process::start(&zk.connect_string()).await;
    let mut watcher = Watcher::start(&["counter", "hits"], &[&gate.url], &[]);
    let state: Value = serde_json::from_str(&watcher.line().await).expect("a JSON line");
    assert_eq!(
        (state["type"].as_str(), state["topic"].as_str()),
        (Some("state"), Some("counter:hits"))
    );
    let (status, _) = gate
        .call(Method::POST, "/v1/counters/hits/add", Some(json!({"delta": 5})))
        .await;
    assert_eq!(status, StatusCode::OK);
    let added: Value = serde_json::from_str(&watcher.line().await).expect("a JSON line");
    assert_eq!(added["state"]["value"], 5, "{added}");
    let (code, stderr) = watcher.stop().await;
    assert_eq!((code, stderr.as_str()), (0, ""));

    // Nothing answers; a topic zkgate does not know: exit 125, saying why in one line.
    let nowhere = Watcher::start(&["lock", "orders"], &["http://127.0.0.1:1"], &[]);
    let unknown = Watcher::start(&["nosuch", "x"], &[&gate.url], &[]);
    for (watcher, says) in [(nowhere, "cannot reach zkgate"), (unknown, "unknown topic `nosuch`")] {
        let (code, stderr) = watcher.exit().await;
        assert_eq!(code, 125, "{stderr}");
        assert!(stderr.contains(says) && stderr.lines().count() == 1, "{stderr}");
    }
}
