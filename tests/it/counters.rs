//! Counters over HTTP against a real ZooKeeper: a missing counter reads 0; concurrent adds on
//! two instances each land exactly once (every add sees a distinct previous value); bounds
//! hold under contention; compare-and-set lets one of two writers win; the stored bytes are
//! Curator's `DistributedAtomicLong` format; a znode that is not a counter is refused and left
//! as it is; and a follower sees every change over SSE and a socket.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::sse::Sse;
use common::ws::Ws;
use common::{Gate, Reply, within, zk_client, zookeeper};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn add(gate: &Gate, name: &str, body: Option<Value>) -> Reply {
    gate.post(&format!("/v1/counters/{name}/add"), body).await
}

async fn put(gate: &Gate, name: &str, value: i64, headers: &[(&str, &str)]) -> Reply {
    let mut request = gate
        .http
        .put(format!("{}/v1/counters/{name}", gate.url))
        .json(&json!({ "value": value }));
    for (header, value) in headers {
        request = request.header(*header, *value);
    }
    Reply::read(request.send().await.expect("PUT")).await
}

#[tokio::test]
async fn a_counter_starts_at_zero_and_is_stored_as_curator_stores_it() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;

    let missing = gate.get("/v1/counters/visits").await;
    assert_eq!(missing.status, StatusCode::OK, "{missing:?}");
    assert_eq!(missing.body["value"], 0);
    assert_eq!(missing.body["exists"], false);
    assert_eq!(missing.body["etag"], Value::Null);

    // `+1` without a body, then a delta.
    let first = add(&gate, "visits", None).await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    assert_eq!((first.i64("previous"), first.i64("value")), (0, 1));
    let second = add(&gate, "visits", Some(json!({"delta": -5}))).await;
    assert_eq!((second.i64("previous"), second.i64("value")), (1, -4));

    let client = zk_client(&zk.connect_string()).await;
    let (data, stat) = client.get_data("/zkgate/counters/visits").await.expect("the znode");
    assert_eq!(data, (-4i64).to_be_bytes(), "8 bytes, big-endian");
    let read = gate.get("/v1/counters/visits").await;
    assert_eq!(read.body["value"], -4);
    assert_eq!(read.body["updates"], 1, "created, then written once: {read:?}");
    assert_eq!(read.body["etag"], json!(format!("\"{}\"", stat.mzxid)));
    assert_eq!(
        read.body["etag"], second.body["etag"],
        "the add answers the version it wrote"
    );

    // Deleted, it reads 0 again; a second delete is a 404.
    let deleted = gate.delete("/v1/counters/visits").await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");
    assert_eq!(gate.get("/v1/counters/visits").await.body["value"], 0);
    gate.delete("/v1/counters/visits")
        .await
        .assert_problem(StatusCode::NOT_FOUND, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adds_on_two_instances_each_land_exactly_once() {
    let zk = zookeeper().await;
    let gates = [
        Arc::new(Gate::start(&zk.connect_string()).await),
        Arc::new(Gate::start(&zk.connect_string()).await),
    ];
    const CLIENTS: usize = 8;
    const ADDS: usize = 25;
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let gate = gates[client % 2].clone();
        tasks.push(tokio::spawn(async move {
            let mut previous = Vec::new();
            for _ in 0..ADDS {
                let reply = add(&gate, "hits", Some(json!({"delta": 1}))).await;
                assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
                assert_eq!(reply.i64("value"), reply.i64("previous") + 1);
                previous.push(reply.i64("previous"));
            }
            previous
        }));
    }
    let mut seen = BTreeSet::new();
    for task in tasks {
        for previous in within(Duration::from_secs(120), "the adds", task).await.expect("task") {
            assert!(seen.insert(previous), "two adds started from {previous}: one was lost");
        }
    }
    let total = (CLIENTS * ADDS) as i64;
    assert_eq!(seen, (0..total).collect(), "each add saw a distinct value");
    assert_eq!(gates[1].get("/v1/counters/hits").await.body["value"], total);
    // Both instances run in this process and share its metrics: every add is counted once.
    let metrics = gates[0]
        .http
        .get(format!("{}/metrics", gates[0].url))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("text");
    let line = format!("zkgate_counter_writes_total{{name=\"hits\",op=\"add\"}} {total}");
    assert!(metrics.lines().any(|l| l == line), "{line} in {metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounds_hold_under_contention_and_a_refused_add_changes_nothing() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    // Ten clients race for three tickets.
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let gate = gate.clone();
            tokio::spawn(async move { add(&gate, "tickets", Some(json!({"delta": 1, "max": 3}))).await })
        })
        .collect();
    let mut granted = 0;
    for task in tasks {
        let reply = within(Duration::from_secs(60), "an add", task).await.expect("task");
        match reply.status {
            StatusCode::OK => granted += 1,
            StatusCode::CONFLICT => {
                reply.assert_problem(StatusCode::CONFLICT, None);
                assert_eq!(reply.body["type"], "urn:zkgate:problem:out-of-bounds", "{reply:?}");
                assert_eq!(reply.body["value"], 3, "{reply:?}");
            }
            other => panic!("{other}: {reply:?}"),
        }
    }
    assert_eq!(granted, 3);
    let before = gate.get("/v1/counters/tickets").await;
    assert_eq!(before.body["value"], 3);

    // Below a minimum, and past 64 bits: refused, and nothing is written.
    add(&gate, "tickets", Some(json!({"delta": -4, "min": 0})))
        .await
        .assert_problem(StatusCode::CONFLICT, None);
    add(&gate, "tickets", Some(json!({"delta": i64::MAX})))
        .await
        .assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(gate.get("/v1/counters/tickets").await.body, before.body);
    // Giving the tickets back down to the minimum works.
    let back = add(&gate, "tickets", Some(json!({"delta": -3, "min": 0}))).await;
    assert_eq!(back.i64("value"), 0, "{back:?}");
}

#[tokio::test]
async fn compare_and_set_lets_one_of_two_writers_win() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let created = put(&gate, "epoch", 7, &[("If-None-Match", "*")]).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(created.body["value"], 7);
    let etag = created.str("etag");
    put(&gate, "epoch", 8, &[("If-None-Match", "*")])
        .await
        .assert_problem(StatusCode::PRECONDITION_FAILED, None);

    let first = put(&gate, "epoch", 8, &[("If-Match", &etag)]).await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    let second = put(&gate, "epoch", 9, &[("If-Match", &etag)]).await;
    second.assert_problem(StatusCode::PRECONDITION_FAILED, None);
    assert_eq!(second.body["current_etag"], first.body["etag"], "{second:?}");
    assert_eq!(gate.get("/v1/counters/epoch").await.body["value"], 8);

    // A conditional delete on a stale version fails; on the current one it succeeds.
    let stale = gate
        .http
        .delete(format!("{}/v1/counters/epoch", gate.url))
        .header("If-Match", &etag)
        .send()
        .await
        .expect("DELETE");
    assert_eq!(stale.status(), StatusCode::PRECONDITION_FAILED);
    let current = gate
        .http
        .delete(format!("{}/v1/counters/epoch", gate.url))
        .header("If-Match", first.str("etag"))
        .send()
        .await
        .expect("DELETE");
    assert_eq!(current.status(), StatusCode::NO_CONTENT);
    // `If-Match` on a counter that does not exist: nothing to match.
    put(&gate, "epoch", 1, &[("If-Match", "*")])
        .await
        .assert_problem(StatusCode::PRECONDITION_FAILED, None);
}

#[tokio::test]
async fn a_znode_that_is_not_a_counter_is_refused_and_left_alone() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let client = zk_client(&zk.connect_string()).await;
    // A Curator `SharedCount` stores four bytes: not a `DistributedAtomicLong`.
    let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    client.mkdir("/zkgate/counters", &options).await.expect("mkdir");
    client
        .create("/zkgate/counters/shared", &[0, 0, 0, 5], &options)
        .await
        .expect("create");

    let read = gate.get("/v1/counters/shared").await;
    assert_eq!(read.body["value"], Value::Null, "{read:?}");
    assert_eq!(read.body["exists"], true);
    let refused = add(&gate, "shared", None).await;
    refused.assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(refused.body["type"], "urn:zkgate:problem:not-a-counter");
    assert_eq!(refused.body["size_bytes"], 4);
    let (data, _) = client.get_data("/zkgate/counters/shared").await.expect("get");
    assert_eq!(data, [0, 0, 0, 5], "left as it was");
    // A set replaces it, deliberately.
    let set = put(&gate, "shared", 5, &[]).await;
    assert_eq!(set.status, StatusCode::OK, "{set:?}");
    assert_eq!(add(&gate, "shared", None).await.i64("value"), 6);
}

#[tokio::test]
async fn followers_see_each_change_over_sse_and_a_socket() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let mut stream = Sse::open(&gate.http, &format!("{}/v1/counters/jobs/events", gate.url), None).await;
    let state = stream.next().await;
    assert_eq!(state["type"], "state", "{state}");
    assert_eq!(state["state"]["value"], 0);
    let mut ws = Ws::connect(gate.running.addr, "/v1/ws").await;
    ws.send(json!({"op": "subscribe", "id": "C", "topic": {"counter": "jobs"}}));
    let subscribed = ws.next_for("C").await;
    assert_eq!(subscribed["type"], "state", "{subscribed}");

    assert_eq!(add(&gate, "jobs", Some(json!({"delta": 2}))).await.i64("value"), 2);
    let mut seen = vec![state];
    let created = stream
        .until("counter:jobs", &mut seen, |e| e["type"] == "created")
        .await;
    assert_eq!(created["state"]["value"], 2, "{created}");
    let created = ws.next_for("C").await;
    assert_eq!(
        (created["type"].clone(), created["state"]["value"].clone()),
        (json!("created"), json!(2))
    );

    assert_eq!(add(&gate, "jobs", None).await.i64("value"), 3);
    let changed = stream
        .until("counter:jobs", &mut seen, |e| e["type"] == "changed")
        .await;
    assert_eq!(changed["state"]["value"], 3, "{changed}");
    let changed = ws.next_for("C").await;
    assert_eq!(
        (changed["type"].clone(), changed["state"]["value"].clone()),
        (json!("changed"), json!(3))
    );

    assert_eq!(
        gate.call(Method::DELETE, "/v1/counters/jobs", None).await.status,
        StatusCode::NO_CONTENT
    );
    let deleted = stream
        .until("counter:jobs", &mut seen, |e| e["type"] == "deleted")
        .await;
    assert_eq!(deleted["state"]["value"], 0, "{deleted}");
    assert_eq!(ws.next_for("C").await["type"], "deleted");
}

/// An add with an `Idempotency-Key` whose reply ZooKeeper lost goes again inside zkgate and
/// counts once (without a key, the same loss is answered 503 `outcome-unknown`); a client's
/// own retry with the key is answered as the first time, and a key used for another delta is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_with_an_idempotency_key_counts_once_through_a_lost_reply_and_a_retry() {
    let zk = zookeeper().await;
    let proxy = common::proxy::Proxy::start(&zk.connect_string()).await;
    let gate = Gate::start(&proxy.connect_string()).await;
    let keyed = |name: &str, key: &str, delta: i64| {
        gate.http
            .post(format!("{}/v1/counters/{name}/add", gate.url))
            .header("idempotency-key", key)
            .json(&json!({ "delta": delta }))
            .send()
    };

    // Without a key: the lost reply of the counter's create is an unknown outcome.
    proxy.lose_next_create_reply_of("/counters/plain");
    let unknown = add(&gate, "plain", Some(json!({"delta": 5}))).await;
    unknown.assert_problem(StatusCode::SERVICE_UNAVAILABLE, None);
    assert_eq!(
        unknown.body["type"], "urn:zkgate:problem:outcome-unknown",
        "{unknown:?}"
    );
    assert_eq!(proxy.create_replies_lost(), 1);

    // With one: the add lands once and is answered as done.
    proxy.lose_next_create_reply_of(common::idempotency_record("anyone", "order-17"));
    let first = Reply::read(keyed("tickets", "order-17", 5).await.expect("add")).await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    assert_eq!(proxy.create_replies_lost(), 2, "the reply of the keyed add was lost");
    assert_eq!((first.i64("previous"), first.i64("value")), (0, 5), "{first:?}");
    assert_eq!(first.body["repeated"], false, "{first:?}");
    assert_eq!(gate.get("/v1/counters/tickets").await.i64("value"), 5);

    // The client's retry: the same answer, nothing added.
    let again = Reply::read(keyed("tickets", "order-17", 5).await.expect("add")).await;
    assert_eq!(again.status, StatusCode::OK, "{again:?}");
    assert_eq!(
        (again.i64("previous"), again.i64("value"), again.str("etag")),
        (0, 5, first.str("etag"))
    );
    assert_eq!(again.body["repeated"], true, "{again:?}");
    // A key used for another request is refused, and changes nothing.
    let other = Reply::read(keyed("tickets", "order-17", 3).await.expect("add")).await;
    other.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, None);
    assert_eq!(
        other.body["type"], "urn:zkgate:problem:idempotency-key-reused",
        "{other:?}"
    );
    // A new key is a new add.
    let next = Reply::read(keyed("tickets", "order-18", 3).await.expect("add")).await;
    assert_eq!((next.i64("previous"), next.i64("value")), (5, 8), "{next:?}");
    assert_eq!(gate.get("/v1/counters/tickets").await.i64("value"), 8);
}
