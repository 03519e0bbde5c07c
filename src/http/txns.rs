//! `/v1/txns`: two-phase commit: create a transaction, register participants, vote, and read
//! (or wait for) the decision, which is written once and never changes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, UNIX_EPOCH};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::contention::{self, LockSummary, check_name};
use super::error::{ApiError, Place, Problem};
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::timestamp;
use crate::AppState;
use crate::auth::Caller;
use crate::duration::HumanDuration;
use crate::recipes::ephemeral::BindError;
use crate::recipes::txn::{self, Decision, Record, Spec, Vote, VoteError};
use crate::zk::names::validate_name;

/// Most participants a transaction may have.
const MAX_PARTICIPANTS: usize = 100;

/// Body of `POST /v1/txns`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTxn {
    /// The transaction's id (default: a new UUID).
    pub id: Option<String>,
    /// Who must vote (1 to 100 distinct names).
    #[schema(example = json!(["billing", "inventory"]))]
    pub participants: Vec<String>,
    /// What is being decided, shown to everyone.
    #[schema(example = json!({"order": 42}))]
    pub payload: Option<serde_json::Value>,
    /// How long the participants have to vote; then the transaction aborts (default 60s).
    pub deadline: Option<HumanDuration>,
}

/// A transaction.
#[derive(Serialize, utoipa::ToSchema)]
pub struct TxnView {
    #[schema(example = "order-42")]
    pub id: String,
    pub participants: Vec<String>,
    pub payload: Option<serde_json::Value>,
    /// When it aborts if not decided before.
    pub deadline_at: String,
    /// Participants registered now.
    pub registered: BTreeSet<String>,
    /// The votes cast.
    pub votes: BTreeMap<String, Vote>,
    /// The decision, once made: it never changes.
    pub decision: Option<Decision>,
}

/// Query of a transaction read.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TxnQuery {
    /// Wait (up to this long, capped by the server's maximum) for the decision.
    #[param(value_type = Option<String>, example = "30s")]
    pub wait: Option<HumanDuration>,
}

/// Body of a registration (optional).
#[derive(Deserialize, utoipa::ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct RegisterBody {
    /// The lease the registration lives by (without it a new lease is created): if it ends
    /// before the participant votes, the transaction aborts.
    pub lease: Option<String>,
    pub ttl: Option<HumanDuration>,
}

/// Body of a vote.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VoteBody {
    pub vote: Vote,
}

fn view(id: String, record: Record) -> TxnView {
    TxnView {
        id,
        participants: record.spec.participants,
        payload: record.spec.payload,
        deadline_at: timestamp(UNIX_EPOCH + Duration::from_millis(record.spec.deadline_ms.max(0) as u64)),
        registered: record.registered,
        votes: record.votes,
        decision: record.decision,
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found("transaction", format!("no transaction `{id}`"))
}

/// Creates a transaction; this instance coordinates it (it alone watches the votes).
#[utoipa::path(post, path = "/v1/txns", tag = "txns",
    request_body(content = CreateTxn, example = json!({"id": "order-42", "participants": ["billing", "inventory"], "payload": {"order": 42}, "deadline": "30s"})),
    responses(
        (status = 201, description = "Created", body = TxnView),
        (status = 400, description = "Bad body", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The id is taken", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<CreateTxn>,
) -> Result<Response, ApiError> {
    let id = body.id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    validate_name(&id).map_err(|e| ApiError::invalid(Place::Body, "id", e))?;
    caller.require(crate::kind::Kind::Txn.auth(), &id, crate::auth::Access::Write)?;
    if body.participants.is_empty() || body.participants.len() > MAX_PARTICIPANTS {
        return Err(ApiError::invalid(
            Place::Body,
            "participants",
            format!("must name 1 to {MAX_PARTICIPANTS} participants"),
        ));
    }
    let mut seen = BTreeSet::new();
    for participant in &body.participants {
        validate_name(participant)
            .map_err(|e| ApiError::invalid(Place::Body, "participants", format!("`{participant}` {e}")))?;
        if !seen.insert(participant) {
            return Err(ApiError::invalid(
                Place::Body,
                "participants",
                format!("`{participant}` is named twice"),
            ));
        }
    }
    let deadline = body.deadline.map(|d| d.0).unwrap_or(Duration::from_secs(60));
    if deadline.is_zero() {
        return Err(ApiError::invalid(Place::Body, "deadline", "must be above zero"));
    }
    let now = txn::now_ms();
    let spec = Spec {
        participants: body.participants,
        payload: body.payload,
        deadline_ms: now + deadline.as_millis() as i64,
        created_at_ms: now,
    };
    let client = state.zk().connected().await?.client;
    let dir = state.txn_members.dir(&id);
    match txn::create(&client, &dir, &spec).await {
        Ok(()) => {}
        Err(zookeeper_client::Error::NodeExists) => {
            return Err(ApiError::conflict(
                "txn-exists",
                "Transaction exists",
                format!("a transaction `{id}` exists"),
            ));
        }
        Err(err) => return Err(err.into()),
    }
    tokio::spawn(txn::coordinate(state.zk().clone(), dir.clone(), spec.deadline_ms));
    let record = txn::read(&client, &dir).await?.ok_or_else(|| not_found(&id))?;
    Ok((StatusCode::CREATED, Json(view(id, record))).into_response())
}

/// Reads a transaction; with `wait`, blocks until it is decided (or the wait ends). Past the
/// deadline the reader writes the abort itself if nobody has, so a lost coordinator cannot
/// leave a transaction undecided.
#[utoipa::path(get, path = "/v1/txns/{id}", tag = "txns",
    params(("id" = String, Path, description = "Transaction id"), TxnQuery),
    responses(
        (status = 200, body = TxnView),
        (status = 400, description = "Bad id or query", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such transaction", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_txn(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<TxnQuery>,
) -> Result<Json<TxnView>, ApiError> {
    check_name(&id)?;
    let client = state.zk().current()?.client;
    let dir = state.txn_members.dir(&id);
    let record = txn::read(&client, &dir).await?.ok_or_else(|| not_found(&id))?;
    if record.decision.is_some() || query.wait.is_none() {
        return Ok(Json(view(id, record)));
    }
    let wait = query.wait.map(|w| w.0).unwrap_or_default().min(state.config.max_wait);
    let until = Instant::now() + wait;
    let deadline = Instant::now() + Duration::from_millis((record.spec.deadline_ms - txn::now_ms()).max(0) as u64);
    let mut decided = state.barrier_watches.subscribe(&format!("{dir}/decision"));
    let appeared = async {
        let _ = decided.state.wait_for(|known| matches!(known, Some(Some(_)))).await;
    };
    tokio::select! {
        _ = appeared => {}
        _ = tokio::time::sleep_until(until) => {}
        _ = tokio::time::sleep_until(deadline), if deadline < until => {
            txn::decide_now(&client, &dir, &BTreeSet::new()).await?;
        }
    }
    let record = txn::read(&client, &dir).await?.ok_or_else(|| not_found(&id))?;
    Ok(Json(view(id, record)))
}

/// Registers a participant: its own ephemeral node, bound to its lease, so that its failure
/// before it votes aborts the transaction.
#[utoipa::path(put, path = "/v1/txns/{id}/participants/{participant}", tag = "txns",
    params(("id" = String, Path, description = "Transaction id"), ("participant" = String, Path, description = "A participant named at creation")),
    request_body(content = Option<RegisterBody>, description = "Optional.", example = json!({"ttl": "30s"})),
    responses(
        (status = 201, description = "Registered", body = TxnView),
        (status = 400, description = "Bad id, participant or body", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such transaction or lease", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not a participant, or registered by another", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The lease named has ended", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn register(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((id, participant)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<Option<RegisterBody>>,
) -> Result<Response, ApiError> {
    let (_, dir, _) = participant_of(&state, &caller, &id, &participant).await?;
    let body = body.unwrap_or_default();
    let (lease, _) = contention::lease_for(&state, &caller, body.lease, body.ttl.map(|t| t.0))?;
    // The member node lives on the lease's session, and is read back on it (which sees it).
    let client = lease.session().await?;
    let members = format!("{dir}/members");
    match state
        .txn_members
        .bind(&client, &members, &id, &participant, &[], &lease)
        .await
    {
        Ok(_) => {}
        Err(BindError::Taken) => {
            return Err(ApiError::conflict(
                "member-taken",
                "Participant registered",
                format!("`{participant}` is registered by another"),
            ));
        }
        Err(BindError::LeaseEnded) => return Err(contention::lease_gone(&state, &lease)),
        Err(BindError::ZooKeeper(err)) => return Err(err.into()),
    }
    let record = txn::read(&client, &dir).await?.ok_or_else(|| not_found(&id))?;
    Ok((StatusCode::CREATED, Json(view(id, record))).into_response())
}

/// Votes `commit` or `abort`. A vote is final: the same vote again is accepted, another is
/// refused; so is a vote once the transaction is decided.
#[utoipa::path(post, path = "/v1/txns/{id}/participants/{participant}/vote", tag = "txns",
    params(("id" = String, Path, description = "Transaction id"), ("participant" = String, Path, description = "A registered participant")),
    request_body(content = VoteBody, example = json!({"vote": "commit"})),
    responses(
        (status = 200, description = "Recorded", body = TxnView),
        (status = 400, description = "Bad id, participant or vote", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such transaction", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not a registered participant, already voted otherwise, or already decided", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn vote(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((id, participant)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<VoteBody>,
) -> Result<Json<TxnView>, ApiError> {
    let (client, dir, record) = participant_of(&state, &caller, &id, &participant).await?;
    if let Some(decision) = &record.decision
        && record.votes.get(&participant) != Some(&body.vote)
    {
        return Err(ApiError::conflict(
            "txn-decided",
            "Already decided",
            format!("`{id}` was decided: {}", decision.reason),
        )
        .with("outcome", decision.outcome));
    }
    if !record.registered.contains(&participant) && !record.votes.contains_key(&participant) {
        return Err(ApiError::conflict(
            "not-registered",
            "Not registered",
            format!("`{participant}` must register (PUT .../participants/{participant}) before it votes"),
        ));
    }
    match txn::record_vote(&client, &dir, &participant, body.vote).await {
        Ok(()) => {}
        Err(VoteError::AlreadyVoted(existing)) => {
            return Err(ApiError::conflict(
                "already-voted",
                "Already voted",
                format!("`{participant}` voted {existing:?}; a vote is final"),
            )
            .with("vote", existing));
        }
        Err(VoteError::ZooKeeper(err)) => return Err(err.into()),
    }
    let record = txn::read(&client, &dir).await?.ok_or_else(|| not_found(&id))?;
    Ok(Json(view(id, record)))
}

/// The transaction, checking that `participant` is one of it.
async fn participant_of(
    state: &AppState,
    caller: &Caller,
    id: &str,
    participant: &str,
) -> Result<(zookeeper_client::Client, String, Record), ApiError> {
    check_name(id)?;
    validate_name(participant).map_err(|e| ApiError::invalid(Place::Path, "participant", e))?;
    // A participant registered here with another principal's lease is not the caller's.
    if let Some(node) = state.txn_members.get(id, participant) {
        node.lease.check_owner(caller)?;
    }
    let client = state.zk().connected().await?.client;
    let dir = state.txn_members.dir(id);
    let record = txn::read(&client, &dir).await?.ok_or_else(|| not_found(id))?;
    if !record.spec.participants.iter().any(|p| p == participant) {
        return Err(ApiError::conflict(
            "not-a-participant",
            "Not a participant",
            format!("`{participant}` is not a participant of `{id}`"),
        ));
    }
    Ok((client, dir, record))
}

/// Lists the transactions.
#[utoipa::path(get, path = "/v1/txns", tag = "txns", responses(
    (status = 200, body = Vec<LockSummary>),
    (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
))]
pub async fn list_txns(State(state): State<AppState>, caller: Caller) -> Result<Json<Vec<LockSummary>>, ApiError> {
    super::contention::list_summaries(&state, &caller, state.txn_members.base()).await
}
