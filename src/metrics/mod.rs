//! Prometheus metrics, served at `/metrics` in the text exposition format.
//!
//! Counters and histograms are process-wide (one zkgate instance per process, as deployed),
//! recorded where things happen: grants and releases in the contender driver, queue
//! operations in the handlers, leases in their registry, sockets in the socket loop,
//! ZooKeeper request times in the retrying helper and the contender's create. Gauges that
//! describe ZooKeeper's state (queue depths) or the instance's (live leases, topics, the
//! session) are read when scraped, so they are never stale.
//!
//! Names follow Prometheus conventions: `zkgate_` prefix, base units (`_seconds`), `_total`
//! for counters. Resource names are the label `name` on every metric, but only for the names that are
//! in use, up to a number per kind ([names]); the others are counted under `_other`, so that
//! clients that use a new name per order cannot grow `/metrics` (or zkgate's memory) without
//! end.

pub mod names;
mod timing;

pub use timing::{Stage, probe_runtime, zookeeper_request};

use std::sync::LazyLock;
use std::time::Instant;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Counts a socket, a stream or a subscription in its gauge while it lives.
pub struct Counted(&'static IntGauge);

impl Counted {
    pub fn new(gauge: &'static IntGauge) -> Counted {
        gauge.inc();
        Counted(gauge)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Buckets for waits and holds: 1 ms to 10 min.
const WAIT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0,
];

/// Buckets for ZooKeeper requests: 100 µs to 5 s.
const REQUEST_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// Declares [Metrics], one entry per metric: its field, its type and the constructor that
/// registers it (with its Prometheus name, and its labels or buckets), the field's doc being
/// the metric's help text. A table: each metric is said once, where it is found.
macro_rules! metrics {
    ($($(#[doc = $help:literal])+ $vis:vis $field:ident: $ty:ty = $make:ident($($arg:expr),+);)+) => {
        pub struct Metrics {
            registry: Registry,
            /// The names with series of their own.
            names: names::Names,
            $($(#[doc = $help])+ $vis $field: $ty,)+
        }

        impl Metrics {
            fn new() -> Metrics {
                let r = Registry::new();
                Metrics {
                    $($field: $make(&r, $($arg),+, &help(concat!($($help),+))),)+
                    registry: r,
                    names: names::Names::new(NAMES_PER_KIND),
                }
            }
        }
    };
}

/// A doc comment's lines as one help text.
fn help(doc: &str) -> String {
    doc.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The labels of the metrics of contenders: a lock's, read/write lock's, semaphore's,
/// election's.
const KN: &[&str] = &["kind", "name"];

metrics! {
    /// Time from joining the queue to being granted (kind: lock, rwlock, election).
    pub lock_wait: HistogramVec = histogram("zkgate_lock_wait_seconds", KN, WAIT_BUCKETS);
    /// Time from grant to release or loss.
    pub lock_hold: HistogramVec = histogram("zkgate_lock_hold_seconds", KN, WAIT_BUCKETS);
    /// Grants.
    pub lock_acquisitions: IntCounterVec = counter("zkgate_lock_acquisitions_total", KN);
    /// Acquire waits that ended without a grant (409, or 202 when staying queued).
    pub lock_timeouts: IntCounterVec = counter("zkgate_lock_timeouts_total", KN);
    /// Contenders lost without a release (lease or session ended, node deleted).
    pub lock_losses: IntCounterVec = counter("zkgate_lock_losses_total", KN);
    /// Revocation requests sent to holders.
    pub lock_revocations: IntCounterVec = counter("zkgate_lock_revocations_total", KN);
    /// Candidates of this instance that became leader.
    pub leader_changes: IntCounterVec = counter("zkgate_election_leader_changes_total", &["name"]);
    /// Items put.
    pub queue_puts: IntCounterVec = counter("zkgate_queue_puts_total", &["name"]);
    /// Items put with a delay (`delay` or `not_before` in the future).
    pub queue_delayed_puts: IntCounterVec = counter("zkgate_queue_delayed_puts_total", &["name"]);
    /// Items taken (mode: at_least_once, at_most_once).
    pub queue_takes: IntCounterVec = counter("zkgate_queue_takes_total", &["name", "mode"]);
    /// Claims acknowledged.
    pub queue_acks: IntCounterVec = counter("zkgate_queue_acks_total", &["name"]);
    /// Claims given back.
    pub queue_nacks: IntCounterVec = counter("zkgate_queue_nacks_total", &["name"]);
    /// Items delivered again after an earlier claim was not acknowledged.
    pub queue_redeliveries: IntCounterVec = counter("zkgate_queue_redeliveries_total", &["name"]);
    /// Items moved to the dead letters after too many deliveries.
    pub queue_dead_lettered: IntCounterVec = counter("zkgate_queue_dead_lettered_total", &["name"]);
    /// What the janitor removed (what: idempotency_key, txn, queue, double_barrier, group, service).
    pub janitor_removed: IntCounterVec = counter("zkgate_janitor_removed_total", &["what"]);
    /// Idempotency keys forgotten because their principal had more than `--idempotency-keys`
    /// (the oldest first), by this instance.
    pub idempotency_keys_evicted: IntCounter = single_counter("zkgate_idempotency_keys_evicted_total");
    /// Janitor passes made by this instance.
    pub janitor_passes: IntCounter = single_counter("zkgate_janitor_passes_total");
    /// 1 while this instance is the cluster's janitor, else 0.
    pub janitor_active: IntGauge = gauge("zkgate_janitor_active");
    /// Lock set acquires (outcome: granted, refused: one lock was not granted and the set took
    /// nothing).
    pub lock_sets: IntCounterVec = counter("zkgate_lock_sets_total", &["outcome"]);
    /// Service instances registered through this instance.
    pub service_registrations: IntCounterVec = counter("zkgate_service_registrations_total", &["name"]);
    /// Counter writes (op: add, set, delete).
    pub counter_writes: IntCounterVec = counter("zkgate_counter_writes_total", &["name", "op"]);
    /// Counter adds that read again because another writer changed the counter first.
    pub counter_conflicts: IntCounterVec = counter("zkgate_counter_conflicts_total", &["name"]);
    /// Transactions over keys applied (branch: then, else; a repeated idempotency key's answer
    /// not counted).
    pub kv_transactions: IntCounterVec = counter("zkgate_kv_transactions_total", &["branch"]);
    /// Locks, read/write locks and permits held for an expired lease's lock-delay (kind).
    pub lock_delays: IntCounterVec = counter("zkgate_lock_delays_total", &["kind"]);
    /// Guarded writes refused because a guard did not hold (kind: what the guard names).
    pub guard_refusals: IntCounterVec = counter("zkgate_guard_refusals_total", &["kind"]);
    /// Keys bound to a lease that its end deleted (`PUT /v1/kv/{key}?lease=`).
    pub kv_keys_ended: IntCounter = single_counter("zkgate_kv_keys_ended_total");
    /// Keys bound to leases whose bindings this instance drives now.
    pub kv_bound_keys: IntGauge = gauge("zkgate_kv_bound_keys");
    /// Leases created.
    pub leases_created: IntCounter = single_counter("zkgate_leases_created_total");
    /// Leases ended (reason: deleted, expired).
    pub leases_ended: IntCounterVec = counter("zkgate_leases_ended_total", &["reason"]);
    /// Leases this instance took over from another (gone, or not answering).
    pub leases_taken_over: IntCounter = single_counter("zkgate_leases_taken_over_total");
    /// Requests this instance handed to the keeper of their lease (keepalives, WebSocket-bound
    /// leases).
    pub handoffs: IntCounter = single_counter("zkgate_handoffs_total");
    /// Open WebSocket connections.
    pub sockets: IntGauge = gauge("zkgate_websocket_connections");
    /// Open Server-Sent Event streams.
    pub event_streams: IntGauge = gauge("zkgate_event_streams");
    /// Live subscriptions over all sockets and event streams (one per topic).
    pub subscriptions: IntGauge = gauge("zkgate_websocket_subscriptions");
    /// Resync events published or sent (reason: reconnected, session_expired, fell_behind,
    /// cannot_resume).
    pub resyncs: IntCounterVec = counter("zkgate_websocket_resyncs_total", &["reason"]);
    /// Time of ZooKeeper requests (reads, deletes, contender creates), per attempt.
    pub zookeeper_requests: Histogram = single_histogram("zkgate_zookeeper_request_duration_seconds");
    /// Time from a request's arrival (its head read) to: `admitted` (its turn among the requests in
    /// service), `answered` (its answer ready), `written` (its answer's last byte handed to the
    /// connection); `turn`: `taken` for the requests that wait for a turn, `none` for those that take
    /// none (deletes, keepalives, acks).
    pub request_stages: HistogramVec = histogram("zkgate_request_stage_seconds", &["stage", "turn"], REQUEST_BUCKETS);
    /// Requests refused (503 `overloaded`) because they waited too long for a turn.
    pub requests_shed: IntCounter = single_counter("zkgate_requests_shed_total");
    /// How late the runtime started a task that was due: a probe spawned every 10 ms (the time
    /// requests wait for a worker, as when a task polls long).
    pub runtime_delay: Histogram = single_histogram("zkgate_runtime_delay_seconds");
    /// Barriers sent to ZooKeeper for linearizable reads (on an ensemble a transaction that changes
    /// nothing, on a standalone server a sync; shared by the reads that may share it).
    pub zookeeper_syncs: IntCounter = single_counter("zkgate_zookeeper_syncs_total");
    /// Reads that waited for a barrier (the default consistency).
    pub linearizable_reads: IntCounter = single_counter("zkgate_linearizable_reads_total");
    /// Items waiting to be taken, claimed ones not counted (read from ZooKeeper when scraped).
    queue_depth: IntGaugeVec = gauges("zkgate_queue_depth", &["name"]);
    /// Items claimed and not yet acknowledged.
    queue_in_flight: IntGaugeVec = gauges("zkgate_queue_in_flight", &["name"]);
    /// Items in the dead letters.
    queue_dead_letters: IntGaugeVec = gauges("zkgate_queue_dead_letters", &["name"]);
    /// Live leases of this instance.
    leases: IntGauge = gauge("zkgate_leases");
    /// Live event topics (each holds one ZooKeeper watch per znode it follows).
    topics: IntGauge = gauge("zkgate_event_topics");
    /// Bytes queued for WebSocket clients and not yet written (at most --ws-send-budget).
    ws_queued_bytes: IntGauge = gauge("zkgate_ws_queued_bytes");
    /// 1 while the ZooKeeper session is connected, else 0.
    zookeeper_connected: IntGauge = gauge("zkgate_zookeeper_connected");
    /// The ZooKeeper session's number: it grows by one with each new session (after an expiry).
    zookeeper_generation: IntGauge = gauge("zkgate_zookeeper_session_generation");
    /// Connections to ZooKeeper established so far (reconnections included).
    zookeeper_connections: IntGauge = gauge("zkgate_zookeeper_connections");
}

/// `metric`, registered (each metric's name is unique: a second registration is a bug).
fn registered<M: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    registry.register(Box::new(metric.clone())).expect("unique metric");
    metric
}

/// A counter without labels.
fn single_counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    registered(registry, IntCounter::new(name, help).expect("valid counter"))
}

/// A histogram without labels, in [REQUEST_BUCKETS].
fn single_histogram(registry: &Registry, name: &str, help: &str) -> Histogram {
    let opts = HistogramOpts::new(name, help).buckets(REQUEST_BUCKETS.to_vec());
    registered(registry, Histogram::with_opts(opts).expect("valid histogram"))
}

fn counter(registry: &Registry, name: &str, labels: &[&str], help: &str) -> IntCounterVec {
    let counter = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
    registered(registry, counter)
}

fn histogram(registry: &Registry, name: &str, labels: &[&str], buckets: &[f64], help: &str) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    registered(registry, HistogramVec::new(opts, labels).expect("valid histogram"))
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    registered(registry, IntGauge::new(name, help).expect("valid gauge"))
}

fn gauges(registry: &Registry, name: &str, labels: &[&str], help: &str) -> IntGaugeVec {
    let gauges = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid gauge");
    registered(registry, gauges)
}

impl Metrics {
    /// The `name` label of a use of `name` (of kind `kind`, as [crate::kind::Kind::label] says)
    /// now: the name itself if it has a place for its series, else [names::OTHER].
    pub fn name<'a>(&self, kind: &'static str, name: &'a str) -> &'a str {
        let admitted = self.names.admit(kind, name, false, Instant::now());
        self.forget(&admitted.evicted);
        if admitted.placed { name } else { names::OTHER }
    }

    /// The `name` label of a use of queue `name` now (see [Metrics::name]).
    pub fn queue<'a>(&self, name: &'a str) -> &'a str {
        self.name(QUEUE, name)
    }

    /// The `counter` label of a use of counter `name` now (see [Metrics::name]).
    pub fn counter<'a>(&self, name: &'a str) -> &'a str {
        self.name(COUNTER, name)
    }

    /// Holds the place of `name` (if it has or gets one) until the guard is dropped: for a live
    /// handle, so that a lock held for hours keeps its series.
    pub fn hold_name(&'static self, kind: &'static str, name: &str) -> NameHold {
        let admitted = self.names.admit(kind, name, true, Instant::now());
        self.forget(&admitted.evicted);
        NameHold {
            kind,
            name: admitted.placed.then(|| name.to_string()),
        }
    }

    /// How many names of each kind may have series of their own (`--metrics-names-per-kind`).
    pub fn set_names_per_kind(&self, per_kind: usize) {
        self.names.set_per_kind(per_kind);
    }

    /// Removes the series of names that lost their place.
    fn forget(&self, evicted: &[names::Key]) {
        for (kind, name) in evicted {
            let name = name.as_str();
            if *kind == QUEUE {
                for vec in [
                    &self.queue_puts,
                    &self.queue_delayed_puts,
                    &self.queue_acks,
                    &self.queue_nacks,
                    &self.queue_redeliveries,
                    &self.queue_dead_lettered,
                ] {
                    let _ = vec.remove_label_values(&[name]);
                }
                for mode in QUEUE_MODES {
                    let _ = self.queue_takes.remove_label_values(&[name, mode]);
                }
                continue;
            }
            if *kind == SERVICE {
                let _ = self.service_registrations.remove_label_values(&[name]);
                continue;
            }
            if *kind == COUNTER {
                for op in COUNTER_OPS {
                    let _ = self.counter_writes.remove_label_values(&[name, op]);
                }
                let _ = self.counter_conflicts.remove_label_values(&[name]);
                continue;
            }
            for vec in [
                &self.lock_acquisitions,
                &self.lock_timeouts,
                &self.lock_losses,
                &self.lock_revocations,
            ] {
                let _ = vec.remove_label_values(&[kind, name]);
            }
            for histogram in [&self.lock_wait, &self.lock_hold] {
                let _ = histogram.remove_label_values(&[kind, name]);
            }
            if *kind == ELECTION {
                let _ = self.leader_changes.remove_label_values(&[name]);
            }
        }
    }
}

/// Names of one kind that may have series of their own, unless `--metrics-names-per-kind` says
/// otherwise.
pub const NAMES_PER_KIND: usize = 100;

/// The kind labels of queues' and elections' names (as [crate::kind::Kind::label] has them).
pub const QUEUE: &str = "queue";
pub const ELECTION: &str = "election";
pub const COUNTER: &str = "counter";
pub const SERVICE: &str = "service";

/// The values of `zkgate_counter_writes_total`'s `op`.
pub const COUNTER_OPS: [&str; 3] = ["add", "set", "delete"];

/// The values of `zkgate_queue_takes_total`'s `mode`.
pub const QUEUE_MODES: [&str; 2] = ["at_least_once", "at_most_once"];

/// A live handle's hold on its name's place; let go when dropped.
pub struct NameHold {
    kind: &'static str,
    /// The name, if it has a place.
    name: Option<String>,
}

impl Drop for NameHold {
    fn drop(&mut self) {
        if let Some(name) = &self.name {
            get().names.release(self.kind, name, Instant::now());
        }
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn get() -> &'static Metrics {
    &METRICS
}

/// What the gauges that are read when scraped say now (the instance's session, leases and
/// topics, and every queue's counts as ZooKeeper has them).
#[derive(Debug, Default)]
pub struct Readings {
    pub zookeeper_connected: bool,
    pub session_generation: u64,
    pub connections: u64,
    pub leases: usize,
    pub topics: usize,
    pub ws_queued_bytes: usize,
    /// Per queue: items waiting (claimed ones not counted), claims in flight, dead letters;
    /// `None` when ZooKeeper could not be read (the queue gauges then keep their values).
    pub queues: Option<Vec<QueueCounts>>,
}

/// One queue's counts.
#[derive(Debug, Clone)]
pub struct QueueCounts {
    pub queue: String,
    pub depth: i64,
    pub in_flight: i64,
    pub dead_letters: i64,
}

/// The `most` busiest queues of `queues` (the most items waiting, then in flight, then dead),
/// and the rest summed up as one queue named [names::OTHER].
fn busiest(queues: &[QueueCounts], most: usize) -> Vec<QueueCounts> {
    let mut sorted: Vec<&QueueCounts> = queues.iter().collect();
    sorted.sort_by_key(|c| std::cmp::Reverse((c.depth, c.in_flight, c.dead_letters)));
    let mut shown: Vec<QueueCounts> = sorted.iter().take(most).map(|c| (*c).clone()).collect();
    if sorted.len() > most {
        let mut other = QueueCounts {
            queue: names::OTHER.to_string(),
            depth: 0,
            in_flight: 0,
            dead_letters: 0,
        };
        for c in &sorted[most..] {
            other.depth += c.depth;
            other.in_flight += c.in_flight;
            other.dead_letters += c.dead_letters;
        }
        shown.push(other);
    }
    shown
}

/// The text exposition of every metric, with the gauges set from `readings`. Queues that are
/// gone leave the queue gauges; the series of names idle for a while go (see [names]).
pub fn render(readings: &Readings) -> String {
    let m = get();
    m.zookeeper_connected.set(i64::from(readings.zookeeper_connected));
    m.zookeeper_generation.set(readings.session_generation as i64);
    m.zookeeper_connections.set(readings.connections as i64);
    m.leases.set(readings.leases as i64);
    m.topics.set(readings.topics as i64);
    m.ws_queued_bytes.set(readings.ws_queued_bytes as i64);
    m.forget(&m.names.sweep(Instant::now()));
    if let Some(queues) = &readings.queues {
        m.queue_depth.reset();
        m.queue_in_flight.reset();
        m.queue_dead_letters.reset();
        for counts in busiest(queues, m.names.per_kind()) {
            let queue = [counts.queue.as_str()];
            m.queue_depth.with_label_values(&queue).set(counts.depth);
            m.queue_in_flight.with_label_values(&queue).set(counts.in_flight);
            m.queue_dead_letters.with_label_values(&queue).set(counts.dead_letters);
        }
    }
    let mut text = Vec::new();
    let _ = TextEncoder::new().encode(&m.registry.gather(), &mut text);
    String::from_utf8(text).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_labels_are_the_registrys() {
        assert_eq!(crate::kind::Kind::Queue.label(), QUEUE);
        assert_eq!(crate::kind::Kind::Election.label(), ELECTION);
        assert_eq!(crate::kind::Kind::Counter.label(), COUNTER);
        assert_eq!(crate::kind::Kind::Service.label(), SERVICE);
    }

    #[test]
    fn the_busiest_queues_are_shown_and_the_rest_summed() {
        let counts = |queue: &str, depth| QueueCounts {
            queue: queue.to_string(),
            depth,
            in_flight: 1,
            dead_letters: 0,
        };
        let queues = [counts("a", 1), counts("b", 9), counts("c", 5), counts("d", 2)];
        let shown = busiest(&queues, 2);
        let names: Vec<_> = shown.iter().map(|c| (c.queue.as_str(), c.depth, c.in_flight)).collect();
        assert_eq!(names, [("b", 9, 1), ("c", 5, 1), (names::OTHER, 3, 2)]);
        assert_eq!(busiest(&queues, 4).len(), 4, "no `_other` when all fit");
    }
}
