//! Lease-bound ephemeral znodes: a group member (the guide's group membership: each member an
//! ephemeral child of the group's znode, holding its data), a barrier bound to its owner, a
//! double barrier's participant, a two-phase commit's registered participant.
//!
//! ZooKeeper removes such a node when its session dies; zkgate also removes it when the lease
//! it was made for ends. Each is a [Handle] whose protocol, [Bound], creates the node, holds
//! until it is released, and deletes it. Its id is the caller's (the member or participant id,
//! unique in its resource), not one zkgate issues.
//!
//! Who may act on such a node is decided from ZooKeeper's data, not from what one instance
//! remembers: the node records its lease and the lease's principal ([owner_record]), and
//! [check_owner] reads that record on whichever instance serves the request. A lease's
//! principal is fixed when it is made and the node lives no longer than the lease, so the
//! record cannot go stale; a node recording no principal (one made without auth, or by another
//! client such as kazoo) is anyone's with write access to its resource, as before auth.

use std::sync::Arc;

use zookeeper_client::{Client, CreateMode, Error as ZkError, MultiWriteError};

use super::handle::{Exit, Handle, Handles, Phase, Protocol, Refused};
use super::lease::Lease;
use super::usage::ChargeNode;
use crate::auth::{Caller, Forbidden};
use crate::kind::Kind;
use crate::zk::retry_on_loss;

/// A lease-bound node's protocol: where it is and what it holds.
pub struct Bound {
    kind: Kind,
    /// The node's path; its parent is created (persistent) if needed.
    pub path: String,
    data: Vec<u8>,
    /// Its charge to the principal that made it ([crate::recipes::usage]), an ephemeral node
    /// created with it on the same session, so that it goes with it.
    charge: Option<ChargeNode>,
}

/// One lease-bound ephemeral node.
pub type BoundNode = Handle<Bound>;

/// The lease-bound nodes of one kind made through this instance, by resource and id.
pub type BoundNodes = Handles<Bound>;

/// Why a bound node could not be made.
#[derive(Debug)]
pub enum BindError {
    /// Another lease, or another session, already has a node there.
    Taken,
    /// The lease ended meanwhile.
    LeaseEnded,
    ZooKeeper(ZkError),
}

impl Protocol for Bound {
    fn kind(&self) -> Kind {
        self.kind
    }

    fn one_per_lease(&self) -> bool {
        false
    }

    fn metered(&self) -> bool {
        false
    }

    async fn run(&self, handle: &BoundNode, client: &Client) -> Exit {
        // A group's or a service's znode is a container: ZooKeeper removes it with its last
        // member (as Curator makes them).
        let container_parent = matches!(self.kind, Kind::Group | Kind::Service);
        match create(client, &self.path, &self.data, self.charge.as_ref(), container_parent).await {
            Ok(()) => {
                handle.hold();
                std::future::pending().await
            }
            Err(err) => Exit::from_error(err),
        }
    }

    /// Deletes the node. A node already gone (another participant removed it, as the double
    /// barrier lets any session do) is not a loss: a bound node promises no exclusion.
    async fn clean_up(&self, _handle: &BoundNode, client: &Client) -> bool {
        let charge = self.charge.as_ref().map(|c| c.path.as_str());
        for path in std::iter::once(self.path.as_str()).chain(charge) {
            match retry_on_loss(|| client.delete(path, None)).await {
                Ok(()) | Err(ZkError::NoNode | ZkError::SessionExpired | ZkError::ClientClosed) => {}
                Err(err) => tracing::warn!(%path, error = %err, "could not delete a lease-bound node"),
            }
        }
        true
    }
}

impl BoundNodes {
    /// Creates the ephemeral node `path` holding `data`, as `id` of resource `name`, bound to
    /// `lease`, and waits until it exists. The same id asked again with the same lease is the
    /// same node.
    ///
    /// # Notable errors
    /// * [BindError::Taken] when another lease (here) or another session (anywhere) has it.
    /// * [BindError::LeaseEnded] when the lease ended first.
    pub async fn bind(
        &self,
        lease: &Arc<Lease>,
        name: &str,
        id: &str,
        path: String,
        data: Vec<u8>,
        charge: Option<ChargeNode>,
    ) -> Result<Arc<BoundNode>, BindError> {
        let protocol = Bound {
            kind: self.kind(),
            path,
            data,
            charge,
        };
        let same_lease = |existing: &BoundNode, _: &Bound| Arc::ptr_eq(&existing.lease, lease);
        let node = match self.open(lease, name, Some(id.to_string()), protocol, same_lease) {
            Ok((node, _)) => node,
            Err(Refused::Taken(_)) => return Err(BindError::Taken),
            Err(Refused::LeaseEnded) => return Err(BindError::LeaseEnded),
        };
        match node.decided().await {
            Phase::Held { .. } => Ok(node),
            Phase::Failed {
                error: ZkError::NodeExists,
            } => Err(BindError::Taken),
            Phase::Failed { error } => Err(BindError::ZooKeeper(error)),
            _ => Err(BindError::LeaseEnded),
        }
    }
}

/// Creates the ephemeral node (and its parent, a container if asked), with its charge if it has one (in one
/// multi-op: a node past its principal's quota is not created). A create whose reply was lost
/// is recognised by the node being ours (its ephemeral owner is our session); one owned by
/// another session is `NodeExists`.
async fn create(
    client: &Client,
    path: &str,
    data: &[u8],
    charge: Option<&ChargeNode>,
    container_parent: bool,
) -> Result<(), ZkError> {
    let options = CreateMode::Ephemeral.with_acls(crate::zk::acls());
    let parent = &path[..path.rfind('/').unwrap_or(0)];
    loop {
        let created = match charge {
            None => client.create(path, data, &options).await.map(|_| ()),
            Some(charge) => {
                let mut writer = client.new_multi_writer();
                writer.add_create(path, data, &options)?;
                writer.add_create(&charge.path, &charge.data, &options)?;
                match writer.commit().await {
                    Ok(_) => Ok(()),
                    Err(
                        MultiWriteError::OperationFailed { source, .. } | MultiWriteError::RequestFailed { source },
                    ) => Err(source),
                }
            }
        };
        match created {
            Ok(()) => return Ok(()),
            Err(ZkError::NoNode) if container_parent => super::contender::ensure_dir(client, parent).await?,
            Err(ZkError::NoNode) => crate::zk::session::ensure_path(client, parent).await?,
            Err(err) if err == ZkError::NodeExists || crate::zk::is_loss(&err) => {
                match retry_on_loss(|| client.check_stat(path)).await? {
                    Some(stat) if stat.ephemeral_owner == client.session_id().0 => return Ok(()),
                    Some(_) => return Err(ZkError::NodeExists),
                    None => continue,
                }
            }
            Err(err) => return Err(err),
        }
    }
}

/// The data of a node zkgate binds to `lease` for the guide's recipes whose nodes carry no data
/// of their own (a lease-bound barrier, a double barrier's participant, a transaction's
/// participant): `{"lease": <id>, "principal": <owner>}`.
pub fn owner_record(lease: &Lease) -> Vec<u8> {
    let mut record = serde_json::json!({ "lease": lease.id });
    if let Some(owner) = &lease.owner {
        record["principal"] = owner.as_str().into();
    }
    record.to_string().into_bytes()
}

/// Why [check_owner] refused.
#[derive(Debug)]
pub enum OwnerError {
    Forbidden(Forbidden),
    ZooKeeper(ZkError),
}

/// `Ok` if `caller` may act on the node at `path` (`what` names it in the refusal): its
/// recorded principal, an admin, or anyone when it records none. A node that is not there is
/// nobody's: `Ok`, and the operation finds it gone.
///
/// The check and the act that follows are two requests; between them the node can only change
/// hands if its lease ends and another principal binds the same id, after which the act is
/// one the new owner's node could have suffered from anyone before it was made.
pub async fn check_owner(client: &Client, path: &str, caller: &Caller, what: &str) -> Result<(), OwnerError> {
    let data = match retry_on_loss(|| client.get_data(path)).await {
        Ok((data, _)) => data,
        Err(ZkError::NoNode) => return Ok(()),
        Err(err) => return Err(OwnerError::ZooKeeper(err)),
    };
    match super::view::principal_of(&data) {
        None => Ok(()),
        Some(recorded) => caller
            .require_owner(Some(&recorded), what)
            .map_err(OwnerError::Forbidden),
    }
}
