//! Queues and priority queues, the guide's recipes, made durable and at-least-once.
//!
//! Under `<root>/queues/<name>`: `items/` holds one persistent sequential node per item, named
//! as in the guide (`queue-<seq>`, or `queue-YY<seq>` with priority `YY`, lower first) and
//! ordered by (priority, sequence); an item without a priority counts as [DEFAULT_PRIORITY].
//! The takers on an instance pick from one watched view of the queue ([mirror]); ZooKeeper's
//! multi-ops decide every claim.
//!
//! Taking an item at least once does not remove it: it *claims* it, creating
//! `claims/<item>` and raising the item's delivery count in one multi-op. The item stays in
//! `items/` until the claim is acknowledged (one multi-op deletes claim and item), so a reply
//! lost on the way to the consumer loses nothing. The claim node is persistent and records
//! ([ClaimRecord]) the claim's id, its ack deadline, the principal that took it and the
//! instance that times it, so that any instance acknowledges it or gives it back, and a claim
//! outlives the instance that made it: that instance gives it back when the deadline passes,
//! or, once it is gone, the lease reaper's instance does ([service::Queues::adopt_orphans]). A
//! claim goes (and the item is delivered again) when it is given back (nack) or its ack
//! deadline passes. An item claimed more than the allowed number of times moves
//! to `dead/` instead, to be listed and replayed. Taking at most once deletes the item before
//! returning it. A put with an `Idempotency-Key` creates the item and the key's record
//! ([crate::recipes::idempotency]) in one multi-op, so a retried put lands once.
//!
//! Here a queue's paths, the put and the reads; an item's name and envelope in [item], a take
//! in [take], a claim in [claim].

use crate::zk::{Failed, Multi};
use crate::zk::{Failure, Session};
use zookeeper_client::{Client, CreateMode, Error as ZkError, Stat};

use crate::recipes::guards::{Checked, Guard, Guards, retry_guarded};
use crate::recipes::idempotency::{KeyError, Keyed};
use crate::recipes::usage::{Charge, ChargeError, Exceeded, Payer, Quotas};
use crate::zk::retry_on_loss;

mod claim;
mod item;
pub mod mirror;
pub mod service;
mod settle;
mod take;
pub mod topic;
mod views;

pub use claim::*;
pub use item::*;
pub use settle::{Acked, ack, extend, nack};
pub use take::*;
pub use views::*;

/// Paths of a queue.
#[derive(Clone, Debug)]
pub struct QueuePaths {
    pub dir: String,
    pub items: String,
    pub claims: String,
    pub dead: String,
}

impl QueuePaths {
    pub fn new(dir: String) -> QueuePaths {
        QueuePaths {
            items: format!("{dir}/items"),
            claims: format!("{dir}/claims"),
            dead: format!("{dir}/dead"),
            dir,
        }
    }
}

/// Creates the queue's znodes if missing.
pub async fn ensure(client: &Client, paths: &QueuePaths) -> Result<(), ZkError> {
    for path in [&paths.items, &paths.claims, &paths.dead] {
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
    /// The queue holds this many items, its limit: nothing was stored.
    Full(usize),
    /// The item would pass this quota: nothing was stored.
    Quota(Exceeded),
}

/// Puts an item, unless the queue already holds `max_depth` items (a bound so that a producer
/// backs off until consumers catch up, and a queue's listing stays well within what ZooKeeper
/// carries in one reply). With a key, the item and the key's record are created together or
/// not at all; so is the item's charge to `payer`, so that an item past the payer's quota is
/// not stored.
///
/// # Notable errors
/// * [KeyError::Reused] for a key another request used.
pub async fn put(
    session: &Session,
    paths: &QueuePaths,
    placement: Placement,
    envelope: &Envelope,
    (key, guards): (Option<Keyed<'_>>, &Guards),
    max_depth: usize,
    payer: Payer<'_>,
) -> Result<Put, KeyError> {
    let client = session.client();
    let items = retry_on_loss(|| client.check_stat(&paths.items)).await?;
    let depth = items.map_or(0, |stat| stat.num_children as usize);
    if depth >= max_depth {
        return Ok(Put::Full(depth));
    }
    let prefix = format!("{}/{}", paths.items, item_prefix(placement.priority, placement.due_ms));
    let mut envelope = envelope.clone();
    // Checked on the item's stored size (the charge's own mention in the header aside), and
    // charged on it exactly.
    let size = envelope.to_bytes().len();
    envelope.charge = match payer.quotas.charge(session, payer.principal, size).await {
        Ok(charge) => Some(charge),
        Err(ChargeError::Exceeded(exceeded)) => return Ok(Put::Quota(exceeded)),
        Err(ChargeError::ZooKeeper(err)) => return Err(err.into()),
    };
    let data = envelope.to_bytes();
    let record = match key {
        // A put answers nothing a retry needs but that it was stored.
        Some(keyed) => match keyed.record(client, &()).await {
            Ok(record) => Some(record),
            Err(KeyError::Quota(exceeded)) => return Ok(Put::Quota(exceeded)),
            Err(err) => return Err(err),
        },
        None => None,
    };
    let options = CreateMode::PersistentSequential.with_acls(crate::zk::acls());
    loop {
        let mut multi = Multi::new(client);
        guards.add_to(&mut multi, Part::Guard)?;
        if let Some(record) = &record {
            record.add_to(&mut multi, Part::Key)?;
        }
        multi.create(Part::Item, &prefix, &data, &options)?;
        if let Some(charge) = &envelope.charge {
            payer.quotas.add_charge(&mut multi, Part::Charge, charge, data.len())?;
        }
        match multi.commit().await {
            Ok(done) => {
                if let Some(keyed) = key {
                    keyed.committed(client, &done, &Part::Key);
                }
                let created = done.created(&Part::Item).unwrap_or_default();
                return Ok(Put::Stored(created.rsplit('/').next().unwrap_or_default().to_string()));
            }
            Err(Failed::Refused { tag: Part::Guard, .. }) => return Err(Failure::Unguarded.into()),
            Err(Failed::Refused {
                tag: Part::Key,
                error: ZkError::NodeExists,
            }) => {
                // (Only a keyed put has a record to be refused.)
                let recorded = match key {
                    Some(keyed) => keyed.recorded::<()>(client).await?,
                    None => None,
                };
                if recorded.is_some() {
                    return Ok(Put::Duplicate);
                }
                // Forgotten meanwhile: a new put.
            }
            Err(Failed::Refused {
                error: ZkError::QuotaExceeded,
                ..
            }) => return Ok(Put::Quota(payer.exceeded(session, data.len()).await)),
            Err(Failed::Refused {
                error: ZkError::NoNode, ..
            }) => {
                ensure(client, paths).await?;
                if let Some(charge) = &envelope.charge {
                    payer.quotas.repair(client, &charge.principal).await?;
                }
                if let Some(keyed) = key {
                    keyed.repair(client).await?;
                }
            }
            // A lost reply: with a key, the key tells whether it happened; without, the put is
            // not retried (it may have happened, and a second copy is worse for most users
            // than a clear error they can retry with a key).
            Err(failed) if failed.is_loss() && key.is_some() => continue,
            Err(failed) => return Err(Failure::from(failed).into()),
        }
    }
}

/// What an operation of a queue's multi-op is for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Part {
    /// A check of the writer's guards.
    Guard,
    /// The item's node.
    Item,
    /// A put's idempotency key's record.
    Key,
    /// A claim's node.
    Claim,
    /// The item's charge, made or refunded with it.
    Charge,
}

/// Deletes an item and refunds its charge in one multi-op, with the claim `also` if given; an
/// item whose charge is gone (its usage removed by hand) is deleted alone.
async fn delete_item(
    client: &Client,
    quotas: &Quotas,
    path: &str,
    version: Option<i32>,
    charge: Option<&Charge>,
    (also, guards): (Option<(&str, i32)>, &Checked),
) -> Result<(), Failed<Part>> {
    let mut with_charge = charge;
    loop {
        let mut multi = Multi::new(client);
        let added = (|| {
            guards.add_to(&mut multi, Part::Guard)?;
            if let Some((claim, version)) = also {
                multi.delete(Part::Claim, claim, Some(version))?;
            }
            multi.delete(Part::Item, path, version)?;
            match with_charge {
                Some(charge) => quotas.add_refund(&mut multi, Part::Charge, charge),
                None => Ok(()),
            }
        })();
        added.map_err(Failed::Request)?;
        match multi.commit().await {
            Err(Failed::Refused {
                tag: Part::Charge,
                error: ZkError::NoNode,
            }) => with_charge = None,
            done => return done.map(|_| ()),
        }
    }
}

/// The items under `dir` (`items/` or `dead/`), each with its place in queue order as text
/// (priority, then sequence: it sorts as the queue does), for paging.
pub async fn names(session: &Session, dir: &str) -> Result<Vec<(String, String)>, Failure> {
    let client = session.client();
    let children = crate::zk::children(client, dir).await?;
    Ok(children
        .into_iter()
        .filter_map(|name| order_of(&name).map(|(priority, seq)| (format!("{priority:03}|{seq:020}"), name)))
        .collect())
}

/// The items `names` under `dir` with their envelopes (an item gone meanwhile is left out).
pub async fn read(session: &Session, dir: &str, names: Vec<String>) -> Result<Vec<(String, Envelope, Stat)>, Failure> {
    let client = session.client();
    let read = crate::zk::read_each(client, dir, names).await?;
    Ok(read
        .into_iter()
        .map(|(name, data, stat)| (name, Envelope::parse(&data), stat))
        .collect())
}

/// Moves a dead item back into the queue, under its own name, its delivery count reset.
pub async fn replay(session: &Session, paths: &QueuePaths, item: &str, guards: &Guards) -> Result<bool, Failure> {
    let client = session.client();
    let dead_path = format!("{}/{item}", paths.dead);
    let Some((data, stat)) = crate::zk::data(client, &dead_path).await? else {
        return Ok(false);
    };
    let mut envelope = Envelope::parse(&data);
    envelope.deliveries = 0;
    let mut multi = Multi::new(client);
    guards.add_to(&mut multi, Part::Guard)?;
    multi.delete(Part::Item, &dead_path, Some(stat.version))?;
    multi.create(
        Part::Item,
        &format!("{}/{item}", paths.items),
        &envelope.to_bytes(),
        &CreateMode::Persistent.with_acls(crate::zk::acls()),
    )?;
    match multi.commit().await {
        Ok(_) => Ok(true),
        Err(Failed::Refused { tag: Part::Guard, .. }) => Err(Failure::Unguarded),
        Err(Failed::Refused { .. }) => Ok(false),
        Err(Failed::Request(error)) => Err(error.into()),
    }
}

/// Queue `name`'s items (or, `dead`, its dead letters) that `page` picks of all of them (their
/// places in queue order, and names), each with its envelope and stat, read at `consistency`.
pub async fn listed(
    recipes: &crate::recipes::Recipes,
    name: &str,
    dead: bool,
    page: impl FnOnce(Vec<(String, String)>) -> Vec<String>,
    consistency: crate::recipes::consistency::Consistency,
) -> Result<Vec<(String, Envelope, Stat)>, crate::problem::ApiError> {
    let paths = recipes.queues.paths(name);
    let dir = if dead { paths.dead } else { paths.items };
    let session = recipes.reader(consistency).await?;
    let picked = page(names(&session, &dir).await?);
    Ok(read(&session, &dir, picked).await?)
}

/// Puts dead item `item` of queue `name` back in the queue; 404 if there is no such item.
pub async fn replay_dead(
    recipes: &crate::recipes::Recipes,
    (caller, guards): (&crate::auth::Caller, &[Guard]),
    name: &str,
    item: &str,
) -> Result<(), crate::problem::ApiError> {
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    let session = recipes.zk().connected().await?;
    let paths = recipes.queues.paths(name);
    let replayed = retry_guarded!(
        guards,
        recipes,
        Err(Failure::Unguarded),
        replay(&session, &paths, item, guards).await
    );
    match replayed? {
        true => Ok(()),
        false => Err(crate::problem::ApiError::not_found(
            "item",
            format!("no dead item `{item}` in `{name}`"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn envelope(content_type: &str, body: &[u8]) -> Envelope {
        Envelope {
            content_type: content_type.into(),
            body: body.to_vec(),
            put_at_ms: 1_700_000_000_000,
            deliveries: 2,
            charge: Some(Charge {
                principal: "app".into(),
                id: "c1".into(),
            }),
        }
    }

    #[test]
    fn bodies_are_stored_raw_after_a_header() {
        // Control characters take six bytes each once escaped in JSON; raw, one.
        let text = "\u{1}".repeat(1000);
        let item = envelope("text/plain", text.as_bytes());
        let stored = item.to_bytes();
        assert!(stored.len() < 1000 + 200, "{} bytes stored", stored.len());
        assert_eq!(Envelope::parse(&stored), item);
        let binary = envelope("application/octet-stream", &[0, 255, 10, 13]);
        assert_eq!(Envelope::parse(&binary.to_bytes()), binary);
        assert_eq!(binary.shown(), Shown::Base64("AP8KDQ==".into()));
        let json = envelope("application/json", br#"{"a":[1,2]}"#);
        assert_eq!(json.shown(), Shown::Json(serde_json::json!({"a": [1, 2]})));
    }

    #[test]
    fn items_in_the_former_json_envelope_and_foreign_items_are_read() {
        let legacy = br#"{"content_type":"text/plain","text":"hi","put_at_ms":5,"deliveries":1}"#;
        let read = Envelope::parse(legacy);
        assert_eq!(
            (read.body.as_slice(), read.put_at_ms, read.deliveries),
            (&b"hi"[..], 5, 1)
        );
        let legacy = br#"{"content_type":"application/json","body":{"n":1},"put_at_ms":5}"#;
        assert_eq!(
            Envelope::parse(legacy).shown(),
            Shown::Json(serde_json::json!({"n": 1}))
        );
        let foreign = Envelope::parse(b"kazoo put this");
        assert_eq!(
            (foreign.content_type.as_str(), foreign.body.as_slice()),
            ("application/octet-stream", &b"kazoo put this"[..])
        );
    }

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

    #[test]
    fn an_item_curator_framed_is_its_bytes() {
        let framed = b"\0\x01\0\x01\x01\0\0\0\x06sooner\x02";
        assert_eq!(Envelope::parse(framed).body, b"sooner");
        // Two items in one message, or a frame that does not add up: the bytes as they are.
        let two = b"\0\x01\0\x01\x01\0\0\0\x01a\x01\0\0\0\x01b\x02";
        assert_eq!(Envelope::parse(two).body, two);
        let short = b"\0\x01\0\x01\x01\0\0\0\x09sooner\x02";
        assert_eq!(Envelope::parse(short).body, short);
    }

    #[test]
    fn delayed_items_name_their_time_and_keep_their_place() {
        let due = 0x18B_CFE5_6800;
        assert_eq!(item_prefix(None, Some(due)), "queue-|18BCFE56800|");
        assert_eq!(item_prefix(Some(3), Some(due)), "queue-03|18BCFE56800|");
        assert_eq!(item_prefix(Some(3), None), "queue-03");
        assert_eq!(
            parse_name("queue-|18BCFE56800|0000000007"),
            Some(ItemName {
                priority: DEFAULT_PRIORITY,
                due_ms: Some(due),
                seq: 7
            })
        );
        assert_eq!(
            parse_name("queue-03|18bcfe56800|0000000009"),
            Some(ItemName {
                priority: 3,
                due_ms: Some(due),
                seq: 9
            })
        );
        for bad in [
            "queue-|zz|0000000001",
            "queue-3|1|0000000001",
            "queue-||0000000001",
            "queue-|1|42",
        ] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
        // Delayed or not, items of one priority keep the order they were put in.
        let children = [
            "queue-|18BCFE56800|0000000002",
            "queue-0000000001",
            "queue-01|1|0000000003",
        ];
        assert_eq!(
            in_queue_order(&children),
            [
                "queue-01|1|0000000003",
                "queue-0000000001",
                "queue-|18BCFE56800|0000000002"
            ]
        );
    }

    proptest! {
        #[test]
        fn item_names_round_trip(priority in proptest::option::of(0u8..100), due in proptest::option::of(0i64..(1 << 50)), seq in 0u64..10_000_000_000) {
            let name = format!("{}{seq:010}", item_prefix(priority, due));
            let parsed = parse_name(&name).expect("parses");
            prop_assert_eq!(parsed, ItemName { priority: priority.unwrap_or(DEFAULT_PRIORITY), due_ms: due, seq });
        }

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
