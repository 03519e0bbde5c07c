//! `/metrics` parses as Prometheus text and its values follow the traffic a client made.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::ws::Ws;
use common::{Gate, within, zookeeper};
use reqwest::StatusCode;
use serde_json::json;

/// One scrape: sample (`name{labels}` with labels sorted) to value. Fails the test on any
/// line that is not valid text exposition format, or a sample without its `# TYPE`.
async fn scrape(gate: &Gate) -> BTreeMap<String, f64> {
    let reply = gate
        .http
        .get(format!("{}/metrics", gate.url))
        .send()
        .await
        .expect("GET /metrics");
    assert_eq!(reply.status(), StatusCode::OK);
    let content_type = reply.headers()["content-type"].to_str().expect("ASCII").to_string();
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    let text = reply.text().await.expect("body");
    let mut typed = BTreeMap::new();
    let mut samples = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            typed.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value: {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => {
                let inner = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("unclosed labels: {line}"));
                let mut pairs: Vec<String> = inner
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(|pair| {
                        let (key, quoted) = pair.split_once('=').unwrap_or_else(|| panic!("bad label: {line}"));
                        assert!(
                            quoted.starts_with('"') && quoted.ends_with('"'),
                            "unquoted label: {line}"
                        );
                        assert!(
                            key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                            "label name: {line}"
                        );
                        format!("{key}={quoted}")
                    })
                    .collect();
                pairs.sort();
                (name, format!("{{{}}}", pairs.join(",")))
            }
            None => (series, String::new()),
        };
        assert!(name.starts_with("zkgate_"), "{line}");
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                name.strip_suffix(suffix)
                    .filter(|base| typed.get(*base).is_some_and(|k| k == "histogram"))
            })
            .unwrap_or(name);
        assert!(typed.contains_key(family), "sample without # TYPE: {line}");
        samples.insert(format!("{name}{labels}"), value);
    }
    samples
}

fn value(samples: &BTreeMap<String, f64>, key: &str) -> f64 {
    *samples.get(key).unwrap_or_else(|| panic!("no sample {key}"))
}

#[tokio::test]
async fn metrics_follow_lock_queue_lease_and_socket_traffic() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let before = scrape(&gate).await;
    assert_eq!(value(&before, "zkgate_zookeeper_connected"), 1.0);
    assert_eq!(value(&before, "zkgate_zookeeper_session_generation"), 1.0);

    // Locks: two grants, one try-lock that times out, one release, one revocation.
    let (a, b) = (gate.lease("30s").await, gate.lease("30s").await);
    let held = gate.acquire("m", &a, "wait=0").await;
    assert_eq!(held.status, StatusCode::OK);
    assert_eq!(gate.acquire("m", &b, "wait=0").await.status, StatusCode::CONFLICT);
    let revoked = gate
        .post("/v1/locks/m/revoke", Some(json!({"by": "test", "reason": "metrics"})))
        .await;
    assert_eq!(revoked.status, StatusCode::ACCEPTED);
    gate.release("m", &held.str("handle")).await;
    assert_eq!(gate.acquire("m", &b, "wait=0").await.status, StatusCode::OK);

    // Queue: three puts; one taken and acked, one taken, given back and taken again.
    for n in 0..3 {
        assert_eq!(
            gate.post("/v1/queues/jobs/items", Some(json!({"n": n}))).await.status,
            StatusCode::CREATED
        );
    }
    let first = gate.post("/v1/queues/jobs/take?wait=0&ack_deadline=30s", None).await;
    let claim = first.str("claim");
    assert_eq!(
        gate.post(&format!("/v1/queues/jobs/claims/{claim}/ack"), None)
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    let second = gate.post("/v1/queues/jobs/take?wait=0&ack_deadline=30s", None).await;
    let claim = second.str("claim");
    assert_eq!(
        gate.post(&format!("/v1/queues/jobs/claims/{claim}/nack"), None)
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    let again = gate.post("/v1/queues/jobs/take?wait=0&ack_deadline=30s", None).await;
    assert_eq!(again.i64("deliveries"), 2, "{again:?}");

    // A socket with one subscription.
    let mut ws = Ws::connect(gate.running.addr, "/v1/ws").await;
    ws.send(json!({"op": "subscribe", "id": "q", "topic": {"queue": "jobs"}}));
    assert_eq!(ws.next_for("q").await["type"], "state");

    let after = scrape(&gate).await;
    let lock = r#"{kind="lock",name="m"}"#;
    assert_eq!(value(&after, &format!("zkgate_lock_acquisitions_total{lock}")), 2.0);
    assert_eq!(value(&after, &format!("zkgate_lock_timeouts_total{lock}")), 1.0);
    assert_eq!(value(&after, &format!("zkgate_lock_revocations_total{lock}")), 1.0);
    assert_eq!(value(&after, &format!("zkgate_lock_wait_seconds_count{lock}")), 2.0);
    assert_eq!(value(&after, &format!("zkgate_lock_hold_seconds_count{lock}")), 1.0);
    let queue = r#"{name="jobs"}"#;
    assert_eq!(value(&after, &format!("zkgate_queue_puts_total{queue}")), 3.0);
    assert_eq!(
        value(&after, r#"zkgate_queue_takes_total{mode="at_least_once",name="jobs"}"#),
        3.0
    );
    assert_eq!(value(&after, &format!("zkgate_queue_acks_total{queue}")), 1.0);
    assert_eq!(value(&after, &format!("zkgate_queue_nacks_total{queue}")), 1.0);
    assert_eq!(value(&after, &format!("zkgate_queue_redeliveries_total{queue}")), 1.0);
    // Two items left, one of them claimed.
    assert_eq!(value(&after, &format!("zkgate_queue_depth{queue}")), 1.0);
    assert_eq!(value(&after, &format!("zkgate_queue_in_flight{queue}")), 1.0);
    assert_eq!(value(&after, &format!("zkgate_queue_dead_letters{queue}")), 0.0);
    assert!(value(&after, "zkgate_leases") >= 2.0);
    assert!(value(&after, "zkgate_leases_created_total") >= 2.0);
    assert_eq!(value(&after, "zkgate_websocket_connections"), 1.0);
    assert_eq!(value(&after, "zkgate_websocket_subscriptions"), 1.0);
    assert_eq!(value(&after, "zkgate_event_topics"), 1.0);
    assert!(
        value(&after, "zkgate_zookeeper_request_duration_seconds_count")
            > value(&before, "zkgate_zookeeper_request_duration_seconds_count")
    );

    // Deleting a lease counts as ended; closing the socket takes it off the gauges.
    assert_eq!(
        gate.delete(&format!("/v1/leases/{a}")).await.status,
        StatusCode::NO_CONTENT
    );
    ws.close().await;
    let settled = within(Duration::from_secs(10), "the socket to leave the gauges", async {
        loop {
            let now = scrape(&gate).await;
            if value(&now, "zkgate_websocket_connections") == 0.0 {
                return now;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(value(&settled, "zkgate_websocket_subscriptions"), 0.0);
    assert_eq!(value(&settled, r#"zkgate_leases_ended_total{reason="deleted"}"#), 1.0);
}
