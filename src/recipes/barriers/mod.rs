//! The barrier family: a barrier (raised, lowered, waited on until down) and a double barrier
//! (entered together, left together). Here the barrier's operations, on its protocol in
//! [barrier].

pub mod barrier;
pub mod double;
mod views;

pub use views::{DownQuery, EnterBody, LeaveBody, Passage, PassageQuery, RaiseBody, whole_u32};

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::auth::Caller;
use crate::kind::Kind;
use crate::problem::{ApiError, Place, Problem};
use crate::recipes::Recipes;
use crate::recipes::consistency::Consistency;
use crate::recipes::engine::handle::Phase;
use crate::recipes::engine::node::{self, NodeHolding};
use crate::recipes::guards::{Guard, Guards, retry_guarded};
use crate::recipes::leases::LeaseView;
use crate::recipes::topic::Source;
use crate::recipes::{SettingError, validate_name};
use crate::zk::{Failure, Session};
use barrier::BarrierState;
use double::READY;

/// Raises barrier `name`: persistent with neither `lease` nor `ttl`, else bound to that lease
/// (or a new one with `ttl`): it falls when the lease ends. Whether this raised it, and the
/// barrier as the session that raised it sees it (which is sure to see it).
pub async fn raise(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    name: &str,
    RaiseBody { lease, ttl }: RaiseBody,
) -> Result<(bool, BarrierState), ApiError> {
    crate::recipes::check_name(name)?;
    let ttl = ttl.map(|t| t.0);
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    let path = recipes.barriers.dir(name);
    let (created, session) = if lease.is_none() && ttl.is_none() {
        let session = recipes.zk().connected().await?;
        let raised = retry_guarded!(
            guards,
            recipes,
            Err(Failure::Unguarded),
            barrier::raise(&session, &path, guards).await
        );
        (raised?, session)
    } else {
        let (lease, _) = recipes.leases.for_request(caller, lease, ttl).await?;
        let session = lease.session().await?;
        let data = node::owner_record(&lease);
        let nodes = &recipes.barriers;
        let hold = crate::recipes::nodes::hold(recipes, guards, nodes, &lease, (name, name), path, (data, None));
        (recipes.leases.held(&lease, hold.await?)?.is_some(), session)
    };
    Ok((created, recipes.barrier_topic(name).read(&session).await?))
}

/// Lowers barrier `name`, releasing every waiter. One bound to a lease is lowered only by the
/// lease's principal (or an admin), through any instance; 404 if it is not up.
pub async fn lower(recipes: &Recipes, (caller, guards): (&Caller, &[Guard]), name: &str) -> Result<(), ApiError> {
    crate::recipes::check_name(name)?;
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    let session = recipes.synced().await?;
    let path = recipes.barriers.dir(name);
    let root = &recipes.root;
    let what = format!("barrier `{name}`");
    let owner = node::check_owner(&session, root, Kind::Barrier, &path, caller, &what).await?;
    if let Some(bound) = recipes.barriers.serving(name, name).filter(|_| guards.is_empty()) {
        recipes.barriers.release(&bound).await;
        if bound.state().phase != Phase::Moved {
            return Ok(());
        }
    }
    // Bound to a lease kept elsewhere (or moved there while released here): released with its
    // reference, through ZooKeeper.
    let released = match owner {
        Some(_) => retry_guarded!(
            guards,
            recipes,
            Err(Failure::Unguarded),
            node::release_recorded(&session, root, Kind::Barrier, (name, name), &path, &guards.checked()).await
        )?,
        None => false,
    };
    if released {
        return Ok(());
    }
    let lowered = retry_guarded!(
        guards,
        recipes,
        Err(Failure::Unguarded),
        barrier::lower(&session, &path, guards).await
    );
    match lowered? {
        true => Ok(()),
        false => Err(ApiError::not_found("barrier", format!("barrier `{name}` is not up"))),
    }
}

/// Waits (up to `wait`, capped) until barrier `name` is down: at once if it is not up; 409
/// `barrier-up` if the wait ends first. All waiters on this instance share one watch.
pub async fn wait_down(
    recipes: &Recipes,
    name: &str,
    wait: Option<Duration>,
    consistency: Consistency,
) -> Result<(), ApiError> {
    crate::recipes::check_name(name)?;
    // The shared watch reads on the primary session, which the `sync` brings up to date.
    recipes.reader(consistency).await?;
    let wait = recipes.wait(wait);
    let path = recipes.barriers.dir(name);
    let down = barrier::wait_down(&recipes.barrier_watches, &path);
    crate::admission::park();
    if tokio::time::timeout(wait, down).await.is_err() {
        let detail = format!(
            "barrier `{name}` was still up after {}",
            humantime::format_duration(wait)
        );
        return Err(ApiError::new(Problem::BarrierUp, detail));
    }
    Ok(())
}

/// A participant enters double barrier `name` of `size` (`POST .../enter`), bound to `lease` (or
/// a new one with `ttl`; entering again with its lease goes on waiting), and waits until `size`
/// participants are in or the wait ends (it stays inside then).
pub async fn enter(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    name: &str,
    query: PassageQuery,
    body: EnterBody,
) -> Result<Passage, ApiError> {
    let deadline = Instant::now() + recipes.wait(query.wait.map(|w| w.0));
    let entry = Entry {
        participant: body.participant,
        size: body.size,
        lease: body.lease,
        ttl: body.ttl.map(|t| t.0),
    };
    crate::recipes::check_name(name)?;
    check_participant(&entry.participant)?;
    if entry.size == 0 {
        return Err(ApiError::invalid(Place::Body, "size", "must be at least 1"));
    }
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    // Everything from here on the lease's own session: the count of who is inside must include
    // our own node, which only the session that created it is sure to see at once.
    let (node, session) = participant(recipes, (caller, guards), name, &entry).await?;
    let dir = recipes.double_barriers.dir(name);
    crate::admission::park(); // entered: what is left is waiting for the others
    let passed = double::enter(&session, &recipes.barrier_watches, &dir, entry.size, deadline).await?;
    let inside = double::participants(&session, &dir).await?.len();
    Ok(Passage {
        barrier: name.to_string(),
        participant: entry.participant,
        passed,
        inside,
        lease: Some(LeaseView::of(&node.lease)),
    })
}

/// `participant` leaves double barrier `name` (`POST .../leave`), and waits until every
/// participant has left or `deadline` passes. The guide's exit: the lowest waits for the
/// highest, the others remove themselves and wait for the lowest.
pub async fn leave(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    name: &str,
    query: PassageQuery,
    LeaveBody { participant }: LeaveBody,
) -> Result<Passage, ApiError> {
    let deadline = Instant::now() + recipes.wait(query.wait.map(|w| w.0));
    let participant = participant.as_str();
    crate::recipes::check_name(name)?;
    check_participant(participant)?;
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    // Whoever serves it, a participant leaves only by its lease's principal (or an admin).
    let nodes = &recipes.double_barriers;
    let any = recipes.synced().await?;
    let what = format!("participant `{participant}`");
    let path = nodes.node(name, participant);
    node::check_owner(&any, &recipes.root, Kind::DoubleBarrier, &path, caller, &what).await?;
    // On the participant's own session if it entered here, which sees its own removal at once.
    let session = match nodes.get(name, participant) {
        Some(node) => node.lease.session().await?,
        None => any,
    };
    let passed = retry_guarded!(
        guards,
        recipes,
        Err(Failure::Unguarded),
        double::leave(
            &session,
            &recipes.barrier_watches,
            nodes,
            (name, participant),
            deadline,
            &guards.checked()
        )
        .await
    );
    let passed = passed?;
    let inside = double::participants(&session, &nodes.dir(name)).await?.len();
    Ok(Passage {
        barrier: name.to_string(),
        participant: participant.to_string(),
        passed,
        inside,
        lease: None,
    })
}

/// Who enters, and the barrier's size as it expects it.
struct Entry {
    pub participant: String,
    pub size: u32,
    /// The lease to bind the participant to, or none (a new one, with `ttl`).
    pub lease: Option<String>,
    pub ttl: Option<Duration>,
}

fn check_participant(participant: &str) -> Result<(), ApiError> {
    validate_name(participant).map_err(|e| ApiError::invalid(Place::Body, "participant", e))?;
    if participant == READY {
        let detail = "`ready` is the barrier's own node";
        return Err(ApiError::invalid(Place::Body, "participant", detail));
    }
    Ok(())
}

fn taken(name: &str, participant: &str) -> ApiError {
    ApiError::new(
        Problem::MemberTaken,
        format!("`{participant}` is already inside `{name}`"),
    )
}

/// Records `size` in the barrier's znode (creating it); 409 if it records another size.
async fn agree_on_size(session: &Session, dir: &str, name: &str, size: u32) -> Result<(), ApiError> {
    match double::agree_on_size(session, dir, size).await {
        Ok(()) => Ok(()),
        Err(SettingError::Mismatch(n)) => Err(ApiError::new(
            Problem::SizeMismatch,
            format!("double barrier `{name}` has size {n}, not {size}"),
        )
        .with("size", n)),
        Err(SettingError::ZooKeeper(err)) => Err(err.into()),
    }
}

/// The participant's node for an enter: the one it has here already (entering again with its
/// lease goes on waiting), or a new one bound to the lease the request names or makes.
async fn participant(
    recipes: &Recipes,
    (caller, guards): (&Caller, &Guards),
    name: &str,
    body: &Entry,
) -> Result<(Arc<NodeHolding>, Session), ApiError> {
    let dir = recipes.double_barriers.dir(name);
    match recipes.double_barriers.get(name, &body.participant) {
        Some(node) if Some(node.lease.id.as_str()) == body.lease.as_deref() => {
            node.lease.check_owner(caller)?;
            let session = node.lease.session().await?;
            agree_on_size(&session, &dir, name, body.size).await?;
            Ok((node, session))
        }
        Some(_) => Err(taken(name, &body.participant)),
        None => {
            let (lease, _) = recipes.leases.for_request(caller, body.lease.clone(), body.ttl).await?;
            let session = lease.session().await?;
            agree_on_size(&session, &dir, name, body.size).await?;
            let path = recipes.double_barriers.node(name, &body.participant);
            let data = node::owner_record(&lease);
            let nodes = &recipes.double_barriers;
            let at = (name, body.participant.as_str());
            let hold = crate::recipes::nodes::hold(recipes, guards, nodes, &lease, at, path, (data, None));
            let node = recipes
                .leases
                .held(&lease, hold.await?)?
                .ok_or_else(|| taken(name, &body.participant))?;
            Ok((node, session))
        }
    }
}
