//! `/v1/kv`: configuration and names as plain znodes under `<root>/kv/`: get, put, delete and
//! list, raw bytes or JSON as the `Content-Type` says, versions as `ETag`, compare-and-set with
//! `If-Match`, create-only with `If-None-Match: *`, and a blocking read that returns when the
//! value changes.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use axum::routing::get;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::auth::Caller;
use crate::http::Resource;
use crate::http::consistency::Consistency;
use crate::http::error::{ApiError, Place, Problem, Problems, p};
use crate::http::extract::{ApiPath, ApiQuery};
use crate::http::guards::{GuardHeader, Guarded};
use crate::kind::Kind;
use crate::recipes::condition::Condition;
use crate::recipes::kv::{self, etag};
use crate::time::HumanDuration;

/// The kv kind's module (followed as znodes on a socket, not as a topic of its own).
pub const RESOURCE: Resource = Resource {
    kind: Kind::Kv,
    about: Some("Configuration and names: plain znodes, ETag versions, compare-and-set, blocking reads."),
    routes,
    topic: None,
    listed: None,
};

/// Keys contain `/`: axum needs a wildcard route, which the spec writes `{key}` (from
/// [KeyDoc]).
#[derive(OpenApi)]
#[openapi(paths(get_value, put_value, delete_value))]
struct KeyDoc;

fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(KeyDoc::openapi())
        .routes(routes!(list_keys))
        .routes(routes!(super::txn::transaction))
        .route("/v1/kv/{*key}", get(get_value).put(put_value).delete(delete_value))
}

/// Query of a read.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReadQuery {
    /// With `If-None-Match: "<etag>"`: wait up to this long (capped by the server's maximum)
    /// for the value to change, then answer with the new value (or 304 if it did not change).
    #[param(value_type = Option<String>, example = "30s")]
    pub wait: Option<HumanDuration>,
}

/// Query of a write.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WriteQuery {
    /// Bind the key to this lease (yours): it is deleted when the lease ends, by expiry or
    /// `DELETE` (ZooKeeper's ephemeral data, on a lease that outlives any one instance).
    #[param(example = "0a1b2c3d-6f1c2a9e0b7d4e3f8a5b6c7d8e9f0a1b")]
    pub lease: Option<String>,
    /// Allow this write to change the key's binding: a bound key written with no lease (made
    /// plain) or with another lease, a plain key written with a lease. Without it those writes
    /// answer 409 (`key-bound`, `key-not-bound`).
    #[serde(default)]
    pub rebind: bool,
}

/// Query of a listing.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// List the keys under this key (`a/b`); the top level when absent.
    pub prefix: Option<String>,
    /// Most keys in the answer (1 to 10000, default 1000). When more follow, the answer's
    /// `Link` header (`rel="next"`) is the URL of the next page.
    #[param(minimum = 1, maximum = 10000)]
    #[allow(dead_code)] // read by the `Paging` extractor; here for the spec and the field check
    pub limit: Option<usize>,
    /// Where the page starts: the `cursor` of the previous page's `Link` (opaque).
    #[param(max_length = 4096, pattern = "^([0-9a-f]{2})*$")]
    #[allow(dead_code)] // as `limit`
    pub cursor: Option<String>,
}

/// The keys directly under a prefix.
#[derive(Serialize, utoipa::ToSchema)]
pub struct KeyList {
    pub prefix: String,
    #[schema(example = json!(["feature-flags", "services"]))]
    pub keys: Vec<String>,
}

/// Answer of a write.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Written {
    #[schema(example = "services/billing")]
    pub key: String,
    /// The new version, as in the `ETag` header.
    #[schema(example = "\"4294967311\"")]
    pub etag: String,
    /// Whether the key was created by this write.
    pub created: bool,
    /// The lease the key is bound to (it ends with it); `null` for a plain key.
    pub lease: Option<String>,
}

/// The header that names the lease a key is bound to.
pub const LEASE_HEADER: &str = "zkgate-lease";

/// The version named by an `If-Match` / `If-None-Match` header: `*`, or an ETag we issued.
pub(in crate::http) enum Tag {
    Any,
    Version(i64),
}

pub(in crate::http) fn parse_tag(headers: &HeaderMap, name: header::HeaderName) -> Result<Option<Tag>, ApiError> {
    let Some(value) = headers.get(&name) else {
        return Ok(None);
    };
    let field = name.as_str().to_string();
    let text = value
        .to_str()
        .map_err(|_| ApiError::invalid(Place::Header, &field, "must be ASCII"))?
        .trim();
    if text == "*" {
        return Ok(Some(Tag::Any));
    }
    let bare = text.strip_prefix("W/").unwrap_or(text).trim_matches('"');
    bare.parse::<i64>().map(|v| Some(Tag::Version(v))).map_err(|_| {
        ApiError::invalid(
            Place::Header,
            &field,
            format!("`{text}` is not an ETag issued by zkgate (like `\"4294967311\"`) or `*`"),
        )
    })
}

/// Reads a key. A value that parses as JSON comes back as `application/json`, other UTF-8
/// text as `text/plain`, anything else as `application/octet-stream`; the `ETag` is the
/// version for `If-Match`. With
/// `If-None-Match` and `wait`, blocks until the value differs from that version.
#[utoipa::path(get, path = "/v1/kv/{key}", tag = "kv",
    params(("key" = String, Path, description = "Key: segments separated by `/`, each 1 to 128 bytes, no control characters, not `.` or `..`"),
        ReadQuery,
        ("If-None-Match" = Option<String>, Header, description = "An ETag: 304 if the value still has it (after waiting, with `wait`)")),
    responses(
        (status = 200, description = "The value, with its `ETag`, in the `Content-Type` it was written with (a value written by another client comes as bytes)",
            headers(("ETag" = String, description = "The value's version, for `If-Match` and `If-None-Match` (like `\"4294967311\"`)"),
                ("ZKGATE-Lease" = String, description = "The lease the key is bound to, if it is (it ends with it)")),
            content((serde_json::Value = "application/json", example = json!({"dark_mode": true, "max_items": 50})),
                (String = "text/plain", example = json!("maintenance at 22:00")),
                (String = "application/octet-stream"))),
        (status = 304, description = "Not modified (within the wait)", headers(("ETag" = String, description = "The value's version, for `If-Match` and `If-None-Match` (like `\"4294967311\"`)"))),
        Problems<(p::InvalidField, p::NotFound, p::ZookeeperUnavailable)>,
    ))]
pub async fn get_value(
    State(state): State<AppState>,
    ApiPath(key): ApiPath<String>,
    ApiQuery(query): ApiQuery<ReadQuery>,
    consistency: Consistency,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    crate::recipes::kv::check_key(&key)?;
    let known = match parse_tag(&headers, header::IF_NONE_MATCH)? {
        Some(Tag::Version(v)) => Some(v),
        Some(Tag::Any) => {
            let detail = "`*` only applies to writes";
            return Err(ApiError::invalid(Place::Header, "if-none-match", detail));
        }
        None => None,
    };
    let Some(entry) = kv::get(&state, &key, known.zip(query.wait.map(|w| w.0)), consistency).await? else {
        return Err(ApiError::not_found("key", format!("no key `{key}`")));
    };
    let tag =
        HeaderValue::from_str(&etag(entry.stat.mzxid)).map_err(|e| ApiError::new(Problem::Internal, e.to_string()))?;
    if known == Some(entry.stat.mzxid) {
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, tag)]).into_response());
    }
    let content_type = if serde_json::from_slice::<serde::de::IgnoredAny>(&entry.data).is_ok() {
        "application/json"
    } else if std::str::from_utf8(&entry.data).is_ok() {
        "text/plain; charset=utf-8"
    } else {
        "application/octet-stream"
    };
    let mut response = (
        StatusCode::OK,
        [
            (header::ETAG, tag),
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        ],
        entry.data,
    )
        .into_response();
    if let Some(lease) = entry.lease.and_then(|lease| HeaderValue::from_str(&lease).ok()) {
        response.headers_mut().insert(LEASE_HEADER, lease);
    }
    Ok(response)
}

/// Writes a key (creating it and its parents). A JSON `Content-Type` must carry valid JSON;
/// anything else is stored as bytes. `If-Match: "<etag>"` writes only over that version
/// (compare-and-set; `*`: only if it exists), `If-None-Match: *` only if the key is new; a
/// failed condition answers 412 with the current ETag.
///
/// With `lease`, the key is bound to that lease and deleted when it ends. A key bound to a
/// lease is only rewritten with the same lease: a write with no lease or another one answers
/// 409 `key-bound`, and a write with a lease over a plain key 409 `key-not-bound`, unless it
/// says `rebind=true` (then the key is made plain, or bound to the new lease). Other ZooKeeper
/// clients see a plain znode with the value.
#[utoipa::path(put, path = "/v1/kv/{key}", tag = "kv",
    params(("key" = String, Path, description = "Key: segments separated by `/`"),
        WriteQuery, GuardHeader,
        ("If-Match" = Option<String>, Header, description = "Write only over this ETag (`*`: only if it exists)"),
        ("If-None-Match" = Option<String>, Header, description = "`*`: create only")),
    request_body(description = "The value: any JSON value. Text (`text/plain`) and bytes (any other `Content-Type`) are taken too, kept with their `Content-Type`; the spec lists JSON alone, so that a generated client sends it with its media type.",
        content((crate::spec::formats::JsonValue = "application/json", example = json!({"dark_mode": true, "max_items": 50})))),
    responses(
        (status = 201, description = "Created", body = Written, headers(("ETag" = String, description = "The value's version, for `If-Match` and `If-None-Match` (like `\"4294967311\"`)"))),
        (status = 200, description = "Replaced", body = Written, headers(("ETag" = String, description = "The value's version, for `If-Match` and `If-None-Match` (like `\"4294967311\"`)"))),
        Problems<(p::InvalidField, p::MalformedBody, p::Forbidden, p::NotFound, p::KeyBound, p::KeyNotBound, p::LeaseEnded, p::PreconditionFailed, p::BodyTooLarge, p::ValueTooLarge, p::QuotaExceeded, p::OutcomeUnknown, p::InstanceUnavailable, p::ZookeeperUnavailable)>,
    ))]
pub async fn put_value(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(key): ApiPath<String>,
    ApiQuery(query): ApiQuery<WriteQuery>,
    Guarded(guards): Guarded,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    crate::recipes::kv::check_key(&key)?;
    let body = body.map_err(crate::http::extract::body_rejection)?;
    let condition = write_condition(&headers)?;
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/json") || t.contains("+json"));
    if is_json && let Err(err) = serde_json::from_slice::<serde::de::IgnoredAny>(&body) {
        return Err(ApiError::malformed_body(format!("the body is not valid JSON: {err}")));
    }
    state.check_stored_size("value", body.len())?;
    let lease = query.lease.as_deref();
    let (mzxid, created, lease) = kv::put(
        &state,
        (&caller, &guards),
        &key,
        &body,
        condition,
        (lease, query.rebind),
    )
    .await?;
    let tag = etag(mzxid);
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    let header_tag = HeaderValue::from_str(&tag).map_err(|e| ApiError::new(Problem::Internal, e.to_string()))?;
    Ok((
        status,
        [(header::ETAG, header_tag)],
        crate::http::json::Json(Written {
            key,
            etag: tag,
            created,
            lease: lease.map(|lease| lease.id.clone()),
        }),
    )
        .into_response())
}

/// What a write's `If-Match` (an ETag: that version; `*`: it exists) and `If-None-Match`
/// (`*`: it does not) require; a kv value's and a counter's alike.
pub(in crate::http) fn write_condition(headers: &HeaderMap) -> Result<Condition, ApiError> {
    Ok(
        match (
            parse_tag(headers, header::IF_MATCH)?,
            parse_tag(headers, header::IF_NONE_MATCH)?,
        ) {
            (Some(_), Some(_)) => {
                let detail = "cannot be combined with `If-None-Match`";
                return Err(ApiError::invalid(Place::Header, "if-match", detail));
            }
            (Some(Tag::Version(v)), None) => Condition::Version(v),
            (Some(Tag::Any), None) => Condition::Exists,
            (None, Some(Tag::Any)) => Condition::Absent,
            (None, Some(Tag::Version(_))) => {
                let detail = "only `*` applies to writes";
                return Err(ApiError::invalid(Place::Header, "if-none-match", detail));
            }
            (None, None) => Condition::Any,
        },
    )
}

/// Deletes a key (which must have no keys below it); `If-Match` makes it conditional. A key
/// bound to a lease is deleted too, and leaves the lease's holdings: only by the lease's
/// principal (or an admin; 403 otherwise).
#[utoipa::path(delete, path = "/v1/kv/{key}", tag = "kv",
    params(("key" = String, Path, description = "Key"), GuardHeader,
        ("If-Match" = Option<String>, Header, description = "Delete only this ETag")),
    responses(
        (status = 204, description = "Deleted"),
        Problems<(p::InvalidField, p::Forbidden, p::NotFound, p::KeyNotEmpty, p::PreconditionFailed, p::OutcomeUnknown, p::ZookeeperUnavailable)>,
    ))]
pub async fn delete_value(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(key): ApiPath<String>,
    Guarded(guards): Guarded,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    crate::recipes::kv::check_key(&key)?;
    let condition = match parse_tag(&headers, header::IF_MATCH)? {
        Some(Tag::Version(v)) => Condition::Version(v),
        Some(Tag::Any) | None => Condition::Any,
    };
    kv::remove(&state, (&caller, &guards), &key, condition).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Lists the keys directly under `prefix` (the top level without it).
#[utoipa::path(get, path = "/v1/kv", tag = "kv", params(ListQuery),
    responses(
        (status = 200, description = "A page of the keys under the path, in order", body = KeyList, headers(("Link" = String, description = "While more entries follow: the next page, `<url>; rel=\"next\"`"))),
        Problems<(p::InvalidField, p::NotFound, p::ZookeeperUnavailable)>,
    ))]
pub async fn list_keys(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<ListQuery>,
    consistency: Consistency,
    paging: crate::http::paging::Paging,
) -> Result<axum::response::Response, ApiError> {
    let prefix = query.prefix.unwrap_or_default();
    let path = if prefix.is_empty() {
        Kind::Kv.base(&state.config.root)
    } else {
        crate::recipes::kv::check_key(&prefix)
            .map_err(|_| ApiError::invalid(Place::Query, "prefix", "must be a valid key (`a/b`)"))?;
        Kind::Kv.path(&state.config.root, &prefix)
    };
    let Some(keys) = kv::list(&state, &caller, (&prefix, &path), consistency).await? else {
        return Err(ApiError::not_found("key", format!("no key `{prefix}`")));
    };
    let page = paging.page(keys, String::clone);
    Ok(crate::http::paging::with_link(
        page.next,
        crate::http::json::Json(KeyList {
            prefix,
            keys: page.entries,
        }),
    ))
}
