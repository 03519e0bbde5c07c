//! `/v1/barriers`: raise, lower, read, and wait (a long poll) until a barrier is down.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::consistency::Consistency;
use super::error::{ApiError, Problem, Problems, p};
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::{Followed, Resource, check_name, state_handler};
use crate::AppState;
use crate::auth::Caller;
use crate::events::Feed;
use crate::kind::Kind;
use crate::recipes::barriers::barrier::{self, BarrierState, BarrierTopic};
use crate::recipes::engine::handle::Phase;
use crate::recipes::engine::node;
use crate::recipes::topic::Source;
use crate::time::HumanDuration;

/// The barrier kind's module.
pub const RESOURCE: Resource = Resource {
    kind: Kind::Barrier,
    about: Some("Barriers (raise, lower, wait until down) and double barriers (enter together, leave together)."),
    routes,
    topic: Some(Followed {
        feed: |state, name| Feed::of(source(state, name)),
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

/// Barrier `name` as its topic and `GET` read it.
fn source(state: &AppState, name: &str) -> BarrierTopic {
    BarrierTopic {
        name: name.to_string(),
        path: state.barriers.dir(name),
    }
}

/// Body of a raise (optional): without it the barrier is persistent.
#[derive(Deserialize, utoipa::ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct RaiseBody {
    /// Bind the barrier to this lease: it falls when the lease ends.
    pub lease: Option<String>,
    /// Bind the barrier to a new lease with this TTL.
    pub ttl: Option<HumanDuration>,
}

/// Query of a wait.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WaitQuery {
    /// How long to wait for the barrier to be down (capped by the server's maximum, which is
    /// also the default).
    #[param(value_type = Option<String>, example = "30s")]
    pub wait: Option<HumanDuration>,
}

/// Raises a barrier: persistent without a body, bound to a lease (it falls when the lease
/// ends) with `lease` or `ttl`. Raising a raised barrier is a no-op (200).
#[utoipa::path(put, path = "/v1/barriers/{name}", tag = "barriers", extensions(("x-zkgate-served-by" = json!({"any": "body"}))),
    params(("name" = String, Path, description = "Barrier name")),
    request_body(content = Option<RaiseBody>, description = "Optional.", example = json!({"ttl": "5m"})),
    responses(
        (status = 201, description = "Raised", body = BarrierState),
        (status = 200, description = "Already up", body = BarrierState),
        Problems<(p::InvalidField, p::MalformedBody, p::NotFound, p::LeaseEnded, p::ZookeeperUnavailable)>,
    ))]
pub async fn raise(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<Option<RaiseBody>>,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    let body = body.unwrap_or_default();
    let path = state.barriers.dir(&name);
    // The answer is the barrier as the session that raised it sees it, which is sure to see it.
    let (created, session) = if body.lease.is_none() && body.ttl.is_none() {
        let session = state.zk().connected().await?;
        (barrier::raise(&session, &path).await?, session)
    } else {
        let (lease, _) = state
            .leases
            .for_request(&caller, body.lease, body.ttl.map(|t| t.0))
            .await?;
        let session = lease.session().await?;
        let data = node::owner_record(&lease);
        let hold = state.barriers.hold(&lease, &name, &name, path, data, None).await;
        (state.leases.held(&lease, hold)?.is_some(), session)
    };
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(source(&state, &name).read(&session).await?)).into_response())
}

/// Lowers a barrier, releasing every waiter. A barrier bound to a lease is lowered only by the
/// lease's principal (or an admin), on any instance.
#[utoipa::path(delete, path = "/v1/barriers/{name}", tag = "barriers",
    params(("name" = String, Path, description = "Barrier name")),
    responses(
        (status = 204, description = "Lowered"),
        Problems<(p::InvalidField, p::NotFound, p::ZookeeperUnavailable)>,
    ))]
pub async fn lower(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    check_name(&name)?;
    let session = state.synced().await?;
    let path = state.barriers.dir(&name);
    let root = &state.config.root;
    let owner = node::check_owner(
        &session,
        root,
        Kind::Barrier,
        &path,
        &caller,
        &format!("barrier `{name}`"),
    )
    .await?;
    if let Some(bound) = state.barriers.serving(&name, &name) {
        state.barriers.release(&bound).await;
        if bound.state().phase != Phase::Moved {
            return Ok(StatusCode::NO_CONTENT);
        }
    }
    // Bound to a lease kept elsewhere (or moved there while released here): released with its
    // reference, through ZooKeeper.
    if owner.is_some() && node::release_recorded(&session, root, Kind::Barrier, (&name, &name), &path).await? {
        return Ok(StatusCode::NO_CONTENT);
    }
    if barrier::lower(&session, &path).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("barrier", format!("barrier `{name}` is not up")))
    }
}

state_handler!(
    /// Reads whether a barrier is up.
    barrier_state,
    "/v1/barriers/{name}",
    "barriers",
    "Barrier name",
    BarrierState
);

/// Waits until the barrier is down (a long poll): 200 once it is (at once if it is not up),
/// 409 `barrier-up` if the wait ends first. All waiters on this instance share one ZooKeeper
/// watch.
#[utoipa::path(get, path = "/v1/barriers/{name}/wait", tag = "barriers",
    params(("name" = String, Path, description = "Barrier name"), WaitQuery),
    responses(
        (status = 200, description = "The barrier is down: proceed", body = BarrierState),
        Problems<(p::InvalidField, p::BarrierUp, p::ZookeeperUnavailable)>,
    ))]
pub async fn wait(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<WaitQuery>,
    consistency: Consistency,
) -> Result<Json<BarrierState>, ApiError> {
    check_name(&name)?;
    // The shared watch reads on the primary session, which the `sync` brings up to date.
    state.reader(consistency).await?;
    let wait = state.wait(query.wait.map(|w| w.0));
    let path = state.barriers.dir(&name);
    let down = barrier::wait_down(&state.barrier_watches, &path);
    crate::admission::park();
    if tokio::time::timeout(wait, down).await.is_err() {
        return Err(ApiError::new(
            Problem::BarrierUp,
            format!(
                "barrier `{name}` was still up after {}",
                humantime::format_duration(wait)
            ),
        ));
    }
    Ok(Json(BarrierState {
        name,
        up: false,
        since: None,
        bound: false,
        lease: None,
    }))
}
