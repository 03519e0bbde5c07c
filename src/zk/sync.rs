//! Linearizable reads: a barrier before the read, shared by the reads that may share it.
//!
//! # Why a read needs one
//! A session reads from the server it is connected to, and a server applies a committed write
//! a little after some others do. So a read on zkgate's session can miss a write that another
//! session (another instance, behind another server) has already been told is done:
//! ZooKeeper's reads are sequentially consistent, not linearizable.
//!
//! # Why the barrier is a transaction, not ZooKeeper's `sync`
//! `sync` makes a *follower* catch up with the leader before it answers, but it does nothing on
//! the leader itself, and the leader is the server most likely to be behind on what is
//! acknowledged. In ZooKeeper 3.8 (the server Debian ships; the same in 3.9):
//! - `Leader.tryToCommit` sends a write's COMMIT to the followers first and only then queues
//!   the write to its own `CommitProcessor`; a follower that applies it answers its client. So
//!   a write can be acknowledged through a follower while the leader has not applied it.
//! - the leader's `CommitProcessor` is built with `matchSyncs = false`: a client's `sync` on the
//!   leader is handled as a read, waiting for nothing, and reads on the leader are handed to its
//!   workers ahead of commits still queued (`CommitProcessor.run` processes the queued requests
//!   before the next committed one).
//!
//! `tests/it/linearizability.rs` caught exactly that on a busy machine: a client wrote through
//! the instance behind a follower, got its answer, then read through the instance behind the
//! leader (after a `sync`) and got the value before its write.
//!
//! A transaction closes it on every server. The barrier is a `multi` holding one `check` of the
//! root at any version: it changes nothing, but it is proposed and committed like any write,
//! with a zxid after every write acknowledged before it was sent. A server applies commits in
//! zxid order and serves a session's requests in order (a read waits for that session's pending
//! write), so a read sent after the barrier's answer sees every write acknowledged, by anyone,
//! before the barrier was sent. Being a quorum operation, it also closes the gap ZooKeeper
//! documents for `sync` (zookeeperInternals, "Consistency Guarantees"; ZOOKEEPER-1675): a leader
//! cut off from its quorum can answer a `sync` from its own state, but cannot commit a
//! transaction, so a read behind it waits instead of going back in time.
//!
//! A standalone server has no leader to lag behind: it applies every request in order, one
//! pipeline, so there a `sync` is enough and costs no log write. The session reads
//! `/zookeeper/config` once: an ensemble's lists its servers (`server.N=` lines), a standalone
//! server's is empty; a config it may not read counts as an ensemble.
//!
//! What it costs: a log write on a quorum of servers per barrier, where `sync` cost a hop to the
//! leader (BENCHMARKS.md, Consistency); and one zxid per barrier (ZooKeeper starts a new epoch,
//! with a leader election, when the 32-bit counter of an epoch runs out: at one barrier in
//! flight per session, thousands of barriers a second for weeks).
//!
//! # Why it can be shared, and with whom
//! A read that began before a barrier was *sent* can use that barrier: every write acknowledged
//! before the read began was acknowledged before the barrier was sent too. A read that begins
//! after a barrier was sent cannot (a write may have been acknowledged in between); it waits for
//! the next one. So each session has at most one barrier in flight and one *round* gathering
//! readers for the next; when the one in flight answers, the gathered round is sent. Under load
//! a read waits for at most two barrier round trips and most share theirs: the cost is a
//! fraction of a round trip per read, and the number of barriers is bounded by the round trip,
//! not by the number of reads.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use zookeeper_client::{Client, Error as ZkError};

/// The barriers of one session (one client): created with the client, dropped with it. (zkgate
/// calls catching up before a read a sync; ZooKeeper's own `sync` is not what does it, above.)
pub struct Syncs {
    rounds: Mutex<Rounds>,
    done: watch::Sender<Done>,
    /// Whether the session's servers are an ensemble (a barrier must be a transaction), read
    /// from `/zookeeper/config` before the first one.
    ensemble: tokio::sync::OnceCell<bool>,
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
            ensemble: tokio::sync::OnceCell::new(),
        }
    }
}

impl Syncs {
    /// Returns once `client`'s server has caught up with every write acknowledged (to anyone)
    /// before this was called, so that a read sent on `client` after it sees them. `client`
    /// must be the client these `Syncs` were made for.
    ///
    /// # Notable errors
    /// The barrier's own: a connection loss ([super::is_loss]) or the session's end.
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

    /// Whether this session's barriers are transactions (its servers are an ensemble), once the
    /// first one was sent.
    pub fn transactions(&self) -> Option<bool> {
        self.ensemble.get().copied()
    }

    /// How many barriers this session has sent.
    pub fn sent(&self) -> u64 {
        self.rounds.lock().expect("sync rounds").sent
    }

    /// Sends round `round` on a task of its own, so that a reader that gives up (its client
    /// went away) does not leave the others waiting.
    fn send(self: &Arc<Self>, client: Client, round: u64) {
        crate::metrics::get().zookeeper_syncs.inc();
        let syncs = Arc::clone(self);
        tokio::spawn(async move {
            let result = match syncs.ensemble(&client).await {
                Ok(true) => barrier(&client).await,
                Ok(false) => client.sync("/").await,
                Err(error) => Err(error),
            };
            syncs.answered(client, round, result);
        });
    }

    /// Whether `client`'s servers are an ensemble (see the module's doc).
    async fn ensemble(&self, client: &Client) -> Result<bool, ZkError> {
        let read = || async {
            match client.get_config().await {
                Ok((config, _)) => Ok(lists_an_ensemble(&config)),
                Err(ZkError::NoAuth) => Ok(true),
                Err(error) => Err(error),
            }
        };
        self.ensemble.get_or_try_init(read).await.copied()
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

/// Whether a `/zookeeper/config` lists more than one server.
fn lists_an_ensemble(config: &[u8]) -> bool {
    String::from_utf8_lossy(config)
        .lines()
        .filter(|line| line.starts_with("server."))
        .count()
        > 1
}

/// One transaction that changes nothing (see the module's doc): a `multi` holding a `check` of
/// the root at any version. A refused check is a barrier too: ZooKeeper commits a failed
/// `multi` as an error transaction, in order like any other.
async fn barrier(client: &Client) -> Result<(), ZkError> {
    let mut multi = super::multi::Multi::new(client);
    multi.check((), "/", -1)?;
    match multi.commit().await {
        Ok(_) | Err(super::multi::Failed::Refused { .. }) => Ok(()),
        Err(super::multi::Failed::Request(error)) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::lists_an_ensemble;

    #[test]
    fn an_ensemble_is_told_by_its_servers_in_the_config() {
        assert!(!lists_an_ensemble(b""), "standalone");
        let one = b"server.1=127.0.0.1:2888:3888:participant;0.0.0.0:2181\nversion=100000000";
        assert!(!lists_an_ensemble(one));
        let three = b"server.1=127.0.0.1:2888:3888:participant;0.0.0.0:2181\n\
            server.2=127.0.0.1:2889:3889:participant;0.0.0.0:2182\n\
            server.3=127.0.0.1:2890:3890:participant;0.0.0.0:2183\nversion=100000000";
        assert!(lists_an_ensemble(three));
    }
}
