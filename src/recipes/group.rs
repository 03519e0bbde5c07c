//! Group membership, the guide's "out of the box" recipe: a group is a znode, each member an
//! ephemeral child of it named by the member, holding the member's data. ZooKeeper removes a
//! member when its session dies; zkgate also removes it when the lease it joined with ends,
//! so listing the children lists the live members.
//!
//! A member is a [Holding] of its lease: a small task waits for the lease to end (or for the
//! member to leave) and deletes the znode.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError};

use crate::lease::{Holding, HoldingView, Lease};
use crate::zk::retry_on_loss;

/// One member, joined on behalf of a lease.
pub struct Member {
    pub group: String,
    pub id: String,
    pub path: String,
    pub lease: Arc<Lease>,
    pub joined_at: SystemTime,
    leave: CancellationToken,
    finished: watch::Sender<bool>,
}

impl Holding for Member {
    fn view(&self) -> HoldingView {
        HoldingView {
            kind: "member",
            name: self.group.clone(),
            handle: self.id.clone(),
            state: if *self.finished.borrow() { "released" } else { "held" },
            fencing_token: None,
            revocation: None,
        }
    }

    fn finished(&self) -> watch::Receiver<bool> {
        self.finished.subscribe()
    }
}

impl Member {
    /// Leaves the group: deletes the znode and waits until it is gone.
    pub async fn leave(&self) {
        self.leave.cancel();
        let _ = self.finished.subscribe().wait_for(|f| *f).await;
    }
}

/// Why a join failed.
#[derive(Debug)]
pub enum JoinError {
    /// Another session already has a member of that id.
    Taken,
    /// The lease ended meanwhile.
    LeaseEnded,
    ZooKeeper(ZkError),
}

/// Joins `group` (whose znode is `dir`) as `id` with `data`, on behalf of `lease`. The group's
/// znode is created (persistent) if needed. A create whose reply was lost is recognised by the
/// member's znode being ours (its ephemeral owner is our session).
pub async fn join(
    client: &Client,
    dir: &str,
    group: &str,
    id: &str,
    data: &[u8],
    lease: &Arc<Lease>,
) -> Result<Arc<Member>, JoinError> {
    let path = format!("{dir}/{id}");
    let options = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
    loop {
        match client.create(&path, data, &options).await {
            Ok(_) => break,
            Err(ZkError::NoNode) => {
                crate::zk::session::ensure_path(client, dir)
                    .await
                    .map_err(JoinError::ZooKeeper)?;
            }
            Err(ZkError::NodeExists | ZkError::ConnectionLoss) => {
                match retry_on_loss(|| client.check_stat(&path)).await {
                    Ok(Some(stat)) if stat.ephemeral_owner == client.session_id().0 => break,
                    Ok(Some(_)) => return Err(JoinError::Taken),
                    Ok(None) => continue,
                    Err(err) => return Err(JoinError::ZooKeeper(err)),
                }
            }
            Err(err) => return Err(JoinError::ZooKeeper(err)),
        }
    }
    let member = Arc::new(Member {
        group: group.to_string(),
        id: id.to_string(),
        path,
        lease: lease.clone(),
        joined_at: SystemTime::now(),
        leave: CancellationToken::new(),
        finished: watch::Sender::new(false),
    });
    let holding: Arc<dyn Holding> = member.clone();
    if !lease.attach(holding.clone()) {
        delete_member(client, &member.path).await;
        return Err(JoinError::LeaseEnded);
    }
    let (client, watcher) = (client.clone(), member.clone());
    tokio::spawn(async move {
        tokio::select! {
            _ = watcher.leave.cancelled() => {}
            _ = watcher.lease.ended().cancelled() => {}
        }
        delete_member(&client, &watcher.path).await;
        watcher.finished.send_replace(true);
        watcher.lease.detach(&holding);
    });
    Ok(member)
}

async fn delete_member(client: &Client, path: &str) {
    match retry_on_loss(|| client.delete(path, None)).await {
        Ok(()) | Err(ZkError::NoNode | ZkError::SessionExpired | ZkError::ClientClosed) => {}
        Err(err) => tracing::warn!(%path, error = %err, "could not delete group member"),
    }
}

/// Members by (group, member id).
type MemberIndex = std::collections::HashMap<(String, String), Arc<Member>>;

/// The members joined through this instance.
#[derive(Clone)]
pub struct Groups {
    base: Arc<str>,
    members: Arc<std::sync::Mutex<MemberIndex>>,
}

impl Groups {
    pub fn new(root: &str) -> Groups {
        Groups {
            base: format!("{root}/groups").into(),
            members: Arc::default(),
        }
    }

    /// `<root>/groups`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The znode of `group` (already validated).
    pub fn dir(&self, group: &str) -> String {
        format!("{}/{}", self.base, group)
    }

    /// The live member `id` of `group` joined through this instance.
    pub fn member(&self, group: &str, id: &str) -> Option<Arc<Member>> {
        let members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        members
            .get(&(group.to_string(), id.to_string()))
            .filter(|m| !*m.finished.borrow())
            .cloned()
    }

    /// Joins (see [join]) and remembers the member until it leaves.
    pub async fn join(
        &self,
        client: &Client,
        group: &str,
        id: &str,
        data: &[u8],
        lease: &Arc<Lease>,
    ) -> Result<Arc<Member>, JoinError> {
        let member = join(client, &self.dir(group), group, id, data, lease).await?;
        let key = (group.to_string(), id.to_string());
        self.members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), member.clone());
        let (members, watched) = (self.members.clone(), member.clone());
        tokio::spawn(async move {
            let _ = watched.finished.subscribe().wait_for(|f| *f).await;
            let mut members = members.lock().unwrap_or_else(|e| e.into_inner());
            if members.get(&key).is_some_and(|m| Arc::ptr_eq(m, &watched)) {
                members.remove(&key);
            }
        });
        Ok(member)
    }
}
