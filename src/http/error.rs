//! The one error type of the HTTP API, rendered as an RFC 9457 problem document
//! (`application/problem+json`).
//!
//! Every failure a client can cause or see has its own `type` (a `urn:zkgate:problem:<slug>`
//! URI, listed in the README), a status, a human `detail`, and where useful extension members
//! (`field` for bad input, `reason` for an ended lease, the queue position for a wait that
//! ended, ...). ZooKeeper being unreachable is a 503 with `Retry-After`, never a 500.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value, json};
use zookeeper_client::Error as ZkError;

use crate::lease::LeaseError;
use crate::zk::session::Unavailable;

/// The media type of problem documents.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem document, as documented in the OpenAPI description.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// Identifies the kind of problem.
    #[schema(example = "urn:zkgate:problem:invalid-field")]
    pub r#type: String,
    /// Short summary of the kind of problem.
    #[schema(example = "Invalid request field")]
    pub title: String,
    /// The HTTP status code.
    #[schema(example = 400)]
    pub status: u16,
    /// What went wrong in this case.
    #[schema(example = "path parameter `name`: must not contain `/`")]
    pub detail: String,
    /// For bad input: the field, parameter or header at fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// For bad input: where the field is (`body`, `query`, `path`, `header`).
    #[serde(rename = "in", skip_serializing_if = "Option::is_none")]
    #[schema(example = "path")]
    pub place: Option<String>,
}

/// Where in the request a bad field is.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Place {
    Body,
    Query,
    Path,
    Header,
}

/// Everything an HTTP handler can fail with.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    slug: &'static str,
    title: &'static str,
    detail: String,
    extra: Map<String, Value>,
    retry_after: Option<u64>,
    /// `WWW-Authenticate` of a 401.
    challenge: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, slug: &'static str, title: &'static str, detail: impl Into<String>) -> ApiError {
        ApiError {
            status,
            slug,
            title,
            detail: detail.into(),
            extra: Map::new(),
            retry_after: None,
            challenge: None,
        }
    }

    /// Adds an extension member to the problem document.
    pub fn with(mut self, key: &str, value: impl Serialize) -> ApiError {
        self.extra.insert(key.to_string(), json!(value));
        self
    }

    /// 400: `field` of the request's `place` (`body`, `query`, `path` or `header`) is invalid.
    pub fn invalid(place: Place, field: &str, detail: impl std::fmt::Display) -> ApiError {
        let description = match place {
            Place::Body => "body field",
            Place::Query => "query parameter",
            Place::Path => "path parameter",
            Place::Header => "header",
        };
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid-field",
            "Invalid request field",
            format!("{description} `{field}`: {detail}"),
        )
        .with("field", field)
        .with("in", place)
    }

    /// 400: the body is not valid JSON at all.
    pub fn malformed_body(detail: impl std::fmt::Display) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "malformed-body",
            "Malformed request body",
            detail.to_string(),
        )
    }

    /// 413: the body is larger than the configured limit.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "Request body too large",
            format!("the request body exceeds the limit of {limit} bytes"),
        )
        .with("limit_bytes", limit)
    }

    /// 404: no such thing (`what` is e.g. "lease", "handle").
    pub fn not_found(what: &str, detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not-found", "Not found", detail).with("resource", what)
    }

    /// 404 for an unknown route.
    pub fn no_route(path: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "no-such-endpoint",
            "No such endpoint",
            format!("no endpoint at `{path}`; see /docs"),
        )
    }

    /// 405 for a known route with another method.
    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "Method not allowed",
            "this endpoint does not support that method; see /docs",
        )
    }

    /// Any status with its own problem type.
    pub fn new_status(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> ApiError {
        ApiError::new(status, slug, title, detail)
    }

    /// 409: the request conflicts with what the resource (or lease) is in now.
    pub fn conflict(slug: &'static str, title: &'static str, detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, slug, title, detail)
    }

    /// 412: a conditional request's condition (`If-Match`, `If-None-Match`) did not hold.
    pub fn precondition_failed(detail: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "precondition-failed",
            "Precondition failed",
            detail,
        )
    }

    /// 409: a lock wait ended without the lock.
    pub fn not_acquired(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, "lock-not-acquired", "Lock not acquired", detail)
    }

    /// 410: the lease has ended (or the holding was lost with it).
    pub fn gone(slug: &'static str, title: &'static str, detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::GONE, slug, title, detail)
    }

    /// 503 with `Retry-After`: ZooKeeper cannot be reached right now.
    pub fn unavailable(detail: impl Into<String>) -> ApiError {
        let mut err = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "zookeeper-unavailable",
            "ZooKeeper unavailable",
            detail,
        );
        err.retry_after = Some(1);
        err
    }

    /// 401: no token, or not a valid one.
    pub fn unauthorized(detail: impl Into<String>) -> ApiError {
        let mut err = ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Authentication required",
            detail,
        );
        err.challenge = Some("Bearer realm=\"zkgate\"");
        err
    }

    /// 403: the principal may not do this.
    pub fn forbidden(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", "Not allowed", detail)
    }

    /// 429 with `Retry-After`: a limit was reached; trying again later may succeed.
    pub fn too_many(slug: &'static str, title: &'static str, detail: impl Into<String>, retry_after: u64) -> ApiError {
        let mut err = ApiError::new(StatusCode::TOO_MANY_REQUESTS, slug, title, detail);
        err.retry_after = Some(retry_after.max(1));
        err
    }

    /// 503 with `Retry-After`: the instance that owns a lease did not answer a forwarded
    /// request (it may be restarting; once its session ends, its leases are gone: 410).
    pub fn instance_unavailable(detail: impl Into<String>) -> ApiError {
        let mut err = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "instance-unavailable",
            "Owning instance unavailable",
            detail,
        );
        err.retry_after = Some(1);
        err
    }

    /// 500: a ZooKeeper answer zkgate did not expect.
    pub fn internal(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "Internal error", detail)
    }

    pub fn detail(&self) -> &str {
        &self.detail
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }
}

impl From<ZkError> for ApiError {
    fn from(err: ZkError) -> ApiError {
        match err {
            err if crate::zk::is_loss(&err) => ApiError::unavailable(format!("ZooKeeper did not answer: {err}")),
            ZkError::Timeout
            | ZkError::NoHosts
            | ZkError::SessionExpired
            | ZkError::ClientClosed
            | ZkError::Throttled => ApiError::unavailable(format!("ZooKeeper did not answer: {err}")),
            // zkgate's own session may not touch the znode: its ACL (set by a peer, or by an
            // instance with another digest) leaves zkgate out. Not the client's doing, and not
            // a bug in zkgate: say exactly that.
            ZkError::NoAuth => ApiError::new_status(
                axum::http::StatusCode::FORBIDDEN,
                "zookeeper-refused",
                "ZooKeeper refused",
                "ZooKeeper refuses zkgate's session access to this znode: its ACL leaves zkgate's identity out (see --zookeeper-auth)",
            ),
            err => ApiError::internal(format!("unexpected ZooKeeper error: {err}")),
        }
    }
}

impl From<crate::limits::Refusal> for ApiError {
    fn from(refusal: crate::limits::Refusal) -> ApiError {
        let seconds = refusal.retry_after.as_secs_f64().ceil() as u64;
        ApiError::too_many(refusal.slug, "Limit reached", refusal.detail, seconds)
    }
}

impl From<crate::auth::Forbidden> for ApiError {
    fn from(err: crate::auth::Forbidden) -> ApiError {
        ApiError::forbidden(err.0)
    }
}

impl From<Unavailable> for ApiError {
    fn from(err: Unavailable) -> ApiError {
        ApiError::unavailable(err.to_string())
    }
}

impl From<LeaseError> for ApiError {
    fn from(err: LeaseError) -> ApiError {
        match &err {
            LeaseError::Unknown(_) | LeaseError::Elsewhere { .. } => ApiError::not_found("lease", err.to_string()),
            LeaseError::Ended { reason, .. } => {
                ApiError::gone("lease-ended", "Lease ended", err.to_string()).with("reason", reason)
            }
            LeaseError::NotYours(_) => ApiError::forbidden(err.to_string()),
            LeaseError::TooMany(_) => ApiError::too_many("too-many", "Limit reached", err.to_string(), 1),
            LeaseError::Unavailable(u) => ApiError::from(*u),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = Map::new();
        body.insert("type".into(), json!(format!("urn:zkgate:problem:{}", self.slug)));
        body.insert("title".into(), json!(self.title));
        body.insert("status".into(), json!(self.status.as_u16()));
        body.insert("detail".into(), json!(self.detail));
        body.extend(self.extra);
        if self.status.is_server_error() {
            tracing::warn!(status = %self.status, detail = %body["detail"], "request failed");
        }
        let mut response = (self.status, axum::Json(Value::Object(body))).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if let Some(challenge) = self.challenge {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
        }
        response
    }
}
