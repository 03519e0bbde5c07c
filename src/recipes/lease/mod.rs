//! A lease as the recipes see it: the owner of the ephemeral znodes created on its behalf, on one
//! ZooKeeper session, ending once (etcd's `concurrency.Session` plays this part for its
//! recipes).
//!
//! A lease has an unguessable id, a TTL and the set of *holdings* created for it (lock
//! contenders, permits, election candidates, group members, barrier participants), each of
//! which owns ephemeral znodes on the lease's session. When the lease ends, its `ended` token is
//! cancelled; every holding listens to that token and deletes its own znodes, which wakes the
//! next waiter through ZooKeeper at once. If zkgate itself dies, ZooKeeper expires the session
//! and removes the same znodes: no holding outlives both.
//!
//! How leases are made, kept alive, expired and looked up is the registry's business
//! ([crate::lease], a layer up); this file holds only what a recipe needs of one.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::auth::Caller;
use crate::recipes::revocation::Revocation;
use crate::zk::session::{Unavailable, ZkSession};

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

/// What became of a lease, as the registry that made it knows (only the instance that holds a
/// lease does): `None` while it lives or when it is unknown here. A topic asks it to tell a
/// holding that was lost from one that was released.
pub type Fate = Arc<dyn Fn(&str) -> Option<EndReason> + Send + Sync>;

/// What a holding reports about itself, shown on the lease.
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct HoldingView {
    /// The kind of resource (a socket topic's name): `lock`, `rwlock`, `semaphore`,
    /// `election`, `group`, `barrier`, `double_barrier`, `txn`.
    #[schema(value_type = String, example = "lock")]
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
    pub revocation: Option<Revocation>,
}

/// Something that a lease holds: it owns ephemeral znodes and cleans them up when the lease's
/// `ended` token is cancelled (see [crate::recipes::handle]).
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
    /// Why it ended, once it has.
    end_reason: std::sync::OnceLock<EndReason>,
    inner: Mutex<LeaseInner>,
}

struct LeaseInner {
    deadline: Instant,
    last_keepalive: SystemTime,
    holdings: Vec<Arc<dyn Holding>>,
}

impl Lease {
    /// A new lease with `ttl` on `zk`'s session of `generation`, owned by `owner`.
    pub fn new(
        id: String,
        ttl: Duration,
        requested_ttl: Option<Duration>,
        zk: ZkSession,
        generation: u64,
        owner: Option<String>,
    ) -> Lease {
        Lease {
            id,
            ttl,
            requested_ttl,
            created_at: SystemTime::now(),
            zk,
            generation,
            owner,
            ended: CancellationToken::new(),
            end_reason: std::sync::OnceLock::new(),
            inner: Mutex::new(LeaseInner {
                deadline: Instant::now() + ttl,
                last_keepalive: SystemTime::now(),
                holdings: Vec::new(),
            }),
        }
    }

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

    /// That the lease's session was alive after this was called: a `sync` on it, which
    /// ZooKeeper refuses once it has expired the session (perhaps before this instance has
    /// heard). A read of the lease or of what it holds confirms it first, so that it never
    /// shows as alive a lease whose znodes another session may already have replaced.
    ///
    /// # Notable errors
    /// * [LeaseError::Ended] (`session_lost`) when the session has ended.
    /// * [LeaseError::Unavailable] while ZooKeeper cannot be reached.
    pub async fn confirm(&self) -> Result<(), LeaseError> {
        let session = self.zk.connected().await?;
        let ended = || LeaseError::Ended {
            id: self.id.clone(),
            reason: EndReason::SessionLost,
        };
        if session.generation != self.generation {
            return Err(ended());
        }
        match session.sync().await {
            Ok(()) => Ok(()),
            Err(zookeeper_client::Error::SessionExpired) => Err(ended()),
            Err(_) => Err(Unavailable::Disconnected.into()),
        }
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

    /// Waits until every holding has removed its znodes, or `limit` passes (a holding whose
    /// delete cannot reach ZooKeeper gives up when the session does: do not keep the caller
    /// longer than that).
    pub async fn holdings_finished(&self, limit: Duration) {
        let holdings: Vec<_> = self.lock().holdings.iter().map(|h| h.finished()).collect();
        let all = futures::future::join_all(holdings.into_iter().map(|mut done| async move {
            let _ = done.wait_for(|finished| *finished).await;
        }));
        let _ = tokio::time::timeout(limit, all).await;
    }

    /// When the lease expires unless kept alive.
    pub fn deadline(&self) -> Instant {
        self.lock().deadline
    }

    /// Pushes the deadline one TTL into the future (a keepalive).
    pub fn renew(&self) {
        let mut inner = self.lock();
        inner.deadline = Instant::now() + self.ttl;
        inner.last_keepalive = SystemTime::now();
    }

    /// Ends the lease for `reason`: its holdings remove their znodes (and, unless its owner
    /// deleted it, say they lost what they held). Cancelled under the lease's own lock, so that
    /// [Lease::attach] cannot slip a holding in after the end.
    pub fn end(&self, reason: EndReason) {
        let _inner = self.lock();
        let _ = self.end_reason.set(reason);
        self.ended.cancel();
    }

    /// Why the lease ended (`None` while it lives).
    pub fn end_reason(&self) -> Option<EndReason> {
        self.end_reason.get().copied()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LeaseInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}
