//! Every contender role, to read one back from a node's name ([of_node]) or a holding's record
//! ([from_label]). A new kind of contender implements [crate::recipes::engine::contender::Driver] in its own
//! file and is listed here; the engine itself never looks here.

use crate::recipes::elections::election;
use crate::recipes::engine::contender::Role;
use crate::recipes::locks::{exclusive, rwlock};

/// Every role, in the order a node's name is matched against their infixes (a reader's and a
/// writer's before an exclusive lock's).
pub const ALL: [Role; 4] = [rwlock::READ, rwlock::WRITE, election::CANDIDATE, exclusive::EXCLUSIVE];

/// The role whose [Role::label] is `label`.
pub fn from_label(label: &str) -> Option<Role> {
    ALL.into_iter().find(|role| role.label == label)
}

/// The role of a zkgate or Curator contender, from its node's name.
pub fn of_node(name: &str) -> Option<Role> {
    ALL.into_iter().find(|role| name.contains(role.infix))
}
