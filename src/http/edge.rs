//! The HTTP edge: what every request passes on its way to a handler, as two services of
//! zkgate's own around axum's router.
//!
//! - [Edge], around the whole app, before routing: the request's head within its bounds
//!   ([limits::request_head]), the Host and Origin of a request a foreign page could make a
//!   browser send ([origin::check]), and the caller, from its token or from another instance's
//!   signed assertion ([auth::authenticated], [auth::forwarded]). A 5xx answer is logged, and
//!   at `debug` each request has a span.
//! - [Guard], on every API route, after routing (so it reads the route the router matched and
//!   what the spec declares of it, [Routed]): the hand-off to the keeper of the lease the
//!   request names ([handoff::serve_here]), the caller's grants ([auth::authorize]), and the
//!   write rate, the long polls and the request's turn ([limits::limit]), in that order.
//!
//! Why services of its own rather than a chain of `from_fn` middleware and tower-http's
//! layers: each `from_fn` boxes the service after it and clones that box for every request,
//! and a layer on a router is applied to each of its routes, so that every request cloned
//! five boxed stacks before its handler ran. BENCHMARKS.md ("The HTTP edge against bare
//! axum") has the profile that showed it and what these two cost instead.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::extract::{DefaultBodyLimit, Request};
use axum::response::{IntoResponse, Response};
use tower::{Layer, Service, ServiceExt};
use tracing::Instrument;

use super::routed::Routed;
use super::{auth, handoff, limits, origin};
use crate::AppState;
use crate::listen::{App, Arrived};

/// The answer either service gives: boxed once, as axum's own routes box theirs.
type Answer = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

/// The service around the whole app (see the module's documentation).
#[derive(Clone)]
pub struct Edge<S> {
    inner: S,
    state: AppState,
}

impl<S> Edge<S> {
    pub fn new(state: AppState, inner: S) -> Edge<S> {
        Edge { inner, state }
    }
}

impl<S: App> Service<Request> for Edge<S> {
    type Response = Response;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Answer {
        // Disabled (the default level is `info`), a span costs one load of its call site's
        // interest: nothing is formatted.
        let span = tracing::debug_span!("request", method = %request.method(), uri = %request.uri());
        let arrived = request.extensions().get::<Arrived>().copied();
        let checked = limits::request_head(&request).and_then(|()| origin::check(&self.state, &request));
        if let Err(refusal) = checked {
            return Box::pin(std::future::ready(Ok(refusal.into_response())));
        }
        if auth::is_forwarded(&request) {
            // Its caller is in its signature, which covers its body: read first.
            let (state, inner) = (self.state.clone(), self.inner.clone());
            let answer = async move {
                match auth::forwarded(&state, request).await {
                    Ok(request) => inner.oneshot(request).await,
                    Err(refusal) => Ok(refusal.into_response()),
                }
            };
            return Box::pin(logged(answer, arrived).instrument(span));
        }
        if let Err(refusal) = auth::authenticated(&self.state, &mut request) {
            return Box::pin(std::future::ready(Ok(refusal.into_response())));
        }
        Box::pin(logged(self.inner.call(request), arrived).instrument(span))
    }
}

/// `answer`, with a server error logged (a client error is the client's to see, not the
/// operator's), and at `debug` every answer.
async fn logged(
    answer: impl Future<Output = Result<Response, Infallible>>,
    arrived: Option<Arrived>,
) -> Result<Response, Infallible> {
    let Ok(response) = answer.await;
    let status = response.status();
    let latency_ms = || arrived.map(|arrived| arrived.0.elapsed().as_millis());
    if status.is_server_error() {
        tracing::error!(%status, latency_ms = ?latency_ms(), "response failed");
    } else if tracing::enabled!(tracing::Level::DEBUG) {
        tracing::debug!(%status, latency_ms = ?latency_ms(), "answered");
    }
    Ok(response)
}

/// The layer that puts a [Guard] on each API route (with [axum::Router::route_layer], so that
/// unknown paths and methods get their problem without), and the body limit behind it (a
/// limit on the whole router would be one more layer on each route).
#[derive(Clone)]
pub struct Guarded(pub AppState);

impl<S> Layer<S> for Guarded {
    type Service = Guard<<DefaultBodyLimit as Layer<S>>::Service>;

    fn layer(&self, inner: S) -> Self::Service {
        Guard {
            inner: DefaultBodyLimit::max(crate::listen::BODY_LIMIT_BYTES).layer(inner),
            state: self.0.clone(),
        }
    }
}

/// The service on each API route (see the module's documentation).
#[derive(Clone)]
pub struct Guard<S> {
    inner: S,
    state: AppState,
}

impl<S: App> Service<Request> for Guard<S> {
    type Response = Response;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Answer {
        let (state, inner) = (self.state.clone(), self.inner.clone());
        Box::pin(async move { Ok(guarded(&state, inner, request).await) })
    }
}

/// The guards in order, then the route's handler (`serve`).
async fn guarded<S>(state: &AppState, serve: S, request: Request) -> Response
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    let (mut parts, body) = request.into_parts();
    let routed = match Routed::of(&mut parts).await {
        Ok(routed) => routed,
        Err(refusal) => return refusal.into_response(),
    };
    let request = Request::from_parts(parts, body);
    // Handed over first: the keeper authorises and counts a request it serves.
    let request = match handoff::serve_here(state, &routed, request).await {
        Ok(request) => request,
        Err(answer) => return answer,
    };
    if let Err(refusal) = auth::authorize(&routed, &request) {
        return refusal.into_response();
    }
    limits::limit(state, &routed, request, serve).await
}
