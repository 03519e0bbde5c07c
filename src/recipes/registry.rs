//! A registry of live processes: each registers an ephemeral znode (its name, some data) under
//! one directory while its session lives, the guide's group membership used by zkgate's
//! instances for themselves ([crate::instances] says what they register and why).

use zookeeper_client::{Client, CreateMode, Error as ZkError};

use crate::zk::retry_on_loss;

/// Registers `<dir>/<name>` (ephemeral) holding `data`, creating `dir` if needed.
///
/// A node already there counts only if this session made it (a create whose reply was lost):
/// its data is brought up to date. One made by another session (this process's previous one,
/// which the server has not expired yet, or anyone else's) is deleted and made again, so that
/// the registration lives exactly as long as this session; treating it as registered would
/// leave the process unregistered once that other session ends.
///
/// `data` makes the node's data for the session's id (so that it can name its session).
pub async fn register(client: &Client, dir: &str, name: &str, data: impl Fn(i64) -> Vec<u8>) -> Result<(), ZkError> {
    let path = format!("{dir}/{name}");
    let options = CreateMode::Ephemeral.with_acls(crate::zk::acls());
    let mine = client.session_id().0;
    let data = &data(mine)[..];
    loop {
        match retry_on_loss(|| client.create(&path, data, &options)).await {
            Ok(_) => return Ok(()),
            Err(ZkError::NoNode) => {
                let parent = CreateMode::Persistent.with_acls(crate::zk::acls());
                match retry_on_loss(|| client.create(dir, &[], &parent)).await {
                    Ok(_) | Err(ZkError::NodeExists) => {}
                    Err(err) => return Err(err),
                }
            }
            Err(ZkError::NodeExists) => match retry_on_loss(|| client.check_stat(&path)).await? {
                Some(stat) if stat.ephemeral_owner == mine => {
                    match retry_on_loss(|| client.set_data(&path, data, Some(stat.version))).await {
                        Ok(_) => return Ok(()),
                        Err(ZkError::BadVersion | ZkError::NoNode) => {}
                        Err(err) => return Err(err),
                    }
                }
                Some(stat) => {
                    tracing::warn!(%path, owner = %format!("{:#x}", stat.ephemeral_owner), "a registration of another session is in this one's place; replacing it");
                    match retry_on_loss(|| client.delete(&path, Some(stat.version))).await {
                        Ok(()) | Err(ZkError::BadVersion | ZkError::NoNode) => {}
                        Err(err) => return Err(err),
                    }
                }
                None => {}
            },
            Err(err) => return Err(err),
        }
    }
}

/// Returns once the registration `path` is no longer this session's: deleted, or replaced by
/// another session's node. An error when ZooKeeper cannot be asked (look again later).
pub async fn lost(client: &Client, path: &str) -> Result<(), ZkError> {
    let mine = client.session_id().0;
    loop {
        let (stat, watcher) = client.check_and_watch_stat(path).await?;
        if stat.is_none_or(|stat| stat.ephemeral_owner != mine) {
            return Ok(());
        }
        watcher.changed().await;
    }
}

/// Removes the registration `path`, if it is there.
pub async fn deregister(client: &Client, path: &str) -> Result<(), ZkError> {
    match retry_on_loss(|| client.delete(path, None)).await {
        Ok(()) | Err(ZkError::NoNode) => Ok(()),
        Err(err) => Err(err),
    }
}

/// The data of the registration `path` and the session that owns it; `None` when it is not
/// registered.
pub async fn read(client: &Client, path: &str) -> Result<Option<(Vec<u8>, i64)>, ZkError> {
    match retry_on_loss(|| client.get_data(path)).await {
        Ok((data, stat)) => Ok(Some((data, stat.ephemeral_owner))),
        Err(ZkError::NoNode) => Ok(None),
        Err(err) => Err(err),
    }
}

/// The registration under `dir` made by the session that owns the ephemeral znode at `path`:
/// which process made that node. `None` if the node, or its owner's registration, is gone.
pub async fn owner_of_node(client: &Client, dir: &str, path: &str) -> Result<Option<String>, ZkError> {
    let Some(stat) = retry_on_loss(|| client.check_stat(path)).await? else {
        return Ok(None);
    };
    if stat.ephemeral_owner == 0 {
        return Ok(None);
    }
    let names = match retry_on_loss(|| client.list_children(dir)).await {
        Ok(names) => names,
        Err(ZkError::NoNode) => return Ok(None),
        Err(err) => return Err(err),
    };
    for name in names {
        let registration = format!("{dir}/{name}");
        if let Some(registered) = retry_on_loss(|| client.check_stat(&registration)).await?
            && registered.ephemeral_owner == stat.ephemeral_owner
        {
            return Ok(Some(name));
        }
    }
    Ok(None)
}
