//! Revocation: a holder asked to give a lock up learns it at once (handle long poll,
//! keepalive, lock state) and releases; with a grace period zkgate takes the lock back itself,
//! the old holder learns it lost the lock, and the next waiter is granted. Every revocation is
//! in the audit log.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Gate, wait_children, within, zookeeper};
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test]
async fn a_holder_learns_of_a_revocation_at_once_and_releases_to_the_next_waiter() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let gate = Arc::new(Gate::start(&connect).await);
    let holder = gate.lease("60s").await;
    let held = gate.acquire("deploy", &holder, "wait=0").await;
    assert_eq!(held.status, StatusCode::OK);
    let handle = held.str("handle");
    let waiter = {
        let gate = gate.clone();
        tokio::spawn(async move { gate.post("/v1/locks/deploy/acquire?wait=30s", None).await })
    };
    wait_children(&connect, "/zkgate/locks/deploy", 2).await;
    // The holder waits for news on its handle.
    let news = {
        let (gate, handle) = (gate.clone(), handle.clone());
        tokio::spawn(async move { gate.get(&format!("/v1/locks/deploy/handles/{handle}?wait=20s")).await })
    };

    let revoked = gate
        .post(
            "/v1/locks/deploy/revoke",
            Some(json!({"by": "ops", "reason": "maintenance"})),
        )
        .await;
    assert_eq!(revoked.status, StatusCode::ACCEPTED, "{revoked:?}");
    assert_eq!(revoked.body["revocations"][0]["node"], held.body["node"]);

    let news = within(Duration::from_secs(10), "the holder's news", news)
        .await
        .expect("news");
    assert_eq!(news.body["state"], "held", "{news:?}");
    assert_eq!(news.body["revocation"]["by"], "ops");
    assert_eq!(news.body["revocation"]["reason"], "maintenance");
    let kept = gate.post(&format!("/v1/leases/{holder}/keepalive"), None).await;
    assert_eq!(
        kept.body["holdings"][0]["revocation"]["reason"], "maintenance",
        "{kept:?}"
    );
    let state = gate.get("/v1/locks/deploy").await;
    assert_eq!(state.body["holder"]["revocation_requested"], true, "{state:?}");
    assert_eq!(state.body["holder"]["revocation"]["by"], "ops");

    // The holder consents.
    gate.release("deploy", &handle).await;
    let granted = within(Duration::from_secs(10), "the waiter's grant", waiter)
        .await
        .expect("waiter");
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");

    let audit = gate.get("/v1/revocations").await;
    assert_eq!(audit.body[0]["lock"], "deploy", "{audit:?}");
    assert_eq!(audit.body[0]["kind"], "lock");
    assert!(audit.body[0]["at_ms"].as_i64().is_some_and(|t| t > 0));
}

#[tokio::test]
async fn after_the_grace_zkgate_takes_the_lock_back_and_the_holder_learns_it_lost_it() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let gate = Arc::new(Gate::start(&connect).await);
    let stubborn = gate.lease("60s").await;
    let held = gate.acquire("batch", &stubborn, "wait=0").await;
    assert_eq!(held.status, StatusCode::OK);
    let waiter = {
        let gate = gate.clone();
        tokio::spawn(async move { gate.post("/v1/locks/batch/acquire?wait=30s", None).await })
    };
    wait_children(&connect, "/zkgate/locks/batch", 2).await;

    let revoked = gate
        .post(
            "/v1/locks/batch/revoke",
            Some(json!({"by": "ops", "reason": "stuck", "grace": "500ms"})),
        )
        .await;
    assert_eq!(revoked.status, StatusCode::ACCEPTED, "{revoked:?}");
    assert_eq!(revoked.body["revocations"][0]["grace_ms"], 500);

    // The holder ignores it; the waiter is granted once the grace runs out.
    let granted = within(Duration::from_secs(20), "the waiter's grant", waiter)
        .await
        .expect("waiter");
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    assert!(
        granted.i64("fencing_token") > held.i64("fencing_token"),
        "the new holder's token fences the old one"
    );

    // The holder's own session hears of the deletion, which may come a moment after the
    // waiter's session granted it (they are different sessions of the instance). The long poll
    // answers at once while a revocation is pending and the lock still looks held.
    let handle = held.str("handle");
    let lost = within(Duration::from_secs(10), "the holder to learn of its loss", async {
        loop {
            let handle = gate.get(&format!("/v1/locks/batch/handles/{handle}?wait=10s")).await;
            if handle.body["state"] != "held" {
                return handle;
            }
        }
    })
    .await;
    assert_eq!(lost.body["state"], "lost", "{lost:?}");
    assert!(
        lost.body["reason"]
            .as_str()
            .is_some_and(|r| r.contains("revoked by ops")),
        "{lost:?}"
    );
    let lease = gate.get(&format!("/v1/leases/{stubborn}")).await;
    assert_eq!(lease.body["holdings"][0]["state"], "lost", "{lease:?}");
    let release = gate.delete(&format!("/v1/locks/batch/handles/{handle}")).await;
    release.assert_problem(StatusCode::GONE, None);
    assert_eq!(release.body["type"], "urn:zkgate:problem:lock-lost");
}

#[tokio::test]
async fn revoking_a_read_write_lock_asks_every_reader_and_nothing_held_is_a_conflict() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let (r1, r2) = (gate.lease("60s").await, gate.lease("60s").await);
    for lease in [&r1, &r2] {
        let read = gate
            .post("/v1/rwlocks/shared/read?wait=0", Some(json!({"lease": lease})))
            .await;
        assert_eq!(read.status, StatusCode::OK);
    }
    let revoked = gate
        .post(
            "/v1/rwlocks/shared/revoke",
            Some(json!({"by": "ops", "reason": "reindex"})),
        )
        .await;
    assert_eq!(revoked.status, StatusCode::ACCEPTED);
    assert_eq!(
        revoked.body["revocations"].as_array().map(Vec::len),
        Some(2),
        "{revoked:?}"
    );
    let state = gate.get("/v1/rwlocks/shared").await;
    assert!(
        state.body["holders"]
            .as_array()
            .expect("holders")
            .iter()
            .all(|h| h["revocation_requested"] == true)
    );

    let none = gate
        .post("/v1/locks/idle/revoke", Some(json!({"by": "ops", "reason": "x"})))
        .await;
    none.assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(none.body["type"], "urn:zkgate:problem:nothing-to-revoke");
    gate.post("/v1/locks/idle/revoke", Some(json!({"by": "", "reason": "x"})))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, Some("by"));
    gate.post("/v1/locks/idle/revoke", Some(json!({"reason": "x"})))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, None);
}
