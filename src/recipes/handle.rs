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
//!   and their reference together. A task whose znode vanished therefore asks whether the
//!   reference went too: if so the holding was released, else it was lost.
//!
//! A handle is a [Holding] of its lease, so the lease shows it and waits for it when it ends;
//! [Handles] indexes the handles of one kind on this instance.
//!
//! Over 600 lines: the handle, its task (`drive`) and the registry (`Handles`) share private
//! state; issue 31 splits the registry from the task once the contender driver trait removes the
//! kind special cases here.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client::{Client, Error as ZkError, MultiWriteError, MultiWriteResult, MultiWriter};

use super::lease::record::HoldingRecord;
use super::lease::{GuardError, Holding, HoldingView, Lease};
use super::revocation::Revocation;
use crate::kind::Kind;
use crate::locked::Locked;
use crate::zk::{Failure, retry_on_loss};

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
    /// Its znode vanished (a release through another instance, if its reference went too).
    Lost(String),
    Failed(ZkError),
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
            err => Exit::Failed(err),
        }
    }

    /// The exit of a write guarded by the lease that failed.
    pub fn from_guard(err: GuardError) -> Exit {
        match err {
            GuardError::LeaseMoved => Exit::Moved,
            GuardError::ZooKeeper(err) => Exit::from_error(err),
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

    /// Removes what the run created and the holding's reference (also when it was cancelled in
    /// the middle of a create: the GUID finds it). `Ok(false)` if a node the handle held was
    /// already gone, which makes a release a loss; `Err` if ZooKeeper could not be told (tried
    /// again on the next session).
    fn clean_up(&self, handle: &Handle<Self>, client: &Client) -> impl Future<Output = Result<bool, ZkError>> + Send;

    /// What the lease's reference to this holding records.
    fn record(&self, handle: &Handle<Self>) -> HoldingRecord;

    /// Whether it shows among its lease's holdings.
    fn shown(&self) -> bool {
        true
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

    /// Whether its run may still create its znodes (see [create_held]).
    pub fn may_create(&self) -> bool {
        self.may_create.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Its znodes exist: a later run finds them, never makes them again.
    pub fn created(&self) {
        self.may_create.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// The znode under its lease's record that names it.
    pub fn reference(&self) -> String {
        self.lease.reference(self.protocol.kind(), &self.name, &self.id)
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
}

/// How a handle's task stopped running its protocol.
enum Stop {
    /// The run ended by itself.
    Exit(Exit),
    /// Released, or its lease ended: its znodes go.
    Leave,
    /// Its lease left this instance: its znodes stay, for the keeper now.
    Drop,
    /// Its clean-up found it lost (its node gone, which it deleted the reference of, or its
    /// lease ended otherwise than by its owner): said so, without asking ZooKeeper again.
    Lost(String),
}

/// Runs the protocol until it ends (again on each new session, see the module's docs), then
/// cleans up and reports.
async fn drive<P: Protocol>(handle: &Arc<Handle<P>>) {
    let lease = &handle.lease;
    let mut ended_generation = None;
    let stop = loop {
        let session = tokio::select! {
            session = connected_after(&lease.zk, ended_generation) => session,
            _ = handle.release.cancelled() => break Stop::Leave,
            _ = lease.ended().cancelled() => break Stop::Leave,
            _ = lease.dropped().cancelled() => break Stop::Drop,
        };
        let client = session.client();
        let run = handle.protocol.run(handle, client);
        tokio::pin!(run);
        let stop = tokio::select! {
            exit = &mut run => Stop::Exit(exit),
            _ = handle.release.cancelled() => Stop::Leave,
            _ = lease.ended().cancelled() => Stop::Leave,
            _ = lease.dropped().cancelled() => Stop::Drop,
        };
        match stop {
            // Its watches went with the session: on the next one.
            Stop::Exit(Exit::Interrupted) => ended_generation = Some(session.generation),
            Stop::Leave => {
                // Clean up while the run (pinned in this block) and its watches are still alive:
                // a deletion fires a watch and the server forgets it, where dropping it first
                // would cost a removeWatches request on every release.
                match handle.protocol.clean_up(handle, client).await {
                    Ok(was_there) => break left(handle, was_there),
                    Err(err) => {
                        tracing::debug!(handle = %handle.id, error = %err, "clean-up interrupted; trying again");
                        after_failure(&lease.zk, session.generation, &err).await;
                        break clean_up_later(handle).await;
                    }
                }
            }
            stop => break stop,
        }
    };
    // Why, for the log: which way the task stopped.
    let why = match &stop {
        Stop::Exit(_) => "its run ended",
        Stop::Leave if handle.release.is_cancelled() => "released here",
        Stop::Leave => "its lease ended",
        Stop::Drop => "its lease left this instance",
        Stop::Lost(_) => "its clean-up found it lost",
    };
    let end = match stop {
        Stop::Drop | Stop::Exit(Exit::Moved) => Phase::Moved,
        Stop::Exit(Exit::Failed(error)) => Phase::Failed { error: error.into() },
        // A loss found by the clean-up itself (its node gone, or its lease expired) is one.
        Stop::Lost(reason) => Phase::Lost { reason },
        // A node the run saw vanish may have been released through another instance, even
        // while a release here was starting: a release sent again after its first attempt's
        // answer was lost (that one, through an instance that died, deleted it), which is
        // answered as the release it is, not as a loss.
        Stop::Exit(Exit::Lost(reason)) => match released_elsewhere(handle).await {
            true => Phase::Released,
            false => Phase::Lost { reason },
        },
        Stop::Exit(Exit::Interrupted) | Stop::Leave => Phase::Released,
    };
    tracing::debug!(kind = %handle.protocol.kind(), name = %handle.name, handle = %handle.id, lease = %handle.lease.id, phase = end.name(), why, "handle finished");
    handle.record_end(&end);
    let lost = matches!(end, Phase::Lost { .. });
    handle.set_phase(end);
    if lost && !handle.is_leaving() {
        // The reference stays, so that the loss shows on the lease (here and on any keeper
        // after this one), until the holder releases the handle or the lease ends.
        tokio::select! {
            _ = handle.release.cancelled() => remove_reference(handle).await,
            _ = lease.ended().cancelled() => remove_reference(handle).await,
            _ = lease.dropped().cancelled() => {}
        }
    }
    handle.finished.send_replace(true);
    // Lost handles stay on the lease so that its holder learns of the loss; the rest leave it.
    if !lost {
        handle.detach();
    }
}

/// Deletes the reference of a lost handle (its znode is gone already), on the sessions that
/// follow until it is done or the lease leaves this instance.
async fn remove_reference<P: Protocol>(handle: &Arc<Handle<P>>) {
    let (zk, reference) = (&handle.lease.zk, [handle.reference()]);
    loop {
        let session = tokio::select! {
            session = connected_after(zk, None) => session,
            _ = handle.lease.dropped().cancelled() => return,
        };
        match delete_all(session.client(), &reference).await {
            Ok(_) => return,
            Err(err) => after_failure(zk, session.generation, &err).await,
        }
    }
}

/// How a handle that left ended, from whether its znode was still there: a lease that ended
/// otherwise than by its owner's delete (it expired) took what it held away from its holder,
/// which is a loss, said as one, not a release the holder asked for; so is a node found gone.
fn left<P: Protocol>(handle: &Handle<P>, was_there: bool) -> Stop {
    let taken = handle
        .lease
        .end_reason()
        .filter(|r| *r != super::lease::EndReason::Deleted && !handle.release.is_cancelled());
    match taken {
        Some(reason) => Stop::Lost(reason.describe().to_string()),
        None if was_there => Stop::Leave,
        None => Stop::Lost(handle.protocol.loss_reason(handle)),
    }
}

/// Cleans up on the sessions that follow, until it is done or the lease leaves this instance
/// (the reaper finishes what an ended lease leaves behind, see [crate::keeper]).
async fn clean_up_later<P: Protocol>(handle: &Arc<Handle<P>>) -> Stop {
    let zk = &handle.lease.zk;
    loop {
        let session = tokio::select! {
            session = connected_after(zk, None) => session,
            _ = handle.lease.dropped().cancelled() => return Stop::Drop,
        };
        match handle.protocol.clean_up(handle, session.client()).await {
            Ok(was_there) => return left(handle, was_there),
            Err(err) => after_failure(zk, session.generation, &err).await,
        }
    }
}

/// Whether a holding whose znode vanished was released (through another instance, which
/// deletes the holding's reference with its znodes) rather than lost (its reference stays,
/// so that its holder learns of the loss until it releases the handle).
async fn released_elsewhere<P: Protocol>(handle: &Handle<P>) -> bool {
    let Ok(session) = handle.lease.session().await else {
        return false;
    };
    // After a `sync`: the reference may have been made through another server a moment ago
    // (a holding adopted in a takeover), and a stale "no reference" would call a loss a release.
    if session.sync().await.is_err() {
        return false;
    }
    matches!(
        retry_on_loss(|| session.client().check_stat(&handle.reference())).await,
        Ok(None)
    )
}

/// A connected session of `zk` (waiting, without polling, while there is none) other than the
/// one of generation `not` (one that was found
/// ended: its client fails every request at once, and asking it again would spin until the
/// supervisor, maybe waiting for this very thread, publishes the next one), waiting for it
/// without polling.
async fn connected_after(zk: &crate::zk::session::ZkSession, not: Option<u64>) -> crate::zk::session::Session {
    let mut status = zk.subscribe();
    loop {
        if let Ok(session) = zk.current()
            && Some(session.generation) != not
        {
            return session;
        }
        if status.changed().await.is_err() {
            // The supervisor stopped (the instance is shutting down): nothing more to run on.
            std::future::pending::<()>().await;
        }
    }
}

/// Waits before trying again what failed on the session of generation `generation`: for the
/// next session if that one ended, else a moment.
async fn after_failure(zk: &crate::zk::session::ZkSession, generation: u64, err: &ZkError) {
    match err {
        ZkError::SessionExpired | ZkError::ClientClosed => {
            connected_after(zk, Some(generation)).await;
        }
        _ => tokio::time::sleep(Duration::from_millis(500)).await,
    }
}

/// An acquire request waiting on a handle (see [Handle::awaited]).
pub struct Awaited<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Awaited<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Why [create_held] made nothing.
#[derive(Debug)]
pub enum NotCreated {
    /// The lease moved to another instance (or ended): nothing was written.
    LeaseMoved,
    /// Operation `index` of the holding's own (0 for the first it added) failed.
    Refused { index: usize, error: ZkError },
    /// The request failed as a whole: a connection loss (it may have been applied: look before
    /// creating again) or the session's end.
    Request(ZkError),
}

impl NotCreated {
    /// The exit for a run whose create failed with an error it does not handle itself.
    pub fn exit(self) -> Exit {
        match self {
            NotCreated::LeaseMoved => Exit::Moved,
            NotCreated::Refused { error, .. } | NotCreated::Request(error) => Exit::from_error(error),
        }
    }
}

/// What [create_held] made.
pub struct Made {
    /// The results of the holding's own operations.
    pub results: Vec<MultiWriteResult>,
    /// The listing it was asked to send after them, if it was.
    pub listed: Option<Result<Vec<String>, ZkError>>,
    /// The zxid of the multi-op's transaction (the `czxid` of every node it created), read
    /// from the reference in the same round trip: ZooKeeper 3.8's multi-op answers a create
    /// without its stat (ZOOKEEPER-4026), and a contender's fencing token is its `czxid`.
    pub czxid: Option<i64>,
}

/// Creates a holding's znodes (what `add` adds to the multi-op) together with its reference
/// under the lease's record, guarded by the lease (the record's version as kept here, or its
/// creation: see [Lease::guard]), in one multi-op: all or nothing. With `then_list`, that
/// directory's children are asked for right after the write on the same session (one round
/// trip for both; ZooKeeper serves a session in order, so the listing sees the write).
pub async fn create_held<P: Protocol>(
    handle: &Handle<P>,
    client: &Client,
    add: impl Fn(&mut MultiWriter<'_>) -> Result<(), ZkError>,
    then_list: Option<&str>,
) -> Result<Made, NotCreated> {
    let reference = handle.protocol.record(handle).to_bytes();
    commit_guarded(handle, client, Some(&reference), add, then_list).await
}

/// The requests [commit_guarded] sends right after its multi-op, on the same session (so
/// that they see it), in the same round trip.
async fn read_after(
    client: &Client,
    then_list: Option<&str>,
    then_stat: Option<&str>,
) -> (Option<Result<Vec<String>, ZkError>>, Option<i64>) {
    // Each request is sent when its future is made: both leave before either is awaited.
    let listing = then_list.map(|dir| client.list_children(dir));
    let stat = then_stat.map(|path| client.check_stat(path));
    let listed = match listing {
        Some(listing) => Some(listing.await),
        None => None,
    };
    let czxid = match stat {
        Some(stat) => stat.await.ok().flatten().map(|stat| stat.czxid),
        None => None,
    };
    (listed, czxid)
}

/// Writes what `add` adds for a holding that exists already (a semaphore's permit node, an
/// election's acknowledgement), guarded by the lease as [create_held] is.
pub async fn write_held<P: Protocol>(
    handle: &Handle<P>,
    client: &Client,
    add: impl Fn(&mut MultiWriter<'_>) -> Result<(), ZkError>,
) -> Result<Vec<MultiWriteResult>, NotCreated> {
    Ok(commit_guarded(handle, client, None, add, None).await?.results)
}

async fn commit_guarded<P: Protocol>(
    handle: &Handle<P>,
    client: &Client,
    reference: Option<&[u8]>,
    add: impl Fn(&mut MultiWriter<'_>) -> Result<(), ZkError>,
    then_list: Option<&str>,
) -> Result<Made, NotCreated> {
    let own = if reference.is_some() { 2 } else { 1 };
    let options = zookeeper_client::CreateMode::Persistent.with_acls(crate::zk::acls());
    loop {
        let mut writer = client.new_multi_writer();
        let guard = handle.lease.guard(&mut writer).map_err(NotCreated::Request)?;
        reference
            .map_or(Ok(()), |reference| {
                writer.add_create(&handle.reference(), reference, &options)
            })
            .and_then(|()| add(&mut writer))
            .map_err(NotCreated::Request)?;
        let started = std::time::Instant::now();
        // The requests are sent here, in this order; their replies come together.
        let commit = writer.commit();
        let then_stat = reference.map(|_| handle.reference());
        let (committed, (listed, czxid)) = tokio::join!(commit, read_after(client, then_list, then_stat.as_deref()));
        crate::metrics::zookeeper_request(started.elapsed());
        let failed = match committed {
            Ok(results) => {
                let _ = handle.lease.guarded(guard, None);
                handle.created();
                return Ok(Made {
                    results: results.into_iter().skip(own).collect(),
                    listed,
                    czxid,
                });
            }
            Err(MultiWriteError::RequestFailed { source }) => return Err(NotCreated::Request(source)),
            Err(MultiWriteError::OperationFailed { index, source }) => (index, source),
        };
        match failed {
            (0, error) => match handle.lease.guarded(guard, Some((0, error))) {
                Ok(_) => continue,
                Err(GuardError::LeaseMoved) => return Err(NotCreated::LeaseMoved),
                Err(GuardError::ZooKeeper(error)) => return Err(NotCreated::Request(error)),
            },
            // The reference is there already: an earlier create of this holding applied (its
            // reply lost); its znodes are to be found, not made again.
            (1, ZkError::NodeExists) if own == 2 => {
                return Err(NotCreated::Refused {
                    index: usize::MAX,
                    error: ZkError::NodeExists,
                });
            }
            (1, error) if own == 2 => return Err(NotCreated::Request(error)),
            (index, error) => {
                return Err(NotCreated::Refused {
                    index: index - own,
                    error,
                });
            }
        }
    }
}

/// Deletes `paths` (a holding's znodes, its reference last) in one multi-op; a path already
/// gone is left out and the rest deleted again. Returns, for each path, whether it was there.
pub async fn delete_all(client: &Client, paths: &[String]) -> Result<Vec<bool>, ZkError> {
    let mut there = vec![true; paths.len()];
    let mut pending = vec![true; paths.len()];
    // After a lost reply a path found gone may be one this deleted: it counts as there.
    let mut reply_lost = false;
    loop {
        let mut writer = client.new_multi_writer();
        let left: Vec<usize> = (0..paths.len()).filter(|&i| pending[i]).collect();
        if left.is_empty() {
            return Ok(there);
        }
        for &i in &left {
            writer.add_delete(&paths[i], None)?;
        }
        let started = std::time::Instant::now();
        let committed = writer.commit().await;
        crate::metrics::zookeeper_request(started.elapsed());
        match committed {
            Ok(_) => return Ok(there),
            Err(MultiWriteError::OperationFailed {
                index,
                source: ZkError::NoNode,
            }) => {
                pending[left[index]] = false;
                there[left[index]] &= reply_lost;
            }
            Err(err) => {
                let err = ZkError::from(err);
                if !crate::zk::is_loss(&err) {
                    return Err(err);
                }
                // Applied or not, the next attempt tells: what is gone is left out.
                reply_lost = true;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

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
            let mut map = map.locked();
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

    /// `<root>/<kind's dir>`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// zkgate's root znode.
    pub fn root(&self) -> &str {
        &self.root
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
        let id = id.unwrap_or_else(|| crate::ids::sibling_id(&lease.id));
        let handle = self.insert(&mut index, lease, name, id, protocol, true)?;
        Ok((handle, true))
    }

    /// Takes over the handle `id` at `name` of a lease adopted from another keeper (see
    /// [crate::keeper]), from its reference: its task finds its znodes and goes on, or finds
    /// them gone (lost). The handle already here is kept.
    pub fn adopt(&self, lease: &Arc<Lease>, name: &str, id: &str, protocol: P) -> Result<Arc<Handle<P>>, Refused<P>> {
        let mut index = self.lock();
        if let Some(existing) = index.by_id.get(&(name.to_string(), id.to_string()))
            && Arc::ptr_eq(&existing.lease, lease)
        {
            return Ok(existing.clone());
        }
        self.insert(&mut index, lease, name, id.to_string(), protocol, false)
    }

    fn insert(
        &self,
        index: &mut Index<P>,
        lease: &Arc<Lease>,
        name: &str,
        id: String,
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
            state: watch::Sender::new(HandleState {
                phase: Phase::Pending,
                node: None,
                granted: false,
                revocation: None,
            }),
            release: CancellationToken::new(),
            finished: watch::Sender::new(false),
            awaiting: std::sync::atomic::AtomicUsize::new(0),
            me: Mutex::new(None),
            _metered: protocol_metered.then(|| crate::metrics::get().hold_name(kind_label, name)),
            queued: self.queued.clone(),
            counted: std::sync::atomic::AtomicBool::new(false),
            may_create: std::sync::atomic::AtomicBool::new(may_create),
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
        self.lock().forget(handle);
        handle.detach();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index<P>> {
        self.index.locked()
    }
}
