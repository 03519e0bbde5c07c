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
//! returning it. A put with an `Idempotency-Key` creates the item and `keys/<key>` in one
//! multi-op, so a retried put lands once.
//!
//! Over 600 lines (about 150 of them tests): put, take and their multi-ops in one file; issue
//! 31's typed multi-op builder shrinks `take_items`, then take and put split by concept.

use crate::zk::{Failure, Session};
use serde::{Deserialize, Serialize};
use zookeeper_client::{Client, CreateMode, Error as ZkError, MultiWriteError, Stat};

use super::usage::{Charge, ChargeError, Exceeded, Payer, Quotas};
use crate::zk::retry_on_loss;

pub mod mirror;
pub mod service;
pub mod topic;

use mirror::Tried;

/// The priority of an item put without one.
pub const DEFAULT_PRIORITY: u8 = 50;

/// An item's znode name prefix.
pub const PREFIX: &str = "queue-";

/// An item's place in the queue, from its name: (priority, sequence).
pub fn order_of(name: &str) -> Option<(u8, u64)> {
    parse_name(name).map(|n| (n.priority, n.seq))
}

/// What an item's name says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemName {
    pub priority: u8,
    /// When it may be taken (ms since the Unix epoch), for a delayed item.
    pub due_ms: Option<i64>,
    pub seq: u64,
}

/// Parses an item's name: `queue-<seq>`, `queue-<YY><seq>` (priority `YY`), and for a delayed
/// item `queue-|<due>|<seq>` or `queue-<YY>|<due>|<seq>`, `<due>` the time it may be taken in
/// hexadecimal ms since the Unix epoch (as Curator's `DistributedDelayQueue` writes it). The
/// sequence is ZooKeeper's, 10 digits (19 past `i32::MAX`).
pub fn parse_name(name: &str) -> Option<ItemName> {
    let rest = name.strip_prefix(PREFIX)?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let Some((head, seq)) = rest.rsplit_once('|') else {
        if !digits(rest) {
            return None;
        }
        return match rest.len() {
            10 | 19 => Some(ItemName {
                priority: DEFAULT_PRIORITY,
                due_ms: None,
                seq: rest.parse().ok()?,
            }),
            12 | 21 => Some(ItemName {
                priority: rest[..2].parse().ok()?,
                due_ms: None,
                seq: rest[2..].parse().ok()?,
            }),
            _ => None,
        };
    };
    let (priority, due) = head.split_once('|')?;
    if !digits(seq) || !matches!(seq.len(), 10 | 19) || due.is_empty() || due.len() > 15 {
        return None;
    }
    let priority = match priority {
        "" => DEFAULT_PRIORITY,
        p if p.len() == 2 && digits(p) => p.parse().ok()?,
        _ => return None,
    };
    Some(ItemName {
        priority,
        due_ms: Some(i64::from_str_radix(due, 16).ok()?),
        seq: seq.parse().ok()?,
    })
}

/// Where a new item goes: its priority (default [DEFAULT_PRIORITY]) and, delayed, its time.
#[derive(Debug, Clone, Copy, Default)]
pub struct Placement {
    pub priority: Option<u8>,
    pub due_ms: Option<i64>,
}

/// The name prefix of a new item (ZooKeeper appends the sequence).
pub fn item_prefix(priority: Option<u8>, due_ms: Option<i64>) -> String {
    let priority = priority.map(|p| format!("{p:02}")).unwrap_or_default();
    match due_ms {
        Some(due) => format!("{PREFIX}{priority}|{due:X}|"),
        None => format!("{PREFIX}{priority}"),
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

/// What an item znode holds: its body as it was put, and what zkgate knows of it.
///
/// Stored as `zkgate-item/1\n<header JSON>\n<body>`: the body raw, so that a text or binary
/// item takes its own size in ZooKeeper rather than the third more (base64) to six times more
/// (escaped control characters) it would take inside a JSON document. Items written by zkgate
/// before this format (a JSON envelope) and items other clients put (raw bytes) are read too.
#[derive(Clone, Debug, PartialEq)]
pub struct Envelope {
    pub content_type: String,
    pub body: Vec<u8>,
    pub put_at_ms: i64,
    /// How many times it has been claimed.
    pub deliveries: u32,
    /// Its charge to the principal that put it ([crate::recipes::usage]), refunded when the
    /// item is taken or acknowledged. Dead-lettering and replay keep it: the item is still
    /// stored.
    pub charge: Option<Charge>,
}

/// The first line of an item in zkgate's format.
const MAGIC: &[u8] = b"zkgate-item/1\n";

/// An item's header line.
#[derive(Serialize, Deserialize)]
struct Header {
    content_type: String,
    put_at_ms: i64,
    #[serde(default)]
    deliveries: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    charge: Option<Charge>,
}

/// The JSON envelope items were stored in before [MAGIC].
#[derive(Deserialize)]
struct Legacy {
    content_type: String,
    body: Option<serde_json::Value>,
    text: Option<String>,
    base64: Option<String>,
    put_at_ms: i64,
    #[serde(default)]
    deliveries: u32,
}

/// An item's body as the API shows it: JSON, text, or base64 for other bytes.
#[derive(Debug, PartialEq)]
pub enum Shown {
    Json(serde_json::Value),
    Text(String),
    Base64(String),
}

impl Envelope {
    pub fn parse(data: &[u8]) -> Envelope {
        if let Some(rest) = data.strip_prefix(MAGIC)
            && let Some(end) = rest.iter().position(|&b| b == b'\n')
            && let Ok(header) = serde_json::from_slice::<Header>(&rest[..end])
        {
            return Envelope {
                content_type: header.content_type,
                body: rest[end + 1..].to_vec(),
                put_at_ms: header.put_at_ms,
                deliveries: header.deliveries,
                charge: header.charge,
            };
        }
        if let Ok(legacy) = serde_json::from_slice::<Legacy>(data) {
            let body = match (legacy.body, legacy.text, legacy.base64) {
                (Some(json), _, _) => serde_json::to_vec(&json).unwrap_or_default(),
                (None, Some(text), _) => text.into_bytes(),
                (None, None, Some(encoded)) => {
                    base64::Engine::decode(&base64::engine::general_purpose::STANDARD, encoded).unwrap_or_default()
                }
                (None, None, None) => Vec::new(),
            };
            return Envelope {
                content_type: legacy.content_type,
                body,
                put_at_ms: legacy.put_at_ms,
                deliveries: legacy.deliveries,
                charge: None,
            };
        }
        // An item another client put: its bytes as they are (the one item of a message Curator's
        // queues framed).
        Envelope {
            content_type: "application/octet-stream".into(),
            body: curator_item(data).unwrap_or(data).to_vec(),
            put_at_ms: 0,
            deliveries: 0,
            charge: None,
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let header = Header {
            content_type: self.content_type.clone(),
            put_at_ms: self.put_at_ms,
            deliveries: self.deliveries,
            charge: self.charge.clone(),
        };
        let mut data = MAGIC.to_vec();
        data.extend(serde_json::to_vec(&header).unwrap_or_default());
        data.push(b'\n');
        data.extend_from_slice(&self.body);
        data
    }

    /// Whether its content type is JSON (`application/json`, or `…+json`).
    pub fn is_json(content_type: &str) -> bool {
        content_type.starts_with("application/json") || content_type.contains("+json")
    }

    /// The body as the API shows it: parsed if its content type is JSON, text if it is UTF-8,
    /// base64 otherwise.
    pub fn shown(&self) -> Shown {
        if Envelope::is_json(&self.content_type)
            && let Ok(value) = serde_json::from_slice(&self.body)
        {
            return Shown::Json(value);
        }
        match std::str::from_utf8(&self.body) {
            Ok(text) => Shown::Text(text.to_string()),
            Err(_) => Shown::Base64(base64::Engine::encode(
                &base64::engine::general_purpose::STANDARD,
                &self.body,
            )),
        }
    }
}

/// The item of a message framed as Curator's queues frame them (`ItemSerializer`: the version
/// `0x00010001`; for each item the opcode 1, its length, 4 bytes big-endian, and its bytes;
/// then the opcode 2), when it holds exactly one. `None` for anything else.
fn curator_item(data: &[u8]) -> Option<&[u8]> {
    let rest = data.strip_prefix(&[0, 1, 0, 1])?.strip_prefix(&[1])?;
    let length = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    let item = rest.get(4..4usize.checked_add(length)?)?;
    (rest.get(4 + length..)? == [2]).then_some(item)
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
    /// The queue holds this many items, its limit: nothing was stored.
    Full(usize),
    /// The item would pass this quota: nothing was stored.
    Quota(Exceeded),
}

/// Puts an item, unless the queue already holds `max_depth` items (a bound so that a producer
/// backs off until consumers catch up, and a queue's listing stays well within what ZooKeeper
/// carries in one reply). With a key, the item and `keys/<key>` are created together or not at
/// all; so is the item's charge to `payer`, so that an item past the payer's quota is not
/// stored.
pub async fn put(
    session: &Session,
    paths: &QueuePaths,
    placement: Placement,
    envelope: &Envelope,
    key: Option<&str>,
    max_depth: usize,
    payer: Payer<'_>,
) -> Result<Put, Failure> {
    let client = session.client();
    let depth = match retry_on_loss(|| client.check_stat(&paths.items)).await? {
        Some(stat) => stat.num_children as usize,
        None => 0,
    };
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
        Err(ChargeError::ZooKeeper(err)) => return Err(err),
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
        if let Some(charge) = &envelope.charge {
            payer.quotas.add_charge(&mut writer, charge, data.len(), false)?;
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
            }) if key.is_some() => return Ok(Put::Duplicate),
            Err(MultiWriteError::OperationFailed {
                source: ZkError::QuotaExceeded,
                ..
            }) => return Ok(Put::Quota(payer.exceeded(session, data.len()).await)),
            Err(MultiWriteError::OperationFailed {
                source: ZkError::NoNode,
                ..
            }) => {
                ensure(client, paths).await?;
                if let Some(charge) = &envelope.charge {
                    payer.quotas.repair(client, &charge.principal).await?;
                }
            }
            Err(MultiWriteError::OperationFailed { source, .. }) => return Err(source.into()),
            // A lost reply: with a key, the key tells whether it happened; without, the put is
            // not retried (it may have happened, and a second copy is worse for most users
            // than a clear error they can retry with a key).
            Err(MultiWriteError::RequestFailed { source }) if crate::zk::is_loss(&source) && key.is_some() => continue,
            Err(MultiWriteError::RequestFailed { source }) => return Err(source.into()),
        }
    }
}

/// Deletes an item and refunds its charge in one multi-op; an item whose charge is gone
/// (its usage removed by hand) is deleted alone.
async fn delete_item(
    client: &Client,
    quotas: &Quotas,
    path: &str,
    version: Option<i32>,
    charge: Option<&Charge>,
    also: Option<(&str, i32)>,
) -> Result<(), MultiWriteError> {
    let mut with_charge = charge;
    loop {
        let mut writer = client.new_multi_writer();
        if let Some((other, version)) = also {
            writer.add_delete(other, Some(version))?;
        }
        writer.add_delete(path, version)?;
        if let Some(charge) = with_charge {
            quotas.add_refund(&mut writer, charge)?;
        }
        let refund = usize::from(also.is_some()) + 1;
        match writer.commit().await {
            Err(MultiWriteError::OperationFailed {
                index,
                source: ZkError::NoNode,
            }) if with_charge.is_some() && index == refund => with_charge = None,
            done => return done.map(|_| ()),
        }
    }
}

/// What a claim node holds: enough for any instance to acknowledge the claim, to give it
/// back, or to time it once the instance that made it is gone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRecord {
    /// The claim's id, as the consumer got it (see [crate::ids::claim_id]).
    pub claim: String,
    /// When the item is given back unless acknowledged (ms since the epoch, the instances'
    /// clocks).
    pub deadline_ms: i64,
    /// The principal that took it, who alone (or an admin) acknowledges it; `None` with
    /// authentication off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// The instance that times the deadline (made the claim).
    #[serde(default)]
    pub instance: String,
}

impl ClaimRecord {
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The record in a claim node's data (`None` if it holds something else).
    pub fn parse(data: &[u8]) -> Option<ClaimRecord> {
        serde_json::from_slice(data).ok()
    }
}

/// The claim on `item`, as recorded, and its node's version (`None` if the item is not claimed
/// or its claim node holds something else).
pub async fn read_claim(
    client: &Client,
    paths: &QueuePaths,
    item: &str,
) -> Result<Option<(ClaimRecord, Stat)>, ZkError> {
    let path = format!("{}/{item}", paths.claims);
    match retry_on_loss(|| client.get_data(&path)).await {
        Ok((data, stat)) => Ok(ClaimRecord::parse(&data).map(|record| (record, stat))),
        Err(ZkError::NoNode) => Ok(None),
        Err(err) => Err(err),
    }
}

/// A claim as [all_claims] finds it.
pub struct StandingClaim {
    pub queue: String,
    pub item: String,
    pub record: ClaimRecord,
}

/// Every claim of every queue under `base`, for the reaper: one listing of the queues, one of
/// each queue's claims, one read of each claim (pipelined, 32 at a time).
pub async fn all_claims(client: &Client, base: &str) -> Result<Vec<StandingClaim>, ZkError> {
    use futures::StreamExt;
    let queues = match retry_on_loss(|| client.list_children(base)).await {
        Ok(queues) => queues,
        Err(ZkError::NoNode) => return Ok(Vec::new()),
        Err(err) => return Err(err),
    };
    let listed: Vec<Result<(String, Vec<String>), ZkError>> = futures::stream::iter(queues)
        .map(|queue| async move {
            let dir = format!("{base}/{queue}/claims");
            match retry_on_loss(|| client.list_children(&dir)).await {
                Ok(items) => Ok((queue, items)),
                Err(ZkError::NoNode) => Ok((queue, Vec::new())),
                Err(err) => Err(err),
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let mut claimed = Vec::new();
    for listed in listed {
        let (queue, items) = listed?;
        claimed.extend(items.into_iter().map(|item| (queue.clone(), item)));
    }
    let read: Vec<Result<Option<StandingClaim>, ZkError>> = futures::stream::iter(claimed)
        .map(|(queue, item)| async move {
            let paths = QueuePaths::new(format!("{base}/{queue}"));
            let found = read_claim(client, &paths, &item).await?;
            Ok(found.map(|(record, _)| StandingClaim { queue, item, record }))
        })
        .buffer_unordered(32)
        .collect()
        .await;
    read.into_iter().filter_map(Result::transpose).collect()
}

/// A claimed (or taken) item.
#[derive(Clone, Debug)]
pub struct Taken {
    pub item: String,
    pub envelope: Envelope,
    /// The item's version once claimed (its delivery count raised): while the item has it,
    /// nobody has claimed the item since.
    pub version: i32,
}

/// Most bytes of item data one multi-op of claims carries (a claim rewrites its item's data
/// with the delivery count raised), well within ZooKeeper's 1 MiB packet limit.
const CLAIMS_BYTES: usize = 512 * 1024;

/// An item a taker picked to take, and the claim data its claim will hold.
pub struct Pick {
    pub item: String,
    pub claim_data: Vec<u8>,
}

/// One picked item on its way to being taken.
struct Candidate {
    /// Its place among the picks.
    index: usize,
    envelope: Envelope,
    data: Vec<u8>,
    version: i32,
    /// Whether its charge is refunded with it (at most once; not if the charge is gone).
    refund: bool,
}

/// What a multi-op's operation was for.
#[derive(Clone, Copy, PartialEq)]
enum Op {
    Item,
    Claim,
    Refund,
}

/// Takes the items a taker picked from the queue's mirror: claims each (`claim_data`, its
/// [ClaimRecord], in its claim node, its delivery count raised) or, `at_most_once`, deletes it and refunds
/// its charge. The picks are read together and claimed together in one multi-op (several for
/// large items); a pick that fails leaves the others to a multi-op of their own. Items
/// claimed `max_deliveries` times already move to `dead/` on the way. Says for each pick, in
/// order, what came of it. `max_bytes` is the most an item may hold.
pub async fn take_items(
    client: &Client,
    quotas: &Quotas,
    paths: &QueuePaths,
    picks: &[Pick],
    at_most_once: bool,
    max_deliveries: u32,
    max_bytes: usize,
) -> Result<Vec<(Tried, Option<Taken>)>, ZkError> {
    let mut outcome: Vec<(Tried, Option<Taken>)> = picks.iter().map(|_| (Tried::Again, None)).collect();
    let item_paths: Vec<String> = picks.iter().map(|p| format!("{}/{}", paths.items, p.item)).collect();
    let read = crate::zk::get_each_of_size(client, &item_paths, max_bytes).await?;
    let mut candidates = Vec::with_capacity(picks.len());
    for (index, read) in read.into_iter().enumerate() {
        let Some((data, stat)) = read else {
            outcome[index].0 = Tried::TakenElsewhere;
            continue;
        };
        let mut envelope = Envelope::parse(&data);
        if !at_most_once {
            if envelope.deliveries >= max_deliveries {
                let buried = bury(client, paths, &picks[index].item, &envelope, &stat).await?;
                outcome[index].0 = if buried { Tried::TakenElsewhere } else { Tried::Again };
                continue;
            }
            envelope.deliveries += 1;
        }
        candidates.push(Candidate {
            index,
            refund: at_most_once && envelope.charge.is_some(),
            data: if at_most_once { Vec::new() } else { envelope.to_bytes() },
            envelope,
            version: stat.version,
        });
    }
    // Persistent: a claim outlives the instance (and session) that made it, until acknowledged,
    // given back or past its deadline (see the module's docs).
    let persistent = CreateMode::Persistent.with_acls(crate::zk::acls());
    while !candidates.is_empty() {
        // As many as stay within one packet, at least one.
        let mut bytes = 0;
        let chunk = candidates
            .iter()
            .take_while(|c| {
                bytes += c.data.len();
                bytes <= CLAIMS_BYTES
            })
            .count()
            .max(1);
        let mut writer = client.new_multi_writer();
        let mut ops = Vec::with_capacity(chunk * 2);
        for (at, c) in candidates[..chunk].iter().enumerate() {
            let pick = &picks[c.index];
            let item_path = &item_paths[c.index];
            if at_most_once {
                writer.add_delete(item_path, Some(c.version))?;
                ops.push((at, Op::Item));
                if c.refund
                    && let Some(charge) = &c.envelope.charge
                {
                    quotas.add_refund(&mut writer, charge)?;
                    ops.push((at, Op::Refund));
                }
            } else {
                writer.add_set_data(item_path, &c.data, Some(c.version))?;
                ops.push((at, Op::Item));
                writer.add_create(
                    &format!("{}/{}", paths.claims, pick.item),
                    &pick.claim_data,
                    &persistent,
                )?;
                ops.push((at, Op::Claim));
            }
        }
        let happened = match writer.commit().await {
            Ok(_) => true,
            Err(MultiWriteError::OperationFailed { index, source }) => {
                let Some(&(at, op)) = ops.get(index) else {
                    return Err(source);
                };
                match (op, source) {
                    // Its charge is gone (usage removed by hand): deleted alone.
                    (Op::Refund, ZkError::NoNode) => candidates[at].refund = false,
                    // Changed since read (claimed and given back meanwhile): try again later.
                    (_, ZkError::BadVersion) => outcome[candidates.remove(at).index].0 = Tried::Again,
                    // Gone, or claimed by another.
                    (_, ZkError::NoNode | ZkError::NodeExists) => {
                        outcome[candidates.remove(at).index].0 = Tried::TakenElsewhere;
                    }
                    (_, source) => return Err(source),
                }
                continue;
            }
            // A lost reply: the multi-op's first effect tells whether all of it happened.
            Err(MultiWriteError::RequestFailed { source }) if crate::zk::is_loss(&source) => {
                let first = &candidates[0];
                if at_most_once {
                    // Gone: ours (taken at most once, a reply lost here loses the item if it
                    // was another's, as the mode says).
                    retry_on_loss(|| client.check_stat(&item_paths[first.index]))
                        .await?
                        .is_none()
                } else {
                    let pick = &picks[first.index];
                    let claim_path = format!("{}/{}", paths.claims, pick.item);
                    match retry_on_loss(|| client.get_data(&claim_path)).await {
                        Ok((data, _)) => data == pick.claim_data,
                        Err(ZkError::NoNode) => false,
                        Err(err) => return Err(err),
                    }
                }
            }
            Err(MultiWriteError::RequestFailed { source }) => return Err(source),
        };
        for c in candidates.drain(..chunk) {
            outcome[c.index] = if happened {
                let taken = Taken {
                    item: picks[c.index].item.clone(),
                    envelope: c.envelope,
                    // A set-data raises the version by exactly one.
                    version: c.version + i32::from(!at_most_once),
                };
                (Tried::Taken, Some(taken))
            } else {
                (Tried::Again, None)
            };
        }
    }
    Ok(outcome)
}

/// Moves an item that has been delivered too often to `dead/`.
async fn bury(
    client: &Client,
    paths: &QueuePaths,
    item: &str,
    envelope: &Envelope,
    stat: &Stat,
) -> Result<bool, ZkError> {
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
            let m = crate::metrics::get();
            m.queue_dead_lettered.with_label_values(&[m.queue(queue)]).inc();
            Ok(true)
        }
        Err(MultiWriteError::OperationFailed { .. }) => Ok(false), // changed meanwhile: someone else decides
        Err(MultiWriteError::RequestFailed { source }) if crate::zk::is_loss(&source) => Ok(false),
        Err(MultiWriteError::RequestFailed { source }) => Err(source),
    }
}

/// Acknowledges the claim `claim` on `item`: deletes the claim (if it is still that claim) and
/// the item together, refunding the item's charge. `false` if the claim is no longer held
/// (given back, and maybe taken by another).
pub async fn ack(
    client: &Client,
    quotas: &Quotas,
    paths: &QueuePaths,
    item: &str,
    claim: &str,
) -> Result<bool, ZkError> {
    let claim_path = format!("{}/{item}", paths.claims);
    let item_path = format!("{}/{item}", paths.items);
    let stat = match read_claim(client, paths, item).await? {
        Some((record, stat)) if record.claim == claim => stat,
        _ => return Ok(false),
    };
    // Nobody changes the item while the claim stands: its charge is the one read here.
    let charge = match retry_on_loss(|| client.get_data(&item_path)).await {
        Ok((data, _)) => Envelope::parse(&data).charge,
        Err(ZkError::NoNode) => return Ok(false),
        Err(err) => return Err(err),
    };
    match delete_item(
        client,
        quotas,
        &item_path,
        None,
        charge.as_ref(),
        Some((&claim_path, stat.version)),
    )
    .await
    {
        Ok(()) => Ok(true),
        Err(MultiWriteError::OperationFailed { .. }) => Ok(false),
        // A lost reply: done if the item is gone (nobody else could delete it while the claim
        // stood), otherwise not.
        Err(MultiWriteError::RequestFailed { source }) if crate::zk::is_loss(&source) => {
            Ok(retry_on_loss(|| client.check_stat(&item_path)).await?.is_none())
        }
        Err(MultiWriteError::RequestFailed { source }) => Err(source),
    }
}

/// A claim this instance made, as its acknowledgement needs it.
pub struct HeldClaim<'a> {
    pub item: &'a str,
    /// The item's version when claimed ([Taken::version]).
    pub version: i32,
    pub charge: Option<&'a Charge>,
}

/// Acknowledges claims this instance made, all in one multi-op: each item deleted if it still
/// has the version its claim gave it, its claim deleted, its charge refunded. No read first:
/// an item claimed by anyone since has another version (a claim always raises it), so a claim
/// node there is still ours, and one given back meanwhile is missing (the delete fails).
/// `false` (nothing done) if any of them is no longer as claimed; the caller then settles each
/// on its own ([ack]).
pub async fn ack_held(
    client: &Client,
    quotas: &Quotas,
    paths: &QueuePaths,
    claims: &[HeldClaim<'_>],
) -> Result<bool, ZkError> {
    let Some(first) = claims.first() else {
        return Ok(true);
    };
    let mut writer = client.new_multi_writer();
    for claim in claims {
        // The item first: its deletion event reaches the queue's mirrors before the claim's,
        // so that no taker is woken for an item that is going.
        writer.add_delete(&format!("{}/{}", paths.items, claim.item), Some(claim.version))?;
        writer.add_delete(&format!("{}/{}", paths.claims, claim.item), None)?;
        if let Some(charge) = claim.charge {
            quotas.add_refund(&mut writer, charge)?;
        }
    }
    match writer.commit().await {
        Ok(_) => Ok(true),
        Err(MultiWriteError::OperationFailed { .. }) => Ok(false),
        // A lost reply: done if the first item is gone (nobody else deletes an item while a
        // claim on it stands); if not, nothing happened.
        Err(MultiWriteError::RequestFailed { source }) if crate::zk::is_loss(&source) => {
            let path = format!("{}/{}", paths.items, first.item);
            Ok(retry_on_loss(|| client.check_stat(&path)).await?.is_none())
        }
        Err(MultiWriteError::RequestFailed { source }) => Err(source),
    }
}

/// Gives the claim `claim` on `item` back (nack, or a missed deadline): the item is taken
/// again later. `false` if it is no longer held.
pub async fn release_claim(client: &Client, paths: &QueuePaths, item: &str, claim: &str) -> Result<bool, ZkError> {
    let claim_path = format!("{}/{item}", paths.claims);
    match read_claim(client, paths, item).await? {
        Some((record, stat)) if record.claim == claim => {
            match retry_on_loss(|| client.delete(&claim_path, Some(stat.version))).await {
                Ok(()) | Err(ZkError::NoNode) => Ok(true),
                Err(ZkError::BadVersion) => Ok(false),
                Err(err) => Err(err),
            }
        }
        _ => Ok(false),
    }
}

/// The items under `dir` (`items/` or `dead/`), each with its place in queue order as text
/// (priority, then sequence: it sorts as the queue does), for paging.
pub async fn names(session: &Session, dir: &str) -> Result<Vec<(String, String)>, Failure> {
    let client = session.client();
    let children = match retry_on_loss(|| client.list_children(dir)).await {
        Ok(children) => children,
        Err(ZkError::NoNode) => return Ok(Vec::new()),
        Err(err) => return Err(err.into()),
    };
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
pub async fn replay(session: &Session, paths: &QueuePaths, item: &str) -> Result<bool, Failure> {
    let client = session.client();
    let dead_path = format!("{}/{item}", paths.dead);
    let (data, stat) = match retry_on_loss(|| client.get_data(&dead_path)).await {
        Ok(read) => read,
        Err(ZkError::NoNode) => return Ok(false),
        Err(err) => return Err(err.into()),
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
        Err(MultiWriteError::RequestFailed { source }) => Err(source.into()),
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
