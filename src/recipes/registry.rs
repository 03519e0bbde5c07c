//! A registry of live processes: each registers an ephemeral znode (its name, some data) under
//! one directory while its session lives, the guide's group membership used by zkgate's
//! instances for themselves ([crate::instances] says what they register and why).

use zookeeper_client::{Client, CreateMode, Error as ZkError};

use crate::zk::retry_on_loss;

/// Registers `<dir>/<name>` (ephemeral) holding `data`, creating `dir` if needed. A node that
/// is already there counts as registered.
pub async fn register(client: &Client, dir: &str, name: &str, data: &[u8]) -> Result<(), ZkError> {
    let path = format!("{dir}/{name}");
    let options = CreateMode::Ephemeral.with_acls(crate::zk::acls());
    match retry_on_loss(|| client.create(&path, data, &options)).await {
        Ok(_) | Err(ZkError::NodeExists) => Ok(()),
        Err(ZkError::NoNode) => {
            let parent = CreateMode::Persistent.with_acls(crate::zk::acls());
            match client.create(dir, &[], &parent).await {
                Ok(_) | Err(ZkError::NodeExists) => client.create(&path, data, &options).await.map(|_| ()),
                Err(err) => Err(err),
            }
        }
        Err(err) => Err(err),
    }
}

/// Removes the registration `path`, if it is there.
pub async fn deregister(client: &Client, path: &str) -> Result<(), ZkError> {
    match retry_on_loss(|| client.delete(path, None)).await {
        Ok(()) | Err(ZkError::NoNode) => Ok(()),
        Err(err) => Err(err),
    }
}

/// The data of the registration `path`; `None` when it is not registered.
pub async fn read(client: &Client, path: &str) -> Result<Option<Vec<u8>>, ZkError> {
    match retry_on_loss(|| client.get_data(path)).await {
        Ok((data, _)) => Ok(Some(data)),
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
