//! Double barrier, the guide's recipe: processes enter together once `size` of them are in,
//! and leave together once all have left.
//!
//! Under `<root>/double-barriers/<name>` each participant is an ephemeral child named by its
//! id (bound to its lease, so a participant that dies never blocks the others) and `ready`
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

use zookeeper_client::{Client, CreateMode, Error as ZkError};

use crate::zk::retry_on_loss;

/// The name of the ready node.
pub const READY: &str = "ready";

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

/// The participants under `dir` (its children but `ready`); `None` if `dir` does not exist.
pub async fn participants(client: &Client, dir: &str) -> Result<Vec<String>, ZkError> {
    match retry_on_loss(|| client.list_children(dir)).await {
        Ok(mut children) => {
            children.retain(|c| c != READY);
            children.sort();
            Ok(children)
        }
        Err(ZkError::NoNode) => Ok(Vec::new()),
        Err(err) => Err(err),
    }
}

/// Creates `ready` (persistent: it must outlive the instance that happened to create it, since
/// participants on other instances rely on it); already there is fine.
pub async fn make_ready(client: &Client, dir: &str) -> Result<(), ZkError> {
    let options = CreateMode::Persistent.with_acls(crate::zk::acls());
    let path = format!("{dir}/{READY}");
    match retry_on_loss(|| client.create(&path, &[], &options)).await {
        Ok(_) | Err(ZkError::NodeExists) => Ok(()),
        Err(err) => Err(err),
    }
}

/// Removes `ready` if it is there.
pub async fn clear_ready(client: &Client, dir: &str) -> Result<(), ZkError> {
    let path = format!("{dir}/{READY}");
    match retry_on_loss(|| client.delete(&path, None)).await {
        Ok(()) | Err(ZkError::NoNode) => Ok(()),
        Err(err) => Err(err),
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
