//! One way to take a `std::sync::Mutex` that a panicking thread left poisoned: zkgate's locks
//! guard tables and counters whose every update is a single step (an insert, a removal, a
//! count), so what a panic leaves behind is consistent, and serving on is better than every
//! later request panicking in turn.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// [Mutex::lock], past a poisoning (see the module's docs).
pub trait Locked<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Takes one off the count of `key` in a table of live counts (as such locks guard), forgetting
/// it at zero: the table holds only live counts.
pub fn count_down<K: std::hash::Hash + Eq>(counts: &mut std::collections::HashMap<K, usize>, key: &K) {
    if let Some(count) = counts.get_mut(key) {
        *count -= 1;
        if *count == 0 {
            counts.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_taken_with_what_it_holds() {
        let counter = std::sync::Arc::new(Mutex::new(1));
        let poisoner = counter.clone();
        let _ = std::thread::spawn(move || {
            let mut held = poisoner.lock().unwrap();
            *held += 1;
            panic!("a panic while holding the lock");
        })
        .join();
        assert!(counter.is_poisoned());
        assert_eq!(*counter.locked(), 2);
    }
}
