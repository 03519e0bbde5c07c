//! WebSocket topics beyond locks and elections: raw znodes under the root (data, children,
//! recursive), read/write locks, double barriers, transactions and leases. Each subscription
//! starts with the state, then events in order with increasing sequence numbers and zxids.

use crate::common;

use std::time::Duration;

use common::ws::Ws;
use common::{Gate, within, zookeeper};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn subscribe(ws: &mut Ws, id: &str, topic: Value) -> Value {
    ws.send(json!({"op": "subscribe", "id": id, "topic": topic}));
    let first = ws.next_for(id).await;
    assert_eq!(first["type"], "state", "{first}");
    first
}

async fn put(gate: &Gate, key: &str, value: &str) {
    let reply = gate
        .http
        .put(format!("{}/v1/kv/{key}", gate.url))
        .header("Content-Type", "text/plain")
        .body(value.to_string())
        .send()
        .await
        .expect("PUT");
    assert!(reply.status().is_success(), "{}", reply.status());
}

/// The next events of subscription `id` until one of kind `kind`; checks that sequence
/// numbers go up by one and zxids never go down on the way.
async fn until(ws: &mut Ws, id: &str, kind: &str, last: &mut (u64, i64)) -> Value {
    loop {
        let event = ws.next_for(id).await;
        let seq = event["seq"].as_u64().expect("seq");
        assert_eq!(seq, last.0 + 1, "consecutive sequence numbers: {event}");
        if let Some(zxid) = event["zxid"].as_i64() {
            assert!(zxid >= last.1, "zxids do not go back: {event}");
            last.1 = zxid;
        }
        last.0 = seq;
        if event["type"] == kind {
            return event;
        }
    }
}

#[tokio::test]
async fn znode_subscriptions_see_creates_changes_and_deletes_below_the_root_only() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let mut ws = Ws::connect(gate.running.addr, "/v1/ws").await;

    // Nothing outside the root (or malformed) can be subscribed; the socket stays up.
    for path in ["/zookeeper", "../x", "kv//a", "kv/.."] {
        ws.send(json!({"op": "subscribe", "id": "bad", "topic": {"znode": {"path": path}}}));
        let error = ws.next().await;
        assert_eq!(error["type"], "urn:zkgate:problem:invalid-topic", "{path}: {error}");
    }

    let data = subscribe(&mut ws, "D", json!({"znode": {"path": "kv/app/flags"}})).await;
    assert_eq!(data["state"]["exists"], false, "{data}");
    let children = subscribe(&mut ws, "C", json!({"znode": {"path": "kv/app", "watch": "children"}})).await;
    assert_eq!(children["state"]["exists"], false, "{children}");
    let recursive = subscribe(&mut ws, "R", json!({"znode": {"path": "kv", "watch": "recursive"}})).await;
    let mut d = (data["seq"].as_u64().unwrap(), 0);
    let mut c = (children["seq"].as_u64().unwrap(), 0);
    let mut r = (recursive["seq"].as_u64().unwrap(), 0);

    put(&gate, "app/flags", "v1").await;
    let created = until(&mut ws, "D", "created", &mut d).await;
    assert_eq!(
        (created["state"]["data"].as_str(), created["zxid"].is_i64()),
        (Some("v1"), true),
        "{created}"
    );
    let listed = until(&mut ws, "C", "created", &mut c).await;
    assert_eq!(listed["state"]["children"], json!(["flags"]), "{listed}");
    // The parents are created on the way (`kv`, `kv/app`), each an event.
    let mut created = Vec::new();
    while created.last().map(String::as_str) != Some("kv/app/flags") {
        let node = until(&mut ws, "R", "created", &mut r).await;
        created.push(node["path"].as_str().expect("path").to_string());
    }
    assert_eq!(created, ["kv", "kv/app", "kv/app/flags"]);

    put(&gate, "app/flags", "v2").await;
    let changed = until(&mut ws, "D", "changed", &mut d).await;
    assert_eq!(changed["state"]["data"], "v2", "{changed}");
    assert_eq!(until(&mut ws, "R", "changed", &mut r).await["path"], "kv/app/flags");

    put(&gate, "app/motd", "hi").await;
    let more = until(&mut ws, "C", "children", &mut c).await;
    assert_eq!(more["state"]["children"], json!(["flags", "motd"]), "{more}");
    assert_eq!(until(&mut ws, "R", "created", &mut r).await["path"], "kv/app/motd");

    assert_eq!(gate.delete("/v1/kv/app/flags").await.status, StatusCode::NO_CONTENT);
    let deleted = until(&mut ws, "D", "deleted", &mut d).await;
    assert_eq!(deleted["state"]["exists"], false, "{deleted}");
    let fewer = until(&mut ws, "C", "children", &mut c).await;
    assert_eq!(fewer["state"]["children"], json!(["motd"]), "{fewer}");
    assert_eq!(until(&mut ws, "R", "deleted", &mut r).await["path"], "kv/app/flags");

    // Binary data comes base64-encoded.
    let reply = gate
        .http
        .put(format!("{}/v1/kv/app/flags", gate.url))
        .header("Content-Type", "application/octet-stream")
        .body(vec![0xff, 0x00, 0x01])
        .send()
        .await
        .expect("PUT");
    assert!(reply.status().is_success());
    let binary = until(&mut ws, "D", "created", &mut d).await;
    assert_eq!(binary["state"]["data_base64"], "/wAB", "{binary}");
}

#[tokio::test]
async fn rwlock_double_barrier_and_transaction_topics_report_their_changes() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let mut ws = Ws::connect(gate.running.addr, "/v1/ws").await;

    let rw = subscribe(&mut ws, "RW", json!({"rwlock": "catalog"})).await;
    assert_eq!(rw["state"]["holders"], json!([]));
    let reader = gate.post("/v1/rwlocks/catalog/read?wait=0", None).await;
    assert_eq!(reader.status, StatusCode::OK);
    let granted = ws.next_for("RW").await;
    assert_eq!(
        (
            granted["type"].as_str(),
            granted["state"]["holders"][0]["mode"].as_str()
        ),
        (Some("granted"), Some("read")),
        "{granted}"
    );
    assert_eq!(
        granted["state"]["holders"][0]["fencing_token"],
        json!(reader.i64("fencing_token"))
    );
    let writer = gate
        .post("/v1/rwlocks/catalog/write?wait=0&keep_queued=true", None)
        .await;
    assert_eq!(writer.status, StatusCode::ACCEPTED);
    let queued = ws.next_for("RW").await;
    assert_eq!(
        (queued["type"].as_str(), queued["state"]["waiter_count"].as_u64()),
        (Some("waiters"), Some(1)),
        "{queued}"
    );
    gate.delete(&format!("/v1/rwlocks/catalog/handles/{}", reader.str("handle")))
        .await;
    let handed = ws.next_for("RW").await;
    assert_eq!(
        (handed["type"].as_str(), handed["state"]["holders"][0]["mode"].as_str()),
        (Some("granted"), Some("write")),
        "{handed}"
    );

    let db = subscribe(&mut ws, "DB", json!({"double_barrier": "batch"})).await;
    assert_eq!(db["state"]["ready"], false);
    let first = gate
        .post(
            "/v1/double-barriers/batch/enter?wait=0",
            Some(json!({"participant": "a", "size": 2})),
        )
        .await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{first:?}");
    assert_eq!(ws.next_for("DB").await["type"], "participants");
    let second = gate
        .post(
            "/v1/double-barriers/batch/enter?wait=5s",
            Some(json!({"participant": "b", "size": 2})),
        )
        .await;
    assert_eq!(second.status, StatusCode::OK, "{second:?}");
    let entered = loop {
        let event = ws.next_for("DB").await;
        if event["type"] == "entered" {
            break event;
        }
    };
    assert_eq!(entered["state"]["participants"], json!(["a", "b"]), "{entered}");

    let created = gate
        .post(
            "/v1/txns",
            Some(json!({"id": "order-1", "participants": ["billing", "stock"]})),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let txn = subscribe(&mut ws, "T", json!({"txn": "order-1"})).await;
    assert_eq!(txn["state"]["decision"], Value::Null, "{txn}");
    for (participant, vote) in [("billing", "commit"), ("stock", "commit")] {
        let path = format!("/v1/txns/order-1/participants/{participant}");
        assert_eq!(gate.call(Method::PUT, &path, None).await.status, StatusCode::CREATED);
        let voted = gate.post(&format!("{path}/vote"), Some(json!({"vote": vote}))).await;
        assert!(voted.status.is_success(), "{voted:?}");
    }
    let decided = loop {
        let event = ws.next_for("T").await;
        if event["type"] == "decision" {
            break event;
        }
        assert_eq!(event["type"], "vote", "{event}");
    };
    assert_eq!(decided["state"]["decision"]["outcome"], "commit", "{decided}");
}

#[tokio::test]
async fn a_lease_topic_warns_before_expiry_and_reports_the_loss() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let mut ws = Ws::connect(gate.running.addr, "/v1/ws").await;
    ws.send(json!({"op": "subscribe", "id": "x", "topic": {"lease": "no-such-lease"}}));
    assert_eq!(ws.next().await["type"], "urn:zkgate:problem:invalid-topic");

    let lease = gate.lease("1500ms").await;
    let held = gate.acquire("expiring", &lease, "wait=0").await;
    assert_eq!(held.status, StatusCode::OK);
    let lock = subscribe(&mut ws, "K", json!({"lock": "expiring"})).await;
    assert_eq!(lock["state"]["holder"]["lease"], json!(lease), "{lock}");
    let first = subscribe(&mut ws, "L", json!({"lease": lease})).await;
    assert_eq!(
        (first["state"]["ended"].as_bool(), first["state"]["ttl_ms"].as_u64()),
        (Some(false), Some(1500))
    );
    let warned = within(Duration::from_secs(10), "the warning", ws.next_for("L")).await;
    assert_eq!(warned["type"], "expiring", "{warned}");
    assert!(
        warned["state"]["remaining_ms"].as_u64().expect("remaining") <= 500,
        "{warned}"
    );
    let lost = ws.next_for("L").await;
    assert_eq!(
        (lost["type"].as_str(), lost["state"]["reason"].as_str()),
        (Some("lost"), Some("expired")),
        "{lost}"
    );

    let deleted = gate.lease("30s").await;
    subscribe(&mut ws, "M", json!({"lease": deleted})).await;
    assert_eq!(
        gate.delete(&format!("/v1/leases/{deleted}")).await.status,
        StatusCode::NO_CONTENT
    );
    let ended = ws.next_for("M").await;
    assert_eq!(
        (ended["type"].as_str(), ended["state"]["reason"].as_str()),
        (Some("ended"), Some("deleted")),
        "{ended}"
    );
}

/// A topic subscribed while its queue is being written must end on the latest state: a change
/// that lands while the topic reads, or before its watch is set, wakes it again (once, both
/// were swallowed and the depth stayed behind for good).
#[tokio::test]
async fn a_topic_subscribed_amid_changes_ends_on_the_latest_state() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    for round in 0..20 {
        let queue = format!("q{round}");
        let mut ws = Ws::connect(gate.running.addr, "/v1/ws").await;
        let put = format!("/v1/queues/{queue}/items");
        assert_eq!(gate.post(&put, Some(json!({"n": 0}))).await.status, StatusCode::CREATED);
        ws.send(json!({"op": "subscribe", "id": "Q", "topic": {"queue": queue}}));
        for n in 1..3 {
            assert_eq!(gate.post(&put, Some(json!({"n": n}))).await.status, StatusCode::CREATED);
        }
        loop {
            let event = ws.next_for("Q").await;
            if event["state"]["depth"] == 3 {
                break;
            }
        }
    }
}

/// A socket that subscribes again with `since` (the `position` of the last event it took)
/// gets the events it missed, not the state again; a position the topic no longer keeps (or
/// that is not a position) is answered honestly.
#[tokio::test]
async fn a_subscription_resumes_after_the_position_it_gives() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let mut ws = Ws::connect(gate.running.addr, "/v1/ws").await;
    let topic = json!({"znode": {"path": "kv/flag", "watch": "data"}});
    // "W" follows all along: what the topic published meanwhile.
    subscribe(&mut ws, "W", topic.clone()).await;
    let first = subscribe(&mut ws, "A", topic.clone()).await;
    let position = first["position"].as_str().expect("a position").to_string();
    ws.send(json!({"op": "unsubscribe", "id": "A"}));
    let mut missed = Vec::new();
    for (i, value) in ["on", "off", "on"].into_iter().enumerate() {
        put(&gate, "flag", value).await;
        // Each write seen before the next: one event each.
        loop {
            let event = ws.next_for("W").await;
            missed.push(event["seq"].as_u64().unwrap());
            if event["state"]["version"] == json!(i) {
                break;
            }
        }
    }
    ws.send(json!({"op": "subscribe", "id": "B", "topic": topic, "since": position}));
    for seq in missed {
        let event = ws.next_for("B").await;
        assert_eq!(event["seq"].as_u64(), Some(seq), "the events missed, in order: {event}");
        assert_ne!(event["type"], "state", "{event}");
    }
    ws.send(json!({"op": "subscribe", "id": "C", "topic": {"lock": "elsewhere"}, "since": position}));
    let resync = ws.next_for("C").await;
    assert_eq!(
        (resync["type"].as_str(), resync["reason"].as_str()),
        (Some("resync"), Some("cannot_resume"))
    );
    ws.send(json!({"op": "subscribe", "id": "D", "topic": {"lock": "x"}, "since": "yesterday"}));
    let error = ws.next_for("D").await;
    assert_eq!(error["op"], "error", "{error}");
    assert_eq!(error["type"], "urn:zkgate:problem:malformed-message");
}
