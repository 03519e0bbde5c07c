//! The long-poll acquire that every contended kind shares (exclusive and read/write locks,
//! semaphores, elections, a lock set's locks): the lease found or made, the waiter limits, the
//! handle made (or found again, here or through another instance), the wait for the grant, and
//! leaving the queue when the wait ends without it. Apache Curator's `LockInternals` in spirit:
//! one driver, each kind's protocol plugged in by its `open`.
//!
//! Here the acquire; a handle read, waited on and released by its id in [handles], fencing
//! checks in [fencing], revocation in [revoke].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::auth::Caller;
use crate::problem::{ApiError, Problem};
use crate::recipes::Recipes;
use crate::recipes::check_name;
use crate::recipes::engine::handle::{Handle, Refused};
use crate::recipes::engine::lease::EndReason;
use crate::recipes::recorded;
use crate::zk::Failure;
pub(in crate::recipes) use handles::lookup;
use handles::still_recorded;

mod fencing;
mod handles;
mod revoke;
mod views;

pub use crate::recipes::engine::contender::{Contender, Contenders, Contention, Role};
pub use crate::recipes::engine::handle::{Handles, Phase, Protocol};
pub use crate::recipes::engine::lease::Lease;
pub use crate::recipes::engine::revocation::Revocation;
pub use crate::recipes::recorded::Recorded;
pub use fencing::check_fencing;
pub use handles::{
    Found, RELEASE_LIMIT, Seen, find_handle, fresh_position, read_handle, release, release_by_id, release_not_done,
};
pub use revoke::{MAX_GRACE, revocations, revoke};
pub use views::{
    AcquireBody, AcquireParams, Acquisition, FencingCheck, HandleQuery, HandleView, RevokeBody, Revoked, held_since,
};

/// How long an acquire waits for ZooKeeper to create the contender and answer the first
/// listing when the caller's own wait is shorter (a try-lock still needs that round trip).
const FIRST_DECISION_LIMIT: Duration = Duration::from_secs(10);

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

impl<'a> Request<'a> {
    /// An acquire's request as its query and (optional) body ask it.
    pub fn of(caller: &'a Caller, name: &'a str, params: AcquireParams, body: Option<AcquireBody>) -> Request<'a> {
        let body = body.unwrap_or_default();
        Request {
            caller,
            name,
            wait: params.wait.map(|w| w.0),
            keep_queued: params.keep_queued == Some(true),
            lease: body.lease,
            ttl: body.ttl.map(|t| t.0),
        }
    }
}

/// A lock's acquire (`POST /v1/locks/{name}/acquire`, a read/write lock's `read` and `write`):
/// the contender of `role` at `name` of `registry`, granted (200) or still queued (202) as
/// [Acquisition::acquired] says.
pub async fn acquire(
    recipes: &Recipes,
    caller: &Caller,
    registry: &Contenders,
    (name, role): (&str, Role),
    params: AcquireParams,
    body: Option<AcquireBody>,
) -> Result<Acquisition, ApiError> {
    let open = async |lease: Arc<Lease>| open_contender(recipes, registry, &lease, name, role, None);
    let granted = contend(recipes, registry, Request::of(caller, name, params, body), open).await?;
    Ok(Acquisition::of(&granted))
}

/// What a request came to: granted, or (asked to stay) still queued.
pub struct Granted<P: Protocol> {
    pub handle: Arc<Handle<P>>,
    pub lease: Arc<Lease>,
    pub granted: bool,
}

/// The acquire long poll at resource `request.name` of `handles`: finds or makes the lease,
/// checks the waiter limits, lets `open` make (or find again) the lease's handle, and waits for
/// the grant. A wait that ends without it leaves the queue (409) unless asked to stay (202); a
/// lease made for the request goes with a request that comes to nothing.
pub async fn contend<P, F, Fut>(
    recipes: &Recipes,
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
    let wait = recipes.wait(request.wait);
    let caller = request.caller;
    let (lease, own_lease) = recipes.leases.for_request(caller, request.lease, request.ttl).await?;
    let handle = open_within_limits(recipes, handles, caller, &lease, own_lease, name, &open).await?;
    let handle = current(recipes, handles, handle, || open(lease.clone())).await?;
    let handle = held_elsewhere(recipes, handles, &lease, handle, wait, || open(lease.clone())).await?;
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
                give_up(recipes, handles, &handle, own_lease).await?;
            }
            drop(awaiting);
            Err(not_granted(name, wait, position, queued))
        }
        Phase::Pending => {
            if !handle.awaited_by_others() {
                give_up(recipes, handles, &handle, own_lease).await?;
            }
            Err(ApiError::unavailable(
                "ZooKeeper did not answer in time; the request left the queue",
            ))
        }
        Phase::Lost { reason } => Err(recipes.leases.unusable(&lease).unwrap_or_else(|| {
            ApiError::new(
                Problem::LockLost,
                format!("the contender for `{name}` was lost: {reason}"),
            )
        })),
        Phase::Failed { error } => {
            give_up(recipes, handles, &handle, own_lease).await?;
            Err(ApiError::from(error))
        }
        Phase::Released => Err(recipes.leases.gone(&lease)),
        // The lease moved to another instance meanwhile (a takeover): the handle lives on there.
        // (A visited lease that ended meanwhile says so.)
        Phase::Moved => Err(recipes
            .leases
            .unusable(&lease)
            .unwrap_or_else(|| crate::recipes::leases::moved(&lease.id))),
    }
}

/// Lets `open` make (or find again) the lease's handle at `name` if the waiter limits allow;
/// a lease made for the request ends when that fails.
async fn open_within_limits<P, F, Fut>(
    recipes: &Recipes,
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
    let opened = match check_waiter_limits(recipes, handles, lease, name) {
        Ok(()) => open(lease.clone()).await,
        Err(refused) => Err(refused),
    };
    if opened.is_err() && own_lease {
        let _ = recipes.leases.end(caller, &lease.id, EndReason::Deleted).await;
    }
    opened
}

/// The lease's handle here from before (a retried acquire), unless it was released through
/// another instance meanwhile: then it is let go, and a new one made.
async fn current<P, Fut>(
    recipes: &Recipes,
    handles: &Handles<P>,
    handle: Arc<Handle<P>>,
    open: impl FnOnce() -> Fut,
) -> Result<Arc<Handle<P>>, ApiError>
where
    P: Protocol,
    Fut: Future<Output = Result<Arc<Handle<P>>, ApiError>>,
{
    // A new one (it makes its znodes now); one adopted from a holding record, still finding them,
    // may be of a holding released meanwhile (read from a listing just before).
    if matches!(handle.state().phase, Phase::Pending) && handle.may_create() {
        return Ok(handle);
    }
    let session = recipes.synced().await?;
    if still_recorded(handles, &session, &handle).await? {
        return Ok(handle);
    }
    handles.release(&handle).await;
    open().await
}

/// The lease's holding at the resource if it has one already, made through another instance
/// (a request retried here after its first attempt reached another instance, which made the
/// holding and maybe went): one per lease, so `handle`, just opened, made nothing (ZooKeeper
/// refused its holding record) and the other is adopted here and answered for. One that turns out
/// lost (its node gone, its holding record kept so that its holder learns of the loss) or released
/// meanwhile is let go and a new one made, as a new acquire after a loss does on one instance.
/// Else `handle`.
async fn held_elsewhere<P, Fut>(
    recipes: &Recipes,
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
    let session = recipes.synced().await?;
    let Some((record_name, held)) = recorded::held_at(&session, lease, handles.kind(), &handle.name).await? else {
        // Released meanwhile: this handle's refusal stands; the client tries again.
        return Ok(handle);
    };
    tracing::debug!(lease = %lease.id, handle = %held.handle, "an acquire adopts the lease's holding made elsewhere");
    let id = held.handle.clone();
    recipes.leases.adopt_holdings(lease, vec![(record_name, held)]);
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
    recipes: &Recipes,
    registry: &Contenders,
    lease: &Arc<Lease>,
    name: &str,
    role: Role,
    value: Option<serde_json::Value>,
) -> Result<Arc<Contender>, ApiError> {
    match registry.contend(lease, name, role, value) {
        Ok((contender, _new)) => Ok(contender),
        Err(Refused::LeaseEnded) => Err(recipes.leases.gone(lease)),
        Err(Refused::Taken(existing)) => Err(other_role(name, &existing, role)),
    }
}

/// Refuses (429) a new handle beyond the waiters allowed per resource or per principal on
/// this instance; a retry by a lease that already waits here is never refused.
fn check_waiter_limits<P: Protocol>(
    recipes: &Recipes,
    handles: &Handles<P>,
    lease: &Lease,
    name: &str,
) -> Result<(), ApiError> {
    if handles.holds(lease, name) {
        return Ok(());
    }
    let settings = recipes.limits.settings;
    let (per_lock, per_principal) = (settings.waiters_per_lock, settings.waiters_per_principal);
    let detail = if handles.queued_at(name) >= per_lock {
        format!("at most {per_lock} contenders may wait for `{name}` on this instance")
    } else if recipes.waiting_of(&lease.principal) >= per_principal {
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
    recipes: &Recipes,
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
        let _ = recipes
            .leases
            .end(&Caller::Anyone, &handle.lease.id, EndReason::Deleted)
            .await;
    }
    Ok(())
}
