//! The handles of one kind on this instance ([Handles]): indexed by resource and id and by
//! lease, opened (or found again for a retried request), adopted from another keeper, and
//! counted while they queue (what the waiter limits read).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::task::drive;
use super::{Handle, HandleState, Phase, Protocol};
use crate::kind::Kind;
use crate::locked::Locked;
use crate::recipes::engine::lease::{Holding, Lease};
use crate::recipes::engine::record;

/// Why [Handles::open] made no handle.
pub enum Refused<P: Protocol> {
    /// The lease ended meanwhile, or left this instance.
    LeaseEnded,
    /// The lease (or, for handles with their own id, another lease) already has a live handle
    /// here that this request cannot reuse: it is given.
    Taken(Arc<Handle<P>>),
}

/// The handles of one kind made through this instance, by resource and id, and by lease.
pub struct Handles<P: Protocol> {
    kind: Kind,
    root: Arc<str>,
    base: Arc<str>,
    index: Arc<Mutex<Index<P>>>,
    queued: Arc<QueuedCounts>,
}

/// How many of a registry's handles are queued (pending or waiting), by resource name and by
/// the owner of their lease: what the waiter limits check on every acquire. Kept as handles
/// change phase rather than counted by a scan of every handle, which would make each acquire
/// cost in proportion to the handles held (BENCHMARKS.md, "How cost grows with idle leases
/// and held locks").
#[derive(Default)]
pub struct QueuedCounts {
    by_name: Mutex<HashMap<String, usize>>,
    by_owner: Mutex<HashMap<Option<String>, usize>>,
}

impl QueuedCounts {
    pub(super) fn change(&self, name: &str, owner: &Option<String>, queued: bool) {
        fn step<K: std::hash::Hash + Eq>(map: &Mutex<HashMap<K, usize>>, key: K, up: bool) {
            let mut map = map.locked();
            if up {
                *map.entry(key).or_default() += 1;
            } else {
                crate::locked::count_down(&mut map, &key);
            }
        }
        step(&self.by_name, name.to_string(), queued);
        step(&self.by_owner, owner.clone(), queued);
    }

    fn at(&self, name: &str) -> usize {
        let map = self.by_name.locked();
        map.get(name).copied().unwrap_or(0)
    }

    fn of(&self, owner: &Option<String>) -> usize {
        let map = self.by_owner.locked();
        map.get(owner).copied().unwrap_or(0)
    }
}

impl<P: Protocol> Clone for Handles<P> {
    fn clone(&self) -> Self {
        Handles {
            kind: self.kind,
            root: self.root.clone(),
            base: self.base.clone(),
            index: self.index.clone(),
            queued: self.queued.clone(),
        }
    }
}

struct Index<P: Protocol> {
    by_id: HashMap<(String, String), Arc<Handle<P>>>,
    by_lease: HashMap<(String, String), Arc<Handle<P>>>,
    /// Handles that were lost, after they left the index: so that their holder, asking later,
    /// learns that it lost the lock rather than that it never existed. The oldest go first.
    lost: crate::remembered::Remembered<(String, String), Lost>,
}

/// What is remembered of a lost handle.
#[derive(Clone, Debug)]
pub struct Lost {
    /// Why it was lost.
    pub reason: String,
    /// Its lease's principal (only they, and admins, may learn of it).
    pub principal: Option<String>,
    /// How its lease ended, if it had when the handle was forgotten.
    pub lease_ended: Option<crate::recipes::engine::lease::EndReason>,
}

impl<P: Protocol> Index<P> {
    fn remember_lost(&mut self, handle: &Handle<P>, reason: String) {
        let lost = Lost {
            reason,
            principal: handle.lease.principal.clone(),
            lease_ended: handle.lease.end_reason(),
        };
        self.lost.insert((handle.name.clone(), handle.id.clone()), lost);
    }

    fn forget(&mut self, handle: &Arc<Handle<P>>) {
        if let Phase::Lost { reason } = handle.state().phase {
            self.remember_lost(handle, reason);
        }
        let by_lease = (handle.lease.id.clone(), handle.name.clone());
        if self.by_lease.get(&by_lease).is_some_and(|h| Arc::ptr_eq(h, handle)) {
            self.by_lease.remove(&by_lease);
        }
        let by_id = (handle.name.clone(), handle.id.clone());
        if self.by_id.get(&by_id).is_some_and(|h| Arc::ptr_eq(h, handle)) {
            self.by_id.remove(&by_id);
        }
    }
}

impl<P: Protocol> Handles<P> {
    /// The handles of `kind`, whose resources are under `<root>/<kind's dir>`.
    pub fn new(root: &str, kind: Kind) -> Handles<P> {
        Handles {
            kind,
            root: root.into(),
            base: kind.base(root).into(),
            index: Arc::new(Mutex::new(Index {
                by_id: HashMap::new(),
                lost: Default::default(),
                by_lease: HashMap::new(),
            })),
            queued: Arc::default(),
        }
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// zkgate's root znode.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The znode of resource `name` (already validated).
    pub fn dir(&self, name: &str) -> String {
        format!("{}/{}", self.base, name)
    }

    /// The znode `child` of resource `name` (a member's, a participant's or an instance's
    /// node, by its id; both already validated).
    pub fn node(&self, name: &str, child: &str) -> String {
        format!("{}/{}/{child}", self.base, name)
    }

    /// A handle for `lease` at `name` running `protocol`, with `id` (or a new id of the lease's
    /// instance). An existing handle that is not finished is returned instead (`false`: not
    /// new) when `reuse` accepts it: the lease's own handle at `name` for a one-per-lease
    /// protocol, the handle with the same `id` otherwise; one it refuses is [Refused::Taken].
    pub fn open(
        &self,
        lease: &Arc<Lease>,
        name: &str,
        id: Option<String>,
        protocol: P,
        reuse: impl FnOnce(&Handle<P>, &P) -> bool,
    ) -> Result<(Arc<Handle<P>>, bool), Refused<P>> {
        let mut index = self.lock();
        let existing = if protocol.one_per_lease() {
            index.by_lease.get(&(lease.id.clone(), name.to_string()))
        } else {
            id.as_ref()
                .and_then(|id| index.by_id.get(&(name.to_string(), id.clone())))
        };
        if let Some(existing) = existing.filter(|h| !h.state().phase.is_final()) {
            return if reuse(existing, &protocol) {
                Ok((existing.clone(), false))
            } else {
                Err(Refused::Taken(existing.clone()))
            };
        }
        let id = id.unwrap_or_else(|| crate::ids::owned_id(&lease.here));
        let one = protocol.one_per_lease();
        let record_name = record::record_name(self.kind, name, (!one).then_some(id.as_str()));
        let handle = self.insert(&mut index, lease, (name, id), record_name, protocol, true)?;
        Ok((handle, true))
    }

    /// Takes up the handle `id` at `name` of a lease from its holding record (named `record_name`):
    /// adopted from another keeper (see [crate::recipes::leases]), made by an instance gone, or made by
    /// another instance for a request retried here. Its task finds its znodes and goes on, or
    /// finds them gone (lost). The handle already here is kept.
    pub fn adopt(
        &self,
        lease: &Arc<Lease>,
        (name, id): (&str, &str),
        record_name: &str,
        protocol: P,
    ) -> Result<Arc<Handle<P>>, Refused<P>> {
        let mut index = self.lock();
        // Driven here already (for this lease as kept or as visited here): one task per
        // holding on an instance, whichever copy of the lease took it up first.
        if let Some(existing) = index.by_id.get(&(name.to_string(), id.to_string()))
            && existing.lease.id == lease.id
            && !existing.state().phase.is_final()
        {
            return Ok(existing.clone());
        }
        self.insert(
            &mut index,
            lease,
            (name, id.to_string()),
            record_name.to_string(),
            protocol,
            false,
        )
    }

    fn insert(
        &self,
        index: &mut Index<P>,
        lease: &Arc<Lease>,
        (name, id): (&str, String),
        record_name: String,
        protocol: P,
        may_create: bool,
    ) -> Result<Arc<Handle<P>>, Refused<P>> {
        let (protocol_metered, kind_label) = (protocol.metered(), protocol.kind().label());
        let handle = Arc::new(Handle {
            id,
            name: name.to_string(),
            lease: lease.clone(),
            created_at: SystemTime::now(),
            protocol,
            state: watch::Sender::new(HandleState::default()),
            release: CancellationToken::new(),
            finished: watch::Sender::new(false),
            awaiting: std::sync::atomic::AtomicUsize::new(0),
            me: Mutex::new(None),
            _metered: protocol_metered.then(|| crate::metrics::get().hold_name(kind_label, name)),
            queued: self.queued.clone(),
            counted: std::sync::atomic::AtomicBool::new(false),
            may_create: std::sync::atomic::AtomicBool::new(may_create),
            record_name,
        });
        let holding: Arc<dyn Holding> = handle.clone();
        if !lease.attach(holding.clone()) {
            return Err(Refused::LeaseEnded);
        }
        *handle.me.locked() = Some(holding);
        handle.recount(); // pending: queued until granted or finished
        if handle.protocol.one_per_lease() {
            index
                .by_lease
                .insert((lease.id.clone(), name.to_string()), handle.clone());
        }
        index
            .by_id
            .insert((name.to_string(), handle.id.clone()), handle.clone());
        // The exit hook takes the index lock, which the caller holds until both insertions are
        // done, so it cannot run before them even if the task finishes at once.
        let (driven, registry) = (handle.clone(), self.index.clone());
        tokio::spawn(async move {
            drive(&driven).await;
            registry.locked().forget(&driven);
        });
        Ok(handle)
    }

    /// The handle `id` of resource `name`: live, or lost and not yet released (so that its
    /// holder can learn of the loss).
    pub fn get(&self, name: &str, id: &str) -> Option<Arc<Handle<P>>> {
        self.lock().by_id.get(&(name.to_string(), id.to_string())).cloned()
    }

    /// The handle `id` of resource `name` if this instance serves it: kept here, and its lease
    /// not moved to another instance (one that moved is served from ZooKeeper, like any other
    /// instance's).
    pub fn serving(&self, name: &str, id: &str) -> Option<Arc<Handle<P>>> {
        self.get(name, id).filter(|h| h.state().phase != Phase::Moved)
    }

    /// The handle `id` of resource `name` if it was lost and has left the index since.
    pub fn lost(&self, name: &str, id: &str) -> Option<Lost> {
        self.lock().lost.get(&(name.to_string(), id.to_string())).cloned()
    }

    /// Whether the lease already has a live handle at `name` (a retried request).
    pub fn holds(&self, lease: &Lease, name: &str) -> bool {
        self.lock()
            .by_lease
            .get(&(lease.id.clone(), name.to_string()))
            .is_some_and(|h| !h.state().phase.is_final())
    }

    /// How many handles at `name` are queued (not yet granted, not finished).
    pub fn queued_at(&self, name: &str) -> usize {
        self.queued.at(name)
    }

    /// How many handles of leases owned by `owner` are queued.
    pub fn queued_of(&self, owner: &Option<String>) -> usize {
        self.queued.of(owner)
    }

    /// Every handle of this instance at `name` that has a znode, by the znode's name.
    pub fn local(&self, name: &str) -> HashMap<String, Arc<Handle<P>>> {
        self.lock()
            .by_id
            .values()
            .filter(|h| h.name == name)
            .filter_map(|h| h.state().node.map(|n| (n.name, h.clone())))
            .collect()
    }

    /// Releases a handle (held or queued), forgets it and takes it off its lease.
    pub async fn release(&self, handle: &Arc<Handle<P>>) {
        handle.release().await;
        self.forget_released(handle);
    }

    /// [Handles::release], waited for at most `limit`: `false` if it is not done by then
    /// (ZooKeeper is away). The release goes on regardless and is done once ZooKeeper is back;
    /// the request that asked for it answers meanwhile instead of hanging for the outage.
    pub async fn release_within(&self, handle: &Arc<Handle<P>>, limit: std::time::Duration) -> bool {
        handle.release.cancel();
        if tokio::time::timeout(limit, handle.finished()).await.is_ok() {
            self.forget_released(handle);
            return true;
        }
        let (handles, handle) = (self.clone(), handle.clone());
        tokio::spawn(async move { handles.release(&handle).await });
        false
    }

    /// Forgets a handle whose task has finished, and takes it off its lease.
    fn forget_released(&self, handle: &Arc<Handle<P>>) {
        self.lock().forget(handle);
        handle.detach();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index<P>> {
        self.index.locked()
    }
}
