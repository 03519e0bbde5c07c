//! Barriers over HTTP: nobody passes before the barrier is lowered and everybody passes
//! after; all the waiters of an instance share one ZooKeeper watch; a lease-bound barrier
//! falls with its lease.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Gate, packets_received, sessions_watching, within, zookeeper, zookeeper_own};
use reqwest::{Method, StatusCode};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_passes_before_the_barrier_falls_and_everybody_after_on_one_watch() {
    let zk = zookeeper_own().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let raised = gate.call(Method::PUT, "/v1/barriers/start", None).await;
    assert_eq!(raised.status, StatusCode::CREATED, "{raised:?}");
    assert_eq!(
        gate.call(Method::PUT, "/v1/barriers/start", None).await.status,
        StatusCode::OK,
        "raising again is a no-op"
    );

    // The test holds a subscription of its own, so that it can follow how many wait.
    let path = "/zkgate/barriers/start";
    let watches = &gate.running.state.barrier_watches;
    let _own = watches.subscribe(path);
    let mut listeners = watches.listeners(path).expect("a subscription");
    let packets_before = packets_received(zk.client_port()).await;

    let lowered = Arc::new(AtomicBool::new(false));
    let waiters: Vec<_> = (0..20)
        .map(|_| {
            let (gate, lowered) = (gate.clone(), lowered.clone());
            tokio::spawn(async move {
                let reply = gate.get("/v1/barriers/start/wait?wait=30s").await;
                (reply.status, lowered.load(Ordering::SeqCst))
            })
        })
        .collect();
    within(
        Duration::from_secs(10),
        "twenty waiters",
        listeners.wait_for(|n| *n >= 21),
    )
    .await
    .expect("listeners");
    assert_eq!(
        sessions_watching(zk.client_port(), path).await,
        1,
        "one session watches the barrier"
    );
    // Arriving, each waiter needs the barrier read after its arrival (and a `sync` before it):
    // waiters arriving together share both, so twenty cost fewer than one request each.
    let arrived = packets_received(zk.client_port()).await;
    let arriving = arrived - packets_before;
    assert!(
        arriving < 20,
        "{arriving} packets reached ZooKeeper while twenty arrived"
    );
    lowered.store(true, Ordering::SeqCst);
    assert_eq!(gate.delete("/v1/barriers/start").await.status, StatusCode::NO_CONTENT);
    for waiter in waiters {
        let (status, after_lowering) = within(Duration::from_secs(10), "a waiter to pass", waiter)
            .await
            .expect("waiter");
        assert_eq!(status, StatusCode::OK);
        assert!(after_lowering, "a waiter passed before the barrier was lowered");
    }
    // Released, twenty waiters cost ZooKeeper no request of their own: they share the
    // instance's one watch. ZooKeeper saw the delete, the shared watch's re-arming and what the
    // instance sends anyway (its sessions' pings, the keeper's heartbeat every second: more the
    // longer a busy machine takes to release them; 10 beside two CPU hogs); a read per waiter
    // would have been 20 more.
    let packets = packets_received(zk.client_port()).await - arrived;
    assert!(
        packets < 20,
        "{packets} packets reached ZooKeeper while twenty were released"
    );
    gate.delete("/v1/barriers/start")
        .await
        .assert_problem(StatusCode::NOT_FOUND, None);
}

#[tokio::test]
async fn a_lease_bound_barrier_falls_with_its_lease_and_waits_end_clearly() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    // Not up: a wait passes at once.
    assert_eq!(gate.get("/v1/barriers/gate/wait?wait=5s").await.status, StatusCode::OK);

    let raised = gate
        .call(Method::PUT, "/v1/barriers/gate", Some(json!({"ttl": "1s"})))
        .await;
    assert_eq!(raised.status, StatusCode::CREATED, "{raised:?}");
    assert_eq!(raised.body["bound"], true);
    let up = gate.get("/v1/barriers/gate/wait?wait=200ms").await;
    up.assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(up.body["type"], "urn:zkgate:problem:barrier-up");

    // Nobody keeps the owner's lease alive: the barrier falls and the waiter passes.
    let passed = gate.get("/v1/barriers/gate/wait?wait=20s").await;
    assert_eq!(passed.status, StatusCode::OK, "{passed:?}");
    assert_eq!(gate.get("/v1/barriers/gate").await.body["up"], false);
}

/// A waiter that comes after a raise was acknowledged waits, even while the instance's shared
/// watch still holds the barrier as it was before the raise (its next read on its way): the
/// wait asks the watch for a read of its own moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_arriving_after_a_raise_never_passes_on_the_watch_s_older_state() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    // The watch is kept alive between rounds, knowing the barrier down.
    let _watching = gate
        .running
        .state
        .barrier_watches
        .subscribe("/zkgate/barriers/flapping");
    for round in 0..100 {
        for query in ["", "&consistency=sequential"] {
            let raised = gate.call(Method::PUT, "/v1/barriers/flapping", None).await;
            assert_eq!(raised.status, StatusCode::CREATED, "{raised:?}");
            let waited = gate.get(&format!("/v1/barriers/flapping/wait?wait=0s{query}")).await;
            assert_eq!(
                waited.status,
                StatusCode::CONFLICT,
                "round {round}{query}: passed a barrier raised before it came: {waited:?}"
            );
            assert_eq!(
                gate.delete("/v1/barriers/flapping").await.status,
                StatusCode::NO_CONTENT
            );
        }
    }
}
