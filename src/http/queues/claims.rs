//! A claim's end: acknowledged (one or a batch) or given back, on any instance.

use super::*;

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

pub(super) fn claim_lost(claim: &str) -> ApiError {
    ApiError::new(
        Problem::ClaimLost,
        format!("claim `{claim}` is not held (given back, or its ack deadline passed: the item is delivered again)"),
    )
}

/// The claim `claim` of `name` for `caller` (made through any instance, see
/// [Queues::find](crate::recipes::queues::service::Queues::find)), or how an ack (`acking`) or a
/// nack of it that is not held is answered: the same as the first when it is a repeat to this
/// instance (a retry after a lost reply: `Ok(None)`), `410 claim-lost` saying why otherwise.
pub(super) async fn claim_for(
    state: &AppState,
    caller: &Caller,
    name: &str,
    claim: &str,
    acking: bool,
) -> Result<Option<Claim>, ApiError> {
    let settled = state.queues.settled(name, claim);
    let held = match settled {
        Some(_) => None,
        None => state.queues.find(name, claim).await?,
    };
    if let Some(held) = held {
        caller.require_owner(held.principal.as_deref(), &format!("claim `{claim}`"))?;
        return Ok(Some(held));
    }
    match settled {
        Some(settled) if settled.acked == acking => {
            caller.require_owner(settled.principal.as_deref(), &format!("claim `{claim}`"))?;
            Ok(None)
        }
        Some(settled) => Err(ApiError::new(
            Problem::ClaimLost,
            if settled.acked {
                format!("claim `{claim}` was acknowledged: its item is gone for good")
            } else {
                format!("claim `{claim}` was given back: its item is delivered again")
            },
        )),
        None => Err(claim_lost(claim)),
    }
}

/// Acknowledges a claim, through any instance: the item is removed for good. Acknowledging it
/// again through the same instance answers the same (a retry after a lost reply), for as long
/// as the instance remembers (the last 100,000).
#[utoipa::path(post, path = "/v1/queues/{name}/claims/{claim}/ack", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), ("claim" = String, Path, description = "Claim from the take")),
    responses(
        (status = 204, description = "Acknowledged: the item is gone"),
        Problems<(p::InvalidField, p::ClaimLost, p::ZookeeperUnavailable)>,
    ))]
pub async fn ack(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, claim)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    check_name(&name)?;
    let Some(held) = claim_for(&state, &caller, &name, &claim, true).await? else {
        return Ok(StatusCode::NO_CONTENT);
    };
    let acked = state.queues.ack(&name, std::slice::from_ref(&held)).await?[0];
    if settle_ack(&state, &name, &held, acked) {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(claim_lost(&claim))
    }
}

/// Forgets a held claim once its ack is decided, remembering how (for a repeat) and counting
/// it if acknowledged; whether it was.
pub(super) fn settle_ack(state: &AppState, queue: &str, held: &Claim, acked: bool) -> bool {
    state.queues.forget(&held.id);
    if acked {
        state.queues.settle(&held.id, held, true);
        let m = crate::metrics::get();
        m.queue_acks.with_label_values(&[m.queue(queue)]).inc();
    }
    acked
}

/// Acknowledges several claims of a queue at once (one ZooKeeper multi-op when they are all
/// still held as claimed and were made through the instance that receives the batch): each
/// claim in `acked` or, with why, in `lost`; a claim acknowledged before is answered as
/// acknowledged again.
#[utoipa::path(post, path = "/v1/queues/{name}/claims/ack", tag = "queues",
    params(("name" = String, Path, description = "Queue name")),
    request_body = AckBody,
    responses(
        (status = 200, description = "What became of each claim", body = AckAnswer),
        Problems<(p::InvalidField, p::MalformedBody, p::Forbidden, p::ZookeeperUnavailable)>,
    ))]
pub async fn ack_batch(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
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
    // Every claim's owner is checked before anything is acknowledged.
    let mut answer = AckAnswer::default();
    let mut held = Vec::new();
    for claim in body.claims {
        match claim_for(&state, &caller, &name, &claim, true).await {
            Ok(Some(claim)) => held.push(claim),
            Ok(None) => answer.acked.push(claim),
            Err(err) if err.problem() == Problem::ClaimLost => answer.lost.push(LostClaim {
                detail: err.detail().to_string(),
                claim,
            }),
            Err(err) => return Err(err),
        }
    }
    let acked = state.queues.ack(&name, &held).await?;
    for (claim, acked) in held.iter().zip(acked) {
        if settle_ack(&state, &name, claim, acked) {
            answer.acked.push(claim.id.clone());
        } else {
            answer.lost.push(LostClaim {
                claim: claim.id.clone(),
                detail: claim_lost(&claim.id).detail().to_string(),
            });
        }
    }
    Ok(Json(answer))
}

/// Gives a claim back, through any instance: the item is delivered again (its delivery count already counts this
/// one). Giving it back again answers the same; an ack after it, `410` (and the other way round).
#[utoipa::path(post, path = "/v1/queues/{name}/claims/{claim}/nack", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), ("claim" = String, Path, description = "Claim from the take")),
    responses(
        (status = 204, description = "Given back"),
        Problems<(p::InvalidField, p::ClaimLost, p::ZookeeperUnavailable)>,
    ))]
pub async fn nack(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((name, claim)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    check_name(&name)?;
    let Some(held) = claim_for(&state, &caller, &name, &claim, false).await? else {
        return Ok(StatusCode::NO_CONTENT);
    };
    let released = state.queues.release(&held).await?;
    state.queues.forget(&claim);
    if released {
        state.queues.settle(&claim, &held, false);
        let m = crate::metrics::get();
        m.queue_nacks.with_label_values(&[m.queue(&name)]).inc();
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(claim_lost(&claim))
    }
}
