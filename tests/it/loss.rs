//! Loss is said as loss: a holding that ended because its lease expired or its node was deleted
//! by someone else answers `lost` with the reason on every channel (the handle's long poll, the
//! handle read afterwards as 410 `lock-lost`, the lock's topic over SSE), while a lease its
//! owner deleted reads as `released`.

use crate::common;

use std::time::Duration;

use common::sse::Sse;
use common::{Gate, within, zk_client, zookeeper};
use reqwest::StatusCode;
use serde_json::Value;

/// Long-polls `handle` of lock `name` until it ends; its view.
async fn handle_end(gate: &Gate, name: &str, handle: &str) -> Value {
    within(Duration::from_secs(20), "the handle to end", async {
        loop {
            let view = gate.get(&format!("/v1/locks/{name}/handles/{handle}?wait=5s")).await;
            assert_eq!(view.status, StatusCode::OK, "{view:?}");
            if view.str("state") != "held" {
                return view.body;
            }
        }
    })
    .await
}

#[tokio::test]
async fn a_lease_that_expires_loses_its_lock_and_says_so_everywhere() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let mut topic = Sse::open(&gate.http, &format!("{}/v1/locks/orders/events", gate.url), None).await;
    topic.next().await;
    // A short lease nobody keeps alive.
    let lease = gate.lease("1s").await;
    let held = gate.acquire("orders", &lease, "wait=0").await;
    assert_eq!(held.status, StatusCode::OK);
    let handle = held.str("handle");

    let end = handle_end(&gate, "orders", &handle).await;
    assert_eq!(end["state"], "lost", "{end}");
    assert!(end["reason"].as_str().unwrap_or_default().contains("expired"), "{end}");

    let mut seen = Vec::new();
    let lost = topic.until("lock:orders", &mut seen, |e| e["type"] != "granted").await;
    assert_eq!(lost["type"], "lost", "the topic says lost, not released: {lost}");

    // Asked later, the handle is not "not found": it was lost, and why.
    for reply in [
        gate.get(&format!("/v1/locks/orders/handles/{handle}")).await,
        gate.delete(&format!("/v1/locks/orders/handles/{handle}")).await,
    ] {
        reply.assert_problem(StatusCode::GONE, None);
        assert_eq!(reply.str("type"), "urn:zkgate:problem:lock-lost", "{reply:?}");
        assert!(reply.str("reason").contains("expired"), "{reply:?}");
    }
    // The lease too: deleting it is not "done", it expired.
    let deleted = gate.delete(&format!("/v1/leases/{lease}")).await;
    deleted.assert_problem(StatusCode::GONE, None);
    assert!(deleted.str("detail").contains("expired"), "{deleted:?}");
    // A handle that never existed is still 404.
    let never = format!("{}-0123456789abcdef0123456789abcdef", &lease[..8]);
    let unknown = gate.get(&format!("/v1/locks/orders/handles/{never}")).await;
    unknown.assert_problem(StatusCode::NOT_FOUND, None);
}

#[tokio::test]
async fn a_node_deleted_by_someone_else_is_a_loss_and_a_deleted_lease_a_release() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let lease = gate.lease("30s").await;
    let held = gate.acquire("orders", &lease, "wait=0").await;
    assert_eq!(held.status, StatusCode::OK);
    let handle = held.str("handle");
    let node = gate
        .get(&format!("/v1/locks/orders/handles/{handle}"))
        .await
        .str("node");
    // An operator removes the holder's node by hand.
    let client = zk_client(&zk.connect_string()).await;
    client
        .delete(&format!("/zkgate/locks/orders/{node}"), None)
        .await
        .expect("delete the node");
    let end = handle_end(&gate, "orders", &handle).await;
    assert_eq!(end["state"], "lost", "{end}");
    assert!(end["reason"].as_str().is_some_and(|r| !r.is_empty()), "{end}");
    // Its lease lives on: the handle stays readable, lost, until the lease ends or it is
    // released (410 `lock-lost` then).
    let later = gate.get(&format!("/v1/locks/orders/handles/{handle}")).await;
    assert_eq!((later.status, later.str("state")), (StatusCode::OK, "lost".to_string()));
    let released = gate.delete(&format!("/v1/locks/orders/handles/{handle}")).await;
    released.assert_problem(StatusCode::GONE, None);
    let after = gate.get(&format!("/v1/locks/orders/handles/{handle}")).await;
    after.assert_problem(StatusCode::GONE, None);
    assert_eq!(after.str("reason"), end["reason"].as_str().unwrap());

    // The owner deletes its lease: that is giving the lock back, on the topic as on the handle.
    let mut topic = Sse::open(&gate.http, &format!("{}/v1/locks/orders/events", gate.url), None).await;
    topic.next().await;
    let lease = gate.lease("30s").await;
    let held = gate.acquire("orders", &lease, "wait=5s").await;
    assert_eq!(held.status, StatusCode::OK);
    let handle = held.str("handle");
    let mut seen = Vec::new();
    topic.until("lock:orders", &mut seen, |e| e["type"] == "granted").await;
    let deleted = gate.delete(&format!("/v1/leases/{lease}")).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let end = topic.until("lock:orders", &mut seen, |e| e["type"] != "waiters").await;
    assert_eq!(end["type"], "released", "{end}");
    let later = gate.get(&format!("/v1/locks/orders/handles/{handle}")).await;
    later.assert_problem(StatusCode::NOT_FOUND, None);
}
