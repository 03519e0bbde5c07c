//! The classic failure on real processes: a holder frozen (SIGSTOP) past its lease's TTL cannot
//! write over the next holder (a lock, a leadership), nor during its lease's lock-delay.

use super::*;
use crate::common;
use common::sse::Sse;
use common::{Gate, zookeeper};
use serde_json::json;
use std::time::Duration;

/// What a frozen holder holds, for [a_holder_frozen_past_its_ttl_cannot_write_over_the_next]:
/// where it is taken (`POST`, with a lease), the guard it writes under, the znode its
/// contenders' nodes are under, and the field of the answer that orders holders (the fencing
/// token a `guard-lost` names).
struct Contended {
    take: &'static str,
    guard: &'static str,
    dir: &'static str,
    token: &'static str,
}

/// The classic failure, on real processes: the holder's instance freezes (SIGSTOP) past its
/// lease's TTL; the other instance ends the lease, and a rival waiting there is granted and
/// writes. The frozen instance resumes still believing its handle holds, and the first
/// holder's guarded write through it is refused by ZooKeeper's check of the write's own
/// transaction, naming the rival's token: the value is the rival's.
async fn a_holder_frozen_past_its_ttl_cannot_write_over_the_next(what: Contended) {
    let zk = zookeeper().await;
    let frozen = common::process::Process::start(&zk.connect_string()).await;
    let other = std::sync::Arc::new(Gate::start(&zk.connect_string()).await);
    let lease = frozen.lease("2s").await;
    let (status, held) = frozen
        .call(
            Method::POST,
            &format!("{}?wait=5s", what.take),
            Some(json!({ "lease": lease })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{held}");
    let guard = |handle: &str| format!("{}; handle={handle}", what.guard);
    let stale = guard(held["handle"].as_str().expect("handle"));
    let put = kv(
        &frozen.url,
        Method::PUT,
        "orders/state",
        Some(json!("first")),
        Some(&stale),
    )
    .await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");

    let rival = other.lease("60s").await;
    let waiting = {
        let (other, path) = (other.clone(), format!("{}?wait=30s", what.take));
        tokio::spawn(async move { other.post(&path, Some(json!({ "lease": rival }))).await })
    };
    common::wait_children(&zk.connect_string(), what.dir, 2).await;
    frozen.pause(true);
    let granted = common::within(Duration::from_secs(30), "the rival's grant", waiting)
        .await
        .expect("task");
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    let fresh = guard(&granted.str("handle"));
    let put = kv(
        &other.url,
        Method::PUT,
        "orders/state",
        Some(json!("rival")),
        Some(&fresh),
    )
    .await;
    assert_eq!(put.status, StatusCode::OK, "{put:?}");

    frozen.pause(false);
    // Its session expired while it was frozen: it answers 503 until it has a new one.
    frozen.wait_session(2).await;
    let late = kv(
        &frozen.url,
        Method::PUT,
        "orders/state",
        Some(json!("stale")),
        Some(&stale),
    )
    .await;
    late.assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(late.body["type"], "urn:zkgate:problem:guard-lost", "{late:?}");
    assert_eq!(late.body["guard"], what.guard, "{late:?}");
    assert_eq!(late.body["current_token"], granted.body[what.token], "{late:?}");
    let read = kv(&other.url, Method::GET, "orders/state", None, None).await;
    assert_eq!(read.body, json!("rival"), "{read:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_frozen_past_its_ttl_cannot_write_over_the_next_holder() {
    a_holder_frozen_past_its_ttl_cannot_write_over_the_next(Contended {
        take: "/v1/locks/orders/acquire",
        guard: "lock/orders",
        dir: "/zkgate/locks/orders",
        token: "fencing_token",
    })
    .await;
}

/// The same with leadership: the successor's term is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_frozen_past_its_ttl_cannot_write_over_its_successor() {
    a_holder_frozen_past_its_ttl_cannot_write_over_the_next(Contended {
        take: "/v1/elections/jobs/campaign",
        guard: "election/jobs",
        dir: "/zkgate/elections/jobs",
        token: "term",
    })
    .await;
}

/// The same with a lock-delay, on real processes: a holder whose lease has a lock-delay is
/// frozen past its TTL; the other instance ends the lease and keeps its node through the delay
/// (nobody else is granted yet). Resumed, the holder's guarded write is refused: its lease
/// ended, though its node is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_frozen_into_its_lock_delay_cannot_write() {
    let zk = zookeeper().await;
    let frozen = common::process::Process::start(&zk.connect_string()).await;
    let other = Gate::start(&zk.connect_string()).await;
    let (status, made) = frozen
        .call(
            Method::POST,
            "/v1/leases",
            Some(json!({ "ttl": "2s", "lock_delay": "60s" })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let lease = made["id"].as_str().expect("lease id");
    let (status, held) = frozen.acquire("delayed", lease, "wait=5s").await;
    assert_eq!(status, StatusCode::OK, "{held}");
    let stale = lock_guard("delayed", held["handle"].as_str().expect("handle"));
    let put = kv(
        &frozen.url,
        Method::PUT,
        "delayed/state",
        Some(json!("first")),
        Some(&stale),
    )
    .await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");

    let mut events = Sse::open(&other.http, &format!("{}/v1/locks/delayed/events", other.url), None).await;
    let mut seen = vec![events.next().await];
    frozen.pause(true);
    events
        .until("lock:delayed", &mut seen, |e| e["type"] == "held-by-ended-lease")
        .await;
    frozen.pause(false);
    frozen.wait_session(2).await;
    let late = kv(
        &frozen.url,
        Method::PUT,
        "delayed/state",
        Some(json!("stale")),
        Some(&stale),
    )
    .await;
    assert_lost(&late, "lock/delayed", "lease-ended");
    let read = kv(&other.url, Method::GET, "delayed/state", None, None).await;
    assert_eq!(read.body, json!("first"), "{read:?}");
    let state = other.get("/v1/locks/delayed").await;
    assert_eq!(
        state.body["holder"]["fencing_token"], held["fencing_token"],
        "the node is still kept through the delay: {state:?}"
    );
    assert!(
        state.body["holder"]["held_by_ended_lease_until"].is_string(),
        "{state:?}"
    );
}
