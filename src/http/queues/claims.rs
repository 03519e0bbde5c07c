//! A claim's end: acknowledged (one or a batch) or given back, on any instance; and its
//! extension.

use super::*;
use crate::http::guards::{GuardHeader, Guarded};

/// Acknowledges a claim, through any instance: the item is removed for good. Acknowledging it
/// again through the same instance answers the same (a retry after a lost reply), for as long
/// as the instance remembers (the last 100,000).
#[utoipa::path(post, path = "/v1/queues/{name}/claims/{claim}/ack", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), ("claim" = String, Path, description = "Claim from the take"), GuardHeader),
    responses(
        (status = 204, description = "Acknowledged: the item is gone"),
        Problems<(p::InvalidField, p::ClaimLost, p::ZookeeperUnavailable)>,
    ))]
pub async fn ack(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, claim)): ApiPath<(String, String)>,
    Guarded(guards): Guarded,
) -> Result<StatusCode, ApiError> {
    queues::ack_one(&state, (&caller, &guards), &name, claim).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Acknowledges several claims of a queue at once (one ZooKeeper multi-op when they are all
/// still held as claimed and were made through the instance that receives the batch): each
/// claim in `acked` or, with why, in `lost`; a claim acknowledged before is answered as
/// acknowledged again.
#[utoipa::path(post, path = "/v1/queues/{name}/claims/ack", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), GuardHeader),
    request_body(content = AckBody, example = json!({"claims": ["0badcafe-4f1e2d3c4b5a69788796a5b4c3d2e1f0.71756575652d30303030303030303132"]})),
    responses(
        (status = 200, description = "What became of each claim", body = AckAnswer),
        Problems<(p::InvalidField, p::MalformedBody, p::Forbidden, p::ZookeeperUnavailable)>,
    ))]
pub async fn ack_batch(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    Guarded(guards): Guarded,
    ApiJson(body): ApiJson<AckBody>,
) -> Result<Json<AckAnswer>, ApiError> {
    Ok(Json(queues::ack_batch(&state, (&caller, &guards), &name, body).await?))
}

/// Gives a claim back, through any instance: the item is delivered again (its delivery count already counts this
/// one). Giving it back again answers the same; an ack after it, `410` (and the other way round).
#[utoipa::path(post, path = "/v1/queues/{name}/claims/{claim}/nack", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), ("claim" = String, Path, description = "Claim from the take"), GuardHeader),
    responses(
        (status = 204, description = "Given back"),
        Problems<(p::InvalidField, p::ClaimLost, p::ZookeeperUnavailable)>,
    ))]
pub async fn nack(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, claim)): ApiPath<(String, String)>,
    Guarded(guards): Guarded,
) -> Result<StatusCode, ApiError> {
    check_name(&name)?;
    queues::nack(&state, (&caller, &guards), &name, &claim).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Extends a claim, through any instance: the item stays claimed until `ack_deadline` from
/// now (a worker that takes longer than it thought extends as it goes, rather than taking
/// the item with a deadline long enough for the worst case). 410 if it is not held (its
/// deadline passed, or it was acknowledged or given back).
#[utoipa::path(post, path = "/v1/queues/{name}/claims/{claim}/extend", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), ("claim" = String, Path, description = "Claim from the take"), GuardHeader),
    request_body(content = ExtendBody, example = json!({"ack_deadline": "30s"})),
    responses(
        (status = 200, description = "Extended", body = Extended),
        Problems<(p::InvalidField, p::MalformedBody, p::Forbidden, p::ClaimLost, p::ZookeeperUnavailable)>,
    ))]
pub async fn extend(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, claim)): ApiPath<(String, String)>,
    Guarded(guards): Guarded,
    ApiJson(body): ApiJson<ExtendBody>,
) -> Result<Json<Extended>, ApiError> {
    Ok(Json(
        queues::extend_claim_by(&state, (&caller, &guards), (&name, claim), body).await?,
    ))
}
