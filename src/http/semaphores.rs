//! `/v1/semaphores`: counting semaphores with N permits, lease-bound, on Curator's
//! `InterProcessSemaphoreV2` znodes.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::contention::{self, AcquireBody, ContenderView, LockSummary, check_name};
use super::error::{ApiError, Place, Problem};
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::leases::LeaseView;
use super::timestamp;
use crate::AppState;
use crate::auth::Caller;
use crate::duration::HumanDuration;
use crate::lease::EndReason;
use crate::recipes::contender::{Phase, read_contenders};
use crate::recipes::semaphore::{Permit, Settle, settle_permits};

/// Most permits a semaphore may have.
const MAX_PERMITS: u32 = 10_000;

/// Query of `POST /v1/semaphores/{name}/acquire`.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PermitParams {
    /// How many permits the semaphore has (1 to 10000). The first request records it; later
    /// ones must agree.
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
    pub held_since: Option<String>,
    pub lease: LeaseView,
}

/// A semaphore's permits and queue.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SemaphoreState {
    #[schema(example = "exports")]
    pub name: String,
    /// The number of permits recorded, if any request recorded it.
    pub permits: Option<u64>,
    /// The permits held (lease nodes), oldest first.
    pub holders: Vec<ContenderView>,
    /// Acquirers in the queue, the first (lock holder) waiting for a permit to come back.
    pub waiters: Vec<ContenderView>,
}

fn permit_view(permit: &Permit) -> PermitView {
    let current = permit.state();
    let (position, held_since) = match current.phase {
        Phase::Waiting { position } => (Some(position), None),
        Phase::Held { since } => (None, Some(timestamp(since))),
        _ => (None, None),
    };
    PermitView {
        semaphore: permit.semaphore.clone(),
        permits: permit.permits,
        acquired: matches!(current.phase, Phase::Held { .. }),
        handle: permit.handle.clone(),
        state: current.phase.name(),
        position,
        held_since,
        lease: LeaseView::of(&permit.lease),
    }
}

/// Acquires one permit, waiting up to `wait`. Without a `lease` one is created and returned;
/// the permit goes back when the lease ends. A lease asking again gets the same handle.
#[utoipa::path(post, path = "/v1/semaphores/{name}/acquire", tag = "semaphores",
    params(("name" = String, Path, description = "Semaphore name"), PermitParams),
    request_body(content = Option<AcquireBody>, description = "Optional.", example = json!({"ttl": "30s"})),
    responses(
        (status = 200, description = "A permit is held", body = PermitView),
        (status = 202, description = "Still waiting (`keep_queued=true`)", body = PermitView),
        (status = 400, description = "Bad name, parameter or body", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such lease", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "No permit within the wait (left the queue); or the semaphore has another number of permits", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The lease ended", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn acquire(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<PermitParams>,
    ApiJson(body): ApiJson<Option<AcquireBody>>,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    if params.permits == 0 || params.permits > MAX_PERMITS {
        return Err(ApiError::invalid(
            Place::Query,
            "permits",
            format!("must be 1 to {MAX_PERMITS}"),
        ));
    }
    let body = body.unwrap_or_default();
    let wait = state.config.wait(params.wait.map(|w| w.0));
    let (lease, own_lease) = contention::lease_for(&state, &caller, body.lease, body.ttl.map(|t| t.0))?;
    // On the lease's session, where the permit's driver reads the count back.
    let settled = match lease.session().await {
        Ok(client) => settle_permits(&client, &state.semaphores.dir(&name), params.permits)
            .await
            .map_err(Refusal::Settle),
        Err(err) => Err(Refusal::Lease(err)),
    };
    // A lease made for this request goes with it.
    if settled.is_err() && own_lease {
        let _ = state.leases.end(&caller, &lease.id, EndReason::Deleted).await;
    }
    match settled {
        Ok(()) => {}
        Err(Refusal::Settle(Settle::Mismatch(recorded))) => {
            return Err(ApiError::conflict(
                "permits-mismatch",
                "Permits mismatch",
                format!("semaphore `{name}` has {recorded} permits, not {}", params.permits),
            )
            .with("permits", recorded));
        }
        Err(Refusal::Settle(Settle::ZooKeeper(err))) => return Err(err.into()),
        Err(Refusal::Lease(err)) => return Err(err.into()),
    }
    let Some(permit) = state.semaphores.request(&lease, &name, params.permits) else {
        return Err(contention::lease_gone(&state, &lease));
    };
    let deadline = Instant::now() + wait;
    let mut updates = permit.subscribe();
    let first = deadline.max(Instant::now() + Duration::from_secs(10));
    let _ = tokio::time::timeout_at(first, updates.wait_for(|s| s.phase != Phase::Pending)).await;
    let held_or_done = updates.wait_for(|s| matches!(s.phase, Phase::Held { .. }) || s.phase.is_final());
    let _ = tokio::time::timeout_at(deadline, held_or_done).await;
    match permit.state().phase {
        Phase::Held { .. } => Ok((StatusCode::OK, Json(permit_view(&permit))).into_response()),
        Phase::Waiting { .. } if params.keep_queued == Some(true) => {
            Ok((StatusCode::ACCEPTED, Json(permit_view(&permit))).into_response())
        }
        Phase::Failed { error } => {
            give_up(&state, &permit, own_lease).await;
            Err(error.into())
        }
        Phase::Lost { .. } | Phase::Released => Err(contention::lease_gone(&state, &lease)),
        Phase::Waiting { position } => {
            give_up(&state, &permit, own_lease).await;
            Err(ApiError::not_acquired(format!(
                "no permit of `{name}` within {}; the request left the queue ({position} ahead)",
                humantime::format_duration(wait)
            ))
            .with("position", position)
            .with("queued", false))
        }
        Phase::Pending => {
            give_up(&state, &permit, own_lease).await;
            Err(ApiError::unavailable(
                "ZooKeeper did not answer in time; the request left the queue",
            ))
        }
    }
}

/// Why a permit request stops before it queues.
enum Refusal {
    Settle(Settle),
    Lease(crate::lease::LeaseError),
}

async fn give_up(state: &AppState, permit: &Arc<Permit>, own_lease: bool) {
    state.semaphores.release(permit).await;
    if own_lease {
        let _ = state
            .leases
            .end(&Caller::Anyone, &permit.lease.id, EndReason::Deleted)
            .await;
    }
}

/// Reads a semaphore: its permits, who holds them, who waits.
#[utoipa::path(get, path = "/v1/semaphores/{name}", tag = "semaphores",
    params(("name" = String, Path, description = "Semaphore name")),
    responses(
        (status = 200, body = SemaphoreState),
        (status = 400, description = "Bad name", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn semaphore_state(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<SemaphoreState>, ApiError> {
    check_name(&name)?;
    let client = state.zk().current()?.client;
    let dir = state.semaphores.dir(&name);
    let permits = match crate::zk::retry_on_loss(|| client.get_data(&dir)).await {
        Ok((data, _)) => serde_json::from_slice::<serde_json::Value>(&data)
            .ok()
            .and_then(|v| v["permits"].as_u64()),
        Err(zookeeper_client::Error::NoNode) => None,
        Err(err) => return Err(err.into()),
    };
    let view = |record| contention::contender_view(record, None, None);
    let mut holders: Vec<ContenderView> = read_contenders(&client, &format!("{dir}/leases"))
        .await?
        .unwrap_or_default()
        .into_iter()
        .map(view)
        .collect();
    let mut waiters: Vec<ContenderView> = read_contenders(&client, &format!("{dir}/locks"))
        .await?
        .unwrap_or_default()
        .into_iter()
        .map(view)
        .collect();
    // A lease node beyond the permits belongs to the queue's first acquirer, still waiting.
    if let Some(limit) = permits
        && holders.len() > limit as usize
    {
        let extra = holders.split_off(limit as usize);
        waiters.splice(0..0, extra);
    }
    Ok(Json(SemaphoreState {
        name,
        permits,
        holders,
        waiters,
    }))
}

/// Lists the semaphores that exist in ZooKeeper.
#[utoipa::path(get, path = "/v1/semaphores", tag = "semaphores", responses(
    (status = 200, body = Vec<LockSummary>),
    (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
))]
pub async fn list_semaphores(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<Vec<LockSummary>>, ApiError> {
    super::contention::list_summaries(&state, &caller, state.semaphores.base()).await
}

fn find(state: &AppState, caller: &Caller, name: &str, handle: &str) -> Result<Arc<Permit>, ApiError> {
    check_name(name)?;
    let permit = state.semaphores.by_handle(name, handle).ok_or_else(|| {
        ApiError::not_found(
            "handle",
            format!("no permit handle `{handle}` for `{name}` on this instance"),
        )
    })?;
    permit.lease.check_owner(caller)?;
    Ok(permit)
}

/// Reads a permit request.
#[utoipa::path(get, path = "/v1/semaphores/{name}/permits/{handle}", tag = "semaphores",
    params(("name" = String, Path, description = "Semaphore name"), ("handle" = String, Path, description = "Handle from the acquire")),
    responses(
        (status = 200, body = PermitView),
        (status = 400, description = "Bad name", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such handle", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_permit(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, handle)): ApiPath<(String, String)>,
) -> Result<Json<PermitView>, ApiError> {
    let permit = find(&state, &caller, &name, &handle)?;
    Ok(Json(permit_view(&permit)))
}

/// Gives a permit back (or leaves the queue).
#[utoipa::path(delete, path = "/v1/semaphores/{name}/permits/{handle}", tag = "semaphores",
    params(("name" = String, Path, description = "Semaphore name"), ("handle" = String, Path, description = "Handle from the acquire")),
    responses(
        (status = 204, description = "Given back"),
        (status = 400, description = "Bad name", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such handle", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn release(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, handle)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let permit = find(&state, &caller, &name, &handle)?;
    state.semaphores.release(&permit).await;
    Ok(StatusCode::NO_CONTENT)
}
