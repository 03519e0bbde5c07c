//! What lets an instance vouch for the leases it keeps: its heartbeat, the notices of takeovers,
//! and ZooKeeper's clock.
//!
//! Every [HEARTBEAT] the instance touches its keeper node `<root>/keepers/<id>` on the keeper's
//! session ([keepers::touch]), a session with a thread of its own that carries nothing else
//! ([crate::zk::session::Apart]: request traffic queues neither in front of the heartbeat at
//! ZooKeeper nor in front of its task in the process); the node's `mtime` is then ZooKeeper's
//! clock, and its last value is when the instance was last seen alive. Before the heartbeat counts, the instance acts on
//! the notices of takeovers under that node (it drops those leases), which the same session
//! watches: ZooKeeper sends a session a watch event before the reply to any later request of
//! that session, and zookeeper-client hands both over in that order, so once the reply to a
//! heartbeat is in, every takeover ordered before that heartbeat is known here. An instance is
//! *fresh* while the last heartbeat that was answered was sent less than [FRESH] ago and its
//! registration is in place; only then does it acknowledge a keepalive. So a keepalive this
//! instance acknowledges is never later than [FRESH] after a takeover it did not know of, which
//! is the margin the taker gives (see [super::takeover]).
//!
//! # The bound
//! [FRESH] (3 s) is three heartbeats: an instance stops vouching once two in a row went
//! unanswered for a second each. It is independent of the session timeout (10 s by default,
//! 2 s at the least): the takeover margin is counted from the keeper node's `mtime`, not from
//! the session's end. What must hold is only that a live instance's heartbeat is answered
//! within [FRESH]; on the keeper's own session and thread what can delay it is ZooKeeper
//! itself (a leader election stops every answer), and a process given no CPU at all for that
//! long (measured: at a 3% CPU quota under 128 clients, no answer says it cannot vouch;
//! `tests/it/throttled.rs`).
//!
//! After a new session, or when its keeper node had to be made again (its notices went with
//! it), the instance reads the record of every lease it keeps before it is fresh again, and
//! drops those another instance keeps now: a watch does not outlive its session.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, Weak};

use crate::zk::{Client, WatchedEvent};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{FRESH, HEARTBEAT, Registry};
use crate::locked::Locked;
use crate::recipes::engine::{keepers, record};
use crate::zk::session::ZkSession;

/// This instance's standing as a keeper.
pub struct Keeping {
    /// Whether the instance's registration is in place.
    registered: watch::Receiver<bool>,
    /// The primary session, and the generation of it whose takeovers are known here (every
    /// kept lease's record read again after it began, see [run]).
    zk: ZkSession,
    checked: std::sync::atomic::AtomicU64,
    /// When the last heartbeat that was answered had been sent.
    fresh_from: Mutex<Option<Instant>>,
    /// ZooKeeper's clock at the last heartbeat (its `mtime`, ms) and when that answer came.
    clock: Mutex<Option<(i64, Instant)>>,
    /// Counts the heartbeats that counted.
    beats: watch::Sender<u64>,
}

impl Keeping {
    pub fn new(registered: watch::Receiver<bool>, zk: ZkSession) -> Keeping {
        Keeping {
            registered,
            zk,
            checked: std::sync::atomic::AtomicU64::new(0),
            fresh_from: Mutex::new(None),
            clock: Mutex::new(None),
            beats: watch::Sender::new(0),
        }
    }

    /// Returns once this instance is fresh (see [Keeping::is_fresh]), looking again after each
    /// heartbeat and each change of its registration.
    pub async fn fresh(&self) {
        let mut registered = self.registered.clone();
        let mut beats = self.beats.subscribe();
        while !self.is_fresh() {
            tokio::select! {
                _ = beats.changed() => {}
                _ = registered.changed() => {}
            }
        }
    }

    /// Whether this instance may acknowledge keepalives now (see the module's docs).
    pub fn is_fresh(&self) -> bool {
        let checked = self.checked.load(std::sync::atomic::Ordering::SeqCst);
        *self.registered.borrow()
            && self.zk.status().generation == checked
            && lock(&self.fresh_from).is_some_and(|sent| sent.elapsed() < FRESH)
    }

    /// Returns after the next heartbeat that counts.
    pub async fn next_beat(&self) {
        let mut beats = self.beats.subscribe();
        let _ = beats.changed().await;
    }

    /// ZooKeeper's clock now (ms since the epoch), as the heartbeats tell: `None` before the
    /// first.
    pub fn server_now(&self) -> Option<i64> {
        lock(&self.clock).map(|(ms, at)| ms + at.elapsed().as_millis() as i64)
    }
}

fn lock<T: Copy>(cell: &Mutex<T>) -> T {
    *cell.locked()
}

fn set<T>(cell: &Mutex<T>, value: T) {
    *cell.locked() = value;
}

type Notices = Pin<Box<dyn Future<Output = WatchedEvent> + Send>>;

/// The heartbeat loop, for as long as the registry lives.
pub(super) async fn run(registry: Weak<Registry>, zk: ZkSession) {
    let mut notices: Option<Notices> = None;
    let mut checked_generation = 0;
    let mut announced = 0;
    loop {
        let sent = Instant::now();
        let Some(keeper) = registry.upgrade() else {
            return;
        };
        if let Ok(session) = zk.current() {
            let client = session.client();
            let me = keeper.instance.clone();
            match keepers::touch(client, &keeper.root, &me).await {
                Ok((mtime, made)) => {
                    set(&keeper.keeping.clock, Some((mtime, Instant::now())));
                    let mut checked = true;
                    if made || session.generation != checked_generation {
                        notices = None;
                        // The records were written on the lanes' sessions, maybe through
                        // other servers: a `sync` first, or a lease made a moment ago could
                        // read as gone and be dropped.
                        checked = session.sync().await.is_ok()
                            && record::prepare(client, &keeper.root).await.is_ok()
                            && keeper.check_kept(client).await;
                        if checked {
                            checked_generation = session.generation;
                            keeper
                                .keeping
                                .checked
                                .store(checked_generation, std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                    if checked && keeper.act_on_notices(client, &mut notices).await {
                        set(&keeper.keeping.fresh_from, Some(sent));
                        keeper.keeping.beats.send_modify(|beats| *beats += 1);
                        if announced != checked_generation {
                            announced = checked_generation;
                            tracing::info!(generation = announced, "keeping leases on this session");
                        }
                    }
                }
                Err(err) => tracing::warn!(error = %err, "heartbeat failed"),
            }
        }
        drop(keeper);
        // The next beat; sooner when a new session comes (a first one, or after an expiry).
        let mut status = zk.subscribe();
        let generation = status.borrow_and_update().generation;
        let _ = tokio::time::timeout_at(
            sent + HEARTBEAT,
            status.wait_for(|s| s.generation != generation && s.client.is_some()),
        )
        .await;
    }
}

impl Registry {
    /// Drops the leases whose takeover a notice says, once the notices' watch has fired (or is
    /// not set), and sets it again. `false` if the notices could not be read.
    async fn act_on_notices(&self, client: &Client, notices: &mut Option<Notices>) -> bool {
        let fired = match notices {
            None => true,
            Some(watch) => futures::poll!(watch.as_mut()).is_ready(),
        };
        if !fired {
            return true;
        }
        match keepers::notices(client, &self.root, &self.instance).await {
            Ok((ids, watcher)) => {
                *notices = Some(Box::pin(watcher.changed()));
                for id in &ids {
                    self.drop_here(id);
                }
                keepers::clear_notices(client, &self.root, &self.instance, &ids).await;
                true
            }
            Err(err) => {
                tracing::warn!(error = %err, "could not read the notices of takeovers");
                *notices = None;
                false
            }
        }
    }

    /// Reads the record of every lease kept here and drops those that another instance keeps
    /// now, or that are gone. A record that says this instance ended the lease is left to the
    /// end under way here ([Registry::finish]): dropped, the lease's last requests would be
    /// told it moved instead of that it ended. `false` if ZooKeeper could not tell.
    async fn check_kept(&self, client: &Client) -> bool {
        let kept: Vec<(String, String, i32)> = self
            .table()
            .live
            .values()
            .filter_map(|l| l.version().map(|v| (l.id.clone(), l.path.clone(), v)))
            .collect();
        let paths: Vec<String> = kept.iter().map(|(_, path, _)| path.clone()).collect();
        let Ok(read) = record::read_several(client, &paths).await else {
            return false;
        };
        for ((id, _, version), found) in kept.iter().zip(read) {
            let still = found.is_some_and(|found| {
                // Live at the version kept here, or ended here (the end one version past it).
                let expected = *version + i32::from(found.record.ended.is_some());
                found.record.keeper == *self.instance && found.version == expected
            });
            if !still {
                self.drop_here(id);
            }
        }
        true
    }
}
