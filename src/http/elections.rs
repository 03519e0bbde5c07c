//! `/v1/elections`: campaign (long poll), resign, read the leader and the candidates, and
//! proclaim a new value as the leader.

use std::time::{Duration, UNIX_EPOCH};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::contention::{self, ContenderView, HandleQuery, HandleView, LockSummary, Request, check_name, find_handle};
use super::error::{ApiError, Problem};
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::leases::LeaseView;
use super::timestamp;
use crate::AppState;
use crate::auth::Caller;
use crate::duration::HumanDuration;
use crate::recipes::contender::{Contender, Phase, Role, read_contenders};
use crate::recipes::election::{self, ACK_NODE, Acknowledgement};
use crate::zk::retry_on_loss;

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
    pub since: Option<String>,
    pub lease: LeaseView,
}

/// The current leader.
#[derive(Serialize, utoipa::ToSchema)]
pub struct LeaderView {
    /// The leader's candidate node.
    #[schema(example = "_c_3f1e2d4c-5b6a-4798-8a9b-0c1d2e3f4a5b-latch-0000000007")]
    pub node: String,
    /// The term: the leader's candidate czxid, strictly increasing with every new leader.
    #[schema(example = 4294967321_i64)]
    pub term: i64,
    /// The value it proclaims.
    #[schema(example = json!({"address": "10.0.0.8:8080"}))]
    pub value: Option<serde_json::Value>,
    /// The leader's zkgate lease, for zkgate's candidates.
    #[schema(example = "3c9e1f07-6f1c2a9e0b7d4e3f8a5b6c7d8e9f0a1b")]
    pub lease: Option<String>,
    /// When it took over (its acknowledgement's creation), if acknowledged.
    #[schema(example = "2026-11-22T10:00:00.000Z")]
    pub since: Option<String>,
    /// Whether the leader has written the acknowledgement node: it knows it leads. (A Curator
    /// `LeaderLatch` leader never does.)
    pub acknowledged: bool,
    /// `zkgate`, `curator` or `other`.
    pub client: &'static str,
}

/// An election: its leader (none when there is no candidate) and its candidates in order.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ElectionState {
    #[schema(example = "scheduler")]
    pub name: String,
    /// `null` when nobody campaigns: "no leader" is a state of its own.
    pub leader: Option<LeaderView>,
    /// Every candidate in order, the leader first.
    pub candidates: Vec<ContenderView>,
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
#[utoipa::path(post, path = "/v1/elections/{name}/campaign", tag = "elections",
    params(("name" = String, Path, description = "Election name: 1 to 128 bytes, no `/`, no control characters, not `.` or `..`"), CampaignParams),
    request_body(content = Option<CampaignBody>, description = "Optional.", example = json!({"value": {"address": "10.0.0.7:8080"}})),
    responses(
        (status = 200, description = "Leading", body = Candidacy),
        (status = 202, description = "Not leading yet; still a candidate", body = Candidacy),
        (status = 400, description = "Bad name, parameter or body", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such lease", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not leading within the wait and `keep_queued=false`: withdrawn", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The lease ended, or the candidate was lost", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn campaign(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<CampaignParams>,
    ApiJson(body): ApiJson<Option<CampaignBody>>,
) -> Result<Response, ApiError> {
    let body = body.unwrap_or_default();
    let request = Request {
        caller: &caller,
        name: &name,
        role: Role::Candidate,
        wait: params.wait.map(|w| w.0),
        keep_queued: params.keep_queued != Some(false),
        lease: body.lease,
        ttl: body.ttl.map(|t| t.0),
        value: body.value,
    };
    let outcome = contention::contend(&state, &state.elections, request).await?;
    let status = if outcome.granted {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    let current = outcome.contender.state();
    let (position, since) = match current.phase {
        Phase::Held { since } => (0, Some(timestamp(since))),
        Phase::Waiting { position } => (position, None),
        _ => (0, None),
    };
    let candidacy = Candidacy {
        election: name,
        leader: outcome.granted,
        handle: outcome.contender.handle.clone(),
        term: current.fencing_token(),
        position,
        node: current.node.map(|n| n.name),
        since,
        lease: LeaseView::of(&outcome.lease),
    };
    Ok((status, Json(candidacy)).into_response())
}

/// Reads the leader (with term, value and since when) and the candidates in order.
#[utoipa::path(get, path = "/v1/elections/{name}", tag = "elections",
    params(("name" = String, Path, description = "Election name")),
    responses(
        (status = 200, description = "Leader (`null`: no leader) and candidates", body = ElectionState),
        (status = 400, description = "Bad name", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn election_state(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<ElectionState>, ApiError> {
    check_name(&name)?;
    let client = state.zk().current()?.client;
    let dir = state.elections.dir(&name);
    let records = read_contenders(&client, &dir).await?.unwrap_or_default();
    let ack_path = format!("{dir}/{ACK_NODE}");
    let ack = match retry_on_loss(|| client.get_data(&ack_path)).await {
        Ok((data, stat)) => Acknowledgement::parse(&data).map(|a| (a, stat.ctime)),
        Err(zookeeper_client::Error::NoNode) => None,
        Err(err) => return Err(err.into()),
    };
    let local = state.elections.local_contenders(&name);
    let candidates: Vec<ContenderView> = records
        .into_iter()
        .map(|record| {
            let mine = local.get(&record.name).cloned();
            contention::contender_view(record, None, mine.as_deref())
        })
        .collect();
    let leader = candidates.first().map(|first| {
        let acknowledged = ack.as_ref().filter(|(a, _)| a.candidate == first.node);
        LeaderView {
            node: first.node.clone(),
            term: first.fencing_token,
            value: match acknowledged {
                Some((a, _)) => a.value.clone(),
                None => local.get(&first.node).and_then(|c| c.value.clone()),
            },
            lease: first.lease.clone(),
            since: acknowledged.map(|(_, ctime)| timestamp(UNIX_EPOCH + Duration::from_millis((*ctime).max(0) as u64))),
            acknowledged: acknowledged.is_some(),
            client: first.client,
        }
    });
    Ok(Json(ElectionState {
        name,
        leader,
        candidates,
    }))
}

/// Lists the elections that exist in ZooKeeper, with their number of candidates (plus the
/// acknowledgement node when someone leads).
#[utoipa::path(get, path = "/v1/elections", tag = "elections", responses(
    (status = 200, body = Vec<LockSummary>),
    (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
))]
pub async fn list_elections(State(state): State<AppState>, caller: Caller) -> Result<Json<Vec<LockSummary>>, ApiError> {
    super::contention::list_summaries(&state, &caller, state.elections.base()).await
}

/// Changes the value the leader proclaims. Only the leader may: anyone else gets 409.
#[utoipa::path(put, path = "/v1/elections/{name}/leader", tag = "elections",
    params(("name" = String, Path, description = "Election name")),
    request_body(content = Proclamation, example = json!({"handle": "0b9d4c3e2f1a4b5c8d7e6f5a4b3c2d1e", "value": {"address": "10.0.0.8:8080"}})),
    responses(
        (status = 200, description = "Proclaimed", body = LeaderView),
        (status = 400, description = "Bad name or body", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such handle", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The handle's candidate is not the leader", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn proclaim(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<Proclamation>,
) -> Result<Json<LeaderView>, ApiError> {
    let contender = find_handle(&state.elections, &caller, &name, &body.handle)?;
    let current = contender.state();
    let (Phase::Held { .. }, Some(node)) = (&current.phase, &current.node) else {
        return Err(not_leader(&name, &contender));
    };
    let client = state.zk().current()?.client;
    let dir = state.elections.dir(&name);
    let ack = election::proclaim(&client, &dir, &node.name, body.value).await?;
    let Some(ack) = ack else {
        return Err(not_leader(&name, &contender));
    };
    let since = match current.phase {
        Phase::Held { since } => Some(timestamp(since)),
        _ => None,
    };
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

fn not_leader(name: &str, contender: &Contender) -> ApiError {
    ApiError::conflict(
        "not-leader",
        "Not the leader",
        format!(
            "handle `{}` is not the leader of `{name}`: only the leader may proclaim",
            contender.handle
        ),
    )
    .with("state", contender.state().phase.name())
}

/// Reads a candidate: waiting (with position), leading (`held`, with term) or lost.
///
/// With `?wait=` it is a long poll that answers as soon as the candidate becomes leader or is
/// lost (or resigns), so a leader learns at once that it no longer leads.
#[utoipa::path(get, path = "/v1/elections/{name}/candidates/{handle}", tag = "elections",
    params(("name" = String, Path, description = "Election name"), ("handle" = String, Path, description = "Handle from the campaign"), HandleQuery),
    responses(
        (status = 200, body = HandleView),
        (status = 400, description = "Bad name", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such handle", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_candidate(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, handle)): ApiPath<(String, String)>,
    ApiQuery(query): ApiQuery<HandleQuery>,
) -> Result<Json<HandleView>, ApiError> {
    let contender = find_handle(&state.elections, &caller, &name, &handle)?;
    contention::wait_for_news(&state, &contender, query.wait).await;
    Ok(Json(
        contention::handle_view(&state, &state.elections, &contender).await,
    ))
}

/// Resigns (or withdraws a candidacy): a leader removes its acknowledgement, then its
/// candidate node, which makes the next candidate leader.
#[utoipa::path(delete, path = "/v1/elections/{name}/candidates/{handle}", tag = "elections",
    params(("name" = String, Path, description = "Election name"), ("handle" = String, Path, description = "Handle from the campaign")),
    responses(
        (status = 204, description = "Resigned"),
        (status = 400, description = "Bad name", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such handle", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The candidacy had been lost before", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn resign(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, handle)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    contention::release(
        &state.elections,
        &find_handle(&state.elections, &caller, &name, &handle)?,
    )
    .await
}
