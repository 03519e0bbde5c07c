//! `/v1/semaphores`: counting semaphores with N permits, lease-bound, on Curator's
//! `InterProcessSemaphoreV2` znodes. A permit request is a long poll like a lock's, with the
//! same outcomes, limits and timeouts.

use crate::http::json::Json;
use axum::extract::State;
use axum::http::StatusCode;
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
use crate::recipes::locks::contention::{self as recipe, AcquireBody, HandleQuery};
use crate::recipes::locks::permits::{self, PermitParams, PermitView};
use crate::recipes::locks::semaphore::SemaphoreState;

/// The semaphore kind's module.
pub const RESOURCE: Resource = Resource {
    kind: Kind::Semaphore,
    about: Some("Counting semaphores with N permits (Curator's InterProcessSemaphoreV2 znodes)."),
    routes,
    topic: Some(Followed {
        summary: "Follows a semaphore: its permits held and waiting, as Server-Sent Events.",
        param: "name",
    }),
    listed: Some("Lists the semaphores that exist in ZooKeeper."),
};

fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(semaphore_state))
        .routes(routes!(acquire))
        .routes(routes!(get_permit, release))
}

/// Acquires one permit, waiting up to `wait`. Without a `lease` one is created and returned;
/// the permit goes back when the lease ends. A lease asking again gets the same handle.
#[utoipa::path(operation_id = "acquire_semaphore", post, path = "/v1/semaphores/{name}/acquire", tag = "semaphores", extensions(("x-zkgate-served-by" = json!({"any": "body"}))),
    params(("name" = String, Path, description = "Semaphore name"), PermitParams),
    request_body(content = Option<AcquireBody>, description = "Optional.", example = json!({"ttl": "30s"})),
    responses(
        (status = 200, description = "A permit is held", body = PermitView),
        (status = 202, description = "Still waiting (`keep_queued=true`)", body = PermitView),
        Problems<(p::InvalidField, p::MalformedBody, p::NotFound, p::LockNotAcquired, p::PermitsMismatch, p::LeaseEnded, p::LockLost, p::TooMany, p::ZookeeperUnavailable)>,
    ))]
pub async fn acquire(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<PermitParams>,
    ApiJson(body): ApiJson<Option<AcquireBody>>,
) -> Result<Response, ApiError> {
    let permit = permits::acquire_permit(&state, &caller, &name, params, body).await?;
    Ok((super::status(permit.acquired), Json(permit)).into_response())
}

state_handler!(
    /// Reads a semaphore: its permits, who holds them, who waits.
    semaphore_state,
    "/v1/semaphores/{name}",
    "semaphores",
    "Semaphore name",
    SemaphoreState,
    semaphore_topic
);

/// Reads a permit request; with `wait`, a long poll that answers at once on news (the permit
/// lost, or a waiter's granted), as a lock handle's does. A runner holding a permit polls it
/// this way to learn of a loss without asking again and again.
#[utoipa::path(get, path = "/v1/semaphores/{name}/permits/{handle}", tag = "semaphores",
    params(("name" = String, Path, description = "Semaphore name"), ("handle" = String, Path, description = "Handle from the acquire"), HandleQuery),
    responses(
        (status = 200, description = "The permit", body = PermitView),
        Problems<(p::InvalidField, p::NotFound, p::LockLost)>,
    ))]
pub async fn get_permit(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, handle)): ApiPath<(String, String)>,
    ApiQuery(query): ApiQuery<HandleQuery>,
    consistency: Consistency,
) -> Result<Json<PermitView>, ApiError> {
    let view = permits::read_permit(&state, &caller, (&name, &handle), query, consistency).await?;
    Ok(Json(view))
}

/// Gives a permit back (or leaves the queue).
#[utoipa::path(operation_id = "release_semaphore", delete, path = "/v1/semaphores/{name}/permits/{handle}", tag = "semaphores",
    params(("name" = String, Path, description = "Semaphore name"), ("handle" = String, Path, description = "Handle from the acquire")),
    responses(
        (status = 204, description = "Given back"),
        Problems<(p::InvalidField, p::NotFound, p::LockLost)>,
    ))]
pub async fn release(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, handle)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    recipe::release_by_id(&state, &state.semaphores, &caller, &name, &handle).await?;
    Ok(StatusCode::NO_CONTENT)
}
