//! The reaper: when an instance goes (a crash, a partition, a shutdown), one of the survivors
//! takes over every lease it kept, so that none ends because an instance stopped.
//!
//! One instance of the cluster is the reaper at a time: it holds the ephemeral `<root>/reaper`
//! on its primary session (elected as the janitor is; the others wait on an exists-watch). It
//! makes a pass when it becomes the reaper, whenever the registrations under
//! `<root>/instances` change (a child watch), and every half [TOMBSTONE]. A pass reads every
//! lease record and:
//! - takes over each live lease whose keeper is not registered ([Leases::adopt]): it lives on
//!   from what its keeper can last have acknowledged, [FRESH](super::FRESH) plus its TTL after
//!   its keeper was last seen, and ends then unless a client keeps it alive through any
//!   instance meanwhile. One whose time has passed already (every instance was gone for longer
//!   than its TTL) ends at once: its waiters are granted;
//! - finishes the end of a lease whose ender went before its holdings were gone;
//! - removes tombstones older than [TOMBSTONE], and the keeper nodes of instances gone for
//!   good;
//! - when it is its first pass or an instance went since the last, takes over the timing of
//!   the queue claims of every instance gone ([Queues::adopt_orphans]): each is given back at
//!   its ack deadline unless acknowledged through any instance meanwhile.
//!
//! Taking over is a write conditional on the record's version, so a reaper racing a client's
//! request that takes the same lease over (see [super::takeover]) cannot keep it twice.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use crate::zk::{Client, ZkError};
use futures::StreamExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{HEARTBEAT, Leases, TOMBSTONE};
use crate::locked::Locked;
use crate::recipes::lease::record;
use crate::recipes::queue::service::Queues;
use crate::recipes::registry;
use crate::zk::session::ZkSession;

/// Leases taken over at once in a pass.
const CONCURRENT: usize = 32;

/// Starts this instance's reaper task (it reaps when it is elected) until `shutdown`. The
/// receiver turns `true` once a pass has run here, or another instance is the reaper.
pub fn start(
    leases: Leases,
    queues: Queues,
    zk: ZkSession,
    root: &str,
    shutdown: CancellationToken,
) -> watch::Receiver<bool> {
    let (reaped, receiver) = watch::channel(false);
    let reaper = Reaper {
        leases,
        queues,
        root: root.to_string(),
        reaped,
        claims_swept_with: Mutex::new(None),
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = reaper.run(zk.clone()) => {}
            _ = shutdown.cancelled() => {}
        }
        if let Ok(session) = zk.current() {
            let path = format!("{}/reaper", reaper.root);
            let _ = tokio::time::timeout(HEARTBEAT, registry::resign(session.client(), &path)).await;
        }
    });
    receiver
}

struct Reaper {
    leases: Leases,
    queues: Queues,
    root: String,
    reaped: watch::Sender<bool>,
    /// The instances registered when the claims were last swept (`None`: not yet, since this
    /// instance became the reaper): claims are swept again once one of them goes.
    claims_swept_with: Mutex<Option<HashSet<String>>>,
}

/// What a pass did.
#[derive(Debug, Default)]
struct Swept {
    taken_over: usize,
    tombstones: usize,
    keepers: usize,
    claims: usize,
}

impl Reaper {
    async fn run(&self, zk: ZkSession) {
        let lock = format!("{}/reaper", self.root);
        let instances = format!("{}/instances", self.root);
        loop {
            let Ok(session) = zk.connected().await else {
                let mut status = zk.subscribe();
                let _ = tokio::time::timeout(HEARTBEAT, status.changed()).await;
                continue;
            };
            let client = session.client();
            match registry::lead(client, &lock, self.leases.instance().as_bytes()).await {
                Ok(true) => match registry::members_and_watch(client, &instances).await {
                    Ok((registered, watcher)) => {
                        if !self.pass_reported(client, &registered).await {
                            let _ = tokio::time::timeout(HEARTBEAT, self.leases.next_heartbeat()).await;
                            continue;
                        }
                        tokio::select! {
                            _ = watcher.changed() => {}
                            _ = tokio::time::sleep(TOMBSTONE / 2) => {}
                        }
                    }
                    Err(_) => tokio::time::sleep(HEARTBEAT).await,
                },
                Ok(false) => {
                    *self.claims_swept_with.locked() = None;
                    self.reaped.send_replace(true);
                    if registry::await_leader_gone(client, &lock).await.is_err() {
                        tokio::time::sleep(HEARTBEAT).await;
                    }
                }
                Err(_) => tokio::time::sleep(HEARTBEAT).await,
            }
        }
    }

    /// Makes a pass and reports it (the instance is ready once one is done here, so that a lease
    /// whose time ran out while no instance was up ends before this one serves). `false` if
    /// none could be made, to be tried again: ZooKeeper failed it, or no heartbeat of this
    /// instance has been answered yet. A lease's expiry is judged by ZooKeeper's clock, which
    /// the heartbeats tell; without it a pass could judge nothing (it once counted as done,
    /// and an instance started right after an outage served a lock held by a lease that had
    /// expired during it until its next pass, half a minute later).
    async fn pass_reported(&self, client: &Client, registered: &[String]) -> bool {
        let Some(now) = self.leases.inner.keeping.server_now() else {
            return false;
        };
        match self.pass(client, registered, now).await {
            Ok(swept) => {
                if swept.taken_over + swept.tombstones + swept.keepers + swept.claims > 0 {
                    tracing::info!(?swept, "reaper pass");
                }
                self.reaped.send_replace(true);
                true
            }
            Err(err) => {
                tracing::warn!(error = %err, "reaper pass failed; trying again");
                false
            }
        }
    }

    /// One pass over every lease record (see the module's docs), at ZooKeeper's time `now`.
    async fn pass(&self, client: &Client, registered: &[String], now: i64) -> Result<Swept, ZkError> {
        let mut swept = Swept::default();
        // The keeper's own registration (a lane's is `<id>~<lane>`).
        let live: HashSet<&str> = registered
            .iter()
            .map(|name| name.split('~').next().unwrap_or_default())
            .collect();
        let seen: HashMap<String, i64> = record::keepers(client, &self.root).await?.into_iter().collect();
        let records = record::read_all(client, &self.root).await?;
        let me = self.leases.instance();
        let mut orphans = Vec::new();
        let mut keeping = HashSet::new();
        for (id, found) in records {
            let keeper = found.record.keeper.as_str();
            let gone = !live.contains(keeper) && keeper != me;
            match found.record.ended_ms {
                Some(_) if found.holdings > 0 && gone => orphans.push((id, found, now)),
                Some(ended) if found.holdings == 0 && now.saturating_sub(ended) >= TOMBSTONE.as_millis() as i64 => {
                    let path = record::path(&self.root, &id);
                    if record::remove_tombstone(client, &path).await? {
                        swept.tombstones += 1;
                    }
                }
                Some(_) => {}
                None if gone => {
                    let last_seen = seen.get(keeper).copied().unwrap_or(now);
                    orphans.push((id, found, last_seen));
                }
                None => {
                    keeping.insert(found.record.keeper.clone());
                }
            }
        }
        let adopted = futures::stream::iter(orphans)
            .map(|(id, found, last_seen)| async move { self.leases.adopt(&id, &found, last_seen).await.is_ok() })
            .buffer_unordered(CONCURRENT)
            .filter(|adopted| std::future::ready(*adopted))
            .count()
            .await;
        swept.taken_over = adopted;
        for keeper in seen.keys() {
            if !live.contains(keeper.as_str()) && keeper != me && !keeping.contains(keeper) {
                record::forget_keeper(client, &self.root, keeper).await?;
                swept.keepers += 1;
            }
        }
        swept.claims = self.sweep_claims(client, &live).await?;
        Ok(swept)
    }

    /// Adopts the claims of instances gone, on the first pass and after an instance went.
    async fn sweep_claims(&self, client: &Client, live: &HashSet<&str>) -> Result<usize, ZkError> {
        let now: HashSet<String> = live.iter().map(|id| id.to_string()).collect();
        let due = match &*self.claims_swept_with.locked() {
            Some(before) => !before.is_subset(&now),
            None => true,
        };
        if !due {
            return Ok(0);
        }
        let adopted = self.queues.adopt_orphans(client, live).await?;
        *self.claims_swept_with.locked() = Some(now);
        Ok(adopted)
    }
}
