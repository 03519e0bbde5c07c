//! `/v1/double-barriers`: enter together once `size` participants are in, leave together once
//! all have left.

use crate::http::guards::{GuardHeader, Guarded};
use crate::http::json::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::auth::Caller;
use crate::http::error::{ApiError, Problems, p};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::{Followed, Resource, state_handler};
use crate::kind::Kind;
use crate::recipes::barriers::double::DoubleBarrierState;
use crate::recipes::barriers::{self, EnterBody, LeaveBody, Passage, PassageQuery};

/// The double barrier kind's module.
pub const RESOURCE: Resource = Resource {
    kind: Kind::DoubleBarrier,
    about: None,
    routes,
    topic: Some(Followed {
        summary: "Follows a double barrier: who entered, and when it is ready and done, as Server-Sent Events.",
        param: "name",
    }),
    listed: Some("Lists the double barriers."),
};

fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(double_barrier_state))
        .routes(routes!(enter))
        .routes(routes!(leave))
}

/// Enters the barrier: returns 200 once `size` participants are in (at once if the barrier is
/// already open), or 202 when the wait ends first (the participant stays inside; enter again
/// with the same lease to go on waiting). The participant lives by its lease.
#[utoipa::path(post, path = "/v1/double-barriers/{name}/enter", tag = "barriers", extensions(("x-zkgate-served-by" = json!({"any": "body"}))),
    params(("name" = String, Path, description = "Double barrier name"), PassageQuery, GuardHeader),
    request_body(content = EnterBody, example = json!({"participant": "worker-3", "size": 5})),
    responses(
        (status = 200, description = "All in: proceed", body = Passage),
        (status = 202, description = "Inside, still waiting for the others", body = Passage),
        Problems<(p::InvalidField, p::MalformedBody, p::NotFound, p::MemberTaken, p::SizeMismatch, p::LeaseEnded, p::ZookeeperUnavailable)>,
    ))]
pub async fn enter(
    State(state): State<AppState>,
    caller: Caller,
    Guarded(guards): Guarded,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<PassageQuery>,
    ApiJson(body): ApiJson<EnterBody>,
) -> Result<Response, ApiError> {
    let passage = barriers::enter(&state, (&caller, &guards), &name, query, body).await?;
    let status = if passage.passed {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(passage)).into_response())
}

/// Leaves the barrier: returns 200 once every participant has left, or 202 when the wait ends
/// first (call again to go on waiting). The guide's exit: the lowest waits for the highest,
/// the others remove themselves and wait for the lowest.
#[utoipa::path(operation_id = "leave_double_barrier", post, path = "/v1/double-barriers/{name}/leave", tag = "barriers",
    params(("name" = String, Path, description = "Double barrier name"), PassageQuery, GuardHeader),
    request_body(content = LeaveBody, example = json!({"participant": "worker-3"})),
    responses(
        (status = 200, description = "All left: proceed", body = Passage),
        (status = 202, description = "Still waiting for the others to leave", body = Passage),
        Problems<(p::InvalidField, p::MalformedBody, p::ZookeeperUnavailable)>,
    ))]
pub async fn leave(
    State(state): State<AppState>,
    caller: Caller,
    Guarded(guards): Guarded,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<PassageQuery>,
    ApiJson(body): ApiJson<LeaveBody>,
) -> Result<Response, ApiError> {
    let passage = barriers::leave(&state, (&caller, &guards), &name, query, body).await?;
    let status = if passage.passed {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(passage)).into_response())
}

state_handler!(
    /// Reads a double barrier: size, whether it is open, who is inside.
    double_barrier_state,
    "/v1/double-barriers/{name}",
    "barriers",
    "Double barrier name",
    DoubleBarrierState,
    double_barrier_topic
);
