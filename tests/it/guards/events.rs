//! A guarded key's event stream says which holder wrote it.

use super::*;
use crate::common;
use common::sse::Sse;
use common::{Gate, zookeeper};
use serde_json::{Value, json};

/// A key's event stream says which holder wrote it: a guarded put's event names the guard and
/// the holder's fencing token, through either instance (a put through one, the stream from the
/// other); the next holder's put names the next token; a write without a guard names none; a
/// delete takes the writer record with the key, so a key made again without a guard names none.
#[tokio::test]
async fn a_guarded_keys_events_say_which_holder_wrote_it() {
    let zk = zookeeper().await;
    let (a, b) = (
        Gate::start(&zk.connect_string()).await,
        Gate::start(&zk.connect_string()).await,
    );
    let topic = "znode:data:kv/orders/state";
    let mut events = Sse::open(&b.http, &format!("{}/v1/events?topic={topic}", b.url), None).await;
    let first = events.next().await;
    assert_eq!(first["state"]["exists"], false, "{first:?}");
    let mut seen = Vec::new();
    let lease = a.lease("60s").await;
    let held = a.acquire("orders", &lease, "wait=5s").await;
    let guard = lock_guard("orders", &held.str("handle"));
    let event = put_seen(&a.url, (&mut events, &mut seen), json!("paid"), Some(&guard)).await;
    let by = json!([{"guard": "lock/orders", "fencing_token": held.i64("fencing_token")}]);
    assert_eq!(event["state"]["guarded_by"], by, "{event:?}");
    a.release("orders", &held.str("handle")).await;

    let next = a.acquire("orders", &lease, "wait=5s").await;
    assert_ne!(next.i64("fencing_token"), held.i64("fencing_token"));
    let next_guard = lock_guard("orders", &next.str("handle"));
    let event = put_seen(&a.url, (&mut events, &mut seen), json!("packed"), Some(&next_guard)).await;
    let by = json!([{"guard": "lock/orders", "fencing_token": next.i64("fencing_token")}]);
    assert_eq!(event["state"]["guarded_by"], by, "{event:?}");

    let event = put_seen(&a.url, (&mut events, &mut seen), json!("anyone"), None).await;
    assert!(event["state"].get("guarded_by").is_none(), "{event:?}");

    // A guarded transaction's put names its holder too.
    let done = txn(&b.url, json!({"then": [{"put": "orders/state", "text": "by-txn"}]})).await;
    assert_eq!(done.status, StatusCode::OK, "{done:?}");
    let guarded = common::http_client()
        .post(format!("{}/v1/kv-txn", b.url))
        .header("ZKGATE-Guard", &next_guard)
        .json(&json!({"then": [{"put": "orders/state", "text": "shipped"}]}))
        .send()
        .await
        .expect("kv-txn");
    assert_eq!(guarded.status(), StatusCode::OK);
    let event = events
        .until(topic, &mut seen, |event| event["state"]["data"] == "shipped")
        .await;
    assert_eq!(event["state"]["guarded_by"], by, "{event:?}");

    // Deleted with its writer record (by a plain delete, and by a transaction's): made again
    // without a guard, it names no holder.
    let records = async || {
        let zk = common::zk_client(&zk.connect_string()).await;
        zk.list_children("/zkgate/writers").await.expect("the writer records")
    };
    let other = kv(&a.url, Method::PUT, "orders/other", Some(json!(1)), Some(&next_guard)).await;
    assert_eq!(other.status, StatusCode::CREATED, "{other:?}");
    assert_eq!(records().await.len(), 2, "a record for each key written under a guard");
    let deleted = kv(&a.url, Method::DELETE, "orders/state", None, None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");
    assert_eq!(records().await.len(), 1, "the delete took the key's record");
    let done = txn(&b.url, json!({"then": [{"delete": "orders/other"}]})).await;
    assert_eq!(done.body["results"][0]["deleted"], true, "{done:?}");
    assert!(
        records().await.is_empty(),
        "the transaction's delete took the key's record"
    );
    let event = put_seen(&a.url, (&mut events, &mut seen), json!("again"), None).await;
    assert!(event["state"].get("guarded_by").is_none(), "{event:?}");
}

/// Puts `value` at `orders/state` through `url` (guarded by `guard`) and waits for its event on
/// `events` (`seen`: the events read on the way).
async fn put_seen(url: &str, (events, seen): (&mut Sse, &mut Vec<Value>), value: Value, guard: Option<&str>) -> Value {
    let put = kv(url, Method::PUT, "orders/state", Some(value.clone()), guard).await;
    assert!(put.status.is_success(), "{put:?}");
    let text = value.to_string();
    events
        .until("znode:data:kv/orders/state", seen, |event| {
            event["state"]["data"] == text.as_str()
        })
        .await
}
