//! The lock family, as `src/recipes/locks/` has it: exclusive locks, read/write locks,
//! semaphores, lock sets, and what they share (fencing checks, revocation, lock-delay).

mod exclusive;
mod fencing;
mod lock_delay;
mod lock_sets;
mod revocation;
mod rwlocks;
mod semaphores;
