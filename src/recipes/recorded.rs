//! A contender's holding as ZooKeeper has it, for whichever instance serves its request
//! without keeping its lease: found by the handle's GUID ([recorded]), read, long-polled
//! ([await_change]) and released ([release_recorded]) through ZooKeeper alone.

use crate::zk::{Failure, Session};
use zookeeper_client::Error as ZkError;

use crate::kind::Kind;
use crate::recipes::engine::contender::{Next, Role};
use crate::recipes::engine::handle::{Node, delete_all, delete_held};
use crate::recipes::engine::revocation;
use crate::zk::retry_on_loss;

/// A holding of another instance's lease (or of a lease whose keeper is elsewhere), as
/// ZooKeeper has it: what any instance serves a handle's request from.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// The kind and resource it is at.
    pub kind: Kind,
    pub name: String,
    pub handle: String,
    /// The node that decides its place (a permit request's lease node once it has one).
    pub node: Node,
    /// Every znode it holds, to delete on release.
    pub paths: Vec<String>,
    pub role: Role,
    /// Its node's data: whose it is, a revocation request, a candidate's value.
    pub data: Vec<u8>,
    /// `None` while it holds, else the contenders ahead.
    pub position: Option<usize>,
    /// What changes it next: the node right before it, or its own (a holder's).
    pub next: Watched,
}

/// The one znode whose change a long poll on a recorded holding waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Watched {
    /// A node's existence (the predecessor: its deletion may grant).
    Exists(String),
    /// A node's data or deletion (a holder's own: a revocation request, or its loss).
    Data(String),
    /// A directory's children (a permit request waiting for a permit to come back).
    Children(String),
}

impl Recorded {
    /// The revocation asked of it, as its node records.
    pub fn revocation(&self) -> Option<crate::recipes::engine::revocation::Revocation> {
        crate::recipes::engine::revocation::record_in(&self.data)
    }

    /// Whose it is, as its node records.
    pub fn owner(&self) -> Option<crate::recipes::engine::node::Owner> {
        crate::recipes::engine::node::Owner::in_data(&self.data)
    }

    /// Whether it holds (the lock, the leadership, a permit).
    pub fn holds(&self) -> bool {
        self.position.is_none()
    }

    /// The holding records to it under its lease's record (`root` is zkgate's root): its name, and
    /// the name an earlier zkgate gave it (a lease that outlived an upgrade); one is there.
    pub fn record_names(&self, root: &str) -> Vec<String> {
        use crate::recipes::engine::record;
        let Some(owner) = self.owner() else {
            return Vec::new();
        };
        let lease = record::path(root, &owner.lease);
        vec![
            format!("{lease}/{}", record::record_name(self.kind, &self.name, None)),
            format!(
                "{lease}/{}",
                record::legacy_record_name(self.kind, &self.name, &self.handle)
            ),
        ]
    }
}

/// The contender `handle` of the resource `name` of `kind` (at `dir`), from ZooKeeper: its
/// node is found by the handle's GUID. `None` if it has none (released, lost, or never there).
pub async fn recorded(
    session: &Session,
    kind: Kind,
    dir: &str,
    name: &str,
    handle: &str,
) -> Result<Option<Recorded>, Failure> {
    let client = session.client();
    let Some(guid) = crate::ids::guid_of(handle) else {
        return Ok(None);
    };
    let children = crate::zk::children(client, dir).await?;
    let Some(own) = children.iter().find(|c| c.contains(&guid)).cloned() else {
        return Ok(None);
    };
    let Some(role) = crate::recipes::roles::of_node(&own) else {
        return Ok(None);
    };
    let path = format!("{dir}/{own}");
    let Some((data, stat)) = crate::zk::data(client, &path).await? else {
        return Ok(None);
    };
    let (position, next) = match role.next_step(&children, &own) {
        Next::Hold | Next::Missing => (None, Watched::Data(path.clone())),
        Next::Wait { predecessor, position } => (Some(position), Watched::Exists(format!("{dir}/{predecessor}"))),
    };
    Ok(Some(Recorded {
        kind,
        name: name.to_string(),
        handle: handle.to_string(),
        node: Node {
            name: own,
            czxid: stat.czxid,
        },
        paths: vec![path],
        role,
        data,
        position,
        next,
    }))
}

/// Whether the znode at `path` exists.
pub async fn exists(session: &Session, path: &str) -> Result<bool, Failure> {
    let client = session.client();
    Ok(retry_on_loss(|| client.check_stat(path)).await?.is_some())
}

/// Waits (until `until`) for a change to what decides `recorded`'s state: the one node it
/// names ([Recorded::next]). A holder whose node already carries a revocation request does
/// not wait: that is news already.
pub async fn await_change(session: &Session, recorded: &Recorded, until: tokio::time::Instant) -> Result<(), Failure> {
    let client = session.client();
    let watcher = match &recorded.next {
        Watched::Data(_) if revocation::record_in(&recorded.data).is_some() => return Ok(()),
        Watched::Exists(path) => match retry_on_loss(|| client.check_and_watch_stat(path)).await? {
            (None, _) => return Ok(()),
            (Some(_), watcher) => watcher,
        },
        Watched::Data(path) => match retry_on_loss(|| client.get_and_watch_data(path)).await {
            Ok((_, _, watcher)) => watcher,
            Err(ZkError::NoNode) => return Ok(()),
            Err(err) => return Err(err.into()),
        },
        Watched::Children(path) => retry_on_loss(|| client.list_and_watch_children(path)).await?.1,
    };
    let _ = tokio::time::timeout_at(until, watcher.changed()).await;
    Ok(())
}

/// Releases a recorded holding through ZooKeeper alone, on whichever instance serves the
/// request: a leader's acknowledgement first (if it names this candidate), then its znodes and
/// its holding record together (the keeper's task sees its node go with its holding record: released).
/// `false` if its node was gone already.
pub async fn release_recorded(session: &Session, root: &str, recorded: &Recorded) -> Result<bool, Failure> {
    let client = session.client();
    let dir = &recorded.paths[0][..recorded.paths[0].rfind('/').unwrap_or(0)];
    recorded.role.on_exit(client, dir, &recorded.node.name).await;
    let record_names = recorded.record_names(root);
    let Some((record_name, legacy)) = record_names.split_first() else {
        // Not zkgate's (no owner recorded): its nodes alone.
        return Ok(delete_all(client, &recorded.paths).await?[0]);
    };
    let (there, _) = delete_held(client, &recorded.paths, record_name, &recorded.handle, legacy).await?;
    Ok(there.first().copied().unwrap_or(false))
}

/// Whether the holding record `name` under the lease record at `lease` names `handle` (see
/// [crate::recipes::engine::handle::names_handle]).
pub async fn names(session: &Session, lease: &str, name: &str, handle: &str) -> Result<bool, Failure> {
    Ok(crate::recipes::engine::handle::names_handle(session.client(), lease, name, handle).await?)
}

/// The holding `lease` has at resource `name` of `kind`, of the kinds a lease holds one of per
/// resource (a contender, a permit request), from its holding record: the holding record's name and what
/// it records. `None` if it holds none there.
pub async fn held_at(
    session: &Session,
    lease: &crate::recipes::engine::lease::Lease,
    kind: Kind,
    name: &str,
) -> Result<Option<(String, crate::recipes::engine::record::HoldingRecord)>, Failure> {
    use crate::recipes::engine::record;
    let record_name = record::record_name(kind, name, None);
    let held = record::holding(session.client(), &lease.path, &record_name).await?;
    Ok(held.map(|held| (record_name, held)))
}
