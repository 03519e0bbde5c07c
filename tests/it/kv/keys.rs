//! Configuration over HTTP: values with ETags, compare-and-set where exactly one concurrent
//! writer wins per version, create-only, conditional delete, and a blocking read that wakes on
//! change.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Gate, within, zookeeper};
use reqwest::StatusCode;

async fn put(
    gate: &Gate,
    key: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, Option<String>, serde_json::Value) {
    let mut request = gate
        .http
        .put(format!("{}/v1/kv/{key}", gate.url))
        .body(body.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("put");
    let etag = response
        .headers()
        .get("etag")
        .map(|v| v.to_str().expect("ascii").to_string());
    (
        response.status(),
        etag,
        response.json().await.unwrap_or(serde_json::Value::Null),
    )
}

async fn get(gate: &Gate, key: &str, headers: &[(&str, &str)]) -> (StatusCode, Option<String>, String, String) {
    let mut request = gate.http.get(format!("{}/v1/kv/{key}", gate.url));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("get");
    let etag = response
        .headers()
        .get("etag")
        .map(|v| v.to_str().expect("ascii").to_string());
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().expect("ascii").to_string())
        .unwrap_or_default();
    (
        response.status(),
        etag,
        content_type,
        response.text().await.expect("body"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_compare_and_set_has_exactly_one_winner_per_version() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let (status, mut etag, _) = put(&gate, "counter", "0", &[]).await;
    assert_eq!(status, StatusCode::CREATED);
    for round in 1..=10 {
        let current = etag.clone().expect("etag");
        let writers: Vec<_> = (0..8)
            .map(|writer| {
                let (gate, current) = (gate.clone(), current.clone());
                tokio::spawn(async move {
                    put(
                        &gate,
                        "counter",
                        &format!("{round}-{writer}"),
                        &[("If-Match", &current)],
                    )
                    .await
                })
            })
            .collect();
        let mut winners = Vec::new();
        for writer in writers {
            let (status, new_etag, body) = writer.await.expect("writer");
            match status {
                StatusCode::OK => winners.push(new_etag),
                StatusCode::PRECONDITION_FAILED => assert_eq!(body["type"], "urn:zkgate:problem:precondition-failed"),
                other => panic!("unexpected {other}: {body}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one writer wins");
        etag = winners.pop().expect("winner");
        let (_, read_etag, _, value) = get(&gate, "counter", &[]).await;
        assert_eq!(read_etag, etag);
        assert!(value.starts_with(&format!("{round}-")), "{value}");
    }
}

#[tokio::test]
async fn values_keep_their_kind_and_conditions_hold() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let (status, etag, _) = put(
        &gate,
        "app/flags",
        r#"{"beta":true}"#,
        &[("Content-Type", "application/json")],
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, read_etag, content_type, body) = get(&gate, "app/flags", &[]).await;
    assert_eq!(
        (status, read_etag, content_type.as_str(), body.as_str()),
        (StatusCode::OK, etag.clone(), "application/json", r#"{"beta":true}"#)
    );
    let (status, _, content_type, body) = {
        put(&gate, "app/motd", "hello", &[("Content-Type", "text/plain")]).await;
        get(&gate, "app/motd", &[]).await
    };
    assert_eq!(
        (status, content_type.as_str(), body.as_str()),
        (StatusCode::OK, "text/plain; charset=utf-8", "hello")
    );

    // Invalid JSON under a JSON content type is refused and changes nothing.
    let (status, _, body) = put(&gate, "app/flags", "{oops", &[("Content-Type", "application/json")]).await;
    assert_eq!(
        (status, body["type"].as_str()),
        (StatusCode::BAD_REQUEST, Some("urn:zkgate:problem:malformed-body"))
    );
    assert_eq!(get(&gate, "app/flags", &[]).await.1, etag);

    // Create-only.
    let (status, _, body) = put(&gate, "app/flags", "{}", &[("If-None-Match", "*")]).await;
    assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{body}");
    assert_eq!(body["current_etag"].as_str(), etag.as_deref());
    assert_eq!(
        put(&gate, "app/new", "1", &[("If-None-Match", "*")]).await.0,
        StatusCode::CREATED
    );

    // Not modified, conditional delete, listing, and delete of a key with keys below it.
    assert_eq!(
        get(
            &gate,
            "app/flags",
            &[("If-None-Match", etag.as_deref().unwrap_or_default())]
        )
        .await
        .0,
        StatusCode::NOT_MODIFIED
    );
    let stale = gate
        .http
        .delete(format!("{}/v1/kv/app/flags", gate.url))
        .header("If-Match", "\"1\"")
        .send()
        .await
        .expect("delete");
    assert_eq!(stale.status(), StatusCode::PRECONDITION_FAILED);
    let listed = gate.get("/v1/kv?prefix=app").await;
    assert_eq!(listed.body["keys"], serde_json::json!(["flags", "motd", "new"]));
    gate.delete("/v1/kv/app")
        .await
        .assert_problem(StatusCode::CONFLICT, None);
    let deleted = gate
        .http
        .delete(format!("{}/v1/kv/app/flags", gate.url))
        .header("If-Match", etag.as_deref().unwrap_or_default())
        .send()
        .await
        .expect("delete");
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    assert_eq!(get(&gate, "app/flags", &[]).await.0, StatusCode::NOT_FOUND);
    // Recreated, it has a new version: the old ETag does not match it (no ABA).
    put(&gate, "app/flags", r#"{"beta":false}"#, &[]).await;
    let (status, _, _) = put(
        &gate,
        "app/flags",
        "{}",
        &[("If-Match", etag.as_deref().unwrap_or_default())],
    )
    .await;
    assert_eq!(status, StatusCode::PRECONDITION_FAILED);
}

#[tokio::test]
async fn a_blocking_read_wakes_on_change_and_times_out_unchanged() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let (_, etag, _) = put(&gate, "leader-address", "10.0.0.1", &[]).await;
    let etag = etag.expect("etag");

    let unchanged = get(&gate, "leader-address?wait=300ms", &[("If-None-Match", &etag)]).await;
    assert_eq!(unchanged.0, StatusCode::NOT_MODIFIED);

    let reader = {
        let (gate, etag) = (gate.clone(), etag.clone());
        tokio::spawn(async move { get(&gate, "leader-address?wait=20s", &[("If-None-Match", &etag)]).await })
    };
    // Whether the write lands before or after the reader sets its watch, it sees the change.
    let (status, new_etag, _) = put(&gate, "leader-address", "10.0.0.2", &[]).await;
    assert_eq!(status, StatusCode::OK);
    let (status, read_etag, _, value) = within(Duration::from_secs(25), "the blocked read", reader)
        .await
        .expect("reader");
    assert_eq!(
        (status, read_etag, value.as_str()),
        (StatusCode::OK, new_etag, "10.0.0.2")
    );
}

/// A compare-and-set whose reply ZooKeeper lost, and whose key another client wrote before
/// zkgate could look: only the key could tell whether the write applied, and it no longer can,
/// so the answer is `503 outcome-unknown`. Before, the write was decided again against the new
/// value and answered `412`, a refusal of a write that had happened (here it did: the proxy
/// drops the reply of a commit the server applied). The linearizability checker found this
/// across ZooKeeper leader kills (issue 53; docs/RELIABILITY.md).
#[tokio::test]
async fn a_compare_and_set_whose_lost_reply_the_key_cannot_tell_answers_outcome_unknown() {
    let zk = zookeeper().await;
    let proxy = common::proxy::Proxy::start(&zk.connect_string()).await;
    let behind_proxy = Arc::new(Gate::start(&proxy.connect_string()).await);
    let direct = Gate::start(&zk.connect_string()).await;
    let (status, etag, _) = put(&direct, "lost/cas", "1", &[]).await;
    assert!(status.is_success(), "{status}");
    let etag = etag.expect("an ETag");

    // The commit applies, its reply is lost, and zkgate cannot reconnect until another client
    // has written the key.
    proxy.lose_next_create_reply_and_partition("lost/cas");
    let cas = {
        let (gate, etag) = (behind_proxy.clone(), etag.clone());
        tokio::spawn(async move { put(&gate, "lost/cas", "2", &[("If-Match", &etag)]).await })
    };
    proxy.create_replies_lost_reach(1).await;
    let (status, _, _) = put(&direct, "lost/cas", "3", &[]).await;
    assert!(status.is_success(), "{status}");
    proxy.heal();

    let (status, _, problem) = within(Duration::from_secs(30), "the compare-and-set's answer", cas)
        .await
        .expect("the request");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{problem}");
    assert_eq!(problem["type"], "urn:zkgate:problem:outcome-unknown", "{problem}");
    assert!(
        problem["detail"].as_str().unwrap_or_default().contains("lost/cas"),
        "{problem}"
    );
    let (_, _, _, value) = get(&direct, "lost/cas", &[]).await;
    assert_eq!(value, "3");
}

/// The same lost reply with nobody writing the key meanwhile: the key tells that the write
/// applied, and it answers as applied.
#[tokio::test]
async fn a_compare_and_set_whose_lost_reply_the_key_tells_answers_as_applied() {
    let zk = zookeeper().await;
    let proxy = common::proxy::Proxy::start(&zk.connect_string()).await;
    let behind_proxy = Gate::start(&proxy.connect_string()).await;
    let (_, etag, _) = put(&behind_proxy, "lost/told", "1", &[]).await;
    proxy.lose_next_create_reply_of("lost/told");
    let (status, _, body) = put(
        &behind_proxy,
        "lost/told",
        "2",
        &[("If-Match", &etag.expect("an ETag"))],
    )
    .await;
    assert!(status.is_success(), "{status} {body}");
    assert_eq!(proxy.create_replies_lost(), 1, "the reply was lost");
    let (_, _, _, value) = get(&behind_proxy, "lost/told", &[]).await;
    assert_eq!(value, "2");
}
