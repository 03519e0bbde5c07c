//! Revocation: a holder asked to give up, with a grace period and an audit record.

use super::*;
use crate::recipes::engine::revoke::{Request, RevokeError, revoke as revoke_holders};

/// Body of a revocation request.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokeBody {
    /// Who asks (recorded).
    #[schema(example = "ops@example.com", max_length = 500)]
    pub by: String,
    /// Why (recorded, shown to the holder).
    #[schema(example = "deploy in progress", max_length = 500)]
    pub reason: String,
    /// After this long (at most 24h) zkgate deletes the holder's node itself (the holder
    /// loses the lock). Without it, the holder releases when it is ready.
    pub grace: Option<HumanDuration>,
    /// Revoke only this contender node (default: every current holder).
    pub node: Option<String>,
}

/// The revocations made.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Revoked {
    pub revocations: Vec<Revocation>,
}

/// Longest grace a revocation may give a holder.
pub(crate) const MAX_GRACE: Duration = Duration::from_secs(24 * 3600);

/// Longest `by` or `reason` accepted.
const MAX_TEXT: usize = 500;

/// Asks the holders of `name` (or the one `node`) to give the lock up; `role_of` tells a
/// node's role from its name (reader or writer), which decides who holds.
pub async fn revoke(
    state: &AppState,
    caller: &Caller,
    registry: &Contenders,
    name: &str,
    role_of: fn(&str) -> Role,
    body: RevokeBody,
) -> Result<Response, ApiError> {
    check_name(name)?;
    for (field, text) in [("by", &body.by), ("reason", &body.reason)] {
        if text.trim().is_empty() || text.len() > MAX_TEXT {
            let detail = format!("must be 1 to {MAX_TEXT} bytes");
            return Err(ApiError::invalid(Place::Body, field, detail));
        }
    }
    let grace = body.grace.map(|grace| at_most(grace.0, MAX_GRACE)).transpose();
    let grace = grace.map_err(|e| ApiError::invalid(Place::Body, "grace", e))?;
    let session = state.zk().connected().await?;
    let request = Request {
        kind: registry.kind(),
        name,
        dir: registry.dir(name),
        by: &body.by,
        reason: &body.reason,
        grace,
        node: body.node.as_deref(),
        role_of,
    };
    let audit_dir = revocation::audit_dir(&state.config.root);
    let revocations = revoke_holders(&session, &audit_dir, request, caller)
        .await
        .map_err(|err| match err {
            RevokeError::NoSuchNode => ApiError::not_found(
                "node",
                format!(
                    "`{}` is not a contender of `{name}`",
                    body.node.as_deref().unwrap_or_default()
                ),
            ),
            RevokeError::NobodyHolds => ApiError::new(Problem::NothingToRevoke, format!("`{name}` has no holder")),
            RevokeError::Forbidden(err) => err.into(),
            RevokeError::ZooKeeper(err) => err.into(),
        })?;
    Ok((StatusCode::ACCEPTED, Json(Revoked { revocations })).into_response())
}
