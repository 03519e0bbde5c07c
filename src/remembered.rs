//! A bounded memory of things that ended: at most a number of entries, the oldest forgotten
//! first. Ended leases and lost handles are remembered so that a client asking later learns
//! what happened (410 with the reason) rather than that they never existed; the bound keeps a
//! churn of them from growing the instance without end.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// How many an instance remembers of each (ended leases, lost handles of a kind) unless told
/// otherwise: a few minutes of heavy churn, a few tens of MB at most.
pub const REMEMBERED: usize = 100_000;

pub struct Remembered<K, V> {
    entries: HashMap<K, V>,
    order: VecDeque<K>,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V> Default for Remembered<K, V> {
    fn default() -> Remembered<K, V> {
        Remembered::new(REMEMBERED)
    }
}

impl<K: Hash + Eq + Clone, V> Remembered<K, V> {
    pub fn new(capacity: usize) -> Remembered<K, V> {
        Remembered {
            entries: HashMap::new(),
            order: VecDeque::new(),
            capacity,
        }
    }

    /// Remembers `value` for `key` (replacing what was there), forgetting the oldest entries
    /// past the capacity.
    pub fn insert(&mut self, key: K, value: V) {
        if self.entries.insert(key.clone(), value).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.entries.remove(&oldest);
            }
        }
    }

    pub fn get<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: std::borrow::Borrow<Q>,
    {
        self.entries.get(key)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_are_forgotten_past_the_capacity() {
        let mut remembered = Remembered::new(3);
        for n in 0..10 {
            remembered.insert(n, n * 10);
        }
        assert_eq!(remembered.len(), 3);
        assert_eq!(remembered.get(&6), None);
        assert_eq!(remembered.get(&9), Some(&90));
        // Remembering a key again does not count it twice.
        remembered.insert(9, 91);
        assert_eq!((remembered.len(), remembered.get(&7)), (3, Some(&70)));
    }
}
