//! A claim's end: acknowledged (one or a batch) or given back, on any instance.

use super::*;
use crate::http::guards::{GuardHeader, Guarded};

/// Claims to acknowledge together.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AckBody {
    /// The claims (1 to 100), each from a take of this queue through any instance.
    #[schema(example = json!(["0badcafe-4f1e2d3c4b5a69788796a5b4c3d2e1f0.71756575652d30303030303030303132", "0badcafe-0123456789abcdef0123456789abcdef.71756575652d30303030303030303133"]), min_items = 1, max_items = 100)]
    pub claims: Vec<String>,
}

/// What became of each claim of a batch.
#[derive(Serialize, utoipa::ToSchema, Default)]
pub struct AckAnswer {
    /// Acknowledged: their items are gone for good (a claim acknowledged before counts too).
    pub acked: Vec<String>,
    /// Not held any more: their items are (or will be) delivered again.
    pub lost: Vec<LostClaim>,
}

/// A claim a batch could not acknowledge, and why.
#[derive(Serialize, utoipa::ToSchema)]
pub struct LostClaim {
    pub claim: String,
    pub detail: String,
}

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
    check_name(&name)?;
    let answer = queues::ack(&state, (&caller, &guards), &name, vec![claim]).await?;
    match answer.lost.into_iter().next() {
        None => Ok(StatusCode::NO_CONTENT),
        Some((_, why)) => Err(ApiError::new(Problem::ClaimLost, why)),
    }
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
    check_name(&name)?;
    if body.claims.is_empty() || body.claims.len() > MAX_BATCH {
        let detail = format!("must hold 1 to {MAX_BATCH} claims");
        return Err(ApiError::invalid(Place::Body, "claims", detail));
    }
    let mut seen = std::collections::HashSet::new();
    for claim in &body.claims {
        let detail = if crate::ids::claimed_item(claim).is_none() {
            format!("`{claim}` is not a claim id (`<instance>-<32 hex>.<hex>`, as a take answers)")
        } else if !seen.insert(claim.as_str()) {
            format!("`{claim}` is listed twice")
        } else {
            continue;
        };
        return Err(ApiError::invalid(Place::Body, "claims", detail));
    }
    let answer = queues::ack(&state, (&caller, &guards), &name, body.claims).await?;
    Ok(Json(AckAnswer {
        acked: answer.acked,
        lost: (answer.lost.into_iter())
            .map(|(claim, detail)| LostClaim { claim, detail })
            .collect(),
    }))
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
