//! What a topic's task publishes through: numbered events into the topic's recent ones, the
//! state again on a resync, and the recoveries after a lost session.

use super::*;

/// A topic's task's handle on it: publishes events, and tells when nobody listens any more.
#[derive(Clone)]
pub struct Publisher {
    pub(super) events: Events,
    pub(super) name: String,
    pub(super) topic: Arc<Topic>,
}

impl Publisher {
    /// Publishes an event with the next sequence number; `state` becomes the topic's state.
    pub fn publish(&self, kind: &'static str, state: serde_json::Value, zxid: Option<i64>) {
        self.publish_event(kind, Arc::new(state), zxid, None, None);
    }

    /// Publishes a `resync` with the state after a time in which changes may have been lost.
    pub fn resync(&self, reason: &'static str, state: serde_json::Value) {
        crate::metrics::get().resyncs.with_label_values(&[reason]).inc();
        self.publish_event("resync", Arc::new(state), None, Some(reason), None);
    }

    /// Publishes the event of one node below a recursive watch, with the topic's new state
    /// (`None`: it stays).
    pub fn publish_node(&self, kind: &'static str, path: String, zxid: Option<i64>, state: Option<serde_json::Value>) {
        let state = state.map(Arc::new).unwrap_or_else(|| self.topic.last().1);
        self.publish_event(kind, state, zxid, None, Some(path));
    }

    pub(super) fn publish_event(
        &self,
        kind: &'static str,
        state: State,
        zxid: Option<i64>,
        reason: Option<&'static str>,
        path: Option<String>,
    ) {
        let mut recent = self.topic.recent();
        let seq = recent.last().map_or(0, |e| e.position.seq) + 1;
        let event = Arc::new(Event {
            topic: self.name.clone(),
            position: Position {
                epoch: self.topic.epoch,
                seq,
            },
            kind,
            zxid,
            reason,
            path,
            state,
        });
        // Kept under the lock, so that the recent events stay in the order of their numbers.
        recent.push(event);
        drop(recent);
        self.topic.published.send_replace(seq);
    }

    pub fn zk(&self) -> &ZkSession {
        &self.events.zk
    }

    /// Resolves when the last subscriber has gone and the topic has lingered its time without
    /// one coming back; the topic is then removed (under the lock that subscribers take to
    /// join, so none is left on a topic whose task ended) and the task should return. The
    /// lingering's end is kept in the topic, so a task that asks again after each change (a
    /// new future each time) waits for the same moment, however busy the topic is.
    pub async fn idle(&self) {
        let mut listeners = self.topic.listeners.subscribe();
        loop {
            let _ = listeners.wait_for(|n| *n == 0).await;
            let until = self.topic.lingering().map(|(until, _)| until);
            if let Some(until) = until {
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => {}
                    _ = listeners.wait_for(|n| *n > 0) => continue,
                }
            }
            let mut topics = self.events.topics.locked();
            if *self.topic.listeners.borrow() == 0 {
                self.remove_from(&mut topics);
                return;
            }
        }
    }

    /// Removes the topic (its task is ending for another reason than idleness).
    pub(super) fn retire(&self) {
        self.remove_from(&mut self.events.topics.locked());
    }

    /// Removes this topic from the instance's map, unless a new topic of the same name
    /// already took its place.
    pub(super) fn remove_from(&self, topics: &mut HashMap<String, Arc<Topic>>) {
        if topics.get(&self.name).is_some_and(|t| Arc::ptr_eq(t, &self.topic)) {
            topics.remove(&self.name);
        }
        self.events.stop_lingering(&self.topic);
    }
}

/// Follows the session supervisor and says when a topic must resync: each time a connection
/// is established again, in the same session or a new one. It counts connections rather than
/// watching for a disconnected state, which a busy topic may never see (the status channel
/// keeps only the latest value, and a short drop is over before the topic looks).
pub struct Recoveries {
    pub(super) status: watch::Receiver<Status>,
    pub(super) generation: u64,
    pub(super) connects: u64,
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
                (s.generation, s.connects, s.is_connected())
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
