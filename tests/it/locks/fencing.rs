//! The fencing check a resource server makes before it accepts a write carrying a token:
//! `GET /v1/{locks,rwlocks,elections}/{name}/fencing/{token}` follows a real change of holder,
//! on the instance that granted and on another one, for every holder of a shared read lock.

use crate::common;

use common::{Gate, Reply, zookeeper};
use reqwest::StatusCode;
use serde_json::json;

async fn check(gate: &Gate, kind: &str, name: &str, token: i64) -> Reply {
    gate.get(&format!("/v1/{kind}/{name}/fencing/{token}")).await
}

fn assert_stale(reply: &Reply, current: i64) {
    reply.assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(reply.str("type"), "urn:zkgate:problem:stale-fencing-token");
    assert_eq!(reply.i64("current_token"), current, "{reply:?}");
}

fn assert_not_held(reply: &Reply) {
    reply.assert_problem(StatusCode::NOT_FOUND, None);
    assert_eq!(reply.str("type"), "urn:zkgate:problem:not-held");
}

#[tokio::test]
async fn a_lock_token_is_current_until_the_lock_changes_hands() {
    let zk = zookeeper().await;
    let a = Gate::start(&zk.connect_string()).await;
    let b = Gate::start(&zk.connect_string()).await;
    assert_not_held(&check(&a, "locks", "orders", 1).await);

    let first = a.acquire("orders", &a.lease("30s").await, "wait=0").await;
    assert_eq!(first.status, StatusCode::OK);
    let t1 = first.i64("fencing_token");
    // Right after the grant, on the other instance too: the check reads linearizably.
    for gate in [&a, &b] {
        let ok = check(gate, "locks", "orders", t1).await;
        assert_eq!((ok.status, ok.i64("token")), (StatusCode::OK, t1), "{ok:?}");
    }

    // A waiter queues on the other instance; its node's number is not a holder's token.
    let waiter_lease = b.lease("30s").await;
    let queued = b.acquire("orders", &waiter_lease, "wait=0&keep_queued=true").await;
    assert_eq!(queued.status, StatusCode::ACCEPTED);
    a.release("orders", &first.str("handle")).await;
    let second = b.acquire("orders", &waiter_lease, "wait=5s").await;
    assert_eq!(second.status, StatusCode::OK);
    let t2 = second.i64("fencing_token");
    assert!(t2 > t1);
    for gate in [&a, &b] {
        assert_stale(&check(gate, "locks", "orders", t1).await, t2);
        assert_eq!(check(gate, "locks", "orders", t2).await.status, StatusCode::OK);
        // A token from the future (never a holder's) is not current either.
        assert_stale(&check(gate, "locks", "orders", t2 + 1000).await, t2);
    }
    b.release("orders", &second.str("handle")).await;
    assert_not_held(&check(&a, "locks", "orders", t2).await);

    for bad in ["abc", "0", "-5", "1.5", "99999999999999999999"] {
        let reply = a.get(&format!("/v1/locks/orders/fencing/{bad}")).await;
        reply.assert_problem(StatusCode::BAD_REQUEST, Some("token"));
    }
}

#[tokio::test]
async fn every_reader_of_a_shared_lock_has_a_current_token_and_a_writer_supersedes_them() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let mut tokens = Vec::new();
    let mut handles = Vec::new();
    for _ in 0..9 {
        let lease = gate.lease("30s").await;
        let read = gate
            .post("/v1/rwlocks/catalog/read?wait=5s", Some(json!({ "lease": lease })))
            .await;
        assert_eq!(read.status, StatusCode::OK, "{read:?}");
        tokens.push(read.i64("fencing_token"));
        handles.push(read.str("handle"));
    }
    // The check searches the holders: each one found, and numbers that are none of theirs
    // (before the first, between two, past the last) are not.
    for token in &tokens {
        assert_eq!(check(&gate, "rwlocks", "catalog", *token).await.status, StatusCode::OK);
    }
    let between = (tokens[0]..tokens[8]).filter(|t| !tokens.contains(t));
    for token in [tokens[0] - 1, tokens[8] + 1].into_iter().chain(between) {
        assert_stale(&check(&gate, "rwlocks", "catalog", token).await, tokens[8]);
    }

    let writer_lease = gate.lease("30s").await;
    let queued = gate
        .post(
            "/v1/rwlocks/catalog/write?wait=0&keep_queued=true",
            Some(json!({ "lease": writer_lease })),
        )
        .await;
    assert_eq!(queued.status, StatusCode::ACCEPTED);
    for handle in &handles {
        gate.delete(&format!("/v1/rwlocks/catalog/handles/{handle}")).await;
    }
    let write = gate
        .post(
            "/v1/rwlocks/catalog/write?wait=5s",
            Some(json!({ "lease": writer_lease })),
        )
        .await;
    assert_eq!(write.status, StatusCode::OK, "{write:?}");
    let writer = write.i64("fencing_token");
    for token in &tokens {
        assert_stale(&check(&gate, "rwlocks", "catalog", *token).await, writer);
    }
    assert_eq!(check(&gate, "rwlocks", "catalog", writer).await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_term_is_current_while_its_leader_leads() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let campaign = |lease: String| {
        let gate = &gate;
        async move {
            gate.post(
                "/v1/elections/scheduler/campaign?wait=5s",
                Some(json!({ "lease": lease, "value": "x" })),
            )
            .await
        }
    };
    assert_not_held(&check(&gate, "elections", "scheduler", 7).await);
    let first = campaign(gate.lease("30s").await).await;
    assert_eq!(first.status, StatusCode::OK);
    let term = first.i64("term");
    assert_eq!(
        check(&gate, "elections", "scheduler", term).await.status,
        StatusCode::OK
    );
    let next_lease = gate.lease("30s").await;
    let next = gate
        .post(
            "/v1/elections/scheduler/campaign?wait=0",
            Some(json!({ "lease": next_lease, "value": "y" })),
        )
        .await;
    assert_eq!(next.status, StatusCode::ACCEPTED);
    gate.delete(&format!("/v1/elections/scheduler/candidates/{}", first.str("handle")))
        .await;
    let leads = campaign(next_lease).await;
    assert_eq!(leads.status, StatusCode::OK, "{leads:?}");
    let new_term = leads.i64("term");
    assert_stale(&check(&gate, "elections", "scheduler", term).await, new_term);
    assert_eq!(
        check(&gate, "elections", "scheduler", new_term).await.status,
        StatusCode::OK
    );
}
