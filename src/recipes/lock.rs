//! Exclusive locks: the recipe of the ZooKeeper guide, on Apache Curator's znode names.
//!
//! A contender creates `<root>/locks/<name>/_c_<guid>-lock-<seq>` (ephemeral, sequential),
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
//! The driver is [crate::recipes::contender]; this file holds the decision.

use super::contender::Next;
use super::in_sequence_order;

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

/// An exclusive lock's holder and queue, as an event topic: `granted` when the holder
/// changes, `released` when nobody holds it any more, `lost` instead when the holder's lease
/// is known (on this instance) to have expired or died with its session, `revocation` when
/// someone asks the holder to give it up (the request is written into the holder's node, so
/// the topic also watches that node's data), `waiters` when only the queue changes.
///
/// ZooKeeper only says that the holder's node went; whether that was a release or a loss is
/// known to the instance that held the lease. Other instances (and Curator or kazoo holders)
/// report `released`.
pub struct LockTopic {
    pub dir: String,
    pub leases: crate::lease::Leases,
}

impl crate::events::Source for LockTopic {
    fn watches(&self, state: &serde_json::Value) -> Vec<(crate::zk::watch::Mode, String)> {
        let mut watches = vec![(crate::zk::watch::Mode::Children, self.dir.clone())];
        if let Some(holder) = state["holder"]["node"].as_str() {
            watches.push((crate::zk::watch::Mode::Exists, format!("{}/{holder}", self.dir)));
        }
        watches
    }

    fn read(
        &self,
        zk: crate::zk::session::ZkSession,
    ) -> futures::future::BoxFuture<'static, Option<serde_json::Value>> {
        let dir = self.dir.clone();
        Box::pin(async move {
            let contenders = super::contender::contenders_now(&zk, &dir).await?;
            let holder = contenders.first().map(|c| {
                // zkgate's record, or Curator's bare signal (who and why unknown).
                let revocation = match super::revocation::record_in(&c.data) {
                    Some(record) => serde_json::json!(record),
                    None if c.data == super::revocation::CURATOR_REVOKE => serde_json::json!({}),
                    None => serde_json::Value::Null,
                };
                let lease = super::contender::lease_of(&c.data);
                serde_json::json!({ "node": c.name, "fencing_token": c.czxid, "lease": lease, "created_ms": c.ctime, "revocation": revocation })
            });
            let queue = super::contender::queue_view(contenders.iter().skip(1));
            Some(serde_json::json!({ "holder": holder, "waiters": contenders.len().saturating_sub(1), "queue": queue }))
        })
    }

    fn change(&self, before: &serde_json::Value, after: &serde_json::Value) -> Option<&'static str> {
        if before["holder"]["node"] != after["holder"]["node"] {
            if !after["holder"].is_null() {
                return Some("granted");
            }
            let lost = before["holder"]["lease"].as_str().is_some_and(|id| {
                matches!(
                    self.leases.peek(id),
                    Err(crate::lease::LeaseError::Ended { reason, .. }) if reason != crate::lease::EndReason::Deleted
                )
            });
            return Some(if lost { "lost" } else { "released" });
        }
        if before["holder"]["revocation"] != after["holder"]["revocation"] {
            return Some("revocation");
        }
        (before["waiters"] != after["waiters"]).then_some("waiters")
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
