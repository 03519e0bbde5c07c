//! Configuration and name service, the guide's "out of the box" recipe: plain persistent
//! znodes under `<root>/kv/`, read and written whole, with compare-and-set on their version.
//!
//! The version a client sees is the znode's `mzxid` (the zxid of its last change), not its
//! data version: data versions start again at 0 when a key is deleted and created again, so a
//! compare-and-set on them could succeed against a value the client never saw (ABA). A write
//! conditional on an mzxid reads the stat, compares the mzxid, and writes with the data
//! version it read, so a change in between still fails the write.

use zookeeper_client::{Client, CreateMode, Error as ZkError, Stat};

use crate::zk::retry_on_loss;

/// A value and its version.
#[derive(Debug, Clone)]
pub struct Entry {
    pub data: Vec<u8>,
    pub stat: Stat,
}

/// What a conditional write or delete requires of the current value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// Whatever is there (or nothing).
    Any,
    /// The key must not exist (create only).
    Absent,
    /// The key must exist, whatever its version.
    Exists,
    /// The key must exist with this version (its mzxid).
    Version(i64),
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
    ZooKeeper(ZkError),
}

impl From<ZkError> for WriteError {
    fn from(err: ZkError) -> WriteError {
        WriteError::ZooKeeper(err)
    }
}

/// Reads `path`; `None` if it does not exist.
pub async fn read(client: &Client, path: &str) -> Result<Option<Entry>, ZkError> {
    match retry_on_loss(|| client.get_data(path)).await {
        Ok((data, stat)) => Ok(Some(Entry { data, stat })),
        Err(ZkError::NoNode) => Ok(None),
        Err(err) => Err(err),
    }
}

/// Waits until `path` no longer has version `version` (changed or deleted), with a data watch.
pub async fn wait_change(client: &Client, path: &str, version: i64) -> Result<(), ZkError> {
    loop {
        match retry_on_loss(|| client.get_and_watch_data(path)).await {
            Ok((_, stat, watcher)) if stat.mzxid == version => {
                watcher.changed().await;
            }
            Ok(_) | Err(ZkError::NoNode) => return Ok(()),
            Err(err) => return Err(err),
        }
    }
}

/// Writes `data` at `path` if `condition` holds, creating the key (and its parents) if it is
/// absent. Returns the new stat and whether the key was created.
pub async fn write(client: &Client, path: &str, data: &[u8], condition: Condition) -> Result<(Stat, bool), WriteError> {
    loop {
        let current = retry_on_loss(|| client.check_stat(path)).await?;
        let expected = match (condition, current) {
            (Condition::Absent, Some(stat)) => return Err(WriteError::Precondition(Some(stat.mzxid))),
            (Condition::Version(_) | Condition::Exists, None) => return Err(WriteError::Precondition(None)),
            (Condition::Version(v), Some(stat)) if stat.mzxid != v => {
                return Err(WriteError::Precondition(Some(stat.mzxid)));
            }
            (_, current) => current,
        };
        let Some(stat) = expected else {
            match create(client, path, data).await {
                Ok(stat) => return Ok((stat, true)),
                // Someone created it meanwhile: decide again against what is there now.
                Err(ZkError::NodeExists) => continue,
                Err(err) => return Err(err.into()),
            }
        };
        match client.set_data(path, data, Some(stat.version)).await {
            Ok(stat) => return Ok((stat, false)),
            // Changed (or deleted) since the stat was read: an unconditional write tries
            // again; a conditional one has lost.
            Err(ZkError::BadVersion | ZkError::NoNode) if condition == Condition::Any => continue,
            Err(ZkError::BadVersion | ZkError::NoNode) => {
                let now = retry_on_loss(|| client.check_stat(path)).await?;
                return Err(WriteError::Precondition(now.map(|s| s.mzxid)));
            }
            // The reply was lost: the write may have happened; read again and report what is
            // there if it is our data, else try again.
            Err(err) if crate::zk::is_loss(&err) => {
                if let Some(entry) = read(client, path).await?
                    && entry.data == data
                    && entry.stat.version == stat.version + 1
                {
                    return Ok((entry.stat, false));
                }
                if condition != Condition::Any {
                    let now = retry_on_loss(|| client.check_stat(path)).await?;
                    return Err(WriteError::Precondition(now.map(|s| s.mzxid)));
                }
            }
            Err(err) => return Err(err.into()),
        }
    }
}

async fn create(client: &Client, path: &str, data: &[u8]) -> Result<Stat, ZkError> {
    let options = CreateMode::Persistent.with_acls(crate::zk::acls());
    loop {
        match client.create(path, data, &options).await {
            Ok((stat, _)) => return Ok(stat),
            Err(ZkError::NoNode) => {
                let parent = &path[..path.rfind('/').unwrap_or(0)];
                crate::zk::session::ensure_path(client, parent).await?;
            }
            Err(err) if crate::zk::is_loss(&err) => {
                // Did the create happen? Ours if the data matches and nobody changed it since.
                if let Some(entry) = read(client, path).await?
                    && entry.data == data
                    && entry.stat.version == 0
                {
                    return Ok(entry.stat);
                }
                if retry_on_loss(|| client.check_stat(path)).await?.is_some() {
                    return Err(ZkError::NodeExists);
                }
            }
            Err(err) => return Err(err),
        }
    }
}

/// Deletes `path` if `condition` holds.
pub async fn delete(client: &Client, path: &str, condition: Condition) -> Result<(), WriteError> {
    let Some(stat) = retry_on_loss(|| client.check_stat(path)).await? else {
        return Err(WriteError::Missing);
    };
    if let Condition::Version(v) = condition
        && stat.mzxid != v
    {
        return Err(WriteError::Precondition(Some(stat.mzxid)));
    }
    let mut retried = false;
    loop {
        match client.delete(path, Some(stat.version)).await {
            Ok(()) => return Ok(()),
            Err(ZkError::NotEmpty) => return Err(WriteError::NotEmpty),
            // After a lost reply, a missing node is our own deletion.
            Err(ZkError::NoNode) if retried => return Ok(()),
            Err(ZkError::NoNode) => return Err(WriteError::Missing),
            Err(ZkError::BadVersion) => {
                let now = retry_on_loss(|| client.check_stat(path)).await?;
                return Err(WriteError::Precondition(now.map(|s| s.mzxid)));
            }
            Err(err) if crate::zk::is_loss(&err) => retried = true,
            Err(err) => return Err(err.into()),
        }
    }
}

/// The keys directly under `path`, sorted; `None` if `path` does not exist.
pub async fn children(client: &Client, path: &str) -> Result<Option<Vec<String>>, ZkError> {
    match retry_on_loss(|| client.list_children(path)).await {
        Ok(mut keys) => {
            keys.sort();
            Ok(Some(keys))
        }
        Err(ZkError::NoNode) => Ok(None),
        Err(err) => Err(err),
    }
}
