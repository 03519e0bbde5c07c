//! Queues over HTTP: at-least-once delivery through consumers that vanish (every item acked
//! exactly once, none lost), idempotent puts, priority order with FIFO within a priority,
//! dead letters and replay, long-poll takes, bounded depth.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::process::Process;
use common::{Gate, Reply, within, zookeeper, zookeeper_own};
use reqwest::StatusCode;
use serde_json::json;

async fn put(gate: &Gate, queue: &str, query: &str, body: serde_json::Value) -> Reply {
    gate.post(&format!("/v1/queues/{queue}/items?{query}"), Some(body))
        .await
}

async fn take(gate: &Gate, queue: &str, query: &str) -> Reply {
    gate.post(&format!("/v1/queues/{queue}/take?{query}"), None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_items_through_vanishing_consumers_are_each_acked_exactly_once() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    const ITEMS: usize = 1000;
    let producers: Vec<_> = (0..8)
        .map(|p| {
            let gate = gate.clone();
            tokio::spawn(async move {
                for i in (p..ITEMS).step_by(8) {
                    let reply = put(&gate, "work", "", json!({ "id": i })).await;
                    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
                }
            })
        })
        .collect();
    for producer in producers {
        within(Duration::from_secs(120), "the producers", producer)
            .await
            .expect("producer");
    }

    let acked = Arc::new(Mutex::new(Vec::new()));
    let vanished = Arc::new(Mutex::new(BTreeSet::new()));
    let consumers: Vec<_> = (0..4)
        .map(|c| {
            let (gate, acked, vanished) = (gate.clone(), acked.clone(), vanished.clone());
            tokio::spawn(async move {
                loop {
                    let item = take(&gate, "work", "wait=2s&ack_deadline=300ms").await;
                    if item.status == StatusCode::NO_CONTENT {
                        if acked.lock().unwrap().len() >= ITEMS {
                            return;
                        }
                        continue;
                    }
                    assert_eq!(item.status, StatusCode::OK, "{item:?}");
                    let id = item.body["body"]["id"].as_u64().expect("id");
                    // Consumers 0 and 1 vanish with every seventh item on its first delivery:
                    // no ack, no nack; the claim lapses and the item comes back.
                    if c < 2 && id % 7 == 0 && item.body["deliveries"] == 1 {
                        vanished.lock().unwrap().insert(id);
                        continue;
                    }
                    let claim = item.str("claim");
                    let ack = gate.post(&format!("/v1/queues/work/claims/{claim}/ack"), None).await;
                    if ack.status == StatusCode::NO_CONTENT {
                        acked.lock().unwrap().push(id);
                    } else {
                        assert_eq!(ack.status, StatusCode::GONE, "{ack:?}");
                    }
                }
            })
        })
        .collect();
    for consumer in consumers {
        within(Duration::from_secs(180), "the consumers", consumer)
            .await
            .expect("consumer");
    }
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    let mut counts = BTreeMap::new();
    for id in &acked {
        *counts.entry(*id).or_insert(0) += 1;
    }
    assert_eq!(counts.len(), ITEMS, "every item acked");
    assert!(counts.values().all(|&n| n == 1), "no item acked twice");
    assert!(!vanished.lock().unwrap().is_empty(), "some consumers vanished");
    let state = gate.get("/v1/queues/work").await;
    assert_eq!(
        (
            state.body["depth"].as_u64(),
            state.body["in_flight"].as_u64(),
            state.body["dead_letters"].as_u64()
        ),
        (Some(0), Some(0), Some(0)),
        "{state:?}"
    );
}

/// A client whose ack (or nack) reply was lost sends it again: it gets the answer the first
/// one got. An ack after a nack (or a nack after an ack) cannot be honoured and says why.
#[tokio::test]
async fn a_repeated_ack_or_nack_is_answered_as_the_first() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    for n in 0..2 {
        assert_eq!(
            put(&gate, "retry", "", json!({ "n": n })).await.status,
            StatusCode::CREATED
        );
    }
    // Settle a claim twice one way, then once the other: (the verb, the other, what it says).
    for (verb, other, said) in [("ack", "nack", "was acknowledged"), ("nack", "ack", "was given back")] {
        let taken = take(&gate, "retry", "wait=0&ack_deadline=60s").await;
        let claim = format!("/v1/queues/retry/claims/{}", taken.str("claim"));
        for _ in 0..2 {
            let settled = gate.post(&format!("{claim}/{verb}"), None).await;
            assert_eq!(settled.status, StatusCode::NO_CONTENT, "{verb} again: {settled:?}");
        }
        let refused = gate.post(&format!("{claim}/{other}"), None).await;
        refused.assert_problem(StatusCode::GONE, None);
        assert!(
            refused.str("detail").contains(said),
            "{other} after {verb}: {refused:?}"
        );
    }
    // Given back once, not twice: the item is delivered again, its second delivery.
    let again = take(&gate, "retry", "wait=0&ack_deadline=60s").await;
    assert_eq!(
        (again.body["body"]["n"].as_u64(), again.body["deliveries"].as_u64()),
        (Some(1), Some(2)),
        "{again:?}"
    );
    assert_eq!(gate.get("/v1/queues/retry").await.body["depth"], 0);
}

#[tokio::test]
async fn a_claim_extended_through_another_instance_outlives_its_first_deadline_and_lapses_at_the_new_one() {
    let zk = zookeeper().await;
    let a = Gate::start(&zk.connect_string()).await;
    let b = Gate::start(&zk.connect_string()).await;
    assert_eq!(put(&a, "slow", "", json!("work")).await.status, StatusCode::CREATED);
    let taken = take(&a, "slow", "wait=0&ack_deadline=2s").await;
    let claim = format!("/v1/queues/slow/claims/{}", taken.str("claim"));

    // Through the instance that does not time the claim: 6 s from now.
    let extended = b
        .post(&format!("{claim}/extend"), Some(json!({"ack_deadline": "6s"})))
        .await;
    assert_eq!(extended.status, StatusCode::OK, "{extended:?}");
    assert!(
        extended.str("ack_deadline_at") > taken.str("ack_deadline_at"),
        "{extended:?} after {taken:?}"
    );
    // Past the first deadline (the take's own wait spans it), nobody gets the item: the timer
    // that fired on `a` found the later deadline in the claim's record.
    let nothing = take(&a, "slow", "wait=3s").await;
    assert_eq!(nothing.status, StatusCode::NO_CONTENT, "{nothing:?}");
    // Shortened through `a`, to a deadline that passes within the next take's wait: the
    // item comes again, its second delivery.
    let shortened = a
        .post(&format!("{claim}/extend"), Some(json!({"ack_deadline": "1s"})))
        .await;
    assert_eq!(shortened.status, StatusCode::OK, "{shortened:?}");
    let again = take(&b, "slow", "wait=10s&ack_deadline=60s").await;
    assert_eq!(
        (again.body["body"].as_str(), again.body["deliveries"].as_u64()),
        (Some("work"), Some(2)),
        "{again:?}"
    );

    // A claim not held any more, and a deadline out of bounds, are refused.
    let lapsed = b
        .post(&format!("{claim}/extend"), Some(json!({"ack_deadline": "6s"})))
        .await;
    lapsed.assert_problem(StatusCode::GONE, None);
    let current = format!("/v1/queues/slow/claims/{}/extend", again.str("claim"));
    for deadline in ["0s", "13h"] {
        let refused = a.post(&current, Some(json!({"ack_deadline": deadline}))).await;
        refused.assert_problem(StatusCode::BAD_REQUEST, Some("ack_deadline"));
    }
}

#[tokio::test]
async fn a_retried_put_lands_once_and_a_full_queue_refuses_more() {
    let zk = zookeeper().await;
    let mut config = common::test_config(&zk.connect_string());
    config.queue_max_depth = 3;
    let gate = Gate::start_with(config).await;
    let send = |key: &'static str| {
        let request = gate
            .http
            .post(format!("{}/v1/queues/orders/items", gate.url))
            .header("Idempotency-Key", key)
            .json(&json!({"order": key}));
        async move { Reply::read(request.send().await.expect("put")).await }
    };
    assert_eq!(send("o-1").await.status, StatusCode::CREATED);
    let retried = send("o-1").await;
    assert_eq!(
        (retried.status, retried.body["duplicate"].as_bool()),
        (StatusCode::OK, Some(true))
    );
    assert_eq!(
        gate.get("/v1/queues/orders").await.body["depth"],
        1,
        "the retried put appears once"
    );
    assert_eq!(send("o-2").await.status, StatusCode::CREATED);
    assert_eq!(send("o-3").await.status, StatusCode::CREATED);
    let full = send("o-4").await;
    full.assert_problem(StatusCode::TOO_MANY_REQUESTS, None);
    assert_eq!(full.body["type"], "urn:zkgate:problem:queue-full");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priorities_come_first_and_each_priority_is_fifo() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let producers: Vec<_> = (0..4u64)
        .map(|producer| {
            let gate = gate.clone();
            tokio::spawn(async move {
                for index in 0..25u64 {
                    let priority = (producer * 7 + index * 3) % 4;
                    let reply = put(
                        &gate,
                        "jobs",
                        &format!("priority={priority}"),
                        json!({"producer": producer, "index": index}),
                    )
                    .await;
                    assert_eq!(reply.status, StatusCode::CREATED);
                }
            })
        })
        .collect();
    for producer in producers {
        within(Duration::from_secs(60), "the producers", producer)
            .await
            .expect("producer");
    }
    let mut taken = Vec::new();
    loop {
        let item = take(&gate, "jobs", "mode=at-most-once&wait=0").await;
        if item.status == StatusCode::NO_CONTENT {
            break;
        }
        taken.push((
            item.body["priority"].as_u64().expect("priority"),
            item.body["body"]["producer"].as_u64().expect("p"),
            item.body["body"]["index"].as_u64().expect("i"),
        ));
    }
    assert_eq!(taken.len(), 100);
    assert!(
        taken.windows(2).all(|w| w[0].0 <= w[1].0),
        "lower priority numbers first"
    );
    for producer in 0..4 {
        for priority in 0..4 {
            let indices: Vec<u64> = taken
                .iter()
                .filter(|t| t.1 == producer && t.0 == priority)
                .map(|t| t.2)
                .collect();
            assert!(
                indices.windows(2).all(|w| w[0] < w[1]),
                "FIFO within priority {priority} for producer {producer}: {indices:?}"
            );
        }
    }
}

#[tokio::test]
async fn an_item_delivered_too_often_is_dead_lettered_and_can_be_replayed() {
    let zk = zookeeper().await;
    let mut config = common::test_config(&zk.connect_string());
    config.queue_max_deliveries = 2;
    let gate = Gate::start_with(config).await;
    put(&gate, "mail", "", json!({"to": "nobody"})).await;
    for delivery in 1..=2 {
        let item = take(&gate, "mail", "wait=0").await;
        assert_eq!(item.body["deliveries"], delivery, "{item:?}");
        let nacked = gate
            .post(&format!("/v1/queues/mail/claims/{}/nack", item.str("claim")), None)
            .await;
        assert_eq!(nacked.status, StatusCode::NO_CONTENT);
    }
    assert_eq!(
        take(&gate, "mail", "wait=0").await.status,
        StatusCode::NO_CONTENT,
        "the third delivery goes to the dead letters"
    );
    let dead = gate.get("/v1/queues/mail/dead-letters").await;
    assert_eq!(dead.body[0]["body"]["to"], "nobody", "{dead:?}");
    // The same count in the queue's state, by the same name.
    assert_eq!(gate.get("/v1/queues/mail").await.body["dead_letters"], 1);
    // The old path still answers, the same list, saying it is deprecated and where to go.
    let old = gate
        .http
        .get(format!("{}/v1/queues/mail/dead", gate.url))
        .send()
        .await
        .expect("old path");
    assert_eq!(old.headers()["deprecation"], "@1795392000");
    assert_eq!(
        old.headers()["link"],
        "</v1/queues/mail/dead-letters>; rel=\"successor-version\""
    );
    let old: serde_json::Value = old.json().await.expect("json");
    assert_eq!(old[0]["item"], dead.body[0]["item"], "{old:?}");
    let item = dead.body[0]["item"].as_str().expect("item").to_string();
    assert_eq!(
        gate.post(&format!("/v1/queues/mail/dead-letters/{item}/replay"), None)
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    let again = take(&gate, "mail", "wait=0").await;
    assert_eq!(
        (again.status, again.body["deliveries"].as_u64()),
        (StatusCode::OK, Some(1)),
        "{again:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_taker_gets_an_item_as_soon_as_it_is_put_and_one_item_serves_one_taker() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let takers: Vec<_> = (0..3)
        .map(|_| {
            let gate = gate.clone();
            tokio::spawn(async move { take(&gate, "inbox", "wait=3s&mode=at-most-once").await })
        })
        .collect();
    let put_reply = put(&gate, "inbox", "", json!({"hello": "world"})).await;
    assert_eq!(put_reply.status, StatusCode::CREATED);
    let mut statuses = Vec::new();
    for taker in takers {
        statuses.push(
            within(Duration::from_secs(10), "a taker", taker)
                .await
                .expect("taker")
                .status,
        );
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == StatusCode::OK).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == StatusCode::NO_CONTENT).count(),
        2,
        "{statuses:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_acknowledged_put_survives_a_kill_9_of_the_instance() {
    let zk = zookeeper().await;
    let first = Process::start(&zk.connect_string()).await;
    let http = common::http_client();
    let accepted = Arc::new(Mutex::new(BTreeSet::new()));
    let consumed = Arc::new(Mutex::new(BTreeSet::new()));

    // A producer and a consumer run against the first instance until it is killed.
    let (progress, mut acknowledged) = tokio::sync::watch::channel(0usize);
    let producer = {
        let (http, url, accepted) = (http.clone(), first.url.clone(), accepted.clone());
        tokio::spawn(async move {
            for id in 0u64.. {
                let sent = http
                    .post(format!("{url}/v1/queues/durable/items"))
                    .json(&json!({"id": id}))
                    .send()
                    .await;
                match sent {
                    Ok(response) if response.status() == StatusCode::CREATED => {
                        let count = {
                            let mut accepted = accepted.lock().unwrap();
                            accepted.insert(id);
                            accepted.len()
                        };
                        progress.send_replace(count);
                    }
                    _ => return, // the instance is gone
                }
            }
        })
    };
    let consumer = {
        let (http, url, consumed) = (http.clone(), first.url.clone(), consumed.clone());
        tokio::spawn(async move {
            loop {
                let Ok(response) = http
                    .post(format!("{url}/v1/queues/durable/take?wait=1s&ack_deadline=5s"))
                    .send()
                    .await
                else {
                    return;
                };
                if response.status() != StatusCode::OK {
                    continue;
                }
                let Ok(item) = response.json::<serde_json::Value>().await else {
                    return;
                };
                // Delivered once the consumer has it. Its ack may be cut off by the kill and
                // still have happened (the item is gone) or not (it comes back): either way it
                // was delivered, which is what is checked.
                consumed
                    .lock()
                    .unwrap()
                    .insert(item["body"]["id"].as_u64().expect("id"));
                let claim = item["claim"].as_str().unwrap_or_default().to_string();
                if http
                    .post(format!("{url}/v1/queues/durable/claims/{claim}/ack"))
                    .send()
                    .await
                    .is_err()
                {
                    return;
                }
            }
        })
    };
    // Kill it in the middle of the traffic, once 300 puts were acknowledged.
    within(
        Duration::from_secs(60),
        "300 acknowledged puts",
        acknowledged.wait_for(|n| *n >= 300),
    )
    .await
    .expect("the producer runs");
    let mut first = first;
    first.child.start_kill().expect("kill -9");
    first.child.wait().await.expect("reaped");
    within(Duration::from_secs(30), "the producer to notice", producer)
        .await
        .expect("producer");
    within(Duration::from_secs(30), "the consumer to notice", consumer)
        .await
        .expect("consumer");

    // A new instance: everything acknowledged and not yet consumed is still delivered (items
    // claimed by the dead instance come back once its session expires).
    let mut second = Process::start(&zk.connect_string()).await;
    let accepted = std::mem::take(&mut *accepted.lock().unwrap());
    let mut delivered = std::mem::take(&mut *consumed.lock().unwrap());
    let url = second.url.clone();
    let drained = within(Duration::from_secs(120), "draining the queue", async {
        while !accepted.is_subset(&delivered) {
            let response = match http
                .post(format!("{url}/v1/queues/durable/take?wait=5s&ack_deadline=30s"))
                .send()
                .await
            {
                Ok(response) => response,
                Err(err) => return Err(err),
            };
            if response.status() != StatusCode::OK {
                continue;
            }
            let item: serde_json::Value = response.json().await.expect("item");
            let claim = item["claim"].as_str().expect("claim");
            let ack = match http
                .post(format!("{url}/v1/queues/durable/claims/{claim}/ack"))
                .send()
                .await
            {
                Ok(ack) => ack,
                Err(err) => return Err(err),
            };
            assert_eq!(ack.status(), StatusCode::NO_CONTENT);
            delivered.insert(item["body"]["id"].as_u64().expect("id"));
        }
        Ok(())
    })
    .await;
    if let Err(err) = drained {
        panic!("the second instance failed: {err}; {}", second.diagnose());
    }
    assert!(accepted.len() >= 300);
    assert!(accepted.is_subset(&delivered), "an acknowledged put was lost");
}

/// A claim is ZooKeeper's, not its instance's: acknowledged or given back through another
/// instance (no hand-off, no shared secret), and it outlives a `kill -9` of the instance that
/// made it: acknowledged through a survivor before its deadline it is gone for good; left alone
/// it comes back at its deadline, not before, and not at the instance's death.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_settled_through_any_instance_and_outlives_the_one_that_made_it() {
    use reqwest::Method;
    let zk = zookeeper().await;
    let mut a = Process::start(&zk.connect_string()).await;
    let b = Process::start(&zk.connect_string()).await;
    for i in 0..4 {
        let (status, put) = a
            .call(Method::POST, "/v1/queues/outliving/items", Some(json!({"n": i})))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{put}");
    }
    let take = |deadline: &'static str| {
        let a = &a;
        async move {
            let (status, item) = a
                .call(
                    Method::POST,
                    &format!("/v1/queues/outliving/take?ack_deadline={deadline}"),
                    None,
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{item}");
            item
        }
    };
    let (acked_elsewhere, nacked_elsewhere) = (take("60s").await, take("60s").await);
    let (acked_after_kill, left_alone) = (take("60s").await, take("8s").await);
    let claim = |item: &serde_json::Value| item["claim"].as_str().expect("claim").to_string();

    // Through B, which made neither: acknowledged (and again: answered as the first), given back.
    let ack = format!("/v1/queues/outliving/claims/{}/ack", claim(&acked_elsewhere));
    for _ in 0..2 {
        let (status, body) = b.call(Method::POST, &ack, None).await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    }
    let nack = format!("/v1/queues/outliving/claims/{}/nack", claim(&nacked_elsewhere));
    let (status, body) = b.call(Method::POST, &nack, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (status, body) = a.call(Method::POST, &nack.replace("/nack", "/ack"), None).await;
    assert_eq!(status, StatusCode::GONE, "given back through B, not A's to ack: {body}");
    let (status, again) = b
        .call(Method::POST, "/v1/queues/outliving/take?ack_deadline=60s", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(
        again["item"], nacked_elsewhere["item"],
        "the item given back comes first"
    );
    assert_eq!(again["deliveries"], 2);
    let (status, body) = a
        .call(
            Method::POST,
            &format!("/v1/queues/outliving/claims/{}/ack", claim(&again)),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");

    // A dies with two claims standing: neither comes back at its death.
    a.kill().await;
    let (status, body) = b
        .call(
            Method::POST,
            &format!("/v1/queues/outliving/claims/{}/ack", claim(&acked_after_kill)),
            None,
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NO_CONTENT,
        "acknowledged after its instance died: {body}"
    );
    // The other comes back when its deadline passes (timed by B once A is gone), not before.
    let (status, back) = b
        .call(
            Method::POST,
            "/v1/queues/outliving/take?wait=30s&ack_deadline=60s",
            None,
        )
        .await;
    let back_at = now_ms();
    assert_eq!(status, StatusCode::OK, "{back}");
    assert_eq!(back["item"], left_alone["item"], "{back}");
    assert_eq!(back["deliveries"], 2, "{back}");
    let deadline = ms_of(&left_alone["ack_deadline_at"]);
    assert!(
        back_at >= deadline,
        "delivered again {} ms before its deadline",
        deadline - back_at
    );
    let (status, body) = b
        .call(
            Method::POST,
            &format!("/v1/queues/outliving/claims/{}/ack", claim(&left_alone)),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::GONE, "past its deadline: {body}");
    let (status, body) = b
        .call(
            Method::POST,
            &format!("/v1/queues/outliving/claims/{}/ack", claim(&back)),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (_, state) = b.call(Method::GET, "/v1/queues/outliving", None).await;
    assert_eq!(
        (state["depth"].as_u64(), state["in_flight"].as_u64()),
        (Some(0), Some(0)),
        "{state}"
    );
}

#[tokio::test]
async fn bytes_text_and_json_come_back_as_they_went_in() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let raw = |body: Vec<u8>, content_type: &'static str| {
        let request = gate
            .http
            .post(format!("{}/v1/queues/mixed/items", gate.url))
            .header("Content-Type", content_type)
            .body(body);
        async move { Reply::read(request.send().await.expect("put")).await }
    };
    assert_eq!(
        raw(vec![0, 159, 146, 150], "application/octet-stream").await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        raw(b"plain words".to_vec(), "text/plain").await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        raw(br#"{"n":1}"#.to_vec(), "application/json").await.status,
        StatusCode::CREATED
    );
    let bytes = take(&gate, "mixed", "mode=at-most-once&wait=0").await;
    assert_eq!(bytes.body["body_base64"], "AJ+Slg==", "{bytes:?}");
    let text = take(&gate, "mixed", "mode=at-most-once&wait=0").await;
    assert_eq!(text.body["text"], "plain words");
    let json = take(&gate, "mixed", "mode=at-most-once&wait=0").await;
    assert_eq!(json.body["body"], json!({"n": 1}));
}

/// The wall clock now, in ms since the Unix epoch.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

/// Parses a time the API wrote (RFC 3339, UTC) into ms since the Unix epoch.
fn ms_of(time: &serde_json::Value) -> i64 {
    let at = humantime::parse_rfc3339(time.as_str().expect("a time")).expect("RFC 3339");
    at.duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_item_is_never_taken_before_its_time_and_a_waiting_taker_wakes_for_it() {
    let zk = zookeeper_own().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let delayed = put(&gate, "later", "delay=2s", json!({"n": "delayed"})).await;
    assert_eq!(delayed.status, StatusCode::CREATED, "{delayed:?}");
    assert_eq!(
        put(&gate, "later", "", json!({"n": "now"})).await.status,
        StatusCode::CREATED
    );

    // The item put second comes first: the first is not due.
    let first = take(&gate, "later", "wait=0&mode=at-most-once").await;
    assert_eq!(first.body["body"], json!({"n": "now"}), "{first:?}");
    assert_eq!(take(&gate, "later", "wait=0").await.status, StatusCode::NO_CONTENT);
    // It waits in the queue, counted in the depth, saying when it may be taken.
    let state = gate.get("/v1/queues/later").await;
    assert_eq!(state.body["depth"], 1, "{state:?}");
    let due = ms_of(&state.body["head"][0]["not_before"]);
    assert!(due > now_ms(), "{state:?}");

    // A taker that waits gets it when it comes due, and not before; while it waits, it does
    // not ask ZooKeeper again and again: one timer, then one look.
    let packets_before = common::packets_received(zk.client_port()).await;
    let taken = take(&gate, "later", "wait=20s&mode=at-most-once").await;
    let taken_at = now_ms();
    let packets = common::packets_received(zk.client_port()).await - packets_before;
    assert_eq!(taken.body["body"], json!({"n": "delayed"}), "{taken:?}");
    assert!(taken_at >= due, "taken {} ms before its time", due - taken_at);
    assert!(taken_at < due + 1500, "the taker woke {} ms late", taken_at - due);
    // The looks (a listing of the items and of the claims, each time), the removal, and the
    // sessions' pings over two seconds came to 20 here; the same taker polling every 100 ms
    // came to 53.
    assert!(
        packets < 36,
        "{packets} packets reached ZooKeeper while one taker waited two seconds"
    );
}

#[tokio::test]
async fn delayed_items_keep_their_priority_and_a_nacked_one_comes_back_at_once() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let past = "2020-01-01T00:00:00Z";
    let soon = humantime::format_rfc3339_millis(std::time::SystemTime::now() + Duration::from_millis(800)).to_string();
    // A time past is now; a delayed item keeps its priority.
    assert_eq!(
        put(&gate, "jobs", "priority=60", json!("plain")).await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        put(&gate, "jobs", &format!("not_before={past}"), json!("past"))
            .await
            .status,
        StatusCode::CREATED
    );
    assert_eq!(
        put(&gate, "jobs", "priority=10&delay=1ms", json!("due")).await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        put(&gate, "jobs", &format!("priority=5&not_before={soon}"), json!("urgent"))
            .await
            .status,
        StatusCode::CREATED
    );
    // Due by now, the delayed item of priority 10 goes first; the one put for a time past was
    // stored as due at once (priority 50).
    // The listing is in (priority, put) order, delayed items with their time.
    let items = gate.get("/v1/queues/jobs/items").await;
    let listed: Vec<(serde_json::Value, bool)> = items
        .body
        .as_array()
        .expect("items")
        .iter()
        .map(|i| (i["body"].clone(), i.get("not_before").is_some()))
        .collect();
    assert_eq!(
        listed,
        [
            (json!("urgent"), true),
            (json!("due"), true),
            (json!("past"), false),
            (json!("plain"), false)
        ]
    );
    for expected in ["due", "past"] {
        let taken = take(&gate, "jobs", "wait=0&mode=at-most-once").await;
        assert_eq!(taken.body["body"], expected, "{taken:?}");
    }
    // The urgent one is not due yet: the plain one comes before it...
    let second = take(&gate, "jobs", "wait=0&ack_deadline=30s").await;
    assert_eq!(second.body["body"], "plain", "{second:?}");
    let done = gate
        .post(&format!("/v1/queues/jobs/claims/{}/ack", second.str("claim")), None)
        .await;
    assert_eq!(done.status, StatusCode::NO_CONTENT, "{done:?}");
    // ...and once due it is taken, claimed at least once; given back, it is delivered again
    // at once (its time has passed).
    let urgent = take(&gate, "jobs", "wait=10s&ack_deadline=30s").await;
    assert_eq!(urgent.body["body"], "urgent", "{urgent:?}");
    assert!(now_ms() >= ms_of(&json!(soon)));
    let nack = gate
        .post(&format!("/v1/queues/jobs/claims/{}/nack", urgent.str("claim")), None)
        .await;
    assert_eq!(nack.status, StatusCode::NO_CONTENT);
    let again = take(&gate, "jobs", "wait=0&ack_deadline=30s").await;
    assert_eq!(
        (again.body["body"].clone(), again.body["deliveries"].clone()),
        (json!("urgent"), json!(2)),
        "{again:?}"
    );
}

/// `max_items` claims several items in one take, in queue order; a batch ack removes those
/// still held in one call and says which were not; asking again answers the same.
#[tokio::test]
async fn a_batch_take_claims_items_in_order_and_a_batch_ack_settles_each() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    for n in 0..25 {
        assert_eq!(
            put(&gate, "batch", "", json!({ "n": n })).await.status,
            StatusCode::CREATED
        );
    }
    let taken = take(&gate, "batch", "wait=0&max_items=10&ack_deadline=60s").await;
    assert_eq!(taken.status, StatusCode::OK, "{taken:?}");
    let items = taken.body["items"].as_array().expect("a batch").clone();
    let numbers: Vec<u64> = items.iter().map(|i| i["body"]["n"].as_u64().expect("n")).collect();
    assert_eq!(numbers, (0..10).collect::<Vec<_>>(), "the first ten, in order");
    let claims: Vec<String> = items
        .iter()
        .map(|i| i["claim"].as_str().expect("claim").to_string())
        .collect();
    assert_eq!(claims.iter().collect::<BTreeSet<_>>().len(), 10, "a claim each");
    assert_eq!(gate.get("/v1/queues/batch").await.body["in_flight"], 10);

    // One given back first: the batch acknowledges the other nine and says so of that one.
    let nacked = gate
        .post(&format!("/v1/queues/batch/claims/{}/nack", claims[3]), None)
        .await;
    assert_eq!(nacked.status, StatusCode::NO_CONTENT);
    let acked = gate
        .post("/v1/queues/batch/claims/ack", Some(json!({ "claims": claims })))
        .await;
    assert_eq!(acked.status, StatusCode::OK, "{acked:?}");
    let mut expected: Vec<String> = claims.clone();
    let lost = expected.remove(3);
    let mut said: Vec<String> = serde_json::from_value(acked.body["acked"].clone()).expect("acked");
    said.sort();
    expected.sort();
    assert_eq!(said, expected);
    assert_eq!(acked.body["lost"][0]["claim"], lost.as_str());
    assert!(
        acked.body["lost"][0]["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("given back"),
        "{acked:?}"
    );
    let state = gate.get("/v1/queues/batch").await;
    assert_eq!(
        (state.body["depth"].as_u64(), state.body["in_flight"].as_u64()),
        (Some(16), Some(0))
    );

    // A retry after a lost reply: the same answer, nothing else removed.
    let again = gate
        .post("/v1/queues/batch/claims/ack", Some(json!({ "claims": claims })))
        .await;
    assert_eq!(again.body["acked"].as_array().map(Vec::len), Some(9), "{again:?}");
    assert_eq!(gate.get("/v1/queues/batch").await.body["depth"], 16);

    // The rest in batches: the given-back item first (it is first in order), then the others.
    let mut rest = Vec::new();
    loop {
        let taken = take(&gate, "batch", "wait=0&max_items=7&mode=at-most-once").await;
        if taken.status == StatusCode::NO_CONTENT {
            break;
        }
        let items = taken.body["items"].as_array().expect("a batch").clone();
        assert!((1..=7).contains(&items.len()), "{taken:?}");
        rest.extend(items.iter().map(|i| i["body"]["n"].as_u64().expect("n")));
    }
    let mut expected_rest = vec![3];
    expected_rest.extend(10..25);
    assert_eq!(rest, expected_rest);
}

/// A take with no wait right after a put gets that item, every time: the answer "nothing" is
/// only given once the instance's view of the queue has caught up with ZooKeeper.
#[tokio::test]
async fn a_put_item_is_taken_by_the_next_take_without_wait_every_time() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    for n in 0..300 {
        assert_eq!(
            put(&gate, "next", "", json!({ "n": n })).await.status,
            StatusCode::CREATED
        );
        let taken = take(&gate, "next", "wait=0&mode=at-most-once").await;
        assert_eq!(
            (taken.status, taken.body["body"]["n"].as_u64()),
            (StatusCode::OK, Some(n)),
            "take {n}: {taken:?}"
        );
    }
    // Put by another ZooKeeper client (a kazoo or Curator producer): the same.
    let producer = common::zk_client(&zk.connect_string()).await;
    let sequential = zookeeper_client::CreateMode::PersistentSequential.with_acls(zookeeper_client::Acls::anyone_all());
    for n in 0..300 {
        producer
            .create(
                "/zkgate/queues/next/items/queue-",
                n.to_string().as_bytes(),
                &sequential,
            )
            .await
            .expect("create an item");
        let taken = take(&gate, "next", "wait=0&mode=at-most-once").await;
        assert_eq!(
            (taken.status, taken.body["text"].as_str()),
            (StatusCode::OK, Some(n.to_string().as_str())),
            "take {n}: {taken:?}"
        );
    }
}

/// Taking and acknowledging an item costs ZooKeeper three requests, however many items wait:
/// the takers on an instance share one watched view of the queue instead of each listing it,
/// read only the items they claim, and an acknowledgement needs no read.
#[tokio::test]
async fn taking_an_item_reads_only_that_item_however_long_the_queue() {
    let zk = zookeeper_own().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let port = zk.client_port();
    for n in 0..2000 {
        let put = gate.post("/v1/queues/long/items", Some(json!({ "n": n }))).await;
        assert_eq!(put.status, StatusCode::CREATED);
    }
    // The view is made (one listing) by the first take.
    let first = take(&gate, "long", "wait=0&ack_deadline=60s").await;
    let ack = gate
        .post(&format!("/v1/queues/long/claims/{}/ack", first.str("claim")), None)
        .await;
    assert_eq!(ack.status, StatusCode::NO_CONTENT);
    let before = common::packets_received(port).await;
    const ITEMS: u64 = 200;
    for n in 1..=ITEMS {
        let taken = take(&gate, "long", "wait=0&ack_deadline=60s").await;
        assert_eq!(taken.body["body"]["n"].as_u64(), Some(n), "{taken:?}");
        let ack = gate
            .post(&format!("/v1/queues/long/claims/{}/ack", taken.str("claim")), None)
            .await;
        assert_eq!(ack.status, StatusCode::NO_CONTENT);
    }
    // The `mntr` request itself and session pings come on top: allow half a request an item.
    let per_item = (common::packets_received(port).await - before) as f64 / ITEMS as f64;
    assert!(per_item < 3.5, "{per_item:.2} ZooKeeper requests per take + ack");
    assert_eq!(gate.get("/v1/queues/long").await.body["depth"], 2000 - 1 - ITEMS);
}

/// Each queue taken from keeps a view (and a ZooKeeper watch) on the instance a while after its
/// last taker; past the instance's bound on lingering topics, a view goes with its last taker.
#[tokio::test]
async fn views_of_queues_nobody_takes_from_are_bounded() {
    let zk = zookeeper().await;
    let mut config = common::test_config(&zk.connect_string());
    config.max_lingering_topics = 2;
    let gate = Gate::start_with(config).await;
    for q in 0..12 {
        let taken = take(&gate, &format!("idle-{q}"), "wait=0").await;
        assert_eq!(taken.status, StatusCode::NO_CONTENT);
    }
    within(Duration::from_secs(10), "views past the bound to go", async {
        while gate.running.state.queues.mirrors() > 2 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // Those within it linger (their 30 s are not up): views are kept, only bounded.
    assert_eq!(gate.running.state.queues.mirrors(), 2);
    // The lingering ones still serve (and a new taker revives nothing it need not).
    assert_eq!(
        put(&gate, "idle-11", "", json!({ "n": 1 })).await.status,
        StatusCode::CREATED
    );
    let taken = take(&gate, "idle-11", "wait=0&mode=at-most-once").await;
    assert_eq!(taken.body["body"]["n"], 1, "{taken:?}");
}
