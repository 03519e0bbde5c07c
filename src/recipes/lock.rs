//! Exclusive locks: the recipe of the ZooKeeper guide, on Apache Curator's znode names.
//!
//! A contender creates `<root>/locks/<name>/_c_<guid>-lock-<seq>` (ephemeral, sequential),
//! lists the lock's children *without* a watch, holds the lock if its sequence number is the
//! lowest, and otherwise sets an exists-watch on the next lower contender only, so that a
//! release wakes exactly one waiter (no herd). Children are ordered by the sequence suffix
//! alone, whatever their prefix, so Curator's `InterProcessMutex` and kazoo's `Lock` (with
//! `extra_lock_patterns=["-lock-"]`) contend on the same znodes.
//!
//! Why not `zookeeper_client::Client::lock`: it counts only children whose name contains its
//! own lock name, so kazoo's `__lock__` nodes would be invisible to it and both would hold the
//! lock at once; it also cannot leave a contender queued past a caller's wait. The GUID-based
//! recovery of a lost create reply is done here the same way it does it.
//!
//! The fencing token is the contender znode's `czxid`: zxids are handed out in the one order
//! in which ZooKeeper applies writes, and contenders are granted in creation order, so tokens
//! strictly increase in grant order, even across a deleted and recreated lock znode (where
//! sequence numbers would start again from zero).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError, EventType, MultiReadResult};

use crate::lease::{Holding, HoldingView, Lease};
use crate::recipes::in_sequence_order;
use crate::zk::retry_on_loss;
use crate::zk::session::ZkSession;

/// The infix of Curator's lock contender names (`_c_<uuid>-lock-<seq>`).
pub const LOCK_INFIX: &str = "-lock-";

/// How long a holder runs before its own znode is watched (see `contend`).
const HELD_WATCH_DELAY: Duration = Duration::from_millis(200);

const DELETED_WHILE_HELD: &str = "its znode was deleted while it held the lock";

/// What a contender does next, decided from the lock's children.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next<'a> {
    /// It has the lowest sequence number: it holds the lock.
    Hold,
    /// `position` contenders are ahead of it; it watches the one right before it.
    Wait { predecessor: &'a str, position: usize },
    /// Its node is not among the children: it was deleted (lease ended, session lost, forced).
    Missing,
}

/// The recipe's decision for the contender `me` given the lock's `children`.
pub fn next_step<'a, S: AsRef<str>>(children: &'a [S], me: &str) -> Next<'a> {
    let ordered = in_sequence_order(children);
    match ordered.iter().position(|&(_, name)| name == me) {
        None => Next::Missing,
        Some(0) => Next::Hold,
        Some(i) => Next::Wait {
            predecessor: ordered[i - 1].1,
            position: i,
        },
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
}

impl ContenderState {
    /// The fencing token, once granted.
    pub fn fencing_token(&self) -> Option<i64> {
        self.node.as_ref().filter(|_| self.granted).map(|n| n.czxid)
    }
}

/// One lease's contender for one lock, driven by its own task.
pub struct Contender {
    pub handle: String,
    pub lock: String,
    pub lease: Arc<Lease>,
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

    fn set_phase(&self, phase: Phase) {
        self.state.send_modify(|s| s.phase = phase);
    }
}

impl Holding for Contender {
    fn view(&self) -> HoldingView {
        let state = self.state();
        HoldingView {
            kind: "lock",
            name: self.lock.clone(),
            handle: self.handle.clone(),
            state: state.phase.name(),
            fencing_token: state.fencing_token(),
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

/// Spawns the driver for a new contender of `lock` (whose znode is `dir`) on behalf of `lease`.
/// `on_exit` runs once its znode is gone, to drop it from indexes.
pub fn spawn_contender(
    zk: ZkSession,
    lock: &str,
    dir: String,
    lease: Arc<Lease>,
    on_exit: impl FnOnce(&Arc<Contender>) + Send + 'static,
) -> Option<Arc<Contender>> {
    let contender = Arc::new(Contender {
        handle: uuid::Uuid::new_v4().simple().to_string(),
        lock: lock.to_string(),
        lease: lease.clone(),
        created_at: SystemTime::now(),
        dir,
        guid: uuid::Uuid::new_v4().to_string(),
        state: watch::Sender::new(ContenderState {
            phase: Phase::Pending,
            node: None,
            granted: false,
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
        drive(&driver, zk).await;
        on_exit(&driver);
    });
    Some(contender)
}

async fn drive(contender: &Arc<Contender>, zk: ZkSession) {
    let exit = match zk.connected().await {
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
                Exit::Released if !was_there => Exit::Lost(DELETED_WHILE_HELD.into()),
                exit => exit,
            }
        }
    };
    let phase = match exit {
        Exit::Released => Phase::Released,
        Exit::Lost(reason) => Phase::Lost { reason },
        Exit::Failed(error) => Phase::Failed { error },
    };
    tracing::debug!(lock = %contender.lock, handle = %contender.handle, phase = phase.name(), "contender finished");
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
        match next_step(&children, &node.name) {
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
    contender.state.send_modify(|s| {
        s.phase = Phase::Held {
            since: SystemTime::now(),
        };
        s.granted = true;
    });
    // Only now, and only for a hold that lasts, watch the own node so that a deletion by
    // anyone else (an operator, a forced revocation) is reported as a loss. A watch set at once
    // would cost a request and a notification on every grant, a third of an uncontended
    // cycle; a hold shorter than the delay learns of a loss at its release instead (the
    // delete finds no node), and either way the fencing token protects the resource.
    tokio::time::sleep(HELD_WATCH_DELAY).await;
    let own = format!("{}/{}", contender.dir, node.name);
    loop {
        match retry_on_loss(|| client.check_and_watch_stat(&own)).await {
            Ok((None, _)) => return Exit::Lost(DELETED_WHILE_HELD.into()),
            Ok((Some(_), watcher)) => match watcher.changed().await.event_type {
                EventType::NodeDeleted => return Exit::Lost(DELETED_WHILE_HELD.into()),
                EventType::Session => {
                    return Exit::Lost("the ZooKeeper session ended while it held the lock".into());
                }
                _ => continue,
            },
            Err(err) => return lost_or_failed(err),
        }
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
    let prefix = format!("{}/_c_{}{}", contender.dir, contender.guid, LOCK_INFIX);
    let data = serde_json::json!({ "lease": contender.lease.id, "handle": contender.handle }).to_string();
    let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    loop {
        let create = client.create(&prefix, data.as_bytes(), &options);
        let list = client.list_children(&contender.dir);
        let (created, listed) = tokio::join!(create, list);
        match created {
            Ok((stat, sequence)) => {
                let name = format!("_c_{}{}{}", contender.guid, LOCK_INFIX, sequence);
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
            Err(ZkError::NoNode) => ensure_lock_dir(client, &contender.dir).await?,
            Err(ZkError::ConnectionLoss) => {
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
async fn find_by_guid(client: &Client, dir: &str, guid: &str) -> Result<Option<Node>, ZkError> {
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

/// Creates the lock's znode as a container (ZooKeeper removes it once its last contender is
/// gone, as Curator's are), creating `<root>/locks` if needed.
async fn ensure_lock_dir(client: &Client, dir: &str) -> Result<(), ZkError> {
    let options = CreateMode::Container.with_acls(Acls::anyone_all());
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

/// The contenders of this instance, indexed by (lease, lock) and by handle.
///
/// One lease holds at most one contender per lock: a retried acquire finds the contender the
/// first attempt made and returns the same handle instead of queueing twice (the HTTP twin of
/// the recipe's GUID rule).
#[derive(Clone)]
pub struct Locks {
    zk: ZkSession,
    root: Arc<str>,
    index: Arc<Mutex<Index>>,
}

#[derive(Default)]
struct Index {
    by_lease: HashMap<(String, String), Arc<Contender>>,
    by_handle: HashMap<String, Arc<Contender>>,
}

impl Locks {
    pub fn new(zk: ZkSession, root: &str) -> Locks {
        Locks {
            zk,
            root: format!("{root}/locks").into(),
            index: Arc::default(),
        }
    }

    /// `<root>/locks`.
    pub fn base(&self) -> &str {
        &self.root
    }

    /// The znode of lock `name` (already validated).
    pub fn dir(&self, name: &str) -> String {
        format!("{}/{}", self.root, name)
    }

    /// The lease's contender for `name`: the existing one unless it is finished, else a new one.
    /// `None` if the lease ended meanwhile.
    pub fn contend(&self, lease: &Arc<Lease>, name: &str) -> Option<(Arc<Contender>, bool)> {
        let key = (lease.id.clone(), name.to_string());
        let mut index = self.index();
        if let Some(existing) = index.by_lease.get(&key)
            && !existing.state().phase.is_final()
        {
            return Some((existing.clone(), false));
        }
        let index_ref = self.index.clone();
        // The exit hook takes the index lock, which we hold until the contender is inserted, so it
        // cannot run before the insertion even if the driver finishes at once.
        let contender = spawn_contender(self.zk.clone(), name, self.dir(name), lease.clone(), move |done| {
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
        })?;
        index.by_lease.insert(key, contender.clone());
        index.by_handle.insert(contender.handle.clone(), contender.clone());
        Some((contender, true))
    }

    /// The contender with this handle, if it is lock `name`'s.
    pub fn by_handle(&self, name: &str, handle: &str) -> Option<Arc<Contender>> {
        self.index().by_handle.get(handle).filter(|c| c.lock == name).cloned()
    }

    /// Every contender of this instance for lock `name`, keyed by its znode name.
    pub fn local_contenders(&self, name: &str) -> HashMap<String, Arc<Contender>> {
        self.index()
            .by_handle
            .values()
            .filter(|c| c.lock == name)
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
    let key = (contender.lease.id.clone(), contender.lock.clone());
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
    let ordered: Vec<(u64, String)> = in_sequence_order(&children)
        .into_iter()
        .map(|(seq, name)| (seq, name.to_string()))
        .collect();
    if ordered.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let results = retry_on_loss(|| {
        let mut reader = client.new_multi_reader();
        for (_, name) in &ordered {
            // Only fails for an invalid path, which a listed child cannot be.
            let _ = reader.add_get_data(&format!("{dir}/{name}"));
        }
        reader.commit()
    })
    .await?;
    let records = ordered
        .into_iter()
        .zip(results)
        .filter_map(|((sequence, name), result)| match result {
            MultiReadResult::Data { data, stat } => Some(ContenderRecord {
                name,
                sequence,
                czxid: stat.czxid,
                ctime: stat.ctime,
                data,
            }),
            // Gone between the listing and the read: it left the queue.
            _ => None,
        })
        .collect();
    Ok(Some(records))
}

/// Every lock znode under `base` with its number of children, read in two round trips.
pub async fn read_lock_names(client: &Client, base: &str) -> Result<Vec<(String, i32)>, ZkError> {
    let mut names = match retry_on_loss(|| client.list_children(base)).await {
        Ok(names) => names,
        Err(ZkError::NoNode) => return Ok(Vec::new()),
        Err(err) => return Err(err),
    };
    names.sort();
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let results = retry_on_loss(|| {
        let mut reader = client.new_multi_reader();
        for name in &names {
            let _ = reader.add_get_data(&format!("{base}/{name}"));
        }
        reader.commit()
    })
    .await?;
    Ok(names
        .into_iter()
        .zip(results)
        .filter_map(|(name, result)| match result {
            MultiReadResult::Data { stat, .. } => Some((name, stat.num_children)),
            _ => None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowest_holds_others_watch_their_predecessor() {
        let children = ["_c_b-lock-0000000002", "k__lock__0000000001", "_c_c-lock-0000000005"];
        assert_eq!(next_step(&children, "k__lock__0000000001"), Next::Hold);
        assert_eq!(
            next_step(&children, "_c_b-lock-0000000002"),
            Next::Wait {
                predecessor: "k__lock__0000000001",
                position: 1
            }
        );
        assert_eq!(
            next_step(&children, "_c_c-lock-0000000005"),
            Next::Wait {
                predecessor: "_c_b-lock-0000000002",
                position: 2
            }
        );
        assert_eq!(next_step(&children, "_c_z-lock-0000000009"), Next::Missing);
    }

    use proptest::prelude::*;

    /// A contender name as Curator, kazoo or zkgate would create it, for sequence `seq`.
    fn contender(style: u8, seq: u64) -> String {
        match style % 3 {
            0 => format!("_c_{seq:x}-guid-lock-{seq:010}"),
            1 => format!("{seq:032x}__lock__{seq:010}"),
            _ => format!("_c_{seq:08x}-0000-lock-{seq:010}"),
        }
    }

    fn children() -> impl Strategy<Value = Vec<String>> {
        prop::collection::btree_set(0u64..5_000, 1..40)
            .prop_flat_map(|seqs| {
                let seqs: Vec<u64> = seqs.into_iter().collect();
                let n = seqs.len();
                (Just(seqs), prop::collection::vec(any::<u8>(), n))
            })
            .prop_map(|(seqs, styles)| seqs.iter().zip(styles).map(|(&s, style)| contender(style, s)).collect())
            .prop_shuffle()
    }

    proptest! {
        /// Exactly one contender holds: the lowest sequence number, whatever the prefixes and
        /// the listing order.
        #[test]
        fn exactly_the_lowest_sequence_holds(children in children()) {
            let holders: Vec<&String> =
                children.iter().filter(|c| next_step(&children, c) == Next::Hold).collect();
            let lowest = children.iter().min_by_key(|c| crate::recipes::sequence_of(c)).unwrap();
            prop_assert_eq!(holders, vec![lowest]);
        }

        /// Every waiter watches the next lower contender, its position counts the lower ones,
        /// and no contender is watched by two waiters (a release wakes exactly one).
        #[test]
        fn each_waiter_watches_only_its_predecessor(children in children()) {
            let seq = |c: &str| crate::recipes::sequence_of(c).unwrap();
            let mut watched = std::collections::HashSet::new();
            for me in &children {
                if let Next::Wait { predecessor, position } = next_step(&children, me) {
                    let lower: Vec<u64> = children.iter().map(|c| seq(c)).filter(|&s| s < seq(me)).collect();
                    prop_assert_eq!(position, lower.len());
                    prop_assert_eq!(seq(predecessor), *lower.iter().max().unwrap());
                    prop_assert!(watched.insert(predecessor.to_string()), "{} watched twice", predecessor);
                }
            }
            prop_assert_eq!(watched.len(), children.len() - 1);
        }

        /// A contender whose node is gone learns it is missing, never that it holds.
        #[test]
        fn a_removed_contender_is_missing(children in children(), pick in any::<prop::sample::Index>()) {
            let mut children = children;
            let gone = children.remove(pick.index(children.len()));
            prop_assert_eq!(next_step(&children, &gone), Next::Missing);
        }

        /// Children without a sequence suffix are not contenders.
        #[test]
        fn non_contenders_are_ignored(children in children(), junk in "[a-z]{1,12}") {
            let mut with_junk = children.clone();
            with_junk.push(junk);
            for me in &children {
                prop_assert_eq!(next_step(&with_junk, me), next_step(&children, me));
            }
        }
    }
}
