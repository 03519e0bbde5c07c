//! Double barrier, the guide's recipe: processes enter together once `size` of them are in,
//! and leave together once all have left.
//!
//! Under `<root>/double-barriers/<name>` each participant is a child named by its id
//! (persistent, bound to its lease where the guide makes it ephemeral, so a participant that dies never blocks the others) and `ready`
//! marks that enough have entered.
//!
//! - Enter: after creating its node, a participant lists the participants; with `size` or
//!   more it creates `ready`, otherwise it waits for `ready` to appear (an exists-watch shared
//!   by the instance's waiters). A `ready` found with nobody else inside is stale (its round
//!   ended without a clean exit): it is removed and the round starts again.
//! - Leave: the guide's herd-free exit, decided by [next_leave_step] from the participant
//!   list: the lowest waits for the highest to go; everyone else removes its own node and
//!   waits for the lowest to go; the last one out removes `ready`. Each deletion wakes one
//!   waiter, except the last.

use crate::zk::{Failure, Session};
use serde::Serialize;
use tokio::time::Instant;
use utoipa::ToSchema;
use zookeeper_client::{Client, CreateMode, Error as ZkError};

use crate::kind::Kind;
use crate::recipes::engine::node::{NodeHoldings, release_recorded};
use crate::recipes::guards::Checked;
use crate::recipes::topic::{Source, event_kinds};
use crate::zk::retry_on_loss;
use crate::zk::watch::{ExistsWatches, Mode};

/// The name of the ready node.
pub const READY: &str = "ready";

/// The key of the size in the double barrier znode's data (see [crate::recipes::agree_on_setting]).
pub const SIZE: &str = "size";

/// What a leaving participant does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaveStep<'a> {
    /// Nobody (else) is left: remove its own node if there, and `ready`; done.
    Done,
    /// It is the lowest: wait for `highest` to go.
    WaitFor(&'a str),
    /// Remove its own node (if still there), then wait for `lowest` to go.
    RemoveAndWaitFor(&'a str),
}

/// The guide's leave decision for `me` given the participants (any order; `ready` excluded).
pub fn next_leave_step<'a, S: AsRef<str>>(participants: &'a [S], me: &str) -> LeaveStep<'a> {
    let mut sorted: Vec<&str> = participants.iter().map(AsRef::as_ref).collect();
    sorted.sort_unstable();
    let others: Vec<&str> = sorted.iter().copied().filter(|p| *p != me).collect();
    let (Some(&lowest), Some(&highest)) = (others.first(), others.last()) else {
        return LeaveStep::Done;
    };
    let present = sorted.contains(&me);
    if present && me < lowest {
        LeaveStep::WaitFor(highest)
    } else {
        LeaveStep::RemoveAndWaitFor(lowest)
    }
}

/// The participants under `dir` (its children but `ready`, sorted); none if `dir` does not exist.
pub async fn participants(session: &Session, dir: &str) -> Result<Vec<String>, Failure> {
    let mut children = crate::zk::children(session.client(), dir).await?;
    children.retain(|c| c != READY);
    children.sort();
    Ok(children)
}

/// Creates `ready` (persistent: it must outlive the instance that happened to create it, since
/// participants on other instances rely on it); already there is fine.
pub async fn make_ready(client: &Client, dir: &str) -> Result<(), ZkError> {
    crate::recipes::create_if_absent(client, &format!("{dir}/{READY}"), CreateMode::Persistent).await
}

/// Removes `ready` if it is there.
pub async fn clear_ready(client: &Client, dir: &str) -> Result<(), ZkError> {
    let path = format!("{dir}/{READY}");
    match retry_on_loss(|| client.delete(&path, None)).await {
        Ok(()) | Err(ZkError::NoNode) => Ok(()),
        Err(err) => Err(err),
    }
}

/// Records `size` in the barrier's znode (creating it), or says what it records instead.
pub async fn agree_on_size(session: &Session, dir: &str, size: u32) -> Result<(), crate::recipes::SettingError> {
    let client = session.client();
    crate::recipes::agree_on_setting(client, dir, SIZE, u64::from(size), CreateMode::Persistent).await
}

/// Enters (after the participant's own node was created on `client`'s session, which sees it
/// at once): `true` once `size` participants are in, `false` if `deadline` comes first. A
/// `ready` found with nobody else inside is stale (its round ended without a clean exit): it is
/// removed and the round starts again. Waiting for `ready` is one exists-watch per instance,
/// shared by its waiters.
pub async fn enter(
    session: &Session,
    watches: &ExistsWatches,
    dir: &str,
    size: u32,
    deadline: Instant,
) -> Result<bool, Failure> {
    let client = session.client();
    let ready_path = format!("{dir}/{READY}");
    let mut ready = watches.subscribe(&ready_path);
    loop {
        let inside = participants(session, dir).await?;
        let ready_now = retry_on_loss(|| client.check_stat(&ready_path)).await?.is_some();
        if ready_now && (inside.len() > 1 || size == 1) {
            return Ok(true);
        }
        if ready_now {
            clear_ready(client, dir).await?;
        }
        if inside.len() >= size as usize {
            make_ready(client, dir).await?;
            return Ok(true);
        }
        let appeared = ready.wait_for(|known| matches!(known, Some(Some(_))));
        if tokio::time::timeout_at(deadline, appeared).await.is_err() {
            return Ok(false);
        }
    }
}

/// Leaves, the guide's herd-free exit ([next_leave_step]): `true` once every participant has
/// left, `false` if `deadline` comes first (leaving again goes on waiting). The participant's
/// node is released through its handle when its lease is kept by this instance (`nodes` of
/// barrier `name`), else through ZooKeeper with its holding record ([release_recorded]).
pub async fn leave(
    session: &Session,
    watches: &ExistsWatches,
    nodes: &NodeHoldings,
    (name, me): (&str, &str),
    deadline: Instant,
    guards: &Checked,
) -> Result<bool, Failure> {
    let client = session.client();
    let dir = nodes.dir(name);
    loop {
        let inside = participants(session, &dir).await?;
        let target = match next_leave_step(&inside, me) {
            LeaveStep::Done => {
                remove_participant(session, nodes, (name, me), guards).await?;
                clear_ready(client, &dir).await?;
                return Ok(true);
            }
            LeaveStep::WaitFor(highest) => highest.to_string(),
            LeaveStep::RemoveAndWaitFor(lowest) => {
                remove_participant(session, nodes, (name, me), guards).await?;
                lowest.to_string()
            }
        };
        let mut gone = watches.subscribe(&format!("{dir}/{target}"));
        let deleted = gone.wait_for(|known| matches!(known, Some(None)));
        if tokio::time::timeout_at(deadline, deleted).await.is_err() {
            return Ok(false);
        }
    }
}

/// Removes this participant's node: through its task here, or (driven elsewhere, or guarded)
/// through ZooKeeper, with the `guards`' checks.
async fn remove_participant(
    session: &Session,
    nodes: &NodeHoldings,
    (name, me): (&str, &str),
    guards: &Checked,
) -> Result<(), Failure> {
    if let Some(node) = nodes
        .get(name, me)
        .filter(|n| n.state().phase != crate::recipes::engine::handle::Phase::Moved)
        .filter(|_| guards.is_empty())
    {
        nodes.release(&node).await;
        return Ok(());
    }
    let path = format!("{}/{me}", nodes.dir(name));
    release_recorded(session, nodes.root(), Kind::DoubleBarrier, (name, me), &path, guards).await?;
    Ok(())
}

/// A double barrier: what `GET /v1/double-barriers/{name}` answers and the `double_barrier`
/// topic carries.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq)]
pub struct DoubleBarrierState {
    #[schema(example = "batch-7")]
    pub name: String,
    /// The recorded size.
    pub size: Option<u64>,
    /// Whether enough participants have entered (the round is in).
    pub ready: bool,
    /// The participants inside, by id.
    pub participants: Vec<String>,
}

event_kinds! {
    /// The events of a double barrier topic.
    DoubleBarrierEvent {
        /// Enough are in: everyone inside goes through.
        Entered => "entered",
        /// Everyone has left: the round is over.
        Left => "left",
        /// Only who is inside changed.
        Participants => "participants",
    }
}

/// A double barrier as a topic (and as `GET` reads it): one children watch on its znode.
pub struct DoubleBarrierTopic {
    pub name: String,
    pub dir: String,
}

impl Source for DoubleBarrierTopic {
    type State = DoubleBarrierState;
    type Event = DoubleBarrierEvent;

    fn watches(&self, _: Option<&DoubleBarrierState>) -> Vec<(Mode, String)> {
        vec![(Mode::Children, self.dir.clone())]
    }

    async fn read(&self, session: &Session) -> Result<DoubleBarrierState, Failure> {
        let client = session.client();
        let size = crate::zk::data(client, &self.dir)
            .await?
            .and_then(|(data, _)| crate::recipes::recorded(&data, SIZE));
        let mut children = crate::zk::children(client, &self.dir).await?;
        children.sort();
        let ready = children.iter().any(|c| c == READY);
        children.retain(|c| c != READY);
        Ok(DoubleBarrierState {
            name: self.name.clone(),
            size,
            ready,
            participants: children,
        })
    }

    fn change(&self, before: &DoubleBarrierState, after: &DoubleBarrierState) -> Option<DoubleBarrierEvent> {
        match (before.ready, after.ready) {
            (false, true) => Some(DoubleBarrierEvent::Entered),
            (true, false) => Some(DoubleBarrierEvent::Left),
            _ => (before.participants != after.participants).then_some(DoubleBarrierEvent::Participants),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_guides_exit() {
        let all = ["a", "b", "c"];
        assert_eq!(next_leave_step(&all, "a"), LeaveStep::WaitFor("c"));
        assert_eq!(next_leave_step(&all, "b"), LeaveStep::RemoveAndWaitFor("a"));
        assert_eq!(next_leave_step(&all, "c"), LeaveStep::RemoveAndWaitFor("a"));
        assert_eq!(next_leave_step(&["a"], "a"), LeaveStep::Done);
        assert_eq!(next_leave_step::<&str>(&[], "a"), LeaveStep::Done);
        // Already removed itself: waits for the lowest of the others.
        assert_eq!(next_leave_step(&["a", "c"], "b"), LeaveStep::RemoveAndWaitFor("a"));
    }

    #[test]
    fn a_round_is_entered_then_left() {
        let topic = DoubleBarrierTopic {
            name: "b".into(),
            dir: "/zkgate/double-barriers/b".into(),
        };
        let state = |ready, inside: &[&str]| DoubleBarrierState {
            name: "b".into(),
            size: Some(2),
            ready,
            participants: inside.iter().map(|p| p.to_string()).collect(),
        };
        assert_eq!(
            topic.change(&state(false, &[]), &state(false, &["a"])),
            Some(DoubleBarrierEvent::Participants)
        );
        assert_eq!(
            topic.change(&state(false, &["a"]), &state(true, &["a", "b"])),
            Some(DoubleBarrierEvent::Entered)
        );
        assert_eq!(
            topic.change(&state(true, &["a", "b"]), &state(true, &["a"])),
            Some(DoubleBarrierEvent::Participants)
        );
        assert_eq!(
            topic.change(&state(true, &["a"]), &state(false, &[])),
            Some(DoubleBarrierEvent::Left)
        );
        assert_eq!(topic.change(&state(false, &[]), &state(false, &[])), None);
    }

    proptest! {
        /// Everyone but the lowest waits on the lowest; the lowest waits on the highest; so one
        /// deletion wakes one waiter (the lowest), or, when the lowest goes, the others.
        #[test]
        fn only_the_lowest_waits_on_another(ids in prop::collection::btree_set("[a-z]{1,6}", 2..12)) {
            let ids: Vec<String> = ids.into_iter().collect();
            let lowest = ids.first().unwrap().as_str();
            let highest = ids.last().unwrap().as_str();
            for me in &ids {
                let step = next_leave_step(&ids, me);
                if me == lowest {
                    prop_assert_eq!(step, LeaveStep::WaitFor(highest));
                } else {
                    prop_assert_eq!(step, LeaveStep::RemoveAndWaitFor(lowest));
                }
            }
        }
    }
}
