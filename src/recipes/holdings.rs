//! What a lease holds, as ZooKeeper has it, across kinds: the view of the holdings that other
//! instances drive, for the lease's own view. Above every recipe, since it asks each kind's
//! module how its holdings stand.

use crate::zk::{Failure, Session};

use super::engine::lease::{HoldingView, Lease};
use super::recorded::{exists, recorded};
use crate::kind::Kind;

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
        let found = match &holding.shape {
            Shape::Contender { .. } => recorded(session, kind, &dir, &holding.name, &holding.handle).await?,
            Shape::Permit { .. } => super::semaphore::recorded(session, &dir, &holding.name, &holding.handle).await?,
            Shape::Node { hidden: true, .. } => continue,
            Shape::Node { path, .. } => {
                let there = exists(session, path).await?;
                views.push(view(kind, &holding.handle, &holding.name, there.then_some(None)));
                continue;
            }
        };
        let state = found.map(|r| r.holds().then_some(r.node.czxid));
        views.push(view(kind, &holding.handle, &holding.name, state));
    }
    Ok(views)
}

/// A holding's view: `None` lost, `Some(None)` waiting (or a node holding there), `Some(token)`
/// held with that fencing token.
fn view(kind: Kind, handle: &str, name: &str, state: Option<Option<i64>>) -> HoldingView {
    let one_node = !matches!(kind, Kind::Lock | Kind::RwLock | Kind::Election | Kind::Semaphore);
    HoldingView {
        kind: kind.name(),
        name: name.to_string(),
        handle: handle.to_string(),
        state: match state {
            None => "lost",
            Some(None) if one_node => "held",
            Some(None) => "waiting",
            Some(Some(_)) => "held",
        },
        fencing_token: state.flatten(),
        revocation: None,
    }
}
