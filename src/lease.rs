//! Leases: zkgate's handle for an HTTP client, the way an etcd lease or a ZooKeeper session is
//! for a native client.
//!
//! A lease has an unguessable id, a TTL and the set of *holdings* created on its behalf (lock
//! contenders today; election candidates, members and participants later), each of which owns
//! one ephemeral znode. A lease ends in exactly one of three ways: `DELETE`, a missed keepalive
//! (its TTL passes with no keepalive), or the loss of the ZooKeeper session it was born in.
//! When it ends, its `ended` token is cancelled; every holding listens to that token and deletes
//! its own znode, which wakes the next waiter through ZooKeeper at once. If zkgate itself dies,
//! ZooKeeper expires the session and removes the same znodes: no holding outlives both.
//!
//! Ended leases are remembered (a bounded number) so that their next use answers "gone, and
//! why" (HTTP 410) rather than "never heard of it" (404).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::auth::Caller;
use crate::zk::session::{Lanes, Unavailable, ZkSession};

/// How many ended leases are remembered for 410 answers.
const REMEMBERED_ENDED: usize = 100_000;

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

/// Why a lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// Its owner deleted it.
    Deleted,
    /// No keepalive arrived within its TTL.
    Expired,
    /// The ZooKeeper session it was bound to expired; its znodes went with it.
    SessionLost,
    /// The zkgate instance that held it shut down (SIGTERM) and released it on the way out.
    Shutdown,
}

impl EndReason {
    /// The reason as it is serialised (`deleted`, `expired`, `session_lost`).
    pub fn label(self) -> &'static str {
        match self {
            EndReason::Deleted => "deleted",
            EndReason::Expired => "expired",
            EndReason::SessionLost => "session_lost",
            EndReason::Shutdown => "shutdown",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            EndReason::Deleted => "the lease was deleted",
            EndReason::Expired => "the lease expired: no keepalive arrived within its TTL",
            EndReason::SessionLost => "the lease was lost with zkgate's ZooKeeper session, which expired",
            EndReason::Shutdown => "the zkgate instance that held the lease shut down and released it",
        }
    }
}

/// Errors of lease operations.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LeaseError {
    #[error("no lease with id `{0}`")]
    Unknown(String),
    #[error("lease `{id}` has ended: {}", reason.describe())]
    Ended { id: String, reason: EndReason },
    #[error(
        "lease `{id}` is held by the zkgate instance `{instance}`: HTTP requests are forwarded there, a socket must be on that instance"
    )]
    Elsewhere { id: String, instance: String },
    #[error("lease `{0}` belongs to another principal")]
    NotYours(String),
    #[error("at most {0} live leases per principal; delete or let expire one first")]
    TooMany(usize),
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
}

/// What a holding reports about itself, shown on the lease.
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct HoldingView {
    /// The kind of resource: `lock`.
    #[schema(example = "lock")]
    pub kind: &'static str,
    /// The resource's name.
    #[schema(example = "orders")]
    pub name: String,
    /// The handle to use for this holding.
    pub handle: String,
    /// `pending`, `waiting`, `held`, `lost` or `released`.
    #[schema(example = "held")]
    pub state: &'static str,
    /// The fencing token, once granted.
    pub fencing_token: Option<i64>,
    /// Someone asked the holder to give this up: release it when ready (before the grace, if
    /// one is given, runs out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revocation: Option<crate::recipes::revocation::Revocation>,
}

/// Something that a lease holds: it owns one ephemeral znode and cleans it up when the lease's
/// `ended` token is cancelled.
pub trait Holding: Send + Sync + 'static {
    fn view(&self) -> HoldingView;
    /// Becomes `true` once the holding's znode is gone (or was never created).
    fn finished(&self) -> watch::Receiver<bool>;
}

/// One lease.
pub struct Lease {
    pub id: String,
    /// The TTL granted.
    pub ttl: Duration,
    /// The TTL asked for, if one was (it may differ from `ttl` by the policy's clamping).
    pub requested_ttl: Option<Duration>,
    pub created_at: SystemTime,
    /// The instance's ZooKeeper session (lane) this lease lives on: everything it holds is
    /// created on it.
    pub zk: ZkSession,
    /// The generation of that session this lease is bound to.
    pub generation: u64,
    /// The principal that created it (`None` when auth is off); only it (or an admin) may use
    /// it, or anything held with it.
    pub owner: Option<String>,
    ended: CancellationToken,
    inner: Mutex<LeaseInner>,
}

struct LeaseInner {
    deadline: Instant,
    last_keepalive: SystemTime,
    holdings: Vec<Arc<dyn Holding>>,
}

impl Lease {
    /// Cancelled when the lease ends, for any reason.
    pub fn ended(&self) -> &CancellationToken {
        &self.ended
    }

    pub fn remaining(&self) -> Duration {
        self.lock().deadline.saturating_duration_since(Instant::now())
    }

    pub fn last_keepalive(&self) -> SystemTime {
        self.lock().last_keepalive
    }

    pub fn holdings(&self) -> Vec<HoldingView> {
        self.lock().holdings.iter().map(|h| h.view()).collect()
    }

    /// `Ok` if `caller` may use this lease and what it holds (its owner, or an admin).
    pub fn check_owner(&self, caller: &Caller) -> Result<(), LeaseError> {
        if caller.owns(self.owner.as_deref()) {
            Ok(())
        } else {
            Err(LeaseError::NotYours(self.id.clone()))
        }
    }

    /// The client of the lease's own session, on which whatever it holds is created (and read
    /// back in the same request: a session sees its own writes, another session served by
    /// another server of an ensemble might not yet).
    ///
    /// # Notable errors
    /// * [LeaseError::Ended] (`session_lost`) when that session has ended since the lease began.
    /// * [LeaseError::Unavailable] while ZooKeeper cannot be reached.
    pub async fn session(&self) -> Result<zookeeper_client::Client, LeaseError> {
        let session = self.zk.connected().await?;
        if session.generation != self.generation {
            return Err(LeaseError::Ended {
                id: self.id.clone(),
                reason: EndReason::SessionLost,
            });
        }
        Ok(session.client)
    }

    /// Attaches a holding; refused once the lease has ended, so nothing is attached to a lease
    /// that will never clean it up.
    pub fn attach(&self, holding: Arc<dyn Holding>) -> bool {
        let mut inner = self.lock();
        if self.ended.is_cancelled() {
            return false;
        }
        inner.holdings.push(holding);
        true
    }

    /// Forgets a holding that has released its znode.
    pub fn detach(&self, holding: &Arc<dyn Holding>) {
        self.lock().holdings.retain(|h| !Arc::ptr_eq(h, holding));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LeaseInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
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
    ended: HashMap<String, EndReason>,
    ended_order: VecDeque<String>,
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
        let lease = Arc::new(Lease {
            id: crate::ids::owned_id(&self.inner.instance),
            ttl,
            requested_ttl,
            created_at: SystemTime::now(),
            zk: lane.clone(),
            generation: session.generation,
            owner,
            ended: CancellationToken::new(),
            inner: Mutex::new(LeaseInner {
                deadline: Instant::now() + ttl,
                last_keepalive: SystemTime::now(),
                holdings: Vec::new(),
            }),
        });
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
        let mut inner = lease.lock();
        inner.deadline = Instant::now() + lease.ttl;
        inner.last_keepalive = SystemTime::now();
        drop(inner);
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
        wait_holdings_finished(&lease).await;
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
        table.ended_order.push_back(id.to_string());
        if table.ended_order.len() > REMEMBERED_ENDED
            && let Some(oldest) = table.ended_order.pop_front()
        {
            table.ended.remove(&oldest);
        }
        drop(table);
        // Cancel while holding the lease's own lock so that `attach` cannot slip in after.
        let _inner = lease.lock();
        lease.ended.cancel();
        tracing::info!(lease = %id, ?reason, "lease ended");
        crate::metrics::get()
            .leases_ended
            .with_label_values(&[reason.label()])
            .inc();
        Some(lease.clone())
    }
}

async fn wait_holdings_finished(lease: &Lease) {
    let holdings: Vec<_> = lease.lock().holdings.iter().map(|h| h.finished()).collect();
    let all = futures::future::join_all(holdings.into_iter().map(|mut done| async move {
        let _ = done.wait_for(|finished| *finished).await;
    }));
    // A holding whose delete cannot reach ZooKeeper gives up when the session does; do not
    // keep the caller longer than that.
    let _ = tokio::time::timeout(Duration::from_secs(10), all).await;
}

/// Sleeps until the lease's deadline, re-reading it after each keepalive; ends it if it passed.
async fn expire_when_silent(registry: Weak<Registry>, lease: Arc<Lease>) {
    loop {
        let deadline = lease.lock().deadline;
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            _ = lease.ended.cancelled() => return,
        }
        if lease.lock().deadline <= Instant::now() {
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
