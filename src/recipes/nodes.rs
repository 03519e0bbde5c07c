//! A lease-bound node's operations, for every kind whose holding is one node (a group's member,
//! a service's instance, a lock set's record): bound with its data charged to the caller, and
//! unbound by whichever instance a request reaches.

use std::sync::Arc;

use crate::auth::Caller;
use crate::problem::ApiError;
use crate::recipes::Recipes;
use crate::recipes::engine::lease::Lease;
use crate::recipes::engine::node::{self, HoldError};
use crate::recipes::guards::{Guard, Guards, retry_guarded};
use crate::recipes::usage::{ChargeError, ChargeNode};
use crate::zk::Failure;

pub use crate::recipes::engine::handle::Phase;
pub use crate::recipes::engine::node::{NodeHolding, NodeHoldings};
pub use crate::recipes::locks::contention::{RELEASE_LIMIT, release_not_done};

/// Joins `id` to resource `name` of `nodes` (a group's member, a service's instance) with
/// `lease` (or a new one with `ttl`), holding what `data` makes for that lease, charged to the
/// caller; `taken` is the answer when another lease has the id. The node, and whether this
/// made it: the same id joined again with its lease is answered as it is.
pub async fn join(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    nodes: &NodeHoldings,
    (name, id): (&str, &str),
    (lease, ttl): (Option<String>, Option<std::time::Duration>),
    data: impl FnOnce(&super::engine::lease::Lease) -> Result<Vec<u8>, ApiError>,
    taken: impl Fn() -> ApiError,
) -> Result<(Arc<NodeHolding>, bool), ApiError> {
    // The guards first: a precondition, as `If-Match` is, before anything the id answers.
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    if let Some(existing) = nodes.get(name, id) {
        return match lease.as_deref() == Some(existing.lease.id.as_str()) {
            true => Ok((existing, false)),
            false => Err(taken()),
        };
    }
    let (lease, _) = recipes.leases.for_request(caller, lease, ttl).await?;
    let data = data(&lease)?;
    let node = bind_charged(recipes, (caller, guards), nodes, &lease, (name, id), data, taken).await?;
    Ok((node, true))
}

/// Binds `id` of resource `name` (a group's member, a service's instance) to `lease`, holding
/// `data` charged to the caller on the node's session; `taken` is the answer when the id is.
pub async fn bind_charged(
    recipes: &Recipes,
    (caller, guards): (&Caller, &Guards),
    nodes: &NodeHoldings,
    lease: &Arc<crate::recipes::engine::lease::Lease>,
    (name, id): (&str, &str),
    data: Vec<u8>,
    taken: impl FnOnce() -> ApiError,
) -> Result<Arc<NodeHolding>, ApiError> {
    let path = nodes.node(name, id);
    let session = recipes.zk().connected().await?;
    let bytes = data.len();
    let charge = match recipes.quotas.charge(&session, caller.name(), bytes).await {
        Ok(charge) => recipes.quotas.node(&charge, bytes),
        Err(ChargeError::Exceeded(exceeded)) => return Err(ApiError::from(exceeded)),
        Err(ChargeError::ZooKeeper(err)) => return Err(err.into()),
    };
    let held = hold(recipes, guards, nodes, lease, (name, id), path, (data, Some(charge))).await?;
    match held {
        Err(HoldError::ZooKeeper(Failure::QuotaFull)) => Err(ApiError::from(
            recipes.quotas.exceeded(&session, caller.name(), bytes).await,
        )),
        hold => recipes.leases.held(lease, hold)?.ok_or_else(taken),
    }
}

/// Makes the node holding `id` of resource `name` at `path` for `lease`, with `data` (and its
/// charge), if the writer's `guards` (resolved first by the operation) hold when ZooKeeper
/// makes it: `Err(HoldError)` as the engine answers it (`Ok(Err(..))`), or 409 `guard-lost`
/// (`Err`).
pub async fn hold(
    recipes: &Recipes,
    guards: &Guards,
    nodes: &NodeHoldings,
    lease: &Arc<Lease>,
    (name, id): (&str, &str),
    path: String,
    (data, charge): (Vec<u8>, Option<ChargeNode>),
) -> Result<Result<Arc<NodeHolding>, HoldError>, ApiError> {
    Ok(retry_guarded!(
        guards,
        recipes,
        Err(HoldError::ZooKeeper(Failure::Unguarded)),
        nodes
            .hold(lease, (name, id), path.clone(), (data.clone(), charge.clone()), guards)
            .await
    ))
}

/// Releases the node holding `id` of resource `name` at `path` (a member, a service instance,
/// a lock set's record), if `caller` may: through its task if its lease is kept here, else
/// through ZooKeeper alone (its node records its lease, see [node]). `gone` is the answer when
/// there is no such node of zkgate's.
///
/// A guarded release (`guards`) is made through ZooKeeper alone, its multi-op carrying the
/// guards' checks; the task that drives the node here sees it go with its holding record, and
/// finishes as released.
pub async fn unbind(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    nodes: &NodeHoldings,
    (name, id): (&str, &str),
    path: &str,
    gone: impl FnOnce() -> ApiError,
) -> Result<(), ApiError> {
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    if let Some(node) = nodes.serving(name, id).filter(|_| guards.is_empty()) {
        node.lease.check_owner(caller)?;
        // Bounded, as a lock's release is: during an outage the release is done once
        // ZooKeeper is back, and the request says so rather than hang for the outage.
        if !nodes.release_within(&node, RELEASE_LIMIT).await {
            return Err(release_not_done(&format!("`{id}` of `{name}`")));
        }
        if node.state().phase != Phase::Moved {
            return Ok(());
        }
        // Its lease moved to another instance meanwhile: the task stopped without deleting;
        // released through ZooKeeper below.
    }
    let session = recipes.synced().await?;
    let (root, kind) = (&recipes.root, nodes.kind());
    let owner = node::check_owner(&session, root, kind, path, caller, &format!("`{id}` of `{name}`")).await?;
    if owner.is_none() {
        return Err(gone());
    }
    let released = retry_guarded!(
        guards,
        recipes,
        Err(Failure::Unguarded),
        node::release_recorded(&session, root, kind, (name, id), path, &guards.checked()).await
    );
    match released? {
        true => Ok(()),
        false => Err(gone()),
    }
}
