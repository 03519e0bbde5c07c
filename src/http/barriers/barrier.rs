//! `/v1/barriers`: raise, lower, read, and wait (a long poll) until a barrier is down.

use crate::http::guards::{GuardHeader, Guarded};
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
use crate::recipes::barriers::{self, DownQuery, RaiseBody, barrier::BarrierState};

/// The barrier kind's module.
pub const RESOURCE: Resource = Resource {
    kind: Kind::Barrier,
    about: Some("Barriers (raise, lower, wait until down) and double barriers (enter together, leave together)."),
    routes,
    topic: Some(Followed {
        summary: "Follows a barrier: raised or lowered, as Server-Sent Events.",
        param: "name",
    }),
    listed: Some("Lists the barriers that are up."),
};

fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(barrier_state, raise, lower))
        .routes(routes!(wait))
}

/// Raises a barrier: persistent without a body, bound to a lease (it falls when the lease
/// ends) with `lease` or `ttl`. Raising a raised barrier is a no-op (200).
#[utoipa::path(put, path = "/v1/barriers/{name}", tag = "barriers", extensions(("x-zkgate-served-by" = json!({"any": "body"}))),
    params(("name" = String, Path, description = "Barrier name"), GuardHeader),
    request_body(content = Option<RaiseBody>, description = "Optional.", example = json!({"ttl": "5m"})),
    responses(
        (status = 201, description = "Raised", body = BarrierState),
        (status = 200, description = "Already up", body = BarrierState),
        Problems<(p::InvalidField, p::MalformedBody, p::NotFound, p::LeaseEnded, p::ZookeeperUnavailable)>,
    ))]
pub async fn raise(
    State(state): State<AppState>,
    caller: Caller,
    Guarded(guards): Guarded,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<Option<RaiseBody>>,
) -> Result<Response, ApiError> {
    let (created, barrier) = barriers::raise(&state, (&caller, &guards), &name, body.unwrap_or_default()).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(barrier)).into_response())
}

/// Lowers a barrier, releasing every waiter. A barrier bound to a lease is lowered only by the
/// lease's principal (or an admin), on any instance.
#[utoipa::path(delete, path = "/v1/barriers/{name}", tag = "barriers",
    params(("name" = String, Path, description = "Barrier name"), GuardHeader),
    responses(
        (status = 204, description = "Lowered"),
        Problems<(p::InvalidField, p::NotFound, p::ZookeeperUnavailable)>,
    ))]
pub async fn lower(
    State(state): State<AppState>,
    caller: Caller,
    Guarded(guards): Guarded,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    barriers::lower(&state, (&caller, &guards), &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

state_handler!(
    /// Reads whether a barrier is up.
    barrier_state,
    "/v1/barriers/{name}",
    "barriers",
    "Barrier name",
    BarrierState,
    barrier_topic
);

/// Waits until the barrier is down (a long poll): 200 once it is (at once if it is not up),
/// 409 `barrier-up` if the wait ends first. All waiters on this instance share one ZooKeeper
/// watch.
#[utoipa::path(get, path = "/v1/barriers/{name}/wait", tag = "barriers",
    params(("name" = String, Path, description = "Barrier name"), DownQuery),
    responses(
        (status = 200, description = "The barrier is down: proceed", body = BarrierState),
        Problems<(p::InvalidField, p::BarrierUp, p::ZookeeperUnavailable)>,
    ))]
pub async fn wait(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<DownQuery>,
    consistency: Consistency,
) -> Result<Json<BarrierState>, ApiError> {
    barriers::wait_down(&state, &name, query.wait.map(|w| w.0), consistency).await?;
    Ok(Json(BarrierState {
        name,
        up: false,
        since: None,
        bound: false,
        lease: None,
    }))
}
