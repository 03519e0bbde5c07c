//! `/v1/txns`: two-phase commit: create a transaction, register participants, vote, and read
//! (or wait for) the decision, which is written once and never changes.

use crate::http::json::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::consistency::Consistency;
use super::error::{ApiError, Problems, p};
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::guards::{GuardHeader, Guarded};
use super::{Followed, Resource};
use crate::AppState;
use crate::auth::Caller;
use crate::kind::Kind;
use crate::recipes::txns::{self, CreateTxn, RegisterBody, TxnQuery, TxnState, VoteBody};

/// The transaction kind's module.
pub const RESOURCE: Resource = Resource {
    kind: Kind::Txn,
    about: Some("Two-phase commit: participants register (lease-bound), vote, and read the decision, written once."),
    routes,
    topic: Some(Followed {
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
    let created = txns::create(&state, (&caller, &guards), body).await?;
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
    let registered = txns::register(
        &state,
        (&caller, &guards),
        (&id, &participant),
        body.unwrap_or_default(),
    )
    .await?;
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
