//! Every contender role, for the engine to read one back from a node's name or a holding's
//! record ([Role::of_node], [Role::from_label]). A new kind of contender implements
//! [super::contender::Driver] in its own file and is listed here.

use super::contender::Role;
use super::{election, lock, rwlock};

/// Every role, in the order a node's name is matched against their infixes (a reader's and a
/// writer's before an exclusive lock's).
pub const ALL: [Role; 4] = [rwlock::READ, rwlock::WRITE, election::CANDIDATE, lock::EXCLUSIVE];
