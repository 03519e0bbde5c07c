//! How guards are resolved from the contended kinds' registries and ZooKeeper, and how a
//! refusal is explained (see the module's docs).

use super::{Checks, Guard, Guards, REFRESHES, Standing};
use crate::auth::Caller;
use crate::kind::Kind;
use crate::locked::Locked;
use crate::problem::{ApiError, Place, Problem};
use crate::recipes::Recipes;
use crate::recipes::engine::handle::{Handles, Phase, Protocol};
use crate::recipes::engine::record;
use crate::recipes::engine::view::{self, Fencing};
use crate::recipes::locks::contention::lookup;
use crate::recipes::recorded::Watched;
use crate::zk::Session;

impl Guards {
    /// The guards `asked` of `caller`'s write, resolved: refused (409 `guard-lost`) if one does
    /// not hold now, 403 if its handle is another principal's.
    pub async fn resolve(recipes: &Recipes, caller: &Caller, asked: &[Guard]) -> Result<Guards, ApiError> {
        let mut checks = Vec::with_capacity(asked.len());
        for guard in asked {
            checks.push(resolve(recipes, caller, guard, false).await?);
        }
        Ok(Guards {
            caller: caller.clone(),
            asked: asked.to_vec(),
            checks: std::sync::Mutex::new(checks),
            refreshed: std::sync::Mutex::default(),
        })
    }

    /// After ZooKeeper refused a check of [Guards::add_to]: `Ok` if every guard still holds (its
    /// checks are refreshed; send the write again), else why not (409 `guard-lost`), read from
    /// ZooKeeper after a `sync`.
    pub async fn refused(&self, recipes: &Recipes) -> Result<(), ApiError> {
        let mut fresh = Vec::with_capacity(self.asked.len());
        for guard in &self.asked {
            fresh.push(resolve(recipes, &self.caller, guard, true).await?);
        }
        let mut refreshed = self.refreshed.locked();
        *refreshed += 1;
        if *refreshed > REFRESHES {
            return Err(ApiError::unavailable(
                "the write's guards held, but ZooKeeper refused their checks each time (their leases keep changing \
                 keeper); nothing was written",
            ));
        }
        *self.checks.locked() = fresh;
        Ok(())
    }
}

/// Where a compare's guard stands for `caller` (`fresh`: read from ZooKeeper after a `sync`,
/// not from this instance's memory): 403 if its handle is another principal's, 400 for a
/// semaphore (a waiting permit request waits on the whole set of permits, which no single check
/// pins).
pub async fn standing(recipes: &Recipes, caller: &Caller, guard: &Guard, fresh: bool) -> Result<Standing, ApiError> {
    if guard.kind == Kind::Semaphore {
        return Err(ApiError::invalid(
            Place::Body,
            "compare",
            "a transaction compares a lock, a read/write lock or an election; guard a write by a permit with `ZKGATE-Guard`",
        ));
    }
    Ok(judged(recipes, caller, guard, fresh).await?.0)
}

/// Resolves `guard` for `caller`: from this instance's memory unless `fresh` (or it is not
/// driven here), else from ZooKeeper after a `sync`; 409 `guard-lost` if it does not hold.
async fn resolve(recipes: &Recipes, caller: &Caller, guard: &Guard, fresh: bool) -> Result<Checks, ApiError> {
    match judged(recipes, caller, guard, fresh).await? {
        (Standing::Holds(checks), _) => Ok(checks),
        (standing, why) => Err(lost(recipes, guard, &standing, &why).await),
    }
}

/// Where `guard` stands, and in words why it does not hold (empty when it does).
async fn judged(
    recipes: &Recipes,
    caller: &Caller,
    guard: &Guard,
    fresh: bool,
) -> Result<(Standing, String), ApiError> {
    match guard.kind {
        Kind::Lock => in_registry(recipes, &recipes.locks, caller, guard, fresh).await,
        Kind::RwLock => in_registry(recipes, &recipes.rwlocks, caller, guard, fresh).await,
        Kind::Election => in_registry(recipes, &recipes.elections, caller, guard, fresh).await,
        // A permit's node is its lease node, under `leases/`, where `Handles::node` (which the
        // check of a handle held here is made with) does not look: read.
        Kind::Semaphore => in_registry(recipes, &recipes.semaphores, caller, guard, true).await,
        Kind::Barrier
        | Kind::DoubleBarrier
        | Kind::Txn
        | Kind::Queue
        | Kind::Group
        | Kind::Kv
        | Kind::Counter
        | Kind::Service => Err(ApiError::invalid(
            Place::Header,
            "ZKGATE-Guard",
            format!("a {} cannot guard a write", guard.kind.name()),
        )),
    }
}

async fn in_registry<P: Protocol>(
    recipes: &Recipes,
    handles: &Handles<P>,
    caller: &Caller,
    guard: &Guard,
    fresh: bool,
) -> Result<(Standing, String), ApiError> {
    let (name, handle) = (guard.name.as_str(), guard.handle.as_str());
    if !fresh && let Some(driven) = handles.serving(name, handle) {
        driven.lease.check_owner(caller)?;
        let state = driven.state();
        if let (Phase::Held { .. }, Some(node), Some(version)) = (&state.phase, &state.node, driven.lease.version())
            && !driven.lease.ended().is_cancelled()
        {
            let checks = Checks {
                token: node.czxid,
                node: handles.node(name, &node.name),
                lease: driven.lease.path.clone(),
                version,
            };
            return Ok((Standing::Holds(checks), String::new()));
        }
    }
    let session = recipes.synced().await?;
    let gone = |reason, why| Ok((Standing::Gone { reason }, why));
    let Some(recorded) = lookup(&session, handles, name, handle).await? else {
        // Why, as far as this instance knows: it drove the handle, or saw it lost.
        let driven = handles.get(name, handle).and_then(|driven| driven.lease.end_reason());
        let lost_here = handles
            .lost(name, handle)
            .filter(|lost| caller.owns(lost.principal.as_deref()));
        return match (driven, lost_here) {
            (Some(ended), _) => gone("lease-ended", format!("its lease ended ({})", ended.describe())),
            (None, Some(lost)) if lost.lease_ended.is_some() => gone("lease-ended", lost.reason),
            (None, lost) => match (revoked(recipes, &session, guard).await, lost) {
                (Some(why), _) => gone("revoked", why),
                (None, Some(lost)) => gone("lost", lost.reason),
                (None, None) => gone("released", "it has no node: released, or lost with its lease".into()),
            },
        };
    };
    let owner = recorded.owner();
    if let Some(principal) = owner.as_ref().and_then(|owner| owner.principal.as_deref()) {
        caller.require_owner(Some(principal), &format!("handle `{handle}`"))?;
    }
    if !recorded.holds() {
        let why = format!("it waits (at position {})", recorded.position.unwrap_or(0));
        return Ok(match recorded.next {
            Watched::Exists(blocker) => (Standing::Waits { blocker }, why),
            // A permit request waits on the set of permits: nothing single to pin (a guard
            // refuses it all the same; a compare does not take a semaphore).
            Watched::Children(_) | Watched::Data(_) => (Standing::Gone { reason: "not-held" }, why),
        });
    }
    let Some(lease) = owner.map(|owner| record::path(&recipes.root, &owner.lease)) else {
        return gone("lost", "its node names no lease".into());
    };
    let found = record::read(session.client(), &lease)
        .await
        .map_err(crate::zk::Failure::from)?;
    match found {
        Some(found) if found.record.ended.is_none() => {
            let checks = Checks {
                token: recorded.node.czxid,
                node: recorded.paths[0].clone(),
                lease,
                version: found.version,
            };
            Ok((Standing::Holds(checks), String::new()))
        }
        ended => {
            let why = ended
                .and_then(|found| found.record.ended)
                .map_or("its lease is gone", |reason| reason.describe());
            let detail = format!("its lease ended ({why}); its node is kept through the lease's lock-delay");
            gone("lease-ended", detail)
        }
    }
}

/// How many of the newest revocations a refused guard looks through for its own (the audit
/// log keeps more; a refusal must stay cheap).
const REVOCATIONS_READ: usize = 64;

/// Why `guard`'s node went, if a revocation asked for it: who asked and why, and whether the
/// grace ran out (the node deleted by zkgate) or the holder gave it up when asked.
async fn revoked(recipes: &Recipes, session: &Session, guard: &Guard) -> Option<String> {
    let guid = crate::ids::guid_of(&guard.handle)?;
    let audit = crate::recipes::engine::revocation::audit_dir(&recipes.root);
    let records = crate::recipes::engine::revocation::read_audit(session, &audit, REVOCATIONS_READ)
        .await
        .ok()?;
    let asked = records
        .into_iter()
        .find(|record| record.kind == guard.kind.name() && record.lock == guard.name && record.node.contains(&guid))?;
    let how = match asked.grace_ms {
        Some(grace) => format!("its node was deleted after a grace of {grace} ms"),
        None => "its holder gave it up".to_string(),
    };
    Some(format!("revoked by `{}` ({}): {how}", asked.by, asked.reason))
}

/// 409 `guard-lost` for `guard`, which stands as `standing` (its reason code) for the reason
/// `why` (in words), with the holder's token now where one holds (a lock's, a leader's, a
/// writer's or the newest reader's).
async fn lost(recipes: &Recipes, guard: &Guard, standing: &Standing, why: &str) -> ApiError {
    let reason = match standing {
        Standing::Gone { reason } => reason,
        Standing::Waits { .. } | Standing::Holds(_) => "not-held",
    };
    let holding = |names: &[String]| match guard.kind {
        Kind::RwLock => crate::recipes::locks::rwlock::holding(names),
        _ => 1,
    };
    let dir = guard.kind.path(&recipes.root, &guard.name);
    let current = match (guard.kind, recipes.zk().connected().await) {
        (Kind::Semaphore, _) | (_, Err(_)) => None,
        (_, Ok(session)) => match view::check_fencing(&session, &dir, holding, 0).await {
            Ok(Fencing::Superseded { current }) => Some(current),
            _ => None,
        },
    };
    let kind = guard.kind.name();
    crate::metrics::get().guard_refusals.with_label_values(&[kind]).inc();
    let now = match current {
        Some(token) => format!("; the holder now has fencing token {token}"),
        None => String::new(),
    };
    let target = guard.target();
    ApiError::new(
        Problem::GuardLost,
        format!("guard `{target}` does not hold: {why}{now}; nothing was written"),
    )
    .with("guard", target)
    .with("reason", reason)
    .with("current_token", current)
}
