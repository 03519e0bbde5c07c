//! `/v1/services`: service discovery shared with Curator's `curator-x-discovery`: register an
//! instance (address, port, payload) bound to a lease, list a service's live instances, pick
//! one (random or round-robin), follow changes. See [crate::recipes::groups::service] for the
//! layout.

use crate::http::json::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::auth::Caller;
use crate::http::consistency::Consistency;
use crate::http::error::{ApiError, Problems, p};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::guards::{GuardHeader, Guarded};
use crate::http::{Followed, Resource, check_name};
use crate::kind::Kind;
use crate::recipes::groups::service::{InstanceView, ServiceState};
use crate::recipes::groups::{self, InstanceBody, PickQuery, Registered};

/// The service kind's module.
pub const RESOURCE: Resource = Resource {
    kind: Kind::Service,
    about: Some(
        "Service discovery as Curator's curator-x-discovery lays it out: lease-bound instances with an address, \
         port and payload; list, pick (random or round-robin), follow.",
    ),
    routes,
    topic: Some(Followed {
        summary: "Follows a service: instances registered and unregistered, as Server-Sent Events.",
        param: "name",
    }),
    listed: Some("Lists the services that have (or had) instances."),
};

fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(service_state))
        .routes(routes!(pick))
        .routes(routes!(get_instance, register, unregister))
}

/// Registers an instance of a service for as long as the lease lives (an ephemeral znode in
/// Curator's format: Curator's `ServiceDiscovery` sees it). Registering the same id again
/// with the same lease answers 200 with the registration; an id another lease or client holds
/// answers 409.
#[utoipa::path(operation_id = "register_service", put, path = "/v1/services/{name}/instances/{id}", tag = "services", extensions(("x-zkgate-served-by" = json!({"any": "body"}))),
    params(("name" = String, Path, description = "Service name"), ("id" = String, Path, description = "Instance id, unique in the service"), GuardHeader),
    request_body(content = InstanceBody, example = json!({"address": "10.0.0.5", "port": 8080, "payload": {"zone": "eu-1"}, "uri_spec": "{scheme}://{address}:{port}", "ttl": "30s"})),
    responses(
        (status = 201, description = "Registered", body = Registered),
        (status = 200, description = "Already registered with this lease", body = Registered),
        Problems<(p::InvalidField, p::MalformedBody, p::ValueTooLarge, p::NotFound, p::MemberTaken, p::LeaseEnded, p::QuotaExceeded, p::ZookeeperUnavailable)>,
    ))]
pub async fn register(
    State(state): State<AppState>,
    caller: Caller,
    Guarded(guards): Guarded,
    ApiPath((service, id)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<InstanceBody>,
) -> Result<Response, ApiError> {
    let (registered, made) = groups::register(&state, (&caller, &guards), (&service, &id), body).await?;
    let status = if made { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(registered)).into_response())
}

/// Unregisters an instance registered through zkgate (through any instance: its node records
/// its lease).
#[utoipa::path(delete, path = "/v1/services/{name}/instances/{id}", tag = "services",
    params(("name" = String, Path, description = "Service name"), ("id" = String, Path, description = "Instance id"), GuardHeader),
    responses(
        (status = 204, description = "Unregistered"),
        Problems<(p::InvalidField, p::NotFound)>,
    ))]
pub async fn unregister(
    State(state): State<AppState>,
    caller: Caller,
    Guarded(guards): Guarded,
    ApiPath((service, id)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    groups::unregister(&state, (&caller, &guards), (&service, &id)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Reads one instance of a service (registered by anyone).
#[utoipa::path(get, path = "/v1/services/{name}/instances/{id}", tag = "services",
    params(("name" = String, Path, description = "Service name"), ("id" = String, Path, description = "Instance id")),
    responses(
        (status = 200, description = "The instance", body = InstanceView),
        Problems<(p::InvalidField, p::NotFound, p::ZookeeperUnavailable)>,
    ))]
pub async fn get_instance(
    State(state): State<AppState>,
    ApiPath((service, id)): ApiPath<(String, String)>,
    consistency: Consistency,
) -> Result<Json<InstanceView>, ApiError> {
    groups::check_instance(&service, &id)?;
    let Json(read) = crate::http::read(&state, state.service_topic(&service), consistency).await?;
    read.instances
        .into_iter()
        .find(|i| i.id == id)
        .map(Json)
        .ok_or_else(|| ApiError::not_found("instance", format!("no instance `{id}` of `{service}`")))
}

crate::http::state_handler!(
    /// Lists a service's live instances (registered over HTTP or by Curator).
    service_state,
    "/v1/services/{name}",
    "services",
    "Service name",
    ServiceState,
    service_topic
);

/// Picks one enabled instance of a service: `random` (default), or `round-robin` (each in
/// turn, counted on this zkgate instance). 404 when the service has none.
#[utoipa::path(get, path = "/v1/services/{name}/pick", tag = "services",
    params(("name" = String, Path, description = "Service name"), PickQuery),
    responses(
        (status = 200, description = "The instance", body = InstanceView),
        Problems<(p::InvalidField, p::NotFound, p::ZookeeperUnavailable)>,
    ))]
pub async fn pick(
    State(state): State<AppState>,
    ApiPath(service): ApiPath<String>,
    ApiQuery(query): ApiQuery<PickQuery>,
    consistency: Consistency,
) -> Result<Json<InstanceView>, ApiError> {
    check_name(&service)?;
    let Json(read) = crate::http::read(&state, state.service_topic(&service), consistency).await?;
    let strategy = query.strategy.unwrap_or_default();
    state
        .service_picker
        .pick(&service, &read.instances, strategy)
        .cloned()
        .map(Json)
        .ok_or_else(|| ApiError::not_found("instance", format!("service `{service}` has no enabled instance")))
}
