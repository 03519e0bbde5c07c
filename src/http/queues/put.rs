//! A put: the item's body as sent, its delay or due time, an idempotency key, the queue's bounds.

use super::*;
use crate::http::guards::{GuardHeader, Guarded};

/// Puts an item: JSON (`Content-Type: application/json`), text, or any bytes (returned
/// base64-encoded). With an `Idempotency-Key`, a retried put is stored once (answered `200`,
/// `duplicate: true`). A full queue answers 429 (with `Retry-After`).
#[utoipa::path(post, path = "/v1/queues/{name}/items", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), PutQuery, GuardHeader,
        ("Idempotency-Key" = Option<String>, Header, description = crate::http::idempotency::ABOUT)),
    request_body(description = "The item: any JSON value. Text (`text/plain`) and bytes (any other `Content-Type`, read back base64-encoded) are taken too, kept with their `Content-Type`; the spec lists JSON alone, so that a generated client sends it with its media type.",
        content((crate::spec::formats::JsonValue = "application/json", example = json!({"to": "ada@example.com", "template": "welcome"})))),
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
    let bytes = body.map_err(crate::http::extract::body_rejection)?;
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let stored = queues::enqueue(
        &state,
        (&caller, &guards),
        &name,
        query,
        (content_type, &bytes),
        key.as_ref(),
    )
    .await?;
    let status = match stored.duplicate {
        true => StatusCode::OK,
        false => StatusCode::CREATED,
    };
    let duplicate = stored.duplicate;
    Ok(crate::http::idempotency::replayed(
        (status, Json(stored)).into_response(),
        duplicate,
    ))
}
