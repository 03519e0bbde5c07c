//! The event bus: topics that sockets subscribe to, each fed by one shared ZooKeeper watch.
//!
//! A topic (an election's leadership, say) has a current state read from ZooKeeper and a
//! stream of changes. The first subscriber starts the topic's task: it follows the shared
//! watch on the topic's znode, re-reads the state on each change, and publishes an event
//! when the state differs, numbered by the topic's own sequence. Subscribers get the current
//! state first, then the changes, in order; one that falls behind the bounded channel is told
//! so (and given the state again) rather than silently skipping events. When the last
//! subscriber goes the task ends. However many sockets watch a topic, ZooKeeper sees one
//! watch per instance.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::{broadcast, watch};

use crate::zk::session::ZkSession;
use crate::zk::watch::ExistsWatches;

/// Events kept for slow subscribers before they are told they fell behind.
const BACKLOG: usize = 256;

/// One event on a topic.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Event {
    /// The topic, e.g. `election:scheduler`.
    pub topic: String,
    /// The topic's sequence number: consecutive for one subscriber unless it fell behind.
    pub seq: u64,
    /// `state` (the first message), or what changed (e.g. `leader`, `no_leader`).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The topic's state after the change.
    pub state: serde_json::Value,
}

/// What a topic's reader makes of its znode: the state, and which kind of change it is
/// relative to the previous state.
pub trait Source: Send + Sync + 'static {
    /// The znode whose children the topic follows.
    fn path(&self) -> String;
    /// Reads the current state.
    fn read(&self, zk: ZkSession) -> futures::future::BoxFuture<'static, Option<serde_json::Value>>;
    /// The kind of event from `before` to `after` (both states), or `None` if nothing changed
    /// that subscribers care about.
    fn change(&self, before: &serde_json::Value, after: &serde_json::Value) -> Option<&'static str>;
}

impl Source for Box<dyn Source> {
    fn path(&self) -> String {
        (**self).path()
    }
    fn read(&self, zk: ZkSession) -> futures::future::BoxFuture<'static, Option<serde_json::Value>> {
        (**self).read(zk)
    }
    fn change(&self, before: &serde_json::Value, after: &serde_json::Value) -> Option<&'static str> {
        (**self).change(before, after)
    }
}

struct Topic {
    sender: broadcast::Sender<Event>,
    /// The last state published and its sequence number.
    last: Mutex<(u64, serde_json::Value)>,
    /// How many subscriptions are live; the topic's task ends when none is.
    listeners: watch::Sender<usize>,
}

/// The topics of this instance.
#[derive(Clone)]
pub struct Events {
    zk: ZkSession,
    watches: ExistsWatches,
    topics: Arc<Mutex<HashMap<String, Arc<Topic>>>>,
}

/// A subscription: the state when it began, then the events.
pub struct Subscription {
    pub first: Event,
    events: broadcast::Receiver<Event>,
    /// The sequence number of the last event handed out.
    seen: u64,
    topic: Arc<Topic>,
    name: String,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.topic.listeners.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Subscription {
    /// The next event after the ones already seen (the first state included); a `resync`
    /// with the current state if this subscriber fell behind; `None` when the topic ends.
    pub async fn next(&mut self) -> Option<Event> {
        loop {
            let event = match self.events.recv().await {
                Ok(event) => event,
                Err(broadcast::error::RecvError::Lagged(_)) => self.resync(),
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            // The receiver may hold events from before the first state was taken.
            if event.seq > self.seen || event.kind == "resync" {
                self.seen = event.seq;
                return Some(event);
            }
        }
    }

    /// The state now (after falling behind), as an event of kind `resync`.
    pub fn resync(&self) -> Event {
        let (seq, state) = self.topic.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Event {
            topic: self.name.clone(),
            seq,
            kind: "resync",
            state,
        }
    }
}

impl Events {
    /// The subscription to a topic already counted in: its current state, then its events.
    async fn finish_subscribe(&self, name: &str, topic: Arc<Topic>) -> Subscription {
        let events = topic.sender.subscribe();
        // The state as of the subscription: after it, every change arrives as an event.
        let (seq, state) = loop {
            let (seq, state) = topic.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if seq > 0 {
                break (seq, state);
            }
            // The topic's first read is in flight: wait for it (it is published as seq 1).
            let mut peek = topic.sender.subscribe();
            if topic.last.lock().unwrap_or_else(|e| e.into_inner()).0 == 0 {
                let _ = peek.recv().await;
            }
        };
        Subscription {
            first: Event {
                topic: name.to_string(),
                seq,
                kind: "state",
                state,
            },
            events,
            seen: seq,
            topic,
            name: name.to_string(),
        }
    }

    pub fn new(zk: ZkSession, watches: ExistsWatches) -> Events {
        Events {
            zk,
            watches,
            topics: Arc::default(),
        }
    }

    /// Subscribes to topic `name`, fed by `source` (used only if the topic is not live yet).
    pub async fn subscribe(&self, name: &str, source: impl Source) -> Subscription {
        let topic = {
            let mut topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
            match topics.get(name).filter(|t| *t.listeners.borrow() > 0) {
                None => {
                    let topic = Arc::new(Topic {
                        sender: broadcast::channel(BACKLOG).0,
                        last: Mutex::new((0, serde_json::Value::Null)),
                        listeners: watch::Sender::new(0),
                    });
                    topics.insert(name.to_string(), topic.clone());
                    // Counted before the task starts (a task that saw no listener would
                    // leave at once) and under the lock it takes to leave.
                    topic.listeners.send_modify(|n| *n += 1);
                    let first_state = source.read(self.zk.clone());
                    tokio::spawn(follow(
                        self.clone(),
                        name.to_string(),
                        topic.clone(),
                        source,
                        first_state,
                    ));
                    topic
                }
                Some(topic) => {
                    topic.listeners.send_modify(|n| *n += 1);
                    topic.clone()
                }
            }
        };
        self.finish_subscribe(name, topic).await
    }
}

/// The topic's task: publish the first state, then each change, until nobody listens.
async fn follow(
    events: Events,
    name: String,
    topic: Arc<Topic>,
    source: impl Source,
    first_state: futures::future::BoxFuture<'static, Option<serde_json::Value>>,
) {
    let mut watch = events.watches.subscribe_children(&source.path());
    let state = first_state.await.unwrap_or(serde_json::Value::Null);
    publish(&topic, &name, "state", state);
    let mut listeners = topic.listeners.subscribe();
    loop {
        tokio::select! {
            changed = watch.state.changed() => if changed.is_err() { break },
            _ = listeners.wait_for(|n| *n == 0) => {
                let mut topics = events.topics.lock().unwrap_or_else(|e| e.into_inner());
                if *topic.listeners.borrow() == 0 {
                    if topics.get(&name).is_some_and(|t| Arc::ptr_eq(t, &topic)) {
                        topics.remove(&name);
                    }
                    return;
                }
                continue;
            }
        }
        // A failed read is tried again: waiting for the next change instead could leave the
        // subscribers with a stale state for good.
        let mut after = source.read(events.zk.clone()).await;
        while after.is_none() && *topic.listeners.borrow() > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            after = source.read(events.zk.clone()).await;
        }
        let Some(after) = after else { continue };
        let before = topic.last.lock().unwrap_or_else(|e| e.into_inner()).1.clone();
        if let Some(kind) = source.change(&before, &after) {
            publish(&topic, &name, kind, after);
        }
    }
    let mut topics = events.topics.lock().unwrap_or_else(|e| e.into_inner());
    if topics.get(&name).is_some_and(|t| Arc::ptr_eq(t, &topic)) {
        topics.remove(&name);
    }
}

fn publish(topic: &Topic, name: &str, kind: &'static str, state: serde_json::Value) {
    let mut last = topic.last.lock().unwrap_or_else(|e| e.into_inner());
    last.0 += 1;
    last.1 = state.clone();
    let event = Event {
        topic: name.to_string(),
        seq: last.0,
        kind,
        state,
    };
    let _ = topic.sender.send(event);
}

/// Topics of the recipes that are plain znodes with children: a barrier (`raised` /
/// `lowered`), a double barrier (`entered` when all are in, `left` when all are out,
/// `participants`), a queue (`depth`), a group (`joined` / `left`).
pub mod sources {
    use futures::future::BoxFuture;
    use serde_json::{Value, json};

    use super::Source;
    use crate::zk::retry_on_loss;
    use crate::zk::session::ZkSession;

    /// Children of `path` (none if it does not exist) and whether it exists.
    async fn children(zk: &ZkSession, path: &str) -> Option<(bool, Vec<String>)> {
        let client = zk.connected().await.ok()?.client;
        match retry_on_loss(|| client.list_children(path)).await {
            Ok(mut names) => {
                names.sort();
                Some((true, names))
            }
            Err(zookeeper_client::Error::NoNode) => Some((false, Vec::new())),
            Err(_) => None,
        }
    }

    /// A barrier: up while its znode exists. Watches its parent's children.
    pub struct Barrier {
        pub parent: String,
        pub name: String,
    }

    impl Source for Barrier {
        fn path(&self) -> String {
            self.parent.clone()
        }
        fn read(&self, zk: ZkSession) -> BoxFuture<'static, Option<Value>> {
            let (parent, name) = (self.parent.clone(), self.name.clone());
            Box::pin(async move {
                let (_, names) = children(&zk, &parent).await?;
                Some(json!({ "up": names.contains(&name) }))
            })
        }
        fn change(&self, before: &Value, after: &Value) -> Option<&'static str> {
            (before["up"] != after["up"]).then(|| if after["up"] == true { "raised" } else { "lowered" })
        }
    }

    /// A queue's depth (items, in flight or not).
    pub struct Queue {
        pub items: String,
    }

    impl Source for Queue {
        fn path(&self) -> String {
            self.items.clone()
        }
        fn read(&self, zk: ZkSession) -> BoxFuture<'static, Option<Value>> {
            let items = self.items.clone();
            Box::pin(async move {
                let (_, names) = children(&zk, &items).await?;
                Some(json!({ "depth": names.len() }))
            })
        }
        fn change(&self, before: &Value, after: &Value) -> Option<&'static str> {
            (before["depth"] != after["depth"]).then_some("depth")
        }
    }

    /// A group's members.
    pub struct Group {
        pub dir: String,
    }

    impl Source for Group {
        fn path(&self) -> String {
            self.dir.clone()
        }
        fn read(&self, zk: ZkSession) -> BoxFuture<'static, Option<Value>> {
            let dir = self.dir.clone();
            Box::pin(async move {
                let (_, names) = children(&zk, &dir).await?;
                Some(json!({ "members": names }))
            })
        }
        fn change(&self, before: &Value, after: &Value) -> Option<&'static str> {
            let count = |v: &Value| v["members"].as_array().map(Vec::len).unwrap_or(0);
            match count(after).cmp(&count(before)) {
                std::cmp::Ordering::Greater => Some("joined"),
                std::cmp::Ordering::Less => Some("left"),
                std::cmp::Ordering::Equal => (before != after).then_some("members"),
            }
        }
    }
}
