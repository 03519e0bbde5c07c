//! Read/write locks over HTTP: readers share, a writer excludes everyone, readers queued
//! behind a writer go in together when it leaves, tokens increase, upgrades are refused.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Gate, wait_children, within, zookeeper};
use reqwest::StatusCode;
use serde_json::json;

async fn take(gate: &Gate, lock: &str, mode: &str, lease: &str, query: &str) -> common::Reply {
    gate.post(
        &format!("/v1/rwlocks/{lock}/{mode}?{query}"),
        Some(json!({ "lease": lease })),
    )
    .await
}

#[tokio::test]
async fn readers_share_a_writer_excludes_and_queued_readers_enter_together() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let gate = Arc::new(Gate::start(&connect).await);
    let (r1, r2, w, r3, r4) = (
        gate.lease("60s").await,
        gate.lease("60s").await,
        gate.lease("60s").await,
        gate.lease("60s").await,
        gate.lease("60s").await,
    );

    let first = take(&gate, "doc", "read", &r1, "wait=0").await;
    let second = take(&gate, "doc", "read", &r2, "wait=0").await;
    assert_eq!(
        (first.status, second.status),
        (StatusCode::OK, StatusCode::OK),
        "readers share"
    );
    take(&gate, "doc", "write", &w, "wait=0")
        .await
        .assert_problem(StatusCode::CONFLICT, None);

    // The writer queues behind the readers; readers arriving after it queue behind it.
    let writer = {
        let (gate, w) = (gate.clone(), w.clone());
        tokio::spawn(async move { take(&gate, "doc", "write", &w, "wait=30s").await })
    };
    wait_children(&connect, "/zkgate/rwlocks/doc", 3).await;
    take(&gate, "doc", "read", &r3, "wait=0")
        .await
        .assert_problem(StatusCode::CONFLICT, None);
    let late_readers: Vec<_> = [r3.clone(), r4.clone()]
        .into_iter()
        .map(|lease| {
            let gate = gate.clone();
            tokio::spawn(async move { take(&gate, "doc", "read", &lease, "wait=30s").await })
        })
        .collect();
    wait_children(&connect, "/zkgate/rwlocks/doc", 5).await;
    let state = gate.get("/v1/rwlocks/doc").await;
    assert_eq!(state.body["holders"].as_array().map(Vec::len), Some(2), "{state:?}");
    assert_eq!(state.body["waiters"].as_array().map(Vec::len), Some(3), "{state:?}");

    gate.delete(&format!("/v1/rwlocks/doc/handles/{}", first.str("handle")))
        .await;
    gate.delete(&format!("/v1/rwlocks/doc/handles/{}", second.str("handle")))
        .await;
    let written = within(Duration::from_secs(30), "the writer's grant", writer)
        .await
        .expect("writer");
    assert_eq!(written.status, StatusCode::OK, "{written:?}");
    assert!(written.i64("fencing_token") > second.i64("fencing_token"));
    let state = gate.get("/v1/rwlocks/doc").await;
    assert_eq!(
        state.body["holders"].as_array().map(Vec::len),
        Some(1),
        "the writer alone: {state:?}"
    );

    // The writer leaves: both queued readers are granted, together.
    gate.delete(&format!("/v1/rwlocks/doc/handles/{}", written.str("handle")))
        .await;
    for reader in late_readers {
        let granted = within(Duration::from_secs(30), "a queued reader's grant", reader)
            .await
            .expect("reader");
        assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
        assert!(granted.i64("fencing_token") > written.i64("fencing_token"));
    }
    let state = gate.get("/v1/rwlocks/doc").await;
    assert_eq!(
        state.body["holders"].as_array().map(Vec::len),
        Some(2),
        "both readers at once: {state:?}"
    );
}

#[tokio::test]
async fn upgrading_a_read_lock_is_refused_with_a_clear_error() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let lease = gate.lease("60s").await;
    let read = take(&gate, "cfg", "read", &lease, "wait=0").await;
    assert_eq!(read.status, StatusCode::OK);
    let upgrade = take(&gate, "cfg", "write", &lease, "wait=0").await;
    upgrade.assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(upgrade.body["type"], "urn:zkgate:problem:mode-change-refused");
    assert_eq!(upgrade.body["handle"], read.str("handle").as_str());
    // Still a reader, untouched; after releasing it the same lease may write.
    let handle = gate
        .get(&format!("/v1/rwlocks/cfg/handles/{}", read.str("handle")))
        .await;
    assert_eq!(
        (handle.body["state"].as_str(), handle.body["mode"].as_str()),
        (Some("held"), Some("read"))
    );
    gate.delete(&format!("/v1/rwlocks/cfg/handles/{}", read.str("handle")))
        .await;
    let write = take(&gate, "cfg", "write", &lease, "wait=0").await;
    assert_eq!(write.status, StatusCode::OK, "{write:?}");
    assert_eq!(write.body["mode"], "write");
}

#[derive(Default)]
struct Inside {
    readers: usize,
    writer: bool,
    most_readers: usize,
    violations: Vec<String>,
    /// (token, is_writer) in grant order.
    grants: Vec<(i64, bool)>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_clients_mixing_reads_and_writes_never_see_a_writer_with_anyone() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let inside = Arc::new(Mutex::new(Inside::default()));
    let mut tasks = Vec::new();
    for client in 0..10usize {
        let (gate, inside) = (gate.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let lease = gate.lease("60s").await;
            // Twenty rounds each, and on until readers have been seen together (a count, not a
            // length: a busy machine may serialise the first rounds).
            for round in 0..200usize {
                if round >= 20 && inside.lock().unwrap().most_readers >= 2 {
                    break;
                }
                let write = (client + round) % 4 == 0;
                let reply = take(&gate, "mixed", if write { "write" } else { "read" }, &lease, "wait=30s").await;
                assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
                {
                    let mut now = inside.lock().unwrap();
                    if now.writer || (write && now.readers > 0) {
                        let seen = format!(
                            "client {client} ({}) entered with readers={} writer={}",
                            if write { "w" } else { "r" },
                            now.readers,
                            now.writer
                        );
                        now.violations.push(seen);
                    }
                    if write {
                        now.writer = true
                    } else {
                        now.readers += 1
                    }
                    now.most_readers = now.most_readers.max(now.readers);
                    now.grants.push((reply.i64("fencing_token"), write));
                }
                // Stay inside a little so that readers get the chance to overlap.
                for _ in 0..20 {
                    tokio::task::yield_now().await;
                }
                {
                    let mut now = inside.lock().unwrap();
                    if write { now.writer = false } else { now.readers -= 1 }
                }
                gate.delete(&format!("/v1/rwlocks/mixed/handles/{}", reply.str("handle")))
                    .await;
            }
        }));
    }
    for task in tasks {
        within(Duration::from_secs(240), "all clients", task)
            .await
            .expect("client");
    }
    let inside = std::mem::take(&mut *inside.lock().unwrap());
    assert!(inside.violations.is_empty(), "{:?}", inside.violations);
    assert!(inside.most_readers >= 2, "readers never overlapped in 200 rounds each");
    // Every grant's token is above the last writer's before it; writers' tokens rise strictly.
    let mut last_writer = i64::MIN;
    for (token, write) in inside.grants {
        assert!(token > last_writer, "token {token} after writer token {last_writer}");
        if write {
            last_writer = token;
        }
    }
}
