//! The limits of [crate::limits] as a layer on the API routes, inside authorisation so that
//! the caller is known: the write rate, and the long polls in flight (either answers 429 with
//! `Retry-After`); then the request's turn ([crate::admission]: 503 `overloaded` with
//! `Retry-After` when it waited too long for one).

use std::collections::HashSet;
use std::sync::OnceLock;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::RefOr;
use utoipa::openapi::path::{Operation, ParameterIn};

use super::error::{ApiError, Problem};
use crate::AppState;
use crate::auth::Caller;
use crate::limits::ClientAddr;
use crate::listen::Arrived;
use crate::metrics::Stage;

/// Longest request URI (path and query) the app reads: a name, a key or a query is bounded
/// far below this, and hyper refuses more than 64 KiB before the app sees it.
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// Most header fields in a request (hyper reads up to [crate::listen::HYPER_MAX_HEADERS]).
pub const MAX_HEADERS: usize = 100;

/// Most bytes of header fields (names and values) in a request.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// The outermost layer: a request whose URI or head is over the bounds above is refused
/// (414 `uri-too-long`, 431 `headers-too-large`) before anything else reads it.
pub async fn request_head(request: Request, next: Next) -> Response {
    let uri = request.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if uri > MAX_URI_BYTES {
        let detail = format!("the request's URI is {uri} bytes, over the bound of {MAX_URI_BYTES}");
        return ApiError::new(Problem::UriTooLong, detail)
            .with("limit_bytes", MAX_URI_BYTES)
            .into_response();
    }
    let headers = request.headers();
    if headers.len() > MAX_HEADERS {
        let detail = format!(
            "the request has {} header fields, over the bound of {MAX_HEADERS}",
            headers.len()
        );
        return ApiError::new(Problem::HeadersTooLarge, detail)
            .with("limit", "count")
            .into_response();
    }
    let bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if bytes > MAX_HEADER_BYTES {
        let detail = format!("the request's header fields take {bytes} bytes, over the bound of {MAX_HEADER_BYTES}");
        return ApiError::new(Problem::HeadersTooLarge, detail)
            .with("limit", "bytes")
            .into_response();
    }
    next.run(request).await
}

/// The problem document that answers hyper's own refusal of a request before routing (see
/// [crate::listen::EarlyAnswer]): a head it could not parse, a URI or a head over its bounds,
/// which are above the app's own ([request_head]).
pub fn early_answer(status: u16) -> Option<Vec<u8>> {
    let error = match status {
        400 => ApiError::new(
            Problem::MalformedRequest,
            "the request's head could not be parsed as HTTP/1.1",
        ),
        414 => ApiError::new(
            Problem::UriTooLong,
            "the request's URI is over 64 KiB, and the server's bound is lower still",
        )
        .with("limit_bytes", MAX_URI_BYTES),
        431 => ApiError::new(
            Problem::HeadersTooLarge,
            "the request's head is over the server's buffer, or has more header fields than it reads",
        )
        .with("limit", "head"),
        _ => return None,
    };
    Some(error.body().to_string().into_bytes())
}

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
    let arrived = request
        .extensions()
        .get::<Arrived>()
        .map_or_else(tokio::time::Instant::now, |a| a.0);
    let metrics = crate::metrics::get();
    let timed = |response: Response, turn: bool| {
        metrics.observe_stage(Stage::Answered, turn, arrived.elapsed());
        response.map(|body| axum::body::Body::new(Written { body, arrived, turn }))
    };
    if !route.is_some_and(|route| takes_a_turn(request.method(), route)) {
        let streams = route.is_some_and(super::routed::is_long_lived);
        let response = next.run(request).await;
        return match streams {
            // An event stream's or a socket's "answer" lasts as long as it is open.
            true => response,
            false => timed(response, false),
        };
    }
    match state.admission.admit(arrived).await {
        Ok(slot) => {
            metrics.observe_stage(Stage::Admitted, true, arrived.elapsed());
            let response = crate::admission::holding(slot, next.run(request)).await;
            timed(response, true)
        }
        Err(shed) => {
            metrics.requests_shed.inc();
            ApiError::new(
                Problem::Overloaded,
                format!(
                    "waited {} ms for a turn, more than the {} ms allowed while requests queue here; \
                     refused instead of served late",
                    shed.waited.as_millis(),
                    shed.allowed.as_millis()
                ),
            )
            .into_response()
        }
    }
}

/// A response's body, which records when it was written (`written` in
/// `zkgate_request_stage_seconds`): hyper drops it once its last byte is handed to the
/// connection.
struct Written {
    body: axum::body::Body,
    arrived: tokio::time::Instant,
    turn: bool,
}

impl hyper::body::Body for Written {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, axum::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Written {
    fn drop(&mut self) {
        crate::metrics::get().observe_stage(Stage::Written, self.turn, self.arrived.elapsed());
    }
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
    !super::routed::is_long_lived(route) && !gives_back
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
    crate::spec::operations(spec)
        .filter(|(_, _, operation)| takes_wait(operation))
        .map(|(method, path, _)| (method, path.clone()))
        .collect()
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
