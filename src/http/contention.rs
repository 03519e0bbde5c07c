//! What the lock-like resources share over HTTP (exclusive locks, read/write locks, elections,
//! semaphores): the long-poll acquire and how its outcome maps to a status, the waiter limits,
//! the handle views and their long polls, the release, and revocation.
//!
//! Over 600 lines: the long-poll acquire, handle views and releases of four kinds; the hand list
//! of registries here goes with issue 31's driver trait, then views and releases split off.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::check_name;
use super::error::{ApiError, Place, Problem};
use super::leases::{LeaseView, lease_for, lease_gone};
use crate::AppState;
use crate::auth::Caller;
use crate::kind::Kind;
use crate::recipes::contender::{Contender, Contenders, Role, position_now};
use crate::recipes::handle::{Handle, Handles, Phase, Protocol, Refused};
use crate::recipes::lease::{EndReason, Lease};
use crate::recipes::recorded::{self, Recorded};
use crate::recipes::revocation::{self, Revocation, RevokeError};
use crate::recipes::semaphore;
use crate::time::{HumanDuration, at_most, timestamp};
use crate::zk::Session;

/// How long an acquire waits for ZooKeeper to create the contender and answer the first
/// listing when the caller's own wait is shorter (a try-lock still needs that round trip).
const FIRST_DECISION_LIMIT: Duration = Duration::from_secs(10);

/// Query of an acquire.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AcquireParams {
    /// How long to wait for the lock: `0` tries once, `10s` waits up to ten seconds. Capped by
    /// the server's maximum wait, which is also the default.
    #[param(value_type = Option<String>, example = "10s")]
    pub wait: Option<HumanDuration>,
    /// When the wait ends without the lock: `false` (default) leaves the queue; `true` stays
    /// queued and answers 202 with the position, to be waited on again with the same lease.
    pub keep_queued: Option<bool>,
}

/// Body of an acquire (optional).
#[derive(Deserialize, utoipa::ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    /// The lease to hold the lock with. Without it a new lease is created and returned.
    pub lease: Option<String>,
    /// TTL of the lease created when `lease` is not given.
    pub ttl: Option<HumanDuration>,
}

/// Answer of an acquire: granted (200) or still queued (202).
#[derive(Serialize, utoipa::ToSchema)]
pub struct Acquisition {
    #[schema(example = "orders")]
    pub lock: String,
    /// `read` or `write` for a read/write lock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<&'static str>,
    /// `true` when the lock is held.
    pub acquired: bool,
    /// Release with `DELETE .../handles/{handle}`.
    #[schema(example = "0b9d4c3e2f1a4b5c8d7e6f5a4b3c2d1e")]
    pub handle: String,
    /// Present once granted: strictly increases with every grant of this lock. Send it with
    /// every write to the protected resource, which must reject tokens lower than the highest
    /// it has seen.
    #[schema(example = 4294967302_i64)]
    pub fencing_token: Option<i64>,
    /// Contenders ahead (0 when held).
    pub position: usize,
    /// The contender's znode name.
    #[schema(example = "_c_6c1f1a9e-8d2b-4d43-9b7a-0e1c2d3e4f50-lock-0000000007")]
    pub node: Option<String>,
    /// When the lock was granted.
    pub held_since: Option<String>,
    /// The lease holding it; keep it alive with `POST /v1/leases/{id}/keepalive`.
    pub lease: LeaseView,
}

/// A handle: one lease's place at one lock.
#[derive(Serialize, utoipa::ToSchema)]
pub struct HandleView {
    pub lock: String,
    /// `read` or `write`, for a read/write lock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<&'static str>,
    pub handle: String,
    pub lease: String,
    /// `pending`, `waiting`, `held`, `lost`, `released` or `failed`.
    #[schema(example = "held")]
    pub state: &'static str,
    /// Contenders ahead while waiting.
    pub position: Option<usize>,
    /// Present while held (and after a loss, to tell which grant was lost).
    pub fencing_token: Option<i64>,
    pub node: Option<String>,
    pub held_since: Option<String>,
    /// Why it was lost or failed.
    pub reason: Option<String>,
    /// Someone asked the holder to give the lock up: release it when ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revocation: Option<Revocation>,
}

/// One acquire (or campaign, or permit) request, after parsing.
pub struct Request<'a> {
    pub caller: &'a Caller,
    pub name: &'a str,
    /// The wait asked for (`None`: the server's maximum).
    pub wait: Option<Duration>,
    /// Stay queued when the wait ends without a grant.
    pub keep_queued: bool,
    pub lease: Option<String>,
    pub ttl: Option<Duration>,
}

/// What a request came to: granted, or (asked to stay) still queued.
pub struct Granted<P: Protocol> {
    pub handle: Arc<Handle<P>>,
    pub lease: Arc<Lease>,
    pub granted: bool,
}

impl<P: Protocol> Granted<P> {
    /// 200 when granted, 202 when still queued.
    pub fn status(&self) -> StatusCode {
        if self.granted {
            StatusCode::OK
        } else {
            StatusCode::ACCEPTED
        }
    }
}

/// The acquire long poll at resource `request.name` of `handles`: finds or makes the lease,
/// checks the waiter limits, lets `open` make (or find again) the lease's handle, and waits for
/// the grant. A wait that ends without it leaves the queue (409) unless asked to stay (202); a
/// lease made for the request goes with a request that comes to nothing.
pub async fn contend<P, F, Fut>(
    state: &AppState,
    handles: &Handles<P>,
    request: Request<'_>,
    open: F,
) -> Result<Granted<P>, ApiError>
where
    P: Protocol,
    F: Fn(Arc<Lease>) -> Fut,
    Fut: Future<Output = Result<Arc<Handle<P>>, ApiError>>,
{
    let name = request.name;
    check_name(name)?;
    let wait = state.config.wait(request.wait);
    let caller = request.caller;
    let (lease, own_lease) = lease_for(state, caller, request.lease, request.ttl).await?;
    let opened = match check_waiter_limits(state, handles, &lease, name) {
        Ok(()) => open(lease.clone()).await,
        Err(refused) => Err(refused),
    };
    let handle = match opened {
        Ok(handle) => handle,
        Err(err) => {
            if own_lease {
                let _ = state.leases.end(caller, &lease.id, EndReason::Deleted).await;
            }
            return Err(err);
        }
    };
    // The lease's handle here from before (a retried acquire) may have been released through
    // another instance meanwhile: then it is let go, and a new one made.
    let handle = match handle.state().phase {
        Phase::Pending => handle,
        _ => {
            let session = super::consistency::reader(state, super::consistency::Consistency::Linearizable).await?;
            match still_referenced(handles, &session, &handle).await? {
                true => handle,
                false => {
                    handles.release(&handle).await;
                    open(lease.clone()).await?
                }
            }
        }
    };
    let awaiting = handle.awaited();
    let outcome = handle.granted_within(wait, FIRST_DECISION_LIMIT).await;
    if matches!(outcome, Phase::Waiting { .. }) {
        let (m, kind) = (crate::metrics::get(), handles.kind().label());
        m.lock_timeouts.with_label_values(&[kind, m.name(kind, name)]).inc();
    }
    let kept = |granted| {
        Ok(Granted {
            handle: handle.clone(),
            lease: lease.clone(),
            granted,
        })
    };
    match outcome {
        Phase::Held { .. } => kept(true),
        Phase::Waiting { .. } if request.keep_queued => kept(false),
        Phase::Waiting { position } => {
            // Another request of the lease waits on the handle (this one's retry, say): it
            // stays queued for that one.
            let queued = handle.awaited_by_others();
            if !queued {
                give_up(state, handles, &handle, own_lease).await;
            }
            drop(awaiting);
            Err(ApiError::new(
                Problem::LockNotAcquired,
                format!(
                    "`{name}` was not granted within {}; {} (it was at position {position})",
                    humantime::format_duration(wait),
                    match queued {
                        true => "the lease stays queued for another request of its that waits",
                        false => "the request left the queue",
                    }
                ),
            )
            .with("position", position)
            .with("queued", queued))
        }
        Phase::Pending => {
            if !handle.awaited_by_others() {
                give_up(state, handles, &handle, own_lease).await;
            }
            Err(ApiError::unavailable(
                "ZooKeeper did not answer in time; the request left the queue",
            ))
        }
        Phase::Lost { reason } => Err(super::leases::lease_error(state, &lease).unwrap_or_else(|| {
            ApiError::new(
                Problem::LockLost,
                format!("the contender for `{name}` was lost: {reason}"),
            )
        })),
        Phase::Failed { error } => {
            give_up(state, handles, &handle, own_lease).await;
            Err(ApiError::from(error))
        }
        Phase::Released => Err(lease_gone(state, &lease)),
        // The lease moved to another instance meanwhile (a takeover): the handle lives on there.
        Phase::Moved => Err(super::leases::moved(&lease.id)),
    }
}

/// The contender of `lease` in `role` at `name`, for [contend]: refused if the lease contends
/// here in another role.
pub fn open_contender(
    state: &AppState,
    registry: &Contenders,
    lease: &Arc<Lease>,
    name: &str,
    role: Role,
    value: Option<serde_json::Value>,
) -> Result<Arc<Contender>, ApiError> {
    match registry.contend(lease, name, role, value) {
        Ok((contender, _new)) => Ok(contender),
        Err(Refused::LeaseEnded) => Err(lease_gone(state, lease)),
        Err(Refused::Taken(existing)) => Err(other_role(name, &existing, role)),
    }
}

/// An acquire of a lock: 200 with the grant, or 202 still queued.
pub async fn acquire(
    state: &AppState,
    caller: &Caller,
    registry: &Contenders,
    name: &str,
    role: Role,
    params: AcquireParams,
    body: Option<AcquireBody>,
) -> Result<Response, ApiError> {
    let body = body.unwrap_or_default();
    let request = Request {
        caller,
        name,
        wait: params.wait.map(|w| w.0),
        keep_queued: params.keep_queued == Some(true),
        lease: body.lease,
        ttl: body.ttl.map(|t| t.0),
    };
    let open = async |lease: Arc<Lease>| open_contender(state, registry, &lease, name, role, None);
    let outcome = contend(state, registry, request, open).await?;
    Ok((outcome.status(), Json(acquisition(&outcome.handle, &outcome.lease))).into_response())
}

/// Refuses (429) a new handle beyond the waiters allowed per resource or per principal on
/// this instance; a retry by a lease that already waits here is never refused.
fn check_waiter_limits<P: Protocol>(
    state: &AppState,
    handles: &Handles<P>,
    lease: &Lease,
    name: &str,
) -> Result<(), ApiError> {
    if handles.holds(lease, name) {
        return Ok(());
    }
    let settings = state.limits.settings;
    let retry = Duration::from_secs(1);
    if handles.queued_at(name) >= settings.waiters_per_lock {
        let detail = format!(
            "at most {} contenders may wait for `{name}` on this instance",
            settings.waiters_per_lock
        );
        return Err(crate::limits::refusal(detail, retry).into());
    }
    let mine = state.waiting_of(&lease.owner);
    if mine >= settings.waiters_per_principal {
        let detail = format!(
            "at most {} waiting contenders per principal on this instance",
            settings.waiters_per_principal
        );
        return Err(crate::limits::refusal(detail, retry).into());
    }
    Ok(())
}

/// A lease that reads asks to write (or the other way round): refused, because two readers
/// upgrading at once would wait for each other forever.
fn other_role(name: &str, existing: &Contender, asked: Role) -> ApiError {
    let (has, wants) = (
        existing.protocol.role.mode().unwrap_or("?"),
        asked.mode().unwrap_or("?"),
    );
    ApiError::new(
        Problem::ModeChangeRefused,
        format!(
            "this lease already has a {has} contender on `{name}` (handle `{}`); release it before asking to {wants}: \
             upgrading a read lock in place would deadlock two readers doing the same",
            existing.id
        ),
    )
    .with("handle", &existing.id)
    .with("mode", has)
}

/// Leaves the queue; a lease made just for this request goes too.
async fn give_up<P: Protocol>(state: &AppState, handles: &Handles<P>, handle: &Arc<Handle<P>>, own_lease: bool) {
    tracing::debug!(handle = %handle.id, lease = %handle.lease.id, "handle given up by its acquire");
    handles.release(handle).await;
    if own_lease {
        let _ = state
            .leases
            .end(&Caller::Anyone, &handle.lease.id, EndReason::Deleted)
            .await;
    }
}

fn acquisition(contender: &Contender, lease: &Lease) -> Acquisition {
    let current = contender.state();
    let (acquired, position, held_since) = match current.phase {
        Phase::Held { since } => (true, 0, Some(timestamp(since))),
        Phase::Waiting { position } => (false, position, None),
        _ => (false, 0, None),
    };
    Acquisition {
        lock: contender.name.clone(),
        mode: contender.protocol.role.mode(),
        acquired,
        handle: contender.id.clone(),
        fencing_token: current.fencing_token(),
        position,
        node: current.node.map(|n| n.name),
        held_since,
        lease: LeaseView::of(lease),
    }
}

/// A handle as a request finds it.
pub enum Found<P: Protocol> {
    /// Its lease is kept here: its task's view.
    Here(Arc<Handle<P>>),
    /// Its lease is kept by another instance (or its keeper is gone): as ZooKeeper has it.
    There(Recorded),
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
        if still_referenced(handles, session, &found).await? {
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
    Ok(Found::There(recorded))
}

/// Whether a handle kept here is still its lease's (read on `client`): a release through
/// another instance deletes its reference with its znodes, which this instance's task sees
/// only when its watch fires. One found released so is let go here, and is gone. A lost
/// handle keeps its reference (until released), and a pending one may not have it yet.
async fn still_referenced<P: Protocol>(
    handles: &Handles<P>,
    session: &Session,
    handle: &Arc<Handle<P>>,
) -> Result<bool, ApiError> {
    if matches!(handle.state().phase, Phase::Pending | Phase::Lost { .. }) {
        return Ok(true);
    }
    if recorded::exists(session, &handle.reference()).await? {
        return Ok(true);
    }
    tracing::debug!(handle = %handle.id, lease = %handle.lease.id, "handle let go: its reference is gone (released through another instance)");
    let (handles, handle) = (handles.clone(), handle.clone());
    tokio::spawn(async move { handles.release(&handle).await });
    Ok(false)
}

/// The handle as ZooKeeper has it: a semaphore's permit request, or a contender.
async fn lookup<P: Protocol>(
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

/// What a view of a handle shows, from this instance's memory or from ZooKeeper.
pub struct Seen {
    pub name: String,
    pub handle: String,
    pub lease: String,
    pub mode: Option<&'static str>,
    pub state: &'static str,
    pub position: Option<usize>,
    pub fencing_token: Option<i64>,
    pub node: Option<String>,
    pub held_since: Option<String>,
    pub reason: Option<String>,
    pub revocation: Option<Revocation>,
}

impl Seen {
    /// A contender kept here. A waiter's position is read afresh (see [position_now]).
    pub async fn here(state: &AppState, contender: &Contender) -> Seen {
        let current = contender.state();
        let (position, reason) = match &current.phase {
            Phase::Waiting { position } => (Some(fresh_position(state, contender).await.unwrap_or(*position)), None),
            Phase::Lost { reason } => (None, Some(reason.clone())),
            Phase::Failed { error } => (None, Some(error.to_string())),
            _ => (None, None),
        };
        Seen {
            name: contender.name.clone(),
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
    pub fn gone(name: &str, handle: &str, lease: &str) -> Seen {
        Seen {
            name: name.to_string(),
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
    pub fn there(recorded: &Recorded) -> Seen {
        Seen {
            name: recorded.name.clone(),
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

impl From<Seen> for HandleView {
    fn from(seen: Seen) -> HandleView {
        HandleView {
            lock: seen.name,
            mode: seen.mode,
            handle: seen.handle,
            lease: seen.lease,
            state: seen.state,
            position: seen.position,
            fencing_token: seen.fencing_token,
            node: seen.node,
            held_since: seen.held_since,
            reason: seen.reason,
            revocation: seen.revocation,
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
    consistency: super::consistency::Consistency,
) -> Result<Seen, ApiError> {
    let session = super::consistency::reader(state, consistency).await?;
    match find_handle(handles, &session, caller, name, handle).await? {
        Found::Here(contender) => {
            wait_for_news(state, &contender, query.wait).await;
            // A handle whose lease ended here says so itself; one whose lease is still kept
            // here is confirmed kept (not taken over meanwhile), else read from ZooKeeper.
            let confirmed = contender.lease.ended().is_cancelled()
                || super::consistency::confirm(state, &contender.lease, consistency)
                    .await
                    .is_ok();
            if confirmed {
                return Ok(Seen::here(state, &contender).await);
            }
            match lookup(&session, handles, name, handle).await? {
                Some(recorded) => Ok(Seen::there(&recorded)),
                None => Err(ApiError::not_found(
                    "handle",
                    format!("no handle `{handle}` for {} `{name}`", handles.kind().name()),
                )),
            }
        }
        Found::There(recorded) => {
            let recorded = await_news_there(state, &session, handles, recorded, query.wait).await?;
            Ok(Seen::there(&recorded))
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

/// Releases a handle: through its task if its lease is kept here, else through ZooKeeper
/// ([contender::release_recorded]); 410 if the lock had been lost before.
/// `DELETE .../{name}/handles/{handle}`: a handle kept here is released at once, its task
/// deleting its znodes and reference in one multi-op (nothing read first: if another instance
/// released it already there is nothing left to delete, and the answer is the same `204`); any
/// other as ZooKeeper has it, after a `sync` (see [find_handle]).
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
    let unsynced = super::consistency::reader(state, super::consistency::Consistency::Sequential).await?;
    let found = match find_handle(handles, &unsynced, caller, name, handle).await {
        Err(error) if error.status() == StatusCode::NOT_FOUND => {
            let session = super::consistency::synced(state).await?;
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

/// Releases a handle as [find_handle] or [release_by_id] found it.
pub async fn release<P: Protocol>(
    state: &AppState,
    handles: &Handles<P>,
    found: Found<P>,
) -> Result<StatusCode, ApiError> {
    let handle = match found {
        Found::Here(handle) => handle,
        Found::There(recorded) => {
            let session = super::consistency::synced(state).await?;
            recorded::release_recorded(&session, &state.config.root, &recorded).await?;
            return Ok(StatusCode::NO_CONTENT);
        }
    };
    handles.release(&handle).await;
    match handle.state().phase {
        // Its lease moved to another instance while this one released it: the task stopped
        // without deleting (it no longer acts for the lease). Released through ZooKeeper, as
        // any instance that does not keep the lease does.
        Phase::Moved => {
            let session = super::consistency::synced(state).await?;
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
    let _ = tokio::time::timeout(wait.0.min(state.config.max_wait), news).await;
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
    let until = tokio::time::Instant::now() + wait.0.min(state.config.max_wait);
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

/// Body of a revocation request.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokeBody {
    /// Who asks (recorded).
    #[schema(example = "ops@example.com", max_length = 500)]
    pub by: String,
    /// Why (recorded, shown to the holder).
    #[schema(example = "deploy in progress", max_length = 500)]
    pub reason: String,
    /// After this long (at most 24h) zkgate deletes the holder's node itself (the holder
    /// loses the lock). Without it, the holder releases when it is ready.
    pub grace: Option<HumanDuration>,
    /// Revoke only this contender node (default: every current holder).
    pub node: Option<String>,
}

/// The revocations made.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Revoked {
    pub revocations: Vec<Revocation>,
}

/// Longest grace a revocation may give a holder.
pub(crate) const MAX_GRACE: Duration = Duration::from_secs(24 * 3600);

/// Longest `by` or `reason` accepted.
const MAX_TEXT: usize = 500;

/// Asks the holders of `name` (or the one `node`) to give the lock up; `role_of` tells a
/// node's role from its name (reader or writer), which decides who holds.
pub async fn revoke(
    state: &AppState,
    caller: &Caller,
    registry: &Contenders,
    name: &str,
    role_of: fn(&str) -> Role,
    body: RevokeBody,
) -> Result<Response, ApiError> {
    check_name(name)?;
    for (field, text) in [("by", &body.by), ("reason", &body.reason)] {
        if text.trim().is_empty() || text.len() > MAX_TEXT {
            return Err(ApiError::invalid(
                Place::Body,
                field,
                format!("must be 1 to {MAX_TEXT} bytes"),
            ));
        }
    }
    let grace = match body.grace {
        Some(grace) => Some(at_most(grace.0, MAX_GRACE).map_err(|e| ApiError::invalid(Place::Body, "grace", e))?),
        None => None,
    };
    let session = state.zk().connected().await?;
    let request = revocation::Request {
        kind: registry.kind(),
        name,
        dir: registry.dir(name),
        by: &body.by,
        reason: &body.reason,
        grace,
        node: body.node.as_deref(),
        role_of,
    };
    let audit_base = format!("{}/revocations", state.config.root);
    let revocations = revocation::revoke(&session, &audit_base, request, caller)
        .await
        .map_err(|err| match err {
            RevokeError::NoSuchNode => ApiError::not_found(
                "node",
                format!(
                    "`{}` is not a contender of `{name}`",
                    body.node.as_deref().unwrap_or_default()
                ),
            ),
            RevokeError::NobodyHolds => ApiError::new(Problem::NothingToRevoke, format!("`{name}` has no holder")),
            RevokeError::Forbidden(err) => err.into(),
            RevokeError::ZooKeeper(err) => err.into(),
        })?;
    Ok((StatusCode::ACCEPTED, Json(Revoked { revocations })).into_response())
}

/// Answer of a fencing check: the token is a current holder's (the leader's term).
#[derive(Serialize, utoipa::ToSchema)]
pub struct FencingCheck {
    #[schema(example = "orders")]
    pub name: String,
    #[schema(example = 4294967310i64)]
    pub token: i64,
}

/// `GET /v1/<kind>/{name}/fencing/{token}` for the resource at `dir`, whose holders are the
/// first `holding(names)` contenders: 200 if `token` is a current holder's, 409
/// `stale-fencing-token` with the newest holder's token otherwise, 404 `not-held` when nobody
/// holds. One linearizable read (a `sync` shared with concurrent reads, then the listing and
/// a few `exists`): a resource server may ask on every write it guards.
pub async fn check_fencing(
    state: &AppState,
    what: &str,
    dir: String,
    name: &str,
    token: &str,
    consistency: super::consistency::Consistency,
    holding: impl Fn(&[String]) -> usize,
) -> Result<Json<FencingCheck>, ApiError> {
    use crate::recipes::view::Fencing;
    check_name(name)?;
    let token: i64 = token.parse().ok().filter(|t: &i64| *t > 0).ok_or_else(|| {
        ApiError::invalid(
            Place::Path,
            "token",
            format!(
                "`{}` is not a fencing token (a positive integer, as acquire answered it)",
                token.escape_debug()
            ),
        )
    })?;
    let session = super::consistency::reader(state, consistency).await?;
    match crate::recipes::view::check_fencing(&session, &dir, holding, token).await? {
        Fencing::Holds => Ok(Json(FencingCheck {
            name: name.to_string(),
            token,
        })),
        Fencing::Superseded { current } => Err(ApiError::new(
            Problem::StaleFencingToken,
            format!("{token} is not the token of {what} `{name}`'s holder now: {current} is"),
        )
        .with("current_token", current)),
        Fencing::NotHeld => Err(ApiError::new(
            Problem::NotHeld,
            format!("nobody holds {what} `{name}`: no token is current"),
        )),
    }
}

/// Declares a kind's `GET /v1/<kind>/{name}/fencing/{token}` ([check_fencing]): `handles` picks
/// the kind's handles from the state (for the directory), `holding` says how many of its
/// contenders in queue order hold.
macro_rules! fencing_handler {
    ($(#[doc = $doc:tt])* $handler:ident, $path:tt, $tag:tt, $what:tt, |$state:ident| $handles:expr, $holding:expr) => {
        $(#[doc = $doc])*
        #[utoipa::path(get, path = $path, tag = $tag,
            params(("name" = String, Path, description = "Its name"), ("token" = i64, Path, description = "The fencing token to check, as the acquire (or campaign) answered it")),
            responses(
                (status = 200, description = "The token is current", body = $crate::http::contention::FencingCheck),
                $crate::http::error::Problems<($crate::http::error::p::InvalidField, $crate::http::error::p::NotHeld, $crate::http::error::p::StaleFencingToken, $crate::http::error::p::ZookeeperUnavailable)>,
            ))]
        pub async fn $handler(
            axum::extract::State($state): axum::extract::State<$crate::AppState>,
            $crate::http::extract::ApiPath((name, token)): $crate::http::extract::ApiPath<(String, String)>,
            consistency: $crate::http::consistency::Consistency,
        ) -> Result<axum::Json<$crate::http::contention::FencingCheck>, $crate::http::error::ApiError> {
            let dir = $handles.dir(&name);
            $crate::http::contention::check_fencing(&$state, $what, dir, &name, &token, consistency, $holding).await
        }
    };
}

pub(crate) use fencing_handler;
