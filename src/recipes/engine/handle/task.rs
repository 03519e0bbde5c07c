//! A handle's task: runs its protocol on a session of its lease's, again on the next session
//! after an interruption, until the handle is released, its lease ends or moves, or its node
//! is lost; then cleans up what it made and says how it ended.

use std::sync::Arc;
use std::time::Duration;

use zookeeper_client::Error as ZkError;

use super::{Exit, Handle, Phase, Protocol, delete_held, names_handle};
use crate::recipes::engine::lease::EndReason;

/// How a handle's task stopped running its protocol.
enum Stop {
    /// The run ended by itself.
    Exit(Exit),
    /// Released, or its lease ended: its znodes go.
    Leave,
    /// Its lease left this instance: its znodes stay, for the keeper now.
    Drop,
    /// Its clean-up found it lost (its node gone, which it deleted the holding record of, or its
    /// lease ended otherwise than by its owner): said so, without asking ZooKeeper again.
    Lost(String),
}

/// Runs the protocol until it ends (again on each new session, see the module's docs), then
/// cleans up and reports.
pub(super) async fn drive<P: Protocol>(handle: &Arc<Handle<P>>) {
    let lease = &handle.lease;
    let stop = run_until_stopped(handle).await;
    // Why, for the log: which way the task stopped.
    let why = match &stop {
        Stop::Exit(_) => "its run ended",
        Stop::Leave if handle.release.is_cancelled() => "released here",
        Stop::Leave => "its lease ended",
        Stop::Drop => "its lease left this instance",
        Stop::Lost(_) => "its clean-up found it lost",
    };
    let end = phase_after(handle, stop).await;
    tracing::debug!(kind = %handle.protocol.kind(), name = %handle.name, handle = %handle.id, lease = %handle.lease.id, phase = end.name(), why, "handle finished");
    handle.record_end(&end);
    let lost = matches!(end, Phase::Lost { .. });
    handle.set_phase(end);
    if lost && !handle.is_leaving() {
        // The holding record stays, so that the loss shows on the lease (here and on any keeper
        // after this one), until the holder releases the handle or the lease ends.
        tokio::select! {
            _ = handle.release.cancelled() => remove_record(handle).await,
            _ = lease.ended().cancelled() => remove_record(handle).await,
            _ = lease.dropped().cancelled() => {}
        }
    }
    // Lost handles stay on the lease so that its holder learns of the loss; the rest leave it,
    // before they say they finished (a request waiting for that reads the lease without it).
    if !lost {
        handle.detach();
    }
    handle.finished.send_replace(true);
}

/// Runs the protocol on each new session until it stops (cleaning up when it leaves).
async fn run_until_stopped<P: Protocol>(handle: &Arc<Handle<P>>) -> Stop {
    let lease = &handle.lease;
    let mut ended_generation = None;
    loop {
        // A handle that may have znodes (adopted, or run before) cleans up on a session even
        // when it is asked to leave before it has one; one that never ran has nothing to clean.
        let fresh = handle.may_create() && ended_generation.is_none();
        let session = tokio::select! {
            session = connected_after(&lease.zk, ended_generation) => session,
            _ = handle.release.cancelled(), if fresh => break Stop::Leave,
            _ = lease.ended().cancelled(), if fresh => break Stop::Leave,
            _ = lease.dropped().cancelled() => break Stop::Drop,
        };
        let client = session.client();
        let run = handle.protocol.run(handle, client);
        tokio::pin!(run);
        let stop = tokio::select! {
            exit = &mut run => Stop::Exit(exit),
            _ = handle.release.cancelled() => Stop::Leave,
            _ = lease.ended().cancelled() => Stop::Leave,
            _ = lease.dropped().cancelled() => Stop::Drop,
        };
        match stop {
            // Its watches went with the session: on the next one.
            Stop::Exit(Exit::Interrupted) => ended_generation = Some(session.generation),
            Stop::Leave => {
                if let Some(stop) = hold_for_lock_delay(handle, client).await {
                    break stop;
                }
                // Clean up while the run (pinned in this block) and its watches are still alive:
                // a deletion fires a watch and the server forgets it, where dropping it first
                // would cost a removeWatches request on every release.
                match handle.protocol.clean_up(handle, client).await {
                    Ok(was_there) => break left(handle, was_there),
                    Err(err) => {
                        tracing::debug!(handle = %handle.id, error = %err, "clean-up interrupted; trying again");
                        after_failure(&lease.zk, session.generation, &err).await;
                        break clean_up_later(handle).await;
                    }
                }
            }
            stop => break stop,
        }
    }
}

/// A lock held by a lease that *expired* stays held for the lease's lock-delay (Chubby's and
/// Consul's): its holder was cut off, not letting go, and its last writes may still be on their
/// way to what the lock guards. So its node stays, and every waiter, zkgate's, Curator's or
/// kazoo's alike, keeps waiting on it with nothing to know; it is marked with the time it goes
/// (for views), and deleted then, or at once if its holder releases it meanwhile. Whichever
/// instance ends the lease holds the delay, counted from the end its record says: the keeper
/// that expired it, a visitor that drives the lock, or the one that takes the tombstone up
/// after they are gone (the reaper's take-up: then the delay is late by the reaper's period
/// at most). `Some(Stop::Drop)` if the lease left this instance meanwhile.
async fn hold_for_lock_delay<P: Protocol>(handle: &Arc<Handle<P>>, client: &zookeeper_client::Client) -> Option<Stop> {
    let until = handle.lease.delayed_until()?;
    let left = until.duration_since(std::time::SystemTime::now()).ok()?;
    if handle.release.is_cancelled() {
        return None;
    }
    let until_ms = crate::time::millis_of(until);
    match handle.protocol.hold_delayed(handle, client, until_ms).await {
        Ok(true) => {}
        Ok(false) => return None,
        Err(err) => {
            // Unmarked, the lock is still held (its node stays): the delay goes on.
            tracing::debug!(handle = %handle.id, error = %err, "could not mark a delayed lock");
        }
    }
    tracing::info!(kind = %handle.protocol.kind(), name = %handle.name, lease = %handle.lease.id, delay = ?left, "lock held by an expired lease for its lock-delay");
    let kind = handle.protocol.kind().label();
    crate::metrics::get().lock_delays.with_label_values(&[kind]).inc();
    tokio::select! {
        _ = tokio::time::sleep(left) => None,
        _ = handle.release.cancelled() => None,
        _ = handle.lease.dropped().cancelled() => Some(Stop::Drop),
    }
}

/// The phase a handle ends in after `stop`.
async fn phase_after<P: Protocol>(handle: &Arc<Handle<P>>, stop: Stop) -> Phase {
    match stop {
        Stop::Drop | Stop::Exit(Exit::Moved) => Phase::Moved,
        Stop::Exit(Exit::Failed(error)) => Phase::Failed { error },
        // A loss found by the clean-up itself (its node gone, or its lease expired) is one.
        Stop::Lost(reason) => Phase::Lost { reason },
        // A node the run saw vanish may have been released through another instance, even
        // while a release here was starting: a release sent again after its first attempt's
        // answer was lost (that one, through an instance that died, deleted it), which is
        // answered as the release it is, not as a loss.
        Stop::Exit(Exit::Lost(reason)) => match (lease_ended(handle).await, released_elsewhere(handle).await) {
            (Some(EndReason::Deleted), _) | (None, true) => Phase::Released,
            (Some(ended), _) => Phase::Lost {
                reason: ended.describe().to_string(),
            },
            (None, false) => Phase::Lost { reason },
        },
        Stop::Exit(Exit::Interrupted) | Stop::Leave => Phase::Released,
    }
}

/// Deletes the holding record of a lost handle (its znode is gone already), on the sessions that
/// follow until it is done or the lease leaves this instance.
async fn remove_record<P: Protocol>(handle: &Arc<Handle<P>>) {
    let (zk, record_name) = (&handle.lease.zk, handle.record_path());
    loop {
        let session = tokio::select! {
            session = connected_after(zk, None) => session,
            _ = handle.lease.dropped().cancelled() => return,
        };
        match delete_held(session.client(), &[], &record_name, &handle.id, &[]).await {
            Ok(_) => return,
            Err(err) => after_failure(zk, session.generation, &err).await,
        }
    }
}

/// How a handle that left ended, from whether its znode was still there: a lease that ended
/// otherwise than by its owner's delete (it expired) took what it held away from its holder,
/// which is a loss, said as one, not a release the holder asked for; so is a node found gone.
fn left<P: Protocol>(handle: &Handle<P>, was_there: bool) -> Stop {
    let taken = handle
        .lease
        .end_reason()
        .filter(|r| *r != EndReason::Deleted && !handle.release.is_cancelled());
    // Its owner deleted the lease: whoever deleted the znodes first (the keeper, for a holding
    // driven elsewhere), they were released as asked.
    let deleted = handle.lease.end_reason() == Some(EndReason::Deleted);
    match taken {
        Some(reason) => Stop::Lost(reason.describe().to_string()),
        None if was_there || deleted => Stop::Leave,
        None => Stop::Lost(handle.protocol.loss_reason(handle)),
    }
}

/// Cleans up on the sessions that follow, until it is done or the lease leaves this instance
/// (the reaper finishes what an ended lease leaves behind, see [crate::recipes::leases]).
async fn clean_up_later<P: Protocol>(handle: &Arc<Handle<P>>) -> Stop {
    let zk = &handle.lease.zk;
    loop {
        let session = tokio::select! {
            session = connected_after(zk, None) => session,
            _ = handle.lease.dropped().cancelled() => return Stop::Drop,
        };
        match handle.protocol.clean_up(handle, session.client()).await {
            Ok(was_there) => return left(handle, was_there),
            Err(err) => after_failure(zk, session.generation, &err).await,
        }
    }
}

/// Whether the lease of a holding whose znode vanished has ended, and why: a lease visited
/// here may have ended on its keeper a moment ago (which deleted the znode), before the watch
/// on its record told this instance; its record says so now.
async fn lease_ended<P: Protocol>(handle: &Handle<P>) -> Option<EndReason> {
    let lease = &handle.lease;
    if lease.is_visiting()
        && lease.end_reason().is_none()
        && let Ok(session) = lease.session().await
    {
        let _ = lease.refresh(session.client()).await;
    }
    lease.end_reason()
}

/// Whether a holding whose znode vanished was released (through another instance, which
/// deletes its holding record with its znodes) rather than lost (its holding record stays,
/// so that its holder learns of the loss until it releases the handle).
async fn released_elsewhere<P: Protocol>(handle: &Handle<P>) -> bool {
    let Ok(session) = handle.lease.session().await else {
        return false;
    };
    // After a `sync`: the holding record may have been made through another server a moment ago
    // (a holding adopted in a takeover), and a stale "no holding record" would call a loss a release.
    if session.sync().await.is_err() {
        return false;
    }
    // A holding record of the same name that names another handle is a successor's: this one's went.
    let (lease, name) = (&handle.lease.path, handle.record_name());
    matches!(names_handle(session.client(), lease, name, &handle.id).await, Ok(false))
}

/// A connected session of `zk` other than the one of generation `not` (one found ended),
/// waited for without polling ([ZkSession::next_session]); once the supervisor has stopped (the
/// instance is shutting down), nothing more to run on: never.
///
/// [ZkSession::next_session]: crate::zk::session::ZkSession::next_session
async fn connected_after(zk: &crate::zk::session::ZkSession, not: Option<u64>) -> crate::zk::session::Session {
    match zk.next_session(not).await {
        Some(session) => session,
        None => std::future::pending().await,
    }
}

/// Waits before trying again what failed on the session of generation `generation`: for the
/// next session if that one ended, else a moment.
async fn after_failure(zk: &crate::zk::session::ZkSession, generation: u64, err: &ZkError) {
    match err {
        ZkError::SessionExpired | ZkError::ClientClosed => {
            connected_after(zk, Some(generation)).await;
        }
        _ => tokio::time::sleep(Duration::from_millis(500)).await,
    }
}
