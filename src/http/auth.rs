//! The HTTP side of [crate::auth]: the layers that find the caller of a request (401 without a
//! valid token) and refuse what its grants do not allow (403), and the [Caller] extractor with
//! which handlers receive it.

use axum::extract::{FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, header};

use super::error::{ApiError, Problem};
use super::handoff::{FORWARDED_AT, FORWARDED_BY, FORWARDED_FOR, SIGNATURE};
use super::routed::Routed;
use crate::AppState;
use crate::auth::{Access, Caller};

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
            .ok_or_else(|| ApiError::new(Problem::Unauthorized, "the request was not authenticated"))
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
    matches!(path, "/" | "/favicon.ico" | "/healthz" | "/readyz" | "/openapi.json")
        || path == "/docs"
        || path.starts_with("/docs/")
}

/// Whether `request` says it was handed over by another instance ([forwarded] believes it or
/// refuses it).
pub fn is_forwarded(request: &Request) -> bool {
    request.headers().contains_key(super::handoff::FORWARDED_BY_NAME)
}

/// A request forwarded by another instance: believed only if its MAC verifies with this
/// deployment's key, it is addressed to this instance and it is fresh; its caller is the
/// principal the forwarding instance asserts (which must be one this instance knows). A client
/// that sends the peer headers itself gets 401, as for a bad token.
pub async fn forwarded(state: &AppState, request: Request) -> Result<Request, ApiError> {
    let refuse = |detail: &str| ApiError::new(Problem::Unauthorized, format!("a forwarded request: {detail}"));
    let key = state
        .instances
        .key()
        .ok_or_else(|| refuse("this instance has no --cluster-secret to verify it with"))?;
    let (mut parts, body) = request.into_parts();
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(from), Some(at), Some(signature)) = (header(FORWARDED_BY), header(FORWARDED_AT), header(SIGNATURE))
    else {
        return Err(refuse("it lacks the peer headers"));
    };
    let body = axum::body::to_bytes(body, crate::listen::BODY_LIMIT_BYTES)
        .await
        .map_err(|_| ApiError::too_large(crate::listen::BODY_LIMIT_BYTES))?;
    let forward = crate::peer::Forward {
        method: parts.method.as_str(),
        path: parts.uri.path_and_query().map_or("/", |p| p.as_str()),
        from,
        to: &state.instance.id,
        principal: header(FORWARDED_FOR),
        at_ms: at.parse().map_err(|_| refuse("its time is not a number"))?,
        body: &body,
    };
    if !key.verify_forward(&forward, signature) {
        return Err(refuse("its signature does not verify"));
    }
    if !forward.is_fresh(u64::try_from(crate::time::now_ms()).unwrap_or_default()) {
        return Err(refuse(
            "it is too old (or the instances' clocks differ by more than 30 s)",
        ));
    }
    let caller = match (&state.authority, forward.principal) {
        (None, _) => Caller::Anyone,
        (Some(authority), Some(name)) => Caller::Principal(
            authority
                .principal_named(name)
                .ok_or_else(|| refuse("it asserts a principal this instance's --auth-config lacks"))?,
        ),
        (Some(_), None) => return Err(refuse("it asserts no principal, and this instance requires one")),
    };
    parts.extensions.insert(caller);
    Ok(Request::from_parts(parts, axum::body::Body::from(body)))
}

/// A client's request: its caller from its bearer token (401 without a valid one where one is
/// needed), put in the request's extensions.
pub fn authenticated(state: &AppState, request: &mut Request) -> Result<(), ApiError> {
    let caller = match &state.authority {
        None => Caller::Anyone,
        // A public path needs no token, but one that comes is honoured (an admin sees more of
        // the probes); without a valid one the caller is nobody.
        Some(authority) if is_public(request.uri().path()) => match token_of(request.headers()) {
            Ok(Some(token)) => authority.principal(&token).map_or(Caller::Nobody, Caller::Principal),
            _ => Caller::Nobody,
        },
        Some(authority) => match token_of(request.headers()) {
            Err(detail) => return Err(ApiError::new(Problem::Unauthorized, detail)),
            Ok(None) => {
                let detail = "send `Authorization: Bearer <token>` (on a WebSocket, the `zkgate.bearer.<base64url token>` subprotocol)";
                return Err(ApiError::new(Problem::Unauthorized, detail));
            }
            Ok(Some(token)) => match authority.principal(&token) {
                Some(principal) => Caller::Principal(principal),
                None => return Err(ApiError::new(Problem::Unauthorized, "the token is not valid")),
            },
        },
    };
    request.extensions_mut().insert(caller);
    Ok(())
}

/// The check on the API routes, after routing: the kind and resource the router matched
/// against the caller's grants (403). Reads on `GET`/`HEAD`, writes otherwise; a kind's listing
/// (or `POST /v1/txns`) needs some access to the kind (the handler filters, or checks the name
/// in the body); `/metrics` needs the `metrics` grant. Leases and sockets need none here:
/// ownership is checked where a lease is used, and each subscription where it is made.
pub fn authorize(routed: &Routed, request: &Request) -> Result<(), ApiError> {
    // A request that was never authenticated may do nothing here.
    let caller = request.extensions().get::<Caller>().unwrap_or(&Caller::Nobody);
    check(caller, request.method(), routed)
}

fn check(caller: &Caller, method: &Method, routed: &Routed) -> Result<(), ApiError> {
    let access = if method == Method::GET || method == Method::HEAD {
        Access::Read
    } else {
        Access::Write
    };
    if routed.route.template == "/metrics" {
        return Ok(caller.require(crate::auth::METRICS, "", Access::Read)?);
    }
    let Some(kind) = routed.route.kind else {
        return Ok(());
    };
    match routed.resource() {
        Some(name) => Ok(caller.require(kind.auth(), name, access)?),
        None => Ok(caller.require_some(kind.auth(), access)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Authority;

    const CONFIG: &str = crate::auth::EXAMPLE_CONFIG;

    fn routed(template: &str, method: &Method, params: &[(&str, &str)]) -> Routed {
        Routed::new(template, method, params)
    }

    #[test]
    fn routes_map_to_kind_and_resource() {
        let authority = Authority::parse(CONFIG).expect("parse");
        let caller = Caller::Principal(authority.principal("password").expect("principal"));
        let acquire = "/v1/locks/{name}/acquire";
        assert!(
            check(
                &caller,
                &Method::POST,
                &routed(acquire, &Method::POST, &[("name", "billing-a")])
            )
            .is_ok()
        );
        assert!(
            check(
                &caller,
                &Method::POST,
                &routed(acquire, &Method::POST, &[("name", "orders")])
            )
            .is_err()
        );
        assert!(
            check(
                &caller,
                &Method::PUT,
                &routed("/v1/kv/{*key}", &Method::PUT, &[("key", "billing-a")])
            )
            .is_err()
        );
        assert!(
            check(
                &caller,
                &Method::GET,
                &routed("/v1/kv/{*key}", &Method::GET, &[("key", "any/thing")])
            )
            .is_ok()
        );
        assert!(check(&caller, &Method::GET, &routed("/metrics", &Method::GET, &[])).is_ok());
        assert!(
            check(
                &caller,
                &Method::DELETE,
                &routed("/v1/leases/{id}", &Method::DELETE, &[("id", "abc")])
            )
            .is_ok()
        );
        assert!(
            check(&caller, &Method::POST, &routed("/v1/queues", &Method::POST, &[])).is_ok(),
            "some write access to queues"
        );
        assert!(
            check(&caller, &Method::POST, &routed("/v1/txns", &Method::POST, &[])).is_err(),
            "no write access to any txn"
        );
    }
}
