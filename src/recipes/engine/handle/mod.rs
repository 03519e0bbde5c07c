//! Driven handles: one lease's place at one resource, with its own task that runs the recipe.
//!
//! Every lease-bound recipe works the same way once it has its znodes: a task on the lease's
//! keeper runs the recipe, publishes where it stands ([Phase]), and when the handle is released
//! or the lease ends it removes what it created and says how it ended. What differs is the
//! protocol: a lock contender queues and watches its predecessor, a semaphore permit takes the
//! semaphore's lock then waits for a free permit, a group member just creates its node. So a
//! [Handle] is generic over its [Protocol], the way Curator's `LockInternals` is one driver with
//! a small predicate per lock type.
//!
//! A holding's znodes are persistent and its lease's record names them ([record]), so the task
//! is not bound to one ZooKeeper session, nor to one instance:
//! - when the session ends (its watches go with it), the task runs the protocol again on the
//!   next one, which finds its znodes where they are (by the GUID in their names, or their
//!   path) and goes on;
//! - when another instance takes the lease over, the task here stops and leaves the znodes as
//!   they are ([Lease::dropped]); the new keeper [Handles::adopt]s the holding from its record
//!   and runs the same protocol, which may then find but never create its znodes;
//! - a release need not come through this task: any instance may delete a holding's znodes
//!   and their holding record together. A task whose znode vanished therefore asks whether the
//!   holding record went too: if so the holding was released, else it was lost.
//!
//! A handle is a [Holding] of its lease, so the lease shows it and waits for it when it ends;
//! [Handles] indexes the handles of one kind on this instance.
//!
//! Here the handle and its protocol; its task in [task], its guarded writes in [write], the
//! registry of a kind's handles in [registry].

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client::{Client, Error as ZkError};

use super::lease::{Holding, HoldingView, Lease};
use super::record::HoldingRecord;
use super::revocation::Revocation;
use crate::kind::Kind;
use crate::locked::Locked;
use crate::zk::Failure;

mod registry;
mod task;
mod write;

pub use registry::{Handles, QueuedCounts, Refused};
pub use write::{
    Guarded, Made, NotCreated, create_held, delete_all, delete_all_guarded, delete_held, names_handle, write_held,
};

/// Where a handle stands.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Phase {
    /// Its znode is being created.
    #[default]
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
    /// Its znode could not be created (`NodeExists`: another lease has it).
    Failed { error: Failure },
    /// This instance no longer keeps its lease (another took it over): the handle lives on
    /// there, with its znodes.
    Moved,
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
            Phase::Moved => "moved",
        }
    }

    /// No further change will happen by itself.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            Phase::Lost { .. } | Phase::Released | Phase::Failed { .. } | Phase::Moved
        )
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
#[derive(Clone, Debug, Default)]
pub struct HandleState {
    pub phase: Phase,
    /// The znode that decides its place (a contender's), once created.
    pub node: Option<Node>,
    /// Whether it was ever granted: its fencing token is meaningful (held, or lost after).
    pub granted: bool,
    /// Until when (ms since the Unix epoch) it stays held by its lease, expired: its lock-delay.
    pub delayed_until: Option<i64>,
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
    /// Its znode vanished (a release through another instance, if its holding record went too).
    Lost(String),
    Failed(Failure),
    /// The session ended under it (its watches went with it): run again on the next one.
    Interrupted,
    /// A write for the lease was refused: another instance keeps it now.
    Moved,
}

impl Exit {
    /// A ZooKeeper error that ends a run: the session's end interrupts it, anything else fails.
    pub fn from_error(err: ZkError) -> Exit {
        match err {
            ZkError::SessionExpired | ZkError::ClientClosed => Exit::Interrupted,
            err => Exit::Failed(err.into()),
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

    /// Counts a grant in the metrics beyond the wait and the acquisition every metered handle
    /// counts (a new leader, for an election's candidate). `labels`: kind and name.
    fn count_grant(&self, _labels: [&str; 2]) {}

    /// Runs the recipe on a session of the lease's: finds its znodes (a run after an
    /// interruption, or of an adopted handle) or creates them ([create_held], only if
    /// [Handle::may_create]), moves the handle through its phases ([Handle::wait],
    /// [Handle::grant]) and returns only if it ends by itself. It is cancelled (dropped) when
    /// the handle is released, the lease ends or moves.
    fn run(&self, handle: &Handle<Self>, client: &Client) -> impl Future<Output = Exit> + Send;

    /// Removes what the run created and its holding record (also when it was cancelled in
    /// the middle of a create: the GUID finds it). `Ok(false)` if a node the handle held was
    /// already gone, which makes a release a loss; `Err` if ZooKeeper could not be told (tried
    /// again on the next session).
    fn clean_up(&self, handle: &Handle<Self>, client: &Client) -> impl Future<Output = Result<bool, ZkError>> + Send;

    /// What this holding's record under its lease says.
    fn record(&self, handle: &Handle<Self>) -> HoldingRecord;

    /// Whether it shows among its lease's holdings.
    fn shown(&self) -> bool {
        true
    }

    /// For a lock-delay ([crate::recipes::engine::lease::Lease::delayed_until]): if this
    /// holding holds a lock (not a membership, nor leadership), marks its node as held by an
    /// ended lease until `until` (ms since the Unix epoch), where views read it, and says
    /// whether it does. The node then stays until `until`. By default: it does not.
    fn hold_delayed(
        &self,
        _handle: &Handle<Self>,
        _client: &Client,
        _until_ms: i64,
    ) -> impl Future<Output = Result<bool, ZkError>> + Send {
        async { Ok(false) }
    }

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
    /// How many acquire requests wait on this handle now (see [Handle::awaited]).
    awaiting: std::sync::atomic::AtomicUsize,
    /// Our side of `Holding`, set once attached to the lease.
    me: Mutex<Option<Arc<dyn Holding>>>,
    /// Keeps the name's series while the handle lives (metered kinds only).
    _metered: Option<crate::metrics::NameHold>,
    /// Its registry's queued counts, and whether it is counted in them now.
    queued: Arc<QueuedCounts>,
    counted: std::sync::atomic::AtomicBool,
    /// Whether its run may create its znodes: until they are first created, for a new handle;
    /// never for one adopted from another keeper (a znode it cannot find was lost).
    may_create: std::sync::atomic::AtomicBool,
    /// The name of its holding record under its lease's record ([super::record::record_name],
    /// or the name found, for a handle adopted from its holding record).
    record_name: String,
}

impl<P: Protocol> Drop for Handle<P> {
    fn drop(&mut self) {
        if *self.counted.get_mut() {
            self.queued.change(&self.name, &self.lease.principal, false);
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

    /// Counts an acquire request as waiting on this handle until the guard is dropped. Two
    /// may: a retried request (its first attempt's client gone) finds the handle the first
    /// made, and the first may still be waiting on it.
    pub fn awaited(&self) -> Awaited<'_> {
        self.awaiting.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Awaited(&self.awaiting)
    }

    /// Whether another acquire request than the caller's (which holds an [Awaited]) waits on
    /// this handle: a request that gives up then leaves it queued for that one.
    pub fn awaited_by_others(&self) -> bool {
        self.awaiting.load(std::sync::atomic::Ordering::SeqCst) > 1
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
        // Decided: from here on the request waits by design (for its turn), not for zkgate.
        crate::admission::park();
        let granted_or_done = updates.wait_for(|s| matches!(s.phase, Phase::Held { .. }) || s.phase.is_final());
        let _ = tokio::time::timeout_at(deadline, granted_or_done).await;
        self.state().phase
    }

    /// Asks the task to leave the queue or give up what it holds, and waits until its znodes
    /// are gone (bounded by the session: an unreachable ZooKeeper removes them on expiry).
    pub async fn release(&self) {
        self.release.cancel();
        self.finished().await;
    }

    /// Waits until its task has finished: its znodes cleaned up (or left to the instance that
    /// keeps its lease now), and, unless it was lost, off its lease.
    pub async fn finished(&self) {
        let _ = self.finished.subscribe().wait_for(|f| *f).await;
    }

    /// Held by its lease, expired, until `until_ms` (its lock-delay).
    pub fn set_delayed(&self, until_ms: i64) {
        self.state.send_modify(|s| s.delayed_until = Some(until_ms));
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

    /// Whether its run may still create its znodes (see [create_held]).
    pub fn may_create(&self) -> bool {
        self.may_create.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Its znodes exist: a later run finds them, never makes them again.
    pub fn created(&self) {
        self.may_create.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// The name of its holding record under its lease's record.
    pub fn record_name(&self) -> &str {
        &self.record_name
    }

    /// The znode under its lease's record that names it.
    pub fn record_path(&self) -> String {
        self.lease.record_path(&self.record_name)
    }

    fn set_phase(&self, phase: Phase) {
        self.state.send_modify(|s| s.phase = phase);
        self.recount();
    }

    /// Counts the handle in its registry's queued counts, or out, as its phase now says.
    fn recount(&self) {
        let queued = self.state.borrow().phase.is_queued();
        if self.counted.swap(queued, std::sync::atomic::Ordering::SeqCst) != queued {
            self.queued.change(&self.name, &self.lease.principal, queued);
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
        self.protocol.count_grant(labels);
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
        if let Some(me) = self.me.locked().take() {
            self.lease.detach(&me);
        }
    }
}

impl<P: Protocol> Holding for Handle<P> {
    fn view(&self) -> Option<HoldingView> {
        if !self.protocol.shown() {
            return None;
        }
        let state = self.state();
        Some(HoldingView {
            kind: self.protocol.kind().name(),
            name: self.name.clone(),
            handle: self.id.clone(),
            state: state.phase.name(),
            fencing_token: state.fencing_token(),
            revocation: state.revocation,
        })
    }

    fn finished(&self) -> watch::Receiver<bool> {
        self.finished.subscribe()
    }

    fn record_name(&self) -> String {
        self.record_name.clone()
    }
}

/// An acquire request waiting on a handle (see [Handle::awaited]).
pub struct Awaited<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Awaited<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}
