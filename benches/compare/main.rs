//! zkgate against the raw ZooKeeper floor and against what users would pick instead, in one
//! run on one machine: kazoo's recipes on the same ZooKeeper, and etcd's HTTP lock and
//! election API.
//!
//! Run: `cargo bench --bench compare` (prints a Markdown table for BENCHMARKS.md).
//! `ZKGATE_BENCH_ONLY=zkgate` leaves kazoo and etcd out (to profile zkgate).
//! `ZKGATE_BENCH_WORKLOADS=uncontended,queue` runs only those groups of rows (`memory`,
//! `uncontended`, `contended`, `queue`, `failover`, `curves`; all by default), e.g. under
//! `perf`.
//! `ZKGATE_BENCH_QUICK=1` makes every workload tiny: CI runs it so that the bench cannot rot
//! (it asserts what each system answered, never how fast).
//!
//! Everything shares the machine: ZooKeeper (standalone, `forceSync=no`), zkgate (the release
//! binary, its own process), etcd (single member, data in `/dev/shm`), kazoo (Python threads),
//! and this client. kazoo or etcd missing: their columns say so.

mod etcd;
mod floor;
mod gate;
mod kazoo;
mod process;
mod runtime;
mod stats;

use std::sync::Arc;
use std::time::Duration;

use stats::{Figure, Latency};
use zkgate::zk::server::{ServerOptions, ZooKeeperServer};

/// Sizes of the workloads.
struct Sizes {
    cycles: usize,
    warmup: usize,
    seconds: Duration,
    items: usize,
    failovers: usize,
    leases: usize,
    /// Idle leases held at each point of the cost curve (cumulative), and the cycles measured
    /// at each.
    lease_curve: &'static [usize],
    curve_cycles: usize,
    /// Locks held, and keys under one prefix, at each point of their curves.
    lock_curve: &'static [usize],
    key_curve: &'static [usize],
}

impl Sizes {
    fn from_env() -> Sizes {
        if std::env::var_os("ZKGATE_BENCH_QUICK").is_some() {
            Sizes {
                cycles: 100,
                warmup: 50,
                seconds: Duration::from_millis(500),
                items: 100,
                failovers: 2,
                leases: 500,
                lease_curve: &[10, 200],
                curve_cycles: 50,
                lock_curve: &[10, 200],
                key_curve: &[10, 200],
            }
        } else {
            Sizes {
                cycles: 3000,
                warmup: 1000,
                seconds: Duration::from_secs(5),
                items: 3000,
                failovers: 7,
                leases: 10_000,
                lease_curve: &[10, 1_000, 10_000, 100_000],
                curve_cycles: 2_000,
                lock_curve: &[10, 1_000, 10_000, 100_000],
                key_curve: &[1_000, 10_000, 100_000],
            }
        }
    }
}

/// One row: a workload and each system's figure.
struct Row {
    workload: String,
    floor: Figure,
    zkgate: Figure,
    kazoo: Figure,
    etcd: Figure,
}

pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true)
        .build()
        .expect("http client")
}

fn main() {
    runtime::block_on(run());
}

/// Whether the group of rows `group` is to run (`ZKGATE_BENCH_WORKLOADS`).
fn wanted(group: &str) -> bool {
    std::env::var("ZKGATE_BENCH_WORKLOADS").map_or(true, |groups| groups.split(',').any(|g| g.trim() == group))
}

fn median_millis(samples: &[Duration]) -> Figure {
    Figure::Millis(Latency::of(samples).p50 / 1000.0)
}

async fn run() {
    let sizes = Sizes::from_env();
    let options = ServerOptions {
        force_sync: false,
        ..ServerOptions::default()
    };
    let server = ZooKeeperServer::start_standalone(&options).await.expect("ZooKeeper");
    let connect = server.connect_string();
    let floor = floor::Floor::connect(&connect).await;
    let gate = Arc::new(gate::Zkgate::start(&connect).await);
    // `ZKGATE_BENCH_ONLY=zkgate`: zkgate and the floor alone (for profiling zkgate).
    let peers = std::env::var("ZKGATE_BENCH_ONLY").map_or(true, |only| only != "zkgate");
    let kazoo = kazoo::Kazoo::new(&connect).filter(|_| peers);
    let etcd = match peers {
        true => etcd::Etcd::start().await.map(Arc::new),
        false => None,
    };
    let no_kazoo = || Figure::Absent("python3-kazoo missing");
    let no_etcd = || Figure::Absent("etcd missing");
    let mut rows = Vec::new();
    let mut budgets = Vec::new();

    // First, while zkgate's heap is fresh (freed memory from the workloads would hide the
    // leases' growth): memory per idle lease.
    let lease_bytes = match wanted("memory") {
        true => Some(gate.idle_lease_bytes(sizes.leases).await),
        false => None,
    };

    // Uncontended cycle. Warm up every side (JIT, connections), then measure the floor and
    // zkgate in alternating short rounds, so that the shared machine's bursts of noise hit
    // all three alike.
    if wanted("uncontended") {
        floor.serial(sizes.warmup).await;
        floor.pipelined(sizes.warmup).await;
        gate.cycles(sizes.warmup).await;
        let (mut serial, mut pipelined, mut http) = (Vec::new(), Vec::new(), Vec::new());
        let mut cpu = Duration::ZERO;
        let round = 200.min(sizes.cycles);
        for _ in 0..sizes.cycles / round {
            serial.extend(floor.serial(round).await);
            pipelined.extend(floor.pipelined(round).await);
            let cpu_before = gate.child.cpu_time();
            http.extend(gate.cycles(round).await);
            cpu += gate.child.cpu_time().saturating_sub(cpu_before);
        }
        let (serial, pipelined, http) = (Latency::of(&serial), Latency::of(&pipelined), Latency::of(&http));
        let kazoo_cycle = kazoo.as_ref().map_or_else(no_kazoo, |k| {
            k.cycles(sizes.warmup);
            Figure::Latency(Latency::of(&k.cycles(sizes.cycles)))
        });
        let etcd_cycle = match &etcd {
            Some(e) => {
                e.cycles(sizes.warmup).await;
                Figure::Latency(Latency::of(&e.cycles(sizes.cycles).await))
            }
            None => no_etcd(),
        };
        push(
            &mut rows,
            Row {
                workload: "uncontended lock cycle (serial floor: create, getChildren, delete)".into(),
                floor: Figure::Latency(serial),
                zkgate: Figure::Latency(http),
                kazoo: kazoo_cycle,
                etcd: etcd_cycle,
            },
        );
        push(
            &mut rows,
            Row {
                workload: "uncontended lock cycle (pipelined floor: create + getChildren, delete)".into(),
                floor: Figure::Latency(pipelined),
                zkgate: Figure::Latency(http),
                kazoo: Figure::Absent("above"),
                etcd: Figure::Absent("above"),
            },
        );
        push(
            &mut rows,
            Row {
                workload: "one HTTP round trip to zkgate (GET /healthz, no ZooKeeper)".into(),
                floor: Figure::Absent("n/a"),
                zkgate: Figure::Latency(Latency::of(&gate.health_round_trips(sizes.cycles).await)),
                kazoo: Figure::Absent("n/a"),
                etcd: Figure::Absent("n/a"),
            },
        );
        push(
            &mut rows,
            Row {
                workload: "zkgate CPU per HTTP request (uncontended cycle)".into(),
                floor: Figure::Absent("n/a"),
                zkgate: Figure::CpuMicros(cpu.as_secs_f64() * 1e6 / (2 * sizes.cycles) as f64),
                kazoo: Figure::Absent("n/a"),
                etcd: Figure::Absent("n/a"),
            },
        );
    }

    // Contention: one lock, 32 clients; then many locks, one client each. The floor runs the
    // recipe itself on raw sessions, as many as zkgate opens: what ZooKeeper alone can do.
    let contended = if wanted("contended") {
        &[
            (32, 1, "one lock, 32 clients: grants per second"),
            (32, 32, "32 locks, 32 clients: cycles per second"),
            (64, 64, "64 locks, 64 clients: cycles per second"),
        ][..]
    } else {
        &[]
    };
    for &(clients, locks, what) in contended {
        let raw = Figure::Rate(floor.contended(clients, locks, sizes.seconds).await);
        // Where the machine's CPU goes while zkgate runs it: zkgate, ZooKeeper, this client.
        let pids = [
            ("zkgate", gate.child.pid().to_string()),
            ("ZooKeeper", server.pid().map_or("self".into(), |p| p.to_string())),
            ("the bench client", "self".to_string()),
        ];
        let before: Vec<Duration> = pids.iter().map(|(_, pid)| process::cpu_time_of(pid)).collect();
        let zkgate = Figure::Rate(gate.contended(clients, locks, sizes.seconds).await);
        let used: Vec<String> = pids
            .iter()
            .zip(before)
            .map(|((who, pid), before)| {
                let cores =
                    process::cpu_time_of(pid).saturating_sub(before).as_secs_f64() / sizes.seconds.as_secs_f64();
                format!("{who} {cores:.2}")
            })
            .collect();
        budgets.push(format!("{what}: CPUs busy: {}", used.join(", ")));
        let kazoo = kazoo
            .as_ref()
            .map_or_else(no_kazoo, |k| Figure::Rate(k.contended(clients, locks, sizes.seconds)));
        let etcd = match &etcd {
            Some(e) => Figure::Rate(e.contended(clients, locks, sizes.seconds).await),
            None => no_etcd(),
        };
        push(
            &mut rows,
            Row {
                workload: what.into(),
                floor: raw,
                zkgate,
                kazoo,
                etcd,
            },
        );
    }

    // How cost grows: the uncontended cycle and memory per lease with more and more idle
    // leases held (on a zkgate of its own, so that the rows above ran on a fresh one).
    let mut curve = Vec::new();
    let mut lock_curve = Vec::new();
    let mut key_curve = Vec::new();
    if wanted("curves") {
        let curved = Arc::new(gate::Zkgate::start(&connect).await);
        let mut held = 0;
        for &target in sizes.lease_curve {
            let rss_before = curved.child.rss_bytes();
            curved.hold_leases(target - held).await;
            let point = CurvePoint::measure(&curved, target, target - held, rss_before, sizes.curve_cycles).await;
            held = target;
            eprintln!(
                "{} idle leases: cycle p50 {:.0} µs, CPU {:.0} µs a request",
                point.count, point.cycle.p50, point.cpu_micros
            );
            curve.push(point);
        }
        // Locks held by others (a hundred leases): acquiring and releasing another.
        let holders = Arc::new(futures::future::join_all((0..100).map(|_| curved.lease("1h"))).await);
        let mut locked = 0;
        for &target in sizes.lock_curve {
            let rss_before = curved.child.rss_bytes();
            curved.hold_locks(locked, target, &holders).await;
            lock_curve
                .push(CurvePoint::measure(&curved, target, target - locked, rss_before, sizes.curve_cycles).await);
            locked = target;
        }
        // Keys under one prefix: reading one, and the first page of the list.
        let mut keys = 0;
        for &target in sizes.key_curve {
            curved.put_keys("many", keys, target).await;
            keys = target;
            let read = Latency::of(&curved.reads("/v1/kv/many/k0000000", sizes.curve_cycles).await);
            let list = Latency::of(
                &curved
                    .reads("/v1/kv?prefix=many&limit=1000", sizes.curve_cycles / 10)
                    .await,
            );
            key_curve.push((target, read, list));
        }
    }

    // Queues: 32 producers, then 32 consumers taking at least once and acknowledging.
    if wanted("queue") {
        push(
            &mut rows,
            Row {
                workload: "queue put, 32 producers: items per second".into(),
                floor: Figure::Absent("n/a"),
                zkgate: Figure::Rate(gate.queue_put(32, sizes.seconds).await),
                kazoo: kazoo
                    .as_ref()
                    .map_or_else(no_kazoo, |k| Figure::Rate(k.queue_put(32, sizes.seconds))),
                etcd: Figure::Absent("no queue API"),
            },
        );
        push(
            &mut rows,
            Row {
                workload: "queue take + ack (at least once), 32 consumers: items per second".into(),
                floor: Figure::Absent("n/a"),
                zkgate: Figure::Rate(gate.queue_take_ack(32, sizes.items, 1).await),
                kazoo: kazoo
                    .as_ref()
                    .map_or_else(no_kazoo, |k| Figure::Rate(k.queue_take(32, sizes.items))),
                etcd: Figure::Absent("no queue API"),
            },
        );
        push(
            &mut rows,
            Row {
                workload: "queue take + ack in batches of 10 (`max_items`, batch ack), 32 consumers: items per second"
                    .into(),
                floor: Figure::Absent("n/a"),
                zkgate: Figure::Rate(gate.queue_take_ack(32, sizes.items, 10).await),
                kazoo: Figure::Absent("no batches"),
                etcd: Figure::Absent("no queue API"),
            },
        );
    }

    // Election failover: the leader's lease (session) ends; the next candidate learns it leads.
    if wanted("failover") {
        push(
            &mut rows,
            Row {
                workload: "election failover after the leader's lease ends (median)".into(),
                floor: Figure::Absent("n/a"),
                zkgate: median_millis(&gate.failover(sizes.failovers).await),
                kazoo: kazoo
                    .as_ref()
                    .map_or_else(no_kazoo, |k| median_millis(&k.failover(sizes.failovers))),
                etcd: match &etcd {
                    Some(e) => median_millis(&e.failover(sizes.failovers).await),
                    None => no_etcd(),
                },
            },
        );
    }

    if let Some(lease_bytes) = lease_bytes {
        push(
            &mut rows,
            Row {
                workload: format!("zkgate memory per idle lease ({} leases)", sizes.leases),
                floor: Figure::Absent("n/a"),
                zkgate: Figure::Bytes(lease_bytes),
                kazoo: Figure::Absent("n/a"),
                etcd: Figure::Absent("n/a"),
            },
        );
    }

    report(&rows);
    if !curve.is_empty() {
        report_curve("idle leases held", &curve);
        report_curve("locks held by others", &lock_curve);
        println!();
        println!(
            "| keys under the prefix | read one key | list a page of 1,000 | read vs the first | list vs the first |"
        );
        println!("|---|---|---|---|---|");
        for (keys, read, list) in &key_curve {
            println!(
                "| {keys} | p50 {:.0} µs, p99 {:.0} µs | p50 {:.0} µs, p99 {:.0} µs | {:.2}x | {:.2}x |",
                read.p50,
                read.p99,
                list.p50,
                list.p99,
                read.p50 / key_curve[0].1.p50,
                list.p50 / key_curve[0].2.p50,
            );
        }
    }
    println!();
    for budget in budgets {
        println!(
            "- {budget} (of {} CPUs)",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
    }
    drop(server);
}

/// Adds a row, and says so on stderr as the run goes (a full run takes minutes).
fn push(rows: &mut Vec<Row>, row: Row) {
    eprintln!(
        "{}: zkgate {}, kazoo {}, etcd {}, floor {}",
        row.workload,
        row.zkgate.show(),
        row.kazoo.show(),
        row.etcd.show(),
        row.floor.show()
    );
    rows.push(row);
}

/// One point of a cost curve.
struct CurvePoint {
    /// How many leases (or locks...) were held.
    count: usize,
    cycle: Latency,
    cpu_micros: f64,
    /// Memory per one of those added since the previous point (too few added: none).
    bytes_per_one: Option<f64>,
}

impl CurvePoint {
    /// The point at `count` held, `added` of them since the resident memory was `rss_before`:
    /// a quarter of `cycles` to warm up, then `cycles` uncontended cycles and zkgate's CPU.
    async fn measure(gate: &gate::Zkgate, count: usize, added: usize, rss_before: u64, cycles: usize) -> CurvePoint {
        let per_one = gate.child.rss_bytes().saturating_sub(rss_before) as f64 / added as f64;
        gate.cycles(cycles / 4).await;
        let cpu_before = gate.child.cpu_time();
        let samples = gate.cycles(cycles).await;
        let cpu = gate.child.cpu_time().saturating_sub(cpu_before);
        CurvePoint {
            count,
            cycle: Latency::of(&samples),
            cpu_micros: cpu.as_secs_f64() * 1e6 / (2 * cycles) as f64,
            bytes_per_one: (added >= 500).then_some(per_one),
        }
    }
}

fn report_curve(what: &str, points: &[CurvePoint]) {
    println!();
    println!(
        "| {what} | uncontended cycle | CPU per request | memory per one added | cycle p50 vs the first | CPU vs the first |"
    );
    println!("|---|---|---|---|---|---|");
    let first = &points[0];
    for point in points {
        println!(
            "| {} | p50 {:.0} µs, p99 {:.0} µs | {:.0} µs | {} | {:.2}x | {:.2}x |",
            point.count,
            point.cycle.p50,
            point.cycle.p99,
            point.cpu_micros,
            point
                .bytes_per_one
                .map_or("–".into(), |b| format!("{:.2} KiB", b / 1024.0)),
            point.cycle.p50 / first.cycle.p50,
            point.cpu_micros / first.cpu_micros,
        );
    }
}

fn report(rows: &[Row]) {
    println!(
        "| workload | raw floor | zkgate | kazoo | etcd (HTTP) | zkgate vs floor | zkgate vs kazoo | zkgate vs etcd |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let ratio = |zkgate: &Figure, other: &Figure| match zkgate.advantage_over(other) {
        Some(factor) => format!("{factor:.2}x"),
        None => "–".into(),
    };
    for row in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            row.workload,
            row.floor.show(),
            row.zkgate.show(),
            row.kazoo.show(),
            row.etcd.show(),
            ratio(&row.zkgate, &row.floor),
            ratio(&row.zkgate, &row.kazoo),
            ratio(&row.zkgate, &row.etcd),
        );
    }
    println!();
    println!(
        "Ratios are zkgate's advantage: above 1 means zkgate is faster (higher rate, lower latency \
         or time); against the floor, below 1 is zkgate's overhead (the floor's p50 / zkgate's p50)."
    );
}
