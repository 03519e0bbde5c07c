//! `/v1/barriers`: raise, lower, read, and wait (a long poll) until a barrier is down.

use std::time::{Duration, UNIX_EPOCH};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use zookeeper_client::Client;

use super::contention::{self, LockSummary, check_name};
use super::error::{ApiError, Problem};
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::leases::LeaseView;
use super::timestamp;
use crate::AppState;
use crate::auth::Caller;
use crate::duration::HumanDuration;
use crate::recipes::barrier;
use crate::recipes::ephemeral::BindError;
use crate::zk::retry_on_loss;

/// Body of a raise (optional): without it the barrier is persistent.
#[derive(Deserialize, utoipa::ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct RaiseBody {
    /// Bind the barrier to this lease: it falls when the lease ends.
    pub lease: Option<String>,
    /// Bind the barrier to a new lease with this TTL.
    pub ttl: Option<HumanDuration>,
}

/// A barrier's state.
#[derive(Serialize, utoipa::ToSchema)]
pub struct BarrierView {
    #[schema(example = "nightly-import")]
    pub name: String,
    /// `true` while the barrier is up (waiters wait).
    pub up: bool,
    /// When it was raised.
    pub since: Option<String>,
    /// Whether it falls with its owner (a lease-bound, ephemeral barrier).
    pub bound: bool,
    /// The lease it is bound to, when raised with one on this instance.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseView>,
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

/// The barrier as `client`'s session sees it (after a raise, the session that raised it, which
/// is sure to see it).
async fn view(state: &AppState, client: &Client, name: &str) -> Result<BarrierView, ApiError> {
    let path = state.barriers.dir(name);
    let stat = retry_on_loss(|| client.check_stat(&path)).await?;
    let lease = state.barriers.get(name, name).map(|node| LeaseView::of(&node.lease));
    Ok(BarrierView {
        name: name.to_string(),
        up: stat.is_some(),
        since: stat.map(|s| timestamp(UNIX_EPOCH + Duration::from_millis(s.ctime.max(0) as u64))),
        bound: stat.is_some_and(|s| s.ephemeral_owner != 0),
        lease,
    })
}

/// Raises a barrier: persistent without a body, bound to a lease (it falls when the lease
/// ends) with `lease` or `ttl`. Raising a raised barrier is a no-op (200).
#[utoipa::path(put, path = "/v1/barriers/{name}", tag = "barriers",
    params(("name" = String, Path, description = "Barrier name")),
    request_body(content = Option<RaiseBody>, description = "Optional.", example = json!({"ttl": "5m"})),
    responses(
        (status = 201, description = "Raised", body = BarrierView),
        (status = 200, description = "Already up", body = BarrierView),
        (status = 400, description = "Bad name or body", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such lease", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn raise(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<Option<RaiseBody>>,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    let body = body.unwrap_or_default();
    let (created, client) = if body.lease.is_none() && body.ttl.is_none() {
        let client = state.zk().connected().await?.client;
        (barrier::raise(&client, &state.barriers.dir(&name)).await?, client)
    } else {
        let (lease, _) = contention::lease_for(&state, &caller, body.lease, body.ttl.map(|t| t.0))?;
        let client = lease.session().await?;
        let created = match state
            .barriers
            .bind(&client, state.barriers.base(), &name, &name, &[], &lease)
            .await
        {
            Ok(_) => true,
            Err(BindError::Taken) => false,
            Err(BindError::LeaseEnded) => return Err(contention::lease_gone(&state, &lease)),
            Err(BindError::ZooKeeper(err)) => return Err(err.into()),
        };
        (created, client)
    };
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(view(&state, &client, &name).await?)).into_response())
}

/// Lowers a barrier, releasing every waiter.
#[utoipa::path(delete, path = "/v1/barriers/{name}", tag = "barriers",
    params(("name" = String, Path, description = "Barrier name")),
    responses(
        (status = 204, description = "Lowered"),
        (status = 400, description = "Bad name", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The barrier is not up", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn lower(State(state): State<AppState>, ApiPath(name): ApiPath<String>) -> Result<StatusCode, ApiError> {
    check_name(&name)?;
    if let Some(bound) = state.barriers.get(&name, &name) {
        bound.remove().await;
        return Ok(StatusCode::NO_CONTENT);
    }
    let client = state.zk().connected().await?.client;
    if barrier::lower(&client, &state.barriers.dir(&name)).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("barrier", format!("barrier `{name}` is not up")))
    }
}

/// Reads whether a barrier is up.
#[utoipa::path(get, path = "/v1/barriers/{name}", tag = "barriers",
    params(("name" = String, Path, description = "Barrier name")),
    responses(
        (status = 200, body = BarrierView),
        (status = 400, description = "Bad name", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn barrier_state(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<BarrierView>, ApiError> {
    check_name(&name)?;
    let client = state.zk().current()?.client;
    Ok(Json(view(&state, &client, &name).await?))
}

/// Waits until the barrier is down (a long poll): 200 once it is (at once if it is not up),
/// 409 `barrier-up` if the wait ends first. All waiters on this instance share one ZooKeeper
/// watch.
#[utoipa::path(get, path = "/v1/barriers/{name}/wait", tag = "barriers",
    params(("name" = String, Path, description = "Barrier name"), WaitQuery),
    responses(
        (status = 200, description = "The barrier is down: proceed", body = BarrierView),
        (status = 400, description = "Bad name or query", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Still up when the wait ended", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn wait(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<WaitQuery>,
) -> Result<Json<BarrierView>, ApiError> {
    check_name(&name)?;
    state.zk().current()?;
    let wait = state.config.wait(query.wait.map(|w| w.0));
    let path = state.barriers.dir(&name);
    let down = barrier::wait_down(&state.barrier_watches, &path);
    if tokio::time::timeout(wait, down).await.is_err() {
        return Err(ApiError::conflict(
            "barrier-up",
            "Barrier still up",
            format!(
                "barrier `{name}` was still up after {}",
                humantime::format_duration(wait)
            ),
        ));
    }
    Ok(Json(BarrierView {
        name,
        up: false,
        since: None,
        bound: false,
        lease: None,
    }))
}

/// Lists the barriers that are up.
#[utoipa::path(get, path = "/v1/barriers", tag = "barriers", responses(
    (status = 200, body = Vec<LockSummary>),
    (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
))]
pub async fn list_barriers(State(state): State<AppState>, caller: Caller) -> Result<Json<Vec<LockSummary>>, ApiError> {
    super::contention::list_summaries(&state, &caller, state.barriers.base()).await
}
