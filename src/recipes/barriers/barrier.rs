//! Barrier, the guide's recipe: the barrier znode exists while the barrier is up; a waiter
//! sets an exists-watch and proceeds once the node is gone, re-checking on every event.
//!
//! Here the waiting is shared: all the waiters of one instance on one barrier wait on the
//! instance's one watch for that path ([ExistsWatches]), and are woken in process when it
//! reports the node gone. A barrier is either raised for good (lowered by a `DELETE`) or bound
//! to its owner's lease (it falls when the lease ends: its owner went silent or deleted it).

use crate::recipes::guards::Guards;
use crate::zk::{Failed, Failure, Multi, Session};
use serde::Serialize;
use utoipa::ToSchema;
use zookeeper_client::{CreateMode, Error as ZkError};

use crate::recipes::topic::{Source, event_kinds};
use crate::time::{from_millis, timestamp};
use crate::zk::watch::{ExistsWatches, Mode};

/// Raises a persistent barrier at `path`, if the writer's `guards` hold ([Failure::Unguarded]
/// otherwise); `false` if it was already up.
pub async fn raise(session: &Session, path: &str, guards: &Guards) -> Result<bool, Failure> {
    let client = session.client();
    let options = CreateMode::Persistent.with_acls(crate::zk::acls());
    loop {
        // Tags: `false` for the guards' checks, `true` for the barrier's node.
        let mut multi = Multi::new(client);
        guards.add_to(&mut multi, false)?;
        multi.create(true, path, &[], &options)?;
        match multi.commit().await {
            Ok(_) => return Ok(true),
            Err(Failed::Refused { tag: false, .. }) => return Err(Failure::Unguarded),
            // A lost reply of our own create also lands here: either way it is up.
            Err(Failed::Refused {
                error: ZkError::NodeExists,
                ..
            }) => return Ok(false),
            Err(failed) if failed.is_loss() => continue,
            Err(Failed::Refused {
                error: ZkError::NoNode, ..
            }) => {
                let parent = &path[..path.rfind('/').unwrap_or(0)];
                crate::zk::session::ensure_path(client, parent).await?;
            }
            Err(failed) => return Err(failed.into()),
        }
    }
}

/// Lowers the barrier at `path` (whoever raised it); `false` if it was not up.
pub async fn lower(session: &Session, path: &str, guards: &Guards) -> Result<bool, Failure> {
    let client = session.client();
    let mut retried = false;
    loop {
        // Tags: `false` for the guards' checks, `true` for the barrier's node.
        let mut multi = Multi::new(client);
        guards.add_to(&mut multi, false)?;
        multi.delete(true, path, None)?;
        match multi.commit().await {
            Ok(_) => return Ok(true),
            Err(Failed::Refused { tag: false, .. }) => return Err(Failure::Unguarded),
            // After a lost reply, a missing node is our own deletion.
            Err(Failed::Refused {
                error: ZkError::NoNode, ..
            }) => return Ok(retried),
            Err(failed) if failed.is_loss() => retried = true,
            Err(failed) => return Err(failed.into()),
        }
    }
}

/// Waits until the barrier at `path` is down (its node does not exist), as read by the shared
/// watch from now on: not as the watch last knew it, which may be older than a raise already
/// acknowledged (a waiter must not pass a barrier raised before it came). Waiters arriving
/// together share the watch's reads ([crate::zk::watch::Subscription::read_fresh]).
pub async fn wait_down(watches: &ExistsWatches, path: &str) {
    let mut subscription = watches.subscribe(path);
    subscription.read_fresh(|known| matches!(known, Some(None))).await;
}

/// A barrier: what `GET /v1/barriers/{name}` answers and the `barrier` topic carries.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq)]
pub struct BarrierState {
    #[schema(example = "nightly-import")]
    pub name: String,
    /// `true` while the barrier is up (waiters wait).
    pub up: bool,
    /// When it was raised.
    #[schema(example = "2026-11-22T10:00:00.000Z")]
    #[schema(format = DateTime)]
    pub since: Option<String>,
    /// Whether it falls with its owner's lease (a lease-bound barrier).
    pub bound: bool,
    /// The lease it is bound to, for a barrier raised through zkgate with one.
    pub lease: Option<String>,
}

event_kinds! {
    /// The events of a barrier topic.
    BarrierEvent {
        Raised => "raised",
        Lowered => "lowered",
    }
}

/// A barrier as a topic (and as `GET` reads it): one exists-watch on its znode.
pub struct BarrierTopic {
    pub name: String,
    pub path: String,
}

impl Source for BarrierTopic {
    type State = BarrierState;
    type Event = BarrierEvent;

    fn watches(&self, _: Option<&BarrierState>) -> Vec<(Mode, String)> {
        vec![(Mode::Exists, self.path.clone())]
    }

    async fn read(&self, session: &Session) -> Result<BarrierState, Failure> {
        let client = session.client();
        let (data, stat) = crate::zk::data(client, &self.path)
            .await?
            .map_or((Vec::new(), None), |(data, stat)| (data, Some(stat)));
        Ok(BarrierState {
            name: self.name.clone(),
            up: stat.is_some(),
            since: stat.map(|s| timestamp(from_millis(s.ctime))),
            bound: stat.is_some() && crate::recipes::engine::node::Owner::in_data(&data).is_some(),
            lease: crate::recipes::engine::view::lease_of(&data),
        })
    }

    fn change(&self, before: &BarrierState, after: &BarrierState) -> Option<BarrierEvent> {
        (before.up != after.up).then_some(if after.up {
            BarrierEvent::Raised
        } else {
            BarrierEvent::Lowered
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_barrier_is_raised_or_lowered() {
        let topic = BarrierTopic {
            name: "gate".into(),
            path: "/zkgate/barriers/gate".into(),
        };
        let state = |up| BarrierState {
            name: "gate".into(),
            up,
            since: None,
            bound: false,
            lease: None,
        };
        assert_eq!(topic.change(&state(false), &state(true)), Some(BarrierEvent::Raised));
        assert_eq!(topic.change(&state(true), &state(false)), Some(BarrierEvent::Lowered));
        assert_eq!(topic.change(&state(true), &state(true)), None);
    }
}
