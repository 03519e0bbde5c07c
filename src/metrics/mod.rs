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

pub struct Metrics {
    registry: Registry,
    /// The names with series of their own.
    names: names::Names,
    pub lock_wait: HistogramVec,
    pub lock_hold: HistogramVec,
    pub lock_acquisitions: IntCounterVec,
    pub lock_timeouts: IntCounterVec,
    pub lock_losses: IntCounterVec,
    pub lock_revocations: IntCounterVec,
    pub leader_changes: IntCounterVec,
    pub queue_puts: IntCounterVec,
    pub queue_delayed_puts: IntCounterVec,
    pub queue_takes: IntCounterVec,
    pub queue_acks: IntCounterVec,
    pub queue_nacks: IntCounterVec,
    pub queue_redeliveries: IntCounterVec,
    pub queue_dead_lettered: IntCounterVec,
    pub lock_sets: IntCounterVec,
    pub janitor_removed: IntCounterVec,
    pub janitor_passes: IntCounter,
    pub janitor_active: IntGauge,
    pub counter_writes: IntCounterVec,
    pub service_registrations: IntCounterVec,
    pub counter_conflicts: IntCounterVec,
    pub leases_created: IntCounter,
    pub leases_ended: IntCounterVec,
    pub leases_taken_over: IntCounter,
    pub handoffs: IntCounter,
    pub sockets: IntGauge,
    pub event_streams: IntGauge,
    pub subscriptions: IntGauge,
    pub resyncs: IntCounterVec,
    pub zookeeper_requests: Histogram,
    /// How far into zkgate a request had come, from its arrival ([Metrics::observe_stage]).
    pub request_stages: HistogramVec,
    pub requests_shed: IntCounter,
    /// How late the runtime ran a task due now ([crate::metrics::probe_runtime]).
    pub runtime_delay: Histogram,
    pub zookeeper_syncs: IntCounter,
    pub linearizable_reads: IntCounter,
    // Read when scraped.
    queue_depth: IntGaugeVec,
    queue_in_flight: IntGaugeVec,
    queue_dead_letters: IntGaugeVec,
    leases: IntGauge,
    topics: IntGauge,
    ws_queued_bytes: IntGauge,
    zookeeper_connected: IntGauge,
    zookeeper_generation: IntGauge,
    zookeeper_connections: IntGauge,
}

/// A counter without labels.
fn single_counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let metric = IntCounter::new(name, help).expect("valid counter");
    registry.register(Box::new(metric.clone())).expect("unique metric");
    metric
}

/// A histogram without labels, in [REQUEST_BUCKETS].
fn single_histogram(registry: &Registry, name: &str, help: &str) -> Histogram {
    let opts = HistogramOpts::new(name, help).buckets(REQUEST_BUCKETS.to_vec());
    let metric = Histogram::with_opts(opts).expect("valid histogram");
    registry.register(Box::new(metric.clone())).expect("unique metric");
    metric
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
    registry.register(Box::new(metric.clone())).expect("unique metric");
    metric
}

fn histogram(registry: &Registry, name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    let metric = HistogramVec::new(opts, labels).expect("valid histogram");
    registry.register(Box::new(metric.clone())).expect("unique metric");
    metric
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let metric = IntGauge::new(name, help).expect("valid gauge");
    registry.register(Box::new(metric.clone())).expect("unique metric");
    metric
}

fn gauges(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let metric = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid gauge");
    registry.register(Box::new(metric.clone())).expect("unique metric");
    metric
}

impl Metrics {
    /// One entry per metric (its name, help and labels, registered once), in the order of the
    /// struct's fields: a table, long because the metrics are many; split, a metric's
    /// declaration would only be harder to find.
    fn new() -> Metrics {
        let r = Registry::new();
        let kn = &["kind", "name"][..];
        Metrics {
            lock_wait: histogram(
                &r,
                "zkgate_lock_wait_seconds",
                "Time from joining the queue to being granted (kind: lock, rwlock, election).",
                kn,
                WAIT_BUCKETS,
            ),
            lock_hold: histogram(
                &r,
                "zkgate_lock_hold_seconds",
                "Time from grant to release or loss.",
                kn,
                WAIT_BUCKETS,
            ),
            lock_acquisitions: counter(&r, "zkgate_lock_acquisitions_total", "Grants.", kn),
            lock_timeouts: counter(
                &r,
                "zkgate_lock_timeouts_total",
                "Acquire waits that ended without a grant (409, or 202 when staying queued).",
                kn,
            ),
            lock_losses: counter(
                &r,
                "zkgate_lock_losses_total",
                "Contenders lost without a release (lease or session ended, node deleted).",
                kn,
            ),
            lock_revocations: counter(
                &r,
                "zkgate_lock_revocations_total",
                "Revocation requests sent to holders.",
                kn,
            ),
            leader_changes: counter(
                &r,
                "zkgate_election_leader_changes_total",
                "Candidates of this instance that became leader.",
                &["name"],
            ),
            queue_puts: counter(&r, "zkgate_queue_puts_total", "Items put.", &["name"]),
            queue_delayed_puts: counter(
                &r,
                "zkgate_queue_delayed_puts_total",
                "Items put with a delay (`delay` or `not_before` in the future).",
                &["name"],
            ),
            queue_takes: counter(
                &r,
                "zkgate_queue_takes_total",
                "Items taken (mode: at_least_once, at_most_once).",
                &["name", "mode"],
            ),
            queue_acks: counter(&r, "zkgate_queue_acks_total", "Claims acknowledged.", &["name"]),
            queue_nacks: counter(&r, "zkgate_queue_nacks_total", "Claims given back.", &["name"]),
            queue_redeliveries: counter(
                &r,
                "zkgate_queue_redeliveries_total",
                "Items delivered again after an earlier claim was not acknowledged.",
                &["name"],
            ),
            queue_dead_lettered: counter(
                &r,
                "zkgate_queue_dead_lettered_total",
                "Items moved to the dead letters after too many deliveries.",
                &["name"],
            ),
            janitor_removed: counter(
                &r,
                "zkgate_janitor_removed_total",
                "What the janitor removed (what: idempotency_key, txn, queue, double_barrier, group, service).",
                &["what"],
            ),
            janitor_passes: single_counter(
                &r,
                "zkgate_janitor_passes_total",
                "Janitor passes made by this instance.",
            ),
            janitor_active: gauge(
                &r,
                "zkgate_janitor_active",
                "1 while this instance is the cluster's janitor, else 0.",
            ),
            lock_sets: counter(
                &r,
                "zkgate_lock_sets_total",
                "Lock set acquires (outcome: granted, refused: one lock was not granted and the set took nothing).",
                &["outcome"],
            ),
            service_registrations: counter(
                &r,
                "zkgate_service_registrations_total",
                "Service instances registered through this instance.",
                &["name"],
            ),
            counter_writes: counter(
                &r,
                "zkgate_counter_writes_total",
                "Counter writes (op: add, set, delete).",
                &["name", "op"],
            ),
            counter_conflicts: counter(
                &r,
                "zkgate_counter_conflicts_total",
                "Counter adds that read again because another writer changed the counter first.",
                &["name"],
            ),
            leases_created: single_counter(&r, "zkgate_leases_created_total", "Leases created."),
            leases_ended: counter(
                &r,
                "zkgate_leases_ended_total",
                "Leases ended (reason: deleted, expired).",
                &["reason"],
            ),
            leases_taken_over: single_counter(
                &r,
                "zkgate_leases_taken_over_total",
                "Leases this instance took over from another (gone, or not answering).",
            ),
            handoffs: single_counter(
                &r,
                "zkgate_handoffs_total",
                "Requests this instance handed to the keeper of their lease (keepalives, WebSocket-bound leases).",
            ),
            sockets: gauge(&r, "zkgate_websocket_connections", "Open WebSocket connections."),
            event_streams: gauge(&r, "zkgate_event_streams", "Open Server-Sent Event streams."),
            subscriptions: gauge(
                &r,
                "zkgate_websocket_subscriptions",
                "Live subscriptions over all sockets and event streams (one per topic).",
            ),
            resyncs: counter(
                &r,
                "zkgate_websocket_resyncs_total",
                "Resync events published or sent (reason: reconnected, session_expired, fell_behind, cannot_resume).",
                &["reason"],
            ),
            zookeeper_requests: single_histogram(
                &r,
                "zkgate_zookeeper_request_duration_seconds",
                "Time of ZooKeeper requests (reads, deletes, contender creates), per attempt.",
            ),
            request_stages: histogram(
                &r,
                "zkgate_request_stage_seconds",
                "Time from a request's arrival (its head read) to: `admitted` (its turn among the requests in service), \
                 `answered` (its answer ready), `written` (its answer's last byte handed to the connection); `turn`: \
                 `taken` for the requests that wait for a turn, `none` for those that take none (deletes, keepalives, acks).",
                &["stage", "turn"],
                REQUEST_BUCKETS,
            ),
            requests_shed: single_counter(
                &r,
                "zkgate_requests_shed_total",
                "Requests refused (503 `overloaded`) because they waited too long for a turn.",
            ),
            runtime_delay: single_histogram(
                &r,
                "zkgate_runtime_delay_seconds",
                "How late the runtime started a task that was due: a probe spawned every 10 ms (the time requests wait \
                 for a worker, as when a task polls long).",
            ),
            zookeeper_syncs: single_counter(
                &r,
                "zkgate_zookeeper_syncs_total",
                "Barriers sent to ZooKeeper for linearizable reads (on an ensemble a transaction that changes nothing, \
                 on a standalone server a sync; shared by the reads that may share it).",
            ),
            linearizable_reads: single_counter(
                &r,
                "zkgate_linearizable_reads_total",
                "Reads that waited for a barrier (the default consistency).",
            ),
            queue_depth: gauges(
                &r,
                "zkgate_queue_depth",
                "Items waiting to be taken, claimed ones not counted (read from ZooKeeper when scraped).",
                &["name"],
            ),
            queue_in_flight: gauges(
                &r,
                "zkgate_queue_in_flight",
                "Items claimed and not yet acknowledged.",
                &["name"],
            ),
            queue_dead_letters: gauges(&r, "zkgate_queue_dead_letters", "Items in the dead letters.", &["name"]),
            leases: gauge(&r, "zkgate_leases", "Live leases of this instance."),
            topics: gauge(
                &r,
                "zkgate_event_topics",
                "Live event topics (each holds one ZooKeeper watch per znode it follows).",
            ),
            ws_queued_bytes: gauge(
                &r,
                "zkgate_ws_queued_bytes",
                "Bytes queued for WebSocket clients and not yet written (at most --ws-send-budget).",
            ),
            zookeeper_connected: gauge(
                &r,
                "zkgate_zookeeper_connected",
                "1 while the ZooKeeper session is connected, else 0.",
            ),
            zookeeper_generation: gauge(
                &r,
                "zkgate_zookeeper_session_generation",
                "The ZooKeeper session's number: it grows by one with each new session (after an expiry).",
            ),
            zookeeper_connections: gauge(
                &r,
                "zkgate_zookeeper_connections",
                "Connections to ZooKeeper established so far (reconnections included).",
            ),
            registry: r,
            names: names::Names::new(NAMES_PER_KIND),
        }
    }

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
