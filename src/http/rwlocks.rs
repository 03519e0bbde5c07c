//! `/v1/rwlocks`: shared (read/write) locks: many readers or one writer.

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
use crate::recipes::contender::{Next, Role, read_contenders};
use crate::recipes::rwlock::is_reader;

/// A read/write lock's holders and queue.
#[derive(Serialize, utoipa::ToSchema)]
pub struct RwLockState {
    #[schema(example = "catalog")]
    pub name: String,
    /// Who holds it now: readers only, or one writer.
    pub holders: Vec<ContenderView>,
    /// The others, in queue order.
    pub waiters: Vec<ContenderView>,
}

/// Acquires a read lock, waiting up to `wait`: granted when no writer is ahead in the queue,
/// together with every other such reader.
#[utoipa::path(post, path = "/v1/rwlocks/{name}/read", tag = "rwlocks",
    params(("name" = String, Path, description = "Lock name: 1 to 128 bytes, no `/`, no control characters, not `.` or `..`"), AcquireParams),
    request_body(content = Option<AcquireBody>, description = "Optional.", example = json!({"lease": "3c9e1f07-6f1c2a9e0b7d4e3f8a5b6c7d8e9f0a1b"})),
    responses(
        (status = 200, description = "Granted", body = Acquisition),
        (status = 202, description = "Not granted within the wait; still queued (`keep_queued=true`)", body = Acquisition),
        (status = 400, description = "Bad name, parameter or body", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such lease", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not granted within the wait (left the queue); or this lease already writes this lock", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The lease ended, or the contender was lost", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn read(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<AcquireParams>,
    ApiJson(body): ApiJson<Option<AcquireBody>>,
) -> Result<Response, ApiError> {
    contention::acquire(&state, &caller, &state.rwlocks, &name, Role::Read, params, body).await
}

/// Acquires the write lock, waiting up to `wait`: granted when nobody is ahead in the queue.
/// A lease that holds (or waits for) a read lock here is refused with 409 `mode-change-refused`:
/// release the read lock first.
#[utoipa::path(post, path = "/v1/rwlocks/{name}/write", tag = "rwlocks",
    params(("name" = String, Path, description = "Lock name"), AcquireParams),
    request_body(content = Option<AcquireBody>, description = "Optional.", example = json!({"lease": "3c9e1f07-6f1c2a9e0b7d4e3f8a5b6c7d8e9f0a1b"})),
    responses(
        (status = 200, description = "Granted", body = Acquisition),
        (status = 202, description = "Not granted within the wait; still queued (`keep_queued=true`)", body = Acquisition),
        (status = 400, description = "Bad name, parameter or body", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such lease", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not granted within the wait (left the queue); or this lease reads this lock (`mode-change-refused`)", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The lease ended, or the contender was lost", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn write(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<AcquireParams>,
    ApiJson(body): ApiJson<Option<AcquireBody>>,
) -> Result<Response, ApiError> {
    contention::acquire(&state, &caller, &state.rwlocks, &name, Role::Write, params, body).await
}

/// Reads a read/write lock's holders and waiters from ZooKeeper.
#[utoipa::path(get, path = "/v1/rwlocks/{name}", tag = "rwlocks",
    params(("name" = String, Path, description = "Lock name")),
    responses(
        (status = 200, description = "Holders and waiters (both empty for a lock nobody holds)", body = RwLockState),
        (status = 400, description = "Bad name", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn rwlock_state(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<RwLockState>, ApiError> {
    check_name(&name)?;
    let client = state.zk().current()?.client;
    let records = read_contenders(&client, &state.rwlocks.dir(&name))
        .await?
        .unwrap_or_default();
    let children: Vec<String> = records.iter().map(|r| r.name.clone()).collect();
    let local = state.rwlocks.local_contenders(&name);
    let (mut holders, mut waiters) = (Vec::new(), Vec::new());
    for record in records {
        let role = if is_reader(&record.name) {
            Role::Read
        } else {
            Role::Write
        };
        let holds = role.next_step(&children, &record.name) == Next::Hold;
        let mine = local.get(&record.name).cloned();
        let view = contention::contender_view(record, contention::mode_of(role), mine.as_deref());
        if holds { holders.push(view) } else { waiters.push(view) }
    }
    Ok(Json(RwLockState { name, holders, waiters }))
}

/// Lists the read/write locks that exist in ZooKeeper, with their number of contenders.
#[utoipa::path(get, path = "/v1/rwlocks", tag = "rwlocks", responses(
    (status = 200, body = Vec<LockSummary>),
    (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
))]
pub async fn list_rwlocks(State(state): State<AppState>, caller: Caller) -> Result<Json<Vec<LockSummary>>, ApiError> {
    super::contention::list_summaries(&state, &caller, state.rwlocks.base()).await
}

/// Reads a handle: waiting (with position), held (with fencing token) or lost (with reason).
#[utoipa::path(get, path = "/v1/rwlocks/{name}/handles/{handle}", tag = "rwlocks",
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
    let contender = find_handle(&state.rwlocks, &caller, &name, &handle)?;
    contention::wait_for_news(&state, &contender, query.wait).await;
    Ok(Json(contention::handle_view(&state, &state.rwlocks, &contender).await))
}

/// Releases a read or write lock (or leaves the queue).
#[utoipa::path(delete, path = "/v1/rwlocks/{name}/handles/{handle}", tag = "rwlocks",
    params(("name" = String, Path, description = "Lock name"), ("handle" = String, Path, description = "Handle from the acquire")),
    responses(
        (status = 204, description = "Released"),
        (status = 400, description = "Bad name", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such handle", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The lock had been lost before this release", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn release(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, handle)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    contention::release(&state.rwlocks, &find_handle(&state.rwlocks, &caller, &name, &handle)?).await
}

/// Asks the holder(s) of a read/write lock to give it up. Each holder learns it on its handle
/// (`GET .../handles/{handle}?wait=` returns at once), its lease's keepalive and the lock's
/// state, and releases when ready; with `grace`, zkgate deletes the holder's node when the
/// grace runs out and the holder's lease reports the lock lost. Recorded in the audit log.
#[utoipa::path(post, path = "/v1/rwlocks/{name}/revoke", tag = "rwlocks",
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
    contention::revoke(&state, &caller, &state.rwlocks, "rwlock", &name, rw_role, body).await
}

fn rw_role(node: &str) -> Role {
    if is_reader(node) { Role::Read } else { Role::Write }
}
