//! What a lease holds, as ZooKeeper has it, across kinds: the view of the holdings that other
//! instances drive, for the lease's own view. Above every recipe, since it asks each kind's
//! module how its holdings stand.

use crate::zk::{Failure, Session};

use super::engine::lease::{HoldingView, Lease};
use super::recorded::{exists, recorded};

/// How the holdings of `lease` that are not attached here show, from ZooKeeper: those that
/// other instances drive (an acquire served where it arrived: see [crate::recipes::engine::lease]).
/// A contender or a permit holds or waits as its node's place says; a node holding holds while
/// it is there; one whose node is gone while its holding record stays was lost.
pub async fn driven_elsewhere(session: &Session, root: &str, lease: &Lease) -> Result<Vec<HoldingView>, Failure> {
    use crate::recipes::engine::record::{self, Shape};
    let here = lease.attached_records();
    let record_names = record::holdings(session.client(), &lease.path).await?;
    let mut views = Vec::new();
    let elsewhere = record_names.into_iter().filter(|(name, _)| !here.contains(name));
    for holding in elsewhere.map(|(_, holding)| holding) {
        let Some(kind) = holding.kind() else { continue };
        let dir = kind.path(root, &holding.name);
        // `None`: lost (its node gone while its holding record stays).
        let standing = match &holding.shape {
            Shape::Node { hidden: true, .. } => continue,
            // A node holds while it is there.
            Shape::Node { path, .. } => exists(session, path).await?.then_some(("held", None)),
            // A contender or a permit holds or waits as its node's place says.
            Shape::Permit { .. } => super::semaphore::recorded(session, &dir, &holding.name, &holding.handle)
                .await?
                .as_ref()
                .map(place),
            Shape::Contender { .. } => recorded(session, kind, &dir, &holding.name, &holding.handle)
                .await?
                .as_ref()
                .map(place),
        };
        let (state, fencing_token) = standing.unwrap_or(("lost", None));
        views.push(HoldingView {
            kind: kind.name(),
            name: holding.name,
            handle: holding.handle,
            state,
            fencing_token,
            revocation: None,
        });
    }
    Ok(views)
}

/// Where a contender or a permit request stands: held with its fencing token, or waiting.
fn place(found: &super::recorded::Recorded) -> (&'static str, Option<i64>) {
    match found.holds() {
        true => ("held", Some(found.node.czxid)),
        false => ("waiting", None),
    }
}
