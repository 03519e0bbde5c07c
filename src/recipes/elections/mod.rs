//! Leader election: the operations a client asks for (campaign, read a candidate, resign,
//! proclaim), on the protocol of [election] and the acquire every contended kind shares
//! ([crate::recipes::locks::contention]).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::auth::Caller;
use crate::problem::{ApiError, Problem};
use crate::recipes::Recipes;
use crate::recipes::consistency::Consistency;
use crate::recipes::guards::{Guard, Guards, retry_guarded};
use crate::recipes::leases::LeaseView;
use crate::recipes::locks::contention::{self, Found, HandleQuery, HandleView, Lease, Phase, held_since};
use crate::recipes::usage::Payer;
use crate::time::{HumanDuration, timestamp};
use crate::zk::Failure;

pub mod election;

pub use election::*;

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

/// A campaign (`POST .../campaign`): stays a candidate when the wait ends before it leads
/// unless `keep_queued` says not to, as the API's default differs from a lock's.
pub async fn campaign(
    recipes: &Recipes,
    caller: &Caller,
    name: &str,
    params: CampaignParams,
    body: Option<CampaignBody>,
) -> Result<Candidacy, ApiError> {
    let body = body.unwrap_or_default();
    if let Some(value) = &body.value {
        recipes.check_stored_size("candidate's value", json_len(value))?;
    }
    let request = contention::Request {
        caller,
        name,
        wait: params.wait.map(|w| w.0),
        keep_queued: params.keep_queued != Some(false),
        lease: body.lease,
        ttl: body.ttl.map(|t| t.0),
    };
    let (registry, value) = (&recipes.elections, body.value);
    let open = async |lease: Arc<Lease>| {
        contention::open_contender(recipes, registry, &lease, name, election::CANDIDATE, value.clone())
    };
    let outcome = contention::contend(recipes, registry, request, open).await?;
    let current = outcome.handle.state();
    Ok(Candidacy {
        election: name.to_string(),
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
    })
}

/// A candidate as its holder reads it (`GET .../candidates/{handle}`), after waiting (up to
/// `query.wait`) for news, read at `consistency`.
pub async fn candidate(
    recipes: &Recipes,
    caller: &Caller,
    at: (&str, &str),
    query: HandleQuery,
    consistency: Consistency,
) -> Result<CandidateView, ApiError> {
    let wait = query.wait.map(|w| w.0);
    let seen = contention::read_handle(recipes, &recipes.elections, caller, at, wait, consistency).await?;
    let seen = HandleView::of(recipes, seen).await;
    Ok(CandidateView {
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
    })
}

/// The size of `value` as JSON.
fn json_len(value: &serde_json::Value) -> usize {
    serde_json::to_vec(value).map_or(0, |v| v.len())
}

/// Resigns (or withdraws a candidacy) by handle, through any instance.
pub async fn resign(recipes: &Recipes, caller: &Caller, name: &str, handle: &str) -> Result<(), ApiError> {
    let session = recipes.synced().await?;
    let found = contention::find_handle(&recipes.elections, &session, caller, name, handle).await?;
    contention::release(recipes, &recipes.elections, found).await
}

/// The leader `handle` proclaims `value` (`PUT .../leader`): the acknowledgement rewritten, and
/// when its candidate began leading (known only to its keeper). 409 `not-leader` from anyone
/// else.
pub async fn proclaim(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    name: &str,
    Proclamation { handle, value }: Proclamation,
) -> Result<LeaderView, ApiError> {
    recipes.check_stored_size("proclaimed value", json_len(&value))?;
    let handle = handle.as_str();
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    let session = recipes.synced().await?;
    let (candidate, since) = match contention::find_handle(&recipes.elections, &session, caller, name, handle).await? {
        Found::Here(contender) => {
            let current = contender.state();
            let (Phase::Held { since }, Some(node)) = (&current.phase, &current.node) else {
                return Err(not_leader(name, handle, current.phase.name()));
            };
            (node.name.clone(), Some(timestamp(*since)))
        }
        Found::There(recorded) if recorded.holds() => (recorded.node.name.clone(), None),
        Found::There(_) => return Err(not_leader(name, handle, "waiting")),
    };
    let dir = recipes.elections.dir(name);
    let payer = Payer {
        quotas: &recipes.quotas,
        principal: caller.name(),
    };
    let size = serde_json::to_vec(&value).map_or(0, |v| v.len());
    let proclaimed = retry_guarded!(
        guards,
        recipes,
        Err(Failure::Unguarded),
        election::proclaim(&session, &dir, &candidate, value.clone(), (payer, guards)).await
    );
    let proclaimed = match proclaimed {
        Err(Failure::QuotaFull) => return Err(ApiError::from(payer.exceeded(&session, size).await)),
        proclaimed => proclaimed?,
    };
    match proclaimed {
        Some(ack) => Ok(LeaderView {
            node: ack.candidate,
            term: ack.term,
            value: ack.value,
            lease: Some(ack.lease),
            since,
            acknowledged: true,
            client: "zkgate",
        }),
        None => Err(not_leader(name, handle, "held")),
    }
}

fn not_leader(name: &str, handle: &str, state: &str) -> ApiError {
    ApiError::new(
        Problem::NotLeader,
        format!("handle `{handle}` is not the leader of `{name}`: only the leader may proclaim"),
    )
    .with("state", state)
}
