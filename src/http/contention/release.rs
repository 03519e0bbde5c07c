//! A release by handle id: on the keeper's instance through its task, anywhere else through
//! ZooKeeper alone.

use super::*;

/// `DELETE .../{name}/handles/{handle}`: a handle kept here is released at once, its task
/// deleting its znodes and holding record in one multi-op (nothing read first: if another instance
/// released it already there is nothing left to delete, and the answer is the same `204`); any
/// other as ZooKeeper has it, after a `sync` (see [find_handle]); 410 if the lock had been lost before.
pub async fn release_by_id<P: Protocol>(
    state: &AppState,
    handles: &Handles<P>,
    caller: &Caller,
    name: &str,
    handle: &str,
) -> Result<StatusCode, ApiError> {
    check_name(name)?;
    if let Some(here) = handles.serving(name, handle) {
        here.lease.check_owner(caller)?;
        return release(state, handles, Found::Here(here)).await;
    }
    // Read as this session's server has it, and again after a `sync` only if it is not there:
    // a handle acquired through another instance a moment ago may not have reached this
    // server yet. One found is deleted by a multi-op, which ZooKeeper orders after whatever
    // came before it, so it needs no sync.
    let unsynced = state
        .reader(crate::recipes::consistency::Consistency::Sequential)
        .await?;
    let found = match find_handle(handles, &unsynced, caller, name, handle).await {
        Err(error) if error.status() == StatusCode::NOT_FOUND => {
            let session = state.synced().await?;
            find_handle(handles, &session, caller, name, handle).await?
        }
        found => found?,
    };
    match found {
        Found::There(recorded) => {
            recorded::release_recorded(&unsynced, &state.config.root, &recorded).await?;
            Ok(StatusCode::NO_CONTENT)
        }
        here => release(state, handles, here).await,
    }
}

/// How long a release waits for ZooKeeper before it answers 503 (it goes on after).
pub(crate) const RELEASE_LIMIT: Duration = Duration::from_secs(10);

/// The answer to a release of `what` (a handle, a member, a service instance) not done within
/// [RELEASE_LIMIT]: it goes on, and a retry learns the outcome.
pub(crate) fn release_not_done(what: &str) -> ApiError {
    ApiError::unavailable(format!(
        "the release of {what} is not done within {} (ZooKeeper does not answer, or this instance is starved of \
         CPU); it goes on and is done once ZooKeeper answers: retry to learn the outcome",
        humantime::format_duration(RELEASE_LIMIT)
    ))
}

/// Releases a handle as [find_handle] or [release_by_id] found it.
pub async fn release<P: Protocol>(
    state: &AppState,
    handles: &Handles<P>,
    found: Found<P>,
) -> Result<StatusCode, ApiError> {
    let handle = match found {
        Found::Here(handle) => handle,
        Found::There(recorded) => {
            let session = state.synced().await?;
            recorded::release_recorded(&session, &state.config.root, &recorded).await?;
            return Ok(StatusCode::NO_CONTENT);
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
            let session = state.synced().await?;
            if let Some(recorded) = lookup(&session, handles, &handle.name, &handle.id).await? {
                recorded::release_recorded(&session, &state.config.root, &recorded).await?;
            }
            Ok(StatusCode::NO_CONTENT)
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
        _ => Ok(StatusCode::NO_CONTENT),
    }
}
