//! The queues as this instance serves them: the claims it made (with their ack deadlines) and
//! its waiting takers, woken one per item.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client::Error as ZkError;

use super::{Attempt, QueuePaths, Taken};
use crate::recipes::usage::Quotas;
use crate::remembered::Remembered;
use crate::zk::session::ZkSession;
use crate::zk::watch::ExistsWatches;

/// A claim made through this instance.
#[derive(Clone)]
pub struct Claim {
    /// The public claim id (also written into the claimed item's claim record).
    pub id: String,
    pub queue: String,
    /// The claimed item; empty until the take succeeds.
    pub item: String,
    pub data: Vec<u8>,
    pub deadline_ms: i64,
    /// The principal that took it (`None` with auth off): only it (or an admin) acks.
    pub owner: Option<String>,
    expire: CancellationToken,
}

/// The takers of one queue waiting on this instance.
struct Waiting {
    /// Woken once per change of the queue's items (and again by a taker that saw more).
    item: Notify,
    takers: AtomicUsize,
    /// Items local takers are claiming now.
    trying: super::Trying,
    /// Woken when the last taker stops waiting, so the pump can go.
    idle: Notify,
}

#[derive(Clone)]
pub struct Queues {
    zk: ZkSession,
    /// This instance's id: the prefix of its claims.
    instance: Arc<str>,
    base: Arc<str>,
    watches: ExistsWatches,
    /// Items are charged to who put them and refunded when taken or acknowledged.
    quotas: Quotas,
    claims: Arc<Mutex<HashMap<String, Claim>>>,
    /// How this instance's claims were settled, remembered (bounded) so that a repeated ack or
    /// nack, a client's retry after a lost reply, is answered as the first one was.
    settled: Arc<Mutex<Remembered<String, Settled>>>,
    waiting: Arc<Mutex<HashMap<String, Arc<Waiting>>>>,
}

/// How a claim was settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    pub queue: String,
    /// Whether it was acknowledged (the item removed) or given back (delivered again).
    pub acked: bool,
    /// The principal that held it.
    pub owner: Option<String>,
}

impl Queues {
    pub fn new(zk: ZkSession, root: &str, watches: ExistsWatches, instance: Arc<str>, quotas: Quotas) -> Queues {
        Queues {
            zk,
            instance,
            base: format!("{root}/queues").into(),
            watches,
            quotas,
            claims: Arc::default(),
            settled: Arc::default(),
            waiting: Arc::default(),
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    pub fn paths(&self, queue: &str) -> QueuePaths {
        QueuePaths::new(format!("{}/{queue}", self.base))
    }

    /// Takes one item, waiting until `until` for one to come. With `ack_deadline`, the
    /// item is claimed (at least once) for `owner` (the principal that alone may ack it)
    /// and the claim given back if not acknowledged in time; without, it is removed (at
    /// most once).
    pub async fn take(
        &self,
        queue: &str,
        owner: Option<&str>,
        ack_deadline: Option<Duration>,
        max_deliveries: u32,
        until: Instant,
    ) -> Result<Option<(Taken, Option<Claim>)>, ZkError> {
        let waiting = self.join_waiting(queue);
        let _leaving = Leaving(waiting.clone());
        let paths = self.paths(queue);
        loop {
            // Registered before looking, so that an item arriving in between still wakes us.
            let notified = waiting.item.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let released = waiting.trying.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let client = self.zk.connected().await.map_err(|_| ZkError::ConnectionLoss)?.client;
            let claim = ack_deadline.map(|deadline| self.new_claim(queue, owner, deadline));
            let data = claim.as_ref().map(|c| c.data.clone()).unwrap_or_default();
            match super::take(
                &client,
                &self.quotas,
                &paths,
                &data,
                claim.is_none(),
                max_deliveries,
                &waiting.trying,
            )
            .await?
            {
                Attempt::Got(taken, more) => {
                    if more {
                        waiting.item.notify_one(); // pass the turn on: another item waits
                    }
                    let claim = claim.map(|c| Claim {
                        item: taken.item.clone(),
                        ..c
                    });
                    if let Some(claim) = &claim {
                        self.keep(claim.clone(), ack_deadline.unwrap_or_default());
                    }
                    return Ok(Some((taken, claim)));
                }
                Attempt::Empty { next_due_ms } => {
                    // A delayed item wakes this taker when it comes due, if before the wait
                    // ends: one timer, and one listing then (new items wake it as before).
                    let due = next_due_ms.map(|ms| crate::time::instant_after(crate::time::until_ms(ms)));
                    let wake = due.map_or(until, |due| due.min(until));
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = &mut released => {}
                        _ = tokio::time::sleep_until(wake) => {
                            if wake >= until {
                                return Ok(None);
                            }
                        }
                    }
                }
            }
        }
    }

    fn new_claim(&self, queue: &str, owner: Option<&str>, deadline: Duration) -> Claim {
        let id = crate::ids::owned_id(&self.instance);
        let deadline_ms = crate::time::ms_after_now(deadline);
        let data =
            serde_json::to_vec(&serde_json::json!({ "claim": id, "deadline_ms": deadline_ms })).unwrap_or_default();
        Claim {
            id,
            queue: queue.to_string(),
            item: String::new(),
            data,
            deadline_ms,
            owner: owner.map(str::to_string),
            expire: CancellationToken::new(),
        }
    }

    /// Remembers a claim and gives it back when its deadline passes unacknowledged.
    fn keep(&self, claim: Claim, deadline: Duration) {
        let id = claim.id.clone();
        self.claims
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), claim.clone());
        let queues = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(deadline) => {}
                _ = claim.expire.cancelled() => return,
            }
            if queues.forget(&id).is_some()
                && let Ok(session) = queues.zk.connected().await
            {
                let paths = queues.paths(&claim.queue);
                let _ = super::release_claim(&session.client, &paths, &claim.item, &claim.data).await;
                tracing::info!(queue = %claim.queue, item = %claim.item, "ack deadline passed: item given back");
            }
        });
    }

    /// The claim with this id, if it is `queue`'s and still held.
    pub fn claim(&self, queue: &str, id: &str) -> Option<Claim> {
        self.claims
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .filter(|c| c.queue == queue)
            .cloned()
    }

    /// Remembers that the claim `id` (held as `claim`) was acknowledged or given back.
    pub fn settle(&self, id: &str, claim: &Claim, acked: bool) {
        let settled = Settled {
            queue: claim.queue.clone(),
            acked,
            owner: claim.owner.clone(),
        };
        self.settled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string(), settled);
    }

    /// How the claim `id` of `queue` was settled, if this instance remembers.
    pub fn settled(&self, queue: &str, id: &str) -> Option<Settled> {
        let settled = self.settled.lock().unwrap_or_else(|e| e.into_inner());
        settled.get(id).filter(|s| s.queue == queue).cloned()
    }

    /// Forgets a claim (acknowledged, given back or expired).
    pub fn forget(&self, id: &str) -> Option<Claim> {
        let claim = self.claims.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
        if let Some(claim) = &claim {
            claim.expire.cancel();
        }
        claim
    }

    /// Counts a taker in for `queue` (under the lock the pump takes to leave, so it never
    /// leaves a taker behind), starting the queue's pump if none runs.
    fn join_waiting(&self, queue: &str) -> Arc<Waiting> {
        let mut all = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(waiting) = all.get(queue) {
            waiting.takers.fetch_add(1, Ordering::SeqCst);
            return waiting.clone();
        }
        let waiting = Arc::new(Waiting {
            item: Notify::new(),
            takers: AtomicUsize::new(1),
            trying: super::Trying::default(),
            idle: Notify::new(),
        });
        all.insert(queue.to_string(), waiting.clone());
        let subscription = self.watches.subscribe_children(&self.paths(queue).items);
        tokio::spawn(pump(
            queue.to_string(),
            waiting.clone(),
            subscription,
            self.waiting.clone(),
        ));
        waiting
    }
}

/// Decrements the takers on drop and wakes the pump when none are left.
struct Leaving(Arc<Waiting>);

impl Drop for Leaving {
    fn drop(&mut self) {
        if self.0.takers.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_one();
        }
    }
}

/// Turns each change of the queue's items (the one shared children watch) into one wake-up
/// of one waiting taker; ends when no taker waits.
async fn pump(
    queue: String,
    waiting: Arc<Waiting>,
    mut subscription: crate::zk::watch::Subscription,
    all: Arc<Mutex<HashMap<String, Arc<Waiting>>>>,
) {
    loop {
        tokio::select! {
            changed = subscription.changed() => {
                if !changed {
                    break;
                }
                waiting.item.notify_one();
            }
            _ = waiting.idle.notified() => {
                let mut all = all.lock().unwrap_or_else(|e| e.into_inner());
                if waiting.takers.load(Ordering::SeqCst) == 0 {
                    if all.get(&queue).is_some_and(|w| Arc::ptr_eq(w, &waiting)) {
                        all.remove(&queue);
                    }
                    return;
                }
            }
        }
    }
    let mut all = all.lock().unwrap_or_else(|e| e.into_inner());
    if all.get(&queue).is_some_and(|w| Arc::ptr_eq(w, &waiting)) {
        all.remove(&queue);
    }
}
