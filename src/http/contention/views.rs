//! A handle as its holder reads it (`GET`), kept here or found in ZooKeeper by its GUID on
//! any instance, and the long polls on it.

use super::*;

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
        && caller.owns(lost.owner.as_deref())
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
pub(super) async fn still_recorded<P: Protocol>(
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
pub(super) async fn lookup<P: Protocol>(
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

/// A handle as this instance's memory or ZooKeeper shows it.
impl HandleView {
    /// A contender kept here. A waiter's position is read afresh (see [position_now]).
    pub async fn here(state: &AppState, contender: &Contender) -> HandleView {
        let current = contender.state();
        let (position, reason) = match &current.phase {
            Phase::Waiting { position } => (Some(fresh_position(state, contender).await.unwrap_or(*position)), None),
            Phase::Lost { reason } => (None, Some(reason.clone())),
            Phase::Failed { error } => (None, Some(error.to_string())),
            _ => (None, None),
        };
        HandleView {
            lock: contender.name.clone(),
            handle: contender.id.clone(),
            lease: contender.lease.id.clone(),
            mode: contender.protocol.role.mode(),
            state: current.phase.name(),
            position,
            fencing_token: current.fencing_token(),
            node: current.node.map(|n| n.name),
            held_since: held_since(&current.phase),
            reason,
            revocation: current.revocation,
        }
    }

    /// A lock of a set whose handle is gone (released, or lost).
    pub fn gone(name: &str, handle: &str, lease: &str) -> HandleView {
        HandleView {
            lock: name.to_string(),
            handle: handle.to_string(),
            lease: lease.to_string(),
            mode: None,
            state: "lost",
            position: None,
            fencing_token: None,
            node: None,
            held_since: None,
            reason: Some("its znode is gone".into()),
            revocation: None,
        }
    }

    /// A holding as ZooKeeper has it (when it was granted is known only to its keeper).
    pub fn there(recorded: &Recorded) -> HandleView {
        HandleView {
            lock: recorded.name.clone(),
            handle: recorded.handle.clone(),
            lease: recorded.owner().map(|o| o.lease).unwrap_or_default(),
            mode: recorded.role.mode(),
            state: if recorded.holds() { "held" } else { "waiting" },
            position: recorded.position,
            fencing_token: recorded.holds().then_some(recorded.node.czxid),
            node: Some(recorded.node.name.clone()),
            held_since: None,
            reason: None,
            revocation: revocation::record_in(&recorded.data),
        }
    }
}

/// `GET .../handles/{handle}` of a contender kind: where the handle stands, after waiting (up
/// to `query.wait`) for news, read at `consistency`.
pub async fn get_handle(
    state: &AppState,
    handles: &Contenders,
    caller: &Caller,
    (name, handle): (&str, &str),
    query: HandleQuery,
    consistency: crate::http::consistency::Consistency,
) -> Result<HandleView, ApiError> {
    let session = state.reader(consistency).await?;
    match find_handle(handles, &session, caller, name, handle).await? {
        Found::Here(contender) => {
            wait_for_news(state, &contender, query.wait).await;
            // A handle whose lease ended here says so itself; one whose lease is still kept
            // here is confirmed kept (not taken over meanwhile), else read from ZooKeeper.
            let confirmed =
                contender.lease.ended().is_cancelled() || state.confirm(&contender.lease, consistency).await.is_ok();
            if confirmed {
                return Ok(HandleView::here(state, &contender).await);
            }
            match lookup(&session, handles, name, handle).await? {
                Some(recorded) => Ok(HandleView::there(&recorded)),
                None => Err(ApiError::not_found(
                    "handle",
                    format!("no handle `{handle}` for {} `{name}`", handles.kind().name()),
                )),
            }
        }
        Found::There(recorded) => {
            let recorded = await_news_there(state, &session, handles, *recorded, query.wait).await?;
            Ok(HandleView::there(&recorded))
        }
    }
}

/// When the lease holding `handle` was granted, for a waiting contender: read afresh on the
/// primary session.
pub async fn fresh_position(state: &AppState, contender: &Contender) -> Option<usize> {
    let session = state.zk().current().ok()?;
    position_now(&session, contender).await
}

/// When a phase began holding.
pub fn held_since(phase: &Phase) -> Option<String> {
    match phase {
        Phase::Held { since } => Some(timestamp(*since)),
        _ => None,
    }
}

/// Query of a handle read.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct HandleQuery {
    /// Wait (up to this long, capped by the server's maximum) for something the holder must
    /// act on: a revocation request, a loss, or (for a waiter) the grant.
    #[param(value_type = Option<String>, example = "30s")]
    pub wait: Option<HumanDuration>,
}

/// Waits for what [HandleQuery::wait] describes, on a handle kept here.
pub async fn wait_for_news<P: Protocol>(state: &AppState, handle: &Handle<P>, wait: Option<HumanDuration>) {
    let Some(wait) = wait else { return };
    let was_held = matches!(handle.state().phase, Phase::Held { .. });
    let mut updates = handle.subscribe();
    let news = updates.wait_for(|s| {
        s.revocation.is_some() || s.phase.is_final() || (!was_held && matches!(s.phase, Phase::Held { .. }))
    });
    crate::admission::park();
    let _ = tokio::time::timeout(wait.0.min(state.max_wait), news).await;
}

/// Waits for what [HandleQuery::wait] describes, on a handle as ZooKeeper has it: watching the
/// one node that decides it next, reading it again after each change. 410 if it went meanwhile
/// (released, or lost).
pub async fn await_news_there<P: Protocol>(
    state: &AppState,
    session: &Session,
    handles: &Handles<P>,
    recorded: Recorded,
    wait: Option<HumanDuration>,
) -> Result<Recorded, ApiError> {
    let Some(wait) = wait else { return Ok(recorded) };
    crate::admission::park();
    let until = tokio::time::Instant::now() + wait.0.min(state.max_wait);
    let was_held = recorded.holds();
    let mut current = recorded;
    loop {
        let news = revocation::record_in(&current.data).is_some() || (!was_held && current.holds());
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
