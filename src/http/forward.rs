//! Requests for another instance's lease, handle or claim are served by that instance: this
//! layer sends them there and relays the answer, so clients (and load balancers without
//! stickiness) may send any request to any instance. See [crate::instances].
//!
//! Which instance a request is for is read from the ids it carries: the lease in
//! `/v1/leases/{id}`, a handle in `.../handles/{h}`, `.../candidates/{h}`, `.../permits/{h}`,
//! a claim in `/v1/queues/{name}/claims/{c}/...`, or the `lease` of a JSON body. A request
//! forwarded once carries [FORWARDED_BY] and is never forwarded again (no loops, even while
//! registrations change), and the owner authenticates and authorises it as usual: the
//! `Authorization` header goes along.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use crate::AppState;
use crate::ids::owner_of;

/// Marks a forwarded request (its value: the instance that forwarded it).
pub const FORWARDED_BY: &str = "zkgate-forwarded-by";

/// The layer; see the module's documentation.
pub async fn forward(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if request.headers().contains_key(FORWARDED_BY) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let (owner, body) = match owner_in_path(parts.uri.path()) {
        Some(owner) => (Some(owner.to_string()), body),
        None if parts.method == Method::DELETE
            && let Some(path) = member_node(&state, parts.uri.path()) =>
        {
            match state.instances.owner_of_node(&path).await {
                Ok(owner) => (owner, body),
                Err(err) => return ApiError::from(err).into_response(),
            }
        }
        None if carries_lease(&parts.method, &parts.headers, parts.uri.path()) => {
            // Small JSON bodies naming a lease: read here (within the body limit) and handed on.
            let bytes = match axum::body::to_bytes(body, super::BODY_LIMIT_BYTES).await {
                Ok(bytes) => bytes,
                Err(_) => return ApiError::too_large(super::BODY_LIMIT_BYTES).into_response(),
            };
            (lease_in_body(&bytes), Body::from(bytes))
        }
        None => (None, body),
    };
    let request = Request::from_parts(parts, body);
    match owner {
        Some(owner) if owner != *state.instance.id => relay(&state, &owner, request).await,
        _ => next.run(request).await,
    }
}

/// The instance named by an id in the path, if any.
fn owner_in_path(path: &str) -> Option<&str> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let id = match segments.as_slice() {
        ["v1", "leases", id] | ["v1", "leases", id, "keepalive"] => id,
        ["v1", "locks" | "rwlocks", _, "handles", id]
        | ["v1", "elections", _, "candidates", id]
        | ["v1", "semaphores", _, "permits", id]
        | ["v1", "queues", _, "claims", id, _] => id,
        _ => return None,
    };
    owner_of(id)
}

/// A group member named in `DELETE /v1/groups/{group}/members/{member}` that did not join
/// through this instance: its znode, whose owner session tells its instance.
fn member_node(state: &AppState, path: &str) -> Option<String> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let ["v1", "groups", group, "members", member] = segments.as_slice() else {
        return None;
    };
    let (group, member) = (
        crate::http::auth::percent_decode(group),
        crate::http::auth::percent_decode(member),
    );
    let valid = |name: &str| crate::zk::names::validate_name(name).is_ok();
    if !valid(&group) || !valid(&member) || state.groups.get(&group, &member).is_some() {
        return None;
    }
    Some(format!("{}/{member}", state.groups.dir(&group)))
}

/// Requests whose JSON body may name a lease: the ones that contend, join or register.
fn carries_lease(method: &Method, headers: &HeaderMap, path: &str) -> bool {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    json && matches!(*method, Method::POST | Method::PUT)
        && path.starts_with("/v1/")
        && !path.starts_with("/v1/kv/")
        && !path.starts_with("/v1/queues/")
}

fn lease_in_body(bytes: &Bytes) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let lease = value.get("lease")?.as_str()?;
    owner_of(lease).map(str::to_string)
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

/// Sends the request to `owner` and relays its answer (503 if it cannot be reached, 410 if it
/// is gone).
async fn relay(state: &AppState, owner: &str, request: Request) -> Response {
    let url = match state.instances.url_of(owner).await {
        Ok(Some(url)) => url,
        Ok(None) => return instance_gone(owner).into_response(),
        Err(err) => return ApiError::from(err).into_response(),
    };
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, super::BODY_LIMIT_BYTES).await {
        Ok(bytes) => bytes,
        Err(_) => return ApiError::too_large(super::BODY_LIMIT_BYTES).into_response(),
    };
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut headers = parts.headers.clone();
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    let forwarded_by = state
        .instance
        .id
        .parse()
        .unwrap_or_else(|_| axum::http::HeaderValue::from_static("?"));
    headers.insert(HeaderName::from_static(FORWARDED_BY), forwarded_by);
    // Long polls wait up to --max-wait on the owner: wait a little longer for them here.
    let timeout = state.config.max_wait + Duration::from_secs(10);
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
            tracing::warn!(%owner, %url, error = %err, "forwarding failed");
            return ApiError::instance_unavailable(format!(
                "the instance `{owner}` that owns this lease did not answer at {url}: {err}"
            ))
            .into_response();
        }
    };
    let status = answer.status();
    let mut headers = answer.headers().clone();
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    let body = answer.bytes().await.unwrap_or_default();
    let mut response = (status, body).into_response();
    response.headers_mut().extend(headers);
    response
}

fn instance_gone(owner: &str) -> ApiError {
    ApiError::gone(
        "lease-ended",
        "Lease ended",
        format!(
            "the instance `{owner}` that owned this lease (or handle or claim) is gone; its ZooKeeper session ended and took the lease with it"
        ),
    )
    .with("reason", "session_lost")
}

/// The client that forwards to other instances: kept-alive connections; for `https://` peers
/// the system's CAs and this instance's own certificate chain (instances of one deployment
/// usually share a CA).
pub fn peer_client(config: &crate::config::ServeConfig) -> reqwest::Client {
    crate::tls::install_crypto_provider();
    let mut builder = reqwest::Client::builder().pool_max_idle_per_host(64).tcp_nodelay(true);
    if let Some(pem) = config.tls_cert.as_ref().and_then(|cert| std::fs::read(cert).ok())
        && let Ok(certs) = reqwest::Certificate::from_pem_bundle(&pem)
    {
        builder = builder.tls_certs_merge(certs);
    }
    builder.build().unwrap_or_else(|err| {
        tracing::warn!(error = %err, "the forwarding client lacks the TLS settings");
        reqwest::Client::new()
    })
}
