//! Keys bound to a lease (`PUT /v1/kv/{key}?lease=`): ZooKeeper's ephemeral data on zkgate's
//! leases. The key ends with its lease (with a `lease-ended` event), is a plain znode to every
//! other client, survives the instance that made it, and follows one rule for rewrites.

use crate::common;

use std::time::{Duration, Instant};

use common::sse::Sse;
use common::{Gate, within, zookeeper};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// `PUT /v1/kv/{key}{query}` with a text body: the status, the `ETag` and the JSON answer.
async fn put(url: &str, key: &str, query: &str, body: &str) -> (StatusCode, Value) {
    let reply = common::http_client()
        .put(format!("{url}/v1/kv/{key}{query}"))
        .header("content-type", "text/plain")
        .body(body.to_string())
        .send()
        .await
        .expect("PUT");
    let status = reply.status();
    (status, reply.json().await.unwrap_or(Value::Null))
}

/// The key's value and the `ZKGATE-Lease` header (`None`: plain), or `None` if it is absent.
async fn read(url: &str, key: &str) -> Option<(String, Option<String>)> {
    let reply = common::http_client()
        .get(format!("{url}/v1/kv/{key}"))
        .send()
        .await
        .expect("GET");
    if reply.status() == StatusCode::NOT_FOUND {
        return None;
    }
    assert_eq!(reply.status(), StatusCode::OK);
    let lease = reply
        .headers()
        .get("zkgate-lease")
        .map(|v| v.to_str().expect("ascii").to_string());
    Some((reply.text().await.expect("body"), lease))
}

/// Waits, with an exists-watch, until the znode at `path` is gone.
async fn gone(client: &zookeeper_client::Client, path: &str) {
    loop {
        match client.check_and_watch_stat(path).await {
            Ok((None, _)) => return,
            Ok((Some(_), watcher)) => {
                watcher.changed().await;
            }
            Err(err) => panic!("watching {path}: {err}"),
        }
    }
}

/// The holdings the lease's view lists, as `(kind, name, state)`.
async fn holdings(gate: &Gate, lease: &str) -> Vec<(String, String, String)> {
    let view = gate.get(&format!("/v1/leases/{lease}")).await;
    assert_eq!(view.status, StatusCode::OK, "{view:?}");
    let listed = view.body["holdings"].as_array().cloned().unwrap_or_default();
    listed
        .iter()
        .map(|h| {
            (
                h["kind"].as_str().unwrap_or_default().to_string(),
                h["name"].as_str().unwrap_or_default().to_string(),
                h["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_bound_key_is_a_plain_znode_that_ends_with_its_lease() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let client = common::zk_client(&zk.connect_string()).await;
    let topic = "znode:data:kv/presence/worker-1";
    let mut events = Sse::open(&gate.http, &format!("{}/v1/events?topic={topic}", gate.url), None).await;
    let mut seen = vec![events.next().await];

    let lease = gate.lease("2s").await;
    let (status, written) = put(
        &gate.url,
        "presence/worker-1",
        &format!("?lease={lease}"),
        "10.0.0.7:8080",
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{written}");
    assert_eq!(written["lease"], json!(lease));
    let bound = events.until(topic, &mut seen, |e| e["type"] == "created").await;
    assert_eq!(bound["state"]["lease"], json!(lease), "{bound}");

    // Every other client sees a plain persistent znode holding the value.
    let (data, stat) = client
        .get_data("/zkgate/kv/presence/worker-1")
        .await
        .expect("the key's znode");
    assert_eq!(data, b"10.0.0.7:8080");
    assert_eq!(stat.ephemeral_owner, 0, "not an ephemeral of one instance's session");
    assert_eq!(
        read(&gate.url, "presence/worker-1").await,
        Some(("10.0.0.7:8080".to_string(), Some(lease.clone())))
    );
    assert_eq!(
        holdings(&gate, &lease).await,
        [("kv".to_string(), "presence/worker-1".to_string(), "held".to_string())]
    );

    assert_eq!(common::metric(&gate.url, "zkgate_kv_bound_keys").await, 1.0);

    // Kept alive, it stays; a rewrite with the same lease keeps the binding.
    let kept = gate.post(&format!("/v1/leases/{lease}/keepalive"), None).await;
    assert_eq!(kept.status, StatusCode::OK, "{kept:?}");
    let (status, rewritten) = put(
        &gate.url,
        "presence/worker-1",
        &format!("?lease={lease}"),
        "10.0.0.7:9090",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{rewritten}");
    let last_keepalive = Instant::now();

    // Its client stops: the lease expires, and the key goes with it, with a `lease-ended` event.
    within(
        Duration::from_secs(15),
        "the key deleted by its lease's end",
        gone(&client, "/zkgate/kv/presence/worker-1"),
    )
    .await;
    let after = last_keepalive.elapsed();
    assert!(after >= Duration::from_millis(1900), "not before the TTL: {after:?}");
    let ended = events.until(topic, &mut seen, |e| e["type"] != "changed").await;
    assert_eq!(ended["type"], "lease-ended", "{ended}");
    assert_eq!(ended["state"]["exists"], false);
    assert_eq!(
        ended["state"]["lease_ended"],
        json!({"lease": lease, "reason": "expired"})
    );
    // Its owner record and its charge went with it: nothing of the binding is left.
    let bindings = client.list_children("/zkgate/bindings").await.expect("bindings");
    assert!(bindings.is_empty(), "{bindings:?}");
    assert_eq!(read(&gate.url, "presence/worker-1").await, None);
    assert_eq!(common::metric(&gate.url, "zkgate_kv_keys_ended_total").await, 1.0);
    assert_eq!(common::metric(&gate.url, "zkgate_kv_bound_keys").await, 0.0);
}

#[tokio::test]
async fn a_bound_key_deleted_by_a_lease_delete_says_so_and_a_plain_delete_frees_the_lease() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let lease = gate.lease("30s").await;
    for key in ["svc/a", "svc/b"] {
        let (status, body) = put(&gate.url, key, &format!("?lease={lease}"), "up").await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    // A `DELETE` of a bound key (by anyone the grants allow) deletes it and its binding: it
    // leaves the lease's holdings at once.
    let deleted = gate.delete("/v1/kv/svc/a").await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");
    assert_eq!(
        holdings(&gate, &lease).await,
        [("kv".to_string(), "svc/b".to_string(), "held".to_string())]
    );
    let topic = "znode:data:kv/svc/b";
    let mut events = Sse::open(&gate.http, &format!("{}/v1/events?topic={topic}", gate.url), None).await;
    let mut seen = vec![events.next().await];
    let ended = gate.delete(&format!("/v1/leases/{lease}")).await;
    assert_eq!(ended.status, StatusCode::NO_CONTENT, "{ended:?}");
    let event = events.until(topic, &mut seen, |e| e["type"] != "changed").await;
    assert_eq!(event["type"], "lease-ended", "{event}");
    assert_eq!(event["state"]["lease_ended"]["reason"], "deleted");
    assert_eq!(read(&gate.url, "svc/b").await, None);
}

/// The rule for rewrites (README, "Keys bound to a lease"), row by row.
#[tokio::test]
async fn a_bound_key_is_rewritten_only_as_the_rule_says() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let (first, second) = (gate.lease("60s").await, gate.lease("60s").await);
    let with = |lease: &str, rebind: bool| format!("?lease={lease}{}", if rebind { "&rebind=true" } else { "" });

    // absent + no lease: plain. plain + lease: refused, unless rebind.
    assert_eq!(put(&gate.url, "k", "", "plain").await.0, StatusCode::CREATED);
    let (status, refused) = put(&gate.url, "k", &with(&first, false), "bound?").await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["type"], "urn:zkgate:problem:key-not-bound");
    assert_eq!(
        read(&gate.url, "k").await,
        Some(("plain".into(), None)),
        "nothing changed"
    );
    assert_eq!(
        put(&gate.url, "k", &with(&first, true), "bound").await.0,
        StatusCode::OK
    );
    assert_eq!(read(&gate.url, "k").await, Some(("bound".into(), Some(first.clone()))));

    // bound to L + no lease, or another lease: refused (naming L), unless rebind.
    let (status, refused) = put(&gate.url, "k", "", "plain again?").await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["type"], "urn:zkgate:problem:key-bound");
    assert_eq!(refused["lease"], json!(first));
    let (status, refused) = put(&gate.url, "k", &with(&second, false), "moved?").await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["lease"], json!(first));
    assert_eq!(read(&gate.url, "k").await, Some(("bound".into(), Some(first.clone()))));

    // bound to L + L: rewritten, still bound.
    assert_eq!(
        put(&gate.url, "k", &with(&first, false), "bound 2").await.0,
        StatusCode::OK
    );
    assert_eq!(
        read(&gate.url, "k").await,
        Some(("bound 2".into(), Some(first.clone())))
    );

    // bound to L + M with rebind: bound to M, and it leaves L.
    assert_eq!(
        put(&gate.url, "k", &with(&second, true), "moved").await.0,
        StatusCode::OK
    );
    assert_eq!(read(&gate.url, "k").await, Some(("moved".into(), Some(second.clone()))));
    assert_eq!(holdings(&gate, &first).await, [], "the key left the first lease");
    // The first lease's end takes nothing away now.
    let ended = gate.delete(&format!("/v1/leases/{first}")).await;
    assert_eq!(ended.status, StatusCode::NO_CONTENT, "{ended:?}");
    assert_eq!(read(&gate.url, "k").await, Some(("moved".into(), Some(second.clone()))));

    // bound to M + no lease with rebind: plain, and the second lease's end leaves it.
    assert_eq!(
        put(&gate.url, "k", "?rebind=true", "plain at last").await.0,
        StatusCode::OK
    );
    assert_eq!(read(&gate.url, "k").await, Some(("plain at last".into(), None)));
    let ended = gate.delete(&format!("/v1/leases/{second}")).await;
    assert_eq!(ended.status, StatusCode::NO_CONTENT, "{ended:?}");
    assert_eq!(read(&gate.url, "k").await, Some(("plain at last".into(), None)));

    // A lease that is not there: 404, nothing written.
    let (status, refused) = put(&gate.url, "other", "?lease=00000000-0000", "x").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{refused}");
    assert_eq!(read(&gate.url, "other").await, None);
    // An ended one: 410.
    let (status, refused) = put(&gate.url, "other", &with(&first, false), "x").await;
    assert_eq!(status, StatusCode::GONE, "{refused}");
    assert_eq!(read(&gate.url, "other").await, None);
}

/// A bound key outlives the `kill -9` of the instance that made it while its client keeps the
/// lease alive through another, and still ends with the lease.
#[tokio::test]
async fn a_bound_key_outlives_the_instance_that_made_it() {
    use common::process::Process;
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let keeper = Process::start(&connect).await;
    let mut maker = Process::start(&connect).await;
    let third = Process::start(&connect).await;
    let lease = keeper.lease("3s").await;
    let (status, written) = put(&maker.url, "alive/w", &format!("?lease={lease}"), "here").await;
    assert_eq!(status, StatusCode::CREATED, "{written}");

    maker.kill().await;
    // Kept alive through the third instance for more than three TTLs: the key stays, listed
    // on the lease.
    let mut pace = tokio::time::interval(Duration::from_secs(1));
    for _ in 0..10 {
        pace.tick().await;
        let kept = third
            .call(Method::POST, &format!("/v1/leases/{lease}/keepalive"), None)
            .await;
        assert_eq!(kept.0, StatusCode::OK, "{kept:?}");
        assert_eq!(
            read(&third.url, "alive/w").await,
            Some(("here".to_string(), Some(lease.clone())))
        );
    }
    let view = third.call(Method::GET, &format!("/v1/leases/{lease}"), None).await;
    let listed = view.1["holdings"].as_array().cloned().unwrap_or_default();
    assert!(
        listed
            .iter()
            .any(|h| h["kind"] == "kv" && h["name"] == "alive/w" && h["state"] == "held"),
        "{view:?}"
    );
    // Its client stops: the key goes with the lease, though the instance that made it is gone.
    let client = common::zk_client(&connect).await;
    within(
        Duration::from_secs(20),
        "the key deleted by its lease's expiry",
        gone(&client, "/zkgate/kv/alive/w"),
    )
    .await;
    assert_eq!(read(&keeper.url, "alive/w").await, None);
}
