//! The HTTP API: one module per resource, the problem-document error type, the extractors, and
//! the router that ties them to the OpenAPI description (the router and the spec are built
//! from the same handler list, so they cannot disagree).

pub mod auth;
mod barriers;
mod contention;
mod double_barriers;
mod elections;
pub mod error;
pub mod extract;
pub mod forward;
mod groups;
mod health;
mod kv;
pub mod leases;
mod limits;
mod locks;
pub mod origin;
mod queues;
mod rwlocks;
mod semaphores;
mod txns;

use std::time::SystemTime;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::Uri;
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use utoipa_swagger_ui::{Config as SwaggerConfig, SwaggerUi};

use crate::AppState;
use error::ApiError;

/// Largest request body accepted: well below ZooKeeper's 1 MB `jute.maxbuffer`.
pub const BODY_LIMIT_BYTES: usize = 512 * 1024;

#[derive(OpenApi)]
#[openapi(
    paths(kv::get_value, kv::put_value, kv::delete_value),
    info(
        title = "zkgate",
        description = "Apache ZooKeeper's coordination recipes over HTTP: leases, exclusive and read/write locks with fencing tokens, semaphores, leader election, group membership, configuration, barriers and double barriers, two-phase commit, queues.\n\n\
            Errors are RFC 9457 problem documents (`application/problem+json`) whose `type` is `urn:zkgate:problem:<slug>`.\n\
            Durations are written like `500ms`, `5s`, `1m`.",
        license(name = "MIT")
    ),
    tags(
        (name = "leases", description = "Lease-style handles: TTL, keepalive, and everything held on their behalf."),
        (name = "locks", description = "Exclusive locks (ZooKeeper's lock recipe on Curator's znode names), with fencing tokens."),
        (name = "elections", description = "Leader election (the guide's recipe on Curator's LeaderLatch names): campaign, resign, leader with term, proclaim."),
        (name = "kv", description = "Configuration and names: plain znodes, ETag versions, compare-and-set, blocking reads."),
        (name = "semaphores", description = "Counting semaphores with N permits (Curator's InterProcessSemaphoreV2 znodes)."),
        (name = "barriers", description = "Barriers (raise, lower, wait until down) and double barriers (enter together, leave together)."),
        (name = "txns", description = "Two-phase commit: participants register (lease-bound), vote, and read the decision, written once."),
        (name = "queues", description = "Durable queues and priority queues: idempotent puts, at-least-once takes with ack deadlines, dead letters."),
        (name = "groups", description = "Group membership: lease-bound members with data, and a blocking read of changes."),
        (name = "websocket", description = "Push over WebSockets: subscriptions to every recipe and to znodes, socket-bound leases, API calls."),
        (name = "rwlocks", description = "Shared (read/write) locks: readers share, a writer excludes all (Curator's InterProcessReadWriteLock names)."),
        (name = "health", description = "Liveness and readiness.")
    )
)]
struct ApiDoc;

fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(health::metrics))
        .routes(routes!(leases::create_lease, leases::list_leases))
        .routes(routes!(leases::get_lease, leases::delete_lease))
        .routes(routes!(leases::keepalive))
        .routes(routes!(locks::list_locks))
        .routes(routes!(locks::lock_state))
        .routes(routes!(locks::acquire))
        .routes(routes!(locks::get_handle, locks::release))
        .routes(routes!(locks::revoke))
        .routes(routes!(locks::revocations))
        .routes(routes!(rwlocks::list_rwlocks))
        .routes(routes!(rwlocks::rwlock_state))
        .routes(routes!(rwlocks::read))
        .routes(routes!(rwlocks::write))
        .routes(routes!(rwlocks::get_handle, rwlocks::release))
        .routes(routes!(rwlocks::revoke))
        .routes(routes!(elections::list_elections))
        .routes(routes!(elections::election_state))
        .routes(routes!(elections::campaign))
        .routes(routes!(elections::proclaim))
        .routes(routes!(elections::get_candidate, elections::resign))
        .routes(routes!(semaphores::list_semaphores))
        .routes(routes!(semaphores::semaphore_state))
        .routes(routes!(semaphores::acquire))
        .routes(routes!(semaphores::get_permit, semaphores::release))
        .routes(routes!(barriers::list_barriers))
        .routes(routes!(barriers::barrier_state, barriers::raise, barriers::lower))
        .routes(routes!(barriers::wait))
        .routes(routes!(double_barriers::list_double_barriers))
        .routes(routes!(double_barriers::double_barrier_state))
        .routes(routes!(double_barriers::enter))
        .routes(routes!(double_barriers::leave))
        .routes(routes!(txns::list_txns, txns::create))
        .routes(routes!(txns::get_txn))
        .routes(routes!(txns::register))
        .routes(routes!(txns::vote))
        .routes(routes!(queues::list_queues))
        .routes(routes!(queues::queue_state))
        .routes(routes!(queues::put))
        .routes(routes!(queues::take))
        .routes(routes!(queues::ack))
        .routes(routes!(queues::nack))
        .routes(routes!(queues::dead_letters))
        .routes(routes!(queues::replay))
        .routes(routes!(groups::list_groups))
        .routes(routes!(groups::members))
        .routes(routes!(groups::join, groups::leave))
        .routes(routes!(kv::list_keys))
        // Keys contain `/`: axum needs a wildcard, which the spec (from `ApiDoc`) writes `{key}`.
        .route(
            "/v1/kv/{*key}",
            get(kv::get_value).put(kv::put_value).delete(kv::delete_value),
        )
        // WebSockets: OpenAPI can describe the upgrade, the README and the handlers' docs the
        // messages.
        .routes(routes!(crate::ws::observe_election))
        .routes(routes!(crate::ws::socket))
}

/// The OpenAPI description of the API (what `/openapi.json` serves and
/// `openapi/openapi.json` holds).
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut spec = api_router().into_openapi();
    document_auth(&mut spec);
    spec
}

/// Bearer tokens in the spec: the scheme, and on every operation but the probes the
/// requirement and its two refusals (401 without a valid token, 403 outside the grants; they
/// apply when zkgate runs with `--auth-config`); on every write and socket, the 429 of the
/// limits.
fn document_auth(spec: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
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
    let refusal = |description: &str| {
        ResponseBuilder::new()
            .description(description)
            .content(
                error::PROBLEM_JSON,
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Problem")))
                    .build(),
            )
            .build()
    };
    for (path, item) in spec.paths.paths.iter_mut() {
        if path == "/healthz" || path == "/readyz" {
            continue;
        }
        let socket = path == "/v1/ws" || path.ends_with("/observe");
        let operations = [
            (false, &mut item.get),
            (true, &mut item.put),
            (true, &mut item.post),
            (true, &mut item.delete),
        ];
        for (write, operation) in operations
            .into_iter()
            .filter_map(|(write, op)| op.as_mut().map(|op| (write, op)))
        {
            operation.security = Some(vec![SecurityRequirement::new("bearer", Vec::<String>::new())]);
            let responses = &mut operation.responses.responses;
            let no_token = refusal("No valid bearer token (with `--auth-config`)");
            responses.insert("401".into(), no_token.into());
            responses.insert("403".into(), refusal("The token's principal may not do this").into());
            if (write || socket) && !responses.contains_key("429") {
                let why = if socket {
                    "Too many WebSockets for this principal or address; retry after `Retry-After`"
                } else {
                    "Too many writes a second (`--write-rate`), or a limit reached; retry after `Retry-After`"
                };
                responses.insert("429".into(), refusal(why).into());
            }
        }
    }
}

/// The full router: the API, `/openapi.json`, Swagger UI at `/docs`, the status page at `/`,
/// problem documents for unknown routes and methods.
pub fn router(state: AppState) -> Router {
    let (api, mut spec) = api_router().split_for_parts();
    document_auth(&mut spec);
    let docs = SwaggerUi::new("/docs")
        .url("/openapi.json", spec)
        .config(SwaggerConfig::default().validator_url("none"));
    api.layer(axum::middleware::from_fn_with_state(state.clone(), limits::rate_limit))
        .layer(axum::middleware::from_fn(auth::authorize))
        .merge(docs)
        .route("/", axum::routing::get(index))
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_LIMIT_BYTES))
        // After authentication (a stranger is refused here), before everything else (the owner
        // authorises, limits and serves).
        .layer(axum::middleware::from_fn_with_state(state.clone(), forward::forward))
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth::authenticate))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            origin::check_origin,
        ))
        .layer(origin::cors(&state.config.cors_origin))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// The API alone (no docs, no status page), for requests that arrive over a WebSocket
/// (`"op": "call"`): the same handlers, validation, authorisation and errors as over HTTP
/// (the socket puts its caller in each request's extensions, and checks the write rate
/// itself: this router is shared by all sockets and holds no state). The routes are built once; each
/// socket gives them its state.
pub fn api(state: AppState) -> Router {
    static API: std::sync::OnceLock<Router<AppState>> = std::sync::OnceLock::new();
    API.get_or_init(|| {
        api_router()
            .split_for_parts()
            .0
            .layer(axum::middleware::from_fn(auth::authorize))
            .fallback(no_route)
            .method_not_allowed_fallback(method_not_allowed)
            .layer(DefaultBodyLimit::max(BODY_LIMIT_BYTES))
    })
    .clone()
    .with_state(state)
}

/// The status page from `web/`, compiled into the binary (it loads nothing from elsewhere).
async fn index() -> Html<&'static str> {
    Html(include_str!("../../web/index.html"))
}

async fn no_route(uri: Uri) -> impl IntoResponse {
    ApiError::no_route(uri.path())
}

async fn method_not_allowed() -> impl IntoResponse {
    ApiError::method_not_allowed()
}

/// RFC 3339 with milliseconds, UTC.
pub(crate) fn timestamp(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

/// Milliseconds since `time` (0 if it is in the future).
pub(crate) fn millis_since(time: SystemTime) -> u64 {
    SystemTime::now().duration_since(time).unwrap_or_default().as_millis() as u64
}
