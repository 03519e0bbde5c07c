//! A linearizability checker: is there one order of the recorded operations, consistent with
//! real time (an operation that completed before another began comes first), in which each
//! operation does what a single register (or a lock's holder) would have done?
//!
//! The search is Wing & Gong's, with Lowe's memoisation of (operations linearized so far,
//! state) as Porcupine does it: walk the history's events in time order; at a call, try to
//! linearize the operation now (the model accepts its result in the current state) and restart
//! from the first event left; at a return whose call could not be placed, undo the last
//! placement and try the next call instead. A register's histories are checked one key at a
//! time (linearizability is compositional: Herlihy & Wing's locality).
//!
//! An operation whose outcome is unknown (its answer never came) has no return: it may take
//! effect at any time after its call, or never, which putting it last always allows.

use std::collections::HashSet;

/// What one operation did, with its result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// A value was written (`PUT`).
    Write(u64),
    /// A compare-and-set from `from` to `to` (an `If-Match` with the ETag read with `from`):
    /// `Some(true)` applied (2xx), `Some(false)` refused (412), `None` unknown.
    Cas { from: u64, to: u64, applied: Option<bool> },
    /// A read: the value, or none (404).
    Read(Option<u64>),
    /// A lock granted to client `c`.
    Acquire(u64),
    /// Client `c` released the lock.
    Release(u64),
    /// A read of the lock's holder: the client, or nobody.
    Holder(Option<u64>),
}

/// One recorded operation: its call and (if it came) its return, in nanoseconds since the
/// history began.
#[derive(Clone, Debug)]
pub struct Call {
    pub op: Op,
    pub start: u64,
    pub end: Option<u64>,
    /// Who did it, through which instance: for the report.
    pub by: String,
}

/// The register's (or the holder's) value.
type State = Option<u64>;

/// The states `op` may leave `state` in (none: it cannot happen in `state`).
fn step(state: State, op: &Op) -> Vec<State> {
    match *op {
        Op::Write(v) => vec![Some(v)],
        Op::Cas { from, to, applied } => match (state == Some(from), applied) {
            (true, Some(true)) => vec![Some(to)],
            (false, Some(false)) => vec![state],
            (true, None) => vec![Some(to), state],
            (false, None) => vec![state],
            _ => vec![],
        },
        Op::Read(v) | Op::Holder(v) => {
            if state == v {
                vec![state]
            } else {
                vec![]
            }
        }
        Op::Acquire(c) => {
            if state.is_none() {
                vec![Some(c)]
            } else {
                vec![]
            }
        }
        Op::Release(c) => {
            if state == Some(c) {
                vec![None]
            } else {
                vec![]
            }
        }
    }
}

/// Which operations are placed, as bits.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Placed(Vec<u64>);

impl Placed {
    fn new(n: usize) -> Placed {
        Placed(vec![0; n.div_ceil(64)])
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn clear(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }
}

/// Why a history is not linearizable.
#[derive(Debug)]
pub struct Violation {
    /// The operation that could not be placed anywhere: its return came before any order
    /// could include it.
    pub stuck: Call,
    /// The operations that completed before it began, last ones first (what it should have
    /// seen).
    pub before: Vec<Call>,
    /// How many operations the longest consistent prefix placed, of how many.
    pub placed: usize,
    pub of: usize,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "not linearizable ({} of {} operations placed): {:?} by {} in [{}, {:?}] ns; before it completed:",
            self.placed, self.of, self.stuck.op, self.stuck.by, self.stuck.start, self.stuck.end
        )?;
        for call in &self.before {
            write!(f, " {:?} by {} ending {:?};", call.op, call.by, call.end)?;
        }
        Ok(())
    }
}

/// Checks one register's (or one lock's) history from the state `initial`.
pub fn check(calls: &[Call], initial: State) -> Result<(), Violation> {
    let n = calls.len();
    if n == 0 {
        return Ok(());
    }
    // Events: (time, is_return, op). Calls before returns at the same instant: concurrent.
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (i, call) in calls.iter().enumerate() {
        events.push((call.start, false, i));
        events.push((call.end.unwrap_or(u64::MAX), true, i));
    }
    events.sort();
    // A doubly linked list over the events, with a head at index `len`.
    let len = events.len();
    let head = len;
    let mut next: Vec<usize> = (1..=len).chain(std::iter::once(0)).collect();
    let mut prev: Vec<usize> = std::iter::once(head).chain(0..len).collect();
    next[head] = 0;
    next[len - 1] = usize::MAX;
    prev[0] = head;
    let mut return_of = vec![0; n];
    for (e, &(_, is_return, i)) in events.iter().enumerate() {
        if is_return {
            return_of[i] = e;
        }
    }
    let unlink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, e: usize| {
        let (p, q) = (prev[e], next[e]);
        next[p] = q;
        if q != usize::MAX {
            prev[q] = p;
        }
    };
    let relink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, e: usize| {
        let (p, q) = (prev[e], next[e]);
        next[p] = e;
        if q != usize::MAX {
            prev[q] = e;
        }
    };

    let mut placed = Placed::new(n);
    let mut state = initial;
    let mut seen: HashSet<(Placed, State)> = HashSet::new();
    // (call event, state before it, which of its successor states it took)
    let mut stack: Vec<(usize, State, usize)> = Vec::new();
    let mut deepest = (0, 0usize);
    let mut entry = next[head];
    let mut alternative = 0;
    loop {
        if next[head] == usize::MAX {
            return Ok(());
        }
        let (_, is_return, i) = events[entry];
        if !is_return {
            let successors = step(state, &calls[i].op);
            let mut moved = false;
            while alternative < successors.len() {
                let after = successors[alternative];
                placed.set(i);
                if seen.insert((placed.clone(), after)) {
                    stack.push((entry, state, alternative));
                    state = after;
                    unlink(&mut next, &mut prev, entry);
                    unlink(&mut next, &mut prev, return_of[i]);
                    entry = next[head];
                    alternative = 0;
                    moved = true;
                    break;
                }
                placed.clear(i);
                alternative += 1;
            }
            if !moved {
                entry = next[entry];
                alternative = 0;
            }
        } else {
            if stack.len() >= deepest.0 {
                deepest = (stack.len(), i);
            }
            let Some((call, before, taken)) = stack.pop() else {
                let stuck = calls[deepest.1].clone();
                let mut before: Vec<Call> = calls
                    .iter()
                    .filter(|c| c.end.is_some_and(|end| end < stuck.start))
                    .cloned()
                    .collect();
                before.sort_by_key(|c| std::cmp::Reverse(c.end));
                before.truncate(4);
                return Err(Violation {
                    stuck,
                    before,
                    placed: deepest.0,
                    of: n,
                });
            };
            let (_, _, j) = events[call];
            state = before;
            placed.clear(j);
            relink(&mut next, &mut prev, return_of[j]);
            relink(&mut next, &mut prev, call);
            entry = call;
            alternative = taken + 1;
        }
    }
}
