//! The write-rate limit of [crate::limits] as a layer on the API routes, inside authorisation
//! so that the caller is known: 429 with `Retry-After` when its bucket is empty.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use crate::AppState;
use crate::auth::Caller;
use crate::limits::ClientAddr;

/// The layer: [crate::limits::Limits::check_rate] for the request's caller and address.
pub async fn rate_limit(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let address = request.extensions().get::<ClientAddr>().copied();
    let caller = request.extensions().get::<Caller>().cloned().unwrap_or(Caller::Anyone);
    if let Err(refusal) = state.limits.check_rate(&caller, request.method(), address) {
        return ApiError::from(refusal).into_response();
    }
    next.run(request).await
}
