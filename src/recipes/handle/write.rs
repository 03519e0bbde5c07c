//! A holding's writes, guarded by its lease: its znodes created together with their reference
//! under the lease's record in one multi-op ([create_held]), later writes made only while the
//! lease is still kept here ([write_held]), and deletes that tell what was there ([delete_all]).

use std::time::Duration;

use zookeeper_client::{Client, Error as ZkError, MultiWriteError, MultiWriteResult, MultiWriter};

use super::{Exit, Handle, Protocol};
use crate::recipes::lease::GuardError;

/// Why [create_held] made nothing.
#[derive(Debug)]
pub enum NotCreated {
    /// The lease moved to another instance (or ended): nothing was written.
    LeaseMoved,
    /// Operation `index` of the holding's own (0 for the first it added) failed.
    Refused { index: usize, error: ZkError },
    /// The request failed as a whole: a connection loss (it may have been applied: look before
    /// creating again) or the session's end.
    Request(ZkError),
}

impl NotCreated {
    /// The exit for a run whose create failed with an error it does not handle itself.
    pub fn exit(self) -> Exit {
        match self {
            NotCreated::LeaseMoved => Exit::Moved,
            NotCreated::Refused { error, .. } | NotCreated::Request(error) => Exit::from_error(error),
        }
    }
}

/// What [create_held] made.
pub struct Made {
    /// The results of the holding's own operations.
    pub results: Vec<MultiWriteResult>,
    /// The listing it was asked to send after them, if it was.
    pub listed: Option<Result<Vec<String>, ZkError>>,
    /// The zxid of the multi-op's transaction (the `czxid` of every node it created), read
    /// from the reference in the same round trip: ZooKeeper 3.8's multi-op answers a create
    /// without its stat (ZOOKEEPER-4026), and a contender's fencing token is its `czxid`.
    pub czxid: Option<i64>,
}

/// Creates a holding's znodes (what `add` adds to the multi-op) together with its reference
/// under the lease's record, guarded by the lease (the record's version as kept here, or its
/// creation: see [Lease::guard]), in one multi-op: all or nothing. With `then_list`, that
/// directory's children are asked for right after the write on the same session (one round
/// trip for both; ZooKeeper serves a session in order, so the listing sees the write).
pub async fn create_held<P: Protocol>(
    handle: &Handle<P>,
    client: &Client,
    add: impl Fn(&mut MultiWriter<'_>) -> Result<(), ZkError>,
    then_list: Option<&str>,
) -> Result<Made, NotCreated> {
    let reference = handle.protocol.record(handle).to_bytes();
    commit_guarded(handle, client, Some(&reference), add, then_list).await
}

/// The requests [commit_guarded] sends right after its multi-op, on the same session (so
/// that they see it), in the same round trip.
async fn read_after(
    client: &Client,
    then_list: Option<&str>,
    then_stat: Option<&str>,
) -> (Option<Result<Vec<String>, ZkError>>, Option<i64>) {
    // Each request is sent when its future is made: both leave before either is awaited.
    let listing = then_list.map(|dir| client.list_children(dir));
    let stat = then_stat.map(|path| client.check_stat(path));
    let listed = match listing {
        Some(listing) => Some(listing.await),
        None => None,
    };
    let czxid = match stat {
        Some(stat) => stat.await.ok().flatten().map(|stat| stat.czxid),
        None => None,
    };
    (listed, czxid)
}

/// Writes what `add` adds for a holding that exists already (a semaphore's permit node, an
/// election's acknowledgement), guarded by the lease as [create_held] is.
pub async fn write_held<P: Protocol>(
    handle: &Handle<P>,
    client: &Client,
    add: impl Fn(&mut MultiWriter<'_>) -> Result<(), ZkError>,
) -> Result<Vec<MultiWriteResult>, NotCreated> {
    Ok(commit_guarded(handle, client, None, add, None).await?.results)
}

async fn commit_guarded<P: Protocol>(
    handle: &Handle<P>,
    client: &Client,
    reference: Option<&[u8]>,
    add: impl Fn(&mut MultiWriter<'_>) -> Result<(), ZkError>,
    then_list: Option<&str>,
) -> Result<Made, NotCreated> {
    let own = if reference.is_some() { 2 } else { 1 };
    let options = zookeeper_client::CreateMode::Persistent.with_acls(crate::zk::acls());
    loop {
        let mut writer = client.new_multi_writer();
        let guard = handle.lease.guard(&mut writer).map_err(NotCreated::Request)?;
        reference
            .map_or(Ok(()), |reference| {
                writer.add_create(&handle.reference(), reference, &options)
            })
            .and_then(|()| add(&mut writer))
            .map_err(NotCreated::Request)?;
        let started = std::time::Instant::now();
        // The requests are sent here, in this order; their replies come together.
        let commit = writer.commit();
        let then_stat = reference.map(|_| handle.reference());
        let (committed, (listed, czxid)) = tokio::join!(commit, read_after(client, then_list, then_stat.as_deref()));
        crate::metrics::zookeeper_request(started.elapsed());
        let failed = match committed {
            Ok(results) => {
                let _ = handle.lease.guarded(guard, None);
                handle.created();
                return Ok(Made {
                    results: results.into_iter().skip(own).collect(),
                    listed,
                    czxid,
                });
            }
            Err(MultiWriteError::RequestFailed { source }) => return Err(NotCreated::Request(source)),
            Err(MultiWriteError::OperationFailed { index, source }) => (index, source),
        };
        match failed {
            (0, error) => match handle.lease.guarded(guard, Some((0, error))) {
                Ok(_) => continue,
                Err(GuardError::LeaseMoved) => return Err(NotCreated::LeaseMoved),
                Err(GuardError::ZooKeeper(error)) => return Err(NotCreated::Request(error)),
            },
            // The reference is there already: an earlier create of this holding applied (its
            // reply lost); its znodes are to be found, not made again.
            (1, ZkError::NodeExists) if own == 2 => {
                return Err(NotCreated::Refused {
                    index: usize::MAX,
                    error: ZkError::NodeExists,
                });
            }
            (1, error) if own == 2 => return Err(NotCreated::Request(error)),
            (index, error) => {
                return Err(NotCreated::Refused {
                    index: index - own,
                    error,
                });
            }
        }
    }
}

/// Deletes `paths` (a holding's znodes, its reference last) in one multi-op; a path already
/// gone is left out and the rest deleted again. Returns, for each path, whether it was there.
pub async fn delete_all(client: &Client, paths: &[String]) -> Result<Vec<bool>, ZkError> {
    let mut there = vec![true; paths.len()];
    let mut pending = vec![true; paths.len()];
    // After a lost reply a path found gone may be one this deleted: it counts as there.
    let mut reply_lost = false;
    loop {
        let mut writer = client.new_multi_writer();
        let left: Vec<usize> = (0..paths.len()).filter(|&i| pending[i]).collect();
        if left.is_empty() {
            return Ok(there);
        }
        for &i in &left {
            writer.add_delete(&paths[i], None)?;
        }
        let started = std::time::Instant::now();
        let committed = writer.commit().await;
        crate::metrics::zookeeper_request(started.elapsed());
        match committed {
            Ok(_) => return Ok(there),
            Err(MultiWriteError::OperationFailed {
                index,
                source: ZkError::NoNode,
            }) => {
                pending[left[index]] = false;
                there[left[index]] &= reply_lost;
            }
            Err(err) => {
                let err = ZkError::from(err);
                if !crate::zk::is_loss(&err) {
                    return Err(err);
                }
                // Applied or not, the next attempt tells: what is gone is left out.
                reply_lost = true;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}
