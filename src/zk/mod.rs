//! Everything that talks to ZooKeeper as such: the session supervisor, the server process we
//! start when no ensemble is given, and the validation of names before they become paths.

pub mod names;
pub mod server;
pub mod session;
pub mod watch;

use std::future::Future;
use std::time::Duration;

use zookeeper_client::Error as ZkError;

/// Runs `op` again while it fails with `ConnectionLoss`, with a short backoff.
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
        match op().await {
            Err(ZkError::ConnectionLoss) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
            result => return result,
        }
    }
}

/// Reads the data and stat of `<dir>/<name>` for each of `names` in one round trip (a
/// multi-read), in the order given; a node gone between its listing and this read is left
/// out.
pub async fn read_each(
    client: &zookeeper_client::Client,
    dir: &str,
    names: Vec<String>,
) -> Result<Vec<(String, Vec<u8>, zookeeper_client::Stat)>, ZkError> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let results = retry_on_loss(|| {
        let mut reader = client.new_multi_reader();
        for name in &names {
            // Only fails for an invalid path, which a listed child cannot make.
            let _ = reader.add_get_data(&format!("{dir}/{name}"));
        }
        reader.commit()
    })
    .await?;
    Ok(names
        .into_iter()
        .zip(results)
        .filter_map(|(name, result)| match result {
            zookeeper_client::MultiReadResult::Data { data, stat } => Some((name, data, stat)),
            _ => None,
        })
        .collect())
}
