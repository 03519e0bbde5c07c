//! `/v1/semaphores`: counting semaphores with N permits, lease-bound, on Curator's
//! `InterProcessSemaphoreV2` znodes. A permit request is a long poll like a lock's, with the
//! same outcomes, limits and timeouts.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{AcquireBody, held_since};
use crate::AppState;
use crate::auth::Caller;
use crate::events::Feed;
use crate::http::consistency::Consistency;
use crate::http::error::{ApiError, Place, Problems, p};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::{Followed, Resource, check_name, state_handler};
use crate::kind::Kind;
use crate::recipes::leases::LeaseView;
use crate::recipes::locks::contention::{self as recipe, Phase, Recorded};
use crate::recipes::locks::semaphore::{SemaphoreState, SemaphoreTopic};
use crate::recipes::locks::{self, semaphore::Permit};
use crate::time::HumanDuration;

/// The semaphore kind's module.
pub const RESOURCE: Resource = Resource {
    kind: Kind::Semaphore,
    about: Some("Counting semaphores with N permits (Curator's InterProcessSemaphoreV2 znodes)."),
    routes,
    topic: Some(Followed {
        feed: |state, name| Feed::of(source(state, name)),
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

/// Semaphore `name` as its topic and `GET` read it.
fn source(state: &AppState, name: &str) -> SemaphoreTopic {
    SemaphoreTopic {
        name: name.to_string(),
        dir: state.semaphores.dir(name),
        local: state.semaphores.clone(),
    }
}

/// Most permits a semaphore may have.
const MAX_PERMITS: u32 = 10_000;

/// Query of `POST /v1/semaphores/{name}/acquire`.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PermitParams {
    /// How many permits the semaphore has (1 to 10000). The first request records it; later
    /// ones must agree.
    #[param(minimum = 1, maximum = 10000)]
    pub permits: u32,
    /// How long to wait for a permit: `0` tries once. Capped by the server's maximum wait,
    /// which is also the default.
    #[param(value_type = Option<String>, example = "10s")]
    pub wait: Option<HumanDuration>,
    /// When the wait ends without a permit: `false` (default) leaves the queue; `true` stays
    /// and answers 202.
    pub keep_queued: Option<bool>,
}

/// A permit request: held (200) or still waiting (202).
#[derive(Serialize, utoipa::ToSchema)]
pub struct PermitView {
    #[schema(example = "exports")]
    pub semaphore: String,
    pub permits: u32,
    /// `true` while a permit is held.
    pub acquired: bool,
    /// Give the permit back with `DELETE /v1/semaphores/{name}/permits/{handle}`.
    pub handle: String,
    /// `pending`, `waiting`, `held`, `lost`, `released` or `failed`.
    pub state: &'static str,
    /// Acquirers ahead while waiting (0: next, waiting for a permit to come back).
    pub position: Option<usize>,
    /// When it was granted (known to the instance that keeps its lease).
    #[schema(format = DateTime)]
    pub held_since: Option<String>,
    /// The lease holding it, when answered by the instance that keeps it; else its id is in
    /// `lease_id`.
    pub lease: Option<LeaseView>,
    pub lease_id: String,
}

fn permit_view(permit: &Permit) -> PermitView {
    let current = permit.state();
    PermitView {
        semaphore: permit.name.clone(),
        permits: permit.protocol.permits,
        acquired: matches!(current.phase, Phase::Held { .. }),
        handle: permit.id.clone(),
        state: current.phase.name(),
        position: match current.phase {
            Phase::Waiting { position } => Some(position),
            _ => None,
        },
        held_since: held_since(&current.phase),
        lease: Some(LeaseView::of(&permit.lease)),
        lease_id: permit.lease.id.clone(),
    }
}

/// A permit request as ZooKeeper has it (its lease kept by another instance).
fn recorded_view(recorded: &Recorded, permits: u32) -> PermitView {
    PermitView {
        semaphore: recorded.name.clone(),
        permits,
        acquired: recorded.holds(),
        handle: recorded.handle.clone(),
        state: if recorded.holds() { "held" } else { "waiting" },
        position: recorded.position,
        held_since: None,
        lease: None,
        lease_id: recorded.owner().map(|o| o.lease).unwrap_or_default(),
    }
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
    check_name(&name)?;
    let permits = params.permits;
    if permits == 0 || permits > MAX_PERMITS {
        let detail = format!("must be 1 to {MAX_PERMITS}");
        return Err(ApiError::invalid(Place::Query, "permits", detail));
    }
    let body = body.unwrap_or_default();
    let request = recipe::Request {
        caller: &caller,
        name: &name,
        wait: params.wait.map(|w| w.0),
        keep_queued: params.keep_queued == Some(true),
        lease: body.lease,
        ttl: body.ttl.map(|t| t.0),
    };
    let outcome = locks::acquire_permit(&state, request, permits).await?;
    Ok((super::status(&outcome), Json(permit_view(&outcome.handle))).into_response())
}

state_handler!(
    /// Reads a semaphore: its permits, who holds them, who waits.
    semaphore_state,
    "/v1/semaphores/{name}",
    "semaphores",
    "Semaphore name",
    SemaphoreState
);

/// Reads a permit request.
#[utoipa::path(get, path = "/v1/semaphores/{name}/permits/{handle}", tag = "semaphores",
    params(("name" = String, Path, description = "Semaphore name"), ("handle" = String, Path, description = "Handle from the acquire")),
    responses(
        (status = 200, description = "The permit", body = PermitView),
        Problems<(p::InvalidField, p::NotFound, p::LockLost)>,
    ))]
pub async fn get_permit(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, handle)): ApiPath<(String, String)>,
    consistency: Consistency,
) -> Result<Json<PermitView>, ApiError> {
    Ok(Json(
        match locks::read_permit(&state, &caller, (&name, &handle), consistency).await? {
            locks::PermitSeen::Here(permit) => permit_view(&permit),
            locks::PermitSeen::There(recorded, permits) => recorded_view(&recorded, permits),
        },
    ))
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
    super::release_by_id(&state, &state.semaphores, &caller, &name, &handle).await
}
