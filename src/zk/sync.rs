//! Linearizable reads: a ZooKeeper `sync` before the read, shared by the reads that may share
//! it.
//!
//! # Why a read needs one
//! A session reads from the server it is connected to, and a follower applies a committed write
//! a little after the leader and the other followers do. So a read on zkgate's session can miss
//! a write that another session (another instance, behind another server) has already been told
//! is done: ZooKeeper's reads are sequentially consistent, not linearizable. `sync` asks the
//! session's server to catch up with the leader: the leader answers it after every write it has
//! committed so far, the server passes the answer on once it has applied them, and a session's
//! requests are served in order, so a read sent after the `sync`'s answer sees every write
//! acknowledged before the `sync` was sent.
//!
//! # Why it can be shared, and with whom
//! A read that began before a `sync` was *sent* can use that `sync`: every write acknowledged
//! before the read began was acknowledged before the `sync` was sent too. A read that begins
//! after a `sync` was sent cannot (a write may have been acknowledged in between); it waits for
//! the next one. So each session has at most one `sync` in flight and one *round* gathering
//! readers for the next; when the one in flight answers, the gathered round is sent. Under load
//! a read waits for at most two `sync` round trips and most share theirs: the cost is a
//! fraction of a round trip per read, and the number of `sync`s is bounded by the round trip,
//! not by the number of reads.
//!
//! # What `sync` does not promise
//! ZooKeeper documents (zookeeperInternals, "Consistency Guarantees") that `sync` then read is
//! not strictly linearizable across a change of leader: `sync` is not a quorum operation, and a
//! leader cut off from its quorum answers it from its own state until it notices, within
//! `syncLimit` ticks, that it is no longer followed (ZOOKEEPER-1675 proposes a quorum `sync`).
//! A read through a server still following that old leader can then miss a write the new
//! leader's quorum committed in that window. A leader that *dies* (the fault suite kills it)
//! answers nothing, and a follower that is paused or partitioned answers neither the `sync` nor
//! the read until it has caught up; the window needs an isolated leader that is still running.
//! zkgate does not close it (a quorum write per round would, at the cost of a log write on every
//! server): it is stated in the README's Consistency section.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use zookeeper_client::{Client, Error as ZkError};

/// The `sync`s of one session (one client): created with the client, dropped with it.
pub struct Syncs {
    rounds: Mutex<Rounds>,
    done: watch::Sender<Done>,
}

#[derive(Default)]
struct Rounds {
    /// The number of the last round sent (0: none yet).
    sent: u64,
    /// Whether round `sent` has not answered yet.
    in_flight: bool,
    /// Whether a read waits for round `sent + 1`, to be sent when `sent` answers.
    gathering: bool,
}

/// The last round that answered, and how.
#[derive(Clone)]
struct Done {
    round: u64,
    result: Result<(), ZkError>,
}

impl Default for Syncs {
    fn default() -> Self {
        Syncs {
            rounds: Mutex::default(),
            done: watch::channel(Done {
                round: 0,
                result: Ok(()),
            })
            .0,
        }
    }
}

impl Syncs {
    /// Returns once `client`'s server has caught up with every write acknowledged (to anyone)
    /// before this was called, so that a read sent on `client` after it sees them. `client`
    /// must be the client these `Syncs` were made for.
    ///
    /// # Notable errors
    /// The `sync`'s own: a connection loss ([super::is_loss]) or the session's end.
    pub async fn sync(self: &Arc<Self>, client: &Client) -> Result<(), ZkError> {
        let mut done = self.done.subscribe();
        let round = {
            let mut rounds = self.rounds.lock().expect("sync rounds");
            if rounds.in_flight {
                // Sent before this read began: not ours to share. The next one is.
                rounds.gathering = true;
                rounds.sent + 1
            } else {
                rounds.sent += 1;
                rounds.in_flight = true;
                self.send(client.clone(), rounds.sent);
                rounds.sent
            }
        };
        crate::metrics::get().linearizable_reads.inc();
        // A later round that answered covers this read too.
        let answered = done.wait_for(|done| done.round >= round).await;
        match answered {
            Ok(done) => done.result.clone(),
            // The sender lives in `self`, which the caller holds.
            Err(_) => Err(ZkError::ConnectionLoss),
        }
    }

    /// How many `sync`s this session has sent.
    pub fn sent(&self) -> u64 {
        self.rounds.lock().expect("sync rounds").sent
    }

    /// Sends round `round` on a task of its own, so that a reader that gives up (its client
    /// went away) does not leave the others waiting.
    fn send(self: &Arc<Self>, client: Client, round: u64) {
        crate::metrics::get().zookeeper_syncs.inc();
        let syncs = Arc::clone(self);
        tokio::spawn(async move {
            let result = client.sync("/").await;
            syncs.answered(client, round, result);
        });
    }

    fn answered(self: &Arc<Self>, client: Client, round: u64, result: Result<(), ZkError>) {
        self.done.send_replace(Done { round, result });
        let mut rounds = self.rounds.lock().expect("sync rounds");
        if rounds.gathering {
            rounds.gathering = false;
            rounds.sent += 1;
            self.send(client, rounds.sent);
        } else {
            rounds.in_flight = false;
        }
    }
}
