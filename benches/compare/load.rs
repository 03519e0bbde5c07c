//! The compare bench's load group: open loops at shares of a system's maximum rate, what
//! each point measured (and, for zkgate, where a request's time went), and the tables and
//! ratios printed from them.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::stats::{self, Latency};
use crate::{gate, process, scrape};

/// The shares of the maximum rate the open loop runs at.
pub const SHARES: [f64; 2] = [0.5, 0.8];
pub const ACQUIRE: &str = "lock acquire (then release), 1,024 locks";
/// The locks the open loop cycles through (operation `i` on lock `i % LOAD_LOCKS`, with lease
/// `i + i / LOAD_LOCKS` of 32: the leases take turns, and two operations that meet on a lock
/// are two contenders, never one lease asking twice, which zkgate and etcd answer with the
/// handle it already has): enough that two operations in flight rarely meet on one.
pub const LOAD_LOCKS: usize = 1024;

/// Runs `op` once for each of the [LOAD_LOCKS] locks, 32 at a time, before the measuring: the
/// first acquire of a lock also makes its parent node, which users' long-lived locks have.
pub async fn warm<F, Fut>(op: F)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Option<Instant>> + Send + 'static,
{
    stats::each_by_32(0..LOAD_LOCKS, move |i| {
        let answered = op(i);
        async move {
            answered.await.expect("not refused");
        }
    })
    .await;
}
pub const TAKE: &str = "queue take (then ack)";

/// One workload of one system under load: its maximum rate, and the latency at each share.
pub struct LoadRow {
    workload: &'static str,
    system: &'static str,
    max: f64,
    points: Vec<LoadPoint>,
}

/// An open loop at one rate.
pub struct LoadPoint {
    rate: f64,
    /// Of the operations answered.
    latency: Latency,
    /// Operations answered.
    served: usize,
    /// Operations refused (`429`, or zkgate's `503 overloaded`).
    refused: usize,
    /// Where zkgate's time went ([scrape::Scrape::show], ZooKeeper's latency), if watched.
    breakdown: Option<String>,
    /// zkgate's CPU time per operation (two requests: the measured one and its release or ack).
    cpu_micros: Option<f64>,
    /// The cores each watched process kept busy meanwhile.
    cores: Vec<(&'static str, f64)>,
    /// The CPU time each watched process spent per operation served or refused, in µs.
    cpu_per_operation: Vec<(&'static str, f64)>,
}

impl LoadPoint {
    pub fn show(&self) -> String {
        let mut shown = format!(
            "{:.0}/s: p50 {:.0} µs, p99 {:.0} µs",
            self.rate, self.latency.p50, self.latency.p99
        );
        if let Some(cpu) = self.cpu_micros {
            shown += &format!(", zkgate CPU {cpu:.0} µs an operation");
        }
        if self.refused > 0 {
            let share = self.refused as f64 * 100.0 / (self.refused + self.served).max(1) as f64;
            shown += &format!(", {} refused ({share:.0}%)", self.refused);
        }
        if !self.cores.is_empty() {
            let cores: Vec<String> = self.cores.iter().map(|(who, n)| format!("{who} {n:.2}")).collect();
            shown += &format!("; CPUs busy: {}", cores.join(", "));
        }
        shown
    }

    /// Latencies measured elsewhere (kazoo's own open loop).
    pub fn of(rate: f64, samples: &[Duration]) -> LoadPoint {
        LoadPoint {
            rate,
            latency: Latency::of(samples),
            served: samples.len(),
            refused: 0,
            breakdown: None,
            cpu_micros: None,
            cores: Vec::new(),
            cpu_per_operation: Vec::new(),
        }
    }

    /// The rate it reached: operations answered a second.
    pub fn served_rate(&self, duration: Duration) -> f64 {
        self.served as f64 / duration.as_secs_f64()
    }

    /// The p50 of what was answered, in µs.
    pub fn p50(&self) -> f64 {
        self.latency.p50
    }

    /// CPU time `who` (one of the watched) spent per operation, in µs.
    pub fn cpu_of(&self, who: &str) -> Option<f64> {
        self.cpu_per_operation
            .iter()
            .find(|(w, _)| *w == who)
            .map(|(_, micros)| *micros)
    }

    /// `op` in an open loop at `rate` for `duration`, and the CPU time of each of `watched`
    /// (who, pid) meanwhile: zkgate's (named `zkgate`) per operation.
    pub async fn measure<F, Fut>(rate: f64, duration: Duration, watched: &[(&'static str, String)], op: F) -> LoadPoint
    where
        F: Fn(usize) -> Fut + Send + 'static,
        Fut: Future<Output = Option<Instant>> + Send + 'static,
    {
        LoadPoint::measure_inside(rate, duration, watched, stats::IN_FLIGHT, None, op).await
    }

    /// [LoadPoint::measure] with at most `in_flight` operations at once, and where zkgate's
    /// time goes meanwhile (its `/metrics` and ZooKeeper's `mntr`) if `inside` is given.
    pub async fn measure_inside<F, Fut>(
        rate: f64,
        duration: Duration,
        watched: &[(&'static str, String)],
        in_flight: usize,
        inside: Option<&Inside>,
        op: F,
    ) -> LoadPoint
    where
        F: Fn(usize) -> Fut + Send + 'static,
        Fut: Future<Output = Option<Instant>> + Send + 'static,
    {
        // When each point starts, for tracing one point from outside (`perf sched record`).
        eprintln!("open loop at {rate:.0}/s starts ({in_flight} in flight)");
        let scraped = match inside {
            Some(inside) => {
                scrape::reset_zookeeper(&inside.zookeeper);
                Some(inside.gate.scrape().await)
            }
            None => None,
        };
        let before: Vec<Duration> = watched.iter().map(|(_, pid)| process::cpu_time_of(pid)).collect();
        let (start, from_ms) = (Instant::now(), zkgate::time::now_ms());
        let loaded = stats::open_loop(rate, duration, in_flight, op).await;
        let elapsed = start.elapsed().as_secs_f64();
        let to_ms = zkgate::time::now_ms();
        let (late, waited) = (Latency::of(&loaded.paced_late), Latency::of(&loaded.waited_in_client));
        let whole = Latency::of(&loaded.whole);
        let client = format!(
            "sent late by the bench's pacer p50 {:.0} µs, p99 {:.0} µs; waited in the client for a turn p50 {:.0} µs, \
             p99 {:.0} µs; whole operation (with its release or ack) p50 {:.0} µs, p99 {:.0} µs",
            late.p50, late.p99, waited.p50, waited.p99, whole.p50, whole.p99
        );
        let breakdown = match (inside, scraped) {
            (Some(inside), Some(before)) => Some(format!(
                "{}; {}; {}; {client}",
                inside.gate.scrape().await.since(&before).show(),
                scrape::zookeeper_latency(&inside.zookeeper),
                gc_pauses(&inside.gc_log, from_ms, to_ms),
            )),
            _ => Some(client),
        };
        let used: Vec<(&'static str, f64)> = watched
            .iter()
            .zip(before)
            .map(|((who, pid), before)| (*who, process::cpu_time_of(pid).saturating_sub(before).as_secs_f64()))
            .collect();
        let operations = (loaded.samples.len() + loaded.refused).max(1) as f64;
        LoadPoint {
            rate,
            latency: Latency::of(&loaded.samples),
            served: loaded.samples.len(),
            refused: loaded.refused,
            breakdown,
            cpu_micros: used
                .iter()
                .find(|(who, _)| *who == "zkgate")
                .map(|(_, seconds)| seconds * 1e6 / operations),
            cores: used.iter().map(|(who, seconds)| (*who, seconds / elapsed)).collect(),
            cpu_per_operation: used
                .into_iter()
                .map(|(who, seconds)| (who, seconds * 1e6 / operations))
                .collect(),
        }
    }
}

impl LoadRow {
    pub fn new(workload: &'static str, system: &'static str, max: f64, points: Vec<LoadPoint>) -> LoadRow {
        for point in &points {
            eprintln!("{workload}, {system} (max {max:.0}/s) at {}", point.show());
        }
        LoadRow {
            workload,
            system,
            max,
            points,
        }
    }
}

/// What [LoadPoint::measure_inside] reads to say where zkgate's time goes.
pub struct Inside {
    pub gate: Arc<gate::Zkgate>,
    /// ZooKeeper's `host:port`, for its four-letter words.
    pub zookeeper: String,
    /// Its JVM's log of collections, for the pauses in a point's seconds.
    pub gc_log: std::path::PathBuf,
}

/// ZooKeeper's collection pauses between `from_ms` and `to_ms`: how many, their sum, the longest.
fn gc_pauses(log: &std::path::Path, from_ms: i64, to_ms: i64) -> String {
    let span = |ms: i64| u128::try_from(ms).unwrap_or_default();
    let pauses = zkgate::zk::server::gc_pauses_in(log, span(from_ms), span(to_ms));
    let total: Duration = pauses.iter().map(|(_, pause)| *pause).sum();
    let longest = pauses.iter().map(|(_, pause)| *pause).max().unwrap_or_default();
    format!(
        "ZooKeeper's collections: {} pauses, {:.1} ms in all, the longest {:.1} ms",
        pauses.len(),
        total.as_secs_f64() * 1e3,
        longest.as_secs_f64() * 1e3
    )
}

/// The header of the table [equal_rate_row] makes rows of, at `rate` a second.
pub fn equal_rate_header(rate: f64) -> String {
    format!(
        "| at one offered rate, {rate:.0}/s: {ACQUIRE} | reached | p50 | ZooKeeper CPU a cycle | ZooKeeper requests \
         a cycle | zkgate CPU a cycle | etcd CPU a cycle |\n|---|---|---|---|---|---|---|"
    )
}

/// `op` in an open loop at `rate` for `duration`: a row of what the system (`system`) and
/// ZooKeeper (at `zookeeper`, if it is on ZooKeeper) spent per cycle. At one rate for every
/// system, since ZooKeeper's CPU per request falls steeply as its rate rises (it batches its
/// work), so figures at each system's own share of its maximum do not compare.
pub async fn equal_rate_row<F, Fut>(
    system: &str,
    rate: f64,
    duration: Duration,
    watched: &[(&'static str, String)],
    zookeeper: Option<&str>,
    op: F,
) -> String
where
    F: Fn(usize) -> Fut + Send + 'static,
    Fut: Future<Output = Option<Instant>> + Send + 'static,
{
    let before = zookeeper.and_then(scrape::zookeeper_requests);
    let point = LoadPoint::measure(rate, duration, watched, op).await;
    let after = zookeeper.and_then(scrape::zookeeper_requests);
    let operations = (point.served + point.refused).max(1) as f64;
    let requests = match (before, after) {
        (Some(before), Some(after)) => format!("{:.2}", after.saturating_sub(before) as f64 / operations),
        _ => "–".into(),
    };
    let cpu = |who: &str| point.cpu_of(who).map_or("–".into(), |micros| format!("{micros:.0} µs"));
    let row = format!(
        "| {system} | {:.0}/s | {:.0} µs | {} | {requests} | {} | {} |",
        point.served_rate(duration),
        point.p50(),
        cpu("ZooKeeper"),
        cpu("zkgate"),
        cpu("etcd")
    );
    eprintln!("{row}");
    row
}

/// Shares of zkgate's maximum past its capacity: what it serves and how fast, what it sheds.
pub const OVERLOAD_SHARES: [f64; 2] = [1.2, 2.0];

/// `op` in an open loop at each of `rates`, for `duration` each, at most `in_flight` at once,
/// watching where zkgate's time goes if `inside` is given ([LoadPoint::measure_inside]).
pub async fn points_inside<F, Fut>(
    rates: Vec<f64>,
    duration: Duration,
    watched: &[(&'static str, String)],
    in_flight: usize,
    inside: Option<&Inside>,
    op: F,
) -> Vec<LoadPoint>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Option<Instant>> + Send + 'static,
{
    let mut points = Vec::new();
    for rate in rates {
        points.push(LoadPoint::measure_inside(rate, duration, watched, in_flight, inside, op.clone()).await);
    }
    points
}

/// `op` in an open loop at each of [SHARES] of `max` a second, for `duration` each.
pub async fn at_shares<F, Fut>(
    max: f64,
    duration: Duration,
    watched: &[(&'static str, String)],
    op: F,
) -> Vec<LoadPoint>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Option<Instant>> + Send + 'static,
{
    let rates = SHARES.iter().map(|share| max * share).collect();
    points_inside(rates, duration, watched, stats::IN_FLIGHT, None, op).await
}

pub fn report_load(rows: &[LoadRow]) {
    if rows.is_empty() {
        return;
    }
    println!();
    println!(
        "| under load (open loop) | system | max rate (32 clients, closed loop) | at 50%: p50, p99 | at 80%: p50, p99 |"
    );
    println!("|---|---|---|---|---|");
    for row in rows {
        print_row(row);
    }
}

/// One row of a load table: the workload, the system, its maximum and its two points.
fn print_row(row: &LoadRow) {
    println!(
        "| {} | {} | {:.0}/s | {} | {} |",
        row.workload,
        row.system,
        row.max,
        row.points[0].show(),
        row.points[1].show()
    );
}

/// zkgate's tails against etcd's at etcd's own rates, as ratios (below 1: zkgate's shorter).
fn compare_at_etcd_rates(rows: &[LoadRow]) {
    let find = |system: &str| rows.iter().find(|r| r.workload == ACQUIRE && r.system == system);
    let (Some(zkgate), Some(etcd)) = (find("zkgate at etcd's rates"), find("etcd")) else {
        return;
    };
    for (i, share) in SHARES.iter().enumerate() {
        let (z, e) = (&zkgate.points[i].latency, &etcd.points[i].latency);
        println!(
            "- At {:.0}% of etcd's maximum ({:.0}/s), zkgate against etcd: p50 {:.2}x, p99 {:.2}x",
            share * 100.0,
            etcd.max * share,
            z.p50 / e.p50,
            z.p99 / e.p99
        );
    }
}

/// Past capacity: the p99 of what zkgate served against its p99 at 80%, and the share shed.
pub fn report_overload(rows: &[LoadRow], load: &[LoadRow]) {
    compare_at_etcd_rates(load);
    if rows.is_empty() {
        return;
    }
    println!();
    println!(
        "| past capacity (open loop, {} in flight) | system | max | at 120% | at 200% |",
        stats::OVERLOAD_IN_FLIGHT
    );
    println!("|---|---|---|---|---|");
    for row in rows {
        print_row(row);
        let at_80 = load
            .iter()
            .find(|r| r.workload == row.workload && r.system == row.system)
            .map(|r| r.points[1].latency.p99);
        if let Some(at_80) = at_80 {
            for (point, share) in row.points.iter().zip(OVERLOAD_SHARES) {
                println!(
                    "- At {:.0}%: the p99 of what was served is {:.2}x the p99 at 80%",
                    share * 100.0,
                    point.latency.p99 / at_80
                );
            }
        }
    }
}

/// Where zkgate's time went at each point that watched it.
pub fn report_breakdown<'a>(rows: impl Iterator<Item = &'a LoadRow>) {
    println!();
    for row in rows {
        for point in &row.points {
            if let Some(breakdown) = &point.breakdown {
                println!("- {}, {} at {:.0}/s: {breakdown}", row.workload, row.system, point.rate);
            }
        }
    }
}
