//! A lease as the recipes see it: the owner of the znodes created on its behalf, kept by one
//! instance at a time, ending once (etcd's `concurrency.Session` plays this part for its
//! recipes).
//!
//! A lease is ZooKeeper data ([record]): its record `<root>/leases/<id>` says its TTL, its
//! principal and which instance keeps it now (its *keeper*), and every holding made for it (a
//! lock contender, a permit, an election candidate, a group member, a barrier participant...)
//! is a persistent znode created in one multi-op with a child of the record naming it. So
//! whatever a lease holds is found from ZooKeeper, and outlives the instance that made it.
//!
//! This type is the keeper's side: the lease in the memory of the one instance that times it.
//! Each write made for the lease checks the record's version as this instance keeps it
//! ([Lease::guard]): an instance that lost the lease to another (see [record::take_over]) can
//! write nothing more for it. The lease ends once ([Lease::end]): its `ended` token is
//! cancelled and every holding deletes its znodes, which wakes the next waiter through
//! ZooKeeper at once. When another instance takes it over, [Lease::drop_here] stops its
//! holdings here without touching their znodes, which the new keeper now looks after.
//!
//! **Every instance a peer.** What a lease holds is made and driven by the instance the request
//! arrived at, not only by its keeper: an instance that does not keep the lease *visits* it
//! ([Lease::visiting]), a copy made from its record with no TTL clock. Its writes are guarded
//! by the record's version as read, like the keeper's, so a visitor too can write nothing for a
//! lease that ended or moved meanwhile; a refused guard reads the record again
//! ([Lease::refresh]) and goes on if the lease only changed keeper. Each holding record records the
//! instance that drives its holding ([record::HoldingRecord::driver]), so that a new keeper
//! leaves a live driver's holdings to it, and the keeper that ends the lease ends those too.
//!
//! How leases are made, kept alive, expired, handed over and looked up is the registry's
//! business ([crate::recipes::leases], a layer up); this module holds only what a recipe needs of one.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::zk::Multi;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client::{CreateMode, Error as ZkError};

use super::record;
pub use super::record::EndReason;
use super::revocation::Revocation;
use crate::auth::Caller;
use crate::locked::Locked;
use crate::zk::session::{Session, Unavailable, ZkSession};

/// Errors of lease operations.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LeaseError {
    #[error("no lease with id `{0}`")]
    Unknown(String),
    #[error("lease `{id}` has ended: {}", reason.describe())]
    Ended { id: String, reason: EndReason },
    #[error("lease `{id}` is kept by the zkgate instance `{keeper}`")]
    Elsewhere { id: String, keeper: String },
    #[error("lease `{0}` belongs to another principal")]
    NotYours(String),
    #[error("a lease holds what its principal writes, and this principal may write nothing")]
    ReadOnly,
    #[error("at most {0} live leases per principal; delete or let expire one first")]
    TooMany(usize),
    #[error(
        "this instance cannot vouch for the leases it keeps right now (its ZooKeeper session is behind); try again, or another instance"
    )]
    NotFresh,
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// Its creation's idempotency key was used by another request, or its record passes a
    /// quota.
    #[error(transparent)]
    Key(crate::recipes::idempotency::KeyError),
}

/// What became of a lease, as this instance knows (the instance that ended a lease does):
/// `None` while it lives or when it is unknown here. A topic asks it to tell a holding that was
/// lost from one that was released.
pub type WhyEnded = Arc<dyn Fn(&str) -> Option<EndReason> + Send + Sync>;

/// A holding's `kind` in the spec: the name of a kind, every one listed from the registry (a
/// list written by hand here missed kinds added later).
fn kind_name_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .description(Some(
            "The kind of resource, by its name (as its socket topic names it).",
        ))
        .enum_values(Some(crate::kind::Kind::ALL.map(crate::kind::Kind::name)))
        .examples(["lock"])
        .build()
}

/// What a holding reports about itself, shown on the lease.
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct HoldingView {
    /// The kind of resource, by its name (as its socket topic names it).
    #[schema(schema_with = kind_name_schema)]
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

/// Something that a lease holds: it owns znodes and cleans them up when the lease's `ended`
/// token is cancelled (see [crate::recipes::engine::handle]).
pub trait Holding: Send + Sync + 'static {
    /// How it shows on the lease; `None` for what is not shown (a lock set's record: its locks
    /// are).
    fn view(&self) -> Option<HoldingView>;
    /// Becomes `true` once the holding's task is over: its znode gone (or never created), or
    /// left to another keeper.
    fn finished(&self) -> watch::Receiver<bool>;
    /// The name of its holding record under the lease's record.
    fn record_name(&self) -> String;
}

/// Whether the lease's record is in ZooKeeper yet, and at which version.
#[derive(Clone, Debug)]
enum Written {
    /// Not yet: it is created in the same multi-op as the first thing the lease holds (a lock
    /// acquired without a lease makes the lease and the contender in one write).
    Pending(Vec<u8>),
    /// At this version, as this instance keeps it.
    At(i32),
}

/// What [Lease::guard] added to a multi-op, for [Lease::guarded].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guard {
    /// The record's creation.
    Creates,
    /// A check of the record's version.
    Checks,
}

/// One lease, as its keeper holds it.
pub struct Lease {
    pub id: String,
    /// The TTL granted.
    pub ttl: Duration,
    /// The TTL asked for, if one was (it may differ from `ttl` by the policy's clamping).
    pub requested_ttl: Option<Duration>,
    pub created_at: SystemTime,
    /// How long the locks it holds stay held after it expired (zero: none). See
    /// [Lease::delayed_until].
    pub lock_delay: Duration,
    /// The instance's session (lane) the lease's writes go through while kept here, so that
    /// they keep their order. Not bound to one session of it: the holdings are persistent.
    pub zk: ZkSession,
    /// Its record, `<root>/leases/<id>`; the holding records are its children.
    pub path: String,
    /// The principal that created it (`None` when auth is off); only it (or an admin) may use
    /// it, or anything held with it.
    pub principal: Option<String>,
    /// The instance this copy of the lease lives in: the driver its holdings record.
    pub here: Arc<str>,
    /// Visited, not kept: another instance keeps its TTL clock; this copy only drives what
    /// requests here made for it (see the module's docs).
    visiting: bool,
    ended: CancellationToken,
    dropped: CancellationToken,
    /// Why it ended, once it has.
    end_reason: std::sync::OnceLock<EndReason>,
    /// When it ended, once it has (as its record says, when it ended elsewhere).
    ended_at: std::sync::OnceLock<SystemTime>,
    /// Held while its end is written: see [Lease::ending].
    ending: tokio::sync::Mutex<()>,
    inner: Mutex<LeaseInner>,
}

struct LeaseInner {
    written: Written,
    deadline: Instant,
    last_keepalive: SystemTime,
    holdings: Vec<Arc<dyn Holding>>,
}

/// How a [Lease] comes to be kept here.
pub struct Kept {
    pub id: String,
    pub ttl: Duration,
    pub requested_ttl: Option<Duration>,
    pub created_at: SystemTime,
    pub path: String,
    pub principal: Option<String>,
    pub lock_delay: Duration,
    /// When it ended, for a lease adopted from a tombstone (ms since the Unix epoch).
    pub ended_ms: Option<i64>,
    /// The record's version, or `None` for a new lease whose record is written with its first
    /// holding (its data given here).
    pub version: Result<i32, Vec<u8>>,
    /// When it expires unless kept alive.
    pub deadline: Instant,
    /// This instance's id.
    pub here: Arc<str>,
}

impl Lease {
    /// A lease kept here on `zk`'s session.
    pub fn new(kept: Kept, zk: ZkSession) -> Lease {
        Lease::made(kept, zk, false)
    }

    /// A lease kept by another instance, visited here to make and drive holdings for requests
    /// that arrive here, from its record as read at `kept.version`. Its deadline means nothing:
    /// the keeper times it. It ends here when its record says it ended ([Lease::refresh]).
    pub fn visiting(kept: Kept, zk: ZkSession) -> Lease {
        Lease::made(kept, zk, true)
    }

    fn made(kept: Kept, zk: ZkSession, visiting: bool) -> Lease {
        let ended_at = std::sync::OnceLock::new();
        if let Some(ms) = kept.ended_ms {
            let _ = ended_at.set(crate::time::from_millis(ms));
        }
        Lease {
            lock_delay: kept.lock_delay,
            ended_at,
            id: kept.id,
            ttl: kept.ttl,
            requested_ttl: kept.requested_ttl,
            created_at: kept.created_at,
            zk,
            path: kept.path,
            principal: kept.principal,
            here: kept.here,
            visiting,
            ended: CancellationToken::new(),
            dropped: CancellationToken::new(),
            end_reason: std::sync::OnceLock::new(),
            ending: tokio::sync::Mutex::new(()),
            inner: Mutex::new(LeaseInner {
                written: match kept.version {
                    Ok(version) => Written::At(version),
                    Err(data) => Written::Pending(data),
                },
                deadline: kept.deadline,
                last_keepalive: SystemTime::now(),
                holdings: Vec::new(),
            }),
        }
    }

    /// Cancelled when the lease ends, for any reason.
    pub fn ended(&self) -> &CancellationToken {
        &self.ended
    }

    /// Cancelled when this instance stops keeping the lease without ending it (another took it
    /// over, or this one is shutting down): its holdings stop here and leave their znodes.
    pub fn dropped(&self) -> &CancellationToken {
        &self.dropped
    }

    /// Whether this is a visited copy of a lease another instance keeps.
    pub fn is_visiting(&self) -> bool {
        self.visiting
    }

    /// How many holdings are attached here.
    pub fn attached(&self) -> usize {
        self.lock().holdings.len()
    }

    /// The holding record names of the holdings attached here.
    pub fn attached_records(&self) -> Vec<String> {
        self.lock().holdings.iter().map(|h| h.record_name()).collect()
    }

    /// Reads the record again after a guard of this visited lease was refused, or its watch
    /// fired: `true` if the lease lives on (it changed keeper: the version read is the one to
    /// guard with from now on); `false` if it ended (then it ends here too, with the record's
    /// reason) or its record is gone.
    ///
    /// # Notable errors
    /// * The read's, when ZooKeeper cannot be asked.
    pub async fn refresh(&self, client: &zookeeper_client::Client) -> Result<bool, ZkError> {
        let found = record::read(client, &self.path).await?;
        Ok(self.take_note(found.as_ref()))
    }

    /// Takes note of the record as read (`None`: gone): see [Lease::refresh].
    pub fn take_note(&self, found: Option<&record::Found>) -> bool {
        match found {
            Some(found) if found.record.ended.is_none() => {
                self.lock().written = Written::At(found.version);
                true
            }
            Some(found) => {
                if let Some(ms) = found.record.ended_ms {
                    let _ = self.ended_at.set(crate::time::from_millis(ms));
                }
                self.end(found.record.ended.unwrap_or(EndReason::Expired));
                false
            }
            None => {
                self.end(EndReason::Expired);
                false
            }
        }
    }

    /// Whether this instance keeps the lease no more, ended or not.
    pub fn is_gone(&self) -> bool {
        self.ended.is_cancelled() || self.dropped.is_cancelled()
    }

    pub fn remaining(&self) -> Duration {
        self.lock().deadline.saturating_duration_since(Instant::now())
    }

    pub fn last_keepalive(&self) -> SystemTime {
        self.lock().last_keepalive
    }

    pub fn holdings(&self) -> Vec<HoldingView> {
        self.lock().holdings.iter().filter_map(|h| h.view()).collect()
    }

    /// `Ok` if `caller` may use this lease and what it holds (its owner, or an admin).
    pub fn check_owner(&self, caller: &Caller) -> Result<(), LeaseError> {
        if caller.owns(self.principal.as_deref()) {
            Ok(())
        } else {
            Err(LeaseError::NotYours(self.id.clone()))
        }
    }

    /// The lease's session (whatever its generation: what the lease holds is persistent, so a
    /// new session of the lane serves it as well as the old one did).
    ///
    /// # Notable errors
    /// * [Unavailable] while ZooKeeper cannot be reached.
    pub async fn session(&self) -> Result<Session, Unavailable> {
        self.zk.connected().await
    }

    /// The record's version as kept here; `None` before the record is written.
    pub fn version(&self) -> Option<i32> {
        match self.lock().written {
            Written::At(version) => Some(version),
            Written::Pending(_) => None,
        }
    }

    /// Adds to `multi`, first (tagged `tag`), what makes a write for this lease conditional on this instance
    /// still keeping it: the record's creation if it is not written yet, else a check of its
    /// version. Report the commit's outcome to [Lease::guarded].
    pub fn guard<T>(&self, multi: &mut Multi<'_, T>, tag: T) -> Result<Guard, ZkError> {
        match &self.lock().written {
            Written::Pending(data) => {
                multi.create(
                    tag,
                    &self.path,
                    data,
                    &CreateMode::Persistent.with_acls(crate::zk::acls()),
                )?;
                Ok(Guard::Creates)
            }
            Written::At(version) => {
                multi.check(tag, &self.path, *version)?;
                Ok(Guard::Checks)
            }
        }
    }

    /// Takes note of the outcome of a multi-op that began with `guard`: `Ok(true)` if it
    /// applied (`refused`: `None`); `Ok(false)` if it is to be sent again (the record was
    /// created meanwhile, by another holding's write or by this one's whose reply was lost);
    /// `Err` with the guard's own refusal otherwise. A failed check means that this instance
    /// no longer keeps the lease: [crate::recipes::engine::handle::NotCreated::LeaseMoved].
    pub fn guarded(&self, guard: Guard, refused: Option<ZkError>) -> Result<bool, GuardError> {
        match (guard, refused) {
            (Guard::Creates, None) => {
                self.set_written(0);
                Ok(true)
            }
            (Guard::Checks, None) => Ok(true),
            (Guard::Creates, Some(ZkError::NodeExists)) => {
                // Its id is unguessable: a record there is this lease's own.
                self.set_written(0);
                Ok(false)
            }
            (_, Some(ZkError::NoNode | ZkError::BadVersion)) => Err(GuardError::LeaseMoved),
            (_, Some(err)) => Err(GuardError::ZooKeeper(err)),
        }
    }

    fn set_written(&self, version: i32) {
        let mut inner = self.lock();
        if matches!(inner.written, Written::Pending(_)) {
            inner.written = Written::At(version);
        }
    }

    /// The znode under its record named `record_name` (see [record::record_name]).
    pub fn record_path(&self, record_name: &str) -> String {
        format!("{}/{}", self.path, record_name)
    }

    /// Attaches a holding; refused once the lease has ended or left this instance, so nothing
    /// is attached to a lease that will never clean it up here.
    pub fn attach(&self, holding: Arc<dyn Holding>) -> bool {
        let mut inner = self.lock();
        if self.is_gone() {
            return false;
        }
        inner.holdings.push(holding);
        true
    }

    /// Forgets a holding that has released its znode.
    pub fn detach(&self, holding: &Arc<dyn Holding>) {
        self.lock().holdings.retain(|h| !Arc::ptr_eq(h, holding));
    }

    /// Waits until every holding's task is over, or `limit` passes (a holding whose delete
    /// cannot reach ZooKeeper keeps trying: do not keep the caller longer than that).
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
        inner.deadline = inner.deadline.max(Instant::now() + self.ttl);
        inner.last_keepalive = SystemTime::now();
    }

    /// Ends the lease for `reason`: its holdings remove their znodes (and, unless its owner
    /// deleted it, say they lost what they held). Cancelled under the lease's own lock, so that
    /// [Lease::attach] cannot slip a holding in after the end.
    pub fn end(&self, reason: EndReason) {
        let _inner = self.lock();
        let _ = self.end_reason.set(reason);
        let _ = self.ended_at.set(SystemTime::now());
        self.ended.cancel();
    }

    /// Until when what it held as a lock stays held by it, ended: its end plus its lock-delay,
    /// if it ended by expiry (its holder was cut off, and may still be writing) and asked for
    /// one. `None` for a lease that lives, was deleted (its holder let go), or has no delay.
    pub fn delayed_until(&self) -> Option<SystemTime> {
        let expired = self.end_reason() == Some(EndReason::Expired);
        let ended = self
            .ended_at
            .get()
            .copied()
            .filter(|_| expired && !self.lock_delay.is_zero())?;
        Some(ended + self.lock_delay)
    }

    /// Stops keeping the lease here without ending it: its holdings stop and leave their znodes
    /// to the instance that keeps it now.
    pub fn drop_here(&self) {
        let _inner = self.lock();
        self.dropped.cancel();
    }

    /// Why the lease ended (`None` while it lives).
    pub fn end_reason(&self) -> Option<EndReason> {
        self.end_reason.get().copied()
    }

    /// One end of this lease at a time: its TTL's timer and a delete may come at once, and
    /// each would write the end from the version of the record it kept; whichever came second
    /// found the record changed. Holding this while writing and finishing, the second finds
    /// the lease ended ([Lease::end_reason]) and answers as it ended.
    pub async fn ending(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.ending.lock().await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LeaseInner> {
        self.inner.locked()
    }
}

/// Why a write guarded by [Lease::guard] was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardError {
    /// The record's version changed or it is gone: another instance keeps the lease now, or it
    /// ended. Nothing was written.
    LeaseMoved,
    ZooKeeper(ZkError),
}

impl From<LeaseError> for crate::problem::ApiError {
    fn from(err: LeaseError) -> crate::problem::ApiError {
        use crate::problem::{ApiError, Problem};
        let message = err.to_string();
        match err {
            LeaseError::Unknown(_) => ApiError::not_found("lease", message),
            // The hand-off guard serves a request where its lease is kept: this is a race with a
            // takeover, which a retry settles.
            LeaseError::Elsewhere { .. } => {
                ApiError::new(Problem::InstanceUnavailable, format!("{message}; try again"))
            }
            LeaseError::NotFresh => ApiError::unavailable(message),
            LeaseError::Ended { reason, .. } => ApiError::new(Problem::LeaseEnded, message).with("reason", reason),
            LeaseError::NotYours(_) | LeaseError::ReadOnly => ApiError::new(Problem::Forbidden, message),
            LeaseError::TooMany(_) => ApiError::new(Problem::TooMany, message),
            LeaseError::Unavailable(u) => ApiError::from(u),
            LeaseError::Key(err) => err.into(),
        }
    }
}
