//! Semaphores with N permits, on the znode layout and protocol of Curator's
//! `InterProcessSemaphoreV2`, so Curator semaphores and HTTP clients share the same permits.
//!
//! Under `<root>/semaphores/<name>`: `locks/` holds an exclusive lock (the lock recipe) that
//! serialises acquirers, and `leases/` holds one sequential node per permit held
//! (`_c_<guid>-lease-<seq>`; persistent, living as long as the zkgate lease, see
//! [crate::recipes::engine::lease]). An acquirer first takes the lock; then, as the only one doing
//! so, it creates its lease node and lists `leases/` with a children watch until
//! [permit_step] lets it hold; then it gives the lock back. So acquirers wait on the lock
//! queue, each watching only its predecessor, and only the lock holder watches the permits: a
//! released permit wakes one acquirer, not all of them (herd-free as far as the recipe allows).
//!
//! As Curator's semaphore composes its mutex, a permit is a [Handle] whose protocol composes
//! the contender machinery ([Sequential], [queue_until_held]) rather than copying it.
//!
//! The number of permits is every participant's own setting in Curator; zkgate also records
//! it in the semaphore znode's data (`{"permits": N}`, see [crate::recipes::agree_on_setting]) and refuses a
//! request that disagrees, so HTTP clients cannot silently use two different limits.

use crate::zk::{Failure, Session};
use std::sync::Arc;

use serde::Serialize;
use utoipa::ToSchema;
use zookeeper_client::{Client, CreateMode, Error as ZkError, EventType};

use crate::kind::Kind;
use crate::recipes::engine::contender::{Next, Sequential, mark_delayed, queue_until_held};
use crate::recipes::engine::handle::{
    Exit, Guarded, Handle, Handles, Node, NotCreated, Protocol, Refused, delete_all, delete_held, write_held,
};
use crate::recipes::engine::lease::Lease;
use crate::recipes::engine::record::{HoldingRecord, Shape};
use crate::recipes::engine::view::{ContenderView, LISTED, holders_change, read_queue, split_holders};
use crate::recipes::in_sequence_order;
use crate::recipes::locks::exclusive;
use crate::recipes::recorded::{Recorded, Watched};
use crate::recipes::topic::{Source, event_kinds};
use crate::zk::retry_on_loss;
use crate::zk::watch::Mode;

/// The infix of Curator's lease node names.
pub const LEASE_INFIX: &str = "-lease-";

/// The key of the number of permits in the semaphore znode's data.
pub const PERMITS: &str = "permits";

/// Makes sure the semaphore znode exists (a container, as Curator's) and records `permits`,
/// or says what it records instead.
pub async fn agree_on_permits(session: &Session, dir: &str, permits: u32) -> Result<(), crate::recipes::SettingError> {
    let client = session.client();
    crate::recipes::agree_on_setting(client, dir, PERMITS, u64::from(permits), CreateMode::Container).await
}

/// The number of permits recorded in the semaphore at `dir`, if one is.
pub async fn permits_of(session: &Session, dir: &str) -> Result<Option<u64>, Failure> {
    let client = session.client();
    Ok(crate::zk::data(client, dir)
        .await?
        .and_then(|(data, _)| crate::recipes::recorded(&data, PERMITS)))
}

/// What the holder of the semaphore's lock does next, decided from `leases/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermitStep {
    /// A permit is free: hold it (and give the lock back).
    Hold,
    /// Every permit is taken: wait (holding the lock) for one to come back.
    WaitForRelease,
    /// Its lease node is gone.
    Missing,
}

/// The recipe's decision for the lease node `me` among the lease nodes `children` of a
/// semaphore with `permits`: Curator's rule (no more lease nodes than permits), and a node among
/// the first `permits` by sequence holds even if more exist (another acquirer's node, created
/// while this one waited, cannot take its place).
pub fn permit_step<S: AsRef<str>>(children: &[S], me: &str, permits: u32) -> PermitStep {
    let ordered = in_sequence_order(children);
    let Some(position) = ordered.iter().position(|&(_, name)| name == me) else {
        return PermitStep::Missing;
    };
    let permits = permits as usize;
    if ordered.len() <= permits || position < permits {
        PermitStep::Hold
    } else {
        PermitStep::WaitForRelease
    }
}

/// A permit request's protocol: the semaphore's lock, then a lease node.
pub struct PermitRequest {
    /// How many permits the semaphore has.
    pub permits: u32,
    lock: Sequential,
    lease: Sequential,
}

/// One lease's request for a permit.
pub type Permit = Handle<PermitRequest>;

/// The permits asked for through this instance.
pub type Semaphores = Handles<PermitRequest>;

impl Protocol for PermitRequest {
    fn kind(&self) -> Kind {
        Kind::Semaphore
    }

    /// Curator's protocol: take the lock, create the lease node, wait for a free permit, give
    /// the lock back and hold. Held only once the lock is given back: a caller told "granted"
    /// may ask again at once, maybe through another instance, and must not find its own
    /// previous request still in the queue. A run after an interruption (or on a new keeper)
    /// goes on from the node it finds: its lease node, else its lock node.
    async fn run(&self, handle: &Permit, client: &Client) -> Exit {
        if let Err(exit) = self.acquire(handle, client).await {
            return exit;
        }
        handle.grant();
        std::future::pending().await
    }

    /// The lock (if still held: a request cancelled while it waited), the lease node and the
    /// holding record go. A permit does not watch its lease node, so a release never reports a loss.
    async fn clean_up(&self, handle: &Permit, client: &Client) -> Result<bool, ZkError> {
        let mut nodes = Vec::new();
        for node in [&self.lock, &self.lease] {
            nodes.extend(node.path(client, None).await?);
        }
        delete_held(client, &nodes, &handle.record_path(), &handle.id, &[]).await?;
        Ok(true)
    }

    /// A permit held (its lease node among the first `permits`) is marked with `delayed_until`.
    async fn hold_delayed(&self, handle: &Permit, client: &Client, until_ms: i64) -> Result<bool, ZkError> {
        let Some(node) = self.lease.find(client).await? else {
            return Ok(false);
        };
        let children = crate::zk::children(client, &self.lease.dir).await?;
        if permit_step(&children, &node.name, self.permits) != PermitStep::Hold {
            return Ok(false);
        }
        mark_delayed(handle, client, &format!("{}/{}", self.lease.dir, node.name), until_ms).await
    }

    fn record(&self, handle: &Permit) -> HoldingRecord {
        HoldingRecord {
            kind: Kind::Semaphore.name().to_string(),
            name: handle.name.clone(),
            handle: handle.id.clone(),
            shape: Shape::Permit { permits: self.permits },
            driver: Some(handle.lease.here.to_string()),
        }
    }
}

impl PermitRequest {
    /// [Protocol::run] up to the grant: the lock, the lease node, a free permit, the lock given back.
    async fn acquire(&self, handle: &Permit, client: &Client) -> Result<(), Exit> {
        let mut data = serde_json::json!({ "lease": handle.lease.id, "handle": handle.id });
        if let Some(owner) = &handle.lease.principal {
            data["principal"] = owner.as_str().into();
        }
        let data = data.to_string();
        let lease_node = match handle.may_create() {
            true => None,
            false => self.lease.find(client).await.map_err(Exit::from_error)?,
        };
        let lease_node = match lease_node {
            Some(node) => node,
            None => {
                let (lock_node, children) = self.lock.find_or_create(handle, client, data.as_bytes()).await?;
                let role = crate::recipes::locks::exclusive::EXCLUSIVE;
                queue_until_held(client, &self.lock.dir, &lock_node, children, role, |p| handle.wait(p)).await?;
                self.create_lease_node(handle, client, data.as_bytes()).await?
            }
        };
        // Its lease node's czxid is the permit's fencing token once it holds.
        handle.set_node(lease_node.clone());
        loop {
            let listed = retry_on_loss(|| client.list_and_watch_children(&self.lease.dir)).await;
            let (children, watcher) = listed.map_err(Exit::from_error)?;
            match permit_step(&children, &lease_node.name, self.permits) {
                PermitStep::Hold => break,
                PermitStep::Missing => return Err(Exit::Lost("its lease node was deleted while it waited".into())),
                PermitStep::WaitForRelease => {
                    // First in the queue (it holds the lock), waiting for a permit to come back.
                    handle.wait(0);
                    if watcher.changed().await.event_type == EventType::Session {
                        return Err(Exit::Interrupted);
                    }
                }
            }
        }
        if let Some(lock) = self.lock.path(client, None).await.map_err(Exit::from_error)? {
            delete_all(client, &[lock]).await.map_err(Exit::from_error)?;
        }
        Ok(())
    }

    /// Creates the lease node (guarded by the zkgate lease), or finds it after a lost reply.
    async fn create_lease_node(&self, handle: &Permit, client: &Client, data: &[u8]) -> Result<Node, Exit> {
        let prefix = format!("{}/{}", self.lease.dir, self.lease.name_prefix());
        let options = CreateMode::PersistentSequential.with_acls(crate::zk::acls());
        loop {
            match write_held(handle, client, |multi| {
                multi.create(Guarded::Own(()), &prefix, data, &options)
            })
            .await
            {
                Ok(_) => {}
                Err(NotCreated::Refused {
                    error: ZkError::NoNode, ..
                }) => {
                    crate::zk::session::ensure_path(client, &self.lease.dir)
                        .await
                        .map_err(Exit::from_error)?;
                    continue;
                }
                Err(NotCreated::Request(err)) if crate::zk::is_loss(&err) => {}
                Err(not_created) => return Err(not_created.exit()),
            }
            if let Some(node) = self.lease.find(client).await.map_err(Exit::from_error)? {
                return Ok(node);
            }
        }
    }
}

impl Semaphores {
    /// The lease's permit request for `name` (a semaphore of `permits`): the live one, or a new
    /// one. `None` if the lease ended meanwhile.
    pub fn request(&self, lease: &Arc<Lease>, name: &str, permits: u32) -> Option<Arc<Permit>> {
        let id = crate::ids::owned_id(&lease.here);
        match self.open(
            lease,
            name,
            Some(id.clone()),
            self.protocol(name, permits, &id),
            |_, _| true,
        ) {
            Ok((permit, _)) => Some(permit),
            Err(Refused::Taken(existing)) => Some(existing),
            Err(Refused::LeaseEnded) => None,
        }
    }

    /// Takes over the permit request `handle` of a lease adopted from another keeper.
    pub fn adopt_permit(
        &self,
        lease: &Arc<Lease>,
        (name, handle): (&str, &str),
        record_name: &str,
        permits: u32,
    ) -> Result<Arc<Permit>, Refused<PermitRequest>> {
        self.adopt(lease, (name, handle), record_name, self.protocol(name, permits, handle))
    }

    fn protocol(&self, name: &str, permits: u32, handle: &str) -> PermitRequest {
        let dir = self.dir(name);
        PermitRequest {
            permits,
            lock: Sequential::of_handle(format!("{dir}/locks"), exclusive::INFIX, handle),
            lease: Sequential::of_handle(format!("{dir}/leases"), LEASE_INFIX, handle),
        }
    }
}

/// The permit request `handle` of semaphore `name` (at `dir`), from ZooKeeper (see
/// [crate::recipes::recorded::recorded]): its lease node if it has one (holding, or first in line for a
/// permit), else its node in the semaphore's lock queue. `None` if it has neither.
pub async fn recorded(session: &Session, dir: &str, name: &str, handle: &str) -> Result<Option<Recorded>, Failure> {
    let client = session.client();
    let Some(guid) = crate::ids::guid_of(handle) else {
        return Ok(None);
    };
    let (leases_dir, locks_dir) = (format!("{dir}/leases"), format!("{dir}/locks"));
    let list = |dir: String| async move { crate::zk::children(client, &dir).await };
    let (leases, locks) = (list(leases_dir.clone()).await?, list(locks_dir.clone()).await?);
    let find = |children: &[String]| children.iter().find(|c| c.contains(&guid)).cloned();
    let (lease_node, lock_node) = (find(&leases), find(&locks));
    let mut paths: Vec<String> = lock_node.iter().map(|n| format!("{locks_dir}/{n}")).collect();
    let (own, position, next) = match (&lease_node, &lock_node) {
        (Some(own), _) => {
            let permits = permits_of(session, dir).await?;
            let path = format!("{leases_dir}/{own}");
            paths.insert(0, path.clone());
            match permit_step(&leases, own, permits.map_or(u32::MAX, |p| p as u32)) {
                PermitStep::WaitForRelease => (own.clone(), Some(0), Watched::Children(leases_dir.clone())),
                _ => (own.clone(), None, Watched::Data(path)),
            }
        }
        (None, Some(own)) => match exclusive::next_step(&locks, own) {
            Next::Wait { predecessor, position } => (
                own.clone(),
                Some(position),
                Watched::Exists(format!("{locks_dir}/{predecessor}")),
            ),
            // First in line: about to take a permit.
            _ => (own.clone(), Some(0), Watched::Children(leases_dir.clone())),
        },
        (None, None) => return Ok(None),
    };
    let path = &paths[0];
    let Some((data, stat)) = crate::zk::data(client, path).await? else {
        return Ok(None);
    };
    Ok(Some(Recorded {
        kind: Kind::Semaphore,
        name: name.to_string(),
        handle: handle.to_string(),
        node: Node {
            name: own,
            czxid: stat.czxid,
        },
        paths,
        role: crate::recipes::locks::exclusive::EXCLUSIVE,
        data,
        position,
        next,
    }))
}

/// A semaphore: what `GET /v1/semaphores/{name}` answers and the `semaphore` topic carries.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq)]
pub struct SemaphoreState {
    #[schema(example = "exports")]
    pub name: String,
    /// The number of permits recorded, if a request recorded it.
    pub permits: Option<u64>,
    /// The permits held (lease nodes), oldest first (at most 50 listed).
    pub holders: Vec<ContenderView>,
    /// How many permits are held, all of them.
    pub holder_count: usize,
    /// Acquirers in the queue: first the lock holder, waiting for a permit to come back (at
    /// most 50 listed).
    pub waiters: Vec<ContenderView>,
    /// How many acquirers wait, all of them.
    pub waiter_count: usize,
}

event_kinds! {
    /// The events of a semaphore topic.
    SemaphoreEvent {
        /// A permit was given to someone new.
        Granted => "granted",
        /// Permits came back and nobody new holds one.
        Released => "released",
        /// Only the queue changed.
        Waiters => "waiters",
    }
}

/// A semaphore as a topic (and as `GET` reads it).
pub struct SemaphoreTopic {
    pub name: String,
    pub dir: String,
    pub local: Semaphores,
}

impl Source for SemaphoreTopic {
    type State = SemaphoreState;
    type Event = SemaphoreEvent;

    fn watches(&self, _: Option<&SemaphoreState>) -> Vec<(Mode, String)> {
        vec![
            (Mode::Children, format!("{}/leases", self.dir)),
            (Mode::Children, format!("{}/locks", self.dir)),
        ]
    }

    async fn read(&self, session: &Session) -> Result<SemaphoreState, Failure> {
        let client = session.client();
        let permits = permits_of(session, &self.dir).await?;
        // Lease nodes beyond the permits belong to the queue's first acquirer, still waiting.
        let held = |names: &[String]| permits.map_or(names.len(), |p| names.len().min(p as usize));
        let leases = read_queue(client, &format!("{}/leases", self.dir), |names, i| {
            i < held(names).min(LISTED) || (i >= held(names) && i < held(names) + LISTED)
        })
        .await?;
        let locks = read_queue(client, &format!("{}/locks", self.dir), |_, i| i < LISTED).await?;
        let holding = held(&leases.names);
        let none = std::collections::HashMap::new();
        let (holders, mut waiters) = split_holders(&leases, holding, |_| None, &none);
        waiters.extend(locks.records.iter().map(|r| ContenderView::of(r, None, &none)));
        waiters.truncate(LISTED);
        Ok(SemaphoreState {
            name: self.name.clone(),
            permits,
            holders,
            holder_count: holding,
            waiters,
            waiter_count: leases.names.len() - holding + locks.names.len(),
        })
    }

    fn change(&self, before: &SemaphoreState, after: &SemaphoreState) -> Option<SemaphoreEvent> {
        holders_change(
            (&before.holders, before.holder_count),
            (&after.holders, after.holder_count),
            SemaphoreEvent::Granted,
            SemaphoreEvent::Released,
        )
        .or_else(|| (before.waiter_count != after.waiter_count).then_some(SemaphoreEvent::Waiters))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lease_node(seq: u64) -> String {
        format!("_c_{seq:08x}-guid{LEASE_INFIX}{seq:010}")
    }

    #[test]
    fn holds_while_permits_are_free() {
        let nodes: Vec<String> = (1..=3).map(lease_node).collect();
        assert_eq!(permit_step(&nodes, &nodes[2], 3), PermitStep::Hold);
        assert_eq!(permit_step(&nodes, &nodes[2], 2), PermitStep::WaitForRelease);
        assert_eq!(permit_step(&nodes, &nodes[0], 2), PermitStep::Hold);
        assert_eq!(permit_step(&nodes, &lease_node(9), 2), PermitStep::Missing);
    }

    #[test]
    fn semaphore_events_say_whether_anyone_new_holds() {
        let topic = SemaphoreTopic {
            name: "exports".into(),
            dir: "/zkgate/semaphores/exports".into(),
            local: Semaphores::new("/zkgate", Kind::Semaphore),
        };
        let view = |seq: u64| ContenderView {
            fencing_token: seq as i64,
            ..ContenderView::for_node(&lease_node(seq))
        };
        let state = |holders: &[u64], waiting: usize| SemaphoreState {
            name: "exports".into(),
            permits: Some(2),
            holders: holders.iter().map(|&s| view(s)).collect(),
            holder_count: holders.len(),
            waiters: Vec::new(),
            waiter_count: waiting,
        };
        assert_eq!(
            topic.change(&state(&[], 0), &state(&[1], 0)),
            Some(SemaphoreEvent::Granted)
        );
        assert_eq!(
            topic.change(&state(&[1, 2], 0), &state(&[2], 0)),
            Some(SemaphoreEvent::Released)
        );
        assert_eq!(
            topic.change(&state(&[2], 1), &state(&[2, 3], 0)),
            Some(SemaphoreEvent::Granted)
        );
        assert_eq!(
            topic.change(&state(&[1, 2], 0), &state(&[1, 2], 1)),
            Some(SemaphoreEvent::Waiters)
        );
        assert_eq!(topic.change(&state(&[1, 2], 1), &state(&[1, 2], 1)), None);
    }

    proptest! {
        /// However the lease nodes stand, no more than `permits` of them hold, and every one
        /// holds while there are no more nodes than permits.
        #[test]
        fn never_more_holders_than_permits(
            seqs in prop::collection::btree_set(0u64..10_000, 1..30),
            permits in 1u32..10,
        ) {
            let nodes: Vec<String> = seqs.iter().map(|&s| lease_node(s)).collect();
            let holders = nodes.iter().filter(|n| permit_step(&nodes, n, permits) == PermitStep::Hold).count();
            prop_assert!(holders <= permits as usize);
            prop_assert_eq!(holders, nodes.len().min(permits as usize));
        }

        /// The holders are the lowest sequence numbers: a later acquirer never takes the place
        /// of an earlier one.
        #[test]
        fn the_earliest_hold(seqs in prop::collection::btree_set(0u64..10_000, 1..30), permits in 1u32..10) {
            let nodes: Vec<String> = seqs.iter().map(|&s| lease_node(s)).collect();
            for (i, node) in nodes.iter().enumerate() {
                let holds = permit_step(&nodes, node, permits) == PermitStep::Hold;
                prop_assert_eq!(holds, i < permits as usize);
            }
        }
    }
}
