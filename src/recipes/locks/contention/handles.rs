//! A handle as its holder reads it, waits on it and releases it by its id: kept here (its
//! task's view), or found in ZooKeeper by its GUID on any instance.

use super::*;
use crate::kind::Kind;
use crate::recipes::consistency::Consistency;
use crate::recipes::locks::semaphore;
use crate::zk::Session;

/// A handle as a request finds it.
pub enum Found<P: Protocol> {
    /// Its lease is kept here: its task's view.
    Here(Arc<Handle<P>>),
    /// Its lease is kept by another instance (or its keeper is gone): as ZooKeeper has it.
    There(Box<Recorded>),
}

/// The handle `handle` of resource `name` of `handles`, if `caller` may use it: this
/// instance's own if it keeps its lease, else as ZooKeeper has it (read on `client`); 404 if
/// neither has it, 410 if it was lost here.
pub async fn find_handle<P: Protocol>(
    handles: &Handles<P>,
    session: &Session,
    caller: &Caller,
    name: &str,
    handle: &str,
) -> Result<Found<P>, ApiError> {
    check_name(name)?;
    let what = handles.kind().name();
    if let Some(found) = handles.serving(name, handle) {
        found.lease.check_owner(caller)?;
        if still_recorded(handles, session, &found).await? {
            return Ok(Found::Here(found));
        }
    }
    // A handle lost (its lease expired, its node deleted...) and since forgotten: its holder
    // learns that it lost the lock, not that it never had it.
    if let Some(lost) = handles.lost(name, handle)
        && caller.owns(lost.principal.as_deref())
    {
        return Err(ApiError::new(
            Problem::LockLost,
            format!("handle `{handle}` lost {what} `{name}`: {}", lost.reason),
        )
        .with("reason", lost.reason));
    }
    let Some(recorded) = lookup(session, handles, name, handle).await? else {
        return Err(ApiError::not_found(
            "handle",
            format!("no handle `{handle}` for {what} `{name}` (released, or lost with its lease or its node)"),
        ));
    };
    // A node that records no principal (made without auth) is anyone's, as before auth.
    if let Some(principal) = recorded.owner().and_then(|owner| owner.principal) {
        caller.require_owner(Some(&principal), &format!("handle `{handle}`"))?;
    }
    Ok(Found::There(Box::new(recorded)))
}

/// Whether a handle kept here is still its lease's (read on `client`): a release through
/// another instance deletes its holding record with its znodes, which this instance's task sees
/// only when its watch fires. One found released so is let go here, and is gone. A lost
/// handle keeps its holding record (until released), and a pending one may not have it yet.
pub(in crate::recipes) async fn still_recorded<P: Protocol>(
    handles: &Handles<P>,
    session: &Session,
    handle: &Arc<Handle<P>>,
) -> Result<bool, ApiError> {
    let phase = handle.state().phase;
    if matches!(phase, Phase::Lost { .. }) || (phase == Phase::Pending && handle.may_create()) {
        return Ok(true);
    }
    if recorded::names(session, &handle.lease.path, handle.record_name(), &handle.id).await? {
        return Ok(true);
    }
    tracing::debug!(handle = %handle.id, lease = %handle.lease.id, "handle let go: its record_name is gone (released through another instance)");
    let (handles, handle) = (handles.clone(), handle.clone());
    tokio::spawn(async move { handles.release(&handle).await });
    Ok(false)
}

/// The handle as ZooKeeper has it: a semaphore's permit request, or a contender.
pub(in crate::recipes) async fn lookup<P: Protocol>(
    session: &Session,
    handles: &Handles<P>,
    name: &str,
    handle: &str,
) -> Result<Option<Recorded>, crate::zk::Failure> {
    let dir = handles.dir(name);
    match handles.kind() {
        Kind::Semaphore => semaphore::recorded(session, &dir, name, handle).await,
        kind => recorded::recorded(session, kind, &dir, name, handle).await,
    }
}

/// A handle as [read_handle] saw it.
pub enum Seen<P: Protocol> {
    /// Kept here, its lease confirmed kept (or ended here): its task's view.
    Here(Arc<Handle<P>>),
    /// As ZooKeeper has it.
    There(Box<Recorded>),
}

/// Where the handle stands (`GET .../handles/{handle}` of a contender kind, a semaphore's
/// `GET .../permits/{handle}`), after waiting (up to `wait`) for news: a revocation asked, a
/// loss, or (for a waiter) the grant; read at `consistency`.
pub async fn read_handle<P: Protocol>(
    recipes: &Recipes,
    handles: &Handles<P>,
    caller: &Caller,
    (name, handle): (&str, &str),
    wait: Option<Duration>,
    consistency: Consistency,
) -> Result<Seen<P>, ApiError> {
    let session = recipes.reader(consistency).await?;
    match find_handle(handles, &session, caller, name, handle).await? {
        Found::Here(contender) => {
            wait_for_news(recipes, &contender, wait).await;
            // A handle whose lease ended here says so itself; one whose lease is still kept
            // here is confirmed kept (not taken over meanwhile), else read from ZooKeeper.
            let confirmed =
                contender.lease.ended().is_cancelled() || recipes.confirm(&contender.lease, consistency).await.is_ok();
            if confirmed {
                return Ok(Seen::Here(contender));
            }
            match lookup(&session, handles, name, handle).await? {
                Some(recorded) => Ok(Seen::There(Box::new(recorded))),
                None => Err(ApiError::not_found(
                    "handle",
                    format!("no handle `{handle}` for {} `{name}`", handles.kind().name()),
                )),
            }
        }
        Found::There(recorded) => {
            let recorded = await_news_there(recipes, &session, handles, *recorded, wait).await?;
            Ok(Seen::There(Box::new(recorded)))
        }
    }
}

/// A waiting contender's position, read afresh on the primary session (see
/// [crate::recipes::engine::contender::position_now]).
pub async fn fresh_position(recipes: &Recipes, contender: &Contender) -> Option<usize> {
    let session = recipes.zk().current().ok()?;
    crate::recipes::engine::contender::position_now(&session, contender).await
}

/// Waits (up to `wait`) for news on a handle kept here: a revocation asked, a loss, or (for a
/// waiter) the grant.
pub async fn wait_for_news<P: Protocol>(recipes: &Recipes, handle: &Handle<P>, wait: Option<Duration>) {
    let Some(wait) = wait else { return };
    let was_held = matches!(handle.state().phase, Phase::Held { .. });
    let mut updates = handle.subscribe();
    let news = updates.wait_for(|s| {
        s.revocation.is_some() || s.phase.is_final() || (!was_held && matches!(s.phase, Phase::Held { .. }))
    });
    crate::admission::park();
    let _ = tokio::time::timeout(recipes.wait(Some(wait)), news).await;
}

/// Waits for news (as [wait_for_news] says) on a handle as ZooKeeper has it: watching the
/// one node that decides it next, reading it again after each change. 410 if it went meanwhile
/// (released, or lost).
pub async fn await_news_there<P: Protocol>(
    recipes: &Recipes,
    session: &Session,
    handles: &Handles<P>,
    recorded: Recorded,
    wait: Option<Duration>,
) -> Result<Recorded, ApiError> {
    let Some(wait) = wait else { return Ok(recorded) };
    crate::admission::park();
    let until = tokio::time::Instant::now() + recipes.wait(Some(wait));
    let was_held = recorded.holds();
    let mut current = recorded;
    loop {
        let news = current.revocation().is_some() || (!was_held && current.holds());
        if news || tokio::time::Instant::now() >= until {
            return Ok(current);
        }
        recorded::await_change(session, &current, until).await?;
        current = match lookup(session, handles, &current.name, &current.handle).await? {
            Some(now) => now,
            None => {
                return Err(ApiError::new(
                    Problem::LockLost,
                    format!(
                        "handle `{}` of {} `{}` is gone: released, or lost with its lease or its node",
                        current.handle,
                        handles.kind().name(),
                        current.name
                    ),
                )
                .with("reason", "its znode was deleted"));
            }
        };
    }
}

/// `DELETE .../{name}/handles/{handle}`: a handle kept here is released at once, its task
/// deleting its znodes and holding record in one multi-op (nothing read first: if another instance
/// released it already there is nothing left to delete, and the answer is the same `204`); any
/// other as ZooKeeper has it, after a `sync` (see [find_handle]); 410 if the lock had been lost before.
pub async fn release_by_id<P: Protocol>(
    recipes: &Recipes,
    handles: &Handles<P>,
    caller: &Caller,
    name: &str,
    handle: &str,
) -> Result<(), ApiError> {
    check_name(name)?;
    if let Some(here) = handles.serving(name, handle) {
        here.lease.check_owner(caller)?;
        return release(recipes, handles, Found::Here(here)).await;
    }
    // Read as this session's server has it, and again after a `sync` only if it is not there:
    // a handle acquired through another instance a moment ago may not have reached this
    // server yet. One found is deleted by a multi-op, which ZooKeeper orders after whatever
    // came before it, so it needs no sync.
    let unsynced = recipes.reader(Consistency::Sequential).await?;
    let found = match find_handle(handles, &unsynced, caller, name, handle).await {
        Err(error) if error.problem() == Problem::NotFound => {
            let session = recipes.synced().await?;
            find_handle(handles, &session, caller, name, handle).await?
        }
        found => found?,
    };
    match found {
        Found::There(recorded) => {
            recorded::release_recorded(&unsynced, &recipes.root, &recorded).await?;
            Ok(())
        }
        here => release(recipes, handles, here).await,
    }
}

/// How long a release waits for ZooKeeper before it answers 503 (it goes on after).
pub const RELEASE_LIMIT: Duration = Duration::from_secs(10);

/// The answer to a release of `what` (a handle, a member, a service instance) not done within
/// [RELEASE_LIMIT]: it goes on, and a retry learns the outcome.
pub fn release_not_done(what: &str) -> ApiError {
    ApiError::unavailable(format!(
        "the release of {what} is not done within {} (ZooKeeper does not answer, or this instance is starved of \
         CPU); it goes on and is done once ZooKeeper answers: retry to learn the outcome",
        humantime::format_duration(RELEASE_LIMIT)
    ))
}

/// Releases a handle as [find_handle] or [release_by_id] found it.
pub async fn release<P: Protocol>(recipes: &Recipes, handles: &Handles<P>, found: Found<P>) -> Result<(), ApiError> {
    let handle = match found {
        Found::Here(handle) => handle,
        Found::There(recorded) => {
            let session = recipes.synced().await?;
            recorded::release_recorded(&session, &recipes.root, &recorded).await?;
            return Ok(());
        }
    };
    // Bounded: during an outage the release is done once ZooKeeper is back, and the request
    // says so rather than hang for the outage (its retry finds the handle and answers then).
    if !handles.release_within(&handle, RELEASE_LIMIT).await {
        return Err(release_not_done(&format!(
            "{} `{}`",
            handles.kind().name(),
            handle.name
        )));
    }
    match handle.state().phase {
        // Its lease moved to another instance while this one released it: the task stopped
        // without deleting (it no longer acts for the lease). Released through ZooKeeper, as
        // any instance that does not keep the lease does.
        Phase::Moved => {
            let session = recipes.synced().await?;
            if let Some(recorded) = lookup(&session, handles, &handle.name, &handle.id).await? {
                recorded::release_recorded(&session, &recipes.root, &recorded).await?;
            }
            Ok(())
        }
        Phase::Lost { reason } => Err(ApiError::new(
            Problem::LockLost,
            format!(
                "{} `{}` had been lost before this release: {reason}",
                handles.kind().name(),
                handle.name
            ),
        )
        .with("reason", reason)),
        _ => Ok(()),
    }
}
