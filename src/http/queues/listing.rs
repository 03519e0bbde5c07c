//! Reading a queue's items and dead letters (paged), and replaying a dead letter.

use super::*;
use crate::http::guards::{GuardHeader, Guarded};

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
pub(super) const MAX_LISTED: usize = 1000;

/// An item's body as the views show it: `(body, text, body_base64)`, one of them set.
pub(super) fn shown(envelope: &Envelope) -> (Option<serde_json::Value>, Option<String>, Option<String>) {
    match envelope.shown() {
        Shown::Json(value) => (Some(value), None, None),
        Shown::Text(text) => (None, Some(text), None),
        Shown::Base64(encoded) => (None, None, Some(encoded)),
    }
}

/// The items waiting (and claimed) in a queue, first to take first, with their bodies.
#[utoipa::path(get, path = "/v1/queues/{name}/items", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), ItemsQuery),
    responses(
        (status = 200, description = "A page of the items, in queue order (`Link` gives the next page while more follow)", body = Vec<Waiting>, headers(("Link" = String, description = "While more entries follow: the next page, `<url>; rel=\"next\"`"))),
        Problems<(p::InvalidField, p::ZookeeperUnavailable)>,
    ))]
pub async fn items(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(_query): ApiQuery<ItemsQuery>,
    consistency: Consistency,
    uri: axum::http::Uri,
) -> Result<Response, ApiError> {
    listed(&state, &name, &uri, consistency, false).await
}

/// One page of queue `name`'s items (or, `dead`, its dead letters), in queue order, with their
/// bodies.
async fn listed(
    state: &AppState,
    name: &str,
    uri: &axum::http::Uri,
    consistency: Consistency,
    dead: bool,
) -> Result<Response, ApiError> {
    check_name(name)?;
    let paging = Paging::parse(uri.path(), uri.query().unwrap_or_default(), 100, MAX_LISTED)?;
    let mut next = None;
    let one_page = |all| {
        let page = paging.page(all, |(place, _): &(String, String)| place.clone());
        next = page.next;
        page.entries.into_iter().map(|(_, name)| name).collect()
    };
    let mut items: Vec<Waiting> = Vec::new();
    for (item, envelope, stat) in queues::listed(state, name, dead, one_page, consistency).await? {
        let (body, text, body_base64) = shown(&envelope);
        items.push(Waiting {
            priority: queues::order_of(&item).map(|o| o.0).unwrap_or(queues::DEFAULT_PRIORITY),
            not_before: queues::topic::not_before(&item),
            item,
            deliveries: envelope.deliveries,
            age_ms: millis_since(from_millis(stat.ctime)),
            content_type: envelope.content_type,
            body,
            text,
            body_base64,
        });
    }
    Ok(with_link(next, Json(items)))
}

/// The dead letters: items delivered too many times, oldest first (in pages, as `items`).
#[utoipa::path(get, path = "/v1/queues/{name}/dead-letters", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), ItemsQuery),
    responses(
        (status = 200, description = "A page of the items, in queue order (`Link` gives the next page while more follow)", body = Vec<Waiting>, headers(("Link" = String, description = "While more entries follow: the next page, `<url>; rel=\"next\"`"))),
        Problems<(p::InvalidField, p::ZookeeperUnavailable)>,
    ))]
pub async fn dead_letters(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(_query): ApiQuery<ItemsQuery>,
    consistency: Consistency,
    uri: axum::http::Uri,
) -> Result<Response, ApiError> {
    listed(&state, &name, &uri, consistency, true).await
}

/// Puts a dead item back into the queue, in its old place, its delivery count reset.
#[utoipa::path(post, path = "/v1/queues/{name}/dead-letters/{item}/replay", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), ("item" = String, Path, description = "Dead item"), GuardHeader),
    responses(
        (status = 204, description = "Back in the queue"),
        Problems<(p::InvalidField, p::NotFound, p::ZookeeperUnavailable)>,
    ))]
pub async fn replay(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, item)): ApiPath<(String, String)>,
    Guarded(guards): Guarded,
) -> Result<StatusCode, ApiError> {
    check_name(&name)?;
    validate_name(&item).map_err(|e| ApiError::invalid(Place::Path, "item", e))?;
    queues::replay_dead(&state, (&caller, &guards), &name, &item).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The dead letters under their old path: use `GET /v1/queues/{name}/dead-letters`, the name
/// the queue's state, its topic and the metrics use.
#[utoipa::path(get, path = "/v1/queues/{name}/dead", tag = "queues", operation_id = "dead_letters_old_path",
    params(("name" = String, Path, description = "Queue name"), ItemsQuery),
    responses(
        (status = 200, description = "A page of the items, in queue order (`Link` gives the next page while more follow)", body = Vec<Waiting>, headers(("Link" = String, description = "`<the path to use instead>; rel=\"successor-version\"` (and the next page, `<url>; rel=\"next\"`, while more entries follow)"), ("Deprecation" = String, description = "When this path was deprecated (RFC 9745): `@1795392000`"))),
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
    let successor = format!("/v1/queues/{}/dead-letters", name.0);
    let answer = dead_letters(state, name, query, consistency, uri).await;
    Ok(deprecated(answer.into_response(), &successor))
}

/// A replay under its old path: use `POST /v1/queues/{name}/dead-letters/{item}/replay`.
#[utoipa::path(post, path = "/v1/queues/{name}/dead/{item}/replay", tag = "queues", operation_id = "replay_old_path",
    params(("name" = String, Path, description = "Queue name"), ("item" = String, Path, description = "Dead item"), GuardHeader),
    responses(
        (status = 204, description = "Back in the queue", headers(("Link" = String, description = "`<the path to use instead>; rel=\"successor-version\"`"), ("Deprecation" = String, description = "When this path was deprecated (RFC 9745): `@1795392000`"))),
        Problems<(p::InvalidField, p::NotFound, p::ZookeeperUnavailable)>,
    ))]
#[deprecated = "the path is /v1/queues/{name}/dead-letters/{item}/replay"]
pub async fn replay_old_path(
    state: State<AppState>,
    caller: Caller,
    path: ApiPath<(String, String)>,
    guards: Guarded,
) -> Response {
    let successor = format!("/v1/queues/{}/dead-letters/{}/replay", path.0.0, path.0.1);
    deprecated(replay(state, caller, path, guards).await.into_response(), &successor)
}

/// When the `/dead` paths were deprecated (2026-11-23), as RFC 9745's `Deprecation` says it.
const DEAD_PATHS_DEPRECATED: &str = "@1795392000";

/// `response` from a deprecated path, saying so (RFC 9745): `Deprecation` with the date it was
/// deprecated, and a `Link` to the path to use instead.
fn deprecated(mut response: Response, successor: &str) -> Response {
    use axum::http::HeaderValue;
    let headers = response.headers_mut();
    headers.insert("deprecation", HeaderValue::from_static(DEAD_PATHS_DEPRECATED));
    if let Ok(link) = HeaderValue::from_str(&format!("<{successor}>; rel=\"successor-version\"")) {
        headers.append(axum::http::header::LINK, link);
    }
    response
}
