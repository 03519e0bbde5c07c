//! `zkgate queue put` and `zkgate queue work`, the real binary against real zkgate processes:
//! a thousand items put from a file are each handled by workers of which one is killed -9
//! while an instance restarts, none lost, each delivery handled once (the redelivered ones
//! counted), and an item whose command fails is dead-lettered after the queue's limit.
//!
//! The commands report on the workers' stdout, which the test reads: it waits for reports,
//! never for time.

use crate::common;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use common::process::{self, Process};
use common::{within, zookeeper};
use reqwest::Method;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;
use tokio::sync::mpsc;

/// `zkgate <args> --url <url>... [-- <command>...]`, with stdin from `stdin`.
fn zkgate(args: &[&str], urls: &[&str], command: &[&str], stdin: Stdio) -> Child {
    process::client(args, urls, command)
        .stdin(stdin)
        .spawn()
        .expect("run zkgate")
}

/// Sends each line of `child`'s stdout to `lines`, tagged with `who`.
fn forward(child: &mut Child, who: &'static str, lines: mpsc::UnboundedSender<(&'static str, String)>) {
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = stdout.next_line().await {
            let _ = lines.send((who, line));
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_items_put_from_a_file_are_each_handled_through_a_killed_worker_and_a_restarted_instance() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let flags = ["--session-timeout", "2s"];
    let first = Process::start_with(&connect, &flags).await;
    let mut second = Process::start_with(&connect, &flags).await;
    let (u1, u2) = (first.url.clone(), second.url.clone());

    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("items");
    std::fs::write(&file, (1..=1000).map(|n| format!("{n}\n")).collect::<String>()).expect("write the items");
    let put = zkgate(
        &["queue", "put", "jobs"],
        &[&u1, &u2],
        &[],
        std::fs::File::open(&file).expect("open").into(),
    );
    let put = within(Duration::from_secs(120), "the put", put.wait_with_output())
        .await
        .expect("put");
    assert!(put.status.success(), "{}", String::from_utf8_lossy(&put.stderr));
    let (_, state) = first.call(Method::GET, "/v1/queues/jobs", None).await;
    assert_eq!(state["depth"], 1000, "{state}");

    // Two workers of four; each command reports its item and its delivery. The doomed
    // worker's commands then work on (simulated work) until it is killed: it holds four items.
    let report = ["sh", "-c", r#"read n; echo "$n $ZKGATE_DELIVERIES""#];
    let stuck = [
        "sh",
        "-c",
        r#"read n; echo "$n $ZKGATE_DELIVERIES $ZKGATE_CLAIM"; exec sleep 600"#,
    ];
    let work = ["queue", "work", "jobs", "-j", "4", "--ack-deadline", "3s"];
    let (lines, mut reports) = mpsc::unbounded_channel();
    let mut doomed = zkgate(&work, &[&u1, &u2], &stuck, Stdio::null());
    let mut steady = zkgate(&work, &[&u2, &u1], &report, Stdio::null());
    let lines_for_watch = lines.clone();
    forward(&mut doomed, "doomed", lines.clone());
    forward(&mut steady, "steady", lines);

    // The queue's events, through the instance that stays up: done once every item was handled
    // and the queue holds nothing, waiting or in flight (the killed worker's claims lapse, and
    // their items are handled again).
    let mut watch = zkgate(&["watch", "queue", "jobs"], &[&u1], &[], Stdio::null());
    forward(&mut watch, "watch", lines_for_watch);

    // Item → the deliveries its command ran for, and who ran them.
    let mut handled: BTreeMap<u64, Vec<(u64, &str)>> = BTreeMap::new();
    let mut emptied = false;
    let (mut held, mut claims): (Vec<u64>, Vec<String>) = (Vec::new(), Vec::new());
    let mut killed = false;
    while handled.len() < 1000 || !emptied {
        let (who, line) = within(Duration::from_secs(60), "the next report", reports.recv())
            .await
            .expect("the workers report");
        if who == "watch" {
            let state = &serde_json::from_str::<Value>(&line).expect("an event")["state"];
            emptied = state["depth"] == 0 && state["in_flight"] == 0;
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let number = |at: usize| words[at].parse::<u64>().unwrap_or_else(|_| panic!("a report: {line}"));
        let (item, delivery) = (number(0), number(1));
        handled.entry(item).or_default().push((delivery, who));
        if who == "doomed" {
            held.push(item);
            claims.push(words[2].to_string());
        }
        if held.len() == 4 && !killed {
            // The doomed worker holds four items. For two of their ack deadlines its extensions
            // keep them from the other worker... (The wait is the span under test, time for
            // the deadlines to pass unextended, not a synchronisation: no event says "a
            // deadline did not pass".)
            tokio::time::sleep(Duration::from_secs(7)).await;
            for claim in &claims {
                let extend = format!("/v1/queues/jobs/claims/{claim}/extend");
                let (status, answer) = first
                    .call(Method::POST, &extend, Some(serde_json::json!({"ack_deadline": "3s"})))
                    .await;
                assert_eq!(status, reqwest::StatusCode::OK, "claim {claim} still held: {answer}");
            }
            // ...then it dies with them in hand, and the instance the other worker uses first
            // crashes and comes back.
            doomed.start_kill().expect("kill -9");
            killed = true;
            second.restart(&connect, &flags).await;
        }
    }
    assert_eq!(
        handled.keys().copied().collect::<Vec<_>>(),
        (1..=1000).collect::<Vec<_>>(),
        "every item handled"
    );
    // At least once, and never the same delivery twice: an item handled again was delivered
    // again (its claim lapsed with the killed worker, or with the restarted instance).
    for (item, deliveries) in &handled {
        let mut numbers: Vec<u64> = deliveries.iter().map(|(delivery, _)| *delivery).collect();
        numbers.sort();
        numbers.dedup();
        assert_eq!(
            numbers.len(),
            deliveries.len(),
            "item {item}: a delivery handled twice: {deliveries:?}"
        );
    }
    // The killed worker's four, kept while it lived, came to the other worker after.
    for item in &held {
        assert_eq!(handled[item], [(1, "doomed"), (2, "steady")], "item {item}");
    }
    let again = handled.values().filter(|deliveries| deliveries.len() > 1).count();
    eprintln!("handled more than once: {again} of 1000 (4 held by the killed worker)");

    // The steady worker stops on SIGTERM after settling what it holds: nothing is left.
    let pid = steady.id().expect("runs") as libc::pid_t;
    // SAFETY: kill(2) on our own child, not yet reaped.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let stopped = within(Duration::from_secs(60), "the worker to stop", steady.wait())
        .await
        .expect("wait");
    assert_eq!(stopped.code(), Some(0));
    let (_, state) = first.call(Method::GET, "/v1/queues/jobs", None).await;
    assert_eq!(
        (
            state["depth"].as_u64(),
            state["in_flight"].as_u64(),
            state["dead_letters"].as_u64()
        ),
        (Some(0), Some(0), Some(0)),
        "{state}"
    );
}

#[tokio::test]
async fn an_item_whose_command_fails_is_delivered_again_then_dead_lettered_at_the_limit() {
    let zk = zookeeper().await;
    let gate = Process::start_with(&zk.connect_string(), &["--queue-max-deliveries", "3"]).await;
    let url = gate.url.as_str();
    let mut put = zkgate(&["queue", "put", "doomed", "poison"], &[url], &[], Stdio::null());
    assert!(
        within(Duration::from_secs(30), "the put", put.wait())
            .await
            .expect("put")
            .success()
    );
    // The queue's events, read until its dead letters hold the item.
    let mut watch = zkgate(&["watch", "queue", "doomed"], &[url], &[], Stdio::null());
    let mut events = BufReader::new(watch.stdout.take().expect("stdout")).lines();
    let worker = zkgate(
        &["queue", "work", "doomed"],
        &[url],
        &["sh", "-c", "cat > /dev/null; exit 1"],
        Stdio::null(),
    );
    within(Duration::from_secs(60), "the item in the dead letters", async {
        while let Some(line) = events.next_line().await.expect("read the events") {
            let event: Value = serde_json::from_str(&line).expect("an event");
            if event["state"]["dead_letters"] == 1 {
                return;
            }
        }
        panic!("the watch ended");
    })
    .await;
    let pid = worker.id().expect("runs") as libc::pid_t;
    // SAFETY: kill(2) on our own child, not yet reaped.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let output = within(Duration::from_secs(30), "the worker to stop", worker.wait_with_output())
        .await
        .expect("output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr.matches("the command exited 1; given back").count(),
        3,
        "{stderr}"
    );
    let (_, dead) = gate.call(Method::GET, "/v1/queues/doomed/dead-letters", None).await;
    assert_eq!(dead.as_array().map(Vec::len), Some(1), "{dead}");
    assert_eq!(
        (dead[0]["text"].as_str(), dead[0]["deliveries"].as_u64()),
        (Some("poison"), Some(3)),
        "{dead}"
    );
    let (_, state) = gate.call(Method::GET, "/v1/queues/doomed", None).await;
    assert_eq!(
        (state["depth"].as_u64(), state["in_flight"].as_u64()),
        (Some(0), Some(0)),
        "{state}"
    );
}
