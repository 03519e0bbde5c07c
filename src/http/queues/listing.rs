//! Reading a queue's items and dead letters (paged), and replaying a dead letter.

use super::*;
use crate::http::guards::{GuardHeader, Guarded};

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
    let listed = queues::listed(state, name, dead, one_page, consistency).await?;
    let items: Vec<Waiting> = listed.into_iter().map(Waiting::of).collect();
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
