//! Which instance serves a request, as each route declares it.
//!
//! Any instance serves almost everything from ZooKeeper: reads, handles, releases, members,
//! votes, a queue claim's ack and nack. What is inherently in one instance's memory is a
//! lease's TTL timer (and the tasks of what it holds), kept by its *keeper* ([crate::recipes::leases]).
//! So each operation declares, in its spec, whose memory it needs ([super::routed::SERVED_BY], an OpenAPI
//! extension the guard reads once from the spec):
//!
//! - `{"keeper": {"path": "id"}}` or `{"keeper": "body"}`: the keeper of the lease named by that
//!   path parameter or by the JSON body's `lease`. Kept here: served here. Kept by another
//!   instance that answers: handed to it and its answer relayed. Kept by an instance that is
//!   gone, does not answer, cannot vouch for it, or cannot be trusted (no or another
//!   `--cluster-secret`): taken over here ([crate::recipes::leases::Leases::take_over]) and served here.
//!   A body that names no lease makes a new one here.
//! - `{"any": "body"}`: any instance, for the lease the JSON body names: what makes a holding
//!   for a lease (an acquire, a campaign, a join) is served where it arrives, its wait
//!   included, whichever instance keeps the lease ([crate::recipes::leases::Leases::serve]: a lease kept
//!   elsewhere is *visited*). Nothing is handed over.
//! - nothing: any instance.
//!
//! No route template or body field is matched as a string: the guard reads the declaration of
//! the operation the router matched, and a body through a typed struct. A test holds every
//! operation whose body takes a `lease` to declaring it.
//!
//! Handing over needs the deployment's key ([crate::peer]): a request goes only to a
//! registration that verifies, without the client's `Authorization` (its token never leaves
//! this instance), with the principal this instance authenticated and a MAC over the request
//! instead ([peer_headers]); the other checks those in [crate::http::auth::authenticate] and
//! authorises the request as usual. A request handed over once carries [FORWARDED_BY] and is
//! never handed on again: an instance that receives one for a lease it does not keep (or while
//! it cannot vouch for its leases) answers [NOT_KEEPING], and the sender takes the lease over.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::error::{ApiError, Problem};
use super::routed::{Named, Routed, ServedBy};
use crate::AppState;
use crate::auth::Caller;
use crate::instances::Peer;
use crate::recipes::leases::LeaseError;

/// Marks a request handed over (its value: the instance that handed it).
pub const FORWARDED_BY: &str = "zkgate-forwarded-by";
/// [FORWARDED_BY] as a header name, for the look every request gets (a name from a string is
/// parsed at each look).
pub const FORWARDED_BY_NAME: HeaderName = HeaderName::from_static(FORWARDED_BY);
/// A handed-over request's caller, as the sending instance authenticated it.
pub const FORWARDED_FOR: &str = "zkgate-forwarded-for";
/// When a handed-over request was sent (ms since the Unix epoch).
pub const FORWARDED_AT: &str = "zkgate-forwarded-at";
/// The MAC of a handed-over request ([crate::peer::PeerKey::sign_forward]).
pub const SIGNATURE: &str = "zkgate-signature";
/// On the answer to a handed-over request: the lease is not kept here (any more), or this
/// instance cannot vouch for its leases now. The sender takes it over.
pub const NOT_KEEPING: &str = "zkgate-not-keeping";

/// The guard (see the module's documentation): `Ok` with the request when it is served here
/// (the lease it names kept here, taken over, or named nowhere), or the keeper's answer.
pub async fn serve_here(state: &AppState, routed: &Routed, request: Request) -> Result<Request, Response> {
    let Some(served_by) = routed.operation.and_then(|operation| operation.served_by.as_ref()) else {
        return Ok(request);
    };
    let ServedBy::Keeper(named) = served_by else {
        return Ok(request);
    };
    let handed = request.headers().contains_key(FORWARDED_BY_NAME);
    let (parts, body) = request.into_parts();
    let (id, body) = match named {
        Named::Path(param) => (routed.param(param).map(str::to_string), body),
        Named::Body => named_in_body(&parts, body).await.map_err(IntoResponse::into_response)?,
    };
    let request = Request::from_parts(parts, body);
    let Some(id) = id else {
        return Ok(request);
    };
    // Boxed: what handing over awaits (an HTTP client's request) is large, and every request
    // through the guard would otherwise move a future that large.
    Box::pin(to_keeper(state, &id, handed, routed.waits(), request)).await
}

/// The lease id the request's JSON body names, and its body (read, so given back whole).
async fn named_in_body(parts: &Parts, body: Body) -> Result<(Option<String>, Body), ApiError> {
    if !carries_json(parts) {
        return Ok((None, body));
    }
    let bytes = axum::body::to_bytes(body, crate::listen::BODY_LIMIT_BYTES)
        .await
        .map_err(|_| ApiError::too_large(crate::listen::BODY_LIMIT_BYTES))?;
    // Read through a typed struct; a body it does not fit is the handler's to refuse.
    let id = serde_json::from_slice::<NamedInBody>(&bytes)
        .ok()
        .and_then(|body| body.lease);
    Ok((id, Body::from(bytes)))
}

/// What a body may name: the lease it acts with.
#[derive(Deserialize)]
struct NamedInBody {
    lease: Option<String>,
}

/// A write with a JSON body, which may name a lease.
fn carries_json(parts: &Parts) -> bool {
    let json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    json && matches!(parts.method, Method::POST | Method::PUT)
}

/// Serves a request for lease `id` here if this instance keeps it; else hands it to its keeper,
/// or takes the lease over when that is gone, does not answer, cannot vouch for it or cannot be
/// trusted. Any other answer about the lease (unknown, ended, another principal's) is the
/// handler's to give.
async fn to_keeper(
    state: &AppState,
    id: &str,
    handed: bool,
    waits: bool,
    request: Request,
) -> Result<Request, Response> {
    let caller = request.extensions().get::<Caller>().cloned().unwrap_or(Caller::Nobody);
    let keeper = match state.leases.find(&caller, id).await {
        Ok(_) => return Ok(request),
        Err(LeaseError::Elsewhere { keeper, .. }) => keeper,
        Err(LeaseError::NotFresh) if handed => return Err(not_keeping(id)),
        Err(_) => return Ok(request),
    };
    if handed {
        // Handed here by an instance that took the keeper to be this one: not any more.
        return Err(not_keeping(id));
    }
    let (mut keeper, mut request) = (keeper, request);
    // The keeper may change while this runs (another instance took the lease over from the
    // one that failed): the request follows it, a few times.
    for _ in 0..HANDOFF_HOPS {
        request = match hand_over(state, &keeper, waits, request).await {
            Ok(answer) => return Err(answer),
            Err(request) => request,
        };
        match state.leases.take_over(&caller, id, Some(&keeper), false).await {
            Err(LeaseError::Elsewhere { keeper: now, .. }) => keeper = now,
            _ => return Ok(request),
        }
    }
    Err(ApiError::new(
        Problem::InstanceUnavailable,
        format!("lease `{id}` moved to instance `{keeper}` while this request was on its way; try again"),
    )
    .into_response())
}

/// How many keepers a request follows before it answers `503` (each found failing, or taken
/// over by another meanwhile).
const HANDOFF_HOPS: usize = 3;

/// Sends `request` to the instance `keeper` and relays its answer; gives the request back when
/// it cannot be handed over (no key, no verified registration, no answer, or the keeper does
/// not keep the lease).
async fn hand_over(state: &AppState, keeper: &str, waits: bool, request: Request) -> Result<Response, Request> {
    let Some(key) = state.instances.key() else {
        return Err(request);
    };
    let Ok(Peer::At(url)) = state.instances.url_of(keeper).await else {
        return Err(request);
    };
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, crate::listen::BODY_LIMIT_BYTES).await {
        Ok(bytes) => bytes,
        Err(_) => return Ok(ApiError::too_large(crate::listen::BODY_LIMIT_BYTES).into_response()),
    };
    // A long poll waits up to --max-wait there; anything else answers at once, or is taken over.
    let timeout = match waits {
        true => state.max_wait + Duration::from_secs(10),
        false => HANDOFF_TIMEOUT,
    };
    match relay(state, key, keeper, &url, &parts, body.clone(), timeout).await {
        Some(answer) if !answer.headers().contains_key(NOT_KEEPING) => Ok(answer),
        _ => Err(Request::from_parts(parts, Body::from(body))),
    }
}

/// How long a request that does not wait may take on the keeper before this instance takes the
/// lease over (a keeper that is paused, or cut off).
pub const HANDOFF_TIMEOUT: Duration = Duration::from_secs(2);

/// The answer to a handed-over request for a lease this instance does not keep (any more) or
/// cannot vouch for now.
fn not_keeping(id: &str) -> Response {
    let mut response = ApiError::new(
        Problem::InstanceUnavailable,
        format!("lease `{id}` is not kept by this instance now"),
    )
    .into_response();
    if let Ok(value) = HeaderValue::from_str(id) {
        response
            .headers_mut()
            .insert(HeaderName::from_static(NOT_KEEPING), value);
    }
    response
}

/// Headers that belong to one connection, not to the request.
const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::HOST,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TE,
    header::TRAILER,
    header::PROXY_AUTHORIZATION,
];

/// Sends the request to `to` at `url`, signed, and relays its answer; `None` if it does not
/// answer within `timeout`.
async fn relay(
    state: &AppState,
    key: &crate::peer::PeerKey,
    to: &str,
    url: &str,
    parts: &Parts,
    body: Bytes,
    timeout: Duration,
) -> Option<Response> {
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut headers = parts.headers.clone();
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    for name in NOT_FORWARDED {
        headers.remove(*name);
    }
    let caller = parts.extensions.get::<Caller>().cloned().unwrap_or(Caller::Nobody);
    let forward = crate::peer::Forward {
        method: parts.method.as_str(),
        path,
        from: &state.instance.id,
        to,
        principal: caller.name(),
        at_ms: u64::try_from(crate::time::now_ms()).unwrap_or_default(),
        body: &body,
    };
    headers.extend(peer_headers(key, &forward));
    crate::metrics::get().handoffs.inc();
    let sent = state
        .peers
        .request(parts.method.clone(), format!("{url}{path}"))
        .headers(headers)
        .body(body)
        .timeout(timeout)
        .send()
        .await;
    let answer = match sent {
        Ok(answer) => answer,
        Err(err) => {
            // The peer's address and the transport's error are for the log, not the client.
            tracing::warn!(%to, url = ?url, error = %err, "handing a request over failed");
            return None;
        }
    };
    let status = answer.status();
    let headers: HeaderMap = answer
        .headers()
        .iter()
        .filter(|(name, _)| RELAYED.contains(name) || name.as_str() == NOT_KEEPING)
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    let body = answer.bytes().await.ok()?;
    let mut response = (status, body).into_response();
    response.headers_mut().extend(headers);
    if status == StatusCode::SERVICE_UNAVAILABLE && response.headers().contains_key(NOT_KEEPING) {
        tracing::info!(%to, "the instance handed a request did not keep its lease");
    }
    Some(response)
}

/// The headers of a hand-over of `forward`: from whom, for whom, when, and their MAC.
pub fn peer_headers(key: &crate::peer::PeerKey, forward: &crate::peer::Forward<'_>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let mut put = |name: &'static str, value: &str| {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    };
    put(FORWARDED_BY, forward.from);
    if let Some(principal) = forward.principal {
        put(FORWARDED_FOR, principal);
    }
    put(FORWARDED_AT, &forward.at_ms.to_string());
    put(SIGNATURE, &key.sign_forward(forward));
    headers
}

/// A client's headers that do not go to the other instance: its credentials (the receiver
/// believes the principal this instance asserts, never a token) and the peer protocol's own
/// headers.
const NOT_FORWARDED: &[&str] = &[
    "authorization",
    "cookie",
    "sec-websocket-protocol",
    FORWARDED_BY,
    FORWARDED_FOR,
    FORWARDED_AT,
    SIGNATURE,
];

/// The other instance's response headers relayed to the client: what zkgate's handlers set.
const RELAYED: &[HeaderName] = &[
    header::CONTENT_TYPE,
    header::RETRY_AFTER,
    header::LOCATION,
    header::ETAG,
    header::WWW_AUTHENTICATE,
    header::LINK,
];

/// The client that hands requests to other instances: kept-alive connections; for `https://`
/// peers the system's CAs and this instance's own certificate chain (instances of one
/// deployment usually share a CA).
pub fn peer_client(config: &crate::config::ServeConfig) -> reqwest::Client {
    crate::tls::install_crypto_provider();
    // Idle connections go before the peer would close them (`--header-timeout`, 30 s by
    // default), so that a request is not sent on a connection being closed.
    let mut builder = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .pool_idle_timeout(Duration::from_secs(20))
        .connect_timeout(HANDOFF_TIMEOUT)
        .tcp_nodelay(true);
    if let Some(pem) = config.tls_cert.as_ref().and_then(|cert| std::fs::read(cert).ok())
        && let Ok(certs) = reqwest::Certificate::from_pem_bundle(&pem)
    {
        builder = builder.tls_certs_merge(certs);
    }
    builder.build().unwrap_or_else(|err| {
        tracing::warn!(error = %err, "the hand-over client lacks the TLS settings");
        reqwest::Client::new()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::routed::{declaration, takes_wait};
    use utoipa::openapi::{RefOr, Schema};

    /// The declarations of `spec`: method, path, what it says (or why it does not parse), and
    /// whether the operation waits.
    fn declarations(spec: &utoipa::openapi::OpenApi) -> Vec<(Method, String, Result<ServedBy, String>, bool)> {
        crate::spec::operations(spec)
            .filter_map(|(method, path, operation)| {
                let parsed = declaration(operation)?;
                Some((method, path.clone(), parsed, takes_wait(operation)))
            })
            .collect()
    }

    /// The properties of a request body's schema (resolved through the components, and
    /// through the `oneOf` an optional body is).
    fn body_properties(spec: &utoipa::openapi::OpenApi, operation: &utoipa::openapi::path::Operation) -> Vec<String> {
        let Some(RefOr::T(body)) = &operation.request_body else {
            return Vec::new();
        };
        let mut properties = Vec::new();
        for content in body.content.values() {
            let RefOr::T(content) = content else { continue };
            if let Some(schema) = &content.schema {
                properties_of(spec, schema, &mut properties);
            }
        }
        properties
    }

    fn properties_of(spec: &utoipa::openapi::OpenApi, schema: &RefOr<Schema>, out: &mut Vec<String>) {
        match schema {
            RefOr::Ref(reference) => {
                let name = reference.ref_location.rsplit('/').next().unwrap_or_default();
                let components = spec.components.as_ref().expect("components");
                if let Some(schema) = components.schemas.get(name) {
                    properties_of(spec, schema, out);
                }
            }
            RefOr::T(Schema::Object(object)) => out.extend(object.properties.keys().cloned()),
            RefOr::T(Schema::OneOf(one_of)) => one_of.items.iter().for_each(|s| properties_of(spec, s, out)),
            RefOr::T(Schema::AllOf(all_of)) => all_of.items.iter().for_each(|s| properties_of(spec, s, out)),
            RefOr::T(Schema::AnyOf(any_of)) => any_of.items.iter().for_each(|s| properties_of(spec, s, out)),
            RefOr::T(_) => {}
        }
    }

    /// Every declaration parses and names what the operation has, and every operation whose
    /// body names a lease declares it: a new route cannot forget to be served where its lease
    /// is kept.
    #[test]
    fn every_operation_that_acts_for_a_lease_declares_it() {
        let spec = crate::http::routes().into_openapi();
        let declared = declarations(&spec);
        assert!(!declared.is_empty());
        for (method, path, served_by, _) in &declared {
            let served_by = served_by.as_ref().unwrap_or_else(|e| panic!("{method} {path}: {e}"));
            let (ServedBy::Keeper(named) | ServedBy::Any(named)) = served_by;
            if let Named::Path(param) = named {
                assert!(
                    path.contains(&format!("{{{param}}}")),
                    "{method} {path} has no `{param}`"
                );
            }
        }
        for (method, path, operation) in crate::spec::operations(&spec) {
            let properties = body_properties(&spec, operation);
            if method == Method::GET || !properties.iter().any(|p| p == "lease") {
                continue;
            }
            // Served where it arrives (it makes a holding) or by the keeper: either way the
            // lease is found from the body, never assumed kept here.
            let found = declared
                .iter()
                .find(|(m, p, _, _)| *m == method && p == path)
                .and_then(|(_, _, served_by, _)| served_by.clone().ok());
            assert!(
                matches!(found, Some(ServedBy::Any(Named::Body) | ServedBy::Keeper(Named::Body))),
                "{method} {path}: {found:?}"
            );
        }
    }

    #[test]
    fn a_declaration_reads_as_written() {
        let parse = |text: &str| serde_json::from_str::<ServedBy>(text).map_err(|e| e.to_string());
        assert_eq!(
            parse(r#"{"keeper": {"path": "id"}}"#),
            Ok(ServedBy::Keeper(Named::Path("id".into())))
        );
        assert_eq!(parse(r#"{"keeper": "body"}"#), Ok(ServedBy::Keeper(Named::Body)));
        assert_eq!(parse(r#"{"any": "body"}"#), Ok(ServedBy::Any(Named::Body)));
        assert!(parse(r#"{"issuer": "body"}"#).is_err(), "claims are served anywhere");
        assert!(parse(r#"{"keeper": "query"}"#).is_err());
        assert!(parse(r#"{"owner": "body"}"#).is_err());
    }
}
