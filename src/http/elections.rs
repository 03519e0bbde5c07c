//! `/v1/elections`: campaign (long poll), resign, read the leader and the candidates, and
//! proclaim a new value as the leader.

use axum::Json;

use crate::http::guards::{GuardHeader, Guarded};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::consistency::Consistency;
use super::error::{ApiError, Problems, p};
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::locks::{self as contention, HandleQuery, held_since};
use super::{Followed, Resource, state_handler};
use crate::AppState;
use crate::auth::Caller;
use crate::events::Feed;
use crate::kind::Kind;
use crate::recipes::elections::{self, ElectionState, LeaderView, Leadership};
use crate::recipes::leases::LeaseView;
use crate::recipes::locks::contention::{self as recipe, Phase};
use crate::time::HumanDuration;

/// The election kind's module.
pub const RESOURCE: Resource = Resource {
    kind: Kind::Election,
    about: Some(
        "Leader election (the guide's recipe on Curator's LeaderLatch names): campaign, resign, leader with term, proclaim.",
    ),
    routes,
    topic: Some(Followed {
        feed: |state, name| Feed::of(source(state, name)),
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

/// Election `name` as its topic and `GET` read it.
pub fn source(state: &AppState, name: &str) -> Leadership {
    Leadership {
        name: name.to_string(),
        dir: state.elections.dir(name),
        local: state.elections.clone(),
    }
}

/// Query of a campaign.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CampaignParams {
    /// How long to wait to become leader (`0` answers at once). Capped by the server's maximum
    /// wait, which is also the default.
    #[param(value_type = Option<String>, example = "30s")]
    pub wait: Option<HumanDuration>,
    /// When the wait ends before leading: `true` (default) stays a candidate and answers 202
    /// with its position; `false` withdraws and answers 409.
    pub keep_queued: Option<bool>,
}

/// Body of a campaign (optional).
#[derive(Deserialize, utoipa::ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct CampaignBody {
    /// The lease to campaign with. Without it a new lease is created and returned.
    pub lease: Option<String>,
    /// TTL of the lease created when `lease` is not given.
    pub ttl: Option<HumanDuration>,
    /// The value this candidate proclaims once it leads (any JSON, e.g. its address).
    #[schema(example = json!({"address": "10.0.0.7:8080"}))]
    pub value: Option<serde_json::Value>,
}

/// Answer of a campaign: leader (200) or still a candidate (202).
#[derive(Serialize, utoipa::ToSchema)]
pub struct Candidacy {
    #[schema(example = "scheduler")]
    pub election: String,
    /// `true` when this candidate leads.
    pub leader: bool,
    /// Resign with `DELETE /v1/elections/{name}/candidates/{handle}`.
    pub handle: String,
    /// While leading: the term, which strictly increases with every new leader. Use it as a
    /// fencing token.
    pub term: Option<i64>,
    /// Candidates ahead (0 when leading).
    pub position: usize,
    pub node: Option<String>,
    /// When it started leading.
    #[schema(format = DateTime)]
    pub since: Option<String>,
    pub lease: LeaseView,
}

/// A candidate: waiting (with its position), leading (`held`, with its term) or lost.
#[derive(Serialize, utoipa::ToSchema)]
pub struct CandidateView {
    #[schema(example = "scheduler")]
    pub election: String,
    pub handle: String,
    pub lease: String,
    /// `pending`, `waiting`, `held` (leading), `lost`, `released` or `failed`.
    #[schema(example = "held")]
    pub state: &'static str,
    /// `true` while it leads.
    pub leader: bool,
    /// Candidates ahead while waiting.
    pub position: Option<usize>,
    /// Its term while it leads (and after a loss, to tell which term was lost).
    pub term: Option<i64>,
    pub node: Option<String>,
    /// When it started leading.
    #[schema(format = DateTime)]
    pub since: Option<String>,
    /// Why it was lost or failed.
    pub reason: Option<String>,
}

/// Body of a proclamation.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Proclamation {
    /// The leader's handle.
    pub handle: String,
    /// The new value.
    #[schema(example = json!({"address": "10.0.0.8:8080"}))]
    pub value: serde_json::Value,
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
    let body = body.unwrap_or_default();
    if let Some(value) = &body.value {
        state.check_stored_size("candidate's value", json_len(value))?;
    }
    let request = recipe::Request {
        caller: &caller,
        name: &name,
        wait: params.wait.map(|w| w.0),
        keep_queued: params.keep_queued != Some(false),
        lease: body.lease,
        ttl: body.ttl.map(|t| t.0),
    };
    let outcome = elections::campaign(&state, request, body.value).await?;
    let current = outcome.handle.state();
    let candidacy = Candidacy {
        election: name,
        leader: outcome.granted,
        handle: outcome.handle.id.clone(),
        term: current.fencing_token(),
        position: match current.phase {
            Phase::Waiting { position } => position,
            _ => 0,
        },
        node: current.node.map(|n| n.name),
        since: held_since(&current.phase),
        lease: LeaseView::of(&outcome.lease),
    };
    Ok((contention::status(&outcome), Json(candidacy)).into_response())
}

state_handler!(
    /// Reads the leader (with term, value and since when) and the candidates in order.
    election_state,
    "/v1/elections/{name}",
    "elections",
    "Election name",
    ElectionState
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
    state.check_stored_size("proclaimed value", json_len(&body.value))?;
    let (ack, since) = elections::proclaim(&state, (&caller, &guards), &name, &body.handle, body.value).await?;
    Ok(Json(LeaderView {
        node: ack.candidate,
        term: ack.term,
        value: ack.value,
        lease: Some(ack.lease),
        since,
        acknowledged: true,
        client: "zkgate",
    }))
}

/// The size of `value` as JSON.
fn json_len(value: &serde_json::Value) -> usize {
    serde_json::to_vec(value).map_or(0, |v| v.len())
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
    let seen = contention::get_handle(&state, &state.elections, &caller, (&name, &handle), query, consistency).await?;
    Ok(Json(CandidateView {
        election: seen.lock,
        handle: seen.handle,
        lease: seen.lease,
        state: seen.state,
        leader: seen.state == "held",
        position: seen.position,
        term: seen.fencing_token,
        node: seen.node,
        since: seen.held_since,
        reason: seen.reason,
    }))
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

contention::fencing_handler!(
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
