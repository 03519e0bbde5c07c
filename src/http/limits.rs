//! The limits of [crate::limits] as a layer on the API routes, inside authorisation so that
//! the caller is known: the write rate, and the long polls in flight. Either answers 429 with
//! `Retry-After`.

use std::collections::HashSet;
use std::sync::OnceLock;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::RefOr;
use utoipa::openapi::path::{HttpMethod, Operation, ParameterIn};

use super::error::ApiError;
use crate::AppState;
use crate::auth::Caller;
use crate::limits::ClientAddr;

/// The layer: [crate::limits::Limits::check_rate] for the request's caller and address, and
/// for a request to an endpoint that may wait, one of the caller's and the instance's long
/// polls, held until the response is ready.
pub async fn limit(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let address = request.extensions().get::<ClientAddr>().copied();
    let caller = request.extensions().get::<Caller>().cloned().unwrap_or(Caller::Anyone);
    if let Err(refusal) = state.limits.check_rate(&caller, request.method(), address) {
        return ApiError::from(refusal).into_response();
    }
    let route = request.extensions().get::<MatchedPath>().map(MatchedPath::as_str);
    let _long_poll = match route.filter(|route| waits(request.method(), route)) {
        Some(_) => match state.limits.long_poll(&caller, address) {
            Ok(permits) => Some(permits),
            Err(refusal) => return ApiError::from(refusal).into_response(),
        },
        None => None,
    };
    next.run(request).await
}

/// Whether `method` on `route` may wait: the endpoints that take a `wait` query parameter,
/// read once from the API's own spec, so that a new long poll is counted without a list to
/// keep in step. (An acquire without `wait` waits the longest, so the endpoint counts, not the
/// parameter being there.)
fn waits(method: &Method, route: &str) -> bool {
    static WAITING: OnceLock<HashSet<(Method, String)>> = OnceLock::new();
    WAITING
        .get_or_init(|| waiting_routes(&super::routes().into_openapi()))
        // The router writes a catch-all segment `{*key}`, the spec `{key}`.
        .contains(&(method.clone(), route.replace("{*", "{")))
}

/// The (method, path) of every operation of `spec` with a `wait` query parameter.
fn waiting_routes(spec: &utoipa::openapi::OpenApi) -> HashSet<(Method, String)> {
    let methods = [
        (HttpMethod::Get, Method::GET),
        (HttpMethod::Post, Method::POST),
        (HttpMethod::Put, Method::PUT),
        (HttpMethod::Delete, Method::DELETE),
        (HttpMethod::Patch, Method::PATCH),
    ];
    let mut waiting = HashSet::new();
    for (path, item) in &spec.paths.paths {
        let operations = [&item.get, &item.post, &item.put, &item.delete, &item.patch];
        for (operation, (_, method)) in operations.into_iter().zip(&methods) {
            if operation.as_ref().is_some_and(takes_wait) {
                waiting.insert((method.clone(), path.clone()));
            }
        }
    }
    waiting
}

/// Whether `operation` takes a `wait` query parameter (and so counts as a long poll).
pub fn takes_wait(operation: &Operation) -> bool {
    operation
        .parameters
        .iter()
        .flatten()
        .any(|p| matches!(p, RefOr::T(p) if p.name == "wait" && p.parameter_in == ParameterIn::Query))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_long_polls_are_the_endpoints_that_take_wait() {
        let waiting = waiting_routes(&crate::http::routes().into_openapi());
        for (method, path) in [
            (Method::POST, "/v1/locks/{name}/acquire"),
            (Method::GET, "/v1/kv/{key}"),
            (Method::POST, "/v1/queues/{name}/take"),
            (Method::GET, "/v1/barriers/{name}/wait"),
        ] {
            assert!(waiting.contains(&(method.clone(), path.to_string())), "{method} {path}");
        }
        assert!(!waiting.contains(&(Method::POST, "/v1/leases".to_string())));
        assert!(!waiting.contains(&(Method::PUT, "/v1/kv/{key}".to_string())));
    }
}
