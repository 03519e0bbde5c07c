//! Configuration and name service, the guide's "out of the box" recipe: plain persistent
//! znodes under `<root>/kv/`, read and written whole, with compare-and-set on their version;
//! a key may be bound to a lease ([bound]: it ends with the lease). Why this file is long (some
//! 830 lines): it is the keys' protocol and, at its end, the operations the API asks of them
//! (`get`, `put`, `remove`, `list`), which map its refusals to problems, and what a key may be
//! (`check_key`); bound keys, a lost reply and transactions are in the modules below.
//!
//! The version a client sees is the znode's `mzxid` (the zxid of its last change), not its
//! data version: data versions start again at 0 when a key is deleted and created again, so a
//! compare-and-set on them could succeed against a value the client never saw (ABA). A write
//! conditional on an mzxid reads the stat, compares the mzxid, and writes with the data
//! version it read, so a change in between still fails the write.
//!
//! A plain write must not land on a key bound to a lease (docs/PRIMITIVES.md, the rule for
//! rewrites), and must not pay a read of the key's owner record to know: its multi-op creates
//! and deletes the owner record's path, which ZooKeeper refuses (`NodeExists`) exactly when the
//! key is bound. Two operations in the same request, no round trip.

pub mod bound;
mod lost;
pub mod txn;
pub mod writer;

use lost::{LostReply, after_loss};

use std::sync::Arc;

use crate::recipes::condition::{Condition, Recheck};
use crate::zk::{Failed, Multi};
use crate::zk::{Failure, Session};
use zookeeper_client::{Client, CreateMode, Error as ZkError, Stat};

use crate::auth::{Caller, Forbidden};
use crate::kind::Kind;
use crate::problem::{ApiError, Place, Problem};
use crate::recipes::engine::lease::Lease;
use crate::recipes::engine::node::owner_record_path;
use crate::recipes::guards::{Guard, Guards, retry_guarded};
use crate::recipes::usage::{self, ChargeError, Exceeded, Payer, Quotas};
use crate::recipes::validate_name;
use crate::zk::retry_on_loss;
use bound::{Binding, BoundKeys};

/// A key: its name (`a/b`), its znode under zkgate's root, the bindings of keys to leases
/// this instance drives, and who writes it.
pub struct Key<'a> {
    pub keys: &'a BoundKeys,
    pub root: &'a str,
    pub name: &'a str,
    pub path: String,
    /// The writer, whose ownership a write or delete that removes a binding checks (`None`: a
    /// read, which removes none).
    by: Option<&'a Caller>,
    /// What the writer must still hold when the write applies ([Guards]).
    guards: Option<&'a Guards>,
}

impl<'a> Key<'a> {
    /// The key `name` (already validated), bound through `keys`, to be read.
    pub fn new(keys: &'a BoundKeys, name: &'a str) -> Key<'a> {
        Key {
            keys,
            root: keys.root(),
            name,
            path: Kind::Kv.path(keys.root(), name),
            by: None,
            guards: None,
        }
    }

    /// The key `name`, to be written or deleted by `caller`.
    pub fn written_by(keys: &'a BoundKeys, name: &'a str, caller: &'a Caller) -> Key<'a> {
        Key {
            by: Some(caller),
            ..Key::new(keys, name)
        }
    }

    /// The key, written only while `guards` hold.
    pub fn guarded_by(self, guards: &'a Guards) -> Key<'a> {
        Key {
            guards: Some(guards),
            ..self
        }
    }

    /// Adds the writer's guards' checks to `multi`, first, each tagged `tag`.
    fn add_guards<T: Clone>(&self, multi: &mut Multi<'_, T>, tag: T) -> Result<(), ZkError> {
        match self.guards {
            Some(guards) => guards.add_to(multi, tag),
            None => Ok(()),
        }
    }

    /// Whether the write is guarded.
    fn is_guarded(&self) -> bool {
        self.guards.is_some_and(|guards| !guards.is_empty())
    }

    /// `Ok` if the writer may remove `binding` (rebind the key, make it plain, or delete it):
    /// what a lease holds is acted on by its principal, or an admin (as every node a lease
    /// holds: [crate::recipes::engine::node::check_owner]); a binding that records no principal
    /// (made with auth off) by anyone.
    fn may_unbind(&self, binding: &Binding) -> Result<(), WriteError> {
        let Some(principal) = binding.principal.as_deref() else {
            return Ok(());
        };
        let what = format!("key `{}` (bound to lease `{}`)", self.name, binding.lease);
        let caller = self.by.unwrap_or(&Caller::Nobody);
        caller
            .require_owner(Some(principal), &what)
            .map_err(WriteError::Forbidden)
    }

    /// The path of its owner record, there while it is bound to a lease.
    fn owner_record(&self) -> String {
        owner_record_path(self.root, &self.path)
    }

    /// Its writer record's path ([writer]).
    fn writer(&self) -> String {
        writer::record_path(self.root, &self.path)
    }

    /// Waits (a moment at most) until this instance's task for `binding`, removed or replaced
    /// by a write, has seen it and left its lease: the request answers after this instance's
    /// view of the lease stopped listing the key. (Another instance's task sees it as soon as
    /// its watch on the owner record fires.)
    async fn settled(&self, binding: &Binding) {
        settled(self.keys, self.name, binding).await;
    }
}

/// Waits (a moment at most) until this instance's task for `binding` of key `name`, removed or
/// replaced by a write, has seen it and left its lease (see [Key]'s).
pub async fn settled(keys: &BoundKeys, name: &str, binding: &Binding) {
    if let Some(task) = keys.get(name, &binding.handle) {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), task.finished()).await;
    }
}

/// How a write binds the key (docs/PRIMITIVES.md: the rule for rewrites).
#[derive(Clone, Copy)]
pub enum Binds<'a> {
    /// A plain key. Over a key bound to a lease, refused ([WriteError::Bound]) unless
    /// `rebind`, which unbinds it.
    Plain { rebind: bool },
    /// Bound to `lease`. Over a plain key ([WriteError::NotBound]) or one bound to another
    /// lease ([WriteError::Bound]), refused unless `rebind`; over one bound to `lease`, the
    /// value is rewritten and the binding kept.
    Lease { lease: &'a Arc<Lease>, rebind: bool },
}

/// A value, its version, and the lease it is bound to.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub data: Vec<u8>,
    pub stat: Stat,
    /// The lease it is bound to, if it is.
    pub lease: Option<String>,
}

/// Why a write or delete did not happen.
#[derive(Debug)]
pub enum WriteError {
    /// The condition did not hold; the current version, if the key exists.
    Precondition(Option<i64>),
    /// A delete of a key that has keys below it.
    NotEmpty,
    /// A delete of a key that does not exist.
    Missing,
    /// The write would pass this quota.
    Quota(Exceeded),
    /// The key is bound to a lease (this one), and the write does not say `rebind`.
    Bound(Binding),
    /// The key is plain, and a write bound to a lease does not say `rebind`.
    NotBound,
    /// The write's lease ended (or left this instance) first.
    LeaseEnded,
    /// The key is bound to a lease of another principal's, and the write or delete would unbind
    /// it.
    Forbidden(Forbidden),
    /// ZooKeeper's reply was lost and the key no longer tells whether the write applied (see
    /// [after_loss]).
    OutcomeUnknown,
    /// A write that binds the key to a lease, with guards: not served yet (the binding is
    /// written by its lease's task, whose multi-op does not carry guards).
    GuardedBinding,
    ZooKeeper(Failure),
}

impl From<ZkError> for WriteError {
    fn from(err: ZkError) -> WriteError {
        WriteError::ZooKeeper(err.into())
    }
}

impl From<Failure> for WriteError {
    fn from(err: Failure) -> WriteError {
        WriteError::ZooKeeper(err)
    }
}

impl From<ChargeError> for WriteError {
    fn from(err: ChargeError) -> WriteError {
        match err {
            ChargeError::Exceeded(exceeded) => WriteError::Quota(exceeded),
            ChargeError::ZooKeeper(err) => WriteError::ZooKeeper(err),
        }
    }
}

/// Reads `key` and its binding (both requests sent before either answer is awaited: one round
/// trip); `None` if it does not exist.
pub async fn read(session: &Session, key: &Key<'_>) -> Result<Option<Entry>, Failure> {
    let (client, owner) = (session.client(), key.owner_record());
    let (value, binding) = tokio::join!(crate::zk::data(client, &key.path), crate::zk::data(client, &owner));
    let lease = binding?.and_then(|(data, _)| serde_json::from_slice::<Binding>(&data).ok());
    Ok(value?.map(|(data, stat)| Entry {
        data,
        stat,
        lease: lease.map(|binding| binding.lease),
    }))
}

/// Waits until `path` no longer has version `version` (changed or deleted), with a data watch.
pub async fn wait_change(session: &Session, path: &str, version: i64) -> Result<(), Failure> {
    let client = session.client();
    loop {
        match retry_on_loss(|| client.get_and_watch_data(path)).await {
            Ok((_, stat, watcher)) if stat.mzxid == version => {
                watcher.changed().await;
            }
            Ok(_) | Err(ZkError::NoNode) => return Ok(()),
            Err(err) => return Err(err.into()),
        }
    }
}

/// Writes `data` at `key` if `condition` holds, creating the key (and its parents) if it is
/// absent, bound as `binds` says. Returns the key's new `mzxid` and whether it was created.
///
/// The key's charge ([usage]) moves to `payer` in the same multi-op: a write past the payer's
/// quota fails whole, and a key is charged once, to whoever wrote it last.
pub async fn write(
    session: &Session,
    key: &Key<'_>,
    data: &[u8],
    condition: Condition,
    payer: Payer<'_>,
    binds: Binds<'_>,
) -> Result<(i64, bool), WriteError> {
    match binds {
        Binds::Plain { rebind } => write_plain(session, key, data, condition, payer, rebind).await,
        Binds::Lease { lease, rebind } => bound::write(session, key, data, condition, payer, (lease, rebind)).await,
    }
}

/// [write] of a plain key: over a bound key, refused, or with `rebind` unbound in the same
/// multi-op (its owner record and its lease's holding record deleted at the versions read).
async fn write_plain(
    session: &Session,
    key: &Key<'_>,
    data: &[u8],
    condition: Condition,
    payer: Payer<'_>,
    rebind: bool,
) -> Result<(i64, bool), WriteError> {
    let (client, path) = (session.client(), key.path.as_str());
    let mine = charge_of(client, &payer, key, data.len()).await?;
    let options = CreateMode::Persistent.with_acls(crate::zk::acls());
    let mut missing: Vec<String> = Vec::new();
    let mut recheck = Recheck::default();
    // The binding to remove, once a write with `rebind` found one.
    let mut unbind: Option<Unbind> = None;
    // Whether the key's writer record is there, for a guarded write: assumed (a key written
    // under guards is mostly written so again) and learnt from a refusal, so that a guarded
    // write reads nothing more than a write without.
    let mut writer_exists = true;
    loop {
        // The key's stat and its charges: requests sent together, one round trip.
        let (current, charges) = tokio::join!(
            retry_on_loss(|| client.check_stat(path)),
            payer.quotas.charges_of(client, &mine.id)
        );
        let expected = match admits(condition, current?) {
            Ok(expected) => expected,
            Err(refusal) => {
                recheck.confirm(session, refusal).await?;
                continue;
            }
        };
        let charges = charges?;
        let mut multi = Multi::new(client);
        key.add_guards(&mut multi, Op::Guard)?;
        // A new key's missing parents are created in the same multi-op: a watcher sees the
        // key appear with them, never an empty parent first.
        let parents: &[String] = if expected.is_none() { &missing } else { &[] };
        for parent in parents {
            multi.create(Op::Parent, parent, &[], &options)?;
        }
        match &expected {
            None => multi.create(Op::Value, path, data, &options)?,
            Some(stat) => multi.set(Op::Value, path, data, Some(stat.version))?,
        }
        payer
            .quotas
            .add_recharge(&mut multi, Op::Charge, &mine, data.len(), &charges)?;
        add_unbound(&mut multi, key, unbind.as_ref())?;
        if let Some(guards) = key.guards.filter(|guards| !guards.is_empty()) {
            writer::add_written(
                &mut multi,
                Op::Writer,
                &key.writer(),
                &guards.guarded_by(),
                writer_exists,
            )?;
        }
        let failed = match multi.commit().await {
            Ok(done) => {
                let stat = match done.stat(&Op::Value) {
                    Some(stat) => *stat,
                    // Servers that leave a created node's stat out of a multi-op's reply.
                    None => retry_on_loss(|| client.check_stat(path))
                        .await?
                        .ok_or(ZkError::NoNode)?,
                };
                if let Some(unbound) = &unbind {
                    key.settled(&unbound.binding).await;
                }
                return Ok((stat.mzxid, expected.is_none()));
            }
            Err(failed) => failed,
        };
        match after_failed(session, path, data, expected.as_ref(), failed, &payer).await? {
            Again::Decide => {}
            Again::Parents => missing = missing_parents(client, path).await?,
            Again::Written(stat) => return Ok((stat.mzxid, expected.is_none())),
            // Another principal's binding is refused as such (403) before the rule for
            // rewrites is looked at (409, which its own principal may act on).
            Again::Bound => match Unbind::read(client, key).await? {
                Some(found) => {
                    if let Err(forbidden) = key.may_unbind(&found.binding) {
                        recheck.confirm(session, forbidden).await?;
                        continue;
                    }
                    if !rebind {
                        return Err(WriteError::Bound(found.binding));
                    }
                    unbind = Some(found);
                }
                None => unbind = None,
            },
            Again::Unbound => unbind = None,
            Again::Writer(ZkError::NodeExists) => writer_exists = true,
            Again::Writer(ZkError::NoNode) if writer_exists => writer_exists = false,
            Again::Writer(ZkError::NoNode) => writer::ensure_dir(client, key.root).await?,
            Again::Writer(err) => return Err(err.into()),
            Again::UnboundRecord => {
                if let Some(was) = unbind.take() {
                    unbind = was.again(client, key).await?;
                }
            }
        }
    }
}

/// A binding a write or a delete removes: its owner record at the version read, and its
/// lease's holding record while it is there.
struct Unbind {
    binding: Binding,
    version: i32,
    record: bool,
}

impl Unbind {
    /// The binding of `key` now, to remove; `None` if it is plain.
    async fn read(client: &Client, key: &Key<'_>) -> Result<Option<Unbind>, ZkError> {
        Ok(bound::binding(client, key.root, &key.path)
            .await?
            .map(|(binding, version)| Unbind {
                binding,
                version,
                record: true,
            }))
    }

    /// After its multi-op was refused at the holding record (`NoNode`): what to remove now. The
    /// same binding without its holding record (gone before it, as an interrupted clean-up
    /// leaves it), or the binding read again.
    async fn again(self, client: &Client, key: &Key<'_>) -> Result<Option<Unbind>, ZkError> {
        let now = Unbind::read(client, key).await?;
        Ok(match now {
            Some(now) if now.version == self.version && now.binding == self.binding => {
                Some(Unbind { record: false, ..now })
            }
            now => now,
        })
    }
}

/// The charge of a value of `bytes` at `key` to `payer` (checked against the quota here when the
/// servers do not enforce it).
async fn charge_of(
    client: &Client,
    payer: &Payer<'_>,
    key: &Key<'_>,
    bytes: usize,
) -> Result<usage::Charge, WriteError> {
    let id = usage::path_id("kv", &key.path);
    Ok(payer.quotas.charge_as(client, payer.principal, bytes, id).await?)
}

/// Adds to a kv write's multi-op what keeps it off a bound key: with nothing to `unbind`, the
/// create and delete of the key's owner record (refused while it is bound); with a binding, the
/// delete of its owner record at the version read and of its lease's holding record (the
/// lease's task for it, watching the owner record, ends without deleting anything).
fn add_unbound(multi: &mut Multi<'_, Op>, key: &Key<'_>, unbind: Option<&Unbind>) -> Result<(), ZkError> {
    let owner = key.owner_record();
    match unbind {
        None => {
            let options = CreateMode::Persistent.with_acls(crate::zk::acls());
            multi.create(Op::Unbound, &owner, &[], &options)?;
            multi.delete(Op::Unbound, &owner, None)
        }
        Some(unbind) => {
            multi.delete(Op::Binding, &owner, Some(unbind.version))?;
            if unbind.record {
                let record = unbind.binding.holding_record(key.root, key.name);
                multi.delete(Op::BindingRecord, &record, None)?;
            }
            Ok(())
        }
    }
}

/// What a write's failed multi-op leaves to do.
enum Again {
    /// Decide again against what is there now.
    Decide,
    /// A parent was created or deleted meanwhile: find the missing ones, then decide again.
    Parents,
    /// The reply was lost but the write happened: this is the key's stat.
    Written(Stat),
    /// The key is bound to a lease.
    Bound,
    /// The binding it was to remove changed meanwhile: decide again.
    Unbound,
    /// The holding record of the binding it was to remove is gone.
    UnboundRecord,
    /// The writer record's write was refused so: it is there after all (`NodeExists`), or
    /// not (`NoNode`: or its directory is missing).
    Writer(ZkError),
}

/// What to do after the multi-op writing `data` at `path` (replacing `expected`, or creating
/// the key) failed with `failed`.
async fn after_failed(
    session: &Session,
    path: &str,
    data: &[u8],
    expected: Option<&Stat>,
    failed: Failed<Op>,
    payer: &Payer<'_>,
) -> Result<Again, WriteError> {
    match failed {
        Failed::Refused { tag: Op::Guard, .. } => Err(WriteError::ZooKeeper(Failure::Unguarded)),
        Failed::Refused {
            error: ZkError::QuotaExceeded,
            ..
        } => Err(WriteError::Quota(payer.exceeded(session, data.len()).await)),
        Failed::Refused { tag: Op::Parent, .. } => Ok(Again::Parents),
        Failed::Refused {
            tag: Op::Unbound,
            error: ZkError::NodeExists,
        } => Ok(Again::Bound),
        Failed::Refused {
            tag: Op::Binding,
            error: ZkError::NoNode | ZkError::BadVersion,
        } => Ok(Again::Unbound),
        Failed::Refused {
            tag: Op::BindingRecord,
            error: ZkError::NoNode,
        } => Ok(Again::UnboundRecord),
        Failed::Refused { tag: Op::Value, error } => match (expected, error) {
            (None, ZkError::NoNode) => Ok(Again::Parents),
            // Someone created it meanwhile: decide again against what is there now.
            (None, ZkError::NodeExists) => Ok(Again::Decide),
            // Changed (or deleted) since the stat was read: an unconditional write tries
            // again; a conditional one decides again, and loses.
            (Some(_), ZkError::BadVersion | ZkError::NoNode) => Ok(Again::Decide),
            (_, err) => Err(err.into()),
        },
        Failed::Refused { tag: Op::Writer, error } => Ok(Again::Writer(error)),
        // A charge changed meanwhile (a write of the same key on another instance): decide
        // again.
        Failed::Refused {
            tag: Op::Charge,
            error: ZkError::NoNode | ZkError::NodeExists | ZkError::BadVersion,
        } => Ok(Again::Decide),
        // The reply was lost: the multi-op happened whole or not at all.
        failed if failed.is_loss() => match after_loss(session, path, data, expected).await? {
            LostReply::Applied(stat) => Ok(Again::Written(stat)),
            LostReply::NotApplied => Ok(Again::Decide),
            LostReply::Unknown => Err(WriteError::OutcomeUnknown),
        },
        failed => Err(failed.error().into()),
    }
}

/// The stat a write under `condition` expects to replace (`None`: it creates the key), given
/// the key's `current` stat; the refusal if the condition does not hold.
fn admits(condition: Condition, current: Option<Stat>) -> Result<Option<Stat>, WriteError> {
    match (condition, current) {
        (Condition::Absent, Some(stat)) => Err(WriteError::Precondition(Some(stat.mzxid))),
        (Condition::Version(_) | Condition::Exists, None) => Err(WriteError::Precondition(None)),
        (Condition::Version(v), Some(stat)) if stat.mzxid != v => Err(WriteError::Precondition(Some(stat.mzxid))),
        (_, current) => Ok(current),
    }
}

/// What an operation of a kv write's multi-op is for.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Op {
    /// A check of the writer's guards.
    Guard,
    /// A missing parent of a new key.
    Parent,
    /// The key's own node.
    Value,
    /// A charge created, resized or refunded.
    Charge,
    /// The create and delete of the key's owner record: refused while the key is bound.
    Unbound,
    /// The delete of a bound key's owner record.
    Binding,
    /// The delete of its lease's holding record.
    BindingRecord,
    /// The key's writer record ([writer]) written or deleted.
    Writer,
}

/// The ancestors of `path` that do not exist, the highest first.
pub(super) async fn missing_parents(client: &Client, path: &str) -> Result<Vec<String>, ZkError> {
    let mut missing = Vec::new();
    let mut at = path;
    while let Some(end) = at.rfind('/').filter(|&end| end > 0) {
        at = &at[..end];
        if retry_on_loss(|| client.check_stat(at)).await?.is_some() {
            break;
        }
        missing.push(at.to_string());
    }
    missing.reverse();
    Ok(missing)
}

/// Deletes `key` if `condition` holds, refunding its charge in the same multi-op. A key bound
/// to a lease is deleted with its binding (its owner record and its lease's holding record):
/// any caller the grants allow may delete a key, bound or not.
pub async fn delete(session: &Session, key: &Key<'_>, condition: Condition, quotas: &Quotas) -> Result<(), WriteError> {
    let (client, path) = (session.client(), key.path.as_str());
    let id = usage::path_id("kv", path);
    let mut retried = false;
    let mut recheck = Recheck::default();
    let mut unbind: Option<Unbind> = None;
    loop {
        let Some(stat) = retry_on_loss(|| client.check_stat(path)).await? else {
            // After a lost reply, a missing key may be this delete's doing or another's (see
            // [after_loss]).
            if retried {
                return Err(WriteError::OutcomeUnknown);
            }
            recheck.confirm(session, WriteError::Missing).await?;
            continue;
        };
        if let Condition::Version(v) = condition
            && stat.mzxid != v
        {
            recheck
                .confirm(session, WriteError::Precondition(Some(stat.mzxid)))
                .await?;
            continue;
        }
        // Its charges and its writer record's stat: one round trip.
        let record = key.writer();
        let (charges, written) = tokio::join!(
            quotas.charges_of(client, &id),
            retry_on_loss(|| client.check_stat(&record))
        );
        let charges = charges?;
        let mut multi = Multi::new(client);
        key.add_guards(&mut multi, Op::Guard)?;
        multi.delete(Op::Value, path, Some(stat.version))?;
        if written?.is_some() {
            multi.delete(Op::Writer, &record, None)?;
        }
        quotas.add_refunds(&mut multi, Op::Charge, &charges)?;
        add_unbound(&mut multi, key, unbind.as_ref())?;
        match multi.commit().await {
            Ok(_) => {
                if let Some(unbound) = &unbind {
                    key.settled(&unbound.binding).await;
                }
                return Ok(());
            }
            Err(Failed::Refused { tag: Op::Guard, .. }) => return Err(WriteError::ZooKeeper(Failure::Unguarded)),
            Err(Failed::Refused { tag: Op::Value, error }) => match error {
                ZkError::NotEmpty => return Err(WriteError::NotEmpty),
                // Changed or deleted since the stat: decide again (a conditional delete loses).
                ZkError::NoNode | ZkError::BadVersion => {}
                err => return Err(err.into()),
            },
            // Bound: deleted with its binding, by its principal.
            Err(Failed::Refused {
                tag: Op::Unbound,
                error: ZkError::NodeExists,
            }) => {
                unbind = Unbind::read(client, key).await?;
                if let Some(forbidden) = unbind.as_ref().and_then(|found| key.may_unbind(&found.binding).err()) {
                    recheck.confirm(session, forbidden).await?;
                    unbind = None;
                }
            }
            Err(Failed::Refused {
                tag: Op::BindingRecord,
                error: ZkError::NoNode,
            }) => {
                if let Some(was) = unbind.take() {
                    unbind = was.again(client, key).await?;
                }
            }
            // The binding, a charge or the writer record changed meanwhile: decide again.
            Err(Failed::Refused {
                tag: Op::Binding | Op::Charge | Op::Writer,
                error: ZkError::NoNode | ZkError::BadVersion,
            }) => unbind = None,
            Err(failed) if failed.is_loss() => retried = true,
            Err(failed) => return Err(failed.error().into()),
        }
    }
}

/// The keys directly under `path`, sorted; `None` if `path` does not exist.
pub async fn children(session: &Session, path: &str) -> Result<Option<Vec<String>>, Failure> {
    let client = session.client();
    match retry_on_loss(|| client.list_children(path)).await {
        Ok(mut keys) => {
            keys.sort();
            Ok(Some(keys))
        }
        Err(ZkError::NoNode) => Ok(None),
        Err(err) => Err(err.into()),
    }
}

/// Key `name` read at `consistency`, after waiting (up to the wait, capped) for it to change
/// from the version `known` names; `None` if there is no such key.
pub async fn get(
    recipes: &crate::recipes::Recipes,
    name: &str,
    known: Option<(i64, std::time::Duration)>,
    consistency: crate::recipes::consistency::Consistency,
) -> Result<Option<Entry>, ApiError> {
    let session = recipes.reader(consistency).await?;
    let key = Key::new(&recipes.kv_keys, name);
    if let Some((version, wait)) = known {
        crate::admission::park();
        let _ = tokio::time::timeout(recipes.wait(Some(wait)), wait_change(&session, &key.path, version)).await;
    }
    Ok(read(&session, &key).await?)
}

/// Writes `value` to key `name` if `condition` holds, plain or bound to the lease `bind`
/// names (`rebind` allows changing which): its version (mzxid), whether it was created, and the
/// lease it is bound to.
pub async fn put(
    recipes: &crate::recipes::Recipes,
    (caller, guards): (&Caller, &[Guard]),
    name: &str,
    value: &[u8],
    condition: Condition,
    (bind, rebind): (Option<&str>, bool),
) -> Result<(i64, bool, Option<Arc<Lease>>), ApiError> {
    let lease = match bind {
        Some(id) => Some(recipes.leases.serve(caller, id).await?),
        None => None,
    };
    let session = recipes.zk().connected().await?;
    let payer = Payer {
        quotas: &recipes.quotas,
        principal: caller.name(),
    };
    let binds = match &lease {
        Some(lease) => Binds::Lease { lease, rebind },
        None => Binds::Plain { rebind },
    };
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    let key = Key::written_by(&recipes.kv_keys, name, caller).guarded_by(guards);
    let written = retry_guarded!(
        guards,
        recipes,
        Err(WriteError::ZooKeeper(Failure::Unguarded)),
        write(&session, &key, value, condition, payer, binds).await
    );
    match (written, &lease) {
        (Err(WriteError::LeaseEnded), Some(lease)) => Err(recipes.leases.gone(lease)),
        (written, _) => {
            let (mzxid, created) = written.map_err(|e| write_error(name, e))?;
            Ok((mzxid, created, lease))
        }
    }
}

/// Deletes key `name` if `condition` holds (and it has no keys below it).
pub async fn remove(
    recipes: &crate::recipes::Recipes,
    (caller, guards): (&Caller, &[Guard]),
    name: &str,
    condition: Condition,
) -> Result<(), ApiError> {
    let session = recipes.zk().connected().await?;
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    let key = Key::written_by(&recipes.kv_keys, name, caller).guarded_by(guards);
    let deleted = retry_guarded!(
        guards,
        recipes,
        Err(WriteError::ZooKeeper(Failure::Unguarded)),
        delete(&session, &key, condition, &recipes.quotas).await
    );
    deleted.map_err(|e| write_error(name, e))
}

/// The keys directly under `prefix` (its znode `path`; the top level when empty) that `caller`
/// may read, read at `consistency`; `None` if there is no such prefix.
pub async fn list(
    recipes: &crate::recipes::Recipes,
    caller: &Caller,
    (prefix, path): (&str, &str),
    consistency: crate::recipes::consistency::Consistency,
) -> Result<Option<Vec<String>>, ApiError> {
    let session = recipes.reader(consistency).await?;
    let readable = |key: &String| {
        let full = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}/{key}")
        };
        caller.may("kv", &full, crate::auth::Access::Read)
    };
    Ok(match children(&session, path).await? {
        Some(keys) => Some(keys.into_iter().filter(readable).collect()),
        None if prefix.is_empty() => Some(Vec::new()),
        None => None,
    })
}

/// A key's version as the API shows it: an ETag (`"<mzxid>"`).
pub fn etag(mzxid: i64) -> String {
    format!("\"{mzxid}\"")
}

/// 412 `precondition-failed`: `what` (a key, a counter) is not at the version the request
/// requires: it is at `current`, or does not exist.
pub fn precondition_failed(what: &str, current: Option<i64>) -> ApiError {
    let Some(version) = current else {
        return ApiError::new(Problem::PreconditionFailed, format!("{what} does not exist"));
    };
    let detail = format!("{what} is at version {}, not the one required", etag(version));
    ApiError::new(Problem::PreconditionFailed, detail).with("current_etag", etag(version))
}

fn write_error(key: &str, err: WriteError) -> ApiError {
    match err {
        WriteError::Precondition(current) => precondition_failed(&format!("key `{key}`"), current),
        WriteError::Missing => ApiError::not_found("key", format!("no key `{key}`")),
        WriteError::NotEmpty => ApiError::new(
            Problem::KeyNotEmpty,
            format!("key `{key}` has keys below it; delete those first"),
        ),
        WriteError::Quota(exceeded) => ApiError::from(exceeded),
        WriteError::Bound(binding) => {
            let detail = format!(
                "key `{key}` is bound to lease `{}`; write it with that lease, or say `rebind=true`",
                binding.lease
            );
            ApiError::new(Problem::KeyBound, detail).with("lease", binding.lease)
        }
        WriteError::NotBound => ApiError::new(
            Problem::KeyNotBound,
            format!("key `{key}` exists bound to no lease; say `rebind=true` to bind it"),
        ),
        WriteError::LeaseEnded => ApiError::new(Problem::LeaseEnded, "the lease ended while the key was written"),
        WriteError::Forbidden(forbidden) => ApiError::new(Problem::Forbidden, forbidden.0),
        WriteError::OutcomeUnknown => ApiError::new(
            Problem::OutcomeUnknown,
            format!(
                "the connection to ZooKeeper was lost after the write to key `{key}` was sent, and the key \
                 changed since: the write may or may not have happened; read the key before trying again"
            ),
        ),
        WriteError::GuardedBinding => ApiError::invalid(
            Place::Header,
            "ZKGATE-Guard",
            "a write that binds a key to a lease (`?lease=`) cannot be guarded yet; guard a plain write",
        ),
        WriteError::ZooKeeper(err) => err.into(),
    }
}

/// Most segments a kv key may have.
const MAX_KEY_DEPTH: usize = 16;

/// Checks a kv key (`a/b/c`): at most 16 segments, each a valid name.
pub fn check_key(key: &str) -> Result<(), ApiError> {
    key_problem(key).map_err(|detail| ApiError::invalid(Place::Path, "key", detail))
}

/// What is wrong with a kv key, if anything (the text of [check_key]'s refusal).
pub fn key_problem(key: &str) -> Result<(), String> {
    let segments: Vec<&str> = key.split('/').collect();
    if segments.len() > MAX_KEY_DEPTH {
        return Err(format!(
            "must have at most {MAX_KEY_DEPTH} segments ({} given)",
            segments.len()
        ));
    }
    for segment in segments {
        validate_name(segment).map_err(|e| format!("segment `{segment}` {e}"))?;
    }
    Ok(())
}
