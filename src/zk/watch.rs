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

use crate::locked::Locked;
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
    /// The state, with the number of the read that saw it.
    state: watch::Sender<(Known, u64)>,
    /// How many reads the task has sent (each numbered, from 1).
    issued: std::sync::atomic::AtomicU64,
    /// Asks the task for a read now ([Subscription::read_fresh]); one stored permit, so that
    /// the askers of one moment share one read.
    refresh: tokio::sync::Notify,
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
    state: watch::Receiver<(Known, u64)>,
    entry: Arc<Entry>,
}

impl Subscription {
    /// Waits until the path's known state satisfies `wanted` (at once if it does now).
    ///
    /// The known state may lag a read the caller has just made on the same session: it was
    /// read when the watch last fired, and its next read may still be on its way. So a caller
    /// that acts on a state it has not read itself (a decision that, once made, stays) may use
    /// this; one that has just read the path itself and saw the opposite uses
    /// [Subscription::read_fresh].
    pub async fn wait_for(&mut self, wanted: impl Fn(&Known) -> bool) {
        let _ = self.state.wait_for(|(known, _)| wanted(known)).await;
    }

    /// The path's last known state.
    pub fn known(&self) -> Known {
        self.state.borrow().0
    }

    /// The path's last known state, marked as seen (for [Subscription::changed]).
    pub fn see(&mut self) -> Known {
        self.state.borrow_and_update().0
    }

    /// Makes the next [Subscription::changed] return at once.
    pub fn mark_changed(&mut self) {
        self.state.mark_changed();
    }

    /// Waits for the next state the watch publishes; `false` if it never will.
    pub async fn changed(&mut self) -> bool {
        self.state.changed().await.is_ok()
    }

    /// Waits until a read of the path sent after this call satisfies `wanted`, asking the watch
    /// for one now: the path's state as of this moment at the earliest, never an older one the
    /// watch still holds (a barrier down before it was raised again). The askers of one moment
    /// share the read (the one in flight when a caller asks was sent before it: not its to
    /// share; the next one is), so a thousand waiters arriving together cost a few reads, not
    /// a thousand. With a `sync` on the watch's session before it, the state is at least as
    /// new as every write acknowledged before the `sync` ([crate::zk::sync]).
    pub async fn read_fresh(&mut self, wanted: impl Fn(&Known) -> bool) {
        let after = self.entry.issued.load(std::sync::atomic::Ordering::SeqCst);
        self.entry.refresh.notify_one();
        let _ = self
            .state
            .wait_for(|(known, read)| *read > after && wanted(known))
            .await;
    }
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

    pub fn subscribe_to(&self, mode: Mode, path: &str) -> Subscription {
        let key = (mode, path.to_string());
        let mut paths = self.paths.locked();
        let (entry, new) = match paths.get(&key) {
            Some(entry) if *entry.listeners.borrow() > 0 => (entry.clone(), false),
            _ => {
                let entry = Arc::new(Entry {
                    state: watch::Sender::new((None, 0)),
                    issued: Default::default(),
                    refresh: tokio::sync::Notify::new(),
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
        let paths = self.paths.locked();
        paths
            .get(&(Mode::Exists, path.to_string()))
            .map(|entry| entry.listeners.subscribe())
    }
}

/// Keeps one exists-watch armed on `path` while anyone listens; publishes each state.
async fn keep_watching(zk: ZkSession, key: (Mode, String), entry: Arc<Entry>, paths: Paths) {
    let (mode, path) = (key.0, key.1.clone());
    let mut listeners = entry.listeners.subscribe();
    let mut _replaced = None;
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
            tokio::select! {
                _ = zk.next_session(None) => continue,
                _ = listeners.wait_for(|n| *n == 0) => {
                    if leave_if_idle(&key, &entry, &paths) { return }
                    continue;
                }
            }
        };
        // Numbered before it is sent: see [Subscription::read_fresh].
        let read = entry.issued.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let armed = match mode {
            Mode::Exists => retry_on_loss(|| session.client().check_and_watch_stat(&path)).await,
            Mode::Children => match retry_on_loss(|| session.client().get_and_watch_children(&path)).await {
                Ok((_, stat, watcher)) => Ok((Some(stat), watcher)),
                // No parent yet: follow its creation instead.
                Err(zookeeper_client::Error::NoNode) => retry_on_loss(|| session.client().check_and_watch_stat(&path))
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
                entry.state.send_replace((Some(stat), read));
                let mut changed = Box::pin(watcher.changed());
                // The watch a refresh replaced goes only now that its successor is armed: the
                // client removes a path's watch from the server when its last watcher drops,
                // and the path would be unwatched in between.
                _replaced = None;
                tokio::select! {
                    _ = &mut changed => {}
                    // Read again (arming the same watch: ZooKeeper keeps one per path and
                    // session) for a subscriber that needs a state newer than this one.
                    _ = entry.refresh.notified() => _replaced = Some(changed),
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
    let mut paths = paths.locked();
    if *entry.listeners.borrow() > 0 {
        return false;
    }
    if paths.get(key).is_some_and(|e| Arc::ptr_eq(e, entry)) {
        paths.remove(key);
    }
    true
}
