//! A queue's operations as the API takes and answers them: a put's query and body, a take's
//! query and its deliveries, a batch of acks, an item as a listing shows it.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use zookeeper_client::Stat;

use super::service::{Claim, TakeOptions};
use super::{DEFAULT_PRIORITY, Envelope, Placement, Put, Shown, Taken, ack, extend, order_of, put};
use crate::auth::Caller;
use crate::problem::{ApiError, Place, Problem};
use crate::recipes::guards::Guard;
use crate::recipes::guards::{Guards, retry_guarded};
use crate::recipes::idempotency::Key;
use crate::recipes::idempotency::{KeyError, Keyed};
use crate::recipes::usage::Payer;
use crate::recipes::{Recipes, check_name};
use crate::time::{HumanDuration, at_most, from_millis, millis_since, timestamp};
use crate::zk::Failure;

/// Query of a put.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PutQuery {
    /// 0 (first) to 99 (last); items of one priority are taken in the order they were put.
    /// Default 50.
    #[param(minimum = 0, maximum = 99)]
    pub priority: Option<u8>,
    /// Not to be taken before this long from now (a delayed item; at most 30 days).
    #[param(value_type = Option<String>, example = "10m")]
    pub delay: Option<HumanDuration>,
    /// Not to be taken before this time (RFC 3339 in UTC; a time past is now). With `delay`
    /// too, the later of the two.
    #[param(example = "2026-11-23T10:00:00Z")]
    pub not_before: Option<String>,
}

/// The longest an item may be delayed.
pub const MAX_DELAY: Duration = Duration::from_secs(30 * 24 * 3600);

/// When a put's item may be taken (ms since the epoch), if it is delayed: the later of `delay`
/// from now and `not_before` when both are given.
fn due_of(query: &PutQuery) -> Result<Option<i64>, ApiError> {
    let after_delay = match &query.delay {
        Some(delay) if delay.0 > MAX_DELAY => {
            let detail = "must be at most 30 days (720h)";
            return Err(ApiError::invalid(Place::Query, "delay", detail));
        }
        Some(delay) if !delay.0.is_zero() => Some(crate::time::ms_after_now(delay.0)),
        _ => None,
    };
    // Any time: a delayed item waits in the queue like any other, bounded by the queue's depth
    // limit and the quotas, not by how far ahead its time is.
    let at_time = match &query.not_before {
        Some(at) => {
            let at = crate::time::parse_utc(at).map_err(|e| {
                ApiError::invalid(
                    Place::Query,
                    "not_before",
                    format!("`{at}` is not an RFC 3339 time in UTC like `2026-11-23T10:00:00Z`: {e}"),
                )
            })?;
            let ms = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
            (ms > crate::time::now_ms() as u128).then(|| i64::try_from(ms).unwrap_or(i64::MAX))
        }
        None => None,
    };
    Ok(after_delay.max(at_time))
}

/// Answer of a put.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Stored {
    #[schema(example = "emails")]
    pub queue: String,
    /// The item's znode, when stored by this request.
    #[schema(example = "queue-0000000042")]
    pub item: Option<String>,
    /// `true` when an earlier put with the same `Idempotency-Key` stored it.
    pub duplicate: bool,
}

fn body_of(content_type: Option<&str>, bytes: &[u8]) -> Result<Envelope, ApiError> {
    let content_type = content_type.unwrap_or("application/octet-stream");
    if Envelope::is_json(content_type) {
        serde_json::from_slice::<serde::de::IgnoredAny>(bytes)
            .map_err(|e| ApiError::malformed_body(format!("the body is not valid JSON: {e}")))?;
    }
    Ok(Envelope {
        content_type: content_type.to_string(),
        body: bytes.to_vec(),
        put_at_ms: crate::time::now_ms(),
        deliveries: 0,
        charge: None,
    })
}

/// How to take.
#[derive(Deserialize, Clone, Copy, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TakeMode {
    /// Claim the item; it is removed by an ack and comes back after a nack or the deadline.
    AtLeastOnce,
    /// Remove the item before returning it: a lost reply loses it.
    AtMostOnce,
}

/// Query of a take.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TakeQuery {
    /// How long to wait for an item (capped by the server's maximum, which is the default).
    #[param(value_type = Option<String>, example = "30s")]
    pub wait: Option<HumanDuration>,
    /// `at-least-once` (default) or `at-most-once`.
    #[param(value_type = Option<String>, example = "at-least-once")]
    pub mode: Option<TakeMode>,
    /// How long a claim lasts without an ack (default 30s, at most 12h).
    #[param(value_type = Option<String>, example = "30s")]
    pub ack_deadline: Option<HumanDuration>,
    /// Take up to this many items at once (1 to 100): the answer is then `{"items": [...]}`,
    /// at least one item as soon as one is there (the wait does not wait for more). Without
    /// it, the answer is one item itself.
    #[param(minimum = 1, maximum = 100, example = 10)]
    pub max_items: Option<usize>,
}

/// Most items one take claims, and most claims one batch acknowledges.
pub const MAX_BATCH: usize = 100;

/// What a take answers: one item, or with `max_items` a batch.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum TakeAnswer {
    One(Box<Delivery>),
    Batch(Deliveries),
}

/// Items taken at once (`max_items`), in queue order.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Deliveries {
    pub items: Vec<Delivery>,
}

/// A taken item.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Delivery {
    #[schema(example = "emails")]
    pub queue: String,
    #[schema(example = "queue-0000000042")]
    pub item: String,
    pub priority: u8,
    /// Acknowledge with `POST /v1/queues/{name}/claims/{claim}/ack` (at least once only).
    pub claim: Option<String>,
    /// When the claim lapses and the item is delivered again.
    #[schema(format = DateTime)]
    pub ack_deadline_at: Option<String>,
    /// How many times the item has been claimed, this one included.
    pub deliveries: u32,
    #[schema(format = DateTime)]
    pub put_at: String,
    pub content_type: String,
    /// The body, when JSON (any JSON value).
    pub body: Option<serde_json::Value>,
    /// The body, when text.
    pub text: Option<String>,
    /// The body, base64-encoded, when it is binary.
    pub body_base64: Option<String>,
}

/// Longest ack deadline a take may ask for (as SQS's longest visibility timeout).
pub(crate) const MAX_ACK_DEADLINE: Duration = Duration::from_secs(12 * 3600);

impl Delivery {
    /// An item as a take answers it.
    pub fn of(queue: &str, taken: Taken, claim: Option<&Claim>) -> Delivery {
        let (body, text, body_base64) = shown(&taken.envelope);
        Delivery {
            queue: queue.to_string(),
            priority: order_of(&taken.item).map(|o| o.0).unwrap_or(DEFAULT_PRIORITY),
            item: taken.item,
            claim: claim.map(|c| c.id.clone()),
            ack_deadline_at: claim.map(|c| timestamp(from_millis(c.deadline_ms))),
            deliveries: taken.envelope.deliveries,
            put_at: timestamp(from_millis(taken.envelope.put_at_ms)),
            content_type: taken.envelope.content_type,
            body,
            text,
            body_base64,
        }
    }
}

/// Claims to acknowledge together.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AckBody {
    /// The claims (1 to 100), each from a take of this queue through any instance.
    #[schema(example = json!(["0badcafe-4f1e2d3c4b5a69788796a5b4c3d2e1f0.71756575652d30303030303030303132", "0badcafe-0123456789abcdef0123456789abcdef.71756575652d30303030303030303133"]), min_items = 1, max_items = 100)]
    pub claims: Vec<String>,
}

/// Body of a claim's extension.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendBody {
    /// The claim's new ack deadline, from now (at most 12h, as a take's).
    #[schema(value_type = String, example = "30s")]
    pub ack_deadline: HumanDuration,
}

/// A claim extended.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Extended {
    pub claim: String,
    /// When the claim now lapses, unless extended again or acknowledged.
    #[schema(format = DateTime)]
    pub ack_deadline_at: String,
}

/// An `ack_deadline` (a take's, in its query; an extension's, in its body), if above zero and
/// at most [MAX_ACK_DEADLINE].
fn checked_deadline(deadline: Duration, place: Place) -> Result<Duration, ApiError> {
    if deadline.is_zero() {
        return Err(ApiError::invalid(place, "ack_deadline", "must be above zero"));
    }
    at_most(deadline, MAX_ACK_DEADLINE).map_err(|e| ApiError::invalid(place, "ack_deadline", e))
}

/// Extends a claim (`POST .../claims/{claim}/extend`): 410 `claim-lost` if it is not held.
pub async fn extend_claim_by(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    (name, claim): (&str, String),
    body: ExtendBody,
) -> Result<Extended, ApiError> {
    check_name(name)?;
    let ack_deadline = checked_deadline(body.ack_deadline.0, Place::Body)?;
    let deadline_ms = extend(recipes, (caller, guards), name, &claim, ack_deadline).await?;
    Ok(Extended {
        claim,
        ack_deadline_at: timestamp(from_millis(deadline_ms)),
    })
}

/// What became of each claim of a batch.
#[derive(Serialize, utoipa::ToSchema, Default)]
pub struct AckAnswer {
    /// Acknowledged: their items are gone for good (a claim acknowledged before counts too).
    pub acked: Vec<String>,
    /// Not held any more: their items are (or will be) delivered again.
    pub lost: Vec<LostClaim>,
}

/// A claim a batch could not acknowledge, and why.
#[derive(Serialize, utoipa::ToSchema)]
pub struct LostClaim {
    pub claim: String,
    pub detail: String,
}

/// An item waiting (or dead) in a queue.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Waiting {
    #[schema(example = "queue-500000000042")]
    pub item: String,
    #[schema(example = 50)]
    pub priority: u8,
    #[schema(example = 1)]
    pub deliveries: u32,
    #[schema(example = 5300)]
    pub age_ms: u64,
    #[schema(example = "application/json")]
    pub content_type: String,
    /// The body, when JSON (any JSON value).
    #[schema(example = json!({"to": "ada@example.com"}))]
    pub body: Option<serde_json::Value>,
    pub text: Option<String>,
    pub body_base64: Option<String>,
    /// For a delayed item: not taken before this time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_before: Option<String>,
}

/// Query of a listing of items.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ItemsQuery {
    /// How many items, first to take first (default 100, at most 1000). When more follow, the
    /// answer's `Link` header (`rel="next"`) is the URL of the next page.
    #[param(minimum = 1, maximum = 1000)]
    #[allow(dead_code)] // read with the cursor (`Paging`); here for the spec and the field check
    pub limit: Option<usize>,
    /// Where the page starts: the `cursor` of the previous page's `Link` (opaque).
    #[param(max_length = 4096, pattern = "^([0-9a-f]{2})*$")]
    #[allow(dead_code)] // as `limit`
    pub cursor: Option<String>,
}

/// Most items a listing returns.
pub const MAX_LISTED: usize = 1000;

/// An item's body as the views show it: `(body, text, body_base64)`, one of them set.
fn shown(envelope: &Envelope) -> (Option<serde_json::Value>, Option<String>, Option<String>) {
    match envelope.shown() {
        Shown::Json(value) => (Some(value), None, None),
        Shown::Text(text) => (None, Some(text), None),
        Shown::Base64(encoded) => (None, None, Some(encoded)),
    }
}

impl Waiting {
    /// An item as a listing shows it.
    pub fn of((item, envelope, stat): (String, Envelope, Stat)) -> Waiting {
        let (body, text, body_base64) = shown(&envelope);
        Waiting {
            priority: order_of(&item).map(|o| o.0).unwrap_or(DEFAULT_PRIORITY),
            not_before: super::topic::not_before(&item),
            item,
            deliveries: envelope.deliveries,
            age_ms: millis_since(from_millis(stat.ctime)),
            content_type: envelope.content_type,
            body,
            text,
            body_base64,
        }
    }
}

/// A put (`POST /v1/queues/{name}/items`): the body as sent, with its `Content-Type`, at the
/// priority and due time `query` asks; stored once for an idempotency `key` (`duplicate`: stored
/// before with it). 429 `queue-full` at `--queue-max-depth`.
pub async fn enqueue(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    name: &str,
    query: PutQuery,
    (content_type, bytes): (Option<&str>, &[u8]),
    key: Option<&Key>,
) -> Result<Stored, ApiError> {
    check_name(name)?;
    if query.priority.is_some_and(|p| p > 99) {
        return Err(ApiError::invalid(Place::Query, "priority", "must be 0 to 99"));
    }
    let due_ms = due_of(&query)?;
    let envelope = body_of(content_type, bytes)?;
    recipes.check_stored_size("item", envelope.to_bytes().len())?;
    let placement = Placement {
        priority: query.priority,
        due_ms,
    };
    let session = recipes.zk().connected().await?;
    let paths = recipes.queues.paths(name);
    let payer = Payer {
        quotas: &recipes.quotas,
        principal: caller.name(),
    };
    let keyed = key.map(|key| Keyed {
        keys: &recipes.idempotency,
        key,
    });
    let delayed = placement.due_ms.is_some();
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    let put = retry_guarded!(
        guards,
        recipes,
        Err(KeyError::ZooKeeper(Failure::Unguarded)),
        put(
            &session,
            &paths,
            placement,
            &envelope,
            (keyed, guards),
            recipes.queue_max_depth,
            payer
        )
        .await
    );
    let item = match put? {
        Put::Stored(item) => {
            let m = crate::metrics::get();
            m.queue_puts.with_label_values(&[m.queue(name)]).inc();
            if delayed {
                m.queue_delayed_puts.with_label_values(&[m.queue(name)]).inc();
            }
            Some(item)
        }
        Put::Duplicate => None,
        // The producer should back off until consumers catch up.
        Put::Full(depth) => {
            let detail = format!("queue `{name}` holds {depth} items, its limit (--queue-max-depth); take some first");
            return Err(ApiError::new(Problem::QueueFull, detail).with("depth", depth));
        }
        Put::Quota(exceeded) => return Err(ApiError::from(exceeded)),
    };
    Ok(Stored {
        queue: name.to_string(),
        duplicate: item.is_none(),
        item,
    })
}

/// A take (`POST /v1/queues/{name}/take`) as `query` asks it, waiting (up to its `wait`,
/// capped) for an item: claimed until the ack deadline (at least once), or deleted (at most
/// once). One item, a batch, or `None` when the wait ends with the queue empty. Counted,
/// redeliveries too.
pub async fn dequeue(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    name: &str,
    query: TakeQuery,
) -> Result<Option<TakeAnswer>, ApiError> {
    check_name(name)?;
    let mode = query.mode.unwrap_or(TakeMode::AtLeastOnce);
    let ack_deadline = match (mode, query.ack_deadline) {
        (TakeMode::AtMostOnce, Some(_)) => {
            let detail = "only applies to at-least-once takes";
            return Err(ApiError::invalid(Place::Query, "ack_deadline", detail));
        }
        (TakeMode::AtMostOnce, None) => None,
        (TakeMode::AtLeastOnce, deadline) => {
            let deadline = deadline.map(|d| d.0).unwrap_or(Duration::from_secs(30));
            Some(checked_deadline(deadline, Place::Query)?)
        }
    };
    let max_items = match query.max_items {
        Some(n) if n == 0 || n > MAX_BATCH => {
            let detail = format!("must be from 1 to {MAX_BATCH}");
            return Err(ApiError::invalid(Place::Query, "max_items", detail));
        }
        n => n,
    };
    recipes.zk().current()?;
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    let until = tokio::time::Instant::now() + recipes.wait(query.wait.map(|w| w.0));
    // The options made on each attempt: a refused guard's checks are refreshed before the next.
    let options = || TakeOptions {
        ack_deadline,
        max_deliveries: recipes.queue_max_deliveries,
        max_items: max_items.unwrap_or(1),
        max_bytes: recipes.max_value_bytes,
        guards: guards.checked(),
    };
    let taken = retry_guarded!(
        guards,
        recipes,
        Err(Failure::Unguarded),
        recipes.queues.take(name, caller.name(), options(), until).await
    );
    let taken = taken?;
    let m = crate::metrics::get();
    let [at_least_once, at_most_once] = crate::metrics::QUEUE_MODES;
    let label = m.queue(name);
    for (taken, claim) in &taken {
        let mode = if claim.is_some() { at_least_once } else { at_most_once };
        m.queue_takes.with_label_values(&[label, mode]).inc();
        if taken.envelope.deliveries > 1 {
            m.queue_redeliveries.with_label_values(&[label]).inc();
        }
    }
    if taken.is_empty() {
        return Ok(None);
    }
    let mut items: Vec<Delivery> = taken
        .into_iter()
        .map(|(taken, claim)| Delivery::of(name, taken, claim.as_ref()))
        .collect();
    Ok(Some(match max_items {
        Some(_) => TakeAnswer::Batch(Deliveries { items }),
        None => TakeAnswer::One(Box::new(items.remove(0))),
    }))
}

/// Acknowledges one claim (`POST .../claims/{claim}/ack`): 410 `claim-lost` if it is not held.
pub async fn ack_one(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    name: &str,
    claim: String,
) -> Result<(), ApiError> {
    check_name(name)?;
    let answer = ack(recipes, (caller, guards), name, vec![claim]).await?;
    match answer.lost.into_iter().next() {
        None => Ok(()),
        Some((_, why)) => Err(ApiError::new(Problem::ClaimLost, why)),
    }
}

/// Acknowledges the claims of `body` together (`POST .../claims/ack`), each claim a valid id
/// named once.
pub async fn ack_batch(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    name: &str,
    body: AckBody,
) -> Result<AckAnswer, ApiError> {
    check_name(name)?;
    if body.claims.is_empty() || body.claims.len() > MAX_BATCH {
        let detail = format!("must hold 1 to {MAX_BATCH} claims");
        return Err(ApiError::invalid(Place::Body, "claims", detail));
    }
    let mut seen = std::collections::HashSet::new();
    for claim in &body.claims {
        let detail = if crate::ids::claimed_item(claim).is_none() {
            format!("`{claim}` is not a claim id (`<instance>-<32 hex>.<hex>`, as a take answers)")
        } else if !seen.insert(claim.as_str()) {
            format!("`{claim}` is listed twice")
        } else {
            continue;
        };
        return Err(ApiError::invalid(Place::Body, "claims", detail));
    }
    let answer = ack(recipes, (caller, guards), name, body.claims).await?;
    Ok(AckAnswer {
        acked: answer.acked,
        lost: (answer.lost.into_iter())
            .map(|(claim, detail)| LostClaim { claim, detail })
            .collect(),
    })
}
