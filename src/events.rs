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

use futures::future::BoxFuture;
use serde::Serialize;
use tokio::sync::{broadcast, watch};

use crate::zk::session::{Connection, Status, ZkSession};
use crate::zk::watch::{ExistsWatches, Mode};

/// Events kept for slow subscribers before they are told they fell behind.
const BACKLOG: usize = 256;

/// One event on a topic.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Event {
    /// The topic, e.g. `election:scheduler`.
    pub topic: String,
    /// The topic's sequence number: it increases by one per event of the topic, so a
    /// subscriber sees consecutive numbers unless it is told (by a `resync`) that it missed
    /// some.
    pub seq: u64,
    /// `state` (the first message), what changed (e.g. `leader`, `no_leader`), or `resync`:
    /// the state now, after a time in which changes may have been missed (see `reason`).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The ZooKeeper transaction the event follows from, where there is one: the zxid of the
    /// watch notification, or of the last change to the watched node (its `mzxid`) or to its
    /// children (its `pzxid`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zxid: Option<i64>,
    /// Why a `resync` came: `reconnected` (zkgate's ZooKeeper connection dropped and came
    /// back; watches may have missed changes meanwhile), `session_expired` (zkgate's session
    /// was replaced; everything ephemeral of the old one is gone), `fell_behind` (this
    /// subscriber did not read fast enough and events were dropped for it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// For events of a recursive znode watch: the node that changed, relative to the root.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The topic's state after the change.
    pub state: serde_json::Value,
}

/// What a topic's reader makes of its znode: the state, and which kind of change it is
/// relative to the previous state.
pub trait Source: Send + Sync + 'static {
    /// The znodes the topic follows, and how: their children or their existence and data,
    /// given the topic's last state (`null` before the first read): a lock follows its
    /// current holder's node, say. Each is one shared watch of the instance, whatever the
    /// number of subscribers.
    fn watches(&self, state: &serde_json::Value) -> Vec<(Mode, String)>;
    /// Reads the current state.
    fn read(&self, zk: ZkSession) -> BoxFuture<'static, Option<serde_json::Value>>;
    /// The kind of event from `before` to `after` (both states), or `None` if nothing changed
    /// that subscribers care about.
    fn change(&self, before: &serde_json::Value, after: &serde_json::Value) -> Option<&'static str>;
}

impl Source for Box<dyn Source> {
    fn watches(&self, state: &serde_json::Value) -> Vec<(Mode, String)> {
        (**self).watches(state)
    }
    fn read(&self, zk: ZkSession) -> BoxFuture<'static, Option<serde_json::Value>> {
        (**self).read(zk)
    }
    fn change(&self, before: &serde_json::Value, after: &serde_json::Value) -> Option<&'static str> {
        (**self).change(before, after)
    }
}

/// What feeds a topic: a [Source] read again on each change of its znode, or a task that
/// publishes events itself (a recursive watch, whose events are not a state).
pub enum Feed {
    State(Box<dyn Source>),
    Stream(Box<dyn FnOnce(Publisher) -> BoxFuture<'static, ()> + Send>),
}

impl<S: Source> From<S> for Feed {
    fn from(source: S) -> Feed {
        Feed::State(Box::new(source))
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
            match self.events.recv().await {
                // The receiver may hold events from before the first state or a resync.
                Ok(event) if event.seq > self.seen => {
                    self.seen = event.seq;
                    return Some(event);
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    if self.topic.last().0 > self.seen {
                        return Some(self.resync());
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// The state now, as an event of kind `resync` (reason `fell_behind`), for a subscriber
    /// that missed events; the events it covers are skipped from then on.
    pub fn resync(&mut self) -> Event {
        let (seq, state) = self.topic.last();
        self.seen = seq;
        crate::metrics::get().resyncs.with_label_values(&["fell_behind"]).inc();
        Event {
            topic: self.name.clone(),
            seq,
            kind: "resync",
            zxid: None,
            reason: Some("fell_behind"),
            path: None,
            state,
        }
    }
}

impl Topic {
    fn last(&self) -> (u64, serde_json::Value) {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A topic's task's handle on it: publishes events, and tells when nobody listens any more.
#[derive(Clone)]
pub struct Publisher {
    events: Events,
    name: String,
    topic: Arc<Topic>,
}

impl Publisher {
    /// Publishes an event with the next sequence number; `state` becomes the topic's state.
    pub fn publish(&self, kind: &'static str, state: serde_json::Value, zxid: Option<i64>) {
        self.publish_event(kind, state, zxid, None, None);
    }

    /// Publishes a `resync` with the state after a time in which changes may have been lost.
    pub fn resync(&self, reason: &'static str, state: serde_json::Value) {
        crate::metrics::get().resyncs.with_label_values(&[reason]).inc();
        self.publish_event("resync", state, None, Some(reason), None);
    }

    /// Publishes the event of one node below a recursive watch, with the topic's new state
    /// (`None`: it stays).
    pub fn publish_node(&self, kind: &'static str, path: String, zxid: Option<i64>, state: Option<serde_json::Value>) {
        let state = state.unwrap_or_else(|| self.last_state());
        self.publish_event(kind, state, zxid, None, Some(path));
    }

    fn publish_event(
        &self,
        kind: &'static str,
        state: serde_json::Value,
        zxid: Option<i64>,
        reason: Option<&'static str>,
        path: Option<String>,
    ) {
        let mut last = self.topic.last.lock().unwrap_or_else(|e| e.into_inner());
        last.0 += 1;
        last.1 = state.clone();
        let event = Event {
            topic: self.name.clone(),
            seq: last.0,
            kind,
            zxid,
            reason,
            path,
            state,
        };
        // Sent under the lock, so that events leave in the order of their numbers.
        let _ = self.topic.sender.send(event);
    }

    pub fn last_state(&self) -> serde_json::Value {
        self.topic.last().1
    }

    pub fn zk(&self) -> &ZkSession {
        &self.events.zk
    }

    /// Resolves when the last subscriber has gone; the topic is then removed (under the lock
    /// that subscribers take to join, so none is left on a topic whose task ended) and the
    /// task should return.
    pub async fn idle(&self) {
        let mut listeners = self.topic.listeners.subscribe();
        loop {
            let _ = listeners.wait_for(|n| *n == 0).await;
            let mut topics = self.events.topics.lock().unwrap_or_else(|e| e.into_inner());
            if *self.topic.listeners.borrow() == 0 {
                self.remove_from(&mut topics);
                return;
            }
        }
    }

    /// Removes the topic (its task is ending for another reason than idleness).
    fn retire(&self) {
        self.remove_from(&mut self.events.topics.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Removes this topic from the instance's map, unless a new topic of the same name
    /// already took its place.
    fn remove_from(&self, topics: &mut HashMap<String, Arc<Topic>>) {
        if topics.get(&self.name).is_some_and(|t| Arc::ptr_eq(t, &self.topic)) {
            topics.remove(&self.name);
        }
    }
}

/// Follows the session supervisor and says when a topic must resync: each time a connection
/// is established again, in the same session or a new one. It counts connections rather than
/// watching for a disconnected state, which a busy topic may never see (the status channel
/// keeps only the latest value, and a short drop is over before the topic looks).
pub struct Recoveries {
    status: watch::Receiver<Status>,
    generation: u64,
    connects: u64,
}

impl Recoveries {
    pub fn new(zk: &ZkSession) -> Recoveries {
        let mut status = zk.subscribe();
        let (generation, connects) = {
            let s = status.borrow_and_update();
            (s.generation, s.connects)
        };
        Recoveries {
            status,
            generation,
            connects,
        }
    }

    /// Waits until the session is connected again after a disconnection (`reconnected`) or on
    /// a new session (`session_expired`). Never resolves once the supervisor has stopped.
    pub async fn next(&mut self) -> &'static str {
        loop {
            if self.status.changed().await.is_err() {
                return std::future::pending().await;
            }
            let (generation, connects, connected) = {
                let s = self.status.borrow_and_update();
                (
                    s.generation,
                    s.connects,
                    s.client.is_some() && s.connection == Connection::Connected,
                )
            };
            if !connected || connects == self.connects {
                continue;
            }
            self.connects = connects;
            let before = std::mem::replace(&mut self.generation, generation);
            return if before == generation || before == 0 {
                "reconnected"
            } else {
                "session_expired"
            };
        }
    }
}

impl Events {
    /// The subscription to a topic already counted in: its current state, then its events.
    async fn finish_subscribe(&self, name: &str, topic: Arc<Topic>) -> Subscription {
        let events = topic.sender.subscribe();
        // The state as of the subscription: after it, every change arrives as an event.
        let (seq, state) = loop {
            let (seq, state) = topic.last();
            if seq > 0 {
                break (seq, state);
            }
            // The topic's first read is in flight: wait for it (it is published as seq 1).
            let mut peek = topic.sender.subscribe();
            if topic.last().0 == 0 {
                let _ = peek.recv().await;
            }
        };
        Subscription {
            first: Event {
                topic: name.to_string(),
                seq,
                kind: "state",
                zxid: None,
                reason: None,
                path: None,
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

    /// Subscribes to each of `watches` on the instance's shared watches.
    fn watch_all(&self, watches: &[(Mode, String)]) -> Vec<(Mode, crate::zk::watch::Subscription)> {
        watches
            .iter()
            .map(|(mode, path)| (*mode, self.watches.subscribe_to(*mode, path)))
            .collect()
    }

    /// How many topics are live on this instance (each costs one ZooKeeper watch).
    pub fn topics(&self) -> usize {
        self.topics.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Subscribes to topic `name`, fed by `feed` (used only if the topic is not live yet).
    pub async fn subscribe(&self, name: &str, feed: impl Into<Feed>) -> Subscription {
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
                    let publisher = Publisher {
                        events: self.clone(),
                        name: name.to_string(),
                        topic: topic.clone(),
                    };
                    match feed.into() {
                        Feed::State(source) => {
                            // Runs in the task, after the watches are set (futures are lazy).
                            let first_state = source.read(self.zk.clone());
                            tokio::spawn(follow(publisher, source, first_state));
                        }
                        Feed::Stream(run) => {
                            tokio::spawn(async move {
                                let retire = publisher.clone();
                                run(publisher).await;
                                retire.retire();
                            });
                        }
                    }
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

/// A state topic's task: publish the first state, then each change, until nobody listens.
/// After ZooKeeper comes back from a disconnection or a session expiry it publishes the
/// state as a `resync` whether or not it changed: watches do not report what happened while
/// the connection was down (ZOOKEEPER-4698 for persistent ones; a new session has none of
/// the old one's), so subscribers are told honestly instead of trusting a silent gap.
async fn follow(
    publisher: Publisher,
    source: Box<dyn Source>,
    first_state: BoxFuture<'static, Option<serde_json::Value>>,
) {
    let mut recoveries = Recoveries::new(&publisher.events.zk);
    // The watches first, then the read: a change after the watches are set wakes the loop
    // even if the read missed it. (The read's future is lazy: it runs at its first poll.)
    let mut watching = source.watches(&serde_json::Value::Null);
    let mut watches = publisher.events.watch_all(&watching);
    let state = first_state.await.unwrap_or(serde_json::Value::Null);
    let zxid = watches
        .iter()
        .filter_map(|(mode, watch)| zxid_of(*mode, &watch.state.borrow()))
        .max();
    publisher.publish("state", state, zxid);
    loop {
        // The state may call for other watches (a new lock holder's node). A new watch
        // counts as changed, so the state is read again once it is set, and nothing that
        // changed between the last read and the watch is missed.
        let wanted = source.watches(&publisher.last_state());
        if wanted != watching {
            watches = publisher.events.watch_all(&wanted);
            for (_, watch) in &mut watches {
                watch.state.mark_changed();
            }
            watching = wanted;
        }
        let any_change = futures::future::select_all(watches.iter_mut().map(|(_, w)| Box::pin(w.state.changed())));
        let resync = tokio::select! {
            (changed, _, _) = any_change => if changed.is_err() { break } else { None },
            reason = recoveries.next() => Some(reason),
            _ = publisher.idle() => return,
        };
        // Mark what the watches saw as seen *before* reading: a change that lands during the
        // read then wakes the loop again. (Marking after the read would swallow it, and the
        // state would stay behind with nothing left to wake it.)
        let zxid = last_zxid(&mut watches);
        // A failed read is tried again: waiting for the next change instead could leave the
        // subscribers with a stale state for good.
        let mut after = source.read(publisher.events.zk.clone()).await;
        while after.is_none() && *publisher.topic.listeners.borrow() > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            after = source.read(publisher.events.zk.clone()).await;
        }
        let Some(after) = after else { continue };
        if let Some(reason) = resync {
            publisher.resync(reason, after);
            continue;
        }
        if let Some(kind) = source.change(&publisher.last_state(), &after) {
            publisher.publish(kind, after, zxid);
        }
    }
    publisher.retire();
}

/// The zxid of the last change the shared watches saw (marking them seen): a node's `mzxid`
/// for an exists-watch, its `pzxid` (last child created or deleted) for a children watch.
fn last_zxid(watches: &mut [(Mode, crate::zk::watch::Subscription)]) -> Option<i64> {
    watches
        .iter_mut()
        .filter_map(|(mode, watch)| zxid_of(*mode, &watch.state.borrow_and_update()))
        .max()
}

fn zxid_of(mode: Mode, known: &crate::zk::watch::Known) -> Option<i64> {
    let stat = known.as_ref()?.as_ref()?;
    Some(match mode {
        Mode::Exists => stat.mzxid,
        Mode::Children => stat.pzxid,
    })
}

/// Topics of the recipes that are plain znodes with children: a barrier (`raised` /
/// `lowered`), a double barrier (`participants`, `entered` when all are in, `left` when all
/// are out), a queue (`available`, `depth`, `dead_lettered`), a group (`joined` / `left`), a
/// transaction (`vote`, `decision`); and raw znodes under the root: data (`created`,
/// `changed`, `deleted`), children (`children`) or everything below (a persistent recursive
/// watch, whose events name the node).
pub mod sources {
    use futures::future::BoxFuture;
    use serde_json::{Value, json};
    use zookeeper_client::{AddWatchMode, EventType, SessionState};

    use super::{Feed, Publisher, Source};
    use crate::zk::retry_on_loss;
    use crate::zk::session::ZkSession;
    use crate::zk::watch::Mode;

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

    fn count(state: &Value, field: &str) -> u64 {
        state[field].as_u64().unwrap_or(0)
    }

    /// A barrier: up while its znode exists. Watches its parent's children.
    pub struct Barrier {
        pub parent: String,
        pub name: String,
    }

    impl Source for Barrier {
        fn watches(&self, _: &Value) -> Vec<(Mode, String)> {
            vec![(Mode::Children, self.parent.clone())]
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

    /// A double barrier: its participants and whether the round is in (`ready` exists).
    pub struct DoubleBarrier {
        pub dir: String,
    }

    impl Source for DoubleBarrier {
        fn watches(&self, _: &Value) -> Vec<(Mode, String)> {
            vec![(Mode::Children, self.dir.clone())]
        }
        fn read(&self, zk: ZkSession) -> BoxFuture<'static, Option<Value>> {
            let dir = self.dir.clone();
            Box::pin(async move {
                let (_, mut names) = children(&zk, &dir).await?;
                let ready = names.iter().any(|n| n == crate::recipes::double_barrier::READY);
                names.retain(|n| n != crate::recipes::double_barrier::READY);
                Some(json!({ "participants": names, "in": ready }))
            })
        }
        fn change(&self, before: &Value, after: &Value) -> Option<&'static str> {
            match (before["in"].as_bool(), after["in"].as_bool()) {
                (Some(false), Some(true)) => Some("entered"),
                (Some(true), Some(false)) => Some("left"),
                _ => (before["participants"] != after["participants"]).then_some("participants"),
            }
        }
    }

    /// A queue: items waiting (`depth`, claimed ones not counted), all `items`, claims in
    /// flight, dead letters, and when the oldest item was put.
    pub struct Queue {
        pub dir: String,
    }

    impl Source for Queue {
        fn watches(&self, _: &Value) -> Vec<(Mode, String)> {
            ["items", "claims", "dead"]
                .into_iter()
                .map(|sub| (Mode::Children, format!("{}/{sub}", self.dir)))
                .collect()
        }
        fn read(&self, zk: ZkSession) -> BoxFuture<'static, Option<Value>> {
            let dir = self.dir.clone();
            Box::pin(async move {
                let (_, items) = children(&zk, &format!("{dir}/items")).await?;
                let (_, claims) = children(&zk, &format!("{dir}/claims")).await?;
                let (_, dead) = children(&zk, &format!("{dir}/dead")).await?;
                // The oldest item is the one put first: the lowest sequence number, whatever
                // its priority. One more read, of its stat.
                let oldest = items
                    .iter()
                    .filter_map(|i| crate::recipes::queue::order_of(i).map(|(_, seq)| (seq, i)))
                    .min()
                    .map(|(_, item)| format!("{dir}/items/{item}"));
                let oldest_ms = match oldest {
                    Some(path) => {
                        let client = zk.connected().await.ok()?.client;
                        retry_on_loss(|| client.check_stat(&path)).await.ok()?.map(|s| s.ctime)
                    }
                    None => None,
                };
                Some(json!({
                    "depth": items.len() - claims.iter().filter(|c| items.contains(c)).count(),
                    "items": items.len(),
                    "in_flight": claims.len(),
                    "dead_letters": dead.len(),
                    "oldest_put_ms": oldest_ms,
                }))
            })
        }
        fn change(&self, before: &Value, after: &Value) -> Option<&'static str> {
            if count(after, "dead_letters") > count(before, "dead_letters") {
                Some("dead_lettered")
            } else if count(after, "depth") > count(before, "depth") {
                Some("available")
            } else {
                (before != after).then_some("depth")
            }
        }
    }

    /// A group's members.
    pub struct Group {
        pub dir: String,
    }

    impl Source for Group {
        fn watches(&self, _: &Value) -> Vec<(Mode, String)> {
            vec![(Mode::Children, self.dir.clone())]
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

    /// A two-phase commit transaction: its votes and decision.
    pub struct Txn {
        pub dir: String,
    }

    impl Source for Txn {
        fn watches(&self, _: &Value) -> Vec<(Mode, String)> {
            vec![
                (Mode::Children, format!("{}/votes", self.dir)),
                (Mode::Exists, format!("{}/decision", self.dir)),
            ]
        }
        fn read(&self, zk: ZkSession) -> BoxFuture<'static, Option<Value>> {
            let dir = self.dir.clone();
            Box::pin(async move {
                let client = zk.connected().await.ok()?.client;
                Some(match crate::recipes::txn::read(&client, &dir).await.ok()? {
                    None => json!({ "exists": false }),
                    Some(record) => json!({
                        "exists": true,
                        "participants": record.spec.participants,
                        "votes": record.votes.iter().map(|(p, v)| (p.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
                        "decision": record.decision,
                    }),
                })
            })
        }
        fn change(&self, before: &Value, after: &Value) -> Option<&'static str> {
            if before["decision"] != after["decision"] && !after["decision"].is_null() {
                Some("decision")
            } else if before["votes"] != after["votes"] {
                Some("vote")
            } else {
                (before != after).then_some("txn")
            }
        }
    }

    /// `{"data": "..."}` for UTF-8 data, `{"data_base64": "..."}` for other bytes.
    fn data_field(data: &[u8]) -> (&'static str, Value) {
        match std::str::from_utf8(data) {
            Ok(text) => ("data", json!(text)),
            Err(_) => {
                use base64::Engine;
                (
                    "data_base64",
                    json!(base64::engine::general_purpose::STANDARD.encode(data)),
                )
            }
        }
    }

    /// A znode's data and version: `created`, `changed`, `deleted`.
    pub struct ZnodeData {
        pub path: String,
    }

    impl Source for ZnodeData {
        fn watches(&self, _: &Value) -> Vec<(Mode, String)> {
            vec![(Mode::Exists, self.path.clone())]
        }
        fn read(&self, zk: ZkSession) -> BoxFuture<'static, Option<Value>> {
            let path = self.path.clone();
            Box::pin(async move {
                let client = zk.connected().await.ok()?.client;
                match retry_on_loss(|| client.get_data(&path)).await {
                    Ok((data, stat)) => {
                        let (field, data) = data_field(&data);
                        Some(json!({ "exists": true, field: data, "version": stat.version, "mzxid": stat.mzxid }))
                    }
                    Err(zookeeper_client::Error::NoNode) => Some(json!({ "exists": false })),
                    Err(_) => None,
                }
            })
        }
        fn change(&self, before: &Value, after: &Value) -> Option<&'static str> {
            match (before["exists"].as_bool(), after["exists"].as_bool()) {
                (Some(false) | None, Some(true)) => Some("created"),
                (Some(true), Some(false)) => Some("deleted"),
                _ => (before["mzxid"] != after["mzxid"]).then_some("changed"),
            }
        }
    }

    /// A znode's children: `created`, `deleted`, `children`.
    pub struct ZnodeChildren {
        pub path: String,
    }

    impl Source for ZnodeChildren {
        fn watches(&self, _: &Value) -> Vec<(Mode, String)> {
            vec![(Mode::Children, self.path.clone())]
        }
        fn read(&self, zk: ZkSession) -> BoxFuture<'static, Option<Value>> {
            let path = self.path.clone();
            Box::pin(async move {
                let (exists, names) = children(&zk, &path).await?;
                Some(json!({ "exists": exists, "children": names }))
            })
        }
        fn change(&self, before: &Value, after: &Value) -> Option<&'static str> {
            match (before["exists"].as_bool(), after["exists"].as_bool()) {
                (Some(false) | None, Some(true)) => Some("created"),
                (Some(true), Some(false)) => Some("deleted"),
                _ => (before["children"] != after["children"]).then_some("children"),
            }
        }
    }

    /// Everything below `path` (itself included), with one persistent recursive watch: an
    /// event per node `created`, `changed` (data) or `deleted`, with the node's path relative
    /// to `root` and the zxid of the change. The topic's state is whether `path` exists.
    pub fn recursive(path: String, root: String) -> Feed {
        Feed::Stream(Box::new(move |publisher| {
            Box::pin(follow_recursive(publisher, path, root))
        }))
    }

    async fn follow_recursive(publisher: Publisher, path: String, root: String) {
        let relative = |node: &str| {
            node.strip_prefix(&root)
                .unwrap_or(node)
                .trim_start_matches('/')
                .to_string()
        };
        let mut resync_reason: Option<&'static str> = None;
        loop {
            let session = tokio::select! {
                session = publisher.zk().connected() => session,
                _ = publisher.idle() => return,
            };
            let Ok(session) = session else {
                // No session: wait for the supervisor's next one. Whatever happens meanwhile
                // is lost to this watch, so the next state is a resync.
                resync_reason.get_or_insert("session_expired");
                let mut status = publisher.zk().subscribe();
                tokio::select! {
                    changed = status.changed() => if changed.is_err() { return },
                    _ = publisher.idle() => return,
                }
                continue;
            };
            // The watch first, then the state: a change in between is both in the state and
            // an event, never in neither.
            let mut watcher =
                match retry_on_loss(|| session.client.watch(&path, AddWatchMode::PersistentRecursive)).await {
                    Ok(watcher) => watcher,
                    Err(err) => {
                        tracing::warn!(%path, error = %err, "recursive watch could not be set; retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => continue,
                            _ = publisher.idle() => return,
                        }
                    }
                };
            let Ok(stat) = retry_on_loss(|| session.client.check_stat(&path)).await else {
                continue;
            };
            let state = json!({ "exists": stat.is_some() });
            match resync_reason.take() {
                Some(reason) => publisher.resync(reason, state),
                None if publisher.topic.last().0 == 0 => publisher.publish("state", state, stat.map(|s| s.mzxid)),
                None => publisher.resync("reconnected", state),
            }
            let mut disconnected = false;
            loop {
                let event = tokio::select! {
                    event = watcher.changed() => event,
                    _ = publisher.idle() => return,
                };
                let zxid = (event.zxid >= 0).then_some(event.zxid);
                let kind = match event.event_type {
                    EventType::Session => match event.session_state {
                        SessionState::Disconnected => {
                            disconnected = true;
                            continue;
                        }
                        SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                            if std::mem::take(&mut disconnected) {
                                // Events while the connection was down are not replayed
                                // (ZOOKEEPER-4698): say so, with the state now.
                                let exists = retry_on_loss(|| session.client.check_stat(&path)).await;
                                let exists = exists.map(|s| s.is_some()).unwrap_or(true);
                                publisher.resync("reconnected", json!({ "exists": exists }));
                            }
                            continue;
                        }
                        // The session ended: the watch went with it (and must not be polled
                        // again). Set a new one on the next session.
                        _ => {
                            resync_reason = Some("session_expired");
                            break;
                        }
                    },
                    EventType::NodeCreated => "created",
                    EventType::NodeDeleted => "deleted",
                    EventType::NodeDataChanged => "changed",
                    EventType::NodeChildrenChanged => continue,
                };
                let state = (event.path == path).then(|| json!({ "exists": kind != "deleted" }));
                publisher.publish_node(kind, relative(&event.path), zxid, state);
            }
        }
    }
}
