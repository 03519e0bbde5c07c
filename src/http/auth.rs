//! The HTTP side of [crate::auth]: the layers that find the caller of a request (401 without a
//! valid token) and refuse what its grants do not allow (403), and the [Caller] extractor with
//! which handlers receive it.

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use crate::AppState;
use crate::auth::{Access, Caller};
use crate::kind::Kind;

/// The WebSocket subprotocol a client offers (besides [SUBPROTOCOL]) to carry its token:
/// `zkgate.bearer.<token in base64url, no padding>`. Browsers cannot set an `Authorization`
/// header on a WebSocket; this keeps the token out of the URL (and so out of access logs).
pub const BEARER_SUBPROTOCOL: &str = "zkgate.bearer.";

/// The subprotocol zkgate answers with when the client offered it.
pub const SUBPROTOCOL: &str = "zkgate";

/// The caller of a request, as [authenticate] found it (a WebSocket call carries its socket's).
/// A request that reached a handler without one was not authenticated: refused, never served
/// as anyone.
impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| ApiError::unauthorized("the request was not authenticated"))
    }
}

/// The bearer token of a request: the `Authorization` header, or on a WebSocket handshake the
/// `zkgate.bearer.<base64url>` subprotocol.
fn token_of(headers: &HeaderMap) -> Result<Option<String>, &'static str> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let value = value.to_str().map_err(|_| "the Authorization header is not ASCII")?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or("the Authorization header must be `Bearer <token>`")?;
        return Ok(Some(token.trim().to_string()));
    }
    for value in headers.get_all(header::SEC_WEBSOCKET_PROTOCOL) {
        let Ok(value) = value.to_str() else { continue };
        for protocol in value.split(',').map(str::trim) {
            if let Some(encoded) = protocol.strip_prefix(BEARER_SUBPROTOCOL) {
                use base64::Engine;
                let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(encoded)
                    .map_err(|_| "the zkgate.bearer subprotocol must carry the token in base64url")?;
                return String::from_utf8(bytes).map(Some).map_err(|_| "the token is not UTF-8");
            }
        }
    }
    Ok(None)
}

/// Paths anyone may read: probes, the API description and the dashboard's page (which holds
/// no data; it asks for a token when its socket needs one).
fn is_public(path: &str) -> bool {
    matches!(path, "/" | "/healthz" | "/readyz" | "/openapi.json") || path == "/docs" || path.starts_with("/docs/")
}

/// The outermost layer: finds the caller from the token (401 without a valid one) and serves
/// the request as that caller.
pub async fn authenticate(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let caller = match &state.authority {
        None => Caller::Anyone,
        Some(_) if is_public(request.uri().path()) => Caller::Anyone,
        Some(authority) => match token_of(request.headers()) {
            Err(detail) => return ApiError::unauthorized(detail).into_response(),
            Ok(None) => {
                return ApiError::unauthorized(
                    "send `Authorization: Bearer <token>` (on a WebSocket, the `zkgate.bearer.<base64url token>` subprotocol)",
                )
                .into_response();
            }
            Ok(Some(token)) => match authority.principal(&token) {
                Some(principal) => Caller::Principal(principal),
                None => return ApiError::unauthorized("the token is not valid").into_response(),
            },
        },
    };
    request.extensions_mut().insert(caller);
    let address = request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|info| crate::limits::ClientAddr(info.0.ip()));
    if let Some(address) = address {
        request.extensions_mut().insert(address);
    }
    next.run(request).await
}

/// The layer on the API routes: checks the kind and name in the path against the caller's
/// grants (403). It reads the caller from the
/// request's extensions, where [authenticate] or a WebSocket call put it.
pub async fn authorize(request: Request, next: Next) -> Response {
    let caller = request.extensions().get::<Caller>().cloned().unwrap_or(Caller::Anyone);
    if let Err(err) = check_path(&caller, request.method(), request.uri().path()) {
        return err.into_response();
    }
    next.run(request).await
}

/// What a request touches, read from its path: `/v1/<kind>[/<name>[/...]]`.
fn check_path(caller: &Caller, method: &Method, path: &str) -> Result<(), ApiError> {
    let access = if method == Method::GET || method == Method::HEAD {
        Access::Read
    } else {
        Access::Write
    };
    let mut segments = path.trim_start_matches('/').splitn(3, '/');
    let first = segments.next().unwrap_or_default();
    if first == crate::auth::METRICS {
        return Ok(caller.require(crate::auth::METRICS, "", Access::Read)?);
    }
    if first != "v1" {
        return Ok(());
    }
    let kind = segments.next().unwrap_or_default();
    let rest = segments.next();
    match kind {
        // Leases and sockets: any principal; ownership is checked where a lease is used, and
        // each subscription where it is made. The audit log is filtered by name.
        "leases" | "ws" | "revocations" => Ok(()),
        kind if Kind::from_segment(kind).is_some() => match rest.filter(|r| !r.is_empty()) {
            // A listing (or `POST /v1/txns`): some access to the kind; the handler filters
            // (or checks the name in the body).
            None => Ok(caller.require_some(kind, access)?),
            Some(rest) => {
                // The same decoding as the handlers' path extractors; the handlers refuse what
                // is not a valid name (`..`, `/` in a name) after this.
                let name = if kind == "kv" {
                    percent_decode(rest)
                } else {
                    percent_decode(rest.split('/').next().unwrap_or_default())
                };
                Ok(caller.require(kind, &name, access)?)
            }
        },
        _ => Ok(()),
    }
}

/// Percent-decoding as in a URL path (`+` stays `+`), as axum's path extractor does.
pub(crate) fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Authority;

    const CONFIG: &str = r#"
        [[principals]]
        name = "billing"
        tokens = ["sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"]
        [[principals.grants]]
        kinds = ["locks", "queues"]
        prefixes = ["billing-"]
        access = "write"
        [[principals.grants]]
        kinds = ["*"]
        prefixes = [""]
        access = "read"
    "#;

    #[test]
    fn paths_map_to_kind_and_decoded_name() {
        let authority = Authority::parse(CONFIG).expect("parse");
        let caller = Caller::Principal(authority.principal("password").expect("principal"));
        assert!(check_path(&caller, &Method::POST, "/v1/locks/billing-a/acquire").is_ok());
        assert!(check_path(&caller, &Method::POST, "/v1/locks/orders/acquire").is_err());
        // An encoded name is decoded before the prefix check.
        assert!(check_path(&caller, &Method::POST, "/v1/locks/%62illing-a/acquire").is_ok());
        assert!(check_path(&caller, &Method::POST, "/v1/kv/billing-a").is_err());
        assert!(check_path(&caller, &Method::GET, "/v1/kv/anything/at/all").is_ok());
        assert!(check_path(&caller, &Method::GET, "/metrics").is_ok());
        assert!(check_path(&caller, &Method::DELETE, "/v1/leases/abc").is_ok());
    }
}
