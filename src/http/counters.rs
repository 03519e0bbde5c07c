//! `/v1/counters`: 64-bit counters shared with Curator's `DistributedAtomicLong`: read, add a
//! delta atomically (optionally within bounds), set (compare-and-set with `If-Match`), delete,
//! and follow.

use crate::http::json::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::consistency::Consistency;
use super::error::{ApiError, Problem, Problems, p};
use super::extract::{ApiJson, ApiPath};
use super::guards::{GuardHeader, Guarded};
use super::idempotency::Idempotent;
use super::kv::keys::{Tag, parse_tag, write_condition};
use super::{Followed, Resource, check_name};
use crate::AppState;
use crate::auth::Caller;
use crate::kind::Kind;
use crate::recipes::condition::Condition;
use crate::recipes::counters::{self, AddBody, AddResult, CounterState, SetBody};

/// The counter kind's module.
pub const RESOURCE: Resource = Resource {
    kind: Kind::Counter,
    about: Some(
        "Counters: 64-bit integers added to atomically (within bounds if asked), set with compare-and-set, \
         followed live; stored as Curator's `DistributedAtomicLong` stores them.",
    ),
    routes,
    topic: Some(Followed {
        summary: "Follows a counter: each change of its value, as Server-Sent Events.",
        param: "name",
    }),
    listed: Some("Lists the counters that exist."),
};

fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(counter_state, set, delete))
        .routes(routes!(add))
}

fn etag_header(etag: &str) -> Result<HeaderValue, ApiError> {
    HeaderValue::from_str(etag).map_err(|e| ApiError::new(Problem::Internal, e.to_string()))
}

/// Reads a counter: its value (0 if it does not exist, as Curator reads it) and its version
/// (`ETag`, for `If-Match` on a set or delete).
#[utoipa::path(get, path = "/v1/counters/{name}", tag = "counters",
    params(("name" = String, Path, description = "Counter name")),
    responses(
        (status = 200, body = CounterState, description = "The counter, with its `ETag` if it exists", headers(("ETag" = String, description = "The counter's version, for `If-Match` (like `\"4294967311\"`)"))),
        Problems<(p::InvalidField, p::ZookeeperUnavailable)>,
    ))]
pub async fn counter_state(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    consistency: Consistency,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    let Json(read) = super::read(&state, state.counter_topic(&name), consistency).await?;
    Ok(match &read.etag {
        Some(etag) => ([(header::ETAG, etag_header(etag)?)], Json(read)).into_response(),
        None => Json(read).into_response(),
    })
}

/// Adds `delta` (1 without a body) to a counter atomically, creating it at 0 first if it does
/// not exist: concurrent adds on every instance, and Curator's, each land exactly once. With
/// `min` or `max` the add happens only if the result stays within them (409 `out-of-bounds`
/// otherwise, and the counter does not change): a bounded counter of tickets, say. With an
/// `Idempotency-Key` the add is safe to retry: it lands once for the key, and a retry is
/// answered as the add was (`repeated: true`); without one, a write whose reply ZooKeeper lost
/// is answered 503 `outcome-unknown`.
#[utoipa::path(operation_id = "add_to_counter", post, path = "/v1/counters/{name}/add", tag = "counters",
    params(("name" = String, Path, description = "Counter name"), GuardHeader,
        ("Idempotency-Key" = Option<String>, Header, description = super::idempotency::ABOUT)),
    request_body(content = Option<AddBody>, description = "Optional: `+1` without it.", example = json!({"delta": 5, "max": 100})),
    responses(
        (status = 200, description = "Added (or, for a repeated `Idempotency-Key`, added before)", body = AddResult, headers(("ETag" = String, description = "The counter's version, for `If-Match` (like `\"4294967311\"`)"))),
        Problems<(p::InvalidField, p::MalformedBody, p::OutOfBounds, p::NotACounter, p::QuotaExceeded, p::OutcomeUnknown, p::ZookeeperUnavailable)>,
    ))]
pub async fn add(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    Guarded(guards): Guarded,
    Idempotent {
        key,
        inner: ApiJson(body),
    }: Idempotent<ApiJson<Option<AddBody>>>,
) -> Result<Response, ApiError> {
    let added = counters::add_to(
        &state,
        (&caller, &guards),
        &name,
        body.unwrap_or_default(),
        key.as_ref(),
    )
    .await?;
    let answer = ([(header::ETAG, etag_header(&added.etag)?)], Json(added));
    let repeated = answer.1.repeated;
    Ok(super::idempotency::replayed(answer.into_response(), repeated))
}

/// Sets a counter to a value, creating it if needed. `If-Match: "<etag>"` sets it only over
/// that version (compare-and-set: 412 with the current ETag otherwise; `*`: only if it
/// exists), `If-None-Match: *` only if it does not exist.
#[utoipa::path(put, path = "/v1/counters/{name}", tag = "counters",
    params(("name" = String, Path, description = "Counter name"), GuardHeader,
        ("If-Match" = Option<String>, Header, description = "Set only over this ETag (`*`: only if it exists)"),
        ("If-None-Match" = Option<String>, Header, description = "`*`: create only")),
    request_body(content = SetBody, example = json!({"value": 0})),
    responses(
        (status = 201, description = "Created", body = CounterState, headers(("ETag" = String, description = "The counter's version, for `If-Match` (like `\"4294967311\"`)"))),
        (status = 200, description = "Set", body = CounterState, headers(("ETag" = String, description = "The counter's version, for `If-Match` (like `\"4294967311\"`)"))),
        Problems<(p::InvalidField, p::MalformedBody, p::PreconditionFailed, p::OutcomeUnknown, p::ZookeeperUnavailable)>,
    ))]
pub async fn set(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    Guarded(guards): Guarded,
    headers: HeaderMap,
    ApiJson(body): ApiJson<SetBody>,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    let condition = write_condition(&headers)?;
    let (stat, created) = counters::set_to(&state, (&caller, &guards), &name, (body.value, condition)).await?;
    let written = CounterState::of(&name, Some(body.value), Some(&stat));
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    let etag = etag_header(&counters::etag(stat.mzxid))?;
    Ok((status, [(header::ETAG, etag)], Json(written)).into_response())
}

/// Deletes a counter (it reads as 0 afterwards); `If-Match` makes it conditional.
#[utoipa::path(delete, path = "/v1/counters/{name}", tag = "counters",
    params(("name" = String, Path, description = "Counter name"), GuardHeader,
        ("If-Match" = Option<String>, Header, description = "Delete only this ETag")),
    responses(
        (status = 204, description = "Deleted"),
        Problems<(p::InvalidField, p::NotFound, p::PreconditionFailed, p::ZookeeperUnavailable)>,
    ))]
pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    Guarded(guards): Guarded,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    check_name(&name)?;
    let condition = match parse_tag(&headers, header::IF_MATCH)? {
        Some(Tag::Version(v)) => Condition::Version(v),
        Some(Tag::Any) | None => Condition::Any,
    };
    counters::remove(&state, (&caller, &guards), &name, condition).await?;
    Ok(StatusCode::NO_CONTENT)
}
