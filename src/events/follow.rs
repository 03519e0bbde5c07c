//! The tasks that feed topics: a recipe's source (its shared watches, a re-read on each
//! change), a znode followed recursively, a lease of this instance.

use super::*;

/// A source's task: publish the first state, then each change, until nobody listens. After
/// ZooKeeper comes back from a disconnection or a session expiry it publishes the state as a
/// `resync` whether or not it changed: watches do not report what happened while the
/// connection was down (ZOOKEEPER-4698 for persistent ones; a new session has none of the old
/// one's), so subscribers are told honestly instead of trusting a silent gap.
pub(super) async fn follow<S: Source>(publisher: Publisher, source: S) {
    let mut recoveries = Recoveries::new(&publisher.events.zk);
    // The watches first, then the read: a change after the watches are set wakes the loop
    // even if the read missed it.
    let mut watching = source.watches(None);
    let mut watches = publisher.events.watch_all(&watching);
    let Some(mut last) = Box::pin(read_until_done(&publisher, &source, true)).await else {
        return;
    };
    let zxid = watches
        .iter()
        .filter_map(|(mode, watch)| zxid_of(*mode, &watch.known()))
        .max();
    publisher.publish("state", to_json(&last), zxid);
    loop {
        // The state may call for other watches (a new lock holder's node). A new watch counts
        // as changed, so the state is read again once it is set, and nothing that changed
        // between the last read and the watch is missed.
        let wanted = source.watches(Some(&last));
        if wanted != watching {
            watches = publisher.events.watch_all(&wanted);
            for (_, watch) in &mut watches {
                watch.mark_changed();
            }
            watching = wanted;
        }
        let any_change = futures::future::select_all(watches.iter_mut().map(|(_, w)| Box::pin(w.changed())));
        let resync = tokio::select! {
            (changed, _, _) = any_change => if changed { None } else { return },
            reason = recoveries.next() => Some(reason),
            _ = publisher.idle() => return,
        };
        // Mark what the watches saw as seen *before* reading: a change that lands during the
        // read then wakes the loop again. (Marking after the read would swallow it, and the
        // state would stay behind with nothing left to wake it.)
        let zxid = last_zxid(&mut watches);
        let Some(after) = Box::pin(read_until_done(&publisher, &source, resync.is_some())).await else {
            return;
        };
        if let Some(reason) = resync {
            publisher.resync(reason, to_json(&after));
        } else if let Some(event) = source.change(&last, &after) {
            publisher.publish(event.name(), to_json(&after), zxid);
        }
        last = after;
    }
}

/// Reads the source's state on the instance's primary session, trying again while it fails:
/// waiting for the next change instead could leave the subscribers with a stale state for
/// good. Without a session it waits for the next one ([ZkSession::next_session]); a read that
/// failed on a connected session is tried again a moment later. `None` once nobody listens any
/// more.
///
/// [ZkSession::next_session]: crate::zk::session::ZkSession::next_session
///
/// A topic's first state, and its state after a reconnection or a new session (a `resync`),
/// is read after a `sync` (`synced`), like a linearizable `GET`: a subscriber starts from
/// every write acknowledged before it subscribed. After that each read follows a watch event,
/// and the session's server sends the event before any read that could see the change, so
/// the states that follow need no `sync` of their own.
pub(super) async fn read_until_done<S: Source>(publisher: &Publisher, source: &S, synced: bool) -> Option<S::State> {
    let zk = &publisher.events.zk;
    loop {
        match zk.connected().await {
            Ok(session) => {
                if (!synced || session.sync().await.is_ok())
                    && let Ok(state) = source.read(&session).await
                {
                    return Some(state);
                }
            }
            Err(_) => {
                let mut listeners = publisher.topic.listeners.subscribe();
                // `None` from either: the instance stops, or nobody listens.
                tokio::select! {
                    session = zk.next_session(None) => session?,
                    _ = listeners.wait_for(|n| *n == 0) => return None,
                };
                continue;
            }
        }
        if *publisher.topic.listeners.borrow() == 0 {
            return None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

pub(super) fn to_json<T: Serialize>(state: &T) -> serde_json::Value {
    serde_json::to_value(state).unwrap_or_default()
}

/// The zxid of the last change the shared watches saw (marking them seen): a node's `mzxid`
/// for an exists-watch, its `pzxid` (last child created or deleted) for a children watch.
pub(super) fn last_zxid(watches: &mut [(Mode, crate::zk::watch::Subscription)]) -> Option<i64> {
    watches
        .iter_mut()
        .filter_map(|(mode, watch)| zxid_of(*mode, &watch.see()))
        .max()
}

pub(super) fn zxid_of(mode: Mode, known: &crate::zk::watch::Known) -> Option<i64> {
    let stat = known.as_ref()?.as_ref()?;
    Some(match mode {
        Mode::Exists => stat.mzxid,
        Mode::Children => stat.pzxid,
    })
}

/// A recursive znode topic's task: [crate::zk::recursive::follow] until nobody listens.
pub(super) async fn follow_recursive(publisher: Publisher, path: String, root: String) {
    let relative = |node: &str| {
        node.strip_prefix(&root)
            .unwrap_or(node)
            .trim_start_matches('/')
            .to_string()
    };
    let exists = |exists: bool| serde_json::json!({ "exists": exists });
    let follow = crate::zk::recursive::follow(publisher.zk(), &path, |change| match change {
        Change::Start { exists: e, zxid } => publisher.publish("state", exists(e), zxid),
        Change::Resync { reason, exists: e } => publisher.resync(reason, exists(e)),
        Change::Node {
            kind,
            path,
            zxid,
            exists: e,
        } => publisher.publish_node(kind, relative(&path), zxid, e.map(exists)),
    });
    tokio::select! {
        _ = follow => {}
        _ = publisher.idle() => {}
    }
}

/// A lease topic's task: timers, not polling. It sleeps until the time to warn, and wakes at
/// once when the lease ends.
pub(super) async fn follow_lease(publisher: Publisher, leases: Leases, lease: Arc<Lease>) {
    let live = |lease: &Lease| serde_json::json!({ "ended": false, "ttl_ms": lease.ttl.as_millis() as u64, "remaining_ms": lease.remaining().as_millis() as u64 });
    publisher.publish("state", live(&lease), None);
    let warn_before = lease.ttl / 3;
    let mut warned = false;
    loop {
        let remaining = lease.remaining();
        let wake = if remaining > warn_before {
            warned = false;
            remaining - warn_before
        } else {
            if !warned {
                publisher.publish("expiring", live(&lease), None);
                warned = true;
            }
            // A keepalive moves the deadline: look again when it would have passed.
            remaining.max(std::time::Duration::from_millis(50))
        };
        tokio::select! {
            _ = tokio::time::sleep(wake) => {}
            _ = lease.ended().cancelled() => break,
            _ = publisher.idle() => return,
        }
    }
    let reason = match leases.peek(&lease.id) {
        Err(LeaseError::Ended { reason, .. }) => reason,
        _ => EndReason::Deleted,
    };
    let kind = if reason == EndReason::Deleted { "ended" } else { "lost" };
    publisher.publish(kind, serde_json::json!({ "ended": true, "reason": reason }), None);
    publisher.idle().await;
}
