//! Revocation: the holders of a lock asked to give it up, with a grace period and an audit
//! record (Curator's revocable locks).

use super::*;
use crate::problem::Place;
use crate::recipes::consistency::Consistency;
use crate::recipes::engine::revocation;
use crate::recipes::engine::revoke::{Request, RevokeError, revoke as revoke_holders};
use crate::time::at_most;

/// Longest grace a revocation may give a holder.
pub const MAX_GRACE: Duration = Duration::from_secs(24 * 3600);

/// Longest `by` or `reason` accepted.
const MAX_TEXT: usize = 500;

/// Asks the holders of `name` (or the one `node`) to give the lock up; `role_of` tells a
/// node's role from its name (reader or writer), which decides who holds.
pub async fn revoke(
    recipes: &Recipes,
    caller: &Caller,
    registry: &Contenders,
    name: &str,
    role_of: fn(&str) -> Role,
    body: RevokeBody,
) -> Result<Revoked, ApiError> {
    check_name(name)?;
    for (field, text) in [("by", &body.by), ("reason", &body.reason)] {
        if text.trim().is_empty() || text.len() > MAX_TEXT {
            let detail = format!("must be 1 to {MAX_TEXT} bytes");
            return Err(ApiError::invalid(Place::Body, field, detail));
        }
    }
    let grace = body.grace.map(|grace| at_most(grace.0, MAX_GRACE)).transpose();
    let grace = grace.map_err(|e| ApiError::invalid(Place::Body, "grace", e))?;
    let session = recipes.zk().connected().await?;
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
    let audit_dir = revocation::audit_dir(&recipes.root);
    let revocations = revoke_holders(&session, &audit_dir, request, caller).await;
    revocations
        .map(|revocations| Revoked { revocations })
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
        })
}

/// The revocation audit log: who asked for which lock back, why and when, newest first, at
/// most `limit` records (and [revocation::AUDIT_KEPT]), those of holdings `caller` may read.
pub async fn revocations(
    recipes: &Recipes,
    caller: &Caller,
    limit: usize,
    consistency: Consistency,
) -> Result<Vec<Revocation>, ApiError> {
    let limit = limit.min(revocation::AUDIT_KEPT);
    let session = recipes.reader(consistency).await?;
    let mut records = revocation::read_audit(&session, &revocation::audit_dir(&recipes.root), limit).await?;
    records.retain(|r| {
        crate::kind::Kind::from_topic(&r.kind)
            .is_some_and(|kind| caller.may(kind.auth(), &r.lock, crate::auth::Access::Read))
    });
    Ok(records)
}
