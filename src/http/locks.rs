//! `/v1/locks`: acquire (long poll), release, inspect exclusive locks.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;

use super::contention::{
    self, AcquireBody, AcquireParams, Acquisition, ContenderView, HandleQuery, HandleView, LockSummary, RevokeBody,
    Revoked, check_name, find_handle,
};
use super::error::{ApiError, Problem};
use super::extract::{ApiJson, ApiPath, ApiQuery};
use crate::AppState;
use crate::auth::Caller;
use crate::recipes::contender::{Role, read_contenders};
use crate::recipes::revocation::{AUDIT_KEPT, Revocation, read_audit};

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

/// Acquires a lock, waiting up to `wait` (a long poll).
///
/// Without a `lease` in the body a lease is created (with `ttl`) and returned: keep it alive
/// or the lock is released when it expires. With a lease that already contends for this lock
/// the same handle is returned (a retried acquire never queues twice), and waiting resumes.
///
/// Waiters are granted in queue order; each watches only the contender right before it.
#[utoipa::path(post, path = "/v1/locks/{name}/acquire", tag = "locks",
    params(("name" = String, Path, description = "Lock name: 1 to 128 bytes, no `/`, no control characters, not `.` or `..`"), AcquireParams),
    request_body(content = Option<AcquireBody>, description = "Optional.", example = json!({"lease": "3c9e1f07-6f1c2a9e0b7d4e3f8a5b6c7d8e9f0a1b"})),
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
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<AcquireParams>,
    ApiJson(body): ApiJson<Option<AcquireBody>>,
) -> Result<Response, ApiError> {
    contention::acquire(&state, &caller, &state.locks, &name, Role::Exclusive, params, body).await
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
    check_name(&name)?;
    let client = state.zk().current()?.client;
    let records = read_contenders(&client, &state.locks.dir(&name))
        .await?
        .unwrap_or_default();
    let local = state.locks.local_contenders(&name);
    let mut views = records.into_iter().map(|record| {
        let mine = local.get(&record.name).cloned();
        contention::contender_view(record, None, mine.as_deref())
    });
    let holder = views.next();
    Ok(Json(LockState {
        name,
        holder,
        waiters: views.collect(),
    }))
}

/// Lists the locks that exist in ZooKeeper, with their number of contenders.
#[utoipa::path(get, path = "/v1/locks", tag = "locks", responses(
    (status = 200, body = Vec<LockSummary>),
    (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
))]
pub async fn list_locks(State(state): State<AppState>, caller: Caller) -> Result<Json<Vec<LockSummary>>, ApiError> {
    super::contention::list_summaries(&state, &caller, state.locks.base()).await
}

/// Reads a handle: waiting (with position), held (with fencing token) or lost (with reason).
#[utoipa::path(get, path = "/v1/locks/{name}/handles/{handle}", tag = "locks",
    params(("name" = String, Path, description = "Lock name"), ("handle" = String, Path, description = "Handle from the acquire"), HandleQuery),
    responses(
        (status = 200, body = HandleView),
        (status = 400, description = "Bad name", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such handle (released, or never here)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_handle(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, handle)): ApiPath<(String, String)>,
    ApiQuery(query): ApiQuery<HandleQuery>,
) -> Result<Json<HandleView>, ApiError> {
    let contender = find_handle(&state.locks, &caller, &name, &handle)?;
    contention::wait_for_news(&state, &contender, query.wait).await;
    Ok(Json(contention::handle_view(&state, &state.locks, &contender).await))
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
    caller: Caller,
    ApiPath((name, handle)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    contention::release(&state.locks, &find_handle(&state.locks, &caller, &name, &handle)?).await
}

/// Asks the holder(s) of a lock to give it up. Each holder learns it on its handle
/// (`GET .../handles/{handle}?wait=` returns at once), its lease's keepalive and the lock's
/// state, and releases when ready; with `grace`, zkgate deletes the holder's node when the
/// grace runs out and the holder's lease reports the lock lost. Recorded in the audit log.
#[utoipa::path(post, path = "/v1/locks/{name}/revoke", tag = "locks",
    params(("name" = String, Path, description = "Lock name")),
    request_body(content = RevokeBody, example = json!({"by": "ops@example.com", "reason": "deploy in progress", "grace": "30s"})),
    responses(
        (status = 202, description = "Asked; the holders decide (or the grace decides)", body = Revoked),
        (status = 400, description = "Bad name or body", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such contender node", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Nobody holds the lock", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn revoke(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<RevokeBody>,
) -> Result<Response, ApiError> {
    contention::revoke(&state, &caller, &state.locks, "lock", &name, |_| Role::Exclusive, body).await
}

/// Query of the revocation audit log.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// How many records, newest first (default 100, at most 1000).
    pub limit: Option<usize>,
}

/// The revocation audit log: who asked for which lock back, why and when, newest first.
#[utoipa::path(get, path = "/v1/revocations", tag = "locks", params(AuditQuery),
    responses(
        (status = 200, body = Vec<Revocation>),
        (status = 400, description = "Bad limit", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn revocations(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<AuditQuery>,
) -> Result<Json<Vec<Revocation>>, ApiError> {
    let limit = query.limit.unwrap_or(100).min(AUDIT_KEPT);
    let client = state.zk().current()?.client;
    let mut records = read_audit(&client, &format!("{}/revocations", state.config.root), limit).await?;
    records.retain(|r| caller.may(&format!("{}s", r.kind), &r.lock, crate::auth::Access::Read));
    Ok(Json(records))
}
