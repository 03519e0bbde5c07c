//! An item: its name (priority, due time and sequence, in queue order) and its envelope (the
//! body as stored, with its content type, put time, deliveries and charge).

use serde::{Deserialize, Serialize};

use crate::recipes::usage::Charge;

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
