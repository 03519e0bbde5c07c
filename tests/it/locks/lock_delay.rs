//! Lock-delay (`lock_delay` on a lease; docs/PRIMITIVES.md part 3): a lock whose holder's lease
//! *expired* stays held by that lease for the delay, marked as such, before the next waiter is
//! granted; a lease deleted by its holder releases at once. (A Curator waiter: `interop.rs`.)

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::sse::Sse;
use common::{Gate, zookeeper};
use reqwest::StatusCode;
use serde_json::json;

/// The slack on top of the TTL and the delay before the next waiter is granted: the keeper's
/// timer, the end written to the lease's record, the holder's node deleted and the waiter's
/// watch, on a busy machine.
const BOUND: Duration = Duration::from_secs(5);

async fn lease(gate: &Gate, ttl: &str, lock_delay: &str) -> String {
    let made = gate
        .post("/v1/leases", Some(json!({ "ttl": ttl, "lock_delay": lock_delay })))
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{made:?}");
    made.str("id")
}

#[tokio::test]
async fn a_lock_of_an_expired_lease_stays_held_for_its_lock_delay() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let mut events = Sse::open(&gate.http, &format!("{}/v1/locks/delayed/events", gate.url), None).await;
    let mut seen = vec![events.next().await];
    let (ttl, delay) = (Duration::from_secs(1), Duration::from_secs(3));
    let started = Instant::now();
    let holder = lease(&gate, "1s", "3s").await;
    let view = gate.get(&format!("/v1/leases/{holder}")).await;
    assert_eq!(view.body["lock_delay_ms"], 3000, "{view:?}");
    let held = gate.acquire("delayed", &holder, "wait=0").await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    let waiter_lease = gate.lease("60s").await;
    let waiter = {
        let (gate, lease) = (gate.clone(), waiter_lease.clone());
        tokio::spawn(async move {
            let reply = gate.acquire("delayed", &lease, "wait=30s").await;
            (reply, started.elapsed())
        })
    };
    // The holder stops (no keepalive): its lease expires, and the lock says it stays held by
    // the ended lease until the delay is over.
    let marked = events
        .until("lock:delayed", &mut seen, |e| e["type"] == "held-by-ended-lease")
        .await;
    let holder_view = &marked["state"]["holder"];
    assert_eq!(holder_view["lease"], json!(holder), "{marked}");
    assert!(holder_view["held_by_ended_lease_until"].is_string(), "{marked}");
    let read = gate.get("/v1/locks/delayed").await;
    assert_eq!(read.body["holder"]["lease"], json!(holder), "{read:?}");
    assert!(!waiter.is_finished(), "nobody is granted during the delay");

    let (granted, at) = common::within(Duration::from_secs(30), "the waiter's grant", waiter)
        .await
        .expect("waiter");
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    assert!(
        at >= ttl + delay,
        "granted {at:?} after the holder's last word: before its TTL and delay"
    );
    assert!(
        at <= ttl + delay + BOUND,
        "granted {at:?} after: past the delay and the bound"
    );
    assert!(
        granted.i64("fencing_token") > held.i64("fencing_token"),
        "the delayed holder's token is not current"
    );
    let delays = common::metric(&gate.url, "zkgate_lock_delays_total{kind=\"lock\"}").await;
    assert_eq!(delays, 1.0);
}

#[tokio::test]
async fn a_lease_with_a_lock_delay_deleted_by_its_holder_releases_at_once() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let holder = lease(&gate, "30s", "30s").await;
    let held = gate.acquire("let-go", &holder, "wait=0").await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    let waiter_lease = gate.lease("60s").await;
    let waiter = {
        let (gate, lease) = (gate.clone(), waiter_lease.clone());
        tokio::spawn(async move { gate.acquire("let-go", &lease, "wait=20s").await })
    };
    common::wait_children(&zk.connect_string(), "/zkgate/locks/let-go", 2).await;
    let deleted = Instant::now();
    let ended = gate.delete(&format!("/v1/leases/{holder}")).await;
    assert_eq!(ended.status, StatusCode::NO_CONTENT, "{ended:?}");
    let granted = waiter.await.expect("waiter");
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    assert!(
        deleted.elapsed() < Duration::from_secs(10),
        "the holder let go: no delay ({:?})",
        deleted.elapsed()
    );

    // A delay past the server's maximum is refused, naming the field.
    let refused = gate
        .post("/v1/leases", Some(json!({ "ttl": "10s", "lock_delay": "2h" })))
        .await;
    refused.assert_problem(StatusCode::BAD_REQUEST, Some("lock_delay"));
}

/// The same for a read/write lock's writer and a semaphore's permit: held by the expired lease
/// for its delay, marked on the holder as the lock's is.
#[tokio::test]
async fn a_write_lock_and_a_permit_of_an_expired_lease_stay_held_for_its_lock_delay() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let started = Instant::now();
    let holder = lease(&gate, "1s", "3s").await;
    let body = Some(json!({ "lease": holder }));
    let wrote = gate.post("/v1/rwlocks/doc/write?wait=0", body.clone()).await;
    assert_eq!(wrote.status, StatusCode::OK, "{wrote:?}");
    let permit = gate.post("/v1/semaphores/slots/acquire?permits=1&wait=0", body).await;
    assert_eq!(permit.status, StatusCode::OK, "{permit:?}");
    let waiter_lease = gate.lease("60s").await;
    let waiting = |path: &'static str| {
        let (gate, lease) = (gate.clone(), waiter_lease.clone());
        tokio::spawn(async move {
            let reply = gate.post(path, Some(json!({ "lease": lease }))).await;
            (reply, started.elapsed())
        })
    };
    let reader = waiting("/v1/rwlocks/doc/read?wait=30s");
    let second = waiting("/v1/semaphores/slots/acquire?permits=1&wait=30s");
    for (what, waiter) in [("the reader", reader), ("the permit", second)] {
        let (granted, at) = common::within(Duration::from_secs(30), what, waiter)
            .await
            .expect("waiter");
        assert_eq!(granted.status, StatusCode::OK, "{what}: {granted:?}");
        assert!(
            at >= Duration::from_secs(4),
            "{what} granted {at:?} after: within the delay"
        );
        assert!(
            at <= Duration::from_secs(4) + BOUND,
            "{what} granted {at:?} after: past the bound"
        );
    }
}

/// The instance that ended the lease dies in the middle of the delay: the instance that takes
/// the lease's remains up holds the rest of the delay, counted from the end the lease's record
/// says, so the waiter is still not granted before it.
#[tokio::test]
async fn the_delay_outlives_the_instance_that_ended_the_lease() {
    use common::process::Process;
    use reqwest::Method;
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let mut keeper = Process::start(&connect).await;
    let other = Process::start(&connect).await;
    let started = Instant::now();
    let made = keeper
        .call(
            Method::POST,
            "/v1/leases",
            Some(json!({ "ttl": "1s", "lock_delay": "8s" })),
        )
        .await;
    assert_eq!(made.0, StatusCode::CREATED, "{made:?}");
    let holder = made.1["id"].as_str().expect("id").to_string();
    let path = "/v1/locks/ledger/acquire?wait=0";
    let held = keeper.call(Method::POST, path, Some(json!({ "lease": holder }))).await;
    assert_eq!(held.0, StatusCode::OK, "{held:?}");
    let http = common::http_client();
    let mut events = Sse::open(&http, &format!("{}/v1/locks/ledger/events", other.url), None).await;
    let mut seen = vec![events.next().await];
    let waiter = {
        let url = other.url.clone();
        tokio::spawn(async move {
            let reply = common::http_client()
                .post(format!("{url}/v1/locks/ledger/acquire?wait=40s"))
                .send()
                .await
                .expect("acquire");
            (reply.status(), started.elapsed())
        })
    };
    events
        .until("lock:ledger", &mut seen, |e| e["type"] == "held-by-ended-lease")
        .await;
    keeper.kill().await;
    let (status, at) = common::within(Duration::from_secs(60), "the waiter's grant", waiter)
        .await
        .expect("waiter");
    assert_eq!(status, StatusCode::OK);
    assert!(at >= Duration::from_secs(9), "granted {at:?} after: within the delay");
    assert!(
        at <= Duration::from_secs(9) + BOUND * 3,
        "granted {at:?} after: the reaper's bound passed"
    );
}
