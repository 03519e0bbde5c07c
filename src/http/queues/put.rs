//! A put: the item's body as sent, its delay or due time, an idempotency key, the queue's bounds.

use super::*;
use crate::http::guards::{GuardHeader, Guarded};

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
pub(super) fn due_of(query: &PutQuery) -> Result<Option<i64>, ApiError> {
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

pub(super) fn body_of(headers: &HeaderMap, bytes: &[u8]) -> Result<Envelope, ApiError> {
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

/// Puts an item: JSON (`Content-Type: application/json`), text, or any bytes (returned
/// base64-encoded). With an `Idempotency-Key`, a retried put is stored once (answered `200`,
/// `duplicate: true`). A full queue answers 429 (with `Retry-After`).
#[utoipa::path(post, path = "/v1/queues/{name}/items", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), PutQuery, GuardHeader,
        ("Idempotency-Key" = Option<String>, Header, description = crate::http::idempotency::ABOUT)),
    request_body(description = "The item: any JSON value. Text (`text/plain`) and bytes (any other `Content-Type`, read back base64-encoded) are taken too, kept with their `Content-Type`; the spec lists JSON alone, so that a generated client sends it with its media type.",
        content((crate::http::formats::JsonValue = "application/json", example = json!({"to": "ada@example.com", "template": "welcome"})))),
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
    Guarded(guards): Guarded,
    headers: HeaderMap,
    Idempotent { key, inner: body }: Idempotent<Result<Bytes, axum::extract::rejection::BytesRejection>>,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    if query.priority.is_some_and(|p| p > 99) {
        return Err(ApiError::invalid(Place::Query, "priority", "must be 0 to 99"));
    }
    let due_ms = due_of(&query)?;
    let bytes = body.map_err(crate::http::extract::body_rejection)?;
    let envelope = body_of(&headers, &bytes)?;
    state.check_stored_size("item", envelope.to_bytes().len())?;
    let placement = queues::Placement {
        priority: query.priority,
        due_ms,
    };
    let item = queues::enqueue(&state, (&caller, &guards), &name, placement, &envelope, key.as_ref()).await?;
    let status = if item.is_some() {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let duplicate = item.is_none();
    let stored = Stored {
        queue: name,
        duplicate,
        item,
    };
    Ok(crate::http::idempotency::replayed(
        (status, Json(stored)).into_response(),
        duplicate,
    ))
}
