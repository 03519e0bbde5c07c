//! Which holder wrote a key: a guarded write ([crate::recipes::guards]) leaves, in the same
//! multi-op, the key's *writer record* (`<root>/writers/w-<hash of the key's path>`) naming the
//! holdings it was made under (`lock/orders` and the holder's fencing token). A key's topic
//! (`znode:data:kv/<key>`) shows them as `guarded_by`.
//!
//! The record belongs to one write: a multi-op gives all its writes one zxid, so the record's
//! `mzxid` equals the key's exactly while the key is as that guarded write left it. A later
//! write without a guard does not touch the record and so need not read it (no cost to
//! unguarded writes); the record's older `mzxid` then says it is not the key's writer. A
//! delete of the key deletes the record with it (its stat read with the delete's charges, in the
//! same round trip), so at most one record stays per key that exists. (A key that was written
//! guarded, then bound to a lease by a write with `rebind`, and deleted by that lease's end
//! leaves its record behind: one small znode, never read again.)

use zookeeper_client::{Client, CreateMode, Error as ZkError};

use crate::recipes::guards::GuardedBy;
use crate::zk::Multi;

/// The directory of writer records under zkgate's root.
pub const WRITERS: &str = "writers";

/// The writer record of the kv znode at `path`.
pub fn record_path(root: &str, path: &str) -> String {
    format!("{root}/{WRITERS}/{}", crate::recipes::usage::path_id("w", path))
}

/// Makes the directory of writer records, after a create of one was refused for want of it.
pub async fn ensure_dir(client: &Client, root: &str) -> Result<(), ZkError> {
    crate::zk::session::ensure_path(client, &format!("{root}/{WRITERS}")).await
}

/// Adds to `multi` the writer record of a guarded write under `by`: replaced if it `exists`
/// (as read, or as a refusal taught the writer), else created. A refusal (`NodeExists`, `NoNode`) means another
/// write made or removed it meanwhile (or, `NoNode` of a create, that the directory is missing:
/// [ensure_dir]): decide again.
pub fn add_written<T: Clone>(
    multi: &mut Multi<'_, T>,
    tag: T,
    record: &str,
    by: &[GuardedBy],
    exists: bool,
) -> Result<(), ZkError> {
    let data = serde_json::to_vec(by).unwrap_or_default();
    if exists {
        multi.set(tag, record, &data, None)
    } else {
        let options = CreateMode::Persistent.with_acls(crate::zk::acls());
        multi.create(tag, record, &data, &options)
    }
}

/// The holdings the key at `path` (its `mzxid` now, `None`: absent) was last written under, if
/// its last write was guarded.
pub async fn guarded_by(
    client: &Client,
    root: &str,
    path: &str,
    mzxid: Option<i64>,
) -> Result<Option<Vec<GuardedBy>>, ZkError> {
    let Some(mzxid) = mzxid else {
        return Ok(None);
    };
    let found = crate::zk::data(client, &record_path(root, path)).await;
    Ok(match found? {
        Some((data, stat)) if stat.mzxid == mzxid => serde_json::from_slice(&data).ok(),
        _ => None,
    })
}
