//! Contenders: the recipes built on ordered sequential znodes (persistent, bound to a lease where
//! the guide makes them ephemeral: exclusive locks,
//! read/write locks, leader election), and the ordered-node machinery that the semaphore
//! composes too.
//!
//! A contender is a [Handle] whose protocol is [Contention]: create
//! `<dir>/_c_<guid><infix><seq>` (persistent, with its holding record under the lease's record, in
//! one multi-op) and list the children in one round trip, ask the role's pure decision function
//! ([Driver::next_step]) what to do, watch the one node it names, repeat until it holds; then
//! report a deletion of its node by anyone else as a loss. Releasing (or the lease ending)
//! deletes the node, which wakes the next waiter through ZooKeeper. The GUID is the handle's
//! ([crate::ids::guid_of]), so any instance finds a handle's node ([recorded]).
//!
//! The fencing token is the contender znode's `czxid`: zxids are handed out in the one order
//! in which ZooKeeper applies writes, and contenders are granted in creation order, so tokens
//! strictly increase in grant order, even across a deleted and recreated resource znode
//! (where sequence numbers would start again from zero).
//!
//! The engine knows its users only through the [Driver] each implements (which node may
//! proceed, what to do on grant and on exit); [crate::recipes::roles] lists them.

use crate::zk::Session;
use std::sync::Arc;
use std::time::Duration;

use zookeeper_client::{Client, CreateMode, Error as ZkError, EventType};

use super::handle::{
    Exit, Guarded, Handle, Handles, Made, Node, NotCreated, Protocol, Refused, create_held, delete_held,
};
use super::lease::Lease;
use super::record::{HoldingRecord, Shape};
use super::revocation;
use crate::kind::Kind;
use crate::zk::Multi;
use crate::zk::retry_on_loss;

/// How long a holder runs before its own znode is watched (see [Contention::run]).
const HELD_WATCH_DELAY: Duration = Duration::from_millis(200);

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

/// What one kind of contender decides and does around the engine (the shape of Curator's
/// `LockInternalsDriver`): its znode's name, which node may proceed, and what it does once
/// granted and before its node goes. An exclusive lock's ([crate::recipes::locks::exclusive]), a read/write lock's
/// reader and writer ([crate::recipes::locks::rwlock]) and an election's candidate ([crate::recipes::elections]) each
/// implement it in their own file; the engine knows only this trait, and [crate::recipes::roles] lists
/// the implementations (to read a role back from a node's name or a holding's record).
pub trait Driver: Send + Sync + 'static {
    /// The recipe's decision for the contender `me` given the resource's `children`: hold,
    /// wait for the one node it names, or missing.
    fn next_step<'a>(&self, children: &'a [String], me: &str) -> Next<'a>;

    /// What it does once its turn came and before it reports holding (an election's candidate
    /// writes its acknowledgement); an error ends the run.
    fn on_grant<'a>(
        &'a self,
        _handle: &'a Contender,
        _client: &'a Client,
        _node: &'a Node,
    ) -> Step<'a, Result<(), Exit>> {
        Box::pin(async { Ok(()) })
    }

    /// What it does before its node `name` in `dir` is deleted, by its own instance or any
    /// other (a candidate retracts its acknowledgement first, so that its successor never finds
    /// a stale one).
    fn on_exit<'a>(&'a self, _client: &'a Client, _dir: &'a str, _name: &'a str) -> Step<'a, ()> {
        Box::pin(async {})
    }

    /// Counts a grant in the metrics beyond the acquisition every contender counts (a new
    /// leader, for a candidate). `labels` are the handle's kind and name labels.
    fn count_grant(&self, _labels: [&str; 2]) {}

    /// Whether a holder's node is kept through its expired lease's lock-delay (a lock's, a
    /// read/write lock's; not a leader's, whose successor must not wait).
    fn kept_through_lock_delay(&self) -> bool {
        false
    }
}

/// A step of a [Driver] that talks to ZooKeeper.
pub type Step<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// A contender's role: what it is and its [Driver], as a value to keep, copy and compare (two
/// roles are the same when their labels are).
#[derive(Clone, Copy)]
pub struct Role {
    /// Its name in a holding's record (`exclusive`, `read`, `write`, `candidate`).
    pub label: &'static str,
    /// The kind of resource it contends for.
    pub kind: Kind,
    /// Curator's name infix: nodes are `_c_<guid><infix><seq>` (`InterProcessMutex`,
    /// `InterProcessReadWriteLock`, `LeaderLatch`).
    pub infix: &'static str,
    pub driver: &'static dyn Driver,
    /// `read` / `write` for the roles of a read/write lock, none for the others.
    pub mode: Option<&'static str>,
}

impl Role {
    /// `read` / `write` for the roles of a read/write lock (their labels), none for the others.
    pub fn mode(&self) -> Option<&'static str> {
        self.mode
    }
}

impl PartialEq for Role {
    fn eq(&self, other: &Role) -> bool {
        self.label == other.label
    }
}

impl Eq for Role {}

impl std::fmt::Debug for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label)
    }
}

/// A role is its driver: `role.next_step(...)`.
impl std::ops::Deref for Role {
    type Target = dyn Driver;

    fn deref(&self) -> &dyn Driver {
        self.driver
    }
}

/// One ordered sequential znode of a holding, `<dir>/_c_<guid><infix><seq>`: the GUID in its
/// name finds it again after a lost create reply (the recipes' GUID rule), a create that was
/// cancelled in flight, an interrupted session, or on another instance (it is the handle's).
pub struct Sequential {
    pub dir: String,
    guid: String,
    infix: &'static str,
}

impl Sequential {
    /// The node of handle `handle` under `dir`, with Curator's `infix`.
    pub fn of_handle(dir: String, infix: &'static str, handle: &str) -> Sequential {
        Sequential {
            dir,
            guid: crate::ids::guid_of(handle).unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
            infix,
        }
    }

    /// Finds the handle's node, or creates it holding `data` together with the handle's
    /// holding record (see [create_held]), and lists `dir`'s children in the same round trip (the
    /// listing is sent right after the create on the one session, which ZooKeeper serves in
    /// order, so it includes the new node). `dir` is created (a container) if missing.
    ///
    /// # Lost create replies
    /// On a connection loss the create may have happened; the GUID tells: the children are
    /// listed and a node carrying it is adopted instead of creating a second one. A handle that
    /// may not create (adopted, or created before) only looks: a node it cannot find is lost.
    pub async fn find_or_create<P: Protocol>(
        &self,
        handle: &Handle<P>,
        client: &Client,
        data: &[u8],
    ) -> Result<(Node, Vec<String>), Exit> {
        let prefix = format!("{}/{}", self.dir, self.name_prefix());
        let options = CreateMode::PersistentSequential.with_acls(crate::zk::acls());
        loop {
            if !handle.may_create() {
                // Adopted from another keeper: its node, made through another ZooKeeper server
                // a moment ago, may not have reached this session's server yet. Looked for again
                // after a `sync` before it is called lost (else a waiter adopted in a takeover
                // could find itself "released" and its long poll answer 409).
                let mut found = self.find(client).await.map_err(Exit::from_error)?;
                if found.is_none() {
                    retry_on_loss(|| client.sync("/")).await.map_err(Exit::from_error)?;
                    found = self.find(client).await.map_err(Exit::from_error)?;
                }
                return match found {
                    Some(node) => Ok((node, list(client, &self.dir).await?)),
                    None => Err(Exit::Lost("its znode was deleted".into())),
                };
            }
            let add = |multi: &mut Multi<'_, Guarded<()>>| multi.create(Guarded::Own(()), &prefix, data, &options);
            match create_held(handle, client, add, Some(&self.dir)).await {
                Ok(Made { done, listed, czxid }) => {
                    let Some(path) = done.created(&()) else {
                        return Err(Exit::Failed(ZkError::UnexpectedError("no create result".into()).into()));
                    };
                    let name = path.rsplit('/').next().unwrap_or_default().to_string();
                    // A multi-op's create may come without its stat (ZOOKEEPER-4026): the
                    // transaction's zxid, from the write that stamps the holding record, is the
                    // node's czxid too; else (never, short of a server that drops both) read it.
                    let czxid = match done.stat(&()).map(|stat| stat.czxid) {
                        Some(czxid) if czxid > 0 => czxid,
                        _ if czxid.is_some_and(|czxid| czxid > 0) => czxid.unwrap_or_default(),
                        _ => match retry_on_loss(|| client.check_stat(path))
                            .await
                            .map_err(Exit::from_error)?
                        {
                            Some(stat) => stat.czxid,
                            None => return Err(Exit::Lost("its znode was deleted".into())),
                        },
                    };
                    let children = match listed {
                        Some(Ok(children)) => children,
                        _ => list(client, &self.dir).await?,
                    };
                    return Ok((Node { name, czxid }, children));
                }
                Err(NotCreated::Refused {
                    error: ZkError::NoNode, ..
                }) => ensure_dir(client, &self.dir).await.map_err(Exit::from_error)?,
                // Created by an earlier attempt whose reply was lost: find it.
                Err(NotCreated::MadeBefore) => handle.created(),
                Err(NotCreated::Request(err)) if crate::zk::is_loss(&err) => {
                    if let Some(node) = self.find(client).await.map_err(Exit::from_error)? {
                        handle.created();
                        return Ok((node, list(client, &self.dir).await?));
                    }
                }
                Err(not_created) => return Err(not_created.exit()),
            }
        }
    }

    /// The name of our node before ZooKeeper's sequence: `_c_<guid><infix>`.
    pub fn name_prefix(&self) -> String {
        format!("_c_{}{}", self.guid, self.infix)
    }

    /// Our node (by GUID), if the server has one.
    pub async fn find(&self, client: &Client) -> Result<Option<Node>, ZkError> {
        // No directory: the create failed for want of it (and its reply was lost).
        let children = crate::zk::children(client, &self.dir).await?;
        let Some(name) = children.into_iter().find(|c| c.contains(&self.guid)) else {
            return Ok(None);
        };
        let path = format!("{}/{name}", self.dir);
        let stat = retry_on_loss(|| client.check_stat(&path)).await?;
        Ok(stat.map(|stat| Node {
            name,
            czxid: stat.czxid,
        }))
    }

    /// The path of our node, `known` or found by its GUID (a create still in flight when the
    /// run was cancelled is applied before that listing, by session order), if there is one.
    pub async fn path(&self, client: &Client, known: Option<&Node>) -> Result<Option<String>, ZkError> {
        let name = match known {
            Some(node) => Some(node.name.clone()),
            None => self.find(client).await?.map(|node| node.name),
        };
        Ok(name.map(|name| format!("{}/{name}", self.dir)))
    }
}

/// The member of a zkgate contender's JSON that says until when (ms since the Unix epoch) its
/// lease, ended, still holds it ([Protocol::hold_delayed]).
pub const DELAYED_UNTIL: &str = "delayed_until";

/// Marks the zkgate node at `path`, `handle`'s, as held by its ended lease until `until_ms`
/// ([Protocol::hold_delayed]); whether it is a zkgate node.
pub async fn mark_delayed<P: Protocol>(
    handle: &Handle<P>,
    client: &Client,
    path: &str,
    until_ms: i64,
) -> Result<bool, ZkError> {
    let marked = mark(client, path, DELAYED_UNTIL, serde_json::json!(until_ms)).await?;
    if marked {
        handle.set_delayed(until_ms);
    }
    Ok(marked)
}

/// Adds `field: value` to the JSON data of the zkgate node at `path`, whatever else it holds
/// (a revocation); `false` if the node is not a zkgate one (not JSON naming a lease).
async fn mark(client: &Client, path: &str, field: &str, value: serde_json::Value) -> Result<bool, ZkError> {
    loop {
        let (data, stat) = retry_on_loss(|| client.get_data(path)).await?;
        let mut json = match serde_json::from_slice::<serde_json::Value>(&data) {
            Ok(json) if json.get("lease").is_some() => json,
            _ => return Ok(false),
        };
        json[field] = value.clone();
        let bytes = serde_json::to_vec(&json).unwrap_or_default();
        match retry_on_loss(|| client.set_data(path, &bytes, Some(stat.version))).await {
            Ok(_) => return Ok(true),
            // Changed meanwhile (a revocation): read again and write over it.
            Err(ZkError::BadVersion) => continue,
            Err(err) => return Err(err),
        }
    }
}

/// The children of `dir` (listed again after a connection loss). Unlike [crate::zk::children],
/// a missing `dir` is not an empty list: it ends the run as [Exit::from_error] says (the
/// contender's own node was in it).
async fn list(client: &Client, dir: &str) -> Result<Vec<String>, Exit> {
    let listed = retry_on_loss(|| client.list_children(dir)).await;
    listed.map_err(Exit::from_error)
}

/// Waits in `dir`'s queue as `role` until `me` holds: at each step [Role::next_step] names
/// the one node to watch (never the head: that would wake everyone at each change); `waiting`
/// hears the position. Shared by contenders and the semaphore's lock.
pub async fn queue_until_held(
    client: &Client,
    dir: &str,
    me: &Node,
    mut children: Vec<String>,
    role: Role,
    waiting: impl Fn(usize),
) -> Result<(), Exit> {
    loop {
        let (predecessor, position) = match role.next_step(&children, &me.name) {
            Next::Hold => return Ok(()),
            Next::Missing => return Err(Exit::Lost("its znode was deleted while it waited".into())),
            Next::Wait { predecessor, position } => (format!("{dir}/{predecessor}"), position),
        };
        // A waiter keeps the one name it watches, never the listing, through its wait: a listing
        // held across the wait makes each waiter cost memory in proportion to the queue, and
        // the queue's waiters together its square (BENCHMARKS.md, "Waiters, subscribers").
        drop(children);
        waiting(position);
        match retry_on_loss(|| client.check_and_watch_stat(&predecessor)).await {
            Ok((None, _)) => {}
            Ok((Some(_), watcher)) => {
                if watcher.changed().await.event_type == EventType::Session {
                    return Err(Exit::Interrupted);
                }
            }
            Err(err) => return Err(Exit::from_error(err)),
        }
        children = list(client, dir).await?;
    }
}

/// A contender's protocol: its role, the value it publishes, its ordered node.
pub struct Contention {
    pub role: Role,
    /// A value the contender publishes in its znode (an election candidate's).
    pub value: Option<serde_json::Value>,
    node: Sequential,
}

/// A lock contender, a reader or writer of a read/write lock, or an election candidate.
pub type Contender = Handle<Contention>;

/// The contenders of this instance for one kind of resource.
pub type Contenders = Handles<Contention>;

impl Contention {
    /// The resource's znode, where its contenders queue.
    pub fn dir(&self) -> &str {
        &self.node.dir
    }

    /// The node's data: whose it is (lease, handle and principal, for any instance that must
    /// decide whether a caller may act on it) and the value.
    fn data(handle: &Contender) -> Vec<u8> {
        let mut data = serde_json::json!({ "lease": handle.lease.id, "handle": handle.id });
        if let Some(value) = &handle.protocol.value {
            data["value"] = value.clone();
        }
        if let Some(owner) = &handle.lease.principal {
            data["principal"] = owner.as_str().into();
        }
        data.to_string().into_bytes()
    }

    /// Only now, and only for a hold that lasts, watches its own node: a deletion by anyone
    /// else (an operator, a forced revocation) is a loss, and a data change may be a request
    /// to give the lock up. A watch set at once would cost a request and a notification on
    /// every grant, a third of an uncontended cycle; a hold shorter than the delay learns of a
    /// loss at its release instead (the delete finds no node), and either way the fencing
    /// token protects the resource.
    async fn watch_own_node(handle: &Contender, client: &Client, node: &Node) -> Exit {
        tokio::time::sleep(HELD_WATCH_DELAY).await;
        let own = format!("{}/{}", handle.protocol.node.dir, node.name);
        loop {
            match retry_on_loss(|| client.get_and_watch_data(&own)).await {
                Ok((data, _, watcher)) => {
                    if let Some(requested) = revocation::record_in(&data) {
                        handle.revoke(requested);
                    }
                    match watcher.changed().await.event_type {
                        EventType::NodeDeleted => return Exit::Lost(handle.protocol.loss_reason(handle)),
                        EventType::Session => return Exit::Interrupted,
                        _ => continue,
                    }
                }
                Err(ZkError::NoNode) => return Exit::Lost(handle.protocol.loss_reason(handle)),
                Err(err) => return Exit::from_error(err),
            }
        }
    }
}

impl Protocol for Contention {
    fn kind(&self) -> Kind {
        self.role.kind
    }

    fn count_grant(&self, labels: [&str; 2]) {
        self.role.count_grant(labels);
    }

    /// The recipe: find or create the node, then list / watch the predecessor until it holds
    /// (a candidate then acknowledges its leadership, the guide's leader procedure), then
    /// watch its own node.
    async fn run(&self, handle: &Contender, client: &Client) -> Exit {
        let (node, children) = match handle.state().node {
            // A run after an interruption: the node it had, if it is still there.
            Some(node) => match retry_on_loss(|| client.list_children(&self.node.dir)).await {
                Ok(children) if children.contains(&node.name) => (node, children),
                Ok(_) | Err(ZkError::NoNode) => return Exit::Lost(self.loss_reason(handle)),
                Err(err) => return Exit::from_error(err),
            },
            None => match self
                .node
                .find_or_create(handle, client, &Contention::data(handle))
                .await
            {
                Ok(found) => found,
                Err(exit) => return exit,
            },
        };
        handle.set_node(node.clone());
        if let Err(exit) =
            queue_until_held(client, &self.node.dir, &node, children, self.role, |p| handle.wait(p)).await
        {
            return exit;
        }
        if let Err(exit) = self.role.on_grant(handle, client, &node).await {
            return exit;
        }
        handle.grant();
        Contention::watch_own_node(handle, client, &node).await
    }

    async fn clean_up(&self, handle: &Contender, client: &Client) -> Result<bool, ZkError> {
        let known = handle.state().node;
        let node = self.node.path(client, known.as_ref()).await?;
        if let Some(node) = &node {
            let name = node.rsplit('/').next().unwrap_or_default();
            self.role.on_exit(client, &self.node.dir, name).await;
        }
        let had_node = node.is_some();
        let nodes: Vec<String> = node.into_iter().collect();
        let (there, record_there) = delete_held(client, &nodes, &handle.record_path(), &handle.id, &[]).await?;
        let node_there = had_node && there[0];
        // Its node and its holding record both gone already: released through another instance
        // (which deletes them together), say by the first attempt of this very release, whose
        // answer was lost. A node gone with its holding record still there was lost.
        Ok(known.is_none() || node_there || !record_there)
    }

    fn record(&self, handle: &Contender) -> HoldingRecord {
        HoldingRecord {
            kind: self.role.kind.name().to_string(),
            name: handle.name.clone(),
            handle: handle.id.clone(),
            shape: Shape::Contender {
                role: self.role.label.to_string(),
            },
            driver: Some(handle.lease.here.to_string()),
        }
    }

    /// A holder whose driver keeps it through a lock-delay (a lock's, a read/write lock's; not an
    /// election's leader) marks its node with `delayed_until` in its JSON, where [super::view] reads it.
    async fn hold_delayed(&self, handle: &Contender, client: &Client, until_ms: i64) -> Result<bool, ZkError> {
        if !self.role.driver.kept_through_lock_delay() {
            return Ok(false);
        }
        let Some(node) = self.node.find(client).await? else {
            return Ok(false);
        };
        let children = crate::zk::children(client, &self.node.dir).await?;
        if self.role.next_step(&children, &node.name) != Next::Hold {
            return Ok(false);
        }
        mark_delayed(handle, client, &format!("{}/{}", self.node.dir, node.name), until_ms).await
    }

    /// A forced revocation if one was asked with a grace, else unknown.
    fn loss_reason(&self, handle: &Contender) -> String {
        match &handle.state().revocation {
            Some(r) if r.grace_ms.is_some() => format!(
                "revoked by {} ({}): its znode was deleted when the grace period ran out",
                r.by, r.reason
            ),
            _ => "its znode was deleted while it held the lock".into(),
        }
    }
}

impl Contenders {
    /// The lease's contender for `name` in `role`: the existing one unless it is finished, else
    /// a new one publishing `value`. The flag says whether it is new. A lease that contends
    /// here in another role (a reader asking to write) is refused with its contender.
    pub fn contend(
        &self,
        lease: &Arc<Lease>,
        name: &str,
        role: Role,
        value: Option<serde_json::Value>,
    ) -> Result<(Arc<Contender>, bool), Refused<Contention>> {
        let id = crate::ids::owned_id(&lease.here);
        let protocol = Contention {
            role,
            value,
            node: Sequential::of_handle(self.dir(name), role.infix, &id),
        };
        self.open(lease, name, Some(id), protocol, |existing, new| {
            existing.protocol.role == new.role
        })
    }

    /// Takes over the contender `handle` at `name` in `role` of a lease adopted from another
    /// keeper (see [Handles::adopt]).
    pub fn adopt_contender(
        &self,
        lease: &Arc<Lease>,
        (name, handle): (&str, &str),
        record_name: &str,
        role: Role,
    ) -> Result<Arc<Contender>, Refused<Contention>> {
        let protocol = Contention {
            role,
            value: None,
            node: Sequential::of_handle(self.dir(name), role.infix, handle),
        };
        self.adopt(lease, (name, handle), record_name, protocol)
    }
}

/// Creates a resource's znode as a container (ZooKeeper removes it once its last child is
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

/// Where a waiting contender stands now, read afresh: it watches only the node right before
/// it, so its own record of the queue ahead is as old as that node. `None` unless it waits.
pub async fn position_now(session: &Session, contender: &Contender) -> Option<usize> {
    let client = session.client();
    let node = contender.state().node?;
    let children = retry_on_loss(|| client.list_children(&contender.protocol.node.dir))
        .await
        .ok()?;
    match contender.protocol.role.next_step(&children, &node.name) {
        Next::Wait { position, .. } => Some(position),
        _ => None,
    }
}
