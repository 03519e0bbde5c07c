//! The znodes of leases: the record of each lease, the holding records of what it holds, and each
//! instance's keeper node.
//!
//! ```text
//! <root>/leases/<id>                 the record: TTL, principal, created, keeper (JSON)
//! <root>/leases/<id>/<holding record>     one per holding: what it is and where (JSON)
//! <root>/keepers/<instance>          touched by its instance every second: its last sign of life
//! <root>/keepers/<instance>/<id>     a notice: lease <id> was taken over from it
//! ```
//!
//! The keeper nodes' reads and writes are in [super::keepers].
//!
//! **Who keeps a lease.** The record names its keeper, and only a write conditional on the
//! record's version changes that ([take_over]), so two instances never both keep one: each
//! write an instance makes for a lease checks the version it keeps it at
//! ([super::Lease::guard]). A takeover also leaves a notice under the former keeper's node, in
//! the same multi-op, which that instance watches; it learns of the takeover before the reply
//! to any later write of its own (ZooKeeper sends a session its watch events in order with its
//! replies), which is what lets it stop acknowledging keepalives for a lease the moment it
//! cannot know it still keeps it (see [crate::recipes::leases]).
//!
//! **An end is a write too.** The keeper ends a lease by writing the reason into the record
//! (conditional on its version, so a keeper that lost the lease cannot end it), then its
//! holdings delete their znodes and holding records; the record stays a while as a *tombstone* so
//! that any instance answers "ended, and why" (HTTP 410) rather than "never heard of it".

use crate::recipes::idempotency::{KeyError, Keyed};
use crate::zk::{Failed, Multi};
use serde::{Deserialize, Serialize};
use zookeeper_client::{Client, CreateMode, Error as ZkError, OneshotWatcher, Stat};

mod holding;
use crate::zk::retry_on_loss;
pub use holding::{HoldingRecord, Shape, holding, holdings, legacy_record_name, record_name, redrive, write_if_naming};

/// Why a lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// Its owner deleted it.
    Deleted,
    /// No keepalive arrived within its TTL.
    Expired,
}

impl EndReason {
    /// The reason as it is serialised (`deleted`, `expired`).
    pub fn label(self) -> &'static str {
        match self {
            EndReason::Deleted => "deleted",
            EndReason::Expired => "expired",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            EndReason::Deleted => "the lease was deleted",
            EndReason::Expired => "the lease expired: no keepalive arrived within its TTL",
        }
    }
}

/// The directory of the lease records under the root.
pub const LEASES: &str = "leases";
/// The directory of owner records under the root (see [super::node]).
pub const OWNER_RECORDS: &str = "bindings";
/// The directory of the keeper nodes under the root.
pub const KEEPERS: &str = "keepers";

/// `<root>/leases`.
pub fn leases_dir(root: &str) -> String {
    format!("{root}/{LEASES}")
}

/// `<root>/leases/<id>`.
pub fn path(root: &str, id: &str) -> String {
    format!("{root}/{LEASES}/{id}")
}

/// `<root>/keepers/<instance>`.
pub fn keeper_path(root: &str, instance: &str) -> String {
    format!("{root}/{KEEPERS}/{instance}")
}

/// What a lease's record holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    pub ttl_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_ttl_ms: Option<u64>,
    /// Its owner (`None` when auth is off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// When it was made, ms since the Unix epoch.
    pub created_ms: i64,
    /// The instance that keeps it (times its TTL) now.
    pub keeper: String,
    /// Why it ended, once it has: the record is then a tombstone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<EndReason>,
    /// When it ended, ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<i64>,
    /// Its lock-delay, if it asked for one: how long what it held as a lock stays held after it
    /// expired (docs/PRIMITIVES.md, part 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_delay_ms: Option<u64>,
}

impl LeaseRecord {
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn parse(data: &[u8]) -> Option<LeaseRecord> {
        serde_json::from_slice(data).ok()
    }
}

/// A record as read: its content, its version (the keeper's epoch) and its number of holdings.
#[derive(Clone, Debug)]
pub struct Found {
    pub record: LeaseRecord,
    pub version: i32,
    pub holdings: i32,
}

impl Found {
    pub fn of(data: &[u8], stat: &Stat) -> Option<Found> {
        Some(Found {
            record: LeaseRecord::parse(data)?,
            version: stat.version,
            holdings: stat.num_children,
        })
    }
}

/// The record at `path`, if there is one (a record that does not parse counts as none).
pub async fn read(client: &Client, path: &str) -> Result<Option<Found>, ZkError> {
    Ok(crate::zk::data(client, path)
        .await?
        .and_then(|(data, stat)| Found::of(&data, &stat)))
}

/// The record at `path` with a watch on it (a visitor's, see [super::Lease::visiting]): `None`
/// if there is none (no watch then), or the record and the watch that fires when it changes
/// (the lease taken over or ended) or goes. A record that does not parse counts as none.
pub async fn read_and_watch(client: &Client, path: &str) -> Result<Option<(Found, RecordWatch)>, ZkError> {
    match retry_on_loss(|| client.get_and_watch_data(path)).await {
        Ok((data, stat, watcher)) => Ok(Found::of(&data, &stat).map(|found| (found, RecordWatch(watcher)))),
        Err(ZkError::NoNode) => Ok(None),
        Err(err) => Err(err),
    }
}

/// A watch on a lease's record ([read_and_watch]).
pub struct RecordWatch(OneshotWatcher);

impl RecordWatch {
    /// Returns when the record changed or went, or the session that set the watch ended.
    pub async fn changed(self) {
        self.0.changed().await;
    }
}

/// The records at `paths`, in the order given (`None` where there is none), in multi-reads.
pub async fn read_several(client: &Client, paths: &[String]) -> Result<Vec<Option<Found>>, ZkError> {
    let read = crate::zk::get_each(client, paths).await?;
    Ok(read
        .into_iter()
        .map(|read| read.and_then(|(data, stat)| Found::of(&data, &stat)))
        .collect())
}

/// Every lease record under the root, by id (tombstones included), in multi-reads.
pub async fn read_all(client: &Client, root: &str) -> Result<Vec<(String, Found)>, ZkError> {
    let dir = leases_dir(root);
    let ids = crate::zk::children(client, &dir).await?;
    let read = crate::zk::read_each(client, &dir, ids).await?;
    Ok(read
        .into_iter()
        .filter_map(|(id, data, stat)| Found::of(&data, &stat).map(|found| (id, found)))
        .collect())
}

/// Makes `<root>/leases`, `<root>/keepers` and `<root>/bindings` (owner records) if they are missing.
pub async fn prepare(client: &Client, root: &str) -> Result<(), ZkError> {
    let bindings = format!("{root}/{OWNER_RECORDS}");
    for dir in [leases_dir(root), format!("{root}/{KEEPERS}"), bindings] {
        crate::zk::session::ensure_path(client, &dir).await?;
    }
    Ok(())
}

/// Creates a lease's record. A create whose reply was lost finds the record there: its id is
/// unguessable, so it is this one's (version 0: nothing can have changed it yet but its keeper).
pub async fn create(client: &Client, path: &str, record: &LeaseRecord) -> Result<i32, ZkError> {
    let options = CreateMode::Persistent.with_acls(crate::zk::acls());
    let data = record.to_bytes();
    loop {
        match client.create(path, &data, &options).await {
            Ok(_) | Err(ZkError::NodeExists) => return Ok(0),
            Err(ZkError::NoNode) => {
                let parent = &path[..path.rfind('/').unwrap_or(0)];
                crate::zk::session::ensure_path(client, parent).await?;
            }
            Err(err) if crate::zk::is_loss(&err) => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(err) => return Err(err),
        }
    }
}

/// What a keyed lease creation's idempotency record holds: the lease it made.
#[derive(serde::Serialize, serde::Deserialize)]
struct Made {
    lease: String,
}

/// What an operation of a keyed creation's multi-op is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Creating {
    Key,
    Lease,
}

/// [create] of lease `id` with an idempotency key's record, in one multi-op: `None` when
/// created, or the id of the lease that a request with the key made before (`id` itself when
/// an earlier attempt of this call landed but lost its reply).
///
/// # Notable errors
/// * [KeyError::Reused] when another request used the key.
/// * [KeyError::Quota] when the key's record passes its principal's quota.
pub async fn create_keyed(
    client: &Client,
    path: &str,
    record: &LeaseRecord,
    id: &str,
    keyed: Keyed<'_>,
) -> Result<Option<String>, KeyError> {
    let options = CreateMode::Persistent.with_acls(crate::zk::acls());
    let data = record.to_bytes();
    let key = keyed.record(client, &Made { lease: id.to_string() }).await?;
    // Lost replies: a few tries (the key makes them safe), then the client's own retry.
    let mut lost = 0;
    loop {
        let mut multi = Multi::new(client);
        key.add_to(&mut multi, Creating::Key)?;
        multi.create(Creating::Lease, path, &data, &options)?;
        match multi.commit().await {
            Ok(done) => {
                keyed.committed(client, &done, &Creating::Key);
                return Ok(None);
            }
            Err(Failed::Refused {
                tag: Creating::Key,
                error: ZkError::NodeExists,
            }) => {
                if let Some(before) = keyed.recorded::<Made>(client).await? {
                    return Ok(Some(before.answer.lease));
                }
                // Forgotten meanwhile: made anew.
            }
            Err(Failed::Refused {
                tag: Creating::Key,
                error: ZkError::NoNode,
            }) => keyed.repair(client).await?,
            Err(Failed::Refused {
                tag: Creating::Lease,
                error: ZkError::NoNode,
            }) => {
                let parent = &path[..path.rfind('/').unwrap_or(0)];
                crate::zk::session::ensure_path(client, parent).await?;
            }
            Err(Failed::Refused {
                error: ZkError::QuotaExceeded,
                ..
            }) => return Err(keyed.exceeded(client, data.len()).await),
            // Made or not: the key's record tells, on the next attempt.
            Err(failed) if failed.is_loss() && lost < 10 => {
                lost += 1;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(failed) => return Err(KeyError::ZooKeeper(failed.into())),
        }
    }
}

/// Why [take_over] did not take the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeOver {
    /// Its record changed since it was read (another instance took it, or it ended): read again.
    Changed,
    /// Its record is gone.
    Gone,
    ZooKeeper(ZkError),
}

/// What an operation of a takeover's multi-op is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// The lease's record, rewritten to name its new keeper.
    Record,
    /// The notice for the former keeper.
    Notice,
}

/// Makes `me` the keeper of the lease `id` found as `found`: one write conditional on the version
/// read, so that of two instances trying at once one wins. A notice for the former keeper goes
/// in the same multi-op (unless its keeper node is gone: then it is gone too). Returns the
/// record's new version.
pub async fn take_over(client: &Client, root: &str, id: &str, found: &Found, me: &str) -> Result<i32, TakeOver> {
    let record = LeaseRecord {
        keeper: me.to_string(),
        ..found.record.clone()
    };
    let data = record.to_bytes();
    let path = path(root, id);
    let notice = format!("{}/{id}", keeper_path(root, &found.record.keeper));
    let mut with_notice = found.record.keeper != me;
    loop {
        let mut multi = Multi::new(client);
        multi
            .set(Part::Record, &path, &data, Some(found.version))
            .map_err(TakeOver::ZooKeeper)?;
        if with_notice {
            let options = CreateMode::Persistent.with_acls(crate::zk::acls());
            multi
                .create(Part::Notice, &notice, &[], &options)
                .map_err(TakeOver::ZooKeeper)?;
        }
        match multi.commit().await {
            Ok(done) => return Ok(done.stat(&Part::Record).map_or(found.version + 1, |stat| stat.version)),
            Err(Failed::Refused {
                tag: Part::Record,
                error,
            }) => {
                return Err(match error {
                    ZkError::NoNode => TakeOver::Gone,
                    ZkError::BadVersion => TakeOver::Changed,
                    err => TakeOver::ZooKeeper(err),
                });
            }
            // The former keeper's node is gone (so is it), or holds a notice already (an
            // earlier takeover of this lease from it): take it over without one.
            Err(Failed::Refused {
                tag: Part::Notice,
                error: ZkError::NoNode | ZkError::NodeExists,
            }) => with_notice = false,
            Err(failed) => {
                if !failed.is_loss() {
                    return Err(TakeOver::ZooKeeper(failed.error()));
                }
                // The reply was lost: whether it applied, a fresh read tells.
                match read(client, &path).await {
                    Ok(Some(now)) if now.record.keeper == me && now.record.ended.is_none() => return Ok(now.version),
                    Ok(Some(now)) if now.version == found.version => {}
                    Ok(Some(_)) => return Err(TakeOver::Changed),
                    Ok(None) => return Err(TakeOver::Gone),
                    Err(err) => return Err(TakeOver::ZooKeeper(err)),
                }
            }
        }
    }
}

/// Writes the end of a lease into its record (conditional on `version`, the version kept). A
/// reply lost on the way is retried: a retry that finds the version moved reads whether the end
/// is the one written.
///
/// Returns how many holding records the record has (what the lease holds, wherever it is driven).
///
/// # Notable errors
/// * `BadVersion` or `NoNode`: the lease is not kept at that version (it was taken over or
///   removed); nothing was written.
pub async fn mark_ended(
    client: &Client,
    path: &str,
    record: &LeaseRecord,
    version: i32,
    reason: EndReason,
) -> Result<i32, ZkError> {
    let ended = LeaseRecord {
        ended: Some(reason),
        ended_ms: Some(crate::time::now_ms()),
        ..record.clone()
    };
    let data = ended.to_bytes();
    let mut retried = false;
    loop {
        match client.set_data(path, &data, Some(version)).await {
            Ok(stat) => return Ok(stat.num_children),
            Err(err) if crate::zk::is_loss(&err) => {
                retried = true;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(ZkError::BadVersion) if retried => match read(client, path).await? {
                Some(now) if now.record.ended == Some(reason) && now.record.keeper == record.keeper => {
                    return Ok(now.holdings);
                }
                _ => return Err(ZkError::BadVersion),
            },
            Err(err) => return Err(err),
        }
    }
}

/// Removes a tombstone. `false` (and nothing removed) while holding records remain under it (a
/// holding still being cleaned up) or when it is not a tombstone (any more).
pub async fn remove_tombstone(client: &Client, path: &str) -> Result<bool, ZkError> {
    let Some(found) = read(client, path).await? else {
        return Ok(true);
    };
    if found.record.ended.is_none() || found.holdings > 0 {
        return Ok(false);
    }
    match retry_on_loss(|| client.delete(path, Some(found.version))).await {
        Ok(()) | Err(ZkError::NoNode) => Ok(true),
        Err(ZkError::NotEmpty | ZkError::BadVersion) => Ok(false),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_tolerates_what_it_does_not_know() {
        let record = LeaseRecord {
            ttl_ms: 30_000,
            requested_ttl_ms: None,
            principal: Some("alice".into()),
            created_ms: 1,
            keeper: "0123abcd".into(),
            ended: None,
            ended_ms: None,
            lock_delay_ms: Some(15_000),
        };
        assert_eq!(LeaseRecord::parse(&record.to_bytes()), Some(record.clone()));
        let newer = br#"{"ttl_ms":5,"created_ms":2,"keeper":"x","ended":"expired","ended_ms":3,"later":1}"#;
        let parsed = LeaseRecord::parse(newer).expect("parses");
        assert_eq!(parsed.ended, Some(EndReason::Expired));
        assert_eq!(parsed.principal, None);
        assert_eq!(LeaseRecord::parse(b"not json"), None);
    }
}
