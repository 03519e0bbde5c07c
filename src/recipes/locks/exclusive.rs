//! Exclusive locks: the recipe of the ZooKeeper guide, on Apache Curator's znode names.
//!
//! A contender creates `<root>/locks/<name>/_c_<guid>-lock-<seq>` (sequential; persistent and
//! bound to its lease, where Curator's is ephemeral),
//! lists the lock's children *without* a watch, holds the lock if its sequence number is the
//! lowest, and otherwise sets an exists-watch on the next lower contender only, so that a
//! release wakes exactly one waiter (no herd). Children are ordered by the sequence suffix
//! alone, whatever their prefix, so Curator's `InterProcessMutex` and kazoo's `Lock` (with
//! `extra_lock_patterns=["-lock-"]`) contend on the same znodes.
//!
//! Why not `zookeeper_client::Client::lock`: it counts only children whose name contains its
//! own lock name, so kazoo's `__lock__` nodes would be invisible to it and both would hold the
//! lock at once; it also cannot leave a contender queued past a caller's wait. The GUID-based
//! recovery of a lost create reply is done here the same way it does it.
//!
//! The driver is [crate::recipes::engine::contender]; this file holds the decision.

use crate::zk::{Failure, Session};
use serde::Serialize;
use utoipa::ToSchema;

use crate::kind::Kind;
use crate::recipes::engine::contender::{Contenders, Driver, Next, Role};
use crate::recipes::engine::lease::{EndReason, WhyEnded};
use crate::recipes::engine::view::{ContenderView, LISTED, read_queue};
use crate::recipes::in_sequence_order;
use crate::recipes::topic::{Source, event_kinds};
use crate::zk::watch::Mode;

/// The infix of Curator's lock contender names (`_c_<uuid>-lock-<seq>`).
pub const INFIX: &str = "-lock-";

/// The recipe's decision for the contender `me` given the lock's `children`: it holds with the
/// lowest sequence number, else it watches the next lower contender.
pub fn next_step<'a, S: AsRef<str>>(children: &'a [S], me: &str) -> Next<'a> {
    let ordered = in_sequence_order(children);
    match ordered.iter().position(|&(_, name)| name == me) {
        None => Next::Missing,
        Some(0) => Next::Hold,
        Some(i) => Next::Wait {
            predecessor: ordered[i - 1].1,
            position: i,
        },
    }
}

/// An exclusive lock's contender: it holds with the lowest sequence number.
pub struct Exclusive;

/// The role of an exclusive lock's contenders.
pub const EXCLUSIVE: Role = Role {
    label: "exclusive",
    kind: Kind::Lock,
    infix: INFIX,
    driver: &Exclusive,
    mode: None,
};

impl Driver for Exclusive {
    fn kept_through_lock_delay(&self) -> bool {
        true
    }

    fn next_step<'a>(&self, children: &'a [String], me: &str) -> Next<'a> {
        next_step(children, me)
    }
}

/// An exclusive lock's holder and queue: what `GET /v1/locks/{name}` answers and the `lock`
/// topic carries.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq)]
pub struct LockState {
    #[schema(example = "orders")]
    pub name: String,
    /// The contender with the lowest sequence number, if any.
    pub holder: Option<ContenderView>,
    /// The first waiters, in queue order (at most 50).
    pub waiters: Vec<ContenderView>,
    /// How many wait, all of them.
    pub waiter_count: usize,
}

event_kinds! {
    /// The events of a lock topic.
    LockEvent {
        /// Someone else holds it now.
        Granted => "granted",
        /// Nobody holds it any more: its holder released it (or is not known to have lost it).
        Released => "released",
        /// Nobody holds it any more: its holder's lease, kept by this instance, expired.
        Lost => "lost",
        /// Someone asked the holder to give it up.
        Revocation => "revocation",
        /// Its holder's lease expired, and it stays held by it until `held_by_ended_lease_until`
        /// (the lease's lock-delay).
        HeldByEndedLease => "held-by-ended-lease",
        /// Only the queue changed.
        Waiters => "waiters",
    }
}

/// An exclusive lock as a topic (and as `GET` reads it).
///
/// ZooKeeper only says that the holder's node went; whether that was a release or a loss is
/// known to the instance that held the lease ([WhyEnded]). Other instances (and Curator or kazoo
/// holders) report `released`.
pub struct LockTopic {
    pub name: String,
    pub dir: String,
    /// This instance's contenders, which know when theirs were granted.
    pub local: Contenders,
    pub why_ended: WhyEnded,
}

impl Source for LockTopic {
    type State = LockState;
    type Event = LockEvent;

    /// The queue, and the holder's node: a revocation request is written into its data.
    fn watches(&self, state: Option<&LockState>) -> Vec<(Mode, String)> {
        let mut watches = vec![(Mode::Children, self.dir.clone())];
        if let Some(holder) = state.and_then(|s| s.holder.as_ref()) {
            watches.push((Mode::Exists, format!("{}/{}", self.dir, holder.node)));
        }
        watches
    }

    async fn read(&self, session: &Session) -> Result<LockState, Failure> {
        let client = session.client();
        let queue = read_queue(client, &self.dir, |_, i| i <= LISTED).await?;
        let local = self.local.local(&self.name);
        let mut views = queue.records.iter().map(|r| ContenderView::of(r, None, &local));
        Ok(LockState {
            name: self.name.clone(),
            holder: views.next(),
            waiters: views.collect(),
            waiter_count: queue.names.len().saturating_sub(1),
        })
    }

    fn change(&self, before: &LockState, after: &LockState) -> Option<LockEvent> {
        let node = |s: &LockState| s.holder.as_ref().map(|h| h.node.clone());
        if node(before) != node(after) {
            if after.holder.is_some() {
                return Some(LockEvent::Granted);
            }
            let lease = before.holder.as_ref().and_then(|h| h.lease.as_deref());
            let lost = lease
                .and_then(|id| (self.why_ended)(id))
                .is_some_and(|r| r != EndReason::Deleted);
            return Some(if lost { LockEvent::Lost } else { LockEvent::Released });
        }
        let asked = |s: &LockState| {
            s.holder
                .as_ref()
                .map(|h| (h.revocation_requested, h.revocation.clone()))
        };
        if asked(before) != asked(after) {
            return Some(LockEvent::Revocation);
        }
        let delayed = |s: &LockState| s.holder.as_ref().and_then(|h| h.held_by_ended_lease_until.clone());
        if delayed(before) != delayed(after) {
            return Some(LockEvent::HeldByEndedLease);
        }
        (before.waiter_count != after.waiter_count).then_some(LockEvent::Waiters)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowest_holds_others_watch_their_predecessor() {
        let children = ["_c_b-lock-0000000002", "k__lock__0000000001", "_c_c-lock-0000000005"];
        assert_eq!(next_step(&children, "k__lock__0000000001"), Next::Hold);
        assert_eq!(
            next_step(&children, "_c_b-lock-0000000002"),
            Next::Wait {
                predecessor: "k__lock__0000000001",
                position: 1
            }
        );
        assert_eq!(
            next_step(&children, "_c_c-lock-0000000005"),
            Next::Wait {
                predecessor: "_c_b-lock-0000000002",
                position: 2
            }
        );
        assert_eq!(next_step(&children, "_c_z-lock-0000000009"), Next::Missing);
    }

    use proptest::prelude::*;
    use std::sync::Arc;

    fn view(node: &str, lease: Option<&str>) -> ContenderView {
        let lease = lease.map(str::to_string);
        ContenderView {
            lease,
            ..ContenderView::for_node(node)
        }
    }

    fn state(holder: Option<ContenderView>, waiters: usize) -> LockState {
        LockState {
            name: "orders".into(),
            holder,
            waiters: Vec::new(),
            waiter_count: waiters,
        }
    }

    /// A topic whose lease `expired` ended with a loss and `deleted` with a release.
    fn topic() -> LockTopic {
        LockTopic {
            name: "orders".into(),
            dir: "/zkgate/locks/orders".into(),
            local: Contenders::new("/zkgate", crate::kind::Kind::Lock),
            why_ended: Arc::new(|id: &str| match id {
                "expired" => Some(EndReason::Expired),
                "deleted" => Some(EndReason::Deleted),
                _ => None,
            }),
        }
    }

    #[test]
    fn lock_events_follow_the_holder_then_revocation_then_the_queue() {
        let topic = topic();
        let a = view("_c_a-lock-0000000001", Some("expired"));
        let b = view("_c_b-lock-0000000002", Some("deleted"));
        let nobody = state(None, 0);
        assert_eq!(
            topic.change(&nobody, &state(Some(a.clone()), 0)),
            Some(LockEvent::Granted)
        );
        assert_eq!(
            topic.change(&state(Some(a.clone()), 1), &state(Some(b.clone()), 0)),
            Some(LockEvent::Granted)
        );
        assert_eq!(topic.change(&state(Some(a.clone()), 0), &nobody), Some(LockEvent::Lost));
        assert_eq!(
            topic.change(&state(Some(b.clone()), 0), &nobody),
            Some(LockEvent::Released)
        );
        let curator = view("_c_c-lock-0000000003", None);
        assert_eq!(
            topic.change(&state(Some(curator), 0), &nobody),
            Some(LockEvent::Released)
        );
        let asked = ContenderView {
            revocation_requested: true,
            ..b.clone()
        };
        assert_eq!(
            topic.change(&state(Some(b.clone()), 0), &state(Some(asked), 0)),
            Some(LockEvent::Revocation)
        );
        assert_eq!(
            topic.change(&state(Some(b.clone()), 0), &state(Some(b.clone()), 2)),
            Some(LockEvent::Waiters)
        );
        assert_eq!(topic.change(&state(Some(b.clone()), 2), &state(Some(b), 2)), None);
    }

    /// A contender name as Curator, kazoo or zkgate would create it, for sequence `seq`.
    fn contender(style: u8, seq: u64) -> String {
        match style % 3 {
            0 => format!("_c_{seq:x}-guid-lock-{seq:010}"),
            1 => format!("{seq:032x}__lock__{seq:010}"),
            _ => format!("_c_{seq:08x}-0000-lock-{seq:010}"),
        }
    }

    fn children() -> impl Strategy<Value = Vec<String>> {
        prop::collection::btree_set(0u64..5_000, 1..40)
            .prop_flat_map(|seqs| {
                let seqs: Vec<u64> = seqs.into_iter().collect();
                let n = seqs.len();
                (Just(seqs), prop::collection::vec(any::<u8>(), n))
            })
            .prop_map(|(seqs, styles)| seqs.iter().zip(styles).map(|(&s, style)| contender(style, s)).collect())
            .prop_shuffle()
    }

    proptest! {
        /// Exactly one contender holds: the lowest sequence number, whatever the prefixes and
        /// the listing order.
        #[test]
        fn exactly_the_lowest_sequence_holds(children in children()) {
            let holders: Vec<&String> =
                children.iter().filter(|c| next_step(&children, c) == Next::Hold).collect();
            let lowest = children.iter().min_by_key(|c| crate::recipes::sequence_of(c)).unwrap();
            prop_assert_eq!(holders, vec![lowest]);
        }

        /// Every waiter watches the next lower contender, its position counts the lower ones,
        /// and no contender is watched by two waiters (a release wakes exactly one).
        #[test]
        fn each_waiter_watches_only_its_predecessor(children in children()) {
            let seq = |c: &str| crate::recipes::sequence_of(c).unwrap();
            let mut watched = std::collections::HashSet::new();
            for me in &children {
                if let Next::Wait { predecessor, position } = next_step(&children, me) {
                    let lower: Vec<u64> = children.iter().map(|c| seq(c)).filter(|&s| s < seq(me)).collect();
                    prop_assert_eq!(position, lower.len());
                    prop_assert_eq!(seq(predecessor), *lower.iter().max().unwrap());
                    prop_assert!(watched.insert(predecessor.to_string()), "{} watched twice", predecessor);
                }
            }
            prop_assert_eq!(watched.len(), children.len() - 1);
        }

        /// A contender whose node is gone learns it is missing, never that it holds.
        #[test]
        fn a_removed_contender_is_missing(children in children(), pick in any::<prop::sample::Index>()) {
            let mut children = children;
            let gone = children.remove(pick.index(children.len()));
            prop_assert_eq!(next_step(&children, &gone), Next::Missing);
        }

        /// Children without a sequence suffix are not contenders.
        #[test]
        fn non_contenders_are_ignored(children in children(), junk in "[a-z]{1,12}") {
            let mut with_junk = children.clone();
            with_junk.push(junk);
            for me in &children {
                prop_assert_eq!(next_step(&with_junk, me), next_step(&children, me));
            }
        }
    }
}
