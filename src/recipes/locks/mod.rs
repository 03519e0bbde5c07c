//! The lock family: exclusive locks, read/write locks, semaphores, lock sets, and what they
//! share: the long-poll acquire, a handle's reads and release, fencing checks and revocation
//! ([contention]; elections contend the same way).

pub mod contention;
pub mod exclusive;
pub mod lock_set;
pub mod permits;
pub mod rwlock;
pub mod semaphore;
pub mod sets;
