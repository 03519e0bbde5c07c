//! What the router matched for a request, for the guard that runs after routing
//! ([super::edge::Guard]): the route as the API's own spec declares it ([Route], read once
//! from the spec, so that no guard keeps a list of endpoints in step), the resource kind it
//! serves (from the registry, by the template's segment after `/v1/`), and the path
//! parameters as the handlers will see them (percent-decoded by axum).

use std::collections::HashMap;
use std::sync::OnceLock;

use axum::extract::{FromRequestParts, MatchedPath, RawPathParams};
use axum::http::Method;
use axum::http::request::Parts;

use serde::Deserialize;
use utoipa::openapi::RefOr;
use utoipa::openapi::path::ParameterIn;

use super::error::{ApiError, Place};
use crate::kind::Kind;

/// A route of the API, as its spec declares it.
#[derive(Debug, Default)]
pub struct Route {
    /// Its template as the spec writes it (`/v1/kv/{key}`; the router writes `{*key}`).
    pub template: String,
    /// The resource kind it serves, if any.
    pub kind: Option<Kind>,
    /// Whether it opens a socket or an event stream, whose answer lasts as long as it is open.
    pub long_lived: bool,
    /// Its operations, by method.
    operations: Vec<(Method, Operation)>,
}

/// One operation (a method on a route), as the spec declares it.
#[derive(Debug)]
pub struct Operation {
    /// Whose memory it needs ([super::handoff], [SERVED_BY]), when it declares it.
    pub served_by: Option<ServedBy>,
    /// Whether it takes a `wait` query parameter: a long poll (an acquire without `wait`
    /// waits the longest, so the operation counts, not the parameter being sent).
    pub waits: bool,
    /// Whether it waits for a turn among the requests in service ([takes_a_turn]).
    pub takes_a_turn: bool,
}

impl Route {
    /// The route with `template`, as the router or the spec writes it.
    pub fn named(template: &str) -> Option<&'static Route> {
        let routes = ROUTES.get_or_init(|| routes_of(&crate::routes().into_openapi()));
        match template.contains("{*") {
            // The router writes a catch-all segment `{*key}`, the spec `{key}`.
            true => routes.get(&template.replace("{*", "{")),
            false => routes.get(template),
        }
    }

    /// Its operation for `method`.
    pub fn operation(&self, method: &Method) -> Option<&Operation> {
        self.operations.iter().find(|(m, _)| m == method).map(|(_, o)| o)
    }

    /// The methods it takes, as the spec lists them.
    pub fn methods(&self) -> impl Iterator<Item = &Method> {
        self.operations.iter().map(|(method, _)| method)
    }
}

static ROUTES: OnceLock<HashMap<String, Route>> = OnceLock::new();

/// Every route of `spec`, by template.
pub fn routes_of(spec: &utoipa::openapi::OpenApi) -> HashMap<String, Route> {
    let mut routes: HashMap<String, Route> = HashMap::new();
    for (method, path, operation) in crate::spec::operations(spec) {
        let route = routes.entry(path.clone()).or_insert_with(|| Route {
            template: path.clone(),
            kind: kind_of(path),
            long_lived: is_long_lived(path),
            operations: Vec::new(),
        });
        let served_by = declaration(operation).and_then(Result::ok);
        let operation = Operation {
            served_by,
            waits: takes_wait(operation),
            takes_a_turn: takes_a_turn(&method, path),
        };
        route.operations.push((method, operation));
    }
    routes
}

/// The OpenAPI extension by which an operation declares which instance serves it.
pub const SERVED_BY: &str = "x-zkgate-served-by";

/// Whose memory an operation needs ([super::handoff]'s documentation).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ServedBy {
    /// The keeper of the lease named there.
    Keeper(Named),
    /// The instance the request arrives at, for the lease named there (kept or visited).
    Any(Named),
}

/// Where a request names the lease it acts for.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Named {
    /// A path parameter.
    Path(String),
    /// The JSON body: its `lease`.
    Body,
}

/// What `operation` declares (or why that does not parse); `None` when it declares nothing.
pub fn declaration(operation: &utoipa::openapi::path::Operation) -> Option<Result<ServedBy, String>> {
    let value = operation.extensions.as_ref()?.get(SERVED_BY)?;
    Some(serde_json::from_value::<ServedBy>(value.clone()).map_err(|e| e.to_string()))
}

/// Whether `method` on `route` waits for a turn among the requests in service
/// ([crate::admission]): every operation but the sockets and event streams (which have limits
/// of their own and would hold a turn for as long as they are open) and the writes that give
/// something back (deletes, keepalives, acks, nacks, leaving), which are never refused for
/// load: refusing them would keep locks and claims held longer, and end leases.
pub fn takes_a_turn(method: &Method, route: &str) -> bool {
    let gives_back = *method == Method::DELETE
        || (*method == Method::POST
            && ["/keepalive", "/ack", "/nack", "/leave"]
                .iter()
                .any(|end| route.ends_with(end)));
    !is_long_lived(route) && !gives_back
}

/// Whether `operation` takes a `wait` query parameter (and so counts as a long poll).
pub fn takes_wait(operation: &utoipa::openapi::path::Operation) -> bool {
    operation
        .parameters
        .iter()
        .flatten()
        .any(|p| matches!(p, RefOr::T(p) if p.name == "wait" && p.parameter_in == ParameterIn::Query))
}

/// The kind a route template serves: its segment after `/v1/`.
fn kind_of(template: &str) -> Option<Kind> {
    template
        .strip_prefix("/v1/")
        .and_then(|rest| rest.split('/').next())
        .and_then(Kind::from_segment)
}

/// A routed request's route and operation, and its path parameters.
pub struct Routed {
    pub route: &'static Route,
    pub operation: Option<&'static Operation>,
    params: Vec<(String, String)>,
}

/// What a request the spec does not know is routed to (none of the guarded routes: they
/// and the spec are made from the same handlers): no kind, nothing declared.
static UNDECLARED: Route = Route {
    template: String::new(),
    kind: None,
    long_lived: false,
    operations: Vec::new(),
};

impl Routed {
    /// The route of `parts`. A path parameter that is not UTF-8 once decoded is refused here as
    /// the handlers' extractors would refuse it.
    pub async fn of(parts: &mut Parts) -> Result<Routed, ApiError> {
        let route = parts
            .extensions
            .get::<MatchedPath>()
            .and_then(|matched| Route::named(matched.as_str()))
            .unwrap_or(&UNDECLARED);
        let params = RawPathParams::from_request_parts(parts, &())
            .await
            .map_err(|rejection| ApiError::invalid(Place::Path, "path", rejection.body_text()))?;
        Ok(Routed {
            route,
            operation: route.operation(&parts.method),
            params: params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        })
    }

    /// A route as the router would have matched it (for tests).
    #[cfg(test)]
    pub fn new(template: &str, method: &Method, params: &[(&str, &str)]) -> Routed {
        let route = Route::named(template).unwrap_or_else(|| panic!("no route {template}"));
        Routed {
            route,
            operation: route.operation(method),
            params: params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    /// The parameter `name`, if the route has it.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The resource a kind's route names: its first parameter (`name`, `group`, `id`, `key`).
    pub fn resource(&self) -> Option<&str> {
        self.route.kind.and(self.params.first().map(|(_, v)| v.as_str()))
    }

    /// Whether the operation may wait (a long poll).
    pub fn waits(&self) -> bool {
        self.operation.is_some_and(|o| o.waits)
    }
}

/// Whether `path` (as requested, percent-encoded) is an event stream's: its Host and Origin are
/// checked like a socket's.
pub fn is_stream(path: &str) -> bool {
    if path == "/v1/events" {
        return true;
    }
    let Some(rest) = path.strip_prefix("/v1/") else {
        return false;
    };
    let mut segments = rest.split('/');
    match (segments.next(), segments.next(), segments.next(), segments.next()) {
        (Some(segment), Some(_), Some("events"), None) => {
            Kind::from_segment(segment).is_some_and(|k| k.topic().is_some())
        }
        _ => false,
    }
}

/// Whether `route` opens a socket or an event stream, whose answer lasts as long as it is open.
pub fn is_long_lived(route: &str) -> bool {
    route == "/v1/ws" || route.ends_with("/observe") || is_stream(route)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_told_apart_from_other_reads() {
        assert!(is_stream("/v1/events"));
        assert!(is_stream("/v1/locks/orders/events"));
        assert!(is_stream("/v1/double-barriers/b%2F1/events"));
        assert!(!is_stream("/v1/kv/app/events"));
        assert!(!is_stream("/v1/locks/orders"));
        assert!(!is_stream("/v1/locks/orders/events/x"));
        assert!(!is_stream("/v1/nothing/orders/events"));
    }

    #[test]
    fn routes_are_found_as_the_router_writes_them() {
        let kv = Route::named("/v1/kv/{*key}").expect("the kv route");
        assert_eq!(kv.template, "/v1/kv/{key}");
        assert_eq!(kv.kind, Some(Kind::Kv));
        assert!(kv.operation(&Method::GET).is_some_and(|o| o.waits && o.takes_a_turn));
        assert!(kv.operation(&Method::DELETE).is_some_and(|o| !o.takes_a_turn));
        let socket = Route::named("/v1/ws").expect("the socket's route");
        assert!(socket.long_lived && socket.kind.is_none());
        assert!(Route::named("/v1/nothing").is_none());
    }

    #[test]
    fn every_operation_but_streams_and_give_backs_takes_a_turn() {
        for (method, route) in [
            (Method::POST, "/v1/locks/{name}/acquire"),
            (Method::POST, "/v1/leases"),
            (Method::GET, "/v1/kv/{key}"),
            (Method::PUT, "/v1/kv/{key}"),
            (Method::POST, "/v1/queues/{name}/take"),
            (Method::POST, "/v1/queues/{name}/items"),
        ] {
            assert!(takes_a_turn(&method, route), "{method} {route}");
        }
        for (method, route) in [
            (Method::DELETE, "/v1/locks/{name}/handles/{handle}"),
            (Method::DELETE, "/v1/leases/{id}"),
            (Method::POST, "/v1/leases/{id}/keepalive"),
            (Method::POST, "/v1/queues/{name}/claims/{claim}/ack"),
            (Method::POST, "/v1/queues/{name}/claims/{claim}/nack"),
            (Method::GET, "/v1/ws"),
            (Method::GET, "/v1/events"),
            (Method::GET, "/v1/locks/{name}/events"),
            (Method::GET, "/v1/elections/{name}/observe"),
        ] {
            assert!(!takes_a_turn(&method, route), "{method} {route}");
        }
    }

    #[test]
    fn the_long_polls_are_the_endpoints_that_take_wait() {
        let routes = routes_of(&crate::http::routes().into_openapi());
        let waits = |method: Method, path: &str| routes[path].operation(&method).expect(path).waits;
        for (method, path) in [
            (Method::POST, "/v1/locks/{name}/acquire"),
            (Method::GET, "/v1/kv/{key}"),
            (Method::POST, "/v1/queues/{name}/take"),
            (Method::GET, "/v1/barriers/{name}/wait"),
        ] {
            assert!(waits(method.clone(), path), "{method} {path}");
        }
        assert!(!waits(Method::POST, "/v1/leases"));
        assert!(!waits(Method::PUT, "/v1/kv/{key}"));
    }
}
