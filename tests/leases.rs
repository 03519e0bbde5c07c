//! Leases over HTTP: TTLs clamped to the server's bounds (and the answer says so), idempotent
//! creation, keepalive and deletion with the documented status codes.

mod common;

use common::{Gate, zookeeper};
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test]
async fn ttl_is_clamped_and_the_answer_says_what_was_granted() {
    let zk = zookeeper().await;
    let mut config = common::test_config(&zk.connect_string());
    config.lease_ttl_min = std::time::Duration::from_secs(2);
    config.lease_ttl_max = std::time::Duration::from_secs(60);
    config.lease_ttl = std::time::Duration::from_secs(15);
    let gate = Gate::start_with(config).await;

    let default = gate.post("/v1/leases", None).await;
    assert_eq!(default.status, StatusCode::CREATED, "{default:?}");
    assert_eq!(default.body["ttl_ms"], 15_000);
    assert!(default.body.get("requested_ttl_ms").is_none());

    let short = gate.post("/v1/leases", Some(json!({"ttl": "10ms"}))).await;
    assert_eq!(short.body["ttl_ms"], 2_000);
    assert_eq!(short.body["requested_ttl_ms"], 10);

    let long = gate.post("/v1/leases", Some(json!({"ttl": "2h"}))).await;
    assert_eq!(long.body["ttl_ms"], 60_000);
    assert_eq!(long.body["requested_ttl_ms"], 7_200_000);

    let exact = gate.post("/v1/leases", Some(json!({"ttl": "45s"}))).await;
    assert_eq!(exact.body["ttl_ms"], 45_000);
    let remaining = exact.body["remaining_ms"].as_u64().expect("remaining_ms");
    assert!(remaining <= 45_000 && remaining > 40_000, "{remaining}");
}

#[tokio::test]
async fn an_idempotency_key_makes_creation_safe_to_retry() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let create = |key: &'static str| {
        let request = gate
            .http
            .post(format!("{}/v1/leases", gate.url))
            .header("Idempotency-Key", key);
        async move { common::Reply::read(request.send().await.expect("create")).await }
    };
    let first = create("job-42").await;
    let retry = create("job-42").await;
    let other = create("job-43").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(retry.str("id"), first.str("id"));
    assert_ne!(other.str("id"), first.str("id"));
    assert_eq!(gate.get("/v1/leases").await.body.as_array().map(Vec::len), Some(2));

    // Once the lease is gone, the key makes a new one.
    assert_eq!(
        gate.delete(&format!("/v1/leases/{}", first.str("id"))).await.status,
        StatusCode::NO_CONTENT
    );
    let after = create("job-42").await;
    assert_ne!(after.str("id"), first.str("id"));
}

#[tokio::test]
async fn a_lease_reports_its_holdings_and_ends_with_410_after_delete() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let lease = gate.lease("30s").await;
    assert_eq!(gate.acquire("a", &lease, "wait=0").await.status, StatusCode::OK);
    assert_eq!(gate.acquire("b", &lease, "wait=0").await.status, StatusCode::OK);
    let view = gate.get(&format!("/v1/leases/{lease}")).await;
    let mut names: Vec<&str> = view.body["holdings"]
        .as_array()
        .expect("holdings")
        .iter()
        .map(|h| h["name"].as_str().expect("name"))
        .collect();
    names.sort();
    assert_eq!(names, ["a", "b"]);
    assert!(
        view.body["holdings"]
            .as_array()
            .expect("holdings")
            .iter()
            .all(|h| h["state"] == "held" && h["fencing_token"].is_i64())
    );

    assert_eq!(
        gate.delete(&format!("/v1/leases/{lease}")).await.status,
        StatusCode::NO_CONTENT
    );
    gate.get(&format!("/v1/leases/{lease}"))
        .await
        .assert_problem(StatusCode::GONE, None);
    gate.post(&format!("/v1/leases/{lease}/keepalive"), None)
        .await
        .assert_problem(StatusCode::GONE, None);
    // Deleting again is answered as the first time: a retry after a lost reply succeeds.
    assert_eq!(
        gate.delete(&format!("/v1/leases/{lease}")).await.status,
        StatusCode::NO_CONTENT
    );
    gate.acquire("a", &lease, "wait=0")
        .await
        .assert_problem(StatusCode::GONE, None);
    // Both locks are free again.
    for lock in ["a", "b"] {
        assert_eq!(
            gate.post(&format!("/v1/locks/{lock}/acquire?wait=0"), None)
                .await
                .status,
            StatusCode::OK
        );
    }
}
