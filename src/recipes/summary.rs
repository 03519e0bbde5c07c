//! Every resource of a kind at a glance: how many there are, how many are busy, which are the
//! busiest, and how that went over the last two minutes. It is what a dashboard shows first,
//! and it must stay cheap at tens of thousands of resources.
//!
//! A resource is measured by the number of children of its znodes, read as stats in
//! multi-reads (a thousand per round trip, never a listing per resource): a lock's contenders,
//! a queue's items, claims and dead letters, a group's members. That ranks it; its exact state
//! (who holds it, since when) is its own topic's, which a dashboard follows only for the rows
//! it shows. [Tallies] keeps the measure of every resource of a kind, ranks them, and keeps the
//! history of the busiest and of the kind as a whole; it is pure (the events bus drives it from
//! one recursive watch on the kind's directory, `events/summary.rs`).

use std::collections::{HashMap, VecDeque};

use serde::Serialize;
use zookeeper_client::{Client, Error as ZkError, Stat};

use crate::kind::Kind;

/// How long the history of a summary reaches back.
pub const HISTORY_MS: i64 = 120_000;

/// Most points of one history (one per change; older ones go first).
const HISTORY_POINTS: usize = 240;

/// A resource as its children count it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Measure {
    /// What the kind ranks by ([measure_name]): waiters, depth, members...
    pub value: u64,
    /// Locks: whether held (0 or 1); semaphores: permits held.
    pub held: Option<u64>,
    /// Queues: items claimed and not yet acknowledged.
    pub in_flight: Option<u64>,
    /// Queues: items in the dead letters.
    pub dead_letters: Option<u64>,
}

/// What a kind's summary counts per resource (its `measure`).
pub fn measure_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Lock | Kind::Semaphore => "waiters",
        Kind::RwLock => "contenders",
        Kind::Election => "candidates",
        Kind::Group => "members",
        Kind::DoubleBarrier => "participants",
        Kind::Queue => "depth",
        Kind::Txn => "votes",
        Kind::Counter => "updates",
        Kind::Service => "instances",
        Kind::Barrier | Kind::Kv => "none",
    }
}

/// The znodes whose stats measure the resource at `dir`, the resource's own first.
fn probes(kind: Kind, dir: &str) -> Vec<String> {
    let below = |children: &[&str]| {
        std::iter::once(dir.to_string())
            .chain(children.iter().map(|c| format!("{dir}/{c}")))
            .collect()
    };
    match kind {
        Kind::Semaphore => below(&["locks", "leases"]),
        Kind::Election => below(&[crate::recipes::elections::election::ACK_NODE]),
        Kind::DoubleBarrier => below(&[crate::recipes::barriers::double::READY]),
        Kind::Queue => below(&["items", "claims", "dead"]),
        Kind::Txn => below(&["votes"]),
        // Measured by their own znode's children (or data) alone.
        Kind::Lock | Kind::RwLock | Kind::Barrier | Kind::Group | Kind::Kv | Kind::Counter | Kind::Service => {
            below(&[])
        }
    }
}

/// The measure from the stats of [probes] (`None`: the resource is gone).
fn measure_of(kind: Kind, stats: &[Option<Stat>]) -> Option<Measure> {
    let own = stats.first()?.as_ref()?;
    let children = |i: usize| {
        stats
            .get(i)
            .and_then(|s| s.as_ref())
            .map_or(0, |s| s.num_children.max(0) as u64)
    };
    let exists = |i: usize| u64::from(stats.get(i).is_some_and(|s| s.is_some()));
    let n = own.num_children.max(0) as u64;
    let plain = |value| Measure {
        value,
        ..Measure::default()
    };
    Some(match kind {
        Kind::Lock => Measure {
            value: n.saturating_sub(1),
            held: Some(u64::from(n > 0)),
            ..Measure::default()
        },
        Kind::Semaphore => Measure {
            value: children(1),
            held: Some(children(2)),
            ..Measure::default()
        },
        // The election's acknowledgement node and the double barrier's `ready` are children
        // that are not candidates or participants.
        Kind::Election | Kind::DoubleBarrier => plain(n.saturating_sub(exists(1))),
        Kind::Queue => {
            let (items, claims) = (children(1), children(2));
            Measure {
                value: items.saturating_sub(claims),
                in_flight: Some(claims),
                dead_letters: Some(children(3)),
                ..Measure::default()
            }
        }
        Kind::Barrier | Kind::Kv => plain(0),
        Kind::Txn => plain(children(1)),
        // The times it was written (its data version): the most written rank first.
        Kind::Counter => plain(own.version.max(0) as u64),
        Kind::RwLock | Kind::Group | Kind::Service => plain(n),
    })
}

/// The names of every resource under `base` (none if it does not exist yet).
pub async fn names(client: &Client, base: &str) -> Result<Vec<String>, ZkError> {
    crate::zk::children(client, base).await
}

/// Measures each of `names` under `base` (`None`: it is gone), in a few round trips whatever
/// their number.
pub async fn measure(
    client: &Client,
    kind: Kind,
    base: &str,
    names: Vec<String>,
) -> Result<Vec<(String, Option<Measure>)>, ZkError> {
    let per_name = probes(kind, base).len();
    let paths: Vec<String> = names
        .iter()
        .flat_map(|name| probes(kind, &format!("{base}/{name}")))
        .collect();
    let stats = crate::zk::stat_each(client, &paths).await?;
    Ok(names
        .into_iter()
        .zip(stats.chunks(per_name))
        .map(|(name, stats)| (name, measure_of(kind, stats)))
        .collect())
}

/// One resource in a summary.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct SummaryRow {
    pub name: String,
    /// The kind's measure (see the summary's `measure`).
    pub value: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_letters: Option<u64>,
    /// Since when (Unix ms) its measure has been above zero, as far as this instance has seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busy_since: Option<i64>,
    /// Its measure at each change while it was among the busiest, up to two minutes back:
    /// `[unix ms, value]`.
    pub history: Vec<(i64, u64)>,
}

/// A kind's summary: what the `summary` topic carries.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct SummaryState {
    /// The kind (its URL segment: `locks`, `queues`...).
    pub kind: &'static str,
    /// What `value` counts: `waiters`, `depth`, `members`...
    pub measure: &'static str,
    /// How many resources of the kind exist.
    pub count: usize,
    /// How many have a `value` above zero.
    pub busy: usize,
    /// The sum of every resource's `value`.
    pub total: u64,
    /// The busiest, at most [Tallies::new]'s `top`: highest `value` first, then busy longest,
    /// then by name.
    pub top: Vec<SummaryRow>,
    /// `count`, `busy` and `total` at each change, up to two minutes back:
    /// `[unix ms, count, busy, total]`.
    pub history: Vec<(i64, usize, usize, u64)>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Row {
    measure: Measure,
    busy_since: Option<i64>,
}

/// The measures of every resource of one kind, and the history of the busiest.
pub struct Tallies {
    kind: Kind,
    top: usize,
    rows: HashMap<String, Row>,
    histories: HashMap<String, VecDeque<(i64, u64)>>,
    totals: VecDeque<(i64, usize, usize, u64)>,
}

impl Tallies {
    /// The tallies of `kind`, whose summaries name its `top` busiest resources.
    pub fn new(kind: Kind, top: usize) -> Tallies {
        Tallies {
            kind,
            top,
            rows: HashMap::new(),
            histories: HashMap::new(),
            totals: VecDeque::new(),
        }
    }

    /// Every resource, measured anew (after a listing): the ones not in `measured` are gone.
    pub fn reset(&mut self, measured: Vec<(String, Option<Measure>)>, now: i64) {
        let mut rows = HashMap::with_capacity(measured.len());
        for (name, measure) in measured {
            if let Some(measure) = measure {
                let row = next_row(self.rows.get(&name), measure, now);
                rows.insert(name, row);
            }
        }
        self.rows = rows;
    }

    /// Some resources, measured anew (`None`: gone).
    pub fn update(&mut self, measured: Vec<(String, Option<Measure>)>, now: i64) {
        for (name, measure) in measured {
            match measure {
                Some(measure) => {
                    let row = next_row(self.rows.get(&name), measure, now);
                    self.rows.insert(name, row);
                }
                None => {
                    self.rows.remove(&name);
                }
            }
        }
    }

    /// The summary now; the histories take a point where a value changed.
    pub fn state(&mut self, now: i64) -> SummaryState {
        let busy = self.rows.values().filter(|r| r.measure.value > 0).count();
        let total = self.rows.values().map(|r| r.measure.value).sum();
        let count = self.rows.len();
        if self
            .totals
            .back()
            .is_none_or(|&(_, c, b, t)| (c, b, t) != (count, busy, total))
        {
            push_point(&mut self.totals, (now, count, busy, total), now, |p| p.0);
        }
        let mut ranked: Vec<(&String, &Row)> = self.rows.iter().collect();
        let order = |a: &(&String, &Row), b: &(&String, &Row)| {
            b.1.measure
                .value
                .cmp(&a.1.measure.value)
                .then_with(|| {
                    a.1.busy_since
                        .unwrap_or(i64::MAX)
                        .cmp(&b.1.busy_since.unwrap_or(i64::MAX))
                })
                .then_with(|| a.0.cmp(b.0))
        };
        if ranked.len() > self.top && self.top > 0 {
            ranked.select_nth_unstable_by(self.top - 1, order);
        }
        ranked.truncate(self.top);
        ranked.sort_unstable_by(order);
        let mut histories = HashMap::with_capacity(ranked.len());
        let top = ranked
            .into_iter()
            .map(|(name, row)| {
                let mut history = self.histories.remove(name).unwrap_or_default();
                if history.back().is_none_or(|&(_, v)| v != row.measure.value) {
                    push_point(&mut history, (now, row.measure.value), now, |p| p.0);
                }
                let summary = SummaryRow {
                    name: name.clone(),
                    value: row.measure.value,
                    held: row.measure.held,
                    in_flight: row.measure.in_flight,
                    dead_letters: row.measure.dead_letters,
                    busy_since: row.busy_since,
                    history: history.iter().copied().collect(),
                };
                histories.insert(name.clone(), history);
                summary
            })
            .collect();
        // Only the busiest keep a history: what leaves the top is forgotten.
        self.histories = histories;
        SummaryState {
            kind: self.kind.dir(),
            measure: measure_name(self.kind),
            count,
            busy,
            total,
            top,
            history: self.totals.iter().copied().collect(),
        }
    }
}

fn next_row(before: Option<&Row>, measure: Measure, now: i64) -> Row {
    let busy_since = (measure.value > 0).then(|| before.and_then(|r| r.busy_since).unwrap_or(now));
    Row { measure, busy_since }
}

/// Appends `point`, then drops the points older than the history's reach (keeping the last
/// one before it, where the line starts) and beyond its number.
fn push_point<P>(history: &mut VecDeque<P>, point: P, now: i64, time: impl Fn(&P) -> i64) {
    history.push_back(point);
    while history.len() > HISTORY_POINTS
        || (history.len() > 1 && history.get(1).is_some_and(|p| time(p) <= now - HISTORY_MS))
    {
        history.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(num_children: i32) -> Option<Stat> {
        Some(crate::recipes::test_stat(1, 0, num_children))
    }

    fn waiting(value: u64) -> Option<Measure> {
        Some(Measure {
            value,
            held: Some(1),
            ..Measure::default()
        })
    }

    #[test]
    fn each_kind_is_measured_by_what_waits_in_it() {
        assert_eq!(measure_of(Kind::Lock, &[stat(3)]), waiting(2));
        assert_eq!(
            measure_of(Kind::Lock, &[stat(0)]).map(|m| (m.value, m.held)),
            Some((0, Some(0)))
        );
        assert_eq!(measure_of(Kind::Lock, &[None]), None);
        let queue = measure_of(Kind::Queue, &[stat(3), stat(10), stat(4), stat(1)]).unwrap();
        assert_eq!(
            (queue.value, queue.in_flight, queue.dead_letters),
            (6, Some(4), Some(1))
        );
        // A queue whose directories are not made yet is empty, not gone.
        assert_eq!(
            measure_of(Kind::Queue, &[stat(0), None, None, None]).map(|m| m.value),
            Some(0)
        );
        assert_eq!(
            measure_of(Kind::Election, &[stat(3), stat(0)]).map(|m| m.value),
            Some(2)
        );
        assert_eq!(measure_of(Kind::Election, &[stat(3), None]).map(|m| m.value), Some(3));
        let semaphore = measure_of(Kind::Semaphore, &[stat(2), stat(5), stat(3)]).unwrap();
        assert_eq!((semaphore.value, semaphore.held), (5, Some(3)));
        assert_eq!(probes(Kind::Queue, "/q").len(), 4);
    }

    #[test]
    fn the_busiest_come_first_then_the_longest_busy_then_by_name() {
        let mut tallies = Tallies::new(Kind::Lock, 3);
        let all = (0..10).map(|i| (format!("l{i}"), waiting(0))).collect();
        tallies.reset(all, 1_000);
        tallies.update(vec![("l7".into(), waiting(4)), ("l2".into(), waiting(1))], 2_000);
        tallies.update(vec![("l5".into(), waiting(1)), ("l9".into(), None)], 3_000);
        let state = tallies.state(3_000);
        let top: Vec<(&str, u64, Option<i64>)> = state
            .top
            .iter()
            .map(|r| (r.name.as_str(), r.value, r.busy_since))
            .collect();
        assert_eq!(
            top,
            [("l7", 4, Some(2_000)), ("l2", 1, Some(2_000)), ("l5", 1, Some(3_000))]
        );
        assert_eq!((state.count, state.busy, state.total), (9, 3, 6));
        // Busy since the first time above zero, not since the last change.
        tallies.update(vec![("l7".into(), waiting(2))], 4_000);
        assert_eq!(tallies.state(4_000).top[0].busy_since, Some(2_000));
    }

    #[test]
    fn history_is_kept_for_the_busiest_at_each_change_and_two_minutes_back() {
        let mut tallies = Tallies::new(Kind::Lock, 1);
        tallies.reset(vec![("a".into(), waiting(1)), ("b".into(), waiting(0))], 0);
        assert_eq!(tallies.state(0).top[0].history, [(0, 1)]);
        // Unchanged: no new point.
        assert_eq!(tallies.state(500).top[0].history, [(0, 1)]);
        for (i, at) in (1..=200i64).map(|i| (i as u64, i * 1_000)) {
            tallies.update(vec![("a".into(), waiting(1 + i % 2))], at);
            tallies.state(at);
        }
        let state = tallies.state(200_000);
        let history = &state.top[0].history;
        // The first point is the last one before the reach, where the line starts.
        assert!(history[0].0 <= 200_000 - HISTORY_MS && history[1].0 > 200_000 - HISTORY_MS);
        assert_eq!(history.last(), Some(&(200_000, 1)));
        // `b` overtakes `a`: `a`'s history is forgotten, `b`'s starts.
        tallies.update(vec![("b".into(), waiting(9))], 201_000);
        let state = tallies.state(201_000);
        assert_eq!(state.top[0].name, "b");
        assert_eq!(state.top[0].history, [(201_000, 9)]);
        assert_eq!(state.history.last(), Some(&(201_000, 2, 2, 10)));
    }
}
