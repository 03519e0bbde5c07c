//! Contenders: the machinery shared by the recipes built on ordered ephemeral sequential
//! znodes (exclusive locks, read/write locks, leader election).
//!
//! A contender is one lease's place at one resource. Its own task drives the recipe: create
//! `<dir>/_c_<guid><infix><seq>` and list the children in one round trip, ask the role's pure
//! decision function what to do, watch the one node it names, repeat until it holds; then
//! report a deletion of its node by anyone else as a loss. Releasing (or the lease ending)
//! deletes the node, which wakes the next waiter through ZooKeeper.
//!
//! The fencing token is the contender znode's `czxid`: zxids are handed out in the one order
//! in which ZooKeeper applies writes, and contenders are granted in creation order, so tokens
//! strictly increase in grant order, even across a deleted and recreated resource znode
//! (where sequence numbers would start again from zero).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use zookeeper_client::{Client, CreateMode, Error as ZkError, EventType};

use crate::lease::{Holding, HoldingView, Lease};
use crate::recipes::revocation::{self, Revocation};
use crate::recipes::{election, in_sequence_order, lock, rwlock};
use crate::zk::retry_on_loss;

/// How long a holder runs before its own znode is watched (see `contend`).
const HELD_WATCH_DELAY: Duration = Duration::from_millis(200);

const DELETED_WHILE_HELD: &str = "its znode was deleted while it held the lock";

/// What a contender does next, decided from the children of the recipe's znode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next<'a> {
    /// Nothing ahead of it blocks it: it holds (the lock, a read lock, the leadership).
    Hold,
    /// `position` contenders are ahead of it; it watches `predecessor`, the one node whose
    /// deletion may let it proceed.
    Wait { predecessor: &'a str, position: usize },
    /// Its node is not among the children: it was deleted (lease ended, session lost, forced).
    Missing,
}

/// What a contender is for, which decides its znode name and when it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// An exclusive lock's contender.
    Exclusive,
    /// A read/write lock's reader.
    Read,
    /// A read/write lock's writer.
    Write,
    /// An election's candidate.
    Candidate,
}

impl Role {
    /// Curator's name infix: nodes are `_c_<guid><infix><seq>` (`InterProcessMutex`,
    /// `InterProcessReadWriteLock`, `LeaderLatch`).
    pub fn infix(self) -> &'static str {
        match self {
            Role::Exclusive => lock::INFIX,
            Role::Read => rwlock::READ_INFIX,
            Role::Write => rwlock::WRITE_INFIX,
            Role::Candidate => election::INFIX,
        }
    }

    /// The kind of resource, as shown on leases.
    pub fn kind(self) -> &'static str {
        match self {
            Role::Exclusive => "lock",
            Role::Read | Role::Write => "rwlock",
            Role::Candidate => "election",
        }
    }

    /// The recipe's decision for the contender `me` given the resource's `children`: a lock
    /// contender, a writer and a candidate wait for every lower node (they watch the next
    /// lower one); a reader waits only for lower writers.
    pub fn next_step<'a, S: AsRef<str>>(self, children: &'a [S], me: &str) -> Next<'a> {
        match self {
            Role::Exclusive | Role::Write | Role::Candidate => lock::next_step(children, me),
            Role::Read => rwlock::next_read_step(children, me),
        }
    }
}

/// Where a contender stands.
#[derive(Clone, Debug, PartialEq)]
pub enum Phase {
    /// Its znode is being created.
    Pending,
    /// In the queue, `position` contenders ahead.
    Waiting { position: usize },
    /// It holds the lock since `since`.
    Held { since: SystemTime },
    /// It held or waited, and its znode vanished without a release (lease or session ended,
    /// or somebody deleted it).
    Lost { reason: String },
    /// Released by its holder (or its lease ended); its znode is gone.
    Released,
    /// Its znode could not be created.
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
}

/// A contender's znode once created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// The child name, e.g. `_c_<guid>-lock-0000000042`.
    pub name: String,
    /// Its `czxid`: the fencing token.
    pub czxid: i64,
}

/// Snapshot of a contender.
#[derive(Clone, Debug)]
pub struct ContenderState {
    pub phase: Phase,
    pub node: Option<Node>,
    /// Whether it was ever granted: its fencing token is meaningful (held, or lost after).
    pub granted: bool,
    /// A request to give the lock up, once its holder has seen one.
    pub revocation: Option<Revocation>,
}

impl ContenderState {
    /// The fencing token, once granted.
    pub fn fencing_token(&self) -> Option<i64> {
        self.node.as_ref().filter(|_| self.granted).map(|n| n.czxid)
    }
}

/// One lease's contender for one lock (or read/write lock), driven by its own task.
pub struct Contender {
    pub handle: String,
    pub role: Role,
    /// The resource's name.
    pub name: String,
    pub lease: Arc<Lease>,
    /// A value the contender publishes in its znode.
    pub value: Option<serde_json::Value>,
    pub created_at: SystemTime,
    dir: String,
    guid: String,
    state: watch::Sender<ContenderState>,
    release: CancellationToken,
    finished: watch::Sender<bool>,
    /// Our side of `Holding`, set once attached to the lease.
    me: Mutex<Option<Arc<dyn Holding>>>,
}

impl Contender {
    pub fn state(&self) -> ContenderState {
        self.state.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<ContenderState> {
        self.state.subscribe()
    }

    pub fn node_path(&self) -> Option<String> {
        self.state
            .borrow()
            .node
            .as_ref()
            .map(|n| format!("{}/{}", self.dir, n.name))
    }

    /// Asks the driver to leave the queue or release the lock, and waits until the znode is
    /// gone (bounded by the session: an unreachable ZooKeeper removes it on expiry).
    pub async fn release(&self) {
        self.release.cancel();
        let mut finished = self.finished.subscribe();
        let _ = finished.wait_for(|f| *f).await;
    }

    /// Metrics of a grant: the wait since the contender joined, one more acquisition (and
    /// leader change, for a candidate).
    fn record_grant(&self, since: SystemTime) {
        let m = crate::metrics::get();
        let labels = [self.role.kind(), self.name.as_str()];
        let waited = since.duration_since(self.created_at).unwrap_or_default();
        m.lock_wait.with_label_values(&labels).observe(waited.as_secs_f64());
        m.lock_acquisitions.with_label_values(&labels).inc();
        if self.role == Role::Candidate {
            m.leader_changes.with_label_values(&[self.name.as_str()]).inc();
        }
    }

    /// Metrics of the end: the hold's length if it held, a loss if it was lost.
    fn record_end(&self, end: &Phase) {
        let m = crate::metrics::get();
        let labels = [self.role.kind(), self.name.as_str()];
        if let Phase::Held { since } = self.state().phase {
            let held = since.elapsed().unwrap_or_default();
            m.lock_hold.with_label_values(&labels).observe(held.as_secs_f64());
        }
        if matches!(end, Phase::Lost { .. }) {
            m.lock_losses.with_label_values(&labels).inc();
        }
    }

    fn set_phase(&self, phase: Phase) {
        self.state.send_modify(|s| s.phase = phase);
    }
}

impl Holding for Contender {
    fn view(&self) -> HoldingView {
        let state = self.state();
        HoldingView {
            kind: self.role.kind(),
            name: self.name.clone(),
            handle: self.handle.clone(),
            state: state.phase.name(),
            fencing_token: state.fencing_token(),
            revocation: state.revocation,
        }
    }

    fn finished(&self) -> watch::Receiver<bool> {
        self.finished.subscribe()
    }
}

/// How a driver ended.
enum Exit {
    Released,
    Lost(String),
    Failed(ZkError),
}

/// What a new contender is: its role, the resource's name and znode, its lease and value.
pub struct Spec {
    pub role: Role,
    pub name: String,
    pub dir: String,
    pub lease: Arc<Lease>,
    pub value: Option<serde_json::Value>,
}

/// Spawns the driver for a new contender, on its lease's session. `on_exit` runs once its znode
/// is gone, to drop it from indexes.
pub fn spawn_contender(spec: Spec, on_exit: impl FnOnce(&Arc<Contender>) + Send + 'static) -> Option<Arc<Contender>> {
    let Spec {
        role,
        name,
        dir,
        lease,
        value,
    } = spec;
    let contender = Arc::new(Contender {
        handle: crate::ids::sibling_id(&lease.id),
        role,
        name,
        lease: lease.clone(),
        value,
        created_at: SystemTime::now(),
        dir,
        guid: uuid::Uuid::new_v4().to_string(),
        state: watch::Sender::new(ContenderState {
            phase: Phase::Pending,
            node: None,
            granted: false,
            revocation: None,
        }),
        release: CancellationToken::new(),
        finished: watch::Sender::new(false),
        me: Mutex::new(None),
    });
    let holding: Arc<dyn Holding> = contender.clone();
    if !lease.attach(holding.clone()) {
        return None;
    }
    *contender.me.lock().unwrap_or_else(|e| e.into_inner()) = Some(holding);
    let driver = contender.clone();
    tokio::spawn(async move {
        drive(&driver).await;
        on_exit(&driver);
    });
    Some(contender)
}

/// Runs the recipe on the lease's own session (lane): the contender's znode must live and die
/// with the lease's session, and one session keeps the create and the listing in order.
async fn drive(contender: &Arc<Contender>) {
    let exit = match contender.lease.zk.connected().await {
        Err(err) => Exit::Failed(match err {
            crate::zk::session::Unavailable::NoSession => ZkError::SessionExpired,
            crate::zk::session::Unavailable::Disconnected => ZkError::ConnectionLoss,
        }),
        Ok(session) if session.generation != contender.lease.generation => {
            Exit::Lost("the lease's ZooKeeper session has ended".into())
        }
        Ok(session) => {
            let client = session.client;
            let recipe = contend(contender, &client);
            tokio::pin!(recipe);
            let exit = tokio::select! {
                exit = &mut recipe => exit,
                _ = contender.release.cancelled() => Exit::Released,
                _ = contender.lease.ended().cancelled() => Exit::Released,
            };
            // Delete while the recipe (pinned in this block) and its watch on its own node are
            // still alive: the deletion fires the watch and the server forgets it, where
            // dropping it first would cost a removeWatches request on every release.
            let was_there = remove_node(contender, &client).await;
            match exit {
                Exit::Released if !was_there => Exit::Lost(deleted_while_held(contender)),
                exit => exit,
            }
        }
    };
    let phase = match exit {
        Exit::Released => Phase::Released,
        Exit::Lost(reason) => Phase::Lost { reason },
        Exit::Failed(error) => Phase::Failed { error },
    };
    tracing::debug!(name = %contender.name, role = ?contender.role, handle = %contender.handle, phase = phase.name(), "contender finished");
    contender.record_end(&phase);
    contender.set_phase(phase);
    contender.finished.send_replace(true);
    // Lost contenders stay on the lease so its holder learns of the loss; the rest leave it.
    if !matches!(contender.state().phase, Phase::Lost { .. })
        && let Some(me) = contender.me.lock().unwrap_or_else(|e| e.into_inner()).take()
    {
        contender.lease.detach(&me);
    }
}

/// The recipe: create, then list / watch the predecessor until it holds, then watch its own
/// node so that a deletion by anyone else is reported as a loss.
async fn contend(contender: &Contender, client: &Client) -> Exit {
    let (node, mut children) = match create_node(contender, client).await {
        Ok(created) => created,
        Err(err) => return Exit::Failed(err),
    };
    contender.state.send_modify(|s| s.node = Some(node.clone()));
    loop {
        match contender.role.next_step(&children, &node.name) {
            Next::Hold => break,
            Next::Missing => return Exit::Lost("its znode was deleted while it waited".into()),
            Next::Wait { predecessor, position } => {
                contender.set_phase(Phase::Waiting { position });
                let path = format!("{}/{}", contender.dir, predecessor);
                match retry_on_loss(|| client.check_and_watch_stat(&path)).await {
                    Ok((None, _)) => {}
                    Ok((Some(_), watcher)) => {
                        if watcher.changed().await.event_type == EventType::Session {
                            return Exit::Lost("the ZooKeeper session ended while it waited".into());
                        }
                    }
                    Err(err) => return lost_or_failed(err),
                }
            }
        }
        children = match retry_on_loss(|| client.list_children(&contender.dir)).await {
            Ok(children) => children,
            Err(err) => return lost_or_failed(err),
        };
    }
    if contender.role == Role::Candidate {
        // The leader procedure: acknowledge, so observers know the leader has taken over.
        let ack = election::Acknowledgement {
            candidate: node.name.clone(),
            term: node.czxid,
            lease: contender.lease.id.clone(),
            value: contender.value.clone(),
        };
        if let Err(err) = election::acknowledge(client, &contender.dir, &ack).await {
            return lost_or_failed(err);
        }
    }
    let since = SystemTime::now();
    contender.state.send_modify(|s| {
        s.phase = Phase::Held { since };
        s.granted = true;
    });
    contender.record_grant(since);
    // Only now, and only for a hold that lasts, watch the own node so that a deletion by
    // anyone else (an operator, a forced revocation) is reported as a loss. A watch set at once
    // would cost a request and a notification on every grant, a third of an uncontended
    // cycle; a hold shorter than the delay learns of a loss at its release instead (the
    // delete finds no node), and either way the fencing token protects the resource.
    tokio::time::sleep(HELD_WATCH_DELAY).await;
    let own = format!("{}/{}", contender.dir, node.name);
    loop {
        // A data watch: it fires on a revocation request (the node's data changes) and on the
        // node's deletion.
        match retry_on_loss(|| client.get_and_watch_data(&own)).await {
            Ok((data, _, watcher)) => {
                let requested = revocation::record_in(&data);
                if requested.is_some() && contender.state.borrow().revocation != requested {
                    tracing::info!(name = %contender.name, handle = %contender.handle, "revocation requested");
                    contender.state.send_modify(|s| s.revocation = requested);
                }
                match watcher.changed().await.event_type {
                    EventType::NodeDeleted => return Exit::Lost(deleted_while_held(contender)),
                    EventType::Session => {
                        return Exit::Lost("the ZooKeeper session ended while it held the lock".into());
                    }
                    _ => continue,
                }
            }
            Err(ZkError::NoNode) => return Exit::Lost(deleted_while_held(contender)),
            Err(err) => return lost_or_failed(err),
        }
    }
}

/// Why a held node vanished: a forced revocation if one was asked with a grace, else unknown.
fn deleted_while_held(contender: &Contender) -> String {
    match &contender.state.borrow().revocation {
        Some(r) if r.grace_ms.is_some() => {
            format!(
                "revoked by {} ({}): its znode was deleted when the grace period ran out",
                r.by, r.reason
            )
        }
        _ => DELETED_WHILE_HELD.into(),
    }
}

fn lost_or_failed(err: ZkError) -> Exit {
    match err {
        ZkError::SessionExpired | ZkError::ClientClosed => Exit::Lost("the ZooKeeper session ended".into()),
        err => Exit::Failed(err),
    }
}

/// Creates the contender's znode and lists the lock's children in one round trip (both
/// requests are sent back to back on the one session, which ZooKeeper serves in order, so the
/// listing includes the new node).
///
/// # Lost create replies
/// On `ConnectionLoss` the create may have happened; the GUID in the name tells: the children
/// are listed and a node carrying our GUID is adopted instead of creating a second one.
async fn create_node(contender: &Contender, client: &Client) -> Result<(Node, Vec<String>), ZkError> {
    let infix = contender.role.infix();
    let prefix = format!("{}/_c_{}{}", contender.dir, contender.guid, infix);
    let mut data = serde_json::json!({ "lease": contender.lease.id, "handle": contender.handle });
    if let Some(value) = &contender.value {
        data["value"] = value.clone();
    }
    // Whose it is, for any instance that must decide whether a caller may revoke it.
    if let Some(owner) = &contender.lease.owner {
        data["principal"] = owner.as_str().into();
    }
    let data = data.to_string();
    let options = CreateMode::EphemeralSequential.with_acls(crate::zk::acls());
    loop {
        let create = client.create(&prefix, data.as_bytes(), &options);
        let list = client.list_children(&contender.dir);
        let started = std::time::Instant::now();
        let (created, listed) = tokio::join!(create, list);
        crate::metrics::zookeeper_request(started.elapsed());
        match created {
            Ok((stat, sequence)) => {
                let name = format!("_c_{}{}{}", contender.guid, infix, sequence);
                let children = match listed {
                    Ok(children) => children,
                    Err(_) => retry_on_loss(|| client.list_children(&contender.dir)).await?,
                };
                return Ok((
                    Node {
                        name,
                        czxid: stat.czxid,
                    },
                    children,
                ));
            }
            Err(ZkError::NoNode) => ensure_dir(client, &contender.dir).await?,
            Err(err) if crate::zk::is_loss(&err) => {
                if let Some(node) = find_by_guid(client, &contender.dir, &contender.guid).await? {
                    let children = retry_on_loss(|| client.list_children(&contender.dir)).await?;
                    return Ok((node, children));
                }
            }
            Err(err) => return Err(err),
        }
    }
}

/// The node of ours (by GUID) under `dir`, if the server has one.
pub(crate) async fn find_by_guid(client: &Client, dir: &str, guid: &str) -> Result<Option<Node>, ZkError> {
    let children = match retry_on_loss(|| client.list_children(dir)).await {
        Ok(children) => children,
        // The create failed for want of the lock znode (and its reply was lost).
        Err(ZkError::NoNode) => return Ok(None),
        Err(err) => return Err(err),
    };
    let Some(name) = children.into_iter().find(|c| c.contains(guid)) else {
        return Ok(None);
    };
    let path = format!("{dir}/{name}");
    match retry_on_loss(|| client.check_stat(&path)).await? {
        Some(stat) => Ok(Some(Node {
            name,
            czxid: stat.czxid,
        })),
        None => Ok(None),
    }
}

/// Creates the resource's znode as a container (ZooKeeper removes it once its last child is
/// gone, as Curator's are), creating `<root>/<kind>` if needed.
pub(crate) async fn ensure_dir(client: &Client, dir: &str) -> Result<(), ZkError> {
    let options = CreateMode::Container.with_acls(crate::zk::acls());
    match retry_on_loss(|| client.create(dir, &[], &options)).await {
        Ok(_) | Err(ZkError::NodeExists) => Ok(()),
        Err(ZkError::NoNode) => {
            let parent = &dir[..dir.rfind('/').unwrap_or(0)];
            crate::zk::session::ensure_path(client, parent).await
        }
        Err(err) => Err(err),
    }
}

/// Deletes the contender's znode, finding it by GUID if its create was still in flight when
/// the driver was cancelled (the create is then applied before the listing, by session order).
/// Returns `false` if a node it had created was already gone.
async fn remove_node(contender: &Contender, client: &Client) -> bool {
    let path = match contender.node_path() {
        Some(path) => path,
        None => match find_by_guid(client, &contender.dir, &contender.guid).await {
            Ok(Some(node)) => format!("{}/{}", contender.dir, node.name),
            _ => return true,
        },
    };
    if contender.role == Role::Candidate {
        // A leader steps down by removing its acknowledgement first, so that its successor
        // never finds a stale one. Done for any candidate: one may be cancelled after it wrote
        // the acknowledgement but before it reported leading.
        let candidate = path.rsplit('/').next().unwrap_or_default();
        election::retract(client, &contender.dir, candidate).await;
    }
    // A delete whose reply was lost may have happened: after a `ConnectionLoss`, `NoNode`
    // means "deleted, maybe by us" and must not be taken for someone else's deletion.
    let mut reply_lost = false;
    let result = retry_on_loss(|| {
        let delete = client.delete(&path, None);
        let attempt_after_loss = std::mem::replace(&mut reply_lost, true);
        async move {
            match delete.await {
                Err(ZkError::NoNode) if attempt_after_loss => Ok(()),
                result => result,
            }
        }
    })
    .await;
    match result {
        Ok(()) | Err(ZkError::SessionExpired) | Err(ZkError::ClientClosed) => true,
        Err(ZkError::NoNode) => false,
        Err(err) => {
            tracing::warn!(%path, error = %err, "could not delete lock contender");
            true
        }
    }
}

/// The contenders of this instance for one kind of resource (locks, read/write locks,
/// elections), indexed by (lease, name) and by handle.
///
/// One lease has at most one contender per resource: a retried acquire finds the contender the
/// first attempt made and returns the same handle instead of queueing twice (the HTTP twin of
/// the recipe's GUID rule).
#[derive(Clone)]
pub struct Contenders {
    base: Arc<str>,
    index: Arc<Mutex<Index>>,
}

#[derive(Default)]
struct Index {
    by_lease: HashMap<(String, String), Arc<Contender>>,
    by_handle: HashMap<String, Arc<Contender>>,
}

/// Why [Contenders::contend] made no contender.
pub enum Refused {
    /// The lease ended meanwhile.
    LeaseEnded,
    /// The lease already contends for this resource in another role (a reader asking to
    /// write): the existing contender.
    OtherRole(Arc<Contender>),
}

impl Contenders {
    /// Contenders under `<root>/<kind_dir>` (`locks`, `rwlocks`, `elections`).
    pub fn new(root: &str, kind_dir: &str) -> Contenders {
        Contenders {
            base: format!("{root}/{kind_dir}").into(),
            index: Arc::default(),
        }
    }

    /// `<root>/<kind_dir>`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The znode of resource `name` (already validated).
    pub fn dir(&self, name: &str) -> String {
        format!("{}/{}", self.base, name)
    }

    /// The lease's contender for `name` in `role`: the existing one unless it is finished, else
    /// a new one publishing `value`. The flag says whether it is new.
    pub fn contend(
        &self,
        lease: &Arc<Lease>,
        name: &str,
        role: Role,
        value: Option<serde_json::Value>,
    ) -> Result<(Arc<Contender>, bool), Refused> {
        let key = (lease.id.clone(), name.to_string());
        let mut index = self.index();
        if let Some(existing) = index.by_lease.get(&key)
            && !existing.state().phase.is_final()
        {
            if existing.role != role {
                return Err(Refused::OtherRole(existing.clone()));
            }
            return Ok((existing.clone(), false));
        }
        let index_ref = self.index.clone();
        let spec = Spec {
            role,
            name: name.to_string(),
            dir: self.dir(name),
            lease: lease.clone(),
            value,
        };
        // The exit hook takes the index lock, which we hold until the contender is inserted, so
        // it cannot run before the insertion even if the driver finishes at once.
        let contender = spawn_contender(spec, move |done| {
            let mut index = index_ref.lock().unwrap_or_else(|e| e.into_inner());
            // A lost contender stays findable by handle until released, so that its holder can
            // learn of the loss; the others leave the indexes now.
            if !matches!(done.state().phase, Phase::Lost { .. }) {
                forget(&mut index, done);
                return;
            }
            let (index_ref, done) = (index_ref.clone(), done.clone());
            tokio::spawn(async move {
                done.lease.ended().cancelled().await;
                forget(&mut index_ref.lock().unwrap_or_else(|e| e.into_inner()), &done);
            });
        })
        .ok_or(Refused::LeaseEnded)?;
        index.by_lease.insert(key, contender.clone());
        index.by_handle.insert(contender.handle.clone(), contender.clone());
        Ok((contender, true))
    }

    /// The contender with this handle, if it is `name`'s.
    pub fn by_handle(&self, name: &str, handle: &str) -> Option<Arc<Contender>> {
        self.index().by_handle.get(handle).filter(|c| c.name == name).cloned()
    }

    /// Whether the lease already has a live contender for `name` (a retried request).
    pub fn contends(&self, lease: &Lease, name: &str) -> bool {
        self.index()
            .by_lease
            .get(&(lease.id.clone(), name.to_string()))
            .is_some_and(|c| !c.state().phase.is_final())
    }

    /// How many contenders of this instance that `matching` selects are queued (not granted,
    /// not finished), for the waiter limits.
    pub fn queued(&self, matching: impl Fn(&Contender) -> bool) -> usize {
        self.index()
            .by_handle
            .values()
            .filter(|c| matching(c) && matches!(c.state().phase, Phase::Pending | Phase::Waiting { .. }))
            .count()
    }

    /// Every contender of this instance for `name`, keyed by its znode name.
    pub fn local_contenders(&self, name: &str) -> HashMap<String, Arc<Contender>> {
        self.index()
            .by_handle
            .values()
            .filter(|c| c.name == name)
            .filter_map(|c| c.state().node.map(|n| (n.name, c.clone())))
            .collect()
    }

    /// Releases a contender (held or queued) and forgets it.
    pub async fn release(&self, contender: &Arc<Contender>) {
        contender.release().await;
        forget(&mut self.index(), contender);
        if let Some(me) = contender.me.lock().unwrap_or_else(|e| e.into_inner()).take() {
            contender.lease.detach(&me);
        }
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn forget(index: &mut Index, contender: &Arc<Contender>) {
    let key = (contender.lease.id.clone(), contender.name.clone());
    if index.by_lease.get(&key).is_some_and(|c| Arc::ptr_eq(c, contender)) {
        index.by_lease.remove(&key);
    }
    index.by_handle.remove(&contender.handle);
}

/// One contender as read from ZooKeeper.
#[derive(Clone, Debug)]
pub struct ContenderRecord {
    pub name: String,
    pub sequence: u64,
    pub czxid: i64,
    /// Creation time, ms since the epoch.
    pub ctime: i64,
    /// The znode's data (zkgate writes `{"lease":..,"handle":..}`; Curator its IP address).
    pub data: Vec<u8>,
}

/// The contenders of the lock at `dir` in queue order (holder first), read in two round trips;
/// `None` if the lock znode does not exist.
pub async fn read_contenders(client: &Client, dir: &str) -> Result<Option<Vec<ContenderRecord>>, ZkError> {
    let children = match retry_on_loss(|| client.list_children(dir)).await {
        Ok(children) => children,
        Err(ZkError::NoNode) => return Ok(None),
        Err(err) => return Err(err),
    };
    let ordered: Vec<String> = in_sequence_order(&children)
        .into_iter()
        .map(|(_, name)| name.to_string())
        .collect();
    // A contender gone between the listing and the read has left the queue.
    let records = crate::zk::read_each(client, dir, ordered)
        .await?
        .into_iter()
        .filter_map(|(name, data, stat)| {
            let sequence = super::sequence_of(&name)?;
            Some(ContenderRecord {
                name,
                sequence,
                czxid: stat.czxid,
                ctime: stat.ctime,
                data,
            })
        })
        .collect();
    Ok(Some(records))
}

/// Most waiters an event topic lists (with their wait start); the count is always complete.
pub const LISTED_WAITERS: usize = 50;

/// The lease a zkgate contender names in its node's data (`null` for other clients' nodes).
pub fn lease_of(data: &[u8]) -> serde_json::Value {
    serde_json::from_slice::<serde_json::Value>(data)
        .ok()
        .and_then(|data| data.get("lease").cloned())
        .unwrap_or(serde_json::Value::Null)
}

/// The first waiters of a queue of contenders, as event topics show them: node, the lease
/// (for zkgate's), when it joined (ms since the epoch).
pub fn queue_view<'a>(waiters: impl Iterator<Item = &'a ContenderRecord>) -> Vec<serde_json::Value> {
    waiters
        .take(LISTED_WAITERS)
        .map(|c| serde_json::json!({ "node": c.name, "lease": lease_of(&c.data), "created_ms": c.ctime }))
        .collect()
}

/// The contenders of the lock at `dir` on the current session, for event topics: none if the
/// lock does not exist, `None` if ZooKeeper cannot be read now (the topic tries again).
pub async fn contenders_now(zk: &crate::zk::session::ZkSession, dir: &str) -> Option<Vec<ContenderRecord>> {
    let client = zk.connected().await.ok()?.client;
    Some(read_contenders(&client, dir).await.ok()?.unwrap_or_default())
}

/// Every resource znode under `base` with its number of children, read in two round trips.
pub async fn read_names(client: &Client, base: &str) -> Result<Vec<(String, i32)>, ZkError> {
    let mut names = match retry_on_loss(|| client.list_children(base)).await {
        Ok(names) => names,
        Err(ZkError::NoNode) => return Ok(Vec::new()),
        Err(err) => return Err(err),
    };
    names.sort();
    let read = crate::zk::read_each(client, base, names).await?;
    Ok(read
        .into_iter()
        .map(|(name, _, stat)| (name, stat.num_children))
        .collect())
}
