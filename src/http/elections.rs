//! `/v1/elections`: campaign (long poll), resign, read the leader and the candidates, and
//! proclaim a new value as the leader.

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
use super::{Followed, Resource, state_handler};
use crate::AppState;
use crate::auth::Caller;
use crate::kind::Kind;
use crate::recipes::elections::{
    self, CampaignBody, CampaignParams, Candidacy, CandidateView, ElectionState, LeaderView, Proclamation,
};
use crate::recipes::locks::contention::HandleQuery;

/// The election kind's module.
pub const RESOURCE: Resource = Resource {
    kind: Kind::Election,
    about: Some(
        "Leader election (the guide's recipe on Curator's LeaderLatch names): campaign, resign, leader with term, proclaim.",
    ),
    routes,
    topic: Some(Followed {
        summary: "Follows an election: its leader, term and candidates, as Server-Sent Events.",
        param: "name",
    }),
    listed: Some(
        "Lists the elections that exist in ZooKeeper, with their number of candidates (plus the acknowledgement node when someone leads).",
    ),
};

fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(check_election_fencing))
        .routes(routes!(election_state))
        .routes(routes!(campaign))
        .routes(routes!(proclaim))
        .routes(routes!(get_candidate, resign))
}

/// Campaigns for leadership, waiting up to `wait` to lead (a long poll).
///
/// Candidates lead in the order they joined; each watches only the candidate right before it.
/// When a candidate becomes leader zkgate writes the election's acknowledgement node, then
/// answers. The same lease campaigning again gets the same handle and resumes waiting.
#[utoipa::path(post, path = "/v1/elections/{name}/campaign", tag = "elections", extensions(("x-zkgate-served-by" = json!({"any": "body"}))),
    params(("name" = String, Path, description = "Election name: 1 to 128 bytes, no `/`, no control characters, not `.` or `..`"), CampaignParams),
    request_body(content = Option<CampaignBody>, description = "Optional.", example = json!({"value": {"address": "10.0.0.7:8080"}})),
    responses(
        (status = 200, description = "Leading", body = Candidacy),
        (status = 202, description = "Not leading yet; still a candidate", body = Candidacy),
        Problems<(p::InvalidField, p::MalformedBody, p::ValueTooLarge, p::NotFound, p::LockNotAcquired, p::LeaseEnded, p::LockLost, p::TooMany, p::ZookeeperUnavailable)>,
    ))]
pub async fn campaign(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<CampaignParams>,
    ApiJson(body): ApiJson<Option<CampaignBody>>,
) -> Result<Response, ApiError> {
    let candidacy = elections::campaign(&state, &caller, &name, params, body).await?;
    Ok((super::locks::status(candidacy.leader), Json(candidacy)).into_response())
}

state_handler!(
    /// Reads the leader (with term, value and since when) and the candidates in order.
    election_state,
    "/v1/elections/{name}",
    "elections",
    "Election name",
    ElectionState,
    election_topic
);

/// Changes the value the leader proclaims. Only the leader may: anyone else gets 409.
#[utoipa::path(put, path = "/v1/elections/{name}/leader", tag = "elections",
    params(("name" = String, Path, description = "Election name"), GuardHeader),
    request_body(content = Proclamation, example = json!({"handle": "0b9d4c3e2f1a4b5c8d7e6f5a4b3c2d1e", "value": {"address": "10.0.0.8:8080"}})),
    responses(
        (status = 200, description = "Proclaimed", body = LeaderView),
        Problems<(p::InvalidField, p::MalformedBody, p::ValueTooLarge, p::NotFound, p::LockLost, p::NotLeader, p::QuotaExceeded, p::ZookeeperUnavailable)>,
    ))]
pub async fn proclaim(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    Guarded(guards): Guarded,
    ApiJson(body): ApiJson<Proclamation>,
) -> Result<Json<LeaderView>, ApiError> {
    Ok(Json(
        elections::proclaim(&state, (&caller, &guards), &name, body).await?,
    ))
}

/// Reads a candidate: waiting (with position), leading (`held`, with term) or lost.
///
/// With `?wait=` it is a long poll that answers as soon as the candidate becomes leader or is
/// lost (or resigns), so a leader learns at once that it no longer leads.
#[utoipa::path(get, path = "/v1/elections/{name}/candidates/{handle}", tag = "elections",
    params(("name" = String, Path, description = "Election name"), ("handle" = String, Path, description = "Handle from the campaign"), HandleQuery),
    responses(
        (status = 200, description = "The candidate", body = CandidateView),
        Problems<(p::InvalidField, p::NotFound, p::LockLost)>,
    ))]
pub async fn get_candidate(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, handle)): ApiPath<(String, String)>,
    ApiQuery(query): ApiQuery<HandleQuery>,
    consistency: Consistency,
) -> Result<Json<CandidateView>, ApiError> {
    Ok(Json(
        elections::candidate(&state, &caller, (&name, &handle), query, consistency).await?,
    ))
}

/// Resigns (or withdraws a candidacy): a leader removes its acknowledgement, then its
/// candidate node, which makes the next candidate leader.
#[utoipa::path(delete, path = "/v1/elections/{name}/candidates/{handle}", tag = "elections",
    params(("name" = String, Path, description = "Election name"), ("handle" = String, Path, description = "Handle from the campaign")),
    responses(
        (status = 204, description = "Resigned"),
        Problems<(p::InvalidField, p::NotFound, p::LockLost)>,
    ))]
pub async fn resign(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, handle)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    elections::resign(&state, &caller, &name, &handle).await?;
    Ok(StatusCode::NO_CONTENT)
}

super::locks::fencing_handler!(
    /// Checks a term (the leader's fencing token) against the election's leader.
    ///
    /// 200 if the term is the current leader's; 409 `stale-fencing-token` with the leader's term
    /// (`current_token`) if another has led since; 404 `not-held` if nobody campaigns.
    /// Linearizable by default.
    check_election_fencing,
    "/v1/elections/{name}/fencing/{token}",
    "elections",
    "election",
    |state| state.elections,
    |_: &[String]| 1
);
