//! A queue as subscribers and readers see it: how many items wait, are claimed and are dead,
//! the oldest, and the head of the queue (without the items' bodies, which may be large: they
//! are read with `GET .../items`).

use crate::zk::{Failure, Session};
use serde::Serialize;
use utoipa::ToSchema;

use super::{DEFAULT_PRIORITY, Envelope, QueuePaths, in_queue_order, order_of};
use crate::recipes::topic::{Source, event_kinds};
use crate::time::{from_millis, timestamp};
use crate::zk::watch::Mode;

/// How many of the next items a queue's state names.
pub const HEAD: usize = 10;

/// An item waiting in a queue, without its body.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq)]
pub struct QueueItem {
    #[schema(example = "queue-500000000042")]
    pub item: String,
    #[schema(example = 50)]
    pub priority: u8,
    /// How many times it has been claimed.
    #[schema(example = 1)]
    pub deliveries: u32,
    #[schema(example = "2026-11-22T10:00:00.000Z")]
    #[schema(format = DateTime)]
    pub put_at: String,
    #[schema(example = "application/json")]
    pub content_type: String,
    /// For a delayed item: not taken before this time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_before: Option<String>,
}

/// When a delayed item may be taken, as the API writes times.
pub fn not_before(item: &str) -> Option<String> {
    super::parse_name(item)
        .and_then(|n| n.due_ms)
        .map(|due| timestamp(from_millis(due)))
}

/// A queue: what `GET /v1/queues/{name}` answers and the `queue` topic carries.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq)]
pub struct QueueState {
    #[schema(example = "emails")]
    pub name: String,
    /// Items waiting to be taken (claimed ones excluded), delayed ones included (each of
    /// those says in `head` and in the item listing when it may be taken).
    pub depth: usize,
    /// Items claimed and not yet acknowledged.
    pub in_flight: usize,
    /// Items in the dead-letter queue.
    pub dead_letters: usize,
    /// When the oldest item (waiting or claimed) was put.
    #[schema(format = DateTime)]
    pub oldest_put_at: Option<String>,
    /// The next items, in the order they will be taken (at most 10).
    pub head: Vec<QueueItem>,
}

event_kinds! {
    /// The events of a queue topic.
    QueueEvent {
        /// More items wait than before.
        Available => "available",
        /// An item was moved to the dead letters.
        DeadLettered => "dead_lettered",
        /// The counts changed otherwise (taken, claimed, acknowledged).
        Depth => "depth",
    }
}

/// A queue as a topic (and as `GET` reads it).
pub struct QueueTopic {
    pub name: String,
    pub paths: QueuePaths,
}

impl Source for QueueTopic {
    type State = QueueState;
    type Event = QueueEvent;

    fn watches(&self, _: Option<&QueueState>) -> Vec<(Mode, String)> {
        [&self.paths.items, &self.paths.claims, &self.paths.dead]
            .into_iter()
            .map(|dir| (Mode::Children, dir.clone()))
            .collect()
    }

    /// Three listings and one multi-read (the head, and the oldest item: the one put first,
    /// the lowest sequence number whatever its priority).
    async fn read(&self, session: &Session) -> Result<QueueState, Failure> {
        let client = session.client();
        let items = crate::zk::children(client, &self.paths.items).await?;
        let claims = crate::zk::children(client, &self.paths.claims).await?;
        let dead = crate::zk::children(client, &self.paths.dead).await?;
        let waiting: Vec<&str> = in_queue_order(&items)
            .into_iter()
            .filter(|i| !claims.iter().any(|c| c == i))
            .collect();
        let oldest = items
            .iter()
            .filter_map(|i| order_of(i).map(|(_, seq)| (seq, i.clone())))
            .min()
            .map(|(_, item)| item);
        let mut wanted: Vec<String> = waiting.iter().take(HEAD).map(|i| i.to_string()).collect();
        if let Some(oldest) = oldest.as_ref().filter(|o| !wanted.contains(o)) {
            wanted.push(oldest.clone());
        }
        let read = crate::zk::read_each(client, &self.paths.items, wanted).await?;
        let oldest_put_at = read
            .iter()
            .find(|(item, _, _)| Some(item) == oldest.as_ref())
            .map(|(_, _, stat)| timestamp(from_millis(stat.ctime)));
        let head = read
            .into_iter()
            .filter(|(item, _, _)| waiting.iter().take(HEAD).any(|w| w == item))
            .map(|(item, data, stat)| item_view(item, &Envelope::parse(&data), stat.ctime))
            .collect();
        Ok(QueueState {
            name: self.name.clone(),
            depth: waiting.len(),
            in_flight: claims.len(),
            dead_letters: dead.len(),
            oldest_put_at,
            head,
        })
    }

    fn change(&self, before: &QueueState, after: &QueueState) -> Option<QueueEvent> {
        let counts = |s: &QueueState| (s.depth, s.in_flight, s.dead_letters, s.oldest_put_at.clone());
        if after.dead_letters > before.dead_letters {
            Some(QueueEvent::DeadLettered)
        } else if after.depth > before.depth {
            Some(QueueEvent::Available)
        } else {
            (counts(before) != counts(after)).then_some(QueueEvent::Depth)
        }
    }
}

/// An item as a state names it.
pub fn item_view(item: String, envelope: &Envelope, ctime: i64) -> QueueItem {
    let put_at = Some(envelope.put_at_ms).filter(|&ms| ms > 0).unwrap_or(ctime);
    QueueItem {
        priority: order_of(&item).map(|o| o.0).unwrap_or(DEFAULT_PRIORITY),
        not_before: not_before(&item),
        item,
        deliveries: envelope.deliveries,
        put_at: timestamp(from_millis(put_at)),
        content_type: envelope.content_type.clone(),
    }
}

/// Every queue under `base` (`<root>/queues`) with its counts, read in two round trips (a
/// listing, then one multi-read of each queue's `items`, `claims` and `dead`): items waiting
/// (claimed ones not counted), claims in flight, dead letters.
pub async fn counts(session: &Session, base: &str) -> Result<Vec<crate::metrics::QueueCounts>, Failure> {
    let client = session.client();
    let queues = crate::zk::children(client, base).await?;
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

    #[test]
    fn queue_events_say_what_grew() {
        let topic = QueueTopic {
            name: "q".into(),
            paths: QueuePaths::new("/zkgate/queues/q".into()),
        };
        let state = |depth, in_flight, dead_letters| QueueState {
            name: "q".into(),
            depth,
            in_flight,
            dead_letters,
            oldest_put_at: None,
            head: Vec::new(),
        };
        assert_eq!(
            topic.change(&state(0, 0, 0), &state(1, 0, 0)),
            Some(QueueEvent::Available)
        );
        assert_eq!(topic.change(&state(1, 0, 0), &state(0, 1, 0)), Some(QueueEvent::Depth));
        assert_eq!(
            topic.change(&state(0, 1, 0), &state(0, 0, 1)),
            Some(QueueEvent::DeadLettered)
        );
        assert_eq!(topic.change(&state(2, 1, 0), &state(2, 1, 0)), None);
    }
}
