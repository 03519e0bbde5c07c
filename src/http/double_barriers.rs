//! `/v1/double-barriers`: enter together once `size` participants are in, leave together once
//! all have left.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use zookeeper_client::{Client, CreateMode, Error as ZkError};

use super::contention::{self, LockSummary, check_name};
use super::error::{ApiError, Place, Problem};
use super::extract::{ApiJson, ApiPath, ApiQuery};
use crate::AppState;
use crate::auth::Caller;
use crate::duration::HumanDuration;
use crate::recipes::double_barrier::{self, LeaveStep, READY};
use crate::recipes::ephemeral::BindError;
use crate::zk::names::validate_name;
use crate::zk::retry_on_loss;

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
    #[schema(example = 5)]
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
    pub lease: Option<super::leases::LeaseView>,
}

/// A double barrier's state.
#[derive(Serialize, utoipa::ToSchema)]
pub struct DoubleBarrierView {
    #[schema(example = "batch-7")]
    pub name: String,
    /// The recorded size.
    pub size: Option<u64>,
    /// Whether enough participants have entered.
    pub ready: bool,
    /// The participants inside, by id.
    pub participants: Vec<String>,
}

fn check_participant(participant: &str) -> Result<(), ApiError> {
    validate_name(participant).map_err(|e| ApiError::invalid(Place::Body, "participant", e))?;
    if participant == READY {
        return Err(ApiError::invalid(
            Place::Body,
            "participant",
            "`ready` is the barrier's own node",
        ));
    }
    Ok(())
}

/// Records `size` in the barrier's znode (creating it); 409 if it records another size.
async fn settle_size(client: &Client, dir: &str, name: &str, size: u32) -> Result<(), ApiError> {
    let ours = serde_json::to_vec(&serde_json::json!({ "size": size })).unwrap_or_default();
    loop {
        match retry_on_loss(|| client.get_data(dir)).await {
            Ok((data, stat)) => {
                let recorded = serde_json::from_slice::<serde_json::Value>(&data)
                    .ok()
                    .and_then(|v| v["size"].as_u64());
                match recorded {
                    Some(n) if n == u64::from(size) => return Ok(()),
                    Some(n) => {
                        return Err(ApiError::conflict(
                            "size-mismatch",
                            "Size mismatch",
                            format!("double barrier `{name}` has size {n}, not {size}"),
                        )
                        .with("size", n));
                    }
                    None => match retry_on_loss(|| client.set_data(dir, &ours, Some(stat.version))).await {
                        Ok(_) => return Ok(()),
                        Err(ZkError::BadVersion | ZkError::NoNode) => continue,
                        Err(err) => return Err(err.into()),
                    },
                }
            }
            Err(ZkError::NoNode) => {
                let options = CreateMode::Persistent.with_acls(crate::zk::acls());
                match retry_on_loss(|| client.create(dir, &ours, &options)).await {
                    Ok(_) | Err(ZkError::NodeExists) => continue,
                    Err(ZkError::NoNode) => {
                        crate::zk::session::ensure_path(client, &dir[..dir.rfind('/').unwrap_or(0)]).await?;
                    }
                    Err(err) => return Err(err.into()),
                }
            }
            Err(err) => return Err(err.into()),
        }
    }
}

/// Enters the barrier: returns 200 once `size` participants are in (at once if the barrier is
/// already open), or 202 when the wait ends first (the participant stays inside; enter again
/// with the same lease to go on waiting). The participant lives by its lease.
#[utoipa::path(post, path = "/v1/double-barriers/{name}/enter", tag = "barriers",
    params(("name" = String, Path, description = "Double barrier name"), WaitQuery),
    request_body(content = EnterBody, example = json!({"participant": "worker-3", "size": 5})),
    responses(
        (status = 200, description = "All in: proceed", body = Passage),
        (status = 202, description = "Inside, still waiting for the others", body = Passage),
        (status = 400, description = "Bad name, participant or body", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such lease", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The participant id is taken, or the barrier has another size", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
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
    let deadline = Instant::now() + state.config.wait(query.wait.map(|w| w.0));
    let dir = state.double_barriers.dir(&name);
    // Everything from here on the lease's own session: the count of who is inside must include
    // our own node, which only the session that created it is sure to see at once.
    let (node, client) = match state.double_barriers.get(&name, &body.participant) {
        Some(node) if Some(node.lease.id.as_str()) == body.lease.as_deref() => {
            let client = node.lease.session().await?;
            settle_size(&client, &dir, &name, body.size).await?;
            (node, client)
        }
        Some(_) => return Err(taken(&name, &body.participant)),
        None => {
            let (lease, _) = contention::lease_for(&state, &caller, body.lease, body.ttl.map(|t| t.0))?;
            let client = lease.session().await?;
            settle_size(&client, &dir, &name, body.size).await?;
            let node = match state
                .double_barriers
                .bind(&client, &dir, &name, &body.participant, &[], &lease)
                .await
            {
                Ok(node) => node,
                Err(BindError::Taken) => return Err(taken(&name, &body.participant)),
                Err(BindError::LeaseEnded) => return Err(contention::lease_gone(&state, &lease)),
                Err(BindError::ZooKeeper(err)) => return Err(err.into()),
            };
            (node, client)
        }
    };
    let ready_path = format!("{dir}/{READY}");
    let mut ready = state.barrier_watches.subscribe(&ready_path);
    let passed = loop {
        let inside = double_barrier::participants(&client, &dir).await?;
        let ready_now = retry_on_loss(|| client.check_stat(&ready_path)).await?.is_some();
        if ready_now && (inside.len() > 1 || body.size == 1) {
            break true;
        }
        if ready_now {
            // Open with nobody else inside: left over from a round that ended uncleanly.
            double_barrier::clear_ready(&client, &dir).await?;
        }
        if inside.len() >= body.size as usize {
            double_barrier::make_ready(&client, &dir).await?;
            break true;
        }
        let appeared = ready.state.wait_for(|known| matches!(known, Some(Some(_))));
        if tokio::time::timeout_at(deadline, appeared).await.is_err() {
            break false;
        }
    };
    let inside = double_barrier::participants(&client, &dir).await?.len();
    let passage = Passage {
        barrier: name,
        participant: body.participant,
        passed,
        inside,
        lease: Some(super::leases::LeaseView::of(&node.lease)),
    };
    let status = if passed { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((status, Json(passage)).into_response())
}

fn taken(name: &str, participant: &str) -> ApiError {
    ApiError::conflict(
        "member-taken",
        "Participant id taken",
        format!("`{participant}` is already inside `{name}`"),
    )
}

/// Leaves the barrier: returns 200 once every participant has left, or 202 when the wait ends
/// first (call again to go on waiting). The guide's exit: the lowest waits for the highest,
/// the others remove themselves and wait for the lowest.
#[utoipa::path(post, path = "/v1/double-barriers/{name}/leave", tag = "barriers",
    params(("name" = String, Path, description = "Double barrier name"), WaitQuery),
    request_body(content = LeaveBody, example = json!({"participant": "worker-3"})),
    responses(
        (status = 200, description = "All left: proceed", body = Passage),
        (status = 202, description = "Still waiting for the others to leave", body = Passage),
        (status = 400, description = "Bad name or body", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
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
    let deadline = Instant::now() + state.config.wait(query.wait.map(|w| w.0));
    // On the participant's own session if it entered here, which sees its own removal at once.
    let client = match state.double_barriers.get(&name, &body.participant) {
        Some(node) => {
            node.lease.check_owner(&caller)?;
            node.lease.session().await?
        }
        None => state.zk().connected().await?.client,
    };
    let dir = state.double_barriers.dir(&name);
    let me = body.participant.as_str();
    let passed = loop {
        let inside = double_barrier::participants(&client, &dir).await?;
        let target = match double_barrier::next_leave_step(&inside, me) {
            LeaveStep::Done => {
                remove_participant(&state, &caller, &client, &dir, &name, me).await?;
                double_barrier::clear_ready(&client, &dir).await?;
                break true;
            }
            LeaveStep::WaitFor(highest) => highest.to_string(),
            LeaveStep::RemoveAndWaitFor(lowest) => {
                remove_participant(&state, &caller, &client, &dir, &name, me).await?;
                lowest.to_string()
            }
        };
        let mut gone = state.barrier_watches.subscribe(&format!("{dir}/{target}"));
        let deleted = gone.state.wait_for(|known| matches!(known, Some(None)));
        if tokio::time::timeout_at(deadline, deleted).await.is_err() {
            break false;
        }
    };
    let inside = double_barrier::participants(&client, &dir).await?.len();
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

/// Removes the participant's node: through its lease binding when it entered here, else
/// directly (ZooKeeper lets any session delete an ephemeral node).
async fn remove_participant(
    state: &AppState,
    caller: &Caller,
    client: &Client,
    dir: &str,
    name: &str,
    me: &str,
) -> Result<(), ApiError> {
    if let Some(node) = state.double_barriers.get(name, me) {
        node.lease.check_owner(caller)?;
        node.remove().await;
        return Ok(());
    }
    match retry_on_loss(|| client.delete(&format!("{dir}/{me}"), None)).await {
        Ok(()) | Err(ZkError::NoNode) => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// Reads a double barrier: size, whether it is open, who is inside.
#[utoipa::path(get, path = "/v1/double-barriers/{name}", tag = "barriers",
    params(("name" = String, Path, description = "Double barrier name")),
    responses(
        (status = 200, body = DoubleBarrierView),
        (status = 400, description = "Bad name", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn double_barrier_state(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<DoubleBarrierView>, ApiError> {
    check_name(&name)?;
    let client = state.zk().current()?.client;
    let dir = state.double_barriers.dir(&name);
    let size = match retry_on_loss(|| client.get_data(&dir)).await {
        Ok((data, _)) => serde_json::from_slice::<serde_json::Value>(&data)
            .ok()
            .and_then(|v| v["size"].as_u64()),
        Err(ZkError::NoNode) => None,
        Err(err) => return Err(err.into()),
    };
    let ready = retry_on_loss(|| client.check_stat(&format!("{dir}/{READY}")))
        .await?
        .is_some();
    let participants = double_barrier::participants(&client, &dir).await?;
    Ok(Json(DoubleBarrierView {
        name,
        size,
        ready,
        participants,
    }))
}

/// Lists the double barriers.
#[utoipa::path(get, path = "/v1/double-barriers", tag = "barriers", responses(
    (status = 200, body = Vec<LockSummary>),
    (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
))]
pub async fn list_double_barriers(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<Vec<LockSummary>>, ApiError> {
    super::contention::list_summaries(&state, &caller, state.double_barriers.base()).await
}
