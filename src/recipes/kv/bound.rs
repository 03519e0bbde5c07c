//! Keys bound to a lease: ZooKeeper's ephemeral data, on zkgate's leases (docs/PRIMITIVES.md §1).
//!
//! The key stays what every other key is, the plain persistent znode `<root>/kv/<key>` holding
//! the value, so Curator, kazoo and `zkCli` read it as before. It is not an ephemeral: zkgate's
//! leases outlive the instance that made them and its sessions, and an ephemeral would die with
//! that instance. The binding is two records, made in the multi-op that writes the value:
//! - the *owner record* `<root>/bindings/<hash of the key's path>`, which names the lease, its
//!   principal and the binding's handle; whoever writes the key reads (or guards on) it, on any
//!   instance;
//! - a holding record under the lease's record, so that the lease's end (its expiry, its
//!   `DELETE`, the reaper's end of a lease whose keeper is gone) finds the key and deletes it,
//!   and the lease's view lists it.
//!
//! A binding is a [Handle] whose protocol, [BoundKey], writes the key with both records, holds
//! while the owner record names it, and on the lease's end deletes the key, its charges and
//! both records together, *only while the owner record still names it*: a key bound again to
//! another lease (or made plain) by a later write is that write's, and the old lease's end must
//! not take it away. That check is the owner record's version inside the deleting multi-op, not
//! a read before it, so a rebind racing with the end cannot be lost.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use zookeeper_client::{Client, CreateMode, Error as ZkError, EventType, Stat};

use crate::kind::Kind;
use crate::recipes::condition::{Condition, Recheck};
use crate::recipes::engine::handle::{
    Exit, Guarded, Handle, Handles, Node, NotCreated, Phase, Protocol, Refused, create_held, delete_held,
};
use crate::recipes::engine::lease::Lease;
use crate::recipes::engine::node::owner_record_path;
use crate::recipes::engine::record::{self, HoldingRecord, Shape};
use crate::recipes::usage::{self, Charge, Payer, Quotas};
use crate::zk::{Failed, Failure, Multi, Session, retry_on_loss};

use super::{Key, WriteError, admits};

/// The bindings of keys to leases that this instance drives.
pub type BoundKeys = Handles<BoundKey>;

/// What the owner record of a bound key says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    /// The lease the key is bound to.
    pub lease: String,
    /// The lease's principal, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// The binding's handle (its holding record's name under the lease is made from it).
    pub handle: String,
}

impl Binding {
    /// The binding of `handle` to `lease`.
    pub fn of(lease: &Lease, handle: &str) -> Binding {
        Binding {
            lease: lease.id.clone(),
            principal: lease.principal.clone(),
            handle: handle.to_string(),
        }
    }

    /// The path of the holding record this binding made under its lease.
    pub fn holding_record(&self, root: &str, key: &str) -> String {
        let name = record::record_name(Kind::Kv, key, Some(&self.handle));
        format!("{}/{name}", record::path(root, &self.lease))
    }
}

/// The holding record of `handle`, the binding of the key `name` at `path` to `lease` (driven
/// by this instance).
pub fn holding_record(lease: &Lease, (name, handle): (&str, &str), path: &str) -> HoldingRecord {
    HoldingRecord {
        kind: Kind::Kv.name().to_string(),
        name: name.to_string(),
        handle: handle.to_string(),
        shape: shape(path),
        driver: Some(lease.here.to_string()),
    }
}

/// A binding's shape in its holding record: the key's node, whose owner record names it.
pub fn shape(path: &str) -> Shape {
    Shape::Node {
        path: path.to_string(),
        charge: None,
        owner_record: true,
        hidden: false,
    }
}

/// The binding of the key at `path` and the owner record's version, if it is bound.
pub async fn binding(client: &Client, root: &str, path: &str) -> Result<Option<(Binding, i32)>, ZkError> {
    let found = crate::zk::data(client, &owner_record_path(root, path)).await?;
    Ok(found.and_then(|(data, stat)| Some((serde_json::from_slice(&data).ok()?, stat.version))))
}

/// What a binding's first run writes, from what its writer read.
pub struct Write {
    pub data: Vec<u8>,
    /// The key's stat it replaces; `None`: the key is created, after its `parents`.
    pub over: Option<Stat>,
    /// The missing parents of a new key, the highest first (persistent, as every kv key's).
    pub parents: Vec<String>,
    /// The owner record it replaces (a key bound to another lease), at the version read, and
    /// that binding's holding record if it is there (deleted with it: the other lease's task
    /// for the key ends, released); `None`: the owner record is created (the key was plain, or
    /// new).
    pub previous: Option<(i32, Option<String>)>,
    /// The charge the value moves to (its writer's).
    pub charge: Charge,
}

/// A key's binding to a lease: see the module's docs.
pub struct BoundKey {
    root: Arc<str>,
    quotas: Quotas,
    /// The key's znode.
    path: String,
    /// Written by the first run; `None` for a binding taken over from its holding record, which
    /// is found, never made.
    write: Option<Write>,
}

/// What an operation of a binding's multi-op is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// A missing parent of a new key.
    Parent,
    /// The key itself.
    Value,
    /// The owner record.
    Owner,
    /// A charge moved or refunded.
    Charge,
    /// A binding's holding record: this one's (deleted with the key), or the one it replaces.
    Record,
    /// A check of the writer's guards.
    Guard,
}

impl Protocol for BoundKey {
    fn kind(&self) -> Kind {
        Kind::Kv
    }

    fn one_per_lease(&self) -> bool {
        false
    }

    fn metered(&self) -> bool {
        false
    }

    async fn run(&self, handle: &Handle<Self>, client: &Client) -> Exit {
        if let Some(exit) = self.find_or_write(handle, client).await {
            return exit;
        }
        handle.hold();
        let _counted = crate::metrics::Counted::new(&crate::metrics::get().kv_bound_keys);
        // Held while the owner record names this binding: a `DELETE` of the key (through any
        // instance) deletes it, a rebind rewrites it; either ends this task, without a clean-up.
        let owner = owner_record_path(&self.root, &self.path);
        loop {
            let watched = retry_on_loss(|| client.get_and_watch_data(&owner)).await;
            match watched {
                Ok((data, _, watcher)) if names(&data, handle) => match watcher.changed().await.event_type {
                    EventType::Session => return Exit::Interrupted,
                    _ => continue,
                },
                Ok(_) | Err(ZkError::NoNode) => {
                    return Exit::Lost("its binding was removed or replaced by another write".into());
                }
                Err(err) => return Exit::from_error(err),
            }
        }
    }

    /// Deletes the key, its charges, its owner record and its holding record in one multi-op
    /// conditional on the owner record's version, if it still names this binding; otherwise
    /// only the holding record (the key is another write's now).
    async fn clean_up(&self, handle: &Handle<Self>, client: &Client) -> Result<bool, ZkError> {
        let owner = owner_record_path(&self.root, &self.path);
        let id = usage::path_id("kv", &self.path);
        loop {
            let Some((data, stat)) = crate::zk::data(client, &owner).await? else {
                break;
            };
            if !names(&data, handle) {
                break;
            }
            let charges = self.quotas.charges_of(client, &id).await?;
            let mut multi = Multi::new(client);
            multi.delete(Part::Value, &self.path, None)?;
            multi.delete(Part::Owner, &owner, Some(stat.version))?;
            self.quotas.add_refunds(&mut multi, Part::Charge, &charges)?;
            multi.delete(Part::Record, &handle.record_path(), None)?;
            match multi.commit().await {
                Ok(_) => {
                    crate::metrics::get().kv_keys_ended.inc();
                    return Ok(true);
                }
                // Changed meanwhile (or gone, or a lost reply): the next read tells.
                Err(Failed::Refused {
                    error: ZkError::NoNode | ZkError::BadVersion,
                    ..
                }) => {}
                // Keys were written below it: it stays, unbound (a key with keys below it is
                // never deleted, as a `DELETE` of it is refused).
                Err(Failed::Refused {
                    tag: Part::Value,
                    error: ZkError::NotEmpty,
                }) => {
                    let paths = [owner.clone()];
                    delete_held(client, &[], &handle.record_path(), &handle.id, &paths).await?;
                    return Ok(true);
                }
                Err(failed) if failed.is_loss() => {}
                Err(failed) => return Err(failed.error()),
            }
        }
        let record = handle.record_path();
        delete_held(client, &[], &record, &handle.id, &[]).await?;
        Ok(false)
    }

    fn record(&self, handle: &Handle<Self>) -> HoldingRecord {
        holding_record(&handle.lease, (&handle.name, &handle.id), &self.path)
    }

    fn loss_reason(&self, _handle: &Handle<Self>) -> String {
        "its binding was removed or replaced by another write".into()
    }
}

/// Whether owner record `data` names `handle`'s binding.
fn names(data: &[u8], handle: &Handle<BoundKey>) -> bool {
    serde_json::from_slice::<Binding>(data)
        .is_ok_and(|binding| binding.handle == handle.id && binding.lease == handle.lease.id)
}

impl BoundKey {
    /// Finds the binding (made before: by this task, or by the instance that drove it before) or
    /// writes it. `Some` exit if it cannot be had.
    async fn find_or_write(&self, handle: &Handle<Self>, client: &Client) -> Option<Exit> {
        let owner = owner_record_path(&self.root, &self.path);
        loop {
            if let (Some(write), true) = (&self.write, handle.may_create()) {
                match self.write(handle, client, write).await {
                    Ok(czxid) => {
                        // Its `czxid` is the transaction's zxid: the key's new `mzxid`, its ETag.
                        let name = self.path.clone();
                        handle.set_node(Node { name, czxid });
                        return None;
                    }
                    // Its holding record is there: an earlier write applied (its reply lost).
                    Err(NotCreated::MadeBefore) => handle.created(),
                    // Applied or not: the owner record tells.
                    Err(NotCreated::Request(err)) if crate::zk::is_loss(&err) => {}
                    // The key or its owner record changed since its writer read them: its
                    // writer decides again.
                    Err(NotCreated::Refused { error, .. }) => return Some(Exit::Failed(error.into())),
                    Err(not_created) => return Some(not_created.exit()),
                }
            }
            match crate::zk::data(client, &owner).await {
                Ok(Some((data, stat))) if names(&data, handle) => {
                    let name = self.path.clone();
                    handle.set_node(Node {
                        name,
                        czxid: stat.mzxid,
                    });
                    handle.created();
                    return None;
                }
                // A write whose reply was lost and that did not apply: written again.
                Ok(_) if handle.may_create() && self.write.is_some() => {}
                Ok(_) => {
                    return Some(Exit::Lost(
                        "its binding was removed or replaced by another write".into(),
                    ));
                }
                Err(err) => return Some(Exit::from_error(err)),
            }
        }
    }

    /// The binding's multi-op, guarded by its lease: the key (created after its parents, or
    /// set at the version read), its owner record (created, or rewritten at the version read),
    /// its charges moved, and its holding record. The transaction's zxid.
    async fn write(&self, handle: &Handle<Self>, client: &Client, write: &Write) -> Result<i64, NotCreated<Part>> {
        let id = usage::path_id("kv", &self.path);
        let charges = self.quotas.charges_of(client, &id).await.map_err(NotCreated::Request)?;
        let owner = owner_record_path(&self.root, &self.path);
        let binding = serde_json::to_vec(&Binding::of(&handle.lease, &handle.id)).unwrap_or_default();
        let options = CreateMode::Persistent.with_acls(crate::zk::acls());
        let add = |multi: &mut Multi<'_, Guarded<Part>>| {
            match &write.over {
                None => {
                    for parent in &write.parents {
                        multi.create(Guarded::Own(Part::Parent), parent, &[], &options)?;
                    }
                    multi.create(Guarded::Own(Part::Value), &self.path, &write.data, &options)?;
                }
                Some(stat) => multi.set(Guarded::Own(Part::Value), &self.path, &write.data, Some(stat.version))?,
            }
            match &write.previous {
                None => multi.create(Guarded::Own(Part::Owner), &owner, &binding, &options)?,
                Some((version, record)) => {
                    multi.set(Guarded::Own(Part::Owner), &owner, &binding, Some(*version))?;
                    if let Some(record) = record {
                        multi.delete(Guarded::Own(Part::Record), record, None)?;
                    }
                }
            }
            let tag = Guarded::Own(Part::Charge);
            self.quotas
                .add_recharge(multi, tag, &write.charge, write.data.len(), &charges)
        };
        let made = create_held(handle, client, add, None).await?;
        Ok(made.czxid.unwrap_or_default())
    }
}

/// [super::write] of a key bound to `lease` (`keys`: this instance's bindings), by the rule for
/// rewrites: over the lease's own binding, the value is rewritten (guarded by the owner
/// record's version); over a plain key or another lease's binding, refused unless `rebind`;
/// otherwise the key is bound by a new [BoundKey] holding, which writes it.
pub(super) async fn write(
    session: &Session,
    key: &Key<'_>,
    data: &[u8],
    condition: Condition,
    payer: Payer<'_>,
    (lease, rebind): (&Arc<Lease>, bool),
) -> Result<(i64, bool), WriteError> {
    let (client, path) = (session.client(), key.path.as_str());
    let mine = super::charge_of(client, &payer, key, data.len()).await?;
    let mut recheck = Recheck::default();
    loop {
        let (current, found) = tokio::join!(
            retry_on_loss(|| client.check_stat(path)),
            binding(client, key.root, path)
        );
        let (expected, found) = match admits(condition, current?) {
            Ok(expected) => (expected, found?),
            Err(refusal) => {
                recheck.confirm(session, refusal).await?;
                continue;
            }
        };
        // A binding of another principal's lease is refused as such (403), before the rule for
        // rewrites (409, which that principal may act on) is looked at.
        let foreign = (found.as_ref())
            .filter(|(bound, _)| bound.lease != lease.id)
            .and_then(|(bound, _)| key.may_unbind(bound).err());
        let refusal = match (foreign, &found, &expected) {
            (Some(forbidden), _, _) => forbidden,
            (None, Some((bound, version)), Some(stat)) if bound.lease == lease.id => {
                match rewrite(session, key, data, (stat, *version), &mine, payer).await? {
                    Some(mzxid) => return Ok((mzxid, false)),
                    None => continue,
                }
            }
            (None, Some((bound, _)), _) if bound.lease != lease.id && !rebind => WriteError::Bound(bound.clone()),
            (None, None, Some(_)) if !rebind => WriteError::NotBound,
            _ if key.is_guarded() => WriteError::GuardedBinding,
            _ => {
                let parents = match expected {
                    None => super::missing_parents(client, path).await?,
                    Some(_) => Vec::new(),
                };
                let previous = match &found {
                    Some((bound, version)) => {
                        let record = bound.holding_record(key.root, key.name);
                        let there = retry_on_loss(|| client.check_stat(&record)).await?.is_some();
                        Some((*version, there.then_some(record)))
                    }
                    None => None,
                };
                let created = expected.is_none();
                let write = Write {
                    data: data.to_vec(),
                    over: expected,
                    parents,
                    previous,
                    charge: mine.clone(),
                };
                match key
                    .keys
                    .bind(lease, payer.quotas, (key.name, key.path.clone()), write)
                    .await
                {
                    Ok(mzxid) => {
                        if let Some((replaced, _)) = &found {
                            key.settled(replaced).await;
                        }
                        return Ok((mzxid, created));
                    }
                    Err(BindError::Changed) => continue,
                    Err(BindError::LeaseEnded) => return Err(WriteError::LeaseEnded),
                    Err(BindError::ZooKeeper(Failure::QuotaFull)) => {
                        return Err(WriteError::Quota(payer.exceeded(session, data.len()).await));
                    }
                    Err(BindError::ZooKeeper(err)) => return Err(err.into()),
                }
            }
        };
        recheck.confirm(session, refusal).await?;
    }
}

/// Rewrites the value of a key bound to the writer's own lease: the key at the version read,
/// guarded by its owner record's (so that a rebind or a delete in between refuses it), its
/// charge moved. The new `mzxid`; `None` to decide again.
async fn rewrite(
    session: &Session,
    key: &Key<'_>,
    data: &[u8],
    (stat, owner_version): (&Stat, i32),
    mine: &Charge,
    payer: Payer<'_>,
) -> Result<Option<i64>, WriteError> {
    let client = session.client();
    let charges = payer.quotas.charges_of(client, &mine.id).await?;
    let mut multi = Multi::new(client);
    key.add_guards(&mut multi, Part::Guard)?;
    multi.check(Part::Owner, &key.owner_record(), owner_version)?;
    multi.set(Part::Value, &key.path, data, Some(stat.version))?;
    payer
        .quotas
        .add_recharge(&mut multi, Part::Charge, mine, data.len(), &charges)?;
    match multi.commit().await {
        Ok(done) => Ok(done.stat(&Part::Value).map(|stat| stat.mzxid)),
        Err(Failed::Refused { tag: Part::Guard, .. }) => Err(WriteError::ZooKeeper(Failure::Unguarded)),
        Err(Failed::Refused {
            error: ZkError::QuotaExceeded,
            ..
        }) => Err(WriteError::Quota(payer.exceeded(session, data.len()).await)),
        Err(Failed::Refused {
            error: ZkError::NoNode | ZkError::NodeExists | ZkError::BadVersion,
            ..
        }) => Ok(None),
        // Applied or not, as the key tells (see `after_loss`).
        Err(failed) if failed.is_loss() => match super::lost::after_loss(session, &key.path, data, Some(stat)).await? {
            super::lost::LostReply::Applied(stat) => Ok(Some(stat.mzxid)),
            super::lost::LostReply::NotApplied => Ok(None),
            super::lost::LostReply::Unknown => Err(WriteError::OutcomeUnknown),
        },
        Err(failed) => Err(failed.error().into()),
    }
}

/// Why a binding was not made.
#[derive(Debug)]
pub enum BindError {
    /// The key or its owner record changed since they were read: decide again.
    Changed,
    /// The lease ended (or left this instance) first.
    LeaseEnded,
    ZooKeeper(Failure),
}

impl BoundKeys {
    /// Binds the key `key` at `path` to `lease` with `write`, and waits until it is written.
    /// Returns the binding and the key's new `mzxid`.
    pub async fn bind(
        &self,
        lease: &Arc<Lease>,
        quotas: &Quotas,
        (key, path): (&str, String),
        write: Write,
    ) -> Result<i64, BindError> {
        let protocol = BoundKey {
            root: self.root().into(),
            quotas: quotas.clone(),
            path,
            write: Some(write),
        };
        let binding = match self.open(lease, key, None, protocol, |_, _| false) {
            Ok((binding, _)) => binding,
            Err(Refused::Taken(_)) => return Err(BindError::Changed),
            Err(Refused::LeaseEnded) => return Err(BindError::LeaseEnded),
        };
        match binding.decided().await {
            Phase::Held { .. } => Ok(binding.state().node.map_or(0, |node| node.czxid)),
            Phase::Failed { error } => match error {
                Failure::Unexpected(ZkError::BadVersion | ZkError::NoNode) | Failure::Taken => Err(BindError::Changed),
                error => Err(BindError::ZooKeeper(error)),
            },
            Phase::Lost { .. } => Err(BindError::Changed),
            _ => Err(BindError::LeaseEnded),
        }
    }

    /// Takes over the binding of a lease adopted from another keeper, from its holding record.
    pub fn adopt_binding(
        &self,
        lease: &Arc<Lease>,
        quotas: &Quotas,
        (name, id): (&str, &str),
        record_name: &str,
        shape: &Shape,
    ) -> Result<Arc<Handle<BoundKey>>, Refused<BoundKey>> {
        let Shape::Node { path, .. } = shape else {
            return Err(Refused::LeaseEnded);
        };
        let protocol = BoundKey {
            root: self.root().into(),
            quotas: quotas.clone(),
            path: path.clone(),
            write: None,
        };
        self.adopt(lease, (name, id), record_name, protocol)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binding_names_its_lease_and_its_holding_record() {
        let binding = Binding {
            lease: "0123abcd-6f1c".into(),
            principal: Some("alice".into()),
            handle: "h1".into(),
        };
        let data = serde_json::to_vec(&binding).expect("json");
        // What other code reads of an owner record: the lease and the principal.
        let owner = crate::recipes::engine::node::Owner::in_data(&data).expect("owner");
        assert_eq!(owner.lease, "0123abcd-6f1c");
        assert_eq!(owner.principal.as_deref(), Some("alice"));
        let record = binding.holding_record("/zkgate", "app/x");
        assert!(record.starts_with("/zkgate/leases/0123abcd-6f1c/kv-"), "{record}");
        let other = Binding {
            handle: "h2".into(),
            ..binding.clone()
        };
        assert_ne!(record, other.holding_record("/zkgate", "app/x"));
    }
}
