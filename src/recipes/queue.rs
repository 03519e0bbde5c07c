//! Queues and priority queues, the guide's recipes, made durable and at-least-once.
//!
//! Under `<root>/queues/<name>`: `items/` holds one persistent sequential node per item, named
//! as in the guide (`queue-<seq>`, or `queue-YY<seq>` with priority `YY`, lower first) and
//! ordered by (priority, sequence); an item without a priority counts as [DEFAULT_PRIORITY].
//! A consumer always decides from a fresh listing.
//!
//! Taking an item at least once does not remove it: it *claims* it, creating the ephemeral
//! `claims/<item>` and raising the item's delivery count in one multi-op. The item stays in
//! `items/` until the claim is acknowledged (one multi-op deletes claim and item), so a reply
//! lost on the way to the consumer loses nothing. A claim goes (and the item is delivered
//! again) when it is given back (nack), when its ack deadline passes, or with zkgate's
//! session if the instance dies. An item claimed more than the allowed number of times moves
//! to `dead/` instead, to be listed and replayed. Taking at most once deletes the item before
//! returning it. A put with an `Idempotency-Key` creates the item and `keys/<key>` in one
//! multi-op, so a retried put lands once.

use serde::{Deserialize, Serialize};
use zookeeper_client::{Client, CreateMode, Error as ZkError, MultiWriteError, Stat};

use crate::zk::retry_on_loss;

/// The priority of an item put without one.
pub const DEFAULT_PRIORITY: u8 = 50;

/// An item's znode name prefix.
pub const PREFIX: &str = "queue-";

/// An item's place in the queue, from its name: (priority, sequence).
pub fn order_of(name: &str) -> Option<(u8, u64)> {
    let digits = name.strip_prefix(PREFIX)?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match digits.len() {
        10 | 19 => Some((DEFAULT_PRIORITY, digits.parse().ok()?)),
        12 | 21 => Some((digits[..2].parse().ok()?, digits[2..].parse().ok()?)),
        _ => None,
    }
}

/// The items among `children`, first to take first.
pub fn in_queue_order<S: AsRef<str>>(children: &[S]) -> Vec<&str> {
    let mut items: Vec<((u8, u64), &str)> = children
        .iter()
        .filter_map(|c| order_of(c.as_ref()).map(|o| (o, c.as_ref())))
        .collect();
    items.sort_unstable();
    items.into_iter().map(|(_, name)| name).collect()
}

/// What an item znode holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Envelope {
    pub content_type: String,
    /// The body, when it is JSON.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<serde_json::Value>,
    /// The body as text, when it is UTF-8 but not JSON.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The body, base64-encoded, when it is neither.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
    pub put_at_ms: i64,
    /// How many times it has been claimed.
    #[serde(default)]
    pub deliveries: u32,
}

impl Envelope {
    pub fn parse(data: &[u8]) -> Envelope {
        serde_json::from_slice(data).unwrap_or_else(|_| Envelope {
            // An item another client put: its bytes as they are.
            content_type: "application/octet-stream".into(),
            body: None,
            text: None,
            base64: Some(base64::Engine::encode(&base64::engine::general_purpose::STANDARD, data)),
            put_at_ms: 0,
            deliveries: 0,
        })
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// Paths of a queue.
#[derive(Clone, Debug)]
pub struct QueuePaths {
    pub dir: String,
    pub items: String,
    pub claims: String,
    pub dead: String,
    pub keys: String,
}

impl QueuePaths {
    pub fn new(dir: String) -> QueuePaths {
        QueuePaths {
            items: format!("{dir}/items"),
            claims: format!("{dir}/claims"),
            dead: format!("{dir}/dead"),
            keys: format!("{dir}/keys"),
            dir,
        }
    }
}

/// Creates the queue's znodes if missing.
pub async fn ensure(client: &Client, paths: &QueuePaths) -> Result<(), ZkError> {
    for path in [&paths.items, &paths.claims, &paths.dead, &paths.keys] {
        crate::zk::session::ensure_path(client, path).await?;
    }
    Ok(())
}

/// What a put came to.
pub enum Put {
    /// Stored as this item.
    Stored(String),
    /// A put with this idempotency key was stored before.
    Duplicate,
}

/// Puts an item. With a key, the item and `keys/<key>` are created together or not at all.
pub async fn put(
    client: &Client,
    paths: &QueuePaths,
    priority: Option<u8>,
    envelope: &Envelope,
    key: Option<&str>,
) -> Result<Put, ZkError> {
    let prefix = match priority {
        Some(p) => format!("{}/{PREFIX}{p:02}", paths.items),
        None => format!("{}/{PREFIX}", paths.items),
    };
    let data = envelope.to_bytes();
    let options = CreateMode::PersistentSequential.with_acls(crate::zk::acls());
    let plain = CreateMode::Persistent.with_acls(crate::zk::acls());
    loop {
        let mut writer = client.new_multi_writer();
        writer.add_create(&prefix, &data, &options)?;
        if let Some(key) = key {
            writer.add_create(&format!("{}/{key}", paths.keys), &[], &plain)?;
        }
        match writer.commit().await {
            Ok(results) => {
                let name = match results.first() {
                    Some(zookeeper_client::MultiWriteResult::Create { path, .. }) => {
                        path.rsplit('/').next().unwrap_or_default().to_string()
                    }
                    _ => String::new(),
                };
                return Ok(Put::Stored(name));
            }
            Err(MultiWriteError::OperationFailed {
                index: 1,
                source: ZkError::NodeExists,
            }) => return Ok(Put::Duplicate),
            Err(MultiWriteError::OperationFailed {
                source: ZkError::NoNode,
                ..
            }) => ensure(client, paths).await?,
            Err(MultiWriteError::OperationFailed { source, .. }) => return Err(source),
            // A lost reply: with a key, the key tells whether it happened; without, the put is
            // not retried (it may have happened, and a second copy is worse for most users
            // than a clear error they can retry with a key).
            Err(MultiWriteError::RequestFailed { source }) if crate::zk::is_loss(&source) && key.is_some() => continue,
            Err(MultiWriteError::RequestFailed { source }) => return Err(source),
        }
    }
}

/// A claimed (or taken) item.
#[derive(Clone, Debug)]
pub struct Taken {
    pub item: String,
    pub envelope: Envelope,
}

/// What a take attempt came to.
pub enum Attempt {
    /// An item, claimed (at least once) or removed (at most once).
    Got(Taken, /* more items were waiting */ bool),
    /// Nothing to take now.
    Empty,
}

/// The items that takers on this instance are trying to claim right now.
///
/// Every taker lists the queue and would otherwise go for the same first item: with N takers
/// on one instance, N-1 lose that race and pay a read and a failed multi-op each, then race
/// for the next item. A taker skips an item another local taker is trying, so concurrent
/// takers here claim different items at once, still in queue order between them. (Takers on
/// other instances still race, and ZooKeeper's multi-op decides, as before.)
#[derive(Default)]
pub struct Trying {
    items: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Woken when a reservation ends: a taker that found only reserved items looks again
    /// (the other taker may have failed, leaving the item there).
    released: tokio::sync::Notify,
}

/// An item reserved in [Trying] until this is dropped.
pub struct Reserved<'a> {
    trying: &'a Trying,
    item: String,
}

impl Trying {
    fn reserve(&self, item: &str) -> Option<Reserved<'_>> {
        let mut set = self.items.lock().unwrap_or_else(|e| e.into_inner());
        set.insert(item.to_string()).then(|| Reserved {
            trying: self,
            item: item.to_string(),
        })
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.trying
            .items
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.item);
        self.trying.released.notify_waiters();
    }
}

/// Takes the first item nobody has claimed (and no other local taker is trying): claims it
/// (`claim_data` in the ephemeral claim node) or, with `at_most_once`, deletes it. Items
/// claimed `max_deliveries` times already move to `dead/` on the way.
pub async fn take(
    client: &Client,
    paths: &QueuePaths,
    claim_data: &[u8],
    at_most_once: bool,
    max_deliveries: u32,
    trying: &Trying,
) -> Result<Attempt, ZkError> {
    let items = match retry_on_loss(|| client.list_children(&paths.items)).await {
        Ok(items) => items,
        Err(ZkError::NoNode) => return Ok(Attempt::Empty),
        Err(err) => return Err(err),
    };
    let claimed = retry_on_loss(|| client.list_children(&paths.claims))
        .await
        .unwrap_or_default();
    let candidates: Vec<&str> = in_queue_order(&items)
        .into_iter()
        .filter(|i| !claimed.iter().any(|c| c == i))
        .collect();
    for (index, item) in candidates.iter().enumerate() {
        let Some(_reserved) = trying.reserve(item) else {
            continue;
        };
        let path = format!("{}/{item}", paths.items);
        let (data, stat) = match retry_on_loss(|| client.get_data(&path)).await {
            Ok(read) => read,
            Err(ZkError::NoNode) => continue,
            Err(err) => return Err(err),
        };
        let mut envelope = Envelope::parse(&data);
        let more = index + 1 < candidates.len();
        if at_most_once {
            match retry_on_loss(|| client.delete(&path, Some(stat.version))).await {
                Ok(()) => {
                    return Ok(Attempt::Got(
                        Taken {
                            item: item.to_string(),
                            envelope,
                        },
                        more,
                    ));
                }
                Err(ZkError::NoNode | ZkError::BadVersion) => continue,
                Err(err) => return Err(err),
            }
        }
        if envelope.deliveries >= max_deliveries {
            bury(client, paths, item, &envelope, &stat).await?;
            continue;
        }
        envelope.deliveries += 1;
        if claim(client, paths, item, &envelope, &stat, claim_data).await? {
            return Ok(Attempt::Got(
                Taken {
                    item: item.to_string(),
                    envelope,
                },
                more,
            ));
        }
    }
    Ok(Attempt::Empty)
}

/// Claims `item`: raises its delivery count (if it is unchanged) and creates the ephemeral
/// claim, in one multi-op. `false` if someone else got there first.
async fn claim(
    client: &Client,
    paths: &QueuePaths,
    item: &str,
    envelope: &Envelope,
    stat: &Stat,
    claim_data: &[u8],
) -> Result<bool, ZkError> {
    let item_path = format!("{}/{item}", paths.items);
    let claim_path = format!("{}/{item}", paths.claims);
    let mut writer = client.new_multi_writer();
    writer.add_set_data(&item_path, &envelope.to_bytes(), Some(stat.version))?;
    writer.add_create(
        &claim_path,
        claim_data,
        &CreateMode::Ephemeral.with_acls(crate::zk::acls()),
    )?;
    match writer.commit().await {
        Ok(_) => Ok(true),
        Err(MultiWriteError::OperationFailed {
            source: ZkError::BadVersion | ZkError::NodeExists | ZkError::NoNode,
            ..
        }) => Ok(false),
        Err(MultiWriteError::OperationFailed { source, .. }) => Err(source),
        // A lost reply: the claim is ours if its node holds our claim data.
        Err(MultiWriteError::RequestFailed { source }) if crate::zk::is_loss(&source) => {
            match retry_on_loss(|| client.get_data(&claim_path)).await {
                Ok((data, _)) => Ok(data == claim_data),
                Err(ZkError::NoNode) => Ok(false),
                Err(err) => Err(err),
            }
        }
        Err(MultiWriteError::RequestFailed { source }) => Err(source),
    }
}

/// Moves an item that has been delivered too often to `dead/`.
async fn bury(
    client: &Client,
    paths: &QueuePaths,
    item: &str,
    envelope: &Envelope,
    stat: &Stat,
) -> Result<(), ZkError> {
    let mut writer = client.new_multi_writer();
    writer.add_delete(&format!("{}/{item}", paths.items), Some(stat.version))?;
    writer.add_create(
        &format!("{}/{item}", paths.dead),
        &envelope.to_bytes(),
        &CreateMode::Persistent.with_acls(crate::zk::acls()),
    )?;
    match writer.commit().await {
        Ok(_) => {
            tracing::info!(queue = %paths.dir, %item, deliveries = envelope.deliveries, "item dead-lettered");
            let queue = paths.dir.rsplit('/').next().unwrap_or_default();
            crate::metrics::get()
                .queue_dead_lettered
                .with_label_values(&[queue])
                .inc();
            Ok(())
        }
        Err(MultiWriteError::OperationFailed { .. }) => Ok(()), // changed meanwhile: someone else decides
        Err(MultiWriteError::RequestFailed { source }) if crate::zk::is_loss(&source) => Ok(()),
        Err(MultiWriteError::RequestFailed { source }) => Err(source),
    }
}

/// Acknowledges a claim: deletes the claim (if it still holds `claim_data`) and the item
/// together. `false` if the claim is no longer ours (expired and maybe taken by another).
pub async fn ack(client: &Client, paths: &QueuePaths, item: &str, claim_data: &[u8]) -> Result<bool, ZkError> {
    let claim_path = format!("{}/{item}", paths.claims);
    let (data, stat) = match retry_on_loss(|| client.get_data(&claim_path)).await {
        Ok(read) => read,
        Err(ZkError::NoNode) => return Ok(false),
        Err(err) => return Err(err),
    };
    if data != claim_data {
        return Ok(false);
    }
    let mut writer = client.new_multi_writer();
    writer.add_delete(&claim_path, Some(stat.version))?;
    writer.add_delete(&format!("{}/{item}", paths.items), None)?;
    match writer.commit().await {
        Ok(_) => Ok(true),
        Err(MultiWriteError::OperationFailed { .. }) => Ok(false),
        // A lost reply: done if the item is gone (nobody else could delete it while our claim
        // stood), otherwise not.
        Err(MultiWriteError::RequestFailed { source }) if crate::zk::is_loss(&source) => {
            let item_path = format!("{}/{item}", paths.items);
            Ok(retry_on_loss(|| client.check_stat(&item_path)).await?.is_none())
        }
        Err(MultiWriteError::RequestFailed { source }) => Err(source),
    }
}

/// Gives a claim back (nack, or a missed deadline): the item is taken again later.
pub async fn release_claim(
    client: &Client,
    paths: &QueuePaths,
    item: &str,
    claim_data: &[u8],
) -> Result<bool, ZkError> {
    let claim_path = format!("{}/{item}", paths.claims);
    match retry_on_loss(|| client.get_data(&claim_path)).await {
        Ok((data, stat)) if data == claim_data => {
            match retry_on_loss(|| client.delete(&claim_path, Some(stat.version))).await {
                Ok(()) | Err(ZkError::NoNode) => Ok(true),
                Err(ZkError::BadVersion) => Ok(false),
                Err(err) => Err(err),
            }
        }
        Ok(_) | Err(ZkError::NoNode) => Ok(false),
        Err(err) => Err(err),
    }
}

/// The items under `dir` (`items/` or `dead/`) in queue order with their envelopes, at most
/// `limit`.
pub async fn list(client: &Client, dir: &str, limit: usize) -> Result<Vec<(String, Envelope, Stat)>, ZkError> {
    let children = match retry_on_loss(|| client.list_children(dir)).await {
        Ok(children) => children,
        Err(ZkError::NoNode) => return Ok(Vec::new()),
        Err(err) => return Err(err),
    };
    let names: Vec<String> = in_queue_order(&children)
        .into_iter()
        .take(limit)
        .map(str::to_string)
        .collect();
    let read = crate::zk::read_each(client, dir, names).await?;
    Ok(read
        .into_iter()
        .map(|(name, data, stat)| (name, Envelope::parse(&data), stat))
        .collect())
}

/// Moves a dead item back into the queue, under its own name, its delivery count reset.
pub async fn replay(client: &Client, paths: &QueuePaths, item: &str) -> Result<bool, ZkError> {
    let dead_path = format!("{}/{item}", paths.dead);
    let (data, stat) = match retry_on_loss(|| client.get_data(&dead_path)).await {
        Ok(read) => read,
        Err(ZkError::NoNode) => return Ok(false),
        Err(err) => return Err(err),
    };
    let mut envelope = Envelope::parse(&data);
    envelope.deliveries = 0;
    let mut writer = client.new_multi_writer();
    writer.add_delete(&dead_path, Some(stat.version))?;
    writer.add_create(
        &format!("{}/{item}", paths.items),
        &envelope.to_bytes(),
        &CreateMode::Persistent.with_acls(crate::zk::acls()),
    )?;
    match writer.commit().await {
        Ok(_) => Ok(true),
        Err(MultiWriteError::OperationFailed { .. }) => Ok(false),
        Err(MultiWriteError::RequestFailed { source }) => Err(source),
    }
}

/// Every queue under `base` (`<root>/queues`) with its counts, read in two round trips (a
/// listing, then one multi-read of each queue's `items`, `claims` and `dead`): items waiting
/// (claimed ones not counted), claims in flight, dead letters.
pub async fn counts(client: &Client, base: &str) -> Result<Vec<crate::metrics::QueueCounts>, ZkError> {
    let queues = match retry_on_loss(|| client.list_children(base)).await {
        Ok(queues) => queues,
        Err(ZkError::NoNode) => return Ok(Vec::new()),
        Err(err) => return Err(err),
    };
    let paths: Vec<String> = queues
        .iter()
        .flat_map(|q| ["items", "claims", "dead"].map(|sub| format!("{q}/{sub}")))
        .collect();
    let mut counts: std::collections::BTreeMap<String, [i64; 3]> = Default::default();
    for (path, _, stat) in crate::zk::read_each(client, base, paths).await? {
        let Some((queue, sub)) = path.split_once('/') else {
            continue;
        };
        let at = match sub {
            "items" => 0,
            "claims" => 1,
            _ => 2,
        };
        counts.entry(queue.to_string()).or_default()[at] = i64::from(stat.num_children);
    }
    Ok(counts
        .into_iter()
        .map(|(queue, [items, claims, dead])| crate::metrics::QueueCounts {
            queue,
            depth: (items - claims).max(0),
            in_flight: claims,
            dead_letters: dead,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_order_by_priority_then_sequence() {
        assert_eq!(order_of("queue-0000000007"), Some((DEFAULT_PRIORITY, 7)));
        assert_eq!(order_of("queue-030000000009"), Some((3, 9)));
        assert_eq!(order_of("queue-x"), None);
        assert_eq!(order_of("lock-0000000001"), None);
        let children = [
            "queue-0000000001",
            "queue-900000000002",
            "queue-010000000003",
            "queue-010000000000",
        ];
        assert_eq!(
            in_queue_order(&children),
            [
                "queue-010000000000",
                "queue-010000000003",
                "queue-0000000001",
                "queue-900000000002"
            ]
        );
    }

    proptest! {
        /// Lower priority numbers come first; within a priority, lower sequence numbers.
        #[test]
        fn queue_order_is_priority_then_fifo(items in prop::collection::btree_set((0u8..100, 0u64..1_000_000), 1..40)) {
            let names: Vec<String> = items.iter().map(|(p, s)| format!("queue-{p:02}{s:010}")).collect();
            let ordered = in_queue_order(&names);
            let keys: Vec<(u8, u64)> = ordered.iter().map(|n| order_of(n).unwrap()).collect();
            let mut sorted = keys.clone();
            sorted.sort();
            prop_assert_eq!(keys, sorted);
        }
    }
}

/// The queues as this instance serves them: the claims it made (with their ack deadlines) and
/// its waiting takers, woken one per item.
pub mod service {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tokio::sync::Notify;
    use tokio::time::Instant;
    use tokio_util::sync::CancellationToken;
    use zookeeper_client::Error as ZkError;

    use super::{Attempt, QueuePaths, Taken};
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
        claims: Arc<Mutex<HashMap<String, Claim>>>,
        waiting: Arc<Mutex<HashMap<String, Arc<Waiting>>>>,
    }

    impl Queues {
        pub fn new(zk: ZkSession, root: &str, watches: ExistsWatches, instance: Arc<str>) -> Queues {
            Queues {
                zk,
                instance,
                base: format!("{root}/queues").into(),
                watches,
                claims: Arc::default(),
                waiting: Arc::default(),
            }
        }

        pub fn base(&self) -> &str {
            &self.base
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
                match super::take(&client, &paths, &data, claim.is_none(), max_deliveries, &waiting.trying).await? {
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
                    Attempt::Empty => {}
                }
                tokio::select! {
                    _ = &mut notified => {}
                    _ = &mut released => {}
                    _ = tokio::time::sleep_until(until) => return Ok(None),
                }
            }
        }

        fn new_claim(&self, queue: &str, owner: Option<&str>, deadline: Duration) -> Claim {
            let id = crate::ids::owned_id(&self.instance);
            let deadline_ms = super::super::txn::now_ms() + deadline.as_millis() as i64;
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
                changed = subscription.state.changed() => {
                    if changed.is_err() {
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
}
