//! Presence: each live process registers an ephemeral znode (its name, some data) under
//! one directory while its session lives, the guide's group membership used by zkgate's
//! instances for themselves ([crate::instances] says what they register and why); and the
//! leadership nodes by which one instance of the cluster does a job (the janitor, the reaper).

use zookeeper_client::{Client, CreateMode, Error as ZkError};

use crate::zk::retry_on_loss;

/// `<root>/instances`: where zkgate's instances register.
pub fn instances_dir(root: &str) -> String {
    format!("{root}/instances")
}

/// `<dir>/<name>`: the registration `name` in `dir`.
pub fn registration(dir: &str, name: &str) -> String {
    format!("{dir}/{name}")
}

/// `<root>/<job>`: the leadership node of the one instance that does `job` (`janitor`,
/// `reaper`).
pub fn leadership(root: &str, job: &str) -> String {
    format!("{root}/{job}")
}

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
    let path = registration(dir, name);
    let options = CreateMode::Ephemeral.with_acls(crate::zk::acls());
    let mine = client.session_id().0;
    let data = &data(mine)[..];
    loop {
        match retry_on_loss(|| client.create(&path, data, &options)).await {
            Ok(_) => return Ok(()),
            Err(ZkError::NoNode) => crate::recipes::create_if_absent(client, dir, CreateMode::Persistent).await?,
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

/// Returns once the registration `path` is no longer this session's as made: deleted,
/// replaced by another session's node, or its data changed by another client (so that a
/// registration pointing elsewhere is made again rather than believed). An error when
/// ZooKeeper cannot be asked (look again later).
pub async fn lost(client: &Client, path: &str, data: &[u8]) -> Result<(), ZkError> {
    let mine = client.session_id().0;
    loop {
        let (current, stat, watcher) = match client.get_and_watch_data(path).await {
            Ok(read) => read,
            Err(ZkError::NoNode) => return Ok(()),
            Err(err) => return Err(err),
        };
        if stat.ephemeral_owner != mine || current != data {
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
    Ok(crate::zk::data(client, path)
        .await?
        .map(|(data, stat)| (data, stat.ephemeral_owner)))
}

/// The instances registered under `<root>/instances` now, by id (a lane's registration is
/// `<id>~<lane>`).
pub async fn live_instances(client: &Client, root: &str) -> Result<std::collections::HashSet<String>, ZkError> {
    let names = crate::zk::children(client, &instances_dir(root)).await?;
    Ok(names
        .into_iter()
        .map(|name| name.split('~').next().unwrap_or_default().to_string())
        .collect())
}

/// The names registered under `dir`, with a watch for the next change.
pub async fn members_and_watch(
    client: &Client,
    dir: &str,
) -> Result<(Vec<String>, zookeeper_client::OneshotWatcher), ZkError> {
    loop {
        match retry_on_loss(|| client.list_and_watch_children(dir)).await {
            Ok(listed) => return Ok(listed),
            Err(ZkError::NoNode) => crate::recipes::create_if_absent(client, dir, CreateMode::Persistent).await?,
            Err(err) => return Err(err),
        }
    }
}

/// Whether this session holds (or now takes) the leadership node `path` (ephemeral, holding
/// `data`): one instance of the cluster at a time does the work it stands for. A create whose
/// reply was lost is ours if the node's owner is our session.
pub async fn lead(client: &Client, path: &str, data: &[u8]) -> Result<bool, ZkError> {
    let options = CreateMode::Ephemeral.with_acls(crate::zk::acls());
    let ours = client.session_id().0;
    if let Some(stat) = retry_on_loss(|| client.check_stat(path)).await? {
        return Ok(stat.ephemeral_owner == ours);
    }
    match client.create(path, data, &options).await {
        Ok(_) => Ok(true),
        Err(err) if err == ZkError::NodeExists || crate::zk::is_loss(&err) => {
            Ok(retry_on_loss(|| client.check_stat(path))
                .await?
                .is_some_and(|s| s.ephemeral_owner == ours))
        }
        Err(ZkError::NoNode) => {
            let parent = &path[..path.rfind('/').unwrap_or(0)];
            crate::zk::session::ensure_path(client, parent).await?;
            Ok(false)
        }
        Err(err) => Err(err),
    }
}

/// Waits until the leadership node `path`, held by another session, goes (an exists-watch, no
/// polling); at once if it is not there or is ours.
pub async fn await_leader_gone(client: &Client, path: &str) -> Result<(), ZkError> {
    match retry_on_loss(|| client.check_and_watch_stat(path)).await? {
        (Some(stat), watcher) if stat.ephemeral_owner != client.session_id().0 => {
            watcher.changed().await;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Gives the leadership node `path` back if this session holds it (on the way out, so that
/// another instance takes over at once rather than when the session ends).
pub async fn resign(client: &Client, path: &str) {
    if let Ok(Some(stat)) = client.check_stat(path).await
        && stat.ephemeral_owner == client.session_id().0
    {
        let _ = client.delete(path, None).await;
    }
}
