//! The bounds of a request's head, checked first on every request ([request_head]); and the
//! limits of [crate::limits] on the API routes, after authorisation so that the caller is
//! known ([limit]): the write rate, and the long polls in flight (either answers 429 with
//! `Retry-After`); then the request's turn ([crate::admission]: 503 `overloaded` with
//! `Retry-After` when it waited too long for one).

use std::convert::Infallible;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use tower::{Service, ServiceExt};

use super::error::{ApiError, Problem};
use super::routed::Routed;
use crate::AppState;
use crate::auth::Caller;
use crate::limits::ClientAddr;
use crate::listen::Arrived;
use crate::metrics::Stage;

/// Longest request URI (path and query) the app reads: a name, a key or a query is bounded
/// far below this, and hyper refuses more than 64 KiB before the app sees it.
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// Most header fields in a request: hyper's own bound, which it keeps without allocating
/// (set to anything else, hyper allocates and fills room for that many on every request
/// head); a head with more is refused before the app sees it ([early_answer]).
pub const MAX_HEADERS: usize = 100;

/// Most bytes of header fields (names and values) in a request.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// The first check of every request: one whose URI or head is over the bounds above is
/// refused (414 `uri-too-long`, 431 `headers-too-large`) before anything else reads it.
pub fn request_head(request: &Request) -> Result<(), ApiError> {
    let uri = request.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if uri > MAX_URI_BYTES {
        let detail = format!("the request's URI is {uri} bytes, over the bound of {MAX_URI_BYTES}");
        return Err(ApiError::new(Problem::UriTooLong, detail).with("limit_bytes", MAX_URI_BYTES));
    }
    let headers = request.headers();
    let bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if bytes > MAX_HEADER_BYTES {
        let detail = format!("the request's header fields take {bytes} bytes, over the bound of {MAX_HEADER_BYTES}");
        return Err(ApiError::new(Problem::HeadersTooLarge, detail).with("limit", "bytes"));
    }
    Ok(())
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
            format!("the request has more than {MAX_HEADERS} header fields, or its head is over the server's buffer"),
        )
        .with("limit", "head"),
        _ => return None,
    };
    Some(error.body().to_string().into_bytes())
}

/// The last guard before the handler (`serve`): [crate::limits::Limits::check_rate] for the
/// request's caller and address, and for an operation that may wait, one of the caller's and
/// the instance's long polls, held until the response is ready; then the request's turn.
pub async fn limit<S>(state: &AppState, routed: &Routed, request: Request, serve: S) -> Response
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    let address = request.extensions().get::<ClientAddr>().copied();
    let caller = request.extensions().get::<Caller>().unwrap_or(&Caller::Anyone);
    if let Err(refusal) = state.limits.check_rate(caller, request.method(), address) {
        return ApiError::from(refusal).into_response();
    }
    let _long_poll = match routed.waits() {
        true => match state.limits.long_poll(caller, address) {
            Ok(permits) => Some(permits),
            Err(refusal) => return ApiError::from(refusal).into_response(),
        },
        false => None,
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
    if !routed.operation.is_some_and(|operation| operation.takes_a_turn) {
        let Ok(response) = serve.oneshot(request).await;
        return match routed.route.long_lived {
            // An event stream's or a socket's "answer" lasts as long as it is open.
            true => response,
            false => timed(response, false),
        };
    }
    match state.admission.admit(arrived).await {
        Ok(slot) => {
            metrics.observe_stage(Stage::Admitted, true, arrived.elapsed());
            let Ok(response) = crate::admission::holding(slot, serve.oneshot(request)).await;
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
