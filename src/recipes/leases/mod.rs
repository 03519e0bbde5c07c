//! The leases this instance keeps: zkgate's handle for an HTTP client, the way an etcd lease or
//! a ZooKeeper session is for a native client.
//!
//! Why this file is long (about 600 lines with its tests): it is the table of kept leases and
//! the operations that change it, under one lock; what is not the table is split by concept
//! into the modules below.
//!
//! A lease is ZooKeeper data ([crate::recipes::engine::record]); this registry is its *keeper's*
//! side: the instance that times a lease keeps it in memory ([Lease]) with its TTL timer and
//! the tasks of what it holds. It makes leases (round robin over the instance's sessions, at
//! most so many per principal, idempotent with a key: [Leases::create_keyed]), keeps them alive in memory (a keepalive
//! writes nothing to ZooKeeper), ends them (`DELETE`, or a TTL with no keepalive) with one write
//! conditional on the record's version, and takes over leases whose keeper is gone or does not
//! answer ([takeover]).
//!
//! # The contract
//! Consul's, taken from Chubby: **a TTL is a lower bound**. A lease never ends before its TTL
//! has passed since the last keepalive any instance acknowledged; it ends at that moment while
//! its keeper lives, and otherwise at most [FRESH] plus one TTL after the keeper was last seen
//! alive (and not before the survivors notice it gone: see [reaper]). What makes the lower
//! bound hold across instances ([keeping]):
//! - a keeper acknowledges a keepalive only while it is *fresh*: its last heartbeat write (one
//!   a second, not one per keepalive) was sent less than [FRESH] ago and answered, and it is
//!   registered. Every takeover of one of its leases leaves a notice it watches, which ZooKeeper
//!   delivers before the reply to any later heartbeat: a fresh keeper knows of every takeover
//!   older than [FRESH];
//! - so an instance that takes a lease over gives it until [FRESH] plus its TTL after the former
//!   keeper's last heartbeat (its node's `mtime`, ZooKeeper's clock): no keepalive that keeper
//!   acknowledged can be later than that.
//!
//! Ended leases are remembered here (a bounded number), and their records stay a while in
//! ZooKeeper as tombstones, so that their next use answers "gone, and why" (HTTP 410) rather
//! than "never heard of it" (404), on any instance.
//!
//! Here the table of kept leases and its operations; how a lease ends (its TTL timer, the end
//! written, the tombstone) in [ending], vouching in [keeping], takeovers in [takeover], the
//! leases of instances gone in [reaper].

mod answers;
mod ending;
pub mod keeping;
pub mod reaper;
pub mod takeover;
pub use answers::moved;
mod views;
pub use views::{CreateLease, LeaseSummary, LeaseView, create};
mod visiting;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::Instant;

use crate::auth::Caller;
use crate::locked::{Locked, count_down};
pub use crate::recipes::engine::lease::{EndReason, HoldingView, Lease, LeaseError};
use crate::recipes::engine::lease::{Kept, WhyEnded};
use crate::recipes::engine::record::{self, HoldingRecord, LeaseRecord};
use crate::recipes::idempotency::{KeyError, Keyed};
use crate::zk::session::Lanes;

/// How long an instance goes on acknowledging keepalives after its last heartbeat was sent (and
/// answered); also the margin a takeover adds after the former keeper's last heartbeat.
pub const FRESH: Duration = Duration::from_secs(3);

/// How often an instance writes its heartbeat.
pub const HEARTBEAT: Duration = Duration::from_secs(1);

/// How long the record of an ended lease stays, so that its next use answers why it ended.
pub const TOMBSTONE: Duration = Duration::from_secs(60);

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

/// Takes over the tasks of what an adopted lease holds (the handles of every kind live a layer
/// below, in the registries the composition root makes).
pub type Adopter = Arc<dyn Fn(&Arc<Lease>, Vec<(String, HoldingRecord)>) + Send + Sync>;

/// The registry of the leases this instance keeps.
#[derive(Clone)]
pub struct Leases {
    inner: Arc<Registry>,
}

struct Registry {
    policy: LeasePolicy,
    /// This instance's id: the keeper named in the records of its leases.
    instance: Arc<str>,
    root: String,
    max_per_owner: usize,
    lanes: Lanes,
    table: Mutex<Table>,
    /// The leases other instances keep that requests here hold something with (see
    /// [visiting]): one copy each while something here uses it.
    visitors: Mutex<HashMap<String, visiting::Visit>>,
    adopter: OnceLock<Adopter>,
    keeping: keeping::Keeping,
    /// Taking a lease over is one at a time per lease here (striped by its id's hash): the
    /// reaper and a client's request racing for the same lease would otherwise see each other's
    /// write as another instance's ([Leases::keep_taken_over]).
    adopting: [tokio::sync::Mutex<()>; ADOPTING_STRIPES],
}

/// How many locks [Registry::adopting] stripes over.
const ADOPTING_STRIPES: usize = 64;

#[derive(Default)]
struct Table {
    live: HashMap<String, Arc<Lease>>,
    ended: crate::remembered::Remembered<String, EndReason>,
    /// Live leases per owner (`None`: auth off), for the per-principal limit.
    per_owner: HashMap<Option<String>, usize>,
}

/// What to make of a new lease.
pub struct NewLease<'a> {
    pub ttl: Option<Duration>,
    /// How long the locks it holds stay held after it expires (zero: none; bounded by
    /// `--max-lock-delay` before it gets here).
    pub lock_delay: Duration,
    /// With an idempotency key: its record and the key's are written together, so that a
    /// retry (through any instance) finds the lease the first request made.
    pub key: Option<Keyed<'a>>,
    /// Its record is written with the first thing it holds (see [Lease::guard]): a lease made
    /// for one request that holds something at once costs no write of its own. (Not with a key.)
    pub with_first_holding: bool,
}

/// What a creation came to.
pub enum Created {
    New(Arc<Lease>),
    /// A request with the same idempotency key made this lease before (it may have ended since,
    /// or be kept elsewhere).
    Before(String),
}

impl Leases {
    /// Creates the registry and starts keeping: the heartbeat, the notices of takeovers, and
    /// the check of every kept lease after a new session, on the keeper's session apart
    /// ([Lanes::keeper]). `registered` says whether that session's registration is in place
    /// (a keeper vouches for its leases only then).
    pub fn new(
        policy: LeasePolicy,
        max_per_owner: usize,
        instance: Arc<str>,
        root: &str,
        lanes: Lanes,
        registered: watch::Receiver<bool>,
    ) -> Leases {
        let inner = Arc::new(Registry {
            policy,
            instance: instance.clone(),
            root: root.to_string(),
            max_per_owner,
            lanes: lanes.clone(),
            table: Mutex::default(),
            visitors: Mutex::default(),
            adopter: OnceLock::new(),
            keeping: keeping::Keeping::new(registered, lanes.keeper().session.clone()),
            adopting: std::array::from_fn(|_| tokio::sync::Mutex::new(())),
        });
        // On the keeper's session and thread, apart from request traffic (see `Apart`).
        let apart = lanes.keeper();
        apart
            .runtime
            .spawn(keeping::run(Arc::downgrade(&inner), apart.session.clone()));
        Leases { inner }
    }

    /// Sets what takes over the holdings of an adopted lease (once, at start).
    pub fn set_adopter(&self, adopter: Adopter) {
        let _ = self.inner.adopter.set(adopter);
    }

    /// This instance's id.
    pub fn instance(&self) -> &str {
        &self.inner.instance
    }

    /// Whether this instance vouches for its leases now (see the module's docs).
    pub fn is_fresh(&self) -> bool {
        self.inner.keeping.is_fresh()
    }

    /// Returns after this instance's next heartbeat that counts (by then it has acted on every
    /// notice of a takeover older than that heartbeat).
    pub async fn next_heartbeat(&self) {
        self.inner.keeping.next_beat().await
    }

    /// Returns once this instance vouches for its leases (registered, and a heartbeat answered).
    pub async fn wait_fresh(&self) {
        self.inner.keeping.fresh().await
    }

    /// Creates a lease kept here, on the next connected lane (round robin), owned by `caller`.
    /// With an idempotency key, a retry of the same request (by the same principal, through any
    /// instance) finds the lease the first one created ([Created::Before]).
    ///
    /// # Notable errors
    /// * [LeaseError::ReadOnly] for a principal that may write nothing (and so hold nothing).
    /// * [LeaseError::TooMany] past the per-principal limit.
    /// * [LeaseError::NotFresh] while this instance cannot vouch for its leases.
    /// * [LeaseError::Unavailable] while ZooKeeper cannot be reached.
    /// * [LeaseError::Key] for a key another request used, or a record past a quota.
    pub async fn create_keyed(&self, caller: &Caller, new: NewLease<'_>) -> Result<Created, LeaseError> {
        // A lease costs a record in ZooKeeper: only for a principal that may hold something.
        let writes = crate::kind::Kind::ALL
            .iter()
            .any(|kind| caller.may_some(kind.auth(), crate::auth::Access::Write));
        if !writes {
            return Err(LeaseError::ReadOnly);
        }
        if !self.is_fresh() {
            return Err(LeaseError::NotFresh);
        }
        let (lane, _) = self.inner.lanes.pick()?;
        let owner = caller.name().map(str::to_string);
        let ttl = self.inner.policy.grant(new.ttl);
        let id = crate::ids::owned_id(&self.inner.instance);
        let path = record::path(&self.inner.root, &id);
        let created_at = SystemTime::now();
        let written = self
            .inner
            .record(ttl, new.ttl, owner.clone(), created_at, new.lock_delay);
        {
            let mut table = self.inner.table();
            let held = table.per_owner.get(&owner).copied().unwrap_or(0);
            if held >= self.inner.max_per_owner {
                return Err(LeaseError::TooMany(self.inner.max_per_owner));
            }
            *table.per_owner.entry(owner.clone()).or_default() += 1;
        }
        let version = match (new.key, new.with_first_holding) {
            (Some(keyed), _) => match self.inner.write_keyed(lane, &path, &written, &id, keyed).await {
                Ok(None) => Ok(0),
                Ok(Some(before)) => {
                    count_down(&mut self.inner.table().per_owner, &owner);
                    return Ok(Created::Before(before));
                }
                Err(err) => {
                    count_down(&mut self.inner.table().per_owner, &owner);
                    return Err(err);
                }
            },
            (None, true) => Err(written.to_bytes()),
            (None, false) => match self.inner.write_record(lane, &path, &written).await {
                Ok(version) => Ok(version),
                Err(err) => {
                    count_down(&mut self.inner.table().per_owner, &owner);
                    return Err(err);
                }
            },
        };
        let lease = Arc::new(Lease::new(
            Kept {
                id,
                ttl,
                requested_ttl: new.ttl,
                created_at,
                path,
                principal: owner,
                lock_delay: new.lock_delay,
                ended_ms: None,
                version,
                deadline: Instant::now() + ttl,
                here: self.inner.instance.clone(),
            },
            lane.clone(),
        ));
        self.inner.table().live.insert(lease.id.clone(), lease.clone());
        self.inner.start_timer(&lease);
        crate::metrics::get().leases_created.inc();
        Ok(Created::New(lease))
    }

    /// [Leases::create_keyed] of a lease without a key: always a new one.
    pub async fn create(&self, caller: &Caller, new: NewLease<'_>) -> Result<Arc<Lease>, LeaseError> {
        match self.create_keyed(caller, NewLease { key: None, ..new }).await? {
            Created::New(lease) => Ok(lease),
            // Only a key finds an earlier lease.
            Created::Before(id) => Err(LeaseError::Unknown(id)),
        }
    }

    /// The live lease with this id kept here, if `caller` owns it.
    ///
    /// # Notable errors
    /// * [LeaseError::Ended] for a lease that ended here (deleted or expired).
    /// * [LeaseError::Unknown] for a lease not kept here (see [Leases::find]).
    /// * [LeaseError::NotYours] for another principal's lease.
    /// * [LeaseError::NotFresh] while this instance cannot vouch for the leases it keeps.
    pub fn get(&self, caller: &Caller, id: &str) -> Result<Arc<Lease>, LeaseError> {
        let table = self.inner.table();
        if let Some(lease) = table.live.get(id) {
            lease.check_owner(caller)?;
            if !self.is_fresh() {
                return Err(LeaseError::NotFresh);
            }
            return Ok(lease.clone());
        }
        match table.ended.get(id) {
            Some(&reason) => Err(ended(id, reason)),
            None => Err(LeaseError::Unknown(id.to_string())),
        }
    }

    /// [Leases::get], or for a lease not kept here, what its record says: ended (and why),
    /// kept by another instance ([LeaseError::Elsewhere]), or unknown. A lease whose record
    /// names this instance but that is not in its memory (a takeover undone by another) is
    /// taken over again.
    pub async fn find(&self, caller: &Caller, id: &str) -> Result<Arc<Lease>, LeaseError> {
        match self.get(caller, id) {
            Err(LeaseError::Unknown(_)) => {}
            known => return known,
        }
        if crate::ids::owner_of(id).is_none() {
            return Err(LeaseError::Unknown(id.to_string()));
        }
        let found = self.read_live_record(caller, id).await?;
        if found.record.keeper == *self.inner.instance {
            return self.take_over(caller, id, Some(&found.record.keeper), false).await;
        }
        Err(elsewhere(id, found.record.keeper))
    }

    /// The record of lease `id` if `caller` may use it and it has not ended.
    ///
    /// # Notable errors
    /// * [LeaseError::NotYours], [LeaseError::Ended], and [Leases::read_record]'s.
    async fn read_live_record(&self, caller: &Caller, id: &str) -> Result<record::Found, LeaseError> {
        let found = self.read_record(id).await?;
        usable(caller, id, &found)?;
        Ok(found)
    }

    /// The record of lease `id` as ZooKeeper has it. Read once, and again after a `sync` when
    /// it is not there: a lease made through another instance a moment ago may not have
    /// reached this session's server yet (each ZooKeeper server serves reads from its own copy),
    /// and its client may already be using it here.
    pub(crate) async fn read_record(&self, id: &str) -> Result<record::Found, LeaseError> {
        let session = self.inner.lanes.primary().connected().await?;
        let path = record::path(&self.inner.root, id);
        if let Some(found) = record::read(session.client(), &path).await.map_err(|_| unavailable())? {
            return Ok(found);
        }
        session.sync().await.map_err(|_| unavailable())?;
        record::read(session.client(), &path)
            .await
            .map_err(|_| unavailable())?
            .ok_or_else(|| LeaseError::Unknown(id.to_string()))
    }

    /// What [Leases::get] answers for `id`, whoever asks: for a lease whose owner was checked
    /// when it was found (or where only its fate matters, as on an event topic).
    pub fn peek(&self, id: &str) -> Result<Arc<Lease>, LeaseError> {
        self.get(&Caller::Anyone, id)
    }

    /// How each lease ended here, for topics (see [WhyEnded]).
    pub fn why_ended(&self) -> WhyEnded {
        let leases = self.clone();
        Arc::new(move |id: &str| match leases.peek(id) {
            Err(LeaseError::Ended { reason, .. }) => Some(reason),
            _ => None,
        })
    }

    /// Starts driving here the holdings `holdings` of `lease` (kept or visited here), from
    /// their holding records: their tasks find their znodes and go on.
    pub fn adopt_holdings(&self, lease: &Arc<Lease>, holdings: Vec<(String, HoldingRecord)>) {
        if let Some(adopter) = self.inner.adopter.get() {
            adopter(lease, holdings);
        }
    }

    /// How many leases this instance keeps.
    pub fn count(&self) -> usize {
        self.inner.table().live.len()
    }

    /// Every lease kept here that `caller` owns (all of them for an admin), oldest first.
    pub fn list(&self, caller: &Caller) -> Vec<Arc<Lease>> {
        let mut leases: Vec<_> = self
            .inner
            .table()
            .live
            .values()
            .filter(|l| caller.owns(l.principal.as_deref()))
            .cloned()
            .collect();
        leases.sort_by_key(|l| l.created_at);
        leases
    }

    /// Pushes the lease's deadline one TTL into the future: in memory, no write.
    pub fn keepalive(&self, caller: &Caller, id: &str) -> Result<Arc<Lease>, LeaseError> {
        let lease = self.get(caller, id)?;
        lease.renew();
        Ok(lease)
    }

    /// That the lease is still kept here as ZooKeeper has it now (a `sync` and a read of its
    /// record): for a linearizable read of a lease or of what it holds, which must not show as
    /// live a lease another instance has taken over or ended since.
    pub async fn confirm(&self, lease: &Arc<Lease>) -> Result<(), LeaseError> {
        let Some(version) = lease.version() else {
            return Ok(());
        };
        let session = self.inner.lanes.primary().connected().await?;
        session.sync().await.map_err(|_| unavailable())?;
        let found = record::read(session.client(), &lease.path)
            .await
            .map_err(|_| unavailable())?;
        match found {
            Some(found)
                if found.version == version
                    && found.record.ended.is_none()
                    && found.record.keeper == *self.inner.instance =>
            {
                Ok(())
            }
            found => {
                self.inner.drop_here(&lease.id);
                Err(match found.and_then(|f| f.record.ended) {
                    Some(reason) => ended(&lease.id, reason),
                    None => LeaseError::Unknown(lease.id.clone()),
                })
            }
        }
    }

    /// Ends the lease kept here and waits (bounded) until its holdings have removed their
    /// znodes, so that when this returns the next waiters are already being woken.
    pub async fn end(&self, caller: &Caller, id: &str, reason: EndReason) -> Result<(), LeaseError> {
        let lease = self.find(caller, id).await?;
        self.inner.end(&lease, reason).await?;
        lease.holdings_finished(Duration::from_secs(10)).await;
        Ok(())
    }

    /// Stops keeping every lease without ending one (on the way out): their holdings' tasks
    /// stop and leave their znodes; the other instances take the leases over once this one's
    /// registration is gone. Returns how many it kept.
    pub fn hand_over_all(&self) -> usize {
        let leases: Vec<Arc<Lease>> = self.inner.table().live.drain().map(|(_, lease)| lease).collect();
        self.inner.table().per_owner.clear();
        for lease in &leases {
            lease.drop_here();
        }
        self.inner.leave_visits();
        leases.len()
    }
}

/// `Ok` if `caller` may use the lease `id` whose record was read as `found`, and it has not
/// ended.
fn usable(caller: &Caller, id: &str, found: &record::Found) -> Result<(), LeaseError> {
    if !caller.owns(found.record.principal.as_deref()) {
        return Err(LeaseError::NotYours(id.to_string()));
    }
    match found.record.ended {
        Some(reason) => Err(ended(id, reason)),
        None => Ok(()),
    }
}

/// [LeaseError::Ended] for lease `id`.
fn ended(id: &str, reason: EndReason) -> LeaseError {
    LeaseError::Ended {
        id: id.to_string(),
        reason,
    }
}

/// [LeaseError::Elsewhere]: lease `id` is kept by `keeper`.
fn elsewhere(id: &str, keeper: String) -> LeaseError {
    LeaseError::Elsewhere {
        id: id.to_string(),
        keeper,
    }
}

/// ZooKeeper could not be asked (or did not answer).
fn unavailable() -> LeaseError {
    LeaseError::Unavailable(crate::zk::session::Unavailable::Disconnected)
}

impl Registry {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.locked()
    }

    /// Writes a lease's record with idempotency key `keyed`'s (whose answer is the lease's id
    /// `id`) in one multi-op: `None` when written, or the lease an earlier request with the key
    /// made.
    async fn write_keyed(
        &self,
        lane: &crate::zk::session::ZkSession,
        path: &str,
        written: &LeaseRecord,
        id: &str,
        keyed: Keyed<'_>,
    ) -> Result<Option<String>, LeaseError> {
        let client = lane.connected().await?.client().clone();
        let made = record::create_keyed(&client, path, written, id, keyed).await;
        match made {
            Ok(before) => Ok(before.filter(|before| before != id)),
            Err(KeyError::ZooKeeper(_)) => Err(unavailable()),
            Err(err) => Err(LeaseError::Key(err)),
        }
    }

    async fn write_record(
        &self,
        lane: &crate::zk::session::ZkSession,
        path: &str,
        written: &LeaseRecord,
    ) -> Result<i32, LeaseError> {
        let client = lane.connected().await?.client().clone();
        record::create(&client, path, written).await.map_err(|_| unavailable())
    }

    /// The record of a lease kept here, as written (before its end): `ttl` granted, `asked`
    /// requested, owned by `owner`, made `at`.
    fn record(
        &self,
        ttl: Duration,
        asked: Option<Duration>,
        principal: Option<String>,
        at: SystemTime,
        lock_delay: Duration,
    ) -> LeaseRecord {
        LeaseRecord {
            ttl_ms: ttl.as_millis() as u64,
            requested_ttl_ms: asked.filter(|r| *r != ttl).map(|r| r.as_millis() as u64),
            principal,
            created_ms: crate::time::millis_of(at),
            keeper: self.instance.to_string(),
            ended: None,
            ended_ms: None,
            lock_delay_ms: (!lock_delay.is_zero()).then_some(lock_delay.as_millis() as u64),
        }
    }

    /// The lease `id` as its record `found` says, at `version`, kept (or visited) here until
    /// `deadline`.
    fn kept(&self, id: &str, found: &record::Found, version: i32, deadline: Instant) -> Kept {
        Kept {
            id: id.to_string(),
            ttl: Duration::from_millis(found.record.ttl_ms),
            requested_ttl: found.record.requested_ttl_ms.map(Duration::from_millis),
            created_at: crate::time::from_millis(found.record.created_ms),
            path: record::path(&self.root, id),
            principal: found.record.principal.clone(),
            lock_delay: Duration::from_millis(found.record.lock_delay_ms.unwrap_or(0)),
            ended_ms: found.record.ended_ms,
            version: Ok(version),
            deadline,
            here: self.instance.clone(),
        }
    }

    /// Forgets a live lease here (ended or taken over); `None` if it was not live.
    fn forget(&self, id: &str, ended: Option<EndReason>) -> Option<Arc<Lease>> {
        let mut table = self.table();
        let lease = table.live.remove(id)?;
        if let Some(reason) = ended {
            table.ended.insert(id.to_string(), reason);
        }
        count_down(&mut table.per_owner, &lease.principal);
        Some(lease)
    }

    /// Stops keeping a lease that another instance keeps now (or that is gone).
    fn drop_here(&self, id: &str) {
        if let Some(lease) = self.forget(id, None) {
            lease.drop_here();
            tracing::info!(lease = %id, "lease no longer kept here");
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
