//! Several zkgate instances on one ensemble: who owns a lease, and where that instance is.
//!
//! All recipe state lives in ZooKeeper, so any instance reads any lock, leader or queue. A
//! lease, though, is kept alive by the instance that made it (its timer, its socket, its
//! ZooKeeper session, which its ephemeral znodes belong to). So that a load balancer without
//! stickiness works:
//! - every lease id, handle and claim an instance issues starts with the instance's id
//!   (`<8 hex>-<32 hex>`), and the znodes held for a lease record the lease (and so its
//!   instance): any instance can tell whose an id is without a lookup;
//! - each instance registers itself while its session lives: an ephemeral znode
//!   `<root>/instances/<id>` holding the URL it is reached at (`--advertise-url`), made by its
//!   primary session; each further session (lane, see [crate::zk::session]) makes
//!   `<root>/instances/<id>~<lane>`, so that the owner session of a member's znode names its
//!   instance whichever lane made it;
//! - a request naming another instance's lease, handle or claim is forwarded there
//!   ([crate::http::forward]); if that instance is gone, so are its leases (its session
//!   ended and its znodes with it), which is what the answer says.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::recipes::registry;
use crate::zk::ZkError;
use crate::zk::session::{Lanes, ZkSession};

/// This instance's identity.
#[derive(Clone, Debug)]
pub struct Instance {
    /// 8 lowercase hex digits, random at start.
    pub id: Arc<str>,
    /// The URL other instances forward to.
    pub url: Arc<str>,
}

impl Instance {
    pub fn new(url: String) -> Instance {
        Instance {
            id: crate::ids::new_instance_id().into(),
            url: url.into(),
        }
    }
}

/// What an instance's registration znode holds.
#[derive(Serialize, Deserialize)]
struct Registration {
    url: String,
}

/// The registrations under `<root>/instances`.
#[derive(Clone)]
pub struct Instances {
    zk: ZkSession,
    dir: Arc<str>,
}

/// Separates an instance's id from a lane number in the names of lane registrations.
const LANE_SEPARATOR: char = '~';

impl Instances {
    /// Registers `me` on every session each lane's supervisor opens, for as long as it runs.
    pub fn start(lanes: Lanes, root: &str, me: Instance) -> Instances {
        let instances = Instances {
            zk: lanes.primary().clone(),
            dir: format!("{root}/instances").into(),
        };
        for lane in lanes.all() {
            let name = match lane.lane() {
                0 => me.id.to_string(),
                n => format!("{}{LANE_SEPARATOR}{n}", me.id),
            };
            tokio::spawn(register_on_every_session(
                instances.dir.clone(),
                lane.clone(),
                name,
                me.clone(),
            ));
        }
        instances
    }

    /// Removes this instance's registration (on the way out, before its session closes), so
    /// that other instances answer "gone" for its leases at once instead of trying to reach it
    /// until ZooKeeper has processed the session's end.
    pub async fn deregister(&self, me: &Instance) {
        // Not connected: the session's end will remove it; do not hold the shutdown up.
        let Ok(session) = self.zk.current() else {
            return;
        };
        let path = format!("{}/{}", self.dir, me.id);
        if let Err(err) = registry::deregister(&session.client, &path).await {
            tracing::warn!(error = %err, "could not remove this instance's registration");
        }
    }

    /// The URL of a live instance; `None` when it is not registered (gone).
    ///
    /// # Notable errors
    /// * Connection loss and the like when ZooKeeper cannot be asked.
    pub async fn url_of(&self, instance: &str) -> Result<Option<String>, ZkError> {
        let client = self.zk.connected().await.map_err(|_| ZkError::ConnectionLoss)?.client;
        let path = format!("{}/{instance}", self.dir);
        let data = registry::read(&client, &path).await?;
        Ok(data.and_then(|data| serde_json::from_slice::<Registration>(&data).ok().map(|r| r.url)))
    }
}

impl Instances {
    /// The instance whose session owns the ephemeral znode at `path` (a member joined through
    /// it): found by matching the node's owner session with the registrations' (rare: only
    /// requests that land on the wrong instance ask). `None` if the node or its instance is gone.
    pub async fn owner_of_node(&self, path: &str) -> Result<Option<String>, ZkError> {
        let client = self.zk.connected().await.map_err(|_| ZkError::ConnectionLoss)?.client;
        let registration = registry::owner_of_node(&client, &self.dir, path).await?;
        Ok(registration.map(|name| name.split(LANE_SEPARATOR).next().unwrap_or_default().to_string()))
    }
}

/// The registration `<dir>/<name>` is ephemeral: it goes with the session (and the session's
/// leases), and is made again on each new session of `zk`.
async fn register_on_every_session(dir: Arc<str>, zk: ZkSession, name: String, me: Instance) {
    let mut status = zk.subscribe();
    let mut registered = None;
    loop {
        let current = status.borrow_and_update().clone();
        if let Some(client) = current.client.filter(|_| registered != Some(current.generation)) {
            let data = serde_json::to_vec(&Registration {
                url: me.url.to_string(),
            })
            .unwrap_or_default();
            let created = registry::register(&client, &dir, &name, &data).await;
            match created {
                Ok(()) => {
                    registered = Some(current.generation);
                    tracing::info!(instance = %me.id, lane = zk.lane(), url = %me.url, "instance registered");
                }
                Err(err) => {
                    tracing::warn!(error = %err, "could not register this instance; retrying on the next change")
                }
            }
        }
        if status.changed().await.is_err() {
            return;
        }
    }
}
