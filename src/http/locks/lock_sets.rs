//! `/v1/lock-sets`: several exclusive locks acquired as one, all or none, in one request (a long
//! poll, as for one lock), read, and released together. See [crate::recipes::locks::lock_set] for
//! the order they are taken in and why sets cannot deadlock.
//!
//! A set's locks are ordinary locks (the same znodes and handles as `POST
//! /v1/locks/{name}/acquire`): each has its own fencing token, and each handle can be read on
//! its lock. A set is not a kind of its own: its routes authorise each lock by name here. Its
//! acquire is served by the keeper of the lease it names, like a lock's; a granted set is
//! recorded in ZooKeeper, so that any instance reads or releases it.

use crate::http::json::Json;
use axum::extract::State;
use axum::http::StatusCode;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::auth::Caller;
use crate::http::consistency::Consistency;
use crate::http::error::{ApiError, Problems, p};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::recipes::locks::sets::{self, LockSetBody, LockSetState, LockSetView, SetParams};

/// The routes (under the locks' tag).
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(acquire_set))
        .routes(routes!(get_set, release_set))
}

/// Acquires several locks all or none, waiting up to `wait` for the whole set.
///
/// The locks are taken one after another in name order, whatever order the request lists them
/// in, so two clients asking for overlapping sets never wait for each other in a cycle. If one
/// is not granted within the wait, every lock taken for the set is released before the answer
/// (409 `lock-not-acquired` naming the `lock` that was not granted): a refused set holds
/// nothing. Locks the lease already held join the set (and stay held if the set is refused).
#[utoipa::path(post, path = "/v1/lock-sets", tag = "locks", extensions(("x-zkgate-served-by" = json!({"any": "body"}))),
    params(SetParams),
    request_body(content = LockSetBody, example = json!({"locks": ["account-42", "account-17"], "ttl": "30s"})),
    responses(
        (status = 200, description = "Every lock granted", body = LockSetView),
        Problems<(p::InvalidField, p::MalformedBody, p::NotFound, p::LockNotAcquired, p::LeaseEnded, p::LockLost, p::TooMany, p::ZookeeperUnavailable)>,
    ))]
pub async fn acquire_set(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(params): ApiQuery<SetParams>,
    ApiJson(body): ApiJson<LockSetBody>,
) -> Result<Json<LockSetView>, ApiError> {
    Ok(Json(sets::acquire_set(&state, &caller, params, body).await?))
}

/// Reads a set: each lock's handle, and whether all are still held.
#[utoipa::path(get, path = "/v1/lock-sets/{set}", tag = "locks",
    params(("set" = String, Path, description = "The set's id, from its acquire")),
    responses(
        (status = 200, description = "The lock set", body = LockSetState),
        Problems<(p::InvalidField, p::NotFound)>,
    ))]
pub async fn get_set(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    consistency: Consistency,
) -> Result<Json<LockSetState>, ApiError> {
    Ok(Json(sets::read_set(&state, &caller, &id, consistency).await?))
}

/// Releases every lock of a set; their znodes are deleted before this answers. If one had been
/// lost before (410 `lock-lost`, naming it), the others are released all the same.
#[utoipa::path(delete, path = "/v1/lock-sets/{set}", tag = "locks",
    params(("set" = String, Path, description = "The set's id, from its acquire")),
    responses(
        (status = 204, description = "Released"),
        Problems<(p::InvalidField, p::NotFound, p::LockLost)>,
    ))]
pub async fn release_set(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    sets::release_set(&state, &caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}
