//! Semaphores over HTTP: never more holders than permits under contention, a holder's lease
//! expiry frees its permit for a waiter, and a disagreeing permit count is refused.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Gate, within, zookeeper};
use reqwest::StatusCode;
use serde_json::json;

#[derive(Default)]
struct Inside {
    now: usize,
    most: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_clients_never_hold_more_than_three_permits() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let inside = Arc::new(Mutex::new(Inside::default()));
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let (gate, inside) = (gate.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let lease = gate.lease("60s").await;
            // Ten rounds each, and on until holders have been seen together (a count, not a
            // length: a busy machine may serialise the first rounds).
            for round in 0..100 {
                if round >= 10 && inside.lock().unwrap().most >= 2 {
                    break;
                }
                let reply = gate
                    .post(
                        "/v1/semaphores/pool/acquire?permits=3&wait=30s",
                        Some(json!({"lease": lease})),
                    )
                    .await;
                assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
                {
                    let mut i = inside.lock().unwrap();
                    i.now += 1;
                    i.most = i.most.max(i.now);
                }
                // Simulated work, long enough against an acquire's round trips for holders to
                // overlap (it synchronises nothing).
                tokio::time::sleep(Duration::from_millis(15)).await;
                inside.lock().unwrap().now -= 1;
                let released = gate
                    .delete(&format!("/v1/semaphores/pool/permits/{}", reply.str("handle")))
                    .await;
                assert_eq!(released.status, StatusCode::NO_CONTENT);
            }
        }));
    }
    for task in tasks {
        within(Duration::from_secs(240), "all clients", task)
            .await
            .expect("client");
    }
    let most = inside.lock().unwrap().most;
    assert!(most <= 3, "{most} holders at once");
    assert!(most >= 2, "permits were never held together in 100 rounds each");
    let state = gate.get("/v1/semaphores/pool").await;
    assert_eq!(
        (state.body["permits"].as_u64(), state.body["holders"].clone()),
        (Some(3), json!([])),
        "{state:?}"
    );
}

#[tokio::test]
async fn three_permits_are_three_and_an_expired_holder_gives_its_permit_back() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let mut held = Vec::new();
    for ttl in ["60s", "60s", "1s"] {
        let reply = gate
            .post(
                "/v1/semaphores/slots/acquire?permits=3&wait=0",
                Some(json!({"ttl": ttl})),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        held.push(reply);
    }
    let fourth = gate.post("/v1/semaphores/slots/acquire?permits=3&wait=0", None).await;
    fourth.assert_problem(StatusCode::CONFLICT, None);
    let state = gate.get("/v1/semaphores/slots").await;
    assert_eq!(state.body["holders"].as_array().map(Vec::len), Some(3), "{state:?}");

    // The third holder's lease runs out: a waiter gets its permit.
    let waiter = gate.post("/v1/semaphores/slots/acquire?permits=3&wait=20s", None).await;
    assert_eq!(waiter.status, StatusCode::OK, "{waiter:?}");
    let gone = gate
        .get(&format!(
            "/v1/leases/{}",
            held[2].body["lease"]["id"].as_str().expect("lease")
        ))
        .await;
    assert_eq!(gone.body["reason"], "expired");

    let mismatch = gate.post("/v1/semaphores/slots/acquire?permits=5&wait=0", None).await;
    mismatch.assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(
        (mismatch.body["type"].as_str(), mismatch.body["permits"].as_u64()),
        (Some("urn:zkgate:problem:permits-mismatch"), Some(3))
    );
}

#[tokio::test]
async fn a_waiters_long_poll_on_its_permit_answers_with_the_grant_and_its_fencing_token() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let held = gate.post("/v1/semaphores/one/acquire?permits=1&wait=0", None).await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    let held_token = held.i64("fencing_token");
    let queued = gate
        .post("/v1/semaphores/one/acquire?permits=1&wait=0&keep_queued=true", None)
        .await;
    assert_eq!(queued.status, StatusCode::ACCEPTED, "{queued:?}");
    assert_eq!(
        queued.body["fencing_token"],
        serde_json::Value::Null,
        "no token while it waits"
    );
    let permit = format!("/v1/semaphores/one/permits/{}", queued.str("handle"));
    // Read at once, the waiter waits; with `wait`, its read answers when the permit comes.
    let now = gate.get(&permit).await;
    assert_eq!(now.body["state"], "waiting", "{now:?}");
    let news = {
        let (gate, permit) = (gate.clone(), permit.clone());
        tokio::spawn(async move { gate.get(&format!("{permit}?wait=20s")).await })
    };
    let released = gate
        .delete(&format!("/v1/semaphores/one/permits/{}", held.str("handle")))
        .await;
    assert_eq!(released.status, StatusCode::NO_CONTENT, "{released:?}");
    let news = within(Duration::from_secs(20), "the waiter's news", news)
        .await
        .expect("news");
    assert_eq!(
        (news.body["state"].as_str(), news.body["acquired"].as_bool()),
        (Some("held"), Some(true)),
        "{news:?}"
    );
    assert!(news.i64("fencing_token") > held_token, "{news:?} after {held_token}");
}
