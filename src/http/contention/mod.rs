//! What the lock-like resources share over HTTP (exclusive locks, read/write locks, elections,
//! semaphores): the long-poll acquire and how its outcome maps to a status, the waiter limits,
//! the handle views and their long polls, the release, and revocation.
//!
//! Here the acquire; the handle views and their long polls in [views], the release in
//! [release], revocation in [revoke], fencing checks in [fencing].

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
use crate::recipes::engine::contender::{Contender, Contenders, Role, position_now};
use crate::recipes::engine::handle::{Handle, Handles, Phase, Protocol, Refused};
use crate::recipes::engine::lease::{EndReason, Lease};
use crate::recipes::engine::revocation::{self, Revocation};
use crate::recipes::recorded::{self, Recorded};
use crate::recipes::semaphore;
use crate::time::{HumanDuration, at_most, timestamp};
use crate::zk::{Failure, Session};

mod fencing;
mod release;
mod revoke;
mod views;

pub(crate) use fencing::fencing_handler;
pub use fencing::{FencingCheck, check_fencing};
pub(crate) use release::{RELEASE_LIMIT, release_not_done};
pub use release::{release, release_by_id};
pub(crate) use revoke::MAX_GRACE;
pub use revoke::{RevokeBody, Revoked, revoke};
pub use views::{Found, HandleQuery, find_handle, get_handle, held_since};
use views::{lookup, still_recorded};

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
    #[schema(format = DateTime)]
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
    #[schema(format = DateTime)]
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
    let wait = state.wait(request.wait);
    let caller = request.caller;
    let (lease, own_lease) = lease_for(state, caller, request.lease, request.ttl).await?;
    let handle = open_within_limits(state, handles, caller, &lease, own_lease, name, &open).await?;
    let handle = current(state, handles, handle, || open(lease.clone())).await?;
    let handle = held_elsewhere(state, handles, &lease, handle, wait, || open(lease.clone())).await?;
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
                give_up(state, handles, &handle, own_lease).await?;
            }
            drop(awaiting);
            Err(not_granted(name, wait, position, queued))
        }
        Phase::Pending => {
            if !handle.awaited_by_others() {
                give_up(state, handles, &handle, own_lease).await?;
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
            give_up(state, handles, &handle, own_lease).await?;
            Err(ApiError::from(error))
        }
        Phase::Released => Err(lease_gone(state, &lease)),
        // The lease moved to another instance meanwhile (a takeover): the handle lives on there.
        // (A visited lease that ended meanwhile says so.)
        Phase::Moved => {
            Err(super::leases::lease_error(state, &lease).unwrap_or_else(|| super::leases::moved(&lease.id)))
        }
    }
}

/// Lets `open` make (or find again) the lease's handle at `name` if the waiter limits allow;
/// a lease made for the request ends when that fails.
async fn open_within_limits<P, F, Fut>(
    state: &AppState,
    handles: &Handles<P>,
    caller: &Caller,
    lease: &Arc<Lease>,
    own_lease: bool,
    name: &str,
    open: &F,
) -> Result<Arc<Handle<P>>, ApiError>
where
    P: Protocol,
    F: Fn(Arc<Lease>) -> Fut,
    Fut: Future<Output = Result<Arc<Handle<P>>, ApiError>>,
{
    let opened = match check_waiter_limits(state, handles, lease, name) {
        Ok(()) => open(lease.clone()).await,
        Err(refused) => Err(refused),
    };
    if opened.is_err() && own_lease {
        let _ = state.leases.end(caller, &lease.id, EndReason::Deleted).await;
    }
    opened
}

/// The lease's handle here from before (a retried acquire), unless it was released through
/// another instance meanwhile: then it is let go, and a new one made.
async fn current<P, Fut>(
    state: &AppState,
    handles: &Handles<P>,
    handle: Arc<Handle<P>>,
    open: impl FnOnce() -> Fut,
) -> Result<Arc<Handle<P>>, ApiError>
where
    P: Protocol,
    Fut: Future<Output = Result<Arc<Handle<P>>, ApiError>>,
{
    // A new one (it makes its znodes now); one taken up from a holding record, still finding them,
    // may be of a holding released meanwhile (read from a listing just before).
    if matches!(handle.state().phase, Phase::Pending) && handle.may_create() {
        return Ok(handle);
    }
    let session = state
        .reader(crate::recipes::consistency::Consistency::Linearizable)
        .await?;
    if still_recorded(handles, &session, &handle).await? {
        return Ok(handle);
    }
    handles.release(&handle).await;
    open().await
}

/// The lease's holding at the resource if it has one already, made through another instance
/// (a request retried here after its first attempt reached another instance, which made the
/// holding and maybe went): one per lease, so `handle`, just opened, made nothing (ZooKeeper
/// refused its holding record) and the other is taken up here and answered for. One that turns out
/// lost (its node gone, its holding record kept so that its holder learns of the loss) or released
/// meanwhile is let go and a new one made, as a new acquire after a loss does on one instance.
/// Else `handle`.
async fn held_elsewhere<P, Fut>(
    state: &AppState,
    handles: &Handles<P>,
    lease: &Arc<Lease>,
    handle: Arc<Handle<P>>,
    wait: Duration,
    open: impl FnOnce() -> Fut,
) -> Result<Arc<Handle<P>>, ApiError>
where
    P: Protocol,
    Fut: Future<Output = Result<Arc<Handle<P>>, ApiError>>,
{
    if !handle.protocol.one_per_lease() {
        return Ok(handle);
    }
    let decided = tokio::time::timeout(FIRST_DECISION_LIMIT.max(wait), handle.decided()).await;
    if !matches!(decided, Ok(Phase::Failed { error: Failure::Taken })) {
        return Ok(handle);
    }
    // After a `sync`: the refusal was decided on the lease's session; a read on another that
    // lags would find the holding before it (released meanwhile), not the one that refused.
    let session = state
        .reader(crate::recipes::consistency::Consistency::Linearizable)
        .await?;
    let Some((record_name, held)) = recorded::held_at(&session, lease, handles.kind(), &handle.name).await? else {
        // Released meanwhile: this handle's refusal stands; the client tries again.
        return Ok(handle);
    };
    tracing::debug!(lease = %lease.id, handle = %held.handle, "an acquire takes up the lease's holding made elsewhere");
    let id = held.handle.clone();
    state.leases.take_up(lease, vec![(record_name, held)]);
    let Some(taken) = handles.get(&handle.name, &id) else {
        return Ok(handle);
    };
    let decided = tokio::time::timeout(FIRST_DECISION_LIMIT.max(wait), taken.decided()).await;
    if !decided.is_ok_and(|phase| phase.is_final()) {
        return Ok(taken);
    }
    // Lost (its holding record kept for its holder), or released meanwhile: let it go, and make a
    // new one as any acquire would.
    handles.release(&taken).await;
    open().await
}

/// The 409 of an acquire that was not granted within its wait.
fn not_granted(name: &str, wait: Duration, position: usize, queued: bool) -> ApiError {
    let after = match queued {
        true => "the lease stays queued for another request of its that waits",
        false => "the request left the queue",
    };
    ApiError::new(
        Problem::LockNotAcquired,
        format!(
            "`{name}` was not granted within {}; {after} (it was at position {position})",
            humantime::format_duration(wait),
        ),
    )
    .with("position", position)
    .with("queued", queued)
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
    let (per_lock, per_principal) = (settings.waiters_per_lock, settings.waiters_per_principal);
    let detail = if handles.queued_at(name) >= per_lock {
        format!("at most {per_lock} contenders may wait for `{name}` on this instance")
    } else if state.waiting_of(&lease.owner) >= per_principal {
        format!("at most {per_principal} waiting contenders per principal on this instance")
    } else {
        return Ok(());
    };
    Err(crate::limits::refusal(detail, Duration::from_secs(1)).into())
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

/// Leaves the queue; a lease made just for this request goes too. Waited for at most
/// [FIRST_DECISION_LIMIT]: `Err` (503) when ZooKeeper does not answer by then, the contender
/// then leaving the queue once it is back (an acquire whose wait ended during an outage once
/// hung until the outage did).
async fn give_up<P: Protocol>(
    state: &AppState,
    handles: &Handles<P>,
    handle: &Arc<Handle<P>>,
    own_lease: bool,
) -> Result<(), ApiError> {
    tracing::debug!(handle = %handle.id, lease = %handle.lease.id, "handle given up by its acquire");
    if !handles.release_within(handle, FIRST_DECISION_LIMIT).await {
        return Err(ApiError::unavailable(format!(
            "`{}` was not granted, and leaving the queue is not done within {} (ZooKeeper does not answer, or this \
             instance is starved of CPU): the contender leaves it once ZooKeeper answers",
            handle.name,
            humantime::format_duration(FIRST_DECISION_LIMIT)
        )));
    }
    if own_lease {
        let _ = state
            .leases
            .end(&Caller::Anyone, &handle.lease.id, EndReason::Deleted)
            .await;
    }
    Ok(())
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

/// A lock kind's handle routes, the same for exclusive and read/write locks: `GET` and
/// `DELETE .../handles/{handle}` (read a handle, release it) and `POST .../revoke` (ask the
/// holders to give it up), on the kind's registry `state.$registry`, a node's role told by
/// `$role`.
macro_rules! lock_handle_handlers {
    (
        $registry:ident, $role:expr, tag = $tag:tt,
        get = ($get_id:tt, $handle_path:tt),
        release = ($release_id:tt, $(#[doc = $release_doc:tt])*),
        revoke = ($revoke_id:tt, $revoke_path:tt, $(#[doc = $revoke_doc:tt])*)
    ) => {
        /// Reads a handle: waiting (with position), held (with fencing token) or lost (with reason).
        #[utoipa::path(operation_id = $get_id, get, path = $handle_path, tag = $tag,
            params(("name" = String, Path, description = "Lock name"), ("handle" = String, Path, description = "Handle from the acquire"), $crate::http::contention::HandleQuery),
            responses(
                (status = 200, description = "The handle", body = $crate::http::contention::HandleView),
                $crate::http::error::Problems<($crate::http::error::p::InvalidField, $crate::http::error::p::NotFound, $crate::http::error::p::LockLost)>,
            ))]
        pub async fn get_handle(
            axum::extract::State(state): axum::extract::State<$crate::AppState>,
            caller: $crate::auth::Caller,
            $crate::http::extract::ApiPath((name, handle)): $crate::http::extract::ApiPath<(String, String)>,
            $crate::http::extract::ApiQuery(query): $crate::http::extract::ApiQuery<$crate::http::contention::HandleQuery>,
            consistency: $crate::http::consistency::Consistency,
        ) -> Result<axum::Json<$crate::http::contention::HandleView>, $crate::http::error::ApiError> {
            $crate::http::contention::get_handle(&state, &state.$registry, &caller, (&name, &handle), query, consistency).await.map(axum::Json)
        }

        $(#[doc = $release_doc])*
        #[utoipa::path(operation_id = $release_id, delete, path = $handle_path, tag = $tag,
            params(("name" = String, Path, description = "Lock name"), ("handle" = String, Path, description = "Handle from the acquire")),
            responses(
                (status = 204, description = "Released"),
                $crate::http::error::Problems<($crate::http::error::p::InvalidField, $crate::http::error::p::NotFound, $crate::http::error::p::LockLost)>,
            ))]
        pub async fn release(
            axum::extract::State(state): axum::extract::State<$crate::AppState>,
            caller: $crate::auth::Caller,
            $crate::http::extract::ApiPath((name, handle)): $crate::http::extract::ApiPath<(String, String)>,
        ) -> Result<axum::http::StatusCode, $crate::http::error::ApiError> {
            $crate::http::contention::release_by_id(&state, &state.$registry, &caller, &name, &handle).await
        }

        $(#[doc = $revoke_doc])*
        #[utoipa::path(operation_id = $revoke_id, post, path = $revoke_path, tag = $tag,
            params(("name" = String, Path, description = "Lock name")),
            request_body(content = $crate::http::contention::RevokeBody, example = json!({"by": "ops@example.com", "reason": "deploy in progress", "grace": "30s"})),
            responses(
                (status = 202, description = "Asked; the holders decide (or the grace decides)", body = $crate::http::contention::Revoked),
                $crate::http::error::Problems<($crate::http::error::p::InvalidField, $crate::http::error::p::MalformedBody, $crate::http::error::p::NotFound, $crate::http::error::p::NothingToRevoke, $crate::http::error::p::ZookeeperUnavailable)>,
            ))]
        pub async fn revoke(
            axum::extract::State(state): axum::extract::State<$crate::AppState>,
            caller: $crate::auth::Caller,
            $crate::http::extract::ApiPath(name): $crate::http::extract::ApiPath<String>,
            $crate::http::extract::ApiJson(body): $crate::http::extract::ApiJson<$crate::http::contention::RevokeBody>,
        ) -> Result<axum::response::Response, $crate::http::error::ApiError> {
            $crate::http::contention::revoke(&state, &caller, &state.$registry, &name, $role, body).await
        }
    };
}

pub(crate) use lock_handle_handlers;
