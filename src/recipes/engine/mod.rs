//! The lease-bound engine under every recipe whose znodes a lease holds: the lease and its
//! record, the handle that drives one holding, the two shapes of holding (an ordered contender
//! node, a node at a known path), revocation, and what readers see of a contender queue.
//!
//! Layered one way, each module naming only those listed before it (the layers test holds it):
//!
//! ```text
//! record       the znodes of leases: records, the holding records, keeper nodes
//! keepers      each instance's keeper node and the takeover notices under it
//! revocation   a revocation request as written into a holder's node, and the audit log
//! lease        a lease as a recipe sees it: the guard its writes check, its end
//! handle/      one holding of one lease at one resource, and the task that drives it
//! contender    the ordered-node protocol (locks, read/write locks, elections, permits)
//! node         the one-node-at-a-path protocol (members, participants, registrations)
//! view         a contender queue as readers see it
//! revoke       taking a lock back: a queue read, then each holder signalled
//! ```
//!
//! The engine names none of the recipes built on it: they reach it through [contender::Driver]
//! and [handle::Protocol] (as Curator's `LockInternals` knows only its driver).

pub mod contender;
pub mod handle;
pub mod keepers;
pub mod lease;
pub mod node;
pub mod record;
pub mod revocation;
pub mod revoke;
pub mod view;
