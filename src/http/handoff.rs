//! Requests for another instance's lease, handle or claim are served by that instance: this
//! guard sends them there and relays the answer, so clients (and load balancers without
//! stickiness) may send any request to any instance, over HTTP or as a socket's call. See
//! [crate::instances].
//!
//! It runs after routing, so it reads the ids a request carries from what the router matched
//! and the [Kind] registry: a lease (`/v1/leases/{id}`), the kind's owned id (a lock's
//! `{handle}`, a queue's `{claim}`), a group member that joined elsewhere (its znode's owner
//! session names its instance), or the `lease` (or `handle`) of a JSON body for the kinds
//! whose writes may name one. A request forwarded once carries [FORWARDED_BY] and is never
//! forwarded again (no loops, even while registrations change).
//!
//! Forwarding needs the deployment's key ([crate::peer]): a request goes only to a registration
//! that verifies, without the client's `Authorization` (its token never leaves this
//! instance), with the principal this instance authenticated and a MAC over the request
//! instead ([peer_headers]); the owner checks those in [crate::http::auth::authenticate] and
//! authorises the request as usual. Without a key nothing is forwarded: the answer is `421
//! not-forwarded`, naming the instance.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, Problem};
use super::routed::Routed;
use crate::AppState;
use crate::auth::Caller;
use crate::ids::owner_of;
use crate::instances::Peer;
use crate::kind::Kind;

/// Marks a forwarded request (its value: the instance that forwarded it).
pub const FORWARDED_BY: &str = "zkgate-forwarded-by";
/// A forwarded request's caller, as the forwarding instance authenticated it.
pub const FORWARDED_FOR: &str = "zkgate-forwarded-for";
/// When a forwarded request was sent (ms since the Unix epoch).
pub const FORWARDED_AT: &str = "zkgate-forwarded-at";
/// The MAC of a forwarded request ([crate::peer::PeerKey::sign_forward]).
pub const SIGNATURE: &str = "zkgate-signature";

/// The guard; see the module's documentation.
pub async fn forward(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if request.headers().contains_key(FORWARDED_BY) {
        return next.run(request).await;
    }
    let (mut parts, body) = request.into_parts();
    let routed = match Routed::of(&mut parts).await {
        Ok(routed) => routed,
        Err(err) => return err.into_response(),
    };
    let (owner, body) = match owner(&state, &parts, &routed, body).await {
        Ok(found) => found,
        Err(err) => return err.into_response(),
    };
    let request = Request::from_parts(parts, body);
    match owner {
        Some(owner) if owner != *state.instance.id => {
            if !state.instances.can_forward() {
                // An instance that is not registered cannot be sent anything, key or no key:
                // say that, not "send it there".
                if matches!(state.instances.url_of(&owner).await, Ok(Peer::Gone)) {
                    return instance_gone(&owner).into_response();
                }
                return ApiError::new(
                    Problem::NotForwarded,
                    format!(
                        "this belongs to instance `{owner}`; this instance has no --cluster-secret (nor --zookeeper-auth) to forward with: send the request to that instance, or give every instance the same secret"
                    ),
                )
                .with("instance", owner)
                .into_response();
            }
            relay(&state, &owner, request).await
        }
        _ => next.run(request).await,
    }
}

/// Lock sets are no kind of their own (their locks are locks): their id and their body's lease
/// name the instance as a lock's handle and body do.
const LOCK_SETS: &str = "/v1/lock-sets";

/// A batch of a queue's claims to acknowledge: served by the instance of its first claim.
const CLAIMS_BATCH: &str = "/v1/queues/{name}/claims/ack";

/// Whether a route's requests may be forwarded (for the spec): what [owner] may find an owner
/// for.
pub fn may_forward(template: &str, method: &Method) -> bool {
    let kind = template
        .strip_prefix("/v1/")
        .and_then(|rest| rest.split('/').next())
        .and_then(Kind::from_segment);
    if template == CLAIMS_BATCH {
        return true;
    }
    match kind {
        None if template.starts_with(LOCK_SETS) => true,
        None => template.starts_with("/v1/leases/{id}"),
        Some(kind) => {
            kind.owned_param()
                .is_some_and(|param| template.contains(&format!("{{{param}}}")))
                || (matches!(kind, Kind::Group | Kind::Service) && method == Method::DELETE)
                || (kind.lease_in_body() && matches!(*method, Method::POST | Method::PUT))
        }
    }
}

/// The instance a request is for, if it names one, and its body (read when the body is where
/// the lease is named).
async fn owner(
    state: &AppState,
    parts: &Parts,
    routed: &Routed,
    body: Body,
) -> Result<(Option<String>, Body), ApiError> {
    let owned = match routed.kind {
        None if routed.is_under("/v1/leases") => routed.param("id"),
        None if routed.is_under(LOCK_SETS) => routed.param("set"),
        Some(kind) => kind.owned_param().and_then(|param| routed.param(param)),
        None => None,
    };
    if let Some(id) = owned {
        return Ok((owner_of(id).map(str::to_string), body));
    }
    if matches!(routed.kind, Some(Kind::Group | Kind::Service)) && parts.method == Method::DELETE {
        return Ok((member_owner(state, routed).await?, body));
    }
    let names_lease =
        routed.kind.is_some_and(Kind::lease_in_body) || routed.is_under(LOCK_SETS) || routed.template == CLAIMS_BATCH;
    if names_lease && carries_json(parts) {
        // Small JSON bodies naming a lease: read here (within the body limit) and handed on.
        let bytes = axum::body::to_bytes(body, super::BODY_LIMIT_BYTES)
            .await
            .map_err(|_| ApiError::too_large(super::BODY_LIMIT_BYTES))?;
        return Ok((lease_in_body(&bytes), Body::from(bytes)));
    }
    Ok((None, body))
}

/// The instance of a group member named in `DELETE /v1/groups/{group}/members/{member}` (or
/// of a service's instance, `DELETE /v1/services/{name}/instances/{id}`) that did not join
/// through this instance: its znode's owner session tells.
async fn member_owner(state: &AppState, routed: &Routed) -> Result<Option<String>, ApiError> {
    let (nodes, resource, id) = match routed.kind {
        Some(Kind::Service) => (&state.services, routed.param("name"), routed.param("id")),
        _ => (&state.groups, routed.param("group"), routed.param("member")),
    };
    let (Some(group), Some(member)) = (resource, id) else {
        return Ok(None);
    };
    let valid = |name: &str| crate::zk::names::validate_name(name).is_ok();
    if !valid(group) || !valid(member) || nodes.get(group, member).is_some() {
        return Ok(None);
    }
    let path = format!("{}/{member}", nodes.dir(group));
    Ok(state.instances.owner_of_node(&path).await?)
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

/// The instance of the lease a JSON body names, or of the handle it names (a leader's
/// proclamation names its candidate's handle), or of the first claim of a batch of claims.
fn lease_in_body(bytes: &Bytes) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let first_claim = value.get("claims").and_then(|claims| claims.get(0));
    ["lease", "handle"]
        .into_iter()
        .filter_map(|field| value.get(field))
        .chain(first_claim)
        .find_map(|id| id.as_str().and_then(owner_of))
        .map(str::to_string)
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
        Ok(Peer::At(url)) => url,
        Ok(Peer::Gone) => return instance_gone(owner).into_response(),
        Ok(Peer::Unverified) => return unavailable(owner).into_response(),
        Err(err) => return ApiError::from(err).into_response(),
    };
    let Some(key) = state.instances.key() else {
        return unavailable(owner).into_response();
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
    for name in NOT_FORWARDED {
        headers.remove(*name);
    }
    let caller = parts.extensions.get::<Caller>().cloned().unwrap_or(Caller::Nobody);
    let forward = crate::peer::Forward {
        method: parts.method.as_str(),
        path,
        from: &state.instance.id,
        to: owner,
        principal: caller.name(),
        at_ms: u64::try_from(crate::time::now_ms()).unwrap_or_default(),
        body: &body,
    };
    headers.extend(peer_headers(key, &forward));
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
            // The peer's address and the transport's error are for the log, not the client.
            tracing::warn!(%owner, url = ?url, error = %err, "forwarding failed");
            return ApiError::new(
                Problem::InstanceUnavailable,
                format!("the instance `{owner}` that owns this lease did not answer; try again"),
            )
            .into_response();
        }
    };
    let status = answer.status();
    let headers: HeaderMap = answer
        .headers()
        .iter()
        .filter(|(name, _)| RELAYED.contains(name))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    let body = answer.bytes().await.unwrap_or_default();
    let mut response = (status, body).into_response();
    response.headers_mut().extend(headers);
    response
}

/// The headers of a forward of `forward`: from whom, for whom, when, and their MAC.
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

/// A client's headers that do not go to the owner: its credentials (the owner believes the
/// principal this instance asserts, never a token) and the peer protocol's own headers.
const NOT_FORWARDED: &[&str] = &[
    "authorization",
    "cookie",
    "sec-websocket-protocol",
    FORWARDED_BY,
    FORWARDED_FOR,
    FORWARDED_AT,
    SIGNATURE,
];

/// The owner's response headers relayed to the client: what zkgate's handlers set.
const RELAYED: &[HeaderName] = &[
    header::CONTENT_TYPE,
    header::RETRY_AFTER,
    header::LOCATION,
    header::ETAG,
    header::WWW_AUTHENTICATE,
];

fn unavailable(owner: &str) -> ApiError {
    ApiError::new(
        Problem::InstanceUnavailable,
        format!("the instance `{owner}` that owns this could not be reached safely; try again"),
    )
}

fn instance_gone(owner: &str) -> ApiError {
    ApiError::new(
        Problem::LeaseEnded,
        format!(
            "no instance `{owner}` is registered: the instance that issued this lease (or handle or claim) is gone, and its ZooKeeper session took the lease and what it held with it (or the id was never issued)"
        ),
    )
    .with("reason", "session_lost")
}

/// The client that forwards to other instances: kept-alive connections; for `https://` peers
/// the system's CAs and this instance's own certificate chain (instances of one deployment
/// usually share a CA).
pub fn peer_client(config: &crate::config::ServeConfig) -> reqwest::Client {
    crate::tls::install_crypto_provider();
    // Idle connections go before the peer would close them (`--header-timeout`, 30 s by
    // default), so that a forward is not sent on a connection being closed.
    let mut builder = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .pool_idle_timeout(Duration::from_secs(20))
        .tcp_nodelay(true);
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
