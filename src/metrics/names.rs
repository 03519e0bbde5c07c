//! Which resource names have series of their own. Names come from clients (a lock per order is
//! common), so a series per name ever used would grow without end: `/metrics` of hundreds of MB
//! and memory that is never given back. So each kind has a fixed number of places for names
//! ([Names::per_kind]); a name takes a place when it is used while there is room, and keeps it
//! while something holds it (a live lock handle, a waiting contender) or for a while after its
//! last use ([IDLE]); then its series are dropped and the place is free for another name.
//! Names without a place are counted together under the name [OTHER].
//!
//! A name that stays in use keeps its place; names used once pass through. A name's counters
//! start again from zero when it comes back after losing its place, which Prometheus reads as
//! a counter reset (as after a restart).

use crate::locked::Locked;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The `name` of the series of every name without a place of its own.
pub const OTHER: &str = "_other";

/// How long a name nothing holds keeps its place after its last use: several scrapes at the
/// usual intervals, so that its last counts are seen before its series go.
pub const IDLE: Duration = Duration::from_secs(120);

/// A kind (its label) and a name of that kind.
pub type Key = (&'static str, String);

/// The places of names, per kind.
pub struct Names {
    per_kind: AtomicUsize,
    table: Mutex<Table>,
}

/// Per kind, its names with a place.
#[derive(Default)]
struct Table(HashMap<&'static str, HashMap<String, Place>>);

struct Place {
    /// Handles and waiters that hold the name.
    holders: usize,
    last_used: Instant,
}

impl Place {
    fn idle(&self, now: Instant) -> bool {
        self.holders == 0 && now.saturating_duration_since(self.last_used) >= IDLE
    }
}

/// What [Names::admit] decided.
pub struct Admitted {
    /// Whether the name has a place (else its counts go to [OTHER]).
    pub placed: bool,
    /// Names whose places were taken back to make room: their series must go.
    pub evicted: Vec<Key>,
}

impl Names {
    pub fn new(per_kind: usize) -> Names {
        Names {
            per_kind: AtomicUsize::new(per_kind),
            table: Mutex::default(),
        }
    }

    pub fn per_kind(&self) -> usize {
        self.per_kind.load(Ordering::Relaxed)
    }

    pub fn set_per_kind(&self, per_kind: usize) {
        self.per_kind.store(per_kind, Ordering::Relaxed);
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.locked()
    }

    /// A use of `name` of `kind` at `now` (`hold`: one more holder until [Names::release]):
    /// whether it has a place, taking a free one (or an idle name's) if it had none.
    pub fn admit(&self, kind: &'static str, name: &str, hold: bool, now: Instant) -> Admitted {
        let per_kind = self.per_kind.load(Ordering::Relaxed);
        let mut table = self.table();
        let places = table.0.entry(kind).or_default();
        if let Some(place) = places.get_mut(name) {
            place.holders += usize::from(hold);
            place.last_used = now;
            return Admitted {
                placed: true,
                evicted: Vec::new(),
            };
        }
        let mut evicted = Vec::new();
        if places.len() >= per_kind {
            evicted = evict(kind, places, now);
        }
        let placed = places.len() < per_kind;
        if placed {
            let place = Place {
                holders: usize::from(hold),
                last_used: now,
            };
            places.insert(name.to_string(), place);
        }
        Admitted { placed, evicted }
    }

    /// A holder of `name` lets go (a name without a place is not counted).
    pub fn release(&self, kind: &'static str, name: &str, now: Instant) {
        let mut table = self.table();
        if let Some(place) = table.0.get_mut(kind).and_then(|places| places.get_mut(name)) {
            place.holders = place.holders.saturating_sub(1);
            place.last_used = now;
        }
    }

    /// Takes back the places of every idle name: their series must go.
    pub fn sweep(&self, now: Instant) -> Vec<Key> {
        let mut table = self.table();
        let mut evicted = Vec::new();
        for (kind, places) in table.0.iter_mut() {
            evicted.extend(evict(kind, places, now));
        }
        evicted
    }

    /// Names with a place now.
    pub fn placed(&self) -> usize {
        self.table().0.values().map(HashMap::len).sum()
    }
}

/// Takes back the places of the idle names of `places`.
fn evict(kind: &'static str, places: &mut HashMap<String, Place>, now: Instant) -> Vec<Key> {
    let mut evicted = Vec::new();
    places.retain(|name, place| {
        let idle = place.idle(now);
        if idle {
            evicted.push((kind, name.clone()));
        }
        !idle
    });
    evicted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_past_the_places_of_their_kind_have_none() {
        let names = Names::new(2);
        let now = Instant::now();
        assert!(names.admit("lock", "a", false, now).placed);
        assert!(names.admit("lock", "b", false, now).placed);
        assert!(!names.admit("lock", "c", false, now).placed, "no room");
        assert!(names.admit("lock", "a", false, now).placed, "a keeps its place");
        assert!(
            names.admit("queue", "c", false, now).placed,
            "each kind has its own places"
        );
    }

    #[test]
    fn an_idle_name_gives_its_place_to_a_new_one_and_a_held_one_keeps_it() {
        let names = Names::new(2);
        let start = Instant::now();
        assert!(names.admit("lock", "held", true, start).placed);
        assert!(names.admit("lock", "once", false, start).placed);
        let later = start + IDLE;
        let admitted = names.admit("lock", "new", false, later);
        assert!(admitted.placed);
        assert_eq!(admitted.evicted, vec![("lock", "once".to_string())]);
        // Once let go, the held name goes idle too.
        names.release("lock", "held", later);
        assert!(names.sweep(later + IDLE / 2).is_empty(), "not idle long enough");
        let swept = names.sweep(later + IDLE);
        assert_eq!(swept.len(), 2, "{swept:?}");
        assert_eq!(names.placed(), 0);
    }
}
