//! One queue as this instance's takers see it: its items in queue order, which of them are
//! claimed, which a local taker is trying and which are not due yet, kept current by one
//! persistent recursive watch on the queue, shared by every taker of the queue here.
//!
//! Without it, every take would list the queue's items and claims: two reads of every name in
//! the queue per take, a cost that grows with the queue and with its consumers (BENCHMARKS.md,
//! "Queue consumption"). With it, a take reads only the items it claims.
//!
//! The mirror is a hint, never the truth: a claim is still decided by ZooKeeper's multi-op
//! (which fails if the item changed or another claim exists), so a stale mirror costs a failed
//! attempt, never a double claim. What it must not do is *miss* an item (a taker would wait
//! while one waits), and that is why it is right:
//!
//! - The watch is set before the listing (the [Follower] announces it with `Start`, and
//!   after a reconnection or a new session with `Resync`, upon which the mirror lists again).
//!   Every change after the watch arrives as an event, in ZooKeeper's order, after the listing
//!   is applied; an event the listing already reflects sets the same state again. For each
//!   name the last event wins, and that is the state in ZooKeeper.
//! - Takes run on the same session as the watch (the instance's primary session). ZooKeeper
//!   sends a session a watch event before the reply to any later request, so when a take
//!   finds an item gone (or already claimed) the event saying so is already on its way to the
//!   mirror. The taker marks the item *taken elsewhere* meanwhile, so that no other taker tries it
//!   again; the next event about the name clears the mark, and a resync clears them all.
//! - A failure that says nothing about the item's fate (a changed version, a lost reply) puts
//!   it back.
//! - Events reach the mirror a little after ZooKeeper sent them. That never matters to a taker
//!   that finds an item, but "nothing to take" must be true at some moment of the request: a
//!   taker about to say so first has the mirror catch up ([Mirror::caught_up]: one read on the
//!   watch's session, after which every event sent before its reply is applied).
//!
//! New takeable items (created, a claim given back, a delayed item come due) wake one waiting
//! taker each; a taker that took one while more wait passes the turn on. No taker polls.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, mpsc, oneshot};

use super::{ItemName, QueuePaths, parse_name};
use crate::locked::Locked;
use crate::zk::recursive::{Change, Follower};
use crate::zk::session::ZkSession;

/// What became of an item a taker tried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tried {
    /// Taken (claimed or removed) by this taker: its events will say so.
    Taken,
    /// Gone or claimed by another: an event will say so; not tried again until then.
    TakenElsewhere,
    /// Nothing learnt (its version changed, a reply was lost): takeable as before.
    Again,
}

/// One queue's items as the watch has shown them.
#[derive(Default)]
struct State {
    /// Whether the first listing has been applied.
    synced: bool,
    /// Every item (names a queue item has), with what its name says.
    items: HashMap<String, ItemName>,
    claimed: HashSet<String>,
    /// Takeable now, in queue order: not claimed, due, not being tried nor taken elsewhere.
    ready: BTreeMap<(u8, u64), String>,
    /// Not claimed, not due yet: by due time, then queue order.
    delayed: BTreeMap<(i64, u8, u64), String>,
    /// Picked by a local taker that has not said yet what came of it.
    trying: HashSet<String>,
    /// Found gone or claimed by a taker before the event saying so arrived.
    taken_elsewhere: HashSet<String>,
}

impl State {
    /// Files an existing item in `ready` or `delayed` if it is takeable at all; `true` if it
    /// became ready.
    fn place(&mut self, name: &str, now_ms: i64) -> bool {
        let Some(parsed) = self.items.get(name).copied() else {
            return false;
        };
        if self.claimed.contains(name) || self.trying.contains(name) || self.taken_elsewhere.contains(name) {
            return false;
        }
        match parsed.due_ms {
            Some(due) if due > now_ms => {
                self.delayed
                    .insert((due, parsed.priority, parsed.seq), name.to_string());
                false
            }
            _ => self
                .ready
                .insert((parsed.priority, parsed.seq), name.to_string())
                .is_none(),
        }
    }

    fn unplace(&mut self, name: &str) {
        if let Some(parsed) = self.items.get(name) {
            self.ready.remove(&(parsed.priority, parsed.seq));
            if let Some(due) = parsed.due_ms {
                self.delayed.remove(&(due, parsed.priority, parsed.seq));
            }
        }
    }

    fn item_created(&mut self, name: &str, now_ms: i64) -> bool {
        let Some(parsed) = parse_name(name) else {
            return false; // not an item (another client's node): never taken
        };
        self.taken_elsewhere.remove(name);
        self.unplace(name);
        self.items.insert(name.to_string(), parsed);
        self.place(name, now_ms)
    }

    fn item_deleted(&mut self, name: &str) {
        self.unplace(name);
        self.items.remove(name);
        self.taken_elsewhere.remove(name);
    }

    fn claim_created(&mut self, name: &str) {
        self.unplace(name);
        self.claimed.insert(name.to_string());
        self.taken_elsewhere.remove(name);
    }

    fn claim_deleted(&mut self, name: &str, now_ms: i64) -> bool {
        self.claimed.remove(name);
        self.taken_elsewhere.remove(name);
        self.place(name, now_ms)
    }

    /// Moves delayed items that have come due to `ready`; how many.
    fn promote(&mut self, now_ms: i64) -> usize {
        let mut moved = 0;
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now_ms {
                break;
            }
            let ((_, priority, seq), name) = entry.remove_entry();
            self.ready.insert((priority, seq), name);
            moved += 1;
        }
        moved
    }

    /// Up to `count` of the first ready items, now being tried.
    fn pick(&mut self, count: usize, now_ms: i64) -> Vec<String> {
        self.promote(now_ms);
        let mut picked = Vec::with_capacity(count.min(self.ready.len()));
        while picked.len() < count {
            let Some((_, name)) = self.ready.pop_first() else {
                break;
            };
            self.trying.insert(name.clone());
            picked.push(name);
        }
        picked
    }

    /// A taker says what came of an item it picked; `true` if it is ready again.
    fn tried(&mut self, name: &str, tried: Tried, now_ms: i64) -> bool {
        self.trying.remove(name);
        match tried {
            Tried::Taken => false,
            // Only while the mirror still has it as takeable: if the event came first, the
            // mirror already knows better.
            Tried::TakenElsewhere => {
                if self.items.contains_key(name) && !self.claimed.contains(name) {
                    self.taken_elsewhere.insert(name.to_string());
                }
                false
            }
            Tried::Again => self.place(name, now_ms),
        }
    }

    /// The state as a listing shows it (the events after it follow).
    fn reset(&mut self, items: Vec<String>, claims: Vec<String>, now_ms: i64) {
        self.items = items
            .into_iter()
            .filter_map(|name| parse_name(&name).map(|parsed| (name, parsed)))
            .collect();
        self.claimed = claims.into_iter().collect();
        self.ready.clear();
        self.delayed.clear();
        self.taken_elsewhere.clear();
        let names: Vec<String> = self.items.keys().cloned().collect();
        for name in names {
            self.place(&name, now_ms);
        }
        self.synced = true;
    }
}

/// One queue's mirror on this instance; see the module's documentation.
pub struct Mirror {
    state: Mutex<State>,
    /// One permit per item that became takeable: one waiting taker is woken for each.
    item: Notify,
    /// Woken when the mirror (re)synced, for every waiting taker.
    synced: Notify,
    /// Takers using the mirror now; the mirror's task ends some time after the last left.
    takers: AtomicUsize,
    /// Woken when the last taker leaves.
    idle: Notify,
    /// Requests to catch up with ZooKeeper, to the mirror's task.
    catch_up: mpsc::UnboundedSender<oneshot::Sender<bool>>,
}

impl Mirror {
    fn new() -> (Mirror, mpsc::UnboundedReceiver<oneshot::Sender<bool>>) {
        let (catch_up, asked) = mpsc::unbounded_channel();
        let mirror = Mirror {
            state: Mutex::default(),
            item: Notify::new(),
            synced: Notify::new(),
            takers: AtomicUsize::new(0),
            idle: Notify::new(),
            catch_up,
        };
        (mirror, asked)
    }

    /// Brings the mirror up to everything ZooKeeper had done when this was called (one read on
    /// the watch's session, shared by the takers asking at once); `false` if it could not (no
    /// session). A taker asks before it answers that there is nothing to take, so that the
    /// answer is as of a moment during its request, never of an older mirror.
    pub async fn caught_up(&self) -> bool {
        let (asker, answer) = oneshot::channel();
        if self.catch_up.send(asker).is_err() {
            return false;
        }
        answer.await.unwrap_or(false)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Whether the first listing is in.
    pub fn is_synced(&self) -> bool {
        self.state().synced
    }

    /// Resolves when the mirror (re)synced; register (`enable`) before checking [Self::is_synced].
    pub fn synced(&self) -> tokio::sync::futures::Notified<'_> {
        self.synced.notified()
    }

    /// Resolves when an item became takeable (one taker per item).
    pub fn item_ready(&self) -> tokio::sync::futures::Notified<'_> {
        self.item.notified()
    }

    /// Up to `count` items to try, first in queue order, each tried by this taker alone until
    /// it says what came of it with [Self::tried]; whether more are ready besides; and the
    /// earliest time a delayed item comes due.
    pub fn pick(&self, count: usize) -> Picked {
        let now = crate::time::now_ms();
        let mut state = self.state();
        let names = state.pick(count, now);
        Picked {
            names,
            more: !state.ready.is_empty(),
            next_due_ms: state.delayed.first_key_value().map(|(key, _)| key.0),
        }
    }

    /// What came of a picked item.
    pub fn tried(&self, name: &str, tried: Tried) {
        let ready = self.state().tried(name, tried, crate::time::now_ms());
        if ready {
            self.item.notify_one();
        }
    }

    /// Passes a taker's turn on: more items wait than it took.
    pub fn pass_on(&self) {
        self.item.notify_one();
    }

    fn apply(&self, dir: &QueuePaths, path: &str, kind: &str) {
        let now = crate::time::now_ms();
        let child = |parent: &str| {
            path.strip_prefix(parent)
                .and_then(|rest| rest.strip_prefix('/'))
                .filter(|name| !name.contains('/'))
        };
        let mut state = self.state();
        let ready = if let Some(name) = child(&dir.items) {
            match kind {
                "created" => state.item_created(name, now),
                "deleted" => {
                    state.item_deleted(name);
                    false
                }
                _ => false, // data changed: a claim raised its delivery count
            }
        } else if let Some(name) = child(&dir.claims) {
            match kind {
                "created" => {
                    state.claim_created(name);
                    false
                }
                "deleted" => state.claim_deleted(name, now),
                _ => false,
            }
        } else if kind == "deleted" && (path == dir.items || path == dir.dir) {
            // The queue went (the janitor removes empty ones): so did everything in it.
            state.reset(Vec::new(), Vec::new(), now);
            false
        } else {
            false
        };
        drop(state);
        if ready {
            self.item.notify_one();
        }
    }

    /// Applies a change the watch reported: a start or resync lists the queue again.
    async fn see(&self, zk: &ZkSession, queue: &str, paths: &QueuePaths, change: Change) {
        match change {
            Change::Start { .. } | Change::Resync { .. } => {
                let Ok(session) = zk.connected().await else {
                    return; // the session's end brings another resync
                };
                let list = |path: String| {
                    let client = session.client().clone();
                    async move { crate::zk::children(&client, &path).await }
                };
                match tokio::join!(list(paths.items.clone()), list(paths.claims.clone())) {
                    (Ok(items), Ok(claims)) => self.reset(items, claims),
                    (Err(err), _) | (_, Err(err)) => {
                        tracing::warn!(%queue, error = %err, "queue listing failed; waiting for the session's next state");
                    }
                }
            }
            Change::Node { kind, path, .. } => self.apply(paths, &path, kind),
        }
    }

    fn reset(&self, items: Vec<String>, claims: Vec<String>) {
        self.state().reset(items, claims, crate::time::now_ms());
        self.synced.notify_waiters();
        // Whatever is ready now wakes one taker (which passes the turn on if more wait).
        self.item.notify_one();
    }
}

/// What [Mirror::pick] found.
pub struct Picked {
    pub names: Vec<String>,
    pub more: bool,
    pub next_due_ms: Option<i64>,
}

/// The mirrors of this instance's queues: one per queue with takers, kept a while after the
/// last taker left (`linger`), a bounded number of them at once (`max_lingering`).
#[derive(Clone)]
pub struct Mirrors {
    zk: ZkSession,
    all: Arc<Mutex<HashMap<String, Arc<Mirror>>>>,
    lingering: Arc<AtomicUsize>,
    linger: std::time::Duration,
    max_lingering: usize,
}

/// A taker's use of a mirror: counted in while it lives.
pub struct Using(Arc<Mirror>);

impl std::ops::Deref for Using {
    type Target = Mirror;
    fn deref(&self) -> &Mirror {
        &self.0
    }
}

impl Using {
    /// The mirror itself, for work that may outlive this use.
    pub fn mirror(&self) -> Arc<Mirror> {
        self.0.clone()
    }
}

impl Drop for Using {
    fn drop(&mut self) {
        if self.0.takers.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_one();
        }
    }
}

impl Mirrors {
    pub fn new(zk: ZkSession, linger: std::time::Duration, max_lingering: usize) -> Mirrors {
        Mirrors {
            zk,
            all: Arc::default(),
            lingering: Arc::default(),
            linger,
            max_lingering,
        }
    }

    /// How many mirrors exist now (with takers or lingering).
    pub fn count(&self) -> usize {
        self.all.locked().len()
    }

    /// The mirror of `queue`, counting the caller in as a taker; started if none is kept.
    pub fn using(&self, queue: &str, paths: &QueuePaths) -> Using {
        let mut all = self.all.locked();
        if let Some(mirror) = all.get(queue) {
            // Counted under the map's lock, which the task takes to end: it never ends with a
            // taker counted in.
            mirror.takers.fetch_add(1, Ordering::SeqCst);
            return Using(mirror.clone());
        }
        let (mirror, catch_up) = Mirror::new();
        let mirror = Arc::new(mirror);
        mirror.takers.fetch_add(1, Ordering::SeqCst);
        all.insert(queue.to_string(), mirror.clone());
        tokio::spawn(keep(
            self.clone(),
            queue.to_string(),
            paths.clone(),
            mirror.clone(),
            catch_up,
        ));
        Using(mirror)
    }

    /// Removes `mirror` if it is still `queue`'s and nobody uses it; `true` if removed.
    fn end(&self, queue: &str, mirror: &Arc<Mirror>) -> bool {
        let mut all = self.all.locked();
        if mirror.takers.load(Ordering::SeqCst) != 0 {
            return false;
        }
        if all.get(queue).is_some_and(|kept| Arc::ptr_eq(kept, mirror)) {
            all.remove(queue);
        }
        true
    }
}

/// Keeps a mirror current while it is used, and a while after (see [Mirrors]); answers the
/// takers' requests to catch up ([Mirror::caught_up]).
async fn keep(
    mirrors: Mirrors,
    queue: String,
    paths: QueuePaths,
    mirror: Arc<Mirror>,
    mut catch_up: mpsc::UnboundedReceiver<oneshot::Sender<bool>>,
) {
    let zk = mirrors.zk.clone();
    let mut follower = Follower::new(&zk, &paths.dir);
    // Since the last taker left: until when the mirror lingers, and whether it holds one of
    // the lingering places.
    let mut lingering: Option<(tokio::time::Instant, bool)> = None;
    let release = |lingering: &mut Option<(tokio::time::Instant, bool)>| {
        if let Some((_, true)) = lingering.take() {
            mirrors.lingering.fetch_sub(1, Ordering::SeqCst);
        }
    };
    loop {
        let idle = mirror.idle.notified();
        tokio::pin!(idle);
        idle.as_mut().enable();
        if mirror.takers.load(Ordering::SeqCst) > 0 {
            release(&mut lingering);
        } else if lingering.is_none() {
            let place = mirrors.lingering.fetch_add(1, Ordering::SeqCst) < mirrors.max_lingering;
            if !place {
                mirrors.lingering.fetch_sub(1, Ordering::SeqCst);
            }
            let now = tokio::time::Instant::now();
            lingering = Some((if place { now + mirrors.linger } else { now }, place));
        }
        let until = lingering.map(|(until, _)| until);
        tokio::select! {
            change = follower.next() => mirror.see(&zk, &queue, &paths, change).await,
            asked = catch_up.recv() => {
                let Some(first) = asked else { break };
                // Every request queued now is answered by the same read.
                let mut asking = vec![first];
                while let Ok(more) = catch_up.try_recv() {
                    asking.push(more);
                }
                let caught_up = match follower.caught_up().await {
                    Ok(changes) => {
                        for change in changes {
                            mirror.see(&zk, &queue, &paths, change).await;
                        }
                        true
                    }
                    Err(_) => false,
                };
                for asker in asking {
                    let _ = asker.send(caught_up);
                }
            }
            () = &mut idle => {}
            () = async { tokio::time::sleep_until(until.unwrap_or_else(tokio::time::Instant::now)).await }, if until.is_some() => {
                if mirrors.end(&queue, &mirror) {
                    break;
                }
            }
        }
    }
    release(&mut lingering);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(seq: u64) -> String {
        format!("queue-{seq:010}")
    }

    #[test]
    fn items_are_picked_in_order_once_and_claims_hide_them() {
        let mut state = State::default();
        state.reset(vec![name(3), name(1), name(2)], vec![name(1)], 0);
        assert_eq!(state.pick(2, 0), vec![name(2), name(3)]);
        assert!(state.pick(1, 0).is_empty(), "each item goes to one taker");
        // The claim given back: item 1 is ready again, first.
        assert!(state.claim_deleted(&name(1), 0));
        assert_eq!(state.pick(5, 0), vec![name(1)]);
    }

    #[test]
    fn an_item_found_gone_is_not_tried_again_until_an_event_says() {
        let mut state = State::default();
        state.reset(vec![name(1), name(2)], vec![], 0);
        let picked = state.pick(1, 0);
        assert!(!state.tried(&picked[0], Tried::TakenElsewhere, 0));
        assert_eq!(state.pick(5, 0), vec![name(2)], "the stale item is passed over");
        state.item_deleted(&name(1));
        assert!(state.taken_elsewhere.is_empty(), "the event clears the mark");
        // A failure that tells nothing puts the item back.
        assert!(state.tried(&name(2), Tried::Again, 0));
        assert_eq!(state.pick(5, 0), vec![name(2)]);
    }

    #[test]
    fn a_stale_mark_after_the_event_is_not_kept() {
        let mut state = State::default();
        state.reset(vec![name(1)], vec![], 0);
        state.pick(1, 0);
        state.claim_created(&name(1)); // the event came before the taker said
        state.tried(&name(1), Tried::TakenElsewhere, 0);
        assert!(state.taken_elsewhere.is_empty());
        assert!(state.claim_deleted(&name(1), 0), "given back: takeable again");
    }

    #[test]
    fn delayed_items_wait_for_their_time() {
        let mut state = State::default();
        let late = "queue-|3E8|0000000001".to_string(); // due at 1,000 ms
        state.reset(vec![late.clone(), name(2)], vec![], 0);
        assert_eq!(state.pick(5, 999), vec![name(2)]);
        assert_eq!(state.delayed.first_key_value().map(|(k, _)| k.0), Some(1000));
        assert_eq!(state.pick(5, 1000), vec![late]);
    }

    #[test]
    fn events_applied_again_after_a_listing_end_in_the_last_state() {
        // Created then deleted before the listing (which has neither), applied after it.
        let mut state = State::default();
        state.reset(vec![], vec![], 0);
        state.item_created(&name(7), 0);
        state.item_deleted(&name(7));
        assert!(state.pick(5, 0).is_empty());
        assert!(state.items.is_empty());
    }
}
