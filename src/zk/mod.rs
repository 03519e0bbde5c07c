//! Everything that talks to ZooKeeper as such: the session supervisor, the server process we
//! start when no ensemble is given, the validation of names before they become paths, and the
//! session's security (digest authentication, the ACL of the znodes zkgate creates, TLS).

pub mod acl;
pub mod failure;
pub mod multi;
pub mod names;
pub mod nodelay;
pub mod quota;
mod reconnect;
pub mod recursive;
pub mod security;
pub mod server;
pub mod session;
pub mod sync;
pub mod watch;

pub use acl::acls;
pub use failure::Failure;
pub use multi::{Done, Failed, Multi};
pub use session::Session;
pub use zookeeper_client::{Client, Error as ZkError, WatchedEvent};

use std::future::Future;
use std::time::Duration;

/// Whether `err` means "the connection broke before the reply came": the request may or may
/// not have been applied, and the session may still be alive.
///
/// zookeeper-client reports that in two shapes. `ConnectionLoss` when the server closed the
/// socket cleanly, but `Custom` (an I/O error such as a broken pipe or a reset, or its own
/// "no response from connection" read timeout) when the socket failed under a request in
/// flight: the client fails every pending request with the error that ended the connection.
/// No reply from a server ever becomes `Custom`, and client-side argument checks are
/// `BadArguments`, so every `Custom` on a request is a transport failure. Every recipe asks
/// this predicate instead of matching `ConnectionLoss`, so that the GUID rule and the retries
/// also run when a server dies mid-request (the ensemble's follower-kill test covers it).
pub fn is_loss(err: &ZkError) -> bool {
    matches!(err, ZkError::ConnectionLoss | ZkError::Custom(_))
}

/// Runs `op` again while it fails with a connection loss ([`is_loss`]), with a short backoff.
///
/// Only for operations that are safe to repeat: reads, watches, deletes of our own nodes. A
/// create is not (its reply may be lost after it happened): see the GUID rule in the recipes.
/// While the connection is down the session may still be alive; the loop ends when the client
/// reconnects (success) or the session expires (`SessionExpired`).
pub async fn retry_on_loss<T, F, Fut>(mut op: F) -> Result<T, ZkError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ZkError>>,
{
    let mut backoff = Duration::from_millis(20);
    loop {
        let started = std::time::Instant::now();
        let result = op().await;
        crate::metrics::zookeeper_request(started.elapsed());
        match result {
            Err(err) if is_loss(&err) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
            result => return result,
        }
    }
}

/// The children of `path` (read again after a connection loss), none if it does not exist.
pub async fn children(client: &Client, path: &str) -> Result<Vec<String>, ZkError> {
    match retry_on_loss(|| client.list_children(path)).await {
        Err(ZkError::NoNode) => Ok(Vec::new()),
        listed => listed,
    }
}

/// The data and stat of `path` (read again after a connection loss), none if it does not exist.
pub async fn data(client: &Client, path: &str) -> Result<Option<(Vec<u8>, zookeeper_client::Stat)>, ZkError> {
    match retry_on_loss(|| client.get_data(path)).await {
        Ok(read) => Ok(Some(read)),
        Err(ZkError::NoNode) => Ok(None),
        Err(err) => Err(err),
    }
}

/// Most reads in one multi-read: each answer holds a stat and a small node's data, so a
/// thousand stay well within ZooKeeper's packet limit (`jute.maxbuffer`, 1 MB).
const MULTI_READ_CHUNK: usize = 1000;

/// The data and stat of each of `paths` (`None` where the node does not exist), in the order
/// given: multi-reads of at most [MULTI_READ_CHUNK] paths, sent together, so that thousands of
/// nodes cost a few round trips and no answer outgrows a packet.
pub async fn get_each(
    client: &zookeeper_client::Client,
    paths: &[String],
) -> Result<Vec<Option<(Vec<u8>, zookeeper_client::Stat)>>, ZkError> {
    get_each_of_size(client, paths, 0).await
}

/// The answer size a multi-read is kept under (`jute.maxbuffer` less room for the framing).
const MULTI_READ_BYTES: usize = 1000 * 1024;

/// [get_each] for nodes that may hold up to `max_bytes` each (0: small nodes): as many in one
/// multi-read as stay within a packet together even at that size.
pub async fn get_each_of_size(
    client: &zookeeper_client::Client,
    paths: &[String],
    max_bytes: usize,
) -> Result<Vec<Option<(Vec<u8>, zookeeper_client::Stat)>>, ZkError> {
    let chunk = match max_bytes {
        0 => MULTI_READ_CHUNK,
        bytes => (MULTI_READ_BYTES / bytes).clamp(1, MULTI_READ_CHUNK),
    };
    let chunks = paths.chunks(chunk).map(|chunk| {
        retry_on_loss(move || {
            let mut reader = client.new_multi_reader();
            for path in chunk {
                // Only fails for an invalid path; callers' paths are made of valid names.
                let _ = reader.add_get_data(path);
            }
            reader.commit()
        })
    });
    let answers = futures::future::try_join_all(chunks).await?;
    Ok(answers
        .into_iter()
        .flatten()
        .map(|result| match result {
            zookeeper_client::MultiReadResult::Data { data, stat } => Some((data, stat)),
            _ => None,
        })
        .collect())
}

/// The stat of each of `paths` (`None` where the node does not exist), in the order given.
pub async fn stat_each(
    client: &zookeeper_client::Client,
    paths: &[String],
) -> Result<Vec<Option<zookeeper_client::Stat>>, ZkError> {
    Ok(get_each(client, paths)
        .await?
        .into_iter()
        .map(|read| read.map(|(_, stat)| stat))
        .collect())
}

/// Reads the data and stat of `<dir>/<name>` for each of `names` (see [get_each]), in the order
/// given; a node gone between its listing and this read is left out.
pub async fn read_each(
    client: &zookeeper_client::Client,
    dir: &str,
    names: Vec<String>,
) -> Result<Vec<(String, Vec<u8>, zookeeper_client::Stat)>, ZkError> {
    let paths: Vec<String> = names.iter().map(|name| format!("{dir}/{name}")).collect();
    let read = get_each(client, &paths).await?;
    Ok(names
        .into_iter()
        .zip(read)
        .filter_map(|(name, read)| read.map(|(data, stat)| (name, data, stat)))
        .collect())
}
