//! Keeps zkgate's tree bounded under churn: what the recipes leave behind once it has served
//! its purpose is removed, by one instance of the cluster at a time, at a bounded rate.
//!
//! What stays without it, and what happens to it:
//!
//! - Idempotency keys (`<root>/idempotency/<principal>/<id>`, [crate::recipes::idempotency]): kept for
//!   `--idempotency-window` (24 h) after the write, then forgotten with their charges; a retry
//!   after that is a new write. (Keys of earlier versions, under each queue's `keys/`,
//!   `<root>/counter-keys` and `<root>/kv-txn-keys`, go the same way, until none is left.)
//! - Finished two-phase-commit transactions (their members, votes and decision): readable for
//!   `--txn-retention` (24 h) after the decision, then removed.
//! - Empty resource znodes that ZooKeeper does not remove itself: a queue with no items,
//!   claims, dead letters or keys; a double barrier nobody is in; a group or service created
//!   before their znodes were containers. Each is removed once it has been seen empty, and
//!   unchanged, on two passes in a row (so a resource between two uses is not taken away under
//!   a client), with a delete that fails if anything came meanwhile.
//!
//! Locks, read/write locks, semaphores and elections, and groups and services now, are
//! ZooKeeper *container* znodes (as Curator's are): ZooKeeper itself removes them once their
//! last child is gone (`znode.container.checkIntervalMs`, 60 s on a stock server).
//!
//! **One janitor per cluster.** An instance is the janitor while it holds the ephemeral
//! `<root>/janitor` on its primary session; the others wait on an exists-watch for it to go
//! (no polling), so that several instances do not race on the same deletions. Whoever holds it
//! when its session ends hands over through ZooKeeper. (Two janitors at once, during a
//! handover, would only try the same deletions, each conditional: no harm.)
//!
//! **Bounded.** Deletions go at most `--janitor-rate` a second (a token bucket), in multi-ops
//! of at most [crate::zk::multi::DELETE_BATCH]; listings and stats are multi-reads ([crate::zk::stat_each]).

use crate::zk::multi::DELETE_BATCH;
use std::collections::HashMap;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use zookeeper_client::{Client, Error as ZkError, Stat};

use crate::kind::Kind;
use crate::time::now_ms;
use crate::zk::Multi;
use crate::zk::session::ZkSession;

/// What a kind leaves behind once it has served its purpose, and so what the janitor does
/// about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leftovers {
    /// Its resources are container znodes: ZooKeeper removes each once its last child goes.
    Containers,
    /// Empty resource znodes, removed once seen empty and unchanged on two passes.
    EmptyResources,
    /// Queues that are empty (and the idempotency keys earlier versions kept in them).
    Queues,
    /// Decided transactions past their retention.
    Decided,
    /// Nothing: what is left is the client's own (a key's value, a barrier its owner holds).
    Nothing,
}

/// What `kind` leaves behind: a match without a wildcard, so that a new kind says it here, and
/// the janitor's pass goes by it.
pub fn leftovers(kind: Kind) -> Leftovers {
    match kind {
        Kind::Lock | Kind::RwLock | Kind::Semaphore | Kind::Election => Leftovers::Containers,
        // Groups and services are containers now; those made before are swept when empty.
        Kind::DoubleBarrier | Kind::Group | Kind::Service => Leftovers::EmptyResources,
        Kind::Queue => Leftovers::Queues,
        Kind::Txn => Leftovers::Decided,
        // Their idempotency keys are the store's (forgotten by the pass whatever the kind).
        Kind::Barrier | Kind::Counter | Kind::Kv => Leftovers::Nothing,
    }
}

/// How the janitor works.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Time between passes.
    pub interval: Duration,
    /// How long an idempotency key is kept.
    pub idempotency_window: Duration,
    /// How long a decided transaction is kept.
    pub txn_retention: Duration,
    /// Most deletions a second.
    pub rate: u32,
}

/// What one pass removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Removed {
    pub idempotency_keys: u64,
    pub txns: u64,
    pub empty: u64,
}

/// Starts the janitor task of this instance: it becomes the cluster's janitor when it can, and
/// stops at `shutdown`.
pub fn start(
    zk: ZkSession,
    root: &str,
    instance: &str,
    settings: Settings,
    keys: crate::recipes::idempotency::Keys,
    shutdown: CancellationToken,
) {
    let janitor = Janitor {
        root: root.to_string(),
        keys,
        instance: instance.to_string(),
        settings,
        seen_empty: HashMap::new(),
        bucket: Bucket::new(settings.rate),
    };
    let lock = crate::recipes::presence::leadership(root, "janitor");
    tokio::spawn(async move {
        tokio::select! {
            _ = janitor.run(zk.clone()) => {}
            _ = shutdown.cancelled() => {}
        }
        crate::metrics::get().janitor_active.set(0);
        // Hand over at once rather than when the session ends: give the node back if ours.
        if let Ok(session) = zk.current() {
            let hand_over = crate::recipes::presence::resign(session.client(), &lock);
            let _ = tokio::time::timeout(Duration::from_secs(2), hand_over).await;
        }
    });
}

struct Janitor {
    root: String,
    /// The idempotency keys' store.
    keys: crate::recipes::idempotency::Keys,
    instance: String,
    settings: Settings,
    /// Empty resources seen on the last pass, with the stat that showed them empty.
    seen_empty: HashMap<String, Stat>,
    bucket: Bucket,
}

impl Janitor {
    async fn run(mut self, zk: ZkSession) {
        let lock = crate::recipes::presence::leadership(&self.root, "janitor");
        let metrics = crate::metrics::get();
        loop {
            let Some(session) = zk.next_session(None).await else {
                return; // the instance is shutting down
            };
            let client = session.client();
            // This instance is (or now becomes) the janitor if it holds `lock` on this session.
            match crate::recipes::presence::lead(client, &lock, self.instance.as_bytes()).await {
                Ok(true) => {
                    metrics.janitor_active.set(1);
                    match self.pass(client).await {
                        Ok(removed) => {
                            metrics.janitor_passes.inc();
                            if removed != Removed::default() {
                                tracing::info!(?removed, "janitor pass");
                            }
                        }
                        Err(err) => tracing::warn!(error = %err, "janitor pass failed"),
                    }
                    tokio::time::sleep(self.settings.interval).await;
                }
                // Another instance is the janitor: wait for its node to go.
                Ok(false) => {
                    metrics.janitor_active.set(0);
                    self.seen_empty.clear();
                    if crate::recipes::presence::await_leader_gone(client, &lock)
                        .await
                        .is_err()
                    {
                        tokio::time::sleep(self.settings.interval).await;
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "janitor election failed");
                    tokio::time::sleep(self.settings.interval).await;
                }
            }
        }
    }

    /// One pass over everything the janitor looks after.
    async fn pass(&mut self, client: &Client) -> Result<Removed, ZkError> {
        let mut removed = Removed::default();
        let mut empty_now = HashMap::new();
        self.idempotency_keys(client, &mut removed).await?;
        for kind in Kind::ALL {
            match leftovers(kind) {
                Leftovers::Queues => self.queues(client, &mut removed, &mut empty_now).await?,
                Leftovers::Decided => self.txns(client, &mut removed).await?,
                Leftovers::EmptyResources => self.empty_resources(client, kind, &mut removed, &mut empty_now).await?,
                Leftovers::Containers | Leftovers::Nothing => {}
            }
        }
        self.seen_empty = empty_now;
        Ok(removed)
    }

    /// Empty queues (and the idempotency keys earlier versions kept in a queue's `keys/`).
    async fn queues(
        &mut self,
        client: &Client,
        removed: &mut Removed,
        empty_now: &mut HashMap<String, Stat>,
    ) -> Result<(), ZkError> {
        let base = Kind::Queue.base(&self.root);
        let queues = crate::zk::children(client, &base).await?;
        // `keys` last: a queue made by an earlier version has it, one made now does not.
        const PARTS: [&str; 4] = ["items", "claims", "dead", "keys"];
        let mut paths = Vec::with_capacity(queues.len() * (1 + PARTS.len()));
        for queue in &queues {
            paths.push(format!("{base}/{queue}"));
            paths.extend(PARTS.iter().map(|part| format!("{base}/{queue}/{part}")));
        }
        let stats = crate::zk::stat_each(client, &paths).await?;
        let oldest_kept = self.oldest_key_kept();
        for (queue, stats) in queues.iter().zip(stats.chunks(1 + PARTS.len())) {
            let dir = format!("{base}/{queue}");
            let [Some(own), Some(items), Some(claims), Some(dead), keys] = stats else {
                continue;
            };
            if keys.is_some_and(|keys| keys.num_children > 0) {
                self.old_keys(client, &format!("{dir}/keys"), oldest_kept, removed)
                    .await?;
                continue;
            }
            let parts: Vec<(&str, &Stat)> = PARTS
                .iter()
                .copied()
                .zip([Some(items), Some(claims), Some(dead), keys.as_ref()])
                .filter_map(|(part, stat)| Some((part, stat?)))
                .collect();
            let empty = own.num_children == parts.len() as i32 && parts.iter().all(|(_, s)| s.num_children == 0);
            if !empty {
                continue;
            }
            // Seen empty and unchanged (no child created or deleted anywhere in it) on the last
            // pass too: one multi-op, which fails if anything arrived since (a delete of a
            // node with children fails).
            let seen = |path: &str, now: &Stat| self.seen_empty.get(path).is_some_and(|b| b.cversion == now.cversion);
            let unchanged = seen(&dir, own) && parts.iter().all(|(part, stat)| seen(&format!("{dir}/{part}"), stat));
            if unchanged {
                self.bucket.take(parts.len() + 1).await;
                let mut multi = Multi::new(client);
                for (part, _) in &parts {
                    multi.delete((), &format!("{dir}/{part}"), None)?;
                }
                multi.delete((), &dir, None)?;
                if multi.commit().await.is_ok() {
                    removed.empty += 1;
                    count_removed("queue", 1);
                }
                continue;
            }
            empty_now.insert(dir.clone(), *own);
            for (part, stat) in parts {
                empty_now.insert(format!("{dir}/{part}"), *stat);
            }
        }
        Ok(())
    }

    /// When the oldest idempotency key still kept was made (ms since the epoch).
    fn oldest_key_kept(&self) -> i64 {
        now_ms() - self.settings.idempotency_window.as_millis() as i64
    }

    /// Idempotency keys past the window, with their charges; and those earlier versions kept
    /// beside counters and kv transactions.
    async fn idempotency_keys(&mut self, client: &Client, removed: &mut Removed) -> Result<(), ZkError> {
        let oldest_kept = self.oldest_key_kept();
        for (principal, ids) in self.keys.expired(client, oldest_kept).await? {
            for batch in ids.chunks(crate::recipes::idempotency::FORGET_BATCH) {
                // A key and its charge.
                self.bucket.take(2 * batch.len()).await;
                let gone = self.keys.forget(client, &principal, batch).await?;
                removed.idempotency_keys += gone;
                count_removed("idempotency_key", gone);
            }
        }
        // Earlier versions' (`<counter-keys>/<counter>/<key>`, `<kv-txn-keys>/<key>`).
        let counters = format!("{}/counter-keys", self.root);
        for counter in crate::zk::children(client, &counters).await? {
            let dir = format!("{counters}/{counter}");
            self.old_keys(client, &dir, oldest_kept, removed).await?;
        }
        let transactions = format!("{}/kv-txn-keys", self.root);
        self.old_keys(client, &transactions, oldest_kept, removed).await
    }

    /// The idempotency keys under `dir` made before `oldest_kept` (ms).
    async fn old_keys(
        &mut self,
        client: &Client,
        dir: &str,
        oldest_kept: i64,
        removed: &mut Removed,
    ) -> Result<(), ZkError> {
        let names = crate::zk::children(client, dir).await?;
        let key_paths: Vec<String> = names.iter().map(|k| format!("{dir}/{k}")).collect();
        let key_stats = crate::zk::stat_each(client, &key_paths).await?;
        let old: Vec<String> = key_paths
            .into_iter()
            .zip(key_stats)
            .filter(|(_, stat)| stat.is_some_and(|s| s.ctime < oldest_kept))
            .map(|(path, _)| path)
            .collect();
        let gone = self.delete_each(client, &old).await?;
        removed.idempotency_keys += gone;
        count_removed("idempotency_key", gone);
        Ok(())
    }

    /// Transactions decided longer ago than the retention, with everything below them.
    async fn txns(&mut self, client: &Client, removed: &mut Removed) -> Result<(), ZkError> {
        let base = Kind::Txn.base(&self.root);
        let txns = crate::zk::children(client, &base).await?;
        let decisions: Vec<String> = txns.iter().map(|t| format!("{base}/{t}/decision")).collect();
        let read = crate::zk::get_each(client, &decisions).await?;
        let oldest_kept = now_ms() - self.settings.txn_retention.as_millis() as i64;
        for (txn, decision) in txns.iter().zip(read) {
            let Some((data, _)) = decision else { continue };
            let decided_at =
                serde_json::from_slice::<crate::recipes::txns::Decision>(&data).map_or(i64::MAX, |d| d.at_ms);
            if decided_at >= oldest_kept {
                continue;
            }
            let dir = format!("{base}/{txn}");
            let mut doomed = Vec::new();
            for part in ["members", "votes"] {
                let below = format!("{dir}/{part}");
                doomed.extend(
                    crate::zk::children(client, &below)
                        .await?
                        .into_iter()
                        .map(|c| format!("{below}/{c}")),
                );
                doomed.push(below);
            }
            doomed.push(format!("{dir}/decision"));
            doomed.push(dir);
            // Children first, the transaction last: one multi-op if it fits, else in order
            // (a pass that stops halfway leaves a decided transaction, adopted next time).
            if self.delete_each(client, &doomed).await? > 0 {
                removed.txns += 1;
                count_removed("txn", 1);
            }
        }
        Ok(())
    }

    /// Resource znodes of `kind` with no children, seen so on two passes in a row.
    async fn empty_resources(
        &mut self,
        client: &Client,
        kind: Kind,
        removed: &mut Removed,
        empty_now: &mut HashMap<String, Stat>,
    ) -> Result<(), ZkError> {
        let base = kind.base(&self.root);
        let names = crate::zk::children(client, &base).await?;
        let paths: Vec<String> = names.iter().map(|n| format!("{base}/{n}")).collect();
        let stats = crate::zk::stat_each(client, &paths).await?;
        for (path, stat) in paths.into_iter().zip(stats) {
            let Some(stat) = stat.filter(|s| s.num_children == 0) else {
                continue;
            };
            let unchanged = self
                .seen_empty
                .get(&path)
                .is_some_and(|before| before.cversion == stat.cversion && before.version == stat.version);
            if !unchanged {
                empty_now.insert(path, stat);
                continue;
            }
            self.bucket.take(1).await;
            // On its data version: a double barrier settled again meanwhile stays.
            match client.delete(&path, Some(stat.version)).await {
                Ok(()) => {
                    removed.empty += 1;
                    count_removed(kind.name(), 1);
                }
                Err(ZkError::NotEmpty | ZkError::BadVersion | ZkError::NoNode) => {}
                Err(err) if crate::zk::is_loss(&err) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    /// Deletes `paths` in order (children before their parents), in multi-ops of at most
    /// [crate::zk::multi::DELETE_BATCH], at the bucket's rate; paths already gone are skipped. Answers how many it
    /// deleted.
    async fn delete_each(&mut self, client: &Client, paths: &[String]) -> Result<u64, ZkError> {
        let mut deleted = 0;
        for batch in paths.chunks(DELETE_BATCH) {
            self.bucket.take(batch.len()).await;
            let mut multi = Multi::new(client);
            for path in batch {
                multi.delete((), path, None)?;
            }
            match multi.commit().await {
                Ok(_) => deleted += batch.len() as u64,
                // One of them went (or got a child) meanwhile: each on its own.
                Err(_) => {
                    for path in batch {
                        match client.delete(path, None).await {
                            Ok(()) => deleted += 1,
                            Err(ZkError::NoNode | ZkError::NotEmpty) => {}
                            Err(err) if crate::zk::is_loss(&err) => {}
                            Err(err) => return Err(err),
                        }
                    }
                }
            }
        }
        Ok(deleted)
    }
}

/// Counts `n` znodes of `what` removed, in the janitor's metric.
fn count_removed(what: &str, n: u64) {
    let removed = &crate::metrics::get().janitor_removed;
    removed.with_label_values(&[what]).inc_by(n);
}

/// A token bucket of deletions: `rate` a second, a second's worth at most in hand.
struct Bucket {
    rate: f64,
    tokens: f64,
    at: tokio::time::Instant,
}

impl Bucket {
    fn new(rate: u32) -> Bucket {
        let rate = f64::from(rate.max(1));
        Bucket {
            rate,
            tokens: rate,
            at: tokio::time::Instant::now(),
        }
    }

    /// Waits until `n` deletions may go.
    async fn take(&mut self, n: usize) {
        let now = tokio::time::Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * self.rate).min(self.rate);
        self.at = now;
        self.tokens -= n as f64;
        if self.tokens < 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(-self.tokens / self.rate)).await;
        }
    }
}
