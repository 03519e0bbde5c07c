//! The reaper: when an instance goes (a crash, a partition, a shutdown), one of the survivors
//! takes over every lease it kept, so that none ends because an instance stopped.
//!
//! One instance of the cluster is the reaper at a time: it holds the ephemeral `<root>/reaper`
//! on its primary session (elected as the janitor is; the others wait on an exists-watch). It
//! makes a pass when it becomes the reaper, whenever the registrations under
//! `<root>/instances` change (a child watch), and every half [TOMBSTONE]. A pass reads every
//! lease record and:
//! - takes over each live lease whose keeper is not registered ([Leases::keep_taken_over]): it lives on
//!   from what its keeper can last have acknowledged, [FRESH](super::FRESH) plus its TTL after
//!   its keeper was last seen, and ends then unless a client keeps it alive through any
//!   instance meanwhile. One whose time has passed already (every instance was gone for longer
//!   than its TTL) ends at once: its waiters are granted;
//! - finishes the end of a lease whose ender went before its holdings were gone (or left some
//!   behind for a tombstone's while);
//! - drives the holdings an instance gone drove for leases that live instances keep;
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
use crate::recipes::engine::{keepers, record};
use crate::recipes::presence;
use crate::recipes::queues::service::Queues;
use crate::zk::session::ZkSession;

/// Leases taken over at once in a pass.
const CONCURRENT: usize = 32;

/// The job whose leadership node elects the reaper.
const REAPER: &str = "reaper";

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
        registered_at_last_pass: Mutex::new(None),
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = reaper.run(zk.clone()) => {}
            _ = shutdown.cancelled() => {}
        }
        if let Ok(session) = zk.current() {
            let path = presence::leadership(&reaper.root, REAPER);
            let _ = tokio::time::timeout(HEARTBEAT, presence::resign(session.client(), &path)).await;
        }
    });
    receiver
}

struct Reaper {
    leases: Leases,
    queues: Queues,
    root: String,
    reaped: watch::Sender<bool>,
    /// The instances registered at the last pass that completed (`None`: none yet, since this
    /// instance became the reaper): what they made is swept once one of them goes. (It was
    /// updated only when claims were swept, so an instance that registered after the reaper's
    /// first sweep could go unnoticed.)
    registered_at_last_pass: Mutex<Option<HashSet<String>>>,
}

/// What a pass did.
#[derive(Debug, Default)]
struct Swept {
    taken_over: usize,
    holdings: usize,
    tombstones: usize,
    keepers: usize,
    claims: usize,
}

impl Reaper {
    async fn run(&self, zk: ZkSession) {
        let lock = presence::leadership(&self.root, REAPER);
        let instances = presence::instances_dir(&self.root);
        loop {
            let Some(session) = zk.next_session(None).await else {
                return; // the instance is shutting down
            };
            let client = session.client();
            match presence::lead(client, &lock, self.leases.instance().as_bytes()).await {
                Ok(true) => match presence::members_and_watch(client, &instances).await {
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
                    *self.registered_at_last_pass.locked() = None;
                    self.reaped.send_replace(true);
                    if presence::await_leader_gone(client, &lock).await.is_err() {
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
                if swept.taken_over + swept.holdings + swept.tombstones + swept.keepers + swept.claims > 0 {
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
        let seen: HashMap<String, i64> = keepers::keepers(client, &self.root).await?.into_iter().collect();
        let records = record::read_all(client, &self.root).await?;
        let me = self.leases.instance();
        let went = self.an_instance_went(&live);
        if went {
            swept.holdings = self.adopt_holdings_of_the_gone(client, &live, &records).await?;
        }
        let mut orphans = Vec::new();
        let mut keeping = HashSet::new();
        for (id, found) in records {
            let keeper = found.record.keeper.as_str();
            let gone = !live.contains(keeper) && keeper != me;
            match found.record.ended_ms {
                // Its ender went before its holdings were gone; or, a tombstone's while after,
                // holdings are left that its ender did not find (made through an instance
                // whose holding records it could not read then).
                Some(ended)
                    if found.holdings > 0 && (gone || now.saturating_sub(ended) >= TOMBSTONE.as_millis() as i64) =>
                {
                    orphans.push((id, found, now))
                }
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
        let adopted =
            futures::stream::iter(orphans)
                .map(|(id, found, last_seen)| async move {
                    self.leases.keep_taken_over(&id, &found, last_seen).await.is_ok()
                })
                .buffer_unordered(CONCURRENT)
                .filter(|adopted| std::future::ready(*adopted))
                .count()
                .await;
        swept.taken_over = adopted;
        for keeper in seen.keys() {
            if !live.contains(keeper.as_str()) && keeper != me && !keeping.contains(keeper) {
                keepers::forget_keeper(client, &self.root, keeper).await?;
                swept.keepers += 1;
            }
        }
        if went {
            swept.claims = self.queues.adopt_orphans(client, &live).await?;
        }
        *self.registered_at_last_pass.locked() = Some(live.iter().map(|id| id.to_string()).collect());
        Ok(swept)
    }

    /// Whether an instance went since the last pass (or this is the first, since this instance
    /// became the reaper): then the claims it made are timed here, and the holdings it drove
    /// for leases others keep are driven here.
    fn an_instance_went(&self, live: &HashSet<&str>) -> bool {
        match &*self.registered_at_last_pass.locked() {
            Some(before) => before.iter().any(|id| !live.contains(id.as_str())),
            None => true,
        }
    }

    /// Takes up the holdings that instances gone drove for leases that live instances keep
    /// (visitors' holdings, see [super::visiting]): this instance drives them from now on, and
    /// their holding records say so. A lease whose keeper is gone is not read here: its new keeper
    /// adopts every holding whose driver is gone. Returns how many it adopted.
    async fn adopt_holdings_of_the_gone(
        &self,
        client: &Client,
        live: &HashSet<&str>,
        records: &[(String, record::Found)],
    ) -> Result<usize, ZkError> {
        let me = self.leases.instance();
        let alive = |id: &str| live.contains(id) || id == me;
        let mut taken = 0;
        for (id, found) in records {
            if found.holdings == 0 || found.record.ended.is_some() || !alive(&found.record.keeper) {
                continue;
            }
            let path = record::path(&self.root, id);
            let orphans: Vec<(String, record::HoldingRecord)> = record::holdings(client, &path)
                .await?
                .into_iter()
                .filter(|(_, h)| h.driver.as_deref().is_some_and(|d| !alive(d)))
                .collect();
            if orphans.is_empty() {
                continue;
            }
            let Ok(lease) = self.leases.serve(&crate::auth::Caller::Anyone, id).await else {
                continue;
            };
            let mut still = Vec::with_capacity(orphans.len());
            for (name, holding) in orphans {
                if record::redrive(client, &path, &name, &holding, me).await? {
                    still.push((name, holding));
                }
            }
            let orphans = still;
            taken += orphans.len();
            tracing::info!(lease = %id, holdings = orphans.len(), "holdings of an instance gone adopted");
            self.leases.adopt_holdings(&lease, orphans);
        }
        Ok(taken)
    }
}
