//! Admission: how many requests do their ZooKeeper work at once, and shedding by queueing
//! delay.
//!
//! A request to the API takes one of `slots` before its handler runs ([Admission::admit], in
//! `http/limits.rs`) and keeps it until its answer is ready, or until it starts waiting by
//! design ([park]: a contender queued behind a holder, a long poll waiting for a change), so
//! that a long poll counts only for the work it does. The requests beyond `slots` wait for one
//! in arrival order.
//!
//! Why a bound at all: without one every request goes straight to ZooKeeper, and under
//! overload the queue is ZooKeeper's (and the runtime's), where zkgate cannot see it: every
//! request is served, late, and a client learns of the overload from its timeouts. With one,
//! the queue is here, where a request's wait is measured from its arrival
//! ([crate::listen::Arrived]) to the start of its work, and a request that would be served
//! too late is refused at once (503 with `Retry-After`) at the cost of its parse.
//!
//! How long a request may wait is CoDel's rule (Nichols and Jacobson, "Controlling Queue
//! Delay", ACM Queue 2012), in the form that "Fail at Scale" (Maurer, ACM Queue 2015)
//! describes for a server's request queue: a queue that has been empty at some moment within
//! the last `interval` is a burst, and a request may wait up to `interval` for its slot; a
//! queue that has not been empty for `interval` is standing, and a request may wait only
//! `target`. Those that waited longer are refused. A burst is absorbed whole; a standing
//! queue is drained to where what is served is served promptly. The defaults (250 ms and
//! 20 ms) are longer than that paper's (100 ms and 5 ms, for RPCs served in microseconds): a
//! zkgate request takes a ZooKeeper round trip or two, several milliseconds on a busy machine,
//! and its clients come in bursts (many workers taking their locks at once) that are to be
//! served. Longer still (1 s) and, under overload, the requests to be refused waited so long
//! first that the clients ran out of connections (BENCHMARKS.md, issue 33).
//!
//! The operations that give something back (a `DELETE`, a keepalive, an ack or nack, leaving
//! a barrier) are never refused here and take no slot: refusing them under overload would
//! hold locks and claims longer, which is more load, and a keepalive refused ends a lease.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// The settings of [Admission].
#[derive(Clone, Copy, Debug)]
pub struct AdmissionSettings {
    /// Requests doing their work at once.
    pub slots: usize,
    /// How long a request may wait for a slot while the queue stands (0: as long as it takes).
    pub target: Duration,
    /// How long a queue may go without emptying before it counts as standing, and how long a
    /// request may wait in a burst.
    pub interval: Duration,
}

/// The slots and their queue (one per instance).
pub struct Admission {
    settings: AdmissionSettings,
    slots: Arc<Semaphore>,
    /// Requests waiting for a slot now.
    waiting: AtomicUsize,
    /// When the queue was last seen empty, in microseconds since `epoch`.
    last_empty: AtomicU64,
    epoch: Instant,
}

/// A slot held by a request: given back when dropped (or [park]ed).
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
}

/// Why a request was not admitted.
#[derive(Debug)]
pub struct Shed {
    /// How long it waited (from its arrival).
    pub waited: Duration,
    /// How long it might have waited.
    pub allowed: Duration,
}

impl Admission {
    pub fn new(settings: AdmissionSettings) -> Admission {
        let epoch = Instant::now();
        Admission {
            slots: Arc::new(Semaphore::new(settings.slots.max(1))),
            settings,
            waiting: AtomicUsize::new(0),
            last_empty: AtomicU64::new(0),
            epoch,
        }
    }

    /// Requests doing their work now (holding a slot).
    pub fn in_service(&self) -> usize {
        self.settings.slots.max(1) - self.slots.available_permits()
    }

    /// A slot for a request that arrived at `arrived`, or [Shed] if it waited (or would wait)
    /// longer than the queue allows now.
    pub async fn admit(&self, arrived: Instant) -> Result<Slot, Shed> {
        let now = Instant::now();
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            if self.waiting.load(Ordering::Relaxed) == 0 {
                self.saw_empty(now);
            }
            return Ok(Slot { _permit: permit });
        }
        // Boxed: a wait holds a timer and the semaphore's waiter, which every request's future
        // would otherwise carry (and move) whether it waits or not.
        Box::pin(self.queue(arrived, now)).await
    }

    /// A slot after waiting in the queue (none was free at `now`), or [Shed].
    async fn queue(&self, arrived: Instant, now: Instant) -> Result<Slot, Shed> {
        let allowed = self.allowed(now);
        let deadline = arrived + allowed;
        let acquired = self.wait(self.slots.clone().acquire_owned());
        let permit = if self.settings.target.is_zero() {
            acquired.await
        } else if now >= deadline {
            return Err(Shed {
                waited: now - arrived,
                allowed,
            });
        } else {
            let shed = |_| Shed {
                waited: arrived.elapsed(),
                allowed,
            };
            tokio::time::timeout_at(deadline, acquired).await.map_err(shed)?
        };
        Ok(Slot {
            _permit: permit.expect("never closed"),
        })
    }

    /// `acquired`, counted among the waiting meanwhile. The queue is empty again when the last
    /// waiter leaves it with a slot (one shed leaves it standing: the next request finds it so).
    async fn wait<F, T>(&self, acquired: F) -> F::Output
    where
        F: std::future::Future<Output = Result<T, tokio::sync::AcquireError>>,
    {
        struct Waiting<'a> {
            admission: &'a Admission,
            admitted: bool,
        }
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                let left = self.admission.waiting.fetch_sub(1, Ordering::Relaxed) - 1;
                if self.admitted && left == 0 {
                    self.admission.saw_empty(Instant::now());
                }
            }
        }
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let mut waiting = Waiting {
            admission: self,
            admitted: false,
        };
        let acquired = acquired.await;
        waiting.admitted = acquired.is_ok();
        acquired
    }

    /// How long a request arriving now may wait: `interval` in a burst, `target` once the
    /// queue has not been empty for `interval`.
    fn allowed(&self, now: Instant) -> Duration {
        let empty = self.epoch + Duration::from_micros(self.last_empty.load(Ordering::Relaxed));
        match now.saturating_duration_since(empty) >= self.settings.interval {
            true => self.settings.target,
            false => self.settings.interval,
        }
    }

    fn saw_empty(&self, now: Instant) {
        let micros = now.saturating_duration_since(self.epoch).as_micros() as u64;
        self.last_empty.fetch_max(micros, Ordering::Relaxed);
    }
}

tokio::task_local! {
    /// The slot of the request this task serves, for [park].
    static HELD: RefCell<Option<Slot>>;
}

/// Runs `serve` (a request's handling) holding `slot`, which [park] may give back early.
pub async fn holding<F: std::future::Future>(slot: Slot, serve: F) -> F::Output {
    HELD.scope(RefCell::new(Some(slot)), serve).await
}

/// The request this task serves starts waiting by design (for a grant, for a change): its
/// slot goes back to the queue, and the rest of the request is not counted as in service.
/// Does nothing outside a request, or for one that holds no slot.
pub fn park() {
    let _ = HELD.try_with(|held| held.borrow_mut().take());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(slots: usize) -> Admission {
        Admission::new(AdmissionSettings {
            slots,
            target: Duration::from_millis(5),
            interval: Duration::from_millis(100),
        })
    }

    /// A request arriving now, waiting for its slot in a task of its own.
    fn queue_one(admission: &Arc<Admission>) -> tokio::task::JoinHandle<Result<(), Shed>> {
        let admission = admission.clone();
        tokio::spawn(async move { admission.admit(Instant::now()).await.map(|_| ()) })
    }

    #[tokio::test(start_paused = true)]
    async fn a_free_slot_is_taken_at_once_and_given_back_on_drop() {
        let admission = admission(2);
        let a = admission.admit(Instant::now()).await.expect("a slot");
        let _b = admission.admit(Instant::now()).await.expect("a slot");
        assert_eq!(admission.in_service(), 2);
        drop(a);
        assert_eq!(admission.in_service(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_waits_up_to_the_interval_and_a_standing_queue_only_the_target() {
        let admission = Arc::new(admission(1));
        let held = admission.admit(Instant::now()).await.expect("a slot");
        // A burst: the queue was empty a moment ago, so a request may wait 100 ms...
        let waiter = queue_one(&admission);
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(held);
        waiter.await.expect("task").expect("admitted within the interval");
        // ...and no longer.
        let held = admission.admit(Instant::now()).await.expect("a slot");
        let shed = admission.admit(Instant::now()).await.expect_err("shed after 100 ms");
        assert_eq!(shed.allowed, Duration::from_millis(100));
        // The queue has not been empty for over 100 ms now: a standing queue, 5 ms.
        let shed = admission.admit(Instant::now()).await.expect_err("shed");
        assert_eq!(shed.allowed, Duration::from_millis(5));
        // A request that has waited past the target before asking is refused at once.
        let arrived = Instant::now();
        tokio::time::sleep(Duration::from_millis(6)).await;
        let shed = admission.admit(arrived).await.expect_err("shed at once");
        assert_eq!(shed.waited, Duration::from_millis(6));
        // Once the queue empties, bursts are absorbed again.
        drop(held);
        let _held = admission.admit(Instant::now()).await.expect("a slot");
        let waiter = queue_one(&admission);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "waits in a burst");
    }

    #[tokio::test(start_paused = true)]
    async fn a_parked_request_gives_its_slot_back() {
        let admission = admission(1);
        let slot = admission.admit(Instant::now()).await.expect("a slot");
        holding(slot, async {
            assert_eq!(admission.in_service(), 1);
            park();
            assert_eq!(admission.in_service(), 0);
            park(); // twice: nothing more to give back
        })
        .await;
        park(); // outside a request: nothing
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_target_never_sheds() {
        let admission = Arc::new(Admission::new(AdmissionSettings {
            slots: 1,
            target: Duration::ZERO,
            interval: Duration::from_millis(100),
        }));
        let held = admission.admit(Instant::now()).await.expect("a slot");
        let waiter = queue_one(&admission);
        tokio::time::sleep(Duration::from_secs(10)).await;
        drop(held);
        waiter.await.expect("task").expect("admitted however long it waited");
    }
}
