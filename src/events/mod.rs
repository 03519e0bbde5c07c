//! The event bus: topics that sockets subscribe to, each fed by one shared ZooKeeper watch.
//!
//! A topic (an election's leadership, say) has a current state read from ZooKeeper and a
//! stream of changes. The first subscriber starts the topic's task: for a recipe's resource
//! (a [Source]) it follows the shared watches the source asks for, re-reads the state on each
//! change, and publishes an event when [Source::change] says what changed, numbered by the
//! topic's own sequence. Subscribers get the current
//! state first, then the changes, in order; one that falls behind the topic's recent events
//! (bounded in number and in bytes) is told so (and given the state again) rather than
//! silently skipping events. However many sockets and streams watch a topic, ZooKeeper sees
//! one watch per instance.
//!
//! Every event has a [Position]: the topic's incarnation (its `epoch`, new each time the topic
//! starts on an instance) and its sequence number. A subscriber that comes back with the
//! position of the last event it took resumes after it, without the state again, while the
//! events it missed are still among the topic's recent ones ([EventSettings::backlog]); else it
//! gets a `resync` with the state (reason `cannot_resume`). So that a client that reconnects
//! can resume, a topic outlives its last subscriber by [EventSettings::linger] (a bounded
//! number of topics at once, [EventSettings::max_lingering]), then its task ends.
//!
//! Here the topics, their subscriptions and the registry ([Events]); an event's [Position] in
//! [position], what a topic's task publishes through in [publisher], the tasks that feed
//! topics in [mod@follow], the kinds' summaries in [summary], what a client may follow in [topics].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use serde::Serialize;
use std::collections::VecDeque;

use tokio::sync::watch;

use crate::locked::Locked;
use crate::recipes::leases::Leases;
use crate::recipes::leases::{EndReason, Lease, LeaseError};
use crate::recipes::topic::{EventKind, Source};
use crate::zk::recursive::Change;
use crate::zk::session::{Status, ZkSession};
use crate::zk::watch::{ExistsWatches, Mode};

mod follow;
mod position;
mod publisher;
pub mod topics;

use follow::*;
pub use position::*;
use publisher::*;

/// Most bytes (as JSON) of the recent events a topic keeps, for subscribers that have not taken
/// them yet and for subscribers that resume; the last event is kept whatever its size. Their
/// number is bounded by [EventSettings::backlog]. A subscriber that has not taken an event by
/// the time it is dropped is told it fell behind. The bound in bytes keeps a large value's
/// changes from holding many copies of it per busy topic.
pub const BACKLOG_BYTES: usize = 256 * 1024;

/// How a topic keeps its past for subscribers that resume.
#[derive(Clone, Copy, Debug)]
pub struct EventSettings {
    /// Most recent events a topic keeps (and so the longest gap a resume can bridge).
    pub backlog: usize,
    /// How long a topic stays live after its last subscriber left, for one that reconnects.
    pub linger: std::time::Duration,
    /// Most topics lingering at once on the instance (each keeps its ZooKeeper watches); past
    /// it a topic ends when its last subscriber leaves.
    pub max_lingering: usize,
}

impl Default for EventSettings {
    fn default() -> EventSettings {
        EventSettings {
            backlog: 64,
            linger: std::time::Duration::from_secs(30),
            max_lingering: 1024,
        }
    }
}

/// A topic's state, shared by its events and the subscribers they reach (never copied per
/// subscriber).
pub type State = Arc<serde_json::Value>;

/// One event on a topic.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Event {
    /// The topic, e.g. `election:scheduler`.
    pub topic: String,
    /// Where this event is in the topic, sent as two fields: `seq`, the topic's sequence
    /// number, which increases by one per event of the topic, so a subscriber sees consecutive
    /// numbers unless it is told (by a `resync`) that it missed some; and `position`
    /// (`<epoch>-<seq>`), to give back to resume after this event.
    #[serde(flatten)]
    pub position: Position,
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
    /// subscriber did not read fast enough and events were dropped for it), `cannot_resume`
    /// (the position it resumed from is no longer among the topic's recent events, or is of
    /// another incarnation of the topic).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// For events of a recursive znode watch: the node that changed, relative to the root.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The topic's state after the change.
    pub state: State,
}

/// What feeds a topic: a task that publishes its events until nobody listens.
pub struct Feed(Box<dyn FnOnce(Publisher) -> BoxFuture<'static, ()> + Send>);

impl Feed {
    /// A recipe's resource: its state read again on each change of the znodes it watches.
    pub fn of<S: Source>(source: S) -> Feed {
        Feed(Box::new(move |publisher| Box::pin(follow(publisher, source))))
    }

    /// Everything below `path` (itself included), with one persistent recursive watch: an
    /// event per node `created`, `changed` (data) or `deleted`, with the node's path relative to
    /// `root` and the zxid of the change. The topic's state is whether `path` exists.
    pub fn recursive(path: String, root: String) -> Feed {
        Feed(Box::new(move |publisher| {
            Box::pin(follow_recursive(publisher, path, root))
        }))
    }

    /// Every resource of `kind` under `base` at a glance (its count, the busiest, their
    /// history), from one recursive watch on `base`: see [summary].
    pub fn summary(kind: crate::kind::Kind, base: String) -> Feed {
        Feed(Box::new(move |publisher| {
            Box::pin(summary::follow_summary(publisher, kind, base))
        }))
    }

    /// A lease of this instance: its state (TTL, time left) now, `expiring` once a third of its
    /// TTL is left without a keepalive, and how it ended (`ended` when deleted, `lost`
    /// otherwise).
    pub fn lease(leases: Leases, lease: Arc<Lease>) -> Feed {
        Feed(Box::new(move |publisher| {
            Box::pin(follow_lease(publisher, leases, lease))
        }))
    }
}

struct Topic {
    /// This incarnation of the topic (see [Position]).
    epoch: u64,
    /// The recent events, the last one published at the back.
    recent: Mutex<Recent>,
    /// The sequence number of the last event published: subscribers wait on it.
    published: watch::Sender<u64>,
    /// How many subscriptions are live; the topic's task ends when none is (after lingering).
    listeners: watch::Sender<usize>,
    /// Since its last subscriber left: until when it lingers, and whether it holds one of the
    /// instance's lingering places.
    lingering: Mutex<Option<(tokio::time::Instant, bool)>>,
}

/// The topics of this instance.
#[derive(Clone)]
pub struct Events {
    zk: ZkSession,
    watches: ExistsWatches,
    topics: Arc<Mutex<HashMap<String, Arc<Topic>>>>,
    settings: EventSettings,
    /// How many topics hold a lingering place now.
    lingering: Arc<std::sync::atomic::AtomicUsize>,
}

/// A topic's recent events: consecutive sequence numbers, at most `backlog` of them and
/// [BACKLOG_BYTES] but for the last.
struct Recent {
    events: VecDeque<(Arc<Event>, usize)>,
    bytes: usize,
    backlog: usize,
}

impl Recent {
    fn push(&mut self, event: Arc<Event>) {
        let size = json_size(&event);
        self.events.push_back((event, size));
        self.bytes += size;
        while self.events.len() > 1 && (self.events.len() > self.backlog || self.bytes > BACKLOG_BYTES) {
            if let Some((_, size)) = self.events.pop_front() {
                self.bytes -= size;
            }
        }
    }

    fn last(&self) -> Option<&Arc<Event>> {
        self.events.back().map(|(event, _)| event)
    }

    /// The event numbered `seq`, if it is still kept.
    fn get(&self, seq: u64) -> Option<&Arc<Event>> {
        let first = self.events.front()?.0.position.seq;
        let index = usize::try_from(seq.checked_sub(first)?).ok()?;
        self.events.get(index).map(|(event, _)| event)
    }
}

/// The size of `event` as JSON, counted without writing it anywhere.
fn json_size(event: &Event) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, event);
    count.0
}

/// A subscription: the state when it began (or, for one that resumed, nothing), then the
/// events.
pub struct Subscription {
    /// The first event, not yet handed out: the state, or the `resync` of a resume that could
    /// not be honoured.
    pending: Option<Arc<Event>>,
    published: watch::Receiver<u64>,
    /// The sequence number of the last event handed out (or pending).
    seen: u64,
    topic: Arc<Topic>,
    name: String,
    events: Events,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let events = &self.events;
        let topic = &self.topic;
        topic.listeners.send_modify(|n| {
            *n = n.saturating_sub(1);
            if *n == 0 {
                // Under the count's lock, so that a subscriber joining now finds it set.
                events.start_lingering(topic);
            }
        });
    }
}

impl Subscription {
    /// The next event: the first state (unless this subscription resumed), then each event
    /// after the ones already seen; a `resync` with the current state if this subscriber fell
    /// behind; `None` when the topic ends.
    pub async fn next(&mut self) -> Option<Arc<Event>> {
        if let Some(first) = self.pending.take() {
            return Some(first);
        }
        loop {
            {
                let recent = self.topic.recent();
                let last = recent.last().map_or(0, |e| e.position.seq);
                if last > self.seen {
                    let Some(next) = recent.get(self.seen + 1).cloned() else {
                        // Dropped from the recent events before this subscriber took it.
                        drop(recent);
                        return Some(self.resync());
                    };
                    self.seen = next.position.seq;
                    return Some(next);
                }
            }
            if self.published.changed().await.is_err() {
                return None;
            }
        }
    }

    /// Where this subscriber is: the position of the last event handed out (or about to be).
    pub fn position(&self) -> Position {
        Position {
            epoch: self.topic.epoch,
            seq: self.seen,
        }
    }

    /// The state now, as an event of kind `resync` (reason `fell_behind`), for a subscriber
    /// that missed events; the events it covers are skipped from then on.
    pub fn resync(&mut self) -> Arc<Event> {
        self.resync_for("fell_behind")
    }

    fn resync_for(&mut self, reason: &'static str) -> Arc<Event> {
        crate::metrics::get().resyncs.with_label_values(&[reason]).inc();
        self.snapshot("resync", Some(reason))
    }

    /// The topic's state now as an event of `kind` (`state`, or `resync` with its `reason`);
    /// this subscriber takes it up from there.
    fn snapshot(&mut self, kind: &'static str, reason: Option<&'static str>) -> Arc<Event> {
        let (seq, state) = self.topic.last();
        self.seen = seq;
        Arc::new(Event {
            topic: self.name.clone(),
            position: self.position(),
            kind,
            zxid: None,
            reason,
            path: None,
            state,
        })
    }
}

impl Topic {
    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.locked()
    }

    /// The last state published and its sequence number (0 before the first).
    fn last(&self) -> (u64, State) {
        self.recent()
            .last()
            .map_or((0, State::default()), |e| (e.position.seq, e.state.clone()))
    }

    fn lingering(&self) -> std::sync::MutexGuard<'_, Option<(tokio::time::Instant, bool)>> {
        self.lingering.locked()
    }
}

impl Events {
    /// The subscription to a topic already counted in: its current state, or after `since`
    /// (see [Position]), then its events.
    async fn finish_subscribe(&self, name: &str, topic: Arc<Topic>, since: Option<Position>) -> Subscription {
        let mut published = topic.published.subscribe();
        // The topic's first read may be in flight: wait for it (it is published as seq 1).
        let _ = published.wait_for(|seq| *seq > 0).await;
        let mut subscription = Subscription {
            pending: None,
            published,
            seen: 0,
            topic: topic.clone(),
            name: name.to_string(),
            events: self.clone(),
        };
        // The state as of the subscription: after it, every change arrives as an event.
        let last = topic.last().0;
        match since {
            None => subscription.pending = Some(subscription.snapshot("state", None)),
            Some(since)
                if since.epoch == topic.epoch
                    && since.seq <= last
                    && (since.seq == last || topic.recent().get(since.seq + 1).is_some()) =>
            {
                // Every event after it is still kept: they follow, the state is not sent again.
                subscription.seen = since.seq;
            }
            Some(_) => subscription.pending = Some(subscription.resync_for("cannot_resume")),
        }
        subscription
    }

    pub fn new(zk: ZkSession, watches: ExistsWatches, settings: EventSettings) -> Events {
        Events {
            zk,
            watches,
            topics: Arc::default(),
            settings,
            lingering: Arc::default(),
        }
    }

    /// `topic` has lost its last subscriber: it lingers for [EventSettings::linger] if a
    /// lingering place is free, else it ends at once. (Called under the listener count's lock.)
    fn start_lingering(&self, topic: &Topic) {
        use std::sync::atomic::Ordering;
        let now = tokio::time::Instant::now();
        let mut lingering = topic.lingering();
        if lingering.is_some_and(|(_, place)| place) {
            return;
        }
        let place = !self.settings.linger.is_zero()
            && self
                .lingering
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < self.settings.max_lingering).then_some(n + 1)
                })
                .is_ok();
        *lingering = Some((if place { now + self.settings.linger } else { now }, place));
    }

    /// `topic` has a subscriber again, or is gone: its lingering place is free.
    fn stop_lingering(&self, topic: &Topic) {
        if let Some((_, true)) = topic.lingering().take() {
            self.lingering.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
    }

    /// Subscribes to each of `watches` on the instance's shared watches.
    fn watch_all(&self, watches: &[(Mode, String)]) -> Vec<(Mode, crate::zk::watch::Subscription)> {
        watches
            .iter()
            .map(|(mode, path)| (*mode, self.watches.subscribe_to(*mode, path)))
            .collect()
    }

    /// How many topics are live on this instance (each costs its ZooKeeper watches), lingering
    /// ones included.
    pub fn topics(&self) -> usize {
        self.topics.locked().len()
    }

    /// How many topics are lingering (live without a subscriber) on this instance.
    pub fn lingering(&self) -> usize {
        self.lingering.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Subscribes to topic `name`, fed by `feed` (used only if the topic is not live yet): from
    /// its state now, or, with `since`, after that position (see [Position]).
    pub async fn subscribe(&self, name: &str, feed: Feed, since: Option<Position>) -> Subscription {
        let topic = {
            let mut topics = self.topics.locked();
            match topics.get(name) {
                None => {
                    let topic = Arc::new(Topic {
                        epoch: next_epoch(),
                        recent: Mutex::new(Recent {
                            events: VecDeque::new(),
                            bytes: 0,
                            backlog: self.settings.backlog.max(1),
                        }),
                        published: watch::Sender::new(0),
                        listeners: watch::Sender::new(0),
                        lingering: Mutex::default(),
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
                    let retire = publisher.clone();
                    let run = feed.0(publisher);
                    tokio::spawn(async move {
                        run.await;
                        retire.retire();
                    });
                    topic
                }
                // A lingering topic (no subscriber) is still live: its task removes it from
                // the map, under this lock, before it ends.
                Some(topic) => {
                    topic.listeners.send_modify(|n| {
                        if *n == 0 {
                            self.stop_lingering(topic);
                        }
                        *n += 1;
                    });
                    topic.clone()
                }
            }
        };
        self.finish_subscribe(name, topic, since).await
    }
}

mod summary;

pub use summary::TOP as SUMMARY_TOP;

#[cfg(test)]
mod tests;
