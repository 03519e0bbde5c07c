//! Lease-bound znodes: a group member (the guide's group membership: each member a child of the
//! group's znode, holding its data), a barrier bound to its owner, a double barrier's
//! participant, a two-phase commit's registered participant, a registered service instance.
//!
//! The guide makes these ephemeral, so that they go when their owner's session dies. zkgate's
//! owner is a lease, which outlives any one instance's session ([super::lease]): each node is
//! persistent, created in one multi-op with its holding record under its lease, and removed when the
//! lease ends or the holder releases it. Each is a [Handle] whose protocol, [Bound], creates the
//! node, holds until it is released, and deletes it. Its id is the caller's (the member or
//! participant id, unique in its resource), not one zkgate issues.
//!
//! Who may act on such a node is decided from ZooKeeper's data, not from what one instance
//! remembers: the node records its lease and the lease's principal ([owner_record]), or, when
//! its data is the member's own (a group member's, which Curator and kazoo read as it is), a
//! *owner record* `<root>/bindings/<hash of the path>` made with it does ([owner_of]). [check_owner]
//! reads that record on whichever instance serves the request, and [release_recorded] releases
//! such a node through any instance. A lease's principal is fixed when it is made and the node
//! lives no longer than the lease, so the record cannot go stale; a node recording no principal
//! (one made without auth, or by another client such as kazoo) is anyone's with write access to
//! its resource, as before auth.

use crate::zk::{Failure, Session};
use std::sync::Arc;

use zookeeper_client::{Client, CreateMode, Error as ZkError, EventType};

use super::handle::{
    Exit, Guarded, Handle, Handles, NotCreated, Phase, Protocol, Refused, create_held, delete_all, delete_all_guarded,
};
use super::lease::Lease;
use super::record::{self, HoldingRecord, Shape};
use crate::auth::{Caller, Forbidden};
use crate::kind::Kind;
use crate::recipes::guards::{Checked, Guards};
use crate::recipes::usage::ChargeNode;
use crate::zk::Multi;
use crate::zk::retry_on_loss;

/// A node holding's protocol: where it is and what it holds.
pub struct OneNode {
    kind: Kind,
    /// zkgate's root znode (where owner records are).
    root: Arc<str>,
    /// The node's path; its parent is created if needed (a container for groups and services).
    pub path: String,
    /// Its data; `None` for a node adopted from another keeper, which is found, never made.
    data: Option<Vec<u8>>,
    /// Its charge to the principal that made it ([crate::recipes::usage]), created and deleted
    /// with it.
    charge: Option<ChargeNode>,
    /// The owner record that names its lease, for a node whose data is not zkgate's.
    owner_record: Option<String>,
    /// Not shown among the lease's holdings (a lock set's record).
    hidden: bool,
    /// What its writer must still hold when the node is made (`ZKGATE-Guard`).
    guards: Checked,
}

/// One node holding.
pub type NodeHolding = Handle<OneNode>;

/// The node holdings of one kind kept by this instance, by resource and id.
pub type NodeHoldings = Handles<OneNode>;

/// Why a node holding could not be made.
#[derive(Debug)]
pub enum HoldError {
    /// Another lease, or another client, already has a node there.
    Taken,
    /// The lease ended meanwhile (or left this instance).
    LeaseEnded,
    ZooKeeper(Failure),
}

/// `<root>/bindings/<hash of path>`: the owner record of the node at `path`.
pub fn owner_record_path(root: &str, path: &str) -> String {
    format!(
        "{root}/{}/{}",
        record::OWNER_RECORDS,
        crate::recipes::usage::path_id("b", path)
    )
}

impl Protocol for OneNode {
    fn kind(&self) -> Kind {
        self.kind
    }

    fn one_per_lease(&self) -> bool {
        false
    }

    fn metered(&self) -> bool {
        false
    }

    fn shown(&self) -> bool {
        !self.hidden
    }

    async fn run(&self, handle: &NodeHolding, client: &Client) -> Exit {
        if let Some(exit) = self.find_or_create(handle, client).await {
            return exit;
        }
        handle.hold();
        // Watched, so that a release through another instance (which deletes the node and its
        // holding record) ends this task too.
        loop {
            match retry_on_loss(|| client.check_and_watch_stat(&self.path)).await {
                Ok((None, _)) => return Exit::Lost("its znode was deleted".into()),
                Ok((Some(_), watcher)) => match watcher.changed().await.event_type {
                    EventType::NodeDeleted => return Exit::Lost("its znode was deleted".into()),
                    EventType::Session => return Exit::Interrupted,
                    _ => {}
                },
                Err(err) => return Exit::from_error(err),
            }
        }
    }

    /// Deletes the node, its charge, its owner record and its holding record. A node already gone
    /// (another participant removed it, as the double barrier lets anyone do) is not a loss: a
    /// node holding promises no exclusion.
    async fn clean_up(&self, handle: &NodeHolding, client: &Client) -> Result<bool, ZkError> {
        let mut paths = vec![self.path.clone()];
        paths.extend(self.charge.iter().map(|c| c.path.clone()));
        paths.extend(self.owner_record.iter().cloned());
        paths.push(handle.record_path());
        delete_all(client, &paths).await?;
        Ok(true)
    }

    fn record(&self, handle: &NodeHolding) -> HoldingRecord {
        HoldingRecord {
            kind: self.kind.name().to_string(),
            name: handle.name.clone(),
            handle: handle.id.clone(),
            shape: Shape::Node {
                path: self.path.clone(),
                charge: self.charge.as_ref().map(|c| c.path.clone()),
                owner_record: self.owner_record.is_some(),
                hidden: self.hidden,
            },
            driver: Some(handle.lease.here.to_string()),
        }
    }
}

/// What an operation of a node holding's create is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// A check of its writer's guards.
    Guard,
    /// The node itself.
    Node,
    /// Its charge (a kv value's, a counter's).
    Charge,
    /// Its owner record (a service instance's name, taken by one lease at a time).
    OwnerRecord,
}

impl OneNode {
    /// Finds the node (made before, by this task or a former keeper's) or creates it with its
    /// charge, owner record and holding record in one multi-op. `Some` exit if it cannot be had.
    async fn find_or_create(&self, handle: &NodeHolding, client: &Client) -> Option<Exit> {
        let options = CreateMode::Persistent.with_acls(crate::zk::acls());
        let parent = &self.path[..self.path.rfind('/').unwrap_or(0)];
        loop {
            let data = match (&self.data, handle.may_create()) {
                (Some(data), true) => data,
                _ => {
                    return match owner_of(client, &self.root, self.kind, &self.path).await {
                        Ok(Some(owner)) if owner.lease == handle.lease.id => None,
                        Ok(_) => Some(Exit::Lost("its znode was deleted".into())),
                        Err(err) => Some(Exit::from_error(err)),
                    };
                }
            };
            let add = |multi: &mut Multi<'_, Guarded<Part>>| {
                self.guards.add_to(multi, Guarded::Own(Part::Guard))?;
                multi.create(Guarded::Own(Part::Node), &self.path, data, &options)?;
                if let Some(charge) = &self.charge {
                    multi.create(Guarded::Own(Part::Charge), &charge.path, &charge.data, &options)?;
                }
                if let Some(record_path) = &self.owner_record {
                    multi.create(
                        Guarded::Own(Part::OwnerRecord),
                        record_path,
                        &owner_record(&handle.lease),
                        &options,
                    )?;
                }
                Ok(())
            };
            match create_held(handle, client, add, None).await {
                Ok(_) => return None,
                Err(NotCreated::Refused { tag: Part::Guard, .. }) => return Some(Exit::Failed(Failure::Unguarded)),
                Err(NotCreated::Refused {
                    tag: Part::Node,
                    error: ZkError::NoNode,
                }) => {
                    // A group's or a service's znode is a container: ZooKeeper removes it with
                    // its last member (as Curator makes them).
                    let made = match self.kind.in_container() {
                        true => super::contender::ensure_dir(client, parent).await,
                        false => crate::zk::session::ensure_path(client, parent).await,
                    };
                    if let Err(err) = made {
                        return Some(Exit::from_error(err));
                    }
                }
                // Its holding record is there: an earlier create applied (its reply lost).
                Err(NotCreated::MadeBefore) => handle.created(),
                // The node (made by another lease, or another client) or its owner record is taken.
                Err(NotCreated::Refused {
                    error: ZkError::NodeExists,
                    ..
                }) => return Some(Exit::Failed(Failure::Taken)),
                // The creation may have applied: the next pass looks for it (made is made).
                Err(NotCreated::Request(err)) if crate::zk::is_loss(&err) => handle.created(),
                Err(not_created) => return Some(not_created.exit()),
            }
        }
    }
}

impl NodeHoldings {
    /// Creates the node `path` holding `data`, as `id` of resource `name`, bound to `lease`, and
    /// waits until it exists. The same id asked again with the same lease is the same node.
    ///
    /// # Notable errors
    /// * [HoldError::Taken] when another lease (or another client) has it.
    /// * [HoldError::LeaseEnded] when the lease ended first.
    pub async fn hold(
        &self,
        lease: &Arc<Lease>,
        (name, id): (&str, &str),
        path: String,
        (data, charge): (Vec<u8>, Option<ChargeNode>),
        guards: &Guards,
    ) -> Result<Arc<NodeHolding>, HoldError> {
        self.hold_as(lease, (name, id), path, (data, charge), (false, guards.checked()))
            .await
    }

    /// [NodeHoldings::hold], for a node that does not show among the lease's holdings (`hidden`:
    /// a lock set's record).
    pub async fn hold_as(
        &self,
        lease: &Arc<Lease>,
        (name, id): (&str, &str),
        path: String,
        (data, charge): (Vec<u8>, Option<ChargeNode>),
        (hidden, guards): (bool, Checked),
    ) -> Result<Arc<NodeHolding>, HoldError> {
        let protocol = OneNode {
            kind: self.kind(),
            root: self.root().into(),
            owner_record: self
                .kind()
                .owner_recorded_apart()
                .then(|| owner_record_path(self.root(), &path)),
            path,
            data: Some(data),
            charge,
            hidden,
            guards,
        };
        let same_lease = |existing: &NodeHolding, _: &OneNode| Arc::ptr_eq(&existing.lease, lease);
        let node = match self.open(lease, name, Some(id.to_string()), protocol, same_lease) {
            Ok((node, _)) => node,
            Err(Refused::Taken(_)) => return Err(HoldError::Taken),
            Err(Refused::LeaseEnded) => return Err(HoldError::LeaseEnded),
        };
        match node.decided().await {
            Phase::Held { .. } => Ok(node),
            Phase::Failed { error: Failure::Taken } => Err(HoldError::Taken),
            Phase::Failed { error } => Err(HoldError::ZooKeeper(error)),
            _ => Err(HoldError::LeaseEnded),
        }
    }

    /// Takes over the node holding of a lease adopted from another keeper, from its holding record.
    pub fn adopt_node(
        &self,
        lease: &Arc<Lease>,
        (name, id): (&str, &str),
        record_name: &str,
        shape: &Shape,
    ) -> Result<Arc<NodeHolding>, Refused<OneNode>> {
        let Shape::Node {
            path,
            charge,
            owner_record,
            hidden,
        } = shape
        else {
            return Err(Refused::LeaseEnded);
        };
        let protocol = OneNode {
            kind: self.kind(),
            root: self.root().into(),
            owner_record: owner_record.then(|| owner_record_path(self.root(), path)),
            path: path.clone(),
            data: None,
            charge: charge.clone().map(|path| ChargeNode { path, data: Vec::new() }),
            hidden: *hidden,
            // Adopted: found, never made.
            guards: Checked::default(),
        };
        self.adopt(lease, (name, id), record_name, protocol)
    }
}

/// The data of a node zkgate binds to `lease` for the guide's recipes whose nodes carry no data
/// of their own (a lease-bound barrier, a double barrier's participant, a transaction's
/// participant), and of an owner record: `{"lease": <id>, "principal": <owner>}`.
pub fn owner_record(lease: &Lease) -> Vec<u8> {
    let mut record = serde_json::json!({ "lease": lease.id });
    if let Some(owner) = &lease.principal {
        record["principal"] = owner.as_str().into();
    }
    record.to_string().into_bytes()
}

/// Whose a node holding is, as recorded in ZooKeeper.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub lease: String,
    pub principal: Option<String>,
}

impl Owner {
    /// The owner a node's data records: `{"lease", "principal"}` at its top (an owner record, a
    /// contender's data) or under `zkgate` (a service instance, in Curator's JSON).
    pub fn in_data(data: &[u8]) -> Option<Owner> {
        let value: serde_json::Value = serde_json::from_slice(data).ok()?;
        let record = match value.get("zkgate") {
            Some(nested) if nested.is_object() => nested,
            _ => &value,
        };
        Some(Owner {
            lease: record.get("lease")?.as_str()?.to_string(),
            principal: record.get("principal").and_then(|p| p.as_str()).map(str::to_string),
        })
    }
}

/// The owner of the node holding of `kind` at `path`, from its data or its owner record; `None`
/// when it is not there or records none (it is not zkgate's).
pub async fn owner_of(client: &Client, root: &str, kind: Kind, path: &str) -> Result<Option<Owner>, ZkError> {
    let record = match kind.owner_recorded_apart() {
        true => owner_record_path(root, path),
        false => path.to_string(),
    };
    Ok(crate::zk::data(client, &record)
        .await?
        .and_then(|(data, _)| Owner::in_data(&data)))
}

/// Why [check_owner] refused.
#[derive(Debug)]
pub enum OwnerError {
    Forbidden(Forbidden),
    ZooKeeper(Failure),
}

/// `Ok` if `caller` may act on the node of `kind` at `path` (`what` names it in the refusal):
/// its recorded principal, an admin, or anyone when it records none. A node that is not there
/// is nobody's: `Ok`, and the operation finds it gone.
///
/// The check and the act that follows are two requests; between them the node can only change
/// hands if its lease ends and another principal binds the same id, after which the act is
/// one the new owner's node could have suffered from anyone before it was made.
pub async fn check_owner(
    session: &Session,
    root: &str,
    kind: Kind,
    path: &str,
    caller: &Caller,
    what: &str,
) -> Result<Option<Owner>, OwnerError> {
    let client = session.client();
    let owner = owner_of(client, root, kind, path)
        .await
        .map_err(|err| OwnerError::ZooKeeper(err.into()))?;
    match owner.as_ref().and_then(|o| o.principal.as_deref()) {
        None => Ok(owner),
        Some(recorded) => caller
            .require_owner(Some(recorded), what)
            .map(|()| owner)
            .map_err(OwnerError::Forbidden),
    }
}

/// Releases the node holding `id` of resource `name` of `kind` at `path` through ZooKeeper
/// alone, on whichever instance serves the request: the node, its charge, its owner record and its
/// holding record go in one multi-op (the lease's keeper, watching the node, sees it released). A
/// node that records no lease (not zkgate's) is deleted alone. `false` if nothing was there.
pub async fn release_recorded(
    session: &Session,
    root: &str,
    kind: Kind,
    (name, id): (&str, &str),
    path: &str,
    guards: &Checked,
) -> Result<bool, Failure> {
    let client = session.client();
    let mut paths = vec![path.to_string()];
    if let Some(owner) = owner_of(client, root, kind, path).await? {
        let record_name = format!(
            "{}/{}",
            record::path(root, &owner.lease),
            record::record_name(kind, name, Some(id))
        );
        if let Ok((data, _)) = retry_on_loss(|| client.get_data(&record_name)).await
            && let Some(HoldingRecord {
                shape: Shape::Node { charge, .. },
                ..
            }) = HoldingRecord::parse(&data)
        {
            paths.extend(charge);
        }
        if kind.owner_recorded_apart() {
            paths.push(owner_record_path(root, path));
        }
        paths.push(record_name);
    }
    Ok(delete_all_guarded(client, &paths, guards).await?[0])
}

impl From<OwnerError> for crate::problem::ApiError {
    fn from(err: OwnerError) -> crate::problem::ApiError {
        match err {
            OwnerError::Forbidden(err) => err.into(),
            OwnerError::ZooKeeper(err) => err.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_is_read_from_an_owner_record_or_a_service_instance() {
        let record = br#"{"lease":"0123abcd-6f1c2a9e0b7d4e3f8a5b6c7d8e9f0a1b","principal":"alice"}"#;
        let owner = Owner::in_data(record).expect("owner");
        assert_eq!(owner.principal.as_deref(), Some("alice"));
        let instance = br#"{"name":"api","id":"a","payload":null,"zkgate":{"lease":"L","principal":null}}"#;
        assert_eq!(
            Owner::in_data(instance),
            Some(Owner {
                lease: "L".into(),
                principal: None
            })
        );
        // A member's own data is not an owner record.
        assert_eq!(Owner::in_data(br#"{"host":"a"}"#), None);
        assert_eq!(Owner::in_data(b"10.0.0.1"), None);
    }

    #[test]
    fn owner_records_are_one_per_path() {
        let a = owner_record_path("/zkgate", "/zkgate/groups/g/m");
        assert!(a.starts_with("/zkgate/bindings/b-"), "{a}");
        assert_ne!(a, owner_record_path("/zkgate", "/zkgate/groups/g/n"));
    }
}
