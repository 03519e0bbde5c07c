//! The HTTP API: one module per resource kind, each a thin adapter from HTTP to its recipe
//! (etcd's `v3lock` is the model: parse, call the recipe, map the result), the catalogue of
//! problems, the extractors, and the guards every API route passes (hand-off, authorisation,
//! the write rate).
//!
//! Each `<kind>.rs` exports a [Resource]: its kind, its routes (router and spec from the same
//! handler list, so they cannot disagree) and its topic; [RESOURCES] lists them, and
//! everything else (the router, the spec's tags, the socket's topics) is built from that list.

pub mod auth;
mod barriers;
pub mod consistency;
mod counters;
pub mod edge;
mod elections;
pub mod error;
pub mod events;
pub mod extract;
mod groups;
pub mod guards;
pub mod handoff;
mod health;
pub mod idempotency;
pub mod json;
mod kv;
pub mod leases;
pub mod limits;
mod locks;
pub mod origin;
pub mod paging;
mod queues;
pub mod routed;
mod txns;

use crate::http::json::Json;
use axum::Router;
use axum::http::{Method, Uri};
use axum::response::IntoResponse;
use consistency::Consistency;
use utoipa::OpenApi;
use utoipa::openapi::path::Operation;
use utoipa::openapi::tag::TagBuilder;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::kind::Kind;
use crate::recipes::topic::Source;
use error::ApiError;

/// What a resource kind's module contributes to the API.
pub struct Resource {
    pub kind: Kind,
    /// The description of the kind's OpenAPI tag, for the kind that owns it.
    pub about: Option<&'static str>,
    /// Its routes, each with its spec.
    pub routes: fn() -> OpenApiRouter<AppState>,
    /// How one of its resources is followed: over a socket, on `GET /v1/events`, and on its own
    /// `GET /v1/<segment>/{name}/events` ([events::events_route]); `None` for a kind without
    /// topics.
    pub topic: Option<Followed>,
    /// What `GET /v1/<segment>` lists ([list_route]); `None` for a kind that lists its own way.
    pub listed: Option<&'static str>,
}

/// How a kind's resources are followed (their feed is the recipe's topic:
/// [crate::events::topics::feed_of]).
pub struct Followed {
    /// The summary of its `GET /v1/<segment>/{name}/events` in the spec.
    pub summary: &'static str,
    /// The name of the path parameter that names one of its resources, as on its other routes
    /// (`name`, `group`, `id`).
    pub param: &'static str,
}

/// Every resource kind's module.
pub const RESOURCES: &[Resource] = &[
    locks::exclusive::RESOURCE,
    locks::rwlocks::RESOURCE,
    locks::semaphores::RESOURCE,
    elections::RESOURCE,
    barriers::barrier::RESOURCE,
    barriers::double::RESOURCE,
    txns::RESOURCE,
    queues::RESOURCE,
    groups::group::RESOURCE,
    kv::keys::RESOURCE,
    counters::RESOURCE,
    groups::service::RESOURCE,
];

#[derive(OpenApi)]
#[openapi(
    info(
        title = "zkgate",
        description = "Apache ZooKeeper's coordination recipes over HTTP: leases, exclusive and read/write locks with fencing tokens, lock sets, semaphores, leader election, group membership, service discovery, configuration (kv), counters, barriers and double barriers, two-phase commit, queues (one tag per kind below).\n\n\
            Errors are RFC 9457 problem documents (`application/problem+json`) whose `type` is `urn:zkgate:problem:<slug>`.\n\
            Durations are written like `500ms`, `5s`, `1m`.",
        license(name = "MIT", identifier = "MIT")
    ),
    components(schemas(error::ProblemDocument, ListedResource, crate::recipes::groups::service::Strategy, crate::time::HumanDuration, crate::spec::formats::JsonValue)),
    tags(
        (name = "leases", description = "Lease-style handles: TTL, keepalive, and everything held on their behalf."),
        (name = "websocket", description = "Push over WebSockets: subscriptions to every recipe and to znodes, socket-bound leases, API calls."),
        (name = "events", description = "Push over plain HTTP: every topic a socket can subscribe to, as Server-Sent Events (`curl -N`, `EventSource`), resumable with `Last-Event-ID`."),
        (name = "health", description = "Liveness, readiness and metrics.")
    )
)]
struct ApiDoc;

/// The API's routes and their spec (the sockets' are the `ws` module's): health, leases and
/// every resource kind, each kind's tag described.
pub fn routes() -> OpenApiRouter<AppState> {
    let mut api = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(health::metrics))
        .routes(routes!(events::events))
        .merge(leases::routes())
        .merge(locks::lock_sets::routes());
    for resource in RESOURCES {
        api = api.merge((resource.routes)());
        if let Some(listed) = resource.listed {
            api = api.merge(list_route(resource.kind, listed));
        }
        if let Some(followed) = &resource.topic {
            api = api.merge(events::events_route(resource.kind, followed));
        }
    }
    let tags = api.get_openapi_mut().tags.get_or_insert_with(Vec::new);
    for resource in RESOURCES {
        if let Some(about) = resource.about {
            tags.push(
                TagBuilder::new()
                    .name(resource.kind.tag())
                    .description(Some(about))
                    .build(),
            );
        }
    }
    tags.sort_by(|a, b| a.name.cmp(&b.name));
    api
}

/// The guards of every API route, after routing ([edge::Guard]: hand-off, authorisation,
/// limits). Routes only: unknown paths and methods get their problem without.
pub fn guard(router: Router<AppState>, state: &AppState) -> Router<AppState> {
    router.route_layer(edge::Guarded(state.clone()))
}

/// Unknown routes and methods as problem documents.
pub fn finish(router: Router<AppState>) -> Router<AppState> {
    router
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
}

/// The whole HTTP application as it is served: the router behind the [edge::Edge], and behind
/// CORS when origins are allowed.
pub type App = tower::util::Either<tower_http::cors::Cors<edge::Edge<Router>>, edge::Edge<Router>>;

/// `app` behind the [edge::Edge], which wraps the whole router once (a router's own `layer`
/// would wrap each of its routes), and CORS when origins are allowed.
pub fn edge(app: Router, state: &AppState) -> App {
    use tower::Layer;
    let edged = edge::Edge::new(state.clone(), app);
    tower::util::option_layer(origin::cors(&state.config.cors_origin)).layer(edged)
}

/// The API alone (no sockets, docs or status page), for requests that arrive over a
/// WebSocket (`"op": "call"`): the same handlers, validation, guards and errors as over HTTP
/// (the socket puts its caller in each request's extensions). The routes are built once (the
/// spec is the costly part); each socket's first call guards them with its state.
pub fn api(state: &AppState) -> Router {
    static ROUTES: std::sync::OnceLock<Router<AppState>> = std::sync::OnceLock::new();
    let routes = ROUTES.get_or_init(|| routes().split_for_parts().0).clone();
    finish(guard(routes, state)).with_state(state.clone())
}

async fn no_route(uri: Uri) -> impl IntoResponse {
    ApiError::new(
        error::Problem::NoSuchEndpoint,
        format!("no endpoint at `{}`; see /docs", uri.path()),
    )
}

/// A known path with another method: the problem names the methods the endpoint takes
/// (`allowed`), as the `Allow` header the router adds does, for a client that prints the body.
async fn method_not_allowed(matched: Option<axum::extract::MatchedPath>) -> impl IntoResponse {
    let allowed = matched.map(|m| allowed_methods(m.as_str())).unwrap_or_default();
    let detail = if allowed.is_empty() {
        "this endpoint does not support that method; see /docs".to_string()
    } else {
        format!("this endpoint takes {}; see /docs", allowed.join(", "))
    };
    ApiError::new(error::Problem::MethodNotAllowed, detail).with("allowed", allowed)
}

/// The methods the spec lists for the route `template` (`/v1/locks/{name}/acquire`).
fn allowed_methods(template: &str) -> Vec<String> {
    routed::Route::named(template).map_or_else(Vec::new, |route| route.methods().map(Method::to_string).collect())
}

pub use crate::recipes::check_name;

/// Declares a kind's `GET /v1/<kind>/{name}`: the resource's state, as its topic carries it,
/// read from the recipes' `$topic(name)`. One shape for every kind, so it is written once.
macro_rules! state_handler {
    ($(#[doc = $doc:tt])* $handler:ident, $path:tt, $tag:tt, $what:tt, $state:ident, $topic:ident) => {
        $(#[doc = $doc])*
        #[utoipa::path(get, path = $path, tag = $tag,
            params(("name" = String, Path, description = $what)),
            responses(
                (status = 200, description = "The resource's state now", body = $state),
                $crate::http::error::Problems<($crate::http::error::p::InvalidField, $crate::http::error::p::ZookeeperUnavailable)>,
            ))]
        pub async fn $handler(
            axum::extract::State(state): axum::extract::State<$crate::AppState>,
            $crate::http::extract::ApiPath(name): $crate::http::extract::ApiPath<String>,
            consistency: $crate::http::consistency::Consistency,
        ) -> Result<$crate::http::json::Json<$state>, $crate::http::error::ApiError> {
            $crate::http::check_name(&name)?;
            $crate::http::read(&state, state.$topic(&name), consistency).await
        }
    };
}

pub(crate) use state_handler;

/// One entry of a kind's list (`GET /v1/<kind>`): a resource and how many children its znode has.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ListedResource {
    #[schema(example = "orders")]
    pub name: String,
    /// Its children in ZooKeeper: holders plus waiters, members, items...
    pub contenders: i32,
}

/// `GET /v1/<segment>`: one page of the resources the caller may read ([crate::recipes::Recipes::readable]), with its operation in the spec (`list_<kind>s`),
/// one per kind from the registry rather than a handler of the same four lines in each
/// kind's module.
fn list_route(kind: Kind, listed: &'static str) -> OpenApiRouter<AppState> {
    use utoipa::openapi::path::{OperationBuilder, ParameterIn};
    use utoipa::openapi::{ArrayBuilder, ContentBuilder, Ref, ResponseBuilder, header::HeaderBuilder};
    use utoipa::{IntoParams, IntoResponses};
    let handler = move |axum::extract::State(state): axum::extract::State<AppState>,
                        caller: crate::auth::Caller,
                        consistency: Consistency,
                        paging: paging::Paging| async move {
        let names = state.readable(&caller, kind, consistency).await?;
        Ok::<_, ApiError>(
            paging
                .page(names, |(name, _)| name.clone())
                .map(|(name, contenders)| ListedResource { name, contenders }),
        )
    };
    let path = format!("/v1/{}", kind.segment());
    let page = ResponseBuilder::new()
        .description("A page of the names, in order (`Link` gives the next page while more follow)")
        .header(
            "Link",
            HeaderBuilder::new()
                .schema(Some(
                    utoipa::openapi::ObjectBuilder::new().schema_type(utoipa::openapi::schema::Type::String),
                ))
                .description(Some("While more entries follow: the next page, `<url>; rel=\"next\"`"))
                .build(),
        )
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(ArrayBuilder::new().items(Ref::from_schema_name("ListedResource"))))
                .build(),
        )
        .build();
    let mut responses = error::Problems::<(error::p::ZookeeperUnavailable,)>::responses();
    responses.insert("200".to_string(), page.into());
    let operation = OperationBuilder::new()
        .tag(kind.tag())
        .summary(Some(listed))
        .operation_id(Some(format!("list_{}", kind.segment().replace('-', "_"))))
        .parameters(Some(paging::PageQuery::into_params(|| Some(ParameterIn::Query))))
        .responses(utoipa::openapi::ResponsesBuilder::new().responses_from_iter(responses))
        .build();
    get_route(&path, axum::routing::get(handler), operation)
}

/// The `GET` route at `path` served by `handler`, with its `operation` in the spec: for the
/// routes made from the registry rather than declared by a handler's attribute.
pub(crate) fn get_route(
    path: &str,
    handler: axum::routing::MethodRouter<AppState>,
    operation: Operation,
) -> OpenApiRouter<AppState> {
    let mut router = OpenApiRouter::new().route(path, handler);
    let paths = &mut router.get_openapi_mut().paths;
    paths.add_path_operation(path, vec![utoipa::openapi::path::HttpMethod::Get], operation);
    router
}

/// `GET` of a resource: its state, as its topic carries it, read on the primary session at
/// `consistency`.
pub async fn read<S: Source>(
    state: &AppState,
    source: S,
    consistency: Consistency,
) -> Result<Json<S::State>, ApiError> {
    Ok(Json(state.read_state(source, consistency).await?))
}

/// What the spec says beyond each operation's own declaration: the guards' problems and
/// bearer auth ([document_auth]), and `?consistency=` on the reads ([consistency::document]),
/// the values' formats ([crate::spec::formats::document]); last, nullable fields written the OpenAPI 3.1
/// way ([crate::spec::formats::nullable_as_types]) and optional bodies as their schema in a body that is not
/// required ([crate::spec::formats::optional_bodies_as_refs]).
pub fn document(spec: &mut utoipa::openapi::OpenApi) {
    document_auth(spec);
    events::document(spec);
    consistency::document(spec);
    crate::spec::formats::document(spec);
    idempotency::document(spec);
    guards::document(spec);
    crate::spec::formats::nullable_as_types(spec);
    crate::spec::formats::optional_bodies_as_refs(spec);
}

/// Bearer tokens in the spec: the scheme, and on every operation but the probes the
/// requirement (optional: `{}` too, since without `--auth-config` none is needed) and the problems of the guards every route passes: 401 without a valid token
/// and 403 outside the grants (both with `--auth-config`), and on every write and socket the
/// 429 of the limits.
pub fn document_auth(spec: &mut utoipa::openapi::OpenApi) {
    use error::Problem;
    use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
    let components = spec.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "bearer",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "With `--auth-config`: `Authorization: Bearer <token>`; on a WebSocket handshake also the \
                     `zkgate.bearer.<base64url token>` subprotocol (offered with `zkgate`).",
                ))
                .build(),
        ),
    );
    for (method, path, operation) in crate::spec::operations_mut(spec) {
        if path == "/healthz" || path == "/readyz" {
            continue;
        }
        let socket = routed::is_long_lived(path);
        let write = method != Method::GET;
        // Optional: without `--auth-config` no token is needed (`{}`, no requirement).
        operation.security = Some(vec![
            SecurityRequirement::new("bearer", Vec::<String>::new()),
            SecurityRequirement::default(),
        ]);
        let mut guards = vec![Problem::Unauthorized, Problem::Forbidden];
        if write {
            guards.extend([Problem::RateLimited, Problem::TooMany]);
        } else if socket || routed::takes_wait(operation) {
            // A socket or a long poll past its limits.
            guards.push(Problem::TooMany);
        }
        let served_by = operation
            .extensions
            .as_ref()
            .and_then(|e| e.get(routed::SERVED_BY))
            .and_then(|value| serde_json::from_value::<routed::ServedBy>(value.clone()).ok());
        if served_by.is_some() {
            // Handed to a keeper that is not reachable, or a lease that moved meanwhile.
            guards.push(Problem::InstanceUnavailable);
        }
        if routed::takes_a_turn(&method, path) {
            guards.push(Problem::Overloaded);
        }
        error::declare(operation, guards);
    }
}
