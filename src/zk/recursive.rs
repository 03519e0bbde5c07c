//! Everything below a znode, with one persistent recursive watch (ZooKeeper 3.6+): each node
//! created, changed (data) or deleted below it, across reconnections and new sessions.
//!
//! What the watch misses is said, not hidden: events while the connection was down are not
//! replayed (ZOOKEEPER-4698), and a new session has none of the old one's watches, so each of
//! those ends in a [Change::Resync] with the state then.

use std::time::Duration;

use zookeeper_client::{AddWatchMode, EventType, SessionState};

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
    let mut started = false;
    let mut resync_reason: Option<&'static str> = None;
    loop {
        let Ok(session) = zk.connected().await else {
            // No session: wait for the supervisor's next one. Whatever happens meanwhile is
            // lost to this watch, so the next state is a resync.
            resync_reason.get_or_insert("session_expired");
            let mut status = zk.subscribe();
            if status.changed().await.is_err() {
                return std::future::pending().await;
            }
            continue;
        };
        // The watch first, then the state: a change in between is both in the state and an
        // event, never in neither.
        let mut watcher = match retry_on_loss(|| session.client.watch(path, AddWatchMode::PersistentRecursive)).await {
            Ok(watcher) => watcher,
            Err(err) => {
                tracing::warn!(%path, error = %err, "recursive watch could not be set; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let Ok(stat) = retry_on_loss(|| session.client.check_stat(path)).await else {
            continue;
        };
        let exists = stat.is_some();
        match resync_reason.take() {
            Some(reason) => emit(Change::Resync { reason, exists }),
            None if !started => emit(Change::Start {
                exists,
                zxid: stat.map(|s| s.mzxid),
            }),
            None => emit(Change::Resync {
                reason: "reconnected",
                exists,
            }),
        }
        started = true;
        let mut disconnected = false;
        loop {
            let event = watcher.changed().await;
            let zxid = (event.zxid >= 0).then_some(event.zxid);
            let kind = match event.event_type {
                EventType::Session => match event.session_state {
                    SessionState::Disconnected => {
                        disconnected = true;
                        continue;
                    }
                    SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                        if std::mem::take(&mut disconnected) {
                            let exists = retry_on_loss(|| session.client.check_stat(path)).await;
                            let exists = exists.map(|s| s.is_some()).unwrap_or(true);
                            emit(Change::Resync {
                                reason: "reconnected",
                                exists,
                            });
                        }
                        continue;
                    }
                    // The session ended: the watch went with it (and must not be polled again).
                    // Set a new one on the next session.
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
            let exists = (event.path == path).then_some(kind != "deleted");
            emit(Change::Node {
                kind,
                path: event.path,
                zxid,
                exists,
            });
        }
    }
}
