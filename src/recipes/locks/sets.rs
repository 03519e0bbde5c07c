//! Lock sets as the API takes and answers them: several exclusive locks acquired as one, all or
//! none ([lock_set]'s order), read, and released together.

use std::sync::Arc;
use std::time::Instant;

use crate::auth::Caller;
use crate::problem::{ApiError, Place, Problem};
use crate::recipes::Recipes;
use crate::recipes::consistency::Consistency;
use crate::recipes::engine::lease::{EndReason, Lease};
use crate::zk::Session;
use serde::{Deserialize, Serialize};

use super::contention::{self, Contender, HandleView, held_since};
use super::lock_set::{self, SetRecord, canonical_order};
use crate::auth::Access;
use crate::kind::Kind;
use crate::recipes::leases::LeaseView;
use crate::time::HumanDuration;

/// Most locks in one set.
pub const MAX_LOCKS: usize = 64;

/// Query of a set's acquire.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SetParams {
    /// How long to wait for the whole set (one wait for all its locks, not one each): `0`
    /// tries once. Capped by the server's maximum wait, which is also the default.
    #[param(value_type = Option<String>, example = "10s")]
    pub wait: Option<HumanDuration>,
}

/// Body of a set's acquire.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LockSetBody {
    /// The locks, by name (1 to 64, each once; any order: they are taken sorted).
    #[schema(example = json!(["account-17", "account-42"]), min_items = 1, max_items = 64)]
    pub locks: Vec<String>,
    /// The lease to hold them with. Without it a new lease is created and returned.
    pub lease: Option<String>,
    /// TTL of the lease created when `lease` is not given.
    pub ttl: Option<HumanDuration>,
}

/// One lock of a set.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SetLock {
    #[schema(example = "account-17")]
    pub lock: String,
    /// The lock's handle (`/v1/locks/{lock}/handles/{handle}`).
    pub handle: String,
    /// This lock's fencing token: send it with writes to what this lock protects.
    #[schema(example = 4294967302_i64)]
    pub fencing_token: Option<i64>,
    pub node: Option<String>,
    #[schema(format = DateTime)]
    pub held_since: Option<String>,
}

/// A set that was granted: every lock held.
#[derive(Serialize, utoipa::ToSchema)]
pub struct LockSetView {
    /// Release every lock with `DELETE /v1/lock-sets/{set}`.
    #[schema(example = "5f0c1a2b-0b9d4c3e2f1a4b5c8d7e6f5a4b3c2d1e")]
    pub set: String,
    /// Its locks, in the order they were taken (sorted by name).
    pub locks: Vec<SetLock>,
    /// The lease holding them; keep it alive with `POST /v1/leases/{id}/keepalive`.
    pub lease: LeaseView,
}

/// A set as it stands.
#[derive(Serialize, utoipa::ToSchema)]
pub struct LockSetState {
    pub set: String,
    pub lease: String,
    /// `held` while every lock is; `lost` once one was lost (its lease expired, its node was
    /// deleted...): the set no longer protects anything and should be released.
    #[schema(example = "held")]
    pub state: &'static str,
    pub locks: Vec<HandleView>,
}

impl SetLock {
    /// One lock of a set, as its task has it.
    pub fn of(handle: &Contender) -> SetLock {
        let current = handle.state();
        SetLock {
            lock: handle.name.clone(),
            handle: handle.id.clone(),
            fencing_token: current.fencing_token(),
            node: current.node.map(|n| n.name),
            held_since: held_since(&current.phase),
        }
    }
}

/// Acquires the locks `body` names (in the order of [lock_set::canonical_order]) as one set on
/// its lease (or a new one with its `ttl`), all within the wait. A set refused gives back what
/// it took (409 naming the `lock` not granted); locks the lease held before stay held.
pub async fn acquire_set(
    recipes: &Recipes,
    caller: &Caller,
    params: SetParams,
    body: LockSetBody,
) -> Result<LockSetView, ApiError> {
    let order = locks_in_order(caller, &body.locks)?;
    let wait = recipes.wait(params.wait.map(|w| w.0));
    let deadline = Instant::now() + wait;
    let ttl = body.ttl.map(|t| t.0);
    let (lease, own_lease) = recipes.leases.for_request(caller, body.lease, ttl).await?;
    let mut taker = SetTaker {
        recipes,
        caller,
        lease: &lease,
        own_lease,
        deadline,
    };
    let (id, taken) = lock_set::acquire(&mut taker, &order)
        .await
        .map_err(|refused| match refused.at {
            Some(lock) => refused.error.with("lock", &lock),
            None => refused.error,
        })?;
    Ok(LockSetView {
        set: id,
        locks: taken.iter().map(|(handle, _)| SetLock::of(handle)).collect(),
        lease: LeaseView::of(&lease),
    })
}

/// The locks a set names, each valid, named once and allowed to `caller`, in the order every
/// set takes them (so that two sets never wait on each other).
fn locks_in_order<'a>(caller: &Caller, locks: &'a [String]) -> Result<Vec<&'a str>, ApiError> {
    if locks.is_empty() || locks.len() > MAX_LOCKS {
        let detail = format!("must name 1 to {MAX_LOCKS} locks");
        return Err(ApiError::invalid(Place::Body, "locks", detail));
    }
    for name in locks {
        crate::recipes::validate_name(name)
            .map_err(|e| ApiError::invalid(Place::Body, "locks", format!("`{name}` {e}")))?;
    }
    let Some(order) = canonical_order(locks) else {
        return Err(ApiError::invalid(Place::Body, "locks", "must name each lock once"));
    };
    // The route names no lock, so the guard could not authorise them: each one here.
    for name in &order {
        caller.require(Kind::Lock.auth(), name, Access::Write)?;
    }
    Ok(order)
}

/// Set `id` as it stands: each of its locks' handles as [contention::read_handle] sees it (or
/// gone, released or lost), and whether all are still held.
pub async fn read_set(
    recipes: &Recipes,
    caller: &Caller,
    id: &str,
    consistency: Consistency,
) -> Result<LockSetState, ApiError> {
    let session = recipes.reader(consistency).await?;
    let set = find_set(recipes, &session, caller, id).await?;
    let mut locks = Vec::with_capacity(set.locks.len());
    for member in &set.locks {
        let at = (member.lock.as_str(), member.handle.as_str());
        let seen = contention::read_handle(recipes, &recipes.locks, caller, at, None, consistency).await;
        locks.push(match seen {
            Ok(seen) => HandleView::of(recipes, seen).await,
            Err(_) => HandleView::gone(&member.lock, &member.handle, &set.lease),
        });
    }
    let all_held = locks.iter().all(|l| l.state == "held");
    Ok(LockSetState {
        set: id.to_string(),
        lease: set.lease,
        state: if all_held { "held" } else { "lost" },
        locks,
    })
}

/// Releases every lock of set `id`; if one had been lost before (410 `lock-lost`, naming it),
/// the others are released all the same.
pub async fn release_set(recipes: &Recipes, caller: &Caller, id: &str) -> Result<(), ApiError> {
    let session = recipes.synced().await?;
    let set = find_set(recipes, &session, caller, id).await?;
    let mut lost = None;
    for member in set.locks.iter().rev() {
        let found = contention::find_handle(&recipes.locks, &session, caller, &member.lock, &member.handle).await;
        let released = match found {
            Ok(found) => contention::release(recipes, &recipes.locks, found).await,
            Err(err) => Err(err),
        };
        if let Err(err) = released {
            lost.get_or_insert(err.with("lock", &member.lock));
        }
    }
    let gone = || ApiError::not_found("lock set", format!("no lock set `{id}`"));
    let path = lock_set::record_path(&recipes.root, id);
    crate::recipes::nodes::unbind(recipes, (caller, &[]), &recipes.lock_sets, (id, id), &path, gone).await?;
    lost.map_or(Ok(()), Err)
}

/// A set's locks taken as single acquires on `lease`, within one deadline.
struct SetTaker<'a> {
    recipes: &'a Recipes,
    caller: &'a Caller,
    lease: &'a Arc<Lease>,
    /// Whether the lease was made for this request (a refused set ends it).
    own_lease: bool,
    deadline: Instant,
}

impl lock_set::Taker for SetTaker<'_> {
    /// A lock's handle, and whether the lease held it before the set.
    type Taken = (Arc<Contender>, bool);
    type Error = ApiError;

    async fn take(&mut self, name: &str) -> Result<Self::Taken, ApiError> {
        let (recipes, lease) = (self.recipes, self.lease);
        let held_before = recipes.locks.holds(lease, name);
        let request = contention::Request {
            caller: self.caller,
            name,
            wait: Some(self.deadline.saturating_duration_since(Instant::now())),
            keep_queued: false,
            lease: Some(lease.id.clone()),
            ttl: None,
        };
        let open = async |lease: Arc<Lease>| {
            contention::open_contender(
                recipes,
                &recipes.locks,
                &lease,
                name,
                crate::recipes::locks::exclusive::EXCLUSIVE,
                None,
            )
        };
        let granted = contention::contend(recipes, &recipes.locks, request, open).await?;
        Ok((granted.handle, held_before))
    }

    /// Records the set of `taken` (granted, in order) under a new id, bound to the lease.
    async fn record(&mut self, taken: &[Self::Taken]) -> Result<String, ApiError> {
        let (recipes, lease) = (self.recipes, self.lease);
        let id = crate::ids::owned_id(&lease.here);
        let record = SetRecord {
            lease: lease.id.clone(),
            principal: lease.principal.clone(),
            locks: taken
                .iter()
                .map(|(handle, _)| lock_set::SetLock {
                    lock: handle.name.clone(),
                    handle: handle.id.clone(),
                })
                .collect(),
            created_ms: crate::time::now_ms(),
        };
        let path = lock_set::record_path(&recipes.root, &id);
        let hold = recipes.lock_sets.hold_as(
            lease,
            (&id, &id),
            path,
            (record.to_bytes(), None),
            (true, Default::default()),
        );
        match recipes.leases.held(lease, hold.await)? {
            Some(_) => Ok(id),
            None => Err(ApiError::new(Problem::Internal, "a lock set's id was taken")),
        }
    }

    async fn give_back(&mut self, taken: Vec<Self::Taken>) {
        if self.own_lease {
            let _ = self
                .recipes
                .leases
                .end(&Caller::Anyone, &self.lease.id, EndReason::Deleted)
                .await;
            return;
        }
        // Locks the lease held before the set stay held.
        for (handle, held_before) in taken.iter().rev() {
            if !held_before {
                self.recipes.locks.release(handle).await;
            }
        }
    }
}

/// The set `id` as ZooKeeper records it, if `caller` may use it; 404 otherwise.
async fn find_set(recipes: &Recipes, session: &Session, caller: &Caller, id: &str) -> Result<SetRecord, ApiError> {
    crate::recipes::validate_name(id).map_err(|e| ApiError::invalid(Place::Path, "set", e))?;
    let set = lock_set::read(session, &recipes.root, id)
        .await?
        .ok_or_else(|| ApiError::not_found("lock set", format!("no lock set `{id}` (released, or its lease ended)")))?;
    caller.require_owner(set.principal.as_deref(), &format!("lock set `{id}`"))?;
    Ok(set)
}
