//! Several zkgate instances on one ensemble: who owns a lease, and where that instance is.
//!
//! All recipe state lives in ZooKeeper, so any instance reads any lock, leader or queue, and
//! serves any lease's holdings from their znodes. A lease's TTL, though, is timed by one
//! instance, its keeper ([crate::recipes::leases]); and a queue's claim by the instance that made it. So:
//! - each instance registers itself while its session lives: an ephemeral znode
//!   `<root>/instances/<id>` holding the URL it is reached at (`--advertise-url`), made by its
//!   primary session; each further session (lane, see [crate::zk::session]) makes
//!   `<root>/instances/<id>~<lane>`, and the keeper's session apart `<id>~keeper`. Any
//!   registration present means its instance is alive: the reaper takes over the leases of an
//!   instance whose registrations are all gone;
//! - a request for a lease kept by another instance is handed to that instance (see
//!   `http::handoff`), and one for a claim to the instance that made it (its id starts with
//!   that instance's).
//!
//! A registration is believed only when it is signed with the deployment's key and its znode
//! belongs to the session it names ([crate::peer]): whoever can write to ZooKeeper cannot
//! point another instance's hand-offs at itself. Each registration is watched, and made again
//! when it is lost, replaced or changed while its session lives (as well as on every new
//! session).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::peer::PeerKey;

use crate::recipes::presence;
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
    /// The session that made it: the znode's `ephemeralOwner` must be this one.
    #[serde(default)]
    session: i64,
    /// [PeerKey::sign_registration] of name, URL and session (absent without a key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mac: Option<String>,
}

/// The registrations under `<root>/instances`.
#[derive(Clone)]
pub struct Instances {
    zk: ZkSession,
    dir: Arc<str>,
    key: Option<PeerKey>,
    /// Whether the primary session's registration is in place now.
    registered: watch::Receiver<bool>,
    /// Whether the keeper's session's registration is in place now ([Instances::vouching]).
    vouching: watch::Receiver<bool>,
    /// Cancelled on the way out ([Instances::deregister]): the registrars stop making the
    /// registrations again.
    leaving: CancellationToken,
}

/// What [Instances::url_of] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Peer {
    /// A verified registration: forward to this URL.
    At(String),
    /// Not registered: the instance (and its leases) is gone.
    Gone,
    /// Registered, but not signed with this deployment's key by the session that owns it:
    /// never forwarded to.
    Unverified,
}

/// Separates an instance's id from a lane number in the names of lane registrations.
const LANE_SEPARATOR: char = '~';

/// The lane part of the keeper's session's registration (`<id>~keeper`).
const KEEPER_LANE: &str = "keeper";

impl Instances {
    /// Registers `me` on every session each lane's supervisor opens, and on the keeper's
    /// session (on its own thread), for as long as they run, signed with `key` if there is one.
    pub fn start(lanes: Lanes, root: &str, me: Instance, key: Option<PeerKey>) -> Instances {
        let (primary, registered) = watch::channel(false);
        let (keeper, vouching) = watch::channel(false);
        let instances = Instances {
            zk: lanes.primary().clone(),
            dir: presence::instances_dir(root).into(),
            key,
            registered,
            vouching,
            leaving: CancellationToken::new(),
        };
        let registrar = |zk: &ZkSession, name: String, registered| Registrar {
            dir: instances.dir.clone(),
            zk: zk.clone(),
            name,
            url: me.url.clone(),
            key: instances.key.clone(),
            registered,
            leaving: instances.leaving.clone(),
        };
        let apart = lanes.keeper();
        let keeper_name = format!("{}{LANE_SEPARATOR}{KEEPER_LANE}", me.id);
        apart
            .runtime
            .spawn(registrar(&apart.session, keeper_name, Some(keeper)).run());
        let mut primary = Some(primary);
        for lane in lanes.all() {
            let (name, registered) = match lane.lane() {
                0 => (me.id.to_string(), primary.take()),
                n => (format!("{}{LANE_SEPARATOR}{n}", me.id), None),
            };
            tokio::spawn(registrar(lane, name, registered).run());
        }
        instances
    }

    /// The key this instance signs and verifies with, if it has one.
    pub fn key(&self) -> Option<&PeerKey> {
        self.key.as_ref()
    }

    /// Whether this instance's registration is in place (its primary session's own node).
    pub fn registered(&self) -> bool {
        *self.registered.borrow()
    }

    /// A receiver of whether the keeper's session's registration is in place: while it is,
    /// the other instances see this one alive and take none of its leases over (any of an
    /// instance's registrations does), whatever became of its other sessions; so it is what a
    /// keeper may vouch on ([crate::recipes::leases::keeping]).
    pub fn vouching(&self) -> watch::Receiver<bool> {
        self.vouching.clone()
    }

    /// Returns once this instance's registration is in place.
    pub async fn wait_registered(&self) {
        let mut registered = self.registered.clone();
        // The sender lives as long as the registrar, which runs as long as the runtime.
        let _ = registered.wait_for(|now| *now).await;
    }

    /// Removes this instance's registration (on the way out, before its session closes), so
    /// that other instances answer "gone" for its leases at once instead of trying to reach it
    /// until ZooKeeper has processed the session's end.
    pub async fn deregister(&self, me: &Instance) {
        // First, or the registrar would see the node gone and make it again.
        self.leaving.cancel();
        // Not connected: the session's end will remove it; do not hold the shutdown up.
        let Ok(session) = self.zk.current() else {
            return;
        };
        let path = presence::registration(&self.dir, &me.id);
        if let Err(err) = presence::deregister(session.client(), &path).await {
            tracing::warn!(error = %err, "could not remove this instance's registration");
        }
    }

    /// Where a live instance is, if its registration verifies (see [Peer]).
    ///
    /// # Notable errors
    /// * Connection loss and the like when ZooKeeper cannot be asked.
    pub async fn url_of(&self, instance: &str) -> Result<Peer, ZkError> {
        let client = self
            .zk
            .connected()
            .await
            .map_err(|_| ZkError::ConnectionLoss)?
            .client()
            .clone();
        let path = presence::registration(&self.dir, instance);
        let Some((data, owner)) = presence::read(&client, &path).await? else {
            return Ok(Peer::Gone);
        };
        let Some(key) = &self.key else {
            return Ok(Peer::Unverified);
        };
        let verified = serde_json::from_slice::<Registration>(&data).ok().filter(|r| {
            r.session == owner
                && r.mac
                    .as_deref()
                    .is_some_and(|mac| key.verify_registration(instance, &r.url, r.session, mac))
        });
        Ok(match verified {
            Some(registration) => Peer::At(registration.url),
            None => {
                tracing::warn!(%instance, "a registration that does not verify (another --cluster-secret, or forged): not forwarding to it");
                Peer::Unverified
            }
        })
    }
}

/// Keeps one session's registration `<dir>/<name>` in place: made on each new session of
/// `zk`, and made again whenever it is lost or replaced while that session lives.
struct Registrar {
    dir: Arc<str>,
    zk: ZkSession,
    name: String,
    url: Arc<str>,
    key: Option<PeerKey>,
    /// Told whether the registration is in place (the primary lane's only).
    registered: Option<watch::Sender<bool>>,
    /// The instance is leaving: stop.
    leaving: CancellationToken,
}

impl Registrar {
    /// `registered` says whether this session's node is known to be in place: it becomes
    /// false when the session is replaced or the node is seen gone or another's, not when
    /// ZooKeeper merely cannot be asked for a moment (the node lives as long as the session).
    async fn run(self) {
        let mut status = self.zk.subscribe();
        let path = presence::registration(&self.dir, &self.name);
        loop {
            if self.leaving.is_cancelled() {
                self.set_registered(false);
                return;
            }
            let current = status.borrow_and_update().clone();
            let Some(client) = current.client else {
                self.set_registered(false);
                if status.changed().await.is_err() {
                    return;
                }
                continue;
            };
            let data = self.data(client.session_id().0);
            let error = match presence::register(&client, &self.dir, &self.name, |_| data.clone()).await {
                Ok(()) => {
                    self.set_registered(true);
                    tracing::info!(name = %self.name, url = %self.url, "instance registered");
                    // Held until it is lost, or the session is replaced.
                    let generation = current.generation;
                    let replaced = async {
                        while status.changed().await.is_ok() {
                            if status.borrow().generation != generation {
                                return false;
                            }
                        }
                        true
                    };
                    tokio::select! {
                        biased;
                        _ = self.leaving.cancelled() => {
                            self.set_registered(false);
                            return;
                        }
                        lost = presence::lost(&client, &path, &data) => match lost {
                            Ok(()) => {
                                self.set_registered(false);
                                tracing::warn!(name = %self.name, "this instance's registration was removed or replaced; registering again");
                                continue;
                            }
                            Err(err) => err,
                        },
                        closed = replaced => {
                            self.set_registered(false);
                            if closed {
                                return;
                            }
                            continue;
                        }
                    }
                }
                Err(err) => {
                    if !crate::zk::is_loss(&err) {
                        self.set_registered(false);
                    }
                    err
                }
            };
            tracing::warn!(name = %self.name, error = %error, "could not check this instance's registration; retrying");
            // A backoff before asking again (nothing to wait for), cut short by a new session.
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                changed = status.changed() => if changed.is_err() { return },
            }
        }
    }

    /// The registration's data for the session `session`.
    fn data(&self, session: i64) -> Vec<u8> {
        let registration = Registration {
            url: self.url.to_string(),
            session,
            mac: self
                .key
                .as_ref()
                .map(|key| key.sign_registration(&self.name, &self.url, session)),
        };
        serde_json::to_vec(&registration).unwrap_or_default()
    }

    fn set_registered(&self, now: bool) {
        if let Some(registered) = &self.registered {
            registered.send_replace(now);
        }
    }
}
