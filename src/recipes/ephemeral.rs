//! Lease-bound ephemeral znodes: a group member (the guide's group membership: each member an
//! ephemeral child of the group's znode, holding its data) and a barrier bound to its owner.
//!
//! ZooKeeper removes such a node when zkgate's session dies; zkgate also removes it when the
//! lease it was made for ends. The node is a [Holding] of the lease: a small task waits for
//! the lease to end (or for an explicit removal) and deletes it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use zookeeper_client::{Client, CreateMode, Error as ZkError};

use crate::lease::{Holding, HoldingView, Lease};
use crate::zk::retry_on_loss;

/// One lease-bound ephemeral node.
pub struct BoundNode {
    /// What it is, as shown on the lease: `member`, `barrier`.
    pub kind: &'static str,
    /// The resource (a group, a barrier).
    pub resource: String,
    /// Its id in the resource (a member id; a barrier's own name).
    pub id: String,
    pub path: String,
    pub lease: Arc<Lease>,
    pub created_at: SystemTime,
    remove: CancellationToken,
    finished: watch::Sender<bool>,
}

impl Holding for BoundNode {
    fn view(&self) -> HoldingView {
        HoldingView {
            kind: self.kind,
            name: self.resource.clone(),
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

impl BoundNode {
    /// Deletes the node (leaves the group, lowers the barrier) and waits until it is gone.
    pub async fn remove(&self) {
        self.remove.cancel();
        let _ = self.finished.subscribe().wait_for(|f| *f).await;
    }

    fn is_live(&self) -> bool {
        !*self.finished.borrow()
    }
}

/// Why a bound node could not be made.
#[derive(Debug)]
pub enum BindError {
    /// Another session already has a node there.
    Taken,
    /// The lease ended meanwhile.
    LeaseEnded,
    ZooKeeper(ZkError),
}

/// Nodes by (resource, id).
type NodeIndex = HashMap<(String, String), Arc<BoundNode>>;

/// The bound nodes of one kind made through this instance.
#[derive(Clone)]
pub struct BoundNodes {
    kind: &'static str,
    base: Arc<str>,
    nodes: Arc<Mutex<NodeIndex>>,
}

impl BoundNodes {
    /// Nodes of `kind` under `<root>/<kind_dir>`.
    pub fn new(root: &str, kind: &'static str, kind_dir: &str) -> BoundNodes {
        BoundNodes {
            kind,
            base: format!("{root}/{kind_dir}").into(),
            nodes: Arc::default(),
        }
    }

    /// `<root>/<kind_dir>`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The znode of `resource` (already validated).
    pub fn dir(&self, resource: &str) -> String {
        format!("{}/{}", self.base, resource)
    }

    /// The live node `id` of `resource` made through this instance.
    pub fn get(&self, resource: &str, id: &str) -> Option<Arc<BoundNode>> {
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        nodes
            .get(&(resource.to_string(), id.to_string()))
            .filter(|n| n.is_live())
            .cloned()
    }

    /// Creates the ephemeral node `<parent>/<id>` holding `data`, bound to `lease`, and
    /// remembers it until it goes. `parent` is created (persistent) if needed. A create whose
    /// reply was lost is recognised by the node being ours (its ephemeral owner is our
    /// session).
    pub async fn bind(
        &self,
        client: &Client,
        parent: &str,
        resource: &str,
        id: &str,
        data: &[u8],
        lease: &Arc<Lease>,
    ) -> Result<Arc<BoundNode>, BindError> {
        let path = format!("{parent}/{id}");
        create(client, parent, &path, data).await?;
        let node = Arc::new(BoundNode {
            kind: self.kind,
            resource: resource.to_string(),
            id: id.to_string(),
            path,
            lease: lease.clone(),
            created_at: SystemTime::now(),
            remove: CancellationToken::new(),
            finished: watch::Sender::new(false),
        });
        let holding: Arc<dyn Holding> = node.clone();
        if !lease.attach(holding.clone()) {
            delete(client, &node.path).await;
            return Err(BindError::LeaseEnded);
        }
        let key = (resource.to_string(), id.to_string());
        self.nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), node.clone());
        let (client, watched, nodes) = (client.clone(), node.clone(), self.nodes.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = watched.remove.cancelled() => {}
                _ = watched.lease.ended().cancelled() => {}
            }
            delete(&client, &watched.path).await;
            watched.finished.send_replace(true);
            watched.lease.detach(&holding);
            let mut nodes = nodes.lock().unwrap_or_else(|e| e.into_inner());
            if nodes.get(&key).is_some_and(|n| Arc::ptr_eq(n, &watched)) {
                nodes.remove(&key);
            }
        });
        Ok(node)
    }
}

async fn create(client: &Client, parent: &str, path: &str, data: &[u8]) -> Result<(), BindError> {
    let options = CreateMode::Ephemeral.with_acls(crate::zk::acls());
    loop {
        match client.create(path, data, &options).await {
            Ok(_) => return Ok(()),
            Err(ZkError::NoNode) => {
                crate::zk::session::ensure_path(client, parent)
                    .await
                    .map_err(BindError::ZooKeeper)?;
            }
            Err(err) if err == ZkError::NodeExists || crate::zk::is_loss(&err) => {
                match retry_on_loss(|| client.check_stat(path)).await {
                    Ok(Some(stat)) if stat.ephemeral_owner == client.session_id().0 => return Ok(()),
                    Ok(Some(_)) => return Err(BindError::Taken),
                    Ok(None) => continue,
                    Err(err) => return Err(BindError::ZooKeeper(err)),
                }
            }
            Err(err) => return Err(BindError::ZooKeeper(err)),
        }
    }
}

async fn delete(client: &Client, path: &str) {
    match retry_on_loss(|| client.delete(path, None)).await {
        Ok(()) | Err(ZkError::NoNode | ZkError::SessionExpired | ZkError::ClientClosed) => {}
        Err(err) => tracing::warn!(%path, error = %err, "could not delete a lease-bound node"),
    }
}
