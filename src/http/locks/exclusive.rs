//! `/v1/locks`: acquire (long poll), release, inspect exclusive locks.

use crate::http::json::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::auth::Caller;
use crate::http::consistency::Consistency;
use crate::http::error::{ApiError, Problems, p};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::{Followed, Resource, state_handler};
use crate::kind::Kind;
use crate::recipes::locks::contention::{self as recipe, AcquireBody, AcquireParams, Acquisition, Revocation};
use crate::recipes::locks::exclusive::LockState;

/// The lock kind's module.
pub const RESOURCE: Resource = Resource {
    kind: Kind::Lock,
    about: Some("Exclusive locks (ZooKeeper's lock recipe on Curator's znode names), with fencing tokens."),
    routes,
    topic: Some(Followed {
        summary: "Follows a lock: its holder and waiters, as Server-Sent Events.",
        param: "name",
    }),
    listed: Some("Lists the locks that exist in ZooKeeper, with their number of contenders."),
};

fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(check_lock_fencing))
        .routes(routes!(lock_state))
        .routes(routes!(acquire))
        .routes(routes!(get_handle, release))
        .routes(routes!(revoke))
        .routes(routes!(revocations))
}

/// Acquires a lock, waiting up to `wait` (a long poll).
///
/// Without a `lease` in the body a lease is created (with `ttl`) and returned: keep it alive
/// or the lock is released when it expires. With a lease that already contends for this lock
/// the same handle is returned (a retried acquire never queues twice), and waiting resumes.
///
/// Waiters are granted in queue order; each watches only the contender right before it.
#[utoipa::path(operation_id = "acquire_lock", post, path = "/v1/locks/{name}/acquire", tag = "locks", extensions(("x-zkgate-served-by" = json!({"any": "body"}))),
    params(("name" = String, Path, description = "Lock name: 1 to 128 bytes, no `/`, no control characters, not `.` or `..`"), AcquireParams),
    request_body(content = Option<AcquireBody>, description = "Optional.", example = json!({"ttl": "30s"})),
    responses(
        (status = 200, description = "Granted", body = Acquisition),
        (status = 202, description = "Not granted within the wait; still queued (`keep_queued=true`)", body = Acquisition),
        Problems<(p::InvalidField, p::MalformedBody, p::NotFound, p::LockNotAcquired, p::LeaseEnded, p::LockLost, p::TooMany, p::ZookeeperUnavailable)>,
    ))]
pub async fn acquire(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<AcquireParams>,
    ApiJson(body): ApiJson<Option<AcquireBody>>,
) -> Result<Response, ApiError> {
    let role = crate::recipes::locks::exclusive::EXCLUSIVE;
    let acquired = recipe::acquire(&state, &caller, &state.locks, (&name, role), params, body).await?;
    Ok((super::status(acquired.acquired), Json(acquired)).into_response())
}

state_handler!(
    /// Reads a lock's holder and waiters from ZooKeeper.
    lock_state,
    "/v1/locks/{name}",
    "locks",
    "Lock name",
    LockState,
    lock_topic
);

super::lock_handle_handlers!(
    locks,
    |_| crate::recipes::locks::exclusive::EXCLUSIVE,
    tag = "locks",
    get = ("get_handle_lock", "/v1/locks/{name}/handles/{handle}"),
    release = (
        "release_lock",
        /// Releases the lock (or leaves the queue). The znode is deleted before this answers, which
        /// wakes the next waiter.
    ),
    revoke = (
        "revoke_lock",
        "/v1/locks/{name}/revoke",
        /// Asks the holder(s) of a lock to give it up. Each holder learns it on its handle
        /// (`GET .../handles/{handle}?wait=` returns at once), its lease's keepalive and the lock's
        /// state, and releases when ready; with `grace`, zkgate deletes the holder's node when the
        /// grace runs out and the holder's lease reports the lock lost. Recorded in the audit log.
    )
);

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
        (status = 200, description = "The revocations asked of holdings this caller may see", body = Vec<Revocation>),
        Problems<(p::InvalidField, p::ZookeeperUnavailable)>,
    ))]
pub async fn revocations(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<AuditQuery>,
    consistency: Consistency,
) -> Result<Json<Vec<Revocation>>, ApiError> {
    let limit = query.limit.unwrap_or(100);
    Ok(Json(recipe::revocations(&state, &caller, limit, consistency).await?))
}

super::fencing_handler!(
    /// Checks a fencing token against the lock's holder: for a resource server, before it accepts
    /// a write that carries the token (Chubby's sequencer check).
    ///
    /// 200 if the token is the current holder's; 409 `stale-fencing-token` with the holder's
    /// token (`current_token`) if the lock has changed hands since (or the token never held it);
    /// 404 `not-held` if nobody holds it. A linearizable read by default: it reflects every grant
    /// and release any instance acknowledged before the check began.
    check_lock_fencing,
    "/v1/locks/{name}/fencing/{token}",
    "locks",
    "lock",
    |state| state.locks,
    |_: &[String]| 1
);
