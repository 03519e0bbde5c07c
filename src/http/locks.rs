//! `/v1/locks`: acquire (long poll), release, inspect exclusive locks.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::error::{ApiError, Place, Problem};
use super::extract::{ApiJson, ApiPath, ApiQuery, HumanDuration};
use super::leases::LeaseView;
use super::{millis_since, timestamp};
use crate::AppState;
use crate::lease::{EndReason, Lease};
use crate::recipes::lock::{Contender, ContenderRecord, Phase, read_contenders, read_lock_names};
use crate::zk::names::validate_name;

/// How long an acquire waits for ZooKeeper to create the contender and answer the first
/// listing when the caller's own wait is shorter (a try-lock still needs that round trip).
const FIRST_DECISION_LIMIT: Duration = Duration::from_secs(10);

/// Query of `POST /v1/locks/{name}/acquire`.
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

/// Body of `POST /v1/locks/{name}/acquire` (optional).
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
    /// `true` when the lock is held.
    pub acquired: bool,
    /// Release with `DELETE /v1/locks/{name}/handles/{handle}`.
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

/// One contender of a lock, as ZooKeeper has it.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ContenderView {
    /// Znode name under the lock.
    pub node: String,
    /// ZooKeeper's sequence number: the queue order.
    pub sequence: u64,
    /// The znode's czxid: the fencing token of this contender once it holds the lock.
    pub fencing_token: i64,
    /// When the contender joined the queue.
    pub created_at: String,
    /// Milliseconds since it joined the queue (for a waiter: how long it has waited).
    pub age_ms: u64,
    /// For the holder, when it was granted, if this instance knows (its own contenders).
    pub held_since: Option<String>,
    /// For the holder, milliseconds held, if known.
    pub held_ms: Option<u64>,
    /// The zkgate lease of the contender, for zkgate's contenders.
    pub lease: Option<String>,
    /// Who created it: `zkgate`, `curator` or `kazoo` (by node name), or `other`.
    #[schema(example = "zkgate")]
    pub client: &'static str,
}

/// A lock's holder and queue.
#[derive(Serialize, utoipa::ToSchema)]
pub struct LockState {
    #[schema(example = "orders")]
    pub name: String,
    /// The contender with the lowest sequence number, if any.
    pub holder: Option<ContenderView>,
    /// The others, in queue order.
    pub waiters: Vec<ContenderView>,
}

/// A lock in the list.
#[derive(Serialize, utoipa::ToSchema)]
pub struct LockSummary {
    #[schema(example = "orders")]
    pub name: String,
    /// Holder plus waiters.
    pub contenders: i32,
}

/// A handle: one lease's place at one lock.
#[derive(Serialize, utoipa::ToSchema)]
pub struct HandleView {
    pub lock: String,
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
}

fn lock_name(name: &str) -> Result<(), ApiError> {
    validate_name(name).map_err(|e| ApiError::invalid(Place::Path, "name", e))
}

/// Acquires a lock, waiting up to `wait` (a long poll).
///
/// Without a `lease` in the body a lease is created (with `ttl`) and returned: keep it alive
/// or the lock is released when it expires. With a lease that already contends for this lock
/// the same handle is returned (a retried acquire never queues twice), and waiting resumes.
///
/// Waiters are granted in queue order; each watches only the contender right before it.
#[utoipa::path(post, path = "/v1/locks/{name}/acquire", tag = "locks",
    params(("name" = String, Path, description = "Lock name: 1 to 128 bytes, no `/`, no control characters, not `.` or `..`"), AcquireParams),
    request_body(content = Option<AcquireBody>, description = "Optional.", example = json!({"lease": "6f1c2a9e0b7d4e3f8a5b6c7d8e9f0a1b"})),
    responses(
        (status = 200, description = "Granted", body = Acquisition),
        (status = 202, description = "Not granted within the wait; still queued (`keep_queued=true`)", body = Acquisition),
        (status = 400, description = "Bad name, parameter or body", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such lease", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not granted within the wait; left the queue (`position` says where it was)", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The lease ended, or the contender was lost", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn acquire(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<AcquireParams>,
    ApiJson(body): ApiJson<Option<AcquireBody>>,
) -> Result<Response, ApiError> {
    lock_name(&name)?;
    let body = body.unwrap_or_default();
    let wait = params
        .wait
        .map(|w| w.0)
        .unwrap_or(state.config.max_wait)
        .min(state.config.max_wait);
    let (lease, own_lease) = match (&body.lease, body.ttl) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                Place::Body,
                "ttl",
                "only applies when no `lease` is given",
            ));
        }
        (Some(id), None) => (state.leases.get(id)?, false),
        (None, ttl) => {
            if ttl.is_some_and(|t| t.0.is_zero()) {
                return Err(ApiError::invalid(Place::Body, "ttl", "must be above zero"));
            }
            (state.leases.create(ttl.map(|t| t.0), None)?, true)
        }
    };
    let Some((contender, _new)) = state.locks.contend(&lease, &name) else {
        return Err(state
            .leases
            .get(&lease.id)
            .err()
            .map(ApiError::from)
            .unwrap_or_else(|| {
                ApiError::gone(
                    "lease-ended",
                    "Lease ended",
                    "the lease ended while the lock was requested",
                )
            }));
    };
    let phase = wait_for_grant(&contender, wait).await;
    match phase {
        Phase::Held { .. } => Ok((StatusCode::OK, Json(acquisition(&contender, &lease))).into_response()),
        Phase::Waiting { .. } if params.keep_queued == Some(true) => {
            Ok((StatusCode::ACCEPTED, Json(acquisition(&contender, &lease))).into_response())
        }
        Phase::Waiting { position } => {
            give_up(&state, &contender, own_lease).await;
            Err(ApiError::not_acquired(format!(
                "lock `{name}` was not granted within {}; the request left the queue (it was at position {position})",
                humantime::format_duration(wait)
            ))
            .with("position", position)
            .with("queued", false))
        }
        Phase::Pending => {
            give_up(&state, &contender, own_lease).await;
            Err(ApiError::unavailable(
                "ZooKeeper did not answer in time; the request left the queue",
            ))
        }
        Phase::Lost { reason } => {
            let err = ApiError::gone(
                "lock-lost",
                "Lock lost",
                format!("the contender for lock `{name}` was lost: {reason}"),
            );
            Err(match state.leases.get(&lease.id) {
                Err(lease_err) => ApiError::from(lease_err),
                Ok(_) => err,
            })
        }
        Phase::Failed { error } => {
            give_up(&state, &contender, own_lease).await;
            Err(ApiError::from(error))
        }
        Phase::Released => Err(state
            .leases
            .get(&lease.id)
            .err()
            .map(ApiError::from)
            .unwrap_or_else(|| ApiError::not_acquired("the contender was released while it waited"))),
    }
}

/// Waits for the contender's first decision (bounded by [FIRST_DECISION_LIMIT] even for a
/// try-lock), then for a grant or a final phase until `wait` has passed since the start.
async fn wait_for_grant(contender: &Contender, wait: Duration) -> Phase {
    let deadline = Instant::now() + wait;
    let mut updates = contender.subscribe();
    let first = deadline.max(Instant::now() + FIRST_DECISION_LIMIT);
    let _ = tokio::time::timeout_at(first, updates.wait_for(|s| s.phase != Phase::Pending)).await;
    let _ = tokio::time::timeout_at(
        deadline,
        updates.wait_for(|s| matches!(s.phase, Phase::Held { .. }) || s.phase.is_final()),
    )
    .await;
    contender.state().phase
}

/// Leaves the queue; a lease made just for this request goes too.
async fn give_up(state: &AppState, contender: &Arc<Contender>, own_lease: bool) {
    state.locks.release(contender).await;
    if own_lease {
        let _ = state.leases.end(&contender.lease.id, EndReason::Deleted).await;
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
        lock: contender.lock.clone(),
        acquired,
        handle: contender.handle.clone(),
        fencing_token: if acquired {
            current.node.as_ref().map(|n| n.czxid)
        } else {
            None
        },
        position,
        node: current.node.map(|n| n.name),
        held_since,
        lease: LeaseView::of(lease),
    }
}

/// Reads a lock's holder and waiters from ZooKeeper.
#[utoipa::path(get, path = "/v1/locks/{name}", tag = "locks",
    params(("name" = String, Path, description = "Lock name")),
    responses(
        (status = 200, description = "Holder and waiters (both empty for a lock nobody holds)", body = LockState),
        (status = 400, description = "Bad name", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn lock_state(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<LockState>, ApiError> {
    lock_name(&name)?;
    let client = state.zk.current()?.client;
    let records = read_contenders(&client, &state.locks.dir(&name))
        .await?
        .unwrap_or_default();
    let local = state.locks.local_contenders(&name);
    let mut views = records.into_iter().map(|record| {
        let held_since = local.get(&record.name).and_then(|c| match c.state().phase {
            Phase::Held { since } => Some(since),
            _ => None,
        });
        contender_view(record, held_since)
    });
    let holder = views.next();
    Ok(Json(LockState {
        name,
        holder,
        waiters: views.collect(),
    }))
}

fn contender_view(record: ContenderRecord, held_since: Option<SystemTime>) -> ContenderView {
    let created = UNIX_EPOCH + Duration::from_millis(record.ctime.max(0) as u64);
    let lease = serde_json::from_slice::<serde_json::Value>(&record.data)
        .ok()
        .and_then(|v| v.get("lease").and_then(|l| l.as_str()).map(str::to_string));
    let client = if lease.is_some() {
        "zkgate"
    } else if record.name.starts_with("_c_") {
        "curator"
    } else if record.name.contains("__lock__") {
        "kazoo"
    } else {
        "other"
    };
    ContenderView {
        node: record.name,
        sequence: record.sequence,
        fencing_token: record.czxid,
        created_at: timestamp(created),
        age_ms: millis_since(created),
        held_since: held_since.map(timestamp),
        held_ms: held_since.map(millis_since),
        lease,
        client,
    }
}

/// Lists the locks that exist in ZooKeeper, with their number of contenders.
#[utoipa::path(get, path = "/v1/locks", tag = "locks", responses(
    (status = 200, body = Vec<LockSummary>),
    (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
))]
pub async fn list_locks(State(state): State<AppState>) -> Result<Json<Vec<LockSummary>>, ApiError> {
    let client = state.zk.current()?.client;
    let names = read_lock_names(&client, state.locks.base()).await?;
    Ok(Json(
        names
            .into_iter()
            .map(|(name, contenders)| LockSummary { name, contenders })
            .collect(),
    ))
}

fn find_handle(state: &AppState, name: &str, handle: &str) -> Result<Arc<Contender>, ApiError> {
    lock_name(name)?;
    state.locks.by_handle(name, handle).ok_or_else(|| {
        ApiError::not_found(
            "handle",
            format!("no handle `{handle}` for lock `{name}` on this instance"),
        )
    })
}

/// Reads a handle: waiting (with position), held (with fencing token) or lost (with reason).
#[utoipa::path(get, path = "/v1/locks/{name}/handles/{handle}", tag = "locks",
    params(("name" = String, Path, description = "Lock name"), ("handle" = String, Path, description = "Handle from the acquire")),
    responses(
        (status = 200, body = HandleView),
        (status = 400, description = "Bad name", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such handle (released, or never here)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_handle(
    State(state): State<AppState>,
    ApiPath((name, handle)): ApiPath<(String, String)>,
) -> Result<Json<HandleView>, ApiError> {
    let contender = find_handle(&state, &name, &handle)?;
    let current = contender.state();
    let (position, held_since, reason) = match &current.phase {
        Phase::Waiting { position } => (Some(*position), None, None),
        Phase::Held { since } => (None, Some(timestamp(*since)), None),
        Phase::Lost { reason } => (None, None, Some(reason.clone())),
        Phase::Failed { error } => (None, None, Some(error.to_string())),
        Phase::Pending | Phase::Released => (None, None, None),
    };
    Ok(Json(HandleView {
        lock: name,
        handle,
        lease: contender.lease.id.clone(),
        state: current.phase.name(),
        position,
        fencing_token: current.fencing_token(),
        node: current.node.map(|n| n.name),
        held_since,
        reason,
    }))
}

/// Releases the lock (or leaves the queue). The znode is deleted before this answers, which
/// wakes the next waiter.
#[utoipa::path(delete, path = "/v1/locks/{name}/handles/{handle}", tag = "locks",
    params(("name" = String, Path, description = "Lock name"), ("handle" = String, Path, description = "Handle from the acquire")),
    responses(
        (status = 204, description = "Released"),
        (status = 400, description = "Bad name", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such handle", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The lock had been lost before this release (the handle is now forgotten)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn release(
    State(state): State<AppState>,
    ApiPath((name, handle)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let contender = find_handle(&state, &name, &handle)?;
    state.locks.release(&contender).await;
    match contender.state().phase {
        Phase::Lost { reason } => Err(ApiError::gone(
            "lock-lost",
            "Lock lost",
            format!("lock `{name}` had been lost before this release: {reason}"),
        )),
        _ => Ok(StatusCode::NO_CONTENT),
    }
}
