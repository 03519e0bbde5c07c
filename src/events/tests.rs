//! The bus on fed topics, without ZooKeeper.

use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;

use super::*;

/// Events on ZooKeeper that never answers: the bus itself needs none for fed topics.
fn events() -> Events {
    let zk = ZkSession::start(
        "127.0.0.1:1",
        "/zkgate",
        Duration::from_secs(10),
        crate::zk::security::ZkSecurity::default(),
    );
    Events::new(zk.clone(), ExistsWatches::new(zk))
}

/// A feed that publishes the state `0`, then each number sent on the channel as an event
/// `n`, until nobody listens (then it says so on `ended`).
fn fed() -> (Feed, mpsc::UnboundedSender<u64>, mpsc::UnboundedReceiver<()>) {
    let (send, mut receive) = mpsc::unbounded_channel::<u64>();
    let (ended, ended_rx) = mpsc::unbounded_channel();
    let feed = Feed(Box::new(move |publisher: Publisher| {
        Box::pin(async move {
            publisher.publish("state", json!(0), None);
            loop {
                tokio::select! {
                    Some(n) = receive.recv() => publisher.publish("n", json!(n), Some(n as i64)),
                    _ = publisher.idle() => break,
                }
            }
            let _ = ended.send(());
        })
    }));
    (feed, send, ended_rx)
}

async fn within<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(5), future)
        .await
        .expect("in time")
}

#[tokio::test]
async fn a_subscriber_gets_the_state_then_each_event_numbered() {
    let events = events();
    let (feed, send, _) = fed();
    let mut subscription = events.subscribe("t", feed).await;
    assert_eq!((subscription.first.kind, subscription.first.seq), ("state", 1));
    assert_eq!(*subscription.first.state, json!(0));
    for n in 1..=3 {
        send.send(n).expect("feed");
    }
    for n in 1..=3u64 {
        let event = within(subscription.next()).await.expect("event");
        assert_eq!(
            (event.kind, event.seq, (*event.state).clone(), event.zxid),
            ("n", n + 1, json!(n), Some(n as i64))
        );
    }
    // A second subscriber joins the live topic: it starts with the state as it is now.
    let late = events.subscribe("t", fed().0).await;
    assert_eq!(
        (late.first.kind, late.first.seq, (*late.first.state).clone()),
        ("state", 4, json!(3))
    );
    assert_eq!(events.topics(), 1, "one topic however many subscribe");
}

#[tokio::test]
async fn a_subscriber_that_falls_behind_gets_the_state_again_not_a_gap() {
    let events = events();
    let (feed, send, _) = fed();
    let mut slow = events.subscribe("t", feed).await;
    let mut fast = events.subscribe("t", fed().0).await;
    let total = BACKLOG as u64 + 10;
    for n in 1..=total {
        send.send(n).expect("feed");
        // The fast one keeps up.
        assert_eq!(*within(fast.next()).await.expect("event").state, json!(n));
    }
    let resync = within(slow.next()).await.expect("resync");
    assert_eq!((resync.kind, resync.reason), ("resync", Some("fell_behind")));
    assert_eq!(
        (resync.seq, (*resync.state).clone()),
        (total + 1, json!(total)),
        "the latest state"
    );
    send.send(total + 1).expect("feed");
    let next = within(slow.next()).await.expect("event");
    assert_eq!(next.seq, total + 2, "consecutive after the resync");
}

/// A feed of large states: the topic keeps what its byte bound allows of them (and always the
/// last one), not its whole backlog; a subscriber that did not take them in time resyncs.
#[tokio::test]
async fn large_states_are_kept_up_to_the_byte_bound() {
    let events = events();
    let (send, mut receive) = mpsc::unbounded_channel::<String>();
    let feed = Feed(Box::new(move |publisher: Publisher| {
        Box::pin(async move {
            publisher.publish("state", json!(""), None);
            loop {
                tokio::select! {
                    Some(text) = receive.recv() => publisher.publish("n", json!(text), None),
                    _ = publisher.idle() => break,
                }
            }
        })
    }));
    let mut slow = events.subscribe("big", feed).await;
    let mut fast = events.subscribe("big", fed().0).await;
    let large = BACKLOG_BYTES / 3;
    for n in 0..BACKLOG {
        send.send(format!("{n:02}{}", "x".repeat(large))).expect("feed");
        within(fast.next()).await.expect("event");
    }
    {
        let topic = events.topics.lock().unwrap().get("big").cloned().expect("live");
        let recent = topic.recent();
        assert!(
            recent.events.len() <= 3 && recent.bytes <= BACKLOG_BYTES + large + 1024,
            "{} events, {} bytes kept",
            recent.events.len(),
            recent.bytes
        );
    }
    let resync = within(slow.next()).await.expect("resync");
    assert_eq!(resync.reason, Some("fell_behind"));
    assert!(
        resync
            .state
            .as_str()
            .unwrap()
            .starts_with(&format!("{:02}", BACKLOG - 1))
    );
}

#[tokio::test]
async fn a_topic_ends_with_its_last_subscriber() {
    let events = events();
    let (feed, _send, mut ended) = fed();
    let first = events.subscribe("t", feed).await;
    let second = events.subscribe("t", fed().0).await;
    drop(first);
    assert_eq!(events.topics(), 1, "still followed by the second");
    drop(second);
    within(ended.recv()).await.expect("the feed ended");
    assert_eq!(events.topics(), 0);
}
