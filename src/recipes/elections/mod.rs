//! Leader election: the operations a client asks for (campaign, read a candidate, resign,
//! proclaim), on the protocol of [election] and the acquire every contended kind shares
//! ([crate::recipes::locks::contention]).

use std::sync::Arc;

use crate::auth::Caller;
use crate::problem::{ApiError, Problem};
use crate::recipes::Recipes;
use crate::recipes::guards::{Guard, Guards, retry_guarded};
use crate::recipes::locks::contention::{self, Contention, Found, Granted, Lease, Phase};
use crate::recipes::usage::Payer;
use crate::time::timestamp;
use crate::zk::Failure;

pub mod election;

pub use election::*;

/// A campaign (`POST .../campaign`): stays a candidate when the wait ends before it leads
/// unless `request.keep_queued` says not to, as the API's default differs from a lock's.
pub async fn campaign(
    recipes: &Recipes,
    request: contention::Request<'_>,
    value: Option<serde_json::Value>,
) -> Result<Granted<Contention>, ApiError> {
    let (registry, name) = (&recipes.elections, request.name);
    let open = async |lease: Arc<Lease>| {
        contention::open_contender(recipes, registry, &lease, name, election::CANDIDATE, value.clone())
    };
    contention::contend(recipes, registry, request, open).await
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
    handle: &str,
    value: serde_json::Value,
) -> Result<(Acknowledgement, Option<String>), ApiError> {
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
        Some(ack) => Ok((ack, since)),
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
