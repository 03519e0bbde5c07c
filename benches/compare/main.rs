//! zkgate against the raw ZooKeeper floor and against what users would pick instead, in one
//! run on one machine: kazoo's recipes on the same ZooKeeper, and etcd's HTTP lock and
//! election API.
//!
//! Run: `cargo bench --bench compare` (prints a Markdown table for BENCHMARKS.md).
//! `ZKGATE_BENCH_ONLY=zkgate` leaves kazoo and etcd out (to profile zkgate).
//! `ZKGATE_BENCH_WORKLOADS=uncontended,queue` runs only those groups of rows (`memory`,
//! `edge`, `uncontended`, `txn`, `contended`, `queue`, `failover`, `leases`, `curves`, `load`, `ensemble`;
//! all by default), e.g. under `perf`.
//! `ZKGATE_BENCH_BINARY=<path>` runs another build of zkgate (an earlier commit's) in its place,
//! to measure a change before and after with the same bench.
//! `ZKGATE_BENCH_ZKGATE_ARGS="--worker-threads 1"` adds arguments to every zkgate started (to
//! compare its settings).
//! `ZKGATE_BENCH_QUICK=1` makes every workload tiny: CI runs it so that the bench cannot rot
//! (it asserts what each system answered, never how fast).
//!
//! (Over 600 lines: `run` takes the groups of rows in order, each a block that starts what it
//! measures and pushes its rows, so that the order of a run reads top to bottom; the load
//! group's measuring and reports are in `load.rs`, each system's client in its own file.)
//!
//! Everything shares the machine: ZooKeeper (standalone, `forceSync=no`), zkgate (the release
//! binary, its own process), etcd (single member, data in `/dev/shm`), kazoo (Python threads),
//! and this client. kazoo or etcd missing: their columns say so.

mod edge;
mod etcd;
mod floor;
mod gate;
mod instances;
mod kazoo;
mod leases;
mod load;
// Its zkgate and ZooKeeper starters serve the other benches; this one starts its own.
#[allow(dead_code)]
mod process;
mod runtime;
mod scrape;
mod stats;

use std::sync::Arc;
use std::time::Duration;

use std::time::Instant;

use load::{
    ACQUIRE, Inside, LOAD_LOCKS, LoadPoint, LoadRow, OVERLOAD_SHARES, SHARES, TAKE, at_shares, equal_rate_header,
    equal_rate_row, points_inside, report_breakdown, report_load, report_overload, warm,
};
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
    /// Waiters queued on one lock at each point, and the hand-overs measured at each.
    waiter_curve: &'static [usize],
    handovers: usize,
    /// WebSockets subscribed to one topic at each point (cumulative).
    subscriber_curve: &'static [usize],
    /// Leases created (and kept alive) one after the other, and idle leases held, for their
    /// costs.
    lease_costs: usize,
    idle_leases: usize,
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
                waiter_curve: &[10, 50],
                handovers: 5,
                subscriber_curve: &[10, 50],
                lease_costs: 100,
                idle_leases: 500,
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
                key_curve: &[1_000, 10_000, 100_000, 1_000_000],
                waiter_curve: &[10, 100, 1_000],
                handovers: 30,
                subscriber_curve: &[100, 1_000, 5_000],
                lease_costs: 2_000,
                idle_leases: 100_000,
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
        // Room for the open loop's bursts: a pool that closes the connections a burst opened
        // makes the next burst pay for new ones.
        .pool_max_idle_per_host(4096)
        .tcp_nodelay(true)
        .build()
        .expect("http client")
}

// zkgate's allocator, so that the bare axum server this binary also is ([edge]) allocates as
// zkgate does; the clients here allocate with it too.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    edge::serve_bare_if_asked();
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
        // A million keys and a hundred thousand locks and leases fit.
        heap_mb: 3072,
        ..ServerOptions::default()
    };
    let server = ZooKeeperServer::start_standalone(&options).await.expect("ZooKeeper");
    let connect = server.connect_string();
    let floor = Arc::new(floor::Floor::connect(&connect).await);
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

    // The HTTP edge: CPU per request of a bare axum server and of zkgate's `GET /healthz` in
    // alternating rounds, so that the machine's noise hits both alike; then of an uncontended
    // lock request, in rounds of their own (a lock cycle leaves work behind it, the watches of
    // the nodes it deleted and the containers ZooKeeper removes, which a `/healthz` round after
    // it would be charged for). The median of the rounds after the first.
    if wanted("edge") {
        let bare = edge::Bare::start().await;
        let http = http_client();
        let bare_url = format!("{}/healthz", bare.base);
        let lease = gate.lease("1h").await;
        let (gate_pid, bare_pid) = (gate.child.pid().to_string(), bare.child.pid().to_string());
        let count = sizes.cycles;
        let get_bare = async || {
            let answer = http.get(&bare_url).send().await.expect("bare axum");
            assert!(answer.status().is_success());
            answer.bytes().await.expect("body");
        };
        let (mut bare_cpu, mut health_cpu, mut lock_cpu) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..6 {
            let bare_us = edge::cpu_per_request(&bare_pid, count, get_bare).await;
            let health_us = edge::cpu_per_request(&gate_pid, count, async || gate.health().await).await;
            // The first round warms each side up (connections, caches): not counted.
            if round > 0 {
                bare_cpu.push(bare_us);
                health_cpu.push(health_us);
            }
        }
        for round in 0..4 {
            let cycle_us =
                edge::cpu_per_request(&gate_pid, count / 2, async || gate.one_cycle("edge", &lease).await).await;
            if round > 0 {
                // A cycle is two requests (acquire, release).
                lock_cpu.push(cycle_us / 2.0);
            }
        }
        let median = |mut values: Vec<f64>| {
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        let (bare_us, health_us, lock_us) = (median(bare_cpu), median(health_cpu), median(lock_cpu));
        let edge_rows = [
            (
                "server CPU per request: GET /healthz (floor: bare axum, one route answering `ok`)",
                bare_us,
                health_us,
            ),
            (
                "server CPU per request: uncontended lock acquire or release (floor: bare axum)",
                bare_us,
                lock_us,
            ),
        ];
        for (what, floor_us, zkgate_us) in edge_rows {
            push(
                &mut rows,
                Row {
                    workload: what.into(),
                    floor: Figure::CpuMicros(floor_us),
                    zkgate: Figure::CpuMicros(zkgate_us),
                    kazoo: Figure::Absent("n/a"),
                    etcd: Figure::Absent("n/a"),
                },
            );
        }
        drop(bare);
    }

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

    // Writes of keys: single puts, and transactions of 1, 8 and 64 puts (every key of a
    // transaction read and pinned by zkgate; etcd's `Txn` takes its revision lock instead; the
    // floor is a bare multi-op of `setData`s, nothing read). Serial, one client.
    if wanted("txn") {
        for (ops, what) in [
            (0, "one key written (PUT /v1/kv/{key}; etcd /v3/kv/put; floor setData)"),
            (
                1,
                "transaction of 1 put (POST /v1/kv-txn; etcd /v3/kv/txn; floor multi)",
            ),
            (8, "transaction of 8 puts"),
            (64, "transaction of 64 puts"),
        ] {
            floor.kv_writes(ops, sizes.warmup).await;
            gate.kv_writes(ops, sizes.warmup).await;
            let count = sizes.cycles / if ops >= 64 { 4 } else { 1 };
            let floor_figure = Latency::of(&floor.kv_writes(ops, count).await);
            let cpu_before = gate.child.cpu_time();
            let zkgate_figure = Latency::of(&gate.kv_writes(ops, count).await);
            let cpu = gate.child.cpu_time().saturating_sub(cpu_before);
            let etcd_figure = match &etcd {
                Some(e) => {
                    e.kv_writes(ops, sizes.warmup).await;
                    Figure::Latency(Latency::of(&e.kv_writes(ops, count).await))
                }
                None => no_etcd(),
            };
            push(
                &mut rows,
                Row {
                    workload: what.into(),
                    floor: Figure::Latency(floor_figure),
                    zkgate: Figure::Latency(zkgate_figure),
                    kazoo: Figure::Absent("not measured"),
                    etcd: etcd_figure,
                },
            );
            push(
                &mut rows,
                Row {
                    workload: format!(
                        "zkgate CPU per request, {}",
                        if ops == 0 {
                            "one key written".to_string()
                        } else {
                            format!("transaction of {ops}")
                        }
                    ),
                    floor: Figure::Absent("n/a"),
                    zkgate: Figure::CpuMicros(cpu.as_secs_f64() * 1e6 / count as f64),
                    kazoo: Figure::Absent("n/a"),
                    etcd: Figure::Absent("n/a"),
                },
            );
        }
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

    // Latency under load: each system's maximum rate in a closed loop (32 clients), then an
    // open loop at half and four fifths of it (`stats::open_loop`: requests start when due,
    // whatever the earlier ones are doing, and wait counts).
    let mut load = Vec::new();
    let mut overload = Vec::new();
    let mut load_notes = Vec::new();
    let mut equal_rates = Vec::new();
    if wanted("load") {
        let seconds = sizes.seconds;
        // Whose CPU each point watches: the whole machine's budget, to say who ran out.
        let watched = [
            ("zkgate", gate.child.pid().to_string()),
            ("ZooKeeper", server.pid().map_or("self".into(), |p| p.to_string())),
            ("the bench client", "self".to_string()),
        ];
        let leases = Arc::new(futures::future::join_all((0..32).map(|_| gate.lease("1h"))).await);
        let max = floor.contended(32, 32, seconds).await;
        let floor_max = max;
        let f = floor.clone();
        let floor_acquire = move |i: usize| {
            let floor = f.clone();
            async move { Some(floor.acquired_at(i, i % LOAD_LOCKS).await) }
        };
        warm(floor_acquire.clone()).await;
        let points = at_shares(max, seconds, &watched[1..], floor_acquire.clone()).await;
        load.push(LoadRow::new(
            ACQUIRE,
            "raw floor (the recipe on zkgate's sessions)",
            max,
            points,
        ));
        // etcd's maximum first: zkgate runs at etcd's rates too, to compare tails at one rate.
        let etcd_max = match &etcd {
            Some(e) => Some(e.contended(32, 32, seconds).await),
            None => None,
        };
        let inside = Inside {
            gate: gate.clone(),
            zookeeper: connect.split('/').next().unwrap_or_default().to_string(),
            gc_log: server.gc_log_path(),
        };
        let max = gate.contended(32, 32, seconds).await;
        // ZooKeeper's side at one offered rate (half the lower maximum of the floor and
        // zkgate): the plain recipe, zkgate's cycle shape on the raw client (the durable
        // floor), zkgate, and etcd below, each with what it and ZooKeeper spent a cycle.
        let equal_rate = 0.5 * floor_max.min(max);
        floor.prepare_durable().await;
        let f = floor.clone();
        let durable_acquire = move |i: usize| {
            let floor = f.clone();
            async move { Some(floor.durable_acquired_at(i, i % LOAD_LOCKS).await) }
        };
        warm(durable_acquire.clone()).await;
        let zk = Some(inside.zookeeper.as_str());
        equal_rates.push(equal_rate_header(equal_rate));
        let plain = "raw floor (the recipe: ephemeral contender)";
        equal_rates.push(equal_rate_row(plain, equal_rate, seconds, &watched[1..], zk, floor_acquire).await);
        let durable = "durable floor (zkgate's multi-ops on the raw client)";
        equal_rates.push(equal_rate_row(durable, equal_rate, seconds, &watched[1..], zk, durable_acquire).await);
        let (g, l) = (gate.clone(), leases.clone());
        let acquire = move |i: usize| {
            let (gate, leases) = (g.clone(), l.clone());
            async move {
                let lease = &leases[(i + i / LOAD_LOCKS) % leases.len()];
                gate.acquired_at(&format!("load-{}", i % LOAD_LOCKS), lease).await
            }
        };
        warm(acquire.clone()).await;
        equal_rates.push(equal_rate_row("zkgate", equal_rate, seconds, &watched, zk, acquire.clone()).await);
        let at = |rates: Vec<f64>, in_flight| {
            points_inside(rates, seconds, &watched, in_flight, Some(&inside), acquire.clone())
        };
        let points = at(SHARES.map(|share| max * share).into(), stats::IN_FLIGHT).await;
        load.push(LoadRow::new(ACQUIRE, "zkgate", max, points));
        if let Some(etcd_max) = etcd_max {
            let points = at(SHARES.map(|share| etcd_max * share).into(), stats::IN_FLIGHT).await;
            load.push(LoadRow::new(ACQUIRE, "zkgate at etcd's rates", etcd_max, points));
        }
        // Past capacity, with many clients: what zkgate serves, how fast, and what it sheds.
        let points = at(
            OVERLOAD_SHARES.map(|share| max * share).into(),
            stats::OVERLOAD_IN_FLIGHT,
        )
        .await;
        overload.push(LoadRow::new(ACQUIRE, "zkgate", max, points));
        if let Some(k) = &kazoo {
            let max = k.contended(32, 32, seconds);
            let points = SHARES.map(|share| LoadPoint::of(max * share, &k.lock_load(32, max * share, seconds)));
            load.push(LoadRow::new(ACQUIRE, "kazoo", max, points.into()));
        }
        if let (Some(e), Some(max)) = (&etcd, etcd_max) {
            let leases = Arc::new(futures::future::join_all((0..32).map(|_| e.lease(3600))).await);
            let shared = e.clone();
            let acquire = move |i: usize| {
                let (etcd, leases) = (shared.clone(), leases.clone());
                async move {
                    let lease = &leases[(i + i / LOAD_LOCKS) % leases.len()];
                    Some(etcd.acquired_at(&format!("load-{}", i % LOAD_LOCKS), lease).await)
                }
            };
            warm(acquire.clone()).await;
            let etcd_watched = [("etcd", e.pid().to_string()), watched[2].clone()];
            equal_rates.push(equal_rate_row("etcd", equal_rate, seconds, &etcd_watched, None, acquire.clone()).await);
            let points = at_shares(max, seconds, &etcd_watched, acquire).await;
            load.push(LoadRow::new(ACQUIRE, "etcd", max, points));
            if e.refused() > 0 {
                load_notes.push(format!(
                    "etcd refused {} requests as too many (each tried again after 1 ms)",
                    e.refused()
                ));
            }
        }
        let max = gate.queue_take_ack(32, sizes.items, 1).await;
        let mut points = Vec::new();
        for share in SHARES {
            let (rate, queue) = (max * share, format!("load-take-{share}"));
            gate.fill(&queue, (rate * seconds.as_secs_f64()) as usize + 1).await;
            let g = gate.clone();
            let take = move |_| {
                let (gate, queue) = (g.clone(), queue.clone());
                async move { gate.taken_at(&queue).await }
            };
            points.push(LoadPoint::measure(rate, seconds, &watched, take).await);
        }
        load.push(LoadRow::new(TAKE, "zkgate", max, points));
        if let Some(k) = &kazoo {
            // kazoo takes tens of items a second: a sixth of the items keeps its run short.
            let max = k.queue_take(32, (sizes.items / 6).max(32));
            let points = SHARES.map(|share| LoadPoint::of(max * share, &k.take_load(32, max * share, seconds)));
            load.push(LoadRow::new(TAKE, "kazoo", max, points.into()));
        }
    }

    // Two instances on a 3-server ensemble against one: the contended throughput with the
    // clients on one instance or spread over both, and what a request for a lease sent to the
    // instance that does not keep it costs over one sent to its keeper. Then three instances
    // restarted in turn, or one killed, under load.
    let mut ensemble_rows = Vec::new();
    let mut disrupted = Vec::new();
    if wanted("ensemble") {
        let servers = ZooKeeperServer::start_ensemble(&options, 3)
            .await
            .expect("the ensemble");
        let connect: Vec<String> = servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.client_port()))
            .collect();
        let connect = connect.join(",");
        // A shared secret, so that each trusts what the other hands it.
        let secret = ["--cluster-secret", "bench-cluster-secret-of-32-bytes-or-more"];
        let (a, b) = (
            Arc::new(gate::Zkgate::start_with(&connect, &secret).await),
            Arc::new(gate::Zkgate::start_with(&connect, &secret).await),
        );
        a.cycles(sizes.warmup).await;
        b.cycles(sizes.warmup).await;
        for (clients, locks) in [(32, 32), (64, 64)] {
            let one = gate::contended_across(std::slice::from_ref(&a), clients, locks, sizes.seconds).await;
            let two = gate::contended_across(&[a.clone(), b.clone()], clients, locks, sizes.seconds).await;
            ensemble_rows.push(format!(
                "| {locks} locks, {clients} clients: cycles per second | {one:.0}/s | {two:.0}/s | {:.2}x |",
                two / one
            ));
        }
        // The same lease (A's, which A keeps) used through A, and through B: B serves a lock
        // from ZooKeeper itself, and hands a keepalive to A (an earlier zkgate forwarded every
        // request of A's lease to A).
        let lease = a.lease("1h").await;
        b.cycles_with(&lease, sizes.warmup).await;
        let cpu = |gates: &[&gate::Zkgate]| gates.iter().map(|g| g.child.cpu_time()).sum::<Duration>();
        let per_request = |used: Duration| used.as_secs_f64() * 1e6 / (2 * sizes.cycles) as f64;
        let before = cpu(&[&a, &b]);
        let direct = Latency::of(&a.cycles_with(&lease, sizes.cycles).await);
        let direct_cpu = per_request(cpu(&[&a, &b]).saturating_sub(before));
        let before = cpu(&[&a, &b]);
        let through = Latency::of(&b.cycles_with(&lease, sizes.cycles).await);
        let through_cpu = per_request(cpu(&[&a, &b]).saturating_sub(before));
        ensemble_rows.push(format!(
            "| uncontended cycle, through the lease's keeper vs through the other | p50 {:.0} µs, p99 {:.0} µs | p50 {:.0} µs, p99 {:.0} µs | {:+.0} µs a cycle |",
            direct.p50,
            direct.p99,
            through.p50,
            through.p99,
            through.p50 - direct.p50
        ));
        ensemble_rows.push(format!(
            "| zkgate CPU per request (both instances), through the keeper vs through the other | {direct_cpu:.0} µs | {through_cpu:.0} µs | {:+.0} µs a request |",
            through_cpu - direct_cpu
        ));
        let keepalives = |gate: Arc<gate::Zkgate>, lease: String| async move {
            let mut samples = Vec::with_capacity(sizes.cycles);
            for _ in 0..sizes.cycles {
                let start = Instant::now();
                assert_eq!(gate.keepalive(&lease).await, 200);
                samples.push(start.elapsed());
            }
            Latency::of(&samples)
        };
        let direct = keepalives(a.clone(), lease.clone()).await;
        let handed = keepalives(b.clone(), lease.clone()).await;
        ensemble_rows.push(format!(
            "| keepalive, at the keeper vs through the other (handed to the keeper) | p50 {:.0} µs, p99 {:.0} µs | p50 {:.0} µs, p99 {:.0} µs | {:+.0} µs a keepalive |",
            direct.p50,
            direct.p99,
            handed.p50,
            handed.p99,
            handed.p50 - direct.p50
        ));
        // Behind a round-robin balancer: three instances against one under the same clients,
        // and how many of the requests one instance passed to another (a keepalive, or a
        // lease's read, goes to the lease's keeper; everything else is served where it lands).
        let c = Arc::new(gate::Zkgate::start_with(&connect, &secret).await);
        c.cycles(sizes.warmup).await;
        let three = [a.clone(), b.clone(), c.clone()];
        let handoffs = async || {
            let mut total = 0.0;
            for gate in &three {
                total += gate.metric("zkgate_handoffs_total").await.unwrap_or(0.0);
            }
            total
        };
        let (clients, locks) = (64, 64);
        let one = gate::round_robin(std::slice::from_ref(&a), clients, locks, sizes.seconds).await;
        let before = handoffs().await;
        let spread = gate::round_robin(&three, clients, locks, sizes.seconds).await;
        let passed = handoffs().await - before;
        ensemble_rows.push(format!(
            "| round robin, {locks} locks, {clients} clients: cycles per second, one instance vs three | {:.0}/s | {:.0}/s | {:.2}x |",
            one.rate,
            spread.rate,
            spread.rate / one.rate
        ));
        ensemble_rows.push(format!(
            "| round robin over three instances: requests one instance passed to another | {passed:.0} of {} | {:.1}% | |",
            spread.requests,
            100.0 * passed / spread.requests.max(1) as f64
        ));
        drop((a, b, c, three));
        // Instances that stop and die under load (three of them, on the same ensemble).
        for disruption in [instances::Disruption::RollingRestart, instances::Disruption::Kill9] {
            let row = instances::under(&connect, &secret, disruption, sizes.seconds).await;
            eprintln!("{row}");
            disrupted.push(row);
        }
        for row in &ensemble_rows {
            eprintln!("{row}");
        }
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

    // What a lease costs: creation, keepalives, and many held idle (its own ZooKeeper).
    let lease_costs = match wanted("leases") {
        true => leases::costs(&options, sizes.lease_costs, sizes.idle_leases).await,
        false => Vec::new(),
    };

    // How cost grows: the uncontended cycle and memory per lease with more and more idle
    // leases held, and the rest of the curves. Last, and on a ZooKeeper and a zkgate of their
    // own: a million keys and a hundred thousand locks make the heap of the ZooKeeper that
    // holds them a slower one for whatever runs on it next.
    let mut curve = Vec::new();
    let mut lock_curve = Vec::new();
    let mut key_curve = Vec::new();
    let mut waiter_curve = Vec::new();
    let mut subscriber_curve = Vec::new();
    if wanted("curves") {
        let own = ZooKeeperServer::start_standalone(&options).await.expect("ZooKeeper");
        let zookeeper_watches = || process::zookeeper_figure(own.client_port(), "zk_watch_count");
        let curved = Arc::new(gate::Zkgate::start(&own.connect_string()).await);
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
        // Waiters queued on one lock: the hand-over to the head, the watches and the memory.
        for &waiters in sizes.waiter_curve {
            let lock = format!("waited-{waiters}");
            let leases: Vec<String> = futures::future::join_all((0..=waiters).map(|_| curved.lease("1h"))).await;
            let holder = (leases[0].clone(), curved.hold(&lock, &leases[0]).await);
            let rounds = sizes.handovers.min(waiters);
            let (rss_before, watches_before) = (curved.child.rss_bytes(), zookeeper_watches());
            curved.queue_waiters(&lock, &leases[1..], rounds).await;
            let bytes = curved.child.rss_bytes().saturating_sub(rss_before) as f64 / waiters as f64;
            let watches = zookeeper_watches().saturating_sub(watches_before) as f64 / waiters as f64;
            let handover = Latency::of(&curved.handovers(&lock, holder, &leases[1..=rounds]).await);
            waiter_curve.push((waiters, handover, watches, (waiters >= 500).then_some(bytes)));
        }
        // WebSockets subscribed to one lock's topic (kept open until the end of the curves).
        let mut subscribed = Vec::new();
        for &target in sizes.subscriber_curve {
            let (rss_before, watches_before) = (curved.child.rss_bytes(), zookeeper_watches());
            let added = target - subscribed.len();
            subscribed.extend(
                curved
                    .subscribers(&serde_json::json!({ "lock": "subscribed" }), added)
                    .await,
            );
            let bytes = curved.child.rss_bytes().saturating_sub(rss_before) as f64 / added as f64;
            let watches = zookeeper_watches().saturating_sub(watches_before);
            subscriber_curve.push((target, watches, (added >= 500).then_some(bytes)));
        }
        drop(subscribed);
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
    if !waiter_curve.is_empty() {
        println!();
        println!(
            "| waiters queued on one lock | hand-over (release → the next one's poll answered) | p50 vs the first | ZooKeeper watches per waiter | memory per waiter |"
        );
        println!("|---|---|---|---|---|");
        let first = waiter_curve[0].1.p50;
        for (waiters, handover, watches, bytes) in &waiter_curve {
            println!(
                "| {waiters} | p50 {:.0} µs, p99 {:.0} µs | {:.2}x | {watches:.2} | {} |",
                handover.p50,
                handover.p99,
                handover.p50 / first,
                bytes.map_or("–".into(), |b| format!("{:.2} KiB", b / 1024.0)),
            );
        }
        println!();
        println!("| WebSockets subscribed to one topic | ZooKeeper watches added | memory per subscriber added |");
        println!("|---|---|---|");
        for (subscribers, watches, bytes) in &subscriber_curve {
            println!(
                "| {subscribers} | {watches} | {} |",
                bytes.map_or("–".into(), |b| format!("{:.2} KiB", b / 1024.0)),
            );
        }
    }
    if !ensemble_rows.is_empty() {
        println!();
        println!("| on a 3-server ensemble | first | second | second against first |");
        println!("|---|---|---|---|");
        for row in &ensemble_rows {
            println!("{row}");
        }
    }
    if !disrupted.is_empty() {
        println!();
        println!("{}", instances::HEADER);
        for row in &disrupted {
            println!("{row}");
        }
    }
    if !lease_costs.is_empty() {
        println!();
        println!("| a lease | cost |");
        println!("|---|---|");
        for row in &lease_costs {
            println!("{row}");
        }
    }
    report_load(&load);
    for note in load_notes {
        println!("- {note}");
    }
    if !equal_rates.is_empty() {
        println!();
        for row in &equal_rates {
            println!("{row}");
        }
    }
    report_overload(&overload, &load);
    report_breakdown(load.iter().chain(&overload));
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
