//! Semaphores with N permits, on the znode layout and protocol of Curator's
//! `InterProcessSemaphoreV2`, so Curator semaphores and HTTP clients share the same permits.
//!
//! Under `<root>/semaphores/<name>`: `locks/` holds an exclusive lock (the lock recipe) that
//! serialises acquirers, and `leases/` holds one ephemeral sequential node per permit held
//! (`_c_<guid>-lease-<seq>`). An acquirer first takes the lock; then, as the only one doing
//! so, it creates its lease node and lists `leases/` with a children watch until at most N
//! lease nodes exist; then it releases the lock. So acquirers wait on the lock queue, each
//! watching only its predecessor, and only the lock holder watches the permits: a released
//! permit wakes one acquirer, not all of them (herd-free as far as the recipe allows).
//!
//! The number of permits is every participant's own setting in Curator; zkgate also records
//! it in the semaphore znode's data (`{"permits": N}`) and refuses a request that disagrees,
//! so HTTP clients cannot silently use two different limits.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use zookeeper_client::{Client, CreateMode, Error as ZkError, EventType};

use super::contender::{ContenderState, Next, Phase, ensure_dir, find_by_guid};
use super::{in_sequence_order, lock};
use crate::lease::{Holding, HoldingView, Lease};
use crate::zk::retry_on_loss;

/// The infix of Curator's lease node names.
pub const LEASE_INFIX: &str = "-lease-";

/// Why the permit count could not be settled.
#[derive(Debug)]
pub enum Settle {
    /// The semaphore was set up with another number of permits.
    Mismatch(u32),
    ZooKeeper(ZkError),
}

/// Makes sure the semaphore znode exists and records `permits`, or says what it records.
pub async fn settle_permits(client: &Client, dir: &str, permits: u32) -> Result<(), Settle> {
    let ours = serde_json::to_vec(&serde_json::json!({ "permits": permits })).unwrap_or_default();
    loop {
        match retry_on_loss(|| client.get_data(dir)).await {
            Ok((data, stat)) => {
                let recorded = serde_json::from_slice::<serde_json::Value>(&data)
                    .ok()
                    .and_then(|v| v.get("permits").and_then(|p| p.as_u64()));
                match recorded {
                    Some(n) if n == u64::from(permits) => return Ok(()),
                    Some(n) => return Err(Settle::Mismatch(n as u32)),
                    // Created by Curator (no record): record ours.
                    None => match retry_on_loss(|| client.set_data(dir, &ours, Some(stat.version))).await {
                        Ok(_) => return Ok(()),
                        Err(ZkError::BadVersion | ZkError::NoNode) => continue,
                        Err(err) => return Err(Settle::ZooKeeper(err)),
                    },
                }
            }
            Err(ZkError::NoNode) => {
                let options = CreateMode::Container.with_acls(crate::zk::acls());
                match retry_on_loss(|| client.create(dir, &ours, &options)).await {
                    Ok(_) => return Ok(()),
                    Err(ZkError::NodeExists) => continue,
                    Err(ZkError::NoNode) => {
                        let parent = &dir[..dir.rfind('/').unwrap_or(0)];
                        crate::zk::session::ensure_path(client, parent)
                            .await
                            .map_err(Settle::ZooKeeper)?;
                    }
                    Err(err) => return Err(Settle::ZooKeeper(err)),
                }
            }
            Err(err) => return Err(Settle::ZooKeeper(err)),
        }
    }
}

/// One lease's request for a permit, driven by its own task.
pub struct Permit {
    pub handle: String,
    pub semaphore: String,
    pub permits: u32,
    pub lease: Arc<Lease>,
    dir: String,
    lock_guid: String,
    lease_guid: String,
    state: watch::Sender<ContenderState>,
    release: CancellationToken,
    finished: watch::Sender<bool>,
    me: Mutex<Option<Arc<dyn Holding>>>,
}

impl Permit {
    pub fn state(&self) -> ContenderState {
        self.state.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<ContenderState> {
        self.state.subscribe()
    }

    /// Gives the permit back (or stops waiting) and waits until its znodes are gone.
    pub async fn release(&self) {
        self.release.cancel();
        let _ = self.finished.subscribe().wait_for(|f| *f).await;
    }

    fn set_phase(&self, phase: Phase) {
        self.state.send_modify(|s| s.phase = phase);
    }
}

impl Holding for Permit {
    fn view(&self) -> HoldingView {
        HoldingView {
            kind: "semaphore",
            name: self.semaphore.clone(),
            handle: self.handle.clone(),
            state: self.state.borrow().phase.name(),
            fencing_token: None,
            revocation: None,
        }
    }

    fn finished(&self) -> watch::Receiver<bool> {
        self.finished.subscribe()
    }
}

/// The permits asked for through this instance, by handle and by (lease, semaphore).
#[derive(Clone)]
pub struct Semaphores {
    base: Arc<str>,
    index: Arc<Mutex<Index>>,
}

#[derive(Default)]
struct Index {
    by_lease: std::collections::HashMap<(String, String), Arc<Permit>>,
    by_handle: std::collections::HashMap<String, Arc<Permit>>,
}

impl Semaphores {
    pub fn new(root: &str) -> Semaphores {
        Semaphores {
            base: format!("{root}/semaphores").into(),
            index: Arc::default(),
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// The znode of semaphore `name` (already validated).
    pub fn dir(&self, name: &str) -> String {
        format!("{}/{}", self.base, name)
    }

    /// The lease's permit request for `name`: the live one, or a new one. `None` if the lease
    /// ended meanwhile.
    pub fn request(&self, lease: &Arc<Lease>, name: &str, permits: u32) -> Option<Arc<Permit>> {
        let key = (lease.id.clone(), name.to_string());
        let mut index = self.lock_index();
        if let Some(existing) = index.by_lease.get(&key)
            && !existing.state().phase.is_final()
        {
            return Some(existing.clone());
        }
        let permit = Arc::new(Permit {
            handle: crate::ids::sibling_id(&lease.id),
            semaphore: name.to_string(),
            permits,
            lease: lease.clone(),
            dir: self.dir(name),
            lock_guid: uuid::Uuid::new_v4().to_string(),
            lease_guid: uuid::Uuid::new_v4().to_string(),
            state: watch::Sender::new(ContenderState {
                phase: Phase::Pending,
                node: None,
                granted: false,
                revocation: None,
            }),
            release: CancellationToken::new(),
            finished: watch::Sender::new(false),
            me: Mutex::new(None),
        });
        let holding: Arc<dyn Holding> = permit.clone();
        if !lease.attach(holding.clone()) {
            return None;
        }
        *permit.me.lock().unwrap_or_else(|e| e.into_inner()) = Some(holding);
        index.by_lease.insert(key, permit.clone());
        index.by_handle.insert(permit.handle.clone(), permit.clone());
        let (driven, index_ref) = (permit.clone(), self.index.clone());
        tokio::spawn(async move {
            drive(&driven).await;
            let mut index = index_ref.lock().unwrap_or_else(|e| e.into_inner());
            forget(&mut index, &driven);
        });
        Some(permit)
    }

    /// The permit with this handle, if it is semaphore `name`'s.
    pub fn by_handle(&self, name: &str, handle: &str) -> Option<Arc<Permit>> {
        self.lock_index()
            .by_handle
            .get(handle)
            .filter(|p| p.semaphore == name)
            .cloned()
    }

    /// Gives a permit back and forgets it.
    pub async fn release(&self, permit: &Arc<Permit>) {
        permit.release().await;
        forget(&mut self.lock_index(), permit);
    }

    fn lock_index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn forget(index: &mut Index, permit: &Arc<Permit>) {
    let key = (permit.lease.id.clone(), permit.semaphore.clone());
    if index.by_lease.get(&key).is_some_and(|p| Arc::ptr_eq(p, permit)) {
        index.by_lease.remove(&key);
    }
    index.by_handle.remove(&permit.handle);
}

/// Runs the recipe on the lease's own session (lane), which its znodes must live and die with.
async fn drive(permit: &Arc<Permit>) {
    let phase = match permit.lease.zk.connected().await {
        Err(_) => Phase::Failed {
            error: ZkError::ConnectionLoss,
        },
        Ok(session) if session.generation != permit.lease.generation => Phase::Lost {
            reason: "the lease's ZooKeeper session has ended".into(),
        },
        Ok(session) => {
            let client = session.client;
            let outcome = tokio::select! {
                outcome = acquire(permit, &client) => outcome,
                _ = permit.release.cancelled() => Ok(()),
                _ = permit.lease.ended().cancelled() => Ok(()),
            };
            // Whatever happened, the lock is given back and (unless held on) the lease node goes.
            remove(&client, &format!("{}/locks", permit.dir), &permit.lock_guid).await;
            let held_on =
                matches!(outcome, Ok(())) && !permit.release.is_cancelled() && !permit.lease.ended().is_cancelled();
            if held_on {
                // Held only now that the lock is given back: a caller told "granted" may ask
                // again at once, maybe on another of the instance's sessions, and must not
                // find its own previous request still in the queue.
                permit.state.send_modify(|s| {
                    s.phase = Phase::Held {
                        since: SystemTime::now(),
                    }
                });
                tokio::select! {
                    _ = permit.release.cancelled() => {}
                    _ = permit.lease.ended().cancelled() => {}
                }
            }
            remove(&client, &format!("{}/leases", permit.dir), &permit.lease_guid).await;
            match outcome {
                Ok(()) => Phase::Released,
                Err(ZkError::SessionExpired | ZkError::ClientClosed) => Phase::Lost {
                    reason: "the ZooKeeper session ended".into(),
                },
                Err(error) => Phase::Failed { error },
            }
        }
    };
    permit.set_phase(phase);
    permit.finished.send_replace(true);
    if let Some(me) = permit.me.lock().unwrap_or_else(|e| e.into_inner()).take() {
        permit.lease.detach(&me);
    }
}

/// Curator's protocol: take the lock, create the lease node, wait for at most N lease nodes,
/// give the lock back and hold (the caller does both).
async fn acquire(permit: &Permit, client: &Client) -> Result<(), ZkError> {
    let locks = format!("{}/locks", permit.dir);
    let leases = format!("{}/leases", permit.dir);
    // 1. The lock that serialises acquirers (the lock recipe: watch the predecessor only).
    let mine = create(client, &locks, &permit.lock_guid, lock::INFIX, permit).await?;
    loop {
        let children = retry_on_loss(|| client.list_children(&locks)).await?;
        match lock::next_step(&children, &mine) {
            Next::Hold => break,
            Next::Missing => return Err(ZkError::NoNode),
            Next::Wait { predecessor, position } => {
                // `position` acquirers are ahead of it in the queue.
                permit.set_phase(Phase::Waiting { position });
                let path = format!("{locks}/{predecessor}");
                if let (Some(_), watcher) = retry_on_loss(|| client.check_and_watch_stat(&path)).await?
                    && watcher.changed().await.event_type == EventType::Session
                {
                    return Err(ZkError::SessionExpired);
                }
            }
        }
    }
    // 2. The lease node, then wait (as the only acquirer doing so) for a free permit.
    let lease_node = create(client, &leases, &permit.lease_guid, LEASE_INFIX, permit).await?;
    loop {
        let (children, watcher) = retry_on_loss(|| client.list_and_watch_children(&leases)).await?;
        let ordered = in_sequence_order(&children);
        let position = ordered
            .iter()
            .position(|&(_, name)| name == lease_node)
            .ok_or(ZkError::NoNode)?;
        if ordered.len() <= permit.permits as usize || position < permit.permits as usize {
            return Ok(());
        }
        // First in the queue, waiting for a permit to be given back.
        permit.set_phase(Phase::Waiting { position: 0 });
        if watcher.changed().await.event_type == EventType::Session {
            return Err(ZkError::SessionExpired);
        }
    }
}

/// Creates `<dir>/_c_<guid><infix>` (ephemeral sequential, naming the permit's lease and handle),
/// adopting it by GUID after a lost reply; returns its name.
async fn create(client: &Client, dir: &str, guid: &str, infix: &str, permit: &Permit) -> Result<String, ZkError> {
    let prefix = format!("{dir}/_c_{guid}{infix}");
    let options = CreateMode::EphemeralSequential.with_acls(crate::zk::acls());
    let data = serde_json::json!({ "lease": permit.lease.id, "handle": permit.handle }).to_string();
    loop {
        match client.create(&prefix, data.as_bytes(), &options).await {
            Ok((_, sequence)) => return Ok(format!("_c_{guid}{infix}{sequence}")),
            Err(ZkError::NoNode) => ensure_dir(client, dir).await?,
            Err(err) if crate::zk::is_loss(&err) => {
                if let Some(node) = find_by_guid(client, dir, guid).await? {
                    return Ok(node.name);
                }
            }
            Err(err) => return Err(err),
        }
    }
}

/// Deletes our node (by GUID) under `dir`, if there is one.
async fn remove(client: &Client, dir: &str, guid: &str) {
    if let Ok(Some(node)) = find_by_guid(client, dir, guid).await {
        let path = format!("{dir}/{}", node.name);
        match retry_on_loss(|| client.delete(&path, None)).await {
            Ok(()) | Err(ZkError::NoNode | ZkError::SessionExpired | ZkError::ClientClosed) => {}
            Err(err) => tracing::warn!(%path, error = %err, "could not delete semaphore node"),
        }
    }
}
