//! The JSON answer every handler gives: axum's `Json` answer, serialized into a buffer sized
//! for a typical answer. axum's writes through `BytesMut`'s `io::Write`, one small write per
//! key, quote and comma, from 128 bytes that most answers outgrow; a `Vec` takes the same
//! writes as plain copies (BENCHMARKS.md, "The HTTP edge against bare axum").

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// A JSON answer (`application/json`).
pub struct Json<T>(pub T);

/// Room for most answers (a handle, a lease, a key's value and metadata) without growing.
const TYPICAL_BYTES: usize = 512;

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        let mut body = Vec::with_capacity(TYPICAL_BYTES);
        match serde_json::to_writer(&mut body, &self.0) {
            Ok(()) => (
                [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
                body,
            )
                .into_response(),
            // Only a `Serialize` that fails by itself (a map with keys that are not strings):
            // a bug, answered as axum answers it.
            Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response(),
        }
    }
}

impl<T> std::ops::Deref for Json<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}
