//! The HTTP side of the problem catalogue ([crate::problem]): an [ApiError] rendered as an
//! RFC 9457 problem document (`application/problem+json`, with `Retry-After` on 429 and 503),
//! and the spec's error responses generated from the catalogue: handlers declare the problems
//! they can answer with [Problems] in their `responses(...)`, so the description of a problem
//! is written once.

use std::collections::BTreeMap;

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};

pub use crate::problem::{ApiError, Channel, Declared, MAX_QUOTED, Place, Problem, cut_quotes, p};

/// The media type of problem documents.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The problems an operation can answer, for its `responses(...)`: the tuple of their [p]
/// types. Problems of one status share a response whose description lists each.
pub struct Problems<T>(std::marker::PhantomData<T>);

/// The spec's responses for `problems`.
pub fn responses(problems: &[Problem]) -> BTreeMap<String, RefOr<utoipa::openapi::Response>> {
    let mut by_status: BTreeMap<String, Vec<Problem>> = BTreeMap::new();
    for problem in problems {
        by_status
            .entry(problem.status().as_u16().to_string())
            .or_default()
            .push(*problem);
    }
    by_status
        .into_iter()
        .map(|(status, problems)| {
            let description = problems
                .iter()
                .map(|p| format!("`{}`: {}", p.slug(), p.when()))
                .collect::<Vec<_>>()
                .join("; ");
            let problem = ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem")));
            let mut response = ResponseBuilder::new()
                .description(description)
                .content(PROBLEM_JSON, problem.build())
                .build();
            if status == "429" || status == "503" {
                response.headers.insert("Retry-After".to_string(), retry_after_header());
            }
            (status, response.into())
        })
        .collect()
}

/// The `Retry-After` of every 429 and 503 ([ApiError::new] sets it on each).
fn retry_after_header() -> RefOr<utoipa::openapi::header::Header> {
    let seconds = utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::Integer)
        .minimum(Some(1));
    RefOr::T(
        utoipa::openapi::header::HeaderBuilder::new()
            .schema(Some(seconds))
            .description(Some("Seconds to wait before trying again"))
            .build(),
    )
}

macro_rules! declare_tuples {
    ($(($($t:ident),+))+) => {
        $(
            impl<$($t: Declared),+> utoipa::IntoResponses for Problems<($($t,)+)> {
                fn responses() -> BTreeMap<String, RefOr<utoipa::openapi::Response>> {
                    responses(&[$($t::PROBLEM),+])
                }
            }
        )+
    };
}

declare_tuples! {
    (A)
    (A, B)
    (A, B, C)
    (A, B, C, D)
    (A, B, C, D, E)
    (A, B, C, D, E, F)
    (A, B, C, D, E, F, G)
    (A, B, C, D, E, F, G, H)
    (A, B, C, D, E, F, G, H, I)
    (A, B, C, D, E, F, G, H, I, J)
    (A, B, C, D, E, F, G, H, I, J, K)
    (A, B, C, D, E, F, G, H, I, J, K, L)
    (A, B, C, D, E, F, G, H, I, J, K, L, M)
    (A, B, C, D, E, F, G, H, I, J, K, L, M, N)
    (A, B, C, D, E, F, G, H, I, J, K, L, M, N, O)
}

// Only the spec's schema (so its optional members carry no `skip_serializing_if`): the
// document itself is written by `ApiError::body`, with only the members a problem has.
/// An RFC 9457 problem document, as documented in the OpenAPI description.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Problem)]
pub struct ProblemDocument {
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
    pub field: Option<String>,
    /// For bad input: where the field is (`body`, `query`, `path`, `header`).
    #[serde(rename = "in")]
    #[schema(example = "path")]
    pub place: Option<String>,
    /// For an invalid `topic` of an event stream: the topic at fault.
    pub topic: Option<String>,
    /// `not-found`: what was not found (`lease`, `handle`, `key`, `member`...).
    #[schema(example = "lease")]
    pub resource: Option<String>,
    /// `method-not-allowed`: the methods the endpoint takes.
    #[schema(example = json!(["GET", "PUT"]))]
    pub allowed: Option<Vec<String>>,
    /// `lock-not-acquired`: the request's place in the queue when the wait ended (0: first).
    pub position: Option<u64>,
    /// `lock-not-acquired`: whether the request had joined the queue (it has left it).
    pub queued: Option<bool>,
    /// `lock-not-acquired` on a lock set: the lock not granted; `lock-lost`: the lock lost.
    pub lock: Option<String>,
    /// `mode-change-refused`: the handle the lease already has on the read/write lock.
    pub handle: Option<String>,
    /// `mode-change-refused`: the mode the lease already has (`read`, `write`).
    #[schema(example = "read")]
    pub mode: Option<String>,
    /// `not-leader`: the candidate's state.
    pub state: Option<String>,
    /// `stale-fencing-token`: the newest holder's token (or the leader's term).
    pub current_token: Option<i64>,
    /// `permits-mismatch`: the semaphore's number of permits.
    pub permits: Option<u32>,
    /// `size-mismatch`: the double barrier's size.
    pub size: Option<u32>,
    /// `already-voted`: the participant's vote (final).
    pub vote: Option<crate::recipes::txns::Vote>,
    /// `txn-decided`: the transaction's outcome.
    pub outcome: Option<crate::recipes::txns::Outcome>,
    /// `out-of-bounds`: the counter's value (unchanged).
    pub value: Option<i64>,
    /// `lease-ended` (`deleted`, `expired`), `lock-lost`: why.
    #[schema(example = "expired")]
    pub reason: Option<String>,
    /// `precondition-failed`: the ETag of what is there now.
    pub current_etag: Option<String>,
    /// `body-too-large`, `value-too-large`: the limit in bytes.
    pub limit_bytes: Option<u64>,
    /// `value-too-large`: the size as stored; `not-a-counter`: the size of the znode's data.
    pub size_bytes: Option<u64>,
    /// `queue-full`: the queue's depth (its limit).
    pub depth: Option<u64>,
    /// `quota-exceeded`: the quota that is full.
    pub quota: Option<String>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = self.body();
        if status.is_server_error() {
            tracing::warn!(%status, detail = ?body["detail"], "request failed");
        }
        let mut response = (status, crate::http::json::Json(body)).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after_seconds() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.problem() == Problem::Unauthorized {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"zkgate\""),
            );
        }
        response
    }
}

/// Adds `problems` to the responses `operation` documents, but for those it declares itself
/// (which are not described twice).
pub fn declare(operation: &mut utoipa::openapi::path::Operation, mut problems: Vec<Problem>) {
    let responses = &mut operation.responses.responses;
    problems.retain(|problem| {
        !responses.values().any(|r| match r {
            utoipa::openapi::RefOr::T(r) => r.description.contains(&format!("`{}`", problem.slug())),
            utoipa::openapi::RefOr::Ref(_) => false,
        })
    });
    for (status, response) in self::responses(&problems) {
        match (responses.get_mut(&status), response) {
            (Some(utoipa::openapi::RefOr::T(existing)), utoipa::openapi::RefOr::T(more)) => {
                existing.description = format!("{}; {}", existing.description, more.description);
            }
            (_, response) => {
                responses.insert(status, response);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_of_one_status_share_a_response() {
        let declared = responses(&[
            Problem::LockNotAcquired,
            Problem::ModeChangeRefused,
            Problem::InvalidField,
        ]);
        assert_eq!(declared.keys().collect::<Vec<_>>(), ["400", "409"]);
        let RefOr::T(conflict) = &declared["409"] else {
            panic!("inline response")
        };
        assert!(conflict.description.contains("`lock-not-acquired`"));
        assert!(conflict.description.contains("`mode-change-refused`"));
    }
}
