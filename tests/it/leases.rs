//! Leases over HTTP: TTLs clamped to the server's bounds (and the answer says so), idempotent
//! creation, keepalive and deletion with the documented status codes.

use crate::common;

use common::{Gate, zookeeper, zookeeper_own};
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

    assert!(
        retry.replayed && !first.replayed && !other.replayed,
        "{retry:?} {first:?}"
    );

    // Once the lease is gone, a retry learns that its lease ended (it does not make another).
    assert_eq!(
        gate.delete(&format!("/v1/leases/{}", first.str("id"))).await.status,
        StatusCode::NO_CONTENT
    );
    let after = create("job-42").await;
    after.assert_problem(StatusCode::GONE, None);
    assert_eq!(after.body["type"], "urn:zkgate:problem:lease-ended", "{after:?}");
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

/// Keepalives cost ZooKeeper nothing while the keeper lives: neither those that reach the
/// keeper nor those another instance hands to it write anything. Counted by ZooKeeper's own
/// transaction ids: between two probe znodes, the only transactions are the instances'
/// heartbeats (each a `set_data` of its node under `keepers/`, whose version counts them).
#[tokio::test]
async fn a_keepalive_writes_nothing_to_zookeeper() {
    let zk = zookeeper_own().await;
    let keeper = Gate::start(&zk.connect_string()).await;
    let other = Gate::start(&zk.connect_string()).await;
    let client = common::zk_client(&zk.connect_string()).await;
    let lease = keeper.lease("30s").await;
    assert_eq!(keeper.acquire("kept", &lease, "wait=0").await.status, StatusCode::OK);
    let record = format!("/zkgate/leases/{lease}");
    let heartbeats = async || {
        let mut beats = 0;
        for keeper in client.list_children("/zkgate/keepers").await.expect("keepers") {
            let (_, stat) = client
                .get_data(&format!("/zkgate/keepers/{keeper}"))
                .await
                .expect("a keeper node");
            beats += i64::from(stat.version);
        }
        beats
    };
    let probe = async |name: &str| {
        let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
        let (stat, _) = client.create(name, &[], &options).await.expect("a probe");
        stat.czxid
    };
    let (_, recorded) = client.get_data(&record).await.expect("the lease's record");

    let beats_before = heartbeats().await;
    let first = probe("/probe-before").await;
    for i in 0..200 {
        let through = if i % 2 == 0 { &keeper } else { &other };
        let kept = through.post(&format!("/v1/leases/{lease}/keepalive"), None).await;
        assert_eq!(kept.status, StatusCode::OK, "{kept:?}");
    }
    let last = probe("/probe-after").await;
    let beats = heartbeats().await - beats_before;

    let written = last - first - 1;
    assert!(
        written <= beats,
        "200 keepalives, half of them handed over: {written} transactions besides {beats} heartbeats"
    );
    let (_, now) = client.get_data(&record).await.expect("the lease's record");
    assert_eq!(now.mzxid, recorded.mzxid, "the lease's record was written");
    // The other instance handed each of its keepalives to the keeper (the count is the
    // process's: both instances run in this test's process).
    let metrics = common::http_client()
        .get(format!("{}/metrics", other.url))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics");
    let handed = metrics
        .lines()
        .find_map(|line| line.strip_prefix("zkgate_handoffs_total "))
        .unwrap_or_else(|| panic!("no hand-over count: {metrics}"));
    assert_eq!(handed.trim(), "100", "keepalives handed to the keeper");
}

/// A delete that meets the lease's own expiry (both write its end at once, from the same
/// version of its record) answers as an end does: `204`, or `410` with the reason. Before, the
/// one whose conditional write lost answered `404 unknown lease`, for a lease that had been
/// there all along (issue 53: DELETEs of leases whose acquire was shed under a CPU quota, and so
/// came about a TTL after the lease's create).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_that_meets_the_lease_s_expiry_answers_204_or_410() {
    use futures::StreamExt;
    use std::time::{Duration, Instant};
    const LEASES: usize = 300;
    const TTL: Duration = Duration::from_millis(500);
    let zk = zookeeper().await;
    let mut config = common::test_config(&zk.connect_string());
    config.lease_ttl_min = Duration::from_millis(100);
    let gate = std::sync::Arc::new(Gate::start_with(config).await);
    // Each delete aimed at its lease's expiry, from 15 ms before to 15 ms after it (the time
    // of the create's answer plus the TTL), so that some meet the timer's write.
    let answers: Vec<(StatusCode, serde_json::Value)> = futures::stream::iter(0..LEASES)
        .map(|n| {
            let gate = gate.clone();
            async move {
                let id = gate.lease(&format!("{}ms", TTL.as_millis())).await;
                let aim = Instant::now() + TTL + Duration::from_micros(n as u64 * 100) - Duration::from_millis(15);
                tokio::time::sleep_until(aim.into()).await; // the request's timing under test
                let deleted = gate.delete(&format!("/v1/leases/{id}")).await;
                (deleted.status, deleted.body)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    for (status, body) in &answers {
        let what = match *status {
            StatusCode::NO_CONTENT => "204".to_string(),
            StatusCode::GONE => format!("410 {}", body["reason"].as_str().unwrap_or("(no reason)")),
            other => panic!("a delete at the lease's expiry answered {other}: {body}"),
        };
        *seen.entry(what).or_default() += 1;
    }
    println!("{LEASES} deletes at their lease's expiry: {seen:?}");
    assert!(
        seen.contains_key("410 expired") && seen.contains_key("204"),
        "the deletes did not straddle the expiry: {seen:?}"
    );
}
