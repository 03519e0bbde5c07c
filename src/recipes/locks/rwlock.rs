//! Shared (read/write) locks: the guide's protocol on the node names of Curator's
//! `InterProcessReadWriteLock` (`_c_<guid>-__READ__<seq>`, `_c_<guid>-__WRIT__<seq>`).
//!
//! A writer holds when no contender of any kind has a lower sequence number and otherwise
//! watches the next lower one, exactly as an exclusive lock ([crate::recipes::locks::exclusive::next_step]). A
//! reader holds when no *writer* has a lower sequence number, and otherwise watches the
//! highest writer below it, the one whose departure may let it through. So readers share,
//! a writer excludes everyone, and the readers queued behind a writer are all released when
//! it leaves: every one of them can proceed, which is the recipe's intent and not a herd.
//!
//! A contender whose kind zkgate does not recognise counts as a writer: an unknown node can
//! make a reader wait, never let it in beside a writer.

use crate::zk::{Failure, Session};
use serde::Serialize;
use utoipa::ToSchema;

use crate::kind::Kind;
use crate::recipes::engine::contender::{Contenders, Driver, Next, Role};
use crate::recipes::engine::view::{ContenderView, LISTED, holders_change, read_queue, split_holders};
use crate::recipes::in_sequence_order;
use crate::recipes::topic::{Source, event_kinds};
use crate::zk::watch::Mode;

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

/// A read/write lock's reader: it waits only for lower writers.
pub struct Reader;

/// A read/write lock's writer: it waits, as an exclusive lock's contender, for every lower node.
pub struct Writer;

/// The roles of a read/write lock's contenders.
pub const READ: Role = Role {
    label: "read",
    kind: Kind::RwLock,
    infix: READ_INFIX,
    driver: &Reader,
    mode: Some("read"),
};
pub const WRITE: Role = Role {
    label: "write",
    kind: Kind::RwLock,
    infix: WRITE_INFIX,
    driver: &Writer,
    mode: Some("write"),
};

impl Driver for Reader {
    fn kept_through_lock_delay(&self) -> bool {
        true
    }

    fn next_step<'a>(&self, children: &'a [String], me: &str) -> Next<'a> {
        next_read_step(children, me)
    }
}

impl Driver for Writer {
    fn kept_through_lock_delay(&self) -> bool {
        true
    }

    fn next_step<'a>(&self, children: &'a [String], me: &str) -> Next<'a> {
        crate::recipes::locks::exclusive::next_step(children, me)
    }
}

/// How many of the contenders `names` (in queue order) hold: the readers ahead of the first
/// writer, or the writer at the head.
pub fn holding<S: AsRef<str>>(names: &[S]) -> usize {
    match names.first() {
        Some(first) if is_reader(first.as_ref()) => names.iter().take_while(|n| is_reader(n.as_ref())).count(),
        Some(_) => 1,
        None => 0,
    }
}

/// `read` or `write`: the mode of a contender, by its name.
pub fn mode_of(name: &str) -> &'static str {
    if is_reader(name) { "read" } else { "write" }
}

/// A read/write lock's holders and queue: what `GET /v1/rwlocks/{name}` answers and the
/// `rwlock` topic carries.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq)]
pub struct RwLockState {
    #[schema(example = "catalog")]
    pub name: String,
    /// Who holds it now: readers only, or one writer (at most 50 listed).
    pub holders: Vec<ContenderView>,
    /// How many hold, all of them.
    pub holder_count: usize,
    /// The first waiters, in queue order (at most 50).
    pub waiters: Vec<ContenderView>,
    /// How many wait, all of them.
    pub waiter_count: usize,
}

event_kinds! {
    /// The events of a read/write lock topic.
    RwLockEvent {
        /// Someone new holds it.
        Granted => "granted",
        /// Holders left and nobody new holds it (it may be free, or still read by others).
        Released => "released",
        /// Only the queue changed.
        Waiters => "waiters",
    }
}

/// A read/write lock as a topic (and as `GET` reads it).
pub struct RwLockTopic {
    pub name: String,
    pub dir: String,
    pub local: Contenders,
}

impl Source for RwLockTopic {
    type State = RwLockState;
    type Event = RwLockEvent;

    fn watches(&self, _: Option<&RwLockState>) -> Vec<(Mode, String)> {
        vec![(Mode::Children, self.dir.clone())]
    }

    async fn read(&self, session: &Session) -> Result<RwLockState, Failure> {
        let client = session.client();
        let queue = read_queue(client, &self.dir, |names, i| {
            let holding = holding(names);
            i < holding.min(LISTED) || (i >= holding && i < holding + LISTED)
        })
        .await?;
        let holding = holding(&queue.names);
        let local = self.local.local(&self.name);
        let (holders, waiters) = split_holders(&queue, holding, |name| Some(mode_of(name)), &local);
        Ok(RwLockState {
            name: self.name.clone(),
            holders,
            holder_count: holding,
            waiters,
            waiter_count: queue.names.len() - holding,
        })
    }

    fn change(&self, before: &RwLockState, after: &RwLockState) -> Option<RwLockEvent> {
        holders_change(
            (&before.holders, before.holder_count),
            (&after.holders, after.holder_count),
            RwLockEvent::Granted,
            RwLockEvent::Released,
        )
        .or_else(|| (before.waiter_count != after.waiter_count).then_some(RwLockEvent::Waiters))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipes::engine::contender::Role;
    use crate::recipes::sequence_of;
    use proptest::prelude::*;

    fn node(reader: bool, seq: u64) -> String {
        let infix = if reader { READ_INFIX } else { WRITE_INFIX };
        format!("_c_{seq:08x}-guid{infix}{seq:010}")
    }

    fn role_of(child: &str) -> Role {
        if is_reader(child) { READ } else { WRITE }
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
            WRITE.next_step(&children, &children[2]),
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

    fn held(nodes: &[&str]) -> RwLockState {
        let view = |node: &str| ContenderView {
            mode: Some(mode_of(node)),
            ..ContenderView::for_node(node)
        };
        RwLockState {
            name: "catalog".into(),
            holders: nodes.iter().map(|n| view(n)).collect(),
            holder_count: nodes.len(),
            waiters: Vec::new(),
            waiter_count: 0,
        }
    }

    #[test]
    fn rwlock_events_say_whether_anyone_new_holds() {
        let topic = RwLockTopic {
            name: "catalog".into(),
            dir: "/zkgate/rwlocks/catalog".into(),
            local: Contenders::new("/zkgate", crate::kind::Kind::RwLock),
        };
        let (r1, r2, w) = (&node(true, 1), &node(true, 2), &node(false, 3));
        assert_eq!(topic.change(&held(&[]), &held(&[r1, r2])), Some(RwLockEvent::Granted));
        assert_eq!(
            topic.change(&held(&[r1, r2]), &held(&[r2])),
            Some(RwLockEvent::Released)
        );
        assert_eq!(topic.change(&held(&[r2]), &held(&[])), Some(RwLockEvent::Released));
        assert_eq!(topic.change(&held(&[r2]), &held(&[w])), Some(RwLockEvent::Granted));
        let mut queued = held(&[w]);
        queued.waiter_count = 2;
        assert_eq!(topic.change(&held(&[w]), &queued), Some(RwLockEvent::Waiters));
        assert_eq!(topic.change(&queued, &queued.clone()), None);
        assert_eq!(holding(&[r1, r2, w]), 2);
        assert_eq!(holding(&[w, r1]), 1);
        assert_eq!(holding::<&str>(&[]), 0);
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
