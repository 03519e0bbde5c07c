//! A holding's writes, guarded by its lease: its znodes created together with their holding record
//! under the lease's record in one multi-op ([create_held]), later writes made only while the
//! lease is still kept here ([write_held]), and deletes that tell what was there ([delete_all]).

use std::time::Duration;

use zookeeper_client::{Client, Error as ZkError};

use crate::recipes::guards::Checked;
use crate::zk::{Done, Failed, Failure, Multi};

use super::{Exit, Handle, Protocol};
use crate::recipes::engine::lease::{Guard, GuardError};
use crate::recipes::engine::record::write_if_naming;

/// What an operation of a guarded multi-op is for: the lease's guard, the holding's record
/// under the lease's record (its create, and the write that stamps it: see [Made::czxid]), or
/// one of the holding's own (tagged by the holding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guarded<T> {
    Guard,
    Record,
    Stamp,
    Own(T),
}

/// Why [create_held] made nothing.
#[derive(Debug)]
pub enum NotCreated<T> {
    /// The lease moved to another instance (or ended): nothing was written.
    LeaseMoved,
    /// Its holding record is there already: an earlier create of it applied (its reply
    /// lost), so its znodes are to be found, not made again.
    MadeBefore,
    /// The lease holds this resource already, with another handle (made through another
    /// instance, for an earlier attempt of the same request): one per lease, so nothing was
    /// written; that holding is to be adopted instead (read afresh by the acquire, after a
    /// `sync`: see `locks::contention`).
    HeldAlready,
    /// The holding's own operation tagged `tag` was refused.
    Refused { tag: T, error: ZkError },
    /// The request failed as a whole: a connection loss (it may have been applied: look before
    /// creating again) or the session's end.
    Request(ZkError),
}

impl<T> NotCreated<T> {
    /// The exit for a run whose create failed with an error it does not handle itself.
    pub fn exit(self) -> Exit {
        match self {
            NotCreated::LeaseMoved => Exit::Moved,
            NotCreated::MadeBefore | NotCreated::HeldAlready => Exit::Failed(crate::zk::Failure::Taken),
            NotCreated::Refused { error, .. } | NotCreated::Request(error) => Exit::from_error(error),
        }
    }
}

/// What [create_held] made.
pub struct Made<T> {
    /// The answers to the holding's own operations.
    pub done: Done<T>,
    /// The listing it was asked to send after them, if it was.
    pub listed: Option<Result<Vec<String>, ZkError>>,
    /// The zxid of the multi-op's transaction (the `czxid` of every node it created): a
    /// contender's fencing token is its `czxid`, and the multi-op of ZooKeeper 3.8.0 (Debian's)
    /// answers a create without its stat (ZOOKEEPER-4026). So the multi-op ends by writing the
    /// holding record it just created again, unchanged (version 0 to 1), and a write inside a
    /// multi-op *is* answered with its stat, whose `mzxid` is the transaction's: one more
    /// operation inside the transaction instead of a request of its own after it (an `exists`
    /// of the holding record, which cost ZooKeeper a quarter of a lock cycle's requests).
    pub czxid: Option<i64>,
}

/// Creates a holding's znodes (what `add` adds to the multi-op, each tagged
/// [Guarded::Own]) together with its holding record under the lease's record, guarded by the lease
/// (the record's version as kept here, or its creation: see [Lease::guard]), in one multi-op:
/// all or nothing. With `then_list`, that directory's children are asked for right after the
/// write on the same session (one round trip for both; ZooKeeper serves a session in order, so
/// the listing sees the write).
pub async fn create_held<P: Protocol, T: Send + 'static>(
    handle: &Handle<P>,
    client: &Client,
    add: impl Fn(&mut Multi<'_, Guarded<T>>) -> Result<(), ZkError>,
    then_list: Option<&str>,
) -> Result<Made<T>, NotCreated<T>> {
    let record_name = handle.protocol.record(handle).to_bytes();
    commit_guarded(handle, client, Some(&record_name), add, then_list).await
}

/// The listing [commit_guarded] sends right after its multi-op, on the same session (so
/// that it sees the write), in the same round trip: the request is sent when its future is
/// made, before either is awaited.
async fn list_after(client: &Client, then_list: Option<&str>) -> Option<Result<Vec<String>, ZkError>> {
    match then_list.map(|dir| client.list_children(dir)) {
        Some(listing) => Some(listing.await),
        None => None,
    }
}

/// Writes what `add` adds for a holding that exists already (a semaphore's permit node, an
/// election's acknowledgement), guarded by the lease as [create_held] is.
pub async fn write_held<P: Protocol, T: Send + 'static>(
    handle: &Handle<P>,
    client: &Client,
    add: impl Fn(&mut Multi<'_, Guarded<T>>) -> Result<(), ZkError>,
) -> Result<Done<T>, NotCreated<T>> {
    Ok(commit_guarded(handle, client, None, add, None).await?.done)
}

async fn commit_guarded<P: Protocol, T: Send + 'static>(
    handle: &Handle<P>,
    client: &Client,
    record_name: Option<&[u8]>,
    add: impl Fn(&mut Multi<'_, Guarded<T>>) -> Result<(), ZkError>,
    then_list: Option<&str>,
) -> Result<Made<T>, NotCreated<T>> {
    let options = zookeeper_client::CreateMode::Persistent.with_acls(crate::zk::acls());
    loop {
        let mut multi = Multi::new(client);
        let guard = handle
            .lease
            .guard(&mut multi, Guarded::Guard)
            .map_err(NotCreated::Request)?;
        record_name
            .map_or(Ok(()), |record_name| {
                let path = handle.record_path();
                multi.create(Guarded::Record, &path, record_name, &options)?;
                multi.set(Guarded::Stamp, &path, record_name, Some(0))
            })
            .and_then(|()| add(&mut multi))
            .map_err(NotCreated::Request)?;
        let started = std::time::Instant::now();
        // The requests are sent here, in this order; their replies come together.
        let commit = multi.commit();
        let (committed, listed) = tokio::join!(commit, list_after(client, then_list));
        crate::metrics::zookeeper_request(started.elapsed());
        match committed {
            Ok(done) => {
                let _ = handle.lease.guarded(guard, None);
                handle.created();
                let czxid = done
                    .stat_where(|tag| matches!(tag, Guarded::Stamp))
                    .map(|stat| stat.mzxid);
                let done = done.filter_map(|tag| match tag {
                    Guarded::Own(tag) => Some(tag),
                    Guarded::Guard | Guarded::Record | Guarded::Stamp => None,
                });
                return Ok(Made { done, listed, czxid });
            }
            Err(Failed::Request(error)) => return Err(NotCreated::Request(error)),
            Err(Failed::Refused {
                tag: Guarded::Guard,
                error,
            }) => guard_refused(handle, client, guard, error).await?,
            Err(Failed::Refused {
                tag: Guarded::Record,
                error: ZkError::NodeExists,
            }) => record_exists(handle, client).await?,
            Err(Failed::Refused {
                tag: Guarded::Record | Guarded::Stamp,
                error,
            }) => return Err(NotCreated::Request(error)),
            Err(Failed::Refused {
                tag: Guarded::Own(tag),
                error,
            }) => return Err(NotCreated::Refused { tag, error }),
        }
    }
}

/// After the lease's guard refused a guarded write: `Ok` to try again.
async fn guard_refused<P: Protocol, T>(
    handle: &Handle<P>,
    client: &Client,
    guard: Guard,
    error: ZkError,
) -> Result<(), NotCreated<T>> {
    match handle.lease.guarded(guard, Some(error)) {
        Ok(_) => Ok(()),
        // A visitor guards with the version it read: the lease may only have changed keeper
        // since, which changes nothing for what is driven here.
        Err(GuardError::LeaseMoved) if handle.lease.is_visiting() => match handle.lease.refresh(client).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(NotCreated::LeaseMoved),
            Err(error) => Err(NotCreated::Request(error)),
        },
        Err(GuardError::LeaseMoved) => Err(NotCreated::LeaseMoved),
        Err(GuardError::ZooKeeper(error)) => Err(NotCreated::Request(error)),
    }
}

/// After a guarded write found the holding record there already: an earlier create of this
/// holding applied (its reply lost), and its znodes are to be found, not made again; or, one
/// per lease, the lease holds this resource with another handle already. `Ok` to try again (it
/// was released meanwhile).
async fn record_exists<P: Protocol, T>(handle: &Handle<P>, client: &Client) -> Result<(), NotCreated<T>> {
    let lease = &handle.lease.path;
    match crate::recipes::engine::record::holding(client, lease, handle.record_name()).await {
        Ok(Some(held)) if held.handle != handle.id => Err(NotCreated::HeldAlready),
        Ok(Some(_)) => Err(NotCreated::MadeBefore),
        Ok(None) => Ok(()),
        Err(error) => Err(NotCreated::Request(error)),
    }
}

/// Deletes `paths` (a holding's znodes, its holding record last) in one multi-op; a path already
/// gone is left out and the rest deleted again. Returns, for each path, whether it was there.
pub async fn delete_all(client: &Client, paths: &[String]) -> Result<Vec<bool>, ZkError> {
    let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
    delete_each(client, &paths, None, &Checked::default())
        .await
        .map_err(Unguarded::unexpected)
}

/// [delete_all], if the writer's `guards` hold when ZooKeeper applies it: [Failure::Unguarded]
/// otherwise, and nothing is deleted.
pub async fn delete_all_guarded(client: &Client, paths: &[String], guards: &Checked) -> Result<Vec<bool>, Failure> {
    let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
    match delete_each(client, &paths, None, guards).await {
        Ok(there) => Ok(there),
        Err(Unguarded::Refused) => Err(Failure::Unguarded),
        Err(Unguarded::ZooKeeper(err)) => Err(err.into()),
    }
}

/// Why [delete_each] deleted nothing.
enum Unguarded {
    /// ZooKeeper refused a check of the guards.
    Refused,
    ZooKeeper(ZkError),
}

impl From<ZkError> for Unguarded {
    fn from(err: ZkError) -> Unguarded {
        Unguarded::ZooKeeper(err)
    }
}

impl Unguarded {
    /// The error of a delete that carried no guards.
    fn unexpected(self) -> ZkError {
        match self {
            Unguarded::Refused => ZkError::UnexpectedError("a guard refused a delete that carried none".into()),
            Unguarded::ZooKeeper(err) => err,
        }
    }
}

/// A holding record that [delete_each] deletes with the paths before it, or alone only if it
/// names `handle`: its place among the paths.
struct Shared<'a> {
    at: usize,
    handle: &'a str,
}

/// Deletes `paths` in one multi-op, leaving out those found gone and trying the rest again
/// (after a lost reply, one found gone may be one this deleted: it counts as there), and the
/// `shared` holding record as [delete_held] says. Whether each path was there.
async fn delete_each(
    client: &Client,
    paths: &[&str],
    shared: Option<Shared<'_>>,
    guards: &Checked,
) -> Result<Vec<bool>, Unguarded> {
    let mut there = vec![true; paths.len()];
    let mut pending = vec![true; paths.len()];
    let mut reply_lost = false;
    loop {
        if let Some(shared) = &shared
            && pending[shared.at]
            && !pending[..shared.at].contains(&true)
        {
            pending[shared.at] = false;
            // Deleted only if it names `handle` (conditional on the version read).
            let (path, handle) = (paths[shared.at], shared.handle);
            let deleted = write_if_naming(client, path, handle, |version| client.delete(path, Some(version))).await?;
            there[shared.at] = deleted || reply_lost;
        }
        // Each delete is tagged with its path's place in `paths`; the guards' checks with
        // `usize::MAX`, first.
        if !pending.contains(&true) {
            return Ok(there);
        }
        let mut multi = Multi::new(client);
        guards.add_to(&mut multi, usize::MAX)?;
        for i in (0..paths.len()).filter(|&i| pending[i]) {
            multi.delete(i, paths[i], None)?;
        }
        let started = std::time::Instant::now();
        let committed = multi.commit().await;
        crate::metrics::zookeeper_request(started.elapsed());
        match committed {
            Ok(_) => return Ok(there),
            Err(Failed::Refused { tag: usize::MAX, .. }) => return Err(Unguarded::Refused),
            Err(Failed::Refused {
                tag: i,
                error: ZkError::NoNode,
            }) => {
                pending[i] = false;
                there[i] &= reply_lost;
            }
            Err(failed) => {
                if !failed.is_loss() {
                    return Err(failed.error().into());
                }
                // Applied or not, the next attempt tells: what is gone is left out.
                reply_lost = true;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Deletes a holding's znodes `nodes` (what decides its place), its holding record `record_name` and
/// `also` (what else is this holding's alone), in one multi-op; a path already gone is left out
/// and the rest deleted again. The holding record of a contender or a permit is named after its
/// resource ([crate::recipes::engine::record::record_name]), so once this holding's nodes
/// are gone the name may be a successor's (the lease acquired the resource again, through
/// another instance that drives it): the holding record goes in the multi-op only while one of
/// `nodes` is there (then it is this holding's: one per lease), and after that only if it names
/// `handle`, by a delete conditional on the version read. Returns, for each node, whether it
/// was there, and whether the holding record was.
pub async fn delete_held(
    client: &Client,
    nodes: &[String],
    record_name: &str,
    handle: &str,
    also: &[String],
) -> Result<(Vec<bool>, bool), ZkError> {
    tracing::debug!(?nodes, record_name, handle, "deleting a holding");
    let n = nodes.len();
    let paths: Vec<&str> = nodes
        .iter()
        .map(String::as_str)
        .chain([record_name])
        .chain(also.iter().map(String::as_str))
        .collect();
    let shared = Some(Shared { at: n, handle });
    let there = delete_each(client, &paths, shared, &Checked::default())
        .await
        .map_err(Unguarded::unexpected)?;
    Ok((there[..n].to_vec(), there[n]))
}

/// Whether the holding record `name` under the lease record at `lease` is there and names `handle`
/// (a successor's, of the same lease and resource, does not count).
pub async fn names_handle(client: &Client, lease: &str, name: &str, handle: &str) -> Result<bool, ZkError> {
    let held = crate::recipes::engine::record::holding(client, lease, name).await?;
    Ok(held.is_some_and(|held| held.handle == handle))
}
