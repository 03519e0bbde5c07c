//! The leases other instances keep, visited here: every instance a peer.
//!
//! A request that makes a holding for a lease (an acquire, a campaign, a join) is served by the
//! instance it arrives at, its wait included, whichever instance keeps the lease's TTL clock.
//! Handing it to the keeper instead cost a second HTTP request and a second instance's CPU on
//! every such request behind a round-robin balancer (BENCHMARKS.md, issue 40). What the keeper
//! alone has is its clock; what a holding needs of the lease is only its owner (checked here)
//! and a guard that fails once the lease ended, which the record's version is wherever it is
//! read. So a visitor holds a copy of the lease made from its record ([Lease::visiting]):
//! - its writes are guarded by the version it read, so none lands after the lease ended: the
//!   keeper's end is a write of the record, which changes its version. A guard refused because
//!   the lease only changed keeper reads the record again and goes on;
//! - it watches the record, so that it learns of the end at once and its holdings here say
//!   they lost what they held (an expiry) rather than wait for a predecessor to go;
//! - the keeper, ending the lease, ends the holdings driven elsewhere too (from the holding records
//!   under the record: [super::ending]), so a lease's end never waits for a visitor, nor for
//!   one that is gone;
//! - a visitor that goes leaves its holdings' znodes (they are persistent); the reaper takes
//!   their tasks up ([super::reaper]), and a new keeper leaves a live visitor's to it.
//!
//! A copy stays while it is in use and for [LINGER] after, watching its record, so that a
//! client that acquires and releases in a loop through this instance costs one read of the
//! record, not one a cycle.

use std::time::Duration;

use super::*;
use crate::zk::ZkError;

/// How long a visited lease stays after its last use with nothing held through it here.
pub const LINGER: Duration = Duration::from_secs(60);

/// A visited lease, and when a request here last used it.
pub(super) struct Visit {
    lease: Arc<Lease>,
    used: Instant,
}

impl Leases {
    /// The lease `id` for a request here that makes a holding with it: kept here, or visited
    /// (a copy of another instance's, see the module's docs), if `caller` owns it and it has
    /// not ended.
    ///
    /// # Notable errors
    /// * [LeaseError::Unknown], [LeaseError::Ended], [LeaseError::NotYours] as for
    ///   [Leases::find].
    /// * [LeaseError::NotFresh] for a lease kept here while this instance cannot vouch for it.
    /// * [LeaseError::Unavailable] while ZooKeeper cannot be reached.
    pub async fn serve(&self, caller: &Caller, id: &str) -> Result<Arc<Lease>, LeaseError> {
        match self.get(caller, id) {
            Err(LeaseError::Unknown(_)) => {}
            known => return known,
        }
        if let Some(visited) = self.inner.visited(id) {
            visited.check_owner(caller)?;
            return Ok(visited);
        }
        if crate::ids::owner_of(id).is_none() {
            return Err(LeaseError::Unknown(id.to_string()));
        }
        let (lane, session) = self.inner.lanes.pick()?;
        let path = record::path(&self.inner.root, id);
        let mut read = record::read_and_watch(session.client(), &path)
            .await
            .map_err(|_| unavailable())?;
        if read.is_none() {
            // Made through another instance a moment ago, maybe: this session's server may lag.
            session.sync().await.map_err(|_| unavailable())?;
            read = record::read_and_watch(session.client(), &path)
                .await
                .map_err(|_| unavailable())?;
        }
        let Some((found, watcher)) = read else {
            return Err(LeaseError::Unknown(id.to_string()));
        };
        usable(caller, id, &found)?;
        if found.record.keeper == *self.inner.instance {
            // Its record names this instance, which does not have it in memory: a takeover
            // undone by another, as in [Leases::find].
            return self.take_over(caller, id, Some(&found.record.keeper), false).await;
        }
        let deadline = Instant::now() + Duration::from_millis(found.record.ttl_ms);
        let lease = Arc::new(Lease::visiting(
            self.inner.kept(id, &found, found.version, deadline),
            lane.clone(),
        ));
        let mut visitors = self.inner.visitors.locked();
        match visitors.get_mut(id) {
            // Visited by a request that read the record at the same time: one copy.
            Some(visit) if !visit.lease.is_gone() => {
                visit.used = Instant::now();
                Ok(visit.lease.clone())
            }
            _ => {
                let visit = Visit {
                    lease: lease.clone(),
                    used: Instant::now(),
                };
                visitors.insert(id.to_string(), visit);
                drop(visitors);
                tokio::spawn(follow(Arc::downgrade(&self.inner), lease.clone(), watcher));
                Ok(lease)
            }
        }
    }
}

impl Registry {
    /// The live copy of lease `id` visited here, marked as used now.
    pub(super) fn visited(&self, id: &str) -> Option<Arc<Lease>> {
        let mut visitors = self.visitors.locked();
        let visit = visitors.get_mut(id)?;
        if visit.lease.is_gone() {
            return None;
        }
        visit.used = Instant::now();
        Some(visit.lease.clone())
    }

    /// Forgets the visit of `lease` (if it is the copy visited now).
    fn unvisit(&self, lease: &Arc<Lease>) {
        let mut visitors = self.visitors.locked();
        if visitors.get(&lease.id).is_some_and(|v| Arc::ptr_eq(&v.lease, lease)) {
            visitors.remove(&lease.id);
        }
    }

    /// Stops driving what every visited lease holds here (on the way out): their holdings'
    /// znodes stay, for the reaper to adopt once this instance is gone.
    pub(super) fn leave_visits(&self) {
        let visits: Vec<Visit> = self.visitors.locked().drain().map(|(_, visit)| visit).collect();
        for visit in visits {
            visit.lease.drop_here();
        }
    }
}

/// Follows the record of a visited lease (its watch `watcher` set by the read that made the
/// copy): a takeover gives the guard its new version, an end ends the copy (its holdings here
/// leave, and say they were lost if it expired). The copy goes once it ended, or lingered
/// [LINGER] unused with nothing held through it.
async fn follow(registry: Weak<Registry>, lease: Arc<Lease>, watcher: record::RecordWatch) {
    let mut watcher = Some(watcher);
    loop {
        if let Some(watching) = watcher.take() {
            let fired = watching.changed();
            tokio::pin!(fired);
            loop {
                tokio::select! {
                    _ = &mut fired => break,
                    _ = lease.ended().cancelled() => return forget(&registry, &lease),
                    _ = lease.dropped().cancelled() => return forget(&registry, &lease),
                    _ = tokio::time::sleep(LINGER) => {
                        if unused(&registry, &lease) {
                            // Its watch stays until the record changes (the lease's end at
                            // the latest): ZooKeeper keeps it, this instance nothing.
                            return forget(&registry, &lease);
                        }
                    }
                }
            }
        }
        let Some(session) = lease.zk.next_session(None).await else {
            return forget(&registry, &lease); // the instance is shutting down
        };
        match record::read_and_watch(session.client(), &lease.path).await {
            Ok(Some((found, next))) => {
                if !lease.take_note(Some(&found)) {
                    return forget(&registry, &lease);
                }
                watcher = Some(next);
            }
            Ok(None) => {
                lease.take_note(None);
                return forget(&registry, &lease);
            }
            Err(ZkError::SessionExpired | ZkError::ClientClosed) => {
                let _ = tokio::time::timeout(HEARTBEAT, lease.zk.next_session(Some(session.generation))).await;
            }
            Err(_) => tokio::time::sleep(HEARTBEAT).await,
        }
    }
}

/// Whether the visited `lease` holds nothing here and was not used for [LINGER].
fn unused(registry: &Weak<Registry>, lease: &Arc<Lease>) -> bool {
    let Some(registry) = registry.upgrade() else {
        return true;
    };
    let visitors = registry.visitors.locked();
    let idle = visitors
        .get(&lease.id)
        .is_none_or(|v| !Arc::ptr_eq(&v.lease, lease) || v.used.elapsed() >= LINGER);
    idle && lease.attached() == 0
}

fn forget(registry: &Weak<Registry>, lease: &Arc<Lease>) {
    if let Some(registry) = registry.upgrade() {
        registry.unvisit(lease);
    }
}
