//! Driven handles: one lease's place at one resource, with its own task that runs the recipe.
//!
//! Every lease-bound recipe works the same way once it has its znodes: a task runs the recipe
//! on the lease's own session (its znodes must live and die with the lease), publishes where it
//! stands ([Phase]), and when the handle is released or the lease ends it removes what it
//! created and says how it ended. What differs is the protocol: a lock contender queues and
//! watches its predecessor, a semaphore permit takes the semaphore's lock then waits for a free
//! permit, a group member just creates its node. So a [Handle] is generic over its [Protocol],
//! the way Curator's `LockInternals` is one driver with a small predicate per lock type.
//!
//! A handle is a [Holding] of its lease, so the lease shows it and waits for it when it ends;
//! [Handles] indexes the handles of one kind on this instance.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client::{Client, Error as ZkError};

use super::lease::{Holding, HoldingView, Lease};
use super::revocation::Revocation;
use crate::kind::Kind;

/// Where a handle stands.
#[derive(Clone, Debug, PartialEq)]
pub enum Phase {
    /// Its znode is being created.
    Pending,
    /// In the queue, `position` ahead of it.
    Waiting { position: usize },
    /// It holds (the lock, a permit, the leadership, its membership) since `since`.
    Held { since: SystemTime },
    /// It held or waited, and its znode vanished without a release (lease or session ended,
    /// or somebody deleted it).
    Lost { reason: String },
    /// Released by its holder (or its lease ended); its znodes are gone.
    Released,
    /// Its znode could not be created (`NodeExists`: another session has it).
    Failed { error: ZkError },
}

impl Phase {
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Pending => "pending",
            Phase::Waiting { .. } => "waiting",
            Phase::Held { .. } => "held",
            Phase::Lost { .. } => "lost",
            Phase::Released => "released",
            Phase::Failed { .. } => "failed",
        }
    }

    /// No further change will happen by itself.
    pub fn is_final(&self) -> bool {
        matches!(self, Phase::Lost { .. } | Phase::Released | Phase::Failed { .. })
    }

    /// Not yet decided either way: creating, or queued.
    pub fn is_queued(&self) -> bool {
        matches!(self, Phase::Pending | Phase::Waiting { .. })
    }
}

/// A handle's znode once created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// The child name, e.g. `_c_<guid>-lock-0000000042`.
    pub name: String,
    /// Its `czxid`: the fencing token of a grant.
    pub czxid: i64,
}

/// Snapshot of a handle.
#[derive(Clone, Debug)]
pub struct HandleState {
    pub phase: Phase,
    /// The znode that decides its place (a contender's), once created.
    pub node: Option<Node>,
    /// Whether it was ever granted: its fencing token is meaningful (held, or lost after).
    pub granted: bool,
    /// A request to give the lock up, once its holder has seen one.
    pub revocation: Option<Revocation>,
}

impl HandleState {
    /// The fencing token, once granted.
    pub fn fencing_token(&self) -> Option<i64> {
        self.node.as_ref().filter(|_| self.granted).map(|n| n.czxid)
    }
}

/// How a protocol's run ended by itself (a release or the lease's end cancels it instead).
pub enum Exit {
    Lost(String),
    Failed(ZkError),
}

impl Exit {
    /// A ZooKeeper error that ends a run: the session's end is a loss, anything else a failure.
    pub fn from_error(err: ZkError) -> Exit {
        match err {
            ZkError::SessionExpired | ZkError::ClientClosed => Exit::Lost("the ZooKeeper session ended".into()),
            err => Exit::Failed(err),
        }
    }
}

/// What a handle does at its resource: the recipe-specific part.
pub trait Protocol: Send + Sync + Sized + 'static {
    /// The kind of resource, as shown on the lease and in the metrics.
    fn kind(&self) -> Kind;

    /// Whether one lease holds at most one handle of this protocol per resource (a retried
    /// acquire finds the first one: the HTTP twin of the recipes' GUID rule). Members and
    /// participants are found by their own id instead.
    fn one_per_lease(&self) -> bool {
        true
    }

    /// Whether a grant is timed and counted in the metrics (locks, permits, leadership).
    fn metered(&self) -> bool {
        true
    }

    /// Runs the recipe on the lease's session: creates the znodes, moves the handle through
    /// its phases ([Handle::wait], [Handle::grant]) and returns only if it ends by itself. It
    /// is cancelled (dropped) when the handle is released or the lease ends.
    fn run(&self, handle: &Handle<Self>, client: &Client) -> impl Future<Output = Exit> + Send;

    /// Removes what the run created (also when it was cancelled in the middle of a create:
    /// the GUID finds it). Returns `false` if a node the handle held was already gone, which
    /// makes a release a loss.
    fn clean_up(&self, handle: &Handle<Self>, client: &Client) -> impl Future<Output = bool> + Send;

    /// Why a held node vanished, for a release that found it gone.
    fn loss_reason(&self, _handle: &Handle<Self>) -> String {
        "its znode was deleted while it was held".into()
    }
}

/// One lease's place at one resource, driven by its own task.
pub struct Handle<P: Protocol> {
    /// The handle's id: issued by this instance (a lock handle), or the caller's own (a member
    /// id, unique in its group).
    pub id: String,
    /// The resource's name.
    pub name: String,
    pub lease: Arc<Lease>,
    pub created_at: SystemTime,
    pub protocol: P,
    state: watch::Sender<HandleState>,
    release: CancellationToken,
    finished: watch::Sender<bool>,
    /// Our side of `Holding`, set once attached to the lease.
    me: Mutex<Option<Arc<dyn Holding>>>,
    /// Keeps the name's series while the handle lives (metered kinds only).
    _metered: Option<crate::metrics::NameHold>,
    /// Its registry's queued counts, and whether it is counted in them now.
    queued: Arc<QueuedCounts>,
    counted: std::sync::atomic::AtomicBool,
}

impl<P: Protocol> Drop for Handle<P> {
    fn drop(&mut self) {
        if *self.counted.get_mut() {
            self.queued.change(&self.name, &self.lease.owner, false);
        }
    }
}

impl<P: Protocol> Handle<P> {
    pub fn state(&self) -> HandleState {
        self.state.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<HandleState> {
        self.state.subscribe()
    }

    /// Waits for the run's first decision: anything but `Pending` (a run that ends is final,
    /// so this returns at the latest when the session does).
    pub async fn decided(&self) -> Phase {
        let mut updates = self.subscribe();
        let _ = updates.wait_for(|s| s.phase != Phase::Pending).await;
        self.state().phase
    }

    /// Waits for the first decision (bounded by `first_limit` even when `wait` is shorter: a
    /// try-lock still needs that round trip), then for a grant or a final phase until `wait`
    /// has passed since the start; returns the phase then.
    pub async fn granted_within(&self, wait: Duration, first_limit: Duration) -> Phase {
        let deadline = Instant::now() + wait;
        let mut updates = self.subscribe();
        let first = deadline.max(Instant::now() + first_limit);
        let _ = tokio::time::timeout_at(first, updates.wait_for(|s| s.phase != Phase::Pending)).await;
        let granted_or_done = updates.wait_for(|s| matches!(s.phase, Phase::Held { .. }) || s.phase.is_final());
        let _ = tokio::time::timeout_at(deadline, granted_or_done).await;
        self.state().phase
    }

    /// Asks the task to leave the queue or give up what it holds, and waits until its znodes
    /// are gone (bounded by the session: an unreachable ZooKeeper removes them on expiry).
    pub async fn release(&self) {
        self.release.cancel();
        let _ = self.finished.subscribe().wait_for(|f| *f).await;
    }

    /// Records the handle's znode (what decides its place, and its fencing token).
    pub fn set_node(&self, node: Node) {
        self.state.send_modify(|s| s.node = Some(node));
    }

    /// Queued, `position` ahead.
    pub fn wait(&self, position: usize) {
        self.set_phase(Phase::Waiting { position });
    }

    /// Holds from now on; counted in the metrics if the protocol is metered.
    pub fn grant(&self) {
        let since = SystemTime::now();
        self.state.send_modify(|s| {
            s.phase = Phase::Held { since };
            s.granted = true;
        });
        self.recount();
        if self.protocol.metered() {
            self.record_grant(since);
        }
    }

    /// Holds from now on, without a grant to count (a membership).
    pub fn hold(&self) {
        self.set_phase(Phase::Held {
            since: SystemTime::now(),
        });
    }

    /// Someone asked the holder to give it up.
    pub fn revoke(&self, revocation: Revocation) {
        if self.state.borrow().revocation.as_ref() != Some(&revocation) {
            tracing::info!(name = ?self.name, handle = ?self.id, "revocation requested");
            self.state.send_modify(|s| s.revocation = Some(revocation));
        }
    }

    /// Whether the handle has been asked to leave (released, or its lease ended).
    pub fn is_leaving(&self) -> bool {
        self.release.is_cancelled() || self.lease.ended().is_cancelled()
    }

    fn set_phase(&self, phase: Phase) {
        self.state.send_modify(|s| s.phase = phase);
        self.recount();
    }

    /// Counts the handle in its registry's queued counts, or out, as its phase now says.
    fn recount(&self) {
        let queued = self.state.borrow().phase.is_queued();
        if self.counted.swap(queued, std::sync::atomic::Ordering::SeqCst) != queued {
            self.queued.change(&self.name, &self.lease.owner, queued);
        }
    }

    /// The `kind` and `name` labels of this handle's series (`name` is `_other` when the name
    /// has no place of its own, see [crate::metrics::names]).
    fn labels(&self) -> [&str; 2] {
        let kind = self.protocol.kind().label();
        [kind, crate::metrics::get().name(kind, &self.name)]
    }

    /// Metrics of a grant: the wait since the handle was made, one more acquisition (and leader
    /// change, for a candidate).
    fn record_grant(&self, since: SystemTime) {
        let m = crate::metrics::get();
        let waited = since.duration_since(self.created_at).unwrap_or_default();
        let labels = self.labels();
        m.lock_wait.with_label_values(&labels).observe(waited.as_secs_f64());
        m.lock_acquisitions.with_label_values(&labels).inc();
        if self.protocol.kind() == Kind::Election {
            m.leader_changes.with_label_values(&[labels[1]]).inc();
        }
    }

    /// Metrics of the end: the hold's length if it was granted, a loss if it was lost.
    fn record_end(&self, end: &Phase) {
        if !self.protocol.metered() {
            return;
        }
        let m = crate::metrics::get();
        let state = self.state();
        let labels = self.labels();
        if let (Phase::Held { since }, true) = (state.phase, state.granted) {
            let held = since.elapsed().unwrap_or_default();
            m.lock_hold.with_label_values(&labels).observe(held.as_secs_f64());
        }
        if matches!(end, Phase::Lost { .. }) {
            m.lock_losses.with_label_values(&labels).inc();
        }
    }

    fn detach(&self) {
        if let Some(me) = self.me.lock().unwrap_or_else(|e| e.into_inner()).take() {
            self.lease.detach(&me);
        }
    }
}

impl<P: Protocol> Holding for Handle<P> {
    fn view(&self) -> HoldingView {
        let state = self.state();
        HoldingView {
            kind: self.protocol.kind().name(),
            name: self.name.clone(),
            handle: self.id.clone(),
            state: state.phase.name(),
            fencing_token: state.fencing_token(),
            revocation: state.revocation,
        }
    }

    fn finished(&self) -> watch::Receiver<bool> {
        self.finished.subscribe()
    }
}

/// Runs the protocol on the lease's own session until it ends, then cleans up and reports.
async fn drive<P: Protocol>(handle: &Arc<Handle<P>>) {
    let end = match handle.lease.zk.connected().await {
        Err(err) => Phase::Failed {
            error: match err {
                crate::zk::session::Unavailable::NoSession => ZkError::SessionExpired,
                crate::zk::session::Unavailable::Disconnected => ZkError::ConnectionLoss,
            },
        },
        Ok(session) if session.generation != handle.lease.generation => Phase::Lost {
            reason: "the lease's ZooKeeper session has ended".into(),
        },
        Ok(session) => {
            let client = session.client;
            let run = handle.protocol.run(handle, &client);
            tokio::pin!(run);
            let exit = tokio::select! {
                exit = &mut run => Some(exit),
                _ = handle.release.cancelled() => None,
                _ = handle.lease.ended().cancelled() => None,
            };
            // Clean up while the run (pinned in this block) and its watches are still alive: a
            // deletion fires a watch and the server forgets it, where dropping it first would
            // cost a removeWatches request on every release.
            let was_there = handle.protocol.clean_up(handle, &client).await;
            // A lease that ended otherwise than by its owner's delete (it expired, its session
            // died, the instance shut down) took what it held away from its holder: that is a
            // loss, said as one, not a release the holder asked for.
            let taken = handle
                .lease
                .end_reason()
                .filter(|r| *r != crate::recipes::lease::EndReason::Deleted && !handle.release.is_cancelled());
            match exit {
                None if let Some(reason) = taken => Phase::Lost {
                    reason: reason.describe().to_string(),
                },
                None if was_there => Phase::Released,
                None => Phase::Lost {
                    reason: handle.protocol.loss_reason(handle),
                },
                Some(Exit::Lost(reason)) => Phase::Lost { reason },
                Some(Exit::Failed(error)) => Phase::Failed { error },
            }
        }
    };
    tracing::debug!(kind = %handle.protocol.kind(), name = %handle.name, handle = %handle.id, phase = end.name(), "handle finished");
    handle.record_end(&end);
    let lost = matches!(end, Phase::Lost { .. });
    handle.set_phase(end);
    handle.finished.send_replace(true);
    // Lost handles stay on the lease so that its holder learns of the loss; the rest leave it.
    if !lost {
        handle.detach();
    }
}

/// Why [Handles::open] made no handle.
pub enum Refused<P: Protocol> {
    /// The lease ended meanwhile.
    LeaseEnded,
    /// The lease (or, for handles with their own id, another lease) already has a live handle
    /// here that this request cannot reuse: it is given.
    Taken(Arc<Handle<P>>),
}

/// The handles of one kind made through this instance, by resource and id, and by lease.
pub struct Handles<P: Protocol> {
    kind: Kind,
    base: Arc<str>,
    index: Arc<Mutex<Index<P>>>,
    queued: Arc<QueuedCounts>,
}

/// How many of a registry's handles are queued (pending or waiting), by resource name and by
/// the owner of their lease: what the waiter limits check on every acquire. Kept as handles
/// change phase rather than counted by a scan of every handle, which at 100,000 held locks
/// cost each acquire 20 ms (and the instance 45 acquisitions a second).
#[derive(Default)]
pub struct QueuedCounts {
    by_name: Mutex<HashMap<String, usize>>,
    by_owner: Mutex<HashMap<Option<String>, usize>>,
}

impl QueuedCounts {
    fn change(&self, name: &str, owner: &Option<String>, queued: bool) {
        fn step<K: std::hash::Hash + Eq>(map: &Mutex<HashMap<K, usize>>, key: K, up: bool) {
            let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
            if up {
                *map.entry(key).or_default() += 1;
            } else if let std::collections::hash_map::Entry::Occupied(mut entry) = map.entry(key) {
                *entry.get_mut() -= 1;
                if *entry.get() == 0 {
                    entry.remove();
                }
            }
        }
        step(&self.by_name, name.to_string(), queued);
        step(&self.by_owner, owner.clone(), queued);
    }

    fn at(&self, name: &str) -> usize {
        let map = self.by_name.lock().unwrap_or_else(|e| e.into_inner());
        map.get(name).copied().unwrap_or(0)
    }

    fn of(&self, owner: &Option<String>) -> usize {
        let map = self.by_owner.lock().unwrap_or_else(|e| e.into_inner());
        map.get(owner).copied().unwrap_or(0)
    }
}

impl<P: Protocol> Clone for Handles<P> {
    fn clone(&self) -> Self {
        Handles {
            kind: self.kind,
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
    /// Its lease's owner (only they, and admins, may learn of it).
    pub owner: Option<String>,
}

impl<P: Protocol> Index<P> {
    fn remember_lost(&mut self, handle: &Handle<P>, reason: String) {
        let lost = Lost {
            reason,
            owner: handle.lease.owner.clone(),
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

    /// `<root>/<kind's dir>`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The znode of resource `name` (already validated).
    pub fn dir(&self, name: &str) -> String {
        format!("{}/{}", self.base, name)
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
        let (protocol_metered, kind_label) = (protocol.metered(), protocol.kind().label());
        let handle = Arc::new(Handle {
            id: id.unwrap_or_else(|| crate::ids::sibling_id(&lease.id)),
            name: name.to_string(),
            lease: lease.clone(),
            created_at: SystemTime::now(),
            protocol,
            state: watch::Sender::new(HandleState {
                phase: Phase::Pending,
                node: None,
                granted: false,
                revocation: None,
            }),
            release: CancellationToken::new(),
            finished: watch::Sender::new(false),
            me: Mutex::new(None),
            _metered: protocol_metered.then(|| crate::metrics::get().hold_name(kind_label, name)),
            queued: self.queued.clone(),
            counted: std::sync::atomic::AtomicBool::new(false),
        });
        let holding: Arc<dyn Holding> = handle.clone();
        if !lease.attach(holding.clone()) {
            return Err(Refused::LeaseEnded);
        }
        *handle.me.lock().unwrap_or_else(|e| e.into_inner()) = Some(holding);
        handle.recount(); // pending: queued until granted or finished
        if handle.protocol.one_per_lease() {
            index
                .by_lease
                .insert((lease.id.clone(), name.to_string()), handle.clone());
        }
        index
            .by_id
            .insert((name.to_string(), handle.id.clone()), handle.clone());
        // The exit hook takes the index lock, which is held until both insertions are done, so
        // it cannot run before them even if the task finishes at once.
        let (driven, registry) = (handle.clone(), self.index.clone());
        tokio::spawn(async move {
            drive(&driven).await;
            forget_when_done(&registry, &driven).await;
        });
        Ok((handle, true))
    }

    /// The handle `id` of resource `name`: live, or lost and not yet released (so that its
    /// holder can learn of the loss).
    pub fn get(&self, name: &str, id: &str) -> Option<Arc<Handle<P>>> {
        self.lock().by_id.get(&(name.to_string(), id.to_string())).cloned()
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
        self.lock().forget(handle);
        handle.detach();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index<P>> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Drops a finished handle from the index: at once, unless it was lost (then when its lease
/// ends or it is released, so that its holder can learn of the loss meanwhile).
async fn forget_when_done<P: Protocol>(index: &Arc<Mutex<Index<P>>>, handle: &Arc<Handle<P>>) {
    if matches!(handle.state().phase, Phase::Lost { .. }) {
        handle.lease.ended().cancelled().await;
    }
    index.lock().unwrap_or_else(|e| e.into_inner()).forget(handle);
}
