//! A take: at least once (a claim with an ack deadline) or at most once, in batches, long-polled.

use super::*;
use crate::http::guards::{GuardHeader, Guarded};

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

/// Takes the next item (a long poll): by default claims it (at least once: acknowledge it, or
/// it comes back after the ack deadline); with `mode=at-most-once` removes it. 204 when the
/// wait ends with the queue empty. Waiters on one instance share one ZooKeeper watch, and
/// each new item wakes one of them.
#[utoipa::path(post, path = "/v1/queues/{name}/take", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), TakeQuery, GuardHeader),
    responses(
        (status = 200, description = "An item (with `max_items`, `{\"items\": [...]}`)", body = TakeAnswer),
        (status = 204, description = "No item within the wait"),
        Problems<(p::InvalidField, p::ZookeeperUnavailable)>,
    ))]
pub async fn take(
    State(state): State<AppState>,
    caller: Caller,
    Guarded(guards): Guarded,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<TakeQuery>,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    let mode = query.mode.unwrap_or(TakeMode::AtLeastOnce);
    let ack_deadline = match (mode, query.ack_deadline) {
        (TakeMode::AtMostOnce, Some(_)) => {
            let detail = "only applies to at-least-once takes";
            return Err(ApiError::invalid(Place::Query, "ack_deadline", detail));
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
            let detail = format!("must be from 1 to {MAX_BATCH}");
            return Err(ApiError::invalid(Place::Query, "max_items", detail));
        }
        n => n,
    };
    let wait = query.wait.map(|w| w.0);
    let taken = queues::dequeue(
        &state,
        (&caller, &guards),
        &name,
        (ack_deadline, max_items.unwrap_or(1)),
        wait,
    )
    .await?;
    if taken.is_empty() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let mut items: Vec<Delivery> = taken
        .into_iter()
        .map(|(taken, claim)| delivery(&name, taken, claim.as_ref()))
        .collect();
    let answer = match max_items {
        Some(_) => TakeAnswer::Batch(Deliveries { items }),
        None => TakeAnswer::One(Box::new(items.remove(0))),
    };
    Ok(Json(answer).into_response())
}

pub(super) fn delivery(queue: &str, taken: Taken, claim: Option<&Claim>) -> Delivery {
    let (body, text, body_base64) = shown(&taken.envelope);
    Delivery {
        queue: queue.to_string(),
        priority: queues::order_of(&taken.item)
            .map(|o| o.0)
            .unwrap_or(queues::DEFAULT_PRIORITY),
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
