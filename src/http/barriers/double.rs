//! `/v1/double-barriers`: enter together once `size` participants are in, leave together once
//! all have left.

use crate::http::guards::{GuardHeader, Guarded};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::auth::Caller;
use crate::events::Feed;
use crate::http::error::{ApiError, Problems, p};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::{Followed, Resource, state_handler};
use crate::kind::Kind;
use crate::recipes::barriers::{self, double::DoubleBarrierState, double::DoubleBarrierTopic};
use crate::recipes::leases::LeaseView;
use crate::time::HumanDuration;

/// The double barrier kind's module.
pub const RESOURCE: Resource = Resource {
    kind: Kind::DoubleBarrier,
    about: None,
    routes,
    topic: Some(Followed {
        feed: |state, name| Feed::of(source(state, name)),
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

/// Double barrier `name` as its topic and `GET` read it.
fn source(state: &AppState, name: &str) -> DoubleBarrierTopic {
    DoubleBarrierTopic {
        name: name.to_string(),
        dir: state.double_barriers.dir(name),
    }
}

/// Query of an enter or a leave.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WaitQuery {
    /// How long to wait (capped by the server's maximum, which is also the default). When it
    /// ends first, the answer is 202 and the call can be repeated to go on waiting.
    #[param(value_type = Option<String>, example = "30s")]
    pub wait: Option<HumanDuration>,
}

/// Body of an enter.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnterBody {
    /// The participant's id, unique in the barrier.
    #[schema(example = "worker-3")]
    pub participant: String,
    /// How many participants make the barrier open (the first enter records it).
    #[schema(example = 5, minimum = 1)]
    #[serde(deserialize_with = "crate::http::extract::whole_u32")]
    pub size: u32,
    /// The lease the participant lives by. Without it a new lease is created.
    pub lease: Option<String>,
    /// TTL of the lease created when `lease` is not given.
    pub ttl: Option<HumanDuration>,
}

/// Body of a leave.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaveBody {
    #[schema(example = "worker-3")]
    pub participant: String,
}

/// Where a participant stands after an enter or a leave.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Passage {
    #[schema(example = "batch-7")]
    pub barrier: String,
    pub participant: String,
    /// `true` when the participant went through (all entered, or all left).
    pub passed: bool,
    /// Participants inside now.
    pub inside: usize,
    /// The lease of the participant, after an enter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseView>,
}

/// Enters the barrier: returns 200 once `size` participants are in (at once if the barrier is
/// already open), or 202 when the wait ends first (the participant stays inside; enter again
/// with the same lease to go on waiting). The participant lives by its lease.
#[utoipa::path(post, path = "/v1/double-barriers/{name}/enter", tag = "barriers", extensions(("x-zkgate-served-by" = json!({"any": "body"}))),
    params(("name" = String, Path, description = "Double barrier name"), WaitQuery, GuardHeader),
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
    ApiQuery(query): ApiQuery<WaitQuery>,
    ApiJson(body): ApiJson<EnterBody>,
) -> Result<Response, ApiError> {
    let deadline = Instant::now() + state.wait(query.wait.map(|w| w.0));
    let entry = barriers::Entry {
        participant: body.participant.clone(),
        size: body.size,
        lease: body.lease,
        ttl: body.ttl.map(|t| t.0),
    };
    let (passed, inside, lease) = barriers::enter(&state, (&caller, &guards), &name, entry, deadline).await?;
    let passage = Passage {
        barrier: name,
        participant: body.participant,
        passed,
        inside,
        lease: Some(LeaseView::of(&lease)),
    };
    let status = if passed { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((status, Json(passage)).into_response())
}

/// Leaves the barrier: returns 200 once every participant has left, or 202 when the wait ends
/// first (call again to go on waiting). The guide's exit: the lowest waits for the highest,
/// the others remove themselves and wait for the lowest.
#[utoipa::path(operation_id = "leave_double_barrier", post, path = "/v1/double-barriers/{name}/leave", tag = "barriers",
    params(("name" = String, Path, description = "Double barrier name"), WaitQuery, GuardHeader),
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
    ApiQuery(query): ApiQuery<WaitQuery>,
    ApiJson(body): ApiJson<LeaveBody>,
) -> Result<Response, ApiError> {
    let deadline = Instant::now() + state.wait(query.wait.map(|w| w.0));
    let (passed, inside) = barriers::leave(&state, (&caller, &guards), &name, &body.participant, deadline).await?;
    let passage = Passage {
        barrier: name,
        participant: body.participant,
        passed,
        inside,
        lease: None,
    };
    let status = if passed { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((status, Json(passage)).into_response())
}

state_handler!(
    /// Reads a double barrier: size, whether it is open, who is inside.
    double_barrier_state,
    "/v1/double-barriers/{name}",
    "barriers",
    "Double barrier name",
    DoubleBarrierState
);
