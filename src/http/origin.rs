//! Browsers on other sites: CORS for the origins allowed (`--cors-origin`), and a refusal of
//! everything else a foreign page could make a browser send.
//!
//! Two checks, for every request that changes something (anything but `GET`/`HEAD`/
//! `OPTIONS`) or opens a socket or an event stream, with auth on or off:
//!
//! - **Host**: it must be a name zkgate is reached by (its listen and advertised addresses,
//!   `localhost`, an IP address, or `--allowed-host`). A page that rebinds its own name's DNS
//!   to zkgate's address (DNS rebinding) makes the browser send `Host: evil.example` and an
//!   `Origin` to match; the Origin check alone cannot tell, the Host check refuses it. An IP
//!   address is always allowed: a page served from that address is zkgate's own origin.
//! - **Origin**: a page on any site can make its visitor's browser send a POST (a "simple"
//!   request, which needs no preflight) or open a WebSocket to zkgate: with auth off on
//!   loopback, that would let any website take and revoke the visitor's local locks. Browsers
//!   always name the page's origin in `Origin` on such requests, so one is refused (403) when
//!   its `Origin` is neither zkgate's own (the `Host` it was reached at) nor allowed. Clients
//!   that are not browsers send no `Origin` and are not affected.

use axum::extract::Request;
use axum::http::{HeaderValue, Method, header};
use tower_http::cors::{AllowOrigin, CorsLayer};

use super::error::{ApiError, Problem};
use crate::AppState;

/// CORS for the allowed origins: the headers the API reads and the ones it answers with.
/// `None` without allowed origins: no CORS headers at all (same origin only), and no layer
/// for every request to pass.
pub fn cors(allowed: &[String]) -> Option<CorsLayer> {
    if allowed.is_empty() {
        return None;
    }
    let origins: Vec<HeaderValue> = allowed.iter().filter_map(|o| HeaderValue::from_str(o).ok()).collect();
    let layer = CorsLayer::new()
        .allow_origin(AllowOrigin::list(origins))
        .allow_methods([Method::GET, Method::HEAD, Method::POST, Method::PUT, Method::DELETE])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::IF_MATCH,
            header::IF_NONE_MATCH,
            header::HeaderName::from_static("idempotency-key"),
            header::HeaderName::from_static(crate::recipes::guards::HEADER),
        ])
        .expose_headers([
            header::ETAG,
            header::LOCATION,
            header::RETRY_AFTER,
            header::HeaderName::from_static(super::kv::keys::LEASE_HEADER),
        ])
        .max_age(std::time::Duration::from_secs(600));
    Some(layer)
}

/// The checks of the module's documentation: `Err` with the refusal (403) of a request a
/// foreign page could have made a browser send.
pub fn check(state: &AppState, request: &Request) -> Result<(), ApiError> {
    let safe = matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    // An event stream is a socket that happens to be a GET: the same checks.
    let upgrade = request.headers().contains_key(header::UPGRADE) || super::routed::is_stream(request.uri().path());
    if safe && !upgrade {
        return Ok(());
    }
    let host = request.headers().get(header::HOST);
    if !host_allowed(state, host) {
        let host = host
            .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
            .unwrap_or_default();
        return Err(ApiError::new(
            Problem::Forbidden,
            format!("zkgate is not reached by the name `{host}` here (see --allowed-host)"),
        ));
    }
    if let Some(origin) = request.headers().get(header::ORIGIN)
        && !allowed(state, origin, host)
    {
        let origin = String::from_utf8_lossy(origin.as_bytes()).into_owned();
        return Err(ApiError::new(
            Problem::Forbidden,
            format!("requests from pages at `{origin}` are not allowed (see --cors-origin)"),
        ));
    }
    Ok(())
}

/// Whether `host` (a `Host` header) names zkgate: an IP address, `localhost`, the listen or
/// advertised address, or `--allowed-host` (with `*`, anything). A request without one (HTTP/1.0,
/// or built in-process) is not a browser's.
fn host_allowed(state: &AppState, host: Option<&HeaderValue>) -> bool {
    let Some(host) = host else { return true };
    let Ok(host) = host.to_str() else { return false };
    let host = host.trim().to_ascii_lowercase();
    let name = name_of(&host);
    if name.parse::<std::net::IpAddr>().is_ok() || name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    let config = &state.config;
    let advertised = config.advertised_url();
    let advertised = advertised
        .split("://")
        .nth(1)
        .unwrap_or_default()
        .split('/')
        .next()
        .unwrap_or_default();
    let ours = [advertised.to_ascii_lowercase()];
    config
        .allowed_host
        .iter()
        .map(|h| h.trim().to_ascii_lowercase())
        .chain(ours)
        .any(|allowed| allowed == "*" || allowed == host || (!allowed.contains(':') && allowed == name))
}

/// The name part of a `Host` value: without the port, and an IPv6 literal without brackets.
fn name_of(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default();
    }
    host.rsplit_once(':').map_or(host, |(name, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            name
        } else {
            host
        }
    })
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

#[cfg(test)]
mod tests {
    use super::name_of;

    #[test]
    fn host_names_without_ports() {
        assert_eq!(name_of("evil.example:7070"), "evil.example");
        assert_eq!(name_of("127.0.0.1:7070"), "127.0.0.1");
        assert_eq!(name_of("[::1]:7070"), "::1");
        assert_eq!(name_of("zkgate"), "zkgate");
    }
}
