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
