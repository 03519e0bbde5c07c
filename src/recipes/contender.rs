//! Contenders: the recipes built on ordered ephemeral sequential znodes (exclusive locks,
//! read/write locks, leader election), and the ordered-node machinery that the semaphore
//! composes too.
//!
//! A contender is a [Handle] whose protocol is [Contention]: create
//! `<dir>/_c_<guid><infix><seq>` and list the children in one round trip, ask the role's pure
//! decision function ([Role::next_step]) what to do, watch the one node it names, repeat until
//! it holds; then report a deletion of its node by anyone else as a loss. Releasing (or the
//! lease ending) deletes the node, which wakes the next waiter through ZooKeeper.
//!
//! The fencing token is the contender znode's `czxid`: zxids are handed out in the one order
//! in which ZooKeeper applies writes, and contenders are granted in creation order, so tokens
//! strictly increase in grant order, even across a deleted and recreated resource znode
//! (where sequence numbers would start again from zero).

use std::sync::Arc;
use std::time::Duration;

use zookeeper_client::{Client, CreateMode, Error as ZkError, EventType};

use super::handle::{Exit, Handle, Handles, Node, Protocol, Refused};
use super::lease::Lease;
use super::revocation;
use super::{election, lock, rwlock};
use crate::kind::Kind;
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

    /// The kind of resource it contends for.
    pub fn kind(self) -> Kind {
        match self {
            Role::Exclusive => Kind::Lock,
            Role::Read | Role::Write => Kind::RwLock,
            Role::Candidate => Kind::Election,
        }
    }

    /// `read` / `write` for the roles of a read/write lock.
    pub fn mode(self) -> Option<&'static str> {
        match self {
            Role::Read => Some("read"),
            Role::Write => Some("write"),
            Role::Exclusive | Role::Candidate => None,
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

/// One ordered ephemeral sequential znode of ours, `<dir>/_c_<guid><infix><seq>`: the GUID in
/// its name finds it again after a lost create reply (the recipes' GUID rule) or a create that
/// was cancelled in flight.
pub struct Sequential {
    pub dir: String,
    guid: String,
    infix: &'static str,
}

impl Sequential {
    /// A node to be created under `dir` with Curator's `infix`.
    pub fn new(dir: String, infix: &'static str) -> Sequential {
        Sequential {
            dir,
            guid: uuid::Uuid::new_v4().to_string(),
            infix,
        }
    }

    /// Creates the node holding `data` and lists `dir`'s children in one round trip (both
    /// requests are sent back to back on the one session, which ZooKeeper serves in order, so
    /// the listing includes the new node). `dir` is created (a container) if missing.
    ///
    /// # Lost create replies
    /// On a connection loss the create may have happened; the GUID tells: the children are
    /// listed and a node carrying it is adopted instead of creating a second one.
    pub async fn create(&self, client: &Client, data: &[u8]) -> Result<(Node, Vec<String>), ZkError> {
        let prefix = format!("{}/_c_{}{}", self.dir, self.guid, self.infix);
        let options = CreateMode::EphemeralSequential.with_acls(crate::zk::acls());
        loop {
            let create = client.create(&prefix, data, &options);
            let list = client.list_children(&self.dir);
            let started = std::time::Instant::now();
            let (created, listed) = tokio::join!(create, list);
            crate::metrics::zookeeper_request(started.elapsed());
            match created {
                Ok((stat, sequence)) => {
                    let name = format!("_c_{}{}{}", self.guid, self.infix, sequence);
                    let children = match listed {
                        Ok(children) => children,
                        Err(_) => retry_on_loss(|| client.list_children(&self.dir)).await?,
                    };
                    return Ok((
                        Node {
                            name,
                            czxid: stat.czxid,
                        },
                        children,
                    ));
                }
                Err(ZkError::NoNode) => ensure_dir(client, &self.dir).await?,
                Err(err) if crate::zk::is_loss(&err) => {
                    if let Some(node) = self.find(client).await? {
                        let children = retry_on_loss(|| client.list_children(&self.dir)).await?;
                        return Ok((node, children));
                    }
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// Our node (by GUID), if the server has one.
    pub async fn find(&self, client: &Client) -> Result<Option<Node>, ZkError> {
        let children = match retry_on_loss(|| client.list_children(&self.dir)).await {
            Ok(children) => children,
            // The create failed for want of the directory (and its reply was lost).
            Err(ZkError::NoNode) => return Ok(None),
            Err(err) => return Err(err),
        };
        let Some(name) = children.into_iter().find(|c| c.contains(&self.guid)) else {
            return Ok(None);
        };
        let path = format!("{}/{name}", self.dir);
        match retry_on_loss(|| client.check_stat(&path)).await? {
            Some(stat) => Ok(Some(Node {
                name,
                czxid: stat.czxid,
            })),
            None => Ok(None),
        }
    }

    /// Deletes our node: `known`, or the one the GUID finds (a create still in flight when the
    /// run was cancelled is applied before that listing, by session order). Returns `false` if
    /// a node we knew was already gone.
    pub async fn remove(&self, client: &Client, known: Option<&Node>) -> bool {
        let name = match known {
            Some(node) => node.name.clone(),
            None => match self.find(client).await {
                Ok(Some(node)) => node.name,
                _ => return true,
            },
        };
        let path = format!("{}/{name}", self.dir);
        // A delete whose reply was lost may have happened: after a connection loss, `NoNode`
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
                tracing::warn!(%path, error = %err, "could not delete an ordered node");
                true
            }
        }
    }
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
        // A waiter keeps the one name it watches, never the listing, through its wait: held
        // across the wait, each waiter's listing of the queue made it cost memory in
        // proportion to the queue (51 KiB each with 1,000 waiting on one lock: quadratic).
        drop(children);
        waiting(position);
        match retry_on_loss(|| client.check_and_watch_stat(&predecessor)).await {
            Ok((None, _)) => {}
            Ok((Some(_), watcher)) => {
                if watcher.changed().await.event_type == EventType::Session {
                    return Err(Exit::Lost("the ZooKeeper session ended while it waited".into()));
                }
            }
            Err(err) => return Err(Exit::from_error(err)),
        }
        children = retry_on_loss(|| client.list_children(dir))
            .await
            .map_err(Exit::from_error)?;
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
    /// The node's data: whose it is (lease, handle and principal, for any instance that must
    /// decide whether a caller may act on it) and the value.
    fn data(handle: &Contender) -> Vec<u8> {
        let mut data = serde_json::json!({ "lease": handle.lease.id, "handle": handle.id });
        if let Some(value) = &handle.protocol.value {
            data["value"] = value.clone();
        }
        if let Some(owner) = &handle.lease.owner {
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
                        EventType::Session => {
                            return Exit::Lost("the ZooKeeper session ended while it held the lock".into());
                        }
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
        self.role.kind()
    }

    /// The recipe: create, then list / watch the predecessor until it holds (a candidate then
    /// acknowledges its leadership, the guide's leader procedure), then watch its own node.
    async fn run(&self, handle: &Contender, client: &Client) -> Exit {
        let (node, children) = match self.node.create(client, &Contention::data(handle)).await {
            Ok(created) => created,
            Err(err) => return Exit::Failed(err),
        };
        handle.set_node(node.clone());
        if let Err(exit) =
            queue_until_held(client, &self.node.dir, &node, children, self.role, |p| handle.wait(p)).await
        {
            return exit;
        }
        if self.role == Role::Candidate {
            let ack = election::Acknowledgement {
                candidate: node.name.clone(),
                term: node.czxid,
                lease: handle.lease.id.clone(),
                value: self.value.clone(),
            };
            if let Err(err) = election::acknowledge(client, &self.node.dir, &ack).await {
                return Exit::from_error(err);
            }
        }
        handle.grant();
        Contention::watch_own_node(handle, client, &node).await
    }

    async fn clean_up(&self, handle: &Contender, client: &Client) -> bool {
        let known = handle.state().node;
        if self.role == Role::Candidate {
            // A leader steps down by removing its acknowledgement first, so that its successor
            // never finds a stale one. Done for any candidate: one may be cancelled after it
            // wrote the acknowledgement but before it reported leading.
            let candidate = match &known {
                Some(node) => Some(node.name.clone()),
                None => self.node.find(client).await.ok().flatten().map(|n| n.name),
            };
            if let Some(candidate) = candidate {
                election::retract(client, &self.node.dir, &candidate).await;
            }
        }
        self.node.remove(client, known.as_ref()).await
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
        let protocol = Contention {
            role,
            value,
            node: Sequential::new(self.dir(name), role.infix()),
        };
        self.open(lease, name, None, protocol, |existing, new| {
            existing.protocol.role == new.role
        })
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
pub async fn position_now(client: &Client, contender: &Contender) -> Option<usize> {
    let node = contender.state().node?;
    let children = retry_on_loss(|| client.list_children(&contender.protocol.node.dir))
        .await
        .ok()?;
    match contender.protocol.role.next_step(&children, &node.name) {
        Next::Wait { position, .. } => Some(position),
        _ => None,
    }
}
