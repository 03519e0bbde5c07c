//! A stale guard refused, in one process or two: released, lease ended, lock-delay, leadership,
//! a bad header, a WebSocket call.

use super::*;
use crate::common;
use common::sse::Sse;
use common::{Gate, zookeeper};
use serde_json::json;

#[tokio::test]
async fn a_guarded_write_lands_while_the_lock_is_held_and_not_once_it_is_released() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let lease = gate.lease("60s").await;
    let held = gate.acquire("orders", &lease, "wait=5s").await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    let guard = lock_guard("orders", &held.str("handle"));

    let put = kv(
        &gate.url,
        Method::PUT,
        "orders/state",
        Some(json!("paid")),
        Some(&guard),
    )
    .await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");

    gate.release("orders", &held.str("handle")).await;
    let late = kv(
        &gate.url,
        Method::PUT,
        "orders/state",
        Some(json!("late")),
        Some(&guard),
    )
    .await;
    assert_lost(&late, "lock/orders", "released");
    assert!(late.body["current_token"].is_null(), "nobody holds now: {late:?}");
    let gone = kv(&gate.url, Method::DELETE, "orders/state", None, Some(&guard)).await;
    assert_lost(&gone, "lock/orders", "released");
    let read = kv(&gate.url, Method::GET, "orders/state", None, None).await;
    assert_eq!(read.body, json!("paid"), "the refused writes changed nothing: {read:?}");

    // A handle that waits does not hold.
    let holder = gate.acquire("orders", &lease, "wait=5s").await;
    let other = gate.lease("60s").await;
    let waiting = gate.acquire("orders", &other, "wait=0&keep_queued=true").await;
    assert_eq!(waiting.status, StatusCode::ACCEPTED, "{waiting:?}");
    let queued = lock_guard("orders", &waiting.str("handle"));
    let early = kv(
        &gate.url,
        Method::PUT,
        "orders/state",
        Some(json!("early")),
        Some(&queued),
    )
    .await;
    assert_lost(&early, "lock/orders", "not-held");
    assert_eq!(early.body["current_token"], holder.i64("fencing_token"), "{early:?}");
    // And the holder's guarded delete lands.
    let holder_guard = lock_guard("orders", &holder.str("handle"));
    let deleted = kv(&gate.url, Method::DELETE, "orders/state", None, Some(&holder_guard)).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");

    // Taken back by a revocation whose grace ran out: refused as revoked, saying by whom.
    let revoked = gate
        .post(
            "/v1/locks/orders/revoke",
            Some(json!({"by": "ops", "reason": "stuck", "grace": "100ms"})),
        )
        .await;
    assert_eq!(revoked.status, StatusCode::ACCEPTED, "{revoked:?}");
    let granted = gate
        .get(&format!("/v1/locks/orders/handles/{}?wait=10s", waiting.str("handle")))
        .await;
    assert_eq!(
        granted.body["state"], "held",
        "the waiter is granted after the grace: {granted:?}"
    );
    let late = kv(
        &gate.url,
        Method::PUT,
        "orders/state",
        Some(json!("late")),
        Some(&holder_guard),
    )
    .await;
    assert_lost(&late, "lock/orders", "revoked");
    assert!(late.str("detail").contains("`ops` (stuck)"), "{late:?}");
    assert_eq!(late.body["current_token"], granted.body["fencing_token"], "{late:?}");
}

#[tokio::test]
async fn a_stale_guard_is_refused_after_its_lease_expires_and_another_takes_the_lock_through_the_other_instance() {
    let zk = zookeeper().await;
    let (a, b) = (
        Gate::start(&zk.connect_string()).await,
        Gate::start(&zk.connect_string()).await,
    );
    // The first holder, through A, stops sending keepalives.
    let first_lease = a.lease("1s").await;
    let first = a.acquire("orders", &first_lease, "wait=5s").await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    let stale = lock_guard("orders", &first.str("handle"));
    let put = kv(&a.url, Method::PUT, "orders/state", Some(json!("first")), Some(&stale)).await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");

    // The second takes the lock through B once the first's lease has expired.
    let second_lease = b.lease("60s").await;
    let second = b.acquire("orders", &second_lease, "wait=30s").await;
    assert_eq!(second.status, StatusCode::OK, "{second:?}");
    let token = second.i64("fencing_token");
    let fresh = lock_guard("orders", &second.str("handle"));

    // The first writes with its old guard, through either instance: refused, naming the holder.
    // A drove the handle and knows its lease ended; B finds no node.
    for (gate, reason) in [(&a, "lease-ended"), (&b, "released")] {
        let late = kv(
            &gate.url,
            Method::PUT,
            "orders/state",
            Some(json!("stale")),
            Some(&stale),
        )
        .await;
        assert_lost(&late, "lock/orders", reason);
        assert_eq!(late.body["current_token"], token, "{late:?}");
    }
    // The second's guard holds through A too, which does not drive its handle.
    let put = kv(&a.url, Method::PUT, "orders/state", Some(json!("second")), Some(&fresh)).await;
    assert_eq!(put.status, StatusCode::OK, "{put:?}");
    let read = kv(&b.url, Method::GET, "orders/state", None, None).await;
    assert_eq!(read.body, json!("second"), "{read:?}");
    // Both instances run in this test's process, with one registry: the two refusals.
    let refused = common::metric(&a.url, "zkgate_guard_refusals_total{kind=\"lock\"}").await;
    assert_eq!(refused, 2.0, "the refusals are counted");
}

#[tokio::test]
async fn during_a_lock_delay_the_guard_of_the_ended_lease_is_refused() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let mut events = Sse::open(&gate.http, &format!("{}/v1/locks/delayed/events", gate.url), None).await;
    let mut seen = vec![events.next().await];
    let made = gate
        .post("/v1/leases", Some(json!({ "ttl": "1s", "lock_delay": "60s" })))
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{made:?}");
    let held = gate.acquire("delayed", &made.str("id"), "wait=5s").await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    let guard = lock_guard("delayed", &held.str("handle"));
    // No keepalive: the lease expires, and its node is kept through the delay.
    events
        .until("lock:delayed", &mut seen, |e| e["type"] == "held-by-ended-lease")
        .await;
    let late = kv(&gate.url, Method::PUT, "delayed/state", Some(json!(1)), Some(&guard)).await;
    assert_lost(&late, "lock/delayed", "lease-ended");
    let read = kv(&gate.url, Method::GET, "delayed/state", None, None).await;
    assert_eq!(read.status, StatusCode::NOT_FOUND, "nothing was written: {read:?}");
}

#[tokio::test]
async fn a_leaders_guarded_write_lands_until_it_resigns() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let lease = gate.lease("60s").await;
    let led = gate
        .post("/v1/elections/jobs/campaign?wait=5s", Some(json!({ "lease": lease })))
        .await;
    assert_eq!(led.status, StatusCode::OK, "{led:?}");
    let handle = led.str("handle");
    let guard = format!("election/jobs; handle={handle}");
    let put = kv(
        &gate.url,
        Method::PUT,
        "jobs/config",
        Some(json!({"v": 1})),
        Some(&guard),
    )
    .await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    let resigned = gate.delete(&format!("/v1/elections/jobs/candidates/{handle}")).await;
    assert_eq!(resigned.status, StatusCode::NO_CONTENT, "{resigned:?}");
    let late = kv(
        &gate.url,
        Method::PUT,
        "jobs/config",
        Some(json!({"v": 2})),
        Some(&guard),
    )
    .await;
    assert_lost(&late, "election/jobs", "released");
}

#[tokio::test]
async fn a_bad_guard_is_refused_naming_the_header_and_writes_nothing() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let lease = gate.lease("60s").await;
    let held = gate.acquire("orders", &lease, "wait=5s").await;
    let handle = held.str("handle");
    for guard in [
        "lock/orders".to_string(),
        format!("queue/jobs; handle={handle}"),
        "lock/orders; handle=not-a-handle".to_string(),
        vec![lock_guard("orders", &handle); 9].join(", "),
    ] {
        let put = kv(&gate.url, Method::PUT, "orders/state", Some(json!(1)), Some(&guard)).await;
        put.assert_problem(StatusCode::BAD_REQUEST, Some("ZKGATE-Guard"));
    }
    // A guard with a handle that never existed at that lock.
    let unknown = lock_guard("elsewhere", &handle);
    let put = kv(&gate.url, Method::PUT, "orders/state", Some(json!(1)), Some(&unknown)).await;
    assert_lost(&put, "lock/elsewhere", "released");
    let read = kv(&gate.url, Method::GET, "orders/state", None, None).await;
    assert_eq!(read.status, StatusCode::NOT_FOUND, "nothing was written: {read:?}");
}

/// A WebSocket `call` carries the guard as a header, and is refused as over HTTP.
#[tokio::test]
async fn a_socket_call_carries_the_guard() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let lease = gate.lease("60s").await;
    let held = gate.acquire("orders", &lease, "wait=5s").await;
    let guard = lock_guard("orders", &held.str("handle"));
    let mut ws = common::ws::Ws::connect(gate.running.addr, "/v1/ws").await;
    let call = |id: &str, value: i64| {
        json!({
            "op": "call", "id": id, "method": "PUT", "path": "/v1/kv/orders/state",
            "headers": { "ZKGATE-Guard": guard }, "body": value,
        })
    };
    ws.send(call("held", 1));
    let written = ws.next_for("held").await;
    assert_eq!(written["status"], 201, "{written}");
    gate.release("orders", &held.str("handle")).await;
    ws.send(call("released", 2));
    let refused = ws.next_for("released").await;
    assert_eq!(refused["status"], 409, "{refused}");
    assert_eq!(refused["body"]["type"], "urn:zkgate:problem:guard-lost", "{refused}");
    let read = kv(&gate.url, Method::GET, "orders/state", None, None).await;
    assert_eq!(read.body, json!(1), "{read:?}");
}
