//! The bus on fed topics, without ZooKeeper.

use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;

use super::*;

/// Events on ZooKeeper that never answers: the bus itself needs none for fed topics. Topics
/// end with their last subscriber (lingering is tested on its own).
fn events() -> Events {
    events_with(EventSettings {
        linger: Duration::ZERO,
        ..EventSettings::default()
    })
}

fn events_with(settings: EventSettings) -> Events {
    let zk = ZkSession::start(
        "127.0.0.1:1",
        "/zkgate",
        Duration::from_secs(10),
        crate::zk::security::ZkSecurity::default(),
    );
    Events::new(zk.clone(), ExistsWatches::new(zk), settings)
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
    let mut subscription = events.subscribe("t", feed, None).await;
    let first = within(subscription.next()).await.expect("state");
    assert_eq!((first.kind, first.position.seq), ("state", 1));
    assert_eq!(*first.state, json!(0));
    for n in 1..=3 {
        send.send(n).expect("feed");
    }
    for n in 1..=3u64 {
        let event = within(subscription.next()).await.expect("event");
        assert_eq!(
            (event.kind, event.position.seq, (*event.state).clone(), event.zxid),
            ("n", n + 1, json!(n), Some(n as i64))
        );
    }
    // A second subscriber joins the live topic: it starts with the state as it is now.
    let mut late = events.subscribe("t", fed().0, None).await;
    let first = within(late.next()).await.expect("state");
    assert_eq!(
        (first.kind, first.position.seq, (*first.state).clone()),
        ("state", 4, json!(3))
    );
    assert_eq!(
        first.position,
        subscription.position(),
        "the same topic, the same place"
    );
    assert_eq!(events.topics(), 1, "one topic however many subscribe");
}

#[tokio::test]
async fn a_subscriber_that_falls_behind_gets_the_state_again_not_a_gap() {
    let events = events();
    let (feed, send, _) = fed();
    let mut slow = events.subscribe("t", feed, None).await;
    let mut fast = events.subscribe("t", fed().0, None).await;
    within(slow.next()).await.expect("state");
    within(fast.next()).await.expect("state");
    let total = EventSettings::default().backlog as u64 + 10;
    for n in 1..=total {
        send.send(n).expect("feed");
        // The fast one keeps up.
        assert_eq!(*within(fast.next()).await.expect("event").state, json!(n));
    }
    let resync = within(slow.next()).await.expect("resync");
    assert_eq!((resync.kind, resync.reason), ("resync", Some("fell_behind")));
    assert_eq!(
        (resync.position.seq, (*resync.state).clone()),
        (total + 1, json!(total)),
        "the latest state"
    );
    send.send(total + 1).expect("feed");
    let next = within(slow.next()).await.expect("event");
    assert_eq!(next.position.seq, total + 2, "consecutive after the resync");
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
    let mut slow = events.subscribe("big", feed, None).await;
    let mut fast = events.subscribe("big", fed().0, None).await;
    within(slow.next()).await.expect("state");
    within(fast.next()).await.expect("state");
    let large = BACKLOG_BYTES / 3;
    let backlog = EventSettings::default().backlog;
    for n in 0..backlog {
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
            .starts_with(&format!("{:02}", backlog - 1))
    );
}

#[tokio::test]
async fn a_topic_ends_with_its_last_subscriber() {
    let events = events();
    let (feed, _send, mut ended) = fed();
    let first = events.subscribe("t", feed, None).await;
    let second = events.subscribe("t", fed().0, None).await;
    drop(first);
    assert_eq!(events.topics(), 1, "still followed by the second");
    drop(second);
    within(ended.recv()).await.expect("the feed ended");
    assert_eq!(events.topics(), 0);
}

/// Sends `n` to the feed and waits until the topic has published it (as seen by `watcher`).
async fn publish(send: &mpsc::UnboundedSender<u64>, watcher: &mut Subscription, n: u64) {
    send.send(n).expect("feed");
    let event = within(watcher.next()).await.expect("event");
    assert_eq!(*event.state, json!(n));
}

#[tokio::test]
async fn a_subscriber_resumes_after_its_position_without_the_state() {
    let events = events();
    let (feed, send, _) = fed();
    // A watcher keeps the topic live while the other subscriber is away.
    let mut watcher = events.subscribe("t", feed, None).await;
    within(watcher.next()).await.expect("state");
    let mut away = events.subscribe("t", fed().0, None).await;
    within(away.next()).await.expect("state");
    publish(&send, &mut watcher, 1).await;
    let taken = within(away.next()).await.expect("event");
    let position = away.position();
    assert_eq!(taken.position, position);
    drop(away);
    for n in 2..=4 {
        publish(&send, &mut watcher, n).await;
    }
    let mut back = events.subscribe("t", fed().0, Some(position)).await;
    for n in 2..=4u64 {
        let event = within(back.next()).await.expect("missed event");
        assert_eq!(
            (event.kind, event.position.seq, (*event.state).clone()),
            ("n", n + 1, json!(n))
        );
    }
    // Resuming at the latest position: nothing to replay, and no state either.
    let mut current = events.subscribe("t", fed().0, Some(back.position())).await;
    publish(&send, &mut watcher, 5).await;
    let next = within(current.next()).await.expect("event");
    assert_eq!((next.kind, next.position.seq), ("n", 6), "the next change, not a state");
}

#[tokio::test]
async fn a_resume_past_the_backlog_or_from_another_incarnation_resyncs() {
    let events = events_with(EventSettings {
        backlog: 4,
        linger: Duration::ZERO,
        ..EventSettings::default()
    });
    let (feed, send, _) = fed();
    let mut watcher = events.subscribe("t", feed, None).await;
    let first = within(watcher.next()).await.expect("state");
    for n in 1..=10 {
        publish(&send, &mut watcher, n).await;
    }
    for since in [
        first.position,
        Position {
            epoch: first.position.epoch + 1,
            seq: 11,
        },
        Position {
            epoch: first.position.epoch,
            seq: 99,
        },
    ] {
        let mut late = events.subscribe("t", fed().0, Some(since)).await;
        let resync = within(late.next()).await.expect("resync");
        assert_eq!(
            (resync.kind, resync.reason, resync.position.seq, (*resync.state).clone()),
            ("resync", Some("cannot_resume"), 11, json!(10)),
            "from {since}"
        );
    }
}

#[tokio::test]
async fn a_topic_lingers_for_a_subscriber_that_comes_back_then_ends() {
    let events = events_with(EventSettings {
        linger: Duration::from_millis(300),
        max_lingering: 1,
        ..EventSettings::default()
    });
    let (feed, send, mut ended) = fed();
    let mut first = events.subscribe("t", feed, None).await;
    within(first.next()).await.expect("state");
    let position = first.position();
    drop(first);
    // Nobody listens, but the topic still follows its source, and keeps the events.
    send.send(1).expect("feed");
    assert_eq!(events.lingering(), 1);
    let mut back = events.subscribe("t", fed().0, Some(position)).await;
    let event = within(back.next()).await.expect("the event published while away");
    assert_eq!((event.kind, (*event.state).clone()), ("n", json!(1)));
    assert_eq!(events.lingering(), 0, "live again");
    // A second topic finds no lingering place free once the first lingers again: it ends at
    // once, while the first ends after its time.
    let (other, _other_send, mut other_ended) = fed();
    let second = events.subscribe("u", other, None).await;
    drop(back);
    drop(second);
    within(other_ended.recv())
        .await
        .expect("the second topic ended at once");
    assert_eq!(events.topics(), 1, "the first still lingers");
    within(ended.recv()).await.expect("the first ended after lingering");
    assert_eq!((events.topics(), events.lingering()), (0, 0));
}
