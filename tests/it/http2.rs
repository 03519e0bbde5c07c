//! HTTP/2 next to HTTP/1.1 on the same port: in clear text with prior knowledge, and over TLS
//! when ALPN picks `h2`. A client's long polls, event streams and calls share one connection.

use std::collections::HashSet;
use std::time::Duration;

use futures::future::join_all;
use reqwest::{StatusCode, Version};
use serde_json::{Value, json};

use crate::common::sse::Sse;
use crate::common::{self, Gate, certificate, test_config, within, zookeeper};

/// Sends `request` and reads its answer as JSON, asserting it came over HTTP/2.
async fn h2_json(request: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.expect("request over HTTP/2");
    assert_eq!(response.version(), Version::HTTP_2);
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_in_clear_text_carries_calls_long_polls_and_an_event_stream_on_one_connection() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let url = &gate.url;
    let h2 = common::http_builder().http2_prior_knowledge().build().expect("client");

    // The dashboard and the API.
    let page = h2.get(format!("{url}/")).send().await.expect("the dashboard");
    assert_eq!((page.version(), page.status()), (Version::HTTP_2, StatusCode::OK));
    assert!(page.text().await.expect("html").contains("<title>zkgate</title>"));
    let (status, lease) = h2_json(h2.post(format!("{url}/v1/leases")).json(&json!({"ttl": "1m"}))).await;
    assert_eq!(status, StatusCode::CREATED, "{lease}");

    // An event stream, open while the rest goes on over the same connection.
    let mut events = Sse::open(&h2, &format!("{url}/v1/locks/orders/events"), None).await;
    let first = events.next().await;
    assert_eq!(first["state"]["holder"], Value::Null, "{first}");

    // 300 long polls at once: takes from an empty queue, all waiting on the one connection.
    const POLLS: usize = 300;
    let takes = (0..POLLS).map(|_| h2_json(h2.post(format!("{url}/v1/queues/work/take?wait=30s"))));
    let takes = tokio::spawn(join_all(takes));
    within(
        Duration::from_secs(20),
        "every take waiting",
        gate.running
            .state
            .limits
            .wait_held(zkgate::limits::LONG_POLLS, |n| n == POLLS),
    )
    .await;
    assert_eq!(gate.running.open_connections(), 1, "one connection carries them all");

    // Meanwhile, on the same connection: a lock (seen on the stream) and the items.
    let (status, held) = h2_json(
        h2.post(format!("{url}/v1/locks/orders/acquire?wait=0"))
            .json(&json!({"lease": lease["id"]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{held}");
    let mut seen = Vec::new();
    let granted = events.until("lock:orders", &mut seen, |e| e["type"] == "granted").await;
    assert_eq!(granted["state"]["holder"]["fencing_token"], held["fencing_token"]);
    for n in 0..POLLS {
        let (status, put) = h2_json(h2.post(format!("{url}/v1/queues/work/items")).json(&json!({"n": n}))).await;
        assert_eq!(status, StatusCode::CREATED, "{put}");
    }
    let taken = within(Duration::from_secs(60), "every take answered", takes)
        .await
        .expect("takes");
    let mut items = HashSet::new();
    for (status, take) in &taken {
        assert_eq!(*status, StatusCode::OK, "{take}");
        assert!(items.insert(take["item"].to_string()), "each item taken once: {take}");
    }
    assert_eq!(items.len(), POLLS);
    assert_eq!(gate.running.open_connections(), 1, "still the one connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_speaks_http2_to_who_offers_it_and_http11_to_who_does_not() {
    let zk = zookeeper().await;
    let certificate = certificate();
    let mut config = test_config(&zk.connect_string());
    config.tls_cert = Some(certificate.cert.clone());
    config.tls_key = Some(certificate.key.clone());
    let gate = Gate::start_with(config).await;
    let url = format!("https://127.0.0.1:{}", gate.running.addr.port());
    let root = || reqwest::Certificate::from_pem(certificate.pem.as_bytes()).expect("pem");
    let h2 = common::http_builder().tls_certs_only([root()]).build().expect("client");
    let h1 = common::http_builder()
        .tls_certs_only([root()])
        .http1_only()
        .build()
        .expect("client");

    let (status, lease) = h2_json(h2.post(format!("{url}/v1/leases")).json(&json!({"ttl": "1m"}))).await;
    assert_eq!(status, StatusCode::CREATED, "{lease}");
    let (status, other) = h2_json(h2.post(format!("{url}/v1/leases")).json(&json!({"ttl": "1m"}))).await;
    assert_eq!(status, StatusCode::CREATED, "{other}");
    let (status, held) = h2_json(
        h2.post(format!("{url}/v1/locks/tls/acquire?wait=0"))
            .json(&json!({"lease": lease["id"]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{held}");

    // A long poll over HTTP/2 and TLS, answered when the holder lets go over HTTP/1.1.
    let waiter = tokio::spawn(h2_json(
        h2.post(format!("{url}/v1/locks/tls/acquire?wait=20s"))
            .json(&json!({"lease": other["id"]})),
    ));
    within(
        Duration::from_secs(20),
        "the acquire waiting",
        gate.running
            .state
            .limits
            .wait_held(zkgate::limits::LONG_POLLS, |n| n == 1),
    )
    .await;
    let release = h1
        .delete(format!(
            "{url}/v1/locks/tls/handles/{}",
            held["handle"].as_str().expect("handle")
        ))
        .send()
        .await
        .expect("release over HTTP/1.1");
    assert_eq!(
        (release.version(), release.status()),
        (Version::HTTP_11, StatusCode::NO_CONTENT)
    );
    let (status, granted) = within(Duration::from_secs(20), "the waiter granted", waiter)
        .await
        .expect("waiter");
    assert_eq!(status, StatusCode::OK, "{granted}");
    assert!(
        granted["fencing_token"].as_i64() > held["fencing_token"].as_i64(),
        "{granted}"
    );
}
