//! Everything below a znode, with one persistent recursive watch (ZooKeeper 3.6+): each node
//! created, changed (data) or deleted below it, across reconnections and new sessions.
//!
//! What the watch misses is said, not hidden: events while the connection was down are not
//! replayed (ZOOKEEPER-4698), and a new session has none of the old one's watches, so each of
//! those ends in a [Change::Resync] with the state then.

use std::time::Duration;

use futures::FutureExt;
use zookeeper_client::{AddWatchMode, Error as ZkError, EventType, PersistentWatcher, SessionState};

use super::retry_on_loss;
use super::session::ZkSession;

/// What happened below the followed znode.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// Following began: whether the znode exists, and its `mzxid`.
    Start { exists: bool, zxid: Option<i64> },
    /// Changes may have been missed (`reconnected`, `session_expired`): whether it exists now.
    Resync { reason: &'static str, exists: bool },
    /// A node below (or the znode itself) was `created`, `changed` or `deleted`, at `zxid`;
    /// `exists` is the followed znode's existence when the event is about it.
    Node {
        kind: &'static str,
        path: String,
        zxid: Option<i64>,
        exists: Option<bool>,
    },
}

/// Follows everything below `path` on `zk`'s sessions, handing each change to `emit`. Never
/// returns: the caller drops it when nobody listens any more (which drops the watch).
pub async fn follow(zk: &ZkSession, path: &str, mut emit: impl FnMut(Change)) {
    let mut follower = Follower::new(zk, path);
    loop {
        emit(follower.next().await);
    }
}

/// The watch of [follow], driven by its owner: [Follower::next] waits for the next change,
/// [Follower::caught_up] collects what ZooKeeper has sent so far without waiting for more.
///
/// Both are cancel-safe: dropped while waiting, they lose no change (a watch set but not yet
/// announced is dropped with the future and set again).
pub struct Follower {
    zk: ZkSession,
    path: String,
    /// The session's client and the watch on it, once announced.
    current: Option<(zookeeper_client::Client, PersistentWatcher)>,
    started: bool,
    /// Why the next announcement is a resync, when a session ended.
    resync_reason: Option<&'static str>,
    /// The connection dropped: the next reconnection is a resync.
    disconnected: bool,
    /// Reconnected after a drop: the next change is a resync.
    reconnected: bool,
}

/// What one event from the watch comes to.
enum Seen {
    Change(Change),
    /// Nothing to tell (a disconnection, a children event).
    Nothing,
    /// Reconnected after a disconnection: resync.
    Reconnected,
    /// The session ended with the watch.
    Ended,
}

impl Follower {
    pub fn new(zk: &ZkSession, path: &str) -> Follower {
        Follower {
            zk: zk.clone(),
            path: path.to_string(),
            current: None,
            started: false,
            resync_reason: None,
            disconnected: false,
            reconnected: false,
        }
    }

    /// The next change: first a [Change::Start], a [Change::Resync] after a reconnection or a
    /// new session, otherwise each node's.
    pub async fn next(&mut self) -> Change {
        loop {
            let Some((client, watcher)) = &mut self.current else {
                if let Some(change) = self.watch().await {
                    return change;
                }
                continue;
            };
            if self.reconnected {
                // The flag is cleared only once the state is read: dropped before that, the
                // next call reads it again.
                let client = client.clone();
                let exists = retry_on_loss(|| client.check_stat(&self.path)).await;
                self.reconnected = false;
                return Change::Resync {
                    reason: "reconnected",
                    exists: exists.map(|s| s.is_some()).unwrap_or(true),
                };
            }
            let event = watcher.changed().await;
            match self.see(event) {
                Seen::Change(change) => return change,
                Seen::Nothing => {}
                Seen::Reconnected => self.reconnected = true,
                Seen::Ended => self.end_session(),
            }
        }
    }

    /// Every change ZooKeeper sent before now: one read on the watch's session (ZooKeeper
    /// sends a session its watch events before the reply to any later request, and the client
    /// hands them on in that order), then every event that came before its reply. `Err` when
    /// there is no watch (not started, or between sessions) or the read failed.
    pub async fn caught_up(&mut self) -> Result<Vec<Change>, ZkError> {
        let Some((client, _)) = &self.current else {
            return Err(ZkError::ConnectionLoss);
        };
        let client = client.clone();
        retry_on_loss(|| client.check_stat(&self.path)).await?;
        let mut changes = Vec::new();
        loop {
            let Some((_, watcher)) = &mut self.current else {
                return Err(ZkError::SessionExpired);
            };
            let Some(event) = watcher.changed().now_or_never() else {
                return Ok(changes);
            };
            match self.see(event) {
                Seen::Change(change) => changes.push(change),
                Seen::Nothing => {}
                // Changes may have been missed: [Self::next] resyncs first.
                Seen::Reconnected => {
                    self.reconnected = true;
                    return Err(ZkError::ConnectionLoss);
                }
                Seen::Ended => {
                    self.end_session();
                    return Err(ZkError::SessionExpired);
                }
            }
        }
    }

    fn end_session(&mut self) {
        self.resync_reason = Some("session_expired");
        self.current = None;
        self.disconnected = false;
        self.reconnected = false;
    }

    /// Sets the watch on the current session and reads the state: the announcement.
    async fn watch(&mut self) -> Option<Change> {
        let Ok(session) = self.zk.connected().await else {
            // No session: wait for the supervisor's next one. Whatever happens meanwhile is
            // lost to this watch, so the next state is a resync.
            self.resync_reason.get_or_insert("session_expired");
            if self.zk.next_session(None).await.is_none() {
                return std::future::pending().await;
            }
            return None;
        };
        // The watch first, then the state: a change in between is both in the state and an
        // event, never in neither.
        let path = self.path.as_str();
        let watcher = match retry_on_loss(|| session.client().watch(path, AddWatchMode::PersistentRecursive)).await {
            Ok(watcher) => watcher,
            Err(err) => {
                tracing::warn!(%path, error = %err, "recursive watch could not be set; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
                return None;
            }
        };
        let stat = retry_on_loss(|| session.client().check_stat(path)).await.ok()?;
        let exists = stat.is_some();
        let change = match self.resync_reason.take() {
            Some(reason) => Change::Resync { reason, exists },
            None if !self.started => Change::Start {
                exists,
                zxid: stat.map(|s| s.mzxid),
            },
            None => Change::Resync {
                reason: "reconnected",
                exists,
            },
        };
        self.started = true;
        self.disconnected = false;
        self.reconnected = false;
        self.current = Some((session.client().clone(), watcher));
        Some(change)
    }

    fn see(&mut self, event: zookeeper_client::WatchedEvent) -> Seen {
        let zxid = (event.zxid >= 0).then_some(event.zxid);
        let kind = match event.event_type {
            EventType::Session => {
                return match event.session_state {
                    SessionState::Disconnected => {
                        self.disconnected = true;
                        Seen::Nothing
                    }
                    SessionState::SyncConnected | SessionState::ConnectedReadOnly if self.disconnected => {
                        self.disconnected = false;
                        Seen::Reconnected
                    }
                    SessionState::SyncConnected | SessionState::ConnectedReadOnly => Seen::Nothing,
                    // The session ended: the watch went with it (and must not be polled again).
                    // Set a new one on the next session.
                    _ => Seen::Ended,
                };
            }
            EventType::NodeCreated => "created",
            EventType::NodeDeleted => "deleted",
            EventType::NodeDataChanged => "changed",
            EventType::NodeChildrenChanged => return Seen::Nothing,
        };
        let exists = (event.path == self.path).then_some(kind != "deleted");
        Seen::Change(Change::Node {
            kind,
            path: event.path,
            zxid,
            exists,
        })
    }
}
