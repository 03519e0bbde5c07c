//! `/v1/rwlocks`: shared (read/write) locks: many readers or one writer.

use crate::http::json::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::auth::Caller;
use crate::http::error::{ApiError, Problems, p};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::{Followed, Resource, state_handler};
use crate::kind::Kind;
use crate::recipes::locks::contention::{self as recipe, AcquireBody, AcquireParams, Acquisition, Role};
use crate::recipes::locks::rwlock::{self, RwLockState, is_reader};

/// The read/write lock kind's module.
pub const RESOURCE: Resource = Resource {
    kind: Kind::RwLock,
    about: Some(
        "Shared (read/write) locks: readers share, a writer excludes all (Curator's InterProcessReadWriteLock names).",
    ),
    routes,
    topic: Some(Followed {
        summary: "Follows a read/write lock: its holders and waiters, as Server-Sent Events.",
        param: "name",
    }),
    listed: Some("Lists the read/write locks that exist in ZooKeeper, with their number of contenders."),
};

fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(check_rwlock_fencing))
        .routes(routes!(rwlock_state))
        .routes(routes!(read))
        .routes(routes!(write))
        .routes(routes!(get_handle, release))
        .routes(routes!(revoke))
}

/// Acquires a read lock, waiting up to `wait`: granted when no writer is ahead in the queue,
/// together with every other such reader.
#[utoipa::path(post, path = "/v1/rwlocks/{name}/read", tag = "rwlocks", extensions(("x-zkgate-served-by" = json!({"any": "body"}))),
    params(("name" = String, Path, description = "Lock name: 1 to 128 bytes, no `/`, no control characters, not `.` or `..`"), AcquireParams),
    request_body(content = Option<AcquireBody>, description = "Optional.", example = json!({"ttl": "30s"})),
    responses(
        (status = 200, description = "Granted", body = Acquisition),
        (status = 202, description = "Not granted within the wait; still queued (`keep_queued=true`)", body = Acquisition),
        Problems<(p::InvalidField, p::MalformedBody, p::NotFound, p::LockNotAcquired, p::ModeChangeRefused, p::LeaseEnded, p::LockLost, p::TooMany, p::ZookeeperUnavailable)>,
    ))]
pub async fn read(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<AcquireParams>,
    ApiJson(body): ApiJson<Option<AcquireBody>>,
) -> Result<Response, ApiError> {
    let acquired = recipe::acquire(&state, &caller, &state.rwlocks, (&name, rwlock::READ), params, body).await?;
    Ok((super::status(acquired.acquired), Json(acquired)).into_response())
}

/// Acquires the write lock, waiting up to `wait`: granted when nobody is ahead in the queue.
/// A lease that holds (or waits for) a read lock here is refused with 409 `mode-change-refused`:
/// release the read lock first.
#[utoipa::path(post, path = "/v1/rwlocks/{name}/write", tag = "rwlocks", extensions(("x-zkgate-served-by" = json!({"any": "body"}))),
    params(("name" = String, Path, description = "Lock name"), AcquireParams),
    request_body(content = Option<AcquireBody>, description = "Optional.", example = json!({"ttl": "30s"})),
    responses(
        (status = 200, description = "Granted", body = Acquisition),
        (status = 202, description = "Not granted within the wait; still queued (`keep_queued=true`)", body = Acquisition),
        Problems<(p::InvalidField, p::MalformedBody, p::NotFound, p::LockNotAcquired, p::ModeChangeRefused, p::LeaseEnded, p::LockLost, p::TooMany, p::ZookeeperUnavailable)>,
    ))]
pub async fn write(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<AcquireParams>,
    ApiJson(body): ApiJson<Option<AcquireBody>>,
) -> Result<Response, ApiError> {
    let acquired = recipe::acquire(&state, &caller, &state.rwlocks, (&name, rwlock::WRITE), params, body).await?;
    Ok((super::status(acquired.acquired), Json(acquired)).into_response())
}

state_handler!(
    /// Reads a read/write lock's holders and waiters from ZooKeeper.
    rwlock_state,
    "/v1/rwlocks/{name}",
    "rwlocks",
    "Lock name",
    RwLockState,
    rwlock_topic
);

super::lock_handle_handlers!(
    rwlocks,
    rw_role,
    tag = "rwlocks",
    get = ("get_handle_rwlock", "/v1/rwlocks/{name}/handles/{handle}"),
    release = (
        "release_rwlock",
        /// Releases a read or write lock (or leaves the queue).
    ),
    revoke = (
        "revoke_rwlock",
        "/v1/rwlocks/{name}/revoke",
        /// Asks the holder(s) of a read/write lock to give it up. Each holder learns it on its handle
        /// (`GET .../handles/{handle}?wait=` returns at once), its lease's keepalive and the lock's
        /// state, and releases when ready; with `grace`, zkgate deletes the holder's node when the
        /// grace runs out and the holder's lease reports the lock lost. Recorded in the audit log.
    )
);

fn rw_role(node: &str) -> Role {
    if is_reader(node) { rwlock::READ } else { rwlock::WRITE }
}

super::fencing_handler!(
    /// Checks a fencing token against the read/write lock's holders: the writer's, or any
    /// current reader's.
    ///
    /// 200 if the token is a current holder's; 409 `stale-fencing-token` with the newest holder's
    /// token (`current_token`) otherwise; 404 `not-held` if nobody holds it. Linearizable by
    /// default.
    check_rwlock_fencing,
    "/v1/rwlocks/{name}/fencing/{token}",
    "rwlocks",
    "read/write lock",
    |state| state.rwlocks,
    crate::recipes::locks::rwlock::holding::<String>
);
