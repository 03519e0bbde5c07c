//! `/v1/queues`: durable queues and priority queues: put (idempotent with a key, bounded),
//! take at least once (claim, ack, nack, ack deadline, dead letters) or at most once, long
//! polls, depth and peek.
//!
//! Here the resource, its routes and its list; a put in [put], a take in [take], a claim's end
//! and its extension in [claims], the listings and dead letters in [listing].

use crate::http::json::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::consistency::Consistency;
use super::error::{ApiError, Place, Problems, p};
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::paging::{Paging, with_link};
use super::{Followed, Resource, check_name, state_handler};
use crate::AppState;
use crate::auth::Caller;
use crate::http::idempotency::Idempotent;
use crate::kind::Kind;
use crate::recipes::queues::topic::QueueState;
use crate::recipes::queues::{
    self, AckAnswer, AckBody, ExtendBody, Extended, ItemsQuery, MAX_LISTED, PutQuery, Stored, TakeAnswer, TakeQuery,
    Waiting,
};
use crate::recipes::validate_name;

/// The queue kind's module.
mod claims;
mod listing;
mod put;
mod take;

pub use claims::*;
pub use listing::*;
pub use put::*;
pub use take::*;

pub const RESOURCE: Resource = Resource {
    kind: Kind::Queue,
    about: Some(
        "Durable queues and priority queues: idempotent puts, at-least-once takes with ack deadlines, dead letters.",
    ),
    routes,
    topic: Some(Followed {
        summary: "Follows a queue: its depth, claims and dead letters, as Server-Sent Events.",
        param: "name",
    }),
    listed: Some("Lists the queues."),
};

// The old paths of the dead letters are served, and listed as deprecated, until clients move.
#[allow(deprecated)]
fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(queue_state))
        .routes(routes!(items, put))
        .routes(routes!(take))
        .routes(routes!(ack))
        .routes(routes!(ack_batch))
        .routes(routes!(nack))
        .routes(routes!(extend))
        .routes(routes!(dead_letters))
        .routes(routes!(replay))
        .routes(routes!(dead_letters_old_path))
        .routes(routes!(replay_old_path))
}

state_handler!(
    /// A queue's depth, claims in flight, dead letters, oldest item and next items (without their
    /// bodies: `GET .../items` has them).
    queue_state,
    "/v1/queues/{name}",
    "queues",
    "Queue name",
    QueueState,
    queue_topic
);
