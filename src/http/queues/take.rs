//! A take: at least once (a claim with an ack deadline) or at most once, in batches, long-polled.

use super::*;
use crate::http::guards::{GuardHeader, Guarded};

/// Takes the next item (a long poll): by default claims it (at least once: acknowledge it, or
/// it comes back after the ack deadline); with `mode=at-most-once` removes it. 204 when the
/// wait ends with the queue empty. Waiters on one instance share one ZooKeeper watch, and
/// each new item wakes one of them.
#[utoipa::path(post, path = "/v1/queues/{name}/take", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), TakeQuery, GuardHeader),
    responses(
        (status = 200, description = "An item (with `max_items`, `{\"items\": [...]}`)", body = TakeAnswer),
        (status = 204, description = "No item within the wait"),
        Problems<(p::InvalidField, p::ZookeeperUnavailable)>,
    ))]
pub async fn take(
    State(state): State<AppState>,
    caller: Caller,
    Guarded(guards): Guarded,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<TakeQuery>,
) -> Result<Response, ApiError> {
    match queues::dequeue(&state, (&caller, &guards), &name, query).await? {
        Some(answer) => Ok(Json(answer).into_response()),
        None => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}
