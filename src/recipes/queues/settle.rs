//! A claim's end, as operations: acknowledged (one or a batch) or given back, through any
//! instance, each guarded by what its caller names (`ZKGATE-Guard`); and its extension, which
//! puts the end off.

use super::service::Claim;
use crate::auth::Caller;
use crate::problem::{ApiError, Problem};
use crate::recipes::Recipes;
use crate::recipes::guards::{Guard, Guards, retry_guarded};
use crate::zk::Failure;

/// `410 claim-lost`: the claim is not held.
fn claim_lost(claim: &str) -> ApiError {
    ApiError::new(
        Problem::ClaimLost,
        format!("claim `{claim}` is not held (given back, or its ack deadline passed: the item is delivered again)"),
    )
}

/// The claim `claim` of `name` for `caller` (made through any instance, see
/// [Queues::find](super::service::Queues::find)), or how an ack (`acking`) or a nack of it that
/// is not held is answered: the same as the first when it is a repeat to this instance (a
/// retry after a lost reply: `Ok(None)`), `410 claim-lost` saying why otherwise.
async fn claim_for(
    recipes: &Recipes,
    caller: &Caller,
    name: &str,
    claim: &str,
    acking: bool,
) -> Result<Option<Claim>, ApiError> {
    let settled = recipes.queues.settled(name, claim);
    let held = match settled {
        Some(_) => None,
        None => recipes.queues.find(name, claim).await?,
    };
    if let Some(held) = held {
        caller.require_owner(held.principal.as_deref(), &format!("claim `{claim}`"))?;
        return Ok(Some(held));
    }
    match settled {
        Some(settled) if settled.acked == acking => {
            caller.require_owner(settled.principal.as_deref(), &format!("claim `{claim}`"))?;
            Ok(None)
        }
        Some(settled) => Err(ApiError::new(
            Problem::ClaimLost,
            if settled.acked {
                format!("claim `{claim}` was acknowledged: its item is gone for good")
            } else {
                format!("claim `{claim}` was given back: its item is delivered again")
            },
        )),
        None => Err(claim_lost(claim)),
    }
}

/// Forgets a held claim once its ack is decided, remembering how (for a repeat) and counting
/// it if acknowledged; whether it was.
fn settle_ack(recipes: &Recipes, queue: &str, held: &Claim, acked: bool) -> bool {
    recipes.queues.forget(&held.id);
    if acked {
        recipes.queues.settle(&held.id, held, true);
        let m = crate::metrics::get();
        m.queue_acks.with_label_values(&[m.queue(queue)]).inc();
    }
    acked
}

/// What became of each claim of a batch: acknowledged (before, too), or lost (and why).
#[derive(Default)]
pub struct Acked {
    pub acked: Vec<String>,
    pub lost: Vec<(String, String)>,
}

/// Acknowledges `claims` of queue `name` for `caller`, if its `guards` hold: one ZooKeeper
/// multi-op when they are all still held as claimed and were made through this instance. Every
/// claim's owner is checked before anything is acknowledged.
pub async fn ack(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    name: &str,
    claims: Vec<String>,
) -> Result<Acked, ApiError> {
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    let mut answer = Acked::default();
    let mut held = Vec::new();
    for claim in claims {
        match claim_for(recipes, caller, name, &claim, true).await {
            Ok(Some(claim)) => held.push(claim),
            Ok(None) => answer.acked.push(claim),
            Err(err) if err.problem() == Problem::ClaimLost => answer.lost.push((claim, err.detail().to_string())),
            Err(err) => return Err(err),
        }
    }
    let acked = retry_guarded!(
        guards,
        recipes,
        Err(Failure::Unguarded),
        recipes.queues.ack(name, &held, &guards.checked()).await
    );
    for (claim, acked) in held.iter().zip(acked?) {
        if settle_ack(recipes, name, claim, acked) {
            answer.acked.push(claim.id.clone());
        } else {
            answer
                .lost
                .push((claim.id.clone(), claim_lost(&claim.id).detail().to_string()));
        }
    }
    Ok(answer)
}

/// Gives the claim `claim` of queue `name` back for `caller`, if its `guards` hold: the item is
/// delivered again. Giving it back again through this instance answers the same.
pub async fn nack(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    name: &str,
    claim: &str,
) -> Result<(), ApiError> {
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    let Some(held) = claim_for(recipes, caller, name, claim, false).await? else {
        return Ok(());
    };
    let released = retry_guarded!(
        guards,
        recipes,
        Err(Failure::Unguarded),
        recipes.queues.release(&held, &guards.checked()).await
    );
    recipes.queues.forget(claim);
    if !released? {
        return Err(claim_lost(claim));
    }
    recipes.queues.settle(claim, &held, false);
    let m = crate::metrics::get();
    m.queue_nacks.with_label_values(&[m.queue(name)]).inc();
    Ok(())
}

/// Extends the claim `claim` of queue `name` for `caller`, if its `guards` hold: its item stays
/// claimed until `ack_deadline` from now (SQS's `ChangeMessageVisibility`), through any
/// instance; the new deadline (ms since the epoch). A worker whose item takes longer than the
/// deadline it took it with extends it while it works, instead of taking it with a long one
/// that would keep the item from everyone for as long if the worker died.
pub async fn extend(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    name: &str,
    claim: &str,
    ack_deadline: std::time::Duration,
) -> Result<i64, ApiError> {
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    let held = match recipes.queues.settled(name, claim) {
        Some(_) => None,
        None => recipes.queues.find(name, claim).await?,
    };
    let Some(held) = held else {
        return Err(claim_lost(claim));
    };
    caller.require_owner(held.principal.as_deref(), &format!("claim `{claim}`"))?;
    let extended = retry_guarded!(
        guards,
        recipes,
        Err(Failure::Unguarded),
        recipes.queues.extend(&held, ack_deadline, &guards.checked()).await
    );
    extended?.ok_or_else(|| claim_lost(claim))
}
