//! `/v1/double-barriers`: enter together once `size` participants are in, leave together once
//! all have left.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Place, Problem, Problems, p};
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::leases::LeaseView;
use super::{Followed, Resource, check_name, state_handler};
use crate::AppState;
use crate::auth::Caller;
use crate::events::Feed;
use crate::kind::Kind;
use crate::recipes::SettingError;
use crate::recipes::barriers::double::{self, DoubleBarrierState, DoubleBarrierTopic, READY};
use crate::recipes::engine::node::{self, NodeHolding};
use crate::recipes::validate_name;
use crate::time::HumanDuration;
use crate::zk::Session;

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
    #[serde(deserialize_with = "super::extract::whole_u32")]
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

fn check_participant(participant: &str) -> Result<(), ApiError> {
    validate_name(participant).map_err(|e| ApiError::invalid(Place::Body, "participant", e))?;
    if participant == READY {
        let detail = "`ready` is the barrier's own node";
        return Err(ApiError::invalid(Place::Body, "participant", detail));
    }
    Ok(())
}

fn taken(name: &str, participant: &str) -> ApiError {
    ApiError::new(
        Problem::MemberTaken,
        format!("`{participant}` is already inside `{name}`"),
    )
}

/// Records `size` in the barrier's znode (creating it); 409 if it records another size.
async fn agree_on_size(session: &Session, dir: &str, name: &str, size: u32) -> Result<(), ApiError> {
    match double::agree_on_size(session, dir, size).await {
        Ok(()) => Ok(()),
        Err(SettingError::Mismatch(n)) => Err(ApiError::new(
            Problem::SizeMismatch,
            format!("double barrier `{name}` has size {n}, not {size}"),
        )
        .with("size", n)),
        Err(SettingError::ZooKeeper(err)) => Err(err.into()),
    }
}

/// The participant's node for an enter: the one it has here already (entering again with its
/// lease goes on waiting), or a new one bound to the lease the request names or makes.
async fn participant(
    state: &AppState,
    caller: &Caller,
    name: &str,
    body: &EnterBody,
) -> Result<(std::sync::Arc<NodeHolding>, Session), ApiError> {
    let dir = state.double_barriers.dir(name);
    match state.double_barriers.get(name, &body.participant) {
        Some(node) if Some(node.lease.id.as_str()) == body.lease.as_deref() => {
            node.lease.check_owner(caller)?;
            let session = node.lease.session().await?;
            agree_on_size(&session, &dir, name, body.size).await?;
            Ok((node, session))
        }
        Some(_) => Err(taken(name, &body.participant)),
        None => {
            let (lease, _) = state
                .leases
                .for_request(caller, body.lease.clone(), body.ttl.map(|t| t.0))
                .await?;
            let session = lease.session().await?;
            agree_on_size(&session, &dir, name, body.size).await?;
            let path = state.double_barriers.node(name, &body.participant);
            let data = node::owner_record(&lease);
            let hold = state
                .double_barriers
                .hold(&lease, name, &body.participant, path, data, None)
                .await;
            let node = state
                .leases
                .held(&lease, hold)?
                .ok_or_else(|| taken(name, &body.participant))?;
            Ok((node, session))
        }
    }
}

/// Enters the barrier: returns 200 once `size` participants are in (at once if the barrier is
/// already open), or 202 when the wait ends first (the participant stays inside; enter again
/// with the same lease to go on waiting). The participant lives by its lease.
#[utoipa::path(post, path = "/v1/double-barriers/{name}/enter", tag = "barriers", extensions(("x-zkgate-served-by" = json!({"any": "body"}))),
    params(("name" = String, Path, description = "Double barrier name"), WaitQuery),
    request_body(content = EnterBody, example = json!({"participant": "worker-3", "size": 5})),
    responses(
        (status = 200, description = "All in: proceed", body = Passage),
        (status = 202, description = "Inside, still waiting for the others", body = Passage),
        Problems<(p::InvalidField, p::MalformedBody, p::NotFound, p::MemberTaken, p::SizeMismatch, p::LeaseEnded, p::ZookeeperUnavailable)>,
    ))]
pub async fn enter(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<WaitQuery>,
    ApiJson(body): ApiJson<EnterBody>,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    check_participant(&body.participant)?;
    if body.size == 0 {
        return Err(ApiError::invalid(Place::Body, "size", "must be at least 1"));
    }
    let deadline = Instant::now() + state.wait(query.wait.map(|w| w.0));
    // Everything from here on the lease's own session: the count of who is inside must include
    // our own node, which only the session that created it is sure to see at once.
    let (node, session) = participant(&state, &caller, &name, &body).await?;
    let dir = state.double_barriers.dir(&name);
    crate::admission::park(); // entered: what is left is waiting for the others
    let passed = double::enter(&session, &state.barrier_watches, &dir, body.size, deadline).await?;
    let inside = double::participants(&session, &dir).await?.len();
    let passage = Passage {
        barrier: name,
        participant: body.participant,
        passed,
        inside,
        lease: Some(LeaseView::of(&node.lease)),
    };
    let status = if passed { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((status, Json(passage)).into_response())
}

/// Leaves the barrier: returns 200 once every participant has left, or 202 when the wait ends
/// first (call again to go on waiting). The guide's exit: the lowest waits for the highest,
/// the others remove themselves and wait for the lowest.
#[utoipa::path(operation_id = "leave_double_barrier", post, path = "/v1/double-barriers/{name}/leave", tag = "barriers",
    params(("name" = String, Path, description = "Double barrier name"), WaitQuery),
    request_body(content = LeaveBody, example = json!({"participant": "worker-3"})),
    responses(
        (status = 200, description = "All left: proceed", body = Passage),
        (status = 202, description = "Still waiting for the others to leave", body = Passage),
        Problems<(p::InvalidField, p::MalformedBody, p::ZookeeperUnavailable)>,
    ))]
pub async fn leave(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<WaitQuery>,
    ApiJson(body): ApiJson<LeaveBody>,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    check_participant(&body.participant)?;
    let deadline = Instant::now() + state.wait(query.wait.map(|w| w.0));
    // Whoever serves it, a participant leaves only by its lease's principal (or an admin).
    let nodes = &state.double_barriers;
    let any = state.synced().await?;
    let what = format!("participant `{}`", body.participant);
    let path = nodes.node(&name, &body.participant);
    node::check_owner(&any, &state.config.root, Kind::DoubleBarrier, &path, &caller, &what).await?;
    // On the participant's own session if it entered here, which sees its own removal at once.
    let session = match nodes.get(&name, &body.participant) {
        Some(node) => node.lease.session().await?,
        None => any,
    };
    let passed = double::leave(
        &session,
        &state.barrier_watches,
        nodes,
        &name,
        &body.participant,
        deadline,
    )
    .await?;
    let inside = double::participants(&session, &nodes.dir(&name)).await?.len();
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
