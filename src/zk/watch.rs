//! Shared watches: one ZooKeeper watch per path per instance, however many HTTP clients wait
//! on that path (an exists-watch for barriers and decisions, a children watch for queues).
//!
//! A waiter subscribes to a path and gets the path's latest known state (does it exist, and
//! its stat). The first subscriber starts a task that keeps one exists-watch armed on the
//! path and publishes every change; waiters are woken in process. When the last subscription
//! is dropped the task ends. So the load on ZooKeeper does not grow with the number of
//! waiters: a thousand clients waiting on one barrier cost one watch, not a thousand.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use zookeeper_client::Stat;

use crate::zk::retry_on_loss;
use crate::zk::session::ZkSession;

/// What is known of a watched path: `None` until the first read, then its stat if it exists
/// (for a children watch, the parent's stat: `cversion` and `num_children` follow its children).
pub type Known = Option<Option<Stat>>;

/// What a shared watch follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// The path's existence and data (an exists-watch).
    Exists,
    /// The path's children (a children watch).
    Children,
}

struct Entry {
    state: watch::Sender<Known>,
    /// How many subscriptions are live.
    listeners: watch::Sender<usize>,
}

/// Watched paths.
type Paths = Arc<Mutex<HashMap<(Mode, String), Arc<Entry>>>>;

/// The shared exists-watches of this instance.
#[derive(Clone)]
pub struct ExistsWatches {
    zk: ZkSession,
    paths: Paths,
}

/// A live subscription to a path's state; dropping it lets the watch go when it was the last.
pub struct Subscription {
    pub state: watch::Receiver<Known>,
    entry: Arc<Entry>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.entry.listeners.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl ExistsWatches {
    pub fn new(zk: ZkSession) -> ExistsWatches {
        ExistsWatches {
            zk,
            paths: Arc::default(),
        }
    }

    /// Subscribes to `path`'s state, kept current by the path's one exists-watch.
    pub fn subscribe(&self, path: &str) -> Subscription {
        self.subscribe_to(Mode::Exists, path)
    }

    /// Subscribes to `path`'s children (its stat), kept current by the path's one children
    /// watch.
    pub fn subscribe_children(&self, path: &str) -> Subscription {
        self.subscribe_to(Mode::Children, path)
    }

    pub fn subscribe_to(&self, mode: Mode, path: &str) -> Subscription {
        let key = (mode, path.to_string());
        let mut paths = self.paths.lock().unwrap_or_else(|e| e.into_inner());
        let (entry, new) = match paths.get(&key) {
            Some(entry) if *entry.listeners.borrow() > 0 => (entry.clone(), false),
            _ => {
                let entry = Arc::new(Entry {
                    state: watch::Sender::new(None),
                    listeners: watch::Sender::new(0),
                });
                paths.insert(key.clone(), entry.clone());
                (entry, true)
            }
        };
        // Counted before the task starts (and under the lock it takes to leave): a task that
        // saw no listener yet would leave at once, and this subscriber would never be woken.
        entry.listeners.send_modify(|n| *n += 1);
        if new {
            tokio::spawn(keep_watching(self.zk.clone(), key, entry.clone(), self.paths.clone()));
        }
        Subscription {
            state: entry.state.subscribe(),
            entry,
        }
    }

    /// How many subscriptions `path` has now, as a receiver that follows changes.
    pub fn listeners(&self, path: &str) -> Option<watch::Receiver<usize>> {
        let paths = self.paths.lock().unwrap_or_else(|e| e.into_inner());
        paths
            .get(&(Mode::Exists, path.to_string()))
            .map(|entry| entry.listeners.subscribe())
    }
}

/// Keeps one exists-watch armed on `path` while anyone listens; publishes each state.
async fn keep_watching(zk: ZkSession, key: (Mode, String), entry: Arc<Entry>, paths: Paths) {
    let (mode, path) = (key.0, key.1.clone());
    let mut listeners = entry.listeners.subscribe();
    loop {
        let session = tokio::select! {
            session = zk.connected() => session,
            _ = listeners.wait_for(|n| *n == 0) => {
                if leave_if_idle(&key, &entry, &paths) { return }
                continue;
            }
        };
        let Ok(session) = session else {
            // No session for now: wait for the supervisor's next one (or for nobody to care).
            let mut status = zk.subscribe();
            tokio::select! {
                _ = status.changed() => continue,
                _ = listeners.wait_for(|n| *n == 0) => {
                    if leave_if_idle(&key, &entry, &paths) { return }
                    continue;
                }
            }
        };
        let armed = match mode {
            Mode::Exists => retry_on_loss(|| session.client.check_and_watch_stat(&path)).await,
            Mode::Children => match retry_on_loss(|| session.client.get_and_watch_children(&path)).await {
                Ok((_, stat, watcher)) => Ok((Some(stat), watcher)),
                // No parent yet: follow its creation instead.
                Err(zookeeper_client::Error::NoNode) => retry_on_loss(|| session.client.check_and_watch_stat(&path))
                    .await
                    .and_then(|(stat, watcher)| match stat {
                        Some(_) => Err(zookeeper_client::Error::NodeExists),
                        None => Ok((None, watcher)),
                    }),
                Err(err) => Err(err),
            },
        };
        match armed {
            // Created between the two reads: arm the children watch now.
            Err(zookeeper_client::Error::NodeExists) => continue,
            Ok((stat, watcher)) => {
                entry.state.send_replace(Some(stat));
                tokio::select! {
                    _ = watcher.changed() => {}
                    _ = listeners.wait_for(|n| *n == 0) => {
                        if leave_if_idle(&key, &entry, &paths) { return }
                    }
                }
            }
            Err(err) => {
                tracing::warn!(%path, error = %err, "shared watch could not be set; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
                    _ = listeners.wait_for(|n| *n == 0) => {
                        if leave_if_idle(&key, &entry, &paths) { return }
                    }
                }
            }
        }
    }
}

/// Removes the path's entry if nobody listens, under the lock subscribers take to join, so a
/// subscriber is never left with an entry whose task has gone. `true` if the task should end.
fn leave_if_idle(key: &(Mode, String), entry: &Arc<Entry>, paths: &Paths) -> bool {
    let mut paths = paths.lock().unwrap_or_else(|e| e.into_inner());
    if *entry.listeners.borrow() > 0 {
        return false;
    }
    if paths.get(key).is_some_and(|e| Arc::ptr_eq(e, entry)) {
        paths.remove(key);
    }
    true
}
