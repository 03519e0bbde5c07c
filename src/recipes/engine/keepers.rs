//! The keeper nodes `<root>/keepers/<instance>`: each instance's sign of life (touched every
//! second, its `mtime` ZooKeeper's clock) and the notices of leases taken over from it (see
//! [super::record] for the layout, and [crate::recipes::leases] for what they are for).

use crate::zk::{Multi, retry_on_loss};
use zookeeper_client::{Client, CreateMode, Error as ZkError, OneshotWatcher};

use super::record::{KEEPERS, keeper_path};

/// Touches `<root>/keepers/<me>` (creating it if missing): the instance's sign of life, whose
/// `mtime` (ZooKeeper's clock) says when it last was. Returns that time, and whether the node
/// had to be made (its notices, if any, were lost with it).
pub async fn touch(client: &Client, root: &str, me: &str) -> Result<(i64, bool), ZkError> {
    let path = keeper_path(root, me);
    match client.set_data(&path, &[], None).await {
        Ok(stat) => return Ok((stat.mtime, false)),
        Err(ZkError::NoNode) => {}
        Err(err) => return Err(err),
    }
    let options = CreateMode::Persistent.with_acls(crate::zk::acls());
    loop {
        match client.create(&path, &[], &options).await {
            Ok((stat, _)) => return Ok((stat.mtime, true)),
            // Made by a create whose reply was lost: touch it to learn the time.
            Err(ZkError::NodeExists) => return Ok((client.set_data(&path, &[], None).await?.mtime, true)),
            Err(ZkError::NoNode) => crate::zk::session::ensure_path(client, &format!("{root}/{KEEPERS}")).await?,
            Err(err) => return Err(err),
        }
    }
}

/// The notices under `<root>/keepers/<me>` (the ids of leases taken over from this instance),
/// with a watch for the next.
pub async fn notices(client: &Client, root: &str, me: &str) -> Result<(Vec<String>, OneshotWatcher), ZkError> {
    retry_on_loss(|| client.list_and_watch_children(&keeper_path(root, me))).await
}

/// Removes notices once acted on.
pub async fn clear_notices(client: &Client, root: &str, me: &str, ids: &[String]) {
    let dir = keeper_path(root, me);
    for chunk in ids.chunks(crate::zk::multi::DELETE_BATCH) {
        let mut multi = Multi::new(client);
        for id in chunk {
            let _ = multi.delete((), &format!("{dir}/{id}"), None);
        }
        if multi.commit().await.is_err() {
            // One was gone already: delete them one by one.
            for id in chunk {
                let _ = retry_on_loss(|| client.delete(&format!("{dir}/{id}"), None)).await;
            }
        }
    }
}

/// When each instance under `<root>/keepers` was last seen (its node's `mtime`), by id.
pub async fn keepers(client: &Client, root: &str) -> Result<Vec<(String, i64)>, ZkError> {
    let dir = format!("{root}/{KEEPERS}");
    let names = crate::zk::children(client, &dir).await?;
    let read = crate::zk::read_each(client, &dir, names).await?;
    Ok(read.into_iter().map(|(name, _, stat)| (name, stat.mtime)).collect())
}

/// Removes the keeper node of an instance that is gone, with its notices.
pub async fn forget_keeper(client: &Client, root: &str, instance: &str) -> Result<(), ZkError> {
    let path = keeper_path(root, instance);
    loop {
        let notices = match retry_on_loss(|| client.list_children(&path)).await {
            Ok(notices) => notices,
            Err(ZkError::NoNode) => return Ok(()),
            Err(err) => return Err(err),
        };
        clear_notices(client, root, instance, &notices).await;
        match retry_on_loss(|| client.delete(&path, None)).await {
            Ok(()) | Err(ZkError::NoNode) => return Ok(()),
            Err(ZkError::NotEmpty) => continue,
            Err(err) => return Err(err),
        }
    }
}
