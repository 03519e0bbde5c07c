//! Configuration and name service, the guide's "out of the box" recipe: plain persistent
//! znodes under `<root>/kv/`, read and written whole, with compare-and-set on their version.
//!
//! The version a client sees is the znode's `mzxid` (the zxid of its last change), not its
//! data version: data versions start again at 0 when a key is deleted and created again, so a
//! compare-and-set on them could succeed against a value the client never saw (ABA). A write
//! conditional on an mzxid reads the stat, compares the mzxid, and writes with the data
//! version it read, so a change in between still fails the write.

use super::condition::{Condition, Recheck};
use crate::zk::{Failed, Multi};
use crate::zk::{Failure, Session};
use zookeeper_client::{Client, CreateMode, Error as ZkError, Stat};

use super::usage::{self, ChargeError, Exceeded, Payer, Quotas};
use crate::zk::retry_on_loss;

/// A value and its version.
#[derive(Debug, Clone)]
pub struct Entry {
    pub data: Vec<u8>,
    pub stat: Stat,
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

/// Reads `path`; `None` if it does not exist.
pub async fn read(session: &Session, path: &str) -> Result<Option<Entry>, Failure> {
    let client = session.client();
    Ok(crate::zk::data(client, path)
        .await?
        .map(|(data, stat)| Entry { data, stat }))
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

/// Writes `data` at `path` if `condition` holds, creating the key (and its parents) if it is
/// absent. Returns the new stat and whether the key was created.
///
/// The key's charge ([usage]) moves to `payer` in the same multi-op: a write past the payer's
/// quota fails whole, and a key is charged once, to whoever wrote it last.
pub async fn write(
    session: &Session,
    path: &str,
    data: &[u8],
    condition: Condition,
    payer: Payer<'_>,
) -> Result<(Stat, bool), WriteError> {
    let client = session.client();
    let mine = payer
        .quotas
        .charge_as(client, payer.principal, data.len(), usage::path_id("kv", path))
        .await?;
    let options = CreateMode::Persistent.with_acls(crate::zk::acls());
    let mut missing: Vec<String> = Vec::new();
    let mut recheck = Recheck::default();
    loop {
        let current = retry_on_loss(|| client.check_stat(path)).await?;
        let expected = match admits(condition, current) {
            Ok(expected) => expected,
            Err(refusal) => {
                recheck.confirm(session, refusal).await?;
                continue;
            }
        };
        let charges = payer.quotas.charges_of(client, &mine.id).await?;
        let mut multi = Multi::new(client);
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
        let failed = match multi.commit().await {
            Ok(done) => {
                let stat = match done.stat(&Op::Value) {
                    Some(stat) => *stat,
                    // Servers that leave a created node's stat out of a multi-op's reply.
                    None => retry_on_loss(|| client.check_stat(path))
                        .await?
                        .ok_or(ZkError::NoNode)?,
                };
                return Ok((stat, expected.is_none()));
            }
            Err(failed) => failed,
        };
        match after_failed(session, path, data, expected.as_ref(), failed, &payer).await? {
            Again::Decide => {}
            Again::Parents => missing = missing_parents(client, path).await?,
            Again::Written(stat) => return Ok((stat, expected.is_none())),
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
        Failed::Refused {
            error: ZkError::QuotaExceeded,
            ..
        } => Err(WriteError::Quota(payer.exceeded(session, data.len()).await)),
        Failed::Refused { tag: Op::Parent, .. } => Ok(Again::Parents),
        Failed::Refused { tag: Op::Value, error } => match (expected, error) {
            (None, ZkError::NoNode) => Ok(Again::Parents),
            // Someone created it meanwhile: decide again against what is there now.
            (None, ZkError::NodeExists) => Ok(Again::Decide),
            // Changed (or deleted) since the stat was read: an unconditional write tries
            // again; a conditional one decides again, and loses.
            (Some(_), ZkError::BadVersion | ZkError::NoNode) => Ok(Again::Decide),
            (_, err) => Err(err.into()),
        },
        // A charge changed meanwhile (a write of the same key on another instance): decide
        // again.
        Failed::Refused {
            tag: Op::Charge,
            error: ZkError::NoNode | ZkError::NodeExists | ZkError::BadVersion,
        } => Ok(Again::Decide),
        // The reply was lost: the multi-op happened whole or not at all. Ours if the key holds
        // our data at the version it would have; otherwise decide again.
        failed if failed.is_loss() => {
            let version = expected.map_or(0, |stat| stat.version + 1);
            Ok(holds(session, path, data, version)
                .await?
                .map_or(Again::Decide, Again::Written))
        }
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

/// The key's stat if it holds `data` at `version` (a write whose reply was lost applied).
async fn holds(session: &Session, path: &str, data: &[u8], version: i32) -> Result<Option<Stat>, Failure> {
    Ok(read(session, path)
        .await?
        .filter(|entry| entry.data == data && entry.stat.version == version)
        .map(|entry| entry.stat))
}

/// What an operation of a kv write's multi-op is for.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Op {
    /// A missing parent of a new key.
    Parent,
    /// The key's own node.
    Value,
    /// A charge created, resized or refunded.
    Charge,
}

/// The ancestors of `path` that do not exist, the highest first.
async fn missing_parents(client: &Client, path: &str) -> Result<Vec<String>, ZkError> {
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

/// Deletes `path` if `condition` holds, refunding its charge in the same multi-op.
pub async fn delete(session: &Session, path: &str, condition: Condition, quotas: &Quotas) -> Result<(), WriteError> {
    let client = session.client();
    let id = usage::path_id("kv", path);
    let mut retried = false;
    let mut recheck = Recheck::default();
    loop {
        let Some(stat) = retry_on_loss(|| client.check_stat(path)).await? else {
            // After a lost reply, a missing node is our own deletion.
            if retried {
                return Ok(());
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
        let charges = quotas.charges_of(client, &id).await?;
        let mut multi = Multi::new(client);
        multi.delete(Op::Value, path, Some(stat.version))?;
        quotas.add_refunds(&mut multi, Op::Charge, &charges)?;
        match multi.commit().await {
            Ok(_) => return Ok(()),
            Err(Failed::Refused { tag: Op::Value, error }) => match error {
                ZkError::NotEmpty => return Err(WriteError::NotEmpty),
                // Changed or deleted since the stat: decide again (a conditional delete loses).
                ZkError::NoNode | ZkError::BadVersion => {}
                err => return Err(err.into()),
            },
            // A charge changed meanwhile: decide again.
            Err(Failed::Refused {
                error: ZkError::NoNode | ZkError::BadVersion,
                ..
            }) => {}
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
