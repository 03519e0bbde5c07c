//! `/v1/txns`: two-phase commit: create a transaction, register participants, vote, and read
//! (or wait for) the decision, which is written once and never changes.

use crate::http::guards::{GuardHeader, Guarded};
use std::collections::BTreeSet;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::consistency::Consistency;
use super::error::{ApiError, Place, Problems, p};
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::{Followed, Resource};
use crate::AppState;
use crate::auth::Caller;
use crate::events::Feed;
use crate::kind::Kind;
use crate::recipes::txns::{self, Spec, TxnState, TxnTopic, Vote};
use crate::recipes::validate_name;
use crate::time::{HumanDuration, at_most};

/// The transaction kind's module.
pub const RESOURCE: Resource = Resource {
    kind: Kind::Txn,
    about: Some("Two-phase commit: participants register (lease-bound), vote, and read the decision, written once."),
    routes,
    topic: Some(Followed {
        feed: |state, id| Feed::of(source(state, id)),
        summary: "Follows a two-phase commit: its votes and decision, as Server-Sent Events.",
        param: "id",
    }),
    listed: Some("Lists the transactions."),
};

fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create))
        .routes(routes!(get_txn))
        .routes(routes!(register))
        .routes(routes!(vote))
}

/// Transaction `id` as its topic and `GET` read it.
fn source(state: &AppState, id: &str) -> TxnTopic {
    txns::txn_topic(state, id)
}

/// Longest a transaction may wait for its votes.
pub(crate) const MAX_DEADLINE: Duration = Duration::from_secs(24 * 3600);

/// Most participants a transaction may have.
const MAX_PARTICIPANTS: usize = 100;

/// Body of `POST /v1/txns`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTxn {
    /// The transaction's id (default: a new UUID).
    pub id: Option<String>,
    /// Who must vote (1 to 100 distinct names).
    #[schema(example = json!(["billing", "inventory"]), min_items = 1, max_items = 100)]
    pub participants: Vec<String>,
    /// What is being decided, shown to everyone.
    #[schema(example = json!({"order": 42}))]
    pub payload: Option<serde_json::Value>,
    /// How long the participants have to vote (at most 24h); then the transaction aborts
    /// (default 60s).
    pub deadline: Option<HumanDuration>,
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

/// Creates a transaction; this instance coordinates it (it alone watches the votes).
#[utoipa::path(post, path = "/v1/txns", tag = "txns", params(GuardHeader),
    request_body(content = CreateTxn, example = json!({"id": "order-42", "participants": ["billing", "inventory"], "payload": {"order": 42}, "deadline": "30s"})),
    responses(
        (status = 201, description = "Created", body = TxnState),
        Problems<(p::InvalidField, p::MalformedBody, p::ValueTooLarge, p::TxnExists, p::ZookeeperUnavailable)>,
    ))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    Guarded(guards): Guarded,
    ApiJson(body): ApiJson<CreateTxn>,
) -> Result<Response, ApiError> {
    let id = body.id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    validate_name(&id).map_err(|e| ApiError::invalid(Place::Body, "id", e))?;
    caller.require(crate::kind::Kind::Txn.auth(), &id, crate::auth::Access::Write)?;
    if body.participants.is_empty() || body.participants.len() > MAX_PARTICIPANTS {
        let detail = format!("must name 1 to {MAX_PARTICIPANTS} participants");
        return Err(ApiError::invalid(Place::Body, "participants", detail));
    }
    let mut seen = BTreeSet::new();
    for participant in &body.participants {
        validate_name(participant)
            .map_err(|e| ApiError::invalid(Place::Body, "participants", format!("`{participant}` {e}")))?;
        if !seen.insert(participant) {
            let detail = format!("`{participant}` is named twice");
            return Err(ApiError::invalid(Place::Body, "participants", detail));
        }
    }
    let deadline = body.deadline.map(|d| d.0).unwrap_or(Duration::from_secs(60));
    if deadline.is_zero() {
        return Err(ApiError::invalid(Place::Body, "deadline", "must be above zero"));
    }
    at_most(deadline, MAX_DEADLINE).map_err(|e| ApiError::invalid(Place::Body, "deadline", e))?;
    let now = crate::time::now_ms();
    let spec = Spec {
        participants: body.participants,
        payload: body.payload,
        deadline_ms: crate::time::ms_after_now(deadline),
        created_at_ms: now,
    };
    let stored = serde_json::to_vec(&spec).map_or(0, |s| s.len());
    state.check_stored_size("transaction (with its payload)", stored)?;
    let created = txns::create(&state, (&caller, &guards), &id, spec).await?;
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

/// Reads a transaction; with `wait`, blocks until it is decided (or the wait ends). Past the
/// deadline the reader writes the abort itself if nobody has, so a lost coordinator cannot
/// leave a transaction undecided.
#[utoipa::path(get, path = "/v1/txns/{id}", tag = "txns",
    params(("id" = String, Path, description = "Transaction id"), TxnQuery),
    responses(
        (status = 200, description = "The transaction", body = TxnState),
        Problems<(p::InvalidField, p::NotFound, p::ZookeeperUnavailable)>,
    ))]
pub async fn get_txn(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<TxnQuery>,
    consistency: Consistency,
) -> Result<Json<TxnState>, ApiError> {
    Ok(Json(
        txns::read(&state, &id, query.wait.map(|w| w.0), consistency).await?,
    ))
}

/// Registers a participant: its own ephemeral node, bound to its lease, so that its failure
/// before it votes aborts the transaction.
#[utoipa::path(operation_id = "register_txn", put, path = "/v1/txns/{id}/participants/{participant}", tag = "txns", extensions(("x-zkgate-served-by" = json!({"any": "body"}))),
    params(("id" = String, Path, description = "Transaction id"), ("participant" = String, Path, description = "A participant named at creation"), GuardHeader),
    request_body(content = Option<RegisterBody>, description = "Optional.", example = json!({"ttl": "30s"})),
    responses(
        (status = 201, description = "Registered", body = TxnState),
        Problems<(p::InvalidField, p::MalformedBody, p::NotFound, p::NotAParticipant, p::MemberTaken, p::LeaseEnded, p::ZookeeperUnavailable)>,
    ))]
pub async fn register(
    State(state): State<AppState>,
    caller: Caller,
    Guarded(guards): Guarded,
    ApiPath((id, participant)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<Option<RegisterBody>>,
) -> Result<Response, ApiError> {
    let body = body.unwrap_or_default();
    let ttl = body.ttl.map(|t| t.0);
    let registered = txns::register(&state, (&caller, &guards), (&id, &participant), body.lease, ttl).await?;
    Ok((StatusCode::CREATED, Json(registered)).into_response())
}

/// Votes `commit` or `abort`. A vote is final: the same vote again is accepted, another is
/// refused; so is a vote once the transaction is decided.
#[utoipa::path(post, path = "/v1/txns/{id}/participants/{participant}/vote", tag = "txns",
    params(("id" = String, Path, description = "Transaction id"), ("participant" = String, Path, description = "A registered participant"), GuardHeader),
    request_body(content = VoteBody, example = json!({"vote": "commit"})),
    responses(
        (status = 200, description = "Recorded", body = TxnState),
        Problems<(p::InvalidField, p::MalformedBody, p::NotFound, p::NotAParticipant, p::NotRegistered, p::AlreadyVoted, p::TxnDecided, p::ZookeeperUnavailable)>,
    ))]
pub async fn vote(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((id, participant)): ApiPath<(String, String)>,
    Guarded(guards): Guarded,
    ApiJson(body): ApiJson<VoteBody>,
) -> Result<Json<TxnState>, ApiError> {
    Ok(Json(
        txns::vote(&state, (&caller, &guards), (&id, &participant), body.vote).await?,
    ))
}
