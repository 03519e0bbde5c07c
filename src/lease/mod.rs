//! The leases of this instance: zkgate's handle for an HTTP client, the way an etcd lease or a
//! ZooKeeper session is for a native client.
//!
//! The lease itself (what a recipe hangs its znodes off) is [crate::recipes::lease::Lease];
//! this registry makes them (round robin over the instance's sessions, at most so many per
//! principal, idempotent with a key), keeps them alive, and ends them in exactly one of four
//! ways: `DELETE`, a missed keepalive (its TTL passes with no keepalive), the loss of the
//! ZooKeeper session it was born in, or the instance shutting down.
//!
//! Ended leases are remembered (a bounded number) so that their next use answers "gone, and
//! why" (HTTP 410) rather than "never heard of it" (404).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::auth::Caller;
use crate::recipes::lease::{EndReason, Fate, Lease, LeaseError};
use crate::zk::session::{Lanes, ZkSession};

/// TTL policy, from the command line.
#[derive(Clone, Copy, Debug)]
pub struct LeasePolicy {
    pub default_ttl: Duration,
    pub min_ttl: Duration,
    pub max_ttl: Duration,
}

impl LeasePolicy {
    /// The TTL granted for a request: the default when none was asked, else clamped to bounds.
    pub fn grant(&self, requested: Option<Duration>) -> Duration {
        requested.unwrap_or(self.default_ttl).clamp(self.min_ttl, self.max_ttl)
    }
}

/// The registry of leases of this instance.
#[derive(Clone)]
pub struct Leases {
    inner: Arc<Registry>,
}

struct Registry {
    policy: LeasePolicy,
    /// This instance's id: the prefix of every lease id issued here.
    instance: Arc<str>,
    max_per_owner: usize,
    lanes: Lanes,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    live: HashMap<String, Arc<Lease>>,
    ended: crate::remembered::Remembered<String, EndReason>,
    by_idempotency_key: HashMap<String, String>,
    /// Live leases per owner (`None`: auth off), for the per-principal limit.
    per_owner: HashMap<Option<String>, usize>,
}

impl Leases {
    /// Creates the registry and starts ending the leases of every session that ends, on each
    /// of the `lanes`.
    pub fn new(policy: LeasePolicy, max_per_owner: usize, instance: Arc<str>, lanes: Lanes) -> Leases {
        let inner = Arc::new(Registry {
            policy,
            instance,
            max_per_owner,
            lanes: lanes.clone(),
            table: Mutex::default(),
        });
        for lane in lanes.all() {
            tokio::spawn(end_leases_of_lost_sessions(Arc::downgrade(&inner), lane.clone()));
        }
        Leases { inner }
    }

    pub fn policy(&self) -> LeasePolicy {
        self.inner.policy
    }

    /// Creates a lease bound to the current session of a connected lane (round robin), owned by
    /// `caller`. With an idempotency key, a retry of the same request (by the same principal)
    /// returns the lease the first one created (while it lives).
    pub fn create(
        &self,
        caller: &Caller,
        requested_ttl: Option<Duration>,
        idempotency_key: Option<&str>,
    ) -> Result<Arc<Lease>, LeaseError> {
        let (lane, session) = self.inner.lanes.pick()?;
        let owner = caller.name().map(str::to_string);
        // Keys are per principal: another principal's key must not reach this one's lease.
        let idempotency_key = idempotency_key.map(|key| format!("{}\0{key}", owner.as_deref().unwrap_or_default()));
        let idempotency_key = idempotency_key.as_deref();
        let mut table = self.inner.table();
        if let Some(existing) = idempotency_key
            .and_then(|key| table.by_idempotency_key.get(key))
            .and_then(|id| table.live.get(id))
        {
            return Ok(existing.clone());
        }
        let held = table.per_owner.get(&owner).copied().unwrap_or(0);
        if held >= self.inner.max_per_owner {
            return Err(LeaseError::TooMany(self.inner.max_per_owner));
        }
        *table.per_owner.entry(owner.clone()).or_default() += 1;
        let ttl = self.inner.policy.grant(requested_ttl);
        let lease = Arc::new(Lease::new(
            crate::ids::owned_id(&self.inner.instance),
            ttl,
            requested_ttl,
            lane.clone(),
            session.generation,
            owner,
        ));
        table.live.insert(lease.id.clone(), lease.clone());
        if let Some(key) = idempotency_key {
            table.by_idempotency_key.insert(key.to_string(), lease.id.clone());
        }
        drop(table);
        tokio::spawn(expire_when_silent(Arc::downgrade(&self.inner), lease.clone()));
        crate::metrics::get().leases_created.inc();
        Ok(lease)
    }

    /// The live lease with this id, if `caller` owns it.
    ///
    /// # Notable errors
    /// * [LeaseError::Ended] for a lease that ended (deleted, expired or lost with its session).
    /// * [LeaseError::Unknown] for an id never issued here (or ended too long ago).
    /// * [LeaseError::NotYours] for another principal's lease.
    pub fn get(&self, caller: &Caller, id: &str) -> Result<Arc<Lease>, LeaseError> {
        let table = self.inner.table();
        if let Some(lease) = table.live.get(id) {
            lease.check_owner(caller)?;
            return Ok(lease.clone());
        }
        match table.ended.get(id) {
            Some(&reason) => Err(LeaseError::Ended {
                id: id.to_string(),
                reason,
            }),
            None => match crate::ids::owner_of(id).filter(|owner| *owner != &*self.inner.instance) {
                Some(instance) => Err(LeaseError::Elsewhere {
                    id: id.to_string(),
                    instance: instance.to_string(),
                }),
                None => Err(LeaseError::Unknown(id.to_string())),
            },
        }
    }

    /// What [Leases::get] answers for `id`, whoever asks: for a lease whose owner was checked
    /// when it was found (or where only its fate matters, as on an event topic).
    pub fn peek(&self, id: &str) -> Result<Arc<Lease>, LeaseError> {
        self.get(&Caller::Anyone, id)
    }

    /// How each lease of this instance ended, for topics (see [Fate]).
    pub fn fate(&self) -> Fate {
        let leases = self.clone();
        Arc::new(move |id: &str| match leases.peek(id) {
            Err(LeaseError::Ended { reason, .. }) => Some(reason),
            _ => None,
        })
    }

    /// How many leases are live on this instance.
    pub fn count(&self) -> usize {
        self.inner.table().live.len()
    }

    /// Every live lease `caller` owns (all of them for an admin), oldest first.
    pub fn list(&self, caller: &Caller) -> Vec<Arc<Lease>> {
        let mut leases: Vec<_> = self
            .inner
            .table()
            .live
            .values()
            .filter(|l| caller.owns(l.owner.as_deref()))
            .cloned()
            .collect();
        leases.sort_by_key(|l| l.created_at);
        leases
    }

    /// Pushes the lease's deadline one TTL into the future.
    pub fn keepalive(&self, caller: &Caller, id: &str) -> Result<Arc<Lease>, LeaseError> {
        let lease = self.get(caller, id)?;
        lease.renew();
        Ok(lease)
    }

    /// Ends every live lease (reason `shutdown`) and waits (bounded) until their holdings have
    /// removed their znodes: on the way out, so that waiters elsewhere proceed at once instead
    /// of after the session timeout. Returns how many leases it ended.
    pub async fn end_all(&self) -> usize {
        let ids: Vec<String> = self.list(&Caller::Anyone).into_iter().map(|l| l.id.clone()).collect();
        let ended =
            futures::future::join_all(ids.iter().map(|id| self.end(&Caller::Anyone, id, EndReason::Shutdown))).await;
        ended.iter().filter(|r| r.is_ok()).count()
    }

    /// Ends the lease and waits (bounded) until its holdings have removed their znodes, so that
    /// when this returns the next waiters are already being woken.
    pub async fn end(&self, caller: &Caller, id: &str, reason: EndReason) -> Result<(), LeaseError> {
        self.get(caller, id)?;
        let lease = self.inner.end(id, reason).ok_or_else(|| match self.get(caller, id) {
            Err(err) => err,
            Ok(_) => LeaseError::Unknown(id.to_string()),
        })?;
        lease.holdings_finished(Duration::from_secs(10)).await;
        Ok(())
    }
}

impl Registry {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves a live lease to the ended ones and cancels its token. `None` if it was not live.
    fn end(&self, id: &str, reason: EndReason) -> Option<Arc<Lease>> {
        let mut table = self.table();
        let lease = table.live.remove(id)?;
        if let Some(count) = table.per_owner.get_mut(&lease.owner) {
            *count -= 1;
            if *count == 0 {
                table.per_owner.remove(&lease.owner);
            }
        }
        table.by_idempotency_key.retain(|_, lease_id| lease_id != id);
        table.ended.insert(id.to_string(), reason);
        drop(table);
        lease.end(reason);
        tracing::info!(lease = %id, ?reason, "lease ended");
        crate::metrics::get()
            .leases_ended
            .with_label_values(&[reason.label()])
            .inc();
        Some(lease.clone())
    }
}

/// Sleeps until the lease's deadline, re-reading it after each keepalive; ends it if it passed.
async fn expire_when_silent(registry: Weak<Registry>, lease: Arc<Lease>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(lease.deadline()) => {}
            _ = lease.ended().cancelled() => return,
        }
        if lease.deadline() <= Instant::now() {
            if let Some(registry) = registry.upgrade() {
                registry.end(&lease.id, EndReason::Expired);
            }
            return;
        }
    }
}

/// Ends every lease of `zk`'s lane bound to a session generation that is over: older than the
/// current session's, or the current one once it has ended.
async fn end_leases_of_lost_sessions(registry: Weak<Registry>, zk: ZkSession) {
    let mut status = zk.subscribe();
    while status.changed().await.is_ok() {
        let (generation, live) = {
            let s = status.borrow_and_update();
            (s.generation, s.client.is_some())
        };
        let lost_up_to = if live { generation.saturating_sub(1) } else { generation };
        let Some(registry) = registry.upgrade() else {
            return;
        };
        let lost: Vec<String> = registry
            .table()
            .live
            .values()
            .filter(|l| l.zk.lane() == zk.lane() && l.generation <= lost_up_to)
            .map(|l| l.id.clone())
            .collect();
        for id in lost {
            registry.end(&id, EndReason::SessionLost);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_is_clamped_to_policy() {
        let policy = LeasePolicy {
            default_ttl: Duration::from_secs(30),
            min_ttl: Duration::from_secs(2),
            max_ttl: Duration::from_secs(600),
        };
        assert_eq!(policy.grant(None), Duration::from_secs(30));
        assert_eq!(policy.grant(Some(Duration::from_millis(10))), Duration::from_secs(2));
        assert_eq!(policy.grant(Some(Duration::from_secs(3600))), Duration::from_secs(600));
        assert_eq!(policy.grant(Some(Duration::from_secs(45))), Duration::from_secs(45));
    }
}
