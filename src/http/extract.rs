//! Request extractors whose every rejection is a problem document naming what was wrong.
//!
//! axum's own extractors answer bad input with plain-text bodies; these wrap them so that a
//! client always gets `application/problem+json` with the field, parameter or header at fault.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::{ApiError, Place};

/// A JSON object body. An empty body (or JSON's `null`, as the spec allows for an optional one)
/// is an error unless `T` is an `Option` (then it is `None`), so `curl -X POST` without `-d`
/// works for endpoints whose body is optional.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(body_rejection)?;
        let text: &[u8] = match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
            None => b"null",
            Some(b'{') => &bytes,
            Some(b'n') if bytes.trim_ascii() == b"null" => b"null",
            Some(_) => return Err(ApiError::malformed_body("the body must be a JSON object")),
        };
        let mut deserializer = serde_json::Deserializer::from_slice(text);
        let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
            let path = err.path().to_string();
            let inner = err.into_inner();
            if inner.is_syntax() || inner.is_eof() {
                ApiError::malformed_body(format!("the body is not valid JSON: {inner}"))
            } else if path == "." {
                ApiError::malformed_body(format!("body: {}", strip_position(&inner.to_string())))
            } else {
                ApiError::invalid(Place::Body, &path, strip_position(&inner.to_string()))
            }
        })?;
        deserializer
            .end()
            .map_err(|err| ApiError::malformed_body(format!("trailing data after the JSON value: {err}")))?;
        Ok(ApiJson(value))
    }
}

/// A body that could not be read: 413 when over the limit.
pub fn body_rejection(rejection: BytesRejection) -> ApiError {
    if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::too_large(crate::listen::BODY_LIMIT_BYTES)
    } else {
        ApiError::malformed_body(rejection.body_text())
    }
}

/// serde_json ends messages with " at line 1 column 12", which says nothing to a client that
/// is told the field name.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message.to_string(),
    }
}

/// Query parameters; unknown ones are refused (`deny_unknown_fields` on `T`) so that a typo
/// such as `?wiat=5s` is an error instead of a silent default. A read's `consistency` is
/// [super::consistency::Consistency]'s, not `T`'s: it is left to that extractor on a `GET`.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        let read = parts.method == axum::http::Method::GET;
        let query = if read && form_urlencoded_parse(query).any(|(name, _)| name == super::consistency::PARAMETER) {
            let mut rest = form_urlencoded::Serializer::new(String::new());
            rest.extend_pairs(form_urlencoded_parse(query).filter(|(name, _)| name != super::consistency::PARAMETER));
            std::borrow::Cow::Owned(rest.finish())
        } else {
            std::borrow::Cow::Borrowed(query)
        };
        let deserializer = serde_urlencoded::Deserializer::new(form_urlencoded_parse(&query));
        serde_path_to_error::deserialize(deserializer)
            .map(ApiQuery)
            .map_err(|err| {
                let path = err.path().to_string();
                let detail = err.into_inner().to_string();
                let field = if path == "." {
                    detail.split('`').nth(1).unwrap_or("?").to_string()
                } else {
                    path
                };
                ApiError::invalid(Place::Query, &field, detail)
            })
    }
}

fn form_urlencoded_parse(query: &str) -> form_urlencoded::Parse<'_> {
    form_urlencoded::parse(query.as_bytes())
}

/// Path parameters.
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| ApiPath(p.0))
            .map_err(|rejection: PathRejection| ApiError::invalid(Place::Path, "path", rejection.body_text()))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_count_may_be_written_as_a_whole_float_and_nothing_else() {
        #[derive(serde::Deserialize, Debug)]
        struct Count {
            #[serde(deserialize_with = "crate::recipes::barriers::whole_u32")]
            size: u32,
        }
        let read = |text: &str| serde_json::from_str::<Count>(text).map(|c| c.size);
        assert_eq!(read(r#"{"size": 5}"#).unwrap(), 5);
        assert_eq!(read(r#"{"size": 5.0}"#).unwrap(), 5);
        for refused in ["2.5", "-1", "4294967296", "\"5\"", "1e10"] {
            assert!(read(&format!(r#"{{"size": {refused}}}"#)).is_err(), "{refused}");
        }
    }
}
