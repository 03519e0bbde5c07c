//! The lock family: exclusive locks, read/write locks, semaphores, lock sets, and what they
//! share: the long-poll acquire, a handle's reads and release, fencing checks and revocation
//! ([contention]; elections contend the same way).

pub mod contention;
pub mod exclusive;
pub mod lock_set;
pub mod rwlock;
pub mod semaphore;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::auth::Caller;
use crate::problem::{ApiError, Place, Problem};
use crate::recipes::Recipes;
use crate::recipes::consistency::Consistency;
use crate::recipes::engine::lease::{EndReason, Lease};
use crate::zk::Session;
use contention::{Contender, Seen};
use lock_set::SetRecord;

/// A permit of semaphore `request.name` of `permits` (a long poll, as a lock's acquire): the
/// semaphore records its number of permits first (409 `permits-mismatch` if it has another).
pub async fn acquire_permit(
    recipes: &Recipes,
    request: contention::Request<'_>,
    permits: u32,
) -> Result<contention::Granted<semaphore::PermitRequest>, ApiError> {
    let name = request.name;
    let open = async |lease: Arc<Lease>| {
        // On the lease's session, where the permit's task reads the count back.
        let session = lease.session().await?;
        let dir = recipes.semaphores.dir(name);
        semaphore::agree_on_permits(&session, &dir, permits)
            .await
            .map_err(|err| match err {
                crate::recipes::SettingError::Mismatch(recorded) => {
                    let detail = format!("semaphore `{name}` has {recorded} permits, not {permits}");
                    ApiError::new(Problem::PermitsMismatch, detail).with("permits", recorded)
                }
                crate::recipes::SettingError::ZooKeeper(err) => err.into(),
            })?;
        recipes
            .semaphores
            .request(&lease, name, permits)
            .ok_or_else(|| recipes.leases.gone(&lease))
    };
    contention::contend(recipes, &recipes.semaphores, request, open).await
}

/// A permit as [read_permit] saw it.
pub enum PermitSeen {
    /// Kept here, its lease confirmed kept: its task's view.
    Here(Arc<semaphore::Permit>),
    /// As ZooKeeper has it, with the semaphore's number of permits.
    There(Box<contention::Recorded>, u32),
}

/// Permit `handle` of semaphore `name`, read at `consistency`, if `caller` may see it.
pub async fn read_permit(
    recipes: &Recipes,
    caller: &Caller,
    (name, handle): (&str, &str),
    consistency: Consistency,
) -> Result<PermitSeen, ApiError> {
    let session = recipes.reader(consistency).await?;
    match contention::find_handle(&recipes.semaphores, &session, caller, name, handle).await? {
        contention::Found::Here(permit) => {
            recipes.confirm(&permit.lease, consistency).await?;
            Ok(PermitSeen::Here(permit))
        }
        contention::Found::There(recorded) => {
            let dir = recipes.semaphores.dir(name);
            let permits = semaphore::permits_of(&session, &dir).await?.unwrap_or(0) as u32;
            Ok(PermitSeen::There(recorded, permits))
        }
    }
}

/// Acquires the locks `order` names (in that order: [lock_set::canonical_order]) as one set on
/// `lease` (or a new one with `ttl`), all within `wait`: the set's id, its locks' handles in
/// order, and the lease. A set refused gives back what it took (409 naming the `lock` not
/// granted); locks the lease held before stay held.
pub async fn acquire_set(
    recipes: &Recipes,
    caller: &Caller,
    order: &[&str],
    wait: Duration,
    lease: Option<String>,
    ttl: Option<Duration>,
) -> Result<(String, Vec<Arc<Contender>>, Arc<Lease>), ApiError> {
    let deadline = Instant::now() + wait;
    let (lease, own_lease) = recipes.leases.for_request(caller, lease, ttl).await?;
    let mut taker = SetTaker {
        recipes,
        caller,
        lease: &lease,
        own_lease,
        deadline,
    };
    let (id, taken) = lock_set::acquire(&mut taker, order)
        .await
        .map_err(|refused| match refused.at {
            Some(lock) => refused.error.with("lock", &lock),
            None => refused.error,
        })?;
    let handles = taken.into_iter().map(|(handle, _)| handle).collect();
    Ok((id, handles, lease))
}

/// Set `id` as ZooKeeper records it, and each of its locks' handles as [contention::read_handle]
/// sees it (`None`: gone, released or lost).
pub async fn read_set(
    recipes: &Recipes,
    caller: &Caller,
    id: &str,
    consistency: Consistency,
) -> Result<(SetRecord, Vec<Option<Seen>>), ApiError> {
    let session = recipes.reader(consistency).await?;
    let set = find_set(recipes, &session, caller, id).await?;
    let mut seen = Vec::with_capacity(set.locks.len());
    for member in &set.locks {
        let at = (member.lock.as_str(), member.handle.as_str());
        seen.push(
            contention::read_handle(recipes, &recipes.locks, caller, at, None, consistency)
                .await
                .ok(),
        );
    }
    Ok((set, seen))
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
