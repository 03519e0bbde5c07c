//! Service discovery over HTTP against a real ZooKeeper: an instance registered with a lease
//! is listed, picked and followed, is gone when its lease ends or it unregisters (through any
//! instance of zkgate), is written in Curator's JSON, and an id another lease holds is refused.

use crate::common;

use common::sse::Sse;
use common::{Gate, Reply, zk_client, zookeeper};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn register(gate: &Gate, service: &str, id: &str, body: Value) -> Reply {
    gate.call(
        Method::PUT,
        &format!("/v1/services/{service}/instances/{id}"),
        Some(body),
    )
    .await
}

fn ids(state: &Reply) -> Vec<String> {
    state.body["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .map(|i| i["id"].as_str().expect("id").to_string())
        .collect()
}

#[tokio::test]
async fn instances_are_registered_listed_picked_and_gone_with_their_lease() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let lease = gate.lease("30s").await;
    let body = json!({"address": "10.0.0.5", "port": 8080, "payload": {"zone": "eu-1"}, "uri_spec": "{scheme}://{address}:{port}/api", "lease": lease});
    let first = register(&gate, "billing", "b1", body.clone()).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    // Again with the same lease: the same registration; with another: taken.
    assert_eq!(register(&gate, "billing", "b1", body).await.status, StatusCode::OK);
    register(&gate, "billing", "b1", json!({"address": "10.0.0.6", "ttl": "30s"}))
        .await
        .assert_problem(StatusCode::CONFLICT, None);
    let second = register(&gate, "billing", "b2", json!({"address": "10.0.0.6", "port": 8080, "ssl_port": 8443, "uri_spec": "{scheme}://{address}:{ssl-port}", "ttl": "30s"})).await;
    assert_eq!(second.status, StatusCode::CREATED, "{second:?}");

    let state = gate.get("/v1/services/billing").await;
    assert_eq!(ids(&state), ["b1", "b2"]);
    let b1 = &state.body["instances"][0];
    assert_eq!(b1["uri"], "http://10.0.0.5:8080/api", "{b1}");
    assert_eq!(b1["payload"], json!({"zone": "eu-1"}));
    assert_eq!(b1["lease"], json!(lease));
    assert_eq!(state.body["instances"][1]["uri"], "https://10.0.0.6:8443");
    let one = gate.get("/v1/services/billing/instances/b2").await;
    assert_eq!(one.body["address"], "10.0.0.6", "{one:?}");

    // In Curator's format, with zkgate's note of the lease beside it.
    let client = zk_client(&zk.connect_string()).await;
    let (data, stat) = client.get_data("/zkgate/services/billing/b1").await.expect("the znode");
    let stored: Value = serde_json::from_slice(&data).expect("JSON");
    assert_eq!(stored["name"], "billing");
    assert_eq!(stored["port"], 8080);
    assert_eq!(stored["serviceType"], "DYNAMIC");
    assert_eq!(
        stored["uriSpec"]["parts"][0],
        json!({"value": "scheme", "variable": true})
    );
    assert!(stored["registrationTimeUTC"].is_i64(), "{stored}");
    assert_eq!(stored["zkgate"]["lease"], json!(lease));
    // Bound to the lease, not to one instance's session: it outlives the instance that made it.
    assert_eq!(stat.ephemeral_owner, 0, "persistent, gone with its lease");

    // Counted (the tests of this binary run in processes of their own).
    let metrics = gate
        .http
        .get(format!("{}/metrics", gate.url))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics
            .lines()
            .any(|l| l == "zkgate_service_registrations_total{name=\"billing\"} 2"),
        "{metrics}"
    );

    // Round-robin takes each in turn; random picks one of them.
    let picks: Vec<String> = round_robin_picks(&gate, 4).await;
    assert_eq!(
        picks[0..2].iter().collect::<std::collections::BTreeSet<_>>().len(),
        2,
        "{picks:?}"
    );
    assert_eq!(picks[0], picks[2]);
    assert_eq!(picks[1], picks[3]);
    let random = gate.get("/v1/services/billing/pick").await;
    assert!(["b1", "b2"].contains(&random.str("id").as_str()), "{random:?}");

    // Its lease ends: b1 is gone; unregistered: b2 too; then nothing to pick.
    assert_eq!(
        gate.delete(&format!("/v1/leases/{lease}")).await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(ids(&gate.get("/v1/services/billing").await), ["b2"]);
    assert_eq!(
        gate.delete("/v1/services/billing/instances/b2").await.status,
        StatusCode::NO_CONTENT
    );
    gate.get("/v1/services/billing/pick")
        .await
        .assert_problem(StatusCode::NOT_FOUND, None);
    gate.delete("/v1/services/billing/instances/b2")
        .await
        .assert_problem(StatusCode::NOT_FOUND, None);
}

/// `count` round-robin picks of `billing`, one after another.
async fn round_robin_picks(gate: &Gate, count: usize) -> Vec<String> {
    let mut picks = Vec::new();
    for _ in 0..count {
        picks.push(
            gate.get("/v1/services/billing/pick?strategy=round-robin")
                .await
                .str("id"),
        );
    }
    picks
}

#[tokio::test]
async fn followers_see_instances_come_and_go_and_any_instance_unregisters() {
    let zk = zookeeper().await;
    let a = Gate::start(&zk.connect_string()).await;
    let b = Gate::start(&zk.connect_string()).await;
    let mut stream = Sse::open(&b.http, &format!("{}/v1/services/search/events", b.url), None).await;
    let state = stream.next().await;
    assert_eq!(state["state"]["instances"], json!([]), "{state}");

    let registered = register(
        &a,
        "search",
        "s1",
        json!({"address": "search-1.internal", "port": 9200, "ttl": "30s"}),
    )
    .await;
    assert_eq!(registered.status, StatusCode::CREATED, "{registered:?}");
    let mut seen = vec![state];
    let event = stream
        .until("service:search", &mut seen, |e| e["type"] == "registered")
        .await;
    assert_eq!(
        event["state"]["instances"][0]["address"], "search-1.internal",
        "{event}"
    );

    // Unregistered through the other instance (forwarded to the one that holds it).
    let gone = b.delete("/v1/services/search/instances/s1").await;
    assert_eq!(gone.status, StatusCode::NO_CONTENT, "{gone:?}");
    stream
        .until("service:search", &mut seen, |e| e["type"] == "unregistered")
        .await;
}
