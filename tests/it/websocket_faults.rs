//! Honesty of the WebSocket under faults: after zkgate's ZooKeeper session expires, and
//! when a client stops reading until its queue overflows, subscribers get a `resync` with
//! the current state, never a silent gap; a silent client is closed with code 4000.

use crate::common;

use std::time::Duration;

use common::proxy::Proxy;
use common::ws::{Ws, assert_no_silent_gap};
use common::{Gate, expire_sessions, test_config, within, zookeeper};
use futures::{SinkExt, StreamExt};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn a_session_expiry_brings_a_resync_with_the_state_after_it() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let proxy = Proxy::start(&connect).await;
    let gate = Gate::start(&proxy.connect_string()).await;
    let mut ws = Ws::connect(gate.running.addr, "/v1/ws").await;

    let lease = gate.lease("60s").await;
    let held = gate.acquire("orders", &lease, "wait=0").await;
    assert_eq!(held.status, StatusCode::OK);
    ws.send(json!({"op": "subscribe", "id": "L", "topic": {"lock": "orders"}}));
    ws.send(json!({"op": "subscribe", "id": "R", "topic": {"znode": {"path": "kv", "watch": "recursive"}}}));
    let mut lock_events = vec![ws.next_for("L").await];
    let mut tree_events = vec![ws.next_for("R").await];
    assert_eq!(
        lock_events[0]["state"]["holder"]["fencing_token"],
        json!(held.i64("fencing_token"))
    );

    expire_sessions(&proxy, &connect, gate.sessions().await).await;

    // The watches went with the session: the resync says so, with the state after it (the
    // holder's lease outlives the session, so it holds on, with the same token).
    let resync = loop {
        let event = ws.next_for("L").await;
        lock_events.push(event.clone());
        if event["type"] == "resync" && event["reason"] == "session_expired" {
            break event;
        }
    };
    assert_eq!(
        resync["state"]["holder"]["fencing_token"],
        json!(held.i64("fencing_token")),
        "{resync}"
    );
    loop {
        let event = ws.next_for("R").await;
        tree_events.push(event.clone());
        if event["type"] == "resync" && event["reason"] == "session_expired" {
            break;
        }
    }

    // Changes after it arrive as events again, numbered on.
    gate.wait_generation(2).await;
    within(Duration::from_secs(20), "ready again", gate.running.state.wait_ready()).await;
    gate.release("orders", &held.str("handle")).await;
    let fresh = gate.lease("60s").await;
    assert_eq!(gate.acquire("orders", &fresh, "wait=0").await.status, StatusCode::OK);
    loop {
        let event = ws.next_for("L").await;
        lock_events.push(event.clone());
        if event["type"] == "granted" {
            break;
        }
    }
    let written = gate
        .http
        .put(format!("{}/v1/kv/after", gate.url))
        .body("x")
        .send()
        .await
        .expect("PUT");
    assert!(written.status().is_success());
    loop {
        let event = ws.next_for("R").await;
        tree_events.push(event.clone());
        if event["type"] == "created" && event["path"] == "kv/after" {
            break;
        }
    }
    assert_no_silent_gap(&lock_events);
    assert_no_silent_gap(&tree_events);
}

#[tokio::test]
async fn a_dropped_connection_brings_a_resync_when_it_comes_back() {
    let zk = zookeeper().await;
    let proxy = Proxy::start(&zk.connect_string()).await;
    let gate = Gate::start(&proxy.connect_string()).await;
    let mut ws = Ws::connect(gate.running.addr, "/v1/ws").await;
    ws.send(json!({"op": "subscribe", "id": "Q", "topic": {"queue": "jobs"}}));
    ws.send(json!({"op": "subscribe", "id": "R", "topic": {"znode": {"path": "queues", "watch": "recursive"}}}));
    let mut queue_events = vec![ws.next_for("Q").await];
    let mut tree_events = vec![ws.next_for("R").await];

    // Cut zkgate off ZooKeeper for less than its session timeout: the session survives, the
    // connection comes back, and whatever happened meanwhile is not replayed by ZooKeeper.
    let mut status = gate.running.state.zk().subscribe();
    common::drop_connection(&gate, &proxy).await;
    let generation = within(
        Duration::from_secs(20),
        "zkgate to reconnect",
        status.wait_for(|s| s.connection == zkgate::zk::session::Connection::Connected),
    )
    .await
    .expect("supervisor")
    .generation;
    assert_eq!(generation, 1, "the same session");
    for (id, events) in [("Q", &mut queue_events), ("R", &mut tree_events)] {
        loop {
            let event = ws.next_for(id).await;
            events.push(event.clone());
            if event["type"] == "resync" {
                assert_eq!(event["reason"], "reconnected", "{event}");
                break;
            }
        }
    }

    // Events flow again after the resync.
    let put = gate.post("/v1/queues/jobs/items", Some(json!({"n": 1}))).await;
    assert_eq!(put.status, StatusCode::CREATED);
    loop {
        let event = ws.next_for("Q").await;
        queue_events.push(event.clone());
        if event["type"] == "available" {
            break;
        }
    }
    assert_no_silent_gap(&queue_events);
    assert_no_silent_gap(&tree_events);
}

#[tokio::test]
async fn a_client_that_stops_reading_gets_a_resync_instead_of_a_gap() {
    let zk = zookeeper().await;
    let mut config = test_config(&zk.connect_string());
    config.ws_send_buffer = 4096;
    let gate = Gate::start_with(config).await;

    // A client with a small receive buffer, so that the server's writes block soon.
    let tcp = tokio::net::TcpSocket::new_v4().expect("socket");
    tcp.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let stream = tcp.connect(gate.running.addr).await.expect("connect");
    let (mut socket, _) = tokio_tungstenite::client_async(format!("ws://{}/v1/ws", gate.running.addr), stream)
        .await
        .expect("handshake");
    let subscribe = json!({"op": "subscribe", "id": "big", "topic": {"znode": {"path": "kv/big"}}});
    socket
        .send(Message::Text(subscribe.to_string().into()))
        .await
        .expect("send");
    let read = |message: Message| match message {
        Message::Text(text) => Some(serde_json::from_str::<Value>(&text).expect("JSON")),
        _ => None,
    };
    let first = loop {
        let message = within(Duration::from_secs(20), "the first state", socket.next()).await;
        if let Some(event) = read(message.expect("open").expect("message")) {
            break event;
        }
    };
    assert_eq!(first["type"], "state");

    // 64 values of 64 KiB while the client does not read: far more than the socket buffers
    // and the 4 KiB queue hold.
    let last = 63;
    for i in 0..=last {
        let value = format!("{i:04}-{}", "x".repeat(64 * 1024));
        let reply = gate
            .http
            .put(format!("{}/v1/kv/big", gate.url))
            .header("Content-Type", "text/plain")
            .body(value)
            .send()
            .await
            .expect("PUT");
        assert!(reply.status().is_success());
    }

    // Reading again, the client ends on the last value; on the way it was told it fell behind.
    let mut events = vec![first];
    loop {
        let message = within(Duration::from_secs(30), "the events", socket.next()).await;
        let Some(event) = read(message.expect("open").expect("message")) else {
            continue;
        };
        let done = event["state"]["data"]
            .as_str()
            .is_some_and(|d| d.starts_with(&format!("{last:04}-")));
        events.push(event);
        if done {
            break;
        }
    }
    let resyncs: Vec<_> = events.iter().filter(|e| e["type"] == "resync").collect();
    assert!(
        !resyncs.is_empty(),
        "the overflow was reported ({} events)",
        events.len()
    );
    assert!(resyncs.iter().all(|e| e["reason"] == "fell_behind"));
    assert_no_silent_gap(&events);
}

#[tokio::test]
async fn a_client_that_never_answers_pings_is_closed_with_code_4000() {
    let zk = zookeeper().await;
    let mut config = test_config(&zk.connect_string());
    config.ws_ping_interval = Duration::from_millis(200);
    config.ws_idle_timeout = Duration::from_secs(1);
    let gate = Gate::start_with(config).await;

    // A live client answers pings (the library does): it stays connected past the timeout,
    // which a subscription's answer shows after three timeouts' worth of pings.
    let mut live = Ws::connect(gate.running.addr, "/v1/ws").await;

    // A raw client that completes the handshake and then never writes again.
    let mut tcp = tokio::net::TcpStream::connect(gate.running.addr)
        .await
        .expect("connect");
    let handshake = format!(
        "GET /v1/ws HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        gate.running.addr
    );
    tcp.write_all(handshake.as_bytes()).await.expect("handshake");
    let mut bytes = Vec::new();
    let close_code = within(Duration::from_secs(10), "the close frame", async {
        let mut buf = [0u8; 1024];
        loop {
            let n = tcp.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed without a close frame");
            bytes.extend_from_slice(&buf[..n]);
            // Skip the HTTP answer, then walk the (unmasked, short) frames.
            let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let mut at = end + 4;
            while at + 2 <= bytes.len() {
                let (opcode, len) = (bytes[at] & 0x0f, (bytes[at + 1] & 0x7f) as usize);
                if at + 2 + len > bytes.len() {
                    break;
                }
                if opcode == 0x8 {
                    return u16::from_be_bytes([bytes[at + 2], bytes[at + 3]]);
                }
                at += 2 + len;
            }
        }
    })
    .await;
    assert_eq!(close_code, 4000);

    live.send(json!({"op": "subscribe", "id": "still", "topic": {"lock": "x"}}));
    assert_eq!(live.next_for("still").await["type"], "state");
}
