//! Shared (read/write) locks: the guide's protocol on the node names of Curator's
//! `InterProcessReadWriteLock` (`_c_<guid>-__READ__<seq>`, `_c_<guid>-__WRIT__<seq>`).
//!
//! A writer holds when no contender of any kind has a lower sequence number and otherwise
//! watches the next lower one, exactly as an exclusive lock ([super::lock::next_step]). A
//! reader holds when no *writer* has a lower sequence number, and otherwise watches the
//! highest writer below it, the one whose departure may let it through. So readers share,
//! a writer excludes everyone, and the readers queued behind a writer are all released when
//! it leaves: every one of them can proceed, which is the recipe's intent and not a herd.
//!
//! A contender whose kind zkgate does not recognise counts as a writer: an unknown node can
//! make a reader wait, never let it in beside a writer.

use super::contender::Next;
use super::in_sequence_order;

/// The infix of Curator's read contender names.
pub const READ_INFIX: &str = "-__READ__";

/// The infix of Curator's write contender names.
pub const WRITE_INFIX: &str = "-__WRIT__";

/// Whether a child is a reader: Curator's `__READ__`, or kazoo's `__rlock__`.
pub fn is_reader(child: &str) -> bool {
    child.contains("__READ__") || child.contains("__rlock__")
}

/// The recipe's decision for the reader `me` given the lock's `children`.
pub fn next_read_step<'a, S: AsRef<str>>(children: &'a [S], me: &str) -> Next<'a> {
    let ordered = in_sequence_order(children);
    let Some(i) = ordered.iter().position(|&(_, name)| name == me) else {
        return Next::Missing;
    };
    match ordered[..i].iter().rev().find(|(_, name)| !is_reader(name)) {
        None => Next::Hold,
        Some(&(_, writer)) => Next::Wait {
            predecessor: writer,
            position: i,
        },
    }
}

/// A read/write lock's holders and queue, as an event topic: the holders are the writer at
/// the head of the queue, or the readers ahead of the first writer. `granted` when the set
/// of holders changes and is not empty, `released` when it becomes empty, `waiters` when only
/// the queue changes.
pub struct RwLockTopic {
    pub dir: String,
}

impl crate::events::Source for RwLockTopic {
    fn watches(&self, _: &serde_json::Value) -> Vec<(crate::zk::watch::Mode, String)> {
        vec![(crate::zk::watch::Mode::Children, self.dir.clone())]
    }

    fn read(
        &self,
        zk: crate::zk::session::ZkSession,
    ) -> futures::future::BoxFuture<'static, Option<serde_json::Value>> {
        let dir = self.dir.clone();
        Box::pin(async move {
            let contenders = super::contender::contenders_now(&zk, &dir).await?;
            let holding = match contenders.first() {
                Some(first) if is_reader(&first.name) => contenders.iter().take_while(|c| is_reader(&c.name)).count(),
                Some(_) => 1,
                None => 0,
            };
            let holders: Vec<_> = contenders[..holding]
                .iter()
                .map(|c| {
                    let mode = if is_reader(&c.name) { "read" } else { "write" };
                    serde_json::json!({ "node": c.name, "mode": mode, "fencing_token": c.czxid, "created_ms": c.ctime })
                })
                .collect();
            let queue = super::contender::queue_view(contenders.iter().skip(holding));
            Some(serde_json::json!({ "holders": holders, "waiters": contenders.len() - holding, "queue": queue }))
        })
    }

    fn change(&self, before: &serde_json::Value, after: &serde_json::Value) -> Option<&'static str> {
        let nodes = |v: &serde_json::Value| {
            v["holders"]
                .as_array()
                .map(|h| h.iter().map(|c| c["node"].clone()).collect::<Vec<_>>())
                .unwrap_or_default()
        };
        let (was, now) = (nodes(before), nodes(after));
        if was != now {
            // A holder leaving while others still hold (a reader among readers) is a release
            // too: nothing new was granted.
            return Some(if now.is_empty() || now.iter().all(|n| was.contains(n)) {
                "released"
            } else {
                "granted"
            });
        }
        (before["waiters"] != after["waiters"]).then_some("waiters")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipes::contender::Role;
    use crate::recipes::sequence_of;
    use proptest::prelude::*;

    fn node(reader: bool, seq: u64) -> String {
        let infix = if reader { READ_INFIX } else { WRITE_INFIX };
        format!("_c_{seq:08x}-guid{infix}{seq:010}")
    }

    fn role_of(child: &str) -> Role {
        if is_reader(child) { Role::Read } else { Role::Write }
    }

    #[test]
    fn readers_share_until_a_writer() {
        let children = [
            node(true, 1),
            node(true, 2),
            node(false, 3),
            node(true, 4),
            node(true, 5),
        ];
        assert_eq!(next_read_step(&children, &children[0]), Next::Hold);
        assert_eq!(next_read_step(&children, &children[1]), Next::Hold);
        assert_eq!(
            Role::Write.next_step(&children, &children[2]),
            Next::Wait {
                predecessor: &children[1],
                position: 2
            }
        );
        // Both readers behind the writer watch the writer itself.
        assert_eq!(
            next_read_step(&children, &children[3]),
            Next::Wait {
                predecessor: &children[2],
                position: 3
            }
        );
        assert_eq!(
            next_read_step(&children, &children[4]),
            Next::Wait {
                predecessor: &children[2],
                position: 4
            }
        );
    }

    #[test]
    fn unknown_nodes_count_as_writers() {
        let children = ["k__lock__0000000001".to_string(), node(true, 2)];
        assert_eq!(
            next_read_step(&children, &children[1]),
            Next::Wait {
                predecessor: &children[0],
                position: 1
            }
        );
    }

    fn queue() -> impl Strategy<Value = Vec<String>> {
        prop::collection::btree_map(0u64..5_000, any::<bool>(), 1..40)
            .prop_map(|m| m.into_iter().map(|(seq, reader)| node(reader, seq)).collect::<Vec<_>>())
            .prop_shuffle()
    }

    proptest! {
        /// Those who hold are either readers only, or exactly one writer; and someone holds.
        #[test]
        fn never_a_writer_with_anyone_else(children in queue()) {
            let holders: Vec<&String> =
                children.iter().filter(|c| role_of(c).next_step(&children, c) == Next::Hold).collect();
            prop_assert!(!holders.is_empty());
            let writers = holders.iter().filter(|c| !is_reader(c)).count();
            prop_assert!(writers == 0 || holders.len() == 1, "holders {:?}", holders);
        }

        /// A reader holds exactly when no writer is below it, and otherwise watches the highest
        /// writer below it; a writer watches its immediate predecessor.
        #[test]
        fn each_waits_only_for_what_blocks_it(children in queue()) {
            let seq = |c: &str| sequence_of(c).unwrap();
            for me in &children {
                let lower: Vec<&String> = children.iter().filter(|c| seq(c) < seq(me)).collect();
                let expected = if is_reader(me) {
                    lower.iter().filter(|c| !is_reader(c)).max_by_key(|c| seq(c)).copied()
                } else {
                    lower.iter().max_by_key(|c| seq(c)).copied()
                };
                match role_of(me).next_step(&children, me) {
                    Next::Hold => prop_assert!(expected.is_none()),
                    Next::Wait { predecessor, position } => {
                        prop_assert_eq!(Some(predecessor), expected.map(String::as_str));
                        prop_assert_eq!(position, lower.len());
                    }
                    Next::Missing => prop_assert!(false, "present node reported missing"),
                }
            }
        }
    }
}
