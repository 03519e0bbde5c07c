//! Several exclusive locks taken as one, all or none (Curator's `InterProcessMultiLock`), on the
//! same znodes as single locks: a lock of a set and the same lock taken alone exclude each
//! other, over HTTP, in Curator and in kazoo.
//!
//! A set's locks are taken one after another, each waiting its turn in that lock's queue as a
//! single acquire does, in one **canonical order**: their names sorted bytewise. Two requests
//! asking for overlapping sets in different orders therefore ask for the shared locks in the
//! same order, and the wait-for graph between sets cannot have a cycle (the classic
//! resource-ordering argument: a set waits only for a lock greater than every lock it holds,
//! so following waits always goes up the order and never comes back). A deadlock would need
//! a holder that waits for a lower lock than one it holds, which no set does. (Curator's
//! `InterProcessMultiLock` takes its locks in the order given; a Curator client asking for a
//! set in another order can still wait on a zkgate set until one of their timeouts.)
//!
//! If any lock is not granted within the request's one wait, every lock taken for the set is
//! released before the answer, so a refused set holds nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::contender::Contender;
use super::lease::Lease;

/// The order a set's locks are taken in: sorted bytewise. `None` if a name appears twice.
pub fn canonical_order<S: AsRef<str>>(names: &[S]) -> Option<Vec<&str>> {
    let mut order: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
    order.sort_unstable();
    let before = order.len();
    order.dedup();
    (order.len() == before).then_some(order)
}

/// Locks held together by one lease.
pub struct LockSet {
    /// The set's id (issued by this instance, like a handle's).
    pub id: String,
    pub lease: Arc<Lease>,
    /// Its locks' handles, in the order they were taken.
    pub handles: Vec<Arc<Contender>>,
    pub created_at: SystemTime,
}

impl LockSet {
    /// Whether the set is over: every handle released or lost.
    fn is_over(&self) -> bool {
        self.handles.iter().all(|h| h.state().phase.is_final())
    }
}

/// The lock sets of this instance, by id. A set is forgotten when it is released, and sets
/// whose handles have all ended (their lease expired, say) are swept as new sets come, so the
/// map stays within the live handles whatever the churn.
#[derive(Default)]
pub struct LockSets {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    sets: HashMap<String, Arc<LockSet>>,
    /// The size at which the next sweep runs (twice what the last one left, at least 64), so
    /// that sweeping costs O(1) per insert on average.
    sweep_at: usize,
}

impl LockSets {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn insert(&self, set: Arc<LockSet>) {
        let mut inner = self.lock();
        if inner.sets.len() >= inner.sweep_at {
            inner.sets.retain(|_, set| !set.is_over());
            inner.sweep_at = (inner.sets.len() * 2).max(64);
        }
        inner.sets.insert(set.id.clone(), set);
    }

    pub fn get(&self, id: &str) -> Option<Arc<LockSet>> {
        self.lock().sets.get(id).cloned()
    }

    pub fn remove(&self, id: &str) -> Option<Arc<LockSet>> {
        self.lock().sets.remove(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_set_is_taken_in_name_order_and_names_are_not_repeated() {
        assert_eq!(canonical_order(&["b", "a", "c"]), Some(vec!["a", "b", "c"]));
        assert_eq!(canonical_order(&["a", "b", "a"]), None);
        assert_eq!(canonical_order::<&str>(&[]), Some(vec![]));
    }

    proptest! {
        /// However two clients list overlapping sets, they take the locks they share in the
        /// same order: the order of one restricted to the shared locks is the other's.
        #[test]
        fn overlapping_sets_take_shared_locks_in_one_order(
            a in proptest::collection::hash_set("[a-e]{1,2}", 1..8),
            b in proptest::collection::hash_set("[a-e]{1,2}", 1..8),
        ) {
            let (a, b): (Vec<String>, Vec<String>) = (a.into_iter().collect(), b.into_iter().collect());
            let (first, second) = (canonical_order(&a).unwrap(), canonical_order(&b).unwrap());
            let shared_first: Vec<&str> = first.iter().copied().filter(|n| second.contains(n)).collect();
            let shared_second: Vec<&str> = second.iter().copied().filter(|n| first.contains(n)).collect();
            prop_assert_eq!(shared_first, shared_second);
        }
    }
}
