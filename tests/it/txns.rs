//! Two-phase commit over HTTP: commit when all commit, abort on an abort, on a participant
//! lost before voting, and at the deadline; every reader sees the same decision, which never
//! changes.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Gate, Reply, within, zookeeper};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn register(gate: &Gate, id: &str, participant: &str, body: Value) -> Reply {
    gate.call(
        Method::PUT,
        &format!("/v1/txns/{id}/participants/{participant}"),
        Some(body),
    )
    .await
}

async fn vote(gate: &Gate, id: &str, participant: &str, vote: &str) -> Reply {
    gate.post(
        &format!("/v1/txns/{id}/participants/{participant}/vote"),
        Some(json!({ "vote": vote })),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_commit_decides_commit_for_every_reader_once_and_for_all() {
    let zk = zookeeper().await;
    let coordinator = Arc::new(Gate::start(&zk.connect_string()).await);
    let other = Arc::new(Gate::start(&zk.connect_string()).await);
    let created = coordinator
        .post(
            "/v1/txns",
            Some(json!({"id": "t1", "participants": ["a", "b"], "payload": {"order": 42}, "deadline": "20s"})),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let readers: Vec<_> = [coordinator.clone(), other.clone()]
        .into_iter()
        .map(|gate| tokio::spawn(async move { gate.get("/v1/txns/t1?wait=20s").await }))
        .collect();
    for participant in ["a", "b"] {
        assert_eq!(
            register(&other, "t1", participant, json!({"ttl": "30s"})).await.status,
            StatusCode::CREATED
        );
    }
    assert_eq!(vote(&other, "t1", "a", "commit").await.status, StatusCode::OK);
    assert_eq!(vote(&other, "t1", "b", "commit").await.status, StatusCode::OK);

    let mut decisions = Vec::new();
    for reader in readers {
        let reply = within(Duration::from_secs(25), "a reader's decision", reader)
            .await
            .expect("reader");
        assert_eq!(reply.body["decision"]["outcome"], "commit", "{reply:?}");
        decisions.push(reply.body["decision"].clone());
    }
    assert_eq!(decisions[0], decisions[1], "everyone reads the same decision");

    // A vote is final, and so is the decision.
    let changed = vote(&other, "t1", "a", "abort").await;
    changed.assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(
        vote(&other, "t1", "a", "commit").await.status,
        StatusCode::OK,
        "the same vote again is fine"
    );
    assert_eq!(other.get("/v1/txns/t1").await.body["decision"], decisions[0]);
}

#[tokio::test]
async fn one_abort_aborts_at_once() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    gate.post(
        "/v1/txns",
        Some(json!({"id": "t2", "participants": ["a", "b", "c"], "deadline": "30s"})),
    )
    .await;
    for participant in ["a", "b", "c"] {
        register(&gate, "t2", participant, json!({})).await;
    }
    vote(&gate, "t2", "a", "commit").await;
    vote(&gate, "t2", "b", "abort").await;
    let decided = gate.get("/v1/txns/t2?wait=10s").await;
    assert_eq!(decided.body["decision"]["outcome"], "abort", "{decided:?}");
    assert!(
        decided.body["decision"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("`b` voted abort"))
    );
    let late = vote(&gate, "t2", "c", "commit").await;
    late.assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(late.body["type"], "urn:zkgate:problem:txn-decided");
}

#[tokio::test]
async fn a_participant_lost_before_voting_aborts() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    gate.post(
        "/v1/txns",
        Some(json!({"id": "t3", "participants": ["a", "b"], "deadline": "30s"})),
    )
    .await;
    assert_eq!(
        register(&gate, "t3", "a", json!({"ttl": "1s"})).await.status,
        StatusCode::CREATED
    );
    register(&gate, "t3", "b", json!({})).await;
    vote(&gate, "t3", "b", "commit").await;
    // Nobody keeps a's lease alive: its registration goes before it votes.
    let decided = gate.get("/v1/txns/t3?wait=20s").await;
    assert_eq!(decided.body["decision"]["outcome"], "abort", "{decided:?}");
    assert!(
        decided.body["decision"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("lost")),
        "{decided:?}"
    );
}

#[tokio::test]
async fn the_deadline_aborts_an_undecided_transaction() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    gate.post(
        "/v1/txns",
        Some(json!({"id": "t4", "participants": ["a", "b"], "deadline": "1s"})),
    )
    .await;
    register(&gate, "t4", "a", json!({})).await;
    vote(&gate, "t4", "a", "commit").await;
    let decided = gate.get("/v1/txns/t4?wait=20s").await;
    assert_eq!(decided.body["decision"]["outcome"], "abort", "{decided:?}");
    assert!(
        decided.body["decision"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("deadline")),
        "{decided:?}"
    );
}

#[tokio::test]
async fn bad_transactions_are_refused() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    gate.post("/v1/txns", Some(json!({"participants": []})))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, Some("participants"));
    gate.post("/v1/txns", Some(json!({"participants": ["a", "a"]})))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, Some("participants"));
    gate.post("/v1/txns", Some(json!({"participants": ["a/b"]})))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, Some("participants"));
    gate.post("/v1/txns", Some(json!({"id": "..", "participants": ["a"]})))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, Some("id"));
    gate.post("/v1/txns", Some(json!({"participants": ["a"], "deadline": "0"})))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, Some("deadline"));
    gate.post("/v1/txns", Some(json!({"id": "t5", "participants": ["a"]})))
        .await;
    gate.post("/v1/txns", Some(json!({"id": "t5", "participants": ["a"]})))
        .await
        .assert_problem(StatusCode::CONFLICT, None);
    register(&gate, "t5", "stranger", json!({}))
        .await
        .assert_problem(StatusCode::CONFLICT, None);
    vote(&gate, "t5", "a", "commit")
        .await
        .assert_problem(StatusCode::CONFLICT, None); // not registered
    vote(&gate, "t5", "a", "maybe")
        .await
        .assert_problem(StatusCode::BAD_REQUEST, Some("vote"));
    gate.get("/v1/txns/nope")
        .await
        .assert_problem(StatusCode::NOT_FOUND, None);
}
