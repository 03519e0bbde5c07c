//! `/v1/services`: service discovery shared with Curator's `curator-x-discovery`: register an
//! instance (address, port, payload) bound to a lease, list a service's live instances, pick
//! one (random or round-robin), follow changes. See [crate::recipes::groups::service] for the
//! layout.

use crate::http::guards::{GuardHeader, Guarded};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::auth::Caller;
use crate::events::Feed;
use crate::http::consistency::Consistency;
use crate::http::error::{ApiError, Place, Problem, Problems, p};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::{Followed, Resource, check_name};
use crate::kind::Kind;
use crate::recipes::groups::service::{
    CuratorInstance, InstanceView, Registrar, ServiceState, ServiceTopic, Strategy, UriSpecJson,
};
use crate::recipes::leases::Lease;
use crate::recipes::leases::LeaseView;
use crate::recipes::nodes::{self, NodeHolding};
use crate::recipes::validate_name;
use crate::time::{HumanDuration, timestamp};

/// The service kind's module.
pub const RESOURCE: Resource = Resource {
    kind: Kind::Service,
    about: Some(
        "Service discovery as Curator's curator-x-discovery lays it out: lease-bound instances with an address, \
         port and payload; list, pick (random or round-robin), follow.",
    ),
    routes,
    topic: Some(Followed {
        feed: |state, name| Feed::of(source(state, name)),
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

/// Service `name` as its topic and `GET` read it.
fn source(state: &AppState, name: &str) -> ServiceTopic {
    ServiceTopic {
        name: name.to_string(),
        dir: state.services.dir(name),
    }
}

/// Longest address accepted (a DNS name is at most 253 bytes).
pub(crate) const MAX_ADDRESS: usize = 253;

/// Body of a registration.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InstanceBody {
    /// Where the instance listens: a host name or an IP address.
    #[schema(example = "10.0.0.5", min_length = 1, max_length = 253)]
    pub address: String,
    #[schema(example = 8080, minimum = 0, maximum = 65535)]
    pub port: Option<u16>,
    #[schema(minimum = 0, maximum = 65535)]
    pub ssl_port: Option<u16>,
    /// Anything the instance publishes (JSON): a zone, a weight, a version...
    #[schema(example = json!({"zone": "eu-1"}))]
    pub payload: Option<serde_json::Value>,
    /// A URI template with `{scheme}`, `{address}`, `{port}`, `{ssl-port}`, `{name}`, `{id}`.
    #[schema(example = "{scheme}://{address}:{port}")]
    pub uri_spec: Option<String>,
    /// The lease the instance lives with. Without it a new lease is created and returned.
    pub lease: Option<String>,
    /// TTL of the lease created when `lease` is not given.
    pub ttl: Option<HumanDuration>,
}

/// An instance as it was registered.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Registered {
    #[schema(example = "billing")]
    pub service: String,
    #[schema(example = "billing-1")]
    pub id: String,
    #[schema(format = DateTime)]
    pub registered_at: String,
    /// The lease the registration lasts with.
    pub lease: LeaseView,
}

/// Query of a pick.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PickQuery {
    /// `random` (default) or `round-robin`.
    #[param(value_type = Option<Strategy>, example = "round-robin")]
    pub strategy: Option<Strategy>,
}

fn names(service: &str, id: &str) -> Result<(), ApiError> {
    check_name(service)?;
    validate_name(id).map_err(|e| ApiError::invalid(Place::Path, "id", e))
}

fn taken(service: &str, id: &str) -> ApiError {
    ApiError::new(
        Problem::MemberTaken,
        format!("instance `{id}` of `{service}` is registered by another lease or client"),
    )
}

fn registered(node: &NodeHolding) -> Registered {
    Registered {
        service: node.name.clone(),
        id: node.id.clone(),
        registered_at: timestamp(node.created_at),
        lease: LeaseView::of(&node.lease),
    }
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
    names(&service, &id)?;
    if body.address.is_empty()
        || body.address.chars().count() > MAX_ADDRESS
        || body.address.chars().any(char::is_control)
    {
        let detail = format!("must be 1 to {MAX_ADDRESS} characters, none of them control characters");
        return Err(ApiError::invalid(Place::Body, "address", detail));
    }
    let uri_spec = match &body.uri_spec {
        Some(template) => Some(UriSpecJson::parse(template).ok_or_else(|| {
            ApiError::invalid(Place::Body, "uri_spec", "must close every `{` it opens, around a name")
        })?),
        None => None,
    };
    let make = |lease: &Lease| {
        let instance = CuratorInstance {
            name: service.clone(),
            id: id.clone(),
            address: Some(body.address),
            port: body.port,
            ssl_port: body.ssl_port,
            payload: body.payload.unwrap_or(serde_json::Value::Null),
            registration_time_utc: crate::time::now_ms(),
            service_type: "DYNAMIC".into(),
            uri_spec,
            enabled: None,
            zkgate: Some(Registrar {
                lease: lease.id.clone(),
                principal: lease.principal.clone(),
            }),
        };
        let data = serde_json::to_vec(&instance).map_err(|e| ApiError::new(Problem::Internal, e.to_string()))?;
        state.check_stored_size("instance", data.len())?;
        Ok(data)
    };
    // Its data is charged to the caller, on the instance's session (as a group member's).
    let (lease, ttl) = (body.lease, body.ttl.map(|t| t.0));
    let at = (service.as_str(), id.as_str());
    let id_taken = || taken(&service, &id);
    let (node, made) = nodes::join(
        &state,
        (&caller, &guards),
        &state.services,
        at,
        (lease, ttl),
        make,
        id_taken,
    )
    .await?;
    if !made {
        return Ok((StatusCode::OK, Json(registered(&node))).into_response());
    }
    let m = crate::metrics::get();
    m.service_registrations
        .with_label_values(&[m.name(crate::metrics::SERVICE, &service)])
        .inc();
    Ok((StatusCode::CREATED, Json(registered(&node))).into_response())
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
    names(&service, &id)?;
    let gone = || {
        ApiError::not_found(
            "instance",
            format!("no instance `{id}` of `{service}` registered through zkgate"),
        )
    };
    let path = state.services.node(&service, &id);
    crate::recipes::nodes::unbind(
        &state,
        (&caller, &guards),
        &state.services,
        (&service, &id),
        &path,
        gone,
    )
    .await?;
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
    names(&service, &id)?;
    let Json(read) = crate::http::read(&state, source(&state, &service), consistency).await?;
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
    ServiceState
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
    let Json(read) = crate::http::read(&state, source(&state, &service), consistency).await?;
    let strategy = query.strategy.unwrap_or_default();
    state
        .service_picker
        .pick(&service, &read.instances, strategy)
        .cloned()
        .map(Json)
        .ok_or_else(|| ApiError::not_found("instance", format!("service `{service}` has no enabled instance")))
}
