//! WebSocket push: a hundred sockets observing one election each see the same sequence of
//! leaders, with increasing terms and sequence numbers, ending with "no leader".

use crate::common;

use std::time::Duration;

use common::{Gate, within, zookeeper};
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn next_message(socket: &mut Socket) -> Value {
    loop {
        let message = within(Duration::from_secs(20), "a socket message", socket.next())
            .await
            .expect("open")
            .expect("message");
        if let Message::Text(text) = message {
            return serde_json::from_str(&text).expect("JSON event");
        }
    }
}

/// Reads until a leadership change (`leader` or `no_leader`); returns it and the sequence
/// numbers seen on the way.
async fn next_leadership(socket: &mut Socket, seqs: &mut Vec<u64>) -> Value {
    loop {
        let event = next_message(socket).await;
        seqs.push(event["seq"].as_u64().expect("seq"));
        if event["type"] == "leader" || event["type"] == "no_leader" {
            return event;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_sockets_see_the_same_leaders_with_increasing_terms() {
    let zk = zookeeper().await;
    let gate = std::sync::Arc::new(Gate::start(&zk.connect_string()).await);
    let url = format!("ws://{}/v1/elections/jobs/observe", gate.running.addr);
    let mut sockets = Vec::new();
    for _ in 0..100 {
        let (mut socket, _) = tokio_tungstenite::connect_async(&url).await.expect("connect");
        let first = next_message(&mut socket).await;
        assert_eq!(
            (first["type"].as_str(), first["state"]["leader"].clone()),
            (Some("state"), Value::Null),
            "{first}"
        );
        sockets.push(socket);
    }
    let mut watcher_seqs = Vec::new();

    // Three candidates lead in turn; the test moves on once the first socket has seen each.
    let a = gate.post("/v1/elections/jobs/campaign?wait=5s", None).await;
    assert_eq!(a.status, StatusCode::OK);
    let queued: Vec<_> = (0..2)
        .map(|_| {
            let gate = gate.clone();
            async move { gate.post("/v1/elections/jobs/campaign?wait=0", None).await }
        })
        .collect();
    let mut candidates = Vec::new();
    for candidate in queued {
        let reply = candidate.await;
        assert_eq!(reply.status, StatusCode::ACCEPTED);
        candidates.push(reply);
    }
    let mut expected = vec![a.i64("term")];
    assert_eq!(
        next_leadership(&mut sockets[0], &mut watcher_seqs).await["state"]["leader"]["term"],
        json!(expected[0])
    );
    let mut leading = a;
    for next in candidates {
        let lease = next.body["lease"]["id"].as_str().expect("lease").to_string();
        let waiting = {
            let gate = gate.clone();
            tokio::spawn(async move {
                gate.post("/v1/elections/jobs/campaign?wait=20s", Some(json!({"lease": lease})))
                    .await
            })
        };
        let resigned = gate
            .delete(&format!("/v1/elections/jobs/candidates/{}", leading.str("handle")))
            .await;
        assert_eq!(resigned.status, StatusCode::NO_CONTENT);
        leading = within(Duration::from_secs(20), "the next leader", waiting)
            .await
            .expect("campaign");
        assert_eq!(leading.status, StatusCode::OK, "{leading:?}");
        expected.push(leading.i64("term"));
        let seen = next_leadership(&mut sockets[0], &mut watcher_seqs).await;
        assert_eq!(seen["state"]["leader"]["term"], json!(leading.i64("term")), "{seen}");
    }
    gate.delete(&format!("/v1/elections/jobs/candidates/{}", leading.str("handle")))
        .await;
    assert_eq!(
        next_leadership(&mut sockets[0], &mut watcher_seqs).await["type"],
        "no_leader"
    );
    assert!(expected.windows(2).all(|w| w[0] < w[1]), "terms increase: {expected:?}");

    // Every other socket saw exactly the same leaders, in order, ending with no leader.
    for socket in sockets.iter_mut().skip(1) {
        let mut seqs = Vec::new();
        let mut terms = Vec::new();
        loop {
            let event = next_leadership(socket, &mut seqs).await;
            if event["type"] == "no_leader" {
                break;
            }
            terms.push(event["state"]["leader"]["term"].as_i64().expect("term"));
        }
        assert_eq!(terms, expected);
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "sequence numbers increase: {seqs:?}"
        );
    }
    assert!(watcher_seqs.windows(2).all(|w| w[0] < w[1]));
}

async fn send(socket: &mut Socket, message: Value) {
    use futures::SinkExt;
    socket
        .send(Message::Text(message.to_string().into()))
        .await
        .expect("send");
}

#[tokio::test]
async fn one_socket_subscribes_to_a_lock_and_an_election_and_bad_messages_get_errors() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{}/v1/ws", gate.running.addr))
        .await
        .expect("connect");

    // Malformed messages and unknown topics get an error; the socket stays up.
    send(&mut socket, json!("hello")).await;
    assert_eq!(
        next_message(&mut socket).await["type"],
        "urn:zkgate:problem:malformed-message"
    );
    // A binary message too, saying what to send instead.
    {
        use futures::SinkExt;
        let request = json!({"op": "unsubscribe", "id": "x"}).to_string();
        socket
            .send(Message::Binary(request.into_bytes().into()))
            .await
            .expect("send");
    }
    let error = next_message(&mut socket).await;
    assert_eq!(error["type"], "urn:zkgate:problem:malformed-message", "{error}");
    assert!(error["detail"].as_str().unwrap().contains("text message"), "{error}");
    send(
        &mut socket,
        json!({"op": "subscribe", "id": "q", "topic": {"nothing": "x"}}),
    )
    .await;
    assert_eq!(
        next_message(&mut socket).await["type"],
        "urn:zkgate:problem:malformed-message"
    );
    send(
        &mut socket,
        json!({"op": "subscribe", "id": "q", "topic": {"lock": ".."}}),
    )
    .await;
    assert_eq!(
        next_message(&mut socket).await["type"],
        "urn:zkgate:problem:invalid-topic"
    );
    send(&mut socket, json!({"op": "unsubscribe", "id": "never"})).await;
    assert_eq!(
        next_message(&mut socket).await["type"],
        "urn:zkgate:problem:unknown-subscription"
    );

    send(
        &mut socket,
        json!({"op": "subscribe", "id": "L", "topic": {"lock": "orders"}}),
    )
    .await;
    let first = next_message(&mut socket).await;
    assert_eq!(
        (
            first["id"].as_str(),
            first["type"].as_str(),
            first["state"]["holder"].clone()
        ),
        (Some("L"), Some("state"), Value::Null),
        "{first}"
    );
    send(
        &mut socket,
        json!({"op": "subscribe", "id": "L", "topic": {"lock": "orders"}}),
    )
    .await;
    assert_eq!(
        next_message(&mut socket).await["type"],
        "urn:zkgate:problem:duplicate-subscription"
    );

    // The lock is granted, then a waiter queues, then it is released to the waiter.
    let held = gate.post("/v1/locks/orders/acquire?wait=0", None).await;
    let granted = next_message(&mut socket).await;
    assert_eq!(
        (granted["id"].as_str(), granted["type"].as_str()),
        (Some("L"), Some("granted")),
        "{granted}"
    );
    assert_eq!(
        granted["state"]["holder"]["fencing_token"].as_i64(),
        Some(held.i64("fencing_token"))
    );
    let waiter = gate
        .post("/v1/locks/orders/acquire?wait=0&keep_queued=true", None)
        .await;
    assert_eq!(waiter.status, StatusCode::ACCEPTED);
    let queued = next_message(&mut socket).await;
    assert_eq!(
        (queued["type"].as_str(), queued["state"]["waiter_count"].as_u64()),
        (Some("waiters"), Some(1)),
        "{queued}"
    );
    // Asking the holder to give the lock up is an event too (it is written into the
    // holder's node, which the topic watches).
    let revoked = gate
        .post(
            "/v1/locks/orders/revoke",
            Some(json!({"by": "ops", "reason": "deploy"})),
        )
        .await;
    assert_eq!(revoked.status, StatusCode::ACCEPTED, "{revoked:?}");
    let asked = next_message(&mut socket).await;
    assert_eq!(
        (
            asked["type"].as_str(),
            asked["state"]["holder"]["revocation"]["by"].as_str(),
            asked["state"]["holder"]["revocation"]["reason"].as_str()
        ),
        (Some("revocation"), Some("ops"), Some("deploy")),
        "{asked}"
    );
    gate.release("orders", &held.str("handle")).await;
    let passed = next_message(&mut socket).await;
    assert_eq!(passed["type"], "granted", "{passed}");
    assert!(passed["seq"].as_u64() > asked["seq"].as_u64() && queued["seq"].as_u64() > granted["seq"].as_u64());

    // Limits: at most 64 subscriptions on one socket.
    for i in 1..64 {
        send(
            &mut socket,
            json!({"op": "subscribe", "id": format!("e{i}"), "topic": {"election": format!("e{i}")}}),
        )
        .await;
    }
    send(
        &mut socket,
        json!({"op": "subscribe", "id": "one-too-many", "topic": {"election": "x"}}),
    )
    .await;
    let mut refused = false;
    for _ in 0..64 {
        let message = next_message(&mut socket).await;
        if message["type"] == "urn:zkgate:problem:too-many-subscriptions" {
            refused = true;
            break;
        }
        assert_eq!(message["type"], "state", "{message}");
    }
    assert!(refused, "the 65th subscription is refused");
}

#[tokio::test]
async fn barrier_queue_and_group_topics_report_their_changes() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{}/v1/ws", gate.running.addr))
        .await
        .expect("connect");
    for (id, topic) in [
        ("B", json!({"barrier": "start"})),
        ("Q", json!({"queue": "jobs"})),
        ("G", json!({"group": "workers"})),
    ] {
        send(&mut socket, json!({"op": "subscribe", "id": id, "topic": topic})).await;
        let first = next_message(&mut socket).await;
        assert_eq!(
            (first["id"].as_str(), first["type"].as_str()),
            (Some(id), Some("state")),
            "{first}"
        );
    }

    assert_eq!(
        gate.call(reqwest::Method::PUT, "/v1/barriers/start", None).await.status,
        StatusCode::CREATED
    );
    let raised = next_message(&mut socket).await;
    assert_eq!(
        (raised["id"].as_str(), raised["type"].as_str()),
        (Some("B"), Some("raised")),
        "{raised}"
    );
    assert_eq!(gate.delete("/v1/barriers/start").await.status, StatusCode::NO_CONTENT);
    let lowered = next_message(&mut socket).await;
    assert_eq!(
        (lowered["id"].as_str(), lowered["type"].as_str()),
        (Some("B"), Some("lowered")),
        "{lowered}"
    );

    assert_eq!(
        gate.post("/v1/queues/jobs/items", Some(json!({"n": 1}))).await.status,
        StatusCode::CREATED
    );
    let depth = next_message(&mut socket).await;
    assert_eq!(
        (
            depth["id"].as_str(),
            depth["type"].as_str(),
            depth["state"]["depth"].as_u64()
        ),
        (Some("Q"), Some("available"), Some(1)),
        "{depth}"
    );

    assert_eq!(
        gate.call(reqwest::Method::PUT, "/v1/groups/workers/members/w1", None)
            .await
            .status,
        StatusCode::CREATED
    );
    let joined = next_message(&mut socket).await;
    assert_eq!(
        (
            joined["id"].as_str(),
            joined["type"].as_str(),
            joined["state"]["members"][0]["id"].clone()
        ),
        (Some("G"), Some("joined"), json!("w1")),
        "{joined}"
    );
}
