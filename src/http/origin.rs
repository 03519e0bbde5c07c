//! Browsers on other sites: CORS for the origins allowed (`--cors-origin`), and a refusal of
//! everything else a foreign page could make a browser send.
//!
//! A page on any site can make its visitor's browser send a POST (a "simple" request, which
//! needs no preflight) or open a WebSocket to zkgate: with auth off on loopback, that would let
//! any website take and revoke the visitor's local locks. Browsers always name the page's
//! origin in `Origin` on such requests, so a request that changes something (anything but
//! `GET`/`HEAD`/`OPTIONS`) or opens a socket is refused (403) when its `Origin` is neither
//! zkgate's own (the `Host` it was reached at) nor allowed. Clients that are not browsers send
//! no `Origin` and are not affected.

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowOrigin, CorsLayer};

use super::error::{ApiError, Problem};
use crate::AppState;

/// CORS for the allowed origins: the headers the API reads and the ones it answers with.
/// Without allowed origins, no CORS headers at all (same origin only).
pub fn cors(allowed: &[String]) -> CorsLayer {
    let origins: Vec<HeaderValue> = allowed.iter().filter_map(|o| HeaderValue::from_str(o).ok()).collect();
    CorsLayer::new()
        .allow_origin(AllowOrigin::list(origins))
        .allow_methods([Method::GET, Method::HEAD, Method::POST, Method::PUT, Method::DELETE])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::IF_MATCH,
            header::IF_NONE_MATCH,
            header::HeaderName::from_static("idempotency-key"),
        ])
        .expose_headers([header::ETAG, header::LOCATION, header::RETRY_AFTER])
        .max_age(std::time::Duration::from_secs(600))
}

/// The layer: see the module's documentation.
pub async fn check_origin(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let safe = matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    let upgrade = request.headers().contains_key(header::UPGRADE);
    if (!safe || upgrade)
        && let Some(origin) = request.headers().get(header::ORIGIN)
        && !allowed(&state, origin, request.headers().get(header::HOST))
    {
        let origin = String::from_utf8_lossy(origin.as_bytes()).into_owned();
        return ApiError::new(
            Problem::Forbidden,
            format!("requests from pages at `{origin}` are not allowed (see --cors-origin)"),
        )
        .into_response();
    }
    next.run(request).await
}

/// Same origin (its host and port are the `Host` zkgate was reached at) or in the allow-list.
fn allowed(state: &AppState, origin: &HeaderValue, host: Option<&HeaderValue>) -> bool {
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    if state.config.cors_origin.iter().any(|o| o == origin) {
        return true;
    }
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    matches!((authority, host.and_then(|h| h.to_str().ok())), (Some(a), Some(h)) if a.eq_ignore_ascii_case(h))
}
