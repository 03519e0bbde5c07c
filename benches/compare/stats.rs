//! Latency summaries and the figures a row of the report holds.

use std::time::{Duration, Instant};

/// Percentiles of a latency sample, in microseconds.
#[derive(Clone, Copy, Debug)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
}

impl Latency {
    pub fn of(samples: &[Duration]) -> Latency {
        let mut micros: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        micros.sort_by(f64::total_cmp);
        let at = |q: f64| micros[((micros.len() - 1) as f64 * q).round() as usize];
        Latency {
            p50: at(0.50),
            p99: at(0.99),
        }
    }
}

/// One measured figure of one system.
#[derive(Clone, Debug)]
pub enum Figure {
    /// A latency distribution (lower is better).
    Latency(Latency),
    /// Operations per second (higher is better).
    Rate(f64),
    /// A duration in milliseconds (lower is better), e.g. a failover's median.
    Millis(f64),
    /// Bytes (lower is better).
    Bytes(f64),
    /// Microseconds of CPU (lower is better).
    CpuMicros(f64),
    /// Not measured, and why.
    Absent(&'static str),
}

impl Figure {
    pub fn show(&self) -> String {
        match self {
            Figure::Latency(l) => format!("p50 {:.0} µs, p99 {:.0} µs", l.p50, l.p99),
            Figure::Rate(r) => format!("{r:.0}/s"),
            Figure::Millis(ms) => format!("{ms:.0} ms"),
            Figure::Bytes(b) if *b >= 1024.0 => format!("{:.1} KiB", b / 1024.0),
            Figure::Bytes(b) => format!("{b:.0} B"),
            Figure::CpuMicros(us) => format!("{us:.0} µs"),
            Figure::Absent(why) => format!("– ({why})"),
        }
    }

    /// A number where smaller is better (a latency's p50, a duration), or the inverse of a
    /// rate, so that `zkgate / other` reads the same way for every row: below 1 is better.
    fn cost(&self) -> Option<f64> {
        match self {
            Figure::Latency(l) => Some(l.p50),
            Figure::Rate(r) if *r > 0.0 => Some(1.0 / r),
            Figure::Millis(v) | Figure::Bytes(v) | Figure::CpuMicros(v) => Some(*v),
            _ => None,
        }
    }

    /// How much better `self` is than `other`, as a factor (2.0: twice the rate, or half the
    /// latency).
    pub fn advantage_over(&self, other: &Figure) -> Option<f64> {
        Some(other.cost()? / self.cost()?)
    }
}

/// `clients` clients at once for `duration`: client `i` is `client(i, deadline)`, which says how
/// many operations it finished before the deadline. Operations per second, all clients together.
pub async fn rate<F, Fut>(clients: usize, duration: Duration, client: F) -> f64
where
    F: Fn(usize, Instant) -> Fut,
    Fut: Future<Output = usize> + Send + 'static,
{
    let deadline = Instant::now() + duration;
    let tasks: Vec<_> = (0..clients).map(|i| tokio::spawn(client(i, deadline))).collect();
    let mut done = 0;
    for task in tasks {
        done += task.await.expect("client");
    }
    done as f64 / duration.as_secs_f64()
}

/// What an open loop measured: the latency of each operation answered, and how many were
/// refused (a system shedding load: zkgate's `429` past its limits).
pub struct Loaded {
    pub samples: Vec<Duration>,
    pub refused: usize,
    /// Of every operation, how late the pacing thread started it (the bench's own delay: a
    /// machine too busy to run the pacer on time), and how long it then waited in the client
    /// for one of the operations in flight to end (the system's slowness, as a pool feels it).
    pub paced_late: Vec<Duration>,
    pub waited_in_client: Vec<Duration>,
    /// How long each operation kept its place among those in flight: all its steps (a release
    /// or an ack after the step measured).
    pub whole: Vec<Duration>,
}

/// Most operations an open loop has in flight: the 32 clients of the closed loop that measured
/// the maximum (kazoo's open loop has 32 threads), now sending when operations fall due. Past
/// it a due operation waits in the client, and that wait counts in its latency.
pub const IN_FLIGHT: usize = 32;

/// Most operations in flight past capacity: many clients, more than zkgate serves at once
/// (`--max-in-service`, 64), so that the queue is zkgate's to shed from, not the client's.
pub const OVERLOAD_IN_FLIGHT: usize = 512;

/// Open loop: `op(i)` is due `i / rate` seconds after the start, for `duration`, however many
/// earlier ones are still running (up to `in_flight` at once, [IN_FLIGHT] in most rows; later ones wait their turn).
/// Each one's latency runs from when it was due to the instant `op` answers (when its measured
/// step got its reply; `None`: refused), so a system that falls behind is charged for the wait
/// as its users would be (no coordinated omission, which a closed loop of clients has: a slow
/// reply there delays the next request instead of counting). The due times are kept by a
/// thread of its own that sleeps to each: the runtime's timer ticks in milliseconds, coarser
/// than the latencies.
pub async fn open_loop<F, Fut>(rate: f64, duration: Duration, in_flight: usize, op: F) -> Loaded
where
    F: Fn(usize) -> Fut + Send + 'static,
    Fut: Future<Output = Option<Instant>> + Send + 'static,
{
    let runtime = tokio::runtime::Handle::current();
    let in_flight = std::sync::Arc::new(tokio::sync::Semaphore::new(in_flight));
    let count = (rate * duration.as_secs_f64()).max(1.0) as usize;
    let start = Instant::now() + Duration::from_millis(10);
    let pacer = std::thread::spawn(move || {
        (0..count)
            .map(|i| {
                let due = start + Duration::from_secs_f64(i as f64 / rate);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                let paced = Instant::now();
                let (answered, in_flight) = (op(i), in_flight.clone());
                runtime.spawn(async move {
                    let _turn = in_flight.acquire_owned().await.expect("never closed");
                    let turn = Instant::now();
                    let latency = answered.await.map(|at| at.saturating_duration_since(due));
                    let whole = turn.elapsed();
                    (
                        latency,
                        paced.saturating_duration_since(due),
                        turn.saturating_duration_since(paced),
                        whole,
                    )
                })
            })
            .collect::<Vec<_>>()
    });
    let tasks = tokio::task::spawn_blocking(move || pacer.join().expect("pacer"))
        .await
        .expect("pacer");
    let mut loaded = Loaded {
        samples: Vec::with_capacity(tasks.len()),
        refused: 0,
        paced_late: Vec::with_capacity(tasks.len()),
        waited_in_client: Vec::with_capacity(tasks.len()),
        whole: Vec::with_capacity(tasks.len()),
    };
    for task in tasks {
        let (latency, paced_late, waited, whole) = task.await.expect("operation");
        match latency {
            Some(latency) => loaded.samples.push(latency),
            None => loaded.refused += 1,
        }
        loaded.paced_late.push(paced_late);
        loaded.waited_in_client.push(waited);
        loaded.whole.push(whole);
    }
    loaded
}

/// `op(n)` for every `n` in `range`, by 32 tasks at once (task `c` takes `start + c`, then every
/// 32nd after it): how the bench fills zkgate with leases, locks, keys and items.
pub async fn each_by_32<F, Fut>(range: std::ops::Range<usize>, op: F)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let tasks: Vec<_> = (0..32)
        .map(|c| {
            let (op, range) = (op.clone(), range.clone());
            tokio::spawn(async move {
                for n in (range.start + c..range.end).step_by(32) {
                    op(n).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a task of each_by_32");
    }
}
