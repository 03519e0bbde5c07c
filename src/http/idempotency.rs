//! `Idempotency-Key`: how every operation that takes one reads it ([Idempotent]), what the spec
//! says of it ([document]), and how a replayed answer says so ([replayed]). The keys are kept by
//! [crate::recipes::idempotency]: per principal, charged to it, the same answer through any
//! instance.
//!
//! A retry must repeat its request: the same method, path, query, `Content-Type` and body, byte
//! for byte. Their digest is the request's fingerprint, kept with the key; the same key with
//! another fingerprint is refused (422 `idempotency-key-reused`), whatever the operation.

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use utoipa::openapi::path::Operation;

use super::error::{ApiError, Place, Problem};
use crate::auth::Caller;
use crate::recipes::idempotency::{Key, MAX_KEY_BYTES};

/// The request header.
pub const HEADER: &str = "idempotency-key";

/// The response header that marks an answer given before, from the key's record.
pub const REPLAYED: &str = "idempotent-replayed";

/// The header's description, on every operation that takes it.
pub const ABOUT: &str = "Makes the request safe to retry: with the same key (1 to 255 visible ASCII characters), a \
     retry that repeats the request (method, path, query, `Content-Type`, body) is applied once and answered as the \
     first was (`Idempotent-Replayed: true`), through any instance; the same key with another request is refused \
     (422). Keys are the principal's own, kept for `--idempotency-window` (24 h) or the principal's last \
     `--idempotency-keys` (10,000) keyed writes.";

/// A request's idempotency key (`None` without the header) and what the handler extracts from
/// the rest of it (`T`: its body).
pub struct Idempotent<T> {
    pub key: Option<Key>,
    pub inner: T,
}

impl<S: Send + Sync, T: FromRequest<S>> FromRequest<S> for Idempotent<T> {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Response> {
        let Some(value) = request.headers().get(HEADER) else {
            let inner = T::from_request(request, state)
                .await
                .map_err(IntoResponse::into_response)?;
            return Ok(Idempotent { key: None, inner });
        };
        let key = key_of(value).map_err(IntoResponse::into_response)?.to_string();
        let (parts, body) = request.into_parts();
        // The body whole (within the body limit), for the fingerprint; then handed on.
        let bytes = Bytes::from_request(Request::from_parts(parts.clone(), body), state)
            .await
            .map_err(|rejection| super::extract::body_rejection(rejection).into_response())?;
        let principal = parts.extensions.get::<Caller>().and_then(Caller::name);
        let content_type = parts.headers.get(header::CONTENT_TYPE).map(HeaderValue::as_bytes);
        let request = fingerprint(&parts.method, parts.uri.path(), parts.uri.query(), content_type, &bytes);
        let key = Key::new(principal, &key, request);
        let inner = T::from_request(Request::from_parts(parts, Body::from(bytes)), state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Idempotent { key: Some(key), inner })
    }
}

/// The header's value, if it is a key: 1 to [MAX_KEY_BYTES] visible ASCII characters.
fn key_of(value: &HeaderValue) -> Result<&str, ApiError> {
    let invalid = |detail: String| ApiError::invalid(Place::Header, "Idempotency-Key", detail);
    let key = value
        .to_str()
        .ok()
        .filter(|key| key.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| invalid("must be visible ASCII (no spaces or control characters)".into()))?;
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(invalid(format!(
            "must be 1 to {MAX_KEY_BYTES} characters ({} given)",
            key.len()
        )));
    }
    Ok(key)
}

/// A request's fingerprint: a digest of its method, path, query, `Content-Type` and body, each
/// with its length (so that no two requests run together into the same bytes).
fn fingerprint(method: &Method, path: &str, query: Option<&str>, content_type: Option<&[u8]>, body: &[u8]) -> String {
    use sha2::Digest;
    let mut digest = sha2::Sha256::new();
    let parts: [&[u8]; 5] = [
        method.as_str().as_bytes(),
        path.as_bytes(),
        query.unwrap_or_default().as_bytes(),
        content_type.unwrap_or_default(),
        body,
    ];
    for part in parts {
        digest.update((part.len() as u64).to_be_bytes());
        digest.update(part);
    }
    crate::ids::hex(&digest.finalize())
}

/// `response`, marked as an answer given before (`Idempotent-Replayed: true`) when `replayed`.
pub fn replayed(mut response: Response, replayed: bool) -> Response {
    if replayed {
        response
            .headers_mut()
            .insert(REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

/// Whether `operation` takes an `Idempotency-Key`.
pub fn takes_key(operation: &Operation) -> bool {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::path::ParameterIn;
    (operation.parameters.iter().flatten()).any(|p| match p {
        RefOr::T(p) => p.parameter_in == ParameterIn::Header && p.name.eq_ignore_ascii_case(HEADER),
        RefOr::Ref(_) => false,
    })
}

/// In the spec, on every operation that takes an `Idempotency-Key`: its refusal of a reused key
/// (422), and the header that marks a replayed answer on its successes.
pub fn document(spec: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::header::HeaderBuilder;
    for (_, _, operation) in crate::spec::operations_mut(spec) {
        if !takes_key(operation) {
            continue;
        }
        super::error::declare(operation, vec![Problem::IdempotencyKeyReused]);
        for (status, response) in operation.responses.responses.iter_mut() {
            if let (true, RefOr::T(response)) = (status.starts_with('2'), response) {
                let marked = HeaderBuilder::new()
                    .schema(Some(
                        utoipa::openapi::ObjectBuilder::new()
                            .schema_type(utoipa::openapi::schema::Type::String)
                            .enum_values(Some(["true"])),
                    ))
                    .description(Some(
                        "`true` on an answer given before to a request with the same `Idempotency-Key`",
                    ))
                    .build();
                response
                    .headers
                    .insert("Idempotent-Replayed".to_string(), RefOr::T(marked));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_tells_every_part_apart() {
        let post = Method::POST;
        let base = fingerprint(&post, "/v1/counters/a/add", None, Some(b"application/json"), b"{}");
        let others = [
            fingerprint(
                &Method::PUT,
                "/v1/counters/a/add",
                None,
                Some(b"application/json"),
                b"{}",
            ),
            fingerprint(&post, "/v1/counters/b/add", None, Some(b"application/json"), b"{}"),
            fingerprint(
                &post,
                "/v1/counters/a/add",
                Some("x=1"),
                Some(b"application/json"),
                b"{}",
            ),
            fingerprint(&post, "/v1/counters/a/add", None, Some(b"text/plain"), b"{}"),
            fingerprint(&post, "/v1/counters/a/add", None, Some(b"application/json"), b"{ }"),
            // The same bytes, cut elsewhere.
            fingerprint(&post, "/v1/counters/a/ad", None, Some(b"dapplication/json"), b"{}"),
        ];
        for other in others {
            assert_ne!(base, other);
        }
        assert_eq!(
            base,
            fingerprint(&post, "/v1/counters/a/add", None, Some(b"application/json"), b"{}")
        );
    }

    #[test]
    fn a_key_is_visible_ascii_of_bounded_length() {
        let value = |text: &str| HeaderValue::from_str(text).expect("header");
        assert_eq!(key_of(&value("order-17/retry")).ok(), Some("order-17/retry"));
        assert!(key_of(&value(&"k".repeat(MAX_KEY_BYTES))).is_ok());
        assert!(key_of(&value(&"k".repeat(MAX_KEY_BYTES + 1))).is_err());
        assert!(key_of(&value("two words")).is_err());
        assert!(key_of(&value("")).is_err());
        assert!(key_of(&HeaderValue::from_bytes(b"caf\xc3\xa9").expect("header")).is_err());
    }
}
