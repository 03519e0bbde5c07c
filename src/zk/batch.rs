//! Guarded writes of several requests sent to ZooKeeper as one multi-op while one is in
//! flight on the session.
//!
//! # Why
//! A lock acquire is a multi-op (the lease's guard, the holding's reference, its node) and its
//! release another. ZooKeeper's cost of a request is mostly the request itself, not its
//! operations: each one crosses the server's request pipeline (a queue and a thread hand-off
//! per stage, a log append, a reply), whatever it holds. Measured on the machine of
//! BENCHMARKS.md (kazoo, 4,000 acquire-shaped multi-ops, 16 in flight, ZooKeeper's CPU time):
//! about 150 µs of ZooKeeper's CPU per multi-op sent alone, 90–105 µs each sent two together,
//! 85–90 µs eight together. Under load ZooKeeper is the machine's busiest process (BENCHMARKS.md,
//! "Latency under load, issue 33"), so requests that meet on a session share one multi-op.
//!
//! # How
//! A session has one [Writes]. A write is sent at once, alone, exactly as an unbatched one,
//! while fewer than [ALONE_IN_FLIGHT] of the session's writes are in flight (no waiting at
//! low load: a lone request pays nothing but this check). A write arriving when that many are
//! out queues; when one answers, everything queued is sent as one multi-op (each write's
//! operations in arrival order, at most [MAX_WRITES] writes and about [MAX_BYTES] of payload,
//! and never two that create under one parent: see [into_batches]) by a task of its own, which
//! goes on sending what queued meanwhile, one batch at a time, so that a caller that gives up
//! waiting strands no one behind it. The multi-ops in flight are thus bounded, and a batch
//! grows with the load: the busier ZooKeeper is, the fewer requests it is sent per write.
//!
//! Each write may ask for a directory's children to be listed right after it (a contender's
//! listing, see `recipes::handle::write`): the listings are sent after the batch's multi-op,
//! on the same session, so ZooKeeper (which serves a session in order) lists after the write.
//!
//! # What a batch answers
//! A multi-op is all or nothing, so one write's refusal (a lease moved, a node there already)
//! would refuse its companions too. They are not refused: a refusal is reported only to a write
//! that went *first* in its multi-op, whose refusal is then about the state it met, not about
//! the writes before it that were undone with it. A batch refused at write `k > 0` is split:
//! writes `..k` (which passed) are sent again together, then `k..`; one refused at its first
//! write answers that write and sends the rest again. So every write's answer is the one it
//! would have had sent alone in that order, and each split at least halves a batch or answers a
//! write. A lost reply (a connection loss) is every write's: each may have applied, and each
//! caller looks as it does for a write sent alone (the GUID rule, a reference found there).

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;
use zookeeper_client::{Client, CreateOptions, Error as ZkError, MultiWriteError, MultiWriteResult};

/// The most writes sent in one multi-op.
pub const MAX_WRITES: usize = 64;

/// How many multi-ops of a session's writes may be in flight before the next write queues
/// for a batch. One would batch the most, but a write that meets one in flight then waits for
/// its answer before it is even sent, and under a steady load most writes do: measured in the
/// compare bench's open loop at 80% of zkgate's maximum, every operation took about twice as
/// long at the median (4.7 ms against 2.5), and a client with 32 operations in flight ran out
/// of them for half a second at a time. Two keeps a write's wait to the rare moments when two
/// are out already, when a batch pays for itself.
pub const ALONE_IN_FLIGHT: usize = 2;

/// About the most payload (paths and data) of one multi-op: a quarter of ZooKeeper's default
/// `jute.maxbuffer` (1 MiB), which bounds a request. A write larger than this is sent alone.
pub const MAX_BYTES: usize = 256 * 1024;

/// One operation of a write, kept to be added to a batch's multi-op.
#[derive(Clone, Debug)]
pub enum Op {
    Check {
        path: String,
        version: i32,
    },
    Create {
        path: String,
        data: Vec<u8>,
        options: CreateOptions<'static>,
    },
    Set {
        path: String,
        data: Vec<u8>,
        version: Option<i32>,
    },
    Delete {
        path: String,
        version: Option<i32>,
    },
}

impl Op {
    fn size(&self) -> usize {
        match self {
            Op::Check { path, .. } | Op::Delete { path, .. } => path.len() + 16,
            Op::Create { path, data, .. } | Op::Set { path, data, .. } => path.len() + data.len() + 32,
        }
    }

    /// The directory a create makes its node in.
    fn created_under(&self) -> Option<&str> {
        match self {
            Op::Create { path, .. } => path.rsplit_once('/').map(|(parent, _)| parent),
            _ => None,
        }
    }

    fn add_to(&self, writer: &mut zookeeper_client::MultiWriter<'_>) -> Result<(), ZkError> {
        match self {
            Op::Check { path, version } => writer.add_check_version(path, *version),
            Op::Create { path, data, options } => writer.add_create(path, data, options),
            Op::Set { path, data, version } => writer.add_set_data(path, data, *version),
            Op::Delete { path, version } => writer.add_delete(path, *version),
        }
    }
}

/// What one write's multi-op answered, as if it had been sent alone.
#[derive(Debug)]
pub struct Answer {
    pub committed: Result<Vec<MultiWriteResult>, MultiWriteError>,
    /// The listing asked for after the write, if it was (left out when the write was refused).
    pub listed: Option<Result<Vec<String>, ZkError>>,
}

/// A write waiting for the multi-op in flight to answer.
struct Queued {
    ops: Vec<Op>,
    then_list: Option<String>,
    reply: oneshot::Sender<Answer>,
}

/// The batched writes of one session (made with its client, dropped with it).
#[derive(Default)]
pub struct Writes {
    state: Mutex<State>,
    sent: std::sync::atomic::AtomicU64,
    writes: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct State {
    /// How many multi-ops of these writes are in flight (sent alone, or a batch).
    in_flight: usize,
    /// Whether a task sends the queue in batches (one of those in flight).
    batching: bool,
    queue: Vec<Queued>,
}

impl Writes {
    /// Commits `ops` on `client` (this [Writes]' session), listing `then_list` right after;
    /// sent at once if no write is in flight, else with the writes queued behind it.
    pub async fn commit(self: &Arc<Self>, client: &Client, mut ops: Vec<Op>, then_list: Option<&str>) -> Answer {
        self.writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        crate::metrics::get().zookeeper_writes.inc();
        let queued = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.in_flight >= ALONE_IN_FLIGHT || !state.queue.is_empty() {
                let (reply, answer) = oneshot::channel();
                state.queue.push(Queued {
                    ops: std::mem::take(&mut ops),
                    then_list: then_list.map(str::to_string),
                    reply,
                });
                Some(answer)
            } else {
                state.in_flight += 1;
                None
            }
        };
        if let Some(answer) = queued {
            // The batch's task ended without answering: only when the runtime shuts down. The
            // write may have been sent: a loss, so that the caller looks before writing again.
            return answer.await.unwrap_or_else(|_| Answer {
                committed: Err(MultiWriteError::RequestFailed {
                    source: ZkError::ConnectionLoss,
                }),
                listed: None,
            });
        }
        // Sent now, alone. The turn hands whatever queues meanwhile to a batch's task once this
        // answers (or once this caller stops waiting for it).
        let turn = Turn {
            writes: self.clone(),
            client: client.clone(),
        };
        let mut writer = client.new_multi_writer();
        if let Err(source) = ops.iter().try_for_each(|op| op.add_to(&mut writer)) {
            return Answer {
                committed: Err(MultiWriteError::RequestFailed { source }),
                listed: None,
            };
        }
        self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        crate::metrics::get().zookeeper_write_requests.inc();
        let sent = writer.commit();
        let listing = then_list.map(|dir| client.list_children(dir));
        let committed = sent.await;
        drop(turn);
        let listed = match (&committed, listing) {
            (Ok(_), Some(listing)) => Some(listing.await),
            _ => None,
        };
        Answer { committed, listed }
    }

    /// How many multi-ops these writes were sent in, and how many writes there were (the
    /// process's totals are `zkgate_zookeeper_write_requests_total` and `..._writes_total`).
    pub fn counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.sent.load(Relaxed), self.writes.load(Relaxed))
    }

    /// Ends a turn; what queued meanwhile goes to a batch's task, if none is sending already.
    fn hand_over(self: &Arc<Self>, client: &Client) {
        let queued = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.in_flight -= 1;
            if state.batching || state.queue.is_empty() {
                return;
            }
            state.batching = true;
            state.in_flight += 1;
            std::mem::take(&mut state.queue)
        };
        tokio::spawn(send_batches(self.clone(), client.clone(), queued));
    }
}

/// The write in flight that was sent alone; dropping it hands the queue on.
struct Turn {
    writes: Arc<Writes>,
    client: Client,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.writes.hand_over(&self.client);
    }
}

/// Sends `queued` (and whatever queues meanwhile) in batches, one in flight at a time, until
/// nothing is left; then the session's writes go out alone again.
async fn send_batches(writes: Arc<Writes>, client: Client, queued: Vec<Queued>) {
    let mut batches = into_batches(queued);
    loop {
        while let Some(mut batch) = batches.pop_front() {
            // Writes whose caller stopped waiting are not sent: nothing of them applied.
            batch.retain(|write| !write.reply.is_closed());
            if batch.is_empty() {
                continue;
            }
            for again in send_batch(&writes, &client, batch).await.into_iter().rev() {
                batches.push_front(again);
            }
        }
        let mut state = writes.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.queue.is_empty() {
            state.batching = false;
            state.in_flight -= 1;
            return;
        }
        batches = into_batches(std::mem::take(&mut state.queue));
    }
}

/// `queued` cut, in order, into batches of at most [MAX_WRITES] writes and about [MAX_BYTES],
/// no two of whose writes create under the same parent.
///
/// Every node a multi-op creates has its zxid as `czxid`, and a contender's fencing token is
/// its node's `czxid`: two contenders for one resource created in one multi-op would share a
/// token, and a resource server could not tell the later holder from the earlier (the fault
/// suite's fenced registers caught exactly that). So a write creating under a directory that a
/// write already in the batch creates under begins the next batch.
fn into_batches(queued: Vec<Queued>) -> VecDeque<Vec<Queued>> {
    let mut batches = VecDeque::new();
    let mut batch: Vec<Queued> = Vec::new();
    let mut parents: HashSet<String> = HashSet::new();
    let mut size = 0;
    for write in queued {
        let write_size = write.ops.iter().map(Op::size).sum::<usize>();
        let write_parents: Vec<&str> = write.ops.iter().filter_map(Op::created_under).collect();
        let full = batch.len() == MAX_WRITES || size + write_size > MAX_BYTES;
        if !batch.is_empty() && (full || write_parents.iter().any(|parent| parents.contains(*parent))) {
            batches.push_back(std::mem::take(&mut batch));
            parents.clear();
            size = 0;
        }
        parents.extend(write_parents.into_iter().map(str::to_string));
        size += write_size;
        batch.push(write);
    }
    if !batch.is_empty() {
        batches.push_back(batch);
    }
    batches
}

/// Sends `batch` as one multi-op and answers the writes it can; returns the batches to send
/// next, in order, with those it could not answer (see the module's "What a batch answers").
async fn send_batch(writes: &Writes, client: &Client, mut batch: Vec<Queued>) -> Vec<Vec<Queued>> {
    let mut writer = client.new_multi_writer();
    let mut ends = Vec::with_capacity(batch.len());
    for (i, write) in batch.iter().enumerate() {
        if let Err(source) = write.ops.iter().try_for_each(|op| op.add_to(&mut writer)) {
            // Its paths were checked when the write was made, so this does not happen; were it
            // to, that write is answered alone and the batch made again without it.
            let write = batch.remove(i);
            let _ = write.reply.send(Answer {
                committed: Err(MultiWriteError::RequestFailed { source }),
                listed: None,
            });
            return vec![batch];
        }
        ends.push(ends.last().copied().unwrap_or(0) + write.ops.len());
    }
    writes.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    crate::metrics::get().zookeeper_write_requests.inc();
    let sent = writer.commit();
    let listings: Vec<_> = batch
        .iter()
        .map(|write| write.then_list.as_deref().map(|dir| client.list_children(dir)))
        .collect();
    match sent.await {
        Ok(mut results) => {
            for (write, listing) in batch.into_iter().zip(listings) {
                let rest = results.split_off(write.ops.len().min(results.len()));
                let listed = match listing {
                    Some(listing) => Some(listing.await),
                    None => None,
                };
                let _ = write.reply.send(Answer {
                    committed: Ok(std::mem::replace(&mut results, rest)),
                    listed,
                });
            }
            Vec::new()
        }
        Err(MultiWriteError::OperationFailed { index, source }) => {
            let refused = ends.iter().position(|&end| index < end).unwrap_or(ends.len() - 1);
            if refused > 0 {
                // Writes `..refused` passed, but on a state that this refusal undid: they go
                // again together, then the others (each answered by those attempts).
                let rest = batch.split_off(refused);
                return vec![batch, rest];
            }
            let rest = batch.split_off(1);
            if let Some(first) = batch.pop() {
                let _ = first.reply.send(Answer {
                    committed: Err(MultiWriteError::OperationFailed { index, source }),
                    listed: None,
                });
            }
            vec![rest]
        }
        Err(MultiWriteError::RequestFailed { source }) => {
            for write in batch {
                let _ = write.reply.send(Answer {
                    committed: Err(MultiWriteError::RequestFailed { source: source.clone() }),
                    listed: None,
                });
            }
            Vec::new()
        }
    }
}
