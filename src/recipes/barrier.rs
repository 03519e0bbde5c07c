//! Barrier, the guide's recipe: the barrier znode exists while the barrier is up; a waiter
//! sets an exists-watch and proceeds once the node is gone, re-checking on every event.
//!
//! Here the waiting is shared: all the waiters of one instance on one barrier wait on the
//! instance's one watch for that path ([ExistsWatches]), and are woken in process when it
//! reports the node gone. A barrier is either persistent (lowered by a `DELETE`) or bound to
//! its owner's lease (an ephemeral node, so it falls when the owner goes silent or dies).

use zookeeper_client::{Client, CreateMode, Error as ZkError};

use crate::zk::watch::ExistsWatches;

/// Raises a persistent barrier at `path`; `false` if it was already up.
pub async fn raise(client: &Client, path: &str) -> Result<bool, ZkError> {
    let options = CreateMode::Persistent.with_acls(crate::zk::acls());
    loop {
        match client.create(path, &[], &options).await {
            Ok(_) => return Ok(true),
            // A lost reply of our own create also lands here: either way it is up.
            Err(ZkError::NodeExists) => return Ok(false),
            Err(err) if crate::zk::is_loss(&err) => continue,
            Err(ZkError::NoNode) => {
                let parent = &path[..path.rfind('/').unwrap_or(0)];
                crate::zk::session::ensure_path(client, parent).await?;
            }
            Err(err) => return Err(err),
        }
    }
}

/// Lowers the barrier at `path` (whoever raised it); `false` if it was not up.
pub async fn lower(client: &Client, path: &str) -> Result<bool, ZkError> {
    let mut retried = false;
    loop {
        match client.delete(path, None).await {
            Ok(()) => return Ok(true),
            // After a lost reply, a missing node is our own deletion.
            Err(ZkError::NoNode) => return Ok(retried),
            Err(err) if crate::zk::is_loss(&err) => retried = true,
            Err(err) => return Err(err),
        }
    }
}

/// Waits until the barrier at `path` is down (its node does not exist).
pub async fn wait_down(watches: &ExistsWatches, path: &str) {
    let mut subscription = watches.subscribe(path);
    let _ = subscription.state.wait_for(|known| matches!(known, Some(None))).await;
}
