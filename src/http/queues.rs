//! `/v1/queues`: durable queues and priority queues: put (idempotent with a key, bounded),
//! take at least once (claim, ack, nack, ack deadline, dead letters) or at most once, long
//! polls, depth and peek.
//!
//! Over 600 lines: every queue route with its request and answer types (their spec is generated
//! from them); issue 31 splits puts, takes and claims into files of their own.

use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::consistency::Consistency;
use super::error::{ApiError, Place, Problem, Problems, p};
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::paging::{Paging, with_link};
use super::{ListedResource, Resource, check_name, list, state_handler};
use crate::AppState;
use crate::auth::Caller;
use crate::events::Feed;
use crate::kind::Kind;
use crate::recipes::queue::service::{Claim, TakeOptions};
use crate::recipes::queue::topic::{QueueState, QueueTopic};
use crate::recipes::queue::{self, Envelope, Put, Shown, Taken};
use crate::recipes::usage::Payer;
use crate::time::{HumanDuration, at_most, from_millis, millis_since, timestamp};
use crate::zk::names::validate_name;

/// The queue kind's module.
pub const RESOURCE: Resource = Resource {
    kind: Kind::Queue,
    about: Some(
        "Durable queues and priority queues: idempotent puts, at-least-once takes with ack deadlines, dead letters.",
    ),
    routes,
    topic: Some(|state, name| Feed::of(source(state, name))),
};

// The old paths of the dead letters are served, and listed as deprecated, until clients move.
#[allow(deprecated)]
fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(queue_events))
        .routes(routes!(list_queues))
        .routes(routes!(queue_state))
        .routes(routes!(items, put))
        .routes(routes!(take))
        .routes(routes!(ack))
        .routes(routes!(ack_batch))
        .routes(routes!(nack))
        .routes(routes!(dead_letters))
        .routes(routes!(replay))
        .routes(routes!(dead_letters_old_path))
        .routes(routes!(replay_old_path))
}

/// Queue `name` as its topic and `GET` read it.
fn source(state: &AppState, name: &str) -> QueueTopic {
    QueueTopic {
        name: name.to_string(),
        paths: state.queues.paths(name),
    }
}

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
            return Err(ApiError::invalid(
                Place::Query,
                "delay",
                "must be at most 30 days (720h)",
            ));
        }
        Some(delay) if !delay.0.is_zero() => Some(crate::time::ms_after_now(delay.0)),
        _ => None,
    };
    // Any time: a delayed item waits in the queue like any other, bounded by the queue's depth
    // limit and the quotas, not by how far ahead its time is.
    let at_time = match &query.not_before {
        Some(at) => {
            let at = humantime::parse_rfc3339(at).map_err(|e| {
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

/// Claims to acknowledge together.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AckBody {
    /// The claims (1 to 100), each from a take of this queue through any instance.
    #[schema(example = json!(["0badcafe-4f1e2d3c4b5a69788796a5b4c3d2e1f0.71756575652d30303030303030303132", "0badcafe-0123456789abcdef0123456789abcdef.71756575652d30303030303030303133"]), min_items = 1, max_items = 100)]
    pub claims: Vec<String>,
}

/// What became of each claim of a batch.
#[derive(Serialize, utoipa::ToSchema)]
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
    pub ack_deadline_at: Option<String>,
    /// How many times the item has been claimed, this one included.
    pub deliveries: u32,
    pub put_at: String,
    pub content_type: String,
    /// The body, when JSON (any JSON value).
    pub body: Option<serde_json::Value>,
    /// The body, when text.
    pub text: Option<String>,
    /// The body, base64-encoded, when it is binary.
    pub body_base64: Option<String>,
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

/// Longest ack deadline a take may ask for (as SQS's longest visibility timeout).
pub(crate) const MAX_ACK_DEADLINE: Duration = Duration::from_secs(12 * 3600);

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
const MAX_LISTED: usize = 1000;

fn body_of(headers: &HeaderMap, bytes: &[u8]) -> Result<Envelope, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/octet-stream");
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

/// An item's body as the views show it: `(body, text, body_base64)`, one of them set.
fn shown(envelope: &Envelope) -> (Option<serde_json::Value>, Option<String>, Option<String>) {
    match envelope.shown() {
        Shown::Json(value) => (Some(value), None, None),
        Shown::Text(text) => (None, Some(text), None),
        Shown::Base64(encoded) => (None, None, Some(encoded)),
    }
}

fn waiting_view(item: String, envelope: Envelope, ctime: i64) -> Waiting {
    let (body, text, body_base64) = shown(&envelope);
    Waiting {
        priority: queue::order_of(&item).map(|o| o.0).unwrap_or(queue::DEFAULT_PRIORITY),
        not_before: queue::topic::not_before(&item),
        item,
        deliveries: envelope.deliveries,
        age_ms: millis_since(from_millis(ctime)),
        content_type: envelope.content_type,
        body,
        text,
        body_base64,
    }
}

/// Puts an item: JSON (`Content-Type: application/json`), text, or any bytes (returned
/// base64-encoded). With an
/// `Idempotency-Key`, a retried put is stored once. A full queue answers 429 (with `Retry-After`).
#[utoipa::path(post, path = "/v1/queues/{name}/items", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), PutQuery,
        ("Idempotency-Key" = Option<String>, Header, description = "Makes the put safe to retry (1 to 128 bytes, no `/`)")),
    request_body(description = "The item: JSON, text or bytes, kept with its `Content-Type`",
        content((serde_json::Value = "application/json", example = json!({"to": "ada@example.com", "template": "welcome"})),
            (String = "text/plain", example = json!("resize photo 42")),
            (String = "application/octet-stream"))),
    responses(
        (status = 201, description = "Stored", body = Stored),
        (status = 200, description = "A put with this key was stored before", body = Stored),
        Problems<(p::InvalidField, p::MalformedBody, p::BodyTooLarge, p::ValueTooLarge, p::QueueFull, p::QuotaExceeded, p::ZookeeperUnavailable)>,
    ))]
pub async fn put(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<PutQuery>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    if query.priority.is_some_and(|p| p > 99) {
        return Err(ApiError::invalid(Place::Query, "priority", "must be 0 to 99"));
    }
    let due_ms = due_of(&query)?;
    let key = match headers.get(super::leases::IDEMPOTENCY_KEY) {
        Some(value) => {
            let key = value
                .to_str()
                .map_err(|_| ApiError::invalid(Place::Header, "Idempotency-Key", "must be ASCII"))?;
            validate_name(key).map_err(|e| ApiError::invalid(Place::Header, "Idempotency-Key", e))?;
            Some(key.to_string())
        }
        None => None,
    };
    let bytes = body.map_err(super::extract::body_rejection)?;
    let envelope = body_of(&headers, &bytes)?;
    super::check_stored_size(&state, "item", envelope.to_bytes().len())?;
    let session = state.zk().connected().await?;
    let paths = state.queues.paths(&name);
    let max_depth = state.config.queue_max_depth;
    let payer = Payer {
        quotas: &state.quotas,
        principal: caller.name(),
    };
    let put = queue::put(
        &session,
        &paths,
        queue::Placement {
            priority: query.priority,
            due_ms,
        },
        &envelope,
        key.as_deref(),
        max_depth,
        payer,
    )
    .await?;
    let (status, item) = match put {
        Put::Stored(item) => {
            let m = crate::metrics::get();
            m.queue_puts.with_label_values(&[m.queue(&name)]).inc();
            if due_ms.is_some() {
                m.queue_delayed_puts.with_label_values(&[m.queue(&name)]).inc();
            }
            (StatusCode::CREATED, Some(item))
        }
        Put::Duplicate => (StatusCode::OK, None),
        // The producer should back off until consumers catch up.
        Put::Full(depth) => {
            return Err(ApiError::new(
                Problem::QueueFull,
                format!("queue `{name}` holds {depth} items, its limit (--queue-max-depth); take some first"),
            )
            .with("depth", depth));
        }
        Put::Quota(exceeded) => return Err(ApiError::quota(exceeded)),
    };
    let stored = Stored {
        queue: name,
        duplicate: item.is_none(),
        item,
    };
    Ok((status, Json(stored)).into_response())
}

/// Takes the next item (a long poll): by default claims it (at least once: acknowledge it, or
/// it comes back after the ack deadline); with `mode=at-most-once` removes it. 204 when the
/// wait ends with the queue empty. Waiters on one instance share one ZooKeeper watch, and
/// each new item wakes one of them.
#[utoipa::path(post, path = "/v1/queues/{name}/take", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), TakeQuery),
    responses(
        (status = 200, description = "An item (with `max_items`, `{\"items\": [...]}`)", body = TakeAnswer),
        (status = 204, description = "No item within the wait"),
        Problems<(p::InvalidField, p::ZookeeperUnavailable)>,
    ))]
pub async fn take(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<TakeQuery>,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    let mode = query.mode.unwrap_or(TakeMode::AtLeastOnce);
    let ack_deadline = match (mode, query.ack_deadline) {
        (TakeMode::AtMostOnce, Some(_)) => {
            return Err(ApiError::invalid(
                Place::Query,
                "ack_deadline",
                "only applies to at-least-once takes",
            ));
        }
        (TakeMode::AtMostOnce, None) => None,
        (TakeMode::AtLeastOnce, deadline) => {
            let deadline = deadline.map(|d| d.0).unwrap_or(Duration::from_secs(30));
            if deadline.is_zero() {
                return Err(ApiError::invalid(Place::Query, "ack_deadline", "must be above zero"));
            }
            at_most(deadline, MAX_ACK_DEADLINE).map_err(|e| ApiError::invalid(Place::Query, "ack_deadline", e))?;
            Some(deadline)
        }
    };
    let max_items = match query.max_items {
        Some(n) if n == 0 || n > MAX_BATCH => {
            return Err(ApiError::invalid(
                Place::Query,
                "max_items",
                format!("must be from 1 to {MAX_BATCH}"),
            ));
        }
        n => n,
    };
    state.zk().current()?;
    let wait = state.config.wait(query.wait.map(|w| w.0));
    let options = TakeOptions {
        ack_deadline,
        max_deliveries: state.config.queue_max_deliveries,
        max_items: max_items.unwrap_or(1),
        max_bytes: state.config.max_value_bytes,
    };
    let taken = state
        .queues
        .take(&name, caller.name(), options, Instant::now() + wait)
        .await?;
    if taken.is_empty() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let m = crate::metrics::get();
    let [at_least_once, at_most_once] = crate::metrics::QUEUE_MODES;
    let label = m.queue(&name);
    let mut items: Vec<Delivery> = Vec::with_capacity(taken.len());
    for (taken, claim) in taken {
        let mode = if claim.is_some() { at_least_once } else { at_most_once };
        m.queue_takes.with_label_values(&[label, mode]).inc();
        if taken.envelope.deliveries > 1 {
            m.queue_redeliveries.with_label_values(&[label]).inc();
        }
        items.push(delivery(&name, taken, claim.as_ref()));
    }
    let answer = match max_items {
        Some(_) => TakeAnswer::Batch(Deliveries { items }),
        None => TakeAnswer::One(Box::new(items.remove(0))),
    };
    Ok(Json(answer).into_response())
}

fn delivery(queue: &str, taken: Taken, claim: Option<&Claim>) -> Delivery {
    let (body, text, body_base64) = shown(&taken.envelope);
    Delivery {
        queue: queue.to_string(),
        priority: queue::order_of(&taken.item)
            .map(|o| o.0)
            .unwrap_or(queue::DEFAULT_PRIORITY),
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

fn claim_lost(claim: &str) -> ApiError {
    ApiError::new(
        Problem::ClaimLost,
        format!("claim `{claim}` is not held (given back, or its ack deadline passed: the item is delivered again)"),
    )
}

/// The claim `claim` of `name` for `caller` (made through any instance, see
/// [Queues::find](crate::recipes::queue::service::Queues::find)), or how an ack (`acking`) or a
/// nack of it that is not held is answered: the same as the first when it is a repeat to this
/// instance (a retry after a lost reply: `Ok(None)`), `410 claim-lost` saying why otherwise.
async fn claim_for(
    state: &AppState,
    caller: &Caller,
    name: &str,
    claim: &str,
    acking: bool,
) -> Result<Option<Claim>, ApiError> {
    let settled = state.queues.settled(name, claim);
    let held = match settled {
        Some(_) => None,
        None => state.queues.find(name, claim).await?,
    };
    if let Some(held) = held {
        caller.require_owner(held.owner.as_deref(), &format!("claim `{claim}`"))?;
        return Ok(Some(held));
    }
    match settled {
        Some(settled) if settled.acked == acking => {
            caller.require_owner(settled.owner.as_deref(), &format!("claim `{claim}`"))?;
            Ok(None)
        }
        Some(settled) => Err(ApiError::new(
            Problem::ClaimLost,
            if settled.acked {
                format!("claim `{claim}` was acknowledged: its item is gone for good")
            } else {
                format!("claim `{claim}` was given back: its item is delivered again")
            },
        )),
        None => Err(claim_lost(claim)),
    }
}

/// Acknowledges a claim, through any instance: the item is removed for good. Acknowledging it
/// again through the same instance answers the same (a retry after a lost reply), for as long
/// as the instance remembers (the last 100,000).
#[utoipa::path(post, path = "/v1/queues/{name}/claims/{claim}/ack", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), ("claim" = String, Path, description = "Claim from the take")),
    responses(
        (status = 204, description = "Acknowledged: the item is gone"),
        Problems<(p::InvalidField, p::ClaimLost, p::ZookeeperUnavailable)>,
    ))]
pub async fn ack(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, claim)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    check_name(&name)?;
    let Some(held) = claim_for(&state, &caller, &name, &claim, true).await? else {
        return Ok(StatusCode::NO_CONTENT);
    };
    let acked = state.queues.ack(&name, std::slice::from_ref(&held)).await?[0];
    if settle_ack(&state, &name, &held, acked) {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(claim_lost(&claim))
    }
}

/// Forgets a held claim once its ack is decided, remembering how (for a repeat) and counting
/// it if acknowledged; whether it was.
fn settle_ack(state: &AppState, queue: &str, held: &Claim, acked: bool) -> bool {
    state.queues.forget(&held.id);
    if acked {
        state.queues.settle(&held.id, held, true);
        let m = crate::metrics::get();
        m.queue_acks.with_label_values(&[m.queue(queue)]).inc();
    }
    acked
}

/// Acknowledges several claims of a queue at once (one ZooKeeper multi-op when they are all
/// still held as claimed and were made through the instance that receives the batch): each
/// claim in `acked` or, with why, in `lost`; a claim acknowledged before is answered as
/// acknowledged again.
#[utoipa::path(post, path = "/v1/queues/{name}/claims/ack", tag = "queues",
    params(("name" = String, Path, description = "Queue name")),
    request_body = AckBody,
    responses(
        (status = 200, description = "What became of each claim", body = AckAnswer),
        Problems<(p::InvalidField, p::MalformedBody, p::Forbidden, p::ZookeeperUnavailable)>,
    ))]
pub async fn ack_batch(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<AckBody>,
) -> Result<Json<AckAnswer>, ApiError> {
    check_name(&name)?;
    if body.claims.is_empty() || body.claims.len() > MAX_BATCH {
        return Err(ApiError::invalid(
            Place::Body,
            "claims",
            format!("must hold 1 to {MAX_BATCH} claims"),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for claim in &body.claims {
        if crate::ids::claimed_item(claim).is_none() {
            return Err(ApiError::invalid(
                Place::Body,
                "claims",
                format!("`{claim}` is not a claim id (`<instance>-<32 hex>.<hex>`, as a take answers)"),
            ));
        }
        if !seen.insert(claim.as_str()) {
            return Err(ApiError::invalid(
                Place::Body,
                "claims",
                format!("`{claim}` is listed twice"),
            ));
        }
    }
    // Every claim's owner is checked before anything is acknowledged.
    let mut answer = AckAnswer {
        acked: Vec::new(),
        lost: Vec::new(),
    };
    let mut held = Vec::new();
    for claim in body.claims {
        match claim_for(&state, &caller, &name, &claim, true).await {
            Ok(Some(claim)) => held.push(claim),
            Ok(None) => answer.acked.push(claim),
            Err(err) if err.problem() == Problem::ClaimLost => answer.lost.push(LostClaim {
                detail: err.detail().to_string(),
                claim,
            }),
            Err(err) => return Err(err),
        }
    }
    let acked = state.queues.ack(&name, &held).await?;
    for (claim, acked) in held.iter().zip(acked) {
        if settle_ack(&state, &name, claim, acked) {
            answer.acked.push(claim.id.clone());
        } else {
            answer.lost.push(LostClaim {
                claim: claim.id.clone(),
                detail: claim_lost(&claim.id).detail().to_string(),
            });
        }
    }
    Ok(Json(answer))
}

/// Gives a claim back, through any instance: the item is delivered again (its delivery count already counts this
/// one). Giving it back again answers the same; an ack after it, `410` (and the other way round).
#[utoipa::path(post, path = "/v1/queues/{name}/claims/{claim}/nack", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), ("claim" = String, Path, description = "Claim from the take")),
    responses(
        (status = 204, description = "Given back"),
        Problems<(p::InvalidField, p::ClaimLost, p::ZookeeperUnavailable)>,
    ))]
pub async fn nack(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, claim)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    check_name(&name)?;
    let Some(held) = claim_for(&state, &caller, &name, &claim, false).await? else {
        return Ok(StatusCode::NO_CONTENT);
    };
    let released = state.queues.release(&held).await?;
    state.queues.forget(&claim);
    if released {
        state.queues.settle(&claim, &held, false);
        let m = crate::metrics::get();
        m.queue_nacks.with_label_values(&[m.queue(&name)]).inc();
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(claim_lost(&claim))
    }
}

state_handler!(
    /// A queue's depth, claims in flight, dead letters, oldest item and next items (without their
    /// bodies: `GET .../items` has them).
    queue_state,
    "/v1/queues/{name}",
    "queues",
    "Queue name",
    QueueState
);

/// The items waiting (and claimed) in a queue, first to take first, with their bodies.
#[utoipa::path(get, path = "/v1/queues/{name}/items", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), ItemsQuery),
    responses(
        (status = 200, body = Vec<Waiting>, headers(("Link" = String, description = "While more entries follow: the next page, `<url>; rel=\"next\"`"))),
        Problems<(p::InvalidField, p::ZookeeperUnavailable)>,
    ))]
pub async fn items(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(_query): ApiQuery<ItemsQuery>,
    consistency: Consistency,
    uri: axum::http::Uri,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    let paging = Paging::parse(uri.path(), uri.query().unwrap_or_default(), 100, MAX_LISTED)?;
    let dir = state.queues.paths(&name).items;
    listed(&state, &dir, &paging, consistency).await
}

/// One page of the items under `dir` (`items/` or `dead/`), in queue order, with their bodies.
async fn listed(state: &AppState, dir: &str, paging: &Paging, consistency: Consistency) -> Result<Response, ApiError> {
    let session = super::consistency::reader(state, consistency).await?;
    let page = paging.page(queue::names(&session, dir).await?, |(place, _)| place.clone());
    let names = page.entries.into_iter().map(|(_, name)| name).collect();
    let items: Vec<Waiting> = queue::read(&session, dir, names)
        .await?
        .into_iter()
        .map(|(item, envelope, stat)| waiting_view(item, envelope, stat.ctime))
        .collect();
    Ok(with_link(page.next, Json(items)))
}

/// The dead letters: items delivered too many times, oldest first (in pages, as `items`).
#[utoipa::path(get, path = "/v1/queues/{name}/dead-letters", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), ItemsQuery),
    responses(
        (status = 200, body = Vec<Waiting>, headers(("Link" = String, description = "While more entries follow: the next page, `<url>; rel=\"next\"`"))),
        Problems<(p::InvalidField, p::ZookeeperUnavailable)>,
    ))]
pub async fn dead_letters(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(_query): ApiQuery<ItemsQuery>,
    consistency: Consistency,
    uri: axum::http::Uri,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    let paging = Paging::parse(uri.path(), uri.query().unwrap_or_default(), 100, MAX_LISTED)?;
    let dir = state.queues.paths(&name).dead;
    listed(&state, &dir, &paging, consistency).await
}

/// Puts a dead item back into the queue, in its old place, its delivery count reset.
#[utoipa::path(post, path = "/v1/queues/{name}/dead-letters/{item}/replay", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), ("item" = String, Path, description = "Dead item")),
    responses(
        (status = 204, description = "Back in the queue"),
        Problems<(p::InvalidField, p::NotFound, p::ZookeeperUnavailable)>,
    ))]
pub async fn replay(
    State(state): State<AppState>,
    ApiPath((name, item)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    check_name(&name)?;
    validate_name(&item).map_err(|e| ApiError::invalid(Place::Path, "item", e))?;
    let session = state.zk().connected().await?;
    if queue::replay(&session, &state.queues.paths(&name), &item).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(
            "item",
            format!("no dead item `{item}` in `{name}`"),
        ))
    }
}

/// The dead letters under their old path: use `GET /v1/queues/{name}/dead-letters`, the name
/// the queue's state, its topic and the metrics use.
#[utoipa::path(get, path = "/v1/queues/{name}/dead", tag = "queues", operation_id = "dead_letters_old_path",
    params(("name" = String, Path, description = "Queue name"), ItemsQuery),
    responses(
        (status = 200, body = Vec<Waiting>, headers(("Link" = String, description = "While more entries follow: the next page, `<url>; rel=\"next\"`"))),
        Problems<(p::InvalidField, p::ZookeeperUnavailable)>,
    ))]
#[deprecated = "the path is /v1/queues/{name}/dead-letters"]
pub async fn dead_letters_old_path(
    state: State<AppState>,
    name: ApiPath<String>,
    query: ApiQuery<ItemsQuery>,
    consistency: Consistency,
    uri: axum::http::Uri,
) -> Result<Response, ApiError> {
    dead_letters(state, name, query, consistency, uri).await
}

/// A replay under its old path: use `POST /v1/queues/{name}/dead-letters/{item}/replay`.
#[utoipa::path(post, path = "/v1/queues/{name}/dead/{item}/replay", tag = "queues", operation_id = "replay_old_path",
    params(("name" = String, Path, description = "Queue name"), ("item" = String, Path, description = "Dead item")),
    responses(
        (status = 204, description = "Back in the queue"),
        Problems<(p::InvalidField, p::NotFound, p::ZookeeperUnavailable)>,
    ))]
#[deprecated = "the path is /v1/queues/{name}/dead-letters/{item}/replay"]
pub async fn replay_old_path(state: State<AppState>, path: ApiPath<(String, String)>) -> Result<StatusCode, ApiError> {
    replay(state, path).await
}

/// Lists the queues.
#[utoipa::path(get, path = "/v1/queues", tag = "queues", params(super::paging::PageQuery), responses(
    (status = 200, body = Vec<ListedResource>, headers(("Link" = String, description = "While more entries follow: the next page, `<url>; rel=\"next\"`"))),
    Problems<(p::ZookeeperUnavailable,)>,
))]
pub async fn list_queues(
    State(state): State<AppState>,
    caller: Caller,
    consistency: Consistency,
    paging: super::paging::Paging,
) -> Result<super::paging::Page<ListedResource>, ApiError> {
    list(&state, &caller, Kind::Queue, consistency, &paging).await
}

super::events::events_handler!(
    /// Follows a queue: its depth, claims and dead letters, as Server-Sent Events.
    queue_events,
    "/v1/queues/{name}/events",
    "queues",
    "name",
    Kind::Queue
);
